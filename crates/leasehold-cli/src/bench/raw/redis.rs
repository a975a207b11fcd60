//! Redis: the pair everyone writes by hand (`SET NX PX`, then a Lua
//! compare-and-delete), the same pair on a plain blocking connection (the
//! floor: two round trips and nothing else), and rslock, the Redlock client
//! most Rust code uses (lock + unlock, and its retry loop for the
//! hand-off). On a Redis Cluster only the hand-written pair: rslock cannot
//! talk to one, and the blocking floor is one server's.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;
use leasehold::backends::redis::{Connection, RedisOptions};
use leasehold::scheme::{Scheme, StoreUrl};
use leasehold::{Locks, OwnerId};
use rslock::LockManager;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{
    baseline_error, timed_handoff, Baseline, HandoffPeer, Held, LeaseholdBaseline, Measured,
};
use crate::exit::CliError;

const TTL: Duration = Duration::from_secs(30);

/// The compare-and-delete of the hand-written version (rslock's is the same).
const UNLOCK: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end"#;

pub async fn open(url: &str, parsed: &StoreUrl) -> Result<Measured, CliError> {
    let locks = Locks::open(url).await?;
    // Without leasehold's own options (`prefix`); the redis crate rejects them.
    let plain = parsed.driver_url();
    let conn = Connection::open(plain, &RedisOptions::default())
        .await
        .map_err(baseline_error)?;
    let raw_pair = RawPair {
        conn,
        unlock: redis::Script::new(UNLOCK),
    };
    // rslock runs Redlock over independent single servers: it has no
    // cluster client, so on a cluster the hand-written pair is the baseline.
    if Scheme::names_a_cluster(plain) {
        eprintln!("leasehold: rslock has no Redis Cluster client; its rows are left out");
        return Ok(Measured::with_baseline(locks, raw_pair));
    }
    let rslock = LockManager::new(vec![plain]);
    Ok(Measured {
        locks,
        baselines: vec![
            Box::new(raw_pair),
            Box::new(BlockingPair::open(plain)?),
            Box::new(managed_locks(plain, parsed).await?),
            Box::new(Rslock {
                manager: rslock.clone(),
                held: Mutex::default(),
            }),
        ],
        handoff_peers: vec![Box::new(RslockHandoff { manager: rslock })],
    })
}

/// The hand-written lock: `SET key owner NX PX ttl` for a fresh owner,
/// which `send` puts on its connection; held when it was set (the pair has
/// no fencing token).
async fn set_nx<F>(key: &str, send: impl FnOnce(redis::Cmd) -> F) -> Result<Option<Held>, CliError>
where
    F: Future<Output = redis::RedisResult<Option<String>>>,
{
    let owner = OwnerId::random().to_string();
    let mut cmd = redis::cmd("SET");
    cmd.arg(key)
        .arg(&owner)
        .arg("NX")
        .arg("PX")
        .arg(TTL.as_millis() as u64);
    let set = send(cmd).await.map_err(baseline_error)?;
    Ok(set.map(|_| Held {
        key: key.to_owned(),
        owner,
        token: 0,
    }))
}

/// The hand-written unlock of `held`: `unlock` (the compare-and-delete)
/// on its key for its owner, ready to run on either connection.
fn unlock_of<'s>(unlock: &'s redis::Script, held: &Held) -> redis::ScriptInvocation<'s> {
    let mut invocation = unlock.prepare_invoke();
    invocation.key(&held.key).arg(&held.owner);
    invocation
}

struct RawPair {
    /// One server or a cluster: each call names one key, so a cluster
    /// routes it to that key's primary.
    conn: Connection,
    unlock: redis::Script,
}

impl Baseline for RawPair {
    fn name(&self) -> &'static str {
        "SET NX PX + EVAL compare-and-delete"
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
        Box::pin(set_nx(key, move |cmd| async move {
            cmd.query_async(&mut self.conn.clone()).await
        }))
    }

    fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>> {
        Box::pin(async move {
            let _: i64 = unlock_of(&self.unlock, &held)
                .invoke_async(&mut self.conn.clone())
                .await
                .map_err(baseline_error)?;
            Ok(())
        })
    }
}

/// The floor: `SET NX PX` and the compare-and-delete on one blocking
/// `redis::Connection` (no runtime, no task, no channel), called inline.
/// It blocks the calling thread for its two round trips: fine for the
/// bench's sequential uncontended rounds, which are all it is used for.
struct BlockingPair {
    conn: std::sync::Mutex<redis::Connection>,
    unlock: redis::Script,
}

impl BlockingPair {
    fn open(url: &str) -> Result<BlockingPair, CliError> {
        use redis::IntoConnectionInfo;
        let info = url.into_connection_info().map_err(baseline_error)?;
        // As a careful hand-written client would: no Nagle delay, and a
        // bound on every read and write (a socket timeout: a blocking call
        // cannot be abandoned half-way).
        let tcp = info.tcp_settings().clone().set_nodelay(true);
        let info = info.set_tcp_settings(tcp);
        let client = redis::Client::open(info).map_err(baseline_error)?;
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .map_err(baseline_error)?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(baseline_error)?;
        conn.set_write_timeout(Some(Duration::from_secs(5)))
            .map_err(baseline_error)?;
        Ok(BlockingPair {
            conn: std::sync::Mutex::new(conn),
            unlock: redis::Script::new(UNLOCK),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, redis::Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Baseline for BlockingPair {
    fn name(&self) -> &'static str {
        "the same pair on a blocking connection (floor)"
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
        Box::pin(set_nx(key, |cmd| {
            std::future::ready(cmd.query(&mut *self.conn()))
        }))
    }

    fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>> {
        Box::pin(async move {
            let _: i64 = unlock_of(&self.unlock, &held)
                .invoke(&mut *self.conn())
                .map_err(baseline_error)?;
            Ok(())
        })
    }
}

/// leasehold on a redis-rs `ConnectionManager` (multiplexed: a driver task
/// sends every call and hands back its reply), which is how
/// `RedisBackend::connect` talked to one server before its own connections
/// and how `RedisBackend::from_manager` still does: the same library, the
/// connection path side by side.
async fn managed_locks(url: &str, parsed: &StoreUrl) -> Result<LeaseholdBaseline, CliError> {
    use leasehold::backends::redis::RedisBackend;
    let client = redis::Client::open(url).map_err(baseline_error)?;
    let manager = redis::aio::ConnectionManager::new(client.clone())
        .await
        .map_err(baseline_error)?;
    let mut options = RedisOptions::new().with_persistence_check(false);
    if let Some(prefix) = parsed.option("prefix") {
        options = options.with_prefix(prefix);
    }
    let backend = RedisBackend::from_manager_with(manager, client, options).await?;
    Ok(LeaseholdBaseline::new(
        "leasehold on a multiplexed ConnectionManager (the path before)",
        Locks::new(backend),
    ))
}

struct Rslock {
    manager: LockManager,
    /// rslock's unlock needs its `Lock` value back.
    held: Mutex<HashMap<String, rslock::Lock>>,
}

impl Baseline for Rslock {
    fn name(&self) -> &'static str {
        "rslock lock + unlock"
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
        Box::pin(async move {
            match self.manager.lock(key.as_bytes(), TTL).await {
                Ok(lock) => {
                    self.held.lock().await.insert(key.to_owned(), lock);
                    Ok(Some(Held::key_only(key)))
                }
                Err(rslock::LockError::Unavailable) => Ok(None),
                Err(e) => Err(baseline_error(format!("{e:?}"))),
            }
        })
    }

    fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>> {
        Box::pin(async move {
            if let Some(lock) = self.held.lock().await.remove(&held.key) {
                self.manager.unlock(&lock).await;
            }
            Ok(())
        })
    }
}

/// rslock waiting the way its users do: `lock` (3 tries, 0–200 ms apart),
/// again until it succeeds.
struct RslockHandoff {
    manager: LockManager,
}

impl HandoffPeer for RslockHandoff {
    fn name(&self) -> &'static str {
        "rslock retry loop"
    }

    fn handoffs(&self, rounds: usize) -> BoxFuture<'_, Result<Vec<Duration>, CliError>> {
        Box::pin(async move {
            let key = super::super::keys::unique_key("rslock-handoff");
            let mut out = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let holder = self
                    .manager
                    .lock(key.as_bytes(), TTL)
                    .await
                    .map_err(|e| baseline_error(format!("{e:?}")))?;
                let (manager, k) = (self.manager.clone(), key.clone());
                let waiter = tokio::spawn(async move {
                    loop {
                        if let Ok(lock) = manager.lock(k.as_bytes(), TTL).await {
                            let at = Instant::now();
                            manager.unlock(&lock).await;
                            return Ok::<_, Infallible>(at);
                        }
                    }
                });
                let release = async {
                    self.manager.unlock(&holder).await;
                    Ok::<_, Infallible>(())
                };
                out.push(timed_handoff(waiter, release).await?);
            }
            Ok(out)
        })
    }
}
