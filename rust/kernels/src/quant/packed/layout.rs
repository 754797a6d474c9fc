//! The tile layout of `packed` (see there; the K-quants' in `k_layout.rs`): packing GGUF
//! blocks into it and reading weights back out of it, as rows (embedding lookups) or, for a
//! matrix multiply, transposed.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{k_layout, TILE};
use crate::element::Element;
use crate::error::{check_len, elements};
use crate::isa::{Avx512, Avx512Vnni};
use crate::parallel;
use crate::quant::{block, check_shape, Format, QuantMatrix, BLOCK, SUPER_BLOCK};
use crate::{Error, Result};

/// Bytes of one block's nibbles in a tile (4-bit and 5-bit formats).
const NIBBLES: usize = TILE * BLOCK / 2;

/// Bytes of one block's values in a tile: Q5_0's and Q5_1's nibbles then their fifth bits.
pub(super) const fn values_bytes(format: Format) -> usize {
    match format {
        Format::Q8_0 => TILE * BLOCK,
        Format::Q4_0 | Format::Q4_1 => NIBBLES,
        Format::Q5_0 | Format::Q5_1 => NIBBLES + TILE * BLOCK / 8,
        Format::Q4_K | Format::Q5_K | Format::Q6_K => {
            panic!("a K-quant's tiles hold super-blocks, not blocks of 32")
        }
    }
}

/// Bytes of one block of a tile: its values, then 16 scales and 16 offsets as halves; for a
/// K-quant, of one super-block (`k_layout.rs`).
pub(super) const fn tile_block_bytes(format: Format) -> usize {
    if format.is_k() {
        k_layout::tile_super_block_bytes(format)
    } else {
        values_bytes(format) + 4 * TILE
    }
}

/// Bytes that `pack` writes for a `[n, k]` weight of `format`.
pub fn packed_len(format: Format, out_features: usize, in_features: usize) -> Result<usize> {
    check_shape(format, "a packed weight", out_features, in_features)?;
    elements(
        "the packed weight",
        &[
            out_features.div_ceil(TILE),
            in_features / format.block_weights(),
            tile_block_bytes(format),
        ],
    )
}

fn check_bytes(len: usize, expected: usize) -> Result<()> {
    if len != expected {
        return Err(Error::InvalidArgument(format!(
            "the packed weight has {len} bytes, expected {expected}"
        )));
    }
    Ok(())
}

/// A weight in the tile layout: a borrowed buffer whose length was checked against its shape.
#[derive(Debug, Clone, Copy)]
pub struct PackedMatrix<'a> {
    pub(super) format: Format,
    pub(super) bytes: &'a [u8],
    pub(super) out_features: usize,
    pub(super) in_features: usize,
}

impl<'a> PackedMatrix<'a> {
    /// Checks that `bytes` holds a packed `[out_features, in_features]` weight of `format`.
    pub fn new(
        format: Format,
        bytes: &'a [u8],
        out_features: usize,
        in_features: usize,
    ) -> Result<Self> {
        check_bytes(bytes.len(), packed_len(format, out_features, in_features)?)?;
        Ok(PackedMatrix {
            format,
            bytes,
            out_features,
            in_features,
        })
    }

    /// The block format it was packed from.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Output features (rows of the weight).
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Input features (columns of the weight).
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// The offset of block `b` (a K-quant's super-block) of tile `t`.
    pub(super) fn tile_block(&self, t: usize, b: usize) -> usize {
        (t * (self.in_features / self.format.block_weights()) + b) * tile_block_bytes(self.format)
    }

    /// Column `lane`'s scale and offset in the tile block at `at`.
    pub(super) fn scales(&self, at: usize, lane: usize) -> (f32, f32) {
        let scales = at + values_bytes(self.format);
        let half = |offset: usize| {
            let bits = [self.bytes[offset], self.bytes[offset + 1]];
            block::f16_to_f32(u16::from_le_bytes(bits))
        };
        (half(scales + 2 * lane), half(scales + 2 * TILE + 2 * lane))
    }

    /// Column `column`'s weights, as `block::decode` computes them, into `out` (`in_features`).
    fn decode_column<T: Element>(&self, column: usize, out: &mut [T]) {
        let (t, lane) = (column / TILE, column % TILE);
        if self.format.is_k() {
            for (s, values) in out.chunks_exact_mut(SUPER_BLOCK).enumerate() {
                let at = self.tile_block(t, s);
                k_layout::decode(self.format, self.bytes, at, lane, |i, v| values[i] = v);
            }
            return;
        }
        for (b, values) in out.chunks_exact_mut(BLOCK).enumerate() {
            let at = self.tile_block(t, b);
            let (d, m) = self.scales(at, lane);
            for (i, value) in values.iter_mut().enumerate() {
                let q = value_at(self.format, self.bytes, at, lane, i);
                *value = T::store(dequantized(self.format, q, d, m));
            }
        }
    }
}

/// A weight from its stored value, scale and offset, by each format's own formula (so that it
/// equals `block::decode`'s, sign of zero included).
pub(super) fn dequantized(format: Format, q: u8, d: f32, m: f32) -> f32 {
    let q = f32::from(q);
    match format {
        Format::Q4_0 => d * (q - 8.0),
        Format::Q4_1 | Format::Q5_1 => d * q + m,
        Format::Q5_0 => d * (q - 16.0),
        Format::Q8_0 => d * (q - 128.0),
        Format::Q4_K | Format::Q5_K | Format::Q6_K => {
            unreachable!("a K-quant's tiles never reach the layout of blocks of 32")
        }
    }
}

/// The unsigned value that stands for weight 0: a weight is `d·(q - zero) + m`.
pub(crate) const fn zero_point(format: Format) -> i32 {
    match format {
        Format::Q4_0 => 8,
        Format::Q4_1 | Format::Q5_1 => 0,
        Format::Q5_0 => 16,
        Format::Q8_0 => 128,
        Format::Q4_K | Format::Q5_K | Format::Q6_K => {
            panic!("a K-quant's tiles never reach the layout of blocks of 32")
        }
    }
}

/// Where weight `i` of a block's column `lane` lies: (byte, whether in the high nibble).
fn value_place(format: Format, at: usize, lane: usize, i: usize) -> (usize, bool) {
    let (group, within) = (i / 4, i % 4);
    match format {
        Format::Q8_0 => (at + group * 64 + lane * 4 + within, false),
        Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 => {
            (at + (group % 4) * 64 + lane * 4 + within, group >= 4)
        }
        Format::Q4_K | Format::Q5_K | Format::Q6_K => {
            unreachable!("a K-quant's tiles never reach the layout of blocks of 32")
        }
    }
}

/// Where the fifth bit of weight `i` of a block's column `lane` lies, for Q5_0 and Q5_1: the
/// byte (in the same position among the plane's 64 as its nibble among 64 bytes) and the bit
/// (the weight's group of four, 0..8).
fn fifth_bit_place(format: Format, at: usize, lane: usize, i: usize) -> Option<(usize, u32)> {
    matches!(format, Format::Q5_0 | Format::Q5_1)
        .then(|| (at + NIBBLES + lane * 4 + i % 4, (i / 4) as u32))
}

/// The unsigned value of weight `i` of column `lane` in the tile block at `at`.
pub(super) fn value_at(format: Format, bytes: &[u8], at: usize, lane: usize, i: usize) -> u8 {
    let low = match value_place(format, at, lane, i) {
        (byte, false) if format == Format::Q8_0 => bytes[byte],
        (byte, false) => bytes[byte] & 0xf,
        (byte, true) => bytes[byte] >> 4,
    };
    match fifth_bit_place(format, at, lane, i) {
        Some((byte, bit)) => low | ((bytes[byte] >> bit) & 1) << 4,
        None => low,
    }
}

/// Writes `weight` in the tile layout into `out` (`packed_len` bytes).
pub fn pack(weight: &QuantMatrix<'_>, out: &mut [u8]) -> Result<()> {
    let format = weight.format();
    let (n, k) = (weight.out_features(), weight.in_features());
    check_bytes(out.len(), packed_len(format, n, k)?)?;
    out.fill(0);
    if format.is_k() {
        k_layout::pack(weight, out);
        return Ok(());
    }
    let blocks = k / BLOCK;
    for column in 0..n {
        let (t, lane) = (column / TILE, column % TILE);
        for (b, source) in weight
            .row(column)
            .chunks_exact(format.block_bytes())
            .enumerate()
        {
            let at = (t * blocks + b) * tile_block_bytes(format);
            let d_bits = u16::from_le_bytes([source[0], source[1]]);
            let m_bits = if format.has_offset() {
                u16::from_le_bytes([source[2], source[3]])
            } else {
                0
            };
            let values: Vec<u8> = match format {
                Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 => {
                    let nibbles = &source[source.len() - 16..];
                    let low = nibbles.iter().map(|byte| byte & 0xf);
                    let low_then_high = low.chain(nibbles.iter().map(|byte| byte >> 4));
                    // Q5_0's and Q5_1's fifth bits: bit `i` of the word before the nibbles.
                    let fifth = if matches!(format, Format::Q5_0 | Format::Q5_1) {
                        let word = &source[source.len() - 20..source.len() - 16];
                        u32::from_le_bytes([word[0], word[1], word[2], word[3]])
                    } else {
                        0
                    };
                    low_then_high
                        .enumerate()
                        .map(|(i, q)| q | ((fifth >> i) as u8 & 1) << 4)
                        .collect()
                }
                Format::Q8_0 => source[2..].iter().map(|&q| q ^ 0x80).collect(),
                Format::Q4_K | Format::Q5_K | Format::Q6_K => {
                    unreachable!("the K-quants pack in k_layout.rs")
                }
            };
            for (i, &q) in values.iter().enumerate() {
                let (byte, high) = value_place(format, at, lane, i);
                let low = if format == Format::Q8_0 { q } else { q & 0xf };
                out[byte] |= if high { low << 4 } else { low };
                if let Some((byte, bit)) = fifth_bit_place(format, at, lane, i) {
                    out[byte] |= (q >> 4) << bit;
                }
            }
            let scales = at + values_bytes(format);
            out[scales + 2 * lane..][..2].copy_from_slice(&d_bits.to_le_bytes());
            out[scales + 2 * TILE + 2 * lane..][..2].copy_from_slice(&m_bits.to_le_bytes());
        }
    }
    Ok(())
}

/// Columns `ids` of the packed weight (rows of the `[n, k]` matrix) as `T`, bit-identical to
/// `dequantize_rows` on the blocks it was packed from.
pub fn dequantize_packed<T: Element>(
    weight: &PackedMatrix<'_>,
    ids: Option<&[u32]>,
    out: &mut [T],
) -> Result<()> {
    let count = ids.map_or(weight.out_features, <[u32]>::len);
    let k = weight.in_features;
    check_len(
        "the output",
        out.len(),
        elements("the output", &[count, k])?,
    )?;
    if let Some(bad) =
        ids.and_then(|ids| ids.iter().find(|&&id| id as usize >= weight.out_features))
    {
        return Err(Error::InvalidArgument(format!(
            "row {bad} is out of range for a weight of {} rows",
            weight.out_features
        )));
    }
    let column = |i: usize| ids.map_or(i, |ids| ids[i] as usize);
    crate::quant::dequant::decode_rows(k, count, out, &|i, values| {
        weight.decode_column(column(i), values);
    });
    Ok(())
}

/// Weights below which a transposed dequantization runs on the calling thread alone.
const TRANSPOSE_PARALLEL_MIN: usize = 1 << 19;

/// The packed weight transposed, `[in_features, out_features]` row-major in `out` (so that its
/// 16 columns of a tile are contiguous: what a matrix multiply of `x · W^T` reads as `W^T`),
/// with the AVX-512 decoder where the CPU has it, on several threads for large weights; each
/// weight equal to `dequantize_packed`'s.
pub fn dequantize_packed_transposed<T: Element>(
    weight: &PackedMatrix<'_>,
    out: &mut [T],
) -> Result<()> {
    let (n, k) = (weight.out_features, weight.in_features);
    check_len("the output", out.len(), elements("the output", &[k, n])?)?;
    let tiles = n.div_ceil(TILE);
    // The AVX-512 decoder takes tiles of blocks of 32; the K-quants' reads their groups of
    // values as their AVX-512 VNNI kernel does.
    let simd = Avx512::active().filter(|_| !weight.format.is_k());
    let k_simd = Avx512Vnni::active().filter(|_| weight.format.is_k());
    let threads = if n * k >= TRANSPOSE_PARALLEL_MIN {
        parallel::max_threads()
    } else {
        1
    };
    let target = Target(out.as_mut_ptr());
    let next = AtomicUsize::new(0);
    parallel::run(threads, &|_, _| loop {
        let t = next.fetch_add(1, Ordering::Relaxed);
        if t >= tiles {
            break;
        }
        // SAFETY: `out` holds `[k, n]` elements (checked above) and outlives the region; tile
        // `t` writes only its own columns `16t..16t+16` (below `n`) of each row, claimed by
        // this thread alone.
        unsafe {
            match (simd, k_simd) {
                #[cfg(target_arch = "x86_64")]
                (Some(cpu), _) => super::vnni::transpose_tile(cpu, weight, t, target.get()),
                #[cfg(target_arch = "x86_64")]
                (_, Some(cpu)) => super::k_avx512::transpose_tile(cpu, weight, t, target.get()),
                _ => transpose_tile(weight, t, target.get()),
            }
        }
    });
    Ok(())
}

/// The output of `dequantize_packed_transposed`, shared by its threads.
struct Target<T>(*mut T);

impl<T> Target<T> {
    /// The pointer (a method, so that closures capture the `Sync` wrapper, not its field).
    fn get(&self) -> *mut T {
        self.0
    }
}

// SAFETY: the threads write disjoint columns of the output (see its one use).
unsafe impl<T> Sync for Target<T> {}

/// Tile `t` of `weight` into its columns of the transposed `[k, n]` output at `out`.
///
/// # Safety
/// `out` holds `in_features × out_features` elements; no other thread writes the tile's
/// columns.
pub(super) unsafe fn transpose_tile<T: Element>(weight: &PackedMatrix<'_>, t: usize, out: *mut T) {
    let n = weight.out_features;
    let width = TILE.min(n - t * TILE);
    if weight.format.is_k() {
        for s in 0..weight.in_features / SUPER_BLOCK {
            let at = weight.tile_block(t, s);
            for lane in 0..width {
                let column = out.wrapping_add(s * SUPER_BLOCK * n + t * TILE + lane);
                k_layout::decode(weight.format, weight.bytes, at, lane, |i, v| {
                    // SAFETY: row `256s + i` < k and column `16t + lane` < n lie inside `out`.
                    unsafe { *column.add(i * n) = v };
                });
            }
        }
        return;
    }
    for b in 0..weight.in_features / BLOCK {
        let at = weight.tile_block(t, b);
        for lane in 0..width {
            let (d, m) = weight.scales(at, lane);
            for i in 0..BLOCK {
                let q = value_at(weight.format, weight.bytes, at, lane, i);
                // SAFETY: row `32b + i` < k and column `16t + lane` < n lie inside `out`.
                unsafe {
                    *out.add((b * BLOCK + i) * n + t * TILE + lane) =
                        T::store(dequantized(weight.format, q, d, m));
                }
            }
        }
    }
}
