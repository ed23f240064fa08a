use std::collections::BTreeMap;

use super::*;
use crate::debugger::open::{env_config, session};
use crate::debugger::session::Actor;
use crate::model::{Arch, InitOptions, init_model};

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
        chars: "SFHGPXDownRightLefUp<asr>/\n:Tu 2(vldc)-0.1".into(),
        dtype: "float32".into(),
        seed: 9,
    })
    .expect("a tiny model")
}

fn lake_env() -> EnvConfig {
    env_config(
        "frozen_lake",
        &[
            ("map".into(), "SFF/FHF/FFG".into()),
            ("legend".into(), "false".into()),
        ],
    )
    .unwrap()
}

fn policy(env: EnvConfig, max_positions: usize, temperature: f64) -> ModelPolicy {
    let sampling = SamplingParams {
        temperature,
        max_new_tokens: 6,
        ..SamplingParams::default()
    };
    ModelPolicy::new("tiny".into(), model(max_positions), false, &env, sampling).unwrap()
}

fn ids(p: &ModelPolicy, text: &str) -> Vec<u32> {
    p.tok().encode(text).unwrap()
}

#[test]
fn the_prompt_is_the_transcript_a_rollout_builds() {
    let p = policy(lake_env(), 256, 1.0);
    let mut s = session(&lake_env(), 0).unwrap();
    assert_eq!(p.prompt(&s).unwrap().ids, ids(&p, "PFF\nFHF\nFFG\n"));
    s.take("Down", Actor::Human).unwrap();
    s.act("no".into(), Actor::Human, None).unwrap();
    // Plain transcript (env::transcript): observation and newline, then each turn's output, the
    // end-of-sequence token that closes it, and the next observation with a newline.
    let eos = p.model().eos_ids[0];
    let mut expected = ids(&p, "PFF\nFHF\nFFG\n<answer>Down</answer>");
    expected.push(eos);
    expected.extend(ids(&p, "SFF\nPHF\nFFG\nno"));
    expected.push(eos);
    expected.extend(ids(&p, "SFF\nPHF\nFFG\n"));
    let prompt = p.prompt(&s).unwrap();
    assert_eq!(prompt.ids, expected);
    assert_eq!(prompt.max_new_tokens, 6);
    assert!(
        prompt
            .text
            .starts_with("PFF\nFHF\nFFG\n<answer>Down</answer>")
    );
    // Step mode with one turn of history: a fresh prompt of the last turn's line and the
    // observation.
    let mut step_env = lake_env();
    step_env.mode = crate::config::EnvMode::Step;
    step_env.history_length = 1;
    let p = policy(step_env, 256, 1.0);
    assert_eq!(
        p.prompt(&s).unwrap().ids,
        ids(
            &p,
            "Turn 2: (no valid action) -> reward -0.1\nSFF\nPHF\nFFG\n"
        )
    );
    // A conversation that fills the model's positions cannot take another turn.
    let p = policy(lake_env(), 20, 1.0);
    let err = p.prompt(&s).unwrap_err();
    assert!(err.contains("fills the budget of 20"), "{err}");
    // With room for fewer tokens than the sampling limit, the turn gets what is left.
    let p = policy(lake_env(), 15, 1.0);
    let first = session(&lake_env(), 0).unwrap();
    assert_eq!(p.prompt(&first).unwrap().max_new_tokens, 3);
}

#[test]
fn a_model_turn_reports_the_samplers_log_probs_and_the_distribution_they_come_from() {
    let p = policy(lake_env(), 256, 0.7);
    let mut s = session(&lake_env(), 0).unwrap();
    let prompt = p.prompt(&s).unwrap();
    let (output, turn) = p.generate(&prompt, 11, None).unwrap();
    assert_eq!(turn.prompt_tokens, prompt.ids.len());
    assert!(!turn.tokens.is_empty());
    // The engine's sampler and the teacher-forced forward agree on every token's log-prob.
    let completion = p.draw(&prompt, &[11], None).unwrap().remove(0);
    assert_eq!(completion.token_ids, turn.output_ids);
    let vocab = p.model().config().vocab_size as f32;
    for (k, lp) in turn.tokens.iter().zip(&completion.logprobs) {
        assert!((k.logprob - lp).abs() < 1e-4, "{} vs {lp}", k.logprob);
        assert!(k.entropy >= 0.0 && k.entropy <= vocab.ln() + 1e-4);
        let probs: Vec<f32> = k.alternatives.iter().map(|a| a.1).collect();
        assert!(probs.windows(2).all(|w| w[0] >= w[1]), "{probs:?}");
        // The drawn token, when among the likeliest, has its own probability there.
        if let Some(a) = k.alternatives.iter().find(|a| a.0 == k.text) {
            assert!((a.1 - k.logprob.exp()).abs() < 1e-5);
        }
    }
    // The entropy of the first token, independently: candle's log_softmax over the whole
    // sequence's logits at the position before the output (temperature 0.7).
    let batch = TrainBatch::new(
        &[(&prompt.ids, &turn.output_ids)],
        p.model().pad_id,
        p.model().config().kv_groups(),
        p.model().transformer.device(),
    )
    .unwrap();
    let (_, entropy) = crate::train::response_forward(
        &p.model().transformer,
        &batch,
        0.7,
        Numerics::Fast,
        true,
        None,
    )
    .unwrap();
    let entropy: Vec<f32> = entropy.unwrap().squeeze(0).unwrap().to_vec1().unwrap();
    for (k, e) in turn.tokens.iter().zip(entropy) {
        assert!((k.entropy - e).abs() < 1e-4, "{} vs {e}", k.entropy);
    }
    let t = s.act(output.clone(), Actor::Model, Some(turn)).unwrap();
    assert_eq!(t.output, output);
}

#[test]
fn resampling_counts_what_n_draws_of_the_turn_would_do() {
    let p = policy(lake_env(), 256, 1.0);
    let s = session(&lake_env(), 0).unwrap();
    let prompt = p.prompt(&s).unwrap();
    // A parser that takes the first character, so that a random model's draws hold actions;
    // "P" and "F" stand for the valid actions.
    let parser = ActionParser::new(r"(?s)^\s*(\S)").unwrap();
    let actions = ["P".to_string(), "F".to_string()];
    let r = p.resample(&prompt, 24, 3, &parser, &actions, None).unwrap();
    assert_eq!(r.draws, 24);
    assert_eq!(r.counts.iter().map(|c| c.count).sum::<usize>(), 24);
    assert!(r.counts.windows(2).all(|w| w[0].count >= w[1].count));
    // Independently: each draw is a request with its own seed, so drawing them one at a time
    // gives the same outputs.
    let mut expected: BTreeMap<Option<String>, usize> = BTreeMap::new();
    for i in 0..24 {
        let (text, _) = p.generate(&prompt, mix_seed(&[3, 0x5a, i]), None).unwrap();
        *expected
            .entry(parser.parse(&text).map(str::to_string))
            .or_default() += 1;
    }
    let got: BTreeMap<Option<String>, usize> = r
        .counts
        .iter()
        .map(|c| (c.action.clone(), c.count))
        .collect();
    assert_eq!(got, expected);
    for c in &r.counts {
        let listed = c.action.as_ref().is_some_and(|a| actions.contains(a));
        assert_eq!(c.unknown, c.action.is_some() && !listed, "{c:?}");
    }
    // Greedy: every draw is the same.
    let greedy = policy(lake_env(), 256, 0.0);
    let r = greedy
        .resample(&prompt, 5, 3, &parser, &actions, None)
        .unwrap();
    assert_eq!(r.counts.len(), 1);
    assert_eq!(r.counts[0].count, 5);
}

#[test]
fn a_cancelled_draw_stops_with_an_error() {
    let p = policy(lake_env(), 256, 1.0);
    let s = session(&lake_env(), 0).unwrap();
    let prompt = p.prompt(&s).unwrap();
    let cancel = AtomicBool::new(true);
    assert_eq!(
        p.generate(&prompt, 1, Some(&cancel)).err().as_deref(),
        Some(CANCELLED)
    );
    cancel.store(false, Ordering::Relaxed);
    assert!(p.generate(&prompt, 1, Some(&cancel)).is_ok());
}
