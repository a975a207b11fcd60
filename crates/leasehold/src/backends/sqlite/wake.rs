//! Cross-process release notifications for a store on one host.
//!
//! SQLite has no notification channel of its own, so processes that share a
//! database file share a *wake directory*. A process that has waiters binds
//! one Unix datagram socket there; a process that releases a key sends the
//! key's name to every socket in the directory. Sockets of crashed processes
//! refuse the datagram and are removed by the sender.
//!
//! **Where.** The directory sits beside the database file, named after it
//! (`app.db-wake/`, as SQLite keeps `app.db-wal` and `app.db-shm`), so every
//! process that opens the file finds it, whatever its `$TMPDIR`. A socket's
//! path may not exceed 107 bytes (`sun_path`); when the database's path is
//! too long for that, the directory is instead
//! `$TMPDIR/leasehold-wake-<hash of the database path>`, which only
//! processes with the same `$TMPDIR` share: the others still wake at the
//! holder's expiry or their polling backoff. The choice depends only on the
//! database's path, so all processes make the same one.
//!
//! **Overflow.** A socket's receive queue is short (on Linux 10 datagrams by
//! default, `net.unix.max_dgram_qlen`). When it is full the key's datagram
//! cannot be queued; instead the sender keeps trying, in the background, to
//! deliver an empty datagram, which wakes every waiter of that process
//! (a full queue means it is busy reading, so this succeeds soon).
//!
//! Cost on the uncontended path: one `readdir` of an empty or missing
//! directory per release. Any failure here only costs latency: waiters still
//! wake at the holder's expiry or their backoff.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::os::unix::net::UnixDatagram as StdDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixDatagram;
use tokio::task::JoinHandle;

use crate::backend::OwnerId;
use crate::key::Key;
use crate::notify::{hand_off_message, HandOff, Subscription, WakeHub};

/// Room for a key (256 bytes) with margin, and a hand-off's owner, token
/// and ticket before it.
const MAX_DATAGRAM: usize = 512;
/// The longest socket path the kernel takes: `sun_path` is 108 bytes on
/// Linux (104 on macOS and the BSDs) including the terminating NUL.
#[cfg(any(target_os = "linux", target_os = "android"))]
const MAX_SOCKET_PATH: usize = 107;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const MAX_SOCKET_PATH: usize = 103;
/// The longest socket file name this module makes: `<pid>-<16 hex>.sock`
/// with a pid of up to 10 digits.
const MAX_SOCKET_NAME: usize = 10 + 1 + 16 + 5;
/// How long a sender keeps trying to deliver a wake-all to a full socket.
const OVERFLOW_RETRY_FOR: Duration = Duration::from_secs(5);

/// The wake directory of one database file, and this process's socket in it.
#[derive(Debug)]
pub(super) struct WakeDir {
    dir: PathBuf,
    hub: WakeHub,
    listener: Mutex<Option<Listener>>,
    sender: Option<StdDatagram>,
    /// Sockets with a wake-all being delivered in the background.
    overflowing: Arc<Mutex<HashSet<PathBuf>>>,
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
    /// The wake directory for the database at `db_path` (see the module
    /// docs for where it is).
    pub(super) fn for_database(db_path: &Path) -> Self {
        Self::for_database_in(db_path, &std::env::temp_dir())
    }

    /// As [`for_database`](Self::for_database), with `temp_dir` for a
    /// database path too long to keep the sockets beside it.
    fn for_database_in(db_path: &Path, temp_dir: &Path) -> Self {
        let sender = StdDatagram::unbound()
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .ok();
        WakeDir {
            dir: wake_dir(db_path, temp_dir),
            hub: WakeHub::new(),
            listener: Mutex::new(None),
            sender,
            overflowing: Arc::default(),
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
        self.broadcast(key.as_str().as_bytes());
    }

    /// Tells the waiter registered as `owner` (in this process or another)
    /// that `key` was handed over to it; nobody else is woken. The
    /// datagram is [`hand_off_message`].
    pub(super) fn hand_over(&self, key: &Key, owner: OwnerId, grant: HandOff) {
        if self.hub.hand_over(key.as_str(), owner, grant) {
            return;
        }
        self.broadcast(hand_off_message(key.as_str(), owner, grant).as_bytes());
    }

    /// Sends `datagram` to every other process's socket.
    fn broadcast(&self, datagram: &[u8]) {
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
            match sender.send_to(datagram, &path) {
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
                // A full receive queue: this key's datagram cannot be
                // queued, so that process gets a wake-all once it has room
                // (a head that misses its hand-off finds the grant at its
                // next attempt, a repeat).
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wake_all_later(path),
                Err(e) => {
                    tracing::trace!(path = %path.display(), error = %e, "wake datagram not sent")
                }
            }
        }
    }

    /// Delivers an empty datagram (wake all) to the full socket at `path`
    /// in the background, retrying while its queue is full. One delivery
    /// per socket at a time: later overflows are covered by it.
    fn wake_all_later(&self, path: PathBuf) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !lock(&self.overflowing).insert(path.clone()) {
            return;
        }
        tracing::debug!(path = %path.display(), "wake socket full; sending a wake-all");
        let overflowing = self.overflowing.clone();
        runtime.spawn(async move {
            let started = tokio::time::Instant::now();
            let mut pause = Duration::from_millis(1);
            // Cleared before the attempt that succeeds, so an overflow
            // after it is not lost.
            loop {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
                lock(&overflowing).remove(&path);
                let sent = StdDatagram::unbound()
                    .and_then(|s| s.set_nonblocking(true).map(|()| s))
                    .and_then(|s| s.send_to(&[], &path));
                match sent {
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            && started.elapsed() < OVERFLOW_RETRY_FOR =>
                    {
                        if !lock(&overflowing).insert(path.clone()) {
                            return; // another sender took over
                        }
                    }
                    _ => return,
                }
            }
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Single inserts and removes: a poisoned set is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the sockets of the database at `db_path` live (see module docs).
fn wake_dir(db_path: &Path, temp_dir: &Path) -> PathBuf {
    let absolute = std::fs::canonicalize(db_path).unwrap_or_else(|_| db_path.to_owned());
    let mut beside = OsString::from(absolute.as_os_str());
    beside.push("-wake");
    let beside = PathBuf::from(beside);
    if beside.as_os_str().len() + 1 + MAX_SOCKET_NAME <= MAX_SOCKET_PATH {
        return beside;
    }
    let name = format!(
        "leasehold-wake-{:016x}",
        fnv1a(absolute.as_os_str().as_encoded_bytes())
    );
    temp_dir.join(name)
}

async fn receive_wakes(socket: UnixDatagram, hub: WakeHub) {
    let mut buf = [0u8; MAX_DATAGRAM];
    loop {
        match socket.recv(&mut buf).await {
            // A sender found this socket's queue full and lost a key:
            // everyone retries.
            Ok(0) => {
                hub.notify_all();
            }
            Ok(n) => {
                if let Ok(message) = std::str::from_utf8(&buf[..n]) {
                    hub.deliver(message);
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

    /// An empty database file `name` in `dir`.
    fn database_file(dir: &Path, name: &str) -> PathBuf {
        let db = dir.join(name);
        std::fs::write(&db, b"").unwrap();
        db
    }

    /// The wake dirs of two processes (a waiter's, a releaser's) sharing
    /// one database file in a fresh directory (kept alive by the first).
    fn two_processes() -> (tempfile::TempDir, WakeDir, WakeDir) {
        let tmp = tempfile::tempdir().unwrap();
        let db = database_file(tmp.path(), "x.db");
        let (waiter, releaser) = (WakeDir::for_database(&db), WakeDir::for_database(&db));
        (tmp, waiter, releaser)
    }

    /// `waiter` waits for a key and `releaser` releases it: the wake-up
    /// comes within 2 s, `across` what the test puts between them.
    async fn expect_woken(waiter: &WakeDir, releaser: &WakeDir, across: &str) {
        let key = Key::new("k").unwrap();
        let mut sub = waiter.subscribe(&key);
        assert!(sub.is_live(), "the socket is bound, across {across}");
        releaser.wake(&key);
        tokio::time::timeout(Duration::from_secs(2), sub.notified())
            .await
            .unwrap_or_else(|_| panic!("not woken across {across}"));
    }

    #[tokio::test]
    async fn wake_reaches_another_instance_and_cleans_stale_sockets() {
        let (_tmp, waiter, releaser) = two_processes();
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

    /// Processes with different temp dirs (`$TMPDIR`) wake each other: the
    /// sockets live beside the database file.
    #[tokio::test]
    async fn the_wake_dir_is_beside_the_database_whatever_the_temp_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let db = database_file(tmp.path(), "x.db");
        let (tmp_a, tmp_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let waiter = WakeDir::for_database_in(&db, tmp_a.path());
        let releaser = WakeDir::for_database_in(&db, tmp_b.path());
        let beside = std::fs::canonicalize(tmp.path()).unwrap().join("x.db-wake");
        assert_eq!(waiter.dir, beside);
        assert_eq!(releaser.dir, beside);
        expect_woken(&waiter, &releaser, "temp dirs").await;
    }

    /// A database path too long for a socket path beside it falls back to
    /// a directory in the temp dir, the same for every process.
    #[tokio::test]
    async fn a_long_database_path_falls_back_to_the_temp_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("d".repeat(100));
        std::fs::create_dir_all(&deep).unwrap();
        let db = database_file(&deep, "x.db");
        let temp = tempfile::tempdir().unwrap();
        let waiter = WakeDir::for_database_in(&db, temp.path());
        let releaser = WakeDir::for_database_in(&db, temp.path());
        assert!(waiter.dir.starts_with(temp.path()), "{:?}", waiter.dir);
        assert_eq!(waiter.dir, releaser.dir);
        expect_woken(&waiter, &releaser, "the fallback directory").await;
    }

    /// More releases than a socket's receive queue holds, before its
    /// process reads any: the release of the key it waits for still wakes
    /// it (the queue is filled for real; this current-thread runtime does
    /// not run the receiving task until the test awaits).
    #[tokio::test]
    async fn a_full_receive_queue_does_not_lose_the_wake_up() {
        let (_tmp, waiter, releaser) = two_processes();
        let wanted = Key::new("wanted").unwrap();
        let mut sub = waiter.subscribe(&wanted);
        // Far more than net.unix.max_dgram_qlen (10 by default).
        for i in 0..200 {
            releaser.wake(&Key::new(format!("other-{i}")).unwrap());
        }
        releaser.wake(&wanted);
        tokio::time::timeout(Duration::from_secs(3), sub.notified())
            .await
            .expect("the wake-up for the wanted key is not lost");
    }

    #[test]
    fn hash_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
