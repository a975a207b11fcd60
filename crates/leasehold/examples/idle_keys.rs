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
//! cargo run --release -p leasehold --all-features --example idle_keys -- 100000 1m mongodb://127.0.0.1:27017 semaphore
//! ```
//!
//! Arguments: the number of keys (default 100000), the idle window
//! (default 2s; `ms`, `s`, `m` or `h`), the store: `sqlite://PATH`
//! (default: a file in a fresh temporary directory), `postgres://…`,
//! `redis://…`, `mongodb://…`, `etcd://…` or `memory://`, and the kind of
//! lock per key: `mutex` (default) or `semaphore` (of 2 permits). On a
//! shared server the run's keys carry a name of their own (PostgreSQL), a
//! store prefix of their own (Redis, etcd) or a collection of their own
//! (MongoDB), and only those are counted.

use std::time::{Duration, Instant};

use leasehold::backends::etcd::{EtcdBackend, EtcdOptions};
use leasehold::backends::memory::MemoryBackend;
use leasehold::backends::mongodb::{MongoBackend, MongoOptions};
use leasehold::Locks;

type BoxError = Box<dyn std::error::Error>;

/// Where the records are counted.
enum Records {
    Memory(MemoryBackend),
    Sqlite(sqlx::SqlitePool, String),
    Postgres(sqlx::PgPool, String),
    Redis(redis::aio::MultiplexedConnection, String),
    Mongodb(MongoBackend),
    Etcd(EtcdBackend, String),
}

impl Records {
    async fn count(&mut self) -> Result<i64, BoxError> {
        Ok(match self {
            Records::Memory(store) => i64::try_from(store.record_count())?,
            Records::Sqlite(pool, query) => sqlx::query_scalar(query).fetch_one(&*pool).await?,
            Records::Postgres(pool, query) => sqlx::query_scalar(query).fetch_one(&*pool).await?,
            Records::Mongodb(store) => i64::try_from(
                store
                    .collection()
                    .count_documents(mongodb::bson::doc! {})
                    .await?,
            )?,
            Records::Etcd(store, prefix) => {
                let options = etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only();
                store
                    .client()
                    .kv_client()
                    .get(prefix.as_str(), Some(options))
                    .await?
                    .count()
            }
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
    if url.starts_with("mongodb://") {
        let store = MongoBackend::connect_with(
            url,
            MongoOptions::new()
                .with_collection(run.replace('-', "_"))
                .with_idle_window(Some(window)),
        )
        .await?;
        return Ok((
            Locks::new(store.clone()),
            Records::Mongodb(store),
            String::new(),
        ));
    }
    if url.starts_with("etcd://") {
        let prefix = format!("{run}/");
        let store = EtcdBackend::connect_with(
            url,
            EtcdOptions::new()
                .with_prefix(&prefix)
                .with_idle_window(Some(window)),
        )
        .await?;
        return Ok((
            Locks::new(store.clone()),
            Records::Etcd(store, prefix),
            String::new(),
        ));
    }
    Err(format!(
        "idle_keys counts records on sqlite://, postgres://, redis://, mongodb://, etcd:// and memory://, not {url:?}"
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
    let semaphore = match args.next().as_deref() {
        None | Some("mutex") => false,
        Some("semaphore") => true,
        Some(other) => return Err(format!("the kind is mutex or semaphore, not {other:?}").into()),
    };
    let (locks, mut records, names) = open(&url, window).await?;
    let ttl = Duration::from_secs(30);
    let key = |i: usize| format!("{names}order/{i}");
    let acquire = |key: String| {
        let locks = locks.clone();
        async move {
            if semaphore {
                locks.semaphore(&key, 2)?.acquire(ttl).await
            } else {
                locks.acquire(&key, ttl).await
            }
        }
    };

    let start = Instant::now();
    let mut sample = Vec::new();
    for i in 0..keys {
        let guard = acquire(key(i)).await?;
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
        acquire(tick.clone()).await?.release().await?;
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
        let guard = acquire(key(*i)).await?;
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
