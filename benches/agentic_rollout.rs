//! Agentic rollout throughput (turns/s) with a slow, variable environment: the example external
//! program `envs/external/guess_number.py` sleeping `step_delay` × U(0.5, 1.5) seconds per step.
//! Three loops play the same episodes (16 per step, 6 turns each) with the same tiny random model:
//!
//! - **turn by turn** (the synchronous baseline, written here): each turn, every episode's request
//!   is generated in one batch, then every environment is stepped, one after another;
//! - **ours, deterministic** (`rl.env.overlap_steps: false`, the default): each episode runs its own
//!   loop against the continuous-batching engine; the env steps a decode step finished run in
//!   parallel, and the engine waits for them;
//! - **ours, overlap** (`rl.env.overlap_steps: true`): the engine keeps decoding while programs
//!   step.
//!
//! Ours runs through `roll::pipeline::run` (an RL stage; its rollout part is `time/rollout`), whose
//! engine keeps each finished turn's cache for the episode's next turn; the turn-by-turn baseline
//! prefills every turn's whole history. An
//! untrained model rarely writes a number, so nearly every turn is an invalid guess (the program
//! still sleeps) and episodes last all 6 turns.
//!
//! Run: `cargo bench --bench agentic_rollout`. Record the figures in benches/RESULTS.md.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use roll::config::RunConfig;
use roll::env::{ActionParser, Episode, make};
use roll::metrics::MemorySink;
use roll::pipeline::setup::{Tokenizing, load_policy};
use roll::pipeline::{RunStatus, Silent, run};
use roll::rollout::{Engine, Request, SamplingParams};

const EPISODES: usize = 16;
const TURNS: usize = 6;
/// Steps of ours; the first is a warm-up (programs start), the baseline plays the others.
const STEPS: usize = 3;
const CHARS: &str = "abcdefghijklmnopqrstuvwxyzGHIY0123456789 .;!\n";

fn config(dir: &Path, delay: f64, overlap: bool) -> RunConfig {
    let root = env!("CARGO_MANIFEST_DIR");
    let yaml = format!(
        "include: [ {root}/configs/models/tiny-qwen2.yaml ]\n\
         name: agentic_rollout_bench\nseed: 3\noutput_dir: {out}\n\
         model: {{ init: {{ chars: \"{chars}\", max_positions: 1024 }} }}\n\
         rl:\n  steps: {STEPS}\n  prompts_per_step: 4\n  group_size: 4\n  rollout_batch: {EPISODES}\n\
         \x20 sampling: {{ temperature: 1.0, max_new_tokens: 4 }}\n\
         \x20 env: {{ name: external, tag: guess, max_turns: {TURNS}, action_pattern: '(?s)(.*)', overlap_steps: {overlap},\n\
         \x20   params: {{ command: 'python3 {root}/envs/external/guess_number.py', step_delay: {delay}, max_guesses: 100 }} }}\n",
        out = dir.display(),
        chars = CHARS.replace('\n', "\\n"),
    );
    let path = dir.with_extension("yaml");
    std::fs::write(&path, yaml).expect("a config file");
    RunConfig::load(&path, &[]).expect("the bench config")
}

/// Turns/s of the rollouts of `roll::pipeline::run` over `STEPS` steps.
fn ours(dir: &Path, delay: f64, overlap: bool) -> (f64, usize, f64) {
    let cfg = config(dir, delay, overlap);
    let mut sink = MemorySink::default();
    let outcome = run(
        &cfg,
        &mut Silent,
        Arc::new(AtomicBool::new(false)),
        &mut sink,
        None,
    )
    .expect("an agentic run");
    assert_eq!(outcome.status, RunStatus::Finished);
    // The first step also starts the programs (the baseline starts its before timing).
    let rollout: f64 = sink.values("rl", "time/rollout")[1..].iter().sum();
    let steps: f64 = sink.values("rl", "env/guess/steps")[1..].iter().sum();
    let turns = (steps * EPISODES as f64).round() as usize;
    (turns as f64 / rollout, turns, rollout)
}

/// The synchronous turn-by-turn loop over the same model, prompts and environment.
fn turn_by_turn(dir: &Path, delay: f64) -> (f64, usize, f64) {
    let cfg = config(dir, delay, false);
    let model = load_policy(&cfg).expect("the model");
    let tok = Tokenizing {
        model: &model,
        chat_template: false,
        template_options: &cfg.data.chat_template_options,
    };
    let env_cfg = cfg.rl.as_ref().and_then(|r| r.env.clone()).expect("rl.env");
    let prototype = make(&env_cfg.name, &env_cfg.param_pairs()).expect("the env");
    let parser = ActionParser::new("(?s)(.*)").expect("a pattern");
    let eos = model.eos_ids.clone();
    let mut episodes: Vec<Episode> = (0..EPISODES)
        .map(|_| Episode::new(prototype.clone_box(), parser.clone(), 0.1))
        .collect();
    for e in &mut episodes {
        e.reset(0).expect("the program starts");
    }
    let t0 = Instant::now();
    let mut turns = 0;
    for step in 1..STEPS {
        let mut convo: Vec<Vec<u32>> = vec![];
        let mut live = [true; EPISODES];
        for (i, e) in episodes.iter_mut().enumerate() {
            let obs = e.reset((step * 4 + i / 4) as u64).expect("a reset");
            convo.push(tok.encode(&format!("{obs}\n")).expect("known characters"));
        }
        for turn in 0..TURNS {
            let mut engine = Engine::new(&model.transformer, eos.clone(), EPISODES);
            for (i, c) in convo.iter().enumerate().filter(|(i, _)| live[*i]) {
                engine.submit(Request {
                    id: i as u64,
                    prompt_ids: c.clone(),
                    params: SamplingParams {
                        max_new_tokens: 4,
                        ..SamplingParams::default()
                    },
                    seed: (step * 1000 + turn * 100 + i) as u64,
                });
            }
            let mut done = vec![];
            while !engine.is_idle() {
                done.extend(engine.step().expect("a decode step"));
            }
            done.sort_by_key(|c| c.id);
            for c in done {
                let i = c.id as usize;
                let step = episodes[i].step(&tok.decode(&c.token_ids)).expect("a step");
                turns += 1;
                convo[i].extend(&c.token_ids);
                if !c.token_ids.ends_with(&eos[..1]) {
                    convo[i].extend(&eos[..1]);
                }
                match step.done {
                    true => live[i] = false,
                    false => convo[i].extend(
                        tok.encode(&format!("{}\n", step.observation))
                            .expect("known characters"),
                    ),
                }
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    (turns as f64 / secs, turns, secs)
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    println!(
        "| env step delay (mean) | loop | turns | rollout s | turns/s | vs turn by turn |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    for delay in [0.0, 0.02, 0.1] {
        let d = |name: &str| dir.path().join(format!("{name}-{delay}"));
        let base = turn_by_turn(&d("sync"), delay);
        let rows = [
            ("turn by turn", base),
            ("ours, deterministic", ours(&d("det"), delay, false)),
            ("ours, overlap", ours(&d("overlap"), delay, true)),
        ];
        for (name, (rate, turns, secs)) in rows {
            println!(
                "| {:.0} ms | {name} | {turns} | {secs:.2} | {rate:.1} | {:.2}x |",
                delay * 1000.0,
                rate / base.0
            );
        }
    }
}
