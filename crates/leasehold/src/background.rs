//! Where the engine's background work runs: lease renewal (the driver of
//! [`RenewalScheduler`](crate::renewal::RenewalScheduler) and every guard's
//! keep-alive task), and the completion of acquire attempts whose caller
//! went away when they were dropped outside any runtime (lock/acquire.rs: dropped
//! on a runtime, an attempt is finished there, where its timers and
//! sockets belong).
//!
//! By default that is a thread of the library's own with a current-thread
//! runtime, started on first use and kept for the life of the process, not
//! the runtime of whichever caller happened to come first: one `Locks` is
//! used from several runtimes (one per `#[tokio::test]`, one per worker pool
//! of an application), and work spawned on the first caller's runtime died
//! with it, so guards taken on the others stopped renewing and never fired
//! `lost()`. The PostgreSQL session's connection task runs on a thread of its
//! own for the same reason (`spawn_serving` in backends/postgres/session.rs).
//!
//! [`Locks::with_background_runtime`](crate::Locks::with_background_runtime)
//! names a runtime instead, for a caller who knows it outlives every guard:
//! a binding that owns the process's only runtime (Node), or a test on
//! paused time, whose clock must drive renewal for the test to mean
//! anything (the library's thread runs on real time).

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;

/// The runtime background work is spawned on.
#[derive(Debug, Clone, Default)]
pub(crate) enum Background {
    /// The library's own thread ([`own_runtime`]).
    #[default]
    Own,
    /// A runtime the caller named; work stops if it shuts down.
    On(Handle),
}

impl Background {
    /// The runtime to spawn on: the named one, or the library's own thread.
    /// If that thread could not be started (the system refused a thread),
    /// the caller's runtime, as before there was one.
    pub(crate) fn handle(&self) -> Option<Handle> {
        match self {
            Background::On(handle) => Some(handle.clone()),
            Background::Own => own_runtime().or_else(|| Handle::try_current().ok()),
        }
    }

    /// Spawns `task` on [`Self::handle`]; without any runtime it is dropped
    /// (logged).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        match self.handle() {
            Some(handle) => drop(handle.spawn(task)),
            None => tracing::error!("no runtime to run background work on; it is dropped"),
        }
    }
}

/// The library's background runtime: a current-thread runtime on a thread
/// named `leasehold-background`, started on first use and never stopped
/// (renewal must go on while any guard lives, and guards can live until the
/// process exits). `None` if the thread or runtime could not be made.
fn own_runtime() -> Option<Handle> {
    static OWN: OnceLock<Option<Handle>> = OnceLock::new();
    OWN.get_or_init(|| {
        let started = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .and_then(|runtime| {
                let handle = runtime.handle().clone();
                std::thread::Builder::new()
                    .name("leasehold-background".to_owned())
                    .spawn(move || runtime.block_on(std::future::pending::<()>()))
                    .map(|_| handle)
            });
        match started {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::error!(error = %e, "could not start the background thread; renewal runs on the caller's runtime");
                None
            }
        }
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_runtime_outlives_the_runtime_that_started_it() {
        let first = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handle = first.block_on(async { Background::Own.handle().unwrap() });
        drop(first);
        let (tx, rx) = std::sync::mpsc::channel();
        handle.spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            tx.send(()).unwrap();
        });
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("the background runtime still runs tasks");
    }
}
