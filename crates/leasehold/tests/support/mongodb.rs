//! MongoDB fixtures: the test server, a fresh collection per test (so tests
//! run in parallel on one server), a resource collection.
#![allow(dead_code)] // each test crate uses its own subset

use std::time::Duration;

use leasehold::backend::AcquireRequest;
use leasehold::backends::mongodb::{MongoBackend, MongoOptions};
use leasehold::conformance::server_url;
use leasehold::Key;
use mongodb::bson::{doc, Document};

/// The test server (`LEASEHOLD_TEST_MONGODB`); `None` skips.
pub fn url() -> Option<String> {
    server_url("LEASEHOLD_TEST_MONGODB")
}

/// A fresh collection per test.
pub fn options() -> MongoOptions {
    MongoOptions::new().with_collection(format!("locks_{:016x}", rand::random::<u64>()))
}

pub async fn backend_with(url: &str, options: MongoOptions) -> MongoBackend {
    MongoBackend::connect_with(url, options)
        .await
        .expect("the test server is reachable")
}

/// A backend on a fresh collection of the test server; `None` skips.
pub async fn fresh_backend() -> Option<MongoBackend> {
    Some(backend_with(&url()?, options()).await)
}

pub fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

pub fn request(k: &Key, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(k.clone(), ttl, "test").unwrap()
}

/// A fresh `products` collection with one document `sku` (stock 10).
pub async fn products(b: &MongoBackend) -> mongodb::Collection<Document> {
    let coll = b
        .collection()
        .client()
        .database("leasehold")
        .collection::<Document>(&format!("products_{:016x}", rand::random::<u64>()));
    coll.insert_one(doc! { "_id": "sku", "stock": 10_i64, "version": 0_i64, "fence": 0_i64 })
        .await
        .unwrap();
    coll
}
