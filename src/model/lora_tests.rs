use super::*;
use crate::model::hf_dir::tiny_test_model;

/// Layer 0's q_proj of the tiny test model is (16, 16), its down_proj (16, 32).
fn adapter() -> Adapter {
    let dev = Device::Cpu;
    let t = |v: Vec<f32>, shape: (usize, usize)| Tensor::from_vec(v, shape, &dev).expect("t");
    let mut pairs = BTreeMap::new();
    pairs.insert(
        "model.layers.0.self_attn.q_proj.weight".to_string(),
        (
            t((0..32).map(|i| (i % 5) as f32 * 0.1).collect(), (2, 16)),
            t((0..32).map(|i| (i % 3) as f32 - 1.0).collect(), (16, 2)),
        ),
    );
    pairs.insert(
        "model.layers.0.mlp.down_proj.weight".to_string(),
        (
            t((0..64).map(|i| (i % 7) as f32 * -0.05).collect(), (2, 32)),
            t((0..32).map(|i| (i % 4) as f32 * 0.25).collect(), (16, 2)),
        ),
    );
    Adapter {
        rank: 2,
        alpha: 8.0,
        rslora: false,
        dropout: 0.05,
        target_modules: vec!["q_proj".into(), "down_proj".into()],
        pairs,
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().and_then(|t| t.to_vec1()).expect("values")
}

#[test]
fn an_adapter_round_trips_with_peft_names() {
    let dir = tempfile::tempdir().expect("dir");
    let a = adapter();
    a.save(dir.path(), "base").expect("save");
    let names: Vec<String> = {
        let t = candle_core::safetensors::load(dir.path().join(WEIGHTS_FILE), &Device::Cpu)
            .expect("load");
        let mut n: Vec<String> = t.keys().cloned().collect();
        n.sort();
        n
    };
    assert_eq!(
        names,
        [
            "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight",
            "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
        ]
    );
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join(CONFIG_FILE)).expect("config"),
    )
    .expect("json");
    assert_eq!(
        (
            &config["r"],
            &config["lora_alpha"],
            &config["bias"],
            &config["task_type"]
        ),
        (&json!(2), &json!(8.0), &json!("none"), &json!("CAUSAL_LM"))
    );
    let back = Adapter::load(dir.path(), &Device::Cpu).expect("load");
    assert_eq!((back.rank, back.alpha, back.scale()), (2, 8.0, 4.0));
    assert_eq!(back.target_modules, a.target_modules);
    for (name, (a0, b0)) in &a.pairs {
        let (a1, b1) = &back.pairs[name];
        assert_eq!((values(a0), values(b0)), (values(a1), values(b1)), "{name}");
    }
}

#[test]
fn merging_adds_the_scaled_product_to_each_adapted_weight() {
    let model = tiny_test_model("0123456789", 32, 4);
    let params = model.transformer.params();
    let a = adapter();
    a.check_against(params, "tiny").expect("fits");
    let name = "model.layers.0.self_attn.q_proj.weight";
    let before = params.tensor(name).expect("w").to_vec2::<f32>().expect("v");
    let untouched = values(
        &params
            .tensor("model.layers.0.self_attn.k_proj.weight")
            .expect("k"),
    );
    a.merge_into(params).expect("merge");
    let after = params.tensor(name).expect("w").to_vec2::<f32>().expect("v");
    // W'[i][j] = W[i][j] + (alpha / r) * sum_k B[i][k] A[k][j], computed here by hand in f64.
    let (am, bm) = &a.pairs[name];
    let (am, bm) = (
        am.to_vec2::<f32>().expect("a"),
        bm.to_vec2::<f32>().expect("b"),
    );
    for i in 0..16 {
        for j in 0..16 {
            let delta: f64 = (0..2).map(|k| bm[i][k] as f64 * am[k][j] as f64).sum();
            let want = before[i][j] as f64 + 4.0 * delta;
            assert!(
                (after[i][j] as f64 - want).abs() < 1e-5,
                "[{i}][{j}]: {} vs {want}",
                after[i][j]
            );
        }
    }
    assert_eq!(
        values(
            &params
                .tensor("model.layers.0.self_attn.k_proj.weight")
                .expect("k")
        ),
        untouched,
        "a weight without an adapter stays"
    );
}

#[test]
fn an_adapter_for_another_shape_names_the_weight_and_both_shapes() {
    let model = tiny_test_model("0123456789", 32, 4);
    let mut a = adapter();
    let dev = Device::Cpu;
    let wide = (
        Tensor::zeros((2, 24), DType::F32, &dev).expect("a"),
        Tensor::zeros((16, 2), DType::F32, &dev).expect("b"),
    );
    a.pairs
        .insert("model.layers.0.self_attn.q_proj.weight".into(), wide);
    a.pairs.insert(
        "model.layers.3.self_attn.v_proj.weight".into(),
        a.pairs["model.layers.0.mlp.down_proj.weight"].clone(),
    );
    let e = a
        .check_against(model.transformer.params(), "base 'tiny'")
        .expect_err("mismatch")
        .to_string();
    assert!(
        e.contains("'model.layers.0.self_attn.q_proj.weight' is [16, 16] in the model but the adapter's B A is [16, 24]"),
        "{e}"
    );
    assert!(
        e.contains("adapts 'model.layers.3.self_attn.v_proj.weight', which the model has not"),
        "{e}"
    );
}

#[test]
fn what_peft_can_write_and_this_cannot_apply_is_refused() {
    let a = adapter();
    let write = |edit: &dyn Fn(&mut Value), extra: Option<(&str, Tensor)>| {
        let dir = tempfile::tempdir().expect("dir");
        a.save(dir.path(), "base").expect("save");
        let path = dir.path().join(CONFIG_FILE);
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        edit(&mut config);
        std::fs::write(&path, config.to_string()).expect("write");
        if let Some((name, t)) = extra {
            let wpath = dir.path().join(WEIGHTS_FILE);
            let mut all = candle_core::safetensors::load(&wpath, &Device::Cpu).expect("load");
            all.insert(name.to_string(), t);
            candle_core::safetensors::save(&all, &wpath).expect("save");
        }
        Adapter::load(dir.path(), &Device::Cpu)
            .expect_err("refused")
            .to_string()
    };
    // (config key, the value written there, what the refusal says)
    let cases = [
        ("use_dora", json!(true), "DoRA adapters"),
        ("bias", json!("all"), "bias is 'all'"),
        (
            "rank_pattern",
            json!({"q_proj": 4}),
            "'rank_pattern' gives some modules their own rank",
        ),
        ("modules_to_save", json!(["lm_head"]), "'modules_to_save'"),
        ("peft_type", json!("IA3"), "peft_type is 'IA3'"),
        ("r", json!(0), "'r' must be a positive"),
    ];
    for (key, value, want) in cases {
        let e = write(&|c: &mut Value| c[key] = value.clone(), None);
        assert!(e.contains(want), "{want}: {e}");
    }
    let emb = Tensor::zeros((2, 13), DType::F32, &Device::Cpu).expect("t");
    let e = write(
        &|_| {},
        Some(("base_model.model.model.embed_tokens.lora_embedding_A", emb)),
    );
    assert!(
        e.contains("'base_model.model.model.embed_tokens.lora_embedding_A' is not the lora_A or lora_B matrix of a linear layer"),
        "{e}"
    );
    let lone = Tensor::zeros((2, 16), DType::F32, &Device::Cpu).expect("t");
    let e = write(
        &|_| {},
        Some((
            "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",
            lone,
        )),
    );
    assert!(
        e.contains("the adapter of 'model.layers.0.self_attn.k_proj.weight' has only one"),
        "{e}"
    );
}

/// A trainer worker's host copies hold the base's tensors and the adapter's under PEFT's names
/// side by side: `take_named` takes the adapter's out, pairs each A with its B, and leaves the
/// rest; an A without its B is refused, naming the weight.
#[test]
fn an_adapter_is_taken_out_of_a_host_copys_tensors_by_its_peft_names() {
    let settings = LoraSettings {
        rank: 2,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: vec!["q_proj".into(), "down_proj".into()],
        rslora: false,
    };
    let lora = LoraVars::from_adapter(&adapter(), &settings, "tiny", &Device::Cpu).expect("vars");
    let mut tensors: BTreeMap<String, Tensor> = lora
        .named_vars()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    let base = Tensor::zeros((16, 16), DType::F32, &Device::Cpu).expect("base");
    tensors.insert("model.layers.0.self_attn.q_proj.weight".into(), base);
    let taken = LoraVars::take_named(&settings, "tiny", &mut tensors).expect("take");
    assert_eq!(
        tensors.keys().collect::<Vec<_>>(),
        ["model.layers.0.self_attn.q_proj.weight"]
    );
    for name in adapter().pairs.keys() {
        let ((a, b), (ta, tb)) = (
            lora.factors(name).expect("pair"),
            taken.factors(name).expect("taken pair"),
        );
        assert_eq!(values(a.as_tensor()), values(ta.as_tensor()), "{name} A");
        assert_eq!(values(b.as_tensor()), values(tb.as_tensor()), "{name} B");
    }

    let mut lone: BTreeMap<String, Tensor> = lora
        .named_vars()
        .into_iter()
        .filter(|(n, _)| !n.contains("down_proj.lora_B"))
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    let e = LoraVars::take_named(&settings, "tiny", &mut lone)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("'model.layers.0.mlp.down_proj.weight' has only one of lora_A and lora_B"),
        "{e}"
    );
}

/// `target_modules` as PEFT and ROLL write it: a list, `all-linear` (PEFT), `all` (ROLL's
/// `lora_target`), or names separated by commas; anything else names the forms it takes.
#[test]
fn target_modules_take_peft_and_rolls_forms() {
    let parse = |yaml: &str| serde_saphyr::from_str::<LoraSettings>(yaml);
    let targets = |yaml: &str| parse(yaml).expect(yaml).target_modules;
    assert_eq!(
        targets("{target_modules: [q_proj, v_proj]}"),
        ["q_proj", "v_proj"]
    );
    assert_eq!(
        targets("{target_modules: 'q_proj, v_proj'}"),
        ["q_proj", "v_proj"]
    );
    assert_eq!(targets("{target_modules: all-linear}"), LINEAR_MODULES);
    assert_eq!(targets("{target_modules: all}"), LINEAR_MODULES);
    assert_eq!(targets("{rank: 4}"), LINEAR_MODULES);
    let e = parse("{target_modules: {q_proj: 1}}")
        .expect_err("a map")
        .to_string();
    assert!(
        e.contains("'all-linear', 'all' or names separated by commas"),
        "{e}"
    );
}
