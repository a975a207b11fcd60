//! MongoDB's semaphores and reader-writer locks: the key's own document
//! (the one a mutex would use) carries its kind and its slots, `{_id: key,
//! kind: "sem" | "rw", base, pfence, rev, releases, released, slots:
//! {"<slot>": {owner, holder, token, expiresAt, ttlMs}}, mark}`. One
//! document per key: MongoDB's atomicity is per document, so a grant's one
//! conditional write decides on the kind and the slots at once, and the
//! sweep deletes an idle key with one document (`sweep.rs`). `pfence` is
//! the last token a slot took (absolute); `released` the time of the
//! latest release (`$max`): the key is idle once that and every slot's
//! and mark's expiry are past.
//!
//! A grant reads the document and writes it back on condition that its
//! `pfence` and its revision `rev` are unchanged: the write is the one
//! atomic step that decides. Every grant, renewal, release and writer's
//! mark bumps `rev`, so a read older than any of them (a `readConcern:
//! majority` snapshot that missed a late renewal, in which a renewed slot
//! looks expired) matches nothing and is read again: a grant never
//! overwrites a slot renewed after its read. Counting live slots needs an
//! expression no classic update operator has, and this store keeps to
//! classic operators (wire-compatible servers). A lost race is retried a
//! few times, then reported busy with no time left, so a waiter tries again
//! at once. Expiry uses the clock estimate's bounds like the mutex: a slot
//! is free only once `expiresAt` is at or below the lower bound of the
//! server's "now". A release bumps `releases`, which the change stream
//! reports (the waiters of the key wake).
//!
//! One key is one lock: a mutex grant's filter requires no `kind`; the
//! first permit grant of a free mutex key sets the kind in the write that
//! takes its slot, conditioned on the mutex document being free and
//! unchanged (its fence) since the read; a key with no document is created
//! with its kind (a concurrent mutex upsert collides on `_id`).
//!
//! A reader-writer lock keeps readers in slots `0..MAX_PERMITS`, the writer
//! in `WRITER_SLOT`, and a waiting writer's `mark: {owner, holder,
//! expiresAt}`. Setting the mark bumps `pfence` too, so a reader's grant
//! racing with it matches nothing and reads again (see docs/rw-lock.md).
//!
//! Earlier versions kept the slots in a document of their own (`_id`
//! `"\u{1}permits:" + key` or `"\u{1}rw:" + key`) beside a kind-only
//! anchor. The first grant of such a key moves its fence into the key's
//! document and deletes the old one ([`MongoBackend::adopt_layout`]).

use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::results::UpdateResult;

use super::errors::{is_duplicate_key, STORE};
use super::kind::kind_of;
use super::record::{as_i64, base_at, date, live, token_as_i64, token_in};
use super::MongoBackend;
use crate::backend::{
    duration_to_millis, millis_to_duration, Acquire, AcquireRequest, Busy, KeyKind, Lease,
    PermitInfo, RecordDecoder, RwSide, MAX_PERMITS, WRITER_SLOT,
};
use crate::error::Result;
use crate::key::Key;

/// What an earlier version's permits document's `_id` started with; a key
/// has no control characters, so it never collides with a key's `_id`.
pub(super) const PERMITS_ID: &str = "\u{1}permits:";

/// What an earlier version's reader-writer document's `_id` started with.
pub(super) const RW_ID: &str = "\u{1}rw:";

/// Grant attempts per call when another grant of the key wins the race.
const RACES: usize = 3;

/// The `_id` of an earlier version's slots document of `key`.
fn earlier_id(key: &Key, rw: bool) -> String {
    let prefix = if rw { RW_ID } else { PERMITS_ID };
    format!("{prefix}{}", key.as_str())
}

/// A waiting writer's mark: owner, holder, expiry in ms.
pub(super) fn mark_of(d: &Document) -> Option<(String, String, i64)> {
    let m = d.get_document("mark").ok()?;
    Some((
        m.get_str("owner").ok()?.to_owned(),
        m.get_str("holder").unwrap_or_default().to_owned(),
        m.get_datetime("expiresAt").ok()?.timestamp_millis(),
    ))
}

/// One slot as read back.
pub(super) struct Slot {
    slot: u32,
    owner: String,
    holder: String,
    token: i64,
    pub(super) expires: i64,
    ttl: i64,
}

pub(super) fn slots_of(d: &Document, record: &RecordDecoder<'_>) -> Result<Vec<Slot>> {
    let Ok(slots) = d.get_document("slots") else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (name, value) in slots {
        let bad = |what: &str| record.corrupt(format!("permit slot {name:?}: {what}"));
        let Bson::Document(s) = value else {
            return Err(bad("not a document"));
        };
        out.push(Slot {
            slot: name.parse().map_err(|_| bad("not a slot number"))?,
            owner: s.get_str("owner").map_err(|_| bad("no owner"))?.to_owned(),
            holder: s.get_str("holder").unwrap_or_default().to_owned(),
            token: s
                .get("token")
                .and_then(as_i64)
                .ok_or_else(|| bad("no token"))?,
            expires: s
                .get_datetime("expiresAt")
                .map_err(|_| bad("no expiresAt date"))?
                .timestamp_millis(),
            ttl: s.get("ttlMs").and_then(as_i64).unwrap_or(i64::MAX),
        });
    }
    Ok(out)
}

/// The key's document as a grant read it.
enum Read {
    /// No document: the grant creates it, with its kind.
    Absent,
    /// A free mutex's document: the grant gives it its kind.
    FreeMutex(Document),
    /// A document of the asked kind.
    Ours(Document),
}

/// The busy answer for the live slots (and another owner's live mark):
/// the holder that expires first, with its time left.
fn first_to_expire(live: &[&Slot], mark: Option<&(String, String, i64)>, lower: i64) -> Busy {
    let first = live
        .iter()
        .map(|s| (&s.holder, (s.expires - lower).min(s.ttl)))
        .chain(mark.iter().map(|(_, h, exp)| (h, exp - lower)))
        .min_by_key(|(_, left)| *left);
    Busy {
        holder: first.map(|(h, _)| h.clone()).unwrap_or_default(),
        remaining: first.map_or(Duration::ZERO, |(_, left)| millis_to_duration(left)),
    }
}

impl MongoBackend {
    /// One single-document update of a key's document.
    async fn update_slot(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        let coll = &self.inner.coll;
        coll.update_one(filter, update)
            .await
            .map_err(|e| self.fail(e))
    }

    pub(super) async fn acquire_permit(&self, req: &AcquireRequest) -> Result<Acquire> {
        let side = req.rw_side();
        let key = req.key();
        let wanted = req.key_kind();
        let stored = wanted.stored().unwrap_or_default();
        let record = RecordDecoder::new(STORE, key.as_str());
        let owner = req.owner().to_string();
        let ttl = duration_to_millis(req.ttl());
        for _ in 0..RACES {
            let now = self.now().await?;
            let found = self.find(key).await?;
            #[cfg(test)]
            let found = self.take_stale_read().or(found);
            let read = match found {
                None => Read::Absent,
                Some(d) => match kind_of(&d)? {
                    Some(kind) if kind != wanted => return Ok(Acquire::OtherKind(kind)),
                    None => {
                        if let Some((holder, remaining)) = live(&d, now) {
                            return Ok(Acquire::Busy(Busy { holder, remaining }));
                        }
                        Read::FreeMutex(d)
                    }
                    Some(_) if d.get("pfence").is_none() => {
                        // Kept by an earlier version, its slots elsewhere.
                        if let Some(busy) = self.adopt_layout(key, side.is_some(), &d).await? {
                            return Ok(Acquire::Busy(busy));
                        }
                        continue;
                    }
                    Some(_) => Read::Ours(d),
                },
            };
            let ours = match &read {
                Read::Ours(d) => Some(d),
                _ => None,
            };
            // The last token of the key, and the condition that nothing
            // changed since the read.
            let (last, unchanged) = match &read {
                Read::Absent => (base_at(now), Document::new()),
                Read::FreeMutex(d) => (
                    token_in(d)?,
                    doc! {
                        "_id": key.as_str(),
                        "kind": { "$exists": false },
                        "fence": d.get("fence").cloned().unwrap_or(Bson::Null),
                        "$or": [ { "owner": Bson::Null }, { "expiresAt": { "$lte": date(now.lower) } } ],
                    },
                ),
                Read::Ours(d) => {
                    let pfence = d
                        .get("pfence")
                        .and_then(as_i64)
                        .ok_or_else(|| record.corrupt("the permit fence is not an integer"))?;
                    let rev = d.get("rev").and_then(as_i64);
                    (
                        pfence.max(token_in(d)?),
                        doc! {
                            "_id": key.as_str(),
                            "kind": stored,
                            "pfence": pfence,
                            "rev": rev.map_or(Bson::Null, Bson::Int64),
                        },
                    )
                }
            };
            let slots = match ours {
                Some(d) => slots_of(d, &record)?,
                None => Vec::new(),
            };
            // Live unless surely expired by the server's clock.
            let live: Vec<&Slot> = slots.iter().filter(|s| s.expires > now.lower).collect();
            // Another owner's live mark (a waiting writer), as a holder.
            let others_mark = ours
                .and_then(mark_of)
                .filter(|(o, _, exp)| *o != owner && *exp > now.lower);
            let busy = || Acquire::Busy(first_to_expire(&live, others_mark.as_ref(), now.lower));
            // A repeat by an owner whose grant (of this kind, on this side)
            // is live: that grant again, its expiry from now, as a renewal
            // (which checks it is still live at the store). Never a second
            // slot, never busy to its holder.
            let own = live.iter().find(|s| {
                s.owner == owner
                    && match side {
                        None => true,
                        Some(RwSide::Read) => s.slot != WRITER_SLOT,
                        Some(RwSide::Write) => s.slot == WRITER_SLOT,
                    }
            });
            if let Some(own) = own {
                let lease = req.granted_permit(own.slot, record.token(own.token)?);
                if self.renew_permit(&lease, req.ttl()).await? {
                    return Ok(Acquire::Granted(lease));
                }
                // It ended meanwhile: decide again on a fresh read.
                continue;
            }
            let writer_live = live.iter().any(|s| s.slot == WRITER_SLOT);
            let slot = match side {
                None => {
                    let permits = req.permits().unwrap_or(1);
                    if live.len() >= permits as usize {
                        return Ok(busy());
                    }
                    (0..permits)
                        .find(|n| !live.iter().any(|s| s.slot == *n))
                        .expect("a free slot below permits")
                }
                Some(_) if writer_live || others_mark.is_some() => return Ok(busy()),
                Some(RwSide::Read) => {
                    match (0..MAX_PERMITS).find(|n| !live.iter().any(|s| s.slot == *n)) {
                        Some(slot) => slot,
                        None => return Ok(busy()),
                    }
                }
                Some(RwSide::Write) if !live.is_empty() => {
                    // Readers hold: mark the lock as wanted, if this writer
                    // waits. The fence moves, so a racing reader's grant fails.
                    if let Some(life) = req.writer_mark_ttl() {
                        let ends = date(now.upper.saturating_add(duration_to_millis(life)));
                        let mark = doc! {
                            "owner": &owner,
                            "holder": req.holder(),
                            "expiresAt": ends,
                        };
                        let update = doc! {
                            "$set": { "mark": mark, "pfence": last + 1 },
                            "$inc": { "rev": 1_i64 },
                        };
                        let done = self.update_slot(unchanged, update).await?;
                        if done.matched_count != 1 {
                            continue;
                        }
                    }
                    return Ok(busy());
                }
                Some(RwSide::Write) => WRITER_SLOT,
            };
            let token = last + 1;
            let entry = doc! {
                "owner": &owner,
                "holder": req.holder(),
                "token": token,
                "expiresAt": date(now.upper.saturating_add(ttl)),
                "ttlMs": ttl,
            };
            let won = match read {
                Read::Absent => {
                    // Created at the clock, above every token of a document
                    // the sweep deleted (sweep.rs).
                    let fresh = doc! {
                        "_id": key.as_str(), "kind": stored, "base": last, "pfence": token,
                        "rev": 0_i64, "releases": 0_i64,
                        "slots": { slot.to_string(): entry },
                    };
                    match self.inner.coll.insert_one(fresh).await {
                        Ok(_) => true,
                        Err(e) if is_duplicate_key(&e) => false,
                        Err(e) => return Err(self.fail(e)),
                    }
                }
                Read::FreeMutex(_) => {
                    let update = doc! {
                        "$set": {
                            "kind": stored, "pfence": token, "rev": 0_i64, "releases": 0_i64,
                            "slots": { slot.to_string(): entry },
                        },
                    };
                    self.update_slot(unchanged, update).await?.matched_count == 1
                }
                Read::Ours(_) => {
                    let mut update = doc! {
                        "$set": { format!("slots.{slot}"): entry, "pfence": token },
                        "$inc": { "rev": 1_i64 },
                    };
                    if side == Some(RwSide::Write) {
                        // Granted: its own mark has done its work.
                        update.insert("$unset", doc! { "mark": "" });
                    }
                    self.update_slot(unchanged, update).await?.matched_count == 1
                }
            };
            if won {
                return Ok(Acquire::Granted(
                    req.granted_permit(slot, record.token(token)?),
                ));
            }
        }
        Ok(Acquire::Busy(Busy {
            holder: String::new(),
            remaining: Duration::ZERO,
        }))
    }

    /// Moves a key kept by an earlier version (its document with the kind
    /// only, its slots in a document of their own) to one document: the
    /// old slots document's fence becomes the key's `pfence`, and the old
    /// document goes. While the old document has a live slot (a process of
    /// the earlier version holds it), nothing moves: the answer is busy.
    async fn adopt_layout(&self, key: &Key, rw: bool, anchor: &Document) -> Result<Option<Busy>> {
        let id = earlier_id(key, rw);
        let coll = &self.inner.coll;
        let old = coll
            .find_one(doc! { "_id": &id })
            .await
            .map_err(|e| self.fail(e))?;
        let now = self.now().await?;
        let record = RecordDecoder::new(STORE, key.as_str());
        let mut pfence = token_in(anchor)?;
        if let Some(old) = &old {
            let slots = slots_of(old, &record)?;
            let live: Vec<&Slot> = slots.iter().filter(|s| s.expires > now.lower).collect();
            let mark = mark_of(old).filter(|(_, _, exp)| *exp > now.lower);
            if !live.is_empty() || mark.is_some() {
                return Ok(Some(first_to_expire(&live, mark.as_ref(), now.lower)));
            }
            pfence = pfence.max(old.get("fence").and_then(as_i64).unwrap_or(0));
        }
        let stored = kind_of(anchor)?
            .and_then(KeyKind::stored)
            .unwrap_or_default();
        coll.update_one(
            doc! { "_id": key.as_str(), "kind": stored, "pfence": { "$exists": false } },
            doc! { "$set": { "pfence": pfence, "rev": 0_i64, "releases": 0_i64,
            "released": date(now.upper), "slots": {} } },
        )
        .await
        .map_err(|e| self.fail(e))?;
        if let Some(old) = old {
            // Unless an earlier version's process wrote it since.
            let rev = old.get("rev").cloned().unwrap_or(Bson::Null);
            coll.delete_one(doc! { "_id": &id, "rev": rev })
                .await
                .map_err(|e| self.fail(e))?;
        }
        Ok(None)
    }

    /// Tests: the stale document the next read answers, if one was set.
    #[cfg(test)]
    fn take_stale_read(&self) -> Option<Document> {
        self.inner.stale_read.lock().unwrap().take()
    }

    /// The filter matching `lease`'s slot while it holds it.
    fn held(lease: &Lease) -> Result<(Document, String)> {
        let slot = format!("slots.{}", lease.slot().unwrap_or(u32::MAX));
        let filter = doc! {
            "_id": lease.key().as_str(),
            "kind": lease.key_kind().stored().unwrap_or_default(),
            format!("{slot}.owner"): lease.owner().to_string(),
            format!("{slot}.token"): token_as_i64(lease)?,
        };
        Ok((filter, slot))
    }

    pub(super) async fn renew_permit(&self, lease: &Lease, ttl: Duration) -> Result<bool> {
        let now = self.now().await?;
        let ttl = duration_to_millis(ttl);
        let (mut filter, slot) = Self::held(lease)?;
        // Not expired even by the latest possible "now": never revived.
        filter.insert(format!("{slot}.expiresAt"), doc! { "$gt": date(now.upper) });
        // `$max`: a renewal held on the way never moves the expiry back
        // behind a later one (see `MongoBackend::renew`).
        let update = doc! {
            "$max": { format!("{slot}.expiresAt"): date(now.upper.saturating_add(ttl)) },
            "$set": { format!("{slot}.ttlMs"): ttl },
            // A grant decided on a read from before this renewal must fail.
            "$inc": { "rev": 1_i64 },
        };
        let done = self.update_slot(filter, update).await?;
        Ok(done.matched_count == 1)
    }

    pub(super) async fn release_permit(&self, lease: &Lease) -> Result<()> {
        let (filter, slot) = Self::held(lease)?;
        let now = self.now().await?;
        let update = doc! {
            "$unset": { slot: "" },
            "$inc": { "releases": 1_i64, "rev": 1_i64 },
            // Since when the key may be idle (sweep.rs).
            "$max": { "released": date(now.upper) },
        };
        let done = self.update_slot(filter, update).await?;
        if done.modified_count == 1 {
            self.inner.watcher.wake_local(lease.key().as_str());
            self.poke_sweeper();
        }
        Ok(())
    }

    /// Frees every slot (and a waiting writer's mark) of `key`, a key of
    /// kind `kind`, and bumps the fence the next grant counts from.
    /// Whether a live slot was broken.
    pub(super) async fn force_release_slots(&self, key: &Key, kind: KeyKind) -> Result<bool> {
        let now = self.now().await?;
        let before = self
            .inner
            .coll
            .find_one_and_update(
                // Not a key of an earlier version (no `pfence`): its fence
                // is in its old slots document, below.
                doc! { "_id": key.as_str(), "kind": kind.stored().unwrap_or_default(),
                "pfence": { "$exists": true } },
                doc! {
                    "$unset": { "slots": "", "mark": "" },
                    "$inc": { "pfence": 1_i64, "releases": 1_i64, "rev": 1_i64 },
                    "$max": { "released": date(now.upper) },
                },
            )
            .return_document(mongodb::options::ReturnDocument::Before)
            .await
            .map_err(|e| self.fail(e))?;
        // An earlier version's slots document, if the key still has one.
        let earlier = self
            .inner
            .coll
            .find_one_and_update(
                doc! { "_id": earlier_id(key, kind == KeyKind::ReaderWriter) },
                doc! {
                    "$unset": { "slots": "", "mark": "" },
                    "$inc": { "fence": 1_i64, "releases": 1_i64, "rev": 1_i64 },
                },
            )
            .return_document(mongodb::options::ReturnDocument::Before)
            .await
            .map_err(|e| self.fail(e))?;
        if before.is_none() && earlier.is_none() {
            return Ok(false);
        }
        self.inner.watcher.wake_local(key.as_str());
        let now = self.now().await?;
        let record = RecordDecoder::new(STORE, key.as_str());
        let mut broke = false;
        for d in before.iter().chain(earlier.iter()) {
            broke |= slots_of(d, &record)?.iter().any(|s| s.expires > now.lower);
        }
        Ok(broke)
    }

    /// The live semaphore permits (or, with `rw`, reader-writer grants)
    /// under `prefix`: in the keys' documents, and in the slots documents
    /// of earlier versions not yet moved.
    pub(super) async fn list_permits(&self, prefix: &str, rw: bool) -> Result<Vec<PermitInfo>> {
        let kind = if rw {
            KeyKind::ReaderWriter
        } else {
            KeyKind::Semaphore
        };
        let now = self.now().await?;
        let mut out = Vec::new();
        let earlier_prefix = if rw { RW_ID } else { PERMITS_ID };
        for (id_prefix, filter) in [
            (
                "",
                doc! { "_id": { "$gte": prefix }, "kind": kind.stored().unwrap_or_default() },
            ),
            (
                earlier_prefix,
                doc! { "_id": { "$gte": format!("{earlier_prefix}{prefix}") } },
            ),
        ] {
            let mut cursor = self.find_in_id_order(filter).await?;
            while let Some(d) = cursor.try_next().await.map_err(|e| self.fail(e))? {
                let Some(key) = d
                    .get_str("_id")
                    .ok()
                    .and_then(|id| id.strip_prefix(id_prefix))
                else {
                    break;
                };
                if !key.starts_with(prefix) {
                    break;
                }
                let record = RecordDecoder::new(STORE, key);
                let mut slots = slots_of(&d, &record)?;
                slots.sort_by_key(|s| s.slot);
                for s in slots.iter().filter(|s| s.expires > now.lower) {
                    out.push(record.slot_info(
                        rw,
                        i64::from(s.slot),
                        &s.owner,
                        Some(s.holder.clone()),
                        s.token,
                        (s.expires - now.lower).min(s.ttl),
                    )?);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(all(test, feature = "conformance"))]
mod tests {
    use super::*;
    use crate::backends::mongodb::MongoOptions;

    /// A grant decided on a read older than a renewal (a lagging majority
    /// snapshot, injected here) must not take the renewed slot: before the
    /// revision, the write was conditioned on the fence alone, which the
    /// renewal left, so it matched and two owners held slot 0.
    #[tokio::test]
    async fn a_grant_never_overwrites_a_permit_renewed_after_its_read() {
        let Some(url) = crate::test_server::server_url("LEASEHOLD_TEST_MONGODB") else {
            return;
        };
        let collection = format!("stale_read_{:016x}", rand::random::<u64>());
        let options = MongoOptions::new().with_collection(collection);
        let backend = MongoBackend::connect_with(&url, options).await.unwrap();
        let key = Key::new("sem").unwrap();
        // Long enough that the read and the renewal below land inside it on
        // a loaded test server (300 ms did not: the renewal found the
        // permit expired in a CI run, a false failure).
        let first_ttl = Duration::from_millis(1500);
        let a = AcquireRequest::permit(key.clone(), first_ttl, "a", 1).unwrap();
        let Acquire::Granted(held) = backend.acquire_permit(&a).await.unwrap() else {
            panic!("a free semaphore grants");
        };
        let snapshot = backend
            .inner
            .coll
            .find_one(doc! { "_id": key.as_str() })
            .await
            .unwrap()
            .expect("the semaphore's document");
        assert!(backend
            .renew_permit(&held, Duration::from_secs(30))
            .await
            .unwrap());
        // Past the first expiry by any clock bound: in the snapshot, the
        // slot now looks free.
        tokio::time::sleep(first_ttl + Duration::from_millis(700)).await;
        *backend.inner.stale_read.lock().unwrap() = Some(snapshot);
        let b = AcquireRequest::permit(key.clone(), Duration::from_secs(30), "b", 1).unwrap();
        let answer = backend.acquire_permit(&b).await.unwrap();
        let listed = backend.list_permits("sem", false).await.unwrap();
        backend.inner.coll.drop().await.unwrap();
        assert!(
            matches!(answer, Acquire::Busy(_)),
            "the renewed permit is still held: {answer:?}"
        );
        assert_eq!(
            listed.iter().map(|p| p.token).collect::<Vec<_>>(),
            [held.token()],
            "the renewed holder alone holds"
        );
    }
}
