//! The held lock: [`LeaseGuard`], its background renewal, and the lost-lease
//! signal.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::renew_attempt_timeout;
use crate::backend::{Backend, Lease, OwnerId};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::local::{Handed, LocalHold, Successor};
use crate::observe::{HoldWatch, Lost, Renewal, Tally};
use crate::pending::PendingReleases;
use crate::renewal::{RenewalScheduler, Ticket};
use crate::time::{renew_interval, trusted_for, Backoff, LeaseClock};

/// The span of one store call on a held lease (`"release"`, `"renew"`): the
/// lease's key and token, and the fields the telemetry and the outcome fill
/// in later.
macro_rules! lease_call_span {
    ($name:literal, $lease:expr) => {
        tracing::debug_span!(
            $name,
            key = %$lease.key(),
            token = $lease.token(),
            store = tracing::field::Empty,
            primitive = tracing::field::Empty,
            lock_class = tracing::field::Empty,
            outcome = tracing::field::Empty,
        )
    };
}

/// A held lease. Renews itself in the background every ttl/3 while it lives.
///
/// # The lost-lease signal
/// The guard trusts its lease until [`valid_until`](Self::valid_until): the
/// moment the last successful request (acquire or renew) was *sent*, plus
/// the ttl, minus a safety margin of 1 % of the ttl + 2 ms. If no renewal
/// succeeds by then, or the store says the lease is gone, [`lost`](Self::lost)
/// resolves and renewal stops for good. Work that must not outlive the lease
/// should race against `lost()` and pass [`token`](Self::token) to the
/// resource it writes (see the crate docs on fencing).
///
/// # When each signal fires
/// The store never tells a holder that its lease was broken; the guard
/// finds out when it next talks to the store. A renewal is sent ttl/3 after
/// the last successful request was sent (transient failures are retried
/// until `valid_until`). [`lost`](Self::lost) resolves, and
/// [`is_lost`](Self::is_lost) and [`check`](Self::check) report the loss:
///
/// | what happened | when the guard notices |
/// |---|---|
/// | `force_release`, or the lease expired at the store and another process took the key | at the next renewal, when the store answers that the lease is gone: up to ttl/3 (plus a round trip) after the break |
/// | the store is unreachable or answers only with transient errors | at `valid_until`: `is_lost()` and `check()` compare the clock on every call, so they flip at that instant; `lost()` resolves when the renewal task sees the deadline pass (timer precision; after a suspend, within a second of resuming) |
/// | renewal fails with a permanent store error | then |
/// | renewal disabled ([`AcquireOptions::with_auto_renew`](crate::AcquireOptions::with_auto_renew)`(false)`) | at `valid_until` |
/// | [`release`](Self::release) or drop | never: the signal is for losing a lease, not for giving it up |
///
/// So after a force-release, `is_lost()` stays `false` until that next
/// renewal. Checks that must not wait for it are made by the resource
/// itself: a fenced write (`WHERE fence <= token`) or, on PostgreSQL,
/// `PostgresBackend::check_in` inside the writing transaction refuse a
/// broken lease at once.
///
/// # Suspend and resume
/// Deadlines are measured on a clock that keeps running while the machine
/// is suspended or its VM frozen (on Linux, `CLOCK_BOOTTIME`): a holder that
/// resumes after its lease ran out sees [`is_lost`](Self::is_lost) at once and
/// [`lost`](Self::lost) within a second.
///
/// # Local waiters
/// Tasks waiting for the key through the same [`Locks`](crate::Locks) (or a
/// clone) wait at the store like any other process: the first of them gets
/// the key as soon as the store frees it, even while this guard still lives
/// (after its lease was lost, expired or broken).
///
/// # Dropping
/// Dropping the guard stops renewal at once and releases the lease
/// best-effort on a background task of the current tokio runtime (outside
/// any runtime, of the runtime renewal runs on: see
/// [`Locks::with_background_runtime`](crate::Locks::with_background_runtime));
/// if the store is unreachable, the lease simply expires after its ttl.
/// Call [`release`](Self::release) to release and see the outcome.
///
/// # Renewal and runtimes
/// Renewal does not run on the runtime the guard was acquired on, but on the
/// library's own background thread (unless the [`Locks`](crate::Locks) names
/// a runtime), so a guard keeps renewing, and [`lost`](Self::lost) keeps its
/// promise, when the runtime that took it, or any other, shuts down.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LeaseGuard {
    lease: Lease,
    backend: Arc<dyn Backend>,
    state: Arc<GuardState>,
    stop_renewal: CancellationToken,
    renewals: RenewalScheduler,
    renewal_start: Ticket,
    released: bool,
    /// Marks the key as held by this process, so a local waiter that times
    /// out can say so; where the front local waiter leaves its request for
    /// this guard's release to hand the key over (local.rs).
    hold: LocalHold,
    /// Where a release started by `drop` is recorded until it is answered,
    /// so that the next acquisition of the key through the same `Locks`
    /// waits for it instead of finding its own old lease.
    pending: Arc<PendingReleases>,
    /// Counts the hold (grant to drop) for stats and metrics.
    _watch: HoldWatch,
}

struct GuardState {
    lost: CancellationToken,
    clock: LeaseClock,
    /// On the lease clock (see [`LeaseClock`]).
    valid_until: Mutex<Instant>,
    /// Where renewals and the loss are counted (observe.rs).
    tally: Tally,
}

impl GuardState {
    /// The deadline on the lease clock.
    fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn extend(&self, until: Instant) {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }

    /// Reports an event of this lease to stats and metrics.
    fn observe<R>(&self, event: impl FnOnce(&Tally) -> R) {
        let _ = event(&self.tally);
    }
}

/// Whether a guard for `lease`, granted by a request sent at `sent_at` on
/// `clock`, would be lost from birth: its `valid_until` (as
/// [`LeaseGuard::start`] computes it) has already passed. The core never
/// hands such a guard out.
pub(crate) fn born_dead(clock: &LeaseClock, lease: &Lease, sent_at: Instant) -> bool {
    clock.now() >= sent_at + trusted_for(lease.ttl())
}

/// How the store granted a guard's lease.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Granted {
    /// For the lease's ttl, by a request sent at this moment.
    Asked(Instant),
    /// Handed over to a queued waiter (queue.rs): the store grants it for
    /// the claim window, counted from this moment at the latest, and the
    /// guard claims it with a renewal (at its first renewal time, or at
    /// once: lock/acquire.rs decides).
    HandedOver {
        counts_from: Instant,
        claim_window: Duration,
    },
}

impl Granted {
    /// When the grant counts from, and for how long the store keeps it.
    fn lasts(self, lease: &Lease) -> (Instant, Duration) {
        match self {
            Granted::Asked(sent_at) => (sent_at, lease.ttl()),
            Granted::HandedOver {
                counts_from,
                claim_window,
            } => (counts_from, claim_window),
        }
    }

    /// Whether its `valid_until` has already passed.
    pub(crate) fn born_dead(self, clock: &LeaseClock, lease: &Lease) -> bool {
        let (from, lasts) = self.lasts(lease);
        clock.now() >= from + trusted_for(lasts)
    }
}

/// Which renewals a guard sends (lock/acquire.rs decides from the
/// acquire options and how the lease was granted).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenewalPlan {
    /// Renew every third of the ttl; else only the lost-lease timer runs,
    /// for the deadline.
    pub(crate) auto_renew: bool,
    /// Send one renewal at once first: the claim of a grant handed over.
    pub(crate) claim_now: bool,
}

impl LeaseGuard {
    /// Wraps a lease granted as `granted` says (the pair is the grant; on
    /// the lease clock of `renewals`) and schedules its renewals as `plan`
    /// says: from its first renewal time, at once for a claim, or only the
    /// lost-lease timer for its deadline. Its hold, renewals and loss are
    /// counted under `tally`'s labels.
    pub(crate) fn start(
        backend: Arc<dyn Backend>,
        renewals: &RenewalScheduler,
        (lease, granted): (Lease, Granted),
        plan: RenewalPlan,
        hold: LocalHold,
        pending: Arc<PendingReleases>,
        tally: &Tally,
    ) -> Self {
        let (sent_at, lasts) = granted.lasts(&lease);
        let valid_until = sent_at + trusted_for(lasts);
        let first_due = if plan.claim_now {
            renewals.clock().now()
        } else if plan.auto_renew {
            sent_at + renew_interval(lasts)
        } else {
            valid_until
        };
        // Counted before the renewal is scheduled: a claim sent at once
        // may run on the background runtime before this returns.
        let watch = tally.hold(lease.token());
        let state = Arc::new(GuardState {
            lost: CancellationToken::new(),
            clock: renewals.clock().clone(),
            valid_until: Mutex::new(valid_until),
            tally: watch.tally().clone(),
        });
        let stop_renewal = CancellationToken::new();
        let renewal_start = renewals.schedule(
            first_due,
            Box::pin(keep_alive(
                backend.clone(),
                lease.clone(),
                state.clone(),
                stop_renewal.clone(),
                first_due,
                plan,
            )),
        );
        LeaseGuard {
            lease,
            backend,
            state,
            stop_renewal,
            renewals: renewals.clone(),
            renewal_start,
            released: false,
            hold,
            pending,
            _watch: watch,
        }
    }

    /// The front local waiter's offer for this release to hand the key
    /// over, where the store can (a mutex).
    fn offer(&self) -> Successor {
        let mutex = self.lease.slot().is_none();
        if mutex && self.backend.hands_over_locally() {
            self.hold.take_offer()
        } else {
            Successor::Nobody
        }
    }

    /// Stops renewal: unschedules it if it has not started, else stops it.
    fn stop_renewal(&self) {
        if !self.renewals.cancel(self.renewal_start) {
            self.stop_renewal.cancel();
        }
    }

    /// The locked key.
    pub fn key(&self) -> &Key {
        self.lease.key()
    }

    /// The fencing token: strictly larger than every earlier grant of this
    /// key. Send it with every write to a resource that checks tokens.
    pub fn token(&self) -> u64 {
        self.lease.token()
    }

    /// For a semaphore permit, its slot (`0..permits`): a fenced resource
    /// keeps the highest token it accepted per slot (docs/semaphore.md).
    /// `None` for a mutex.
    pub fn slot(&self) -> Option<u32> {
        self.lease.slot()
    }

    /// For a grant of a reader-writer lock, its side (a reader's slot is
    /// `0..MAX_PERMITS`, the writer's
    /// [`WRITER_SLOT`](crate::backend::WRITER_SLOT)); `None` otherwise.
    pub fn rw_side(&self) -> Option<crate::backend::RwSide> {
        self.lease.rw_side()
    }

    /// The store-side owner id of this acquisition.
    pub fn owner(&self) -> OwnerId {
        self.lease.owner()
    }

    /// The lease as the store knows it.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Until when this process may rely on the lease, as a tokio instant.
    /// Moves forward with every successful renewal, and back by the time the
    /// machine spends suspended (see "Suspend and resume" above).
    pub fn valid_until(&self) -> Instant {
        self.state.clock.to_local(self.state.valid_until())
    }

    /// Whether the lease is lost: the signal fired, or `valid_until` passed
    /// (see [When each signal fires](Self#when-each-signal-fires)).
    pub fn is_lost(&self) -> bool {
        self.state.lost.is_cancelled() || self.state.clock.now() >= self.state.valid_until()
    }

    /// Resolves when the lease is lost (renewal failed until `valid_until`, or
    /// the store reported the lease gone at a renewal; see
    /// [When each signal fires](Self#when-each-signal-fires)). Never
    /// resolves while renewals succeed, and does not resolve because of
    /// [`release`](Self::release).
    ///
    /// The future does not borrow the guard, so it can be raced against the
    /// guarded work in `tokio::select!` or moved into another task.
    ///
    /// # Cancel safety
    /// Cancel safe; make a new one at any time.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.state.lost.clone().cancelled_owned()
    }

    /// `Ok(())` while the lease can be relied on, else [`Error::LeaseLost`].
    ///
    /// # Errors
    /// [`Error::LeaseLost`] once [`is_lost`](Self::is_lost) is true.
    pub fn check(&self) -> Result<()> {
        if self.is_lost() {
            Err(Error::LeaseLost {
                key: self.key().to_string(),
            })
        } else {
            Ok(())
        }
    }

    /// Stops renewal and releases the lease at the store, waking waiters.
    ///
    /// Releasing a lease that was already lost is not an error: the store
    /// only frees the key if this lease still holds it.
    ///
    /// # Errors
    /// [`Error::Unavailable`] or [`Error::Backend`] if the store could not be
    /// told; the lease then expires after its ttl.
    ///
    /// # Cancel safety
    /// Not cancel safe: if the future is dropped, the release may or may not
    /// have reached the store (the lease then expires after its ttl).
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.stop_renewal();
        let span = lease_call_span!("release", self);
        self.state.observe(|t| t.label(&span));
        let offer = self.offer();
        let result = release(&*self.backend, &self.lease, offer, &self.state.clock)
            .instrument(span.clone())
            .await;
        span.record("outcome", if result.is_ok() { "ok" } else { "error" });
        result
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.stop_renewal();
        // On the dropping task's runtime when there is one: the release is
        // then on its way without a wake-up of another thread, and the next
        // acquisition of the key (which waits for it) goes on sooner.
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.renewals.background().handle());
        if let Some(runtime) = runtime {
            let backend = self.backend.clone();
            let lease = self.lease.clone();
            let pending = self.pending.begin(self.key());
            let offer = self.offer();
            let clock = self.state.clock.clone();
            runtime.spawn(async move {
                let _pending = pending;
                let span = tracing::debug_span!("release", key = %lease.key(), token = lease.token());
                if let Err(e) = release(&*backend, &lease, offer, &clock).instrument(span).await {
                    tracing::warn!(key = %lease.key(), error = %e, "best-effort release on drop failed; the lease will expire");
                }
            });
        }
    }
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("key", self.key())
            .field("token", &self.token())
            .field("owner", &self.owner())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// Renews the lease every ttl/3 from `due` on and fires the lost signal
/// when the lease can no longer be relied on (with renewal off, only that
/// signal). With `plan.claim_now`, one renewal is sent at once first, and
/// the next comes ttl/3 after it: the claim of a grant handed over (with
/// renewal off, so that it still gets its whole ttl). Stops when `stop`
/// is cancelled or the lease is lost.
/// Releases `lease`; with a front local waiter's `offer`, hands the key to
/// it inside the release where the store can (local.rs), and tells the
/// waiter either way. A grant whose waiter went away meanwhile is released.
async fn release(
    backend: &dyn Backend,
    lease: &Lease,
    successor: Successor,
    clock: &LeaseClock,
) -> Result<()> {
    let offer = match successor {
        Successor::Nobody => return backend.release(lease).await,
        Successor::StepAside(aside) => {
            let started = tokio::time::Instant::now();
            let released = backend.release(lease).await;
            aside.for_as_long_as(started.elapsed());
            return released;
        }
        Successor::Offer(offer) => offer,
    };
    let sent_at = clock.now();
    match backend.release_to(lease, offer.request()).await {
        Ok(Some(granted)) => {
            if let Err(unwanted) = offer.answer(Some(Handed {
                lease: granted,
                sent_at,
            })) {
                let lease = unwanted.lease;
                if let Err(e) = backend.release(&lease).await {
                    tracing::warn!(key = %lease.key(), token = lease.token(), error = %e, "could not give back a grant whose waiter went away; it will expire");
                }
            }
            Ok(())
        }
        Ok(None) => {
            let released = backend.release(lease).await;
            let _ = offer.answer(None);
            released
        }
        Err(e) => {
            let _ = offer.answer(None);
            Err(e)
        }
    }
}

async fn keep_alive(
    backend: Arc<dyn Backend>,
    lease: Lease,
    state: Arc<GuardState>,
    stop: CancellationToken,
    mut due: Instant,
    plan: RenewalPlan,
) {
    let ttl = lease.ttl();
    let clock = state.clock.clone();
    let outcome = tokio::select! {
        biased;
        _ = stop.cancelled() => return,
        outcome = async {
            if plan.claim_now {
                match renew_until_deadline(&*backend, &lease, &state).await {
                    // The claim is a renewal: the next one a third of the
                    // ttl after it.
                    Ok(sent) => due = sent + renew_interval(ttl),
                    Err(why) => return why,
                }
            }
            if !plan.auto_renew {
                clock.sleep_until(state.valid_until()).await;
                state.observe(|t| t.lost(Lost::Expired));
                return "lease ran out (renewal disabled)";
            }
            loop {
                clock.sleep_until(due).await;
                match renew_until_deadline(&*backend, &lease, &state).await {
                    Ok(sent) => due = sent + renew_interval(ttl),
                    Err(why) => return why,
                }
            }
        } => outcome,
    };
    tracing::warn!(key = %lease.key(), token = lease.token(), reason = outcome, "lease lost");
    state.lost.cancel();
}

/// One renewal, retried on transient errors and on attempts that outlive
/// their own bound ([`renew_attempt_timeout`]: a black-holed connection must
/// not take the whole lease with it) until the lease's deadline. Returns
/// when the successful request was sent, or why the lease is lost.
async fn renew_until_deadline(
    backend: &dyn Backend,
    lease: &Lease,
    state: &GuardState,
) -> std::result::Result<Instant, &'static str> {
    let ttl = lease.ttl();
    let deadline = state.valid_until();
    let mut backoff = Backoff::new(
        (ttl / 20).max(Duration::from_millis(5)),
        (ttl / 6).max(Duration::from_millis(10)),
    );
    let clock = &state.clock;
    loop {
        let sent = clock.now();
        if sent >= deadline {
            state.observe(|t| t.lost(Lost::Expired));
            return Err("renewal did not succeed before the lease's deadline");
        }
        let span = lease_call_span!("renew", lease);
        state.observe(|t| t.label(&span));
        let attempt_deadline = (sent + renew_attempt_timeout(ttl)).min(deadline);
        let answer = tokio::select! {
            biased;
            answer = backend.renew(lease, ttl).instrument(span.clone()) => Ok(answer),
            () = clock.sleep_until(attempt_deadline) => Err(()),
        };
        span.record(
            "outcome",
            match &answer {
                Ok(Ok(true)) => "ok",
                Ok(Ok(false)) | Ok(Err(_)) => "failed",
                Err(()) => "unknown",
            },
        );
        match answer {
            Ok(Ok(true)) => {
                state.observe(|t| t.renewal(Renewal::Ok));
                state.extend(sent + trusted_for(ttl));
                return Ok(sent);
            }
            Ok(Ok(false)) => {
                state.observe(|t| (t.renewal(Renewal::Failed), t.lost(Lost::Gone)));
                return Err("the store reports the lease expired or taken");
            }
            // Dropping the attempt gives its connection up; the next one
            // goes out on another connection where the store's pool has one.
            Err(_) if clock.now() < deadline => {
                state.observe(|t| t.renewal(Renewal::Unknown));
                tracing::debug!("renewal attempt timed out, retrying");
            }
            Err(_) => {
                state.observe(|t| (t.renewal(Renewal::Unknown), t.lost(Lost::Expired)));
                return Err("renewal did not answer before the lease's deadline");
            }
            Ok(Err(e)) if e.is_retryable() => {
                state.observe(|t| t.renewal_error(&e));
                tracing::debug!(error = %e, "renewal failed, retrying");
                clock
                    .sleep_until((clock.now() + backoff.next_delay()).min(deadline))
                    .await;
            }
            Ok(Err(e)) => {
                state.observe(|t| (t.renewal_error(&e), t.lost(Lost::Error)));
                tracing::error!(error = %e, "renewal failed permanently");
                return Err("renewal failed with a permanent store error");
            }
        }
    }
}
