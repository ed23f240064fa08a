use super::*;
use crate::model::LoadedModel;
use crate::model::hf_dir::tiny_test_model;

fn model() -> LoadedModel {
    tiny_test_model("0123456789", 16, 1)
}

fn request(id: u64, prompt_ids: &[u32], max_new_tokens: usize) -> Request {
    Request {
        id,
        prompt_ids: prompt_ids.to_vec(),
        params: SamplingParams {
            temperature: 1.0,
            max_new_tokens,
            ..Default::default()
        },
        seed: 100 + id,
    }
}

#[test]
fn a_few_requests_in_a_big_batch_spread_over_the_lanes() {
    let m = model();
    let mut engine = Engine::with_lanes(&m.transformer, vec![], 64, 3);
    for i in 0..7u64 {
        engine.submit(request(i, &[3, 4], 4));
    }
    engine.step().expect("step");
    // 7 over 3 lanes of 21-22 slots each: 3, 2, 2 (not all 7 in the first lane).
    let loads: Vec<usize> = engine.lanes.iter().map(|l| l.running.len()).collect();
    assert_eq!(loads, [3, 2, 2]);
    assert_eq!(engine.running(), 7);
}

/// Requests that share a prompt are prefilled once, and each still completes as it would alone:
/// the same tokens (each request samples from its own seed) and the same log-probs.
#[test]
fn a_shared_prompt_is_prefilled_once_and_every_request_completes_as_alone() {
    let m = model();
    let (a, b): (&[u32], &[u32]) = (&[3, 4, 5, 6], &[7, 8]);
    let reqs: Vec<Request> = [(a, 6), (b, 6), (a, 6), (a, 3), (b, 6), (a, 6)]
        .iter()
        .enumerate()
        .map(|(i, &(prompt, n))| request(i as u64, prompt, n))
        .collect();
    let mut engine = Engine::with_lanes(&m.transformer, vec![], 64, 1);
    for r in &reqs {
        engine.submit(r.clone());
    }
    let mut together = engine.run_to_completion().expect("batch");
    together.sort_by_key(|c| c.id);
    // Two distinct prompts, padded to the longest (4): 8 positions, not 6 x 4.
    assert_eq!(engine.lanes[0].prefilled, 8);
    for (r, got) in reqs.iter().zip(&together) {
        let mut solo = Engine::with_lanes(&m.transformer, vec![], 1, 1);
        solo.submit(r.clone());
        let want = solo.run_to_completion().expect("alone").remove(0);
        assert_eq!(got.id, r.id);
        assert_eq!(got.prompt_ids, r.prompt_ids);
        assert_eq!(got.token_ids, want.token_ids, "request {}", r.id);
        assert_eq!(got.token_ids.len(), r.params.max_new_tokens);
        for (x, y) in got.logprobs.iter().zip(&want.logprobs) {
            assert!((x - y).abs() < 1e-5, "request {}: {x} vs {y}", r.id);
        }
    }
    // Requests of one prompt drew different samples (their seeds differ): not one row copied.
    assert_ne!(together[0].token_ids, together[2].token_ids);
}
