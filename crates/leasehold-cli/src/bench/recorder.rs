//! What recording metrics costs: the uncontended mutex round once more,
//! with a Prometheus recorder installed for this thread only, interleaved
//! with the plain rounds (which then run without any recorder).
//!
//! The recorder is set for the current thread around one round: `bench`
//! runs on the thread that blocks on the runtime (`block_on`), so every
//! poll of the round, and so every metric it records, happens there. The
//! renewal thread records nothing in a round (a 30 s lease is not renewed
//! within it).
//!
//! The recorded rounds take a key of their own lock class. The library
//! resolves a series' metric handles once per recorder in effect (see
//! `leasehold::metrics`); on the plain rounds' key, the recorder would
//! change every round and every round would register its series anew,
//! which no application does (its recorder is installed once). With a
//! class of their own, each series keeps its handles, as in an
//! application with a recorder and one without.

use std::time::Duration;

use leasehold::Locks;
use metrics_exporter_prometheus::PrometheusRecorder;
use serde::Serialize;
use tokio::time::Instant;

use super::stats::{ratio, Latency};

/// The mutex round with a recorder, next to the same round without.
#[derive(Debug, Serialize)]
pub struct RecorderOverhead {
    #[serde(flatten)]
    pub latency: Latency,
    /// p50 with the recorder divided by p50 without (target ≤ 1.05).
    pub p50_per_plain: f64,
    pub mean_per_plain: f64,
    /// Series the recorder held at the end (proof that it recorded).
    pub series: usize,
}

pub struct Recording {
    recorder: PrometheusRecorder,
    /// The recorded rounds' key, of lock class `recorded-bench`.
    key: String,
    samples: Vec<Duration>,
}

impl Recording {
    pub fn new(rounds: usize) -> Self {
        let recorder = crate::dashboard::prom::recorder();
        Recording {
            recorder,
            key: format!("recorded-{}", super::keys::unique_key("uncontended")),
            samples: Vec::with_capacity(rounds),
        }
    }

    /// One acquire + release with the recorder set.
    pub async fn round(&mut self, locks: &Locks) -> leasehold::Result<()> {
        let _recording = metrics::set_default_local_recorder(&self.recorder);
        let t = Instant::now();
        let guard = locks.try_acquire(&self.key).await?;
        guard.release().await?;
        self.samples.push(t.elapsed());
        Ok(())
    }

    pub fn finish(self, plain: &Latency) -> RecorderOverhead {
        let latency = Latency::of(&self.samples);
        let text = self.recorder.handle().render();
        let series = text.lines().filter(|l| l.starts_with("leasehold_")).count();
        RecorderOverhead {
            p50_per_plain: ratio(latency.p50_us, plain.p50_us),
            mean_per_plain: ratio(latency.mean_us, plain.mean_us),
            series,
            latency,
        }
    }
}
