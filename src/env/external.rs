//! `external`: an environment played by another program — written in Python or anything else —
//! that speaks JSON lines on stdin and stdout. Each request is one line, each reply one line:
//!
//! ```text
//! → {"cmd": "reset", "seed": 7, "params": {"high": "100"}}
//! ← {"observation": "Guess a number from 1 to 100.", "action_format": "a whole number",
//!    "actions": ["1", "2"], "info": {}}
//! → {"cmd": "step", "action": "50"}
//! ← {"observation": "Higher.", "reward": 0.0, "done": false, "info": {"success": false}}
//! ← {"invalid": "'fifty' is not a whole number"}          (an action it does not know: state unchanged)
//! → {"cmd": "close"}                                      (no reply; the program exits)
//! ```
//!
//! A reply may carry `state_hash` (a number or a string; default: a hash of the observation),
//! `action_format`, `actions`, `grid` (rows of text) and `agent` ([row, col]); `info.success`
//! marks a solved episode. A reply with `error` is the program failing. The program must exit when
//! its stdin closes. A program that crashes, hangs past `step_timeout` or answers outside the
//! protocol is an [`EnvFailure`]: the rollout discards the episode, counts it and starts a new
//! program — never a hang, never a failed run.
//!
//! A program holds state that cannot be copied, so a copy ([`Env::clone_box`]) starts its own
//! program when first used and replays the episode's seed and actions into it (environments are
//! deterministic given the seed).

mod connection;
mod program;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{Env, EnvFailure, Grid, Step, StepError, stable_hash};
use connection::{Connection, Workers};

/// Seconds a program may take to answer one request, unless configured.
pub const DEFAULT_STEP_TIMEOUT_S: f64 = 10.0;

/// How to start and talk to the program; shared by every copy.
#[derive(Debug)]
struct Settings {
    command: Vec<String>,
    step_timeout: Duration,
    /// Configured action format; else the program's, else a generic phrase.
    action_format: Option<String>,
    /// Every other parameter, sent with each `reset`.
    params: Map<String, Value>,
}

/// The state as the program last described it.
#[derive(Debug, Clone, Default)]
struct Seen {
    observation: String,
    info: Map<String, Value>,
    actions: Vec<String>,
    action_format: Option<String>,
    state_hash: u64,
    grid: Option<Grid>,
}

pub struct External {
    settings: Arc<Settings>,
    /// The program, started at first use (a copy costs nothing until it is played), or this
    /// instance's place in a shared worker.
    conn: Connection,
    /// The episode so far: its seed and the actions the program accepted (a copy replays them).
    episode: Option<(u64, Vec<String>)>,
    seen: Seen,
}

impl External {
    /// `command` (required: the program and its arguments, split as a shell would), `step_timeout`
    /// (seconds), `action_format`; every other parameter is passed to the program with `reset`.
    pub fn from_params(params: &[(String, String)]) -> Result<External, String> {
        let mut command = None;
        let mut step_timeout = Duration::from_secs_f64(DEFAULT_STEP_TIMEOUT_S);
        let mut action_format = None;
        let mut rest = Map::new();
        for (k, v) in params {
            match k.as_str() {
                "command" => {
                    let words = shlex::split(v).filter(|w| !w.is_empty()).ok_or_else(|| {
                        format!("command '{v}' is empty or its quotes do not close")
                    })?;
                    command = Some(words);
                }
                "step_timeout" => {
                    step_timeout = v
                        .parse::<f64>()
                        .ok()
                        .filter(|t| *t > 0.0)
                        .and_then(|t| Duration::try_from_secs_f64(t).ok())
                        .ok_or_else(|| {
                            format!("step_timeout '{v}' must be a positive number of seconds")
                        })?;
                }
                "action_format" => action_format = Some(v.clone()),
                _ => {
                    rest.insert(k.clone(), Value::String(v.clone()));
                }
            }
        }
        let command = command.ok_or(
            "needs command (the program to run, e.g. 'python3 envs/external/guess_number.py')",
        )?;
        Ok(External::with(Settings {
            command,
            step_timeout,
            action_format,
            params: rest,
        }))
    }

    /// The built-in environment `name` with `params`, served by `workers` processes of `program`
    /// (the `roll-tui` executable) running `env serve`, each hosting many instances
    /// (`workers.env.mode: process`); copies are spread over them in turn.
    pub fn serving(
        program: &std::path::Path,
        name: &str,
        params: &[(String, String)],
        workers: usize,
    ) -> External {
        let mut command = vec![
            program.to_string_lossy().into_owned(),
            "env".into(),
            "serve".into(),
            name.into(),
        ];
        for (k, v) in params {
            command.extend(["--set".to_string(), format!("{k}={v}")]);
        }
        let workers = Workers::new(command.clone(), workers);
        let mut served = External::with(Settings {
            command,
            step_timeout: Duration::from_secs_f64(DEFAULT_STEP_TIMEOUT_S),
            action_format: None,
            params: Map::new(),
        });
        served.conn = Connection::shared(&workers);
        served
    }

    fn with(settings: Settings) -> External {
        External {
            settings: Arc::new(settings),
            conn: Connection::Own(None),
            episode: None,
            seen: Seen::default(),
        }
    }

    /// Bring a program that does not hold this episode (a copy's first use, or a shared
    /// worker replaced since) up to it: the seed and the actions again.
    fn replay(&mut self) -> Result<(), EnvFailure> {
        let Some((seed, actions)) = self.episode.clone() else {
            return Ok(());
        };
        // The replay's replies describe states on the way; the state is the one it had.
        let seen = self.seen.clone();
        self.send_reset(seed)?;
        for action in &actions {
            // The original accepted these; a deterministic program accepts them again.
            let reply = self.send(json!({"cmd": "step", "action": action}))?;
            if reply.contains_key("invalid") {
                return Err(self.fail(&format!(
                    "refused action '{action}' while replaying an episode it had accepted (the \
                     environment must be deterministic given the seed)"
                )));
            }
        }
        self.seen = seen;
        Ok(())
    }

    /// A request about the current episode, replayed into the program first when it lost it.
    fn call(&mut self, request: Value) -> Result<Map<String, Value>, EnvFailure> {
        if request["cmd"] != "reset" && !self.conn.in_sync() {
            self.replay()?;
        }
        self.send(request)
    }

    fn send(&mut self, request: Value) -> Result<Map<String, Value>, EnvFailure> {
        let timeout = self.settings.step_timeout;
        self.conn.call(&self.settings.command, request, timeout)
    }

    fn fail(&mut self, what: &str) -> EnvFailure {
        self.conn.fail(what)
    }

    fn send_reset(&mut self, seed: u64) -> Result<Map<String, Value>, EnvFailure> {
        let params = Value::Object(self.settings.params.clone());
        let reply = self.send(json!({"cmd": "reset", "seed": seed, "params": params}))?;
        let seen = self.read_state(&reply, "reset")?;
        self.seen = seen;
        Ok(reply)
    }

    /// The state a reply describes; fields a reply leaves out keep their last value, except the
    /// observation, which every reply must carry.
    fn read_state(&mut self, reply: &Map<String, Value>, cmd: &str) -> Result<Seen, EnvFailure> {
        let malformed = |this: &mut Self, what: &str| {
            this.fail(&format!("answered '{cmd}' outside the protocol: {what}"))
        };
        let Some(observation) = reply.get("observation").and_then(Value::as_str) else {
            return Err(malformed(self, "no 'observation' string"));
        };
        let mut seen = self.seen.clone();
        seen.observation = observation.to_string();
        seen.info = match reply.get("info") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(o)) => o.clone(),
            Some(_) => return Err(malformed(self, "'info' is not an object")),
        };
        if let Some(actions) = reply.get("actions") {
            let list: Option<Vec<String>> = actions
                .as_array()
                .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect());
            seen.actions = match list {
                Some(l) => l,
                None => return Err(malformed(self, "'actions' is not a list of strings")),
            };
        }
        if let Some(format) = reply.get("action_format") {
            match format.as_str() {
                Some(f) => seen.action_format = Some(f.to_string()),
                None => return Err(malformed(self, "'action_format' is not a string")),
            }
        }
        seen.state_hash = match reply.get("state_hash") {
            None | Some(Value::Null) => stable_hash(observation.as_bytes()),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(h) => h,
                None => stable_hash(n.to_string().as_bytes()),
            },
            Some(Value::String(s)) => stable_hash(s.as_bytes()),
            Some(_) => return Err(malformed(self, "'state_hash' is not a number or a string")),
        };
        seen.grid = match reply.get("grid") {
            None | Some(Value::Null) => None,
            Some(grid) => match read_grid(grid, reply.get("agent")) {
                Some(g) => Some(g),
                None => {
                    return Err(malformed(
                        self,
                        "'grid' is not a list of strings, or 'agent' not [row, col]",
                    ));
                }
            },
        };
        Ok(seen)
    }
}

fn read_grid(grid: &Value, agent: Option<&Value>) -> Option<Grid> {
    let rows: Vec<Vec<char>> = grid
        .as_array()?
        .iter()
        .map(|r| r.as_str().map(|s| s.chars().collect()))
        .collect::<Option<_>>()?;
    let agent = match agent {
        None | Some(Value::Null) => (0, 0),
        Some(a) => {
            let a = a.as_array()?;
            match a.as_slice() {
                [r, c] => (r.as_u64()? as usize, c.as_u64()? as usize),
                _ => return None,
            }
        }
    };
    Some(Grid { rows, agent })
}

impl Env for External {
    fn name(&self) -> &'static str {
        "external"
    }

    fn clone_box(&self) -> Box<dyn Env> {
        Box::new(External {
            settings: Arc::clone(&self.settings),
            conn: self.conn.fresh(),
            episode: self.episode.clone(),
            seen: self.seen.clone(),
        })
    }

    fn action_format(&self) -> String {
        self.settings
            .action_format
            .clone()
            .or_else(|| self.seen.action_format.clone())
            .unwrap_or_else(|| "the action the environment's program expects".into())
    }

    fn actions(&self) -> Vec<String> {
        self.seen.actions.clone()
    }

    fn reset(&mut self, seed: u64) -> Result<String, EnvFailure> {
        // A reset needs no replay: the new episode starts from the seed alone.
        self.episode = None;
        self.send_reset(seed)?;
        self.episode = Some((seed, vec![]));
        Ok(self.seen.observation.clone())
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        if self.episode.is_none() {
            return Err(StepError::Failed(EnvFailure(
                "external env: step before reset".into(),
            )));
        }
        let reply = self
            .call(json!({"cmd": "step", "action": action}))
            .map_err(StepError::Failed)?;
        if let Some(why) = reply.get("invalid") {
            let why = why.as_str().map_or_else(|| why.to_string(), str::to_string);
            return Err(StepError::Invalid(why));
        }
        let seen = self.read_state(&reply, "step").map_err(StepError::Failed)?;
        let reward = reply.get("reward").and_then(Value::as_f64);
        let done = reply.get("done").and_then(Value::as_bool);
        let (Some(reward), Some(done)) = (reward.filter(|r| r.is_finite()), done) else {
            return Err(StepError::Failed(self.fail(
                "answered 'step' outside the protocol: it needs a finite number 'reward' and a \
                 boolean 'done'",
            )));
        };
        self.seen = seen;
        if let Some((_, actions)) = self.episode.as_mut() {
            actions.push(action.to_string());
        }
        Ok(Step {
            observation: self.seen.observation.clone(),
            reward,
            done,
            info: self.seen.info.clone(),
        })
    }

    fn info(&self) -> Map<String, Value> {
        self.seen.info.clone()
    }

    fn render_text(&self) -> String {
        self.seen.observation.clone()
    }

    fn render_grid(&self) -> Grid {
        self.seen.grid.clone().unwrap_or_else(|| Grid {
            rows: self
                .seen
                .observation
                .lines()
                .map(|l| l.chars().collect())
                .collect(),
            agent: (0, 0),
        })
    }

    fn state_hash(&self) -> u64 {
        self.seen.state_hash
    }

    fn blocks(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
