//! The K-quants' super-blocks (GGML's `block_q4_K`, `block_q5_K`, `block_q6_K`), taken apart and
//! decoded: the reference that packing and every kernel of a K-quant agree with.
//!
//! A super-block holds 256 consecutive weights of a row:
//! - Q4_K (144 bytes): the half scale `d` and half min `dmin`, 12 bytes of 6-bit scales `sc` and
//!   mins `m` of its 8 sub-blocks of 32, then 128 bytes of nibbles: byte `32c + l` holds weight
//!   `64c + l` in its low nibble and weight `64c + 32 + l` in its high one. Weight `i` of
//!   sub-block `j` is `(d·sc_j)·q - dmin·m_j`;
//! - Q5_K (176 bytes): Q4_K's fields with 32 bytes of fifth bits before the nibbles: bit `j` of
//!   byte `l` is weight `32j + l`'s, worth 16;
//! - Q6_K (210 bytes): 128 bytes of low nibbles, 64 of two-bit high parts, 16 int8 scales of
//!   its sub-blocks of 16, then `d`. In each half `n` of 128 weights, weight `128n + 32p + l`
//!   has the low (`p` 0, 1) or high (`p` 2, 3) nibble of byte `64n + 32(p % 2) + l` and the bits
//!   `2p..2p+2` of byte `128 + 32n + l` above it; weight `i` is `(d·sc_{i/16})·(q - 32)`.
//!
//! Rounding: as the `gguf` package's numpy reference (and GGML's C) compute them, `d·sc` and
//! `dmin·m` first, then the product by `q` and the difference. Every product here is exact in
//! float32 (a half's 11 significant bits times a 6-bit scale and a value of at most 6 bits, or
//! Q6_K's 7-bit scale and 6-bit value, is under 24 bits), so only Q4_K's and Q5_K's difference
//! rounds.

use super::{block, Format, SUPER_BLOCK};

/// A super-block taken apart: what the tile layout stores of it.
pub(crate) struct Parts {
    /// The unsigned values (Q4_K: 0..16, Q5_K: 0..32, Q6_K: 0..64), in weight order.
    pub(crate) values: [u8; SUPER_BLOCK],
    /// The sub-blocks' scales (8 of them, 0..64; Q6_K: 16, signed).
    pub(crate) scales: [i8; 16],
    /// The sub-blocks' mins (8 of them, 0..64; none for Q6_K).
    pub(crate) mins: [u8; 8],
    /// The bits of the half scale `d`.
    pub(crate) d: u16,
    /// The bits of the half min `dmin` (0 for Q6_K).
    pub(crate) dmin: u16,
}

/// Sub-blocks of a super-block: 8 of 32, or Q6_K's 16 of 16.
pub(crate) const fn sub_blocks(format: Format) -> usize {
    match format {
        Format::Q6_K => 16,
        _ => 8,
    }
}

/// Sub-block `j`'s 6-bit scale and min from Q4_K's and Q5_K's 12 bytes: bytes 0-3 hold the
/// low six bits of scales 0-3, bytes 4-7 those of mins 0-3, and bytes 8-11 the low four bits
/// of scales (low nibble) and mins (high nibble) 4-7, whose top two bits are the top bits of
/// bytes 0-3 (scales) and 4-7 (mins).
fn scale_min(packed: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0xf) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

/// The parts of the super-block `block` (`format.block_bytes()` bytes of a K-quant).
pub(crate) fn parts(format: Format, block: &[u8]) -> Parts {
    let half = |at: usize| u16::from_le_bytes([block[at], block[at + 1]]);
    let mut parts = Parts {
        values: [0; SUPER_BLOCK],
        scales: [0; 16],
        mins: [0; 8],
        d: 0,
        dmin: 0,
    };
    match format {
        Format::Q4_K | Format::Q5_K => {
            (parts.d, parts.dmin) = (half(0), half(2));
            for j in 0..8 {
                let (scale, min) = scale_min(&block[4..16], j);
                (parts.scales[j], parts.mins[j]) = (scale as i8, min);
            }
            let nibbles = &block[block.len() - 128..];
            for (i, value) in parts.values.iter_mut().enumerate() {
                let byte = nibbles[32 * (i / 64) + i % 32];
                *value = if i % 64 < 32 { byte & 0xf } else { byte >> 4 };
                if format == Format::Q5_K {
                    *value |= ((block[16 + i % 32] >> (i / 32)) & 1) << 4;
                }
            }
        }
        Format::Q6_K => {
            parts.d = half(208);
            for (scale, &byte) in parts.scales.iter_mut().zip(&block[192..208]) {
                *scale = byte as i8;
            }
            for (i, value) in parts.values.iter_mut().enumerate() {
                let (n, p, l) = (i / 128, i % 128 / 32, i % 32);
                let low = block[64 * n + 32 * (p % 2) + l];
                let low = if p < 2 { low & 0xf } else { low >> 4 };
                let high = (block[128 + 32 * n + l] >> (2 * p)) & 3;
                *value = low | (high << 4);
            }
        }
        Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 | Format::Q8_0 => {
            unreachable!("{format:?} has blocks of 32, not super-blocks")
        }
    }
    parts
}

/// Weight `i` of a super-block of `format`, from its value `q`, its sub-block's scale `sc` and
/// min `m`, and the super-block's `d` and `dmin` as floats (see the module for the rounding).
pub(crate) fn weight(format: Format, q: u8, sc: i8, m: u8, d: f32, dmin: f32) -> f32 {
    let q = f32::from(q);
    match format {
        Format::Q6_K => (d * f32::from(sc)) * (q - 32.0),
        _ => (d * f32::from(sc)) * q - dmin * f32::from(m),
    }
}

/// The 256 weights of the super-block `block` (`format.block_bytes()` bytes of a K-quant).
pub(crate) fn decode(format: Format, block: &[u8]) -> [f32; SUPER_BLOCK] {
    let parts = parts(format, block);
    let (d, dmin) = (block::f16_to_f32(parts.d), block::f16_to_f32(parts.dmin));
    let per_sub_block = SUPER_BLOCK / sub_blocks(format);
    std::array::from_fn(|i| {
        let j = i / per_sub_block;
        let m = parts.mins.get(j).copied().unwrap_or(0);
        weight(format, parts.values[i], parts.scales[j], m, d, dmin)
    })
}

#[cfg(test)]
#[path = "k_blocks_tests.rs"]
mod tests;
