//! The `leasehold` binary against PostgreSQL, across real OS processes.
//!
//! Needs `LEASEHOLD_TEST_POSTGRES` (e.g. `postgres://postgres@127.0.0.1:5432/test`);
//! skips with a notice without it, fails under `LEASEHOLD_REQUIRE_SERVERS=1`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use leasehold::conformance::server_url;
use rand::Rng;

/// A schema of its own for one test, dropped at the end. The store URL sets
/// `search_path` to it, so the lease table and the demo's product table are
/// created there: tests (and other runs on the same server) use the same key
/// names without meeting.
fn schema() -> Option<StoreUrl> {
    let base = server_url("LEASEHOLD_TEST_POSTGRES")?;
    let name = format!("leasehold_cli_{:016x}", rand::thread_rng().gen::<u64>());
    pg_exec(&base, &format!("CREATE SCHEMA {name}"));
    let separator = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{separator}options[search_path]={name}");
    let statement = format!("DROP SCHEMA {name} CASCADE");
    Some(StoreUrl::new(
        url,
        PgCleanup {
            server: base,
            statement,
        },
    ))
}

process_tests!(schema());

/// `leasehold run --fair` processes started one by one get the key in
/// the order they started: they queue in the store's `<table>_queue`.
#[test]
fn processes_get_the_key_in_the_order_they_came() {
    let Some(schema) = schema() else {
        return;
    };
    fair_processes_get_the_key_in_the_order_they_came(&schema.url);
}

#[test]
fn status_list_and_force_release_of_a_running_holder() {
    let Some(schema) = schema() else {
        return;
    };
    let store = &schema.url;
    let mut holder = leasehold(store)
        .args(["run", "admin:job", "--ttl", "3s", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || status(
        store,
        "admin:job"
    )["held"]
        == true));
    let held = status(store, "admin:job");
    let token = held["token"].as_u64().unwrap();
    assert!(held["holder"].as_str().unwrap().contains(':'), "{held}");

    let out = run(leasehold(store).args(["list", "--prefix", "admin:", "--json"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // A plain run of a fresh key holds its mutex: one row.
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["key"], "admin:job");
    assert_eq!(listed[0]["token"], token);

    let out = run(leasehold(store).args(["run", "admin:job", "--", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));

    let out = run(leasehold(store).args(["release", "admin:job", "--force"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("broke the lock"), "{}", stdout(&out));
    assert_eq!(status(store, "admin:job")["held"], false);
    // The evicted holder finds out at its next renewal (ttl/3), stops its
    // command and reports the lost lease.
    let code = holder.wait().unwrap().code();
    assert_eq!(code, Some(70), "an evicted holder exits 70");
    let out = run(leasehold(store).args([
        "run",
        "admin:job",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_TOKEN",
    ]));
    let next: u64 = stdout(&out).trim().parse().unwrap();
    assert!(next > token + 1, "force-release bumps the fence: {next}");
}

#[test]
fn a_store_that_is_down_exits_69_within_ten_seconds() {
    // Nothing listens on port 1: no server is needed for this test.
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let started = Instant::now();
    let out = run(leasehold("postgres://postgres@127.0.0.1:1/test").args([
        "run",
        "k",
        "--",
        "touch",
        ran.to_str().unwrap(),
    ]));
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let message = stderr(&out);
    assert_eq!(message.trim().lines().count(), 1, "{message}");
    assert!(
        message.contains("store unavailable") && message.contains("refused"),
        "{message}"
    );
    assert!(!ran.exists(), "the command must not run without the lock");
}

#[test]
fn demo_shows_the_race_and_three_safe_strategies() {
    let Some(schema) = schema() else {
        return;
    };
    demo_shows_race_and_safety(&schema.url, &["none", "lease", "row-lock", "optimistic"]);
}

/// A grant that comes back after its lease's end (the upsert waited on a
/// row lock longer than the ttl) must not start the command: `run` checks
/// the guard first. Whatever the store does about such grants, the command
/// may only ever run while its lease is live.
#[test]
fn a_grant_that_arrives_expired_never_starts_the_command() {
    let Some(schema) = schema() else {
        return;
    };
    let store = &schema.url;
    // The lease row exists and is free.
    let out = run(leasehold(store).args(["run", "k", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    // Another transaction holds the row for longer than the next ttl.
    let base = schema.url.clone();
    let row_lock = std::thread::spawn(move || {
        pg_exec(
            &base,
            "BEGIN; SELECT * FROM leasehold_locks WHERE key = 'k' FOR UPDATE; \
             SELECT pg_sleep(1.5); COMMIT;",
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("status.json");
    let out = run(leasehold(store)
        .args(["run", "k", "--ttl", "500ms", "--", "sh", "-c"])
        .arg(format!(
            "'{}' --store \"$STORE\" status k --json > {}",
            env!("CARGO_BIN_EXE_leasehold"),
            seen.display()
        ))
        .env("STORE", store));
    row_lock.join().unwrap();
    match std::fs::read_to_string(&seen) {
        // Not started: reported as not acquired.
        Err(_) => assert_eq!(out.status.code(), Some(75), "{}", stderr(&out)),
        // Started: then under a live lease of its own.
        Ok(text) => {
            let status: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                status["held"],
                true,
                "the command ran without a lease: {status}; run said {}",
                stderr(&out)
            );
        }
    }
}

#[test]
fn a_frozen_run_has_its_command_stopped_before_the_next_holder_starts() {
    let Some(store) = schema() else { return };
    let dir = tempfile::tempdir().unwrap();
    frozen_run_stops_its_command(store.as_ref(), dir.path(), Freeze::WhileRunning);
}

/// Frozen the moment its command starts (see cli_sqlite.rs).
#[test]
fn a_run_frozen_as_its_command_starts_has_it_stopped_too() {
    let Some(store) = schema() else { return };
    let dir = tempfile::tempdir().unwrap();
    frozen_run_stops_its_command(store.as_ref(), dir.path(), Freeze::AtStart);
}
