//! `roll-tui eval`: a model scored on held-out prompts with a config's rewards, outside any run:
//! the prompts of `--data` files, or the held-out sets of the config's domains (`val_path`,
//! `val_split`). The scoring is `rl.eval`'s ([`super::rl_eval`]); what it gives back is what an
//! evaluation run stores: the `val/<domain>/…` metrics and every scored answer.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::RunError;
use super::rl_eval::{Evaluation, Scored};
use super::setup::{Domain, Domains, Tokenizing, check_prompt, domain_reward, load_domains};
use crate::config::{RlEval, RunConfig, Stage};
use crate::data::Example;
use crate::metrics::{Metrics, SampleRecord};
use crate::model::LoadedModel;
use crate::role::reward::{RewardScorer, SharedScorer};
use crate::rollout::{Engine, SamplingParams};

/// A `--data` file: its prompts count towards `domain`, or, without one, towards the domain
/// each line names (`"domain": …`) or the config's only domain.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalFile {
    pub domain: Option<String>,
    pub path: PathBuf,
}

/// What an evaluation found: the `val/<domain>/…` metrics, each answer as a sample of stage
/// `eval`, and the rewards' errors as (domain, error, samples it scored 0).
pub struct EvalOutcome {
    pub metrics: Metrics,
    pub samples: Vec<SampleRecord>,
    pub reward_errors: Vec<(String, String, usize)>,
}

/// The domains to evaluate: the `files`' prompts as their domains' held-out sets (no training
/// data is read), or with no files the held-out sets the config's domains declare.
pub fn eval_domains(
    cfg: &RunConfig,
    model: &LoadedModel,
    files: &[EvalFile],
) -> Result<Domains, RunError> {
    // Held-out files alone need no training data (a val_split does: it is cut from it).
    let val_files: Option<Vec<EvalFile>> = cfg
        .data
        .domains
        .iter()
        .filter(|d| d.val_path.is_some() || d.val_split.is_some())
        .map(|d| {
            d.val_path.as_ref().map(|p| EvalFile {
                domain: Some(d.name.clone()),
                path: p.clone(),
            })
        })
        .collect();
    if files.is_empty()
        && let Some(val_files) = val_files.filter(|f| !f.is_empty())
    {
        return eval_domains(cfg, model, &val_files);
    }
    if files.is_empty() {
        let domains = load_domains(cfg, model)?;
        if domains.domains.iter().all(|d| d.val.is_empty()) {
            return Err(RunError::Setup(format!(
                "the config of '{}' holds out no prompts: pass --data FILE (a JSONL file of \
                 prompts and ground truths), or give a domain 'val_path' or 'val_split'",
                cfg.name
            )));
        }
        return Ok(domains);
    }
    let known: Vec<&str> = cfg.data.domains.iter().map(|d| d.name.as_str()).collect();
    let mut val: BTreeMap<&str, Vec<Example>> = BTreeMap::new();
    // (domain, prompt) → its ground truth, to find a prompt given twice with two answers.
    let mut truths: std::collections::HashMap<(String, String), String> = Default::default();
    let tok = Tokenizing {
        model,
        chat_template: cfg.data.chat_template,
        template_options: &cfg.data.chat_template_options,
    };
    let positions = model.config().max_position_embeddings;
    for file in files {
        let shown = file.path.display();
        if let Some(d) = &file.domain
            && !known.contains(&d.as_str())
        {
            return Err(RunError::Setup(format!(
                "--data {d}={shown}: the config has no domain '{d}' (its domains: {})",
                known.join(", ")
            )));
        }
        // An empty default tells a line without `domain` from one that names it.
        for (line, mut e) in crate::data::jsonl::load_jsonl_numbered(&file.path, "")? {
            let at = format!("'{shown}' line {line}");
            let domain = match (&file.domain, e.domain.as_str()) {
                (Some(d), _) => d.as_str(),
                (None, "") if known.len() == 1 => known[0],
                (None, "") => {
                    return Err(RunError::Setup(format!(
                        "{at} names no domain, and the config has several ({}): give the line \
                         a \"domain\", or pass --data DOMAIN={shown}",
                        known.join(", ")
                    )));
                }
                (None, named) => match known.iter().find(|k| **k == named) {
                    Some(k) => k,
                    None => {
                        return Err(RunError::Setup(format!(
                            "{at}: domain '{named}' is not one of the config's ({})",
                            known.join(", ")
                        )));
                    }
                },
            };
            check_prompt(
                tok,
                &format!("{at} (domain '{domain}')"),
                &e.prompt,
                positions,
            )?;
            e.domain = domain.to_string();
            // The same prompt twice is evaluated once; with two answers it is a mistake.
            let key = (domain.to_string(), e.prompt.clone());
            match truths.get(&key) {
                Some(first) if *first != e.ground_truth => {
                    return Err(RunError::Setup(format!(
                        "{at}: prompt '{}' is already in domain '{domain}' with ground truth \
                         '{}', and here with '{}': keep one",
                        crate::text::clean(&e.prompt, 60, false),
                        crate::text::clean(first, 40, false),
                        crate::text::clean(&e.ground_truth, 40, false)
                    )));
                }
                Some(_) => {}
                None => {
                    truths.insert(key, e.ground_truth.clone());
                }
            }
            val.entry(domain).or_default().push(e);
        }
    }
    let mut domains = vec![];
    for d in &cfg.data.domains {
        let Some(val) = val.remove(d.name.as_str()) else {
            continue;
        };
        domains.push(Domain {
            name: d.name.clone(),
            examples: vec![],
            val,
            ratio: d.ratio,
            reward: domain_reward(d)?,
        });
    }
    Ok(Domains {
        domains,
        chat_template: cfg.data.chat_template,
        template_options: cfg.data.chat_template_options.clone(),
    })
}

/// Score `model` on `data`'s held-out prompts as `eval` says, sampling with `sampling` (its
/// temperature is `eval`'s), in this process; `progress(done, total)` hears of each answer.
pub fn evaluate_model(
    cfg: &RunConfig,
    model: &LoadedModel,
    data: &Domains,
    eval: &RlEval,
    sampling: &SamplingParams,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalOutcome, RunError> {
    let tok = Tokenizing {
        model,
        chat_template: data.chat_template,
        template_options: &data.template_options,
    };
    let scorer = SharedScorer::new(RewardScorer::in_process_with(&data.judge_models())?);
    let evaluation = Evaluation {
        sampling,
        data,
        tok,
        scorer,
        seed: cfg.seed,
    };
    // Under LoRA the engine decodes with the adapter merged in, as actor_infer does.
    let merged = match model.transformer.lora() {
        Some(_) => Some(crate::role::actor_infer::copy_of(model)?),
        None => None,
    };
    let policy = merged.as_ref().unwrap_or(&model.transformer);
    let batch = cfg.rl.as_ref().map_or(64, |rl| rl.rollout_batch);
    let detok = move |ids: &[u32]| tok.decode(ids);
    let mut engine = Engine::new(policy, model.eos_ids.clone(), batch).with_detokenizer(&detok);
    let scored = evaluation.score(eval, &mut engine, 0, progress)?;
    Ok(EvalOutcome {
        metrics: scored.metrics(),
        reward_errors: scored.reward_errors(),
        samples: sample_records(&scored),
    })
}

/// Each scored answer as a sample of stage `eval`, step 1 (an evaluation run's one step).
fn sample_records(scored: &Scored<'_>) -> Vec<SampleRecord> {
    scored
        .samples
        .iter()
        .map(|s| SampleRecord {
            stage: Stage::Eval.as_str().into(),
            step: 1,
            domain: s.domain.to_string(),
            prompt: s.example.prompt.clone(),
            response: s.response.clone(),
            ground_truth: s.example.ground_truth.clone(),
            reward: s.outcome.score,
            correct: s.outcome.correct,
            breakdown: s.outcome.breakdown(),
            advantage: 0.0,
            prompt_tokens: s.completion.prompt_ids.len(),
            response_tokens: s.completion.token_ids.len(),
            finish_reason: s.completion.finish.as_str().into(),
            policy_version: 0,
            tokens: None,
        })
        .collect()
}
