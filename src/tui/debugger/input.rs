//! The debugger's input line (an output typed by hand, the model, sampling settings, the
//! environment) and what its text means. Parsing errors name the bad part.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::config::EnvConfig;
use crate::debugger::open::env_config;
use crate::rollout::SamplingParams;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// The policy's whole output, as the action parser will read it.
    Output,
    /// A model directory or `RUN@STEP`.
    Model,
    Sampling,
    /// `NAME key=value … seed=N`.
    Env,
}

impl InputKind {
    pub fn prompt(self) -> &'static str {
        match self {
            InputKind::Output => "output",
            InputKind::Model => "model (DIR or RUN@STEP)",
            InputKind::Sampling => "sampling",
            InputKind::Env => "env (NAME key=value … seed=N)",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub kind: InputKind,
    pub text: String,
    /// What ↑ and ↓ offer (the model input: every checkpoint in the store, `RUN@STEP`).
    pub choices: Vec<String>,
    pub choice: Option<usize>,
}

pub enum InputOutcome {
    Stay,
    Cancel,
    Submit(String),
}

impl Input {
    pub fn new(kind: InputKind, text: &str) -> Input {
        Input {
            kind,
            text: text.to_string(),
            choices: vec![],
            choice: None,
        }
    }

    /// Edit with a key: characters, Backspace, Ctrl-u (clear), ↑ ↓ through the choices; Enter
    /// submits, Esc cancels.
    pub fn key(&mut self, key: KeyEvent) -> InputOutcome {
        match key.code {
            KeyCode::Enter => return InputOutcome::Submit(self.text.clone()),
            KeyCode::Esc => return InputOutcome::Cancel,
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                return InputOutcome::Cancel;
            }
            KeyCode::Char('u') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                self.text.clear()
            }
            KeyCode::Backspace => {
                self.text.pop();
            }
            KeyCode::Up | KeyCode::Down if !self.choices.is_empty() => {
                let last = self.choices.len() - 1;
                let next = match (self.choice, key.code) {
                    (None, KeyCode::Down) => 0,
                    (None, _) => last,
                    (Some(i), KeyCode::Down) => (i + 1).min(last),
                    (Some(i), _) => i.saturating_sub(1),
                };
                self.choice = Some(next);
                self.text = self.choices[next].clone();
            }
            KeyCode::Char(c) => self.text.push(c),
            _ => {}
        }
        InputOutcome::Stay
    }
}

/// The sampling settings as the input line shows them.
pub fn sampling_text(s: &SamplingParams, draws: usize) -> String {
    format!(
        "temperature={} top_k={} top_p={} max_tokens={} samples={draws}",
        s.temperature, s.top_k, s.top_p, s.max_new_tokens
    )
}

/// `key=value` settings over `base`; also the draws per resample (`samples`).
pub fn parse_sampling(
    text: &str,
    mut base: SamplingParams,
) -> Result<(SamplingParams, usize), String> {
    let mut draws = 32;
    for part in text.split_whitespace() {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}': expected key=value"))?;
        let number = |what: &str| format!("{k}={v}: expected {what}");
        match k {
            "temperature" => base.temperature = v.parse().map_err(|_| number("a number"))?,
            "top_k" => base.top_k = v.parse().map_err(|_| number("a whole number"))?,
            "top_p" => base.top_p = v.parse().map_err(|_| number("a number"))?,
            "max_tokens" => {
                base.max_new_tokens = v.parse().map_err(|_| number("a whole number"))?
            }
            "samples" => match v.parse::<usize>() {
                Ok(n) if (1..=1024).contains(&n) => draws = n,
                _ => return Err(number("1 to 1024")),
            },
            other => {
                return Err(format!(
                    "unknown setting '{other}' (temperature, top_k, top_p, max_tokens, samples)"
                ));
            }
        }
    }
    let mut problems = vec![];
    base.validate("sampling", &mut problems);
    match problems.is_empty() {
        true => Ok((base, draws)),
        false => Err(problems.join("; ").replace("sampling.", "")),
    }
}

/// The environment as the input line shows it.
pub fn env_text(env: &EnvConfig, seed: u64) -> String {
    let mut text = env.name.clone();
    for (k, v) in env.param_pairs() {
        text.push_str(&format!(" {k}={v}"));
    }
    text.push_str(&format!(" seed={seed}"));
    text
}

/// `NAME key=value … seed=N` (values without spaces; `seed` is the episode's, not a parameter).
/// The same env as `base` keeps `base`'s other settings (action pattern, penalty, turns, mode,
/// instruction), with the parameters given.
pub fn parse_env(text: &str, base: &EnvConfig) -> Result<(EnvConfig, u64), String> {
    let mut parts = text.split_whitespace();
    let name = parts.next().ok_or("name an environment (see env list)")?;
    let mut params = vec![];
    let mut seed = 0;
    for part in parts {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}': expected key=value"))?;
        if k == "seed" {
            seed = v
                .parse()
                .map_err(|_| format!("seed={v}: expected a whole number"))?;
        } else {
            params.push((k.to_string(), v.to_string()));
        }
    }
    let mut env = env_config(name, &params)?;
    if base.name == env.name {
        env = EnvConfig {
            params: env.params,
            ..base.clone()
        };
    }
    crate::env::make(&env.name, &env.param_pairs())?;
    Ok((env, seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_over_the_base_and_bad_ones_are_named() {
        let (s, n) = parse_sampling("temperature=0.5 samples=8", SamplingParams::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (s.temperature, s.top_p, s.max_new_tokens, n),
            (0.5, 1.0, 64, 8)
        );
        let text = sampling_text(&s, n);
        assert_eq!(parse_sampling(&text, SamplingParams::default()), Ok((s, 8)));
        let err = |t: &str| parse_sampling(t, SamplingParams::default()).unwrap_err();
        assert!(err("top_p=2").contains("top_p must be in (0, 1]"));
        assert!(err("temp=1").contains("unknown setting 'temp'"));
        assert!(err("top_k=x").contains("top_k=x: expected a whole number"));
        assert!(err("samples=0").contains("1 to 1024"));

        let mut base = env_config("frozen_lake", &[]).unwrap_or_else(|e| panic!("{e}"));
        base.action_pattern = Some("(\\w+)".into());
        let (env, seed) =
            parse_env("frozen_lake size=5 seed=3", &base).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((env.name.as_str(), seed), ("frozen_lake", 3));
        assert_eq!(env_text(&env, seed), "frozen_lake size=5 seed=3");
        // The same env keeps its other settings; another env starts from its defaults.
        assert_eq!(env.action_pattern.as_deref(), Some("(\\w+)"));
        let (other, _) = parse_env("sokoban", &base).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(other.action_pattern, None);
        let err = |t: &str| parse_env(t, &base).unwrap_err();
        assert!(err("frozen_lak").contains("did you mean"));
        assert!(err("frozen_lake size=x").contains("size=x"));
        assert!(parse_env("", &base).is_err());
    }
}
