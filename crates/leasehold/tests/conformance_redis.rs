//! The shared conformance suite on Redis (`LEASEHOLD_TEST_REDIS`), woken and
//! polling, one random key prefix per test so the tests run in parallel on
//! one server; the second client is another backend on the same prefix.
#![cfg(all(feature = "conformance", feature = "redis"))]

use std::sync::Arc;
use std::time::Duration;

use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::conformance::{server_url, TestStore};

async fn store() -> Option<TestStore> {
    let url = server_url("LEASEHOLD_TEST_REDIS")?;
    let options =
        RedisOptions::new().with_prefix(format!("leasehold-test-{:016x}", rand::random::<u64>()));
    let connect = || async {
        let backend = RedisBackend::connect_with(&url, options.clone())
            .await
            .expect("connect to LEASEHOLD_TEST_REDIS");
        Arc::new(backend)
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = format!("redis://127.0.0.1:{port}");
    let bad = move |what, options: RedisOptions| {
        let down = down.clone();
        (what, move || {
            let (down, options) = (down.clone(), options.clone());
            async move { RedisBackend::connect_with(&down, options).await }
        })
    };
    let mut store = TestStore::new(connect().await)
        .with_second_client(connect().await)
        .with_url_at_port(|port| format!("redis://127.0.0.1:{port}"));
    for (what, open) in [
        bad("redis key prefix", RedisOptions::new().with_prefix("")),
        bad("redis key prefix", RedisOptions::new().with_prefix("a{b}")),
        bad(
            "redis connect timeout",
            RedisOptions::new().with_connect_timeout(Duration::ZERO),
        ),
    ] {
        store = store.with_bad_option(what, open);
    }
    Some(store)
}

leasehold::conformance_tests!(store; options, unreachable);

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
