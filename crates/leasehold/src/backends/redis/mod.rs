//! The Redis store (`redis://`, feature `redis`).
//!
//! Each operation is one Lua script (loaded once, called by SHA with
//! `EVALSHA`): acquire is `SET NX PX` plus `INCR` of a fence key that has no
//! ttl and is never deleted; renew checks owner and token, then `PEXPIRE`;
//! release compares and deletes, then `PUBLISH`es the key; force-release
//! deletes and bumps the fence. Redis expires the lock key itself (`PX`), so
//! the server's clock decides expiry.
//!
//! Lock and fence keys share a hash tag, so each script touches one cluster
//! slot (see `keys.rs` for the layout). The same engine runs on a Redis
//! Cluster (`redis+cluster://`, see `cluster.rs`): only the connection
//! differs. Waiters share a single pub/sub connection per server and prefix
//! in the process (every backend on the same URL; on a cluster, to the first
//! seed node), opened on the first wait and reopened if it drops.
//!
//! **Connection budget.** A backend holds one multiplexed connection for its
//! commands (concurrent operations pipeline on it; on a cluster, one per
//! node the cluster client talks to) and the process one pub/sub connection
//! per server and prefix once something waits: 2 per process for one
//! `Locks` on a single server.
//!
//! **Persistence.** The fence counter is only as durable as Redis's data.
//! Without AOF a restart reloads an older snapshot (or nothing), and tokens
//! handed out again may be lower than ones a fenced resource already saw.
//! Run with `appendonly yes` and `appendfsync always` for strict fencing;
//! `everysec` can lose the last second of grants on a host crash. The backend
//! checks on connect and warns when AOF is off or keys may be evicted.

mod cluster;
mod keys;
mod options;
mod semaphore;
mod wake;

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Client, RedisError, Script};

pub use cluster::Connection;

use crate::backend::{
    duration_to_millis, millis_to_duration, Acquire, AcquireRequest, Backend, BoxFuture, Busy,
    Lease, LeaseInfo, PermitInfo, RecordDecoder, Subscription,
};
use crate::error::{Error, Result};
use crate::key::Key;
use keys::Namespace;
pub use options::RedisOptions;

/// The name errors carry ([`Error::store`]).
const STORE: &str = "redis";

const SCRIPTS: [&str; 5] = [
    include_str!("acquire.lua"),
    include_str!("renew.lua"),
    include_str!("release.lua"),
    include_str!("force_release.lua"),
    include_str!("read.lua"),
];

struct Scripts {
    acquire: Script,
    renew: Script,
    release: Script,
    force_release: Script,
    read: Script,
}

/// Lock store in Redis. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Connection,
    /// The server the pub/sub connection goes to (on a cluster, the first
    /// seed node: a `PUBLISH` on any node reaches subscribers on all).
    client: Client,
    ns: Namespace,
    options: RedisOptions,
    scripts: Scripts,
    subscriber: OnceLock<Arc<crate::notifier::Notifier>>,
}

/// The subscribers of this process, one per server and channel.
static SUBSCRIBERS: crate::shared::Registry<crate::notifier::Notifier> =
    crate::shared::Registry::new();

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.inner.client.get_connection_info().addr())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connects to the server at `url` (`redis://[user:pass@]host[:port][/db]`
    /// or `redis+unix:///path`), or to the Redis Cluster whose seed nodes
    /// `redis+cluster://[user:pass@]host:port[,host:port...]` names, with
    /// default options.
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-made connection.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to the server at `url` with `options`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (before any I/O) for a malformed URL, a
    /// `rediss://` URL (TLS is not compiled in), a cluster URL naming a
    /// database other than 0, or bad options;
    /// [`Error::Unavailable`] if the server cannot be reached within about
    /// three connect timeouts.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-made connection.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        Self::connect_to(url, options)
            .await
            .map_err(|e| e.without_secrets_of(url))
    }

    async fn connect_to(url: &str, options: RedisOptions) -> Result<Self> {
        options.validate()?;
        if crate::scheme::Scheme::asks_for_tls(url) {
            return Err(Error::invalid(
                "store url",
                "TLS (rediss://) is not compiled into this build; connect with redis:// \
                 through a TLS proxy, or build a redis::Client with TLS and use \
                 RedisBackend::from_manager",
            ));
        }
        if crate::scheme::Scheme::names_a_cluster(url) {
            return Self::connect_to_cluster(url, options).await;
        }
        let client = cluster::single_client(url)?;
        let conn = cluster::open_single(client.clone(), &options).await?;
        Self::from_manager_with(conn, client, options).await
    }

    async fn connect_to_cluster(url: &str, options: RedisOptions) -> Result<Self> {
        let ns = options.validate()?;
        let seeds = cluster::seed_urls(url)?;
        let pubsub = cluster::single_client(&seeds[0])?;
        let conn = cluster::open_cluster(&seeds, &options).await?;
        Self::start(Connection::Cluster(conn), pubsub, options, ns).await
    }

    /// Uses your own connection manager for commands, and `client` (the same
    /// server) to open the one pub/sub connection that wakes waiters.
    ///
    /// # Errors
    /// As [`from_manager_with`](Self::from_manager_with).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is kept until the future completes.
    pub async fn from_manager(manager: ConnectionManager, client: Client) -> Result<Self> {
        Self::from_manager_with(manager, client, RedisOptions::default()).await
    }

    /// As [`from_manager`](Self::from_manager), with `options` (the
    /// timeouts in `options` apply only to the pub/sub connection; the
    /// manager keeps its own).
    ///
    /// Loads the scripts and, unless disabled, checks persistence settings.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (before any I/O) for bad options;
    /// [`Error::Unavailable`] if the server does not answer;
    /// [`Error::Backend`] if it refuses to load the scripts.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is kept until the future completes.
    pub async fn from_manager_with(
        manager: ConnectionManager,
        client: Client,
        options: RedisOptions,
    ) -> Result<Self> {
        let ns = options.validate()?;
        Self::start(Connection::Single(manager), client, options, ns).await
    }

    /// Loads the scripts, checks persistence and makes the backend.
    async fn start(
        mut conn: Connection,
        client: Client,
        options: RedisOptions,
        ns: Namespace,
    ) -> Result<Self> {
        let [acquire, renew, release, force_release, read] = SCRIPTS.map(Script::new);
        let scripts = Scripts {
            acquire,
            renew,
            release,
            force_release,
            read,
        };
        // Loaded up front so the first calls need no NOSCRIPT round trip;
        // `Script` reloads them by itself if a server forgets them (a
        // restarted node, a replica promoted after a failover).
        match &mut conn {
            Connection::Single(_) => {
                let mut load = redis::pipe();
                for code in SCRIPTS {
                    load.cmd("SCRIPT").arg("LOAD").arg(code);
                }
                load.exec_async(&mut conn).await.map_err(classify)?;
            }
            // A pipeline goes to one node; a lone SCRIPT LOAD goes to every
            // primary.
            Connection::Cluster(_) => {
                for code in SCRIPTS {
                    redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(code)
                        .exec_async(&mut conn)
                        .await
                        .map_err(classify)?;
                }
            }
        }
        if options.check_persistence {
            let server = client.get_connection_info().addr().to_string();
            check_persistence(&mut conn, &server).await;
        }
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                conn,
                client,
                ns,
                options,
                scripts,
                subscriber: OnceLock::new(),
            }),
        })
    }

    /// Wakes this process's waiters at once, without the pub/sub round trip
    /// (other processes hear the published release).
    fn wake_local(&self, key: &Key) {
        if let Some(subscriber) = self.inner.subscriber.get() {
            subscriber.wake_local(key.as_str());
        }
    }

    /// The Redis key holding `key`'s current lease (a string
    /// `<owner>:<holder label>` with a ttl), for your own Lua scripts.
    pub fn lock_key(&self, key: &Key) -> String {
        self.inner.ns.lock(key)
    }

    /// The Redis key holding `key`'s fence counter: while a lease is live
    /// it equals that lease's token. A Lua script that checks
    /// `GET fence == token` before writing (to a key with the same hash tag)
    /// writes only while the lease is current; see the crate docs.
    pub fn fence_key(&self, key: &Key) -> String {
        self.inner.ns.fence(key)
    }

    fn conn(&self) -> Connection {
        // A handle to the shared multiplexed connection; cloning is cheap.
        self.inner.conn.clone()
    }
}

/// The `tracing` target of the warnings about settings that weaken fencing,
/// so an application (and the CLI, at its default level) can show them
/// even when it silences the rest of the library.
pub const DURABILITY_TARGET: &str = "leasehold::durability";

/// Reads the settings that decide whether fence counters survive, and warns
/// about the ones that do not, once per server and process (a program that
/// opens many backends to one server hears it once). Never fails: managed
/// Redis often disables CONFIG, and that must not stop anyone from locking.
/// On a cluster the settings are read from one node (any): the nodes of a
/// cluster are normally configured alike.
async fn check_persistence(conn: &mut Connection, server: &str) {
    let mut get = redis::pipe();
    for name in ["appendonly", "appendfsync", "maxmemory-policy"] {
        get.cmd("CONFIG").arg("GET").arg(name);
    }
    type Pairs = Vec<(String, String)>;
    let answer: redis::RedisResult<(Pairs, Pairs, Pairs)> = get.query_async(conn).await;
    if !first_check_of(server) {
        return;
    }
    let (aof, fsync, policy) = match answer {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(target: DURABILITY_TARGET, %server, error = %e,
                "could not read redis persistence settings (CONFIG GET failed, \
                perhaps disabled); fencing tokens survive a restart only with appendonly yes");
            return;
        }
    };
    let value = |p: &Pairs| p.first().map(|(_, v)| v.clone()).unwrap_or_default();
    let (aof, fsync, policy) = (value(&aof), value(&fsync), value(&policy));
    if aof != "yes" {
        tracing::warn!(target: DURABILITY_TARGET, %server, appendonly = %aof,
            "redis runs without AOF: after a restart the fence \
            counter can go backwards and a stale holder's writes may be accepted; \
            set appendonly yes and appendfsync always");
    } else if fsync != "always" {
        tracing::info!(target: DURABILITY_TARGET, %server, appendfsync = %fsync,
            "redis AOF is not fsynced on every write: a host \
            crash can lose the last grants and reuse their tokens; appendfsync always is strict");
    }
    if policy != "noeviction" && !policy.is_empty() {
        tracing::warn!(target: DURABILITY_TARGET, %server, maxmemory_policy = %policy,
            "redis may evict keys under memory pressure, \
            freeing live locks or resetting fence counters; set maxmemory-policy noeviction");
    }
}

/// True the first time `server` is checked in this process.
fn first_check_of(server: &str) -> bool {
    static CHECKED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut checked = CHECKED.lock().unwrap_or_else(|p| p.into_inner());
    if checked.iter().any(|s| s == server) {
        return false;
    }
    checked.push(server.to_owned());
    true
}

/// Transient failures (I/O, timeouts, a server loading or busy, cluster
/// redirects and failovers) are retryable; everything else is permanent.
fn classify(e: RedisError) -> Error {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            K::Server(S::BusyLoading | S::TryAgain | S::MasterDown | S::ReadOnly)
        )
        || e.code() == Some("BUSY")
        || cut_short_by_failover(&e);
    if transient {
        Error::unavailable(e)
    } else {
        Error::backend(e)
    }
    .in_store(STORE)
}

/// A `WAIT` a primary ended with `UNBLOCKED` because it was turning into a
/// replica (a failover): whether the write survives is unknown, as after a
/// timeout. In a pipeline the error sits at the `WAIT`'s index, where
/// [`RedisError::code`] does not look.
fn cut_short_by_failover(e: &RedisError) -> bool {
    e.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == "UNBLOCKED"))
}

/// A call that fewer than `min_replicas` replicas confirmed: retryable (a
/// replica may be catching up or failing over).
fn unconfirmed(confirmed: i64, wanted: u32) -> Error {
    Error::unavailable(format!(
        "the write was confirmed by {confirmed} of the {wanted} replicas min_replicas asks for"
    ))
    .in_store(STORE)
}

/// A live lease from its lock key's value (`<owner hex>:<holder label>`),
/// remaining ms and fence text, every field checked.
fn info_of(key: Key, value: &str, pttl: i64, fence: &str) -> Result<LeaseInfo> {
    let record = RecordDecoder::new(STORE, key.as_str());
    let Some((owner, holder)) = value.split_at_checked(32) else {
        return Err(record.corrupt(format!("lock value {value:?} has no owner")));
    };
    let Some(holder) = holder.strip_prefix(':') else {
        return Err(record.corrupt(format!("lock value {value:?} has no ':' after the owner")));
    };
    record.owner(owner)?;
    let (token, remaining) = (record.token_text(fence)?, record.remaining(pttl)?);
    Ok(LeaseInfo {
        key,
        holder: holder.to_owned(),
        token,
        remaining,
    })
}

impl Backend for RedisBackend {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            let (owner, ttl) = (req.owner().to_string(), duration_to_millis(req.ttl()));
            let args = [owner.as_str(), &ttl.to_string(), req.holder()];
            let (token, holder, pttl): (i64, String, i64) = match self.inner.options.min_replicas {
                0 => {
                    self.run(&self.inner.scripts.acquire, req.key(), &args)
                        .await?
                }
                replicas => {
                    self.acquire_confirmed(req.key(), &owner, &args, replicas)
                        .await?
                }
            };
            // A grant returns the incremented fence, so a negative one is a
            // corrupt fence key.
            Ok(if token != 0 {
                let token = RecordDecoder::new(STORE, req.key().as_str()).token(token)?;
                Acquire::Granted(req.granted(token))
            } else {
                Acquire::Busy(Busy {
                    holder,
                    remaining: millis_to_duration(pttl),
                })
            })
        })
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let (owner, ttl) = (lease.owner().to_string(), duration_to_millis(ttl));
            let args: [&str; 3] = [&owner, &lease.token().to_string(), &ttl.to_string()];
            let renewed: i64 = self
                .run(&self.inner.scripts.renew, lease.key(), &args)
                .await?;
            Ok(renewed == 1)
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let (owner, token) = (lease.owner().to_string(), lease.token().to_string());
            let args = [
                &owner,
                &token,
                &self.inner.ns.channel(),
                lease.key().as_str(),
            ];
            let freed: i64 = self
                .run(&self.inner.scripts.release, lease.key(), &args)
                .await?;
            if freed == 1 {
                self.wake_local(lease.key());
            }
            Ok(())
        })
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Box::pin(async move { Ok(self.read_leases(vec![key.clone()]).await?.pop()) })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        Box::pin(async move {
            // SCAN, not KEYS (which blocks the server) and not an index set
            // (it would sit in another cluster slot than the lock keys, so no
            // script could update both, and expiry would leave stale entries).
            // The pattern matches exactly the wanted keys (see keys.rs); a
            // BTreeSet drops SCAN's duplicates and orders by key.
            let pattern = self.inner.ns.lock_pattern(prefix);
            let mut found = std::collections::BTreeSet::new();
            for name in self.scan(&pattern).await? {
                if let Some(key) = self.inner.ns.key_of_lock(&name) {
                    found.insert(key?);
                }
            }
            self.read_leases(found.into_iter().collect()).await
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let args = [&self.inner.ns.channel(), key.as_str()];
            let broken: i64 = self
                .run(&self.inner.scripts.force_release, key, &args)
                .await?;
            self.wake_local(key);
            Ok(broken == 1)
        })
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async move {
            let inner = &self.inner;
            let subscriber = inner.subscriber.get_or_init(|| {
                let channel = inner.ns.channel();
                let server = format!("{:?} {channel}", inner.client.get_connection_info());
                SUBSCRIBERS.get_or_insert_with(&server, || {
                    wake::notifier(inner.client.clone(), channel, inner.options.connect_timeout)
                })
            });
            // Registered before the channel is known to be subscribed: a
            // release after this returns is then always delivered. Only the
            // first connection is waited for (bounded, and by the caller's
            // deadline too); once an attempt failed, waiters poll at once.
            Ok(subscriber.subscribe(key.as_str()).await)
        })
    }

    /// `PUBLISH` on the channel releases use (on a cluster, any node: the
    /// cluster bus carries it to every subscriber).
    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let _receivers: i64 = redis::cmd("PUBLISH")
                .arg(self.inner.ns.channel())
                .arg(key.as_str())
                .query_async(&mut self.conn())
                .await
                .map_err(classify)?;
            self.wake_local(key);
            Ok(true)
        })
    }

    fn try_acquire_permit<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(self.acquire_permit(req))
    }

    fn renew_permit<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.renew_permit_now(lease, ttl))
    }

    fn release_permit<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.release_permit_now(lease))
    }

    fn list_permits<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<PermitInfo>>> {
        Box::pin(self.list_permits_now(prefix))
    }
}

impl RedisBackend {
    /// Acquires with `min_replicas` > 0: a grant that fewer replicas
    /// confirmed is not trusted, so it is released again (best effort: if
    /// that fails too, it expires with its ttl) and the call fails.
    async fn acquire_confirmed(
        &self,
        key: &Key,
        owner: &str,
        args: &[&str],
        replicas: u32,
    ) -> Result<(i64, String, i64)> {
        let ((token, holder, pttl), confirmed): ((i64, String, i64), i64) = self
            .run_and_wait(&self.inner.scripts.acquire, key, args, replicas)
            .await?;
        if confirmed >= i64::from(replicas) {
            return Ok((token, holder, pttl));
        }
        if token != 0 {
            let args = [
                owner,
                &token.to_string(),
                &self.inner.ns.channel(),
                key.as_str(),
            ];
            let undone: Result<i64> = self
                .run_and_wait(&self.inner.scripts.release, key, &args, 0)
                .await
                .map(|(freed, _)| freed);
            if let Err(e) = undone {
                tracing::debug!(%key, error = %e, "could not release an unconfirmed grant; it expires with its ttl");
            }
        }
        Err(unconfirmed(confirmed, replicas))
    }

    /// Runs `script` on `key`'s lock and fence keys, confirmed by
    /// `min_replicas` replicas when that option is set.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        key: &Key,
        args: &[&str],
    ) -> Result<T> {
        self.run_on(script, self.lock_keys(key), args).await
    }

    /// `key`'s lock and fence keys: the two keys of every mutex script.
    fn lock_keys(&self, key: &Key) -> [String; 2] {
        [self.inner.ns.lock(key), self.inner.ns.fence(key)]
    }

    /// Runs `script` on `keys` (two keys of one hash tag), confirmed by
    /// `min_replicas` replicas when that option is set.
    async fn run_on<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: [String; 2],
        args: &[&str],
    ) -> Result<T> {
        let replicas = self.inner.options.min_replicas;
        if replicas == 0 {
            let mut call = script.prepare_invoke();
            call.key(&keys[0]).key(&keys[1]);
            for arg in args {
                call.arg(*arg);
            }
            return call.invoke_async(&mut self.conn()).await.map_err(classify);
        }
        let (answer, confirmed) = self.run_and_wait_on(script, keys, args, replicas).await?;
        if confirmed < i64::from(replicas) {
            return Err(unconfirmed(confirmed, replicas));
        }
        Ok(answer)
    }

    /// Runs `script` and `WAIT replicas timeout` in one pipeline: both go on
    /// the same connection to the key's primary, so the `WAIT` covers this
    /// call's writes (and any sent before them on that connection). The
    /// answer and how many replicas confirmed.
    async fn run_and_wait<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        key: &Key,
        args: &[&str],
        replicas: u32,
    ) -> Result<(T, i64)> {
        self.run_and_wait_on(script, self.lock_keys(key), args, replicas)
            .await
    }

    /// [`run_and_wait`](Self::run_and_wait) on any two keys of one hash tag.
    async fn run_and_wait_on<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: [String; 2],
        args: &[&str],
        replicas: u32,
    ) -> Result<(T, i64)> {
        let wait_ms = duration_to_millis(self.inner.options.response_timeout / 2).max(1);
        let mut call = redis::pipe();
        call.cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(2)
            .arg(&keys)
            .arg(args)
            .cmd("WAIT")
            .arg(replicas)
            .arg(wait_ms);
        match call.query_async(&mut self.conn()).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                // A node that forgot the script (restarted, or a replica
                // promoted since): load it there and try once more.
                script
                    .load_async(&mut self.conn())
                    .await
                    .map_err(classify)?;
                call.query_async(&mut self.conn()).await.map_err(classify)
            }
            other => other.map_err(classify),
        }
    }

    /// The names matching `pattern`, from a full `SCAN` of the server or of
    /// every primary of the cluster (each holds only its own slots). May
    /// hold duplicates.
    async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let mut conn = self.conn();
        // One full SCAN per server that holds keys: the one server, or each
        // primary of the cluster.
        let nodes = match &mut conn {
            Connection::Single(_) => vec![None],
            Connection::Cluster(conn) => cluster::primaries(conn)
                .await
                .map_err(classify)?
                .into_iter()
                .map(Some)
                .collect(),
        };
        let mut names = Vec::new();
        for node in &nodes {
            let mut cursor = 0u64;
            loop {
                let mut page = redis::cmd("SCAN");
                page.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                let (next, found): (u64, Vec<String>) = match (&mut conn, node) {
                    (Connection::Cluster(conn), Some(node)) => {
                        cluster::query_node(conn, node, page).await
                    }
                    (conn, _) => page.query_async(conn).await,
                }
                .map_err(classify)?;
                names.extend(found);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(names)
    }

    /// Live leases of `keys`. Each key's holder, ttl and token are read in
    /// one step so they belong together: all keys in one MULTI/EXEC on a
    /// single server; on a cluster one `read.lua` call per key, concurrently
    /// (a transaction cannot span slots, and one in a slot that just moved
    /// is aborted instead of redirected).
    async fn read_leases(&self, keys: Vec<Key>) -> Result<Vec<LeaseInfo>> {
        type Row = (Option<String>, i64, Option<String>);
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let read = |keys: &[Key]| {
            let mut read = redis::pipe();
            read.atomic();
            for key in keys {
                let lock = self.inner.ns.lock(key);
                read.get(&lock).pttl(&lock).get(self.inner.ns.fence(key));
            }
            read
        };
        let rows: Vec<Row> = match self.conn() {
            Connection::Single(mut conn) => {
                read(&keys).query_async(&mut conn).await.map_err(classify)?
            }
            Connection::Cluster(conn) => {
                let reads = keys.iter().map(|key| {
                    let mut conn = conn.clone();
                    let mut call = self.inner.scripts.read.prepare_invoke();
                    call.key(self.inner.ns.lock(key))
                        .key(self.inner.ns.fence(key));
                    async move { call.invoke_async::<Row>(&mut conn).await }
                });
                futures_util::future::try_join_all(reads)
                    .await
                    .map_err(classify)?
            }
        };
        keys.into_iter()
            .zip(rows)
            .filter_map(|(key, row)| match row {
                // PTTL -2: gone by now. A lock key without a ttl (-1) or
                // without a fence was not written by this store.
                (Some(value), pttl, fence) if pttl != -2 => Some(match (pttl, fence) {
                    (-1, _) => Err(RecordDecoder::new(STORE, key.as_str())
                        .corrupt("the lock key has no expiry")),
                    (_, None) => Err(RecordDecoder::new(STORE, key.as_str())
                        .corrupt("a held lock without a fence key")),
                    (pttl, Some(fence)) => info_of(key, &value, pttl, &fence),
                }),
                _ => None,
            })
            .collect()
    }
}
