//! An explicit key/value cache for batched, ragged decoding.
//!
//! Rows are sequences; columns are cache positions shared by all rows. Each row's tokens occupy the
//! columns from `valid_from[row]` to the end (left padding before that), so every row's next token lands
//! in the same column and one batched decode step serves sequences of different lengths. Rows can be
//! dropped (a sequence finished) and added (a queued one started): that is what continuous batching needs.
//!
//! Buffers are preallocated with spare columns and written in place, so a decode step copies only the
//! new keys/values instead of the whole cache.
//!
//! The position axis is the one the model's attention reads: 2 in candle's (rows, kv_heads, columns,
//! head_dim) layout, 1 in the fused CPU kernels' (rows, columns, kv_heads, head_dim). Each layer
//! keeps the axis of its first append.

use candle_core::{Result, Tensor};

/// Extra columns allocated beyond what is needed, so most appends write in place.
const SPARE_COLUMNS: usize = 32;

#[derive(Clone)]
struct LayerKv {
    /// (rows, kv_heads, capacity, head_dim) or (rows, capacity, kv_heads, head_dim); columns
    /// `0..len` of axis `axis` are meaningful.
    k: Tensor,
    v: Tensor,
    len: usize,
    axis: usize,
}

impl LayerKv {
    fn capacity(&self) -> usize {
        self.k.dims()[self.axis]
    }

    /// The meaningful columns, as contiguous-by-row views.
    fn views(&self) -> Result<(Tensor, Tensor)> {
        Ok((
            self.k.narrow(self.axis, 0, self.len)?,
            self.v.narrow(self.axis, 0, self.len)?,
        ))
    }

    /// Copy `k`/`v` (columns on `axis`) into fresh buffers with spare capacity.
    fn from_dense(k: &Tensor, v: &Tensor, axis: usize) -> Result<Self> {
        let len = k.dims()[axis];
        Ok(LayerKv {
            k: k.pad_with_zeros(axis, 0, SPARE_COLUMNS)?.contiguous()?,
            v: v.pad_with_zeros(axis, 0, SPARE_COLUMNS)?.contiguous()?,
            len,
            axis,
        })
    }
}

/// One row's keys and values, per layer ([`KvCache::row_columns`]).
pub type RowKv = Vec<(Tensor, Tensor)>;

pub struct KvCache {
    layers: Vec<Option<LayerKv>>,
    valid_from: Vec<usize>,
}

impl KvCache {
    /// An empty cache for `valid_from.len()` rows whose first real column is `valid_from[row]`.
    pub fn new(num_layers: usize, valid_from: Vec<usize>) -> Self {
        KvCache {
            layers: vec![None; num_layers],
            valid_from,
        }
    }

    pub fn rows(&self) -> usize {
        self.valid_from.len()
    }

    /// Number of cached columns.
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map_or(0, |l| l.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn valid_from(&self) -> &[usize] {
        &self.valid_from
    }

    /// Extend layer `layer` with new keys/values (rows, kv_heads, t, head_dim); returns the full ones
    /// (views into the cache, valid until the next call that changes the cache).
    pub fn append(&mut self, layer: usize, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        self.append_on(layer, k, v, 2)
    }

    /// [`KvCache::append`] with the columns on `axis` (1 for (rows, t, kv_heads, head_dim)).
    pub fn append_on(
        &mut self,
        layer: usize,
        k: Tensor,
        v: Tensor,
        axis: usize,
    ) -> Result<(Tensor, Tensor)> {
        let t = k.dims()[axis];
        let slot = &mut self.layers[layer];
        match slot {
            None => {
                *slot = Some(LayerKv::from_dense(
                    &k.contiguous()?,
                    &v.contiguous()?,
                    axis,
                )?)
            }
            Some(kv) if kv.axis != axis => {
                candle_core::bail!(
                    "kv cache layer {layer} holds columns on axis {}, not {axis}",
                    kv.axis
                )
            }
            Some(kv) if kv.len + t <= kv.capacity() => {
                kv.k.slice_set(&k.contiguous()?, axis, kv.len)?;
                kv.v.slice_set(&v.contiguous()?, axis, kv.len)?;
                kv.len += t;
            }
            Some(kv) => {
                let (pk, pv) = kv.views()?;
                *kv = LayerKv::from_dense(
                    &Tensor::cat(&[&pk, &k], axis)?,
                    &Tensor::cat(&[&pv, &v], axis)?,
                    axis,
                )?;
            }
        }
        match slot {
            Some(kv) => kv.views(),
            None => candle_core::bail!("kv cache layer {layer} was not initialised"),
        }
    }

    /// Keep only the given rows, in the given order.
    pub fn retain_rows(&mut self, rows: &[usize]) -> Result<()> {
        self.valid_from = rows.iter().map(|&r| self.valid_from[r]).collect();
        if rows.is_empty() {
            self.layers.iter_mut().for_each(|l| *l = None);
            return Ok(());
        }
        let device = match self.layers.first() {
            Some(Some(kv)) => kv.k.device().clone(),
            _ => return Ok(()),
        };
        let idx = Tensor::from_vec(
            rows.iter().map(|&r| r as u32).collect::<Vec<_>>(),
            rows.len(),
            &device,
        )?;
        for kv in self.layers.iter_mut().flatten() {
            kv.k = kv.k.index_select(&idx, 0)?;
            kv.v = kv.v.index_select(&idx, 0)?;
        }
        Ok(())
    }

    /// Append the rows of `other` below ours, padding the shorter cache on the left so that both end
    /// at the same column (the next token of every row goes to the same column).
    pub fn merge(&mut self, other: KvCache) -> Result<()> {
        if self.rows() == 0 {
            *self = other;
            return Ok(());
        }
        if other.rows() == 0 {
            return Ok(());
        }
        let (a, b) = (self.len(), other.len());
        let total = a.max(b);
        let (pad_a, pad_b) = (total - a, total - b);
        for (mine, theirs) in self.layers.iter_mut().zip(other.layers) {
            if let (Some(kv), Some(okv)) = (mine.as_ref(), theirs) {
                let axis = kv.axis;
                if okv.axis != axis {
                    candle_core::bail!("kv caches with columns on axes {axis} and {}", okv.axis);
                }
                let (k, v) = kv.views()?;
                let (ok, ov) = okv.views()?;
                let k = Tensor::cat(
                    &[
                        &k.pad_with_zeros(axis, pad_a, 0)?,
                        &ok.pad_with_zeros(axis, pad_b, 0)?,
                    ],
                    0,
                )?;
                let v = Tensor::cat(
                    &[
                        &v.pad_with_zeros(axis, pad_a, 0)?,
                        &ov.pad_with_zeros(axis, pad_b, 0)?,
                    ],
                    0,
                )?;
                *mine = Some(LayerKv::from_dense(&k, &v, axis)?);
            }
        }
        self.valid_from.iter_mut().for_each(|s| *s += pad_a);
        self.valid_from
            .extend(other.valid_from.iter().map(|s| s + pad_b));
        Ok(())
    }

    /// Row `row`'s own columns (from its first real one to the end), per layer: keys and values
    /// of shape (1, columns, ..) on the cache's position axis, copied out of the cache, with that
    /// axis. `None` for an empty cache.
    pub fn row_columns(&self, row: usize) -> Result<Option<(usize, RowKv)>> {
        let Some(&start) = self.valid_from.get(row) else {
            candle_core::bail!("kv cache: no row {row} of {}", self.rows());
        };
        let mut axis = 0;
        let mut layers = Vec::with_capacity(self.layers.len());
        for kv in &self.layers {
            let Some(kv) = kv else { return Ok(None) };
            axis = kv.axis;
            let take = |t: &Tensor| -> Result<Tensor> {
                t.narrow(0, row, 1)?
                    .narrow(kv.axis, start, kv.len - start)?
                    .contiguous()
            };
            layers.push((take(&kv.k)?, take(&kv.v)?));
        }
        Ok(Some((axis, layers)))
    }

    /// A cache whose rows begin with earlier columns of their own: row `i` holds the first
    /// `pasts[i].1` columns of `pasts[i].0` (per layer, keys and values as [`KvCache::row_columns`]
    /// gives them), or none, right-aligned at `width` columns (zeros before). `valid_from` is each
    /// row's first real column, counted over the columns still to come too.
    pub fn from_pasts(
        pasts: &[(Option<&RowKv>, usize)],
        axis: usize,
        width: usize,
        valid_from: Vec<usize>,
    ) -> Result<KvCache> {
        let Some(layers) = pasts.iter().find_map(|(p, _)| *p).map(Vec::len) else {
            candle_core::bail!("kv cache: no row has a past");
        };
        let mut cache = KvCache::new(layers, valid_from);
        for layer in 0..layers {
            let mut ks = Vec::with_capacity(pasts.len());
            let mut vs = Vec::with_capacity(pasts.len());
            let like = pasts
                .iter()
                .find_map(|(p, _)| p.map(|p| &p[layer]))
                .map(|(k, _)| k.clone());
            let Some(like) = like else {
                candle_core::bail!("kv cache: layer {layer} has no past");
            };
            let mut blank = like.dims().to_vec();
            blank[axis] = width;
            for &(past, len) in pasts {
                match past {
                    Some(past) if len > 0 => {
                        let (k, v) = &past[layer];
                        let keep = |t: &Tensor| {
                            t.narrow(axis, 0, len)?.pad_with_zeros(axis, width - len, 0)
                        };
                        ks.push(keep(k)?);
                        vs.push(keep(v)?);
                    }
                    _ => {
                        // Keys and values have one shape: one zero block serves both.
                        let zeros = Tensor::zeros(blank.as_slice(), like.dtype(), like.device())?;
                        ks.push(zeros.clone());
                        vs.push(zeros);
                    }
                }
            }
            cache.append_on(layer, Tensor::cat(&ks, 0)?, Tensor::cat(&vs, 0)?, axis)?;
        }
        Ok(cache)
    }

    /// Drop leading columns that no row uses any more, so attention cost tracks the live sequences.
    pub fn trim_left(&mut self) -> Result<()> {
        let drop = self
            .valid_from
            .iter()
            .copied()
            .min()
            .unwrap_or(0)
            .min(self.len());
        if drop == 0 {
            return Ok(());
        }
        for kv in self.layers.iter_mut().flatten() {
            let keep = kv.len - drop;
            let k = kv.k.narrow(kv.axis, drop, keep)?;
            let v = kv.v.narrow(kv.axis, drop, keep)?;
            *kv = LayerKv::from_dense(&k, &v, kv.axis)?;
        }
        self.valid_from.iter_mut().for_each(|s| *s -= drop);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Keys whose value encodes (row tag, column): easy to check after moves.
    fn block(rows: &[f32], t: usize, start: usize) -> Tensor {
        let data: Vec<f32> = rows
            .iter()
            .flat_map(|r| (0..t).map(move |c| r * 1000.0 + (start + c) as f32))
            .collect();
        Tensor::from_vec(data, (rows.len(), 1, t, 1), &Device::Cpu).unwrap()
    }

    fn columns(t: &Tensor) -> Vec<Vec<f32>> {
        t.squeeze(3).unwrap().squeeze(1).unwrap().to_vec2().unwrap()
    }

    #[test]
    fn appends_past_the_spare_capacity_keep_every_column() {
        let mut cache = KvCache::new(1, vec![0, 0]);
        cache
            .append(0, block(&[1.0, 2.0], 3, 0), block(&[1.0, 2.0], 3, 0))
            .unwrap();
        for step in 0..(SPARE_COLUMNS + 5) {
            cache
                .append(
                    0,
                    block(&[1.0, 2.0], 1, 3 + step),
                    block(&[1.0, 2.0], 1, 3 + step),
                )
                .unwrap();
        }
        let (k, v) = cache
            .append(0, block(&[1.0, 2.0], 1, 40), block(&[1.0, 2.0], 1, 40))
            .unwrap();
        assert_eq!(cache.len(), 41);
        let want: Vec<Vec<f32>> = [1.0f32, 2.0]
            .iter()
            .map(|r| (0..41).map(|c| r * 1000.0 + c as f32).collect())
            .collect();
        assert_eq!(columns(&k), want);
        assert_eq!(columns(&v), want);
    }

    #[test]
    fn merge_aligns_ends_and_trim_drops_unused_columns() {
        // Row A has 4 columns; row B (2 columns) joins: B is left-padded by 2.
        let mut a = KvCache::new(1, vec![0]);
        a.append(0, block(&[1.0], 4, 0), block(&[1.0], 4, 0))
            .unwrap();
        let mut b = KvCache::new(1, vec![0]);
        b.append(0, block(&[2.0], 2, 0), block(&[2.0], 2, 0))
            .unwrap();
        a.merge(b).unwrap();
        assert_eq!(a.valid_from(), &[0, 2]);
        let (k, _) = a
            .append(0, block(&[3.0, 4.0], 1, 9), block(&[3.0, 4.0], 1, 9))
            .unwrap();
        assert_eq!(
            columns(&k),
            vec![
                vec![1000.0, 1001.0, 1002.0, 1003.0, 3009.0],
                vec![0.0, 0.0, 2000.0, 2001.0, 4009.0]
            ]
        );
        // A finishes: only B stays, and its two padding columns are trimmed away.
        a.retain_rows(&[1]).unwrap();
        a.trim_left().unwrap();
        assert_eq!(a.valid_from(), &[0]);
        let (k, _) = a
            .append(0, block(&[5.0], 1, 0), block(&[5.0], 1, 0))
            .unwrap();
        assert_eq!(columns(&k), vec![vec![2000.0, 2001.0, 4009.0, 5000.0]]);
    }
}
