//! Preference optimisation (DPO, cDPO, IPO): each step deals a batch of pairs, asks the reference
//! role for its log-probs of both completions (or reads them from a pass made before the first
//! step, `dpo.precompute_ref`), and hands the pairs to actor_train, which trains on them as on any
//! stage's batch with the preference loss (`DpoConfig::recipe`). Held-out pairs (`dpo.eval`) are
//! scored with the policy and the reference without training.
//!
//! The reference is the policy as the stage began: a copy made at the start, or, resuming, the
//! final checkpoint of the stage before (`setup::stage_start_reference`).

mod pairs;
mod samples;

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{Device, Tensor};

use self::pairs::{PairOrder, PairRows, PairSet};
use self::samples::StepPairs;
use super::setup::{Tokenizing, stage_start_reference};
use super::worker_report::report_workers;
use super::{PipelineEvent, Resume, RunContext, RunError, RunStatus, TensorContext, mix_seed};
use crate::algo::preference::{
    PairLogps, PreferenceParams, domain_rewards, preference_stats, preference_sums_by_group,
    preference_terms,
};
use crate::config::{DpoConfig, Stage};
use crate::data::mix::{DomainCursor, MixerState};
use crate::metrics::Metrics;
use crate::model::LoadedModel;
use crate::role::actor_infer::reference_of;
use crate::role::actor_train::ActorTrain;
use crate::role::epochs::{ActorStep, EpochRows, Targets};
use crate::role::reference::Reference;
use crate::role::rows::response_logprobs;
use crate::role::{ResidentRole, Restore};

/// The name of the stage's data cursor in checkpoints.
const CURSOR: &str = "dpo pairs";

pub fn run_dpo(
    ctx: &mut RunContext<'_>,
    cfg: &DpoConfig,
    model: &LoadedModel,
    chat_template: bool,
    resume: Option<&Resume>,
) -> Result<(RunStatus, Option<PathBuf>), RunError> {
    let run_cfg = ctx.cfg;
    let tok = Tokenizing {
        model,
        chat_template,
        template_options: &run_cfg.data.chat_template_options,
    };
    let positions = model.config().max_position_embeddings;
    let train = PairSet::load(&cfg.data, tok, positions)?;
    let eval = match &cfg.eval {
        Some(e) => Some(PairSet::load(&e.data, tok, positions)?),
        None => None,
    };
    for set in std::iter::once(&train).chain(&eval) {
        if set.skipped > 0 {
            ctx.emit(PipelineEvent::Message(format!(
                "dpo: skipped {} of the pairs in '{}': longer than the model's {positions} positions",
                set.skipped,
                set.path.display()
            )));
        }
    }
    if let Some(r) = resume {
        let cursor = r.state.mixer.as_ref().and_then(|m| m.domains.first());
        if cursor.is_none_or(|c| c.name != CURSOR || c.fingerprint != train.fingerprint) {
            return Err(RunError::Setup(format!(
                "cannot resume the dpo stage from '{}': the pairs in '{}' are not the ones it \
                 trained on",
                r.dir.display(),
                train.path.display()
            )));
        }
    }
    let reference = match resume {
        // Under LoRA the frozen base is shared and only the adapter is copied.
        None => reference_of(model)?,
        Some(_) => stage_start_reference(ctx.cfg, Stage::Dpo, model)?,
    };
    let mut refs = RefLogps::Live(
        Box::new(Reference::start(ctx.cfg, reference, model.pad_id)?),
        model.pad_id,
    );
    let restore = resume.map(|r| Restore {
        dir: &r.dir,
        optimizer_steps: r.state.optimizer_steps,
    });
    let mut actor = ActorTrain::start(ctx.cfg, cfg.recipe(), model, cfg.steps, restore)?;
    let sets = Sets {
        train: &train,
        eval: eval.as_ref(),
    };
    let outcome = dpo_steps(ctx, cfg, model, sets, &mut refs, &mut actor, resume);
    report_workers(ctx, actor.shutdown())?;
    if let RefLogps::Live(r, _) = &mut refs {
        report_workers(ctx, r.shutdown())?;
    }
    outcome
}

#[derive(Clone, Copy)]
struct Sets<'a> {
    train: &'a PairSet,
    eval: Option<&'a PairSet>,
}

/// Where the reference's log-probs come from.
enum RefLogps {
    /// Asked of the reference role (and the pad id its rows take) for each batch.
    Live(Box<Reference>, u32),
    /// Computed once for every row of the training and held-out pairs (per token, cut to each
    /// response's length), the reference gone since.
    Precomputed {
        train: Vec<Vec<f32>>,
        eval: Vec<Vec<f32>>,
    },
}

impl RefLogps {
    /// The reference's (n, width) log-probs of `rows`, pairs of the training set or, with
    /// `eval`, of the held-out one.
    fn of(
        &mut self,
        rows: &PairRows<'_>,
        eval: bool,
        micro: usize,
        device: &Device,
    ) -> Result<Tensor, RunError> {
        match self {
            RefLogps::Live(reference, pad) => {
                Ok(reference.logprobs(*pad, &rows.as_rows(micro), 1.0, device)?)
            }
            RefLogps::Precomputed { train, eval: held } => {
                let table = if eval { held } else { train };
                let (idx, width) = (rows.idx, rows.width());
                let mut data = Vec::with_capacity(idx.len() * 2 * width);
                for &i in idx {
                    for row in [&table[2 * i], &table[2 * i + 1]] {
                        data.extend_from_slice(row);
                        data.extend(std::iter::repeat_n(0f32, width - row.len()));
                    }
                }
                Tensor::from_vec(data, (idx.len() * 2, width), device).during("dpo reference")
            }
        }
    }
}

/// Every row's reference log-probs of `set`, cut to its response, `batch` pairs at a time.
fn precompute(
    reference: &mut RefLogps,
    set: &PairSet,
    eval: bool,
    (batch, micro): (usize, usize),
    device: &Device,
) -> Result<Vec<Vec<f32>>, RunError> {
    let mut table = vec![];
    let all: Vec<usize> = (0..set.pairs.len()).collect();
    for idx in all.chunks(batch) {
        let rows = set.rows(idx);
        let t = reference.of(&rows, eval, micro, device)?;
        for (row, r) in t
            .to_vec2::<f32>()
            .during("dpo reference")?
            .into_iter()
            .zip(&rows.responses)
        {
            table.push(row[..r.len()].to_vec());
        }
    }
    Ok(table)
}

fn dpo_steps(
    ctx: &mut RunContext<'_>,
    cfg: &DpoConfig,
    model: &LoadedModel,
    sets: Sets<'_>,
    refs: &mut RefLogps,
    actor: &mut ActorTrain,
    resume: Option<&Resume>,
) -> Result<(RunStatus, Option<PathBuf>), RunError> {
    let device = model.transformer.device().clone();
    let micro_rows = cfg.micro_pairs() * 2;
    let first_step = resume.map_or(1, |r| r.state.step + 1);
    report_workers(ctx, actor.drain_events())?;
    ctx.emit(PipelineEvent::StageStarted {
        stage: Stage::Dpo,
        total_steps: cfg.steps,
        done_steps: first_step - 1,
    });
    if cfg.precompute_ref {
        let t = Instant::now();
        let sizes = (cfg.batch_size, micro_rows);
        let train = precompute(refs, sets.train, false, sizes, &device)?;
        let eval = match sets.eval {
            Some(set) => precompute(refs, set, true, sizes, &device)?,
            None => vec![],
        };
        if let RefLogps::Live(r, _) = refs {
            report_workers(ctx, r.shutdown())?;
        }
        *refs = RefLogps::Precomputed { train, eval };
        ctx.emit(PipelineEvent::Message(format!(
            "dpo: the reference's log-probs of every pair computed in {:.1} s; the reference is \
             unloaded",
            t.elapsed().as_secs_f64()
        )));
    }
    let mut order = PairOrder::new(sets.train.pairs.len(), mix_seed(&[ctx.cfg.seed, 2]));
    let mut last = None;
    for step in first_step..=cfg.steps {
        let t0 = Instant::now();
        let idx = order.batch(step, cfg.batch_size);
        let rows = sets.train.rows(&idx);
        let ref_logp = refs.of(&rows, false, micro_rows, &device)?;
        let t_ref = t0.elapsed().as_secs_f64();
        let PairRows {
            prompts, responses, ..
        } = rows;
        let tokens: usize = responses.iter().map(Vec::len).sum();
        let loss_mask = EpochRows::response_mask(&responses, &device).during("dpo batch")?;
        let batch = ActorStep {
            rows: EpochRows {
                loss_mask: loss_mask.clone(),
                prompts,
                responses,
                group_size: 2,
                micro: micro_rows,
                // Seeds LoRA dropout's masks, one draw per step.
                seed: mix_seed(&[ctx.cfg.seed, 6, step as u64]),
            },
            targets: Targets::Preference {
                ref_logp: ref_logp.clone(),
                pair_domains: sets.train.domains_of(&idx),
            },
        };
        let t_train = Instant::now();
        let report = actor.train(&batch, model)?;
        let mut m = sets.train.name_domains(report.metrics);
        m.insert("time/train".into(), t_train.elapsed().as_secs_f64());
        let pairs = StepPairs {
            step,
            set: sets.train,
            idx: &idx,
            row_logps: &report.row_logps,
            ref_logp: &ref_logp,
            mask: &loss_mask,
            beta: cfg.beta,
        };
        let tokenizer = &model.tokenizer.tokenizer;
        ctx.record_samples(&pairs.records(|ids| tokenizer.decode(ids, true).unwrap_or_default())?)?;
        report_workers(ctx, actor.drain_events())?;
        let every = cfg.eval.as_ref().map_or(0, |e| e.every);
        if let Some(set) = sets.eval
            && (step == 1 || step % every == 0 || step == cfg.steps)
        {
            let t = Instant::now();
            let scored = evaluate(model, set, refs, cfg, &device)?;
            m.extend(scored);
            m.insert("time/eval".into(), t.elapsed().as_secs_f64());
        }
        let secs = t0.elapsed().as_secs_f64();
        m.insert("time/ref".into(), t_ref);
        m.insert("time/step".into(), secs);
        m.insert("system/tokens_per_s".into(), tokens as f64 / secs.max(1e-9));
        ctx.record_step(Stage::Dpo, step, cfg.steps, m)?;
        if ctx.after_data_step(
            model,
            &*actor,
            Stage::Dpo,
            (step, cfg.steps),
            &mut last,
            || MixerState {
                domains: vec![DomainCursor {
                    name: CURSOR.into(),
                    fingerprint: sets.train.fingerprint,
                    epoch: 0,
                    cursor: step * cfg.batch_size,
                    credit: 0.0,
                }],
            },
        )? {
            return Ok((RunStatus::Interrupted, last));
        }
    }
    Ok((RunStatus::Finished, last))
}

/// The held-out pairs scored by the policy as it is now against the reference: `eval/loss` and
/// `eval/rewards/*`, `eval/logps/*` as the training step names them.
fn evaluate(
    model: &LoadedModel,
    set: &PairSet,
    refs: &mut RefLogps,
    cfg: &DpoConfig,
    device: &Device,
) -> Result<Metrics, RunError> {
    let params: PreferenceParams = cfg.params();
    let micro = cfg.micro_pairs() * 2;
    // The pairs' losses and summed log-probs, batch by batch: (losses, c, r, ref c, ref r).
    let mut all: [Vec<f32>; 5] = Default::default();
    let mut chosen_tokens = 0usize;
    let pairs: Vec<usize> = (0..set.pairs.len()).collect();
    for idx in pairs.chunks(cfg.batch_size) {
        let rows = set.rows(idx);
        let mask = EpochRows::response_mask(&rows.responses, device).during("dpo eval")?;
        let logp = response_logprobs(&model.transformer, model.pad_id, &rows.as_rows(micro), 1.0)
            .during("dpo eval")?;
        let ref_logp = refs.of(&rows, true, micro, device)?;
        let (losses, sums) =
            preference_terms(&params, &logp, &ref_logp, &mask).during("dpo eval")?;
        let parts = [
            &losses,
            &sums.chosen,
            &sums.rejected,
            &sums.ref_chosen,
            &sums.ref_rejected,
        ];
        for (out, x) in all.iter_mut().zip(parts) {
            out.extend(x.to_vec1::<f32>().during("dpo eval")?);
        }
        // Row 2k is pair k's chosen completion.
        chosen_tokens += rows
            .responses
            .iter()
            .step_by(2)
            .map(Vec::len)
            .sum::<usize>();
    }
    let n = all[0].len();
    // As a training step's: the pairs' mean loss, weighted, plus the weighted negative
    // log-likelihood of the chosen completions over their tokens.
    let mut loss = params.weight * all[0].iter().map(|&l| l as f64).sum::<f64>() / n.max(1) as f64;
    if params.sft_weight != 0.0 {
        let chosen: f64 = all[1].iter().map(|&l| l as f64).sum();
        loss += params.sft_weight * -chosen / chosen_tokens.max(1) as f64;
    }
    let [_, c, r, rc, rr] = all.map(|v| Tensor::from_vec(v, n, device));
    let (c, r, rc, rr) = (
        c.during("dpo eval")?,
        r.during("dpo eval")?,
        rc.during("dpo eval")?,
        rr.during("dpo eval")?,
    );
    let x = PairLogps {
        chosen: &c,
        rejected: &r,
        ref_chosen: &rc,
        ref_rejected: &rr,
    };
    let s = preference_stats(params.beta, &x).during("dpo eval")?;
    let mut m = Metrics::new();
    if !set.domains.is_empty() {
        let groups = set.domains_of(&pairs);
        let by_domain = preference_sums_by_group(params.beta, &x, &groups).during("dpo eval")?;
        for (k, (sums, count)) in by_domain {
            let domain = &set.domains[k as usize];
            m.extend(domain_rewards(
                "eval/rewards",
                domain,
                &sums.mean_over(count),
            ));
        }
    }
    m.insert("eval/loss".into(), loss);
    m.extend(s.metrics("eval/"));
    Ok(m)
}
