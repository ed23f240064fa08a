//! Turning a config into a policy model and tokenized, reward-tagged domains.

use crate::config::{RunConfig, Stage};
use crate::data::{DomainMixer, Example};
use crate::model::chat_template::{ChatMessage, ChatRender, TemplateOptions};
use crate::model::lora::{Adapter, LoraSettings, LoraVars};
use crate::model::{InitOptions, LoadedModel, Transformer, init_model, load_model_dir};
use crate::reward::Reward;

use super::RunError;

/// On a GPU, refuse a model whose weights alone do not fit in the device's free memory, with the
/// numbers, before reading them (candle would fail part-way with the driver's bare "out of
/// memory"). The CPU's devices are budgets that placement checks (`rlvr::placement_for`).
fn check_fits(
    path: &std::path::Path,
    dtype: candle_core::DType,
    device: crate::device::DeviceSpec,
) -> Result<(), RunError> {
    let Some(mem) = crate::device::memory(device)? else {
        return Ok(());
    };
    let config = crate::model::read_model_config(path)?;
    let weights = crate::scheduler::placement::estimate_bytes(
        crate::config::Role::Reference,
        &config,
        dtype.size_in_bytes(),
        0,
    );
    if weights > mem.free_bytes {
        return Err(RunError::Setup(format!(
            "model '{}' needs {} for its weights on {device} but the driver reports {} free of {}: \
             free memory there, use a larger GPU, or compute in bf16 (model.dtype: bfloat16)",
            path.display(),
            crate::text::human_bytes(weights),
            crate::text::human_bytes(mem.free_bytes),
            crate::text::human_bytes(mem.total_bytes)
        )));
    }
    Ok(())
}

/// The policy named by `model:` (a HF directory, or a seeded random init), with a fresh LoRA
/// adapter when `model.lora` asks for one. It computes on the trainer's device
/// (`WorkersConfig::trainer_device`), where in-process roles run.
pub fn load_policy(cfg: &RunConfig) -> Result<LoadedModel, RunError> {
    let model = load_base_policy(cfg)?;
    let Some(settings) = &cfg.model.lora else {
        return Ok(model);
    };
    let lora = fresh_adapter(cfg, settings, &model)?;
    Ok(model.with_lora(Some(lora)))
}

/// The run's fresh adapter for `model`'s base: seeded, so a resumed stage makes the same one.
fn fresh_adapter(
    cfg: &RunConfig,
    settings: &LoraSettings,
    model: &LoadedModel,
) -> Result<LoraVars, RunError> {
    LoraVars::init(
        settings,
        model.config().num_hidden_layers,
        model.transformer.params(),
        crate::data::mix_seed(&[cfg.seed, 3]),
        &base_model_name(cfg),
    )
    .map_err(|e| RunError::Setup(format!("model.lora: {e}")))
}

/// The adapter of checkpoint `dir` on `base`'s device, checked against the base it will adapt.
fn checkpoint_adapter(
    cfg: &RunConfig,
    settings: &LoraSettings,
    dir: &std::path::Path,
    base: &crate::model::Transformer,
) -> Result<LoraVars, RunError> {
    let device = base.device();
    let adapter = Adapter::load(dir, device)?;
    adapter.check_against(base.params(), &dir.display().to_string())?;
    LoraVars::from_adapter(&adapter, settings, &base_model_name(cfg), device)
        .map_err(|e| RunError::Setup(format!("checkpoint '{}': {e}", dir.display())))
}

/// How an adapter's config names its base: the model directory, or the init it came from.
fn base_model_name(cfg: &RunConfig) -> String {
    match &cfg.model.path {
        Some(path) => path.display().to_string(),
        None => format!("model.init of run '{}' (seed {})", cfg.name, cfg.seed),
    }
}

/// The model `model:` names, without an adapter.
fn load_base_policy(cfg: &RunConfig) -> Result<LoadedModel, RunError> {
    let dtype = cfg.model.dtype;
    let device = crate::device::open(cfg.workers.trainer_device())?;
    match (&cfg.model.path, &cfg.model.init) {
        (Some(path), _) => {
            check_fits(path, dtype.candle(), cfg.workers.trainer_device())?;
            Ok(load_model_dir(path, Some(dtype.candle()), &device)?)
        }
        (None, Some(init)) => Ok(init_model(&InitOptions {
            arch: init.arch,
            hidden: init.hidden,
            layers: init.layers,
            heads: init.heads,
            kv_heads: init.kv_heads,
            intermediate: init.intermediate,
            head_dim: init.head_dim,
            tie_embeddings: init.tie_embeddings,
            max_positions: init.max_positions,
            rope_theta: init.rope_theta,
            chars: init.chars.clone(),
            dtype: dtype.hf_name().into(),
            seed: cfg.seed,
        })?
        .to_device(&device)?),
        (None, None) => Err(RunError::Setup("model: set either 'path' or 'init'".into())),
    }
}

/// The policy saved in checkpoint `dir`, in the config's dtype: under `model.lora` the base
/// `model:` names with the checkpoint's adapter.
pub fn load_checkpoint_policy(
    cfg: &RunConfig,
    dir: &std::path::Path,
) -> Result<LoadedModel, RunError> {
    let device = crate::device::open(cfg.workers.trainer_device())?;
    if let Some(settings) = &cfg.model.lora {
        let base = load_base_policy(cfg)?;
        let lora = checkpoint_adapter(cfg, settings, dir, &base.transformer)?;
        return Ok(base.with_lora(Some(lora)));
    }
    Ok(load_model_dir(
        dir,
        Some(cfg.model.dtype.candle()),
        &device,
    )?)
}

/// The policy as it was when the RL stage began (the frozen reference of a resumed RL stage).
pub fn rl_start_policy(cfg: &RunConfig) -> Result<LoadedModel, RunError> {
    stage_start_policy(cfg, Stage::Rl)
}

/// The policy as it was when `stage` began (the frozen reference of a resumed RL or DPO stage):
/// the final checkpoint of the stage before it, else the configured model.
pub fn stage_start_policy(cfg: &RunConfig, stage: Stage) -> Result<LoadedModel, RunError> {
    match stage_start_checkpoint(cfg, stage)? {
        Some(dir) => load_checkpoint_policy(cfg, &dir),
        None => load_policy(cfg),
    }
}

/// The final checkpoint of the stage before `stage` (what a resumed `stage` starts its reference
/// from); `None` when `stage` is the run's first. Missing is an error.
fn stage_start_checkpoint(
    cfg: &RunConfig,
    stage: Stage,
) -> Result<Option<std::path::PathBuf>, RunError> {
    let Some(before) = cfg.stage_before(stage).map(|s| s.stage()) else {
        return Ok(None);
    };
    let dir = super::checkpoint_dir(&cfg.output_dir(), before, cfg.steps_of(before));
    if !dir.join("trainer_state.json").exists() {
        return Err(RunError::Setup(format!(
            "resuming {stage} needs the final {before} checkpoint '{}' (its reference policy), and \
             it is missing",
            dir.display()
        )));
    }
    Ok(Some(dir))
}

/// The frozen reference of a resumed `stage`: [`stage_start_policy`]'s model, but under LoRA a
/// view of `policy`'s own base (frozen, so the stage has not moved it) with the adapter as the
/// stage began — the previous stage's final adapter, or without a stage before the seeded fresh
/// one [`load_policy`] makes — so that a resumed stage holds no second copy of the base either.
pub fn stage_start_reference(
    cfg: &RunConfig,
    stage: Stage,
    policy: &LoadedModel,
) -> Result<Transformer, RunError> {
    let (Some(settings), Some(_)) = (&cfg.model.lora, policy.transformer.lora()) else {
        return Ok(stage_start_policy(cfg, stage)?.transformer);
    };
    let view = Transformer::new(policy.config().clone(), policy.transformer.params().clone())
        .map_err(|e| RunError::Setup(format!("the reference of {stage}: {e}")))?;
    let lora = match stage_start_checkpoint(cfg, stage)? {
        Some(dir) => checkpoint_adapter(cfg, settings, &dir, &policy.transformer)?,
        None => fresh_adapter(cfg, settings, policy)?,
    };
    Ok(view.with_lora(Some(lora)))
}

/// A domain's examples with its mixing weight and reward rule.
pub struct Domain {
    pub name: String,
    /// What every stage trains on.
    pub examples: Vec<Example>,
    /// Held out for `rl.eval` (`val_path`, or `val_split` of the domain's examples): never trained on.
    pub val: Vec<Example>,
    pub ratio: f64,
    pub reward: Reward,
}

pub struct Domains {
    pub domains: Vec<Domain>,
    pub chat_template: bool,
    pub template_options: TemplateOptions,
}

impl Domains {
    /// A fresh mixer over all domains, seeded per stage so SFT and RL walk the data independently.
    pub fn mixer(&self, seed: u64) -> Result<DomainMixer, RunError> {
        let parts = self
            .domains
            .iter()
            .map(|d| (d.name.clone(), d.examples.clone(), d.ratio))
            .collect();
        Ok(DomainMixer::new(parts, seed)?)
    }

    /// The reward of `domain`; a domain the run does not have is an error, never a default.
    pub fn reward_of(&self, domain: &str) -> Result<&Reward, RunError> {
        self.domains
            .iter()
            .find(|d| d.name == domain)
            .map(|d| &d.reward)
            .ok_or_else(|| {
                RunError::Setup(format!(
                    "a prompt of domain '{domain}' has no reward: the run's domains are {}",
                    self.names().join(", ")
                ))
            })
    }

    /// The judge models of the domains' rewards (`llm_judge`), each once, in domain order.
    pub fn judge_models(&self) -> Vec<std::path::PathBuf> {
        let mut models: Vec<std::path::PathBuf> = vec![];
        for judge in self.domains.iter().flat_map(|d| d.reward.judges()) {
            if !models.contains(&judge.model) {
                models.push(judge.model.clone());
            }
        }
        models
    }

    pub fn names(&self) -> Vec<String> {
        self.domains.iter().map(|d| d.name.clone()).collect()
    }
}

/// Bytes per model position beyond which a prompt is refused without tokenizing it.
pub(super) const MAX_PROMPT_BYTES_PER_POSITION: usize = 64;

/// Load or generate every domain, and check that the tokenizer can represent every prompt and answer
/// (a character the tokenizer does not know would silently become `<unk>` and poison training).
pub fn load_domains(cfg: &RunConfig, model: &LoadedModel) -> Result<Domains, RunError> {
    let mut domains = vec![];
    let positions = model.config().max_position_embeddings;
    // The longest prompt (its tokens and where it is), which RL's answers must fit beside.
    let mut longest: Option<(usize, String)> = None;
    for d in &cfg.data.domains {
        // Where each example came from, for errors: a file's line, or the generator's ordinal.
        let mut lines: Vec<usize> = vec![];
        let mut examples = match (&d.path, &d.synthetic) {
            (Some(path), _) => {
                let numbered = crate::data::jsonl::load_jsonl_numbered(path, &d.name)?;
                lines = numbered.iter().map(|(l, _)| *l).collect();
                numbered.into_iter().map(|(_, e)| e).collect()
            }
            (None, Some(s)) => s
                .generate(&d.name, cfg.seed, &turn_end_text(model))
                .map_err(|e| RunError::Setup(format!("domain '{}': {e}", d.name)))?,
            (None, None) => {
                return Err(RunError::Setup(format!(
                    "domain '{}': no path or synthetic",
                    d.name
                )));
            }
        };
        // A JSONL line may name a domain; in this config section every example counts towards `d.name`.
        examples.iter_mut().for_each(|e| e.domain = d.name.clone());
        let tok = Tokenizing {
            model,
            chat_template: cfg.data.chat_template,
            template_options: &cfg.data.chat_template_options,
        };
        for (i, ex) in examples.iter().enumerate() {
            let where_ = match (&d.path, lines.get(i)) {
                (Some(path), Some(line)) => {
                    format!("domain '{}' ('{}' line {line})", d.name, path.display())
                }
                _ => format!("domain '{}' example {}", d.name, i + 1),
            };
            let tokens = check_prompt(tok, &where_, &ex.prompt, positions)?;
            longer(&mut longest, tokens, &where_);
            // SFT imitates the response, or the ground truth where there is none; a ground truth
            // beside a response is only read by the reward (tests JSON, instructions), never
            // tokenized, so its characters need not be in the vocabulary.
            match &ex.response {
                Some(r) => tok
                    .answer_ids(r)
                    .map_err(|e| RunError::Setup(format!("{where_}: response {e}")))?,
                None => tok
                    .answer_ids(&ex.ground_truth)
                    .map_err(|e| RunError::Setup(format!("{where_}: ground_truth {e}")))?,
            };
        }
        let reward = domain_reward(d)?;
        // Held-out prompts are generated from only when rl.eval scores them.
        let mut val_longest = None;
        let (examples, val) = held_out(cfg, d, examples, tok, positions, &mut val_longest)?;
        if cfg.rl.as_ref().is_some_and(|rl| rl.eval.is_some())
            && let Some((tokens, where_)) = val_longest
        {
            longer(&mut longest, tokens, &where_);
        }
        domains.push(Domain {
            name: d.name.clone(),
            examples,
            val,
            ratio: d.ratio,
            reward,
        });
    }
    let longest = longest.as_ref().map(|(n, w)| (*n, w.as_str()));
    check_room(cfg, longest, positions)?;
    Ok(Domains {
        domains,
        chat_template: cfg.data.chat_template,
        template_options: cfg.data.chat_template_options.clone(),
    })
}

/// Domain `d`'s reward, checked as far as set-up can: a judge directory that cannot be read,
/// or programs to run without a sandbox, stop the run here, naming the domain.
pub(super) fn domain_reward(d: &crate::config::DomainConfig) -> Result<Reward, RunError> {
    let reward = d
        .reward
        .resolve(&format!("domain '{}' reward", d.name))
        .map_err(RunError::Setup)?;
    for judge in reward.judges() {
        crate::model::read_model_config(&judge.model)
            .map_err(|e| RunError::Setup(format!("domain '{}' reward llm_judge: {e}", d.name)))?;
    }
    // Refuse before the first step rather than score every program 0.
    if reward.runs_programs() {
        crate::sandbox::Sandbox::shared().map_err(|e| {
            RunError::Setup(format!("domain '{}' reward code_sandbox: {e}", d.name))
        })?;
    }
    Ok(reward)
}

/// A prompt the model can take: one the tokenizer reads whole, with room for a response.
/// Returns the prompt's tokens.
pub(super) fn check_prompt(
    tok: Tokenizing<'_>,
    where_: &str,
    prompt: &str,
    positions: usize,
) -> Result<usize, RunError> {
    // Refused before tokenizing: a tokenizer on a 50 MB prompt takes minutes and gigabytes, and
    // no token holds more than a few dozen bytes.
    if prompt.len() > positions * MAX_PROMPT_BYTES_PER_POSITION {
        return Err(RunError::Setup(format!(
            "{where_}: the prompt is {} bytes; the model holds {positions} positions, and prompts \
             over {MAX_PROMPT_BYTES_PER_POSITION} bytes per position are refused before tokenizing",
            prompt.len(),
        )));
    }
    let ids = tok
        .prompt_ids(prompt)
        .map_err(|e| RunError::Setup(format!("{where_}: prompt {e}")))?;
    if ids.len() >= positions {
        return Err(RunError::Setup(format!(
            "{where_}: the prompt is {} tokens; the model holds {positions} positions for the \
             prompt and its response together",
            ids.len()
        )));
    }
    Ok(ids.len())
}

/// Keep `tokens` at `where_` if it is the longest prompt so far.
fn longer(longest: &mut Option<(usize, String)>, tokens: usize, where_: &str) {
    if longest.as_ref().is_none_or(|(n, _)| tokens > *n) {
        *longest = Some((tokens, where_.to_string()));
    }
}

/// The RL stage's answers must fit beside every prompt: checked at set-up, not when the first
/// rollout reaches the prompt after a whole SFT stage. `longest` is the longest prompt's tokens.
fn check_room(
    cfg: &RunConfig,
    longest: Option<(usize, &str)>,
    positions: usize,
) -> Result<(), RunError> {
    let Some(rl) = cfg.rl.as_ref().filter(|rl| rl.env.is_none()) else {
        return Ok(());
    };
    let Some((tokens, where_)) = longest else {
        return Ok(());
    };
    let room = rl.sampling.max_new_tokens;
    if tokens.saturating_add(room) > positions {
        return Err(RunError::Setup(format!(
            "{where_}: the prompt is {tokens} tokens and rl.sampling.max_new_tokens {room} more, \
             but the model holds {positions} positions: lower max_new_tokens to {} or less, or \
             shorten the prompt",
            positions.saturating_sub(tokens)
        )));
    }
    Ok(())
}

/// A domain's examples split into (train, held out): `val_split` of them, or all of them and the
/// `val_path` file's (whose prompts are checked as the domain's are).
fn held_out(
    cfg: &RunConfig,
    d: &crate::config::DomainConfig,
    examples: Vec<Example>,
    tok: Tokenizing<'_>,
    positions: usize,
    longest: &mut Option<(usize, String)>,
) -> Result<(Vec<Example>, Vec<Example>), RunError> {
    if let Some(fraction) = d.val_split {
        let name = crate::seed::fnv1a(d.name.as_bytes());
        let seed = crate::seed::mix_seed(&[cfg.seed, 8, name]);
        return super::rl_eval::split_held_out(examples, fraction, seed)
            .map_err(|e| RunError::Setup(format!("domain '{}': {e}", d.name)));
    }
    let Some(path) = &d.val_path else {
        return Ok((examples, vec![]));
    };
    let mut val = vec![];
    for (line, mut e) in crate::data::jsonl::load_jsonl_numbered(path, &d.name)? {
        let where_ = format!("domain '{}' ('{}' line {line})", d.name, path.display());
        e.domain = d.name.clone();
        let tokens = check_prompt(tok, &where_, &e.prompt, positions)?;
        longer(longest, tokens, &where_);
        val.push(e);
    }
    let train = super::rl_eval::without_held_out(examples, &val);
    if train.is_empty() {
        return Err(RunError::Setup(format!(
            "domain '{}': every training prompt is also in val_path '{}', so nothing is left to \
             train on (held-out prompts are never trained on)",
            d.name,
            path.display()
        )));
    }
    Ok((train, val))
}

/// The text of the model's (first) end-of-sequence token, which its tokenizer reads back as that
/// token: what ends a policy's turn in a plain transcript.
pub fn turn_end_text(model: &LoadedModel) -> String {
    model
        .eos_ids
        .first()
        .and_then(|&id| model.tokenizer.tokenizer.id_to_token(id))
        .unwrap_or_default()
}

/// Text to token ids for prompts and answers, with the chat template when configured.
#[derive(Clone, Copy)]
pub struct Tokenizing<'a> {
    pub model: &'a LoadedModel,
    pub chat_template: bool,
    /// `data.chat_template_options`: what the template renders with beside the messages.
    pub template_options: &'a TemplateOptions,
}

impl Tokenizing<'_> {
    /// `messages` through the tokenizer's chat template with the special tokens and the run's
    /// template options: the text `roll-tui model template` prints.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let tok = &self.model.tokenizer;
        let template = tok
            .chat_template
            .as_deref()
            .ok_or("cannot be templated: the tokenizer has no chat_template")?;
        ChatRender {
            template,
            tokens: &tok.template_tokens(),
            options: self.template_options,
        }
        .render(messages, add_generation_prompt)
        .map_err(|e| e.to_string())
    }

    pub fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>, String> {
        if self.chat_template {
            let messages = [ChatMessage {
                role: "user".into(),
                content: prompt.into(),
            }];
            return self.messages_ids(&messages);
        }
        self.nonempty(prompt)
    }

    /// A conversation's messages through the tokenizer's chat template, ending with the prompt
    /// of the assistant's turn (whatever `chat_template` says: messages only exist templated).
    pub fn messages_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, String> {
        let text = self.render_chat(messages, true)?;
        self.nonempty(&text)
    }

    fn nonempty(&self, text: &str) -> Result<Vec<u32>, String> {
        let ids = self.encode(text)?;
        if ids.is_empty() {
            return Err("is empty".into());
        }
        Ok(ids)
    }

    /// The answer's tokens followed by the end-of-sequence token (what SFT teaches to produce).
    pub fn answer_ids(&self, answer: &str) -> Result<Vec<u32>, String> {
        let mut ids = self.encode(answer)?;
        let eos = self
            .model
            .eos_ids
            .first()
            .ok_or("needs an eos token, but the model has none")?;
        ids.push(*eos);
        Ok(ids)
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let tok = &self.model.tokenizer.tokenizer;
        let enc = tok
            .encode(text, false)
            .map_err(|e| format!("cannot be tokenized: {e}"))?;
        let unk = tok.get_added_vocabulary().get_vocab().get("<unk>").copied();
        if let Some(unk) = unk
            && let Some(pos) = enc.get_ids().iter().position(|&id| id == unk)
        {
            let bad = enc
                .get_offsets()
                .get(pos)
                .and_then(|&(a, b)| text.get(a..b))
                .unwrap_or("?");
            return Err(format!(
                "'{text}' contains '{bad}', which the tokenizer does not know"
            ));
        }
        Ok(enc.get_ids().to_vec())
    }

    /// Decode a completion for scoring, without special tokens.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.model
            .tokenizer
            .tokenizer
            .decode(ids, true)
            .unwrap_or_default()
    }
}

/// The node of each role whose workers a remote launcher starts (`workers.<role>.mode:
/// process`); the other roles are on the head's machine. Empty without a cluster launcher.
pub fn worker_nodes(
    workers: &crate::config::WorkersConfig,
) -> std::collections::BTreeMap<crate::config::Role, String> {
    let Some(hosts) = crate::worker::launch::remote_hosts() else {
        return Default::default();
    };
    hosts
        .into_iter()
        .filter(|(role, _)| {
            workers
                .role(*role)
                .is_some_and(|r| r.mode == crate::config::PlacementMode::Process)
        })
        .collect()
}

/// Who starts the run's TCP workers (`cluster.launcher`); `launcher: slurm` reads the nodes of
/// the allocation the head runs in from its environment.
pub fn launch_of(
    c: &crate::config::ClusterConfig,
) -> Result<crate::worker::process::Launch, RunError> {
    use crate::config::Launcher as Configured;
    use crate::worker::process::{Launch, Launcher, RemoteLaunch};
    let (launcher, hosts) = match c.launcher {
        Configured::Local => return Ok(Launch::Local),
        Configured::Ssh => (Launcher::Ssh(c.ssh.clone()), c.hosts.clone()),
        Configured::Slurm => (
            Launcher::Srun(c.srun.clone()),
            allocation_nodes(|k| std::env::var(k).ok())?,
        ),
    };
    let here = |what: &str, e: std::io::Error| {
        RunError::Setup(format!("cluster: {what} of this process: {e}"))
    };
    let program = match &c.remote_program {
        Some(p) => p.clone(),
        None => crate::worker::process::worker_program().map_err(|e| here("the executable", e))?,
    };
    let dir = match &c.remote_dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().map_err(|e| here("the working directory", e))?,
    };
    if let Configured::Slurm = c.launcher {
        for (role, node) in &c.role_hosts {
            if !hosts.contains(node) {
                return Err(RunError::Setup(format!(
                    "cluster.role_hosts.{role}: '{node}' is not a node of this SLURM allocation \
                     ({})",
                    hosts.join(", ")
                )));
            }
        }
    }
    let hosts = crate::config::Role::ALL
        .iter()
        .filter_map(|&r| Some((r, c.host_of(r, &hosts)?.to_string())))
        .collect();
    Ok(Launch::Remote(RemoteLaunch {
        launcher,
        hosts,
        program,
        dir,
        mirror: c.shared_dir.is_none(),
    }))
}

/// The nodes of the SLURM allocation the head runs in: `SLURM_JOB_NODELIST` (or the older
/// `SLURM_NODELIST`) expanded, as `var` reads the environment.
fn allocation_nodes(var: impl Fn(&str) -> Option<String>) -> Result<Vec<String>, RunError> {
    let list = var("SLURM_JOB_NODELIST")
        .or_else(|| var("SLURM_NODELIST"))
        .ok_or_else(|| {
            RunError::Setup(
                "cluster.launcher slurm: this process is not inside a SLURM allocation \
                 (SLURM_JOB_NODELIST is not set): start the run from `salloc` or an `sbatch` \
                 script"
                    .into(),
            )
        })?;
    crate::worker::nodelist::expand(&list)
        .map_err(|e| RunError::Setup(format!("cluster.launcher slurm: SLURM_JOB_NODELIST: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slurm_run_takes_its_nodes_from_the_allocation_or_says_it_has_none() {
        let env =
            |list: &'static str| move |k: &str| (k == "SLURM_JOB_NODELIST").then(|| list.into());
        let nodes = allocation_nodes(env("gpu[01-02],cpu7")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(nodes, ["gpu01", "gpu02", "cpu7"]);
        let older = |k: &str| (k == "SLURM_NODELIST").then(|| "n[3-4]".to_string());
        assert_eq!(allocation_nodes(older).unwrap_or_default(), ["n3", "n4"]);
        let e = allocation_nodes(|_| None).expect_err("no allocation");
        assert!(
            e.to_string().contains("not inside a SLURM allocation"),
            "{e}"
        );
        let e = allocation_nodes(env("gpu[02-01]")).expect_err("bad list");
        assert!(
            e.to_string()
                .contains("SLURM_JOB_NODELIST: node list 'gpu[02-01]'"),
            "{e}"
        );
    }
}
