//! The `leasehold` binary against SQLite, across real OS processes.

mod common;

use std::time::Duration;

use common::*;
use leasehold::Locks;

/// A SQLite file in a temp dir that lives as long as the URL.
fn sqlite_in_temp_dir() -> Option<StoreUrl> {
    let dir = tempfile::tempdir().unwrap();
    Some(StoreUrl::new(sqlite_store(dir.path()), dir))
}

process_tests!(sqlite_in_temp_dir());

#[test]
fn bad_input_exits_64_naming_the_problem_and_the_store_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let long = "k".repeat(300);
    let cases: &[(&[&str], &str)] = &[
        (&["run", "", "--", "true"], "invalid key: must not be empty"),
        (
            &["run", &long, "--", "true"],
            "must be at most 256 bytes, got 300",
        ),
        (&["run", "a\u{1}b", "--", "true"], "control characters"),
        (&["status", "tab\there"], "control characters"),
        (
            &["run", "k", "--ttl", "0s", "--", "true"],
            "invalid ttl: must be between 100ms and 24h",
        ),
        (&["run", "k", "--ttl", "25h", "--", "true"], "invalid ttl"),
        (
            &["run", "k", "--ttl", "soon", "--", "true"],
            "expected a duration",
        ),
        (
            &["run", "k", "--wait=-1s", "--", "true"],
            "expected a duration",
        ),
        (&["run", "k"], "CMD"),
        (
            &["run", "k", "--permits", "0", "--", "true"],
            "invalid permits: must be 1 ..= 1024, got 0",
        ),
        (
            &["run", "k", "--permits", "2000", "--", "true"],
            "invalid permits",
        ),
        (
            &["run", "a", "b", "--shared", "--", "true"],
            "invalid --shared: takes one KEY",
        ),
        (
            &["run", "k", "--shared", "--permits", "2", "--", "true"],
            "cannot be used with",
        ),
        (
            &["run", "k", "--shared", "--exclusive", "--", "true"],
            "cannot be used with",
        ),
        (&["release", "k"], "--force"),
        (&["list", "--prefix", "a\u{7}"], "invalid prefix"),
        (&["frobnicate"], "unrecognized subcommand"),
    ];
    for (args, expected) in cases {
        let out = run(leasehold(&store).args(*args));
        assert_exit(&out, 64, expected, &format!("{args:?}"));
    }
    for (url, expected) in [
        ("ftp://host/x", "unknown scheme \"ftp\""),
        ("locks.db", "has no scheme"),
        ("sqlite://", "needs a file path"),
        ("sqlite:///tmp/x.db?mode=rw", "unknown sqlite option"),
        ("postgres://u:pw@h:notaport/db", "not a PostgreSQL URL"),
        ("mongodb://a:b:c:d", "invalid store url"),
        ("redis://127.0.0.1:notaport", "invalid store url"),
    ] {
        let out = run(leasehold(url).args(["status", "k"]));
        assert_exit(&out, 64, expected, url);
    }
    // Each error is one line.
    let out = run(leasehold(&store).args(["run", "", "--", "true"]));
    assert_eq!(stderr(&out).trim().lines().count(), 1);
    // Nothing stray was stored, and the store still works.
    let out = run(leasehold(&store).args(["list", "--json"]));
    assert_eq!(stdout(&out).trim(), "[]");
    let out = run(leasehold(&store).args(["run", "k", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn run_passes_exit_code_and_environment_through() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let out = run(leasehold(&store).args([
        "run",
        "job",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_KEY:$LEASEHOLD_TOKEN; exit 3",
    ]));
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(stdout(&out).trim(), "job:1");
    // Released on exit: the next run gets the next token at once.
    let out =
        run(leasehold(&store).args(["run", "job", "--", "sh", "-c", "echo $LEASEHOLD_TOKEN"]));
    assert_eq!(stdout(&out).trim(), "2");
    let out = run(leasehold(&store).args(["run", "job", "--", "/nonexistent/cmd"]));
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    assert_eq!(
        status(&store, "job")["held"],
        false,
        "released after a failed spawn"
    );
}

#[test]
fn status_list_release_and_busy_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let locks = rt.block_on(Locks::open(&store)).unwrap();
    let guard = rt.block_on(locks.try_acquire("admin:a")).unwrap();

    let s = status(&store, "admin:a");
    assert_eq!(s["key"], "admin:a");
    assert_eq!(s["held"], true);
    assert_eq!(s["token"], guard.token());
    assert!(
        s["holder"].as_str().unwrap().contains(':'),
        "host:pid label"
    );
    assert!(s["expires_in_ms"].as_u64().unwrap() > 20_000);
    let free = status(&store, "admin:b");
    assert_eq!(
        free,
        serde_json::json!({"key":"admin:b","held":false,"holder":null,"token":null,"expires_in_ms":null})
    );

    let out = run(leasehold(&store).args(["list", "--prefix", "admin:", "--json"]));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["key"], "admin:a");

    // Busy without --wait: 75, naming the holder.
    let out = run(leasehold(&store).args(["run", "admin:a", "--", "true"]));
    assert_exit(&out, 75, "is held by", "busy without --wait");
    let out = run(leasehold(&store).args(["run", "admin:a", "--wait", "300ms", "--", "true"]));
    assert_exit(&out, 75, "not acquired within", "busy with --wait 300ms");

    let out = run(leasehold(&store).args(["release", "admin:a", "--force"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("broke the lock"));
    assert_eq!(status(&store, "admin:a")["held"], false);
    // The evicted holder learns at its next renewal (ttl/3 = 10 s).
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(15), guard.lost()).await })
        .expect("the evicted holder's lost() fires");
}

#[test]
fn an_unreachable_store_exits_69() {
    let err = down_store_stderr("sqlite:///proc/leasehold-cannot-exist.db", &["status", "k"]);
    assert!(err.contains("store unavailable"), "{err}");
}

#[test]
fn an_explicit_store_in_a_missing_directory_exits_64_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("lcoks");
    let store = sqlite_store(&typo);
    for args in [
        &["status", "k"][..],
        &["run", "k", "--", "true"],
        &SHORT_DEMO,
    ] {
        let out = run(leasehold(&store).args(args));
        let missing = format!("directory {} of ", typo.display());
        assert_exit(&out, 64, &missing, &format!("{args:?}"));
        assert!(!typo.exists(), "{args:?} created the directory");
    }
}

#[test]
fn demo_runs_on_the_default_store_of_a_fresh_machine() {
    // No --store, and a state directory that does not exist yet.
    let state = tempfile::tempdir().unwrap();
    let out = run(std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env_remove("LEASEHOLD_STORE")
        .env("XDG_STATE_HOME", state.path().join("fresh"))
        .args(SHORT_DEMO)
        .arg("--json"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(state.path().join("fresh/leasehold/locks.db").exists());
}

#[test]
fn demo_shows_the_race_and_three_safe_strategies() {
    let dir = tempfile::tempdir().unwrap();
    demo_shows_race_and_safety(
        &sqlite_store(dir.path()),
        &["none", "lease", "row-lock", "optimistic"],
    );
}

#[test]
fn a_frozen_run_has_its_command_stopped_before_the_next_holder_starts() {
    let dir = tempfile::tempdir().unwrap();
    frozen_run_stops_its_command(&sqlite_store(dir.path()), dir.path(), Freeze::WhileRunning);
}

/// Frozen the moment its command starts: the watchdog already has the
/// lease's deadline (it is started before the command) and finds the
/// command's group without being told it.
#[test]
fn a_run_frozen_as_its_command_starts_has_it_stopped_too() {
    let dir = tempfile::tempdir().unwrap();
    frozen_run_stops_its_command(&sqlite_store(dir.path()), dir.path(), Freeze::AtStart);
}

/// `release --force KEY` breaks whatever holds KEY (one key is one lock):
/// a plain `run KEY` loses KEY and stops its command (exit 70), so a
/// `--shared` run of KEY can start; a `--shared` run of KEY is broken too
/// (it exits 70), and status names the key's kind.
#[test]
fn force_release_of_a_plain_runs_key_frees_the_whole_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let pidfile = dir.path().join("cmd.pid");
    let mut holder = leasehold(&store)
        .args(["run", "whole", "--ttl", "3s", "--", "sh", "-c"])
        .arg(pid_then_sleep(&pidfile))
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || read_pid(&pidfile).is_some()),
        "the command did not start"
    );
    let s = status(&store, "whole");
    assert_eq!(s["held"], true, "{s}");
    assert_eq!(
        s["kind"], "mutex",
        "a fresh key's plain run is a mutex: {s}"
    );
    let out = run(leasehold(&store).args(["release", "whole", "--force"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("broke the lock"), "{}", stdout(&out));
    // The run learns at its next renewal (ttl/3) and stops its command.
    assert_eq!(holder.wait().unwrap().code(), Some(70));
    let out = run(leasehold(&store).args(["run", "whole", "--shared", "--", "true"]));
    assert!(
        out.status.success(),
        "KEY is free for readers: {}",
        stderr(&out)
    );

    let mut reader = leasehold(&store)
        .args(["run", "whole", "--shared", "--ttl", "3s", "--", "sh", "-c"])
        .arg(pid_then_sleep(&pidfile))
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || status(
        &store, "whole"
    )["rw"]
        .as_array()
        .is_some_and(|rows| !rows.is_empty())));
    assert_eq!(status(&store, "whole")["kind"], "reader-writer lock");
    let out = run(leasehold(&store).args(["release", "whole", "--force"]));
    assert!(
        stdout(&out).contains("broke the lock on whole (1 holder(s))"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        reader.wait().unwrap().code(),
        Some(70),
        "the reader is broken too"
    );
}

/// libfaketime's preload library (Debian's `libfaketime`), which shifts
/// the wall clock of the process it is loaded into.
fn libfaketime() -> Option<&'static str> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|path| std::path::Path::new(path).exists())
}

/// A forward step of the host's wall clock frees no lease early: a process
/// whose wall clock reads an hour ahead (libfaketime; its boot and
/// monotonic clocks untouched, as after an NTP step) still finds the key
/// held. While SQLite's own `unixepoch` decided expiry, that process saw
/// the 30 s lease as an hour over and took the key.
#[test]
fn a_wall_clock_step_frees_no_sqlite_lease_early() {
    let Some(faketime) = libfaketime() else {
        assert_ne!(
            std::env::var("LEASEHOLD_REQUIRE_SERVERS").as_deref(),
            Ok("1"),
            "libfaketime is not installed and LEASEHOLD_REQUIRE_SERVERS=1 (Debian package libfaketime)"
        );
        eprintln!("skipping: libfaketime is not installed (Debian package libfaketime)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let (mut holder, _) = start_holder(&store, "clock-step", &dir.path().join("holder.pid"));

    let stepped = run(leasehold(&store)
        .args(["run", "clock-step", "--wait", "0s", "--", "true"])
        .env("LD_PRELOAD", faketime)
        .env("FAKETIME", "+1h")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1"));
    let held = status(&store, "clock-step");
    holder.kill().unwrap();
    holder.wait().unwrap();

    // EX_TEMPFAIL: busy, naming the holder.
    let case = "a process an hour ahead took a held key";
    assert_exit(&stepped, 75, "held", case);
    assert_eq!(held["held"], true, "the holder still holds: {held}");
}

/// `GET /metrics` on `addr`, the body.
fn scrape(addr: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    conn.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    Ok(body.to_owned())
}

/// The sum of the samples of `series` (a metric name) whose labels include
/// every one of `labels`.
fn sample_sum(text: &str, series: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{series}{{")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

#[test]
fn a_scrape_of_the_demo_shows_its_wait_and_hold_histograms_matching_its_totals() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let mut demo = leasehold(&sqlite_store(dir.path()))
        .args(["demo", "--strategy", "lease", "--workers", "3"])
        .args(["--orders", "90", "--pay", "1ms", "--json"])
        .args(["--metrics-addr", "127.0.0.1:0", "--metrics-linger", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr_lines = BufReader::new(demo.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = stderr_lines
            .next()
            .expect("the demo prints where it serves")
            .unwrap();
        if let Some(rest) = line.strip_prefix("leasehold: demo metrics on http://") {
            break rest.strip_suffix("/metrics").unwrap().to_owned();
        }
    };
    // Scrapes while the workers run.
    let done = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicUsize::new(0));
    let scraper = {
        let (addr, done, scrapes) = (addr.clone(), done.clone(), scrapes.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                scrape(&addr).expect("served during the run");
                scrapes.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut results = String::new();
    BufReader::new(demo.stdout.take().unwrap())
        .read_line(&mut results)
        .unwrap();
    done.store(true, Ordering::Relaxed);
    scraper.join().unwrap();
    let text = scrape(&addr).unwrap();
    let _ = demo.kill();
    let _ = demo.wait();
    let results: serde_json::Value = serde_json::from_str(&results).expect(&results);
    let lease = &results["results"][0];
    assert_eq!(lease["strategy"], "lease", "{results}");
    let orders = lease["orders"].as_f64().unwrap();
    let failed = lease["failed"].as_f64().unwrap();
    assert_eq!(orders, 90.0);
    assert!(scrapes.load(Ordering::Relaxed) > 0);

    let ours = [
        "store=\"sqlite\"",
        "primitive=\"mutex\"",
        "lock_class=\"demo\"",
    ];
    let with = |extra: &'static str| {
        let mut labels = ours.to_vec();
        labels.push(extra);
        labels
    };
    let granted = with("outcome=\"granted\"");
    // Every order acquired once: granted, or timed out and counted failed.
    assert_eq!(
        sample_sum(&text, "leasehold_lock_wait_time_count", &granted),
        orders - failed,
        "{text}"
    );
    assert_eq!(
        sample_sum(
            &text,
            "leasehold_lock_wait_time_count",
            &with("outcome=\"timeout\"")
        ),
        failed,
        "{text}"
    );
    // Attempts are a counter: at least one per granted acquisition.
    assert!(
        sample_sum(&text, "leasehold_lock_attempts", &granted) >= orders - failed,
        "{text}"
    );
    // Every grant was held and released.
    assert_eq!(
        sample_sum(&text, "leasehold_lock_use_time_count", &ours),
        orders - failed,
        "{text}"
    );
    assert_eq!(
        sample_sum(&text, "leasehold_lock_held", &ours),
        0.0,
        "{text}"
    );
    // Histograms, with buckets, and the key itself never a label.
    for name in ["leasehold_lock_wait_time", "leasehold_lock_use_time"] {
        assert!(
            sample_sum(&text, &format!("{name}_bucket"), &with("le=\"+Inf\"")) >= orders - failed,
            "{text}"
        );
        assert!(text.contains(&format!("# TYPE {name} histogram")), "{text}");
    }
    assert!(!text.contains("widget-lease"), "{text}");
}

/// `leasehold run --fair` processes that start waiting one by one get the
/// key in the order they started: they queue at the store
/// (docs/fairness.md), and each release hands the key to the next of them.
#[test]
fn processes_get_the_key_in_the_order_they_came() {
    let dir = tempfile::tempdir().unwrap();
    fair_processes_get_the_key_in_the_order_they_came(&sqlite_store(dir.path()));
}
