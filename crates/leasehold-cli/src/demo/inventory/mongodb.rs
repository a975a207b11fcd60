//! The demo's product document in the MongoDB database that holds the locks.
//!
//! The "row-lock" strategy is a multi-document transaction that first
//! writes the product (MongoDB's way to lock a document: a concurrent
//! transaction's write to it fails at once with a write conflict), then
//! reads, pays and writes the stock; conflicts are retried with a bound.

use std::time::Duration;

use leasehold::backends::mongodb::helpers::{
    client_and_database, fenced_update_one, run_transaction,
};
use leasehold::occ::{RetryError, RetryPolicy};
use leasehold::scheme::StoreUrl;
use mongodb::bson::{doc, Document};
use mongodb::options::{ClientOptions, ReturnDocument, WriteConcern};
use mongodb::{Client, Collection};

use super::{store_error, Answer, Check, Inventory, Stock};
use crate::exit::{CliError, EX_UNAVAILABLE};

pub struct MongoInventory {
    client: Client,
    products: Collection<Document>,
}

impl MongoInventory {
    pub async fn open(url: &StoreUrl) -> Result<Self, CliError> {
        let options = ClientOptions::parse(url.driver_url())
            .await
            .map_err(|e| CliError::usage(format!("invalid store url: {e}")))?;
        let (client, db) = client_and_database(options, "leasehold", Duration::from_secs(3))
            .map_err(store_error)?;
        let products = db.collection_with_options::<Document>(
            "leasehold_demo_products",
            mongodb::options::CollectionOptions::builder()
                .write_concern(WriteConcern::majority())
                .build(),
        );
        Ok(MongoInventory { client, products })
    }

    async fn changed(&self, filter: Document, update: Document) -> Result<bool, CliError> {
        let done = self
            .products
            .update_one(filter, update)
            .await
            .map_err(store_error)?;
        Ok(done.matched_count == 1)
    }
}

fn stock_of(d: &Document) -> Result<Stock, CliError> {
    let field = |name| {
        d.get_i64(name)
            .map_err(|e| store_error(std::io::Error::other(format!("product {name}: {e}"))))
    };
    Ok(Stock {
        stock: field("stock")?,
        version: field("version")?,
    })
}

impl Inventory for MongoInventory {
    fn reset<'a>(&'a self, product: &'a str, stock: i64) -> Answer<'a, ()> {
        Box::pin(async move {
            self.products
                .replace_one(
                    doc! { "_id": product },
                    doc! { "stock": stock, "version": 0_i64, "fence": 0_i64 },
                )
                .upsert(true)
                .await
                .map_err(store_error)?;
            Ok(())
        })
    }

    fn read<'a>(&'a self, product: &'a str) -> Answer<'a, Stock> {
        Box::pin(async move {
            let d = self
                .products
                .find_one(doc! { "_id": product })
                .await
                .map_err(store_error)?
                .ok_or_else(|| CliError::new(EX_UNAVAILABLE, format!("no product {product:?}")))?;
            stock_of(&d)
        })
    }

    fn write<'a>(&'a self, product: &'a str, stock: i64, check: Check) -> Answer<'a, bool> {
        Box::pin(async move {
            match check {
                Check::None => {
                    self.changed(doc! { "_id": product }, doc! { "$set": { "stock": stock } })
                        .await
                }
                Check::Fence(token) => {
                    Ok(
                        fenced_update_one(&self.products, product, token, doc! { "stock": stock })
                            .await?,
                    )
                }
                Check::Version(version) => {
                    self.changed(
                        doc! { "_id": product, "version": version },
                        doc! { "$set": { "stock": stock }, "$inc": { "version": 1_i64 } },
                    )
                    .await
                }
            }
        })
    }

    fn buy_row_locked<'a>(&'a self, product: &'a str, pay: Duration) -> Answer<'a, bool> {
        Box::pin(async move {
            // Conflicts fail fast at the first write, so many quick retries.
            let policy =
                RetryPolicy::new(1000, Duration::from_millis(1), Duration::from_millis(50))
                    .expect("a valid policy");
            let mut ctx = (self.products.clone(), product.to_owned());
            let result = run_transaction(&self.client, &policy, &mut ctx, |session, ctx| {
                let (products, product) = (&ctx.0, ctx.1.as_str());
                Box::pin(async move {
                    // Writing first locks the document for this transaction.
                    let locked = products
                        .find_one_and_update(
                            doc! { "_id": product },
                            doc! { "$inc": { "locks": 1_i64 } },
                        )
                        .return_document(ReturnDocument::After)
                        .session(&mut *session)
                        .await?;
                    let stock = locked.and_then(|d| d.get_i64("stock").ok()).unwrap_or(0);
                    if stock <= 0 {
                        return Ok(false);
                    }
                    tokio::time::sleep(pay).await;
                    products
                        .update_one(
                            doc! { "_id": product },
                            doc! { "$set": { "stock": stock - 1 } },
                        )
                        .session(&mut *session)
                        .await?;
                    Ok(true)
                })
            })
            .await;
            match result {
                Ok(done) => Ok(done.value),
                Err(RetryError::Exhausted { attempts }) => Err(CliError::new(
                    EX_UNAVAILABLE,
                    format!(
                        "demo inventory: transaction still conflicting after {attempts} attempts"
                    ),
                )),
                Err(RetryError::Failed { error, .. }) => Err(error.into()),
            }
        })
    }
}
