//! `leasehold torture` on SQLite, with the real binary and real worker
//! processes: fenced runs pass with their faults hitting, unfenced runs are
//! caught, bad arguments exit 64.

mod common;
mod torture_common;

use common::{assert_exit, leasehold, run, sqlite_store};
use torture_common::*;

/// `check` on a store in a new SQLite file, removed afterwards.
fn on_temp_sqlite<T>(check: impl FnOnce(&str) -> T) -> T {
    let dir = tempfile::tempdir().unwrap();
    check(&sqlite_store(dir.path()))
}

#[test]
fn fenced_server_resource_passes_under_kills_and_pauses() {
    let run = on_temp_sqlite(|store| fenced_run_passes_and_faults_hit(store, &[]));
    // SQLite is a file: the default leaves the proxy faults out, and says so.
    let out = &run.output;
    assert!(out.contains("no proxy faults by default"), "{out}");
    assert_eq!(run.setup["faults"], serde_json::json!(["kill", "pause"]));
}

#[test]
fn a_broken_renewal_fails_the_run() {
    on_temp_sqlite(broken_renewal_fails_the_run);
}

#[test]
fn a_requested_fault_that_never_landed_is_inconclusive() {
    // Too short for the nemesis to start a kill (it leaves room for 3 ttl
    // after a ttl of warm-up): the run tested nothing it was asked to.
    let dir = tempfile::tempdir().unwrap();
    let run = torture(
        &sqlite_store(dir.path()),
        &["--duration", "1500ms", "--ttl", "500ms", "--faults", "kill"],
    );
    assert_eq!(run.code, 2, "{}", run.output);
    assert_eq!(run.report["verdict"], "inconclusive", "{}", run.output);
    assert_eq!(run.n("/faults/kill/injected"), 0, "{}", run.output);
    assert!(
        run.report["inconclusive"]
            .to_string()
            .contains("kill faults never landed on a holder"),
        "{}",
        run.output
    );
    run.remove_kept_logs();
}

#[test]
fn fenced_in_store_resource_passes_under_kills_and_pauses() {
    on_temp_sqlite(|store| fenced_run_passes_and_faults_hit(store, &["--resource", "store"]));
}

#[test]
fn unfenced_server_resource_loses_updates() {
    on_temp_sqlite(|store| unfenced_run_reports_lost_updates(store, &[]));
}

#[test]
fn unfenced_in_store_resource_loses_updates() {
    on_temp_sqlite(|store| unfenced_run_reports_lost_updates(store, &["--resource", "store"]));
}

#[test]
fn fenced_semaphore_run_passes_with_its_permits_at_once() {
    let run = on_temp_sqlite(|store| fenced_primitive_run_passes(store, "semaphore", &[]));
    assert_eq!(run.n("/holders_at_once/limit"), 3, "{}", run.output);
    assert_eq!(run.setup["permits"], 3, "{}", run.output);
}

#[test]
fn fenced_semaphore_run_with_the_counter_in_the_store_passes() {
    // Two permits: each slot's counter row is fenced by that slot's tokens.
    on_temp_sqlite(|store| {
        fenced_primitive_run_passes(
            store,
            "semaphore",
            &["--permits", "2", "--resource", "store"],
        )
    });
}

#[test]
fn unfenced_semaphore_run_loses_updates() {
    let run = on_temp_sqlite(|store| unfenced_primitive_run_fails(store, "semaphore", &[]));
    assert!(run.n("/lost_increments") > 0, "{}", run.output);
}

#[test]
fn fenced_rw_run_passes_with_readers_together_and_writers_alone() {
    on_temp_sqlite(|store| fenced_primitive_run_passes(store, "rw", &[]));
}

#[test]
fn unfenced_rw_run_accepts_stale_operations() {
    on_temp_sqlite(|store| unfenced_primitive_run_fails(store, "rw", &[]));
}

#[test]
fn the_history_file_holds_every_source() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let run = torture(
        &sqlite_store(dir.path()),
        &[
            "--duration",
            "6s",
            "--ttl",
            "300ms",
            "--faults",
            "kill",
            "--history",
            history.to_str().unwrap(),
        ],
    );
    assert_eq!(run.code, 0, "{}", run.output);
    let text = std::fs::read_to_string(&history).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for source in ["worker", "resource", "nemesis"] {
        assert!(
            lines.iter().any(|l| l["source"] == source),
            "no {source} record"
        );
    }
    let times: Vec<u64> = lines
        .iter()
        .map(|l| l["t"].as_u64().or(l["start"].as_u64()).unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "time order");
}

#[test]
fn bad_torture_arguments_exit_64_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let cases: &[(&[&str], &str)] = &[
        (&["--workers", "0"], "--workers"),
        (&["--keys", "0"], "--keys"),
        (
            &["--duration", "0s"],
            "invalid duration: must be more than 0",
        ),
        (&["--duration=-5s"], "expected a duration"),
        (&["--ttl", "50ms"], "invalid ttl: torture needs 100ms..=60s"),
        (&["--ttl", "2m"], "invalid ttl"),
        (&["--faults", "kill,flood"], "invalid value 'flood'"),
        (
            &["--faults", "none,kill"],
            "--faults none cannot be combined",
        ),
        (&["--faults", "restart"], "--restart-cmd"),
        (
            &["--faults", "proxy"],
            "--faults proxy cannot apply to this store: sqlite is a file",
        ),
        (&["--faults", "kill,proxy"], "--faults proxy cannot apply"),
        (&["--restart-cmd", "true"], "--faults restart"),
        (&["--resource", "disk"], "invalid value 'disk'"),
        (&["--primitive", "barrier"], "invalid value 'barrier'"),
        (
            &["--permits", "2"],
            "--permits applies to --primitive semaphore, not mutex",
        ),
        (&["--primitive", "semaphore", "--permits", "0"], "--permits"),
        (
            &["--primitive", "rw", "--resource", "store"],
            "--resource store has no shared reads",
        ),
        (
            &["--primitive", "semaphore", "--permits", "1025"],
            "--permits",
        ),
        (
            &["--history", "/nonexistent-dir/h.jsonl"],
            "--history /nonexistent-dir/h.jsonl",
        ),
    ];
    for (args, expected) in cases {
        let out = run(leasehold(&store).arg("torture").args(*args));
        assert_exit(&out, 64, expected, &format!("{args:?}"));
    }
    let out = run(leasehold("ftp://x").args(["torture", "--duration", "1s"]));
    assert_exit(&out, 64, "unknown scheme \"ftp\"", "ftp://x");
}
