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
