//! All-or-nothing multi-locks: [`Locks::acquire_many`] and the
//! [`MultiGuard`] it returns.
//!
//! Built in the core over single locks, so every store gets it with no
//! statement of its own and keys of one call may live anywhere (on Redis
//! Cluster, in different slots: each lock is its own single-slot
//! operation). The keys are taken one by one in one canonical order (by
//! their bytes), so two callers whose sets overlap wait for each other in
//! the same order and cannot deadlock; the whole call runs under one wait
//! bound; what was taken is released when a later key cannot be had.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::guard::LeaseGuard;
use crate::key::Key;
use crate::lock::{AcquireOptions, Locks};
use crate::time::validate_ttl;

/// Most keys one [`Locks::acquire_many`] call takes: each is a lease with its
/// own renewal, so a set this large is a sign that a coarser key is wanted.
pub const MAX_MULTI_KEYS: usize = 256;

impl Locks {
    /// Takes every key of `keys` or none, as `options` say (ttl, wait bound,
    /// cancel token and renewal apply to each key).
    ///
    /// The keys are validated before any I/O: at least one, at most
    /// [`MAX_MULTI_KEYS`], each a valid key, no key twice (a duplicate is a
    /// caller's mistake; taking a key twice in one call would wait for
    /// itself). They are then taken in canonical order (sorted by their
    /// bytes, whatever order the caller gave), each waiting at most for
    /// what is left of the one wait bound of the whole call. If a key cannot
    /// be had (busy, timeout, cancel, store error) the keys already taken
    /// are released before the error is returned, so on `Err` the call holds
    /// nothing. On `Ok` every key's lease is good: once the last key is
    /// granted every key is checked, and if one lapsed (or was broken) while
    /// a later one was waited for, the whole set is released and taken again
    /// within what is left of the wait bound.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (before any I/O) for an empty set, too many
    /// keys, a bad key, a duplicate or a bad ttl; otherwise the error of the
    /// first key that could not be had ([`Error::Busy`] when trying once,
    /// [`Error::Timeout`] with `waited` counted from the start of the whole
    /// call once the wait bound is spent, [`Error::Cancelled`], store
    /// errors). Trying once, a set whose first keys lapsed before the last
    /// was granted is [`Error::LeaseLost`] naming the lapsed key.
    ///
    /// # Cancel safety
    /// If the future is dropped midway, the guards of the keys taken so far
    /// are dropped, which releases them best-effort in the background.
    pub async fn acquire_many<S: AsRef<str>>(
        &self,
        keys: &[S],
        options: &AcquireOptions,
    ) -> Result<MultiGuard> {
        let keys = canonical_keys(keys)?;
        validate_ttl(options.ttl())?;
        let span = tracing::debug_span!("acquire_many", keys = keys.len(), ttl = ?options.ttl());
        self.acquire_sorted(&keys, options).instrument(span).await
    }

    /// Tries once to take every key of `keys` (default ttl), or none: as
    /// [`acquire_many`](Self::acquire_many) with no wait bound, so a key
    /// held by anybody makes the whole call [`Error::Busy`].
    ///
    /// # Errors
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn try_acquire_many<S: AsRef<str>>(&self, keys: &[S]) -> Result<MultiGuard> {
        self.acquire_many(keys, &AcquireOptions::new()).await
    }

    /// The same as [`acquire_many`](Self::acquire_many): one key is one
    /// lock, so the exclusive acquire of a key already excludes its
    /// reader-writer lock's readers and writer (it *is* that lock's writer
    /// once the key is one). This took the mutex and the writer of each
    /// key while the store kept them apart; taking both now would wait for
    /// itself.
    ///
    /// # Errors
    /// As [`acquire_many`](Self::acquire_many).
    #[deprecated(note = "one key is one lock: use `acquire_many`")]
    pub async fn acquire_many_exclusive<S: AsRef<str>>(
        &self,
        keys: &[S],
        options: &AcquireOptions,
    ) -> Result<MultiGuard> {
        self.acquire_many(keys, options).await
    }

    async fn acquire_sorted(&self, keys: &[Key], options: &AcquireOptions) -> Result<MultiGuard> {
        let parts: Vec<Part<'_>> = keys.iter().map(Part).collect();
        self.acquire_parts(&parts, options).await
    }

    /// Takes `parts` in their order, all or none, under one wait bound.
    /// A set is returned only if every lease in it is still good once the
    /// last part is granted: a key taken early may lapse (or be broken)
    /// while a later one is waited for, and a set with a lost key is no set.
    /// Such a set is released and taken again while the wait bound allows.
    async fn acquire_parts(
        &self,
        parts: &[Part<'_>],
        options: &AcquireOptions,
    ) -> Result<MultiGuard> {
        let started = Instant::now();
        // One bound for the whole call: each part gets what is left of it.
        // `None` with a wait: a bound too far to represent, i.e. no bound.
        let waits = options.wait().is_some_and(|w| !w.is_zero());
        let deadline = options.wait().and_then(|w| started.checked_add(w));
        loop {
            let mut taken: Vec<(Part<'_>, LeaseGuard)> = Vec::with_capacity(parts.len());
            for part in parts {
                let mut per_part = options.clone();
                if let Some(d) = deadline {
                    let left = d.saturating_duration_since(Instant::now());
                    if waits && left.is_zero() {
                        // The budget is spent: that is a timeout, not the
                        // busy answer of a zero-length wait.
                        release_all(taken).await;
                        return Err(spent(part.key(), started));
                    }
                    per_part = per_part.with_wait(left);
                }
                match self.take(*part, &per_part).await {
                    Ok(guard) => taken.push((*part, guard)),
                    Err(error) => {
                        release_all(taken).await;
                        return Err(whole_call_error(error, started, waits));
                    }
                }
            }
            let Some(lapsed) = taken
                .iter()
                .find(|(_, g)| g.is_lost())
                .map(|(part, _)| part.key().as_str().to_owned())
            else {
                return Ok(MultiGuard::from_parts(taken));
            };
            tracing::debug!(key = %lapsed, "a key of the set lapsed while a later one was waited for; taking the set again");
            release_all(taken).await;
            if !waits {
                // Tried once: the set could not be had whole.
                return Err(Error::LeaseLost { key: lapsed });
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(spent(&Key::new(&lapsed)?, started));
            }
        }
    }

    /// One part of a set, under `options`.
    async fn take(&self, part: Part<'_>, options: &AcquireOptions) -> Result<LeaseGuard> {
        let options = &options.for_primitive(crate::observe::Primitive::Multi);
        // The key's exclusive acquire: its mutex, or the writer of a key
        // that is a reader-writer lock (lock/acquire.rs).
        self.acquire_with(part.key().as_str(), options).await
    }
}

/// One lock of an all-or-nothing set: the exclusive acquire of a key.
#[derive(Debug, Clone, Copy)]
struct Part<'k>(&'k Key);

impl Part<'_> {
    fn key(&self) -> &Key {
        self.0
    }
}

/// The timeout of a call whose wait bound is spent.
fn spent(key: &Key, started: Instant) -> Error {
    Error::Timeout {
        key: key.to_string(),
        waited: started.elapsed(),
        held_here: false,
        holder: None,
        remaining: None,
    }
}

/// The keys of an all-or-nothing set as [`Key`]s in canonical order (by
/// their bytes), checked as [`Locks::acquire_many`] checks them: for a
/// caller that must reject bad input before it even opens the store.
///
/// # Errors
/// [`Error::InvalidInput`] for an empty set, more than [`MAX_MULTI_KEYS`]
/// keys, an invalid key or a key given twice.
pub fn canonical_keys<S: AsRef<str>>(keys: &[S]) -> Result<Vec<Key>> {
    if keys.is_empty() {
        return Err(Error::invalid(
            "keys",
            "an all-or-nothing lock needs at least one key",
        ));
    }
    if keys.len() > MAX_MULTI_KEYS {
        return Err(Error::invalid(
            "keys",
            format!("{} keys in one call; at most {MAX_MULTI_KEYS}", keys.len()),
        ));
    }
    let mut sorted = keys
        .iter()
        .map(|k| Key::new(k.as_ref()))
        .collect::<Result<Vec<_>>>()?;
    sorted.sort_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()));
    if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(Error::invalid(
            "keys",
            format!("key {:?} appears more than once", pair[0].as_str()),
        ));
    }
    Ok(sorted)
}

/// A timeout reports the wait of the whole call, not of its last key; in a
/// call that waits, a busy answer (a later key reached with nothing left of
/// the bound) is a timeout too.
fn whole_call_error(error: Error, started: Instant, waits: bool) -> Error {
    match error {
        Error::Busy {
            key,
            holder,
            remaining,
            ..
        } if waits => Error::Timeout {
            key,
            waited: started.elapsed(),
            held_here: false,
            holder: Some(holder),
            remaining: Some(remaining),
        },
        Error::Timeout {
            key,
            held_here,
            holder,
            remaining,
            ..
        } => Error::Timeout {
            key,
            waited: started.elapsed(),
            held_here,
            holder,
            remaining,
        },
        other => other,
    }
}

/// Releases `guards`, last taken first; a failed release is logged and the
/// lease expires by itself (the caller gets the error that ended the call).
async fn release_all(guards: Vec<(Part<'_>, LeaseGuard)>) {
    for (_, guard) in guards.into_iter().rev() {
        let key = guard.key().to_string();
        if let Err(e) = guard.release().await {
            tracing::warn!(%key, error = %e, "could not release a key of an all-or-nothing lock; it will expire");
        }
    }
}

/// Every key of one [`Locks::acquire_many`] call, held together.
///
/// Each key is an ordinary lease renewed by the same engine as a
/// [`LeaseGuard`] (one guard per key inside); [`lost`](Self::lost) resolves
/// as soon as any of them is lost, because the set is then no longer held
/// as a whole. Each key keeps its own fencing token
/// ([`tokens`](Self::tokens)): a resource guarded by key `k` checks `k`'s.
///
/// Dropping it releases every key best-effort in the background, like
/// dropping the guards one by one.
#[must_use = "the locks are released as soon as the guard is dropped"]
pub struct MultiGuard {
    /// In canonical key order.
    guards: Vec<LeaseGuard>,
}

impl MultiGuard {
    fn from_parts(taken: Vec<(Part<'_>, LeaseGuard)>) -> Self {
        MultiGuard {
            guards: taken.into_iter().map(|(_, guard)| guard).collect(),
        }
    }

    /// Empty: one key is one lock, so no set holds writers beside its
    /// keys' guards any more (a key that is a reader-writer lock is held
    /// by its writer, in [`guards`](Self::guards)).
    #[deprecated(note = "one key is one lock: every lease is in `guards`")]
    pub fn writers(&self) -> &[LeaseGuard] {
        &[]
    }

    /// Every lease held.
    fn all(&self) -> impl Iterator<Item = &LeaseGuard> + '_ {
        self.guards.iter()
    }

    /// The guards of each key, in canonical (sorted) key order.
    pub fn guards(&self) -> &[LeaseGuard] {
        &self.guards
    }

    /// Each key with its fencing token, in canonical key order.
    pub fn tokens(&self) -> impl Iterator<Item = (&Key, u64)> + '_ {
        self.guards.iter().map(|g| (g.key(), g.token()))
    }

    /// The fencing token of `key`, if this guard holds it.
    pub fn token(&self, key: &str) -> Option<u64> {
        self.guard(key).map(LeaseGuard::token)
    }

    /// The guard of `key`, if this guard holds it.
    pub fn guard(&self, key: &str) -> Option<&LeaseGuard> {
        self.guards.iter().find(|g| g.key().as_str() == key)
    }

    /// Whether any key's lease is lost.
    pub fn is_lost(&self) -> bool {
        self.all().any(LeaseGuard::is_lost)
    }

    /// `Ok(())` while every lease can be relied on, else
    /// [`Error::LeaseLost`] naming the first key (in canonical order) lost.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] once [`is_lost`](Self::is_lost) is true.
    pub fn check(&self) -> Result<()> {
        self.all().try_for_each(LeaseGuard::check)
    }

    /// Until when every lease can be relied on: the earliest of the keys'
    /// [`LeaseGuard::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.all()
            .map(LeaseGuard::valid_until)
            .min()
            .expect("a multi-guard holds at least one key")
    }

    /// Resolves when any key's lease is lost (see [`LeaseGuard::lost`]).
    /// Does not borrow the guard; cancel safe.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut each: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = self
            .all()
            .map(|g| Box::pin(g.lost()) as Pin<Box<dyn Future<Output = ()> + Send>>)
            .collect();
        poll_fn(move |cx| {
            if each.iter_mut().any(|f| f.as_mut().poll(cx).is_ready()) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// Releases every key (last taken first), waking waiters.
    ///
    /// # Errors
    /// The first store error met; every key is still asked to release (a
    /// key whose release failed expires after its ttl).
    pub async fn release(self) -> Result<()> {
        let mut first_error = None;
        // Last taken first.
        for guard in self.guards.into_iter().rev() {
            if let Err(e) = guard.release().await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The lease length of the keys.
    pub fn ttl(&self) -> Duration {
        self.guards[0].lease().ttl()
    }
}

/// A set of one: lets code that runs under a [`MultiGuard`] (the CLI's
/// `run`) hold a single lease or a semaphore permit too.
impl From<LeaseGuard> for MultiGuard {
    fn from(guard: LeaseGuard) -> Self {
        MultiGuard {
            guards: vec![guard],
        }
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field(
                "tokens",
                &self
                    .tokens()
                    .map(|(k, t)| (k.as_str(), t))
                    .collect::<Vec<_>>(),
            )
            .field("lost", &self.is_lost())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_by_bytes_and_checked() {
        let sorted = canonical_keys(&["b", "a", "B"]).unwrap();
        let names: Vec<&str> = sorted.iter().map(Key::as_str).collect();
        assert_eq!(names, ["B", "a", "b"]);
        let empty: [&str; 0] = [];
        for (bad, why) in [
            (canonical_keys(&empty), "at least one key"),
            (
                canonical_keys(&["a", "b", "a"]),
                "\"a\" appears more than once",
            ),
            (canonical_keys(&["a", ""]), "key"),
            (
                canonical_keys(&vec!["k"; MAX_MULTI_KEYS + 1]),
                "at most 256",
            ),
        ] {
            match bad {
                Err(e @ Error::InvalidInput { .. }) => {
                    assert!(e.to_string().contains(why), "{e}")
                }
                other => panic!("expected InvalidInput ({why}), got {other:?}"),
            }
        }
    }
}

#[cfg(test)]
mod lapsed_set_tests {
    use super::*;
    use crate::backends::memory::MemoryBackend;
    use crate::guard::LeaseGuard;

    /// Our `Locks`, and a guard of another `Locks` on the same store that
    /// holds `b` for 2.2 s without renewal.
    async fn ours_while_theirs_holds_b() -> (Locks, LeaseGuard) {
        let backend = std::sync::Arc::new(MemoryBackend::new());
        let theirs = Locks::from_arc(backend.clone());
        let held = theirs
            .acquire_with(
                "b",
                &AcquireOptions::new()
                    .with_ttl(Duration::from_millis(2200))
                    .with_auto_renew(false),
            )
            .await
            .unwrap();
        (Locks::from_arc(backend), held)
    }

    /// `[a, b]` with a 1 s ttl and no renewal: `a` is taken at once and
    /// lapses at 1 s, while `b` is still held.
    fn set_options(wait: Duration) -> AcquireOptions {
        AcquireOptions::new()
            .with_ttl(Duration::from_secs(1))
            .with_wait(wait)
            .with_auto_renew(false)
    }

    /// With time to spare, the set gets `b` only after `a` lapsed: it must
    /// not come back lost.
    #[tokio::test(start_paused = true)]
    async fn a_set_whose_first_key_lapsed_while_waiting_is_taken_again() {
        let (ours, held) = ours_while_theirs_holds_b().await;
        let options = set_options(Duration::from_secs(6));
        let set = ours.acquire_many(&["a", "b"], &options).await.unwrap();
        assert!(!set.is_lost(), "a lost set was returned: {set:?}");
        set.check().unwrap();
        drop(held);
    }

    /// With the wait bound spent before `b` comes free (2.1 s < 2.2 s), after
    /// `a` lapsed: a timeout, never a lost set nor a busy answer.
    #[tokio::test(start_paused = true)]
    async fn a_lapsed_set_with_the_wait_spent_is_a_timeout() {
        let (ours, _held) = ours_while_theirs_holds_b().await;
        let options = set_options(Duration::from_millis(2100));
        match ours.acquire_many(&["a", "b"], &options).await {
            Err(Error::Timeout { .. }) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
}
