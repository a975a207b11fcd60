//! The one pub/sub subscriber of a Redis backend, shared by all its waiters.
//!
//! All releases of a prefix go to one channel with the key as payload, rather
//! than a channel per key: the subscriber subscribes once for its lifetime,
//! so a waiter costs no SUBSCRIBE/UNSUBSCRIBE round trip and there is no
//! per-key subscription bookkeeping to get wrong. The price is that every
//! process with waiters on the prefix receives every release of it, a few
//! dozen bytes each, which lock traffic never makes significant.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

use crate::notify::WakeHub;

/// How long a quiet subscriber connection goes before it proves it is alive
/// with a PING: a connection cut without a FIN would otherwise go unnoticed.
const PING_EVERY: Duration = Duration::from_secs(10);
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub(super) struct Subscriber {
    pub(super) hub: WakeHub,
    /// Whether the subscription is in place right now.
    pub(super) up: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Subscriber {
    /// Spawns the subscriber task; it connects, and reconnects, on its own.
    pub(super) fn start(client: redis::Client, channel: String, io_timeout: Duration) -> Self {
        let hub = WakeHub::new();
        let (tx, up) = watch::channel(false);
        let task = tokio::spawn(run(client, channel, hub.clone(), tx, io_timeout));
        Subscriber { hub, up, task }
    }
}

async fn run(
    client: redis::Client,
    channel: String,
    hub: WakeHub,
    up: watch::Sender<bool>,
    io_timeout: Duration,
) {
    let mut retry = RETRY_MIN;
    loop {
        let connected = timeout(io_timeout, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        match connected {
            Ok(Ok(pubsub)) => {
                retry = RETRY_MIN;
                let (mut sink, mut stream) = pubsub.split();
                up.send_replace(true);
                loop {
                    tokio::select! {
                        msg = stream.next() => match msg {
                            Some(msg) => {
                                if let Ok(key) = msg.get_payload::<String>() {
                                    hub.notify(&key);
                                }
                            }
                            None => break,
                        },
                        () = sleep(PING_EVERY) => {
                            let pong = timeout(io_timeout, sink.ping::<redis::Value>()).await;
                            if !matches!(pong, Ok(Ok(_))) {
                                break;
                            }
                        }
                    }
                }
                // Releases published until the next SUBSCRIBE are lost; the
                // waiters' backoff timer bounds what that costs them.
                up.send_replace(false);
                tracing::debug!(%channel, "redis subscriber connection lost; reconnecting");
            }
            Ok(Err(e)) => tracing::debug!(%channel, error = %e, "redis subscriber cannot connect"),
            Err(_) => tracing::debug!(%channel, "redis subscriber connect timed out"),
        }
        sleep(retry).await;
        retry = (retry * 2).min(RETRY_MAX);
    }
}
