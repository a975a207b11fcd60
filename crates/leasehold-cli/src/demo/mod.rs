//! `leasehold demo`: the inventory race from the field, across real worker
//! processes, once per strategy.
//!
//! Every order reads the stock, "pays" (sleeps), then writes stock - 1. Run
//! by several processes at once with no protection, two of them read the
//! same stock and one sale is lost, or the last item is sold twice.

mod inventory;
mod serve;
mod worker;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::exit::{CliError, EX_SOFTWARE};
use crate::parse_duration;
pub use worker::{worker, WorkerArgs};
use worker::{MetricsReport, OrderReport, Outcome};

/// How a worker protects read-pay-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// No protection: shows the race
    None,
    /// A leasehold lock per product, with a fenced stock write
    Lease,
    /// The store's own lock around the transaction (SQLite: BEGIN IMMEDIATE;
    /// PostgreSQL: SELECT ... FOR UPDATE; MongoDB: a transaction that writes
    /// the product first, retried on conflict; not on Redis)
    RowLock,
    /// Version compare-and-swap with bounded, jittered retry
    Optimistic,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::Lease => "lease",
            Strategy::RowLock => "row-lock",
            Strategy::Optimistic => "optimistic",
        }
    }

    /// Whether the strategy promises no oversell and no lost update.
    fn is_safe(self) -> bool {
        self != Strategy::None
    }
}

/// Arguments of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Worker processes per strategy
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Orders in total per strategy, spread over the workers
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub orders: u32,
    /// Items in stock at the start
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(0..=1_000_000_000))]
    pub stock: i64,
    /// Strategy to run (repeatable); default: all the store offers (row-lock
    /// is SQLite only)
    #[arg(long = "strategy", value_enum)]
    pub strategies: Vec<Strategy>,
    /// Simulated payment time between reading and writing the stock
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    pub pay: Duration,
    /// Print {"results":[...]} instead of a table
    #[arg(long)]
    pub json: bool,
    /// Serve the library's metrics of the demo's own work (every worker's,
    /// summed) at http://ADDR/metrics, on a loopback address; a port of 0
    /// picks a free one (printed on stderr)
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// With --metrics-addr: keep serving this long after the results are
    /// printed (for a last scrape)
    #[arg(long, default_value = "0s", value_parser = parse_duration, requires = "metrics_addr")]
    pub metrics_linger: Duration,
}

/// One strategy's outcome, as the table and `--json` show it.
#[derive(Debug, Serialize)]
struct DemoResult {
    strategy: Strategy,
    orders: u32,
    sold: i64,
    initial_stock: i64,
    final_stock: i64,
    oversold: i64,
    lost_updates: i64,
    retries: u64,
    /// Orders that gave up (lock wait or retries exhausted).
    failed: u64,
    elapsed_ms: u64,
    p50_ms: f64,
    p99_ms: f64,
}

impl DemoResult {
    fn violates_safety(&self) -> bool {
        self.oversold > 0 || self.lost_updates != 0
    }
}

pub async fn demo(store: &str, args: DemoArgs) -> Result<u8, CliError> {
    let strategies = inventory::strategies(store, &args.strategies)?;
    let exported = match args.metrics_addr {
        Some(addr) => Some(serve::serve(addr).await?),
        None => None,
    };
    let inventory = inventory::open(store).await?;
    let progress = progress_bar(&args, strategies.len());
    let mut results = Vec::new();
    for strategy in strategies {
        let product = format!("widget-{}", strategy.name());
        inventory.reset(&product, args.stock).await?;
        progress.set_message(strategy.name());
        let run = run_workers(
            store,
            &args,
            strategy,
            &product,
            &progress,
            exported.as_ref(),
        )
        .await?;
        let final_stock = inventory.read(&product).await?.stock;
        results.push(summarize(strategy, &args, run, final_stock));
    }
    progress.finish_and_clear();

    if args.json {
        let json = serde_json::json!({ "results": results });
        println!("{json}");
    } else {
        print_table(&results);
    }
    if exported.is_some() && !args.metrics_linger.is_zero() {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        tokio::time::sleep(args.metrics_linger).await;
    }
    let unsafe_runs: Vec<_> = results
        .iter()
        .filter(|r| r.violates_safety() && r.strategy.is_safe())
        .map(|r| r.strategy.name())
        .collect();
    if unsafe_runs.is_empty() {
        Ok(0)
    } else {
        eprintln!("leasehold: safe strategies oversold or lost updates: {unsafe_runs:?}");
        Ok(1)
    }
}

fn progress_bar(args: &DemoArgs, strategies: usize) -> ProgressBar {
    if args.json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(u64::from(args.orders) * strategies as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} orders")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

/// What the workers of one strategy reported.
struct Run {
    reports: Vec<OrderReport>,
    elapsed: Duration,
}

async fn run_workers(
    store: &str,
    args: &DemoArgs,
    strategy: Strategy,
    product: &str,
    progress: &ProgressBar,
    exported: Option<&serve::Exported>,
) -> Result<Run, CliError> {
    let exe = std::env::current_exe()?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let started = Instant::now();
    let mut children = Vec::new();
    for i in 0..args.workers {
        // Spread the orders: the first `orders % workers` workers take one more.
        let orders = args.orders / args.workers + u32::from(i < args.orders % args.workers);
        let mut child = Command::new(&exe)
            // The URL may carry a password: the environment, unlike argv,
            // is readable by this user only (/proc/PID/environ is 0400).
            .env("LEASEHOLD_STORE", store)
            .args(["demo-worker", "--product", product])
            .args([
                "--strategy",
                strategy.name(),
                "--orders",
                &orders.to_string(),
            ])
            .args(["--pay", &format!("{}us", args.pay.as_micros())])
            .args(exported.map(|_| "--metrics"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let tx = tx.clone();
        let exported = exported.map(|e| e.worker(format!("{}-{i}", strategy.name())));
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(report) = serde_json::from_str::<OrderReport>(&line) {
                    let _ = tx.send(report);
                } else if let (Some(exported), Ok(report)) =
                    (&exported, serde_json::from_str::<MetricsReport>(&line))
                {
                    exported.update(report.metrics);
                }
            }
        });
        children.push(child);
    }
    drop(tx);
    let mut reports = Vec::new();
    while let Some(report) = rx.recv().await {
        progress.inc(1);
        reports.push(report);
    }
    for mut child in children {
        let status = child.wait().await?;
        if !status.success() {
            return Err(CliError::new(
                status
                    .code()
                    .and_then(|c| u8::try_from(c).ok())
                    .unwrap_or(EX_SOFTWARE),
                format!("a {} demo worker failed ({status})", strategy.name()),
            ));
        }
    }
    Ok(Run {
        reports,
        elapsed: started.elapsed(),
    })
}

fn summarize(strategy: Strategy, args: &DemoArgs, run: Run, final_stock: i64) -> DemoResult {
    let sold = run
        .reports
        .iter()
        .filter(|r| r.outcome == Outcome::Sold)
        .count() as i64;
    let mut latencies: Vec<u64> = run.reports.iter().map(|r| r.latency_us).collect();
    latencies.sort_unstable();
    DemoResult {
        strategy,
        orders: args.orders,
        sold,
        initial_stock: args.stock,
        final_stock,
        oversold: (sold - args.stock).max(0),
        lost_updates: sold - (args.stock - final_stock),
        retries: run.reports.iter().map(|r| u64::from(r.retries)).sum(),
        failed: run
            .reports
            .iter()
            .filter(|r| r.outcome == Outcome::Failed)
            .count() as u64,
        elapsed_ms: run.elapsed.as_millis() as u64,
        p50_ms: percentile_ms(&latencies, 0.50),
        p99_ms: percentile_ms(&latencies, 0.99),
    }
}

/// Nearest-rank percentile of sorted microsecond samples, in milliseconds.
fn percentile_ms(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    sorted_us[rank - 1] as f64 / 1000.0
}

fn print_table(results: &[DemoResult]) {
    println!(
        "{:<11} {:>6} {:>5} {:>6} {:>9} {:>5} {:>8} {:>7} {:>8} {:>8} {:>8}",
        "strategy",
        "orders",
        "sold",
        "stock",
        "oversold",
        "lost",
        "retries",
        "ms",
        "p50 ms",
        "p99 ms",
        "verdict"
    );
    for r in results {
        let verdict = match (r.violates_safety(), r.strategy.is_safe()) {
            (false, _) => "correct",
            (true, false) => "RACE",
            (true, true) => "BROKEN",
        };
        println!(
            "{:<11} {:>6} {:>5} {:>6} {:>9} {:>5} {:>8} {:>7} {:>8.2} {:>8.2} {:>8}",
            r.strategy.name(),
            r.orders,
            r.sold,
            format!("{}→{}", r.initial_stock, r.final_stock),
            r.oversold,
            r.lost_updates,
            r.retries,
            r.elapsed_ms,
            r.p50_ms,
            r.p99_ms,
            verdict
        );
    }
    println!(
        "\noversold = sales beyond the initial stock; lost = sales not reflected in the final stock"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(percentile_ms(&v, 0.5), 50.0);
        assert_eq!(percentile_ms(&v, 0.99), 99.0);
        assert_eq!(percentile_ms(&[], 0.5), 0.0);
    }

    #[test]
    fn none_is_the_only_unsafe_strategy() {
        assert!(!Strategy::None.is_safe());
        assert!(
            Strategy::Lease.is_safe()
                && Strategy::RowLock.is_safe()
                && Strategy::Optimistic.is_safe()
        );
    }
}
