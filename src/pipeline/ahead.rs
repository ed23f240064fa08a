//! The trainer's side of generating ahead (α > 0), shared by RLVR and agentic RL: a generator runs
//! in a thread of its own and answers one ask per step; the trainer sends each ask with the
//! weights its last step produced, learns on the answer, and stops the generator when the stage
//! ends, is interrupted or fails. A generator's error reaches the trainer as the answer it was
//! waiting for.

use std::ops::RangeInclusive;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Instant;

use super::{RunError, RunStatus};
use crate::role::actor_infer::PolicyUpdate;

/// The trainer asks for step `step`'s batch, sending the weights of version `step − 1` (none when
/// the generator has them already).
pub(super) struct Ask {
    pub step: usize,
    pub weights: Option<PolicyUpdate>,
}

/// Run `generate` (given the asks and where to answer them) in its own thread, and `learn` on
/// each step's answer (given where to put the new weights); `learn` returns true to stop now.
pub(super) fn drive_ahead<Out: Send>(
    steps: RangeInclusive<usize>,
    generate: impl FnOnce(Receiver<Ask>, &Sender<Result<Out, RunError>>) -> Result<(), RunError> + Send,
    mut learn: impl FnMut(usize, Out, &mut Option<PolicyUpdate>, Instant) -> Result<bool, RunError>,
) -> Result<RunStatus, RunError> {
    std::thread::scope(|scope| {
        let (ask_tx, ask_rx) = mpsc::channel::<Ask>();
        let (out_tx, out_rx) = mpsc::channel::<Result<Out, RunError>>();
        let generator = scope.spawn(move || {
            if let Err(e) = generate(ask_rx, &out_tx) {
                // The trainer is waiting for a batch: hand it the error instead.
                let _ = out_tx.send(Err(e));
            }
        });
        let mut status = Ok(RunStatus::Finished);
        let mut weights = None;
        for step in steps {
            let t_step = Instant::now();
            let ask = Ask {
                step,
                weights: weights.take(),
            };
            let out = match ask_tx.send(ask).ok().and_then(|()| out_rx.recv().ok()) {
                Some(Ok(out)) => out,
                Some(Err(e)) => {
                    status = Err(e);
                    break;
                }
                None => {
                    status = Err(RunError::Setup(
                        "the actor_infer thread stopped unexpectedly".into(),
                    ));
                    break;
                }
            };
            match learn(step, out, &mut weights, t_step) {
                Ok(false) => {}
                Ok(true) => {
                    status = Ok(RunStatus::Interrupted);
                    break;
                }
                Err(e) => {
                    status = Err(e);
                    break;
                }
            }
        }
        drop(ask_tx);
        let _ = generator.join();
        status
    })
}
