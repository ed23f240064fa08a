//! The teacher role of distillation: a frozen model of its own (`distill.teacher`), which gives,
//! for every response position of a batch, its k most likely next tokens and their log-probs
//! renormalised over those k (what ROLL's teacher sends the student). Only the top k leave the
//! role: (ids u32, log-probs f32) per position, 8 k bytes per token, never a vocabulary's row.
//!
//! The teacher must tokenize as the student does (the ids of one are the ids of the other):
//! [`Teacher::start`] compares the two vocabularies and refuses a mismatch, naming what differs.
//! A teacher whose head is wider than the student's (vocabularies padded to different sizes, as
//! Qwen2.5's are) offers only the student's ids. It runs in the trainer's process or in a worker
//! process of its own (`workers.teacher`), which a lost worker is replaced by (the teacher is
//! frozen: a fresh one loads what the lost one held).

pub mod serve;

use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

pub use serve::TeacherInit;

use super::remote::{ModelReply as Reply, RemoteWorker, moved, worker_lost};
use super::rows::{Rows, response_logprobs};
use super::step_file::write_rows;
use super::{Protocol, RoleCall, RoleError, TensorContext, WorkerNote, setup_err};
use crate::config::{PlacementMode, RunConfig};
use crate::model::tokenizer::{TokenizerFiles, load_tokenizer_dir};
use crate::model::{LoadedModel, Numerics, load_model_dir, read_model_config};
use crate::scheduler::host_copy::{HostArea, read_tensors};
use crate::train::TrainBatch;
use crate::train::batch::response_hidden;
use crate::worker::Role;

/// A batch's top k per response position: ids (n, R, k) u32, most likely first, and their
/// log-probs renormalised over the k (n, R, k) f32.
pub struct TopK {
    pub ids: Tensor,
    pub logp: Tensor,
}

/// The teacher's calls to its worker process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TeacherCall {
    /// Load the model.
    Init(Box<TeacherInit>),
    /// The top `k` of every response position of the rows file `rows` (its temperature divides
    /// the logits), written to `out` as `ids` and `logp`.
    TopK {
        rows: PathBuf,
        out: PathBuf,
        k: usize,
    },
    /// The log-probs of the response tokens of the rows file `rows` (its temperature divides
    /// the logits), written to `out` as `logp` (on-policy distillation).
    Logprobs { rows: PathBuf, out: PathBuf },
}

impl RoleCall for TeacherCall {
    fn phase(&self) -> &'static str {
        match self {
            TeacherCall::Init(_) => "load",
            TeacherCall::TopK { .. } => "teacher_topk",
            TeacherCall::Logprobs { .. } => "teacher_logprobs",
        }
    }
}

pub struct TeacherProtocol;

impl Protocol for TeacherProtocol {
    const ROLE: Role = Role::Teacher;
    type Request = TeacherCall;
    type Reply = Reply;
}

/// A batch's forward that takes longer than this is a hung worker.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);
const ROWS: &str = "teacher_rows";
const OUT: &str = "teacher_topk";

/// The teacher: in the trainer's process, or in a worker process of its own
/// (`workers.teacher.mode: process`, on its `device_mapping`).
pub enum Teacher {
    Local {
        model: Box<LoadedModel>,
        /// The ids it offers: those both heads have.
        vocab: usize,
    },
    Remote(Box<RemoteTeacher>),
}

pub struct RemoteTeacher {
    worker: RemoteWorker<TeacherProtocol>,
    area: HostArea,
    vocab: usize,
}

impl Teacher {
    /// The teacher at `dir` where the run places it, its tokenizer checked against the
    /// student's first (a mismatch is refused before any weight is read); `what` names it in
    /// errors (the config key that gave `dir`).
    pub fn start(
        run: &RunConfig,
        what: &str,
        dir: &Path,
        student: &LoadedModel,
    ) -> Result<Teacher, RoleError> {
        let at = |e: String| RoleError::Setup(format!("{what} '{}': {e}", dir.display()));
        if dir.join(crate::model::lora::CONFIG_FILE).is_file() && !dir.join("config.json").is_file()
        {
            return Err(at(format!(
                "a LoRA adapter without its base: merge it into its base first (`roll-tui model \
                 merge BASE --adapter {} --out DIR`) and name DIR",
                dir.display()
            )));
        }
        let config = read_model_config(dir).map_err(|e| at(e.to_string()))?;
        let tokenizer = load_tokenizer_dir(dir).map_err(|e| at(e.to_string()))?;
        same_vocabulary(&tokenizer, &student.tokenizer).map_err(at)?;
        let vocab = student.config().vocab_size.min(config.vocab_size);
        let dtype = run.model.dtype;
        if run.workers.teacher.mode != PlacementMode::Process {
            let device = crate::device::open(run.workers.trainer_device())?;
            let model = load_model_dir(dir, Some(dtype.candle()), &device)
                .map_err(|e| at(e.to_string()))?;
            return Ok(Teacher::Local {
                model: Box::new(model),
                vocab,
            });
        }
        let area = HostArea::new().map_err(|e| {
            RoleError::Setup(format!(
                "creating the host-memory area for the teacher: {e}"
            ))
        })?;
        let init = TeacherInit {
            model_dir: dir.to_path_buf(),
            dtype,
            vocab,
            device: run.workers.device_of(Role::Teacher, 0),
        };
        let worker = RemoteWorker::start(
            TeacherCall::Init(Box::new(init)),
            CALL_TIMEOUT,
            run.worker_threads(Role::Teacher),
        )?;
        Ok(Teacher::Remote(Box::new(RemoteTeacher {
            worker,
            area,
            vocab,
        })))
    }

    /// The ids the teacher can offer.
    pub fn vocab(&self) -> usize {
        match self {
            Teacher::Local { vocab, .. } => *vocab,
            Teacher::Remote(r) => r.vocab,
        }
    }

    /// The top `k` of every response position of `rows` under the teacher's logits divided by
    /// `temperature` (ROLL: `kd_temperature` times `teacher_temperature`), on `device`.
    pub fn top_k(
        &mut self,
        rows: &Rows<'_>,
        k: usize,
        temperature: f64,
        device: &Device,
    ) -> Result<TopK, RoleError> {
        let vocab = self.vocab();
        if k > vocab {
            return Err(RoleError::Setup(format!(
                "distill.logits_topk {k} is larger than the vocabulary ({vocab} ids)"
            )));
        }
        match self {
            Teacher::Local { model, vocab } => {
                let top = top_k_of_model(model, *vocab, rows, k, temperature)?;
                Ok(TopK {
                    ids: top.ids.to_device(device).during("teacher top-k")?,
                    logp: top.logp.to_device(device).during("teacher top-k")?,
                })
            }
            Teacher::Remote(r) => r.top_k(rows, k, temperature, device),
        }
    }

    /// The teacher's log-probs (n, width) of the response tokens of `rows` under its logits
    /// divided by `temperature`, on `device`.
    pub fn logprobs(
        &mut self,
        rows: &Rows<'_>,
        temperature: f64,
        device: &Device,
    ) -> Result<Tensor, RoleError> {
        match self {
            Teacher::Local { model, .. } => {
                response_logprobs(&model.transformer, model.pad_id, rows, temperature)
                    .and_then(|t| t.to_device(device))
                    .during("teacher log-probs")
            }
            Teacher::Remote(r) => {
                let mut out = r.ask(rows, temperature, device, |rows, out| {
                    TeacherCall::Logprobs { rows, out }
                })?;
                out.take("logp")
            }
        }
    }

    /// Worker events since the last call (none in-process).
    pub fn drain_events(&mut self) -> Vec<WorkerNote> {
        match self {
            Teacher::Local { .. } => vec![],
            Teacher::Remote(r) => r.worker.drain_events(),
        }
    }

    /// Stop the worker process, if any; the events not drained yet.
    pub fn shutdown(&mut self) -> Vec<WorkerNote> {
        match self {
            Teacher::Local { .. } => vec![],
            Teacher::Remote(r) => r.worker.shutdown(),
        }
    }
}

impl RemoteTeacher {
    /// The call, once more on a fresh worker if the first was lost: the teacher is frozen, so a
    /// replacement loads what the lost one held.
    fn call(&mut self, make: impl Fn(&Self) -> TeacherCall) -> Result<Reply, RoleError> {
        let call = make(self);
        match self.worker.call(call.clone()) {
            Err(e) if worker_lost(&e) => {
                let again = call.clone();
                self.worker
                    .revive(&e, "; the model loaded again", None, |_| again)?;
                self.worker.call(call).map_err(setup_err)
            }
            other => other.map_err(setup_err),
        }
    }

    fn top_k(
        &mut self,
        rows: &Rows<'_>,
        k: usize,
        temperature: f64,
        device: &Device,
    ) -> Result<TopK, RoleError> {
        let mut out = self.ask(rows, temperature, device, |rows, out| TeacherCall::TopK {
            rows,
            out,
            k,
        })?;
        Ok(TopK {
            ids: out.take("ids")?,
            logp: out.take("logp")?,
        })
    }

    /// Send `rows` to the worker with the call `make` builds from the rows file and the output
    /// file, and read the tensors it wrote, onto `device`.
    fn ask(
        &mut self,
        rows: &Rows<'_>,
        temperature: f64,
        device: &Device,
        make: impl Fn(PathBuf, PathBuf) -> TeacherCall,
    ) -> Result<WorkerOutput, RoleError> {
        write_rows(rows, temperature, &self.area.path(ROWS)).map_err(setup_err)?;
        let reply = self.call(|s| make(s.area.path(ROWS), s.area.path(OUT)))?;
        moved(Role::Teacher, reply)?;
        let path = self.area.path(OUT);
        let tensors = read_tensors(&path, device).map_err(setup_err)?;
        Ok(WorkerOutput { path, tensors })
    }
}

/// The tensors a teacher worker wrote, by name.
struct WorkerOutput {
    path: PathBuf,
    tensors: std::collections::HashMap<String, Tensor>,
}

impl WorkerOutput {
    fn take(&mut self, name: &str) -> Result<Tensor, RoleError> {
        self.tensors.remove(name).ok_or_else(|| {
            RoleError::Setup(format!(
                "the teacher worker's output '{}' has no '{name}'",
                self.path.display()
            ))
        })
    }
}

/// The top `k` of every response position of `rows` (padded to `rows.width`) under `model`'s
/// logits over its first `vocab` ids divided by `temperature`: what the teacher role computes,
/// here or in its worker.
pub fn top_k_of_model(
    model: &LoadedModel,
    vocab: usize,
    rows: &Rows<'_>,
    k: usize,
    temperature: f64,
) -> Result<TopK, RoleError> {
    let t = &model.transformer;
    let width = rows.width;
    let (mut ids, mut logp) = (vec![], vec![]);
    let pairs: Vec<(&[u32], &[u32])> = rows
        .prompts
        .iter()
        .zip(rows.responses)
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    for chunk in pairs.chunks(rows.micro.max(1)) {
        let tb = TrainBatch::new(chunk, model.pad_id, t.config().kv_groups(), t.device())
            .during("teacher batch")?;
        let hidden = response_hidden(t, &tb, Numerics::Fast, None).during("teacher forward")?;
        let logits = t
            .logits(&hidden, Numerics::Fast)
            .and_then(|l| l.narrow(2, 0, vocab))
            .during("teacher logits")?;
        // One row's (R, vocab) logits on the host at a time, not the chunk's.
        for i in 0..chunk.len() {
            let row = logits
                .get(i)
                .and_then(|l| l.to_dtype(DType::F32))
                .and_then(|l| l.to_vec2::<f32>())
                .during("teacher logits")?;
            let first = top_k_of(&row[0], k, temperature);
            for pos in 0..width {
                // Past this row's response (a shorter row, or a narrower chunk than the batch):
                // its first position's top k again, which the loss masks.
                let (i, l) = match row.get(pos) {
                    Some(at) if pos > 0 => top_k_of(at, k, temperature),
                    _ => first.clone(),
                };
                ids.extend(i);
                logp.extend(l);
            }
        }
    }
    let n = rows.prompts.len();
    let host = crate::device::host();
    Ok(TopK {
        ids: Tensor::from_vec(ids, (n, width, k), &host).during("teacher top-k")?,
        logp: Tensor::from_vec(logp, (n, width, k), &host).during("teacher top-k")?,
    })
}

/// The `k` largest of `logits / temperature`, largest first (ties: the lower id first), and their
/// log-softmax over the k.
pub fn top_k_of(logits: &[f32], k: usize, temperature: f64) -> (Vec<u32>, Vec<f32>) {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k < order.len() {
        order.select_nth_unstable_by(k, by_logit);
        order.truncate(k);
    }
    order.sort_by(by_logit);
    let scaled: Vec<f64> = order
        .iter()
        .map(|&i| logits[i as usize] as f64 / temperature)
        .collect();
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + scaled.iter().map(|s| (s - max).exp()).sum::<f64>().ln();
    (order, scaled.iter().map(|s| (s - lse) as f32).collect())
}

/// Whether the teacher tokenizes as the student does: the same token for every id.
fn same_vocabulary(teacher: &TokenizerFiles, student: &TokenizerFiles) -> Result<(), String> {
    let (t, s) = (
        teacher.tokenizer.get_vocab(true),
        student.tokenizer.get_vocab(true),
    );
    if t.len() != s.len() {
        return Err(format!(
            "its tokenizer has {} tokens and the student's {}: distillation needs one tokenizer",
            t.len(),
            s.len()
        ));
    }
    let mut differ: Vec<(&String, u32, Option<u32>)> = s
        .iter()
        .filter_map(|(token, &id)| {
            let theirs = t.get(token).copied();
            (theirs != Some(id)).then_some((token, id, theirs))
        })
        .collect();
    differ.sort_by_key(|(_, id, _)| *id);
    match differ.first() {
        None => Ok(()),
        Some((token, id, theirs)) => Err(format!(
            "its tokenizer differs from the student's in {} tokens, the first {token:?}: id {id} \
             for the student, {} for the teacher; distillation needs one tokenizer",
            differ.len(),
            theirs.map_or("none".to_string(), |i| i.to_string())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of unequal lengths in chunks narrower than the batch (a chunk's longest response is
    /// shorter than the batch's) give what one chunk of all rows gives, padding included.
    #[test]
    fn the_top_k_do_not_depend_on_how_rows_are_chunked() {
        let model = crate::model::hf_dir::tiny_test_model("0123456789", 32, 5);
        let prompts = vec![vec![3, 4], vec![5], vec![6, 7, 8]];
        let responses = vec![vec![9, 3], vec![4, 5, 6, 7, 8], vec![3]];
        let top = |micro| {
            let rows = Rows {
                prompts: &prompts,
                responses: &responses,
                micro,
                width: 5,
            };
            let t = top_k_of_model(&model, 13, &rows, 4, 1.5).expect("top k");
            (
                t.ids.to_vec3::<u32>().expect("ids"),
                t.logp.to_vec3::<f32>().expect("logp"),
            )
        };
        let (whole, chunked) = (top(3), top(1));
        assert_eq!(whole, chunked);
        assert_eq!(whole.0.len(), 3);
        assert_eq!(whole.0[2].len(), 5);
    }

    #[test]
    fn the_top_k_are_the_largest_first_and_renormalised_over_the_k() {
        let logits = [0.5f32, 3.0, -1.0, 3.0, 2.0];
        let (ids, logp) = top_k_of(&logits, 3, 2.0);
        // 3.0 twice (id 1 before id 3), then 2.0.
        assert_eq!(ids, [1, 3, 4]);
        // Over the three at temperature 2: 1.5, 1.5, 1.0.
        let lse = (2.0 * 1.5f64.exp() + 1.0f64.exp()).ln();
        let want = [1.5 - lse, 1.5 - lse, 1.0 - lse];
        for (g, w) in logp.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{logp:?}");
        }
        let (all, _) = top_k_of(&logits, 5, 1.0);
        assert_eq!(all, [1, 3, 4, 0, 2]);
    }
}
