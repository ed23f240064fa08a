//! Advantages of agentic episodes, computed per environment step (turn) rather than per token:
//!
//! - **gigpo** (GiGPO, Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent
//!   Training"): an episode-level advantage — the episode's return normalised within its group
//!   (episodes from one start state, as GRPO) — plus a step-level advantage: the step's discounted
//!   return normalised within its *anchor-state group*, the steps of the same episode group that
//!   acted in an identical state (equal `state_hash`). `A = w_E · A^E + w_S · A^S`.
//! - **step_reinforce**: each step's discounted return `G_t = Σ_{k≥t} γ^{k−t} r_k`.
//! - **agentic_reinforce**: the same per-turn returns for a trajectory-wise sequence — every token of
//!   turn `t` gets `G_t` (per-turn, not per-token, discounting).
//!
//! Normalisation follows this module's GRPO: `(x − mean) / (std + eps)` with the unbiased std, or
//! `x − mean` without std normalisation. A group of one has no peers to be compared with, so its
//! relative advantage is 0 (verl-agent instead falls back to the raw value there; a lone anchor
//! state says nothing about whether its action was better than another).

use std::collections::HashMap;

use super::mean_std;

/// One episode's steps: its rewards and the state each step acted in, with its group.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeSteps {
    /// Episodes with the same `group` started from the same state.
    pub group: usize,
    pub rewards: Vec<f64>,
    pub state_hashes: Vec<u64>,
}

/// Parameters of [`gigpo`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GigpoParams {
    /// Discount of the step-level returns.
    pub gamma: f64,
    pub episode_weight: f64,
    pub step_weight: f64,
    pub std_normalize: bool,
    pub eps: f64,
}

/// `G_t = r_t + γ G_{t+1}` for every step of one episode.
pub fn discounted_returns(rewards: &[f64], gamma: f64) -> Vec<f64> {
    let mut out = vec![0.0; rewards.len()];
    let mut running = 0.0;
    for (t, r) in rewards.iter().enumerate().rev() {
        running = r + gamma * running;
        out[t] = running;
    }
    out
}

/// Each value relative to the others of its group (`keys[i]` names `values[i]`'s group).
fn relative<K: std::hash::Hash + Eq + Copy>(
    keys: &[K],
    values: &[f64],
    std_normalize: bool,
    eps: f64,
) -> Vec<f64> {
    let mut groups: HashMap<K, Vec<f64>> = HashMap::new();
    for (k, v) in keys.iter().zip(values) {
        groups.entry(*k).or_default().push(*v);
    }
    let stats: HashMap<K, (f64, f64, usize)> = groups
        .into_iter()
        .map(|(k, vs)| {
            let (mean, std) = mean_std(vs.iter().copied());
            (k, (mean, std, vs.len()))
        })
        .collect();
    keys.iter()
        .zip(values)
        .map(|(k, v)| {
            let (mean, std, n) = stats[k];
            match (n, std_normalize) {
                (1, _) => 0.0,
                (_, true) => (v - mean) / (std + eps),
                (_, false) => v - mean,
            }
        })
        .collect()
}

/// GiGPO advantages, one per step of each episode (`out[i][t]`).
pub fn gigpo(episodes: &[EpisodeSteps], p: &GigpoParams) -> Vec<Vec<f64>> {
    let groups: Vec<usize> = episodes.iter().map(|e| e.group).collect();
    let scores: Vec<f64> = episodes.iter().map(|e| e.rewards.iter().sum()).collect();
    let episode_adv = relative(&groups, &scores, p.std_normalize, p.eps);
    let mut anchors = vec![];
    let mut returns = vec![];
    for e in episodes {
        returns.extend(discounted_returns(&e.rewards, p.gamma));
        anchors.extend(e.state_hashes.iter().map(|h| (e.group, *h)));
    }
    let step_adv = relative(&anchors, &returns, p.std_normalize, p.eps);
    let mut at = 0;
    episodes
        .iter()
        .zip(episode_adv)
        .map(|(e, a_e)| {
            let row = (0..e.rewards.len())
                .map(|t| p.episode_weight * a_e + p.step_weight * step_adv[at + t])
                .collect();
            at += e.rewards.len();
            row
        })
        .collect()
}

/// step_reinforce and agentic_reinforce: each step's (turn's) discounted return.
pub fn step_returns(episodes: &[EpisodeSteps], gamma: f64) -> Vec<Vec<f64>> {
    episodes
        .iter()
        .map(|e| discounted_returns(&e.rewards, gamma))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[Vec<f64>], b: &[Vec<f64>]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                x.len() == y.len() && x.iter().zip(y).all(|(u, v)| (u - v).abs() < 1e-9)
            })
    }

    #[test]
    fn discounted_returns_fold_back_from_the_last_step() {
        // r = [0, -0.1, 1], γ = 0.5: G_2 = 1, G_1 = -0.1 + 0.5 = 0.4, G_0 = 0 + 0.5·0.4 = 0.2.
        let g = discounted_returns(&[0.0, -0.1, 1.0], 0.5);
        assert!(close(&[g], &[vec![0.2, 0.4, 1.0]]));
    }

    #[test]
    fn gigpo_matches_a_hand_computed_group() {
        // One group of two episodes from the same start state A:
        //   e0: A -> B -> goal, rewards [0, 1], states [A, B]
        //   e1: A -> C (stuck),   rewards [0, 0], states [A, C]
        // γ = 1, w_E = w_S = 1, no std normalisation:
        //   episode: scores 1 and 0, mean 0.5 -> A^E = +0.5, -0.5
        //   step: anchor A holds e0's G = 1 and e1's G = 0 -> +0.5, -0.5;
        //         B and C are lone anchors -> 0.
        //   A = [[1.0, 0.5], [-1.0, -0.5]]
        let eps = vec![
            EpisodeSteps {
                group: 0,
                rewards: vec![0.0, 1.0],
                state_hashes: vec![1, 2],
            },
            EpisodeSteps {
                group: 0,
                rewards: vec![0.0, 0.0],
                state_hashes: vec![1, 3],
            },
        ];
        let p = GigpoParams {
            gamma: 1.0,
            episode_weight: 1.0,
            step_weight: 1.0,
            std_normalize: false,
            eps: 1e-6,
        };
        assert!(close(&gigpo(&eps, &p), &[vec![1.0, 0.5], vec![-1.0, -0.5]]));
        // With std normalisation (the unbiased std of two values a, b is |a - b| / √2): episode
        // (1 - 0.5) / (1 / √2) = 1/√2 each side; anchor A likewise; B and C still 0.
        let s = std::f64::consts::FRAC_1_SQRT_2;
        let q = GigpoParams {
            std_normalize: true,
            eps: 0.0,
            ..p
        };
        assert!(close(
            &gigpo(&eps, &q),
            &[vec![2.0 * s, s], vec![-2.0 * s, -s]]
        ));
        // The weights scale the two parts; γ discounts the step part only.
        let w = GigpoParams {
            gamma: 0.5,
            episode_weight: 2.0,
            step_weight: 0.0,
            ..p
        };
        assert!(close(&gigpo(&eps, &w), &[vec![1.0, 1.0], vec![-1.0, -1.0]]));
        let d = GigpoParams {
            gamma: 0.5,
            episode_weight: 0.0,
            ..p
        };
        // G: e0 [0.5, 1], e1 [0, 0]; anchor A: 0.5 vs 0 -> ±0.25.
        assert!(close(
            &gigpo(&eps, &d),
            &[vec![0.25, 0.0], vec![-0.25, 0.0]]
        ));
    }

    #[test]
    fn identical_states_in_different_groups_are_not_compared() {
        let eps = vec![
            EpisodeSteps {
                group: 0,
                rewards: vec![1.0],
                state_hashes: vec![7],
            },
            EpisodeSteps {
                group: 1,
                rewards: vec![0.0],
                state_hashes: vec![7],
            },
        ];
        let p = GigpoParams {
            gamma: 1.0,
            episode_weight: 1.0,
            step_weight: 1.0,
            std_normalize: false,
            eps: 1e-6,
        };
        assert!(close(&gigpo(&eps, &p), &[vec![0.0], vec![0.0]]));
        assert!(close(&step_returns(&eps, 1.0), &[vec![1.0], vec![0.0]]));
    }
}
