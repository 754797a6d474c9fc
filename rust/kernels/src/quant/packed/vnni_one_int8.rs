//! The AVX-512 VNNI kernel of `linear_packed_one_int8`: per block, one `vpdpbusd` adds four
//! weights of each of a tile's 16 columns times four int8 activations (broadcast to every lane)
//! into the column's int32 lane, 8 per block and (row, tile); the lanes then turn into floats
//! and meet the scales (see `one_int8.rs` for the arithmetic, which this follows operation for
//! operation).
//!
//! Register blocking: `ROWS` rows × `TILES` tiles of 16 columns share each loaded block, so a
//! decoded weight vector serves `ROWS` rows and a broadcast activation `TILES` tiles. Registers:
//! an int32 sum and a float sum per (row, tile) (2 × 12), two decoded groups per tile (4), the
//! broadcast activations and the nibble mask: 31 of 32. Per block and (row, tile) the float
//! work is a conversion, a multiply (the two scales), a fused multiply-add, and for Q4_1 and
//! Q5_1 a second for their offsets. On Zen 4 the multiply and the fused multiply-adds share the two
//! pipes of `vpdpbusd` (the conversion does not), so Q4_1 runs at most 8 of 11 cycles'
//! `vpdpbusd` whatever the blocking; one core measured 290-300 GOP/s of 434 (a loop of
//! `vpdpbusd` alone), 69%. 6 × 2 measured 2-4% above 12 × 1 (SmolLM2's shapes, 256 and 2048
//! rows, interleaved): each broadcast activation serves two tiles, where 12 × 1 spent one
//! load-and-broadcast per `vpdpbusd`.
//!
//! The sums stay in registers from the first block to the stores: the stores and the bias are
//! masked loads and stores, not copies (a call, across which every vector register would be
//! spilled).

use std::arch::x86_64::*;
use std::ops::Range;

use super::vnni::{store_tiles, tile_blocks, Bytes, FiveBits, Nibbles, Values};
use super::Job;
use super::BLOCK;
use crate::element::Element;
use crate::isa::Avx512Vnni;
use crate::quant::Format;

/// Rows of a register tile: the panels of `one_int8.rs` hold a whole number of them.
pub(super) const ROWS: usize = 6;
/// Column tiles of a register tile.
const TILES: usize = 2;

/// Computes rows `rows` × tiles `tiles` of `job`.
///
/// # Safety
/// `job`'s pointers hold what `Job` says (checked by
/// `linear_packed_one_int8`); no other thread writes these outputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
pub(super) unsafe fn run<T: Element>(
    _: Avx512Vnni,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded; each format's values, zero point and offsets match `job.format`.
    unsafe {
        match job.format {
            Format::Q8_0 => run_as::<Bytes, T, 128, false>(job, rows, tiles),
            Format::Q4_0 => run_as::<Nibbles, T, 8, false>(job, rows, tiles),
            Format::Q4_1 => run_as::<Nibbles, T, 0, true>(job, rows, tiles),
            Format::Q5_0 => run_as::<FiveBits, T, 16, false>(job, rows, tiles),
            Format::Q5_1 => run_as::<FiveBits, T, 0, true>(job, rows, tiles),
            Format::Q4_K | Format::Q5_K | Format::Q6_K => {
                unreachable!("a K-quant's tiles never reach the kernels of blocks of 32")
            }
        }
    }
}

#[inline(always)]
unsafe fn run_as<V: Values, T: Element, const ZERO: i32, const OFFSET: bool>(
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: every (row, tile) below lies inside `rows` × `tiles`, the caller's.
    unsafe {
        let mut tile = tiles.start;
        while tile + TILES <= tiles.end {
            panel::<V, T, ZERO, OFFSET, TILES>(job, rows.clone(), tile);
            tile += TILES;
        }
        if tile < tiles.end {
            panel::<V, T, ZERO, OFFSET, 1>(job, rows, tile);
        }
    }
}

/// Rows `rows` of tiles `tile..tile + N`, a register tile of `ROWS` rows at a time.
#[inline(always)]
unsafe fn panel<V: Values, T: Element, const ZERO: i32, const OFFSET: bool, const N: usize>(
    job: &Job<T>,
    rows: Range<usize>,
    tile: usize,
) {
    // SAFETY: as `run_as`.
    unsafe {
        let mut row = rows.start;
        while row < rows.end {
            let count = ROWS.min(rows.end - row);
            match count {
                ROWS => micro::<V, T, ZERO, OFFSET, ROWS, N>(job, row, tile),
                1 => micro::<V, T, ZERO, OFFSET, 1, N>(job, row, tile),
                2 => micro::<V, T, ZERO, OFFSET, 2, N>(job, row, tile),
                3 => micro::<V, T, ZERO, OFFSET, 3, N>(job, row, tile),
                4 => micro::<V, T, ZERO, OFFSET, 4, N>(job, row, tile),
                _ => micro::<V, T, ZERO, OFFSET, 5, N>(job, row, tile),
            }
            row += count;
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
    let (blocks, stride, scales_at) = job.tile_geometry();
    // SAFETY: the caller keeps rows and tiles inside the job, so every offset below stays
    // inside the buffers `Job` describes; loads and stores are unaligned ones.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        for b in 0..blocks {
            let base = tile_blocks::<T, N>(job, tile, b, blocks, stride);
            for t in 0..N {
                job.prefetch_tile_block(tile + N + t, b);
            }
            let mut dot = [[_mm512_setzero_si512(); N]; R];
            for h in 0..4 {
                let w: [[__m512i; 2]; N] = std::array::from_fn(|t| V::groups(base[t], h));
                for (r, dot) in dot.iter_mut().enumerate() {
                    let at = job.whole.add((row + r) * k + b * BLOCK + 4 * h);
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
        store_tiles(job, &acc, row, tile);
    }
}
