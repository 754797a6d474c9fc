//! The one-int8 path of `packed`: the same tiles, activations rounded to ONE int8 per value per
//! block of 32 (llama.cpp's Q8 activations; `rounding.rs`), for products of many rows (prefill
//! passes, and decode steps of many sequences).
//!
//! Why: a product of many rows is bound by arithmetic, not by reading weights. Split into two
//! int8 parts (`linear_packed`), an activation costs two `vpdpbusd` per four weights, the rate
//! of bfloat16's `vdpbf16ps`: no faster than a bfloat16 matrix multiply on the dequantized
//! weight. One part halves the integer work, at the price of activations rounded to 1/127 of
//! their block's largest magnitude (about 7 bits, where bfloat16 keeps 8).
//!
//! Arithmetic, the same in every kernel so that their results are bit-identical: an activation
//! block of 32 is `u·a` (`rounding.rs`), with its integer sum `Σa` and `s = u·Σa`. Per output,
//! per block, `acc = fma(Σq·a - z·Σa, d·u, acc)` (the integer sum exact in int32, the zero
//! point taken off there), then for Q4_1 and Q5_1 only `acc = fma(m, s, acc)`,
//! and finally `acc + bias`, rounded once to the output's type. A block holding a NaN or an
//! infinity makes its rows' outputs NaN.
//!
//! Work: panels of `PANEL_ROWS` rows times chunks of up to `CHUNK_TILES` tiles (fewer where
//! there are few panels, so that every thread can take several), claimed by the threads
//! through an atomic counter; in each, a tile group stays in L1 while the panel's rows
//! pass over it. The K-quants' kernels (`k_kernel.rs`) take the same work items: over every
//! row at once, a tile chunk met 2048 rows of SmolLM2's ffn_down (3 MB of int8 activations,
//! past a Zen 4 core's L2) and Q4_K ran a fifth slower at 1024 rows than at 256. A row's
//! outputs do not depend on the other rows of the call or on the threads.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::k_kernel;
#[cfg(target_arch = "x86_64")]
use super::layout::tile_block_bytes;
use super::layout::{value_at, values_bytes, zero_point};
use super::rounding::RoundedRows;
use super::{check_product, Job, PackedKernel, PackedMatrix, TILE};
use crate::element::Element;
use crate::parallel;
use crate::quant::{block, BLOCK};
use crate::Result;

/// Rows of a work item: a panel's int8 rows (60 × 1536 bytes at most for SmolLM2) stay in L2
/// while its tile chunk passes over them. A multiple of the AVX-512 kernel's register tile
/// (6 rows), so that only a call's last panel ends in a partial register tile.
const PANEL_ROWS: usize = 60;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(PANEL_ROWS.is_multiple_of(super::vnni_one_int8::ROWS));
/// The most tiles of a work item.
const CHUNK_TILES: usize = 12;

#[cfg(target_arch = "x86_64")]
impl<T> Job<T> {
    /// Asks for block `b` of tile `tile` of the weight, which the kernels read next, into the
    /// first-level cache, when the call has a single panel of rows (with more, each tile chunk
    /// meets the next panel while it is still in cache). Why: with few rows (a decode step of
    /// 16 sequences) a register tile passes over a tile's blocks in a few microseconds, and the
    /// next tile's blocks come from memory; the hardware prefetcher does not run that far
    /// ahead, so the memory and the arithmetic took turns (measured with the weights cold,
    /// gate_up's shape at 16 rows on AVX-512 VNNI: 140-160 µs, against 98 µs warm; with this
    /// 118-129 µs; the AVX2 kernel, slower at its arithmetic, gained about 4%). `tile` may lie
    /// past the last tile: the address is only computed, and a prefetch never faults.
    #[inline(always)]
    pub(super) fn prefetch_tile_block(&self, tile: usize, b: usize) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        if self.m > PANEL_ROWS {
            return;
        }
        let stride = tile_block_bytes(self.format);
        let at = self
            .weight
            .wrapping_add((tile * (self.in_features / BLOCK) + b) * stride);
        for line in (0..stride).step_by(64) {
            // SAFETY: a prefetch is a hint: it reads nothing the program sees and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast()) };
        }
    }
}

/// `out[m, n] = x[m, k] · Wᵀ + bias` on the packed weight with activations rounded to one int8
/// per value (see the module), `x` and `out` float32 or bf16, with `kernel`
/// (`InvalidArgument` when this CPU does not run it), on the process's OpenMP threads.
pub fn linear_packed_one_int8<T: Element>(
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
    let rows = RoundedRows::one_int8(x, kernel);
    let first_halves = k_kernel::first_halves(&rows, weight.format);
    let job = Job::new(weight, &rows, &first_halves, bias, out, m);
    let (tiles, threads) = (job.tiles(), job.threads());
    let panels = m.div_ceil(PANEL_ROWS);
    // About four items per thread at least, so that a thread slowed by a busy core takes fewer.
    let chunk = tiles
        .div_ceil((4 * threads).div_ceil(panels))
        .clamp(1, CHUNK_TILES);
    let chunks = tiles.div_ceil(chunk);
    let items = panels * chunks;
    let next = AtomicUsize::new(0);
    parallel::run(threads, &|_, _| loop {
        let item = next.fetch_add(1, Ordering::Relaxed);
        if item >= items {
            break;
        }
        let (panel, chunk_index) = (item / chunks, item % chunks);
        let rows = panel * PANEL_ROWS..(panel * PANEL_ROWS + PANEL_ROWS).min(m);
        let claimed = chunk_index * chunk..(chunk_index * chunk + chunk).min(tiles);
        // SAFETY: the kernel's token proves the CPU's features, every length was checked
        // above (Q6_K's first halves filled), and this thread alone owns the outputs of
        // `rows` × `claimed`.
        unsafe {
            if weight.format.is_k() {
                k_kernel::run(kernel, &job, rows, claimed);
                continue;
            }
            match kernel {
                PackedKernel::Portable => run_portable(&job, rows, claimed),
                #[cfg(target_arch = "x86_64")]
                PackedKernel::Avx2(cpu) => super::avx2::run_one_int8(cpu, &job, rows, claimed),
                #[cfg(target_arch = "x86_64")]
                PackedKernel::AvxVnni(cpu) => {
                    super::avx2::run_one_int8_vnni(cpu, &job, rows, claimed)
                }
                #[cfg(target_arch = "x86_64")]
                PackedKernel::Avx512Vnni(cpu) => {
                    super::vnni_one_int8::run(cpu, &job, rows, claimed)
                }
                #[cfg(not(target_arch = "x86_64"))]
                PackedKernel::Avx2(_) | PackedKernel::AvxVnni(_) | PackedKernel::Avx512Vnni(_) => {
                    unreachable!("detection makes no x86 token off x86-64")
                }
            }
        }
    });
    Ok(())
}

/// The portable kernel: the module's arithmetic one (row, column) at a time.
///
/// # Safety
/// `job`'s lengths are checked; no other thread writes the outputs of `rows` × `tiles`.
unsafe fn run_portable<T: Element>(job: &Job<T>, rows: Range<usize>, tiles: Range<usize>) {
    let (n, k) = (job.out_features, job.in_features);
    let blocks = k / BLOCK;
    // SAFETY: `linear_packed_one_int8` checked the buffers' extents.
    let input = unsafe { job.inputs() };
    let (weight, bytes) = (&input.weight, input.weight.bytes);
    let half = |at: usize| block::f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]));
    for column in tiles.start * TILE..(tiles.end * TILE).min(n) {
        let (t, lane) = (column / TILE, column % TILE);
        // SAFETY: the bias, when given, holds `n` floats.
        let bias = (!job.bias.is_null()).then(|| unsafe { *job.bias.add(column) });
        for row in rows.clone() {
            let mut acc = 0f32;
            for b in 0..blocks {
                let at = weight.tile_block(t, b);
                let dot: i32 = (0..BLOCK)
                    .map(|i| {
                        i32::from(value_at(job.format, bytes, at, lane, i))
                            * i32::from(input.whole[row * k + b * BLOCK + i])
                    })
                    .sum();
                let dot = dot - zero_point(job.format) * input.totals[row * blocks + b];
                let scales = at + values_bytes(job.format);
                let d = half(scales + 2 * lane);
                acc = (dot as f32).mul_add(d * input.units[row * blocks + b], acc);
                if job.format.has_offset() {
                    let offset = half(scales + 2 * TILE + 2 * lane);
                    acc = offset.mul_add(input.sums[row * blocks + b], acc);
                }
            }
            // SAFETY: (row, column) is inside the `m × n` output and this thread alone owns it.
            unsafe { *job.out.add(row * n + column) = T::store(acc + bias.unwrap_or(0.0)) };
        }
    }
}
