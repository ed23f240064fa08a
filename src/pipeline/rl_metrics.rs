//! The rollout metrics of one RL step: per-domain reward and accuracy, response lengths, the share
//! of groups without signal, and what the scheduler aborted, filtered and dropped as stale.

use std::collections::BTreeMap;

use super::rollout_loop::{Seen, StepRollout};
use crate::metrics::Metrics;

/// Metrics of every sample that finished this step, kept or filtered, and the scheduler's counters.
pub(super) fn rollout_metrics(m: &mut Metrics, out: &StepRollout) {
    let mut by_domain: BTreeMap<&str, Vec<&Seen>> = BTreeMap::new();
    for s in &out.seen {
        by_domain.entry(s.domain.as_str()).or_default().push(s);
    }
    for (domain, samples) in &by_domain {
        let rewards: Vec<f64> = samples.iter().map(|s| s.outcome.score as f64).collect();
        let n = rewards.len() as f64;
        let mean = rewards.iter().sum::<f64>() / n;
        let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt();
        let share = |f: fn(&Seen) -> bool| samples.iter().filter(|s| f(s)).count() as f64 / n;
        m.insert(format!("reward/{domain}/mean"), mean);
        m.insert(format!("reward/{domain}/std"), std);
        m.insert(
            format!("score/{domain}/accuracy"),
            share(|s| s.outcome.correct),
        );
        m.insert(
            format!("score/{domain}/format_ok"),
            share(|s| s.outcome.format_ok),
        );
    }
    let lens: Vec<usize> = out.seen.iter().map(|s| s.tokens).collect();
    if !lens.is_empty() {
        let n = lens.len() as f64;
        m.insert(
            "response_length/mean".into(),
            lens.iter().sum::<usize>() as f64 / n,
        );
        m.insert(
            "response_length/max".into(),
            *lens.iter().max().unwrap_or(&0) as f64,
        );
        let clipped = out.seen.iter().filter(|s| s.truncated).count();
        m.insert("response_length/clip_ratio".into(), clipped as f64 / n);
    }
    let st = &out.stats;
    if st.finished_groups > 0 {
        m.insert(
            "group/frac_zero_std".into(),
            st.flat_groups as f64 / st.finished_groups as f64,
        );
    }
    m.insert("group/dropped".into(), st.filtered_groups as f64);
    m.insert(
        "rollout/dispatched_prompts".into(),
        st.dispatched_prompts as f64,
    );
    m.insert(
        "rollout/aborted".into(),
        (st.aborted_samples + st.surplus_samples) as f64,
    );
    m.insert("async/dropped_stale".into(), st.dropped_stale as f64);
    m.insert("async/staleness_mean".into(), st.staleness_mean());
    m.insert("async/staleness_max".into(), st.staleness_max as f64);
    m.insert("time/rollout".into(), out.t_generate);
    m.insert("time/reward".into(), out.t_reward);
    m.insert(
        "system/tokens_per_s".into(),
        out.gen_tokens as f64 / out.t_generate.max(1e-9),
    );
}
