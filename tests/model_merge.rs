//! `roll-tui model merge` end to end: a PEFT-format adapter written beside a model made by `model
//! init` merges into exactly `W + (alpha / r) B A`, the merged directory loads and scores
//! differently from the base, and bad adapters or outputs are refused with what and where.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use common::{bin, ok, refused};
use roll::model::lora::Adapter;

fn init(dir: &Path) {
    ok(bin()
        .args([
            "model", "init", "--arch", "qwen2", "--hidden", "32", "--layers", "2",
        ])
        .args([
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--intermediate",
            "64",
            "--seed",
            "5",
        ])
        .arg("--out")
        .arg(dir)
        .output()
        .unwrap());
}

fn weights(dir: &Path) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap()
}

/// An adapter of layer 1's v_proj ((16, 32) with 2 KV heads of 8) and up_proj ((64, 32)).
fn adapter(in_dim: usize) -> Adapter {
    let t = |n: usize, shape: (usize, usize), k: f32| {
        let v: Vec<f32> = (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) * k).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    };
    let mut pairs = BTreeMap::new();
    pairs.insert(
        "model.layers.1.self_attn.v_proj.weight".to_string(),
        (t(3 * in_dim, (3, in_dim), 0.01), t(16 * 3, (16, 3), 0.02)),
    );
    pairs.insert(
        "model.layers.1.mlp.up_proj.weight".to_string(),
        (t(3 * in_dim, (3, in_dim), -0.01), t(64 * 3, (64, 3), 0.03)),
    );
    Adapter {
        rank: 3,
        alpha: 6.0,
        rslora: false,
        dropout: 0.0,
        target_modules: vec!["v_proj".into(), "up_proj".into()],
        pairs,
    }
}

fn score(dir: &Path) -> String {
    ok(bin()
        .args(["model", "score"])
        .arg(dir)
        .args(["--prompt", "12+3=", "--completion", "15", "--json"])
        .output()
        .unwrap())
}

#[test]
fn a_merged_adapter_adds_its_scaled_product_and_the_result_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (base, adapter_dir, out) = (
        dir.path().join("base"),
        dir.path().join("adapter"),
        dir.path().join("merged"),
    );
    init(&base);
    let a = adapter(32);
    a.save(&adapter_dir, "base").unwrap();
    let said = ok(bin()
        .args(["model", "merge"])
        .arg(&base)
        .arg("--adapter")
        .arg(&adapter_dir)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap());
    assert!(
        said.contains("merged 2 LoRA pairs (rank 3, scale 2)"),
        "{said}"
    );
    let (before, after) = (weights(&base), weights(&out));
    for (name, w) in &before {
        let got = &after[name];
        let want = match a.pairs.get(name) {
            // W + (6 / 3) B A
            Some((am, bm)) => (w + (bm.matmul(am).unwrap() * 2.0).unwrap()).unwrap(),
            None => w.clone(),
        };
        let diff = (got - &want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-6, "{name}: off by {diff}");
    }
    // The tokenizer and config came along: the merged directory scores, and differently.
    assert_ne!(score(&base), score(&out));
}

#[test]
fn bad_adapters_and_outputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    init(&base);
    let merge = |adapter: &Path, out: &Path| {
        refused(
            bin()
                .args(["model", "merge"])
                .arg(&base)
                .arg("--adapter")
                .arg(adapter)
                .arg("--out")
                .arg(out)
                .output()
                .unwrap(),
        )
    };
    // Made for a model of hidden size 48.
    let wrong = dir.path().join("wrong");
    adapter(48).save(&wrong, "other").unwrap();
    let e = merge(&wrong, &dir.path().join("o1"));
    assert!(
        e.contains("'model.layers.1.self_attn.v_proj.weight' is [16, 32] in the model but the adapter's B A is [16, 48]"),
        "{e}"
    );
    assert!(
        !dir.path().join("o1").exists(),
        "nothing written on a refusal"
    );
    let e = merge(&dir.path().join("nowhere"), &dir.path().join("o2"));
    assert!(e.contains("nowhere/adapter_config.json"), "{e}");
    assert!(e.contains("cannot read the adapter's config"), "{e}");
    let good = dir.path().join("good");
    adapter(32).save(&good, "base").unwrap();
    let e = merge(&good, &base);
    assert!(e.contains("is the base model's directory"), "{e}");
    // The base is untouched by all of it.
    let w = weights(&base);
    assert_eq!(w["model.layers.1.mlp.up_proj.weight"].dtype(), DType::F32);
}
