//! The AVX2/FMA kernel of `gemm::linear`.
//!
//! A tile is `R` rows of the output by `W` panels (16 columns each): `R × 2W` accumulator
//! registers that stay in registers while the tile walks the inner dimension, reading one
//! broadcast input value per row and two weight vectors per panel at each step. Six rows of one
//! panel (12 accumulators) keep both FMA pipes of a Zen or Skylake core busy; with fewer rows
//! than four, a tile spans several panels instead, so that there are still at least 8
//! independent accumulators. Rows are taken in blocks whose input fits in L2, so that every
//! panel of a thread's share passes over input that is already cached.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Job, PANEL};
use crate::isa::Avx2;

/// The most rows in a tile (12 accumulators of the 16 AVX registers).
const TILE_ROWS: usize = 6;

/// Bytes of input rows kept in L2 while panels pass over them.
const ROW_BLOCK_BYTES: usize = 256 << 10;

/// Panels a tile spans when the product has `m` rows (threads split panels in multiples of it).
pub(super) fn panels_per_tile(m: usize) -> usize {
    match m {
        1 => 4,
        2 | 3 => 2,
        _ => 1,
    }
}

/// Computes the output columns of `panels` for every row of `job`.
///
/// # Safety
/// `job`'s pointers hold `m·k` inputs, the packed `[n, k]` weight,
/// `n` biases (or are null) and `m·n` outputs; no other thread writes these panels' columns.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run(cpu: Avx2, job: &Job, panels: Range<usize>) {
    let block = (ROW_BLOCK_BYTES / (4 * job.k) / TILE_ROWS * TILE_ROWS).max(TILE_ROWS);
    let mut first_row = 0;
    while first_row < job.m {
        let rows = block.min(job.m - first_row);
        let group = panels_per_tile(rows);
        let tiles = rows.div_ceil(TILE_ROWS);
        let mut panel = panels.start;
        while panel < panels.end {
            let width = group.min(panels.end - panel);
            // The first tile over these panels streams them in from memory; it asks for the
            // panels after them meanwhile (whichever thread claims those: the last level cache
            // is shared), so that the next first tile finds them in cache instead of waiting.
            let next = panel + width;
            let ahead = group.min(job.n.div_ceil(PANEL).saturating_sub(next));
            // The block's rows are spread evenly over its tiles (7 rows: 4 + 3, not 6 + 1).
            let mut row = first_row;
            for tile in 0..tiles {
                let tile_rows = (first_row + rows - row).div_ceil(tiles - tile);
                let prefetch = if tile == 0 { ahead } else { 0 };
                let at = Tile {
                    row,
                    panel,
                    prefetch,
                };
                // SAFETY: rows `row..row + tile_rows` and panels `panel..next` lie inside the job
                // and this thread's share, as the caller guarantees; `next..next + prefetch`
                // inside the job.
                unsafe { dispatch(cpu, job, at, tile_rows, width) };
                row += tile_rows;
            }
            panel += width;
        }
        first_row += rows;
    }
}

/// Where a tile starts, and how many panels after its own it prefetches.
#[derive(Clone, Copy)]
struct Tile {
    row: usize,
    panel: usize,
    prefetch: usize,
}

/// Runs the tile of `rows × width` (as `panels_per_tile` allows) at `at`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dispatch(cpu: Avx2, job: &Job, at: Tile, rows: usize, width: usize) {
    // SAFETY: forwarded from `run`; every arm's constants equal (`rows`, `width`).
    unsafe {
        match (rows, width) {
            (1, 4) => tile::<1, 4>(cpu, job, at),
            (1, 3) => tile::<1, 3>(cpu, job, at),
            (1, 2) => tile::<1, 2>(cpu, job, at),
            (1, _) => tile::<1, 1>(cpu, job, at),
            (2, 2) => tile::<2, 2>(cpu, job, at),
            (2, _) => tile::<2, 1>(cpu, job, at),
            (3, 2) => tile::<3, 2>(cpu, job, at),
            (3, _) => tile::<3, 1>(cpu, job, at),
            (4, _) => tile::<4, 1>(cpu, job, at),
            (5, _) => tile::<5, 1>(cpu, job, at),
            _ => tile::<6, 1>(cpu, job, at),
        }
    }
}

/// Output rows `at.row..at.row + R`, columns of panels `at.panel..at.panel + W`.
#[inline(always)]
unsafe fn tile<const R: usize, const W: usize>(cpu: Avx2, job: &Job, at: Tile) {
    let Tile {
        row,
        panel,
        prefetch,
    } = at;
    let k = job.k;
    // SAFETY: the caller keeps rows and panels inside the job, so every offset below stays
    // inside the buffers `Job` describes; loads and stores are unaligned ones.
    unsafe {
        let x = job.x.add(row * k);
        let weights = job.packed.add(panel * k * PANEL);
        // One cache line (16 floats) per inner step and panel: the next panels, whole.
        let upcoming = weights.add(W * k * PANEL);
        let mut acc = [[[_mm256_setzero_ps(); 2]; W]; R];
        for inner in 0..k {
            for q in 0..prefetch {
                _mm_prefetch::<_MM_HINT_T0>(upcoming.add((q * k + inner) * PANEL).cast());
            }
            let mut w = [[_mm256_setzero_ps(); 2]; W];
            for (q, pair) in w.iter_mut().enumerate() {
                let lanes = weights.add((q * k + inner) * PANEL);
                *pair = [_mm256_loadu_ps(lanes), _mm256_loadu_ps(lanes.add(8))];
            }
            for (r, sums) in acc.iter_mut().enumerate() {
                let value = _mm256_broadcast_ss(&*x.add(r * k + inner));
                for (sum, pair) in sums.iter_mut().zip(&w) {
                    sum[0] = _mm256_fmadd_ps(value, pair[0], sum[0]);
                    sum[1] = _mm256_fmadd_ps(value, pair[1], sum[1]);
                }
            }
        }
        for (r, sums) in acc.iter().enumerate() {
            for (q, sum) in sums.iter().enumerate() {
                let column = (panel + q) * PANEL;
                store(cpu, job, (row + r) * job.n + column, column, sum);
            }
        }
    }
}

/// Writes one row of a panel's sums, plus the bias, at `out[offset..]` (output column `column`);
/// the columns past `n` of the last, zero-padded panel are dropped.
#[inline(always)]
unsafe fn store(_: Avx2, job: &Job, offset: usize, column: usize, sum: &[__m256; 2]) {
    // SAFETY: `offset` is the output element of (row, `column`), inside the output; the bias
    // and output are read and written only at columns below `n`.
    unsafe {
        let out = job.out.add(offset);
        if column + PANEL <= job.n {
            let mut lanes = *sum;
            if !job.bias.is_null() {
                lanes[0] = _mm256_add_ps(lanes[0], _mm256_loadu_ps(job.bias.add(column)));
                lanes[1] = _mm256_add_ps(lanes[1], _mm256_loadu_ps(job.bias.add(column + 8)));
            }
            _mm256_storeu_ps(out, lanes[0]);
            _mm256_storeu_ps(out.add(8), lanes[1]);
            return;
        }
        let mut values = [0f32; PANEL];
        _mm256_storeu_ps(values.as_mut_ptr(), sum[0]);
        _mm256_storeu_ps(values.as_mut_ptr().add(8), sum[1]);
        for (lane, value) in values.iter().enumerate().take(job.n - column) {
            let bias = if job.bias.is_null() {
                0.0
            } else {
                *job.bias.add(column + lane)
            };
            *out.add(lane) = value + bias;
        }
    }
}
