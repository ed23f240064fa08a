//! The settings of mimalloc, the global allocator of the `roll-tui` binary (and so of every worker
//! process) and of the benches: when freed memory goes back to the operating system.
//!
//! mimalloc gives freed memory back ("purges" it) a delay after the free, 1 s by default. A
//! training step frees its large activations and gradients and allocates them again seconds later
//! (the next step's forward pass, or the backward pass of the same step at a big model), so with
//! the default the kernel zeroes those pages again on every step: at the Qwen2.5-0.5B width that
//! was a third of forward+backward (benches/RESULTS.md). A process of ours keeps freed memory for
//! [`PURGE_DELAY_MS`] instead, and gives it all back at once when memory passes to another process
//! (a worker's offload, a role of a worker process coming in; [`release_freed_memory`]), so
//! colocated roles still get the memory the ledger promises. Roles in one process reuse what the
//! others freed as it is.
//!
//! Memory goes back "lazily" (`MADV_FREE`, mimalloc's reset; [`configure`]): the kernel takes the
//! pages only when some process needs them, and takes them without writing them anywhere, so they
//! count as available memory at once. Until then the process that gave them back reuses them
//! without a page fault. A worker process offloads and reloads every RL step: with the pages
//! unmapped at once (`MADV_DONTNEED`, mimalloc's default) its whole working set was faulted in and
//! zeroed again each step (benches/RESULTS.md's git history). The price is in what tools
//! show: a worker's RSS does not drop at its offload; the pages it gave back are its `LazyFree`
//! in `/proc/PID/smaps_rollup` until the kernel takes them.

use std::ffi::c_long;

/// How long freed memory is kept for reuse before it goes back to the OS, in milliseconds.
pub const PURGE_DELAY_MS: i64 = 60_000;

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_t` (include/mimalloc.h); the crate names
/// no constant for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// `mi_option_purge_decommits` in mimalloc v3's `mi_option_t`; the crate names no constant for it.
const MI_OPTION_PURGE_DECOMMITS: libmimalloc_sys::mi_option_t = 5;

/// Set the purge delay to [`PURGE_DELAY_MS`] and purges to give memory back lazily
/// ([`set_lazy_purge`]), each unless the environment sets it (`MIMALLOC_PURGE_DELAY`,
/// `MIMALLOC_PURGE_DECOMMITS`, read by mimalloc itself). Call first thing in `main`; worker
/// processes are the same binary.
pub fn configure() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        set_purge_delay(PURGE_DELAY_MS);
    }
    if std::env::var_os("MIMALLOC_PURGE_DECOMMITS").is_none() {
        set_lazy_purge(true);
    }
}

/// Whether a purge gives pages back lazily (`MADV_FREE`: the kernel takes them when memory is
/// needed, and until then the process reuses them without a fault) or at once (`MADV_DONTNEED`).
#[allow(unsafe_code)] // one call into mimalloc's C API
pub fn set_lazy_purge(lazy: bool) {
    // SAFETY: as in `set_purge_delay`: a store into mimalloc's option table.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DECOMMITS, c_long::from(!lazy)) };
}

/// The purge delay in milliseconds; negative: never purge (then [`release_freed_memory`] cannot
/// give memory back either).
#[allow(unsafe_code)] // one call into mimalloc's C API
pub fn set_purge_delay(ms: i64) {
    // SAFETY: mi_option_set only stores the value in mimalloc's option table, which its own
    // readers load atomically; any thread may call it at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ms as c_long) };
}

/// The purge delay mimalloc uses now.
#[allow(unsafe_code)] // one call into mimalloc's C API
pub fn purge_delay() -> i64 {
    // SAFETY: reads mimalloc's option table; safe from any thread.
    unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) as i64 }
}

/// Give every freed block of mimalloc's arenas back to the OS now, whichever thread freed it:
/// after an offload, so that the memory the role let go of is free for the role that comes in.
#[allow(unsafe_code)] // one call into mimalloc's C API
pub fn release_freed_memory() {
    // SAFETY: mi_collect(true) collects the calling thread's heap and forces a purge of every
    // arena (program wide); it takes mimalloc's own locks and touches no memory still in use.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's resident memory and the part of it given back lazily, in bytes (Linux).
    fn rss_and_lazy_free() -> (usize, usize) {
        let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
        let kb = |field: &str| -> usize {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or_else(|| panic!("{field} in smaps_rollup"))
        };
        (kb("Rss:") * 1024, kb("LazyFree:") * 1024)
    }

    /// Resident memory the kernel cannot take back without asking: RSS less `LazyFree`.
    fn held() -> usize {
        let (rss, lazy) = rss_and_lazy_free();
        rss - lazy
    }

    /// Allocate `bytes` from mimalloc on another thread (as rayon's threads allocate tensors),
    /// touch every page, and free it there.
    #[allow(unsafe_code)]
    fn churn_on_another_thread(bytes: usize) {
        std::thread::spawn(move || {
            // SAFETY: a fresh block of `bytes` bytes, written within bounds, freed once.
            unsafe {
                let p = libmimalloc_sys::mi_malloc(bytes) as *mut u8;
                assert!(!p.is_null());
                for i in (0..bytes).step_by(4096) {
                    p.add(i).write(1);
                }
                libmimalloc_sys::mi_free(p.cast());
            }
        })
        .join()
        .expect("thread");
    }

    // The test binary's own allocator is the system's; mimalloc is called directly, so this
    // checks the library the binary allocates with.
    #[test]
    #[allow(unsafe_code)]
    fn freed_memory_is_kept_for_reuse_and_given_back_on_release() {
        const MB: usize = 1 << 20;
        // mi_collect works through the calling thread's heap, which exists once the thread has
        // allocated from mimalloc: in the binary every thread has; here, not yet.
        // SAFETY: a fresh 16-byte block freed once.
        unsafe { libmimalloc_sys::mi_free(libmimalloc_sys::mi_malloc(16)) };
        // What `configure` sets when the environment gives no delay (the test does not depend
        // on the environment it runs in).
        set_purge_delay(PURGE_DELAY_MS);
        assert_eq!(purge_delay(), PURGE_DELAY_MS);
        // Both ways of giving memory back, as `configure` sets (lazily) and as mimalloc's own
        // default (at once): the memory is kept, then given back either way.
        for lazy in [true, false] {
            set_lazy_purge(lazy);
            let before = held();
            churn_on_another_thread(384 * MB);
            let kept = held();
            // Freed but kept: the next step would reuse it without the kernel zeroing it again.
            assert!(
                kept > before + 300 * MB,
                "lazy {lazy}: freed memory was kept: {} MB before, {} MB after",
                before / MB,
                kept / MB
            );
            release_freed_memory();
            let (rss, lazy_free) = rss_and_lazy_free();
            assert!(
                rss - lazy_free < kept - 300 * MB,
                "lazy {lazy}: released: {} MB kept, {} MB after the release",
                kept / MB,
                (rss - lazy_free) / MB
            );
            // Lazily: still resident, but the kernel's to take (given back at once: gone).
            assert_eq!(
                lazy_free > 300 * MB,
                lazy,
                "lazy {lazy}: {} MB resident, {} MB of it lazily freed",
                rss / MB,
                lazy_free / MB
            );
        }
    }
}
