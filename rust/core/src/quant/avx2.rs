//! The AVX2/FMA/F16C kernel of `quant::linear`.
//!
//! A block of one output column is expanded into four 8-lane float vectors (its 32 weights),
//! which then meet the same 32 inputs of each of the tile's `R` rows: one decode serves `R`
//! rows. A tile holds `R × C` accumulators (R rows, C columns, at most 12 of the 16 registers,
//! at least 8 where the shape allows, so the FMA latency is hidden) while it walks the blocks.
//! Columns are taken in groups of `GROUP` whose blocks stay in L1 while every row tile passes
//! over them, so the weight is read from memory once per call whatever the number of rows.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Format, Job, BLOCK, COLUMN_GROUP};

/// The most rows in a tile.
const TILE_ROWS: usize = 6;

/// Columns walked by every row tile before the next ones.
const GROUP: usize = COLUMN_GROUP;

/// Columns of a tile of `rows` rows: the most that keep `rows × columns ≤ 12` accumulators.
fn tile_columns(rows: usize) -> usize {
    match rows {
        1 => 8,
        2 | 3 => 4,
        4 => 3,
        _ => 2,
    }
}

/// Expands one block to its 32 weights, given its first byte.
trait Decode {
    const BYTES: usize;
    /// # Safety
    /// `block` points at `BYTES` readable bytes; the CPU has AVX2, FMA and F16C.
    unsafe fn decode(block: *const u8) -> [__m256; 4];
}

/// The 16 bytes of nibbles at `qs` as 32 floats 0..=15, then `d·q + m`.
#[inline(always)]
unsafe fn nibbles(qs: *const u8, d: __m256, m: __m256) -> [__m256; 4] {
    // SAFETY: the caller guarantees 16 readable bytes at `qs` and the CPU features.
    unsafe {
        let bytes = _mm_loadu_si128(qs.cast());
        let mask = _mm_set1_epi8(0x0f);
        let low = _mm_and_si128(bytes, mask);
        let high = _mm_and_si128(_mm_srli_epi16::<4>(bytes), mask);
        let float = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
        [
            _mm256_fmadd_ps(float(low), d, m),
            _mm256_fmadd_ps(float(_mm_srli_si128::<8>(low)), d, m),
            _mm256_fmadd_ps(float(high), d, m),
            _mm256_fmadd_ps(float(_mm_srli_si128::<8>(high)), d, m),
        ]
    }
}

/// The halves at `block` (two for Q4_1: d then m) as floats in the low lanes.
#[inline(always)]
unsafe fn halves(block: *const u8) -> __m128 {
    // SAFETY: the caller guarantees 4 readable bytes at `block` and F16C.
    unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128(block.cast::<i32>().read_unaligned())) }
}

struct Q40;
struct Q41;
struct Q80;

impl Decode for Q40 {
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn decode(block: *const u8) -> [__m256; 4] {
        // SAFETY: 18 bytes at `block`: the scale's 2 (read with the first 2 nibble bytes, in
        // the block) and 16 of nibbles at 2. d·q − 8d is d·(q − 8) rounded once.
        unsafe {
            let d = _mm256_broadcastss_ps(halves(block));
            nibbles(block.add(2), d, _mm256_mul_ps(d, _mm256_set1_ps(-8.0)))
        }
    }
}

impl Decode for Q41 {
    const BYTES: usize = 20;
    #[inline(always)]
    unsafe fn decode(block: *const u8) -> [__m256; 4] {
        // SAFETY: 20 bytes at `block`: d and m in the first 4, 16 of nibbles at 4.
        unsafe {
            let dm = halves(block);
            let d = _mm256_broadcastss_ps(dm);
            let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
            nibbles(block.add(4), d, m)
        }
    }
}

impl Decode for Q80 {
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn decode(block: *const u8) -> [__m256; 4] {
        // SAFETY: 34 bytes at `block`: the scale's 2 (read with 2 value bytes) and 32 signed
        // values at 2, read 8 at a time.
        unsafe {
            let d = _mm256_broadcastss_ps(halves(block));
            let values = |at: usize| {
                let eight = _mm_loadl_epi64(block.add(2 + at).cast());
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight)), d)
            };
            [values(0), values(8), values(16), values(24)]
        }
    }
}

/// Computes the output columns `columns` for every row of `job`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `job`'s pointers hold `m·in` inputs, the `[out, in]`
/// blocks, `out` biases (or are null) and `m·out` outputs; no other thread writes `columns`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run(job: &Job, columns: Range<usize>) {
    // SAFETY: forwarded; each format's decoder matches `job.format`.
    unsafe {
        match job.format {
            Format::Q4_0 => run_as::<Q40>(job, columns),
            Format::Q4_1 => run_as::<Q41>(job, columns),
            Format::Q8_0 => run_as::<Q80>(job, columns),
        }
    }
}

#[inline(always)]
unsafe fn run_as<D: Decode>(job: &Job, columns: Range<usize>) {
    let tiles = job.m.div_ceil(TILE_ROWS);
    let mut group = columns.start;
    while group < columns.end {
        let group_end = (group + GROUP).min(columns.end);
        // The rows are spread evenly over the tiles (7 rows: 4 + 3, not 6 + 1).
        let mut row = 0;
        for tile in 0..tiles {
            let rows = (job.m - row).div_ceil(tiles - tile);
            let width = tile_columns(rows);
            let mut column = group;
            while column < group_end {
                let count = width.min(group_end - column);
                // SAFETY: rows `row..row + rows` and columns `column..column + count` lie inside
                // the job and this thread's share, as the caller guarantees.
                unsafe { dispatch::<D>(job, row, column, rows, count) };
                column += count;
            }
            row += rows;
        }
        group = group_end;
    }
}

/// Runs the tile of `rows × columns` (as `tile_columns` allows) at (`row`, `column`).
#[inline(always)]
unsafe fn dispatch<D: Decode>(job: &Job, row: usize, column: usize, rows: usize, columns: usize) {
    // SAFETY: forwarded from `run_as`; every arm's constants equal (`rows`, `columns`).
    unsafe {
        match (rows, columns) {
            (1, 8) => tile::<D, 1, 8>(job, row, column),
            (1, 7) => tile::<D, 1, 7>(job, row, column),
            (1, 6) => tile::<D, 1, 6>(job, row, column),
            (1, 5) => tile::<D, 1, 5>(job, row, column),
            (1, 4) => tile::<D, 1, 4>(job, row, column),
            (1, 3) => tile::<D, 1, 3>(job, row, column),
            (1, 2) => tile::<D, 1, 2>(job, row, column),
            (1, _) => tile::<D, 1, 1>(job, row, column),
            (2, 4) => tile::<D, 2, 4>(job, row, column),
            (2, 3) => tile::<D, 2, 3>(job, row, column),
            (2, 2) => tile::<D, 2, 2>(job, row, column),
            (2, _) => tile::<D, 2, 1>(job, row, column),
            (3, 4) => tile::<D, 3, 4>(job, row, column),
            (3, 3) => tile::<D, 3, 3>(job, row, column),
            (3, 2) => tile::<D, 3, 2>(job, row, column),
            (3, _) => tile::<D, 3, 1>(job, row, column),
            (4, 3) => tile::<D, 4, 3>(job, row, column),
            (4, 2) => tile::<D, 4, 2>(job, row, column),
            (4, _) => tile::<D, 4, 1>(job, row, column),
            (5, 2) => tile::<D, 5, 2>(job, row, column),
            (5, _) => tile::<D, 5, 1>(job, row, column),
            (_, 2) => tile::<D, 6, 2>(job, row, column),
            _ => tile::<D, 6, 1>(job, row, column),
        }
    }
}

/// Output rows `row..row + R`, columns `column..column + C`.
#[inline(always)]
unsafe fn tile<D: Decode, const R: usize, const C: usize>(job: &Job, row: usize, column: usize) {
    let k = job.in_features;
    let blocks = k / BLOCK;
    let row_bytes = blocks * D::BYTES;
    // SAFETY: the caller keeps rows and columns inside the job, so every offset below stays
    // inside the buffers `Job` describes; loads and stores are unaligned ones.
    unsafe {
        let x = job.x.add(row * k);
        let weight = job.weight.add(column * row_bytes);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for b in 0..blocks {
            for c in 0..C {
                let w = D::decode(weight.add(c * row_bytes + b * D::BYTES));
                for (r, sums) in acc.iter_mut().enumerate() {
                    let inputs = x.add(r * k + b * BLOCK);
                    let mut sum = sums[c];
                    for (v, lanes) in w.iter().enumerate() {
                        sum = _mm256_fmadd_ps(*lanes, _mm256_loadu_ps(inputs.add(8 * v)), sum);
                    }
                    sums[c] = sum;
                }
            }
        }
        for (r, sums) in acc.iter().enumerate() {
            for (c, sum) in sums.iter().enumerate() {
                let bias = if job.bias.is_null() {
                    0.0
                } else {
                    *job.bias.add(column + c)
                };
                *job.out.add((row + r) * job.out_features + column + c) = total(*sum) + bias;
            }
        }
    }
}

/// The sum of a vector's 8 lanes, always added in the same order.
#[inline(always)]
unsafe fn total(v: __m256) -> f32 {
    // SAFETY: register-only AVX operations; the caller has AVX.
    unsafe {
        let four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
        _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)))
    }
}
