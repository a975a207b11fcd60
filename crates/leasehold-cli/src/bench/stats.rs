//! Summaries of latency samples and of fairness.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of latencies, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
}

impl Latency {
    /// Summarizes `samples` (any order).
    pub fn of(samples: &[Duration]) -> Self {
        // Via nanoseconds: whole microseconds stay exact.
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_nanos() as f64 / 1e3).collect();
        us.sort_by(f64::total_cmp);
        let mean = if us.is_empty() {
            0.0
        } else {
            us.iter().sum::<f64>() / us.len() as f64
        };
        Latency {
            samples: us.len(),
            p50_us: percentile(&us, 0.50),
            p99_us: percentile(&us, 0.99),
            p999_us: percentile(&us, 0.999),
            mean_us: mean,
        }
    }
}

/// Nearest-rank percentile of sorted values; 0 for none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Jain's fairness index of per-worker counts: 1 when all are equal, 1/n
/// when one worker got everything.
pub fn jain_index(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (counts.len() as f64 * squares)
}

/// `a / b`, or 0 when `b` is 0 (no samples).
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_mean() {
        let d: Vec<Duration> = (1..=1000).map(Duration::from_micros).collect();
        let l = Latency::of(&d);
        assert_eq!((l.p50_us, l.p99_us, l.p999_us), (500.0, 990.0, 999.0));
        assert!((l.mean_us - 500.5).abs() < 1e-9);
        assert_eq!(Latency::of(&[]).p50_us, 0.0);
    }

    #[test]
    fn jain() {
        assert!((jain_index(&[5, 5, 5, 5]) - 1.0).abs() < 1e-12);
        assert!((jain_index(&[8, 0, 0, 0]) - 0.25).abs() < 1e-12);
        assert_eq!(jain_index(&[0, 0]), 0.0);
    }
}
