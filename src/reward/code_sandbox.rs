//! Code reward (`code_sandbox`): run the response's program on the ground truth's tests, sandboxed.
//!
//! The program is the response's LAST fenced code block (```` ```python ````, ```` ```py ```` or a
//! bare ```` ``` ````); a response without one is unformatted. The ground truth is JSON:
//! - `{"tests": [{"stdin": "1 2\n", "stdout": "3\n"}, …]}`: the program runs once per test with
//!   its stdin, and passes when its stdout equals the expected one with trailing whitespace of each
//!   line and trailing blank lines ignored, and it exits 0;
//! - `{"asserts": ["assert f(1) == 2", …]}`: the asserts are appended to the program; it passes
//!   when the run exits 0.
//!
//! Scoring is all-or-nothing (1 when every test passes) or the fraction passed. Every run happens
//! in [`crate::sandbox`] with its limits; no sandbox means no run: the outcome carries the error
//! and scores 0. This is the one reward that does IO (it starts processes), and it stays total:
//! hostile programs, bad ground truths and missing sandboxes are outcomes, never panics.

use serde::{Deserialize, Serialize};

use super::RewardOutcome;
use crate::sandbox::{Limits, Outcome, Sandbox};

pub use super::Scoring;

/// The reward's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    pub scoring: Scoring,
    /// Wall-clock seconds per run.
    pub timeout_s: f64,
    /// Address space per run, MiB.
    pub memory_mb: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            scoring: Scoring::All,
            timeout_s: 5.0,
            memory_mb: 512,
        }
    }
}

impl Params {
    fn limits(&self) -> Limits {
        let wall = std::time::Duration::from_secs_f64(self.timeout_s);
        Limits {
            wall,
            // CPU time a little above the wall time: the wall deadline decides, the CPU limit
            // stops a spinning child the deadline would miss.
            cpu_seconds: self.timeout_s.ceil() as u64 + 1,
            memory_bytes: self.memory_mb << 20,
            ..Limits::default()
        }
    }
}

/// A ground truth's tests.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Truth {
    #[serde(default)]
    tests: Vec<IoTest>,
    #[serde(default)]
    asserts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct IoTest {
    #[serde(default)]
    stdin: String,
    stdout: String,
}

/// Scores one response.
pub fn score(response: &str, ground_truth: &str, params: &Params) -> RewardOutcome {
    let Some(program) = last_code_block(response) else {
        return RewardOutcome::unformatted();
    };
    let failed = |error: String| RewardOutcome {
        error: Some(error),
        ..RewardOutcome::graded(program.to_string(), false)
    };
    let truth: Truth = match serde_json::from_str(ground_truth) {
        Ok(t) => t,
        Err(e) => {
            return failed(format!(
                "code_sandbox: the ground truth is not tests JSON: {e}"
            ));
        }
    };
    if truth.tests.is_empty() == truth.asserts.is_empty() {
        return failed(
            "code_sandbox: the ground truth needs either \"tests\" or \"asserts\"".into(),
        );
    }
    let sandbox = match Sandbox::shared() {
        Ok(s) => s,
        Err(e) => return failed(e.to_string()),
    };
    let limits = params.limits();
    let runs: Vec<(String, Vec<u8>, Option<&str>)> = if truth.asserts.is_empty() {
        let p = program.to_string();
        truth
            .tests
            .iter()
            .map(|t| {
                (
                    p.clone(),
                    t.stdin.clone().into_bytes(),
                    Some(t.stdout.as_str()),
                )
            })
            .collect()
    } else if params.scoring == Scoring::All {
        vec![(
            format!("{program}\n\n{}\n", truth.asserts.join("\n")),
            vec![],
            None,
        )]
    } else {
        truth
            .asserts
            .iter()
            .map(|a| (format!("{program}\n\n{a}\n"), vec![], None))
            .collect()
    };
    let total = if truth.asserts.is_empty() {
        truth.tests.len()
    } else {
        truth.asserts.len()
    };
    let mut passed = 0usize;
    for (source, stdin, expected) in &runs {
        let run = match sandbox.run_python(source, stdin, &limits) {
            Ok(run) => run,
            Err(e) => return failed(e.to_string()),
        };
        let ok = run.outcome == Outcome::Exited(0)
            && expected.is_none_or(|want| same_output(&String::from_utf8_lossy(&run.stdout), want));
        if ok {
            // A joined assert run passes every assert at once.
            passed += if expected.is_none() && runs.len() == 1 {
                total
            } else {
                1
            };
        } else if params.scoring == Scoring::All {
            break;
        }
    }
    let correct = passed == total;
    RewardOutcome {
        score: match params.scoring {
            Scoring::All => f32::from(u8::from(correct)),
            Scoring::Fraction => passed as f32 / total as f32,
        },
        ..RewardOutcome::graded(program.to_string(), correct)
    }
}

/// Seconds scoring one response may take at worst: every run to its deadline.
pub fn worst_case_seconds(ground_truth: &str, params: &Params) -> f64 {
    let runs = serde_json::from_str::<Truth>(ground_truth)
        .map_or(1, |t| t.tests.len().max(t.asserts.len()).max(1));
    // Each run also starts a sandbox (~50 ms; a second is generous).
    runs as f64 * (params.timeout_s + 1.0)
}

/// Stdout compared line by line without trailing whitespace, trailing blank lines ignored.
fn same_output(got: &str, want: &str) -> bool {
    let lines = |s: &str| -> Vec<String> {
        let mut v: Vec<String> = s.lines().map(|l| l.trim_end().to_string()).collect();
        while v.last().is_some_and(String::is_empty) {
            v.pop();
        }
        v
    };
    lines(got) == lines(want)
}

/// The content of the last fenced code block (python, py, or no language).
fn last_code_block(response: &str) -> Option<&str> {
    let mut found = None;
    let mut rest = response;
    let mut offset = 0;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let Some(line_end) = after.find('\n') else {
            break;
        };
        let lang = after[..line_end].trim().to_ascii_lowercase();
        let body = &after[line_end + 1..];
        let Some(close) = body.find("```") else {
            break;
        };
        if matches!(lang.as_str(), "" | "python" | "py" | "python3") {
            found = Some(&body[..close]);
        }
        let consumed = open + 3 + line_end + 1 + close + 3;
        offset += consumed;
        rest = &response[offset..];
    }
    found.filter(|code| !code.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_python_block_is_the_program() {
        let r = "try:\n```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```\n```text\nout\n```";
        assert_eq!(last_code_block(r), Some("print(2)\n"));
        assert_eq!(last_code_block("```\nx = 1\n```"), Some("x = 1\n"));
        assert_eq!(last_code_block("```python\nprint(1)"), None, "unclosed");
        assert_eq!(last_code_block("no code"), None);
        assert_eq!(last_code_block("```python\n\n```"), None);
    }

    #[test]
    fn outputs_compare_without_trailing_whitespace() {
        assert!(same_output("3  \n\n", "3\n"));
        assert!(same_output("a\nb", "a \nb\n\n"));
        assert!(!same_output("3\n4\n", "3\n"));
        assert!(!same_output(" 3\n", "3\n"));
    }

    #[test]
    fn bad_ground_truths_are_outcomes_with_errors() {
        let r = "```python\nprint(1)\n```";
        let out = score(r, "not json", &Params::default());
        assert!(out.error.unwrap_or_default().contains("not tests JSON"));
        let out = score(r, r#"{"tests": [], "asserts": []}"#, &Params::default());
        assert!(out.error.unwrap_or_default().contains("either"));
        assert!(!score("no code", "{}", &Params::default()).format_ok);
    }
}
