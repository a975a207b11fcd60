//! Starting each guard's renewal at its first renewal time, from one driver
//! task per [`Locks`](crate::Locks), instead of spawning a task per guard at
//! acquire.
//!
//! Most leases are released long before their first renewal (ttl/3), so the
//! per-guard task would be spawned, scheduled and cancelled for nothing:
//! work on the acquire/release hot path. Here an acquire only inserts into a
//! timer map and a release removes from it; the driver wakes when the
//! earliest entry is due (it is told only when a new entry is due earlier
//! than it planned to wake) and spawns the renewal task then.
//!
//! Nothing can go wrong with a lease before its first renewal time that a
//! task could catch: its deadline (`valid_until`) is at ttl minus a small
//! margin, long after ttl/3.
//!
//! Due times are on the [`LeaseClock`], which counts suspended time: while
//! anything is due, the driver looks at that clock at least every second, so
//! a renewal that fell due during a suspend starts right after the resume.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use crate::backend::BoxFuture;
use crate::time::LeaseClock;

/// How long an idle driver sleeps before looking again (it is woken earlier
/// whenever something becomes due earlier).
const IDLE: Duration = Duration::from_secs(60);

/// The timer map of one `Locks` handle and its clones.
#[derive(Debug, Default, Clone)]
pub(crate) struct RenewalScheduler {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Arc<Notify>,
    clock: LeaseClock,
}

#[derive(Default)]
struct Queue {
    due: BTreeMap<Ticket, BoxFuture<'static, ()>>,
    next_id: u64,
    /// When the driver plans to wake next; `None` before it first runs.
    armed: Option<Instant>,
    driver: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenewalScheduler")
            .field("pending", &self.lock().due.len())
            .finish()
    }
}

/// A scheduled start; cancel it with [`RenewalScheduler::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ticket(Instant, u64);

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Every critical section is a few map operations that leave the
        // queue consistent, so a poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Let the driver see that its scheduler is gone and exit.
        self.wake.notify_one();
    }
}

impl RenewalScheduler {
    /// A scheduler whose due times are on `clock`.
    #[cfg(test)]
    pub(crate) fn with_clock(clock: LeaseClock) -> Self {
        RenewalScheduler {
            shared: Arc::new(Shared {
                queue: Mutex::default(),
                wake: Arc::default(),
                clock,
            }),
        }
    }

    /// The clock due times are measured on.
    pub(crate) fn clock(&self) -> &LeaseClock {
        &self.shared.clock
    }

    /// Spawns `task` at `at` (on [`Self::clock`]), unless cancelled first. Must be called within
    /// a tokio runtime.
    pub(crate) fn schedule(&self, at: Instant, task: BoxFuture<'static, ()>) -> Ticket {
        let mut queue = self.shared.lock();
        let ticket = Ticket(at, queue.next_id);
        queue.next_id += 1;
        queue.due.insert(ticket, task);
        // A driver whose runtime shut down is gone: start one on this runtime.
        let driver_alive = queue.driver.as_ref().is_some_and(|d| !d.is_finished());
        if !driver_alive {
            queue.armed = None;
            queue.driver = Some(tokio::spawn(drive(
                Arc::downgrade(&self.shared),
                self.shared.wake.clone(),
            )));
        } else if queue.armed.is_none_or(|armed| at < armed) {
            self.shared.wake.notify_one();
        }
        ticket
    }

    /// Drops a scheduled start that has not happened yet. Returns whether it
    /// was still pending.
    pub(crate) fn cancel(&self, ticket: Ticket) -> bool {
        self.shared.lock().due.remove(&ticket).is_some()
    }
}

async fn drive(shared: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let (next, clock) = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let mut queue = shared.lock();
            let now = shared.clock.now();
            while let Some(entry) = queue.due.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                tokio::spawn(entry.remove());
            }
            let next = queue.due.keys().next().map(|t| t.0);
            queue.armed = Some(next.unwrap_or(now + IDLE));
            (next, shared.clock.clone())
        };
        tokio::select! {
            // Idle: nothing can fall due during a suspend.
            _ = sleep_until(Instant::now() + IDLE), if next.is_none() => {}
            _ = async { clock.sleep_until(next.unwrap_or(Instant::now())).await }, if next.is_some() => {}
            _ = wake.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn counter_task(n: &Arc<AtomicU32>) -> BoxFuture<'static, ()> {
        let n = n.clone();
        Box::pin(async move {
            n.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[tokio::test(start_paused = true)]
    async fn starts_tasks_when_due_and_not_before() {
        let s = RenewalScheduler::default();
        let ran = Arc::new(AtomicU32::new(0));
        let t0 = Instant::now();
        s.schedule(t0 + Duration::from_secs(10), counter_task(&ran));
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        // An earlier entry wakes the driver although it planned for 10 s.
        s.schedule(
            Instant::now() + Duration::from_millis(100),
            counter_task(&ran),
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_tasks_never_start() {
        let s = RenewalScheduler::default();
        let ran = Arc::new(AtomicU32::new(0));
        let ticket = s.schedule(Instant::now() + Duration::from_secs(1), counter_task(&ran));
        assert!(s.cancel(ticket));
        assert!(!s.cancel(ticket));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_new_runtime_gets_a_new_driver() {
        let s = RenewalScheduler::default();
        let ran = Arc::new(AtomicU32::new(0));
        for _ in 0..2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(async {
                s.schedule(
                    Instant::now() + Duration::from_millis(5),
                    counter_task(&ran),
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            });
        }
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }
}
