//! A multi-turn conversation in token ids. The policy's turns keep the exact ids it sampled (no
//! decode and re-encode, which can tokenize the same text differently and so train on tokens the
//! policy never produced); only what comes between turns — the end of the policy's turn and the
//! environment's next observation — is tokenized, on its own.
//!
//! With a chat template, the text between turns is whatever the template writes after an assistant
//! message and around a new user message (found by rendering the conversation with and without the
//! new message). Without one, turns follow the plain transcript of `env::transcript`.

use crate::config::{EnvConfig, EnvMode};
use crate::env::transcript::{plain_first, plain_next};
use crate::model::chat_template::ChatMessage;

use super::super::setup::Tokenizing;

/// Stands for the policy's output when rendering the template around it (a private-use character
/// no template writes).
const OUTPUT_MARK: &str = "\u{E000}";
const EARLIER_MARK: &str = "\u{E001}";

#[derive(Clone, Copy)]
pub(crate) struct TurnFormat<'a> {
    pub tok: Tokenizing<'a>,
    pub instruction: Option<&'a str>,
}

impl TurnFormat<'_> {
    fn render(&self, messages: &[ChatMessage], generation: bool) -> Result<String, String> {
        if !self.tok.chat_template {
            return Err("cannot be templated: the run's data.chat_template is off".into());
        }
        self.tok.render_chat(messages, generation)
    }

    fn system(&self) -> Vec<ChatMessage> {
        self.instruction
            .map(|i| ChatMessage::new("system", i))
            .into_iter()
            .collect()
    }

    /// The ids before the policy's first turn.
    pub fn first(&self, observation: &str) -> Result<Vec<u32>, String> {
        let text = if self.tok.chat_template {
            let mut messages = self.system();
            messages.push(ChatMessage::new("user", observation));
            self.render(&messages, true)?
        } else {
            plain_first(self.instruction, observation)
        };
        let ids = self.tok.encode(&text)?;
        if ids.is_empty() {
            return Err("the first observation renders to no tokens".into());
        }
        Ok(ids)
    }

    /// The ids to append after the policy's turn `generated` so that it reads `observation` next
    /// and starts its own next turn.
    pub fn next(&self, generated: &[u32], observation: &str) -> Result<Vec<u32>, String> {
        let model = self.tok.model;
        let ended = generated.last().filter(|id| model.eos_ids.contains(id));
        if !self.tok.chat_template {
            // A turn cut before its end-of-sequence token still ends there.
            let mut ids: Vec<u32> = match ended {
                Some(_) => vec![],
                None => model.eos_ids.first().copied().into_iter().collect(),
            };
            ids.extend(self.tok.encode(&plain_next(observation))?);
            return Ok(ids);
        }
        let mut base = self.system();
        base.push(ChatMessage::new("user", EARLIER_MARK));
        base.push(ChatMessage::new("assistant", OUTPUT_MARK));
        let before = self.render(&base, false)?;
        base.push(ChatMessage::new("user", observation));
        let after = self.render(&base, true)?;
        let added = after.strip_prefix(&before).ok_or(
            "the chat template writes the earlier turns differently once a turn is added, so a \
             conversation cannot grow turn by turn with it",
        )?;
        let mark_end = before
            .rfind(OUTPUT_MARK)
            .map(|i| i + OUTPUT_MARK.len())
            .ok_or("the chat template does not write the assistant's message")?;
        let mut closing = &before[mark_end..];
        // The policy's own end-of-turn token already wrote the start of what closes its message.
        if let Some(&id) = ended
            && let Some(text) = model.tokenizer.tokenizer.id_to_token(id)
        {
            closing = closing.strip_prefix(text.as_str()).unwrap_or(closing);
        }
        self.tok.encode(&format!("{closing}{added}"))
    }
}

/// A step-wise prompt's content: the last `history_length` turns, one line each (the valid action
/// taken, or none, and its reward), then the observation. In trajectory mode, and in step mode
/// without history, the observation alone.
pub(crate) fn step_content(
    env: &EnvConfig,
    history: &[(Option<&str>, f64)],
    observation: &str,
) -> String {
    if env.mode != EnvMode::Step || env.history_length == 0 {
        return observation.to_string();
    }
    let from = history.len().saturating_sub(env.history_length);
    let mut text = String::new();
    for (i, (action, reward)) in history.iter().enumerate().skip(from) {
        let action = action.unwrap_or("(no valid action)");
        text.push_str(&format!("Turn {}: {action} -> reward {reward}\n", i + 1));
    }
    text.push_str(observation);
    text
}
