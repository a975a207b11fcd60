//! PostgreSQL's semaphores: one row per semaphore key in `<table>_permits`,
//! holding the key's permit fence and its slots as a `jsonb` object
//! (`{"slot": {"o": owner, "h": holder, "t": token, "e": expiry ms}}`),
//! deleted with its anchor once idle past the window (sweep.rs).
//!
//! Keeping a key's slots in one row is what makes a grant one statement
//! that is right under concurrency: `INSERT ... ON CONFLICT DO UPDATE`
//! locks the row and evaluates the count of live slots, the free slot and
//! the new fence on the row's latest committed version, so two concurrent
//! grants of one key take turns. (Slots in rows of their own would be
//! counted on the statement's snapshot, which misses a grant that commits
//! while the statement waits.) Expiry is the server's `clock_timestamp()`
//! in epoch milliseconds. Releases are announced on the mutex's channel.
//!
//! Reader-writer locks keep the same row shape in `<table>_rw`, with the
//! writer in slot `WRITER_SLOT` and a waiting writer's marker in a `mark`
//! column (`{"o", "h", "e"}`); their grant is [`rw_acquire`], renew,
//! release and list are the permits' statements on that table.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::Row;

use super::exec::Param;
use super::names::{permits_table, rw_table, CHANNEL};
use super::{classify, is_lock_not_available, row_locked, token_as_i64, Failed, Inner, STORE};
use crate::backend::renew_attempt_timeout;
use crate::backend::{
    duration_to_millis, millis_to_duration, Acquire, AcquireRequest, Busy, KeyKind, Lease,
    PermitInfo, RecordDecoder, RwSide, MAX_PERMITS, WRITER_SLOT,
};
use crate::error::Result;

/// The server's clock in epoch milliseconds.
const NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The statements for the permits table of one lease table.
#[derive(Debug, Clone)]
pub(super) struct PermitStatements {
    pub migrate: String,
    acquire: String,
    renew: String,
    release: String,
    list: String,
    /// $1 key: frees every slot (and a waiting writer's mark) and bumps
    /// the fence; answers whether a slot was live, and notifies.
    force_release: String,
}

/// The claim of the key's anchor (its row in the lease table `table`) for
/// kind `kind` (`'rw'` or `'sem'`), as the first CTE of a permit grant:
/// `INSERT ... ON CONFLICT DO UPDATE` locks the anchor and reads it at its
/// latest committed version (a plain read would see the statement's
/// snapshot, and a mutex grant and a permit grant could then both miss each
/// other). A free mutex key takes the kind; a key of the kind keeps it;
/// otherwise the row is left as it was. Returns the kind after the claim,
/// the anchor's fence (the grant's tokens go on above it), and a live mutex
/// holder with its time left. $1 key, $5 lock wait ms (text).
fn claim(table: &str, kind: &str) -> String {
    let mutex_live = "(a.owner IS NOT NULL AND a.expires_at > clock_timestamp())";
    format!(
        "claim AS ( \
           INSERT INTO {table} AS a (key, fence, kind) \
           SELECT $1, {first}, '{kind}' FROM (SELECT set_config('lock_timeout', $5::text, true)) AS bounded \
           ON CONFLICT (key) DO UPDATE SET kind = CASE \
             WHEN a.kind IS NULL AND NOT coalesce({mutex_live}, false) THEN excluded.kind \
             ELSE a.kind END \
           RETURNING a.kind, a.fence, \
             CASE WHEN {mutex_live} THEN a.holder END AS holder, \
             CASE WHEN {mutex_live} THEN {rem} END AS left_ms)",
        rem = remaining_ms_of("a.expires_at"),
        first = super::sweep::FIRST_FENCE,
    )
}

/// The rows a permit grant answers when its claim failed: busy behind a
/// live mutex holder (kind `mutex`), or the key's other kind.
fn unclaimed(kind: &str) -> String {
    format!(
        "SELECT NULL::bigint, NULL::bigint, c.holder, c.left_ms, coalesce(c.kind, 'mutex') \
         FROM claim AS c WHERE c.kind IS DISTINCT FROM '{kind}'"
    )
}

/// The grant of a reader-writer lock on table `p`: one
/// `INSERT ... ON CONFLICT DO UPDATE`, so the row lock orders concurrent
/// attempts and each sees the latest committed slots and mark (see the
/// module's notes on the permits). Every attempt rewrites the row: a
/// refused one keeps slots and fence, and a waiting writer's sets or
/// refreshes its mark; a repeat by an owner whose grant (on its side) is
/// live is that grant again, its expiry from now. $1 key, $2 owner, $3
/// holder, $4 ttl ms, $5 lock wait ms (text), $6 'r' or 'w', $7 the mark's
/// life in ms (0: none). Answers the token and the slot (both null when
/// refused), and the holder that expires first with its time left (not our
/// own mark).
///
/// The decision is read back explicitly: a grant or regrant writes our
/// slot's expiry as `now + ttl` with the statement's one `now`, which no
/// earlier attempt wrote (an earlier grant's entry is either live, and
/// then this attempt is its regrant, or expired, below `now`). A refused
/// attempt leaves our entries as they were, so it never reads as granted.
fn rw_acquire(table: &str, p: &str) -> String {
    // One instant for the whole statement: `ok` is evaluated once per
    // column, and columns that disagreed on it would break the fence. The
    // statement's start is at most its row-lock wait early, which only
    // keeps holders live longer and grants end sooner (conservative).
    let now = "(extract(epoch FROM statement_timestamp()) * 1000)::bigint";
    let w = WRITER_SLOT;
    let max = MAX_PERMITS;
    let readers = format!(
        "(SELECT count(*) FROM jsonb_each(l.slots) AS s(k, v) \
          WHERE s.k <> '{w}' AND (s.v->>'e')::bigint > {now})"
    );
    let open = format!(
        "(NOT coalesce((l.slots->'{w}'->>'e')::bigint > {now}, false) \
          AND NOT coalesce((l.mark->>'e')::bigint > {now} AND l.mark->>'o' <> $2::text, false))"
    );
    let ok = format!(
        "({open} AND CASE WHEN $6::text = 'w' THEN {readers} = 0 ELSE {readers} < {max} END)"
    );
    // The slot (text) of this owner's live grant on the requested side.
    let own = format!(
        "(SELECT min(s.k) FROM jsonb_each(l.slots) AS s(k, v) \
          WHERE (s.k = '{w}') = ($6::text = 'w') AND s.v->>'o' = $2::text \
            AND (s.v->>'e')::bigint > {now})"
    );
    let entry = |token: &str| {
        format!("jsonb_build_object('o', $2::text, 'h', $3::text, 't', {token}, 'e', {now} + $4::bigint)")
    };
    // A reader takes the lowest free slot. With `readers` slots live, one
    // of `0..=readers` is free (and `ok` keeps `readers` below `max`), so
    // the scan covers the live readers plus one instead of all `max` slots.
    let slot = format!(
        "CASE WHEN $6::text = 'w' THEN '{w}' ELSE \
           (SELECT min(i) FROM generate_series(0, {readers}) AS i \
            WHERE NOT coalesce((l.slots->(i::text)->>'e')::bigint > {now}, false))::text END"
    );
    let first_slot = format!("CASE WHEN $6::text = 'w' THEN '{w}' ELSE '0' END");
    // The fence this grant counts from: the row's, and never below the
    // anchor's (`excluded.fence` is the anchor's plus one; see `claim`).
    let fence = "greatest(l.fence, excluded.fence - 1)";
    // This attempt's grant or regrant: our entry on our side written now.
    let mine = format!(
        "FROM jsonb_each(l.slots) AS s(k, v) WHERE (s.k = '{w}') = ($6::text = 'w') \
           AND s.v->>'o' = $2::text AND (s.v->>'e')::bigint = {now} + $4::bigint"
    );
    format!(
        "WITH {claim}, up AS ( \
           INSERT INTO {p} AS l (key, fence, slots, mark) \
           SELECT $1, c.fence + 1, jsonb_build_object({first_slot}, {first}), NULL::jsonb \
           FROM (SELECT set_config('lock_timeout', $5::text, true)) AS bounded, claim AS c \
           WHERE c.kind = 'rw' \
           ON CONFLICT (key) DO UPDATE SET \
             fence = CASE WHEN {own} IS NULL AND {ok} THEN {fence} + 1 ELSE l.fence END, \
             slots = CASE WHEN {own} IS NOT NULL THEN \
               jsonb_set(l.slots, ARRAY[{own}, 'e'], to_jsonb({now} + $4::bigint)) \
               WHEN {ok} THEN \
               (SELECT coalesce(jsonb_object_agg(s.k, s.v), '{{}}'::jsonb) \
                FROM jsonb_each(l.slots) AS s(k, v) WHERE (s.v->>'e')::bigint > {now}) \
               || jsonb_build_object({slot}, {next}) ELSE l.slots END, \
             mark = CASE WHEN {own} IS NOT NULL THEN l.mark \
               WHEN {ok} AND $6::text = 'w' THEN NULL::jsonb \
               WHEN {open} AND $6::text = 'w' AND $7::bigint > 0 THEN \
                 jsonb_build_object('o', $2::text, 'h', $3::text, 'e', {now} + $7::bigint) \
               ELSE l.mark END \
           RETURNING l.slots, l.mark, \
             (SELECT (s.v->>'t')::bigint {mine}) AS token, \
             (SELECT s.k::bigint {mine}) AS slot) \
         SELECT up.token, up.slot, b.h, b.left_ms, NULL::text \
         FROM up LEFT JOIN LATERAL ( \
           SELECT x.h, x.e - {now} AS left_ms FROM ( \
             SELECT s.v->>'h' AS h, (s.v->>'e')::bigint AS e FROM jsonb_each(up.slots) AS s(k, v) \
             UNION ALL SELECT up.mark->>'h', (up.mark->>'e')::bigint \
               WHERE up.mark->>'o' IS DISTINCT FROM $2::text) AS x \
           WHERE x.e > {now} ORDER BY x.e LIMIT 1) AS b ON up.slot IS NULL \
         UNION ALL {unclaimed}",
        claim = claim(table, "rw"),
        unclaimed = unclaimed("rw"),
        first = entry("c.fence + 1"),
        next = entry(&format!("{fence} + 1")),
    )
}

impl PermitStatements {
    /// The reader-writer locks' statements, on `<table>_rw`.
    pub(super) fn rw(table: &str) -> Self {
        let p = rw_table(table);
        let permits = Self::on(table, &p);
        PermitStatements {
            migrate: format!(
                "CREATE TABLE IF NOT EXISTS {p} ( \
                   key TEXT COLLATE \"C\" PRIMARY KEY, \
                   fence BIGINT NOT NULL, \
                   slots JSONB NOT NULL, \
                   mark JSONB)"
            ),
            acquire: rw_acquire(table, &p),
            force_release: force_release(&p, ", mark = NULL"),
            ..permits
        }
    }

    /// `table` is the quoted lease table ([`super::sql::quote_table_name`]).
    pub(super) fn new(table: &str) -> Self {
        Self::on(table, &permits_table(table))
    }

    /// The semaphore's statements on table `p` (quoted), beside the lease
    /// table `table` (the keys' anchors).
    fn on(table: &str, p: &str) -> Self {
        let live = |slots: &str| {
            format!("(SELECT count(*) FROM jsonb_each({slots}) AS s(k, v) WHERE (s.v->>'e')::bigint > {NOW})")
        };
        let entry = |token: &str| {
            format!("jsonb_build_object('o', $2::text, 'h', $3::text, 't', {token}, 'e', {NOW} + $4::bigint)")
        };
        // The owner's live slot (its key, text), if the owner repeats. At
        // one instant (the statement's start), so that the fence, the
        // slots and the condition agree on it: a slot that ends during the
        // statement must not keep the fence and take a new token too. A
        // slot still in the row was not replaced by a grant since (a grant
        // drops expired slots), so extending it never makes one too many.
        let own = "(SELECT min(s.k) FROM jsonb_each(l.slots) AS s(k, v) \
              WHERE s.v->>'o' = $2::text AND (s.v->>'e')::bigint > \
                (extract(epoch FROM statement_timestamp()) * 1000)::bigint)";
        PermitStatements {
            migrate: format!(
                "CREATE TABLE IF NOT EXISTS {p} ( \
                   key TEXT COLLATE \"C\" PRIMARY KEY, \
                   fence BIGINT NOT NULL, \
                   slots JSONB NOT NULL)"
            ),
            // $1 key, $2 owner, $3 holder, $4 ttl ms, $5 lock wait ms
            // (text), $6 permits. Expired slots are dropped as the row is
            // rewritten; the busy branch names the holder that expires first.
            // A repeat by an owner with a live slot is that grant again
            // (slot and token), its expiry from now: a request re-sent
            // after a lost answer takes no second slot. The owner has at
            // most one slot (a grant drops its expired ones), so RETURNING
            // finds this attempt's grant or regrant by owner alone.
            // The key's anchor is claimed first (see `claim`); the insert
            // selects no row unless the key is a semaphore's, and counts
            // its tokens from above the anchor's fence (`excluded.fence` is
            // that plus one).
            acquire: format!(
                "WITH {claim}, granted AS ( \
                   INSERT INTO {p} AS l (key, fence, slots) \
                   SELECT $1, c.fence + 1, jsonb_build_object('0', {first}) \
                   FROM (SELECT set_config('lock_timeout', $5::text, true)) AS bounded, claim AS c \
                   WHERE c.kind = 'sem' \
                   ON CONFLICT (key) DO UPDATE SET \
                     fence = CASE WHEN {own} IS NULL THEN {fence} + 1 ELSE l.fence END, \
                     slots = CASE WHEN {own} IS NOT NULL THEN \
                       jsonb_set(l.slots, ARRAY[{own}, 'e'], to_jsonb({NOW} + $4::bigint)) ELSE \
                       (SELECT coalesce(jsonb_object_agg(s.k, s.v), '{{}}'::jsonb) \
                              FROM jsonb_each(l.slots) AS s(k, v) WHERE (s.v->>'e')::bigint > {NOW}) \
                       || jsonb_build_object( \
                            (SELECT min(i) FROM generate_series(0, $6::bigint - 1) AS i \
                             WHERE NOT coalesce((l.slots->(i::text)->>'e')::bigint > {NOW}, false))::text, \
                            {next}) END \
                   WHERE {own} IS NOT NULL OR {live_l} < $6::bigint \
                   RETURNING (SELECT (s.v->>'t')::bigint FROM jsonb_each(l.slots) AS s(k, v) \
                     WHERE s.v->>'o' = $2::text ORDER BY 1 DESC LIMIT 1) AS token, \
                     (SELECT s.k::bigint FROM jsonb_each(l.slots) AS s(k, v) \
                     WHERE s.v->>'o' = $2::text ORDER BY (s.v->>'t')::bigint DESC LIMIT 1) AS slot) \
                 SELECT token, slot, NULL::text AS holder, NULL::bigint AS remaining_ms, \
                   NULL::text AS kind FROM granted \
                 UNION ALL \
                 (SELECT NULL::bigint, NULL::bigint, s.v->>'h', (s.v->>'e')::bigint - {NOW}, NULL::text \
                  FROM {p} AS r CROSS JOIN LATERAL jsonb_each(r.slots) AS s(k, v) \
                  WHERE r.key = $1 AND NOT EXISTS (SELECT FROM granted) \
                    AND EXISTS (SELECT FROM claim WHERE kind = 'sem') \
                    AND (s.v->>'e')::bigint > {NOW} ORDER BY 4 LIMIT 1) \
                 UNION ALL {unclaimed}",
                claim = claim(table, "sem"),
                unclaimed = unclaimed("sem"),
                fence = "greatest(l.fence, excluded.fence - 1)",
                first = entry("c.fence + 1"),
                next = entry("greatest(l.fence, excluded.fence - 1) + 1"),
                live_l = live("l.slots"),
                own = own,
            ),
            // $1 key, $2 slot (text), $3 owner, $4 token, $5 ttl ms, $6
            // lock wait ms (text), bounded like the mutex's renewal.
            renew: format!(
                "UPDATE {p} SET slots = jsonb_set(slots, ARRAY[$2::text, 'e'], \
                   to_jsonb({NOW} + $5::bigint)) \
                 FROM (SELECT set_config('lock_timeout', $6::text, true)) AS bounded \
                 WHERE key = $1 AND slots->$2::text->>'o' = $3::text \
                   AND (slots->$2::text->>'t')::bigint = $4::bigint \
                   AND (slots->$2::text->>'e')::bigint > {NOW}"
            ),
            // $1 key, $2 slot (text), $3 owner, $4 token; notifies in the
            // same statement, so only a committed release wakes. The slot
            // stays, ended now (never later than it was): the time the key
            // went idle, for the sweep (sweep.rs). Every other statement
            // counts only slots that have not ended, and a grant drops the
            // ended ones as it rewrites the row.
            release: format!(
                "WITH freed AS ( \
                   UPDATE {p} SET slots = jsonb_set(slots, ARRAY[$2::text, 'e'], \
                     to_jsonb(least((slots->$2::text->>'e')::bigint, {NOW}))) \
                   WHERE key = $1 AND slots->$2::text->>'o' = $3::text \
                     AND (slots->$2::text->>'t')::bigint = $4::bigint RETURNING key) \
                 SELECT pg_notify('{CHANNEL}', key) FROM freed"
            ),
            force_release: force_release(p, ""),
            list: format!(
                "SELECT r.key, s.k::bigint, s.v->>'o', s.v->>'h', (s.v->>'t')::bigint, \
                   (s.v->>'e')::bigint - {NOW} \
                 FROM {p} AS r CROSS JOIN LATERAL jsonb_each(r.slots) AS s(k, v) \
                 WHERE starts_with(r.key, $1) AND (s.v->>'e')::bigint > {NOW} \
                 ORDER BY r.key, 2"
            ),
        }
    }
}

/// The admin break of every slot of a key in table `p`, `also` setting
/// more columns (the rw table's mark). The CTE reads whether a slot was
/// live before the update (RETURNING cannot see old values).
fn force_release(p: &str, also: &str) -> String {
    format!(
        "WITH old AS ( \
           SELECT key, EXISTS (SELECT FROM jsonb_each(slots) AS s(k, v) \
             WHERE (s.v->>'e')::bigint > {NOW}) AS was_live FROM {p} WHERE key = $1 FOR UPDATE), \
         broken AS ( \
           UPDATE {p} AS l SET slots = '{{}}'::jsonb, fence = l.fence + 1{also} \
           FROM old WHERE l.key = old.key RETURNING l.key, old.was_live) \
         SELECT was_live, pg_notify('{CHANNEL}', key)::text FROM broken"
    )
}

fn permit_from_row(row: &PgRow, rw: bool) -> Result<PermitInfo> {
    let key: String = row.try_get(0).map_err(classify)?;
    let record = RecordDecoder::new(STORE, &key);
    let wrong = |e: sqlx::Error| record.corrupt(e.to_string());
    record.slot_info(
        rw,
        row.try_get(1).map_err(wrong)?,
        &row.try_get::<Option<String>, _>(2)
            .map_err(wrong)?
            .unwrap_or_default(),
        row.try_get(3).map_err(wrong)?,
        row.try_get::<Option<i64>, _>(4)
            .map_err(wrong)?
            .unwrap_or(-1),
        row.try_get::<Option<i64>, _>(5)
            .map_err(wrong)?
            .unwrap_or(0),
    )
}

/// The slot of `lease` as the text the statements take.
fn slot_text(lease: &Lease) -> String {
    lease
        .slot()
        .map_or_else(|| "none".to_owned(), |s| s.to_string())
}

impl Inner {
    /// The statements of a semaphore's permit or of a reader-writer lock.
    fn permit_sql(&self, rw: Option<RwSide>) -> &PermitStatements {
        match rw {
            Some(_) => &self.sql.rw,
            None => &self.sql.permits,
        }
    }

    pub(super) async fn acquire_permit(&self, req: &AcquireRequest) -> Result<Acquire> {
        let owner = req.owner().to_string();
        let lock_wait = duration_to_millis(self.row_lock_wait(req.lock_wait())).to_string();
        let mut params = vec![
            Param::Text(req.key().as_str()),
            Param::Text(&owner),
            Param::Text(req.holder()),
            Param::Int(duration_to_millis(req.ttl())),
            Param::Text(&lock_wait),
        ];
        match req.rw_side() {
            None => params.push(Param::Int(i64::from(req.permits().unwrap_or(1)))),
            Some(side) => {
                params.push(Param::Text(if side == RwSide::Read { "r" } else { "w" }));
                params.push(Param::Int(
                    req.writer_mark_ttl().map_or(0, duration_to_millis),
                ));
            }
        }
        let sql = &self.permit_sql(req.rw_side()).acquire;
        let rows = match self.fetch_all(sql, &params).await {
            Ok(rows) => rows,
            // Another transaction kept the row locked for the whole wait.
            Err(Failed::Sql(e)) if is_lock_not_available(&e) => return Ok(row_locked()),
            Err(e) => return Err(e.into_error()),
        };
        let record = RecordDecoder::new(STORE, req.key().as_str());
        let Some(row) = rows.first() else {
            // Taken by a transaction that committed after this statement's
            // snapshot: busy, retry at once.
            return Ok(Acquire::Busy(Busy {
                holder: String::new(),
                remaining: Duration::ZERO,
            }));
        };
        let wrong = |e: sqlx::Error| record.corrupt(e.to_string());
        let fence: Option<i64> = row.try_get(0).map_err(wrong)?;
        let slot: Option<i64> = row.try_get(1).map_err(wrong)?;
        let kind: Option<String> = row.try_get(4).map_err(wrong)?;
        match kind.as_deref() {
            // The claim of the anchor failed: busy behind a mutex holder,
            // or the key is of another kind.
            None | Some("mutex") => {}
            Some(other) => {
                return Ok(Acquire::OtherKind(
                    KeyKind::from_stored(Some(other))
                        .ok_or_else(|| record.corrupt(format!("unknown kind {other:?}")))?,
                ))
            }
        }
        match (fence, slot) {
            (Some(fence), Some(slot)) => {
                let slot = u32::try_from(slot)
                    .map_err(|_| record.corrupt(format!("slot {slot} is negative")))?;
                Ok(Acquire::Granted(
                    req.granted_permit(slot, record.token(fence)?),
                ))
            }
            (Some(fence), None) => Err(record.corrupt(format!("grant {fence} has no slot"))),
            (None, _) => Ok(Acquire::Busy(Busy {
                holder: row
                    .try_get::<Option<String>, _>(2)
                    .map_err(wrong)?
                    .unwrap_or_default(),
                remaining: millis_to_duration(
                    row.try_get::<Option<i64>, _>(3)
                        .map_err(wrong)?
                        .unwrap_or(0),
                ),
            })),
        }
    }

    /// Frees every slot of `key` in the semaphores' table (`rw` None) or
    /// the reader-writer locks' (its waiting writer's mark too), bumps its
    /// fence and wakes its waiters: the admin break of a key of that kind.
    /// Whether a slot was live.
    pub(super) async fn force_release_permits(
        &self,
        key: &crate::key::Key,
        rw: Option<RwSide>,
    ) -> Result<bool> {
        let row = self
            .fetch_optional(
                &self.permit_sql(rw).force_release,
                &[Param::Text(key.as_str())],
            )
            .await?;
        match row {
            Some(row) => row.try_get::<bool, _>(0).map_err(classify),
            None => Ok(false),
        }
    }

    pub(super) async fn renew_permit(&self, lease: &Lease, ttl: Duration) -> Result<bool> {
        let owner = lease.owner().to_string();
        let slot = slot_text(lease);
        let lock_wait =
            duration_to_millis(self.row_lock_wait(renew_attempt_timeout(ttl))).to_string();
        let params = [
            Param::Text(lease.key().as_str()),
            Param::Text(&slot),
            Param::Text(&owner),
            Param::Int(token_as_i64(lease)?),
            Param::Int(duration_to_millis(ttl)),
            Param::Text(&lock_wait),
        ];
        let sql = &self.permit_sql(lease.rw_side()).renew;
        let done = self.execute(sql, &params).await?;
        Ok(done.rows_affected() == 1)
    }

    /// Whether a slot was freed.
    pub(super) async fn release_permit(&self, lease: &Lease) -> Result<bool> {
        let owner = lease.owner().to_string();
        let slot = slot_text(lease);
        let params = [
            Param::Text(lease.key().as_str()),
            Param::Text(&slot),
            Param::Text(&owner),
            Param::Int(token_as_i64(lease)?),
        ];
        let freed = self
            .fetch_all(&self.permit_sql(lease.rw_side()).release, &params)
            .await
            .map_err(Failed::into_error)?;
        if !freed.is_empty() {
            self.wake_local(lease.key());
        }
        Ok(!freed.is_empty())
    }

    /// The live semaphore permits and reader-writer grants under `prefix`,
    /// in no particular order ([`listing`](crate::backend::listing) sorts).
    pub(super) async fn list_permits(&self, prefix: &str) -> Result<Vec<PermitInfo>> {
        let mut all = Vec::new();
        for rw in [false, true] {
            let sql = &self.permit_sql(rw.then_some(RwSide::Read)).list;
            let rows = self
                .fetch_all(sql, &[Param::Text(prefix)])
                .await
                .map_err(Failed::into_error)?;
            for row in &rows {
                all.push(permit_from_row(row, rw)?);
            }
        }
        Ok(all)
    }
}

/// Milliseconds left on the timestamp `column`, rounded up like
/// `sql.rs`'s `remaining_ms!`.
pub(super) fn remaining_ms_of(column: &str) -> String {
    format!("ceil(extract(epoch FROM ({column} - clock_timestamp())) * 1000)::bigint")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_permits_table_sits_beside_the_lease_table() {
        assert_eq!(super::permits_table("\"locks\""), "\"locks_permits\"");
        assert_eq!(
            super::permits_table("\"app\".\"l\""),
            "\"app\".\"l_permits\""
        );
    }
}
