//! The teacher role in a worker process: its frozen model, loaded from its own directory, gives
//! the top k of every response position (or the log-probs of the response tokens) of the rows
//! files it is sent. Requests and results travel as shared-memory files. Offloading writes the
//! weights to the host copy the first time (they never change) and lets go of them; a reload
//! reads them back from it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use candle_core::Device;

use super::{TeacherCall as Request, top_k_of_model};
use crate::config::Dtype;
use crate::model::{ModelConfig, Transformer, load_model_dir};
use crate::role::Calls;
use crate::role::RoleCall;
use crate::role::remote::ModelReply as Reply;
use crate::role::rows::response_logprobs;
use crate::role::step_file::answer_rows;
use crate::role::train_serve::{model_state, reload_transformer};
use crate::scheduler::host_copy::{check_holds, write_tensors};
use crate::worker::serve::CallQueue;

/// What to load: the model directory, in the run's dtype, on the worker's device; `vocab` is
/// how many ids it offers (those the student's head has too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeacherInit {
    pub model_dir: PathBuf,
    pub dtype: Dtype,
    pub vocab: usize,
    #[serde(default)]
    pub device: crate::device::DeviceSpec,
}

/// What stays while the weights are offloaded.
struct Base {
    config: ModelConfig,
    pad_id: u32,
    vocab: usize,
    device: Device,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Serve teacher calls until the parent is gone.
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
            (Request::TopK { rows, out, k }, Some(b), Some(m)) => {
                top_k(b, m, &rows, &out, k).map(|bytes| Reply::Moved { bytes })
            }
            (Request::Logprobs { rows, out }, Some(b), Some(m)) => {
                logprobs(b, m, &rows, &out).map(|bytes| Reply::Moved { bytes })
            }
            (Request::Offload { path }, Some(_), Some(m)) => {
                let tensors = m.params().named_tensors();
                // A replacement worker after a loss finds the copy its predecessor wrote.
                let written = if path.is_file() {
                    check_holds(&path, &tensors)
                } else {
                    write_tensors(&path, &tensors)
                };
                written.map_err(err).map(|bytes| {
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
                "cannot '{phase}' while the teacher is {}",
                model_state(b, m)
            )),
        };
        calls.reply(id, result);
    }
}

fn load(init: &TeacherInit) -> Result<(Base, Transformer), String> {
    let device = crate::device::open(init.device).map_err(err)?;
    let loaded =
        load_model_dir(&init.model_dir, Some(init.dtype.candle()), &device).map_err(err)?;
    let base = Base {
        config: loaded.config().clone(),
        pad_id: loaded.pad_id,
        vocab: init.vocab,
        device,
    };
    Ok((base, loaded.transformer))
}

fn reload(base: &Base, path: &Path) -> Result<(Transformer, u64), String> {
    reload_transformer(&base.config, &base.device, path)
}

/// The top k of the rows in the file `rows`, written to `out` as `ids` and `logp`.
fn top_k(
    base: &Base,
    model: &Transformer,
    rows: &Path,
    out: &Path,
    k: usize,
) -> Result<u64, String> {
    answer_rows(rows, out, |rows, temperature| {
        let top =
            top_k_of_model(model, base.pad_id, base.vocab, rows, k, temperature).map_err(err)?;
        Ok(vec![
            ("ids".to_string(), top.ids),
            ("logp".into(), top.logp),
        ])
    })
}

/// The log-probs of the response tokens of the rows in the file `rows`, written to `out` as
/// `logp`.
fn logprobs(base: &Base, model: &Transformer, rows: &Path, out: &Path) -> Result<u64, String> {
    answer_rows(rows, out, |rows, temperature| {
        let logp = response_logprobs(model, base.pad_id, rows, temperature).map_err(err)?;
        Ok(vec![("logp".to_string(), logp)])
    })
}
