//! Named, trainable parameters of a model, in a deterministic (sorted) order.
//!
//! Owns tensor naming (HF checkpoint names), seeded initialisation, and reading/writing safetensors
//! (single file or sharded with `model.safetensors.index.json`). It must not know the forward pass.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rayon::prelude::*;

use super::LoadError;
use super::config::ModelConfig;

/// How a parameter is initialised when a model is created from a config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    Normal(f64),
    Ones,
    Zeros,
}

/// Every tensor the architecture expects, with its shape and initialisation, in HF naming.
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>, Init)> {
    let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (q, kv) = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
    );
    let std = Init::Normal(0.02);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h], std)];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h], Init::Ones));
        out.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Init::Ones,
        ));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h], std));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h], std));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h], std));
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q], std));
        if cfg.arch.qkv_bias() {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q], Init::Zeros));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv], Init::Zeros));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv], Init::Zeros));
        }
        if cfg.arch.qk_norm() {
            out.push((
                format!("{p}.self_attn.q_norm.weight"),
                vec![cfg.head_dim],
                Init::Ones,
            ));
            out.push((
                format!("{p}.self_attn.k_norm.weight"),
                vec![cfg.head_dim],
                Init::Ones,
            ));
        }
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h], std));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![i, h], std));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![h, i], std));
    }
    out.push(("model.norm.weight".to_string(), vec![h], Init::Ones));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, h], std));
    }
    out
}

/// Trainable parameters by name. `Var`s so that gradients can be taken and optimisers can update them.
#[derive(Clone)]
pub struct ParamStore {
    vars: BTreeMap<String, Var>,
}

impl ParamStore {
    /// Seeded random initialisation (HF's `initializer_range` normal, ones for norms, zeros for biases).
    pub fn init(
        cfg: &ModelConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Self> {
        // `rand::rngs::StdRng` is this generator (rand 0.9), which can seek: the normals of a
        // tensor are drawn on every core, each chunk from its own place in the stream.
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let mut vars = BTreeMap::new();
        for (name, shape, init) in expected_tensors(cfg) {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = match init {
                Init::Ones => vec![1.0; n],
                Init::Zeros => vec![0.0; n],
                Init::Normal(std) => normals(&mut rng, n, std, NORMALS_CHUNK),
            };
            let t = Tensor::from_vec(data, shape, device)?.to_dtype(dtype)?;
            vars.insert(name, Var::from_tensor(&t)?);
        }
        Ok(ParamStore { vars })
    }

    pub fn from_tensors(tensors: BTreeMap<String, Tensor>) -> candle_core::Result<Self> {
        let vars = tensors
            .into_iter()
            .map(|(k, t)| Ok((k, Var::from_tensor(&t)?)))
            .collect::<candle_core::Result<_>>()?;
        Ok(ParamStore { vars })
    }

    pub fn get(&self, name: &str) -> Option<&Var> {
        self.vars.get(name)
    }

    /// The tensor for `name`; the name was checked against the architecture at load time.
    pub fn tensor(&self, name: &str) -> candle_core::Result<Tensor> {
        match self.vars.get(name) {
            Some(v) => Ok(v.as_tensor().clone()),
            None => candle_core::bail!("missing parameter '{name}'"),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Var)> {
        self.vars.iter()
    }

    /// (name, variable) pairs in sorted order, as optimizers take them.
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        self.vars
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect()
    }

    /// (name, tensor) pairs in sorted order, sharing storage with the variables (for host copies).
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        self.vars
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect()
    }

    pub fn vars(&self) -> Vec<Var> {
        self.vars.values().cloned().collect()
    }

    /// The bytes the parameters take, in their dtype.
    pub fn bytes(&self) -> usize {
        self.iter().map(|(_, v)| tensor_bytes(v) as usize).sum()
    }

    pub fn num_params(&self) -> usize {
        self.vars.values().map(|v| v.elem_count()).sum()
    }

    /// A deep copy whose tensors no longer share storage with `self` (e.g. a frozen reference model).
    pub fn deep_clone(&self) -> candle_core::Result<Self> {
        let vars = self
            .vars
            .iter()
            .map(|(k, v)| Ok((k.clone(), Var::from_tensor(&v.as_tensor().copy()?)?)))
            .collect::<candle_core::Result<_>>()?;
        Ok(ParamStore { vars })
    }

    /// Overwrite every parameter with the values of `other` (same names and shapes), in place.
    pub fn copy_from(&self, other: &ParamStore) -> candle_core::Result<()> {
        for (name, var) in &self.vars {
            let src = other.tensor(name)?;
            var.set(&src)?;
        }
        Ok(())
    }

    /// The same parameters on `device`: `self` again where they are there already, else copies.
    pub fn to_device(&self, device: &candle_core::Device) -> candle_core::Result<Self> {
        if self.vars.values().all(|v| v.device().same_device(device)) {
            return Ok(self.clone());
        }
        let vars = self
            .vars
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    Var::from_tensor(&v.as_tensor().to_device(device)?)?,
                ))
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(ParamStore { vars })
    }

    /// Cast every parameter, e.g. to load a bf16 checkpoint as f32 for training.
    pub fn to_dtype(&self, dtype: DType) -> candle_core::Result<Self> {
        let vars = self
            .vars
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    Var::from_tensor(&v.as_tensor().to_dtype(dtype)?)?,
                ))
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(ParamStore { vars })
    }

    /// Check names and shapes against the architecture; every problem is reported, naming `origin`.
    pub fn check_against(&self, cfg: &ModelConfig, origin: &str) -> Result<(), LoadError> {
        let mut problems = vec![];
        // (expected, found) of every differing dimension: the config field they point at.
        let mut differing: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        let expected = expected_tensors(cfg);
        for (name, shape, _) in &expected {
            match self.vars.get(name) {
                None => problems.push(format!("missing tensor '{name}'")),
                Some(v) if v.dims() != shape.as_slice() => {
                    if v.dims().len() == shape.len() {
                        for (e, f) in shape.iter().zip(v.dims()).filter(|(e, f)| e != f) {
                            *differing.entry((*e, *f)).or_default() += 1;
                        }
                    }
                    problems.push(format!(
                        "tensor '{name}' has shape {:?}, expected {:?}",
                        v.dims(),
                        shape
                    ))
                }
                Some(_) => {}
            }
        }
        // The most common difference first, in config.json's words: "hidden_size is 256 in
        // config.json, but the weights have 128 (37 tensors)".
        let mut by_count: Vec<((usize, usize), usize)> = differing.into_iter().collect();
        by_count.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        if let Some(((e, f), n)) = by_count.first() {
            let fields = [
                ("hidden_size", cfg.hidden_size),
                ("intermediate_size", cfg.intermediate_size),
                ("vocab_size", cfg.vocab_size),
                (
                    "num_attention_heads × head_dim",
                    cfg.num_attention_heads * cfg.head_dim,
                ),
                (
                    "num_key_value_heads × head_dim",
                    cfg.num_key_value_heads * cfg.head_dim,
                ),
            ];
            if let Some((field, _)) = fields.iter().find(|(_, v)| v == e) {
                problems.insert(
                    0,
                    format!(
                        "{field} is {e} in config.json, but the weights have {f} ({n} tensor{})",
                        crate::text::plural_s(*n)
                    ),
                );
            }
        }
        for name in self.vars.keys() {
            if !expected.iter().any(|(n, _, _)| n == name) && !is_ignorable(name, cfg) {
                problems.push(format!("unexpected tensor '{name}'"));
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

    /// Write all parameters as one safetensors file (tensors in `dtype`).
    pub fn save_safetensors(&self, path: &Path, dtype: DType) -> Result<(), LoadError> {
        let tensors: std::collections::HashMap<String, Tensor> = self
            .vars
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_tensor().to_dtype(dtype)?)))
            .collect::<candle_core::Result<_>>()
            .map_err(|e| LoadError::io(path, e))?;
        candle_core::safetensors::save(&tensors, path).map_err(|e| LoadError::io(path, e))
    }
}

/// A tied checkpoint may still carry a copy of `lm_head.weight` (HF writes it in some versions); rotary
/// inverse-frequency buffers are recomputed from the config.
fn is_ignorable(name: &str, cfg: &ModelConfig) -> bool {
    (cfg.tie_word_embeddings && name == "lm_head.weight") || name.ends_with("rotary_emb.inv_freq")
}

/// Read every tensor of the safetensors files in `dir`: `model.safetensors`, or the shards listed in
/// `model.safetensors.index.json`, or (failing both) every `*.safetensors` file.
pub fn read_safetensors_dir(
    dir: &Path,
    device: &Device,
) -> Result<BTreeMap<String, Tensor>, LoadError> {
    let files = safetensors_files(dir)?;
    let mut out = BTreeMap::new();
    for file in files {
        let tensors =
            candle_core::safetensors::load(&file, device).map_err(|e| LoadError::File {
                path: file.clone(),
                message: format!("not a readable safetensors file ({e})"),
            })?;
        for (name, t) in tensors {
            if out.insert(name.clone(), t).is_some() {
                return Err(LoadError::File {
                    path: file.clone(),
                    message: format!("tensor '{name}' appears in more than one shard"),
                });
            }
        }
    }
    Ok(out)
}

fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| LoadError::io(&index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| LoadError::File {
            path: index.clone(),
            message: format!("invalid JSON ({e})"),
        })?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| LoadError::File {
                path: index.clone(),
                message: "missing object 'weight_map'".into(),
            })?;
        let mut shards: Vec<String> = map
            .values()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        shards.sort();
        shards.dedup();
        let paths: Vec<PathBuf> = shards.iter().map(|s| dir.join(s)).collect();
        if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
            return Err(LoadError::File {
                path: missing.clone(),
                message: format!("shard listed in '{}' is missing", index.display()),
            });
        }
        return Ok(paths);
    }
    let mut any: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| LoadError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    any.sort();
    if any.is_empty() {
        return Err(LoadError::File {
            path: dir.to_path_buf(),
            message: "no model.safetensors, model.safetensors.index.json or *.safetensors file"
                .into(),
        });
    }
    Ok(any)
}

/// The bytes of a tensor's data, in its dtype.
pub fn tensor_bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

/// Standard normal sample (Box-Muller): candle's CPU `randn` cannot be seeded, and runs must repeat.
pub fn normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Words of the ChaCha stream one [`normal`] takes: two u64 draws of two 32-bit words each.
const WORDS_PER_NORMAL: u128 = 4;

/// Normals one thread draws in a row: a Qwen2.5-0.5B shape's 494M took ~26 s on one core.
const NORMALS_CHUNK: usize = 1 << 16;

/// `n` draws of `normal(rng) * std` as f32, with the values and the order of drawing them one by
/// one from `rng`, which is left where that would leave it. Chunks of `chunk` draws run on the
/// pool, each from a copy of `rng` moved to the chunk's first word.
fn normals(rng: &mut ChaCha12Rng, n: usize, std: f64, chunk: usize) -> Vec<f32> {
    let (start, chunk) = (rng.get_word_pos(), chunk.max(1));
    let base: &ChaCha12Rng = rng;
    let mut out = vec![0f32; n];
    out.par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(c, values)| {
            let mut r = base.clone();
            r.set_word_pos(start + WORDS_PER_NORMAL * (c * chunk) as u128);
            for v in values {
                *v = (normal(&mut r) * std) as f32;
            }
        });
    rng.set_word_pos(start + WORDS_PER_NORMAL * n as u128);
    out
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;

    use super::*;

    /// config.json edited to another hidden size (B7 of the new-user trial): one line says which
    /// field and what the weights have, a few tensors follow, and the rest are counted.
    #[test]
    fn a_config_that_does_not_fit_the_weights_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let model = crate::model::hf_dir::tiny_test_model("ab", 32, 1);
        crate::model::save_model_dir(dir.path(), &model).unwrap();
        let path = dir.path().join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cfg["hidden_size"] = 32.into();
        std::fs::write(&path, cfg.to_string()).unwrap();
        let err = crate::model::load_model_dir(dir.path(), None, &Device::Cpu)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let lines: Vec<&str> = err.lines().collect();
        assert!(
            lines[1].contains("hidden_size is 32 in config.json, but the weights have 16"),
            "{err}"
        );
        assert!(
            lines.len() <= 6 && lines.last().unwrap().contains("more"),
            "{err}"
        );
    }

    /// Drawn in chunks (a short last one too), from a stream already moved on, the normals are
    /// the one-by-one draws of `StdRng` with the same seed, bit for bit, and the stream goes on
    /// from the same place: models initialised before this change keep their weights.
    #[test]
    fn chunked_normals_are_the_sequential_draws() {
        let mut one = StdRng::seed_from_u64(7);
        let mut chunked = ChaCha12Rng::seed_from_u64(7);
        // A draw first, so that the chunks start mid-block.
        assert_eq!(normal(&mut one).to_bits(), normal(&mut chunked).to_bits());
        let want: Vec<f32> = (0..1000)
            .map(|_| (normal(&mut one) * 0.02) as f32)
            .collect();
        let got = normals(&mut chunked, 1000, 0.02, 37);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(one.random::<u64>(), chunked.random::<u64>());
        assert!(normals(&mut chunked, 0, 1.0, 37).is_empty());
        assert_eq!(one.random::<u64>(), chunked.random::<u64>());
    }
}
