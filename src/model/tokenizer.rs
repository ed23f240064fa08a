//! Tokenizers and chat templates for local Hugging Face model directories.
//!
//! Owns reading and writing `tokenizer.json` / `tokenizer_config.json` / `generation_config.json`, building
//! the tiny character-level tokenizers our tests and quickstart tasks train on, and rendering Jinja chat
//! templates the way `transformers`' `apply_chat_template` does (trim_blocks, lstrip_blocks,
//! `raise_exception`, `strftime_now`, `tojson` and the common Python string/dict methods). It must not
//! download anything: every path is a local directory.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind, State, Value};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// Errors at the tokenizer-files boundary; messages name the file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer '{path}': cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("tokenizer '{path}': cannot write: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file exists but its content is not what Hugging Face writes.
    #[error("tokenizer '{path}': {message}")]
    Invalid { path: String, message: String },
    /// Building or using a tokenizer in memory failed.
    #[error("tokenizer: {0}")]
    Build(String),
    /// A chat template failed to compile or render (including its own `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
}

/// The tokenizer of a model directory plus what `tokenizer_config.json` says about it.
#[derive(Debug, Clone)]
pub struct TokenizerFiles {
    pub tokenizer: Tokenizer,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
}

/// One turn of a conversation, as chat templates see it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A character-level tokenizer: ids `0..specials.len()` are the specials in order, then one id per
/// character of `chars` in order. Specials are registered as special tokens (matched whole in text,
/// dropped by `decode(.., true)`); if one of them is `<unk>`, characters outside the vocabulary map to it,
/// otherwise encoding them fails.
pub fn build_char_tokenizer(chars: &str, specials: &[&str]) -> Result<Tokenizer, TokenizerError> {
    let mut seen = HashSet::new();
    let mut vocab = Vec::new();
    let pieces = specials
        .iter()
        .map(|s| s.to_string())
        .chain(chars.chars().map(String::from));
    for piece in pieces {
        if piece.is_empty() {
            return Err(TokenizerError::Build("empty special token".to_string()));
        }
        if !seen.insert(piece.clone()) {
            return Err(TokenizerError::Build(format!(
                "'{piece}' appears twice in the vocabulary"
            )));
        }
        let id = u32::try_from(vocab.len()).map_err(|e| TokenizerError::Build(e.to_string()))?;
        vocab.push((piece, id));
    }
    let mut model = WordLevel::builder().vocab(vocab.into_iter().collect());
    if specials.contains(&"<unk>") {
        model = model.unk_token("<unk>".to_string());
    }
    let model = model.build().map_err(build_err)?;
    // `[\s\S]` isolates every character, newlines included, and is valid for both Oniguruma (Python
    // `tokenizers`) and fancy-regex (ours), so the saved file loads in either.
    let split = Split::new(
        SplitPattern::Regex(r"[\s\S]".to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(build_err)?;
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(split));
    // Fuse concatenates tokens on decode; without it WordLevel joins them with spaces.
    tokenizer.with_decoder(Some(Fuse::new()));
    tokenizer
        .add_special_tokens(specials.iter().map(|s| AddedToken::from(*s, true)))
        .map_err(build_err)?;
    Ok(tokenizer)
}

fn build_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Build(e.to_string())
}

fn path_str(path: &Path) -> String {
    path.display().to_string()
}

/// Reads a file, `None` if it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, TokenizerError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizerError::Read {
            path: path_str(path),
            source,
        }),
    }
}

fn parse_json(path: &Path, text: &str) -> Result<Json, TokenizerError> {
    serde_json::from_str(text).map_err(|e| TokenizerError::Invalid {
        path: path_str(path),
        message: format!("not valid JSON: {e}"),
    })
}

/// Loads `tokenizer.json` (required) and `tokenizer_config.json` (optional) from a model directory. A chat
/// template missing from the config is looked for in `chat_template.jinja` and `chat_template.json`, where
/// newer `transformers` versions save it.
pub fn load_tokenizer_dir(dir: &Path) -> Result<TokenizerFiles, TokenizerError> {
    let tok_path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&tok_path).map_err(|source| TokenizerError::Read {
        path: path_str(&tok_path),
        source,
    })?;
    let tokenizer: Tokenizer = text.parse().map_err(|e| TokenizerError::Invalid {
        path: path_str(&tok_path),
        message: format!("{e}"),
    })?;

    let cfg_path = dir.join("tokenizer_config.json");
    let cfg = match read_optional(&cfg_path)? {
        Some(text) => parse_json(&cfg_path, &text)?,
        None => Json::Null,
    };
    if !(cfg.is_object() || cfg.is_null()) {
        return Err(invalid(&cfg_path, "expected a JSON object"));
    }
    let mut chat_template = template_field(&cfg_path, cfg.get("chat_template"))?;
    if chat_template.is_none() {
        chat_template = read_optional(&dir.join("chat_template.jinja"))?;
    }
    if chat_template.is_none() {
        let path = dir.join("chat_template.json");
        if let Some(text) = read_optional(&path)? {
            chat_template = template_field(&path, parse_json(&path, &text)?.get("chat_template"))?;
        }
    }
    Ok(TokenizerFiles {
        tokenizer,
        chat_template,
        bos_token: token_field(&cfg_path, &cfg, "bos_token")?,
        eos_token: token_field(&cfg_path, &cfg, "eos_token")?,
        pad_token: token_field(&cfg_path, &cfg, "pad_token")?,
    })
}

fn invalid(path: &Path, message: impl Into<String>) -> TokenizerError {
    TokenizerError::Invalid {
        path: path_str(path),
        message: message.into(),
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which we take "default" (or the only
/// one).
fn template_field(path: &Path, value: Option<&Json>) -> Result<Option<String>, TokenizerError> {
    match value {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(items)) => {
            let named = |name: &str| {
                items
                    .iter()
                    .find(|i| i.get("name").and_then(Json::as_str) == Some(name))
            };
            let chosen = named("default").or(if items.len() == 1 {
                items.first()
            } else {
                None
            });
            match chosen.map(|i| i.get("template")) {
                None => Ok(None),
                Some(Some(Json::String(s))) => Ok(Some(s.clone())),
                Some(_) => Err(invalid(
                    path,
                    "'chat_template' entry has no string 'template'",
                )),
            }
        }
        Some(_) => Err(invalid(path, "'chat_template' must be a string or a list")),
    }
}

/// A special token is a string or an `AddedToken` object `{"content": ..., ...}`.
fn token_field(path: &Path, cfg: &Json, key: &str) -> Result<Option<String>, TokenizerError> {
    match cfg.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(obj @ Json::Object(_)) => match obj.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err(invalid(path, format!("'{key}' has no string 'content'"))),
        },
        Some(other) => Err(invalid(
            path,
            format!("'{key}' must be a string, got {other}"),
        )),
    }
}

/// Writes `tokenizer.json` and a `tokenizer_config.json` that `AutoTokenizer.from_pretrained` loads as a
/// `PreTrainedTokenizerFast`. Creates `dir` if needed.
pub fn save_tokenizer_dir(dir: &Path, files: &TokenizerFiles) -> Result<(), TokenizerError> {
    std::fs::create_dir_all(dir).map_err(|source| TokenizerError::Write {
        path: path_str(dir),
        source,
    })?;
    let tok_path = dir.join("tokenizer.json");
    let text = files.tokenizer.to_string(true).map_err(build_err)?;
    write_file(&tok_path, &text)?;

    let mut cfg = serde_json::Map::new();
    cfg.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());
    // Our tokenizers are exact; transformers' clean-up would rewrite " ." to ".".
    cfg.insert("clean_up_tokenization_spaces".into(), false.into());
    for (key, value) in [
        ("bos_token", &files.bos_token),
        ("eos_token", &files.eos_token),
        ("pad_token", &files.pad_token),
        ("chat_template", &files.chat_template),
    ] {
        if let Some(v) = value {
            cfg.insert(key.into(), v.clone().into());
        }
    }
    // Without an explicit unk token, transformers >= 5 (which rebuilds qwen2 tokenizers from the vocab)
    // adds its default '<|endoftext|>' as an extra id that the model has no embedding for.
    if files.tokenizer.token_to_id("<unk>").is_some() {
        cfg.insert("unk_token".into(), "<unk>".into());
    }
    let cfg_path = dir.join("tokenizer_config.json");
    let text = serde_json::to_string_pretty(&Json::Object(cfg)).map_err(build_err)?;
    write_file(&cfg_path, &text)
}

fn write_file(path: &PathBuf, text: &str) -> Result<(), TokenizerError> {
    std::fs::write(path, text).map_err(|source| TokenizerError::Write {
        path: path_str(path),
        source,
    })
}

/// The end-of-sequence ids from `generation_config.json` (`eos_token_id`: an int or a list). No file or
/// no key gives an empty list.
pub fn read_generation_eos(dir: &Path) -> Result<Vec<u32>, TokenizerError> {
    let path = dir.join("generation_config.json");
    let Some(text) = read_optional(&path)? else {
        return Ok(Vec::new());
    };
    let cfg = parse_json(&path, &text)?;
    let as_id = |v: &Json| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| invalid(&path, format!("'eos_token_id' has a bad id {v}")))
    };
    match cfg.get("eos_token_id") {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => items.iter().map(as_id).collect(),
        Some(v) => Ok(vec![as_id(v)?]),
    }
}

/// Renders a Hugging Face chat template with `messages`, `add_generation_prompt`, `bos_token` and
/// `eos_token` (left undefined when `None`, as transformers does for unset tokens).
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos: Option<&str>,
    eos: Option<&str>,
) -> Result<String, TokenizerError> {
    let mut env = Environment::new();
    // transformers compiles templates with trim_blocks and lstrip_blocks.
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| TokenizerError::Template(e.to_string()))?;
    env.set_syntax(syntax);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function("strftime_now", |fmt: String| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        strftime(i64::try_from(secs).unwrap_or(0), &fmt)
    });
    env.add_filter("tojson", tojson);
    env.set_unknown_method_callback(py_method);

    let messages: Vec<Value> = messages
        .iter()
        .map(|m| {
            Value::from_pairs([
                ("role", Value::from(m.role.as_str())),
                ("content", Value::from(m.content.as_str())),
            ])
        })
        .collect();
    let mut ctx = vec![
        ("messages", Value::from(messages)),
        ("add_generation_prompt", Value::from(add_generation_prompt)),
    ];
    if let Some(bos) = bos {
        ctx.push(("bos_token", Value::from(bos)));
    }
    if let Some(eos) = eos {
        ctx.push(("eos_token", Value::from(eos)));
    }
    let tmpl = env
        .template_from_str(template)
        .map_err(|e| TokenizerError::Template(e.to_string()))?;
    tmpl.render(Value::from_pairs(ctx))
        .map_err(|e| TokenizerError::Template(e.to_string()))
}

/// `strftime` for UTC seconds since the epoch, with the directives chat templates use.
fn strftime(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    // Civil-from-days (H. Hinnant): proleptic Gregorian calendar from days since 1970-01-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let month_name = MONTHS[(month - 1) as usize];
    let (hour, minute, second) = (tod / 3600, tod % 3600 / 60, tod % 60);

    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match it.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('B') => write!(out, "{month_name}"),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('j') => write!(out, "{:03}", doy_in_year(year, month, day)),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

fn doy_in_year(year: i64, month: i64, day: i64) -> i64 {
    const CUMULATIVE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    CUMULATIVE[(month - 1) as usize] + day + i64::from(leap && month > 2)
}

/// Jinja2's `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent)`.
/// Map keys come out sorted (minijinja's maps are ordered by key).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted for compatibility; ordering is already by key and output is never ASCII-escaped.
    let _: Option<Value> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    v: &Value,
    indent: Option<usize>,
    level: usize,
    out: &mut String,
) -> Result<(), JinjaError> {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => match v.as_i64() {
            Some(i) if v.is_integer() => {
                let _ = write!(out, "{i}");
            }
            _ => {
                let f = f64::try_from(v.clone())?;
                match serde_json::Number::from_f64(f) {
                    Some(n) => out.push_str(&n.to_string()),
                    None => out.push_str(if f.is_nan() { "NaN" } else { "Infinity" }),
                }
            }
        },
        ValueKind::String => {
            let s = serde_json::to_string(v.as_str().unwrap_or_default())
                .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, e.to_string()))?;
            out.push_str(&s);
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                write_json(&Value::from(key.to_string()), None, 0, out)?;
                out.push_str(": ");
                write_json(&v.get_item(key)?, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                write_json(item, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        other => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                format!("cannot convert {other} to JSON"),
            ));
        }
    }
    Ok(())
}

/// The Python `str` and `dict` methods HF templates call (`content.strip()`, `s.startswith(..)`,
/// `d.items()`), which minijinja leaves to the embedder.
fn py_method(
    _state: &mut State,
    value: &Value,
    name: &str,
    args: &[Value],
) -> Result<Value, JinjaError> {
    let arg_str = |i: usize| args.get(i).and_then(Value::as_str);
    if let Some(s) = value.as_str() {
        let set = arg_str(0);
        let trim = |c: char| set.map_or(c.is_whitespace(), |set| set.contains(c));
        let affix = |check: &dyn Fn(&str) -> bool| -> Result<bool, JinjaError> {
            match args.first() {
                Some(a) if a.kind() == ValueKind::Seq => {
                    Ok(a.try_iter()?.any(|p| p.as_str().is_some_and(check)))
                }
                Some(a) => Ok(a.as_str().is_some_and(check)),
                None => Err(JinjaError::from(ErrorKind::MissingArgument)),
            }
        };
        return Ok(match name {
            "strip" => s.trim_matches(trim).into(),
            "lstrip" => s.trim_start_matches(trim).into(),
            "rstrip" => s.trim_end_matches(trim).into(),
            "startswith" => affix(&|p| s.starts_with(p))?.into(),
            "endswith" => affix(&|p| s.ends_with(p))?.into(),
            "upper" => s.to_uppercase().into(),
            "lower" => s.to_lowercase().into(),
            "replace" => match (arg_str(0), arg_str(1)) {
                (Some(from), Some(to)) => s.replace(from, to).into(),
                _ => return Err(JinjaError::from(ErrorKind::MissingArgument)),
            },
            "split" => {
                let max = args.get(1).and_then(Value::as_i64).filter(|m| *m >= 0);
                let parts: Vec<Value> = match (arg_str(0), max) {
                    (Some(sep), Some(m)) => {
                        s.splitn(m as usize + 1, sep).map(Value::from).collect()
                    }
                    (Some(sep), None) => s.split(sep).map(Value::from).collect(),
                    (None, _) => s.split_whitespace().map(Value::from).collect(),
                };
                parts.into()
            }
            "find" => match arg_str(0).and_then(|p| s.find(p)) {
                Some(byte) => Value::from(s[..byte].chars().count()),
                None => Value::from(-1),
            },
            "count" => match arg_str(0) {
                Some(p) if !p.is_empty() => Value::from(s.matches(p).count()),
                _ => return Err(JinjaError::from(ErrorKind::MissingArgument)),
            },
            "join" => {
                let items: Vec<String> = match args.first() {
                    Some(a) => a.try_iter()?.map(|v| v.to_string()).collect(),
                    None => return Err(JinjaError::from(ErrorKind::MissingArgument)),
                };
                items.join(s).into()
            }
            "isdigit" => (!s.is_empty() && s.chars().all(|c| c.is_ascii_digit())).into(),
            "isspace" => (!s.is_empty() && s.chars().all(char::is_whitespace)).into(),
            _ => return Err(JinjaError::from(ErrorKind::UnknownMethod)),
        });
    }
    if value.kind() == ValueKind::Map {
        let keys = || -> Result<Vec<Value>, JinjaError> { Ok(value.try_iter()?.collect()) };
        return Ok(match name {
            "keys" => keys()?.into(),
            "values" => keys()?
                .iter()
                .map(|k| value.get_item(k))
                .collect::<Result<Vec<_>, _>>()?
                .into(),
            "items" => keys()?
                .into_iter()
                .map(|k| {
                    let v = value.get_item(&k)?;
                    Ok(Value::from(vec![k, v]))
                })
                .collect::<Result<Vec<_>, JinjaError>>()?
                .into(),
            "get" => {
                let key = args
                    .first()
                    .ok_or_else(|| JinjaError::from(ErrorKind::MissingArgument))?;
                match value.get_item(key)? {
                    v if v.is_undefined() => args.get(1).cloned().unwrap_or(Value::from(())),
                    v => v,
                }
            }
            _ => return Err(JinjaError::from(ErrorKind::UnknownMethod)),
        });
    }
    Err(JinjaError::from(ErrorKind::UnknownMethod))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen2.5-Instruct's chat template, verbatim from its `tokenizer_config.json`.
    const QWEN25_TEMPLATE: &str = r###"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"###;

    const CHARS: &str = "abc+1 \n";
    const SPECIALS: [&str; 4] = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"];

    fn ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
        tok.encode(text, false).unwrap().get_ids().to_vec()
    }

    #[test]
    fn char_tokenizer_ids_follow_specials_then_chars() {
        let tok = build_char_tokenizer(CHARS, &SPECIALS).unwrap();
        assert_eq!(tok.get_vocab_size(true), 4 + 7);
        // specials 0..4, then a=4 b=5 c=6 +=7 1=8 ' '=9 '\n'=10
        assert_eq!(ids(&tok, "ab+1"), vec![4, 5, 7, 8]);
        assert_eq!(ids(&tok, "a b\nc"), vec![4, 9, 5, 10, 6]);
        assert_eq!(tok.decode(&[4, 5, 7, 8], true).unwrap(), "ab+1");
        assert_eq!(tok.decode(&[4, 9, 5, 10, 6], false).unwrap(), "a b\nc");
    }

    #[test]
    fn char_tokenizer_specials_are_whole_tokens_and_skippable() {
        let tok = build_char_tokenizer(CHARS, &SPECIALS).unwrap();
        let got = ids(&tok, "<|im_start|>a<|im_end|>");
        assert_eq!(got, vec![2, 4, 3]);
        assert_eq!(tok.decode(&got, true).unwrap(), "a");
        assert_eq!(tok.decode(&got, false).unwrap(), "<|im_start|>a<|im_end|>");
        assert_eq!(tok.token_to_id("<pad>"), Some(0));
    }

    #[test]
    fn char_tokenizer_unknown_chars() {
        let tok = build_char_tokenizer(CHARS, &SPECIALS).unwrap();
        assert_eq!(ids(&tok, "azb"), vec![4, 1, 5]);
        // Without an `<unk>` special an unknown character cannot be encoded.
        let strict = build_char_tokenizer("ab", &["<pad>"]).unwrap();
        assert!(strict.encode("az", false).is_err());
        let err = build_char_tokenizer("aba", &[]).unwrap_err().to_string();
        assert_eq!(err, "tokenizer: 'a' appears twice in the vocabulary");
    }

    fn files_with(template: Option<&str>) -> TokenizerFiles {
        TokenizerFiles {
            tokenizer: build_char_tokenizer(CHARS, &SPECIALS).unwrap(),
            chat_template: template.map(str::to_string),
            bos_token: None,
            eos_token: Some("<|im_end|>".to_string()),
            pad_token: Some("<pad>".to_string()),
        }
    }

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let model_dir = dir.path().join("tiny");
        save_tokenizer_dir(&model_dir, &files_with(Some(QWEN25_TEMPLATE))).unwrap();
        let cfg: Json = serde_json::from_str(
            &std::fs::read_to_string(model_dir.join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(cfg["tokenizer_class"], "PreTrainedTokenizerFast");
        assert_eq!(cfg["eos_token"], "<|im_end|>");

        let loaded = load_tokenizer_dir(&model_dir).unwrap();
        assert_eq!(loaded.chat_template.as_deref(), Some(QWEN25_TEMPLATE));
        assert_eq!(loaded.bos_token, None);
        assert_eq!(loaded.eos_token.as_deref(), Some("<|im_end|>"));
        assert_eq!(loaded.pad_token.as_deref(), Some("<pad>"));
        let text = "<|im_start|>a+b\n1 c<|im_end|>";
        let original = build_char_tokenizer(CHARS, &SPECIALS).unwrap();
        assert_eq!(ids(&loaded.tokenizer, text), ids(&original, text));
        assert_eq!(ids(&loaded.tokenizer, "azb"), vec![4, 1, 5]);
        let decoded = loaded
            .tokenizer
            .decode(&ids(&original, text), true)
            .unwrap();
        assert_eq!(decoded, "a+b\n1 c");
    }

    #[test]
    fn load_reads_hf_config_variants() {
        let dir = tempfile::tempdir().unwrap();
        save_tokenizer_dir(dir.path(), &files_with(None)).unwrap();
        let cfg = serde_json::json!({
            "tokenizer_class": "Qwen2Tokenizer",
            "bos_token": {"content": "<|im_start|>", "lstrip": false, "special": true},
            "eos_token": {"__type": "AddedToken", "content": "<|im_end|>"},
            "pad_token": null,
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "{{ messages[0].content }}"}
            ]
        });
        std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let loaded = load_tokenizer_dir(dir.path()).unwrap();
        assert_eq!(loaded.bos_token.as_deref(), Some("<|im_start|>"));
        assert_eq!(loaded.eos_token.as_deref(), Some("<|im_end|>"));
        assert_eq!(loaded.pad_token, None);
        assert_eq!(
            loaded.chat_template.as_deref(),
            Some("{{ messages[0].content }}")
        );

        // No config at all: just the tokenizer; a template in chat_template.jinja is still found.
        std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
        std::fs::write(dir.path().join("chat_template.jinja"), "T").unwrap();
        let loaded = load_tokenizer_dir(dir.path()).unwrap();
        assert_eq!(loaded.chat_template.as_deref(), Some("T"));
        assert_eq!(loaded.eos_token, None);

        std::fs::write(dir.path().join("tokenizer_config.json"), "{nope").unwrap();
        let err = load_tokenizer_dir(dir.path()).unwrap_err().to_string();
        let path = dir.path().join("tokenizer_config.json");
        assert!(
            err.starts_with(&format!("tokenizer '{}': not valid JSON", path.display())),
            "{err}"
        );
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_tokenizer_dir(dir.path()).unwrap_err().to_string();
        let path = dir.path().join("tokenizer.json");
        assert!(
            err.starts_with(&format!("tokenizer '{}': cannot read: ", path.display())),
            "{err}"
        );
        std::fs::write(&path, "{}").unwrap();
        let err = load_tokenizer_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("tokenizer '{}': ", path.display())),
            "{err}"
        );
    }

    #[test]
    fn qwen25_template_renders_exactly() {
        // Expected strings produced by Python jinja2 3.1 with trim_blocks/lstrip_blocks, as transformers.
        let user = [ChatMessage::new("user", "What is 2+3?")];
        let text = render_chat(QWEN25_TEMPLATE, &user, true, None, Some("<|im_end|>")).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
             assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
        );
        let convo = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello!"),
            ChatMessage::new("tool", "42"),
        ];
        let text = render_chat(QWEN25_TEMPLATE, &convo, false, None, None).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n\
             </tool_response><|im_end|>\n"
        );
    }

    #[test]
    fn template_tokens_and_raise_exception() {
        let t = "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}\
                 {{ raise_exception('role ' + m.role + ' is not supported') }}{% endif %}\
                 {{ m.content }}{{ eos_token }}{% endfor %}";
        let msgs = [ChatMessage::new("user", "x")];
        assert_eq!(
            render_chat(t, &msgs, false, Some("<s>"), Some("</s>")).unwrap(),
            "<s>x</s>"
        );
        assert_eq!(render_chat(t, &msgs, false, None, None).unwrap(), "x");
        let err = render_chat(t, &[ChatMessage::new("tool", "y")], false, None, None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("chat template: "), "{err}");
        assert!(err.contains("role tool is not supported"), "{err}");
        let err = render_chat("{% if %}", &msgs, false, None, None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("chat template: "), "{err}");
    }

    #[test]
    fn python_methods_and_tojson() {
        let t = "{% for m in messages %}[{{ m.content.split('</think>')[-1].lstrip('\\n').strip() }}|\
                 {{ m.role.startswith(('us', 'sy')) }}|{{ m.content.endswith('!') }}|\
                 {{ m.content.replace('!', '?').upper() }}|{{ m.get('role', 'none') }}|{{ m.get('x', 'none') }}]\
                 {% endfor %}{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}";
        let msgs = [ChatMessage::new("user", "<think>hm</think>\n  hi there !")];
        assert_eq!(
            render_chat(t, &msgs, false, None, None).unwrap(),
            "[hi there !|True|True|<THINK>HM</THINK>\n  HI THERE ?|user|none]a=1;b=2;"
        );
        // Expected from Python: json.dumps(x, ensure_ascii=False) and with indent=2.
        let t = "{% set x = {'a': [1, 2.5, 'é\\n'], 'b': {'c': none, 'd': true}, 'e': []} %}\
                 {{ x | tojson }}|{{ x | tojson(indent=2) }}";
        assert_eq!(
            render_chat(t, &[], false, None, None).unwrap(),
            "{\"a\": [1, 2.5, \"é\\n\"], \"b\": {\"c\": null, \"d\": true}, \"e\": []}|\
             {\n  \"a\": [\n    1,\n    2.5,\n    \"é\\n\"\n  ],\n  \"b\": {\n    \"c\": null,\n    \
             \"d\": true\n  },\n  \"e\": []\n}"
        );
    }

    #[test]
    fn strftime_matches_python() {
        // time.strftime("%d %b %Y %A %j %I%p %H:%M:%S %y %e", time.gmtime(1721995199))
        assert_eq!(
            strftime(1_721_995_199, "%d %b %Y %A %j %I%p %H:%M:%S %y %e"),
            "26 Jul 2024 Friday 208 11AM 11:59:59 24 26"
        );
        assert_eq!(strftime(0, "%Y-%m-%d %a %%"), "1970-01-01 Thu %");
        let msgs = [ChatMessage::new("user", "x")];
        let today = render_chat("{{ strftime_now('%Y') }}", &msgs, false, None, None).unwrap();
        assert_eq!(today.len(), 4);
    }

    #[test]
    fn generation_eos_int_list_or_absent() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_generation_eos(dir.path()).unwrap(), Vec::<u32>::new());
        let path = dir.path().join("generation_config.json");
        std::fs::write(&path, r#"{"eos_token_id": 151645}"#).unwrap();
        assert_eq!(read_generation_eos(dir.path()).unwrap(), vec![151645]);
        std::fs::write(&path, r#"{"eos_token_id": [151645, 151643], "top_p": 0.8}"#).unwrap();
        assert_eq!(
            read_generation_eos(dir.path()).unwrap(),
            vec![151645, 151643]
        );
        std::fs::write(&path, r#"{"top_p": 0.8}"#).unwrap();
        assert_eq!(read_generation_eos(dir.path()).unwrap(), Vec::<u32>::new());
        std::fs::write(&path, r#"{"eos_token_id": "x"}"#).unwrap();
        let err = read_generation_eos(dir.path()).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("tokenizer '{}': ", path.display())),
            "{err}"
        );
    }
}
