//! The `leasehold` binary against MongoDB (`LEASEHOLD_TEST_MONGODB`), across
//! real OS processes. Skipped when the variable is unset, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`.
#![cfg(feature = "mongodb")]

mod common;

use common::*;

/// The server URL with a database of its own, so tests (and their fixed
/// key names) do not meet.
fn store() -> Option<String> {
    let url = leasehold::conformance::server_url("LEASEHOLD_TEST_MONGODB")?;
    let db = format!("cli_{:016x}", rand::random::<u64>());
    Some(leasehold::conformance::with_database(&url, &db))
}

process_tests!(store());

/// `leasehold run --fair` processes started one by one get the key in
/// the order they started: they queue in the key's document.
#[test]
fn processes_get_the_key_in_the_order_they_came() {
    let Some(store) = store() else { return };
    fair_processes_get_the_key_in_the_order_they_came(&store);
}

#[test]
fn an_unreachable_server_exits_69_within_ten_seconds() {
    let store = format!("mongodb://127.0.0.1:{}/", free_port());
    let err = down_store_stderr(&store, &["status", "k"]);
    assert!(err.contains("store unavailable"), "{err}");
}

#[test]
fn demo_shows_the_race_and_three_safe_strategies() {
    let Some(store) = store() else { return };
    demo_shows_race_and_safety(&store, &["none", "lease", "row-lock", "optimistic"]);
}

/// Short runs end with the driver shut down before the runtime stops: the
/// driver's pool can otherwise panic at exit ("SendError" in its connection
/// requester, about 1 run in 50). Contending runs on one key also exercise
/// the change-stream watcher and the release-on-exit path.
#[test]
fn short_runs_never_print_a_panic_at_exit() {
    let Some(store) = store() else { return };
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                for _ in 0..15 {
                    let out = run(leasehold(&store)
                        .env("RUST_BACKTRACE", "1")
                        .args(["run", "short", "--wait", "60s", "--", "true"]));
                    let text = stderr(&out);
                    assert!(!text.contains("panicked"), "{text}");
                    assert!(out.status.success(), "{text}");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("no run printed a panic");
    }
}
