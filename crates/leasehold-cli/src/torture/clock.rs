//! One clock for every torture process: CLOCK_MONOTONIC is shared by all
//! processes on the host and keeps running while a process is stopped, so
//! the histories of the workers, the resource and the nemesis merge into one
//! timeline.

use nix::time::{clock_gettime, ClockId};
use tokio::time::Instant;

/// Nanoseconds on the host's monotonic clock.
pub fn mono_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is always available");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// `instant` on the monotonic clock. tokio's (and std's) `Instant` is
/// CLOCK_MONOTONIC on Linux but hides the raw value, so go through the
/// distance from now.
pub fn to_mono(instant: Instant) -> u64 {
    let (now, mono) = (Instant::now(), mono_ns());
    if instant >= now {
        mono + (instant - now).as_nanos() as u64
    } else {
        mono.saturating_sub((now - instant).as_nanos() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn instants_map_onto_the_monotonic_clock() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let before = mono_ns();
            let later = to_mono(Instant::now() + Duration::from_secs(2));
            let after = mono_ns();
            assert!(later >= before + 2_000_000_000);
            assert!(later <= after + 2_000_000_000 + 1_000_000);
        });
    }
}
