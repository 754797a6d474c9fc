//! The AVX-512 VNNI kernel of `linear_packed`: per block, `vpdpbusd` adds each tile column's 32
//! weights times the row's 32 high activation parts into the column's int32 lane, and again
//! with the low parts (8 instructions each, four weights apiece, the activations broadcast
//! four at a time); the lanes then turn into floats and meet the scales (see `packed.rs` for
//! the arithmetic, which this follows operation for operation).
//!
//! Tiles: up to 8 rows share each loaded block; with one row, four column tiles run side by
//! side, and with two or three, two, so that enough independent sums hide `vpdpbusd`'s latency
//! (registers: two int32 sums and a float sum per (row, tile), two decoded groups per tile and
//! four broadcast activations, within 32).

use std::arch::x86_64::*;
use std::ops::Range;

use super::{values_bytes, zero_point, Job, PackedMatrix, BLOCK, TILE};
use crate::element::Element;
use crate::isa::{Avx512, Avx512Vnni};
use crate::quant::avx512::bf16;
use crate::quant::Format;

/// The most rows in a tile.
const TILE_ROWS: usize = 8;

/// The two groups of four weights a block's values hold at `h` (0..4): weights `4h..4h+4` and
/// `16+4h..16+4h+4` of each column, as unsigned bytes.
pub(super) trait Values {
    /// # Safety
    /// `at` points at a tile block's values; the CPU has AVX-512 F and BW.
    unsafe fn groups(at: *const u8, h: usize) -> [__m512i; 2];
}

/// Q4_0 and Q4_1: the two groups are the low and high nibbles of the same 64 bytes.
pub(super) struct Nibbles;
/// Q5_0 and Q5_1: `Nibbles` with the fifth bits of the plane after them (`layout.rs`).
pub(super) struct FiveBits;
/// Q8_0: one group per 64 bytes.
pub(super) struct Bytes;

impl Values for Nibbles {
    #[inline(always)]
    unsafe fn groups(at: *const u8, h: usize) -> [__m512i; 2] {
        // SAFETY: the values hold 4 × 64 bytes at `at`, as the caller guarantees.
        unsafe {
            let packed = _mm512_loadu_si512(at.add(64 * h).cast());
            let mask = _mm512_set1_epi8(0x0f);
            [
                _mm512_and_si512(packed, mask),
                _mm512_and_si512(_mm512_srli_epi16::<4>(packed), mask),
            ]
        }
    }
}

impl Values for FiveBits {
    #[inline(always)]
    unsafe fn groups(at: *const u8, h: usize) -> [__m512i; 2] {
        // SAFETY: the nibbles hold 4 × 64 bytes at `at`, the plane 64 after them, as the
        // caller guarantees.
        unsafe {
            let [low, high] = Nibbles::groups(at, h);
            let bits = _mm512_loadu_si512(at.add(256).cast());
            let [low_bits, high_bits] = fifth_bits(bits, h);
            [
                _mm512_or_si512(low, low_bits),
                _mm512_or_si512(high, high_bits),
            ]
        }
    }
}

/// Groups `h`'s and `h + 4`'s fifth bits (bits `h` and `h + 4` of each plane byte) on bit 4:
/// 16-bit shifts, whose bits carried across bytes land outside the mask (left by at most 4
/// into bits 0..4, right by at most 3 into bits 5..8).
#[inline(always)]
unsafe fn fifth_bits(bits: __m512i, h: usize) -> [__m512i; 2] {
    // SAFETY: register-only AVX-512 F and BW operations, which the caller has.
    unsafe {
        let bit = _mm512_set1_epi8(0x10);
        let (low, high) = match h {
            0 => (_mm512_slli_epi16::<4>(bits), bits),
            1 => (_mm512_slli_epi16::<3>(bits), _mm512_srli_epi16::<1>(bits)),
            2 => (_mm512_slli_epi16::<2>(bits), _mm512_srli_epi16::<2>(bits)),
            _ => (_mm512_slli_epi16::<1>(bits), _mm512_srli_epi16::<3>(bits)),
        };
        [_mm512_and_si512(low, bit), _mm512_and_si512(high, bit)]
    }
}

impl Values for Bytes {
    #[inline(always)]
    unsafe fn groups(at: *const u8, h: usize) -> [__m512i; 2] {
        // SAFETY: the values hold 8 × 64 bytes at `at`, as the caller guarantees.
        unsafe {
            [
                _mm512_loadu_si512(at.add(64 * h).cast()),
                _mm512_loadu_si512(at.add(64 * (h + 4)).cast()),
            ]
        }
    }
}

/// Computes the tiles `tiles` for every row of `job`.
///
/// # Safety
/// `job`'s pointers hold what `Job` says (checked by
/// `linear_packed`); no other thread writes the tiles.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
pub(super) unsafe fn run<T: Element>(_: Avx512Vnni, job: &Job<T>, tiles: Range<usize>) {
    // SAFETY: forwarded; each format's values match `job.format`.
    unsafe {
        match job.format {
            Format::Q8_0 => run_as::<Bytes, T>(job, tiles),
            Format::Q4_0 | Format::Q4_1 => run_as::<Nibbles, T>(job, tiles),
            Format::Q5_0 | Format::Q5_1 => run_as::<FiveBits, T>(job, tiles),
            Format::Q4_K | Format::Q5_K | Format::Q6_K => {
                unreachable!("a K-quant's tiles never reach the kernels of blocks of 32")
            }
        }
    }
}

#[inline(always)]
unsafe fn run_as<V: Values, T: Element>(job: &Job<T>, tiles: Range<usize>) {
    // Every row tile meets the claimed tiles while their blocks are in cache.
    for (row, rows) in even_row_tiles(job.m, TILE_ROWS) {
        // SAFETY: rows `row..row + rows` (1..=8) and `tiles` lie inside the job and this
        // thread's share, as the caller guarantees.
        unsafe {
            match rows {
                1 => span::<V, T, 1, 4>(job, row, tiles.clone()),
                2 => span::<V, T, 2, 2>(job, row, tiles.clone()),
                3 => span::<V, T, 3, 2>(job, row, tiles.clone()),
                4 => span::<V, T, 4, 1>(job, row, tiles.clone()),
                5 => span::<V, T, 5, 1>(job, row, tiles.clone()),
                6 => span::<V, T, 6, 1>(job, row, tiles.clone()),
                7 => span::<V, T, 7, 1>(job, row, tiles.clone()),
                _ => span::<V, T, 8, 1>(job, row, tiles.clone()),
            }
        }
    }
}

/// The rows `0..m` in row tiles of at most `most` rows, spread evenly (9 rows in tiles of at
/// most 8: 5 + 4, not 8 + 1): each row tile's first row and its rows.
pub(super) fn even_row_tiles(m: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let row_tiles = m.div_ceil(most);
    (0..row_tiles).scan(0, move |row, row_tile| {
        let (first, rows) = (*row, (m - *row).div_ceil(row_tiles - row_tile));
        *row += rows;
        Some((first, rows))
    })
}

/// Rows `row..row + R` over `tiles`, `N` tiles at a time, the tiles short of `N` one by one.
#[inline(always)]
unsafe fn span<V: Values, T: Element, const R: usize, const N: usize>(
    job: &Job<T>,
    row: usize,
    tiles: Range<usize>,
) {
    let mut tile = tiles.start;
    // SAFETY: every tile lies inside `tiles` and the rows inside the job, as the caller's.
    unsafe {
        while tile + N <= tiles.end {
            block_tile::<V, T, R, N>(job, row, tile);
            tile += N;
        }
        while tile < tiles.end {
            block_tile::<V, T, R, 1>(job, row, tile);
            tile += 1;
        }
    }
}

/// Output rows `row..row + R`, tiles `tile..tile + N`.
#[inline(always)]
unsafe fn block_tile<V: Values, T: Element, const R: usize, const N: usize>(
    job: &Job<T>,
    row: usize,
    tile: usize,
) {
    let k = job.in_features;
    let (blocks, stride, scales_at) = job.tile_geometry();
    // SAFETY: the caller keeps rows and tiles inside the job, so every offset below stays
    // inside the buffers `Job` describes; loads and stores are unaligned ones.
    unsafe {
        let zero = zero_point(job.format);
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        for b in 0..blocks {
            let base = tile_blocks::<T, N>(job, tile, b, blocks, stride);
            let mut high = [[_mm512_setzero_si512(); N]; R];
            let mut low = [[_mm512_setzero_si512(); N]; R];
            for h in 0..4 {
                let w = tile_groups::<V, N>(&base, h);
                for r in 0..R {
                    let at = (row + r) * k + b * BLOCK + 4 * h;
                    let four = |part: *const i8, at: usize| {
                        _mm512_set1_epi32(part.add(at).cast::<i32>().read_unaligned())
                    };
                    let (a, a2) = (four(job.whole, at), four(job.whole, at + 16));
                    let (c, c2) = (four(job.rest, at), four(job.rest, at + 16));
                    for t in 0..N {
                        let sum = _mm512_dpbusd_epi32(high[r][t], w[t][0], a);
                        high[r][t] = _mm512_dpbusd_epi32(sum, w[t][1], a2);
                        let sum = _mm512_dpbusd_epi32(low[r][t], w[t][0], c);
                        low[r][t] = _mm512_dpbusd_epi32(sum, w[t][1], c2);
                    }
                }
            }
            let d = tile_halves(&base, scales_at);
            let m = tile_halves(&base, scales_at + 32);
            for r in 0..R {
                let at = (row + r) * blocks + b;
                let unit = _mm512_set1_ps(*job.units.add(at));
                let sum = _mm512_set1_ps(*job.sums.add(at));
                let offset = _mm512_set1_epi32(zero * *job.totals.add(at));
                for t in 0..N {
                    let whole = _mm512_slli_epi32::<8>(high[r][t]);
                    let dot = _mm512_sub_epi32(_mm512_add_epi32(whole, low[r][t]), offset);
                    let scaled = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(dot),
                        _mm512_mul_ps(d[t], unit),
                        acc[r][t],
                    );
                    acc[r][t] = _mm512_fmadd_ps(m[t], sum, scaled);
                }
            }
        }
        store_tiles(job, &acc, row, tile);
    }
}

/// Block `b` of tiles `tile..tile + N` of `job`'s weight, of `blocks` blocks of `stride` bytes.
///
/// # Safety
/// The tiles and the block lie inside the weight.
#[inline(always)]
pub(super) unsafe fn tile_blocks<T, const N: usize>(
    job: &Job<T>,
    tile: usize,
    b: usize,
    blocks: usize,
    stride: usize,
) -> [*const u8; N] {
    // SAFETY: the caller's promise.
    std::array::from_fn(|t| unsafe { job.weight.add(((tile + t) * blocks + b) * stride) })
}

/// The groups at `h` of the tile blocks at `base`. A loop, not `std::array::from_fn`: its
/// closure does not take the kernel's target features, and where the compiler did not inline
/// `from_fn`, every intrinsic in it became a call (Q5_0's few-row kernel ran that way).
///
/// # Safety
/// As `Values::groups`, for each block.
#[inline(always)]
pub(super) unsafe fn tile_groups<V: Values, const N: usize>(
    base: &[*const u8; N],
    h: usize,
) -> [[__m512i; 2]; N] {
    // SAFETY: the caller's promise.
    unsafe {
        let mut groups = [[_mm512_setzero_si512(); 2]; N];
        for (groups, at) in groups.iter_mut().zip(base) {
            *groups = V::groups(*at, h);
        }
        groups
    }
}

/// The 16 half-precision values at `offset` of each tile block at `base`, as floats (a loop,
/// as `tile_groups`).
///
/// # Safety
/// Each block holds 32 bytes at `offset`; the CPU has AVX-512 F and F16C.
#[inline(always)]
pub(super) unsafe fn tile_halves<const N: usize>(
    base: &[*const u8; N],
    offset: usize,
) -> [__m512; N] {
    // SAFETY: the caller's promise.
    unsafe {
        let mut halves = [_mm512_setzero_ps(); N];
        for (half, at) in halves.iter_mut().zip(base) {
            *half = _mm512_cvtph_ps(_mm256_loadu_si256(at.add(offset).cast()));
        }
        halves
    }
}

/// Stores the sums `acc` of output rows `row..row + R`, tiles `tile..tile + N`, plus the bias,
/// as `T`.
///
/// # Safety
/// The rows and tiles lie inside the job's output; the CPU has AVX-512 F and BW.
#[inline(always)]
pub(super) unsafe fn store_tiles<T: Element, const R: usize, const N: usize>(
    job: &Job<T>,
    acc: &[[__m512; N]; R],
    row: usize,
    tile: usize,
) {
    for t in 0..N {
        let column = (tile + t) * TILE;
        let width = TILE.min(job.out_features - column);
        // SAFETY: the caller's promise: the columns and rows lie inside the output.
        unsafe {
            let bias = bias_lanes(job.bias, column, width);
            for (r, sums) in acc.iter().enumerate() {
                let target = job.out.add((row + r) * job.out_features + column);
                store(_mm512_add_ps(sums[t], bias), target, width);
            }
        }
    }
}

/// A group of four weights of a tile's 16 columns (64 bytes, column `c`'s four at bytes
/// `4c..4c+4`) transposed in registers into four rows of 16, as floats: row `i` holds weight `i`
/// of every column.
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[inline(always)]
pub(super) unsafe fn transposed(group: __m512i) -> [__m512; 4] {
    // SAFETY: register-only AVX-512 F and BW operations, which the caller has.
    unsafe {
        // Within each 128-bit lane (4 columns × 4 weights), bytes by weight then column; then
        // the lanes' dwords by weight, so that 128-bit lane `i` holds weight `i` of 16 columns.
        let by_weight = _mm512_broadcast_i32x4(_mm_setr_epi8(
            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
        ));
        let by_lane = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        let rows = _mm512_permutexvar_epi32(by_lane, _mm512_shuffle_epi8(group, by_weight));
        let float = |bytes: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
        [
            float(_mm512_extracti32x4_epi32::<0>(rows)),
            float(_mm512_extracti32x4_epi32::<1>(rows)),
            float(_mm512_extracti32x4_epi32::<2>(rows)),
            float(_mm512_extracti32x4_epi32::<3>(rows)),
        ]
    }
}

/// The lanes `0..width` (`width` at most 16) of a vector, as a mask.
#[inline(always)]
fn lanes(width: usize) -> __mmask16 {
    // `width` ≤ 16, so the shift stays inside 32 bits and the mask inside 16.
    ((1u32 << width) - 1) as __mmask16
}

/// The bias of output columns `column..column + width` (`width` at most 16) in a vector's
/// first lanes, zeros elsewhere and where there is no bias (`bias` null).
///
/// Masked loads and stores here and in `store`, not copies through a buffer: a copy of a
/// variable length is a call, across which the kernels' callers would spill their sums.
///
/// # Safety
/// A non-null `bias` holds at least `column + width` floats; the CPU has AVX-512 F.
#[inline(always)]
pub(super) unsafe fn bias_lanes(bias: *const f32, column: usize, width: usize) -> __m512 {
    // SAFETY: the caller's promise; the masked load reads only lanes `0..width`, inside
    // `bias` (masked-off lanes are not read and cannot fault).
    unsafe {
        if bias.is_null() {
            return _mm512_setzero_ps();
        }
        _mm512_maskz_loadu_ps(lanes(width), bias.add(column))
    }
}

/// Stores the first `width` lanes of `v` at `target` as `T`.
#[inline(always)]
pub(super) unsafe fn store<T: Element>(v: __m512, target: *mut T, width: usize) {
    // SAFETY: `target` holds `width` elements (the caller's word); `T` is `f32` or, when
    // `T::REDUCED`, `Bf16` (16 bits: the only `Element`s), and the masked stores write
    // exactly lanes `0..width` of them.
    unsafe {
        if T::REDUCED {
            let halves = _mm512_castsi256_si512(bf16(v));
            _mm512_mask_storeu_epi16(target.cast(), __mmask32::from(lanes(width)), halves);
        } else {
            _mm512_mask_storeu_ps(target.cast(), lanes(width), v);
        }
    }
}

/// `layout::transpose_tile` with AVX-512: each group of four weights of the tile's 16 columns
/// (64 bytes, column-major) is transposed in registers into four rows of 16 (a byte shuffle
/// within each 128-bit lane, then a dword permutation), then widened to floats and scaled by
/// the 16 columns' scales as `layout::dequantized` scales one weight.
///
/// # Safety
/// As `layout::transpose_tile`.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub(super) unsafe fn transpose_tile<T: Element>(
    _: Avx512,
    weight: &PackedMatrix<'_>,
    t: usize,
    out: *mut T,
) {
    // SAFETY: forwarded; each format's values match `weight.format`.
    unsafe {
        match weight.format {
            Format::Q4_0 => transpose_as::<Nibbles, T, 8>(weight, t, out),
            Format::Q4_1 => transpose_as::<Nibbles, T, 0>(weight, t, out),
            Format::Q5_0 => transpose_as::<FiveBits, T, 16>(weight, t, out),
            Format::Q5_1 => transpose_as::<FiveBits, T, 0>(weight, t, out),
            Format::Q8_0 => transpose_as::<Bytes, T, 128>(weight, t, out),
            Format::Q4_K | Format::Q5_K | Format::Q6_K => {
                unreachable!("a K-quant's tiles never reach the kernels of blocks of 32")
            }
        }
    }
}

#[inline(always)]
unsafe fn transpose_as<V: Values, T: Element, const ZERO: i32>(
    weight: &PackedMatrix<'_>,
    t: usize,
    out: *mut T,
) {
    let n = weight.out_features;
    let width = TILE.min(n - t * TILE);
    let scales_at = values_bytes(weight.format);
    // SAFETY: every tile block read lies inside the checked packed buffer; every row written
    // is below `in_features` and `store` writes `width` columns from `16t`, inside `out`.
    unsafe {
        let zero = _mm512_set1_ps(ZERO as f32);
        for b in 0..weight.in_features / BLOCK {
            let at = weight.bytes.as_ptr().add(weight.tile_block(t, b));
            let half = |offset: usize| _mm512_cvtph_ps(_mm256_loadu_si256(at.add(offset).cast()));
            let (d, m) = (half(scales_at), half(scales_at + 32));
            for h in 0..4 {
                for (part, group) in V::groups(at, h).into_iter().enumerate() {
                    let first = b * BLOCK + 4 * (h + 4 * part);
                    for (i, q) in transposed(group).into_iter().enumerate() {
                        // As `layout::dequantized`: d·(q - zero) for Q4_0, Q5_0 and Q8_0, d·q + m
                        // for Q4_1 and Q5_1, each rounded as written.
                        let value = if ZERO == 0 {
                            _mm512_add_ps(_mm512_mul_ps(d, q), m)
                        } else {
                            _mm512_mul_ps(d, _mm512_sub_ps(q, zero))
                        };
                        store(value, out.add((first + i) * n + t * TILE), width);
                    }
                }
            }
        }
    }
}
