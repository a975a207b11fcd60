//! One demo worker process: buys one item per order with its strategy and
//! reports each order as a JSON line on stdout.

use std::io::Write;
use std::time::{Duration, Instant};

use clap::Args;
use leasehold::occ::{retry_optimistic, Attempt, RetryError, RetryPolicy};
use leasehold::{AcquireOptions, Locks};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::inventory::{self, Check, Inventory};
use super::Strategy;
use crate::exit::CliError;
use crate::parse_duration;

/// Arguments of the hidden `demo-worker` command.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long, value_enum)]
    pub strategy: Strategy,
    #[arg(long)]
    pub product: String,
    #[arg(long)]
    pub orders: u32,
    #[arg(long, value_parser = parse_duration)]
    pub pay: Duration,
    /// Export the library's metrics: after each order, a `{"metrics": ...}`
    /// line with this process's Prometheus exposition (`demo --metrics-addr`)
    #[arg(long)]
    pub metrics: bool,
}

/// A worker's metrics so far, in the Prometheus text format.
#[derive(Debug, Serialize, Deserialize)]
pub struct MetricsReport {
    pub metrics: String,
}

/// How one order ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// An item was sold and acknowledged.
    Sold,
    /// The stock was 0.
    SoldOut,
    /// The fenced write was refused: a newer lease holder exists.
    Rejected,
    /// Gave up (lock wait or optimistic retries exhausted).
    Failed,
}

/// One JSON line per order.
#[derive(Debug, Serialize, Deserialize)]
pub struct OrderReport {
    pub outcome: Outcome,
    pub retries: u32,
    pub latency_us: u64,
}

pub async fn worker(store: &str, args: WorkerArgs) -> Result<u8, CliError> {
    inventory::strategies(store, &[args.strategy])?;
    let inventory = inventory::open(store).await?;
    let locks = match args.strategy {
        Strategy::Lease => Some(Locks::open(store).await?),
        _ => None,
    };
    let exporter = if args.metrics {
        let recorder = crate::dashboard::prom::recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder)
            .map_err(|e| CliError::new(crate::EX_INTERNAL, e.to_string()))?;
        leasehold::metrics::describe();
        Some(handle)
    } else {
        None
    };
    let mut stdout = std::io::stdout().lock();
    for _ in 0..args.orders {
        let started = Instant::now();
        let pay = jittered(args.pay);
        let (outcome, retries) = match args.strategy {
            Strategy::None => (buy_unprotected(&*inventory, &args.product, pay).await?, 0),
            Strategy::Lease => {
                let locks = locks.as_ref().expect("opened for the lease strategy");
                (
                    buy_with_lease(locks, &*inventory, &args.product, pay).await?,
                    0,
                )
            }
            Strategy::RowLock => {
                let sold = inventory.buy_row_locked(&args.product, pay).await?;
                (
                    if sold {
                        Outcome::Sold
                    } else {
                        Outcome::SoldOut
                    },
                    0,
                )
            }
            Strategy::Optimistic => buy_optimistic(&*inventory, &args.product, pay).await?,
        };
        let report = OrderReport {
            outcome,
            retries,
            latency_us: started.elapsed().as_micros() as u64,
        };
        let line = serde_json::to_string(&report).expect("reports serialize");
        writeln!(stdout, "{line}")?;
        if let Some(exporter) = &exporter {
            let metrics = MetricsReport {
                metrics: exporter.render(),
            };
            let line = serde_json::to_string(&metrics).expect("reports serialize");
            writeln!(stdout, "{line}")?;
        }
        stdout.flush()?;
    }
    Ok(0)
}

/// The payment takes between half and one and a half times `pay`.
fn jittered(pay: Duration) -> Duration {
    pay.mul_f64(rand::thread_rng().gen_range(0.5..1.5))
}

/// Read, pay, write: what the hand-written code does, and why it oversells.
async fn buy_unprotected(
    inv: &dyn Inventory,
    product: &str,
    pay: Duration,
) -> Result<Outcome, CliError> {
    let seen = inv.read(product).await?;
    if seen.stock <= 0 {
        return Ok(Outcome::SoldOut);
    }
    tokio::time::sleep(pay).await;
    inv.write(product, seen.stock - 1, Check::None).await?;
    Ok(Outcome::Sold)
}

/// The same steps under a lease, with the write fenced by the lease's token.
async fn buy_with_lease(
    locks: &Locks,
    inv: &dyn Inventory,
    product: &str,
    pay: Duration,
) -> Result<Outcome, CliError> {
    let options = AcquireOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(60));
    let guard = match locks
        .acquire_with(&format!("demo:{product}"), &options)
        .await
    {
        Ok(guard) => guard,
        Err(leasehold::Error::Timeout { .. }) => return Ok(Outcome::Failed),
        Err(e) => return Err(e.into()),
    };
    let seen = inv.read(product).await?;
    let outcome = if seen.stock <= 0 {
        Outcome::SoldOut
    } else {
        tokio::time::sleep(pay).await;
        if inv
            .write(product, seen.stock - 1, Check::Fence(guard.token()))
            .await?
        {
            Outcome::Sold
        } else {
            Outcome::Rejected
        }
    };
    guard.release().await?;
    Ok(outcome)
}

/// Read the version, pay, compare-and-swap; retry on conflict.
async fn buy_optimistic(
    inv: &dyn Inventory,
    product: &str,
    pay: Duration,
) -> Result<(Outcome, u32), CliError> {
    let policy = RetryPolicy::new(100, Duration::from_millis(1), Duration::from_millis(50))
        .expect("a valid policy");
    let result = retry_optimistic(&policy, |_| async move {
        let seen = inv.read(product).await?;
        if seen.stock <= 0 {
            return Ok(Attempt::Committed(Outcome::SoldOut));
        }
        tokio::time::sleep(pay).await;
        Ok::<_, CliError>(
            if inv
                .write(product, seen.stock - 1, Check::Version(seen.version))
                .await?
            {
                Attempt::Committed(Outcome::Sold)
            } else {
                Attempt::Conflict
            },
        )
    })
    .await;
    match result {
        Ok(done) => Ok((done.value, done.attempts - 1)),
        Err(RetryError::Exhausted { attempts }) => Ok((Outcome::Failed, attempts - 1)),
        Err(RetryError::Failed { error, .. }) => Err(error),
    }
}
