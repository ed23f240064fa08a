//! Masked scaled-dot-product attention with grouped query heads, as one op:
//!   S = scale * Q K^T + mask,   P = softmax(S) by row,   O = P V,
//! with query head `h` reading key/value head `h / groups` (the transformer's GQA layout).
//!
//! The backward recomputes P one query row at a time (as flash attention does) rather than keeping
//! the (heads, t, t) probabilities, and uses `D_i = sum_j P_ij dP_ij = dO_i . O_i`:
//!   dP = dO V^T,   dS_ij = P_ij (dP_ij - D_i),   dQ = scale dS K,   dK = scale dS^T Q,   dV = P^T dO.
//!
//! A key whose mask value is below [`MASK_SKIP`] is masked: its score is the mask value itself (the
//! dot product is not computed; added to -1e9 it would vanish in f32 anyway) and, when its
//! probability is exactly zero, it is skipped in the products. A row masked everywhere still gets
//! the uniform distribution the additive mask gives it.

mod backward;
mod lanes;

use std::mem::MaybeUninit;
use std::ops::Range;

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, bail};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

pub use backward::attention_backward;
use lanes::{dot, map_in_place, sum, weighted_sum};

use super::fresh::{assume_written, unwritten, write_copy};
use super::{f32_data, storage_f32, vexp};

const NAME: &str = "fused attention";

/// Mask values below this mark a masked key (the transformer masks with -1e9).
pub const MASK_SKIP: f32 = -5e8;

/// The operands' sizes and where each row lives in the flat buffers.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    /// Query positions.
    t: usize,
    /// Key positions.
    tk: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    groups: usize,
    /// Distance between batch rows in the key and value operands: rows of a KV cache are
    /// `capacity` columns apart, of which the first `tk` are read.
    kv_stride: usize,
}

impl Dims {
    fn of(q: &Layout, k: &Layout, v: &Layout, mask: &Layout) -> Result<Dims> {
        let (b, t, heads, head_dim) = q.shape().dims4()?;
        let (bk, tk, kv_heads, hdk) = k.shape().dims4()?;
        if bk != b || hdk != head_dim || head_dim == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            bail!(
                "{NAME}: queries {:?} do not fit keys {:?}",
                q.shape().dims(),
                k.shape().dims()
            );
        }
        if v.shape() != k.shape() {
            bail!(
                "{NAME}: values {:?} differ from keys {:?}",
                v.shape().dims(),
                k.shape().dims()
            );
        }
        let groups = heads / kv_heads;
        let row = kv_heads * head_dim;
        let kv_stride = k.stride()[0];
        if k.stride()[1..] != [row, head_dim, 1] || v.stride() != k.stride() || kv_stride < tk * row
        {
            bail!(
                "{NAME}: keys and values must be contiguous within each batch row (strides {:?} and {:?})",
                k.stride(),
                v.stride()
            );
        }
        if mask.shape().dims() != [b, 1, groups * t, tk] {
            bail!(
                "{NAME}: mask {:?}, expected ({b}, 1, {}, {tk})",
                mask.shape().dims(),
                groups * t
            );
        }
        Ok(Dims {
            b,
            t,
            tk,
            heads,
            kv_heads,
            head_dim,
            groups,
            kv_stride,
        })
    }

    /// Where the first key (or value) row of kv head `kv` in batch row `n` starts in the
    /// operands; the next rows follow `kv_heads * head_dim` apart.
    fn kv_start(&self, n: usize, kv: usize) -> usize {
        n * self.kv_stride + kv * self.head_dim
    }

    /// Query (or output) row `i` of head `h` in batch row `n`.
    fn q_at(&self, n: usize, i: usize, h: usize) -> usize {
        ((n * self.t + i) * self.heads + h) * self.head_dim
    }

    /// Key (or value) row `j` of kv head `kv` in batch row `n` of a contiguous (b, tk, kv_heads,
    /// head_dim) gradient.
    fn kv_at(&self, n: usize, j: usize, kv: usize) -> usize {
        ((n * self.tk + j) * self.kv_heads + kv) * self.head_dim
    }

    /// The mask row of query `i` of the `r`-th head of a group in batch row `n`.
    fn mask_at(&self, n: usize, r: usize, i: usize) -> usize {
        ((n * self.groups + r) * self.t + i) * self.tk
    }

    fn q_len(&self) -> usize {
        self.b * self.t * self.heads * self.head_dim
    }

    fn kv_len(&self) -> usize {
        self.b * self.tk * self.kv_heads * self.head_dim
    }
}

/// The operands a (batch row, kv head) task reads.
struct Inputs<'a> {
    d: Dims,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    mask: &'a [f32],
    scale: f32,
}

impl<'x> Inputs<'x> {
    /// The key (or value) rows `keys` (`hd` = the head dim) of kv head `kv` in batch row `n` of
    /// `data` (the keys or the values), in order.
    #[inline(always)]
    fn kv_rows(
        &self,
        data: &'x [f32],
        n: usize,
        kv: usize,
        hd: usize,
        keys: Range<usize>,
    ) -> impl Iterator<Item = &'x [f32]> {
        let d = &self.d;
        let row = d.kv_heads * hd;
        // One slice of exactly the rows' extent (`rows_data` checked that the operand holds
        // it), then each row by its offset. Against `chunks(row).take(tk)` (`cargo bench -p
        // roll-cpu-kernels --bench attention`, one thread): training's forward 4-7% faster at
        // both shapes and ISAs, its backward 1-3% faster at the tiny shape and 9% at the 0.5B
        // shape with AVX-512 (but 3% slower there with AVX2), decode the same. With no keys the first row's offset may lie past
        // the data: then there are no rows.
        let extent = d.tk.checked_sub(1).map_or(0, |last| last * row + hd);
        let rows = data.get(d.kv_start(n, kv)..).and_then(|r| r.get(..extent));
        let keys = if rows.is_some() { keys } else { 0..0 };
        let rows = rows.unwrap_or_default();
        keys.map(move |j| &rows[j * row..j * row + hd])
    }

    /// The attention probabilities of query `i` of head `kv * groups + r` in batch row `n`, over
    /// the keys it may attend ([`open_keys`]), which it returns: `p[..keys.len()]` holds them.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn probs<S: Simd>(
        &self,
        simd: S,
        n: usize,
        kv: usize,
        hd: usize,
        r: usize,
        i: usize,
        p: &mut [f32],
    ) -> Range<usize> {
        let d = &self.d;
        let qi = &self.q[d.q_at(n, i, kv * d.groups + r)..][..hd];
        let mask = &self.mask[d.mask_at(n, r, i)..][..d.tk];
        let keys = open_keys(mask);
        let p = &mut p[..keys.len()];
        let mut max = f32::NEG_INFINITY;
        let rows = self.kv_rows(self.k, n, kv, hd, keys.clone());
        for ((p, &m), kj) in p.iter_mut().zip(&mask[keys.clone()]).zip(rows) {
            *p = if m < MASK_SKIP {
                m
            } else {
                dot(simd, qi, kj) * self.scale + m
            };
            max = max.max(*p);
        }
        let shift = simd.splat_f32s(max);
        map_in_place(simd, p, |v| simd.sub_f32s(v, shift));
        vexp::exp_in_place_with(simd, p);
        let total = simd.splat_f32s(sum(simd, p));
        map_in_place(simd, p, |v| simd.div_f32s(v, total));
        keys
    }

    /// The outputs of query position `g` (batch row `g / t`, position `g % t`) for every head,
    /// into `dst` (heads * hd, as the output lays them out). `p` holds `tk` probabilities and `o`
    /// one head's output row: scratch the caller keeps across positions. `hd` is the head dim, a
    /// constant where [`ForwardRow`] calls this for a common one.
    #[inline(always)]
    fn forward_position<S: Simd>(
        &self,
        simd: S,
        g: usize,
        hd: usize,
        (p, o): (&mut [f32], &mut [f32]),
        dst: &mut [MaybeUninit<f32>],
    ) {
        let d = &self.d;
        let (n, i) = (g / d.t, g % d.t);
        for (h, dst) in dst.chunks_exact_mut(hd).enumerate() {
            let (kv, r) = (h / d.groups, h % d.groups);
            let keys = self.probs(simd, n, kv, hd, r, i, p);
            let p = &p[..keys.len()];
            weighted_sum(simd, o, p, || self.kv_rows(self.v, n, kv, hd, keys.clone()));
            write_copy(dst, o);
        }
    }

    /// Copies a task's query-shaped rows (groups * t, head_dim) to their places in (b, t, heads, hd).
    /// Every task's rows together write all of `dst` (q_len elements).
    fn scatter_q(&self, dst: &mut [MaybeUninit<f32>], n: usize, kv: usize, rows: &[f32]) {
        let d = &self.d;
        for (row, src) in rows.chunks(d.head_dim).enumerate() {
            let (r, i) = (row / d.t, row % d.t);
            write_copy(
                &mut dst[d.q_at(n, i, kv * d.groups + r)..][..d.head_dim],
                src,
            );
        }
    }

    /// Copies a task's key-shaped rows (tk, head_dim) to their places in (b, tk, kv_heads, hd).
    /// Every task's rows together write all of `dst` (kv_len elements).
    fn scatter_kv(&self, dst: &mut [MaybeUninit<f32>], n: usize, kv: usize, rows: &[f32]) {
        let d = &self.d;
        for (j, src) in rows.chunks(d.head_dim).enumerate() {
            write_copy(&mut dst[d.kv_at(n, j, kv)..][..d.head_dim], src);
        }
    }
}

/// The keys a query whose mask row is `mask` may attend: from its first unmasked key to its last.
/// The keys outside get a probability of exactly 0 (their scores are the mask's -1e9, the row's
/// largest score is an unmasked key's), so they are not visited: in a batch padded on the left,
/// or packed several sequences to a row, most of a row's keys. A row masked everywhere keeps all
/// its keys, which the additive mask gives one probability each.
fn open_keys(mask: &[f32]) -> Range<usize> {
    let open = |m: &f32| *m >= MASK_SKIP;
    match (mask.iter().position(open), mask.iter().rposition(open)) {
        (Some(first), Some(last)) => first..last + 1,
        _ => 0..mask.len(),
    }
}

struct Attention {
    mask: Tensor,
    scale: f32,
}

/// Runs `f` with the checked operands of one call.
#[allow(clippy::too_many_arguments)]
fn with_inputs<R>(
    mask: &Tensor,
    scale: f32,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
    f: impl FnOnce(&Inputs) -> Result<R>,
) -> Result<R> {
    let (ms, ml) = mask.storage_and_layout();
    let d = Dims::of(l1, l2, l3, ml)?;
    let inputs = Inputs {
        d,
        q: f32_data(s1, l1, NAME, "queries")?,
        k: rows_data(s2, l2, &d, "keys")?,
        v: rows_data(s3, l3, &d, "values")?,
        mask: storage_f32(&ms, ml, NAME, "mask")?,
        scale,
    };
    f(&inputs)
}

/// The data of a key or value operand from its first element, checked to hold every row `Dims`
/// reads (the rows may be strided views into a KV cache).
fn rows_data<'a>(s: &'a CpuStorage, l: &Layout, d: &Dims, what: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(all) = s else {
        bail!("{NAME}: {what} must be f32");
    };
    let data = all.get(l.start_offset()..).unwrap_or(&[]);
    if d.b > 0 {
        let needed = (d.b - 1) * d.kv_stride + d.tk * d.kv_heads * d.head_dim;
        if data.len() < needed {
            bail!("{NAME}: {what} hold {} values, {needed} needed", data.len());
        }
    }
    Ok(data)
}

/// Every (batch row, kv head) pair: the units of parallel work.
fn tasks(d: &Dims) -> impl IndexedParallelIterator<Item = (usize, usize)> {
    let kv_heads = d.kv_heads;
    (0..d.b * kv_heads)
        .into_par_iter()
        .map(move |task| (task / kv_heads, task % kv_heads))
}

// Each task is compiled for AVX-512 or AVX2, whichever the CPU has (pulp checks at run time; the
// crate itself targets baseline x86-64), so the 16- or 8-lane loops of `lanes` take one
// instruction per step. The task is a `WithSimd` struct whose `with_simd` is inlined into pulp's
// target-feature function: a closure handed to `Arch::dispatch` is compiled apart from those
// features (its body ran as SSE halves). The head dims matched here (and in
// `backward::BackwardTask`) reach the loops as constants.
struct ForwardRow<'a, 'x> {
    x: &'a Inputs<'x>,
    /// The query position: batch row `g / t`, position `g % t`.
    g: usize,
    scratch: (&'a mut [f32], &'a mut [f32]),
    dst: &'a mut [MaybeUninit<f32>],
}

impl WithSimd for ForwardRow<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let ForwardRow { x, g, scratch, dst } = self;
        match x.d.head_dim {
            32 => x.forward_position(simd, g, 32, scratch, dst),
            64 => x.forward_position(simd, g, 64, scratch, dst),
            128 => x.forward_position(simd, g, 128, scratch, dst),
            hd => x.forward_position(simd, g, hd, scratch, dst),
        }
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_inputs(&self.mask, self.scale, s1, l1, s2, l2, s3, l3, |x| {
            let d = x.d;
            let arch = pulp::Arch::new();
            let mut out = unwritten(d.q_len());
            // A task per query position, writing its heads' outputs where they go: a decode
            // step's (batch row, kv head) tasks had each returned a vector that was then copied
            // into place, and those allocations and copies were a third of a tiny decode step's
            // attention (benches/RESULTS.md). The scratch rows live as long as a rayon job.
            let position = d.heads * d.head_dim;
            if position > 0 {
                out.par_chunks_mut(position).enumerate().for_each_init(
                    || (vec![0f32; d.tk], vec![0f32; d.head_dim]),
                    |(p, o), (g, dst)| {
                        arch.dispatch(ForwardRow {
                            x,
                            g,
                            scratch: (p, o),
                            dst,
                        })
                    },
                );
            }
            // SAFETY: the chunks are every query position's, each written whole, head by head
            // (`forward_position`): together every element of out.
            #[allow(unsafe_code)]
            let out = unsafe { assume_written(out) };
            let shape = Shape::from((d.b, d.t, d.heads * d.head_dim));
            Ok((CpuStorage::F32(out), shape))
        })
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dq, dk, dv) = backward::backward(q, k, v, &self.mask, self.scale, res, grad)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// q: (b, t, heads, hd), k and v: (b, tk, kv_heads, hd), f32 on CPU; mask: (b, 1, groups * t, tk)
/// additive (roll's `model::attention_mask`) -> (b, t, heads * hd). Keys and values may be
/// views of a KV cache (batch rows further apart than `tk` columns); other layouts are copied.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    // Rows as the kernel reads them: each batch row contiguous, rows at least `tk` columns apart,
    // keys and values alike; anything else is copied.
    let readable = |x: &Tensor| -> Result<bool> {
        let (_, tk, kv_heads, hd) = x.dims4()?;
        let s = x.stride();
        Ok(s[1..] == [kv_heads * hd, hd, 1] && s[0] >= tk * kv_heads * hd)
    };
    let (k, v) = if readable(k)? && readable(v)? && k.stride() == v.stride() {
        (k.clone(), v.clone())
    } else {
        (k.contiguous()?, v.contiguous()?)
    };
    q.contiguous()?.apply_op3(
        &k,
        &v,
        Attention {
            mask: mask.contiguous()?,
            scale: scale as f32,
        },
    )
}
