//! Where sessions and model policies come from: an environment by name, a run's stored episode at
//! a turn, a Hugging Face directory or a run's checkpoint (`RUN@STEP`) as the model.

use std::path::{Path, PathBuf};

use super::policy::ModelPolicy;
use super::session::Session;
use crate::config::{EnvConfig, RunConfig};
use crate::env::make;
use crate::metrics::TrajectoryRecord;
use crate::model::load_model_dir;
use crate::rollout::SamplingParams;
use crate::store::Store;
use crate::store::runs::RunInfo;
use candle_core::DType;

/// The config of an environment debugged outside any run: its name and parameters, every other
/// setting at its default (the default action parser and format penalty, trajectory mode).
pub fn env_config(name: &str, params: &[(String, String)]) -> Result<EnvConfig, String> {
    let params: serde_json::Map<String, serde_json::Value> = params
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    serde_json::from_value(serde_json::json!({"name": name, "params": params}))
        .map_err(|e| format!("environment '{name}': {e}"))
}

/// A fresh session of `env` from `seed`.
pub fn session(env: &EnvConfig, seed: u64) -> Result<Session, String> {
    let params = env.param_pairs();
    let prototype = make(&env.name, &params)?;
    Session::start(
        &env.name,
        params,
        prototype,
        env.parser()?,
        env.format_penalty,
        seed,
    )
    .map_err(|e| e.to_string())
}

/// A run's stored episode and what is needed to rebuild it.
#[derive(Debug)]
pub struct StoredEpisode {
    pub run: RunInfo,
    pub cfg: RunConfig,
    pub env: EnvConfig,
    pub record: TrajectoryRecord,
    /// The run's RL checkpoints still on disk, by step, in order: the models the debugger can
    /// load for it.
    pub rl_checkpoints: Vec<usize>,
}

impl StoredEpisode {
    /// The model spec of the policy that played the episode, or the nearest one the run can
    /// load: its policy version v is the policy after RL step v, `RUN@rl-v`, when a checkpoint
    /// was written there; else the last RL checkpoint before it; else `RUN@rl-0` (the policy
    /// before any update, which is rebuilt from the run's config).
    pub fn played_by(&self) -> String {
        let v = self.record.policy_version;
        let step = self
            .rl_checkpoints
            .iter()
            .rev()
            .find(|&&s| s <= v)
            .copied()
            .unwrap_or(0);
        format!("{}@rl-{step}", self.run.name)
    }
}

/// The steps of the RL checkpoints still on disk (a later timed save replaces the one before).
pub fn loadable_rl_steps(checkpoints: &[crate::metrics::CheckpointRecord]) -> Vec<usize> {
    checkpoints
        .iter()
        .filter(|c| c.stage == "rl" && c.path.is_dir())
        .map(|c| c.step)
        .collect()
}

/// The config a run recorded, and its `rl.env`.
pub fn run_env(run: &RunInfo) -> Result<(RunConfig, EnvConfig), String> {
    let cfg: RunConfig = serde_json::from_str(&run.config_json)
        .map_err(|e| format!("run '{}': its stored config cannot be read: {e}", run.name))?;
    let env = cfg
        .rl
        .as_ref()
        .and_then(|rl| rl.env.clone())
        .ok_or_else(|| {
            format!(
                "run '{}' has no rl.env: only agentic runs have episodes",
                run.name
            )
        })?;
    Ok((cfg, env))
}

/// Episode `episode` of group `group` at `step` of `run` (a name or id): of the env label `env`
/// when given (`val/tiny` for an evaluation episode), else a training episode first.
pub async fn stored_episode(
    store: &Store,
    run: &str,
    step: u64,
    group: usize,
    episode: usize,
    label: Option<&str>,
) -> Result<StoredEpisode, String> {
    let run = store.find_run(run).await.map_err(|e| e.to_string())?;
    let (cfg, env) = run_env(&run)?;
    let all = store
        .trajectories(run.id, Some(step))
        .await
        .map_err(|e| e.to_string())?;
    if all.is_empty() {
        return Err(format!(
            "run '{}' stored no episodes at step {step} (see 'roll-tui trajectories {}')",
            run.name, run.name
        ));
    }
    let record = all
        .iter()
        .find(|t| {
            t.group == group
                && t.episode == episode
                && label.map_or(!t.env.starts_with("val/"), |e| t.env == e)
        })
        .or_else(|| {
            all.iter()
                .find(|t| t.group == group && t.episode == episode)
        })
        .cloned()
        .ok_or_else(|| {
            let there: Vec<String> = all
                .iter()
                .map(|t| format!("{}/{}", t.group, t.episode))
                .collect();
            format!(
                "run '{}' step {step} has no episode {episode} in group {group} (group/episode \
                 stored: {})",
                run.name,
                there.join(", ")
            )
        })?;
    let rl_checkpoints =
        loadable_rl_steps(&store.checkpoints(run.id).await.map_err(|e| e.to_string())?);
    Ok(StoredEpisode {
        run,
        cfg,
        env,
        record,
        rl_checkpoints,
    })
}

/// The stored episode replayed from its seed and left before turn `at` (0-based; past the end:
/// after the last stored turn).
pub fn session_at(stored: &StoredEpisode, at: usize) -> Result<Session, String> {
    let recorded: Vec<(String, String)> = stored
        .record
        .turns
        .iter()
        .map(|t| (t.observation.clone(), t.action_text.clone()))
        .collect();
    session(&stored.env, stored.record.env_seed)?
        .open_recorded(&recorded, at)
        .map_err(|e| format!("replaying the stored episode: {e}"))
}

/// A model given as `DIR` (a Hugging Face directory) or `RUN@STEP` / `RUN@rl-STEP` /
/// `RUN@sft-STEP` / `RUN` (a run's checkpoint at that step, of that stage when named, or its
/// latest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    Dir(PathBuf),
    Run {
        run: String,
        stage: Option<String>,
        step: Option<usize>,
    },
}

impl ModelSpec {
    /// The spec of run `run`'s checkpoint at `step` of `stage`: `RUN@STAGE-STEP`. Always with
    /// the stage: `@60` of SFT would read as later than `@30` of RL.
    pub fn of_checkpoint(run: &str, stage: &str, step: usize) -> String {
        format!("{run}@{stage}-{step}")
    }

    pub fn parse(text: &str) -> ModelSpec {
        let path = Path::new(text);
        // A run's name holds no path separator, so a text with one is a directory even when it
        // is missing (and its error says so, not that no run has that name).
        if path.is_dir() || path.exists() || text.contains(['/', '\\']) {
            return ModelSpec::Dir(path.to_path_buf());
        }
        let whole = || ModelSpec::Run {
            run: text.to_string(),
            stage: None,
            step: None,
        };
        let Some((run, at)) = text.rsplit_once('@') else {
            return whole();
        };
        let (stage, step) = match at.split_once('-') {
            Some((stage, step)) if crate::config::Stage::parse(stage).is_some() => {
                (Some(stage), step)
            }
            _ => (None, at),
        };
        match step.parse::<usize>() {
            Ok(step) => ModelSpec::Run {
                run: run.to_string(),
                stage: stage.map(str::to_string),
                step: Some(step),
            },
            Err(_) => whole(),
        }
    }
}

/// Load the model `spec` names as a policy prompting for episodes of `env`. A run's checkpoint
/// keeps what its run set: the chat template setting, sampling (with the env's tokens per turn),
/// and its `rl.env` in [`ModelPolicy::run_env`].
pub async fn model_policy(
    store: Option<&Store>,
    spec: &ModelSpec,
    env: &EnvConfig,
) -> Result<ModelPolicy, String> {
    match spec {
        ModelSpec::Dir(dir) => {
            // In f32 whatever the directory stores (Hugging Face checkpoints are mostly bf16):
            // the dtype a run computes in by default; a bf16 model computes in f32 on the CPU
            // too, but widens its weights at every step and rounds its hidden states.
            let device = crate::device::tool_device().map_err(|e| e.to_string())?;
            let model =
                load_model_dir(dir, Some(DType::F32), &device).map_err(|e| e.to_string())?;
            let chat_template = model.tokenizer.chat_template.is_some();
            ModelPolicy::new(
                dir.display().to_string(),
                model,
                chat_template,
                env,
                SamplingParams::default(),
            )
        }
        ModelSpec::Run { run, stage, step } => {
            let store = store.ok_or("a model from a run needs the store")?;
            let found = run_model(store, run, stage.as_deref(), *step).await?;
            from_run(found.source, found.model, &found.cfg, env)
        }
    }
}

/// A model of a stored run: `source` names it (`RUN@STAGE-STEP`), `cfg` is the run's config.
pub struct RunModel {
    pub source: String,
    pub model: crate::model::LoadedModel,
    pub cfg: RunConfig,
}

/// Run `run`'s checkpoint at `step` of `stage` (of any stage when `None`; the latest without a
/// step), loaded as its run computes; step 0 of RL is the policy before any update.
pub async fn run_model(
    store: &Store,
    run: &str,
    stage: Option<&str>,
    step: Option<usize>,
) -> Result<RunModel, String> {
    let info = store.find_run(run).await.map_err(|e| {
        // `qs@abc`: a step that is not a number leaves the whole text as the run's name.
        let form = match run.contains('@') {
            true => " (a checkpoint is RUN@STEP: RUN@12, RUN@rl-12, RUN@sft-40)",
            false => "",
        };
        format!("'{run}' is neither a model directory nor a run in the store: {e}{form}")
    })?;
    let cfg: RunConfig = serde_json::from_str(&info.config_json)
        .map_err(|e| format!("run '{}': its stored config cannot be read: {e}", info.name))?;
    let checkpoints = store
        .checkpoints(info.id)
        .await
        .map_err(|e| e.to_string())?;
    // Step 0 of RL: the policy before any update (SFT's last checkpoint, or the configured
    // model, rebuilt from its seed when it is a random init).
    if step == Some(0) && stage.is_none_or(|s| s == "rl") {
        let model = crate::pipeline::setup::rl_start_policy(&cfg).map_err(|e| e.to_string())?;
        let source = format!("{}@rl-0", info.name);
        return Ok(RunModel { source, model, cfg });
    }
    // A periodic save replaces the one before it: only those still on disk can be loaded.
    let (kept, replaced): (Vec<_>, Vec<_>) = checkpoints.iter().partition(|c| c.path.is_dir());
    let matches = |c: &&crate::metrics::CheckpointRecord| {
        step.is_none_or(|s| c.step == s) && stage.is_none_or(|st| c.stage == st)
    };
    let chosen = match step {
        Some(_) => kept
            .iter()
            .copied()
            .filter(matches)
            .max_by_key(|c| c.stage == "rl"),
        None => kept.last().copied(),
    };
    let Some(checkpoint) = chosen else {
        let on_disk: Vec<String> = kept
            .iter()
            .map(|c| ModelSpec::of_checkpoint(&info.name, &c.stage, c.step))
            .collect();
        let why = if replaced.iter().any(matches) && step.is_some() {
            " any more: a later checkpoint replaced it".to_string()
        } else {
            String::new()
        };
        let list = match (
            on_disk.is_empty(),
            info.tags.iter().any(|t| t == "eval"),
            replaced.len(),
        ) {
            (false, _, _) => on_disk.join(", "),
            (true, true, _) => "none: it is an evaluation, which trains nothing".into(),
            (true, false, 0) => "none; it stopped before writing one".into(),
            (true, false, 1) => "none; its recorded checkpoint is no longer on disk (moved or \
                                   deleted)"
                .into(),
            (true, false, n) => {
                format!(
                    "none; its {n} recorded checkpoints are no longer on disk (moved or deleted)"
                )
            }
        };
        return Err(format!(
            "run '{}' has no checkpoint{}{why} (checkpoints on disk: {list})",
            info.name,
            step.map(|s| format!(
                " at {}step {s}",
                stage.map(|st| format!("{st} ")).unwrap_or_default()
            ))
            .unwrap_or_default(),
        ));
    };
    let model = crate::pipeline::setup::load_checkpoint_policy(&cfg, &checkpoint.path)
        .map_err(|e| e.to_string())?;
    let source = ModelSpec::of_checkpoint(&info.name, &checkpoint.stage, checkpoint.step);
    Ok(RunModel { source, model, cfg })
}

/// A model of run `cfg` as the policy, with what the run set.
fn from_run(
    source: String,
    model: crate::model::LoadedModel,
    cfg: &RunConfig,
    env: &EnvConfig,
) -> Result<ModelPolicy, String> {
    let run_env = cfg.rl.as_ref().and_then(|rl| rl.env.clone());
    let mut sampling = cfg
        .rl
        .as_ref()
        .map(|rl| rl.sampling.clone())
        .unwrap_or_default();
    if let Some(per_turn) = run_env.as_ref().and_then(|e| e.max_tokens_per_turn) {
        sampling.max_new_tokens = per_turn;
    }
    let mut policy = ModelPolicy::new(source, model, cfg.data.chat_template, env, sampling)?;
    policy.run_env = run_env;
    policy.template_options = cfg.data.chat_template_options.clone();
    Ok(policy)
}

/// The env config to debug `name` with (its parameters `set`, when any are given): the run's own
/// `rl.env` when the model comes from a run of that env (its action pattern, penalty, turns,
/// mode and instruction are what the model learned with), else the defaults — then with a
/// warning when the model was trained on another env.
pub fn env_for_model(
    name: &str,
    set: &[(String, String)],
    run_env: Option<&EnvConfig>,
) -> Result<(EnvConfig, Option<String>), String> {
    match run_env {
        Some(run) if run.name == name => {
            let mut env = run.clone();
            if !set.is_empty() {
                env.params = env_config(name, set)?.params;
            }
            Ok((env, None))
        }
        Some(run) => Ok((
            env_config(name, set)?,
            Some(format!(
                "the model was trained on '{}', not '{name}': '{name}' is played with its \
                 default settings (action pattern, penalty, turns)",
                run.name
            )),
        )),
        None => Ok((env_config(name, set)?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf_dir::tiny_test_options;
    use crate::model::{InitOptions, init_model, save_model_dir};

    #[test]
    fn only_checkpoints_still_on_disk_are_offered() {
        let dir = tempfile::tempdir().unwrap();
        let at = |stage: &str, step: usize| crate::metrics::CheckpointRecord {
            stage: stage.into(),
            step,
            path: dir.path().join(format!("{stage}-step{step}")),
            bytes: 1,
        };
        let records = [at("sft", 4), at("rl", 2), at("rl", 5), at("rl", 8)];
        for kept in [&records[0], &records[2], &records[3]] {
            std::fs::create_dir(&kept.path).unwrap();
        }
        // rl-2 was replaced by a later save; sft checkpoints are not RL policies.
        assert_eq!(loadable_rl_steps(&records), [5, 8]);
    }

    #[test]
    fn run_at_step_names_any_stage() {
        let spec = |text: &str| match ModelSpec::parse(text) {
            ModelSpec::Run { run, stage, step } => (run, stage, step),
            ModelSpec::Dir(d) => panic!("{d:?} is no run"),
        };
        for stage in crate::config::Stage::ALL {
            assert_eq!(
                spec(&format!("r@{stage}-7")),
                ("r".into(), Some(stage.to_string()), Some(7))
            );
        }
        assert_eq!(spec("r@12"), ("r".into(), None, Some(12)));
        // A path is a directory, there or not: no run's name has a separator.
        assert_eq!(
            ModelSpec::parse("/no/such/model"),
            ModelSpec::Dir("/no/such/model".into())
        );
        // Not a stage: the whole text is the run's name.
        assert_eq!(spec("r@grpo-3"), ("r@grpo-3".into(), None, None));
        // What the debugger offers names the stage, and reads back as that checkpoint.
        assert_eq!(ModelSpec::of_checkpoint("lake", "sft", 60), "lake@sft-60");
        assert_eq!(
            spec(&ModelSpec::of_checkpoint("lake", "rl", 30)),
            ("lake".into(), Some("rl".into()), Some(30))
        );
    }

    /// A bf16 checkpoint directory (as Hugging Face ships most) is debugged in f32, as
    /// `roll-tui run` computes by default.
    #[tokio::test]
    async fn a_bf16_directory_is_debugged_in_f32() {
        let dir = tempfile::tempdir().unwrap();
        let stored = init_model(&InitOptions {
            dtype: "bfloat16".into(),
            ..tiny_test_options("SFHG", 64, 3)
        })
        .unwrap();
        assert_eq!(stored.transformer.dtype(), DType::BF16);
        save_model_dir(dir.path(), &stored).unwrap();
        // The directory holds bf16: loaded as stored, its weights are bf16.
        let as_stored = load_model_dir(dir.path(), None, &candle_core::Device::Cpu).unwrap();
        assert_eq!(as_stored.transformer.dtype(), DType::BF16);
        let env = env_config("frozen_lake", &[]).unwrap();
        let spec = ModelSpec::parse(dir.path().to_str().unwrap());
        let policy = model_policy(None, &spec, &env).await.unwrap();
        assert_eq!(policy.model().transformer.dtype(), DType::F32);
    }
}
