//! The app's data on SQLite: a `users` table and a `counters` row that keeps
//! the number of users and the last fencing token that wrote it.
//!
//! `users.username` deliberately has no UNIQUE constraint (see [`super`]).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use super::{Counter, CreateError, DataError, User, UserStore};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS users (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    username      TEXT    NOT NULL,
    created_token INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name       TEXT    PRIMARY KEY,
    value      INTEGER NOT NULL,
    last_token INTEGER NOT NULL
);
INSERT OR IGNORE INTO counters (name, value, last_token) VALUES ('users', 0, 0);
";

/// The users store on SQLite.
#[derive(Debug, Clone)]
pub struct SqliteUsers {
    pool: SqlitePool,
}

impl SqliteUsers {
    /// Opens (creating if needed) the SQLite file at `path`.
    ///
    /// # Errors
    /// The database cannot be opened or the schema not created.
    pub async fn open(path: &Path) -> Result<Self, sqlx::Error> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let options = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
        Ok(SqliteUsers { pool })
    }
}

impl UserStore for SqliteUsers {
    fn is_taken<'a>(&'a self, username: &'a str) -> BoxFuture<'a, Result<bool, CreateError>> {
        Box::pin(async move {
            let taken: Option<i64> = sqlx::query_scalar("SELECT id FROM users WHERE username = ?")
                .bind(username)
                .fetch_optional(&self.pool)
                .await?;
            Ok(taken.is_some())
        })
    }

    fn fenced_insert<'a>(
        &'a self,
        username: &'a str,
        token: i64,
    ) -> BoxFuture<'a, Result<Option<i64>, CreateError>> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await?;
            // The fenced write: refuses a token lower than the last one
            // seen, so a request whose lease expired mid-way cannot commit
            // after a newer holder. Dropping `tx` without commit rolls the
            // insert back too.
            let fenced = sqlx::query(
                "UPDATE counters SET value = value + 1, last_token = ?1
                  WHERE name = 'users' AND last_token <= ?1",
            )
            .bind(token)
            .execute(&mut *tx)
            .await?;
            if fenced.rows_affected() == 0 {
                return Ok(None);
            }
            let id = sqlx::query_scalar(
                "INSERT INTO users (username, created_token) VALUES (?, ?) RETURNING id",
            )
            .bind(username)
            .bind(token)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(Some(id))
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<User>, DataError>> {
        Box::pin(async move {
            let rows: Vec<(i64, String, i64)> =
                sqlx::query_as("SELECT id, username, created_token FROM users ORDER BY id")
                    .fetch_all(&self.pool)
                    .await?;
            Ok(rows
                .into_iter()
                .map(|(id, username, created_token)| User {
                    id,
                    username,
                    created_token,
                })
                .collect())
        })
    }

    fn counter(&self) -> BoxFuture<'_, Result<Counter, DataError>> {
        Box::pin(async move {
            let (value, last_token): (i64, i64) =
                sqlx::query_as("SELECT value, last_token FROM counters WHERE name = 'users'")
                    .fetch_one(&self.pool)
                    .await?;
            Ok(Counter { value, last_token })
        })
    }
}
