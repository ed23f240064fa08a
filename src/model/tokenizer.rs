//! Tokenizers and chat templates for local Hugging Face model directories.
//!
//! Owns reading and writing `tokenizer.json` / `tokenizer_config.json` / `generation_config.json` and
//! building the tiny character-level tokenizers our tests and quickstart tasks train on; rendering chat
//! templates lives in [`super::chat_template`] (re-exported here). It must not download anything: every
//! path is a local directory.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

pub use super::chat_template::{ChatMessage, render_chat};

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

impl TokenizerFiles {
    /// The special tokens by the names chat templates read them by (unset ones `None`).
    pub fn template_tokens(&self) -> [(&'static str, Option<&str>); 3] {
        [
            ("bos_token", self.bos_token.as_deref()),
            ("eos_token", self.eos_token.as_deref()),
            ("pad_token", self.pad_token.as_deref()),
        ]
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::chat_template::tests::QWEN25_TEMPLATE;

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
