//! Scaled dot-product attention of the device-generic path (candle's ops: what a GPU runs), in
//! tiles of query rows so that no step of a long sequence builds the whole score matrix.
//!
//! Memory: one tile's scores and probabilities, at most [`TILE_BYTES`] each, instead of
//! `batch * heads * seq * (past + seq)` floats — 8 GiB in f32 for 16 sequences of 4,096 tokens
//! with Qwen2.5-0.5B's 14 heads. That bounds inference (prefill and scoring). Training still keeps
//! every tile's probabilities for the backward pass (candle's autograd), O(heads * seq^2) per
//! sequence as before; only a fused attention kernel with recomputation removes that.

use candle_core::{D, Result, Tensor};

use super::transformer::Numerics;

/// The most bytes one tile's score matrix may take.
pub const TILE_BYTES: usize = 256 << 20;

/// Query rows per tile: as many as keep a tile's scores within `tile_bytes`, at least one.
fn tile_rows(batch: usize, kv_heads: usize, keys: usize, elem: usize, tile_bytes: usize) -> usize {
    let per_row = (batch * kv_heads * keys * elem).max(1);
    (tile_bytes / per_row).max(1)
}

/// q: (b, kv_heads, rows, hd) (each kv head's query heads stacked on the rows), k and v:
/// (b, kv_heads, keys, hd), mask: (b, 1, rows, keys) additive -> (b, kv_heads, rows, hd).
/// On a GPU a decode step (one query position a sequence, `rows` = the query heads of a kv head)
/// at inference takes our kernel over the KV cache (`kernels/cuda/src/decode_attention.cu`).
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
    numerics: Numerics,
    decode: bool,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if decode
        && numerics == Numerics::Fast
        && roll_cuda_kernels::decode_attention::applies(q, k, v, mask)
    {
        return roll_cuda_kernels::decode_attention::attend(q, k, v, mask, scale);
    }
    #[cfg(not(feature = "cuda"))]
    let _ = decode;
    attend_in_tiles(q, k, v, mask, scale, numerics, TILE_BYTES)
}

fn attend_in_tiles(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
    numerics: Numerics,
    tile_bytes: usize,
) -> Result<Tensor> {
    let (b, nkv, rows, _) = q.dims4()?;
    let keys = k.dim(2)?;
    let kt = k.t()?;
    let tile = |q: &Tensor, mask: &Tensor| -> Result<Tensor> {
        let scores = (q.matmul(&kt)? * scale)?.broadcast_add(mask)?;
        let probs = match numerics {
            Numerics::Fast => candle_nn::ops::softmax_last_dim(&scores)?,
            Numerics::Differentiable | Numerics::Reference => {
                candle_nn::ops::softmax(&scores, D::Minus1)?
            }
        };
        probs.matmul(v)
    };
    let per_tile = tile_rows(b, nkv, keys, q.dtype().size_in_bytes(), tile_bytes);
    if per_tile >= rows {
        return tile(q, mask);
    }
    let mut parts = Vec::with_capacity(rows.div_ceil(per_tile));
    for start in (0..rows).step_by(per_tile) {
        let len = per_tile.min(rows - start);
        parts.push(tile(
            &q.narrow(2, start, len)?,
            &mask.narrow(2, start, len)?,
        )?);
    }
    Tensor::cat(&parts, 2)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    #[test]
    fn tiles_bound_the_rows_and_keep_at_least_one() {
        // 2 * 2 kv heads * 100 keys * 4 bytes = 1,600 bytes a row.
        assert_eq!(tile_rows(2, 2, 100, 4, 16_000), 10);
        assert_eq!(tile_rows(2, 2, 100, 4, 100), 1);
    }

    /// Attention in tiles of 3 rows (of 10) gives the whole matrix's values and gradients: the
    /// rows are independent, so each tile is the same computation on its rows.
    #[test]
    fn attention_in_tiles_equals_the_whole_score_matrix() {
        let dev = Device::Cpu;
        let (b, nkv, rows, keys, hd) = (2, 2, 10, 7, 4);
        let q = Var::randn(0f32, 1.0, (b, nkv, rows, hd), &dev).unwrap();
        let k = Var::randn(0f32, 1.0, (b, nkv, keys, hd), &dev).unwrap();
        let v = Var::randn(0f32, 1.0, (b, nkv, keys, hd), &dev).unwrap();
        // Causal-ish: row i sees keys 0..=min(i, keys-1); row 0 of batch 1 sees nothing (a
        // padding query), which must stay finite.
        let mut m = vec![0f32; b * rows * keys];
        for n in 0..b {
            for i in 0..rows {
                for j in 0..keys {
                    if j > i || (n == 1 && i == 0) {
                        m[(n * rows + i) * keys + j] = crate::model::transformer::MASKED;
                    }
                }
            }
        }
        let mask = Tensor::from_vec(m, (b, 1, rows, keys), &dev).unwrap();
        let row_bytes = b * nkv * keys * DType::F32.size_in_bytes();
        for numerics in [Numerics::Fast, Numerics::Differentiable] {
            let run = |tile_bytes: usize| {
                let out = attend_in_tiles(&q, &k, &v, &mask, 0.5, numerics, tile_bytes).unwrap();
                let w = Tensor::arange(0f32, out.elem_count() as f32, &dev)
                    .unwrap()
                    .reshape(out.dims())
                    .unwrap();
                let flat = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                if numerics == Numerics::Fast {
                    return (flat, vec![]);
                }
                let grads = (out * w).unwrap().sum_all().unwrap().backward().unwrap();
                let g = [&q, &k, &v]
                    .iter()
                    .flat_map(|x| {
                        grads
                            .get(x.as_tensor())
                            .unwrap()
                            .flatten_all()
                            .unwrap()
                            .to_vec1::<f32>()
                            .unwrap()
                    })
                    .collect::<Vec<_>>();
                (flat, g)
            };
            let whole = run(usize::MAX);
            let tiled = run(3 * row_bytes);
            assert!(whole.0.iter().all(|x| x.is_finite()));
            // Values: the same sums per row. Gradients: k's and v's are summed over the tiles,
            // in another order than over the whole matrix.
            for (a, b) in tiled.0.iter().zip(&whole.0) {
                assert!(
                    (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                    "{numerics:?}: {a} vs {b}"
                );
            }
            for (a, b) in tiled.1.iter().zip(&whole.1) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{numerics:?} grad: {a} vs {b}"
                );
            }
            assert_eq!(tiled.1.len(), whole.1.len());
        }
    }
}
