//! The KL reference behind one interface: a frozen policy copy in the trainer's process, or in a
//! worker process ([`RemoteReference`]).
//!
//! The worker's host copy (`reference.safetensors` in its shared-memory area) always holds the
//! reference's current weights: it is written at start and at every refresh before the worker is
//! told, and an offload is the worker writing it. A worker that dies or hangs is therefore
//! replaced from it and the call repeated — nothing is lost — and checkpoints copy it.

use std::path::Path;
use std::time::Duration;

use candle_core::{Device, Tensor};

use super::remote_worker::{RemoteWorker, moved, setup_err, worker_lost};
use super::rl_update::{Rows, response_logprobs};
use super::step_file::write_rows;
use super::{PipelineError, TensorContext};
use crate::config::{PlacementMode, RunConfig};
use crate::metrics::WorkerNotice;
use crate::model::{LoadError, ParamStore, Transformer};
use crate::scheduler::host_copy::{HostArea, read_tensors};
use crate::train::checkpoint::save_vars;
use crate::worker::reference::ReferenceInit;
use crate::worker::{Reply, Request as Call, Role, WorkerError};

/// A forward pass over a step's batch that takes longer than this is a hung worker.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);
const HOST_COPY: &str = "reference";
const ROWS: &str = "reference_rows";
const OUT: &str = "reference_logp";

pub enum Reference {
    Local(Transformer),
    Remote(RemoteReference),
}

pub struct RemoteReference {
    worker: RemoteWorker,
    area: HostArea,
    offloaded: bool,
}

impl Reference {
    /// `model` (the reference's weights) where the run places the role.
    pub fn start(run: &RunConfig, model: Transformer, pad_id: u32) -> Result<Self, PipelineError> {
        if run.workers.reference.mode != PlacementMode::Process {
            return Ok(Reference::Local(model));
        }
        let area = HostArea::new().map_err(|e| {
            PipelineError::Setup(format!(
                "creating the host-memory area for the reference: {e}"
            ))
        })?;
        area.write(HOST_COPY, &model.params().named_tensors())
            .map_err(setup_err)?;
        let init = ReferenceInit {
            model_config: model.config().to_hf_json(),
            pad_id,
            weights: area.path(HOST_COPY),
        };
        let call = Call::ReferenceInit(Box::new(init));
        let worker = RemoteWorker::start(Role::Reference, call, CALL_TIMEOUT)?;
        Ok(Reference::Remote(RemoteReference {
            worker,
            area,
            offloaded: false,
        }))
    }

    /// Log-probabilities of every response token of `rows`, (n, width), on `device`.
    pub fn logprobs(
        &mut self,
        pad_id: u32,
        rows: &Rows<'_>,
        temperature: f64,
        device: &Device,
    ) -> Result<Tensor, PipelineError> {
        match self {
            Reference::Local(model) => {
                response_logprobs(model, pad_id, rows, temperature).during("reference log-probs")
            }
            Reference::Remote(r) => r.logprobs(rows, temperature, device),
        }
    }

    /// `rl.kl.refresh_every`: the reference becomes `policy`. `offloaded_copy` is where an
    /// offloaded in-process reference keeps its weights (written instead of the tensors).
    pub fn refresh(
        &mut self,
        policy: &ParamStore,
        offloaded_copy: Option<(&HostArea, &str)>,
    ) -> Result<(), PipelineError> {
        match self {
            Reference::Local(model) => match offloaded_copy {
                Some((area, name)) => area
                    .write(name, &policy.named_tensors())
                    .map(drop)
                    .map_err(setup_err),
                None => model
                    .params()
                    .copy_from(policy)
                    .during("refreshing the KL reference"),
            },
            Reference::Remote(r) => {
                r.area
                    .write(HOST_COPY, &policy.named_tensors())
                    .map_err(setup_err)?;
                if !r.offloaded {
                    let reply = r.call(|s| Call::SetWeights {
                        path: s.area.path(HOST_COPY),
                    })?;
                    moved(Role::Reference, reply)?;
                }
                Ok(())
            }
        }
    }

    /// Write the reference's weights to `path` (a checkpoint's reference file).
    pub fn save(&self, path: &Path) -> Result<(), LoadError> {
        match self {
            Reference::Local(model) => save_vars(&model.params().named_vars(), path),
            Reference::Remote(r) => std::fs::copy(r.area.path(HOST_COPY), path)
                .map(drop)
                .map_err(|e| LoadError::io(path, e)),
        }
    }

    /// The in-process model, if the reference is in this process.
    pub fn local(&self) -> Option<&Transformer> {
        match self {
            Reference::Local(model) => Some(model),
            Reference::Remote(_) => None,
        }
    }

    pub fn remote(&mut self) -> Option<&mut RemoteReference> {
        match self {
            Reference::Local(_) => None,
            Reference::Remote(r) => Some(r),
        }
    }

    /// Workers replaced so far (a worker process only).
    pub fn restarts(&self) -> usize {
        match self {
            Reference::Local(_) => 0,
            Reference::Remote(r) => r.worker.restarts,
        }
    }

    pub fn drain_events(&mut self) -> Vec<(String, WorkerNotice, String)> {
        match self {
            Reference::Local(_) => vec![],
            Reference::Remote(r) => r.worker.drain_events(),
        }
    }

    pub fn shutdown(self) -> Vec<(String, WorkerNotice, String)> {
        match self {
            Reference::Local(_) => vec![],
            Reference::Remote(r) => {
                let RemoteReference { worker, area, .. } = r;
                let events = worker.shutdown();
                drop(area);
                events
            }
        }
    }
}

impl RemoteReference {
    /// A call that survives one lost worker: it is replaced from the host copy, and `make` builds
    /// the call again for the fresh one.
    fn call(&mut self, make: impl Fn(&Self) -> Call) -> Result<Reply, PipelineError> {
        match self.worker.call(make(self)) {
            Err(e) if worker_lost(&e) => {
                self.revive(&e)?;
                self.worker.call(make(self)).map_err(setup_err)
            }
            other => other.map_err(setup_err),
        }
    }

    fn revive(&mut self, lost: &WorkerError) -> Result<(), PipelineError> {
        let offloaded = self.offloaded.then(|| self.area.path(HOST_COPY));
        self.worker
            .revive(lost, "; weights reloaded from its host copy", offloaded)
    }

    fn logprobs(
        &mut self,
        rows: &Rows<'_>,
        temperature: f64,
        device: &Device,
    ) -> Result<Tensor, PipelineError> {
        write_rows(rows, temperature, &self.area.path(ROWS)).map_err(setup_err)?;
        let reply = self.call(|s| Call::ReferenceLogprobs {
            rows: s.area.path(ROWS),
            out: s.area.path(OUT),
        })?;
        moved(Role::Reference, reply)?;
        let out = self.area.path(OUT);
        let mut tensors = read_tensors(&out, device).map_err(setup_err)?;
        tensors.remove("ref_logp").ok_or_else(|| {
            PipelineError::Setup(format!(
                "the reference worker's output '{}' has no 'ref_logp'",
                out.display()
            ))
        })
    }

    /// Offload: the worker writes its weights to the host copy and frees them. Returns bytes.
    pub fn offload(&mut self) -> Result<u64, PipelineError> {
        let reply = self.call(|s| Call::Offload {
            path: s.area.path(HOST_COPY),
        })?;
        self.offloaded = true;
        moved(Role::Reference, reply)
    }

    pub fn reload(&mut self) -> Result<u64, PipelineError> {
        let reply = self.call(|s| Call::Reload {
            path: s.area.path(HOST_COPY),
        })?;
        self.offloaded = false;
        moved(Role::Reference, reply)
    }
}
