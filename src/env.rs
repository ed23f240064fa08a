//! Environments for agentic RL: a policy acts in them over many turns. One file per environment
//! ([`frozen_lake`]); this module owns the interface they share and the part every environment
//! handles the same way — extracting the action from a model's output and penalising output that
//! holds no valid action.
//!
//! An environment is deterministic given the seed of its `reset`. `step` takes the action text the
//! parser extracted; an action the environment does not understand leaves its state unchanged and
//! is reported, never an error: a malformed action is data for the run (it is counted and
//! penalised), not a failure. Environments do no IO and know nothing of models, workers or the
//! store.

pub mod external;
pub mod frozen_lake;
pub mod plan;
pub mod replay;
pub mod serve;
pub mod sokoban;
pub mod transcript;
pub mod webshop;

use serde::Serialize;
use serde_json::{Map, Value};

/// What an environment shows of itself for a terminal: a grid of characters and where the agent
/// is, so that a front-end can draw it (colours, highlight) without parsing text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Grid {
    pub rows: Vec<Vec<char>>,
    /// (row, column) of the agent.
    pub agent: (usize, usize),
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// The observation after the step, as the policy will read it.
    pub observation: String,
    pub reward: f64,
    /// The episode ended (success, failure or the environment's own step limit).
    pub done: bool,
    /// Facts about the step (`state`, `success`, `action_is_valid`, …).
    pub info: Map<String, Value>,
}

/// An environment that cannot go on: its program crashed, hung or answered something that is not
/// the protocol. The episode is lost (discarded and counted by a rollout), never the run; the
/// message says what happened and, for a program, ends with its stderr tail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EnvFailure(pub String);

/// Why a step did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The environment does not know the action; its state is unchanged (counted and penalised).
    #[error("{0}")]
    Invalid(String),
    /// The environment failed; this instance is unusable.
    #[error("{0}")]
    Failed(EnvFailure),
}

impl Step {
    /// The step that left `env` as it is now: its render and info, with `reward` and `done`.
    pub fn now(env: &dyn Env, reward: f64, done: bool) -> Step {
        Step {
            observation: env.render_text(),
            reward,
            done,
            info: env.info(),
        }
    }
}

/// One environment instance.
pub trait Env: Send {
    /// The registered name (`frozen_lake`).
    fn name(&self) -> &'static str;
    /// An independent copy in the same state (a planner searches on copies; the debugger forks).
    fn clone_box(&self) -> Box<dyn Env>;
    /// What a valid action looks like, for prompts and error text (`one of Left, Down, Right, Up`).
    fn action_format(&self) -> String;
    /// The actions valid now (a random policy draws from them; a person picks from them).
    fn actions(&self) -> Vec<String>;
    /// Start an episode; the same seed gives the same episode. Only an environment backed by a
    /// program can fail.
    fn reset(&mut self, seed: u64) -> Result<String, EnvFailure>;
    /// Apply `action` (the parsed action text); [`StepError::Invalid`] when the environment does
    /// not know it, in which case the state must be unchanged.
    fn step(&mut self, action: &str) -> Result<Step, StepError>;
    /// Facts about the current state (`state`, `success`, `steps`, …), as a step reports them.
    fn info(&self) -> Map<String, Value>;
    /// The state as text for a prompt.
    fn render_text(&self) -> String;
    /// The state for a front-end.
    fn render_grid(&self) -> Grid;
    /// Identical states hash equal (GiGPO groups steps by it); stable across runs and builds.
    fn state_hash(&self) -> u64;
    /// Resets and steps wait on something outside this process (an external program), so a
    /// rollout runs them on threads, many at once; an in-process environment is stepped inline.
    fn blocks(&self) -> bool {
        false
    }
}

/// How the action is found in a model's output.
#[derive(Debug, Clone)]
pub struct ActionParser {
    pattern: regex::Regex,
}

/// The reward of a step whose output held no valid action, unless configured: −0.1.
pub const DEFAULT_FORMAT_PENALTY: f64 = 0.1;

/// The default: the last `<answer>…</answer>` of the output.
pub const DEFAULT_ACTION_PATTERN: &str = r"(?s)<answer>(.*?)</answer>";

impl Default for ActionParser {
    fn default() -> Self {
        ActionParser::new(DEFAULT_ACTION_PATTERN).expect("the default action pattern compiles")
    }
}

impl ActionParser {
    /// A parser taking the first capture group of the last match of `pattern`.
    pub fn new(pattern: &str) -> Result<ActionParser, String> {
        let pattern = regex::Regex::new(pattern)
            .map_err(|e| format!("action pattern '{pattern}' is not a valid regex: {e}"))?;
        if pattern.captures_len() < 2 {
            return Err(format!(
                "action pattern '{pattern}' needs a capture group around the action"
            ));
        }
        Ok(ActionParser { pattern })
    }

    /// The action in `output` (trimmed), or `None` when there is none.
    pub fn parse<'a>(&self, output: &'a str) -> Option<&'a str> {
        let caps = self.pattern.captures_iter(output).last()?;
        let action = caps.get(1)?.as_str().trim();
        (!action.is_empty()).then_some(action)
    }
}

/// An environment with the action parser and the format penalty: what a rollout steps.
pub struct Episode {
    env: Box<dyn Env>,
    parser: ActionParser,
    /// Reward of a step whose output held no valid action (as a positive penalty: 0.1 → −0.1).
    format_penalty: f64,
    /// Steps whose output held no valid action, this episode.
    pub invalid_actions: usize,
    pub steps: usize,
    pub done: bool,
}

impl Episode {
    pub fn new(env: Box<dyn Env>, parser: ActionParser, format_penalty: f64) -> Episode {
        Episode {
            env,
            parser,
            format_penalty,
            invalid_actions: 0,
            steps: 0,
            done: false,
        }
    }

    pub fn env(&self) -> &dyn Env {
        self.env.as_ref()
    }

    /// The environment back, to start another episode in it (an external program is kept).
    pub fn into_env(self) -> Box<dyn Env> {
        self.env
    }

    pub fn reset(&mut self, seed: u64) -> Result<String, EnvFailure> {
        (self.invalid_actions, self.steps, self.done) = (0, 0, false);
        self.env.reset(seed)
    }

    /// One turn from a model's raw output: the parsed action is applied; output without a valid
    /// action changes nothing, is penalised and counted (`info.action_is_valid` false, with why).
    /// `Err` only when the environment itself failed.
    pub fn step(&mut self, output: &str) -> Result<Step, EnvFailure> {
        self.steps += 1;
        let parsed = self.parser.parse(output);
        let result = match parsed {
            Some(action) => self.env.step(action),
            None => Err(StepError::Invalid(format!(
                "no action found in the output (expected {})",
                self.env.action_format()
            ))),
        };
        let mut step = match result {
            Ok(mut step) => {
                step.info
                    .insert("action_is_valid".into(), Value::Bool(true));
                step
            }
            Err(StepError::Failed(failure)) => return Err(failure),
            Err(StepError::Invalid(why)) => {
                self.invalid_actions += 1;
                let mut info = self.env.info();
                info.insert("action_is_valid".into(), Value::Bool(false));
                info.insert("invalid_reason".into(), Value::String(why));
                Step {
                    observation: self.env.render_text(),
                    reward: -self.format_penalty,
                    // An invalid action does not change a finished episode back.
                    done: self.done,
                    info,
                }
            }
        };
        step.info.insert(
            "parsed_action".into(),
            parsed.map_or(Value::Null, |a| Value::String(a.to_string())),
        );
        self.done = step.done;
        Ok(step)
    }
}

/// The registered environments: name, what it is, its parameters (`--set key=value`).
pub const ENVS: [(&str, &str, &str); 4] = [
    (
        "frozen_lake",
        "gymnasium FrozenLake-v1: walk from S to G over frozen F without falling into a hole H",
        "size (4), p (0.8: chance a cell is frozen), map (rows joined by '/', e.g. SFFF/FHFH/FFFH/HFFG; \
         overrides size and p), slippery (false: move as intended or to either side, 1/3 each), \
         max_steps (100), legend (true: the text render ends with a line naming letters and actions)",
    ),
    (
        "sokoban",
        "gym-sokoban: push every box X onto a target O (rooms generated backwards, so solvable)",
        "dim (6: the room's side), num_boxes (1), max_steps (120), levels (an XSB level file, e.g. \
         envs/sokoban/tiny.xsb; the level is picked by seed, and dim/num_boxes are ignored)",
    ),
    (
        "webshop",
        "WebShop-style shopping over a local catalogue: search, open a product, pick its options, \
         buy what the instruction asks for (scored as the WebShop paper does)",
        "catalogue (a JSON-lines product file; default: the generated catalogue in \
         envs/webshop/catalogue.jsonl), products (its first N; without a file, a generated \
         shop of N), max_steps (15)",
    ),
    (
        "external",
        "any program speaking JSON lines on stdin/stdout (reset/step/close; README, \"External \
         environments\"), e.g. envs/external/guess_number.py",
        "command (required: the program and its arguments, e.g. 'python3 \
         envs/external/guess_number.py'), step_timeout (10: seconds per reply before the program \
         is stopped), action_format (default: what the program says); every other parameter is \
         sent to the program with each reset",
    ),
];

/// An environment by name with `key=value` parameters; errors name the parameter.
pub fn make(name: &str, params: &[(String, String)]) -> Result<Box<dyn Env>, String> {
    match name {
        "frozen_lake" => Ok(Box::new(frozen_lake::FrozenLake::from_params(params)?)),
        "sokoban" => Ok(Box::new(sokoban::Sokoban::from_params(params)?)),
        "webshop" => Ok(Box::new(webshop::WebShop::from_params(params)?)),
        "external" => Ok(Box::new(external::External::from_params(params)?)),
        other => {
            let names: Vec<&str> = ENVS.iter().map(|e| e.0).collect();
            Err(format!(
                "unknown environment '{other}'{} (known: {})",
                crate::text::suggestion_suffix(other, names.iter().copied()),
                names.join(", ")
            ))
        }
    }
}

/// Parameters written in a config (`{ size: 4, slippery: true }`) as `key=value` pairs, numbers and
/// booleans as YAML writes them.
pub fn param_pairs(params: &std::collections::BTreeMap<String, Value>) -> Vec<(String, String)> {
    params
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// FNV-1a over bytes: stable across runs, builds and platforms (for `state_hash`).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_parser_takes_the_last_answer_trimmed() {
        let p = ActionParser::default();
        assert_eq!(p.parse("I go <answer> Left </answer>"), Some("Left"));
        assert_eq!(
            p.parse("<answer>Up</answer> no, <answer>Down</answer>"),
            Some("Down")
        );
        assert_eq!(p.parse("<answer>\nRight\n</answer>"), Some("Right"));
        assert_eq!(p.parse("Left"), None);
        assert_eq!(p.parse("<answer>  </answer>"), None);
        assert_eq!(p.parse("<answer>Left"), None);
        let custom = ActionParser::new(r"Action: (\w+)").unwrap_or_default();
        assert_eq!(custom.parse("Action: Up"), Some("Up"));
        assert!(ActionParser::new("no group").is_err());
        assert!(ActionParser::new("(unclosed").is_err());
    }

    #[test]
    fn output_without_a_valid_action_changes_nothing_and_is_penalised() {
        let env = make("frozen_lake", &[("map".into(), "SF/FG".into())])
            .unwrap_or_else(|e| panic!("{e}"));
        let mut ep = Episode::new(env, ActionParser::default(), 0.1);
        ep.reset(0).unwrap();
        let before = ep.env().state_hash();
        for output in ["I will go left", "<answer>Sideways</answer>"] {
            let step = ep.step(output).unwrap();
            assert_eq!((step.reward, step.done), (-0.1, false));
            assert_eq!(step.info["action_is_valid"], false);
            assert_eq!(ep.env().state_hash(), before);
        }
        assert_eq!((ep.invalid_actions, ep.steps), (2, 2));
        let step = ep.step("<answer>Right</answer>").unwrap();
        assert_eq!(step.info["action_is_valid"], true);
        assert_eq!(step.info["parsed_action"], "Right");
        assert_ne!(ep.env().state_hash(), before);
        assert!(
            make("frozen_lak", &[])
                .err()
                .unwrap_or_default()
                .contains("did you mean 'frozen_lake'")
        );
    }
}
