//! The fence survives a PostgreSQL crash: a throw-away cluster is killed
//! with SIGKILL (postmaster and backends) and restarted, and the next grant
//! still gets a larger token.
//!
//! Needs `initdb` and `pg_ctl` (on PATH or under /usr/lib/postgresql/*/bin);
//! skipped with a notice without them. As root, the cluster runs as the
//! `postgres` user through `runuser` (initdb refuses root).
#![cfg(all(feature = "conformance", feature = "postgres"))]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use leasehold::backends::postgres::PostgresBackend;
use leasehold::{Acquire, AcquireRequest, Backend, Key, Lease};
use tokio::time::{sleep, Instant};

/// The directory holding `initdb` and `pg_ctl`, newest version first.
fn find_bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut installed: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dir| dir.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    // Version directories sort numerically by length first ("9.6" < "15").
    installed.sort_by_key(|p| (p.as_os_str().len(), p.clone()));
    installed.reverse();
    on_path
        .into_iter()
        .chain(installed)
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A private cluster in a temp dir; stopped (immediately) and deleted on drop,
/// also when the test fails.
struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    run_as: Option<&'static str>,
}

impl Cluster {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        let program = self.bin.join(program);
        let mut cmd = match self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        cmd.args(args).output().expect("run a PostgreSQL tool")
    }

    fn init(bin: PathBuf) -> Option<Self> {
        let run_as = if is_root() {
            let has_user = Command::new("id")
                .arg("postgres")
                .output()
                .is_ok_and(|o| o.status.success());
            if !has_user || Command::new("runuser").arg("--help").output().is_err() {
                eprintln!("skipping: running as root without a postgres user and runuser");
                return None;
            }
            Some("postgres")
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("leasehold-pg-")
            .tempdir()
            .unwrap();
        if let Some(user) = run_as {
            let status = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown the cluster dir");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cluster = Cluster {
            bin,
            dir,
            port,
            run_as,
        };
        let data = cluster.data();
        let out = cluster.run(
            "initdb",
            &[
                "-D",
                path_str(&data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(cluster)
    }

    fn start(&self) -> Output {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''",
            self.port
        );
        let log = self.dir.path().join("log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data()),
                "-l",
                path_str(&log),
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "start",
            ],
        )
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// SIGKILLs the postmaster and every process it started: a crash, as
    /// far as PostgreSQL can tell (the OS keeps what was written).
    fn crash(&self) -> Vec<u32> {
        let pid_file = std::fs::read_to_string(self.data().join("postmaster.pid")).unwrap();
        let postmaster: u32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
        let children = children_of(postmaster);
        let kill = |pid: u32| {
            Command::new("kill")
                .arg("-9")
                .arg(pid.to_string())
                .stderr(std::process::Stdio::null())
                .status()
        };
        assert!(kill(postmaster).unwrap().success(), "kill -9 {postmaster}");
        // Best effort: a backend may have exited on its own meanwhile, and
        // any the list missed exits when it sees the postmaster gone.
        for &child in &children {
            let _ = kill(child);
        }
        let mut pids = children;
        pids.insert(0, postmaster);
        pids
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data()),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

/// Processes whose parent is `parent`, from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat_field(*pid, 1).as_deref() == Some(&parent.to_string()))
        .collect()
}

/// Field `n` after the `(comm)` of /proc/PID/stat: 0 = state, 1 = ppid.
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(n).map(str::to_owned)
}

fn is_gone(pid: u32) -> bool {
    matches!(stat_field(pid, 0).as_deref(), None | Some("Z") | Some("X"))
}

async fn grant(backend: &PostgresBackend, key: &str) -> Lease {
    let req =
        AcquireRequest::new(Key::new(key).unwrap(), Duration::from_secs(60), "crash").unwrap();
    match backend.try_acquire(&req).await.expect("store answers") {
        Acquire::Granted(lease) => lease,
        Acquire::Busy(b) => panic!("{key} is held: {b:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_survives_a_postgres_crash() {
    let Some(bin) = find_bin_dir() else {
        eprintln!("skipping: initdb/pg_ctl not found on PATH or under /usr/lib/postgresql");
        return;
    };
    let Some(cluster) = Cluster::init(bin) else {
        return;
    };
    let out = cluster.start();
    assert!(
        out.status.success(),
        "pg_ctl start: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let backend = PostgresBackend::connect(&cluster.url()).await.unwrap();
    let released = grant(&backend, "released-before-crash").await;
    backend.release(&released).await.unwrap();
    let held = grant(&backend, "held-at-crash").await;
    drop(backend);

    let pids = cluster.crash();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pids.iter().all(|p| is_gone(*p)) {
        assert!(Instant::now() < deadline, "killed processes did not exit");
        sleep(Duration::from_millis(50)).await;
    }
    // The old shared memory may take a moment to be let go.
    let mut attempt = 0;
    loop {
        let out = cluster.start();
        if out.status.success() {
            break;
        }
        attempt += 1;
        assert!(
            attempt < 10,
            "restart: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        sleep(Duration::from_millis(500)).await;
    }

    let backend = PostgresBackend::connect(&cluster.url()).await.unwrap();
    let after = grant(&backend, "released-before-crash").await;
    assert!(
        after.token() > released.token(),
        "fence went backwards across the crash: {} then {}",
        released.token(),
        after.token()
    );
    let info = backend
        .inspect(held.key())
        .await
        .unwrap()
        .expect("a lease committed before the crash is still held");
    assert_eq!(info.token, held.token());
    assert!(backend.force_release(held.key()).await.unwrap());
    let next = grant(&backend, "held-at-crash").await;
    assert!(next.token() > held.token() + 1);
}
