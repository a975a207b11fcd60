//! The release feed of a Redis backend: one pub/sub subscription per server
//! and prefix, run by the core's notifier engine (`notifier.rs`), which
//! starts it on the first wait, reconnects it, and wakes every waiter after
//! a gap.
//!
//! All releases of a prefix go to one channel with the key as payload, rather
//! than a channel per key: the subscriber subscribes once for its lifetime,
//! so a waiter costs no SUBSCRIBE/UNSUBSCRIBE round trip and there is no
//! per-key subscription bookkeeping to get wrong. The price is that every
//! process with waiters on the prefix receives every release of it, a few
//! dozen bytes each, which lock traffic never makes significant.
//!
//! A server that refuses pub/sub to this user, or is down, leaves waiters
//! polling while the engine retries.

use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::time::{sleep, timeout};

use crate::backend::BoxFuture;
use crate::error::BoxError;
use crate::notifier::{Feed, News, Notifier, Refused, Source, Timing};

/// How long a quiet subscriber connection goes before it proves it is alive
/// with a PING: a connection cut without a FIN would otherwise go unnoticed.
const PING_EVERY: Duration = Duration::from_secs(10);
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// The notifier of one server and channel; `io_timeout` bounds connecting
/// and each PING, and a waiter waits for the first connection two of them.
pub(super) fn notifier(client: redis::Client, channel: String, io_timeout: Duration) -> Notifier {
    Notifier::new(
        Subscribe {
            client,
            channel,
            io_timeout,
        },
        Timing {
            first_wait: io_timeout * 2,
            connect_timeout: io_timeout,
            after_failure: (RETRY_MIN, RETRY_MAX),
            after_drop: (RETRY_MIN, RETRY_MAX),
        },
    )
}

struct Subscribe {
    client: redis::Client,
    channel: String,
    io_timeout: Duration,
}

impl Source for Subscribe {
    fn connect(&self, _retrying: bool) -> BoxFuture<'_, Result<Box<dyn Feed>, Refused>> {
        Box::pin(async move {
            let subscribed = async {
                let mut pubsub = self.client.get_async_pubsub().await?;
                pubsub.subscribe(&self.channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            let (sink, stream) = subscribed
                .await
                .map_err(|e| Refused::Retry(Box::new(e)))?
                .split();
            Ok(Box::new(Messages {
                sink,
                stream,
                io_timeout: self.io_timeout,
            }) as Box<dyn Feed>)
        })
    }
}

/// The released keys published on the channel.
struct Messages {
    sink: PubSubSink,
    stream: PubSubStream,
    io_timeout: Duration,
}

impl Feed for Messages {
    fn next(&mut self) -> BoxFuture<'_, Option<Result<News, BoxError>>> {
        Box::pin(async move {
            loop {
                tokio::select! {
                    msg = self.stream.next() => {
                        let msg = msg?;
                        if let Ok(key) = msg.get_payload::<String>() {
                            return Some(Ok(News::Released(key)));
                        }
                    }
                    () = sleep(PING_EVERY) => {
                        let pong = timeout(self.io_timeout, self.sink.ping::<redis::Value>()).await;
                        if !matches!(pong, Ok(Ok(_))) {
                            return Some(Err("the subscriber connection did not answer a PING".into()));
                        }
                    }
                }
            }
        })
    }
}
