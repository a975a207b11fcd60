//! Redis: leasehold next to rslock (the Redlock client most Rust code uses)
//! and the raw pair written by hand (`SET NX PX`, then a compare-and-delete
//! script), on one server in one run.
//!
//!     LEASEHOLD_TEST_REDIS=redis://127.0.0.1:6379 cargo bench -p leasehold-benches --bench redis
//!
//! (append `-- uncontended` or `-- contended` for one part)
//!
//! Uncontended: acquire + release latency of one task, the variants
//! interleaved in rounds so a noisy neighbour slows all of them alike. Two
//! rows split leasehold's cost: its own two scripts sent by hand (the
//! server's share: the fence `INCR`, the `PUBLISH`) and its store adapter
//! without the guard (no renewal task).
//! Contended: 8 tasks on one key for a fixed time, each holding it for
//! about 1 ms, then working outside the lock for 0 or 1 ms; acquisitions
//! per second, hand-off latency (a release starts -> another task holds the
//! key), the longest wait and how evenly the tasks were served.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::{AcquireOptions, Backend, Key, Locks};
use redis::aio::MultiplexedConnection;
use rslock::LockManager;

const ROUNDS: usize = 40;
const PER_ROUND: usize = 250;
const TASKS: usize = 8;
const CONTENDED_FOR: Duration = Duration::from_secs(5);
const HOLD: Duration = Duration::from_millis(1);
const THINK: [Duration; 2] = [Duration::ZERO, Duration::from_millis(1)];
const TTL: Duration = Duration::from_secs(10);

/// The compare-and-delete everyone writes (rslock's own is the same).
const UNLOCK: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
else
  return 0
end
"#;

/// leasehold's own scripts, to send by hand.
const ACQUIRE: &str = include_str!("../../crates/leasehold/src/backends/redis/acquire.lua");
const RELEASE: &str = include_str!("../../crates/leasehold/src/backends/redis/release.lua");

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Variant {
    Raw,
    RawFenced,
    Backend,
    Leasehold,
    Rslock,
}

impl Variant {
    const ALL: [Variant; 5] = [
        Variant::Raw,
        Variant::RawFenced,
        Variant::Backend,
        Variant::Leasehold,
        Variant::Rslock,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw SET NX PX + EVALSHA del",
            Variant::RawFenced => "leasehold's scripts by hand",
            Variant::Backend => "leasehold store, no guard",
            Variant::Leasehold => "leasehold",
            Variant::Rslock => "rslock 0.10",
        }
    }
}

struct Clients {
    locks: Locks,
    backend: RedisBackend,
    rslock: LockManager,
    raw: MultiplexedConnection,
    unlock: redis::Script,
    acquire_script: redis::Script,
    release_script: redis::Script,
    /// Unique per run, so runs and other users of the server never meet.
    tag: String,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // cargo bench --list
    }
    // `cargo bench --bench redis -- uncontended` runs only that part.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |part: &str| filter.is_empty() || filter.iter().any(|f| f == part);
    let url = std::env::var("LEASEHOLD_TEST_REDIS")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let tag = format!("bench-{:08x}", rand::random::<u32>());
    let sep = if url.contains('?') { '&' } else { '?' };
    let backend = RedisBackend::connect_with(&url, RedisOptions::new().with_prefix(&tag))
        .await
        .expect("leasehold connects");
    let clients = Clients {
        locks: Locks::open(&format!("{url}{sep}prefix={tag}"))
            .await
            .expect("leasehold connects"),
        backend,
        rslock: LockManager::new(vec![url.as_str()]),
        raw: redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("redis connects"),
        unlock: redis::Script::new(UNLOCK),
        acquire_script: redis::Script::new(ACQUIRE),
        release_script: redis::Script::new(RELEASE),
        tag,
    };
    println!("redis at {url}; {ROUNDS} rounds x {PER_ROUND} per variant, interleaved\n");
    if wanted("uncontended") {
        uncontended(&clients).await;
    }
    for think in THINK.into_iter().filter(|_| wanted("contended")) {
        println!();
        println!(
            "{TASKS} tasks on one key for {CONTENDED_FOR:?}: hold {HOLD:?}, then {think:?} \
             outside the lock"
        );
        println!(
            "{:<12} {:>9} {:>9} {:>10} {:>10} {:>10} {:>11}",
            "", "acq/s", "hand-offs", "h-o p50", "h-o p99", "wait max", "per task"
        );
        for v in [Variant::Leasehold, Variant::Rslock] {
            contended(&clients, v, think).await.print(v.name());
        }
    }
}

async fn once(c: &Clients, variant: Variant) {
    match variant {
        Variant::Raw => {
            let key = format!("{}:raw", c.tag);
            let owner = format!("{:032x}", rand::random::<u128>());
            let mut conn = c.raw.clone();
            let set: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(set.is_some(), "uncontended key is free");
            let freed: i64 = c
                .unlock
                .key(&key)
                .arg(&owner)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(freed, 1);
        }
        Variant::RawFenced => {
            let (lock, fence) = (format!("{}:lock", c.tag), format!("{}:fence", c.tag));
            let owner = format!("{:032x}", rand::random::<u128>());
            let mut conn = c.raw.clone();
            let (token, _, _): (u64, String, i64) = c
                .acquire_script
                .key(&lock)
                .key(&fence)
                .arg(&owner)
                .arg(TTL.as_millis() as u64)
                .arg("bench")
                .invoke_async(&mut conn)
                .await
                .unwrap();
            assert!(token > 0, "uncontended key is free");
            let freed: i64 = c
                .release_script
                .key(&lock)
                .key(&fence)
                .arg(&owner)
                .arg(token)
                .arg(format!("{}:released", c.tag))
                .arg("uncontended")
                .invoke_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(freed, 1);
        }
        Variant::Backend => {
            let key = Key::new("uncontended-backend").unwrap();
            let req = AcquireRequest::new(key, TTL, "bench").unwrap();
            let Acquire::Granted(lease) = c.backend.try_acquire(&req).await.unwrap() else {
                panic!("uncontended key is free");
            };
            c.backend.release(&lease).await.unwrap();
        }
        Variant::Leasehold => {
            let guard = c.locks.try_acquire("uncontended").await.unwrap();
            guard.release().await.unwrap();
        }
        Variant::Rslock => {
            let key = format!("{}:rslock", c.tag);
            let lock = c.rslock.lock(key.as_str(), TTL).await.unwrap();
            c.rslock.unlock(&lock).await;
        }
    }
}

async fn uncontended(c: &Clients) {
    let variants = Variant::ALL;
    let mut samples: HashMap<Variant, Vec<Duration>> = HashMap::new();
    // Per round, each variant's median over the raw pair's median in the
    // same round: paired under the same load, so the ratio survives
    // neighbours that slow every variant for a while.
    let mut ratios: HashMap<Variant, Vec<f64>> = HashMap::new();
    let mut switches: HashMap<Variant, u64> = HashMap::new();
    for v in variants {
        for _ in 0..PER_ROUND {
            once(c, v).await; // warm-up: connections, scripts, allocator
        }
    }
    for round in 0..ROUNDS {
        let mut medians = HashMap::new();
        // Rotate the order so no variant always runs first in a round.
        for i in 0..variants.len() {
            let v = variants[(i + round) % variants.len()];
            let mut this_round = Vec::with_capacity(PER_ROUND);
            let before = context_switches();
            for _ in 0..PER_ROUND {
                let t = Instant::now();
                once(c, v).await;
                this_round.push(t.elapsed());
            }
            *switches.entry(v).or_default() += context_switches() - before;
            samples.entry(v).or_default().extend(&this_round);
            medians.insert(v, pct(&mut this_round, 0.5).as_secs_f64());
        }
        for v in variants {
            ratios
                .entry(v)
                .or_default()
                .push(medians[&v] / medians[&Variant::Raw]);
        }
    }
    println!("uncontended acquire + release, one task");
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "", "p50", "mean", "p99", "vs raw", "switches/op"
    );
    for v in variants {
        let s = samples.get_mut(&v).unwrap();
        let mean = s.iter().sum::<Duration>() / s.len() as u32;
        let r = ratios.get_mut(&v).unwrap();
        r.sort_unstable_by(f64::total_cmp);
        println!(
            "{:<28} {:>10} {:>10} {:>10} {:>9.2}x {:>12.1}",
            v.name(),
            us(pct(s, 0.5)),
            us(mean),
            us(pct(s, 0.99)),
            r[r.len() / 2],
            switches[&v] as f64 / (ROUNDS * PER_ROUND) as f64
        );
    }
}

/// Who held the key last, and when they started to let go.
#[derive(Default)]
struct Baton {
    holder: Option<usize>,
    released_at: Option<Instant>,
}

#[derive(Default)]
struct Contended {
    per_task: Vec<usize>,
    handoffs: Vec<Duration>,
    waits: Vec<Duration>,
}

async fn contended(c: &Clients, variant: Variant, think: Duration) -> Contended {
    let key = format!("{}:contended-{}", c.tag, think.as_millis());
    let baton = Arc::new(Mutex::new(Baton::default()));
    let stop_at = Instant::now() + CONTENDED_FOR;
    let tasks: Vec<_> = (0..TASKS)
        .map(|id| {
            let (locks, rl, key, baton) = (
                c.locks.clone(),
                c.rslock.clone(),
                key.clone(),
                baton.clone(),
            );
            tokio::spawn(async move {
                let mut mine = Contended::default();
                let mut acquired = 0;
                let options = AcquireOptions::new()
                    .with_ttl(TTL)
                    .with_wait(Duration::from_secs(60));
                while Instant::now() < stop_at {
                    let asked = Instant::now();
                    // Either holds the key until the matching release below.
                    let (guard, lock) = match variant {
                        Variant::Leasehold => (
                            Some(locks.acquire_with(&key, &options).await.unwrap()),
                            None,
                        ),
                        // rslock's own loop: up to 3 tries 0-200 ms apart,
                        // again and again until one succeeds.
                        _ => (
                            None,
                            Some(rl.acquire_no_guard(key.as_str(), TTL).await.unwrap()),
                        ),
                    };
                    let got = Instant::now();
                    mine.waits.push(got - asked);
                    {
                        let mut b = baton.lock().unwrap();
                        if let (Some(prev), Some(at)) = (b.holder, b.released_at) {
                            if prev != id {
                                mine.handoffs.push(got - at);
                            }
                        }
                        b.holder = Some(id);
                        b.released_at = None;
                    }
                    acquired += 1;
                    tokio::time::sleep(HOLD).await;
                    baton.lock().unwrap().released_at = Some(Instant::now());
                    match (guard, lock) {
                        (Some(g), _) => g.release().await.unwrap(),
                        (_, Some(l)) => rl.unlock(&l).await,
                        _ => unreachable!(),
                    }
                    if !think.is_zero() {
                        tokio::time::sleep(think).await;
                    }
                }
                mine.per_task.push(acquired);
                mine
            })
        })
        .collect();
    let mut all = Contended::default();
    for t in tasks {
        let mine = t.await.unwrap();
        all.per_task.extend(mine.per_task);
        all.handoffs.extend(mine.handoffs);
        all.waits.extend(mine.waits);
    }
    all
}

impl Contended {
    fn print(mut self, name: &str) {
        let total: usize = self.per_task.iter().sum();
        let (lo, hi) = (
            self.per_task.iter().min().unwrap(),
            self.per_task.iter().max().unwrap(),
        );
        println!(
            "{:<12} {:>9.0} {:>9} {:>10} {:>10} {:>10} {:>11}",
            name,
            total as f64 / CONTENDED_FOR.as_secs_f64(),
            self.handoffs.len(),
            us(pct(&mut self.handoffs, 0.5)),
            us(pct(&mut self.handoffs, 0.99)),
            us(pct(&mut self.waits, 1.0)),
            format!("{lo}..{hi}"),
        );
    }
}

/// Context switches of all this process's threads so far (Linux; 0
/// elsewhere): on a loopback round trip the time goes to thread wake-ups,
/// not to code, so this says where a variant's extra time goes.
fn context_switches() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Nearest-rank percentile (sorts in place); zero for no samples.
fn pct(samples: &mut [Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

fn us(d: Duration) -> String {
    if d >= Duration::from_millis(10) {
        format!("{:.0} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    }
}
