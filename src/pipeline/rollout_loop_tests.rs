//! The rollout loop without a model: a scripted [`Generator`] answers every request at the next
//! engine step with an answer chosen by the test, so which groups the loop keeps, in which order,
//! with which rewards, can be checked against hand-computed outcomes.

use super::*;
use crate::config::RunConfig;
use crate::config::load::from_yaml_str;
use crate::data::Example;
use crate::model::LoadedModel;
use crate::model::chat_template::TemplateOptions;
use crate::model::hf_dir::tiny_test_model;
use crate::reward::{Reward, RewardFn};
use crate::role::RunError;
use crate::role::reward::{RewardScorer, SharedScorer};
use crate::rollout::FinishReason;

use super::super::setup::{Domain, Domains};

const GROUP: u64 = 4;

/// Finishes every queued request at the next step with `answer(request)`'s tokens.
struct Scripted<'a> {
    queued: Vec<Request>,
    answer: &'a dyn Fn(&Request) -> Vec<u32>,
    steps: usize,
}

impl Generator for Scripted<'_> {
    fn submit(&mut self, request: Request) {
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
        self.steps += 1;
        Ok(self
            .queued
            .drain(..)
            .map(|r| {
                let token_ids = (self.answer)(&r);
                Completion {
                    id: r.id,
                    logprobs: vec![-0.5; token_ids.len()],
                    token_ids,
                    prompt_ids: r.prompt_ids,
                    finish: FinishReason::Eos,
                }
            })
            .collect())
    }
}

fn model() -> LoadedModel {
    tiny_test_model("abcd>", 32, 1)
}

/// Reversal prompts (`abc>` → `cba`), scored by exact match.
fn domains() -> Domains {
    let examples = ["ab>", "abc>", "bcd>", "dab>", "cad>", "bd>", "acd>", "dcb>"]
        .iter()
        .map(|p| Example {
            prompt: p.to_string(),
            ground_truth: p.trim_end_matches('>').chars().rev().collect(),
            domain: "rev".into(),
            response: None,
            metadata: None,
        })
        .collect();
    Domains {
        domains: vec![Domain {
            name: "rev".into(),
            examples,
            val: vec![],
            ratio: 1.0,
            reward: Reward::One(RewardFn::ExactMatch { ignore_case: false }),
        }],
        chat_template: false,
        template_options: TemplateOptions::default(),
    }
}

fn rl(dynamic_sampling: bool) -> RlConfig {
    let text = format!(
        "name: t\nmodel: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"abcd>\" }} }}\n\
         data: {{ domains: [ {{ name: rev, synthetic: {{ task: reversal, count: 8 }}, reward: exact_match }} ] }}\n\
         rl: {{ steps: 1, prompts_per_step: 2, group_size: {GROUP}, dynamic_sampling: {{ enabled: {dynamic_sampling}, max_rounds: 4 }} }}\n"
    );
    let cfg: RunConfig = from_yaml_str(&text, "test").expect("a config");
    cfg.rl.expect("an rl section")
}

/// Groups with an even id answer right four times out of four (no learning signal); odd groups
/// answer right for samples 0 and 1 and wrong ("a") for samples 2 and 3.
fn answer(tok: Tokenizing<'_>) -> impl Fn(&Request) -> Vec<u32> {
    move |r: &Request| {
        let prompt = tok.decode(&r.prompt_ids);
        let truth: String = prompt.trim_end_matches('>').chars().rev().collect();
        let (group, index) = (r.id / GROUP, r.id % GROUP);
        let text = if group % 2 == 0 || index < 2 {
            truth
        } else {
            "a".to_string()
        };
        tok.answer_ids(&text).expect("answer tokens")
    }
}

fn rollout_once(dynamic_sampling: bool) -> (StepRollout, Vec<String>) {
    let model = model();
    let data = domains();
    let cfg = rl(dynamic_sampling);
    let tok = Tokenizing {
        model: &model,
        chat_template: false,
        template_options: TemplateOptions::none(),
    };
    let link = ScoreLink::start(SharedScorer::new(RewardScorer::in_process()))
        .expect("in-process scoring");
    let mut rollout = Rollout::new(&cfg, tok, &data, link, 9, 0);
    let mut mixer = data.mixer(9).expect("a mixer");
    let script = answer(tok);
    let mut engine = Scripted {
        queued: vec![],
        answer: &script,
        steps: 0,
    };
    let out = rollout
        .until_batch(&mut engine, &mut mixer)
        .expect("a batch");
    let prompts = out
        .groups
        .iter()
        .map(|g| g.prompt.example.prompt.clone())
        .collect();
    (out, prompts)
}

#[test]
fn without_dynamic_sampling_the_first_groups_train_flat_or_not() {
    let (out, _) = rollout_once(false);
    let ids: Vec<u64> = out.groups.iter().map(|g| g.id).collect();
    assert_eq!(ids, [0, 1]);
    let rewards: Vec<Vec<f32>> = out
        .groups
        .iter()
        .map(|g| g.samples.iter().map(|s| s.outcome.score).collect())
        .collect();
    // Group 0 (even): right 4/4; group 1 (odd): right, right, wrong, wrong.
    assert_eq!(rewards, [vec![1.0; 4], vec![1.0, 1.0, 0.0, 0.0]]);
    assert_eq!(out.stats.filtered_groups, 0);
}

#[test]
fn dynamic_sampling_drops_groups_without_signal_and_refills_with_the_next_ones() {
    let (out, prompts) = rollout_once(true);
    let ids: Vec<u64> = out.groups.iter().map(|g| g.id).collect();
    // Groups 0 and 2 are flat and dropped; 1 and 3 fill the batch of two prompts.
    assert_eq!(ids, [1, 3]);
    assert!(out.stats.filtered_groups >= 2, "{:?}", out.stats);
    for g in &out.groups {
        let texts: Vec<&str> = g.samples.iter().map(|s| s.text.as_str()).collect();
        let truth = &g.prompt.example.ground_truth;
        assert_eq!(texts, [truth.as_str(), truth, "a", "a"], "group {}", g.id);
        let correct: Vec<bool> = g.samples.iter().map(|s| s.outcome.correct).collect();
        assert_eq!(correct, [true, true, false, false]);
    }
    // The prompts of the kept groups are the mixer's second and fourth draws.
    let mut mixer = domains().mixer(9).expect("a mixer");
    let draws: Vec<String> = mixer.next_batch(4).into_iter().map(|e| e.prompt).collect();
    assert_eq!(prompts, [draws[1].clone(), draws[3].clone()]);
}
