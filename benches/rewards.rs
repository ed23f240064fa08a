//! Rule rewards on long responses: verdicts per second of `math_verify` and `math_rule`; and the
//! code sandbox: programs per second and latency percentiles, one at a time and on every core.
//!
//!     cargo bench --bench rewards            # both
//!     cargo bench --bench rewards -- math    # or one: math, code
//!
//! Responses are chain-of-thought of about 4,000 characters (40 numbered steps with LaTeX) that
//! end in a boxed answer of one of the shapes the verifier compares (numbers, fractions, roots,
//! expressions, intervals, sets), half of them right; plus pathological inputs (deep nesting,
//! 100,000 open braces) to show that their cost stays bounded.

use std::time::Instant;

use rayon::prelude::*;
use roll::reward::code_sandbox::{self, Params};
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
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if filter.as_deref().is_none_or(|f| f == "math") {
        math();
    }
    if filter.as_deref().is_none_or(|f| f == "code") {
        code();
    }
}

/// Programs through the sandbox: a small honest solution on two stdin tests (two sandboxed runs
/// per verdict).
fn code() {
    let response = "```python\nimport sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums))\n```";
    let truth =
        r#"{"tests": [{"stdin": "1 2 3", "stdout": "6"}, {"stdin": "10 20", "stdout": "30"}]}"#;
    let params = Params::default();
    let verdict = || {
        let start = Instant::now();
        let out = code_sandbox::score(response, truth, &params);
        assert!(out.correct, "{out:?}");
        start.elapsed().as_secs_f64()
    };
    verdict(); // the sandbox's detection, once
    let report = |name: &str, mut latencies: Vec<f64>, wall: f64| {
        latencies.sort_by(f64::total_cmp);
        let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] * 1e3;
        println!(
            "code_sandbox, {name}: {} verdicts ({} programs) in {wall:.2} s: {:.1} programs/s, verdict latency p50 {:.1} ms, p99 {:.1} ms",
            latencies.len(),
            2 * latencies.len(),
            2.0 * latencies.len() as f64 / wall,
            pct(0.5),
            pct(0.99)
        );
    };
    let n = 100;
    let start = Instant::now();
    let one: Vec<f64> = (0..n).map(|_| verdict()).collect();
    report("one at a time", one, start.elapsed().as_secs_f64());
    let start = Instant::now();
    let all: Vec<f64> = (0..n).into_par_iter().map(|_| verdict()).collect();
    report(
        &format!("{} at once (rayon)", rayon::current_num_threads()),
        all,
        start.elapsed().as_secs_f64(),
    );
}

fn math() {
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
