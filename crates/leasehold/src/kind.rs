//! What a key is: one key is one lock, of one kind. The key's anchor record
//! (its mutex record at the store) says which kind; see the `# Contract` of
//! [`Backend`](crate::Backend) and docs/architecture.md. On the floor of
//! `key.rs` and `error.rs` (which names the kinds in `KindMismatch`): it
//! imports nothing of the crate.

use std::fmt;

/// The kind of lock a key is. A key keeps the kind it was first used as; a
/// mutex key that nobody holds becomes a reader-writer lock or a semaphore
/// on first such use (its fencing tokens go on increasing), and a store
/// answers [`Acquire::OtherKind`](crate::backend::Acquire::OtherKind) to a request
/// of another kind.
///
/// (Not [`LockKind`](crate::LockKind), which says what a *busy* attempt
/// asked for, down to the side of a reader-writer lock and a semaphore's
/// count.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// A mutex: the kind of every key until it is used otherwise.
    Mutex,
    /// A reader-writer lock; its exclusive acquire as a mutex is its writer.
    ReaderWriter,
    /// A counting semaphore.
    Semaphore,
}

impl KeyKind {
    /// The name a store keeps in the anchor record: `None` for a mutex
    /// (absent/NULL, as every record written before kinds existed),
    /// `"rw"`, `"sem"`.
    pub fn stored(self) -> Option<&'static str> {
        match self {
            KeyKind::Mutex => None,
            KeyKind::ReaderWriter => Some("rw"),
            KeyKind::Semaphore => Some("sem"),
        }
    }

    /// Reads a stored kind back (see [`stored`](Self::stored)); `None` for
    /// a name no version of the library writes (a damaged record). An
    /// empty string reads as a mutex, for stores that cannot keep a null.
    pub fn from_stored(stored: Option<&str>) -> Option<Self> {
        match stored {
            None | Some("") => Some(KeyKind::Mutex),
            Some("rw") => Some(KeyKind::ReaderWriter),
            Some("sem") => Some(KeyKind::Semaphore),
            Some(_) => None,
        }
    }
}

impl fmt::Display for KeyKind {
    /// `mutex`, `reader-writer lock`, `semaphore`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyKind::Mutex => "mutex",
            KeyKind::ReaderWriter => "reader-writer lock",
            KeyKind::Semaphore => "semaphore",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_stored_names() {
        for kind in [KeyKind::Mutex, KeyKind::ReaderWriter, KeyKind::Semaphore] {
            assert_eq!(KeyKind::from_stored(kind.stored()), Some(kind));
        }
        assert_eq!(KeyKind::from_stored(Some("")), Some(KeyKind::Mutex));
        assert_eq!(KeyKind::from_stored(Some("queue")), None);
        assert_eq!(KeyKind::ReaderWriter.to_string(), "reader-writer lock");
    }
}
