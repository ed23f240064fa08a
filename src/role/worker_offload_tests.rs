//! The worker side of offloads, driven in memory (no socket, no process): actor_infer and the
//! reference let go of weights their host copy already holds without writing them again, and a
//! trainer's worker rewrites its copies (each step's weights, its offload) in place.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::actor_infer::{InferCall, InferInit, InferReply};
use super::actor_train::ActorTrainCall;
use super::reference::{ReferenceCall, ReferenceInit};
use super::remote::ModelReply;
use super::step_file::write_actor;
use super::{Calls, Role, TrainInit};
use crate::config::Dtype;
use crate::model::{LoadedModel, save_model_dir};
use crate::scheduler::host_copy::{HostArea, read_tensors};
use crate::worker::serve::InMemory;

/// The name of the host copy an offload test's worker is loaded from.
const HOST_COPY: &str = "weights";

/// The epochs tests' tiny policy, saved to `dir` as a model directory (actor_infer loads one).
fn tiny(dir: &Path) -> LoadedModel {
    let model = super::epochs::tests::model();
    save_model_dir(dir, &model).unwrap();
    model
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
    model.transformer.params().bytes() as u64
}

/// A worker loaded from the host copy at `path` (holding `tensors`) offloads by letting go of its
/// weights: a copy that is not them (a tensor short) is refused, naming it, and the model stays;
/// the copy itself is left as it was; offloaded, the worker says so (`offloaded`) to another
/// offload; the reload brings the same bytes back.
fn offloads_without_writing<Req: serde::Serialize, Rep>(
    worker: &mut InMemory,
    area: &HostArea,
    tensors: &[(String, candle_core::Tensor)],
    offload: impl Fn(PathBuf) -> Req,
    reload: impl Fn(PathBuf) -> Req,
    moved: Rep,
    offloaded: &str,
) where
    Rep: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    area.write("other", &tensors[1..]).unwrap();
    let refused = worker
        .call::<_, Rep>(&offload(area.path("other")))
        .unwrap_err();
    assert!(refused.contains("does not hold these weights"), "{refused}");
    assert!(refused.contains("other.safetensors"), "{refused}");

    let path = area.path(HOST_COPY);
    let before = identity(&path);
    assert_eq!(
        worker.call::<_, Rep>(&offload(path.clone())).unwrap(),
        moved
    );
    assert!(
        identity(&path) == before,
        "the offload rewrote the host copy"
    );
    // Offloaded: the weights are gone from the worker until the reload.
    let again = worker.call::<_, Rep>(&offload(path.clone())).unwrap_err();
    assert!(again.contains(offloaded), "{again}");
    assert_eq!(worker.call::<_, Rep>(&reload(path)).unwrap(), moved);
}

/// An actor_infer worker (in memory) loaded with the tiny policy from its host copy in `area`;
/// the policy and its tensors.
fn infer_worker(
    dir: &Path,
    area: &HostArea,
) -> (InMemory, LoadedModel, Vec<(String, candle_core::Tensor)>) {
    let model = tiny(dir);
    let tensors = model.transformer.params().named_tensors();
    area.write(HOST_COPY, &tensors).unwrap();
    let mut worker = InMemory::start(super::actor_infer::serve::serve);
    let init = InferInit {
        model_dir: dir.to_path_buf(),
        weights: area.path(HOST_COPY),
        adapter: None,
        dtype: Dtype::Float32,
        max_batch: 4,
        multi_turn: false,
        device: crate::device::DeviceSpec::CPU,
    };
    let loaded: InferReply = worker.call(&InferCall::Init(init)).unwrap();
    assert!(matches!(loaded, InferReply::Loaded { .. }), "{loaded:?}");
    (worker, model, tensors)
}

#[test]
fn actor_infer_offloads_by_letting_go_of_the_weights_its_host_copy_holds() {
    let dir = tempfile::tempdir().unwrap();
    let area = HostArea::new().unwrap();
    let (mut worker, model, tensors) = infer_worker(dir.path(), &area);
    offloads_without_writing(
        &mut worker,
        &area,
        &tensors,
        |path| InferCall::Offload { path, write: false },
        |path| InferCall::Reload {
            path,
            adapter: None,
            ipc: None,
        },
        InferReply::Moved {
            bytes: weight_bytes(&model),
        },
        "cannot 'offload' while the model is offloaded",
    );
}

/// After a weight sync by CUDA IPC the host copy is behind the worker's weights: an offload with
/// `write` puts the worker's own weights into it (here over zeros), where one without it would
/// leave the zeros for the reload. An IPC sync the worker cannot take (tensors on the CPU) is
/// refused and leaves its weights as they were.
#[test]
fn actor_infer_writes_its_weights_into_a_host_copy_that_is_behind_before_letting_go() {
    let dir = tempfile::tempdir().unwrap();
    let area = HostArea::new().unwrap();
    let (mut worker, model, tensors) = infer_worker(dir.path(), &area);
    let path = area.path(HOST_COPY);
    let handle = crate::device::IpcHandle {
        handle: vec![0; 64],
        device: 0,
        len: std::fs::metadata(&path).unwrap().len(),
    };
    let sync = InferCall::SetWeights {
        path: path.clone(),
        adapter: None,
        ipc: Some(handle),
    };
    let refused = worker.call::<_, InferReply>(&sync).unwrap_err();
    assert!(refused.contains("CUDA"), "{refused}");
    // The copy falls behind: zeros where the worker holds the weights.
    let zeros: Vec<(String, candle_core::Tensor)> = tensors
        .iter()
        .map(|(name, t)| (name.clone(), t.zeros_like().unwrap()))
        .collect();
    area.overwrite(HOST_COPY, &zeros).unwrap();
    let offload = InferCall::Offload {
        path: path.clone(),
        write: true,
    };
    assert_eq!(
        worker.call::<_, InferReply>(&offload).unwrap(),
        InferReply::Moved {
            bytes: weight_bytes(&model),
        }
    );
    let copy = read_tensors(&path, &candle_core::Device::Cpu).unwrap();
    for (name, t) in &tensors {
        let diff = (&copy[name] - t).unwrap().abs().unwrap().max_all().unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0, "{name}");
    }
}

#[test]
fn the_reference_offloads_by_letting_go_of_the_weights_its_host_copy_holds() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let area = HostArea::new().unwrap();
    let tensors = model.transformer.params().named_tensors();
    area.write(HOST_COPY, &tensors).unwrap();
    let mut worker = InMemory::start(super::reference::serve::serve);
    let init = ReferenceInit {
        model_config: model.transformer.config().to_hf_json(),
        pad_id: 0,
        weights: area.path(HOST_COPY),
        device: crate::device::DeviceSpec::CPU,
    };
    let loaded: ModelReply = worker.call(&ReferenceCall::Init(Box::new(init))).unwrap();
    assert!(matches!(loaded, ModelReply::Loaded { .. }), "{loaded:?}");
    offloads_without_writing(
        &mut worker,
        &area,
        &tensors,
        |path| ReferenceCall::Offload { path },
        |path| ReferenceCall::Reload { path },
        ModelReply::Moved {
            bytes: weight_bytes(&model),
        },
        "cannot 'offload' while the reference is offloaded",
    );
}

#[test]
fn a_trainer_worker_rewrites_its_copies_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let area = HostArea::new().unwrap();
    let weights = area.path("policy");
    area.write("policy", &model.transformer.params().named_tensors())
        .unwrap();
    let init = TrainInit {
        model_config: model.transformer.config().to_hf_json(),
        pad_id: 0,
        weights: weights.clone(),
        recipe: super::epochs::tests::rl().actor_recipe(),
        total_updates: 10,
        moments: None,
        optimizer_steps: 0,
        device: crate::device::DeviceSpec::CPU,
        lora: None,
    };
    let mut worker = InMemory::start(|queue| {
        super::train_serve::serve::<ActorTrainCall>(Role::ActorTrain, &Calls::new(queue));
    });
    let loaded: ModelReply = worker.call(&ActorTrainCall::Init(Box::new(init))).unwrap();
    assert!(matches!(loaded, ModelReply::Loaded { .. }), "{loaded:?}");

    // Each step's new weights go over the file the worker was loaded from, in place.
    let step_file = area.path("step");
    write_actor(&super::epochs::tests::step(4), &step_file).unwrap();
    let step = ActorTrainCall::Step {
        step: step_file,
        weights_out: weights.clone(),
    };
    let before = identity(&weights);
    let trained: ModelReply = worker.call(&step).unwrap();
    assert!(matches!(trained, ModelReply::Trained { .. }), "{trained:?}");
    let after = identity(&weights);
    assert_eq!(after.0, before.0, "the step's weights went to a new file");
    assert!(after.2 != before.2, "the step's weights were not written");

    // Weights and both AdamW moments; from the second offload on, over the first one's file.
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
    // And the state is the trained one: the copy's weights are the step's.
    let copy = read_tensors(&path, &candle_core::Device::Cpu).unwrap();
    let out = read_tensors(&weights, &candle_core::Device::Cpu).unwrap();
    for (name, w) in &out {
        let bits = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(bits(&copy[name]), bits(w), "{name}");
    }
}
