//! Where a rollout's environment work runs: resets and steps of many episodes. An environment
//! that waits on something outside this process (an external program, [`Env::blocks`]) is stepped
//! on a thread of its own per job, so many slow steps run at once and, in overlap mode, while the
//! engine decodes; an in-process environment is stepped inline, where a thread would only cost.
//!
//! Results come back either all at once in the order the jobs were started (the rollout is then
//! a function of the seed alone) or as they finish (overlap: the engine never waits for an
//! environment it does not need yet).
//!
//! [`Env::blocks`]: crate::env::Env::blocks

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Instant;

use crate::env::{EnvFailure, Episode, Step};

/// What to do with an episode.
pub(crate) enum Job {
    Reset(u64),
    /// The policy's raw output for this turn.
    Step(String),
}

pub(crate) enum Outcome {
    /// The first observation.
    Reset(String),
    Step(Step),
}

/// A job done: the episode comes back with what happened to it.
pub(crate) struct Finished {
    /// The rollout's episode id.
    pub id: usize,
    /// `None` when the environment panicked (the outcome is then a failure).
    pub episode: Option<Episode>,
    pub outcome: Result<Outcome, EnvFailure>,
    /// Seconds the job took inside the environment.
    pub secs: f64,
    /// Start order, so that results can be put back in it.
    order: u64,
}

pub(crate) struct EnvHost {
    threads: bool,
    tx: Sender<Finished>,
    rx: Receiver<Finished>,
    /// Jobs done inline, waiting to be collected.
    ready: VecDeque<Finished>,
    pending: usize,
    started: u64,
}

fn run(id: usize, mut episode: Episode, job: Job, order: u64) -> Finished {
    let t = Instant::now();
    // A panicking environment is a failed one, not a lost result that the rollout would wait
    // for forever.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let outcome = match job {
            Job::Reset(seed) => episode.reset(seed).map(Outcome::Reset),
            Job::Step(output) => episode.step(&output).map(Outcome::Step),
        };
        (episode, outcome)
    }));
    let (episode, outcome) = match result {
        Ok((episode, outcome)) => (Some(episode), outcome),
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            (
                None,
                Err(EnvFailure(format!("the environment panicked: {why}"))),
            )
        }
    };
    Finished {
        id,
        episode,
        outcome,
        secs: t.elapsed().as_secs_f64(),
        order,
    }
}

impl EnvHost {
    /// `threads`: run each job on a thread of its own (for environments that block).
    pub fn new(threads: bool) -> EnvHost {
        let (tx, rx) = mpsc::channel();
        EnvHost {
            threads,
            tx,
            rx,
            ready: VecDeque::new(),
            pending: 0,
            started: 0,
        }
    }

    /// Jobs started and not yet collected.
    pub fn pending(&self) -> usize {
        self.pending
    }

    pub fn start(&mut self, id: usize, episode: Episode, job: Job) {
        let order = self.started;
        self.started += 1;
        self.pending += 1;
        if self.threads {
            let tx = self.tx.clone();
            std::thread::spawn(move || {
                // The receiver lives as long as the rollout; a send can only fail after it ended.
                let _ = tx.send(run(id, episode, job, order));
            });
        } else {
            self.ready.push_back(run(id, episode, job, order));
        }
    }

    /// Every pending job, in the order they were started.
    pub fn wait_all(&mut self) -> Vec<Finished> {
        let mut out: Vec<Finished> = self.ready.drain(..).collect();
        while out.len() < self.pending {
            match self.rx.recv() {
                Ok(f) => out.push(f),
                // Unreachable while `self.tx` lives; stop rather than spin.
                Err(_) => break,
            }
        }
        self.pending -= out.len();
        out.sort_by_key(|f| f.order);
        out
    }

    /// The jobs finished by now; when `block`, wait until at least one has (if any is pending).
    pub fn finished(&mut self, block: bool) -> Vec<Finished> {
        let mut out: Vec<Finished> = self.ready.drain(..).collect();
        if block && out.is_empty() && self.pending > 0 {
            out.extend(self.rx.recv().ok());
        }
        out.extend(self.rx.try_iter());
        self.pending -= out.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{ActionParser, make};

    fn episode() -> Episode {
        let env = make("frozen_lake", &[("map".into(), "SFG".into())]).unwrap();
        Episode::new(env, ActionParser::default(), 0.1)
    }

    #[test]
    fn threaded_results_come_back_in_start_order_and_each_episode_keeps_its_state() {
        for threads in [false, true] {
            let mut host = EnvHost::new(threads);
            for id in 0..6 {
                host.start(id, episode(), Job::Reset(id as u64));
            }
            let done = host.wait_all();
            assert_eq!(host.pending(), 0);
            assert_eq!(
                done.iter().map(|f| f.id).collect::<Vec<_>>(),
                [0, 1, 2, 3, 4, 5]
            );
            // Episode 4 moves Right once; the others write no action.
            for f in done {
                let output = if f.id == 4 {
                    "<answer>Right</answer>"
                } else {
                    "hm"
                };
                host.start(f.id, f.episode.unwrap(), Job::Step(output.into()));
            }
            let mut done = vec![];
            while host.pending() > 0 {
                done.extend(host.finished(true));
            }
            done.sort_by_key(|f| f.id);
            let rewarded: Vec<(usize, usize)> = done
                .iter()
                .map(|f| (f.id, f.episode.as_ref().map_or(99, |e| e.invalid_actions)))
                .collect();
            assert_eq!(rewarded, [(0, 1), (1, 1), (2, 1), (3, 1), (4, 0), (5, 1)]);
            assert!(done.iter().all(|f| f.outcome.is_ok()));
        }
    }
}
