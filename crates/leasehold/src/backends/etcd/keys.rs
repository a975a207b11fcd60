//! The layout of keys and values in etcd, and reading them back.
//!
//! Every grant is three etcd keys written in one transaction:
//!
//! - `{prefix}{kind}/{key}\0{slot}e` = the expiry (ms since the epoch, 16
//!   digits): the key whose *value* a transaction compares with "now"
//!   (fixed width, so etcd's byte-wise `value < "{now}"` compares times);
//! - `{prefix}{kind}/{key}\0{slot}h` = the holder label;
//! - `{prefix}{kind}/{key}\0{slot}o` = the owner id (32 hex digits). Its
//!   `mod_revision` is the grant's revision, which is the fencing token:
//!   renewals rewrite only the `e` key, so the token stays put, and
//!   renew/release compare the owner's value and revision.
//!
//! `kind` is `L` (mutex, no slot), `S` (semaphore permit, slot as 4
//! digits) or `R` (reader-writer lock: readers' slots, the writer in
//! [`WRITER_SLOT`], and `mark` for a waiting writer's marker). A key never
//! holds `\0` (it has no control characters), so `{kind}/{key}\0` is the
//! exact range of one lock's records. `{prefix}A/{key}` is written by
//! `announce` only, for watchers; `{prefix}K/{key}` holds the key's kind
//! once it is a reader-writer lock or a semaphore (one key is one lock).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::KeyValue;

use crate::backend::{millis_to_duration, OwnerId, RecordDecoder};
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

    /// The first part of every record of `key` of `kind`.
    pub fn lock(&self, kind: Kind, key: &str) -> String {
        format!("{}{}/{key}\0", self.prefix, kind.tag())
    }

    /// The records of slot `slot` (`None`: the mutex) of a lock.
    pub fn slot(&self, kind: Kind, key: &str, slot: Option<u32>) -> Grant {
        let base = match slot {
            Some(slot) => format!("{}{slot:04}", self.lock(kind, key)),
            None => self.lock(kind, key),
        };
        Grant {
            expiry: format!("{base}e"),
            holder: format!("{base}h"),
            owner: format!("{base}o"),
            base,
        }
    }

    /// The key's kind (`rw` or `sem`, [`KeyKind::stored`]); absent while
    /// the key is a mutex. Written once, by the first reader-writer or
    /// semaphore grant on a key no mutex holds; never changed back.
    ///
    /// [`KeyKind::stored`]: crate::backend::KeyKind::stored
    pub fn kind(&self, key: &str) -> String {
        format!("{}K/{key}", self.prefix)
    }

    /// A reader-writer lock's waiting-writer marker.
    pub fn marker(&self, key: &str) -> String {
        format!("{}mark", self.lock(Kind::Rw, key))
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

/// The etcd keys of one grant.
#[derive(Debug, Clone)]
pub(super) struct Grant {
    /// The first part of all three (a prefix of nothing else).
    pub base: String,
    pub expiry: String,
    pub holder: String,
    pub owner: String,
}

/// Milliseconds since the Unix epoch by this machine's clock. etcd has no
/// clock a transaction can read; see docs/etcd.md ("Clocks").
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A time as an expiry record holds it.
fn stamp(ms: i64) -> String {
    format!("{:016}", ms.max(0))
}

/// An expiry record is live at `now` iff its value is greater than this.
pub(super) fn live_above(now: i64) -> String {
    stamp(now)
}

/// An expiry record has expired at `now` iff its value is less than this.
pub(super) fn expired_below(now: i64) -> String {
    stamp(now.saturating_add(1))
}

/// An expiry record's value for a grant of `ttl` from `now`.
pub(super) fn expiry_value(now: i64, ttl: Duration) -> String {
    stamp(now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)))
}

/// One grant read back.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub expiry_ms: i64,
    pub holder: String,
    pub owner: OwnerId,
    pub token: u64,
}

impl Record {
    pub fn live(&self, now: i64) -> bool {
        self.expiry_ms > now
    }

    pub fn remaining(&self, now: i64) -> Duration {
        millis_to_duration(self.expiry_ms.saturating_sub(now))
    }

    /// Reads a grant from its three etcd keys. `key` is the lock's key as
    /// stored (checked here).
    pub fn decode(
        key: &str,
        expiry: &KeyValue,
        holder: &KeyValue,
        owner: &KeyValue,
    ) -> Result<Record> {
        let decoder = RecordDecoder::new(STORE, key);
        decoder.key()?;
        let ms = std::str::from_utf8(expiry.value()).unwrap_or("?");
        let holder = String::from_utf8_lossy(holder.value());
        let expiry_ms = Some(ms)
            .filter(|ms| ms.len() == 16)
            .and_then(|ms| ms.parse::<i64>().ok())
            .filter(|ms| ms.is_positive())
            .ok_or_else(|| decoder.corrupt(format!("expiry {ms:?} is not a time")))?;
        decoder.remaining(expiry_ms.saturating_sub(now_ms()))?;
        let owner_hex = std::str::from_utf8(owner.value()).unwrap_or("?");
        Ok(Record {
            expiry_ms,
            holder: holder.into_owned(),
            owner: decoder.owner(owner_hex)?,
            token: decoder.token(owner.mod_revision())?,
        })
    }
}

/// The records of one lock, from a range read of [`Layout::lock`]: per slot
/// (`None` for the mutex) its grant, and the marker if any.
#[derive(Debug, Default)]
pub(super) struct Slots {
    pub grants: Vec<(Option<u32>, Record)>,
    pub marker: Option<Marker>,
}

/// A waiting writer's marker (docs/rw-lock.md).
#[derive(Debug)]
pub(super) struct Marker {
    pub expiry_ms: i64,
    pub owner: OwnerId,
    pub holder: String,
}

impl Slots {
    /// Groups the keys of a range read under `base` (= [`Layout::lock`]).
    pub fn decode(key: &str, base: &str, kvs: &[KeyValue]) -> Result<Slots> {
        let decoder = RecordDecoder::new(STORE, key);
        let mut slots = Slots::default();
        let mut parts: Vec<&KeyValue> = Vec::with_capacity(3);
        let mut current = "";
        for kv in kvs {
            let name = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|k| k.strip_prefix(base))
                .ok_or_else(|| decoder.corrupt("a record outside its lock"))?;
            if name == "mark" {
                let value = String::from_utf8_lossy(kv.value());
                let mut fields = value.splitn(3, '|');
                let (ms, owner, holder) = (fields.next(), fields.next(), fields.next());
                let (Some(ms), Some(owner), Some(holder)) = (ms, owner, holder) else {
                    return Err(
                        decoder.corrupt(format!("marker {value:?} is not expiry|owner|holder"))
                    );
                };
                let expiry_ms = ms
                    .parse::<i64>()
                    .map_err(|_| decoder.corrupt(format!("marker {value:?} has no expiry")))?;
                slots.marker = Some(Marker {
                    expiry_ms,
                    owner: decoder.owner(owner)?,
                    holder: holder.to_owned(),
                });
                continue;
            }
            // A grant's keys are written and deleted together, in the
            // order e, h, o; anything else is damage.
            let (slot, part) = name.split_at(name.len().saturating_sub(1));
            let expected = ["e", "h", "o"][parts.len()];
            if part != expected || (!parts.is_empty() && slot != current) {
                return Err(decoder.corrupt(format!("record {name:?} is not part of a grant")));
            }
            current = slot;
            parts.push(kv);
            if parts.len() == 3 {
                let slot =
                    if slot.is_empty() {
                        None
                    } else {
                        Some(slot.parse::<u32>().map_err(|_| {
                            decoder.corrupt(format!("slot {slot:?} is not a number"))
                        })?)
                    };
                let record = Record::decode(key, parts[0], parts[1], parts[2])?;
                slots.grants.push((slot, record));
                parts.clear();
            }
        }
        if !parts.is_empty() {
            return Err(decoder.corrupt("a grant with missing records"));
        }
        Ok(slots)
    }

    /// The live grants at `now`.
    pub fn live(&self, now: i64) -> impl Iterator<Item = &(Option<u32>, Record)> {
        self.grants.iter().filter(move |(_, r)| r.live(now))
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
    fn values_compare_as_times() {
        let now = 1_700_000_000_000;
        let v = expiry_value(now, Duration::from_millis(200));
        assert!(v > live_above(now + 199));
        assert!(v >= live_above(now + 200) && v >= expired_below(now + 199));
        assert!(v < expired_below(now + 200));
        let layout = Layout::new("lh/");
        let grant = layout.slot(Kind::Semaphore, "a/b", Some(3));
        assert_eq!(grant.expiry, "lh/S/a/b\u{0}0003e");
        assert_eq!(layout.lock_of(grant.owner.as_bytes()), Some("a/b"));
        assert_eq!(layout.lock_of(b"lh/A/x"), Some("x"));
        assert_eq!(layout.lock_of(b"other/L/x\0e"), None);
        // The kind key is no lock record: writing it wakes nobody.
        assert_eq!(layout.lock_of(layout.kind("x").as_bytes()), None);
    }
}
