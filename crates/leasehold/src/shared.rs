//! One listening connection per store per process.
//!
//! Stores wake waiters through a connection that only listens (`LISTEN`,
//! a pub/sub subscription, a change stream). Every `Locks` opened on the
//! same store URL in a process shares one such listener, found here by the
//! URL. Entries are weak: the listener closes when the last backend using
//! it goes, and the next one to ask opens a fresh one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// A process-wide table of shared listeners, one per store URL.
pub(crate) struct Registry<T> {
    entries: Mutex<Option<HashMap<String, Weak<T>>>>,
}

impl<T> Registry<T> {
    /// An empty table, for a `static`.
    pub(crate) const fn new() -> Self {
        Registry {
            entries: Mutex::new(None),
        }
    }

    /// The live listener for `url`, or a new one from `make` (which must
    /// not do I/O: it runs under the table's lock).
    pub(crate) fn get_or_insert_with(&self, url: &str, make: impl FnOnce() -> T) -> Arc<T> {
        // Every update is one insert or retain, so a poisoned lock still
        // holds a consistent table.
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entries = entries.get_or_insert_with(HashMap::new);
        if let Some(live) = entries.get(url).and_then(Weak::upgrade) {
            return live;
        }
        entries.retain(|_, listener| listener.strong_count() > 0);
        let listener = Arc::new(make());
        entries.insert(url.to_owned(), Arc::downgrade(&listener));
        listener
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_listener_per_url_while_in_use() {
        static TABLE: Registry<String> = Registry::new();
        let a = TABLE.get_or_insert_with("redis://a", || "first".to_owned());
        let again = TABLE.get_or_insert_with("redis://a", || "second".to_owned());
        assert!(Arc::ptr_eq(&a, &again), "same URL, same listener");
        let b = TABLE.get_or_insert_with("redis://b", || "other".to_owned());
        assert_eq!(*b, "other");
        drop((a, again));
        let fresh = TABLE.get_or_insert_with("redis://a", || "third".to_owned());
        assert_eq!(*fresh, "third", "a listener nobody uses is not kept");
    }
}
