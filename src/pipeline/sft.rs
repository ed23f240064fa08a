//! Supervised fine-tuning: maximise the log-likelihood of `ground_truth` (or `response`) + EOS
//! after each prompt. The stage supplies the batches; actor_train trains on them as it does in
//! RL, in this process or in its worker process (`workers.actor_train`), with the negative
//! log-likelihood as its loss (`SftConfig::recipe`).

use std::path::PathBuf;
use std::time::Instant;

use crate::config::{SftConfig, Stage};
use crate::data::mix::DomainMixer;
use crate::model::LoadedModel;
use crate::role::actor_train::ActorTrain;
use crate::role::epochs::{ActorStep, EpochRows, Targets};
use crate::role::{ResidentRole, Restore};

use super::setup::{Domains, Tokenizing};
use super::worker_report::report_workers;
use super::{PipelineEvent, Resume, RunContext, RunError, RunStatus, TensorContext, mix_seed};

pub fn run_sft(
    ctx: &mut RunContext<'_>,
    cfg: &SftConfig,
    model: &LoadedModel,
    data: &Domains,
    resume: Option<&Resume>,
) -> Result<(RunStatus, Option<PathBuf>), RunError> {
    let restore = resume.map(|r| Restore {
        dir: &r.dir,
        optimizer_steps: r.state.optimizer_steps,
    });
    let mut actor = ActorTrain::start(ctx.cfg, cfg.recipe(), model, cfg.steps, restore)?;
    let outcome = sft_steps(ctx, cfg, model, data, resume, &mut actor);
    // The stage's trainer goes with it (a later stage starts its own); its worker's last events
    // are recorded whatever happened.
    report_workers(ctx, actor.shutdown())?;
    outcome
}

fn sft_steps(
    ctx: &mut RunContext<'_>,
    cfg: &SftConfig,
    model: &LoadedModel,
    data: &Domains,
    resume: Option<&Resume>,
    actor: &mut ActorTrain,
) -> Result<(RunStatus, Option<PathBuf>), RunError> {
    let (mut mixer, first_step) =
        start_demonstrations(ctx, Stage::Sft, cfg.steps, data, resume, actor)?;
    let tok = Tokenizing {
        model,
        chat_template: data.chat_template,
        template_options: &data.template_options,
    };
    let mut last = None;
    for step in first_step..=cfg.steps {
        let t0 = Instant::now();
        let batch = mixer.next_batch(cfg.batch_size);
        let (prompts, responses) = demonstrations(&tok, &batch)?;
        let total_tokens: usize = responses.iter().map(Vec::len).sum();
        let loss_mask =
            EpochRows::response_mask(&responses, model.transformer.device()).during("sft batch")?;
        let batch = ActorStep {
            rows: EpochRows {
                prompts,
                responses,
                group_size: 1,
                micro: cfg.micro(),
                loss_mask,
                // Seeds LoRA dropout's masks, one draw per step.
                seed: mix_seed(&[ctx.cfg.seed, 5, step as u64]),
            },
            targets: Targets::Likelihood,
        };
        let mut m = actor.train(&batch, model)?.metrics;
        report_workers(ctx, actor.drain_events())?;
        let secs = t0.elapsed().as_secs_f64();
        m.insert("time/train".into(), secs);
        m.insert("time/step".into(), secs);
        m.insert(
            "system/tokens_per_s".into(),
            total_tokens as f64 / secs.max(1e-9),
        );
        ctx.record_step(Stage::Sft, step, cfg.steps, m)?;
        if ctx.after_data_step(
            model,
            &*actor,
            Stage::Sft,
            (step, cfg.steps),
            &mut last,
            || mixer.state(),
        )? {
            return Ok((RunStatus::Interrupted, last));
        }
    }
    Ok((RunStatus::Finished, last))
}

/// The start of a stage that trains on the run's demonstrations (SFT, distillation): the data
/// mixer, seeded as SFT's (so a distill stage with w = 0 is SFT to the bit) and restored when
/// resuming, and the first step to run; the stage announced.
pub(super) fn start_demonstrations(
    ctx: &mut RunContext<'_>,
    stage: Stage,
    steps: usize,
    data: &Domains,
    resume: Option<&Resume>,
    actor: &mut ActorTrain,
) -> Result<(DomainMixer, usize), RunError> {
    let mut mixer = data.mixer(mix_seed(&[ctx.cfg.seed, 1]))?;
    let mut first_step = 1;
    if let Some(r) = resume {
        if let Some(m) = &r.state.mixer {
            mixer.restore(m)?;
        }
        first_step = r.state.step + 1;
    }
    report_workers(ctx, actor.drain_events())?;
    ctx.emit(PipelineEvent::StageStarted {
        stage,
        total_steps: steps,
        done_steps: first_step - 1,
    });
    Ok((mixer, first_step))
}

/// A batch's token rows: (prompts, responses).
pub(super) type TokenRows = (Vec<Vec<u32>>, Vec<Vec<u32>>);

/// The token rows of a batch of examples: each prompt, and its demonstration (`response`, else
/// `ground_truth`) as the answer the policy learns.
pub(super) fn demonstrations(
    tok: &Tokenizing<'_>,
    batch: &[crate::data::Example],
) -> Result<TokenRows, RunError> {
    Ok(batch
        .iter()
        .map(|ex| {
            Ok((
                tok.prompt_ids(&ex.prompt)?,
                tok.answer_ids(ex.response.as_deref().unwrap_or(&ex.ground_truth))?,
            ))
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(RunError::Setup)?
        .into_iter()
        .unzip())
}
