//! etcd: a hand-written lock through the same client: `Txn` put-if-absent
//! (`create_revision == 0`), token = the revision, then an owner-checked
//! `Txn` delete. Its own keys (`leasehold-bench-raw/`), no expiry check, no
//! holder label: the least a correct etcd lock does.

use futures_util::future::BoxFuture;
use leasehold::backends::etcd::EtcdBackend;
use leasehold::etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnResponse};
use leasehold::{Locks, OwnerId};

use super::{baseline_error, Baseline, Held, Measured};
use crate::exit::CliError;

pub async fn open(url: &str) -> Result<Measured, CliError> {
    let backend = EtcdBackend::connect(url).await?;
    let client = backend.client().clone();
    Ok(Measured::with_baseline(
        Locks::new(backend),
        TwoTxns { client },
    ))
}

struct TwoTxns {
    client: Client,
}

impl TwoTxns {
    /// Sends one transaction; a driver error fails the baseline.
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, CliError> {
        self.client
            .kv_client()
            .txn(txn)
            .await
            .map_err(baseline_error)
    }
}

fn raw_key(key: &str) -> String {
    format!("leasehold-bench-raw/{key}")
}

impl Baseline for TwoTxns {
    fn name(&self) -> &'static str {
        "two etcd transactions by hand"
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
        Box::pin(async move {
            let owner = OwnerId::random().to_string();
            let k = raw_key(key);
            let txn = Txn::new()
                .when([Compare::create_revision(k.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(k.as_str(), owner.as_str(), None)]);
            let resp = self.txn(txn).await?;
            if !resp.succeeded() {
                return Ok(None);
            }
            Ok(Some(Held {
                key: key.to_owned(),
                owner,
                token: resp.header().map_or(0, |h| h.revision()),
            }))
        })
    }

    fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>> {
        Box::pin(async move {
            let k = raw_key(&held.key);
            let txn = Txn::new()
                .when([Compare::value(
                    k.as_str(),
                    CompareOp::Equal,
                    held.owner.as_str(),
                )])
                .and_then([TxnOp::delete(k.as_str(), None)]);
            self.txn(txn).await?;
            Ok(())
        })
    }
}
