//! The one pub/sub subscriber of a Redis backend, shared by all its waiters.
//!
//! All releases of a prefix go to one channel with the key as payload, rather
//! than a channel per key: the subscriber subscribes once for its lifetime,
//! so a waiter costs no SUBSCRIBE/UNSUBSCRIBE round trip and there is no
//! per-key subscription bookkeeping to get wrong. The price is that every
//! process with waiters on the prefix receives every release of it, a few
//! dozen bytes each, which lock traffic never makes significant.
//!
//! The subscriber reports its [`Link`] state. Waiters wait for it only while
//! the very first connection is being made: once an attempt has failed (the
//! server refuses pub/sub to this user, or is down), new waiters poll at
//! once instead of waiting for a connection that may never come. Each time
//! the subscription is (re)established, every waiter is woken: releases
//! published while it was down were not heard.

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

/// The state of the subscriber's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Link {
    /// The first connection is being made.
    Connecting,
    /// Subscribed: releases are heard.
    Up,
    /// The last attempt failed or the connection dropped; retrying.
    Down,
}

#[derive(Debug)]
pub(super) struct Subscriber {
    pub(super) hub: WakeHub,
    /// The subscription's state right now.
    pub(super) link: watch::Receiver<Link>,
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
        let (tx, link) = watch::channel(Link::Connecting);
        let task = tokio::spawn(run(client, channel, hub.clone(), tx, io_timeout));
        Subscriber { hub, link, task }
    }
}

async fn run(
    client: redis::Client,
    channel: String,
    hub: WakeHub,
    link: watch::Sender<Link>,
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
                // After an outage, releases published while nobody listened
                // were missed: every waiter retries now that new ones will be
                // heard. (Waiters that came during the first connection
                // retry right after subscribing anyway.)
                if link.send_replace(Link::Up) == Link::Down {
                    let woken = hub.notify_all();
                    tracing::debug!(%channel, woken, "redis subscriber back; waking all waiters");
                }
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
                // wake-all after it makes up for them.
                link.send_replace(Link::Down);
                tracing::debug!(%channel, "redis subscriber connection lost; reconnecting");
            }
            Ok(Err(e)) => {
                link.send_replace(Link::Down);
                tracing::debug!(%channel, error = %e, "redis subscriber cannot subscribe; waiters poll");
            }
            Err(_) => {
                link.send_replace(Link::Down);
                tracing::debug!(%channel, "redis subscriber connect timed out; waiters poll");
            }
        }
        sleep(retry).await;
        retry = (retry * 2).min(RETRY_MAX);
    }
}
