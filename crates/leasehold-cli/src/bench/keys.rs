//! Bench keys: the one thing the scenarios and the raw baselines both need
//! from each other.

/// A fresh key per scenario run, so runs never see each other's leases.
pub fn unique_key(scenario: &str) -> String {
    format!("bench:{scenario}:{:016x}", rand::random::<u64>())
}
