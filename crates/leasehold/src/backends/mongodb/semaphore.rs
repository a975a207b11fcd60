//! MongoDB's semaphores: one document per semaphore key in the lease
//! collection, `{_id: "\u{1}permits:" + key, fence, releases, slots: {"<slot>":
//! {owner, holder, token, expiresAt, ttlMs}}}`, never deleted (the fence
//! lives there). Its `_id` starts with a control character, which no key
//! has, so it never meets a mutex's document; the lease queries skip it
//! (it has no top-level `owner`).
//!
//! A grant reads the document and writes it back on condition that its
//! fence and its revision `rev` are unchanged: the write is the one atomic
//! step that decides. Every grant, renewal, release and writer's mark bumps
//! `rev`, so a read older than any of them (a `readConcern: majority`
//! snapshot that missed a late renewal, in which a renewed slot looks
//! expired) matches nothing and is read again: a grant never overwrites a
//! slot renewed after its read. (The fence alone would not do: renewals and
//! releases leave it.) A document from before `rev` existed has none, which
//! the condition matches as null until the first write sets it. Counting
//! live slots needs an expression no classic update operator has, and
//! this store keeps to classic operators (wire-compatible servers). A lost
//! race is retried a few times, then reported busy with no time left, so
//! a waiter tries again at once. Expiry uses the clock estimate's bounds
//! like the mutex: a slot is free only once `expiresAt` is at or below the
//! lower bound of the server's "now". A release bumps `releases`, which
//! the change stream reports (the waiters of the key wake).
//!
//! A reader-writer lock has a document of the same shape under its own
//! `_id` prefix (`"\u{1}rw:" + key`): readers in slots `0..MAX_PERMITS`,
//! the writer in `WRITER_SLOT`, and a waiting writer's `mark: {owner,
//! holder, expiresAt}`. Its grant is the same read and conditional write;
//! setting the mark bumps the fence too, so a reader's grant racing with it
//! matches nothing and reads again (see docs/rw-lock.md).

use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::results::UpdateResult;

use super::errors::{is_duplicate_key, STORE};
use super::kind::Claim;
use super::record::{as_i64, date, token_as_i64};
use super::MongoBackend;
use crate::backend::{
    duration_to_millis, millis_to_duration, Acquire, AcquireRequest, Busy, KeyKind, Lease,
    PermitInfo, RecordDecoder, RwSide, MAX_PERMITS, WRITER_SLOT,
};
use crate::error::Result;
use crate::key::Key;

/// What a permits document's `_id` starts with; a key has no control
/// characters, so this never collides with a mutex's `_id`.
pub(super) const PERMITS_ID: &str = "\u{1}permits:";

/// What a reader-writer lock's document's `_id` starts with.
pub(super) const RW_ID: &str = "\u{1}rw:";

/// Grant attempts per call when another grant of the key wins the race.
const RACES: usize = 3;

fn id_of(key: &Key) -> String {
    format!("{PERMITS_ID}{}", key.as_str())
}

/// The `_id` of `key`'s semaphore, or of its reader-writer lock.
fn family_id(key: &Key, rw: bool) -> String {
    if rw {
        format!("{RW_ID}{}", key.as_str())
    } else {
        id_of(key)
    }
}

/// A waiting writer's mark: owner, holder, expiry in ms.
fn mark_of(d: &Document) -> Option<(String, String, i64)> {
    let m = d.get_document("mark").ok()?;
    Some((
        m.get_str("owner").ok()?.to_owned(),
        m.get_str("holder").unwrap_or_default().to_owned(),
        m.get_datetime("expiresAt").ok()?.timestamp_millis(),
    ))
}

/// One slot as read back.
struct Slot {
    slot: u32,
    owner: String,
    holder: String,
    token: i64,
    expires: i64,
    ttl: i64,
}

fn slots_of(d: &Document, record: &RecordDecoder<'_>) -> Result<Vec<Slot>> {
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

impl MongoBackend {
    /// One single-document update of a semaphore's document.
    async fn update_slot(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        let coll = &self.inner.coll;
        coll.update_one(filter, update)
            .await
            .map_err(|e| self.fail(e))
    }

    pub(super) async fn acquire_permit(&self, req: &AcquireRequest) -> Result<Acquire> {
        let side = req.rw_side();
        let id = family_id(req.key(), side.is_some());
        let record = RecordDecoder::new(STORE, req.key().as_str());
        let owner = req.owner().to_string();
        let ttl = duration_to_millis(req.ttl());
        // The key's lock document first: one key is one lock (kind.rs).
        let anchor_fence = match self.claim_kind(req.key(), req.key_kind()).await? {
            Claim::Ours(fence) => fence,
            Claim::Refused(answer) => return Ok(answer),
        };
        for _ in 0..RACES {
            let now = self.now().await?;
            let found = self
                .inner
                .coll
                .find_one(doc! { "_id": &id })
                .await
                .map_err(|e| self.fail(e))?;
            #[cfg(test)]
            let found = self.take_stale_read().or(found);
            // The write below is conditioned on these: what it was decided on.
            let rev = found.as_ref().and_then(|d| d.get("rev")).and_then(as_i64);
            let unchanged = |fence: i64| {
                doc! { "_id": &id, "fence": fence, "rev": rev.map_or(Bson::Null, Bson::Int64) }
            };
            let (fence, slots) = match &found {
                Some(d) => (
                    d.get("fence")
                        .and_then(as_i64)
                        .ok_or_else(|| record.corrupt("the permit fence is missing"))?,
                    slots_of(d, &record)?,
                ),
                None => (0, Vec::new()),
            };
            // Live unless surely expired by the server's clock.
            let live: Vec<&Slot> = slots.iter().filter(|s| s.expires > now.lower).collect();
            // Another owner's live mark (a waiting writer), as a holder.
            let others_mark = found
                .as_ref()
                .and_then(mark_of)
                .filter(|(o, _, exp)| *o != owner && *exp > now.lower);
            let busy = || {
                let first = live
                    .iter()
                    .map(|s| (&s.holder, (s.expires - now.lower).min(s.ttl)))
                    .chain(others_mark.iter().map(|(_, h, exp)| (h, exp - now.lower)))
                    .min_by_key(|(_, left)| *left);
                Acquire::Busy(Busy {
                    holder: first.map(|(h, _)| h.clone()).unwrap_or_default(),
                    remaining: first.map_or(Duration::ZERO, |(_, left)| millis_to_duration(left)),
                })
            };
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
                    if let (Some(life), Some(_)) = (req.writer_mark_ttl(), &found) {
                        let mark = doc! {
                            "owner": &owner,
                            "holder": req.holder(),
                            "expiresAt": date(now.upper.saturating_add(duration_to_millis(life))),
                        };
                        let update = doc! {
                            "$set": { "mark": mark, "fence": fence + 1 },
                            "$inc": { "rev": 1_i64 },
                        };
                        let done = self.update_slot(unchanged(fence), update).await?;
                        if done.matched_count != 1 {
                            continue;
                        }
                    }
                    return Ok(busy());
                }
                Some(RwSide::Write) => WRITER_SLOT,
            };
            // Above the mutex's tokens too: the key's tokens keep rising
            // when a mutex key becomes a reader-writer lock or a semaphore.
            let token = fence.max(anchor_fence) + 1;
            let entry = doc! {
                "owner": &owner,
                "holder": req.holder(),
                "token": token,
                "expiresAt": date(now.upper.saturating_add(ttl)),
                "ttlMs": ttl,
            };
            let won = match found {
                None => {
                    let fresh = doc! { "_id": &id, "fence": token, "releases": 0_i64,
                    "rev": 0_i64, "slots": { slot.to_string(): entry } };
                    match self.inner.coll.insert_one(fresh).await {
                        Ok(_) => true,
                        Err(e) if is_duplicate_key(&e) => false,
                        Err(e) => return Err(self.fail(e)),
                    }
                }
                Some(_) => {
                    let mut update = doc! {
                        "$set": { format!("slots.{slot}"): entry, "fence": token },
                        "$inc": { "rev": 1_i64 },
                    };
                    if side == Some(RwSide::Write) {
                        // Granted: its own mark has done its work.
                        update.insert("$unset", doc! { "mark": "" });
                    }
                    let done = self.update_slot(unchanged(fence), update).await?;
                    done.matched_count == 1
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

    /// Tests: the stale document the next read answers, if one was set.
    #[cfg(test)]
    fn take_stale_read(&self) -> Option<Document> {
        self.inner.stale_read.lock().unwrap().take()
    }

    /// The filter matching `lease`'s slot while it holds it.
    fn held(lease: &Lease) -> Result<(Document, String)> {
        let slot = format!("slots.{}", lease.slot().unwrap_or(u32::MAX));
        let filter = doc! {
            "_id": family_id(lease.key(), lease.rw_side().is_some()),
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
        let update = doc! { "$unset": { slot: "" }, "$inc": { "releases": 1_i64, "rev": 1_i64 } };
        let done = self.update_slot(filter, update).await?;
        if done.modified_count == 1 {
            self.inner.watcher.wake_local(lease.key().as_str());
        }
        Ok(())
    }

    /// Frees every slot (and a waiting writer's mark) of `key`, a key of
    /// kind `kind`, and bumps the fence the next grant counts from.
    /// Whether a live slot was broken.
    pub(super) async fn force_release_slots(&self, key: &Key, kind: KeyKind) -> Result<bool> {
        let id = family_id(key, kind == KeyKind::ReaderWriter);
        let before = self
            .inner
            .coll
            .find_one_and_update(
                doc! { "_id": &id },
                doc! {
                    "$unset": { "slots": "", "mark": "" },
                    "$inc": { "fence": 1_i64, "releases": 1_i64, "rev": 1_i64 },
                },
            )
            .return_document(mongodb::options::ReturnDocument::Before)
            .await
            .map_err(|e| self.fail(e))?;
        let Some(before) = before else {
            return Ok(false);
        };
        self.inner.watcher.wake_local(key.as_str());
        let now = self.now().await?;
        let record = RecordDecoder::new(STORE, key.as_str());
        Ok(slots_of(&before, &record)?
            .iter()
            .any(|s| s.expires > now.lower))
    }

    /// The live semaphore permits (or, with `rw`, reader-writer grants)
    /// under `prefix`.
    pub(super) async fn list_permits(&self, prefix: &str, rw: bool) -> Result<Vec<PermitInfo>> {
        let id_prefix = if rw { RW_ID } else { PERMITS_ID };
        let now = self.now().await?;
        let start = format!("{id_prefix}{prefix}");
        let mut cursor = self
            .inner
            .coll
            .find(doc! { "_id": { "$gte": &start } })
            .sort(doc! { "_id": 1 })
            .await
            .map_err(|e| self.fail(e))?;
        let mut out = Vec::new();
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
        let Some(url) = crate::conformance::server_url("LEASEHOLD_TEST_MONGODB") else {
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
            .find_one(doc! { "_id": id_of(&key) })
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
