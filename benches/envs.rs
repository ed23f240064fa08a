//! Environment throughput (`cargo bench --bench envs`): steps per second of each environment under a
//! random policy, through `Episode` (the action parser and format penalty, as a rollout steps them),
//! and resets per second (Sokoban's reset generates a room). Record the figures in
//! benches/RESULTS.md.

use std::time::Instant;

use rand::{Rng, SeedableRng, rngs::StdRng};
use roll::env::external::External;
use roll::env::{ActionParser, Env, Episode, make};

fn params(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// (steps/s, resets/s) over `episodes` random episodes.
fn measure(name: &str, list: &[(&str, &str)], episodes: u64) -> (f64, f64) {
    let env = make(name, &params(list)).expect("an environment");
    measure_env(env, episodes)
}

fn measure_env(env: Box<dyn Env>, episodes: u64) -> (f64, f64) {
    let mut ep = Episode::new(env, ActionParser::default(), 0.1);
    let mut rng = StdRng::seed_from_u64(7);
    let (mut steps, mut t_steps, mut t_resets) = (0u64, 0.0, 0.0);
    for e in 0..episodes {
        let t = Instant::now();
        ep.reset(e).expect("a reset");
        t_resets += t.elapsed().as_secs_f64();
        let actions = ep.env().actions();
        let t = Instant::now();
        for _ in 0..200 {
            let a = &actions[rng.random_range(0..actions.len())];
            let step = ep
                .step(&format!("I move <answer>{a}</answer>"))
                .expect("a step");
            steps += 1;
            if step.done {
                break;
            }
        }
        t_steps += t.elapsed().as_secs_f64();
    }
    (steps as f64 / t_steps, episodes as f64 / t_resets)
}

/// An environment, what the setting is, and its parameters.
type Case = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

fn main() {
    let cases: [Case; 6] = [
        (
            "frozen_lake",
            "4x4 fixed map",
            &[("map", "SFFF/FHFH/FFFH/HFFG")],
        ),
        ("frozen_lake", "8x8 random maps", &[("size", "8")]),
        (
            "frozen_lake",
            "8x8 random, slippery",
            &[("size", "8"), ("slippery", "true")],
        ),
        ("sokoban", "6x6 generated, 1 box", &[]),
        (
            "sokoban",
            "tiny.xsb levels",
            &[("levels", "envs/sokoban/tiny.xsb")],
        ),
        ("webshop", "default catalogue (300 products)", &[]),
    ];
    println!("| env | setting | steps/s | resets/s |");
    println!("| --- | --- | --- | --- |");
    for (name, what, list) in cases {
        let (steps, resets) = measure(name, list, 2000);
        println!("| {name} | {what} | {steps:.0} | {resets:.0} |");
    }
    // One program for all episodes: a JSON line each way per step, through pipes.
    let (steps, resets) = measure(
        "external",
        &[
            ("command", "python3 envs/external/guess_number.py"),
            ("high", "100"),
            ("max_guesses", "50"),
        ],
        200,
    );
    println!("| external | guess_number.py (Python), 1..100 | {steps:.0} | {resets:.0} |");
    // A built-in env served by a worker process (`workers.env.mode: process`): the same lake
    // as the first row, one JSON line each way per step.
    let served = External::serving(
        std::path::Path::new(env!("CARGO_BIN_EXE_roll-tui")),
        "frozen_lake",
        &params(&[("map", "SFFF/FHFH/FFFH/HFFG")]),
        1,
    );
    let (steps, resets) = measure_env(Box::new(served), 2000);
    println!(
        "| frozen_lake in `env serve` | 4x4 fixed map, 1 worker process | {steps:.0} | {resets:.0} |"
    );
}
