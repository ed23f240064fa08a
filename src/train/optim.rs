//! AdamW with warmup + constant/cosine learning-rate schedules, gradient accumulation across
//! micro-batches, and global gradient-norm clipping.

use std::collections::{BTreeMap, HashMap};

use candle_core::{DType, Result, Tensor, Var, backprop::GradStore};
use roll_cpu_kernels::{accumulate, adamw};
use serde::{Deserialize, Serialize};

use crate::model::threads::on_the_pool;

/// Learning-rate schedule after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    #[default]
    Constant,
    /// Cosine decay from `lr` to `lr * min_lr_ratio` at `total_steps`.
    Cosine,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    pub lr: f64,
    pub betas: [f64; 2],
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices only (not to norms or biases).
    pub weight_decay: f64,
    pub warmup_steps: usize,
    pub schedule: Schedule,
    pub min_lr_ratio: f64,
    /// Clip the global gradient L2 norm to this value (null = no clipping).
    pub max_grad_norm: Option<f64>,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            lr: 1e-5,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.0,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            min_lr_ratio: 0.0,
            max_grad_norm: Some(1.0),
        }
    }
}

impl OptimizerConfig {
    pub fn validate(&self, at: &str, problems: &mut Vec<String>) {
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            problems.push(format!("{at}.lr must be positive, got {}", self.lr));
        }
        if self.betas.iter().any(|b| !(0.0..1.0).contains(b)) {
            problems.push(format!(
                "{at}.betas must be in [0, 1), got {:?}",
                self.betas
            ));
        }
        if self.eps <= 0.0 {
            problems.push(format!("{at}.eps must be positive, got {}", self.eps));
        }
        if self.weight_decay < 0.0 {
            problems.push(format!(
                "{at}.weight_decay must be >= 0, got {}",
                self.weight_decay
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            problems.push(format!(
                "{at}.min_lr_ratio must be in [0, 1], got {}",
                self.min_lr_ratio
            ));
        }
        if let Some(n) = self.max_grad_norm
            && n <= 0.0
        {
            problems.push(format!(
                "{at}.max_grad_norm must be positive or null, got {n}"
            ));
        }
    }

    /// Learning rate for optimizer step `step` (0-based) of `total_steps`.
    pub fn lr_at(&self, step: usize, total_steps: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Cosine => {
                let span = total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
                let min = self.lr * self.min_lr_ratio;
                min + (self.lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

/// Sums gradients of several micro-batches (each loss already scaled by its share of the batch).
///
/// The first micro-batch's gradients become the sum and later ones are added into it in place (f32
/// on the CPU; elsewhere a new sum each time): at the 0.5B shape a sum is 2 GB, and a new one per
/// micro-batch would hold three model-sized sets of gradients at once.
#[derive(Default)]
pub struct GradAccumulator {
    grads: BTreeMap<String, Tensor>,
}

impl GradAccumulator {
    /// Add one micro-batch's gradients. The store is taken, so its tensors are the accumulator's
    /// alone (every gradient in a store is a tensor made for it, by candle or by the tape, shared
    /// with nothing else): adding into them in place cannot change a tensor someone else holds.
    ///
    /// Runs on one of rayon's threads (`on_the_pool`): each sum is a parallel op, which a caller
    /// outside the pool would hand over one by one.
    ///
    /// Each gradient leaves the store as it is added: a bf16 model's are widened to f32 sums
    /// here, and its bf16 ones are freed one by one rather than all after the last (1 GB at the
    /// 0.5B shape).
    pub fn add(&mut self, vars: &[(String, Var)], mut grads: GradStore) -> Result<()> {
        on_the_pool(|| {
            for (name, var) in vars {
                if let Some(g) = grads.remove(var.as_tensor()) {
                    // Detached: candle's gradients keep the forward's graph (its activations)
                    // alive, which would hold every micro-batch's activations until the
                    // optimizer step.
                    let g = g.to_dtype(DType::F32)?.detach();
                    let sum = accumulate::summed(self.grads.remove(name), g)?;
                    self.grads.insert(name.clone(), sum);
                }
            }
            Ok(())
        })
    }

    pub fn is_empty(&self) -> bool {
        self.grads.is_empty()
    }

    /// The bytes the summed gradients hold.
    pub fn bytes(&self) -> usize {
        self.grads
            .values()
            .map(|g| g.elem_count() * g.dtype().size_in_bytes())
            .sum()
    }
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy)]
pub struct StepStats {
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: f64,
    pub lr: f64,
}

/// Decoupled-weight-decay Adam. Moments are kept in f32 whatever the parameter dtype, and so is
/// a master copy of every parameter stored in another dtype (bf16): the update is applied to the
/// master and the parameter is its rounding, so steps smaller than bf16's resolution accumulate
/// instead of vanishing. Host copies (offload) carry the masters; checkpoints do not (a resumed
/// optimizer starts its masters from the saved bf16 weights).
pub struct AdamW {
    cfg: OptimizerConfig,
    vars: Vec<(String, Var)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// f32 masters of the parameters that are not f32 (`None` for f32 ones).
    master: Vec<Option<Tensor>>,
    step: usize,
    total_steps: usize,
}

impl AdamW {
    pub fn new(vars: Vec<(String, Var)>, cfg: OptimizerConfig, total_steps: usize) -> Result<Self> {
        let zeros = |v: &Var| Tensor::zeros(v.shape(), DType::F32, v.device());
        let m = vars.iter().map(|(_, v)| zeros(v)).collect::<Result<_>>()?;
        let v = vars.iter().map(|(_, v)| zeros(v)).collect::<Result<_>>()?;
        let master = masters_of(&vars)?;
        Ok(AdamW {
            cfg,
            vars,
            m,
            v,
            master,
            step: 0,
            total_steps,
        })
    }

    /// An optimizer resumed after `step` AdamW steps from the moments [`AdamW::with_moments`]
    /// named, taken out of `tensors`, without the zero moments `new` would make and drop (the
    /// size of the model twice over, page-faulted in: up to 0.4 s at 30M parameters). Returns the
    /// moments' bytes too.
    pub fn resumed(
        vars: Vec<(String, Var)>,
        cfg: OptimizerConfig,
        total_steps: usize,
        step: usize,
        tensors: &mut HashMap<String, Tensor>,
    ) -> Result<(Self, u64)> {
        let mut opt = AdamW {
            cfg,
            vars,
            m: Vec::new(),
            v: Vec::new(),
            master: Vec::new(),
            step: 0,
            total_steps,
        };
        let bytes = opt.take_moments(step, tensors)?;
        Ok((opt, bytes))
    }

    /// [`AdamW::resumed`] from `moments` (the steps taken, and the tensors holding the moments)
    /// when given, else [`AdamW::new`].
    pub fn new_or_resumed(
        vars: Vec<(String, Var)>,
        cfg: OptimizerConfig,
        total_steps: usize,
        moments: Option<(usize, &mut HashMap<String, Tensor>)>,
    ) -> Result<Self> {
        match moments {
            Some((step, tensors)) => Ok(Self::resumed(vars, cfg, total_steps, step, tensors)?.0),
            None => Self::new(vars, cfg, total_steps),
        }
    }

    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    pub fn steps_taken(&self) -> usize {
        self.step
    }

    pub fn current_lr(&self) -> f64 {
        self.cfg.lr_at(self.step, self.total_steps)
    }

    /// Clip by global norm and apply one AdamW update; consumes the accumulated gradients.
    ///
    /// Runs on one of rayon's threads (`on_the_pool`): each tensor's kernels are parallel ops,
    /// which a caller outside the pool would hand over one by one.
    pub fn step(&mut self, acc: GradAccumulator) -> Result<StepStats> {
        on_the_pool(|| self.step_on_this_thread(acc))
    }

    fn step_on_this_thread(&mut self, acc: GradAccumulator) -> Result<StepStats> {
        let mut sq = 0f64;
        for g in acc.grads.values() {
            sq += if roll_cpu_kernels::applies(g) {
                adamw::sum_of_squares(g)?
            } else {
                g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64
            };
        }
        let grad_norm = sq.sqrt();
        let clip = match self.cfg.max_grad_norm {
            Some(max) if grad_norm > max => max / (grad_norm + 1e-6),
            _ => 1.0,
        };
        let lr = self.cfg.lr_at(self.step, self.total_steps);
        self.step += 1;
        if !grad_norm.is_finite() {
            // A NaN/inf gradient would destroy the weights: skip the update, report the norm.
            return Ok(StepStats { grad_norm, lr });
        }
        let [b1, b2] = self.cfg.betas;
        let t = self.step as i32;
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for (i, (name, var)) in self.vars.iter().enumerate() {
            let Some(g) = acc.grads.get(name) else {
                continue;
            };
            let decay = self.cfg.weight_decay > 0.0 && var.rank() >= 2;
            if adamw::applies(var.as_tensor(), &self.m[i], &self.v[i])
                && roll_cpu_kernels::applies(g)
            {
                // On the CPU in f32: two passes (`kernels/cpu/src/adamw.rs`), the same bits.
                let step = adamw::Step {
                    clip,
                    beta1: b1,
                    beta2: b2,
                    correction1: c1,
                    correction2: c2,
                    eps: self.cfg.eps,
                    lr,
                    weight_decay: decay.then_some(self.cfg.weight_decay),
                };
                let (m, v) = adamw::moments(&self.m[i], &self.v[i], g, &step)?;
                adamw::apply(var.as_tensor(), &m, &v, &step)?;
                (self.m[i], self.v[i]) = (m, v);
                continue;
            }
            // On a GPU: the step in one pass, in place (`kernels/cuda/src/adamw.cu`), on the
            // parameter or its f32 master.
            #[cfg(feature = "cuda")]
            {
                let theta = match &self.master[i] {
                    Some(master) => master.clone(),
                    None => var.as_tensor().clone(),
                };
                if roll_cuda_kernels::adamw::applies(&theta, g, &self.m[i], &self.v[i]) {
                    let step = roll_cuda_kernels::adamw::Step {
                        clip: clip as f32,
                        beta1: b1 as f32,
                        beta2: b2 as f32,
                        correction1: c1 as f32,
                        correction2: c2 as f32,
                        eps: self.cfg.eps as f32,
                        lr: lr as f32,
                        weight_decay: if decay {
                            self.cfg.weight_decay as f32
                        } else {
                            0.0
                        },
                    };
                    roll_cuda_kernels::adamw::step(&theta, g, &self.m[i], &self.v[i], &step)?;
                    if self.master[i].is_some() {
                        var.set(&theta.to_dtype(var.dtype())?)?;
                    }
                    continue;
                }
            }
            let g = (g * clip)?;
            self.m[i] = ((&self.m[i] * b1)? + (&g * (1.0 - b1))?)?;
            self.v[i] = ((&self.v[i] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let m_hat = (&self.m[i] / c1)?;
            let v_hat = (&self.v[i] / c2)?;
            let mut update = (m_hat / (v_hat.sqrt()? + self.cfg.eps)?)?;
            let theta = match &self.master[i] {
                Some(master) => master.clone(),
                None => var.as_tensor().to_dtype(DType::F32)?,
            };
            if decay {
                update = (update + (&theta * self.cfg.weight_decay)?)?;
            }
            let new = (theta - (update * lr)?)?;
            var.set(&new.to_dtype(var.dtype())?)?;
            if let Some(master) = &mut self.master[i] {
                *master = new;
            }
        }
        Ok(StepStats { grad_norm, lr })
    }

    /// The bytes of the optimizer's state: both moments, and the f32 masters of parameters
    /// stored in another dtype.
    pub fn state_bytes(&self) -> usize {
        self.named_moments()
            .iter()
            .map(|(_, t)| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }

    /// Moments and step count, for checkpoints.
    pub fn state(&self) -> (usize, Vec<(String, Tensor, Tensor)>) {
        let moments = self
            .vars
            .iter()
            .zip(self.m.iter().zip(&self.v))
            .map(|((n, _), (m, v))| (n.clone(), m.clone(), v.clone()))
            .collect();
        (self.step, moments)
    }

    /// Restore what [`AdamW::state`] returned; names and shapes must match.
    pub fn restore(
        &mut self,
        step: usize,
        moments: &BTreeMap<String, (Tensor, Tensor)>,
    ) -> Result<()> {
        let (mut ms, mut vs) = (Vec::new(), Vec::new());
        for (name, var) in &self.vars {
            let Some((m, v)) = moments.get(name) else {
                candle_core::bail!("optimizer state has no moments for '{name}'");
            };
            if m.dims() != var.dims() || v.dims() != var.dims() {
                candle_core::bail!(
                    "optimizer state for '{name}' has shape {:?}, expected {:?}",
                    m.dims(),
                    var.dims()
                );
            }
            ms.push(m.to_dtype(DType::F32)?);
            vs.push(v.to_dtype(DType::F32)?);
        }
        (self.m, self.v, self.step) = (ms, vs, step);
        if self.master.len() != self.vars.len() {
            self.master = masters_of(&self.vars)?;
        }
        Ok(())
    }

    /// `tensors` plus the moments, as `adam_m.<param>` / `adam_v.<param>`: one host copy holds a
    /// trainable role's whole state.
    pub fn with_moments(&self, mut tensors: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
        tensors.extend(self.named_moments());
        tensors
    }

    /// The moments under the names [`AdamW::with_moments`] gives them, sharing the optimizer's
    /// storage: what is written into them in place is the optimizer's state.
    pub fn named_moments(&self) -> Vec<(String, Tensor)> {
        let mut named = Vec::with_capacity(2 * self.vars.len());
        for (i, (name, _)) in self.vars.iter().enumerate() {
            let [m_name, v_name, master_name] = moment_names(name);
            named.push((m_name, self.m[i].clone()));
            named.push((v_name, self.v[i].clone()));
            if let Some(master) = self.master.get(i).and_then(Option::as_ref) {
                named.push((master_name, master.clone()));
            }
        }
        named
    }

    /// Take the moments [`AdamW::with_moments`] added out of `tensors` and restore them as the
    /// state after `step` AdamW steps; returns their bytes.
    fn take_moments(&mut self, step: usize, tensors: &mut HashMap<String, Tensor>) -> Result<u64> {
        let mut moments = BTreeMap::new();
        let mut masters = Vec::with_capacity(self.vars.len());
        let mut bytes = 0;
        for (name, var) in &self.vars {
            let [m_name, v_name, master_name] = moment_names(name);
            let (Some(m), Some(v)) = (tensors.remove(&m_name), tensors.remove(&v_name)) else {
                candle_core::bail!("the optimizer moments of '{name}' are missing");
            };
            bytes += ((m.elem_count() + v.elem_count()) * 4) as u64;
            moments.insert(name.clone(), (m, v));
            // A host copy made before the parameter's master existed has none: start it anew.
            let master = match tensors.remove(&master_name) {
                Some(t) if var.dtype() != DType::F32 => {
                    bytes += (t.elem_count() * 4) as u64;
                    Some(t.to_dtype(DType::F32)?)
                }
                _ => master_of(var)?,
            };
            masters.push(master);
        }
        self.master = masters;
        self.restore(step, &moments)?;
        Ok(bytes)
    }
}

/// What a host copy calls the moments and the master of parameter `name`
/// ([`AdamW::with_moments`]).
fn moment_names(name: &str) -> [String; 3] {
    MOMENT_PREFIXES.map(|prefix| format!("{prefix}{name}"))
}

/// The prefixes of [`moment_names`]: a host copy's other tensors are the weights.
pub const MOMENT_PREFIXES: [&str; 3] = ["adam_m.", "adam_v.", "adam_master."];

/// The f32 master of a parameter stored in another dtype; `None` for an f32 one.
fn master_of(var: &Var) -> Result<Option<Tensor>> {
    match var.dtype() {
        DType::F32 => Ok(None),
        _ => Ok(Some(var.as_tensor().to_dtype(DType::F32)?)),
    }
}

fn masters_of(vars: &[(String, Var)]) -> Result<Vec<Option<Tensor>>> {
    vars.iter().map(|(_, v)| master_of(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A host copy's moments resume an optimizer exactly as `restore` would, named as
    /// `with_moments` names them; a missing one is an error naming the parameter.
    #[test]
    fn resumed_takes_the_moments_a_host_copy_holds() {
        let dev = Device::Cpu;
        let var = |x: &[f32]| Var::from_slice(x, x.len(), &dev).unwrap();
        let vars = vec![
            ("a".to_string(), var(&[1., 2.])),
            ("b".to_string(), var(&[3.])),
        ];
        let mut first = AdamW::new(vars.clone(), OptimizerConfig::default(), 10).unwrap();
        let t = |x: &[f32]| Tensor::from_slice(x, x.len(), &dev).unwrap();
        let moments = BTreeMap::from([
            ("a".to_string(), (t(&[0.1, 0.2]), t(&[0.01, 0.02]))),
            ("b".to_string(), (t(&[0.3]), t(&[0.03]))),
        ]);
        first.restore(7, &moments).unwrap();
        let copy: HashMap<String, Tensor> = first.with_moments(vec![]).into_iter().collect();

        let (resumed, bytes) = AdamW::resumed(
            vars.clone(),
            OptimizerConfig::default(),
            10,
            7,
            &mut copy.clone(),
        )
        .unwrap();
        assert_eq!(bytes, 2 * 3 * 4);
        assert_eq!(resumed.steps_taken(), 7);
        let values = |opt: &AdamW| -> Vec<(String, Vec<f32>, Vec<f32>)> {
            let (_, moments) = opt.state();
            moments
                .iter()
                .map(|(n, m, v)| (n.clone(), m.to_vec1().unwrap(), v.to_vec1().unwrap()))
                .collect()
        };
        assert_eq!(values(&resumed), values(&first));

        let mut missing = copy;
        missing.remove("adam_v.b");
        let e = AdamW::resumed(vars, OptimizerConfig::default(), 10, 7, &mut missing)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("the optimizer moments of 'b' are missing"),
            "{e}"
        );
    }

    /// A bf16 parameter learns through its f32 master. Against a constant gradient of 1 each
    /// Adam step is lr * m_hat / (sqrt(v_hat) + eps) = lr (the bias corrections make both
    /// moments exactly 1), so ten steps of lr 1e-3 move the master from 1.0 to 0.990, stored in
    /// bf16 as 0.98828125 (253/256: bf16's spacing below 1 is 2^-8, and 0.990 is nearer 253/256
    /// than 254/256). Without the master each step's 0.999 rounds back to 1.0 and it never moves.
    /// The master travels in host copies (`adam_master.w`), so an offload does not lose it.
    #[test]
    fn a_bf16_parameter_learns_through_its_f32_master() {
        let dev = Device::Cpu;
        let w = Var::from_tensor(&Tensor::ones(2, DType::BF16, &dev).unwrap()).unwrap();
        let vars = vec![("w".to_string(), w.clone())];
        let cfg = OptimizerConfig {
            lr: 1e-3,
            ..OptimizerConfig::default()
        };
        let mut opt = AdamW::new(vars.clone(), cfg.clone(), 100).unwrap();
        for _ in 0..10 {
            let mut acc = GradAccumulator::default();
            let grads = w
                .to_dtype(DType::F32)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            acc.add(&vars, grads).unwrap();
            opt.step(acc).unwrap();
        }
        let param: Vec<f32> = w.to_dtype(DType::F32).unwrap().to_vec1().unwrap();
        assert_eq!(param, [0.988_281_25; 2]);
        let copy: HashMap<String, Tensor> = opt.with_moments(vec![]).into_iter().collect();
        let master: Vec<f32> = copy["adam_master.w"].to_vec1().unwrap();
        for m in &master {
            assert!((m - 0.990).abs() < 1e-5, "{m}");
        }
        // Resumed from the host copy, the optimizer keeps the master, not the rounded weight.
        let (resumed, bytes) = AdamW::resumed(vars, cfg, 100, 10, &mut copy.clone()).unwrap();
        assert_eq!(bytes, 3 * 2 * 4, "m, v and the master of two elements");
        let again: HashMap<String, Tensor> = resumed.with_moments(vec![]).into_iter().collect();
        let resumed_master: Vec<f32> = again["adam_master.w"].to_vec1().unwrap();
        assert_eq!(resumed_master, master);
    }

    #[test]
    fn warmup_then_cosine() {
        let cfg = OptimizerConfig {
            lr: 1.0,
            warmup_steps: 2,
            schedule: Schedule::Cosine,
            min_lr_ratio: 0.1,
            ..Default::default()
        };
        // warmup: (s+1)/2; then cosine over 10-2=8 steps from 1.0 to 0.1.
        assert!((cfg.lr_at(0, 10) - 0.5).abs() < 1e-12);
        assert!((cfg.lr_at(1, 10) - 1.0).abs() < 1e-12);
        assert!((cfg.lr_at(2, 10) - 1.0).abs() < 1e-12);
        // halfway (step 6 = 4 of 8): 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55
        assert!((cfg.lr_at(6, 10) - 0.55).abs() < 1e-12);
        assert!((cfg.lr_at(10, 10) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn first_adamw_step_moves_each_weight_by_lr_times_sign() {
        // With bias correction, step 1 gives m_hat = g, v_hat = g^2, so the update is lr * g/(|g|+eps).
        let w = Var::from_tensor(&Tensor::new(&[[1.0f32, -2.0]], &Device::Cpu).unwrap()).unwrap();
        let vars = vec![("w".to_string(), w.clone())];
        let cfg = OptimizerConfig {
            lr: 0.1,
            weight_decay: 0.5,
            max_grad_norm: None,
            ..Default::default()
        };
        let mut opt = AdamW::new(vars.clone(), cfg, 10).unwrap();
        // loss = sum(w * [3, -4]) => grad [3, -4]
        let loss = (w.as_tensor() * Tensor::new(&[[3.0f32, -4.0]], &Device::Cpu).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        let mut acc = GradAccumulator::default();
        acc.add(&vars, loss.backward().unwrap()).unwrap();
        let stats = opt.step(acc).unwrap();
        assert!((stats.grad_norm - 5.0).abs() < 1e-6);
        // w1 = 1 - 0.1 * (1 + 0.5 * 1) = 0.85; w2 = -2 - 0.1 * (-1 + 0.5 * -2) = -1.8
        let got = w.as_tensor().to_vec2::<f32>().unwrap();
        assert!(
            (got[0][0] - 0.85).abs() < 1e-6 && (got[0][1] - -1.8).abs() < 1e-6,
            "{got:?}"
        );
    }

    /// Three micro-batches: the sum is (g1 + g2) + g3 bit for bit, added in place into the first
    /// micro-batch's tensor, and the sums hold no graph.
    #[test]
    fn micro_batch_gradients_sum_in_place() {
        let dev = Device::Cpu;
        let w = Var::new(&[0.5f32, -1.5, 2.0], &dev).unwrap();
        let vars = vec![("w".to_string(), w.clone())];
        // loss_k = sum(w² * c_k): gradient 2 w c_k.
        let c = [[0.1f32, 0.2, 0.3], [1.7, -0.4, 0.9], [-2.2, 0.05, 1.1]];
        let grad_of = |k: usize| {
            let ck = Tensor::new(&c[k], &dev).unwrap();
            (w.as_tensor().sqr().unwrap() * ck)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap()
        };
        let g = |k: usize| {
            grad_of(k)
                .get(w.as_tensor())
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        let want: Vec<f32> = (0..3).map(|i| (g(0)[i] + g(1)[i]) + g(2)[i]).collect();
        let mut acc = GradAccumulator::default();
        for k in 0..3 {
            acc.add(&vars, grad_of(k)).unwrap();
        }
        let sum = &acc.grads["w"];
        assert!(!sum.track_op());
        assert_eq!(sum.to_vec1::<f32>().unwrap(), want);
    }

    /// The CPU's two-pass step (`roll_cpu_kernels::adamw`) against candle's elementwise ops, the
    /// optimizer's code before it (written out here): the same bits for a matrix (decayed) and a
    /// vector (not), over three steps with the gradient clipped.
    #[test]
    fn the_fused_step_gives_candles_bits() {
        let dev = Device::Cpu;
        let w = Var::from_tensor(&Tensor::randn(0f32, 1.0, (5, 7), &dev).unwrap()).unwrap();
        let b = Var::from_tensor(&Tensor::randn(0f32, 1.0, 7, &dev).unwrap()).unwrap();
        let vars = vec![("w".to_string(), w.clone()), ("b".to_string(), b.clone())];
        let cfg = OptimizerConfig {
            lr: 0.05,
            weight_decay: 0.1,
            max_grad_norm: Some(0.5),
            ..Default::default()
        };
        let mut opt = AdamW::new(vars.clone(), cfg.clone(), 10).unwrap();
        // The reference: each variable's value and moments, stepped by candle's ops.
        let mut refs: Vec<(Tensor, Tensor, Tensor)> = vars
            .iter()
            .map(|(_, v)| {
                let z = Tensor::zeros(v.shape(), DType::F32, &dev).unwrap();
                (v.as_tensor().copy().unwrap(), z.clone(), z)
            })
            .collect();
        for t in 1..=3 {
            let grads: Vec<Tensor> = vars
                .iter()
                .map(|(_, v)| Tensor::randn(0f32, 2.0, v.shape(), &dev).unwrap())
                .collect();
            let mut acc = GradAccumulator::default();
            for ((name, _), g) in vars.iter().zip(&grads) {
                acc.grads.insert(name.clone(), g.copy().unwrap());
            }
            let stats = opt.step(acc).unwrap();
            assert!(stats.grad_norm > 0.5, "the gradient is clipped");
            let clip = 0.5 / (stats.grad_norm + 1e-6);
            let [b1, b2] = cfg.betas;
            let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
            for (k, ((theta, m, v), g)) in refs.iter_mut().zip(&grads).enumerate() {
                let g = (g * clip).unwrap();
                *m = ((&*m * b1).unwrap() + (&g * (1.0 - b1)).unwrap()).unwrap();
                *v = ((&*v * b2).unwrap() + (g.sqr().unwrap() * (1.0 - b2)).unwrap()).unwrap();
                let m_hat = (&*m / c1).unwrap();
                let v_hat = (&*v / c2).unwrap();
                let mut update = (m_hat / (v_hat.sqrt().unwrap() + cfg.eps).unwrap()).unwrap();
                if k == 0 {
                    update = (update + (&*theta * cfg.weight_decay).unwrap()).unwrap();
                }
                *theta = (&*theta - (update * stats.lr).unwrap()).unwrap();
            }
            let bits = |t: &Tensor| -> Vec<u32> {
                let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                v.iter().map(|x| x.to_bits()).collect()
            };
            let (_, moments) = opt.state();
            for (k, (name, var)) in vars.iter().enumerate() {
                let (theta, m, v) = &refs[k];
                assert_eq!(bits(var.as_tensor()), bits(theta), "{name} at step {t}");
                assert_eq!(bits(&moments[k].1), bits(m), "m of {name} at step {t}");
                assert_eq!(bits(&moments[k].2), bits(v), "v of {name} at step {t}");
            }
        }
    }

    #[test]
    fn clipping_scales_the_gradient_to_max_norm() {
        let w = Var::from_tensor(&Tensor::new(&[0.0f32, 0.0], &Device::Cpu).unwrap()).unwrap();
        let vars = vec![("w".to_string(), w.clone())];
        let cfg = OptimizerConfig {
            lr: 1.0,
            max_grad_norm: Some(1.0),
            ..Default::default()
        };
        let mut opt = AdamW::new(vars.clone(), cfg, 1).unwrap();
        let loss = (w.as_tensor() * Tensor::new(&[30.0f32, 40.0], &Device::Cpu).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        let mut acc = GradAccumulator::default();
        acc.add(&vars, loss.backward().unwrap()).unwrap();
        let stats = opt.step(acc).unwrap();
        assert!((stats.grad_norm - 50.0).abs() < 1e-4);
        // clipped g = [30, 40] * 1/50 = [0.6, 0.8]; first moment m = (1 - 0.9) * g = [0.06, 0.08]
        let (_, moments) = opt.state();
        let m = moments[0].1.to_vec1::<f32>().unwrap();
        assert!(
            (m[0] - 0.06).abs() < 1e-6 && (m[1] - 0.08).abs() < 1e-6,
            "{m:?}"
        );
        // m_hat / sqrt(v_hat) = g / |g| = 1 per coordinate, so w = 0 - lr * 1 = -1
        let got = w.as_tensor().to_vec1::<f32>().unwrap();
        assert!(
            (got[0] + 1.0).abs() < 1e-5 && (got[1] + 1.0).abs() < 1e-5,
            "{got:?}"
        );
    }
}
