//! headless (in progress)
