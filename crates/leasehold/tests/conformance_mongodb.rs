//! The shared conformance suite on MongoDB (`LEASEHOLD_TEST_MONGODB`),
//! woken by change streams and polling, one fresh collection per test; the
//! second client is another backend (its own pool) on that collection.
#![cfg(all(feature = "conformance", feature = "mongodb"))]

#[path = "support/mongodb.rs"]
mod mongodb_fixtures;

use std::sync::Arc;

use leasehold::backends::mongodb::{MongoBackend, MongoOptions};
use leasehold::conformance::TestStore;
use mongodb::bson::doc;
use mongodb::options::WriteConcern;
use mongodb_fixtures::{backend_with, options, url};

async fn store() -> Option<TestStore> {
    let url = url()?;
    let options = options();
    let backend = backend_with(&url, options.clone()).await;
    // The sweep group's passes and counts go through the backend itself.
    let sweeper = backend.clone();
    let mut store = TestStore::new(Arc::new(backend))
        .with_second_client(Arc::new(backend_with(&url, options).await))
        .with_url_at_port(|port| format!("mongodb://127.0.0.1:{port}/"));
    // A closed port that would wait a minute for a server: only a check
    // before connecting can answer.
    let down = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=60000";
    for (what, options) in [
        ("collection name", MongoOptions::new().with_collection("")),
        (
            "collection name",
            MongoOptions::new().with_collection("a$b"),
        ),
        (
            "collection name",
            MongoOptions::new().with_collection("system.locks"),
        ),
        (
            "write concern",
            MongoOptions::new().with_write_concern(WriteConcern::nodes(0)),
        ),
    ] {
        store = store.with_bad_option(what, move || {
            MongoBackend::connect_with(down, options.clone())
        });
    }
    let passes = sweeper.clone();
    Some(
        store
            .with_bad_option("store url", || MongoBackend::connect("http://localhost"))
            .with_sweep(
                move |window| {
                    let backend = passes.clone();
                    async move { backend.sweep_idle(window).await }
                },
                move |prefix| {
                    let collection = sweeper.collection().clone();
                    async move {
                        let pattern = format!("^{}", regex_escape(&prefix));
                        collection
                            .count_documents(doc! { "_id": { "$regex": pattern } })
                            .await
                            .expect("count documents")
                    }
                },
            ),
    )
}

/// `s` matched literally in a regular expression.
fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\^$.|?*+()[]{}".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

leasehold::conformance_tests!(store; options, unreachable, sweep, queue);

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
