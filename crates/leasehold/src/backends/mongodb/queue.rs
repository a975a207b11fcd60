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
//!   array: each write touches the entries it means by their owner
//!   (`$set`/`$unset` of `q.<owner>`), so writers of different entries do
//!   not conflict.
//! - `qn`: how many entries; absent or 0 when none. The uncontended
//!   acquire and release carry "`qn` absent or 0" in their filters, so a
//!   key nobody waits for costs one write each way, as before queues.
//! - `qe`: the latest `e` ever written (`$max`): the sweep keeps a
//!   document while an entry of it may live (sweep.rs).
//! - `qseq`: bumped by each entry that enters; the next entry's place.
//!   Two that enter at once may share a place: the owner orders them.
//! - `handoff`: the message of the last hand-off
//!   ([`hand_off_message`]); the change stream carries it to the head's
//!   process (watch.rs). A string, so that the change event carries it
//!   whole.
//!
//! A queued step reads the document, decides here ([`Snapshot`]), and
//! writes once ([`Plan`]), conditioned on what it decided on being as
//! read: the lease (owner, fence, base) for a grant, a release, a
//! hand-off or a newcomer's entry; each entry it removes (its place; a
//! dead one's expiry, which a late renewal changes); its own entry's
//! place for a renewal. queued.rs retries on a conflict. Classic update
//! operators only.

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

/// A waiter's renewal of its entry while another owner holds the key
/// live, with no read first (a filter and an update): what most of a
/// waiter's attempts are, one round trip instead of a read and a write.
/// It matches what [`Snapshot::attempt`] would decide on a read (busy,
/// renew the entry in place); when it does not match (the key went to
/// this waiter, or is free, or the entry is gone), the attempt reads.
/// `None` for a request that does not queue.
pub(super) fn renewal_while_held(
    req: &AcquireRequest,
    now: ServerNow,
) -> Option<(Document, Document)> {
    let (ttl, ticket) = req.queue_entry_ttl().zip(req.queue_ticket())?;
    let me = req.owner().to_string();
    let path = format!("q.{me}");
    let expires = date(now.upper.saturating_add(duration_to_millis(ttl)));
    let mut filter = doc! { "_id": req.key().as_str(), "kind": { "$exists": false } };
    filter.insert(&path, doc! { "$exists": true });
    filter.insert("owner", doc! { "$type": "string", "$ne": &me });
    filter.insert("expiresAt", doc! { "$gt": date(now.lower) });
    let mut set = Document::new();
    set.insert(format!("{path}.t"), i64::from(ticket));
    set.insert(format!("{path}.e"), expires);
    Some((filter, doc! { "$set": set, "$max": { "qe": expires } }))
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

/// A conditional write and what it does.
#[derive(Debug)]
pub(super) struct Plan {
    pub filter: Document,
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
    /// Every entry, dead or alive, in order.
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
        // Entries that came at once may share a place: the owner decides.
        entries.sort_by_key(|e| (e.place, e.owner.to_string()));
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

    fn entry_of(&self, owner: OwnerId) -> Option<&Entry> {
        self.entries.iter().find(|e| e.owner == owner)
    }

    /// The live entries other than `owner`'s, in order.
    fn live_others(&self, owner: OwnerId) -> impl Iterator<Item = &Entry> {
        self.entries
            .iter()
            .filter(move |e| e.expires > self.now.lower && e.owner != owner)
    }

    /// A write that the key's lease must still be as read for: it grants,
    /// frees or hands over, and drops the dead entries it saw.
    fn on_the_lease(&self, owner: OwnerId) -> Write {
        let mut write = Write::new(self.d);
        let same = |field: &str| self.d.get(field).cloned().unwrap_or(Bson::Null);
        for field in ["owner", "fence", "base"] {
            write.filter.insert(field, same(field));
        }
        for dead in self
            .entries
            .iter()
            .filter(|e| e.expires <= self.now.lower && e.owner != owner)
        {
            write.drop_dead(dead);
        }
        write
    }

    /// An attempt of `req`, whose owner does not hold the key live (a
    /// repeat is answered by a renewal instead). `None`: nothing to write,
    /// busy as read.
    ///
    /// A free key goes to the live head if that is not the requester (and
    /// the requester enters or renews its entry, if it queues), else to
    /// the requester (its entry goes). A held key takes the requester's
    /// entry, if it queues.
    pub(super) fn attempt(&self, req: &AcquireRequest) -> Option<Plan> {
        let me = req.owner();
        let held = self.entry_of(me);
        let mine = req
            .queue_entry_ttl()
            .zip(req.queue_ticket())
            .map(|(ttl, ticket)| self.entry_for(req, held, ttl, ticket));
        if self.held_by().is_some() {
            // Busy: only a request that queues writes, its own entry. A
            // renewal needs nothing else as read (a hand-off to this
            // owner removes the entry, and the renewal then misses); a
            // newcomer needs the lease as read, so that a release in
            // between is not missed.
            let mine = mine?;
            let mut write = match held {
                Some(_) => Write::new(self.d),
                None => self.on_the_lease(me),
            };
            write.queue(&mine, held);
            return Some(write.plan(Outcome::Queued));
        }
        let mut write = self.on_the_lease(me);
        let head = self
            .live_others(me)
            .next()
            .filter(|head| mine.as_ref().is_none_or(|m| head.key() < m.key()));
        match head {
            Some(head) => {
                if let Some(mine) = &mine {
                    write.queue(mine, held);
                }
                self.hand_over(write, head)
            }
            None => {
                let token = self.next_token()?;
                if let Some(held) = held {
                    write.leave(held);
                }
                let ttl = duration_to_millis(req.ttl());
                self.lease_to(&mut write, &me.to_string(), req.holder(), ttl);
                Some(write.plan(Outcome::Granted(token)))
            }
        }
    }

    /// The release of the lease of `owner` with `token`: hands the key to
    /// the live head, or frees it. `None` if that lease is not the
    /// document's any more (released, or taken since it expired).
    pub(super) fn release(&self, owner: OwnerId, token: i64) -> Option<Plan> {
        if self.d.get_str("owner") != Ok(owner.to_string().as_str()) || self.token != token {
            return None;
        }
        let mut write = self.on_the_lease(owner);
        if let Some(mine) = self.entry_of(owner) {
            write.leave(mine);
        }
        match self.live_others(owner).next() {
            Some(head) => self.hand_over(write, head),
            None => {
                write.update.merge(Update(freed(self.now)));
                Some(write.plan(Outcome::Freed))
            }
        }
    }

    /// `owner` leaves the queue, and gives back a grant handed over to it
    /// that it still holds: a key free after that goes to the live head.
    /// `None`: nothing to do.
    pub(super) fn leave(&self, owner: OwnerId) -> Option<Plan> {
        if self.held_by_owner(owner) {
            let token = self.token;
            return self.release(owner, token);
        }
        let mine = self.entry_of(owner)?;
        if self.held_by().is_none() {
            if let Some(head) = self.live_others(owner).next() {
                let mut write = self.on_the_lease(owner);
                write.leave(mine);
                return self.hand_over(write, head);
            }
        }
        let mut write = Write::new(self.d);
        write.leave(mine);
        Some(write.plan(Outcome::Left))
    }

    /// Adds the grant to `head` to `write`: the next token, its label, its
    /// claim window from now, its entry gone, and the message for its
    /// process. `None` for a fence at the end of its range.
    fn hand_over(&self, mut write: Write, head: &Entry) -> Option<Plan> {
        let token = self.next_token()?;
        let grant = HandOff {
            token,
            ticket: head.ticket,
        };
        write.leave(head);
        let key = self.d.get_str("_id").unwrap_or_default();
        self.lease_to(
            &mut write,
            &head.owner.to_string(),
            &head.holder,
            head.claim_ms,
        );
        write
            .update
            .add("$set", "handoff", hand_off_message(key, head.owner, grant));
        Some(write.plan(Outcome::HandedOver {
            head: head.owner,
            label: head.holder.clone(),
            claim: millis_to_duration(head.claim_ms),
            grant,
        }))
    }

    /// The next grant's token, if the fence can grow.
    fn next_token(&self) -> Option<u64> {
        u64::try_from(self.token.checked_add(1)?).ok()
    }

    /// A new grant in `write`: the lease's fields, the fence bumped.
    fn lease_to(&self, write: &mut Write, owner: &str, holder: &str, ttl_ms: i64) {
        let expires = date(self.now.upper.saturating_add(ttl_ms));
        for (field, value) in [
            ("owner", Bson::from(owner)),
            ("holder", Bson::from(holder)),
            ("expiresAt", Bson::from(expires)),
            ("ttlMs", Bson::from(ttl_ms)),
        ] {
            write.update.add("$set", field, value);
        }
        write.update.add("$inc", "fence", 1_i64);
    }

    /// The requester's entry: its place kept if it has one (`held`), else
    /// after every place given so far; its ticket and lease from this
    /// attempt.
    fn entry_for(
        &self,
        req: &AcquireRequest,
        held: Option<&Entry>,
        ttl: Duration,
        ticket: u32,
    ) -> Entry {
        Entry {
            owner: req.owner(),
            place: held.map_or(self.seq.saturating_add(1), |e| e.place),
            holder: req.holder().to_owned(),
            claim_ms: duration_to_millis(req.claim_window()),
            ticket,
            expires: self.now.upper.saturating_add(duration_to_millis(ttl)),
        }
    }
}

impl Entry {
    /// Its order in the queue: place, then owner.
    fn key(&self) -> (i64, String) {
        (self.place, self.owner.to_string())
    }

    fn path(&self) -> String {
        format!("q.{}", self.owner)
    }
}

/// One conditional write being assembled: each entry it touches adds its
/// own condition, so writers of different entries do not conflict (a
/// waiter's renewal and another's release both land).
#[derive(Debug)]
struct Write {
    filter: Document,
    update: Update,
    /// The change of `qn`.
    count: i64,
}

impl Write {
    fn new(d: &Document) -> Self {
        Write {
            filter: doc! {
                "_id": d.get("_id").cloned().unwrap_or(Bson::Null),
                "kind": { "$exists": false },
            },
            update: Update(Document::new()),
            count: 0,
        }
    }

    /// Enters `entry`, or renews it in place (`held`: as read).
    fn queue(&mut self, entry: &Entry, held: Option<&Entry>) {
        let path = entry.path();
        match held {
            Some(held) => {
                self.filter.insert(format!("{path}.s"), held.place);
                self.update
                    .add("$set", &format!("{path}.t"), i64::from(entry.ticket));
                self.update
                    .add("$set", &format!("{path}.e"), date(entry.expires));
            }
            None => {
                self.filter.insert(&path, doc! { "$exists": false });
                self.update.add("$set", &path, entry.stored());
                self.update.add("$inc", "qseq", 1_i64);
                self.count += 1;
            }
        }
        self.update.add("$max", "qe", date(entry.expires));
    }

    /// Removes `entry`, still queued (a renewal since does not matter).
    fn leave(&mut self, entry: &Entry) {
        self.filter
            .insert(format!("{}.s", entry.path()), entry.place);
        self.update.add("$unset", &entry.path(), "");
        self.count -= 1;
    }

    /// Removes a dead `entry`, unless it was renewed since.
    fn drop_dead(&mut self, entry: &Entry) {
        self.filter
            .insert(format!("{}.e", entry.path()), date(entry.expires));
        self.update.add("$unset", &entry.path(), "");
        self.count -= 1;
    }

    fn plan(mut self, outcome: Outcome) -> Plan {
        if self.count != 0 {
            self.update.add("$inc", "qn", self.count);
        }
        Plan {
            filter: self.filter,
            update: self.update.0,
            outcome,
        }
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
