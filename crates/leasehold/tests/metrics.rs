//! The `metrics` feature: what each primitive records through the facade,
//! with which labels, and that `Locks::stats()` agrees.
//!
//! One global recorder for the binary; each test uses its own lock class
//! and reads only the series of that class. The debugging recorder's
//! snapshot drains what it returns, so every read goes through `collect`,
//! which adds the drained values to one running total.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use leasehold::{AcquireOptions, Error, Locks};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio_util::sync::CancellationToken;

/// A series: its name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

#[derive(Debug, Default, Clone)]
struct Totals {
    /// Counters and gauges, summed over snapshots.
    values: HashMap<Series, f64>,
    /// Every recorded histogram value.
    histograms: HashMap<Series, Vec<f64>>,
}

fn recorder() -> &'static (Snapshotter, Mutex<Totals>) {
    static RECORDER: OnceLock<(Snapshotter, Mutex<Totals>)> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        leasehold::metrics::describe();
        (snapshotter, Mutex::default())
    })
}

/// The running totals of every series whose `lock_class` is `class`.
fn collect(class: &str) -> Totals {
    let (snapshotter, totals) = recorder();
    let mut totals = totals.lock().unwrap();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let mut labels: Vec<(String, String)> = key
            .key()
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let series = (key.key().name().to_owned(), labels);
        match value {
            DebugValue::Counter(n) => *totals.values.entry(series).or_default() += n as f64,
            DebugValue::Gauge(g) => *totals.values.entry(series).or_default() += g.into_inner(),
            DebugValue::Histogram(xs) => totals
                .histograms
                .entry(series)
                .or_default()
                .extend(xs.into_iter().map(|x| x.into_inner())),
        }
    }
    let mine = |s: &Series| s.1.iter().any(|(k, v)| k == "lock_class" && v == class);
    Totals {
        values: totals
            .values
            .iter()
            .filter(|(s, _)| mine(s))
            .map(|(s, v)| (s.clone(), *v))
            .collect(),
        histograms: totals
            .histograms
            .iter()
            .filter(|(s, _)| mine(s))
            .map(|(s, v)| (s.clone(), v.clone()))
            .collect(),
    }
}

impl Totals {
    /// The series `name` whose labels include every pair of `with`.
    fn matching<'a, T>(
        map: &'a HashMap<Series, T>,
        name: &'a str,
        with: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a T> + 'a {
        map.iter()
            .filter(move |(s, _)| {
                s.0 == name
                    && with
                        .iter()
                        .all(|(k, v)| s.1.iter().any(|(sk, sv)| sk == k && sv == v))
            })
            .map(|(_, v)| v)
    }

    fn value(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        Self::matching(&self.values, name, with).sum()
    }

    fn samples(&self, name: &str, with: &[(&str, &str)]) -> Vec<f64> {
        Self::matching(&self.histograms, name, with)
            .flatten()
            .copied()
            .collect()
    }

    /// Every label value seen in these series.
    fn label_values(&self) -> Vec<String> {
        self.values
            .keys()
            .chain(self.histograms.keys())
            .flat_map(|s| s.1.iter().map(|(_, v)| v.clone()))
            .collect()
    }
}

const WAIT: &str = "leasehold.lock.wait_time";
const ATTEMPTS: &str = "leasehold.lock.attempts";
const USE: &str = "leasehold.lock.use_time";

async fn memory() -> Locks {
    recorder();
    Locks::open("memory://").await.unwrap()
}

#[tokio::test]
async fn a_mutex_reports_each_outcome_with_its_wait_attempts_and_hold() {
    let locks = memory().await;
    let class = "mutex-outcomes";
    let key = format!("{class}:7");
    let guard = locks.try_acquire(&key).await.unwrap();

    assert!(matches!(
        locks.try_acquire(&key).await,
        Err(Error::Busy { .. })
    ));
    let waits = AcquireOptions::new().with_wait(Duration::from_millis(120));
    assert!(matches!(
        locks.acquire_with(&key, &waits).await,
        Err(Error::Timeout { .. })
    ));
    let cancel = CancellationToken::new();
    let cancels = waits.clone().with_cancel(cancel.clone());
    let waiter = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move { locks.acquire_with(&key, &cancels).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mid = collect(class);
    assert_eq!(
        mid.value("leasehold.lock.pending_requests", &[]),
        1.0,
        "one waiter now"
    );
    assert_eq!(
        mid.value("leasehold.lock.held", &[("primitive", "mutex")]),
        1.0
    );
    cancel.cancel();
    assert!(matches!(
        waiter.await.unwrap(),
        Err(Error::Cancelled { .. })
    ));
    // A caller that drops its call counts as cancelled too.
    let dropped = tokio::time::timeout(
        Duration::from_millis(30),
        locks.acquire(&key, Duration::from_secs(5)),
    )
    .await;
    assert!(dropped.is_err());
    tokio::time::sleep(Duration::from_millis(30)).await;
    guard.release().await.unwrap();

    let t = collect(class);
    let base = [
        ("store", "memory"),
        ("primitive", "mutex"),
        ("lock_class", class),
    ];
    let with = |outcome: &'static str| {
        let mut l = base.to_vec();
        l.push(("outcome", outcome));
        l
    };
    assert_eq!(t.samples(WAIT, &with("granted")).len(), 1);
    assert_eq!(t.samples(WAIT, &with("busy")).len(), 1);
    let timeouts = t.samples(WAIT, &with("timeout"));
    assert_eq!(timeouts.len(), 1);
    assert!(
        timeouts[0] >= 0.12,
        "a timeout waited its bound: {timeouts:?}"
    );
    assert_eq!(t.samples(WAIT, &with("cancelled")).len(), 2);
    assert!(t.value(ATTEMPTS, &with("timeout")) >= 1.0);
    assert_eq!(t.value(ATTEMPTS, &with("granted")), 1.0);
    assert_eq!(t.samples(USE, &base).len(), 1);
    assert_eq!(
        t.value("leasehold.lock.pending_requests", &[]),
        0.0,
        "no waiter left"
    );
    assert_eq!(t.value("leasehold.lock.held", &[]), 0.0, "nothing held");
    assert!(
        !t.label_values().contains(&key),
        "the raw key is never a label: {:?}",
        t.label_values()
    );

    let stats = locks.stats();
    assert_eq!(
        (
            stats.acquires.granted,
            stats.acquires.busy,
            stats.acquires.timeout,
            stats.acquires.cancelled
        ),
        (1, 1, 1, 2)
    );
    assert_eq!(
        (
            stats.held,
            stats.waiting,
            stats.hold.count,
            stats.wait.count
        ),
        (0, 0, 1, 5)
    );
    assert!(stats.wait.max >= Duration::from_millis(120));
}

#[tokio::test]
async fn every_primitive_is_labelled_as_itself() {
    let locks = memory().await;
    let class = "primitives";
    let opts = AcquireOptions::new().with_lock_class(class);
    locks
        .acquire_with("p-mutex", &opts)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    locks
        .semaphore("p-sem", 2)
        .unwrap()
        .acquire_with(&opts)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let rw = locks.rw_lock("p-rw").unwrap();
    rw.read_with(&opts).await.unwrap().release().await.unwrap();
    rw.write_with(&opts).await.unwrap().release().await.unwrap();
    locks
        .acquire_many(&["p-m1", "p-m2"], &opts)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let leader = locks
        .election("p-el")
        .unwrap()
        .campaign("me", &opts)
        .await
        .unwrap();
    leader.resign().await.unwrap();

    let t = collect(class);
    for (primitive, grants) in [
        ("mutex", 1),
        ("semaphore", 1),
        ("rwlock", 2),
        ("multi", 2),
        ("election", 1),
    ] {
        let l = [
            ("primitive", primitive),
            ("outcome", "granted"),
            ("store", "memory"),
        ];
        assert_eq!(t.samples(WAIT, &l).len(), grants, "{primitive}");
        assert_eq!(t.samples(USE, &l[..1]).len(), grants, "{primitive}");
    }
    assert_eq!(locks.stats().acquires.granted, 7);
    assert_eq!(locks.stats().held, 0);
}

#[tokio::test]
async fn renewals_and_a_broken_lease_are_counted() {
    let locks = memory().await;
    let class = "renewed";
    let key = format!("{class}:job");
    let ttl = Duration::from_millis(300);
    let guard = locks
        .acquire_with(&key, &AcquireOptions::new().with_ttl(ttl))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await; // renewals at ttl/3
    assert!(locks.force_release(&key).await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost after the break");
    drop(guard);

    let t = collect(class);
    assert!(t.value("leasehold.lock.renewals", &[("outcome", "ok")]) >= 1.0);
    assert_eq!(
        t.value("leasehold.lock.renewals", &[("outcome", "failed")]),
        1.0
    );
    assert_eq!(t.value("leasehold.lock.lost", &[("reason", "gone")]), 1.0);
    let stats = locks.stats();
    assert!(stats.renewals.ok >= 1);
    assert_eq!(
        (stats.renewals.failed, stats.lost.gone, stats.held),
        (1, 1, 0)
    );
}

#[tokio::test]
async fn a_bad_lock_class_is_refused_before_any_store_call() {
    let locks = memory().await;
    for class in ["", "a\nb", &"x".repeat(65)] {
        let opts = AcquireOptions::new().with_lock_class(class);
        let e = locks.acquire_with("k", &opts).await.unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }), "{class:?}: {e}");
    }
    assert_eq!(locks.stats().attempts, 0);
}

#[tokio::test]
async fn sqlite_is_labelled_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    recorder();
    let locks = Locks::open(&format!("sqlite://{}/l.db", dir.path().display()))
        .await
        .unwrap();
    let class = "on-sqlite";
    locks
        .try_acquire(&format!("{class}:1"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let t = collect(class);
    assert_eq!(t.samples(WAIT, &[("store", "sqlite")]).len(), 1, "{t:?}");
}
