//! The SIMD kernels of the K-quants' tiles: one driver over the tiers, which give only their
//! instructions on `Lanes::WIDTH` columns ([`Lanes`]: AVX-512 VNNI the whole tile of 16,
//! AVX2 and AVX-VNNI half of it). The driver follows `k_kernel.rs`'s arithmetic operation for
//! operation, so every tier equals the portable kernel bit for bit.
//!
//! Per sub-block of 32 (Q6_K: per half of 16), each group of four weights of the columns is
//! one vector of bytes, four per column: its low nibbles masked out of the tile's nibble bytes
//! and, for Q5_K and Q6_K, its high bits shifted out of their plane onto bit 4 (one 16-bit
//! shift and a byte mask: the bits that the shift carries across bytes land outside the mask,
//! see `shifted`). A tier multiplies it with four activations broadcast to every column and
//! adds each column's four products into its int32 lane (`Lanes::dot`); the sums then meet
//! the scales as in `k_kernel.rs`. Q6_K's halves of split rows run one after the other, so
//! that the registers hold as many sums as Q4_K's; of one-int8 rows, side by side, their
//! scales applied in integers (`k_q6.rs`).
//!
//! Register tiles: `R` rows share each loaded group; `N` column tiles run side by side with few
//! rows (enough independent sums hide the products' latency) and one-int8 rows on AVX-512.
//!
//! Trait methods, not closures, carry the instructions: a closure does not take the target
//! features of the function it is inlined into, and an intrinsic called from one is a call.

use std::ops::Range;

use super::k_layout::{halves_at, mins_at, plane_bytes, scales_at, NIBBLES};
use super::k_q6;
use super::vnni::even_row_tiles;
use super::{tile_block_bytes, Job, BLOCK, TILE};
use crate::element::Element;
use crate::quant::{Format, SUPER_BLOCK};

/// A tier's instructions on `WIDTH` columns of a tile.
pub(super) trait Lanes: Copy {
    /// Columns per vector (16 or 8).
    const WIDTH: usize;
    /// Whether the tier has 32 vector registers (wider register tiles), or 16.
    const WIDE: bool;
    /// Four bytes per column.
    type Bytes: Copy;
    /// An int32 per column.
    type Sum: Copy;
    /// A float32 per column.
    type Float: Copy;

    /// The `4·WIDTH` bytes at `at`.
    ///
    /// # Safety
    /// `at` holds `4·WIDTH` readable bytes; the CPU has the tier's instructions.
    unsafe fn load(self, at: *const u8) -> Self::Bytes;
    /// Zero bytes.
    unsafe fn zero_bytes(self) -> Self::Bytes;
    /// Each byte of `v` and `mask`.
    unsafe fn and(self, v: Self::Bytes, mask: u8) -> Self::Bytes;
    /// Each byte of `a` or `b`.
    unsafe fn or(self, a: Self::Bytes, b: Self::Bytes) -> Self::Bytes;
    /// Each 16-bit lane of `v` shifted left by `S` bits.
    unsafe fn shift_left<const S: u32>(self, v: Self::Bytes) -> Self::Bytes;
    /// Each 16-bit lane of `v` shifted right (logically) by `S` bits.
    unsafe fn shift_right<const S: u32>(self, v: Self::Bytes) -> Self::Bytes;
    /// Zero sums.
    unsafe fn zero(self) -> Self::Sum;
    /// `sum` plus, per column, its four unsigned bytes of `w` times the four int8 at `a`.
    ///
    /// # Safety
    /// `a` holds 4 readable bytes; the CPU has the tier's instructions.
    unsafe fn dot(self, sum: Self::Sum, w: Self::Bytes, a: *const i8) -> Self::Sum;
    /// `dot` of `w[0]` with the int8 at `a`, then where `two` of `w[1]` with those at `a + 16`
    /// (a sub-block's two groups, which a tier may add up together).
    unsafe fn dots(self, sum: Self::Sum, w: [Self::Bytes; 2], a: *const i8, two: bool)
        -> Self::Sum;
    /// `(high << 8) + low - zero`, per column.
    unsafe fn combine(self, high: Self::Sum, low: Self::Sum, zero: i32) -> Self::Sum;
    /// `a + b`, per column.
    unsafe fn add(self, a: Self::Sum, b: Self::Sum) -> Self::Sum;
    /// `sum` times the `WIDTH` signed bytes at `at`, per column (the low 32 bits).
    ///
    /// # Safety
    /// `at` holds `WIDTH` readable bytes; the CPU has the tier's instructions.
    unsafe fn times_signed(self, sum: Self::Sum, at: *const u8) -> Self::Sum;
    /// Zero floats.
    unsafe fn zero_float(self) -> Self::Float;
    /// `v` in every column.
    unsafe fn splat(self, v: f32) -> Self::Float;
    /// The `WIDTH` halves at `at` as floats.
    ///
    /// # Safety
    /// `at` holds `2·WIDTH` readable bytes; the CPU has the tier's instructions.
    unsafe fn halves(self, at: *const u8) -> Self::Float;
    /// The `WIDTH` bytes at `at`, signed or unsigned, as floats.
    ///
    /// # Safety
    /// `at` holds `WIDTH` readable bytes; the CPU has the tier's instructions.
    unsafe fn small(self, at: *const u8, signed: bool) -> Self::Float;
    /// `a · b`, rounded.
    unsafe fn mul(self, a: Self::Float, b: Self::Float) -> Self::Float;
    /// `fma(float(sum), scale, acc)`: the sum converted to float (rounded), times the scale
    /// plus `acc`, rounded once.
    unsafe fn scale_add(self, sum: Self::Sum, scale: Self::Float, acc: Self::Float) -> Self::Float;
    /// `fma(-a, b, acc)`.
    unsafe fn sub_product(self, a: Self::Float, b: Self::Float, acc: Self::Float) -> Self::Float;
    /// `acc` plus the bias of columns `column..column + width` (zeros where `bias` is null),
    /// stored as `T` at `target`.
    ///
    /// # Safety
    /// `target` holds `width` (at most `WIDTH`) elements and a non-null `bias` `column + width`
    /// floats; the CPU has the tier's instructions.
    unsafe fn store<T: Element>(
        self,
        acc: Self::Float,
        bias: *const f32,
        column: usize,
        target: *mut T,
        width: usize,
    );
}

/// How a K-quant's groups of values come out of its tile.
pub(super) trait KFormat {
    /// Integer sums per sub-block of 32: 1, or Q6_K's 2 halves.
    const PARTS: usize;
    /// Whether the format has mins (Q4_K, Q5_K).
    const MINS: bool;
    /// The value that stands for weight 0 (Q6_K's 32).
    const ZERO: i32;
    /// The format.
    const FORMAT: Format;

    /// The groups at `h` (0..4) of sub-block `j` of the tile super-block at `at`, for the
    /// columns `offset / 4..` of the tile: part `p`'s group `h + 4p` where a sub-block has two
    /// parts (in both elements), else groups `h` and `h + 4`.
    ///
    /// # Safety
    /// `at` points at a tile super-block of the format; the CPU has `L`'s instructions.
    unsafe fn groups<L: Lanes>(
        isa: L,
        at: *const u8,
        j: usize,
        h: usize,
        p: usize,
        offset: usize,
    ) -> [L::Bytes; 2];
}

/// `v`'s one-bit or two-bit fields moved onto bit 4 by a 16-bit shift of `shift` bits (positive:
/// left), then masked by `mask`. Shifting left by `s` ≤ 4 carries the byte below's top bits
/// into bits `0..s`, and right by `s` ≤ 3 the byte above's low bits into bits `8-s..8`: the
/// masks (bit 4, or bits 4 and 5 where the right shift is by 2 at most) never cover them.
#[inline(always)]
unsafe fn shifted<L: Lanes>(isa: L, v: L::Bytes, shift: i32, mask: u8) -> L::Bytes {
    // SAFETY: register-only operations of the caller's tier.
    unsafe {
        let moved = match shift {
            4 => isa.shift_left::<4>(v),
            3 => isa.shift_left::<3>(v),
            2 => isa.shift_left::<2>(v),
            1 => isa.shift_left::<1>(v),
            0 => v,
            -1 => isa.shift_right::<1>(v),
            -2 => isa.shift_right::<2>(v),
            _ => isa.shift_right::<3>(v),
        };
        isa.and(moved, mask)
    }
}

/// The low nibbles, then the high ones, of the 64 bytes at `h` of sub-block `j`: groups `h` and
/// `h + 4`'s low four bits.
#[inline(always)]
unsafe fn nibbles<L: Lanes>(
    isa: L,
    at: *const u8,
    j: usize,
    h: usize,
    offset: usize,
) -> [L::Bytes; 2] {
    // SAFETY: the nibbles of sub-block `j` lie at `256j` of the tile super-block.
    unsafe {
        let v = isa.load(at.add(256 * j + 64 * h + offset));
        [isa.and(v, 0x0f), isa.and(isa.shift_right::<4>(v), 0x0f)]
    }
}

/// Q4_K: the nibbles alone.
pub(super) struct Q4K;
/// Q5_K: the nibbles and a bit plane.
pub(super) struct Q5K;
/// Q6_K: the nibbles and a plane of two-bit fields, a sub-block in two halves.
pub(super) struct Q6K;

impl KFormat for Q4K {
    const PARTS: usize = 1;
    const MINS: bool = true;
    const ZERO: i32 = 0;
    const FORMAT: Format = Format::Q4_K;

    #[inline(always)]
    unsafe fn groups<L: Lanes>(
        isa: L,
        at: *const u8,
        j: usize,
        h: usize,
        _: usize,
        offset: usize,
    ) -> [L::Bytes; 2] {
        // SAFETY: as the caller guarantees.
        unsafe { nibbles(isa, at, j, h, offset) }
    }
}

impl KFormat for Q5K {
    const PARTS: usize = 1;
    const MINS: bool = true;
    const ZERO: i32 = 0;
    const FORMAT: Format = Format::Q5_K;

    #[inline(always)]
    unsafe fn groups<L: Lanes>(
        isa: L,
        at: *const u8,
        j: usize,
        h: usize,
        _: usize,
        offset: usize,
    ) -> [L::Bytes; 2] {
        // SAFETY: as the caller guarantees; sub-block `j`'s plane lies after the nibbles.
        unsafe {
            let [low, high] = nibbles(isa, at, j, h, offset);
            let bits = isa.load(at.add(NIBBLES + plane_bytes(Format::Q5_K) * j + offset));
            // Group `h`'s bit `h` and group `h + 4`'s bit `h + 4` onto bit 4.
            let h = h as i32;
            [
                isa.or(low, shifted(isa, bits, 4 - h, 0x10)),
                isa.or(high, shifted(isa, bits, -h, 0x10)),
            ]
        }
    }
}

impl KFormat for Q6K {
    const PARTS: usize = 2;
    const MINS: bool = false;
    const ZERO: i32 = 32;
    const FORMAT: Format = Format::Q6_K;

    #[inline(always)]
    unsafe fn groups<L: Lanes>(
        isa: L,
        at: *const u8,
        j: usize,
        h: usize,
        p: usize,
        offset: usize,
    ) -> [L::Bytes; 2] {
        // SAFETY: as the caller guarantees; sub-block `j`'s plane lies after the nibbles.
        unsafe {
            let low = nibbles(isa, at, j, h, offset)[p];
            let plane = NIBBLES + plane_bytes(Format::Q6_K) * j + 64 * (h / 2);
            let bits = isa.load(at.add(plane + offset));
            // The field `2·(h % 2) + p` (bits `2f..2f+2`) onto bits 4 and 5.
            let field = (2 * (h % 2) + p) as i32;
            let group = isa.or(low, shifted(isa, bits, 4 - 2 * field, 0x30));
            [group, group]
        }
    }
}

/// Rows `rows` of tiles `tiles` of `job`, with `isa`'s instructions. Inlined into each tier's
/// function, which enables its instructions.
///
/// # Safety
/// `job`'s lengths are checked (`first_halves` filled for Q6_K) and its format is `F`'s;
/// `rows` lie inside the job; no other thread writes the outputs of `rows` × `tiles`; the
/// CPU has `isa`'s instructions.
#[inline(always)]
pub(super) unsafe fn run<L: Lanes, F: KFormat, T: Element>(
    isa: L,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded; `rest` is read only where the rows are split.
    unsafe {
        if job.split {
            run_rows::<L, F, T, true>(isa, job, rows, tiles)
        } else {
            run_rows::<L, F, T, false>(isa, job, rows, tiles)
        }
    }
}

/// `run` on rows split into two int8 parts (`SPLIT`) or rounded to one.
#[inline(always)]
unsafe fn run_rows<L: Lanes, F: KFormat, T: Element, const SPLIT: bool>(
    isa: L,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // One-int8 rows on AVX-512 take 5 × 2: each broadcast activation serves two tiles (6 × 1:
    // one per product). Zen 4, ffn_down's shape at 2048 rows, interleaved 5 times in one
    // process, GOP/s: Q4_K 536 -> 557, Q5_K 516 -> 537, Q6_K 386 -> 454.
    let most = if L::WIDE { 6 - usize::from(!SPLIT) } else { 4 };
    for (first, count) in even_row_tiles(rows.len(), most) {
        let (row, rows, tiles) = (rows.start + first, count, tiles.clone());
        // SAFETY: rows `row..row + rows` and `tiles` lie inside the job and this thread's
        // share, as the caller guarantees.
        unsafe {
            match (L::WIDE, rows) {
                (true, 1) => span::<L, F, T, SPLIT, 1, 4>(isa, job, row, tiles),
                (true, 2) => span::<L, F, T, SPLIT, 2, 2>(isa, job, row, tiles),
                (true, 3) => span::<L, F, T, SPLIT, 3, 2>(isa, job, row, tiles),
                (true, 4) if !SPLIT => span::<L, F, T, SPLIT, 4, 2>(isa, job, row, tiles),
                (true, 5) if !SPLIT => span::<L, F, T, SPLIT, 5, 2>(isa, job, row, tiles),
                (true, 4) => span::<L, F, T, SPLIT, 4, 1>(isa, job, row, tiles),
                (true, 5) => span::<L, F, T, SPLIT, 5, 1>(isa, job, row, tiles),
                (true, _) => span::<L, F, T, SPLIT, 6, 1>(isa, job, row, tiles),
                (false, 1) => span::<L, F, T, SPLIT, 1, 2>(isa, job, row, tiles),
                (false, 2) => span::<L, F, T, SPLIT, 2, 1>(isa, job, row, tiles),
                (false, 3) => span::<L, F, T, SPLIT, 3, 1>(isa, job, row, tiles),
                (false, _) => span::<L, F, T, SPLIT, 4, 1>(isa, job, row, tiles),
            }
        }
    }
}

/// Rows `row..row + R` over `tiles`, `N` tiles at a time, the tiles short of `N` one by one,
/// each tile `WIDTH` columns at a time.
#[inline(always)]
unsafe fn span<
    L: Lanes,
    F: KFormat,
    T: Element,
    const SPLIT: bool,
    const R: usize,
    const N: usize,
>(
    isa: L,
    job: &Job<T>,
    row: usize,
    tiles: Range<usize>,
) {
    let mut tile = tiles.start;
    // SAFETY: every tile lies inside `tiles` and the rows inside the job, as the caller's.
    unsafe {
        while tile + N <= tiles.end {
            for part in 0..TILE / L::WIDTH {
                rows::<L, F, T, SPLIT, R, N>(isa, job, row, tile, part);
            }
            tile += N;
        }
        while tile < tiles.end {
            for part in 0..TILE / L::WIDTH {
                rows::<L, F, T, SPLIT, R, 1>(isa, job, row, tile, part);
            }
            tile += 1;
        }
    }
}

/// Output rows `row..row + R` of the columns `part·WIDTH..(part + 1)·WIDTH` of tiles
/// `tile..tile + N`.
#[inline(always)]
unsafe fn rows<
    L: Lanes,
    F: KFormat,
    T: Element,
    const SPLIT: bool,
    const R: usize,
    const N: usize,
>(
    isa: L,
    job: &Job<T>,
    row: usize,
    tile: usize,
    part: usize,
) {
    let (k, format) = (job.in_features, F::FORMAT);
    let (blocks, supers) = (k / BLOCK, k / SUPER_BLOCK);
    let stride = tile_block_bytes(format);
    // Where this part's columns start in a group's 64 bytes, a sub-block's 16 scale bytes and
    // the 16 halves.
    let offset = 4 * L::WIDTH * part;
    let (scales, mins) = (
        scales_at(format) + L::WIDTH * part,
        mins_at(format) + L::WIDTH * part,
    );
    let d_at = halves_at(format) + 2 * L::WIDTH * part;
    // SAFETY: the caller keeps rows and tiles inside the job, so every offset below stays
    // inside the buffers `Job` describes (a tile super-block's fields, the rows' activations
    // and per-block values); loads and stores are unaligned ones.
    unsafe {
        let mut acc = [[isa.zero_float(); N]; R];
        for s in 0..supers {
            let mut base = [job.weight; N];
            for (t, base) in base.iter_mut().enumerate() {
                *base = job.weight.add(((tile + t) * supers + s) * stride);
            }
            for j in 0..8 {
                let b = 8 * s + j;
                if F::PARTS == 2 && !SPLIT {
                    let at = k_q6::Block {
                        base: &base,
                        row,
                        j,
                        b,
                        offset,
                        scales,
                        d_at,
                    };
                    k_q6::halves_in_integers::<L, F, T, R, N>(isa, job, &at, &mut acc);
                    continue;
                }
                for p in 0..F::PARTS {
                    let mut high = [[isa.zero(); N]; R];
                    let mut low = [[isa.zero(); N]; R];
                    for h in 0..4 {
                        let mut w = [[isa.zero_bytes(); 2]; N];
                        for t in 0..N {
                            w[t] = F::groups(isa, base[t], j, h, p, offset);
                        }
                        for r in 0..R {
                            let at = (row + r) * k + b * BLOCK + 4 * h + 16 * p;
                            let a = job.whole.add(at);
                            for t in 0..N {
                                high[r][t] = isa.dots(high[r][t], w[t], a, F::PARTS == 1);
                            }
                            if SPLIT {
                                let c = job.rest.add(at);
                                for t in 0..N {
                                    low[r][t] = isa.dots(low[r][t], w[t], c, F::PARTS == 1);
                                }
                            }
                        }
                    }
                    let sub = F::PARTS * j + p;
                    let mut scale = [isa.zero_float(); N];
                    let mut min = [isa.zero_float(); N];
                    for t in 0..N {
                        let d = isa.halves(base[t].add(d_at));
                        // Q6_K's scales are signed, Q4_K's and Q5_K's not.
                        let sc = isa.small(base[t].add(scales + TILE * sub), !F::MINS);
                        scale[t] = isa.mul(d, sc);
                        if F::MINS {
                            let dmin = isa.halves(base[t].add(d_at + 2 * TILE));
                            let m = isa.small(base[t].add(mins + TILE * j), false);
                            min[t] = isa.mul(dmin, m);
                        }
                    }
                    for r in 0..R {
                        let at = (row + r) * blocks + b;
                        let unit = isa.splat(*job.units.add(at));
                        let zero = if F::ZERO == 0 {
                            0
                        } else {
                            let first = *job.first_halves.add(at);
                            let total = if p == 0 {
                                first
                            } else {
                                *job.totals.add(at) - first
                            };
                            F::ZERO * total
                        };
                        let sums = isa.splat(*job.sums.add(at));
                        for t in 0..N {
                            // One-int8 rows: `high` alone, as `combine`'s low sum below no high.
                            let sum = if SPLIT {
                                isa.combine(high[r][t], low[r][t], zero)
                            } else {
                                isa.combine(isa.zero(), high[r][t], zero)
                            };
                            acc[r][t] = isa.scale_add(sum, isa.mul(scale[t], unit), acc[r][t]);
                            if F::MINS {
                                acc[r][t] = isa.sub_product(min[t], sums, acc[r][t]);
                            }
                        }
                    }
                }
            }
        }
        for t in 0..N {
            let column = (tile + t) * TILE + L::WIDTH * part;
            if column >= job.out_features {
                continue;
            }
            let width = L::WIDTH.min(job.out_features - column);
            for (r, acc) in acc.iter().enumerate() {
                let target = job.out.add((row + r) * job.out_features + column);
                isa.store(acc[t], job.bias, column, target, width);
            }
        }
    }
}
