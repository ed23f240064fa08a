//! `roll-tui run` and `roll-tui resume`: headless runs recorded in the store.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};

use super::{EXIT_INTERRUPTED, ResumeArgs, RunArgs};
use crate::config::RunConfig;
use crate::launch::Start;
use crate::pipeline::RunStatus;

pub fn run(store: &Path, args: RunArgs) -> Result<i32> {
    let cfg = RunConfig::load(&args.config, &args.overrides)?;
    let start = Start::New {
        cfg: Box::new(cfg),
        overwrite: args.overwrite,
    };
    execute(store, start, args.quiet)
}

pub fn resume(store: &Path, args: ResumeArgs) -> Result<i32> {
    execute(store, Start::Resume { run: args.run }, args.quiet)
}

fn execute(store: &Path, start: Start, quiet: bool) -> Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            // Second Ctrl-C: the user does not want to wait for the checkpoint.
            eprintln!("\nstopping now without a checkpoint");
            std::process::exit(EXIT_INTERRUPTED);
        }
        eprintln!(
            "\nstopping after this step (a checkpoint will be written); press Ctrl-C again to quit now"
        );
    })
    .context("installing the Ctrl-C handler")?;
    let rec = crate::headless::run(store, start, stop, quiet)?;
    Ok(if rec.outcome.status == RunStatus::Interrupted {
        EXIT_INTERRUPTED
    } else {
        0
    })
}
