//! AdamW's step for one f32 parameter on the CPU in two passes over memory, where candle's
//! elementwise ops took fourteen (the clipped gradient, each moment's two scalings and sum, the
//! bias corrections, the square root, the quotient, the decay, the step), each writing a new
//! tensor of the parameter's size: at the Qwen2.5-0.5B shape a step walked ~60 GB and held
//! several 0.5 GB temporaries beside the 151,936 x 896 embedding. Here:
//! - [`moments`] reads m, v and the gradient once and writes the new moments (two new tensors:
//!   the old ones may be shared, by a checkpoint's or an offload's copy);
//! - [`apply`] reads them and updates the parameter in place, as `Var::set` wrote into it before;
//! - [`sum_of_squares`] gives the gradient's squared norm with no squared copy.
//!
//! The arithmetic is candle's, operation for operation: a tensor times a scalar there is
//! `x * (s as f32) + 0` (its `affine`), a quotient by a scalar a product with the reciprocal, and
//! nothing is fused into multiply-adds, so [`moments`] and [`apply`] give the same bits as the ops
//! they replace (tested in `roll::train::optim`).

use candle_core::{CpuStorage, CustomOp3, InplaceOp3, Layout, Result, Shape, Tensor, bail};
use rayon::prelude::*;

use super::{f32_data, storage_f32, sum_of_squares_f64, unpack};

const NAME: &str = "adamw";
/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// One step's scalars, as the optimizer holds them (f64), and the gradient's clipping factor.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// Multiplies the gradient (1 when the norm is within bounds).
    pub clip: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// The bias corrections `1 - beta^t`.
    pub correction1: f64,
    pub correction2: f64,
    pub eps: f64,
    pub lr: f64,
    /// Decoupled weight decay, where it applies to this parameter.
    pub weight_decay: Option<f64>,
}

/// candle's `x * s` for a scalar s: `affine(s, 0)`.
#[inline(always)]
fn scaled(x: f32, s: f32) -> f32 {
    x * s + 0.0
}

/// The scalars as f32, as candle's `affine` casts them.
struct Scalars {
    clip: f32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    inv_correction1: f32,
    inv_correction2: f32,
    eps: f32,
    lr: f32,
    weight_decay: Option<f32>,
}

impl Scalars {
    fn of(s: &Step) -> Scalars {
        Scalars {
            clip: s.clip as f32,
            beta1: s.beta1 as f32,
            one_minus_beta1: (1.0 - s.beta1) as f32,
            beta2: s.beta2 as f32,
            one_minus_beta2: (1.0 - s.beta2) as f32,
            inv_correction1: (1.0 / s.correction1) as f32,
            inv_correction2: (1.0 / s.correction2) as f32,
            eps: s.eps as f32,
            lr: s.lr as f32,
            weight_decay: s.weight_decay.map(|w| w as f32),
        }
    }
}

struct Moments(Step);

impl CustomOp3 for Moments {
    fn name(&self) -> &'static str {
        NAME
    }

    /// m, v, g -> [m' | v'] flat.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let m = f32_data(s1, l1, NAME, "the first moment")?;
        let v = f32_data(s2, l2, NAME, "the second moment")?;
        let g = f32_data(s3, l3, NAME, "the gradient")?;
        if l1.shape() != l2.shape() || l1.shape() != l3.shape() {
            bail!(
                "{NAME}: moments {:?} and {:?} for a gradient {:?}",
                l1.dims(),
                l2.dims(),
                l3.dims()
            );
        }
        let k = Scalars::of(&self.0);
        let n = g.len();
        let mut out = vec![0f32; 2 * n];
        let (m_new, v_new) = out.split_at_mut(n);
        m_new
            .par_chunks_mut(CHUNK)
            .zip(v_new.par_chunks_mut(CHUNK))
            .zip(m.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
            .zip(g.par_chunks(CHUNK))
            .for_each(|(((m_new, v_new), (m, v)), g)| {
                for i in 0..g.len().min(m_new.len()).min(v_new.len()) {
                    // (g * clip), then m * b1 + g * (1 - b1) and v * b2 + g² * (1 - b2).
                    let g = scaled(g[i], k.clip);
                    m_new[i] = scaled(m[i], k.beta1) + scaled(g, k.one_minus_beta1);
                    v_new[i] = scaled(v[i], k.beta2) + scaled(g * g, k.one_minus_beta2);
                }
            });
        Ok((CpuStorage::F32(out), Shape::from(2 * n)))
    }
}

struct Apply(Step);

impl InplaceOp3 for Apply {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        theta: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let m = f32_data(s2, l2, NAME, "the first moment")?;
        let v = f32_data(s3, l3, NAME, "the second moment")?;
        if l1.shape() != l2.shape() || l1.shape() != l3.shape() {
            bail!(
                "{NAME}: a parameter {:?} with moments {:?} and {:?}",
                l1.dims(),
                l2.dims(),
                l3.dims()
            );
        }
        let Some((a, b)) = l1.contiguous_offsets() else {
            bail!("{NAME}: the parameter must be contiguous");
        };
        let CpuStorage::F32(theta) = theta else {
            bail!("{NAME}: the parameter must be f32");
        };
        let k = Scalars::of(&self.0);
        theta[a..b]
            .par_chunks_mut(CHUNK)
            .zip(m.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
            .for_each(|(theta, (m, v))| {
                for i in 0..theta.len().min(m.len()).min(v.len()) {
                    let m_hat = scaled(m[i], k.inv_correction1);
                    let v_hat = scaled(v[i], k.inv_correction2);
                    // sqrt(v̂) + eps is candle's affine(1, eps).
                    let mut update = m_hat / (v_hat.sqrt() * 1.0 + k.eps);
                    if let Some(decay) = k.weight_decay {
                        update += scaled(theta[i], decay);
                    }
                    theta[i] -= scaled(update, k.lr);
                }
            });
        Ok(())
    }
}

/// Whether [`moments`] and [`apply`] can take this parameter and its moments: contiguous f32 on
/// the CPU.
pub fn applies(param: &Tensor, m: &Tensor, v: &Tensor) -> bool {
    [param, m, v]
        .iter()
        .all(|t| crate::applies(t) && t.is_contiguous())
}

/// The new moments (m', v') from m, v and the gradient g (one shape, f32): `m' = b1 m + (1 - b1)
/// clip g`, `v' = b2 v + (1 - b2) (clip g)²`. New tensors: m and v are left as they are.
pub fn moments(m: &Tensor, v: &Tensor, g: &Tensor, step: &Step) -> Result<(Tensor, Tensor)> {
    let packed = m.apply_op3_no_bwd(&v.contiguous()?, &g.contiguous()?, &Moments(*step))?;
    let [m_new, v_new] = unpack(&packed, [m.dims(), v.dims()])?;
    Ok((m_new, v_new))
}

/// `param -= lr (m̂ / (sqrt(v̂) + eps) + decay param)` in place, with m̂ = m / c1 and v̂ = v / c2
/// (the bias corrections). Every tensor sharing `param`'s storage sees the change, as with
/// `Var::set`.
pub fn apply(param: &Tensor, m: &Tensor, v: &Tensor, step: &Step) -> Result<()> {
    param.inplace_op3(&m.contiguous()?, &v.contiguous()?, &Apply(*step))
}

/// The sum of the squares of every element (f32 on the CPU), in f64: each block's sum as
/// RMSNorm sums a row, the blocks' sums added in order, so the result does not depend on the
/// number of threads.
pub fn sum_of_squares(g: &Tensor) -> Result<f64> {
    let g = g.contiguous()?;
    let (s, l) = g.storage_and_layout();
    let data = storage_f32(&s, l, NAME, "the gradient")?;
    let blocks: Vec<f64> = data.par_chunks(CHUNK).map(sum_of_squares_f64).collect();
    Ok(blocks.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Over several parallel blocks and a tail: the f64 sum of squares, to f64 rounding.
    #[test]
    fn sum_of_squares_is_the_f64_sum() {
        let n = 13 * 3790; // three full blocks and a short one that ends in a tail of 6
        let xs: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let want: f64 = xs.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        let g = Tensor::from_vec(xs, (n / 13, 13), &Device::Cpu).unwrap();
        let got = sum_of_squares(&g).unwrap();
        assert!((got - want).abs() <= want * 1e-12, "{got} vs {want}");
        // A transposed view is read in its own order, with the same sum.
        let t = sum_of_squares(&g.t().unwrap()).unwrap();
        assert!((t - want).abs() <= want * 1e-12, "{t} vs {want}");
    }

    #[test]
    fn shapes_that_differ_are_errors_naming_the_kernel() {
        let dev = Device::Cpu;
        let z = |n: usize| Tensor::zeros(n, candle_core::DType::F32, &dev).unwrap();
        let step = Step {
            clip: 1.0,
            beta1: 0.9,
            beta2: 0.999,
            correction1: 0.1,
            correction2: 0.001,
            eps: 1e-8,
            lr: 1e-3,
            weight_decay: None,
        };
        let err = moments(&z(3), &z(3), &z(4), &step).unwrap_err();
        assert!(err.to_string().contains("adamw"), "{err}");
        let err = apply(&z(3), &z(2), &z(3), &step).unwrap_err();
        assert!(err.to_string().contains("adamw"), "{err}");
    }
}
