//! Series reduced for drawing: EMA smoothing over the whole series, and min/max decimation to at
//! most two points per pixel column of the visible window. Decimation never samples at random:
//! every column keeps its extreme values, so a one-step spike is visible at any zoom. Pure functions,
//! no drawing.

/// TensorBoard-style smoothing: `s_t = w·s_{t−1} + (1 − w)·v_t`, debiased by `1 − w^n` (n = finite
/// values seen) so the curve starts at the first value instead of at 0. Non-finite values are
/// passed through (they stay gaps) and do not enter the average. `weight` is clamped to [0, 0.999].
pub fn ema(values: &[f64], weight: f64) -> Vec<f64> {
    let w = weight.clamp(0.0, 0.999);
    let mut acc = 0.0;
    let mut debias = 1.0;
    values
        .iter()
        .map(|&v| {
            if !v.is_finite() {
                return v;
            }
            acc = w * acc + (1.0 - w) * v;
            debias *= w;
            acc / (1.0 - debias)
        })
        .collect()
}

/// The points of `(xs, ys)` to draw for the x window `[x0, x1]` on `columns` pixel columns: per
/// column, its minimum and maximum points in the order they occur, plus the nearest point on each
/// side of the window so that lines run to its edges. `xs` must be non-decreasing; points with a
/// non-finite value are skipped.
pub fn min_max(xs: &[f64], ys: &[f64], (x0, x1): (f64, f64), columns: usize) -> Vec<(f64, f64)> {
    let n = xs.len().min(ys.len());
    if n == 0 || columns == 0 || x1.partial_cmp(&x0) != Some(std::cmp::Ordering::Greater) {
        return vec![];
    }
    let first = xs[..n].partition_point(|&x| x < x0);
    let end = xs[..n].partition_point(|&x| x <= x1);
    let finite = |i: usize| ys[i].is_finite();
    let mut out = Vec::with_capacity(2 * columns + 2);
    // The nearest finite point left of the window.
    if let Some(i) = (0..first).rev().find(|&i| finite(i)) {
        out.push((xs[i], ys[i]));
    }
    let scale = columns as f64 / (x1 - x0);
    let mut column: Option<(usize, usize, usize)> = None; // (column, index of min, index of max)
    let flush = |c: Option<(usize, usize, usize)>, out: &mut Vec<(f64, f64)>| {
        if let Some((_, lo, hi)) = c {
            let (a, b) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            out.push((xs[a], ys[a]));
            if b != a {
                out.push((xs[b], ys[b]));
            }
        }
    };
    for i in first..end {
        if !finite(i) {
            continue;
        }
        let c = (((xs[i] - x0) * scale) as usize).min(columns - 1);
        match &mut column {
            Some((col, lo, hi)) if *col == c => {
                if ys[i] < ys[*lo] {
                    *lo = i;
                }
                if ys[i] > ys[*hi] {
                    *hi = i;
                }
            }
            _ => {
                flush(column, &mut out);
                column = Some((c, i, i));
            }
        }
    }
    flush(column, &mut out);
    // The nearest finite point right of the window.
    if let Some(i) = (end..n).find(|&i| finite(i)) {
        out.push((xs[i], ys[i]));
    }
    out
}

/// The smallest and largest finite value among `points`, `None` when there is none.
pub fn value_range(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    points
        .iter()
        .map(|&(_, y)| y)
        .filter(|y| y.is_finite())
        .fold(None, |acc, y| match acc {
            None => Some((y, y)),
            Some((lo, hi)) => Some((lo.min(y), hi.max(y))),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ema_is_debiased_and_skips_gaps() {
        // w = 0.5: s1 = 0.5·2 / (1 − 0.5) = 2; s2 = (0.5·1 + 0.5·4) / (1 − 0.25) = 2.5 / 0.75.
        let s = ema(&[2.0, f64::NAN, 4.0], 0.5);
        assert_eq!(s[0], 2.0);
        assert!(s[1].is_nan());
        assert!((s[2] - 2.5 / 0.75).abs() < 1e-12, "{s:?}");
        // No smoothing is the series itself.
        assert_eq!(ema(&[1.0, -3.0, 7.5], 0.0), vec![1.0, -3.0, 7.5]);
    }

    #[test]
    fn each_column_keeps_its_extremes_in_order() {
        // 10 points on 2 columns over [0, 10): column 0 holds x 0..5, column 1 holds x 5..=9 (and 10
        // would clamp into it). The spike at x = 7 must survive.
        let xs: Vec<f64> = (0..10).map(f64::from).collect();
        let ys = [0.0, 1.0, -1.0, 0.5, 0.2, 0.1, 0.0, 9.0, 0.3, 0.2];
        let pts = min_max(&xs, &ys, (0.0, 10.0), 2);
        assert_eq!(pts, vec![(1.0, 1.0), (2.0, -1.0), (6.0, 0.0), (7.0, 9.0)]);
    }

    #[test]
    fn a_window_adds_its_neighbours_and_skips_non_finite_points() {
        let xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let ys = [1.0, f64::NAN, 3.0, 4.0, f64::INFINITY, 6.0];
        // Window [3, 4] on 4 columns: neighbours are x = 1 (x = 2 is NaN) and x = 6 (x = 5 is inf).
        let pts = min_max(&xs, &ys, (3.0, 4.0), 4);
        assert_eq!(pts, vec![(1.0, 1.0), (3.0, 3.0), (4.0, 4.0), (6.0, 6.0)]);
        assert!(min_max(&xs, &ys, (4.0, 4.0), 4).is_empty());
        assert!(min_max(&[], &[], (0.0, 1.0), 4).is_empty());
    }

    #[test]
    fn a_million_points_become_at_most_two_per_column() {
        let xs: Vec<f64> = (0..1_000_000).map(f64::from).collect();
        let ys: Vec<f64> = xs.iter().map(|x| (x * 0.001).sin()).collect();
        let pts = min_max(&xs, &ys, (0.0, 1_000_000.0), 100);
        assert!(pts.len() <= 200, "{}", pts.len());
        let (lo, hi) = value_range(&pts).unwrap();
        // sin reaches ±1 every 6283 steps: the extremes survive decimation.
        assert!(lo < -0.9999 && hi > 0.9999, "{lo} {hi}");
    }
}
