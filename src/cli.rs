//! Command-line definitions and dispatch for the `roll-tui` binary.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use crate::config::RunConfig;
use crate::model::{Arch, InitOptions, init_model_dir, load_model_dir};
use crate::pipeline::RunStatus;

#[derive(Parser, Debug)]
#[command(
    name = "roll-tui",
    version,
    about = "Reinforcement-learning post-training of language models, from a terminal"
)]
#[command(arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a config headless: SFT and/or RL with a progress bar and one summary line per step.
    Run(RunArgs),
    /// Create, inspect and score models.
    #[command(subcommand)]
    Model(ModelCommand),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The run's YAML config.
    pub config: PathBuf,
    /// `key.sub=value` overrides applied on top of the file (e.g. `rl.steps=10 seed=3`).
    pub overrides: Vec<String>,
    /// Print only the final summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// Replace the results of an earlier run in the same output directory.
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Subcommand, Debug)]
pub enum ModelCommand {
    /// Write a random-initialised model and a character-level tokenizer as a Hugging Face directory.
    Init(InitArgs),
    /// Print the per-token ids and log-probs of a completion under a model.
    Score(ScoreArgs),
}

#[derive(Args, Debug)]
pub struct InitArgs {
    #[arg(long, value_enum)]
    pub arch: Arch,
    #[arg(long, default_value_t = 128)]
    pub hidden: usize,
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    #[arg(long = "kv-heads", default_value_t = 2)]
    pub kv_heads: usize,
    #[arg(long, default_value_t = 512)]
    pub intermediate: usize,
    /// Defaults to hidden / heads.
    #[arg(long = "head-dim")]
    pub head_dim: Option<usize>,
    /// Give the model its own lm_head instead of tying it to the embeddings.
    #[arg(long = "untied")]
    pub untied: bool,
    #[arg(long = "max-positions", default_value_t = 256)]
    pub max_positions: usize,
    #[arg(long = "rope-theta", default_value_t = 10_000.0)]
    pub rope_theta: f64,
    /// Tokenizer kind; only a character-level tokenizer can be made without a download.
    #[arg(long, value_parser = ["char"], default_value = "char")]
    pub tokenizer: String,
    /// The character tokenizer's alphabet (one token per character, after <pad> <eos> <unk>).
    #[arg(long, default_value = "0123456789+=abcdefgh>")]
    pub chars: String,
    #[arg(long, value_parser = ["float32", "bfloat16"], default_value = "float32")]
    pub dtype: String,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory (created; existing model files in it are replaced).
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// A Hugging Face model directory.
    pub dir: PathBuf,
    #[arg(long)]
    pub prompt: String,
    #[arg(long)]
    pub completion: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Exit status of a run stopped by Ctrl-C (128 + SIGINT, the shell convention).
pub const EXIT_INTERRUPTED: i32 = 130;

pub fn main_with(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Run(args) => run(args),
        Command::Model(ModelCommand::Init(args)) => init(args).map(|_| 0),
        Command::Model(ModelCommand::Score(args)) => score(args).map(|_| 0),
    }
}

fn run(args: RunArgs) -> Result<i32> {
    let cfg = RunConfig::load(&args.config, &args.overrides)?;
    crate::pipeline::prepare_output_dir(&cfg.output_dir(), args.overwrite)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            // Second Ctrl-C: the user does not want to wait for the checkpoint.
            eprintln!("\nstopping now without a checkpoint");
            std::process::exit(EXIT_INTERRUPTED);
        }
        eprintln!("\nstopping after this step (a checkpoint will be written); press Ctrl-C again to quit now");
    })
    .context("installing the Ctrl-C handler")?;
    let outcome = crate::headless::run(&cfg, stop, args.quiet)?;
    Ok(if outcome.status == RunStatus::Interrupted {
        EXIT_INTERRUPTED
    } else {
        0
    })
}

fn init(args: InitArgs) -> Result<()> {
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

fn score(args: ScoreArgs) -> Result<()> {
    let model = load_model_dir(
        &args.dir,
        Some(candle_core::DType::F32),
        &candle_core::Device::Cpu,
    )?;
    let tok = &model.tokenizer.tokenizer;
    let encode = |text: &str, what: &str| -> Result<Vec<u32>> {
        let enc = tok
            .encode(text, false)
            .map_err(|e| anyhow::anyhow!("cannot tokenize the {what}: {e}"))?;
        if enc.is_empty() {
            bail!("the {what} is empty after tokenization");
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
