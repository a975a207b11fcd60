//! Cross-process release notifications for a store on one host.
//!
//! SQLite has no notification channel of its own, so processes that share a
//! database file share a *wake directory*. A process that has waiters binds
//! one Unix datagram socket there; a process that releases a key sends the
//! key's name to every socket in the directory. Sockets of crashed processes
//! refuse the datagram and are removed by the sender.
//!
//! Cost on the uncontended path: one `readdir` of an empty or missing
//! directory per release. Any failure here only costs latency: waiters still
//! wake at the holder's expiry or their backoff.

use std::io;
use std::os::unix::net::UnixDatagram as StdDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::net::UnixDatagram;
use tokio::task::JoinHandle;

use crate::key::Key;
use crate::notify::{Subscription, WakeHub};

/// Room for a key (256 bytes) with margin.
const MAX_DATAGRAM: usize = 512;

/// The wake directory of one database file, and this process's socket in it.
#[derive(Debug)]
pub(super) struct WakeDir {
    dir: PathBuf,
    hub: WakeHub,
    listener: Mutex<Option<Listener>>,
    sender: Option<StdDatagram>,
}

#[derive(Debug)]
struct Listener {
    path: PathBuf,
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl WakeDir {
    /// The wake directory for the database at `db_path`: a short path under
    /// the temp dir (socket paths are limited to 108 bytes), named by a hash
    /// of the database's absolute path so every process finds the same one.
    pub(super) fn for_database(db_path: &Path) -> Self {
        let absolute = std::fs::canonicalize(db_path).unwrap_or_else(|_| db_path.to_owned());
        let name = format!(
            "leasehold-wake-{:016x}",
            fnv1a(absolute.as_os_str().as_encoded_bytes())
        );
        let sender = StdDatagram::unbound()
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .ok();
        WakeDir {
            dir: std::env::temp_dir().join(name),
            hub: WakeHub::new(),
            listener: Mutex::new(None),
            sender,
        }
    }

    /// Registers a waiter for `key`, binding this process's socket first if
    /// needed. Falls back to a subscription that never fires (waiters poll)
    /// if the directory or socket cannot be made.
    pub(super) fn subscribe(&self, key: &Key) -> Subscription {
        if let Err(e) = self.ensure_listener() {
            tracing::debug!(dir = %self.dir.display(), error = %e, "no wake socket; waiters will poll");
            return Subscription::never();
        }
        self.hub.subscribe(key.as_str())
    }

    fn ensure_listener(&self) -> io::Result<()> {
        let mut listener = self.listener.lock().unwrap_or_else(|p| p.into_inner());
        if listener.is_some() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(format!(
            "{}-{:016x}.sock",
            std::process::id(),
            rand::random::<u64>()
        ));
        let socket = UnixDatagram::bind(&path)?;
        let hub = self.hub.clone();
        let task = tokio::spawn(receive_wakes(socket, hub));
        *listener = Some(Listener { path, task });
        Ok(())
    }

    /// Tells every waiting process, this one included, that `key` was released.
    pub(super) fn wake(&self, key: &Key) {
        self.hub.notify(key.as_str());
        let Some(sender) = &self.sender else { return };
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let own = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|l| l.path.clone());
        for entry in entries.flatten() {
            let path = entry.path();
            if Some(&path) == own.as_ref() {
                continue;
            }
            match sender.send_to(key.as_str().as_bytes(), &path) {
                Ok(_) => {}
                // Nobody bound there any more: a crashed process's socket.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                    ) =>
                {
                    let _ = std::fs::remove_file(&path);
                }
                // A full receive buffer means that process is already awake.
                Err(e) => {
                    tracing::trace!(path = %path.display(), error = %e, "wake datagram not sent")
                }
            }
        }
    }
}

async fn receive_wakes(socket: UnixDatagram, hub: WakeHub) {
    let mut buf = [0u8; MAX_DATAGRAM];
    loop {
        match socket.recv(&mut buf).await {
            Ok(n) => {
                if let Ok(key) = std::str::from_utf8(&buf[..n]) {
                    hub.notify(key);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "wake socket failed; waiters will poll");
                return;
            }
        }
    }
}

/// FNV-1a: a hash that is the same in every build and process, unlike std's.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Shared so the backend's clones use one socket.
pub(super) type SharedWakeDir = Arc<WakeDir>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn wake_reaches_another_instance_and_cleans_stale_sockets() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("x.db");
        std::fs::write(&db, b"").unwrap();
        let waiter = WakeDir::for_database(&db);
        let releaser = WakeDir::for_database(&db);
        assert_eq!(waiter.dir, releaser.dir);
        let key = Key::new("k").unwrap();
        let mut sub = waiter.subscribe(&key);
        assert!(sub.is_live());
        // A stale socket file from a crashed process.
        let stale = waiter.dir.join("999999-dead.sock");
        drop(StdDatagram::bind(&stale).unwrap());
        releaser.wake(&key);
        tokio::time::timeout(Duration::from_secs(2), sub.notified())
            .await
            .expect("woken across instances");
        assert!(!stale.exists(), "stale socket removed");
    }

    #[test]
    fn hash_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
