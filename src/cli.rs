//! cli (in progress)
