//! etcd: a hand-written lock through the same client: `Txn` put-if-absent
//! (`create_revision == 0`), token = the revision, then an owner-checked
//! `Txn` delete. Its own keys (`leasehold-bench-raw/`), no holder label.
//! Two of them: one with no lease (the least two transactions can do, but
//! a crashed holder's key stays forever), and one whose keys ride one
//! lease granted up front, as etcd's `clientv3/concurrency` `Mutex` puts
//! its key on its session's lease: the least a lock that expires does
//! (measured: the lease itself costs nothing, docs/etcd.md, "What a grant
//! sends").

use futures_util::future::BoxFuture;
use leasehold::backends::etcd::EtcdBackend;
use leasehold::etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnResponse};
use leasehold::{Locks, OwnerId};

use super::{baseline_error, Baseline, Held, Measured};
use crate::exit::CliError;

pub async fn open(url: &str) -> Result<Measured, CliError> {
    let backend = EtcdBackend::connect(url).await?;
    let client = backend.client().clone();
    // Long enough for any bench run, so it needs no keep-alive; it expires
    // with the keys of an interrupted run.
    let session = client
        .lease_client()
        .grant(SESSION_TTL_SECS, None)
        .await
        .map_err(baseline_error)?;
    let mut measured = Measured::with_baseline(
        Locks::new(backend),
        TwoTxns {
            client: client.clone(),
            lease: None,
        },
    );
    measured.baselines.push(Box::new(TwoTxns {
        client,
        lease: Some(session.id()),
    }));
    Ok(measured)
}

/// The session lease's ttl: an hour.
const SESSION_TTL_SECS: i64 = 3600;

struct TwoTxns {
    client: Client,
    /// The lease every grant is put on, if any.
    lease: Option<i64>,
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
        match self.lease {
            None => "two etcd transactions by hand",
            Some(_) => "the same, keys on one lease",
        }
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
        Box::pin(async move {
            let owner = OwnerId::random().to_string();
            let k = raw_key(key);
            let txn = Txn::new()
                .when([Compare::create_revision(k.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    k.as_str(),
                    owner.as_str(),
                    self.lease.map(|id| PutOptions::new().with_lease(id)),
                )]);
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
