//! How a connection waits for another process's write lock: SQLite's own
//! busy handler, or for a fair waiter one that tries again soon.
//!
//! SQLite's handler (`PRAGMA busy_timeout`) sleeps 1, 2, 5, 10, 15, 20,
//! 25 ms ... between tries: a writer that found the lock taken four times
//! sleeps 10 ms and more while others take it hundreds of times, so across
//! processes the lock goes to whoever happens to be awake, and a fair
//! waiter's queue entry (written under that lock) lands late and out of
//! the order the waiters called in (measured in docs/fairness.md, "SQLite
//! across processes"). This handler tries every [`SHORT_PAUSE`] for the
//! first [`SHORT_FOR`] of a wait, then every [`LONG_PAUSE`], up to the
//! connection's timeout, measured on the monotonic clock (SQLite's own
//! adds up its planned sleeps, which oversleep).
//!
//! The timeout travels in the handler's argument pointer (milliseconds as
//! an address, never dereferenced), so there is nothing to allocate or
//! free per connection; the start of the current wait is the connection
//! thread's own (the handler runs on the thread running the statement, and
//! blocks it, as SQLite's does).

// sqlx has no safe way to set a busy handler: one FFI call and its callback.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::c_void;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use libsqlite3_sys as ffi;
use sqlx::sqlite::SqliteConnection;

use crate::backend::duration_to_millis;

/// The pause between tries early in a wait: a write transaction here takes
/// tens of µs, so a lock is usually free again within this.
const SHORT_PAUSE: Duration = Duration::from_micros(200);
/// How long a wait keeps to [`SHORT_PAUSE`].
const SHORT_FOR: Duration = Duration::from_millis(50);
/// The pause after that: a writer holding the lock this long is slow
/// (a checkpoint, a slow disk), and trying more often only burns CPU.
const LONG_PAUSE: Duration = Duration::from_millis(2);

thread_local! {
    /// When the busy wait now running on this thread began.
    static WAIT_STARTED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How a connection waits for another's write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BusyWait {
    /// SQLite's own handler (`sqlite3_busy_timeout`): for racing attempts,
    /// releases and renewals. Measured in docs/fairness.md: this handler's
    /// long sleeps leave the lock with the process that just released it
    /// more often, which racing waiters' throughput relies on.
    Sqlite,
    /// This module's handler, which tries again soon: for a fair waiter's
    /// attempts, whose queue entry should land in the order they called.
    Prompt,
}

/// Makes `conn` wait up to `timeout` for another connection's lock, as
/// `wait` says. A zero timeout fails at once with `SQLITE_BUSY`, as
/// `PRAGMA busy_timeout = 0` does.
pub(super) async fn set_busy_wait(
    conn: &mut SqliteConnection,
    timeout: Duration,
    wait: BusyWait,
) -> Result<(), sqlx::Error> {
    let millis = duration_to_millis(timeout);
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is the connection's handle, locked by `handle` so the
    // driver's worker does not use it meanwhile. The handler's argument is
    // an integer (milliseconds as an address) the callback never
    // dereferences, and the callback has no other state.
    let rc = unsafe {
        match wait {
            BusyWait::Sqlite => {
                ffi::sqlite3_busy_timeout(db, c_int::try_from(millis).unwrap_or(c_int::MAX))
            }
            // An address is at least 32 bits: a bound of 49 days or more
            // is capped there.
            BusyWait::Prompt => ffi::sqlite3_busy_handler(
                db,
                Some(try_again_soon),
                std::ptr::without_provenance_mut::<c_void>(
                    usize::try_from(millis).unwrap_or(usize::MAX),
                ),
            ),
        }
    };
    if rc != ffi::SQLITE_OK {
        return Err(sqlx::Error::Protocol(format!(
            "could not set the busy handler (SQLite error {rc})"
        )));
    }
    Ok(())
}

/// The busy handler: nonzero to try again, 0 to give up with `SQLITE_BUSY`.
/// `count` is 0 at the first call of each wait.
unsafe extern "C" fn try_again_soon(timeout_ms: *mut c_void, count: c_int) -> c_int {
    let timeout = Duration::from_millis(timeout_ms.addr() as u64);
    let now = Instant::now();
    let started = WAIT_STARTED.with(|started| {
        if count == 0 {
            started.set(Some(now));
        }
        started.get().unwrap_or(now)
    });
    match pause(now.duration_since(started), timeout) {
        Some(pause) => {
            std::thread::sleep(pause);
            1
        }
        None => 0,
    }
}

/// The pause before the next try after `waited` of a wait bounded by
/// `timeout`; `None` once the bound is reached.
fn pause(waited: Duration, timeout: Duration) -> Option<Duration> {
    let left = timeout.checked_sub(waited).filter(|l| !l.is_zero())?;
    let pause = if waited < SHORT_FOR {
        SHORT_PAUSE
    } else {
        LONG_PAUSE
    };
    Some(pause.min(left))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_are_short_early_longer_later_and_never_past_the_timeout() {
        let second = Duration::from_secs(1);
        assert_eq!(pause(Duration::ZERO, second), Some(SHORT_PAUSE));
        assert_eq!(pause(SHORT_FOR, second), Some(LONG_PAUSE));
        assert_eq!(
            pause(second - Duration::from_micros(50), second),
            Some(Duration::from_micros(50))
        );
        assert_eq!(pause(second, second), None);
        assert_eq!(pause(Duration::ZERO, Duration::ZERO), None);
    }
}
