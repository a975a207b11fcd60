//! The `kind` records of idle keys go away (docs/storage.md).
//!
//! etcd deletes a grant's key when it is released or its lease ends, and
//! its tokens are the store-wide revision, which never goes back: no record
//! carries a fence. What stays is `{prefix}K/{key}`, the key's kind once it
//! is a semaphore or a reader-writer lock (keys.rs). Its `mod_revision` is
//! the key's last release (a release writes it again, same value:
//! `txns::release`) or its claim.
//!
//! Revisions are not times, so each pass notes the revision it began at
//! ([`Sweeper`] keeps them for a window and a half). A pass deletes the
//! kind record of every key whose record was last written at or before the
//! revision of a pass that began at least the window ago, and that has no
//! grant left in its semaphore's or rw lock's range: each deletion is a
//! transaction that compares exactly that (and that the kind record is the
//! one read), so a grant or release that commits first keeps it. A grant
//! that read the kind before the deletion commits with a compare on it
//! (`KindClaim::held`), which then fails: it reads again and claims the key
//! anew in its own grant transaction.
//!
//! Passes start after releases, at most one at a time per store handle and
//! no sooner than half the idle window after the last one began
//! ([`SweepSchedule`]): a kind record goes between one and two windows
//! after its key's last release. A pass reads the kind records in pages of
//! [`PAGE`] keys (keys only) and sends one transaction per page, each
//! deletion a nested transaction with its own compares.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};

use super::keys::Kind;
use super::{EtcdBackend, Inner};
use crate::backend::SweepSchedule;
use crate::error::Result;

/// Kind records per page, and so nested transactions per transaction
/// (etcd refuses more than `--max-txn-ops`, 128 by default).
const PAGE: i64 = 64;

/// The sweep state of one store handle (and its clones).
#[derive(Debug)]
pub(super) struct Sweeper {
    schedule: SweepSchedule,
    /// When earlier passes began, and the store's revision then: the
    /// newest entry at least a window old is the cutoff.
    passes: Mutex<VecDeque<(Instant, i64)>>,
}

impl Sweeper {
    pub(super) fn new(window: Option<Duration>) -> Self {
        Sweeper {
            schedule: SweepSchedule::new(window),
            passes: Mutex::new(VecDeque::new()),
        }
    }

    pub(super) fn window(&self) -> Option<Duration> {
        self.schedule.window()
    }

    /// Notes a pass that begins at `revision` and answers the revision of
    /// the newest earlier pass that began at least the window ago (`None`:
    /// none did, or there is no window).
    fn begin(&self, revision: i64) -> Option<i64> {
        let window = self.schedule.window()?;
        let now = Instant::now();
        let mut passes = self.passes.lock().unwrap_or_else(|e| e.into_inner());
        let cutoff = passes
            .iter()
            .filter(|(at, _)| now.duration_since(*at) >= window)
            .map(|(_, revision)| *revision)
            .max();
        // Older entries than the cutoff's are never needed again.
        while passes.len() > 1 && passes[1].0 + window <= now {
            passes.pop_front();
        }
        passes.push_back((now, revision));
        cutoff
    }
}

/// Ends the pass when dropped, also when its runtime shuts down mid-pass.
struct Running(Arc<Inner>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.sweeper.schedule.finish();
    }
}

/// The first key after every key that starts with `prefix` (etcd's range
/// end for a prefix).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl EtcdBackend {
    /// Starts a pass in the background if one is due (called after a
    /// release). A pass that fails stops; the next due one starts over.
    pub(super) fn poke_sweeper(&self) {
        let Some((_, runtime)) = self.inner.sweeper.schedule.start_due() else {
            return;
        };
        let backend = self.clone();
        let running = Running(Arc::clone(&self.inner));
        runtime.spawn(async move {
            let _running = running;
            if let Err(e) = backend.sweep_kinds().await {
                tracing::debug!(error = %e, "leasehold: etcd sweep pass stopped");
            }
        });
    }

    /// One whole pass over the kind records; how many it deleted.
    pub(super) async fn sweep_kinds(&self) -> Result<u64> {
        let layout = &self.inner.layout;
        let kinds = layout.kinds();
        let end = prefix_end(&kinds);
        let mut from = kinds.clone().into_bytes();
        let mut cutoff = None;
        let mut deleted = 0;
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(PAGE)
                .with_keys_only();
            let page = self
                .call("a read", |client| {
                    let mut kv = client.kv_client();
                    let (from, options) = (from.clone(), options.clone());
                    async move { kv.get(from, Some(options)).await }
                })
                .await?;
            let cutoff = match cutoff {
                Some(cutoff) => cutoff,
                None => {
                    let revision = page.header().map_or(0, |h| h.revision());
                    let Some(found) = self.inner.sweeper.begin(revision) else {
                        return Ok(0);
                    };
                    *cutoff.insert(found)
                }
            };
            let mut nested = Vec::new();
            for kv in page.kvs() {
                let Some(key) = kv.key().strip_prefix(kinds.as_bytes()) else {
                    continue;
                };
                if kv.mod_revision() > cutoff {
                    continue; // released (or claimed) since: not idle yet
                }
                let key = String::from_utf8_lossy(key);
                let free = Txn::new()
                    .when([
                        Compare::create_revision(kv.key(), CompareOp::Equal, kv.create_revision()),
                        Compare::mod_revision(kv.key(), CompareOp::Less, cutoff + 1),
                        Compare::create_revision(
                            layout.lock(Kind::Semaphore, &key),
                            CompareOp::Equal,
                            0,
                        )
                        .with_prefix(),
                        Compare::create_revision(layout.lock(Kind::Rw, &key), CompareOp::Equal, 0)
                            .with_prefix(),
                    ])
                    .and_then([TxnOp::delete(kv.key(), None)]);
                nested.push(TxnOp::txn(free));
            }
            if !nested.is_empty() {
                let answer = self.txn(Txn::new().and_then(nested)).await?;
                deleted += answer
                    .op_responses()
                    .iter()
                    .filter(|op| matches!(op, TxnOpResponse::Txn(t) if t.succeeded()))
                    .count() as u64;
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(deleted),
            }
        }
    }
}
