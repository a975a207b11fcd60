//! What this backend last saw of each permit or reader-writer lock, so a
//! grant can skip the read of the lock's range when it is likely empty.
//!
//! A grant (slots.rs) on a lock that is likely empty claims its first slot
//! at once, with a transaction that compares "the range is empty" (and
//! the key's kind) and reads the range in its else branch: an uncontended
//! grant is one round trip, like a mutex's, and a wrong guess costs what
//! the read it replaces did. The hint is only a guess: etcd's compares
//! decide, so a stale hint costs a round trip, never a wrong grant.

use std::collections::HashMap;
use std::sync::Mutex;

/// Past this many locks, the hints start again (every lock then looks
/// free, with its kind unknown).
const HINTS_MAX: usize = 4096;

/// What the last look at one lock (its range, `keys::Layout::lock`) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hint {
    /// The range held no record: worth claiming the first slot unread.
    pub empty: bool,
    /// The key's kind record held the asked kind: the claim compares it
    /// (else it claims the kind, which fails on a key that has one).
    pub kind_held: bool,
}

impl Hint {
    /// A lock never seen: probably free, its kind unknown.
    pub const UNSEEN: Hint = Hint {
        empty: true,
        kind_held: false,
    };
}

/// The hints of one backend, by lock range.
#[derive(Debug, Default)]
pub(super) struct Hints(Mutex<HashMap<String, Hint>>);

impl Hints {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Hint>> {
        // Every update leaves the map whole, so a poisoned lock still holds a valid one.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The hint for the lock whose range is `base`.
    pub fn get(&self, base: &str) -> Hint {
        self.map().get(base).copied().unwrap_or(Hint::UNSEEN)
    }

    /// Notes what a look at `base` found.
    pub fn set(&self, base: &str, hint: Hint) {
        let mut map = self.map();
        if map.len() >= HINTS_MAX && !map.contains_key(base) {
            map.clear();
        }
        map.insert(base.to_owned(), hint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unseen_locks_look_free_and_hints_are_bounded() {
        let hints = Hints::default();
        assert_eq!(hints.get("a"), Hint::UNSEEN);
        let busy = Hint {
            empty: false,
            kind_held: true,
        };
        hints.set("a", busy);
        assert_eq!(hints.get("a"), busy);
        for i in 0..HINTS_MAX {
            hints.set(&format!("k{i}"), busy);
        }
        assert!(hints.map().len() <= HINTS_MAX);
        assert_eq!(hints.get("a"), Hint::UNSEEN, "forgotten when full");
    }
}
