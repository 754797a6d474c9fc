//! The AVX-512 VNNI kernel of `linear_packed_prefill`: per block, one `vpdpbusd` adds four
//! weights of each of a tile's 16 columns times four int8 activations (broadcast to every lane)
//! into the column's int32 lane, 8 per block and (row, tile); the lanes then turn into floats
//! and meet the scales (see `prefill.rs` for the arithmetic, which this follows operation for
//! operation).
//!
//! Register blocking: `ROWS` rows × `TILES` tiles of 16 columns share each loaded block, so a
//! decoded weight vector serves `ROWS` rows and a broadcast activation `TILES` tiles. Registers:
//! an int32 sum and a float sum per (row, tile) (2 × 12), two decoded groups per tile (4), the
//! broadcast activations and the nibble mask: 31 of 32. Per block and (row, tile) the float
//! work is a conversion, a multiply (the two scales), a fused multiply-add, and for Q4_1 a
//! second for its offsets. On Zen 4 the multiply and the fused multiply-adds share the two
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

use super::prefill::Job;
use super::vnni::{bias_lanes, store, Bytes, Nibbles, Values};
use super::{tile_block_bytes, values_bytes, BLOCK, TILE};
use crate::element::Element;
use crate::isa::{Avx512, Avx512Vnni};
use crate::quant::Format;

/// Rows of a register tile: the panels of `prefill.rs` hold a whole number of them.
pub(super) const ROWS: usize = 6;
/// Column tiles of a register tile.
const TILES: usize = 2;

/// Computes rows `rows` × tiles `tiles` of `job`.
///
/// # Safety
/// `job`'s pointers hold what `Job` says (checked by
/// `linear_packed_prefill`); no other thread writes these outputs.
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
            for t in 0..N {
                job.prefetch_tile_block(tile + N + t, b);
            }
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

/// `prefill::round_block` over blocks `blocks` of `x`, with AVX-512: the same values, units,
/// sums and totals, with fewer instructions per block. Four blocks at a time share the
/// reductions (their largest magnitudes and their totals folded together, the scales divided
/// in one vector); the largest magnitude and the finiteness test come from one integer maximum
/// of the magnitudes' bits, and the rounding is folded into the conversion. A non-finite
/// block's values are zeros, its unit and sum NaN, its total 0. Every block's 32 values are
/// written (never read), so `values` may start uninitialized.
///
/// # Safety
/// `x` holds the blocks `blocks`, `values` as many × 32 bytes,
/// `units`, `totals` and `sums` an entry per block (all indexed by the block's number).
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn round_blocks<T: Element>(
    _: Avx512,
    x: *const T,
    blocks: Range<usize>,
    values: *mut i8,
    units: *mut f32,
    totals: *mut i32,
    sums: *mut f32,
) {
    // SAFETY: every block `b` of `blocks` lies inside the buffers, as the caller guarantees.
    unsafe {
        let out = Rounded {
            values,
            units,
            totals,
            sums,
        };
        let mut b = blocks.start;
        while b + 4 <= blocks.end {
            let v: [[__m512i; 2]; 4] = std::array::from_fn(|i| load_block(x, b + i));
            let largest = fold4(v.map(|v| magnitude(v)), |a, c| _mm512_max_epu32(a, c));
            let floats = _mm_castsi128_ps(largest);
            let inverse = _mm_div_ps(_mm_set1_ps(127.0), floats);
            // Non-finite, all-zero and tiny blocks (whose scale overflows) take one at a time.
            let special = _mm_or_si128(
                _mm_or_si128(
                    _mm_cmpgt_epi32(largest, _mm_set1_epi32(0x7f7f_ffff)),
                    _mm_cmpeq_epi32(largest, _mm_setzero_si128()),
                ),
                _mm_castps_si128(_mm_cmpeq_ps(inverse, _mm_set1_ps(f32::INFINITY))),
            );
            if _mm_movemask_epi8(special) != 0 {
                for b in b..b + 4 {
                    round_one(x, b, &out);
                }
            } else {
                let mut scales = [0f32; 4];
                _mm_storeu_ps(scales.as_mut_ptr(), inverse);
                let wholes: [__m512i; 4] = std::array::from_fn(|i| {
                    round_values::<T>(v[i], scales[i], values.add((b + i) * BLOCK))
                });
                let total = fold4(wholes, |a, c| _mm512_add_epi32(a, c));
                let unit = _mm_div_ps(floats, _mm_set1_ps(127.0));
                _mm_storeu_ps(units.add(b), unit);
                _mm_storeu_si128(totals.add(b).cast(), total);
                _mm_storeu_ps(sums.add(b), _mm_mul_ps(unit, _mm_cvtepi32_ps(total)));
            }
            b += 4;
        }
        for b in b..blocks.end {
            round_one(x, b, &out);
        }
    }
}

/// Where `round_blocks` writes.
struct Rounded {
    values: *mut i8,
    units: *mut f32,
    totals: *mut i32,
    sums: *mut f32,
}

/// Block `b` of `x` as two vectors of float32 bits: its halves for float32, its even and odd
/// elements for bfloat16 (each pair's two halves of 32 bits: no widening shuffle, and
/// `round_values` narrows them back with one).
///
/// # Safety
/// As `round_blocks`, for block `b`.
#[inline(always)]
unsafe fn load_block<T: Element>(x: *const T, b: usize) -> [__m512i; 2] {
    // SAFETY: 32 elements at block `b` (f32, or 16-bit `Bf16` when `T::REDUCED`: the only
    // `Element`s), as the caller guarantees.
    unsafe {
        let at = x.add(b * BLOCK);
        if T::REDUCED {
            let pairs = _mm512_loadu_si512(at.cast());
            [
                _mm512_slli_epi32::<16>(pairs),
                _mm512_and_si512(pairs, _mm512_set1_epi32(0xffff_0000_u32 as i32)),
            ]
        } else {
            [
                _mm512_loadu_si512(at.cast()),
                _mm512_loadu_si512(at.add(16).cast()),
            ]
        }
    }
}

/// The magnitudes' bits of a block, folded to 16 lanes by their maximum. Magnitudes' bits
/// order as the magnitudes do, infinities and NaNs above every finite one.
#[inline(always)]
unsafe fn magnitude(v: [__m512i; 2]) -> __m512i {
    // SAFETY: register-only AVX-512 F operations; the caller has AVX-512 F.
    unsafe {
        let mask = _mm512_set1_epi32(0x7fff_ffff);
        _mm512_max_epu32(_mm512_and_si512(v[0], mask), _mm512_and_si512(v[1], mask))
    }
}

/// Lane `i` (of 4) of the result: every lane of `v[i]` combined with `op` (associative and
/// commutative: an integer maximum or sum).
#[inline(always)]
unsafe fn fold4(v: [__m512i; 4], op: impl Fn(__m512i, __m512i) -> __m512i) -> __m128i {
    // SAFETY: register-only AVX-512 F operations; the caller has AVX-512 F.
    unsafe {
        // 128-bit lanes 0, 1 of `a` and of `c` against lanes 2, 3: each vector in 2 lanes.
        let halves = |a, c| {
            op(
                _mm512_shuffle_i32x4::<0x44>(a, c),
                _mm512_shuffle_i32x4::<0xee>(a, c),
            )
        };
        let (p, q) = (halves(v[0], v[1]), halves(v[2], v[3]));
        // Then each vector in one 128-bit lane (lane i for `v[i]`), then in each element.
        let lanes = op(
            _mm512_shuffle_i32x4::<0x88>(p, q),
            _mm512_shuffle_i32x4::<0xdd>(p, q),
        );
        let pairs = op(lanes, _mm512_shuffle_epi32::<0x4e>(lanes));
        let all = op(pairs, _mm512_shuffle_epi32::<0xb1>(pairs));
        let first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm512_castsi512_si128(_mm512_permutexvar_epi32(first, all))
    }
}

/// A finite block `v` (as `load_block` gives it: halves, or even and odd elements when
/// `T::REDUCED`) times `inverse` (finite), clamped to ±127 and rounded, written as 32 int8 at `out`
/// in the block's order; returns the 16 lanes' sums of the two vectors' integers.
///
/// # Safety
/// `out` holds 32 bytes; the CPU has AVX-512 F and BW.
#[inline(always)]
unsafe fn round_values<T: Element>(v: [__m512i; 2], inverse: f32, out: *mut i8) -> __m512i {
    // SAFETY: register operations and a 32-byte store at `out`, as the caller guarantees.
    unsafe {
        let inverse = _mm512_set1_ps(inverse);
        let (lowest, highest) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        let whole = v.map(|v| {
            // Clamping to integers before rounding gives what rounding first does.
            let t = _mm512_min_ps(
                _mm512_max_ps(_mm512_mul_ps(_mm512_castsi512_ps(v), inverse), lowest),
                highest,
            );
            _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t)
        });
        if T::REDUCED {
            // Each lane's even and odd byte side by side in its low 16 bits, then narrowed.
            let pairs = _mm512_or_si512(
                _mm512_and_si512(whole[0], _mm512_set1_epi32(0xff)),
                _mm512_slli_epi32::<8>(whole[1]),
            );
            _mm256_storeu_si256(out.cast(), _mm512_cvtepi32_epi16(pairs));
        } else {
            // Saturating packs (exact: every value is within ±127) leave each 128-bit lane `i`
            // as the four bytes of `whole[0]`'s lane `i`, then `whole[1]`'s, twice over; the
            // permutation puts the 32 bytes in order.
            let bytes = _mm512_packs_epi16(
                _mm512_packs_epi32(whole[0], whole[1]),
                _mm512_setzero_si512(),
            );
            let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
            _mm256_storeu_si256(
                out.cast(),
                _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, bytes)),
            );
        }
        _mm512_add_epi32(whole[0], whole[1])
    }
}

/// Block `b` alone: `round_blocks` for one block.
///
/// # Safety
/// As `round_blocks`, for block `b`.
#[inline(always)]
unsafe fn round_one<T: Element>(x: *const T, b: usize, out: &Rounded) {
    // SAFETY: block `b` lies inside the buffers, as the caller guarantees.
    unsafe {
        let v = load_block(x, b);
        let largest = _mm512_reduce_max_epu32(magnitude(v));
        let values = out.values.add(b * BLOCK);
        let (unit, total) = if largest >= 0x7f80_0000 {
            std::ptr::write_bytes(values, 0, BLOCK);
            (f32::NAN, 0)
        } else if largest == 0 {
            std::ptr::write_bytes(values, 0, BLOCK);
            (0.0, 0)
        } else if 127.0 / f32::from_bits(largest) == f32::INFINITY {
            // Below 127 / f32::MAX the scale overflows and a zero times it is a NaN, which
            // the portable rounding turns into 0 and these instructions would clamp to -127:
            // such blocks take the portable rounding.
            let block = std::slice::from_raw_parts(x.add(b * BLOCK), BLOCK);
            let mut rounded = [0i8; BLOCK];
            let result = super::prefill::round_block(block, &mut rounded);
            std::ptr::copy_nonoverlapping(rounded.as_ptr(), values, BLOCK);
            result.unwrap_or((f32::NAN, 0))
        } else {
            let largest = f32::from_bits(largest);
            let whole = round_values::<T>(v, 127.0 / largest, values);
            (largest / 127.0, _mm512_reduce_add_epi32(whole))
        };
        *out.units.add(b) = unit;
        *out.totals.add(b) = total;
        *out.sums.add(b) = unit * total as f32;
    }
}
