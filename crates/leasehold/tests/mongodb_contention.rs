//! MongoDB under contention from two clients (two pools, as two processes
//! have): a fresh key has one winner, an existing key always an answer.
//! Against `LEASEHOLD_TEST_MONGODB` (skipped when unset, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(feature = "mongodb")]

#[path = "support/mongodb.rs"]
mod mongodb_fixtures;

use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::Acquire;
use leasehold::backends::mongodb::MongoBackend;
use leasehold::Backend;
use mongodb_fixtures::{backend_with, key, options, request, url};

/// Two clients (two pools) of the store at `url`, as two processes would be.
async fn two_clients(url: &str) -> (Arc<MongoBackend>, Arc<MongoBackend>) {
    let opts = options();
    let a = Arc::new(backend_with(url, opts.clone()).await);
    let b = Arc::new(backend_with(url, opts).await);
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_race_for_a_fresh_key_300_times() {
    let Some(url) = url() else { return };
    let (a, b) = two_clients(&url).await;
    for round in 0..300 {
        let k = key(&format!("race:{round}"));
        let attempt = |backend: Arc<MongoBackend>| {
            let req = request(&k, Duration::from_secs(30));
            tokio::spawn(async move { backend.try_acquire(&req).await })
        };
        let (ra, rb) = (attempt(a.clone()), attempt(b.clone()));
        let winners = [ra.await.unwrap(), rb.await.unwrap()]
            .into_iter()
            .map(|r| r.expect("a race is not an error"))
            .filter(|r| matches!(r, Acquire::Granted(_)))
            .count();
        assert_eq!(winners, 1, "round {round}: exactly one winner");
    }
}

/// Contenders hammering one existing key: every attempt is answered (granted
/// or busy, never an error), and grants carry distinct tokens. Contention on
/// an existing document is where a wire-compatible server may answer an
/// applied upsert with "no document".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_on_an_existing_key_is_always_answered() {
    let Some(url) = url() else { return };
    let (a, b) = two_clients(&url).await;
    let k = key("hammer");
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let backend = if i % 2 == 0 { a.clone() } else { b.clone() };
            let k = k.clone();
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..40 {
                    match backend
                        .try_acquire(&request(&k, Duration::from_secs(30)))
                        .await
                    {
                        Ok(Acquire::Granted(lease)) => {
                            tokens.push(lease.token());
                            backend.release(&lease).await.unwrap();
                        }
                        Ok(Acquire::Busy(_)) => {}
                        Ok(other) => panic!("a mutex key answered {other:?}"),
                        Err(e) => panic!("an attempt failed: {e}"),
                    }
                }
                tokens
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for t in tasks {
        tokens.extend(t.await.unwrap());
    }
    let granted = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), granted, "two grants shared a token");
    assert!(granted > 8, "only {granted} grants");
    assert!(
        a.inspect(&k).await.unwrap().is_none(),
        "every grant was released"
    );
}
