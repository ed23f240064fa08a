//! `roll-tui env list`, `roll-tui env play` and `roll-tui env serve`: the environments, one
//! episode played by hand (`--actions`) or at random (`--policy random`) and printed step by step,
//! and one environment served over the external protocol.

use anyhow::{Result, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::{EnvPlayArgs, EnvServeArgs};
use crate::data::mix_seed;
use crate::env::{ActionParser, DEFAULT_FORMAT_PENALTY, ENVS, Episode, make};

pub fn list() -> Result<()> {
    for (name, what, params) in ENVS {
        println!("{name}\n  {what}\n  parameters: {params}");
    }
    Ok(())
}

/// `key=value` pairs; a malformed one names itself.
fn params(set: &[String]) -> Result<Vec<(String, String)>> {
    set.iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
            _ => bail!("--set '{kv}': expected key=value"),
        })
        .collect()
}

pub fn play(args: EnvPlayArgs) -> Result<()> {
    let env = make(&args.env, &params(&args.set)?).map_err(anyhow::Error::msg)?;
    let random = match args.policy.as_deref() {
        None if args.actions.is_empty() => {
            bail!("say how to act: --actions A,B,… or --policy random")
        }
        None => false,
        Some("random") => true,
        Some(other) => bail!("--policy '{other}': the only policy here is 'random'"),
    };
    // Actions are given as the policy's answer would be parsed: the whole text is the action.
    let parser = ActionParser::new(r"(?s)^(.*)$").map_err(anyhow::Error::msg)?;
    let mut episode = Episode::new(env, parser, DEFAULT_FORMAT_PENALTY);
    let observation = episode.reset(args.seed)?;
    let hash = episode.env().state_hash();
    if args.json {
        println!(
            "{}",
            json!({"step": 0, "seed": args.seed, "observation": observation, "state_hash": hash})
        );
    } else {
        println!("{} · seed {}\n{observation}\n", args.env, args.seed);
    }
    let mut rng = StdRng::seed_from_u64(mix_seed(&[args.seed, 3]));
    let mut given = args.actions.iter();
    let mut total = 0.0;
    for n in 1..=args.max_steps {
        let action = if random {
            let actions = episode.env().actions();
            if actions.is_empty() {
                bail!(
                    "--policy random: '{}' lists no actions to draw from (an external program \
                     lists them in its replies' 'actions'); give --actions instead",
                    args.env
                );
            }
            actions[rng.random_range(0..actions.len())].clone()
        } else {
            match given.next() {
                Some(a) => a.clone(),
                None => break,
            }
        };
        let step = episode.step(&action)?;
        total += step.reward;
        if args.json {
            println!(
                "{}",
                json!({
                    "step": n, "action": action, "observation": step.observation,
                    "reward": step.reward, "done": step.done, "info": step.info,
                    "state_hash": episode.env().state_hash(),
                })
            );
        } else {
            let info = serde_json::to_string(&step.info)?;
            println!(
                "step {n} · action '{action}' · reward {} · done {}\n  info {info}\n{}\n",
                step.reward, step.done, step.observation
            );
        }
        if step.done {
            break;
        }
    }
    if !args.json {
        println!(
            "return {total} over {} steps ({} invalid){}",
            episode.steps,
            episode.invalid_actions,
            if episode.done { "" } else { ", not done" }
        );
    }
    Ok(())
}

pub fn serve(args: EnvServeArgs) -> Result<()> {
    if args.env == "external" {
        bail!("env serve runs a built-in environment; an external one is its own program already");
    }
    let env = make(&args.env, &params(&args.set)?).map_err(anyhow::Error::msg)?;
    // No PR_SET_PDEATHSIG here: it fires when the spawning *thread* ends, and the trainer starts
    // env processes from short-lived threads. The end of stdin (the trainer gone) ends this loop.
    crate::env::serve::serve(
        env.as_ref(),
        std::io::stdin().lock(),
        std::io::stdout().lock(),
    )?;
    Ok(())
}
