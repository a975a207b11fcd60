//! The contended scenario with OS processes: each worker is a
//! `leasehold bench-worker` process with its own connection, running one
//! or more waiters (tasks) on one `Locks`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use leasehold::{AcquireOptions, Locks};
use serde::{Deserialize, Serialize};
use tokio::process::Command;
use tokio::time::Instant;

use super::keys::unique_key;
use super::order::{wait_in_turn, Counted, WaiterRun};
use super::scenarios::{summarize, Contended, Throughput};
use crate::exit::{CliError, EX_SOFTWARE};
use crate::parse_duration;

/// How long after spawning them the worker processes start their timed
/// run together (per 8 processes).
const START_MARGIN: Duration = Duration::from_secs(2);

/// Milliseconds since the Unix epoch, now.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The tokio instant of `ms` since the Unix epoch (now if that has passed;
/// a worker that got there late says by how much).
fn instant_at(ms: u64) -> Instant {
    let now = unix_ms();
    if now > ms {
        eprintln!(
            "leasehold bench-worker: ready {} ms after the common start",
            now - ms
        );
    }
    Instant::now() + Duration::from_millis(ms.saturating_sub(now))
}

/// Arguments of the hidden `bench-worker` command.
#[derive(Debug, Args)]
pub struct BenchWorkerArgs {
    #[arg(long)]
    pub key: String,
    #[arg(long, value_parser = parse_duration)]
    pub duration: Duration,
    /// Waiters (tasks) in this process.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub tasks: u32,
    /// Wait with `with_fair(true)`: queued at the store.
    #[arg(long)]
    pub fair: bool,
    /// When the timed run starts, in ms since the Unix epoch: every worker
    /// process starts at the same moment, after its warm-up.
    #[arg(long)]
    pub start_at_ms: Option<u64>,
}

/// What one worker process prints.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerResult {
    runs: Vec<WaiterRun>,
    /// What its `Locks` counted (`Locks::stats`).
    counted: Counted,
}

pub async fn bench_worker(store: &str, args: BenchWorkerArgs) -> Result<u8, CliError> {
    let locks = Locks::open(store).await?;
    let fair = args.fair;
    // A process's first acquisition sets up what the later ones reuse
    // (connections, the store's notification feed): timed, it would count
    // that setup as a wait in line. One untimed round first, then every
    // process starts together, so that each waits behind all the others
    // from its first timed call on.
    let warm_up = AcquireOptions::new()
        .with_wait(args.duration)
        .with_fair(fair);
    locks
        .acquire_with(&args.key, &warm_up)
        .await?
        .release()
        .await?;
    let start = match args.start_at_ms {
        Some(ms) => instant_at(ms),
        None => Instant::now(),
    };
    tokio::time::sleep_until(start).await;
    let before = locks.stats();
    let deadline = start + args.duration;
    let tasks: Vec<_> = (0..args.tasks)
        .map(|_| {
            let (locks, key) = (locks.clone(), args.key.clone());
            tokio::spawn(async move { wait_in_turn(&locks, &key, deadline, fair).await })
        })
        .collect();
    let mut runs = Vec::with_capacity(tasks.len());
    for t in tasks {
        runs.push(
            t.await
                .map_err(|e| CliError::new(EX_SOFTWARE, e.to_string()))??,
        );
    }
    let result = WorkerResult {
        runs,
        counted: Counted::between(&before, &locks.stats()),
    };
    println!(
        "{}",
        serde_json::to_string(&result).expect("results serialize")
    );
    locks.close().await;
    Ok(0)
}

/// `processes` worker processes of `tasks` waiters each on one key, racing
/// (and queued too, where the store `queues`).
pub async fn contended_processes(
    url: &str,
    (processes, tasks): (usize, usize),
    duration: Duration,
    queues: bool,
) -> Result<Contended, CliError> {
    let leasehold = run_processes(url, (processes, tasks), duration, false).await?;
    let fair = match queues {
        true => Some(run_processes(url, (processes, tasks), duration, true).await?),
        false => None,
    };
    Ok(Contended {
        workers: processes * tasks,
        processes: Some(processes),
        duration_ms: duration.as_millis(),
        leasehold,
        fair,
        // A raw loop across processes would need a baseline worker per
        // store; the in-process variant carries the ratio.
        raw_loop: None,
        ratio_to_raw: None,
    })
}

async fn run_processes(
    url: &str,
    (processes, tasks): (usize, usize),
    duration: Duration,
    fair: bool,
) -> Result<Throughput, CliError> {
    let exe = std::env::current_exe()?;
    let key = unique_key("contended-processes");
    // Time for every process to start, connect and warm up before the
    // common start (a late one starts late, and says so).
    let start_at_ms = unix_ms() + START_MARGIN.as_millis() as u64 * processes.div_ceil(8) as u64;
    let children: Vec<_> = (0..processes)
        .map(|_| {
            let mut command = Command::new(&exe);
            command
                // The URL may carry a password: the environment, unlike
                // argv, is readable by this user only.
                .env("LEASEHOLD_STORE", url)
                .args(["bench-worker", "--key", &key])
                .args(["--duration", &format!("{}ms", duration.as_millis())])
                .args(["--tasks", &tasks.to_string()])
                .args(["--start-at-ms", &start_at_ms.to_string()])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true);
            if fair {
                command.arg("--fair");
            }
            command.spawn()
        })
        .collect::<Result<_, _>>()?;
    let (mut runs, mut counted) = (Vec::new(), Counted::default());
    for child in children {
        let out = child.wait_with_output().await?;
        if !out.status.success() {
            return Err(CliError::new(
                EX_SOFTWARE,
                format!("a bench worker failed ({})", out.status),
            ));
        }
        let r: WorkerResult = serde_json::from_slice(&out.stdout)
            .map_err(|e| CliError::new(EX_SOFTWARE, format!("bad bench worker output: {e}")))?;
        runs.extend(r.runs);
        counted = counted.add(r.counted);
    }
    Ok(summarize(runs, duration, counted))
}
