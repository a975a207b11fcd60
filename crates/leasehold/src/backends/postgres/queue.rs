//! The queue of waiters per key on PostgreSQL (the trait's `# Contract`,
//! issue 31): a table of entries beside the lease table (`<table>_queue`),
//! and the one statement that enters it or hands a free key to its head.
//!
//! The uncontended path stays one statement each way: the acquire grants
//! only if no live entry is queued ahead of the requester (one probe of
//! the queue's index, and only when the row is free), and removes the
//! requester's own entry with the grant; the release frees a key with no
//! live entry (one probe) and refuses otherwise, and then the hand-off
//! statement hands the key to the live head (sql.rs). A key whose last
//! release here handed over goes to the hand-off statement at once
//! ([`HandOffHints`]): under contention the queue is seldom empty, and the
//! plain statement's refusal was a round trip spent for nothing. Only an
//! attempt the acquire
//! refused and that queues, or that found the key free behind a queue, runs
//! the queued attempt here; a waiter's later attempts go to it directly.
//!
//! **Concurrency.** The queued attempt locks the key's row first (`FOR
//! UPDATE` reads its latest committed version), so it decides on the same
//! row as every grant, renewal and release: mutual exclusion rests on that
//! row alone, as before. The queue is read on the statement's snapshot; an
//! entry written by a transaction that commits while the statement waits
//! for the row is missed, which costs order, never safety:
//! - a release that misses a new entry frees the key and, having handed
//!   it to nobody, wakes every waiter of the key (a queued waiter
//!   subscribes before its attempt), and the next attempt hands the key to
//!   the head;
//! - a hand-off to a head that left meanwhile is a grant nobody claims: it
//!   lapses after the head's claim window (at most the entry's lease).
//!
//! Order is the entries' `seq`, an identity column: the order in which the
//! waiters' first busy attempts reached the server.

use std::collections::HashSet;
use std::sync::Mutex;

use sqlx::postgres::PgRow;
use sqlx::Row;

use super::exec::Param;
use super::names::{queue_table, CHANNEL};
use super::{classify, is_lock_not_available, row_locked, Failed, Inner, STORE};
use crate::backend::{
    duration_to_millis, millis_to_duration, Acquire, AcquireRequest, Busy, OwnerId, RecordDecoder,
};
use crate::error::Result;
use crate::key::Key;

/// The keys whose last release in this process handed the key over to a
/// waiter: their next release runs the hand-off statement at once. A hint,
/// never a promise: a hinted key whose queue has emptied is freed by the
/// hand-off statement too (it costs about 20 µs more server time than the
/// plain one) and loses its hint; an unhinted key with a queue is refused
/// by the plain statement and then handed over, as without hints.
#[derive(Debug, Default)]
pub(super) struct HandOffHints {
    keys: Mutex<HashSet<Box<str>>>,
}

/// How many keys the hints remember. Past it they start again empty: a
/// process handing over more keys than this at once loses one round trip
/// per key, once, and memory stays bounded however many keys it locks.
const HINTED_KEYS_MAX: usize = 1024;

impl HandOffHints {
    /// Whether `key`'s last release here handed it over.
    pub(super) fn expects_queue(&self, key: &str) -> bool {
        self.keys.lock().is_ok_and(|keys| keys.contains(key))
    }

    /// Records whether `key`'s release just now handed it over.
    pub(super) fn note(&self, key: &str, handed_over: bool) {
        // A poisoned lock only loses hints.
        let Ok(mut keys) = self.keys.lock() else {
            return;
        };
        if !handed_over {
            keys.remove(key);
            return;
        }
        if keys.len() >= HINTED_KEYS_MAX && !keys.contains(key) {
            keys.clear();
        }
        keys.insert(key.into());
    }
}

/// The queue's statements for one lease table.
#[derive(Debug, Clone)]
pub(super) struct QueueStatements {
    pub migrate: String,
    /// The queued attempt (see [`Inner::queued_attempt`]).
    attempt: String,
    /// $1 key, $2 owner: removes the entry and answers the fence of a live
    /// grant to that owner (handed over to it), if any.
    leave: String,
}

impl QueueStatements {
    /// `table` must come from `quote_table_name`.
    pub(super) fn new(table: &str) -> Self {
        let queue = queue_table(table);
        QueueStatements {
            // Two unique indexes, both named by the server (a name made
            // from the table's could pass the 63-byte limit): the order of
            // a key's entries, and one entry per owner.
            migrate: format!(
                "CREATE TABLE IF NOT EXISTS {queue} ( \
                   key TEXT COLLATE \"C\" NOT NULL, \
                   seq BIGINT GENERATED ALWAYS AS IDENTITY, \
                   owner TEXT NOT NULL, \
                   holder TEXT NOT NULL, \
                   claim_ms BIGINT NOT NULL, \
                   ticket BIGINT NOT NULL, \
                   expires_at TIMESTAMPTZ NOT NULL, \
                   PRIMARY KEY (key, seq), \
                   UNIQUE (key, owner))"
            ),
            attempt: attempt(table, &queue),
            leave: format!(
                "WITH gone AS (DELETE FROM {queue} WHERE key = $1 AND owner = $2) \
                 SELECT fence FROM {table} \
                 WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()"
            ),
        }
    }
}

/// `NOT EXISTS` a live entry of another owner queued ahead of owner $2 for
/// key $1 (ahead of everyone, if $2 has no live entry): the acquire's
/// condition for a free row.
pub(super) fn none_queued_ahead(queue: &str) -> String {
    format!(
        "NOT EXISTS (SELECT FROM {queue} AS q WHERE q.key = $1 AND q.owner <> $2 \
           AND q.expires_at > clock_timestamp() \
           AND q.seq < coalesce((SELECT m.seq FROM {queue} AS m WHERE m.key = $1 \
             AND m.owner = $2 AND m.expires_at > clock_timestamp()), 9223372036854775807))"
    )
}

/// The CTE `head`: key $1's live head (owner, holder, claim window in ms,
/// ticket), or no row.
pub(super) fn head_cte(queue: &str) -> String {
    format!(
        "head AS (SELECT q.owner, q.holder, q.claim_ms, q.ticket FROM {queue} AS q \
           WHERE q.key = $1 AND q.expires_at > clock_timestamp() ORDER BY q.seq LIMIT 1)"
    )
}

/// The hand-off message of the grant in CTE row `g` (columns `owner`,
/// `fence`, `ticket`) of key $1, as `notify::hand_off_message` writes it.
pub(super) fn hand_off_payload(g: &str) -> String {
    format!("chr(1) || {g}.owner || ' ' || {g}.fence || ' ' || {g}.ticket || ' ' || $1::text")
}

/// The queued attempt, one statement. $1 key, $2 owner, $3 holder, $4 ttl
/// ms, $5 the row-lock wait in ms (text, as the acquire's), $6 claim
/// window ms, $7 ticket, $8 the entry's lease in ms (0: the request does
/// not queue).
///
/// `row` locks the key's row and reads it; `target` says whom a grant goes
/// to: for a free mutex key, the live head if it is not the requester,
/// else the requester; for a key the requester holds live, the requester
/// (a repeat: same fence, expiry from now); nobody for a busy key or one
/// of another kind. `granted` writes the grant and `left_queue` removes the
/// grantee's entry; `dead` clears the key's dead entries; `entered` enters
/// the requester (or renews its entry and ticket in place) unless it was
/// granted. The head of a hand-off is notified by the row returned.
///
/// The row's `queued` mark (sql.rs, the migration) is written by whichever
/// of `granted` and `marked` runs (never both: `marked` runs only without
/// a target), under the row lock `row` took: true while live entries are
/// left besides the grantee, or the requester enters. Every statement that
/// clears it holds that row lock too, so an entry entered here is never
/// left unmarked by a clear that saw it; one a clear missed (entered while
/// the clear waited for the row, which reads the queue on its snapshot)
/// costs order until that waiter's next attempt marks the row again, never
/// safety.
///
/// Returns one row when the key has a row (none otherwise: the acquire
/// creates it): the grant's fence, owner, holder, ms left and ticket (all
/// NULL with no grant), then the key's kind, its live holder and ms left.
fn attempt(table: &str, queue: &str) -> String {
    let ms = "* interval '1 millisecond'";
    let left =
        |at: &str| format!("ceil(extract(epoch FROM ({at} - clock_timestamp())) * 1000)::bigint");
    format!(
        "WITH row AS ( \
           SELECT l.kind, l.owner, l.holder, l.expires_at, \
             (l.owner IS NOT NULL AND l.expires_at > clock_timestamp()) AS live \
           FROM {table} AS l, (SELECT set_config('lock_timeout', $5::text, true)) AS bounded \
           WHERE l.key = $1 FOR UPDATE OF l), \
         {head}, \
         target AS ( \
           SELECT r.live, h.owner AS head, h.holder, h.claim_ms, h.ticket \
           FROM row AS r LEFT JOIN head AS h ON NOT r.live AND h.owner <> $2 \
           WHERE r.kind IS NULL AND (NOT r.live OR r.owner = $2)), \
         granted AS ( \
           UPDATE {table} AS l SET \
             fence = CASE WHEN t.live THEN l.fence ELSE l.fence + 1 END, \
             owner = coalesce(t.head, $2), holder = coalesce(t.holder, $3), \
             expires_at = clock_timestamp() + coalesce(t.claim_ms, $4) {ms}, \
             queued = ($8 > 0 AND t.head IS NOT NULL) \
               OR EXISTS (SELECT FROM {queue} AS q WHERE q.key = $1 \
                 AND q.expires_at > clock_timestamp() AND q.owner <> coalesce(t.head, $2)) \
           FROM target AS t WHERE l.key = $1 \
           RETURNING l.fence, l.owner, l.holder, l.expires_at, t.ticket), \
         marked AS ( \
           UPDATE {table} AS l SET queued = true FROM row AS r \
           WHERE l.key = $1 AND $8 > 0 AND r.kind IS NULL AND NOT l.queued \
             AND NOT EXISTS (SELECT FROM target)), \
         left_queue AS ( \
           DELETE FROM {queue} AS q USING granted AS g WHERE q.key = $1 AND q.owner = g.owner), \
         dead AS ( \
           DELETE FROM {queue} AS q \
           WHERE q.key = $1 AND q.owner <> $2 AND q.expires_at <= clock_timestamp()), \
         entered AS ( \
           INSERT INTO {queue} AS q (key, owner, holder, claim_ms, ticket, expires_at) \
           SELECT $1, $2, $3, $6, $7, clock_timestamp() + $8 {ms} FROM row AS r \
           WHERE $8 > 0 AND r.kind IS NULL \
             AND NOT EXISTS (SELECT FROM granted AS g WHERE g.owner = $2) \
           ON CONFLICT (key, owner) DO UPDATE \
             SET ticket = excluded.ticket, expires_at = excluded.expires_at) \
         SELECT g.fence, g.owner, g.holder, {g_left}, g.ticket, \
           r.kind, CASE WHEN r.live THEN r.holder END, {r_left}, \
           CASE WHEN g.owner <> $2 THEN pg_notify('{CHANNEL}', {payload})::text END \
         FROM row AS r LEFT JOIN granted AS g ON true",
        head = head_cte(queue),
        g_left = left("g.expires_at"),
        r_left = left("r.expires_at"),
        payload = hand_off_payload("g"),
    )
}

/// What a queued attempt's row says.
struct Attempted {
    /// The grant it made: fence, owner, holder, ms left, ticket.
    grant: Option<(i64, String, String, i64, Option<i64>)>,
    kind: Option<String>,
    holder: Option<String>,
    remaining: Option<i64>,
}

impl Attempted {
    fn read(row: &PgRow) -> std::result::Result<Self, sqlx::Error> {
        let fence: Option<i64> = row.try_get(0)?;
        let grant = match fence {
            Some(fence) => Some((
                fence,
                row.try_get(1)?,
                row.try_get(2)?,
                row.try_get::<Option<i64>, _>(3)?.unwrap_or(0),
                row.try_get(4)?,
            )),
            None => None,
        };
        Ok(Attempted {
            grant,
            kind: row.try_get(5)?,
            holder: row.try_get(6)?,
            remaining: row.try_get(7)?,
        })
    }
}

impl Inner {
    /// The queued attempt ([`attempt`]): a free key goes to the live head
    /// (and the requester enters or renews its entry, if it queues), or to
    /// the requester if it is the head or nobody is queued; a held key
    /// leaves the requester queued. `None` when the key has no row yet.
    pub(super) async fn queued_attempt(&self, req: &AcquireRequest) -> Result<Option<Acquire>> {
        let key = req.key().as_str();
        let owner = req.owner().to_string();
        let lock_wait = duration_to_millis(self.row_lock_wait(req.lock_wait())).to_string();
        let (entry_ms, ticket) = match (req.queue_entry_ttl(), req.queue_ticket()) {
            (Some(ttl), Some(ticket)) => (duration_to_millis(ttl), i64::from(ticket)),
            _ => (0, 0),
        };
        let params = [
            Param::Text(key),
            Param::Text(&owner),
            Param::Text(req.holder()),
            Param::Int(duration_to_millis(req.ttl())),
            Param::Text(&lock_wait),
            Param::Int(duration_to_millis(req.claim_window())),
            Param::Int(ticket),
            Param::Int(entry_ms),
        ];
        let rows = match self.fetch_all(&self.sql.queue.attempt, &params).await {
            Ok(rows) => rows,
            Err(Failed::Sql(e)) if is_lock_not_available(&e) => return Ok(Some(row_locked())),
            Err(e) => return Err(e.into_error()),
        };
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let answer = Attempted::read(row).map_err(classify)?;
        let record = RecordDecoder::new(STORE, key);
        if let Some((fence, to, label, left_ms, ticket)) = answer.grant {
            if to == owner {
                return Ok(Some(Acquire::Granted(req.granted(record.token(fence)?))));
            }
            // Handed over to the head: tell it here at once if it waits
            // in this process (the notification follows from the server).
            let (head, grant) = record.hand_off(&to, fence, ticket)?;
            self.hand_over_local(req.key(), head, grant);
            return Ok(Some(Acquire::Busy(Busy {
                holder: label,
                remaining: millis_to_duration(left_ms),
            })));
        }
        if let Some(kind) = answer.kind {
            return Ok(Some(Acquire::OtherKind(super::decode_kind(
                &record, &kind,
            )?)));
        }
        Ok(Some(Acquire::Busy(Busy {
            holder: answer.holder.unwrap_or_default(),
            remaining: millis_to_duration(answer.remaining.unwrap_or(0)),
        })))
    }

    /// [`Backend::leave_queue`](crate::backend::Backend::leave_queue): the
    /// entry goes, and a grant handed over to `owner` that it still holds
    /// is released (and handed on) by the release statement.
    pub(super) async fn leave_queue(
        self: &std::sync::Arc<Self>,
        key: &Key,
        owner: OwnerId,
    ) -> Result<()> {
        let owner = owner.to_string();
        let held = self
            .fetch_optional(
                &self.sql.queue.leave,
                &[Param::Text(key.as_str()), Param::Text(&owner)],
            )
            .await?;
        match held {
            Some(row) => {
                let fence: i64 = row.try_get(0).map_err(classify)?;
                self.release_mutex(key, &owner, fence).await
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_follows_the_last_release_of_its_key() {
        let hints = HandOffHints::default();
        assert!(!hints.expects_queue("k"));
        hints.note("k", true);
        assert!(hints.expects_queue("k"));
        assert!(!hints.expects_queue("other"));
        hints.note("k", false);
        assert!(!hints.expects_queue("k"));
    }

    #[test]
    fn the_hints_stay_bounded_however_many_keys_hand_over() {
        let hints = HandOffHints::default();
        for i in 0..HINTED_KEYS_MAX * 3 {
            hints.note(&format!("k{i}"), true);
        }
        let kept = hints.keys.lock().unwrap().len();
        assert!((1..=HINTED_KEYS_MAX).contains(&kept), "{kept}");
        // The newest key is always kept.
        assert!(hints.expects_queue(&format!("k{}", HINTED_KEYS_MAX * 3 - 1)));
    }
}
