//! Chat templates: renders Hugging Face Jinja chat templates the way `transformers`'
//! `apply_chat_template(tokenize=False)` does: trim_blocks and lstrip_blocks, `messages`, `tools` and
//! `documents` (`none` when not given), `add_generation_prompt`, the tokenizer's special tokens, then
//! the caller's template options (`enable_thinking`, `date_string`, …), which win over the tokens as
//! transformers' keyword arguments do. Maps keep their order (`tojson` of a tool writes its keys as
//! the tool's author wrote them). The Python builtins templates call live in [`python`].

mod python;

use minijinja::value::Serde;
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use super::tokenizer::TokenizerError;
use python::{py_method, strftime, tojson};

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

/// Names the renderer sets itself, which an option may not replace.
const RESERVED: [&str; 3] = ["messages", "add_generation_prompt", "documents"];

/// Variables passed to a chat template beside the messages, as `apply_chat_template`'s keyword
/// arguments: `enable_thinking: false` for Qwen3, `tools` (a list of JSON-schema function
/// descriptions), `date_string` for Llama 3, or whatever else a template reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(try_from = "Map<String, Json>", into = "Map<String, Json>")]
pub struct TemplateOptions(Map<String, Json>);

impl TemplateOptions {
    /// No options, for callers that have no config to take them from.
    pub fn none() -> &'static TemplateOptions {
        static NONE: std::sync::LazyLock<TemplateOptions> =
            std::sync::LazyLock::new(TemplateOptions::default);
        &NONE
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets one option, checked as a config's would be.
    pub fn set(&mut self, name: &str, value: Json) -> Result<(), String> {
        check_option(name, &value)?;
        self.0.insert(name.to_string(), value);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Json> {
        self.0.get(name)
    }
}

fn check_option(name: &str, value: &Json) -> Result<(), String> {
    if RESERVED.contains(&name) {
        return Err(format!(
            "chat template option '{name}' is set by roll-tui itself and cannot be given"
        ));
    }
    if name == "tools" && !matches!(value, Json::Null | Json::Array(_)) {
        return Err(
            "chat template option 'tools' must be a list of tool (function) descriptions".into(),
        );
    }
    Ok(())
}

impl TryFrom<Map<String, Json>> for TemplateOptions {
    type Error = String;

    fn try_from(map: Map<String, Json>) -> Result<Self, String> {
        for (name, value) in &map {
            check_option(name, value)?;
        }
        Ok(Self(map))
    }
}

impl From<TemplateOptions> for Map<String, Json> {
    fn from(options: TemplateOptions) -> Self {
        options.0
    }
}

/// A template with what it renders with besides the messages.
#[derive(Clone, Copy, Debug)]
pub struct ChatRender<'a> {
    pub template: &'a str,
    /// The tokenizer's special tokens by their template names (`bos_token`, `eos_token`, …); an
    /// unset token is left undefined, as transformers leaves it.
    pub tokens: &'a [(&'a str, Option<&'a str>)],
    pub options: &'a TemplateOptions,
}

impl ChatRender<'_> {
    /// The text of `messages` (anything that serializes as a list of message objects: role,
    /// content, tool_calls, reasoning_content, …).
    pub fn render<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template_error = |e: JinjaError| TokenizerError::Template(render_error(&e));
        let env = environment()?;
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from(Serde(messages))),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        for (name, token) in self.tokens {
            if let Some(token) = token {
                ctx.push((name, Value::from(*token)));
            }
        }
        for (name, value) in &self.options.0 {
            ctx.retain(|(n, _)| n != name);
            ctx.push((name, Value::from(Serde(value))));
        }
        let tmpl = env
            .template_from_str(self.template)
            .map_err(template_error)?;
        tmpl.render(Value::from_pairs(ctx)).map_err(template_error)
    }
}

/// A minijinja error with its cause chain, which is where a template's own message sits.
fn render_error(e: &JinjaError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn environment() -> Result<Environment<'static>, TokenizerError> {
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
    Ok(env)
}

/// Renders a Hugging Face chat template with `messages`, `add_generation_prompt`, `bos_token` and
/// `eos_token` (left undefined when `None`, as transformers does for unset tokens), no options.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos: Option<&str>,
    eos: Option<&str>,
) -> Result<String, TokenizerError> {
    ChatRender {
        template,
        tokens: &[("bos_token", bos), ("eos_token", eos)],
        options: &TemplateOptions::default(),
    }
    .render(messages, add_generation_prompt)
}

#[cfg(test)]
#[path = "chat_template_tests.rs"]
pub(crate) mod tests;
