//! Offline knowledge distillation (`distill:`): the student learns the run's demonstrations and
//! the teacher's distributions over its top k at every response token. The stage supplies the
//! batches and the teacher's top k (the teacher role, in this process or its worker process);
//! actor_train trains on them as it does in SFT, with `(1 − w) CE + w KD` as its loss
//! (`DistillConfig::recipe`). The two alternate on the devices they share: each step enters the
//! `teach` phase (unless the cache holds the batch's top k) and then `train`, and time-sharing
//! offloads the one that is not working, as an RL run's roles are.

mod cache;

use std::path::PathBuf;
use std::time::Instant;

use cache::TopKCache;

use crate::config::{DistillConfig, RunConfig, Stage};
use crate::metrics::Metrics;
use crate::model::LoadedModel;
use crate::role::actor_train::ActorTrain;
use crate::role::epochs::{ActorStep, EpochRows, Targets};
use crate::role::rows::Rows;
use crate::role::teacher::Teacher;
use crate::role::{ResidentRole, Restore};
use crate::scheduler::{Phase, Placement};

use super::setup::{Domains, Tokenizing};
use super::time_sharing::TimeSharing;
use super::worker_report::report_workers;
use super::{Resume, RunContext, RunError, RunStatus, TensorContext, mix_seed};

/// The distillation stage's placement (actor_train and the teacher, time-sharing the devices
/// they share), refused with a message naming device and bytes if it cannot fit.
pub fn placement_for(run: &RunConfig, model: &LoadedModel) -> Result<Option<Placement>, RunError> {
    let Some(cfg) = &run.distill else {
        return Ok(None);
    };
    let teacher =
        crate::role::teacher::shape_of("distill.teacher", &cfg.teacher).map_err(RunError::Setup)?;
    Placement::for_distill(
        &run.workers,
        model.config(),
        &teacher,
        run.model.dtype.candle().size_in_bytes(),
        run.workers.devices.budget_bytes()?,
    )
    .and_then(|p| p.on_nodes(&super::setup::worker_nodes(&run.workers)))
    .map(Some)
    .map_err(|e| RunError::Setup(e.to_string()))
}

pub fn run_distill(
    ctx: &mut RunContext<'_>,
    cfg: &DistillConfig,
    model: &LoadedModel,
    data: &Domains,
    resume: Option<&Resume>,
) -> Result<(RunStatus, Option<PathBuf>), RunError> {
    let placement = placement_for(ctx.cfg, model)?
        .ok_or_else(|| RunError::Setup("the run has no distill section".into()))?;
    let mut sharing = TimeSharing::new(placement, &ctx.cfg.workers.devices)?;
    let mut teacher = Teacher::start(ctx.cfg, "distill.teacher", &cfg.teacher, model)?;
    let cache = match &cfg.cache {
        Some(dir) => Some(TopKCache::open(dir, &cfg.teacher)?),
        None => None,
    };
    report_workers(ctx, teacher.drain_events())?;
    let restore = resume.map(|r| Restore {
        dir: &r.dir,
        optimizer_steps: r.state.optimizer_steps,
    });
    let mut actor = ActorTrain::start(ctx.cfg, cfg.recipe(), model, cfg.steps, restore)?;
    let outcome = distill_steps(
        ctx,
        cfg,
        model,
        (&mut teacher, cache.as_ref(), &mut sharing),
        data,
        resume,
        &mut actor,
    );
    report_workers(ctx, actor.shutdown())?;
    report_workers(ctx, teacher.shutdown())?;
    outcome
}

fn distill_steps(
    ctx: &mut RunContext<'_>,
    cfg: &DistillConfig,
    model: &LoadedModel,
    (teacher, cache, sharing): (&mut Teacher, Option<&TopKCache>, &mut TimeSharing),
    data: &Domains,
    resume: Option<&Resume>,
    actor: &mut ActorTrain,
) -> Result<(RunStatus, Option<PathBuf>), RunError> {
    // Batches and dropout seeds drawn as SFT draws them: with w = 0 the stage is SFT, to the bit.
    let (mut mixer, first_step) =
        super::sft::start_demonstrations(ctx, Stage::Distill, cfg.steps, data, resume, actor)?;
    let tok = Tokenizing {
        model,
        chat_template: data.chat_template,
        template_options: &data.template_options,
    };
    let temperature = cfg.kd_temperature * cfg.teacher_temperature;
    let device = model.transformer.device().clone();
    let names: Vec<String> = data.domains.iter().map(|d| d.name.clone()).collect();
    let mut cached = 0usize;
    let mut last = None;
    for step in first_step..=cfg.steps {
        let t0 = Instant::now();
        let batch = mixer.next_batch(cfg.batch_size);
        let (prompts, responses) = super::sft::demonstrations(&tok, &batch)?;
        let row_domains = batch
            .iter()
            .map(|ex| {
                let at = names.iter().position(|n| *n == ex.domain);
                at.map(|i| i as u32).ok_or_else(|| {
                    RunError::Setup(format!(
                        "distill: an example of domain '{}', which the run does not have",
                        ex.domain
                    ))
                })
            })
            .collect::<Result<Vec<u32>, _>>()?;
        // Offloads and reloads of the step, as `time/offload` and `time/reload`.
        let mut moves = Metrics::new();
        let t_teacher = Instant::now();
        let rows = Rows {
            prompts: &prompts,
            responses: &responses,
            micro: cfg.micro(),
            width: responses.iter().map(Vec::len).max().unwrap_or(0),
        };
        let kept = cache.map(|c| {
            let what = (cfg.logits_topk, temperature, teacher.vocab());
            c.path_of(&rows, what, ctx.cfg.model.dtype.hf_name())
        });
        let top = match (cache, &kept) {
            (Some(c), Some(path)) => match c.read(path, &device)? {
                Some(top) => {
                    cached += 1;
                    top
                }
                None => {
                    sharing.enter(Phase::Teach, &mut [actor, teacher], model, ctx, &mut moves)?;
                    let top = teacher.top_k(&rows, cfg.logits_topk, temperature, &device)?;
                    c.write(path, &top)?;
                    top
                }
            },
            _ => {
                sharing.enter(Phase::Teach, &mut [actor, teacher], model, ctx, &mut moves)?;
                teacher.top_k(&rows, cfg.logits_topk, temperature, &device)?
            }
        };
        report_workers(ctx, teacher.drain_events())?;
        // The teacher's work, without the moves that brought it onto its devices.
        let teacher_secs = t_teacher.elapsed().as_secs_f64() - moves.values().sum::<f64>();
        let total_tokens: usize = responses.iter().map(Vec::len).sum();
        let loss_mask = EpochRows::response_mask(&responses, model.transformer.device())
            .during("distill batch")?;
        let step_rows = ActorStep {
            rows: EpochRows {
                prompts,
                responses,
                group_size: 1,
                micro: cfg.micro(),
                loss_mask,
                seed: mix_seed(&[ctx.cfg.seed, 5, step as u64]),
            },
            targets: Targets::Distill {
                topk_ids: top.ids,
                topk_logp: top.logp,
                row_domains,
            },
        };
        sharing.enter(Phase::Train, &mut [actor, teacher], model, ctx, &mut moves)?;
        let t_train = Instant::now();
        let mut m = name_domains(actor.train(&step_rows, model)?.metrics, &names);
        m.extend(moves);
        report_workers(ctx, actor.drain_events())?;
        let secs = t0.elapsed().as_secs_f64();
        m.insert("time/teacher".into(), teacher_secs);
        if cache.is_some() {
            // The steps so far whose top k came from the cache.
            m.insert("distill/cached_batches".into(), cached as f64);
        }
        m.insert("time/train".into(), t_train.elapsed().as_secs_f64());
        m.insert("time/step".into(), secs);
        // What crosses from the teacher per response token: k ids (u32) and k log-probs (f32).
        m.insert(
            "distill/topk_bytes_per_token".into(),
            (8 * cfg.logits_topk) as f64,
        );
        m.insert(
            "system/tokens_per_s".into(),
            total_tokens as f64 / secs.max(1e-9),
        );
        ctx.record_step(Stage::Distill, step, cfg.steps, m)?;
        if ctx.after_data_step(
            model,
            &*actor,
            Stage::Distill,
            (step, cfg.steps),
            &mut last,
            || mixer.state(),
        )? {
            return Ok((RunStatus::Interrupted, last));
        }
    }
    Ok((RunStatus::Finished, last))
}

/// `distill/<index>/<name>` as `distill/<domain>/<name>`.
fn name_domains(m: crate::metrics::Metrics, names: &[String]) -> crate::metrics::Metrics {
    m.into_iter()
        .map(|(key, v)| {
            let named = match key.split('/').collect::<Vec<_>>().as_slice() {
                ["distill", index, name] => index
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| names.get(i))
                    .map(|d| format!("distill/{d}/{name}")),
                _ => None,
            };
            (named.unwrap_or(key), v)
        })
        .collect()
}
