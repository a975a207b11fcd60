//! One key, one kind: the `kind` a key's document records once the key is
//! used as a reader-writer lock or a semaphore (`"rw"` or `"sem"`); no
//! `kind` field is a mutex. The mutex grant's filter requires no `kind`;
//! a permit grant sets it in the same conditional write that takes its
//! slot (semaphore.rs), so of a mutex grant and a permit grant racing on a
//! free key exactly one wins. See docs/mongodb.md.

use mongodb::bson::{Bson, Document};

use super::errors::STORE;
use crate::backend::{KeyKind, RecordDecoder};
use crate::error::Result;

/// The kind a lock document records, `None` for a mutex (no `kind`).
pub(super) fn kind_of(d: &Document) -> Result<Option<KeyKind>> {
    let stored = match d.get("kind") {
        None | Some(Bson::Null) => None,
        Some(Bson::String(k)) => Some(k.as_str()),
        Some(_) => Some("\u{0}"),
    };
    match KeyKind::from_stored(stored) {
        Some(KeyKind::Mutex) => Ok(None),
        Some(kind) => Ok(Some(kind)),
        None => {
            let key = d.get_str("_id").unwrap_or_default();
            let found = d.get("kind").map(ToString::to_string).unwrap_or_default();
            Err(RecordDecoder::new(STORE, key).corrupt(format!("the kind is {found}")))
        }
    }
}
