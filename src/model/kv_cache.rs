//! An explicit key/value cache for batched, ragged decoding.
//!
//! Rows are sequences; columns are cache positions shared by all rows. Each row's tokens occupy the
//! columns from `valid_from[row]` to the end (left padding before that), so every row's next token lands
//! in the same column and one batched decode step serves sequences of different lengths. Rows can be
//! dropped (a sequence finished) and added (a queued one started): that is what continuous batching needs.

use candle_core::{Result, Tensor};

pub struct KvCache {
    /// Per layer: keys and values, each (rows, kv_heads, columns, head_dim).
    layers: Vec<Option<(Tensor, Tensor)>>,
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
        match self.layers.first() {
            Some(Some((k, _))) => k.dims()[2],
            _ => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn valid_from(&self) -> &[usize] {
        &self.valid_from
    }

    /// Extend layer `layer` with new keys/values (rows, kv_heads, t, head_dim); returns the full ones.
    pub fn append(&mut self, layer: usize, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let full = match self.layers[layer].take() {
            None => (k, v),
            Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
        };
        self.layers[layer] = Some(full.clone());
        Ok(full)
    }

    /// Keep only the given rows, in the given order.
    pub fn retain_rows(&mut self, rows: &[usize]) -> Result<()> {
        self.valid_from = rows.iter().map(|&r| self.valid_from[r]).collect();
        if rows.is_empty() {
            self.layers.iter_mut().for_each(|l| *l = None);
            return Ok(());
        }
        let device = match self.layers.first() {
            Some(Some((k, _))) => k.device().clone(),
            _ => return Ok(()),
        };
        let idx = Tensor::from_vec(
            rows.iter().map(|&r| r as u32).collect::<Vec<_>>(),
            rows.len(),
            &device,
        )?;
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.index_select(&idx, 0)?;
            *v = v.index_select(&idx, 0)?;
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
            if let (Some((k, v)), Some((ok, ov))) = (mine.take(), theirs) {
                let k = Tensor::cat(
                    &[
                        &k.pad_with_zeros(2, pad_a, 0)?,
                        &ok.pad_with_zeros(2, pad_b, 0)?,
                    ],
                    0,
                )?;
                let v = Tensor::cat(
                    &[
                        &v.pad_with_zeros(2, pad_a, 0)?,
                        &ov.pad_with_zeros(2, pad_b, 0)?,
                    ],
                    0,
                )?;
                *mine = Some((k, v));
            }
        }
        self.valid_from.iter_mut().for_each(|s| *s += pad_a);
        self.valid_from
            .extend(other.valid_from.iter().map(|s| s + pad_b));
        Ok(())
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
        let keep = self.len() - drop;
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.narrow(2, drop, keep)?.contiguous()?;
            *v = v.narrow(2, drop, keep)?.contiguous()?;
        }
        self.valid_from.iter_mut().for_each(|s| *s -= drop);
        Ok(())
    }
}
