//! The statements of the PostgreSQL store, built once per table name.
//!
//! Every lease operation is one statement. Expiry is always compared with
//! `clock_timestamp()` (the server's wall clock at the moment of the
//! comparison, not the start of the transaction), and durations travel as
//! whole milliseconds.

use super::names::{queue_table, CHANNEL, MAX_IDENT_BYTES, PERMITS_TABLE_SUFFIX};
use super::queue::{self, QueueStatements};
use super::semaphore::PermitStatements;
use super::sweep::{self, FIRST_FENCE};
use crate::error::{Error, Result};

/// Checks `name` as `table` or `schema.table`, each part an unquoted-style
/// SQL identifier (ASCII letter or `_`, then letters, digits, `_`; at most
/// 63 bytes, and the table at most 55, so that the semaphores' table
/// `<table>_permits` still fits: the server would truncate it and two lease
/// tables could then share one), and returns it double-quoted, ready to
/// paste into SQL.
///
/// # Errors
/// [`Error::InvalidInput`] naming what is wrong with the name.
pub fn quote_table_name(name: &str) -> Result<String> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(Error::invalid(
            "table name",
            format!("{name:?} has more than one '.'; use table or schema.table"),
        ));
    }
    for part in &parts {
        check_ident(name, part)?;
    }
    let table = parts[parts.len() - 1];
    let max_table = MAX_IDENT_BYTES - PERMITS_TABLE_SUFFIX.len();
    if table.len() > max_table {
        return Err(Error::invalid(
            "table name",
            format!(
                "{name:?} has a table name of {} bytes; at most {max_table} allowed, \
                 so that `{table}{PERMITS_TABLE_SUFFIX}` fits PostgreSQL's {MAX_IDENT_BYTES}",
                table.len()
            ),
        ));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

fn check_ident(whole: &str, part: &str) -> Result<()> {
    let problem = if part.is_empty() {
        "has an empty part".to_owned()
    } else if part.len() > MAX_IDENT_BYTES {
        format!(
            "has a part of {} bytes; at most {MAX_IDENT_BYTES} allowed",
            part.len()
        )
    } else if part.starts_with(|c: char| c.is_ascii_digit()) {
        "has a part starting with a digit".to_owned()
    } else if let Some(c) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
    {
        format!("contains {c:?}; only ASCII letters, digits and '_' are allowed")
    } else {
        return Ok(());
    };
    Err(Error::invalid("table name", format!("{whole:?} {problem}")))
}

/// Milliseconds left on `expires_at`, rounded up so a waiter never wakes
/// before the lease ends.
macro_rules! remaining_ms {
    () => {
        "ceil(extract(epoch FROM (expires_at - clock_timestamp())) * 1000)::bigint"
    };
}

/// The statements for one lease table.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    pub migrate: String,
    pub acquire: String,
    pub renew: String,
    pub release: String,
    pub release_handing: String,
    pub inspect: String,
    pub list: String,
    pub force_release: String,
    pub check: String,
    /// Wakes every listener of a key, as a release does (`Backend::announce`).
    pub announce: String,
    /// The semaphores' statements (`semaphore.rs`).
    pub permits: PermitStatements,
    /// The reader-writer locks' statements (`semaphore.rs`).
    pub rw: PermitStatements,
    /// The queue of waiters' statements (`queue.rs`).
    pub queue: QueueStatements,
    /// One range of a sweep pass over idle rows (`sweep.rs`).
    pub sweep: String,
}

impl Statements {
    /// `table` must come from [`quote_table_name`].
    pub(super) fn new(table: &str) -> Self {
        let live = "owner IS NOT NULL AND expires_at > clock_timestamp()";
        let queue = queue_table(table);
        Statements {
            migrate: migration(table),
            // One key is one lock: the row is the key's anchor, and a row
            // whose `kind` is set (a reader-writer lock's or a semaphore's
            // key) is never granted as a mutex; the busy branch then names
            // the kind (read from the snapshot: a kind set after it reads
            // as "busy, 0 ms left", and the retry sees it).
            //
            // Grants if the row is new, or free or expired with no live
            // waiter queued ahead of the requester (queue.rs; probed only
            // on a row marked `queued`: OR evaluates left to right, and
            // the probe, a subplan on parameters only, runs when first
            // needed), and returns
            // the new fence; a repeat by the owner that holds it live is
            // the same grant (same fence), its expiry counted from now;
            // otherwise returns the holder and its remaining time, so the
            // busy path is one round trip too. The busy branch reads the
            // statement's snapshot: a row taken by a holder that committed
            // after it reads as free or expired, and the caller runs the
            // queued attempt, which reads the row's latest version (as it
            // does for a free row refused for a queue). No entry of the
            // requester can exist here (a waiter's first attempt comes
            // here, its later ones go to the queued attempt), so a grant
            // has none to remove.
            //
            // Bounded waiting, with no session state (PgBouncer transaction
            // pooling): the insert's source row calls
            // `set_config('lock_timeout', $5, true)`, so the setting is in
            // force before the insert can wait on the row lock of another
            // transaction (a `check_in`'s FOR SHARE, an application's FOR
            // UPDATE) and ends with this statement's implicit transaction.
            // Waiting past $5 ms fails with 55P03, which the backend reports
            // as busy. A `NOWAIT` probe would answer busy at once even while
            // a concurrent acquire or release holds the row for a
            // millisecond; `SET lock_timeout` would be session state.
            //
            // The expiry of a conflicting row is computed in DO UPDATE,
            // after the row lock is taken: computed before the wait (as
            // `excluded.expires_at` is), a grant that waited longer than its
            // ttl would arrive already expired.
            acquire: format!(
                "WITH granted AS ( \
                   INSERT INTO {table} AS l (key, fence, owner, holder, expires_at) \
                   SELECT $1, {first}, $2, $3, clock_timestamp() + $4 * interval '1 millisecond' \
                   FROM (SELECT set_config('lock_timeout', $5, true)) AS bounded \
                   ON CONFLICT (key) DO UPDATE SET fence = CASE WHEN l.owner = excluded.owner \
                       AND l.expires_at > clock_timestamp() THEN l.fence ELSE l.fence + 1 END, \
                     owner = excluded.owner, holder = excluded.holder, \
                     expires_at = clock_timestamp() + $4 * interval '1 millisecond' \
                   WHERE l.kind IS NULL AND ((l.owner = excluded.owner \
                       AND l.expires_at > clock_timestamp()) \
                     OR ((l.owner IS NULL OR l.expires_at <= clock_timestamp()) \
                       AND (NOT l.queued OR {none_ahead}))) \
                   RETURNING l.fence) \
                 SELECT fence, NULL::text AS holder, NULL::bigint AS remaining_ms, \
                   NULL::text AS kind FROM granted \
                 UNION ALL \
                 SELECT NULL::bigint, holder, {rem}, kind FROM {table} \
                  WHERE key = $1 AND NOT EXISTS (SELECT FROM granted)",
                rem = remaining_ms!(),
                first = FIRST_FENCE,
                none_ahead = queue::none_queued_ahead(&queue),
            ),
            // $5 bounds the wait for another transaction's row lock (a
            // `check_in`) like the acquire's: the guard gives a renewal
            // attempt up after a while and retries on another connection,
            // and the server must give the abandoned statement up too, or
            // every retry would pin one more pooled connection.
            renew: format!(
                "UPDATE {table} SET expires_at = clock_timestamp() + $4 * interval '1 millisecond' \
                 FROM (SELECT set_config('lock_timeout', $5, true)) AS bounded \
                 WHERE key = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()"
            ),
            // The notification is queued in the same statement, so it is
            // sent exactly when (and only if) the release commits. Frees
            // the key only while no live waiter is queued for it (one
            // probe of the queue's index, on a row marked `queued` only:
            // the plain release stays as cheap as before queues), and
            // clears the mark; otherwise changes nothing, and the caller
            // runs `release_handing`. Returns the key if freed.
            release: format!(
                "WITH freed AS ( \
                   UPDATE {table} SET owner = NULL, holder = NULL, \
                     expires_at = least(expires_at, clock_timestamp()), queued = false \
                   WHERE key = $1 AND owner = $2 AND fence = $3 \
                     AND (NOT queued OR NOT EXISTS (SELECT FROM {queue} AS q \
                       WHERE q.key = $1 AND q.expires_at > clock_timestamp())) \
                   RETURNING key) \
                 SELECT pg_notify('{CHANNEL}', key)::text FROM freed"
            ),
            // The release of a key with a queue (queue.rs), in the same
            // way: with a live head the key is handed to it instead of
            // freed (the next fence, the head's label, its claim window),
            // its entry goes, and only it is told; with none (the queue
            // emptied meanwhile) it is freed as by `release`. The row
            // stays marked `queued` while other live entries are left.
            // Returns the
            // new owner (NULL: freed), the fence and the head's ticket.
            // Measured: this statement in place of `release` for every
            // release cost about 20 µs more server time per release.
            release_handing: format!(
                "WITH {head}, \
                 freed AS ( \
                   UPDATE {table} SET owner = (SELECT owner FROM head), \
                     holder = (SELECT holder FROM head), \
                     fence = fence + (SELECT count(*) FROM head), \
                     expires_at = coalesce(clock_timestamp() \
                       + (SELECT claim_ms FROM head) * interval '1 millisecond', \
                       least(expires_at, clock_timestamp())), \
                     queued = EXISTS (SELECT FROM {queue} AS q WHERE q.key = $1 \
                       AND q.expires_at > clock_timestamp() \
                       AND q.owner IS DISTINCT FROM (SELECT owner FROM head)) \
                   WHERE key = $1 AND owner = $2 AND fence = $3 \
                   RETURNING key, owner, fence, (SELECT ticket FROM head) AS ticket), \
                 left_queue AS (DELETE FROM {queue} AS q USING freed AS f \
                   WHERE q.key = $1 AND q.owner = f.owner) \
                 SELECT f.owner, f.fence, f.ticket, pg_notify('{CHANNEL}', \
                   CASE WHEN f.owner IS NULL THEN f.key ELSE {payload} END)::text \
                 FROM freed AS f",
                head = queue::head_cte(&queue),
                payload = queue::hand_off_payload("f"),
            ),
            inspect: format!(
                "SELECT key, owner, holder, fence, {rem} FROM {table} WHERE key = $1 AND {live}",
                rem = remaining_ms!()
            ),
            // starts_with, not LIKE: '%' and '_' in a prefix are plain text.
            list: format!(
                "SELECT key, owner, holder, fence, {rem} FROM {table} \
                 WHERE starts_with(key, $1) AND {live} ORDER BY key",
                rem = remaining_ms!()
            ),
            // The CTE locks the row and reads whether it was live before the
            // update bumps the fence; RETURNING cannot see old values.
            announce: format!("SELECT pg_notify('{CHANNEL}', $1::text)"),
            // A key of another kind (`kind` set) is broken by the
            // permits' statement of its kind instead (`semaphore.rs`):
            // this one answers its kind. The row keeps the time its holder
            // left, as a release does, so the sweep counts its idle window
            // from then (NULL reads as idle since -infinity).
            force_release: format!(
                "WITH old AS ( \
                   SELECT key, {live} AS was_live, kind FROM {table} WHERE key = $1 FOR UPDATE), \
                 broken AS ( \
                   UPDATE {table} AS l SET owner = NULL, holder = NULL, \
                     expires_at = least(coalesce(l.expires_at, clock_timestamp()), clock_timestamp()), \
                     fence = l.fence + 1 \
                   FROM old WHERE l.key = old.key AND old.kind IS NULL \
                   RETURNING l.key, old.was_live) \
                 SELECT was_live, pg_notify('{CHANNEL}', key)::text, NULL::text FROM broken \
                 UNION ALL SELECT false, NULL::text, kind FROM old WHERE kind IS NOT NULL"
            ),
            // FOR SHARE conflicts with the row lock every acquire, renew,
            // release and force-release takes, so none of them can change
            // this row until the caller's transaction ends.
            permits: PermitStatements::new(table),
            rw: PermitStatements::rw(table),
            queue: QueueStatements::new(table),
            sweep: sweep::range_statement(table),
            check: format!(
                "SELECT fence FROM {table} WHERE key = $1 AND owner = $2 AND fence = $3 \
                 AND expires_at > clock_timestamp() FOR SHARE"
            ),
        }
    }
}

/// The idempotent migration for `table` (already quoted): one statement.
fn migration(table: &str) -> String {
    // COLLATE "C": keys compare and sort bytewise, like every other store.
    // The row of an idle mutex key is deleted by a sweep (sweep.rs); a new
    // row's fence starts at the clock, above every fence the key ever had.
    // `kind` (one key is one lock: NULL a mutex, 'rw', 'sem') came later:
    // a table made before it gets the column, every row staying a mutex.
    // `queued` came later still: true while the key may have live waiters
    // in the queue table (queue.rs), so that the acquire and release of a
    // key nobody queues for never read that table; its constant default
    // makes the ALTER a change of the catalog only.
    // The catalog is read first, so an open of an up-to-date table takes
    // no ACCESS EXCLUSIVE lock (an ALTER would, even one with IF NOT
    // EXISTS, and queue every lock operation behind a running transaction).
    // The DO block's body is a string literal in single quotes (no `$`:
    // statements are inlined for a transaction pooler, see exec.rs), so
    // its own literal doubles them. Table names cannot contain quotes.
    format!(
        "DO ' BEGIN \
           CREATE TABLE IF NOT EXISTS {table} ( \
             key TEXT COLLATE \"C\" PRIMARY KEY, \
             fence BIGINT NOT NULL, \
             owner TEXT, \
             holder TEXT, \
             expires_at TIMESTAMPTZ, \
             kind TEXT, \
             queued BOOLEAN NOT NULL DEFAULT false); \
           IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = ''{table}''::regclass \
               AND attname = ''kind'' AND NOT attisdropped) THEN \
             ALTER TABLE {table} ADD COLUMN kind TEXT; \
           END IF; \
           IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = ''{table}''::regclass \
               AND attname = ''queued'' AND NOT attisdropped) THEN \
             ALTER TABLE {table} ADD COLUMN queued BOOLEAN NOT NULL DEFAULT false; \
           END IF; \
         END '"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_validated_and_quoted() {
        assert_eq!(quote_table_name("locks").unwrap(), "\"locks\"");
        assert_eq!(
            quote_table_name("app.Locks_2").unwrap(),
            "\"app\".\"Locks_2\""
        );
        for (bad, why) in [
            ("", "empty part"),
            ("a.b.c", "more than one '.'"),
            ("x\"; DROP TABLE y; --", "contains '\"'"),
            ("1abc", "starting with a digit"),
            ("a b", "contains ' '"),
            ("schema.", "empty part"),
            ("lé", "contains 'é'"),
        ] {
            let e = quote_table_name(bad).unwrap_err().to_string();
            assert!(e.starts_with("invalid table name: "), "{e}");
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        // A schema may use all 63 bytes; a table leaves room for the
        // semaphores' `_permits` table.
        assert!(quote_table_name(&format!("{}.t", "s".repeat(63))).is_ok());
        assert!(quote_table_name(&"t".repeat(55)).is_ok());
        let e = quote_table_name(&"t".repeat(56)).unwrap_err().to_string();
        assert!(e.contains("56 bytes; at most 55"), "{e}");
        assert!(quote_table_name(&"t".repeat(64))
            .unwrap_err()
            .to_string()
            .contains("64 bytes"));
    }

    #[test]
    fn the_longest_table_name_keeps_its_permits_table_distinct() {
        let table = "t".repeat(55);
        let permits = super::super::names::permits_table(&quote_table_name(&table).unwrap());
        let unquoted = permits.trim_matches('"');
        assert_eq!(unquoted.len(), MAX_IDENT_BYTES);
        assert_eq!(unquoted, format!("{table}{PERMITS_TABLE_SUFFIX}"));
    }
}
