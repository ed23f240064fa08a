//! Rollout: turning prompts into sampled completions with their log-probs.
//!
//! Owns sampling ([`sampling`]) and the continuous-batching generation engine ([`engine`]). It must
//! not score, train or know about datasets; the pipeline feeds it token ids and takes completions.

pub mod engine;
mod lane;
mod prefixes;
pub mod sampling;

pub use engine::{Completion, Engine, FinishReason, Request, generate};
pub use sampling::SamplingParams;
