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
//!
//! Like every model role it time-shares its devices: offloading writes its weights to its host
//! copy once (they never change) and lets go of them; a reload reads them back.

pub mod serve;
pub mod top_k;

use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

pub use serve::TeacherInit;
pub use top_k::{TopK, top_k_of, top_k_of_model};

use super::remote::{ModelReply as Reply, RemoteWorker, moved, worker_lost};
use super::rows::{Rows, response_logprobs};
use super::step_file::write_rows;
use super::{
    HostCopy, Protocol, ResidentRole, RoleCall, RunError, TensorContext, WorkerNote, setup_err,
};
use crate::config::{PlacementMode, RunConfig};
use crate::model::tokenizer::{TokenizerFiles, load_tokenizer_dir};
use crate::model::{LoadedModel, ModelConfig, load_model_dir, read_model_config};
use crate::scheduler::host_copy::{HostArea, check_holds, read_tensors};
use crate::worker::Role;

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
    /// Make sure the host copy at `path` holds the weights (writing it the first time), then let
    /// go of them.
    Offload { path: PathBuf },
    /// Read the weights back from the host copy at `path`.
    Reload { path: PathBuf },
}

impl RoleCall for TeacherCall {
    fn phase(&self) -> &'static str {
        match self {
            TeacherCall::Init(_) => "load",
            TeacherCall::TopK { .. } => "teacher_topk",
            TeacherCall::Logprobs { .. } => "teacher_logprobs",
            TeacherCall::Offload { .. } => "offload",
            TeacherCall::Reload { .. } => "reload",
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
const HOST_COPY: &str = "teacher_weights";

/// The teacher: in the trainer's process, or in a worker process of its own
/// (`workers.teacher.mode: process`, on its `device_mapping`).
pub enum Teacher {
    Local {
        model: Box<LoadedModel>,
        /// The ids it offers: those both heads have.
        vocab: usize,
        /// Whether its host copy holds its weights (written at the first offload).
        copied: bool,
    },
    Remote(Box<RemoteTeacher>),
}

pub struct RemoteTeacher {
    worker: RemoteWorker<TeacherProtocol>,
    area: HostArea,
    vocab: usize,
    /// Whether the worker let go of its weights (they are in `area`'s host copy).
    offloaded: bool,
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
    ) -> Result<Teacher, RunError> {
        let config = shape_of(what, dir).map_err(RunError::Setup)?;
        let at = |e: String| RunError::Setup(format!("{what} '{}': {e}", dir.display()));
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
                copied: false,
            });
        }
        let area = HostArea::new().map_err(|e| {
            RunError::Setup(format!(
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
            (area.dir(), &[]),
        )?;
        Ok(Teacher::Remote(Box::new(RemoteTeacher {
            worker,
            area,
            vocab,
            offloaded: false,
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
    ) -> Result<TopK, RunError> {
        let vocab = self.vocab();
        if k > vocab {
            return Err(RunError::Setup(format!(
                "distill.logits_topk {k} is larger than the vocabulary ({vocab} ids)"
            )));
        }
        match self {
            Teacher::Local { model, vocab, .. } => {
                let top = top_k_of_model(
                    &model.transformer,
                    model.pad_id,
                    *vocab,
                    rows,
                    k,
                    temperature,
                )?;
                Ok(TopK {
                    ids: top.ids.to_device(device).during("teacher top-k")?,
                    logp: top.logp.to_device(device).during("teacher top-k")?,
                })
            }
            Teacher::Remote(r) => r.top_k(rows, k, temperature, device),
        }
    }

    /// The teacher's log-probs (n, width) of the response tokens of `rows` under its logits
    /// divided by `temperature`, on `device`. They are normalised over the teacher's whole head
    /// (a head padded wider than the tokenizer gives its padding ids next to no mass); a token
    /// past the ids both heads have (a student head padded wider, sampling one of its padding
    /// ids) is refused, naming it, since the teacher has no log-prob for it.
    pub fn logprobs(
        &mut self,
        rows: &Rows<'_>,
        temperature: f64,
        device: &Device,
    ) -> Result<Tensor, RunError> {
        let vocab = self.vocab();
        if let Some(id) = rows
            .responses
            .iter()
            .flatten()
            .find(|&&id| id as usize >= vocab)
        {
            return Err(RunError::Setup(format!(
                "on-policy distillation: a sampled response holds token id {id}, past the {vocab} \
                 ids the teacher's and the student's heads share (the student sampled one of its \
                 head's padding ids): the teacher cannot score it"
            )));
        }
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

    /// Offload to the host copy `name` of `area` (an in-process teacher's; a worker uses its
    /// own): the weights are written there the first time only, since they never change.
    /// Returns the bytes the copy holds.
    pub fn offload_to(&mut self, area: &HostArea, name: &str) -> Result<u64, RunError> {
        match self {
            Teacher::Local { model, copied, .. } => {
                let tensors = model.transformer.params().named_tensors();
                let bytes = if *copied {
                    check_holds(&area.path(name), &tensors)
                } else {
                    area.write(name, &tensors)
                }
                .map_err(setup_err)?;
                *copied = true;
                Ok(bytes)
            }
            Teacher::Remote(r) => {
                let reply = r.call(|s| TeacherCall::Offload {
                    path: s.area.path(HOST_COPY),
                })?;
                r.offloaded = true;
                moved(Role::Teacher, reply)
            }
        }
    }

    /// Bring the weights back from the host copy `name` of `area` (or the worker's own).
    pub fn reload_from(&mut self, area: &HostArea, name: &str) -> Result<u64, RunError> {
        match self {
            Teacher::Local { model, .. } => area
                .read_into(name, &model.transformer.params().named_vars())
                .map_err(setup_err),
            Teacher::Remote(r) => {
                let reply = r.call(|s| TeacherCall::Reload {
                    path: s.area.path(HOST_COPY),
                })?;
                r.offloaded = false;
                moved(Role::Teacher, reply)
            }
        }
    }
}

/// A lone teacher (a distillation stage's) keeps its host copy under the role's name.
impl ResidentRole for Teacher {
    fn role(&self) -> Role {
        Role::Teacher
    }

    fn offload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        self.offload_to(host.area, Role::Teacher.as_str())
    }

    fn reload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        self.reload_from(host.area, Role::Teacher.as_str())
    }

    fn in_worker_process(&self) -> bool {
        matches!(self, Teacher::Remote(_))
    }

    fn drain_events(&mut self) -> Vec<WorkerNote> {
        match self {
            Teacher::Local { .. } => vec![],
            Teacher::Remote(r) => r.worker.drain_events(),
        }
    }

    fn restarts(&self) -> usize {
        match self {
            Teacher::Local { .. } => 0,
            Teacher::Remote(r) => r.worker.restarts,
        }
    }

    fn shutdown(&mut self) -> Vec<WorkerNote> {
        match self {
            Teacher::Local { .. } => vec![],
            Teacher::Remote(r) => r.worker.shutdown(),
        }
    }
}

impl RemoteTeacher {
    /// The call, once more on a fresh worker if the first was lost: the teacher is frozen, so a
    /// replacement loads what the lost one held (and lets go of it again if it was offloaded).
    fn call(&mut self, make: impl Fn(&Self) -> TeacherCall) -> Result<Reply, RunError> {
        match self.worker.call(make(self)) {
            Err(e) if worker_lost(&e) => {
                let offloaded = self.offloaded.then(|| self.area.path(HOST_COPY));
                self.worker
                    .revive(&e, "; the model loaded again", offloaded, |path| {
                        TeacherCall::Offload { path }
                    })?;
                self.worker.call(make(self)).map_err(setup_err)
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
    ) -> Result<TopK, RunError> {
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
    ) -> Result<WorkerOutput, RunError> {
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
    fn take(&mut self, name: &str) -> Result<Tensor, RunError> {
        self.tensors.remove(name).ok_or_else(|| {
            RunError::Setup(format!(
                "the teacher worker's output '{}' has no '{name}'",
                self.path.display()
            ))
        })
    }
}

/// The shape of the teacher at `dir` (its config.json), or why it is not a model; `what` names it
/// (the config key that gave `dir`).
pub fn shape_of(what: &str, dir: &Path) -> Result<ModelConfig, String> {
    let at = |e: String| format!("{what} '{}': {e}", dir.display());
    if dir.join(crate::model::lora::CONFIG_FILE).is_file() && !dir.join("config.json").is_file() {
        return Err(at(format!(
            "a LoRA adapter without its base: merge it into its base first (`roll-tui model \
             merge BASE --adapter {} --out DIR`) and name DIR",
            dir.display()
        )));
    }
    read_model_config(dir).map_err(|e| at(e.to_string()))
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

    /// A sampled id past the ids both heads share has no teacher log-prob: refused, naming it,
    /// where an id inside them is scored.
    #[test]
    fn a_token_past_the_shared_ids_is_refused_not_scored() {
        let model = crate::model::hf_dir::tiny_test_model("0123456789", 32, 5);
        let mut teacher = Teacher::Local {
            model: Box::new(model),
            vocab: 8,
            copied: false,
        };
        let prompts = vec![vec![3, 4]];
        let score = |teacher: &mut Teacher, response: Vec<u32>| {
            let responses = vec![response];
            let rows = Rows {
                prompts: &prompts,
                responses: &responses,
                micro: 1,
                width: 2,
            };
            teacher.logprobs(&rows, 1.0, &crate::device::host())
        };
        let logp = score(&mut teacher, vec![5, 7]).expect("ids 5 and 7 are shared");
        assert_eq!(logp.dims(), [1, 2]);
        let e = score(&mut teacher, vec![5, 8]).expect_err("id 8 is past the shared 8");
        assert!(e.to_string().contains("token id 8, past the 8 ids"), "{e}");
    }
}
