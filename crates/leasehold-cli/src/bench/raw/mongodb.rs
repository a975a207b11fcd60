//! MongoDB: the two driver calls by hand (`findOneAndUpdate` with upsert,
//! then an owner-checked `updateOne`), on the library's own collection
//! handle, so only the library's work differs.

use futures_util::future::BoxFuture;
use leasehold::backends::mongodb::MongoBackend;
use leasehold::{Locks, OwnerId};
use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::options::ReturnDocument;
use mongodb::Collection;

use super::{baseline_error, Baseline, Held, Measured};
use crate::exit::CliError;

pub async fn open(url: &str) -> Result<Measured, CliError> {
    let backend = MongoBackend::connect(url).await?;
    let coll = backend.collection().clone();
    Ok(Measured::with_baseline(
        Locks::new(backend),
        TwoCalls { coll },
    ))
}

struct TwoCalls {
    coll: Collection<Document>,
}

/// Duplicate key: the upsert collided with a live holder's document.
fn is_busy(e: &mongodb::error::Error) -> bool {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) => c.code == 11000,
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => {
            w.code == 11000
        }
        _ => false,
    }
}

impl Baseline for TwoCalls {
    fn name(&self) -> &'static str {
        "two mongodb driver calls by hand"
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
        Box::pin(async move {
            let owner = OwnerId::random().to_string();
            let now = DateTime::now();
            let expires = DateTime::from_millis(now.timestamp_millis() + 30_000);
            let granted = self
                .coll
                .find_one_and_update(
                    doc! { "_id": key, "$or": [ { "owner": Bson::Null }, { "expiresAt": { "$lte": now } } ] },
                    doc! { "$set": { "owner": &owner, "holder": "baseline", "expiresAt": expires }, "$inc": { "fence": 1_i64 } },
                )
                .upsert(true)
                .return_document(ReturnDocument::After)
                .projection(doc! { "fence": 1 })
                .await;
            match granted {
                Ok(Some(d)) => {
                    let token = d.get_i64("fence").map_err(baseline_error)?;
                    Ok(Some(Held {
                        key: key.to_owned(),
                        owner,
                        token,
                    }))
                }
                Ok(None) => Ok(None),
                Err(e) if is_busy(&e) => Ok(None),
                Err(e) => Err(baseline_error(e)),
            }
        })
    }

    fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>> {
        Box::pin(async move {
            self.coll
                .update_one(
                    doc! { "_id": &held.key, "owner": &held.owner, "fence": held.token },
                    doc! { "$set": { "owner": Bson::Null, "holder": Bson::Null, "expiresAt": Bson::Null } },
                )
                .await
                .map_err(baseline_error)?;
            Ok(())
        })
    }
}
