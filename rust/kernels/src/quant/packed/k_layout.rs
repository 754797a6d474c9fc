//! The tile layout of the K-quants (Q4_K, Q5_K, Q6_K): a tile's super-blocks of 256 weights in
//! about the bytes of the file's, laid out so that the kernels of `k_kernel.rs` read each
//! sub-block of 32 as the kernels of blocks of 32 read a Q4_1 block.
//!
//! Tile `t` (columns `16t..16t+16`, the last padded with zero weights) is its `k / 256`
//! super-blocks in order, each:
//! - the low nibbles of the 8 sub-blocks of 32, 256 bytes each, exactly as a Q4_1 block's in
//!   its tile (`packed.rs`): group `g` of four weights `4g..4g+4` of the sub-block in the low
//!   (`g < 4`) or high (`g ≥ 4`) nibbles of the 64 bytes at `64·(g % 4)`, column `c`'s four
//!   at bytes `4c..4c+4`;
//! - the values' high bits, per sub-block, in the same byte positions: Q5_K's fifth bits in 64
//!   bytes (group `g`'s in bit `g`); Q6_K's two bits in 128 bytes, the 64 at `64·(h / 2)`
//!   holding groups `h` and `h + 4` (`h` = `g % 4`) in the two-bit field
//!   `f = 2·(h % 2) + g / 4` (bits `2f..2f+2`), so that one shift and one mask put a group's
//!   bits above its nibbles;
//! - the sub-blocks' scales, one byte per column (16 bytes per sub-block: 8 of them, or Q6_K's
//!   16 signed ones), then Q4_K's and Q5_K's mins likewise (128 bytes);
//! - the 16 columns' half scales `d`, then Q4_K's and Q5_K's half mins `dmin` (32 bytes each).
//!
//! Bytes per weight against the file's: Q4_K 2368 per 16 × 256 weights (4.625 bits, the
//! file's 4.5: 2.8% more, the scales and mins that the file packs in 6 bits kept in 8, so that
//! one widening load reads a sub-block's 16), Q5_K 2880 (5.625 bits against 5.5: 2.3% more),
//! Q6_K 3360 (6.5625 bits, the file's exactly). Expanding to Q4_1's tiles instead (a half
//! scale and offset per 32) would cost 5 bits for Q4_K, and Q6_K in bytes 9.
//!
//! Weights: as `k_blocks::weight` computes them from the stored value, scale, min and halves,
//! so that `dequantize_packed` equals `dequantize` on the blocks bit for bit.

use super::TILE;
use crate::element::Element;
use crate::quant::k_blocks::{self, sub_blocks};
use crate::quant::{block, Format, QuantMatrix, BLOCK, SUPER_BLOCK};

/// Bytes of a super-block's low nibbles in a tile: 8 sub-blocks of 256.
pub(super) const NIBBLES: usize = 8 * TILE * BLOCK / 2;

/// Bytes of one sub-block's high bits in a tile.
pub(super) const fn plane_bytes(format: Format) -> usize {
    match format {
        Format::Q5_K => TILE * BLOCK / 8,
        Format::Q6_K => TILE * BLOCK / 4,
        _ => 0,
    }
}

/// Where a tile super-block's scales start (16 bytes per sub-block).
pub(super) const fn scales_at(format: Format) -> usize {
    NIBBLES + 8 * plane_bytes(format)
}

/// Where a tile super-block's mins start (16 bytes per sub-block; Q4_K and Q5_K).
pub(super) const fn mins_at(format: Format) -> usize {
    scales_at(format) + TILE * sub_blocks(format)
}

/// Where a tile super-block's half scales start, the half mins 32 bytes after them.
pub(super) const fn halves_at(format: Format) -> usize {
    match format {
        Format::Q6_K => mins_at(format),
        _ => mins_at(format) + TILE * 8,
    }
}

/// Bytes of one super-block of a tile.
pub(super) const fn tile_super_block_bytes(format: Format) -> usize {
    match format {
        Format::Q6_K => halves_at(format) + 2 * TILE,
        _ => halves_at(format) + 4 * TILE,
    }
}

/// The unsigned value of weight `i` (0..256) of column `lane` in the tile super-block at `at`.
pub(super) fn value_at(format: Format, bytes: &[u8], at: usize, lane: usize, i: usize) -> u8 {
    let (j, g, within) = (i / BLOCK, i % BLOCK / 4, i % 4);
    let position = 64 * (g % 4) + 4 * lane + within;
    let nibbles = bytes[at + 256 * j + position];
    let low = if g < 4 { nibbles & 0xf } else { nibbles >> 4 };
    let plane = at + NIBBLES + plane_bytes(format) * j;
    match format {
        Format::Q5_K => low | (((bytes[plane + 4 * lane + within] >> g) & 1) << 4),
        Format::Q6_K => {
            let h = g % 4;
            let field = 2 * (h % 2) + g / 4;
            let byte = bytes[plane + 64 * (h / 2) + 4 * lane + within];
            low | (((byte >> (2 * field)) & 3) << 4)
        }
        _ => low,
    }
}

/// Column `lane`'s half scale and half min (0 for Q6_K) in the tile super-block at `at`.
pub(super) fn halves(format: Format, bytes: &[u8], at: usize, lane: usize) -> (f32, f32) {
    let half =
        |offset: usize| block::f16_to_f32(u16::from_le_bytes([bytes[offset], bytes[offset + 1]]));
    let d_at = at + halves_at(format) + 2 * lane;
    let dmin = if format == Format::Q6_K {
        0.0
    } else {
        half(d_at + 2 * TILE)
    };
    (half(d_at), dmin)
}

/// Column `lane`'s scale of sub-block `s` (Q6_K's of 16, else of 32) and min of sub-block
/// `s` (0 for Q6_K) in the tile super-block at `at`.
pub(super) fn scale_min(
    format: Format,
    bytes: &[u8],
    at: usize,
    lane: usize,
    s: usize,
) -> (i8, u8) {
    let scale = bytes[at + scales_at(format) + TILE * s + lane] as i8;
    let min = if format == Format::Q6_K {
        0
    } else {
        bytes[at + mins_at(format) + TILE * s + lane]
    };
    (scale, min)
}

/// Writes the super-blocks of `weight` (a K-quant) in the tile layout into `out` (zeroed, of
/// `packed_len` bytes).
pub(super) fn pack(weight: &QuantMatrix<'_>, out: &mut [u8]) {
    let format = weight.format();
    let (n, k) = (weight.out_features(), weight.in_features());
    let supers = k / SUPER_BLOCK;
    let stride = tile_super_block_bytes(format);
    for column in 0..n {
        let (t, lane) = (column / TILE, column % TILE);
        let source = weight.row(column).chunks_exact(format.block_bytes());
        for (s, source) in source.enumerate() {
            let at = (t * supers + s) * stride;
            let parts = k_blocks::parts(format, source);
            for (i, &q) in parts.values.iter().enumerate() {
                let (j, g, within) = (i / BLOCK, i % BLOCK / 4, i % 4);
                let position = 64 * (g % 4) + 4 * lane + within;
                let low = q & 0xf;
                out[at + 256 * j + position] |= if g < 4 { low } else { low << 4 };
                let plane = at + NIBBLES + plane_bytes(format) * j;
                match format {
                    Format::Q5_K => out[plane + 4 * lane + within] |= (q >> 4) << g,
                    Format::Q6_K => {
                        let h = g % 4;
                        let field = 2 * (h % 2) + g / 4;
                        out[plane + 64 * (h / 2) + 4 * lane + within] |= (q >> 4) << (2 * field);
                    }
                    _ => {}
                }
            }
            for sub in 0..sub_blocks(format) {
                out[at + scales_at(format) + TILE * sub + lane] = parts.scales[sub] as u8;
                if format != Format::Q6_K {
                    out[at + mins_at(format) + TILE * sub + lane] = parts.mins[sub];
                }
            }
            let d_at = at + halves_at(format) + 2 * lane;
            out[d_at..d_at + 2].copy_from_slice(&parts.d.to_le_bytes());
            if format != Format::Q6_K {
                out[d_at + 2 * TILE..][..2].copy_from_slice(&parts.dmin.to_le_bytes());
            }
        }
    }
}

/// The 256 weights of column `lane` of the tile super-block at `at`, by `k_blocks::weight`.
pub(super) fn decode<T: Element>(
    format: Format,
    bytes: &[u8],
    at: usize,
    lane: usize,
    mut write: impl FnMut(usize, T),
) {
    let (d, dmin) = halves(format, bytes, at, lane);
    let per_sub_block = SUPER_BLOCK / sub_blocks(format);
    for i in 0..SUPER_BLOCK {
        let (sc, m) = scale_min(format, bytes, at, lane, i / per_sub_block);
        let q = value_at(format, bytes, at, lane, i);
        write(i, T::store(k_blocks::weight(format, q, sc, m, d, dmin)));
    }
}
