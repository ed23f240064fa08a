//! `roll-tui model init|score|merge`.

use anyhow::{Result, bail};

use super::store_cmd::with_store;
use super::{InitArgs, MergeArgs, ScoreArgs};
use crate::debugger::open::{ModelSpec, run_model};
use crate::model::{InitOptions, init_model_dir, load_model_dir, save_model_dir};

pub fn init(args: InitArgs) -> Result<()> {
    let opts = InitOptions {
        arch: args.arch,
        hidden: args.hidden,
        layers: args.layers,
        heads: args.heads,
        kv_heads: args.kv_heads,
        intermediate: args.intermediate,
        head_dim: args.head_dim,
        tie_embeddings: !args.untied,
        max_positions: args.max_positions,
        rope_theta: args.rope_theta,
        chars: args.chars,
        dtype: args.dtype,
        seed: args.seed,
    };
    if opts.heads == 0 || opts.kv_heads == 0 || !opts.heads.is_multiple_of(opts.kv_heads) {
        bail!(
            "--heads ({}) must be a positive multiple of --kv-heads ({})",
            opts.heads,
            opts.kv_heads
        );
    }
    let model = init_model_dir(&args.out, &opts)?;
    let cfg = model.config();
    println!(
        "wrote {} to '{}': {} parameters, vocab {}, hidden {}, {} layers, {} heads ({} kv), head_dim {}",
        cfg.arch.model_type(),
        args.out.display(),
        model.transformer.params().num_params(),
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim
    );
    Ok(())
}

pub fn score(store: &std::path::Path, args: ScoreArgs) -> Result<()> {
    let model = match ModelSpec::parse(&args.model) {
        ModelSpec::Dir(dir) => load_model_dir(
            &dir,
            Some(candle_core::DType::F32),
            &crate::device::tool_device()?,
        )?,
        ModelSpec::Run { run, stage, step } => {
            if !store.exists() {
                bail!(
                    "'{}' is not a model directory, and there is no store at '{}' to find it in \
                     as a run",
                    args.model,
                    store.display()
                );
            }
            with_store(store, |s| async move {
                run_model(&s, &run, stage.as_deref(), step)
                    .await
                    .map(|found| found.model)
                    .map_err(anyhow::Error::msg)
            })?
        }
    };
    let tok = &model.tokenizer.tokenizer;
    let unk = tok.token_to_id("<unk>");
    let encode = |text: &str, what: &str| -> Result<Vec<u32>> {
        let enc = tok
            .encode(text, false)
            .map_err(|e| anyhow::anyhow!("cannot tokenize the {what}: {e}"))?;
        if enc.is_empty() {
            bail!("the {what} is empty after tokenization");
        }
        // Characters outside the vocabulary silently become <unk>: say which.
        let unknown: Vec<String> = enc
            .get_ids()
            .iter()
            .zip(enc.get_offsets())
            .filter(|(id, _)| Some(**id) == unk)
            .map(|(_, &(a, b))| format!("{:?}", text.get(a..b).unwrap_or("?")))
            .collect();
        if !unknown.is_empty() {
            let message = format!(
                "the {what} has {} character(s) outside the model's vocabulary, read as <unk>: {}",
                unknown.len(),
                unknown.join(", ")
            );
            if args.strict {
                bail!("{message} (without --strict they are scored as <unk>)");
            }
            eprintln!("warning: {message} (--strict refuses such text)");
        }
        Ok(enc.get_ids().to_vec())
    };
    let prompt = encode(&args.prompt, "prompt")?;
    let completion = encode(&args.completion, "completion")?;
    let logprobs =
        crate::train::batch::score_pair(&model.transformer, &prompt, &completion, model.pad_id)?;
    let tokens: Vec<String> = completion
        .iter()
        .map(|&id| tok.id_to_token(id).unwrap_or_else(|| format!("<{id}>")))
        .collect();
    let total: f64 = logprobs.iter().map(|&l| l as f64).sum();
    if args.json {
        let out = serde_json::json!({
            "prompt_ids": prompt,
            "completion_ids": completion,
            "tokens": tokens,
            "logprobs": logprobs,
            "total_logprob": total,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{:>5}  {:>8}  {:<12}  {:>12}",
            "pos", "id", "token", "logprob"
        );
        for (i, ((id, t), lp)) in completion.iter().zip(&tokens).zip(&logprobs).enumerate() {
            println!("{i:>5}  {id:>8}  {:<12}  {lp:>12.6}", format!("{t:?}"));
        }
        println!("total log-prob {total:.6} over {} tokens", completion.len());
    }
    Ok(())
}

pub fn merge(args: MergeArgs) -> Result<()> {
    let same = |a: &std::path::Path, b: &std::path::Path| {
        std::fs::canonicalize(a)
            .ok()
            .is_some_and(|a| Some(a) == std::fs::canonicalize(b).ok())
    };
    if same(&args.base, &args.out) {
        bail!(
            "--out '{}' is the base model's directory: write the merged model elsewhere",
            args.out.display()
        );
    }
    let device = crate::device::host();
    // In the dtype the base stores, so the merged directory stores it too.
    let model = load_model_dir(&args.base, None, &device)?;
    let adapter = crate::model::lora::Adapter::load(&args.adapter, &device)?;
    let params = model.transformer.params();
    adapter.check_against(params, &format!("base '{}'", args.base.display()))?;
    adapter
        .merge_into(params)
        .map_err(|e| anyhow::anyhow!("merging '{}': {e}", args.adapter.display()))?;
    save_model_dir(&args.out, &model)?;
    println!(
        "merged {} LoRA pairs (rank {}, scale {}) of '{}' into '{}': wrote '{}'",
        adapter.pairs.len(),
        adapter.rank,
        adapter.scale(),
        args.adapter.display(),
        args.base.display(),
        args.out.display()
    );
    Ok(())
}
