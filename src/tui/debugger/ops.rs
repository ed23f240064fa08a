//! The debugger's changes to its episode, as values: applied at once for an environment in this
//! process, and on a blocking thread for one behind a program (whose step may take up to its
//! `step_timeout`), so that a slow or hung program never freezes the screen. While a program
//! steps, the episode waits in a [`SessionCell`] that the view keeps a handle to: it comes back
//! even if the work fails.

use std::sync::{Arc, Mutex};

use crate::debugger::policy::ModelTurn;
use crate::debugger::{Actor, Session};

#[derive(Debug, Clone)]
pub enum SessionOp {
    /// An action of the env, chosen by a person (checked against the env's list when it has one).
    Take(String),
    /// A whole output typed by a person.
    Output(String),
    /// A model's turn.
    Model(String, Box<ModelTurn>),
    /// Random actions: one, or until the episode ends or `limit` turns.
    Random {
        to_end: bool,
        limit: usize,
    },
    Undo,
    /// Back to before this turn (0-based).
    Fork(usize),
    /// Start again from the next seed (`true`) or the same one.
    Reset {
        next: bool,
    },
}

impl SessionOp {
    /// Apply to `s`: a notice for the status line, or what went wrong.
    pub fn apply(self, s: &mut Session) -> Result<Option<String>, String> {
        let err = |e: crate::debugger::session::SessionError| e.to_string();
        match self {
            SessionOp::Take(action) => {
                let actions = s.env().actions();
                if !actions.is_empty() && !actions.contains(&action) {
                    return Err(format!(
                        "'{action}' is not an action here (a picks from the env's actions; i \
                         types any output)"
                    ));
                }
                s.take(&action, Actor::Human).map_err(err)?;
                Ok(None)
            }
            SessionOp::Output(text) => {
                s.act(text, Actor::Human, None).map_err(err)?;
                Ok(None)
            }
            SessionOp::Model(output, turn) => {
                s.act(output, Actor::Model, Some(*turn)).map_err(err)?;
                Ok(None)
            }
            SessionOp::Random { to_end, limit } => loop {
                if s.done() {
                    return Ok(None);
                }
                if to_end && s.turns.len() >= limit {
                    return Ok(Some(format!("stopped at max_turns ({limit})")));
                }
                let a = s
                    .random_action()
                    .ok_or("this environment lists no actions to draw from: i types an output")?;
                s.take(&a, Actor::Random).map_err(err)?;
                if !to_end {
                    return Ok(None);
                }
            },
            SessionOp::Undo => match s.undo().map_err(err)? {
                true => Ok(None),
                false => Ok(Some("nothing to undo".into())),
            },
            SessionOp::Fork(at) => {
                if at >= s.turns.len() {
                    return Ok(Some("select an earlier turn (j k) to fork at".into()));
                }
                s.fork(at).map_err(err)?;
                Ok(Some(format!(
                    "forked at turn {}: play it differently",
                    at + 1
                )))
            }
            SessionOp::Reset { next } => {
                let seed = if next { s.seed.wrapping_add(1) } else { s.seed };
                s.reset(seed).map_err(err)?;
                Ok(Some(format!("episode from seed {seed}")))
            }
        }
    }
}

/// Where the episode waits while a program steps it.
#[derive(Clone)]
pub struct SessionCell(Arc<Mutex<Option<Session>>>);

impl SessionCell {
    pub fn new(s: Session) -> SessionCell {
        SessionCell(Arc::new(Mutex::new(Some(s))))
    }

    /// Apply `op` to the episode in the cell (there is one unless it was already taken back).
    pub fn apply(&self, op: SessionOp) -> Result<Option<String>, String> {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(s) => op.apply(s),
            None => Err("the episode was taken back before the step".into()),
        }
    }

    /// The episode back, also after a panic while it was being stepped.
    pub fn take(&self) -> Option<Session> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}
