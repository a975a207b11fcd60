//! The layout of keys and values in etcd, and reading them back.
//!
//! Every grant is one etcd key, attached to an etcd lease of its own (so
//! etcd, not a client's clock, decides when it ends: `leases.rs`):
//!
//! - `{prefix}{kind}/{key}\0{slot}` = `{owner}|{ttl}|{holder}` (the owner
//!   id as 32 hex digits, the TTL of its etcd lease in seconds, which a
//!   keep-alive restores, then the holder label). Its `create_revision` is the
//!   grant's revision, which is the fencing token: renewals keep the key
//!   (a keep-alive of its lease, or a re-put under a longer lease, which
//!   moves `mod_revision` only), so the token stays put.
//!
//! `kind` is `L` (mutex: an empty slot, or `h` for a grant a release handed
//! over: etcd refuses a delete and a put of one key in one transaction, so
//! the head's grant takes the other place; the lock's range holds at most
//! one grant),
//! `S` (semaphore permit, slot as 4 digits) or `R` (reader-writer lock: readers' slots, the writer in
//! [`WRITER_SLOT`](crate::backend::WRITER_SLOT), and `mark` for a waiting
//! writer's marker, same value form, on a lease of the marker's ttl). A
//! key never holds `\0` (it has no control characters), so `{kind}/{key}\0`
//! is the exact range of one lock's records. `{prefix}A/{key}` is written
//! by `announce` (empty, no lease: every waiter looks again) and by a
//! hand-off (`{owner}|{ticket}` on the head's entry lease: the head alone
//! is told; the put's revision is its token). `{prefix}Q/{key}\0{owner}`
//! is a waiter's queue entry, `{owner}|{ttl}|{ticket}|{holder}` on the
//! entry's own etcd lease (the waiter keeps it alive while it waits):
//! entries are ordered by their create revision, which a repeat keeps.
//! `{prefix}K/{key}` holds the key's
//! kind (`rw` or `sem`) once it is a reader-writer lock or a semaphore (one
//! key is one lock): on no lease, never changed, deleted by a sweep pass
//! once the key has no record left (sweep.rs).

use std::time::Duration;

use etcd_client::KeyValue;

use crate::backend::{OwnerId, RecordDecoder};
use crate::error::Result;
use crate::key::Key;

use super::errors::STORE;

/// Which family of records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Mutex,
    Semaphore,
    Rw,
}

impl Kind {
    fn tag(self) -> char {
        match self {
            Kind::Mutex => 'L',
            Kind::Semaphore => 'S',
            Kind::Rw => 'R',
        }
    }
}

/// What a watched key is ([`Layout::family_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    /// A mutex grant: its deletion frees the key, unless a grant of the
    /// key is written in the same revision (a hand-off).
    MutexGrant,
    /// A permit or reader-writer grant, or a marker: its deletion frees
    /// something.
    Grant,
    /// An announce or hand-off key: its write tells waiters.
    Announce,
    /// A queue entry.
    Entry,
}

/// The name of the second place of a mutex grant inside its range.
const HANDED: &str = "h";

/// The name of a reader-writer lock's marker inside the lock's range.
const MARK: &str = "mark";

/// The etcd keys of one store (one prefix).
#[derive(Debug, Clone)]
pub(super) struct Layout {
    prefix: String,
}

impl Layout {
    pub fn new(prefix: &str) -> Self {
        Layout {
            prefix: prefix.to_owned(),
        }
    }

    /// Everything this store writes.
    pub fn all(&self) -> &str {
        &self.prefix
    }

    /// The first part of every record of `key` of `kind` (the mutex's
    /// record itself).
    pub fn lock(&self, kind: Kind, key: &str) -> String {
        format!("{}{}/{key}\0", self.prefix, kind.tag())
    }

    /// The record of slot `slot` of a semaphore or reader-writer lock
    /// (`None`: the lock's range, which for a mutex holds its one grant).
    pub fn slot(&self, kind: Kind, key: &str, slot: Option<u32>) -> String {
        match slot {
            Some(slot) => format!("{}{slot:04}", self.lock(kind, key)),
            None => self.lock(kind, key),
        }
    }

    /// Where a mutex grant of `key` is made: the first of the two places
    /// in the mutex's range (which the protocol keeps to one grant).
    pub fn mutex(&self, key: &str) -> String {
        self.lock(Kind::Mutex, key)
    }

    /// The place in the mutex's range that is not `place`: where a release
    /// from `place` puts the grant it hands over. Two fixed names keep the
    /// range (and etcd's index of it) two keys long, whoever held the key.
    pub fn other_mutex_place(&self, key: &str, place: &[u8]) -> String {
        let first = self.mutex(key);
        if place == first.as_bytes() {
            format!("{first}{HANDED}")
        } else {
            first
        }
    }

    /// The name a grant is known by ([`known_as`](Self::known_as)): a
    /// mutex's range (its grant is in one of two places there), a
    /// semaphore permit's slot or a reader-writer grant's.
    pub fn grant(&self, lease: &crate::backend::Lease) -> String {
        let key = lease.key().as_str();
        match (lease.slot(), lease.rw_side()) {
            (None, _) => self.mutex(key),
            (Some(slot), None) => self.slot(Kind::Semaphore, key, Some(slot)),
            (Some(slot), Some(_)) => self.slot(Kind::Rw, key, Some(slot)),
        }
    }

    /// The name the grant at `etcd_key` is known by: its own, or for the
    /// handed place of a mutex grant, the mutex's range (the first place).
    pub fn known_as<'a>(&self, etcd_key: &'a str) -> &'a str {
        match etcd_key.strip_suffix(HANDED) {
            Some(first) if first.ends_with('\0') && self.family_of(first.as_bytes()).is_some() => {
                first
            }
            _ => etcd_key,
        }
    }

    /// The range of `key`'s queue entries.
    pub fn queue(&self, key: &str) -> String {
        format!("{}Q/{key}\0", self.prefix)
    }

    /// `owner`'s entry in `key`'s queue.
    pub fn entry(&self, key: &str, owner: OwnerId) -> String {
        format!("{}{owner}", self.queue(key))
    }

    /// The key's kind ([`KeyKind::stored`]); absent while the key is a
    /// mutex. Written by the first reader-writer or semaphore grant on a
    /// key no mutex holds, in that grant's transaction.
    ///
    /// [`KeyKind::stored`]: crate::backend::KeyKind::stored
    pub fn kind(&self, key: &str) -> String {
        format!("{}K/{key}", self.prefix)
    }

    /// What every key's kind record starts with (sweep.rs reads them).
    pub fn kinds(&self) -> String {
        format!("{}K/", self.prefix)
    }

    /// A reader-writer lock's waiting-writer marker.
    pub fn marker(&self, key: &str) -> String {
        format!("{}{MARK}", self.lock(Kind::Rw, key))
    }

    /// The range of every record of `kind` whose key starts with `prefix`.
    pub fn listing(&self, kind: Kind, prefix: &str) -> String {
        format!("{}{}/{prefix}", self.prefix, kind.tag())
    }

    /// The key `announce` writes.
    pub fn announce(&self, key: &str) -> String {
        format!("{}A/{key}", self.prefix)
    }

    /// What a watched etcd key is, if it is one of ours, and the lock key
    /// it belongs to.
    pub fn family_of<'a>(&self, etcd_key: &'a [u8]) -> Option<(Family, &'a str)> {
        let rest = etcd_key.strip_prefix(self.prefix.as_bytes())?;
        let rest = std::str::from_utf8(rest).ok()?;
        let (tag, rest) = rest.split_at_checked(2)?;
        let in_range = || rest.split_once('\0').map(|(key, _)| key);
        match tag {
            "A/" => Some((Family::Announce, rest)),
            "L/" => Some((Family::MutexGrant, in_range()?)),
            "S/" | "R/" => Some((Family::Grant, in_range()?)),
            "Q/" => Some((Family::Entry, in_range()?)),
            _ => None,
        }
    }
}

/// A record's value, for a lease of `ttl`.
pub(super) fn value(owner: OwnerId, ttl: Duration, holder: &str) -> String {
    format!("{owner}|{}|{holder}", ttl.as_secs())
}

/// The bounds, exclusive, of the values of `owner`'s records: every value
/// `{owner}|...` sorts strictly between them (etcd compares values as
/// bytes; `{` and `}` are the characters either side of `|`), so two
/// compares check the owner without knowing the holder label.
pub(super) fn owner_bounds(owner: OwnerId) -> (String, String) {
    (format!("{owner}{{"), format!("{owner}}}"))
}

/// One grant read back.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub holder: String,
    pub owner: OwnerId,
    /// The fencing token: the revision that created the key.
    pub token: u64,
    /// The etcd lease the key is attached to.
    pub lease: i64,
    /// That lease's TTL: how long a keep-alive extends it.
    pub ttl: Duration,
}

impl Record {
    /// Reads a grant (or a marker) from its etcd key-value. `key` is the
    /// lock's key as stored (checked here).
    pub fn decode(key: &str, kv: &KeyValue) -> Result<Record> {
        let decoder = RecordDecoder::new(STORE, key);
        decoder.key()?;
        let value = String::from_utf8_lossy(kv.value());
        let mut fields = value.splitn(3, '|');
        let (Some(owner), Some(ttl), Some(holder)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(decoder.corrupt(format!("value {value:?} is not owner|ttl|holder")));
        };
        let ttl = ttl
            .parse::<u64>()
            .ok()
            .filter(|s| (1..=crate::time::MAX_TTL.as_secs() * 2).contains(s))
            .ok_or_else(|| decoder.corrupt(format!("ttl {ttl:?} is not a number of seconds")))?;
        if kv.lease() == 0 {
            // It would never expire: not something this store writes.
            return Err(decoder.corrupt("a grant without an etcd lease"));
        }
        Ok(Record {
            holder: holder.to_owned(),
            owner: decoder.owner(owner)?,
            token: decoder.token(kv.create_revision())?,
            lease: kv.lease(),
            ttl: Duration::from_secs(ttl),
        })
    }
}

/// A queue entry's value: the TTL of the entry's etcd lease (which a
/// grant handed over on that lease reports), the ticket of the attempt
/// that wrote it, the holder label.
pub(super) fn entry_value(owner: OwnerId, ttl: Duration, ticket: u32, holder: &str) -> String {
    format!("{owner}|{}|{ticket}|{holder}", ttl.as_secs())
}

/// A waiter's queue entry read back.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub owner: OwnerId,
    pub holder: String,
    pub ticket: u32,
    /// The entry's etcd lease, and its TTL: a grant handed over to the
    /// waiter goes on that lease (the waiter keeps it alive).
    pub lease: i64,
    pub ttl: Duration,
    /// Its place in the queue.
    pub created: i64,
}

impl Entry {
    /// Reads an entry of lock `key` from its etcd key-value.
    pub fn decode(key: &str, kv: &KeyValue) -> Result<Entry> {
        let decoder = RecordDecoder::new(STORE, key);
        let value = String::from_utf8_lossy(kv.value());
        let mut fields = value.splitn(4, '|');
        let (Some(owner), Some(ttl), Some(ticket), Some(holder)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(decoder.corrupt(format!(
                "queue entry {value:?} is not owner|ttl|ticket|holder"
            )));
        };
        let ttl = ttl.parse::<u64>().ok().filter(|s| *s >= 1).ok_or_else(|| {
            decoder.corrupt(format!("entry ttl {ttl:?} is not a number of seconds"))
        })?;
        let ticket = ticket
            .parse::<u32>()
            .map_err(|_| decoder.corrupt(format!("ticket {ticket:?} is not a number")))?;
        if kv.lease() == 0 {
            return Err(decoder.corrupt("a queue entry without an etcd lease"));
        }
        Ok(Entry {
            owner: decoder.owner(owner)?,
            holder: holder.to_owned(),
            ticket,
            lease: kv.lease(),
            ttl: Duration::from_secs(ttl),
            created: kv.create_revision(),
        })
    }

    /// The value of the grant handed over to this waiter.
    pub fn grant_value(&self) -> String {
        value(self.owner, self.ttl, &self.holder)
    }
}

/// What a hand-off writes to the key's announce key: the head and the
/// ticket its entry carried (the write's revision is the token).
pub(super) fn hand_off_value(owner: OwnerId, ticket: u32) -> String {
    format!("{owner}|{ticket}")
}

/// Reads [`hand_off_value`]; `None` for an announce (empty) or garbage.
pub(super) fn read_hand_off(value: &[u8]) -> Option<(OwnerId, u32)> {
    let (owner, ticket) = std::str::from_utf8(value).ok()?.split_once('|')?;
    Some((OwnerId::from_hex(owner)?, ticket.parse().ok()?))
}

/// The records of one lock, from a range read of [`Layout::lock`]: per slot
/// (`None` for the mutex) its grant, and the marker if any. Every record
/// present is live or about to be deleted by etcd: expiry deletes.
#[derive(Debug, Default)]
pub(super) struct Slots {
    pub grants: Vec<(Option<u32>, Record)>,
    pub marker: Option<Record>,
}

impl Slots {
    /// Groups the keys of a range read under `base` (= [`Layout::lock`]).
    pub fn decode(key: &str, base: &str, kvs: &[KeyValue]) -> Result<Slots> {
        let decoder = RecordDecoder::new(STORE, key);
        let mut slots = Slots::default();
        for kv in kvs {
            let name = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|k| k.strip_prefix(base))
                .ok_or_else(|| decoder.corrupt("a record outside its lock"))?;
            let record = Record::decode(key, kv)?;
            if name == MARK {
                slots.marker = Some(record);
                continue;
            }
            let slot = if name.is_empty() || name == HANDED {
                // A mutex grant, in either of its places.
                None
            } else {
                let slot = Some(name)
                    .filter(|n| n.len() == 4)
                    .and_then(|n| n.parse::<u32>().ok())
                    .ok_or_else(|| decoder.corrupt(format!("slot {name:?} is not a number")))?;
                Some(slot)
            };
            slots.grants.push((slot, record));
        }
        Ok(slots)
    }
}

/// The lock key of a record range's first key, for [`RecordDecoder`].
pub(super) fn key_of(base_len: usize, etcd_key: &[u8]) -> String {
    let rest = etcd_key.get(base_len..).unwrap_or_default();
    let key = rest.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8_lossy(key).into_owned()
}

/// Checks a key read back from a listing.
pub(super) fn checked_key(key: &str) -> Result<Key> {
    RecordDecoder::new(STORE, key).key()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_owner_bounds() {
        let layout = Layout::new("lh/");
        let slot = layout.slot(Kind::Semaphore, "a/b", Some(3));
        assert_eq!(slot, "lh/S/a/b\u{0}0003");
        let owner = OwnerId::random();
        let first = layout.mutex("a/b");
        assert_eq!(first, "lh/L/a/b\u{0}");
        let handed = layout.other_mutex_place("a/b", first.as_bytes());
        assert_eq!(handed, "lh/L/a/b\u{0}h");
        assert_eq!(layout.other_mutex_place("a/b", handed.as_bytes()), first);
        assert_eq!(
            layout.family_of(slot.as_bytes()),
            Some((Family::Grant, "a/b"))
        );
        assert_eq!(
            layout.family_of(layout.entry("a/b", owner).as_bytes()),
            Some((Family::Entry, "a/b"))
        );
        assert_eq!(layout.family_of(b"lh/A/x"), Some((Family::Announce, "x")));
        assert_eq!(layout.family_of(b"other/L/x\0"), None);
        assert_eq!(
            read_hand_off(hand_off_value(owner, 7).as_bytes()),
            Some((owner, 7))
        );
        assert_eq!(read_hand_off(b""), None);
        let (low, high) = owner_bounds(owner);
        let ttl = Duration::from_secs(86_400);
        for holder in ["", "h", "}}}", "\u{10ffff}"] {
            let v = value(owner, ttl, holder);
            assert!(low < v && v < high, "{v:?}");
        }
        let other = value(OwnerId::random(), ttl, "h");
        assert!(!(low < other && other < high));
    }
}
