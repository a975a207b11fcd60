//! What recording metrics costs: the uncontended mutex round once more
//! with a Prometheus recorder installed for this thread only, and once
//! more with the facade's no-op recorder, interleaved with the plain
//! rounds (which then run without any recorder). The no-op rounds pay the
//! library's part (finding the recorder in effect and the series' cached
//! handles); the Prometheus rounds pay that and the exporter's own update
//! of each handle, so the two rows tell the library's cost from the
//! exporter's.
//!
//! The recorder is set for the current thread around each poll of one
//! round ([`WithRecorder`]): `bench` runs as a task of the runtime, which
//! may move between worker threads from one poll to the next, and every
//! metric the round records is recorded inside one of its polls. The
//! renewal driver records nothing in a round (a 30 s lease is not renewed
//! within it).
//!
//! Each recorded series takes a key of its own lock class. The library
//! resolves a series' metric handles once per recorder in effect (see
//! `leasehold::metrics`); on the plain rounds' key, the recorder would
//! change every round and every round would register its series anew,
//! which no application does (its recorder is installed once). With a
//! class of their own, each series keeps its handles, as in an
//! application with a recorder and one without.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use leasehold::Locks;
use metrics::{NoopRecorder, Recorder};
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
    /// Series the Prometheus recorder held at the end (proof that it
    /// recorded); none for the no-op recorder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series: Option<usize>,
}

/// The recorder a series of rounds runs with.
enum Installed {
    Prometheus(PrometheusRecorder),
    Noop(NoopRecorder),
}

/// A round whose every poll runs with `recorder` set for the thread that
/// polls it (a thread-local recorder held across an `.await` would miss the
/// polls that land on another worker).
struct WithRecorder<'r, F> {
    recorder: &'r Installed,
    round: Pin<Box<F>>,
}

impl<F: Future> Future for WithRecorder<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        metrics::with_local_recorder(this.recorder.as_recorder(), || this.round.as_mut().poll(cx))
    }
}

impl Installed {
    fn as_recorder(&self) -> &dyn Recorder {
        match self {
            Installed::Prometheus(r) => r,
            Installed::Noop(r) => r,
        }
    }
}

pub struct Recording {
    recorder: Installed,
    /// The recorded rounds' key, of a lock class of their own.
    key: String,
    samples: Vec<Duration>,
}

impl Recording {
    /// Rounds with the Prometheus recorder the dashboard and the demo use.
    pub fn prometheus(rounds: usize) -> Self {
        let recorder = Installed::Prometheus(crate::dashboard::prom::recorder());
        Self::with(recorder, "recorded", rounds)
    }

    /// Rounds with the facade's no-op recorder: the library's part alone.
    pub fn noop(rounds: usize) -> Self {
        Self::with(Installed::Noop(NoopRecorder), "noop-recorded", rounds)
    }

    fn with(recorder: Installed, prefix: &str, rounds: usize) -> Self {
        Recording {
            recorder,
            key: format!("{prefix}-{}", super::keys::unique_key("uncontended")),
            samples: Vec::with_capacity(rounds),
        }
    }

    /// One acquire + release with the recorder set.
    pub async fn round(&mut self, locks: &Locks) -> leasehold::Result<()> {
        let key = &self.key;
        let round = async move {
            let t = Instant::now();
            let guard = locks.try_acquire(key).await?;
            guard.release().await?;
            Ok::<_, leasehold::Error>(t.elapsed())
        };
        let elapsed = WithRecorder {
            recorder: &self.recorder,
            round: Box::pin(round),
        }
        .await?;
        self.samples.push(elapsed);
        Ok(())
    }

    pub fn finish(self, plain: &Latency) -> RecorderOverhead {
        let latency = Latency::of(&self.samples);
        let series = match &self.recorder {
            Installed::Prometheus(recorder) => {
                let text = recorder.handle().render();
                Some(text.lines().filter(|l| l.starts_with("leasehold_")).count())
            }
            Installed::Noop(_) => None,
        };
        RecorderOverhead {
            p50_per_plain: ratio(latency.p50_us, plain.p50_us),
            mean_per_plain: ratio(latency.mean_us, plain.mean_us),
            series,
            latency,
        }
    }
}
