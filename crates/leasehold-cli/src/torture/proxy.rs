//! A TCP fault proxy between the workers and a network store: added
//! latency, stalls (bytes held back, connections left open) and connection
//! resets (RST, as a crashed middlebox or a failover would do).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The knobs the nemesis turns; shared with every connection.
pub struct Control {
    latency_us: AtomicU64,
    stalled: watch::Sender<bool>,
    /// Cancelled to reset every open connection; replaced after each reset.
    generation: Mutex<CancellationToken>,
}

impl Control {
    pub fn set_latency(&self, latency: Duration) {
        self.latency_us
            .store(latency.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.send_replace(stalled);
    }

    /// Resets every connection open now; later ones are unaffected.
    pub fn reset_all(&self) {
        let mut g = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        g.cancel();
        *g = CancellationToken::new();
    }

    fn current(&self) -> CancellationToken {
        self.generation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The listening proxy. Dropping it stops accepting; open connections end
/// when either side closes.
pub struct Proxy {
    addr: SocketAddr,
    control: Arc<Control>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`.
    pub async fn start(upstream: String) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let control = Arc::new(Control {
            latency_us: AtomicU64::new(0),
            stalled: watch::Sender::new(false),
            generation: Mutex::new(CancellationToken::new()),
        });
        let shared = control.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, upstream.clone(), shared.clone()));
            }
        });
        Ok(Proxy {
            addr,
            control,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn control(&self) -> Arc<Control> {
        self.control.clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(client: TcpStream, upstream: String, control: Arc<Control>) {
    let reset = control.current();
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return; // dropping `client` tells the worker the store is unreachable
    };
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        // Closing with linger 0 sends RST: a reset is abrupt, not a goodbye.
        let _ = s.set_zero_linger();
    }
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    tokio::select! {
        _ = reset.cancelled() => {}
        _ = async { tokio::join!(pump(cr, sw, &control), pump(sr, cw, &control)) } => {}
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, control: &Control) {
    let mut stalled = control.stalled.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let latency = control.latency_us.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        // Hold the bytes while stalled.
        if stalled.wait_for(|s| !*s).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        Ok(buf.to_vec())
    }

    #[tokio::test]
    async fn forwards_stalls_and_resets() {
        let proxy = Proxy::start(echo_server().await.to_string()).await.unwrap();
        let control = proxy.control();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s).await.unwrap(), b"ping");

        control.set_stalled(true);
        let stalled = tokio::time::timeout(Duration::from_millis(300), round_trip(&mut s)).await;
        assert!(stalled.is_err(), "a stalled proxy must hold the bytes");
        control.set_stalled(false);
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping", "held bytes arrive after the stall");

        control.reset_all();
        let mut buf = [0u8; 4];
        let after_reset = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("a reset connection does not hang");
        assert!(matches!(after_reset, Ok(0) | Err(_)), "{after_reset:?}");
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut fresh).await.unwrap(), b"ping");
    }
}
