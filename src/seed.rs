//! Seeds derived from seeds, shared by the data order and every pipeline's random choices.

/// Deterministic 64-bit mix of several values (splitmix64 finaliser), for per-step and per-sample
/// seeds: every random choice is a function of (run seed, stage, step, index), never of timing.
pub fn mix_seed(parts: &[u64]) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for &p in parts {
        h ^= p
            .wrapping_add(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(h << 6)
            .wrapping_add(h >> 2);
        let mut z = h;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h = z ^ (z >> 31);
    }
    h
}

/// FNV-1a, 64 bit: a hash that is stable across Rust versions (unlike `DefaultHasher`), for
/// fingerprints and seeds derived from names.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
