use super::*;
use crate::model::LoadedModel;
use crate::model::hf_dir::tiny_test_model;
use crate::rollout::lane::{PARALLEL_SAMPLING_VOCAB, Running, sample_next};
use crate::rollout::sampling::sample;
use rand::{SeedableRng, rngs::StdRng};

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

/// An engine that keeps prefixes: a request that continues a finished one of the same id (its
/// prompt, its completion, then more) starts from that sequence's cache and prefills only what
/// follows, and completes as a fresh engine completes it alone (the same tokens; log-probs to
/// 1e-5). A request whose prompt does not continue its id's sequence, and a new id, are
/// prefilled whole.
#[test]
fn a_continued_request_prefills_only_what_follows_and_completes_as_fresh() {
    let m = tiny_test_model("0123456789", 64, 1);
    let mut engine = Engine::with_lanes(&m.transformer, vec![], 8, 1).with_prefix_reuse();
    let first = [
        request(0, &[3, 4, 5, 6], 4),
        request(1, &[7, 8], 3),
        request(2, &[9, 3, 4], 2),
    ];
    for r in &first {
        engine.submit(r.clone());
    }
    let mut done = engine.run_to_completion().expect("first turn");
    done.sort_by_key(|c| c.id);
    let continued = |c: &Completion, more: &[u32]| -> Vec<u32> {
        [&c.prompt_ids[..], &c.token_ids[..], more].concat()
    };
    let second = [
        // Saved: 4 + 4 - 1 = 7 tokens of 10; 3 to feed.
        request(0, &continued(&done[0], &[5, 5]), 3),
        // Saved: 2 + 3 - 1 = 4 of 6; 2 to feed.
        request(1, &continued(&done[1], &[3]), 3),
        // Its id's sequence is not its prompt's beginning: 3 to feed.
        request(2, &[4, 4, 4], 3),
        request(7, &[6, 7], 3),
    ];
    let before = engine.lanes[0].prefilled;
    for r in &second {
        engine.submit(r.clone());
    }
    let mut got = engine.run_to_completion().expect("second turn");
    got.sort_by_key(|c| c.id);
    // Four rows of the longest part to feed (3), where whole prompts would be four of 10.
    assert_eq!(engine.lanes[0].prefilled - before, 12);
    for (r, got) in second.iter().zip(&got) {
        let mut fresh = Engine::with_lanes(&m.transformer, vec![], 1, 1);
        fresh.submit(r.clone());
        let want = fresh.run_to_completion().expect("alone").remove(0);
        assert_eq!(got.id, r.id);
        assert_eq!(got.token_ids, want.token_ids, "request {}", r.id);
        for (x, y) in got.logprobs.iter().zip(&want.logprobs) {
            assert!((x - y).abs() < 1e-5, "request {}: {x} vs {y}", r.id);
        }
    }
    // New weights make the kept caches stale: once forgotten, a continuation is prefilled whole.
    engine.forget_prefixes();
    let third = request(0, &continued(&got[0], &[4]), 2);
    let before = engine.lanes[0].prefilled;
    engine.submit(third.clone());
    engine.run_to_completion().expect("third turn");
    assert_eq!(engine.lanes[0].prefilled - before, third.prompt_ids.len());
}

#[test]
fn rows_of_a_large_vocabulary_draw_in_parallel_what_each_draws_alone() {
    // 8 rows of a vocabulary above PARALLEL_SAMPLING_VOCAB (so drawn on the pool): each
    // sequence's token and log-prob are those its own seeded RNG draws from its row alone, and
    // a second draw continues that RNG.
    let vocab = PARALLEL_SAMPLING_VOCAB + 3;
    let rows: Vec<Vec<f32>> = (0..8u32)
        .map(|r| {
            (0..vocab as u32)
                .map(|v| ((v * 7919 + r * 104_729) % 1000) as f32 / 100.0)
                .collect()
        })
        .collect();
    let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
    let mut seqs: Vec<Running> = (0..8)
        .map(|id| {
            let req = request(id, &[1, 2], 4);
            Running {
                rng: StdRng::seed_from_u64(req.seed),
                req,
                tokens: vec![],
                logprobs: vec![],
            }
        })
        .collect();
    sample_next(&mut seqs, &rows);
    sample_next(&mut seqs, &rows);
    for (seq, row) in seqs.iter().zip(&rows) {
        let mut rng = StdRng::seed_from_u64(seq.req.seed);
        let first = sample(row, &seq.req.params, &mut rng);
        let second = sample(row, &seq.req.params, &mut rng);
        assert_eq!(
            seq.tokens,
            vec![first.0, second.0],
            "request {}",
            seq.req.id
        );
        assert_eq!(
            seq.logprobs,
            vec![first.1, second.1],
            "request {}",
            seq.req.id
        );
    }
    // The rows are not all alike: the draws differ between them.
    let firsts: std::collections::HashSet<u32> = seqs.iter().map(|s| s.tokens[0]).collect();
    assert!(firsts.len() > 1, "{firsts:?}");
}

/// `generate` hands completions back in the requests' order, not the order they finish in. With
/// no EOS ids every request runs to its limit, so request 3 (5 tokens) finishes before request 9
/// (6 tokens); the two slots make 7 and 1 wait in the queue. Unsorted, they come back as 3, 9, 7, 1.
#[test]
fn generate_returns_completions_in_the_requests_order() {
    let m = model();
    let reqs: Vec<Request> = [(9, 6), (3, 5), (7, 1), (1, 2)]
        .into_iter()
        .map(|(id, n)| request(id, &[3, 4], n))
        .collect();
    let done = generate(&m.transformer, &[], reqs, 2, None).expect("generate");
    let ids: Vec<u64> = done.iter().map(|c| c.id).collect();
    assert_eq!(ids, [9, 3, 7, 1]);
    let lengths: Vec<usize> = done.iter().map(|c| c.token_ids.len()).collect();
    assert_eq!(lengths, [6, 5, 1, 2]);
}
