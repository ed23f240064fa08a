//! The reference role in a worker process: a frozen copy of a policy that scores response tokens
//! (the KL reference's log-probabilities). Requests and results travel as shared-memory files; a
//! refresh (`rl.kl.refresh_every`) is new weights read from the role's host copy, and offloading
//! writes the weights there and drops them.

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::{Deserialize, Serialize};

use super::ReferenceCall as Request;
use crate::model::{ModelConfig, Transformer};
use crate::role::Calls;
use crate::role::RoleCall;
use crate::role::remote::ModelReply as Reply;
use crate::role::rows::response_logprobs;
use crate::role::step_file::answer_rows;
use crate::role::train_serve::{model_state, reload_transformer};
use crate::scheduler::host_copy::{check_holds, read_into_vars};
use crate::worker::serve::CallQueue;

/// What to load: the model's shape, and its weights from the host copy `weights`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceInit {
    /// The model's config.json (Hugging Face layout).
    pub model_config: serde_json::Value,
    pub pad_id: u32,
    pub weights: PathBuf,
    /// The device the worker computes on (`workers.devices`, the role's `device_mapping`).
    #[serde(default)]
    pub device: crate::device::DeviceSpec,
}

struct Base {
    config: ModelConfig,
    pad_id: u32,
    device: Device,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Serve reference calls until the parent is gone.
pub fn serve(queue: CallQueue) {
    let calls = Calls::<Request>::new(queue);
    let mut base: Option<Base> = None;
    let mut model: Option<Transformer> = None;
    while let Some((id, request)) = calls.recv() {
        let phase = request.phase();
        let result = match (request, &base, &model) {
            (Request::Init(init), None, _) => load(&init).map(|(b, m)| {
                let params = m.params().num_params();
                (base, model) = (Some(b), Some(m));
                Reply::Loaded { params }
            }),
            (Request::Logprobs { rows, out }, Some(b), Some(m)) => {
                logprobs(b, m, &rows, &out).map(|bytes| Reply::Moved { bytes })
            }
            (Request::SetWeights { path }, Some(_), Some(m)) => {
                read_into_vars(&path, &m.params().named_vars())
                    .map(|bytes| Reply::Moved { bytes })
                    .map_err(err)
            }
            // The copy at `path` holds the weights already (the parent writes it before each
            // load and refresh), so the worker only lets go of them.
            (Request::Offload { path }, Some(_), Some(m)) => {
                check_holds(&path, &m.params().named_tensors())
                    .map_err(err)
                    .map(|bytes| {
                        model = None;
                        crate::allocator::release_freed_memory();
                        Reply::Moved { bytes }
                    })
            }
            (Request::Reload { path }, Some(b), None) => reload(b, &path).map(|(m, bytes)| {
                model = Some(m);
                Reply::Moved { bytes }
            }),
            (_, b, m) => Err(format!(
                "cannot '{phase}' while the reference is {}",
                model_state(b, m)
            )),
        };
        calls.reply(id, result);
    }
}

fn load(init: &ReferenceInit) -> Result<(Base, Transformer), String> {
    let config = ModelConfig::from_hf_json(&init.model_config.to_string(), "reference init")?;
    let base = Base {
        config,
        pad_id: init.pad_id,
        device: crate::device::open(init.device).map_err(err)?,
    };
    let (model, _) = reload(&base, &init.weights)?;
    Ok((base, model))
}

fn reload(base: &Base, path: &Path) -> Result<(Transformer, u64), String> {
    reload_transformer(&base.config, &base.device, path)
}

/// Score the rows in the file `rows`; write the (n, width) log-probs to `out` as `ref_logp`.
fn logprobs(base: &Base, model: &Transformer, rows: &Path, out: &Path) -> Result<u64, String> {
    answer_rows(rows, out, |rows, temperature| {
        let logp = response_logprobs(model, base.pad_id, rows, temperature).map_err(err)?;
        Ok(vec![("ref_logp".to_string(), logp)])
    })
}
