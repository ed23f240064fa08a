//! Strict YAML loading, `key.sub=value` overrides and aggregated validation, for any config schema.
//!
//! This module owns the generic machinery only: reading a file, deserializing it strictly (the schema's
//! structs carry `#[serde(deny_unknown_fields)]`), turning parser errors into messages that name the file,
//! the line and the key path, applying command-line overrides and collecting every validation problem.
//! It must not know any particular schema; the run config lives in the parent module.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

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
    /// The config parsed but breaks rules between fields; every problem is listed.
    #[error("config '{file}' is invalid:{}", bullet_list(.problems))]
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

/// Runs [`Validate::validate`] and fails with [`ConfigError::Invalid`] listing all problems, if any.
pub fn validated<T: Validate>(value: T, origin: &str) -> Result<T, ConfigError> {
    let mut problems = Vec::new();
    value.validate(&mut problems);
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(ConfigError::Invalid {
            file: origin.to_string(),
            problems,
        })
    }
}

/// Reads `path`, deserializes it strictly into `T`, then applies `key.sub=value` overrides in order.
pub fn load_yaml<T: DeserializeOwned + Serialize>(
    path: &Path,
    overrides: &[String],
) -> Result<T, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: file.clone(),
        source,
    })?;
    let value: T = from_yaml_str(&text, &file)?;
    apply_overrides(value, overrides)
}

/// Deserializes YAML text strictly; `origin` names the source in errors (a path, or e.g. `<builtin>`).
pub fn from_yaml_str<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, ConfigError> {
    // Strict booleans: `yes`/`on` in a config are more likely typos than intent.
    let options = serde_saphyr::options! { strict_booleans: true, with_snippet: false };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| parse_error(&e, text, origin))
}

/// Applies `key.sub=value` overrides to an already typed config. Each right-hand side is read as a YAML
/// scalar or flow value (`3`, `0.5`, `true`, `grpo`, `[1, 2]`, `null`, `'quoted'`).
pub fn apply_overrides<T: DeserializeOwned + Serialize>(
    value: T,
    overrides: &[String],
) -> Result<T, ConfigError> {
    if overrides.is_empty() {
        return Ok(value);
    }
    let mut tree = serde_json::to_value(&value).map_err(|e| ConfigError::Override {
        arg: overrides[0].clone(),
        message: format!("cannot represent the config as a tree: {e}"),
    })?;
    // Each override is applied to the tree and checked against the schema right away, so a type error
    // names the override that caused it.
    let mut typed = value;
    for arg in overrides {
        let fail = |message: String| ConfigError::Override {
            arg: arg.clone(),
            message,
        };
        let (path, rhs, plain) = split_override(arg).map_err(fail)?;
        set_path(&mut tree, &path, rhs, plain).map_err(fail)?;
        typed = serde_json::from_value::<T>(tree.clone())
            .map_err(|e| fail(humanize_json_error(&e.to_string(), &path.join("."))))?;
    }
    Ok(typed)
}

/// The closest candidate to `word` if it is plausibly a misspelling of it (case-insensitive
/// Jaro-Winkler similarity of at least 0.8).
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let word = word.to_lowercase();
    candidates
        .into_iter()
        .filter(|c| !c.is_empty())
        .map(|c| (strsim::jaro_winkler(&word, &c.to_lowercase()), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

fn suggestion_suffix<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    did_you_mean(word, candidates)
        .map(|s| format!(" (did you mean '{s}'?)"))
        .unwrap_or_default()
}

fn expected_suffix(word: &str, expected: &[&str]) -> String {
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
fn describe_scalar_type(ty: &str) -> String {
    match ty {
        "floating point" | "f32" | "f64" => "a number".to_string(),
        "boolean" | "bool" => "true or false".to_string(),
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => {
            format!("a non-negative integer that fits {ty}")
        }
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => format!("an integer that fits {ty}"),
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
fn strip_location(msg: &str) -> String {
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
fn yaml_context(text: &str, line: u64) -> (Option<String>, Vec<String>) {
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

fn split_override(arg: &str) -> Result<(Vec<&str>, Value, Option<String>), String> {
    let Some((key, rhs)) = arg.split_once('=') else {
        return Err("expected 'key.sub=value'".to_string());
    };
    let key = key.trim();
    let path: Vec<&str> = key.split('.').collect();
    if path.iter().any(|s| s.is_empty()) {
        return Err(format!("key '{key}' has an empty segment"));
    }
    let rhs = rhs.trim();
    if rhs.is_empty() {
        return Err("missing value (write null for none, or '' for an empty string)".to_string());
    }
    let value: Value = serde_saphyr::from_str(rhs).map_err(|e| {
        format!(
            "cannot read value '{rhs}': {}",
            strip_location(&e.to_string())
        )
    })?;
    // A bare `123` or `true` given to a string field means its text, as YAML itself would store it
    // in a `String`; keep the text for that case.
    let plain = match value {
        Value::Number(_) | Value::Bool(_) if !rhs.starts_with(['"', '\'']) => Some(rhs.to_string()),
        _ => None,
    };
    Ok((path, value, plain))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "section",
    }
}

fn set_path(
    root: &mut Value,
    path: &[&str],
    value: Value,
    plain: Option<String>,
) -> Result<(), String> {
    let mut cur = root;
    // Inside a section that was absent (an `Option` that was `None`) any key may be created; the
    // schema check after the override reports what does not belong.
    let mut fresh = false;
    for (i, seg) in path.iter().enumerate() {
        let here = path[..i].join(".");
        if cur.is_null() {
            *cur = Value::Object(serde_json::Map::new());
            fresh = true;
        }
        cur = match cur {
            Value::Object(map) => {
                if !map.contains_key(*seg) {
                    if !fresh {
                        return Err(unknown_key(seg, &here, map.keys().map(String::as_str)));
                    }
                    map.insert((*seg).to_string(), Value::Null);
                }
                match map.get_mut(*seg) {
                    Some(v) => v,
                    None => return Err(format!("cannot set '{seg}'")),
                }
            }
            Value::Array(items) => {
                let len = items.len();
                match seg.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    Some(v) => v,
                    None => {
                        return Err(format!(
                            "'{seg}' is not an index of list '{here}' ({len} items)"
                        ));
                    }
                }
            }
            other => {
                return Err(format!(
                    "'{here}' is a {}, not a section, so it has no key '{seg}'",
                    kind_of(other)
                ));
            }
        };
    }
    *cur = match plain {
        Some(text) if cur.is_string() => Value::String(text),
        _ => value,
    };
    Ok(())
}

fn unknown_key<'a>(seg: &str, here: &str, keys: impl Iterator<Item = &'a str> + Clone) -> String {
    let place = if here.is_empty() {
        String::new()
    } else {
        format!(" in '{here}'")
    };
    match did_you_mean(seg, keys.clone()) {
        Some(s) => format!("unknown key '{seg}'{place} (did you mean '{s}'?)"),
        None => format!(
            "unknown key '{seg}'{place} (known keys: {})",
            keys.collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Rewrites serde_json's "unknown variant `x`, expected one of `a`, `b`" into our quoting style, with a
/// suggestion; other messages pass through.
fn humanize_json_error(msg: &str, key: &str) -> String {
    let ticked = |s: &str| -> Vec<String> {
        s.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    for kind in ["unknown variant", "unknown field"] {
        if let Some(rest) = msg.strip_prefix(kind)
            && let Some((bad, expected)) = rest.split_once(", expected")
            && let Some(bad) = ticked(bad).into_iter().next()
        {
            let expected = ticked(expected);
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            return if kind == "unknown variant" {
                format!(
                    "invalid value '{bad}' for '{key}'{}",
                    expected_suffix(&bad, &expected)
                )
            } else {
                format!(
                    "unknown field '{bad}' in the value for '{key}'{}",
                    suggestion_suffix(&bad, expected)
                )
            };
        }
    }
    msg.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Estimator {
        Gae,
        Reinforce,
        Grpo,
        ReinforcePlusPlus,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Algo {
        adv_estimator: Estimator,
        #[serde(default)]
        whiten: bool,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Train {
        learning_rate: f64,
        #[serde(default = "default_batch")]
        batch_size: u32,
        #[serde(default)]
        warmup_steps: Option<u32>,
    }

    fn default_batch() -> u32 {
        8
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Run {
        name: String,
        #[serde(default)]
        seed: Option<u64>,
        actor_train: Train,
        algo: Algo,
        #[serde(default)]
        domains: Vec<String>,
    }

    impl Validate for Run {
        fn validate(&self, problems: &mut Vec<String>) {
            if self.actor_train.learning_rate <= 0.0 || self.actor_train.learning_rate.is_nan() {
                problems.push(format!(
                    "actor_train.learning_rate must be > 0, got '{}'",
                    self.actor_train.learning_rate
                ));
            }
            if self.actor_train.batch_size == 0 {
                problems.push("actor_train.batch_size must be > 0, got '0'".to_string());
            }
            if self.name.is_empty() {
                problems.push("name must not be empty".to_string());
            }
        }
    }

    const GOOD: &str = "\
# a run
name: tiny
actor_train:
  learning_rate: 0.001
algo:
  adv_estimator: grpo
domains: [math, code]
";

    fn err_text<T: std::fmt::Debug>(r: Result<T, ConfigError>) -> String {
        r.expect_err("expected an error").to_string()
    }

    fn ovr(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn good_config_with_defaults() {
        let run: Run = from_yaml_str(GOOD, "good.yaml").unwrap();
        assert_eq!(run.name, "tiny");
        assert_eq!(run.seed, None);
        assert_eq!(run.actor_train.batch_size, 8);
        assert_eq!(run.actor_train.warmup_steps, None);
        assert_eq!(run.algo.adv_estimator, Estimator::Grpo);
        assert!(!run.algo.whiten);
        assert_eq!(run.domains, vec!["math", "code"]);
    }

    #[test]
    fn unknown_nested_key_names_line_parent_and_suggestion() {
        let text = GOOD.replace(
            "  learning_rate: 0.001",
            "  learning_rate: 0.001\n  lerning_rate: 3",
        );
        let msg = err_text(from_yaml_str::<Run>(&text, "configs/x.yaml"));
        assert_eq!(
            msg,
            "config 'configs/x.yaml' line 5: unknown field 'lerning_rate' in 'actor_train' \
             (did you mean 'learning_rate'?)"
        );
    }

    #[test]
    fn unknown_top_level_key() {
        let text = format!("{GOOD}sede: 3\n");
        let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
        assert!(
            msg.starts_with("config 'x.yaml' line 8: unknown field 'sede'"),
            "{msg}"
        );
        assert!(msg.contains("(did you mean 'seed'?)"), "{msg}");
    }

    #[test]
    fn bad_enum_value_lists_choices_and_suggests() {
        let text = GOOD.replace("adv_estimator: grpo", "adv_estimator: gpro");
        let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
        assert!(
            msg.starts_with(
                "config 'x.yaml' line 6: invalid value 'gpro' for 'algo.adv_estimator'"
            ),
            "{msg}"
        );
        assert!(
            msg.contains("expected one of: gae, reinforce, grpo, reinforce_plus_plus"),
            "{msg}"
        );
        assert!(msg.contains("did you mean 'grpo'?"), "{msg}");
    }

    #[test]
    fn wrong_type_and_missing_field() {
        let text = GOOD.replace("learning_rate: 0.001", "learning_rate: fast");
        let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
        assert!(msg.starts_with("config 'x.yaml' line 4: "), "{msg}");
        assert!(msg.contains("'actor_train.learning_rate'"), "{msg}");
        assert!(msg.contains("fast"), "{msg}");

        let text = GOOD.replace("name: tiny\n", "");
        let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
        assert_eq!(
            msg,
            "config 'x.yaml' line 6: missing field 'name' at the top level"
        );
    }

    #[test]
    fn scalar_errors_quote_the_value() {
        let cases = [
            (
                "learning_rate: 0.001",
                "learning_rate: 0.001\n  batch_size: -3",
                "line 5: invalid value '-3' for 'actor_train.batch_size', expected a non-negative \
                 integer that fits u32",
            ),
            (
                "adv_estimator: grpo",
                "adv_estimator: grpo\n  whiten: yes  # typo",
                "line 7: invalid value 'yes' for 'algo.whiten', expected true or false",
            ),
            (
                "name: tiny",
                "name: ~",
                "line 2: invalid value null for 'name', expected a string",
            ),
            (
                "algo:\n  adv_estimator: grpo",
                "algo:\n  whiten: false",
                "line 6: missing field 'adv_estimator' in 'algo'",
            ),
            (
                "actor_train:\n  learning_rate: 0.001",
                "actor_train: 3",
                "line 3: expected mapping start (at 'actor_train', found '3')",
            ),
        ];
        for (from, to, want) in cases {
            let text = GOOD.replace(from, to);
            let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
            assert_eq!(msg, format!("config 'x.yaml' {want}"));
        }
    }

    #[test]
    fn yaml_syntax_error_names_file_and_line() {
        let msg = err_text(from_yaml_str::<Run>("name: [tiny\nalgo: {", "broken.yaml"));
        assert!(msg.starts_with("config 'broken.yaml'"), "{msg}");
    }

    #[test]
    fn duplicate_key_is_an_error() {
        let text = format!("{GOOD}name: again\n");
        let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
        assert!(msg.starts_with("config 'x.yaml' line 8:"), "{msg}");
    }

    #[test]
    fn unreadable_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.yaml");
        let msg = err_text(load_yaml::<Run>(&path, &[]));
        assert!(
            msg.starts_with(&format!("config '{}': cannot read: ", path.display())),
            "{msg}"
        );
    }

    #[test]
    fn overrides_set_nested_scalars_enums_bools_lists_and_null() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.yaml");
        std::fs::write(&path, GOOD).unwrap();
        let run: Run = load_yaml(
            &path,
            &ovr(&[
                "actor_train.learning_rate=0.5",
                "actor_train.batch_size=3",
                "actor_train.warmup_steps=10",
                "algo.adv_estimator=reinforce_plus_plus",
                "algo.whiten=true",
                "seed=7",
                "domains=[a, b, c]",
                "name=123",
            ]),
        )
        .unwrap();
        assert_eq!(run.actor_train.learning_rate, 0.5);
        assert_eq!(run.actor_train.batch_size, 3);
        assert_eq!(run.actor_train.warmup_steps, Some(10));
        assert_eq!(run.algo.adv_estimator, Estimator::ReinforcePlusPlus);
        assert!(run.algo.whiten);
        assert_eq!(run.seed, Some(7));
        assert_eq!(run.domains, vec!["a", "b", "c"]);
        // A bare number given to a string field is its text.
        assert_eq!(run.name, "123");

        let run: Run = load_yaml(
            &path,
            &ovr(&[
                "actor_train.warmup_steps=null",
                "name='quoted'",
                "domains.1=prose",
                "actor_train.learning_rate=1e-6",
            ]),
        )
        .unwrap();
        assert_eq!(run.actor_train.warmup_steps, None);
        assert_eq!(run.name, "quoted");
        assert_eq!(run.domains, vec!["math", "prose"]);
        assert_eq!(run.actor_train.learning_rate, 1e-6);
    }

    #[test]
    fn override_errors_name_the_override() {
        let run: Run = from_yaml_str(GOOD, "x.yaml").unwrap();

        let msg = err_text(apply_overrides(
            run.clone(),
            &ovr(&["actor_train.lerning_rate=1"]),
        ));
        assert_eq!(
            msg,
            "override 'actor_train.lerning_rate=1': unknown key 'lerning_rate' in 'actor_train' \
             (did you mean 'learning_rate'?)"
        );

        let msg = err_text(apply_overrides(
            run.clone(),
            &ovr(&["trian.learning_rate=1"]),
        ));
        assert!(msg.contains("unknown key 'trian' (known keys: "), "{msg}");

        let msg = err_text(apply_overrides(
            run.clone(),
            &ovr(&["actor_train.learning_rate=abc"]),
        ));
        assert!(
            msg.starts_with("override 'actor_train.learning_rate=abc': "),
            "{msg}"
        );
        assert!(msg.contains("abc"), "{msg}");

        let msg = err_text(apply_overrides(
            run.clone(),
            &ovr(&["algo.adv_estimator=gpro"]),
        ));
        assert!(
            msg.starts_with(
                "override 'algo.adv_estimator=gpro': invalid value 'gpro' for 'algo.adv_estimator' \
                 (expected one of: gae, reinforce, grpo, reinforce_plus_plus; did you mean 'grpo'?)"
            ),
            "{msg}"
        );

        let msg = err_text(apply_overrides(run.clone(), &ovr(&["name.first=x"])));
        assert!(msg.contains("'name' is a string, not a section"), "{msg}");

        let msg = err_text(apply_overrides(run.clone(), &ovr(&["seed"])));
        assert!(msg.contains("expected 'key.sub=value'"), "{msg}");

        let msg = err_text(apply_overrides(run, &ovr(&["seed="])));
        assert!(msg.contains("missing value"), "{msg}");
    }

    #[test]
    fn validation_reports_every_problem() {
        let text = GOOD
            .replace("learning_rate: 0.001", "learning_rate: -1\n  batch_size: 0")
            .replace("name: tiny", "name: ''");
        let run: Run = from_yaml_str(&text, "x.yaml").unwrap();
        let msg = err_text(validated(run, "x.yaml"));
        assert_eq!(
            msg,
            "config 'x.yaml' is invalid:\n  \
             - actor_train.learning_rate must be > 0, got '-1'\n  \
             - actor_train.batch_size must be > 0, got '0'\n  \
             - name must not be empty"
        );
        let ok: Run = from_yaml_str(GOOD, "x.yaml").unwrap();
        assert!(validated(ok, "x.yaml").is_ok());
    }

    #[test]
    fn context_heuristic_handles_lists() {
        let text = "a:\n  items:\n    - name: x\n      sub:\n        k: 1\n";
        assert_eq!(
            yaml_context(text, 5),
            (
                Some("k".to_string()),
                vec!["a".into(), "items".into(), "sub".into()]
            )
        );
        assert_eq!(
            yaml_context(text, 3),
            (Some("name".to_string()), vec!["a".into(), "items".into()])
        );
    }
}
