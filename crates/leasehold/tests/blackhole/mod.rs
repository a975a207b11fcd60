//! A TCP proxy for tests that can black-hole the connections it carries:
//! after [`BlackholeProxy::freeze_existing`], every connection open at that
//! moment stays open but carries no more bytes either way (a dead network
//! path), while connections made afterwards pass normally (the path a fresh
//! connection takes). Loopback only; it stops when dropped.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The proxy; see the module docs.
pub struct BlackholeProxy {
    addr: SocketAddr,
    /// One token per connection carried so far; cancelling freezes it.
    connections: Arc<Mutex<Vec<CancellationToken>>>,
    accept: JoinHandle<()>,
    stop: CancellationToken,
}

impl BlackholeProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections: Arc<Mutex<Vec<CancellationToken>>> = Arc::default();
        let stop = CancellationToken::new();
        let accept = tokio::spawn({
            let connections = connections.clone();
            let stop = stop.clone();
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        return;
                    };
                    let freeze = CancellationToken::new();
                    connections.lock().unwrap().push(freeze.clone());
                    tokio::spawn(carry(client, upstream, freeze, stop.clone()));
                }
            }
        });
        BlackholeProxy {
            addr,
            connections,
            accept,
            stop,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops every connection open now from carrying bytes, for good; they
    /// stay open. Later connections are not affected.
    pub fn freeze_existing(&self) -> usize {
        let connections = self.connections.lock().unwrap();
        for freeze in connections.iter() {
            freeze.cancel();
        }
        connections.len()
    }
}

/// A proxy in front of the PostgreSQL server of `url`, and the server's
/// connection options.
pub async fn in_front_of_postgres(url: &str) -> (BlackholeProxy, sqlx::postgres::PgConnectOptions) {
    use std::net::ToSocketAddrs;
    use std::str::FromStr;
    let direct = sqlx::postgres::PgConnectOptions::from_str(url).unwrap();
    let upstream = (direct.get_host(), direct.get_port())
        .to_socket_addrs()
        .unwrap()
        .next()
        .unwrap();
    (BlackholeProxy::start(upstream).await, direct)
}

/// Takes a lease of 3 s on `key` through `locks` (whose connections go
/// through `proxy`), black-holes every connection the proxy carries, and
/// checks two ttls later, here and at the store through `checker` (a client
/// that does not go through the proxy), that the lease was kept and renewed:
/// a renewal stuck on a dead connection is retried on a fresh one.
pub async fn renewals_outlive_frozen_connections(
    locks: &leasehold::Locks,
    proxy: &BlackholeProxy,
    key: &str,
    checker: &dyn leasehold::Backend,
) {
    let ttl = std::time::Duration::from_secs(3);
    let guard = locks
        .acquire_with(key, &leasehold::AcquireOptions::new().with_ttl(ttl))
        .await
        .unwrap();
    // Every connection open now goes dead without closing; new
    // connections get through.
    assert!(proxy.freeze_existing() >= 1);
    tokio::time::sleep(ttl * 2).await;
    assert!(
        !guard.is_lost(),
        "a renewal stuck on a dead connection was not retried on a fresh one"
    );
    let held = checker
        .inspect(&leasehold::Key::new(key).unwrap())
        .await
        .unwrap()
        .expect("still held at the store");
    assert_eq!(held.token, guard.token());
    assert!(
        held.remaining > ttl / 3,
        "renewed: {:?} left",
        held.remaining
    );
}

impl Drop for BlackholeProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.stop.cancel();
    }
}

async fn carry(
    mut client: TcpStream,
    upstream: SocketAddr,
    freeze: CancellationToken,
    stop: CancellationToken,
) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        // Frozen: keep both sockets open, move nothing, until the proxy goes.
        _ = freeze.cancelled() => stop.cancelled().await,
        _ = stop.cancelled() => {}
    }
}
