//! `/metrics` of the dashboard, in the Prometheus text format: what the
//! dashboard sees of the store (live leases by class and kind, grants and
//! releases seen, observed hold times). The wait times of acquisitions are
//! only known inside the processes that acquire: those export them
//! through the library's `metrics` feature.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::watch::State;

/// Upper bounds (seconds) of the observed hold-time histogram.
const HOLD_BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The lock class of a key: up to its first `:`, or `other` (as the
/// library's metrics label it; never the raw key).
fn class(key: &str) -> &str {
    match key.split_once(':') {
        Some((prefix, _)) if !prefix.is_empty() => prefix,
        _ => "other",
    }
}

pub fn render(st: &State) -> String {
    let mut out = String::new();
    let mut live: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for row in &st.rows {
        *live.entry((class(&row.key), row.kind)).or_default() += 1;
    }
    out.push_str("# HELP leasehold_dashboard_leases Live leases by lock class and kind.\n");
    out.push_str("# TYPE leasehold_dashboard_leases gauge\n");
    for ((class, kind), n) in &live {
        let _ = writeln!(
            out,
            "leasehold_dashboard_leases{{lock_class=\"{}\",kind=\"{kind}\"}} {n}",
            escape(class)
        );
    }
    out.push_str(
        "# HELP leasehold_dashboard_grants_seen_total Grants seen by the dashboard's listings.\n",
    );
    out.push_str("# TYPE leasehold_dashboard_grants_seen_total counter\n");
    let _ = writeln!(out, "leasehold_dashboard_grants_seen_total {}", st.granted);
    out.push_str("# HELP leasehold_dashboard_releases_seen_total Leases seen to end (released, expired or broken).\n");
    out.push_str("# TYPE leasehold_dashboard_releases_seen_total counter\n");
    let _ = writeln!(
        out,
        "leasehold_dashboard_releases_seen_total {}",
        st.released
    );
    out.push_str(
        "# HELP leasehold_dashboard_listing_ok Whether the last listing of the store succeeded.\n",
    );
    out.push_str("# TYPE leasehold_dashboard_listing_ok gauge\n");
    let _ = writeln!(
        out,
        "leasehold_dashboard_listing_ok {}",
        u8::from(st.error.is_none())
    );
    out.push_str("# HELP leasehold_dashboard_observed_hold_seconds Hold times seen by the dashboard, over its recent history.\n");
    out.push_str("# TYPE leasehold_dashboard_observed_hold_seconds histogram\n");
    let secs: Vec<f64> = st.holds.iter().map(|&(_, ms)| ms as f64 / 1000.0).collect();
    for bound in HOLD_BUCKETS {
        let n = secs.iter().filter(|&&s| s <= bound).count();
        let _ = writeln!(
            out,
            "leasehold_dashboard_observed_hold_seconds_bucket{{le=\"{bound}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "leasehold_dashboard_observed_hold_seconds_bucket{{le=\"+Inf\"}} {}",
        secs.len()
    );
    let _ = writeln!(
        out,
        "leasehold_dashboard_observed_hold_seconds_sum {}",
        secs.iter().sum::<f64>()
    );
    let _ = writeln!(
        out,
        "leasehold_dashboard_observed_hold_seconds_count {}",
        secs.len()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::super::watch::Row;
    use super::*;

    #[test]
    fn leases_are_counted_by_class_never_by_key() {
        let mut st = State::default();
        for key in ["orders:1", "orders:2", "nightly"] {
            st.rows.push(Row {
                key: key.into(),
                kind: "mutex",
                slot: None,
                holder: "h:1".into(),
                token: 1,
                remaining_ms: 10,
            });
        }
        st.holds.push_back((0, 300));
        let text = render(&st);
        assert!(
            text.contains("leasehold_dashboard_leases{lock_class=\"orders\",kind=\"mutex\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("leasehold_dashboard_leases{lock_class=\"other\",kind=\"mutex\"} 1"),
            "{text}"
        );
        assert!(!text.contains("orders:1"), "{text}");
        assert!(
            text.contains("leasehold_dashboard_observed_hold_seconds_bucket{le=\"0.25\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("leasehold_dashboard_observed_hold_seconds_bucket{le=\"0.5\"} 1"),
            "{text}"
        );
    }
}
