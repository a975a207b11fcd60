//! The events a lock reports, as values: how an acquisition ended, how a
//! renewal went, why a lease was lost. The hooks (`observe.rs`) count them
//! and the metrics adapter (`metrics.rs`) labels them; both read them here,
//! so neither imports the other's internals.

/// How an acquisition ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Granted,
    Busy,
    Timeout,
    Cancelled,
    Error,
}

impl Outcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

/// Why a lease was lost (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// The local deadline passed without a successful renewal.
    Expired,
    /// The store said the lease is gone (expired there, force-released).
    Gone,
    /// Renewal failed with a permanent store error.
    Error,
}

impl Lost {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Lost::Expired => "expired",
            Lost::Gone => "gone",
            Lost::Error => "error",
        }
    }
}

/// How one renewal attempt went (the `outcome` label of renewals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    Ok,
    Failed,
    Unknown,
}

impl Renewal {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Renewal::Ok => "ok",
            Renewal::Failed => "failed",
            Renewal::Unknown => "unknown",
        }
    }
}
