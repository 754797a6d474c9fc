//! The two products of a tile on AMX-BF16's tiles, the online softmax between them in AVX-512
//! BF16 (`avx512.rs`): one `tdpbf16ps` multiplies 16 pairs of each of a tile's rows by 16 pairs
//! of 16 keys (or of 16 columns of values) into the tile's float32 sums, where `vdpbf16ps`
//! takes 16 such products per row and broadcast pair.
//!
//! The packed K and V blocks (`kernels::PackedBlock`) are already what a tile's second operand
//! reads: for 16 keys of a 32-key slab, the pairs of 16 consecutive dimensions are 16 rows of
//! 64 bytes, 128 bytes apart (`key_index`); for 16 columns of a 32-column slab, the pairs of
//! 16 consecutive key pairs likewise (`value_index`). The weights of a tile's rows are rows of
//! `BLOCK_KEYS`; its queries, which lie apart in `q`, are copied into rows of `d` first.
//!
//! Arithmetic: float32 sums of exact bf16 products as `vdpbf16ps` keeps them, but summed in
//! the tile unit's order (each pair's first product before its second, then the next pair),
//! so the results are within float32 rounding of the vector kernel's, not bit-identical.
//!
//! The tile instructions are inline assembly (Rust's AMX intrinsics are not stable). Each
//! product configures the tiles for its tile's rows and releases them before it returns, so
//! no thread keeps the tiles' state between products.

use std::arch::asm;

use super::kernels::{key_index, value_index, Micro, Rows, Tile};
use super::{Scratch, Task, BLOCK_KEYS, MAX_TILE_ROWS};
use crate::element::Bf16;
use crate::isa::{AmxBf16, Avx512Bf16};

/// Runs task (`kv_head`, `block`) with these products.
///
/// # Safety
/// As `Task::run`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn run(
    cpu: AmxBf16,
    task: &Task<'_>,
    kv_head: usize,
    block: usize,
    scratch: &mut Scratch,
) {
    // SAFETY: forwarded from the caller; this copy is compiled for AVX-512 BF16, and the
    // token proves the tiles.
    unsafe { task.run_with(Tiles(cpu), kv_head, block, scratch) }
}

/// The products on tiles, a tile's queries copied into rows of `d` (`QUERIES`).
#[derive(Clone, Copy)]
struct Tiles(AmxBf16);

std::thread_local! {
    /// Each thread's copy of a tile's queries, row after row.
    static QUERIES: std::cell::RefCell<Vec<Bf16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The tiles' configuration (palette 1) for a tile of `rows` rows: tiles 0 and 1 float32 sums
/// (`rows` × 16), tiles 2 and 3 the rows' pairs (`rows` × 16 pairs), tiles 4 to 7 16 pairs of
/// 16 keys or columns. Each product takes tiles 2, 4 and 5 and tiles 3, 6 and 7 in turn, so
/// that a load does not wait for the product that read its tile before.
#[repr(C, align(64))]
struct Config([u8; 64]);

impl Config {
    fn new(rows: usize) -> Config {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        for tile in 0..8 {
            bytes[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&64u16.to_le_bytes());
            bytes[48 + tile] = if tile < 4 { rows as u8 } else { 16 };
        }
        Config(bytes)
    }

    /// Loads the configuration (every tile zeroed).
    ///
    /// # Safety
    /// The token's CPU runs AMX, and this process has the tiles' state.
    #[inline(always)]
    unsafe fn load(&self, _: AmxBf16) {
        // SAFETY: 64 readable, aligned bytes; the caller's promise.
        unsafe { asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

/// Releases the tiles (their state back to its initial, unsaved one).
///
/// # Safety
/// As `Config::load`.
#[inline(always)]
unsafe fn release(_: AmxBf16) {
    // SAFETY: the caller's promise.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Loads tile `$tile` with the configured rows of 64 bytes at `$at`, `$stride` bytes apart.
macro_rules! load_rows {
    ($tile:literal, $at:expr, $stride:expr) => {
        asm!(
            concat!("tileloadd tmm", $tile, ", [{at} + {stride}]"),
            at = in(reg) $at, stride = in(reg) $stride,
            options(nostack, readonly),
        )
    };
}

/// Loads tiles `$low` and `$high` with 16 rows of 64 bytes at `$b` and `$c` (rows 128 bytes
/// apart: 16 pairs of 16 keys or columns each), and adds the products of tile `$rows` by each
/// into tiles 0 and 1.
macro_rules! products {
    ($rows:literal, $low:literal, $high:literal, $b:expr, $c:expr) => {
        asm!(
            concat!("tileloadd tmm", $low, ", [{b} + {stride}]"),
            concat!("tileloadd tmm", $high, ", [{c} + {stride}]"),
            concat!("tdpbf16ps tmm0, tmm", $rows, ", tmm", $low),
            concat!("tdpbf16ps tmm1, tmm", $rows, ", tmm", $high),
            b = in(reg) $b, c = in(reg) $c, stride = in(reg) 128usize,
            options(nostack, readonly),
        )
    };
}

/// `sums(tile 0, tile 1) += rows · (16 pairs at `low`, 16 pairs at `low + 16`)` over
/// `steps` steps of 16 pairs: step `s` reads the rows' pairs at `rows + s · 32` bf16 (rows
/// `row_stride` bytes apart) and the second operands' at `low + s · step` pairs (rows 128 bytes
/// apart).
///
/// # Safety
/// The tiles are configured for the rows; every read lies inside its buffer.
#[inline(always)]
unsafe fn pair_products(
    rows: *const Bf16,
    row_stride: usize,
    low: *const u32,
    step: usize,
    steps: usize,
) {
    for s in 0..steps {
        let (a, b) = (rows.wrapping_add(32 * s), low.wrapping_add(s * step));
        let c = b.wrapping_add(16);
        // SAFETY: the caller's promise: `rows` × 64 bytes at `a`, and 16 rows of 64 bytes at
        // `b` and at `c`.
        unsafe {
            if s % 2 == 0 {
                load_rows!(2, a, row_stride);
                products!(2, 4, 5, b, c);
            } else {
                load_rows!(3, a, row_stride);
                products!(3, 6, 7, b, c);
            }
        }
    }
}

/// `sums(tile 0, tile 1) += queries · (32 keys at `slab`)` with the queries' one or two steps
/// of 16 pairs already in tiles 2 and 3: the keys' 16 pairs of step `s` at `slab + 512 s`
/// (rows 128 bytes apart, the second 16 keys 16 pairs on).
///
/// # Safety
/// The tiles are configured and hold the queries; `slab` holds the keys' `16 steps` pairs.
#[inline(always)]
unsafe fn resident_products(slab: *const u32, steps: usize) {
    let (b, c) = (slab, slab.wrapping_add(16));
    // SAFETY: the caller's promise: 16 rows of 64 bytes at `b` and `c`, and at 512 pairs on
    // for a second step.
    unsafe {
        products!(2, 4, 5, b, c);
        if steps == 2 {
            products!(3, 6, 7, b.add(16 * 32), c.add(16 * 32));
        }
    }
}

/// Stores tiles 0 and 1 at `out` and `out + 16` (rows `stride` bytes apart).
///
/// # Safety
/// The configured rows of 16 floats at both lie inside their buffer.
#[inline(always)]
unsafe fn store_sums(out: *mut f32, stride: usize) {
    // SAFETY: the caller's promise.
    unsafe {
        asm!(
            "tilestored [{low} + {stride}], tmm0",
            "tilestored [{high} + {stride}], tmm1",
            low = in(reg) out, high = in(reg) out.add(16), stride = in(reg) stride,
            options(nostack),
        );
    }
}

impl Micro for Tiles {
    /// An AMX tile's 16 rows.
    const ROWS: usize = MAX_TILE_ROWS;

    #[inline(always)]
    unsafe fn scores(self, tile: Tile<'_>, scores: &mut [f32]) {
        let Tile {
            q,
            queries,
            keys,
            width,
            d,
            ..
        } = tile;
        debug_assert!(queries.len() <= MAX_TILE_ROWS);
        QUERIES.with_borrow_mut(|rows| {
            rows.clear();
            for &offset in queries {
                rows.extend_from_slice(&q[offset..offset + d]);
            }
            // SAFETY: the token proves the tiles; the caller promises a sound tile: `keys` a
            // whole packed block (the pairs of 32 keys from k0, a multiple of 32 below
            // `width`, at `key_index(p, k0, d)`), `scores` rows of BLOCK_KEYS; the query rows
            // hold `d` bf16 each.
            unsafe {
                Config::new(queries.len()).load(self.0);
                let steps = d / 32;
                if steps <= 2 {
                    // The queries' one or two steps stay in tiles 2 and 3 for every slab.
                    load_rows!(2, rows.as_ptr(), 2 * d);
                    if steps == 2 {
                        load_rows!(3, rows.as_ptr().add(32), 2 * d);
                    }
                }
                for k0 in (0..width).step_by(32) {
                    asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                    let slab = keys.as_ptr().add(key_index(0, k0, d));
                    match steps {
                        1 | 2 => resident_products(slab, steps),
                        _ => pair_products(rows.as_ptr(), 2 * d, slab, 16 * 32, steps),
                    }
                    store_sums(scores.as_mut_ptr().add(k0), 4 * BLOCK_KEYS);
                }
                release(self.0);
            }
        });
    }

    #[inline(always)]
    unsafe fn softmax(self, tile: Tile<'_>, scores: &[f32], weights: &mut [Bf16], rows: Rows<'_>) {
        // SAFETY: forwarded from the caller; the token proves AVX-512 BF16.
        unsafe { Avx512Bf16::from(self.0).softmax(tile, scores, weights, rows) }
    }

    #[inline(always)]
    unsafe fn weighted_sum(self, tile: Tile<'_>, weights: &[Bf16], acc: &mut [f32]) {
        let Tile {
            queries,
            values,
            width,
            d,
            ..
        } = tile;
        // SAFETY: the token proves the tiles; the caller promises a sound tile: `values` a
        // whole packed block (32 columns from c0 of key pair jp at `value_index(jp, c0)`),
        // `weights` rows of BLOCK_KEYS, `acc` rows of `d`, a multiple of 32.
        unsafe {
            Config::new(queries.len()).load(self.0);
            for c0 in (0..d).step_by(32) {
                let sums = acc.as_mut_ptr().add(c0);
                load_rows!(0, sums, 4 * d);
                load_rows!(1, sums.add(16), 4 * d);
                let slab = values.as_ptr().add(value_index(0, c0));
                pair_products(weights.as_ptr(), 2 * BLOCK_KEYS, slab, 16 * 32, width / 32);
                store_sums(sums, 4 * d);
            }
            release(self.0);
        }
    }
}
