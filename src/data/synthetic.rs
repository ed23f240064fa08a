//! Generated datasets, so that examples and tests need no download: addition (scored by the math rule)
//! and string reversal (scored by exact match).
//!
//! `demo_noise` makes the SFT demonstrations imperfect, as real ones are: that fraction of examples
//! carries a `response` from a distractor behaviour (the difference instead of the sum; the input copied
//! instead of reversed), while `ground_truth` — what rewards check — stays correct. SFT then learns both
//! behaviours, and RL with the verifier has to find and keep the right one.

use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

use super::Example;

/// A generated task. `count` examples are drawn with the run's seed (or `seed` when given).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "task", rename_all = "snake_case", deny_unknown_fields)]
pub enum SyntheticConfig {
    /// `"37+45="` -> `"82"`, operands with exactly `digits` digits (`digits: 1` includes 0).
    Addition {
        count: usize,
        #[serde(default = "two")]
        digits: u32,
        /// Fraction of SFT demonstrations that show |a-b| instead of a+b.
        #[serde(default)]
        demo_noise: f64,
        #[serde(default)]
        seed: Option<u64>,
    },
    /// `"abc>"` -> `"cba"`, strings of `min_len..=max_len` characters of `alphabet`.
    Reversal {
        count: usize,
        #[serde(default = "three")]
        min_len: usize,
        #[serde(default = "five")]
        max_len: usize,
        #[serde(default = "default_alphabet")]
        alphabet: String,
        /// Fraction of SFT demonstrations that copy the string instead of reversing it.
        #[serde(default)]
        demo_noise: f64,
        #[serde(default)]
        seed: Option<u64>,
    },
    /// Multi-turn demonstrations of an environment (`src/env/`) in its plain transcript form: one
    /// example per turn, the transcript so far -> the planner's action, or a random one with
    /// probability `demo_noise` (an agentic run's SFT warm start).
    EnvDemos {
        /// A registered environment (`roll-tui env list`) and its parameters.
        env: String,
        #[serde(default)]
        params: std::collections::BTreeMap<String, serde_json::Value>,
        episodes: usize,
        #[serde(default)]
        demo_noise: f64,
        #[serde(default = "ten")]
        max_turns: usize,
        /// How an action is written, `{action}` standing for it.
        #[serde(default = "default_answer_template")]
        answer_template: String,
        /// Text before the first observation, as the agentic run's `rl.env.instruction`.
        #[serde(default)]
        instruction: Option<String>,
        /// Prompt each turn with its observation alone, as step-wise training without history
        /// (`rl.env.mode: step`, `history_length: 0`) prompts; default: the transcript so far.
        #[serde(default)]
        observation_only: bool,
        #[serde(default)]
        seed: Option<u64>,
    },
}

fn ten() -> usize {
    10
}
fn default_answer_template() -> String {
    "<answer>{action}</answer>".into()
}

fn two() -> u32 {
    2
}
fn three() -> usize {
    3
}
fn five() -> usize {
    5
}
fn default_alphabet() -> String {
    "abcdefgh".into()
}

impl SyntheticConfig {
    /// Problems with the parameters, as `at.field ...` messages.
    pub fn validate(&self, at: &str, problems: &mut Vec<String>) {
        let (count, demo_noise) = match self {
            SyntheticConfig::Addition {
                count, demo_noise, ..
            }
            | SyntheticConfig::Reversal {
                count, demo_noise, ..
            } => (*count, *demo_noise),
            SyntheticConfig::EnvDemos {
                episodes,
                demo_noise,
                ..
            } => (*episodes, *demo_noise),
        };
        if !(0.0..=1.0).contains(&demo_noise) {
            problems.push(format!(
                "{at}.demo_noise must be in [0, 1], got {demo_noise}"
            ));
        }
        if count == 0 {
            let field = match self {
                SyntheticConfig::EnvDemos { .. } => "episodes",
                _ => "count",
            };
            problems.push(format!("{at}.{field} must be at least 1"));
        }
        match self {
            SyntheticConfig::Addition { digits, .. } => {
                if !(1..=9).contains(digits) {
                    problems.push(format!("{at}.digits must be in 1..=9, got {digits}"));
                }
            }
            SyntheticConfig::Reversal {
                min_len,
                max_len,
                alphabet,
                ..
            } => {
                if *min_len == 0 || min_len > max_len {
                    problems.push(format!(
                        "{at}: need 1 <= min_len <= max_len, got {min_len} and {max_len}"
                    ));
                }
                if alphabet.chars().count() < 2 {
                    problems.push(format!(
                        "{at}.alphabet needs at least 2 characters, got '{alphabet}'"
                    ));
                }
            }
            SyntheticConfig::EnvDemos {
                env,
                params,
                max_turns,
                answer_template,
                ..
            } => {
                if let Err(e) = crate::env::make(env, &crate::env::param_pairs(params)) {
                    problems.push(format!("{at}: {e}"));
                }
                if *max_turns == 0 {
                    problems.push(format!("{at}.max_turns must be at least 1"));
                }
                if !answer_template.contains("{action}") {
                    problems.push(format!(
                        "{at}.answer_template '{answer_template}' must contain {{action}}"
                    ));
                }
            }
        }
    }

    /// Every character a prompt or answer of this task can contain.
    pub fn charset(&self) -> String {
        match self {
            SyntheticConfig::Addition { .. } => "0123456789+=".into(),
            SyntheticConfig::Reversal { alphabet, .. } => format!("{alphabet}>"),
            SyntheticConfig::EnvDemos { .. } => String::new(),
        }
    }

    /// The task's examples; `turn_end` is the text of the model's end-of-turn token (multi-turn
    /// demonstrations write it between turns).
    pub fn generate(
        &self,
        domain: &str,
        run_seed: u64,
        turn_end: &str,
    ) -> Result<Vec<Example>, String> {
        let example = |prompt: String, ground_truth: String, response: Option<String>| Example {
            prompt,
            ground_truth,
            domain: domain.into(),
            response,
            metadata: None,
        };
        match self {
            SyntheticConfig::Addition {
                count,
                digits,
                demo_noise,
                seed,
            } => {
                let mut rng = StdRng::seed_from_u64(seed.unwrap_or(run_seed));
                let lo = if *digits == 1 {
                    0
                } else {
                    10u64.pow(digits - 1)
                };
                let hi = 10u64.pow(*digits);
                Ok((0..*count)
                    .map(|_| {
                        let (a, b) = (rng.random_range(lo..hi), rng.random_range(lo..hi));
                        let noisy = rng.random_bool(demo_noise.clamp(0.0, 1.0));
                        let demo = noisy.then(|| a.abs_diff(b).to_string());
                        example(format!("{a}+{b}="), (a + b).to_string(), demo)
                    })
                    .collect())
            }
            SyntheticConfig::Reversal {
                count,
                min_len,
                max_len,
                alphabet,
                demo_noise,
                seed,
            } => {
                let mut rng = StdRng::seed_from_u64(seed.unwrap_or(run_seed).wrapping_add(1));
                let chars: Vec<char> = alphabet.chars().collect();
                Ok((0..*count)
                    .map(|_| {
                        let len = rng.random_range(*min_len..=*max_len);
                        let s: String = (0..len)
                            .map(|_| chars[rng.random_range(0..chars.len())])
                            .collect();
                        let noisy = rng.random_bool(demo_noise.clamp(0.0, 1.0));
                        example(
                            format!("{s}>"),
                            s.chars().rev().collect(),
                            noisy.then(|| s.clone()),
                        )
                    })
                    .collect())
            }
            SyntheticConfig::EnvDemos {
                env,
                params,
                episodes,
                demo_noise,
                max_turns,
                answer_template,
                instruction,
                observation_only,
                seed,
            } => {
                let mut env = crate::env::make(env, &crate::env::param_pairs(params))?;
                if env.blocks() {
                    // The planner searches on copies; a copy of a program-backed env is a new
                    // program replaying the episode, one per searched state.
                    return Err(format!(
                        "env_demos cannot plan in '{}': its planner copies the environment for \
                         every state it searches, and a copy of an external program is a new \
                         program; give demonstrations as a dataset instead",
                        env.name()
                    ));
                }
                let spec = crate::env::transcript::DemoSpec {
                    episodes: *episodes,
                    noise: *demo_noise,
                    max_turns: *max_turns,
                    answer_template,
                    instruction: instruction.as_deref(),
                    turn_end,
                    seed: seed.unwrap_or(run_seed),
                    observation_only: *observation_only,
                };
                Ok(crate::env::transcript::demonstrations(env.as_mut(), &spec)
                    .map_err(|e| format!("env_demos: {e}"))?
                    .into_iter()
                    .map(|t| example(t.prompt, t.answer, None))
                    .collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addition_examples_are_correct_sums_with_fixed_width_operands() {
        let cfg = SyntheticConfig::Addition {
            count: 50,
            digits: 2,
            demo_noise: 0.0,
            seed: None,
        };
        let data = cfg.generate("add", 7, "").unwrap();
        assert_eq!(data.len(), 50);
        for ex in &data {
            let body = ex.prompt.strip_suffix('=').unwrap();
            let (a, b) = body.split_once('+').unwrap();
            assert_eq!((a.len(), b.len()), (2, 2));
            let sum: u64 = a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap();
            assert_eq!(ex.ground_truth, sum.to_string());
            assert_eq!(ex.domain, "add");
        }
        assert_eq!(data, cfg.generate("add", 7, "").unwrap());
        assert_ne!(data, cfg.generate("add", 8, "").unwrap());
    }

    #[test]
    fn reversal_examples_reverse_within_length_bounds() {
        let cfg = SyntheticConfig::Reversal {
            count: 40,
            min_len: 2,
            max_len: 4,
            alphabet: "ab".into(),
            demo_noise: 0.0,
            seed: Some(1),
        };
        for ex in cfg.generate("rev", 0, "").unwrap() {
            let s = ex.prompt.strip_suffix('>').unwrap();
            assert!((2..=4).contains(&s.len()) && s.chars().all(|c| c == 'a' || c == 'b'));
            assert_eq!(ex.ground_truth, s.chars().rev().collect::<String>());
        }
    }

    #[test]
    fn bad_parameters_are_reported() {
        let mut p = vec![];
        SyntheticConfig::Reversal {
            count: 0,
            min_len: 5,
            max_len: 2,
            alphabet: "a".into(),
            demo_noise: 1.5,
            seed: None,
        }
        .validate("data.domains[1].synthetic", &mut p);
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[0].contains("demo_noise must be in [0, 1], got 1.5"));
        assert!(p[2].contains("min_len <= max_len"));
    }

    #[test]
    fn demo_noise_replaces_that_fraction_of_demonstrations_but_never_the_answer() {
        let cfg = SyntheticConfig::Addition {
            count: 2000,
            digits: 1,
            demo_noise: 0.25,
            seed: None,
        };
        let data = cfg.generate("add", 3, "").unwrap();
        let noisy: Vec<&Example> = data.iter().filter(|e| e.response.is_some()).collect();
        // Binomial(2000, 0.25): mean 500, sd ~19.
        assert!((440..=560).contains(&noisy.len()), "{}", noisy.len());
        for ex in noisy {
            let (a, b) = ex.prompt.trim_end_matches('=').split_once('+').unwrap();
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
            assert_eq!(ex.ground_truth, (a + b).to_string());
            assert_eq!(
                ex.response.as_deref(),
                Some(a.abs_diff(b).to_string().as_str())
            );
        }
        let rev = SyntheticConfig::Reversal {
            count: 100,
            min_len: 3,
            max_len: 3,
            alphabet: "abc".into(),
            demo_noise: 1.0,
            seed: None,
        };
        for ex in rev.generate("rev", 1, "").unwrap() {
            assert_eq!(ex.response.as_deref(), ex.prompt.strip_suffix('>'));
        }
    }
}
