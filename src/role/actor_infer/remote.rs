//! actor_infer in a worker process (`workers.actor_infer.mode: process`), seen from the trainer.
//!
//! The worker runs one engine step per call; requests and cancellations queued here travel with
//! the next step, so the worker generates exactly what an in-process engine would. Every request
//! sent and neither finished nor cancelled is remembered: if the worker dies or hangs, a fresh one
//! is started from the host copy and those requests are submitted again with their own seeds —
//! nothing is lost, and nothing finished is generated twice.
//!
//! The host copy (`actor_infer.safetensors` in this run's shared-memory area) holds the current
//! weights whenever something may read it: weight sync through it writes it before telling the
//! worker, so an offload is the worker letting go of its weights, without writing them, and a
//! restarted worker loads the right version, whatever it was doing. Under LoRA the host copy holds
//! the frozen base, written once, and weight sync writes only the adapter (`actor_infer-adapter/`,
//! PEFT's format), which the worker merges into the base whenever it takes weights.
//!
//! When the trainer and the worker compute on one GPU, weight sync goes by CUDA IPC instead: the
//! trainer copies the weights into a GPU buffer of its own laid out as the host copy, and the
//! worker copies them out of it device to device, at once if it is resident, else at its reload
//! (time-sharing: the sync happens while training has the GPU). The host copy is then behind: an
//! offload asks the worker to write its weights to it first (after which the buffer is freed for
//! training), and a replacement worker finds it brought up to date from the buffer. Which way sync
//! goes is decided at the start ([`route`]) and said in the run's events; IPC refused by the
//! driver or the worker falls back to the host copy, also said.

use std::path::PathBuf;
use std::time::Duration;

use super::sync_route::{Route, note, route};
use super::{
    InferCall as Call, InferInit, InferOp, InferProtocol, InferReply as Reply, PolicyUpdate,
};
use crate::config::Dtype;
use crate::device::IpcStage;
use crate::model::{LoadedModel, save_model_dir};
use crate::role::remote::{RemoteWorker, worker_lost};
use crate::role::{RunError, WorkerNote, setup_err};
use crate::rollout::{Completion, Request};
use crate::scheduler::host_copy::{HostArea, stage_for_ipc, write_back_from_ipc};
use crate::worker::WorkerError;

/// A generation step or a host-copy move that takes longer than this is a hung worker.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
const HOST_COPY: &str = "actor_infer";
const ADAPTER_DIR: &str = "actor_infer-adapter";

pub struct RemoteInfer {
    pub worker: RemoteWorker<InferProtocol>,
    area: HostArea,
    /// Requests sent or queued and neither finished nor cancelled, in submission order.
    in_flight: Vec<Request>,
    /// Changes for the worker's engine, sent with the next step.
    ops: Vec<InferOp>,
    offloaded: bool,
    /// Under LoRA, the adapter directory weight sync writes.
    adapter: Option<PathBuf>,
    route: Route,
    /// The last sync went by CUDA IPC: the host copy is behind the weights staged for the worker.
    host_copy_behind: bool,
    /// What this side has to say in the run's events (the route), drained with the worker's.
    notes: Vec<WorkerNote>,
    /// The trainer's GPU buffer CUDA IPC sends from; last, so that it is freed after the worker
    /// (which may have it open) is stopped.
    ipc: IpcStage,
}

impl RemoteInfer {
    /// Write the policy to the host area and start a worker holding it.
    pub fn start(
        model: &LoadedModel,
        dtype: Dtype,
        max_batch: usize,
        multi_turn: bool,
        threads: usize,
        device: crate::device::DeviceSpec,
    ) -> Result<RemoteInfer, RunError> {
        let area = HostArea::new().map_err(|e| {
            RunError::Setup(format!(
                "creating the host-memory area for actor_infer: {e}"
            ))
        })?;
        let model_dir = area.dir().join("actor_infer-model");
        save_model_dir(&model_dir, model)?;
        // Under LoRA the parameters are the frozen base.
        area.write(HOST_COPY, &model.transformer.params().named_tensors())
            .map_err(setup_err)?;
        let adapter = match model.transformer.lora() {
            Some(lora) => {
                let dir = area.dir().join(ADAPTER_DIR);
                lora.to_adapter().save(&dir, &lora.base_model)?;
                Some(dir)
            }
            None => None,
        };
        let init = InferInit {
            model_dir,
            weights: area.path(HOST_COPY),
            adapter: adapter.clone(),
            dtype,
            max_batch,
            multi_turn,
            device,
        };
        let worker =
            RemoteWorker::start(Call::Init(init), CALL_TIMEOUT, threads, (area.dir(), &[]))?;
        let policy = crate::device::spec_of(model.transformer.device());
        // CUDA IPC only reaches processes on this machine; with a cluster launcher the worker
        // may be on any of its hosts.
        let elsewhere = crate::worker::launch::remote_hosts().is_some();
        let (route, said) = route(policy, device, adapter.is_some(), elsewhere);
        Ok(RemoteInfer {
            worker,
            area,
            in_flight: vec![],
            ops: vec![],
            offloaded: false,
            adapter,
            route,
            host_copy_behind: false,
            notes: vec![note(said)],
            ipc: IpcStage::default(),
        })
    }

    /// Replace a lost worker: a fresh one loads the host copy (the current weights) and, if the
    /// role is offloaded, lets go of them again.
    fn revive(&mut self, lost: &WorkerError) -> Result<(), RunError> {
        let carried = format!(
            "; {} requests in flight submitted again",
            self.in_flight.len()
        );
        // The fresh worker loads the host copy: after a sync by CUDA IPC it is brought up to date
        // from the trainer's buffer first (the lost worker's weights died with it).
        if self.host_copy_behind {
            let path = self.area.path(HOST_COPY);
            if !write_back_from_ipc(&self.ipc, &path).map_err(setup_err)? {
                return Err(RunError::Setup(format!(
                    "actor_infer's worker was lost after a weight sync by CUDA IPC, and its host \
                     copy {} could not be brought up to date from the trainer's GPU buffer",
                    path.display()
                )));
            }
            self.host_copy_behind = false;
        }
        let offloaded = self.offloaded.then(|| self.area.path(HOST_COPY));
        self.worker
            .revive(lost, &carried, offloaded, |path| Call::Offload {
                path,
                write: false,
            })?;
        // The fresh worker knows nothing: everything still in flight (sent or queued) starts again
        // with the next step, whichever call found the worker lost.
        self.ops = self
            .in_flight
            .iter()
            .cloned()
            .map(InferOp::Submit)
            .collect();
        Ok(())
    }

    fn call_once(&self, call: Call) -> Result<Reply, WorkerError> {
        self.worker.call(call)
    }

    /// A call that survives one lost worker: the worker is replaced and `make` builds the call
    /// again for the fresh one.
    fn call(&mut self, make: impl Fn(&Self) -> Call) -> Result<Reply, RunError> {
        match self.call_once(make(self)) {
            Err(e) if worker_lost(&e) => {
                self.revive(&e)?;
                self.call_once(make(self)).map_err(setup_err)
            }
            other => other.map_err(setup_err),
        }
    }

    pub fn submit(&mut self, request: Request) {
        self.ops.push(InferOp::Submit(request.clone()));
        self.in_flight.push(request);
    }

    pub fn abort(&mut self, cancel: &dyn Fn(u64) -> bool) {
        let ids: Vec<u64> = self
            .in_flight
            .iter()
            .map(|r| r.id)
            .filter(|&id| cancel(id))
            .collect();
        if !ids.is_empty() {
            self.in_flight.retain(|r| !cancel(r.id));
            self.ops.push(InferOp::Abort(ids));
        }
    }

    pub fn is_idle(&self) -> bool {
        self.in_flight.is_empty()
    }

    /// One engine step in the worker; what finished, with its prompt.
    pub fn step(&mut self) -> Result<Vec<Completion>, RunError> {
        let ops = std::mem::take(&mut self.ops);
        let first = self.call_once(Call::Step { ops });
        let reply = match first {
            Err(e) if worker_lost(&e) => {
                self.revive(&e)?;
                let ops = std::mem::take(&mut self.ops);
                self.call_once(Call::Step { ops }).map_err(setup_err)?
            }
            other => other.map_err(setup_err)?,
        };
        let Reply::Stepped { finished, holding } = reply else {
            return Err(RunError::Setup(format!(
                "actor_infer answered a generate call with {reply:?}"
            )));
        };
        let mut out = Vec::with_capacity(finished.len());
        for done in finished {
            let Some(at) = self.in_flight.iter().position(|r| r.id == done.id) else {
                return Err(RunError::Setup(format!(
                    "actor_infer finished request {} that is not in flight",
                    done.id
                )));
            };
            let request = self.in_flight.remove(at);
            out.push(done.into_completion(request.prompt_ids));
        }
        // A request the worker dropped would never finish: the rollout would wait forever.
        if holding != self.in_flight.len() {
            return Err(RunError::Setup(format!(
                "actor_infer worker holds {holding} requests but {} are in flight",
                self.in_flight.len()
            )));
        }
        Ok(out)
    }

    /// A call that survives one lost worker ([`RemoteInfer::call`]), telling a refusal by the
    /// worker (`Ok(Err(message))`) from a failure to reach it.
    fn call_or_refused(
        &mut self,
        make: impl Fn(&Self) -> Call,
    ) -> Result<Result<Reply, String>, RunError> {
        let result = match self.call_once(make(self)) {
            Err(e) if worker_lost(&e) => {
                self.revive(&e)?;
                self.call_once(make(self))
            }
            other => other,
        };
        match result {
            Ok(reply) => Ok(Ok(reply)),
            Err(e) if worker_lost(&e) => Err(setup_err(e)),
            Err(e) => Ok(Err(e.to_string())),
        }
    }

    /// From now on weight sync goes through the host copy, said in the events with `why`; the
    /// host copy is brought up to date from the IPC buffer first where it is behind, and the
    /// buffer is freed.
    fn give_up_ipc(&mut self, why: &str) -> Result<(), RunError> {
        if self.host_copy_behind {
            let path = self.area.path(HOST_COPY);
            write_back_from_ipc(&self.ipc, &path).map_err(setup_err)?;
            self.host_copy_behind = false;
        }
        self.route = Route::HostCopy;
        self.ipc.release();
        self.notes.push(note(format!(
            "weight sync to actor_infer: {why}; it goes through the host copy from now on"
        )));
        Ok(())
    }

    /// Offload: the worker frees its weights, which the host copy holds (after a sync by CUDA
    /// IPC, once the worker wrote them to it). Returns their bytes.
    pub fn offload(&mut self) -> Result<u64, RunError> {
        let reply = self.call(|s| Call::Offload {
            path: s.area.path(HOST_COPY),
            write: s.host_copy_behind,
        })?;
        self.offloaded = true;
        self.host_copy_behind = false;
        // The worker closed the IPC buffer and the host copy holds what it held: its memory
        // goes back to the time-shared GPU until the next sync makes a new one.
        self.ipc.release();
        moved(reply)
    }

    /// Reload the weights: from the trainer's IPC buffer where the last sync staged them there,
    /// else from the host copy. Returns bytes.
    pub fn reload(&mut self) -> Result<u64, RunError> {
        if let Some(handle) = self.ipc.handle() {
            let taken = self.call_or_refused(|s| Call::Reload {
                path: s.area.path(HOST_COPY),
                adapter: None,
                ipc: Some(handle.clone()),
            })?;
            match taken {
                Ok(reply) => {
                    self.offloaded = false;
                    return moved(reply);
                }
                Err(e) => self.give_up_ipc(&format!(
                    "the worker could not reload the weights by CUDA IPC ({e})"
                ))?,
            }
        }
        let reply = self.call(|s| Call::Reload {
            path: s.area.path(HOST_COPY),
            adapter: s.adapter.clone(),
            ipc: None,
        })?;
        self.offloaded = false;
        moved(reply)
    }

    /// Weight sync: the host copy gets the new weights (under LoRA the adapter directory gets the
    /// adapter, and the base stays); a resident worker then takes them from there, an offloaded
    /// one at its next reload. Copies are rewritten in place: the worker reads them only when a
    /// call (behind this handle's lock) tells it to, after the write. By CUDA IPC see
    /// [`RemoteInfer::sync_by_ipc`].
    pub fn set_weights(&mut self, update: &PolicyUpdate) -> Result<(), RunError> {
        if let (PolicyUpdate::Weights(params), Route::CudaIpc) = (update, self.route)
            && self.sync_by_ipc(&params.named_tensors())?
        {
            return Ok(());
        }
        match (update, &self.adapter) {
            (PolicyUpdate::Weights(params), None) => {
                self.area
                    .overwrite(HOST_COPY, &params.named_tensors())
                    .map_err(setup_err)?;
                self.host_copy_behind = false;
            }
            // The worker does not read the base's name: it merges into the base it holds.
            (PolicyUpdate::Adapter(adapter), Some(dir)) => adapter.save(dir, "")?,
            _ => {
                return Err(RunError::Setup(
                    "weight sync: actor_infer's worker and the policy disagree on whether a LoRA \
                     adapter is trained"
                        .into(),
                ));
            }
        }
        if !self.offloaded {
            let reply = self.call(|s| Call::SetWeights {
                path: s.area.path(HOST_COPY),
                adapter: s.adapter.clone(),
                ipc: None,
            })?;
            moved(reply)?;
        }
        Ok(())
    }

    /// Weight sync by CUDA IPC: the weights copied into the trainer's buffer (the host copy is
    /// then behind), and taken from it by a resident worker now, by an offloaded one at its
    /// reload. `false` (and the host copy from now on, said in the events) where the driver or
    /// the worker refused, or IPC does not apply to these tensors.
    fn sync_by_ipc(&mut self, tensors: &[(String, candle_core::Tensor)]) -> Result<bool, RunError> {
        let path = self.area.path(HOST_COPY);
        let handle = match stage_for_ipc(&mut self.ipc, &path, tensors) {
            Ok(Some(handle)) => handle,
            Ok(None) => {
                self.give_up_ipc(
                    "CUDA IPC does not apply to these weights (not all contiguous GPU tensors \
                     as the host copy holds them)",
                )?;
                return Ok(false);
            }
            Err(e) => {
                self.give_up_ipc(&format!("CUDA IPC failed ({e})"))?;
                return Ok(false);
            }
        };
        self.host_copy_behind = true;
        if self.offloaded {
            return Ok(true);
        }
        let taken = self.call_or_refused(|s| Call::SetWeights {
            path: s.area.path(HOST_COPY),
            adapter: None,
            ipc: Some(handle.clone()),
        })?;
        match taken {
            Ok(reply) => {
                moved(reply)?;
                Ok(true)
            }
            Err(e) => {
                self.give_up_ipc(&format!(
                    "the worker could not take the weights by CUDA IPC ({e})"
                ))?;
                Ok(false)
            }
        }
    }

    /// Worker events since the last call, as (worker name, notice, text).
    pub fn drain_events(&mut self) -> Vec<WorkerNote> {
        let mut notes = std::mem::take(&mut self.notes);
        notes.extend(self.worker.drain_events());
        notes
    }

    /// Stop the worker (asking first); returns the events not yet drained, its exit included.
    pub fn shutdown(&mut self) -> Vec<WorkerNote> {
        let mut notes = std::mem::take(&mut self.notes);
        notes.extend(self.worker.shutdown());
        notes
    }
}

/// Bytes from a host-copy move's reply.
fn moved(reply: Reply) -> Result<u64, RunError> {
    match reply {
        Reply::Moved { bytes } => Ok(bytes),
        other => Err(RunError::Setup(format!(
            "actor_infer answered a host-copy move with {other:?}"
        ))),
    }
}
