//! The lease document: reading its fields, and the values written into it.

use std::time::Duration;

use mongodb::bson::{doc, Bson, DateTime, Document};

use super::clock::ServerNow;
use crate::backend::{millis_to_duration, token_from_i64, Lease, LeaseInfo};
use crate::error::{Error, Result};
use crate::key::Key;

/// The holder and remaining time of a document's lease, if it is live.
/// Remaining is counted to the lower bound of "now", so it is the longest
/// the lease can last, capped at its ttl (the bound's width aside).
pub(super) fn live(d: &Document, now: ServerNow) -> Option<(String, Duration)> {
    d.get_str("owner").ok()?;
    let expires = d.get_datetime("expiresAt").ok()?.timestamp_millis();
    (expires > now.lower).then(|| {
        let ttl = d.get("ttlMs").and_then(as_i64).unwrap_or(i64::MAX);
        let holder = d.get_str("holder").unwrap_or_default().to_owned();
        (holder, millis_to_duration((expires - now.lower).min(ttl)))
    })
}

/// An integer field as stored by any client (Int32 or Int64).
pub(super) fn as_i64(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int64(v) => Some(*v),
        Bson::Int32(v) => Some(i64::from(*v)),
        _ => None,
    }
}

pub(super) fn fence_of(d: &Document) -> Result<u64> {
    let fence = d
        .get("fence")
        .and_then(as_i64)
        .ok_or_else(|| Error::backend("lease document without an integer fence"))?;
    token_from_i64(fence)
}

pub(super) fn info_of(d: &Document, now: ServerNow) -> Result<Option<LeaseInfo>> {
    let Some((holder, remaining)) = live(d, now) else {
        return Ok(None);
    };
    Ok(Some(LeaseInfo {
        key: Key::new(d.get_str("_id").map_err(Error::backend)?)?,
        holder,
        token: fence_of(d)?,
        remaining,
    }))
}

pub(super) fn token_as_i64(lease: &Lease) -> i64 {
    // Tokens come from the store's Int64 fence, so they fit.
    i64::try_from(lease.token()).unwrap_or(i64::MAX)
}

/// A BSON date from milliseconds since the epoch.
pub(super) fn date(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

/// The fields of a free lease; the fence stays.
pub(super) fn freed() -> Document {
    doc! { "owner": Bson::Null, "holder": Bson::Null, "expiresAt": Bson::Null }
}
