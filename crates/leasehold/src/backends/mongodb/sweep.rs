//! Idle lock documents go away, and tokens still only grow
//! (docs/storage.md).
//!
//! A lock document's token is `base + fence`: the base is the server's
//! clock in microseconds when the document was created ([`base_at`], the
//! lower bound of the estimate), the fence counts its grants. A fence grows
//! far slower than the clock (no server grants one key a million times a
//! second), so a token stays below the clock. A sweep deletes a document
//! only once its key has been idle for the window **and** its token is
//! below the clock of a window ago; a key that comes back is created at the
//! clock of then, above every token it had. MongoDB applies each document's
//! delete atomically with its filter, so a grant that took the key while
//! the sweep ran either changed the document first (then it no longer
//! matches: a live expiry) or finds it gone and creates it anew.
//!
//! One more case: a grant whose request read the clock, then reached the
//! server after the delete. Its base is still above the deleted token
//! unless the request was in flight for longer than the window, or the
//! clock estimate was off by that much (its error bound is milliseconds;
//! the default window an hour). The argument also assumes the server's
//! clock never steps back by more than the window (after a failover, the
//! new primary's clock agrees with the old one's).
//!
//! A pass walks the lock documents in `_id` order, [`BATCH`] at a time: a
//! read of the batch's last `_id`, then a `deleteMany` over the range for
//! mutex documents and one for semaphore and reader-writer documents (one
//! document per key, its slots inside: semaphore.rs), each idle past the
//! window with its tokens below the clock of a window ago. A grant of such
//! a key is one conditional write on that document too, so the same
//! argument holds: it lands before the delete (a later `lastEnd`: kept) or
//! after it (the document is gone: the grant creates it anew at the clock).
//!
//! [`base_at`]: super::record::base_at

use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};

use super::errors::STORE;
use super::queue::no_entry_after;
use super::record::{date, token_in};
use super::semaphore::{mark_of, slots_of};
use super::MongoBackend;
use crate::backend::duration_to_millis;
use crate::backend::RecordDecoder;
use crate::error::Result;

/// Documents per range (and so per `deleteMany`).
const BATCH: i64 = 256;

/// Where a pass starts: after every permits and reader-writer document
/// (their `_id`s start with `\u{1}`), below every key (a key has no
/// control characters).
const FIRST_AFTER: &str = "\u{2}";

/// The `_id` condition of the range `(after, last]` (no end if `last` is
/// `None`).
fn id_range(after: &str, last: Option<&str>) -> Document {
    let mut id = doc! { "$gt": after };
    if let Some(last) = last {
        id.insert("$lte", last);
    }
    id
}

/// The filter of one range's delete: mutex documents in `(after, last]`
/// (no end if `last` is `None`) idle since `cutoff_ms` with a token below
/// the clock then.
fn idle_in_range(after: &str, last: Option<&str>, cutoff_ms: i64) -> Document {
    doc! {
        "_id": id_range(after, last),
        "kind": { "$exists": false },
        "fence": { "$exists": true },
        "$or": [
            // Its last lease ended (expired, or released: release keeps
            // the time in `expiresAt`) a window ago.
            { "expiresAt": { "$lte": date(cutoff_ms) } },
            // Freed by an earlier version, which kept no time: idle since
            // long ago.
            { "expiresAt": Bson::Null, "owner": Bson::Null },
        ],
        "$expr": {
            "$lt": [
                { "$add": [ { "$ifNull": [ "$base", 0_i64 ] }, "$fence" ] },
                cutoff_ms.saturating_mul(1000),
            ]
        },
        // Nobody queued since then either: a live waiter keeps its place
        // (its entries go with the document, dead all).
        "qe": no_entry_after(cutoff_ms),
    }
}

/// The semaphore and reader-writer documents in `(after, last]` whose
/// last permit token is below the clock at `cutoff_ms`: the candidates
/// [`idle_since`] decides on. A document of an earlier version (no
/// `pfence`: its slots are in a document of their own) stays until a grant
/// moves it (semaphore.rs).
fn kinds_in_range(after: &str, last: Option<&str>, cutoff_ms: i64) -> Document {
    doc! {
        "_id": id_range(after, last),
        "kind": { "$exists": true },
        "pfence": { "$lt": cutoff_ms.saturating_mul(1000) },
    }
}

/// Whether a semaphore's or rw lock's document has been idle since
/// `cutoff_ms`: its last release, every slot left in it and a waiting
/// writer's mark ended by then, and its mutex-era token below the clock
/// then. (Which slots a document holds is a map of its own, which a
/// classic query cannot range over; so the pass reads the candidates and
/// decides here, and the delete is conditioned on the revision read.)
fn idle_since(d: &Document, cutoff_ms: i64) -> bool {
    let ended = |field: Option<Result<&mongodb::bson::DateTime, _>>| match field {
        None => true,
        Some(Ok(at)) => at.timestamp_millis() <= cutoff_ms,
        Some(Err(_)) => false,
    };
    let record = RecordDecoder::new(STORE, d.get_str("_id").unwrap_or_default());
    let slots_ended =
        slots_of(d, &record).is_ok_and(|slots| slots.iter().all(|s| s.expires <= cutoff_ms));
    let mark_ended = match d.get_document("mark") {
        Ok(_) => mark_of(d).is_some_and(|(_, _, exp)| exp <= cutoff_ms),
        Err(_) => d.get("mark").is_none(),
    };
    ended(
        d.contains_key("released")
            .then(|| d.get_datetime("released")),
    ) && slots_ended
        && mark_ended
        && token_in(d).is_ok_and(|t| t < cutoff_ms.saturating_mul(1000))
}

/// Ends the pass when dropped, also when its runtime shuts down mid-pass.
struct Running(MongoBackend);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.inner.sweeper.finish();
    }
}

impl MongoBackend {
    /// Starts a pass in the background if one is due (called after a
    /// release, the moment a document may have become idle). A pass that
    /// fails stops; the next due one starts over.
    pub(super) fn poke_sweeper(&self) {
        let Some((window, runtime)) = self.inner.sweeper.start_due() else {
            return;
        };
        let running = Running(self.clone());
        runtime.spawn(async move {
            if let Err(e) = running.0.sweep_idle(window).await {
                tracing::debug!(error = %e, "leasehold: mongodb sweep pass stopped");
            }
        });
    }

    /// Deletes the idle semaphore and reader-writer documents of one range:
    /// each only if it is still the revision read (every grant, renewal,
    /// release and mark bumps `rev`), so a grant that landed since keeps it.
    async fn sweep_kinds(&self, after: &str, end: Option<&str>, cutoff_ms: i64) -> Result<u64> {
        let candidates: Vec<Document> = self
            .inner
            .coll
            .find(kinds_in_range(after, end, cutoff_ms))
            .await
            .map_err(|e| self.fail(e))?
            .try_collect()
            .await
            .map_err(|e| self.fail(e))?;
        let idle: Vec<Document> = candidates
            .iter()
            .filter(|d| idle_since(d, cutoff_ms))
            .map(|d| {
                let same = |field: &str| d.get(field).cloned().unwrap_or(Bson::Null);
                doc! { "_id": same("_id"), "rev": same("rev"), "fence": same("fence"),
                "pfence": same("pfence") }
            })
            .collect();
        if idle.is_empty() {
            return Ok(0);
        }
        let done = self
            .inner
            .coll
            .delete_many(doc! { "$or": idle })
            .await
            .map_err(|e| self.fail(e))?;
        Ok(done.deleted_count)
    }

    /// Deletes the documents of keys idle for longer than `window` (and
    /// whose tokens are below the clock of a window ago), a
    /// range of documents at a time; answers how many went. The store runs
    /// this in the background after releases, at most once per half
    /// window; call it for a maintenance job or a test.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for a zero `window` (before any I/O);
    /// store errors otherwise (the documents deleted so far stay deleted).
    ///
    /// # Cancel safety
    /// Cancel safe: each range's delete is one operation.
    pub async fn sweep_idle(&self, window: Duration) -> Result<u64> {
        crate::backend::check_sweep_window(window)?;
        let mut after = FIRST_AFTER.to_owned();
        let mut deleted = 0;
        loop {
            let ids: Vec<Document> = self
                .inner
                .coll
                .find(doc! { "_id": { "$gt": &after } })
                .sort(doc! { "_id": 1 })
                .limit(BATCH)
                .projection(doc! { "_id": 1 })
                .await
                .map_err(|e| self.fail(e))?
                .try_collect()
                .await
                .map_err(|e| self.fail(e))?;
            let Some(last) = ids.last().and_then(|d| d.get_str("_id").ok()) else {
                return Ok(deleted);
            };
            // Not a full batch: the range runs to the end of the keys.
            let end = (ids.len() as i64 == BATCH).then_some(last);
            let cutoff_ms = self
                .now()
                .await?
                .lower
                .saturating_sub(duration_to_millis(window));
            let done = self
                .inner
                .coll
                .delete_many(idle_in_range(&after, end, cutoff_ms))
                .await
                .map_err(|e| self.fail(e))?;
            deleted += done.deleted_count;
            deleted += self.sweep_kinds(&after, end, cutoff_ms).await?;
            match end {
                Some(last) => after = last.to_owned(),
                None => return Ok(deleted),
            }
        }
    }
}
