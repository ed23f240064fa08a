//! Rule rewards on long responses: verdicts per second of `math_verify` and `math_rule`.
//!
//!     cargo bench --bench rewards
//!
//! Responses are chain-of-thought of about 4,000 characters (40 numbered steps with LaTeX) that
//! end in a boxed answer of one of the shapes the verifier compares (numbers, fractions, roots,
//! expressions, intervals, sets), half of them right; plus pathological inputs (deep nesting,
//! 100,000 open braces) to show that their cost stays bounded.

use std::time::Instant;

use roll::reward::math_rule;
use roll::reward::math_verify::{Options, score};

const ANSWERS: [(&str, &str, &str); 8] = [
    ("1,000", "1000", "1001"),
    ("\\frac{3}{4}", "0.75", "0.7"),
    ("2\\sqrt{3}", "\\sqrt{12}", "\\sqrt{13}"),
    ("(x+1)^2", "x^2+2x+1", "x^2+2x"),
    ("[0, 1)", "[0,1)", "[0,1]"),
    ("\\{1, 2, 3\\}", "\\{3,2,1\\}", "\\{1,2\\}"),
    ("50\\%", "0.5", "0.05"),
    ("x = 5", "5", "6"),
];

fn long_response(step: usize, answer: &str) -> String {
    let mut text = String::new();
    for k in 1..=40 {
        text.push_str(&format!(
            "Step {k}: from $a_{k} = \\frac{{{k}}}{{{}}}$ we get $a_{k} + {step} = {}$, so the sum grows.\n",
            k + 1,
            k + step
        ));
    }
    text.push_str(&format!("Therefore the answer is $\\boxed{{{answer}}}$."));
    text
}

fn time<F: FnMut() -> bool>(name: &str, chars: usize, n: usize, mut f: F) {
    let start = Instant::now();
    let mut right = 0usize;
    for _ in 0..n {
        right += usize::from(f());
    }
    let s = start.elapsed().as_secs_f64();
    println!(
        "{name}: {n} verdicts of {chars}-character responses in {s:.3} s: {:.0} verdicts/s ({right} correct)",
        n as f64 / s
    );
}

fn main() {
    let pairs: Vec<(String, &str)> = (0..64)
        .map(|i| {
            let (truth, right, wrong) = ANSWERS[i % ANSWERS.len()];
            let answer = if i % 2 == 0 { right } else { wrong };
            (long_response(i, answer), truth)
        })
        .collect();
    let chars = pairs[0].0.len();
    let n = 20_000;
    let mut i = 0;
    time("math_verify", chars, n, || {
        i += 1;
        let (r, t) = &pairs[i % pairs.len()];
        score(r, t, Options::default()).correct
    });
    let mut i = 0;
    time("math_rule", chars, n, || {
        i += 1;
        let (r, t) = &pairs[i % pairs.len()];
        math_rule::score(r, t).correct
    });
    let nested = format!("\\boxed{{{}1{}}}", "(".repeat(5_000), ")".repeat(5_000));
    time(
        "math_verify, 5,000 nested brackets",
        nested.len(),
        200,
        || score(&nested, "1", Options::default()).correct,
    );
    let braces = format!("\\boxed{{{}", "{".repeat(100_000));
    time(
        "math_verify, 100,000 open braces",
        braces.len(),
        200,
        || score(&braces, "1", Options::default()).correct,
    );
}
