//! The etcd store (`etcd://`, `etcds://`, feature `etcd`).
//!
//! Each grant is one etcd key attached to an etcd lease of its own
//! (layout in `keys.rs`, leases in `leases.rs`, transactions in `txns.rs`,
//! the why in docs/etcd.md), so etcd decides expiry:
//!
//! - acquire: a lease (a spare granted ahead, `spares.rs`, or
//!   `LeaseGrant(ttl)`), then `if create_revision(key) == 0 then
//!   put(key, lease) else get(key)`. The fencing token is the key's
//!   `create_revision`: etcd's revisions never go backwards (across
//!   release, expiry, restarts and leader changes: they are part of the
//!   replicated log).
//! - renew: a keep-alive of the grant's lease (owner and token read first),
//!   or, for a longer ttl, a fresh lease and a re-put that keeps the key;
//!   release: delete iff owner and token match, then revoke the lease.
//! - semaphore permits and reader-writer locks (`slots.rs`): read the
//!   lock's range, decide, and commit with `mod_revision(range) <= read`,
//!   retrying on conflict (a failed commit reads the range in its else
//!   branch); a lock last seen empty is claimed unread, comparing that its
//!   range is empty (`hints.rs`): still one atomic transaction per grant.
//! - waiting: one watch per backend on the prefix (`watch.rs`); a deletion
//!   (release, or etcd's expiry of a lease) wakes the key's waiters.
//! - fair waiting (`queue.rs`): a mutex waiter that queues keeps an entry
//!   on a lease of its own; a release, or an attempt that finds the key
//!   free, hands it to the head in one transaction and tells the head
//!   alone.

mod connect;
mod errors;
mod granted;
mod hints;
mod keys;
mod leases;
mod options;
mod queue;
mod slots;
mod spares;
mod sweep;
mod txns;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

pub use options::{EtcdOptions, DEFAULT_PREFIX};

use crate::backend::{
    listing, Acquire, AcquireRequest, Backend, BoxFuture, Busy, KeyKind, Lease, LeaseInfo,
};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::notify::Subscription;
use errors::{classify, timed_out, STORE};
use keys::{Kind, Layout, Record};

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
    watcher: crate::notifier::Notifier,
    /// The etcd lease of each grant this backend made or extended, so a
    /// renewal is one keep-alive, without reading the record first.
    leases: leases::Known,
    /// Leases granted ahead of the mutex grants that will need them.
    spares: spares::Spares,
    /// What each permit or reader-writer lock looked like last time.
    hints: hints::Hints,
    /// When the next pass over idle kind records is due (sweep.rs).
    sweeper: sweep::Sweeper,
    /// The leases of this backend's waiters' queue entries (queue.rs).
    entries: queue::EntryLeases,
}

impl EtcdBackend {
    connect_methods! {
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
        connect;

        /// As [`connect`](Self::connect), the URL's options set on top of
        /// `options`.
        ///
        /// # Errors
        /// As [`connect`](Self::connect); [`Error::InvalidInput`] for bad options.
        ///
        /// # Cancel safety
        /// Cancel safe: nothing is written.
        connect_with(options: EtcdOptions);
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
                watcher,
                leases: leases::Known::default(),
                spares: spares::Spares::default(),
                hints: hints::Hints::default(),
                sweeper: sweep::Sweeper::new(options.idle_window),
                entries: queue::EntryLeases::default(),
            }),
        };
        // The client dials lazily: one read now, so a cluster that is down
        // (or credentials it refuses) is reported by `connect`, not by the
        // first lock.
        let probe = GetOptions::new().with_count_only().with_serializable();
        backend.get(backend.inner.layout.all(), probe).await?;
        Ok(backend)
    }

    /// How often kind records are swept: a pass at most every half window
    /// (`None`: kept forever). See [`EtcdOptions::with_idle_window`].
    pub fn idle_window(&self) -> Option<Duration> {
        self.inner.sweeper.window()
    }

    /// A sweep pass now (what the background passes after releases do):
    /// deletes the kind record of every key with no grant left and no
    /// release since the first earlier pass that began at least a window
    /// ago (none without a window); how many went. See docs/storage.md.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if the cluster does not answer; a pass that
    /// fails part way leaves the rest for the next one.
    ///
    /// # Cancel safety
    /// Cancel safe: each deletion is a transaction of its own.
    pub async fn sweep_idle(&self) -> Result<u64> {
        self.sweep_kinds().await
    }

    /// The etcd client, for an application's own requests on the same
    /// connections (the benchmark's baseline uses it).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Runs one request, bounded by the request timeout. A request that
    /// failed at the transport (a member down: the client's balancer still
    /// picks it until it notices) is sent again at once, up to
    /// [`TRANSPORT_RETRIES`] times: every request here is safe to repeat
    /// (a repeated grant is the same grant, renew and release compare, a
    /// lease granted twice leaves one to expire unused).
    async fn call<T, F, Fut>(&self, what: &'static str, request: F) -> Result<T>
    where
        F: Fn(&Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.inner.request_timeout;
        let mut attempt = 0;
        loop {
            let answer = tokio::time::timeout_at(deadline, request(&self.inner.client))
                .await
                .map_err(|_| timed_out(what))?;
            match answer {
                Err(e) if attempt < TRANSPORT_RETRIES && errors::at_transport(&e) => attempt += 1,
                other => return other.map_err(classify),
            }
        }
    }

    /// Runs `txn` (see [`call`](Self::call)).
    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.call("a transaction", |client| {
            let (mut kv, txn) = (client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// A read (see [`call`](Self::call)); linearizable unless `options`
    /// say otherwise.
    async fn get(&self, key: &str, options: GetOptions) -> Result<etcd_client::GetResponse> {
        self.call("a read", |client| {
            let (mut kv, options) = (client.kv_client(), options.clone());
            async move { kv.get(key, Some(options)).await }
        })
        .await
    }

    /// Every key under `start` (a prefix), in key order, and the revision
    /// of the read.
    async fn range(&self, start: &str) -> Result<(Vec<etcd_client::KeyValue>, i64)> {
        let mut answer = self.get(start, GetOptions::new().with_prefix()).await?;
        let revision = answer.header().map_or(0, |h| h.revision());
        Ok((answer.take_kvs(), revision))
    }

    /// The record at etcd key `etcd_key` (of lock `key`), if any.
    async fn record(&self, key: &Key, etcd_key: &str) -> Result<Option<Record>> {
        self.first_record(key, etcd_key, GetOptions::new()).await
    }

    /// The mutex grant of `key`, if any (its range holds at most one).
    async fn mutex_record(&self, key: &Key) -> Result<Option<Record>> {
        let range = self.inner.layout.lock(Kind::Mutex, key.as_str());
        let first = GetOptions::new().with_prefix().with_limit(1);
        self.first_record(key, &range, first).await
    }

    /// The first record `options` read at `etcd_key`, if any.
    async fn first_record(
        &self,
        key: &Key,
        etcd_key: &str,
        options: GetOptions,
    ) -> Result<Option<Record>> {
        let mut answer = self.get(etcd_key, options).await?;
        let kvs = answer.take_kvs();
        kvs.first()
            .map(|kv| Record::decode(key.as_str(), kv))
            .transpose()
    }

    /// Extends `record` (at `etcd_key`, read just before) to at least
    /// `ttl` from now: a keep-alive of its lease, and if that lease is
    /// shorter than `ttl`, a fresh lease the key moves to (same key, same
    /// token). The lease's new TTL, or `None` if it is gone: an expired
    /// grant is never brought back (the keep-alive of a lapsed lease fails,
    /// and the move compares the lease that was just kept alive).
    async fn extend(
        &self,
        etcd_key: &str,
        record: &Record,
        ttl: Duration,
    ) -> Result<Option<Duration>> {
        if !self.keep_alive(record.lease).await? {
            return Ok(None);
        }
        // A mutex grant is known by its lock's range, whichever of its two
        // places it is in (`Layout::grant`).
        let known_as = self.inner.layout.known_as(etcd_key);
        let grant = leases::GrantId::new(known_as, record.owner, record.token);
        if leases::ttl_secs(ttl) <= leases::ttl_secs(record.ttl) {
            self.inner.leases.remember(grant, record.lease, record.ttl);
            return Ok(Some(record.ttl));
        }
        let fresh = self.grant_lease(ttl).await?;
        let value = keys::value(record.owner, fresh.ttl, &record.holder);
        let moved = self
            .txn(txns::repoint(etcd_key, record, value, fresh.id)?)
            .await?
            .succeeded();
        if moved {
            self.let_go(record.lease);
            self.inner.spares.in_use(fresh, leases::ttl_secs(ttl));
            self.inner.leases.remember(grant, fresh.id, fresh.ttl);
            Ok(Some(fresh.ttl))
        } else {
            self.revoke_later(fresh.id);
            Ok(None)
        }
    }

    /// Renews the grant at `etcd_key` iff owner and token match and it is
    /// live.
    async fn renew_grant(&self, etcd_key: &str, lease: &Lease, ttl: Duration) -> Result<bool> {
        let grant = leases::GrantId::of(etcd_key, lease);
        if let Some(known) = self.inner.leases.get(&grant) {
            if leases::ttl_secs(ttl) <= leases::ttl_secs(known.ttl) {
                // Our own grant's lease: alive iff the grant is (only a
                // release deletes the key without revoking the lease, and
                // a release forgets it).
                let alive = self.keep_alive(known.id).await?;
                if !alive {
                    self.inner.leases.forget(&grant);
                }
                return Ok(alive);
            }
        }
        let found = if lease.slot().is_none() {
            // A mutex grant: in either place of its lock's range.
            let (kvs, _) = self.range(etcd_key).await?;
            grant_among(lease.key(), &kvs, lease.owner(), lease.token())?
        } else {
            self.record(lease.key(), etcd_key)
                .await?
                .filter(|r| r.owner == lease.owner() && r.token == lease.token())
                .map(|r| (etcd_key.to_owned(), r))
        };
        let Some((at, record)) = found else {
            return Ok(false);
        };
        Ok(self.extend(&at, &record, ttl).await?.is_some())
    }

    /// Deletes the grant at `etcd_key` iff owner and token match, then
    /// revokes its lease (in the background: it holds nothing now).
    async fn release_grant(&self, etcd_key: &str, lease: &Lease) -> Result<bool> {
        let place = self
            .inner
            .leases
            .forget(&leases::GrantId::of(etcd_key, lease));
        if lease.key_kind() == KeyKind::Mutex {
            // Where a hand-off put it, if one did (else the first place).
            let at = place.as_deref().unwrap_or(etcd_key);
            return self
                .release_mutex(lease.key(), at, lease.owner(), lease.token())
                .await;
        }
        // A permit's or reader-writer grant's kind record (a mutex has none).
        let kind = lease
            .key_kind()
            .stored()
            .map(|stored| (self.inner.layout.kind(lease.key().as_str()), stored));
        let txn = txns::release(etcd_key, lease.owner(), lease.token(), kind, None)?;
        let resp = self.txn(txn).await?;
        if !resp.succeeded() {
            return Ok(false);
        }
        self.let_go_deleted(&resp);
        self.inner.watcher.wake_local(lease.key().as_str());
        // The key may have no grant left: its kind record may go.
        self.poke_sweeper();
        Ok(true)
    }

    /// Notes that `lease` (at `etcd_key`) is on etcd lease `on`, granted
    /// for a ttl of `asked_secs` for this grant alone (a spare, or a lease
    /// granted inline): recycled at the grant's release.
    fn remember(&self, etcd_key: &str, lease: &Lease, on: granted::Granted, asked_secs: i64) {
        let grant = leases::GrantId::of(etcd_key, lease);
        self.inner.leases.remember(grant, on.id, on.ttl);
        self.inner.spares.in_use(on, asked_secs);
    }

    /// Lets go, in the background, of the leases of the records a
    /// transaction deleted and brought back (a released grant's): each is
    /// recycled or revoked ([`let_go`](Self::let_go)).
    fn let_go_deleted(&self, resp: &TxnResponse) {
        for op in resp.op_responses() {
            if let TxnOpResponse::Delete(deleted) = op {
                for kv in deleted.prev_kvs() {
                    self.let_go(kv.lease());
                }
            }
        }
    }

    /// A busy answer naming `record`'s holder and the time left on its
    /// lease (zero if it just ended).
    async fn busy(&self, record: &Record) -> Result<Busy> {
        Ok(Busy {
            holder: record.holder.clone(),
            remaining: self.time_left(record.lease).await?.unwrap_or_default(),
        })
    }

    /// Force-release of the records under `etcd_key` (a mutex's range):
    /// revokes each one's lease (which deletes it with everything else on
    /// that lease: one grant). Whether a live grant was broken. Acts on
    /// the raw key-values, so a damaged record can be broken too.
    async fn break_record(&self, etcd_key: &str) -> Result<bool> {
        let (kvs, _) = self.range(etcd_key).await?;
        let mut broke = false;
        for kv in &kvs {
            broke |= self.break_kv(kv).await?;
        }
        Ok(broke)
    }

    /// Force-release of one record read as `kv`; see [`break_record`](Self::break_record).
    async fn break_kv(&self, kv: &etcd_client::KeyValue) -> Result<bool> {
        let broke = kv.lease() != 0 && self.revoke(kv.lease()).await?;
        if !broke {
            // Its lease ended (etcd is deleting it) or it never had one.
            let etcd_key = String::from_utf8_lossy(kv.key());
            self.txn(txns::delete_if_created_at(&etcd_key, kv.create_revision()))
                .await?;
        }
        Ok(broke)
    }

    /// Force-release of every permit, reader, writer and writer's marker
    /// of `key` (one key is one lock: whatever its kind). Whether a live
    /// one was broken.
    async fn break_slots(&self, key: &Key) -> Result<bool> {
        let mut broke = false;
        for kind in [Kind::Semaphore, Kind::Rw] {
            let (kvs, _) = self
                .range(&self.inner.layout.lock(kind, key.as_str()))
                .await?;
            for kv in &kvs {
                broke |= self.break_kv(kv).await?;
            }
        }
        Ok(broke)
    }
}

/// `owner`'s grant with `token` among `kvs` (a mutex's range, read back),
/// and the etcd key it is at.
fn grant_among(
    key: &Key,
    kvs: &[etcd_client::KeyValue],
    owner: crate::backend::OwnerId,
    token: u64,
) -> Result<Option<(String, Record)>> {
    Ok(grant_of(key, kvs, owner)?.filter(|(_, record)| record.token == token))
}

/// `owner`'s grant among `kvs` (a mutex's range, read back), whatever its
/// token (an owner is one acquisition: it has one grant at most), and the
/// etcd key it is at.
fn grant_of(
    key: &Key,
    kvs: &[etcd_client::KeyValue],
    owner: crate::backend::OwnerId,
) -> Result<Option<(String, Record)>> {
    for kv in kvs {
        let record = Record::decode(key.as_str(), kv)?;
        if record.owner == owner {
            let at = String::from_utf8_lossy(kv.key()).into_owned();
            return Ok(Some((at, record)));
        }
    }
    Ok(None)
}

/// The kind a kind key holds: a reader-writer lock or a semaphore (a
/// mutex key has none).
fn kind_of(key: &Key, kv: &etcd_client::KeyValue) -> Result<KeyKind> {
    let stored = std::str::from_utf8(kv.value()).ok();
    match KeyKind::from_stored(stored) {
        Some(kind) if kind != KeyKind::Mutex => Ok(kind),
        _ => Err(
            crate::backend::RecordDecoder::new(STORE, key.as_str()).corrupt(format!(
                "the kind key holds {:?}",
                String::from_utf8_lossy(kv.value())
            )),
        ),
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

/// The revision a transaction was applied at: the token of what it wrote.
fn revision(resp: &TxnResponse) -> Result<u64> {
    let revision = resp.header().map_or(0, |h| h.revision());
    crate::backend::token_from_i64(revision)
}

impl Backend for EtcdBackend {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            if req.permit_kind().is_some() {
                return slots::try_acquire(self, req).await;
            }
            // The lease first: the grant's expiry is etcd's, from before
            // the transaction that attaches the key to it. A spare when
            // there is one (spares.rs), its age off the ttl it promises.
            let (lease, promised) = self.lease_for_grant(req.ttl()).await?;
            let outcome = self.acquire_mutex(req, lease, promised).await;
            match &outcome {
                // The lease is the grant's now: a spare for the next one.
                Ok((_, true)) => self.refill_later(req.ttl()),
                // Busy or a repeat: every transaction's compare failed, so
                // the lease holds no key and serves a later attempt.
                Ok((_, false)) => self.give_back(lease),
                // A transaction's answer may have been lost after it
                // attached the key: revoking the lease deletes that key.
                Err(_) => self.revoke_later(lease.granted.id),
            }
            outcome.map(|(acquire, _)| acquire)
        })
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let etcd_key = self.inner.layout.grant(lease);
            self.renew_grant(&etcd_key, lease, ttl).await
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let etcd_key = self.inner.layout.grant(lease);
            self.release_grant(&etcd_key, lease).await.map(drop)
        })
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Box::pin(async move {
            let Some(record) = self.mutex_record(key).await? else {
                return Ok(None);
            };
            Ok(self.time_left(record.lease).await?.map(|remaining| {
                LeaseInfo::mutex(key.clone(), record.holder, record.token, remaining)
            }))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        Box::pin(async move {
            let start = self.inner.layout.listing(Kind::Mutex, prefix);
            let (kvs, _) = self.range(&start).await?;
            let mut out = Vec::new();
            for (key, slots) in slots::by_lock(&self.inner.layout, Kind::Mutex, &kvs)? {
                for (_, record) in slots.grants {
                    if let Some(remaining) = self.time_left(record.lease).await? {
                        out.push(LeaseInfo::mutex(
                            key.clone(),
                            record.holder,
                            record.token,
                            remaining,
                        ));
                    }
                }
            }
            Ok(listing(out, slots::list(self, prefix).await?))
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            // Any later grant's revision is larger: deleting is the bump.
            let etcd_key = self.inner.layout.slot(Kind::Mutex, key.as_str(), None);
            let broke_mutex = self.break_record(&etcd_key).await?;
            let broke = self.break_slots(key).await? || broke_mutex;
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

    fn queues(&self) -> bool {
        true
    }

    fn hands_over_locally(&self) -> bool {
        true
    }

    fn release_to<'a>(
        &'a self,
        lease: &'a Lease,
        next: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Option<Lease>>> {
        Box::pin(self.release_mutex_to(lease, next))
    }

    fn leave_queue<'a>(
        &'a self,
        key: &'a Key,
        owner: crate::backend::OwnerId,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.leave(key, owner))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            for id in self.inner.spares.drain() {
                let _ = self.revoke(id).await;
            }
            self.inner.watcher.close().await
        })
    }
}
