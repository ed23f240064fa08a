//! `roll-tui env replay RUN`: rebuild a run's stored episodes from their seeds and recorded
//! outputs with the environment its config names, and check every observation against the stored
//! one. Exits 1 when an episode diverges, after printing where.

use std::path::Path;

use anyhow::{Context, Result, bail};

use super::EnvReplayArgs;
use super::store_cmd::with_store;
use crate::config::RunConfig;
use crate::env::make;
use crate::env::replay::{RecordedTurn, replay as replay_episode};

/// How much of a diverging observation is printed.
const SHOWN_CHARS: usize = 400;

fn shown(text: &str) -> String {
    crate::text::clean(text, SHOWN_CHARS, true)
}

pub fn replay(path: &Path, args: EnvReplayArgs) -> Result<i32> {
    let (run, episodes) = with_store(path, |store| async move {
        let run = store.find_run(&args.run).await?;
        let episodes = store.trajectories(run.id, args.step).await?;
        Ok((run, episodes))
    })?;
    let cfg: RunConfig = serde_json::from_str(&run.config_json)
        .with_context(|| format!("run '{}': its stored config cannot be read", run.name))?;
    let Some(env) = cfg.rl.as_ref().and_then(|rl| rl.env.as_ref()) else {
        bail!(
            "run '{}' has no rl.env: only agentic runs have episodes to replay",
            run.name
        );
    };
    let parser = env.parser().map_err(anyhow::Error::msg)?;
    let prototype = make(&env.name, &env.param_pairs())
        .map_err(|e| anyhow::anyhow!("run '{}': rl.env: {e}", run.name))?;
    let selected: Vec<_> = episodes
        .iter()
        .filter(|t| args.group.is_none_or(|g| t.group == g))
        .filter(|t| args.episode.is_none_or(|e| t.episode == e))
        .collect();
    if selected.is_empty() {
        bail!(
            "run '{}' has no stored episodes matching the filter",
            run.name
        );
    }
    let mut diverged = 0;
    for t in &selected {
        let turns: Vec<RecordedTurn> = t
            .turns
            .iter()
            .map(|u| RecordedTurn {
                observation: &u.observation,
                output: &u.action_text,
            })
            .collect();
        let name = format!(
            "step {} · {} · group {} episode {} · seed {}",
            t.step, t.env, t.group, t.episode, t.env_seed
        );
        let (_, divergence) = replay_episode(
            prototype.clone_box(),
            parser.clone(),
            env.format_penalty,
            t.env_seed,
            &turns,
        )
        .with_context(|| format!("{name}: the environment failed while replaying"))?;
        if let Some(d) = divergence {
            diverged += 1;
            println!(
                "{name}: diverges at turn {}\n  stored:\n{}\n  replayed:\n{}",
                d.turn + 1,
                shown(&d.recorded),
                shown(&d.replayed)
            );
        }
    }
    println!(
        "{} of {} episodes reproduce every stored observation",
        selected.len() - diverged,
        selected.len()
    );
    Ok(i32::from(diverged > 0))
}
