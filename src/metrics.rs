//! Where a run's numbers and samples go.
//!
//! Pipelines write through [`MetricSink`]; the JSONL sink writes `metrics.jsonl` (one line per step)
//! and `samples.jsonl` (one line per scored sample) in the run's output directory. The experiment-store
//! issue adds an SQLite sink behind the same trait. Metric keys follow DESIGN.md (`reward/<domain>/mean`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Metric values of one step, by stable key.
pub type Metrics = BTreeMap<String, f64>;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricRecord {
    pub stage: String,
    pub step: usize,
    /// Seconds since the run started.
    pub wall_time: f64,
    pub metrics: Metrics,
}

/// One line of `samples.jsonl`: a scored rollout sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    pub step: usize,
    pub domain: String,
    pub prompt: String,
    pub response: String,
    pub ground_truth: String,
    pub reward: f32,
    pub correct: bool,
    pub advantage: f32,
    pub response_tokens: usize,
    pub finish_reason: String,
    pub policy_version: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("metrics file '{}': {source}", path.display())]
pub struct SinkError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

pub trait MetricSink {
    fn record(&mut self, record: &MetricRecord) -> Result<(), SinkError>;
    fn samples(&mut self, samples: &[SampleRecord]) -> Result<(), SinkError>;
    /// Make everything written so far durable.
    fn flush(&mut self) -> Result<(), SinkError>;
}

/// Appends JSON lines; a resumed run keeps what earlier attempts wrote.
pub struct JsonlSink {
    metrics_path: PathBuf,
    samples_path: PathBuf,
    metrics: BufWriter<File>,
    samples: BufWriter<File>,
}

impl JsonlSink {
    pub fn open(dir: &Path) -> Result<Self, SinkError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SinkError { path, source }
        };
        std::fs::create_dir_all(dir).map_err(err(dir))?;
        let metrics_path = dir.join("metrics.jsonl");
        let samples_path = dir.join("samples.jsonl");
        let open = |p: &Path| {
            File::options()
                .create(true)
                .append(true)
                .open(p)
                .map_err(err(p))
        };
        Ok(JsonlSink {
            metrics: BufWriter::new(open(&metrics_path)?),
            samples: BufWriter::new(open(&samples_path)?),
            metrics_path,
            samples_path,
        })
    }

    /// Read back a `metrics.jsonl` file (for tests, plots and summaries).
    pub fn read_metrics(path: &Path) -> Result<Vec<MetricRecord>, SinkError> {
        let text = std::fs::read_to_string(path).map_err(|source| SinkError {
            path: path.into(),
            source,
        })?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|e| SinkError {
                    path: path.into(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("line {}: {e}", i + 1),
                    ),
                })
            })
            .collect()
    }
}

fn write_line<T: Serialize>(
    w: &mut BufWriter<File>,
    path: &Path,
    value: &T,
) -> Result<(), SinkError> {
    let line = serde_json::to_string(value).map_err(|e| SinkError {
        path: path.into(),
        source: std::io::Error::other(e),
    })?;
    writeln!(w, "{line}").map_err(|source| SinkError {
        path: path.into(),
        source,
    })
}

impl MetricSink for JsonlSink {
    fn record(&mut self, record: &MetricRecord) -> Result<(), SinkError> {
        write_line(&mut self.metrics, &self.metrics_path, record)?;
        // Metrics are small and a crash should lose at most the step in flight.
        self.metrics.flush().map_err(|source| SinkError {
            path: self.metrics_path.clone(),
            source,
        })
    }

    fn samples(&mut self, samples: &[SampleRecord]) -> Result<(), SinkError> {
        for s in samples {
            write_line(&mut self.samples, &self.samples_path, s)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        self.metrics.flush().map_err(|source| SinkError {
            path: self.metrics_path.clone(),
            source,
        })?;
        self.samples.flush().map_err(|source| SinkError {
            path: self.samples_path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_append() {
        let dir = tempfile::tempdir().unwrap();
        let rec = |step| MetricRecord {
            stage: "rl".into(),
            step,
            wall_time: 1.5,
            metrics: [("reward/add/mean".to_string(), 0.25)]
                .into_iter()
                .collect(),
        };
        {
            let mut sink = JsonlSink::open(dir.path()).unwrap();
            sink.record(&rec(1)).unwrap();
        }
        let mut sink = JsonlSink::open(dir.path()).unwrap();
        sink.record(&rec(2)).unwrap();
        sink.flush().unwrap();
        let back = JsonlSink::read_metrics(&dir.path().join("metrics.jsonl")).unwrap();
        assert_eq!(back, vec![rec(1), rec(2)]);
    }
}
