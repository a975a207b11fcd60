//! MongoDB decides expiry by its estimate of the server's clock, never the
//! client's wall clock. Against `LEASEHOLD_TEST_MONGODB` (skipped when
//! unset, unless `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(feature = "mongodb")]

#[path = "support/common.rs"]
mod common;
#[path = "support/mongodb.rs"]
mod mongodb_fixtures;

use std::time::Duration;

use common::grant;
use leasehold::backend::Acquire;
use leasehold::Backend;
use mongodb_fixtures::{backend_with, key, options, request, url};

/// Clients whose wall clocks are 5 minutes fast and 5 minutes slow contend
/// for one key: neither takes a live lease, and each takes an expired one
/// promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_wrong_clocks_neither_steal_nor_starve() {
    let Some(url) = url() else { return };
    let five_min = 5 * 60 * 1000;
    let base = options();
    let fast = backend_with(&url, base.clone().with_simulated_clock_skew_ms(five_min)).await;
    let slow = backend_with(&url, base.with_simulated_clock_skew_ms(-five_min)).await;
    // The offset to the server clock cancels the simulated error.
    for (b, skew) in [(&fast, five_min), (&slow, -five_min)] {
        let offset = b.clock_estimate().offset_ms;
        assert!(
            (offset + skew).abs() < 1000,
            "offset {offset} ms for skew {skew} ms"
        );
    }
    let ttl = Duration::from_secs(1);
    for (holder, contender) in [(&slow, &fast), (&fast, &slow)] {
        let k = key(&format!("skew:{:x}", rand::random::<u32>()));
        let lease = grant(holder, k.as_str(), ttl).await;
        // A fast clock would see the slow client's lease as expired for
        // 5 minutes, if it trusted its own clock.
        match contender.try_acquire(&request(&k, ttl)).await.unwrap() {
            Acquire::Busy(b) => assert!(b.remaining <= ttl && b.remaining > ttl / 2, "{b:?}"),
            other => panic!("a live lease was stolen: {other:?}"),
        }
        let info = contender.inspect(&k).await.unwrap().expect("live");
        assert_eq!(info.token, lease.token());
        // Renewing keeps it live past the first ttl.
        tokio::time::sleep(ttl / 2).await;
        assert!(holder.renew(&lease, ttl).await.unwrap());
        tokio::time::sleep(ttl * 3 / 4).await;
        assert!(
            matches!(
                contender.try_acquire(&request(&k, ttl)).await.unwrap(),
                Acquire::Busy(_)
            ),
            "a renewed lease was stolen"
        );
        // A slow clock would wait 5 more minutes, if it trusted its own clock.
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        match contender.try_acquire(&request(&k, ttl)).await.unwrap() {
            Acquire::Granted(next) => assert!(next.token() > lease.token()),
            b => panic!("an expired lease was not taken: {b:?}"),
        }
        assert!(
            !holder.renew(&lease, ttl).await.unwrap(),
            "expired lease renewed"
        );
    }
}
