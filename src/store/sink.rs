//! The pipeline's [`MetricSink`] backed by the store's writer: every call only queues.

use crate::metrics::{
    CheckpointRecord, MetricRecord, MetricSink, SampleRecord, SinkError, WorkerNote,
};
use crate::names::Transfer;

use super::RunId;
use super::records::{EventKind, EventRecord, TrajectoryRecord};
use super::writer::WriterHandle;

pub struct StoreSink {
    writer: WriterHandle,
    run: RunId,
}

impl StoreSink {
    pub fn new(writer: WriterHandle, run: RunId) -> Self {
        StoreSink { writer, run }
    }
}

fn sink_err(e: super::StoreError) -> SinkError {
    SinkError(e.to_string())
}

impl MetricSink for StoreSink {
    fn record(&mut self, record: &MetricRecord) -> Result<(), SinkError> {
        let mut points: Vec<(String, f64)> = record
            .metrics
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        // Back-pressure: how long this step waited for the writer's queue, and how full it is.
        points.push((
            "store/backpressure_s".into(),
            self.writer.take_blocked_secs(),
        ));
        points.push(("store/queued".into(), self.writer.queued() as f64));
        self.writer
            .metrics_blocking(
                self.run,
                record.stage.as_str(),
                record.step as u64,
                record.wall_time,
                points,
            )
            .map_err(sink_err)
    }

    fn samples(&mut self, samples: &[SampleRecord]) -> Result<(), SinkError> {
        self.writer
            .samples_blocking(self.run, samples.to_vec())
            .map_err(sink_err)
    }

    fn trajectories(&mut self, trajectories: &[TrajectoryRecord]) -> Result<(), SinkError> {
        for t in trajectories {
            self.writer
                .trajectory_blocking(self.run, t.clone())
                .map_err(sink_err)?;
        }
        Ok(())
    }

    fn checkpoint(&mut self, checkpoint: &CheckpointRecord) -> Result<(), SinkError> {
        self.writer
            .checkpoint_blocking(self.run, checkpoint.clone())
            .map_err(sink_err)?;
        // A checkpoint is only worth something if the store knows about it.
        self.writer.flush_blocking().map_err(sink_err)
    }

    fn message(&mut self, text: &str) -> Result<(), SinkError> {
        self.writer
            .event_blocking(
                Some(self.run),
                EventRecord::message(EventKind::Warning, text),
            )
            .map_err(sink_err)
    }

    fn worker(&mut self, note: &WorkerNote) -> Result<(), SinkError> {
        self.writer
            .event_blocking(Some(self.run), EventRecord::of_worker(note))
            .map_err(sink_err)
    }

    fn transfer(&mut self, transfer: &Transfer) -> Result<(), SinkError> {
        self.writer
            .event_blocking(Some(self.run), EventRecord::of_transfer(transfer))
            .map_err(sink_err)
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        self.writer.flush_blocking().map_err(sink_err)
    }
}
