//! The Prometheus text format of the CLI, in one place: `/metrics` of the
//! dashboard (what it sees of the store: live leases by class and kind,
//! grants and releases seen, observed hold times), and [`merge`], which
//! sums the expositions of several processes into one (`demo
//! --metrics-addr`: the library's own metrics, exported by each worker).
//! The wait times of acquisitions are only known inside the processes that
//! acquire: those export them through the library's `metrics` feature.

use std::collections::{BTreeMap, HashMap};
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

/// The Prometheus recorder a process installs to export the library's
/// metrics: histograms with these bucket bounds (seconds), so that the
/// expositions of several processes add up.
pub fn recorder() -> metrics_exporter_prometheus::PrometheusRecorder {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[
            0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0,
        ])
        .expect("the bucket list is not empty")
        .build_recorder()
}

/// One metric family of a merged exposition: its `# HELP`/`# TYPE` lines
/// and its series, in the order first seen.
#[derive(Default)]
struct Family {
    comments: Vec<String>,
    series: Vec<String>,
}

/// Several processes' expositions (the same recorder setup, see
/// [`recorder`]) as one: every sample of the same series summed, which is
/// right for counters, histogram buckets, sums and counts, and for gauges
/// of things held or waiting now. Each family stays one group, as the
/// format requires.
pub fn merge<'a>(expositions: impl IntoIterator<Item = &'a str>) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut families: HashMap<String, Family> = HashMap::new();
    let mut values: HashMap<String, f64> = HashMap::new();
    for text in expositions {
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(comment) = line.strip_prefix('#') {
                let mut words = comment.split_whitespace();
                let (Some(_kind), Some(name)) = (words.next(), words.next()) else {
                    continue;
                };
                let family = families.entry(name.to_owned()).or_insert_with(|| {
                    order.push(name.to_owned());
                    Family::default()
                });
                if !family.comments.iter().any(|c| c == line) {
                    family.comments.push(line.to_owned());
                }
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let name = series.split('{').next().unwrap_or(series);
            let family_name = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|suffix| name.strip_suffix(suffix))
                .find(|base| families.contains_key(*base))
                .unwrap_or(name)
                .to_owned();
            let family = families.entry(family_name.clone()).or_insert_with(|| {
                order.push(family_name);
                Family::default()
            });
            match values.get_mut(series) {
                Some(sum) => *sum += value,
                None => {
                    family.series.push(series.to_owned());
                    values.insert(series.to_owned(), value);
                }
            }
        }
    }
    let mut out = String::new();
    for name in &order {
        let family = &families[name];
        for comment in &family.comments {
            let _ = writeln!(out, "{comment}");
        }
        for series in &family.series {
            let _ = writeln!(out, "{series} {}", values[series]);
        }
    }
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

    #[test]
    fn expositions_merge_by_series_and_keep_each_family_one_group() {
        let a = "# HELP x_total Xs.\n# TYPE x_total counter\nx_total{k=\"a\"} 2\n\
                 # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 0.5\nh_count 1\n";
        let b = "# HELP x_total Xs.\n# TYPE x_total counter\nx_total{k=\"a\"} 3\nx_total{k=\"b\"} 1\n\
                 # TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 2\nh_sum 4.25\nh_count 2\n";
        let merged = merge([a, b]);
        assert_eq!(
            merged,
            "# HELP x_total Xs.\n# TYPE x_total counter\nx_total{k=\"a\"} 5\nx_total{k=\"b\"} 1\n\
             # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 3\nh_sum 4.75\nh_count 3\n"
        );
    }
}
