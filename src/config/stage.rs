//! The stages a run goes through, in order: each has its own config section (`sft:`, `rl:`), its
//! pipeline, its metric series and checkpoints in the store, and its panels in the workbench.
//! Adding a stage starts with a variant here, its section in `RunConfig` and its module in
//! `pipeline/`.

use super::{DistillConfig, DpoConfig, RlConfig, RunConfig, SftConfig};
use crate::names::Stage;

/// One stage of a run with its config section.
#[derive(Debug, Clone, Copy)]
pub enum StageConfig<'a> {
    Sft(&'a SftConfig),
    Distill(&'a DistillConfig),
    Dpo(&'a DpoConfig),
    Rl(&'a RlConfig),
}

impl StageConfig<'_> {
    pub fn stage(&self) -> Stage {
        match self {
            StageConfig::Sft(_) => Stage::Sft,
            StageConfig::Distill(_) => Stage::Distill,
            StageConfig::Dpo(_) => Stage::Dpo,
            StageConfig::Rl(_) => Stage::Rl,
        }
    }
}

impl RunConfig {
    /// The run's stages in the order it goes through them: every stage whose section the config
    /// has, in [`Stage::ALL`] order.
    pub fn stages(&self) -> Vec<StageConfig<'_>> {
        Stage::ALL
            .into_iter()
            .filter_map(|stage| match stage {
                Stage::Sft => self.sft.as_ref().map(StageConfig::Sft),
                Stage::Distill => self.distill.as_ref().map(StageConfig::Distill),
                Stage::Dpo => self.dpo.as_ref().map(StageConfig::Dpo),
                Stage::Rl => self.rl.as_ref().map(StageConfig::Rl),
                // `roll-tui eval`'s: no section asks for it.
                Stage::Eval => None,
            })
            .collect()
    }

    /// The stage a run goes through just before `stage` (whose final checkpoint `stage` starts
    /// from), `None` when `stage` is the run's first or not one of its stages.
    pub fn stage_before(&self, stage: Stage) -> Option<StageConfig<'_>> {
        let stages = self.stages();
        let at = stages.iter().position(|s| s.stage() == stage)?;
        at.checked_sub(1).map(|i| stages[i])
    }

    /// The steps of `stage` in this run (0 when the run has no such stage).
    pub fn steps_of(&self, stage: Stage) -> usize {
        self.stages()
            .into_iter()
            .find(|s| s.stage() == stage)
            .map_or(0, |s| match s {
                StageConfig::Sft(c) => c.steps,
                StageConfig::Distill(c) => c.steps,
                StageConfig::Dpo(c) => c.steps,
                StageConfig::Rl(c) => c.steps,
            })
    }

    /// The stage the run ends with.
    pub fn last_stage(&self) -> Option<Stage> {
        self.stages().last().map(StageConfig::stage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_sort_last() {
        for s in Stage::ALL {
            assert_eq!(Stage::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap_or_default(),
                format!("\"{s}\"")
            );
        }
        assert_eq!(Stage::parse("grpo"), None);
        assert_eq!(
            (
                Stage::rank_of("sft"),
                Stage::rank_of("distill"),
                Stage::rank_of("dpo"),
                Stage::rank_of("rl"),
                Stage::rank_of("eval"),
                Stage::rank_of("x")
            ),
            (0, 1, 2, 3, 4, 5)
        );
        assert_eq!(
            Stage::Sft.later(),
            [Stage::Distill, Stage::Dpo, Stage::Rl, Stage::Eval]
        );
        assert!(Stage::Eval.later().is_empty());
    }
}
