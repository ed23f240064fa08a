//! `distill.cache`: the teacher's top k of each batch kept on disk, so that a run that sees the
//! same batches again (the same data, seed and batch size: a rerun with another student, another
//! objective or weight) asks the teacher nothing. A batch's file is named by a hash of its token
//! rows, k, the temperature, the ids offered and the dtype; `teacher.json` records whose top k the directory
//! holds (the teacher's directory, a hash of its config and tokenizer, and each weight file's size
//! and modification time), and a cache of another teacher is refused rather than read.

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde_json::{Value, json};

use crate::pipeline::RunError;
use crate::role::rows::Rows;
use crate::role::teacher::TopK;
use crate::scheduler::host_copy::{read_tensors, write_tensors};
use crate::seed::fnv1a;

pub struct TopKCache {
    dir: PathBuf,
}

const IDENTITY: &str = "teacher.json";

fn err(path: &Path, what: impl std::fmt::Display) -> RunError {
    RunError::Setup(format!("distill.cache '{}': {what}", path.display()))
}

impl TopKCache {
    /// The cache at `dir` for the teacher at `teacher`: created (with its identity) when new,
    /// refused when it holds another teacher's top k.
    pub fn open(dir: &Path, teacher: &Path) -> Result<TopKCache, RunError> {
        std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
        let identity = identity(teacher)?;
        let path = dir.join(IDENTITY);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let held: Value = serde_json::from_str(&text)
                    .map_err(|e| err(&path, format!("not the cache's identity ({e})")))?;
                if held != identity {
                    return Err(err(
                        dir,
                        format!(
                            "it holds the top k of another teacher ({}; this run's is {}): remove \
                             the directory or name another distill.cache",
                            held, identity
                        ),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let text = serde_json::to_string_pretty(&identity).map_err(|e| err(&path, e))?;
                std::fs::write(&path, text).map_err(|e| err(&path, e))?;
            }
            Err(e) => return Err(err(&path, e)),
        }
        Ok(TopKCache {
            dir: dir.to_path_buf(),
        })
    }

    /// Where the top k of `rows` (k, the temperature, the ids offered and the dtype the teacher
    /// computes in alike) is kept.
    pub fn path_of(
        &self,
        rows: &Rows<'_>,
        (k, temperature, vocab): (usize, f64, usize),
        dtype: &str,
    ) -> PathBuf {
        let mut bytes = dtype.as_bytes().to_vec();
        for v in [
            k as u64,
            temperature.to_bits(),
            vocab as u64,
            rows.width as u64,
        ] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        for (p, r) in rows.prompts.iter().zip(rows.responses) {
            for part in [p, r] {
                bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
                for id in part {
                    bytes.extend_from_slice(&id.to_le_bytes());
                }
            }
        }
        self.dir
            .join(format!("topk-{:016x}.safetensors", fnv1a(&bytes)))
    }

    /// The kept top k at `path`, if any.
    pub fn read(&self, path: &Path, device: &Device) -> Result<Option<TopK>, RunError> {
        if !path.is_file() {
            return Ok(None);
        }
        let mut t = read_tensors(path, device).map_err(|e| err(path, e))?;
        match (t.remove("ids"), t.remove("logp")) {
            (Some(ids), Some(logp)) => Ok(Some(TopK { ids, logp })),
            _ => Err(err(path, "a cached batch without its 'ids' and 'logp'")),
        }
    }

    /// Keep `top` at `path`.
    pub fn write(&self, path: &Path, top: &TopK) -> Result<(), RunError> {
        write_tensors(
            path,
            &[
                ("ids".to_string(), top.ids.clone()),
                ("logp".to_string(), top.logp.clone()),
            ],
        )
        .map(drop)
        .map_err(|e| err(path, e))
    }
}

/// What names a teacher: its directory, a hash of its config and tokenizer, and each weight
/// file's size and modification time (a teacher trained again in place changes them).
fn identity(teacher: &Path) -> Result<Value, RunError> {
    let dir = teacher.canonicalize().map_err(|e| err(teacher, e))?;
    let mut text = Vec::new();
    for name in ["config.json", "tokenizer.json"] {
        let bytes = std::fs::read(dir.join(name)).map_err(|e| err(&dir.join(name), e))?;
        text.extend(bytes);
        text.push(0);
    }
    let mut weights = vec![];
    let entries = std::fs::read_dir(&dir).map_err(|e| err(&dir, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.ends_with(".safetensors") || name == "optimizer.safetensors" {
            continue;
        }
        let meta = entry.metadata().map_err(|e| err(&entry.path(), e))?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        weights.push(
            json!({ "file": name, "bytes": meta.len(), "modified_ns": modified.to_string() }),
        );
    }
    weights.sort_by_key(|w| w["file"].as_str().map(str::to_string));
    Ok(json!({
        "teacher": dir.display().to_string(),
        "config_and_tokenizer": format!("{:016x}", fnv1a(&text)),
        "weights": weights,
    }))
}
