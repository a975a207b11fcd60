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
//!
//! The driver and the renewal tasks run on the handle's [`Background`]
//! runtime (background.rs), not on the runtime of the caller that scheduled
//! first: renewal must go on while any caller's runtime ends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use crate::backend::BoxFuture;
use crate::background::Background;
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
    background: Background,
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
    /// A scheduler whose due times are on `clock` and whose tasks run on
    /// `background`.
    pub(crate) fn new(clock: LeaseClock, background: Background) -> Self {
        RenewalScheduler {
            shared: Arc::new(Shared {
                queue: Mutex::default(),
                wake: Arc::default(),
                clock,
                background,
            }),
        }
    }

    /// The clock due times are measured on.
    pub(crate) fn clock(&self) -> &LeaseClock {
        &self.shared.clock
    }

    /// Where the renewal tasks run; other background work of the same
    /// handle goes there too.
    pub(crate) fn background(&self) -> &Background {
        &self.shared.background
    }

    /// Spawns `task` at `at` (on [`Self::clock`]), unless cancelled first,
    /// on the [`Background`] runtime.
    pub(crate) fn schedule(&self, at: Instant, task: BoxFuture<'static, ()>) -> Ticket {
        let mut queue = self.shared.lock();
        let ticket = Ticket(at, queue.next_id);
        queue.next_id += 1;
        queue.due.insert(ticket, task);
        // Started on first use. A driver can only be gone if the runtime it
        // ran on shut down: one the caller named (`with_background_runtime`),
        // or the caller's own if the library's thread could not be started.
        let driver_alive = queue.driver.as_ref().is_some_and(|d| !d.is_finished());
        if !driver_alive {
            queue.armed = None;
            let driver = drive(Arc::downgrade(&self.shared), self.shared.wake.clone());
            queue.driver = match self.shared.background.handle() {
                Some(runtime) => Some(runtime.spawn(driver)),
                None => {
                    tracing::error!("no runtime to renew leases on; guards will be lost");
                    None
                }
            };
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

    /// A scheduler on the test's runtime, whose paused clock then drives it.
    fn on_this_runtime() -> RenewalScheduler {
        RenewalScheduler::new(
            LeaseClock::default(),
            Background::On(tokio::runtime::Handle::current()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn starts_tasks_when_due_and_not_before() {
        let s = on_this_runtime();
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
        let s = on_this_runtime();
        let ran = Arc::new(AtomicU32::new(0));
        let ticket = s.schedule(Instant::now() + Duration::from_secs(1), counter_task(&ran));
        assert!(s.cancel(ticket));
        assert!(!s.cancel(ticket));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    /// Tasks scheduled from runtimes that end run on (on the library's
    /// background thread): the first runtime's end takes nothing with it.
    #[test]
    fn tasks_outlive_the_runtimes_that_scheduled_them() {
        let s = RenewalScheduler::default();
        let ran = Arc::new(AtomicU32::new(0));
        for _ in 0..2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            // Due after the runtime that scheduled it has ended.
            rt.block_on(async {
                s.schedule(
                    Instant::now() + Duration::from_millis(20),
                    counter_task(&ran),
                );
            });
        }
        let give_up = std::time::Instant::now() + Duration::from_secs(30);
        while ran.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }
}
