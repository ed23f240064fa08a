use super::*;

fn policy(pps: usize, alpha: usize) -> RolloutPolicy {
    RolloutPolicy {
        prompts_per_step: pps,
        group_size: 2,
        max_prompts_per_version: pps * 3,
        oversample: 0.0,
        filter_flat: true,
        async_ratio: alpha,
    }
}

/// Dispatch what the scheduler wants; returns the new group ids.
fn fill(s: &mut SampleScheduler<u32, u32>) -> Vec<u64> {
    (0..s.prompts_wanted())
        .map(|i| s.dispatch(i as u32))
        .collect()
}

/// Finish both samples of `group` with the given rewards.
fn finish(s: &mut SampleScheduler<u32, u32>, group: u64, rewards: [f32; 2]) {
    for (i, r) in rewards.into_iter().enumerate() {
        assert!(s.finish(group, i, i as u32, r));
    }
}

#[test]
fn synchronous_step_takes_the_first_complete_groups_and_aborts_the_rest() {
    let mut s = SampleScheduler::new(
        RolloutPolicy {
            oversample: 0.5,
            ..policy(2, 0)
        },
        0,
    );
    let ids = fill(&mut s);
    assert_eq!(ids.len(), 3, "2 groups needed + 50% oversampling");
    assert_eq!(s.prompts_wanted(), 0);
    finish(&mut s, ids[2], [1.0, 0.0]);
    assert!(s.take_batch().is_none(), "one group is not a batch");
    assert!(s.finish(ids[0], 1, 7, 0.0));
    finish(&mut s, ids[1], [0.0, 1.0]);
    let batch = s.take_batch().expect("two groups ready");
    assert_eq!(batch.iter().map(|g| g.prompt).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(s.abort_in_flight(), [ids[0]]);
    let st = s.take_stats();
    assert_eq!(
        (st.aborted_samples, st.dispatched_prompts, st.batch_samples),
        (1, 3, 4)
    );
    assert_eq!((st.staleness_max, st.filtered_groups), (0, 0));
    // A late sample of the aborted group is refused, not counted.
    assert!(!s.finish(ids[0], 0, 9, 1.0));
}

#[test]
fn flat_groups_are_filtered_and_replaced_until_the_quota_runs_out() {
    let mut s = SampleScheduler::new(policy(2, 0), 0);
    let mut filtered = 0;
    loop {
        let ids = fill(&mut s);
        if ids.is_empty() {
            break;
        }
        for id in ids {
            finish(&mut s, id, [1.0, 1.0]);
            filtered += 1;
        }
    }
    assert_eq!(filtered, 6, "quota of 3 × prompts_per_step");
    assert!(s.take_batch().is_none());
    assert_eq!(s.take_stats().filtered_groups, 6);
    // A new version brings a new quota.
    s.set_version(1);
    assert_eq!(s.prompts_wanted(), 2);
}

#[test]
fn without_the_filter_flat_groups_train() {
    let mut s = SampleScheduler::new(
        RolloutPolicy {
            filter_flat: false,
            ..policy(1, 0)
        },
        0,
    );
    let ids = fill(&mut s);
    finish(&mut s, ids[0], [0.5, 0.5]);
    assert_eq!(s.take_batch().expect("kept").len(), 1);
}

#[test]
fn asynchronous_rollout_runs_ahead_and_drops_what_is_too_stale() {
    let mut s = SampleScheduler::new(policy(1, 1), 0);
    let v0 = fill(&mut s);
    assert_eq!(v0.len(), 2, "α = 1 fills this step and the next");
    finish(&mut s, v0[0], [0.0, 1.0]);
    finish(&mut s, v0[1], [1.0, 0.0]);
    assert_eq!(s.take_batch().expect("v0 batch")[0].version, 0);
    // Version 1: the other v0 group is one version old, still usable.
    s.set_version(1);
    let v1 = fill(&mut s);
    assert_eq!(v1.len(), 1);
    let b = s.take_batch().expect("stale by one");
    assert_eq!(b[0].version, 0);
    let st = s.take_stats();
    assert_eq!(
        (st.staleness_max, st.batch_samples, st.staleness_sum),
        (1, 4, 2)
    );
    assert!((st.staleness_mean() - 0.5).abs() < 1e-12);
    // The v1 group is still in flight at version 3: it can never train, so it is aborted.
    assert_eq!(s.unfinished(v1[0]), [0, 1]);
    assert!(s.finish(v1[0], 0, 0, 1.0));
    assert_eq!(s.unfinished(v1[0]), [1]);
    s.set_version(2);
    let v2 = fill(&mut s);
    finish(&mut s, v2[0], [0.0, 1.0]);
    assert_eq!(s.set_version(3), vec![v1[0]]);
    let st = s.take_stats();
    assert_eq!(st.aborted_samples, 1);
    // A ready group that went stale while waiting is dropped and counted.
    s.set_version(5);
    assert!(s.take_batch().is_none());
    assert_eq!(s.take_stats().dropped_stale, 2);
}

#[test]
fn duplicates_and_unknown_samples_are_refused() {
    let mut s = SampleScheduler::new(policy(1, 0), 0);
    let id = fill(&mut s)[0];
    assert!(s.finish(id, 0, 1, 1.0));
    assert!(!s.finish(id, 0, 1, 1.0), "delivered twice");
    assert!(!s.finish(id, 5, 1, 1.0), "no such index");
    assert!(!s.finish(id + 100, 0, 1, 1.0), "no such group");
    assert!(s.finish(id, 1, 2, 0.0));
    assert_eq!(s.take_batch().expect("one group")[0].samples, [1, 2]);
}

#[test]
fn a_synchronous_batch_discards_the_complete_groups_beyond_it_as_surplus_not_stale() {
    let mut s = SampleScheduler::new(
        RolloutPolicy {
            oversample: 1.0,
            ..policy(1, 0)
        },
        0,
    );
    let ids = fill(&mut s);
    assert_eq!(ids.len(), 2);
    finish(&mut s, ids[0], [0.0, 1.0]);
    finish(&mut s, ids[1], [1.0, 0.0]);
    assert_eq!(s.take_batch().expect("one group")[0].id, ids[0]);
    assert!(s.abort_in_flight().is_empty());
    s.set_version(1);
    let st = s.take_stats();
    assert_eq!(
        (st.surplus_samples, st.dropped_stale, st.aborted_samples),
        (2, 0, 0)
    );
}
