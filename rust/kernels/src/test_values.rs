//! Deterministic float inputs for the kernels' unit tests.

/// `len` values in [-1, 1) from a 64-bit LCG seeded with `seed`.
pub(crate) fn values(len: usize, seed: u64) -> Vec<f32> {
    let step = |s: u64| {
        s.wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
    };
    let mut state = step(seed);
    (0..len)
        .map(|_| {
            state = step(state);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
