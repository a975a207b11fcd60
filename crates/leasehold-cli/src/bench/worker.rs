//! The contended scenario with OS processes: each worker is a
//! `leasehold bench-worker` process with its own connection.

use std::time::Duration;

use clap::Args;
use leasehold::{AcquireOptions, Locks};
use serde::{Deserialize, Serialize};
use tokio::process::Command;
use tokio::time::Instant;

use super::keys::unique_key;
use super::raw::BenchStore;
use super::scenarios::{throughput, Contended};
use crate::exit::{CliError, EX_SOFTWARE};
use crate::parse_duration;

/// Arguments of the hidden `bench-worker` command.
#[derive(Debug, Args)]
pub struct BenchWorkerArgs {
    #[arg(long)]
    pub key: String,
    #[arg(long, value_parser = parse_duration)]
    pub duration: Duration,
}

/// What one worker process prints.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerResult {
    acquisitions: u64,
    longest_wait_us: u64,
}

pub async fn bench_worker(store: &str, args: BenchWorkerArgs) -> Result<u8, CliError> {
    let locks = Locks::open(store).await?;
    let deadline = Instant::now() + args.duration;
    let mut result = WorkerResult {
        acquisitions: 0,
        longest_wait_us: 0,
    };
    while Instant::now() < deadline {
        let t = Instant::now();
        let opts = AcquireOptions::new().with_wait(deadline.saturating_duration_since(t));
        let guard = match locks.acquire_with(&args.key, &opts).await {
            Ok(g) => g,
            Err(leasehold::Error::Timeout { .. }) => {
                // A worker starved until the end still waited.
                let waited = t.elapsed().as_micros() as u64;
                result.longest_wait_us = result.longest_wait_us.max(waited);
                break;
            }
            Err(e) => return Err(e.into()),
        };
        result.longest_wait_us = result.longest_wait_us.max(t.elapsed().as_micros() as u64);
        guard.release().await?;
        result.acquisitions += 1;
    }
    println!(
        "{}",
        serde_json::to_string(&result).expect("results serialize")
    );
    Ok(0)
}

pub async fn contended_processes(
    _store: &BenchStore,
    url: &str,
    workers: usize,
    duration: Duration,
) -> Result<Contended, CliError> {
    let exe = std::env::current_exe()?;
    let key = unique_key("contended-processes");
    let children: Vec<_> = (0..workers)
        .map(|_| {
            Command::new(&exe)
                // The URL may carry a password: the environment, unlike
                // argv, is readable by this user only.
                .env("LEASEHOLD_STORE", url)
                .args(["bench-worker", "--key", &key])
                .args(["--duration", &format!("{}ms", duration.as_millis())])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut per_worker = Vec::new();
    let mut longest = Duration::ZERO;
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
        per_worker.push(r.acquisitions);
        longest = longest.max(Duration::from_micros(r.longest_wait_us));
    }
    Ok(Contended {
        workers,
        duration_ms: duration.as_millis(),
        leasehold: throughput(per_worker, longest, duration),
        // A raw loop across processes would need a baseline worker per
        // store; the in-process variant carries the ratio.
        raw_loop: None,
        ratio_to_raw: None,
    })
}
