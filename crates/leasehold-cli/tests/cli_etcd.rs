//! The `leasehold` binary against etcd (`LEASEHOLD_TEST_ETCD`), across real
//! OS processes. Skipped when the variable is unset, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`.
#![cfg(feature = "etcd")]

mod common;

use common::*;

/// The server URL with a key prefix of its own, so tests (and their fixed
/// key names) do not meet.
fn store() -> Option<String> {
    let url = leasehold::conformance::server_url("LEASEHOLD_TEST_ETCD")?;
    Some(format!("{url}?prefix=cli-{:016x}/", rand::random::<u64>()))
}

process_tests!(store());

/// `leasehold run --fair` processes started one by one get the key in
/// the order they started: they queue as keys ordered by create revision.
#[test]
fn processes_get_the_key_in_the_order_they_came() {
    let Some(store) = store() else { return };
    fair_processes_get_the_key_in_the_order_they_came(&store);
}
// The inventory demo's invariants on etcd: the race without a lock, then
// the lease (fenced writes) and optimistic strategies selling exactly once;
// row-lock refused.
demo_tests_without_row_lock!(store(), "etcd");

#[test]
fn an_unreachable_server_exits_69_within_ten_seconds() {
    let store = format!("etcd://127.0.0.1:{}", free_port());
    for args in [&["status", "k"][..], &["demo"]] {
        let err = down_store_stderr(&store, args);
        assert!(err.contains("store unavailable (etcd)"), "{args:?}: {err}");
    }
}

#[test]
fn bad_urls_exit_64_before_any_connection() {
    for url in [
        "etcd://127.0.0.1:1?nosuchoption=1",
        "etcd://127.0.0.1:notaport",
        "etcd://127.0.0.1:1/database",
    ] {
        let out = run(leasehold(url).args(["status", "k"]));
        assert_exit(&out, 64, "invalid store url", url);
    }
}
