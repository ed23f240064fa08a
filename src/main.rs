//! The `roll-tui` binary: parses the command line and hands over to `roll::cli`.

use clap::Parser;

// mimalloc keeps freed tensor buffers for reuse instead of handing large ones back to the kernel
// (glibc's mmap threshold), which spared the engine page faults on every step: forward+backward
// 1.35-1.6x faster, generation 1.2-1.3x, for 5-10% more peak memory (benches/RESULTS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[allow(unsafe_code)] // setting the environment before any thread exists; see below
fn main() {
    for (key, value) in roll::model::threads::env_defaults() {
        // SAFETY: nothing has started a thread yet (this is main's first statement), so no other
        // thread can be reading the environment while it changes.
        unsafe { std::env::set_var(key, value) };
    }
    roll::allocator::configure();
    roll::cli::exit_quietly_when_output_closes();
    // Before any model exists: `ROLL_KERNELS=generic` runs the device-generic path on the CPU.
    if let Err(e) = roll::device::use_kernels_from_env() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let cli = roll::cli::Cli::parse();
    match roll::cli::main_with(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) if roll::cli::is_closed_output(&e) => std::process::exit(0),
        Err(e) => {
            eprintln!("error: {}", roll::cli::error_text(&e));
            std::process::exit(1);
        }
    }
}
