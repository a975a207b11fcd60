//! The queue of waiters per key (the trait's `# Contract`, issue 31): a
//! table of entries, and the attempt that enters it or hands a free key to
//! its head.
//!
//! The uncontended path stays one statement: `ACQUIRE` (sql.rs) grants only
//! if no live entry is queued ahead of the requester (one index probe of
//! an empty range when nobody waits), and `RELEASE` hands the key to the
//! head in the same statement. Only an attempt that `ACQUIRE` refused and
//! that queues, or that found the key free behind a queue, runs
//! [`queued_attempt`]: one `BEGIN IMMEDIATE` transaction that reads the
//! key, enters or renews the requester's entry, and hands a free key to
//! the head. Whoever is granted the key leaves the queue in the granting
//! statement itself (a trigger on `leasehold_locks`).

use sqlx::sqlite::SqliteConnection;
use sqlx::Connection;

use super::errors::{busy, is_locked, write_locked};
use super::wake::WakeDir;
use super::{classify, STORE};
use crate::backend::{
    duration_to_millis, Acquire, AcquireRequest, HandOff, KeyKind, OwnerId, RecordDecoder,
};
use crate::error::Result;
use crate::key::Key;

/// Creates the queue table; safe to run any number of times. `seq` orders
/// a key's entries (the next is one above the key's highest).
pub(super) const MIGRATION: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS leasehold_queue (
    key TEXT NOT NULL,
    owner TEXT NOT NULL,
    seq INTEGER NOT NULL,
    holder TEXT NOT NULL,
    claim_ms INTEGER NOT NULL,
    ticket INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (key, owner)
) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS leasehold_queue_order ON leasehold_queue (key, seq)",
    // Whoever is granted the key leaves its queue, in the statement that
    // grants it (ACQUIRE, RELEASE's hand-over, GRANT_FREE): no second
    // write transaction per grant.
    "CREATE TRIGGER IF NOT EXISTS leasehold_queue_granted \
     AFTER UPDATE OF owner ON leasehold_locks WHEN NEW.owner IS NOT NULL \
     BEGIN DELETE FROM leasehold_queue WHERE key = NEW.key AND owner = NEW.owner; END",
];

/// Whether a live entry of another owner is queued ahead of owner ?2 for
/// key ?1 (ahead of everyone, if ?2 has no live entry).
macro_rules! queued_ahead {
    () => {
        concat!(
            "(SELECT 1 FROM leasehold_queue AS q WHERE q.key = ?1 AND q.owner <> ?2 \
             AND q.expires_at_ms > ",
            now_ms!(),
            " AND q.seq < coalesce((SELECT m.seq FROM leasehold_queue AS m \
             WHERE m.key = ?1 AND m.owner = ?2 AND m.expires_at_ms > ",
            now_ms!(),
            "), 9223372036854775807))"
        )
    };
}

/// The rest of a query of key ?1's live head: `SELECT <column>` + this.
macro_rules! queue_head {
    () => {
        concat!(
            " FROM leasehold_queue AS q WHERE q.key = ?1 AND q.expires_at_ms > ",
            now_ms!(),
            " ORDER BY q.seq LIMIT 1"
        )
    };
}

/// Deletes owner ?2's entry of key ?1.
pub(super) const LEAVE: &str = "DELETE FROM leasehold_queue WHERE key = ?1 AND owner = ?2";

/// The fence of key ?1's live grant to owner ?2.
pub(super) const HELD_BY: &str = concat!(
    "SELECT fence FROM leasehold_locks WHERE key = ?1 AND owner = ?2 AND expires_at_ms > ",
    now_ms!()
);

/// The key's kind, owner, holder and fence, and the holder's time left in ms.
const READ_KEY: &str = concat!(
    "SELECT kind, owner, holder, fence, expires_at_ms - ",
    now_ms!(),
    " FROM leasehold_locks WHERE key = ?1"
);

/// Extends key ?1's live grant to ?2 ms from now: a repeat of its owner.
const EXTEND: &str = concat!(
    "UPDATE leasehold_locks SET expires_at_ms = ",
    now_ms!(),
    " + ?2 WHERE key = ?1"
);

/// Deletes key ?1's dead entries.
const DROP_DEAD: &str = concat!(
    "DELETE FROM leasehold_queue WHERE key = ?1 AND expires_at_ms <= ",
    now_ms!()
);

/// Enters owner ?2 (holder ?3, claim window ?4 ms, ticket ?5) in key ?1's
/// queue for ?6 ms, after every entry there; a repeat renews its entry and
/// ticket in place.
const ENQUEUE: &str = concat!(
    "INSERT INTO leasehold_queue (key, owner, seq, holder, claim_ms, ticket, expires_at_ms) \
     VALUES (?1, ?2, (SELECT coalesce(max(seq), 0) + 1 FROM leasehold_queue WHERE key = ?1), \
     ?3, ?4, ?5, ",
    now_ms!(),
    " + ?6) ON CONFLICT (key, owner) DO UPDATE SET ticket = excluded.ticket, \
     expires_at_ms = excluded.expires_at_ms"
);

/// Key ?1's live head: owner, holder, claim window in ms, ticket.
const HEAD: &str = concat!(
    "SELECT q.owner, q.holder, q.claim_ms, q.ticket",
    queue_head!()
);

/// Grants free key ?1 to owner ?2, holder ?3, for ?4 ms: the next fence.
const GRANT_FREE: &str = concat!(
    "UPDATE leasehold_locks SET fence = fence + 1, owner = ?2, holder = ?3, expires_at_ms = ",
    now_ms!(),
    " + ?4 WHERE key = ?1 RETURNING fence"
);

/// A grant handed over to the head of a queue, to tell it of.
pub(super) struct Handed {
    pub(super) owner: OwnerId,
    pub(super) grant: HandOff,
}

impl Handed {
    pub(super) fn tell(self, wake: &WakeDir, key: &Key) {
        wake.hand_over(key, self.owner, self.grant);
    }
}

/// The attempt `ACQUIRE` refused, when it queues or found the key free
/// behind a queue, in one write transaction: a free key goes to the live
/// head (and the requester enters or renews its entry, if it queues), or
/// to the requester if it is the head or nobody is queued; a held key
/// leaves the requester queued. The head is told by the caller once this
/// returns (after the commit).
pub(super) async fn queued_attempt(
    conn: &mut SqliteConnection,
    req: &AcquireRequest,
) -> Result<(Acquire, Option<Handed>)> {
    let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(e) if is_locked(&e) => return Ok((write_locked(), None)),
        Err(e) => return Err(classify(e)),
    };
    let key = req.key().as_str();
    let owner = req.owner().to_string();
    let record = RecordDecoder::new(STORE, key);
    type KeyRow = (
        Option<String>,
        Option<String>,
        Option<String>,
        i64,
        Option<i64>,
    );
    let row: Option<KeyRow> = sqlx::query_as(READ_KEY)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(classify)?;
    let Some((kind, holder_owner, holder, fence, remaining)) = row else {
        // No record: ACQUIRE creates it at the next attempt.
        return Ok((busy(None, Some(0)), None));
    };
    let kind = super::kind::decode(req.key(), kind.as_deref())?;
    if kind != KeyKind::Mutex {
        return Ok((Acquire::OtherKind(kind), None));
    }
    let live = holder_owner.is_some() && remaining.is_some_and(|ms| ms > 0);
    if live && holder_owner.as_deref() == Some(owner.as_str()) {
        // Handed over to the requester since ACQUIRE ran: a repeat.
        sqlx::query(EXTEND)
            .bind(key)
            .bind(duration_to_millis(req.ttl()))
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        return Ok((Acquire::Granted(req.granted(record.token(fence)?)), None));
    }
    let mut answer = busy(holder, remaining);
    let mut handed = None;
    if !live {
        sqlx::query(DROP_DEAD)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        let head: Option<(String, String, i64, i64)> = sqlx::query_as(HEAD)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(classify)?;
        let (to, label, ms) = match &head {
            Some((head_owner, head_holder, claim_ms, _)) if *head_owner != owner => {
                (head_owner.clone(), head_holder.clone(), *claim_ms)
            }
            // Nobody ahead: the requester's turn.
            _ => (
                owner.clone(),
                req.holder().to_owned(),
                duration_to_millis(req.ttl()),
            ),
        };
        let fence: i64 = sqlx::query_scalar(GRANT_FREE)
            .bind(key)
            .bind(&to)
            .bind(&label)
            .bind(ms)
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        match head {
            Some((_, _, claim_ms, ticket)) if to != owner => {
                let (owner, grant) = record.hand_off(&to, fence, Some(ticket))?;
                handed = Some(Handed { owner, grant });
                answer = busy(Some(label), Some(claim_ms));
            }
            _ => {
                tx.commit().await.map_err(classify)?;
                return Ok((Acquire::Granted(req.granted(record.token(fence)?)), None));
            }
        }
    }
    if let (Some(entry_ttl), Some(ticket)) = (req.queue_entry_ttl(), req.queue_ticket()) {
        sqlx::query(ENQUEUE)
            .bind(key)
            .bind(&owner)
            .bind(req.holder())
            .bind(duration_to_millis(req.claim_window()))
            .bind(i64::from(ticket))
            .bind(duration_to_millis(entry_ttl))
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
    }
    tx.commit().await.map_err(classify)?;
    Ok((answer, handed))
}
