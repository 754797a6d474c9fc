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

    #[inline(always)]
    unsafe fn exponentiate(
        scores: &[f32],
        visible: usize,
        old_max: f32,
        weights: &mut [Bf16],
    ) -> (f32, f32) {
        // SAFETY: forwarded from the caller.
        unsafe { exponentiate_row(scores, visible, old_max, weights) }
    }
}

/// Vectors of 16 float32 in a row of a block.
const VECTORS: usize = BLOCK_KEYS / 16;

/// See `Micro::exponentiate`: masked loads leave the invisible keys at -inf and their terms
/// are zeroed; `vcvtneps2bf16` rounds the terms to bf16 (to nearest even, as `Bf16::from_f32`).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn exponentiate_row(
    scores: &[f32],
    visible: usize,
    old_max: f32,
    weights: &mut [Bf16],
) -> (f32, f32) {
    let masks: [__mmask16; VECTORS] = std::array::from_fn(|i| {
        let lanes = visible.saturating_sub(16 * i).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    });
    let below = _mm512_set1_ps(f32::NEG_INFINITY);
    // SAFETY: the caller promises `scores` of BLOCK_KEYS floats: 16 at each 16 * i.
    let x: [__m512; VECTORS] = std::array::from_fn(|i| unsafe {
        _mm512_mask_loadu_ps(below, masks[i], scores.as_ptr().add(16 * i))
    });
    let top = x.iter().fold(below, |m, &v| _mm512_max_ps(m, v));
    let block_max = _mm512_reduce_max_ps(top);
    let max = if old_max > block_max {
        old_max
    } else {
        block_max
    };
    let shift = _mm512_set1_ps(max);
    let mut sum = _mm512_setzero_ps();
    for (i, (&v, &mask)) in x.iter().zip(&masks).enumerate() {
        let e = _mm512_maskz_mov_ps(mask, exp(_mm512_sub_ps(v, shift)));
        sum = _mm512_add_ps(sum, e);
        // SAFETY: __m256bh is 16 bf16 lanes, 256 bits of plain data, as __m256i.
        let rounded = unsafe { std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(e)) };
        // SAFETY: the caller promises `weights` of BLOCK_KEYS: 16 at 16 * i.
        unsafe { _mm256_storeu_si256(weights.as_mut_ptr().add(16 * i).cast(), rounded) };
    }
    (max, _mm512_reduce_add_ps(sum))
}

/// `e^x` per lane for `x <= 0`, the arithmetic of `exp_nonpositive` (Cephes' `expf`) with
/// `2^n` applied by `vscalefps`; lanes below -87 give about e^-87 (callers zero the masked
/// ones; a visible score that far below the maximum weighs nothing in bf16 either way).
#[target_feature(enable = "avx512f")]
#[inline]
fn exp(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let mantissa = _mm512_fmadd_ps(
        p,
        _mm512_mul_ps(r, r),
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    _mm512_scalef_ps(mantissa, n)
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
