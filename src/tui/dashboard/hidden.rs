//! Hiding series: `s` picks a series of the focused panel (underlined in its title), `x` hides it
//! or shows it again, `a` shows every hidden series. A hidden series stays in its panel's title,
//! crossed out, and drops out of the panel's curves, y range and x range, so hiding a runaway
//! series gives the others the whole height again.
//!
//! Hidden series are remembered by run, stage and key, not by index: a live run's poll can add
//! series, which moves the indices of those after them.

use super::Dashboard;
use crate::store::RunId;

/// A series by what names it in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesName {
    pub run: RunId,
    pub stage: String,
    pub key: String,
}

impl Dashboard {
    fn name_of(&self, i: usize) -> SeriesName {
        let s = &self.series[i];
        SeriesName {
            run: self.part_of(i).run,
            stage: s.stage.to_string(),
            key: s.key.clone(),
        }
    }

    /// Whether series `i` is hidden.
    pub fn is_hidden(&self, i: usize) -> bool {
        !self.hidden.is_empty() && self.hidden.contains(&self.name_of(i))
    }

    /// The series of `lines` that are drawn: the ones not hidden.
    pub fn shown(&self, lines: &[usize]) -> Vec<usize> {
        lines
            .iter()
            .copied()
            .filter(|&i| !self.is_hidden(i))
            .collect()
    }

    /// The picked series of the focused panel (the one `x` hides), as a position in its lines.
    pub fn picked(&self) -> Option<usize> {
        let len = self.panels().get(self.focus)?.lines.len();
        (len > 0).then(|| self.pick.min(len - 1))
    }

    /// `s`: the focused panel's next series, round to the first after the last.
    pub(super) fn pick_next(&mut self) {
        if let Some(at) = self.picked() {
            let len = self.panels()[self.focus].lines.len();
            self.pick = (at + 1) % len;
        }
    }

    /// `x`: hide the picked series, or show it again.
    pub(super) fn toggle_picked(&mut self) {
        let Some(at) = self.picked() else {
            return;
        };
        let name = self.name_of(self.panels()[self.focus].lines[at]);
        if let Some(k) = self.hidden.iter().position(|h| *h == name) {
            self.hidden.remove(k);
        } else {
            self.hidden.push(name);
        }
    }

    /// `a`: every series drawn again.
    pub(super) fn show_all(&mut self) {
        self.hidden.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::series;
    use super::*;
    use crate::tui::action::Action;

    fn keys(d: &Dashboard, lines: &[usize]) -> Vec<String> {
        lines.iter().map(|&i| d.series[i].key.clone()).collect()
    }

    #[test]
    fn x_hides_the_picked_series_and_it_stays_hidden_when_series_are_added() {
        let mut d = Dashboard::new(RunId(1), "r".into(), true);
        let v: Vec<f64> = (0..10).map(f64::from).collect();
        d.set_series(vec![
            series("rl", "reward/add/mean", &v),
            series("rl", "reward/rev/mean", &v),
            series("rl", "actor/pg_loss", &v),
        ]);
        let reward = d.panels()[0].lines.clone();
        assert_eq!(d.picked(), Some(0));
        d.act(Action::PickSeries);
        assert_eq!(d.picked(), Some(1));
        d.act(Action::HideSeries);
        assert_eq!(keys(&d, &d.shown(&reward)), ["reward/add/mean"]);
        assert!(d.is_hidden(reward[1]) && !d.is_hidden(reward[0]));
        // The pick goes round; on another panel it starts at the first series.
        d.act(Action::PickSeries);
        assert_eq!(d.picked(), Some(0));
        d.act(Action::Down);
        assert_eq!((d.focus, d.picked()), (1, Some(0)));
        // A live poll adds a series before the hidden one: its index moves, it stays hidden.
        d.set_series(vec![
            series("rl", "reward/abc/mean", &v),
            series("rl", "reward/add/mean", &v),
            series("rl", "reward/rev/mean", &v),
            series("rl", "actor/pg_loss", &v),
        ]);
        let reward = d.panels()[0].lines.clone();
        assert_eq!(
            keys(&d, &d.shown(&reward)),
            ["reward/abc/mean", "reward/add/mean"]
        );
        // x again shows it; `a` shows everything.
        d.act(Action::Top);
        d.act(Action::PickSeries);
        d.act(Action::PickSeries);
        d.act(Action::HideSeries);
        assert_eq!(d.shown(&reward), reward);
        d.act(Action::HideSeries);
        d.act(Action::Down);
        d.act(Action::HideSeries);
        assert_eq!(d.hidden.len(), 2);
        d.act(Action::ShowAllSeries);
        assert!(d.hidden.is_empty());
    }

    #[test]
    fn the_same_key_of_a_compared_run_is_hidden_on_its_own() {
        let mut d = Dashboard::new(RunId(1), "a".into(), false);
        d.overlay(RunId(2), "b".into(), false);
        let v: Vec<f64> = (0..10).map(f64::from).collect();
        d.set_run_series(RunId(1), vec![series("rl", "actor/pg_loss", &v)]);
        d.set_run_series(RunId(2), vec![series("rl", "actor/pg_loss", &v)]);
        d.act(Action::PickSeries);
        d.act(Action::HideSeries);
        assert!(!d.is_hidden(0) && d.is_hidden(1));
    }

    #[test]
    fn hiding_the_longer_series_narrows_the_panel_to_the_others_steps() {
        let mut d = Dashboard::new(RunId(1), "r".into(), false);
        let long: Vec<f64> = (0..100).map(f64::from).collect();
        let short: Vec<f64> = (0..40).map(f64::from).collect();
        d.set_series(vec![
            series("rl", "reward/add/mean", &short),
            series("rl", "reward/rev/mean", &long),
        ]);
        let lines = d.panels()[0].lines.clone();
        assert_eq!(d.panel_window(&lines), Some((1.0, 100.0)));
        d.act(Action::PickSeries);
        d.act(Action::HideSeries);
        assert_eq!(d.panel_window(&lines), Some((1.0, 40.0)));
        // With all of a panel's series hidden, it keeps their range rather than none.
        d.act(Action::PickSeries);
        d.act(Action::HideSeries);
        assert_eq!(d.panel_window(&lines), Some((1.0, 100.0)));
    }
}
