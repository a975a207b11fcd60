//! The lease document: reading its fields, and the values written into it.

use std::time::Duration;

use mongodb::bson::{doc, Bson, DateTime, Document};

use super::clock::ServerNow;
use super::errors::STORE;
use crate::backend::{millis_to_duration, token_to_i64, Lease, LeaseInfo, RecordDecoder};
use crate::error::Result;

/// The holder and remaining time of a document's lease, if it is live.
/// Remaining is counted to the lower bound of "now", so it is the longest
/// the lease can last, capped at its ttl (the bound's width aside).
pub(super) fn live(d: &Document, now: ServerNow) -> Option<(String, Duration)> {
    d.get_str("owner").ok()?;
    let expires = d.get_datetime("expiresAt").ok()?.timestamp_millis();
    (expires > now.lower).then(|| {
        let holder = d.get_str("holder").unwrap_or_default().to_owned();
        (
            holder,
            millis_to_duration((expires - now.lower).min(ttl_ms(d))),
        )
    })
}

/// The ttl the lease was granted or last renewed with; unbounded if the
/// document does not say.
fn ttl_ms(d: &Document) -> i64 {
    d.get("ttlMs").and_then(as_i64).unwrap_or(i64::MAX)
}

/// An integer field as stored by any client (Int32 or Int64).
pub(super) fn as_i64(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int64(v) => Some(*v),
        Bson::Int32(v) => Some(i64::from(*v)),
        _ => None,
    }
}

/// The decoder for `d`'s record, named by its `_id`.
pub(super) fn decoder(d: &Document) -> Result<RecordDecoder<'_>> {
    match d.get("_id") {
        Some(Bson::String(key)) => Ok(RecordDecoder::new(STORE, key)),
        other => {
            Err(RecordDecoder::new(STORE, &format!("{other:?}")).corrupt("the _id is not a string"))
        }
    }
}

/// A lock document's token: its `base` plus its `fence`. The base is the
/// server's clock in microseconds when the document was created (so that
/// a key whose document was swept comes back above its old tokens; see
/// `sweep.rs`); the fence counts the grants since. A document of an
/// earlier version has no base: its fence is its token.
fn fence_field(d: &Document, record: &RecordDecoder<'_>) -> Result<i64> {
    let fence = d
        .get("fence")
        .and_then(as_i64)
        .ok_or_else(|| record.corrupt("the fence is missing or not an integer"))?;
    let base = match d.get("base") {
        None | Some(Bson::Null) => 0,
        Some(b) => as_i64(b).ok_or_else(|| record.corrupt("the base is not an integer"))?,
    };
    base.checked_add(fence)
        .filter(|_| base >= 0)
        .ok_or_else(|| record.corrupt(format!("base {base} and fence {fence} make no token")))
}

/// The token of an anchor or lock document, 0 for one without a fence
/// (an anchor a kind claim created).
pub(super) fn token_in(d: &Document) -> Result<i64> {
    if d.get("fence").is_none() {
        let record = decoder(d)?;
        return Ok(match d.get("base") {
            None | Some(Bson::Null) => 0,
            Some(b) => as_i64(b).ok_or_else(|| record.corrupt("the base is not an integer"))?,
        });
    }
    fence_field(d, &decoder(d)?)
}

/// The base a document created now starts its tokens from: the lower
/// bound of the server's clock, in microseconds.
pub(super) fn base_at(now: ServerNow) -> i64 {
    now.lower.saturating_mul(1000)
}

/// The filter clause that the document holds the grant of `token`: its
/// base (none on documents of earlier versions) plus its fence is the
/// token. A query expression, not an update pipeline: it needs MongoDB
/// 3.6 or a server with `$expr`.
pub(super) fn holds_token(token: i64) -> Document {
    doc! { "$eq": [ { "$add": [ { "$ifNull": [ "$base", 0_i64 ] }, "$fence" ] }, token ] }
}

/// The fence of a lease document (with its `_id`), checked.
pub(super) fn fence_of(d: &Document) -> Result<u64> {
    let record = decoder(d)?;
    record.token(fence_field(d, &record)?)
}

/// The live lease of a document, every field checked; `None` if it is
/// free or expired.
pub(super) fn info_of(d: &Document, now: ServerNow) -> Result<Option<LeaseInfo>> {
    let record = decoder(d)?;
    let owner = match d.get("owner") {
        None | Some(Bson::Null) => return Ok(None),
        Some(Bson::String(owner)) => owner,
        Some(other) => {
            return Err(record.corrupt(format!("the owner is a {:?}", other.element_type())))
        }
    };
    let expires = match d.get("expiresAt") {
        Some(Bson::DateTime(at)) => at.timestamp_millis(),
        _ => return Err(record.corrupt("a held lease without an expiresAt date")),
    };
    let left = expires.saturating_sub(now.lower);
    if left <= 0 {
        return Ok(None);
    }
    // The whole time to expiry must be plausible, not only the part the
    // ttl cap below lets through: past it the key would never come free.
    record.remaining(left)?;
    let holder = d.get_str("holder").ok().map(str::to_owned);
    let fence = fence_field(d, &record)?;
    Ok(Some(record.lease_info(
        owner,
        holder,
        fence,
        left.min(ttl_ms(d)),
    )?))
}

/// A lease's token as the document's Int64 fence.
pub(super) fn token_as_i64(lease: &Lease) -> Result<i64> {
    token_to_i64(lease.token())
}

/// A BSON date from milliseconds since the epoch.
pub(super) fn date(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

/// The update that frees a lease at `now`: no owner or holder, and the
/// expiry brought forward to now (never moved back) so that it says since
/// when the key is idle (`sweep.rs`); the fence stays.
pub(super) fn freed(now: ServerNow) -> Document {
    doc! {
        "$set": { "owner": Bson::Null, "holder": Bson::Null },
        "$min": { "expiresAt": date(now.upper) },
    }
}
