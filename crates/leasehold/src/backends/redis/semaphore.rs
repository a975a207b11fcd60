//! Redis's semaphores: per key, a hash of slots (`p:permits:{k}`, field the
//! slot, value `expiry ms:owner:token:holder` by the server's `TIME`) and a
//! permit fence (`p:pfence:{k}`, no ttl, never deleted), under the lock's
//! hash tag, so every script touches one cluster slot. Each operation is
//! one script; a grant scans the key's slots inside it (at most
//! `MAX_PERMITS`), so it is one round trip.
//!
//! Reader-writer locks use the same layout under their own names
//! (`p:rw:{k}`, `p:rwfence:{k}`), with the writer in slot `WRITER_SLOT`
//! and a waiting writer's marker in field `mark` (`acquire_rw.lua`);
//! renew and release are the permit scripts on those names.
//!
//! Both acquire scripts begin with the kind claim (`claim_kind.lua`) on
//! the key's mutex lock, fence and kind key, all under the same hash tag:
//! the claim and the grant are one script.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::errors::{classify, unconfirmed};
use super::{RedisBackend, STORE};
use crate::backend::{
    duration_to_millis, millis_to_duration, Acquire, AcquireRequest, Busy, KeyKind, Lease,
    PermitInfo, RecordDecoder, RwSide, MAX_PERMITS, WRITER_SLOT,
};
use crate::error::Result;
use crate::key::Key;

/// The permit scripts: acquire, renew, release, read. Loaded on first use
/// (`Script` and `run_and_wait_on` load a script a server does not know).
/// Both acquire scripts start with the kind claim (`claim_kind.lua`).
static SCRIPTS: LazyLock<[Script; 5]> = LazyLock::new(|| {
    [
        Script::new(concat!(
            include_str!("idle.lua"),
            include_str!("keep.lua"),
            include_str!("fence.lua"),
            include_str!("claim_kind.lua"),
            include_str!("acquire_permit.lua")
        )),
        Script::new(concat!(
            include_str!("idle.lua"),
            include_str!("keep.lua"),
            include_str!("renew_permit.lua")
        )),
        Script::new(include_str!("release_permit.lua")),
        Script::new(include_str!("read_permits.lua")),
        Script::new(concat!(
            include_str!("idle.lua"),
            include_str!("keep.lua"),
            include_str!("fence.lua"),
            include_str!("claim_kind.lua"),
            include_str!("acquire_rw.lua")
        )),
    ]
});

impl RedisBackend {
    /// The hash and fence of a semaphore (`rw` false) or of a
    /// reader-writer lock (`rw` true).
    fn permit_keys(&self, key: &Key, rw: bool) -> [String; 2] {
        if rw {
            [self.inner.ns.rw(key), self.inner.ns.rw_fence(key)]
        } else {
            [self.inner.ns.permits(key), self.inner.ns.permit_fence(key)]
        }
    }

    /// The keys of the renew and release scripts: the family's hash and
    /// fence, and the key's kind, which live as long as they do.
    fn permit_write_keys(&self, key: &Key, rw: bool) -> [String; 3] {
        let [hash, fence] = self.permit_keys(key, rw);
        [hash, fence, self.inner.ns.kind(key)]
    }

    /// Runs `script`, the renew or the release script, on `lease`'s permit
    /// (its family's keys, `permit_write_keys`) with `args`; the script's
    /// answer, 1 if it renewed or freed.
    async fn write_permit<const N: usize>(
        &self,
        script: &Script,
        lease: &Lease,
        args: [String; N],
    ) -> Result<i64> {
        let args = args.each_ref().map(String::as_str);
        let keys = self.permit_write_keys(lease.key(), lease.rw_side().is_some());
        self.run_on(script, &keys, &args).await
    }

    /// The keys of an acquire script: the family's hash and fence, then
    /// the key's mutex lock, fence and kind, which the script claims.
    fn acquire_keys_of(&self, key: &Key, rw: bool) -> [String; 5] {
        let [hash, fence] = self.permit_keys(key, rw);
        let [lock, mutex_fence, kind] = self.acquire_keys(key);
        [hash, fence, lock, mutex_fence, kind]
    }

    pub(super) async fn acquire_permit(&self, req: &AcquireRequest) -> Result<Acquire> {
        let owner = req.owner().to_string();
        let ttl = duration_to_millis(req.ttl()).to_string();
        let side = req.rw_side();
        let (script, args) = match side {
            None => (
                &SCRIPTS[0],
                vec![
                    owner.clone(),
                    ttl,
                    req.holder().to_owned(),
                    req.permits().unwrap_or(1).to_string(),
                    sem_or_rw(req),
                ],
            ),
            Some(side) => (
                &SCRIPTS[4],
                vec![
                    owner.clone(),
                    ttl,
                    req.holder().to_owned(),
                    if side == RwSide::Read { "r" } else { "w" }.to_owned(),
                    req.writer_mark_ttl()
                        .map_or(0, duration_to_millis)
                        .to_string(),
                    WRITER_SLOT.to_string(),
                    MAX_PERMITS.to_string(),
                    sem_or_rw(req),
                ],
            ),
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let keys = self.acquire_keys_of(req.key(), side.is_some());
        type Answer = (i64, i64, String, i64);
        let (token, slot, holder, left): Answer = match self.inner.options.min_replicas {
            0 => self.run_on(script, &keys, &args).await?,
            replicas => {
                let (answer, confirmed): (Answer, i64) =
                    self.run_and_wait_on(script, &keys, &args, replicas).await?;
                if confirmed < i64::from(replicas) {
                    // Not trusted: give it back (or let it expire). A kind
                    // claimed meanwhile stays: it is never undone.
                    if answer.0 > 0 {
                        let lease = req.granted_permit(answer.1.max(0) as u32, answer.0 as u64);
                        if let Err(e) = self.release_permit(&lease).await {
                            tracing::debug!(key = %req.key(), error = %e, "could not release an unconfirmed permit; it expires with its ttl");
                        }
                    }
                    return Err(unconfirmed(confirmed, replicas));
                }
                answer
            }
        };
        let record = RecordDecoder::new(STORE, req.key().as_str());
        if let Some(kind) = other_kind(&record, token, &holder)? {
            return Ok(Acquire::OtherKind(kind));
        }
        if token == 0 {
            return Ok(Acquire::Busy(Busy {
                holder,
                remaining: millis_to_duration(left),
            }));
        }
        let slot =
            u32::try_from(slot).map_err(|_| record.corrupt(format!("slot {slot} is negative")))?;
        Ok(Acquire::Granted(
            req.granted_permit(slot, record.token(token)?),
        ))
    }

    pub(super) async fn renew_permit(&self, lease: &Lease, ttl: Duration) -> Result<bool> {
        let args = [
            lease.owner().to_string(),
            lease.token().to_string(),
            duration_to_millis(ttl).to_string(),
            slot_text(lease),
        ];
        let renewed = self.write_permit(&SCRIPTS[1], lease, args).await?;
        Ok(renewed == 1)
    }

    pub(super) async fn release_permit(&self, lease: &Lease) -> Result<()> {
        let args = [
            lease.owner().to_string(),
            lease.token().to_string(),
            slot_text(lease),
            self.inner.ns.channel(),
            lease.key().as_str().to_owned(),
        ];
        let freed = self.write_permit(&SCRIPTS[2], lease, args).await?;
        if freed == 1 {
            self.wake_local(lease.key());
        }
        Ok(())
    }

    /// The live semaphore permits (or, with `rw`, reader-writer grants)
    /// under `prefix`.
    pub(super) async fn list_permits(&self, prefix: &str, rw: bool) -> Result<Vec<PermitInfo>> {
        let ns = &self.inner.ns;
        let pattern = if rw {
            ns.rw_pattern(prefix)
        } else {
            ns.permits_pattern(prefix)
        };
        let mut found = std::collections::BTreeSet::new();
        for name in self.scan(&pattern).await? {
            let key = if rw {
                ns.key_of_rw(&name)
            } else {
                ns.key_of_permits(&name)
            };
            if let Some(key) = key {
                found.insert(key?);
            }
        }
        // One read script per key, concurrently: on a cluster the keys sit
        // in different slots.
        let reads = found.into_iter().map(|key| async move {
            let mut call = SCRIPTS[3].prepare_invoke();
            let [permits, fence] = self.permit_keys(&key, rw);
            call.key(permits).key(fence);
            let read: Vec<String> = call
                .invoke_async(&mut self.conn())
                .await
                .map_err(classify)?;
            permits_of(key, &read, rw)
        });
        let mut all = Vec::new();
        for permits in futures_util::future::try_join_all(reads).await? {
            all.extend(permits);
        }
        Ok(all)
    }
}

/// The kind a permit request claims, as the kind key holds it.
fn sem_or_rw(req: &AcquireRequest) -> String {
    req.key_kind().stored().unwrap_or_default().to_owned()
}

/// The kind an acquire script answered the key has (token -1, the kind
/// key's value in the holder field, which a grant leaves empty), if that is
/// its answer. Any other negative token is a corrupt fence, reported as such
/// by the caller.
pub(super) fn other_kind(
    record: &RecordDecoder<'_>,
    token: i64,
    text: &str,
) -> Result<Option<KeyKind>> {
    if token != -1 || text.is_empty() {
        return Ok(None);
    }
    match KeyKind::from_stored(Some(text)) {
        Some(kind) => Ok(Some(kind)),
        None => Err(record.corrupt(format!("the kind key holds {text:?}"))),
    }
}

fn slot_text(lease: &Lease) -> String {
    lease
        .slot()
        .map_or_else(|| "none".to_owned(), |s| s.to_string())
}

/// The live permits in a `read_permits.lua` answer: the server's time in
/// ms, then slot and value pairs; by slot.
fn permits_of(key: Key, read: &[String], rw: bool) -> Result<Vec<PermitInfo>> {
    let record = RecordDecoder::new(STORE, key.as_str());
    let Some((now, slots)) = read.split_first() else {
        return Ok(Vec::new());
    };
    let now: i64 = now
        .parse()
        .map_err(|_| record.corrupt(format!("server time {now:?}")))?;
    let mut out = Vec::new();
    for pair in slots.chunks(2) {
        let [slot, value] = pair else {
            return Err(record.corrupt("an odd permits hash reply"));
        };
        if rw && slot == "mark" {
            // A waiting writer, not a holder.
            continue;
        }
        let mut fields = value.splitn(4, ':');
        let (Some(exp), Some(owner), Some(token), Some(holder)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(record.corrupt(format!("permit {slot} is not expiry:owner:token:holder")));
        };
        let number = |what: &str, text: &str| {
            text.parse::<i64>()
                .map_err(|_| record.corrupt(format!("permit {slot}: {what} {text:?}")))
        };
        let remaining = number("expiry", exp)? - now;
        if remaining <= 0 {
            continue;
        }
        out.push(record.slot_info(
            rw,
            number("slot", slot)?,
            owner,
            Some(holder.to_owned()),
            number("token", token)?,
            remaining,
        )?);
    }
    out.sort_by_key(|p| p.slot);
    Ok(out)
}
