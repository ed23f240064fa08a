//! A step's episodes, played against actor_infer's continuous-batching engine: every episode runs
//! its own loop — its observation becomes a generation request, the finished turn is parsed and
//! stepped in its environment at once, and its next request joins the engine while the other
//! episodes are still decoding (env-level asynchronous rollout, as ROLL's env managers). No episode
//! waits for a slower one's turn.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;

use super::env_host::{EnvHost, Job, Outcome};
pub(crate) use super::trajectory::{Cut, StepEpisodes, Trajectory, Turn};
use super::turns::{TurnFormat, step_content};
use crate::config::{EnvConfig, EnvMode, RlConfig};
use crate::env::external::External;
use crate::env::{Env, EnvFailure, Episode, Step, make};
use crate::role::actor_infer::Generator;
use crate::rollout::{Completion, Request};
use crate::seed::mix_seed;

use super::super::RunError;

/// Plays a step's episodes.
pub(crate) struct EpisodeRunner<'a> {
    pub cfg: &'a RlConfig,
    pub env: &'a EnvConfig,
    pub format: TurnFormat<'a>,
    pub run_seed: u64,
    /// Environments of finished episodes, reused by the next ones (an external program is
    /// started once, not once per episode).
    pool: Mutex<Vec<Box<dyn Env>>>,
    /// `workers.env.mode: process`: the `roll-tui` executable that serves the built-in env's
    /// instances, and how many worker processes share them.
    env_program: Option<(PathBuf, usize)>,
}

struct Live {
    traj: Trajectory,
    /// The episode's environment, while no job of the [`EnvHost`] has it.
    episode: Option<Episode>,
    /// The observation the policy is acting on now.
    observation: String,
    /// The prompt of its next request.
    next_prompt: Vec<u32>,
    /// The turn being stepped: what the engine returned, its text, and the state it acted in.
    turn: Option<(Completion, String, u64)>,
    /// Times this episode's environment failed (each time, it started again).
    failures: usize,
}

/// Times one episode may lose its environment before the rollout gives up: a program that fails
/// every episode is a broken program, not bad luck.
pub(crate) const MAX_ENV_FAILURES: usize = 3;

impl<'a> EpisodeRunner<'a> {
    pub fn new(
        cfg: &'a RlConfig,
        env: &'a EnvConfig,
        format: TurnFormat<'a>,
        run_seed: u64,
    ) -> EpisodeRunner<'a> {
        EpisodeRunner {
            cfg,
            env,
            format,
            run_seed,
            pool: Mutex::new(vec![]),
            env_program: None,
        }
    }

    /// Serve the built-in env's instances from worker processes: `program` and how many.
    pub fn in_processes(mut self, program: Option<(PathBuf, usize)>) -> EpisodeRunner<'a> {
        self.env_program = program;
        self
    }

    /// The environment every episode starts from a copy of.
    fn prototype(&self) -> Result<Box<dyn Env>, RunError> {
        let params = self.env.param_pairs();
        // Built here even when served elsewhere: bad parameters are a clear setup error.
        let local =
            make(&self.env.name, &params).map_err(|e| RunError::Setup(format!("rl.env: {e}")))?;
        Ok(match &self.env_program {
            Some((program, workers)) if !local.blocks() => Box::new(External::serving(
                program,
                &self.env.name,
                &params,
                *workers,
            )),
            _ => local,
        })
    }

    /// Tokens a whole trajectory may take: the configured budget within the model's positions.
    fn budget(&self) -> usize {
        let positions = self.format.tok.model.config().max_position_embeddings;
        self.env
            .max_trajectory_tokens
            .map_or(positions, |b| b.min(positions))
    }

    fn per_turn(&self) -> usize {
        self.env
            .max_tokens_per_turn
            .unwrap_or(self.cfg.sampling.max_new_tokens)
    }

    /// The seed of group `group`'s episodes at `step`: its `group_size` episodes start alike.
    pub fn group_seed(&self, step: usize, group: usize) -> u64 {
        mix_seed(&[self.run_seed, 0xa6, step as u64, group as u64])
    }

    /// Play `prompts_per_step` groups of `group_size` episodes with the policy behind `engine`.
    pub fn run(&self, step: usize, engine: &mut dyn Generator) -> Result<StepEpisodes, RunError> {
        let starts: Vec<(usize, usize, u64)> = (0..self.cfg.prompts_per_step)
            .flat_map(|group| {
                let seed = self.group_seed(step, group);
                (0..self.cfg.group_size).map(move |index| (group, index, seed))
            })
            .collect();
        self.play(step as u64, &starts, &self.cfg.sampling, engine)
    }

    /// Play `episodes` evaluation episodes, one per fixed seed (the same seeds at every
    /// evaluation, so evaluations compare), sampling at `temperature` (0: greedy).
    pub fn evaluate(
        &self,
        episodes: usize,
        temperature: f64,
        engine: &mut dyn Generator,
    ) -> Result<StepEpisodes, RunError> {
        let starts: Vec<(usize, usize, u64)> = (0..episodes)
            .map(|i| (i, 0, mix_seed(&[self.run_seed, 0xe7, i as u64])))
            .collect();
        let mut params = self.cfg.sampling.clone();
        params.temperature = temperature;
        // Request seeds of their own stream, apart from every training step's.
        self.play(u64::MAX, &starts, &params, engine)
    }

    /// Play one episode from each `(group, index, seed)`; `salt` keeps each call's sampling
    /// seeds apart.
    fn play(
        &self,
        salt: u64,
        starts: &[(usize, usize, u64)],
        params: &crate::rollout::SamplingParams,
        engine: &mut dyn Generator,
    ) -> Result<StepEpisodes, RunError> {
        let t0 = Instant::now();
        let mut t_env = 0.0;
        let parser = self.env.parser().map_err(RunError::Setup)?;
        // Built once (a level file is read once); every new episode starts from a copy.
        let prototype = self.prototype()?;
        let mut host = EnvHost::new(prototype.blocks());
        // A new episode takes a pooled environment (an external program already running); one
        // played again after a failure takes a new copy, so a program that died while pooled
        // costs an episode once, never its retries.
        let fresh = |pooled: bool| {
            let env = pooled
                .then(|| self.pool.lock().ok().and_then(|mut p| p.pop()))
                .flatten()
                .unwrap_or_else(|| prototype.clone_box());
            Episode::new(env, parser.clone(), self.env.format_penalty)
        };
        let mut live: Vec<Live> = vec![];
        for (id, &(group, index, seed)) in starts.iter().enumerate() {
            live.push(Live {
                traj: Trajectory::new(group, index, seed),
                episode: None,
                observation: String::new(),
                next_prompt: vec![],
                turn: None,
                failures: 0,
            });
            host.start(id, fresh(true), Job::Reset(seed));
        }
        let mut done: Vec<Option<Trajectory>> = vec![None; live.len()];
        let (mut gen_tokens, mut failures) = (0, vec![]);
        loop {
            // Overlap: take what the environments have finished and let the engine go on; else
            // wait for every step the last decode step finished (the rollout is then a function
            // of the seed alone).
            let finished = match self.env.overlap_steps {
                true => host.finished(engine.is_idle()),
                false => host.wait_all(),
            };
            for f in finished {
                t_env += f.secs;
                let id = f.id;
                let l = &mut live[id];
                let (outcome, episode) = match (f.outcome, f.episode) {
                    (Ok(outcome), Some(episode)) => (outcome, episode),
                    (outcome, _) => {
                        let failure = outcome.err().unwrap_or_else(|| {
                            EnvFailure("the environment came back without its state".into())
                        });
                        // The episode is lost with its environment; it starts again from its
                        // seed in a new one, so its group stays whole.
                        l.failures += 1;
                        if l.failures > MAX_ENV_FAILURES {
                            return Err(RunError::Setup(format!(
                                "rl.env: episode {id} (seed {}) lost its environment {} times in \
                                 a row; the last time: {failure}",
                                l.traj.seed, l.failures
                            )));
                        }
                        failures.push(failure.0);
                        l.traj = Trajectory::new(l.traj.group, l.traj.index, l.traj.seed);
                        l.turn = None;
                        host.start(id, fresh(false), Job::Reset(l.traj.seed));
                        continue;
                    }
                };
                let next = match outcome {
                    Outcome::Reset(observation) => Some(self.first_turn(l, observation)?),
                    Outcome::Step(step) => self.play_turn(l, step)?,
                };
                match next {
                    Some(max_new) => {
                        engine.submit(self.request(salt, params, id, l, max_new));
                        l.episode = Some(episode);
                    }
                    None => {
                        done[id] = Some(std::mem::replace(&mut l.traj, Trajectory::new(0, 0, 0)));
                        if let Ok(mut pool) = self.pool.lock() {
                            pool.push(episode.into_env());
                        }
                    }
                }
            }
            if engine.is_idle() && host.pending() == 0 {
                break;
            }
            if engine.is_idle() {
                continue;
            }
            for c in engine.step()? {
                gen_tokens += c.token_ids.len();
                let id = c.id as usize;
                let Some((l, episode)) = live
                    .get_mut(id)
                    .and_then(|l| l.episode.take().map(|e| (l, e)))
                else {
                    return Err(RunError::Setup(format!(
                        "actor_infer returned request {id}, which this rollout has no turn for"
                    )));
                };
                if c.token_ids.is_empty() || c.logprobs.len() != c.token_ids.len() {
                    return Err(RunError::Setup(format!(
                        "actor_infer returned a turn with {} tokens and {} log-probs; a turn \
                         needs at least one token and one log-prob per token",
                        c.token_ids.len(),
                        c.logprobs.len()
                    )));
                }
                let output = self.format.tok.decode(&c.token_ids);
                let state_hash = episode.env().state_hash();
                l.turn = Some((c, output.clone(), state_hash));
                host.start(id, episode, Job::Step(output));
            }
        }
        if let Some(lost) = done.iter().position(Option::is_none) {
            // Groups are consecutive rows: a missing episode would shift every later group.
            return Err(RunError::Setup(format!(
                "actor_infer went idle without finishing episode {lost} of this rollout"
            )));
        }
        Ok(StepEpisodes {
            trajectories: done.into_iter().flatten().collect(),
            gen_tokens,
            t_rollout: t0.elapsed().as_secs_f64(),
            t_env,
            failures,
        })
    }

    /// The first request of an episode whose environment has just been reset; the token limit of
    /// its first turn.
    fn first_turn(&self, l: &mut Live, observation: String) -> Result<usize, RunError> {
        let prompt_ids = self
            .format
            .first(&self.step_content(&[], &observation))
            .map_err(|e| RunError::Setup(format!("rl.env: the first observation {e}")))?;
        if prompt_ids.len() >= self.budget() {
            return Err(RunError::Setup(format!(
                "rl.env: the first prompt takes {} tokens, which leaves no room for a turn \
                 within the trajectory budget of {} (max_trajectory_tokens, or the model's \
                 max_position_embeddings)",
                prompt_ids.len(),
                self.budget()
            )));
        }
        let room = self.budget() - prompt_ids.len();
        l.next_prompt = prompt_ids.clone();
        l.traj.prompt_ids = prompt_ids;
        l.observation = observation;
        Ok(self.per_turn().min(room))
    }

    fn request(
        &self,
        salt: u64,
        params: &crate::rollout::SamplingParams,
        id: usize,
        l: &Live,
        max_new_tokens: usize,
    ) -> Request {
        let mut params = params.clone();
        params.max_new_tokens = max_new_tokens;
        let mut seed = mix_seed(&[
            self.run_seed,
            0xa7,
            salt,
            id as u64,
            l.traj.turns.len() as u64,
        ]);
        if l.failures > 0 {
            // An episode started again after its environment failed samples anew.
            seed = mix_seed(&[seed, l.failures as u64]);
        }
        Request {
            id: id as u64,
            prompt_ids: l.next_prompt.clone(),
            params,
            seed,
        }
    }

    /// Apply a finished turn to its episode; the token limit of the next turn, or `None` when the
    /// episode is over.
    fn play_turn(&self, l: &mut Live, step: Step) -> Result<Option<usize>, RunError> {
        let Some((c, output, state_hash)) = l.turn.take() else {
            return Err(RunError::Setup(
                "rl.env: an environment step came back for an episode that took no turn".into(),
            ));
        };
        let traj = &mut l.traj;
        traj.turn_starts.push(traj.response.len());
        traj.response.extend(&c.token_ids);
        traj.trainable
            .extend(std::iter::repeat_n(1f32, c.token_ids.len()));
        traj.logprobs.extend(&c.logprobs);
        traj.episode_return += step.reward;
        let valid = step.info.get("action_is_valid") == Some(&Value::Bool(true));
        traj.invalid_actions += usize::from(!valid);
        traj.success = step.info.get("success") == Some(&Value::Bool(true));
        traj.turns.push(Turn {
            observation: std::mem::take(&mut l.observation),
            output,
            parsed: step
                .info
                .get("parsed_action")
                .and_then(Value::as_str)
                .map(str::to_string),
            valid,
            reward: step.reward,
            done: step.done,
            info: step.info.clone(),
            prompt_tokens: c.prompt_ids.len(),
            tokens: c.token_ids.len(),
            state_hash,
            prompt_ids: c.prompt_ids.clone(),
            token_ids: c.token_ids.clone(),
            logprobs: c.logprobs.clone(),
        });
        if step.done {
            return Ok(None);
        }
        if traj.turns.len() >= self.env.max_turns {
            traj.cut = Some(Cut::Turns);
            return Ok(None);
        }
        let observation_err = |e: String| RunError::Setup(format!("rl.env: an observation {e}"));
        if self.env.mode == EnvMode::Step {
            // A fresh prompt each turn: the last turns summarised, then the observation.
            let content = self.step_content(&traj.turns, &step.observation);
            let prompt = self.format.first(&content).map_err(observation_err)?;
            let room = self
                .budget()
                .saturating_sub(prompt.len())
                .min(self.per_turn());
            if room == 0 {
                traj.cut = Some(Cut::Budget);
                return Ok(None);
            }
            l.next_prompt = prompt;
            l.observation = step.observation;
            return Ok(Some(room));
        }
        let between = self
            .format
            .next(&c.token_ids, &step.observation)
            .map_err(observation_err)?;
        let used = traj.prompt_ids.len() + traj.response.len() + between.len();
        let room = self.budget().saturating_sub(used).min(self.per_turn());
        if room == 0 {
            traj.cut = Some(Cut::Budget);
            return Ok(None);
        }
        traj.trainable
            .extend(std::iter::repeat_n(0f32, between.len()));
        traj.logprobs
            .extend(std::iter::repeat_n(0f32, between.len()));
        traj.response.extend(between);
        l.next_prompt.clear();
        l.next_prompt.extend(&traj.prompt_ids);
        l.next_prompt.extend(&traj.response);
        l.observation = step.observation;
        Ok(Some(room))
    }

    /// A step-wise prompt's content (see [`step_content`]).
    fn step_content(&self, turns: &[Turn], observation: &str) -> String {
        let history: Vec<(Option<&str>, f64)> = turns
            .iter()
            .map(|t| (t.parsed.as_deref().filter(|_| t.valid), t.reward))
            .collect();
        step_content(self.env, &history, observation)
    }
}
