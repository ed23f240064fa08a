//! FrozenLake with gymnasium `FrozenLake-v1` semantics.
//!
//! The map's letters: `S` start, `F` frozen, `H` hole, `G` goal. Actions `Left`, `Down`, `Right`,
//! `Up` (gymnasium's 0..3; the numbers are accepted too). A move into the edge stays put. On a
//! slippery lake the agent moves in the intended direction or either perpendicular one with
//! probability 1/3 each. Reaching `G` gives reward 1; the episode ends on `H` or `G`, or after
//! `max_steps` (gymnasium's `TimeLimit`, 100 for the 4×4 map). `info.state` is row × ncol + col,
//! gymnasium's observation.
//!
//! Maps are explicit (`map: SFFF/FHFH/FFFH/HFFG`) or random by seed: each cell frozen with
//! probability `p`, `S` top-left and `G` bottom-right, drawn again until a path from `S` to `G`
//! exists — gymnasium's `generate_random_map`, with our own random generator (the maps are not
//! numpy's).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value};

use super::{Env, EnvFailure, Grid, Step, StepError, stable_hash};
use crate::seed::mix_seed;

const ACTIONS: [&str; 4] = ["Left", "Down", "Right", "Up"];

/// Where the map comes from.
#[derive(Debug, Clone, PartialEq)]
enum MapSource {
    Fixed(Vec<Vec<u8>>),
    Random { size: usize, p: f64 },
}

#[derive(Clone)]
pub struct FrozenLake {
    source: MapSource,
    slippery: bool,
    max_steps: usize,
    /// Whether the text render ends with the legend line.
    legend: bool,
    map: Vec<Vec<u8>>,
    pos: (usize, usize),
    steps: usize,
    done: bool,
    rng: StdRng,
}

/// A map from `rows` joined by `/`: rectangular, letters S F H G only, one `S`, at least one `G`.
fn parse_map(text: &str) -> Result<Vec<Vec<u8>>, String> {
    // A map echoed in an error is cut: a 100 KB typo must not come back as a 100 KB message.
    let shown = crate::text::clean(text, 80, false);
    let rows: Vec<Vec<u8>> = text
        .split('/')
        .map(|r| r.trim().bytes().collect())
        .collect();
    let width = rows.first().map_or(0, Vec::len);
    if width == 0 || rows.iter().any(|r| r.len() != width) {
        return Err(format!(
            "map '{shown}': rows must be non-empty and all the same length"
        ));
    }
    if let Some(bad) = rows.iter().flatten().find(|c| !b"SFHG".contains(c)) {
        return Err(format!(
            "map '{shown}': '{}' is not one of S, F, H, G",
            *bad as char
        ));
    }
    let count = |c: u8| rows.iter().flatten().filter(|x| **x == c).count();
    if count(b'S') != 1 || count(b'G') == 0 {
        return Err(format!(
            "map '{shown}': needs exactly one S and at least one G"
        ));
    }
    Ok(rows)
}

/// Whether a goal can be reached from the start through non-hole cells (gymnasium's `is_valid`).
fn has_path(map: &[Vec<u8>]) -> bool {
    let (rows, cols) = (map.len(), map[0].len());
    let Some(start) = (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .find(|&(r, c)| map[r][c] == b'S')
    else {
        return false;
    };
    let mut seen = vec![vec![false; cols]; rows];
    let mut frontier = vec![start];
    while let Some((r, c)) = frontier.pop() {
        if std::mem::replace(&mut seen[r][c], true) {
            continue;
        }
        for (dr, dc) in [(1i64, 0i64), (0, 1), (-1, 0), (0, -1)] {
            let (nr, nc) = (r as i64 + dr, c as i64 + dc);
            if nr < 0 || nc < 0 || nr >= rows as i64 || nc >= cols as i64 {
                continue;
            }
            let (nr, nc) = (nr as usize, nc as usize);
            match map[nr][nc] {
                b'G' => return true,
                b'H' => {}
                _ => frontier.push((nr, nc)),
            }
        }
    }
    false
}

/// Maps drawn before a path is carved by hand (a low `p` on a large map almost never has one).
const MAP_ATTEMPTS: usize = 1000;

/// A random `size`×`size` map with a path, drawn from `seed`: maps are drawn until one has a path,
/// as gymnasium does; if none of [`MAP_ATTEMPTS`] has, the last one gets the top row and the right
/// column frozen, so that asking for an unlikely map never hangs.
fn random_map(size: usize, p: f64, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut map: Vec<Vec<u8>> = vec![];
    for _ in 0..MAP_ATTEMPTS {
        map = (0..size)
            .map(|_| {
                (0..size)
                    .map(|_| if rng.random_bool(p) { b'F' } else { b'H' })
                    .collect()
            })
            .collect();
        map[0][0] = b'S';
        map[size - 1][size - 1] = b'G';
        if has_path(&map) {
            return map;
        }
    }
    for cell in map[0].iter_mut().skip(1) {
        *cell = b'F';
    }
    for row in map.iter_mut().take(size - 1).skip(1) {
        row[size - 1] = b'F';
    }
    map
}

impl FrozenLake {
    /// From `--set` / config parameters: `size`, `p`, `map`, `slippery`, `max_steps`.
    pub fn from_params(params: &[(String, String)]) -> Result<FrozenLake, String> {
        let (mut size, mut p, mut map, mut slippery, mut max_steps) = (4, 0.8, None, false, 100);
        let mut legend = true;
        for (key, value) in params {
            let bad = |what: &str| {
                let value = crate::text::clean(value, 80, false);
                format!("frozen_lake: {key}={value}: {what}")
            };
            match key.as_str() {
                "size" => {
                    size = value
                        .parse()
                        .ok()
                        .filter(|s| (2..=64).contains(s))
                        .ok_or_else(|| bad("expected an integer in 2..=64"))?
                }
                "p" => {
                    p = value
                        .parse()
                        .ok()
                        .filter(|p: &f64| *p > 0.0 && *p <= 1.0)
                        .ok_or_else(|| bad("expected a probability in (0, 1]"))?
                }
                "map" => map = Some(parse_map(value).map_err(|e| bad(&e))?),
                "slippery" => {
                    slippery = value.parse().map_err(|_| bad("expected true or false"))?
                }
                "legend" => legend = value.parse().map_err(|_| bad("expected true or false"))?,
                "max_steps" => {
                    max_steps = value
                        .parse()
                        .ok()
                        .filter(|m| *m > 0)
                        .ok_or_else(|| bad("expected a positive integer"))?
                }
                other => {
                    let known = ["size", "p", "map", "slippery", "max_steps", "legend"];
                    return Err(format!(
                        "frozen_lake: unknown parameter '{other}'{} (known: {})",
                        crate::text::suggestion_suffix(other, known),
                        known.join(", ")
                    ));
                }
            }
        }
        let source = match map {
            Some(m) => MapSource::Fixed(m),
            None => MapSource::Random { size, p },
        };
        let mut lake = FrozenLake::new(source, slippery, max_steps);
        lake.legend = legend;
        Ok(lake)
    }

    fn new(source: MapSource, slippery: bool, max_steps: usize) -> FrozenLake {
        let mut lake = FrozenLake {
            source,
            slippery,
            legend: true,
            max_steps,
            map: vec![],
            pos: (0, 0),
            steps: 0,
            done: false,
            rng: StdRng::seed_from_u64(0),
        };
        lake.start(0);
        lake
    }

    /// A new episode from `seed` (the trait's `reset`, which cannot fail here).
    fn start(&mut self, seed: u64) {
        self.map = match &self.source {
            MapSource::Fixed(m) => m.clone(),
            MapSource::Random { size, p } => random_map(*size, *p, mix_seed(&[seed, 1])),
        };
        self.pos = (0..self.map.len())
            .flat_map(|r| (0..self.cols()).map(move |c| (r, c)))
            .find(|&(r, c)| self.map[r][c] == b'S')
            .unwrap_or((0, 0));
        (self.steps, self.done) = (0, false);
        self.rng = StdRng::seed_from_u64(mix_seed(&[seed, 2]));
    }

    fn cols(&self) -> usize {
        self.map[0].len()
    }

    /// The cell one move in `action` (0 Left, 1 Down, 2 Right, 3 Up) from `pos`, or `pos` at an edge.
    fn moved(&self, (r, c): (usize, usize), action: usize) -> (usize, usize) {
        match action {
            0 => (r, c.saturating_sub(1)),
            1 => ((r + 1).min(self.map.len() - 1), c),
            2 => (r, (c + 1).min(self.cols() - 1)),
            _ => (r.saturating_sub(1), c),
        }
    }
}

fn parse_action(action: &str) -> Option<usize> {
    ACTIONS
        .iter()
        .position(|a| a.eq_ignore_ascii_case(action))
        .or_else(|| action.parse::<usize>().ok().filter(|a| *a < 4))
}

impl Env for FrozenLake {
    fn name(&self) -> &'static str {
        "frozen_lake"
    }

    fn clone_box(&self) -> Box<dyn Env> {
        Box::new(self.clone())
    }

    fn action_format(&self) -> String {
        format!("one of {}", ACTIONS.join(", "))
    }

    fn actions(&self) -> Vec<String> {
        ACTIONS.iter().map(|a| a.to_string()).collect()
    }

    fn reset(&mut self, seed: u64) -> Result<String, EnvFailure> {
        self.start(seed);
        Ok(self.render_text())
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let Some(intended) = parse_action(action) else {
            return Err(StepError::Invalid(format!(
                "'{action}' is not an action ({})",
                self.action_format()
            )));
        };
        if self.done {
            // Gymnasium's terminal states absorb every action, reward 0.
            return Ok(Step::now(self, 0.0, true));
        }
        let taken = if self.slippery {
            // Intended, or either side (gymnasium: (a - 1) % 4, a, (a + 1) % 4), 1/3 each.
            [(intended + 3) % 4, intended, (intended + 1) % 4][self.rng.random_range(0..3)]
        } else {
            intended
        };
        self.pos = self.moved(self.pos, taken);
        self.steps += 1;
        let cell = self.map[self.pos.0][self.pos.1];
        self.done = cell == b'H' || cell == b'G' || self.steps >= self.max_steps;
        let mut info = self.info();
        info.insert("action_taken".into(), Value::from(ACTIONS[taken]));
        Ok(Step {
            observation: self.render_text(),
            reward: if cell == b'G' { 1.0 } else { 0.0 },
            done: self.done,
            info,
        })
    }

    /// `state` (row × ncol + col, gymnasium's observation), `success` (on the goal), `steps`.
    fn info(&self) -> Map<String, Value> {
        let mut info = Map::new();
        let state = self.pos.0 * self.cols() + self.pos.1;
        info.insert("state".into(), Value::from(state));
        info.insert(
            "success".into(),
            Value::Bool(self.map[self.pos.0][self.pos.1] == b'G'),
        );
        info.insert("steps".into(), Value::from(self.steps));
        info
    }

    /// The grid with the agent as `P` (on a hole `X`, on the goal `W`), and (with `legend`, the
    /// default) a line naming the letters and actions; without it, only the grid's rows.
    fn render_text(&self) -> String {
        let grid = self.render_grid();
        let mut out = String::new();
        for (r, row) in grid.rows.iter().enumerate() {
            for (c, cell) in row.iter().enumerate() {
                out.push(if (r, c) == grid.agent {
                    match cell {
                        'H' => 'X',
                        'G' => 'W',
                        _ => 'P',
                    }
                } else {
                    *cell
                });
            }
            out.push('\n');
        }
        if self.legend {
            out.push_str(&format!(
                "S start, F frozen, H hole, G goal, P you (X: you fell in a hole, W: you won). \
                 Actions: {}.",
                ACTIONS.join(", ")
            ));
        } else {
            out.pop();
        }
        out
    }

    fn render_grid(&self) -> Grid {
        Grid {
            rows: self
                .map
                .iter()
                .map(|r| r.iter().map(|&b| b as char).collect())
                .collect(),
            agent: self.pos,
        }
    }

    fn state_hash(&self) -> u64 {
        let mut bytes: Vec<u8> = self.map.join(&b'/');
        bytes.extend(format!("@{},{}", self.pos.0, self.pos.1).bytes());
        stable_hash(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lake(params: &[(&str, &str)]) -> FrozenLake {
        let params: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        FrozenLake::from_params(&params).unwrap_or_else(|e| panic!("{e}"))
    }

    fn go(env: &mut FrozenLake, actions: &[&str]) -> Vec<(usize, f64, bool)> {
        actions
            .iter()
            .map(|a| {
                let s = env.step(a).unwrap_or_else(|e| panic!("{e}"));
                (
                    s.info["state"].as_u64().unwrap_or(99) as usize,
                    s.reward,
                    s.done,
                )
            })
            .collect()
    }

    #[test]
    fn the_4x4_map_walks_as_gymnasium_does() {
        // SFFF / FHFH / FFFH / HFFG: states 0..15 row-major; holes 5, 7, 11, 12; goal 15.
        let mut env = lake(&[("map", "SFFF/FHFH/FFFH/HFFG")]);
        env.reset(3).unwrap();
        // Left and Up at the corner stay at 0; Down, Down to 8; Right to 9; Down to 13; Right 14;
        // Right 15 = G: reward 1, done.
        assert_eq!(
            go(
                &mut env,
                &[
                    "Left", "Up", "Down", "Down", "Right", "Down", "Right", "right"
                ]
            ),
            [
                (0, 0.0, false),
                (0, 0.0, false),
                (4, 0.0, false),
                (8, 0.0, false),
                (9, 0.0, false),
                (13, 0.0, false),
                (14, 0.0, false),
                (15, 1.0, true)
            ]
        );
        // After the end every action stays, reward 0.
        assert_eq!(go(&mut env, &["Up"]), [(15, 0.0, true)]);
        // Into a hole: 0 → Right 1 → Down 5 (H): done, reward 0, no success.
        env.reset(3).unwrap();
        assert_eq!(go(&mut env, &["2", "1"]), [(1, 0.0, false), (5, 0.0, true)]);
        assert!(env.render_text().starts_with("SFFF\nFXFH\n"));
    }

    #[test]
    fn a_slippery_lake_slides_to_either_side_a_third_of_the_time_each() {
        // From the middle of an open 3x3 lake, Down (1) goes Down, Left (0) or Right (2).
        let mut counts = [0usize; 4];
        for seed in 0..3000 {
            let mut env = lake(&[("map", "FFF/FSF/FFG"), ("slippery", "true")]);
            env.reset(seed).unwrap();
            let s = env.step("Down").unwrap_or_else(|e| panic!("{e}"));
            let taken = ACTIONS
                .iter()
                .position(|a| s.info["action_taken"] == *a)
                .unwrap_or(9);
            counts[taken] += 1;
        }
        assert_eq!(counts[3], 0, "never the opposite direction");
        for (dir, n) in [(0, counts[0]), (1, counts[1]), (2, counts[2])] {
            // 1000 expected; 5 standard deviations of a binomial(3000, 1/3) is ±129.
            assert!(
                (871..=1129).contains(&n),
                "direction {dir}: {n} of 3000 ({counts:?})"
            );
        }
        // The same seed slides the same way.
        let mut a = lake(&[("map", "FFF/FSF/FFG"), ("slippery", "true")]);
        let mut b = lake(&[("map", "FFF/FSF/FFG"), ("slippery", "true")]);
        a.reset(11).unwrap();
        b.reset(11).unwrap();
        assert_eq!(
            go(&mut a, &["Down", "Left", "Up", "Right"]),
            go(&mut b, &["Down", "Left", "Up", "Right"])
        );
    }

    #[test]
    fn random_maps_always_have_a_path_and_follow_the_seed() {
        for seed in 0..200 {
            let mut env = lake(&[("size", "6"), ("p", "0.5")]);
            env.reset(seed).unwrap();
            assert!(has_path(&env.map), "seed {seed}");
            assert_eq!((env.map[0][0], env.map[5][5]), (b'S', b'G'));
            let mut again = lake(&[("size", "6"), ("p", "0.5")]);
            again.reset(seed).unwrap();
            assert_eq!(env.map, again.map);
        }
        let (mut a, mut b) = (lake(&[("size", "8")]), lake(&[("size", "8")]));
        a.reset(1).unwrap();
        b.reset(2).unwrap();
        assert_ne!(a.map, b.map);
        // Almost no cell frozen on a large map: still a path, without hanging.
        let mut sparse = lake(&[("size", "64"), ("p", "0.01")]);
        sparse.reset(0).unwrap();
        assert!(has_path(&sparse.map));
        // A map whose goal is walled off by holes has no path.
        assert!(!has_path(&parse_map("SH/HG").unwrap_or_default()));
        // A huge bad map is named, not echoed whole (it was a 200 KB message).
        let huge = "F".repeat(100_000);
        let err = FrozenLake::from_params(&[("map".into(), huge)])
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("needs exactly one S") && err.len() < 400,
            "{}",
            err.len()
        );
        assert!(has_path(&parse_map("SF/HG").unwrap_or_default()));
    }

    #[test]
    fn the_step_limit_ends_an_episode_and_states_hash_by_map_and_position() {
        let mut env = lake(&[("map", "SFF/FFF/FFG"), ("max_steps", "2")]);
        env.reset(0).unwrap();
        let start = env.state_hash();
        assert_eq!(
            go(&mut env, &["Left", "Up"]),
            [(0, 0.0, false), (0, 0.0, true)]
        );
        // Same map, same position: same hash, however it got there.
        assert_eq!(env.state_hash(), start);
        env.reset(0).unwrap();
        go(&mut env, &["Right"]);
        assert_ne!(env.state_hash(), start);
    }

    #[test]
    fn bad_parameters_and_actions_are_clear_errors() {
        let err = |p: &[(&str, &str)]| {
            let params: Vec<(String, String)> = p
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            FrozenLake::from_params(&params).err().unwrap_or_default()
        };
        assert!(err(&[("map", "SF/F")]).contains("all the same length"));
        assert!(err(&[("map", "SX/FG")]).contains("'X' is not one of S, F, H, G"));
        assert!(err(&[("map", "FF/FG")]).contains("exactly one S"));
        assert!(err(&[("size", "1")]).contains("2..=64"));
        assert!(err(&[("p", "0")]).contains("(0, 1]"));
        assert!(err(&[("slipery", "true")]).contains("did you mean 'slippery'"));
        let mut env = lake(&[]);
        env.reset(0).unwrap();
        let before = env.state_hash();
        assert!(
            env.step("Jump")
                .unwrap_err()
                .to_string()
                .contains("one of Left, Down, Right, Up")
        );
        assert!(env.step("4").is_err());
        assert_eq!(env.state_hash(), before);
    }
}
