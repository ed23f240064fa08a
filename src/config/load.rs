//! Strict YAML loading and aggregated validation, for any config schema.
//!
//! This module owns the generic machinery only: reading a file, deserializing it strictly (the schema's
//! structs carry `#[serde(deny_unknown_fields)]`), turning parser errors into messages that name the file,
//! the line and the key path, and collecting every validation problem. Command-line `key.sub=value`
//! overrides live in [`super::overrides`] (re-exported here). It must not know any particular schema;
//! the run config lives in the parent module.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use super::overrides::apply_overrides;

/// Everything that can go wrong between a YAML file (plus overrides) and a typed, validated config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("config '{file}': cannot read: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed or does not fit the schema.
    #[error("config '{file}'{}: {message}", line_suffix(.line))]
    Parse {
        file: String,
        /// 1-based line of the offending node, when the parser knows it.
        line: Option<u64>,
        message: String,
    },
    /// A `key.sub=value` override is malformed, names an unknown key or gives a value of the wrong type.
    #[error("override '{arg}': {message}")]
    Override { arg: String, message: String },
    /// Several overrides are wrong; each is listed with its problem.
    #[error("overrides are invalid:{}", bullet_list(&.problems.iter().map(|(a, m)| format!("'{a}': {m}")).collect::<Vec<_>>()))]
    Overrides { problems: Vec<(String, String)> },
    /// The config parsed but breaks rules between fields; every problem is listed. `file` is
    /// as the message names it: `'x.yaml'`, or `'x.yaml' with the command line's overrides`
    /// when a value may have come from one.
    #[error("config {file} is invalid:{}", bullet_list(.problems))]
    Invalid { file: String, problems: Vec<String> },
}

fn line_suffix(line: &Option<u64>) -> String {
    line.map(|l| format!(" line {l}")).unwrap_or_default()
}

fn bullet_list(problems: &[String]) -> String {
    let mut out = String::new();
    for p in problems {
        let _ = write!(out, "\n  - {p}");
    }
    out
}

/// A schema's cross-field rules. Implementations push one lower-case message per problem (naming the
/// key and quoting the value) and never stop at the first one.
pub trait Validate {
    fn validate(&self, problems: &mut Vec<String>);
}

/// [`validated`] for a config read from `path` and changed by `overrides`: a problem with a key
/// an override set is marked as the command line's, so the file is not blamed for it.
pub fn validated_with<T: Validate>(
    value: T,
    path: &Path,
    overrides: &[String],
) -> Result<T, ConfigError> {
    let keys: Vec<&str> = overrides
        .iter()
        .filter_map(|o| o.split_once('=').map(|(k, _)| k.trim()))
        .collect();
    // `a.b` and `a.b.c` are the same setting's; `a.b` and `a.bc` are not.
    let related = |x: &str, y: &str| {
        let (short, long) = if x.len() <= y.len() { (x, y) } else { (y, x) };
        long.starts_with(short) && matches!(long.as_bytes().get(short.len()), None | Some(b'.'))
    };
    validated(value, &path.display().to_string()).map_err(|e| match e {
        ConfigError::Invalid { file, problems } => ConfigError::Invalid {
            file,
            problems: problems
                .into_iter()
                .map(|p| {
                    // `rl.steps, rl.prompts_per_step … must be …`: the first key, without its comma.
                    let key = p.split([' ', ':', ',']).next().unwrap_or("");
                    if !key.is_empty() && keys.iter().any(|k| related(k, key)) {
                        format!("{p} (set on the command line)")
                    } else {
                        p
                    }
                })
                .collect(),
        },
        e => e,
    })
}

/// Runs [`Validate::validate`] and fails with [`ConfigError::Invalid`] listing all problems, if any.
pub fn validated<T: Validate>(value: T, origin: &str) -> Result<T, ConfigError> {
    let mut problems = Vec::new();
    value.validate(&mut problems);
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(ConfigError::Invalid {
            file: format!("'{origin}'"),
            problems,
        })
    }
}

/// Reads `path` (merged over the fragments it includes), deserializes it strictly into `T`, then
/// applies `key.sub=value` overrides in order.
pub fn load_yaml<T: DeserializeOwned + Serialize>(
    path: &Path,
    overrides: &[String],
) -> Result<T, ConfigError> {
    let value: T = super::include::load_with_includes(path)?;
    apply_overrides(value, overrides)
}

/// Deserializes YAML text strictly; `origin` names the source in errors (a path, or e.g. `<builtin>`).
pub fn from_yaml_str<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, ConfigError> {
    // Strict booleans: `yes`/`on` in a config are more likely typos than intent.
    let options = serde_saphyr::options! { strict_booleans: true, with_snippet: false };
    // The typed parse streams: given `steps: [150` it finds a list where a number belongs before it
    // reaches the unclosed bracket. Reading the document's structure first reports the syntax
    // problem, and its line, instead.
    serde_saphyr::from_str_with_options::<serde::de::IgnoredAny>(text, options.clone())
        .map_err(|e| parse_error(&e, text, origin))?;
    serde_saphyr::from_str_with_options(text, options).map_err(|e| parse_error(&e, text, origin))
}

pub use crate::text::{did_you_mean, suggestion_suffix};

pub(crate) fn expected_suffix(word: &str, expected: &[&str]) -> String {
    let mut out = format!(" (expected one of: {}", expected.join(", "));
    if let Some(s) = did_you_mean(word, expected.iter().copied()) {
        let _ = write!(out, "; did you mean '{s}'?");
    }
    out.push(')');
    out
}

fn in_path(path: &[String]) -> String {
    if path.is_empty() {
        " at the top level".to_string()
    } else {
        format!(" in '{}'", path.join("."))
    }
}

fn for_path(path: &[String]) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" for '{}'", path.join("."))
    }
}

fn parse_error(e: &serde_saphyr::Error, text: &str, origin: &str) -> ConfigError {
    use serde_saphyr::Error as E;
    let e = e.without_snippet();
    let line = e.location().map(|l| l.line()).filter(|l| *l > 0);
    let (own_key, parents) = line.map(|l| yaml_context(text, l)).unwrap_or_default();
    let scalar = line.and_then(|l| scalar_on_line(text, l));
    let full = || {
        let mut p = parents.clone();
        p.extend(own_key.clone());
        p
    };
    let message = match e {
        E::SerdeUnknownField {
            field, expected, ..
        } => {
            // The location points at the key itself, so it is not one of its parents.
            let parents = if own_key.as_deref() == Some(field.as_str()) {
                parents.clone()
            } else {
                full()
            };
            format!(
                "unknown field '{field}'{}{}",
                in_path(&parents),
                suggestion_suffix(field, expected.iter().copied())
            )
        }
        E::SerdeUnknownVariant {
            variant, expected, ..
        } => format!(
            "invalid value '{variant}'{}{}",
            for_path(&full()),
            expected_suffix(variant, expected)
        ),
        E::SerdeMissingField { field, .. } => {
            // The parser reports a missing field at the last node it read inside the mapping: a
            // `key: value` line belongs to the mapping that lacks the field, a `key:` line opens it.
            let struct_path = if line.is_some_and(|l| opens_block(text, l)) {
                full()
            } else {
                parents.clone()
            };
            format!("missing field '{field}'{}", in_path(&struct_path))
        }
        E::DuplicateMappingKey { key: Some(key), .. } => {
            let parents = if own_key.as_deref() == Some(key.as_str()) {
                parents.clone()
            } else {
                full()
            };
            format!("duplicate key '{key}'{}", in_path(&parents))
        }
        E::InvalidScalar { ty, .. } => format!(
            "invalid value {}{}, expected {}",
            quoted(&scalar),
            for_path(&full()),
            describe_scalar_type(ty)
        ),
        E::NullIntoString { .. } => {
            format!("invalid value null{}, expected a string", for_path(&full()))
        }
        E::InvalidBooleanStrict { .. } => format!(
            "invalid value {}{}, expected true or false",
            quoted(&scalar),
            for_path(&full())
        ),
        E::SerdeInvalidType {
            unexpected,
            expected,
            ..
        }
        | E::SerdeInvalidValue {
            unexpected,
            expected,
            ..
        } => format!(
            "invalid value {unexpected}{}, expected {expected}",
            for_path(&full())
        ),
        other => {
            let mut msg = strip_location(&other.to_string());
            let path = full();
            if !path.is_empty() {
                let _ = write!(msg, " (at '{}'", path.join("."));
                if let Some(v) = &scalar {
                    let _ = write!(msg, ", found '{v}'");
                }
                msg.push(')');
            }
            msg
        }
    };
    ConfigError::Parse {
        file: origin.to_string(),
        line,
        message,
    }
}

fn quoted(scalar: &Option<String>) -> String {
    match scalar {
        Some(v) => format!("'{v}'"),
        None => "here".to_string(),
    }
}

/// serde-saphyr names the Rust type it failed to parse; say it in config terms.
pub(crate) fn describe_scalar_type(ty: &str) -> String {
    match ty {
        "floating point" | "f32" | "f64" => "a number".to_string(),
        "boolean" | "bool" => "true or false".to_string(),
        "u8" => "a whole number from 0 to 255".to_string(),
        "u16" => "a whole number from 0 to 65535".to_string(),
        "u32" => "a whole number from 0 to 4294967295".to_string(),
        "u64" | "u128" | "usize" => "a whole number, 0 or more".to_string(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number".to_string(),
        "char" => "a single character".to_string(),
        other => other.to_string(),
    }
}

/// Whether a 1-based line is `key:` with nothing after it (the start of a nested block).
fn opens_block(text: &str, line: u64) -> bool {
    let Some(raw) = usize::try_from(line)
        .ok()
        .and_then(|l| l.checked_sub(1))
        .and_then(|l| text.lines().nth(l))
    else {
        return false;
    };
    let (_, key) = key_on_line(raw);
    let body = raw.split(" #").next().unwrap_or_default().trim_end();
    key.is_some() && body.ends_with(':')
}

/// The plain or quoted scalar written on a 1-based line after `key:` or `- `, without comment or
/// quotes; `None` for flow collections, block scalars or lines without a value.
fn scalar_on_line(text: &str, line: u64) -> Option<String> {
    let raw = text
        .lines()
        .nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
    let (indent, key) = key_on_line(raw);
    let mut rest = raw.get(indent..)?;
    if key.is_some() {
        // Skip past the key's `:` (the first one followed by a space or the end of the line).
        let colon = rest
            .char_indices()
            .find(|(i, c)| {
                *c == ':' && matches!(rest[i + 1..].chars().next(), None | Some(' ' | '\t'))
            })?
            .0;
        rest = &rest[colon + 1..];
    }
    let rest = rest.trim();
    let value = if let Some(q) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') {
        let end = rest[1..].find(q)?;
        rest[1..1 + end].to_string()
    } else {
        let end = rest.find(" #").unwrap_or(rest.len());
        rest[..end].trim().to_string()
    };
    let is_value = !value.is_empty() && !value.starts_with(['[', '{', '|', '>', '&', '*', '#']);
    is_value.then_some(value)
}

/// Drops a trailing ` at line N column M` that the parser appends; our prefix already names the line.
pub(crate) fn strip_location(msg: &str) -> String {
    let msg = msg.trim();
    match msg.rfind(" at line ") {
        Some(i) if msg[i..].chars().any(|c| c.is_ascii_digit()) => msg[..i].trim_end().to_string(),
        _ => msg.to_string(),
    }
}

/// The key written on a block-style YAML line, with the column where it starts (after any `- `).
fn key_on_line(line: &str) -> (usize, Option<String>) {
    let mut indent = line.len() - line.trim_start_matches(' ').len();
    let mut rest = &line[indent..];
    while let Some(after) = rest.strip_prefix('-') {
        if !(after.is_empty() || after.starts_with(' ')) {
            break;
        }
        let trimmed = after.trim_start_matches(' ');
        indent += 1 + after.len() - trimmed.len();
        rest = trimmed;
    }
    let key = if let Some(q) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') {
        rest[1..]
            .find(q)
            .filter(|end| rest[1 + end + 1..].trim_start().starts_with(':'))
            .map(|end| rest[1..1 + end].to_string())
    } else if rest.starts_with(['#', '{', '[', '&', '*', '!', '|', '>']) {
        None
    } else {
        rest.char_indices()
            .find(|(i, c)| {
                *c == ':' && matches!(rest[i + 1..].chars().next(), None | Some(' ' | '\t'))
            })
            .map(|(i, _)| rest[..i].trim_end().to_string())
            .filter(|k| !k.is_empty() && !k.contains(" #"))
    };
    (indent, key)
}

/// For a 1-based line of block-style YAML: the key on that line (if any) and the keys of its enclosing
/// mappings, outermost first. A heuristic on indentation; flow-style input just gives less context.
pub(crate) fn yaml_context(text: &str, line: u64) -> (Option<String>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let Some(idx) = usize::try_from(line).ok().and_then(|l| l.checked_sub(1)) else {
        return (None, Vec::new());
    };
    let Some(current) = lines.get(idx) else {
        return (None, Vec::new());
    };
    let (mut threshold, own) = key_on_line(current);
    let mut parents = Vec::new();
    for l in lines[..idx].iter().rev() {
        if threshold == 0 {
            break;
        }
        let t = l.trim();
        if t.is_empty() || t.starts_with('#') || t == "---" {
            continue;
        }
        if let (indent, Some(key)) = key_on_line(l)
            && indent < threshold
        {
            parents.push(key);
            threshold = indent;
        }
    }
    parents.reverse();
    (own, parents)
}

#[cfg(test)]
#[path = "load_tests.rs"]
pub(crate) mod tests;
