//! What the dashboard knows of the store: the live leases, and the grants
//! and releases seen between two listings.
//!
//! One listing (every lock and permit, one query per kind) is taken every
//! `poll` interval and at once when the store announces a release of a key
//! it holds a subscription for (the store's release notifications:
//! `LISTEN/NOTIFY`, pub/sub, change streams, the SQLite wake directory), so
//! a release shows up as soon as it is announced. Stores send no
//! notification for a grant, so a grant is seen by the next listing: within
//! one `poll`. A lease granted and released between two listings is not
//! seen at all (its token's jump is).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{Key, Locks, RwSide};
use serde::Serialize;
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long observed hold times are kept for the chart.
pub const HISTORY: Duration = Duration::from_secs(10 * 60);

/// One live lease as the page shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Row {
    pub key: String,
    /// `mutex`, `permit`, `reader` or `writer`.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    pub holder: String,
    pub token: u64,
    /// Time left on the lease when it was listed.
    pub remaining_ms: u64,
}

impl Row {
    /// What identifies a lease across listings: the same holder keeps
    /// (key, kind, slot, token) while it renews.
    fn id(&self) -> (String, &'static str, Option<u32>) {
        (self.key.clone(), self.kind, self.slot)
    }
}

/// A change seen between two listings.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// `granted` or `released` (released, expired or broken: the store
    /// does not say which).
    pub what: &'static str,
    pub key: String,
    pub kind: &'static str,
    pub token: u64,
    pub holder: String,
    /// For `released`: how long the dashboard saw it held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<u64>,
    /// Unix milliseconds.
    pub at_ms: u64,
}

/// The live state, shared by the HTTP handlers.
#[derive(Debug, Default)]
pub struct State {
    pub rows: Vec<Row>,
    /// Unix milliseconds of the last listing.
    pub listed_at_ms: u64,
    /// The last listing's error, if it failed (the rows are then the last
    /// good ones).
    pub error: Option<String>,
    /// Counts since the dashboard started.
    pub granted: u64,
    pub released: u64,
    /// Observed hold times (Unix ms at release, held ms), newest last.
    pub holds: VecDeque<(u64, u64)>,
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Everything live from one listing of the store.
async fn listing(locks: &Locks, prefix: &str) -> leasehold::Result<Vec<Row>> {
    let mut rows: Vec<Row> = locks
        .list_holders(prefix)
        .await?
        .into_iter()
        .map(|i| Row {
            key: i.key.to_string(),
            kind: match (i.slot, i.rw) {
                (None, _) => "mutex",
                (Some(_), None) => "permit",
                (Some(_), Some(RwSide::Read)) => "reader",
                (Some(_), Some(RwSide::Write)) => "writer",
            },
            slot: i.slot,
            holder: i.holder,
            token: i.token,
            remaining_ms: i.remaining.as_millis() as u64,
        })
        .collect();
    rows.sort_by(|a, b| (&a.key, a.kind, a.slot).cmp(&(&b.key, b.kind, b.slot)));
    Ok(rows)
}

/// The changes from `before` to `after`; `seen` is when each lease of
/// `before` was first listed (updated for `after`).
fn diff(
    before: &[Row],
    after: &[Row],
    seen: &mut HashMap<(String, &'static str, Option<u32>, u64), Instant>,
    now_ms: u64,
) -> Vec<Event> {
    let old: BTreeMap<_, &Row> = before.iter().map(|r| (r.id(), r)).collect();
    let new: BTreeMap<_, &Row> = after.iter().map(|r| (r.id(), r)).collect();
    let mut events = Vec::new();
    let mut end = |r: &Row, events: &mut Vec<Event>| {
        let started = seen.remove(&(r.key.clone(), r.kind, r.slot, r.token));
        events.push(Event {
            what: "released",
            key: r.key.clone(),
            kind: r.kind,
            token: r.token,
            holder: r.holder.clone(),
            held_ms: started.map(|s| s.elapsed().as_millis() as u64),
            at_ms: now_ms,
        });
    };
    for (id, r) in &old {
        match new.get(id) {
            Some(n) if n.token == r.token => {}
            _ => end(r, &mut events),
        }
    }
    for (id, r) in &new {
        if old.get(id).is_some_and(|o| o.token == r.token) {
            continue;
        }
        seen.insert((r.key.clone(), r.kind, r.slot, r.token), Instant::now());
        events.push(Event {
            what: "granted",
            key: r.key.clone(),
            kind: r.kind,
            token: r.token,
            holder: r.holder.clone(),
            held_ms: None,
            at_ms: now_ms,
        });
    }
    events
}

/// Release subscriptions, one per listed mutex key: each wakes the
/// watcher when the store announces a release of its key.
struct Subscriptions {
    tasks: HashMap<String, JoinHandle<()>>,
}

impl Subscriptions {
    fn follow(&mut self, locks: &Locks, rows: &[Row], wake: &Arc<Notify>) {
        let live: std::collections::HashSet<&str> = rows
            .iter()
            .filter(|r| r.kind == "mutex")
            .map(|r| r.key.as_str())
            .collect();
        self.tasks.retain(|key, task| {
            let keep = live.contains(key.as_str());
            if !keep {
                task.abort();
            }
            keep
        });
        for key in live {
            if self.tasks.contains_key(key) {
                continue;
            }
            let Ok(k) = Key::new(key) else { continue };
            let backend = locks.backend().clone();
            let wake = wake.clone();
            let task = tokio::spawn(async move {
                let Ok(mut subscription) = backend.subscribe(&k).await else {
                    return; // the poll still sees the release
                };
                if !subscription.is_live() {
                    return;
                }
                loop {
                    subscription.notified().await;
                    wake.notify_one();
                }
            });
            self.tasks.insert(key.to_owned(), task);
        }
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        for task in self.tasks.values() {
            task.abort();
        }
    }
}

/// Lists the store every `poll` (and on release notifications), updates
/// `state` and sends each change on `events`. Runs until aborted.
pub async fn watch(
    locks: Locks,
    store_url: String,
    prefix: String,
    poll: Duration,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<String>,
) {
    let wake = Arc::new(Notify::new());
    let mut subscriptions = Subscriptions {
        tasks: HashMap::new(),
    };
    let mut seen = HashMap::new();
    let mut previous: Vec<Row> = Vec::new();
    loop {
        let listed = listing(&locks, &prefix).await;
        let now_ms = unix_ms();
        let snapshot = {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            st.listed_at_ms = now_ms;
            match listed {
                Ok(rows) => {
                    st.error = None;
                    for e in diff(&previous, &rows, &mut seen, now_ms) {
                        match e.what {
                            "granted" => st.granted += 1,
                            _ => {
                                st.released += 1;
                                if let Some(ms) = e.held_ms {
                                    st.holds.push_back((now_ms, ms));
                                }
                            }
                        }
                        if let Ok(json) = serde_json::to_string(&e) {
                            let _ = events.send(format!("event\n{json}"));
                        }
                    }
                    let horizon = now_ms.saturating_sub(HISTORY.as_millis() as u64);
                    while st.holds.front().is_some_and(|(at, _)| *at < horizon) {
                        st.holds.pop_front();
                    }
                    subscriptions.follow(&locks, &rows, &wake);
                    previous = rows.clone();
                    st.rows = rows;
                }
                Err(e) => st.error = Some(leasehold::redact_secrets(&e.to_string(), &store_url)),
            }
            snapshot_json(&st)
        };
        let _ = events.send(format!("leases\n{snapshot}"));
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = wake.notified() => {}
        }
    }
}

/// The page's view of `state`: the leases and the counts.
pub fn snapshot_json(st: &State) -> String {
    serde_json::json!({
        "leases": st.rows,
        "listed_at_ms": st.listed_at_ms,
        "error": st.error,
        "granted": st.granted,
        "released": st.released,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, token: u64) -> Row {
        Row {
            key: key.into(),
            kind: "mutex",
            slot: None,
            holder: "h:1".into(),
            token,
            remaining_ms: 1000,
        }
    }

    #[test]
    fn a_new_token_on_a_key_is_a_release_then_a_grant() {
        let mut seen = HashMap::new();
        let first = diff(&[], &[row("a", 1)], &mut seen, 0);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].what, "granted");
        let same = diff(&[row("a", 1)], &[row("a", 1)], &mut seen, 0);
        assert!(same.is_empty(), "a renewal is no change: {same:?}");
        let next = diff(&[row("a", 1)], &[row("a", 2)], &mut seen, 0);
        let whats: Vec<_> = next.iter().map(|e| (e.what, e.token)).collect();
        assert_eq!(whats, [("released", 1), ("granted", 2)]);
        assert!(next[0].held_ms.is_some());
        let gone = diff(&[row("a", 2)], &[], &mut seen, 0);
        assert_eq!(gone[0].what, "released");
        assert!(seen.is_empty());
    }
}
