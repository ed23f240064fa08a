//! The Episodes view: an agentic run's episodes step by step — each step's groups and their
//! episodes (success, return, turns, why it ended), and the selected episode turn by turn: the
//! environment as it rendered (grids as grids), the policy's output, the parsed action and the
//! reward. `h`/`l` walk the steps that recorded episodes, `Tab` moves between the episode list
//! and the turns, `v` switches between training and evaluation episodes (`val/<tag>`, played from
//! the same seeds at every evaluation), and the replay cursor shows the episodes of the step it is
//! on. Moving to another step selects the episode of the same seed when there is one (so one start
//! state is followed across evaluations), else the same group and episode.

pub mod render;

use super::action::Action;
use crate::metrics::TrajectoryRecord;
use crate::store::RunId;

/// Which list the up/down keys move in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Episodes,
    Turns,
}

#[derive(Debug, Clone)]
pub struct EpisodesView {
    pub run: RunId,
    /// The run's episode steps are known ([`EpisodesView::set_steps`] answered once).
    pub loaded: bool,
    /// Every (step, evaluation) the run recorded episodes for.
    all_steps: Vec<(u64, bool)>,
    /// Show evaluation episodes (`val/<tag>`) instead of training ones.
    pub(super) validation: bool,
    /// The steps with episodes of the shown kind.
    pub(super) steps: Vec<u64>,
    /// The step shown or being loaded.
    pub(super) step: Option<u64>,
    /// Every episode of `step` once they arrive, of both kinds.
    all: Vec<TrajectoryRecord>,
    /// The episodes of `step` of the shown kind, in (group, episode) order.
    pub(super) episodes: Option<Vec<TrajectoryRecord>>,
    pub(super) selected: usize,
    pub(super) turn: usize,
    pub(super) pane: Pane,
    /// The selected turn's tokens with the student's and the teachers' log-probs in place of
    /// its observation (`T`).
    pub(super) tokens: bool,
    /// A step asked for by [`EpisodesView::go_to`] before the steps were known.
    target: Option<u64>,
    /// The (seed, group, episode) selected when another step was asked for: the episode of that
    /// seed is selected there, else the one of that group and place.
    keep: Option<(u64, usize, usize)>,
}

impl EpisodesView {
    pub fn new(run: RunId) -> EpisodesView {
        EpisodesView {
            run,
            loaded: false,
            all_steps: vec![],
            validation: false,
            steps: vec![],
            step: None,
            all: vec![],
            episodes: None,
            selected: 0,
            turn: 0,
            pane: Pane::Episodes,
            tokens: false,
            target: None,
            keep: None,
        }
    }

    /// The (step, evaluation) pairs that recorded episodes. Returns the step to load when nothing
    /// is shown yet: the newest, or the one [`EpisodesView::go_to`] asked for.
    pub fn set_steps(&mut self, mut steps: Vec<(u64, bool)>) -> Option<u64> {
        steps.sort_unstable();
        steps.dedup();
        self.all_steps = steps;
        self.steps = self.kind_steps();
        self.loaded = true;
        if let Some(target) = self.target.take() {
            return self.go_to(target);
        }
        match self.step {
            Some(_) => None,
            None => self.show(*self.steps.last()?),
        }
    }

    fn kind_steps(&self) -> Vec<u64> {
        let mut steps: Vec<u64> = self
            .all_steps
            .iter()
            .filter(|(_, val)| *val == self.validation)
            .map(|(s, _)| *s)
            .collect();
        steps.dedup();
        steps
    }

    /// The episodes of `step` (both kinds); an answer for a step no longer wanted is dropped.
    pub fn set_episodes(&mut self, step: u64, mut episodes: Vec<TrajectoryRecord>) {
        if self.step != Some(step) {
            return;
        }
        episodes.sort_by_key(|e| (e.group, e.episode));
        self.all = episodes;
        self.filter();
    }

    /// The shown kind's episodes of the step, with the kept selection: the same seed, else the
    /// same group and place.
    fn filter(&mut self) {
        let shown: Vec<TrajectoryRecord> = self
            .all
            .iter()
            .filter(|e| e.env.starts_with("val/") == self.validation)
            .cloned()
            .collect();
        let keep = self.keep.take().and_then(|(seed, group, episode)| {
            shown.iter().position(|e| e.env_seed == seed).or_else(|| {
                shown
                    .iter()
                    .position(|e| (e.group, e.episode) == (group, episode))
            })
        });
        self.selected = keep.unwrap_or(0).min(shown.len().saturating_sub(1));
        self.episodes = Some(shown);
        self.clamp_turn();
    }

    /// Training or evaluation episodes: the same step when it has the other kind too, else the
    /// newest step of that kind at or before it (to load).
    fn toggle_validation(&mut self) -> Option<u64> {
        self.remember();
        self.validation = !self.validation;
        self.steps = self.kind_steps();
        let at = self.step?;
        if self.steps.contains(&at) && self.episodes.is_some() {
            self.filter();
            return None;
        }
        let to = self
            .steps
            .iter()
            .rev()
            .find(|s| **s <= at)
            .or(self.steps.first())
            .copied();
        match to {
            Some(s) => self.show(s),
            None => {
                self.episodes = Some(vec![]);
                None
            }
        }
    }

    fn remember(&mut self) {
        if let Some(e) = self.selected_episode() {
            self.keep = Some((e.env_seed, e.group, e.episode));
        }
    }

    pub fn steps(&self) -> &[u64] {
        &self.steps
    }

    pub fn step(&self) -> Option<u64> {
        self.step
    }

    pub fn episodes(&self) -> &[TrajectoryRecord] {
        self.episodes.as_deref().unwrap_or(&[])
    }

    pub fn selected_episode(&self) -> Option<&TrajectoryRecord> {
        self.episodes.as_ref()?.get(self.selected)
    }

    /// The newest episode step at or before `step` (the replay cursor's): what to load, if it is
    /// not shown already.
    pub fn go_to(&mut self, step: u64) -> Option<u64> {
        if !self.loaded {
            self.target = Some(step);
            return None;
        }
        let at = self.steps.iter().rev().find(|s| **s <= step).copied();
        match at.or_else(|| self.steps.first().copied()) {
            Some(s) if Some(s) != self.step => self.show(s),
            _ => None,
        }
    }

    /// Show `step`: until its episodes arrive the view says it is loading them (never the last
    /// step's episodes under this step's number).
    fn show(&mut self, step: u64) -> Option<u64> {
        self.remember();
        self.step = Some(step);
        self.all.clear();
        self.episodes = None;
        Some(step)
    }

    fn step_by(&mut self, forward: bool) -> Option<u64> {
        let i = self.steps.iter().position(|s| Some(*s) == self.step)?;
        let next = if forward {
            self.steps.get(i + 1)
        } else {
            i.checked_sub(1).and_then(|j| self.steps.get(j))
        };
        next.copied().and_then(|s| self.show(s))
    }

    fn clamp_turn(&mut self) {
        let turns = self.selected_episode().map_or(0, |e| e.turns.len());
        self.turn = self.turn.min(turns.saturating_sub(1));
    }

    fn move_by(&mut self, by: isize) {
        match self.pane {
            Pane::Episodes => {
                let n = self.episodes().len();
                self.selected = self
                    .selected
                    .saturating_add_signed(by)
                    .min(n.saturating_sub(1));
                self.clamp_turn();
            }
            Pane::Turns => {
                self.turn = self.turn.saturating_add_signed(by);
                self.clamp_turn();
            }
        }
    }

    /// Carry out `action`; the step to load, if it needs one.
    pub fn act(&mut self, action: Action) -> Option<u64> {
        match action {
            Action::Up => self.move_by(-1),
            Action::Down => self.move_by(1),
            Action::PageUp => self.move_by(-10),
            Action::PageDown => self.move_by(10),
            Action::Top => self.move_by(isize::MIN),
            Action::Bottom => self.move_by(isize::MAX),
            Action::Left => return self.step_by(false),
            Action::Right => return self.step_by(true),
            Action::NextPane | Action::PrevPane | Action::Open => {
                self.pane = match self.pane {
                    Pane::Episodes => Pane::Turns,
                    Pane::Turns => Pane::Episodes,
                };
            }
            Action::Validation => return self.toggle_validation(),
            Action::Tokens => self.tokens = !self.tokens,
            Action::Refresh => return self.step,
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests;
