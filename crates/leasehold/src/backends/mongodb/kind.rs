//! One key, one kind: the claim a semaphore or reader-writer grant makes on
//! the key's lock document (its anchor) before it touches its own slots.
//!
//! The lock document `{_id: key, ...}` carries `kind: "rw" | "sem"` once the
//! key is used as a reader-writer lock or a semaphore; no `kind` field is a
//! mutex. The mutex grant's filter requires no `kind` (the same
//! `findOneAndUpdate` that takes the key), and the claim here is one
//! `findOneAndUpdate` with upsert that sets the kind only if the document
//! already has it, or has none and no live mutex holder. MongoDB applies
//! each of them atomically to the one document, so of a mutex grant and a
//! claim racing on a free key exactly one wins, and the loser sees the
//! winner's write.
//!
//! The claim and the slot write that follows are two operations, not one
//! (MongoDB's atomicity is per document). That is still correct because a
//! claim is never undone: from the claim on, every mutex grant of the key
//! is refused, so a slot granted after its claim never meets a live mutex
//! holder (the claim itself required none). See docs/mongodb.md.

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;

use super::errors::{is_duplicate_key, STORE};
use super::record::{base_at, date, live, token_in};
use super::MongoBackend;
use crate::backend::{Acquire, Busy, KeyKind, RecordDecoder};
use crate::error::Result;
use crate::key::Key;

/// How often a claim is tried again when the document changed between the
/// refused claim and the read that explains it (a holder left meanwhile).
const RACES: usize = 3;

/// The kind a lock document records, `None` for a mutex (no `kind`).
pub(super) fn kind_of(d: &Document) -> Result<Option<KeyKind>> {
    let stored = match d.get("kind") {
        None | Some(Bson::Null) => None,
        Some(Bson::String(k)) => Some(k.as_str()),
        Some(_) => Some("\u{0}"),
    };
    match KeyKind::from_stored(stored) {
        Some(KeyKind::Mutex) => Ok(None),
        Some(kind) => Ok(Some(kind)),
        None => {
            let key = d.get_str("_id").unwrap_or_default();
            let found = d.get("kind").map(ToString::to_string).unwrap_or_default();
            Err(RecordDecoder::new(STORE, key).corrupt(format!("the kind is {found}")))
        }
    }
}

/// What a claim decided.
pub(super) enum Claim {
    /// The key is of the asked kind: go on. The lock document's token (its
    /// base plus its fence; the base alone if it never had a fence), which
    /// the slots' fence must stay above so the key's tokens keep rising
    /// across the change of kind and across a swept document.
    Ours(i64),
    /// The answer to give instead: busy behind a mutex holder, or the key
    /// is of another kind.
    Refused(Acquire),
}

impl MongoBackend {
    /// Claims `key`'s lock document for `kind` (a reader-writer lock or a
    /// semaphore): see the module docs.
    pub(super) async fn claim_kind(&self, key: &Key, kind: KeyKind) -> Result<Claim> {
        let wanted = kind.stored().unwrap_or_default();
        // A claim is never undone, so a key of this kind already needs no
        // write: a read, and no change event waking the key's waiters on
        // every grant.
        if let (Some(d), _) = self.record(key).await? {
            if kind_of(&d)? == Some(kind) {
                return Ok(Claim::Ours(token_in(&d)?));
            }
        }
        for _ in 0..RACES {
            let now = self.now().await?;
            // Three flat clauses (no nested $or): of the kind already, or a
            // mutex key with no owner, or one whose lease surely expired.
            let filter = doc! {
                "_id": key.as_str(),
                "$or": [
                    { "kind": wanted },
                    { "kind": { "$exists": false }, "owner": Bson::Null },
                    { "kind": { "$exists": false }, "expiresAt": { "$lte": date(now.lower) } },
                ],
            };
            let claimed = self
                .inner
                .coll
                .find_one_and_update(
                    filter,
                    doc! {
                        "$set": { "kind": wanted },
                        // A key created anew counts from the clock (`sweep.rs`).
                        "$setOnInsert": { "base": base_at(now) },
                    },
                )
                .upsert(true)
                .return_document(ReturnDocument::After)
                .projection(doc! { "fence": 1, "base": 1, "kind": 1 })
                .await;
            match claimed {
                Ok(Some(d)) => return Ok(Claim::Ours(token_in(&d)?)),
                // Not matched (the upsert's insert collided), or a
                // wire-compatible server's "no document" for an applied
                // upsert: the document says which.
                Ok(None) => {}
                Err(e) if is_duplicate_key(&e) => {}
                Err(e) => return Err(self.fail(e)),
            }
            let (found, now) = self.record(key).await?;
            let Some(d) = found else { continue };
            match kind_of(&d)? {
                Some(k) if k == kind => return Ok(Claim::Ours(token_in(&d)?)),
                Some(other) => return Ok(Claim::Refused(Acquire::OtherKind(other))),
                None => {
                    if let Some((holder, remaining)) = live(&d, now) {
                        return Ok(Claim::Refused(Acquire::Busy(Busy { holder, remaining })));
                    }
                    // The holder left since: claim again.
                }
            }
        }
        Ok(Claim::Refused(Acquire::Busy(Busy {
            holder: String::new(),
            remaining: std::time::Duration::ZERO,
        })))
    }
}
