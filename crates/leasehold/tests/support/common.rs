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

/// Takes and gives back each of `order/0` .. `order/{n - 1}` once; the
/// token `order/7` got.
pub async fn use_order_keys_once(locks: &Locks, n: usize) -> u64 {
    let mut order_7 = 0;
    for i in 0..n {
        let guard = locks.try_acquire(&format!("order/{i}")).await.unwrap();
        if i == 7 {
            order_7 = guard.token();
        }
        guard.release().await.unwrap();
    }
    order_7
}

/// `order/7` taken again gets a token above `order_7`.
pub async fn assert_order_7_above(locks: &Locks, order_7: u64) {
    let guard = locks.try_acquire("order/7").await.unwrap();
    assert!(guard.token() > order_7, "{} after {order_7}", guard.token());
    guard.release().await.unwrap();
}

/// What [`wait_until_swept`] takes and gives back between its looks.
pub enum Tick {
    /// The mutex `tick`.
    Mutex,
    /// A permit of the one-permit semaphore `tick`: a permit's release
    /// must start passes too.
    Permit,
}

/// Each release after the idle window may start a pass: releases `tick`
/// every 200 ms until `left()` counts at most one record (the tick's own);
/// fails, naming what is left of `what`, after `limit`.
pub async fn wait_until_swept<F, Fut>(
    locks: &Locks,
    tick: Tick,
    limit: Duration,
    what: &str,
    mut left: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = i64>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let guard = match tick {
            Tick::Mutex => locks.try_acquire("tick").await.unwrap(),
            Tick::Permit => permit(locks, "tick", 1).await,
        };
        guard.release().await.unwrap();
        let left = left().await;
        if left <= 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{left} {what} left");
    }
}

/// The keys a sweep test leaves idle: `order/0` .. `order/29` as
/// [`use_order_keys`] (their last tokens returned), a released permit of
/// the semaphore `pool`; and the mutex `held`, taken and returned held.
pub async fn leave_31_idle_keys(locks: &Locks) -> (Vec<u64>, LeaseGuard) {
    let before = use_order_keys(locks, 30).await;
    let held = locks.try_acquire("held").await.unwrap();
    permit(locks, "pool", 2).await.release().await.unwrap();
    (before, held)
}

/// After [`leave_31_idle_keys`]: a sweep with an hour's window deletes
/// nothing; 300 ms on, one with a 200 ms window deletes the 31 idle keys'
/// records (the held mutex's stays).
pub async fn assert_31_idle_keys_swept<F, Fut>(mut sweep: F)
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = leasehold::Result<u64>>,
{
    assert_eq!(sweep(Duration::from_secs(3600)).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        sweep(Duration::from_millis(200)).await.unwrap(),
        31,
        "30 mutex keys and the semaphore's"
    );
}
