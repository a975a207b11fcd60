//! The acquisition engine every store and primitive shares: one attempt
//! at a time at the store, raced against the cancel token and a backstop;
//! between attempts a wait woken by the store's release notifications (or
//! a hand-off to this waiter's queue seat), the holder's remaining ttl or a
//! jittered backoff, never past the caller's bound; and attempts whose
//! caller went away are finished in the background, a grant they bring
//! given back.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep_until, timeout_at, Instant};

use super::in_flight::{give_back, InFlight};
use super::{AcquireOptions, Locks, STORE_ANSWER_GRACE};
use crate::backend::{Acquire, AcquireRequest, Backend, Busy, KeyKind, Lease, PermitKind};
use crate::error::{Error, Result};
use crate::guard::{born_dead, Granted, LeaseGuard, RenewalPlan};
use crate::key::Key;
use crate::local::{Handed, LocalOffer};
use crate::notify::Subscription;
use crate::observe::AcquireProbe;
use crate::queue::QueueSeat;
use crate::time::Backoff;

/// The holder label reported when the store granted the lease but the grant
/// arrived after the lease it started had already ended (the request took
/// longer than the ttl): the grant is given back and the attempt counts as
/// busy.
const LATE_GRANT: &str = "(a grant that arrived after its lease ended)";

impl Locks {
    pub(super) async fn acquire_request(
        &self,
        request: AcquireRequest,
        options: &AcquireOptions,
    ) -> Result<LeaseGuard> {
        let probe = AcquireProbe::start(
            &self.observer,
            &request,
            options.lock_class(),
            options.primitive(),
            options.wait().is_some_and(|w| !w.is_zero()),
        )?;
        let result = self.acquire_observed(request, options, &probe).await;
        probe.finish(&result);
        result
    }

    async fn acquire_observed(
        &self,
        request: AcquireRequest,
        options: &AcquireOptions,
        probe: &AcquireProbe,
    ) -> Result<LeaseGuard> {
        let started = Instant::now();
        let wait = options.wait.unwrap_or(Duration::ZERO);
        // A wait too long to represent is as good as no bound.
        let deadline = started.checked_add(wait);
        // The store bounds its own lock waits by the caller's deadline.
        let mut request = Arc::new(match deadline {
            Some(d) => request.with_lock_deadline(d),
            None => request,
        });
        let backstop = deadline.and_then(|d| d.checked_add(STORE_ANSWER_GRACE));
        // A waiter for a mutex queues at a store that keeps queues, in the
        // order of every process's waiters (queue.rs); elsewhere local
        // waiters for the key queue first, and only the front one waits at
        // the store (see local.rs).
        let mut seat = (!wait.is_zero()
            && options.fair.unwrap_or(self.fair)
            && request.permit_kind().is_none()
            && self.backend.queues())
        .then(|| {
            QueueSeat::new(
                self.backend.clone(),
                &request,
                self.renewals.background().clone(),
            )
        });
        // Where a release can hand the key over (local.rs), a racing mutex
        // waiter leaves its request with the key's local queue on arrival.
        let mut hands_over = !wait.is_zero()
            && seat.is_none()
            && request.permit_kind().is_none()
            && self.backend.hands_over_locally();
        let mut offer = None;
        let mut turn = if wait.is_zero() || seat.is_some() {
            None
        } else if let Some(turn) = self.queues(&request).try_turn(request.key()) {
            // Nobody of this process ahead: only a guard of this process
            // holding the key calls for an offer (its release may hand the
            // key over); uncontended, none is made.
            if hands_over && turn.behind_a_holder() {
                offer = Some(
                    self.queues(&request)
                        .offer(request.key(), request.clone(), true),
                );
            }
            Some(turn)
        } else {
            let queues = self.queues(&request).clone();
            offer = hands_over.then(|| queues.offer(request.key(), request.clone(), false));
            let front = queues.turn(request.key());
            tokio::pin!(front);
            loop {
                let handed = tokio::select! {
                    biased;
                    _ = cancelled(options) => return Err(Error::Cancelled { key: request.key().to_string() }),
                    turn = &mut front => break Some(turn),
                    handed = answered(&mut offer) => handed,
                    _ = sleep_until_some(deadline) => return Err(self.timeout(&request, started, None)),
                };
                // A release handed the key over before this waiter's turn
                // came (its offer was the oldest open one).
                offer = None;
                if let Some(handed) = handed {
                    let mut no_turn = None;
                    if let Some(guard) = self
                        .handed_guard(handed, options, &request, &mut no_turn, probe, backstop)
                        .await
                    {
                        return Ok(guard);
                    }
                }
            }
        };
        // A release of this key that a dropped guard of this handle still
        // has in flight goes first: asked before it lands, the store would
        // answer busy with our own old lease. Bounded like an attempt.
        tokio::select! {
            biased;
            _ = cancelled(options) => return Err(Error::Cancelled { key: request.key().to_string() }),
            _ = self.pending.settled(request.key()) => {}
            _ = sleep_until_some(backstop) => {}
        }
        // A mutex waiter behind a holder of this very process will likely
        // find the key busy: subscribed before its first attempt, one busy
        // answer is enough to wait on (subscribed after a busy answer, it
        // must ask once more, lest a release in between go unnoticed).
        // That saves a store request per wait; measured on fair waiters,
        // which skip the local line (docs/fairness.md, "Asks per grant").
        // A waiter with a local turn reads its key's holder count; only a
        // fair one looks the key up.
        let behind_a_holder = request.permit_kind().is_none()
            && match &turn {
                Some(turn) => turn.behind_a_holder(),
                None => !wait.is_zero() && self.queues(&request).is_held_here(request.key()),
            };
        let mut waiting = None;
        if behind_a_holder {
            waiting = Some(
                self.start_waiting(&request, deadline, seat.is_some())
                    .await?,
            );
        }
        // Where the holder's release can hand the key over (local.rs), the
        // front waiter behind it does not ask at all: its offer stands for
        // that release (an attempt in flight when the holder releases would
        // miss the hand-off), and it asks only if the holder is gone by
        // then, or when woken.
        let mut skip_first = behind_a_holder && offer.is_some() && turn.is_some();
        loop {
            // On the lease clock, which counts suspended time (time.rs).
            let sent_at = self.renewals.clock().now();
            if let Some(seat) = seat.as_mut() {
                request = Arc::new(seat.next_attempt(&request, sent_at));
            }
            let skipped = std::mem::take(&mut skip_first);
            let answer = match skipped {
                // No answer: the store was not asked.
                true => None,
                false => {
                    // Its offer withdrawn while it asks itself; one a
                    // release took already is answered first.
                    if let Some(handed) = self
                        .withdraw(&mut offer, request.key(), options, backstop)
                        .await?
                    {
                        if let Some(guard) = self
                            .handed_guard(handed, options, &request, &mut turn, probe, backstop)
                            .await
                        {
                            return Ok(guard);
                        }
                    }
                    // This process just freed the key after handing it
                    // over here a few times in a row: waiters elsewhere,
                    // woken by that release, ask first (local.rs).
                    if let Some(until) = turn.as_ref().and_then(|t| t.stepping_aside()) {
                        let until = deadline.map_or(until, |d| until.min(d));
                        tokio::select! {
                            biased;
                            _ = cancelled(options) => return Err(Error::Cancelled { key: request.key().to_string() }),
                            _ = sleep_until(until) => {}
                        }
                    }
                    probe.attempt();
                    Some(self.attempt(&request, backstop, options).await?)
                }
            };
            let busy = match answer {
                None => None,
                Some(Acquire::Granted(lease))
                    if born_dead(self.renewals.clock(), &lease, sent_at) =>
                {
                    tracing::warn!(
                        token = lease.token(),
                        "the grant arrived after its lease had ended; giving it back"
                    );
                    self.give_back(&lease, backstop).await;
                    Some(Busy {
                        holder: LATE_GRANT.to_owned(),
                        remaining: Duration::ZERO,
                    })
                }
                Some(Acquire::Granted(lease)) => {
                    tracing::debug!(token = lease.token(), "granted");
                    if let Some(seat) = seat.as_mut() {
                        seat.settle();
                    }
                    return Ok(self.guard(
                        lease,
                        Granted::Asked(sent_at),
                        options,
                        &request,
                        turn,
                        probe,
                    ));
                }
                Some(Acquire::Busy(busy)) => {
                    if let Some(turn) = &turn {
                        turn.found_held_elsewhere();
                    }
                    Some(busy)
                }
                Some(Acquire::OtherKind(KeyKind::ReaderWriter))
                    if request.permit_kind().is_none() =>
                {
                    // One key is one lock: the exclusive acquire of a
                    // reader-writer lock's key is its writer (it waits for
                    // the readers and excludes them). Asked at once, and
                    // from now on this loop asks for the writer only.
                    tracing::debug!("the key is a reader-writer lock; acquiring its writer");
                    request = Arc::new(request.as_writer());
                    // Nobody hands a writer over: the offer goes.
                    (offer, hands_over) = (None, false);
                    // A writer does not queue at the store: this request
                    // never entered the mutex's queue (the kind is checked
                    // first), so there is nothing to leave.
                    if let Some(mut seat) = seat.take() {
                        seat.settle();
                    }
                    continue;
                }
                Some(Acquire::OtherKind(held)) => {
                    // Another kind cannot be shared: refused, never waited on.
                    return Err(Error::KindMismatch {
                        key: request.key().to_string(),
                        held,
                        requested: request.key_kind(),
                    });
                }
            };
            // A waiter that does not wait always asks.
            if let (true, Some(busy)) = (wait.is_zero(), &busy) {
                return Err(Error::Busy {
                    key: request.key().to_string(),
                    holder: busy.holder.clone(),
                    remaining: busy.remaining,
                    kind: lock_kind(&request),
                });
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(self.timeout(&request, started, busy.map(|b| (b, now))));
            }
            if let Some(seat) = seat.as_mut() {
                seat.busy();
            }
            let Some(w) = waiting.as_mut() else {
                // Subscribe, then try again at once: a release between the
                // first attempt and the subscription would otherwise be missed.
                waiting = Some(
                    self.start_waiting(&request, deadline, seat.is_some())
                        .await?,
                );
                continue;
            };
            // Wake just after the holder's lease ends at the latest (one
            // that did not ask takes its own ttl for the holder's); a
            // queued waiter renews its entry in time too.
            let remaining = busy.as_ref().map_or(request.ttl(), |b| b.remaining);
            let until_expiry = remaining + Duration::from_millis(1);
            let next = match seat.as_mut() {
                // The hand-off wakes it; polling only where it cannot.
                Some(seat) if w.subscription.is_live() => seat.next_refresh(),
                Some(seat) => seat.next_refresh().min(w.backoff.next_delay()),
                None => w.backoff.next_delay(),
            };
            let mut wake_at = now + until_expiry.min(next);
            if let Some(d) = deadline {
                wake_at = wake_at.min(d);
            }
            tracing::trace!(holder = ?busy.as_ref().map(|b| &b.holder), ?remaining, "busy, waiting");
            // The front local waiter offers again, first in line, for the
            // holder's release to hand the key over (local.rs).
            if hands_over && offer.is_none() {
                offer = Some(
                    self.queues(&request)
                        .offer(request.key(), request.clone(), true),
                );
            }
            // A waiter that did not ask waits only while the holder is
            // still here: a release that ended before the offer was made
            // did not see it (its wake-up reaches the subscription anyway).
            let holder_left = skipped && !turn.as_ref().is_some_and(|t| t.behind_a_holder());
            if !holder_left {
                let handed = tokio::select! {
                    biased;
                    _ = cancelled(options) => {
                        return Err(Error::Cancelled { key: request.key().to_string() });
                    }
                    handed = answered(&mut offer) => Some(handed),
                    _ = w.subscription.notified() => {
                        probe.woken();
                        None
                    }
                    _ = sleep_until(wake_at) => None,
                };
                if let Some(handed) = handed {
                    offer = None;
                    if let Some(guard) = match handed {
                        Some(handed) => {
                            self.handed_guard(handed, options, &request, &mut turn, probe, backstop)
                                .await
                        }
                        None => None,
                    } {
                        return Ok(guard);
                    }
                }
            }
            // A grant handed over to this waiter: its guard needs no
            // further round trip (queue.rs).
            if let (Some(seat), Some(grant)) = (seat.as_mut(), w.subscription.hand_off()) {
                if let Some(counts_from) = seat.counts_from(grant) {
                    let lease = request.granted(grant.token);
                    let granted = Granted::HandedOver {
                        counts_from,
                        claim_window: request.claim_window(),
                    };
                    if !granted.born_dead(self.renewals.clock(), &lease) {
                        tracing::debug!(token = lease.token(), "handed over");
                        seat.settle();
                        probe.handed_over();
                        return Ok(self.guard(lease, granted, options, &request, turn, probe));
                    }
                    // Too old to trust: the next attempt, a repeat, claims
                    // it if it is still ours.
                    continue;
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.timeout(&request, started, busy.map(|b| (b, now))));
            }
        }
    }

    /// Takes a waiter's open `offer` back before it asks the store itself:
    /// `None` if no release had taken it (or there was none); else that
    /// release's answer, awaited (bounded by the backstop), which may be a
    /// grant.
    async fn withdraw(
        &self,
        offer: &mut Option<LocalOffer>,
        key: &Key,
        options: &AcquireOptions,
        backstop: Option<Instant>,
    ) -> Result<Option<Handed>> {
        let Some(mut taken) = offer.take() else {
            return Ok(None);
        };
        if taken.withdraw() {
            return Ok(None);
        }
        Ok(tokio::select! {
            biased;
            _ = cancelled(options) => return Err(Error::Cancelled { key: key.to_string() }),
            handed = taken.answered() => handed,
            _ = sleep_until_some(backstop) => None,
        })
    }

    /// The guard of a grant a release handed to this waiter (local.rs),
    /// taking its turn if it has one; `None` if the grant came too late to
    /// trust (it is given back).
    async fn handed_guard(
        &self,
        handed: Handed,
        options: &AcquireOptions,
        request: &AcquireRequest,
        turn: &mut Option<crate::local::LocalTurn>,
        probe: &AcquireProbe,
        backstop: Option<Instant>,
    ) -> Option<LeaseGuard> {
        if born_dead(self.renewals.clock(), &handed.lease, handed.sent_at) {
            self.give_back(&handed.lease, backstop).await;
            return None;
        }
        tracing::debug!(token = handed.lease.token(), "handed over in a release");
        probe.handed_over();
        let granted = Granted::Asked(handed.sent_at);
        Some(self.guard(handed.lease, granted, options, request, turn.take(), probe))
    }

    /// Subscribes `request`'s waiter to its key's releases (and, if it is
    /// `queued` at the store, to a hand-off told to its owner).
    async fn start_waiting(
        &self,
        request: &AcquireRequest,
        deadline: Option<Instant>,
        queued: bool,
    ) -> Result<Waiting> {
        let mut w = Waiting::start(&*self.backend, request.key(), deadline).await?;
        if queued {
            w.subscription.expect_hand_off(request.owner());
        }
        Ok(w)
    }

    /// The guard of a grant, counted on this handle's queues, with the
    /// local turn given up (the next local waiter may go to the store now:
    /// local.rs).
    fn guard(
        &self,
        lease: Lease,
        granted: Granted,
        options: &AcquireOptions,
        request: &AcquireRequest,
        turn: Option<crate::local::LocalTurn>,
        probe: &AcquireProbe,
    ) -> LeaseGuard {
        let hold = self.queues(request).hold(request.key());
        drop(turn);
        // A grant handed over lasts its claim window at the store until a
        // renewal gives it the whole ttl: claimed at once when asked, or
        // when no renewal is to come (so that it still lasts the ttl
        // asked); else at its first renewal, a third into that window, as
        // any lease a third into its ttl (most holds end before, and the
        // claim is a store write saved).
        let plan = RenewalPlan {
            auto_renew: options.auto_renew,
            claim_now: matches!(granted, Granted::HandedOver { .. })
                && (options.prompt_claim || !options.auto_renew),
        };
        LeaseGuard::start(
            self.backend.clone(),
            &self.renewals,
            (lease, granted),
            plan,
            hold,
            self.pending.clone(),
            probe.tally(),
        )
    }

    /// One attempt at the store, raced against the cancel token and the
    /// backstop. An attempt cut short, here or because the caller dropped
    /// the acquisition, is not abandoned (the store may already have
    /// granted it, and the grant would then hold the key for a ttl with
    /// nobody renewing or releasing it): [`InFlight`] finishes it in the
    /// background and releases a grant it brings.
    async fn attempt(
        &self,
        request: &Arc<AcquireRequest>,
        backstop: Option<Instant>,
        options: &AcquireOptions,
    ) -> Result<Acquire> {
        let backend = self.backend.clone();
        let owned = request.clone();
        let mut attempt = InFlight {
            attempt: Some(Box::pin(async move { backend.try_acquire(&owned).await })),
            locks: self,
            request,
        };
        tokio::select! {
            biased;
            outcome = &mut attempt => outcome,
            _ = cancelled(options) => Err(Error::Cancelled { key: request.key().to_string() }),
            _ = sleep_until_some(backstop) => Err(Error::unavailable(format!(
                "the store did not answer an acquire of {:?} within {STORE_ANSWER_GRACE:?} after the wait bound",
                request.key().as_str()
            ))),
        }
    }

    /// Releases a grant that will not become a guard, within the backstop
    /// (past it the lease simply expires). The release runs on a task of
    /// the background runtime, so a caller that goes away meanwhile does
    /// not cut it short; it is recorded as pending, so a later acquisition
    /// of the key through this handle waits for it.
    async fn give_back(&self, lease: &Lease, backstop: Option<Instant>) {
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let backend = self.backend.clone();
        let lease = lease.clone();
        let pending = self.pending.begin(lease.key());
        self.renewals.background().spawn(async move {
            let _pending = pending;
            give_back(&*backend, &lease).await;
            let _ = done.send(());
        });
        tokio::select! {
            _ = finished => {}
            _ = sleep_until_some(backstop) => {}
        }
    }

    /// The timeout error, with the holder of the last busy answer (`seen`,
    /// and when it came) and what remains of its lease now.
    fn timeout(
        &self,
        request: &AcquireRequest,
        started: Instant,
        seen: Option<(Busy, Instant)>,
    ) -> Error {
        let (holder, remaining) = match seen {
            Some((busy, at)) => (
                Some(busy.holder),
                Some(busy.remaining.saturating_sub(at.elapsed())),
            ),
            None => (None, None),
        };
        Error::Timeout {
            key: request.key().to_string(),
            waited: started.elapsed(),
            held_here: self.queues(request).is_held_here(request.key()),
            holder,
            remaining,
        }
    }
}

/// The answer to a local waiter's offer; never without one.
async fn answered(offer: &mut Option<crate::local::LocalOffer>) -> Option<Handed> {
    match offer {
        Some(offer) => offer.answered().await,
        None => std::future::pending().await,
    }
}

/// Resolves when the caller's cancel token fires; never without one.
async fn cancelled(options: &AcquireOptions) {
    match &options.cancel {
        Some(c) => c.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A waiter's state between attempts: its release subscription and backoff.
struct Waiting {
    subscription: Subscription,
    backoff: Backoff,
}

impl Waiting {
    /// Subscribes to releases of `key`, but by `deadline` at the latest: a
    /// store that is slow to set up its notifications (a pool with no free
    /// connection, a refused or unanswered pub/sub connection) leaves this
    /// waiter polling rather than waiting past its bound.
    async fn start(backend: &dyn Backend, key: &Key, deadline: Option<Instant>) -> Result<Self> {
        let subscribe = backend.subscribe(key);
        let subscription = match deadline {
            Some(d) => timeout_at(d, subscribe).await.unwrap_or_else(|_| {
                tracing::debug!(%key, "release notifications not ready by the deadline; polling");
                Ok(Subscription::never())
            })?,
            None => subscribe.await?,
        };
        let backoff = if subscription.is_live() {
            // Notifications do the work; the timer is only a safety net for
            // a notification lost with a dropped connection.
            Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
        } else {
            Backoff::new(Duration::from_millis(5), Duration::from_millis(250))
        };
        Ok(Waiting {
            subscription,
            backoff,
        })
    }
}

/// What a request asks for, as [`Error::Busy`] names it.
fn lock_kind(request: &AcquireRequest) -> crate::error::LockKind {
    use crate::error::LockKind;
    match request.permit_kind() {
        None => LockKind::Mutex,
        Some(PermitKind::Semaphore(permits)) => LockKind::Semaphore { permits },
        Some(PermitKind::Read) => LockKind::Read,
        Some(PermitKind::Write) => LockKind::Write,
    }
}
