//! A step's episodes, played against actor_infer's continuous-batching engine: every episode runs
//! its own loop — its observation becomes a generation request, the finished turn is parsed and
//! stepped in its environment at once, and its next request joins the engine while the other
//! episodes are still decoding (env-level asynchronous rollout, as ROLL's env managers). No episode
//! waits for a slower one's turn.

use std::time::Instant;

use serde_json::{Map, Value};

use super::turns::TurnFormat;
use crate::config::{EnvConfig, EnvMode, RlConfig};
use crate::env::{Episode, make};
use crate::role::actor_infer::Generator;
use crate::rollout::{Completion, Request};
use crate::seed::mix_seed;

use super::super::PipelineError;

/// Why an episode ended before its environment finished it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// `max_turns` turns were played.
    Turns,
    /// The next turn would not fit in the trajectory's token budget.
    Budget,
}

/// One turn: what the policy saw, what it wrote, and what the environment made of it.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    pub observation: String,
    pub output: String,
    pub parsed: Option<String>,
    pub valid: bool,
    pub reward: f64,
    pub done: bool,
    pub info: Map<String, Value>,
    /// Tokens the policy read (the whole conversation so far) and wrote this turn.
    pub prompt_tokens: usize,
    pub tokens: usize,
    /// The state the policy acted in (GiGPO groups turns by it).
    pub state_hash: u64,
    /// The request this turn answered, what the policy sampled, and the sampling log-probs (a
    /// step-wise sample).
    pub prompt_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
}

/// One episode as the learner needs it: a token sequence whose response part mixes the policy's
/// turns (trainable, with their sampling log-probs) and the environment's text between them.
#[derive(Debug, Clone)]
pub(crate) struct Trajectory {
    pub group: usize,
    pub index: usize,
    /// The seed of the episode's `reset` (shared by its group).
    pub seed: u64,
    pub prompt_ids: Vec<u32>,
    pub response: Vec<u32>,
    /// 1 for the policy's tokens, 0 for the environment's.
    pub trainable: Vec<f32>,
    /// The sampling log-prob of each policy token (0 for the environment's).
    pub logprobs: Vec<f32>,
    /// Where each turn's tokens start in `response` (trajectory mode).
    pub turn_starts: Vec<usize>,
    pub turns: Vec<Turn>,
    /// Sum of the turns' rewards (format penalties included).
    pub episode_return: f64,
    pub success: bool,
    pub cut: Option<Cut>,
    pub invalid_actions: usize,
}

/// A step's finished episodes, in (group, index) order.
pub(crate) struct StepEpisodes {
    pub trajectories: Vec<Trajectory>,
    /// Tokens the policy wrote.
    pub gen_tokens: usize,
    /// Wall time of the whole rollout, and the part spent inside environments.
    pub t_rollout: f64,
    pub t_env: f64,
}

/// Plays a step's episodes.
pub(crate) struct EpisodeRunner<'a> {
    pub cfg: &'a RlConfig,
    pub env: &'a EnvConfig,
    pub format: TurnFormat<'a>,
    pub run_seed: u64,
}

struct Live {
    traj: Trajectory,
    episode: Episode,
    /// The observation the policy is acting on now.
    observation: String,
    /// The prompt of its next request.
    next_prompt: Vec<u32>,
}

impl EpisodeRunner<'_> {
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
    pub fn run(
        &self,
        step: usize,
        engine: &mut dyn Generator,
    ) -> Result<StepEpisodes, PipelineError> {
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
    ) -> Result<StepEpisodes, PipelineError> {
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
    ) -> Result<StepEpisodes, PipelineError> {
        let t0 = Instant::now();
        let mut t_env = 0.0;
        let parser = self.env.parser().map_err(PipelineError::Setup)?;
        // Built once (a level file is read once); every episode starts from a copy and its reset.
        let prototype = make(&self.env.name, &self.env.param_pairs())
            .map_err(|e| PipelineError::Setup(format!("rl.env: {e}")))?;
        let mut live: Vec<Option<Live>> = vec![];
        for &(group, index, seed) in starts {
            let env = prototype.clone_box();
            let mut episode = Episode::new(env, parser.clone(), self.env.format_penalty);
            let t = Instant::now();
            let observation = episode.reset(seed);
            t_env += t.elapsed().as_secs_f64();
            let prompt_ids = self
                .format
                .first(&self.step_content(&[], &observation))
                .map_err(|e| PipelineError::Setup(format!("rl.env: the first observation {e}")))?;
            if prompt_ids.len() >= self.budget() {
                return Err(PipelineError::Setup(format!(
                    "rl.env: the first prompt takes {} tokens, which leaves no room for a \
                         turn within the trajectory budget of {} (max_trajectory_tokens, or the \
                         model's max_position_embeddings)",
                    prompt_ids.len(),
                    self.budget()
                )));
            }
            live.push(Some(Live {
                next_prompt: prompt_ids.clone(),
                traj: Trajectory {
                    group,
                    index,
                    seed,
                    prompt_ids,
                    response: vec![],
                    trainable: vec![],
                    logprobs: vec![],
                    turn_starts: vec![],
                    turns: vec![],
                    episode_return: 0.0,
                    success: false,
                    cut: None,
                    invalid_actions: 0,
                },
                episode,
                observation,
            }));
        }
        for (id, l) in live.iter().enumerate() {
            if let Some(l) = l {
                let room = self.budget() - l.traj.prompt_ids.len();
                engine.submit(self.request(salt, params, id, l, self.per_turn().min(room)));
            }
        }
        let mut done: Vec<Option<Trajectory>> = vec![None; live.len()];
        let mut gen_tokens = 0;
        while !engine.is_idle() {
            for c in engine.step()? {
                gen_tokens += c.token_ids.len();
                let id = c.id as usize;
                let Some(mut l) = live.get_mut(id).and_then(Option::take) else {
                    return Err(PipelineError::Setup(format!(
                        "actor_infer returned request {id}, which this rollout never sent"
                    )));
                };
                let t = Instant::now();
                let next = self.play_turn(&mut l, &c)?;
                t_env += t.elapsed().as_secs_f64();
                match next {
                    Some(max_new) => {
                        engine.submit(self.request(salt, params, id, &l, max_new));
                        live[id] = Some(l);
                    }
                    None => done[id] = Some(l.traj),
                }
            }
        }
        if let Some(lost) = done.iter().position(Option::is_none) {
            // Groups are consecutive rows: a missing episode would shift every later group.
            return Err(PipelineError::Setup(format!(
                "actor_infer went idle without finishing episode {lost} of this rollout"
            )));
        }
        Ok(StepEpisodes {
            trajectories: done.into_iter().flatten().collect(),
            gen_tokens,
            t_rollout: t0.elapsed().as_secs_f64(),
            t_env,
        })
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
        Request {
            id: id as u64,
            prompt_ids: l.next_prompt.clone(),
            params,
            seed: mix_seed(&[
                self.run_seed,
                0xa7,
                salt,
                id as u64,
                l.traj.turns.len() as u64,
            ]),
        }
    }

    /// Apply a finished turn to its episode; the token limit of the next turn, or `None` when the
    /// episode is over.
    fn play_turn(&self, l: &mut Live, c: &Completion) -> Result<Option<usize>, PipelineError> {
        if c.token_ids.is_empty() || c.logprobs.len() != c.token_ids.len() {
            return Err(PipelineError::Setup(format!(
                "actor_infer returned a turn with {} tokens and {} log-probs; a turn needs at \
                 least one token and one log-prob per token",
                c.token_ids.len(),
                c.logprobs.len()
            )));
        }
        let output = self.format.tok.decode(&c.token_ids);
        let state_hash = l.episode.env().state_hash();
        let step = l.episode.step(&output);
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
        let observation_err =
            |e: String| PipelineError::Setup(format!("rl.env: an observation {e}"));
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

    /// A step-wise prompt's content: the last `history_length` turns, one line each, then the
    /// observation (trajectory mode, and step mode without history: the observation alone).
    fn step_content(&self, turns: &[Turn], observation: &str) -> String {
        if self.env.mode != EnvMode::Step || self.env.history_length == 0 {
            return observation.to_string();
        }
        let from = turns.len().saturating_sub(self.env.history_length);
        let mut text = String::new();
        for (i, t) in turns.iter().enumerate().skip(from) {
            let action = match (&t.parsed, t.valid) {
                (Some(a), true) => a.as_str(),
                _ => "(no valid action)",
            };
            text.push_str(&format!(
                "Turn {}: {action} -> reward {}\n",
                i + 1,
                t.reward
            ));
        }
        text.push_str(observation);
        text
    }
}
