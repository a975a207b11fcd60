//! The queue of waiters per key on MongoDB (the trait's `# Contract`,
//! issue 31), kept in the key's own lock document: MongoDB's atomicity is
//! per document, and a store without transactions (SecantusDB) cannot
//! span two.
//!
//! `{..., q: {<owner>: {s, h, c, t, e}}, qn, qe, qseq, handoff}`:
//!
//! - `q`: one entry per waiting owner: `s` its place, `h` its holder
//!   label, `c` its claim window in ms, `t` the ticket of the attempt that
//!   last wrote it, `e` when it dies (the server's clock). A map, not an
//!   array, so that an entry is found by its owner.
//! - `qn`: how many entries; absent when there are none. The uncontended
//!   acquire and release carry "no `qn`" in their filters, so a key nobody
//!   waits for costs one write each way, as before queues.
//! - `qe`: the latest `e`: the sweep keeps a document while an entry of
//!   it may live (sweep.rs).
//! - `qseq`: bumped by every write of the queue; the next entry's place,
//!   and the version a queued write is conditioned on.
//! - `handoff`: the message of the last hand-off
//!   ([`hand_off_message`]); the change stream carries it to the head's
//!   process (watch.rs). A string, so that the change event carries it
//!   whole.
//!
//! A queued step reads the document, decides here ([`Snapshot`]), and
//! writes once, conditioned on the document being as read
//! ([`Snapshot::unchanged`]); queued.rs retries on a conflict. Only
//! classic update operators: the whole queue is rewritten by each step.

use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};

use super::clock::ServerNow;
use super::record::{as_i64, date, decoder, freed, token_in};
use crate::backend::{
    duration_to_millis, millis_to_duration, AcquireRequest, HandOff, OwnerId, RecordDecoder,
};
use crate::error::Result;
use crate::notify::hand_off_message;

/// The filter clause of the uncontended acquire and release: nobody is
/// queued (no `qn`; a 0 written by hand counts as none).
pub(super) fn nobody_queued() -> Document {
    doc! { "$in": [Bson::Null, 0_i32] }
}

/// The sweep's clause: no entry of the document lives past `cutoff_ms`.
pub(super) fn no_entry_after(cutoff_ms: i64) -> Document {
    doc! { "$not": { "$gt": date(cutoff_ms) } }
}

/// One waiter's entry, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    owner: OwnerId,
    place: i64,
    holder: String,
    claim_ms: i64,
    ticket: u32,
    expires: i64,
}

impl Entry {
    fn read(owner: &str, value: &Bson, record: &RecordDecoder<'_>) -> Result<Entry> {
        let owner_id = record.owner(owner)?;
        let bad = |what: &str| record.corrupt(format!("queue entry {owner}: {what}"));
        let Bson::Document(e) = value else {
            return Err(bad("not a document"));
        };
        let int = |field: &str| e.get(field).and_then(as_i64);
        let place = int("s").ok_or_else(|| bad("the place is missing or not an integer"))?;
        let claim_ms = int("c")
            .filter(|ms| *ms > 0)
            .ok_or_else(|| bad("the claim window is missing or not positive"))?;
        let ticket = int("t")
            .and_then(|t| u32::try_from(t).ok())
            .ok_or_else(|| bad("the ticket is missing or out of range"))?;
        let expires = e
            .get_datetime("e")
            .map_err(|_| bad("the expiry is not a date"))?
            .timestamp_millis();
        let holder = e
            .get_str("h")
            .map_err(|_| bad("the holder label is not a string"))?;
        Ok(Entry {
            owner: owner_id,
            place,
            holder: holder.to_owned(),
            claim_ms,
            ticket,
            expires,
        })
    }

    fn stored(&self) -> Document {
        doc! {
            "s": self.place, "h": &self.holder, "c": self.claim_ms,
            "t": i64::from(self.ticket), "e": date(self.expires),
        }
    }
}

/// What a queued write did, once it lands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The requester is granted the key, with this token.
    Granted(u64),
    /// The key went to the queue's head.
    HandedOver {
        head: OwnerId,
        label: String,
        claim: Duration,
        grant: HandOff,
    },
    /// The requester's entry is in (or renewed): busy.
    Queued,
    /// The key is free, with nobody live queued: wake its subscribers.
    Freed,
    /// Only the queue changed.
    Left,
}

/// A write and what it does.
#[derive(Debug)]
pub(super) struct Plan {
    pub update: Document,
    pub outcome: Outcome,
}

/// A mutex's lock document as one read saw it, at `now`.
#[derive(Debug)]
pub(super) struct Snapshot<'a> {
    d: &'a Document,
    now: ServerNow,
    /// `base + fence`.
    token: i64,
    /// Every entry, dead or alive, by place.
    entries: Vec<Entry>,
    /// `qseq`, 0 if none.
    seq: i64,
}

impl<'a> Snapshot<'a> {
    /// Reads `d` (a mutex's document: no `kind`). A damaged queue is a
    /// corrupt record naming the key.
    pub(super) fn read(d: &'a Document, now: ServerNow) -> Result<Self> {
        let record = decoder(d)?;
        let mut entries = match d.get("q") {
            None | Some(Bson::Null) => Vec::new(),
            Some(Bson::Document(q)) => q
                .iter()
                .map(|(owner, value)| Entry::read(owner, value, &record))
                .collect::<Result<_>>()?,
            Some(_) => return Err(record.corrupt("the queue is not a document")),
        };
        entries.sort_by_key(|e| e.place);
        let seq = match d.get("qseq") {
            None | Some(Bson::Null) => 0,
            Some(b) => as_i64(b).ok_or_else(|| record.corrupt("qseq is not an integer"))?,
        };
        Ok(Snapshot {
            d,
            now,
            token: token_in(d)?,
            entries,
            seq,
        })
    }

    /// The filter of a write conditioned on the document being as read: a
    /// grant, release or hand-off changes `owner` or `fence`, a kind claim
    /// sets `kind`, a queue write bumps `qseq`, a sweep and a re-creation
    /// change `base`. (A renewal changes none, and needs not: it never
    /// revives a lease this read saw expired, nor ends one it saw live.)
    pub(super) fn unchanged(&self) -> Document {
        let same = |field: &str| self.d.get(field).cloned().unwrap_or(Bson::Null);
        doc! {
            "_id": same("_id"),
            "kind": { "$exists": false },
            "owner": same("owner"),
            "fence": same("fence"),
            "base": same("base"),
            "qseq": same("qseq"),
        }
    }

    /// The owner of the live lease, if any (live by the lower bound of
    /// "now", as the acquire's filter judges it).
    fn held_by(&self) -> Option<&str> {
        let owner = self.d.get_str("owner").ok()?;
        let expires = self.d.get_datetime("expiresAt").ok()?.timestamp_millis();
        (expires > self.now.lower).then_some(owner)
    }

    /// Whether `owner` holds the live lease.
    pub(super) fn held_by_owner(&self, owner: OwnerId) -> bool {
        self.held_by() == Some(owner.to_string().as_str())
    }

    /// The live entries other than `owner`'s, by place.
    fn live_others(&self, owner: Option<OwnerId>) -> Vec<Entry> {
        self.entries
            .iter()
            .filter(|e| e.expires > self.now.lower && Some(e.owner) != owner)
            .cloned()
            .collect()
    }

    /// An attempt of `req`, whose owner does not hold the key live (a
    /// repeat is answered by a renewal instead). `None`: nothing to write,
    /// busy as read.
    ///
    /// A free key goes to the live head if that is not the requester (and
    /// the requester enters or renews its entry, if it queues), else to
    /// the requester (its entry goes). A held key takes the requester's
    /// entry, if it queues. Dead entries go with any write.
    pub(super) fn attempt(&self, req: &AcquireRequest) -> Option<Plan> {
        let me = req.owner();
        let mine = req
            .queue_entry_ttl()
            .zip(req.queue_ticket())
            .map(|(ttl, ticket)| self.entry_for(req, ttl, ticket));
        let mut queue = self.live_others(Some(me));
        if self.held_by().is_some() {
            // Busy: only a request that queues writes (its entry).
            queue.push(mine?);
            queue.sort_by_key(|e| e.place);
            return Some(self.queue_only(queue, Outcome::Queued));
        }
        let head_first = queue
            .first()
            .is_some_and(|head| mine.as_ref().is_none_or(|m| head.place < m.place));
        if head_first {
            let head = queue.remove(0);
            queue.extend(mine);
            queue.sort_by_key(|e| e.place);
            return Some(self.hand_over(head, &queue));
        }
        let token = self.next_token()?;
        let ttl = duration_to_millis(req.ttl());
        let mut update = self.lease_to(&me.to_string(), req.holder(), ttl);
        update.merge(self.queue_fields(&queue));
        Some(Plan {
            update: update.0,
            outcome: Outcome::Granted(token),
        })
    }

    /// The release of the lease of `owner` with `token`: hands the key to
    /// the live head, or frees it. `None` if that lease is not the
    /// document's any more (released, or taken since it expired).
    pub(super) fn release(&self, owner: OwnerId, token: i64) -> Option<Plan> {
        if self.d.get_str("owner") != Ok(owner.to_string().as_str()) || self.token != token {
            return None;
        }
        Some(self.free_or_hand_over(self.live_others(Some(owner)), true))
    }

    /// `owner` leaves the queue, and gives back a grant handed over to it
    /// that it still holds: a key free after that goes to the live head.
    /// `None`: nothing to do.
    pub(super) fn leave(&self, owner: OwnerId) -> Option<Plan> {
        let holds = self.held_by_owner(owner);
        let queued = self.entries.iter().any(|e| e.owner == owner);
        if !holds && !queued {
            return None;
        }
        let queue = self.live_others(Some(owner));
        if holds || self.held_by().is_none() {
            return Some(self.free_or_hand_over(queue, holds));
        }
        Some(self.queue_only(queue, Outcome::Left))
    }

    /// A key free after this write: to the head of `queue` if any, else
    /// freed (`release`: the lease ends here) or left as it is.
    fn free_or_hand_over(&self, mut queue: Vec<Entry>, release: bool) -> Plan {
        if queue.is_empty() {
            if !release {
                return self.queue_only(queue, Outcome::Left);
            }
            let mut update = Update(freed(self.now));
            update.merge(self.queue_fields(&queue));
            return Plan {
                update: update.0,
                outcome: Outcome::Freed,
            };
        }
        let head = queue.remove(0);
        self.hand_over(head, &queue)
    }

    /// The grant to `head` (the next token, its label, its claim window
    /// from now; the message for its process), `queue` staying.
    fn hand_over(&self, head: Entry, queue: &[Entry]) -> Plan {
        let Some(token) = self.next_token() else {
            // A fence at the end of the range: no grant, the queue stays.
            return self.queue_only(queue.to_vec(), Outcome::Left);
        };
        let grant = HandOff {
            token,
            ticket: head.ticket,
        };
        let key = self.d.get_str("_id").unwrap_or_default();
        let mut update = self.lease_to(&head.owner.to_string(), &head.holder, head.claim_ms);
        update.add("$set", "handoff", hand_off_message(key, head.owner, grant));
        update.merge(self.queue_fields(queue));
        Plan {
            update: update.0,
            outcome: Outcome::HandedOver {
                head: head.owner,
                label: head.holder,
                claim: millis_to_duration(head.claim_ms),
                grant,
            },
        }
    }

    fn queue_only(&self, queue: Vec<Entry>, outcome: Outcome) -> Plan {
        Plan {
            update: self.queue_fields(&queue).0,
            outcome,
        }
    }

    /// The next grant's token, if the fence can grow.
    fn next_token(&self) -> Option<u64> {
        u64::try_from(self.token.checked_add(1)?).ok()
    }

    /// A new grant: the lease's fields, the fence bumped.
    fn lease_to(&self, owner: &str, holder: &str, ttl_ms: i64) -> Update {
        let mut update = Update(doc! {
            "$set": {
                "owner": owner,
                "holder": holder,
                "expiresAt": date(self.now.upper.saturating_add(ttl_ms)),
                "ttlMs": ttl_ms,
            },
        });
        update.add("$inc", "fence", 1_i64);
        update
    }

    /// The requester's entry: its place kept if it has one, else after
    /// every place given so far; its ticket and lease from this attempt.
    fn entry_for(&self, req: &AcquireRequest, ttl: Duration, ticket: u32) -> Entry {
        let place = self
            .entries
            .iter()
            .find(|e| e.owner == req.owner())
            .map_or(self.seq.saturating_add(1), |e| e.place);
        Entry {
            owner: req.owner(),
            place,
            holder: req.holder().to_owned(),
            claim_ms: duration_to_millis(req.claim_window()),
            ticket,
            expires: self.now.upper.saturating_add(duration_to_millis(ttl)),
        }
    }

    /// The queue's fields for `queue` (the entries that stay), and
    /// `qseq` bumped.
    fn queue_fields(&self, queue: &[Entry]) -> Update {
        let mut update = Update(doc! { "$inc": { "qseq": 1_i64 } });
        match queue.iter().map(|e| e.expires).max() {
            None => {
                for field in ["q", "qn", "qe"] {
                    update.add("$unset", field, "");
                }
            }
            Some(latest) => {
                let q: Document = queue
                    .iter()
                    .map(|e| (e.owner.to_string(), Bson::Document(e.stored())))
                    .collect();
                update.add("$set", "q", q);
                update.add("$set", "qn", queue.len() as i64);
                update.add("$set", "qe", date(latest));
            }
        }
        update
    }
}

/// An update document assembled operator by operator.
#[derive(Debug)]
struct Update(Document);

impl Update {
    fn add(&mut self, op: &str, field: &str, value: impl Into<Bson>) {
        if !self.0.contains_key(op) {
            self.0.insert(op, Document::new());
        }
        if let Ok(fields) = self.0.get_document_mut(op) {
            fields.insert(field, value);
        }
    }

    fn merge(&mut self, other: Update) {
        for (op, fields) in other.0 {
            if let Bson::Document(fields) = fields {
                for (field, value) in fields {
                    self.add(&op, &field, value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
