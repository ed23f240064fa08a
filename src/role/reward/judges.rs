//! Time-sharing the judge models of this process (`llm_judge` rewards): offloading writes each
//! resident judge's weights to a host copy and drops them, so the memory is really given back;
//! reloading rebuilds the judge from that copy. A judge is frozen, so its host copy, once written,
//! stays current: later offloads only drop the weights.
//!
//! Works on the judges a reward role loaded into this process ([`llm_judge::judges`]): in the
//! trainer for an in-process reward role, in each `roll-tui worker reward` for a pool. Judges the
//! process holds for other uses are left alone.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::model::LoadedModel;
use crate::reward::llm_judge::{JudgeSlot, OffloadedJudge, judges};
use crate::role::train_serve::build_transformer;
use crate::scheduler::host_copy::{read_tensors, write_tensors};

/// The host copy of the judge from `model` in `dir`: one file per judge directory.
fn host_copy(dir: &Path, model: &Path) -> PathBuf {
    let mut h = DefaultHasher::new();
    model.hash(&mut h);
    dir.join(format!("judge-{:016x}.safetensors", h.finish()))
}

/// Move the judges from the directories `models` that are resident to their host copies in `dir`
/// and drop their weights; bytes moved off the device.
pub fn offload(dir: &Path, models: &[PathBuf]) -> Result<u64, String> {
    let mut judges = judges();
    let mut bytes = 0;
    for (model, slot) in judges.iter_mut().filter(|(m, _)| models.contains(m)) {
        let JudgeSlot::Resident(loaded) = slot else {
            continue;
        };
        let path = host_copy(dir, model);
        if !path.exists() {
            write_tensors(&path, &loaded.transformer.params().named_tensors())
                .map_err(|e| format!("offloading the judge '{}': {e}", model.display()))?;
        }
        bytes += loaded.transformer.params().bytes() as u64;
        // Scoring holds its own reference only while it computes, and never while the reward
        // role is being moved; should one remain, its weights go when it is dropped.
        let offloaded = OffloadedJudge {
            config: loaded.config().clone(),
            tokenizer: loaded.tokenizer.clone(),
            eos_ids: loaded.eos_ids.clone(),
            pad_id: loaded.pad_id,
            host_copy: path,
        };
        *slot = JudgeSlot::Offloaded(Box::new(offloaded));
    }
    // The weights just dropped go back to the OS now, for the roles that come in.
    crate::allocator::release_freed_memory();
    Ok(bytes)
}

/// Bring the offloaded judges from the directories `models` back from their host copies; bytes
/// moved onto the device.
pub fn reload(models: &[PathBuf]) -> Result<u64, String> {
    let mut judges = judges();
    let mut bytes = 0;
    for (model, slot) in judges.iter_mut().filter(|(m, _)| models.contains(m)) {
        let JudgeSlot::Offloaded(off) = slot else {
            continue;
        };
        let what = |e: String| format!("reloading the judge '{}': {e}", model.display());
        let tensors = read_tensors(
            &off.host_copy,
            &crate::device::tool_device().map_err(|e| e.to_string())?,
        )
        .map_err(|e| what(e.to_string()))?;
        let transformer =
            build_transformer(&off.config, tensors.into_iter().collect(), &off.host_copy)
                .map_err(what)?;
        let loaded = LoadedModel {
            transformer,
            tokenizer: off.tokenizer.clone(),
            eos_ids: off.eos_ids.clone(),
            pad_id: off.pad_id,
        };
        bytes += loaded.transformer.params().bytes() as u64;
        *slot = JudgeSlot::Resident(Arc::new(loaded));
    }
    Ok(bytes)
}
