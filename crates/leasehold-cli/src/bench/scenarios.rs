//! The measurements. Each takes the store, runs for a bounded time or
//! number of rounds, and returns a serializable summary (plus raw samples
//! where a chart wants them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::backends::polling::PollingOnly;
use leasehold::{AcquireOptions, Locks};
use rand::seq::SliceRandom;
use serde::Serialize;
use tokio::time::Instant;

use super::keys::unique_key;
use super::order::{order, wait_in_turn, Counted, Order, WaiterRun};
use super::raw::BenchStore;
use super::stats::{jain_index, ratio, Latency};
use crate::exit::CliError;

#[derive(Debug, Serialize)]
pub struct NamedLatency {
    pub name: &'static str,
    #[serde(flatten)]
    pub latency: Latency,
    /// p50 of leasehold divided by p50 of this baseline.
    pub leasehold_p50_ratio: f64,
    pub leasehold_mean_ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct Uncontended {
    pub leasehold: Latency,
    pub baselines: Vec<NamedLatency>,
    /// The other primitives on the same store, in the same rounds.
    pub primitives: Vec<PrimitiveLatency>,
    /// Primitives the store refused (not implemented there), with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub primitives_skipped: Vec<String>,
    /// The mutex round again with a Prometheus metrics recorder installed.
    pub with_recorder: super::recorder::RecorderOverhead,
    /// And with the facade's no-op recorder (the library's part alone).
    pub with_noop_recorder: super::recorder::RecorderOverhead,
}

/// Acquire + release of another primitive, next to the mutex's.
#[derive(Debug, Serialize)]
pub struct PrimitiveLatency {
    pub name: &'static str,
    #[serde(flatten)]
    pub latency: Latency,
    /// p50 of this primitive divided by p50 of the mutex (target ≤ 1.5).
    pub p50_per_mutex: f64,
    pub p99_per_mutex: f64,
}

/// The primitives the uncontended scenario times beside the mutex.
#[derive(Debug, Clone, Copy)]
enum Primitive {
    /// One permit of a 3-permit semaphore.
    Permit,
    /// `acquire_many` of two keys.
    TwoKeys,
    /// A reader-writer lock's read side.
    Read,
    /// A reader-writer lock's write side.
    Write,
}

const PRIMITIVES: [Primitive; 4] = [
    Primitive::Permit,
    Primitive::TwoKeys,
    Primitive::Read,
    Primitive::Write,
];

impl Primitive {
    fn name(self) -> &'static str {
        match self {
            Primitive::Permit => "semaphore permit (3 permits)",
            Primitive::TwoKeys => "acquire_many, 2 keys",
            Primitive::Read => "rw lock, read",
            Primitive::Write => "rw lock, write",
        }
    }

    /// One acquire + release on free keys of its own.
    async fn round(self, locks: &Locks, key: &str) -> leasehold::Result<()> {
        match self {
            Primitive::Permit => {
                locks
                    .semaphore(key, 3)?
                    .try_acquire()
                    .await?
                    .release()
                    .await
            }
            Primitive::TwoKeys => {
                let keys = [format!("{key}:a"), format!("{key}:b")];
                locks
                    .acquire_many(&keys, &AcquireOptions::new())
                    .await?
                    .release()
                    .await
            }
            Primitive::Read => locks.rw_lock(key)?.try_read().await?.release().await,
            Primitive::Write => locks.rw_lock(key)?.try_write().await?.release().await,
        }
    }
}

/// The primitives `locks`' store serves, each with a fresh key, tried once
/// each; the others (refused for good: a store that does not implement one
/// yet) with why. A retryable error fails the run, as anywhere else.
async fn served_primitives(
    locks: &Locks,
) -> Result<(Vec<(Primitive, String)>, Vec<String>), CliError> {
    let (mut served, mut skipped) = (Vec::new(), Vec::new());
    for p in PRIMITIVES {
        let key = unique_key("primitive");
        match p.round(locks, &key).await {
            Ok(()) => served.push((p, key)),
            Err(e) if !e.is_retryable() => skipped.push(format!("{}: {e}", p.name())),
            Err(e) => return Err(e.into()),
        }
    }
    Ok((served, skipped))
}

/// One row of the uncontended scenario's rounds.
#[derive(Debug, Clone, Copy)]
enum Row {
    /// leasehold's mutex.
    Ours,
    /// The same with the Prometheus recorder installed.
    Recorded,
    /// The same with the no-op recorder installed.
    NoopRecorded,
    /// The primitive served at this index.
    Primitive(usize),
    /// The store's baseline at this index.
    Baseline(usize),
}

/// Acquire + release on a free key, leasehold and each baseline in turn
/// (A B A B ...), so drift in the machine's load hits all alike, each
/// round starting at the next row, so that no row always follows the same
/// one.
pub async fn uncontended(
    store: &BenchStore,
    locks: &Locks,
    rounds: usize,
    samples: &mut Vec<(&'static str, Vec<Duration>)>,
) -> Result<Uncontended, CliError> {
    let key = unique_key("uncontended");
    let raw_keys: Vec<String> = store.baselines.iter().map(|_| unique_key("raw")).collect();
    let (served, primitives_skipped) = served_primitives(locks).await?;
    let mut ours = Vec::with_capacity(rounds);
    let mut theirs: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); store.baselines.len()];
    let mut primitives: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); served.len()];
    let mut recording = super::recorder::Recording::prometheus(rounds);
    let mut noop_recording = super::recorder::Recording::noop(rounds);
    // Each round runs the rows in a fresh random order. A row pays for
    // what the row before it left behind (on Redis, a peer connection's
    // driver still busy after its call returned): in a fixed cyclic
    // order, even one starting a row further on each round, every row
    // kept its predecessor, and the plain mutex row, always after the
    // last baseline, read 2-10 us slower than the same calls one row
    // later (docs/performance.md, "Row order").
    let mut rows: Vec<Row> = [Row::Ours, Row::Recorded, Row::NoopRecorded]
        .into_iter()
        .chain((0..served.len()).map(Row::Primitive))
        .chain((0..store.baselines.len()).map(Row::Baseline))
        .collect();
    for _ in 0..rounds {
        rows.shuffle(&mut rand::thread_rng());
        for row in &rows {
            match *row {
                Row::Ours => {
                    let t = Instant::now();
                    let guard = locks.try_acquire(&key).await?;
                    guard.release().await?;
                    ours.push(t.elapsed());
                }
                Row::Recorded => recording.round(locks).await?,
                Row::NoopRecorded => noop_recording.round(locks).await?,
                Row::Primitive(i) => {
                    let (primitive, key) = &served[i];
                    let t = Instant::now();
                    primitive.round(locks, key).await?;
                    primitives[i].push(t.elapsed());
                }
                Row::Baseline(i) => {
                    let baseline = &store.baselines[i];
                    let t = Instant::now();
                    let held = baseline.try_acquire(&raw_keys[i]).await?.ok_or_else(|| {
                        CliError::new(crate::exit::EX_SOFTWARE, "baseline key unexpectedly busy")
                    })?;
                    baseline.release(held).await?;
                    theirs[i].push(t.elapsed());
                }
            }
        }
    }
    let leasehold = Latency::of(&ours);
    let with_recorder = recording.finish(&leasehold);
    let with_noop_recorder = noop_recording.finish(&leasehold);
    let baselines = store
        .baselines
        .iter()
        .zip(&theirs)
        .map(|(b, s)| {
            let latency = Latency::of(s);
            NamedLatency {
                name: b.name(),
                leasehold_p50_ratio: ratio(leasehold.p50_us, latency.p50_us),
                leasehold_mean_ratio: ratio(leasehold.mean_us, latency.mean_us),
                latency,
            }
        })
        .collect();
    let primitives = served
        .iter()
        .zip(&primitives)
        .map(|((p, _), s)| {
            let latency = Latency::of(s);
            PrimitiveLatency {
                name: p.name(),
                p50_per_mutex: ratio(latency.p50_us, leasehold.p50_us),
                p99_per_mutex: ratio(latency.p99_us, leasehold.p99_us),
                latency,
            }
        })
        .collect();
    samples.push(("leasehold", ours));
    for (b, s) in store.baselines.iter().zip(theirs) {
        samples.push((b.name(), s));
    }
    Ok(Uncontended {
        leasehold,
        baselines,
        primitives,
        primitives_skipped,
        with_recorder,
        with_noop_recorder,
    })
}

#[derive(Debug, Serialize)]
pub struct PeerHandoff {
    pub name: &'static str,
    #[serde(flatten)]
    pub latency: Latency,
}

#[derive(Debug, Serialize)]
pub struct Handoff {
    /// One uncontended acquire (not release), for scale.
    pub acquire: Latency,
    /// One uncontended acquire after the pause each hand-off round makes
    /// before its release ([`WAITER_SETTLES`]): on an idle machine the
    /// first round trip after a pause pays for waking the store's thread
    /// and this one, which the back-to-back acquires above do not.
    pub paused_acquire: Latency,
    /// From the holder's release call to the waiter holding the lock: the
    /// release's own round trip, the wake-up, and the waiter's acquire.
    pub notified: Latency,
    /// The same, from the moment the release call returned.
    pub notified_after_release: Latency,
    pub polling: Latency,
    /// Other locks' hand-offs on the same store (blocking advisory lock, rslock).
    pub peers: Vec<PeerHandoff>,
    /// notified p50 / acquire p50 (target ≤ 3).
    pub notified_p50_per_acquire: f64,
    /// notified p50 / paused acquire p50: like for like.
    pub notified_p50_per_paused_acquire: f64,
    /// notified_after_release p50 / acquire p50.
    pub notified_after_release_p50_per_acquire: f64,
    /// With `with_fair(true)`: the waiter queued at the store, and the
    /// release handed the key to it (no acquire of its own after the
    /// wake-up); absent where the store keeps no queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fair: Option<Latency>,
    /// fair p50 / acquire p50 (target ≤ 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fair_p50_per_acquire: Option<f64>,
    /// fair p50 / paused acquire p50.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fair_p50_per_paused_acquire: Option<f64>,
    /// polling p50 / notified p50 (target ≥ 10).
    pub polling_p50_per_notified: f64,
}

/// Time from the holder's release call to the waiter holding the lock. The
/// waiter is another client (its own data connection on Redis and
/// MongoDB; on PostgreSQL at the defaults both share the process's one
/// connection); on PostgreSQL and Redis it shares the process's listener
/// with the holder, as two `Locks` in one process do, so the holder's
/// release wakes it directly; once woken, once polling only.
pub async fn handoff(
    store: &BenchStore,
    rounds: usize,
    samples: &mut Vec<(&'static str, Vec<Duration>)>,
) -> Result<Handoff, CliError> {
    let holder = store.client().await?;
    let waiter = store.client().await?;
    let poller = Locks::from_arc(Arc::new(PollingOnly::new(
        store.client().await?.backend().clone(),
    )));

    let acquire = timed_acquires(&holder, rounds, Duration::ZERO).await?;
    let paused_acquire = timed_acquires(&holder, rounds, WAITER_SETTLES).await?;
    let racing = AcquireOptions::new().with_wait(Duration::from_secs(30));
    let fair = racing.clone().with_fair(true);
    let (notified, notified_after) = handoff_rounds(&holder, &waiter, &racing, rounds).await?;
    let fair = match waiter.backend().queues() {
        true => Some(Latency::of(
            &handoff_rounds(&holder, &waiter, &fair, rounds).await?.0,
        )),
        false => None,
    };
    let (polling, _) = handoff_rounds(&holder, &poller, &racing, rounds).await?;
    let after = Latency::of(&notified_after);
    let (a, n, p) = (
        Latency::of(&acquire),
        Latency::of(&notified),
        Latency::of(&polling),
    );
    let paused = Latency::of(&paused_acquire);
    samples.push(("hand-off notified", notified));
    samples.push(("hand-off polling", polling));
    let mut peers = Vec::new();
    for peer in &store.handoff_peers {
        let s = peer.handoffs(rounds).await?;
        peers.push(PeerHandoff {
            name: peer.name(),
            latency: Latency::of(&s),
        });
        samples.push((peer.name(), s));
    }
    Ok(Handoff {
        fair_p50_per_acquire: fair.as_ref().map(|r| ratio(r.p50_us, a.p50_us)),
        fair_p50_per_paused_acquire: fair.as_ref().map(|r| ratio(r.p50_us, paused.p50_us)),
        notified_p50_per_paused_acquire: ratio(n.p50_us, paused.p50_us),
        fair,
        peers,
        notified_p50_per_acquire: ratio(n.p50_us, a.p50_us),
        notified_after_release_p50_per_acquire: ratio(after.p50_us, a.p50_us),
        notified_after_release: after,
        polling_p50_per_notified: ratio(p.p50_us, n.p50_us),
        acquire: a,
        paused_acquire: paused,
        notified: n,
        polling: p,
    })
}

/// `rounds` uncontended acquires (each released), each after `pause`.
async fn timed_acquires(
    locks: &Locks,
    rounds: usize,
    pause: Duration,
) -> Result<Vec<Duration>, CliError> {
    let key = unique_key("acquire");
    let mut out = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let t = Instant::now();
        let guard = locks.try_acquire(&key).await?;
        out.push(t.elapsed());
        guard.release().await?;
    }
    Ok(out)
}

/// How long a hand-off round waits before the release: long enough for
/// the waiter to find the key busy and go to sleep.
const WAITER_SETTLES: Duration = Duration::from_millis(15);

async fn handoff_rounds(
    holder: &Locks,
    waiter: &Locks,
    wait: &AcquireOptions,
    rounds: usize,
) -> Result<(Vec<Duration>, Vec<Duration>), CliError> {
    let key = unique_key("handoff");
    let mut out = Vec::with_capacity(rounds);
    let mut after_release = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let guard = holder.try_acquire(&key).await?;
        let (w, k, wait) = (waiter.clone(), key.clone(), wait.clone());
        let task = tokio::spawn(async move {
            let g = w.acquire_with(&k, &wait).await?;
            let at = Instant::now();
            g.release().await?;
            Ok::<_, leasehold::Error>(at)
        });
        tokio::time::sleep(WAITER_SETTLES).await;
        let released = Instant::now();
        guard.release().await?;
        let release_returned = Instant::now();
        let acquired = task
            .await
            .map_err(|e| CliError::new(crate::exit::EX_SOFTWARE, e.to_string()))??;
        out.push(acquired.saturating_duration_since(released));
        after_release.push(acquired.saturating_duration_since(release_returned));
    }
    Ok((out, after_release))
}

#[derive(Debug, Serialize)]
pub struct Throughput {
    pub acquisitions: u64,
    pub per_second: f64,
    pub per_worker: Vec<u64>,
    pub jain_index: f64,
    pub longest_wait_ms: f64,
    /// How close the grants came to first come, first served (leasehold's
    /// rows; the raw loop keeps no order).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<Order>,
}

#[derive(Debug, Serialize)]
pub struct Contended {
    /// Waiters in all.
    pub workers: usize,
    /// OS processes they ran in (each its own connection), if not tasks of
    /// this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<usize>,
    pub duration_ms: u128,
    /// Waiters as they wait by default: each process's waiters line up
    /// locally and race the others at each release.
    pub leasehold: Throughput,
    /// The same waiters with `with_fair(true)`: queued at the store, each
    /// release handing the key to the first of them (docs/fairness.md);
    /// absent where the store keeps no queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fair: Option<Throughput>,
    /// The same atomic operations in a tight loop with no library around
    /// them (each worker retries at once when busy); absent without a baseline.
    pub raw_loop: Option<Throughput>,
    /// leasehold acquisitions/s divided by the raw loop's (target ≥ 0.8).
    pub ratio_to_raw: Option<f64>,
}

/// W workers on one key for `duration`: how many acquisitions, how fairly
/// shared, in what order, and the longest any worker waited; racing, and
/// queued too where the store keeps queues.
pub async fn contended(
    store: &BenchStore,
    locks: &Locks,
    workers: usize,
    duration: Duration,
) -> Result<Contended, CliError> {
    let leasehold = contended_tasks(locks, workers, duration, false).await?;
    let fair = match locks.backend().queues() {
        true => Some(contended_tasks(locks, workers, duration, true).await?),
        false => None,
    };
    let raw_loop = match store.baselines.first() {
        None => None,
        Some(_) => Some(raw_contended(store, workers, duration).await?),
    };
    Ok(Contended {
        workers,
        processes: None,
        duration_ms: duration.as_millis(),
        ratio_to_raw: raw_loop
            .as_ref()
            .map(|r| ratio(leasehold.per_second, r.per_second)),
        leasehold,
        fair,
        raw_loop,
    })
}

/// `workers` tasks of this process on one fresh key, queued or racing.
async fn contended_tasks(
    locks: &Locks,
    workers: usize,
    duration: Duration,
    fair: bool,
) -> Result<Throughput, CliError> {
    let key = unique_key(if fair { "contended-fair" } else { "contended" });
    let before = locks.stats();
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (locks, key) = (locks.clone(), key.clone());
            tokio::spawn(async move { wait_in_turn(&locks, &key, deadline, fair).await })
        })
        .collect();
    let mut runs = Vec::with_capacity(workers);
    for t in tasks {
        runs.push(
            t.await
                .map_err(|e| CliError::new(crate::exit::EX_SOFTWARE, e.to_string()))??,
        );
    }
    let after = locks.stats();
    Ok(summarize(runs, duration, Counted::between(&before, &after)))
}

/// The throughput and order of the waiters' `runs`, with what their
/// `Locks` `counted` (requests, wake-ups, hand-offs).
pub fn summarize(runs: Vec<WaiterRun>, duration: Duration, counted: Counted) -> Throughput {
    let waiters = runs.len();
    let per_worker = runs.iter().map(|r| r.grants.len() as u64).collect();
    let longest = Duration::from_micros(runs.iter().map(|r| r.longest_wait_us).max().unwrap_or(0));
    let grants = runs.into_iter().flat_map(|r| r.grants).collect();
    let mut t = throughput(per_worker, longest, duration);
    t.order = Some(order(grants, waiters, duration, longest, counted));
    t
}

async fn raw_contended(
    store: &BenchStore,
    workers: usize,
    duration: Duration,
) -> Result<Throughput, CliError> {
    let key = unique_key("raw-contended");
    let deadline = Instant::now() + duration;
    let baseline = &store.baselines[0];
    let counts: Vec<AtomicU64> = (0..workers).map(|_| AtomicU64::new(0)).collect();
    let longest: Vec<AtomicU64> = (0..workers).map(|_| AtomicU64::new(0)).collect();
    let work = (0..workers).map(|i| {
        let (key, counts, longest) = (&key, &counts, &longest);
        async move {
            let mut waiting_since = Instant::now();
            while Instant::now() < deadline {
                match baseline.try_acquire(key).await? {
                    Some(held) => {
                        let waited = waiting_since.elapsed().as_micros() as u64;
                        longest[i].fetch_max(waited, Ordering::Relaxed);
                        baseline.release(held).await?;
                        counts[i].fetch_add(1, Ordering::Relaxed);
                        waiting_since = Instant::now();
                    }
                    None => tokio::task::yield_now().await,
                }
            }
            Ok::<_, CliError>(())
        }
    });
    for r in futures_util::future::join_all(work).await {
        r?;
    }
    let per_worker: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let longest_us = longest
        .iter()
        .map(|l| l.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    Ok(throughput(
        per_worker,
        Duration::from_micros(longest_us),
        duration,
    ))
}

async fn collect(
    tasks: Vec<tokio::task::JoinHandle<Result<(u64, Duration), leasehold::Error>>>,
    duration: Duration,
) -> Result<Throughput, CliError> {
    let mut per_worker = Vec::new();
    let mut longest = Duration::ZERO;
    for t in tasks {
        let (count, wait) = t
            .await
            .map_err(|e| CliError::new(crate::exit::EX_SOFTWARE, e.to_string()))??;
        per_worker.push(count);
        longest = longest.max(wait);
    }
    Ok(throughput(per_worker, longest, duration))
}

pub fn throughput(per_worker: Vec<u64>, longest: Duration, duration: Duration) -> Throughput {
    let acquisitions = per_worker.iter().sum();
    Throughput {
        acquisitions,
        per_second: acquisitions as f64 / duration.as_secs_f64(),
        jain_index: jain_index(&per_worker),
        per_worker,
        longest_wait_ms: longest.as_secs_f64() * 1e3,
        order: None,
    }
}

#[derive(Debug, Serialize)]
pub struct ScalePoint {
    pub workers: usize,
    pub per_second: f64,
}

#[derive(Debug, Serialize)]
pub struct Scale {
    pub keys: usize,
    pub points: Vec<ScalePoint>,
}

/// W workers (1 ..= max) on K distinct keys, each worker on its own key:
/// acquisitions/s per W, to show where the store rather than the library
/// becomes the limit.
pub async fn scale(locks: &Locks, max_workers: usize, step: Duration) -> Result<Scale, CliError> {
    let keys: Vec<String> = (0..max_workers).map(|_| unique_key("scale")).collect();
    let mut points = Vec::new();
    for w in 1..=max_workers {
        let deadline = Instant::now() + step;
        let tasks: Vec<_> = keys[..w]
            .iter()
            .map(|key| {
                let (locks, key) = (locks.clone(), key.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        locks.try_acquire(&key).await?.release().await?;
                        n += 1;
                    }
                    Ok::<_, leasehold::Error>((n, Duration::ZERO))
                })
            })
            .collect();
        let t = collect(tasks, step).await?;
        points.push(ScalePoint {
            workers: w,
            per_second: t.per_second,
        });
    }
    Ok(Scale {
        keys: max_workers,
        points,
    })
}

#[derive(Debug, Serialize)]
pub struct Renewal {
    pub leases: usize,
    pub ttl_ms: u128,
    pub duration_ms: u128,
    /// Renew operations the store served per second.
    pub renewals_per_second: f64,
    /// leases × 3 / ttl: one renewal per lease every ttl/3.
    pub expected_per_second: f64,
    /// Leases whose lost() fired during the run (should be 0).
    pub lost: usize,
}

/// How long the renewal scenario's setup waits for each of its leases.
const SETUP_WAIT: Duration = Duration::from_secs(30);

/// N held leases renewing themselves for `duration`: the store load that
/// renewal costs.
pub async fn renewal(
    store: &BenchStore,
    leases: usize,
    ttl: Duration,
    duration: Duration,
) -> Result<Renewal, CliError> {
    let counting = Arc::new(counting::Counting::new(
        store.client().await?.backend().clone(),
    ));
    let locks = Locks::from_arc(counting.clone());
    // The keys are fresh, so nobody holds them; the wait bound only keeps
    // a slow store's answer (the leases taken so far already renew on the
    // same connections) from tripping the core's 1 s backstop of a
    // zero-wait acquire.
    let opts = AcquireOptions::new().with_ttl(ttl).with_wait(SETUP_WAIT);
    let mut guards = Vec::with_capacity(leases);
    for _ in 0..leases {
        guards.push(locks.acquire_with(&unique_key("renewal"), &opts).await?);
    }
    let before = counting.renewals();
    tokio::time::sleep(duration).await;
    let renewals = counting.renewals() - before;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    for g in guards {
        g.release().await?;
    }
    Ok(Renewal {
        leases,
        ttl_ms: ttl.as_millis(),
        duration_ms: duration.as_millis(),
        renewals_per_second: renewals as f64 / duration.as_secs_f64(),
        expected_per_second: leases as f64 * 3.0 / ttl.as_secs_f64(),
        lost,
    })
}

mod counting {
    //! A store wrapper that counts renewals.

    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::future::BoxFuture;
    use leasehold::backends::decorator::Decorator;
    use leasehold::{Backend, Lease};

    #[derive(Debug)]
    pub struct Counting {
        inner: Arc<dyn Backend>,
        renewals: AtomicU64,
    }

    impl Counting {
        pub fn new(inner: Arc<dyn Backend>) -> Self {
            Counting {
                inner,
                renewals: AtomicU64::new(0),
            }
        }
        pub fn renewals(&self) -> u64 {
            self.renewals.load(Ordering::Relaxed)
        }
    }

    impl Decorator for Counting {
        fn inner(&self) -> &dyn Backend {
            self.inner.as_ref()
        }
        fn renew<'a>(
            &'a self,
            l: &'a Lease,
            t: Duration,
        ) -> BoxFuture<'a, leasehold::Result<bool>> {
            self.renewals.fetch_add(1, Ordering::Relaxed);
            self.inner.renew(l, t)
        }
    }
}
