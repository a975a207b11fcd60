//! The shared conformance suite on a single etcd member
//! (`LEASEHOLD_TEST_ETCD`), woken by the watch and polling; the second
//! client is another backend (its own connection and watch).
#![cfg(all(feature = "conformance", feature = "etcd"))]

#[path = "support/etcd.rs"]
mod etcd_fixtures;

async fn store() -> Option<leasehold::conformance::TestStore> {
    etcd_fixtures::conformance_store("LEASEHOLD_TEST_ETCD").await
}

leasehold::conformance_tests!(store; options, unreachable, queue, hand_off);

/// Group `sweep` on a backend whose idle window is 1 ms, on a prefix of
/// its own (an etcd pass deletes what was idle for its backend's window: a
/// pass with a longer window runs on a second backend of the prefix, whose
/// window is an hour).
mod sweep {
    use std::sync::Arc;
    use std::time::Duration;

    use leasehold::conformance::{server_url, TestStore};

    use super::etcd_fixtures::on_prefix;

    async fn store() -> Option<TestStore> {
        let url = server_url("LEASEHOLD_TEST_ETCD")?;
        let prefix = format!("sweep-conformance-{:016x}/", rand::random::<u64>());
        let backend = on_prefix(&url, &prefix, Some(Duration::from_millis(1))).await;
        let hourly = on_prefix(&url, &prefix, Some(Duration::from_secs(3600))).await;
        let (passes, counted) = (backend.clone(), backend.clone());
        Some(TestStore::new(Arc::new(backend)).with_sweep(
            move |window| {
                let backend = if window < Duration::from_secs(3600) {
                    passes.clone()
                } else {
                    hourly.clone()
                };
                async move { backend.sweep_idle().await }
            },
            // Every record of a key names it after a one-letter family
            // (`{prefix}L/{key}`, `{prefix}S/{key}...`: docs/etcd.md).
            move |key_prefix| {
                let (backend, prefix) = (counted.clone(), prefix.clone());
                async move {
                    let options = etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only();
                    let all = backend
                        .client()
                        .kv_client()
                        .get(prefix.as_str(), Some(options))
                        .await
                        .expect("etcd answers");
                    let named = |k: &[u8]| {
                        let k = String::from_utf8_lossy(k);
                        k[prefix.len()..]
                            .split_once('/')
                            .is_some_and(|(_, rest)| rest.starts_with(&key_prefix))
                    };
                    all.kvs().iter().filter(|kv| named(kv.key())).count() as u64
                }
            },
        ))
    }

    leasehold::conformance_tests!(@group sweep store);
}

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
