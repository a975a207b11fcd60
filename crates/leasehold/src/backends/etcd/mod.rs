//! The etcd store (`etcd://`, `etcds://`, feature `etcd`).
//!
//! Each grant is a few etcd keys written by one `Txn` (layout in
//! `keys.rs`, the why in docs/etcd.md):
//!
//! - acquire: `if create_revision(e) == 0 then put(e, h, o) else
//!   (if value(e) < now then put(e, h, o) else get(e, h, o))`: one round
//!   trip, free or expired keys are taken, a live one answers busy with its
//!   holder. The fencing token is the revision of that transaction: etcd's
//!   revisions never go backwards (across release, expiry, restarts and
//!   leader changes: they are part of the replicated log).
//! - renew: `if value(o) == owner && mod_revision(o) == token && value(e) >
//!   now then put(e)`; release: the same owner checks, then delete all three.
//! - semaphore permits and reader-writer locks (`slots.rs`): read the
//!   lock's range, decide, and commit with `mod_revision(range) <= read`,
//!   retrying on conflict: still one atomic transaction per grant.
//! - waiting: one watch per backend on the prefix (`watch.rs`); a deletion
//!   wakes the key's waiters.
//!
//! Expiry is compared against this client's wall clock (etcd has no clock
//! a transaction can read): see docs/etcd.md, "Clocks".

mod connect;
mod errors;
mod keys;
mod options;
mod slots;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};

pub use options::{EtcdOptions, DEFAULT_CLOCK_MARGIN, DEFAULT_PREFIX};

use crate::backend::{
    Acquire, AcquireRequest, Backend, BoxFuture, Busy, KeyKind, Lease, LeaseInfo, PermitInfo,
};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::notify::Subscription;
use errors::{classify, timed_out, STORE};
use keys::{expired_below, expiry_value, live_above, now_ms, Grant, Kind, Layout, Slots};

/// How often a grant retries after a concurrent write changed what it read.
const CONFLICT_RETRIES: usize = 16;
/// How often a request that failed at the transport is sent again.
const TRANSPORT_RETRIES: usize = 3;

/// Lock store on an etcd cluster. Clones share the client (one HTTP/2
/// connection per member) and the watch.
#[derive(Debug, Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    layout: Layout,
    request_timeout: Duration,
    /// Subtracted from this client's clock when it judges another
    /// client's grant expired.
    clock_margin_ms: i64,
    watcher: crate::notifier::Notifier,
}

impl EtcdBackend {
    /// Connects to the members of `url`
    /// (`etcd://[user:password@]host:port[,host:port...][?prefix=P]`,
    /// `etcds://` with `ca_file`, `cert_file`, `key_file`, `domain` for TLS).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL or an unknown option,
    /// before any I/O; [`Error::Unavailable`] if no member answers (with
    /// credentials, the client authenticates at once).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, EtcdOptions::default()).await
    }

    /// As [`connect`](Self::connect), the URL's options set on top of
    /// `options`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::InvalidInput`] for bad options.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    pub async fn connect_with(url: &str, options: EtcdOptions) -> Result<Self> {
        Self::connect_to(url, options)
            .await
            .map_err(|e| e.without_secrets_of(url))
    }

    async fn connect_to(url: &str, options: EtcdOptions) -> Result<Self> {
        let target = connect::parse(url, options)?;
        let options = target.options;
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.request_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from the quorum refuses at once instead of
            // hanging until the timeout.
            .with_require_leader(true);
        if let Some((user, password)) = &options.user {
            connect = connect.with_user(user.clone(), password.clone());
        }
        if options.uses_tls() {
            connect = connect.with_tls(tls(&options)?);
        }
        let client = tokio::time::timeout(
            options.connect_timeout + options.request_timeout,
            Client::connect(&target.endpoints, Some(connect)),
        )
        .await
        .map_err(|_| timed_out("the connection"))?
        .map_err(classify)?;
        let layout = Layout::new(options.prefix());
        let watcher = watch::notifier(client.clone(), layout.clone());
        let backend = EtcdBackend {
            inner: Arc::new(Inner {
                client,
                layout,
                request_timeout: options.request_timeout,
                clock_margin_ms: i64::try_from(options.clock_margin.as_millis()).unwrap_or(0),
                watcher,
            }),
        };
        // The client dials lazily: one read now, so a cluster that is down
        // (or credentials it refuses) is reported by `connect`, not by the
        // first lock.
        let probe = GetOptions::new().with_count_only().with_serializable();
        backend.get(backend.inner.layout.all(), probe).await?;
        Ok(backend)
    }

    /// The etcd client, for an application's own requests on the same
    /// connections (the benchmark's baseline uses it).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Runs `txn`, bounded by the request timeout. A request that failed
    /// at the transport (a member down: the client's balancer still picks
    /// it until it notices) is sent again at once, up to
    /// [`TRANSPORT_RETRIES`] times: every operation here is safe to repeat
    /// (a repeated grant is the same grant, renew and release compare).
    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let deadline = tokio::time::Instant::now() + self.inner.request_timeout;
        let mut attempt = 0;
        loop {
            let mut kv = self.inner.client.kv_client();
            let answer = tokio::time::timeout_at(deadline, kv.txn(txn.clone()))
                .await
                .map_err(|_| timed_out("a transaction"))?;
            match answer {
                Err(e) if attempt < TRANSPORT_RETRIES && errors::at_transport(&e) => attempt += 1,
                other => return other.map_err(classify),
            }
        }
    }

    /// Every key under `start` (a prefix), in key order, and the revision
    /// of the read.
    async fn range(&self, start: &str) -> Result<(Vec<etcd_client::KeyValue>, i64)> {
        let mut answer = self.get(start, GetOptions::new().with_prefix()).await?;
        let revision = answer.header().map_or(0, |h| h.revision());
        Ok((answer.take_kvs(), revision))
    }

    /// A read, bounded and resent like [`txn`](Self::txn).
    async fn get(&self, key: &str, options: GetOptions) -> Result<etcd_client::GetResponse> {
        let deadline = tokio::time::Instant::now() + self.inner.request_timeout;
        let mut attempt = 0;
        loop {
            let mut kv = self.inner.client.kv_client();
            let answer = tokio::time::timeout_at(deadline, kv.get(key, Some(options.clone())))
                .await
                .map_err(|_| timed_out("a read"))?;
            match answer {
                Err(e) if attempt < TRANSPORT_RETRIES && errors::at_transport(&e) => attempt += 1,
                other => return other.map_err(classify),
            }
        }
    }

    /// Extends a grant iff owner and token match and it is live.
    async fn renew_grant(&self, grant: &Grant, lease: &Lease, ttl: Duration) -> Result<bool> {
        let now = now_ms();
        let txn = Txn::new()
            .when(
                owner_is(grant, lease.owner(), lease.token())?
                    .into_iter()
                    .chain([Compare::value(
                        grant.expiry.as_str(),
                        CompareOp::Greater,
                        live_above(now),
                    )])
                    .collect::<Vec<_>>(),
            )
            .and_then([TxnOp::put(
                grant.expiry.as_str(),
                expiry_value(now, ttl),
                None,
            )]);
        Ok(self.txn(txn).await?.succeeded())
    }

    /// Deletes a grant iff owner and token match. Whether it did.
    async fn release_grant(&self, grant: &Grant, lease: &Lease) -> Result<bool> {
        let txn = Txn::new()
            .when(owner_is(grant, lease.owner(), lease.token())?)
            .and_then([delete_grant(grant)]);
        let deleted = self.txn(txn).await?.succeeded();
        if deleted {
            self.inner.watcher.wake_local(lease.key().as_str());
        }
        Ok(deleted)
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("layout", &self.layout)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// The TLS settings of `options`, files read now (before any connection).
fn tls(options: &EtcdOptions) -> Result<etcd_client::TlsOptions> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let read = |what: &'static str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| Error::invalid_from(what, format!("cannot read {}", path.display()), e))
    };
    let mut tls = TlsOptions::new();
    if let Some(ca) = &options.ca_file {
        tls = tls.ca_certificate(Certificate::from_pem(read("ca_file", ca)?));
    }
    if let (Some(cert), Some(key)) = (&options.cert_file, &options.key_file) {
        tls = tls.identity(Identity::from_pem(
            read("cert_file", cert)?,
            read("key_file", key)?,
        ));
    }
    if let Some(domain) = &options.domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(tls)
}

/// A busy answer for `record`: its time left by this client's clock, and
/// once that is over, the rest of the clock margin (another client may
/// still hold it that long by its own clock).
fn busy(record: keys::Record, now: i64, takeover: i64) -> Busy {
    let remaining = if record.live(now) {
        record.remaining(now)
    } else {
        record.remaining(takeover)
    };
    Busy {
        holder: record.holder,
        remaining,
    }
}

/// "This grant is still `owner`'s, with this token."
fn owner_is(grant: &Grant, owner: crate::backend::OwnerId, token: u64) -> Result<Vec<Compare>> {
    let token = crate::backend::token_to_i64(token)?;
    Ok(vec![
        Compare::value(grant.owner.as_str(), CompareOp::Equal, owner.to_string()),
        Compare::mod_revision(grant.owner.as_str(), CompareOp::Equal, token),
    ])
}

fn put_grant(grant: &Grant, req: &AcquireRequest, now: i64) -> Vec<TxnOp> {
    vec![
        TxnOp::put(grant.expiry.as_str(), expiry_value(now, req.ttl()), None),
        TxnOp::put(grant.holder.as_str(), req.holder(), None),
        TxnOp::put(grant.owner.as_str(), req.owner().to_string(), None),
    ]
}

fn delete_grant(grant: &Grant) -> TxnOp {
    TxnOp::delete(
        grant.base.as_str(),
        Some(DeleteOptions::new().with_prefix()),
    )
}

/// The revision a transaction was applied at: the token of what it wrote.
fn revision(resp: &TxnResponse) -> Result<u64> {
    let revision = resp.header().map_or(0, |h| h.revision());
    crate::backend::token_from_i64(revision)
}

/// The key-values read by the `get`s of a transaction's answer, in order.
fn gets(resp: &TxnResponse) -> Vec<Vec<etcd_client::KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
            _ => None,
        })
        .collect()
}

/// The kind a kind key holds: a reader-writer lock or a semaphore (a
/// mutex has none).
fn kind_of(key: &Key, kv: &etcd_client::KeyValue) -> Result<KeyKind> {
    let stored = std::str::from_utf8(kv.value()).ok();
    match KeyKind::from_stored(stored) {
        Some(kind) if kind != KeyKind::Mutex => Ok(kind),
        _ => Err(
            crate::backend::RecordDecoder::new(STORE, key.as_str()).corrupt(format!(
                "the kind key holds {:?}",
                kv.value_str().unwrap_or("?")
            )),
        ),
    }
}

fn missing(key: &Key) -> Error {
    crate::backend::RecordDecoder::new(STORE, key.as_str()).corrupt("a grant with missing records")
}

impl Backend for EtcdBackend {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            let grant = self
                .inner
                .layout
                .slot(Kind::Mutex, req.key().as_str(), None);
            for _ in 0..CONFLICT_RETRIES {
                let now = now_ms();
                let takeover = now - self.inner.clock_margin_ms;
                // A mutex key only (no kind key): on a reader-writer lock
                // or a semaphore both branches fail and `get(kind)` says
                // which. Still one round trip.
                let kind_key = self.inner.layout.kind(req.key().as_str());
                let mutex_key = || Compare::create_revision(kind_key.as_str(), CompareOp::Equal, 0);
                let expired = Txn::new()
                    .when([
                        mutex_key(),
                        Compare::value(
                            grant.expiry.as_str(),
                            CompareOp::Less,
                            expired_below(takeover),
                        ),
                    ])
                    .and_then(put_grant(&grant, req, now))
                    .or_else([
                        TxnOp::get(grant.expiry.as_str(), None),
                        TxnOp::get(grant.holder.as_str(), None),
                        TxnOp::get(grant.owner.as_str(), None),
                    ]);
                let txn = Txn::new()
                    .when([
                        mutex_key(),
                        Compare::create_revision(grant.expiry.as_str(), CompareOp::Equal, 0),
                    ])
                    .and_then(put_grant(&grant, req, now))
                    .or_else([TxnOp::txn(expired), TxnOp::get(kind_key.as_str(), None)]);
                let resp = self.txn(txn).await?;
                if let Some(kind) = gets(&resp).first().and_then(|kvs| kvs.first()) {
                    return Ok(Acquire::OtherKind(kind_of(req.key(), kind)?));
                }
                let inner = resp.op_responses().into_iter().find_map(|op| match op {
                    TxnOpResponse::Txn(inner) => Some(inner),
                    _ => None,
                });
                let inner = match inner {
                    Some(inner) if !inner.succeeded() => inner,
                    // Free, or expired: ours, at this transaction's revision.
                    _ => return Ok(Acquire::Granted(req.granted(revision(&resp)?))),
                };
                let read = gets(&inner);
                let [e, h, o] = [0, 1, 2].map(|i| read.get(i).and_then(|kvs| kvs.first()));
                let (Some(e), Some(h), Some(o)) = (e, h, o) else {
                    return Err(missing(req.key()));
                };
                let record = keys::Record::decode(req.key().as_str(), e, h, o)?;
                if record.owner != req.owner() || !record.live(now) {
                    return Ok(Acquire::Busy(busy(record, now, takeover)));
                }
                // A repeat of a live grant: the same grant, extended.
                let lease = req.granted(record.token);
                if self.renew_grant(&grant, &lease, req.ttl()).await? {
                    return Ok(Acquire::Granted(lease));
                }
                // It expired or changed meanwhile: look again.
            }
            Err(
                Error::unavailable("etcd: too many concurrent changes to this lock")
                    .in_store(STORE),
            )
        })
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let grant = self
                .inner
                .layout
                .slot(Kind::Mutex, lease.key().as_str(), None);
            self.renew_grant(&grant, lease, ttl).await
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let grant = self
                .inner
                .layout
                .slot(Kind::Mutex, lease.key().as_str(), None);
            self.release_grant(&grant, lease).await.map(drop)
        })
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Box::pin(async move {
            let base = self.inner.layout.lock(Kind::Mutex, key.as_str());
            let (kvs, _) = self.range(&base).await?;
            let now = now_ms();
            let slots = Slots::decode(key.as_str(), &base, &kvs)?;
            let info = slots.live(now).next().map(|(_, r)| LeaseInfo {
                key: key.clone(),
                holder: r.holder.clone(),
                token: r.token,
                remaining: r.remaining(now),
            });
            Ok(info)
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        Box::pin(async move {
            let start = self.inner.layout.listing(Kind::Mutex, prefix);
            let (kvs, _) = self.range(&start).await?;
            let now = now_ms();
            let mut out = Vec::new();
            for (key, slots) in slots::by_lock(&self.inner.layout, Kind::Mutex, &kvs)? {
                for (_, r) in slots.live(now) {
                    out.push(LeaseInfo {
                        key: key.clone(),
                        holder: r.holder.clone(),
                        token: r.token,
                        remaining: r.remaining(now),
                    });
                }
            }
            out.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
            Ok(out)
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let layout = &self.inner.layout;
            let grant = layout.slot(Kind::Mutex, key.as_str(), None);
            // Whatever the key's kind: every permit, reader, writer and
            // marker too (one key is one lock).
            let mut slots_live = false;
            for kind in [Kind::Semaphore, Kind::Rw] {
                let base = layout.lock(kind, key.as_str());
                let (kvs, _) = self.range(&base).await?;
                let slots = Slots::decode(key.as_str(), &base, &kvs)?;
                slots_live |= slots.live(now_ms()).next().is_some();
            }
            let deletes = [Kind::Mutex, Kind::Semaphore, Kind::Rw].map(|kind| {
                TxnOp::delete(
                    layout.lock(kind, key.as_str()),
                    Some(DeleteOptions::new().with_prefix()),
                )
            });
            // Any later grant's revision is larger: deleting is the bump.
            let txn = Txn::new()
                .when([Compare::value(
                    grant.expiry.as_str(),
                    CompareOp::Greater,
                    live_above(now_ms()),
                )])
                .and_then(deletes.clone())
                .or_else(deletes);
            let broke = self.txn(txn).await?.succeeded() || slots_live;
            self.inner.watcher.wake_local(key.as_str());
            Ok(broke)
        })
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async move { Ok(self.inner.watcher.subscribe(key.as_str()).await) })
    }

    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let txn = Txn::new().and_then([TxnOp::put(
                self.inner.layout.announce(key.as_str()),
                "",
                None,
            )]);
            self.txn(txn).await?;
            Ok(true)
        })
    }

    fn try_acquire_permit<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(slots::try_acquire(self, req))
    }

    fn renew_permit<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let grant = slots::grant_of(&self.inner.layout, lease);
            self.renew_grant(&grant, lease, ttl).await
        })
    }

    fn release_permit<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let grant = slots::grant_of(&self.inner.layout, lease);
            self.release_grant(&grant, lease).await.map(drop)
        })
    }

    fn list_permits<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<PermitInfo>>> {
        Box::pin(slots::list(self, prefix))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.inner.watcher.close().await })
    }
}
