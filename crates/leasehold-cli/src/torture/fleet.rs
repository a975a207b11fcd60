//! The worker processes: started as `leasehold torture-worker` from our own
//! executable (as the demo does), signalled, killed and respawned by the
//! nemesis, and collected at the end.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::primitive::Lock;
use super::worker_store::TestFault;
use crate::exit::CliError;

/// Everything a worker is started with except its identity (the store URL
/// through its environment, the rest on its command line).
pub struct WorkerConfig {
    pub store: String,
    /// Each worker's own URL (`--pin-hosts`), by id; empty: `store` for all.
    pub pinned: Vec<String>,
    pub keys: Vec<String>,
    pub ttl: Duration,
    pub wait: Duration,
    pub resource: String,
    pub lock: Lock,
    pub no_fencing: bool,
    /// A planted store fault, for the harness's own tests.
    pub test_fault: Option<TestFault>,
    pub stop_at: u64,
    pub seed: u64,
    pub dir: PathBuf,
}

struct Slot {
    incarnation: u32,
    child: Child,
    pid: u32,
}

pub struct Fleet {
    config: WorkerConfig,
    exe: PathBuf,
    slots: Vec<Slot>,
    /// The current worker pids, for the interrupt handler.
    pids: Arc<Mutex<Vec<u32>>>,
}

impl Fleet {
    pub fn start(config: WorkerConfig, workers: u32) -> Result<Self, CliError> {
        let mut fleet = Fleet {
            config,
            exe: std::env::current_exe()?,
            slots: Vec::new(),
            pids: Arc::default(),
        };
        for id in 0..workers {
            let slot = fleet.spawn(id, 0)?;
            fleet.slots.push(slot);
        }
        fleet.publish_pids();
        Ok(fleet)
    }

    fn publish_pids(&self) {
        *self.pids.lock().unwrap_or_else(|p| p.into_inner()) =
            self.slots.iter().map(|s| s.pid).collect();
    }

    /// Kills every worker, stopped ones included, when the harness is
    /// interrupted (a worker left in SIGSTOP would otherwise stay forever).
    pub fn kill_all_on_interrupt(&self, dir: PathBuf) {
        let pids = self.pids.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                for pid in pids.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
                }
                let _ = std::fs::remove_dir_all(dir);
                std::process::exit(i32::from(crate::exit::EX_INTERRUPTED));
            }
        });
    }

    fn spawn(&self, id: u32, incarnation: u32) -> Result<Slot, CliError> {
        let c = &self.config;
        let name = format!("worker-{id}-{incarnation}");
        let stderr = std::fs::File::create(c.dir.join(format!("{name}.log")))?;
        // Each incarnation gets its own random stream, reproducible from the seed.
        let seed = c.seed
            ^ (u64::from(id) << 32 | u64::from(incarnation)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let child = Command::new(&self.exe)
            // The URL may carry a password: the environment, unlike argv,
            // is readable by this user only (/proc/PID/environ is 0400).
            .env("LEASEHOLD_STORE", self.store_of(id))
            .arg("torture-worker")
            .args(["--id", &id.to_string(), "--keys", &c.keys.join(",")])
            .args(["--ttl", &format!("{}ms", c.ttl.as_millis())])
            .args(["--wait", &format!("{}ms", c.wait.as_millis())])
            .args(["--resource", &c.resource])
            .args(["--primitive", c.lock.primitive.name()])
            .args(["--permits", &c.lock.permits.to_string()])
            .args(["--stop-at", &c.stop_at.to_string()])
            .args(["--seed", &seed.to_string()])
            .arg("--history")
            .arg(c.dir.join(format!("{name}.jsonl")))
            .args(c.no_fencing.then_some("--no-fencing"))
            .args(c.test_fault.map(|f| format!("--test-fault={}", f.name())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().unwrap_or(0);
        Ok(Slot {
            incarnation,
            child,
            pid,
        })
    }

    /// The store URL worker `id` is given.
    fn store_of(&self, id: u32) -> &str {
        let c = &self.config;
        c.pinned.get(id as usize).unwrap_or(&c.store)
    }

    /// The hosts worker `id` talks to, comma-separated.
    pub fn hosts(&self, id: u32) -> String {
        super::stores::hosts_of(self.store_of(id))
    }

    /// The worker whose current process is `pid`.
    pub fn by_pid(&self, pid: u32) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| s.pid == pid)
            .map(|i| i as u32)
    }

    pub fn pid(&self, id: u32) -> u32 {
        self.slots[id as usize].pid
    }

    pub fn signal(&self, id: u32, signal: Signal) {
        // The process may have exited already; nothing to do then.
        let _ = kill(Pid::from_raw(self.pid(id) as i32), signal);
    }

    /// SIGKILL, reap, and start the next incarnation in the same slot.
    pub async fn kill_and_respawn(&mut self, id: u32) -> Result<(), CliError> {
        let slot = &mut self.slots[id as usize];
        let _ = slot.child.start_kill();
        let _ = slot.child.wait().await;
        let next = slot.incarnation + 1;
        self.slots[id as usize] = self.spawn(id, next)?;
        self.publish_pids();
        Ok(())
    }

    /// Waits for every worker to finish its last round; kills those still
    /// running after `limit`. Returns a line per worker that did not end
    /// cleanly.
    pub async fn finish(&mut self, limit: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut problems = Vec::new();
        for (id, slot) in self.slots.iter_mut().enumerate() {
            // A worker the nemesis left stopped must run to finish.
            let _ = kill(Pid::from_raw(slot.pid as i32), Signal::SIGCONT);
            match tokio::time::timeout_at(deadline, slot.child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(status) => problems.push(format!(
                    "worker {id} (pid {}) ended with {status:?}; see worker-{id}-{}.log",
                    slot.pid, slot.incarnation
                )),
                Err(_) => {
                    let _ = slot.child.start_kill();
                    let _ = slot.child.wait().await;
                    problems.push(format!(
                        "worker {id} (pid {}) did not finish within {limit:?} and was killed",
                        slot.pid
                    ));
                }
            }
        }
        problems
    }
}

/// Every worker history file in `dir`.
pub fn history_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    Ok(files)
}
