//! Values crossing into and out of a store: durations and tokens in the
//! integer forms stores keep, and the checks every store applies to a lease
//! record it reads back, so a corrupt record is reported alike everywhere.

use std::fmt;
use std::time::Duration;

use super::{LeaseInfo, OwnerId, PermitInfo, MAX_PERMITS};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::notify::HandOff;
use crate::time::MAX_TTL;

/// Converts a store's signed millisecond count into a duration, treating
/// negative values (already expired) as zero.
pub fn millis_to_duration(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

/// Converts a duration to whole milliseconds for a store, rounding up so a
/// lease is never shorter than asked.
pub fn duration_to_millis(d: Duration) -> i64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Checks a token read back from a store that keeps it as a signed integer.
/// Prefer [`RecordDecoder::token`], whose error names the store and key.
///
/// # Errors
/// [`Error::Backend`] for a negative value: the fence record is corrupt.
pub fn token_from_i64(token: i64) -> Result<u64> {
    u64::try_from(token).map_err(|_| Error::backend(format!("corrupt fence {token}: negative")))
}

/// A lease's token as the signed 64-bit integer SQL and BSON stores keep.
///
/// # Errors
/// [`Error::InvalidInput`] for a token above `i64::MAX`: no store ever
/// granted it, so the lease presenting it is forged.
pub fn token_to_i64(token: u64) -> Result<i64> {
    i64::try_from(token).map_err(|_| {
        Error::invalid(
            "token",
            format!(
                "must be at most {} (the largest a store keeps), got {token}",
                i64::MAX
            ),
        )
    })
}

/// The longest a live lease can still last by any store's clock: no grant
/// or renewal is longer than [`MAX_TTL`], and a day more covers a store
/// clock that was set back. A longer remaining time is a hand-written expiry.
const MAX_PLAUSIBLE_REMAINING: Duration = MAX_TTL.saturating_mul(2);

/// Reads back the fields of one stored lease record and checks each
/// against what leasehold writes.
///
/// Only leasehold writes its records, so a value it never writes (a key
/// that is not a valid [`Key`], a negative fence, an owner that is not 32
/// hex digits, an expiry further ahead than any ttl) means the record was
/// damaged or edited by hand. Every store reports that the same way:
/// [`Error::Backend`] (retrying will not fix it, and it is not the caller's
/// input) naming the store, with a [`CorruptRecord`] as its source.
///
/// ```
/// use leasehold::backend::{CorruptRecord, RecordDecoder};
///
/// let record = RecordDecoder::new("sqlite", "orders:42");
/// let info = record
///     .lease_info("0123456789abcdef0123456789abcdef", Some("host:7".into()), 3, 1500)
///     .unwrap();
/// assert_eq!((info.token, info.remaining.as_millis()), (3, 1500));
///
/// let e = record.token(-1).unwrap_err();
/// assert_eq!(e.store(), Some("sqlite"));
/// assert!(!e.is_retryable());
/// let source = std::error::Error::source(&e).unwrap();
/// assert!(source.downcast_ref::<CorruptRecord>().is_some());
/// assert_eq!(
///     e.to_string(),
///     r#"store error (sqlite): corrupt lease record "orders:42": fence -1 is negative"#
/// );
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RecordDecoder<'a> {
    store: &'static str,
    key: &'a str,
}

impl<'a> RecordDecoder<'a> {
    /// A decoder for the record of `key` (as stored, not yet checked) in
    /// `store` (`"sqlite"`, `"postgres"`, ...: the name errors carry).
    pub fn new(store: &'static str, key: &'a str) -> Self {
        RecordDecoder { store, key }
    }

    /// The record's key, checked like a caller's key.
    ///
    /// # Errors
    /// A corrupt record if it is not a valid [`Key`].
    pub fn key(&self) -> Result<Key> {
        Key::new(self.key).map_err(|e| {
            let problem = match &e {
                Error::InvalidInput { problem, .. } => format!("the key {problem}"),
                other => other.to_string(),
            };
            self.corrupt(problem)
        })
    }

    /// The fence counter, kept as a signed integer.
    ///
    /// # Errors
    /// A corrupt record for a negative value.
    pub fn token(&self, fence: i64) -> Result<u64> {
        u64::try_from(fence).map_err(|_| self.corrupt(format!("fence {fence} is negative")))
    }

    /// The fence counter, kept as decimal text (as Redis keeps counters).
    ///
    /// # Errors
    /// A corrupt record if it is not a whole number, or negative.
    pub fn token_text(&self, fence: &str) -> Result<u64> {
        let value = fence
            .parse::<i64>()
            .map_err(|_| self.corrupt(format!("fence {fence:?} is not a whole number")))?;
        self.token(value)
    }

    /// The holder's owner id, kept as 32 hex digits.
    ///
    /// # Errors
    /// A corrupt record for anything else.
    pub fn owner(&self, hex: &str) -> Result<OwnerId> {
        OwnerId::from_hex(hex)
            .ok_or_else(|| self.corrupt(format!("owner {hex:?} is not 32 hex digits")))
    }

    /// A key handed over to the head of its queue: the head's owner id (32
    /// hex digits), and its grant from the new fence and the ticket the
    /// head's queue entry carried (missing only in a damaged record).
    ///
    /// # Errors
    /// A corrupt record naming the bad field.
    pub fn hand_off(
        &self,
        owner: &str,
        fence: i64,
        ticket: Option<i64>,
    ) -> Result<(OwnerId, HandOff)> {
        let head = OwnerId::from_hex(owner).ok_or_else(|| {
            self.corrupt(format!("queue entry owner {owner:?} is not 32 hex digits"))
        })?;
        let ticket = ticket.and_then(|t| u32::try_from(t).ok()).ok_or_else(|| {
            self.corrupt(format!(
                "queue entry ticket {ticket:?} is missing or out of range"
            ))
        })?;
        Ok((
            head,
            HandOff {
                token: self.token(fence)?,
                ticket,
            },
        ))
    }

    /// The time left on a live lease, in milliseconds by the store's clock.
    /// A negative count (the lease ended while the answer was computed) is
    /// zero.
    ///
    /// # Errors
    /// A corrupt record if it is further ahead than any lease can last
    /// (twice the longest ttl).
    pub fn remaining(&self, ms: i64) -> Result<Duration> {
        let remaining = millis_to_duration(ms);
        if remaining > MAX_PLAUSIBLE_REMAINING {
            return Err(self.corrupt(format!(
                "expiry {ms} ms ahead is past any lease (longest ttl {}h)",
                MAX_TTL.as_secs() / 3600
            )));
        }
        Ok(remaining)
    }

    /// A live lease as [`Backend::inspect`](super::Backend::inspect) and
    /// [`Backend::list`](super::Backend::list) report it, from its stored
    /// fields: every one checked as above (a missing holder label is
    /// empty).
    ///
    /// # Errors
    /// A corrupt record naming the first bad field.
    pub fn lease_info(
        &self,
        owner: &str,
        holder: Option<String>,
        fence: i64,
        remaining_ms: i64,
    ) -> Result<LeaseInfo> {
        let key = self.key()?;
        self.owner(owner)?;
        Ok(LeaseInfo::mutex(
            key,
            holder.unwrap_or_default(),
            self.token(fence)?,
            self.remaining(remaining_ms)?,
        ))
    }

    /// A live semaphore permit as [`Backend::list`](super::Backend::list)
    /// reports it: the fields of [`lease_info`](Self::lease_info) and the
    /// slot, kept as a signed integer.
    ///
    /// # Errors
    /// A corrupt record naming the first bad field (a slot outside
    /// `0..MAX_PERMITS` among them).
    pub fn permit_info(
        &self,
        slot: i64,
        owner: &str,
        holder: Option<String>,
        token: i64,
        remaining_ms: i64,
    ) -> Result<PermitInfo> {
        let info = self.lease_info(owner, holder, token, remaining_ms)?;
        let slot = u32::try_from(slot)
            .ok()
            .filter(|s| *s < MAX_PERMITS)
            .ok_or_else(|| self.corrupt(format!("slot {slot} is outside 0..{MAX_PERMITS}")))?;
        Ok(PermitInfo {
            key: info.key,
            slot,
            holder: info.holder,
            token: info.token,
            remaining: info.remaining,
            rw: None,
        })
    }

    /// A live holder of a reader-writer lock as
    /// [`Backend::list`](super::Backend::list) reports it:
    /// a reader in slot `0..MAX_PERMITS` or the writer in
    /// [`WRITER_SLOT`](super::WRITER_SLOT).
    ///
    /// # Errors
    /// A corrupt record naming the first bad field (any other slot among
    /// them).
    pub fn rw_info(
        &self,
        slot: i64,
        owner: &str,
        holder: Option<String>,
        token: i64,
        remaining_ms: i64,
    ) -> Result<PermitInfo> {
        let writer = slot == i64::from(super::WRITER_SLOT);
        // A reader's slot is checked like a permit's; the writer's is reserved.
        let reader_slot = if writer { 0 } else { slot };
        let mut info = self.permit_info(reader_slot, owner, holder, token, remaining_ms)?;
        info.slot = u32::try_from(slot).unwrap_or_default();
        info.rw = Some(if writer {
            super::RwSide::Write
        } else {
            super::RwSide::Read
        });
        Ok(info)
    }

    /// A live slot as a store's listing reads it: of a reader-writer lock
    /// ([`rw_info`](Self::rw_info)) when `rw`, else of a semaphore
    /// ([`permit_info`](Self::permit_info)).
    ///
    /// # Errors
    /// As those two.
    pub fn slot_info(
        &self,
        rw: bool,
        slot: i64,
        owner: &str,
        holder: Option<String>,
        token: i64,
        remaining_ms: i64,
    ) -> Result<PermitInfo> {
        if rw {
            self.rw_info(slot, owner, holder, token, remaining_ms)
        } else {
            self.permit_info(slot, owner, holder, token, remaining_ms)
        }
    }

    /// The error for a record whose shape is wrong in a way only the store
    /// can see (a missing field, a field of the wrong type).
    pub fn corrupt(&self, problem: impl Into<String>) -> Error {
        Error::backend(CorruptRecord {
            key: self.key.to_owned(),
            problem: problem.into(),
        })
        .in_store(self.store)
    }
}

/// The source of the [`Error::Backend`] a store reports for a lease record
/// holding a value leasehold never writes; see [`RecordDecoder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptRecord {
    key: String,
    problem: String,
}

impl CorruptRecord {
    /// The key of the damaged record, as stored.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for CorruptRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt lease record {:?}: {}", self.key, self.problem)
    }
}

impl std::error::Error for CorruptRecord {}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    fn problem(e: Error) -> (Option<&'static str>, String) {
        let source = std::error::Error::source(&e).expect("a source");
        let corrupt = source
            .downcast_ref::<CorruptRecord>()
            .expect("a CorruptRecord");
        assert!(matches!(e, Error::Backend { .. }), "{e:?}");
        (e.store(), corrupt.problem().to_owned())
    }

    #[test]
    fn a_hand_off_reads_the_head_and_its_grant_or_names_the_bad_field() {
        let record = RecordDecoder::new("sqlite", "k");
        let (head, grant) = record.hand_off(OWNER, 9, Some(3)).unwrap();
        assert_eq!(head.to_string(), OWNER);
        assert_eq!(
            grant,
            HandOff {
                token: 9,
                ticket: 3
            }
        );
        let bad_owner = record.hand_off("not-hex", 9, Some(3)).unwrap_err();
        assert!(problem(bad_owner).1.contains("owner \"not-hex\""));
        for ticket in [None, Some(-1), Some(i64::from(u32::MAX) + 1)] {
            let e = record.hand_off(OWNER, 9, ticket).unwrap_err();
            assert!(problem(e).1.contains("ticket"), "{ticket:?}");
        }
        let negative = record.hand_off(OWNER, -1, Some(3)).unwrap_err();
        assert!(problem(negative).1.contains("fence"));
    }

    #[test]
    fn millisecond_conversions() {
        assert_eq!(millis_to_duration(-5), Duration::ZERO);
        assert_eq!(duration_to_millis(Duration::from_micros(1500)), 2);
        assert_eq!(duration_to_millis(Duration::MAX), i64::MAX);
        assert!(token_from_i64(-1).is_err());
        assert_eq!(token_from_i64(7).unwrap(), 7);
    }

    #[test]
    fn tokens_above_i64_are_rejected_as_input() {
        assert_eq!(token_to_i64(42).unwrap(), 42);
        assert_eq!(token_to_i64(i64::MAX as u64).unwrap(), i64::MAX);
        let e = token_to_i64(u64::MAX).unwrap_err();
        assert!(
            matches!(e, Error::InvalidInput { what: "token", .. }),
            "{e:?}"
        );
    }

    #[test]
    fn a_sound_record_decodes() {
        let info = RecordDecoder::new("postgres", "k")
            .lease_info(OWNER, None, 9, -3)
            .unwrap();
        assert_eq!(info.key.as_str(), "k");
        assert_eq!(info.holder, "");
        assert_eq!(info.token, 9);
        assert_eq!(info.remaining, Duration::ZERO, "just expired is zero");
        let longest = duration_to_millis(MAX_PLAUSIBLE_REMAINING);
        assert!(RecordDecoder::new("x", "k").remaining(longest).is_ok());
    }

    #[test]
    fn every_corruption_is_a_backend_error_naming_store_and_field() {
        let d = RecordDecoder::new("redis", "k");
        let cases = [
            (
                d.lease_info(OWNER, None, -1, 10).map(drop),
                "fence -1 is negative",
            ),
            (
                d.lease_info("xyz", None, 1, 10).map(drop),
                "owner \"xyz\" is not 32 hex digits",
            ),
            (
                d.lease_info(OWNER, None, 1, i64::MAX).map(drop),
                "is past any lease (longest ttl 24h)",
            ),
            (
                d.token_text("12a").map(drop),
                "fence \"12a\" is not a whole number",
            ),
            (d.token_text("-4").map(drop), "fence -4 is negative"),
            (
                RecordDecoder::new("redis", "a\nb")
                    .lease_info(OWNER, None, 1, 10)
                    .map(drop),
                "the key must not contain control characters",
            ),
            (
                RecordDecoder::new("redis", "")
                    .lease_info(OWNER, None, 1, 10)
                    .map(drop),
                "the key must not be empty",
            ),
        ];
        for (result, expected) in cases {
            let (store, text) = problem(result.unwrap_err());
            assert_eq!(store, Some("redis"));
            assert!(text.contains(expected), "{text:?} lacks {expected:?}");
        }
    }
}
