//! The Samples view of one run: what the policy wrote at one step of the run's stage that
//! recorded samples last (rl: the scored rollouts; dpo: the step's pairs, chosen and rejected,
//! with their implicit rewards). The step's groups (one prompt each, with its mean reward, how
//! many responses were correct, and a mark when every reward is equal: such a group has zero
//! advantages and teaches nothing), the responses of the selected group and the details of the
//! selected response. `f` follows the selected prompt across every step instead, to see whether
//! the policy learned it.
//!
//! State only, no IO: each change that needs data returns a [`SamplesRequest`]; the app loads it
//! from the store and hands the answer back. Drawing is in [`crate::tui::samples::render`].

pub mod render;
pub mod tokens;

use super::action::Action;
use super::app::Effect;
use crate::metrics::SampleRecord;
use crate::store::RunId;

pub use render::render;
use render::wrapped_lines;

/// The stage a view shows until the store names the run's ([`SamplesView::set_stage_steps`]).
pub const DEFAULT_STAGE: &str = crate::config::Stage::Rl.as_str();

/// Which stage of a run recorded samples last, and the steps of it that did (`None` and no
/// steps: the run has recorded none yet).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SampleSteps {
    pub stage: Option<String>,
    pub steps: Vec<u64>,
}
/// Responses a page key moves over, and lines it scrolls a whole response by.
const PAGE: usize = 10;
/// About the narrowest a whole response is drawn (80 columns less borders, or the right column of a
/// wide screen): the width scrolling is bounded at.
const SCROLL_WIDTH: usize = 50;

/// What the app must load next for the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SamplesRequest {
    /// Every sample of this step of the view's stage, in recorded order: answer with
    /// [`SamplesView::set_step_samples`].
    Step(u64),
    /// Every sample of this prompt over all steps of the view's stage: answer with
    /// [`SamplesView::set_prompt_samples`].
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
    fn new(samples: Vec<SampleRecord>, by_step: bool, stage: &str) -> Listing {
        Listing {
            samples: samples.into_iter().filter(|s| s.stage == stage).collect(),
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
    /// The stage whose samples are shown: answers are narrowed to it.
    pub(super) stage: String,
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
    /// Shown whole as its tokens with the student's and the teachers' log-probs (`T`).
    pub(super) tokens: bool,
    pub(super) scroll: u16,
}

impl SamplesView {
    pub fn new(run: RunId) -> SamplesView {
        SamplesView {
            run,
            stage: DEFAULT_STAGE.into(),
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
            tokens: false,
            scroll: 0,
        }
    }

    /// The stage that recorded samples last and its steps (the loader's answer). A stage other
    /// than the one shown (a run's dpo stage after its sft, an rl stage after a dpo one) starts
    /// the view afresh on it. Returns what [`SamplesView::set_steps`] does.
    pub fn set_stage_steps(&mut self, found: SampleSteps) -> Option<SamplesRequest> {
        if let Some(stage) = found.stage
            && stage != self.stage
        {
            self.stage = stage;
            self.step = None;
            self.listing = None;
            self.following = None;
        }
        self.set_steps(found.steps)
    }

    /// The stage shown.
    pub fn stage(&self) -> &str {
        &self.stage
    }

    /// What the app loads for `request`: reads of this view's run and stage.
    pub fn effect(&self, request: SamplesRequest) -> Effect {
        let (run, stage) = (self.run, self.stage.clone());
        match request {
            SamplesRequest::Step(step) => Effect::LoadSamples { run, stage, step },
            SamplesRequest::Prompt(prompt) => Effect::LoadPrompt { run, stage, prompt },
        }
    }

    /// The steps of the shown stage that recorded samples. Returns the step to load when
    /// nothing is shown yet: the newest, or the one [`SamplesView::go_to`] asked for.
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
        let mut listing = Listing::new(samples, false, &self.stage);
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
        let stage = self.stage.clone();
        let Some(following) = self.following.as_mut().filter(|f| f.prompt == prompt) else {
            return;
        };
        samples.sort_by_key(|s| s.step);
        let mut listing = Listing::new(samples, true, &stage);
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

    /// Whether the selected sample is shown as its tokens.
    pub fn showing_tokens(&self) -> bool {
        self.whole && self.tokens
    }

    /// Back from the whole response to the list; `false` when it was not open.
    pub fn close_whole(&mut self) -> bool {
        let was = self.whole;
        self.whole = false;
        self.tokens = false;
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
                let tokens = self.tokens;
                let most = self
                    .listing()
                    .and_then(Listing::selected_sample)
                    .map_or(0, |s| match (&s.tokens, tokens) {
                        (Some(t), true) => t.pieces.len().saturating_sub(1) as u16,
                        _ => wrapped_lines(&s.response, SCROLL_WIDTH).saturating_sub(1),
                    });
                self.scroll = self.scroll.saturating_add(PAGE as u16).min(most);
            }
            Action::PageUp => self.move_by(-page),
            Action::PageDown => self.move_by(page),
            Action::Top => self.move_to_end(false),
            Action::Bottom => self.move_to_end(true),
            Action::Open => {
                self.whole = !self.whole;
                self.tokens = false;
                self.scroll = 0;
            }
            // The tokens fill the whole-response pane; `T` again goes back to the text.
            Action::Tokens => {
                self.tokens = !self.showing_tokens();
                self.whole = true;
                self.scroll = 0;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests;
