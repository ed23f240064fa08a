//! The critic's network: the policy's transformer with a value head, and its AdamW.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Tensor, Var};

use crate::model::{LoadError, LoadedModel, ModelConfig, Numerics, ParamStore, Tape, Transformer};
use crate::role::rows::{Rows, chunked};
use crate::role::{RunError, TensorContext};
use crate::train::batch::response_hidden;
use crate::train::checkpoint::{save_moments, save_vars};
use crate::train::{AdamW, OptimizerConfig, TrainBatch, ValueHead};

/// The critic's network: a transformer (initialised from the policy) with a value head, and the
/// AdamW over both.
pub struct CriticNet {
    pub model: Transformer,
    pub head: ValueHead,
    pub opt: AdamW,
}

impl CriticNet {
    /// values: (b, R) for the positions that predict response tokens; `tape` as in
    /// [`response_hidden`] (training).
    pub(crate) fn values(
        &self,
        tb: &TrainBatch,
        numerics: Numerics,
        tape: Option<&mut Tape>,
    ) -> candle_core::Result<Tensor> {
        let hidden = response_hidden(&self.model, tb, numerics, tape)?;
        self.head.forward(&hidden)? * &tb.response_mask
    }

    /// The value of every response token of `rows`, (n, width): the GAE baseline of a step.
    pub fn row_values(&self, pad_id: u32, rows: &Rows<'_>) -> candle_core::Result<Tensor> {
        chunked(&self.model, pad_id, rows, &|tb| {
            self.values(tb, Numerics::Fast, None)
        })
    }

    /// Network then value head: the optimizer's variables, in its order.
    pub fn vars(&self) -> Vec<(String, Var)> {
        critic_vars(&self.model, &self.head)
    }

    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        self.vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect()
    }

    /// Build from named tensors (network and `value_head.*`, as [`CriticNet::named_tensors`]
    /// gives them), with an optimizer for `updates` AdamW steps: fresh, or resumed from `moments`
    /// ([`AdamW::new_or_resumed`]). `origin` names the tensors' file in errors. The critic's
    /// variables take the tensors' storage (candle shares a variable's): pass copies of tensors
    /// that something else trains.
    pub fn from_tensors(
        config: &ModelConfig,
        mut tensors: BTreeMap<String, Tensor>,
        optimizer: &OptimizerConfig,
        updates: usize,
        origin: &Path,
        moments: Option<(usize, &mut HashMap<String, Tensor>)>,
    ) -> Result<CriticNet, String> {
        let mut take = |name: &str| {
            tensors
                .remove(name)
                .ok_or_else(|| format!("'{}' has no tensor '{name}'", origin.display()))
        };
        let (weight, bias) = (take("value_head.weight")?, take("value_head.bias")?);
        let hidden = config.hidden_size;
        if weight.dims() != [1, hidden] || bias.dims() != [1] {
            return Err(format!(
                "'{}': the value head has shapes {:?} and {:?}, expected [1, {hidden}] and [1]",
                origin.display(),
                weight.dims(),
                bias.dims()
            ));
        }
        let err = |e: candle_core::Error| format!("'{}': {e}", origin.display());
        let head = ValueHead {
            weight: Var::from_tensor(&weight).map_err(err)?,
            bias: Var::from_tensor(&bias).map_err(err)?,
        };
        let params = ParamStore::from_tensors(tensors).map_err(err)?;
        params
            .check_against(config, &origin.display().to_string())
            .map_err(|e| e.to_string())?;
        let model = Transformer::new(config.clone(), params).map_err(err)?;
        let vars = critic_vars(&model, &head);
        let opt = AdamW::new_or_resumed(vars, optimizer.clone(), updates, moments).map_err(err)?;
        Ok(CriticNet { model, head, opt })
    }

    /// Write the network and head to `weights`, the moments to `moments` (a checkpoint's files).
    pub fn save(&self, weights: &Path, moments: &Path) -> Result<(), LoadError> {
        save_vars(&self.vars(), weights)?;
        save_moments(&self.opt, moments)
    }
}

fn critic_vars(model: &Transformer, head: &ValueHead) -> Vec<(String, Var)> {
    let mut vars = model.params().named_vars();
    vars.extend(head.vars());
    vars
}

/// The policy's weights beside a zero value head: a critic as a run starts it.
pub(super) fn initial_tensors(policy: &LoadedModel) -> Result<Vec<(String, Tensor)>, RunError> {
    let device = policy.transformer.device();
    let head = ValueHead::new(policy.config().hidden_size, device).during("value head")?;
    let mut tensors = policy.transformer.params().named_tensors();
    tensors.extend(
        head.vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone())),
    );
    Ok(tensors)
}
