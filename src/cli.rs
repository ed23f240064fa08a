//! Command-line definitions and dispatch for the `roll-tui` binary; the commands live in `cli/`.

#[cfg(feature = "cuda")]
mod device_check;
#[cfg(feature = "cuda")]
mod device_transfer;
mod devices_cmd;
mod env_cmd;
mod env_debug;
mod env_play;
mod env_replay;
mod eval_cmd;
mod model_bench;
mod model_cmd;
mod model_template;
mod reward_cmd;
mod run_cmd;
mod samples_cmd;
mod store_cmd;
mod trajectories_cmd;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::model::Arch;
use crate::plot::ExportFormat;

#[derive(Parser, Debug)]
#[command(
    name = "roll-tui",
    version,
    about = "Reinforcement-learning post-training of language models, from a terminal"
)]
#[command(
    after_help = "With no command, roll-tui opens the interactive workbench on the store \
(`?` in it lists the keys).\n\nStart here:\n  \
roll-tui run experiments/quickstart.yaml     SFT then RL on a tiny model, about a minute on a CPU\n  \
roll-tui                                     watch it, replay it, compare runs in the workbench\n  \
roll-tui env debug frozen_lake               step through an agentic environment by hand\n\n\
README.md is the guide."
)]
pub struct Cli {
    /// The experiment store (an SQLite file; created by `run` when missing). The commands that
    /// use a store also take it after their name.
    #[arg(long, env = crate::store::STORE_ENV, default_value = crate::store::DEFAULT_STORE)]
    pub store: PathBuf,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a config headless: its stages (sft, distill, dpo, rl) with a progress bar and one
    /// summary line per step.
    Run(RunArgs),
    /// Continue an interrupted or failed run from its last checkpoint.
    Resume(ResumeArgs),
    /// Score a run's checkpoint, or a config's model, on held-out prompts with the config's
    /// rewards (pass@k, mean@k, accuracy per domain); the result is stored as a run.
    Eval(EvalArgs),
    /// List the runs in the store, or delete, tag and annotate one.
    Runs(RunsArgs),
    /// Print a run's metric series (a summary, or every point as CSV or JSON).
    Metrics(MetricsArgs),
    /// Print a run's scored samples.
    Samples(SamplesArgs),
    /// Print a run's agentic episodes turn by turn (observation, output, parsed action, reward).
    Trajectories(TrajectoriesArgs),
    /// Write a run's curves as PNG/SVG plots, and every point as CSV and a TensorBoard event file.
    Export(ExportArgs),
    /// List the devices a run can use (CPU, and CUDA GPUs with their memory); `--check`
    /// compares each GPU's results with the CPU's on small models and checks our CUDA kernels.
    Devices(DevicesArgs),
    /// Make, score, benchmark and merge models (Hugging Face directories).
    #[command(subcommand)]
    Model(ModelCommand),
    /// Agentic environments: list them, play or debug an episode step by step, replay a run's
    /// stored episodes, serve one to another program.
    #[command(subcommand)]
    Env(EnvCommand),
    /// Score responses with a reward, outside a run (to debug a reward or a dataset).
    #[command(subcommand)]
    Reward(RewardCommand),
    /// Run one role as a worker process (started by the scheduler, not by hand).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[arg(value_enum)]
    pub role: crate::config::Role,
    #[arg(long)]
    pub index: usize,
    /// The parent's control socket (a worker on its machine).
    #[arg(long, required_unless_present = "connect", conflicts_with = "connect")]
    pub socket: Option<PathBuf>,
    /// The parent's control address over TCP (`cluster.listen`); the run's secret comes in the
    /// environment (`ROLL_CLUSTER_SECRET`).
    #[arg(long)]
    pub connect: Option<std::net::SocketAddr>,
    /// The parent's pid (a worker on its machine): the worker exits if it is gone, and is killed
    /// when it dies.
    #[arg(long, required_unless_present = "secret_stdin")]
    pub parent: Option<u32>,
    /// Read the run's secret from the first line of stdin, and exit when stdin ends (a worker
    /// started over ssh: its stdin is its head's pipe).
    #[arg(long, requires = "connect", conflicts_with = "parent")]
    pub secret_stdin: bool,
    /// Keep a mirror of the role's host area, which the head keeps up to date over a second
    /// connection (a node that does not see the head's files).
    #[arg(long, requires = "secret_stdin")]
    pub mirror: bool,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// The run's YAML config.
    pub config: PathBuf,
    /// `key.sub=value` overrides applied on top of the file (e.g. `rl.steps=10 seed=3`).
    pub overrides: Vec<String>,
    /// Print only the final summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// Replace an earlier run of the same name (its store records and its output directory).
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Args, Debug)]
pub struct ResumeArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// Run name or id.
    pub run: String,
    /// Print only the final summary.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RunsArgs {
    #[command(flatten)]
    pub at: StoreArg,
    #[command(subcommand)]
    pub command: Option<RunsCommand>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum RunsCommand {
    /// Show one run: config, status, checkpoints, events.
    Show {
        /// Run name or id.
        run: String,
        /// Print JSON instead of text (every event).
        #[arg(long)]
        json: bool,
        /// Also print the last N events as recorded, offloads and reloads included (by default
        /// those are summed up per role).
        #[arg(long, value_name = "N")]
        events: Option<usize>,
    },
    /// Delete a run and everything recorded for it (its checkpoint files stay on disk).
    Rm {
        /// Run name or id.
        run: String,
        /// Really delete (without it, a dry run: says what would be deleted, deletes nothing).
        #[arg(long)]
        yes: bool,
    },
    /// Add tags to a run (or remove them with --remove).
    Tag {
        /// Run name or id.
        run: String,
        /// The tags.
        #[arg(required = true)]
        tags: Vec<String>,
        /// Remove the tags instead of adding them.
        #[arg(long)]
        remove: bool,
    },
    /// Set a run's notes (an empty string clears them).
    Note {
        /// Run name or id.
        run: String,
        /// The notes.
        text: String,
    },
}

#[derive(Args, Debug)]
pub struct MetricsArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// Run name or id.
    pub run: String,
    /// Only keys matching this glob (e.g. 'reward/*/mean').
    #[arg(long)]
    pub key: Option<String>,
    /// Every point as CSV (stage,key,step,wall_time,value).
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Every point as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct SamplesArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// Run name or id.
    pub run: String,
    /// Only the samples of this step.
    #[arg(long)]
    pub step: Option<u64>,
    /// Only the samples of this domain (as the config names it).
    #[arg(long)]
    pub domain: Option<String>,
    /// Only the samples of this exact prompt (one prompt followed across steps).
    #[arg(long)]
    pub prompt: Option<String>,
    /// The stage whose samples to show: "rl" (scored rollouts) or "dpo" (preference pairs);
    /// default the one that recorded samples last.
    #[arg(long)]
    pub stage: Option<String>,
    /// At most this many samples (default: 20 as text, all as JSON; 0: all).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct TrajectoriesArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// Run name or id.
    pub run: String,
    /// Only the episodes of this RL step.
    #[arg(long)]
    pub step: Option<u64>,
    /// Only the episodes of this group (episodes that started from one seed).
    #[arg(long)]
    pub group: Option<usize>,
    /// At most this many episodes (default: 10 as text, all as JSON; 0: all).
    #[arg(long)]
    pub limit: Option<usize>,
    /// One JSON object per episode, per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// Run name or id.
    pub run: String,
    /// Output directory (created).
    #[arg(long)]
    pub out: PathBuf,
    // Parsed by `ExportFormat`'s `FromStr` (case and spaces forgiven: `--format "png, SVG"`); the
    // help lists the formats it knows.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "png,svg,csv,tensorboard",
        help = format!(
            "Comma-separated formats, of {}: charts as PNG and SVG, every point as CSV \
             (`metrics.csv`) and as a TensorBoard event file (`tensorboard --logdir OUT`)",
            ExportFormat::names()
        )
    )]
    pub format: Vec<ExportFormat>,
    /// Plot width in pixels.
    #[arg(long, default_value_t = 1200)]
    pub width: u32,
    /// Plot height in pixels.
    #[arg(long, default_value_t = 700)]
    pub height: u32,
}

#[derive(Subcommand, Debug)]
pub enum EnvCommand {
    /// The environments and their parameters.
    List,
    /// Play one episode and print every step (observation, action, reward, done, info).
    Play(EnvPlayArgs),
    /// Serve a built-in environment over the external JSON-lines protocol on stdin/stdout, many
    /// instances at once (a request's `instance`), until `close` or the end of stdin (what
    /// `workers.env.mode: process` runs).
    Serve(EnvServeArgs),
    /// Rebuild a run's stored episodes from their seeds and recorded outputs, and check every
    /// observation against the stored one (the first divergence of each episode is shown).
    Replay(EnvReplayArgs),
    /// Step through an episode turn by turn in the debugger (the workbench's Env view): by hand,
    /// at random or with a model; undo, fork, resample, save; or open a run's stored episode at
    /// any turn (--run).
    Debug(EnvDebugArgs),
}

#[derive(Args, Debug)]
pub struct EnvReplayArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// Run name or id.
    pub run: String,
    /// Only the episodes of this RL step.
    #[arg(long)]
    pub step: Option<u64>,
    /// Only the episodes of this group.
    #[arg(long)]
    pub group: Option<usize>,
    /// Only this episode of its group.
    #[arg(long)]
    pub episode: Option<usize>,
}

/// The registered environments' names, as clap's possible values: help lists them and a typo is
/// answered with the closest.
fn env_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(crate::env::ENVS.map(|(name, _, _)| name))
}

/// The built-in environments' names (not `external`, which is a program of its own).
fn built_in_env_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        crate::env::ENVS
            .map(|(name, _, _)| name)
            .into_iter()
            .filter(|name| *name != "external"),
    )
}

#[derive(Args, Debug)]
pub struct EnvServeArgs {
    /// A built-in environment (see `roll-tui env list`).
    #[arg(value_parser = built_in_env_names())]
    pub env: String,
    /// An environment parameter, `key=value` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

#[derive(Args, Debug)]
pub struct EnvPlayArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// The environment (see `roll-tui env list`).
    #[arg(value_parser = env_names())]
    pub env: String,
    /// The episode's seed: the same seed plays the same episode.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// An environment parameter, `key=value` (repeatable): `--set map=SFFF/FHFH/FFFH/HFFG`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// The actions to take, comma-separated (`Down,Down,Right`), as a policy would answer them.
    #[arg(long, value_delimiter = ',', conflicts_with = "policy")]
    pub actions: Vec<String>,
    /// `random` (a uniformly random valid action each step, drawn from the seed), or
    /// `model:DIR` (a Hugging Face directory) or `model:RUN@STEP` (a run's checkpoint, `@rl-N` or
    /// `@sft-N` to name the stage; `model:RUN` for its latest; `@0` the policy before RL, rebuilt
    /// from the run's config) prompted as a rollout prompts it; a run's own env settings are used
    /// when it trained on this env.
    #[arg(long)]
    pub policy: Option<String>,
    /// With a model: before each turn, draw it this many times and print how often each action
    /// came out (what the policy believes at that state).
    #[arg(long)]
    pub samples: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop after this many steps even if the episode goes on (default: 100, or with a model
    /// from a run of this env, that run's `max_turns`).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A model policy's sampling, over the defaults of its source (a run's `rl.sampling`).
#[derive(Args, Debug, Clone, Default)]
pub struct SamplingArgs {
    /// Sampling temperature (0: greedy).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p (1: off).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Tokens the model may write per turn.
    #[arg(long)]
    pub max_tokens: Option<usize>,
}

#[derive(Args, Debug)]
pub struct EnvDebugArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// The environment (see `roll-tui env list`); not with --run, which debugs that run's env.
    #[arg(value_parser = env_names())]
    pub env: Option<String>,
    /// The episode's seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// An environment parameter, `key=value` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// The model for model turns and resampling, loaded at once: `DIR` or `RUN@STEP` (`RUN` for
    /// its latest checkpoint; `RUN@0` the policy before RL, rebuilt from the run's config). Without it, `m` in the view loads one (with --run it offers that
    /// run's checkpoint of --step).
    #[arg(long)]
    pub model: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Open a stored episode of this run (name or id) instead of a fresh one.
    #[arg(long, conflicts_with = "env")]
    pub run: Option<String>,
    /// With --run: the RL step whose episode to open.
    #[arg(long, requires = "run")]
    pub step: Option<u64>,
    /// With --run: the episode's group.
    #[arg(long, default_value_t = 0, requires = "run")]
    pub group: usize,
    /// With --run: the episode within its group.
    #[arg(long, default_value_t = 0, requires = "run")]
    pub episode: usize,
    /// With --run: the turn (1-based) to open the episode at; default: after its last turn.
    #[arg(long, requires = "run")]
    pub turn: Option<usize>,
}

#[derive(Subcommand, Debug)]
pub enum RewardCommand {
    /// Score one response (--response/--truth) or a JSONL file of them (--input), with a reward
    /// kind and its parameters or exactly the reward a config gives a domain.
    #[command(
        after_help = "With --input, each line is {\"id\", \"prompt\"?, \"response\", \"ground_truth\"} \
and the output is one JSON line per input, in order: {\"id\", \"score\", \"correct\", \"format_ok\", \
\"extracted\", \"breakdown\"}. A line that cannot be scored gets {\"id\": null, \"line\", \"error\"} \
in its place, the rest are scored, and the exit status is 1.\n\nExamples:\n  \
roll-tui reward score --kind math_verify --response 'so \\boxed{2\\sqrt3}' --truth '\\sqrt{12}'\n  \
roll-tui reward score --kind exact_match --params '{\"ignore_case\": true}' --input configs/data/add-answers.jsonl\n  \
roll-tui reward score --config experiments/quickstart.yaml --domain add --input configs/data/add-answers.jsonl"
    )]
    Score(RewardScoreArgs),
}

/// Every reward kind, from the registry the rewards are built from (so the help cannot go stale).
fn reward_kinds() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(crate::reward::RewardKind::ALL.map(|k| k.as_str()))
}

#[derive(Args, Debug)]
pub struct RewardScoreArgs {
    /// The reward kind.
    #[arg(
        long,
        conflicts_with = "config",
        required_unless_present = "config",
        value_parser = reward_kinds()
    )]
    pub kind: Option<String>,
    /// The kind's parameters as a JSON object (`{"percent_is_fraction": false}`).
    #[arg(long, requires = "kind")]
    pub params: Option<String>,
    /// Score with the reward this run config gives --domain.
    #[arg(long, requires = "domain")]
    pub config: Option<std::path::PathBuf>,
    /// The domain of --config whose reward to use.
    #[arg(long, requires = "config")]
    pub domain: Option<String>,
    /// The response to score.
    #[arg(long, requires = "truth", conflicts_with = "input")]
    pub response: Option<String>,
    /// The ground truth to score it against.
    #[arg(long, requires = "response", conflicts_with = "input")]
    pub truth: Option<String>,
    /// The prompt (read by rewards that check instructions).
    #[arg(long, conflicts_with = "input")]
    pub prompt: Option<String>,
    /// A JSONL file of responses to score.
    #[arg(long, required_unless_present = "response")]
    pub input: Option<std::path::PathBuf>,
    /// Print JSON instead of text (always JSON lines with --input).
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum ModelCommand {
    /// Write a random-initialised model and a character-level tokenizer as a Hugging Face directory.
    Init(InitArgs),
    /// Print the per-token ids and log-probs of a completion under a model.
    Score(ScoreArgs),
    /// Measure generation and forward+backward tokens/s of a model on the device `ROLL_DEVICE`
    /// names (the CPU unless set), and a GPU's memory for a training step.
    Bench(BenchArgs),
    /// Merge a LoRA adapter (a PEFT adapter directory) into its base model and write the merged
    /// model as a Hugging Face directory.
    Merge(MergeArgs),
    /// Print exactly the text the engine tokenizes for a conversation: the model directory's chat
    /// template rendered as transformers' `apply_chat_template(tokenize=False)` renders it.
    #[command(after_help = TEMPLATE_EXAMPLES)]
    Template(TemplateArgs),
}

const TEMPLATE_EXAMPLES: &str = "\
The messages file is JSON: a list of messages, or {\"messages\": [...], \"tools\": [...]}. A message
has a role and content, and may carry tool_calls, reasoning_content, name, tool_call_id, ...
(whatever the template reads):
  [{\"role\": \"user\", \"content\": \"Weather in Paris?\"},
   {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\",
     \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]},
   {\"role\": \"tool\", \"content\": \"21 C\"}]

Examples:
  roll-tui model template ./Qwen3-0.6B --messages chat.json --add-generation-prompt --set enable_thinking=false
  roll-tui model template ./model --messages chat.json --config experiments/quickstart.yaml --ids";

#[derive(Args, Debug)]
pub struct TemplateArgs {
    /// A Hugging Face model directory (only its tokenizer files are read).
    pub dir: PathBuf,
    /// The conversation: a JSON file (`-` reads standard input).
    #[arg(long)]
    pub messages: PathBuf,
    /// End with the opening of the assistant's turn, as a prompt for generation does.
    #[arg(long)]
    pub add_generation_prompt: bool,
    /// A template option, `name=value`, the value read as YAML (`enable_thinking=false`,
    /// `date_string='07 Dec 2026'`); repeatable; wins over --config's.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub set: Vec<String>,
    /// Take the template options from this run config's `data.chat_template_options`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Render this Jinja file instead of the directory's chat template.
    #[arg(long)]
    pub template: Option<PathBuf>,
    /// Print the token ids the text encodes to (one line) instead of the text.
    #[arg(long)]
    pub ids: bool,
}

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The base model's Hugging Face directory.
    pub base: PathBuf,
    /// The adapter directory (adapter_config.json, adapter_model.safetensors), as PEFT writes it.
    #[arg(long)]
    pub adapter: PathBuf,
    /// Where the merged model goes (created; it must not be the base's directory).
    #[arg(long)]
    pub out: PathBuf,
}

/// A model shape to benchmark with random weights.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum BenchShape {
    /// hidden 128, 4 layers, 4 heads (2 kv), a 20-token vocabulary.
    Tiny,
    /// Qwen2.5-0.5B's shape: hidden 896, 24 layers, 14 heads (2 kv), 151,936 tokens.
    #[value(name = "qwen2.5-0.5b")]
    Qwen05,
}

impl BenchShape {
    pub fn name(self) -> &'static str {
        match self {
            BenchShape::Tiny => "tiny",
            BenchShape::Qwen05 => "qwen2.5-0.5b",
        }
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// A Hugging Face model directory (or --shape).
    pub dir: Option<PathBuf>,
    /// A shape with random weights instead of a directory.
    #[arg(long, value_enum)]
    pub shape: Option<BenchShape>,
    /// float32 or bfloat16.
    #[arg(long, default_value = "float32")]
    pub dtype: String,
    /// Sequences generated at once.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Tokens generated per sequence.
    #[arg(long = "new-tokens", default_value_t = 128)]
    pub new_tokens: usize,
    /// Sequences of the forward+backward.
    #[arg(long = "train-batch", default_value_t = 16)]
    pub train_batch: usize,
    /// Tokens of each (6 of prompt, the rest scored).
    #[arg(long = "train-len", default_value_t = 512)]
    pub train_len: usize,
    /// Timed runs after one warm-up.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print one JSON line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Run the checks on every GPU (exit status 1 if any fails).
    #[arg(long)]
    pub check: bool,
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// The architecture (its config.json and weight names).
    #[arg(long, value_enum)]
    pub arch: Arch,
    /// Hidden size.
    #[arg(long, default_value_t = 128)]
    pub hidden: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than --heads).
    #[arg(long = "kv-heads", default_value_t = 2)]
    pub kv_heads: usize,
    /// Hidden size of the MLP.
    #[arg(long, default_value_t = 512)]
    pub intermediate: usize,
    /// Defaults to hidden / heads.
    #[arg(long = "head-dim")]
    pub head_dim: Option<usize>,
    /// Give the model its own lm_head instead of tying it to the embeddings.
    #[arg(long = "untied")]
    pub untied: bool,
    /// The longest sequence (prompt and response) the model takes.
    #[arg(long = "max-positions", default_value_t = 256)]
    pub max_positions: usize,
    /// RoPE base frequency.
    #[arg(long = "rope-theta", default_value_t = 10_000.0)]
    pub rope_theta: f64,
    /// Tokenizer kind; only a character-level tokenizer can be made without a download.
    #[arg(long, value_parser = ["char"], default_value = "char")]
    pub tokenizer: String,
    /// The character tokenizer's alphabet (one token per character, after <pad> <eos> <unk>).
    #[arg(long, default_value = "0123456789+=abcdefgh>")]
    pub chars: String,
    /// The stored weights' dtype.
    #[arg(long, value_parser = ["float32", "bfloat16"], default_value = "float32")]
    pub dtype: String,
    /// Seed of the random initialisation (the same seed, the same weights).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory (created; existing model files in it are replaced).
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// A Hugging Face model directory, or a run's checkpoint: `RUN@STEP`, `RUN@rl-STEP`, `RUN`
    /// for its latest.
    #[arg(value_name = "DIR|RUN@STEP")]
    pub model: String,
    /// The prompt (not scored).
    #[arg(long)]
    pub prompt: String,
    /// The completion whose tokens are scored.
    #[arg(long)]
    pub completion: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Refuse text with characters outside the vocabulary (by default they are read as the
    /// unknown token, with a warning).
    #[arg(long)]
    pub strict: bool,
}

pub use crate::launch::EXIT_INTERRUPTED;
pub use eval_cmd::EvalArgs;

/// Every command ends quietly with status 0 when the reader of its output goes away
/// (`roll-tui metrics RUN | head -1`), as Unix tools do, instead of panicking with a backtrace:
/// Rust ignores SIGPIPE, so `println!` to a closed pipe panics; this hook turns exactly that panic
/// into an exit and leaves every other panic to the default hook.
pub fn exit_quietly_when_output_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        let closed = (message.starts_with("failed printing to stdout")
            || message.starts_with("failed printing to stderr"))
            && message.contains("Broken pipe");
        if closed {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// Whether `e` is a write to a reader that went away (a command that writes through `io::Write`
/// returns it as an error rather than panicking): the command then ends quietly too.
pub fn is_closed_output(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                .is_some_and(|k| k == std::io::ErrorKind::BrokenPipe)
            || cause.downcast_ref::<csv::Error>().is_some_and(|c| {
                matches!(c.kind(), csv::ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
            })
    })
}

/// `--store` after a command's name, for the commands that use a store (so that it is listed only
/// where it applies); it wins over one given before the command, or `$ROLL_STORE`.
#[derive(Args, Debug, Default, Clone)]
pub struct StoreArg {
    /// The experiment store (an SQLite file; created by `run` when missing) [default: $ROLL_STORE,
    /// else roll.db].
    #[arg(long = "store", value_name = "STORE", global = true)]
    pub store: Option<PathBuf>,
}

impl StoreArg {
    /// This store, or `default` (from before the command) when none was given here.
    pub fn or(&self, default: &std::path::Path) -> PathBuf {
        self.store.clone().unwrap_or_else(|| default.to_path_buf())
    }
}

/// `e` and its causes as one line, each cause said once: many errors already end with their
/// cause's text (`opening: (code: 14) unable to open database file`), and printing the chain
/// with `{:#}` would repeat it.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let said = cause.to_string();
        if text.contains(said.as_str()) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

pub fn main_with(cli: Cli) -> Result<i32> {
    let store = cli.store;
    let Some(command) = cli.command else {
        return workbench(&store).map(|_| 0);
    };
    match command {
        Command::Run(args) => run_cmd::run(&args.at.or(&store), args),
        Command::Resume(args) => run_cmd::resume(&args.at.or(&store), args),
        Command::Eval(args) => eval_cmd::eval(&args.at.or(&store), args),
        Command::Runs(args) => store_cmd::runs(&args.at.or(&store), args),
        Command::Metrics(args) => store_cmd::metrics(&args.at.or(&store), args).map(|_| 0),
        Command::Samples(args) => samples_cmd::samples(&args.at.or(&store), args).map(|_| 0),
        Command::Trajectories(args) => {
            trajectories_cmd::trajectories(&args.at.or(&store), args).map(|_| 0)
        }
        Command::Export(args) => store_cmd::export(&args.at.or(&store), args).map(|_| 0),
        Command::Devices(args) => devices_cmd::devices(args.check),
        Command::Model(ModelCommand::Init(args)) => model_cmd::init(args).map(|_| 0),
        Command::Model(ModelCommand::Score(args)) => {
            model_cmd::score(&args.at.or(&store), args).map(|_| 0)
        }
        Command::Model(ModelCommand::Bench(args)) => model_bench::bench(args).map(|_| 0),
        Command::Model(ModelCommand::Merge(args)) => model_cmd::merge(args).map(|_| 0),
        Command::Model(ModelCommand::Template(args)) => model_template::template(args).map(|_| 0),
        Command::Reward(RewardCommand::Score(args)) => reward_cmd::score(args),
        Command::Env(EnvCommand::List) => env_cmd::list().map(|_| 0),
        Command::Env(EnvCommand::Play(args)) => {
            env_play::play(&args.at.or(&store), args).map(|_| 0)
        }
        Command::Env(EnvCommand::Debug(args)) => {
            env_debug::debug(&args.at.or(&store), args).map(|_| 0)
        }
        Command::Env(EnvCommand::Serve(args)) => env_cmd::serve(args).map(|_| 0),
        Command::Env(EnvCommand::Replay(args)) => env_replay::replay(&args.at.or(&store), args),
        Command::Worker(args) => worker(args).map(|_| 0),
    }
}

/// `roll-tui` alone: the interactive workbench, which needs a terminal on both ends.
fn workbench(store: &std::path::Path) -> Result<()> {
    use std::io::IsTerminal;
    if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
        anyhow::bail!(
            "roll-tui with no command opens the interactive workbench, which needs a terminal; \
             see `roll-tui --help` for the commands"
        );
    }
    crate::tui::run(store)
}

fn worker(args: WorkerArgs) -> Result<()> {
    use anyhow::Context;
    match args.parent {
        Some(parent) => crate::worker::serve::die_with_parent(parent).context("worker start-up")?,
        None => crate::worker::serve::secret_from_stdin().context("worker start-up")?,
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the worker's runtime")?;
    if args.mirror {
        crate::worker::serve::keep_mirror();
    }
    use crate::worker::process::Endpoint;
    let at = match (args.socket, args.connect) {
        (_, Some(addr)) => Endpoint::Tcp(addr),
        (Some(path), None) => Endpoint::Unix(path),
        (None, None) => anyhow::bail!("worker: give --socket or --connect"),
    };
    rt.block_on(crate::role::serve_worker(args.role, args.index, &at))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command the top-level help suggests parses as it is written, and names a file
    /// that exists (the help cannot point at a config that was moved).
    #[test]
    fn the_top_level_help_suggests_commands_that_exist() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        let suggested: Vec<&str> = help
            .lines()
            .filter_map(|l| l.trim().strip_prefix("roll-tui"))
            .map(|rest| rest.split("  ").next().unwrap_or("").trim())
            .collect();
        assert_eq!(suggested.len(), 3, "{help}");
        for args in suggested {
            let words = shlex::split(args).unwrap_or_default();
            let parsed =
                Cli::try_parse_from(std::iter::once("roll-tui".to_string()).chain(words.clone()));
            assert!(parsed.is_ok(), "roll-tui {args}: {parsed:?}");
            for w in words.iter().filter(|w| w.ends_with(".yaml")) {
                let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(w);
                assert!(path.is_file(), "{w}");
            }
        }
    }

    #[test]
    fn error_text_says_each_cause_once() {
        let io = std::io::Error::other("(code: 14) unable to open database file");
        // A cause whose text its parent already ends with is not repeated; a new one is added.
        let e = anyhow::Error::new(io)
            .context("opening: (code: 14) unable to open database file")
            .context("store 'x.db'");
        assert_eq!(
            error_text(&e),
            "store 'x.db': opening: (code: 14) unable to open database file"
        );
        let e = anyhow::anyhow!("disk full").context("writing 'a.png'");
        assert_eq!(error_text(&e), "writing 'a.png': disk full");
    }
}
