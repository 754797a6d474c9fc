//! Linear layers and embedding lookups computed straight from GGUF's quantized blocks
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K-quants Q4_K, Q5_K, Q6_K), so that a decode step
//! reads 4.5 to 8.5 bits per weight instead of 32.
//!
//! Why: decoding on the CPU reads every weight once per step for a few rows of activations; it
//! is bound by the bytes of weights it reads, not by arithmetic. Keeping the blocks as they are
//! in the file and expanding them in registers cuts those bytes by 4 to 7 against float32.
//!
//! Blocks: 32 consecutive weights of a row along the input dimension; a `[out, in]` weight is
//! `out` rows of `in / 32` blocks, each block `Format::block_bytes` bytes: a half-precision
//! scale `d` (Q4_1: and an offset `m`) then the quantized values; weight `j` is `d·(q-8)`
//! (Q4_0, `q` the low nibble of byte `j` for `j < 16`, the high nibble of byte `j-16` after),
//! `d·q + m` (Q4_1, same nibbles), `d·(q-16)` and `d·q + m` (Q5_0, Q5_1: the nibble with bit
//! `j` of a 32-bit word `qh` above it, stored after the halves), `d·q` (Q8_0, `q` the signed
//! byte `j`). The K-quants keep
//! super-blocks of 256 weights (`k_blocks.rs`: 8 sub-blocks of 32, or for Q6_K 16 of 16, each
//! with small integer scales under the super-block's half-precision ones), so a K-quant
//! weight's input width is a multiple of 256.
//!
//! Arithmetic: the activations stay float32 and every block is expanded to float32 weights,
//! then multiplied and added in float32, as with the dequantized weight, so results equal
//! `F.linear` on the dequantized weight to float rounding. This is the portable path
//! (`block.rs`), for CPUs without AVX2: where the CPU has AVX2 or AVX-512 VNNI, `packed.rs`
//! takes over, the weights repacked into tiles for integer dot products.
//!
//! What must stay true: a row's outputs are computed by the same operations in the same order
//! whatever the other rows of the call and the threads (batch invariance within one kernel);
//! every size is checked against the buffers before a kernel reads them.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::elements;
use crate::parallel;
use crate::{Error, Result};

mod block;
mod dequant;
mod k_blocks;
mod packed;

#[cfg(target_arch = "x86_64")]
mod avx512;

pub use block::f16_to_f32;
pub use dequant::{dequantize, dequantize_rows};
pub use packed::{
    dequantize_packed, dequantize_packed_transposed, linear_packed, linear_packed_one_int8, pack,
    packed_len, PackedKernel, PackedMatrix, TILE,
};

/// Weights per block of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, and per block of activations that the
/// integer kernels round together (a K-quant's sub-block of 32 is one).
pub const BLOCK: usize = 32;

/// Weights per super-block of a K-quant (GGML's `QK_K`).
pub const SUPER_BLOCK: usize = 256;

/// Products with fewer multiply-adds than this (decoding counted as one row) run on the calling
/// thread alone: starting a parallel region costs about as much as they do.
const PARALLEL_MIN_WORK: usize = 1 << 20;

/// A GGUF block format, named as GGML names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Format {
    /// 4-bit values with a scale: 18 bytes per block.
    Q4_0,
    /// 4-bit values with a scale and an offset: 20 bytes per block.
    Q4_1,
    /// 5-bit values with a scale: 22 bytes per block.
    Q5_0,
    /// 5-bit values with a scale and an offset: 24 bytes per block.
    Q5_1,
    /// 8-bit values with a scale: 34 bytes per block.
    Q8_0,
    /// 4-bit values, 8 sub-blocks of 32 with 6-bit scales and mins under a half scale and min:
    /// 144 bytes per super-block of 256.
    Q4_K,
    /// Q4_K with a fifth bit per value: 176 bytes per super-block of 256.
    Q5_K,
    /// 6-bit values, 16 sub-blocks of 16 with int8 scales under a half scale: 210 bytes per
    /// super-block of 256.
    Q6_K,
}

impl Format {
    /// The format named `name` (`"q4_0"`, `"q4_1"`, `"q5_0"`, `"q5_1"`, `"q8_0"`, `"q4_k"`,
    /// `"q5_k"`, `"q6_k"`).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "q4_0" => Ok(Format::Q4_0),
            "q4_1" => Ok(Format::Q4_1),
            "q5_0" => Ok(Format::Q5_0),
            "q5_1" => Ok(Format::Q5_1),
            "q8_0" => Ok(Format::Q8_0),
            "q4_k" => Ok(Format::Q4_K),
            "q5_k" => Ok(Format::Q5_K),
            "q6_k" => Ok(Format::Q6_K),
            _ => Err(Error::InvalidArgument(format!(
                "unknown quantization format {name:?} (expected q4_0, q4_1, q5_0, q5_1, q8_0, \
                 q4_k, q5_k or q6_k)"
            ))),
        }
    }

    /// Whether a weight is `d·q + m` with an offset `m` of its own (Q4_1, Q5_1), rather than
    /// `d·(q - zero)`.
    pub const fn has_offset(self) -> bool {
        matches!(self, Format::Q4_1 | Format::Q5_1)
    }

    /// Whether the format is a K-quant (super-blocks of 256).
    pub const fn is_k(self) -> bool {
        matches!(self, Format::Q4_K | Format::Q5_K | Format::Q6_K)
    }

    /// Weights per block: 32, or a K-quant's super-block of 256.
    pub const fn block_weights(self) -> usize {
        if self.is_k() {
            SUPER_BLOCK
        } else {
            BLOCK
        }
    }

    /// Bytes per block of `block_weights` weights.
    pub const fn block_bytes(self) -> usize {
        match self {
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q5_0 => 22,
            Format::Q5_1 => 24,
            Format::Q8_0 => 34,
            Format::Q4_K => 144,
            Format::Q5_K => 176,
            Format::Q6_K => 210,
        }
    }
}

/// A quantized `[out_features, in_features]` weight: a borrowed buffer of blocks whose length
/// was checked against its shape.
#[derive(Debug, Clone, Copy)]
pub struct QuantMatrix<'a> {
    format: Format,
    blocks: &'a [u8],
    out_features: usize,
    in_features: usize,
}

impl<'a> QuantMatrix<'a> {
    /// Checks that `blocks` holds `out_features` rows of `in_features / block_weights` blocks
    /// of `format`, `in_features` a positive multiple of the format's `block_weights`.
    pub fn new(
        format: Format,
        blocks: &'a [u8],
        out_features: usize,
        in_features: usize,
    ) -> Result<Self> {
        check_shape(format, "a quantized weight", out_features, in_features)?;
        let expected = elements(
            "the quantized weight",
            &[
                out_features,
                in_features / format.block_weights(),
                format.block_bytes(),
            ],
        )?;
        if blocks.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "the quantized weight has {} bytes, expected {expected} for [{out_features}, \
                 {in_features}] in {format:?}",
                blocks.len()
            )));
        }
        Ok(QuantMatrix {
            format,
            blocks,
            out_features,
            in_features,
        })
    }

    /// The block format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Output features (rows of the weight).
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Input features (weights per row).
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    fn row_bytes(&self) -> usize {
        self.in_features / self.format.block_weights() * self.format.block_bytes()
    }

    pub(crate) fn row(&self, index: usize) -> &'a [u8] {
        let bytes = self.row_bytes();
        &self.blocks[index * bytes..(index + 1) * bytes]
    }
}

/// One product, shared read-only by the threads; each writes only the output columns it claims.
pub(crate) struct Job {
    pub(crate) format: Format,
    pub(crate) x: *const f32,
    pub(crate) weight: *const u8,
    pub(crate) bias: *const f32,
    pub(crate) out: *mut f32,
    pub(crate) m: usize,
    pub(crate) out_features: usize,
    pub(crate) in_features: usize,
}

// SAFETY: the pointers come from slices that outlive the parallel region (`linear_with` returns
// after it), the inputs are only read, and threads write disjoint column ranges of `out`, each
// range claimed by exactly one thread through an atomic counter.
unsafe impl Sync for Job {}

/// Output columns claimed at a time are a multiple of this (the kernels' widest tile).
const COLUMN_GROUP: usize = 8;

/// `out[m, out] = x[m, in] · Wᵀ + bias`, on the process's OpenMP threads (see `parallel`).
pub fn linear(
    weight: &QuantMatrix<'_>,
    x: &[f32],
    m: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    let (n, k) = (weight.out_features, weight.in_features);
    check_floats("the input", x.len(), elements("the input", &[m, k])?)?;
    check_floats("the output", out.len(), elements("the output", &[m, n])?)?;
    if let Some(bias) = bias {
        check_floats("the bias", bias.len(), n)?;
    }
    if m == 0 {
        return Ok(());
    }
    let job = Job {
        format: weight.format,
        x: x.as_ptr(),
        weight: weight.blocks.as_ptr(),
        bias: bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
        out: out.as_mut_ptr(),
        m,
        out_features: n,
        in_features: k,
    };
    let work = (m + 1).saturating_mul(n).saturating_mul(k);
    let threads = if work >= PARALLEL_MIN_WORK {
        parallel::max_threads()
    } else {
        1
    };
    // Columns are claimed in chunks, so a thread slowed by a busy core takes fewer of them.
    let chunk = n.div_ceil(threads * 8).next_multiple_of(COLUMN_GROUP);
    let next = AtomicUsize::new(0);
    parallel::run(threads, &|_, _| loop {
        let start = next.fetch_add(chunk, Ordering::Relaxed);
        if start >= n {
            break;
        }
        let columns = start..(start + chunk).min(n);
        // SAFETY: every length was checked above, and this thread alone owns `columns`.
        unsafe { block::run(&job, columns) };
    });
    Ok(())
}

/// Checks that `[out_features, in_features]` has an output and whole blocks of `format`.
pub(crate) fn check_shape(
    format: Format,
    what: &str,
    out_features: usize,
    in_features: usize,
) -> Result<()> {
    let width = format.block_weights();
    if in_features == 0 || !in_features.is_multiple_of(width) || out_features == 0 {
        return Err(Error::InvalidArgument(format!(
            "{what} of {format:?} needs at least one output and a positive multiple of {width} \
             input features, got [{out_features}, {in_features}]"
        )));
    }
    Ok(())
}

fn check_floats(what: &str, len: usize, expected: usize) -> Result<()> {
    crate::error::check_len(what, len, expected)
}

#[cfg(test)]
pub(crate) mod tests;
