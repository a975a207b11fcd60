//! The SQL baseline: an acquire and a release statement issued by hand, as
//! a careful hand-written lock would (the statements are each store's, in
//! `sqlite.rs` and `postgres.rs`).

use futures_util::future::BoxFuture;
use leasehold::OwnerId;

use super::{baseline_error, Baseline, Held};
use crate::exit::CliError;
use crate::sql::{Arg, SqlDb};

pub struct TwoStatements {
    pub name: &'static str,
    pub db: SqlDb,
    /// Parameters: key, owner, holder, ttl ms, then `lock_wait` if any;
    /// the new fence comes back in the first column, or no row (or NULL)
    /// when the key is held.
    pub acquire: &'static str,
    /// Parameters: key, owner, fence.
    pub release: &'static str,
    /// How long the acquisition waits for another transaction's row lock.
    pub lock_wait: Option<&'static str>,
}

impl Baseline for TwoStatements {
    fn name(&self) -> &'static str {
        self.name
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
        Box::pin(async move {
            let owner = OwnerId::random().to_string();
            let mut args = vec![
                Arg::Text(key),
                Arg::Text(&owner),
                Arg::Text("baseline"),
                Arg::Int(30_000),
            ];
            args.extend(self.lock_wait.map(Arg::Text));
            let fence = match self
                .db
                .fetch_all::<(Option<i64>,)>(self.acquire, &args)
                .await
            {
                Ok(rows) => rows.first().and_then(|(fence,)| *fence),
                // PostgreSQL: the row stayed locked by another transaction
                // (a concurrent acquire or release) past the bound: busy.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => None,
                Err(e) => return Err(baseline_error(e)),
            };
            Ok(fence.map(|token| Held {
                key: key.to_owned(),
                owner,
                token,
            }))
        })
    }

    fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>> {
        Box::pin(async move {
            let args = [
                Arg::Text(&held.key),
                Arg::Text(&held.owner),
                Arg::Int(held.token),
            ];
            self.db
                .execute(self.release, &args)
                .await
                .map_err(baseline_error)?;
            Ok(())
        })
    }
}
