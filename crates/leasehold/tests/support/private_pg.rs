//! A private PostgreSQL cluster for tests that need a server of their own
//! (a crash, special settings): `initdb` in a temp dir, a free port.
//!
//! Needs `initdb` and `pg_ctl` (on PATH or under /usr/lib/postgresql/*/bin);
//! callers skip with a notice without them. As root, the cluster runs as
//! the `postgres` user through `runuser` (initdb refuses root).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The directory holding `initdb` and `pg_ctl`, newest version first.
pub fn find_bin_dir() -> Option<PathBuf> {
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
pub struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    run_as: Option<&'static str>,
}

impl Cluster {
    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn run(&self, program: &str, args: &[&str]) -> Output {
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

    pub fn init(bin: PathBuf) -> Option<Self> {
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
        expect_success("initdb", &out);
        Some(cluster)
    }

    pub fn start(&self) -> Output {
        self.start_with(&[])
    }

    /// Starts the server with extra `-c name=value` settings.
    pub fn start_with(&self, settings: &[&str]) -> Output {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''",
            self.port
        );
        for setting in settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
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

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// SIGKILLs the postmaster and every process it started: a crash, as
    /// far as PostgreSQL can tell (the OS keeps what was written).
    pub fn crash(&self) -> Vec<u32> {
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

pub fn path_str(p: &Path) -> &str {
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

pub fn is_gone(pid: u32) -> bool {
    matches!(stat_field(pid, 0).as_deref(), None | Some("Z") | Some("X"))
}

impl Cluster {
    /// A started cluster with extra `-c name=value` settings, or `None`
    /// (with a notice) where PostgreSQL's binaries are missing.
    pub fn start_private(settings: &[&str]) -> Option<Self> {
        let Some(bin) = find_bin_dir() else {
            eprintln!("skipping: initdb/pg_ctl not found on PATH or under /usr/lib/postgresql");
            return None;
        };
        let cluster = Cluster::init(bin)?;
        let out = cluster.start_with(settings);
        expect_success("pg_ctl start", &out);
        Some(cluster)
    }

    /// The server's log (pg_ctl -l).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// Fails the test with `what`'s stderr unless it succeeded.
fn expect_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
