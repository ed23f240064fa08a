//! The Samples view of one run: what the policy wrote at one rl step. The step's groups (one prompt
//! each, with its mean reward, how many responses were correct, and a mark when every reward is
//! equal: such a group has zero advantages and teaches nothing), the responses of the selected group
//! and the details of the selected response. `f` follows the selected prompt across every step
//! instead, to see whether the policy learned it.
//!
//! State only, no IO: each change that needs data returns a [`SamplesRequest`]; the app loads it
//! from the store and hands the answer back. Drawing is in [`super::samples_render`].

use super::action::Action;
use crate::metrics::SampleRecord;
use crate::store::RunId;

pub use super::samples_render::render;
use super::samples_render::wrapped_lines;

/// The stage whose samples the view shows: steps come from `Store::sample_steps(run, STAGE)`, and
/// answers are narrowed to it.
pub const STAGE: &str = crate::config::Stage::Rl.as_str();
/// Responses a page key moves over, and lines it scrolls a whole response by.
const PAGE: usize = 10;
/// About the narrowest a whole response is drawn (80 columns less borders, or the right column of a
/// wide screen): the width scrolling is bounded at.
const SCROLL_WIDTH: usize = 50;

/// What the app must load next for the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SamplesRequest {
    /// Every sample of this rl step, in recorded order: answer with [`SamplesView::set_step_samples`].
    Step(u64),
    /// Every rl sample of this prompt over all steps: answer with [`SamplesView::set_prompt_samples`].
    Prompt(String),
}

/// Responses listed together: one prompt's group at a step, or, when following a prompt, its
/// responses at one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Indices into the listing's samples, in recorded order; never empty.
    pub members: Vec<usize>,
    pub step: u64,
    /// The mean of the scored rewards; NaN when none was scored.
    pub mean: f32,
    /// Correct responses among all the group's, and how many it has (`members` may be narrowed).
    pub correct: usize,
    pub size: usize,
    /// Every reward is scored and equal: the group carries no learning signal.
    pub flat: bool,
}

/// Which responses the listing keeps besides the search and domain filters (`w` cycles them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Narrow {
    #[default]
    All,
    /// The responses that were not correct.
    Wrong,
    /// Groups whose rewards are all equal: no learning signal.
    Flat,
}

impl Narrow {
    fn next(self) -> Narrow {
        match self {
            Narrow::All => Narrow::Wrong,
            Narrow::Wrong => Narrow::Flat,
            Narrow::Flat => Narrow::All,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Narrow::All => "all",
            Narrow::Wrong => "wrong only",
            Narrow::Flat => "flat groups only",
        }
    }
}

/// How the listing narrows and orders its groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shown {
    pub narrow: Narrow,
    /// Lowest mean reward first (stable: recorded order among equals; unscored last).
    pub worst_first: bool,
}

/// Loaded samples, the groups the filters keep, and the selection in them.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub samples: Vec<SampleRecord>,
    pub groups: Vec<Group>,
    /// An index into `samples`: a member of a kept group whenever one is kept, else `None`.
    pub selected: Option<usize>,
    /// Grouped by step only (following a prompt), not by step and prompt.
    by_step: bool,
}

impl Listing {
    fn new(samples: Vec<SampleRecord>, by_step: bool) -> Listing {
        Listing {
            samples: samples.into_iter().filter(|s| s.stage == STAGE).collect(),
            groups: vec![],
            selected: None,
            by_step,
        }
    }

    /// Consecutive samples of one step (and, per step, one prompt) form a group.
    fn all_groups(&self) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = vec![];
        for (i, s) in self.samples.iter().enumerate() {
            let joins = out.last_mut().and_then(|g| {
                let first = self.samples.get(*g.first()?)?;
                let same = first.step == s.step && (self.by_step || first.prompt == s.prompt);
                same.then_some(g)
            });
            match joins {
                Some(g) => g.push(i),
                None => out.push(vec![i]),
            }
        }
        out
    }

    fn keeps(&self, members: &[usize], filter: &str, domain: Option<&str>) -> bool {
        let Some(first) = members.first().and_then(|&i| self.samples.get(i)) else {
            return false;
        };
        if domain.is_some_and(|d| d != first.domain) {
            return false;
        }
        let has = |text: &str| text.to_lowercase().contains(filter);
        filter.is_empty()
            || has(&first.prompt)
            || members
                .iter()
                .filter_map(|&i| self.samples.get(i))
                .any(|s| has(&s.response) || has(&s.ground_truth))
    }

    fn group(&self, members: Vec<usize>) -> Group {
        let rewards: Vec<f32> = members
            .iter()
            .filter_map(|&i| self.samples.get(i))
            .map(|s| s.reward)
            .collect();
        let scored: Vec<f32> = rewards.iter().copied().filter(|r| r.is_finite()).collect();
        let mean = if scored.is_empty() {
            f32::NAN
        } else {
            scored.iter().sum::<f32>() / scored.len() as f32
        };
        let member = |i: &usize| self.samples.get(*i);
        Group {
            step: members
                .first()
                .and_then(member)
                .map_or(0, |s| s.step as u64),
            correct: members
                .iter()
                .filter_map(member)
                .filter(|s| s.correct)
                .count(),
            flat: scored.len() == rewards.len() && scored.windows(2).all(|w| w[0] == w[1]),
            mean,
            size: members.len(),
            members,
        }
    }

    /// Keep the groups that match `filter` (lower case) and `domain`, narrowed and ordered as
    /// `shown` says; a selection they hide moves to the first response kept. A group's mean and
    /// count of correct answers are always those of all its responses.
    fn regroup(&mut self, filter: &str, domain: Option<&str>, shown: Shown) {
        let kept: Vec<Vec<usize>> = self
            .all_groups()
            .into_iter()
            .filter(|m| self.keeps(m, filter, domain))
            .collect();
        let mut groups: Vec<Group> = kept.into_iter().map(|m| self.group(m)).collect();
        match shown.narrow {
            Narrow::All => {}
            Narrow::Wrong => {
                for g in &mut groups {
                    let samples = &self.samples;
                    g.members
                        .retain(|&i| samples.get(i).is_some_and(|s| !s.correct));
                }
                groups.retain(|g| !g.members.is_empty());
            }
            Narrow::Flat => groups.retain(|g| g.flat),
        }
        if shown.worst_first {
            // NaN (nothing scored) sorts after every number.
            groups.sort_by(|a, b| match (a.mean.is_nan(), b.mean.is_nan()) {
                (false, false) => a.mean.total_cmp(&b.mean),
                (x, y) => x.cmp(&y),
            });
        }
        self.groups = groups;
        if self.position().is_none() {
            self.selected = self.order().first().copied();
        }
    }

    /// The responses kept, in the order the selection walks them.
    fn order(&self) -> Vec<usize> {
        self.groups
            .iter()
            .flat_map(|g| g.members.iter().copied())
            .collect()
    }

    /// Where the selection is in [`Listing::order`].
    fn position(&self) -> Option<usize> {
        let selected = self.selected?;
        self.order().iter().position(|&i| i == selected)
    }

    fn select_at(&mut self, position: usize) {
        let order = self.order();
        let at = position.min(order.len().saturating_sub(1));
        self.selected = order.get(at).copied();
    }

    /// The index into `groups` of the selected response's group.
    pub fn selected_group(&self) -> Option<usize> {
        let selected = self.selected?;
        self.groups
            .iter()
            .position(|g| g.members.contains(&selected))
    }

    pub fn selected_sample(&self) -> Option<&SampleRecord> {
        self.samples.get(self.selected?)
    }

    /// The domains of every sample, sorted.
    fn domains(&self) -> Vec<String> {
        let mut d: Vec<String> = self.samples.iter().map(|s| s.domain.clone()).collect();
        d.sort();
        d.dedup();
        d
    }

    /// The steps of every sample, for "across K steps".
    pub fn step_count(&self) -> usize {
        let mut steps: Vec<usize> = self.samples.iter().map(|s| s.step).collect();
        steps.dedup();
        steps.len()
    }
}

/// A prompt followed across steps; `listing` is `None` until its samples arrive.
#[derive(Debug, Clone)]
pub struct Following {
    pub prompt: String,
    pub listing: Option<Listing>,
}

#[derive(Debug, Clone)]
pub struct SamplesView {
    pub run: RunId,
    /// The run's sample steps are known ([`SamplesView::set_steps`] answered once).
    pub loaded: bool,
    pub(super) steps: Vec<u64>,
    /// The step shown or being loaded.
    pub(super) step: Option<u64>,
    /// The samples of `step`, once they arrive.
    pub(super) listing: Option<Listing>,
    pub(super) following: Option<Following>,
    /// A step asked for by [`SamplesView::go_to`] before the steps were known.
    target: Option<u64>,
    filter: String,
    pub(super) domain: Option<String>,
    /// Wrong-only or flat-groups-only, and worst-first order (`w`, `s`).
    pub(super) shown: Shown,
    /// The selected response is shown whole and wrapped, scrolled down `scroll` lines.
    pub(super) whole: bool,
    pub(super) scroll: u16,
}

impl SamplesView {
    pub fn new(run: RunId) -> SamplesView {
        SamplesView {
            run,
            loaded: false,
            steps: vec![],
            step: None,
            listing: None,
            following: None,
            target: None,
            filter: String::new(),
            domain: None,
            shown: Shown::default(),
            whole: false,
            scroll: 0,
        }
    }

    /// The rl steps that recorded samples (from `Store::sample_steps`). Returns the step to load
    /// when nothing is shown yet: the newest, or the one [`SamplesView::go_to`] asked for.
    pub fn set_steps(&mut self, mut steps: Vec<u64>) -> Option<SamplesRequest> {
        steps.sort_unstable();
        steps.dedup();
        self.steps = steps;
        self.loaded = true;
        if self.step.is_some() {
            return None;
        }
        let step = match self.target.take() {
            Some(target) => self.newest_at(target)?,
            None => *self.steps.last()?,
        };
        self.show_step(step)
    }

    /// The known sample steps, ascending.
    pub fn steps(&self) -> &[u64] {
        &self.steps
    }

    /// Samples of one step in recorded order (answers [`SamplesRequest::Step`]); an answer for a
    /// step no longer wanted is ignored. A reload of the shown step keeps the selection.
    pub fn set_step_samples(&mut self, step: u64, samples: Vec<SampleRecord>) {
        if self.step != Some(step) {
            return;
        }
        let mut listing = Listing::new(samples, false);
        listing.selected = self.listing.as_ref().and_then(|l| l.selected);
        listing.regroup(
            &self.filter.to_lowercase(),
            self.domain.as_deref(),
            self.shown,
        );
        self.listing = Some(listing);
    }

    /// Every sample of one prompt over all steps (answers [`SamplesRequest::Prompt`]); ignored
    /// unless that prompt is followed. Selects the response at the shown step, if it has one.
    pub fn set_prompt_samples(&mut self, prompt: &str, mut samples: Vec<SampleRecord>) {
        let Some(following) = self.following.as_mut().filter(|f| f.prompt == prompt) else {
            return;
        };
        samples.sort_by_key(|s| s.step);
        let mut listing = Listing::new(samples, true);
        let at_step = self.step.and_then(|step| {
            let at = |s: &SampleRecord| s.step as u64 == step;
            listing.samples.iter().position(at)
        });
        listing.selected = following
            .listing
            .as_ref()
            .and_then(|l| l.selected)
            .or(at_step);
        listing.regroup(
            &self.filter.to_lowercase(),
            self.domain.as_deref(),
            self.shown,
        );
        following.listing = Some(listing);
    }

    /// Search text typed after `/`: keeps groups whose prompt, or a response or ground truth,
    /// contains it (any case).
    pub fn set_filter(&mut self, text: String) {
        self.filter = text;
        self.regroup();
    }

    pub fn filter(&self) -> &str {
        &self.filter
    }

    /// How the groups are narrowed and ordered.
    pub fn shown(&self) -> Shown {
        self.shown
    }

    /// The domain filter in effect (`None`: every domain).
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// The step shown (`None` before any is known).
    pub fn step(&self) -> Option<u64> {
        self.step
    }

    /// The prompt followed across steps, if any.
    pub fn following(&self) -> Option<&str> {
        self.following.as_ref().map(|f| f.prompt.as_str())
    }

    /// The listing on screen: the followed prompt's while following, else the step's; `None` while
    /// it loads.
    pub fn listing(&self) -> Option<&Listing> {
        match &self.following {
            Some(f) => f.listing.as_ref(),
            None => self.listing.as_ref(),
        }
    }

    fn listing_mut(&mut self) -> Option<&mut Listing> {
        match &mut self.following {
            Some(f) => f.listing.as_mut(),
            None => self.listing.as_mut(),
        }
    }

    /// Show `step` (the replay cursor, or a drill-down from the dashboard): the newest step with
    /// samples at or before it, or the first step when none is. Leaves a followed prompt when the
    /// step changes. Before the steps are known, remembers `step` for [`SamplesView::set_steps`].
    pub fn go_to(&mut self, step: u64) -> Option<SamplesRequest> {
        if self.steps.is_empty() {
            self.target = Some(step);
            return None;
        }
        let step = self.newest_at(step)?;
        if self.step == Some(step) {
            return None;
        }
        self.following = None;
        self.show_step(step)
    }

    fn newest_at(&self, target: u64) -> Option<u64> {
        let at_or_before = self.steps.iter().rev().find(|&&s| s <= target);
        at_or_before.or(self.steps.first()).copied()
    }

    fn show_step(&mut self, step: u64) -> Option<SamplesRequest> {
        if self.step == Some(step) {
            return None;
        }
        self.step = Some(step);
        self.listing = None;
        self.scroll = 0;
        Some(SamplesRequest::Step(step))
    }

    fn regroup(&mut self) {
        let filter = self.filter.to_lowercase();
        let domain = self.domain.clone();
        let shown = self.shown;
        let followed = self.following.as_mut().and_then(|f| f.listing.as_mut());
        for listing in self.listing.iter_mut().chain(followed) {
            listing.regroup(&filter, domain.as_deref(), shown);
        }
        self.scroll = 0;
    }

    /// One step back or on; leaves a followed prompt instead.
    fn step_by(&mut self, forward: bool) -> Option<SamplesRequest> {
        if self.following.take().is_some() {
            self.scroll = 0;
            return None;
        }
        let at = self.steps.iter().position(|&s| Some(s) == self.step)?;
        let to = if forward { at + 1 } else { at.checked_sub(1)? };
        let step = *self.steps.get(to)?;
        self.show_step(step)
    }

    fn toggle_follow(&mut self) -> Option<SamplesRequest> {
        if self.following.take().is_some() {
            self.scroll = 0;
            return None;
        }
        let prompt = self.listing.as_ref()?.selected_sample()?.prompt.clone();
        self.following = Some(Following {
            prompt: prompt.clone(),
            listing: None,
        });
        self.scroll = 0;
        Some(SamplesRequest::Prompt(prompt))
    }

    /// all → each domain of the listing → all (`forward`), or the other way round.
    fn cycle_domain(&mut self, forward: bool) {
        let domains = self.listing().map(Listing::domains).unwrap_or_default();
        let at = self
            .domain
            .as_ref()
            .and_then(|d| domains.iter().position(|x| x == d));
        let next = match (at, forward) {
            (None, true) => domains.first(),
            (None, false) => domains.last(),
            (Some(i), true) => domains.get(i + 1),
            (Some(i), false) => i.checked_sub(1).and_then(|i| domains.get(i)),
        };
        self.domain = next.cloned();
        self.regroup();
    }

    fn move_by(&mut self, by: isize) {
        if let Some(l) = self.listing_mut() {
            let at = l.position().unwrap_or(0);
            l.select_at(at.saturating_add_signed(by));
        }
        self.scroll = 0;
    }

    fn move_to_end(&mut self, last: bool) {
        if let Some(l) = self.listing_mut() {
            l.select_at(if last { usize::MAX } else { 0 });
        }
        self.scroll = 0;
    }

    /// Whether the selected response is shown whole.
    pub fn showing_whole(&self) -> bool {
        self.whole
    }

    /// Back from the whole response to the list; `false` when it was not open.
    pub fn close_whole(&mut self) -> bool {
        let was = self.whole;
        self.whole = false;
        self.scroll = 0;
        was
    }

    pub fn act(&mut self, action: Action) -> Option<SamplesRequest> {
        let page = PAGE as isize;
        match action {
            Action::Left => return self.step_by(false),
            Action::Right => return self.step_by(true),
            Action::Follow => return self.toggle_follow(),
            Action::Refresh => {
                return match (&self.following, self.step) {
                    (Some(f), _) => Some(SamplesRequest::Prompt(f.prompt.clone())),
                    (None, step) => step.map(SamplesRequest::Step),
                };
            }
            Action::Narrow => {
                self.shown.narrow = self.shown.narrow.next();
                self.regroup();
            }
            Action::WorstFirst => {
                self.shown.worst_first = !self.shown.worst_first;
                self.regroup();
            }
            Action::NextPane => self.cycle_domain(true),
            Action::PrevPane => self.cycle_domain(false),
            Action::Up => self.move_by(-1),
            Action::Down => self.move_by(1),
            Action::PageUp if self.whole => self.scroll = self.scroll.saturating_sub(PAGE as u16),
            Action::PageDown if self.whole => {
                // The drawing clamps to the real width; this bound only keeps PgUp from having
                // to climb back from far past the end.
                let most = self
                    .listing()
                    .and_then(Listing::selected_sample)
                    .map_or(0, |s| {
                        wrapped_lines(&s.response, SCROLL_WIDTH).saturating_sub(1)
                    });
                self.scroll = self.scroll.saturating_add(PAGE as u16).min(most);
            }
            Action::PageUp => self.move_by(-page),
            Action::PageDown => self.move_by(page),
            Action::Top => self.move_to_end(false),
            Action::Bottom => self.move_to_end(true),
            Action::Open => {
                self.whole = !self.whole;
                self.scroll = 0;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use super::super::samples_render::{one_line, wrap};
    use super::super::theme::Theme;
    use super::*;

    const ADD: &str = "What is 2+3?";
    const REV: &str = "Reverse 'abc'.";

    fn sample(
        step: usize,
        domain: &str,
        prompt: &str,
        response: &str,
        reward: f32,
    ) -> SampleRecord {
        SampleRecord {
            stage: STAGE.into(),
            step,
            domain: domain.into(),
            prompt: prompt.into(),
            response: response.into(),
            ground_truth: if domain == "add" { "5" } else { "cba" }.into(),
            reward,
            correct: reward > 0.5,
            breakdown: BTreeMap::from([
                ("correct".to_string(), f64::from(reward)),
                ("format_ok".to_string(), 1.0),
            ]),
            advantage: reward - 0.5,
            prompt_tokens: 7,
            response_tokens: response.chars().count(),
            finish_reason: "stop".into(),
            policy_version: step.saturating_sub(1),
        }
    }

    /// Two groups of two: `add` learns something (rewards 1 and 0), `rev` does not (both 1).
    fn step_samples(step: usize) -> Vec<SampleRecord> {
        vec![
            sample(step, "add", ADD, "2+3 = 5", 1.0),
            sample(step, "add", ADD, "It is 6.", 0.0),
            sample(step, "rev", REV, "cba", 1.0),
            sample(step, "rev", REV, "cba", 1.0),
        ]
    }

    /// A view of steps 1, 3 and 5 showing step 5.
    fn view() -> SamplesView {
        let mut v = SamplesView::new(RunId(1));
        assert_eq!(v.set_steps(vec![5, 1, 3]), Some(SamplesRequest::Step(5)));
        v.set_step_samples(5, step_samples(5));
        v
    }

    /// Each kept group's domain with its responses.
    fn kept(v: &SamplesView) -> Vec<(String, Vec<String>)> {
        let l = v.listing().expect("loaded");
        l.groups
            .iter()
            .map(|g| {
                let of = |i: &usize| l.samples[*i].clone();
                let domain = of(&g.members[0]).domain;
                (domain, g.members.iter().map(|i| of(i).response).collect())
            })
            .collect()
    }

    #[test]
    fn w_narrows_to_wrong_answers_or_flat_groups_and_s_puts_the_worst_first() {
        let mut v = view();
        let both = |d: &str, r: &[&str]| (d.to_string(), r.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            kept(&v),
            [
                both("add", &["2+3 = 5", "It is 6."]),
                both("rev", &["cba", "cba"])
            ]
        );
        // Worst mean reward first: add (0.5) before rev (1.0) — already so; flip the data's
        // order to see it move.
        let mut samples = step_samples(5);
        samples.rotate_left(2); // rev first
        v.set_step_samples(5, samples);
        assert_eq!(kept(&v)[0].0, "rev");
        v.act(Action::WorstFirst);
        assert_eq!(kept(&v)[0].0, "add");
        v.act(Action::WorstFirst);
        assert_eq!(kept(&v)[0].0, "rev");
        // Wrong only: the one wrong response, in its group (whose mean stays that of both).
        v.act(Action::Narrow);
        assert_eq!(kept(&v), [both("add", &["It is 6."])]);
        let l = v.listing().expect("loaded");
        assert_eq!(
            (l.groups[0].mean, l.groups[0].correct, l.groups[0].size),
            (0.5, 1, 2)
        );
        assert_eq!(
            l.selected_sample().map(|s| s.response.as_str()),
            Some("It is 6.")
        );
        // Flat groups only: rev's, whose rewards are all 1.
        v.act(Action::Narrow);
        assert_eq!(kept(&v), [both("rev", &["cba", "cba"])]);
        v.act(Action::Narrow);
        assert_eq!(kept(&v).len(), 2);
    }

    fn selected(v: &SamplesView) -> Option<(String, String)> {
        let s = v.listing()?.selected_sample()?;
        Some((s.prompt.clone(), s.response.clone()))
    }

    /// Every selection is a member of a kept group, or there is none and no group is kept.
    fn assert_valid(v: &SamplesView) {
        if let Some(l) = v.listing() {
            match l.selected {
                Some(i) => assert!(l.groups.iter().any(|g| g.members.contains(&i))),
                None => assert!(l.groups.is_empty()),
            }
        }
    }

    #[test]
    fn left_and_right_walk_the_sample_steps_and_stop_at_the_ends() {
        let mut v = view();
        assert_eq!(v.step(), Some(5));
        assert_eq!(v.act(Action::Right), None, "already the newest");
        assert_eq!(v.act(Action::Left), Some(SamplesRequest::Step(3)));
        assert!(v.listing().is_none(), "step 3 is loading");
        v.set_step_samples(3, step_samples(3));
        assert_eq!(v.act(Action::Left), Some(SamplesRequest::Step(1)));
        assert_eq!(v.act(Action::Left), None, "step 1 is the first");
        assert_eq!(v.step(), Some(1));
        assert_eq!(v.act(Action::Right), Some(SamplesRequest::Step(3)));
        // New steps arriving (a live run) do not move a view that shows one.
        assert_eq!(v.set_steps(vec![1, 3, 5, 7]), None);
        assert_eq!(v.step(), Some(3));
        assert_eq!(v.act(Action::Refresh), Some(SamplesRequest::Step(3)));
    }

    #[test]
    fn go_to_shows_the_newest_sample_step_at_or_before_the_target() {
        let mut v = SamplesView::new(RunId(1));
        assert_eq!(v.step(), None);
        // Asked before the steps are known: the answer to set_steps loads it.
        assert_eq!(v.go_to(4), None);
        assert_eq!(v.set_steps(vec![1, 3, 5]), Some(SamplesRequest::Step(3)));
        assert_eq!(v.go_to(3), None, "already shown");
        assert_eq!(v.go_to(100), Some(SamplesRequest::Step(5)));
        assert_eq!(v.go_to(5), None);
        assert_eq!(v.go_to(2), Some(SamplesRequest::Step(1)));
        // Before the first sample step there is nothing older: the first is shown.
        assert_eq!(v.go_to(0), None);
        assert_eq!(v.step(), Some(1));
    }

    #[test]
    fn answers_for_steps_or_prompts_no_longer_wanted_are_ignored() {
        let mut v = view();
        assert_eq!(v.act(Action::Left), Some(SamplesRequest::Step(3)));
        v.set_step_samples(5, step_samples(5)); // late answer for the step left
        assert!(v.listing().is_none());
        v.set_prompt_samples(ADD, step_samples(1)); // nothing is followed
        assert!(v.following().is_none());
        v.set_step_samples(3, step_samples(3));
        assert_eq!(v.listing().map(|l| l.groups.len()), Some(2));
        assert_eq!(
            v.act(Action::Follow),
            Some(SamplesRequest::Prompt(ADD.into()))
        );
        v.set_prompt_samples(REV, step_samples(1));
        assert!(v.listing().is_none(), "REV is not the prompt followed");
    }

    #[test]
    fn follow_shows_the_prompt_across_steps_and_comes_back_to_the_step() {
        let mut v = view();
        v.act(Action::Down);
        v.act(Action::Down); // the first `rev` response, across the group boundary
        assert_eq!(selected(&v), Some((REV.into(), "cba".into())));
        assert_eq!(
            v.act(Action::Follow),
            Some(SamplesRequest::Prompt(REV.into()))
        );
        assert_eq!(v.following(), Some(REV));
        // Recorded order is by step already; shuffled here to check the grouping sorts.
        let mut all: Vec<SampleRecord> = [5, 1, 3]
            .iter()
            .flat_map(|&s| step_samples(s).into_iter().skip(2))
            .collect();
        all[0].reward = f32::NAN;
        v.set_prompt_samples(REV, all);
        let l = v.listing().unwrap();
        let steps: Vec<u64> = l.groups.iter().map(|g| g.step).collect();
        assert_eq!(steps, [1, 3, 5]);
        assert_eq!(l.step_count(), 3);
        // Step 5 has one unscored response: its mean is the scored one's, and it is not flat.
        assert_eq!((l.groups[2].mean, l.groups[2].flat), (1.0, false));
        assert!(l.groups[0].flat);
        assert_eq!(
            l.selected_sample().map(|s| s.step),
            Some(5),
            "the shown step"
        );
        v.act(Action::Top);
        assert_eq!(
            v.listing().unwrap().selected_sample().map(|s| s.step),
            Some(1)
        );
        // f again: the step view, with its selection where it was.
        assert_eq!(v.act(Action::Follow), None);
        assert_eq!(v.following(), None);
        assert_eq!(selected(&v), Some((REV.into(), "cba".into())));
        // Left (or Right) also leaves following, without moving the step.
        v.act(Action::Follow);
        assert_eq!(v.act(Action::Left), None);
        assert_eq!((v.following(), v.step()), (None, Some(5)));
    }

    #[test]
    fn search_and_domain_filters_keep_the_selection_in_range() {
        let mut v = view();
        v.act(Action::Bottom);
        assert_eq!(selected(&v), Some((REV.into(), "cba".into())));
        v.set_filter("IT IS".into()); // a response of the `add` group, any case
        assert_eq!(v.listing().unwrap().groups.len(), 1);
        assert_eq!(selected(&v), Some((ADD.into(), "2+3 = 5".into())));
        assert_valid(&v);
        v.set_filter("nothing like this".into());
        assert_eq!(v.listing().unwrap().selected, None);
        for a in [
            Action::Down,
            Action::Up,
            Action::PageDown,
            Action::Bottom,
            Action::Open,
        ] {
            v.act(a);
            assert_valid(&v);
        }
        assert_eq!(v.act(Action::Follow), None, "nothing selected to follow");
        v.set_filter("cba".into()); // a ground truth
        assert_eq!(selected(&v), Some((REV.into(), "cba".into())));
        v.set_filter(String::new());
        // all → add → rev → all, and back.
        let mut seen = vec![];
        for _ in 0..3 {
            v.act(Action::NextPane);
            seen.push(v.domain().map(String::from));
            assert_valid(&v);
        }
        assert_eq!(seen, [Some("add".into()), Some("rev".into()), None]);
        v.act(Action::PrevPane);
        assert_eq!(v.domain(), Some("rev"));
        assert_eq!(v.listing().unwrap().groups.len(), 1);
        assert_eq!(selected(&v).map(|s| s.0), Some(REV.into()));
        // The domain stays on the next step, whose groups are filtered too.
        assert_eq!(v.act(Action::Left), Some(SamplesRequest::Step(3)));
        v.set_step_samples(3, step_samples(3));
        assert_eq!(selected(&v).map(|s| s.0), Some(REV.into()));
    }

    #[test]
    fn empty_runs_and_empty_steps_never_panic() {
        let mut v = SamplesView::new(RunId(1));
        assert_eq!(v.set_steps(vec![]), None);
        assert!(v.loaded);
        for a in [
            Action::Left,
            Action::Right,
            Action::Follow,
            Action::NextPane,
            Action::Down,
            Action::Bottom,
            Action::Open,
            Action::PageDown,
            Action::Refresh,
        ] {
            assert_eq!(v.act(a), None);
        }
        assert_eq!(v.set_steps(vec![2]), Some(SamplesRequest::Step(2)));
        v.set_step_samples(2, vec![]);
        v.act(Action::Down);
        v.act(Action::NextPane);
        assert_eq!(v.listing().map(|l| l.selected), Some(None));
        // Samples of another stage are not shown.
        let mut sft = step_samples(2);
        sft.iter_mut().for_each(|s| s.stage = "sft".into());
        v.act(Action::Refresh);
        v.set_step_samples(2, sft);
        assert!(v.listing().unwrap().samples.is_empty());
    }

    #[test]
    fn a_whole_response_scrolls_a_page_at_a_time_within_its_length() {
        let mut v = view();
        v.act(Action::Open);
        assert!(v.whole);
        v.act(Action::PageDown);
        assert_eq!(v.scroll, 0, "one line: nothing to scroll");
        let long = "word ".repeat(400); // 2000 columns: 40 lines at 50
        v.set_step_samples(5, vec![sample(5, "add", ADD, &long, 1.0)]);
        for _ in 0..10 {
            v.act(Action::PageDown);
        }
        assert_eq!(v.scroll, 39);
        v.act(Action::PageUp);
        assert_eq!(v.scroll, 29);
        v.act(Action::Down);
        assert_eq!(v.scroll, 0, "a new selection starts at its top");
    }

    #[test]
    fn model_text_is_made_safe_to_draw() {
        assert_eq!(one_line("a\nb\tc\u{1b}[31m\u{202e}x", 100), "a↵b c�[31m�x");
        assert_eq!(one_line("日本語です", 2), "日本…");
        assert_eq!(wrap("hello world foo", 11), ["hello ", "world foo"]);
        assert_eq!(wrap("abcdefgh", 3), ["abc", "def", "gh"]);
        // Wide characters take two columns: one per line at width 3.
        assert_eq!(wrap("日本語", 3), ["日", "本", "語"]);
        assert_eq!(wrap("a\r\n\tb\n", 10), ["a", "    b", ""]);
        assert_eq!(wrap("", 10), [""]);
    }

    fn screen(view: &SamplesView, width: u16, height: u16) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        let theme = Theme::default();
        terminal
            .draw(|f| render(f, f.area(), view, "⠋", &theme))
            .unwrap();
        terminal.backend().to_string()
    }

    /// Step 5 of a run with four groups, one of them scored NaN, one answer long and messy.
    fn busy_view() -> SamplesView {
        let mut v = SamplesView::new(RunId(1));
        v.set_steps(vec![1, 3, 5]);
        let mut samples = step_samples(5);
        let messy = "Let me think.\n\tFirst, 2+3:\r\n\u{1b}[31m5\u{1b}[0m — 日本語の答え 🙂 \u{7}\n\n\
            So the answer is 20, because ten plus ten is twenty, and twenty is what we wanted; a \
            line this long wraps at the edge of the detail area without splitting any word.\n\u{202e}done";
        samples.push(sample(
            5,
            "add",
            "What is 10+10?\nAnswer briefly.",
            messy,
            1.0,
        ));
        samples.push(sample(
            5,
            "add",
            "What is 10+10?\nAnswer briefly.",
            &"20 ".repeat(60),
            0.0,
        ));
        let mut unscored = sample(5, "count", "Count the r's in 'strawberry'.", "3", f32::NAN);
        unscored.advantage = f32::NAN;
        unscored.finish_reason = "length".into();
        samples.push(unscored);
        v.set_step_samples(5, samples);
        v
    }

    #[test]
    fn renders_a_step_at_80x24_and_wider() {
        let mut v = busy_view();
        v.act(Action::Down);
        insta::assert_snapshot!("samples_step_80x24", screen(&v, 80, 24));
        v.act(Action::Down);
        v.act(Action::Down);
        insta::assert_snapshot!("samples_step_140x32", screen(&v, 140, 32));
    }

    #[test]
    fn renders_a_messy_response_whole_and_filters_in_the_header() {
        let mut v = busy_view();
        for _ in 0..4 {
            v.act(Action::Down);
        }
        v.act(Action::Open);
        insta::assert_snapshot!("samples_whole_80x24", screen(&v, 80, 24));
        v.act(Action::Open);
        v.set_filter("日本".into());
        v.act(Action::NextPane);
        insta::assert_snapshot!("samples_filtered_80x24", screen(&v, 80, 24));
    }

    #[test]
    fn renders_a_prompt_followed_across_steps() {
        let mut v = view();
        v.act(Action::Follow);
        insta::assert_snapshot!("samples_follow_loading", screen(&v, 80, 4));
        let all: Vec<SampleRecord> = (1..=12)
            .flat_map(|s| {
                let right = s.min(4);
                (0..4).map(move |i| {
                    let ok = i < right;
                    let text = if ok { "2+3 = 5" } else { "It is 6." };
                    sample(s, "add", ADD, text, if ok { 1.0 } else { 0.0 })
                })
            })
            .collect();
        v.set_prompt_samples(ADD, all);
        insta::assert_snapshot!("samples_follow_80x24", screen(&v, 80, 24));
    }

    #[test]
    fn renders_loading_and_a_run_without_samples() {
        let mut v = SamplesView::new(RunId(1));
        insta::assert_snapshot!("samples_loading", screen(&v, 80, 3));
        v.set_steps(vec![]);
        insta::assert_snapshot!("samples_none", screen(&v, 80, 3));
    }
}
