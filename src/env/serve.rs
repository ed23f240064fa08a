//! One environment served over the external protocol ([`super::external`]): JSON lines in,
//! JSON lines out. `roll-tui env serve` runs this on stdin and stdout, so a built-in environment
//! can run in a process of its own (`workers.env.mode: process`) and be driven exactly as an
//! external program is — a crash or a kill costs one episode, not the run.
//!
//! A reply carries everything the client caches (`observation`, `info`, `actions`,
//! `action_format`, `state_hash` as a number, `grid`, `agent`), so an environment behaves the same
//! in a process as in the trainer: rewards pass through JSON exactly (shortest round-trip floats).

use std::io::{BufRead, Write};

use serde_json::{Map, Value, json};

use super::{Env, StepError};

/// The state as the protocol describes it.
fn state(env: &dyn Env) -> Map<String, Value> {
    let grid = env.render_grid();
    let rows: Vec<String> = grid.rows.iter().map(|r| r.iter().collect()).collect();
    let mut reply = Map::new();
    reply.insert("observation".into(), Value::String(env.render_text()));
    reply.insert("info".into(), Value::Object(env.info()));
    reply.insert("actions".into(), json!(env.actions()));
    reply.insert("action_format".into(), Value::String(env.action_format()));
    reply.insert("state_hash".into(), json!(env.state_hash()));
    reply.insert("grid".into(), json!(rows));
    reply.insert("agent".into(), json!([grid.agent.0, grid.agent.1]));
    reply
}

/// The reply to one request line; `None` for `close`. `started`: a `reset` came before (a
/// `step` needs one).
pub fn answer(env: &mut dyn Env, started: &mut bool, line: &str) -> Option<Value> {
    let request: Value = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return Some(json!({"error": format!("the request is not JSON: {e}")})),
    };
    let reply = match request["cmd"].as_str() {
        Some("close") => return None,
        Some("reset") if request["params"].as_object().is_some_and(|p| !p.is_empty()) => {
            json!({"error": "env serve takes its parameters when it starts (--set key=value); \
                             a reset's 'params' would be ignored"})
        }
        Some("reset") => match request["seed"].as_u64() {
            None => json!({"error": "reset needs a non-negative integer 'seed'"}),
            Some(seed) => match env.reset(seed) {
                Ok(observation) => {
                    *started = true;
                    let mut reply = state(env);
                    // The reset's own observation is the one the episode starts from.
                    reply.insert("observation".into(), Value::String(observation));
                    Value::Object(reply)
                }
                Err(f) => json!({"error": f.0}),
            },
        },
        Some("step") if !*started => json!({"error": "step before reset"}),
        Some("step") => match request["action"].as_str() {
            None => json!({"error": "step needs a string 'action'"}),
            Some(action) => match env.step(action) {
                Ok(step) => {
                    let mut reply = state(env);
                    reply.insert("observation".into(), Value::String(step.observation));
                    reply.insert("info".into(), Value::Object(step.info));
                    reply.insert("reward".into(), json!(step.reward));
                    reply.insert("done".into(), Value::Bool(step.done));
                    Value::Object(reply)
                }
                Err(StepError::Invalid(why)) => json!({"invalid": why}),
                Err(StepError::Failed(f)) => json!({"error": f.0}),
            },
        },
        Some(other) => json!({"error": format!("unknown cmd '{other}' (reset, step or close)")}),
        None => json!({"error": "a request needs a string 'cmd' (reset, step or close)"}),
    };
    Some(reply)
}

/// Serve requests from `input` until `close` or the end of input (the client is gone).
pub fn serve(
    env: &mut dyn Env,
    input: impl BufRead,
    mut output: impl Write,
) -> std::io::Result<()> {
    let mut started = false;
    for line in input.lines() {
        let line = line?;
        let Some(reply) = answer(env, &mut started, &line) else {
            break;
        };
        writeln!(output, "{reply}")?;
        output.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::make;

    #[test]
    fn a_served_lake_answers_the_protocol_as_the_lake_itself_plays() {
        let params = [("map".to_string(), "SFG".to_string())];
        let mut served = make("frozen_lake", &params).unwrap();
        let mut direct = make("frozen_lake", &params).unwrap();
        let input = "{\"cmd\":\"step\",\"action\":\"Right\"}\n\
                     {\"cmd\":\"reset\",\"seed\":4,\"params\":{\"map\":\"SFFG\"}}\n\
                     {\"cmd\":\"reset\",\"seed\":4}\n{\"cmd\":\"step\",\"action\":\"Jump\"}\n\
                     {\"cmd\":\"step\",\"action\":\"Right\"}\nnot json\n{\"cmd\":\"fly\"}\n\
                     {\"cmd\":\"close\"}\n{\"cmd\":\"reset\",\"seed\":1}\n";
        let mut out = vec![];
        serve(served.as_mut(), input.as_bytes(), &mut out).unwrap();
        let replies: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Seven replies: close ends the session before the last reset.
        assert_eq!(replies.len(), 7, "{replies:?}");
        // A step before any reset, and a reset with parameters (given at start instead).
        assert_eq!(replies[0]["error"], "step before reset");
        assert!(replies[1]["error"].as_str().unwrap().contains("--set"));
        let replies = &replies[2..];
        let first = direct.reset(4).unwrap();
        assert_eq!(replies[0]["observation"], first.as_str());
        assert_eq!(replies[0]["state_hash"], direct.state_hash());
        assert_eq!(
            replies[0]["actions"],
            json!(["Left", "Down", "Right", "Up"])
        );
        // The grid is the map; the agent is drawn from `agent`.
        assert_eq!(replies[0]["grid"], json!(["SFG"]));
        assert_eq!(replies[0]["agent"], json!([0, 0]));
        assert!(
            replies[1]["invalid"]
                .as_str()
                .unwrap()
                .contains("'Jump' is not an action")
        );
        let step = direct.step("Right").unwrap();
        assert_eq!(replies[2]["observation"], step.observation.as_str());
        assert_eq!(replies[2]["reward"], step.reward);
        assert_eq!(replies[2]["done"], step.done);
        assert_eq!(replies[2]["info"], Value::Object(step.info));
        assert_eq!(replies[2]["state_hash"], direct.state_hash());
        assert!(replies[3]["error"].as_str().unwrap().contains("not JSON"));
        assert_eq!(
            replies[4]["error"],
            "unknown cmd 'fly' (reset, step or close)"
        );
    }
}
