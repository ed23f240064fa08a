//! Model-judged reward (`llm_judge`): a judge model (a Hugging Face directory) reads the prompt,
//! the response and the reference through a template and gives a verdict:
//! - `verdict: yes_no` (default): the probability of its `yes` token against its `no` token as the
//!   next token, `P(yes) / (P(yes) + P(no))`, from one batched forward pass: a score in [0, 1],
//!   correct above 0.5;
//! - `verdict: score`: it writes (greedy, `max_new_tokens`) and the first whole number 1-10 in its
//!   text is the verdict, scored n / 10 and correct from 6 up; text without one is unformatted, with
//!   the judge's words in the outcome's error.
//!
//! The template is Jinja (`{{ prompt }}`, `{{ response }}`, `{{ reference }}`). The judge runs in
//! the process that scores (the trainer, or each reward worker), loaded once per process and kept
//! in [`judges`], from which the reward role's time-sharing offloads and reloads it like every
//! model role; [`judge_batch`] scores many items in one pass, and [`prejudge`] lets a reward worker
//! batch a whole call before the per-item scoring finds its verdicts. Loading or template failures
//! are outcomes with an error, like every reward's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use super::RewardOutcome;
use crate::model::{LoadedModel, load_model_dir};

/// How the judge's verdict is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// P(yes) against P(no) as the next token.
    #[default]
    YesNo,
    /// A 1-10 score in the judge's text.
    Score,
}

/// The reward's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Params {
    pub model: PathBuf,
    pub template: String,
    pub verdict: Verdict,
    /// The tokens compared by `yes_no` (each must be one token of the judge's vocabulary).
    pub yes: String,
    pub no: String,
    /// Tokens the judge may write for `score`.
    pub max_new_tokens: usize,
}

/// The template used when a config gives none.
pub const DEFAULT_TEMPLATE: &str = "Question: {{ prompt }}\nReference answer: {{ reference }}\n\
Response: {{ response }}\nIs the response correct? Answer Yes or No.\nAnswer: ";

impl Params {
    pub fn new(model: PathBuf) -> Params {
        Params {
            model,
            template: DEFAULT_TEMPLATE.into(),
            verdict: Verdict::YesNo,
            yes: "Yes".into(),
            no: "No".into(),
            max_new_tokens: 16,
        }
    }

    /// Checks the template (rendering it once) without loading the model.
    pub fn check(&self) -> Result<(), String> {
        render(&self.template, "p", "r", "t").map(|_| ())
    }
}

fn render(template: &str, prompt: &str, response: &str, reference: &str) -> Result<String, String> {
    let env = minijinja::Environment::new();
    env.render_str(
        template,
        minijinja::context! { prompt => prompt, response => response, reference => reference },
    )
    .map_err(|e| format!("the judge's template: {e}"))
}

/// A judge model of this process: on its device, or moved to a host copy by the reward role's
/// time-sharing (`role::reward::judges`), which keeps everything but the weights so that a reload
/// needs only them.
pub enum JudgeSlot {
    Resident(Arc<LoadedModel>),
    Offloaded(Box<OffloadedJudge>),
}

/// An offloaded judge: its shape, tokenizer and special tokens, and where its weights are.
pub struct OffloadedJudge {
    pub config: crate::model::ModelConfig,
    pub tokenizer: crate::model::tokenizer::TokenizerFiles,
    pub eos_ids: Vec<u32>,
    pub pad_id: u32,
    pub host_copy: PathBuf,
}

/// The judge models of this process by directory: loaded on first use and kept until the reward
/// role offloads them.
pub fn judges() -> std::sync::MutexGuard<'static, HashMap<PathBuf, JudgeSlot>> {
    static JUDGES: OnceLock<Mutex<HashMap<PathBuf, JudgeSlot>>> = OnceLock::new();
    JUDGES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Loads the judge in `model` if this process does not hold it yet (a run does this at setup, so
/// that a bad judge directory stops the run before it starts rather than failing every verdict).
pub fn load(model: &Path) -> Result<(), String> {
    let mut held = judges();
    // An offloaded judge left by an earlier run of this process: its host copy went with that
    // run, so the judge is loaded afresh.
    if matches!(held.get(model), Some(JudgeSlot::Offloaded(_))) {
        held.remove(model);
    }
    drop(held);
    judge(model).map(drop)
}

/// The judge in `model`, loaded on first use. An offloaded judge is an error: scoring while the
/// reward role is off its devices would be a time-sharing bug, not a reason to load it again.
fn judge(model: &Path) -> Result<Arc<LoadedModel>, String> {
    let mut judges = judges();
    match judges.get(model) {
        Some(JudgeSlot::Resident(j)) => return Ok(Arc::clone(j)),
        Some(JudgeSlot::Offloaded(_)) => {
            return Err(format!(
                "the judge model '{}' is offloaded: the reward role scores only while it is on \
                 its devices",
                model.display()
            ));
        }
        None => {}
    }
    let loaded = load_model_dir(
        model,
        Some(candle_core::DType::F32),
        &crate::device::tool_device()
            .map_err(|e| format!("the judge model '{}': {e}", model.display()))?,
    )
    .map_err(|e| format!("the judge model '{}': {e}", model.display()))?;
    let loaded = Arc::new(loaded);
    judges.insert(
        model.to_path_buf(),
        JudgeSlot::Resident(Arc::clone(&loaded)),
    );
    Ok(loaded)
}

/// One item to judge: (prompt, response, reference).
pub type Item<'a> = (&'a str, &'a str, &'a str);

/// Verdicts on `items`, in order, in one batch.
pub fn judge_batch(params: &Params, items: &[Item<'_>]) -> Vec<RewardOutcome> {
    match try_judge(params, items) {
        Ok(out) => out,
        Err(e) => items.iter().map(|_| failed(e.clone())).collect(),
    }
}

fn failed(error: String) -> RewardOutcome {
    RewardOutcome {
        error: Some(format!("llm_judge: {error}")),
        ..RewardOutcome::unformatted()
    }
}

fn try_judge(params: &Params, items: &[Item<'_>]) -> Result<Vec<RewardOutcome>, String> {
    if items.is_empty() {
        return Ok(vec![]);
    }
    let model = judge(&params.model)?;
    let tok = &model.tokenizer.tokenizer;
    let prompts: Vec<Vec<u32>> = items
        .iter()
        .map(|(p, r, t)| {
            let text = render(&params.template, p, r, t)?;
            let ids = tok
                .encode(text, false)
                .map_err(|e| format!("tokenizing the judge's prompt: {e}"))?
                .get_ids()
                .to_vec();
            if ids.is_empty() {
                return Err("the judge's prompt is empty".to_string());
            }
            Ok(ids)
        })
        .collect::<Result<_, String>>()?;
    match params.verdict {
        Verdict::YesNo => yes_no(&model, params, &prompts),
        Verdict::Score => scored(&model, params, &prompts),
    }
}

/// The id of `text` as exactly one token of the judge's vocabulary.
fn one_token(model: &LoadedModel, text: &str) -> Result<u32, String> {
    let ids = model
        .tokenizer
        .tokenizer
        .encode(text, false)
        .map_err(|e| format!("tokenizing '{text}': {e}"))?;
    match ids.get_ids() {
        [id] => Ok(*id),
        other => Err(format!(
            "'{text}' must be one token of the judge's vocabulary, it is {}",
            other.len()
        )),
    }
}

fn yes_no(
    model: &LoadedModel,
    params: &Params,
    prompts: &[Vec<u32>],
) -> Result<Vec<RewardOutcome>, String> {
    let (yes, no) = (
        one_token(model, &params.yes)?,
        one_token(model, &params.no)?,
    );
    let (yes, no) = ([yes], [no]);
    // Rows 2i and 2i+1: the prompt followed by `yes`, and by `no`.
    let pairs: Vec<(&[u32], &[u32])> = prompts
        .iter()
        .flat_map(|p| [(p.as_slice(), &yes[..]), (p.as_slice(), &no[..])])
        .collect();
    let t = &model.transformer;
    let batch = crate::train::batch::TrainBatch::new(
        &pairs,
        model.pad_id,
        t.config().kv_groups(),
        t.device(),
    )
    .map_err(|e| format!("batching the judge's prompts: {e}"))?;
    let (logp, _) = crate::train::batch::response_forward(
        t,
        &batch,
        1.0,
        crate::model::Numerics::Fast,
        false,
        None,
    )
    .and_then(|(l, e)| {
        Ok((
            l.to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
            e,
        ))
    })
    .map_err(|e| format!("the judge's forward pass: {e}"))?;
    Ok(logp
        .chunks(2)
        .map(|pair| {
            // P(yes) / (P(yes) + P(no)) = 1 / (1 + exp(log P(no) - log P(yes))).
            let p = 1.0 / (1.0 + f64::from(pair[1] - pair[0]).exp());
            RewardOutcome {
                score: p as f32,
                ..RewardOutcome::graded(format!("P({}) {p:.3}", params.yes), p > 0.5)
            }
        })
        .collect())
}

fn scored(
    model: &LoadedModel,
    params: &Params,
    prompts: &[Vec<u32>],
) -> Result<Vec<RewardOutcome>, String> {
    use crate::rollout::engine::{Request, generate};
    use crate::rollout::sampling::SamplingParams;
    let sampling = SamplingParams {
        temperature: 0.0,
        max_new_tokens: params.max_new_tokens,
        ..SamplingParams::default()
    };
    let requests = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            id: i as u64,
            prompt_ids: p.clone(),
            params: sampling.clone(),
            seed: 0,
        })
        .collect();
    let done = generate(
        &model.transformer,
        &model.eos_ids,
        requests,
        prompts.len().max(1),
        None,
    )
    .map_err(|e| format!("the judge's generation: {e}"))?;
    let tok = &model.tokenizer.tokenizer;
    Ok(done
        .iter()
        .map(|c| {
            let text = tok.decode(&c.token_ids, true).unwrap_or_default();
            match first_score(&text) {
                Some(n) => RewardOutcome {
                    score: n as f32 / 10.0,
                    ..RewardOutcome::graded(n.to_string(), n >= 6)
                },
                None => RewardOutcome {
                    error: Some(format!(
                        "llm_judge: no 1-10 score in the judge's output {text:?}"
                    )),
                    ..RewardOutcome::unformatted()
                },
            }
        })
        .collect())
}

/// The first whole number 1-10 standing alone in `text` ("8/10" gives 8; "100" gives nothing).
fn first_score(text: &str) -> Option<u32> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            let n: u32 = text[start..i].parse().unwrap_or(0);
            if (1..=10).contains(&n) {
                return Some(n);
            }
        } else {
            i += 1;
        }
    }
    None
}

type MemoKey = (Params, String, String, String);

fn memo() -> &'static Mutex<HashMap<MemoKey, RewardOutcome>> {
    static MEMO: OnceLock<Mutex<HashMap<MemoKey, RewardOutcome>>> = OnceLock::new();
    MEMO.get_or_init(Default::default)
}

/// Judges every `(params, item)` in batches (one per judge) and keeps the verdicts for
/// [`score`], which takes them out: how a reward call gets batched judging without changing how
/// each item is scored.
pub fn prejudge(work: &[(&Params, Item<'_>)]) {
    let mut groups: HashMap<&Params, Vec<Item<'_>>> = HashMap::new();
    for (p, item) in work {
        groups.entry(*p).or_default().push(*item);
    }
    for (params, items) in groups {
        let verdicts = judge_batch(params, &items);
        let mut memo = memo().lock().unwrap_or_else(|p| p.into_inner());
        for ((p, r, t), v) in items.iter().zip(verdicts) {
            memo.insert(
                (params.clone(), p.to_string(), r.to_string(), t.to_string()),
                v,
            );
        }
    }
}

/// Scores one response: a verdict [`prejudge`] computed, else a batch of one.
pub fn score(prompt: &str, response: &str, reference: &str, params: &Params) -> RewardOutcome {
    let key = (
        params.clone(),
        prompt.to_string(),
        response.to_string(),
        reference.to_string(),
    );
    if let Some(v) = memo()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key)
    {
        return v;
    }
    judge_batch(params, &[(prompt, response, reference)]).remove(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_the_first_lone_number_from_1_to_10() {
        assert_eq!(first_score("Score: 8/10"), Some(8));
        assert_eq!(first_score("I give it a 10."), Some(10));
        assert_eq!(first_score("100 points, so 7"), Some(7));
        assert_eq!(first_score("zero 0"), None);
        assert_eq!(first_score("no number"), None);
    }

    #[test]
    fn templates_render_and_bad_ones_are_errors() {
        let text = render(DEFAULT_TEMPLATE, "2+2?", "4", "4").unwrap_or_default();
        assert!(
            text.contains("Question: 2+2?") && text.ends_with("Answer: "),
            "{text}"
        );
        assert!(
            render("{{ prompt", "p", "r", "t")
                .unwrap_err()
                .contains("template")
        );
        let out = judge_batch(
            &Params::new("/nonexistent/judge".into()),
            &[("p", "r", "t")],
        );
        assert!(
            out[0]
                .error
                .as_deref()
                .unwrap_or_default()
                .contains("/nonexistent/judge")
        );
    }
}
