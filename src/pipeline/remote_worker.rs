//! One worker process driven from the synchronous pipeline: a small tokio runtime of its own, the
//! process, the call that loads it, and the events it reports. Every model role in a worker process
//! (actor_infer, actor_train, reference, critic) is built on this.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use super::PipelineError;
use super::reward_pool::drain;
use crate::metrics::{Metrics, WorkerNotice};
use crate::worker::{Reply, Request, Role, WorkerError, WorkerEvent, WorkerProcess, WorkerSpec};

pub(super) struct RemoteWorker {
    rt: tokio::runtime::Runtime,
    spec: WorkerSpec,
    worker: WorkerProcess,
    events_tx: mpsc::UnboundedSender<WorkerEvent>,
    events: mpsc::UnboundedReceiver<WorkerEvent>,
    /// The call that loads a fresh worker.
    init: Request,
    /// A call that takes longer than this is a hung worker.
    timeout: Duration,
    /// Workers replaced after dying or hanging.
    pub restarts: usize,
    /// Restart notes not reported yet.
    notes: Vec<(String, WorkerNotice, String)>,
}

/// Whether a failed call means the worker is gone or stuck (and worth replacing), rather than a
/// call the worker understood and refused.
pub(super) fn worker_lost(e: &WorkerError) -> bool {
    matches!(
        e,
        WorkerError::Died { .. } | WorkerError::Timeout { .. } | WorkerError::Protocol { .. }
    )
}

/// A failed call to a worker that alone holds `what` (an optimizer's state): a worker that died,
/// hung or broke the protocol is [`PipelineError::WorkerLost`], since `what` is gone with it.
pub(super) fn state_lost(e: WorkerError, what: &str) -> PipelineError {
    if worker_lost(&e) {
        PipelineError::WorkerLost(format!(
            "{e}; {what} lived only in that worker, so the run stops here"
        ))
    } else {
        PipelineError::Setup(e.to_string())
    }
}

pub(super) fn setup_err(e: impl std::fmt::Display) -> PipelineError {
    PipelineError::Setup(e.to_string())
}

impl RemoteWorker {
    /// Start worker 0 of `role` and send it `init`.
    pub fn start(role: Role, init: Request, timeout: Duration) -> Result<Self, PipelineError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("roll-{role}"))
            .enable_all()
            .build()
            .map_err(setup_err)?;
        let (events_tx, events) = mpsc::unbounded_channel();
        let spec = WorkerSpec::new(role, 0).map_err(setup_err)?;
        let worker = launch(&rt, &spec, &init, timeout, events_tx.clone())?;
        Ok(RemoteWorker {
            rt,
            spec,
            worker,
            events_tx,
            events,
            init,
            timeout,
            restarts: 0,
            notes: vec![],
        })
    }

    /// "role-index", as worker events name it.
    pub fn name(&self) -> String {
        format!("{}-{}", self.spec.role, self.spec.index)
    }

    /// Replace a lost worker: kill it, start a fresh one with the init call, and — when the role
    /// is offloaded — have it let go of its state again at `offloaded_to`. `carried` ends the
    /// restart note (what the new worker was given again).
    pub fn revive(
        &mut self,
        lost: &WorkerError,
        carried: &str,
        offloaded_to: Option<PathBuf>,
    ) -> Result<(), PipelineError> {
        self.worker.kill();
        let events = self.events_tx.clone();
        self.worker = launch(&self.rt, &self.spec, &self.init, self.timeout, events)?;
        self.restarts += 1;
        self.notes.push((
            self.name(),
            WorkerNotice::Restarted,
            format!("replaced ({lost}){carried}"),
        ));
        if let Some(path) = offloaded_to {
            self.call(Request::Offload { path }).map_err(setup_err)?;
        }
        Ok(())
    }

    pub fn call(&self, call: Request) -> Result<Reply, WorkerError> {
        self.rt.block_on(self.worker.call(call, self.timeout))
    }

    /// Worker events since the last drain, as (worker name, notice, text): restart notes come
    /// after the lost worker's exit and its successor's start.
    pub fn drain_events(&mut self) -> Vec<(String, WorkerNotice, String)> {
        let mut out = drain(&mut self.events);
        out.append(&mut self.notes);
        out
    }

    /// Stop the worker (asking first); returns the events not yet drained, its exit included.
    pub fn shutdown(self) -> Vec<(String, WorkerNotice, String)> {
        let RemoteWorker {
            rt,
            worker,
            mut events,
            mut notes,
            ..
        } = self;
        rt.block_on(worker.shutdown(Duration::from_secs(5)));
        notes.extend(drain(&mut events));
        notes
    }
}

fn launch(
    rt: &tokio::runtime::Runtime,
    spec: &WorkerSpec,
    init: &Request,
    timeout: Duration,
    events: mpsc::UnboundedSender<WorkerEvent>,
) -> Result<WorkerProcess, PipelineError> {
    rt.block_on(async {
        let worker = WorkerProcess::spawn(spec, events).await?;
        worker.call(init.clone(), timeout).await?;
        Ok::<_, WorkerError>(worker)
    })
    .map_err(setup_err)
}

/// The metrics and AdamW steps so far from a train call's reply.
pub(super) fn trained(role: Role, reply: Reply) -> Result<(Metrics, usize), PipelineError> {
    match reply {
        Reply::Trained {
            metric_bits,
            optimizer_steps,
        } => Ok((
            metric_bits
                .into_iter()
                .map(|(k, bits)| (k, f64::from_bits(bits)))
                .collect(),
            optimizer_steps,
        )),
        other => Err(PipelineError::Setup(format!(
            "{role} answered a train call with {other:?}"
        ))),
    }
}

/// Bytes from a host-copy move's reply.
pub(super) fn moved(role: Role, reply: Reply) -> Result<u64, PipelineError> {
    match reply {
        Reply::Moved { bytes } => Ok(bytes),
        other => Err(PipelineError::Setup(format!(
            "{role} answered a host-copy move with {other:?}"
        ))),
    }
}
