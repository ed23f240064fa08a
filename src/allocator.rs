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

use std::ffi::c_long;

/// How long freed memory is kept for reuse before it goes back to the OS, in milliseconds.
pub const PURGE_DELAY_MS: i64 = 60_000;

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_t` (include/mimalloc.h); the crate names
/// no constant for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Set the purge delay to [`PURGE_DELAY_MS`], unless `MIMALLOC_PURGE_DELAY` gives one (read by
/// mimalloc itself). Call first thing in `main`; worker processes are the same binary.
pub fn configure() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        set_purge_delay(PURGE_DELAY_MS);
    }
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

    /// This process's resident memory in bytes (Linux).
    fn rss() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
        let pages: usize = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .expect("resident pages");
        pages * 4096
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
        let before = rss();
        churn_on_another_thread(384 * MB);
        let kept = rss();
        // Freed but kept: the next step would reuse it without the kernel zeroing it again.
        assert!(
            kept > before + 300 * MB,
            "freed memory was kept: {} MB before, {} MB after",
            before / MB,
            kept / MB
        );
        release_freed_memory();
        let released = rss();
        assert!(
            released < kept - 300 * MB,
            "released: {} MB kept, {} MB after the release",
            kept / MB,
            released / MB
        );
    }
}
