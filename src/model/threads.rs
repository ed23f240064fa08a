//! The thread settings candle's CPU backend reads from the environment, and the values a process
//! of ours should start with when the user gave none.
//!
//! Both only take effect through the environment, which a program may only change before it starts
//! any thread: the binary and the engine bench apply [`env_defaults`] first thing in `main`.
//!
//! - `RAYON_NUM_THREADS`: candle sizes every matrix product's parallelism by it. Unset, it asks
//!   `num_cpus::get_physical()` on every product, which parses `/proc/cpuinfo` each time: at
//!   decode shapes that was a third of the time (generation 1.4-1.6x faster with it set,
//!   benches/RESULTS.md). Worker processes get theirs from `workers.<role>.threads`.
//! - `CANDLE_NUM_THREADS`: the size of candle's pool for elementwise ops of 64k elements or more,
//!   whose extra threads spin for their next job and take a core from the matrix products and our
//!   kernels (which use rayon). 1 runs those ops on the calling thread (forward+backward 1.1-1.2x).

use super::packing;

/// `(variable, value)` for each setting the environment does not already have.
pub fn env_defaults() -> Vec<(&'static str, String)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    [
        ("RAYON_NUM_THREADS", cores.to_string()),
        ("CANDLE_NUM_THREADS", "1".to_string()),
    ]
    .into_iter()
    .filter(|(key, _)| std::env::var_os(key).is_none())
    .collect()
}

/// Models up to this size (their weights' bytes) split their batches into lanes.
///
/// Measured (benches/RESULTS.md, 2 cores): at the tiny shape (4 MB of weights) two lanes decode
/// 1.6-2.3x and train 1.5-1.9x faster than one lane whose matrix products each use both cores;
/// each product there is too small to split well, and the cores spent their time waking each
/// other. At the Qwen2.5-0.5B width (4 of its layers, 0.8 GB) two lanes decode 0.73x as fast
/// (every lane reads all the weights at each step; 0.51x the whole model since one lane's 16 rows
/// fill one AVX-512 block of the streamed product) and train 1.3x faster but at 1.5x the peak
/// memory (each lane holds gradients of its own): big models stay in one lane.
pub const LANE_MAX_WEIGHT_BYTES: usize = 256 << 20;

/// How many lanes (parts of a batch worked on side by side, one per thread) a model whose weights
/// take `weight_bytes` gets: the threads of the pool for a small model, else 1. `ROLL_LANES`
/// overrides it (benchmarks compare the two).
pub fn lanes(weight_bytes: usize) -> usize {
    if let Some(n) = std::env::var("ROLL_LANES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    if weight_bytes <= LANE_MAX_WEIGHT_BYTES {
        rayon::current_num_threads()
    } else {
        1
    }
}

/// The rows of a batch (`lens[i]`: row i's prompt and response lengths) as training and scoring
/// take them: ordered by length (shortest first, rows of one length in their order) and cut into
/// micro-batches of `micro` rows, so that rows of about one length are packed together, each
/// micro-batch cut into lanes by [`lane_rows`]. Each part lists its rows' positions in
/// `lens`.
pub fn micro_batches_in_lanes(
    lens: &[(usize, usize)],
    micro: usize,
    lanes: usize,
) -> Vec<Vec<Vec<usize>>> {
    by_length(lens)
        .chunks(micro.max(1))
        .map(|rows| {
            let rows_lens: Vec<(usize, usize)> = rows.iter().map(|&i| lens[i]).collect();
            lane_rows(&rows_lens, lanes)
                .into_iter()
                .map(|part| part.into_iter().map(|k| rows[k]).collect())
                .collect()
        })
        .collect()
}

/// The positions of `lens` ordered by length (prompt + response), shortest first, rows of one
/// length in their order.
fn by_length(lens: &[(usize, usize)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| (lens[i].0 + lens[i].1, i));
    order
}

/// The rows of a batch (`lens[i]`: row i's prompt and response lengths) cut into at most `lanes`
/// parts worked on side by side: each part lists its rows' positions in `lens`.
///
/// A part is a training batch whose sequences (prompt + response - 1 tokens each) are packed
/// ([`packing::pack`]): it costs its packed rows times their width, and the lanes finish when the
/// costliest part does. Two cuts are weighed and the cheaper kept (by the costliest part, then by
/// all parts together; the first on a tie):
/// - the rows ordered by length and cut where the costliest part is cheapest, a part's cost taken
///   as its tokens rounded up to whole rows of its width: a part of long rows gets fewer of them,
///   and short rows are not packed into rows as wide as the longest;
/// - the whole batch packed, its packed rows dealt out in runs of one count: short sequences fill
///   the room beside long ones.
///
/// Rows of one length are cut into parts of one size (the last may be shorter), in order.
/// Deterministic: the cut depends only on the lengths.
pub fn lane_rows(lens: &[(usize, usize)], lanes: usize) -> Vec<Vec<usize>> {
    let n = lens.len();
    if n == 0 {
        return vec![];
    }
    let seq: Vec<usize> = lens.iter().map(|&(p, r)| (p + r).max(1) - 1).collect();
    let by_length = cut_by_length(&seq, &by_length(lens), lanes.clamp(1, n));
    let all = packing::pack(&seq);
    let per = all.rows.len().div_ceil(lanes.max(1));
    let dealt: Vec<Vec<usize>> = all.rows.chunks(per).map(|run| run.concat()).collect();
    let cost = |parts: &[Vec<usize>]| {
        let costs = parts.iter().map(|part| {
            let lens: Vec<usize> = part.iter().map(|&i| seq[i]).collect();
            let packed = packing::pack(&lens);
            packed.rows.len() * packed.width
        });
        costs.fold((0, 0), |(max, sum), c| (max.max(c), sum + c))
    };
    if cost(&dealt) < cost(&by_length) {
        dealt
    } else {
        by_length
    }
}

/// The rows of sequence lengths `seq`, in `order` (by length, shortest first), cut into `parts`
/// runs where the costliest run is cheapest, a run costing its tokens rounded up to whole rows of
/// its longest.
fn cut_by_length(seq: &[usize], order: &[usize], parts: usize) -> Vec<Vec<usize>> {
    let n = seq.len();
    // worst[l][j]: the cheapest costliest part of order[..j] cut into l + 1 parts; cut[l][j]
    // where its last part starts.
    let mut worst = vec![vec![usize::MAX; n + 1]; parts];
    let mut cut = vec![vec![0; n + 1]; parts];
    for l in 0..parts {
        for j in l + 1..=n {
            let (mut width, mut tokens) = (0, 0);
            // The last part is order[i..j], longest first, so its width grows as i falls.
            for i in (l..j).rev() {
                width = width.max(seq[order[i]]);
                tokens += seq[order[i]];
                let cost = tokens.div_ceil(width.max(1)) * width;
                let before = if l == 0 {
                    if i > 0 {
                        continue;
                    }
                    0
                } else {
                    worst[l - 1][i]
                };
                let candidate = cost.max(before);
                if candidate < worst[l][j] {
                    worst[l][j] = candidate;
                    cut[l][j] = i;
                }
            }
        }
    }
    let mut out = vec![vec![]; parts];
    let mut end = n;
    for l in (0..parts).rev() {
        let start = cut[l][end];
        out[l] = order[start..end].to_vec();
        end = start;
    }
    out
}

/// Runs `f` on one of rayon's threads (inline if this is one). A loop of parallel work driven from
/// a thread outside the pool hands each piece to the pool's threads and sleeps until they are
/// done, a wake-up each way every time; on a pool thread the loop runs its share itself, and the
/// other threads, still looking for work from the piece before, take the next one's at once. For
/// loops of compute only: a pool thread that blocks (on a channel, a pipe) is one fewer for
/// every parallel op of the process.
pub fn on_the_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// `f` over `items`, side by side on the pool's threads when there are several, else on one of
/// them ([`on_the_pool`]); results in `items`' order. Each call's own parallel ops stay mostly on
/// its thread (rayon runs the parts it splits off itself unless another thread is idle), so lanes
/// do not fight over the cores.
pub fn side_by_side<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    if items.len() > 1 {
        use rayon::prelude::*;
        items.par_iter().map(f).collect()
    } else {
        on_the_pool(|| items.iter().map(f).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_the_pool_runs_on_a_pool_thread_from_outside_and_inline_from_inside() {
        // From a thread of its own (as `generate`'s callers are): on one of rayon's threads.
        let outside = std::thread::spawn(|| on_the_pool(rayon::current_thread_index))
            .join()
            .expect("thread");
        assert!(outside.is_some(), "ran outside the pool");
        // From a pool thread: on that same thread, not handed to another.
        let (caller, ran) = rayon::scope(|_| {
            (
                rayon::current_thread_index(),
                on_the_pool(rayon::current_thread_index),
            )
        });
        assert_eq!(caller, ran);
    }

    #[test]
    fn rows_of_one_length_are_cut_into_parts_of_one_size_in_order() {
        let parts = |n: usize, lanes: usize| lane_rows(&vec![(3, 5); n], lanes);
        assert_eq!(parts(5, 2), [vec![0, 1, 2], vec![3, 4]]);
        let sizes: Vec<usize> = parts(8, 3).iter().map(Vec::len).collect();
        assert_eq!(sizes, [3, 3, 2]);
        assert_eq!(parts(2, 4), [vec![0], vec![1]]);
        assert_eq!(parts(4, 0), [vec![0, 1, 2, 3]]);
        assert!(parts(0, 2).is_empty());
    }

    /// Rows of lengths (prompt + response) 10, 40, 10, 10, 40, 10 in two lanes. Cut in
    /// consecutive halves, each part pads to 5 + 35 = 40: cost 3 x 40 = 120. Ordered by length
    /// (rows 0, 2, 3, 5, 1, 4), the cut after the four short rows costs max(4 x (3 + 8),
    /// 2 x 40) = 80, the cheapest: after three, max(3 x 11, 3 x 40) = 120; after five,
    /// max(5 x 40, 40) = 200; after one, max(10, 5 x 40) = 200.
    /// Lengths 9, 3, 7, 3, 5 in micro-batches of 2 and one lane: by length, rows 1, 3 (3 and
    /// 3), then 4, 2 (5 and 7), then 0 (9); in two lanes each pair is cut in two.
    #[test]
    fn micro_batches_take_rows_of_about_one_length() {
        let lens = [(4, 5), (1, 2), (3, 4), (2, 1), (2, 3)];
        assert_eq!(
            micro_batches_in_lanes(&lens, 2, 1),
            [vec![vec![1, 3]], vec![vec![4, 2]], vec![vec![0]]]
        );
        assert_eq!(
            micro_batches_in_lanes(&lens, 2, 2),
            [
                vec![vec![1], vec![3]],
                vec![vec![4], vec![2]],
                vec![vec![0]]
            ]
        );
    }

    /// Sequences (prompt + response - 1) of 4, 6, 5 in two lanes. By length (rows 0, 2, 1): after
    /// two rows, 4 + 5 tokens in rows of 5 (2 x 5 = 10) beside 6; after one, 4 beside 5 + 6 in
    /// rows of 6 (12): cut after two, costing 10 packed exactly. The whole batch packed in rows of
    /// 6 is one row each (6, 5, 4), dealt two and one: 2 x 6 = 12. The cut by length is kept.
    #[test]
    fn long_rows_get_a_lane_of_fewer_rows() {
        let lens = [(1, 4), (1, 6), (1, 5)];
        assert_eq!(lane_rows(&lens, 2), [vec![0, 2], vec![1]]);
    }

    /// Sequences of 2, 2, 3, 2, 5 in two lanes. By length (rows 0, 1, 3, 2, 4) the estimate cuts
    /// before row 4 (9 tokens in rows of 3: 9, beside 5; before row 2 it is 6 beside 2 x 5), but
    /// packed exactly 3, 2, 2, 2 in rows of 3 take four rows: 12. The whole batch packed in rows
    /// of 5: row 4 (5), row 2 then row 0 (3 + 2), rows 1 and 3 (2 + 2); dealt two rows and one,
    /// 5 + 3 + 2 in rows of 5 take two (10) and 2 + 2 in rows of 2 take two (4): the cheaper.
    #[test]
    fn short_rows_fill_the_room_beside_long_ones() {
        let lens = [(1, 2), (1, 2), (1, 3), (1, 2), (1, 5)];
        assert_eq!(lane_rows(&lens, 2), [vec![4, 2, 0], vec![1, 3]]);
        // Every row in exactly one part, whatever the lanes.
        for lanes in 1..=7 {
            let mut all: Vec<usize> = lane_rows(&lens, lanes).concat();
            all.sort();
            assert_eq!(all, [0, 1, 2, 3, 4]);
        }
    }
}
