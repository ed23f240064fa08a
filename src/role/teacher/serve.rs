//! The teacher role in a worker process: its frozen model, loaded from its own directory, gives
//! the top k of every response position of the rows files it is sent. Requests and results
//! travel as shared-memory files.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{TeacherCall as Request, top_k_of_model};
use crate::config::Dtype;
use crate::model::{LoadedModel, load_model_dir};
use crate::role::Calls;
use crate::role::RoleCall;
use crate::role::remote::ModelReply as Reply;
use crate::role::rows::response_logprobs;
use crate::role::step_file::answer_rows;
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

/// Serve teacher calls until the parent is gone.
pub fn serve(queue: CallQueue) {
    let calls = Calls::<Request>::new(queue);
    let mut model: Option<(LoadedModel, usize)> = None;
    while let Some((id, request)) = calls.recv() {
        let phase = request.phase();
        let result = match (request, &model) {
            (Request::Init(init), None) => load(&init).map(|m| {
                let params = m.transformer.params().num_params();
                model = Some((m, init.vocab));
                Reply::Loaded { params }
            }),
            (Request::TopK { rows, out, k }, Some((m, vocab))) => {
                top_k(m, *vocab, &rows, &out, k).map(|bytes| Reply::Moved { bytes })
            }
            (Request::Logprobs { rows, out }, Some((m, _))) => {
                logprobs(m, &rows, &out).map(|bytes| Reply::Moved { bytes })
            }
            (_, m) => Err(format!(
                "cannot '{phase}' while the teacher is {}",
                if m.is_some() { "loaded" } else { "not loaded" }
            )),
        };
        calls.reply(id, result);
    }
}

fn load(init: &TeacherInit) -> Result<LoadedModel, String> {
    let device = crate::device::open(init.device).map_err(|e| e.to_string())?;
    load_model_dir(&init.model_dir, Some(init.dtype.candle()), &device).map_err(|e| e.to_string())
}

/// The top k of the rows in the file `rows`, written to `out` as `ids` and `logp`.
fn top_k(
    model: &LoadedModel,
    vocab: usize,
    rows: &Path,
    out: &Path,
    k: usize,
) -> Result<u64, String> {
    answer_rows(rows, out, |rows, temperature| {
        let top = top_k_of_model(model, vocab, rows, k, temperature).map_err(|e| e.to_string())?;
        Ok(vec![
            ("ids".to_string(), top.ids),
            ("logp".into(), top.logp),
        ])
    })
}

/// The log-probs of the response tokens of the rows in the file `rows`, written to `out` as
/// `logp`.
fn logprobs(model: &LoadedModel, rows: &Path, out: &Path) -> Result<u64, String> {
    answer_rows(rows, out, |rows, temperature| {
        let logp = response_logprobs(&model.transformer, model.pad_id, rows, temperature)
            .map_err(|e| e.to_string())?;
        Ok(vec![("logp".to_string(), logp)])
    })
}
