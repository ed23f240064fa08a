//! Worker events into the run's record: every note is stored, and failures, restarts and refused
//! connections are also shown to the user.

use super::{PipelineEvent, RunContext, RunError};
use crate::metrics::WorkerNotice;
use crate::role::WorkerNote;

/// Record worker events with the run; failures are also shown to the user.
pub fn report_workers(ctx: &mut RunContext<'_>, events: Vec<WorkerNote>) -> Result<(), RunError> {
    for note in events {
        ctx.sink.worker(&note)?;
        ctx.emit(PipelineEvent::Worker(note.clone()));
        if matches!(
            note.notice,
            WorkerNotice::Failed | WorkerNotice::Restarted | WorkerNotice::Refused
        ) {
            let worker = note.worker();
            ctx.emit(PipelineEvent::Message(format!(
                "worker {worker}: {}",
                note.text
            )));
        }
    }
    Ok(())
}
