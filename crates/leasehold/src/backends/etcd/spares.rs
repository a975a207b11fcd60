//! Leases granted ahead of the grants that need them.
//!
//! A mutex grant needs an etcd lease before its transaction (the key is
//! attached to it), and a `LeaseGrant` is a Raft write: granting it on the
//! critical path made an uncontended acquisition two round trips to the
//! leader where the raw `put` + `delete` pair needs one each
//! (docs/etcd.md, "Measured"). So a grant takes a spare lease granted
//! earlier in the background when there is one for its ttl, and a new
//! spare is granted behind it; a busy answer gives its unused lease back
//! instead of revoking it.
//!
//! A lease whose one grant was released is not revoked but kept alive and
//! kept as a spare (recycled): a `LeaseRevoke` and the next spare's
//! `LeaseGrant` are two Raft writes, a keep-alive is answered by the
//! leader alone. Only a lease granted for one grant alone is recycled
//! ([`Spares::in_use`]): a handed-over grant's lease is its waiter's queue
//! entry lease, which also carries the key's announce key, and is revoked.
//!
//! A spare has been running since its grant was sent: the time since then
//! is taken off the ttl the grant reports, so the guard's deadline stays
//! no later than etcd's expiry (`leases.rs`, "Timing"). A spare older than
//! a tenth of its TTL is not used (the guard would lose too much of its
//! ttl) but revoked. Ages are measured on the lease clock, which counts
//! the time the machine was suspended: etcd's lease runs on while this
//! client sleeps, so a spare granted before a suspend is old after it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::granted::Granted;
use crate::time::LeaseClock;

/// Spares kept at most (per backend, over every ttl); more are revoked.
const SPARES_MAX: usize = 4;

/// Spares kept or on their way (being granted or recycled) at most per
/// ttl before a grant asks for a new one: two, so that grants back to back
/// (a permit right after a mutex, say) find the spare granted behind the
/// grant before last, which has had two grants' time to arrive.
const AHEAD: usize = 2;

/// Past this many leases in use, the memory of them starts again (their
/// leases are then revoked at release, as before recycling): grants that
/// ended without a release here are never forgotten otherwise.
const IN_USE_MAX: usize = 4096;

/// A lease and when its grant was sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Spare {
    pub granted: Granted,
    /// The TTL asked for, in etcd's whole seconds: the spare serves grants
    /// that ask the same.
    pub asked_secs: i64,
    pub sent_at: Instant,
}

impl Spare {
    /// How long the lease still runs at `now`, at least: its TTL from
    /// the sending of its grant. `None` once it is too old to hand out.
    pub fn usable_for(&self, now: Instant) -> Option<Duration> {
        let age = now.saturating_duration_since(self.sent_at);
        (age <= self.granted.ttl / 10).then(|| self.granted.ttl - age)
    }
}

/// The spares of one backend.
#[derive(Debug, Default)]
pub(super) struct Spares {
    pool: Mutex<Pool>,
    clock: LeaseClock,
}

#[derive(Debug, Default)]
struct Pool {
    spares: Vec<Spare>,
    /// The ttl (whole seconds) of each spare on its way now (being granted,
    /// or a released grant's lease being kept alive): with the spares kept,
    /// at most [`AHEAD`] per ttl start a grant, so that grants in quick
    /// succession, each finding the spares of the ones before still in
    /// flight, do not pile up lease grants on the leader.
    refilling: Vec<i64>,
    /// The leases that carry one grant alone, by id: the TTL asked (whole
    /// seconds) and the lease as granted. Recycled at that grant's release.
    in_use: HashMap<i64, (i64, Granted)>,
}

impl Spares {
    /// Spares whose ages are read on `clock` (tests suspend it by hand).
    #[cfg(test)]
    fn with_clock(clock: LeaseClock) -> Self {
        Spares {
            pool: Mutex::default(),
            clock,
        }
    }

    /// Now, on the clock spare ages are measured on.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        // Every update leaves the pool whole, so a poisoned lock still holds a valid one.
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A spare for a grant asking `asked_secs`, usable at `now`, with the
    /// ttl it can still promise; and the ids of the spares found too old,
    /// to revoke.
    pub fn take(&self, asked_secs: i64, now: Instant) -> (Option<(Spare, Duration)>, Vec<i64>) {
        let mut pool = self.pool();
        let spares = &mut pool.spares;
        let mut stale = Vec::new();
        spares.retain(|s| {
            let keep = s.usable_for(now).is_some();
            if !keep {
                stale.push(s.granted.id);
            }
            keep
        });
        let found = spares
            .iter()
            .position(|s| s.asked_secs == asked_secs)
            .map(|i| spares.swap_remove(i))
            .and_then(|s| s.usable_for(now).map(|ttl| (s, ttl)));
        (found, stale)
    }

    /// Whether to grant a spare for `asked_secs` now: fewer than
    /// [`AHEAD`] are kept or being granted. `true` marks one as being
    /// granted, until [`refilled`](Self::refilled).
    pub fn start_refill(&self, asked_secs: i64) -> bool {
        let mut pool = self.pool();
        let ahead = pool.refilling.iter().filter(|&&s| s == asked_secs).count()
            + pool
                .spares
                .iter()
                .filter(|s| s.asked_secs == asked_secs)
                .count();
        let wanted = ahead < AHEAD;
        if wanted {
            pool.refilling.push(asked_secs);
        }
        wanted
    }

    /// A refill (or a recycle) for `asked_secs` ended, with `spare` if its
    /// grant (or keep-alive) was answered; the id of the lease to revoke
    /// instead, as for [`put`](Self::put).
    pub fn refilled(&self, asked_secs: i64, spare: Option<Spare>, now: Instant) -> Option<i64> {
        let mut pool = self.pool();
        if let Some(i) = pool.refilling.iter().position(|&s| s == asked_secs) {
            pool.refilling.swap_remove(i);
        }
        spare.and_then(|spare| pool.keep(spare, now))
    }

    /// Notes that lease `granted`, granted for a ttl of `asked_secs`,
    /// now carries one grant and nothing else.
    pub fn in_use(&self, granted: Granted, asked_secs: i64) {
        let mut pool = self.pool();
        if pool.in_use.len() >= IN_USE_MAX {
            pool.in_use.clear();
        }
        pool.in_use.insert(granted.id, (asked_secs, granted));
    }

    /// Lease `id` no longer carries its grant (released, or the grant
    /// moved to another lease). Its recycle: the lease and the ttl asked,
    /// marked on its way as a spare until [`refilled`](Self::refilled);
    /// `None` if it did not carry one grant alone (revoke it).
    pub fn freed(&self, id: i64) -> Option<(Granted, i64)> {
        let mut pool = self.pool();
        let (asked_secs, granted) = pool.in_use.remove(&id)?;
        pool.refilling.push(asked_secs);
        Some((granted, asked_secs))
    }

    /// Keeps `spare` for a later grant; the id of the lease to revoke
    /// instead when it is too old or the backend keeps enough.
    pub fn put(&self, spare: Spare, now: Instant) -> Option<i64> {
        self.pool().keep(spare, now)
    }

    /// Every spare's id, the store emptied (on shutdown).
    pub fn drain(&self) -> Vec<i64> {
        self.pool().spares.drain(..).map(|s| s.granted.id).collect()
    }
}

impl Pool {
    fn keep(&mut self, spare: Spare, now: Instant) -> Option<i64> {
        if spare.usable_for(now).is_none() || self.spares.len() >= SPARES_MAX {
            return Some(spare.granted.id);
        }
        self.spares.push(spare);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ManualSuspendClock;
    use std::sync::Arc;

    fn spare(id: i64, secs: i64, sent_at: Instant) -> Spare {
        Spare {
            granted: Granted {
                id,
                ttl: Duration::from_secs(secs as u64),
            },
            asked_secs: secs,
            sent_at,
        }
    }

    #[test]
    fn a_spare_promises_its_ttl_less_its_age_and_only_while_young() {
        let t0 = Instant::now();
        let s = spare(1, 10, t0);
        assert_eq!(s.usable_for(t0), Some(Duration::from_secs(10)));
        assert_eq!(
            s.usable_for(t0 + Duration::from_millis(400)),
            Some(Duration::from_millis(9600))
        );
        assert_eq!(
            s.usable_for(t0 + Duration::from_secs(1)),
            Some(Duration::from_secs(9))
        );
        assert_eq!(s.usable_for(t0 + Duration::from_millis(1001)), None);
        // A clock read before the grant was sent: no age, never more ttl.
        assert_eq!(
            s.usable_for(t0 - Duration::from_secs(1)),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn take_matches_the_ttl_and_hands_back_the_stale_to_revoke() {
        let t0 = Instant::now();
        let spares = Spares::default();
        assert_eq!(spares.put(spare(1, 30, t0), t0), None);
        assert_eq!(spares.put(spare(2, 5, t0), t0), None);
        let (found, stale) = spares.take(30, t0 + Duration::from_millis(5));
        let (s, ttl) = found.unwrap();
        assert_eq!((s.granted.id, ttl), (1, Duration::from_millis(29995)));
        assert!(stale.is_empty());
        assert!(spares.take(30, t0).0.is_none(), "taken once");
        // The 5 s spare is past a tenth of its TTL 600 ms later.
        let (found, stale) = spares.take(5, t0 + Duration::from_millis(600));
        assert!(found.is_none());
        assert_eq!(stale, [2]);
        assert!(spares.take(5, t0).0.is_none());
    }

    #[test]
    fn two_spares_ahead_per_ttl_kept_or_in_flight() {
        let t0 = Instant::now();
        let spares = Spares::default();
        assert!(spares.start_refill(30));
        assert!(spares.start_refill(30), "a second in flight");
        assert!(!spares.start_refill(30), "two in flight");
        assert!(spares.start_refill(5), "another ttl is another refill");
        assert_eq!(spares.refilled(30, Some(spare(1, 30, t0)), t0), None);
        assert!(!spares.start_refill(30), "one kept, one in flight");
        assert_eq!(spares.refilled(30, Some(spare(2, 30, t0)), t0), None);
        assert!(!spares.start_refill(30), "two kept");
        assert!(spares.take(30, t0).0.is_some());
        assert!(spares.start_refill(30));
        assert!(!spares.start_refill(30));
        // A refill whose grant failed ends too.
        assert_eq!(spares.refilled(30, None, t0), None);
        assert!(spares.start_refill(30));
    }

    /// A released grant's lease comes back as a spare, counted among the
    /// spares on their way (no lease grant starts behind it); a lease that
    /// did not carry one grant alone is not recycled.
    #[test]
    fn a_lease_in_use_alone_is_recycled_once_at_its_release() {
        let t0 = Instant::now();
        let spares = Spares::default();
        let granted = Granted {
            id: 7,
            ttl: Duration::from_secs(30),
        };
        spares.in_use(granted, 30);
        assert!(spares.freed(8).is_none(), "never in use here");
        let (back, asked) = spares.freed(7).expect("in use alone");
        assert_eq!((back.id, asked), (7, 30));
        assert!(spares.freed(7).is_none(), "recycled once");
        assert!(spares.start_refill(30), "one on its way");
        assert!(!spares.start_refill(30), "two on their way");
        assert_eq!(spares.refilled(30, Some(spare(7, 30, t0)), t0), None);
        assert_eq!(spares.refilled(30, None, t0), None);
        let (found, _) = spares.take(30, t0);
        assert_eq!(found.unwrap().0.granted.id, 7);
        assert!(spares.start_refill(30), "nothing on its way any more");
    }

    /// A suspend stops the monotonic clock but not etcd's lease: a spare
    /// granted just before one is past use right after it.
    #[test]
    fn a_suspend_ages_a_spare() {
        let manual = Arc::new(ManualSuspendClock::default());
        let spares = Spares::with_clock(LeaseClock::with_suspend_clock(manual.clone()));
        let sent_at = spares.now();
        assert_eq!(spares.put(spare(1, 10, sent_at), spares.now()), None);
        manual.suspend_for(Duration::from_secs(5));
        let (found, stale) = spares.take(10, spares.now());
        assert!(
            found.is_none(),
            "5 s of a 10 s lease ran out while suspended"
        );
        assert_eq!(stale, [1]);
    }

    #[test]
    fn put_refuses_the_old_and_the_surplus() {
        let t0 = Instant::now();
        let spares = Spares::default();
        assert_eq!(
            spares.put(spare(9, 1, t0), t0 + Duration::from_millis(200)),
            Some(9)
        );
        for id in 0..SPARES_MAX as i64 {
            assert_eq!(spares.put(spare(id, 30, t0), t0), None);
        }
        assert_eq!(spares.put(spare(99, 30, t0), t0), Some(99));
        let mut all = spares.drain();
        all.sort_unstable();
        assert_eq!(all, (0..SPARES_MAX as i64).collect::<Vec<_>>());
    }
}
