//! Group filters for dynamic sampling: a prompt whose samples all got the same reward has zero
//! group-relative advantage and teaches nothing, so it is dropped and more prompts are sampled.

/// Two rewards closer than this count as equal for [`frac_zero_std`].
const ZERO_STD_EPS: f32 = 1e-6;

/// Indices of the groups (consecutive chunks of `group_size`; 0 is treated as 1) whose rewards are
/// not all equal, i.e. `max - min > eps`.
pub fn groups_with_signal(rewards: &[f32], group_size: usize, eps: f32) -> Vec<usize> {
    rewards
        .chunks(group_size.max(1))
        .enumerate()
        .filter(|(_, g)| {
            let max = g.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let min = g.iter().copied().fold(f32::INFINITY, f32::min);
            max - min > eps
        })
        .map(|(i, _)| i)
        .collect()
}

/// Fraction of groups whose rewards all agree (zero std); 0 for no rewards.
pub fn frac_zero_std(rewards: &[f32], group_size: usize) -> f32 {
    let n_groups = rewards.chunks(group_size.max(1)).count();
    if n_groups == 0 {
        return 0.0;
    }
    let with_signal = groups_with_signal(rewards, group_size, ZERO_STD_EPS).len();
    (n_groups - with_signal) as f32 / n_groups as f32
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;

    #[test]
    fn signal_groups_by_hand() {
        // Groups: [1, 1] flat, [0, 1] signal, [0.5, 0.5] flat, [0, 2] signal.
        let r = [1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.0, 2.0];
        assert_eq!(groups_with_signal(&r, 2, 1e-6), vec![1, 3]);
        // A spread of 1 is not above eps = 1, a spread of 2 is.
        assert_eq!(groups_with_signal(&r, 2, 1.0), vec![3]);
        // 2 of 4 groups are flat.
        assert!((frac_zero_std(&r, 2) - 0.5).abs() < 1e-6);
        assert_eq!(frac_zero_std(&[], 2), 0.0);
    }
}
