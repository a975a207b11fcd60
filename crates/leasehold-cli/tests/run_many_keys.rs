//! `leasehold run KEY KEY... -- CMD`: several keys, all or none, on SQLite.

mod common;

use std::process::Output;

use common::*;

/// `leasehold run KEYS... [EXTRA...] -- sh -c SCRIPT` on `store`.
fn run_sh(store: &str, keys: &[&str], extra: &[&str], script: &str) -> Output {
    run(leasehold(store)
        .arg("run")
        .args(keys)
        .args(extra)
        .args(["--", "sh", "-c", script]))
}

#[test]
fn several_keys_are_taken_together_in_sorted_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let keys = ["sku:9", "sku:1", "sku:5"];
    let script =
        "printf '%s|%s|[%s]' \"$LEASEHOLD_KEYS\" \"$LEASEHOLD_TOKENS\" \"$LEASEHOLD_KEY\"; exit 4";
    let out = run_sh(&store, &keys, &[], script);
    assert_exit(&out, 4, "", "three keys");
    assert_eq!(
        stdout(&out),
        "sku:1\nsku:5\nsku:9|1\n1\n1|[]",
        "keys and tokens line by line in sorted order; no single LEASEHOLD_KEY"
    );
    for key in keys {
        assert_eq!(status(&store, key)["held"], false, "{key} released on exit");
    }
    // One key keeps the single-key variables, and the set's variables too.
    let script = "echo $LEASEHOLD_KEY:$LEASEHOLD_TOKEN:$LEASEHOLD_KEYS:$LEASEHOLD_TOKENS";
    let out = run_sh(&store, &["sku:5"], &[], script);
    assert_eq!(stdout(&out).trim(), "sku:5:2:sku:5:2");
}

#[test]
fn one_held_key_makes_the_whole_set_busy_and_holds_none() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let (mut holder, pid) = start_holder(&store, "b", &dir.path().join("holder.pid"));
    let out = run_sh(&store, &["c", "a", "b"], &["--wait", "300ms"], "true");
    assert_exit(&out, 75, "\"b\"", "b held");
    for key in ["a", "c"] {
        assert_eq!(status(&store, key)["held"], false, "{key} was given back");
    }
    signal(pid, "TERM");
    holder.wait().unwrap();
    let out = run_sh(&store, &["c", "a", "b"], &[], "true");
    assert_exit(&out, 0, "", "b released");
}

#[test]
fn a_key_given_twice_is_bad_input_before_any_io() {
    // A store that cannot be opened: only a check before I/O answers 64.
    let store = "postgres://127.0.0.1:1/nothing-listens-here";
    let out = run_sh(store, &["a", "b", "a"], &[], "true");
    assert_exit(&out, 64, "\"a\" appears more than once", "a twice");
}
