//! The integer path of `quant`: GGUF blocks repacked once, at load, into tiles that integer
//! dot-product instructions (AVX-512 VNNI's `vpdpbusd`) read directly, and a linear kernel on
//! activations split into two int8 parts per block of 32.
//!
//! Why: the float kernels of `quant.rs` spend about a dozen instructions expanding each block
//! to floats before multiplying, so they are bound by instructions (2 to 4 GB/s of blocks per
//! core), not by memory. Here the 16 output columns of a tile lie in the 16 lanes of a vector,
//! four consecutive weights of a column in each lane's four bytes, so one `vpdpbusd` multiplies
//! 64 weights with four activations broadcast to every lane and adds them into each column's
//! sum: no horizontal sums, no conversions per weight, and the nibbles need two instructions
//! per 128 of them.
//!
//! Why two parts: llama.cpp rounds activations to one int8 per value (a step of 1/127 of the
//! block's largest). Measured on SmolLM2-135M against its dequantized float32 model, that
//! changed the greedy output of 10 of 12 prompts within 32 tokens; a second int8 holding the
//! remainder in steps 256 times finer (1/32512 of the block's largest, finer than bfloat16's
//! rounding for all but the block's smallest values) costs a second `vpdpbusd` per four
//! weights and rows, and no more weight decoding.
//!
//! Tile layout: the columns `16t..16t+16` of a `[n, k]` weight (the last tile padded with zero
//! weights) make tile `t`, stored as its `k / 32` blocks in order, each:
//! - the values: for each group `g` of four weights `4g..4g+4` of the block (8 groups), 64
//!   bytes, column `c`'s four at bytes `4c..4c+4`. Q8_0 stores the signed values plus 128 (so
//!   every format is unsigned, as `vpdpbusd` wants its first operand), one group after another
//!   (512 bytes); Q4_0 and Q4_1 store the nibbles, group `g` in the low nibbles and group
//!   `g + 4` in the high nibbles of the same 64 bytes (256 bytes); Q5_0 and Q5_1 store their
//!   low four bits so, then the fifth bits in 64 bytes, each weight's in the byte position of
//!   its nibble, group `g`'s in bit `g` (320 bytes: Q5_K's sub-block layout, `k_layout.rs`);
//! - the 16 columns' scales `d`, then their offsets `m`, as halves (64 bytes): a weight is
//!   `d·(q - z) + m` in every format, with the zero point `z` 8 for Q4_0, 16 for Q5_0, 128
//!   for Q8_0 and 0 for Q4_1 and Q5_1, whose `m` is their own (0 for the others).
//!
//! Arithmetic, the same in every kernel so that their results are bit-identical: an activation
//! block of 32 is `s·(a + b/256)` with `s` = the largest magnitude / 127, `a` = `x/s` rounded to
//! nearest (ties to even) and `b` = the remainder times 256 rounded likewise (both int8),
//! `u = s/256` and the sum `u·Σ(256a + b)` kept beside it; per output, per block,
//! `acc = fma(256·Σq·a + Σq·b - z·Σ(256a + b), d·u, acc)` (the integer sum exact in int32,
//! the zero point taken off there rather than after rounding to a float, where it would
//! cancel) then `acc = fma(m, u·Σ(256a + b), acc)`, and finally `acc + bias`, rounded once to
//! the output's type. A block holding a NaN or an infinity makes its rows' outputs NaN.
//!
//! The K-quants (Q4_K, Q5_K, Q6_K) have their own tiles (`k_layout.rs`) and kernels
//! (`k_kernel.rs`), on the same activations (split, or rounded to one int8), with the same
//! steps per sub-block of 32.
//!
//! What must stay true: a row's outputs do not depend on the other rows of the call or on the
//! threads (each (row, column) is summed by the same operations in the same order).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{block, Format, BLOCK};
use crate::element::Element;
use crate::error::{check_len, elements};
use crate::isa::{Avx2, Avx512Vnni, AvxVnni};
use crate::parallel;
use crate::Result;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod fixtures;
#[cfg(target_arch = "x86_64")]
mod k_avx2;
#[cfg(target_arch = "x86_64")]
mod k_avx512;
mod k_kernel;
mod k_layout;
#[cfg(target_arch = "x86_64")]
mod k_q6;
#[cfg(target_arch = "x86_64")]
mod k_simd;
#[cfg(test)]
mod k_tests;
mod layout;
mod one_int8;
#[cfg(test)]
mod one_int8_tests;
mod rounding;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod vnni_one_int8;

pub use layout::{dequantize_packed, dequantize_packed_transposed, pack, packed_len, PackedMatrix};
use layout::{tile_block_bytes, value_at, values_bytes, zero_point};
pub use one_int8::linear_packed_one_int8;
use rounding::RoundedRows;

/// Output columns per tile (the 16 int32 lanes of an AVX-512 vector).
pub const TILE: usize = 16;

/// Multiply-adds below which a product runs on the calling thread alone. A decode step streams
/// every weight from memory, where one core reads about half of what two do: measured on a
/// 2-core Zen 4 with SmolLM2 (Q4_1, one row), a step took 12.2 ms with this at 2²² (every layer
/// on one thread), 10.0-10.5 at 2¹⁸ and 2¹⁹ (all but the smallest products on both), and
/// 10.3-12.6 at 0 (the region's start then costs more than the smallest products).
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// Which implementation of the integer kernel runs. A SIMD kernel holds its tier's token: only
/// detection makes one, so a value of this type is a kernel this CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedKernel {
    /// Plain Rust, any CPU (the reference the others equal bit for bit).
    Portable,
    /// x86-64 with AVX2, FMA and F16C (`vpmaddubsw`, see `avx2.rs`).
    Avx2(Avx2),
    /// The AVX2 kernel's loops with AVX-VNNI's 256-bit `vpdpbusd` (see `avx2.rs`).
    AvxVnni(AvxVnni),
    /// x86-64 with AVX-512 F, BW and VNNI.
    Avx512Vnni(Avx512Vnni),
}

impl PackedKernel {
    /// The fast kernel this CPU runs within the instruction-set ceiling (`SRT_CPU_ISA`), or
    /// `None` where there is none and the portable float kernel on blocks should run instead.
    pub fn best() -> Option<Self> {
        Avx512Vnni::active()
            .map(PackedKernel::Avx512Vnni)
            .or_else(|| AvxVnni::active().map(PackedKernel::AvxVnni))
            .or_else(|| Avx2::active().map(PackedKernel::Avx2))
    }

    /// Every kernel this CPU runs, whatever the ceiling, the portable one first: for tests
    /// that compare them.
    pub fn detected() -> Vec<Self> {
        let avx2 = Avx2::detected().map(PackedKernel::Avx2);
        let avx_vnni = AvxVnni::detected().map(PackedKernel::AvxVnni);
        let vnni = Avx512Vnni::detected().map(PackedKernel::Avx512Vnni);
        std::iter::once(PackedKernel::Portable)
            .chain(avx2)
            .chain(avx_vnni)
            .chain(vnni)
            .collect()
    }

    /// The kernel's name: `"portable"`, `"avx2"`, `"avx2_vnni"`, `"avx512_vnni"`.
    pub fn name(self) -> &'static str {
        match self {
            PackedKernel::Portable => "portable",
            PackedKernel::Avx2(_) => "avx2",
            PackedKernel::AvxVnni(_) => "avx2_vnni",
            PackedKernel::Avx512Vnni(_) => "avx512_vnni",
        }
    }
}

/// One product, shared read-only by the threads; each writes only the outputs it claims. Both
/// roundings of the activations take it: the split kernels (`linear_packed`) read `whole` and
/// `rest`, the one-int8 kernels (`linear_packed_one_int8`) `whole` alone.
pub(crate) struct Job<T> {
    pub(crate) format: Format,
    /// `[m, k]` parts `a` of the activations (`RoundedRows::whole`).
    pub(crate) whole: *const i8,
    /// Whether the activations are split into two int8 parts (else rounded to one).
    pub(crate) split: bool,
    /// `[m, k]` parts `b` of the split rounding (`RoundedRows::rest`), else empty.
    pub(crate) rest: *const i8,
    pub(crate) units: *const f32,
    pub(crate) totals: *const i32,
    pub(crate) sums: *const f32,
    /// Q6_K's `k_kernel::first_halves` (`[m, k / 32]`), else empty.
    pub(crate) first_halves: *const i32,
    pub(crate) weight: *const u8,
    pub(crate) bias: *const f32,
    pub(crate) out: *mut T,
    pub(crate) m: usize,
    pub(crate) out_features: usize,
    pub(crate) in_features: usize,
}

// SAFETY: the pointers come from buffers that outlive the parallel region (`linear_packed` and
// `linear_packed_one_int8` return after it), the inputs are only read, and threads write the
// outputs of disjoint work items, each claimed by exactly one thread through an atomic counter.
unsafe impl<T> Sync for Job<T> {}

impl<T> Job<T> {
    /// The product of `weight` by the `m` rounded rows `rows` into `out`, with Q6_K's
    /// `first_halves` (else empty), its lengths checked by `check_product`.
    fn new(
        weight: &PackedMatrix<'_>,
        rows: &RoundedRows,
        first_halves: &[i32],
        bias: Option<&[f32]>,
        out: &mut [T],
        m: usize,
    ) -> Self {
        Job {
            format: weight.format,
            whole: rows.whole.as_ptr(),
            split: !rows.rest.is_empty(),
            rest: rows.rest.as_ptr(),
            units: rows.units.as_ptr(),
            totals: rows.totals.as_ptr(),
            sums: rows.sums.as_ptr(),
            first_halves: first_halves.as_ptr(),
            weight: weight.bytes.as_ptr(),
            bias: bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
            out: out.as_mut_ptr(),
            m,
            out_features: weight.out_features,
            in_features: weight.in_features,
        }
    }

    /// Blocks of 32 per row, bytes per tile block, and where a tile block's scales start.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) fn tile_geometry(&self) -> (usize, usize, usize) {
        let format = self.format;
        let blocks = self.in_features / BLOCK;
        (blocks, tile_block_bytes(format), values_bytes(format))
    }

    /// The inputs as slices, for the portable kernels.
    ///
    /// # Safety
    /// The job's lengths are checked (`check_product`).
    unsafe fn inputs(&self) -> Inputs<'_> {
        let (m, n, k) = (self.m, self.out_features, self.in_features);
        let blocks = k / BLOCK;
        // SAFETY: the caller's promise; these slices cover exactly the buffers, only read.
        unsafe {
            Inputs {
                whole: std::slice::from_raw_parts(self.whole, m * k),
                units: std::slice::from_raw_parts(self.units, m * blocks),
                totals: std::slice::from_raw_parts(self.totals, m * blocks),
                sums: std::slice::from_raw_parts(self.sums, m * blocks),
                weight: PackedMatrix {
                    format: self.format,
                    bytes: std::slice::from_raw_parts(
                        self.weight,
                        n.div_ceil(TILE)
                            * (k / self.format.block_weights())
                            * tile_block_bytes(self.format),
                    ),
                    out_features: n,
                    in_features: k,
                },
            }
        }
    }

    /// The output tiles.
    fn tiles(&self) -> usize {
        self.out_features.div_ceil(TILE)
    }

    /// The threads the product runs on: the process's OpenMP threads from `PARALLEL_MIN_WORK`
    /// multiply-adds, the calling thread alone below.
    fn threads(&self) -> usize {
        let work = self
            .m
            .saturating_mul(self.out_features)
            .saturating_mul(self.in_features);
        if work >= PARALLEL_MIN_WORK {
            parallel::max_threads()
        } else {
            1
        }
    }
}

/// A job's inputs as slices, for the portable kernels: all but the split rounding's `rest` and
/// Q6_K's `first_halves`, which only some jobs hold.
struct Inputs<'a> {
    whole: &'a [i8],
    units: &'a [f32],
    totals: &'a [i32],
    sums: &'a [f32],
    weight: PackedMatrix<'a>,
}

/// `out[m, n] = x[m, k] · Wᵀ + bias` on the packed weight, `x` and `out` float32 or bf16,
/// with `kernel`, on the process's OpenMP threads.
pub fn linear_packed<T: Element>(
    kernel: PackedKernel,
    weight: &PackedMatrix<'_>,
    x: &[T],
    m: usize,
    bias: Option<&[f32]>,
    out: &mut [T],
) -> Result<()> {
    check_product(weight, x, m, bias, out)?;
    if m == 0 {
        return Ok(());
    }
    let rows = RoundedRows::split(x, kernel);
    run_on_tiles(kernel, weight, &rows, bias, out, m);
    Ok(())
}

/// The product of `weight` by the rounded rows `rows` (`m` of them; lengths checked) into
/// `out`, tile chunks claimed by the process's OpenMP threads: every product of split rows.
pub(super) fn run_on_tiles<T: Element>(
    kernel: PackedKernel,
    weight: &PackedMatrix<'_>,
    rows: &RoundedRows,
    bias: Option<&[f32]>,
    out: &mut [T],
    m: usize,
) {
    let first_halves = k_kernel::first_halves(rows, weight.format);
    let job = Job::new(weight, rows, &first_halves, bias, out, m);
    let (tiles, threads) = (job.tiles(), job.threads());
    // Tiles are claimed in chunks, so a thread slowed by a busy core takes fewer of them.
    let chunk = tiles.div_ceil(threads * 4).next_multiple_of(4);
    let next = AtomicUsize::new(0);
    parallel::run(threads, &|_, _| loop {
        let start = next.fetch_add(chunk, Ordering::Relaxed);
        if start >= tiles {
            break;
        }
        let claimed = start..(start + chunk).min(tiles);
        // SAFETY: the caller checked every length, and this thread alone owns the tiles
        // `claimed`.
        unsafe { run_kernel(kernel, &job, claimed) };
    });
}

/// Checks a product's lengths against the weight (`x` `[m, k]`, `out` `[m, n]`, the bias `n`).
pub(super) fn check_product<T>(
    weight: &PackedMatrix<'_>,
    x: &[T],
    m: usize,
    bias: Option<&[f32]>,
    out: &[T],
) -> Result<()> {
    let (n, k) = (weight.out_features, weight.in_features);
    check_len("the input", x.len(), elements("the input", &[m, k])?)?;
    check_len("the output", out.len(), elements("the output", &[m, n])?)?;
    if let Some(bias) = bias {
        check_len("the bias", bias.len(), n)?;
    }
    Ok(())
}

/// # Safety
/// `job`'s lengths are checked, its rows split unless its format is a K-quant; no other thread
/// writes `tiles`.
unsafe fn run_kernel<T: Element>(kernel: PackedKernel, job: &Job<T>, tiles: Range<usize>) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if job.format.is_k() {
            return k_kernel::run(kernel, job, 0..job.m, tiles);
        }
        debug_assert!(
            job.split,
            "one-int8 rows of blocks of 32 take `one_int8.rs`"
        );
        match kernel {
            PackedKernel::Portable => run_portable(job, tiles),
            #[cfg(target_arch = "x86_64")]
            PackedKernel::Avx2(cpu) => avx2::run(cpu, job, tiles),
            #[cfg(target_arch = "x86_64")]
            PackedKernel::AvxVnni(cpu) => avx2::run_vnni(cpu, job, tiles),
            #[cfg(target_arch = "x86_64")]
            PackedKernel::Avx512Vnni(cpu) => vnni::run(cpu, job, tiles),
            #[cfg(not(target_arch = "x86_64"))]
            PackedKernel::Avx2(_) | PackedKernel::AvxVnni(_) | PackedKernel::Avx512Vnni(_) => {
                unreachable!("detection makes no x86 token off x86-64")
            }
        }
    }
}

/// The portable kernel: the module's arithmetic one (row, column) at a time.
///
/// # Safety
/// As `run_kernel`.
unsafe fn run_portable<T: Element>(job: &Job<T>, tiles: Range<usize>) {
    let (m, n, k) = (job.m, job.out_features, job.in_features);
    let blocks = k / BLOCK;
    // SAFETY: the caller guarantees the buffers' extents, `rest`'s as the others'.
    let (input, rest) = unsafe { (job.inputs(), std::slice::from_raw_parts(job.rest, m * k)) };
    let (weight, bytes) = (&input.weight, input.weight.bytes);
    for column in tiles.start * TILE..(tiles.end * TILE).min(n) {
        let (t, lane) = (column / TILE, column % TILE);
        // SAFETY: the bias, when given, holds `n` floats.
        let bias = (!job.bias.is_null()).then(|| unsafe { *job.bias.add(column) });
        for row in 0..m {
            let mut acc = 0f32;
            for b in 0..blocks {
                let at = weight.tile_block(t, b);
                let (mut dot_high, mut dot_low) = (0i32, 0i32);
                for i in 0..BLOCK {
                    let q = i32::from(value_at(job.format, bytes, at, lane, i));
                    dot_high += q * i32::from(input.whole[row * k + b * BLOCK + i]);
                    dot_low += q * i32::from(rest[row * k + b * BLOCK + i]);
                }
                let zero = zero_point(job.format) * input.totals[row * blocks + b];
                let dot = (dot_high << 8) + dot_low - zero;
                let scale_at = at + values_bytes(job.format);
                let half = |offset: usize| {
                    block::f16_to_f32(u16::from_le_bytes([bytes[offset], bytes[offset + 1]]))
                };
                let (d, offset) = (
                    half(scale_at + 2 * lane),
                    half(scale_at + 2 * TILE + 2 * lane),
                );
                acc = (dot as f32).mul_add(d * input.units[row * blocks + b], acc);
                acc = offset.mul_add(input.sums[row * blocks + b], acc);
            }
            // SAFETY: (row, column) is inside the `m × n` output and this thread alone owns
            // the column's tile.
            unsafe { *job.out.add(row * n + column) = T::store(acc + bias.unwrap_or(0.0)) };
        }
    }
}
