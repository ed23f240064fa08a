//! Supervised fine-tuning: maximise the log-likelihood of `ground_truth` (+ EOS) after each prompt.

use std::path::PathBuf;
use std::time::Instant;

use crate::config::{SftConfig, Stage};
use crate::metrics::Metrics;
use crate::model::threads::{micro_batches_in_lanes, side_by_side};
use crate::model::{LoadedModel, Numerics, Tape};
use crate::train::{AdamW, GradAccumulator, TrainBatch, response_forward};

use super::setup::{Domains, Tokenizing};
use super::{
    CheckpointExtras, PipelineError, PipelineEvent, Resume, RunContext, RunStatus, TensorContext,
    mix_seed,
};

pub fn run_sft(
    ctx: &mut RunContext<'_>,
    cfg: &SftConfig,
    model: &LoadedModel,
    data: &Domains,
    resume: Option<&Resume>,
) -> Result<(RunStatus, Option<PathBuf>), PipelineError> {
    let mut mixer = data.mixer(mix_seed(&[ctx.cfg.seed, 1]))?;
    let vars: Vec<_> = model.transformer.params().named_vars();
    let mut opt =
        AdamW::new(vars, cfg.optimizer.clone(), cfg.steps).during("sft optimizer setup")?;
    let mut first_step = 1;
    if let Some(r) = resume {
        let (_, moments) =
            crate::train::checkpoint::load_trainer_state(&r.dir, model.transformer.device())?;
        opt.restore(r.state.optimizer_steps, &moments)
            .during("restoring the sft optimizer")?;
        if let Some(m) = &r.state.mixer {
            mixer.restore(m)?;
        }
        first_step = r.state.step + 1;
    }
    let micro = cfg
        .micro_batch_size
        .unwrap_or(cfg.batch_size)
        .min(cfg.batch_size);
    let tok = Tokenizing {
        model,
        chat_template: data.chat_template,
    };
    let groups = model.config().kv_groups();
    let lanes = model.transformer.lanes();
    ctx.emit(PipelineEvent::StageStarted {
        stage: Stage::Sft,
        total_steps: cfg.steps,
        done_steps: first_step - 1,
    });
    let mut last = None;
    for step in first_step..=cfg.steps {
        let t0 = Instant::now();
        let batch = mixer.next_batch(cfg.batch_size);
        let pairs: Vec<(Vec<u32>, Vec<u32>)> = batch
            .iter()
            .map(|ex| {
                Ok((
                    tok.prompt_ids(&ex.prompt)?,
                    tok.answer_ids(ex.response.as_deref().unwrap_or(&ex.ground_truth))?,
                ))
            })
            .collect::<Result<_, String>>()
            .map_err(PipelineError::Setup)?;
        let total_tokens: usize = pairs.iter().map(|(_, a)| a.len()).sum();
        let mut acc = GradAccumulator::default();
        let mut loss_sum = 0.0;
        let lens: Vec<(usize, usize)> = pairs.iter().map(|(p, a)| (p.len(), a.len())).collect();
        for parts in micro_batches_in_lanes(&lens, micro, lanes) {
            // The micro-batch in lanes worked on side by side; their losses and gradients add up
            // to the micro-batch's, summed in lane order.
            let passes = side_by_side(&parts, |part| {
                let refs: Vec<(&[u32], &[u32])> = part
                    .iter()
                    .map(|&i| (pairs[i].0.as_slice(), pairs[i].1.as_slice()))
                    .collect();
                let tb = TrainBatch::new(&refs, model.pad_id, groups, model.transformer.device())
                    .during("sft batch")?;
                let mut tape = Tape::default();
                let (logp, _) = response_forward(
                    &model.transformer,
                    &tb,
                    1.0,
                    Numerics::Differentiable,
                    false,
                    Some(&mut tape),
                )
                .during("sft forward")?;
                // Token-mean over the whole batch: each part contributes its token sum / batch tokens.
                let loss = (logp
                    .sum_all()
                    .during("sft loss")?
                    .neg()
                    .during("sft loss")?
                    / total_tokens as f64)
                    .during("sft loss")?;
                let value = loss.to_scalar::<f32>().during("sft loss")? as f64;
                drop(logp);
                Ok::<_, PipelineError>((value, tape.backward(loss).during("sft backward")?))
            });
            for pass in passes {
                let (value, grads) = pass?;
                loss_sum += value;
                acc.add(opt.vars(), grads).during("sft backward")?;
            }
        }
        let stats = opt.step(acc).during("sft optimizer step")?;
        let secs = t0.elapsed().as_secs_f64();
        let mut m = Metrics::new();
        m.insert("sft/loss".into(), loss_sum);
        m.insert("actor/grad_norm".into(), stats.grad_norm);
        m.insert("actor/lr".into(), stats.lr);
        m.insert("time/train".into(), secs);
        m.insert("time/step".into(), secs);
        m.insert(
            "system/tokens_per_s".into(),
            total_tokens as f64 / secs.max(1e-9),
        );
        ctx.record_step(Stage::Sft, step, cfg.steps, m)?;
        let extras = || CheckpointExtras {
            mixer: mixer.state(),
            rl: None,
            critic: None,
            reference: None,
        };
        if ctx.after_step(
            model,
            &opt,
            Stage::Sft,
            (step, cfg.steps),
            &mut last,
            extras,
        )? {
            return Ok((RunStatus::Interrupted, last));
        }
    }
    Ok((RunStatus::Finished, last))
}
