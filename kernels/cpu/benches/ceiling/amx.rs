//! `amx`: the rate of Intel AMX's bf16 tile products (`TDPBF16PS`) on one core, where the CPU and
//! the kernel allow them, beside the f32 fused multiply-adds of `fma` in the same process: whether
//! the matrix units could carry the engine's f32 products.
//!
//! They would have to keep f32's accuracy. A bf16 keeps 8 of an f32's 24 significant bits, so an
//! f32 is split into three bf16 parts, `x = hi + mid + lo` (each the bf16 nearest to what the parts
//! before it leave), and a product `x y` needs the six part products down to 2^-16 of `hi y_hi`
//! (hi hi, hi mid, mid hi, hi lo, lo hi, mid mid; the three left out are below 2^-24, an f32
//! rounding): six tile products for each f32 one, before the splitting and the tiles' layouts
//! (benches/RESULTS.md's git history). Products of two bf16 values are exact in f32, and
//! the tiles sum them in f32.
//!
//! The probe: four 16 x 16 f32 accumulators, each summing a 16 x 32 bf16 tile times a 32 x 16 one
//! per step (the 2 x 2 block of a 32 x 32 microkernel, two tiles of each factor), 8,192
//! multiply-adds an instruction; the accumulators' sums are checked against the arithmetic.
//! Linux on x86-64 only (the tiles' state must be requested from the kernel with `arch_prctl`).

/// One probe: the AMX rate in bf16 multiply-adds per second, or why there is none.
pub fn bf16_tile_rate(least: impl Fn(&mut dyn FnMut()) -> f64) -> Result<f64, String> {
    imp::rate(least)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)] // the arch_prctl system call and the tile instructions
mod imp {
    use std::arch::asm;
    use std::arch::x86_64::{__cpuid, __cpuid_count};

    /// Steps of one timed run: 4 x 8,192 multiply-adds each, ~0.1 s at 500 G a second.
    const STEPS: u64 = 2_000_000;

    /// The tile configuration `LDTILECFG` reads: palette 1, every tile 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        bytes_per_row: [u16; 16],
        rows: [u8; 16],
    }

    /// Whether CPUID reports AMX's tiles and bf16 products (leaf 7, EDX bits 24 and 22).
    fn cpu_has_amx_bf16() -> bool {
        // Past the highest leaf, Intel's CPUs answer with the highest leaf's data: ask first.
        if __cpuid(0).eax < 7 {
            return false;
        }
        let leaf7 = __cpuid_count(7, 0);
        leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 22) != 0
    }

    /// Asks Linux for the tiles' register state (`ARCH_REQ_XCOMP_PERM` for `XFEATURE_XTILEDATA`),
    /// which a process must hold before its first tile instruction; 0 when granted, else -errno.
    fn request_tile_state() -> i64 {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
        const XFEATURE_XTILEDATA: u64 = 18;
        let ret: i64;
        // SAFETY: arch_prctl takes two integers here and changes only this process's
        // permissions; the syscall instruction clobbers rcx and r11.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    /// `steps` steps of the four accumulators from zero on bf16 tiles of ones, then the first
    /// accumulator's 256 sums (each should be 32 x steps).
    fn run(steps: u64, ones: &[u16; 512], out: &mut [f32; 256]) {
        let mut config = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            config.bytes_per_row[t] = 64;
            config.rows[t] = 16;
        }
        // SAFETY: the process holds the tile state (`rate` requested it); the configuration is
        // a valid palette-1 one; the loads read 16 rows of 64 bytes from `ones` (1,024 bytes)
        // and the store writes 16 rows of 64 bytes into `out` (1,024 bytes); `steps` > 0. The
        // tiles are released before returning, so no tile state outlives the call.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "tileloadd tmm4, [{a} + {stride}*1]",
                "tileloadd tmm5, [{a} + {stride}*1]",
                "tileloadd tmm6, [{a} + {stride}*1]",
                "tileloadd tmm7, [{a} + {stride}*1]",
                "2:",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "dec {n}",
                "jnz 2b",
                "tilestored [{out} + {stride}*1], tmm0",
                "tilerelease",
                a = in(reg) ones.as_ptr(),
                out = in(reg) out.as_mut_ptr(),
                stride = in(reg) 64usize,
                n = inout(reg) steps => _,
                options(nostack),
            );
        }
    }

    pub fn rate(least: impl Fn(&mut dyn FnMut()) -> f64) -> Result<f64, String> {
        if !cpu_has_amx_bf16() {
            return Err("this CPU has no AMX bf16 tiles".into());
        }
        let granted = request_tile_state();
        if granted != 0 {
            return Err(format!(
                "Linux did not grant the tile state (arch_prctl: error {})",
                -granted
            ));
        }
        const BF16_ONE: u16 = 0x3f80;
        let ones = [BF16_ONE; 512];
        let mut out = [0f32; 256];
        // A check of the arithmetic first: 3 steps of 32 ones times ones.
        run(3, &ones, &mut out);
        if let Some(bad) = out.iter().find(|&&v| v != 96.0) {
            return Err(format!("the tile products summed to {bad}, not 96"));
        }
        let secs = least(&mut || run(STEPS, &ones, &mut out));
        Ok((STEPS * 4 * 16 * 16 * 32) as f64 / secs)
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    pub fn rate(_: impl Fn(&mut dyn FnMut()) -> f64) -> Result<f64, String> {
        Err("the probe runs on Linux on x86-64 only".into())
    }
}
