//! `roll-tui env debug`: the workbench opened on its Env view, on a fresh episode of an env
//! (`ENV --seed N --set k=v…`) or on a run's stored episode at a turn (`--run RUN --step S
//! --group G --episode E --turn K`), with a model (`--model DIR|RUN@STEP`) loading at once.

use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Result, bail};

use super::env_cmd::params;
use super::env_play::flag_names;
use super::store_cmd::with_store;
use super::{EnvDebugArgs, SamplingArgs};
use crate::config::EnvConfig;
use crate::debugger::open::{ModelSpec, env_for_model, run_env};
use crate::debugger::policy::SamplingOverrides;
use crate::rollout::SamplingParams;
use crate::tui::debugger::{DEFAULT_ENV, DebugView};

impl SamplingArgs {
    /// The flags as overrides of a model's own sampling, checked over the defaults.
    pub fn overrides(&self) -> Result<SamplingOverrides> {
        let over = SamplingOverrides {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            max_new_tokens: self.max_tokens,
        };
        let mut s = SamplingParams::default();
        over.apply(&mut s);
        let mut problems = vec![];
        s.validate("sampling", &mut problems);
        if !problems.is_empty() {
            bail!("{}", flag_names(&problems.join("; ")));
        }
        Ok(over)
    }
}

/// The env to debug `name` in: with a model from a run of that env, the run's own settings.
fn env_to_debug(store: &Path, name: &str, args: &EnvDebugArgs) -> Result<EnvConfig> {
    let set = params(&args.set)?;
    let trained_on = match args.model.as_deref().map(ModelSpec::parse) {
        Some(ModelSpec::Run { run, .. }) if store.exists() => with_store(store, |s| async move {
            let info = s.find_run(&run).await?;
            Ok(run_env(&info).ok().map(|(_, env)| env))
        })
        .unwrap_or(None),
        _ => None,
    };
    let (env, warning) =
        env_for_model(name, &set, trained_on.as_ref()).map_err(anyhow::Error::msg)?;
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    Ok(env)
}

pub fn debug(store: &Path, args: EnvDebugArgs) -> Result<()> {
    if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
        bail!(
            "env debug is interactive and needs a terminal; `roll-tui env play` plays an episode \
             headless (--policy random|model:DIR|model:RUN@STEP, --json)"
        );
    }
    let overrides = args.sampling.overrides()?;
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
            let env = env_to_debug(store, args.env.as_deref().unwrap_or(DEFAULT_ENV), &args)?;
            crate::env::make(&env.name, &env.param_pairs()).map_err(anyhow::Error::msg)?;
            let view = DebugView::new(env, args.seed);
            if let Some(e) = &view.error {
                bail!("{e}");
            }
            (view, vec![])
        }
    };
    view.overrides = overrides;
    if let Some(spec) = &args.model {
        view.model_spec = spec.clone();
        jobs.push(view.load_model(spec));
    }
    crate::tui::run_debugger(store, view, jobs)
}
