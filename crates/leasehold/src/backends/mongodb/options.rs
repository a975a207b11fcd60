//! [`MongoOptions`]: where the lease documents live and how writes are
//! acknowledged.

use std::time::Duration;

use mongodb::options::{Acknowledgment, WriteConcern};

use crate::backend::{check_idle_window, DEFAULT_IDLE_WINDOW};
use crate::error::{Error, Result};
use crate::key::length_problem;

/// The collection used when none is configured.
pub const DEFAULT_COLLECTION: &str = "leasehold_locks";

/// Options of a [`MongoBackend`](super::MongoBackend).
///
/// ```
/// use leasehold::backends::mongodb::MongoOptions;
/// let opts = MongoOptions::new().with_collection("app_locks");
/// assert_eq!(opts.collection(), "app_locks");
/// ```
#[derive(Debug, Clone)]
pub struct MongoOptions {
    collection: String,
    write_concern: WriteConcern,
    clock_skew_ms: i64,
    idle_window: Option<Duration>,
}

impl Default for MongoOptions {
    fn default() -> Self {
        MongoOptions {
            collection: DEFAULT_COLLECTION.to_owned(),
            write_concern: WriteConcern::majority(),
            clock_skew_ms: 0,
            idle_window: Some(DEFAULT_IDLE_WINDOW),
        }
    }
}

impl MongoOptions {
    /// Defaults: collection `leasehold_locks`, write concern `majority`,
    /// lock documents of keys idle for an hour deleted.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// The collection holding one document per key (checked when the
        /// backend is built).
        with_collection(name: impl Into<String>) => collection = name.into();

        /// Write concern of every lease write (default `w: majority`).
        ///
        /// Weaker than majority, a grant acknowledged by a primary that then
        /// fails over can be rolled back: two holders, and a fence that goes
        /// backwards. Only lower it on a single-node deployment.
        with_write_concern(write_concern: WriteConcern) => write_concern = write_concern;

        /// Simulates a client whose wall clock is off by `skew_ms` milliseconds
        /// (positive: ahead). For tests showing that the client's own clock
        /// never decides expiry.
        with_simulated_clock_skew_ms(skew_ms: i64) => clock_skew_ms = skew_ms;

        /// How long the lock document of a mutex key nobody holds stays
        /// (default an hour; `None`: forever, as before). A sweep deletes
        /// older ones, and a key that comes back takes tokens above every
        /// token it had (docs/storage.md). URL option
        /// `?idle_window=30s|10m|1h|never`.
        with_idle_window(window: Option<Duration>) => idle_window = window;
    }

    /// How long the document of an idle key stays (`None`: forever).
    pub fn idle_window(&self) -> Option<Duration> {
        self.idle_window
    }

    /// The collection name.
    pub fn collection(&self) -> &str {
        &self.collection
    }

    /// The write concern of lease writes.
    pub fn write_concern(&self) -> &WriteConcern {
        &self.write_concern
    }

    pub(super) fn clock_skew_us(&self) -> i64 {
        self.clock_skew_ms.saturating_mul(1000)
    }

    /// Checks the options before any I/O.
    pub(super) fn validate(&self) -> Result<()> {
        validate_collection_name(&self.collection)?;
        if matches!(self.write_concern.w, Some(Acknowledgment::Nodes(0))) {
            return Err(Error::invalid(
                "write concern",
                "w: 0 is unacknowledged; a lock store must know whether its writes happened",
            ));
        }
        check_idle_window(self.idle_window)?;
        if self.clock_skew_ms.unsigned_abs() > 24 * 3600 * 1000 {
            return Err(Error::invalid(
                "clock skew",
                format!("must be within one day, got {} ms", self.clock_skew_ms),
            ));
        }
        Ok(())
    }
}

/// MongoDB's rules for collection names, checked here so a bad name fails
/// with a clear message before anything is sent.
pub(super) fn validate_collection_name(name: &str) -> Result<()> {
    let problem = if let Some(problem) = length_problem(name, 120) {
        problem
    } else if name.contains('$') {
        format!("must not contain '$', got {name:?}")
    } else if name.contains('\0') || name.chars().any(char::is_control) {
        format!("must not contain control characters, got {name:?}")
    } else if name.starts_with("system.") {
        format!("must not start with \"system.\" (reserved), got {name:?}")
    } else if name.starts_with('.') || name.ends_with('.') {
        format!("must not start or end with '.', got {name:?}")
    } else {
        return Ok(());
    };
    Err(Error::invalid("collection name", problem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collection_names_are_checked() {
        assert!(validate_collection_name("leasehold_locks").is_ok());
        assert!(validate_collection_name("a.b").is_ok());
        for bad in ["", "a$b", "system.x", "x\0", ".x", "x.", &"c".repeat(121)] {
            let e = validate_collection_name(bad).unwrap_err().to_string();
            assert!(e.starts_with("invalid collection name: "), "{bad:?}: {e}");
        }
    }

    #[test]
    fn unacknowledged_writes_are_rejected() {
        let wc = WriteConcern::nodes(0);
        let e = MongoOptions::new().with_write_concern(wc).validate();
        assert!(e.unwrap_err().to_string().contains("w: 0"));
        assert!(MongoOptions::new().validate().is_ok());
    }
}
