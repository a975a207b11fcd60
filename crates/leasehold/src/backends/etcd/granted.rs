//! The value both the grants' leases (`leases.rs`) and the spare leases
//! (`spares.rs`) hold, on a floor below both.

use std::time::Duration;

/// A lease as etcd granted (or last renewed) it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Granted {
    pub id: i64,
    /// The TTL etcd enforces: the asked one rounded up, at least the
    /// server's minimum.
    pub ttl: Duration,
}
