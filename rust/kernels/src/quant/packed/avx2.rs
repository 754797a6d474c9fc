//! The AVX2 kernels of `linear_packed` (two int8 parts) and `linear_packed_one_int8` (one int8),
//! for CPUs without AVX-512 VNNI: the same tiles, read 8 columns (half a tile) at a time. Where
//! the CPU has AVX-VNNI, the same loops take its 256-bit `vpdpbusd` instead (`values.rs`: `Dot`).
//!
//! AVX2 has no `vpdpbusd`: `vpmaddubsw` multiplies unsigned weight bytes by signed activation
//! bytes and adds adjacent pairs into 16-bit lanes, and `vpmaddwd` by ones adds those pairs
//! into the 32-bit lane of each column (four weights of a column per lane, as in the tiles).
//! For nibbles (Q4_0, Q4_1: weights 0..=15, activations within ±128) a pair is at most 3,840
//! in magnitude, so a block's 8 groups add up in 16 bits (at most 30,720) and widen once per
//! block; Q5_0's and Q5_1's values (0..=31) would not: the two-part kernel widens them at
//! every group, the one-int8 kernel every four (`values.rs`: `FiveBitsIn16`). Q8_0's
//! weights are stored plus 128, whose pairs would saturate 16 bits: its bytes turn back into
//! signed values, and `vpmaddubsw` takes their magnitudes against the activations
//! carrying their signs (pairs at most 32,512), widened at every group; the sums then hold no
//! zero point to take off. The integer sums are exact either way, so they equal `vpdpbusd`'s,
//! and the float steps are the AVX-512 kernels' operations in the same order: the results are
//! bit-identical to theirs and to the portable kernels (see `packed.rs` and `one_int8.rs`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::{zero_point, Job, BLOCK, TILE};
use crate::element::Element;
use crate::isa::{Avx2, AvxVnni};
use crate::quant::Format;

mod values;

use values::{Bytes, Dot, FiveBits, FiveBitsIn16, Nibbles, Stored, Values};

/// Columns of a half tile (the 8 int32 lanes of an AVX2 vector).
const HALF: usize = 8;
/// The most rows sharing each loaded group (two sums and a float sum a row within 16 registers
/// for the two-part kernel; one sum and a float sum for the one-int8 kernel).
const TILE_ROWS: usize = 4;

/// Four int8 activations at `at`, in every lane.
///
/// # Safety
/// `at` holds 4 readable bytes; the CPU has AVX2.
#[inline(always)]
unsafe fn four(at: *const i8) -> __m256i {
    // SAFETY: the caller's promise.
    unsafe { _mm256_set1_epi32(at.cast::<i32>().read_unaligned()) }
}

/// The 8 halves at `at` as floats.
///
/// # Safety
/// `at` holds 16 readable bytes; the CPU has F16C.
#[inline(always)]
unsafe fn halves(at: *const u8) -> __m256 {
    // SAFETY: the caller's promise.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast())) }
}

/// The lanes `0..width` (at most 8) as a mask of whole lanes.
#[inline(always)]
unsafe fn lanes(width: usize) -> __m256i {
    // SAFETY: register-only AVX2 operations; the caller has AVX2.
    unsafe {
        let index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(width as i32), index)
    }
}

/// `acc` plus the bias of columns `column..column + width`, stored as `T` at `target`.
///
/// # Safety
/// `target` holds `width` (at most 8) elements and a non-null `bias` `column + width` floats;
/// the CPU has AVX2.
#[inline(always)]
pub(super) unsafe fn store<T: Element>(
    acc: __m256,
    bias: *const f32,
    column: usize,
    target: *mut T,
    width: usize,
) {
    // SAFETY: masked loads and stores touch lanes `0..width` only, inside the buffers; `T` is
    // `f32` or, when `T::REDUCED`, the 16-bit `Bf16` (the only `Element`s).
    unsafe {
        let mask = lanes(width);
        // A zero where there is no bias, as the other kernels add (-0 + 0 is +0).
        let bias = if bias.is_null() {
            _mm256_setzero_ps()
        } else {
            _mm256_maskload_ps(bias.add(column), mask)
        };
        let v = _mm256_add_ps(acc, bias);
        if !T::REDUCED {
            _mm256_maskstore_ps(target.cast(), mask, v);
            return;
        }
        // `Bf16::from_f32` on 8 lanes: bits + 0x7fff + (bit 16), a NaN quieted instead.
        let bits = _mm256_castps_si256(v);
        let high = _mm256_srli_epi32::<16>(bits);
        let even = _mm256_add_epi32(
            _mm256_and_si256(high, _mm256_set1_epi32(1)),
            _mm256_set1_epi32(0x7fff),
        );
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(bits, even));
        let quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        let words = _mm256_blendv_epi8(rounded, quiet, nan);
        // Pack within 128-bit lanes, then the two lanes' halves side by side.
        let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(words, words));
        let mut out = [0u16; HALF];
        _mm_storeu_si128(out.as_mut_ptr().cast(), _mm256_castsi256_si128(packed));
        std::ptr::copy_nonoverlapping(out.as_ptr(), target.cast::<u16>(), width);
    }
}

/// The output columns of half `half` of tile `tile` (None past the last column).
fn half_columns(tile: usize, half: usize, n: usize) -> Option<(usize, usize)> {
    let column = tile * TILE + half * HALF;
    (column < n).then(|| (column, HALF.min(n - column)))
}

/// How a product's activations meet a half tile: split into two int8 parts (`Split`,
/// `linear_packed`) or rounded to one (`OneInt8`, `linear_packed_one_int8`).
trait Parts {
    /// Output rows `row..row + R` of half `half` of tile `tile` (columns `column..column +
    /// width`) of `job`.
    ///
    /// # Safety
    /// The rows and the tile lie inside the job and the calling thread's share; the CPU has
    /// AVX2, FMA and F16C.
    unsafe fn rows<V: Values, T: Element, const R: usize>(
        job: &Job<T>,
        row: usize,
        tile: usize,
        half: usize,
        column: usize,
        width: usize,
    );
}

/// `linear_packed`'s activations: two int8 parts.
struct Split;
/// `linear_packed_one_int8`'s activations: one int8 part.
struct OneInt8;

/// A job's blocks of 32 per row, bytes per tile block, where a tile block's scales start, and
/// the zero point its sums take off with the values `V`.
#[inline(always)]
fn geometry<V: Values, T>(job: &Job<T>) -> (usize, usize, usize, i32) {
    let (blocks, stride, scales_at) = job.tile_geometry();
    let zero = if V::SIGNED { 0 } else { zero_point(job.format) };
    (blocks, stride, scales_at, zero)
}

/// Stores the sums `acc` of output rows `row..row + R`, columns `column..column + width`, plus
/// the bias, as `T`.
///
/// # Safety
/// The rows and columns lie inside the job's output; the CPU has AVX2.
#[inline(always)]
unsafe fn store_rows<T: Element, const R: usize>(
    job: &Job<T>,
    acc: &[__m256; R],
    row: usize,
    column: usize,
    width: usize,
) {
    for (r, acc) in acc.iter().enumerate() {
        // SAFETY: the caller's promise.
        unsafe {
            let target = job.out.add((row + r) * job.out_features + column);
            store(*acc, job.bias, column, target, width);
        }
    }
}

impl Parts for Split {
    #[inline(always)]
    unsafe fn rows<V: Values, T: Element, const R: usize>(
        job: &Job<T>,
        row: usize,
        tile: usize,
        half: usize,
        column: usize,
        width: usize,
    ) {
        // Its two sums a row leave no registers for sums widened during the block.
        const { assert!(V::STEPS == 4, "the two-part kernel widens once per block") };
        let k = job.in_features;
        let (blocks, stride, scales_at, zero) = geometry::<V, T>(job);
        // SAFETY: the caller keeps rows and the tile inside the job, so every offset below stays
        // inside the buffers `Job` describes; loads are unaligned ones.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..blocks {
                let base = job.weight.add((tile * blocks + b) * stride);
                let mut high = [_mm256_setzero_si256(); R];
                let mut low = [_mm256_setzero_si256(); R];
                for h in 0..4 {
                    let w = V::groups(base, h, half);
                    for r in 0..R {
                        let at = (row + r) * k + b * BLOCK + 4 * h;
                        let (a, a2) = (four(job.whole.add(at)), four(job.whole.add(at + 16)));
                        let (c, c2) = (four(job.rest.add(at)), four(job.rest.add(at + 16)));
                        high[r] = V::add(V::add(high[r], w[0], a), w[1], a2);
                        low[r] = V::add(V::add(low[r], w[0], c), w[1], c2);
                    }
                }
                let d = halves(base.add(scales_at + 2 * HALF * half));
                let m = halves(base.add(scales_at + 2 * TILE + 2 * HALF * half));
                for r in 0..R {
                    let at = (row + r) * blocks + b;
                    let unit = _mm256_set1_ps(*job.units.add(at));
                    let sum = _mm256_set1_ps(*job.sums.add(at));
                    let offset = _mm256_set1_epi32(zero * *job.totals.add(at));
                    let whole = _mm256_slli_epi32::<8>(V::widen(high[r]));
                    let dot = _mm256_sub_epi32(_mm256_add_epi32(whole, V::widen(low[r])), offset);
                    let scaled =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, unit), acc[r]);
                    acc[r] = _mm256_fmadd_ps(m, sum, scaled);
                }
            }
            store_rows(job, &acc, row, column, width);
        }
    }
}

impl Parts for OneInt8 {
    #[inline(always)]
    unsafe fn rows<V: Values, T: Element, const R: usize>(
        job: &Job<T>,
        row: usize,
        tile: usize,
        half: usize,
        column: usize,
        width: usize,
    ) {
        let k = job.in_features;
        let (blocks, stride, scales_at, zero) = geometry::<V, T>(job);
        let offsets = job.format.has_offset();
        // SAFETY: the caller keeps rows and the tile inside the job, so every offset below stays
        // inside the buffers `Job` describes; loads are unaligned ones.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..blocks {
                let base = job.weight.add((tile * blocks + b) * stride);
                job.prefetch_tile_block(tile + 1, b);
                // Each row's sum in the lanes of `V::add` since the last widening, and widened.
                let mut part = [_mm256_setzero_si256(); R];
                let mut dot = [_mm256_setzero_si256(); R];
                for h in 0..4 {
                    let w = V::groups(base, h, half);
                    for (r, part) in part.iter_mut().enumerate() {
                        let at = job.whole.add((row + r) * k + b * BLOCK + 4 * h);
                        *part = V::add(V::add(*part, w[0], four(at)), w[1], four(at.add(16)));
                    }
                    if (h + 1) % V::STEPS == 0 {
                        for (dot, part) in dot.iter_mut().zip(&mut part) {
                            *dot = _mm256_add_epi32(*dot, V::widen(*part));
                            *part = _mm256_setzero_si256();
                        }
                    }
                }
                let d = halves(base.add(scales_at + 2 * HALF * half));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let at = (row + r) * blocks + b;
                    let unit = _mm256_set1_ps(*job.units.add(at));
                    let mut whole = dot[r];
                    if zero != 0 {
                        whole =
                            _mm256_sub_epi32(whole, _mm256_set1_epi32(zero * *job.totals.add(at)));
                    }
                    let scale = _mm256_mul_ps(d, unit);
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(whole), scale, *acc);
                }
                if offsets {
                    let m = halves(base.add(scales_at + 2 * TILE + 2 * HALF * half));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let sum = _mm256_set1_ps(*job.sums.add((row + r) * blocks + b));
                        *acc = _mm256_fmadd_ps(m, sum, *acc);
                    }
                }
            }
            store_rows(job, &acc, row, column, width);
        }
    }
}

/// Rows `rows` of every half tile of `tiles` of `job`, `TILE_ROWS` rows at a time, the values
/// `Q8` for Q8_0, `Q4` for Q4_0 and Q4_1, `Q5` for Q5_0 and Q5_1.
///
/// # Safety
/// The rows and tiles lie inside the job and are the calling thread's; the CPU has AVX2, FMA
/// and F16C, and the instructions of `Q8`, `Q4` and `Q5`.
#[inline(always)]
unsafe fn each_half_tile<Q8: Values, Q4: Values, Q5: Values, P: Parts, T: Element>(
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded; each format's values match `job.format`.
    unsafe {
        match job.format {
            Format::Q8_0 => half_tiles_as::<Q8, P, T>(job, rows, tiles),
            Format::Q4_0 | Format::Q4_1 => half_tiles_as::<Q4, P, T>(job, rows, tiles),
            Format::Q5_0 | Format::Q5_1 => half_tiles_as::<Q5, P, T>(job, rows, tiles),
            Format::Q4_K | Format::Q5_K | Format::Q6_K => {
                unreachable!("a K-quant's tiles never reach the kernels of blocks of 32")
            }
        }
    }
}

/// `each_half_tile` with the values `V`.
#[inline(always)]
unsafe fn half_tiles_as<V: Values, P: Parts, T: Element>(
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    for tile in tiles {
        for half in 0..2 {
            let Some((column, width)) = half_columns(tile, half, job.out_features) else {
                continue;
            };
            let mut row = rows.start;
            while row < rows.end {
                let count = TILE_ROWS.min(rows.end - row);
                // SAFETY: rows `row..row + count` and the tile lie inside the caller's share.
                unsafe {
                    match count {
                        1 => P::rows::<V, T, 1>(job, row, tile, half, column, width),
                        2 => P::rows::<V, T, 2>(job, row, tile, half, column, width),
                        3 => P::rows::<V, T, 3>(job, row, tile, half, column, width),
                        _ => P::rows::<V, T, 4>(job, row, tile, half, column, width),
                    }
                }
                row += count;
            }
        }
    }
}

/// `linear_packed`'s tiles `tiles` for every row of `job`.
///
/// # Safety
/// `job`'s pointers hold what `Job` says (checked by `linear_packed`); no other thread writes
/// these tiles.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run<T: Element>(_: Avx2, job: &Job<T>, tiles: Range<usize>) {
    // SAFETY: forwarded.
    unsafe { each_half_tile::<Bytes, Nibbles, FiveBits, Split, T>(job, 0..job.m, tiles) }
}

/// `run` with AVX-VNNI's products.
///
/// # Safety
/// As `run`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn run_vnni<T: Element>(_: AvxVnni, job: &Job<T>, tiles: Range<usize>) {
    // SAFETY: forwarded.
    unsafe {
        each_half_tile::<Dot<Stored>, Dot<Nibbles>, Dot<FiveBits>, Split, T>(job, 0..job.m, tiles)
    }
}

/// `linear_packed_one_int8`'s rows `rows` × tiles `tiles` of `job`.
///
/// # Safety
/// `job`'s pointers hold what `Job` says (checked by `linear_packed_one_int8`); no other thread
/// writes these outputs.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run_one_int8<T: Element>(
    _: Avx2,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded.
    unsafe { each_half_tile::<Bytes, Nibbles, FiveBitsIn16, OneInt8, T>(job, rows, tiles) }
}

/// `run_one_int8` with AVX-VNNI's products.
///
/// # Safety
/// As `run_one_int8`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn run_one_int8_vnni<T: Element>(
    _: AvxVnni,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded.
    unsafe {
        each_half_tile::<Dot<Stored>, Dot<Nibbles>, Dot<FiveBits>, OneInt8, T>(job, rows, tiles)
    }
}
