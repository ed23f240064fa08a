//! The actor_infer role in a worker process: a continuous-batching [`Engine`] over the worker's own
//! copy of the policy, driven one engine step per call so that a run generates exactly what it
//! would in the trainer's process.
//!
//! Weights arrive as host copies (safetensors files in shared memory) named in the calls, never
//! through the control channel. Offloading drops the weights, which the host copy named in the call
//! holds already (the parent writes it before every load and weight sync; the worker checks its
//! names, dtypes and shapes), so the worker's memory is freed until the reload without a write.

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::{Deserialize, Serialize};

use super::{InferCall as Request, InferReply as Reply};
use crate::config::Dtype;
use crate::model::lora::Adapter;
use crate::model::tokenizer::TokenizerFiles;
use crate::model::{ModelConfig, ParamStore, Transformer, load_model_dir};
use crate::role::Calls;
use crate::role::RoleCall;
use crate::rollout::{Completion, Engine, FinishReason};
use crate::scheduler::host_copy::{
    check_holds, overwrite_tensors, read_host_copy, read_host_copy_by_ipc,
    read_into_tensors_by_ipc, read_into_vars, tensor_bytes,
};
use crate::worker::serve::CallQueue;

/// What to load: config and tokenizer from `model_dir`, the weights from the host copy `weights`
/// (exactly the parent's tensors, in the run's dtype); under LoRA those are the frozen base, and
/// the adapter directory `adapter` is merged into them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferInit {
    pub model_dir: PathBuf,
    pub weights: PathBuf,
    #[serde(default)]
    pub adapter: Option<PathBuf>,
    pub dtype: Dtype,
    pub max_batch: usize,
    /// Requests continue earlier ones of the same id (agentic episodes): the engine keeps
    /// finished sequences' caches for them (`Engine::with_prefix_reuse`).
    #[serde(default)]
    pub multi_turn: bool,
    /// The device the worker computes on (`workers.devices`, the role's `device_mapping`).
    #[serde(default)]
    pub device: crate::device::DeviceSpec,
}

/// One change to the engine's work, applied in order before a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum InferOp {
    Submit(crate::rollout::Request),
    /// Cancel these request ids (queued or running; unknown ids are ignored).
    Abort(Vec<u64>),
}

/// A finished request as it travels back: log-probabilities as f32 bit patterns, so they arrive
/// exactly (the parent knows the prompt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireCompletion {
    pub id: u64,
    pub token_ids: Vec<u32>,
    pub logprob_bits: Vec<u32>,
    pub finish: FinishReason,
}

impl WireCompletion {
    pub fn of(c: Completion) -> WireCompletion {
        WireCompletion {
            id: c.id,
            token_ids: c.token_ids,
            logprob_bits: c.logprobs.iter().map(|l| l.to_bits()).collect(),
            finish: c.finish,
        }
    }

    pub fn into_completion(self, prompt_ids: Vec<u32>) -> Completion {
        Completion {
            id: self.id,
            prompt_ids,
            token_ids: self.token_ids,
            logprobs: self.logprob_bits.into_iter().map(f32::from_bits).collect(),
            finish: self.finish,
        }
    }
}

/// Everything but the weights: kept while offloaded.
struct Base {
    config: ModelConfig,
    tokenizer: TokenizerFiles,
    eos_ids: Vec<u32>,
    max_batch: usize,
    multi_turn: bool,
    device: Device,
}

/// Why the engine loop handed control back.
enum Leave {
    /// The host copy holds the weights, which are to be dropped.
    Offload,
    /// The parent is gone or said shutdown.
    Exit,
}

/// Serve actor_infer calls until the parent is gone.
pub fn serve(queue: CallQueue) {
    let calls = &Calls::<Request>::new(queue);
    let reply = &|id, result: Result<Reply, String>| calls.reply(id, result);
    let mut base: Option<Base> = None;
    let mut model: Option<Transformer> = None;
    loop {
        if let (Some(b), Some(m)) = (&base, &model) {
            match run_engine(b, m, calls, reply) {
                Leave::Offload => {
                    model = None;
                    crate::allocator::release_freed_memory();
                }
                Leave::Exit => return,
            }
            continue;
        }
        let Some((id, request)) = calls.recv() else {
            return;
        };
        match request {
            Request::Init(init) if base.is_none() => match load(&init) {
                Ok((b, m)) => {
                    reply(
                        id,
                        Ok(Reply::Loaded {
                            params: m.params().num_params(),
                        }),
                    );
                    (base, model) = (Some(b), Some(m));
                }
                Err(e) => reply(id, Err(e)),
            },
            Request::Reload { path, adapter, ipc } => match &base {
                Some(b) => match reload(b, &path, adapter.as_deref(), ipc.as_ref()) {
                    Ok((m, bytes)) => {
                        reply(id, Ok(Reply::Moved { bytes }));
                        model = Some(m);
                    }
                    Err(e) => reply(id, Err(e)),
                },
                None => reply(
                    id,
                    Err("nothing to reload: the model was never loaded".into()),
                ),
            },
            other => reply(
                id,
                Err(format!(
                    "cannot '{}' while the model is {}",
                    other.phase(),
                    if base.is_some() {
                        "offloaded"
                    } else {
                        "not loaded"
                    }
                )),
            ),
        }
    }
}

fn load(init: &InferInit) -> Result<(Base, Transformer), String> {
    let device = crate::device::open(init.device).map_err(|e| e.to_string())?;
    let loaded = load_model_dir(&init.model_dir, Some(init.dtype.candle()), &device)
        .map_err(|e| e.to_string())?;
    take_weights(
        loaded.transformer.params(),
        &init.weights,
        init.adapter.as_deref(),
    )?;
    let base = Base {
        config: loaded.config().clone(),
        tokenizer: loaded.tokenizer,
        eos_ids: loaded.eos_ids,
        max_batch: init.max_batch,
        multi_turn: init.multi_turn,
        device,
    };
    Ok((base, loaded.transformer))
}

/// Read the host copy at `path` into `params`; under LoRA it holds the frozen base, and the
/// adapter directory `adapter` is merged in (the operations the trainer merges with, so the
/// weights equal an in-process replica's bit for bit). Returns the bytes read.
fn take_weights(params: &ParamStore, path: &Path, adapter: Option<&Path>) -> Result<u64, String> {
    let bytes = read_into_vars(path, &params.named_vars()).map_err(|e| e.to_string())?;
    if let Some(dir) = adapter {
        merge_adapter(params, dir)?;
    }
    Ok(bytes)
}

/// Weight sync by CUDA IPC: `params` copied device to device out of the trainer's buffer `handle`
/// names, at the offsets of the host copy at `path` (which holds the same tensors). Returns the
/// bytes copied.
fn take_weights_by_ipc(
    params: &ParamStore,
    path: &Path,
    handle: &crate::device::IpcHandle,
) -> Result<u64, String> {
    let vars = params.named_vars();
    let targets = vars.iter().map(|(name, v)| (name.as_str(), v.as_tensor()));
    read_into_tensors_by_ipc(path, handle, targets).map_err(|e| e.to_string())
}

fn merge_adapter(params: &ParamStore, dir: &Path) -> Result<(), String> {
    let device = params
        .iter()
        .next()
        .map_or_else(crate::device::host, |(_, v)| v.device().clone());
    let adapter = Adapter::load(dir, &device).map_err(|e| e.to_string())?;
    let origin = dir.display().to_string();
    adapter
        .check_against(params, &origin)
        .map_err(|e| e.to_string())?;
    adapter
        .merge_into(params)
        .map_err(|e| format!("merging the adapter at {origin}: {e}"))
}

/// The weights back from the host copy at `path`, or with `ipc` from the trainer's GPU buffer
/// laid out as that copy (device to device; the copy gives names, dtypes, shapes and offsets).
fn reload(
    base: &Base,
    path: &Path,
    adapter: Option<&Path>,
    ipc: Option<&crate::device::IpcHandle>,
) -> Result<(Transformer, u64), String> {
    let tensors = match ipc {
        Some(handle) => read_host_copy_by_ipc(path, &base.device, handle),
        None => read_host_copy(path, &base.device),
    }
    .map_err(|e| e.to_string())?;
    let bytes = tensors.values().map(tensor_bytes).sum();
    let params = ParamStore::from_tensors(tensors.into_iter().collect())
        .map_err(|e| format!("host copy '{}': {e}", path.display()))?;
    params
        .check_against(&base.config, &path.display().to_string())
        .map_err(|e| e.to_string())?;
    if let Some(dir) = adapter {
        merge_adapter(&params, dir)?;
    }
    let model = Transformer::new(base.config.clone(), params).map_err(|e| e.to_string())?;
    Ok((model, bytes))
}

/// Answer calls with the model loaded, until an offload or the end.
fn run_engine(
    base: &Base,
    model: &Transformer,
    calls: &Calls<Request>,
    reply: &dyn Fn(u64, Result<Reply, String>),
) -> Leave {
    let detok = |ids: &[u32]| {
        base.tokenizer
            .tokenizer
            .decode(ids, true)
            .unwrap_or_default()
    };
    let mut engine =
        Engine::new(model, base.eos_ids.clone(), base.max_batch).with_detokenizer(&detok);
    if base.multi_turn {
        engine = engine.with_prefix_reuse();
    }
    loop {
        let Some((id, request)) = calls.recv() else {
            return Leave::Exit;
        };
        match request {
            Request::Step { ops } => reply(id, step(&mut engine, ops)),
            Request::SetWeights { path, adapter, ipc } => {
                let result = match ipc {
                    Some(handle) => take_weights_by_ipc(model.params(), &path, &handle),
                    None => take_weights(model.params(), &path, adapter.as_deref()),
                };
                engine.forget_prefixes();
                reply(id, result.map(|bytes| Reply::Moved { bytes }));
            }
            Request::Offload { path, write } => {
                if !engine.is_idle() {
                    let busy = engine.running() + engine.queued();
                    reply(
                        id,
                        Err(format!("cannot offload with {busy} requests in flight")),
                    );
                    continue;
                }
                // The copy at `path` holds the weights already (the parent writes it before each
                // load and weight sync), so the worker only lets go of them; after a sync by CUDA
                // IPC it is behind, and the worker writes them first.
                let tensors = model.params().named_tensors();
                let kept = if write {
                    overwrite_tensors(&path, &tensors)
                } else {
                    check_holds(&path, &tensors)
                };
                match kept {
                    Ok(bytes) => {
                        // The trainer frees its IPC buffer once this worker let go of it.
                        crate::device::ipc_close();
                        reply(id, Ok(Reply::Moved { bytes }));
                        return Leave::Offload;
                    }
                    Err(e) => reply(id, Err(e.to_string())),
                }
            }
            other => reply(
                id,
                Err(format!(
                    "cannot '{}' while the model is loaded",
                    other.phase()
                )),
            ),
        }
    }
}

fn step(engine: &mut Engine<'_>, ops: Vec<InferOp>) -> Result<Reply, String> {
    for op in ops {
        match op {
            InferOp::Submit(r) => engine.submit(r),
            InferOp::Abort(ids) => {
                let ids: std::collections::HashSet<u64> = ids.into_iter().collect();
                engine
                    .abort(|id| ids.contains(&id))
                    .map_err(|e| format!("cancelling requests: {e}"))?;
            }
        }
    }
    let finished = if engine.is_idle() {
        vec![]
    } else {
        engine.step().map_err(|e| format!("decode step: {e}"))?
    };
    Ok(Reply::Stepped {
        finished: finished.into_iter().map(WireCompletion::of).collect(),
        holding: engine.running() + engine.queued(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_cross_the_socket_bit_exactly() {
        let logprobs = vec![
            -0.0f32,
            f32::MIN_POSITIVE,
            -1.000_000_1,
            -17.25,
            f32::NEG_INFINITY,
        ];
        let c = Completion {
            id: 7,
            prompt_ids: vec![1, 2],
            token_ids: vec![3, 4, 5, 6, 1],
            logprobs: logprobs.clone(),
            finish: FinishReason::Eos,
        };
        let json = serde_json::to_string(&WireCompletion::of(c)).expect("encode");
        let back: WireCompletion = serde_json::from_str(&json).expect("decode");
        let c = back.into_completion(vec![1, 2]);
        let bits = |v: &[f32]| v.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&c.logprobs), bits(&logprobs));
        assert_eq!(
            (c.id, c.prompt_ids, c.token_ids),
            (7, vec![1, 2], vec![3, 4, 5, 6, 1])
        );
    }
}
