//! Tests of [`super`]: the held-out split and the metrics of a domain's samples.

use super::*;

fn example(i: usize) -> Example {
    Example {
        prompt: format!("p{i}"),
        ground_truth: format!("{i}"),
        domain: "d".into(),
        response: None,
        metadata: None,
    }
}

#[test]
fn the_split_holds_out_a_fraction_by_seed_and_keeps_order() {
    let all: Vec<Example> = (0..20).map(example).collect();
    let (train, val) = split_held_out(all.clone(), 0.25, 7).unwrap();
    assert_eq!((train.len(), val.len()), (15, 5));
    // Disjoint, together everything, each in the original order.
    let index = |e: &Example| e.prompt[1..].parse::<usize>().unwrap();
    let mut both: Vec<usize> = train.iter().chain(&val).map(index).collect();
    assert!(train.windows(2).all(|w| index(&w[0]) < index(&w[1])));
    assert!(val.windows(2).all(|w| index(&w[0]) < index(&w[1])));
    both.sort_unstable();
    assert_eq!(both, (0..20).collect::<Vec<_>>());
    // The same seed holds out the same examples; another seed others.
    assert_eq!(split_held_out(all.clone(), 0.25, 7).unwrap().1, val);
    assert_ne!(split_held_out(all.clone(), 0.25, 8).unwrap().1, val);
    // At least one is held out, and at least one is left to train on.
    assert_eq!(split_held_out(all.clone(), 0.001, 7).unwrap().1.len(), 1);
    let err = split_held_out(all[..1].to_vec(), 0.5, 7).unwrap_err();
    assert_eq!(
        err,
        "val_split 0.5 of 1 distinct prompts leaves none to train on"
    );
}

#[test]
fn a_repeated_prompt_is_held_out_whole() {
    // 10 distinct prompts, each asked twice: every copy of a held-out prompt is held out.
    let all: Vec<Example> = (0..20).map(|i| example(i % 10)).collect();
    let (train, val) = split_held_out(all, 0.2, 3).unwrap();
    assert_eq!((train.len(), val.len()), (16, 4));
    assert!(
        train
            .iter()
            .all(|t| val.iter().all(|v| v.prompt != t.prompt))
    );
    // A test file that repeats training prompts takes them out of training.
    let kept = without_held_out((0..5).map(example).collect(), &[example(1), example(3)]);
    let prompts: Vec<&str> = kept.iter().map(|e| e.prompt.as_str()).collect();
    assert_eq!(prompts, ["p0", "p2", "p4"]);
}

fn sample(prompt: usize, score: f32, tokens: usize) -> ValSample {
    ValSample {
        prompt,
        outcome: RewardOutcome {
            score,
            correct: score == 1.0,
            ..RewardOutcome::unformatted()
        },
        tokens,
    }
}

#[test]
fn metrics_of_k_samples_per_prompt_by_hand() {
    // Three prompts, two samples each: prompt 0 right twice, prompt 1 once, prompt 2 never (one
    // sample with a partial score 0.5). mean@2 = (1+1+1+0+0.5+0)/6 = 3.5/6; accuracy = 3/6;
    // pass@2 = 2 of 3 prompts; length = (2+4+6+8+10+12)/6 = 7.
    let samples = [
        sample(0, 1.0, 2),
        sample(0, 1.0, 4),
        sample(1, 1.0, 6),
        sample(1, 0.0, 8),
        sample(2, 0.5, 10),
        sample(2, 0.0, 12),
    ];
    let m = val_metrics("add", 2, &samples);
    assert!((m["val/add/mean@2"] - 3.5 / 6.0).abs() < 1e-12);
    assert_eq!(m["val/add/accuracy"], 0.5);
    assert!((m["val/add/pass@2"] - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(m["val/add/response_length"], 7.0);
    assert_eq!(m["val/add/prompts"], 3.0);
    assert_eq!(m.len(), 5);
    assert!(val_metrics("add", 2, &[]).is_empty());
}

#[test]
fn reward_errors_are_counted_once_per_domain_and_kind() {
    // A judge's errors quote its output: three answers, two kinds once the quotes are set
    // aside, counted per kind (two of the first), in two domains.
    let example = example(0);
    let scored = |domain: &'static str, error: &str| ScoredSample {
        domain,
        example: &example,
        prompt: 0,
        completion: Completion {
            id: 0,
            prompt_ids: vec![1],
            token_ids: vec![2],
            logprobs: vec![0.0],
            finish: crate::rollout::FinishReason::Eos,
        },
        response: String::new(),
        outcome: RewardOutcome {
            error: Some(error.to_string()),
            ..RewardOutcome::unformatted()
        },
    };
    let all = Scored {
        k: 1,
        samples: vec![
            scored("a", "llm_judge: no verdict in \"maybe\""),
            scored("a", "llm_judge: no verdict in \"perhaps\""),
            scored("a", "regex_match: 'x(' is not a regular expression"),
            scored("b", "llm_judge: no verdict in \"no\""),
        ],
    };
    let errors = all.reward_errors();
    let counts: Vec<(&str, usize)> = errors.iter().map(|(d, _, n)| (d.as_str(), *n)).collect();
    assert_eq!(counts, [("a", 2), ("a", 1), ("b", 1)]);
    // The first of its kind is the one shown.
    assert_eq!(errors[0].1, "llm_judge: no verdict in \"maybe\"");
}
