//! Preference pairs in JSONL, in TRL's two preference formats, one pair per line:
//!
//! - standard: `{"prompt": "…", "chosen": "…", "rejected": "…"}` — text; the prompt is tokenized
//!   as SFT's prompts are (through the chat template when `data.chat_template` is set);
//! - conversational: `{"prompt": [{"role": "user", "content": "…"}, …], "chosen": [{"role":
//!   "assistant", "content": "…"}], "rejected": [ … ]}` — the prompt's messages are rendered
//!   through the tokenizer's chat template with the generation prompt, and each completion is its
//!   one assistant message.
//!
//! `domain` (optional, as in prompt datasets) tags a pair for per-domain metrics. Any other field,
//! a missing or empty field, a line mixing the two formats, a completion of several messages and a
//! pair whose chosen and rejected completions are the same are errors naming the file, the line
//! and the field. TRL's "implicit prompt" format (no `prompt`, the prompt inside both
//! completions) is refused with a pointer to the explicit one.

use std::path::Path;

use serde_json::{Map, Value};

use super::DataError;
use super::jsonl::{kind, parse_object, read_lines, unknown_keys};
use crate::model::chat_template::ChatMessage;

const FIELDS: [&str; 4] = ["prompt", "chosen", "rejected", "domain"];
const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// A pair's prompt: text, or the messages of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum PairPrompt {
    Text(String),
    Messages(Vec<ChatMessage>),
}

/// One preference pair.
#[derive(Debug, Clone, PartialEq)]
pub struct PreferencePair {
    pub prompt: PairPrompt,
    pub chosen: String,
    pub rejected: String,
    /// The pair's `domain` tag, when it has one.
    pub domain: Option<String>,
    /// The line of the file it was read from (for errors about it later, e.g. while tokenizing).
    pub line: usize,
}

/// Every pair of `path`.
pub fn load_pairs(path: &Path) -> Result<Vec<PreferencePair>, DataError> {
    Ok(read_lines(path, parse_pair)?
        .into_iter()
        .map(|(line, mut pair)| {
            pair.line = line;
            pair
        })
        .collect())
}

fn parse_pair(text: &str) -> Result<PreferencePair, String> {
    let mut object = parse_object(text)?;
    let unknown = unknown_keys(&object, &FIELDS);
    if !unknown.is_empty() {
        let quoted: Vec<String> = unknown.iter().map(|k| format!("'{k}'")).collect();
        return Err(format!(
            "unknown field{} {} (a preference pair has 'prompt', 'chosen', 'rejected' and an \
             optional 'domain')",
            crate::text::plural_s(unknown.len()),
            quoted.join(", ")
        ));
    }
    if !object.contains_key("prompt") && object.contains_key("chosen") {
        return Err(
            "missing field 'prompt' (the implicit-prompt format, with the prompt inside \
                    'chosen' and 'rejected', is not read: give the prompt as its own field)"
                .into(),
        );
    }
    let domain = match object.remove("domain") {
        None => None,
        Some(Value::String(d)) if !d.is_empty() && !d.contains('/') => Some(d),
        Some(Value::String(d)) => {
            return Err(format!(
                "field 'domain' is '{d}' (must be non-empty and contain no '/')"
            ));
        }
        Some(other) => {
            return Err(format!(
                "field 'domain' must be a string, got {}",
                kind(&other)
            ));
        }
    };
    let prompt = take(&mut object, "prompt")?;
    let conversational = prompt.is_array();
    let prompt = if conversational {
        PairPrompt::Messages(messages(prompt, "prompt")?)
    } else {
        PairPrompt::Text(text_of(prompt, "prompt")?)
    };
    let mut completion = |field: &str| -> Result<String, String> {
        let value = take(&mut object, field)?;
        let text = match (conversational, value) {
            (true, v @ Value::Array(_)) => {
                let mut m = messages(v, field)?;
                match (m.len(), m.first().map(|m| m.role.as_str())) {
                    (1, Some("assistant")) => m.remove(0).content,
                    (1, Some(role)) => {
                        return Err(format!(
                            "field '{field}' must be an assistant message, got role '{role}'"
                        ));
                    }
                    (n, _) => {
                        return Err(format!(
                            "field '{field}' has {n} messages; a completion is one assistant \
                             message"
                        ));
                    }
                }
            }
            (false, v @ Value::String(_)) => text_of(v, field)?,
            (true, v) => {
                return Err(format!(
                    "field '{field}' must be a list of messages like 'prompt', got {}",
                    kind(&v)
                ));
            }
            (false, v) => {
                return Err(format!(
                    "field '{field}' must be a string like 'prompt', got {}",
                    kind(&v)
                ));
            }
        };
        if text.trim().is_empty() {
            return Err(format!("field '{field}' is empty"));
        }
        Ok(text)
    };
    let chosen = completion("chosen")?;
    let rejected = completion("rejected")?;
    if chosen == rejected {
        return Err(
            "'chosen' and 'rejected' are the same completion: the pair teaches nothing".into(),
        );
    }
    Ok(PreferencePair {
        prompt,
        chosen,
        rejected,
        domain,
        line: 0,
    })
}

fn take(object: &mut Map<String, Value>, field: &str) -> Result<Value, String> {
    object
        .remove(field)
        .ok_or_else(|| format!("missing field '{field}'"))
}

fn text_of(value: Value, field: &str) -> Result<String, String> {
    match value {
        Value::String(s) if s.trim().is_empty() => Err(format!("field '{field}' is empty")),
        Value::String(s) => Ok(s),
        other => Err(format!(
            "field '{field}' must be a string or a list of messages, got {}",
            kind(&other)
        )),
    }
}

/// A list of `{role, content}` messages.
fn messages(value: Value, field: &str) -> Result<Vec<ChatMessage>, String> {
    let Value::Array(items) = value else {
        return Err(format!("field '{field}' must be a list of messages"));
    };
    if items.is_empty() {
        return Err(format!("field '{field}' is an empty list of messages"));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let at = format!("{field}[{i}]");
            let Value::Object(mut m) = item else {
                return Err(format!(
                    "{at} must be a message {{\"role\": …, \"content\": …}}"
                ));
            };
            if let Some(extra) = m.keys().find(|k| *k != "role" && *k != "content") {
                return Err(format!(
                    "{at}: unknown field '{extra}' (a message has 'role' and 'content')"
                ));
            }
            let role = match m.remove("role") {
                Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r,
                Some(Value::String(r)) => {
                    return Err(format!(
                        "{at}: role '{r}' is not one of system, user, assistant"
                    ));
                }
                _ => return Err(format!("{at}: missing or non-string 'role'")),
            };
            let content = match m.remove("content") {
                Some(Value::String(c)) => c,
                _ => return Err(format!("{at}: missing or non-string 'content'")),
            };
            Ok(ChatMessage { role, content })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Vec<PreferencePair>, String> {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("pairs.jsonl");
        std::fs::write(&path, text).expect("write");
        load_pairs(&path).map_err(|e| {
            e.to_string()
                .replace(&path.display().to_string(), "pairs.jsonl")
        })
    }

    #[test]
    fn both_formats_read_with_their_lines_and_domains() {
        let pairs = load(concat!(
            r#"{"prompt": "2+2=", "chosen": "4", "rejected": "5"}"#,
            "\n\n",
            r#"{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "#,
            r#""chosen": [{"role": "assistant", "content": "hello"}], "#,
            r#""rejected": [{"role": "assistant", "content": "go away"}], "domain": "chat"}"#,
            "\n"
        ))
        .expect("pairs");
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[0].prompt, PairPrompt::Text("2+2=".into()));
        assert_eq!(
            (
                pairs[0].chosen.as_str(),
                pairs[0].rejected.as_str(),
                pairs[0].domain.as_deref(),
                pairs[0].line
            ),
            ("4", "5", None, 1)
        );
        let PairPrompt::Messages(m) = &pairs[1].prompt else {
            panic!("conversational prompt");
        };
        assert_eq!(
            m.iter()
                .map(|m| (m.role.as_str(), m.content.as_str()))
                .collect::<Vec<_>>(),
            [("system", "be brief"), ("user", "hi")]
        );
        assert_eq!(
            (
                pairs[1].chosen.as_str(),
                pairs[1].domain.as_deref(),
                pairs[1].line
            ),
            ("hello", Some("chat"), 3)
        );
    }

    #[test]
    fn bad_pairs_name_the_line_and_the_field() {
        let cases = [
            (
                r#"{"prompt": "p", "chosen": "a", "rejected": "a"}"#,
                "line 1: 'chosen' and 'rejected' are the same completion",
            ),
            (
                r#"{"prompt": "p", "chosen": " ", "rejected": "a"}"#,
                "line 1: field 'chosen' is empty",
            ),
            (
                r#"{"prompt": "p", "chosen": "a", "rejectd": "b"}"#,
                "line 1: unknown field 'rejectd'",
            ),
            (
                r#"{"prompt": "p", "chosen": "a"}"#,
                "line 1: missing field 'rejected'",
            ),
            (
                r#"{"chosen": "a", "rejected": "b"}"#,
                "line 1: missing field 'prompt' (the implicit-prompt format",
            ),
            (
                r#"{"prompt": [{"role": "user", "content": "p"}], "chosen": "a", "rejected": "b"}"#,
                "field 'chosen' must be a list of messages like 'prompt', got a string",
            ),
            (
                r#"{"prompt": [{"role": "user", "content": "p"}], "chosen": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}], "rejected": [{"role": "assistant", "content": "c"}]}"#,
                "field 'chosen' has 2 messages",
            ),
            (
                r#"{"prompt": [{"role": "robot", "content": "p"}], "chosen": "a", "rejected": "b"}"#,
                "prompt[0]: role 'robot' is not one of system, user, assistant",
            ),
            (
                r#"{"prompt": "p", "chosen": 4, "rejected": "b"}"#,
                "field 'chosen' must be a string like 'prompt', got a number",
            ),
            ("[1, 2]", "line 1: expected a JSON object, got an array"),
        ];
        for (line, expected) in cases {
            let e = load(line).expect_err(line);
            assert!(
                e.contains(expected),
                "{line}\n  gave: {e}\n  want: {expected}"
            );
            assert!(e.starts_with("dataset 'pairs.jsonl' line 1:"), "{e}");
        }
        let e = load("\n\n").expect_err("empty");
        assert!(e.contains("no examples"), "{e}");
    }
}
