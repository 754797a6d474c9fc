//! The AVX-512 VNNI kernel of `linear_packed_prefill`: per block, one `vpdpbusd` adds four
//! weights of each of a tile's 16 columns times four int8 activations (broadcast to every lane)
//! into the column's int32 lane, 8 per block and (row, tile); the lanes then turn into floats
//! and meet the scales (see `prefill.rs` for the arithmetic, which this follows operation for
//! operation).
//!
//! Register blocking: `ROWS` rows × `TILES` tiles of 16 columns share each loaded block, so a
//! decoded weight vector serves `ROWS` rows and a broadcast activation `TILES` tiles. Registers:
//! an int32 sum and a float sum per (row, tile) (2 × 12), two decoded groups per tile (4), two
//! broadcast activations and the nibble mask: 31 of 32. Per block and (row, tile) the float
//! work is a conversion, a multiply (the two scales), a fused multiply-add, and for Q4_1 a
//! second for its offsets: 3 or 4 instructions beside 8 `vpdpbusd`.

use std::arch::x86_64::*;
use std::ops::Range;

use super::prefill::Job;
use super::vnni::{bias_lanes, load_block, store, Bytes, Nibbles, Values};
use super::{tile_block_bytes, values_bytes, BLOCK, TILE};
use crate::element::Element;
use crate::quant::Format;

/// Rows of a register tile.
const ROWS: usize = 6;
/// Column tiles of a register tile.
const TILES: usize = 2;

/// Computes rows `rows` × tiles `tiles` of `job`.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `job`'s pointers hold what `Job` says (checked by
/// `linear_packed_prefill`); no other thread writes these outputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
pub(super) unsafe fn run<T: Element>(job: &Job<T>, rows: Range<usize>, tiles: Range<usize>) {
    // SAFETY: forwarded; each format's values, zero point and offsets match `job.format`.
    unsafe {
        match job.format {
            Format::Q8_0 => run_as::<Bytes, T, 128, false>(job, rows, tiles),
            Format::Q4_0 => run_as::<Nibbles, T, 8, false>(job, rows, tiles),
            Format::Q4_1 => run_as::<Nibbles, T, 0, true>(job, rows, tiles),
        }
    }
}

#[inline(always)]
unsafe fn run_as<V: Values, T: Element, const ZERO: i32, const OFFSET: bool>(
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    let mut tile = tiles.start;
    // SAFETY: every (row, tile) below lies inside `rows` × `tiles`, the caller's.
    unsafe {
        while tile < tiles.end {
            let group = if tile + TILES <= tiles.end { TILES } else { 1 };
            let mut row = rows.start;
            while row < rows.end {
                let count = ROWS.min(rows.end - row);
                if (count, group) == (ROWS, TILES) {
                    micro::<V, T, ZERO, OFFSET, ROWS, TILES>(job, row, tile);
                } else {
                    for tile in tile..tile + group {
                        match count {
                            1 => micro::<V, T, ZERO, OFFSET, 1, 1>(job, row, tile),
                            2 => micro::<V, T, ZERO, OFFSET, 2, 1>(job, row, tile),
                            3 => micro::<V, T, ZERO, OFFSET, 3, 1>(job, row, tile),
                            4 => micro::<V, T, ZERO, OFFSET, 4, 1>(job, row, tile),
                            5 => micro::<V, T, ZERO, OFFSET, 5, 1>(job, row, tile),
                            6 => micro::<V, T, ZERO, OFFSET, 6, 1>(job, row, tile),
                            7 => micro::<V, T, ZERO, OFFSET, 7, 1>(job, row, tile),
                            _ => micro::<V, T, ZERO, OFFSET, ROWS, 1>(job, row, tile),
                        }
                    }
                }
                row += count;
            }
            tile += group;
        }
    }
}

/// Output rows `row..row + R`, tiles `tile..tile + N`.
#[inline(always)]
unsafe fn micro<
    V: Values,
    T: Element,
    const ZERO: i32,
    const OFFSET: bool,
    const R: usize,
    const N: usize,
>(
    job: &Job<T>,
    row: usize,
    tile: usize,
) {
    let k = job.in_features;
    let blocks = k / BLOCK;
    let stride = tile_block_bytes(job.format);
    let scales_at = values_bytes(job.format);
    // SAFETY: the caller keeps rows and tiles inside the job, so every offset below stays
    // inside the buffers `Job` describes; loads and stores are unaligned ones.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        for b in 0..blocks {
            let base: [*const u8; N] =
                std::array::from_fn(|t| job.weight.add(((tile + t) * blocks + b) * stride));
            let mut dot = [[_mm512_setzero_si512(); N]; R];
            for h in 0..4 {
                let w: [[__m512i; 2]; N] = std::array::from_fn(|t| V::groups(base[t], h));
                for (r, dot) in dot.iter_mut().enumerate() {
                    let at = job.values.add((row + r) * k + b * BLOCK + 4 * h);
                    let four = |at: *const i8| _mm512_set1_epi32(at.cast::<i32>().read_unaligned());
                    let (a, a2) = (four(at), four(at.add(16)));
                    for (dot, w) in dot.iter_mut().zip(&w) {
                        *dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(*dot, w[0], a), w[1], a2);
                    }
                }
            }
            let half = |at: *const u8| _mm512_cvtph_ps(_mm256_loadu_si256(at.cast()));
            let d: [__m512; N] = std::array::from_fn(|t| half(base[t].add(scales_at)));
            for r in 0..R {
                let at = (row + r) * blocks + b;
                let unit = _mm512_set1_ps(*job.units.add(at));
                let offset = _mm512_set1_epi32(ZERO * *job.totals.add(at));
                for t in 0..N {
                    let dot = if ZERO == 0 {
                        dot[r][t]
                    } else {
                        _mm512_sub_epi32(dot[r][t], offset)
                    };
                    let scale = _mm512_mul_ps(d[t], unit);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r][t]);
                }
            }
            if OFFSET {
                let m: [__m512; N] = std::array::from_fn(|t| half(base[t].add(scales_at + 32)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let sum = _mm512_set1_ps(*job.sums.add((row + r) * blocks + b));
                    for (acc, m) in acc.iter_mut().zip(&m) {
                        *acc = _mm512_fmadd_ps(*m, sum, *acc);
                    }
                }
            }
        }
        for t in 0..N {
            let column = (tile + t) * TILE;
            let width = TILE.min(job.out_features - column);
            let bias = bias_lanes(job.bias, column, width);
            for (r, sums) in acc.iter().enumerate() {
                let target = job.out.add((row + r) * job.out_features + column);
                store(_mm512_add_ps(sums[t], bias), target, width);
            }
        }
    }
}

/// `prefill::round_block` with AVX-512: the same operations on 16 lanes at a time, so the same
/// values, unit and sum.
///
/// # Safety
/// The CPU has AVX-512 F and BW; `block` and `out` hold 32 elements each.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn round_block<T: Element>(block: &[T], out: &mut [i8]) -> Option<(f32, i32)> {
    // SAFETY: 32 elements at `block` and 32 bytes at `out`, as the caller guarantees.
    unsafe {
        let (v, largest) = load_block(block)?;
        if largest == 0.0 {
            out.fill(0);
            return Some((0.0, 0));
        }
        let inverse = _mm512_set1_ps(127.0 / largest);
        let (lowest, highest) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        let mut total = _mm512_setzero_si512();
        for (half, v) in v.iter().enumerate() {
            let rounded = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(*v, inverse),
            );
            let whole = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(rounded, lowest), highest));
            _mm_storeu_si128(
                out.as_mut_ptr().add(16 * half).cast(),
                _mm512_cvtepi32_epi8(whole),
            );
            total = _mm512_add_epi32(total, whole);
        }
        Some((largest / 127.0, _mm512_reduce_add_epi32(total)))
    }
}
