//! The names the PostgreSQL store gives its objects in SQL: the default
//! table, the notification channel, and what the semaphores' and reader-
//! writer locks' tables append to the lease table's name. Apart from the
//! statements, so that every module that spells one reads it here.

/// The table used when none is configured.
pub const DEFAULT_TABLE: &str = "leasehold_locks";

/// The one channel every release is announced on; the payload is the key.
/// Constant so that one `LISTEN` serves every key (keys are at most 256
/// bytes, far below the 8000-byte payload limit).
pub const CHANNEL: &str = "leasehold_release";

/// Longest identifier PostgreSQL keeps (NAMEDATALEN - 1); a longer one is
/// silently truncated by the server.
pub(super) const MAX_IDENT_BYTES: usize = 63;

/// What the semaphores' table appends to the lease table's name (see
/// [`permits_table`]); the table name's bound leaves room for it.
pub(super) const PERMITS_TABLE_SUFFIX: &str = "_permits";

/// What the reader-writer locks' table appends: shorter than the permits
/// table's suffix, so the same bound covers it.
pub(super) const RW_TABLE_SUFFIX: &str = "_rw";

/// `"schema"."table"` (quoted) → `"schema"."table_permits"`.
pub(super) fn permits_table(table: &str) -> String {
    beside(table, PERMITS_TABLE_SUFFIX)
}

/// `"schema"."table"` (quoted) → `"schema"."table_rw"`: shorter than the
/// permits table's suffix, so the table name's bound leaves room for it.
pub(super) fn rw_table(table: &str) -> String {
    beside(table, RW_TABLE_SUFFIX)
}

/// What the queue of waiters' table appends (issue 31, `queue.rs`):
/// shorter than the permits table's suffix, so the same bound covers it.
pub(super) const QUEUE_TABLE_SUFFIX: &str = "_queue";

/// `"schema"."table"` (quoted) → `"schema"."table_queue"`.
pub(super) fn queue_table(table: &str) -> String {
    beside(table, QUEUE_TABLE_SUFFIX)
}

/// `"schema"."table"` (quoted) → `"schema"."table<suffix>"`.
fn beside(table: &str, suffix: &str) -> String {
    let unquoted_end = table.len() - 1;
    format!("{}{suffix}\"", &table[..unquoted_end])
}
