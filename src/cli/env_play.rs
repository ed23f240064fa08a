//! `roll-tui env play`: one episode played headless through the debugger's session — by hand
//! (`--actions`), at random, or by a model (`--policy model:DIR|model:RUN@STEP`, with each turn's
//! prompt, raw output, parsed action and per-token log-probs, and with `--samples N` the
//! distribution of actions over N draws) — printed turn by turn as text or JSON lines.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use super::env_cmd::params;
use super::store_cmd::with_store;
use super::{EnvPlayArgs, SamplingArgs};
use crate::config::EnvConfig;
use crate::debugger::open::{ModelSpec, env_config, env_for_model, model_policy, session};
use crate::debugger::record::add_model_turn;
use crate::debugger::{Actor, ModelPolicy, Resample, Session};
use crate::seed::mix_seed;

/// How much of a prompt the text output shows (its end: the newest turn).
const PROMPT_TAIL_CHARS: usize = 300;

enum Policy {
    Given(Vec<String>),
    Random,
    Model(Box<ModelPolicy>),
}

/// Load the model `spec` names (`DIR`, `RUN@STEP`, `RUN`) as the policy of episodes of `env`.
pub(super) fn load_model(store: &Path, spec: &str, env: &EnvConfig) -> Result<ModelPolicy> {
    let parsed = ModelSpec::parse(spec);
    let policy = match &parsed {
        ModelSpec::Dir(_) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(model_policy(None, &parsed, env))
                .map_err(anyhow::Error::msg)?
        }
        ModelSpec::Run { .. } => {
            if !store.exists() {
                bail!(
                    "'{spec}' is not a model directory, and there is no store at '{}' to find it \
                     in as a run",
                    store.display()
                );
            }
            with_store(store, |s| async move {
                model_policy(Some(&s), &parsed, env)
                    .await
                    .map_err(anyhow::Error::msg)
            })?
        }
    };
    Ok(policy)
}

/// Put `over`'s settings on `policy`'s sampling and check the result.
fn apply_sampling(policy: &mut ModelPolicy, over: &SamplingArgs) -> Result<()> {
    over.overrides()?.apply(&mut policy.sampling);
    let s = &policy.sampling;
    let mut problems = vec![];
    s.validate("sampling", &mut problems);
    match problems.is_empty() {
        true => Ok(()),
        false => bail!("{}", flag_names(&problems.join("; "))),
    }
}

/// Sampling problems in the flags' words (`sampling.max_new_tokens` is `--max-tokens`).
pub(super) fn flag_names(text: &str) -> String {
    text.replace("sampling.max_new_tokens", "--max-tokens")
        .replace("sampling.temperature", "--temperature")
        .replace("sampling.top_p", "--top-p")
        .replace("sampling.top_k", "--top-k")
}

/// The seed a model's turn `turn` of an episode from `seed` is drawn with.
pub(super) fn turn_seed(seed: u64, turn: usize) -> u64 {
    mix_seed(&[seed, 0xdd, turn as u64])
}

pub fn play(store: &Path, args: EnvPlayArgs) -> Result<()> {
    let set = params(&args.set)?;
    let (policy, env) = match args.policy.as_deref() {
        None if args.actions.is_empty() => {
            bail!("say how to act: --actions A,B,… or --policy random|model:DIR|model:RUN@STEP")
        }
        None => (Policy::Given(args.actions.clone()), bare(&args.env, &set)?),
        Some("random") => (Policy::Random, bare(&args.env, &set)?),
        Some(p) if p.starts_with("model:") => {
            let defaults = env_config(&args.env, &set).map_err(anyhow::Error::msg)?;
            let mut model = load_model(store, &p["model:".len()..], &defaults)?;
            let (env, warning) = env_for_model(&args.env, &set, model.run_env.as_ref())
                .map_err(anyhow::Error::msg)?;
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            model.for_env(&env).map_err(anyhow::Error::msg)?;
            apply_sampling(&mut model, &args.sampling)?;
            (Policy::Model(Box::new(model)), env)
        }
        Some(other) => {
            bail!("--policy '{other}': expected random, model:DIR or model:RUN@STEP")
        }
    };
    if args.samples.is_some() && !matches!(policy, Policy::Model(_)) {
        bail!("--samples draws a model's turns: give --policy model:…");
    }
    if args.samples == Some(0) {
        bail!("--samples must be at least 1");
    }
    // A run's env brings its turn limit; otherwise play until the env ends it (or 100 steps).
    let from_run = matches!(&policy, Policy::Model(m) if m.run_env.as_ref().is_some_and(|r| r.name == env.name));
    let max_steps = args
        .max_steps
        .unwrap_or(if from_run { env.max_turns } else { 100 });
    let mut session = session(&env, args.seed).map_err(anyhow::Error::msg)?;
    let hash = session.env().state_hash();
    let observation = session.observation().to_string();
    if args.json {
        println!(
            "{}",
            json!({"step": 0, "seed": args.seed, "observation": observation, "state_hash": hash})
        );
    } else {
        println!("{} · seed {}\n{observation}\n", args.env, args.seed);
    }
    let mut given = match &policy {
        Policy::Given(actions) => actions.clone().into_iter(),
        _ => Vec::new().into_iter(),
    };
    for n in 1..=max_steps {
        if session.done() {
            break;
        }
        let mut samples = None;
        match &policy {
            Policy::Given(_) => match given.next() {
                Some(a) => take(&mut session, &a, Actor::Human)?,
                None => break,
            },
            Policy::Random => {
                let Some(a) = session.random_action() else {
                    bail!(
                        "--policy random: '{}' lists no actions to draw from (an external program \
                         lists them in its replies' 'actions'); give --actions instead",
                        args.env
                    );
                };
                take(&mut session, &a, Actor::Random)?;
            }
            Policy::Model(model) => {
                let prompt = model
                    .prompt(&session)
                    .map_err(|e| anyhow!("turn {n}: {e}"))?;
                let seed = turn_seed(args.seed, n - 1);
                if let Some(k) = args.samples {
                    let actions = session.env().actions();
                    samples = Some(
                        model
                            .resample(&prompt, k, seed, session.parser(), &actions, None)
                            .map_err(|e| anyhow!("turn {n}: {e}"))?,
                    );
                }
                let (output, turn) = model
                    .generate(&prompt, seed, None)
                    .map_err(|e| anyhow!("turn {n}: {e}"))?;
                session.act(output, Actor::Model, Some(turn))?;
            }
        }
        print_turn(&session, args.json, samples.as_ref())?;
    }
    // Actions given but not played: the episode ended (or hit --max-steps) first.
    let unused: Vec<String> = given.collect();
    if !args.json {
        let invalid = session.turns.iter().filter(|t| !t.valid()).count();
        println!(
            "return {} over {} step{} ({invalid} invalid){}",
            crate::text::reward(session.total_reward()),
            session.turns.len(),
            crate::text::plural_s(session.turns.len()),
            if session.done() { "" } else { ", not done" }
        );
        if !unused.is_empty() {
            println!(
                "{} of the given actions not played ({}): {} first",
                unused.len(),
                unused.join(","),
                if session.done() {
                    "the episode ended"
                } else {
                    "--max-steps came"
                }
            );
        }
    }
    Ok(())
}

/// An env whose actions are given bare (`Down`): the whole output is the action.
fn bare(name: &str, set: &[(String, String)]) -> Result<EnvConfig> {
    let mut env = env_config(name, set).map_err(anyhow::Error::msg)?;
    env.action_pattern = Some(r"(?s)^(.*)$".into());
    Ok(env)
}

fn take(session: &mut Session, action: &str, actor: Actor) -> Result<()> {
    session.take(action, actor)?;
    Ok(())
}

fn samples_json(r: &Resample) -> Value {
    json!({
        "draws": r.draws,
        "mean_logprob": r.mean_logprob,
        "actions": r.counts.iter().map(|c| json!({
            "action": c.action, "count": c.count, "unknown": c.unknown,
        })).collect::<Vec<_>>(),
    })
}

/// `30 × Down · 2 × Up (not an action) · 1 × no action found`
pub(super) fn samples_line(r: &Resample) -> String {
    r.counts
        .iter()
        .map(|c| match (&c.action, c.unknown) {
            (Some(a), false) => format!("{} × {a}", c.count),
            (Some(a), true) => format!("{} × {a} (not an action)", c.count),
            (None, _) => format!("{} × no action found", c.count),
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

fn print_turn(session: &Session, json: bool, samples: Option<&Resample>) -> Result<()> {
    let n = session.turns.len();
    let t = session.turns.last().context("a turn was played")?;
    if json {
        let mut line = json!({
            "step": n,
            "action": match t.actor {
                Actor::Model => t.parsed_action().map(str::to_string),
                _ => Some(t.output.clone()),
            },
            "observation": t.step.observation,
            "reward": t.step.reward,
            "done": t.step.done,
            "info": Value::Object(t.step.info.clone()),
            "state_hash": session.env().state_hash(),
        });
        if let Some(m) = &t.model {
            line["output"] = t.output.clone().into();
            add_model_turn(&mut line, m);
        }
        if let Some(r) = samples {
            line["samples"] = samples_json(r);
        }
        println!("{line}");
        return Ok(());
    }
    let action = match (t.parsed_action(), t.valid()) {
        (Some(a), true) => format!("action '{a}'"),
        _ => format!(
            "no valid action ({})",
            t.invalid_reason().unwrap_or("not an action")
        ),
    };
    println!(
        "step {n} · {} · {action} · reward {} · done {}",
        t.actor.as_str(),
        crate::text::reward(t.step.reward),
        t.step.done
    );
    if let Some(m) = &t.model {
        let tail: String = {
            let chars: Vec<char> = m.prompt_text.chars().collect();
            chars[chars.len().saturating_sub(PROMPT_TAIL_CHARS)..]
                .iter()
                .collect()
        };
        println!("  prompt ({} tokens), ending: {tail:?}", m.prompt_tokens);
        println!("  output: {:?}", t.output);
        if let Some(low) = m
            .tokens
            .iter()
            .min_by(|a, b| a.logprob.total_cmp(&b.logprob))
        {
            let total: f32 = m.tokens.iter().map(|k| k.logprob).sum();
            println!(
                "  log-prob {total:.3} over {} tokens; least likely token {:?} ({:.3})",
                m.tokens.len(),
                low.text,
                low.logprob
            );
        }
    }
    if let Some(r) = samples {
        println!("  samples of {}: {}", r.draws, samples_line(r));
    }
    println!(
        "  info {}\n{}\n",
        serde_json::to_string(&t.step.info)?,
        t.step.observation
    );
    Ok(())
}
