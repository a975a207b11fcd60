//! `leasehold run`'s promises about its command's life, on SQLite: it is
//! stopped inside the lease when renewal fails, it dies with `run`, signals
//! reach it, a terminal is handed to it, and signals that end a wait give
//! the shell's exit codes.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn kill_after_must_be_at_most_half_the_ttl_and_is_checked_before_any_io() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    for (ttl, grace) in [("2s", "2s"), ("2s", "3s"), ("2s", "1500ms")] {
        let out = run(leasehold(&store).args([
            "run",
            "k",
            "--ttl",
            ttl,
            "--kill-after",
            grace,
            "--",
            "true",
        ]));
        assert_exit(
            &out,
            64,
            "invalid --kill-after: must be at most half the ttl",
            &format!("{ttl}/{grace}"),
        );
    }
    assert!(
        !dir.path().join("locks.db").exists(),
        "rejected before the store was opened"
    );
    // The longest grace allowed does not stop a healthy command that
    // outlives several renewals: each renewal cancels the schedule.
    let out = run(leasehold(&store).args([
        "run",
        "k",
        "--ttl",
        "2s",
        "--kill-after",
        "1s",
        "--",
        "sh",
        "-c",
        "sleep 3; echo finished",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "finished");
}

#[test]
fn a_command_is_stopped_inside_its_lease_when_renewal_fails() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let pidfile = dir.path().join("child.pid");
    let termfile = dir.path().join("got-term");
    // A command that handles SIGTERM by carrying on: only SIGKILL ends it.
    let script = format!(
        "trap 'echo term >> {t}' TERM; echo $$ > {p}; while :; do sleep 0.05; done",
        t = termfile.display(),
        p = pidfile.display()
    );
    let ttl = Duration::from_secs(6);
    let mut holder = leasehold(&store)
        .args([
            "run",
            "k",
            "--ttl",
            "6s",
            "--kill-after",
            "3s",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || read_pid(&pidfile).is_some()));
    let child = read_pid(&pidfile).unwrap();

    // From now on every renewal fails: another process holds SQLite's
    // write lock (BEGIN EXCLUSIVE) on the database.
    let mut blocker = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3, sys, time\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n\
             c.execute('BEGIN EXCLUSIVE')\n\
             print('locked', flush=True)\n\
             time.sleep(60)\n",
        )
        .arg(dir.path().join("locks.db"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    BufReader::new(blocker.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    let blocked_at = Instant::now();

    // The last renewal that succeeded was sent before `blocked_at`, so the
    // lease's valid_until is at most blocked_at + 0.99 ttl: the command must
    // be dead by then (plus scheduling slack). Before the fix it got SIGTERM
    // only at valid_until and SIGKILL 3 s later.
    let deadline = blocked_at + ttl + Duration::from_millis(500);
    while !is_dead(child) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let dead_in_time = is_dead(child);
    let dead_after = blocked_at.elapsed();
    let code = holder.wait().unwrap().code();
    let _ = blocker.kill();
    let _ = blocker.wait();
    assert!(
        dead_in_time,
        "the command outlived its lease: alive {dead_after:?} after renewals stopped (ttl {ttl:?})"
    );
    assert_eq!(code, Some(70), "run exits 70 after a lost lease");
    let terms = std::fs::read_to_string(&termfile).unwrap_or_default();
    assert!(
        terms.contains("term"),
        "the command got SIGTERM before SIGKILL"
    );
}

#[test]
fn the_command_dies_with_run_when_run_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let (holder, child) = start_holder(&store, "k", &dir.path().join("child.pid"));
    kill_run_and_expect_dead(
        holder,
        child,
        "the command outlived `run` (its 30 s lease would let a second holder start beside it)",
    );
}

#[test]
fn what_the_command_started_dies_too_when_run_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let pidfile = dir.path().join("grandchild.pid");
    // The shell stays in between: `sleep` is the command's child, which the
    // parent-death signal (sent to the command only) does not reach.
    let holder = leasehold(&store)
        .args(["run", "k", "--ttl", "30s", "--", "sh", "-c"])
        .arg(format!("sleep 30 & echo $! > {}; wait", pidfile.display()))
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || read_pid(&pidfile).is_some()));
    let grandchild = read_pid(&pidfile).unwrap();
    kill_run_and_expect_dead(
        holder,
        grandchild,
        "a process the command started outlived `run`",
    );
}

#[test]
fn sighup_and_sigquit_reach_the_command_and_run_exits_with_it() {
    for (sig, code) in [("HUP", 129), ("QUIT", 131)] {
        let dir = tempfile::tempdir().unwrap();
        let store = sqlite_store(dir.path());
        let (mut holder, child) = start_holder(&store, "k", &dir.path().join("child.pid"));
        signal(holder.id() as i32, sig);
        let status = holder.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(code),
            "run passes on the command's death by SIG{sig}: {status:?}"
        );
        assert!(wait_until(Duration::from_secs(3), || is_dead(child)));
        assert!(!status_held(&store), "released after the command ended");
    }
}

fn status_held(store: &str) -> bool {
    status(store, "k")["held"] == true
}

#[test]
fn a_signal_while_waiting_exits_128_plus_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let (mut holder, _child) = start_holder(&store, "k", &dir.path().join("child.pid"));
    for (sig, code) in [("TERM", 143), ("INT", 130), ("HUP", 129)] {
        let waiter = leasehold(&store)
            .args(["run", "k", "--wait", "60s", "--", "true"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A signal before run catches it would kill run outright.
        let pid = waiter.id() as i32;
        assert!(wait_until(Duration::from_secs(20), || catches(
            pid,
            code - 128
        )));
        std::thread::sleep(Duration::from_millis(300)); // into the wait, usually
        signal(waiter.id() as i32, sig);
        let out = waiter.wait_with_output().unwrap();
        let signal_name = format!("SIG{sig}");
        assert_exit(&out, code, &signal_name, &signal_name);
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// SIGKILLs `run` (so it cannot forward anything) and expects process
/// `pid` to die within 3 s anyway; `outlived` says what it means if not.
fn kill_run_and_expect_dead(mut run: Child, pid: i32, outlived: &str) {
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(3), || is_dead(pid)),
        "{outlived}"
    );
}

/// Whether process `pid` has a handler for signal number `signo`
/// (`SigCgt` in /proc/PID/status).
fn catches(pid: i32, signo: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signo - 1)) != 0)
}

/// Drives `leasehold run` inside a shell on a new pseudo-terminal (python3's
/// pty module), typing a line for the command and then one for the shell.
const PTY_DRIVER: &str = r#"
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
out = b""
def read_until(needle, limit):
    global out
    end = time.time() + limit
    while needle not in out and time.time() < end:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    return needle in out
ok = read_until(b"ready", 20)
os.write(fd, b"hello\n")
ok = ok and read_until(b"got hello", 20)
os.write(fd, b"again\n")
ok = ok and read_until(b"shell has again", 20)
sys.stdout.write(out.decode(errors="replace"))
if not ok:
    os.kill(pid, 9)
    sys.exit(3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"#;

#[test]
fn an_interactive_command_gets_the_terminal_and_gives_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    // The outer shell (the terminal's foreground group) starts run; the
    // command reads a line from the terminal; then the shell reads one,
    // which works only if run handed the terminal back.
    let shell = format!(
        "'{bin}' --store '{store}' run k -- sh -c 'echo ready; read x; echo got $x' || exit 9; \
         read y; echo shell has $y",
        bin = env!("CARGO_BIN_EXE_leasehold"),
    );
    let out = Command::new("python3")
        .args(["-c", PTY_DRIVER, "sh", "-c", &shell])
        .env_remove("LEASEHOLD_STORE")
        .output()
        .expect("python3 runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "terminal session: {} {}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("got hello"), "{}", stdout(&out));
    assert!(stdout(&out).contains("shell has again"), "{}", stdout(&out));
}

#[test]
fn run_help_states_the_lifecycle_promises_and_their_limits() {
    let out = run(leasehold("memory://").args(["run", "--help"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let help = stdout(&out)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for promise in [
        "started only while the lease is valid",
        "the command's group gets the terminal",
        "SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to run are forwarded",
        "parent-death signal",
        "sends SIGKILL to the command's whole group",
        "valid_until minus --kill-after, the group gets SIGTERM",
        "it gets SIGKILL; run exits 70 once the command is gone",
        "A renewal that succeeds before the SIGTERM cancels the schedule",
        "Not promised: processes that leave the command's process group",
        "143",
        "71 internal failure",
        "at most half the ttl [default: ttl/4]",
    ] {
        assert!(
            help.contains(promise),
            "run --help lacks {promise:?}: {help}"
        );
    }
}
