//! Storage bounded by the keys in use: acquires and releases many distinct
//! keys once each (a lock per order), counts the store's records, then
//! keeps one other key busy until the idle window has passed and counts
//! again; finally re-acquires a sample of the keys and checks that each
//! token is above the one the key had before its record was deleted.
//!
//! ```sh
//! cargo run --release -p leasehold --all-features --example idle_keys -- 100000 2s
//! cargo run --release -p leasehold --all-features --example idle_keys -- 100000 1m redis://127.0.0.1:6379
//! cargo run --release -p leasehold --all-features --example idle_keys -- 100000 1m postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! Arguments: the number of keys (default 100000), the idle window
//! (default 2s; `ms`, `s`, `m` or `h`) and the store: `sqlite://PATH`
//! (default: a file in a fresh temporary directory), `postgres://…`,
//! `redis://…` or `memory://`. On a shared server the run's keys carry a
//! name of their own (PostgreSQL) or a store prefix of their own (Redis),
//! and only those are counted.

use std::time::{Duration, Instant};

use leasehold::backends::memory::MemoryBackend;
use leasehold::Locks;

type BoxError = Box<dyn std::error::Error>;

/// Where the records are counted.
enum Records {
    Memory(MemoryBackend),
    Sqlite(sqlx::SqlitePool, String),
    Postgres(sqlx::PgPool, String),
    Redis(redis::aio::MultiplexedConnection, String),
}

impl Records {
    async fn count(&mut self) -> Result<i64, BoxError> {
        Ok(match self {
            Records::Memory(store) => i64::try_from(store.record_count())?,
            Records::Sqlite(pool, query) => sqlx::query_scalar(query).fetch_one(&*pool).await?,
            Records::Postgres(pool, query) => sqlx::query_scalar(query).fetch_one(&*pool).await?,
            Records::Redis(conn, pattern) => {
                let (mut cursor, mut n) = (0_u64, 0);
                loop {
                    let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern.as_str())
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(conn)
                        .await?;
                    n += i64::try_from(batch.len())?;
                    if next == 0 {
                        break n;
                    }
                    cursor = next;
                }
            }
        })
    }
}

/// The store's `Locks`, what counts its records, and the prefix of the
/// run's key names.
async fn open(url: &str, window: Duration) -> Result<(Locks, Records, String), BoxError> {
    let run = format!("idle-keys-{}", std::process::id());
    let window_ms = window.as_millis();
    let join = if url.contains('?') { '&' } else { '?' };
    if url == "memory://" {
        let store = MemoryBackend::new().with_idle_window(Some(window))?;
        return Ok((
            Locks::new(store.clone()),
            Records::Memory(store),
            String::new(),
        ));
    }
    if let Some(path) = url.strip_prefix("sqlite://") {
        let locks = Locks::open(&format!("{url}{join}idle_window={window_ms}ms")).await?;
        let pool = sqlx::SqlitePool::connect(&format!("sqlite://{path}")).await?;
        let query = "SELECT count(*) FROM leasehold_locks".to_owned();
        return Ok((locks, Records::Sqlite(pool, query), String::new()));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let locks = Locks::open(&format!("{url}{join}idle_window={window_ms}ms")).await?;
        let pool = sqlx::PgPool::connect(url).await?;
        let query = format!("SELECT count(*) FROM leasehold_locks WHERE key LIKE '{run}/%'");
        return Ok((locks, Records::Postgres(pool, query), format!("{run}/")));
    }
    if url.starts_with("redis://") {
        let locks = Locks::open(&format!(
            "{url}{join}idle_window={window_ms}ms&prefix={run}"
        ))
        .await?;
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        return Ok((
            locks,
            Records::Redis(conn, format!("{run}:*")),
            String::new(),
        ));
    }
    Err(format!(
        "idle_keys counts records on sqlite://, postgres://, redis:// and memory://, not {url:?}"
    )
    .into())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let keys: usize = match args.next() {
        Some(n) => n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("keys must be a positive whole number, got {n:?}"))?,
        None => 100_000,
    };
    let window = leasehold::backend::parse_idle_window(&args.next().unwrap_or("2s".into()))?
        .ok_or("the idle window must be a duration here, not never")?;
    let dir = tempfile::tempdir()?;
    let url = args
        .next()
        .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("locks.db").to_string_lossy()));
    let (locks, mut records, names) = open(&url, window).await?;
    let ttl = Duration::from_secs(30);
    let key = |i: usize| format!("{names}order/{i}");

    let start = Instant::now();
    let mut sample = Vec::new();
    for i in 0..keys {
        let guard = locks.acquire(&key(i), ttl).await?;
        if i % (keys / 100).max(1) == 0 {
            sample.push((i, guard.token()));
        }
        guard.release().await?;
    }
    let took = start.elapsed();
    println!(
        "{keys} keys acquired and released once in {:.1} s: {} records",
        took.as_secs_f64(),
        records.count().await?
    );

    // One other key in use, so that releases keep coming (the stores that
    // sweep start a pass after a release; Redis needs none).
    let tick = key(keys);
    let idle_from = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        locks.acquire(&tick, ttl).await?.release().await?;
        let left = records.count().await?;
        if left <= 3 {
            println!(
                "{left} records left {:.1} s after the last release (idle window {window:?}; the key in use keeps its own)",
                idle_from.elapsed().as_secs_f64()
            );
            break;
        }
        if idle_from.elapsed() > window * 4 + Duration::from_secs(60) {
            return Err(format!("{left} records still there").into());
        }
    }

    let mut lower = 0;
    for (i, before) in &sample {
        let guard = locks.acquire(&key(*i), ttl).await?;
        if guard.token() <= *before {
            lower += 1;
        }
        guard.release().await?;
    }
    println!(
        "{} sampled keys re-acquired: {lower} with a token at or below their earlier one",
        sample.len()
    );
    locks.close().await;
    if lower > 0 {
        return Err("tokens went backwards".into());
    }
    Ok(())
}
