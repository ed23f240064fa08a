//! Instruction-following reward (`ifeval`): Google's IFEval verifiable instructions.
//!
//! The ground truth is an IFEval dataset line's instructions, as JSON:
//! `{"instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
//!   "kwargs": [{}, {"relation": "at least", "num_words": 300}]}` (a whole dataset line, with `key`
//! and `prompt`, is fine too; `null` kwargs are absent, as in the Hugging Face copy).
//!
//! Each instruction is checked as IFEval checks it ([`checks`]). `strict` mode checks the response
//! as written; `loose` also tries it without its first line, its last line, both, and each of those
//! without `*`, and an instruction is followed if any variant follows it. A blank response follows
//! nothing. The score is 1 when every instruction is followed (`scoring: all`, the default) or the
//! fraction followed; the breakdown of a weighted reward keeps it, and `extracted` lists the
//! instructions not followed.
//!
//! Differences from IFEval's Python, all deliberate and tested: sentences are counted by
//! [`text::count_sentences`] (Punkt's English abbreviations without its trained orthographic
//! statistics), capital words by [`text::word_tokens`] (NLTK's Treebank rules for clitics and
//! punctuation, simplified), keywords and splitters are literals (IFEval passes them to `re`
//! unescaped; the dataset's are plain words), and `keywords:letter_frequency` counts the character
//! it is given (`#`, `!`: IFEval's 2025 rule; its 2024 code drew a random letter instead).

pub mod checks;
pub mod text;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{RewardOutcome, Scoring};
use checks::Instruction;

/// Which responses an instruction is checked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The response as written.
    #[default]
    Strict,
    /// Also without its first/last line and without `*` (IFEval's loose accuracy).
    Loose,
}

/// The reward's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Params {
    pub mode: Mode,
    pub scoring: Scoring,
}

/// The instructions of a ground truth, in order, with their ids.
pub fn parse_truth(ground_truth: &str) -> Result<Vec<(String, Instruction)>, String> {
    let value: Value = serde_json::from_str(ground_truth)
        .map_err(|e| format!("ifeval: the ground truth is not JSON: {e}"))?;
    let ids = value
        .get("instruction_id_list")
        .and_then(Value::as_array)
        .ok_or("ifeval: the ground truth needs \"instruction_id_list\" (a list of ids)")?;
    let kwargs = match value.get("kwargs") {
        Some(Value::Array(k)) if k.len() == ids.len() => k.clone(),
        Some(Value::Array(k)) => {
            return Err(format!(
                "ifeval: \"kwargs\" has {} entries for {} instructions",
                k.len(),
                ids.len()
            ));
        }
        None | Some(Value::Null) => vec![Value::Null; ids.len()],
        Some(other) => return Err(format!("ifeval: \"kwargs\" must be a list, got {other}")),
    };
    if ids.is_empty() {
        return Err("ifeval: \"instruction_id_list\" is empty".into());
    }
    ids.iter()
        .zip(&kwargs)
        .map(|(id, kw)| {
            let id = id
                .as_str()
                .ok_or_else(|| format!("ifeval: instruction ids are strings, got {id}"))?;
            Instruction::parse(id, kw)
                .map(|i| (id.to_string(), i))
                .map_err(|e| format!("ifeval: {e}"))
        })
        .collect()
}

/// The variants of a response an instruction is checked on (IFEval's strict and loose).
pub fn variants(response: &str, mode: Mode) -> Vec<String> {
    if mode == Mode::Strict {
        return vec![response.to_string()];
    }
    let lines: Vec<&str> = response.split('\n').collect();
    let join = |part: &[&str]| text::py_strip(&part.join("\n")).to_string();
    let n = lines.len();
    let first = join(&lines[1.min(n)..]);
    let last = join(&lines[..n.saturating_sub(1)]);
    let both = if n >= 2 {
        join(&lines[1..n - 1])
    } else {
        String::new()
    };
    let mut out = vec![
        response.to_string(),
        response.replace('*', ""),
        first.clone(),
        last.clone(),
        both.clone(),
    ];
    out.extend([first, last, both].iter().map(|v| v.replace('*', "")));
    out
}

/// Whether `instruction` is followed by some non-blank variant.
pub fn followed(instruction: &Instruction, variants: &[String]) -> bool {
    variants
        .iter()
        .any(|v| !text::py_strip(v).is_empty() && instruction.follows(v))
}

/// Scores one response.
pub fn score(response: &str, ground_truth: &str, params: &Params) -> RewardOutcome {
    let instructions = match parse_truth(ground_truth) {
        Ok(i) => i,
        Err(e) => {
            return RewardOutcome {
                error: Some(e),
                ..RewardOutcome::graded(String::new(), false)
            };
        }
    };
    let variants = variants(response, params.mode);
    let missed: Vec<&str> = instructions
        .iter()
        .filter(|(_, i)| !followed(i, &variants))
        .map(|(id, _)| id.as_str())
        .collect();
    let total = instructions.len();
    let correct = missed.is_empty();
    let extracted = if correct {
        format!("all {total} followed")
    } else {
        format!("not followed: {}", missed.join(", "))
    };
    RewardOutcome {
        score: match params.scoring {
            Scoring::All => f32::from(u8::from(correct)),
            Scoring::Fraction => (total - missed.len()) as f32 / total as f32,
        },
        format_ok: !text::py_strip(response).is_empty(),
        ..RewardOutcome::graded(extracted, correct)
    }
}

#[cfg(test)]
mod tests;
