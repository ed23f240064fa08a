//! LoRA adapters in PEFT's format: an adapter directory (`adapter_config.json`,
//! `adapter_model.safetensors` with PEFT's tensor names) read and written, checked against its base
//! model, and merged into the base's weights (`roll-tui model merge`).
//!
//! A LoRA pair adapts one linear layer `W: (out, in)` as `W + s B A` with `A: (r, in)`,
//! `B: (out, r)` and `s = lora_alpha / r` (`lora_alpha / sqrt(r)` with `use_rslora`). PEFT names
//! the pair of the base weight `model.layers.0.self_attn.q_proj.weight`
//! `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` (and `lora_B`). Adapters of
//! the transformer's linear layers are read; what PEFT can also write and this cannot apply
//! (DoRA, trained biases, embedding adapters, per-module ranks or alphas, `modules_to_save`) is
//! refused with what was found, never dropped.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use serde_json::{Value, json};

use super::LoadError;
use super::params::ParamStore;

/// The linear layers of a decoder layer that an adapter may target.
pub const LINEAR_MODULES: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
const PREFIX: &str = "base_model.model.";

/// A LoRA adapter: its settings and, by base weight name, its `(A, B)` matrices.
#[derive(Debug, Clone)]
pub struct Adapter {
    pub rank: usize,
    pub alpha: f64,
    pub rslora: bool,
    pub dropout: f64,
    /// The module names the adapter targets (`q_proj`, …), as its config lists them.
    pub target_modules: Vec<String>,
    /// Base weight name (`model.layers.0.self_attn.q_proj.weight`) -> (A: (r, in), B: (out, r)).
    pub pairs: BTreeMap<String, (Tensor, Tensor)>,
}

fn bad(path: &Path, message: impl Into<String>) -> LoadError {
    LoadError::File {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// The base weight a PEFT tensor name adapts, and which matrix it is (`A` or `B`).
fn base_weight_of(name: &str) -> Option<(String, char)> {
    let rest = name.strip_prefix(PREFIX)?;
    for (suffix, which) in [
        (".lora_A.weight", 'A'),
        (".lora_B.weight", 'B'),
        (".lora_A.default.weight", 'A'),
        (".lora_B.default.weight", 'B'),
    ] {
        if let Some(module) = rest.strip_suffix(suffix) {
            let last = module.rsplit('.').next()?;
            if LINEAR_MODULES.contains(&last) {
                return Some((format!("{module}.weight"), which));
            }
        }
    }
    None
}

impl Adapter {
    /// `alpha / r`, or `alpha / sqrt(r)` for rsLoRA.
    pub fn scale(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// Read the adapter directory `dir`, its tensors onto `device` in f32.
    pub fn load(dir: &Path, device: &Device) -> Result<Adapter, LoadError> {
        let config_path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path).map_err(|e| {
            bad(
                &config_path,
                format!("cannot read the adapter's config ({e}); an adapter directory holds {CONFIG_FILE} and {WEIGHTS_FILE}"),
            )
        })?;
        let config: Value = serde_json::from_str(&text)
            .map_err(|e| bad(&config_path, format!("invalid JSON: {e}")))?;
        let at = |m: String| bad(&config_path, m);
        let field = |key: &str| config.get(key).filter(|v| !v.is_null());
        match field("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            other => {
                return Err(at(format!(
                    "peft_type is {}; only LORA adapters can be read",
                    other.map_or("missing".to_string(), |t| format!("'{t}'"))
                )));
            }
        }
        let rank = field("r")
            .and_then(Value::as_u64)
            .filter(|&r| r > 0)
            .ok_or_else(|| at("'r' must be a positive whole number".into()))?
            as usize;
        let alpha = field("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| at("'lora_alpha' must be a number".into()))?;
        let flag = |key: &str| field(key).and_then(Value::as_bool).unwrap_or(false);
        for (key, why) in [
            ("use_dora", "DoRA adapters (use_dora) are not supported"),
            (
                "fan_in_fan_out",
                "fan_in_fan_out adapters (Conv1D bases) do not fit these models",
            ),
        ] {
            if flag(key) {
                return Err(at(why.into()));
            }
        }
        if let Some(b) = field("bias")
            .and_then(Value::as_str)
            .filter(|b| *b != "none")
        {
            return Err(at(format!(
                "bias is '{b}': adapters that train biases are not supported (bias: none)"
            )));
        }
        for key in ["rank_pattern", "alpha_pattern"] {
            if field(key)
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
            {
                return Err(at(format!(
                    "'{key}' gives some modules their own rank or alpha; not supported"
                )));
            }
        }
        if field("modules_to_save").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
            return Err(at(
                "'modules_to_save' trains whole modules beside the adapter; not supported".into(),
            ));
        }
        let target_modules = match field("target_modules") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| at("'target_modules' must list module names".into()))?,
            Some(Value::String(s)) => vec![s.clone()],
            _ => vec![],
        };
        let weights_path = dir.join(WEIGHTS_FILE);
        let tensors = candle_core::safetensors::load(&weights_path, device).map_err(|e| {
            bad(
                &weights_path,
                format!("not a readable safetensors file: {e}"),
            )
        })?;
        let mut halves: BTreeMap<String, (Option<Tensor>, Option<Tensor>)> = BTreeMap::new();
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        for name in names {
            let Some((base, which)) = base_weight_of(name) else {
                return Err(bad(
                    &weights_path,
                    format!(
                        "tensor '{name}' is not the lora_A or lora_B matrix of a linear layer \
                         ({}); only those can be applied",
                        LINEAR_MODULES.join(", ")
                    ),
                ));
            };
            let t = tensors[name]
                .to_dtype(DType::F32)
                .map_err(|e| bad(&weights_path, format!("tensor '{name}': {e}")))?;
            let entry = halves.entry(base).or_default();
            match which {
                'A' => entry.0 = Some(t),
                _ => entry.1 = Some(t),
            }
        }
        let mut pairs = BTreeMap::new();
        for (base, (a, b)) in halves {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(bad(
                    &weights_path,
                    format!("the adapter of '{base}' has only one of its lora_A and lora_B"),
                ));
            };
            let (ar, br) = (a.dims(), b.dims());
            if ar.len() != 2 || br.len() != 2 || ar[0] != rank || br[1] != rank {
                return Err(bad(
                    &weights_path,
                    format!(
                        "the adapter of '{base}' has lora_A {ar:?} and lora_B {br:?}; rank {rank} \
                         needs ({rank}, in) and (out, {rank})"
                    ),
                ));
            }
            pairs.insert(base, (a, b));
        }
        if pairs.is_empty() {
            return Err(bad(&weights_path, "the adapter holds no LoRA matrices"));
        }
        Ok(Adapter {
            rank,
            alpha,
            rslora: flag("use_rslora"),
            dropout: field("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0),
            target_modules,
            pairs,
        })
    }

    /// Every pair's base weight exists in `base` with the shape its matrices adapt: `B A` must
    /// be `(out, in)` of that weight. A mismatch names the weight and both shapes.
    pub fn check_against(&self, base: &ParamStore, origin: &str) -> Result<(), LoadError> {
        let mut problems = vec![];
        for (name, (a, b)) in &self.pairs {
            let Some(w) = base.get(name) else {
                problems.push(format!(
                    "the adapter adapts '{name}', which the model has not"
                ));
                continue;
            };
            let (out, inp) = (b.dims()[0], a.dims()[1]);
            if w.dims() != [out, inp] {
                problems.push(format!(
                    "'{name}' is {:?} in the model but the adapter's B A is [{out}, {inp}] (an \
                     adapter for another base shape?)",
                    w.dims()
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(LoadError::Weights {
                origin: origin.to_string(),
                problems,
            })
        }
    }

    /// Add `s B A` to each adapted weight of `base`, in f32, stored back in the weight's dtype.
    pub fn merge_into(&self, base: &ParamStore) -> candle_core::Result<()> {
        let scale = self.scale();
        for (name, (a, b)) in &self.pairs {
            let Some(w) = base.get(name) else {
                candle_core::bail!("the model has no weight '{name}'");
            };
            let dtype = w.dtype();
            let delta = (b.to_device(w.device())?.matmul(&a.to_device(w.device())?)? * scale)?;
            let merged = (w.as_tensor().to_dtype(DType::F32)? + delta)?.to_dtype(dtype)?;
            w.set(&merged)?;
        }
        Ok(())
    }

    /// Write the adapter to `dir` as PEFT does; `base_model` is recorded as its base.
    pub fn save(&self, dir: &Path, base_model: &str) -> Result<(), LoadError> {
        std::fs::create_dir_all(dir).map_err(|e| bad(dir, e.to_string()))?;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for (name, (a, b)) in &self.pairs {
            let module = name.strip_suffix(".weight").unwrap_or(name);
            tensors.insert(format!("{PREFIX}{module}.lora_A.weight"), a.clone());
            tensors.insert(format!("{PREFIX}{module}.lora_B.weight"), b.clone());
        }
        let weights = dir.join(WEIGHTS_FILE);
        candle_core::safetensors::save(&tensors, &weights)
            .map_err(|e| bad(&weights, e.to_string()))?;
        let config = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": self.target_modules,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": self.rslora,
            "use_dora": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
            "rank_pattern": {},
            "alpha_pattern": {},
        });
        let path = dir.join(CONFIG_FILE);
        let text = serde_json::to_string_pretty(&config).map_err(|e| bad(&path, e.to_string()))?;
        std::fs::write(&path, text).map_err(|e| bad(&path, e.to_string()))
    }
}

/// `model.lora`: train a LoRA adapter of the policy instead of its weights.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSettings {
    /// `r`: the adapter matrices' inner size (PEFT's default, 8).
    #[serde(default = "eight")]
    pub rank: usize,
    /// `lora_alpha`: the update is scaled by `alpha / rank` (`alpha / sqrt(rank)` with `rslora`);
    /// PEFT's default, 8.
    #[serde(default = "eight_f")]
    pub alpha: f64,
    /// `lora_dropout`: the probability that a training forward drops an element of an adapted
    /// layer's input as the adapter reads it (PEFT's default, 0).
    #[serde(default)]
    pub dropout: f64,
    /// The linear layers to adapt (default: all of them, PEFT's `all-linear` for these models):
    /// a list, or as PEFT and ROLL write it a string — `all-linear` (PEFT), `all` (ROLL's
    /// `lora_target`) or names separated by commas (`q_proj,v_proj`).
    #[serde(default = "all_linear", deserialize_with = "target_modules")]
    pub target_modules: Vec<String>,
    #[serde(default)]
    pub rslora: bool,
}

fn eight() -> usize {
    8
}

fn eight_f() -> f64 {
    8.0
}

fn all_linear() -> Vec<String> {
    LINEAR_MODULES.iter().map(|m| m.to_string()).collect()
}

/// `target_modules` as a list, or as a string in PEFT's or ROLL's forms.
fn target_modules<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Targets {
        List(Vec<String>),
        Text(String),
    }
    let targets = <Targets as serde::Deserialize>::deserialize(d).map_err(|_| {
        serde::de::Error::custom(
            "target_modules must be a list of module names, 'all-linear', 'all' or names \
             separated by commas",
        )
    })?;
    Ok(match targets {
        Targets::List(list) => list,
        Targets::Text(t) if t == "all-linear" || t == "all" => all_linear(),
        Targets::Text(t) => t
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect(),
    })
}

/// PEFT's defaults: rank 8, alpha 8, no dropout, every linear layer.
impl Default for LoraSettings {
    fn default() -> Self {
        LoraSettings {
            rank: eight(),
            alpha: eight_f(),
            dropout: 0.0,
            target_modules: all_linear(),
            rslora: false,
        }
    }
}

impl LoraSettings {
    pub fn validate(&self, p: &mut Vec<String>) {
        if self.rank == 0 {
            p.push("model.lora.rank must be at least 1".into());
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            p.push(format!(
                "model.lora.alpha must be above 0, got {}",
                self.alpha
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            p.push(format!(
                "model.lora.dropout must be at least 0 and below 1, got {}",
                self.dropout
            ));
        }
        if self.target_modules.is_empty() {
            p.push("model.lora.target_modules must name at least one module".into());
        }
        for m in &self.target_modules {
            if !LINEAR_MODULES.contains(&m.as_str()) {
                p.push(format!(
                    "model.lora.target_modules: '{m}' matches no module of these models (the \
                     linear layers are {})",
                    LINEAR_MODULES.join(", ")
                ));
            }
        }
    }

    pub fn scale(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }
}

/// The base weight of module `module` (`q_proj`, …) of layer `layer`.
pub fn base_weight(layer: usize, module: &str) -> String {
    let block = match module {
        "gate_proj" | "up_proj" | "down_proj" => "mlp",
        _ => "self_attn",
    };
    format!("model.layers.{layer}.{block}.{module}.weight")
}

/// An adapter attached to a model: its matrices as variables (what trains), by base weight name.
/// The base stays frozen: the model computes with `W + s B A` and takes no gradient of `W`.
#[derive(Clone)]
pub struct LoraVars {
    pub settings: LoraSettings,
    /// What the adapter's config records as its base (a directory, or the model's init).
    pub base_model: String,
    pairs: BTreeMap<String, (Var, Var)>,
}

impl LoraVars {
    /// A fresh adapter of `settings` for the model of `params`, as PEFT initialises one: A
    /// uniform in ±1/sqrt(in) (Kaiming-uniform with a = sqrt(5)), B zero, so the adapted model
    /// starts as the base. Seeded.
    pub fn init(
        settings: &LoraSettings,
        layers: usize,
        params: &ParamStore,
        seed: u64,
        base_model: &str,
    ) -> candle_core::Result<LoraVars> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut pairs = BTreeMap::new();
        for layer in 0..layers {
            for module in &settings.target_modules {
                let name = base_weight(layer, module);
                let Some(w) = params.get(&name) else {
                    candle_core::bail!("the model has no weight '{name}' to adapt");
                };
                let (out, inp) = w.dims2()?;
                let bound = 1.0 / (inp as f64).sqrt();
                let a: Vec<f32> = (0..settings.rank * inp)
                    .map(|_| rng.random_range(-bound..bound) as f32)
                    .collect();
                let a = Tensor::from_vec(a, (settings.rank, inp), w.device())?;
                let b = Tensor::zeros((out, settings.rank), DType::F32, w.device())?;
                pairs.insert(name, (Var::from_tensor(&a)?, Var::from_tensor(&b)?));
            }
        }
        Ok(LoraVars {
            settings: settings.clone(),
            base_model: base_model.to_string(),
            pairs,
        })
    }

    /// The variables of a loaded adapter (checked against its base by the caller).
    pub fn from_adapter(
        adapter: &Adapter,
        settings: &LoraSettings,
        base_model: &str,
        device: &Device,
    ) -> candle_core::Result<LoraVars> {
        let mut pairs = BTreeMap::new();
        for (name, (a, b)) in &adapter.pairs {
            pairs.insert(
                name.clone(),
                (
                    Var::from_tensor(&a.to_device(device)?)?,
                    Var::from_tensor(&b.to_device(device)?)?,
                ),
            );
        }
        Ok(LoraVars {
            settings: settings.clone(),
            base_model: base_model.to_string(),
            pairs,
        })
    }

    /// The variables of the matrices `tensors` holds under their PEFT names (as
    /// [`Self::named_vars`] gives them: a trainer worker's host copies); every other tensor is
    /// left in `tensors`. The tensors become the variables without a copy where they are ones.
    pub fn take_named(
        settings: &LoraSettings,
        base_model: &str,
        tensors: &mut BTreeMap<String, Tensor>,
    ) -> candle_core::Result<LoraVars> {
        let names: Vec<String> = tensors
            .keys()
            .filter(|n| base_weight_of(n).is_some())
            .cloned()
            .collect();
        let mut halves: BTreeMap<String, (Option<Var>, Option<Var>)> = BTreeMap::new();
        for name in names {
            let Some((base, which)) = base_weight_of(&name) else {
                continue;
            };
            let Some(t) = tensors.remove(&name) else {
                continue;
            };
            let var = Var::from_tensor(&t)?;
            let entry = halves.entry(base).or_default();
            match which {
                'A' => entry.0 = Some(var),
                _ => entry.1 = Some(var),
            }
        }
        let mut pairs = BTreeMap::new();
        for (base, half) in halves {
            let (Some(a), Some(b)) = half else {
                candle_core::bail!("the adapter of '{base}' has only one of lora_A and lora_B");
            };
            pairs.insert(base, (a, b));
        }
        if pairs.is_empty() {
            candle_core::bail!("no LoRA matrices among the tensors");
        }
        Ok(LoraVars {
            settings: settings.clone(),
            base_model: base_model.to_string(),
            pairs,
        })
    }

    /// A frozen copy of the matrices as they are now (the reference of a stage that trains them).
    pub fn snapshot(&self) -> candle_core::Result<LoraVars> {
        let mut pairs = BTreeMap::new();
        for (name, (a, b)) in &self.pairs {
            pairs.insert(
                name.clone(),
                (
                    Var::from_tensor(&a.as_tensor().copy()?)?,
                    Var::from_tensor(&b.as_tensor().copy()?)?,
                ),
            );
        }
        Ok(LoraVars {
            settings: self.settings.clone(),
            base_model: self.base_model.clone(),
            pairs,
        })
    }

    /// Set the matrices to `other`'s (the same adapter's shape): a refreshed reference's adapter.
    pub fn copy_from(&self, other: &LoraVars) -> candle_core::Result<()> {
        for (name, (a, b)) in &self.pairs {
            let Some((oa, ob)) = other.pairs.get(name) else {
                candle_core::bail!("the adapter to copy has no matrices for '{name}'");
            };
            a.set(oa.as_tensor())?;
            b.set(ob.as_tensor())?;
        }
        Ok(())
    }

    /// The matrices as variables, by their PEFT names (what an optimizer of the adapter holds).
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        let mut vars = vec![];
        for (name, (a, b)) in &self.pairs {
            let module = name.strip_suffix(".weight").unwrap_or(name);
            vars.push((format!("{PREFIX}{module}.lora_A.weight"), a.clone()));
            vars.push((format!("{PREFIX}{module}.lora_B.weight"), b.clone()));
        }
        vars
    }

    /// `s B A` for the base weight `name`, in `dtype`, in candle's graph (the gradient reaches
    /// A and B); `None` when the weight is not adapted.
    pub fn delta(&self, name: &str, dtype: DType) -> Option<candle_core::Result<Tensor>> {
        let (a, b) = self.pairs.get(name)?;
        let scale = self.settings.scale();
        Some(
            b.as_tensor()
                .matmul(a.as_tensor())
                .and_then(|d| d * scale)
                .and_then(|d| d.to_dtype(dtype)),
        )
    }

    /// A's and B's variables for the base weight `name`, where it is adapted.
    pub fn factors(&self, name: &str) -> Option<(&Var, &Var)> {
        self.pairs.get(name).map(|(a, b)| (a, b))
    }

    /// The adapter as it is now, to save.
    pub fn to_adapter(&self) -> Adapter {
        Adapter {
            rank: self.settings.rank,
            alpha: self.settings.alpha,
            rslora: self.settings.rslora,
            dropout: self.settings.dropout,
            target_modules: self.settings.target_modules.clone(),
            pairs: self
                .pairs
                .iter()
                .map(|(n, (a, b))| (n.clone(), (a.as_tensor().clone(), b.as_tensor().clone())))
                .collect(),
        }
    }
}

#[cfg(test)]
#[path = "lora_tests.rs"]
mod tests;
