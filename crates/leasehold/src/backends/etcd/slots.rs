//! Semaphore permits and reader-writer locks: a lock's slots live in one
//! key range (`keys.rs`), so a grant looks at the range, decides by the
//! rules of docs/semaphore.md and docs/rw-lock.md, and commits with a
//! compare that no key of the range changed since the look (`mod_revision
//! < read + 1` over the range). A look is a read-only transaction, or the
//! else branch of a claim that failed (every claim reads the lock when its
//! compares fail), or, for a lock this backend last saw empty, a guess
//! (hints.rs): the first slot is claimed unread, comparing that the range
//! is empty. So an uncontended grant is one transaction, like a mutex's,
//! and a conflict's retry needs no read of its own. Each grant is still
//! one atomic transaction, its key on an etcd lease of its own like a
//! mutex's; every record in the range is live (etcd deletes a record when
//! its lease ends).

use std::time::Duration;

use etcd_client::TxnOp;

use crate::backend::{
    Acquire, AcquireRequest, Busy, PermitInfo, PermitKind, MAX_PERMITS, WRITER_SLOT,
};
use crate::error::{Error, Result};
use crate::key::Key;

use super::errors::STORE;
use super::hints::Hint;
use super::keys::{self, checked_key, Kind, Layout, Record, Slots};
use super::spares::Spare;
use super::txns::{LockKeys, Seen};
use super::{revision, txns, EtcdBackend, CONFLICT_RETRIES};

/// How many holders a busy answer asks etcd about, to name the one whose
/// lease ends first (one lease query each).
const BUSY_PROBES: usize = 8;

/// What the rules say about one attempt.
enum Decision<'a> {
    /// Take this slot (a fresh grant).
    Take(u32),
    /// The owner's own grant in this slot: the same grant, extended (if
    /// it is still live).
    Extend(u32, &'a Record),
    /// Busy behind these holders (the answer names the first to expire);
    /// for a waiting writer that found only readers, first set (or
    /// refresh) its marker.
    Busy(Vec<&'a Record>, bool),
}

pub(super) async fn try_acquire(backend: &EtcdBackend, req: &AcquireRequest) -> Result<Acquire> {
    let layout = &backend.inner.layout;
    let key = req.key().as_str();
    let kind = match req.permit_kind() {
        Some(PermitKind::Semaphore(_)) | None => Kind::Semaphore,
        Some(_) => Kind::Rw,
    };
    let lock = LockKeys {
        base: layout.lock(kind, key),
        kind: layout.kind(key),
        mutex: layout.slot(Kind::Mutex, key, None),
    };
    // Taken on the first attempt that needs it (a spare when there is one,
    // as for a mutex: spares.rs), kept across conflicts, with the ttl it
    // still promises.
    let mut fresh: Option<(Spare, Duration)> = None;
    let outcome = async {
        // A lock that looked empty last time is presumed empty: the first
        // claim goes out unread (hints.rs); any other is read first.
        let hint = backend.inner.hints.get(&lock.base);
        let mut look = if hint.empty {
            LockRead::presumed(req, &lock, hint.kind_held)
        } else {
            read_lock(backend, req, &lock).await?
        };
        for _ in 0..CONFLICT_RETRIES {
            if look.seen != Seen::Empty {
                // What a real look found is the next grant's guess.
                let held = look.claim.as_ref().is_ok_and(txns::KindClaim::is_held);
                let hint = Hint {
                    empty: look.kvs.is_empty() && look.claim.is_ok(),
                    kind_held: held,
                };
                backend.inner.hints.set(&lock.base, hint);
            }
            let claim = match look.claim {
                Ok(claim) => claim,
                Err(refused) => return Ok(refused),
            };
            let (kvs, seen) = (look.kvs, look.seen);
            let slots = Slots::decode(key, &lock.base, &kvs)?;
            let decision = decide(req, &slots);
            if seen == Seen::Empty && !matches!(decision, Decision::Take(_)) {
                // Nothing to claim on a presumption (not a request an
                // empty lock grants): read, then decide.
                look = read_lock(backend, req, &lock).await?;
                continue;
            }
            match decision {
                Decision::Busy(holders, false) => {
                    return Ok(Acquire::Busy(first_to_expire(backend, &holders).await?));
                }
                Decision::Busy(holders, true) => {
                    let mark = req.writer_mark_ttl().unwrap_or_default();
                    let lease = backend.grant_lease(mark).await?;
                    let value = keys::value(req.owner(), lease.ttl, req.holder());
                    let marker = layout.marker(key);
                    let txn = txns::mark(&lock, seen, &claim, &marker, value, lease.id);
                    let resp = backend.txn(txn).await?;
                    if resp.succeeded() {
                        if let Some(old) = &slots.marker {
                            backend.revoke_later(old.lease);
                        }
                        return Ok(Acquire::Busy(first_to_expire(backend, &holders).await?));
                    }
                    backend.revoke_later(lease.id);
                    look = LockRead::answered(backend, req, &lock, &resp).await?;
                }
                Decision::Extend(slot, record) => {
                    if fresh.is_some_and(|(f, _)| f.granted.id == record.lease) {
                        // Our own claim, committed though its answer was
                        // lost and the request resent: on the fresh lease.
                        if let Some((on, promised)) = fresh.take() {
                            let lease = req
                                .granted_permit(slot, record.token)
                                .enforced_for(promised);
                            let etcd_key = layout.slot(kind, key, Some(slot));
                            backend.remember(&etcd_key, &lease, on.granted, on.asked_secs);
                            backend.refill_later(req.ttl());
                            mark_held(backend, &lock.base);
                            return Ok(Acquire::Granted(lease));
                        }
                    }
                    let etcd_key = layout.slot(kind, key, Some(slot));
                    if let Some(ttl) = backend.extend(&etcd_key, record, req.ttl()).await? {
                        let lease = req.granted_permit(slot, record.token).enforced_for(ttl);
                        return Ok(Acquire::Granted(lease));
                    }
                    // It lapsed: the ordinary rules, on a new look.
                    look = read_lock(backend, req, &lock).await?;
                }
                Decision::Take(slot) => {
                    let (spare, promised) = match fresh {
                        Some(taken) => taken,
                        None => *fresh.insert(backend.lease_for_grant(req.ttl()).await?),
                    };
                    let lease = spare.granted;
                    let etcd_key = layout.slot(kind, key, Some(slot));
                    let mut also = Vec::new();
                    // The writer's own marker has done its job (its lease
                    // is revoked once the grant is in).
                    let marker = slots
                        .marker
                        .as_ref()
                        .filter(|_| slot == WRITER_SLOT && kind == Kind::Rw);
                    if marker.is_some() {
                        also.push(TxnOp::delete(layout.marker(key), None));
                    }
                    let value = keys::value(req.owner(), lease.ttl, req.holder());
                    let txn = txns::claim(&lock, seen, &claim, &etcd_key, value, lease.id, also);
                    let resp = backend.txn(txn).await?;
                    if resp.succeeded() {
                        fresh = None; // the grant's now
                        backend.refill_later(req.ttl());
                        if let Some(marker) = marker {
                            backend.revoke_later(marker.lease);
                        }
                        mark_held(backend, &lock.base);
                        let granted = req.granted_permit(slot, revision(&resp)?);
                        let granted = granted.enforced_for(promised);
                        backend.remember(&etcd_key, &granted, lease, spare.asked_secs);
                        return Ok(Acquire::Granted(granted));
                    }
                    look = LockRead::answered(backend, req, &lock, &resp).await?;
                }
            }
        }
        Err(Error::unavailable("etcd: too many concurrent changes to this lock").in_store(STORE))
    }
    .await;
    if let Some((unused, _)) = fresh {
        match outcome {
            // Every claim's compare failed: the lease holds no key and
            // serves a later grant.
            Ok(_) => backend.give_back(unused),
            // A claim's answer may have been lost after it attached the
            // key: revoking the lease deletes that key.
            Err(_) => backend.revoke_later(unused.granted.id),
        }
    }
    outcome
}

/// Notes that a grant of the lock `base` committed: the key is of the
/// asked kind now. Whether the lock is empty next time is a guess: it is
/// if this grant's holder releases first, the usual case of a lock taken
/// by one holder at a time.
fn mark_held(backend: &EtcdBackend, base: &str) {
    let hint = backend.inner.hints.get(base);
    backend.inner.hints.set(
        base,
        Hint {
            kind_held: true,
            ..hint
        },
    );
}

/// A permit or reader-writer lock's records as one look found them (at
/// one revision), with what the key's kind allows.
struct LockRead {
    kvs: Vec<etcd_client::KeyValue>,
    /// What a claim on this look compares the range against.
    seen: Seen,
    /// The kind condition the commit carries, or the answer to give
    /// instead (the key is of another kind, or a live mutex grant holds it).
    claim: std::result::Result<txns::KindClaim, Acquire>,
}

impl LockRead {
    /// The look presumed, unread: no record, and the kind held (`held`)
    /// or to be claimed; the claim's compares check both.
    fn presumed(req: &AcquireRequest, lock: &LockKeys, held: bool) -> LockRead {
        let stored = req.key_kind().stored().unwrap_or_default();
        let claim = if held {
            txns::KindClaim::held(&lock.kind, stored)
        } else {
            txns::KindClaim::claim(&lock.kind, &lock.mutex, stored)
        };
        LockRead {
            kvs: Vec::new(),
            seen: Seen::Empty,
            claim: Ok(claim),
        }
    }

    /// The look a transaction's reads ([`LockKeys::reads`], its only
    /// reads) answered: a read-only one's, or a failed claim's else branch.
    async fn answered(
        backend: &EtcdBackend,
        req: &AcquireRequest,
        lock: &LockKeys,
        answer: &etcd_client::TxnResponse,
    ) -> Result<LockRead> {
        let key = req.key().as_str();
        let revision = answer.header().map_or(0, |h| h.revision());
        let mut reads = txns::gets(answer);
        let kvs = reads.next().unwrap_or_default();
        let kind_kv = txns::first(reads.next());
        let mutex_kv = txns::first(reads.next());
        let wanted = req.key_kind();
        let stored = wanted.stored().unwrap_or_default();
        let claim = match (kind_kv, mutex_kv) {
            (Some(kind), _) => match super::kind_of(req.key(), &kind)? {
                held if held == wanted => Ok(txns::KindClaim::held(&lock.kind, stored)),
                held => Err(Acquire::OtherKind(held)),
            },
            // A mutex key: busy while its grant stands (every record is
            // live: etcd deletes one when its lease ends).
            (None, Some(mutex)) => {
                let record = Record::decode(key, &mutex)?;
                Err(Acquire::Busy(backend.busy(&record).await?))
            }
            (None, None) => Ok(txns::KindClaim::claim(&lock.kind, &lock.mutex, stored)),
        };
        Ok(LockRead {
            kvs,
            seen: Seen::At(revision),
            claim,
        })
    }
}

/// Reads the lock's range, the key's kind and its mutex grant in one
/// read-only transaction (one revision, one round trip).
async fn read_lock(
    backend: &EtcdBackend,
    req: &AcquireRequest,
    lock: &LockKeys,
) -> Result<LockRead> {
    let answer = backend
        .txn(etcd_client::Txn::new().and_then(lock.reads()))
        .await?;
    LockRead::answered(backend, req, lock, &answer).await
}

/// The busy answer for `holders`: the one whose lease ends first (of the
/// first [`BUSY_PROBES`]), with its time left.
async fn first_to_expire(backend: &EtcdBackend, holders: &[&Record]) -> Result<Busy> {
    let mut first: Option<Busy> = None;
    for record in holders.iter().take(BUSY_PROBES) {
        let remaining = backend
            .time_left(record.lease)
            .await?
            .unwrap_or(Duration::ZERO);
        if first.as_ref().is_none_or(|b| remaining < b.remaining) {
            first = Some(Busy {
                holder: record.holder.clone(),
                remaining,
            });
        }
    }
    Ok(first.unwrap_or(Busy {
        holder: String::new(),
        remaining: Duration::ZERO,
    }))
}

/// The rules of one attempt, on what the range read found (every record
/// there is live, or is being deleted by etcd right now).
fn decide<'a>(req: &AcquireRequest, slots: &'a Slots) -> Decision<'a> {
    let live = &slots.grants;
    let holders = |filter: &dyn Fn(u32) -> bool| -> Vec<&'a Record> {
        live.iter()
            .filter(|(s, _)| filter(s.unwrap_or_default()))
            .map(|(_, r)| r)
            .collect()
    };
    let lowest_free =
        |below: u32| (0..below).find(|slot| !live.iter().any(|(s, _)| *s == Some(*slot)));
    let writer_side = |slot: u32| slot == WRITER_SLOT;
    // A repeat while this owner's grant (of this side) is live.
    let mine = live.iter().find(|(s, r)| {
        r.owner == req.owner()
            && match req.permit_kind() {
                Some(PermitKind::Write) => *s == Some(WRITER_SLOT),
                Some(PermitKind::Read) => *s != Some(WRITER_SLOT),
                _ => true,
            }
    });
    if let Some((Some(slot), r)) = mine {
        return Decision::Extend(*slot, r);
    }
    let other_marker = slots.marker.as_ref().filter(|m| m.owner != req.owner());
    // Only permit requests come here; a bare one counts as one permit.
    match req.permit_kind().unwrap_or(PermitKind::Semaphore(1)) {
        PermitKind::Semaphore(permits) => {
            if (live.len() as u64) < u64::from(permits) {
                if let Some(slot) = lowest_free(permits) {
                    return Decision::Take(slot);
                }
            }
            Decision::Busy(holders(&|_| true), false)
        }
        PermitKind::Read => {
            let writers = holders(&writer_side);
            if !writers.is_empty() {
                return Decision::Busy(writers, false);
            }
            if let Some(marker) = other_marker {
                return Decision::Busy(vec![marker], false);
            }
            match lowest_free(MAX_PERMITS) {
                Some(slot) => Decision::Take(slot),
                None => Decision::Busy(holders(&|_| true), false),
            }
        }
        PermitKind::Write => {
            if let Some(marker) = other_marker {
                // The first to expire of the holders and the marker.
                let mut behind = vec![marker];
                behind.extend(holders(&|_| true));
                return Decision::Busy(behind, false);
            }
            let writers = holders(&writer_side);
            if !writers.is_empty() {
                return Decision::Busy(writers, false);
            }
            let readers = holders(&|_| true);
            if readers.is_empty() {
                Decision::Take(WRITER_SLOT)
            } else {
                Decision::Busy(readers, req.writer_mark_ttl().is_some())
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
        for (key, slots) in by_lock(layout, kind, &kvs)? {
            for (slot, r) in slots.grants {
                let Some(remaining) = backend.time_left(r.lease).await? else {
                    continue;
                };
                let slot = slot.unwrap_or_default();
                out.push(PermitInfo {
                    key: key.clone(),
                    slot,
                    holder: r.holder,
                    token: r.token,
                    remaining,
                    rw: (kind == Kind::Rw).then_some(if slot == WRITER_SLOT {
                        crate::backend::RwSide::Write
                    } else {
                        crate::backend::RwSide::Read
                    }),
                });
            }
        }
    }
    Ok(out)
}
