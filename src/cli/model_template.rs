//! `roll-tui model template`: a conversation through a model directory's chat template, printed
//! exactly as the engine tokenizes it (the same renderer and options a run uses).

use std::io::Read as _;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value as Json;

use super::TemplateArgs;
use crate::config::RunConfig;
use crate::config::load::from_yaml_str;
use crate::model::chat_template::{ChatRender, TemplateOptions};
use crate::model::tokenizer::load_tokenizer_dir;

pub fn template(args: TemplateArgs) -> Result<()> {
    let files = load_tokenizer_dir(&args.dir)?;
    let template = match &args.template {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the template '{}'", path.display()))?,
        None => files.chat_template.clone().ok_or_else(|| {
            anyhow!(
                "'{}' has no chat template (tokenizer_config.json's chat_template, \
                 chat_template.jinja or chat_template.json); give one with --template FILE",
                args.dir.display()
            )
        })?,
    };
    let (messages, tools) = read_messages(&args.messages)?;
    let mut options = match &args.config {
        Some(path) => RunConfig::load(path, &[])?.data.chat_template_options,
        None => TemplateOptions::default(),
    };
    if let Some(tools) = tools {
        options
            .set("tools", tools)
            .map_err(|e| anyhow!("'{}': {e}", args.messages.display()))?;
    }
    for pair in &args.set {
        let (name, value) = parse_set(pair)?;
        options
            .set(&name, value)
            .map_err(|e| anyhow!("--set {pair}: {e}"))?;
    }
    let text = ChatRender {
        template: &template,
        tokens: &files.template_tokens(),
        options: &options,
    }
    .render(&messages, args.add_generation_prompt)?;
    if args.ids {
        let enc = files
            .tokenizer
            .encode(text.as_str(), false)
            .map_err(|e| anyhow!("the rendered text cannot be tokenized: {e}"))?;
        let unk = files.tokenizer.token_to_id("<unk>");
        let unknown = enc.get_ids().iter().filter(|&&id| Some(id) == unk).count();
        if unknown > 0 {
            eprintln!(
                "warning: {unknown} piece(s) of the text are not in the tokenizer's vocabulary and \
                 read as <unk> (id {})",
                unk.unwrap_or_default()
            );
        }
        let ids: Vec<String> = enc.get_ids().iter().map(u32::to_string).collect();
        println!("{}", ids.join(" "));
    } else {
        print!("{text}");
    }
    Ok(())
}

/// The messages (and tools, when the file is an object that has them) of a JSON file or stdin.
fn read_messages(path: &Path) -> Result<(Vec<Json>, Option<Json>)> {
    let shown = if path == Path::new("-") {
        "standard input".to_string()
    } else {
        format!("'{}'", path.display())
    };
    let mut text = String::new();
    if path == Path::new("-") {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the messages from standard input")?;
    } else {
        text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the messages {shown}"))?;
    }
    let json: Json =
        serde_json::from_str(&text).with_context(|| format!("{shown} is not valid JSON"))?;
    let (list, tools) = match json {
        Json::Array(list) => (list, None),
        Json::Object(mut obj) => match obj.remove("messages") {
            Some(Json::Array(list)) => (list, obj.remove("tools")),
            _ => bail!("{shown}: an object needs a list under \"messages\""),
        },
        _ => bail!("{shown}: expected a list of messages or {{\"messages\": [...]}}"),
    };
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Json::as_str);
        if !m.is_object() || role.is_none() {
            bail!(
                "{shown}: message {} is not an object with a string \"role\": {m}",
                i + 1
            );
        }
    }
    Ok((list, tools))
}

/// `name=value` with the value read as YAML (`false` a boolean, `[a, b]` a list, `x` a string).
fn parse_set(pair: &str) -> Result<(String, Json)> {
    let (name, value) = pair
        .split_once('=')
        .filter(|(name, _)| !name.trim().is_empty())
        .ok_or_else(|| anyhow!("--set {pair}: expected NAME=VALUE"))?;
    let value: Json = from_yaml_str(value, "--set")
        .map_err(|e| anyhow!("--set {pair}: the value is not valid YAML: {e}"))?;
    Ok((name.trim().to_string(), value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_values_are_yaml() {
        assert_eq!(
            parse_set("enable_thinking=false").unwrap(),
            ("enable_thinking".into(), Json::Bool(false))
        );
        assert_eq!(
            parse_set("d=07 Dec 2026").unwrap().1,
            Json::String("07 Dec 2026".into())
        );
        assert_eq!(parse_set("n=[1, 2]").unwrap().1, serde_json::json!([1, 2]));
        assert_eq!(parse_set("e=").unwrap().1, Json::Null);
        assert!(parse_set("=1").is_err());
        assert!(parse_set("flag").is_err());
    }
}
