//! The JSONL prompt format: one JSON object per line.
//!
//! Fields: `prompt` (string, required, non-empty), `ground_truth` (string, or a JSON number which is
//! kept as its JSON text: `42`, `0.5`, `-3`), `domain` (string, optional; the caller's default
//! otherwise; non-empty and without `/`, because it becomes part of metric keys), `response` (string,
//! optional: the demonstration SFT imitates, when it is more than the bare answer), `metadata` (an
//! object, optional: whatever the domain's reward reads about the prompt). Any other field is an
//! error that names it, so a typo such as `promt` is never silently dropped. Blank lines are skipped; a
//! UTF-8 byte-order mark is ignored. Errors stop at the first bad line and quote file and line.

use std::path::Path;

use serde_json::{Map, Value};

use super::{DataError, Example};

const FIELDS: [&str; 5] = ["prompt", "ground_truth", "domain", "response", "metadata"];

/// Longest dataset line read: one example per line, so a longer one is an error (a file that is
/// not JSONL, or a prompt no model could take), found without holding it in memory.
pub const MAX_LINE_BYTES: usize = 8 << 20;

/// Reads every example of `path`; `default_domain` applies to lines without a `domain`.
/// An existing file without a single example is an error.
pub fn load_jsonl(path: &Path, default_domain: &str) -> Result<Vec<Example>, DataError> {
    Ok(load_jsonl_numbered(path, default_domain)?
        .into_iter()
        .map(|(_, e)| e)
        .collect())
}

/// [`load_jsonl`] with each example's line number, read a line at a time: memory holds the
/// examples and one line of at most [`MAX_LINE_BYTES`].
pub fn load_jsonl_numbered(
    path: &Path,
    default_domain: &str,
) -> Result<Vec<(usize, Example)>, DataError> {
    read_lines(path, |text| parse_line(text, default_domain))
}

/// Each non-blank line of the JSONL file `path` through `parse`, with its line number, read a
/// line at a time (at most [`MAX_LINE_BYTES`] each). `parse`'s error is reported with the file
/// and the line; a file without a single line to parse is an error.
pub(crate) fn read_lines<T>(
    path: &Path,
    mut parse: impl FnMut(&str) -> Result<T, String>,
) -> Result<Vec<(usize, T)>, DataError> {
    use std::io::{BufRead, Read};
    let shown = path.display().to_string();
    let read_err = |source| DataError::Read {
        path: shown.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut reader = std::io::BufReader::new(file);
    let mut examples = Vec::new();
    let mut buf = Vec::new();
    for line in 1.. {
        buf.clear();
        let read = Read::by_ref(&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(read_err)?;
        if read == 0 {
            break;
        }
        if buf.len() > MAX_LINE_BYTES && !buf.ends_with(b"\n") {
            // Count the rest of the line without keeping it.
            let mut length = buf.len();
            loop {
                let chunk = reader.fill_buf().map_err(read_err)?;
                if chunk.is_empty() {
                    break;
                }
                let (used, done) = match chunk.iter().position(|&b| b == b'\n') {
                    Some(at) => (at + 1, true),
                    None => (chunk.len(), false),
                };
                length += used - usize::from(done);
                reader.consume(used);
                if done {
                    break;
                }
            }
            return Err(DataError::Line {
                path: shown,
                line,
                message: format!(
                    "the line is {length} bytes, more than the {} MiB a dataset line may have (one \
                     example per line; is the file JSONL?)",
                    MAX_LINE_BYTES >> 20
                ),
            });
        }
        let text = std::str::from_utf8(&buf).map_err(|e| DataError::Line {
            path: shown.clone(),
            line,
            message: format!("not UTF-8: {e}"),
        })?;
        let text = if line == 1 {
            text.strip_prefix('\u{feff}').unwrap_or(text)
        } else {
            text
        };
        if text.trim().is_empty() {
            continue;
        }
        let example =
            parse(text.trim_end_matches(['\n', '\r'])).map_err(|message| DataError::Line {
                path: shown.clone(),
                line,
                message,
            })?;
        examples.push((line, example));
    }
    if examples.is_empty() {
        return Err(DataError::Empty { path: shown });
    }
    Ok(examples)
}

/// Parses JSONL text; `shown` is the file name used in error messages. Empty input gives no examples.
pub fn parse_jsonl(
    text: &str,
    shown: &str,
    default_domain: &str,
) -> Result<Vec<Example>, DataError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut examples = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let example = parse_line(line, default_domain).map_err(|message| DataError::Line {
            path: shown.to_string(),
            line: index + 1,
            message,
        })?;
        examples.push(example);
    }
    Ok(examples)
}

/// Writes `examples` as JSONL (every field written, domain included), replacing `path`.
pub fn write_jsonl(path: &Path, examples: &[Example]) -> Result<(), DataError> {
    let mut out = String::new();
    for example in examples {
        // Serialising three strings cannot fail.
        let line = serde_json::to_string(example).unwrap_or_default();
        out.push_str(&line);
        out.push('\n');
    }
    std::fs::write(path, out).map_err(|source| DataError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// A JSONL line as a JSON object, or what is wrong with it.
pub(crate) fn parse_object(line: &str) -> Result<Map<String, Value>, String> {
    let value: Value =
        serde_json::from_str(line).map_err(|e| format!("invalid JSON: {}", json_reason(&e)))?;
    match value {
        Value::Object(object) => Ok(object),
        other => Err(format!("expected a JSON object, got {}", kind(&other))),
    }
}

/// The keys of `object` that are not in `known`, sorted, so that a message naming them does not
/// depend on serde_json's map order feature.
pub(crate) fn unknown_keys<'a>(object: &'a Map<String, Value>, known: &[&str]) -> Vec<&'a String> {
    let mut unknown: Vec<&String> = object
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .collect();
    unknown.sort();
    unknown
}

fn parse_line(line: &str, default_domain: &str) -> Result<Example, String> {
    let mut object = parse_object(line)?;
    let unknown = unknown_keys(&object, &FIELDS);
    if !unknown.is_empty() {
        return Err(unknown_fields_message(&unknown));
    }
    let prompt = take_string(&mut object, "prompt", false)?;
    if prompt.trim().is_empty() {
        return Err("field 'prompt' is empty".to_string());
    }
    let ground_truth = take_string(&mut object, "ground_truth", true)?;
    let domain = match object.remove("domain") {
        None => default_domain.to_string(),
        Some(Value::String(domain)) => {
            if domain.is_empty() || domain.contains('/') {
                return Err(format!(
                    "field 'domain' is '{domain}' (must be non-empty and contain no '/')"
                ));
            }
            domain
        }
        Some(other) => {
            return Err(format!(
                "field 'domain' must be a string, got {}",
                kind(&other)
            ));
        }
    };
    let response = match object.remove("response") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) => Some(r),
        Some(other) => {
            return Err(format!(
                "field 'response' must be a string, got {}",
                kind(&other)
            ));
        }
    };
    let metadata = match object.remove("metadata") {
        None | Some(Value::Null) => None,
        Some(m @ Value::Object(_)) => Some(m),
        Some(other) => {
            return Err(format!(
                "field 'metadata' must be an object, got {}",
                kind(&other)
            ));
        }
    };
    Ok(Example {
        metadata,
        prompt,
        ground_truth,
        domain,
        response,
    })
}

fn take_string(
    object: &mut Map<String, Value>,
    field: &str,
    numbers_ok: bool,
) -> Result<String, String> {
    match object.remove(field) {
        None => Err(format!("missing field '{field}'")),
        Some(Value::String(s)) => Ok(s),
        Some(Value::Number(n)) if numbers_ok => Ok(n.to_string()),
        Some(other) => {
            let expected = if numbers_ok {
                "a string or a number"
            } else {
                "a string"
            };
            Err(format!(
                "field '{field}' must be {expected}, got {}",
                kind(&other)
            ))
        }
    }
}

fn unknown_fields_message(unknown: &[&String]) -> String {
    let quoted: Vec<String> = unknown.iter().map(|k| format!("'{k}'")).collect();
    let noun = if unknown.len() == 1 {
        "field"
    } else {
        "fields"
    };
    let message = format!("unknown {noun} {}", quoted.join(", "));
    let suggestions: Vec<(&str, &str)> = unknown
        .iter()
        .filter_map(|k| closest_field(k).map(|f| (k.as_str(), f)))
        .collect();
    match suggestions.as_slice() {
        [] => format!(
            "{message} (expected 'prompt', 'ground_truth', 'domain', 'response', 'metadata')"
        ),
        [(_, field)] if unknown.len() == 1 => format!("{message} (did you mean '{field}'?)"),
        many => {
            let pairs: Vec<String> = many
                .iter()
                .map(|(k, f)| format!("'{k}' -> '{f}'"))
                .collect();
            format!("{message} (did you mean {}?)", pairs.join(", "))
        }
    }
}

/// The known field a typo most likely meant, if any is close enough.
fn closest_field(name: &str) -> Option<&'static str> {
    FIELDS
        .iter()
        .map(|f| (strsim::jaro_winkler(name, f), *f))
        .filter(|(similarity, _)| *similarity >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, f)| f)
}

/// serde_json's message without its " at line 1 column N" tail (always line 1 here), plus the column.
fn json_reason(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let reason = full
        .rsplit_once(" at line ")
        .map_or(full.as_str(), |(r, _)| r);
    format!("{reason} at column {}", e.column())
}

/// A JSON value's kind, for errors ("got a number").
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn load_err(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "x.jsonl", text);
        let err = load_jsonl(&path, "math").unwrap_err();
        let shown = path.display().to_string();
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("dataset '{shown}'")),
            "{message}"
        );
        message.replacen(&shown, "x.jsonl", 1)
    }

    #[test]
    fn loads_fields_defaults_and_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let text = concat!(
            "{\"prompt\": \"1+1?\", \"ground_truth\": \"2\"}\n",
            "\n",
            "   \n",
            "{\"prompt\": \"half?\", \"ground_truth\": 0.5, \"domain\": \"arith\"}\r\n",
            "{\"ground_truth\": -3, \"prompt\": \"neg?\"}",
        );
        let path = write(&dir, "ok.jsonl", text);
        let examples = load_jsonl(&path, "math").unwrap();
        let got: Vec<(&str, &str, &str)> = examples
            .iter()
            .map(|e| {
                (
                    e.prompt.as_str(),
                    e.ground_truth.as_str(),
                    e.domain.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("1+1?", "2", "math"),
                ("half?", "0.5", "arith"),
                ("neg?", "-3", "math")
            ]
        );
    }

    #[test]
    fn byte_order_mark_is_ignored() {
        let examples = parse_jsonl(
            "\u{feff}{\"prompt\":\"p\",\"ground_truth\":\"1\"}\n",
            "x",
            "d",
        )
        .unwrap();
        assert_eq!(examples.len(), 1);
    }

    #[test]
    fn missing_field_quotes_file_and_line() {
        let text = "{\"prompt\":\"a\",\"ground_truth\":\"1\"}\n\n{\"ground_truth\":\"1\"}\n";
        assert_eq!(
            load_err(text),
            "dataset 'x.jsonl' line 3: missing field 'prompt'"
        );
        let text = "{\"prompt\":\"a\"}\n";
        assert_eq!(
            load_err(text),
            "dataset 'x.jsonl' line 1: missing field 'ground_truth'"
        );
    }

    #[test]
    fn invalid_json_quotes_line_and_column() {
        let text =
            "{\"prompt\":\"a\",\"ground_truth\":\"1\"}\n{\"prompt\":\"a\",\"ground_truth\":1,}\n";
        let message = load_err(text);
        assert!(
            message
                .starts_with("dataset 'x.jsonl' line 2: invalid JSON: trailing comma at column "),
            "{message}"
        );
        assert!(!message.contains("line 1 column"), "{message}");
        let message = load_err("{\"prompt\": \"unterminated\n");
        assert!(
            message.starts_with("dataset 'x.jsonl' line 1: invalid JSON: "),
            "{message}"
        );
    }

    #[test]
    fn unknown_fields_are_named() {
        let text = "{\"promt\":\"a\",\"ground_truth\":\"1\"}\n";
        assert_eq!(
            load_err(text),
            "dataset 'x.jsonl' line 1: unknown field 'promt' (did you mean 'prompt'?)"
        );
        let text = "{\"prompt\":\"a\",\"ground_truth\":\"1\",\"id\":7,\"source\":\"gsm8k\"}\n";
        assert_eq!(
            load_err(text),
            "dataset 'x.jsonl' line 1: unknown fields 'id', 'source' (expected 'prompt', 'ground_truth', 'domain', 'response', 'metadata')"
        );
        let text = "{\"promt\":\"a\",\"ground_truht\":\"1\"}\n";
        assert_eq!(
            load_err(text),
            "dataset 'x.jsonl' line 1: unknown fields 'ground_truht', 'promt' (did you mean 'ground_truht' -> 'ground_truth', 'promt' -> 'prompt'?)"
        );
    }

    #[test]
    fn wrong_types_and_values() {
        let cases = [
            ("[1,2]", "expected a JSON object, got an array"),
            ("\"text\"", "expected a JSON object, got a string"),
            (
                "{\"prompt\":1,\"ground_truth\":\"1\"}",
                "field 'prompt' must be a string, got a number",
            ),
            (
                "{\"prompt\":\" \",\"ground_truth\":\"1\"}",
                "field 'prompt' is empty",
            ),
            (
                "{\"prompt\":\"a\",\"ground_truth\":true}",
                "field 'ground_truth' must be a string or a number, got a boolean",
            ),
            (
                "{\"prompt\":\"a\",\"ground_truth\":null}",
                "field 'ground_truth' must be a string or a number, got null",
            ),
            (
                "{\"prompt\":\"a\",\"ground_truth\":\"1\",\"domain\":3}",
                "field 'domain' must be a string, got a number",
            ),
            (
                "{\"prompt\":\"a\",\"ground_truth\":\"1\",\"domain\":\"a/b\"}",
                "field 'domain' is 'a/b' (must be non-empty and contain no '/')",
            ),
            (
                "{\"prompt\":\"a\",\"ground_truth\":\"1\",\"domain\":\"\"}",
                "field 'domain' is '' (must be non-empty and contain no '/')",
            ),
            (
                "{\"prompt\":\"a\",\"ground_truth\":\"1\",\"metadata\":[1]}",
                "field 'metadata' must be an object, got an array",
            ),
        ];
        for (line, expected) in cases {
            assert_eq!(
                load_err(line),
                format!("dataset 'x.jsonl' line 1: {expected}")
            );
        }
    }

    #[test]
    fn empty_and_missing_files() {
        assert_eq!(load_err(""), "dataset 'x.jsonl': no examples");
        assert_eq!(load_err("\n  \n\n"), "dataset 'x.jsonl': no examples");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.jsonl");
        let message = load_jsonl(&path, "math").unwrap_err().to_string();
        let expected = format!("dataset '{}': cannot read: ", path.display());
        assert!(message.starts_with(&expected), "{message}");
    }

    #[test]
    fn write_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let examples = vec![
            Example {
                prompt: "line one\nline \"two\" ✓".into(),
                ground_truth: "\\frac{1}{2}".into(),
                domain: "math".into(),
                response: None,
                metadata: None,
            },
            Example {
                prompt: "p".into(),
                ground_truth: "".into(),
                domain: "code".into(),
                response: Some("worked solution: 1".into()),
                metadata: Some(serde_json::json!({"tests": ["assert f() == 1"], "n": 2})),
            },
        ];
        write_jsonl(&path, &examples).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert_eq!(load_jsonl(&path, "other").unwrap(), examples);
    }

    #[test]
    fn write_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no/such/dir/out.jsonl");
        let message = write_jsonl(&path, &[]).unwrap_err().to_string();
        let expected = format!("dataset '{}': cannot write: ", path.display());
        assert!(message.starts_with(&expected), "{message}");
    }
}
