//! The SVG chart: one latency CDF per measured series.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use crate::exit::{CliError, EX_SOFTWARE};

/// Writes CDFs of `series` (name, samples) to `path`, log-scaled in µs.
pub fn write_svg(path: &Path, series: &[(&'static str, Vec<Duration>)]) -> Result<(), CliError> {
    let fail = |e: &dyn std::fmt::Display| {
        CliError::new(EX_SOFTWARE, format!("cannot draw {}: {e}", path.display()))
    };
    let curves: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .filter(|(_, s)| !s.is_empty())
        .map(|(name, s)| (*name, cdf(s)))
        .collect();
    let (lo, hi) = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.0))
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if curves.is_empty() {
        return Err(fail(
            &"no latency samples were taken (run the uncontended or handoff scenario)",
        ));
    }
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("leasehold latency distributions", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo.max(0.1)..hi * 1.1).log_scale(), 0.0..1.0)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .y_desc("fraction of samples ≤ x")
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, (name, points)) in curves.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| fail(&e))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// (latency µs, cumulative fraction) points of the empirical CDF.
fn cdf(samples: &[Duration]) -> Vec<(f64, f64)> {
    let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    let n = us.len() as f64;
    us.into_iter()
        .enumerate()
        .map(|(i, x)| (x, (i + 1) as f64 / n))
        .collect()
}
