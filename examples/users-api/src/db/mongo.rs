//! The app's data on MongoDB: a `users` collection and a `counters`
//! document `{_id: "users", value, last_token}`, in the database the URL
//! names (default `users_api`).
//!
//! A user's `_id` is the counter value its create wrote, so ids increase
//! with creation order as SQLite's AUTOINCREMENT ids do.

use std::time::Duration;

use futures_util::future::BoxFuture;
use leasehold::backends::mongodb::helpers::{client_and_database, run_transaction};
use leasehold::occ::RetryPolicy;
use mongodb::bson::{doc, from_document, Document};
use mongodb::options::{ClientOptions, ReturnDocument};
use mongodb::{Client, ClientSession, Collection};

use serde::Deserialize;

use super::{Counter, CreateError, DataError, User, UserStore};

/// The database used when the URL names none.
pub const DEFAULT_DATABASE: &str = "users_api";

/// `_id` of the counter document.
const COUNTER_ID: &str = "users";

/// The users store on MongoDB.
#[derive(Debug, Clone)]
pub struct MongoUsers {
    client: Client,
    users: Collection<Document>,
    counters: Collection<Document>,
    /// Whether the server runs multi-document transactions (a replica set,
    /// a sharded cluster, SecantusDB); a standalone `mongod` does not.
    transactions: bool,
}

impl MongoUsers {
    /// Connects to `url` and creates the counter document if missing.
    ///
    /// # Errors
    /// The URL is invalid or the server cannot be reached.
    pub async fn open(url: &str) -> Result<Self, DataError> {
        let options = ClientOptions::parse(url).await?;
        let (client, db) = client_and_database(options, DEFAULT_DATABASE, Duration::from_secs(10))?;
        let users = db.collection::<Document>("users");
        let counters = db.collection::<Document>("counters");
        // `$setOnInsert` leaves an existing counter alone: opening never
        // resets it.
        counters
            .update_one(
                doc! { "_id": COUNTER_ID },
                doc! { "$setOnInsert": { "value": 0_i64, "last_token": 0_i64 } },
            )
            .upsert(true)
            .await?;
        let transactions = supports_transactions(&client, &counters).await;
        if !transactions {
            tracing::warn!(
                "this MongoDB server runs no transactions: a create bumps the counter, then \
                 inserts the user; a fenced create still writes nothing, but a failed insert \
                 leaves the counter one ahead"
            );
        }
        Ok(MongoUsers {
            client,
            users,
            counters,
            transactions,
        })
    }

    /// Whether creates run in a transaction (see [`MongoUsers::open`]).
    pub fn transactions(&self) -> bool {
        self.transactions
    }

    /// The fenced counter update, then the insert, both in `session`'s
    /// transaction when there is one. The counter goes first so that a
    /// fenced create stops before it writes anything, with or without a
    /// transaction.
    ///
    /// Returns the new user's id, or `None` when fenced.
    async fn fenced_write(
        &self,
        mut session: Option<&mut ClientSession>,
        username: &str,
        token: i64,
    ) -> mongodb::error::Result<Option<i64>> {
        // The fenced write: refuses a token lower than the last one seen, so
        // a request whose lease expired mid-way cannot commit after a newer
        // holder.
        let bump = self
            .counters
            .find_one_and_update(
                doc! { "_id": COUNTER_ID, "last_token": { "$lte": token } },
                doc! { "$inc": { "value": 1_i64 }, "$set": { "last_token": token } },
            )
            .return_document(ReturnDocument::After);
        let counter = match session.as_deref_mut() {
            Some(s) => bump.session(s).await?,
            None => bump.await?,
        };
        let Some(counter) = counter else {
            return Ok(None);
        };
        let id = from_document::<CounterDoc>(counter)?.value;
        let insert = self.users.insert_one(doc! {
            "_id": id,
            "username": username,
            "created_token": token,
        });
        match session {
            Some(s) => insert.session(s).await?,
            None => insert.await?,
        };
        Ok(Some(id))
    }
}

impl UserStore for MongoUsers {
    fn is_taken<'a>(&'a self, username: &'a str) -> BoxFuture<'a, Result<bool, CreateError>> {
        Box::pin(async move {
            let taken = self
                .users
                .find_one(doc! { "username": username })
                .projection(doc! { "_id": 1 })
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
            if !self.transactions {
                return Ok(self.fenced_write(None, username, token).await?);
            }
            // The insert and the counter update commit together: a failure
            // between them leaves neither. Retries on transient transaction
            // errors (a write conflict, a failover) with the library's
            // bounded, jittered backoff. Borrowed data goes in the context,
            // which the body's future may borrow (the helper's pattern).
            let mut context = (self, username);
            let committed = run_transaction(
                &self.client,
                &RetryPolicy::default(),
                &mut context,
                |session, (this, username)| {
                    Box::pin(async move { this.fenced_write(Some(session), username, token).await })
                },
            )
            .await
            .map_err(|e| CreateError::Db(Box::new(e)))?;
            Ok(committed.value)
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<User>, DataError>> {
        Box::pin(async move {
            let mut cursor = self.users.find(doc! {}).sort(doc! { "_id": 1 }).await?;
            let mut users = Vec::new();
            while cursor.advance().await? {
                let user: UserDoc = from_document(cursor.deserialize_current()?)?;
                users.push(User {
                    id: user.id,
                    username: user.username,
                    created_token: user.created_token,
                });
            }
            Ok(users)
        })
    }

    fn counter(&self) -> BoxFuture<'_, Result<Counter, DataError>> {
        Box::pin(async move {
            let counter = self
                .counters
                .find_one(doc! { "_id": COUNTER_ID })
                .await?
                .ok_or("the users counter document is missing")?;
            let counter: CounterDoc = from_document(counter)?;
            Ok(Counter {
                value: counter.value,
                last_token: counter.last_token,
            })
        })
    }
}

/// Tries an empty read-only transaction: a standalone server refuses it,
/// a replica set or SecantusDB commits it.
async fn supports_transactions(client: &Client, counters: &Collection<Document>) -> bool {
    let probe = async {
        let mut session = client.start_session().await?;
        session.start_transaction().await?;
        counters
            .find_one(doc! { "_id": COUNTER_ID })
            .session(&mut session)
            .await?;
        session.commit_transaction().await
    };
    match probe.await {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, "transaction probe failed");
            false
        }
    }
}

/// A `users` document. Serde reads an Int32 into an `i64` too, whichever
/// width the server stored.
#[derive(Deserialize)]
struct UserDoc {
    #[serde(rename = "_id")]
    id: i64,
    username: String,
    created_token: i64,
}

/// The `counters` document.
#[derive(Deserialize)]
struct CounterDoc {
    value: i64,
    last_token: i64,
}
