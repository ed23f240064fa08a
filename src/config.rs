//! config (in progress)
pub mod load;
