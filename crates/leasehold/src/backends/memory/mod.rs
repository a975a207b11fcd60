//! The in-memory store: the reference implementation of the protocol, for
//! tests, doctests and locks within one process.
//!
//! Its clock is tokio's, so tests on paused time (`start_paused = true`)
//! drive expiry exactly.
//!
//! The records of keys idle past the idle window go away (`sweep.rs`), and
//! a key that comes back starts above a floor that every deleted record's
//! fence raised, so its tokens still only grow (docs/storage.md).

mod permits;
mod sweep;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{
    listing, Acquire, AcquireRequest, Backend, BoxFuture, Busy, KeyKind, Lease, LeaseInfo, OwnerId,
    DEFAULT_IDLE_WINDOW,
};
use crate::error::Result;
use crate::key::Key;
use crate::notify::{HandOff, Subscription, WakeHub};
use permits::PermitTable;

/// In-process lock store (`memory://`). Clones share the same locks.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    anchors: Arc<Mutex<Anchors>>,
    hub: WakeHub,
    permits: PermitTable,
    /// How long the record of a key nobody holds stays; `None`: forever.
    idle_window: Option<Duration>,
    /// Whether a release has a sweep step to take, read without the lock.
    sweep_gate: Arc<sweep::Gate>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend {
            anchors: Arc::default(),
            hub: WakeHub::default(),
            permits: PermitTable::default(),
            idle_window: Some(DEFAULT_IDLE_WINDOW),
            sweep_gate: Arc::default(),
        }
    }
}

/// Every key's record, and what deleting records left behind.
#[derive(Debug, Default)]
struct Anchors {
    records: BTreeMap<Key, Record>,
    /// At or above the fence of every record the sweep deleted (and of the
    /// permits it deleted with them): a record created anew starts here.
    floor: u64,
    /// The sweep's walk through the map, if a pass is under way.
    walk: Option<sweep::Walk>,
    /// When the last pass began.
    last_pass: Option<Instant>,
}

impl Anchors {
    /// The record of `key`, created at the floor if there is none.
    fn record(&mut self, key: &Key, now: Instant) -> &mut Record {
        let floor = self.floor;
        self.records.entry(key.clone()).or_insert_with(|| Record {
            fence: floor,
            holder: None,
            kind: KeyKind::Mutex,
            idle_since: now,
            queue: VecDeque::new(),
        })
    }
}

/// One key's record, its anchor: it holds the fence, so it goes only by
/// the sweep, which raises the floor to its fence. Its `kind` says what the
/// key is (one key is one lock): a permit request claims it, under this
/// map's lock, before it touches the permits.
#[derive(Debug)]
struct Record {
    fence: u64,
    holder: Option<Holder>,
    kind: KeyKind,
    /// When the mutex was last released (or the record created).
    idle_since: Instant,
    /// The mutex's waiters, first come first: the `# Contract`'s queue.
    queue: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Holder {
    owner: OwnerId,
    label: String,
    expires_at: Instant,
}

/// A waiter's entry in a key's queue.
#[derive(Debug)]
struct Waiter {
    owner: OwnerId,
    label: String,
    claim_window: Duration,
    ticket: u32,
    expires_at: Instant,
}

/// A grant handed over to the head of a queue, to tell it of once the
/// store's lock is let go.
struct Handed {
    key: Key,
    owner: OwnerId,
    grant: HandOff,
    /// What an attempt that handed the key over answers: busy, the head's.
    busy: Busy,
}

impl Handed {
    fn tell(self, hub: &WakeHub) {
        hub.hand_over(self.key.as_str(), self.owner, self.grant);
    }
}

impl Record {
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.expires_at > now)
    }

    /// Since when nobody has held the mutex, if nobody holds it (or waits
    /// for it) now.
    fn idle_since(&self, now: Instant) -> Option<Instant> {
        if self.queue.iter().any(|w| w.expires_at > now) {
            return None;
        }
        match &self.holder {
            Some(h) if h.expires_at > now => None,
            Some(h) => Some(h.expires_at.max(self.idle_since)),
            None => Some(self.idle_since),
        }
    }

    /// Enters `req`'s owner in the queue, or renews its entry in place,
    /// if the request queues.
    fn enqueue(&mut self, req: &AcquireRequest, now: Instant) {
        let (Some(ttl), Some(ticket)) = (req.queue_entry_ttl(), req.queue_ticket()) else {
            return;
        };
        let expires_at = now + ttl;
        match self.queue.iter_mut().find(|w| w.owner == req.owner()) {
            Some(entry) => {
                entry.expires_at = expires_at;
                entry.ticket = ticket;
            }
            None => self.queue.push_back(Waiter {
                owner: req.owner(),
                label: req.holder().to_owned(),
                claim_window: req.claim_window(),
                ticket,
                expires_at,
            }),
        }
    }

    /// The live head of the queue, after dropping the dead entries.
    fn head(&mut self, now: Instant) -> Option<&Waiter> {
        self.queue.retain(|w| w.expires_at > now);
        self.queue.front()
    }

    /// Grants the free key to the queue's live head, if there is one.
    fn hand_over(&mut self, key: &Key, now: Instant) -> Option<Handed> {
        self.head(now)?;
        let head = self.queue.pop_front()?;
        self.fence += 1;
        let busy = Busy {
            holder: head.label.clone(),
            remaining: head.claim_window,
        };
        self.holder = Some(Holder {
            owner: head.owner,
            label: head.label,
            expires_at: now + head.claim_window,
        });
        Some(Handed {
            key: key.clone(),
            owner: head.owner,
            grant: HandOff {
                token: self.fence,
                ticket: head.ticket,
            },
            busy,
        })
    }

    fn holds(&self, lease: &Lease) -> bool {
        self.fence == lease.token()
            && self
                .holder
                .as_ref()
                .is_some_and(|h| h.owner == lease.owner())
    }
}

impl MemoryBackend {
    /// An empty store, keeping the records of idle keys for
    /// [`DEFAULT_IDLE_WINDOW`].
    pub fn new() -> Self {
        MemoryBackend::default()
    }

    /// The same store, keeping the record of a key nobody holds for
    /// `window` after its last holder left (`None`: for the life of the
    /// process). Set it before the first use; clones made earlier keep
    /// theirs. A window of zero is refused by [`crate::Error::InvalidInput`]:
    /// a key would lose its record between a release and the next grant.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for `Some(Duration::ZERO)`.
    pub fn with_idle_window(mut self, window: Option<Duration>) -> Result<Self> {
        crate::backend::check_idle_window(window)?;
        self.idle_window = window;
        Ok(self)
    }

    /// How long the record of an idle key stays (`None`: forever).
    pub fn idle_window(&self) -> Option<Duration> {
        self.idle_window
    }

    fn anchors(&self) -> std::sync::MutexGuard<'_, Anchors> {
        // Every critical section below leaves the map consistent even if it
        // panics halfway, so a poisoned lock is still safe to use.
        self.anchors.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn info(key: &Key, record: &Record, now: Instant) -> Option<LeaseInfo> {
        record.live_holder(now).map(|h| {
            LeaseInfo::mutex(
                key.clone(),
                h.label.clone(),
                record.fence,
                h.expires_at - now,
            )
        })
    }
}

/// The operations of each kind, each one critical section under the
/// anchors' lock (or the permit table's).
impl MemoryBackend {
    fn acquire_mutex(&self, req: &AcquireRequest) -> Acquire {
        let now = Instant::now();
        let mut anchors = self.anchors();
        let record = anchors.record(req.key(), now);
        if record.kind != KeyKind::Mutex {
            return Acquire::OtherKind(record.kind);
        }
        if let Some(h) = record.holder.as_mut().filter(|h| h.expires_at > now) {
            if h.owner == req.owner() {
                // A repeat of the request that holds (or the claim of a
                // grant handed over to it): the same grant, its expiry
                // counted from this attempt.
                h.expires_at = now + req.ttl();
                return Acquire::Granted(req.granted(record.fence));
            }
            let busy = Busy {
                holder: h.label.clone(),
                remaining: h.expires_at - now,
            };
            record.enqueue(req, now);
            return Acquire::Busy(busy);
        }
        if record.head(now).is_some_and(|w| w.owner != req.owner()) {
            // The key is free but others queued first: it goes to them.
            if let Some(handed) = record.hand_over(req.key(), now) {
                record.enqueue(req, now);
                drop(anchors);
                let busy = handed.busy.clone();
                handed.tell(&self.hub);
                return Acquire::Busy(busy);
            }
        }
        record.queue.retain(|w| w.owner != req.owner());
        record.fence += 1;
        record.holder = Some(Holder {
            owner: req.owner(),
            label: req.holder().to_owned(),
            expires_at: now + req.ttl(),
        });
        Acquire::Granted(req.granted(record.fence))
    }

    fn acquire_permit(&self, req: &AcquireRequest) -> Acquire {
        let now = Instant::now();
        // The anchor's lock is held through the permit attempt: the
        // claim and the attempt are one atomic step.
        let mut anchors = self.anchors();
        let record = anchors.record(req.key(), now);
        let wanted = req.key_kind();
        if record.kind != wanted {
            if record.kind != KeyKind::Mutex {
                return Acquire::OtherKind(record.kind);
            }
            if let Some(h) = record.live_holder(now) {
                return Acquire::Busy(Busy {
                    holder: h.label.clone(),
                    remaining: h.expires_at - now,
                });
            }
            // A mutex key nobody holds becomes this kind; its tokens
            // go on from the mutex's.
            record.kind = wanted;
            self.permits.raise_fence(req, record.fence);
        }
        self.permits.try_acquire(req)
    }

    fn renew_mutex(&self, lease: &Lease, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut anchors = self.anchors();
        let Some(record) = anchors.records.get_mut(lease.key()) else {
            return false;
        };
        if !record.holds(lease) || record.live_holder(now).is_none() {
            return false;
        }
        if let Some(h) = record.holder.as_mut() {
            h.expires_at = now + ttl;
        }
        true
    }

    /// Whether the mutex lease was held, and the grant handed over to the
    /// head of the key's queue, if any (else the key is free).
    fn release_mutex(&self, lease: &Lease, now: Instant) -> (bool, Option<Handed>) {
        let mut anchors = self.anchors();
        match anchors.records.get_mut(lease.key()) {
            Some(record) if record.holds(lease) => {
                // Idle from now, or from its expiry if that came first.
                let ended = record.idle_since(now).unwrap_or(now);
                record.holder = None;
                record.idle_since = ended;
                (true, record.hand_over(lease.key(), now))
            }
            _ => (false, None),
        }
    }

    /// [`Backend::release_to`]: `lease`'s key goes to `next` in the same
    /// step, with the next token, unless the lease no longer holds it or
    /// waiters queued at the store come first (the caller then releases).
    fn release_mutex_to(&self, lease: &Lease, next: &AcquireRequest) -> Option<Lease> {
        let now = Instant::now();
        let mut anchors = self.anchors();
        let record = anchors.records.get_mut(lease.key())?;
        if !record.holds(lease) || record.head(now).is_some() {
            return None;
        }
        record.fence += 1;
        record.holder = Some(Holder {
            owner: next.owner(),
            label: next.holder().to_owned(),
            expires_at: now + next.ttl(),
        });
        Some(next.granted(record.fence))
    }

    /// [`Backend::leave_queue`]: the entry goes, and a grant handed over to
    /// `owner` and not claimed goes to the next head.
    fn leave(&self, key: &Key, owner: OwnerId) -> Option<Handed> {
        let now = Instant::now();
        let mut anchors = self.anchors();
        let record = anchors.records.get_mut(key)?;
        record.queue.retain(|w| w.owner != owner);
        let held = record.live_holder(now).is_some_and(|h| h.owner == owner);
        if !held {
            return None;
        }
        record.holder = None;
        record.idle_since = now;
        let handed = record.hand_over(key, now);
        if handed.is_none() {
            drop(anchors);
            self.hub.notify(key.as_str());
        }
        handed
    }

    fn list_mutexes(&self, prefix: &str) -> Vec<LeaseInfo> {
        let now = Instant::now();
        self.anchors()
            .records
            .iter()
            .filter(|(k, _)| k.as_str().starts_with(prefix))
            .filter_map(|(k, r)| Self::info(k, r, now))
            .collect()
    }
}

impl Backend for MemoryBackend {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            Ok(match req.permit_kind() {
                None => self.acquire_mutex(req),
                Some(_) => self.acquire_permit(req),
            })
        })
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            Ok(match lease.slot() {
                None => self.renew_mutex(lease, ttl),
                Some(_) => self.permits.renew(lease, ttl),
            })
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let now = Instant::now();
            let (freed, handed) = match lease.slot() {
                None => self.release_mutex(lease, now),
                Some(_) => (self.permits.release(lease, now), None),
            };
            match handed {
                // The head alone is told; nobody else is woken.
                Some(handed) => handed.tell(&self.hub),
                None if freed => {
                    self.hub.notify(lease.key().as_str());
                }
                None => {}
            }
            if self.sweep_gate.is_open(now) {
                self.sweep_step(now);
            }
            Ok(())
        })
    }

    fn hands_over_locally(&self) -> bool {
        true
    }

    fn release_to<'a>(
        &'a self,
        lease: &'a Lease,
        next: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Option<Lease>>> {
        Box::pin(async move { Ok(self.release_mutex_to(lease, next)) })
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Box::pin(async move {
            let now = Instant::now();
            Ok(self
                .anchors()
                .records
                .get(key)
                .and_then(|r| Self::info(key, r, now)))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        Box::pin(async move {
            Ok(listing(
                self.list_mutexes(prefix),
                self.permits.list(prefix),
            ))
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let now = Instant::now();
            let was_live = {
                let mut anchors = self.anchors();
                let Some(record) = anchors.records.get_mut(key) else {
                    return Ok(false);
                };
                if record.kind != KeyKind::Mutex {
                    // Every permit, reader and writer of the key.
                    let was_live = self.permits.force_release(key, record.kind, now);
                    drop(anchors);
                    self.hub.notify(key.as_str());
                    return Ok(was_live);
                }
                let was_live = record.live_holder(now).is_some();
                record.idle_since = record.idle_since(now).unwrap_or(now);
                record.holder = None;
                record.fence += 1;
                was_live
            };
            self.hub.notify(key.as_str());
            Ok(was_live)
        })
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async move { Ok(self.hub.subscribe(key.as_str())) })
    }

    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            self.hub.notify(key.as_str());
            Ok(true)
        })
    }

    fn queues(&self) -> bool {
        true
    }

    fn leave_queue<'a>(&'a self, key: &'a Key, owner: OwnerId) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if let Some(handed) = self.leave(key, owner) {
                handed.tell(&self.hub);
            }
            Ok(())
        })
    }
}
