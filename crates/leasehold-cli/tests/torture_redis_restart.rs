//! `leasehold torture --faults restart` on a private `redis-server` that the
//! restart command kills with SIGKILL and starts again: with AOF
//! (`appendfsync always`) the fence survives and the run passes; without
//! persistence every live lease is lost at a restart, which the checker
//! must report (two holders at once), while the fences, gone with
//! everything else, start again at the server's clock: no token repeats
//! or goes backwards (docs/storage.md).

mod torture_common;

use std::path::PathBuf;
use std::process::Command;

use torture_common::*;

/// A daemonized `redis-server` on a free port, killed when dropped.
struct Daemon {
    port: u16,
    dir: tempfile::TempDir,
    args: String,
}

impl Daemon {
    /// `None` (skip) if `redis-server` is not installed, unless servers are
    /// required.
    fn start(persistence: &str) -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            if std::env::var("LEASEHOLD_REQUIRE_SERVERS").as_deref() == Ok("1") {
                panic!("redis-server is not installed and LEASEHOLD_REQUIRE_SERVERS=1");
            }
            eprintln!("skipping: redis-server is not installed");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let args = format!(
            "--port {port} --bind 127.0.0.1 --daemonize yes --save '' {persistence} \
             --dir {d} --pidfile {d}/redis.pid --logfile {d}/redis.log",
            d = dir.path().display()
        );
        let daemon = Daemon { port, dir, args };
        let started = Command::new("sh")
            .args(["-c", &daemon.start_cmd()])
            .status()
            .unwrap();
        assert!(started.success(), "redis-server did not start");
        Some(daemon)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn pidfile(&self) -> PathBuf {
        self.dir.path().join("redis.pid")
    }

    /// Starts the server and waits until it answers (AOF loaded).
    fn start_cmd(&self) -> String {
        format!(
            "redis-server {}; for i in $(seq 100); do \
             [ \"$(redis-cli -p {} ping 2>/dev/null)\" = PONG ] && exit 0; sleep 0.05; done; exit 1",
            self.args, self.port
        )
    }

    /// A crash, not a clean shutdown: SIGKILL, then start again.
    fn restart_cmd(&self) -> String {
        format!(
            "kill -9 $(cat {}); sleep 0.2; {}",
            self.pidfile().display(),
            self.start_cmd()
        )
    }

    /// `run` (a torture helper) on this server with `args`, then
    /// `--faults FAULTS` with this server's crash-restart as the restart
    /// command.
    fn run_with_restarts(&self, run: fn(&str, &[&str]) -> Run, args: &[&str], faults: &str) -> Run {
        let restart = self.restart_cmd();
        let mut all = args.to_vec();
        all.extend(["--faults", faults, "--restart-cmd", &restart]);
        run(&self.url(), &all)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.pidfile()) {
            let _ = Command::new("kill").args(["-9", pid.trim()]).status();
        }
    }
}

#[test]
fn with_aof_the_fence_survives_crash_restarts() {
    let Some(redis) = Daemon::start("--appendonly yes --appendfsync always") else {
        return;
    };
    let run = redis.run_with_restarts(fenced_run_passes_and_faults_hit, &[], "kill,pause,restart");
    assert!(run.n("/faults/restart/hit") >= 1, "{}", run.output);
}

#[test]
fn without_persistence_a_restart_loses_the_leases_but_not_the_fence_order() {
    let Some(redis) = Daemon::start("--appendonly no") else {
        return;
    };
    // The restart is aimed at a hold living on renewals (held half a lease
    // already) and takes about 0.3 s (SIGKILL, 0.2 s, start, ping): with a
    // 2 s ttl the holder still believes in its lease for over a second
    // after the server is back, when a waiting worker takes the key. With
    // 500 ms the holder's deadline could pass first, and on a loaded
    // machine no overlap showed (stop 49's CI).
    // Whether a waiter takes the key inside the old holder's belief after
    // the restart depends on timing: a run whose restart hit but showed no
    // overlap (exit 0, as one CI run under load did) demonstrated nothing
    // and is run again, up to three runs. A run that shows the overlap must
    // still keep every token in order.
    let mut run =
        redis.run_with_restarts(torture, &["--duration", "10s", "--ttl", "2s"], "restart");
    for _ in 1..3 {
        if run.code != 0 {
            break;
        }
        eprintln!("no overlap after the restart this run; running again");
        run.remove_kept_logs();
        run = redis.run_with_restarts(torture, &["--duration", "10s", "--ttl", "2s"], "restart");
    }
    assert_eq!(run.code, 1, "{}", run.output);
    assert!(run.n("/faults/restart/hit") >= 1, "{}", run.output);
    // The lost leases: a new holder while the old one still held.
    assert!(
        run.n("/holders_at_once/over_limit") + run.n("/overlapping_beliefs") > 0,
        "{}",
        run.output
    );
    // The fences came back at the clock, above every token handed out.
    assert_eq!(run.n("/token_regressions"), 0, "{}", run.output);
    assert_eq!(run.n("/token_duplicates"), 0, "{}", run.output);
    assert_eq!(run.n("/stale_writes_accepted"), 0, "{}", run.output);
    run.remove_kept_logs();
}
