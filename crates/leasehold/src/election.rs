//! Leader election on one key: [`Locks::election`], campaigning
//! ([`Election::campaign`] → [`Leadership`]), resigning, and following the
//! leader from any process ([`Election::observe`] → [`Observer`]).
//!
//! A leader is the holder of an ordinary lease on the election's key, so
//! the lock's rules carry over: one leader at a time by the store's clock,
//! a fencing token per term that never goes backwards, renewal and the
//! lost signal of [`LeaseGuard`]. The candidate's id is the lease's holder
//! label, the field every store already keeps beside the owner for
//! `inspect` and `list`: no store needs a new column, and `leasehold
//! status` shows the leader by name. (The owner id stays a fresh random
//! value per term, so a candidate that campaigns twice cannot renew or
//! release its earlier term's lease.)
//!
//! Observers learn of changes from the store's notifications: a release
//! wakes them like it wakes waiters, and a new leader's campaign ends with
//! [`Backend::announce`](crate::Backend::announce) on the same channel. A
//! store that cannot announce leaves observers polling: at the leader's
//! expiry while there is one, with a backoff while there is none.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, timeout_at, Instant};
use tracing::Instrument;

use crate::backend::{Backend, LeaseInfo, Subscription};
use crate::error::{Error, Result};
use crate::guard::LeaseGuard;
use crate::key::Key;
use crate::lock::{AcquireOptions, Locks, STORE_ANSWER_GRACE};
use crate::time::Backoff;

/// Longest candidate id, in bytes (the holder label's limit).
pub const MAX_CANDIDATE_BYTES: usize = 256;

impl Locks {
    /// The election held on `key`. Nothing is sent to the store yet.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad key.
    pub fn election(&self, key: &str) -> Result<Election> {
        Ok(Election {
            locks: self.clone(),
            key: Key::new(key)?,
        })
    }
}

/// One election: a key whose lease holder is the leader.
#[derive(Debug, Clone)]
pub struct Election {
    locks: Locks,
    key: Key,
}

/// A leader as observers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The id the leader campaigned with.
    pub candidate: String,
    /// The fencing token of its term: larger than every earlier term's.
    pub token: u64,
}

impl Election {
    /// The election's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Campaigns as `candidate` until elected, within `options`' wait bound
    /// (without one, tries once). Once elected, the term is announced to
    /// observers ([`Backend::announce`](crate::Backend::announce)); a failed
    /// announcement is logged and observers find the leader by polling.
    ///
    /// Like an acquisition, the call returns within its wait bound plus
    /// [`STORE_ANSWER_GRACE`]: the announcement gets what is left of that
    /// (a store that does not answer it leaves the new leader elected, and
    /// observers polling).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (before any I/O) for an empty candidate id,
    /// one over [`MAX_CANDIDATE_BYTES`] or with control characters, or a bad
    /// ttl; otherwise as [`Locks::acquire_with`] ([`Error::Busy`] when
    /// trying once and another candidate leads, [`Error::Timeout`], ...).
    pub async fn campaign(&self, candidate: &str, options: &AcquireOptions) -> Result<Leadership> {
        validate_candidate(candidate)?;
        // The announcement shares the acquisition's bound: the wait plus
        // the grace for a store's answer (a wait too long to represent is
        // no bound).
        let bound = Instant::now()
            .checked_add(options.wait().unwrap_or(Duration::ZERO))
            .and_then(|d| d.checked_add(STORE_ANSWER_GRACE));
        let span = tracing::debug_span!("campaign", key = %self.key, candidate);
        async {
            let guard = self
                .locks
                .clone()
                .with_holder_label(candidate)
                .acquire_with(
                    self.key.as_str(),
                    &options.for_primitive(crate::observe::Primitive::Election),
                )
                .await?;
            let announce = self.locks.backend().announce(&self.key);
            let announced = match bound {
                Some(bound) => timeout_at(bound, announce).await.unwrap_or_else(|_| {
                    Err(Error::unavailable(
                        "the store did not answer the announcement within the campaign's bound",
                    ))
                }),
                None => announce.await,
            };
            if let Err(e) = announced {
                tracing::warn!(error = %e, "could not announce the new leader; observers will find it by polling");
            }
            Ok(Leadership {
                guard,
                candidate: candidate.to_owned(),
            })
        }
        .instrument(span)
        .await
    }

    /// The current leader, if any.
    ///
    /// # Errors
    /// Store errors.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self
            .locks
            .backend()
            .inspect(&self.key)
            .await?
            .map(leader_of))
    }

    /// Starts following the leader. The store's notifications are listened
    /// to before anything is read, so no change after this returns is
    /// missed; [`Observer::next`] then yields the current leader first.
    ///
    /// # Errors
    /// Store errors.
    pub async fn observe(&self) -> Result<Observer> {
        let backend = self.locks.backend().clone();
        let subscription = backend.subscribe(&self.key).await?;
        let backoff = idle_backoff(&subscription, SAFETY_POLL);
        Ok(Observer {
            backend,
            key: self.key.clone(),
            subscription,
            backoff,
            safety_poll: SAFETY_POLL,
            last_token: None,
        })
    }
}

fn validate_candidate(candidate: &str) -> Result<()> {
    let problem = if candidate.is_empty() {
        "a candidate id cannot be empty".to_owned()
    } else if candidate.len() > MAX_CANDIDATE_BYTES {
        format!("{} bytes; at most {MAX_CANDIDATE_BYTES}", candidate.len())
    } else if candidate.chars().any(char::is_control) {
        "control characters are not allowed".to_owned()
    } else {
        return Ok(());
    };
    Err(Error::invalid("candidate", problem))
}

fn leader_of(info: LeaseInfo) -> Leader {
    Leader {
        candidate: info.holder,
        token: info.token,
    }
}

/// The first look of an observer with no leader to watch, on a store that
/// notifies: only a safety net for a notification lost with a dropped
/// connection.
const SAFETY_POLL: Duration = Duration::from_millis(50);

/// How an observer with no leader to watch looks again: notifications do the
/// work when the store sends them (the timer, from `safety_poll` up, is only
/// a safety net), else it polls.
fn idle_backoff(subscription: &Subscription, safety_poll: Duration) -> Backoff {
    if subscription.is_live() {
        Backoff::new(safety_poll, safety_poll.max(Duration::from_secs(2)))
    } else {
        Backoff::new(Duration::from_millis(5), Duration::from_millis(250))
    }
}

/// A term as leader: the lease on the election's key.
#[derive(Debug)]
#[must_use = "leadership ends (the lease is released) as soon as it is dropped"]
pub struct Leadership {
    guard: LeaseGuard,
    candidate: String,
}

impl Leadership {
    /// The id this leader campaigned with.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// This term's fencing token: pass it to what the leader writes.
    pub fn token(&self) -> u64 {
        self.guard.token()
    }

    /// The lease behind the term.
    pub fn guard(&self) -> &LeaseGuard {
        &self.guard
    }

    /// Resolves when leadership is lost (see [`LeaseGuard::lost`]).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// Gives leadership up: releases the lease, which wakes waiting
    /// candidates and observers.
    ///
    /// # Errors
    /// As [`LeaseGuard::release`]; the term then ends at its ttl.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

/// Follows an election's leader: each [`next`](Self::next) yields a leader
/// whose term's token is above the last one yielded.
///
/// Woken by the store's notifications (a release, an announced grant), it
/// reads the key once per wake-up. A term that begins and ends between two
/// reads is not seen; the gap shows as a jump in tokens.
pub struct Observer {
    backend: Arc<dyn Backend>,
    key: Key,
    subscription: Subscription,
    backoff: Backoff,
    safety_poll: Duration,
    last_token: Option<u64>,
}

impl Observer {
    /// Sets the safety-net poll of a notified observer with no leader to
    /// watch (50 ms by default, doubling to 2 s). The conformance suite makes
    /// it longer than its bounds, so that an observer that notices a new
    /// leader in time can only have been woken by the announcement.
    #[cfg(feature = "conformance")]
    pub(crate) fn with_safety_poll(mut self, poll: Duration) -> Self {
        self.safety_poll = poll;
        self.backoff = idle_backoff(&self.subscription, poll);
        self
    }

    /// The next leader: the current one on the first call, then each new
    /// term in token order. Waits as long as it takes; race it against a
    /// timer or a cancel token to bound it.
    ///
    /// # Errors
    /// Store errors (the observer can be called again after one).
    ///
    /// # Cancel safety
    /// Cancel safe: a change that happens while the future is dropped is
    /// found by the next call.
    pub async fn next(&mut self) -> Result<Leader> {
        loop {
            let current = self.backend.inspect(&self.key).await?;
            let wait = match current {
                Some(info) if self.last_token.is_none_or(|last| info.token > last) => {
                    self.last_token = Some(info.token);
                    self.backoff = idle_backoff(&self.subscription, self.safety_poll);
                    return Ok(leader_of(info));
                }
                // The same leader: its term can only end at a release (we
                // are woken) or at its expiry (we look then).
                Some(info) => info.remaining + Duration::from_millis(1),
                None => self.backoff.next_delay(),
            };
            tokio::select! {
                _ = self.subscription.notified() => {}
                _ = sleep(wait) => {}
            }
        }
    }
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("key", &self.key)
            .field("notified", &self.subscription.is_live())
            .field("last_token", &self.last_token)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::decorator::Decorator;
    use crate::backends::memory::MemoryBackend;

    /// The memory store, except that announcements are never answered.
    #[derive(Debug, Default)]
    struct SilentAnnounce(MemoryBackend);

    impl Decorator for SilentAnnounce {
        fn inner(&self) -> &dyn Backend {
            &self.0
        }
        fn announce<'a>(&'a self, _key: &'a Key) -> crate::backend::BoxFuture<'a, Result<bool>> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test]
    async fn an_unanswered_announcement_does_not_hold_the_campaign() {
        let locks = Locks::new(SilentAnnounce::default());
        let election = locks.election("silent").unwrap();
        let options = AcquireOptions::new().with_wait(Duration::from_millis(100));
        // Far beyond the bound (wait + grace); without one it never returns.
        let leadership =
            tokio::time::timeout(Duration::from_secs(30), election.campaign("me", &options))
                .await
                .expect("the campaign returns although the store never answers the announcement")
                .unwrap();
        assert_eq!(election.leader().await.unwrap().unwrap().candidate, "me");
        leadership.resign().await.unwrap();
    }

    #[test]
    fn candidate_ids_are_checked() {
        assert!(validate_candidate("worker-1").is_ok());
        for (bad, why) in [
            ("", "empty"),
            ("a\nb", "control"),
            (&*"x".repeat(MAX_CANDIDATE_BYTES + 1), "at most 256"),
        ] {
            let e = validate_candidate(bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidInput {
                        what: "candidate",
                        ..
                    }
                ) && e.to_string().contains(why),
                "{e}"
            );
        }
    }
}
