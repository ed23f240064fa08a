//! Training machinery shared by every pipeline: the packed batch layout, per-token log-probs and
//! entropy, AdamW with learning-rate schedules and gradient clipping, the critic's value head, and
//! checkpoints.
//!
//! It must not decide *what* to optimise: losses come from `algo`, and pipelines assemble them.

pub mod batch;
pub mod checkpoint;
pub mod optim;
pub mod value_head;

pub use batch::{TrainBatch, response_forward};
pub use optim::{AdamW, GradAccumulator, OptimizerConfig, Schedule};
pub use value_head::ValueHead;

#[cfg(test)]
mod lora_grad_tests;
