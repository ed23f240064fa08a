//! The worker side of offloads, driven in memory (no socket, no process): actor_infer and the
//! reference let go of weights their host copy already holds without writing them again, and a
//! trainer's worker rewrites its own copy in place.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::actor_infer::{InferCall, InferInit, InferReply};
use super::actor_train::ActorTrainCall;
use super::reference::{ReferenceCall, ReferenceInit};
use super::remote::ModelReply;
use super::{Calls, Role, TrainInit};
use crate::config::Dtype;
use crate::config::load::from_yaml_str;
use crate::model::{Arch, InitOptions, LoadedModel, init_model_dir, load_model_dir};
use crate::scheduler::host_copy::{HostArea, tensor_bytes};
use crate::worker::serve::InMemory;

fn tiny(dir: &Path) -> LoadedModel {
    init_model_dir(
        dir,
        &InitOptions {
            arch: Arch::Qwen2,
            hidden: 32,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            intermediate: 64,
            head_dim: None,
            tie_embeddings: true,
            max_positions: 32,
            rope_theta: 10_000.0,
            chars: "0123456789+=".into(),
            dtype: "float32".into(),
            seed: 3,
        },
    )
    .unwrap();
    load_model_dir(dir, None, &candle_core::Device::Cpu).unwrap()
}

/// What a rewrite or a new file would change: the inode, the modification time and the bytes.
fn identity(path: &Path) -> (u64, std::time::SystemTime, Vec<u8>) {
    let meta = std::fs::metadata(path).unwrap();
    (
        meta.ino(),
        meta.modified().unwrap(),
        std::fs::read(path).unwrap(),
    )
}

fn weight_bytes(model: &LoadedModel) -> u64 {
    let tensors = model.transformer.params().named_tensors();
    tensors.iter().map(|(_, t)| tensor_bytes(t)).sum()
}

#[test]
fn actor_infer_offloads_by_letting_go_of_the_weights_its_host_copy_holds() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let area = HostArea::new().unwrap();
    let tensors = model.transformer.params().named_tensors();
    area.write("actor_infer", &tensors).unwrap();
    let path = area.path("actor_infer");
    let mut worker = InMemory::start(super::actor_infer::serve::serve);
    let init = InferInit {
        model_dir: dir.path().to_path_buf(),
        weights: path.clone(),
        dtype: Dtype::Float32,
        max_batch: 4,
    };
    let loaded: InferReply = worker.call(&InferCall::Init(init)).unwrap();
    assert!(matches!(loaded, InferReply::Loaded { .. }), "{loaded:?}");

    // A copy that is not these weights (a tensor short) is refused, naming it; the model stays.
    area.write("other", &tensors[1..]).unwrap();
    let other = area.path("other");
    let refused = worker
        .call::<_, InferReply>(&InferCall::Offload { path: other })
        .unwrap_err();
    assert!(refused.contains("does not hold these weights"), "{refused}");
    assert!(refused.contains("other.safetensors"), "{refused}");

    let before = identity(&path);
    let moved: InferReply = worker
        .call(&InferCall::Offload { path: path.clone() })
        .unwrap();
    assert_eq!(
        moved,
        InferReply::Moved {
            bytes: weight_bytes(&model)
        }
    );
    assert!(
        identity(&path) == before,
        "the offload rewrote the host copy"
    );
    // Offloaded: the weights are gone from the worker until the reload.
    let again = worker
        .call::<_, InferReply>(&InferCall::Offload { path: path.clone() })
        .unwrap_err();
    assert!(
        again.contains("cannot 'offload' while the model is offloaded"),
        "{again}"
    );
    let reloaded: InferReply = worker.call(&InferCall::Reload { path }).unwrap();
    assert_eq!(
        reloaded,
        InferReply::Moved {
            bytes: weight_bytes(&model)
        }
    );
}

#[test]
fn the_reference_offloads_by_letting_go_of_the_weights_its_host_copy_holds() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let area = HostArea::new().unwrap();
    let tensors = model.transformer.params().named_tensors();
    area.write("reference", &tensors).unwrap();
    let path = area.path("reference");
    let mut worker = InMemory::start(super::reference::serve::serve);
    let init = ReferenceInit {
        model_config: model.transformer.config().to_hf_json(),
        pad_id: 0,
        weights: path.clone(),
    };
    let loaded: ModelReply = worker.call(&ReferenceCall::Init(Box::new(init))).unwrap();
    assert!(matches!(loaded, ModelReply::Loaded { .. }), "{loaded:?}");

    area.write("other", &tensors[1..]).unwrap();
    let refused = worker
        .call::<_, ModelReply>(&ReferenceCall::Offload {
            path: area.path("other"),
        })
        .unwrap_err();
    assert!(refused.contains("does not hold these weights"), "{refused}");

    let before = identity(&path);
    let moved: ModelReply = worker
        .call(&ReferenceCall::Offload { path: path.clone() })
        .unwrap();
    assert_eq!(
        moved,
        ModelReply::Moved {
            bytes: weight_bytes(&model)
        }
    );
    assert!(
        identity(&path) == before,
        "the offload rewrote the host copy"
    );
    let reloaded: ModelReply = worker.call(&ReferenceCall::Reload { path }).unwrap();
    assert_eq!(
        reloaded,
        ModelReply::Moved {
            bytes: weight_bytes(&model)
        }
    );
}

#[test]
fn a_trainer_worker_rewrites_its_host_copy_in_place_from_the_second_offload() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let area = HostArea::new().unwrap();
    area.write("policy", &model.transformer.params().named_tensors())
        .unwrap();
    let run: crate::config::RunConfig = from_yaml_str(
        "name: t\nmodel: { init: { arch: qwen2, hidden: 32, layers: 2, heads: 4, kv_heads: 2, \
         intermediate: 64, chars: \"0\" } }\n\
         data: { domains: [ { name: d, synthetic: { task: addition, count: 1 }, reward: exact_match } ] }\n\
         rl: { steps: 1, prompts_per_step: 2, group_size: 4 }\n",
        "<test>",
    )
    .unwrap();
    let init = TrainInit {
        model_config: model.transformer.config().to_hf_json(),
        pad_id: 0,
        weights: area.path("policy"),
        rl: run.rl.unwrap(),
        total_updates: 10,
        moments: None,
        optimizer_steps: 0,
    };
    let mut worker = InMemory::start(|queue| {
        super::train_serve::serve::<ActorTrainCall>(Role::ActorTrain, &Calls::new(queue));
    });
    let loaded: ModelReply = worker.call(&ActorTrainCall::Init(Box::new(init))).unwrap();
    assert!(matches!(loaded, ModelReply::Loaded { .. }), "{loaded:?}");

    // Weights and both AdamW moments.
    let state = ModelReply::Moved {
        bytes: 3 * weight_bytes(&model),
    };
    let path = area.path("actor_train");
    let offload = ActorTrainCall::Offload { path: path.clone() };
    assert_eq!(worker.call::<_, ModelReply>(&offload).unwrap(), state);
    let first = identity(&path);
    let reload = ActorTrainCall::Reload { path: path.clone() };
    assert_eq!(worker.call::<_, ModelReply>(&reload).unwrap(), state);
    assert_eq!(worker.call::<_, ModelReply>(&offload).unwrap(), state);
    let (inode, _, bytes) = identity(&path);
    // The same file, its bytes rewritten with the same state (nothing trained in between).
    assert_eq!(inode, first.0, "the second offload wrote a new file");
    assert!(bytes == first.2, "the rewritten copy differs");
}
