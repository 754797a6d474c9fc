//! The two products of a tile in `vdpbf16ps` (AVX-512 BF16), its online softmax step, and the
//! task body compiled for that tier. A tile of up to `TILE_ROWS` rows keeps its sums in
//! registers: two vectors per row (32 keys of scores, or a 32-column slice of the weighted
//! sum), 24 of the 32 registers, each pair of loaded vectors serving 24 products.

use std::arch::x86_64::*;

use super::kernels::{key_index, value_index, Micro, Rows, Tile, LANES, SLICE};
use super::{Scratch, Task, BLOCK_KEYS, MAX_TILE_ROWS, TILE_ROWS};
use crate::element::Bf16;
use crate::isa::Avx512Bf16;

/// Runs task (`kv_head`, `block`) with these products.
///
/// # Safety
/// As `Task::run`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn run(
    cpu: Avx512Bf16,
    task: &Task<'_>,
    kv_head: usize,
    block: usize,
    scratch: &mut Scratch,
) {
    // SAFETY: forwarded from the caller; this copy is compiled for AVX-512 BF16.
    unsafe { task.run_with(cpu, kv_head, block, scratch) }
}

/// The 32 bf16 lanes of a vector of 16 pairs.
#[inline(always)]
fn bf16_lanes(pairs: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data; the pairs' bits are the bf16 lanes.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(pairs) }
}

/// Calls `$kernel::<N>` for the tile's row count `$n` (1 to `TILE_ROWS`, 12).
macro_rules! by_rows {
    ($n:expr, $kernel:ident, $($arg:expr),*) => {
        match $n {
            12 => $kernel::<12>($($arg),*),
            11 => $kernel::<11>($($arg),*),
            10 => $kernel::<10>($($arg),*),
            9 => $kernel::<9>($($arg),*),
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
    const ROWS: usize = TILE_ROWS;

    #[inline(always)]
    unsafe fn scores(self, tile: Tile<'_>, scores: &mut [f32]) {
        // SAFETY: forwarded from the caller; `self` proves the CPU has AVX-512 BF16.
        unsafe { by_rows!(tile.queries.len(), scores_tile, self, tile, scores) }
    }

    #[inline(always)]
    unsafe fn softmax(self, tile: Tile<'_>, scores: &[f32], weights: &mut [Bf16], rows: Rows<'_>) {
        // SAFETY: forwarded from the caller.
        unsafe { softmax_tile(self, tile, scores, weights, rows) }
    }

    #[inline(always)]
    unsafe fn weighted_sum(self, tile: Tile<'_>, weights: &[Bf16], acc: &mut [f32]) {
        // SAFETY: as above.
        unsafe { by_rows!(tile.queries.len(), weighted_tile, self, tile, weights, acc) }
    }
}

/// The lanes of the first `visible - first` keys of a vector of 16 starting at key `first`.
#[inline(always)]
fn lanes(visible: usize, first: usize) -> __mmask16 {
    let count = visible.saturating_sub(first).min(16);
    ((1u32 << count) - 1) as __mmask16
}

// The corrections of a tile's rows are one vector of 16.
const _: () = assert!(MAX_TILE_ROWS <= 16);

/// See `Micro::softmax`. Each term is `2^t` with `t = raw · scale · log2(e) - max · log2(e)`
/// (one fused multiply-add; the block's maximum is its largest raw score times `scale`, or its
/// smallest for a negative `scale`: rounding keeps the order); masked loads and zero-masked results keep the invisible keys out, and
/// `vcvtne2ps2bf16` rounds two vectors of terms to bf16 at once (to nearest even, as
/// `Bf16::from_f32`). The corrections of the tile's rows are one vector of `2^t`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn softmax_tile(
    cpu: Avx512Bf16,
    tile: Tile<'_>,
    scores: &[f32],
    weights: &mut [Bf16],
    rows: Rows<'_>,
) {
    let Tile {
        visible,
        width,
        d,
        scale,
        ..
    } = tile;
    let Rows { max, sums, acc } = rows;
    let log2e = _mm512_set1_ps(std::f32::consts::LOG2_E);
    let below = _mm512_set1_ps(f32::NEG_INFINITY);
    let above = _mm512_set1_ps(f32::INFINITY);
    let factor = _mm512_set1_ps(scale * std::f32::consts::LOG2_E);
    let mut old_max = [0f32; 16];
    let mut new_max = [0f32; 16];
    // The caller promises rows of BLOCK_KEYS in `scores` and `weights`, `width` a multiple of
    // 32 within them, and `visible[r] <= width`: the masked loads below read only visible
    // scores, the stores write whole pairs of vectors below `width`.
    let row = |r: usize| scores.as_ptr().wrapping_add(r * BLOCK_KEYS);
    // Every row's maximum first, then every row's terms: the rows' chains of dependent steps
    // (a maximum's reduction, then its terms) overlap, where one row at a time would wait on
    // each. Two running maxima and sums a row halve the chains through them.
    let positive = scale >= 0.0;
    for (r, &seen) in visible.iter().enumerate() {
        let start = if positive { below } else { above };
        let mut top = [start; 2];
        for i in (0..width / 16).step_by(2) {
            for (k, top) in top.iter_mut().enumerate() {
                let mask = lanes(seen, 16 * (i + k));
                // SAFETY: as above.
                let x = unsafe { _mm512_maskz_loadu_ps(mask, row(r).add(16 * (i + k))) };
                *top = if positive {
                    _mm512_mask_max_ps(*top, mask, *top, x)
                } else {
                    _mm512_mask_min_ps(*top, mask, *top, x)
                };
            }
        }
        let block_max = if seen == 0 {
            f32::NEG_INFINITY
        } else if positive {
            _mm512_reduce_max_ps(_mm512_max_ps(top[0], top[1])) * scale
        } else {
            _mm512_reduce_min_ps(_mm512_min_ps(top[0], top[1])) * scale
        };
        let max_before = max[r];
        let row_max = if max_before > block_max {
            max_before
        } else {
            block_max
        };
        max[r] = row_max;
        (old_max[r], new_max[r]) = (max_before, row_max);
    }
    let mut block_sums = [_mm512_setzero_ps(); MAX_TILE_ROWS];
    for (r, &seen) in visible.iter().enumerate() {
        let out = weights.as_mut_ptr().wrapping_add(r * BLOCK_KEYS);
        let shift = _mm512_set1_ps(-new_max[r] * std::f32::consts::LOG2_E);
        let mut sum = [_mm512_setzero_ps(); 2];
        for i in (0..width / 16).step_by(2) {
            let [low, high] = [i, i + 1].map(|i| {
                let mask = lanes(seen, 16 * i);
                // SAFETY: as above.
                let x = unsafe { _mm512_maskz_loadu_ps(mask, row(r).add(16 * i)) };
                exp2(cpu, mask, _mm512_fmadd_ps(x, factor, shift))
            });
            sum = [_mm512_add_ps(sum[0], low), _mm512_add_ps(sum[1], high)];
            // SAFETY: __m512bh is 32 bf16 lanes, 512 bits of plain data, as __m512i.
            let rounded =
                unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(high, low)) };
            // SAFETY: as above: 32 weights at 16 * i, below `width`.
            unsafe { _mm512_storeu_si512(out.add(16 * i).cast(), rounded) };
        }
        block_sums[r] = _mm512_add_ps(sum[0], sum[1]);
    }
    // e^(old max - max) <= 1; 2^-127 for the first block (old max -inf), where the sums it
    // scales are zero.
    // SAFETY: two arrays of 16 floats.
    let (before, after) = unsafe {
        (
            _mm512_loadu_ps(old_max.as_ptr()),
            _mm512_loadu_ps(new_max.as_ptr()),
        )
    };
    let mut corrections = [0f32; 16];
    let exponent = _mm512_mul_ps(_mm512_sub_ps(before, after), log2e);
    // SAFETY: an array of 16 floats.
    unsafe { _mm512_storeu_ps(corrections.as_mut_ptr(), exp2(cpu, !0, exponent)) };
    for (r, &block) in block_sums.iter().enumerate().take(visible.len()) {
        let correction = corrections[r];
        let factor = _mm512_set1_ps(correction);
        // The caller promises LANES sums for each of the tile's rows.
        let partial = sums.as_mut_ptr().wrapping_add(r * LANES);
        // SAFETY: as above.
        unsafe {
            _mm512_storeu_ps(
                partial,
                _mm512_fmadd_ps(_mm512_loadu_ps(partial), factor, block),
            )
        };
        if correction != 1.0 {
            for a in acc[r * d..(r + 1) * d].chunks_exact_mut(16) {
                // SAFETY: 16 floats of the row's weighted sum (d is a multiple of 32).
                unsafe {
                    _mm512_storeu_ps(
                        a.as_mut_ptr(),
                        _mm512_mul_ps(_mm512_loadu_ps(a.as_ptr()), factor),
                    )
                };
            }
        }
    }
}

/// `2^t` per lane of `mask` (zero in the others) for `t <= 0` up to rounding: a degree-5
/// polynomial (relative error below 2e-7, float32's own) of the fraction `t - round(t)` in
/// [-0.5, 0.5], scaled by `2^round(t)` with `vscalefps` (zero far below). `t` is first raised
/// to -127, so that -inf gives 2^-127 rather than NaN: a term that small is zero in bf16.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn exp2(_: Avx512Bf16, mask: __mmask16, t: __m512) -> __m512 {
    let t = _mm512_max_ps(t, _mm512_set1_ps(-127.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let f = _mm512_sub_ps(t, n);
    let mut p = _mm512_set1_ps(1.330_060_5e-3);
    for c in [
        9.669_691e-3,
        5.550_558_5e-2,
        2.402_228_3e-1,
        std::f32::consts::LN_2,
        1.0,
    ] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    _mm512_maskz_scalef_ps(mask, p, n)
}

/// `scores` of `N` rows, 32 keys at a time; see `Micro::scores`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn scores_tile<const N: usize>(cpu: Avx512Bf16, tile: Tile<'_>, scores: &mut [f32]) {
    let Tile {
        q, keys, width, d, ..
    } = tile;
    // The caller promises each query's `d` elements within `q`, `keys` a whole packed block
    // (32 keys' pairs at each `key_index(p, k0, d)`, k0 a multiple of 32 below BLOCK_KEYS),
    // and `scores` of N rows of BLOCK_KEYS: every pointer below stays inside them.
    let queries: [*const i32; N] =
        std::array::from_fn(|i| q.as_ptr().wrapping_add(tile.queries[i]).cast());
    for k0 in (0..width).step_by(32) {
        let mut acc = [[_mm512_setzero_ps(); 2]; N];
        let slice = keys.as_ptr().wrapping_add(key_index(0, k0, d));
        // SAFETY: the d / 2 pairs of each query, and of 32 keys from k0 (pair p at
        // `key_index(p, k0, d)`, SLICE after pair p - 1), inside `q` and `keys`.
        unsafe { pair_products(cpu, queries, slice, d / 2, &mut acc) };
        for (i, sums) in acc.iter().enumerate() {
            let out = scores.as_mut_ptr().wrapping_add(i * BLOCK_KEYS + k0);
            // SAFETY: 32 scores of row i, inside `scores`.
            unsafe {
                _mm512_storeu_ps(out, sums[0]);
                _mm512_storeu_ps(out.add(16), sums[1]);
            }
        }
    }
}

/// `weighted_sum` of `N` rows, 32 columns at a time; see `Micro::weighted_sum`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn weighted_tile<const N: usize>(
    cpu: Avx512Bf16,
    tile: Tile<'_>,
    weights: &[Bf16],
    acc: &mut [f32],
) {
    let Tile {
        values, width, d, ..
    } = tile;
    // The caller promises `weights` of N rows of BLOCK_KEYS, `acc` of N rows of `d` (a
    // multiple of 32), `values` a whole packed block (32 columns of key pair jp at each
    // `value_index(jp, c0)`, c0 a multiple of 32 below d): every pointer below stays inside them.
    let rows: [*const i32; N] =
        std::array::from_fn(|i| weights.as_ptr().wrapping_add(i * BLOCK_KEYS).cast());
    for c0 in (0..d).step_by(32) {
        let out: [*mut f32; N] = std::array::from_fn(|i| acc.as_mut_ptr().wrapping_add(i * d + c0));
        // SAFETY: 32 sums of row i, inside `acc`.
        let mut sums: [[__m512; 2]; N] = std::array::from_fn(|i| unsafe {
            [_mm512_loadu_ps(out[i]), _mm512_loadu_ps(out[i].add(16))]
        });
        let slice = values.as_ptr().wrapping_add(value_index(0, c0));
        // SAFETY: the width / 2 weight pairs of each row, and 32 columns from c0 of as many
        // key pairs (pair jp at `value_index(jp, c0)`, SLICE after pair jp - 1), inside
        // `weights` and `values`.
        unsafe { pair_products(cpu, rows, slice, width / 2, &mut sums) };
        for (s, o) in sums.iter().zip(out) {
            // SAFETY: as the loads above.
            unsafe {
                _mm512_storeu_ps(o, s[0]);
                _mm512_storeu_ps(o.add(16), s[1]);
            }
        }
    }
}

/// `sums[i] += Σ_{p < pairs} (pair p of row i) · (run p of slice)` in `vdpbf16ps`, for `N`
/// rows: a row's pair (two bf16 of one 32-bit word, adjacent along the reduction) broadcast
/// against a run of 32 packed pairs (the `SLICE` lanes of 32 keys or 32 columns), runs one
/// after another. The inner loop of both products: each pair of loaded vectors serves every
/// row of the tile.
///
/// # Safety
/// Each of `rows` holds `pairs` pairs, and `slice` `pairs` runs of `SLICE` pairs (read
/// unaligned).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn pair_products<const N: usize>(
    _: Avx512Bf16,
    rows: [*const i32; N],
    slice: *const u32,
    pairs: usize,
    sums: &mut [[__m512; 2]; N],
) {
    for p in 0..pairs {
        let run = slice.wrapping_add(p * SLICE).cast::<__m512i>();
        // SAFETY: run p of `slice`, 32 pairs (the caller's promise).
        let (low, high) = unsafe { (_mm512_loadu_si512(run), _mm512_loadu_si512(run.add(1))) };
        let (low, high) = (bf16_lanes(low), bf16_lanes(high));
        for (s, row) in sums.iter_mut().zip(rows) {
            // SAFETY: pair p of the row (the caller's promise).
            let pair = unsafe { row.add(p).read_unaligned() };
            let pair = bf16_lanes(_mm512_set1_epi32(pair));
            s[0] = _mm512_dpbf16_ps(s[0], pair, low);
            s[1] = _mm512_dpbf16_ps(s[1], pair, high);
        }
    }
}
