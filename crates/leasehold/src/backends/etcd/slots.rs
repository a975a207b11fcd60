//! Semaphore permits and reader-writer locks: a lock's slots live in one
//! key range (`keys.rs`), so a grant reads the range, decides by the rules
//! of docs/semaphore.md and docs/rw-lock.md, and commits with a compare
//! that no key of the range changed since the read (`mod_revision <
//! read + 1` over the range). A conflict means someone else changed the
//! lock: read again. Each grant is still one atomic transaction.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use crate::backend::{
    Acquire, AcquireRequest, Busy, Lease, PermitInfo, PermitKind, MAX_PERMITS, WRITER_SLOT,
};
use crate::error::{Error, Result};
use crate::key::Key;

use super::errors::STORE;
use super::keys::{self, checked_key, expiry_value, now_ms, Grant, Kind, Layout, Slots};
use super::{put_grant, revision, EtcdBackend, CONFLICT_RETRIES};

/// The records of `lease` (a permit or a side of a reader-writer lock).
pub(super) fn grant_of(layout: &Layout, lease: &Lease) -> Grant {
    let kind = if lease.rw_side().is_some() {
        Kind::Rw
    } else {
        Kind::Semaphore
    };
    layout.slot(kind, lease.key().as_str(), lease.slot())
}

/// What the rules say about one attempt.
enum Decision {
    /// Take this slot (a fresh grant).
    Take(u32),
    /// The owner's own live grant in this slot: the same grant, extended.
    Extend(u32, u64),
    /// Busy; for a waiting writer that found only readers, first set (or
    /// refresh) its marker.
    Busy(Busy, bool),
}

pub(super) async fn try_acquire(backend: &EtcdBackend, req: &AcquireRequest) -> Result<Acquire> {
    let layout = &backend.inner.layout;
    let key = req.key().as_str();
    let kind = match req.permit_kind() {
        Some(PermitKind::Semaphore(_)) | None => Kind::Semaphore,
        Some(_) => Kind::Rw,
    };
    let base = layout.lock(kind, key);
    let kind_key = layout.kind(key);
    let wanted = req.key_kind();
    let wanted_text = wanted.stored().unwrap_or_default();
    let mutex_base = layout.lock(Kind::Mutex, key);
    for _ in 0..CONFLICT_RETRIES {
        // The lock's range, the key's kind and its mutex, read at one
        // revision (a read-only transaction).
        let read_txn = Txn::new().and_then([
            TxnOp::get(base.as_str(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(kind_key.as_str(), None),
            TxnOp::get(mutex_base.as_str(), Some(GetOptions::new().with_prefix())),
        ]);
        let answer = backend.txn(read_txn).await?;
        let read = answer.header().map_or(0, |h| h.revision());
        let mut found = super::gets(&answer).into_iter();
        let (kvs, kind_kvs, mutex_kvs) = (
            found.next().unwrap_or_default(),
            found.next().unwrap_or_default(),
            found.next().unwrap_or_default(),
        );
        let now = now_ms();
        let takeover = now - backend.inner.clock_margin_ms;
        // Nothing in the range changed since the read.
        let unchanged =
            Compare::mod_revision(base.as_str(), CompareOp::Less, read + 1).with_prefix();
        let mut compares = vec![unchanged];
        // The claim of the key's kind (one key is one lock), in the same
        // transaction as the grant.
        let mut claim = Vec::new();
        match kind_kvs.first() {
            Some(kv) => {
                let held = super::kind_of(req.key(), kv)?;
                if held != wanted {
                    return Ok(Acquire::OtherKind(held));
                }
                compares.push(Compare::value(
                    kind_key.as_str(),
                    CompareOp::Equal,
                    wanted_text,
                ));
            }
            None => {
                // A mutex key: busy while its holder is live; else it
                // becomes this kind, if neither changed since the read.
                let mutex = Slots::decode(key, &mutex_base, &mutex_kvs)?;
                if let Some((_, holder)) = mutex.live(takeover).next() {
                    return Ok(Acquire::Busy(super::busy(holder.clone(), now, takeover)));
                }
                compares.push(Compare::create_revision(
                    kind_key.as_str(),
                    CompareOp::Equal,
                    0,
                ));
                compares.push(
                    Compare::mod_revision(mutex_base.as_str(), CompareOp::Less, read + 1)
                        .with_prefix(),
                );
                claim.push(TxnOp::put(kind_key.as_str(), wanted_text, None));
            }
        }
        let slots = Slots::decode(key, &base, &kvs)?;
        let decision = decide(req, &slots, now, takeover);
        let txn = Txn::new().when(compares);
        let (txn, slot) = match decision {
            Decision::Busy(busy, false) => return Ok(Acquire::Busy(busy)),
            Decision::Busy(busy, true) => {
                let mark = req.writer_mark_ttl().unwrap_or_default();
                let value = format!(
                    "{}|{}|{}",
                    expiry_value(now, mark),
                    req.owner(),
                    req.holder()
                );
                let mut ops = claim;
                ops.push(TxnOp::put(layout.marker(key), value, None));
                let txn = txn.and_then(ops);
                if backend.txn(txn).await?.succeeded() {
                    return Ok(Acquire::Busy(busy));
                }
                continue;
            }
            Decision::Extend(slot, token) => {
                let lease = req.granted_permit(slot, token);
                let grant = layout.slot(kind, key, Some(slot));
                if backend.renew_grant(&grant, &lease, req.ttl()).await? {
                    return Ok(Acquire::Granted(lease));
                }
                continue;
            }
            Decision::Take(slot) => {
                let grant = layout.slot(kind, key, Some(slot));
                let mut ops = claim;
                ops.extend(put_grant(&grant, req, now));
                if slot == WRITER_SLOT && kind == Kind::Rw {
                    // The writer's own marker has done its job.
                    ops.push(TxnOp::delete(layout.marker(key), None));
                }
                (txn.and_then(ops), slot)
            }
        };
        let resp = backend.txn(txn).await?;
        if resp.succeeded() {
            return Ok(Acquire::Granted(req.granted_permit(slot, revision(&resp)?)));
        }
    }
    Err(Error::unavailable("etcd: too many concurrent changes to this lock").in_store(STORE))
}

fn busy(holder: &str, remaining_ms: i64) -> Busy {
    Busy {
        holder: holder.to_owned(),
        remaining: crate::backend::millis_to_duration(remaining_ms),
    }
}

/// The rules of one attempt, on what the range read found: others'
/// grants and markers count as live until `takeover` (this client's clock
/// less the clock margin), the owner's own until `now`.
fn decide(req: &AcquireRequest, slots: &Slots, now: i64, takeover: i64) -> Decision {
    let live: Vec<&(Option<u32>, keys::Record)> = slots.live(takeover).collect();
    let first_to_expire = |filter: &dyn Fn(u32) -> bool| {
        live.iter()
            .filter(|(s, _)| filter(s.unwrap_or_default()))
            .min_by_key(|(_, r)| r.expiry_ms)
            .map(|(_, r)| super::busy(r.clone(), now, takeover))
    };
    let lowest_free =
        |below: u32| (0..below).find(|slot| !live.iter().any(|(s, _)| *s == Some(*slot)));
    let writer_side = |slot: u32| slot == WRITER_SLOT;
    // A repeat while this owner's grant (of this side) is live.
    let mine = live.iter().find(|(s, r)| {
        r.owner == req.owner()
            && r.live(now)
            && match req.permit_kind() {
                Some(PermitKind::Write) => *s == Some(WRITER_SLOT),
                Some(PermitKind::Read) => *s != Some(WRITER_SLOT),
                _ => true,
            }
    });
    if let Some((Some(slot), r)) = mine {
        return Decision::Extend(*slot, r.token);
    }
    let other_marker = slots
        .marker
        .as_ref()
        .filter(|m| m.expiry_ms > takeover && m.owner != req.owner())
        .map(|m| {
            let left = if m.expiry_ms > now { now } else { takeover };
            busy(&m.holder, m.expiry_ms - left)
        });
    // Only permit requests come here; a bare one counts as one permit.
    match req.permit_kind().unwrap_or(PermitKind::Semaphore(1)) {
        PermitKind::Semaphore(permits) => {
            if (live.len() as u64) < u64::from(permits) {
                if let Some(slot) = lowest_free(permits) {
                    return Decision::Take(slot);
                }
            }
            Decision::Busy(first_to_expire(&|_| true).unwrap_or(busy("", 0)), false)
        }
        PermitKind::Read => {
            if let Some(writer) = first_to_expire(&writer_side) {
                return Decision::Busy(writer, false);
            }
            if let Some(marker) = other_marker {
                return Decision::Busy(marker, false);
            }
            match lowest_free(MAX_PERMITS) {
                Some(slot) => Decision::Take(slot),
                None => Decision::Busy(first_to_expire(&|_| true).unwrap_or(busy("", 0)), false),
            }
        }
        PermitKind::Write => {
            if let Some(marker) = other_marker {
                let holders = first_to_expire(&|_| true);
                // The first to expire of the holders and the marker.
                let first = match holders {
                    Some(h) if h.remaining < marker.remaining => h,
                    _ => marker,
                };
                return Decision::Busy(first, false);
            }
            if let Some(writer) = first_to_expire(&writer_side) {
                return Decision::Busy(writer, false);
            }
            match first_to_expire(&|_| true) {
                None => Decision::Take(WRITER_SLOT),
                Some(reader) => Decision::Busy(reader, req.writer_mark_ttl().is_some()),
            }
        }
    }
}

/// Groups a listing's key-values by lock, each lock's records decoded.
pub(super) fn by_lock(
    layout: &Layout,
    kind: Kind,
    kvs: &[etcd_client::KeyValue],
) -> Result<Vec<(Key, Slots)>> {
    let start = layout.listing(kind, "").len();
    let mut out = Vec::new();
    let mut i = 0;
    while i < kvs.len() {
        let key = keys::key_of(start, kvs[i].key());
        let base = layout.lock(kind, &key);
        let end = kvs[i..]
            .iter()
            .position(|kv| !kv.key().starts_with(base.as_bytes()))
            .map_or(kvs.len(), |n| i + n);
        let slots = Slots::decode(&key, &base, &kvs[i..end])?;
        out.push((checked_key(&key)?, slots));
        i = end.max(i + 1);
    }
    Ok(out)
}

pub(super) async fn list(backend: &EtcdBackend, prefix: &str) -> Result<Vec<PermitInfo>> {
    let layout = &backend.inner.layout;
    let mut out = Vec::new();
    for kind in [Kind::Semaphore, Kind::Rw] {
        let (kvs, _) = backend.range(&layout.listing(kind, prefix)).await?;
        let now = now_ms();
        for (key, slots) in by_lock(layout, kind, &kvs)? {
            for (slot, r) in slots.live(now) {
                let slot = slot.unwrap_or_default();
                out.push(PermitInfo {
                    key: key.clone(),
                    slot,
                    holder: r.holder.clone(),
                    token: r.token,
                    remaining: r.remaining(now),
                    rw: (kind == Kind::Rw).then_some(if slot == WRITER_SLOT {
                        crate::backend::RwSide::Write
                    } else {
                        crate::backend::RwSide::Read
                    }),
                });
            }
        }
    }
    out.sort_by(|a, b| {
        (a.key.as_str(), a.rw.is_some(), a.slot).cmp(&(b.key.as_str(), b.rw.is_some(), b.slot))
    });
    Ok(out)
}
