//! The math verifier on its labelled evaluation set (tests/fixtures/math_answers.jsonl, written by
//! tests/fixtures/math_answers.py): pairs in the styles of GSM8K, MATH, AIME and DeepScaleR, each
//! with the label it is held to and Hugging Face Math-Verify's verdict. Prints agreement per
//! category (`cargo test --test math_verify_eval -- --nocapture`) and holds the verifier to at least
//! 97% agreement with Math-Verify where Math-Verify is right, and 97% with the labels overall.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::collections::BTreeMap;

use roll::reward::math_rule;
use roll::reward::math_verify::{Options, score};
use serde_json::Value;

#[derive(Default)]
struct Tally {
    pairs: usize,
    ours_right: usize,
    mv_right: usize,
    /// Pairs where Math-Verify is right, and how many of them we agree on.
    mv_right_and_we_agree: usize,
    /// The older numeric rule (`math_rule`) on the same pairs, for comparison.
    rule_right: usize,
}

#[test]
fn agrees_with_math_verify_where_it_is_right_and_with_the_labels() {
    let text = include_str!("fixtures/math_answers.jsonl");
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    let mut misses = vec![];
    for (n, line) in text.lines().enumerate() {
        let pair: Value = serde_json::from_str(line).unwrap();
        let (truth, response) = (
            pair["truth"].as_str().unwrap(),
            pair["response"].as_str().unwrap(),
        );
        let label = pair["label"].as_bool().unwrap();
        let mv = pair["mv"].as_bool().unwrap();
        let ours = score(response, truth, Options::default()).correct;
        let t = tallies
            .entry(pair["category"].as_str().unwrap().to_string())
            .or_default();
        t.pairs += 1;
        t.ours_right += usize::from(ours == label);
        t.mv_right += usize::from(mv == label);
        t.rule_right += usize::from(math_rule::score(response, truth).correct == label);
        if mv == label {
            t.mv_right_and_we_agree += usize::from(ours == mv);
        }
        if ours != label {
            misses.push(format!(
                "line {}: truth {truth:?}, response …{:?}: ours {ours}, label {label}, Math-Verify {mv}",
                n + 1,
                &response[response.len().saturating_sub(60)..]
            ));
        }
    }
    println!(
        "category         pairs  ours right  Math-Verify right  agree where MV right  math_rule right"
    );
    let mut total = Tally::default();
    for (name, t) in &tallies {
        println!(
            "{name:<16} {:>5}  {:>10}  {:>17}  {:>20}  {:>15}",
            t.pairs,
            t.ours_right,
            t.mv_right,
            format!("{}/{}", t.mv_right_and_we_agree, t.mv_right),
            t.rule_right
        );
        total.rule_right += t.rule_right;
        total.pairs += t.pairs;
        total.ours_right += t.ours_right;
        total.mv_right += t.mv_right;
        total.mv_right_and_we_agree += t.mv_right_and_we_agree;
    }
    println!(
        "all              {:>5}  {:>10}  {:>17}  {:>20}  {:>15}",
        total.pairs,
        total.ours_right,
        total.mv_right,
        format!("{}/{}", total.mv_right_and_we_agree, total.mv_right),
        total.rule_right
    );
    for m in &misses {
        println!("wrong: {m}");
    }
    assert!(total.pairs >= 300, "the set has {} pairs", total.pairs);
    let agree = total.mv_right_and_we_agree as f64 / total.mv_right as f64;
    let right = total.ours_right as f64 / total.pairs as f64;
    assert!(
        agree >= 0.97,
        "agreement with Math-Verify where it is right: {agree:.3}"
    );
    assert!(right >= 0.97, "agreement with the labels: {right:.3}");
}
