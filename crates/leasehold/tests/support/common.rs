//! Helpers the tests of every store share.
#![allow(dead_code)] // each test crate uses its own subset

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::{Backend, Key, Lease, LeaseGuard, Locks};

/// `prefix` with a random suffix: a table, key or user of one test only.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// A port on 127.0.0.1 with nothing listening (bound, then released).
pub fn closed_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

/// Takes `key` on `backend`, which must find it free.
pub async fn grant(backend: &dyn Backend, key: &str, ttl: Duration) -> Lease {
    let req = AcquireRequest::new(Key::new(key).unwrap(), ttl, "test").unwrap();
    match backend.try_acquire(&req).await.expect("store answers") {
        Acquire::Granted(lease) => lease,
        b => panic!("{key} is not granted: {b:?}"),
    }
}

/// A permit of the semaphore `key` (`permits` wide), which must have one free.
pub async fn permit(locks: &Locks, key: &str, permits: u32) -> LeaseGuard {
    locks
        .semaphore(key, permits)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
}

/// Takes and gives back each of `order/0` .. `order/{n - 1}` three times
/// (so each fence is above its first); the last token of each.
pub async fn use_order_keys(locks: &Locks, n: usize) -> Vec<u64> {
    let mut before = Vec::new();
    for i in 0..n {
        let mut top = 0;
        for _ in 0..3 {
            let guard = locks.try_acquire(&format!("order/{i}")).await.unwrap();
            top = guard.token();
            guard.release().await.unwrap();
        }
        before.push(top);
    }
    before
}

/// Each `order/{i}` taken again gets a token above `before[i]`.
pub async fn assert_order_keys_above(locks: &Locks, before: Vec<u64>) {
    for (i, top) in before.into_iter().enumerate() {
        let guard = locks.try_acquire(&format!("order/{i}")).await.unwrap();
        assert!(
            guard.token() > top,
            "order/{i}: {} after {top}",
            guard.token()
        );
        guard.release().await.unwrap();
    }
}

/// A bad idle window is refused, naming `idle_window`, both by `connect`
/// (options with a zero window) and by `Locks::open` of each of `urls`.
pub async fn assert_bad_windows_refused<B: Debug>(
    connect: impl Future<Output = leasehold::Result<B>>,
    urls: &[&str],
) {
    let e = connect.await.unwrap_err();
    assert!(e.to_string().contains("idle_window"), "{e}");
    for url in urls {
        let e = Locks::open(url).await.unwrap_err();
        assert!(e.to_string().contains("idle_window"), "{url}: {e}");
    }
}
