//! Helpers the tests of every store share.
#![allow(dead_code)] // each test crate uses its own subset

use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::{Backend, Key, Lease};

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
