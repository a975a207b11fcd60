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

/// A bracket this narrow (ns) is as good as one instant: no preemption or
/// stop landed between its reads.
const TIGHT_BRACKET_NS: u64 = 20_000;
/// Brackets tried before settling for the narrowest.
const BRACKET_TRIES: usize = 5;

/// `instant` on the monotonic clock. tokio's (and std's) `Instant` is
/// CLOCK_MONOTONIC on Linux but hides the raw value, so go through the
/// distance from now.
pub fn to_mono(instant: Instant) -> u64 {
    to_mono_with(instant, Instant::now, mono_ns)
}

/// The conversion over given clocks (tests interrupt it).
///
/// "Now" is read on two clocks, which is two instants: a worker preempted
/// or stopped (the nemesis pauses holders) between the reads would shift
/// every converted deadline by the length of the gap, and a `valid_until`
/// logged milliseconds late reads as a holder that trusted its grant past
/// the store's expiry. So `Instant::now()` is bracketed by two monotonic
/// reads, a wide bracket is retried, and the narrowest one's midpoint is
/// used: the answer is off by at most half its width.
fn to_mono_with(
    instant: Instant,
    mut now: impl FnMut() -> Instant,
    mut mono: impl FnMut() -> u64,
) -> u64 {
    let mut best: Option<(u64, Instant, u64)> = None;
    for _ in 0..BRACKET_TRIES {
        let before = mono();
        let at = now();
        let after = mono();
        let width = after.saturating_sub(before);
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, at, before + width / 2));
        }
        if width <= TIGHT_BRACKET_NS {
            break;
        }
    }
    let (_, now, mono) = best.expect("at least one bracket is read");
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

    /// A stop between the two clock reads (here 30 ms, as a preempted or
    /// SIGSTOPped worker) must not move the converted instant: the first
    /// bracket is wide, the retry is not.
    #[test]
    fn a_stop_between_the_clock_reads_does_not_shift_the_answer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(1);
            let expected = to_mono(deadline);
            let mut first = true;
            let stopped_once = || {
                let at = Instant::now();
                if std::mem::take(&mut first) {
                    std::thread::sleep(Duration::from_millis(30));
                }
                at
            };
            let got = to_mono_with(deadline, stopped_once, mono_ns);
            let off = got.abs_diff(expected);
            assert!(off < 5_000_000, "shifted by {off} ns");
        });
    }
}
