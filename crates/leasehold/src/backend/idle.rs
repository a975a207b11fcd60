//! Idle records: how long a store keeps the record of a key nobody holds
//! ([`DEFAULT_IDLE_WINDOW`], URL option `idle_window`), and the
//! [`SweepSchedule`] that decides when a store runs its next sweep pass.
//!
//! A lock record carries the key's fence, so deleting it is safe only where
//! the store can still hand out a higher token when the key comes back; each
//! store writes down how (docs/storage.md). The window keeps a key in
//! steady use from being deleted and re-created between two of its grants.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a record stays after its key's last holder left, unless the
/// store is told otherwise: an hour (a key in use every few minutes keeps
/// its record; a per-order key is gone an hour after its order).
pub const DEFAULT_IDLE_WINDOW: Duration = Duration::from_secs(3600);

/// Refuses a zero window, under which a pass would delete a key's record
/// as soon as its holder left (`None`, keep records forever, is fine):
/// every store's `idle_window` option is checked here, before any I/O.
///
/// # Errors
/// [`Error::InvalidInput`](crate::Error::InvalidInput) naming `idle_window`.
pub(crate) fn check_idle_window(window: Option<Duration>) -> Result<()> {
    if window == Some(Duration::ZERO) {
        return Err(Error::invalid(
            "idle_window",
            "must be above zero (None keeps records forever)",
        ));
    }
    Ok(())
}

/// The same rule for the window of a sweep pass a caller starts itself.
///
/// # Errors
/// [`Error::InvalidInput`](crate::Error::InvalidInput) for a zero window.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongodb"))]
pub(crate) fn check_sweep_window(window: Duration) -> Result<()> {
    if window.is_zero() {
        return Err(Error::invalid("idle window", "must be above zero"));
    }
    Ok(())
}

/// The shortest pause between two sweep passes, whatever the window.
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(100);

/// When a store's next sweep pass may start: at most one pass at a time per
/// store handle, and a pass no sooner than half the window after the last
/// one began, so a record is gone between one and one and a half windows
/// after its key went idle, and a table is read through twice a window at
/// most.
#[derive(Debug)]
pub struct SweepSchedule {
    window: Option<Duration>,
    last_start: Mutex<Option<Instant>>,
    running: AtomicBool,
}

impl SweepSchedule {
    /// A schedule for records idle longer than `window` (`None`: never
    /// sweep).
    pub fn new(window: Option<Duration>) -> Self {
        SweepSchedule {
            window,
            last_start: Mutex::new(None),
            running: AtomicBool::new(false),
        }
    }

    /// The idle window, `None` if records are kept forever.
    pub fn window(&self) -> Option<Duration> {
        self.window
    }

    /// Starts a pass if one is due and none is running; the caller runs
    /// it and then calls [`finish`](Self::finish).
    pub fn try_start(&self) -> bool {
        let Some(window) = self.window else {
            return false;
        };
        let interval = (window / 2).max(MIN_PASS_INTERVAL);
        let now = Instant::now();
        let mut last = self.last_start.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| now.duration_since(at) < interval)
            || self.running.swap(true, Ordering::AcqRel)
        {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Starts a pass (as [`try_start`](Self::try_start)) if the store
    /// sweeps at all and is called on a runtime to run it on: the window
    /// and that runtime, `None` if no pass starts now.
    #[cfg_attr(not(any(feature = "postgres", feature = "etcd")), allow(dead_code))]
    pub(crate) fn start_due(&self) -> Option<(Duration, tokio::runtime::Handle)> {
        let window = self.window?;
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        self.try_start().then_some((window, runtime))
    }

    /// Ends the pass [`try_start`](Self::try_start) began.
    pub fn finish(&self) {
        self.running.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_at_a_time_and_none_before_half_the_window() {
        let schedule = SweepSchedule::new(Some(Duration::from_secs(3600)));
        assert!(schedule.try_start(), "the first pass is due");
        assert!(!schedule.try_start(), "one is running");
        schedule.finish();
        assert!(!schedule.try_start(), "the last one began just now");
        assert!(!SweepSchedule::new(None).try_start(), "never sweeps");
        let short = SweepSchedule::new(Some(Duration::from_millis(1)));
        assert!(short.try_start());
        std::thread::sleep(MIN_PASS_INTERVAL);
        assert!(!short.try_start(), "still running");
        short.finish();
        assert!(short.try_start(), "due again after the interval");
    }
}
