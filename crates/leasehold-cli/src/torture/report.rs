//! The torture report, as a table for people or one JSON object (`--json`).

use serde::Serialize;

use super::checker::{Report, Verdict};

/// What was run, printed above the checker's findings.
#[derive(Debug, Serialize)]
pub struct Setup {
    pub store: String,
    pub workers: u32,
    pub keys: u32,
    pub duration_ms: u64,
    pub ttl_ms: u64,
    /// The ttl the store enforces for `ttl_ms` (longer on etcd, which
    /// rounds ttls up to whole seconds); the takeover bound follows it.
    pub enforced_ttl_ms: u64,
    pub seed: u64,
    pub primitive: super::Primitive,
    /// Semaphore permits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    pub resource: &'static str,
    pub fencing: bool,
    pub faults: Vec<String>,
    /// The most connections the run's processes held on the store's server.
    pub connections: Option<crate::connections::Peak>,
    /// Fault kinds asked for that do not apply to this store, and why;
    /// workers that did not end cleanly.
    pub notes: Vec<String>,
}

pub fn print_json(setup: &Setup, report: &Report) {
    let json = serde_json::json!({ "setup": setup, "report": report });
    println!("{json}");
}

pub fn print_table(setup: &Setup, r: &Report) {
    let enforced = if setup.enforced_ttl_ms == setup.ttl_ms {
        String::new()
    } else {
        format!(" (the store enforces {} ms)", setup.enforced_ttl_ms)
    };
    println!(
        "leasehold torture: {} | {} workers, {} key(s), {} ms, ttl {} ms{enforced}, seed {}",
        setup.store, setup.workers, setup.keys, setup.duration_ms, setup.ttl_ms, setup.seed
    );
    println!(
        "lock: {}{}; resource: {} ({}); faults: {}",
        setup.primitive.name(),
        setup
            .permits
            .map(|n| format!(" of {n} permits"))
            .unwrap_or_default(),
        setup.resource,
        if setup.fencing {
            "fenced"
        } else {
            "NOT fenced: --no-fencing"
        },
        if setup.faults.is_empty() {
            "none".to_owned()
        } else {
            setup.faults.join(",")
        }
    );
    if let Some(c) = &setup.connections {
        println!("connections: peak {} ({})", c.peak, c.counted);
    }
    for note in &setup.notes {
        println!("note: {note}");
    }
    println!();
    let faults = if r.faults.is_empty() {
        "none".to_owned()
    } else {
        r.faults
            .iter()
            .map(|(k, c)| format!("{k} {} ({} hit)", c.injected, c.hit))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let zero = |n: u64| if n == 0 { "ok" } else { "VIOLATION" };
    // A count that must be 0, shown with its verdict.
    let must_be_zero = |name, n: u64| (name, n.to_string(), zero(n));
    let rows: Vec<(&str, String, &str)> = vec![
        (
            "acquisitions",
            format!(
                "{} (wait timeouts {}, unknown outcome {})",
                r.acquisitions, r.acquire_timeouts, r.acquire_unknown
            ),
            "",
        ),
        ("faults injected", faults, ""),
        ("accepted writes", r.writes_accepted.to_string(), ""),
        (
            "fenced rejections",
            format!(
                "{} (reads {}, writes {})",
                r.fenced_rejections, r.fenced_reads, r.fenced_writes
            ),
            "",
        ),
        (
            "overlapping beliefs",
            r.overlapping_beliefs.to_string(),
            "stale holders that acted",
        ),
        (
            "holders at once",
            if setup.primitive == super::Primitive::Rw {
                format!(
                    "max {} (readers together, a writer alone)",
                    r.holders_at_once.max
                )
            } else {
                format!(
                    "max {} (limit {})",
                    r.holders_at_once.max, r.holders_at_once.limit
                )
            },
            zero(r.holders_at_once.over_limit),
        ),
        must_be_zero("stale writes accepted", r.stale_writes_accepted),
        must_be_zero("stale reads accepted", r.stale_reads_accepted),
        must_be_zero("token regressions", r.token_regressions),
        must_be_zero("token duplicates", r.token_duplicates),
        must_be_zero("lost increments", r.lost_increments),
        (
            "takeover after kill",
            match r.takeover.max_ms {
                Some(max) => format!(
                    "max {max:.1} ms over {} kills (bound {:.0} ms)",
                    r.takeover.measured, r.takeover.bound_ms
                ),
                None => format!("no kill measured (bound {:.0} ms)", r.takeover.bound_ms),
            },
            zero(r.takeover.over_bound),
        ),
        (
            "renewals",
            format!(
                "{} of {} sent (refused {}, failed {}); {} holds over a ttl",
                r.renewals.renewed,
                r.renewals.sent,
                r.renewals.refused,
                r.renewals.failed,
                r.renewals.holds_over_ttl
            ),
            if r.renewals.renewed == 0 {
                "UNTESTED"
            } else {
                ""
            },
        ),
        (
            "lost-lease deadline first",
            format!(
                "{}/{} superseded holders ({:.0} %) before the next request",
                r.lost_signal.deadline_before_next_grant,
                r.lost_signal.superseded,
                r.lost_signal.percent,
            ),
            zero(r.lost_signal.superseded - r.lost_signal.deadline_before_next_grant),
        ),
        (
            "lost() by valid_until",
            format!(
                "{}/{} running holders in time (slack {:.0} ms); fired {} times",
                r.lost_signal.fired_on_time,
                r.lost_signal.must_fire,
                r.lost_signal.slack_ms,
                r.lost_signal.signals_fired
            ),
            zero(r.lost_signal.must_fire - r.lost_signal.fired_on_time),
        ),
        (
            "held after end + ttl",
            r.locks_held_after_end.to_string(),
            zero(r.locks_held_after_end as u64),
        ),
        (
            "stale-write rate, 95 % ub",
            format!(
                "{:.3} % ({} over {} write decisions)",
                r.violation_rate_upper_95 * 100.0,
                if r.stale_writes_accepted == 0 {
                    "rule of three: 3"
                } else {
                    "observed"
                },
                r.trials
            ),
            "",
        ),
    ];
    for (name, value, judgement) in rows {
        println!("{name:<27} {value:<60} {judgement}");
    }
    println!();
    match r.verdict {
        Verdict::Pass => println!("verdict: PASS"),
        Verdict::Violation => println!("verdict: VIOLATION: {}", r.violations.join("; ")),
        Verdict::Inconclusive => println!(
            "verdict: INCONCLUSIVE: {}; run longer",
            r.inconclusive.join("; ")
        ),
    }
}
