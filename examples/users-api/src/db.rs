//! The app's data: users and a `users` counter that keeps the number of
//! users and the last fencing token that wrote it, behind [`UserStore`], on
//! SQLite ([`SqliteUsers`], the default) or MongoDB ([`MongoUsers`]).
//!
//! Neither store makes usernames unique: they stand for a document store
//! where "check then insert" across documents is only safe under the lock.
//! The tests run the app without the lock to show the race.

mod mongo;
mod sqlite;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::Serialize;

pub use mongo::MongoUsers;
pub use sqlite::SqliteUsers;

/// A data store failure, whichever store it came from: the routes only log
/// it and answer 500.
pub type DataError = Box<dyn std::error::Error + Send + Sync>;

/// A stored user.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct User {
    /// Row id; ids increase with creation order on both stores.
    pub id: i64,
    /// The unique (by the lock) username.
    pub username: String,
    /// The fencing token of the lease the user was created under.
    pub created_token: i64,
}

/// The `users` counter.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Counter {
    /// Number of users created.
    pub value: i64,
    /// The highest fencing token that wrote the counter.
    pub last_token: i64,
}

/// What a create can run into besides a database error.
#[derive(Debug)]
pub enum CreateError {
    /// The username is taken.
    Taken,
    /// A request with a newer lease wrote the counter: ours is stale.
    Fenced,
    /// The database failed.
    Db(DataError),
}

/// `token` as both stores keep integers (SQLite and BSON integers are
/// i64): a token beyond that is refused as fenced rather than wrapped into
/// a smaller, stale-looking one.
fn stored_token(token: u64) -> Result<i64, CreateError> {
    i64::try_from(token).map_err(|_| CreateError::Fenced)
}

impl From<sqlx::Error> for CreateError {
    fn from(e: sqlx::Error) -> Self {
        CreateError::Db(e.into())
    }
}

impl From<mongodb::error::Error> for CreateError {
    fn from(e: mongodb::error::Error) -> Self {
        CreateError::Db(e.into())
    }
}

/// Where the users live. Object safe (boxed futures) so the app can pick
/// the store at run time from `--data`. A store supplies the two steps of a
/// create; the create itself ([`UserStore::create`]) is written once here.
pub trait UserStore: Send + Sync + std::fmt::Debug {
    /// The multi-step create, run under the collection lock whose fencing
    /// token is `token`: check the name is free, wait `step_delay`, then
    /// insert the user and bump the counter together, only if no newer
    /// lease wrote the counter meanwhile.
    ///
    /// A fenced create writes nothing.
    fn create<'a>(
        &'a self,
        username: &'a str,
        token: u64,
        step_delay: Duration,
    ) -> BoxFuture<'a, Result<User, CreateError>> {
        Box::pin(async move {
            let token = stored_token(token)?;
            if self.is_taken(username).await? {
                return Err(CreateError::Taken);
            }
            tokio::time::sleep(step_delay).await;
            let id = self
                .fenced_insert(username, token)
                .await?
                .ok_or(CreateError::Fenced)?;
            Ok(User {
                id,
                username: username.to_owned(),
                created_token: token,
            })
        })
    }

    /// Whether a user named `username` exists.
    fn is_taken<'a>(&'a self, username: &'a str) -> BoxFuture<'a, Result<bool, CreateError>>;

    /// The write step of a create: bumps the counter to `token` and inserts
    /// the user, both or neither, only if no newer lease wrote the counter
    /// (a lower `last_token` or an equal one, the same lease writing
    /// again). Returns the new user's id, or `None` when fenced; a fenced
    /// insert writes nothing.
    fn fenced_insert<'a>(
        &'a self,
        username: &'a str,
        token: i64,
    ) -> BoxFuture<'a, Result<Option<i64>, CreateError>>;

    /// Every user, by id.
    fn list(&self) -> BoxFuture<'_, Result<Vec<User>, DataError>>;

    /// The `users` counter.
    fn counter(&self) -> BoxFuture<'_, Result<Counter, DataError>>;
}

/// Whether `--data` names a MongoDB server rather than a SQLite file.
pub fn is_mongodb_url(data: &str) -> bool {
    matches!(
        leasehold::scheme::Scheme::parse(data),
        Ok((leasehold::scheme::Scheme::Mongodb, _))
    )
}

/// Opens the store `data` names: a `mongodb://` (or `mongodb+srv://`) URL,
/// or else a SQLite file path.
///
/// # Errors
/// The store cannot be reached or its schema not created.
pub async fn open(data: &str) -> Result<Arc<dyn UserStore>, DataError> {
    Ok(if is_mongodb_url(data) {
        Arc::new(MongoUsers::open(data).await?)
    } else {
        Arc::new(SqliteUsers::open(Path::new(data)).await?)
    })
}
