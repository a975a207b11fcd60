//! The `leasehold` binary against Redis, across real OS processes.
//!
//! Reads the server from `LEASEHOLD_TEST_REDIS`; without it these tests skip
//! (or fail, with `LEASEHOLD_REQUIRE_SERVERS=1`). Each test uses its own key
//! prefix, so runs in parallel on one server never share a lock.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;
use leasehold::conformance::server_url;

/// The shared server with a fresh key prefix, or `None` to skip.
fn redis_store() -> Option<String> {
    let url = server_url("LEASEHOLD_TEST_REDIS")?;
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!(
        "{url}{sep}prefix=cli-test-{:016x}",
        rand::random::<u64>()
    ))
}

process_tests!(redis_store());

#[test]
fn demo_shows_the_race_and_two_safe_strategies() {
    let Some(store) = redis_store() else { return };
    let out = run(leasehold(&store).args(["demo", "--workers", "4", "--json"]));
    assert_demo_shows_race_and_safety(&out, &["none", "lease", "optimistic"]);
}

#[test]
fn row_lock_on_redis_is_refused_with_64_naming_the_alternatives() {
    let Some(store) = redis_store() else { return };
    let out =
        run(leasehold(&store).args(["demo", "--strategy", "lease", "--strategy", "row-lock"]));
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim(),
        "leasehold: strategy row-lock is not available on redis; choose from: none, lease, optimistic"
    );
    assert!(stdout(&out).is_empty(), "no strategy ran: {}", stdout(&out));
}

/// Needs no server: the point is that there is none.
#[test]
fn a_store_that_is_down_exits_69_quickly_with_one_line() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }; // Closed again: connecting is refused.
    let store = format!("redis://127.0.0.1:{port}");
    for args in [
        &["run", "k", "--", "true"][..],
        &["run", "k", "--wait", "30s", "--", "true"],
        &["demo"],
    ] {
        let started = Instant::now();
        let out = run(leasehold(&store).args(args));
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(69), "{args:?}: {}", stderr(&out));
        assert!(took < Duration::from_secs(10), "{args:?} took {took:?}");
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("refused"), "{args:?}: {err}");
    }
}
