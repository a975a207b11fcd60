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
    /// nothing.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (before any I/O) for an empty set, too many
    /// keys, a bad key, a duplicate or a bad ttl; otherwise the error of the
    /// first key that could not be had ([`Error::Busy`] when trying once,
    /// [`Error::Timeout`] with `waited` counted from the start of the whole
    /// call, [`Error::Cancelled`], store errors).
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

    async fn acquire_sorted(&self, keys: &[Key], options: &AcquireOptions) -> Result<MultiGuard> {
        let started = Instant::now();
        // One bound for the whole call: each key gets what is left of it.
        let deadline = options.wait().and_then(|w| started.checked_add(w));
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            let mut per_key = options.clone();
            if let Some(d) = deadline {
                per_key = per_key.with_wait(d.saturating_duration_since(Instant::now()));
            }
            match self.acquire_with(key.as_str(), &per_key).await {
                Ok(guard) => guards.push(guard),
                Err(error) => {
                    release_all(guards).await;
                    return Err(whole_call_error(error, started));
                }
            }
        }
        Ok(MultiGuard { guards })
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

/// A timeout reports the wait of the whole call, not of its last key.
fn whole_call_error(error: Error, started: Instant) -> Error {
    match error {
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
async fn release_all(guards: Vec<LeaseGuard>) {
    for guard in guards.into_iter().rev() {
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
        self.guards.iter().any(LeaseGuard::is_lost)
    }

    /// `Ok(())` while every lease can be relied on, else
    /// [`Error::LeaseLost`] naming the first key (in canonical order) lost.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] once [`is_lost`](Self::is_lost) is true.
    pub fn check(&self) -> Result<()> {
        self.guards.iter().try_for_each(LeaseGuard::check)
    }

    /// Until when every lease can be relied on: the earliest of the keys'
    /// [`LeaseGuard::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.guards
            .iter()
            .map(LeaseGuard::valid_until)
            .min()
            .expect("a multi-guard holds at least one key")
    }

    /// Resolves when any key's lease is lost (see [`LeaseGuard::lost`]).
    /// Does not borrow the guard; cancel safe.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut each: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = self
            .guards
            .iter()
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
