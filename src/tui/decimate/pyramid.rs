//! The [`Pyramid`] of block extremes behind fast decimation, built whole or grown as a live
//! series is appended to. It reads values only; the decimation that uses it is in the parent.

/// Min/max summaries of a series over blocks of 8, 16, 32, … points (the index of each block's
/// smallest and largest finite value): with them, decimating a window of a million points looks at
/// a few points per pixel column instead of every point.
#[derive(Debug, Clone, PartialEq)]
pub struct Pyramid {
    /// Level k: blocks of `BASE << k` points.
    pub(super) levels: Vec<Vec<(u32, u32)>>,
}

pub(super) const BASE: usize = 8;
/// A block without a finite value.
pub(super) const NONE: u32 = u32::MAX;

/// Of two indices into `ys` (either may be [`NONE`]), the one with the smaller (`min`) or larger
/// value; the earlier one on ties, as a plain scan would keep it.
fn pick(ys: &[f64], a: u32, b: u32, min: bool) -> u32 {
    match (a, b) {
        (NONE, _) => b,
        (_, NONE) => a,
        _ => {
            let (va, vb) = (ys[a as usize], ys[b as usize]);
            if (min && vb < va) || (!min && vb > va) {
                b
            } else {
                a
            }
        }
    }
}

/// The extremes of base block `b` of `ys`.
fn base_block(ys: &[f64], b: usize) -> (u32, u32) {
    let end = ys.len().min((b + 1) * BASE);
    let (mut lo, mut hi) = (NONE, NONE);
    for i in b * BASE..end {
        if ys[i].is_finite() {
            let i = i as u32;
            (lo, hi) = (pick(ys, lo, i, true), pick(ys, hi, i, false));
        }
    }
    (lo, hi)
}

/// The extremes of a block from those of its (one or two) halves.
fn parent(ys: &[f64], halves: &[(u32, u32)]) -> (u32, u32) {
    match halves {
        [a, b] => (pick(ys, a.0, b.0, true), pick(ys, a.1, b.1, false)),
        _ => halves[0],
    }
}

impl Pyramid {
    pub fn new(ys: &[f64]) -> Pyramid {
        let base: Vec<(u32, u32)> = (0..ys.len().div_ceil(BASE))
            .map(|b| base_block(ys, b))
            .collect();
        let mut levels = vec![base];
        while let Some(prev) = levels.last().filter(|l| l.len() > 1) {
            let next = prev.chunks(2).map(|p| parent(ys, p)).collect();
            levels.push(next);
        }
        Pyramid { levels }
    }

    /// Grow the pyramid to `ys`, the series it was built on with values appended: the first `from`
    /// values must be those it was built on, unchanged. Only the blocks from `from` on are
    /// recomputed (the last partial block and the new ones, then their parents level by level), so
    /// this costs O(new points + log n) and ends equal to `Pyramid::new(ys)`.
    pub fn extend(&mut self, ys: &[f64], from: usize) {
        // The first block of the current level whose summary changes.
        let mut first = (from / BASE).min(self.levels[0].len());
        let base = &mut self.levels[0];
        base.truncate(first);
        base.extend((first..ys.len().div_ceil(BASE)).map(|b| base_block(ys, b)));
        let mut k = 1;
        while self.levels[k - 1].len() > 1 || k < self.levels.len() {
            if k == self.levels.len() {
                self.levels.push(vec![]);
            }
            let (below, above) = self.levels.split_at_mut(k);
            let (prev, level) = (&below[k - 1], &mut above[0]);
            first = (first / 2).min(level.len());
            level.truncate(first);
            level.extend(prev[2 * first..].chunks(2).map(|p| parent(ys, p)));
            k += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic series of `n` values from a small linear congruential generator: few
    /// distinct values (so ties are common), with NaN and ±inf mixed in.
    fn series(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                match (s >> 33) % 13 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    r => r as f64 - 7.0,
                }
            })
            .collect()
    }

    #[test]
    fn extending_gives_the_pyramid_of_the_whole_series() {
        // Appends of every shape: none, single points, partial and whole blocks, and big runs
        // that add levels, from empty and ending on and around block boundaries.
        let rounds: [&[usize]; 8] = [
            &[0],
            &[1],
            &[7, 1, 1],
            &[8, 0, 1, 55, 0, 1, 64],
            &[3, 5, 9, 46, 1, 1, 0, 935],
            &[63, 1, 1],
            &[1000],
            &[1; 70],
        ];
        for (seed, appends) in rounds.iter().enumerate() {
            let total: usize = appends.iter().sum();
            let ys = series(total, seed as u64);
            let mut p = Pyramid::new(&[]);
            let mut n = 0;
            for &a in *appends {
                p.extend(&ys[..n + a], n);
                n += a;
                assert_eq!(p, Pyramid::new(&ys[..n]), "appends {appends:?}, at {n}");
            }
        }
        // Every split of series of lengths around block boundaries.
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 129] {
            let ys = series(len, len as u64);
            let whole = Pyramid::new(&ys);
            for split in 0..=len {
                let mut p = Pyramid::new(&ys[..split]);
                p.extend(&ys, split);
                assert_eq!(p, whole, "length {len}, split at {split}");
            }
        }
    }

    #[test]
    fn extending_from_an_earlier_point_recomputes_from_there() {
        // `from` may lie before the end of what the pyramid was built on (values unchanged).
        let ys = series(300, 7);
        let mut p = Pyramid::new(&ys[..200]);
        p.extend(&ys, 37);
        assert_eq!(p, Pyramid::new(&ys));
    }
}
