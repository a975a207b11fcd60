//! Redis Cluster (`redis+cluster://`): the URL's seed nodes, the one
//! connection type the engine runs on (a single server or a cluster), and
//! the per-node commands a cluster needs (`SCAN` on every primary).
//!
//! Every script names a lock key and its fence key, which share a hash tag
//! (see `keys.rs`), so redis-rs routes each call to the primary of that one
//! slot and follows `MOVED`/`ASK` itself; nothing else in the engine knows
//! whether it talks to one server or many.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::options::RedisOptions;
use crate::error::{Error, Result};

use crate::scheme::REDIS_CLUSTER;

/// How often the cluster client retries one command (redirects, a node
/// that went away, `TRYAGAIN`) and how long it waits between tries. The
/// whole command is also bounded by the response timeout, so a cluster that
/// stays down reports `Unavailable` instead of retrying for minutes (the
/// driver's defaults: 16 retries, waits of up to 11 minutes).
const RETRIES: u32 = 6;
const MIN_RETRY_WAIT_MS: u64 = 10;
const MAX_RETRY_WAIT_MS: u64 = 500;

/// The connection the engine sends its commands and scripts on.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server (`redis://`, `redis+unix://`), reconnecting on its own.
    Single(ConnectionManager),
    /// A Redis Cluster: commands routed by slot, redirects followed.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
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
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
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
pub(super) fn client(seeds: &[String], options: &RedisOptions) -> Result<ClusterClient> {
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
