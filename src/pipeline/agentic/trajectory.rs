//! What a rollout hands the learner: each episode as a trajectory (its token sequence, which of
//! its tokens the policy wrote, its turns) and a step's episodes with their timing.

use serde_json::{Map, Value};

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
    /// Seconds inside environments, summed over episodes (steps run at once add up).
    pub t_env: f64,
    /// Why each discarded episode lost its environment (it was played again from its seed).
    pub failures: Vec<String>,
}

impl Trajectory {
    pub(crate) fn new(group: usize, index: usize, seed: u64) -> Trajectory {
        Trajectory {
            group,
            index,
            seed,
            prompt_ids: vec![],
            response: vec![],
            trainable: vec![],
            logprobs: vec![],
            turn_starts: vec![],
            turns: vec![],
            episode_return: 0.0,
            success: false,
            cut: None,
            invalid_actions: 0,
        }
    }
}
