//! The agentic rollout against hand-checked sequences: turns built in token ids (plain and chat
//! template), episodes played by a scripted policy, and — with a real model and engine — the
//! log-prob of every token the policy wrote equal to the training forward's on the whole
//! multi-turn sequence.

use candle_core::Device;

use super::batch::rl_batch;
use super::episodes::{Cut, EpisodeRunner};
use super::turns::TurnFormat;
use crate::config::load::from_yaml_str;
use crate::config::{EnvConfig, RlConfig, RunConfig};
use crate::model::chat_template::TemplateOptions;
use crate::model::{Arch, InitOptions, LoadedModel, Numerics, init_model};
use crate::role::RunError;
use crate::role::actor_infer::Generator;
use crate::rollout::{Completion, Engine, FinishReason, Request};
use crate::train::{TrainBatch, response_forward};

use super::super::setup::Tokenizing;

fn model(max_positions: usize) -> LoadedModel {
    init_model(&InitOptions {
        arch: Arch::Qwen2,
        hidden: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 64,
        head_dim: None,
        tie_embeddings: true,
        max_positions,
        rope_theta: 10_000.0,
        chars: "SFHGPXWLDRUeftowighnpsua:\n".into(),
        dtype: "float32".into(),
        seed: 5,
    })
    .expect("a tiny model")
}

fn plain(model: &LoadedModel) -> TurnFormat<'_> {
    TurnFormat {
        tok: Tokenizing {
            model,
            chat_template: false,
            template_options: TemplateOptions::none(),
        },
        instruction: None,
    }
}

fn ids(model: &LoadedModel, text: &str) -> Vec<u32> {
    Tokenizing {
        model,
        chat_template: false,
        template_options: TemplateOptions::none(),
    }
    .encode(text)
    .expect("known characters")
}

#[test]
fn plain_turns_append_only_the_observation_and_close_a_cut_turn() {
    let m = model(64);
    let f = plain(&m);
    let eos = m.eos_ids[0];
    assert_eq!(f.first("PF\nFG").ok(), Some(ids(&m, "PF\nFG\n")));
    let mut ended = ids(&m, "Right");
    ended.push(eos);
    // The policy ended its turn: the observation follows its end-of-sequence token.
    assert_eq!(f.next(&ended, "SP\nFG").ok(), Some(ids(&m, "SP\nFG\n")));
    // A turn cut before its end still ends there, so turns stay separated.
    let mut expected = vec![eos];
    expected.extend(ids(&m, "SP\nFG\n"));
    assert_eq!(f.next(&ids(&m, "Rig"), "SP\nFG").ok(), Some(expected));
    assert!(
        f.next(&ended, "SP?").is_err(),
        "unknown characters are an error"
    );
}

#[test]
fn templated_turns_add_what_the_template_writes_between_messages() {
    let mut m = model(128);
    // A small template in the style of ChatML: a role letter, the content, the end token.
    m.tokenizer.chat_template = Some(
        "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}<eos>\n{% endfor %}\
         {% if add_generation_prompt %}a:{% endif %}"
            .into(),
    );
    let f = TurnFormat {
        tok: Tokenizing {
            model: &m,
            chat_template: true,
            template_options: TemplateOptions::none(),
        },
        instruction: Some("Go"),
    };
    let first = f.first("PF").unwrap_or_default();
    let mut generated = ids(&m, "Right");
    generated.push(m.eos_ids[0]);
    let between = f.next(&generated, "SP").unwrap_or_default();
    let mut built = first;
    built.extend(&generated);
    built.extend(between);
    // Independently: the whole conversation rendered as text by the template, then tokenized.
    let whole = ids(&m, "s:Go<eos>\nu:PF<eos>\na:Right<eos>\nu:SP<eos>\na:");
    assert_eq!(built, whole);
}

fn rl(env: &str, max_turns: usize) -> (RlConfig, EnvConfig) {
    let text = format!(
        "name: t\nmodel: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"SFG\" }} }}\n\
         rl: {{ steps: 1, prompts_per_step: 2, group_size: 2, sampling: {{ max_new_tokens: 6 }}, \
         env: {{ name: frozen_lake, params: {{ {env}, legend: false }}, max_turns: {max_turns}, action_pattern: '(\\w+)' }} }}\n"
    );
    let cfg: RunConfig = from_yaml_str(&text, "test").expect("a config");
    let rl = cfg.rl.expect("an rl section");
    let env = rl.env.clone().expect("an env");
    (rl, env)
}

/// The scripted episodes' policy, by request id (group * 2 + index with groups of 2): episodes 0
/// and 2 walk Right, episode 1 writes no action ("ei"), episode 3 goes Left; each turn ends with
/// the end-of-sequence token.
fn scripted_policy(m: &LoadedModel, r: &Request) -> Vec<u32> {
    let text = match r.id {
        1 => "ei",
        3 => "Left",
        _ => "Right",
    };
    let mut t = ids(m, text);
    t.push(m.eos_ids[0]);
    t
}

/// Answers each request at the next step with `answer(request)`, log-prob −0.5 per token.
struct Scripted<'a> {
    queued: Vec<Request>,
    answer: &'a dyn Fn(&Request) -> Vec<u32>,
    requests: Vec<Request>,
}

impl<'a> Scripted<'a> {
    fn new(answer: &'a dyn Fn(&Request) -> Vec<u32>) -> Self {
        Scripted {
            queued: vec![],
            answer,
            requests: vec![],
        }
    }
}

impl Generator for Scripted<'_> {
    fn submit(&mut self, request: Request) {
        self.requests.push(request.clone());
        self.queued.push(request);
    }
    fn abort(&mut self, cancel: &dyn Fn(u64) -> bool) -> Result<(), RunError> {
        self.queued.retain(|r| !cancel(r.id));
        Ok(())
    }
    fn is_idle(&self) -> bool {
        self.queued.is_empty()
    }
    fn step(&mut self) -> Result<Vec<Completion>, RunError> {
        Ok(self
            .queued
            .drain(..)
            .map(|r| {
                // As the engine does: at most max_new_tokens, cut there.
                let mut token_ids = (self.answer)(&r);
                let finish = if token_ids.len() > r.params.max_new_tokens {
                    token_ids.truncate(r.params.max_new_tokens);
                    FinishReason::Length
                } else {
                    FinishReason::Eos
                };
                Completion {
                    id: r.id,
                    logprobs: vec![-0.5; token_ids.len()],
                    token_ids,
                    prompt_ids: r.prompt_ids,
                    finish,
                }
            })
            .collect())
    }
}

#[test]
fn scripted_episodes_end_by_goal_turn_limit_or_budget_with_only_policy_tokens_trainable() {
    let m = model(64);
    let eos = m.eos_ids[0];
    let (cfg, env) = rl("map: SFG", 3);
    let runner = EpisodeRunner::new(&cfg, &env, plain(&m), 1);
    // Request ids are group * 2 + index: episodes 0 and 2 walk Right (goal after 2 turns);
    // episode 1 writes no action ("Hi": −0.1 each turn, cut after 3 turns); episode 3 goes Left
    // (stays at S; cut after 3 turns).
    let answer = |r: &Request| scripted_policy(&m, r);
    let mut scripted = Scripted::new(&answer);
    let out = runner.run(1, &mut scripted).expect("a rollout");
    let t = &out.trajectories;
    let summary: Vec<(usize, usize, bool, Option<Cut>, usize)> = t
        .iter()
        .map(|t| (t.group, t.turns.len(), t.success, t.cut, t.invalid_actions))
        .collect();
    assert_eq!(
        summary,
        [
            (0, 2, true, None, 0),
            (0, 3, false, Some(Cut::Turns), 3),
            (1, 2, true, None, 0),
            (1, 3, false, Some(Cut::Turns), 0),
        ]
    );
    assert_eq!(t[0].episode_return, 1.0);
    assert!((t[1].episode_return + 0.3).abs() < 1e-12);
    assert_eq!(t[0].seed, t[1].seed, "a group's episodes share their seed");
    assert_ne!(t[0].seed, t[2].seed);
    // Episode 0: prompt "PFG\n"; response "Right<eos>" + "SPG\n" + "Right<eos>"; the middle
    // observation is context, not trained, and has log-prob 0.
    assert_eq!(t[0].prompt_ids, ids(&m, "PFG\n"));
    let mut right = ids(&m, "Right");
    right.push(eos);
    let mut expected = right.clone();
    expected.extend(ids(&m, "SPG\n"));
    expected.extend(&right);
    assert_eq!(t[0].response, expected);
    let mask: Vec<f32> = [vec![1.0; 6], vec![0.0; 4], vec![1.0; 6]].concat();
    assert_eq!(t[0].trainable, mask);
    assert_eq!(t[0].logprobs.iter().filter(|l| **l == -0.5).count(), 12);
    // The last request of episode 0 was the whole conversation so far.
    let last = scripted
        .requests
        .iter()
        .rev()
        .find(|r| r.id == 0)
        .map(|r| r.prompt_ids.clone());
    assert_eq!(
        last,
        Some([ids(&m, "PFG\n"), right, ids(&m, "SPG\n")].concat())
    );
    let batch = rl_batch(t, 2);
    assert_eq!(batch.rewards, [1.0, -0.3, 1.0, 0.0]);
    assert_eq!(batch.correct, [1.0, 0.0, 1.0, 0.0]);

    // A budget of 12 tokens. "PFG\n" (4) + "Right<eos>" (6) + "SPG\n" (4) = 14: cut after one
    // turn, as "Left<eos>" (5) is. "ei<eos>" (3) + "PFG\n" (4) leaves room for 1 token: the second
    // turn is cut to "e", and its end-of-turn token and the next observation no longer fit.
    let (cfg, mut env) = rl("map: SFG", 3);
    env.max_trajectory_tokens = Some(12);
    let runner = EpisodeRunner::new(&cfg, &env, plain(&m), 1);
    let mut scripted = Scripted::new(&answer);
    let out = runner.run(1, &mut scripted).expect("a rollout");
    let ends: Vec<(usize, Option<Cut>)> = out
        .trajectories
        .iter()
        .map(|t| (t.turns.len(), t.cut))
        .collect();
    let budget = Some(Cut::Budget);
    assert_eq!(ends, [(1, budget), (2, budget), (1, budget), (1, budget)]);
    assert_eq!(out.trajectories[1].turns[1].tokens, 1);
    for r in &scripted.requests {
        assert!(r.prompt_ids.len() + r.params.max_new_tokens <= 12, "{r:?}");
    }
}

#[test]
fn every_policy_token_of_a_multi_turn_episode_has_its_training_log_prob() {
    // A real model sampling real turns: the training forward over the whole conversation must
    // give each token the policy wrote the log-prob it was sampled with (the token ids are kept
    // as sampled; the environment's text in between is only context).
    let m = model(256);
    let (mut cfg, env) = rl("map: SFFF/FHFH/FFFH/HFFG", 4);
    cfg.sampling.temperature = 0.8;
    let runner = EpisodeRunner::new(&cfg, &env, plain(&m), 3);
    let mut engine = Engine::new(&m.transformer, m.eos_ids.clone(), 3);
    let out = runner.run(1, &mut engine).expect("a rollout");
    let multi: Vec<_> = out
        .trajectories
        .iter()
        .filter(|t| t.turns.len() > 1)
        .collect();
    assert!(
        !multi.is_empty(),
        "an untrained model still plays several turns"
    );
    let pairs: Vec<(&[u32], &[u32])> = multi
        .iter()
        .map(|t| (t.prompt_ids.as_slice(), t.response.as_slice()))
        .collect();
    let groups = m.transformer.config().kv_groups();
    let batch = TrainBatch::new(&pairs, m.pad_id, groups, &Device::Cpu).expect("a batch");
    let (logp, _) = response_forward(
        &m.transformer,
        &batch,
        0.8,
        Numerics::Differentiable,
        false,
        None,
    )
    .expect("a forward");
    let logp = logp.to_vec2::<f32>().expect("log-probs");
    let mut worst = 0f32;
    let mut checked = 0;
    for (row, t) in multi.iter().enumerate() {
        for (k, (&mask, &lp)) in t.trainable.iter().zip(&t.logprobs).enumerate() {
            if mask == 1.0 {
                worst = worst.max((logp[row][k] - lp).abs());
                checked += 1;
            }
        }
    }
    assert!(checked > 10, "only {checked} policy tokens");
    assert!(
        worst <= 1e-4,
        "max |train - rollout| log-prob difference {worst}"
    );
}

#[test]
fn step_wise_and_per_turn_batches_carry_hand_computed_advantages() {
    use super::batch::agentic_batch;
    use crate::algo::AdvantageEstimator;
    let m = model(64);
    let eos = m.eos_ids[0];
    // The same scripted episodes as above: group 0 = (Right, Right: goal) and (invalid x3);
    // group 1 = (Right, Right: goal) and (Left x3).
    let answer = |r: &Request| scripted_policy(&m, r);
    let play = |cfg: &RlConfig, env: &EnvConfig| {
        let runner = EpisodeRunner::new(cfg, env, plain(&m), 1);
        let mut scripted = Scripted::new(&answer);
        runner.run(1, &mut scripted).expect("a rollout")
    };
    let (mut cfg, mut env) = rl("map: SFG", 3);
    env.mode = crate::config::EnvMode::Step;
    env.step_reward_gamma = 0.5;
    cfg.adv_estimator = AdvantageEstimator::StepReinforce;
    let out = play(&cfg, &env);
    let batch = agentic_batch(&cfg, &env, &out.trajectories);
    // Rows are turns: 2 + 3 + 2 + 3. Returns with γ = 0.5: the goal episodes [0.5, 1]; the
    // invalid one [-0.175, -0.15, -0.1]; the stuck one [0, 0, 0].
    let firsts: Vec<f32> = batch
        .advantages
        .iter()
        .flatten()
        .map(|row| row[0])
        .collect();
    let expected = [0.5, 1.0, -0.175, -0.15, -0.1, 0.5, 1.0, 0.0, 0.0, 0.0];
    assert_eq!(firsts.len(), expected.len());
    assert!(
        firsts
            .iter()
            .zip(expected)
            .all(|(a, b)| (a - b).abs() < 1e-6),
        "{firsts:?}"
    );
    // Each row is one turn: its own prompt (here the current observation only) and output.
    assert_eq!(batch.prompts[1], ids(&m, "SPG\n"));
    assert_eq!(batch.responses[1], [ids(&m, "Right"), vec![eos]].concat());
    assert_eq!(batch.group_size, 1);

    // GiGPO without std normalisation, γ = 0.5. Group 0: scores 1 and -0.3 (mean 0.35) ->
    // A^E = +0.65, -0.65; both start at S: anchor S has G 0.5 and -0.175 (mean 0.1625) ->
    // ±0.3375; the goal episode's second state (P in the middle) is a lone anchor; the invalid
    // episode stays at S, so its turns 2 and 3 join anchor S too: G at S = {0.5, -0.175, -0.15,
    // -0.1}, mean 0.01875.
    cfg.adv_estimator = AdvantageEstimator::Gigpo;
    cfg.std_normalize = false;
    let batch = agentic_batch(&cfg, &env, &out.trajectories);
    let adv: Vec<f32> = batch.advantages.iter().flatten().map(|r| r[0]).collect();
    let s_mean = (0.5 - 0.175 - 0.15 - 0.1) / 4.0;
    let expected = [
        0.65 + (0.5 - s_mean),
        0.65 + 0.0,
        -0.65 + (-0.175 - s_mean),
        -0.65 + (-0.15 - s_mean),
        -0.65 + (-0.1 - s_mean),
    ];
    assert!(
        adv[..5]
            .iter()
            .zip(expected)
            .all(|(a, b)| (f64::from(*a) - b).abs() < 1e-5),
        "{adv:?} vs {expected:?}"
    );

    // agentic_reinforce: trajectory-wise rows, each turn's tokens carry its discounted return and
    // the observation between turns carries 0.
    let (mut cfg, mut env) = rl("map: SFG", 3);
    env.step_reward_gamma = 0.5;
    cfg.adv_estimator = AdvantageEstimator::AgenticReinforce;
    let out = play(&cfg, &env);
    let batch = agentic_batch(&cfg, &env, &out.trajectories);
    let row = &batch
        .advantages
        .as_ref()
        .map(|a| a[0].clone())
        .unwrap_or_default();
    assert_eq!(row, &[vec![0.5; 6], vec![0.0; 4], vec![1.0; 6]].concat());
    assert_eq!(batch.prompts.len(), 4);
}

mod external;
