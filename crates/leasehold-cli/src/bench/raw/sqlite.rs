//! SQLite: the two statements a careful hand-written lock issues (the
//! library's, written again here), on a connection set up as the library
//! sets up its own, in a table of the baseline's own.
use std::time::Duration;

use leasehold::Locks;

use super::statements::TwoStatements;
use super::{baseline_error as driver, Measured};
use crate::exit::CliError;
use crate::sql::{BusyTimeout, SqlDb};

/// The store's clock in milliseconds since the Unix epoch.
macro_rules! now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS leasehold_bench_baseline (
    key TEXT PRIMARY KEY NOT NULL,
    fence INTEGER NOT NULL,
    owner TEXT,
    holder TEXT,
    expires_at_ms INTEGER
) WITHOUT ROWID";

/// Takes the key if it is new, free or expired and returns the new fence.
/// Parameters: key, owner, holder, ttl in ms.
const ACQUIRE: &str = concat!(
    "INSERT INTO leasehold_bench_baseline (key, fence, owner, holder, expires_at_ms) \
     VALUES ($1, 1, $2, $3, ",
    now_ms!(),
    " + $4) ON CONFLICT (key) DO UPDATE SET fence = fence + 1, owner = excluded.owner, \
     holder = excluded.holder, expires_at_ms = excluded.expires_at_ms \
     WHERE owner IS NULL OR expires_at_ms <= ",
    now_ms!(),
    " RETURNING fence"
);

/// Frees the key if owner and fence still match. Parameters: key, owner, fence.
const RELEASE: &str = "UPDATE leasehold_bench_baseline \
     SET owner = NULL, holder = NULL, expires_at_ms = NULL \
     WHERE key = $1 AND owner = $2 AND fence = $3";

pub async fn open(url: &str) -> Result<Measured, CliError> {
    let locks = Locks::open(url).await?;
    // The library's busy timeout: a statement waits as long for the file.
    let busy = BusyTimeout(Duration::from_secs(5));
    let db = SqlDb::open(url, "baseline", busy)
        .await?
        .ok_or_else(|| CliError::usage("the SQLite baseline needs an sqlite:// URL"))?;
    db.execute(CREATE_TABLE, &[]).await.map_err(driver)?;
    Ok(Measured::with_baseline(
        locks,
        TwoStatements {
            name: "two sqlite statements by hand",
            db,
            acquire: ACQUIRE,
            release: RELEASE,
            lock_wait: None,
        },
    ))
}
