//! Sokoban with gym-sokoban's semantics: push every box onto a target. The agent moves `Up`,
//! `Down`, `Left`, `Right` (gym-sokoban's push actions: a move into a box pushes it when the cell
//! behind it is free); rewards −0.1 per step, +1 for a box pushed onto a target, −1 for one pushed
//! off, +10 when all boxes are placed; done when all are placed or after `max_steps` (120).
//!
//! Rooms are generated as gym-sokoban does, in reverse: carve a room by a random walk, put the
//! boxes on their targets (the solved state), then play backwards — the agent walks about and pulls
//! boxes. A pull is exactly the reverse of a push, so every generated room can be solved. Or rooms
//! come from a level file (XSB: `#` wall, `.` target, `$` box, `*` box on target, `@` agent, `+`
//! agent on target, space/`-`/`_` floor; levels separated by blank lines), the level picked by seed.
//!
//! Text render (as RAGEN's): `#` wall, `_` floor, `O` target, `X` box, `*` box on target, `P`
//! agent, `S` agent on a target.

use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::{Map, Value};

use super::{Env, EnvFailure, Grid, Step, StepError, stable_hash};
use crate::seed::mix_seed;

const ACTIONS: [&str; 4] = ["Up", "Down", "Left", "Right"];
const DELTAS: [(isize, isize); 4] = [(-1, 0), (1, 0), (0, -1), (0, 1)];

const STEP_PENALTY: f64 = -0.1;
const BOX_ON: f64 = 1.0;
const BOX_OFF: f64 = -1.0;
const FINISHED: f64 = 10.0;

/// A room: walls and targets are fixed; boxes and the agent move.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Room {
    wall: Vec<Vec<bool>>,
    target: Vec<Vec<bool>>,
    boxes: Vec<Vec<bool>>,
    agent: (usize, usize),
}

impl Room {
    fn rows(&self) -> usize {
        self.wall.len()
    }
    fn cols(&self) -> usize {
        self.wall[0].len()
    }
    fn free(&self, (r, c): (usize, usize)) -> bool {
        !self.wall[r][c] && !self.boxes[r][c]
    }
    /// The cell one step from `pos` in direction `d`, if it is inside the room.
    fn next(&self, (r, c): (usize, usize), d: usize) -> Option<(usize, usize)> {
        let (dr, dc) = DELTAS[d];
        let r = r.checked_add_signed(dr)?;
        let c = c.checked_add_signed(dc)?;
        (r < self.rows() && c < self.cols()).then_some((r, c))
    }
    fn placed(&self) -> usize {
        (0..self.rows())
            .flat_map(|r| (0..self.cols()).map(move |c| (r, c)))
            .filter(|&(r, c)| self.boxes[r][c] && self.target[r][c])
            .count()
    }
    fn box_count(&self) -> usize {
        self.boxes.iter().flatten().filter(|b| **b).count()
    }
}

/// Parse the levels of an XSB file's text.
fn parse_levels(text: &str) -> Result<Vec<Room>, String> {
    let mut levels = vec![];
    let mut lines: Vec<&str> = vec![];
    for line in text.lines().chain(std::iter::once("")) {
        let line = line.trim_end();
        if line.starts_with(';') {
            continue;
        }
        if line.is_empty() {
            if !lines.is_empty() {
                let n = levels.len() + 1;
                levels.push(parse_level(&lines).map_err(|e| format!("level {n}: {e}"))?);
                lines.clear();
            }
            continue;
        }
        lines.push(line);
    }
    if levels.is_empty() {
        return Err("no levels in the file".into());
    }
    Ok(levels)
}

fn parse_level(lines: &[&str]) -> Result<Room, String> {
    let cols = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let rows = lines.len();
    let mut room = Room {
        wall: vec![vec![true; cols]; rows],
        target: vec![vec![false; cols]; rows],
        boxes: vec![vec![false; cols]; rows],
        agent: (0, 0),
    };
    let mut agents = 0;
    for (r, line) in lines.iter().enumerate() {
        for (c, ch) in line.chars().enumerate() {
            let (wall, target, boxed, agent) = match ch {
                '#' => (true, false, false, false),
                ' ' | '-' | '_' => (false, false, false, false),
                '.' => (false, true, false, false),
                '$' => (false, false, true, false),
                '*' => (false, true, true, false),
                '@' => (false, false, false, true),
                '+' => (false, true, false, true),
                other => return Err(format!("unknown character '{other}' at row {}", r + 1)),
            };
            room.wall[r][c] = wall;
            room.target[r][c] = target;
            room.boxes[r][c] = boxed;
            if agent {
                room.agent = (r, c);
                agents += 1;
            }
        }
    }
    let targets = room.target.iter().flatten().filter(|t| **t).count();
    match (agents, room.box_count()) {
        (1, 0) => Err("it has no boxes".into()),
        (1, b) if b != targets => Err(format!("it has {b} boxes but {targets} targets")),
        (1, _) => Ok(room),
        (n, _) => Err(format!("it needs exactly one agent (@ or +), found {n}")),
    }
}

/// A room of `dim` × `dim` with `boxes` boxes, generated backwards from its solved state.
fn generate(dim: usize, boxes: usize, seed: u64) -> Option<Room> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Carve floor by a random walk inside the outer wall (gym-sokoban: about 1.7 × (w + h) steps
    // of a walker that clears a cell, sometimes with a neighbour).
    let mut wall = vec![vec![true; dim]; dim];
    let mut pos = (rng.random_range(1..dim - 1), rng.random_range(1..dim - 1));
    for _ in 0..(3 * (dim + dim)) {
        wall[pos.0][pos.1] = false;
        if rng.random_bool(0.3) {
            let d = rng.random_range(0..4);
            let (dr, dc) = DELTAS[d];
            if let (Some(r), Some(c)) = (pos.0.checked_add_signed(dr), pos.1.checked_add_signed(dc))
                && (1..dim - 1).contains(&r)
                && (1..dim - 1).contains(&c)
            {
                wall[r][c] = false;
            }
        }
        let d = rng.random_range(0..4);
        let (dr, dc) = DELTAS[d];
        let r = pos.0.saturating_add_signed(dr).clamp(1, dim - 2);
        let c = pos.1.saturating_add_signed(dc).clamp(1, dim - 2);
        pos = (r, c);
    }
    let mut floor: Vec<(usize, usize)> = (0..dim)
        .flat_map(|r| (0..dim).map(move |c| (r, c)))
        .filter(|&(r, c)| !wall[r][c])
        .collect();
    if floor.len() < boxes + 2 {
        return None;
    }
    // Targets, with the boxes on them, and the agent on another cell.
    let mut room = Room {
        target: vec![vec![false; dim]; dim],
        boxes: vec![vec![false; dim]; dim],
        wall,
        agent: (0, 0),
    };
    for _ in 0..boxes {
        let (r, c) = floor.swap_remove(rng.random_range(0..floor.len()));
        room.target[r][c] = true;
        room.boxes[r][c] = true;
    }
    room.agent = floor[rng.random_range(0..floor.len())];
    // Play backwards: walk, and when stepping away from a box, pull it along half of the time.
    for _ in 0..(20 * (dim + boxes)) {
        let d = rng.random_range(0..4);
        let Some(to) = room.next(room.agent, d) else {
            continue;
        };
        if !room.free(to) {
            continue;
        }
        let behind = room.next(room.agent, d ^ 1);
        let from = room.agent;
        room.agent = to;
        if let Some(b) = behind
            && room.boxes[b.0][b.1]
            && rng.random_bool(0.5)
        {
            room.boxes[b.0][b.1] = false;
            room.boxes[from.0][from.1] = true;
        }
    }
    (room.placed() < boxes).then_some(room)
}

/// Where rooms come from.
#[derive(Debug, Clone)]
enum Source {
    Generated { dim: usize, boxes: usize },
    Levels(Vec<Room>),
}

#[derive(Debug, Clone)]
pub struct Sokoban {
    source: Source,
    max_steps: usize,
    room: Room,
    steps: usize,
    done: bool,
}

impl Sokoban {
    /// From parameters: `dim` (6), `num_boxes` (1), `max_steps` (120), or `levels` (an XSB file).
    pub fn from_params(params: &[(String, String)]) -> Result<Sokoban, String> {
        let (mut dim, mut boxes, mut max_steps, mut levels) = (6usize, 1usize, 120usize, None);
        for (key, value) in params {
            let bad = |what: &str| {
                let value = crate::text::clean(value, 80, false);
                format!("sokoban: {key}={value}: {what}")
            };
            let int = |lo: usize, hi: usize| {
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|v| (lo..=hi).contains(v))
                    .ok_or_else(|| bad(&format!("expected an integer in {lo}..={hi}")))
            };
            match key.as_str() {
                "dim" => dim = int(5, 16)?,
                "num_boxes" => boxes = int(1, 6)?,
                "max_steps" => max_steps = int(1, 10_000)?,
                "levels" => {
                    let text = std::fs::read_to_string(value)
                        .map_err(|e| bad(&format!("cannot read the level file: {e}")))?;
                    levels = Some(parse_levels(&text).map_err(|e| bad(&e))?);
                }
                other => {
                    let known = ["dim", "num_boxes", "max_steps", "levels"];
                    return Err(format!(
                        "sokoban: unknown parameter '{other}'{} (known: {})",
                        crate::text::suggestion_suffix(other, known),
                        known.join(", ")
                    ));
                }
            }
        }
        if boxes * 4 > (dim - 2) * (dim - 2) {
            return Err(format!(
                "sokoban: {boxes} boxes do not fit a {dim}x{dim} room (at most {})",
                (dim - 2) * (dim - 2) / 4
            ));
        }
        let source = match levels {
            Some(l) => Source::Levels(l),
            None => Source::Generated { dim, boxes },
        };
        let mut env = Sokoban {
            source,
            max_steps,
            room: Room {
                wall: vec![vec![true]],
                target: vec![vec![false]],
                boxes: vec![vec![false]],
                agent: (0, 0),
            },
            steps: 0,
            done: false,
        };
        env.reset(0).map_err(|e| e.0)?;
        Ok(env)
    }

    fn room_for(&self, seed: u64) -> Room {
        match &self.source {
            Source::Levels(levels) => levels[(seed % levels.len() as u64) as usize].clone(),
            Source::Generated { dim, boxes } => (0..1000u64)
                .find_map(|attempt| generate(*dim, *boxes, mix_seed(&[seed, 3, attempt])))
                .unwrap_or_else(|| fallback(*dim, *boxes)),
        }
    }
}

/// A plain room for the (practically unreachable) case that 1000 generations all fail: an open
/// room, the boxes one step left of their targets along the second row, the agent behind them.
fn fallback(dim: usize, boxes: usize) -> Room {
    let mut room = Room {
        wall: (0..dim)
            .map(|r| {
                (0..dim)
                    .map(|c| r == 0 || c == 0 || r == dim - 1 || c == dim - 1)
                    .collect()
            })
            .collect(),
        target: vec![vec![false; dim]; dim],
        boxes: vec![vec![false; dim]; dim],
        agent: (1, 1),
    };
    for r in (1..dim - 1).take(boxes) {
        room.boxes[r][2] = true;
        room.target[r][3] = true;
    }
    room
}

impl Env for Sokoban {
    fn name(&self) -> &'static str {
        "sokoban"
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
        self.room = self.room_for(seed);
        (self.steps, self.done) = (0, false);
        Ok(self.render_text())
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let Some(d) = ACTIONS.iter().position(|a| a.eq_ignore_ascii_case(action)) else {
            return Err(StepError::Invalid(format!(
                "'{action}' is not an action ({})",
                self.action_format()
            )));
        };
        if self.done {
            return Ok(Step::now(self, 0.0, true));
        }
        let mut reward = STEP_PENALTY;
        let room = &mut self.room;
        if let Some(to) = room.next(room.agent, d)
            && !room.wall[to.0][to.1]
        {
            if room.boxes[to.0][to.1] {
                // A push: the box moves on when the cell behind it is free.
                if let Some(beyond) = room.next(to, d)
                    && room.free(beyond)
                {
                    room.boxes[to.0][to.1] = false;
                    room.boxes[beyond.0][beyond.1] = true;
                    room.agent = to;
                    match (room.target[to.0][to.1], room.target[beyond.0][beyond.1]) {
                        (false, true) => reward += BOX_ON,
                        (true, false) => reward += BOX_OFF,
                        _ => {}
                    }
                }
            } else {
                room.agent = to;
            }
        }
        self.steps += 1;
        let solved = self.room.placed() == self.room.box_count();
        if solved {
            reward += FINISHED;
        }
        self.done = solved || self.steps >= self.max_steps;
        Ok(Step::now(self, reward, self.done))
    }

    /// `success` (every box on a target), `boxes_on_target`, `steps`.
    fn info(&self) -> Map<String, Value> {
        let mut info = Map::new();
        let placed = self.room.placed();
        info.insert(
            "success".into(),
            Value::Bool(placed == self.room.box_count()),
        );
        info.insert("boxes_on_target".into(), Value::from(placed));
        info.insert("steps".into(), Value::from(self.steps));
        info
    }

    fn render_text(&self) -> String {
        self.render_grid()
            .rows
            .iter()
            .map(|r| r.iter().collect::<String>())
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn render_grid(&self) -> Grid {
        let room = &self.room;
        let rows = (0..room.rows())
            .map(|r| {
                (0..room.cols())
                    .map(|c| {
                        let t = room.target[r][c];
                        match (room.wall[r][c], room.boxes[r][c], (r, c) == room.agent) {
                            (true, _, _) => '#',
                            (_, true, _) if t => '*',
                            (_, true, _) => 'X',
                            (_, _, true) if t => 'S',
                            (_, _, true) => 'P',
                            _ if t => 'O',
                            _ => '_',
                        }
                    })
                    .collect()
            })
            .collect();
        Grid {
            rows,
            agent: room.agent,
        }
    }

    fn state_hash(&self) -> u64 {
        let mut bytes: Vec<u8> = self.render_text().into_bytes();
        bytes.extend(format!("@{},{}", self.room.agent.0, self.room.agent.1).bytes());
        stable_hash(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::plan::shortest_plan;

    fn level(text: &str) -> Sokoban {
        let mut env = Sokoban {
            source: Source::Levels(parse_levels(text).unwrap_or_else(|e| panic!("{e}"))),
            max_steps: 120,
            room: fallback(5, 1),
            steps: 0,
            done: false,
        };
        env.reset(0).unwrap();
        env
    }

    #[test]
    fn pushes_score_as_gym_sokoban_does() {
        // The agent pushes the box right onto the target: −0.1 + 1 + 10 and done.
        let mut env = level("#####\n#@$.#\n#####\n");
        assert_eq!(env.render_text(), "#####\n#PXO#\n#####");
        let s = env.step("Right").unwrap_or_else(|e| panic!("{e}"));
        assert!((s.reward - 10.9).abs() < 1e-12 && s.done, "{s:?}");
        assert_eq!(env.render_text(), "#####\n#_P*#\n#####");
        assert_eq!(s.info["success"], true);
        // Off a target: −0.1 − 1. A box against a wall does not move: −0.1.
        let mut env = level("######\n#@*_.#\n#  $ #\n######\n");
        let s = env.step("Right").unwrap_or_else(|e| panic!("{e}"));
        assert!((s.reward + 1.1).abs() < 1e-12 && !s.done, "{s:?}");
        let mut env = level("####\n#@$#\n#.##\n####\n");
        let before = env.state_hash();
        let s = env.step("Right").unwrap_or_else(|e| panic!("{e}"));
        assert!((s.reward + 0.1).abs() < 1e-12);
        assert_eq!(env.state_hash(), before);
        assert!(env.step("Jump").is_err());
        assert_eq!(env.state_hash(), before);
    }

    #[test]
    fn generated_rooms_are_solvable_and_follow_the_seed() {
        let params = [
            ("dim".to_string(), "6".to_string()),
            ("num_boxes".into(), "1".into()),
        ];
        let mut env = Sokoban::from_params(&params).unwrap_or_else(|e| panic!("{e}"));
        for seed in 0..20 {
            let first = env.reset(seed).unwrap();
            assert_eq!(Ok(first.clone()), env.clone().reset(seed), "seed {seed}");
            assert_eq!(
                env.info()["success"],
                false,
                "seed {seed}: starts solved\n{first}"
            );
            // Reverse play guarantees a solution; the planner finds one.
            let plan = shortest_plan(&env, 60);
            assert!(plan.is_some(), "seed {seed} has no solution:\n{first}");
        }
        assert_ne!(env.reset(1), env.reset(2));
        assert!(
            Sokoban::from_params(&[("dim".into(), "5".into()), ("num_boxes".into(), "6".into())])
                .is_err()
        );
        assert!(
            Sokoban::from_params(&[("dimm".into(), "5".into())])
                .unwrap_err()
                .contains("did you mean 'dim'")
        );
    }

    #[test]
    fn every_shipped_level_is_solvable() {
        for file in ["envs/sokoban/tiny.xsb", "envs/sokoban/two_boxes.xsb"] {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
            let levels = parse_levels(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
            for (i, room) in levels.into_iter().enumerate() {
                let mut env = level(&text);
                env.room = room;
                assert_eq!(env.info()["success"], false, "{file} level {}", i + 1);
                assert!(
                    shortest_plan(&env, 40).is_some(),
                    "{file} level {} has no solution:\n{}",
                    i + 1,
                    env.render_text()
                );
            }
        }
    }

    #[test]
    fn level_files_are_checked() {
        assert!(
            parse_levels("#####\n#@$.#\n#####\n\n; two\n#####\n#.$@#\n#####\n").map(|l| l.len())
                == Ok(2)
        );
        assert!(
            parse_levels("#####\n#@$$.#\n#####\n")
                .unwrap_err()
                .contains("2 boxes but 1 targets")
        );
        assert!(
            parse_levels("#####\n#$.#\n#####\n")
                .unwrap_err()
                .contains("exactly one agent")
        );
        assert!(
            parse_levels("#####\n#@$?#\n")
                .unwrap_err()
                .contains("unknown character '?'")
        );
        assert!(parse_levels("; nothing\n").is_err());
    }
}
