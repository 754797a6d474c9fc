//! One GGUF block at a time, in plain Rust: the decoding every path agrees with, the portable
//! linear kernel, and the half/bfloat16 conversions.
//!
//! Decoding rounds as the `gguf` package's numpy reference does (`d * q + m` as a product then
//! a sum, `d * (q - 8)` and `d * (q - 16)` as one product), so that `dequantize` is
//! bit-identical to it. The K-quants' super-blocks decode in `k_blocks.rs`; the kernel here
//! takes a block of either.

use super::{k_blocks, Format, Job, BLOCK, SUPER_BLOCK};
use crate::element::Element;

/// The value of an IEEE half-precision number given by its bits (every half is a float exactly).
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    match exponent {
        0 => {
            // Zero or subnormal: mantissa · 2⁻²⁴, exact in a float.
            let magnitude = mantissa as f32 * (1.0 / 16_777_216.0);
            if sign == 0 {
                magnitude
            } else {
                -magnitude
            }
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (mantissa << 13)),
        _ => f32::from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13)),
    }
}

fn half(block: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]))
}

/// The 32 weights of one block (`block` holds exactly `format.block_bytes()` bytes).
pub(crate) fn decode(format: Format, block: &[u8]) -> [f32; BLOCK] {
    let mut out = [0f32; BLOCK];
    match format {
        Format::Q4_0 => {
            let d = half(block, 0);
            for (j, &byte) in block[2..18].iter().enumerate() {
                out[j] = d * (f32::from(byte & 0xf) - 8.0);
                out[j + 16] = d * (f32::from(byte >> 4) - 8.0);
            }
        }
        Format::Q4_1 => {
            let (d, m) = (half(block, 0), half(block, 2));
            for (j, &byte) in block[4..20].iter().enumerate() {
                out[j] = d * f32::from(byte & 0xf) + m;
                out[j + 16] = d * f32::from(byte >> 4) + m;
            }
        }
        Format::Q5_0 | Format::Q5_1 => {
            // The nibbles' bytes after the halves and `qh`, whose bit `j` is weight `j`'s fifth.
            let values = if format == Format::Q5_0 { 6 } else { 8 };
            let high = u32::from_le_bytes([
                block[values - 4],
                block[values - 3],
                block[values - 2],
                block[values - 1],
            ]);
            let q = |j: usize, nibble: u8| f32::from(nibble | ((high >> j) as u8 & 1) << 4);
            let d = half(block, 0);
            for (j, &byte) in block[values..values + 16].iter().enumerate() {
                let (low, high) = (q(j, byte & 0xf), q(j + 16, byte >> 4));
                if format == Format::Q5_0 {
                    out[j] = d * (low - 16.0);
                    out[j + 16] = d * (high - 16.0);
                } else {
                    let m = half(block, 2);
                    out[j] = d * low + m;
                    out[j + 16] = d * high + m;
                }
            }
        }
        Format::Q8_0 => {
            let d = half(block, 0);
            for (value, &byte) in out.iter_mut().zip(&block[2..34]) {
                *value = d * f32::from(byte as i8);
            }
        }
        Format::Q4_K | Format::Q5_K | Format::Q6_K => {
            unreachable!("{format:?} decodes by super-blocks of 256 (`decode_into`)")
        }
    }
    out
}

/// The `format.block_weights()` weights of one block of any format into `out`.
pub(crate) fn decode_into(format: Format, block: &[u8], out: &mut [f32]) {
    if format.is_k() {
        out.copy_from_slice(&k_blocks::decode(format, block));
    } else {
        out.copy_from_slice(&decode(format, block));
    }
}

/// Decodes one output row (its consecutive blocks) into `out`.
pub(crate) fn decode_row<T: Element>(format: Format, row: &[u8], out: &mut [T]) {
    let width = format.block_weights();
    let mut weights = [0f32; SUPER_BLOCK];
    for (block, values) in row
        .chunks_exact(format.block_bytes())
        .zip(out.chunks_exact_mut(width))
    {
        decode_into(format, block, &mut weights[..width]);
        for (value, &weight) in values.iter_mut().zip(&weights) {
            *value = T::store(weight);
        }
    }
}

/// Activation rows a pass of the portable kernel takes per decoded block.
const ROWS: usize = 8;

/// The portable kernel: output columns `outputs` of every row of `job`. Each block (of 32, or
/// a K-quant's super-block of 256) is decoded once per group of `ROWS` rows; each (row, column)
/// sums in 8 lanes, added in a fixed order, so a row's result does not depend on the others.
///
/// # Safety
/// `job`'s pointers hold what `Job` says (checked by `quant::linear`), and no other thread
/// writes the columns `outputs`.
pub(crate) unsafe fn run(job: &Job, outputs: std::ops::Range<usize>) {
    let k = job.in_features;
    let width = job.format.block_weights();
    let row_bytes = k / width * job.format.block_bytes();
    // SAFETY: the caller guarantees the buffers' extents; these slices cover exactly them and
    // are only read.
    let (x, weight) = unsafe {
        (
            std::slice::from_raw_parts(job.x, job.m * k),
            std::slice::from_raw_parts(job.weight, job.out_features * row_bytes),
        )
    };
    for column in outputs {
        let row = &weight[column * row_bytes..(column + 1) * row_bytes];
        let bias = if job.bias.is_null() {
            0.0
        } else {
            // SAFETY: the bias holds `out_features` floats and `column` is below that.
            unsafe { *job.bias.add(column) }
        };
        for first in (0..job.m).step_by(ROWS) {
            let rows = ROWS.min(job.m - first);
            let mut lanes = [[0f32; 8]; ROWS];
            let mut w = [0f32; SUPER_BLOCK];
            for (b, block) in row.chunks_exact(job.format.block_bytes()).enumerate() {
                decode_into(job.format, block, &mut w[..width]);
                for (r, sums) in lanes.iter_mut().enumerate().take(rows) {
                    let xs = &x[(first + r) * k + b * width..][..width];
                    for (i, (&xv, &wv)) in xs.iter().zip(&w).enumerate() {
                        sums[i % 8] += xv * wv;
                    }
                }
            }
            for (r, sums) in lanes.iter().enumerate().take(rows) {
                let total = ((sums[0] + sums[4]) + (sums[1] + sums[5]))
                    + ((sums[2] + sums[6]) + (sums[3] + sums[7]));
                // SAFETY: (first + r, column) is inside the `m × out_features` output, and this
                // thread alone writes column `column`.
                unsafe { *job.out.add((first + r) * job.out_features + column) = total + bias };
            }
        }
    }
}
