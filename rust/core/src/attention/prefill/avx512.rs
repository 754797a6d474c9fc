//! The two products of a tile in `vdpbf16ps` (AVX-512 BF16), and the task body compiled for
//! that tier. A tile of up to `TILE_ROWS` rows keeps its sums in registers: two vectors per
//! row (32 keys of scores, or a 32-column slice of the weighted sum), 16 of the 32 registers.

use std::arch::x86_64::*;

use super::kernels::Micro;
use super::{Scratch, Task, BLOCK_KEYS};
use crate::element::Bf16;

/// Runs task (`kv_head`, `block`) with these products.
///
/// # Safety
/// As `Task::run`; the CPU has AVX-512 F, BW and BF16.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn run(task: &Task<'_>, kv_head: usize, block: usize, scratch: &mut Scratch) {
    // SAFETY: forwarded from the caller; this copy is compiled for AVX-512 BF16.
    unsafe { task.run_with::<Avx512Bf16>(kv_head, block, scratch) }
}

struct Avx512Bf16;

/// The 32 bf16 lanes of a vector of 16 pairs.
#[inline(always)]
fn bf16_lanes(pairs: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data; the pairs' bits are the bf16 lanes.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(pairs) }
}

/// Calls `$kernel::<N>` for the tile's row count `$n` (1 to 8).
macro_rules! by_rows {
    ($n:expr, $kernel:ident, $($arg:expr),*) => {
        match $n {
            8 => $kernel::<8>($($arg),*),
            7 => $kernel::<7>($($arg),*),
            6 => $kernel::<6>($($arg),*),
            5 => $kernel::<5>($($arg),*),
            4 => $kernel::<4>($($arg),*),
            3 => $kernel::<3>($($arg),*),
            2 => $kernel::<2>($($arg),*),
            1 => $kernel::<1>($($arg),*),
            _ => {}
        }
    };
}

impl Micro for Avx512Bf16 {
    #[inline(always)]
    unsafe fn scores(
        q: &[Bf16],
        tile: &[usize],
        d: usize,
        keys: &[u32],
        scale: f32,
        scores: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller (sizes, and the CPU's AVX-512 BF16).
        unsafe { by_rows!(tile.len(), scores_tile, q, tile, d, keys, scale, scores) }
    }

    #[inline(always)]
    unsafe fn weighted_sum(weights: &[Bf16], values: &[u32], d: usize, acc: &mut [f32]) {
        // SAFETY: as above.
        unsafe { by_rows!(acc.len() / d, weighted_tile, weights, values, d, acc) }
    }
}

/// `scores` of `N` rows, 32 keys at a time; see `Micro::scores`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn scores_tile<const N: usize>(
    q: &[Bf16],
    tile: &[usize],
    d: usize,
    keys: &[u32],
    scale: f32,
    scores: &mut [f32],
) {
    // The caller promises `tile[i] + d` within `q`, `keys` of `d / 2` pair rows of
    // BLOCK_KEYS, and `scores` of N rows of BLOCK_KEYS: every pointer below stays inside them.
    let queries: [*const i32; N] = std::array::from_fn(|i| q.as_ptr().wrapping_add(tile[i]).cast());
    let scale = _mm512_set1_ps(scale);
    for k0 in (0..BLOCK_KEYS).step_by(32) {
        let mut acc = [[_mm512_setzero_ps(); 2]; N];
        for p in 0..d / 2 {
            let row = keys
                .as_ptr()
                .wrapping_add(p * BLOCK_KEYS + k0)
                .cast::<__m512i>();
            // SAFETY: 32 pairs of the block's pair row p, inside `keys`.
            let (key0, key1) = unsafe { (_mm512_loadu_si512(row), _mm512_loadu_si512(row.add(1))) };
            let (key0, key1) = (bf16_lanes(key0), bf16_lanes(key1));
            for (sums, query) in acc.iter_mut().zip(queries) {
                // SAFETY: pair p of a query of `d` elements (read unaligned).
                let pair = unsafe { query.add(p).read_unaligned() };
                let pair = bf16_lanes(_mm512_set1_epi32(pair));
                sums[0] = _mm512_dpbf16_ps(sums[0], pair, key0);
                sums[1] = _mm512_dpbf16_ps(sums[1], pair, key1);
            }
        }
        for (i, sums) in acc.iter().enumerate() {
            let out = scores.as_mut_ptr().wrapping_add(i * BLOCK_KEYS + k0);
            // SAFETY: 32 scores of row i, inside `scores`.
            unsafe {
                _mm512_storeu_ps(out, _mm512_mul_ps(sums[0], scale));
                _mm512_storeu_ps(out.add(16), _mm512_mul_ps(sums[1], scale));
            }
        }
    }
}

/// `weighted_sum` of `N` rows, 32 columns at a time; see `Micro::weighted_sum`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn weighted_tile<const N: usize>(
    weights: &[Bf16],
    values: &[u32],
    d: usize,
    acc: &mut [f32],
) {
    // The caller promises `weights` of N rows of BLOCK_KEYS, `acc` of N rows of `d` (a
    // multiple of 32), `values` of BLOCK_KEYS / 2 pair rows of `d`: every pointer below stays
    // inside them.
    let rows: [*const i32; N] =
        std::array::from_fn(|i| weights.as_ptr().wrapping_add(i * BLOCK_KEYS).cast());
    for c0 in (0..d).step_by(32) {
        let out: [*mut f32; N] = std::array::from_fn(|i| acc.as_mut_ptr().wrapping_add(i * d + c0));
        // SAFETY: 32 sums of row i, inside `acc`.
        let mut sums: [[__m512; 2]; N] = std::array::from_fn(|i| unsafe {
            [_mm512_loadu_ps(out[i]), _mm512_loadu_ps(out[i].add(16))]
        });
        for jp in 0..BLOCK_KEYS / 2 {
            let row = values.as_ptr().wrapping_add(jp * d + c0).cast::<__m512i>();
            // SAFETY: 32 columns of the block's pair row jp, inside `values`.
            let (v0, v1) = unsafe { (_mm512_loadu_si512(row), _mm512_loadu_si512(row.add(1))) };
            let (v0, v1) = (bf16_lanes(v0), bf16_lanes(v1));
            for (s, row) in sums.iter_mut().zip(rows) {
                // SAFETY: weights 2jp and 2jp + 1 of a row of BLOCK_KEYS (read unaligned).
                let pair = unsafe { row.add(jp).read_unaligned() };
                let pair = bf16_lanes(_mm512_set1_epi32(pair));
                s[0] = _mm512_dpbf16_ps(s[0], pair, v0);
                s[1] = _mm512_dpbf16_ps(s[1], pair, v1);
            }
        }
        for (s, o) in sums.iter().zip(out) {
            // SAFETY: as the loads above.
            unsafe {
                _mm512_storeu_ps(o, s[0]);
                _mm512_storeu_ps(o.add(16), s[1]);
            }
        }
    }
}
