//! PostgreSQL: the two statements a careful hand-written lock issues (the
//! library's, written again here, in a table of the baseline's own) on the
//! library's own pool, session advisory locks (`pg_try_advisory_lock` +
//! unlock), and the blocking `pg_advisory_lock` hand-off.
//!
//! Behind a transaction-mode pooler (`?pooler=transaction&listen_url=...`)
//! the first baseline is leasehold itself on a direct connection to the
//! server (the listen URL), so one run shows what the pooler costs; the
//! hand-written and advisory baselines also run directly (advisory locks
//! belong to a session, which a transaction pooler does not keep).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use leasehold::backends::postgres::{parse_store_url, Pooler, PostgresBackend, PostgresOptions};
use leasehold::Locks;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::statements::TwoStatements;
use super::{
    baseline_error, timed_handoff, Baseline, HandoffPeer, Held, LeaseholdBaseline, Measured,
};
use crate::exit::CliError;
use crate::sql::SqlDb;

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS leasehold_bench_baseline (
    key TEXT COLLATE \"C\" PRIMARY KEY,
    fence BIGINT NOT NULL,
    owner TEXT,
    holder TEXT,
    expires_at TIMESTAMPTZ
)";

/// Takes the key if it is new, free or expired and returns the new fence,
/// or else the holder and its remaining ms: one round trip either way. The
/// expiry is computed once the row lock is held, and a row another
/// transaction keeps locked is waited for at most `$5` ms (a setting that
/// ends with the statement). Parameters: key, owner, holder, ttl ms, lock
/// wait ms as text.
const ACQUIRE: &str = "WITH granted AS ( \
       INSERT INTO leasehold_bench_baseline AS l (key, fence, owner, holder, expires_at) \
       SELECT $1, 1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond' \
       FROM (SELECT set_config('lock_timeout', $5, true)) AS bounded \
       ON CONFLICT (key) DO UPDATE SET fence = l.fence + 1, owner = excluded.owner, \
         holder = excluded.holder, \
         expires_at = clock_timestamp() + $4 * interval '1 millisecond' \
       WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() \
       RETURNING l.fence) \
     SELECT fence, NULL::text AS holder, NULL::bigint AS remaining_ms FROM granted \
     UNION ALL \
     SELECT NULL::bigint, holder, \
       ceil(extract(epoch FROM (expires_at - clock_timestamp())) * 1000)::bigint \
       FROM leasehold_bench_baseline \
      WHERE key = $1 AND owner IS NOT NULL AND NOT EXISTS (SELECT FROM granted)";

/// Frees the key if owner and fence still match, and announces it to
/// waiters in the same statement. Parameters: key, owner, fence.
const RELEASE: &str = "WITH freed AS ( \
       UPDATE leasehold_bench_baseline SET owner = NULL, holder = NULL, expires_at = NULL \
       WHERE key = $1 AND owner = $2 AND fence = $3 RETURNING key) \
     SELECT pg_notify('leasehold_bench_baseline', key) FROM freed";

/// How long the acquisition waits for another transaction's row lock: the
/// library's try-once bound.
const LOCK_WAIT_MS: &str = "50";

pub async fn open(url: &str) -> Result<Measured, CliError> {
    let (_, options) =
        parse_store_url(url, PostgresOptions::new()).map_err(|e| CliError::usage(e.to_string()))?;
    if options.pooler() == Pooler::Transaction {
        return open_pooled(url, options.listen_url()).await;
    }
    let backend = PostgresBackend::connect_with(url, baseline_options()).await?;
    baselines(backend, None).await
}

/// The baselines share the backend's pool and one of them keeps a session,
/// so it gets more than the lock client's default of one connection (a
/// `max_connections` in the URL still wins).
fn baseline_options() -> PostgresOptions {
    PostgresOptions::new().with_max_connections(4)
}

/// leasehold through the pooler, measured against leasehold (and the other
/// baselines) on a direct connection to the server at `direct`.
async fn open_pooled(url: &str, direct: Option<&str>) -> Result<Measured, CliError> {
    let pooled = PostgresBackend::connect(url).await?;
    let Some(direct) = direct else {
        eprintln!(
            "leasehold: behind a transaction pooler without listen_url there is no direct \
             connection to compare with; reporting leasehold alone"
        );
        return Ok(Measured::alone(Locks::new(pooled)));
    };
    let direct = PostgresBackend::connect_with(direct, baseline_options()).await?;
    baselines(direct, Some(pooled)).await
}

/// The baselines on `backend`'s server; leasehold itself is measured on
/// `pooled` when given (and then on `backend` as the first baseline).
async fn baselines(
    backend: PostgresBackend,
    pooled: Option<PostgresBackend>,
) -> Result<Measured, CliError> {
    let pool = backend.pool().clone();
    sqlx::query(CREATE_TABLE)
        .execute(&pool)
        .await
        .map_err(baseline_error)?;
    let statements = TwoStatements {
        name: "two postgres statements by hand",
        db: SqlDb::from_postgres_pool(pool.clone()),
        acquire: ACQUIRE,
        release: RELEASE,
        lock_wait: Some(LOCK_WAIT_MS),
    };
    // Advisory locks belong to a session: keep one connection for them.
    let session = pool.acquire().await.map_err(baseline_error)?;
    let mut baselines: Vec<Box<dyn Baseline>> = vec![
        Box::new(statements),
        Box::new(Advisory {
            session: Mutex::new(session),
        }),
    ];
    let locks = match pooled {
        Some(pooled) => {
            baselines.insert(
                0,
                Box::new(LeaseholdBaseline::new(
                    "leasehold, direct to the server",
                    Locks::new(backend),
                )),
            );
            Locks::new(pooled)
        }
        None => Locks::new(backend),
    };
    Ok(Measured {
        locks,
        baselines,
        handoff_peers: vec![Box::new(BlockingAdvisory { pool })],
    })
}

/// The advisory-lock id of a key (advisory locks take a bigint).
fn lock_id(key: &str) -> i64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) as i64
}

struct Advisory {
    session: Mutex<PoolConnection<Postgres>>,
}

impl Baseline for Advisory {
    fn name(&self) -> &'static str {
        "pg_try_advisory_lock + unlock"
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
        Box::pin(async move {
            let mut session = self.session.lock().await;
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(lock_id(key))
                .fetch_one(&mut **session)
                .await
                .map_err(baseline_error)?;
            Ok(got.then(|| Held::key_only(key)))
        })
    }

    fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>> {
        Box::pin(async move {
            let mut session = self.session.lock().await;
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(lock_id(&held.key))
                .execute(&mut **session)
                .await
                .map_err(baseline_error)?;
            Ok(())
        })
    }
}

/// Two sessions: the holder's and a waiter blocked in `pg_advisory_lock`,
/// which the server wakes when the holder unlocks.
struct BlockingAdvisory {
    pool: PgPool,
}

impl HandoffPeer for BlockingAdvisory {
    fn name(&self) -> &'static str {
        "blocking pg_advisory_lock"
    }

    fn handoffs(&self, rounds: usize) -> BoxFuture<'_, Result<Vec<Duration>, CliError>> {
        Box::pin(async move {
            let id = lock_id(&super::super::keys::unique_key("advisory-handoff"));
            let mut holder = self.pool.acquire().await.map_err(baseline_error)?;
            let waiter = Arc::new(Mutex::new(
                self.pool.acquire().await.map_err(baseline_error)?,
            ));
            let mut out = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(id)
                    .execute(&mut *holder)
                    .await
                    .map_err(baseline_error)?;
                let w = waiter.clone();
                let task = tokio::spawn(async move {
                    let mut conn = w.lock().await;
                    sqlx::query("SELECT pg_advisory_lock($1)")
                        .bind(id)
                        .execute(&mut **conn)
                        .await?;
                    let at = Instant::now();
                    sqlx::query("SELECT pg_advisory_unlock($1)")
                        .bind(id)
                        .execute(&mut **conn)
                        .await?;
                    Ok::<_, sqlx::Error>(at)
                });
                let release = sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(id)
                    .execute(&mut *holder);
                out.push(timed_handoff(task, release).await?);
            }
            Ok(out)
        })
    }
}
