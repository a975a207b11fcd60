//! `Locks::close` is bounded: a store whose shutdown never finishes does not
//! keep a program from ending.

use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::BoxFuture;
use leasehold::backends::decorator::Decorator;
use leasehold::backends::memory::MemoryBackend;
use leasehold::{Backend, Locks, CLOSE_BOUND};

/// A store whose shutdown never finishes.
#[derive(Debug)]
struct StuckShutdown {
    inner: Arc<dyn Backend>,
}

impl Decorator for StuckShutdown {
    fn inner(&self) -> &dyn Backend {
        self.inner.as_ref()
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_that_never_ends_is_left_after_the_bound() {
    let locks = Locks::new(StuckShutdown {
        inner: Arc::new(MemoryBackend::new()),
    });
    let guard = locks.try_acquire("k").await.unwrap();
    guard.release().await.unwrap();
    let started = tokio::time::Instant::now();
    tokio::time::timeout(CLOSE_BOUND + Duration::from_secs(1), locks.close())
        .await
        .expect("close returns at its bound");
    assert!(started.elapsed() >= CLOSE_BOUND);
}
