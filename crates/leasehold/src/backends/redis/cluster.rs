//! Redis Cluster (`redis+cluster://`): the URL's seed nodes, the one
//! connection type the engine runs on (a single server or a cluster), and
//! the per-node commands a cluster needs (`SCAN` on every primary).
//!
//! Every script names a lock key and its fence key, which share a hash tag
//! (see `keys.rs`), so redis-rs routes each call to the primary of that one
//! slot and follows `MOVED`/`ASK` itself; nothing else in the engine knows
//! whether it talks to one server or many.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Client, Cmd, Pipeline, RedisFuture, Value};

use super::classify;
use super::direct::DirectPool;
use super::options::RedisOptions;
use crate::error::{Error, Result};
use crate::scheme::{Scheme, REDIS_CLUSTER};

/// How often the cluster client retries one command (redirects, a node
/// that went away, `TRYAGAIN`) and how long it waits between tries. The
/// whole command is also bounded by the response timeout, so a cluster that
/// stays down reports `Unavailable` instead of retrying for minutes (the
/// driver's defaults: 16 retries, waits of up to 11 minutes).
const RETRIES: u32 = 6;
const MIN_RETRY_WAIT_MS: u64 = 10;
const MAX_RETRY_WAIT_MS: u64 = 500;

/// The connection the engine sends its commands and scripts on; public so
/// tools that keep their own data next to the locks (the `leasehold` CLI's
/// demo product, its bench baselines) reach the same server or cluster the
/// same way. Cheap to clone; clones share the connection.
#[derive(Clone)]
#[non_exhaustive]
pub enum Connection {
    /// One server (`redis://`, `redis+unix://`), on a connection manager
    /// of your own ([`RedisBackend::from_manager`](super::RedisBackend::from_manager)).
    Single(ConnectionManager),
    /// One server (`redis://`, `redis+unix://`), as leasehold opens it: a
    /// few plain connections, one call at a time on each (see
    /// [`RedisOptions::with_max_connections`]).
    Direct(DirectPool),
    /// A Redis Cluster: commands routed by slot, redirects followed.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Direct(c) => Box::pin(async move {
                let mut reply = c.exchange(&cmd.get_packed_command(), 0, 1).await?;
                reply.pop().ok_or_else(no_reply)
            }),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Direct(c) => Box::pin(async move {
                c.exchange(&pipeline.get_packed_pipeline(), offset, count)
                    .await
            }),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Direct(c) => c.db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

impl Connection {
    /// Opens a connection to the server or cluster `url` names
    /// (`redis://`, `redis+unix://`, `redis+cluster://`), with `options`'
    /// timeouts. `url` is the driver's: without leasehold's own options
    /// ([`StoreUrl::driver_url`](crate::scheme::StoreUrl::driver_url)).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (before any I/O) for a URL the driver does
    /// not take or a bad cluster seed list; [`Error::Unavailable`] if no
    /// node answers within the connect timeout.
    pub async fn open(url: &str, options: &RedisOptions) -> Result<Connection> {
        options.validate()?;
        let opened = if Scheme::names_a_cluster(url) {
            Connection::Cluster(open_cluster(&seed_urls(url)?, options).await?)
        } else {
            Connection::Direct(open_direct(single_client(url)?, options).await?)
        };
        Ok(opened)
    }
}

/// A driver client for one server, checked before any I/O.
pub(super) fn single_client(url: &str) -> Result<Client> {
    Client::open(url).map_err(|e| Error::invalid_from("store url", "not a Redis URL", e))
}

/// The connection pool to the one server of `client`. The first
/// connection is opened now, in up to three attempts a second apart at most
/// (as redis-rs's connection manager would), so a server that is down is
/// reported by `connect`.
pub(super) async fn open_direct(client: Client, options: &RedisOptions) -> Result<DirectPool> {
    let (mut wait, mut attempt) = (Duration::from_millis(100), 1);
    loop {
        let opened = DirectPool::open(
            client.clone(),
            options.max_connections,
            options.reply_wait,
            options.connect_timeout,
            options.response_timeout,
        )
        .await;
        match opened {
            Err(e) if attempt < 3 && (e.is_io_error() || e.is_timeout()) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 4).min(Duration::from_secs(1));
                attempt += 1;
            }
            other => return other.map_err(classify),
        }
    }
}

/// A reply missing from a call that expects one (the server closed the
/// connection in step, which it does not do).
fn no_reply() -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "redis sent no reply").into()
}

/// A connection to the cluster behind `seeds` (see [`seed_urls`]).
pub(super) async fn open_cluster(
    seeds: &[String],
    options: &RedisOptions,
) -> Result<ClusterConnection> {
    client(seeds, options)?
        .get_async_connection()
        .await
        .map_err(classify)
}

/// The seed nodes of a `redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...][/0][?query]`
/// URL, each as a `redis://` URL with the credentials and the driver's query
/// options. Checked before any I/O.
pub(super) fn seed_urls(url: &str) -> Result<Vec<String>> {
    let invalid = |problem: String| Error::invalid("store url", problem);
    let rest = url
        .strip_prefix(REDIS_CLUSTER)
        .and_then(|rest| rest.strip_prefix("://"))
        .ok_or_else(|| invalid(format!("a cluster URL starts with {REDIS_CLUSTER}://")))?;
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) if !query.is_empty() => (rest, format!("?{query}")),
        Some((rest, _)) => (rest, String::new()),
        None => (rest, String::new()),
    };
    let (credentials, rest) = match rest.rsplit_once('@') {
        Some((credentials, rest)) => (format!("{credentials}@"), rest),
        None => (String::new(), rest),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !matches!(path, "" | "0") {
        return Err(invalid(format!(
            "a Redis Cluster has only database 0, the URL names {path:?}"
        )));
    }
    let seeds: Vec<String> = hosts
        .split(',')
        .map(|host| format!("redis://{credentials}{host}{query}"))
        .collect();
    for (host, seed) in hosts.split(',').zip(&seeds) {
        if host.is_empty() {
            return Err(invalid(format!(
                "{REDIS_CLUSTER}:// needs HOST:PORT[,HOST:PORT...], found an empty node in {hosts:?}"
            )));
        }
        redis::Client::open(seed.as_str()).map_err(|e| {
            Error::invalid_from("store url", format!("node {host:?} is not HOST:PORT"), e)
        })?;
    }
    Ok(seeds)
}

/// A cluster client on `seeds` with `options`' timeouts.
fn client(seeds: &[String], options: &RedisOptions) -> Result<ClusterClient> {
    ClusterClient::builder(seeds.iter().map(String::as_str))
        .connection_timeout(options.connect_timeout)
        .response_timeout(options.response_timeout)
        .overall_response_timeout(Some(options.response_timeout))
        .retries(RETRIES)
        .min_retry_wait(MIN_RETRY_WAIT_MS)
        .max_retry_wait(MAX_RETRY_WAIT_MS)
        .build()
        .map_err(|e| Error::invalid_from("store url", "not a Redis Cluster URL", e))
}

/// The primaries serving slots right now, as `(host, port)`, from
/// `CLUSTER SLOTS` (answered by any node).
pub(super) async fn primaries(
    conn: &mut ClusterConnection,
) -> redis::RedisResult<Vec<(String, u16)>> {
    // Each entry: [first slot, last slot, [host, port, id, ...], replicas...].
    let value = conn
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let ranges: Vec<Vec<Value>> = redis::from_redis_value(value)?;
    let mut nodes = Vec::new();
    for range in ranges {
        let Some(primary) = range.into_iter().nth(2) else {
            continue;
        };
        let fields: Vec<Value> = redis::from_redis_value(primary)?;
        let mut fields = fields.into_iter();
        let (Some(host), Some(port)) = (fields.next(), fields.next()) else {
            continue;
        };
        let node = (
            redis::from_redis_value::<String>(host)?,
            redis::from_redis_value::<u16>(port)?,
        );
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    Ok(nodes)
}

/// `cmd` on the node at `host:port` (a `SCAN` page: keys live per node).
pub(super) async fn query_node<T: redis::FromRedisValue>(
    conn: &mut ClusterConnection,
    (host, port): &(String, u16),
    cmd: redis::Cmd,
) -> redis::RedisResult<T> {
    let value = conn
        .route_command(
            cmd,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            }),
        )
        .await?;
    Ok(redis::from_redis_value(value)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_carry_credentials_and_driver_options() {
        assert_eq!(
            seed_urls("redis+cluster://u:p@a:7000,b:7001/0?protocol=resp3").unwrap(),
            [
                "redis://u:p@a:7000?protocol=resp3",
                "redis://u:p@b:7001?protocol=resp3"
            ]
        );
        assert_eq!(seed_urls("redis+cluster://a:1").unwrap(), ["redis://a:1"]);
    }

    #[test]
    fn bad_cluster_urls_are_refused_before_any_io() {
        let problem = |url| seed_urls(url).unwrap_err().to_string();
        assert!(problem("redis+cluster://a:1/2").contains("only database 0"));
        assert!(problem("redis+cluster://a:1,,b:2").contains("empty node"));
        assert!(problem("redis+cluster://").contains("empty node"));
        assert!(problem("redis+cluster://a:notaport").contains("is not HOST:PORT"));
    }
}
