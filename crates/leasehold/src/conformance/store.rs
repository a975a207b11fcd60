//! A backend under test and the hooks its factory registers for the
//! properties that need more than the backend: another client, bad options,
//! an unreachable address, a way to block the store, sweep passes.

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, BoxFuture};
use crate::backends::polling::PollingOnly;
use crate::error::Result;
use crate::key::Key;
use crate::lock::Locks;

/// What a store can do beyond the required protocol.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Capabilities {
    /// Releases wake subscribed waiters (not only polling).
    pub notifies: bool,
    /// How coarse the store's expiry is: zero for a store that ends a
    /// lease at its ttl to the millisecond; etcd rounds ttls up to whole
    /// seconds (see [`TestStore::with_expiry_granularity`]).
    pub expiry_granularity: Duration,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            notifies: true,
            expiry_granularity: Duration::ZERO,
        }
    }
}

/// Ends a block made by a [`TestStore::with_blocker`] hook.
pub type Unblock = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// An [`Unblock`] that runs `end`.
pub fn unblock<F>(end: impl FnOnce() -> F + Send + 'static) -> Unblock
where
    F: Future<Output = ()> + Send + 'static,
{
    Box::new(move || Box::pin(end()))
}

type Attempt = Box<dyn Fn() -> BoxFuture<'static, Result<()>> + Send + Sync>;
type Blocker = Box<dyn Fn(Key) -> BoxFuture<'static, Unblock> + Send + Sync>;
type Pass = Box<dyn Fn(Duration) -> BoxFuture<'static, Result<u64>> + Send + Sync>;
type Records = Box<dyn Fn(String) -> BoxFuture<'static, u64> + Send + Sync>;

/// A backend under test, with whatever must live as long as it (a temp dir,
/// a server handle) and the hooks of the properties beyond the protocol.
pub struct TestStore {
    /// The backend.
    pub backend: Arc<dyn Backend>,
    /// What it can do.
    pub caps: Capabilities,
    second: Option<Arc<dyn Backend>>,
    pub(super) bad_options: Vec<(&'static str, Attempt)>,
    url_at_port: Option<Box<dyn Fn(u16) -> String + Send + Sync>>,
    blocker: Option<Blocker>,
    sweep: Option<(Pass, Records)>,
    _keep: Vec<Box<dyn Any + Send + Sync>>,
}

impl TestStore {
    /// A store with default capabilities.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        TestStore {
            backend,
            caps: Capabilities::default(),
            second: None,
            bad_options: Vec::new(),
            url_at_port: None,
            blocker: None,
            sweep: None,
            _keep: Vec::new(),
        }
    }

    /// Declares that the store cannot notify waiters.
    pub fn without_notifications(mut self) -> Self {
        self.caps.notifies = false;
        self
    }

    /// The same store, its waiters polling: the backend is wrapped in
    /// [`PollingOnly`] (the second client is not, as another process's
    /// would not be).
    pub fn polling_only(mut self) -> Self {
        self.backend = Arc::new(PollingOnly::new(self.backend));
        self.without_notifications()
    }

    /// Declares that the store ends leases only to within `granularity`:
    /// it rounds a ttl up to a multiple of it and may free an expired
    /// lease up to that much later. The properties that wait for a short
    /// lease to run out wait that much longer ([`Self::past_expiry`]); a
    /// store may round a ttl up (never down) and report the ttl it
    /// enforces ([`Lease::enforced_for`](crate::backend::Lease::enforced_for)).
    pub fn with_expiry_granularity(mut self, granularity: Duration) -> Self {
        self.caps.expiry_granularity = granularity;
        self
    }

    /// How long to wait for a short lease to be surely gone, where a store
    /// with exact expiry needs `exact`: on a coarse store, `exact` rounded
    /// up to the granularity, plus one granularity for the store's own
    /// delay in freeing it. The one place the suite knows of granularity.
    pub fn past_expiry(&self, exact: Duration) -> Duration {
        let g = self.caps.expiry_granularity;
        if g.is_zero() {
            return exact;
        }
        let steps = exact.as_nanos().div_ceil(g.as_nanos()).max(1);
        g * u32::try_from(steps + 1).unwrap_or(u32::MAX)
    }

    /// Keeps `value` alive as long as the store (e.g. a `TempDir`).
    pub fn keeping(mut self, value: impl Any + Send + Sync) -> Self {
        self._keep.push(Box::new(value));
        self
    }

    /// Another client of the same store (its own connections, as another
    /// process has): the cross-client properties take and release keys
    /// through it and watch the backend under test.
    pub fn with_second_client(mut self, backend: Arc<dyn Backend>) -> Self {
        self.second = Some(backend);
        self
    }

    /// Registers a way to open the store with an option that must be
    /// rejected as [`Error::InvalidInput`](crate::Error::InvalidInput) for
    /// `what` before any I/O (group `options`). Point `open` at an address
    /// where nothing answers, so that only a check before I/O can answer in
    /// time.
    pub fn with_bad_option<F, T>(
        mut self,
        what: &'static str,
        open: impl Fn() -> F + Send + Sync + 'static,
    ) -> Self
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let attempt: Attempt = Box::new(move || {
            let opening = open();
            Box::pin(async move { opening.await.map(drop) })
        });
        self.bad_options.push((what, attempt));
        self
    }

    /// How to name this store at `127.0.0.1:port`, as
    /// [`Locks::open`] takes it (group `unreachable`).
    pub fn with_url_at_port(mut self, url: impl Fn(u16) -> String + Send + Sync + 'static) -> Self {
        self.url_at_port = Some(Box::new(url));
        self
    }

    /// Registers how to block `key` at the store (group `blocking`): the
    /// hook returns once an acquisition of the key would have to wait for
    /// another transaction (a row lock, a database write lock), and gives
    /// back what ends the block.
    pub fn with_blocker<F>(mut self, block: impl Fn(Key) -> F + Send + Sync + 'static) -> Self
    where
        F: Future<Output = Unblock> + Send + 'static,
    {
        self.blocker = Some(Box::new(move |key| Box::pin(block(key))));
        self
    }

    /// Registers the store's sweep (group `sweep`): `pass(window)` runs
    /// one pass that deletes the records of keys idle for at least
    /// `window` (answering how many; the properties ask 1 ms, and an hour
    /// for what must stay), `records` counts the records the store keeps
    /// for keys that start with a prefix, whatever their kind.
    pub fn with_sweep<P, R>(
        mut self,
        pass: impl Fn(Duration) -> P + Send + Sync + 'static,
        records: impl Fn(String) -> R + Send + Sync + 'static,
    ) -> Self
    where
        P: Future<Output = Result<u64>> + Send + 'static,
        R: Future<Output = u64> + Send + 'static,
    {
        self.sweep = Some((
            Box::new(move |window| Box::pin(pass(window))),
            Box::new(move |prefix| Box::pin(records(prefix))),
        ));
        self
    }

    pub(super) fn locks(&self) -> Locks {
        Locks::from_arc(self.backend.clone()).with_holder_label("conformance")
    }

    pub(super) fn second_arc(&self) -> Arc<dyn Backend> {
        self.second
            .clone()
            .expect("the store's factory names a second client (TestStore::with_second_client)")
    }

    /// A `Locks` on the second client, as another process has.
    pub(super) fn second_locks(&self) -> Locks {
        Locks::from_arc(self.second_arc()).with_holder_label("conformance")
    }

    pub(super) fn second_client(&self) -> &dyn Backend {
        self.second
            .as_deref()
            .expect("the store's factory names a second client (TestStore::with_second_client)")
    }

    pub(super) fn url_at_port(&self, port: u16) -> String {
        let url = self
            .url_at_port
            .as_ref()
            .expect("group `unreachable` needs TestStore::with_url_at_port");
        url(port)
    }

    fn sweep_hooks(&self) -> &(Pass, Records) {
        self.sweep
            .as_ref()
            .expect("group `sweep` needs TestStore::with_sweep")
    }

    /// One pass with the shortest window (1 ms).
    pub(super) async fn sweep(&self) -> Result<u64> {
        self.sweep_with(Duration::from_millis(1)).await
    }

    /// One pass deleting the records of keys idle for at least `window`.
    pub(super) async fn sweep_with(&self, window: Duration) -> Result<u64> {
        (self.sweep_hooks().0)(window).await
    }

    pub(super) async fn records(&self, prefix: &str) -> u64 {
        (self.sweep_hooks().1)(prefix.to_owned()).await
    }

    pub(super) async fn block(&self, key: &Key) -> Unblock {
        let block = self
            .blocker
            .as_ref()
            .expect("group `blocking` needs TestStore::with_blocker");
        block(key.clone()).await
    }
}
