//! Model-based property test of the lease protocol on SQLite.
//!
//! SQLite's clock is the host's, which a test cannot stop or move, so this
//! variant leaves time out: ttls are minutes long, no lease expires during
//! a case, and remaining ttls are compared within a margin. Everything else
//! (grants, busy answers, tokens, renew/release by owner and token,
//! force-release, crashed clients, invalid input) is compared exactly.
//! Expiry on SQLite is covered by the conformance suite in real time.
#![cfg(feature = "sqlite")]

mod lease_model;

use std::sync::Arc;

use lease_model::{ops, run, Clock, Tokens};
use leasehold::backends::sqlite::SqliteBackend;
use leasehold::Backend;
use proptest::prelude::*;

#[test]
fn sqlite_store_matches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // One database for all cases; each case has its own key prefix.
    let backend: Arc<dyn Backend> = Arc::new(
        rt.block_on(SqliteBackend::open(dir.path().join("locks.db")))
            .unwrap(),
    );
    proptest!(ProptestConfig::with_cases(48), |(ops in ops(Clock::Real))| {
        rt.block_on(run(backend.clone(), Clock::Real, Tokens::Next, &format!("case{:016x}:", rand::random::<u64>()), &ops));
    });
}
