//! Devices through the binary: every bad device request gets a clear error (what, where, how to
//! fix it), and `workers.devices.kernels: generic` runs the device-generic path end to end,
//! worker processes included, learning as the fused kernels do.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::{bin, deterministic_metrics, refused, roll, run_quiet, write_config};

const RL: &str = r#"
name: dev
seed: 3
rl:
  steps: 2
  prompts_per_step: 4
  group_size: 3
  rollout_batch: 6
  sampling: { temperature: 1.0, max_new_tokens: 4 }
  optimizer: { lr: 0.001 }
"#;

/// A model directory made by `roll-tui model init`.
fn tiny_model(dir: &std::path::Path) -> std::path::PathBuf {
    let model = dir.join("m");
    let out = bin()
        .args([
            "model", "init", "--arch", "qwen2", "--hidden", "16", "--layers", "1",
        ])
        .args([
            "--heads",
            "2",
            "--kv-heads",
            "1",
            "--intermediate",
            "32",
            "--out",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    model
}

#[test]
fn a_bad_kernel_choice_or_device_name_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .env("ROLL_KERNELS", "fast")
        .arg("runs")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: ROLL_KERNELS=\"fast\" is not a kernel choice: expected auto or generic"
    );
    let model = tiny_model(dir.path());
    let score = |device: &str| {
        let out = bin()
            .env("ROLL_DEVICE", device)
            .args(["model", "score"])
            .arg(&model)
            .args(["--prompt", "1+1=", "--completion", "2"])
            .output()
            .unwrap();
        refused(out)
    };
    assert!(
        score("gpu").contains("unknown device 'gpu': expected cpu, cuda or cuda:N"),
        "{}",
        score("gpu")
    );
    if !roll::device::CUDA_BUILT {
        let e = score("cuda:1");
        assert!(
            e.contains("device 'cuda:1': this roll-tui was built without CUDA")
                && e.contains("--features cuda"),
            "{e}"
        );
    }
}

/// `kind: cuda` in a config: a CPU build says how to get CUDA (at load, with every other
/// problem); a CUDA build without a usable driver says the driver is missing; one with a GPU
/// lists the devices when the mapping names one that is not there.
#[test]
fn cuda_devices_that_cannot_be_had_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let devices = |kind_count: &str| {
        let cfg = write_config(
            dir.path(),
            "cuda",
            &format!("{RL}workers:\n  devices: {{ {kind_count} }}\n"),
        );
        refused(roll(&store, &["run", "--quiet", cfg.to_str().unwrap()]))
    };
    let e = devices("kind: cuda");
    if !roll::device::CUDA_BUILT {
        assert!(
            e.contains("workers.devices.kind is cuda but this roll-tui was built without CUDA")
                && e.contains("cargo build --release --features cuda")
                && e.contains("kernels/cuda/toolkit.sh"),
            "{e}"
        );
        return;
    }
    match roll::device::open(roll::device::DeviceSpec::cuda(0)) {
        Err(roll::device::DeviceError::NoDriver { .. }) => {
            assert!(
                e.contains("device 'cuda:0': no usable CUDA driver: cuInit failed"),
                "{e}"
            );
        }
        Err(other) => panic!("cuda:0 could not be opened for another reason: {other}"),
        Ok(_) => {
            // A GPU machine: a mapping past its devices lists them.
            let e = devices("kind: cuda, count: 64");
            assert!(
                e.contains("does not exist: this machine has") && e.contains("cuda:0 ("),
                "{e}"
            );
        }
    }
}

/// The generic path end to end, actor_infer in a worker process (which inherits the choice):
/// the same series as the fused run, each value close to the fused run's, and not all of them
/// the same bits (another implementation ran).
#[test]
fn a_generic_run_learns_what_the_fused_run_learns() {
    let dir = tempfile::tempdir().unwrap();
    let placement = ["workers.actor_infer.mode=process"];
    let fused = run_quiet(dir.path(), "dev", RL, &placement);
    let generic_dir = dir.path().join("generic");
    std::fs::create_dir(&generic_dir).unwrap();
    let generic = run_quiet(
        &generic_dir,
        "dev",
        RL,
        &[placement[0], "workers.devices.kernels=generic"],
    );
    let (a, b) = (
        deterministic_metrics(&generic, "dev"),
        deterministic_metrics(&fused, "dev"),
    );
    assert_eq!(a.len(), b.len());
    let mut differ = false;
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x["key"], y["key"]);
        let (xs, ys) = (
            x["values"].as_array().unwrap(),
            y["values"].as_array().unwrap(),
        );
        assert_eq!(xs.len(), ys.len(), "{}", x["key"]);
        for (u, v) in xs.iter().zip(ys) {
            let (u, v) = (u.as_f64().unwrap(), v.as_f64().unwrap());
            assert!(
                (u - v).abs() <= 1e-3 * (1.0 + v.abs()),
                "{} {}: generic {u} vs fused {v}",
                x["stage"],
                x["key"]
            );
            differ |= u.to_bits() != v.to_bits();
        }
    }
    assert!(
        differ,
        "the generic run gave the fused run's bits: its kernels did not change"
    );
}

/// `roll-tui devices` lists the CPU and says why there is no GPU where there is none; its
/// `--check` then fails, naming that (a check that could not run is no pass).
#[test]
fn devices_lists_what_there_is_and_check_needs_a_gpu() {
    if roll::device::cuda_devices().is_ok_and(|d| !d.is_empty()) {
        return; // a GPU machine: tests/cuda_kernels.rs checks the listing and the checks there
    }
    let out = bin().arg("devices").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("cpu "), "{text}");
    let why = if roll::device::CUDA_BUILT {
        "no usable CUDA driver"
    } else {
        "built without CUDA"
    };
    assert!(
        text.contains("cuda     none: ") && text.contains(why),
        "{text}"
    );
    let out = bin().args(["devices", "--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("error: no CUDA device to check"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
