//! One torture worker process (the hidden `torture-worker` command): loops
//! acquire, read, sleep in the critical section, write + 1 with the token,
//! release, and logs every step as a JSON line with the shared monotonic
//! clock. One hold in ten lasts several ttls, so the guard's renewal runs
//! and the checker sees whether the store kept the lease it renewed.
//!
//! It deliberately does not check `is_lost()` before writing: a pause can
//! fall between any such check and the write, so the harness shows what the
//! resource does with a late write instead of hoping it never comes.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Args;
use leasehold::{AcquireOptions, Error, LeaseGuard, Locks};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::clock::{mono_ns, to_mono};
use super::history::{Event, Kind, Log, Op};
use super::primitive::{Held, Lock, Primitive};
use super::resource::{self, Answer};
use super::worker_store::{TestFault, WorkerStore};
use crate::exit::CliError;
use crate::parse_duration;

/// Arguments of the hidden `torture-worker` command.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub id: u32,
    /// The contended keys, comma-separated
    #[arg(long, value_delimiter = ',', required = true)]
    pub keys: Vec<String>,
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Duration,
    #[arg(long, value_parser = parse_duration)]
    pub wait: Duration,
    /// tcp://ADDR (the harness's resource server) or `store`
    #[arg(long)]
    pub resource: String,
    #[arg(long)]
    pub no_fencing: bool,
    /// JSONL history file to append to
    #[arg(long)]
    pub history: PathBuf,
    /// Stop starting new rounds at this CLOCK_MONOTONIC time (ns)
    #[arg(long)]
    pub stop_at: u64,
    #[arg(long)]
    pub seed: u64,
    /// A planted store fault, for the harness's own tests (see `TestFault`)
    #[arg(long, value_enum)]
    pub test_fault: Option<TestFault>,
    /// The lock under test
    #[arg(long, value_enum, default_value = "mutex")]
    pub primitive: Primitive,
    /// Semaphore permits
    #[arg(long, default_value_t = 1)]
    pub permits: u32,
}

/// The share of holds that last several ttls (the rest last 2-10 % of one).
const LONG_HOLD_SHARE: f64 = 0.1;

fn holding(mut e: Event, guard: &LeaseGuard) -> Event {
    e.token = Some(guard.token());
    e.valid_until = Some(to_mono(guard.valid_until()));
    e
}

pub async fn worker(store: &str, args: WorkerArgs) -> Result<u8, CliError> {
    let pid = std::process::id();
    let log = Log::open(&args.history, args.id, pid)?;
    let store_client = WorkerStore::new(
        leasehold::open::open_backend(store).await?,
        log.clone(),
        args.test_fault,
    );
    let granted_request_sent = store_client.last_attempt();
    // The nemesis finds a lease's holder process by this label.
    let locks = Locks::new(store_client).with_holder_label(&format!("torture-w{}:{pid}", args.id));
    let mut resource = resource::connect(&args.resource, store, args.id, !args.no_fencing).await?;
    let mut rng = StdRng::seed_from_u64(args.seed);
    let options = AcquireOptions::new()
        .with_ttl(args.ttl)
        .with_wait(args.wait);
    let lock = Lock {
        primitive: args.primitive,
        permits: args.permits,
    };

    while mono_ns() < args.stop_at {
        let key = &args.keys[rng.gen_range(0..args.keys.len())];
        let shared = lock.shared_round(&mut rng);
        log.put(log.event(Op::Acquire, Kind::Invoke, key))?;
        let held = match lock.acquire(&locks, key, &options, shared).await {
            Ok(held) => held,
            Err(e @ (Error::Timeout { .. } | Error::Busy { .. })) => {
                log.put(failed(log.event(Op::Acquire, Kind::Fail, key), &e))?;
                continue;
            }
            Err(e) if e.is_retryable() => {
                // The store may or may not have granted it; its ttl decides.
                log.put(failed(log.event(Op::Acquire, Kind::Unknown, key), &e))?;
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let guard = &held.guard;
        let mut granted = holding(log.event(Op::Acquire, Kind::Ok, key), guard);
        granted.sent = Some(granted_request_sent.load(Ordering::SeqCst));
        granted.slot = held.slot;
        granted.shared = held.shared;
        log.put(granted)?;
        let watcher = watch_lost(&log, key, guard);
        critical_section(&log, &mut *resource, key, &held, &mut rng).await?;
        log.put(holding(log.event(Op::Release, Kind::Invoke, key), guard))?;
        let token = guard.token();
        watcher.abort();
        match held.guard.release().await {
            Ok(()) => {
                let mut e = log.event(Op::Release, Kind::Ok, key);
                e.token = Some(token);
                log.put(e)?;
            }
            Err(err) => {
                let mut e = failed(log.event(Op::Release, Kind::Unknown, key), &err);
                e.token = Some(token);
                log.put(e)?;
            }
        }
        // Think time: without it the releasing process wins the key back
        // before a woken waiter can ask, and one worker does all the work.
        tokio::time::sleep(args.ttl.mul_f64(rng.gen_range(0.0..0.05))).await;
    }
    Ok(0)
}

/// Logs when the guard's lost-lease signal fires.
fn watch_lost(log: &Log, key: &str, guard: &LeaseGuard) -> tokio::task::JoinHandle<()> {
    let lost = guard.lost();
    let (log, key, token) = (log.clone(), key.to_owned(), guard.token());
    tokio::spawn(async move {
        lost.await;
        let mut e = log.event(Op::Lost, Kind::Info, &key);
        e.token = Some(token);
        let _ = log.put(e);
    })
}

/// Read, sleep, write + 1, all with the lease's token, on the grant's
/// resource cell. A reader of a read-write lock reads, sleeps and reads
/// again instead (a paused reader's late read is what fencing must stop).
async fn critical_section(
    log: &Log,
    resource: &mut dyn resource::FencedResource,
    key: &str,
    held: &Held,
    rng: &mut StdRng,
) -> Result<(), CliError> {
    let guard = &held.guard;
    let cell = held.cell(key);
    let token = guard.token();
    log.put(holding(log.event(Op::Read, Kind::Invoke, key), guard))?;
    let read = if held.shared {
        resource.shared_read(&cell, token).await
    } else {
        resource.read(&cell, token).await
    };
    let value = match read {
        Ok(Answer::Accepted(v)) => {
            let mut e = holding(log.event(Op::Read, Kind::Ok, key), guard);
            e.value = Some(v);
            log.put(e)?;
            v
        }
        Ok(Answer::Fenced { highest }) => {
            let mut e = holding(log.event(Op::Read, Kind::Fail, key), guard);
            e.error = Some(format!("fenced: resource has seen token {highest}"));
            return Ok(log.put(e)?);
        }
        Err(err) => {
            let mut e = holding(log.event(Op::Read, Kind::Unknown, key), guard);
            e.error = Some(err.to_string());
            return Ok(log.put(e)?);
        }
    };
    // Mostly long enough for the nemesis to catch a holder here and short
    // against the ttl; sometimes several ttls, so the lease lives on renewals.
    let ttl = guard.lease().ttl();
    let hold = if rng.gen_bool(LONG_HOLD_SHARE) {
        rng.gen_range(1.5..3.0)
    } else {
        rng.gen_range(0.02..0.1)
    };
    tokio::time::sleep(ttl.mul_f64(hold)).await;
    if held.shared {
        return shared_read_again(log, resource, key, &cell, guard).await;
    }
    let mut e = holding(log.event(Op::Write, Kind::Invoke, key), guard);
    e.value = Some(value + 1);
    log.put(e)?;
    let mut e = match resource.write(&cell, token, value + 1).await {
        Ok(Answer::Accepted(())) => log.event(Op::Write, Kind::Ok, key),
        Ok(Answer::Fenced { highest }) => {
            let mut e = log.event(Op::Write, Kind::Fail, key);
            e.error = Some(format!("fenced: resource has seen token {highest}"));
            e
        }
        Err(err) => {
            let mut e = log.event(Op::Write, Kind::Unknown, key);
            e.error = Some(err.to_string());
            e
        }
    };
    e.token = Some(token);
    e.value = Some(value + 1);
    Ok(log.put(e)?)
}

/// A reader's second read, at the end of its hold.
async fn shared_read_again(
    log: &Log,
    resource: &mut dyn resource::FencedResource,
    key: &str,
    cell: &str,
    guard: &LeaseGuard,
) -> Result<(), CliError> {
    log.put(holding(log.event(Op::Read, Kind::Invoke, key), guard))?;
    let mut e = match resource.shared_read(cell, guard.token()).await {
        Ok(Answer::Accepted(v)) => {
            let mut e = holding(log.event(Op::Read, Kind::Ok, key), guard);
            e.value = Some(v);
            e
        }
        Ok(Answer::Fenced { highest }) => {
            let mut e = holding(log.event(Op::Read, Kind::Fail, key), guard);
            e.error = Some(format!("fenced: resource has seen token {highest}"));
            e
        }
        Err(err) => {
            let mut e = holding(log.event(Op::Read, Kind::Unknown, key), guard);
            e.error = Some(err.to_string());
            e
        }
    };
    e.token = Some(guard.token());
    Ok(log.put(e)?)
}

fn failed(mut e: Event, err: &Error) -> Event {
    e.error = Some(err.to_string());
    e
}
