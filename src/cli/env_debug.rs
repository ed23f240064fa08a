//! `roll-tui env debug`: the workbench opened on its Env view, on a fresh episode of an env
//! (`ENV --seed N --set k=v…`) or on a run's stored episode at a turn (`--run RUN --step S
//! --group G --episode E --turn K`), with a model (`--model DIR|RUN@STEP`) loading at once.

use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Result, bail};

use super::env_cmd::params;
use super::store_cmd::with_store;
use super::{EnvDebugArgs, SamplingArgs};
use crate::debugger::open::env_config;
use crate::rollout::SamplingParams;
use crate::tui::debugger::{DEFAULT_ENV, DebugView};
use crate::tui::debugger_input::{parse_sampling, sampling_text};

/// The sampling flags over the defaults, checked; `None` when none was given.
fn sampling(over: &SamplingArgs) -> Result<Option<SamplingParams>> {
    if over.temperature.is_none()
        && over.top_k.is_none()
        && over.top_p.is_none()
        && over.max_tokens.is_none()
    {
        return Ok(None);
    }
    let mut s = SamplingParams::default();
    s.temperature = over.temperature.unwrap_or(s.temperature);
    s.top_k = over.top_k.unwrap_or(s.top_k);
    s.top_p = over.top_p.unwrap_or(s.top_p);
    s.max_new_tokens = over.max_tokens.unwrap_or(s.max_new_tokens);
    // The same check as the view's settings line.
    let (s, _) = parse_sampling(&sampling_text(&s, 32), s).map_err(|e| {
        anyhow::anyhow!(
            "{}",
            e.replace("temperature", "--temperature")
                .replace("top_p", "--top-p")
        )
    })?;
    Ok(Some(s))
}

pub fn debug(store: &Path, args: EnvDebugArgs) -> Result<()> {
    if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
        bail!(
            "env debug is interactive and needs a terminal; `roll-tui env play` plays an episode \
             headless (--policy random|model:DIR|model:RUN@STEP, --json)"
        );
    }
    let sampling = sampling(&args.sampling)?;
    let (mut view, mut jobs) = match &args.run {
        Some(run) => {
            let step = match args.step {
                Some(s) => s,
                None => {
                    let run = run.clone();
                    with_store(store, |s| async move {
                        let info = s.find_run(&run).await?;
                        let steps = s.trajectory_steps(info.id).await?;
                        match steps.iter().filter(|(_, val)| !val).map(|(s, _)| *s).max() {
                            Some(step) => Ok(step),
                            None => bail!("run '{}' stored no episodes", info.name),
                        }
                    })?
                }
            };
            let turn = args.turn.map_or(usize::MAX, |t| t.saturating_sub(1));
            let (view, job) = DebugView::opening(run, step, args.group, args.episode, None, turn);
            (view, vec![job])
        }
        None => {
            let name = args.env.as_deref().unwrap_or(DEFAULT_ENV);
            let env = env_config(name, &params(&args.set)?).map_err(anyhow::Error::msg)?;
            crate::env::make(&env.name, &env.param_pairs()).map_err(anyhow::Error::msg)?;
            let view = DebugView::new(env, args.seed);
            if let Some(e) = &view.error {
                bail!("{e}");
            }
            (view, vec![])
        }
    };
    view.sampling = sampling;
    if let Some(spec) = &args.model {
        view.model_spec = spec.clone();
        jobs.push(view.load_model(spec));
    }
    crate::tui::run_debugger(store, view, jobs)
}
