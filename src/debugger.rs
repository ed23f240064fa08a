//! The environment debugger: one episode played turn by turn by a person, a random policy or a
//! model, with undo, fork, resampling, opening a stored episode at any turn, saving to the store
//! and exporting. This module owns the debugging logic only; the workbench's Env view and the
//! `env play` / `env debug` commands are front-ends over it.
//!
//! - [`session`]: the episode and its turns (act, undo, fork, reset, rebuild from a record).
//! - [`policy`]: a model as the policy: the exact prompt of a turn, sampling, per-token log-probs,
//!   entropy and alternatives, and the distribution of actions over N draws.
//! - [`record`]: a session as a stored trajectory (tagged `debug`) and as JSON lines.
//! - [`open`]: sessions from the store — a run's stored episode at a turn, a run's checkpoint as
//!   the model.

pub mod open;
pub mod policy;
pub mod record;
pub mod session;

pub use policy::{ActionCount, ModelPolicy, Resample, TokenView};
pub use session::{Actor, DebugTurn, Session};
