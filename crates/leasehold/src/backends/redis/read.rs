//! Reading leases for `inspect` and `list`: a `SCAN` of every server that
//! holds keys, and each key's holder, ttl and token read in one step.

use super::errors::classify;
use super::{cluster, Connection, RedisBackend, STORE};
use crate::backend::{LeaseInfo, RecordDecoder};
use crate::error::Result;
use crate::key::Key;

impl RedisBackend {
    /// The names matching `pattern`, from a full `SCAN` of the server or of
    /// every primary of the cluster (each holds only its own slots). May
    /// hold duplicates.
    pub(super) async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let mut conn = self.conn();
        // One full SCAN per server that holds keys: the one server, or each
        // primary of the cluster.
        let nodes = match &mut conn {
            Connection::Single(_) | Connection::Direct(_) => vec![None],
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
    pub(super) async fn read_leases(&self, keys: Vec<Key>) -> Result<Vec<LeaseInfo>> {
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
            mut conn @ (Connection::Single(_) | Connection::Direct(_)) => {
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
                // PTTL -2: gone by now. A lock key without a ttl (-1) was
                // not written by this store.
                (Some(value), pttl, fence) if pttl != -2 => Some(match pttl {
                    -1 => Err(RecordDecoder::new(STORE, key.as_str())
                        .corrupt("the lock key has no expiry")),
                    pttl => info_of(key, &value, pttl, fence.as_deref()),
                }),
                _ => None,
            })
            .collect()
    }
}

/// A live lease from its lock key's value, remaining ms and fence text,
/// every field checked. The value is `<owner hex>#<token>:<holder label>`;
/// one an earlier version wrote is `<owner hex>:<holder label>`, its token
/// the fence's (which then must exist).
fn info_of(key: Key, value: &str, pttl: i64, fence: Option<&str>) -> Result<LeaseInfo> {
    let record = RecordDecoder::new(STORE, key.as_str());
    // A trailing byte 1 is the queued mark (queue.lua): waiters may be
    // queued behind this lease. No part of the label.
    let value = value.strip_suffix('\u{1}').unwrap_or(value);
    let Some((owner, rest)) = value.split_at_checked(32) else {
        return Err(record.corrupt(format!("lock value {value:?} has no owner")));
    };
    record.owner(owner)?;
    let (holder, token) = match split_token(rest) {
        Some((token, holder)) => (holder, token),
        None => match (rest.strip_prefix(':'), fence) {
            (Some(holder), Some(fence)) => (holder, fence),
            (Some(_), None) => {
                return Err(record.corrupt("a held lock without a token or a fence key"))
            }
            (None, _) => {
                return Err(record.corrupt(format!(
                    "lock value {value:?} has neither '#<token>:' nor ':' after the owner"
                )))
            }
        },
    };
    let (token, remaining) = (record.token_text(token)?, record.remaining(pttl)?);
    Ok(LeaseInfo::mutex(key, holder.to_owned(), token, remaining))
}

/// `#<digits>:<label>` (what follows the owner in the value `acquire.lua`
/// writes) as its token digits and label; `None` for anything else.
fn split_token(rest: &str) -> Option<(&str, &str)> {
    let (token, holder) = rest.strip_prefix('#')?.split_once(':')?;
    (!token.is_empty() && token.bytes().all(|b| b.is_ascii_digit())).then_some((token, holder))
}

#[cfg(test)]
mod tests {
    use super::split_token;

    #[test]
    fn the_token_is_the_digits_between_the_hash_and_the_first_colon() {
        assert_eq!(split_token("#42:worker-1"), Some(("42", "worker-1")));
        assert_eq!(
            split_token("#1700000000000000:a:b#3"),
            Some(("1700000000000000", "a:b#3"))
        );
        assert_eq!(split_token("#7:"), Some(("7", "")));
        // Values of earlier versions, and what is not a token.
        for rest in [":worker-1", "#:worker", "#1a:worker", "#-2:x", "#12", ""] {
            assert_eq!(split_token(rest), None, "{rest:?}");
        }
    }
}
