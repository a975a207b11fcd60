//! The in-memory store's semaphores: per key, a fence counter and the
//! holders of its slots, behind one mutex (one atomic step per operation).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Acquire, AcquireRequest, Busy, Lease, OwnerId, PermitInfo};
use crate::key::Key;

/// Every semaphore of one memory store. Clones share it.
#[derive(Debug, Clone, Default)]
pub(super) struct PermitTable {
    keys: Arc<Mutex<BTreeMap<Key, Semaphore>>>,
}

/// One key's permits; never removed, because the fence lives here.
#[derive(Debug, Default)]
struct Semaphore {
    fence: u64,
    slots: BTreeMap<u32, Permit>,
}

#[derive(Debug)]
struct Permit {
    owner: OwnerId,
    token: u64,
    label: String,
    expires_at: Instant,
}

impl Semaphore {
    fn forget_expired(&mut self, now: Instant) {
        self.slots.retain(|_, p| p.expires_at > now);
    }

    fn held_by(&mut self, lease: &Lease) -> Option<&mut Permit> {
        let slot = lease.slot()?;
        self.slots
            .get_mut(&slot)
            .filter(|p| p.owner == lease.owner() && p.token == lease.token())
    }
}

impl PermitTable {
    fn keys(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Semaphore>> {
        // Each critical section leaves the map consistent.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn try_acquire(&self, req: &AcquireRequest) -> Acquire {
        let now = Instant::now();
        let permits = req.permits().unwrap_or(1);
        let mut keys = self.keys();
        let sem = keys.entry(req.key().clone()).or_default();
        sem.forget_expired(now);
        if sem.slots.len() >= permits as usize {
            let first_to_expire = sem.slots.values().min_by_key(|p| p.expires_at);
            return Acquire::Busy(Busy {
                holder: first_to_expire.map(|p| p.label.clone()).unwrap_or_default(),
                remaining: first_to_expire.map_or(Duration::ZERO, |p| p.expires_at - now),
            });
        }
        // Fewer than `permits` live, so one of 0..permits is free.
        let slot = (0..permits)
            .find(|s| !sem.slots.contains_key(s))
            .expect("a free slot below permits");
        sem.fence += 1;
        sem.slots.insert(
            slot,
            Permit {
                owner: req.owner(),
                token: sem.fence,
                label: req.holder().to_owned(),
                expires_at: now + req.ttl(),
            },
        );
        Acquire::Granted(req.granted_permit(slot, sem.fence))
    }

    pub(super) fn renew(&self, lease: &Lease, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut keys = self.keys();
        let Some(sem) = keys.get_mut(lease.key()) else {
            return false;
        };
        sem.forget_expired(now);
        match sem.held_by(lease) {
            Some(permit) => {
                permit.expires_at = now + ttl;
                true
            }
            None => false,
        }
    }

    /// Whether the permit was held (and is now free).
    pub(super) fn release(&self, lease: &Lease) -> bool {
        let mut keys = self.keys();
        let Some(sem) = keys.get_mut(lease.key()) else {
            return false;
        };
        if sem.held_by(lease).is_none() {
            return false;
        }
        lease.slot().and_then(|s| sem.slots.remove(&s)).is_some()
    }

    pub(super) fn list(&self, prefix: &str) -> Vec<PermitInfo> {
        let now = Instant::now();
        let keys = self.keys();
        keys.iter()
            .filter(|(k, _)| k.as_str().starts_with(prefix))
            .flat_map(|(key, sem)| {
                sem.slots
                    .iter()
                    .filter(|(_, p)| p.expires_at > now)
                    .map(move |(slot, p)| PermitInfo {
                        key: key.clone(),
                        slot: *slot,
                        holder: p.label.clone(),
                        token: p.token,
                        remaining: p.expires_at - now,
                    })
            })
            .collect()
    }
}
