//! `roll-tui eval`: score a model on held-out prompts with a config's rewards, and store the
//! result as a run tagged `eval` (its one step's `val/<domain>/…` metrics and every answer, which
//! `samples`, `metrics`, `export` and the workbench read like any run's).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::StoreArg;
use crate::config::{RlEval, RunConfig, Stage};
use crate::debugger::open::{ModelSpec, run_model};
use crate::model::{LoadedModel, load_model_dir};
use crate::pipeline::evaluate::{EvalFile, EvalOutcome, eval_domains, evaluate_model};
use crate::store::liveness::ProcessIdentity;
use crate::store::{EventKind, EventRecord, NewRun, OpenMode, RunStatus, Store};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
roll-tui eval quickstart@rl-150 --data test.jsonl    a run's checkpoint, with the run's rewards\n  \
roll-tui eval quickstart                              its latest checkpoint, on the run's held-out prompts\n  \
roll-tui eval configs/examples/qwen2.5-0.5b-instruct-gsm8k.yaml --model ~/models/Qwen2.5-0.5B-Instruct --data gsm8k=test.jsonl")]
pub struct EvalArgs {
    #[command(flatten)]
    pub at: StoreArg,
    /// What to evaluate: a run's checkpoint (`RUN@STEP`, `RUN@rl-STEP`, or `RUN` for its latest),
    /// scored with that run's config; or a config file, whose model is scored.
    pub target: String,
    /// `key.sub=value` overrides of the config (e.g. `rl.sampling.max_new_tokens=64`).
    pub overrides: Vec<String>,
    /// A JSONL file of prompts and ground truths, as a domain's dataset; `DOMAIN=FILE` counts
    /// every line towards DOMAIN, else each line's `domain` (or the config's only domain) does.
    /// Repeatable. Without it: the config's held-out prompts (`val_path`, `val_split`).
    #[arg(long, value_name = "[DOMAIN=]FILE")]
    pub data: Vec<String>,
    /// Score this model instead of the target's: a Hugging Face directory, or `RUN@STEP`.
    #[arg(long, value_name = "DIR|RUN@STEP")]
    pub model: Option<String>,
    /// Samples per prompt, the k of pass@k and mean@k [default: the config's rl.eval, else 1].
    #[arg(long, value_name = "K")]
    pub samples: Option<usize>,
    /// Sampling temperature, 0 for greedy [default: the config's rl.eval, else 0].
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Evaluate at most this many prompts of each domain (its first ones).
    #[arg(long, value_name = "N")]
    pub max_prompts: Option<usize>,
    /// Tokens per answer at most [default: the config's rl.sampling.max_new_tokens].
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// The evaluation run's name [default: eval-<what is evaluated>, numbered when taken].
    #[arg(long)]
    pub name: Option<String>,
    /// Replace an earlier run of that name.
    #[arg(long, requires = "name")]
    pub overwrite: bool,
    /// Print the result as JSON (the run's name and its metrics).
    #[arg(long)]
    pub json: bool,
}

/// The tag of the runs `eval` stores: the only runs its `--overwrite` replaces.
pub const EVAL_TAG: &str = "eval";

/// The model to score, what it is called, and the config whose data and rewards score it.
struct Target {
    label: String,
    /// What the evaluation run is named after: the config's run name, the checkpoint
    /// (`quickstart@rl-150`) or the directory's name.
    stem: String,
    cfg: RunConfig,
    model: LoadedModel,
}

pub fn eval(store_path: &Path, args: EvalArgs) -> Result<i32> {
    let t0 = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("roll-store")
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let target_path = Path::new(&args.target);
    if target_path.is_dir() {
        let hint = match store_path.exists() {
            true => {
                let store = rt.block_on(Store::open(store_path, OpenMode::Read))?;
                rt.block_on(run_of_that_name(&store, &args.target))
            }
            false => String::new(),
        };
        bail!(
            "'{}' is a directory: a model directory is scored with a config's data and rewards \
             (roll-tui eval CONFIG --model {0}){hint}",
            args.target
        );
    }
    if !target_path.is_file() && !store_path.exists() {
        bail!(
            "'{}' is not a config file, and there is no store at '{}' to find it in as a run",
            args.target,
            store_path.display()
        );
    }
    // The model scored is the target's or --model's; its dtype may be chosen.
    if let Some(o) = args
        .overrides
        .iter()
        .find(|o| o.starts_with("model.") && !o.starts_with("model.dtype="))
    {
        bail!("override '{o}': the model to score is the target's, or --model's");
    }
    let store = rt.block_on(Store::open(store_path, OpenMode::Create))?;
    rt.block_on(check_name(&store, &args))?;
    let mut target = rt.block_on(target(&store, &args))?;
    if let Some(env) = target.cfg.rl.as_ref().and_then(|rl| rl.env.as_ref()) {
        bail!(
            "'{}' trains on the environment '{}': its policy is evaluated on episodes, not on \
             prompts (rl.env.eval during the run; afterwards `roll-tui env play {} --policy \
             model:RUN@STEP --samples N`)",
            args.target,
            env.name,
            env.name
        );
    }
    let files = args
        .data
        .iter()
        .map(|d| eval_file(d, &target.cfg))
        .collect::<Result<Vec<EvalFile>>>()?;
    let eval = eval_settings(&target.cfg, &args)?;
    let mut sampling = target
        .cfg
        .rl
        .as_ref()
        .map(|rl| rl.sampling.clone())
        .unwrap_or_default();
    if let Some(n) = args.max_tokens {
        sampling.max_new_tokens = n;
        // Set-up checks answers' room against the config's sampling: this evaluation's.
        if let Some(rl) = target.cfg.rl.as_mut() {
            rl.sampling.max_new_tokens = n;
        }
    }
    let mut problems = vec![];
    sampling.validate("sampling", &mut problems);
    if !problems.is_empty() {
        bail!("{}", super::env_play::flag_names(&problems.join("; ")));
    }
    let data = eval_domains(&target.cfg, &target.model, &files)?;
    let counts: Vec<(String, usize)> = data
        .domains
        .iter()
        .map(|d| {
            let mut distinct: Vec<&str> = d.val.iter().map(|e| e.prompt.as_str()).collect();
            distinct.sort_unstable();
            distinct.dedup();
            (
                d.name.clone(),
                distinct.len().min(eval.max_prompts.unwrap_or(usize::MAX)),
            )
        })
        .collect();
    let prompts: usize = counts.iter().map(|(_, n)| n).sum();
    let how = if eval.temperature == 0.0 {
        "greedy".to_string()
    } else {
        format!("temperature {}", eval.temperature)
    };
    eprintln!(
        "evaluating {} on {prompts} prompt{} ({}): {} sample{} each, {how}, at most {} new tokens",
        target.label,
        crate::text::plural_s(prompts),
        counts
            .iter()
            .map(|(d, n)| format!("{d} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        eval.samples,
        crate::text::plural_s(eval.samples),
        sampling.max_new_tokens
    );
    let bar = progress_bar(args.json, prompts.saturating_mul(eval.samples) as u64);
    let outcome = evaluate_model(
        &target.cfg,
        &target.model,
        &data,
        &eval,
        &sampling,
        &mut |done, _| bar.set_position(done as u64),
    )?;
    bar.finish_and_clear();
    let seconds = t0.elapsed().as_secs_f64();
    for (domain, error, n) in &outcome.reward_errors {
        eprintln!("warning: domain '{domain}': {error} ({})", scored_zero(*n));
    }
    let notes = format!(
        "evaluates {} on {}{}: {} sample(s) per prompt, {how}, at most {} new tokens",
        target.label,
        match files.is_empty() {
            true => "the config's held-out prompts".to_string(),
            false => args.data.join(", "),
        },
        match eval.max_prompts {
            Some(n) => format!(" (at most {n} per domain)"),
            None => String::new(),
        },
        eval.samples,
        sampling.max_new_tokens
    );
    let result = StoredResult {
        stem: &target.stem,
        cfg: &target.cfg,
        outcome: &outcome,
        notes: &notes,
        seconds,
        overwrite: args.overwrite,
    };
    let name = result.store(&rt, &store, &args)?;
    rt.block_on(store.close());
    if args.json {
        let out = serde_json::json!({
            "run": name,
            "evaluated": target.label,
            "metrics": outcome.metrics,
            "reward_errors": outcome.reward_errors.len(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    print_table(&outcome, &counts, eval.samples);
    println!(
        "stored as run '{name}' in {seconds:.1} s; its answers: {}",
        crate::store::command_line(store_path, &["samples", &name])
    );
    Ok(0)
}

/// The model and config `args` name.
async fn target(store: &Store, args: &EvalArgs) -> Result<Target> {
    let path = Path::new(&args.target);
    let yaml = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
    if yaml && !path.is_file() {
        bail!("config file '{}' does not exist", args.target);
    }
    let (label, stem, mut cfg, model) = if path.is_file() {
        let cfg = match RunConfig::load(path, &args.overrides) {
            Ok(cfg) => cfg,
            Err(e) => bail!("{e}{}", run_of_that_name(store, &args.target).await),
        };
        let label = format!("the model of '{}'", args.target);
        (label, cfg.name.clone(), cfg, None)
    } else {
        let ModelSpec::Run { run, stage, step } = ModelSpec::parse(&args.target) else {
            bail!(
                "'{}': no such config file (and a run's name has no path separator)",
                args.target
            );
        };
        let found = run_model(store, &run, stage.as_deref(), step)
            .await
            .map_err(anyhow::Error::msg)?;
        let origin = format!("run '{run}'");
        let cfg = found.cfg.with_overrides(&origin, &args.overrides)?;
        let source = found.source;
        (source.clone(), source, cfg, Some(found.model))
    };
    let (label, stem, model) = match &args.model {
        Some(spec) => {
            let (label, model) = replacement_model(store, spec, &cfg).await?;
            // The stored config names the directory scored, not the config's own model.
            if let ModelSpec::Dir(dir) = ModelSpec::parse(spec) {
                cfg.model.path = Some(dir);
                cfg.model.init = None;
                cfg.model.lora = None;
            }
            let stem = Path::new(&label)
                .file_name()
                .map_or(label.clone(), |n| n.to_string_lossy().into_owned());
            (label, stem, model)
        }
        None => match model {
            Some(model) => (label, stem, model),
            None => {
                if cfg.model.path.is_none() {
                    eprintln!(
                        "note: '{}' makes its model from model.init: a random initialisation \
                         is scored (--model DIR|RUN@STEP scores another)",
                        args.target
                    );
                }
                (label, stem, crate::pipeline::setup::load_policy(&cfg)?)
            }
        },
    };
    Ok(Target {
        label,
        stem,
        cfg,
        model,
    })
}

/// When `text`, read as a path, hides a run of that name: how to name the run instead.
async fn run_of_that_name(store: &Store, text: &str) -> String {
    match store.find_run(text).await {
        Ok(run) if run.name == text => format!(
            "; a run '{text}' is in the store too: #{} names it rather than the file here",
            run.id
        ),
        _ => String::new(),
    }
}

/// `--model`: a Hugging Face directory (in the config's dtype) or a run's checkpoint.
async fn replacement_model(
    store: &Store,
    spec: &str,
    cfg: &RunConfig,
) -> Result<(String, LoadedModel)> {
    match ModelSpec::parse(spec) {
        ModelSpec::Dir(dir) => {
            let device = crate::device::open(cfg.workers.trainer_device())?;
            let model = load_model_dir(&dir, Some(cfg.model.dtype.candle()), &device)?;
            Ok((dir.display().to_string(), model))
        }
        ModelSpec::Run { run, stage, step } => {
            let found = run_model(store, &run, stage.as_deref(), step)
                .await
                .map_err(anyhow::Error::msg)?;
            Ok((found.source, found.model))
        }
    }
}

/// `--data [DOMAIN=]FILE`: the domain form when DOMAIN is one of the config's; a file's name
/// may hold `=` too, so a text that is neither is refused naming both readings.
fn eval_file(arg: &str, cfg: &RunConfig) -> Result<EvalFile> {
    let domains: Vec<&str> = cfg.data.domains.iter().map(|d| d.name.as_str()).collect();
    match arg.split_once('=') {
        Some((domain, path)) if domains.contains(&domain) => Ok(EvalFile {
            domain: Some(domain.to_string()),
            path: PathBuf::from(path),
        }),
        Some((domain, _)) if !Path::new(arg).exists() => bail!(
            "--data {arg}: the config has no domain '{domain}' (its domains: {}), and there is \
             no file '{arg}'",
            domains.join(", ")
        ),
        _ => Ok(EvalFile {
            domain: None,
            path: PathBuf::from(arg),
        }),
    }
}

/// The config's `rl.eval` (or one sample, greedy) with the flags' settings over it.
fn eval_settings(cfg: &RunConfig, args: &EvalArgs) -> Result<RlEval> {
    let mut eval = cfg
        .rl
        .as_ref()
        .and_then(|rl| rl.eval.clone())
        .unwrap_or(RlEval {
            every: 1,
            samples: 1,
            temperature: 0.0,
            max_prompts: None,
            before_training: false,
        });
    if let Some(k) = args.samples {
        eval.samples = k;
    }
    if let Some(t) = args.temperature {
        eval.temperature = t;
    }
    if args.max_prompts.is_some() {
        eval.max_prompts = args.max_prompts;
    }
    let problems = eval.problems();
    if !problems.is_empty() {
        // A value is named by where it came from (the flag, or the config's rl.eval); what to
        // do about it by the flags.
        let mut text = problems.join("; ").replace("rl.eval.every, ", "");
        for (key, flag, given) in [
            ("rl.eval.samples", "--samples", args.samples.is_some()),
            (
                "rl.eval.temperature",
                "--temperature",
                args.temperature.is_some(),
            ),
            (
                "rl.eval.max_prompts",
                "--max-prompts",
                args.max_prompts.is_some(),
            ),
        ] {
            if !given {
                // Marked (\u{1}) so the flag's replacement below leaves it as the key.
                let marked = key.replace('.', "\u{1}");
                for verb in [" is ", " must "] {
                    let at = format!("{key}{verb}");
                    text = text.replace(&at, &format!("the config's {marked}{verb}"));
                }
            }
            text = text.replace(key, flag);
        }
        let text = text
            .replace('\u{1}', ".")
            .replace("or samples: 1", "or --samples 1");
        bail!("{text}");
    }
    Ok(eval)
}

/// `--name`, checked before anything loads: a name a run could have, free unless replaced.
async fn check_name(store: &Store, args: &EvalArgs) -> Result<()> {
    let Some(name) = &args.name else {
        return Ok(());
    };
    let chars = name.chars().count();
    if name.trim().is_empty()
        || name.contains(['/', '\\'])
        || name.chars().any(char::is_control)
        || chars > crate::config::MAX_NAME_CHARS
    {
        bail!(
            "--name '{}': a run's name is non-empty, at most {} characters, with no path \
             separators or control characters",
            crate::text::clean(name, 40, false),
            crate::config::MAX_NAME_CHARS
        );
    }
    let existing = store.find_run(name).await.ok().filter(|r| &r.name == name);
    // --overwrite replaces an evaluation, never a training run (or the one being evaluated):
    // one that recorded its step as stage eval and carries the tag.
    let is_eval = |r: &crate::store::RunInfo| {
        r.tags.iter().any(|t| t == EVAL_TAG)
            && r.last_stage.as_deref() == Some(Stage::Eval.as_str())
    };
    if let Some(run) = &existing
        && !is_eval(run)
    {
        bail!(
            "run '{name}' in store '{}' is not an evaluation (it trains): eval never replaces \
             it; choose another --name",
            store.path().display()
        );
    }
    let taken = existing.is_some();
    if taken && !args.overwrite {
        bail!(
            "run '{name}' already exists in store '{}': pass --overwrite to replace it, or \
             another --name",
            store.path().display()
        );
    }
    store.check_name_free(name, args.overwrite).await?;
    Ok(())
}

/// `--name`, or `eval-<stem>` with the first free number after it when that is taken.
async fn run_name(store: &Store, args: &EvalArgs, stem: &str) -> Result<String> {
    if let Some(name) = &args.name {
        return Ok(name.clone());
    }
    let slug: String = stem
        .chars()
        .map(|c| match c {
            '@' | '/' | '\\' | ' ' => '-',
            c if c.is_control() => '-',
            c => c,
        })
        .take(crate::config::MAX_NAME_CHARS - 10)
        .collect();
    let base = format!("eval-{slug}");
    let mut name = base.clone();
    for n in 2.. {
        if store.check_name_free(&name, false).await.is_ok() {
            break;
        }
        name = format!("{base}-{n}");
    }
    Ok(name)
}

/// An evaluation to store as a finished run.
struct StoredResult<'a> {
    /// What the run is named after, without `--name`.
    stem: &'a str,
    cfg: &'a RunConfig,
    outcome: &'a EvalOutcome,
    notes: &'a str,
    seconds: f64,
    overwrite: bool,
}

impl StoredResult<'_> {
    /// The run: its config, its metrics and answers as stage `eval` step 1, the rewards' errors
    /// as warnings, tagged `eval`.
    fn store(
        &self,
        rt: &tokio::runtime::Runtime,
        store: &Store,
        args: &EvalArgs,
    ) -> Result<String> {
        // Checked again now, after the evaluation: another process may have taken the name.
        rt.block_on(check_name(store, args))?;
        let name = rt.block_on(run_name(store, args, self.stem))?;
        let cfg = RunConfig {
            name: name.clone(),
            ..self.cfg.clone()
        }
        .with_absolute_paths();
        let new = NewRun {
            name: name.clone(),
            config_json: serde_json::to_string(&cfg).context("encoding the config")?,
            config_hash: cfg.hash(),
            git_revision: None,
            seed: cfg.seed,
            output_dir: String::new(),
        };
        let id =
            rt.block_on(store.create_run(&new, self.overwrite, &ProcessIdentity::current()))?;
        // Tagged at once, and deleted whole if any write fails: a half-stored evaluation must
        // not be left to pass for a run of another kind.
        let written = self.write(rt, store, id);
        if let Err(e) = written {
            let _ = rt.block_on(store.delete_run(id));
            return Err(e.context(format!("storing the evaluation as run '{name}' (not kept)")));
        }
        Ok(name)
    }

    fn write(
        &self,
        rt: &tokio::runtime::Runtime,
        store: &Store,
        id: crate::store::RunId,
    ) -> Result<()> {
        rt.block_on(async {
            store.add_tags(id, &[EVAL_TAG.to_string()]).await?;
            store.set_notes(id, self.notes).await
        })?;
        let (writer, task) = {
            let _in_runtime = rt.enter();
            store.spawn_writer()
        };
        let mut points: Vec<(String, f64)> = self
            .outcome
            .metrics
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        points.push(("time/eval".into(), self.seconds));
        writer.metrics_blocking(id, Stage::Eval.as_str(), 1, self.seconds, points)?;
        writer.samples_blocking(id, self.outcome.samples.clone())?;
        for (domain, error, n) in &self.outcome.reward_errors {
            let text = format!("domain '{domain}': {error} ({})", scored_zero(*n));
            writer.event_blocking(Some(id), EventRecord::message(EventKind::Warning, text))?;
        }
        writer.event_blocking(Some(id), EventRecord::message(EventKind::Info, self.notes))?;
        writer.status_blocking(id, RunStatus::Finished, None)?;
        writer.flush_blocking()?;
        drop(writer);
        rt.block_on(task).context("the store's writer stopped")?;
        Ok(())
    }
}

/// `1 answer scored 0`, `3 answers scored 0`.
fn scored_zero(n: usize) -> String {
    format!("{n} answer{} scored 0", crate::text::plural_s(n))
}

fn progress_bar(quiet: bool, total: u64) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "eval [{bar:30}] {pos}/{len} answers {elapsed_precise} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// One line per domain: its prompts and `val/<domain>/…` figures.
fn print_table(outcome: &EvalOutcome, counts: &[(String, usize)], k: usize) {
    let (mean, pass) = (format!("mean@{k}"), format!("pass@{k}"));
    println!(
        "{:<16} {:>7} {:>8} {:>8} {:>8} {:>8}",
        "DOMAIN", "PROMPTS", mean, pass, "ACCURACY", "LENGTH"
    );
    for (domain, prompts) in counts {
        let get = |name: &str| {
            outcome
                .metrics
                .get(&format!("val/{domain}/{name}"))
                .copied()
                .unwrap_or(f64::NAN)
        };
        println!(
            "{:<16} {:>7} {:>8.3} {:>8.3} {:>8.3} {:>8.1}",
            crate::text::clean(domain, 16, false),
            prompts,
            get(&mean),
            get(&pass),
            get("accuracy"),
            get("response_length")
        );
    }
}
