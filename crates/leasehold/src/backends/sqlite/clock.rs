//! The store's clock: the milliseconds every statement compares expiry
//! times with, on a clock that does not step.
//!
//! SQLite has no server: its clock is the host's, read by each process that
//! opens the file. Reading the wall clock (`unixepoch`) made a forward step
//! of the host's time (a manual `date -s`, an NTP step) free every lease
//! early at the store while its holder, counting on `CLOCK_BOOTTIME`, still
//! held it. Every process on one host shares the boot clock, so the store
//! reads that instead: `now = epoch_at_boot + CLOCK_BOOTTIME`, where
//! `epoch_at_boot` is the wall clock minus the boot clock, taken once per
//! boot by the first process that opens the file and kept in
//! `leasehold_clock` with the kernel's boot id. Later processes of the same
//! boot read the stored anchor, so they all count on one clock, which a wall
//! clock step no longer moves; the values stay milliseconds since the Unix
//! epoch (off by whatever steps happened since the boot), so files written
//! by an earlier version keep their meaning.
//!
//! After a reboot the boot clock starts again from zero: the first open on
//! the new boot stores a new anchor and ends every lease of the previous
//! boot (their holders died with it), whatever the wall clock did across the
//! reboot.
//!
//! The clock is a SQL function (`leasehold_now_ms()`), registered on every
//! connection, so each statement still reads the time once it holds the
//! write lock (see docs/architecture.md, "No guard is born lost"). Where the
//! kernel gives no boot id (not Linux), the function reads the wall clock,
//! as `unixepoch` did.

// sqlx has no safe way to register a SQL function: one FFI call and its
// two callbacks (with busy_wait.rs, the crate's only unsafe code).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use libsqlite3_sys as ffi;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::Connection;

use crate::time::boot_time;

/// The SQL name of the clock.
macro_rules! now_ms {
    () => {
        "leasehold_now_ms()"
    };
}

/// Creates the anchor table; safe to run any number of times.
const CREATE: &str = "CREATE TABLE IF NOT EXISTS leasehold_clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    boot_id TEXT NOT NULL,
    epoch_at_boot_ms INTEGER NOT NULL
)";

/// The tables whose rows carry an expiry, ended on a new boot.
const LEASE_TABLES: [&str; 4] = [
    "leasehold_locks",
    "leasehold_permits",
    "leasehold_rw_slots",
    "leasehold_rw_marks",
];

/// The clock of one backend's connections: its anchor once the file's has
/// been read (0 until then, and where there is no boot id: the wall clock).
#[derive(Clone, Debug, Default)]
pub(super) struct StoreClock {
    epoch_at_boot_ms: Arc<AtomicI64>,
}

impl StoreClock {
    /// Milliseconds since the Unix epoch, on the anchored boot clock.
    pub(super) fn now_ms(&self) -> i64 {
        match self.epoch_at_boot_ms.load(Ordering::Relaxed) {
            0 => wall_ms(),
            anchor => anchor + boot_ms(),
        }
    }

    /// Registers `leasehold_now_ms()` on a new connection.
    pub(super) async fn register(&self, conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        let mut handle = conn.lock_handle().await?;
        let db = handle.as_raw_handle().as_ptr();
        let data = Box::into_raw(Box::new(self.clone())).cast::<c_void>();
        // SAFETY: `db` is the connection's handle, locked by `handle` so the
        // driver's worker does not use it meanwhile; the name is a C string
        // literal; `data` is a leaked `Box<StoreClock>` that SQLite passes to
        // `now_ms_fn` and frees with `drop_clock` when the function is
        // replaced, the connection closes, or registration fails.
        let rc = unsafe {
            ffi::sqlite3_create_function_v2(
                db,
                c"leasehold_now_ms".as_ptr(),
                0,
                // Not SQLITE_DETERMINISTIC: each call reads the time.
                ffi::SQLITE_UTF8,
                data,
                Some(now_ms_fn),
                None,
                None,
                Some(drop_clock),
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(sqlx::Error::Protocol(format!(
                "could not register leasehold_now_ms() (SQLite error {rc})"
            )));
        }
        Ok(())
    }

    /// Reads the file's anchor for this boot, storing a new one (and ending
    /// the previous boot's leases) if the boot changed. Runs after the
    /// tables exist, in one write transaction, so that processes opening
    /// the file together agree on one anchor.
    pub(super) async fn anchor(&self, pool: &SqlitePool) -> Result<(), sqlx::Error> {
        let Some(boot) = boot_id() else {
            return Ok(());
        };
        let mut conn = pool.acquire().await?;
        sqlx::query(CREATE).execute(&mut *conn).await?;
        // IMMEDIATE: the write lock before the read, so two processes of a
        // new boot cannot both see the old anchor and both reset.
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let stored: Option<(String, i64)> =
            sqlx::query_as("SELECT boot_id, epoch_at_boot_ms FROM leasehold_clock WHERE id = 1")
                .fetch_optional(&mut *tx)
                .await?;
        let anchor = match stored {
            Some((stored_boot, anchor)) if stored_boot == boot => anchor,
            previous => {
                let anchor = wall_ms() - boot_ms();
                if previous.is_some() {
                    let now = anchor + boot_ms();
                    for table in LEASE_TABLES {
                        let end = format!(
                            "UPDATE {table} SET expires_at_ms = ?1 WHERE expires_at_ms > ?1"
                        );
                        sqlx::query(&end).bind(now).execute(&mut *tx).await?;
                    }
                }
                sqlx::query(
                    "INSERT OR REPLACE INTO leasehold_clock (id, boot_id, epoch_at_boot_ms) \
                     VALUES (1, ?1, ?2)",
                )
                .bind(&boot)
                .bind(anchor)
                .execute(&mut *tx)
                .await?;
                anchor
            }
        };
        tx.commit().await?;
        // 0 means "not anchored"; an anchor of exactly 0 (a host whose wall
        // clock read its boot time as the epoch) is off by a millisecond.
        self.epoch_at_boot_ms
            .store(if anchor == 0 { 1 } else { anchor }, Ordering::Relaxed);
        Ok(())
    }
}

/// The kernel's id of this boot, new at every boot (Linux).
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_owned())
}

fn wall_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

fn boot_ms() -> i64 {
    i64::try_from(boot_time().as_millis()).unwrap_or(i64::MAX)
}

/// `leasehold_now_ms()`.
unsafe extern "C" fn now_ms_fn(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    _argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: the user data is the `StoreClock` boxed in `register`, alive
    // until `drop_clock`, which SQLite calls only after the last use.
    let clock = unsafe { &*ffi::sqlite3_user_data(ctx).cast::<StoreClock>() };
    // SAFETY: `ctx` is the context SQLite passed to this call.
    unsafe { ffi::sqlite3_result_int64(ctx, clock.now_ms()) };
}

/// Frees the clock boxed in `register`.
unsafe extern "C" fn drop_clock(data: *mut c_void) {
    // SAFETY: `data` came from `Box::into_raw` in `register`; SQLite calls
    // this once.
    drop(unsafe { Box::from_raw(data.cast::<StoreClock>()) });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::sqlite::SqliteBackend;
    use crate::lock::Locks;

    /// A reboot (here: the stored boot id of another boot) ends every lease
    /// of the previous boot, mutex and permit alike: the boot clock started
    /// again, so their expiry times mean nothing on the new one.
    #[tokio::test]
    async fn a_new_boot_ends_the_previous_boots_leases() {
        if boot_id().is_none() {
            return; // No boot id here: the store reads the wall clock.
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.db");
        let before = SqliteBackend::open(&path).await.unwrap();
        let old_boot = Locks::new(before.clone());
        let held = old_boot.try_acquire("k").await.unwrap();
        let permit = old_boot
            .semaphore("s", 1)
            .unwrap()
            .try_acquire()
            .await
            .unwrap();
        sqlx::query("UPDATE leasehold_clock SET boot_id = 'an-earlier-boot'")
            .execute(before.pool())
            .await
            .unwrap();

        let new_boot = Locks::new(SqliteBackend::open(&path).await.unwrap());
        let taken = new_boot
            .try_acquire("k")
            .await
            .expect("the old lease ended");
        assert!(taken.token() > held.token());
        let permit_now = new_boot
            .semaphore("s", 1)
            .unwrap()
            .try_acquire()
            .await
            .expect("the old permit ended");
        drop((held, permit, taken, permit_now));
    }

    /// A process that opens the file later counts on the anchor stored for
    /// this boot, not on its own reading of the wall clock: here the stored
    /// anchor is an hour earlier than the wall clock gives, as if the wall
    /// clock had been stepped an hour forward since the first open.
    #[tokio::test]
    async fn later_opens_count_on_the_stored_anchor() {
        if boot_id().is_none() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.db");
        let first = SqliteBackend::open(&path).await.unwrap();
        sqlx::query("UPDATE leasehold_clock SET epoch_at_boot_ms = epoch_at_boot_ms - 3600000")
            .execute(first.pool())
            .await
            .unwrap();

        let later = SqliteBackend::open(&path).await.unwrap();
        let (now,): (i64,) = sqlx::query_as("SELECT leasehold_now_ms()")
            .fetch_one(later.pool())
            .await
            .unwrap();
        let behind = wall_ms() - now;
        assert!(
            (3_599_000..3_601_000).contains(&behind),
            "the later open's clock is {behind} ms behind the wall clock, not the stored hour"
        );
    }
}
