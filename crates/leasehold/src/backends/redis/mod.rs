//! The Redis store (`redis://`, feature `redis`).
//!
//! Each operation is one Lua script (loaded once, called by SHA with
//! `EVALSHA`): acquire reads the key's kind key (a reader-writer lock or a
//! semaphore answers as such: one key is one lock), then `SET NX PX` plus
//! `INCR` of a fence key that has no ttl and is never deleted; renew checks
//! owner and token, then `PEXPIRE`; release compares and deletes, then
//! `PUBLISH`es the key; force-release deletes whatever holds the key and
//! bumps the fence. Redis expires the lock key itself (`PX`), so
//! the server's clock decides expiry.
//!
//! A mutex keeps a queue of waiters per key (`queues()`, issue 31): a
//! sorted set and a hash beside the lock key (`queue.lua`). Acquire enters
//! a busy waiter and hands a free key to the queue's head; release hands
//! over in the same script. The kind key's `q` and a trailing byte 1 in the
//! lock value say waiters may be queued, so a grant or release with nobody
//! queued reads nothing more than before (docs/redis.md, "The queue").
//!
//! Lock and fence keys share a hash tag, so each script touches one cluster
//! slot (see `keys.rs` for the layout). The same engine runs on a Redis
//! Cluster (`redis+cluster://`, see `cluster.rs`): only the connection
//! differs. Waiters share a single pub/sub connection per server and prefix
//! in the process (every backend on the same URL; on a cluster, to the first
//! seed node), opened on the first wait and reopened if it drops.
//!
//! **Connection budget.** A backend opened from a URL sends its commands on
//! plain connections, one call at a time on each, read by the calling task
//! itself (see `direct.rs` for why): one while calls come one after another,
//! up to `max_connections` (default 4) under concurrency. On a cluster, and
//! on your own `ConnectionManager`, one multiplexed connection (per node)
//! instead. The process adds one pub/sub connection per server and prefix
//! once something waits: 2 per process for one `Locks` whose calls do not
//! overlap.
//!
//! **Persistence.** The fence counter is only as durable as Redis's data.
//! Without AOF a restart reloads an older snapshot (or nothing), and tokens
//! handed out again may be lower than ones a fenced resource already saw.
//! Run with `appendonly yes` and `appendfsync always` for strict fencing;
//! `everysec` can lose the last second of grants on a host crash. The backend
//! checks on connect and warns when AOF is off or keys may be evicted.

mod cluster;
mod connect;
mod direct;
mod errors;
mod exec;
mod keys;
pub(crate) mod options;
mod read;
mod semaphore;
mod wake;

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::{Client, Script};

pub use cluster::Connection;

use crate::backend::{
    duration_to_millis, listing, millis_to_duration, Acquire, AcquireRequest, Backend, BoxFuture,
    Busy, Lease, LeaseInfo, OwnerId, RecordDecoder, Subscription,
};
use crate::error::Result;
use crate::key::Key;
use crate::notify::HandOff;
pub use connect::DURABILITY_TARGET;
use errors::classify;
use keys::Namespace;
pub use options::RedisOptions;

/// The name errors carry ([`Error::store`]).
const STORE: &str = "redis";

/// The mutex's scripts. The grant starts with `idle.lua`, which reads the
/// idle window at the end of its arguments (see exec.rs), and the grant's
/// helpers (`fence.lua`); the others ignore the window, but for the part of
/// a release that hands the key to the head of its queue. The queue's code
/// (`queue.lua` and the `_queued` parts) comes after each script's short
/// path, so a grant or release with nobody queued never runs it (a Lua
/// function is made anew on every call that reaches its definition).
const SCRIPTS: [&str; 7] = [
    concat!(
        include_str!("idle.lua"),
        include_str!("fence.lua"),
        include_str!("acquire.lua"),
        include_str!("queue.lua"),
        include_str!("acquire_queued.lua")
    ),
    include_str!("renew.lua"),
    concat!(
        include_str!("release.lua"),
        include_str!("idle.lua"),
        include_str!("fence.lua"),
        include_str!("queue.lua"),
        include_str!("release_queued.lua")
    ),
    include_str!("force_release.lua"),
    include_str!("read.lua"),
    concat!(
        include_str!("idle.lua"),
        include_str!("fence.lua"),
        include_str!("queue.lua"),
        include_str!("leave.lua")
    ),
    concat!(
        include_str!("idle.lua"),
        include_str!("fence.lua"),
        include_str!("release_to.lua")
    ),
];

struct Scripts {
    acquire: Script,
    renew: Script,
    release: Script,
    force_release: Script,
    read: Script,
    leave: Script,
    release_to: Script,
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
    hints: QueueHints,
}

/// The owners this process sent queued attempts for, so that their
/// release names the queue's keys at once instead of learning of the queue
/// from the short path's answer (one round trip more). Only a hint: an
/// owner missing here costs that round trip, an owner here whose key has
/// no queue costs two key names more in one call.
#[derive(Default)]
struct QueueHints {
    owners: std::sync::Mutex<std::collections::HashSet<OwnerId>>,
}

/// Owners kept at most: a waiter that neither releases nor leaves (its
/// process's calls failed) must not grow the set for good.
const MAX_HINTS: usize = 4096;

impl QueueHints {
    fn note(&self, owner: OwnerId) {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        if owners.len() >= MAX_HINTS {
            owners.clear();
        }
        owners.insert(owner);
    }

    /// Whether `owner` was noted (and forgets it).
    fn take(&self, owner: OwnerId) -> bool {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        !owners.is_empty() && owners.remove(&owner)
    }
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
    /// Wakes this process's waiters at once, without the pub/sub round trip
    /// (other processes hear the published release).
    fn wake_local(&self, key: &Key) {
        if let Some(subscriber) = self.inner.subscriber.get() {
            subscriber.wake_local(key.as_str());
        }
    }

    /// Tells the head of `key`'s queue of the grant a script handed over
    /// to it, if it waits in this process, without the pub/sub round trip
    /// (the published hand-off reaches it too; a second telling of the
    /// same grant changes nothing).
    fn hand_over_local(&self, key: &Key, handed: Handed) {
        if let Some(subscriber) = self.inner.subscriber.get() {
            subscriber.hand_over_local(key.as_str(), handed.owner, handed.grant);
        }
    }

    /// What release.lua and leave.lua answer: 1 freed (the key's waiters
    /// were woken on the channel, and are here), 0 nothing held, or the
    /// head the key was handed over to (told on the channel, and here).
    fn after_release(&self, key: &Key, answer: &redis::Value) -> Result<()> {
        match answer {
            redis::Value::Int(1) => self.wake_local(key),
            redis::Value::Int(_) => {}
            handed => {
                let handed = Handed::decode(key, handed)?;
                self.hand_over_local(key, handed);
            }
        }
        Ok(())
    }

    /// The Redis key holding `key`'s current lease, for your own Lua
    /// scripts: a string `<owner>#<token>:<holder label>` whose ttl is the
    /// lease's. A script that checks owner and token in it before writing
    /// (to a key with the same hash tag) writes only while the lease is
    /// current; see docs/redis.md, "The fenced write on Redis data".
    pub fn lock_key(&self, key: &Key) -> String {
        self.inner.ns.lock(key)
    }

    /// The Redis key holding `key`'s fence counter, the last token drawn
    /// (a busy try draws one too, so a key's tokens have gaps). It lives one and a half idle windows from its creation, held or
    /// not (the next grant starts it again above every token it had), so
    /// check a lease against [`lock_key`](Self::lock_key), not this.
    pub fn fence_key(&self, key: &Key) -> String {
        self.inner.ns.fence(key)
    }

    /// One acquire.lua call: with the queue's keys and arguments
    /// (`full`), or only the short path's (`None`: the key has a queue,
    /// ask again with them).
    async fn acquire_mutex(
        &self,
        req: &AcquireRequest,
        full: bool,
    ) -> Result<Option<AcquireAnswer>> {
        let (owner, ttl) = (
            req.owner().to_string(),
            duration_to_millis(req.ttl()).to_string(),
        );
        let channel;
        let entry;
        let mut args = vec![owner.as_str(), &ttl, req.holder()];
        let keys = if full {
            channel = self.inner.ns.channel();
            args.extend([channel.as_str(), req.key().as_str()]);
            // A waiter's attempt adds its queue entry.
            entry = req
                .queue_entry_ttl()
                .zip(req.queue_ticket())
                .map(|(lease, ticket)| {
                    [
                        duration_to_millis(lease).to_string(),
                        ticket.to_string(),
                        duration_to_millis(req.claim_window()).to_string(),
                    ]
                });
            args.extend(entry.iter().flatten().map(String::as_str));
            self.queue_keys(req.key()).to_vec()
        } else {
            self.acquire_keys(req.key()).to_vec()
        };
        match self.inner.options.min_replicas {
            0 => {
                let reply: AcquireReply = self
                    .run_on(&self.inner.scripts.acquire, &keys, &args)
                    .await?;
                Ok(reply.0)
            }
            replicas => {
                self.acquire_confirmed(req.key(), &keys, &owner, &args, replicas)
                    .await
            }
        }
    }

    fn conn(&self) -> Connection {
        // A handle to the shared multiplexed connection; cloning is cheap.
        self.inner.conn.clone()
    }
}

impl Backend for RedisBackend {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            if req.permit_kind().is_some() {
                return self.acquire_permit(req).await;
            }
            // A waiter's attempt names the queue's keys at once; any other
            // names only the three keys of a grant with nobody queued, and
            // asks again with the queue's if the key has one (acquire.lua).
            let queued = req.queue_entry_ttl().is_some();
            if queued {
                self.inner.hints.note(req.owner());
            }
            let answer = match self.acquire_mutex(req, queued).await? {
                None => self.acquire_mutex(req, true).await?,
                Some(answer) => Some(answer),
            };
            let answer = answer.ok_or_else(|| {
                RecordDecoder::new(STORE, req.key().as_str())
                    .corrupt("asked for the queue's keys by a call that named them")
            })?;
            let AcquireAnswer {
                token,
                holder,
                pttl,
                handed,
            } = answer;
            if let Some(handed) = handed {
                self.hand_over_local(req.key(), Handed::decode(req.key(), &handed)?);
            }
            // A grant returns the incremented fence, so a negative one is a
            // corrupt fence key; -1 with a kind is a key of another kind.
            let record = RecordDecoder::new(STORE, req.key().as_str());
            Ok(
                if let Some(kind) = semaphore::other_kind(&record, token, &holder)? {
                    Acquire::OtherKind(kind)
                } else if token != 0 {
                    Acquire::Granted(req.granted(record.token(token)?))
                } else {
                    Acquire::Busy(Busy {
                        holder,
                        remaining: millis_to_duration(pttl),
                    })
                },
            )
        })
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            if lease.slot().is_some() {
                return self.renew_permit(lease, ttl).await;
            }
            let ttl = duration_to_millis(ttl);
            let args: [&str; 2] = [&held_prefix(lease), &ttl.to_string()];
            let renewed: i64 = self
                .run(&self.inner.scripts.renew, lease.key(), &args)
                .await?;
            Ok(renewed == 1)
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if lease.slot().is_some() {
                return self.release_permit(lease).await;
            }
            let args = [
                &held_prefix(lease),
                &self.inner.ns.channel(),
                lease.key().as_str(),
            ];
            // The short path's keys, unless this process queued for the
            // lease (a waiter's lease is likely to have waiters behind it).
            let script = &self.inner.scripts.release;
            let mut answer: redis::Value = if self.inner.hints.take(lease.owner()) {
                redis::Value::BulkString(ASK_WITH_QUEUE.to_vec())
            } else {
                self.run(script, lease.key(), &args).await?
            };
            if asks_with_queue(&answer) {
                let keys = self.queue_keys(lease.key());
                answer = self.run_on(script, &keys, &args).await?;
            }
            self.after_release(lease.key(), &answer)
        })
    }

    fn hands_over_locally(&self) -> bool {
        true
    }

    fn release_to<'a>(
        &'a self,
        lease: &'a Lease,
        next: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Option<Lease>>> {
        Box::pin(async move {
            let (held, owner, ttl) = (
                held_prefix(lease),
                next.owner().to_string(),
                duration_to_millis(next.ttl()).to_string(),
            );
            let args = [held.as_str(), &owner, &ttl, next.holder()];
            let token: i64 = self
                .run(&self.inner.scripts.release_to, lease.key(), &args)
                .await?;
            if token == 0 {
                return Ok(None);
            }
            let record = RecordDecoder::new(STORE, lease.key().as_str());
            Ok(Some(next.granted(record.token(token)?)))
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
            let mutexes = self.read_leases(found.into_iter().collect()).await?;
            let permits = self.list_permits(prefix, false).await?;
            let rw = self.list_permits(prefix, true).await?;
            Ok(listing(mutexes, permits.into_iter().chain(rw)))
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let args = [&self.inner.ns.channel(), key.as_str()];
            let ns = &self.inner.ns;
            let keys = [
                ns.lock(key),
                ns.fence(key),
                ns.kind(key),
                ns.permits(key),
                ns.permit_fence(key),
                ns.rw(key),
                ns.rw_fence(key),
            ];
            let broken: i64 = self
                .run_on(&self.inner.scripts.force_release, &keys, &args)
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

    fn queues(&self) -> bool {
        true
    }

    fn leave_queue<'a>(&'a self, key: &'a Key, owner: OwnerId) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.inner.hints.take(owner);
            let owner = owner.to_string();
            let args = [owner.as_str(), &self.inner.ns.channel(), key.as_str()];
            let keys = self.queue_keys(key);
            let answer: redis::Value = self.run_on(&self.inner.scripts.leave, &keys, &args).await?;
            self.after_release(key, &answer)
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
}

/// What acquire.lua and release.lua answer to a call that named only the
/// short path's keys, for a key with a queue: nothing was done; call again
/// with the queue's keys (exec.rs, `queue_keys`). A string, where every
/// other answer is a number or an array.
const ASK_WITH_QUEUE: &[u8] = b"queue";

fn asks_with_queue(answer: &redis::Value) -> bool {
    matches!(answer, redis::Value::BulkString(text) if text == ASK_WITH_QUEUE)
}

/// What acquire.lua answers: `{token, holder, pttl}`, and for a key it
/// handed over to the head of its queue (busy, naming the head) the grant
/// that head is to be told of: `{0, label, claim window, owner, token,
/// ticket}`.
struct AcquireAnswer {
    token: i64,
    holder: String,
    pttl: i64,
    handed: Option<redis::Value>,
}

/// An acquire.lua reply: `None` for [`ASK_WITH_QUEUE`].
struct AcquireReply(Option<AcquireAnswer>);

impl redis::FromRedisValue for AcquireReply {
    fn from_redis_value(value: redis::Value) -> std::result::Result<Self, redis::ParsingError> {
        if asks_with_queue(&value) {
            return Ok(AcquireReply(None));
        }
        let redis::Value::Array(mut items) = value else {
            return Err(format!("an acquire answer is an array, not {value:?}").into());
        };
        let handed = match items.len() {
            3 => None,
            6 => Some(redis::Value::Array(items.split_off(3))),
            n => return Err(format!("an acquire answer of {n} items").into()),
        };
        let (token, holder, pttl) =
            redis::FromRedisValue::from_redis_value(redis::Value::Array(items))?;
        Ok(AcquireReply(Some(AcquireAnswer {
            token,
            holder,
            pttl,
            handed,
        })))
    }
}

/// A grant a script handed over to the head of a key's queue:
/// `{owner, token, ticket}` as the scripts answer it.
struct Handed {
    owner: OwnerId,
    grant: HandOff,
}

impl Handed {
    fn decode(key: &Key, value: &redis::Value) -> Result<Handed> {
        let record = RecordDecoder::new(STORE, key.as_str());
        let (owner, token, ticket): (String, i64, i64) =
            redis::FromRedisValue::from_redis_value(value.clone()).map_err(|e| {
                record.corrupt(format!(
                    "a hand-off answer that is not owner, token, ticket: {e}"
                ))
            })?;
        let (owner, grant) = record.hand_off(&owner, token, Some(ticket))?;
        Ok(Handed { owner, grant })
    }
}

/// What a mutex lease's lock key value starts with, `<owner>#<token>:`
/// (acquire.lua): renewal and release compare this prefix and nothing else.
fn held_prefix(lease: &Lease) -> String {
    format!("{}#{}:", lease.owner(), lease.token())
}

#[cfg(test)]
mod tests {
    use redis::{FromRedisValue, Value};

    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn acquire_replies_read_as_a_grant_a_hand_off_or_a_request_for_the_queue() {
        let read = |v: Value| AcquireReply::from_redis_value(v).map(|r| r.0);
        assert!(read(bulk("queue")).unwrap().is_none(), "ask with the queue");
        let plain = read(Value::Array(vec![Value::Int(7), bulk(""), Value::Int(0)]))
            .unwrap()
            .unwrap();
        assert_eq!((plain.token, plain.pttl), (7, 0));
        assert!(plain.handed.is_none());
        let owner = OwnerId::random();
        let handed = read(Value::Array(vec![
            Value::Int(0),
            bulk("head"),
            Value::Int(2000),
            bulk(&owner.to_string()),
            Value::Int(42),
            Value::Int(3),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((handed.token, handed.holder.as_str()), (0, "head"));
        let key = Key::new("k").unwrap();
        let told = Handed::decode(&key, &handed.handed.unwrap()).unwrap();
        assert_eq!(told.owner, owner);
        assert_eq!(
            told.grant,
            HandOff {
                token: 42,
                ticket: 3
            }
        );
        // Neither an array of another length nor another string is a reply.
        assert!(read(Value::Array(vec![Value::Int(1)])).is_err());
        assert!(read(bulk("queued")).is_err());
    }

    #[test]
    fn a_damaged_hand_off_is_a_corrupt_record() {
        let key = Key::new("k").unwrap();
        let owner = OwnerId::random().to_string();
        for damaged in [
            Value::Array(vec![bulk("not hex"), Value::Int(42), Value::Int(3)]),
            Value::Array(vec![bulk(&owner), Value::Int(-5), Value::Int(3)]),
            Value::Array(vec![bulk(&owner), Value::Int(42), Value::Int(-1)]),
            Value::Array(vec![bulk(&owner), Value::Int(42)]),
        ] {
            let e = Handed::decode(&key, &damaged).err().expect("corrupt");
            assert!(e.to_string().contains("corrupt"), "{e}");
        }
    }
}
