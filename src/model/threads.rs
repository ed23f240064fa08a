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
