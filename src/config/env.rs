//! `rl.env`: the environment an agentic RL stage acts in, instead of a dataset of prompts. The
//! environments themselves are in `src/env/`; this is only the schema and its checks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::env::{ActionParser, DEFAULT_FORMAT_PENALTY, make};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    /// A registered environment (`roll-tui env list`).
    pub name: String,
    /// The name metrics and samples carry (`env/<tag>/success`); default: `name`.
    #[serde(default)]
    pub tag: Option<String>,
    /// The environment's parameters, as `--set key=value` takes them (`{ size: 4, slippery: true }`).
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
    /// An episode ends after this many turns (counted as cut when the env has not finished it).
    #[serde(default = "default_max_turns")]
    pub max_turns: usize,
    /// Tokens the policy may write per turn (default: `rl.sampling.max_new_tokens`).
    #[serde(default)]
    pub max_tokens_per_turn: Option<usize>,
    /// The whole trajectory (first prompt, every turn and observation) must fit in this many
    /// tokens; an episode that would exceed it is cut and counted (default: the model's positions).
    #[serde(default)]
    pub max_trajectory_tokens: Option<usize>,
    /// Reward of a turn whose output holds no valid action, as a positive penalty.
    #[serde(default = "default_format_penalty")]
    pub format_penalty: f64,
    /// A regex whose first capture group is the action; default: the last `<answer>…</answer>`.
    #[serde(default)]
    pub action_pattern: Option<String>,
    /// Text before the first observation (the system message with a chat template). Default: none
    /// without a chat template; with one, a sentence naming the env and its action format.
    #[serde(default)]
    pub instruction: Option<String>,
    /// `trajectory` (StarPO: one sample per episode, the whole conversation) or `step` (one sample
    /// per turn, its prompt the current observation after the last `history_length` turns
    /// summarised; for `gigpo` and `step_reinforce`).
    #[serde(default)]
    pub mode: EnvMode,
    /// Step mode: how many earlier turns the prompt summarises.
    #[serde(default)]
    pub history_length: usize,
    /// Discount per turn of the step-level returns (gigpo, step_reinforce, agentic_reinforce).
    #[serde(default = "default_step_gamma")]
    pub step_reward_gamma: f64,
    /// gigpo: weight of the episode-level advantage.
    #[serde(default = "one")]
    pub episode_reward_weight: f64,
    /// gigpo: weight of the step-level (anchor-state) advantage.
    #[serde(default = "one")]
    pub step_reward_weight: f64,
    /// Let the engine go on decoding while environments step: an episode's next turn joins the
    /// batch as soon as its step returns, which hides a slow environment's latency. Off (the
    /// default), every step a decode step finished is awaited before the next decode step, so
    /// the same seed gives the same numbers; on, which requests share a batch depends on timing.
    #[serde(default)]
    pub overlap_steps: bool,
    /// Evaluate the policy on a fixed set of episodes every N steps (`val/env/<tag>/…`).
    #[serde(default)]
    pub eval: Option<EnvEval>,
}

/// `rl.env.eval`: validation episodes, from seeds that stay the same at every evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvEval {
    /// Evaluate before steps 1, 1 + every, 1 + 2·every, … (the policy that step starts from).
    pub every: usize,
    #[serde(default = "sixteen")]
    pub episodes: usize,
    /// Sampling temperature of the evaluation; 0 (the default) is greedy.
    #[serde(default)]
    pub temperature: f64,
}

fn sixteen() -> usize {
    16
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvMode {
    #[default]
    Trajectory,
    Step,
}

fn default_step_gamma() -> f64 {
    0.95
}

fn one() -> f64 {
    1.0
}

fn default_max_turns() -> usize {
    10
}

fn default_format_penalty() -> f64 {
    DEFAULT_FORMAT_PENALTY
}

impl EnvConfig {
    pub fn tag(&self) -> &str {
        self.tag.as_deref().unwrap_or(&self.name)
    }

    /// The parameters as `key=value` pairs, numbers and booleans written as YAML writes them.
    pub fn param_pairs(&self) -> Vec<(String, String)> {
        crate::env::param_pairs(&self.params)
    }

    pub fn parser(&self) -> Result<ActionParser, String> {
        match &self.action_pattern {
            Some(p) => ActionParser::new(p),
            None => Ok(ActionParser::default()),
        }
    }

    pub fn validate(&self, at: &str, p: &mut Vec<String>) {
        if let Err(e) = make(&self.name, &self.param_pairs()) {
            p.push(format!("{at}: {e}"));
        }
        if self.max_turns == 0 {
            p.push(format!("{at}.max_turns must be at least 1"));
        }
        if self.max_tokens_per_turn == Some(0) {
            p.push(format!("{at}.max_tokens_per_turn must be at least 1"));
        }
        if !(self.format_penalty.is_finite() && self.format_penalty >= 0.0) {
            p.push(format!(
                "{at}.format_penalty must be >= 0 (it is subtracted), got {}",
                self.format_penalty
            ));
        }
        if let Err(e) = self.parser() {
            p.push(format!("{at}.action_pattern: {e}"));
        }
        if !(0.0..=1.0).contains(&self.step_reward_gamma) {
            p.push(format!(
                "{at}.step_reward_gamma must be in [0, 1], got {}",
                self.step_reward_gamma
            ));
        }
        if !(self.episode_reward_weight.is_finite() && self.step_reward_weight.is_finite()) {
            p.push(format!("{at}: the reward weights must be finite numbers"));
        }
        if let Some(e) = &self.eval
            && (e.every == 0
                || e.episodes == 0
                || !(e.temperature >= 0.0 && e.temperature.is_finite()))
        {
            p.push(format!(
                "{at}.eval needs every >= 1, episodes >= 1 and temperature >= 0, got {}, {} and {}",
                e.every, e.episodes, e.temperature
            ));
        }
        if self.tag().is_empty() || self.tag().contains(['/', ' ']) {
            p.push(format!(
                "{at}.tag '{}' must be non-empty, without '/' or spaces (it names metrics)",
                self.tag()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(yaml: &str) -> EnvConfig {
        crate::config::load::from_yaml_str(yaml, "test").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn params_become_key_value_pairs_and_bad_ones_are_named() {
        let e = env("name: frozen_lake\nparams: { size: 5, slippery: true, map: null }\n");
        assert_eq!(e.tag(), "frozen_lake");
        assert_eq!(
            e.param_pairs(),
            [
                ("map".to_string(), "null".to_string()),
                ("size".into(), "5".into()),
                ("slippery".into(), "true".into())
            ]
        );
        let mut p = vec![];
        e.validate("rl.env", &mut p);
        assert!(
            p.iter().any(|m| m.contains("rl.env") && m.contains("map")),
            "{p:?}"
        );
        let e = env("name: frozen_lake\nmax_turns: 0\naction_pattern: 'x'\nformat_penalty: -1\n");
        let mut p = vec![];
        e.validate("rl.env", &mut p);
        assert_eq!(p.len(), 3, "{p:?}");
        let mut p = vec![];
        env("name: frozen_lak\n").validate("rl.env", &mut p);
        assert!(p[0].contains("did you mean 'frozen_lake'"), "{p:?}");
    }
}

#[cfg(test)]
mod run_tests {
    use crate::config::RunConfig;
    use crate::config::load::{from_yaml_str, validated};

    fn problems(rl: &str) -> String {
        let text = format!(
            "name: t\nmodel: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"SFG\" }} }}\nrl: {rl}\n"
        );
        let cfg: RunConfig = from_yaml_str(&text, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        validated(cfg, "t.yaml")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn agentic_estimators_and_modes_must_match() {
        let env = "env: { name: frozen_lake }";
        // An agentic run needs no dataset; trajectory-wise GRPO is the default.
        assert_eq!(
            problems(&format!(
                "{{ steps: 1, prompts_per_step: 1, group_size: 2, {env} }}"
            )),
            ""
        );
        let step = "env: { name: frozen_lake, mode: step }";
        assert_eq!(
            problems(&format!(
                "{{ steps: 1, prompts_per_step: 1, group_size: 2, adv_estimator: gigpo, {step} }}"
            )),
            ""
        );
        for (rl, says) in [
            ("adv_estimator: gigpo", "add an rl.env section"),
            (
                &format!("adv_estimator: gigpo, {env}") as &str,
                "set rl.env.mode to step",
            ),
            (
                &format!("adv_estimator: grpo, {step}"),
                "needs rl.adv_estimator gigpo or step_reinforce",
            ),
            (
                &format!("adv_estimator: agentic_reinforce, {step}"),
                "gigpo or step_reinforce",
            ),
            (
                &format!("{env}, async_generation_ratio: 1"),
                "asynchronous rollout needs its own devices",
            ),
            (
                &format!(
                    "adv_estimator: step_reinforce, {step}, kl: {{ mode: in_reward, coef: 0.1 }}"
                ),
                "use in_loss",
            ),
        ] {
            let p = problems(&format!(
                "{{ steps: 1, prompts_per_step: 1, group_size: 2, {rl} }}"
            ));
            assert!(p.contains(says), "{rl}: {p}");
        }
        // Without an env, a run still needs data.
        assert!(
            problems("{ steps: 1, prompts_per_step: 1, group_size: 2 }").contains("data.domains")
        );
    }
}

#[cfg(test)]
mod override_tests {
    use crate::config::RunConfig;
    use crate::config::load::from_yaml_str;
    use crate::config::overrides::apply_overrides;

    fn with(overrides: &[&str]) -> Result<RunConfig, String> {
        let text = "name: t\nmodel: { init: { arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"SFG\" } }\n\
                    rl: { steps: 1, prompts_per_step: 1, group_size: 2, env: { name: frozen_lake, params: { map: SFG } } }\n";
        let cfg: RunConfig = from_yaml_str(text, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        apply_overrides(cfg, &overrides).map_err(|e| e.to_string())
    }

    #[test]
    fn overrides_add_env_params_and_sections_key_by_key_but_typos_stay_errors() {
        let cfg = with(&["rl.env.params.slippery=true", "rl.env.params.map=SFFG"]).unwrap();
        let env = cfg.rl.and_then(|r| r.env).unwrap();
        assert_eq!(env.params["slippery"], true);
        assert_eq!(env.params["map"], "SFFG");
        // A section set one key at a time.
        let cfg = with(&["rl.env.eval.every=2", "rl.env.eval.episodes=3"]).unwrap();
        let eval = cfg.rl.and_then(|r| r.env).and_then(|e| e.eval).unwrap();
        assert_eq!((eval.every, eval.episodes), (2, 3));
        // A misspelt field of a section is still refused, naming the field it meant.
        let err = with(&["rl.env.max_turn=3"]).unwrap_err();
        assert!(err.contains("did you mean 'max_turns'"), "{err}");
        let err = with(&["rl.stepz=3"]).unwrap_err();
        assert!(err.contains("unknown key 'stepz'"), "{err}");
    }
}
