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
//!
//! A hand-off (a release or an attempt that gives the key to the head of
//! its queue) writes the key's announce key with the head and its ticket:
//! that write tells the head alone ([`hand_off_message`]), its revision
//! being the grant's token. The deletion of the releaser's grant in the
//! same revision (beside the deletion of the head's queue entry) wakes
//! nobody else: the key is not free.

use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchStream};

use crate::backend::BoxFuture;
use crate::error::BoxError;
use crate::notifier::{Feed, News, Notifier, Refused, Source, Timing};
use crate::notify::{hand_off_message, HandOff};

use super::keys::{read_hand_off, Family, Layout};

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
                self.pending = news_of(&self.layout, resp.events());
                self.pending.reverse();
            }
        })
    }
}

/// What one watch response says, in order: the keys freed (a grant's
/// deletion not in the revision of a hand-off of that key) or announced,
/// and the hand-offs, each once.
fn news_of(layout: &Layout, events: &[etcd_client::Event]) -> Vec<String> {
    // Keys whose queue lost an entry, by revision: a grant deleted in
    // the same revision was handed over, not freed.
    let mut left_queue = Vec::new();
    for event in events {
        if let Some(kv) = event
            .kv()
            .filter(|_| event.event_type() == EventType::Delete)
        {
            if let Some((Family::Entry, key)) = layout.family_of(kv.key()) {
                left_queue.push((kv.mod_revision(), key));
            }
        }
    }
    let mut news = Vec::new();
    for event in events {
        let Some(kv) = event.kv() else { continue };
        let message = match (event.event_type(), layout.family_of(kv.key())) {
            (EventType::Delete, Some((Family::Grant, key))) => {
                let handed = left_queue.contains(&(kv.mod_revision(), key));
                (!handed).then(|| key.to_owned())
            }
            (EventType::Put, Some((Family::Announce, key))) => {
                Some(match read_hand_off(kv.value()) {
                    Some((owner, ticket)) => {
                        let token = u64::try_from(kv.mod_revision()).unwrap_or_default();
                        hand_off_message(key, owner, HandOff { token, ticket })
                    }
                    None => key.to_owned(),
                })
            }
            _ => None,
        };
        if let Some(message) = message.filter(|m| !news.contains(m)) {
            news.push(message);
        }
    }
    news
}

/// Watches every key under the prefix, without the events `filter` drops.
fn prefix_without(filter: WatchFilterType) -> Option<WatchOptions> {
    Some(WatchOptions::new().with_prefix().with_filters([filter]))
}
