//! The MongoDB store (`mongodb://`, feature `mongodb`).
//!
//! One document per key, `{_id: key, base, fence, owner, holder, expiresAt,
//! ttlMs}`, whose token is `base + fence`: the base is the server's clock in
//! microseconds when the document was created, so that a key whose
//! document the sweep deleted after it was idle for the idle window comes
//! back above every token it had (`sweep.rs`). Every operation is one
//! single-document write, which MongoDB applies atomically:
//!
//! - acquire: `findOneAndUpdate({_id, $or: [{owner: null}, {expiresAt <= now}]},
//!   {$set: {owner, holder, expiresAt}, $inc: {fence: 1}, $setOnInsert: {base}},
//!   {upsert: true})`.
//!   When the filter does not match, the upsert's insert collides with the
//!   existing `_id`: duplicate key (11000) means busy.
//! - renew, release: `updateOne` filtered on `_id`, owner, token (a query
//!   `$expr`: base + fence) and for renew, not yet expired; release sets
//!   `owner` to null and brings `expiresAt` forward to now (since when the
//!   key is idle).
//! - force-release: `findOneAndUpdate` that nulls the owner and bumps the fence.
//! - fair waiters queue in the same document (queue.rs): acquire and
//!   release above match only a document with nobody queued, so a key
//!   nobody waits for costs what it did; otherwise a read and one write
//!   conditioned on the document as read (queued.rs) enter the queue or
//!   hand the key to its head, whose process the change stream tells.
//!
//! Only classic update operators are used (no update pipelines, no `$$NOW`);
//! the one query expression is the token's `$expr` (MongoDB 3.6+), so this
//! runs on mongod and on wire-compatible servers that have `$expr`. "Now" is the
//! client's estimate of the *server's* clock, with an error bound (see
//! [`ClockEstimate`]): a holder's `expiresAt` is set from the upper bound of
//! the estimate, a contender takes over only once `expiresAt` is at or
//! below the lower bound, so neither a wrong client clock nor the
//! measurement error can make two holders.
//!
//! **Connection budget.** See [`MongoBackend::connect`]: by default at most
//! 2 pooled connections per server (one of them held by the change stream
//! while something waits) plus one monitoring connection.
//!
//! Writes use `w: majority` by default and reads `readConcern: majority`:
//! a grant or holder that a failover could roll back would let two
//! processes hold the key, or the fence go backwards.

mod clock;
mod connect;
mod errors;
pub mod helpers;
mod kind;
mod options;
mod queue;
mod queued;
mod record;
mod semaphore;
mod sweep;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::{Collection, Database};

pub use clock::ClockEstimate;
pub use connect::{DEFAULT_MAX_IDLE_TIME, DEFAULT_MAX_POOL_SIZE};
pub use options::{MongoOptions, DEFAULT_COLLECTION};

use crate::backend::{
    duration_to_millis, listing, Acquire, AcquireRequest, Backend, BoxFuture, Busy, Lease,
    LeaseInfo, OwnerId,
};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::notify::Subscription;
use clock::{ServerClock, ServerNow};
use errors::{classify, is_duplicate_key, server_code};
use record::{base_at, date, fence_of, freed, holds_token, info_of, live, token_as_i64};

/// Lock store in a MongoDB collection. Clones share the connection pool,
/// the clock estimate and the change stream.
#[derive(Debug, Clone)]
pub struct MongoBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    db: Database,
    coll: Collection<Document>,
    clock: ServerClock,
    /// Release notifications: the change stream, and local wake-ups.
    watcher: crate::notifier::Notifier,
    /// Whether the client is ours (made from a URL) and so ours to shut
    /// down; an application's own client is left to it.
    owns_client: bool,
    /// When the next sweep of idle lock documents may start.
    sweeper: crate::backend::SweepSchedule,
    /// Tests: what the next read of a semaphore's document answers
    /// instead of the store, as a snapshot older than the latest write.
    #[cfg(test)]
    stale_read: std::sync::Mutex<Option<Document>>,
}

impl MongoBackend {
    /// The lease collection, e.g. to read fences or build indexes.
    pub fn collection(&self) -> &Collection<Document> {
        &self.inner.coll
    }

    /// How long the lock document of an idle mutex key stays (`None`:
    /// forever); see [`MongoOptions::with_idle_window`].
    pub fn idle_window(&self) -> Option<Duration> {
        self.inner.sweeper.window()
    }

    /// The measured offset of the server's clock from this client's, and
    /// the current error bound of the estimate.
    pub fn clock_estimate(&self) -> ClockEstimate {
        self.inner.clock.estimate()
    }

    async fn now(&self) -> Result<ServerNow> {
        self.inner.clock.now(&self.inner.db).await
    }

    /// The documents `filter` matches, in `_id` order.
    async fn find_in_id_order(&self, filter: Document) -> Result<mongodb::Cursor<Document>> {
        self.inner
            .coll
            .find(filter)
            .sort(doc! { "_id": 1 })
            .await
            .map_err(|e| self.fail(e))
    }

    /// Classifies a driver error, and distrusts the clock estimate after a
    /// connection problem (the next operation may reach another server).
    fn fail(&self, e: mongodb::error::Error) -> Error {
        let e = classify(e);
        if matches!(e, Error::Unavailable { .. }) {
            self.inner.clock.mark_stale();
        }
        e
    }

    /// The record of `key`, if any, and the store's time after reading it.
    async fn record(&self, key: &Key) -> Result<(Option<Document>, ServerNow)> {
        let found = self.find(key).await?;
        Ok((found, self.now().await?))
    }

    /// The document of `key`, if any.
    async fn find(&self, key: &Key) -> Result<Option<Document>> {
        self.inner
            .coll
            .find_one(doc! { "_id": key.as_str() })
            .await
            .map_err(|e| self.fail(e))
    }

    /// The answer to an attempt the plain acquire refused, from one read
    /// of the document (queued.rs): if the key is a reader-writer lock or
    /// a semaphore, that; if the holder is this request's owner (a repeat
    /// of a granted request), the same grant with its expiry counted from
    /// now, as a renewal extends it; a free key behind a queue goes to its
    /// head, a request that queues enters; else busy, as just read.
    async fn regrant_or_busy(&self, req: &AcquireRequest) -> Result<Acquire> {
        let read = self.record(req.key()).await?;
        let now = read.1;
        let answer = self.queued_attempt(req, Some(read)).await?;
        // No document (deleted since): busy, and the core tries again.
        Ok(answer.unwrap_or_else(|| Acquire::Busy(busy_in(None, now))))
    }
}

/// The busy answer a lock document read at `now` gives. The holder may
/// have left since: zero remaining makes the waiter retry.
fn busy_in(found: Option<&Document>, now: ServerNow) -> Busy {
    found
        .and_then(|d| live(d, now))
        .map(|(holder, remaining)| Busy { holder, remaining })
        .unwrap_or(Busy {
            holder: String::new(),
            remaining: Duration::ZERO,
        })
}

impl Backend for MongoBackend {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            if req.permit_kind().is_some() {
                return self.acquire_permit(req).await;
            }
            // A waiter's later attempts go straight to the queued attempt
            // (queued.rs): the plain one would be refused while it queues.
            if req.queue_ticket().is_some_and(|ticket| ticket > 0) {
                if let Some(answer) = self.queued_attempt(req, None).await? {
                    return Ok(answer);
                }
            }
            let now = self.now().await?;
            let ttl = duration_to_millis(req.ttl());
            // A mutex key only (no `kind`): on a reader-writer lock or a
            // semaphore the insert collides and the busy path says which;
            // likewise behind a queue, whose head goes first (queued.rs).
            let filter = doc! {
                "_id": req.key().as_str(),
                "kind": { "$exists": false },
                "qn": queue::nobody_queued(),
                "$or": [ { "owner": Bson::Null }, { "expiresAt": { "$lte": date(now.lower) } } ],
            };
            let update = doc! {
                "$set": {
                    "owner": req.owner().to_string(),
                    "holder": req.holder(),
                    "expiresAt": date(now.upper.saturating_add(ttl)),
                    "ttlMs": ttl,
                },
                "$inc": { "fence": 1_i64 },
                // A document created anew counts its tokens from the clock,
                // above every token of a document the sweep deleted.
                "$setOnInsert": { "base": base_at(now) },
            };
            let granted = self
                .inner
                .coll
                .find_one_and_update(filter, update)
                .upsert(true)
                .return_document(ReturnDocument::After)
                .projection(doc! { "fence": 1, "base": 1 })
                .await;
            match granted {
                Ok(Some(d)) => Ok(Acquire::Granted(req.granted(fence_of(&d)?))),
                // An upsert always returns the new document on mongod, but a
                // wire-compatible server may answer "no document" under
                // contention even when it applied the update. The server
                // decided atomically either way; read which way. Our owner
                // on the record does not prove that this attempt wrote it
                // (an earlier attempt of the same request may have, with an
                // older expiry), so a grant is extended from now first.
                Ok(None) => self.regrant_or_busy(req).await,
                Err(e) if is_duplicate_key(&e) => self.regrant_or_busy(req).await,
                Err(e) => Err(self.fail(e)),
            }
        })
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            if lease.slot().is_some() {
                return self.renew_permit(lease, ttl).await;
            }
            let now = self.now().await?;
            let ttl = duration_to_millis(ttl);
            // Not yet expired even by the latest possible "now": an expired
            // lease is never resurrected.
            let filter = doc! {
                "_id": lease.key().as_str(),
                "owner": lease.owner().to_string(),
                "expiresAt": { "$gt": date(now.upper) },
                "$expr": holds_token(token_as_i64(lease)?),
            };
            // `$max`, not `$set`: the expiry was computed from this
            // client's "now" before sending, and an update held on the way
            // can land after a later renewal of the same lease, which the
            // holder counted its deadline from. Never move it back.
            let update = doc! {
                "$max": { "expiresAt": date(now.upper.saturating_add(ttl)) },
                "$set": { "ttlMs": ttl },
            };
            let done = self
                .inner
                .coll
                .update_one(filter, update)
                .await
                .map_err(|e| self.fail(e))?;
            Ok(done.matched_count == 1)
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if lease.slot().is_some() {
                return self.release_permit(lease).await;
            }
            let token = token_as_i64(lease)?;
            let now = self.now().await?;
            // Nobody queued: the one write of before queues. Else (or if
            // the lease is gone) it misses, and the queued release hands
            // the key to the head (queued.rs).
            let filter = doc! {
                "_id": lease.key().as_str(),
                "owner": lease.owner().to_string(),
                "qn": queue::nobody_queued(),
                "$expr": holds_token(token),
            };
            let done = self
                .inner
                .coll
                .update_one(filter, freed(now))
                .await
                .map_err(|e| self.fail(e))?;
            if done.matched_count == 0 {
                return self.release_queued(lease).await;
            }
            if done.modified_count == 1 {
                // Waiters in this process need not wait for the change stream.
                self.inner.watcher.wake_local(lease.key().as_str());
                self.poke_sweeper();
            }
            Ok(())
        })
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Box::pin(async move {
            let (found, now) = self.record(key).await?;
            found.map_or(Ok(None), |d| info_of(&d, now))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        Box::pin(async move {
            let now = self.now().await?;
            // Keys with the prefix form one range in _id order (binary
            // string comparison); the filter never interprets the prefix.
            let filter = doc! {
                "_id": { "$gte": prefix },
                "owner": { "$type": "string" },
                "expiresAt": { "$gt": date(now.lower) },
            };
            let mut cursor = self.find_in_id_order(filter).await?;
            let mut out = Vec::new();
            while let Some(d) = cursor.try_next().await.map_err(|e| self.fail(e))? {
                if !d.get_str("_id").is_ok_and(|k| k.starts_with(prefix)) {
                    break;
                }
                out.extend(info_of(&d, now)?);
            }
            let permits = self.list_permits(prefix, false).await?;
            let rw = self.list_permits(prefix, true).await?;
            Ok(listing(out, permits.into_iter().chain(rw)))
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let mut update = freed(self.now().await?);
            update.insert("$inc", doc! { "fence": 1_i64 });
            let before = self
                .inner
                .coll
                .find_one_and_update(doc! { "_id": key.as_str() }, update)
                .return_document(ReturnDocument::Before)
                .await
                .map_err(|e| self.fail(e))?;
            let Some(before) = before else {
                return Ok(false);
            };
            if let Some(kind) = kind::kind_of(&before)? {
                // Not a mutex (the update above freed nothing): every
                // permit, reader and writer of the key.
                return self.force_release_slots(key, kind).await;
            }
            self.inner.watcher.wake_local(key.as_str());
            let now = self.now().await?;
            Ok(live(&before, now).is_some())
        })
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async move { Ok(self.inner.watcher.subscribe(key.as_str()).await) })
    }

    /// The queue lives in the key's document (queue.rs).
    fn queues(&self) -> bool {
        true
    }

    fn leave_queue<'a>(&'a self, key: &'a Key, owner: OwnerId) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.leave(key, owner))
    }

    /// Bumps the record's `announced` counter, an update the change stream
    /// carries like a release (the lease's own fields are untouched). A key
    /// with no record yet has nothing to announce.
    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            self.inner
                .coll
                .update_one(
                    doc! { "_id": key.as_str() },
                    doc! { "$inc": { "announced": 1_i64 } },
                )
                .await
                .map_err(|e| self.fail(e))?;
            self.inner.watcher.wake_local(key.as_str());
            Ok(true)
        })
    }

    /// Stops the change stream, then shuts the driver's client down (if
    /// this backend made it) without waiting for handles still alive: the
    /// driver's pool workers otherwise die with the runtime and can panic
    /// under a request in flight.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.inner.watcher.close().await;
            if self.inner.owns_client {
                self.inner
                    .db
                    .client()
                    .clone()
                    .shutdown()
                    .immediate(true)
                    .await;
            }
        })
    }
}
