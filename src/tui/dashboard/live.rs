//! Following live runs: a poll brings only the points each series gained since the last one
//! (`Store::series_since`), and they are added where the series end, extending the EMA and the
//! min/max pyramids from there instead of recomputing them over the whole run each second.

use super::{Dashboard, Part};
use crate::metrics::Series;
use crate::store::RunId;
use crate::store::series::display_order;
use crate::store::series_since::SeriesMark;

impl Dashboard {
    /// The drawn run `run`, if it is one.
    pub fn part(&self, run: RunId) -> Option<&Part> {
        self.parts.iter().find(|p| p.run == run)
    }

    /// Record how far `run`'s series have been read.
    pub fn set_mark(&mut self, run: RunId, mark: SeriesMark) {
        if let Some(p) = self.parts.iter_mut().find(|p| p.run == run) {
            p.mark = Some(mark);
        }
    }

    /// Whether `run` is writing (its series are polled); the open run's also shows in the title.
    pub fn set_live(&mut self, run: RunId, live: bool) {
        if let Some(p) = self.parts.iter_mut().find(|p| p.run == run) {
            p.live = live;
        }
        if run == self.run {
            self.live = live;
        }
    }

    /// The runs being written that are drawn here, with how far each has been read.
    pub fn live_parts(&self) -> Vec<(RunId, Option<SeriesMark>)> {
        self.parts
            .iter()
            .filter(|p| p.live)
            .map(|p| (p.run, p.mark.clone()))
            .collect()
    }

    /// Points `run`'s series gained (each tail follows its series' last point); a series not
    /// drawn yet is added, which re-plans the panels.
    pub fn append_run_series(&mut self, run: RunId, tails: &[Series]) {
        let Some(at) = self.parts.iter().position(|p| p.run == run) else {
            return;
        };
        let start: usize = self.parts[..at].iter().map(|p| p.len).sum();
        let range = start..start + self.parts[at].len;
        let mut new = vec![];
        for tail in tails {
            let found = self.series[range.clone()]
                .iter()
                .position(|s| s.stage == tail.stage && s.key == tail.key);
            match found {
                Some(j) => self.append(start + j, tail),
                None => new.push(tail.clone()),
            }
        }
        if !new.is_empty() {
            let mut all: Vec<Series> = self.series[range].to_vec();
            all.extend(new);
            all.sort_by(|a, b| {
                display_order(&a.stage, &a.key).cmp(&display_order(&b.stage, &b.key))
            });
            self.set_run_series(run, all);
        }
    }

    /// Append `tail`'s points to series `i`, extending what is derived from it.
    fn append(&mut self, i: usize, tail: &Series) {
        if tail.is_empty() {
            return;
        }
        let from = self.series[i].len();
        let s = &mut self.series[i];
        s.steps.extend_from_slice(&tail.steps);
        s.wall_time.extend_from_slice(&tail.wall_time);
        s.values.extend_from_slice(&tail.values);
        self.steps[i].extend(tail.steps.iter().map(|&x| x as f64));
        self.raw_pyramids[i].extend(&s.values, from);
        self.emas[i].extend(&tail.values, &mut self.smoothed[i]);
        self.smooth_pyramids[i].extend(&self.smoothed[i], from);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::super::tests::series;
    use super::*;
    use crate::tui::action::Action;
    use crate::tui::decimate::Pyramid;
    use crate::tui::replay::tests::slice as cut;

    /// Everything the dashboard holds of its series, bit for bit (NaN included).
    type Held = (Vec<(String, String, Vec<u64>)>, Vec<Vec<u64>>, Vec<Pyramid>);

    fn held(d: &Dashboard) -> Held {
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
        let names = d
            .series
            .iter()
            .map(|s| (s.stage.clone(), s.key.clone(), s.steps.clone()))
            .collect();
        let numbers = d
            .series
            .iter()
            .flat_map(|s| [bits(&s.wall_time), bits(&s.values)])
            .chain(d.steps.iter().map(|s| bits(s)))
            .chain(d.smoothed.iter().map(|s| bits(s)))
            .collect();
        let pyramids = d.raw_pyramids.iter().chain(&d.smooth_pyramids).cloned();
        (names, numbers, pyramids.collect())
    }

    #[test]
    fn appended_points_give_what_loading_the_whole_series_gives() {
        let values: Vec<f64> = (0..300)
            .map(|i| match i % 37 {
                5 => f64::NAN,
                _ => ((i * 7919) % 101) as f64 / 10.0,
            })
            .collect();
        let whole = [
            series("rl", "actor/kl", &values),
            series("rl", "reward/add/mean", &values[..250]),
            series("sft", "sft/loss", &values[..40]),
        ];
        let mut live = Dashboard::new(RunId(1), "r".into(), true);
        live.overlay(RunId(2), "other".into(), false);
        live.set_run_series(RunId(2), vec![series("rl", "actor/kl", &values[..9])]);
        live.act(Action::SmoothMore);
        // First the rl kl series alone; then pieces of every size, including one that brings
        // two new series (re-planned) and empty tails.
        live.set_run_series(RunId(1), vec![cut(&whole[0], 0, 3)]);
        let [kl, reward, sft] = &whole;
        let polls = [
            vec![cut(kl, 3, 4)],
            vec![cut(kl, 4, 11)],
            vec![cut(kl, 11, 11)],
            vec![cut(kl, 11, 100)],
            vec![cut(kl, 100, 257), cut(reward, 0, 207), sft.clone()],
            vec![cut(kl, 257, 300), cut(reward, 207, 250)],
        ];
        for tails in polls {
            live.append_run_series(RunId(1), &tails);
        }
        let mut reloaded = Dashboard::new(RunId(1), "r".into(), true);
        reloaded.overlay(RunId(2), "other".into(), false);
        reloaded.set_run_series(RunId(2), vec![series("rl", "actor/kl", &values[..9])]);
        reloaded.act(Action::SmoothMore);
        let mut sorted = whole.to_vec();
        sorted.rotate_right(1); // sft first, as the store orders them
        reloaded.set_run_series(RunId(1), sorted);
        assert_eq!(live.parts[0].len, 3);
        assert!(held(&live) == held(&reloaded));
        assert_eq!(live.panels(), reloaded.panels());
    }

    #[test]
    fn marks_and_liveness_belong_to_each_drawn_run() {
        let mut d = Dashboard::new(RunId(1), "r".into(), false);
        d.overlay(RunId(2), "b".into(), true);
        assert_eq!(d.live_parts(), vec![(RunId(2), None)]);
        d.set_mark(RunId(2), SeriesMark::default());
        d.set_live(RunId(1), true);
        assert!(d.live);
        assert_eq!(
            d.live_parts(),
            vec![(RunId(1), None), (RunId(2), Some(SeriesMark::default()))]
        );
        assert!(d.part(RunId(3)).is_none());
    }
}
