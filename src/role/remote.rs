//! One worker process driven from the synchronous pipeline: a small tokio runtime of its own, the
//! process, the call that loads it, and the events it reports. Every model role in a worker process
//! (actor_infer, actor_train, reference, critic) is built on this, typed by the role's
//! [`Protocol`]; [`drain`] turns any worker's events into notes for the run's record.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::epochs::ActorReport;
use super::{Protocol, RoleCall, RunError, WorkerNote, payload, setup_err};
use crate::metrics::WorkerNotice;
use crate::scheduler::host_copy::HostArea;
use crate::worker::{ProtocolError, Role, WorkerError, WorkerEvent, WorkerProcess, WorkerSpec};

/// What a model role's worker answers (actor_train, critic, reference).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ModelReply {
    /// The model is loaded, with this many parameters.
    Loaded { params: usize },
    /// Bytes of tensor data moved to or from a host copy, or written to a file.
    Moved { bytes: u64 },
    /// The metrics of a train step (f64 bit patterns: exact, NaN and infinities included), and
    /// the AdamW steps taken so far.
    Trained {
        metric_bits: Vec<(String, u64)>,
        /// `ActorReport::row_logps` (f32 bit patterns), by row.
        #[serde(default)]
        row_logp_bits: Vec<(u32, u32)>,
        optimizer_steps: usize,
    },
}

pub struct RemoteWorker<P: Protocol> {
    rt: tokio::runtime::Runtime,
    spec: WorkerSpec,
    /// `None` once shut down.
    worker: Option<WorkerProcess>,
    events_tx: mpsc::UnboundedSender<WorkerEvent>,
    events: mpsc::UnboundedReceiver<WorkerEvent>,
    /// The call that loads a fresh worker.
    init: P::Request,
    /// A call that takes longer than this is a hung worker.
    timeout: Duration,
    /// Workers replaced after dying or hanging.
    pub restarts: usize,
    /// Restart notes not reported yet.
    notes: Vec<WorkerNote>,
}

/// Whether a failed call means the worker is gone or stuck (and worth replacing), rather than a
/// call the worker understood and refused.
pub fn worker_lost(e: &WorkerError) -> bool {
    matches!(
        e,
        WorkerError::Died { .. } | WorkerError::Timeout { .. } | WorkerError::Protocol { .. }
    )
}

/// A file outside the role's host area that a worker reads (a checkpoint's, to resume from):
/// `file` itself where the worker sees this machine's files, else a copy of it in `area` (named
/// `name`), which the worker's mirror receives.
pub fn readable_by_worker(area: &HostArea, file: &Path, name: &str) -> Result<PathBuf, RunError> {
    if !crate::worker::launch::workers_mirror() {
        return Ok(file.to_path_buf());
    }
    let copy = area.dir().join(name);
    std::fs::copy(file, &copy).map_err(|e| {
        RunError::Setup(format!(
            "copying '{}' into the host area for a worker on another node: {e}",
            file.display()
        ))
    })?;
    Ok(copy)
}

/// Where a worker writes a file that belongs outside the role's host area at `dest` (a
/// checkpoint's): `dest` itself where the worker sees this machine's files, else a file in `area`
/// (named `name`) that comes back with the call, for [`settle`] to move to `dest`.
pub fn writable_by_worker(area: &HostArea, dest: &Path, name: &str) -> PathBuf {
    if crate::worker::launch::workers_mirror() {
        area.dir().join(name)
    } else {
        dest.to_path_buf()
    }
}

/// Move what a worker wrote at `written` ([`writable_by_worker`]) to `dest`, if it is elsewhere.
pub fn settle(written: &Path, dest: &Path) -> std::io::Result<()> {
    if written == dest {
        return Ok(());
    }
    if std::fs::rename(written, dest).is_err() {
        // Another filesystem: copy, then drop the area's file.
        std::fs::copy(written, dest)?;
        std::fs::remove_file(written)?;
    }
    Ok(())
}

/// A failed call to a worker that alone holds `what` (an optimizer's state): a worker that died,
/// hung or broke the protocol is [`RunError::WorkerLost`], since `what` is gone with it.
pub fn state_lost(e: WorkerError, what: &str) -> RunError {
    if worker_lost(&e) {
        RunError::WorkerLost(format!(
            "{e}; {what} lived only in that worker, so the run stops here"
        ))
    } else {
        RunError::Setup(e.to_string())
    }
}

impl<P: Protocol> RemoteWorker<P> {
    /// Start worker 0 of the role with `threads` compute threads, exchanging files with the role
    /// through the host area `area` (of which a worker on another node keeps the files
    /// `worker_only` names to itself: [`WorkerSpec::with_area`]), and send it `init`.
    pub fn start(
        init: P::Request,
        timeout: Duration,
        threads: usize,
        (area, worker_only): (&Path, &[&str]),
    ) -> Result<Self, RunError> {
        let role = P::ROLE;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("roll-{role}"))
            .enable_all()
            .build()
            .map_err(setup_err)?;
        let (events_tx, events) = mpsc::unbounded_channel();
        let spec = WorkerSpec::new(role, 0)
            .map_err(setup_err)?
            .with_threads(threads)
            .with_area(area, worker_only);
        let worker = launch::<P>(&rt, &spec, &init, timeout, events_tx.clone())?;
        Ok(RemoteWorker {
            rt,
            spec,
            worker: Some(worker),
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
        offload: impl FnOnce(PathBuf) -> P::Request,
    ) -> Result<(), RunError> {
        if let Some(w) = &self.worker {
            w.kill();
        }
        let events = self.events_tx.clone();
        self.worker = Some(launch::<P>(
            &self.rt,
            &self.spec,
            &self.init,
            self.timeout,
            events,
        )?);
        self.restarts += 1;
        self.notes.push(WorkerNote {
            role: self.spec.role,
            index: self.spec.index,
            pid: self.worker.as_ref().map(|w| w.pid),
            notice: WorkerNotice::Restarted,
            phase: lost.phase(),
            node: None,
            text: format!("replaced ({lost}){carried}"),
        });
        if let Some(path) = offloaded_to {
            self.call(offload(path)).map_err(setup_err)?;
        }
        Ok(())
    }

    pub fn call(&self, call: P::Request) -> Result<P::Reply, WorkerError> {
        let Some(worker) = &self.worker else {
            return Err(WorkerError::Failed {
                role: P::ROLE,
                index: self.spec.index,
                phase: call.phase(),
                message: "the worker was shut down".into(),
            });
        };
        self.rt
            .block_on(call_typed::<P>(worker, &call, self.timeout))
    }

    /// Worker events since the last drain, as (worker name, notice, text): restart notes come
    /// after the lost worker's exit and its successor's start.
    pub fn drain_events(&mut self) -> Vec<WorkerNote> {
        let mut out = drain(&mut self.events);
        out.append(&mut self.notes);
        out
    }

    /// Stop the worker (asking first); returns the events not yet drained, its exit included.
    /// Calls fail afterwards.
    pub fn shutdown(&mut self) -> Vec<WorkerNote> {
        if let Some(worker) = self.worker.take() {
            self.rt.block_on(worker.shutdown(Duration::from_secs(5)));
        }
        let mut notes = std::mem::take(&mut self.notes);
        notes.extend(drain(&mut self.events));
        notes
    }
}

/// Send one typed call and decode the typed reply.
pub async fn call_typed<P: Protocol>(
    worker: &WorkerProcess,
    call: &P::Request,
    timeout: Duration,
) -> Result<P::Reply, WorkerError> {
    let (role, index, phase) = (P::ROLE, worker.index, call.phase());
    let decode = |what, source| WorkerError::Protocol {
        role,
        index,
        source: ProtocolError::Decode { what, source },
    };
    let request = payload(call).map_err(|e| decode("outgoing", e))?;
    let reply = worker.call(phase, request, timeout).await?;
    serde_json::from_value(reply).map_err(|e| decode("reply", e))
}

fn launch<P: Protocol>(
    rt: &tokio::runtime::Runtime,
    spec: &WorkerSpec,
    init: &P::Request,
    timeout: Duration,
    events: mpsc::UnboundedSender<WorkerEvent>,
) -> Result<WorkerProcess, RunError> {
    rt.block_on(async {
        let worker = WorkerProcess::spawn(spec, events).await?;
        call_typed::<P>(&worker, init, timeout).await?;
        Ok::<_, WorkerError>(worker)
    })
    .map_err(setup_err)
}

/// The report and AdamW steps so far from a train call's reply.
pub fn trained(role: Role, reply: ModelReply) -> Result<(ActorReport, usize), RunError> {
    match reply {
        ModelReply::Trained {
            metric_bits,
            row_logp_bits,
            optimizer_steps,
        } => Ok((
            ActorReport {
                metrics: metric_bits
                    .into_iter()
                    .map(|(k, bits)| (k, f64::from_bits(bits)))
                    .collect(),
                row_logps: row_logp_bits
                    .into_iter()
                    .map(|(row, bits)| (row, f32::from_bits(bits)))
                    .collect(),
            },
            optimizer_steps,
        )),
        other => Err(RunError::Setup(format!(
            "{role} answered a train call with {other:?}"
        ))),
    }
}

/// Bytes from a host-copy move's reply.
pub fn moved(role: Role, reply: ModelReply) -> Result<u64, RunError> {
    match reply {
        ModelReply::Moved { bytes } => Ok(bytes),
        other => Err(RunError::Setup(format!(
            "{role} answered a host-copy move with {other:?}"
        ))),
    }
}

/// The worker events queued in `rx`, described for the run's record.
pub fn drain(rx: &mut mpsc::UnboundedReceiver<WorkerEvent>) -> Vec<WorkerNote> {
    let mut out = vec![];
    while let Ok(e) = rx.try_recv() {
        out.push(describe(&e));
    }
    out
}

fn describe(e: &WorkerEvent) -> WorkerNote {
    let note = |role: &Role, index: &usize, pid: Option<u32>, notice, text| WorkerNote {
        role: *role,
        index: *index,
        pid,
        notice,
        phase: None,
        node: None,
        text,
    };
    match e {
        WorkerEvent::Started {
            role,
            index,
            pid,
            via,
            node,
        } => WorkerNote {
            node: node.clone(),
            ..note(
                role,
                index,
                Some(*pid),
                WorkerNotice::Started,
                format!("started, pid {pid}, over {via}"),
            )
        },
        WorkerEvent::Log {
            role,
            index,
            stream,
            line,
        } => note(
            role,
            index,
            None,
            WorkerNotice::Log,
            format!("{stream}: {line}"),
        ),
        WorkerEvent::Refused {
            role,
            index,
            peer,
            reason,
        } => {
            // Counted over the run (this process), so a stream of them shows as one.
            static REFUSED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            note(
                role,
                index,
                None,
                WorkerNotice::Refused,
                format!("refused a connection from {peer}: {reason} ({n} refused so far)"),
            )
        }
        WorkerEvent::Unresponsive {
            role,
            index,
            silent_s,
        } => note(
            role,
            index,
            None,
            WorkerNotice::Failed,
            format!("no heartbeat answer for {silent_s:.1} s"),
        ),
        WorkerEvent::Exited {
            role,
            index,
            pid,
            status,
            expected,
        } => {
            let notice = if *expected {
                WorkerNotice::Exited
            } else {
                WorkerNotice::Failed
            };
            let what = if *expected { "exited" } else { "died" };
            let text = format!("pid {pid} {what} ({status})");
            note(role, index, Some(*pid), notice, text)
        }
    }
}
