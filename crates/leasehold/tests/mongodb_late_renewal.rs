//! A renewal the server applies late never moves a lease's expiry earlier.
//!
//! The MongoDB store writes an expiry it computed from its estimate of the
//! server's clock before sending the update. A renewal held on the way (a
//! congested path, a proxy, a process stopped between computing and
//! sending) can reach the server after a later renewal of the same lease,
//! which the holder was told succeeded and counted its deadline from.
//! Applied as it was written, the late one would set the expiry back to
//! its older "now" plus the ttl, before the holder's deadline, and another
//! owner could take the key while the holder still trusts its grant (the
//! torture soak found this: a paused holder's timed-out renewal, delivered
//! after its retry, let the next grant in 60 ms before the holder's
//! deadline).
//!
//! Against `LEASEHOLD_TEST_MONGODB` (skipped when unset, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`), through a proxy that holds the bytes a
//! client sends while its gate is closed and delivers them on opening.
#![cfg(feature = "mongodb")]

#[path = "support/mongodb.rs"]
mod mongodb_fixtures;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::mongodb::MongoBackend;
use leasehold::{Backend, Lease};
use mongodb_fixtures::{backend_with, key, options, request, url};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards to `upstream`; while the gate is closed, bytes from clients
/// wait in the proxy (counted in `held`) and go on when it opens.
struct GateProxy {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    held: Arc<AtomicUsize>,
}

impl GateProxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, gate) = watch::channel(true);
        let held = Arc::new(AtomicUsize::new(0));
        let counter = held.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let (mut gate, counter) = (gate.clone(), counter.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from_client.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if !*gate.borrow() {
                            counter.fetch_add(n, Ordering::SeqCst);
                            if gate.wait_for(|open| *open).await.is_err() {
                                return;
                            }
                        }
                        if to_server.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                });
            }
        });
        GateProxy { addr, open, held }
    }

    fn close(&self) {
        self.open.send_replace(false);
    }

    fn open(&self) {
        self.open.send_replace(true);
    }

    /// Waits until the proxy holds bytes a client sent behind the gate.
    async fn holding_a_request(&self) {
        let waited = tokio::time::timeout(Duration::from_secs(5), async {
            while self.held.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "the renewal never reached the proxy");
    }
}

/// The test server's address, from its URL (`mongodb://HOST:PORT/...`).
fn server_addr(url: &str) -> SocketAddr {
    let rest = url.strip_prefix("mongodb://").expect("a mongodb:// URL");
    let host_port = rest.split(['/', '?']).next().unwrap();
    host_port
        .parse()
        .expect("the test server's URL names IP:PORT")
}

/// A second client of the same collection, through the gate.
async fn through_gate(url: &str, collection_of: &MongoBackend) -> (GateProxy, MongoBackend) {
    let proxy = GateProxy::start(server_addr(url)).await;
    let proxied = format!("mongodb://{}/?directConnection=true", proxy.addr);
    let name = collection_of.collection().name().to_owned();
    let backend = backend_with(&proxied, options().with_collection(name)).await;
    (proxy, backend)
}

/// Renews `lease` on `late` with the update held in the proxy, renews it
/// on `direct` `gap` later, then lets the held update through.
async fn renew_late_then_deliver(
    direct: &MongoBackend,
    late: Arc<MongoBackend>,
    proxy: &GateProxy,
    lease: &Lease,
    ttl: Duration,
    gap: Duration,
) {
    proxy.close();
    let held = {
        let lease = lease.clone();
        tokio::spawn(async move { late.renew(&lease, ttl).await })
    };
    proxy.holding_a_request().await;
    tokio::time::sleep(gap).await;
    let renewed = direct.renew(lease, ttl).await;
    assert!(
        renewed.expect("the store answers"),
        "the prompt renewal succeeds"
    );
    proxy.open();
    held.await
        .unwrap()
        .expect("the held renewal is answered once delivered");
}

/// Another owner asks for the lock once the late renewal's expiry (its
/// older "now" plus the ttl) has passed, but the prompt one's has not.
async fn assert_still_held(direct: &MongoBackend, req: &AcquireRequest) {
    let answer = direct.try_acquire(req).await;
    match answer.expect("the store answers") {
        Acquire::Busy(busy) => assert!(
            busy.remaining > Duration::from_millis(300),
            "the holder's renewal is still live: {busy:?}"
        ),
        Acquire::Granted(l) => panic!(
            "granted token {} while the holder's last renewal had not expired: \
             the late renewal moved the expiry back",
            l.token()
        ),
        other => panic!("the key is the holder's mutex or semaphore: {other:?}"),
    }
}

/// The lease of a fresh key's first grant.
fn granted(answer: leasehold::Result<Acquire>) -> Lease {
    match answer.expect("the store answers") {
        Acquire::Granted(lease) => lease,
        other => panic!("a fresh key is free: {other:?}"),
    }
}

const TTL: Duration = Duration::from_millis(2000);
const GAP: Duration = Duration::from_millis(1200);

/// Grants `ask()` on a fresh collection and has its renewal arrive late,
/// after the prompt one (`GAP` later): between the two expiries the key
/// is still held.
async fn a_late_renewal_keeps(url: &str, ask: impl Fn() -> AcquireRequest) {
    let direct = backend_with(url, options()).await;
    let (proxy, late) = through_gate(url, &direct).await;
    let lease = granted(direct.try_acquire(&ask()).await);
    let started = tokio::time::Instant::now();
    renew_late_then_deliver(&direct, Arc::new(late), &proxy, &lease, TTL, GAP).await;
    // The late renewal's expiry is about TTL after `started`, the prompt
    // one's GAP later: ask in between.
    tokio::time::sleep_until(started + TTL + Duration::from_millis(300)).await;
    assert_still_held(&direct, &ask()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_never_shortens_a_mutex_lease() {
    let Some(url) = url() else { return };
    let k = key("late-renewal");
    a_late_renewal_keeps(&url, || request(&k, TTL)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_never_shortens_a_permit() {
    let Some(url) = url() else { return };
    let k = key("late-renewal-permit");
    a_late_renewal_keeps(&url, || {
        AcquireRequest::permit(k.clone(), TTL, "test", 1).unwrap()
    })
    .await;
}
