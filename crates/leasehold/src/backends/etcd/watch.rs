//! The release feed of an etcd backend: one watch stream on the store's
//! prefix, run by the core's notifier engine (`notifier.rs`), which opens
//! it on the first wait, reopens it after errors, and wakes every waiter
//! after a gap.
//!
//! The watch sees every write and deletion under the prefix, and tells
//! waiters of two: a grant's deletion (release, force-release, expiry:
//! etcd deletes the keys of a lease that ran out, so a waiter behind a
//! crashed holder wakes when etcd frees it) and a write of an announce key
//! (`Backend::announce`). Other writes (grants, queue entries, kind
//! records) only say, by their revision, that a deletion beside them was
//! no release.
//!
//! A mutex grant deleted in a revision that writes the key's grant again
//! (in the other place of its range) was handed over, not freed: by a
//! release to a waiter of the releaser's own process (`txns::release_to`)
//! or to the head of the key's queue (`txns::hand_over`). Nobody is woken
//! for it. A hand-off to the head of the queue also writes the key's
//! announce key with the head and its ticket: that write tells the head
//! alone ([`hand_off_message`]), its revision being the grant's token.
//!
//! Why one watch without filters, and not deletions alone: a watch's
//! events of one revision come in one response, but two watches' do not
//! (each answers under its own id), so the grant written beside a deletion
//! must be seen by the watch that sees the deletion. (Were a revision's
//! events ever split across responses, the deletion would wake waiters as
//! a release does: an attempt wasted, never a wake-up missed, since a
//! revision that writes a mutex's grant leaves the key held.) It costs every
//! watching process an event per grant (a few dozen bytes); before, a
//! release to a waiter of the same process woke every other process's
//! waiters (docs/etcd.md, "Waking waiters").

use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions, WatchStream};

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
            let mut stream = self
                .client
                .watch_client()
                .watch(self.layout.all(), Some(WatchOptions::new().with_prefix()))
                .await
                .map_err(retry)?;
            // In place only once the server confirms the watch: a release
            // after `subscribe` returns must not be missed.
            loop {
                match stream.message().await.map_err(retry)? {
                    Some(resp) if resp.created() => break,
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
    // Mutex keys given to another holder, by revision: a grant written, or
    // a queue entry deleted (its waiter got the key), in that revision.
    let mut handed = Vec::new();
    for event in events {
        let Some(kv) = event.kv() else { continue };
        match (event.event_type(), layout.family_of(kv.key())) {
            (EventType::Put, Some((Family::MutexGrant, key)))
            | (EventType::Delete, Some((Family::Entry, key))) => {
                handed.push((kv.mod_revision(), key));
            }
            _ => {}
        }
    }
    let mut news = Vec::new();
    for event in events {
        let Some(kv) = event.kv() else { continue };
        let message = match (event.event_type(), layout.family_of(kv.key())) {
            (EventType::Delete, Some((Family::MutexGrant, key))) => {
                let handed = handed.contains(&(kv.mod_revision(), key));
                (!handed).then(|| key.to_owned())
            }
            (EventType::Delete, Some((Family::Grant, key))) => Some(key.to_owned()),
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
