//! The in-memory store's semaphores and reader-writer locks: per key, a
//! fence counter and the holders of its slots, behind one mutex (one atomic
//! step per operation). Reader-writer locks live in a map of their own, so
//! they never meet a semaphore of the same key.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{
    Acquire, AcquireRequest, Busy, KeyKind, Lease, OwnerId, PermitInfo, PermitKind, RwSide,
    MAX_PERMITS, WRITER_SLOT,
};
use crate::key::Key;

/// Every semaphore of one memory store. Clones share it.
#[derive(Debug, Clone, Default)]
pub(super) struct PermitTable {
    keys: Arc<Mutex<BTreeMap<Key, Semaphore>>>,
    rw_keys: Arc<Mutex<BTreeMap<Key, Semaphore>>>,
}

/// One key's permits. It holds the fence, so it goes only with its anchor,
/// by the sweep, which raises the store's floor to its fence.
#[derive(Debug, Default)]
struct Semaphore {
    fence: u64,
    slots: BTreeMap<u32, Permit>,
    /// For a reader-writer lock: the writer waiting for its readers to go.
    mark: Option<Mark>,
    /// When the last slot or mark ended (released or expired), if one has.
    last_end: Option<Instant>,
}

#[derive(Debug)]
struct Mark {
    owner: OwnerId,
    label: String,
    expires_at: Instant,
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
        let mut ended = self.last_end;
        self.slots.retain(|_, p| {
            let live = p.expires_at > now;
            if !live {
                ended = ended.max(Some(p.expires_at));
            }
            live
        });
        if let Some(m) = self.mark.take() {
            if m.expires_at > now {
                self.mark = Some(m);
            } else {
                ended = ended.max(Some(m.expires_at));
            }
        }
        self.last_end = ended;
    }

    /// Whether nothing lives here and nothing has since `cutoff`.
    fn idle_before(&mut self, cutoff: Instant, now: Instant) -> bool {
        self.forget_expired(now);
        self.slots.is_empty() && self.mark.is_none() && self.last_end.is_none_or(|t| t <= cutoff)
    }

    /// Busy, naming the live holder whose grant expires first (among
    /// `which`), or else the waiting writer's marker.
    fn busy(&self, now: Instant, which: impl Fn(u32) -> bool) -> Acquire {
        let first = self
            .slots
            .iter()
            .filter(|(s, _)| which(**s))
            .map(|(_, p)| (&p.label, p.expires_at))
            .chain(self.mark.iter().map(|m| (&m.label, m.expires_at)))
            .min_by_key(|(_, at)| *at);
        Acquire::Busy(Busy {
            holder: first.map(|(l, _)| l.clone()).unwrap_or_default(),
            remaining: first.map_or(Duration::ZERO, |(_, at)| at - now),
        })
    }

    /// A repeat of a request that holds a live slot among `which`: the same
    /// grant (slot and token), its expiry counted from this attempt.
    fn regrant(
        &mut self,
        req: &AcquireRequest,
        now: Instant,
        which: impl Fn(u32) -> bool,
    ) -> Option<Acquire> {
        let (slot, permit) = self
            .slots
            .iter_mut()
            .find(|(s, p)| which(**s) && p.owner == req.owner() && p.expires_at > now)?;
        permit.expires_at = now + req.ttl();
        Some(Acquire::Granted(req.granted_permit(*slot, permit.token)))
    }

    fn grant(&mut self, req: &AcquireRequest, slot: u32, now: Instant) -> Acquire {
        self.fence += 1;
        self.slots.insert(
            slot,
            Permit {
                owner: req.owner(),
                token: self.fence,
                label: req.holder().to_owned(),
                expires_at: now + req.ttl(),
            },
        );
        Acquire::Granted(req.granted_permit(slot, self.fence))
    }

    /// One attempt at a reader-writer lock (docs/rw-lock.md): a reader is
    /// refused while the writer holds or another owner's marker lives; a
    /// writer is refused while anybody holds, and marks the lock as wanted
    /// if only readers do and no other writer has marked it.
    fn try_rw(&mut self, req: &AcquireRequest, side: RwSide, now: Instant) -> Acquire {
        self.forget_expired(now);
        let own = |s: u32| (s == WRITER_SLOT) == (side == RwSide::Write);
        if let Some(regrant) = self.regrant(req, now, own) {
            return regrant;
        }
        let writer_live = self.slots.contains_key(&WRITER_SLOT);
        let others_mark = self.mark.as_ref().is_some_and(|m| m.owner != req.owner());
        match side {
            RwSide::Read => {
                if writer_live || others_mark {
                    return self.busy(now, |_| true);
                }
                match (0..MAX_PERMITS).find(|s| !self.slots.contains_key(s)) {
                    Some(slot) => self.grant(req, slot, now),
                    None => self.busy(now, |_| true),
                }
            }
            RwSide::Write => {
                if writer_live || others_mark {
                    return self.busy(now, |_| true);
                }
                if !self.slots.is_empty() {
                    self.mark = req.writer_mark_ttl().map(|life| Mark {
                        owner: req.owner(),
                        label: req.holder().to_owned(),
                        expires_at: now + life,
                    });
                    // The readers it waits for, not its own marker.
                    let mark = self.mark.take();
                    let busy = self.busy(now, |_| true);
                    self.mark = mark;
                    return busy;
                }
                self.mark = None;
                self.grant(req, WRITER_SLOT, now)
            }
        }
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

    /// The map a lease of `side` lives in: semaphores, or reader-writer locks.
    fn table(&self, side: Option<RwSide>) -> std::sync::MutexGuard<'_, BTreeMap<Key, Semaphore>> {
        match side {
            None => self.keys(),
            Some(_) => self.rw_keys.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    pub(super) fn try_acquire(&self, req: &AcquireRequest) -> Acquire {
        let now = Instant::now();
        let permits = match req.permit_kind() {
            Some(PermitKind::Semaphore(n)) => n,
            Some(PermitKind::Read) => return self.try_rw(req, RwSide::Read, now),
            Some(PermitKind::Write) => return self.try_rw(req, RwSide::Write, now),
            None => 1,
        };
        let mut keys = self.keys();
        let sem = keys.entry(req.key().clone()).or_default();
        sem.forget_expired(now);
        if let Some(regrant) = sem.regrant(req, now, |_| true) {
            return regrant;
        }
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
        sem.grant(req, slot, now)
    }

    /// Raises the fence of the permits of `req`'s key (semaphore or
    /// reader-writer lock, by `req`'s kind) to at least `fence`: the key's
    /// mutex fence, when the key changes kind, so its tokens keep rising.
    pub(super) fn raise_fence(&self, req: &AcquireRequest, fence: u64) {
        let mut keys = self.table(req.rw_side());
        let sem = keys.entry(req.key().clone()).or_default();
        sem.fence = sem.fence.max(fence);
    }

    /// Frees every permit (or reader, writer and writer's marker) of `key`,
    /// a key of kind `kind`, and bumps its fence. Whether one was live.
    pub(super) fn force_release(&self, key: &Key, kind: KeyKind, now: Instant) -> bool {
        let mut keys = self.table(Self::side_of(kind));
        let sem = keys.entry(key.clone()).or_default();
        sem.forget_expired(now);
        let was_live = !sem.slots.is_empty() || sem.mark.is_some();
        sem.slots.clear();
        sem.mark = None;
        if was_live {
            sem.last_end = Some(now);
        }
        sem.fence += 1;
        was_live
    }

    /// Deletes the permits of `key`, a key of kind `kind`, if nothing has
    /// lived there since `cutoff`: their fence (0 if there were none), or
    /// `None` if they are still in use. The sweep calls it under the
    /// anchors' lock, so no grant of the key runs meanwhile.
    pub(super) fn take_if_idle(
        &self,
        key: &Key,
        kind: KeyKind,
        cutoff: Instant,
        now: Instant,
    ) -> Option<u64> {
        let mut keys = self.table(Self::side_of(kind));
        let Some(sem) = keys.get_mut(key) else {
            return Some(0);
        };
        if !sem.idle_before(cutoff, now) {
            return None;
        }
        keys.remove(key).map(|sem| sem.fence)
    }

    /// The side whose map holds a key of kind `kind`.
    fn side_of(kind: KeyKind) -> Option<RwSide> {
        (kind == KeyKind::ReaderWriter).then_some(RwSide::Write)
    }

    fn try_rw(&self, req: &AcquireRequest, side: RwSide, now: Instant) -> Acquire {
        let mut keys = self.table(Some(side));
        keys.entry(req.key().clone())
            .or_default()
            .try_rw(req, side, now)
    }

    pub(super) fn renew(&self, lease: &Lease, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut keys = self.table(lease.rw_side());
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
    pub(super) fn release(&self, lease: &Lease, now: Instant) -> bool {
        let mut keys = self.table(lease.rw_side());
        let Some(sem) = keys.get_mut(lease.key()) else {
            return false;
        };
        if sem.held_by(lease).is_none() {
            return false;
        }
        let freed = lease.slot().and_then(|s| sem.slots.remove(&s)).is_some();
        if freed {
            sem.last_end = Some(now);
        }
        freed
    }

    /// The live permits, then the live readers and writers (the caller
    /// orders them: [`crate::backend::listing`]).
    pub(super) fn list(&self, prefix: &str) -> Vec<PermitInfo> {
        let mut permits = self.list_in(&self.keys(), prefix, false);
        permits.extend(self.list_in(&self.table(Some(RwSide::Read)), prefix, true));
        permits
    }

    fn list_in(&self, keys: &BTreeMap<Key, Semaphore>, prefix: &str, rw: bool) -> Vec<PermitInfo> {
        let now = Instant::now();
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
                        rw: rw.then_some(if *slot == WRITER_SLOT {
                            RwSide::Write
                        } else {
                            RwSide::Read
                        }),
                    })
            })
            .collect()
    }
}
