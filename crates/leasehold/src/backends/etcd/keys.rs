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
//! `kind` is `L` (mutex, empty slot), `S` (semaphore permit, slot as 4
//! digits) or `R` (reader-writer lock: readers' slots, the writer in
//! [`WRITER_SLOT`](crate::backend::WRITER_SLOT), and `mark` for a waiting
//! writer's marker, same value form, on a lease of the marker's ttl). A
//! key never holds `\0` (it has no control characters), so `{kind}/{key}\0`
//! is the exact range of one lock's records. `{prefix}A/{key}` is written
//! by `announce` only, for watchers. `{prefix}K/{key}` holds the key's
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

    /// The record of slot `slot` (`None`: the mutex) of a lock.
    pub fn slot(&self, kind: Kind, key: &str, slot: Option<u32>) -> String {
        match slot {
            Some(slot) => format!("{}{slot:04}", self.lock(kind, key)),
            None => self.lock(kind, key),
        }
    }

    /// The record a held grant lives in: a mutex's one record, a
    /// semaphore permit's slot or a reader-writer grant's.
    pub fn grant(&self, lease: &crate::backend::Lease) -> String {
        let kind = match (lease.slot(), lease.rw_side()) {
            (None, _) => Kind::Mutex,
            (Some(_), None) => Kind::Semaphore,
            (Some(_), Some(_)) => Kind::Rw,
        };
        self.slot(kind, lease.key().as_str(), lease.slot())
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

    /// The lock key a watched etcd key belongs to, if it is one of ours
    /// whose deletion (or, for `A/`, write) means "look again".
    pub fn lock_of<'a>(&self, etcd_key: &'a [u8]) -> Option<&'a str> {
        let rest = etcd_key.strip_prefix(self.prefix.as_bytes())?;
        let rest = std::str::from_utf8(rest).ok()?;
        let (tag, rest) = rest.split_at_checked(2)?;
        match tag {
            "A/" => Some(rest),
            "L/" | "S/" | "R/" => rest.split_once('\0').map(|(key, _)| key),
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
            let slot = if name.is_empty() {
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
        assert_eq!(layout.lock_of(slot.as_bytes()), Some("a/b"));
        assert_eq!(layout.lock_of(b"lh/A/x"), Some("x"));
        assert_eq!(layout.lock_of(b"other/L/x\0"), None);
        let owner = OwnerId::random();
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
