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

use super::layout::values_bytes;
use super::vnni::{store_tiles, tile_groups, tile_halves, Bytes, FiveBits, Nibbles, Values};
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
    cpu: Avx512Vnni,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded; each format's values, zero point and offsets match `job.format`.
    unsafe {
        match job.format {
            Format::Q8_0 => run_as::<Bytes, T, 128, false>(job, rows, tiles, None),
            Format::Q4_0 => run_as::<Nibbles, T, 8, false>(job, rows, tiles, None),
            Format::Q4_1 => run_as::<Nibbles, T, 0, true>(job, rows, tiles, None),
            Format::Q5_0 => widened_or::<FiveBits, T, 16, false>(cpu, job, rows, tiles),
            Format::Q5_1 => widened_or::<FiveBits, T, 0, true>(cpu, job, rows, tiles),
            Format::Q4_K | Format::Q5_K | Format::Q6_K => {
                unreachable!("a K-quant's tiles never reach the kernels of blocks of 32")
            }
        }
    }
}

/// Where a register tile reads its tile blocks: the weight's own tiles, or a copy of some of
/// them with the values widened to bytes (`widen`).
struct Tiles {
    at: *const u8,
    /// The tile at `at`.
    first: usize,
    blocks: usize,
    stride: usize,
    scales_at: usize,
    /// Whether to prefetch the next tiles' blocks (`Job::prefetch_tile_block`): for the
    /// weight's own tiles, whose next blocks may come from memory.
    prefetch: bool,
}

impl Tiles {
    fn own<T>(job: &Job<T>) -> Self {
        let (blocks, stride, scales_at) = job.tile_geometry();
        Tiles {
            at: job.weight,
            first: 0,
            blocks,
            stride,
            scales_at,
            prefetch: true,
        }
    }

    /// Block `b` of tiles `tile..tile + N`.
    ///
    /// # Safety
    /// The tiles and the block lie inside these tiles.
    #[inline(always)]
    unsafe fn blocks<const N: usize>(&self, tile: usize, b: usize) -> [*const u8; N] {
        let at = |t: usize| ((tile - self.first + t) * self.blocks + b) * self.stride;
        // SAFETY: the caller's promise.
        std::array::from_fn(|t| unsafe { self.at.add(at(t)) })
    }
}

/// The fewest rows of a work item whose Q5_0 and Q5_1 tiles are widened to bytes first, two
/// tiles at a time: each register tile of rows that passes over a tile block decodes its
/// nibbles and fifth bits again (7 vector operations per 8 `vpdpbusd` of a register tile's
/// row), where widened values are only loaded; the widening costs about one such decoding.
/// Measured (SmolLM2's Q5_0 projections, bf16 rows, best of 5 calls, the two interleaved 7
/// times, Zen 4, GOP/s at 64 / 256 / 2048 rows): gate_up 522 / 519 / 484 -> 571 / 556 / 555,
/// qkv 482 / 544 / 506 -> 502 / 577 / 540, ffn_down's shape 480 / 549 / 495 -> 515 / 571 /
/// 527; a prefill pass of SmolLM2's Q4_K_M file (8 x 256 tokens) 1255 -> 1170 ms. Q4_0 and
/// Q4_1, whose nibbles cost three operations, measured slower widened.
const WIDEN_ROWS: usize = 8 * ROWS;

std::thread_local! {
    /// Each thread's widened tiles, reused from one register tile of columns to the next.
    static WIDENED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `run_as`, widening each group of tiles to bytes first when `rows` are many.
#[inline(always)]
unsafe fn widened_or<V: Values, T: Element, const ZERO: i32, const OFFSET: bool>(
    cpu: Avx512Vnni,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    if rows.len() < WIDEN_ROWS {
        // SAFETY: forwarded.
        unsafe { run_as::<V, T, ZERO, OFFSET>(job, rows, tiles, None) };
        return;
    }
    // SAFETY: forwarded (a closure does not take the target features of the function it is
    // in: the work runs in a function of its own that has them).
    WIDENED.with_borrow_mut(|widened| unsafe {
        run_widened::<V, T, ZERO, OFFSET>(cpu, job, rows, tiles, widened)
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
unsafe fn run_widened<V: Values, T: Element, const ZERO: i32, const OFFSET: bool>(
    _: Avx512Vnni,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
    widened: &mut Vec<u8>,
) {
    // SAFETY: forwarded.
    unsafe { run_as::<V, T, ZERO, OFFSET>(job, rows, tiles, Some(widened)) }
}

/// Rows `rows` of tiles `tiles`, `TILES` tiles at a time: read from the weight, or, given
/// `widened`, from each group's copy widened there.
#[inline(always)]
unsafe fn run_as<V: Values, T: Element, const ZERO: i32, const OFFSET: bool>(
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
    mut widened: Option<&mut Vec<u8>>,
) {
    let own = Tiles::own(job);
    let mut tile = tiles.start;
    // SAFETY: every (row, tile) below lies inside `rows` × `tiles`, the caller's.
    unsafe {
        while tile < tiles.end {
            let group = tile..(tile + TILES).min(tiles.end);
            let whole = group.len() == TILES;
            match widened.as_deref_mut() {
                Some(widened) => {
                    let from = widen::<V, T>(job, group.clone(), widened);
                    match whole {
                        true => panel::<Bytes, T, ZERO, OFFSET, TILES>(job, &from, &rows, tile),
                        false => panel::<Bytes, T, ZERO, OFFSET, 1>(job, &from, &rows, tile),
                    }
                }
                None => match whole {
                    true => panel::<V, T, ZERO, OFFSET, TILES>(job, &own, &rows, tile),
                    false => panel::<V, T, ZERO, OFFSET, 1>(job, &own, &rows, tile),
                },
            }
            tile = group.end;
        }
    }
}

/// Tiles `tiles` of `job`'s weight in `widened`, each block's values as `Bytes` reads Q8_0's
/// (group `h` of four weights at `64 h`, group `h + 4` at `64 (h + 4)`), its scales after them.
///
/// # Safety
/// `tiles` lie inside the weight, whose values `V` reads.
#[inline(always)]
unsafe fn widen<V: Values, T>(job: &Job<T>, tiles: Range<usize>, widened: &mut Vec<u8>) -> Tiles {
    let own = Tiles::own(job);
    let scales = own.stride - own.scales_at;
    let values = values_bytes(Format::Q8_0);
    let stride = values + scales;
    widened.resize(tiles.len() * own.blocks * stride, 0);
    let out = widened.as_mut_ptr();
    // SAFETY: every block read lies inside `tiles`, every write inside `widened`.
    unsafe {
        for tile in tiles.clone() {
            for b in 0..own.blocks {
                let [from] = own.blocks::<1>(tile, b);
                let to = out.add(((tile - tiles.start) * own.blocks + b) * stride);
                for h in 0..4 {
                    let [low, high] = V::groups(from, h);
                    _mm512_storeu_si512(to.add(64 * h).cast(), low);
                    _mm512_storeu_si512(to.add(64 * (h + 4)).cast(), high);
                }
                std::ptr::copy_nonoverlapping(from.add(own.scales_at), to.add(values), scales);
            }
        }
    }
    Tiles {
        at: out,
        first: tiles.start,
        blocks: own.blocks,
        stride,
        scales_at: values,
        prefetch: false,
    }
}

/// Rows `rows` of tiles `tile..tile + N`, a register tile of `ROWS` rows at a time.
#[inline(always)]
unsafe fn panel<V: Values, T: Element, const ZERO: i32, const OFFSET: bool, const N: usize>(
    job: &Job<T>,
    from: &Tiles,
    rows: &Range<usize>,
    tile: usize,
) {
    // SAFETY: as `run_as`.
    unsafe {
        let mut row = rows.start;
        while row < rows.end {
            let count = ROWS.min(rows.end - row);
            match count {
                ROWS => micro::<V, T, ZERO, OFFSET, ROWS, N>(job, from, row, tile),
                1 => micro::<V, T, ZERO, OFFSET, 1, N>(job, from, row, tile),
                2 => micro::<V, T, ZERO, OFFSET, 2, N>(job, from, row, tile),
                3 => micro::<V, T, ZERO, OFFSET, 3, N>(job, from, row, tile),
                4 => micro::<V, T, ZERO, OFFSET, 4, N>(job, from, row, tile),
                _ => micro::<V, T, ZERO, OFFSET, 5, N>(job, from, row, tile),
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
    from: &Tiles,
    row: usize,
    tile: usize,
) {
    let k = job.in_features;
    let (blocks, scales_at) = (from.blocks, from.scales_at);
    // SAFETY: the caller keeps rows and tiles inside the job, so every offset below stays
    // inside the buffers `Job` describes; loads and stores are unaligned ones.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        for b in 0..blocks {
            let base = from.blocks::<N>(tile, b);
            if from.prefetch {
                for t in 0..N {
                    job.prefetch_tile_block(tile + N + t, b);
                }
            }
            let mut dot = [[_mm512_setzero_si512(); N]; R];
            for h in 0..4 {
                let w = tile_groups::<V, N>(&base, h);
                for (r, dot) in dot.iter_mut().enumerate() {
                    let at = job.whole.add((row + r) * k + b * BLOCK + 4 * h);
                    let four = |at: *const i8| _mm512_set1_epi32(at.cast::<i32>().read_unaligned());
                    let (a, a2) = (four(at), four(at.add(16)));
                    for (dot, w) in dot.iter_mut().zip(&w) {
                        *dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(*dot, w[0], a), w[1], a2);
                    }
                }
            }
            let d = tile_halves(&base, scales_at);
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
                let m = tile_halves(&base, scales_at + 32);
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
