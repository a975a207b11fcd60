//! etcd leases: what makes etcd, not a client's clock, end a grant.
//!
//! Each grant (and each writer's marker) is attached to an etcd lease of
//! its own (docs/etcd.md, "Lease model": per-key ttls, and one guard can
//! lose its lease alone). etcd lease TTLs are whole seconds and the server
//! raises any TTL below its minimum (1.5 × the election timeout, rounded
//! up), so a ttl is rounded **up** to whole seconds and the TTL the server
//! answers is what the grant reports back to the core: the guard's
//! deadline is never later than the moment etcd deletes the key.
//!
//! Timing: etcd starts a lease's TTL when the leader applies the grant or
//! the keep-alive, which is after this client sent it; a new leader
//! restarts every lease's TTL in full. So "sent at + TTL" is never later
//! than the store's expiry, which is what the core assumes of a ttl.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::backend::{Lease, OwnerId};
use crate::error::Result;

use super::errors::STORE;
use super::granted::Granted;
use super::spares::Spare;
use super::EtcdBackend;

/// One grant: its etcd key, owner and token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct GrantId(String, OwnerId, u64);

impl GrantId {
    pub fn new(etcd_key: &str, owner: OwnerId, token: u64) -> Self {
        GrantId(etcd_key.to_owned(), owner, token)
    }

    pub fn of(etcd_key: &str, lease: &Lease) -> Self {
        Self::new(etcd_key, lease.owner(), lease.token())
    }
}

/// Past this many, the memory of grants' leases starts again (renewals
/// then read the record first, as for a grant made elsewhere): grants
/// that ended without a release here are never forgotten otherwise.
const KNOWN_MAX: usize = 4096;

/// The etcd lease of each grant this backend made or extended, and for a
/// mutex grant made by a hand-off inside a release (`release_to`), its
/// place in the mutex's range (`Layout::other_mutex_place`), so its own
/// release names it at once.
#[derive(Debug, Default)]
pub(super) struct Known(Mutex<HashMap<GrantId, (Granted, Option<String>)>>);

impl Known {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<GrantId, (Granted, Option<String>)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, grant: &GrantId) -> Option<Granted> {
        self.map().get(grant).map(|(granted, _)| *granted)
    }

    /// Notes the grant's lease (a place noted before stays).
    pub fn remember(&self, grant: GrantId, id: i64, ttl: Duration) {
        self.note(grant, Granted { id, ttl }, None);
    }

    /// Notes the grant's lease and the etcd key it is at.
    pub fn remember_at(&self, grant: GrantId, on: Granted, at: String) {
        self.note(grant, on, Some(at));
    }

    fn note(&self, grant: GrantId, on: Granted, at: Option<String>) {
        let mut known = self.map();
        if known.len() >= KNOWN_MAX {
            known.clear();
        }
        let noted = known.entry(grant).or_insert((on, None));
        noted.0 = on;
        if at.is_some() {
            noted.1 = at;
        }
    }

    /// The place noted for the grant, if any.
    pub fn place(&self, grant: &GrantId) -> Option<String> {
        self.map().get(grant).and_then(|(_, at)| at.clone())
    }

    /// Forgets the grant; the place noted for it, if any.
    pub fn forget(&self, grant: &GrantId) -> Option<String> {
        self.map().remove(grant).and_then(|(_, at)| at)
    }
}

/// `ttl` as etcd's TTL: whole seconds, rounded up, at least one.
pub(super) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

fn from_secs(secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

impl EtcdBackend {
    /// Grants a fresh etcd lease of at least `ttl`.
    pub(super) async fn grant_lease(&self, ttl: Duration) -> Result<Granted> {
        let secs = ttl_secs(ttl);
        let resp = self
            .call("a lease grant", |client| {
                let mut leases = client.lease_client();
                async move { leases.grant(secs, None).await }
            })
            .await?;
        if !resp.error().is_empty() {
            return Err(crate::error::Error::backend(format!(
                "etcd refused a lease: {}",
                resp.error()
            ))
            .in_store(STORE));
        }
        Ok(Granted {
            id: resp.id(),
            // The server's answer, never less than what was asked.
            ttl: from_secs(resp.ttl().max(secs)),
        })
    }

    /// A lease for a mutex grant of `ttl`, and the ttl it promises from
    /// now: a young spare (its age off its TTL), else one granted now.
    pub(super) async fn lease_for_grant(&self, ttl: Duration) -> Result<(Spare, Duration)> {
        let spares = &self.inner.spares;
        let (found, stale) = spares.take(ttl_secs(ttl), spares.now());
        for id in stale {
            self.revoke_later(id);
        }
        if let Some(found) = found {
            return Ok(found);
        }
        tracing::trace!("leasehold: etcd grant without a spare lease");
        let spare = self.grant_spare(ttl).await?;
        Ok((spare, spare.granted.ttl))
    }

    /// A lease for `ttl` granted now, its age counted from the sending.
    async fn grant_spare(&self, ttl: Duration) -> Result<Spare> {
        let sent_at = self.inner.spares.now();
        let granted = self.grant_lease(ttl).await?;
        Ok(Spare {
            granted,
            asked_secs: ttl_secs(ttl),
            sent_at,
        })
    }

    /// Grants a spare for grants of `ttl` in the background, unless one
    /// is kept already or being granted.
    pub(super) fn refill_later(&self, ttl: Duration) {
        let asked_secs = ttl_secs(ttl);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.inner.spares.start_refill(asked_secs) {
            return;
        }
        let backend = self.clone();
        runtime.spawn(async move {
            let spare = backend.grant_spare(ttl).await.ok();
            let spares = &backend.inner.spares;
            if let Some(id) = spares.refilled(asked_secs, spare, spares.now()) {
                let _ = backend.revoke(id).await;
            }
        });
    }

    /// Keeps a lease an attempt did not attach to any key for a later
    /// grant, or revokes it when it is too old or enough are kept.
    pub(super) fn give_back(&self, lease: Spare) {
        let spares = &self.inner.spares;
        if let Some(id) = spares.put(lease, spares.now()) {
            self.revoke_later(id);
        }
    }

    /// Renews lease `id` once, to its full TTL. `false` if it is gone
    /// (expired, revoked): etcd never brings an expired lease back (a
    /// keep-alive of a lease that expired but whose keys are not yet
    /// deleted waits for the deletion and answers "not found").
    pub(super) async fn keep_alive(&self, id: i64) -> Result<bool> {
        self.call("a lease keep-alive", |client| {
            let mut leases = client.lease_client();
            async move {
                match leases.keep_alive(id).await {
                    // The client read the first answer (TTL > 0) before
                    // returning; dropping both ends closes the stream.
                    Ok(_) => Ok(true),
                    Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                    Err(e) => Err(e),
                }
            }
        })
        .await
    }

    /// The time left on lease `id`, `None` if it is gone. etcd answers
    /// whole seconds rounded down (a fresh 1 s lease says 0), so the
    /// answer is the middle of that second, within the lease's TTL: off
    /// by at most half a second, which only schedules a waiter's next
    /// look (a deletion wakes it anyway).
    pub(super) async fn time_left(&self, id: i64) -> Result<Option<Duration>> {
        let resp = self
            .call("a lease query", |client| {
                let mut leases = client.lease_client();
                async move { leases.time_to_live(id, None).await }
            })
            .await?;
        if resp.ttl() < 0 {
            return Ok(None);
        }
        let left = from_secs(resp.ttl()) + Duration::from_millis(500);
        Ok(Some(left.min(from_secs(resp.granted_ttl()))))
    }

    /// Lets lease `id` go once the one key a release (or a move) took off
    /// it is gone: recycled as a spare if it carried that grant alone
    /// (spares.rs), else revoked, both in the background.
    pub(super) fn let_go(&self, id: i64) {
        match self.inner.spares.freed(id) {
            Some((granted, asked_secs)) => self.recycle_later(granted, asked_secs),
            None => self.revoke_later(id),
        }
    }

    /// Keeps lease `granted`, which no longer carries a key, alive and
    /// keeps it as a spare for grants asking `asked_secs`, in the
    /// background: a keep-alive, answered by the leader alone, where a
    /// revoke and the next spare's grant are two Raft writes. Its age
    /// counts from the keep-alive's sending, as a spare's from its grant's.
    fn recycle_later(&self, granted: Granted, asked_secs: i64) {
        let spares = &self.inner.spares;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run it on (a backend dropped outside one): the
            // lease expires on its own.
            spares.refilled(asked_secs, None, spares.now());
            return;
        };
        let backend = self.clone();
        runtime.spawn(async move {
            let spares = &backend.inner.spares;
            let sent_at = spares.now();
            let alive = backend.keep_alive(granted.id).await;
            let spare = matches!(alive, Ok(true)).then_some(Spare {
                granted,
                asked_secs,
                sent_at,
            });
            let refused = spares.refilled(asked_secs, spare, spares.now());
            // Not kept: too old or surplus, or its keep-alive failed (the
            // lease may still run: revoking it is the tidy end).
            if let Some(id) = refused.or(alive.is_err().then_some(granted.id)) {
                let _ = backend.revoke(id).await;
            }
        });
    }

    /// Revokes lease `id` in the background: it holds no key any more (or
    /// never got one), so only the server's memory is at stake, and it
    /// would expire on its own. Not awaited, so a release or a busy answer
    /// costs no round trip for it.
    pub(super) fn revoke_later(&self, id: i64) {
        if id == 0 {
            return;
        }
        let backend = self.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = backend.revoke(id).await;
            });
        }
    }

    /// Revokes lease `id` now, deleting its keys. Whether it was there.
    pub(super) async fn revoke(&self, id: i64) -> Result<bool> {
        let answer = self
            .call("a lease revoke", |client| {
                let mut leases = client.lease_client();
                async move {
                    match leases.revoke(id).await {
                        Ok(_) => Ok(true),
                        Err(etcd_client::Error::GRpcStatus(s))
                            if s.message().contains("not found") =>
                        {
                            Ok(false)
                        }
                        Err(e) => Err(e),
                    }
                }
            })
            .await?;
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(100)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::from_secs(30)), 30);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
    }
}
