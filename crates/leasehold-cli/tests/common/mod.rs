//! Helpers for tests that run the real `leasehold` binary.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// The built binary.
pub fn leasehold(store: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    cmd.arg("--store")
        .arg(store)
        .env_remove("LEASEHOLD_STORE")
        .env_remove("RUST_LOG");
    cmd
}

/// Runs one PostgreSQL statement on a connection of its own.
pub fn pg_exec(url: &str, statement: &str) {
    use sqlx::Connection;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::raw_sql(statement).execute(&mut conn).await.unwrap();
        conn.close().await.unwrap();
    });
}

/// A store URL for one test, with what must live as long as it (a temp
/// dir, a [`PgCleanup`]).
pub struct StoreUrl {
    pub url: String,
    _keep: Box<dyn std::any::Any>,
}

impl StoreUrl {
    pub fn new(url: String, keep: impl std::any::Any) -> Self {
        StoreUrl {
            url,
            _keep: Box::new(keep),
        }
    }
}

impl AsRef<str> for StoreUrl {
    fn as_ref(&self) -> &str {
        &self.url
    }
}

/// Runs a PostgreSQL statement when dropped (best effort: a failing test
/// should report its own failure): drops what a test made on the server.
pub struct PgCleanup {
    pub server: String,
    pub statement: String,
}

impl Drop for PgCleanup {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| pg_exec(&self.server, &self.statement));
    }
}

/// `demo` arguments for a short run: two workers, twenty orders.
pub const SHORT_DEMO: [&str; 7] = ["demo", "--workers", "2", "--orders", "20", "--stock", "10"];

/// A SQLite store URL in `dir`.
/// The Redis (or Redis Cluster) server of `url_var` with a fresh key
/// prefix, so runs in parallel never share a lock; `None` to skip.
pub fn redis_store_of(url_var: &str) -> Option<String> {
    let url = leasehold::conformance::server_url(url_var)?;
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!(
        "{url}{sep}prefix=cli-test-{:016x}",
        rand::random::<u64>()
    ))
}

pub fn sqlite_store(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

/// Runs to completion, returning the output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("the leasehold binary runs")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `out` exited with `code` and its stderr contains `text`; a failure
/// names `case` (what was run) and shows the stderr.
#[track_caller]
pub fn assert_exit(out: &Output, code: i32, text: &str, case: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{case}: {err}");
    assert!(err.contains(text), "{case}: expected {text:?} in: {err}");
}

/// `n` distinct local ports nothing listens on: bound together, then closed
/// again, so connecting is refused.
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// A local port nothing listens on.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `leasehold ARGS` against a store that is down: it exits 69 within ten
/// seconds. Returns its stderr.
pub fn down_store_stderr(store: &str, args: &[&str]) -> String {
    let started = Instant::now();
    let out = run(leasehold(store).args(args));
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(69), "{args:?}: {}", stderr(&out));
    assert!(took < Duration::from_secs(10), "{args:?} took {took:?}");
    stderr(&out)
}

/// Polls `check` every 20 ms until it is true or `limit` passes.
pub fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// `leasehold status KEY --json`, parsed.
pub fn status(store: &str, key: &str) -> serde_json::Value {
    let out = run(leasehold(store).args(["status", key, "--json"]));
    assert!(out.status.success(), "status failed: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
}

/// Whether `pid` is gone. In this sandbox an exited orphan may linger as a
/// zombie (nobody reaps it), which counts as dead.
pub fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

pub fn signal(pid: i32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill -{sig} {pid}");
}

/// Reads a pid a child wrote to `file`.
pub fn read_pid(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The counter check: `processes` OS processes each run `rounds` rounds of
/// `leasehold run counter -- <read, sleep, write + 1, log token>` against
/// one store; the count must be exact and the tokens strictly increasing.
pub fn counter_under_many_processes(store: &str, dir: &Path, processes: usize, rounds: usize) {
    let counter = dir.join("counter");
    let log = dir.join("tokens.log");
    std::fs::write(&counter, "0\n").unwrap();
    std::fs::write(&log, "").unwrap();
    let script = format!(
        "v=$(cat {c}); sleep 0.002; echo $((v + 1)) > {c}; echo $LEASEHOLD_TOKEN >> {l}",
        c = counter.display(),
        l = log.display()
    );
    let workers: Vec<_> = (0..processes)
        .map(|_| {
            let store = store.to_owned();
            let script = script.clone();
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    let out = run(leasehold(&store).args([
                        "run", "counter", "--wait", "120s", "--ttl", "10s", "--", "sh", "-c",
                        &script,
                    ]));
                    assert!(out.status.success(), "run failed: {}", stderr(&out));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker thread");
    }
    let total = processes * rounds;
    let value: usize = std::fs::read_to_string(&counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(value, total, "lost increments");
    let tokens: Vec<u64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.parse().expect("a token per line"))
        .collect();
    assert_eq!(tokens.len(), total);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase in log order"
    );
}

/// The semaphore check: `processes` OS processes run `leasehold run KEY
/// --permits PERMITS -- <mark running, count the marks, sleep, unmark>` at
/// once. No command may see more than `permits` running (itself included),
/// some command must see exactly `permits` (they do run side by side), every
/// slot is below `permits`, and `list` shows the permits while they are held.
pub fn permits_under_many_processes(store: &str, dir: &Path, processes: usize, permits: usize) {
    let running = dir.join("running");
    std::fs::create_dir_all(&running).unwrap();
    let counts = dir.join("counts.log");
    std::fs::write(&counts, "").unwrap();
    let key = unique_key("permits");
    let script = format!(
        "touch {r}/$$; echo $(ls {r} | wc -l) $LEASEHOLD_SLOT $LEASEHOLD_TOKEN >> {c}; \
         sleep 0.6; rm {r}/$$",
        r = running.display(),
        c = counts.display()
    );
    let limit = permits.to_string();
    let workers: Vec<Child> = (0..processes)
        .map(|_| {
            leasehold(store)
                .args([
                    "run",
                    &key,
                    "--permits",
                    &limit,
                    "--wait",
                    "120s",
                    "--ttl",
                    "10s",
                ])
                .args(["--", "sh", "-c", &script])
                .spawn()
                .unwrap()
        })
        .collect();
    // While they run, `list` shows permit rows of the key (at most `permits`).
    let mut listed = 0;
    wait_until(Duration::from_secs(20), || {
        let out = run(leasehold(store).args(["list", "--json", "--prefix", &key]));
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let n = rows
            .as_array()
            .map_or(0, |r| r.iter().filter(|row| row["slot"].is_u64()).count());
        listed = listed.max(n);
        n > 0
    });
    for mut w in workers {
        assert!(w.wait().unwrap().success(), "a run under --permits failed");
    }
    let lines: Vec<(usize, u64, u64)> = std::fs::read_to_string(&counts)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<u64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (f[0] as usize, f[1], f[2])
        })
        .collect();
    assert_eq!(lines.len(), processes, "every command ran once");
    let most = lines.iter().map(|l| l.0).max().unwrap();
    assert!(
        most <= permits,
        "{most} commands ran at once under --permits {permits}"
    );
    assert_eq!(most, permits, "never {permits} at once: {lines:?}");
    assert!(
        lines.iter().all(|l| l.1 < permits as u64),
        "slots: {lines:?}"
    );
    assert!(
        (1..=permits).contains(&listed),
        "list showed {listed} permits"
    );
}

/// The reader-writer check: three `leasehold run KEY --shared` commands
/// (each records its start and end times and sleeps 1 s) run side by side;
/// an `--exclusive` run started while they hold KEY, and a fourth shared
/// run started while the exclusive one waits, overlap it in no instant;
/// `status` lists the readers and then the writer, and every command gets
/// LEASEHOLD_TOKEN, the writer's above every reader's before it.
pub fn shared_and_exclusive_runs(store: &str, dir: &Path) {
    let times = dir.join("times.log");
    std::fs::write(&times, "").unwrap();
    let key = unique_key("rw");
    let spawn = |flag: &str, side: &str| {
        leasehold(store)
            .args(["run", &key, flag, "--wait", "60s", "--ttl", "10s"])
            .args(["--", "sh", "-c", &timed_command(side, &times)])
            .spawn()
            .unwrap()
    };
    let readers_listed = |n: usize| {
        let s = status(store, &key);
        s["rw"].as_array().map_or(0, |rows| {
            rows.iter().filter(|r| r["side"] == "read").count()
        }) == n
    };
    let mut children: Vec<Child> = (0..3).map(|_| spawn("--shared", "S")).collect();
    assert!(
        wait_until(Duration::from_secs(20), || readers_listed(3)),
        "three shared runs never held KEY together: {}",
        status(store, &key)
    );
    children.push(spawn("--exclusive", "X"));
    // The exclusive run is waiting (its mark is down) before the late reader comes.
    std::thread::sleep(Duration::from_millis(300));
    children.push(spawn("--shared", "L"));
    assert!(
        wait_until(Duration::from_secs(20), || status(store, &key)["rw"]
            .as_array()
            .is_some_and(|rows| rows.iter().any(|r| r["side"] == "write"))),
        "the writer never held KEY"
    );
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a run failed");
    }
    let rows = timed_runs(&times);
    assert_eq!(rows.len(), 5, "every command ran once: {rows:?}");
    let shared: Vec<_> = rows.iter().filter(|r| r.side == "S").collect();
    let writer = rows.iter().find(|r| r.side == "X").unwrap();
    let late = rows.iter().find(|r| r.side == "L").unwrap();
    for (i, a) in shared.iter().enumerate() {
        for b in &shared[i + 1..] {
            assert!(a.overlaps(b), "shared runs did not overlap: {rows:?}");
        }
    }
    for other in rows.iter().filter(|r| r.side != "X") {
        assert!(
            !writer.overlaps(other),
            "the exclusive run overlapped {other:?}: {rows:?}"
        );
    }
    assert!(
        late.start > writer.end,
        "the late reader ran before the waiting writer: {rows:?}"
    );
    assert!(
        shared.iter().all(|r| writer.token > r.token),
        "tokens: {rows:?}"
    );
    assert!(late.token > writer.token, "tokens: {rows:?}");
}

/// The command of a timed run: it records `SIDE START END TOKEN` (start
/// and end in nanoseconds) in `times` and holds for 1 s in between.
fn timed_command(side: &str, times: &Path) -> String {
    format!(
        "s=$(date +%s%N); sleep 1; echo {side} $s $(date +%s%N) $LEASEHOLD_TOKEN >> {t}",
        t = times.display()
    )
}

/// A line of a times log that [`timed_command`]s wrote.
#[derive(Debug)]
struct TimedRun {
    side: String,
    start: u128,
    end: u128,
    token: u64,
}

impl TimedRun {
    fn overlaps(&self, other: &TimedRun) -> bool {
        self.start < other.end && other.start < self.end
    }
}

fn timed_runs(times: &Path) -> Vec<TimedRun> {
    std::fs::read_to_string(times)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            TimedRun {
                side: f[0].to_owned(),
                start: f[1].parse().unwrap(),
                end: f[2].parse().unwrap(),
                token: f[3].parse().unwrap(),
            }
        })
        .collect()
}

/// Starts `leasehold run KEY --ttl 1s EXTRA -- sh -c ...` whose command
/// writes its pid to `pidfile` and sleeps; returns once it holds `key` and
/// its command runs, with the lease's token.
fn spawn_holder(store: &str, key: &str, extra: &[&str], pidfile: &Path) -> (Child, u64) {
    let holder = leasehold(store)
        .args(["run", key, "--ttl", "1s"])
        .args(extra)
        .args(["--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 30", pidfile.display()))
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || status(store, key)
        ["held"]
        == true));
    assert!(wait_until(Duration::from_secs(5), || read_pid(pidfile).is_some()));
    let token = status(store, key)["token"].as_u64().unwrap();
    (holder, token)
}

/// Runs the next holder of `key` (waiting up to 10 s); returns its token.
fn next_holder_token(store: &str, key: &str) -> u64 {
    let out = run(leasehold(store).args([
        "run",
        key,
        "--wait",
        "10s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_TOKEN",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().parse().unwrap()
}

/// A holder killed with SIGKILL is taken over within ttl + 1 s.
pub fn kill9_takeover(store: &str, dir: &Path) {
    let pidfile = dir.join("kill9-child.pid");
    let (mut holder, first) = spawn_holder(store, "kill9", &[], &pidfile);
    holder.kill().unwrap(); // SIGKILL
    let killed_at = Instant::now();
    holder.wait().unwrap();
    let second = next_holder_token(store, "kill9");
    let took = killed_at.elapsed();
    assert!(second > first);
    assert!(
        took <= Duration::from_secs(2),
        "takeover took {took:?} (ttl 1 s + 1 s allowed)"
    );
    // The killed holder's command died with it (parent-death signal); kill
    // it anyway so a failure elsewhere leaves nothing behind.
    if let Some(pid) = read_pid(&pidfile) {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

/// A holder paused past its ttl loses the lease: another process takes the
/// key with a larger token, and after SIGCONT the paused `run` stops its
/// command and exits 70.
pub fn sigstop_loses_lease(store: &str, dir: &Path) {
    let pidfile = dir.join("paused-child.pid");
    let extra = ["--kill-after", "500ms"];
    let (mut holder, first) = spawn_holder(store, "paused", &extra, &pidfile);
    let child = read_pid(&pidfile).unwrap();
    let holder_pid = holder.id() as i32;
    signal(holder_pid, "STOP");
    let second = next_holder_token(store, "paused");
    assert!(
        second > first,
        "the next holder's token {second} must exceed {first}"
    );
    signal(holder_pid, "CONT");
    let status = holder.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(70),
        "a paused holder exits 70 after losing its lease"
    );
    assert!(
        wait_until(Duration::from_secs(5), || is_dead(child)),
        "the command was stopped"
    );
}

/// Runs `leasehold demo --workers 4 --json` on `store` and checks its
/// output: the `expected` strategies ran in that order, `none` shows the
/// race (oversold or lost updates), and every other strategy sold without
/// overselling or losing an update.
pub fn demo_shows_race_and_safety(store: &str, expected: &[&str]) {
    let out = run(leasehold(store).args(["demo", "--workers", "4", "--json"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = json["results"].as_array().unwrap();
    let ran: Vec<_> = results
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(ran, expected);
    for r in results {
        for field in [
            "strategy",
            "orders",
            "sold",
            "initial_stock",
            "final_stock",
            "oversold",
            "lost_updates",
            "retries",
            "elapsed_ms",
            "p50_ms",
            "p99_ms",
        ] {
            assert!(r.get(field).is_some(), "missing {field} in {r}");
        }
        let (sold, initial, fin) = (
            r["sold"].as_i64().unwrap(),
            r["initial_stock"].as_i64().unwrap(),
            r["final_stock"].as_i64().unwrap(),
        );
        if r["strategy"] == "none" {
            assert!(
                r["oversold"].as_i64().unwrap() + r["lost_updates"].as_i64().unwrap() > 0,
                "the unprotected run must show the race: {r}"
            );
        } else {
            assert_eq!(r["oversold"], 0, "{r}");
            assert_eq!(r["lost_updates"], 0, "{r}");
            assert_eq!(fin, initial - sold, "{r}");
            assert!(sold > 0, "a run that sells nothing proves nothing: {r}");
        }
    }
}

/// The demo tests of a store without a row lock (Redis, one server or a
/// cluster; etcd), `$store` as in [`process_tests!`] and `$scheme` the name
/// the refusal gives: the race and both safe strategies such a store offers
/// (`lease`, `optimistic`), and `--strategy row-lock` refused with 64
/// before any strategy runs.
#[macro_export]
macro_rules! demo_tests_without_row_lock {
    ($store:expr, $scheme:literal) => {
        #[test]
        fn demo_shows_the_race_and_two_safe_strategies() {
            let Some(store) = $store else { return };
            $crate::common::demo_shows_race_and_safety(
                store.as_ref(),
                &["none", "lease", "optimistic"],
            );
        }

        #[test]
        fn row_lock_is_refused_with_64_naming_the_alternatives() {
            let Some(store) = $store else { return };
            let out = $crate::common::run($crate::common::leasehold(store.as_ref()).args([
                "demo",
                "--strategy",
                "lease",
                "--strategy",
                "row-lock",
            ]));
            let err = $crate::common::stderr(&out);
            assert_eq!(out.status.code(), Some(64), "{err}");
            assert_eq!(
                err.trim(),
                concat!(
                    "leasehold: strategy row-lock is not available on ",
                    $scheme,
                    "; choose from: none, lease, optimistic"
                )
            );
            let out_text = $crate::common::stdout(&out);
            assert!(out_text.is_empty(), "no strategy ran: {out_text}");
        }
    };
}

/// The multi-process checks every store must pass, as one `#[test]`
/// each: `$store` is an expression giving `Option<S>` (`None` skips) where
/// `S: AsRef<str>` is the store URL and may clean up when dropped.
#[macro_export]
macro_rules! process_tests {
    ($store:expr) => {
        $crate::process_tests!(@each $store;
            eight_processes_count_to_two_hundred => counter_under_many_processes(dir, 8, 25),
            ten_processes_under_three_permits_run_three_at_a_time => permits_under_many_processes(dir, 10, 3),
            shared_runs_overlap_and_an_exclusive_run_overlaps_none => shared_and_exclusive_runs(dir),
            a_plain_run_excludes_the_shared_runs_of_its_key => plain_run_excludes_shared_runs(dir),
            a_key_of_another_kind_is_refused_with_exit_65 => another_kind_exits_65(),
            a_killed_holder_is_taken_over_within_ttl_plus_one_second => kill9_takeover(dir),
            a_paused_holder_loses_its_lease_and_exits_70 => sigstop_loses_lease(dir),
            the_dashboard_shows_a_run_within_a_second_and_drops_it_on_release => dashboard_follows_a_run(dir),
        );
    };
    // `name => check(args)`: a test that calls `common::check` with the
    // store's URL, then (`dir`) a fresh temporary directory, then `args`.
    (@each $store:expr; $($name:ident => $check:ident($($arg:tt)*)),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let Some(store) = $store else { return };
                $crate::process_tests!(@call store, $check, $($arg)*);
            }
        )*
    };
    (@call $store:ident, $check:ident, dir $(, $arg:expr)*) => {
        let dir = tempfile::tempdir().unwrap();
        $crate::common::$check($store.as_ref(), dir.path() $(, $arg)*)
    };
    (@call $store:ident, $check:ident, $($arg:expr),*) => {
        $crate::common::$check($store.as_ref() $(, $arg)*)
    };
}

/// `GET path` on the dashboard at `addr`: the body of a 200 answer.
fn dashboard_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).expect("the dashboard listens");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
    body.to_owned()
}

/// Whether the dashboard's live leases include `key`.
fn dashboard_lists(addr: &str, key: &str) -> bool {
    let body = dashboard_get(addr, "/api/leases");
    let snapshot: serde_json::Value = serde_json::from_str(&body).expect(&body);
    snapshot["leases"]
        .as_array()
        .expect("a leases array")
        .iter()
        .any(|row| row["key"] == key)
}

/// docs/metrics.md: the dashboard shows a change within a second on every
/// store. `leasehold dashboard` (default poll) follows the store while a
/// `run KEY` takes the key: the lease is listed within a second of the
/// command starting (the grant came before), and gone within a second of
/// the run's exit (its release came before).
pub fn dashboard_follows_a_run(store: &str, dir: &Path) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let mut dashboard = leasehold(store)
        .args(["dashboard", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(dashboard.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_once(" on http://")
        .and_then(|(_, rest)| rest.trim_end().strip_suffix('/'))
        .unwrap_or_else(|| panic!("the dashboard says where it serves: {line:?}"))
        .to_owned();
    let key = unique_key("dashboard");
    let pidfile = dir.join("command.pid");
    let (mut holder, command) = start_holder(store, &key, &pidfile);
    let listed = wait_until(Duration::from_secs(1), || dashboard_lists(&addr, &key));
    // The command ends; `run` releases the key, then exits.
    signal(command, "TERM");
    let exited = holder.wait().unwrap();
    let dropped = wait_until(Duration::from_secs(1), || !dashboard_lists(&addr, &key));
    let _ = dashboard.kill();
    let _ = dashboard.wait();
    assert!(
        listed,
        "the lease of {key} was not listed within 1 s of its command starting"
    );
    assert!(exited.code().is_some(), "run exited on its own: {exited:?}");
    assert!(
        dropped,
        "{key} was still listed 1 s after its run released it"
    );
}

/// `sh -c` text that writes the shell's pid to `pidfile`, then becomes
/// `sleep 30` (same pid).
pub fn pid_then_sleep(pidfile: &Path) -> String {
    format!("echo $$ > {}; exec sleep 30", pidfile.display())
}

/// Starts `run KEY --ttl 30s -- sh -c <pid_then_sleep>` and waits for the
/// command's pid.
pub fn start_holder(store: &str, key: &str, pidfile: &Path) -> (Child, i32) {
    let holder = leasehold(store)
        .args(["run", key, "--ttl", "30s", "--", "sh", "-c"])
        .arg(pid_then_sleep(pidfile))
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || read_pid(pidfile).is_some()),
        "the command did not start"
    );
    (holder, read_pid(pidfile).unwrap())
}

/// A key unique to this test run.
fn unique_key(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// One key is one lock: a key used as a semaphore (`run KEY --permits 2`)
/// refuses a plain `run KEY` and a `run KEY --shared` at once with exit 65
/// (even with a long `--wait`), naming the kind; a key used with `--shared`
/// refuses `--permits`; `status` names each key's kind while it is held.
pub fn another_kind_exits_65(store: &str) {
    let sem = unique_key("sem");
    let out = run(leasehold(store).args(["run", &sem, "--permits", "2", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    for extra in [&[][..], &["--shared"][..]] {
        let started = std::time::Instant::now();
        let out = run(leasehold(store)
            .args(["run", &sem, "--wait", "30s"])
            .args(extra)
            .args(["--", "true"]));
        assert_exit(&out, 65, "is a semaphore;", &format!("{extra:?}"));
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "refused at once"
        );
    }
    let rw = unique_key("rw");
    let out = run(leasehold(store).args(["run", &rw, "--shared", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(leasehold(store).args(["run", &rw, "--permits", "3", "--", "true"]));
    assert_exit(
        &out,
        65,
        "is a reader-writer lock;",
        "--permits on a rw lock",
    );
}

/// One key is one lock: five `run KEY --shared` commands hold KEY together
/// (each records its start and end and sleeps 1 s); a plain `run KEY`
/// started while they hold it overlaps none of them: it is KEY's exclusive
/// side (the writer of the reader-writer lock KEY is), as
/// `locks.acquire(KEY)` in an application.
pub fn plain_run_excludes_shared_runs(store: &str, dir: &Path) {
    let times = dir.join("times.log");
    std::fs::write(&times, "").unwrap();
    let key = unique_key("one");
    let spawn = |flag: Option<&str>, side: &str| {
        let mut cmd = leasehold(store);
        cmd.args(["run", &key, "--wait", "60s", "--ttl", "10s"]);
        cmd.args(flag);
        cmd.args(["--", "sh", "-c", &timed_command(side, &times)]);
        cmd.spawn().unwrap()
    };
    let mut children: Vec<Child> = (0..5).map(|_| spawn(Some("--shared"), "S")).collect();
    assert!(
        wait_until(Duration::from_secs(20), || status(store, &key)["rw"]
            .as_array()
            .is_some_and(|rows| rows.len() == 5)),
        "five shared runs never held KEY together: {}",
        status(store, &key)
    );
    children.push(spawn(None, "X"));
    // The plain run is KEY's exclusive side: the writer of the
    // reader-writer lock KEY became (status speaks of the one key).
    assert!(
        wait_until(Duration::from_secs(20), || {
            let s = status(store, &key);
            s["kind"] == "reader-writer lock"
                && s["rw"]
                    .as_array()
                    .is_some_and(|rows| rows.iter().any(|r| r["side"] == "write"))
        }),
        "the plain run never held KEY as its writer: {}",
        status(store, &key)
    );
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a run failed");
    }
    let rows = timed_runs(&times);
    assert_eq!(rows.len(), 6, "every command ran once: {rows:?}");
    let writer = rows.iter().find(|r| r.side == "X").unwrap();
    for reader in rows.iter().filter(|r| r.side == "S") {
        assert!(
            !reader.overlaps(writer),
            "the plain run overlapped a shared run {reader:?}: {rows:?}"
        );
    }
}

/// When the `run` of [`frozen_run_stops_its_command`] is frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freeze {
    /// Once its command has written (the test sends SIGSTOP).
    WhileRunning,
    /// The moment its command starts: the command's first act is
    /// `kill -STOP $PPID`, before `run` can have done anything after
    /// starting it (a watchdog started after the command, or told its
    /// group only then, would miss it).
    AtStart,
}

/// A `run --ttl 2s KEY` whose command appends "A" lines to a file is frozen
/// with SIGSTOP (the `run` process only: its command and the watchdog go
/// on), at the moment `when` says. A second `run KEY --wait 15s` takes KEY
/// once the lease ends and appends "B"; no "A" may follow the first "B":
/// the frozen run's command was stopped inside its lease, by the watchdog.
pub fn frozen_run_stops_its_command(store: &str, dir: &Path, when: Freeze) {
    let log = dir.join("writes.log");
    std::fs::write(&log, "").unwrap();
    let key = unique_key("frozen");
    let stop_run = match when {
        Freeze::AtStart => "kill -STOP $PPID; ",
        Freeze::WhileRunning => "",
    };
    let writer = |tag: &str| {
        format!(
            "{stop_run}while :; do echo {tag} >> {}; sleep 0.02; done",
            log.display()
        )
    };
    let mut first = leasehold(store)
        .args(["run", &key, "--ttl", "2s", "--", "sh", "-c", &writer("A")])
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || std::fs::read_to_string(&log)
            .unwrap()
            .contains('A')),
        "the first command never wrote"
    );
    let run_pid = nix::unistd::Pid::from_raw(i32::try_from(first.id()).unwrap());
    if when == Freeze::WhileRunning {
        nix::sys::signal::kill(run_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    }
    let second = leasehold(store)
        .args(["run", &key, "--wait", "15s", "--ttl", "2s", "--"])
        .args(["sh", "-c"])
        .arg(format!(
            "echo B >> {l}; sleep 1; echo B >> {l}",
            l = log.display()
        ))
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    // Let the first run go and end (it finds its lease lost: exit 70).
    nix::sys::signal::kill(run_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let _ = first.kill();
    let _ = first.wait();
    assert!(
        second.status.success(),
        "the second run failed: {}",
        String::from_utf8_lossy(&second.stderr)
    );
    let after: usize = text
        .lines()
        .skip_while(|l| *l != "B")
        .filter(|l| *l == "A")
        .count();
    assert!(text.contains('B'), "the second command never wrote: {text}");
    assert_eq!(
        after, 0,
        "the frozen run's command wrote {after} times after the next holder started"
    );
}

/// `leasehold run --fair` processes started one by one on `store` (one
/// that keeps queues, docs/fairness.md) get the key in the order they
/// started, each handed it by the release of the one before.
#[allow(dead_code)]
pub fn fair_processes_get_the_key_in_the_order_they_came(store: &str) {
    let dir = tempfile::tempdir().unwrap();
    let order = dir.path().join("order");
    std::fs::write(&order, "").unwrap();
    let started = dir.path().join("started");
    let holder = leasehold(store)
        .args(["run", "k", "--ttl", "30s", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 4", started.display()))
        .spawn()
        .unwrap();
    while !started.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let waiters: Vec<_> = (0..5)
        .map(|i| {
            let child = leasehold(store)
                .args([
                    "run", "k", "--fair", "--wait", "60s", "--ttl", "30s", "--", "sh", "-c",
                ])
                .arg(format!("echo {i} >> {}; sleep 0.05", order.display()))
                .spawn()
                .unwrap();
            // Long enough for its first attempt to reach the store.
            std::thread::sleep(Duration::from_millis(500));
            child
        })
        .collect();
    for mut child in std::iter::once(holder).chain(waiters) {
        assert!(child.wait().unwrap().success());
    }
    let came: Vec<u32> = std::fs::read_to_string(&order)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(
        came,
        [0, 1, 2, 3, 4],
        "grants out of the order the processes came"
    );
}
