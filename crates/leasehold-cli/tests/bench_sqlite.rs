//! `leasehold bench --quick --json` on SQLite: every scenario produces
//! samples in the documented shape. No timing thresholds: speed is judged by
//! reading the numbers, not by tests.

mod common;

use common::*;

#[test]
fn quick_bench_reports_every_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let svg = dir.path().join("bench.svg");
    let out = run(leasehold(&store)
        .args([
            "bench",
            "--quick",
            "--json",
            "--rounds",
            "100",
            "--duration",
            "300ms",
            "--workers",
            "4",
            "--plot",
        ])
        .arg(&svg));
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("bench --json prints JSON");
    assert_eq!(r["quick"], true);
    let s = &r["scenarios"];

    let u = &s["uncontended"];
    assert_eq!(u["leasehold"]["samples"], 100);
    assert!(u["leasehold"]["p50_us"].as_f64().unwrap() > 0.0);
    assert_eq!(u["baselines"][0]["name"], "two sqlite statements by hand");
    assert_eq!(u["baselines"][0]["samples"], 100);
    assert!(u["baselines"][0]["leasehold_p50_ratio"].as_f64().unwrap() > 0.0);
    let primitives = u["primitives"].as_array().unwrap();
    let names: Vec<&str> = primitives
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names[..2],
        ["semaphore permit (3 permits)", "acquire_many, 2 keys"]
    );
    // The recorder rows: the Prometheus one recorded (its series are in
    // its exposition), the no-op one has no exposition to show.
    let recorded = &u["with_recorder"];
    assert_eq!(recorded["samples"], 100, "{u}");
    assert!(recorded["series"].as_u64().unwrap() > 0, "{u}");
    assert!(recorded["p50_per_plain"].as_f64().unwrap() > 0.0, "{u}");
    let noop = &u["with_noop_recorder"];
    assert_eq!(noop["samples"], 100, "{u}");
    assert!(noop.get("series").is_none(), "{u}");
    assert!(noop["p50_per_plain"].as_f64().unwrap() > 0.0, "{u}");
    // Every primitive is either timed or said to be missing on the store.
    let skipped = u["primitives_skipped"].as_array().map_or(0, Vec::len);
    assert_eq!(names.len() + skipped, 4, "{u}");
    for p in primitives {
        assert_eq!(p["samples"], 100, "{p}");
        assert!(p["p50_per_mutex"].as_f64().unwrap() > 0.0, "{p}");
    }

    let h = &s["handoff"];
    for series in ["acquire", "notified", "notified_after_release", "polling"] {
        assert!(
            h[series]["samples"].as_u64().unwrap() >= 10,
            "{series}: {h}"
        );
        assert!(h[series]["p50_us"].as_f64().unwrap() > 0.0, "{series}: {h}");
    }

    let c = &s["contended"];
    assert_eq!(c["workers"], 4);
    assert_eq!(c["leasehold"]["per_worker"].as_array().unwrap().len(), 4);
    assert!(c["leasehold"]["acquisitions"].as_u64().unwrap() > 0);
    assert!(c["raw_loop"]["acquisitions"].as_u64().unwrap() > 0);
    assert!(c["leasehold"]["jain_index"].as_f64().unwrap() > 0.0);

    let points = s["scale"]["points"].as_array().unwrap();
    assert!(!points.is_empty());
    assert!(points
        .iter()
        .all(|p| p["per_second"].as_f64().unwrap() > 0.0));

    let renewal = &s["renewal"];
    assert!(renewal["renewals_per_second"].as_f64().unwrap() > 0.0);
    assert_eq!(renewal["lost"], 0);

    let chart = std::fs::read_to_string(&svg).expect("--plot wrote the chart");
    assert!(chart.starts_with("<svg") && chart.contains("hand-off notified"));
}

#[test]
fn bench_with_processes_and_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path());
    let out = run(leasehold(&store).args([
        "bench",
        "--quick",
        "--json",
        "--scenario",
        "contended",
        "--processes",
        "--workers",
        "3",
        "--duration",
        "300ms",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &r["scenarios"]["contended"];
    assert_eq!(c["leasehold"]["per_worker"].as_array().unwrap().len(), 3);
    assert!(c["leasehold"]["acquisitions"].as_u64().unwrap() > 0);
    assert!(
        r["scenarios"].get("uncontended").is_none(),
        "only the asked-for scenario runs"
    );

    for args in [
        &["bench", "--plot", "x.png"][..],
        &["bench", "--duration", "0s"],
        &["bench", "--scenario", "nope"],
        &["bench", "--workers", "0"],
    ] {
        let out = run(leasehold(&store).args(args));
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
    }
}
