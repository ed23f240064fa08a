//! Series reduced for drawing: EMA smoothing over the whole series, and min/max decimation to at
//! most two points per pixel column of the visible window. Decimation never samples at random:
//! every column keeps its extreme values, so a one-step spike is visible at any zoom. A [`Pyramid`]
//! of block extremes keeps that fast for million-point series. Both grow with a live series at the
//! cost of its new points ([`Ema`], [`Pyramid::extend`]). Pure functions, no drawing.

mod pyramid;

pub use crate::smoothing::{Ema, ema};
pub use pyramid::Pyramid;
use pyramid::{BASE, NONE};

/// Per pixel column, the indices of its smallest and largest point.
struct Columns<'a> {
    xs: &'a [f64],
    ys: &'a [f64],
    x0: f64,
    scale: f64,
    columns: usize,
    current: Option<(usize, usize, usize)>, // (column, index of min, index of max)
    out: Vec<(f64, f64)>,
}

impl Columns<'_> {
    fn visit(&mut self, i: usize) {
        let y = self.ys[i];
        if !y.is_finite() {
            return;
        }
        let c = (((self.xs[i] - self.x0) * self.scale) as usize).min(self.columns - 1);
        match &mut self.current {
            Some((col, lo, hi)) if *col == c => {
                if y < self.ys[*lo] {
                    *lo = i;
                }
                if y > self.ys[*hi] {
                    *hi = i;
                }
            }
            _ => {
                self.flush();
                self.current = Some((c, i, i));
            }
        }
    }

    fn flush(&mut self) {
        if let Some((_, lo, hi)) = self.current.take() {
            let (a, b) = (lo.min(hi), lo.max(hi));
            self.out.push((self.xs[a], self.ys[a]));
            if b != a {
                self.out.push((self.xs[b], self.ys[b]));
            }
        }
    }
}

/// The points of `(xs, ys)` to draw for the x window `[x0, x1]` on `columns` pixel columns: per
/// column, its minimum and maximum points in the order they occur, plus the nearest point on each
/// side of the window so that lines run to its edges. `xs` must be non-decreasing; points with a
/// non-finite value are skipped. This looks at every point of the window; [`min_max_with`] gives
/// the same picture from a [`Pyramid`] in time independent of the window's size.
pub fn min_max(xs: &[f64], ys: &[f64], window: (f64, f64), columns: usize) -> Vec<(f64, f64)> {
    decimate(xs, ys, None, window, columns)
}

/// [`min_max`] using `pyramid` (built from `ys`): windows with more than 32 points per column are
/// read a block at a time, with blocks of at most a quarter of a column, so an extreme can only
/// move to the neighbouring column when its block straddles the column edge.
pub fn min_max_with(
    xs: &[f64],
    ys: &[f64],
    pyramid: &Pyramid,
    window: (f64, f64),
    columns: usize,
) -> Vec<(f64, f64)> {
    decimate(xs, ys, Some(pyramid), window, columns)
}

fn decimate(
    xs: &[f64],
    ys: &[f64],
    pyramid: Option<&Pyramid>,
    (x0, x1): (f64, f64),
    columns: usize,
) -> Vec<(f64, f64)> {
    let n = xs.len().min(ys.len());
    if n == 0 || columns == 0 || x1.partial_cmp(&x0) != Some(std::cmp::Ordering::Greater) {
        return vec![];
    }
    let first = xs[..n].partition_point(|&x| x < x0);
    let end = xs[..n].partition_point(|&x| x <= x1);
    let mut cols = Columns {
        xs,
        ys,
        x0,
        scale: columns as f64 / (x1 - x0),
        columns,
        current: None,
        out: Vec::with_capacity(2 * columns + 2),
    };
    // The nearest finite point left of the window.
    if let Some(i) = (0..first).rev().find(|&i| ys[i].is_finite()) {
        cols.out.push((xs[i], ys[i]));
    }
    // The largest block size of at most a quarter column's points.
    let per_block = (end - first) / (4 * columns);
    let level = pyramid
        .filter(|_| per_block >= BASE)
        .map(|p| (p, (per_block / BASE).ilog2() as usize))
        .map(|(p, k)| (p, k.min(p.levels.len() - 1)));
    let mut i = first;
    if let Some((p, k)) = level {
        let block = BASE << k;
        while i < end && !i.is_multiple_of(block) {
            cols.visit(i);
            i += 1;
        }
        while i + block <= end {
            let (lo, hi) = p.levels[k][i / block];
            for j in [lo.min(hi), lo.max(hi)] {
                if j != NONE {
                    cols.visit(j as usize);
                }
            }
            i += block;
        }
    }
    while i < end {
        cols.visit(i);
        i += 1;
    }
    cols.flush();
    // The nearest finite point right of the window.
    if let Some(i) = (end..n).find(|&i| ys[i].is_finite()) {
        cols.out.push((xs[i], ys[i]));
    }
    cols.out
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
    fn the_pyramid_gives_the_plain_scan_picture() {
        // A noisy walk with gaps and spikes, 200k points, on 150 columns and various windows.
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let mut y = 0.0;
        let ys: Vec<f64> = (0..n)
            .map(|i: usize| {
                y += ((i * 7919) % 101) as f64 / 50.0 - 1.0;
                match i % 9973 {
                    0 => f64::NAN,
                    5 => y + 500.0,
                    _ => y,
                }
            })
            .collect();
        let p = Pyramid::new(&ys);
        for window in [
            (0.0, n as f64),
            (1234.5, 98765.0),
            (100.0, 5000.0),
            (10.0, 60.0),
        ] {
            let plain = min_max(&xs, &ys, window, 150);
            let fast = min_max_with(&xs, &ys, &p, window, 150);
            assert!(fast.len() <= 2 * 150 + 2, "{}", fast.len());
            // The same extremes overall, and every point a real one.
            assert_eq!(value_range(&plain), value_range(&fast), "{window:?}");
            for (x, y) in &fast {
                assert_eq!(ys[*x as usize].to_bits(), y.to_bits());
            }
            // Column by column, each plain extreme is matched or beaten within one column (a
            // block straddling a column edge may give its extreme to the neighbour).
            let col = |x: f64| ((x - window.0) * 150.0 / (window.1 - window.0)).floor() as i64;
            for (x, y) in &plain[1..plain.len() - 1] {
                let near = |keep: &dyn Fn(f64) -> bool| {
                    fast.iter()
                        .any(|(fx, fy)| keep(*fy) && (col(*fx) - col(*x)).abs() <= 1)
                };
                assert!(
                    near(&|fy| fy <= *y) && near(&|fy| fy >= *y),
                    "{window:?}: {y} at {x}"
                );
            }
            if window.1 - window.0 < 600.0 {
                assert_eq!(plain, fast, "small windows are scanned plainly");
            }
        }
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
