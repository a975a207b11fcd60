//! `leasehold run KEY KEY... -- CMD`: several keys, all or none, on SQLite.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

#[test]
fn several_keys_are_taken_together_in_sorted_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let out = run(leasehold(&store).args([
        "run",
        "sku:9",
        "sku:1",
        "sku:5",
        "--",
        "sh",
        "-c",
        "printf '%s|%s|[%s]' \"$LEASEHOLD_KEYS\" \"$LEASEHOLD_TOKENS\" \"$LEASEHOLD_KEY\"; exit 4",
    ]));
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "sku:1\nsku:5\nsku:9|1\n1\n1|[]",
        "keys and tokens line by line in sorted order; no single LEASEHOLD_KEY"
    );
    for key in ["sku:1", "sku:5", "sku:9"] {
        assert_eq!(status(&store, key)["held"], false, "{key} released on exit");
    }
    // One key keeps the single-key variables, and the sets' variables too.
    let out = run(leasehold(&store).args([
        "run",
        "sku:5",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_KEY:$LEASEHOLD_TOKEN:$LEASEHOLD_KEYS:$LEASEHOLD_TOKENS",
    ]));
    assert_eq!(stdout(&out).trim(), "sku:5:2:sku:5:2");
}

/// Starts `run KEY --ttl 30s -- sh -c 'echo $$ > pidfile; exec sleep 30'`
/// and waits for the command's pid.
fn hold(store: &str, key: &str, pidfile: &Path) -> (std::process::Child, i32) {
    let holder = leasehold(store)
        .args(["run", key, "--ttl", "30s", "--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 30", pidfile.display()))
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || read_pid(pidfile).is_some()),
        "the holder's command did not start"
    );
    (holder, read_pid(pidfile).unwrap())
}

#[test]
fn one_held_key_makes_the_whole_set_busy_and_holds_none() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let pidfile = dir.path().join("holder.pid");
    let (mut holder, pid) = hold(&store, "b", &pidfile);
    let out = run(leasehold(&store).args(["run", "c", "a", "b", "--wait", "300ms", "--", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"b\""),
        "names the held key: {}",
        stderr(&out)
    );
    for key in ["a", "c"] {
        assert_eq!(status(&store, key)["held"], false, "{key} was given back");
    }
    signal(pid, "TERM");
    holder.wait().unwrap();
    let out = run(leasehold(&store).args(["run", "c", "a", "b", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_key_given_twice_is_bad_input_before_any_io() {
    // A store that cannot be opened: only a check before I/O answers 64.
    let store = "postgres://127.0.0.1:1/nothing-listens-here";
    let out = run(leasehold(store).args(["run", "a", "b", "a", "--", "true"]));
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"a\" appears more than once"),
        "{}",
        stderr(&out)
    );
}
