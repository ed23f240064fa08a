//! The shapes of a run's numbers and samples, shared by the pipeline, the store and the plots.
//!
//! Pipelines write through [`MetricSink`] (the store's sink in real runs, [`MemorySink`] in tests); they
//! never know where the numbers go. Metric keys follow docs/DESIGN.md §Metric keys (`reward/<domain>/mean`); a series is
//! identified by its stage ("sft", "rl") and key, because both stages count steps from 1.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::names::{Direction, Role, Stage, Transfer};

/// Metric values of one step, by stable key.
pub type Metrics = BTreeMap<String, f64>;

/// The metrics of one step of one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricRecord {
    pub stage: Stage,
    pub step: usize,
    /// Seconds since the run started (continues across resumes).
    pub wall_time: f64,
    pub metrics: Metrics,
}

/// A scored rollout sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    pub stage: String,
    pub step: usize,
    pub domain: String,
    pub prompt: String,
    pub response: String,
    pub ground_truth: String,
    pub reward: f32,
    pub correct: bool,
    /// The parts the reward was made of, by name (e.g. `correct`, `format_ok`).
    pub breakdown: BTreeMap<String, f64>,
    pub advantage: f32,
    pub prompt_tokens: usize,
    pub response_tokens: usize,
    pub finish_reason: String,
    /// The policy version (optimizer steps of this stage) that generated the sample.
    pub policy_version: usize,
    /// Per-token log-probs of the policy's sampled tokens, the student's and its teachers'
    /// (recorded when an RL stage has on-policy distillation teachers, `rl.opd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenTrace>,
}

/// A sample's tokens — those the policy sampled, not an environment's text between its turns —
/// with the log-prob the student sampled each with and the log-prob
/// each teacher that scored the sample gives it (the teachers' temperature is the sampling's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TokenTrace {
    /// Each token decoded alone.
    pub pieces: Vec<String>,
    /// One log-prob per token; `None` where there is no finite one (JSON has no NaN or ±∞).
    pub student: Vec<Option<f32>>,
    /// By teacher name (`rl.opd.teachers[].name`), one log-prob per token; `None` also where
    /// the teacher did not score the token's row.
    pub teachers: BTreeMap<String, Vec<Option<f32>>>,
}

impl TokenTrace {
    /// Consecutive parts of `lengths` tokens each (an episode's turns); `None` when the lengths
    /// do not add up to the trace's.
    pub fn split(&self, lengths: &[usize]) -> Option<Vec<TokenTrace>> {
        if lengths.iter().sum::<usize>() != self.pieces.len() {
            return None;
        }
        let mut at = 0;
        Some(
            lengths
                .iter()
                .map(|&n| {
                    let part = at..at + n;
                    at += n;
                    TokenTrace {
                        pieces: self.pieces[part.clone()].to_vec(),
                        student: self.student[part.clone()].to_vec(),
                        teachers: self
                            .teachers
                            .iter()
                            .map(|(k, v)| (k.clone(), v[part.clone()].to_vec()))
                            .collect(),
                    }
                })
                .collect(),
        )
    }
}

/// `x` when it is finite.
pub fn finite(x: f32) -> Option<f32> {
    x.is_finite().then_some(x)
}

/// A checkpoint that was written and is complete on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub stage: String,
    pub step: usize,
    pub path: PathBuf,
    pub bytes: u64,
}

/// One metric over steps: parallel vectors, sorted by step, one point per step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    pub stage: String,
    pub key: String,
    pub steps: Vec<u64>,
    /// Seconds since the run started, per point.
    pub wall_time: Vec<f64>,
    pub values: Vec<f64>,
}

impl Series {
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The last value, if any.
    pub fn last(&self) -> Option<(u64, f64)> {
        Some((*self.steps.last()?, *self.values.last()?))
    }
}

/// What happened to a worker process, as a run records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerNotice {
    Started,
    /// Exited when asked to.
    Exited,
    /// Died, went silent, or failed a call.
    Failed,
    /// A line it wrote to stdout or stderr.
    Log,
    /// Replaced after it was lost (recorded as a warning).
    Restarted,
    /// A connection to its port that did not prove the run's secret (recorded as a warning).
    Refused,
}

/// Something a worker process did, for the run's record, with its facts as fields: which role
/// and worker, its pid when known, the call phase a failure happened in, and a line of text for
/// people. Front-ends read the fields, never the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerNote {
    pub role: Role,
    pub index: usize,
    pub pid: Option<u32>,
    pub notice: WorkerNotice,
    /// The call a failure or replacement happened in (`generate`, `train`, …).
    pub phase: Option<&'static str>,
    /// The node a started worker runs on (a cluster's host); `None` on the head's machine.
    pub node: Option<String>,
    pub text: String,
}

impl WorkerNote {
    /// The worker's name, `role-index` (`reward-0`).
    pub fn worker(&self) -> String {
        format!("{}-{}", self.role, self.index)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SinkError(pub String);

/// One turn of an agentic episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub observation: String,
    pub action_text: String,
    /// `None` when the action text could not be parsed.
    pub parsed_action: Option<String>,
    pub reward: f64,
    pub done: bool,
    pub prompt_tokens: usize,
    pub response_tokens: usize,
    /// What the environment reported about the step (`state`, `success`, `action_is_valid`,
    /// `state_hash` of the state acted in, …).
    #[serde(default)]
    pub info: serde_json::Map<String, serde_json::Value>,
    /// The turn's tokens with the student's and the teachers' log-probs (on-policy
    /// distillation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenTrace>,
}

/// One agentic episode, turn by turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    pub stage: String,
    pub step: usize,
    pub env: String,
    pub env_seed: u64,
    pub policy_version: usize,
    pub success: bool,
    /// The group (episodes from one seed) and the episode's place in it.
    #[serde(default)]
    pub group: usize,
    #[serde(default)]
    pub episode: usize,
    /// `done` (the environment ended it), `max_turns` or `token_budget` (cut).
    #[serde(default)]
    pub end_reason: String,
    pub turns: Vec<TurnRecord>,
}

/// Where a pipeline's results go. Calls must be cheap: a real sink queues and writes elsewhere.
pub trait MetricSink {
    fn record(&mut self, record: &MetricRecord) -> Result<(), SinkError>;
    fn samples(&mut self, samples: &[SampleRecord]) -> Result<(), SinkError>;
    /// Agentic episodes, turn by turn.
    fn trajectories(&mut self, trajectories: &[TrajectoryRecord]) -> Result<(), SinkError>;
    fn checkpoint(&mut self, checkpoint: &CheckpointRecord) -> Result<(), SinkError>;
    /// A warning or notice worth keeping with the run.
    fn message(&mut self, text: &str) -> Result<(), SinkError>;
    /// A worker process event.
    fn worker(&mut self, note: &WorkerNote) -> Result<(), SinkError>;
    /// A role's state moved between its devices and host memory (time-sharing).
    fn transfer(&mut self, transfer: &Transfer) -> Result<(), SinkError>;
    /// Make everything recorded so far durable.
    fn flush(&mut self) -> Result<(), SinkError>;
}

/// The store event of a transfer: kind, worker (the role), devices ("0,1"), bytes and seconds.
pub fn transfer_parts(t: &Transfer) -> (Direction, String, String, String) {
    let devices = t
        .devices
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut message = format!(
        "{} {} {} bytes in {:.3} s (phase {})",
        t.direction.as_str(),
        t.role,
        t.bytes,
        t.seconds,
        t.phase
    );
    for r in &t.memory {
        use crate::text::human_bytes as h;
        message.push_str(&format!(
            "; cuda:{} free {} -> {} of {}",
            r.device,
            h(r.free_before),
            h(r.free_after),
            h(r.total)
        ));
    }
    (t.direction, t.role.to_string(), devices, message)
}

/// Keeps everything in memory (tests, library use without a store).
#[derive(Debug, Default)]
pub struct MemorySink {
    pub records: Vec<MetricRecord>,
    pub samples: Vec<SampleRecord>,
    pub trajectories: Vec<TrajectoryRecord>,
    pub checkpoints: Vec<CheckpointRecord>,
    pub messages: Vec<String>,
    pub worker_notices: Vec<WorkerNote>,
    pub transfers: Vec<Transfer>,
}

impl MemorySink {
    /// The values of `key` in `stage`, in step order.
    pub fn values(&self, stage: &str, key: &str) -> Vec<f64> {
        self.records
            .iter()
            .filter(|r| r.stage.as_str() == stage)
            .filter_map(|r| r.metrics.get(key).copied())
            .collect()
    }
}

impl MetricSink for MemorySink {
    fn record(&mut self, record: &MetricRecord) -> Result<(), SinkError> {
        self.records.push(record.clone());
        Ok(())
    }

    fn samples(&mut self, samples: &[SampleRecord]) -> Result<(), SinkError> {
        self.samples.extend_from_slice(samples);
        Ok(())
    }

    fn trajectories(&mut self, trajectories: &[TrajectoryRecord]) -> Result<(), SinkError> {
        self.trajectories.extend_from_slice(trajectories);
        Ok(())
    }

    fn checkpoint(&mut self, checkpoint: &CheckpointRecord) -> Result<(), SinkError> {
        self.checkpoints.push(checkpoint.clone());
        Ok(())
    }

    fn message(&mut self, text: &str) -> Result<(), SinkError> {
        self.messages.push(text.into());
        Ok(())
    }

    fn worker(&mut self, note: &WorkerNote) -> Result<(), SinkError> {
        self.worker_notices.push(note.clone());
        Ok(())
    }

    fn transfer(&mut self, transfer: &Transfer) -> Result<(), SinkError> {
        self.transfers.push(transfer.clone());
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_splits_into_its_turns_only_when_their_lengths_add_up() {
        let t = TokenTrace {
            pieces: ["a", "b", "c"].map(String::from).to_vec(),
            student: vec![Some(-1.0), None, Some(-3.0)],
            teachers: BTreeMap::from([("t".into(), vec![Some(-0.5), Some(-0.25), None])]),
        };
        let parts = t.split(&[2, 0, 1]).expect("2 + 0 + 1 = 3");
        assert_eq!(parts[0].pieces, ["a", "b"]);
        assert_eq!(parts[0].teachers["t"], [Some(-0.5), Some(-0.25)]);
        assert!(parts[1].pieces.is_empty() && parts[1].teachers["t"].is_empty());
        assert_eq!(
            (parts[2].student.clone(), parts[2].teachers["t"].clone()),
            (vec![Some(-3.0)], vec![None])
        );
        assert!(t.split(&[2, 2]).is_none());
    }

    use crate::names::{DeviceReading, Phase};

    /// A GPU move's event names each device's free memory before and after it; a CPU move's
    /// says nothing of memory (its devices are budgets).
    #[test]
    fn a_transfer_event_carries_the_drivers_memory_readings() {
        let mut t = Transfer {
            role: crate::names::Role::ActorTrain,
            direction: Direction::Offload,
            phase: Phase::Generate,
            devices: vec![0, 1],
            bytes: 2048,
            seconds: 0.25,
            memory: vec![],
        };
        let (_, role, devices, message) = transfer_parts(&t);
        assert_eq!((role.as_str(), devices.as_str()), ("actor_train", "0,1"));
        assert_eq!(
            message,
            "offload actor_train 2048 bytes in 0.250 s (phase generate)"
        );
        t.memory = vec![DeviceReading {
            device: 1,
            free_before: 1 << 30,
            free_after: 3 << 30,
            total: 80 << 30,
        }];
        assert_eq!(
            transfer_parts(&t).3,
            "offload actor_train 2048 bytes in 0.250 s (phase generate); cuda:1 free 1.0 GiB -> 3.0 GiB of 80.0 GiB"
        );
    }
}
