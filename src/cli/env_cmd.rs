//! `roll-tui env list` and `roll-tui env serve`: the environments, and one environment served
//! over the external protocol.

use anyhow::{Result, bail};

use super::EnvServeArgs;
use crate::env::{ENVS, make};

pub fn list() -> Result<()> {
    for (name, what, params) in ENVS {
        println!("{name}\n  {what}\n  parameters: {params}");
    }
    Ok(())
}

/// `key=value` pairs; a malformed one names itself.
pub(super) fn params(set: &[String]) -> Result<Vec<(String, String)>> {
    set.iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
            _ => bail!("--set '{kv}': expected key=value"),
        })
        .collect()
}

pub fn serve(args: EnvServeArgs) -> Result<()> {
    let env = make(&args.env, &params(&args.set)?).map_err(anyhow::Error::msg)?;
    // No PR_SET_PDEATHSIG here: it fires when the spawning *thread* ends, and the trainer starts
    // env processes from short-lived threads. The end of stdin (the trainer gone) ends this loop.
    crate::env::serve::serve(
        env.as_ref(),
        std::io::stdin().lock(),
        std::io::stdout().lock(),
    )?;
    Ok(())
}
