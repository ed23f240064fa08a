//! Keeping the open run's views in step: answers from the loader go to the view that asked, the
//! replay cursor moves every view to the same point of the run, and mouse clicks select.

use super::app::{App, Effect, Msg, View};
use super::replay::{Cursor, Replay, Timeline};
use std::sync::Arc;

use crate::config::Stage;
use crate::store::reads::EventsRead;
use crate::store::series_since::{SeriesMark, SeriesRead, SeriesUpdate};
use crate::store::{RunId, RunInfo};

impl App {
    /// A loader answer or process notice (everything but input, ticks and the run list).
    pub(super) fn loaded(&mut self, msg: Msg) -> Vec<Effect> {
        let open = self.open.as_ref().map(|o| (o.id, o.start_ms));
        let mine = |run| open.is_some_and(|(id, _)| id == run);
        match msg {
            Msg::SeriesLoaded { run, since, result } => {
                return self.series_loaded(run, since, result);
            }
            Msg::SampleStepsLoaded { run, result } if mine(run) => match result {
                Ok(found) => {
                    let Some(s) = self.samples.as_mut() else {
                        return vec![];
                    };
                    let mut effects: Vec<Effect> = s
                        .set_stage_steps(found)
                        .map(|r| s.effect(r))
                        .into_iter()
                        .collect();
                    let stage = s.stage().to_string();
                    if let (Some(step), Some(s)) =
                        (self.replay_step_in(&stage), self.samples.as_mut())
                        && let Some(r) = s.go_to(step)
                    {
                        effects = vec![s.effect(r)];
                    }
                    return effects;
                }
                Err(e) => self.status = Some(e),
            },
            Msg::EpisodeStepsLoaded { run, result } if mine(run) => match result {
                Ok(steps) => {
                    let mut load = self.episodes.as_mut().and_then(|e| e.set_steps(steps));
                    if let (Some(step), Some(e)) = (self.replay_rl_step(), self.episodes.as_mut()) {
                        load = e.go_to(step).or(load.filter(|s| e.step() == Some(*s)));
                    }
                    return load
                        .map(|step| Effect::LoadEpisodes { run, step })
                        .into_iter()
                        .collect();
                }
                Err(e) => self.status = Some(e),
            },
            Msg::EpisodesLoaded { run, step, result } if mine(run) => match result {
                Ok(episodes) => {
                    if let Some(e) = self.episodes.as_mut() {
                        e.set_episodes(step, episodes);
                    }
                }
                Err(e) => self.status = Some(e),
            },
            Msg::SamplesLoaded {
                run, step, result, ..
            } if mine(run) => match result {
                Ok(samples) => {
                    if let Some(s) = self.samples.as_mut() {
                        s.set_step_samples(step, samples);
                    }
                }
                Err(e) => self.status = Some(e),
            },
            Msg::PromptLoaded {
                run,
                prompt,
                result,
                ..
            } if mine(run) => match result {
                Ok(samples) => {
                    if let Some(s) = self.samples.as_mut() {
                        s.set_prompt_samples(&prompt, samples);
                    }
                }
                Err(e) => self.status = Some(e),
            },
            Msg::EventsLoaded { run, after, result } if mine(run) => match result {
                Ok((info, read)) => return self.events_loaded(run, after, *info, read),
                Err(e) => self.status = Some(e),
            },
            Msg::ConfigsFound(configs) => self.configs_found(configs),
            Msg::Started { run, result } => return self.started(&run, result),
            Msg::Exited { pid, code, tail } => return self.exited(pid, code, tail),
            Msg::Debug(m) => {
                if let Some(d) = self.debugger.as_mut() {
                    return d
                        .answer(*m)
                        .into_iter()
                        .map(|j| Effect::Debug(Box::new(j)))
                        .collect();
                }
            }
            Msg::RunDeleted { run, name, result } => match result {
                Ok(()) => {
                    self.notice = Some(format!("deleted run '{name}' (its files stay on disk)"));
                    if open.is_some_and(|(id, _)| id == run) {
                        self.open = None;
                        self.view = super::app::View::Runs;
                    }
                    return vec![Effect::LoadRuns];
                }
                Err(e) => self.status = Some(format!("cannot delete '{name}': {e}")),
            },
            Msg::Done(Ok(text)) => self.notice = Some(text),
            Msg::Done(Err(e)) => self.status = Some(e),
            _ => {} // an answer about a run that is no longer open
        }
        vec![]
    }

    /// A drawn run's series, whole or what they gained since the mark `since`.
    fn series_loaded(
        &mut self,
        run: RunId,
        since: Option<SeriesMark>,
        result: Result<SeriesRead, String>,
    ) -> Vec<Effect> {
        let Some(d) = self.dashboard.as_mut().filter(|d| d.runs().contains(&run)) else {
            return vec![]; // an answer for a dashboard that was closed since
        };
        let read = match result {
            Ok(read) => read,
            Err(e) => {
                d.loaded = true;
                self.status = Some(e);
                return vec![];
            }
        };
        let open = self
            .open
            .as_ref()
            .filter(|o| o.id == run)
            .map(|o| o.start_ms);
        let was = self
            .replay
            .as_ref()
            .and_then(|r| r.tick(&self.timeline))
            .cloned();
        match read.update {
            SeriesUpdate::Whole(series) => {
                d.set_run_series(run, series);
                if let Some(start_ms) = open {
                    self.timeline = Timeline::from_series(d.primary_series(), start_ms);
                }
            }
            SeriesUpdate::Appended(tails) => {
                let mark = d.part(run).and_then(|p| p.mark.clone());
                if mark != since {
                    // The news since a mark these series are no longer at (the dashboard was
                    // reopened while it was read): ask again from where they are.
                    return vec![Effect::LoadSeries { run, since: mark }];
                }
                d.append_run_series(run, &tails);
                if open.is_some() {
                    self.timeline.extend(&tails);
                }
            }
        }
        d.set_mark(run, read.mark);
        if open.is_some() {
            if let Some(r) = self.replay.as_mut() {
                r.keep_on(was.as_ref(), &self.timeline);
            }
            self.sync_as_of();
        }
        vec![]
    }

    /// Read events to the open run's: replaced by a whole read, added to by a read after the
    /// last one; then shown in the workers and events views.
    fn events_loaded(
        &mut self,
        run: RunId,
        after: Option<i64>,
        info: RunInfo,
        read: EventsRead,
    ) -> Vec<Effect> {
        if after.is_some() && after != self.events_mark {
            // Events after a mark the log is no longer at (the run was reopened since).
            return vec![self.load_events(run)];
        }
        // The views give their handles back first, so the log is ours alone and growing it
        // copies nothing.
        if let Some(w) = self.workers.as_mut() {
            w.events = Arc::default();
        }
        if let Some(e) = self.events.as_mut() {
            e.release();
        }
        let log = Arc::make_mut(&mut self.run_events);
        let kept = match (after, read.events.first()) {
            (None, _) => {
                *log = read.events;
                0
            }
            (Some(_), None) => log.len(),
            (Some(_), Some(first)) => {
                // New events usually come after the last; one stamped earlier (another
                // process's clock) is put in its place, as the store orders them.
                let kept = log.partition_point(|e| e.at <= first.at);
                let sorted = kept == log.len();
                log.extend(read.events);
                if !sorted {
                    log.sort_by_key(|e| e.at);
                }
                kept
            }
        };
        self.events_mark = read.last;
        if let Some(w) = self.workers.as_mut() {
            let series = self
                .dashboard
                .as_ref()
                .map(|d| super::workers::view_series(d.primary_series()))
                .unwrap_or_default();
            w.set_data(info, self.run_events.clone(), series);
        }
        if let Some(e) = self.events.as_mut() {
            e.set_events(self.run_events.clone(), kept);
        }
        vec![]
    }

    /// `effect`, a read held while the same read was under way, asked again from where the state
    /// is now (a series or events read goes on from the current mark); `None` for a run no
    /// longer shown.
    pub fn reread(&self, effect: &Effect) -> Option<Effect> {
        match effect {
            Effect::LoadSeries { run, .. } => {
                let part = self.dashboard.as_ref()?.part(*run)?;
                Some(Effect::LoadSeries {
                    run: *run,
                    since: part.mark.clone(),
                })
            }
            Effect::LoadEvents { run, .. } => {
                (self.open.as_ref()?.id == *run).then(|| self.load_events(*run))
            }
            other => Some(other.clone()),
        }
    }

    /// The read of the open run's events that follows on from what the views hold.
    pub(super) fn load_events(&self, run: RunId) -> Effect {
        Effect::LoadEvents {
            run,
            after: self.events_mark,
        }
    }

    /// The replay cursor, when replaying.
    pub fn cursor(&self) -> Option<Cursor> {
        self.timeline.cursor(self.replay.as_ref()?.index)
    }

    /// The replayed step, when it is an RL step (samples exist only for those).
    pub(super) fn replay_rl_step(&self) -> Option<u64> {
        self.replay_step_in(Stage::Rl.as_str())
    }

    /// The replay cursor's step when it is in `stage`.
    pub(super) fn replay_step_in(&self, stage: &str) -> Option<u64> {
        let tick = self.replay.as_ref()?.tick(&self.timeline)?;
        (&*tick.stage == stage).then_some(tick.step)
    }

    pub(super) fn toggle_replay(&mut self) -> Vec<Effect> {
        if self.open.is_none() {
            self.status = Some("open a run first (Enter on the runs list)".into());
            return vec![];
        }
        if self.replay.take().is_some() {
            self.notice = Some("replay left: following the newest step".into());
            self.sync_as_of();
            return vec![];
        }
        self.replay = Replay::start(&self.timeline);
        if self.replay.is_none() {
            self.status = Some("the run has recorded no step yet".into());
        }
        self.cursor_moved()
    }

    pub(super) fn step_replay(&mut self, delta: i64) -> Vec<Effect> {
        if self.open.is_none() {
            return vec![];
        }
        if self.replay.is_none() {
            self.replay = Replay::start(&self.timeline);
        }
        if let Some(r) = self.replay.as_mut() {
            r.step_by(&self.timeline, delta);
        }
        self.cursor_moved()
    }

    /// Move every view to the replay cursor; the samples to load for it.
    pub(super) fn cursor_moved(&mut self) -> Vec<Effect> {
        self.sync_as_of();
        let run = self.open.as_ref().map(|o| o.id);
        let samples_step = self
            .samples
            .as_ref()
            .and_then(|s| self.replay_step_in(s.stage()));
        let mut effects: Vec<Effect> = match (samples_step, self.samples.as_mut()) {
            (Some(step), Some(s)) => s.go_to(step).map(|r| s.effect(r)).into_iter().collect(),
            _ => vec![],
        };
        if let (Some(run), Some(step), Some(e)) =
            (run, self.replay_rl_step(), self.episodes.as_mut())
        {
            effects.extend(e.go_to(step).map(|step| Effect::LoadEpisodes { run, step }));
        }
        effects
    }

    /// Tell the dashboard where the replay cursor is (or that there is none).
    pub(super) fn sync_as_of(&mut self) {
        let tick = self
            .replay
            .as_ref()
            .and_then(|r| r.tick(&self.timeline))
            .cloned();
        if let Some(d) = self.dashboard.as_mut() {
            d.as_of = tick;
        }
        let until = self.cursor().map(|c| c.at_ms);
        if let Some(e) = self.events.as_mut() {
            e.set_until(until);
        }
    }

    /// A left click: a tab switches view; a row of the runs list is selected (and opened when it
    /// already was).
    pub(super) fn click(&mut self, column: u16, row: u16) -> Vec<Effect> {
        if self.help || self.form.is_some() || self.palette.is_some() || self.confirm.is_some() {
            return vec![];
        }
        if row == 0 {
            return match super::ui::tab_at(column) {
                Some(n) => self.go_to_view(n),
                None => vec![],
            };
        }
        if self.view == View::Runs
            && let Some(index) = super::runs::row_at(&self.runs, self.size.1, row)
        {
            let id = self.runs.visible().get(index).map(|r| r.info.id);
            if id.is_some() && id == self.runs.selected {
                return self.act(super::action::Action::Open);
            }
            self.runs.selected = id;
        }
        vec![]
    }
}
