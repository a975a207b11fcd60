//! Concurrency control for the application's own MongoDB documents:
//! fenced writes, optimistic versioned updates, and transactions with
//! bounded retry.

use std::sync::Mutex;
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::error::{TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::ClientOptions;
use mongodb::{Client, ClientSession, Collection, Database};

use super::classify;
use crate::backend::BoxFuture;
use crate::error::{Error, Result};
use crate::occ::{retry_optimistic_with, Attempt, Committed, RetryError, RetryPolicy};

/// A client for `options` (parsed from a URL) and the database the URL
/// names, or `default_database` when it names none. Server selection gives
/// up after `selection_timeout` unless the URL sets its own: the driver's
/// 30 s default makes a wrong URL look like a hang.
///
/// # Errors
/// [`Error::InvalidInput`] (before any I/O) for a `default_database` that
/// is empty or holds a character MongoDB refuses in a database name
/// (`/\. "$` or NUL); the driver's refusal of `options` otherwise.
pub fn client_and_database(
    mut options: ClientOptions,
    default_database: &str,
    selection_timeout: Duration,
) -> Result<(Client, Database)> {
    if default_database.is_empty()
        || default_database.contains(['/', '\\', '.', ' ', '"', '$', '\0'])
    {
        return Err(Error::invalid(
            "default database",
            format!("not a MongoDB database name: {default_database:?}"),
        ));
    }
    options
        .server_selection_timeout
        .get_or_insert(selection_timeout);
    let name = options
        .default_database
        .clone()
        .unwrap_or_else(|| default_database.to_owned());
    let client = Client::with_options(options).map_err(classify)?;
    let database = client.database(&name);
    Ok((client, database))
}

/// Writes `set` to the document `id` only if no newer lease holder wrote it
/// first: `updateOne({_id, fence: {$lte: token}}, {$set: {...set, fence: token}})`.
///
/// The document must carry a `fence` field (start it at 0). Returns whether
/// the write was accepted; `false` means a holder with a larger token wrote
/// the document (or it does not exist): the caller's lease is stale, abort.
///
/// # Errors
/// [`Error::InvalidInput`] (before any I/O) for a token beyond `i64::MAX`, an
/// empty `set`, or `set` naming `_id`, `fence` or an operator; store errors
/// otherwise.
///
/// # Cancel safety
/// Not cancel safe: if dropped, the write may or may not have happened.
pub async fn fenced_update_one(
    coll: &Collection<Document>,
    id: impl Into<Bson>,
    token: u64,
    set: Document,
) -> Result<bool> {
    let token = crate::backend::token_to_i64(token)?;
    check_set(&set, "fence")?;
    let mut set = set;
    set.insert("fence", token);
    let done = coll
        .update_one(
            doc! { "_id": id.into(), "fence": { "$lte": token } },
            doc! { "$set": set },
        )
        .await
        .map_err(classify)?;
    Ok(done.matched_count == 1)
}

/// Optimistic update of the document `id`, which carries an integer
/// `version` field: reads it, asks `change` for the fields to `$set`
/// (`None`: leave the document as it is), and writes them with
/// `updateOne({_id, version}, {$set, $inc: {version: 1}})`. Zero matches
/// means another writer won: read again and retry, with the policy's bound
/// and jittered backoff. Transient store errors are retried too.
///
/// Returns the fields written (`None` if `change` declined).
///
/// # Errors
/// [`RetryError::Exhausted`] when every attempt conflicted;
/// [`RetryError::Failed`] with [`Error::InvalidInput`] for a null `id` (before
/// any I/O) or a `set` naming `_id`, `version` or an operator, with
/// [`Error::Backend`] if the document is missing or has no integer
/// `version`, or with the store's error.
///
/// # Cancel safety
/// Not cancel safe: if dropped, the last attempt's write may or may not
/// have happened.
pub async fn update_versioned<F>(
    coll: &Collection<Document>,
    id: impl Into<Bson>,
    policy: &RetryPolicy,
    change: F,
) -> std::result::Result<Committed<Option<Document>>, RetryError<Error>>
where
    F: FnMut(&Document) -> Option<Document> + Send,
{
    let id = id.into();
    if matches!(id, Bson::Null | Bson::Undefined) {
        return Err(RetryError::Failed {
            error: Error::invalid("id", "must not be null"),
            attempts: 0,
        });
    }
    let change = Mutex::new(change);
    let (id, change) = (&id, &change);
    retry_optimistic_with(policy, Error::is_retryable, |_| async move {
        let current = coll
            .find_one(doc! { "_id": id.clone() })
            .await
            .map_err(classify)?
            .ok_or_else(|| {
                Error::backend(format!("no document with _id {id}")).in_store(super::errors::STORE)
            })?;
        let version = match current.get("version") {
            Some(Bson::Int64(v)) => Bson::Int64(*v),
            Some(Bson::Int32(v)) => Bson::Int32(*v),
            _ => {
                return Err(
                    Error::backend(format!("document {id} has no integer version"))
                        .in_store(super::errors::STORE),
                )
            }
        };
        let wanted = (change.lock().unwrap_or_else(|p| p.into_inner()))(&current);
        let Some(set) = wanted else {
            return Ok(Attempt::Committed(None));
        };
        check_set(&set, "version")?;
        let done = coll
            .update_one(
                doc! { "_id": id.clone(), "version": version },
                doc! { "$set": set.clone(), "$inc": { "version": 1_i64 } },
            )
            .await
            .map_err(classify)?;
        Ok(if done.matched_count == 1 {
            Attempt::Committed(Some(set))
        } else {
            Attempt::Conflict
        })
    })
    .await
}

/// Runs `body` in a multi-document transaction and commits it, retrying
/// the whole transaction on `TransientTransactionError` (a write conflict,
/// a failover) and the commit alone on `UnknownTransactionCommitResult`,
/// each at most `policy.max_attempts()` times with jittered backoff.
///
/// `body` may run several times; it must have no effects outside the
/// session. State it needs goes in `context` (the driver's own pattern).
///
/// ```no_run
/// # async fn f(client: mongodb::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use leasehold::backends::mongodb::helpers::run_transaction;
/// use leasehold::occ::RetryPolicy;
/// use mongodb::bson::{doc, Document};
///
/// let products = client.database("shop").collection::<Document>("products");
/// let mut ctx = products;
/// let sold = run_transaction(&client, &RetryPolicy::default(), &mut ctx, |session, products| {
///     Box::pin(async move {
///         let p = products.find_one(doc! {"_id": "sku-1"}).session(&mut *session).await?;
///         let stock = p.and_then(|p| p.get_i64("stock").ok()).unwrap_or(0);
///         if stock <= 0 { return Ok(false); }
///         products.update_one(doc! {"_id": "sku-1"}, doc! {"$set": {"stock": stock - 1}})
///             .session(&mut *session).await?;
///         Ok(true)
///     })
/// }).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`RetryError::Exhausted`] when every attempt hit a transient error;
/// [`RetryError::Failed`] with the first permanent error (classified as
/// [`Error::Unavailable`] or [`Error::Backend`], the driver's error kept as
/// the source).
///
/// # Cancel safety
/// Not cancel safe: if dropped during the commit, the transaction may or
/// may not have committed. Dropped earlier, the server aborts it.
pub async fn run_transaction<C, T, F>(
    client: &Client,
    policy: &RetryPolicy,
    context: &mut C,
    mut body: F,
) -> std::result::Result<Committed<T>, RetryError<Error>>
where
    F: for<'s> FnMut(&'s mut ClientSession, &'s mut C) -> BoxFuture<'s, mongodb::error::Result<T>>,
{
    let failed = |error, attempts| RetryError::Failed {
        error: classify(error),
        attempts,
    };
    let mut session = client.start_session().await.map_err(|e| failed(e, 0))?;
    let mut backoff = policy.backoff();
    let max = policy.max_attempts();
    for n in 1..=max {
        if n > 1 {
            tokio::time::sleep(backoff.next_delay()).await;
        }
        session
            .start_transaction()
            .await
            .map_err(|e| failed(e, n))?;
        let value = match body(&mut session, context).await {
            Ok(value) => value,
            Err(e) => {
                // Best effort: the server also aborts it when the session ends.
                let _ = session.abort_transaction().await;
                if e.contains_label(TRANSIENT_TRANSACTION_ERROR) {
                    tracing::debug!(error = %e, attempt = n, "transaction conflicted; retrying");
                    continue;
                }
                return Err(failed(e, n));
            }
        };
        let mut commits = 0;
        loop {
            commits += 1;
            match session.commit_transaction().await {
                Ok(()) => return Ok(Committed { value, attempts: n }),
                // Committing again is safe: the server remembers the outcome.
                Err(e) if e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT) && commits < max => {
                    tracing::debug!(error = %e, "commit outcome unknown; committing again");
                }
                Err(e) if e.contains_label(TRANSIENT_TRANSACTION_ERROR) => break,
                Err(e) => return Err(failed(e, n)),
            }
        }
    }
    Err(RetryError::Exhausted { attempts: max })
}

/// A `$set` document must not touch the key or the field the helper owns,
/// and must hold plain fields, not operators.
fn check_set(set: &Document, owned: &'static str) -> Result<()> {
    if set.is_empty() {
        return Err(Error::invalid("update", "must set at least one field"));
    }
    for field in set.keys() {
        if field == "_id" || field == owned || field.starts_with('$') || field.is_empty() {
            return Err(Error::invalid(
                "update",
                format!("must not set {field:?} (the helper manages _id and {owned})"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_documents_are_checked() {
        assert!(check_set(&doc! { "stock": 1 }, "fence").is_ok());
        for bad in [
            doc! {},
            doc! { "fence": 1 },
            doc! { "_id": 1 },
            doc! { "$inc": {"a": 1} },
        ] {
            let e = check_set(&bad, "fence").unwrap_err().to_string();
            assert!(e.starts_with("invalid update: "), "{e}");
        }
    }
}
