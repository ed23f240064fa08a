//! The Episodes view: an agentic run's episodes step by step — each step's groups and their
//! episodes (success, return, turns, why it ended), and the selected episode turn by turn: the
//! environment as it rendered (grids as grids), the policy's output, the parsed action and the
//! reward. `h`/`l` walk the steps that recorded episodes, `Tab` moves between the episode list
//! and the turns, and the replay cursor shows the episodes of the step it is on.

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
    pub(super) steps: Vec<u64>,
    /// The step shown or being loaded.
    pub(super) step: Option<u64>,
    /// The episodes of `step` once they arrive, in (group, episode) order.
    pub(super) episodes: Option<Vec<TrajectoryRecord>>,
    pub(super) selected: usize,
    pub(super) turn: usize,
    pub(super) pane: Pane,
    /// A step asked for by [`EpisodesView::go_to`] before the steps were known.
    target: Option<u64>,
    /// The (group, episode) selected when another step was asked for: selected again there.
    keep: Option<(usize, usize)>,
}

impl EpisodesView {
    pub fn new(run: RunId) -> EpisodesView {
        EpisodesView {
            run,
            loaded: false,
            steps: vec![],
            step: None,
            episodes: None,
            selected: 0,
            turn: 0,
            pane: Pane::Episodes,
            target: None,
            keep: None,
        }
    }

    /// The steps that recorded episodes. Returns the step to load when nothing is shown yet:
    /// the newest, or the one [`EpisodesView::go_to`] asked for.
    pub fn set_steps(&mut self, mut steps: Vec<u64>) -> Option<u64> {
        steps.sort_unstable();
        steps.dedup();
        self.steps = steps;
        self.loaded = true;
        if let Some(target) = self.target.take() {
            return self.go_to(target);
        }
        match self.step {
            Some(_) => None,
            None => self.show(*self.steps.last()?),
        }
    }

    /// The episodes of `step`; an answer for a step no longer wanted is dropped.
    pub fn set_episodes(&mut self, step: u64, mut episodes: Vec<TrajectoryRecord>) {
        if self.step != Some(step) {
            return;
        }
        episodes.sort_by_key(|e| (e.group, e.episode));
        // Keep the selection where it was (the same group and episode) when the step changes.
        let keep = self
            .keep
            .take()
            .and_then(|key| episodes.iter().position(|e| (e.group, e.episode) == key));
        self.selected = keep.unwrap_or(0).min(episodes.len().saturating_sub(1));
        self.episodes = Some(episodes);
        self.clamp_turn();
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
        if let Some(e) = self.selected_episode() {
            self.keep = Some((e.group, e.episode));
        }
        self.step = Some(step);
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
            Action::Refresh => return self.step,
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests;
