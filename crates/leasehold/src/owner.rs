//! The owner id: who holds a lease, and who waits in a key's queue.
//!
//! On the bottom floor (no I/O) because both the contract (`backend/`) and
//! the in-process wake-up hub (`notify.rs`, which hands a key over to one
//! waiter by its owner id) name it.

use std::fmt;

/// Who asks for a lease: 128 random bits, fresh for every acquisition.
///
/// Renew and release must present it, so nobody else can release your lock.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerId(u128);

impl OwnerId {
    /// A fresh random owner id.
    pub fn random() -> Self {
        OwnerId(rand::random())
    }

    /// The id as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Rebuilds an id from its 32-digit lowercase hex form, as stored.
    pub fn from_hex(hex: &str) -> Option<Self> {
        (hex.len() == 32)
            .then(|| u128::from_str_radix(hex, 16).ok())
            .flatten()
            .map(OwnerId)
    }
}

impl From<u128> for OwnerId {
    fn from(value: u128) -> Self {
        OwnerId(value)
    }
}

impl fmt::Display for OwnerId {
    /// 32 lowercase hex digits: the form stores keep.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({self})")
    }
}
