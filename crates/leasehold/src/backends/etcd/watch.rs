//! The release feed of an etcd backend: one watch stream on the store's
//! prefix, run by the core's notifier engine (`notifier.rs`), which opens
//! it on the first wait, reopens it after errors, and wakes every waiter
//! after a gap.
//!
//! The stream carries two watches: deletions under the prefix (release,
//! force-release: a grant's keys are deleted) and writes of announce keys
//! (`Backend::announce`). Grants and renewals are filtered out at the
//! server. Expiry is a deletion too (etcd deletes the keys of a lease that
//! ran out), so a waiter behind a crashed holder wakes when etcd frees it.

use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchStream};

use crate::backend::BoxFuture;
use crate::error::BoxError;
use crate::notifier::{Feed, News, Notifier, Refused, Source, Timing};

use super::keys::Layout;

const TIMING: Timing = Timing {
    first_wait: Duration::from_secs(5),
    connect_timeout: Duration::from_secs(5),
    after_failure: (Duration::from_millis(50), Duration::from_secs(5)),
    after_drop: (Duration::from_millis(50), Duration::from_secs(5)),
};

/// The notifier of the releases under `layout`'s prefix.
pub(super) fn notifier(client: Client, layout: Layout) -> Notifier {
    Notifier::new(Watch { client, layout }, TIMING)
}

struct Watch {
    client: Client,
    layout: Layout,
}

impl Source for Watch {
    fn connect(&self, _retrying: bool) -> BoxFuture<'_, Result<Box<dyn Feed>, Refused>> {
        Box::pin(async move {
            let retry = |e: etcd_client::Error| Refused::Retry(Box::new(e));
            let all = self.layout.all();
            let mut stream = self
                .client
                .watch_client()
                .watch(all, prefix_without(WatchFilterType::NoPut))
                .await
                .map_err(retry)?;
            let announces = self.layout.announce("");
            stream
                .watch(
                    announces.as_str(),
                    prefix_without(WatchFilterType::NoDelete),
                )
                .await
                .map_err(retry)?;
            // In place only once the server confirms both watches: a
            // release after `subscribe` returns must not be missed.
            let mut created = 0;
            while created < 2 {
                match stream.message().await.map_err(retry)? {
                    Some(resp) if resp.created() => created += 1,
                    Some(_) => {}
                    None => {
                        return Err(Refused::Retry(
                            "etcd closed the watch stream before it was created".into(),
                        ))
                    }
                }
            }
            Ok(Box::new(Releases {
                stream,
                layout: self.layout.clone(),
                pending: Vec::new(),
            }) as Box<dyn Feed>)
        })
    }
}

struct Releases {
    stream: WatchStream,
    layout: Layout,
    /// Keys of a response not yet handed out.
    pending: Vec<String>,
}

impl Feed for Releases {
    fn next(&mut self) -> BoxFuture<'_, Option<Result<News, BoxError>>> {
        Box::pin(async move {
            loop {
                if let Some(key) = self.pending.pop() {
                    return Some(Ok(News::Released(key)));
                }
                let resp = match self.stream.message().await {
                    Ok(Some(resp)) => resp,
                    Ok(None) => return None,
                    Err(e) => return Some(Err(Box::new(e) as BoxError)),
                };
                if resp.canceled() {
                    let reason = format!("etcd cancelled the watch: {}", resp.cancel_reason());
                    return Some(Err(reason.into()));
                }
                for event in resp.events() {
                    let wakes = match event.event_type() {
                        EventType::Delete => true,
                        EventType::Put => event.kv().is_some_and(|kv| {
                            kv.key().starts_with(self.layout.announce("").as_bytes())
                        }),
                    };
                    let key = event.kv().and_then(|kv| self.layout.lock_of(kv.key()));
                    if let (true, Some(key)) = (wakes, key) {
                        if !self.pending.iter().any(|k| k == key) {
                            self.pending.push(key.to_owned());
                        }
                    }
                }
            }
        })
    }
}

/// Watches every key under the prefix, without the events `filter` drops.
fn prefix_without(filter: WatchFilterType) -> Option<WatchOptions> {
    Some(WatchOptions::new().with_prefix().with_filters([filter]))
}
