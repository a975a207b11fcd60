//! `leasehold torture`: real worker processes contend for leases on a store
//! and write a fenced counter while a seeded nemesis kills, pauses and cuts
//! them off; a checker then reads the merged history and says whether any
//! promise was broken, and whether the faults actually hit.
//!
//! Store-agnostic: the harness only uses `Locks::open(url)`. What is
//! store-specific is small and kept in one place each: whether the store is
//! reached over TCP (`stores.rs`, for the fault proxy) and whether it can
//! hold the resource itself (`resource/`, one file per store).

mod checker;
mod clock;
mod fleet;
mod history;
mod nemesis;
mod primitive;
mod proxy;
mod report;
mod resource;
mod stores;
mod worker;
mod worker_store;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use leasehold::Locks;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::exit::{CliError, EX_INCONCLUSIVE, EX_VIOLATION};
use crate::parse_duration;
use checker::Verdict;
use fleet::{Fleet, WorkerConfig};
use history::Event;
pub use nemesis::Family;
use primitive::Lock;
pub use primitive::Primitive;
use resource::Resource;
pub use worker::{worker, WorkerArgs};
use worker_store::TestFault;

/// One more acquisition attempt after a lease runs out: the allowance on
/// top of the ttl (and 250 ms) for a takeover after a kill.
const RETRY: Duration = Duration::from_millis(100);

/// How late a worker's `lost()` may fire after its `valid_until` and still
/// count as on time: the timer, the watcher task and the history write all
/// need scheduling on a machine the workers and the store share.
fn lost_slack(ttl: Duration) -> Duration {
    Duration::from_millis(100) + ttl / 10
}

/// Where the protected counter lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResourceKind {
    /// A TCP server on loopback inside the harness (every store)
    Server,
    /// A table in the lock store behind `WHERE fence <= token` (SQLite, PostgreSQL)
    Store,
}

/// Arguments of `torture`.
#[derive(Debug, Args)]
#[command(after_help = "\
Workers loop: acquire (waiting up to 3 ttl), read the counter, sleep 2-10 % of the ttl \
(one hold in ten: 1.5-3 ttl, so the lease lives on renewals), write counter + 1 with \
the fencing token, release. With --primitive semaphore each permit slot has its own \
counter, fenced by the slot's tokens (docs/semaphore.md), and the checker also \
counts holders at once against --permits. With --primitive rw two rounds in three \
are readers, which read, sleep and read again, fenced by writers' tokens only; \
writers are fenced by every token and hold the key alone. The nemesis aims kills and pauses at the current lease \
holder. The proxy faults sit between the workers and a network store; they cannot \
apply to SQLite (a file): asking for them there exits 64, and the default leaves them out.

Exit codes: 0 pass, 1 a violation was found, 2 inconclusive (a requested fault kind \
never landed on a holder, no renewal was made, nothing was acquired, or pauses caused \
neither a fenced rejection nor an overlapping belief), 64 bad arguments, 69 store \
unreachable.")]
pub struct TortureArgs {
    /// Worker processes
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Keys the workers contend for (fewer keys: more contention)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub keys: u32,
    /// How long to inject faults and run workers
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Lease ttl of the workers (100ms..=60s); pauses last 1.5-2.5 ttl (of
    /// the longer ttl a store enforces, e.g. etcd's whole seconds)
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Fault kinds, comma-separated, or `none` for a baseline run
    /// [default: kill,pause, plus proxy for a store reached over TCP]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Option<Vec<FaultArg>>,
    /// Shell command that restarts the store or fails over its primary
    /// (with --faults ...,restart); it gets the run's lock keys,
    /// space-separated, in $LEASEHOLD_TORTURE_KEYS
    #[arg(long, value_name = "CMD")]
    pub restart_cmd: Option<String>,
    /// Seed of the fault schedule and the workers' random choices (default: random)
    #[arg(long)]
    pub seed: Option<u64>,
    /// Pin each worker to one host of a several-host URL (etcd's members):
    /// worker i talks to host i mod (n+1) alone, or to every host when
    /// i mod (n+1) = n. A partition of one member (--restart-cmd) then cuts
    /// off the holders pinned to it; the others move or stay.
    #[arg(long)]
    pub pin_hosts: bool,
    /// Where the counter lives
    #[arg(long, value_enum, default_value = "server")]
    pub resource: ResourceKind,
    /// The lock under test
    #[arg(long, value_enum, default_value = "mutex")]
    pub primitive: Primitive,
    /// Permits of the semaphore (--primitive semaphore only) [default: 3]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub permits: Option<u32>,
    /// The resource ignores tokens: shows the lost updates fencing prevents
    #[arg(long)]
    pub no_fencing: bool,
    /// Write the merged history (worker events, resource decisions, faults) as JSONL
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// Print one JSON object instead of a table
    #[arg(long)]
    pub json: bool,
    /// Plants a bug in the workers' store client to show the checker fails
    /// the run (the harness's own tests; never a user feature)
    #[arg(long, value_enum, hide = true)]
    pub test_fault: Option<TestFault>,
}

/// A `--faults` item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FaultArg {
    Kill,
    Pause,
    Proxy,
    Restart,
    None,
}

/// The validated plan: which faults run, and notes on those that cannot.
struct Plan {
    lock: Lock,
    families: Vec<Family>,
    proxy: Option<stores::Endpoint>,
    notes: Vec<String>,
}

impl Plan {
    /// The fault kinds asked for, by name.
    fn requested(&self) -> Vec<&'static str> {
        self.families.iter().map(|f| f.name()).collect()
    }
}

fn plan(store: &str, args: &TortureArgs) -> Result<Plan, CliError> {
    if args.duration.is_zero() {
        return Err(CliError::usage("invalid duration: must be more than 0"));
    }
    if args.ttl < Duration::from_millis(100) || args.ttl > Duration::from_secs(60) {
        return Err(CliError::usage(format!(
            "invalid ttl: torture needs 100ms..=60s, got {:?}",
            args.ttl
        )));
    }
    let lock = Lock {
        primitive: args.primitive,
        permits: match (args.primitive, args.permits) {
            (Primitive::Semaphore, permits) => permits.unwrap_or(3),
            (_, None) => 1,
            (other, Some(_)) => {
                return Err(CliError::usage(format!(
                    "--permits applies to --primitive semaphore, not {}",
                    other.name()
                )))
            }
        },
    };
    if lock.primitive == Primitive::Rw && args.resource == ResourceKind::Store {
        return Err(CliError::usage(
            "--resource store has no shared reads for --primitive rw; use --resource server",
        ));
    }
    let proxy_endpoint = stores::endpoint(store);
    let faults = match &args.faults {
        Some(faults) => faults.clone(),
        None if proxy_endpoint.is_ok() => vec![FaultArg::Kill, FaultArg::Pause, FaultArg::Proxy],
        None => vec![FaultArg::Kill, FaultArg::Pause],
    };
    let wanted = |f: FaultArg| faults.contains(&f);
    if wanted(FaultArg::None) && faults.len() > 1 {
        return Err(CliError::usage(
            "--faults none cannot be combined with other faults",
        ));
    }
    if wanted(FaultArg::Restart) != args.restart_cmd.is_some() {
        return Err(CliError::usage(
            "--faults restart and --restart-cmd CMD go together (e.g. --restart-cmd 'systemctl restart redis')",
        ));
    }
    let mut plan = Plan {
        lock,
        families: Vec::new(),
        proxy: None,
        notes: Vec::new(),
    };
    for (arg, family) in [
        (FaultArg::Kill, Family::Kill),
        (FaultArg::Pause, Family::Pause),
        (FaultArg::Restart, Family::Restart),
    ] {
        if wanted(arg) {
            plan.families.push(family);
        }
    }
    match proxy_endpoint {
        Ok(endpoint) if wanted(FaultArg::Proxy) => {
            plan.proxy = Some(endpoint);
            plan.families.push(Family::Proxy);
        }
        Ok(_) => {}
        // Asked for but impossible: a run that cannot inject it must not
        // look as if it had tested it.
        Err(why) if wanted(FaultArg::Proxy) => {
            return Err(CliError::usage(format!(
                "--faults proxy cannot apply to this store: {why}"
            )))
        }
        Err(why) if args.faults.is_none() => {
            plan.notes
                .push(format!("no proxy faults by default: {why}"));
        }
        Err(_) => {}
    }
    if args.pin_hosts {
        let urls = stores::pinned(store, args.workers).map_err(CliError::usage)?;
        let each: Vec<String> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| format!("w{i} {}", stores::hosts_of(url)))
            .collect();
        plan.notes
            .push(format!("workers pinned to hosts: {}", each.join("; ")));
    }
    if let Some(fault) = args.test_fault {
        plan.notes.push(format!(
            "TEST FAULT planted in the workers' store client: {} (expect a violation)",
            fault.name()
        ));
    }
    Ok(plan)
}

pub async fn torture(store: &str, args: TortureArgs) -> Result<u8, CliError> {
    let plan = plan(store, &args)?;
    create_history_file(&args)?;
    let run = Run::new(store, &args);
    let locks = Locks::open(&run.store).await?;
    let enforced_ttl = enforced_ttl(&locks, &run, args.ttl).await?;
    let cells = plan.lock.cells(&run.keys);
    let resource = Resource::set_up(args.resource, store, &cells, !args.no_fencing).await?;
    let proxy = start_proxy(&plan).await?;
    let sampler = crate::connections::start(&run.store, run.app.as_deref()).await;
    // Only now: a run refused above leaves nothing behind.
    std::fs::create_dir_all(&run.dir)?;
    let ran = run_fleet(
        &args,
        &plan,
        &run,
        &locks,
        &resource,
        proxy.as_ref(),
        enforced_ttl,
    )
    .await?;
    drop(proxy);
    let connections = sampler.map(crate::connections::Sampler::finish);
    // Every lease must be gone once the last one could have expired.
    tokio::time::sleep(args.ttl + Duration::from_millis(200)).await;
    let held_after_end = list_after_end(&plan.lock, &locks, &run.key_prefix()).await?;
    let events = read_events(&run.dir)?;
    let decisions = resource.decisions(&cells).await?;
    let mut faults = ran.faults;
    checker::mark_proxy_hits(&events, &mut faults, args.ttl);
    let report = checker::check(&checker::Input {
        events: &events,
        decisions: &decisions,
        faults: &faults,
        ttl: args.ttl,
        enforced_ttl,
        retry: RETRY,
        lost_slack: lost_slack(args.ttl),
        held_after_end,
        requested: &plan.requested(),
        primitive: plan.lock.primitive,
        permits: plan.lock.permits,
        workers: args.workers,
    });
    if let Some(path) = &args.history {
        history::write_merged(path, &events, &decisions, &faults)?;
    }
    let notes = final_notes(&plan, ran.notes, &run.dir, &report);
    let setup = report::Setup {
        store: leasehold::redact_url(store),
        workers: args.workers,
        keys: args.keys,
        duration_ms: args.duration.as_millis() as u64,
        ttl_ms: args.ttl.as_millis() as u64,
        enforced_ttl_ms: enforced_ttl.as_millis() as u64,
        seed: run.seed,
        primitive: plan.lock.primitive,
        permits: (plan.lock.primitive == Primitive::Semaphore).then_some(plan.lock.permits),
        resource: resource.name(),
        fencing: !args.no_fencing,
        faults: plan.requested().iter().map(|f| f.to_string()).collect(),
        connections,
        notes,
    };
    if args.json {
        report::print_json(&setup, &report);
    } else {
        report::print_table(&setup, &report);
    }
    Ok(match report.verdict {
        Verdict::Pass => 0,
        Verdict::Violation => EX_VIOLATION,
        Verdict::Inconclusive => EX_INCONCLUSIVE,
    })
}

/// Truncates (or creates) the `--history` file up front, so a path that
/// cannot be written fails the run before it starts.
fn create_history_file(args: &TortureArgs) -> Result<(), CliError> {
    if let Some(path) = &args.history {
        std::fs::File::create(path)
            .map_err(|e| CliError::usage(format!("--history {}: {e}", path.display())))?;
    }
    Ok(())
}

/// The identity of one run.
struct Run {
    seed: u64,
    /// Unique per run even with a fixed seed, so runs never share records.
    id: String,
    keys: Vec<String>,
    /// The store URL, tagged so the connection sampler can tell the run's
    /// connections apart.
    store: String,
    /// The tag, where the store has one.
    app: Option<String>,
    /// Worker logs and histories.
    dir: PathBuf,
}

impl Run {
    fn new(store: &str, args: &TortureArgs) -> Run {
        let id = format!("{:08x}", rand::random::<u32>());
        let (tagged, app) = crate::connections::tag(store, &id);
        Run {
            seed: args.seed.unwrap_or_else(rand::random),
            keys: (0..args.keys)
                .map(|i| format!("torture-{id}:k{i}"))
                .collect(),
            store: tagged,
            app,
            dir: std::env::temp_dir().join(format!("leasehold-torture-{id}")),
            id,
        }
    }

    /// What every key of the run starts with.
    fn key_prefix(&self) -> String {
        format!("torture-{}:", self.id)
    }
}

/// The fault proxy between the workers and the store, if the plan has one.
async fn start_proxy(plan: &Plan) -> Result<Option<(proxy::Proxy, &stores::Endpoint)>, CliError> {
    Ok(match &plan.proxy {
        Some(endpoint) => Some((
            proxy::Proxy::start(endpoint.upstream.clone()).await?,
            endpoint,
        )),
        None => None,
    })
}

/// What the fleet and the nemesis left behind.
struct Ran {
    faults: Vec<history::Fault>,
    /// Workers that did not end cleanly.
    notes: Vec<String>,
}

/// Starts the workers, lets the nemesis loose on them until the run's end,
/// then collects them.
/// The ttl the store enforces when asked for `ttl`, from one grant of a
/// probe key under the run's prefix (released at once): `ttl` itself on
/// every store but one that rounds ttls up (etcd). A store that refuses
/// the probe for a while (a fresh Redis Cluster whose `min_replicas` WAIT
/// finds no replica yet) is asked again for up to 10 s; after that the run
/// counts on `ttl`, as the workers do.
async fn enforced_ttl(locks: &Locks, run: &Run, ttl: Duration) -> Result<Duration, CliError> {
    let options = leasehold::AcquireOptions::new()
        .with_ttl(ttl)
        .with_auto_renew(false);
    let key = format!("{}probe", run.key_prefix());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match locks.acquire_with(&key, &options).await {
            Ok(guard) => {
                let enforced = guard.lease().ttl();
                // Best effort: an unreleased probe expires after its ttl.
                let _ = guard.release().await;
                return Ok(enforced);
            }
            Err(e) if e.is_retryable() => {
                if tokio::time::Instant::now() >= deadline {
                    return Ok(ttl);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn run_fleet(
    args: &TortureArgs,
    plan: &Plan,
    run: &Run,
    locks: &Locks,
    resource: &Resource,
    proxy: Option<&(proxy::Proxy, &stores::Endpoint)>,
    enforced_ttl: Duration,
) -> Result<Ran, CliError> {
    let started = clock::mono_ns();
    let stop_at = started + args.duration.as_nanos() as u64;
    let wait = args.ttl * 3;
    let pinned = if args.pin_hosts {
        stores::pinned(&run.store, args.workers).map_err(CliError::usage)?
    } else {
        Vec::new()
    };
    let mut fleet = Fleet::start(
        WorkerConfig {
            store: match proxy {
                Some((p, endpoint)) => stores::via(&run.store, endpoint, &p.addr().to_string()),
                None => run.store.clone(),
            },
            pinned,
            keys: run.keys.clone(),
            ttl: args.ttl,
            wait,
            resource: resource.spec(),
            lock: plan.lock,
            no_fencing: args.no_fencing,
            test_fault: args.test_fault,
            stop_at,
            seed: run.seed,
            dir: run.dir.clone(),
        },
        args.workers,
    )?;
    fleet.kill_all_on_interrupt(run.dir.clone());
    let nemesis = nemesis::Nemesis {
        fleet: &mut fleet,
        locks,
        keys: &run.keys,
        lock: plan.lock,
        proxy: proxy.map(|(p, _)| p.control()),
        restart_cmd: args.restart_cmd.clone(),
        pinned: args.pin_hosts,
        families: plan.families.clone(),
        rng: StdRng::seed_from_u64(run.seed),
        ttl: args.ttl,
        lease: args.ttl.max(enforced_ttl),
        takeover: checker::takeover_bound(args.ttl, enforced_ttl, RETRY),
        end: stop_at,
    };
    let faults = nemesis.run().await?;
    let remaining = Duration::from_nanos(stop_at.saturating_sub(clock::mono_ns()));
    let notes = fleet
        .finish(remaining + wait + args.ttl + Duration::from_secs(10))
        .await;
    Ok(Ran { faults, notes })
}

/// Every worker's history, merged.
fn read_events(dir: &Path) -> Result<Vec<Event>, CliError> {
    let mut events = Vec::new();
    for file in fleet::history_files(dir)? {
        events.extend(history::read_jsonl::<Event>(&file)?);
    }
    Ok(events)
}

/// The plan's notes, then the workers' (those that did not end cleanly);
/// the worker logs are kept, and said where, unless the run passed cleanly.
fn final_notes(
    plan: &Plan,
    workers: Vec<String>,
    dir: &Path,
    report: &checker::Report,
) -> Vec<String> {
    let mut notes = plan.notes.clone();
    let clean = workers.is_empty();
    notes.extend(workers);
    if report.verdict != Verdict::Pass || !clean {
        notes.push(format!(
            "worker logs and histories kept in {}",
            dir.display()
        ));
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
    notes
}

/// Live leases under `prefix`, retrying while the store comes back from a
/// restart the nemesis may have just done.
async fn list_after_end(lock: &Lock, locks: &Locks, prefix: &str) -> Result<usize, CliError> {
    let mut attempts = 0;
    loop {
        match lock.live(locks, prefix).await {
            Ok(held) => return Ok(held),
            Err(e) if e.is_retryable() && attempts < 20 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
