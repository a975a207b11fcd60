//! Release notifications from a change stream on the lease collection.
//!
//! One stream per backend, opened by the first waiter and shared by all of
//! them through the core's [`WakeHub`]. It only carries releases: updates
//! that set `owner` to null (release, force-release) and deletes. If the
//! stream fails it is reopened from its last resume token with backoff, so
//! no release is missed; if the server cannot watch at all (a standalone
//! server, a store without change streams), waiters get
//! [`Subscription::never`] and the core polls with the holder's remaining ttl.

use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;
use mongodb::Collection;
use tokio::task::JoinHandle;

use crate::key::Key;
use crate::notify::{Subscription, WakeHub};
use crate::time::Backoff;

/// Server error codes meaning "this deployment cannot run change streams".
const UNSUPPORTED: &[i32] = &[
    40573, // $changeStream only on replica sets
    40324, // unrecognized pipeline stage
    115,   // CommandNotSupported
    59,    // CommandNotFound
    303,   // not supported on this deployment
];

#[derive(Debug)]
enum State {
    NotStarted,
    /// The stream task, stopped when the state (the backend) goes.
    Running {
        _task: AbortOnDrop,
    },
    Unsupported,
    /// Stopped for good by [`Watcher::close`]: waiters poll.
    Closed,
}

/// The backend's watcher; the stream task stops when this is dropped.
#[derive(Debug)]
pub(super) struct Watcher {
    hub: WakeHub,
    state: tokio::sync::Mutex<State>,
}

#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Watcher {
    pub(super) fn new(hub: WakeHub) -> Self {
        Watcher {
            hub,
            state: tokio::sync::Mutex::new(State::NotStarted),
        }
    }

    /// Registers a waiter for `key`, opening the stream first if this is
    /// the first waiter. When this returns a live subscription the stream is
    /// open, so a later release reaches it.
    pub(super) async fn subscribe(&self, coll: &Collection<Document>, key: &Key) -> Subscription {
        // Registered before the stream opens: an event the new stream
        // delivers can never be lost to a waiter that registered too late.
        let sub = self.hub.subscribe(key.as_str());
        let mut state = self.state.lock().await;
        match &*state {
            State::Running { .. } => sub,
            State::Unsupported | State::Closed => Subscription::never(),
            State::NotStarted => match open(coll, None).await {
                Ok(stream) => {
                    let task = tokio::spawn(pump(coll.clone(), stream, self.hub.clone()));
                    *state = State::Running {
                        _task: AbortOnDrop(task),
                    };
                    sub
                }
                Err(e) if unsupported(&e) => {
                    tracing::info!(error = %e, "the server has no change streams; waiters will poll");
                    *state = State::Unsupported;
                    Subscription::never()
                }
                Err(e) => {
                    // Maybe transient: this waiter polls, the next one retries.
                    tracing::debug!(error = %e, "change stream not opened; this waiter polls");
                    Subscription::never()
                }
            },
        }
    }
}

impl Watcher {
    /// Stops the stream task and waits until it is gone, so its change
    /// stream (a server-side cursor) no longer holds on to the client.
    pub(super) async fn close(&self) {
        let mut state = self.state.lock().await;
        if let State::Running { _task: mut task } = std::mem::replace(&mut *state, State::Closed) {
            task.0.abort();
            let _ = (&mut task.0).await;
        }
    }
}

fn unsupported(e: &mongodb::error::Error) -> bool {
    super::server_code(e).is_some_and(|c| UNSUPPORTED.contains(&c))
}

/// ChangeStreamHistoryLost, ChangeStreamFatalError, CappedPositionLost.
fn history_lost(e: &mongodb::error::Error) -> bool {
    super::server_code(e).is_some_and(|c| matches!(c, 286 | 280 | 136))
}

async fn open(
    coll: &Collection<Document>,
    resume: Option<ResumeToken>,
) -> mongodb::error::Result<ChangeStream<Document>> {
    let releases = doc! { "$match": { "$or": [
        { "operationType": "delete" },
        { "operationType": "update", "updateDescription.updatedFields.owner": { "$type": "null" } },
    ] } };
    // Only the key is needed; `_id` (the resume token) must stay.
    let project = doc! { "$project": { "documentKey": 1 } };
    Ok(coll
        .watch()
        .pipeline([releases, project])
        .resume_after(resume)
        .max_await_time(Duration::from_secs(5))
        .await?
        .with_type::<Document>())
}

/// Feeds released keys to the hub; reopens the stream after errors, from
/// the last resume token, until the backend is dropped.
async fn pump(coll: Collection<Document>, mut stream: ChangeStream<Document>, hub: WakeHub) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
    loop {
        match stream.next_if_any().await {
            Ok(Some(event)) => {
                backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
                if let Ok(key) = event.get_document("documentKey") {
                    if let Some(Bson::String(key)) = key.get("_id") {
                        hub.notify(key);
                    }
                }
            }
            Ok(None) if stream.is_alive() => {}
            result => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "change stream failed; reopening");
                }
                let token = stream.resume_token();
                loop {
                    tokio::time::sleep(backoff.next_delay()).await;
                    match open(&coll, token.clone()).await {
                        Ok(s) => {
                            stream = s;
                            break;
                        }
                        // The token fell out of the oplog: start afresh.
                        // Waiters that missed a release still wake at their
                        // timer (the holder's ttl or the backoff).
                        Err(e) if token.is_some() && history_lost(&e) => {
                            if let Ok(s) = open(&coll, None).await {
                                stream = s;
                                break;
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "change stream not reopened yet"),
                    }
                }
            }
        }
    }
}
