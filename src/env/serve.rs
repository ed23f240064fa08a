//! A built-in environment served over the external protocol ([`super::external`]): JSON lines
//! in, JSON lines out, for many instances at once (a request's `instance`, 0 without one).
//! `roll-tui env serve` runs this on stdin and stdout, so built-in environments run in worker
//! processes (`workers.env.mode: process`) and are driven exactly as an external program is — a
//! crash or a kill costs the episodes of that worker, not the run.
//!
//! A reply carries everything the client caches (`observation`, `info`, `actions`,
//! `action_format`, `state_hash` as a number, `grid`, `agent`), so an environment behaves the same
//! in a process as in the trainer: rewards pass through JSON exactly (shortest round-trip floats).

use std::collections::HashMap;
use std::io::{BufRead, Write};

use serde_json::{Map, Value, json};

use super::{Env, StepError};

/// The state as the protocol describes it, with the observation and info the reset or step
/// returned (rendering them again would be work done twice).
fn state(env: &dyn Env, observation: String, info: Map<String, Value>) -> Map<String, Value> {
    let grid = env.render_grid();
    let rows: Vec<String> = grid.rows.iter().map(|r| r.iter().collect()).collect();
    let mut reply = Map::new();
    reply.insert("observation".into(), Value::String(observation));
    reply.insert("info".into(), Value::Object(info));
    reply.insert("actions".into(), json!(env.actions()));
    reply.insert("action_format".into(), Value::String(env.action_format()));
    reply.insert("state_hash".into(), json!(env.state_hash()));
    reply.insert("grid".into(), json!(rows));
    reply.insert("agent".into(), json!([grid.agent.0, grid.agent.1]));
    reply
}

/// What a request line asks of the server.
enum Answer {
    Reply(Value),
    /// `close` of one instance: freed, no reply.
    Quiet,
    /// `close` of the whole server.
    End,
}

/// The instances one server hosts, each a copy of `prototype`, created by its first reset.
/// Requests without `instance` are instance 0, so a single-instance client (the external
/// protocol as a program sees it) needs nothing more.
struct Host<'a> {
    prototype: &'a dyn Env,
    instances: HashMap<u64, Box<dyn Env>>,
}

impl Host<'_> {
    fn answer(&mut self, line: &str) -> Answer {
        let request: Value = match serde_json::from_str(line) {
            Ok(r) => r,
            Err(e) => {
                return Answer::Reply(json!({"error": format!("the request is not JSON: {e}")}));
            }
        };
        let instance = request["instance"].as_u64().unwrap_or(0);
        let reply = match request["cmd"].as_str() {
            Some("close") if request.get("instance").is_some() => {
                self.instances.remove(&instance);
                return Answer::Quiet;
            }
            Some("close") => return Answer::End,
            Some("reset") if request["params"].as_object().is_some_and(|p| !p.is_empty()) => {
                json!({"error": "env serve takes its parameters when it starts (--set key=value); \
                                 a reset's 'params' would be ignored"})
            }
            Some("reset") => match request["seed"].as_u64() {
                None => json!({"error": "reset needs a non-negative integer 'seed'"}),
                Some(seed) => {
                    let prototype = self.prototype;
                    let env = self
                        .instances
                        .entry(instance)
                        .or_insert_with(|| prototype.clone_box());
                    match env.reset(seed) {
                        Ok(observation) => {
                            let info = env.info();
                            Value::Object(state(env.as_ref(), observation, info))
                        }
                        Err(f) => json!({"error": f.0}),
                    }
                }
            },
            Some("step") => match (
                self.instances.get_mut(&instance),
                request["action"].as_str(),
            ) {
                (None, _) => json!({"error": "step before reset"}),
                (Some(_), None) => json!({"error": "step needs a string 'action'"}),
                (Some(env), Some(action)) => match env.step(action) {
                    Ok(step) => {
                        let mut reply = state(env.as_ref(), step.observation, step.info);
                        reply.insert("reward".into(), json!(step.reward));
                        reply.insert("done".into(), Value::Bool(step.done));
                        Value::Object(reply)
                    }
                    Err(StepError::Invalid(why)) => json!({"invalid": why}),
                    Err(StepError::Failed(f)) => json!({"error": f.0}),
                },
            },
            Some(other) => {
                json!({"error": format!("unknown cmd '{other}' (reset, step or close)")})
            }
            None => json!({"error": "a request needs a string 'cmd' (reset, step or close)"}),
        };
        Answer::Reply(reply)
    }
}

/// Serve instances of `prototype` from `input` until `close` or the end of input (the client
/// is gone).
pub fn serve(
    prototype: &dyn Env,
    input: impl BufRead,
    mut output: impl Write,
) -> std::io::Result<()> {
    let mut host = Host {
        prototype,
        instances: HashMap::new(),
    };
    for line in input.lines() {
        match host.answer(&line?) {
            Answer::Reply(reply) => {
                writeln!(output, "{reply}")?;
                output.flush()?;
            }
            Answer::Quiet => {}
            Answer::End => break,
        }
    }
    Ok(())
}

/// The replies a server of `env` writes for the request lines `input`.
#[cfg(test)]
pub(crate) fn served_replies(env: &dyn Env, input: &str) -> Vec<Value> {
    let mut out = vec![];
    serve(env, input.as_bytes(), &mut out).unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::make;

    #[test]
    fn a_served_lake_answers_the_protocol_as_the_lake_itself_plays() {
        let params = [("map".to_string(), "SFG".to_string())];
        let served = make("frozen_lake", &params).unwrap();
        let mut direct = make("frozen_lake", &params).unwrap();
        let input = "{\"cmd\":\"step\",\"action\":\"Right\"}\n\
                     {\"cmd\":\"reset\",\"seed\":4,\"params\":{\"map\":\"SFFG\"}}\n\
                     {\"cmd\":\"reset\",\"seed\":4}\n{\"cmd\":\"step\",\"action\":\"Jump\"}\n\
                     {\"cmd\":\"step\",\"action\":\"Right\"}\nnot json\n{\"cmd\":\"fly\"}\n\
                     {\"cmd\":\"close\"}\n{\"cmd\":\"reset\",\"seed\":1}\n";
        let replies = served_replies(served.as_ref(), input);
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

#[cfg(test)]
mod instance_tests {
    use super::*;
    use crate::env::make;

    #[test]
    fn one_server_hosts_many_instances_each_with_its_own_state() {
        let lake = make("frozen_lake", &[("map".to_string(), "SFFG".to_string())]).unwrap();
        // Instance 1 walks Right twice; instance 2 once; instance 1 is closed, then stepped.
        let input = "{\"cmd\":\"reset\",\"seed\":0,\"instance\":1}\n\
                     {\"cmd\":\"reset\",\"seed\":0,\"instance\":2}\n\
                     {\"cmd\":\"step\",\"action\":\"Right\",\"instance\":1}\n\
                     {\"cmd\":\"step\",\"action\":\"Right\",\"instance\":2}\n\
                     {\"cmd\":\"step\",\"action\":\"Right\",\"instance\":1}\n\
                     {\"cmd\":\"close\",\"instance\":1}\n\
                     {\"cmd\":\"step\",\"action\":\"Right\",\"instance\":1}\n\
                     {\"cmd\":\"step\",\"action\":\"Right\"}\n";
        let replies = served_replies(lake.as_ref(), input);
        // Seven replies: closing an instance answers nothing.
        assert_eq!(replies.len(), 7, "{replies:?}");
        let states: Vec<&Value> = replies[2..5].iter().map(|r| &r["info"]["state"]).collect();
        assert_eq!(states, [1, 1, 2], "each instance moves on its own");
        assert_eq!(
            replies[5]["error"], "step before reset",
            "a closed instance is gone"
        );
        assert_eq!(
            replies[6]["error"], "step before reset",
            "instance 0 was never reset"
        );
    }
}
