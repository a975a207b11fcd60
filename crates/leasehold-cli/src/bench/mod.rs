//! `leasehold bench`: what a lock costs on a store, side by side with the
//! cheapest thing the store can do, in one run.

mod keys;
mod order;
mod plot;
mod raw;
mod recorder;
mod scenarios;
mod stats;
mod worker;

use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::exit::CliError;
use crate::parse_duration;
use scenarios::{Contended, Handoff, Renewal, Scale, Uncontended};
pub use worker::{bench_worker, BenchWorkerArgs};

/// The measurements `bench` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Acquire + release on a free key, interleaved with the raw baseline
    /// and the other primitives (a semaphore permit, acquire_many of 2
    /// keys, a reader-writer lock's read and write)
    Uncontended,
    /// Release to next holder, woken by the store vs polling only
    Handoff,
    /// W workers on one key: acquisitions/s, fairness, longest wait
    Contended,
    /// W workers on distinct keys, W = 1 ..= 2 x cores: acquisitions/s
    Scale,
    /// N held leases renewing: store operations/s spent on renewal
    Renewal,
}

const ALL: [Scenario; 5] = [
    Scenario::Uncontended,
    Scenario::Handoff,
    Scenario::Contended,
    Scenario::Scale,
    Scenario::Renewal,
];

/// Arguments of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Scenario to run (repeatable); default: all
    #[arg(long = "scenario", value_enum)]
    pub scenarios: Vec<Scenario>,
    /// How long each timed scenario (contended, each scale step, renewal) runs
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Workers in the contended scenario
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,
    /// Run the contended workers as OS processes instead of tasks
    #[arg(long)]
    pub processes: bool,
    /// With --processes: waiters (tasks) in each worker process
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub tasks_per_process: u32,
    /// Rounds of the uncontended and hand-off scenarios
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(10..=1_000_000))]
    pub rounds: u32,
    /// Short run for CI (under a minute per store): fewer rounds, 1 s steps,
    /// 10 leases in the renewal scenario (not 100)
    #[arg(long)]
    pub quick: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Write an SVG chart of the latency distributions
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
}

/// Everything one run measured.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub store: String,
    pub quick: bool,
    pub scenarios: Scenarios,
    /// The most connections the run held on the store's server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<crate::connections::Peak>,
}

#[derive(Debug, Default, Serialize)]
pub struct Scenarios {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncontended: Option<Uncontended>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contended: Option<Contended>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<Scale>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewal: Option<Renewal>,
}

pub async fn bench(store_url: &str, args: BenchArgs) -> Result<u8, CliError> {
    let plan = Plan::new(&args)?;
    let run = format!("bench-{:08x}", rand::random::<u32>());
    let (store_url, app) = crate::connections::tag(store_url, &run);
    let (store, locks) = raw::open(&store_url).await?;
    let sampler = crate::connections::start(&store_url, app.as_deref()).await;
    let mut report = Report {
        store: store.display_url(),
        quick: args.quick,
        ..Report::default()
    };
    let mut samples = Vec::new();
    let progress = progress_bar(&args, plan.scenarios.len());
    for &scenario in &plan.scenarios {
        progress.set_message(format!("{scenario:?}").to_lowercase());
        let target = (&store, &locks, store_url.as_str());
        run_scenario(scenario, &plan, target, &mut report.scenarios, &mut samples).await?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    report.connections = sampler.map(crate::connections::Sampler::finish);
    if let Some(path) = &args.plot {
        plot::write_svg(path, &samples)?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("reports serialize")
        );
    } else {
        print_table(&report);
    }
    Ok(0)
}

/// The validated arguments: what to run, and for how long.
struct Plan {
    scenarios: Vec<Scenario>,
    /// Rounds of the uncontended scenario (a tenth of them, at least 20,
    /// for the hand-off).
    rounds: usize,
    /// How long each timed scenario or step runs.
    step: Duration,
    workers: usize,
    processes: bool,
    tasks_per_process: usize,
    cores: usize,
    /// Leases held in the renewal scenario.
    renewal_leases: usize,
}

impl Plan {
    fn new(args: &BenchArgs) -> Result<Plan, CliError> {
        if args
            .plot
            .as_ref()
            .is_some_and(|p| p.extension().is_none_or(|e| e != "svg"))
        {
            return Err(CliError::usage("--plot takes a file name ending in .svg"));
        }
        if args.duration.is_zero() {
            return Err(CliError::usage("--duration must be more than 0"));
        }
        if args.tasks_per_process != 1 && !args.processes {
            return Err(CliError::usage(
                "--tasks-per-process needs --processes (without it, --workers are tasks of this process)",
            ));
        }
        let (rounds, step) = if args.quick {
            (
                args.rounds.min(300) as usize,
                args.duration.min(Duration::from_secs(1)),
            )
        } else {
            (args.rounds as usize, args.duration)
        };
        Ok(Plan {
            scenarios: if args.scenarios.is_empty() {
                ALL.to_vec()
            } else {
                args.scenarios.clone()
            },
            rounds,
            step,
            workers: args.workers as usize,
            processes: args.processes,
            tasks_per_process: args.tasks_per_process as usize,
            cores: std::thread::available_parallelism().map_or(2, |n| n.get()),
            // A quick run checks that the scenario works: 100 leases at a
            // 1 s ttl are 300 renewals/s, more than a slow test server
            // (SecantusDB on a loaded machine) answers, and lost leases
            // there would measure the machine, not the check.
            renewal_leases: if args.quick { 10 } else { 100 },
        })
    }
}

fn progress_bar(args: &BenchArgs, scenarios: usize) -> ProgressBar {
    if args.json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(scenarios as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} scenarios")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Runs one scenario on the store (its baselines, the client under test,
/// and its URL for worker processes) and puts its result in `out`.
async fn run_scenario(
    scenario: Scenario,
    plan: &Plan,
    (store, locks, url): (&raw::BenchStore, &leasehold::Locks, &str),
    out: &mut Scenarios,
    samples: &mut Vec<(&'static str, Vec<Duration>)>,
) -> Result<(), CliError> {
    match scenario {
        Scenario::Uncontended => {
            out.uncontended =
                Some(scenarios::uncontended(store, locks, plan.rounds, samples).await?)
        }
        Scenario::Handoff => {
            let rounds = (plan.rounds / 10).max(20);
            out.handoff = Some(scenarios::handoff(store, rounds, samples).await?)
        }
        Scenario::Contended => {
            out.contended = Some(if plan.processes {
                let queues = locks.backend().queues();
                let shape = (plan.workers, plan.tasks_per_process);
                worker::contended_processes(url, shape, plan.step, queues).await?
            } else {
                scenarios::contended(store, locks, plan.workers, plan.step).await?
            })
        }
        Scenario::Scale => {
            out.scale = Some(scenarios::scale(locks, 2 * plan.cores, plan.step).await?)
        }
        Scenario::Renewal => {
            let ttl = Duration::from_secs(1);
            let step = plan.step.max(Duration::from_secs(1));
            out.renewal = Some(scenarios::renewal(store, plan.renewal_leases, ttl, step).await?)
        }
    }
    Ok(())
}

fn print_table(report: &Report) {
    let s = &report.scenarios;
    println!(
        "store: {}{}",
        report.store,
        if report.quick { " (quick)" } else { "" }
    );
    if let Some(u) = &s.uncontended {
        println!(
            "\nuncontended acquire+release ({} rounds, interleaved)",
            u.leasehold.samples
        );
        println!(
            "  {:<34} {:>10} {:>10} {:>10} {:>10}",
            "", "p50 µs", "p99 µs", "p99.9 µs", "vs ours"
        );
        let l = &u.leasehold;
        println!(
            "  {:<34} {:>10.1} {:>10.1} {:>10.1} {:>10}",
            "leasehold", l.p50_us, l.p99_us, l.p999_us, ""
        );
        for (name, r) in [
            ("leasehold, metrics recorder on", &u.with_recorder),
            ("leasehold, no-op recorder on", &u.with_noop_recorder),
        ] {
            println!(
                "  {:<34} {:>10.1} {:>10.1} {:>10.1} {:>9.2}x",
                name, r.latency.p50_us, r.latency.p99_us, r.latency.p999_us, r.p50_per_plain
            );
        }
        for b in &u.baselines {
            let x = &b.latency;
            println!(
                "  {:<34} {:>10.1} {:>10.1} {:>10.1} {:>9.2}x",
                b.name, x.p50_us, x.p99_us, x.p999_us, b.leasehold_p50_ratio
            );
        }
        if !u.primitives.is_empty() {
            println!(
                "  {:<34} {:>10} {:>10} {:>10} {:>10}",
                "other primitives", "p50 µs", "p99 µs", "p99.9 µs", "vs mutex"
            );
        }
        for p in &u.primitives {
            let x = &p.latency;
            println!(
                "  {:<34} {:>10.1} {:>10.1} {:>10.1} {:>9.2}x",
                p.name, x.p50_us, x.p99_us, x.p999_us, p.p50_per_mutex
            );
        }
        for why in &u.primitives_skipped {
            println!("  not on this store: {why}");
        }
    }
    if let Some(h) = &s.handoff {
        println!(
            "\nhand-off: release -> next holder acquired ({} rounds)",
            h.notified.samples
        );
        println!("  {:<34} {:>10} {:>10}", "", "p50 µs", "p99 µs");
        let rows = [
            ("one uncontended acquire", Some(&h.acquire)),
            ("  same, after a hand-off's pause", Some(&h.paused_acquire)),
            ("woken by the store", Some(&h.notified)),
            (
                "  same, from release returned",
                Some(&h.notified_after_release),
            ),
            ("  handed over (with_fair)", h.fair.as_ref()),
            ("polling only", Some(&h.polling)),
        ];
        for (name, l) in rows.into_iter().filter_map(|(n, l)| Some((n, l?))) {
            println!("  {:<34} {:>10.1} {:>10.1}", name, l.p50_us, l.p99_us);
        }
        for p in &h.peers {
            let l = &p.latency;
            println!("  {:<34} {:>10.1} {:>10.1}", p.name, l.p50_us, l.p99_us);
        }
        println!(
            "  woken hand-off = {:.2}x one acquire, {:.2}x one after the same pause ({:.2}x from release returned); polling is {:.1}x slower",
            h.notified_p50_per_acquire,
            h.notified_p50_per_paused_acquire,
            h.notified_after_release_p50_per_acquire,
            h.polling_p50_per_notified
        );
        if let (Some(r), Some(paused)) = (h.fair_p50_per_acquire, h.fair_p50_per_paused_acquire) {
            println!(
                "  handed-over hand-off (with_fair) = {r:.2}x one acquire, {paused:.2}x one after the same pause"
            );
        }
    }
    if let Some(c) = &s.contended {
        let within = match c.processes {
            Some(p) => format!(" in {p} processes"),
            None => String::new(),
        };
        println!(
            "\ncontended: {} workers{within} on one key for {} ms",
            c.workers, c.duration_ms
        );
        println!(
            "  {:<30} {:>9} {:>7} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "",
            "acq/s",
            "Jain",
            "longest wait",
            "out of order",
            "/FIFO",
            "p99/FIFO",
            "wakes/rel",
            "asks/acq"
        );
        let rows = std::iter::once(("leasehold", &c.leasehold))
            .chain(c.fair.iter().map(|r| ("leasehold, fair (queued)", r)))
            .chain(c.raw_loop.iter().map(|r| ("raw loop, no library", r)));
        for (name, t) in rows {
            let (ooo, fifo, p99, wakes, asks) = match &t.order {
                Some(o) => (
                    format!("{:.2}%", o.out_of_order * 100.0),
                    format!("{:.2}", o.longest_per_fifo),
                    format!("{:.2}", o.p99_per_fifo),
                    format!("{:.2}", o.wakeups_per_release),
                    format!("{:.2}", o.attempts_per_grant),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into(), "-".into()),
            };
            println!(
                "  {:<30} {:>9.0} {:>7.3} {:>9.1} ms {:>12} {:>9} {:>9} {:>9} {:>9}",
                name, t.per_second, t.jain_index, t.longest_wait_ms, ooo, fifo, p99, wakes, asks
            );
        }
        if let Some(r) = c.ratio_to_raw {
            println!("  leasehold = {r:.2}x the raw loop's acquisitions/s");
        }
        println!("  (/FIFO: longest wait over a first-come-first-served wait, the mean time between grants times the other waiters; p99/FIFO: the same for the 99th percentile of the waits; asks/acq: acquire requests sent to the store per grant)");
    }
    if let Some(sc) = &s.scale {
        println!("\nscale: workers on distinct keys");
        for p in &sc.points {
            println!("  {:>3} workers {:>10.0} acq/s", p.workers, p.per_second);
        }
    }
    if let Some(c) = &report.connections {
        println!("\nconnections: peak {} ({})", c.peak, c.counted);
    }
    if let Some(r) = &s.renewal {
        println!(
            "\nrenewal: {} leases, ttl {} ms: {:.0} renewals/s (expected {:.0}), {} lost",
            r.leases, r.ttl_ms, r.renewals_per_second, r.expected_per_second, r.lost
        );
    }
}
