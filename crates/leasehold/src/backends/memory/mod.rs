//! The in-memory store: the reference implementation of the protocol, for
//! tests, doctests and locks within one process.
//!
//! Its clock is tokio's, so tests on paused time (`start_paused = true`)
//! drive expiry exactly.

mod permits;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{
    listing, Acquire, AcquireRequest, Backend, BoxFuture, Busy, KeyKind, Lease, LeaseInfo, OwnerId,
};
use crate::error::Result;
use crate::key::Key;
use crate::notify::{Subscription, WakeHub};
use permits::PermitTable;

/// In-process lock store (`memory://`). Clones share the same locks.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    records: Arc<Mutex<BTreeMap<Key, Record>>>,
    hub: WakeHub,
    permits: PermitTable,
}

/// One key's record, its anchor; never removed, because the fence lives
/// here. Its `kind` says what the key is (one key is one lock): a permit
/// request claims it, under this map's lock, before it touches the permits.
#[derive(Debug)]
struct Record {
    fence: u64,
    holder: Option<Holder>,
    kind: KeyKind,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            fence: 0,
            holder: None,
            kind: KeyKind::Mutex,
        }
    }
}

#[derive(Debug)]
struct Holder {
    owner: OwnerId,
    label: String,
    expires_at: Instant,
}

impl Record {
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.expires_at > now)
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
    /// An empty store.
    pub fn new() -> Self {
        MemoryBackend::default()
    }

    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Record>> {
        // Every critical section below leaves the map consistent even if it
        // panics halfway, so a poisoned lock is still safe to use.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
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
        let mut records = self.records();
        let record = records.entry(req.key().clone()).or_default();
        if record.kind != KeyKind::Mutex {
            return Acquire::OtherKind(record.kind);
        }
        if let Some(h) = record.holder.as_mut().filter(|h| h.expires_at > now) {
            if h.owner == req.owner() {
                // A repeat of the request that holds: the same grant,
                // its expiry counted from this attempt.
                h.expires_at = now + req.ttl();
                return Acquire::Granted(req.granted(record.fence));
            }
            return Acquire::Busy(Busy {
                holder: h.label.clone(),
                remaining: h.expires_at - now,
            });
        }
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
        let mut records = self.records();
        let record = records.entry(req.key().clone()).or_default();
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
        let mut records = self.records();
        let Some(record) = records.get_mut(lease.key()) else {
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

    /// Whether the mutex lease was held (and is now free).
    fn release_mutex(&self, lease: &Lease) -> bool {
        let mut records = self.records();
        match records.get_mut(lease.key()) {
            Some(record) if record.holds(lease) => {
                record.holder = None;
                true
            }
            _ => false,
        }
    }

    fn list_mutexes(&self, prefix: &str) -> Vec<LeaseInfo> {
        let now = Instant::now();
        self.records()
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
            let freed = match lease.slot() {
                None => self.release_mutex(lease),
                Some(_) => self.permits.release(lease),
            };
            if freed {
                self.hub.notify(lease.key().as_str());
            }
            Ok(())
        })
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Box::pin(async move {
            let now = Instant::now();
            Ok(self
                .records()
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
                let mut records = self.records();
                let Some(record) = records.get_mut(key) else {
                    return Ok(false);
                };
                if record.kind != KeyKind::Mutex {
                    // Every permit, reader and writer of the key.
                    let was_live = self.permits.force_release(key, record.kind);
                    drop(records);
                    self.hub.notify(key.as_str());
                    return Ok(was_live);
                }
                let was_live = record.live_holder(now).is_some();
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
}
