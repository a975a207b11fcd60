//! The queued steps on MongoDB: an attempt that queues or finds a queue,
//! a release that finds one, and leaving it. Each reads the key's
//! document, decides (queue.rs) and writes once, conditioned on what it
//! decided on being as read (the lease, the entries it removes); a
//! conflicting write in between (a grant, a release, the renewal of an
//! entry it took for dead) costs a fresh read and another try, a bounded
//! number of times.

use std::time::Duration;

use mongodb::bson::{doc, Document};
use tokio::time::sleep;

use super::clock::ServerNow;
use super::errors::STORE;
use super::kind::kind_of;
use super::queue::{renewal_while_held, Outcome, Plan, Snapshot};
use super::record::{fence_of, token_as_i64};
use super::{busy_in, MongoBackend};
use crate::backend::{Acquire, AcquireRequest, Backend, Busy, Lease, OwnerId};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::time::Backoff;

/// Tries of a queued write against a fresh read. Every waiter writes its
/// entry about three times per entry lease, so conflicts are rare; many
/// in a row mean a storm of writers, and an attempt then answers busy
/// ([`STORM`]: try again at once). Busy, not unavailable: the store
/// answered every read and write, the key is only contended, and an
/// unavailable answer would end a waiter's whole wait where busy keeps
/// it waiting (a release or a leave, which have no wait to go on with,
/// report unavailable after as many tries).
const ROUNDS: usize = 16;

/// The holder a busy answer names after [`ROUNDS`] conflicting writes:
/// the key's holder is not known then (each read saw another document).
const STORM: &str = "(unknown: the lock document changed under every write of this attempt)";

/// The pause before a fresh read after a conflict: the writers that
/// collided spread out.
fn conflict_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(1), Duration::from_millis(20))
}

/// A read of a key's document and the store's time after it.
type Read = (Option<Document>, ServerNow);

impl MongoBackend {
    /// The attempt of `req` on the document as `read` (else read now),
    /// with the queue: a free key goes to its live head or to the
    /// requester, a requester that queues enters or renews its entry, a
    /// repeat of a live grant is that grant extended. `None` when the key
    /// has no document (the plain attempt creates it).
    pub(super) async fn queued_attempt(
        &self,
        req: &AcquireRequest,
        read: Option<Read>,
    ) -> Result<Option<Acquire>> {
        let mut read = match read {
            Some(read) => read,
            None => {
                if let Some(busy) = self.renew_entry_while_held(req).await? {
                    return Ok(Some(Acquire::Busy(busy)));
                }
                self.record(req.key()).await?
            }
        };
        let mut backoff = conflict_backoff();
        for _ in 0..ROUNDS {
            let (Some(d), now) = &read else {
                return Ok(None);
            };
            if let Some(kind) = kind_of(d)? {
                return Ok(Some(Acquire::OtherKind(kind)));
            }
            let snapshot = Snapshot::read(d, *now)?;
            if snapshot.held_by_owner(req.owner()) {
                // A repeat of a live grant (handed over, or an answer
                // lost): the same grant, its expiry counted from now as a
                // renewal extends it. Not when it expired meanwhile: read
                // again, and the ordinary rules apply.
                let lease = req.granted(fence_of(d)?);
                if self.renew(&lease, req.ttl()).await? {
                    return Ok(Some(Acquire::Granted(lease)));
                }
            } else {
                let Some(plan) = snapshot.attempt(req) else {
                    return Ok(Some(Acquire::Busy(busy_in(Some(d), *now))));
                };
                let outcome = plan.outcome.clone();
                if self.write(plan).await? {
                    return Ok(Some(self.answer(req, outcome, d, *now)));
                }
                sleep(backoff.next_delay()).await;
            }
            read = self.record(req.key()).await?;
        }
        Ok(Some(Acquire::Busy(Busy {
            holder: STORM.to_owned(),
            remaining: Duration::ZERO,
        })))
    }

    /// A waiter's attempt while another owner holds the key live: its
    /// entry renewed in one round trip, and the busy answer
    /// ([`renewal_while_held`]). `None` when that is not the case.
    async fn renew_entry_while_held(&self, req: &AcquireRequest) -> Result<Option<Busy>> {
        let now = self.now().await?;
        let Some((filter, update)) = renewal_while_held(req, now) else {
            return Ok(None);
        };
        let found = self
            .inner
            .coll
            .find_one_and_update(filter, update)
            .projection(doc! { "owner": 1, "holder": 1, "expiresAt": 1, "ttlMs": 1 })
            .await
            .map_err(|e| self.fail(e))?;
        Ok(found.map(|d| busy_in(Some(&d), now)))
    }

    /// The release of `lease` when the plain one missed: the key had a
    /// queue (or the lease is gone). Hands the key to the live head, or
    /// frees it.
    pub(super) async fn release_queued(&self, lease: &Lease) -> Result<()> {
        let token = token_as_i64(lease)?;
        self.step_until_done(lease.key(), |snapshot| {
            snapshot.release(lease.owner(), token)
        })
        .await
    }

    /// [`Backend::leave_queue`]: the entry goes, and a grant handed over
    /// to `owner` that it still holds goes to the next head (or is freed).
    pub(super) async fn leave(&self, key: &Key, owner: OwnerId) -> Result<()> {
        self.step_until_done(key, |snapshot| snapshot.leave(owner))
            .await
    }

    /// Reads `key`'s document and writes what `decide` plans on it, until
    /// a write lands or there is nothing to do.
    async fn step_until_done(
        &self,
        key: &Key,
        decide: impl Fn(&Snapshot<'_>) -> Option<Plan>,
    ) -> Result<()> {
        let mut backoff = conflict_backoff();
        for _ in 0..ROUNDS {
            let (Some(d), now) = self.record(key).await? else {
                return Ok(());
            };
            if kind_of(&d)?.is_some() {
                return Ok(());
            }
            let snapshot = Snapshot::read(&d, now)?;
            let Some(plan) = decide(&snapshot) else {
                return Ok(());
            };
            let outcome = plan.outcome.clone();
            if self.write(plan).await? {
                self.after(key, &outcome);
                return Ok(());
            }
            sleep(backoff.next_delay()).await;
        }
        Err(Error::unavailable(format!(
            "the lock document of {key:?} changed under each of {ROUNDS} conditional writes"
        ))
        .in_store(STORE))
    }

    /// Writes `plan` iff the document is still as its conditions say.
    async fn write(&self, plan: Plan) -> Result<bool> {
        let done = self
            .inner
            .coll
            .update_one(plan.filter, plan.update)
            .await
            .map_err(|e| self.fail(e))?;
        Ok(done.matched_count == 1)
    }

    /// Tells this process at once what a landed write did (the change
    /// stream tells every process, this one too, a moment later).
    fn after(&self, key: &Key, outcome: &Outcome) {
        match outcome {
            Outcome::HandedOver { head, grant, .. } => {
                self.inner
                    .watcher
                    .hand_over_local(key.as_str(), *head, *grant);
            }
            Outcome::Freed => {
                self.inner.watcher.wake_local(key.as_str());
                self.poke_sweeper();
            }
            Outcome::Granted(_) | Outcome::Queued | Outcome::Left => {}
        }
    }

    /// The answer to `req` for a landed write of its attempt on `d`.
    fn answer(
        &self,
        req: &AcquireRequest,
        outcome: Outcome,
        d: &Document,
        now: ServerNow,
    ) -> Acquire {
        self.after(req.key(), &outcome);
        match outcome {
            Outcome::Granted(token) => Acquire::Granted(req.granted(token)),
            Outcome::HandedOver { label, claim, .. } => Acquire::Busy(Busy {
                holder: label,
                remaining: claim,
            }),
            Outcome::Queued => Acquire::Busy(busy_in(Some(d), now)),
            // Not an attempt's: busy, try again.
            Outcome::Freed | Outcome::Left => Acquire::Busy(busy_in(None, now)),
        }
    }
}
