//! Turns a chart's series into drawable points and axis ranges, whatever the data looks like.
//!
//! Non-finite values are skipped and split a line into runs (a gap, not an invented segment); axis
//! ranges are never empty or infinite, so single points, flat lines and values near `f64::MAX` draw.

use std::ops::Range;

use super::select::ChartPlan;

/// The maximal runs of consecutive points with a finite value.
pub(crate) fn finite_runs(steps: &[u64], values: &[f64]) -> Vec<Vec<(u64, f64)>> {
    let mut runs = vec![Vec::new()];
    for (step, value) in steps.iter().zip(values) {
        match runs.last_mut() {
            Some(run) if value.is_finite() => run.push((*step, *value)),
            Some(run) if !run.is_empty() => runs.push(Vec::new()),
            _ => {}
        }
    }
    runs.retain(|run| !run.is_empty());
    runs
}

/// Axis ranges covering every finite point of the plan, never empty and never infinite.
pub(crate) fn ranges(plan: &ChartPlan<'_>) -> (Range<u64>, Range<f64>) {
    let points = plan
        .lines
        .iter()
        .flat_map(|s| s.steps.iter().zip(&s.values))
        .filter(|(_, v)| v.is_finite());
    let mut bounds: Option<(u64, u64, f64, f64)> = None;
    for (step, value) in points {
        let (x0, x1, y0, y1) = bounds.unwrap_or((*step, *step, *value, *value));
        bounds = Some((x0.min(*step), x1.max(*step), y0.min(*value), y1.max(*value)));
    }
    let (x0, x1, y0, y1) = bounds.unwrap_or((0, 1, 0.0, 1.0));
    let x = if x0 == x1 {
        x0.saturating_sub(1)..x1.saturating_add(1)
    } else {
        x0..x1
    };
    (x, pad_y(y0, y1))
}

/// `lo..hi` between round numbers, as the workbench draws it ([`super::axis::round_bounds`]);
/// flat data gets 10% of its magnitude (0..1 at zero), spans too wide to round 5% room.
/// Stays finite and non-empty even for values near `f64::MAX`.
fn pad_y(lo: f64, hi: f64) -> Range<f64> {
    if let Some((a, b)) = super::axis::round_bounds(lo, hi) {
        return a..b;
    }
    let span = hi - lo;
    // Flat at zero (a reward of 0, an evaluation's one point): 0..1, as the workbench draws it,
    // not -1..1 below a floor the values never cross.
    if span == 0.0 && lo == 0.0 {
        return 0.0..1.0;
    }
    let pad = if span == 0.0 {
        lo.abs() * 0.1
    } else {
        span * 0.05
    };
    let (mut a, mut b) = (lo - pad, hi + pad);
    if !a.is_finite() {
        a = lo;
    }
    if !b.is_finite() {
        b = hi;
    }
    if !(b - a).is_finite() {
        // The axis maths divides by the span; keep it finite by clipping the extremes.
        a = a.max(-f64::MAX / 4.0);
        b = b.min(f64::MAX / 4.0);
    }
    a..b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_at_non_finite_values() {
        let v = [1.0, f64::NAN, 2.0, 3.0, f64::INFINITY, f64::NAN, 4.0];
        let steps: Vec<u64> = (1..=7).collect();
        let runs = finite_runs(&steps, &v);
        assert_eq!(
            runs,
            vec![vec![(1, 1.0)], vec![(3, 2.0), (4, 3.0)], vec![(7, 4.0)]]
        );
        assert!(finite_runs(&[1], &[f64::NAN]).is_empty());
    }

    #[test]
    fn y_ranges_are_round_finite_and_non_empty() {
        // Flat data: 10% of the magnitude, or 0..1 at zero; otherwise round numbers.
        assert_eq!(pad_y(2.0, 2.0), 1.8..2.2);
        assert_eq!(pad_y(0.0, 0.0), 0.0..1.0);
        assert_eq!(pad_y(0.0, 9.3), 0.0..10.0);
        for (lo, hi) in [
            (f64::MAX, f64::MAX),
            (-f64::MAX, f64::MAX),
            (-f64::MAX, -f64::MAX),
        ] {
            let r = pad_y(lo, hi);
            assert!(
                r.start < r.end && (r.end - r.start).is_finite(),
                "{lo} {hi}: {r:?}"
            );
        }
    }
}
