//! etcd fixtures: the conformance store on the server of `var` (a second
//! client, another backend with its own connections and watch; the
//! closed-port and bad-option hooks), and a backend on a prefix of its own.
#![allow(dead_code)] // each test crate uses its own subset

use std::sync::Arc;
use std::time::Duration;

use leasehold::backends::etcd::{EtcdBackend, EtcdOptions};
use leasehold::conformance::{server_url, TestStore};

pub async fn conformance_store(var: &str) -> Option<TestStore> {
    let url = server_url(var)?;
    let connect = || async {
        EtcdBackend::connect(&url)
            .await
            .expect("the etcd test server answers")
    };
    let backend = connect().await;
    let granularity = shortest_lease(&backend).await;
    let mut store = TestStore::new(Arc::new(backend))
        .with_expiry_granularity(granularity)
        .with_second_client(Arc::new(connect().await))
        .with_url_at_port(|port| format!("etcd://127.0.0.1:{port}"));
    // A closed port with minute-long timeouts: only a check before any
    // connection can answer in time.
    let slow = || {
        EtcdOptions::new()
            .with_connect_timeout(Duration::from_secs(60))
            .with_request_timeout(Duration::from_secs(60))
    };
    let down = "etcd://127.0.0.1:1";
    for (what, options) in [
        ("prefix", slow().with_prefix("")),
        ("prefix", slow().with_prefix("a\u{7}b")),
        (
            "request timeout",
            slow().with_request_timeout(Duration::ZERO),
        ),
        (
            "client certificate",
            slow().with_client_cert("/nonexistent.pem"),
        ),
    ] {
        store = store.with_bad_option(what, move || {
            EtcdBackend::connect_with(down, options.clone())
        });
    }
    for url in [
        "etcd://127.0.0.1:1?unknown=1",
        "etcd://127.0.0.1:notaport",
        "etcd://127.0.0.1:1/database",
        "http://127.0.0.1:1",
    ] {
        store = store.with_bad_option("store url", move || EtcdBackend::connect_with(url, slow()));
    }
    Some(store)
}

/// etcd's expiry granularity on this server: leases are whole seconds, at
/// least the server's minimum (1.5 x its election timeout, rounded up),
/// which the TTL it grants for one second says.
async fn shortest_lease(backend: &EtcdBackend) -> Duration {
    let mut leases = backend.client().lease_client();
    let granted = leases.grant(1, None).await.expect("etcd grants a lease");
    let _ = leases.revoke(granted.id()).await;
    Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(1).max(1))
}

/// A backend on `prefix` (so that what a test counts or sees is its own),
/// whose sweep deletes kind records idle for `idle_window`.
pub async fn on_prefix(url: &str, prefix: &str, idle_window: Option<Duration>) -> EtcdBackend {
    let options = EtcdOptions::new()
        .with_prefix(prefix)
        .with_idle_window(idle_window);
    EtcdBackend::connect_with(url, options)
        .await
        .expect("the etcd test server answers")
}
