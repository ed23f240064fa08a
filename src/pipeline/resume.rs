//! Where a resumed run starts: a checkpoint, checked against the run's config before any work.

use std::path::PathBuf;

use super::{REFERENCE_FILE, RunError, setup};
use crate::config::{RunConfig, Stage};
use crate::model::LoadedModel;
use crate::role::critic::{CRITIC_FILE, CRITIC_OPTIMIZER_FILE};
use crate::train::checkpoint::TrainerState;

/// Where a resumed run starts: a checkpoint directory and its trainer state.
#[derive(Debug, Clone)]
pub struct Resume {
    pub dir: PathBuf,
    pub state: TrainerState,
}

impl Resume {
    /// Read `trainer_state.json` of checkpoint `dir` and check it belongs to `cfg` and can be resumed.
    pub fn load(dir: &std::path::Path, cfg: &RunConfig) -> Result<Resume, RunError> {
        let (state, _) = crate::train::checkpoint::load_trainer_state(dir, &crate::device::host())?;
        let bad = |why: String| RunError::Setup(format!("checkpoint '{}': {why}", dir.display()));
        if state.config_hash != cfg.hash() {
            return Err(bad(format!(
                "it belongs to config {} but the run's config is {}",
                state.config_hash,
                cfg.hash()
            )));
        }
        if state.mixer.is_none() {
            return Err(bad("it has no data cursor (written by an older roll-tui); it cannot be resumed exactly".into()));
        }
        if state.stage == Stage::Rl.as_str() && state.rl.is_none() {
            return Err(bad(
                "it has no RL state (KL controller, reward statistics)".into()
            ));
        }
        Ok(Resume {
            dir: dir.to_path_buf(),
            state,
        })
    }

    /// Check, before anything is changed, that this resume can set up: the data still matches the
    /// checkpoint's cursor, the RL stage's KL reference loads, and a critic's files are there.
    pub fn check_setup(&self, cfg: &RunConfig, model: &LoadedModel) -> Result<(), RunError> {
        let data = setup::load_domains(cfg, model)?;
        // An agentic RL stage reads no dataset: its episodes follow from seeds, not a cursor.
        let agentic = self.state.stage == Stage::Rl.as_str()
            && cfg.rl.as_ref().is_some_and(|rl| rl.env.is_some());
        // A DPO stage's cursor is over its pairs (checked by the stage).
        let pairs = self.state.stage == Stage::Dpo.as_str();
        if let Some(m) = self.state.mixer.as_ref().filter(|_| !agentic && !pairs) {
            data.mixer(0)?.restore(m)?;
        }
        let Some(rl) = cfg
            .rl
            .as_ref()
            .filter(|_| self.state.stage == Stage::Rl.as_str())
        else {
            return Ok(());
        };
        if rl.kl.mode != crate::algo::kl::KlMode::None {
            setup::rl_start_policy(cfg)?;
            let refreshed = rl.kl.refresh_every > 0 && self.state.step >= rl.kl.refresh_every;
            if refreshed && !self.dir.join(REFERENCE_FILE).is_file() {
                return Err(RunError::Setup(format!(
                    "checkpoint '{}': the refreshed KL reference '{REFERENCE_FILE}' is missing",
                    self.dir.display()
                )));
            }
        }
        if rl.critic.is_some() && crate::role::rows::needs_critic(rl.adv_estimator) {
            for f in [CRITIC_FILE, CRITIC_OPTIMIZER_FILE] {
                if !self.dir.join(f).is_file() {
                    return Err(RunError::Setup(format!(
                        "checkpoint '{}': the critic file '{f}' is missing",
                        self.dir.display()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The state when resuming `stage`, `None` when the resume point is in another stage.
    pub fn for_stage(resume: Option<&Resume>, stage: Stage) -> Option<Resume> {
        resume.filter(|r| r.state.stage == stage.as_str()).cloned()
    }
}
