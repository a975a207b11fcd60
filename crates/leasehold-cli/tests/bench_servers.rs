//! `leasehold bench --quick --json` against each server store: every
//! scenario produces samples, and each store's baselines and hand-off peers
//! are measured. Skipped without the server's `LEASEHOLD_TEST_*` variable,
//! unless `LEASEHOLD_REQUIRE_SERVERS=1`. No timing thresholds.

mod common;

use common::*;
use leasehold::conformance::server_url;

/// The `name` of every entry of the array `list`, in order.
fn names(list: &serde_json::Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["name"].as_str().unwrap())
        .collect()
}

/// Runs a short bench and checks the report's shape.
fn quick_bench(store: &str, baselines: &[&str], peers: &[&str]) {
    let out = run(leasehold(store).args([
        "bench",
        "--quick",
        "--json",
        "--rounds",
        "60",
        "--duration",
        "300ms",
        "--workers",
        "3",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let s = &r["scenarios"];
    assert_eq!(s["uncontended"]["leasehold"]["samples"], 60, "{s}");
    assert_eq!(names(&s["uncontended"]["baselines"]), baselines);
    for b in s["uncontended"]["baselines"].as_array().unwrap() {
        assert_eq!(b["samples"], 60, "{b}");
    }
    // The other primitives, timed in the same rounds as the mutex.
    let primitives = s["uncontended"]["primitives"].as_array().unwrap();
    let skipped = s["uncontended"]["primitives_skipped"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(primitives.len() >= 2, "{s}");
    assert_eq!(primitives.len() + skipped, 4, "{s}");
    for p in primitives {
        assert_eq!(p["samples"], 60, "{p}");
        assert!(p["p50_per_mutex"].as_f64().unwrap() > 0.0, "{p}");
    }
    for series in ["acquire", "notified", "notified_after_release", "polling"] {
        assert!(
            s["handoff"][series]["samples"].as_u64().unwrap() >= 10,
            "{series}"
        );
    }
    assert_eq!(names(&s["handoff"]["peers"]), peers);
    assert!(
        s["contended"]["leasehold"]["acquisitions"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(
        s["contended"]["leasehold"]["per_worker"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert!(!s["scale"]["points"].as_array().unwrap().is_empty());
    assert!(s["renewal"]["renewals_per_second"].as_f64().unwrap() > 0.0);
}

#[test]
fn postgres() {
    let Some(url) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    quick_bench(
        &url,
        &[
            "two postgres statements by hand",
            "pg_try_advisory_lock + unlock",
        ],
        &["blocking pg_advisory_lock"],
    );
}

#[test]
fn redis() {
    let Some(url) = server_url("LEASEHOLD_TEST_REDIS") else {
        return;
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}prefix=bench-test-{:016x}", rand::random::<u64>());
    quick_bench(
        &url,
        &[
            "SET NX PX + EVAL compare-and-delete",
            "the same pair on a blocking connection (floor)",
            "leasehold on a multiplexed ConnectionManager (the path before)",
            "rslock lock + unlock",
        ],
        &["rslock retry loop"],
    );
}

/// On a cluster only the hand-written pair: rslock has no cluster client.
#[test]
fn redis_cluster() {
    let Some(url) = common::redis_store_of("LEASEHOLD_TEST_REDIS_CLUSTER") else {
        return;
    };
    quick_bench(&url, &["SET NX PX + EVAL compare-and-delete"], &[]);
}

#[cfg(feature = "mongodb")]
#[test]
fn mongodb() {
    let Some(url) = server_url("LEASEHOLD_TEST_MONGODB") else {
        return;
    };
    quick_bench(&url, &["two mongodb driver calls by hand"], &[]);
}
