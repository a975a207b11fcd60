//! Properties that need more than one client, or a store that is not
//! there: another process's release, bad options, a closed port.

use std::time::Duration;

use tokio::time::{timeout, Instant};

use super::protocol::waiter_takes_over_after_release;
use super::{grant_on, key, prefix, TestStore, LONG};
use crate::error::Error;
use crate::lock::Locks;

/// How long a notification may take to arrive, and how long a renewal is
/// watched for a stray one: far below the holder's ttl (30 s).
const NOTIFIED_WITHIN: Duration = Duration::from_secs(5);
const QUIET_FOR: Duration = Duration::from_millis(300);

/// A release or force-release by another client (another process) reaches
/// a waiter through the store, a renewal does not, and a waiter through
/// the core takes the key over long before the holder's ttl ends.
pub async fn another_clients_release_wakes_a_waiter(store: &TestStore) {
    let other = store.second_client();
    let k = key(format!("{}k", prefix()));
    if store.caps.notifies {
        for by_force in [false, true] {
            let lease = grant_on(other, &k, LONG).await;
            let mut sub = store.backend.subscribe(&k).await.unwrap();
            assert!(
                sub.is_live(),
                "store claims notifications but gave a dead subscription"
            );
            assert!(other.renew(&lease, LONG).await.unwrap());
            assert!(
                timeout(QUIET_FOR, sub.notified()).await.is_err(),
                "a renewal is not a release: it must not wake waiters"
            );
            if by_force {
                assert!(other.force_release(&k).await.unwrap());
            } else {
                other.release(&lease).await.unwrap();
            }
            // Woken by the store, not by a poll: the subscription fires
            // only on news of a release.
            timeout(NOTIFIED_WITHIN, sub.notified())
                .await
                .unwrap_or_else(|_| {
                    panic!("another client's release (force: {by_force}) must wake the waiter")
                });
        }
    }
    let holder = grant_on(other, &k, LONG).await;
    waiter_takes_over_after_release(store, other, &k, holder).await;
}

/// Every option the store registered as bad fails with `InvalidInput`
/// naming it, before any I/O (the store is pointed where nothing answers),
/// and the message carries no password from the URL.
pub async fn bad_options_rejected_before_io(store: &TestStore) {
    assert!(
        !store.bad_options.is_empty(),
        "group `options` needs TestStore::with_bad_option"
    );
    for (what, open) in &store.bad_options {
        let started = Instant::now();
        match timeout(Duration::from_secs(10), open())
            .await
            .unwrap_or_else(|_| panic!("bad {what}: no answer in 10 s"))
        {
            Err(e @ Error::InvalidInput { what: w, .. }) => {
                assert_eq!(w, *what, "{e}");
                assert!(!e.to_string().contains("secret"), "password leaked: {e}");
            }
            other => panic!("bad {what}: expected InvalidInput, got {other:?}"),
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "bad {what}: answered after {took:?}: validation must not wait for the server"
        );
    }
}

/// A store whose server does not listen is `Unavailable` (retryable),
/// naming the cause, within seconds: the CLI promises exit 69 within 10 s.
pub async fn a_closed_port_is_unavailable(store: &TestStore) {
    // Bound, then released: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|socket| socket.local_addr())
        .expect("a free port")
        .port();
    let url = store.url_at_port(port);
    let started = Instant::now();
    let err = Locks::open(&url)
        .await
        .expect_err("nothing listens on the port");
    let took = started.elapsed();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        err.to_string().to_lowercase().contains("refused"),
        "the cause, not only a timeout: {err}"
    );
    assert!(took < Duration::from_secs(10), "{url}: took {took:?}");
}
