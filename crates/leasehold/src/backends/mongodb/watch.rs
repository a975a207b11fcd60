//! The release feed of a MongoDB backend: a change stream on the lease
//! collection, run by the core's notifier engine (`notifier.rs`), which
//! opens it on the first wait, reopens it after errors, and wakes every
//! waiter after a gap.
//!
//! One stream per backend, shared by all its waiters. It only carries
//! releases (updates that set `owner` to null: release, force-release; and
//! deletes), announced grants (updates of `announced`) and hand-offs to
//! the head of a key's queue (updates of `handoff`, whose message it
//! delivers as is: queue.rs). A reopened stream resumes from the last resume token, so no
//! release is missed; if the server cannot watch at all (a standalone
//! server, a store without change streams), waiters get
//! [`Subscription::never`](crate::Subscription::never) and the core polls
//! with the holder's remaining ttl.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;
use mongodb::Collection;

use crate::backend::BoxFuture;
use crate::error::BoxError;
use crate::notifier::{Feed, News, Notifier, Refused, Source, Timing};

/// Server error codes meaning "this deployment cannot run change streams".
const UNSUPPORTED: &[i32] = &[
    40573, // $changeStream only on replica sets
    40324, // unrecognized pipeline stage
    115,   // CommandNotSupported
    59,    // CommandNotFound
    303,   // not supported on this deployment
];

const TIMING: Timing = Timing {
    first_wait: Duration::from_secs(5),
    connect_timeout: Duration::from_secs(10),
    after_failure: (Duration::from_millis(50), Duration::from_secs(5)),
    after_drop: (Duration::from_millis(50), Duration::from_secs(5)),
};

/// The notifier of the releases in `coll`.
pub(super) fn notifier(coll: Collection<Document>) -> Notifier {
    Notifier::new(
        Watch {
            coll,
            resume: Arc::default(),
        },
        TIMING,
    )
}

struct Watch {
    coll: Collection<Document>,
    /// Where the last stream stopped.
    resume: Arc<Mutex<Option<ResumeToken>>>,
}

impl Source for Watch {
    fn connect(&self, _retrying: bool) -> BoxFuture<'_, Result<Box<dyn Feed>, Refused>> {
        Box::pin(async move {
            let token = self
                .resume
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let stream = match open(&self.coll, token.clone()).await {
                Ok(stream) => stream,
                Err(e) if unsupported(&e) => return Err(Refused::Never(Box::new(e))),
                // The token fell out of the oplog: start afresh. Waiters
                // that missed a release still wake at their timer (the
                // holder's ttl or the backoff).
                Err(e) if token.is_some() && history_lost(&e) => open(&self.coll, None)
                    .await
                    .map_err(|e| Refused::Retry(Box::new(e)))?,
                Err(e) => return Err(Refused::Retry(Box::new(e))),
            };
            Ok(Box::new(Releases {
                stream,
                resume: self.resume.clone(),
            }) as Box<dyn Feed>)
        })
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
        // A grant announced for observers (`Backend::announce`).
        { "operationType": "update", "updateDescription.updatedFields.announced": { "$exists": true } },
        // A semaphore permit's release (semaphore.rs).
        { "operationType": "update", "updateDescription.updatedFields.releases": { "$exists": true } },
        // A key handed over to the head of its queue (queue.rs).
        { "operationType": "update", "updateDescription.updatedFields.handoff": { "$exists": true } },
    ] } };
    // Only the key and a hand-off's message are needed; `_id` (the resume
    // token) must stay.
    let project = doc! { "$project": {
        "documentKey": 1,
        "updateDescription.updatedFields.handoff": 1,
    } };
    Ok(coll
        .watch()
        .pipeline([releases, project])
        .resume_after(resume)
        .max_await_time(Duration::from_secs(5))
        .await?
        .with_type::<Document>())
}

/// The hand-off message an event carries, if it is a hand-off.
fn hand_off_in(event: &Document) -> Option<String> {
    let fields = event
        .get_document("updateDescription")
        .ok()?
        .get_document("updatedFields")
        .ok()?;
    fields.get_str("handoff").ok().map(str::to_owned)
}

/// The released keys of one stream; its resume token is kept for the next.
struct Releases {
    stream: ChangeStream<Document>,
    resume: Arc<Mutex<Option<ResumeToken>>>,
}

impl Releases {
    fn keep_resume_token(&self) {
        if let Some(token) = self.stream.resume_token() {
            *self.resume.lock().unwrap_or_else(|p| p.into_inner()) = Some(token);
        }
    }
}

impl Feed for Releases {
    fn next(&mut self) -> BoxFuture<'_, Option<Result<News, BoxError>>> {
        Box::pin(async move {
            loop {
                let next = self.stream.next_if_any().await;
                self.keep_resume_token();
                match next {
                    Ok(Some(event)) => {
                        if let Some(message) = hand_off_in(&event) {
                            return Some(Ok(News::Released(message)));
                        }
                        let key = event
                            .get_document("documentKey")
                            .ok()
                            .and_then(|k| k.get("_id"));
                        if let Some(Bson::String(id)) = key {
                            // A semaphore's document wakes the waiters of its key.
                            let key = id
                                .strip_prefix(super::semaphore::PERMITS_ID)
                                .or_else(|| id.strip_prefix(super::semaphore::RW_ID))
                                .unwrap_or(id);
                            return Some(Ok(News::Released(key.to_owned())));
                        }
                    }
                    Ok(None) if self.stream.is_alive() => {}
                    Ok(None) => return None,
                    Err(e) => return Some(Err(Box::new(e) as BoxError)),
                }
            }
        })
    }
}
