//! The checkers on vectors computed independently with IFEval's Python (its checkers transcribed
//! and run on NLTK 3.9.1 and langdetect 1.0.9, seed 0), and on IFEval's own test examples.

use serde_json::{Value, json};

use super::*;

fn check(id: &str, kwargs: Value, response: &str, mode: Mode) -> bool {
    let instruction = Instruction::parse(id, &kwargs).unwrap_or_else(|e| panic!("{e}"));
    followed(&instruction, &variants(response, mode))
}

#[test]
fn matches_pythons_verdicts_on_the_vectors() {
    let vectors: Vec<Value> =
        serde_json::from_str(include_str!("../../../tests/fixtures/ifeval_vectors.json"))
            .unwrap_or_default();
    assert_eq!(vectors.len(), 91);
    let mut wrong = vec![];
    for v in &vectors {
        let id = v["instruction_id"].as_str().unwrap_or_default();
        let response = v["response"].as_str().unwrap_or_default();
        for (mode, key) in [(Mode::Strict, "strict"), (Mode::Loose, "loose")] {
            let got = check(id, v["kwargs"].clone(), response, mode);
            if Some(got) != v[key].as_bool() {
                wrong.push(format!(
                    "{id} {key} {response:?}: got {got}, Python {}",
                    v[key]
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn each_family_follows_and_breaks() {
    use Mode::Strict as S;
    let yes_no = "detectable_format:constrained_response";
    assert!(check(yes_no, json!({}), "Hmm. My answer is maybe.", S));
    assert!(
        !check(yes_no, json!({}), "my answer is yes.", S),
        "case-sensitive"
    );
    let kw = "keywords:existence";
    assert!(check(
        kw,
        json!({"keywords": ["river", "Mona Lisa"]}),
        "The mona lisa by the river",
        S
    ));
    assert!(!check(
        kw,
        json!({"keywords": ["river", "Mona Lisa"]}),
        "The river",
        S
    ));
    let freq = "keywords:frequency";
    let at_least = |k: usize| json!({"keyword": "war", "relation": "at least", "frequency": k});
    // "war" occurs twice (once inside "software").
    assert!(check(freq, at_least(2), "The war in software.", S));
    assert!(!check(freq, at_least(3), "The war in software.", S));
    let words = "length_constraints:number_words";
    let fewer = json!({"relation": "less than", "num_words": 8});
    assert!(check(
        words,
        fewer.clone(),
        "d3sCRi7 lArge lAnguagE M0del w1tH 20 w0RdS.",
        S
    ));
    assert!(!check(
        words,
        fewer,
        "one two three four five six seven eight",
        S
    ));
    let lower = "change_case:english_lowercase";
    assert!(check(
        lower,
        json!({}),
        "this is an english sentence written in lowercase.",
        S
    ));
    assert!(!check(lower, json!({}), "This is an english sentence.", S));
    let caps = "change_case:english_capital";
    assert!(check(
        caps,
        json!({}),
        "THIS IS AN ENGLISH SENTENCE. EVERY LETTER IS CAPITALIZED!!! AMAZING.",
        S
    ));
    assert!(!check(caps, json!({}), "Every Word Is Capitalized.", S));
    let lang = "language:response_language";
    assert!(check(
        lang,
        json!({"language": "fr"}),
        "Bonjour tout le monde, comment allez-vous aujourd'hui?",
        S
    ));
    assert!(!check(
        lang,
        json!({"language": "de"}),
        "Bonjour tout le monde, comment allez-vous aujourd'hui?",
        S
    ));
    let repeat = "combination:repeat_prompt";
    let prompt = json!({"prompt_to_repeat": "Write a CL description."});
    assert!(check(
        repeat,
        prompt.clone(),
        "Write a CL description. Hi, Le and TJ.",
        S
    ));
    assert!(!check(
        repeat,
        prompt,
        "Hi, Le and TJ. Write a CL description.",
        S
    ));
    let sentences = "length_constraints:number_sentences";
    let four = json!({"relation": "less than", "num_sentences": 4});
    assert!(!check(
        sentences,
        four.clone(),
        "xx,x. xx,x! xx/x. x{x}x?",
        S
    ));
    assert!(check(sentences, four, "xx,x. xx,x! xx/x?", S));
    // IFEval's own example: three paragraphs, the second starting with "I".
    let nth = "length_constraints:nth_paragraph_first_word";
    let text = "\n  paragraph 1\n\n  I paragraph 2\n\n  paragraph 3";
    let kw =
        |n: usize, word: &str| json!({"num_paragraphs": n, "nth_paragraph": 2, "first_word": word});
    assert!(check(nth, kw(3, "I"), text, S));
    assert!(
        !check(nth, kw(2, "I"), text, S),
        "the paragraph count must match too"
    );
    assert!(!check(nth, kw(3, "fail"), text, S));
    // Loose mode rescues what a first line or asterisks break.
    let json_fmt = "detectable_format:json_format";
    let fenced = "Here is the JSON:\n```json\n{\"a\": 1}\n```";
    assert!(
        !check(json_fmt, json!({}), fenced, S) && check(json_fmt, json!({}), fenced, Mode::Loose)
    );
    // A blank response follows nothing, not even "no commas".
    assert!(!check("punctuation:no_comma", json!({}), "  \n ", S));
}

#[test]
fn the_score_is_all_or_the_fraction_and_names_what_was_missed() {
    let truth = json!({
        "instruction_id_list": ["punctuation:no_comma", "startend:quotation", "length_constraints:number_words"],
        "kwargs": [{}, {}, {"relation": "at least", "num_words": 3, "extra": null}]
    })
    .to_string();
    let all = Params::default();
    let fraction = Params {
        scoring: Scoring::Fraction,
        ..Params::default()
    };
    let good = "\"three little words\"";
    assert_eq!(score(good, &truth, &all).score, 1.0);
    // A comma and no quotes: 1 of 3 followed.
    let bad = "yes, two";
    let out = score(bad, &truth, &all);
    assert_eq!((out.score, out.correct), (0.0, false));
    assert_eq!(
        out.extracted.as_deref(),
        Some(
            "not followed: punctuation:no_comma, startend:quotation, length_constraints:number_words"
        )
    );
    let out = score("yes two three", &truth, &fraction);
    assert!((out.score - 2.0 / 3.0).abs() < 1e-6, "{}", out.score);
}

#[test]
fn bad_ground_truths_name_the_problem() {
    let p = Params::default();
    for (truth, needle) in [
        ("not json", "not JSON"),
        ("{}", "needs \"instruction_id_list\""),
        (
            r#"{"instruction_id_list": ["punctuation:no_coma"], "kwargs": [{}]}"#,
            "did you mean 'punctuation:no_comma'",
        ),
        (
            r#"{"instruction_id_list": ["keywords:frequency"], "kwargs": [{"keyword": "a", "relation": "more", "frequency": 1}]}"#,
            "\"less than\" or \"at least\"",
        ),
        (
            r#"{"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"relation": "at least"}]}"#,
            "needs 'num_words'",
        ),
        (
            r#"{"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]}"#,
            "2 entries for 1",
        ),
    ] {
        let out = score("response", truth, &p);
        let error = out.error.unwrap_or_default();
        assert!(error.contains(needle), "{truth}: {error}");
        assert_eq!(out.score, 0.0);
    }
}
