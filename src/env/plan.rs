//! A breadth-first planner over any environment: the shortest action sequence from the current
//! state to one whose `info.success` is true. Demonstrations for SFT warm starts come from it. It
//! searches on copies (`Env::clone_box`), so an environment with random transitions is planned as
//! its own random stream will play out — good enough for demonstrations, which are imperfect anyway.

use std::collections::{HashSet, VecDeque};

use super::Env;

/// The most states one plan may visit: bounded work on any environment.
pub const MAX_PLAN_STATES: usize = 200_000;

/// The shortest list of actions that reaches success from `env`'s current state, within
/// `max_depth` actions; `None` when there is none (or the search hit [`MAX_PLAN_STATES`]).
pub fn shortest_plan(env: &dyn Env, max_depth: usize) -> Option<Vec<String>> {
    if succeeded(env) {
        return Some(vec![]);
    }
    let mut seen = HashSet::from([env.state_hash()]);
    let mut frontier: VecDeque<(Box<dyn Env>, Vec<String>)> = VecDeque::new();
    frontier.push_back((env.clone_box(), vec![]));
    while let Some((state, path)) = frontier.pop_front() {
        if path.len() >= max_depth {
            continue;
        }
        for action in state.actions() {
            let mut next = state.clone_box();
            let Ok(step) = next.step(&action) else {
                continue;
            };
            let mut path = path.clone();
            path.push(action);
            if succeeded(next.as_ref()) {
                return Some(path);
            }
            if step.done || !seen.insert(next.state_hash()) {
                continue;
            }
            if seen.len() > MAX_PLAN_STATES {
                return None;
            }
            frontier.push_back((next, path));
        }
    }
    None
}

fn succeeded(env: &dyn Env) -> bool {
    env.info().get("success").and_then(|v| v.as_bool()) == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::make;

    fn lake(map: &str) -> Box<dyn Env> {
        make("frozen_lake", &[("map".into(), map.into())]).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_plan_is_a_shortest_path_around_the_holes() {
        // SFFF/FHFH/FFFH/HFFG: the holes at (1,1), (1,3), (2,3), (3,0) leave shortest paths of 6
        // moves, e.g. Down Down Right Right Down Right or Right Right Down Down Down Right.
        let mut env = lake("SFFF/FHFH/FFFH/HFFG");
        env.reset(0).unwrap();
        let plan = shortest_plan(env.as_ref(), 20).unwrap_or_default();
        assert_eq!(plan.len(), 6, "{plan:?}");
        let mut last = None;
        for a in &plan {
            last = env.step(a).ok();
        }
        assert_eq!(last.map(|s| (s.reward, s.done)), Some((1.0, true)));
        // Too shallow a search, or a goal walled off by holes, has no plan.
        env.reset(0).unwrap();
        assert_eq!(shortest_plan(env.as_ref(), 5), None);
        let mut walled = lake("SH/HG");
        walled.reset(0).unwrap();
        assert_eq!(shortest_plan(walled.as_ref(), 50), None);
    }
}
