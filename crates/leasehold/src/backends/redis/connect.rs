//! Opening a backend: the command connection, the scripts loaded up front,
//! and the persistence check that warns when fence counters may not survive
//! a restart.

use std::sync::{Arc, OnceLock};

use redis::aio::ConnectionManager;
use redis::{Client, Script};

use super::errors::classify;
use super::keys::Namespace;
use super::{cluster, Connection, Inner, RedisBackend, RedisOptions, Scripts, SCRIPTS};
use crate::error::{Error, Result};

impl RedisBackend {
    connect_methods! {
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
        connect;

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
        connect_with(options: RedisOptions);
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
        let ns = options.validate()?;
        let client = cluster::single_client(url)?;
        let conn = cluster::open_direct(client.clone(), &options).await?;
        Self::start(Connection::Direct(conn), client, options, ns).await
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
        let [acquire, renew, release, force_release, read, leave, release_to] =
            SCRIPTS.map(Script::new);
        let scripts = Scripts {
            acquire,
            renew,
            release,
            force_release,
            read,
            leave,
            release_to,
        };
        // Loaded up front so the first calls need no NOSCRIPT round trip;
        // `Script` reloads them by itself if a server forgets them (a
        // restarted node, a replica promoted after a failover).
        match &mut conn {
            Connection::Single(_) | Connection::Direct(_) => {
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
                hints: Default::default(),
            }),
        })
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
            "redis runs without AOF: a restart ends every live lease (two \
            holders at once), and one that reloads an older snapshot brings fence counters \
            back, so tokens repeat and a stale holder's writes may be accepted; \
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
