//! `linear_packed` and `linear_packed_one_int8` on the K-quants' tiles (`k_layout.rs`):
//! activations split into two int8 parts per block of 32, or rounded to one, as for every
//! format (`rounding.rs`), each sub-block of 32 of a super-block meeting its block of
//! activations.
//!
//! Arithmetic, the same in every kernel so that their results are bit-identical. Per output,
//! per super-block, `d` and `dmin` its column's halves as floats; per sub-block `j` of 32 (the
//! activation block `b`, with `u`, `Σ(256a + b)` and `u·Σ(256a + b)` as in `packed.rs`):
//! - Q4_K, Q5_K: `acc = fma(256·Σq·a + Σq·b, (d·sc_j)·u, acc)` then
//!   `acc = fma(-(dmin·m_j), u·Σ(256a + b), acc)`: `packed.rs`'s steps for Q4_1 with its
//!   scale `d·sc_j` (exact in float32: a half times a 6-bit integer) and offset `-dmin·m_j`
//!   (exact likewise);
//! - Q6_K, whose scales are per 16 weights: the block's two halves (weights 0-15 and 16-31,
//!   the low and high nibbles of the tile's bytes), each `p` with its own integer sum,
//!   `acc = fma(256·Σq·a + Σq·b - 32·T_p, (d·sc_{2j+p})·u, acc)`, the half `p = 0` first;
//!   `T_0` is the first half's `Σ(256a + b)` (`first_halves`) and `T_1` the block's total
//!   minus `T_0`.
//!
//! and finally `acc + bias`, rounded once to the output's type. With one int8 per activation
//! (`u`, `Σa` and `u·Σa` as in `one_int8.rs`) the steps are the same with `Σq·a` in place of
//! `256·Σq·a + Σq·b`, and `T_0` the first half's `Σa`, but for Q6_K: its two halves meet their
//! scales in integers, `acc = fma(sc_{2j}·(Σ₀q·a - 32·T_0) + sc_{2j+1}·(Σ₁q·a - 32·T_1), d·u,
//! acc)`, exact in int32 and in its conversion to float32 (at most `2·128·16·32·127`, about
//! 1.66·10⁷, below 2²⁴): the float work of one block of 32 instead of two. The integer sums
//! are exact in int32: at most `256·32·31·127 + 32·31·127` (Q5_K, about 3.2·10⁷) for a
//! sub-block, and for a Q6_K half `256·16·63·127 + 16·63·127 + 32·16·32639` (about 4.9·10⁷),
//! far below 2³¹. A block of activations holding a NaN or an infinity makes its rows' outputs
//! NaN, as a NaN unit multiplies every scale of it.

use std::ops::Range;

use super::k_layout::{halves, scale_min, value_at};
use super::rounding::RoundedRows;
use super::{Job, PackedKernel, TILE};
use crate::element::Element;
use crate::quant::{Format, BLOCK, SUPER_BLOCK};

/// Q6_K's per-block sums of the first 16 values `256a + b` of split rows, or `a` of one-int8
/// rows (`[m, k / 32]`); empty for the other formats. Plain integer sums, so the same whatever
/// tier rounded.
pub(super) fn first_halves(rows: &RoundedRows, format: Format) -> Vec<i32> {
    if format != Format::Q6_K {
        return Vec::new();
    }
    let wholes = rows.whole.chunks_exact(BLOCK);
    if rows.rest.is_empty() {
        return wholes
            .map(|a| a[..BLOCK / 2].iter().map(|&a| i32::from(a)).sum())
            .collect();
    }
    wholes
        .zip(rows.rest.chunks_exact(BLOCK))
        .map(|(a, b)| {
            a[..BLOCK / 2]
                .iter()
                .zip(&b[..BLOCK / 2])
                .map(|(&a, &b)| 256 * i32::from(a) + i32::from(b))
                .sum()
        })
        .collect()
}

/// Rows `rows` of tiles `tiles` of `job` (a K-quant, its rows split or rounded to one int8)
/// with `kernel`.
///
/// # Safety
/// `job`'s lengths are checked (`first_halves` filled for Q6_K); `rows` lie inside the job; no
/// other thread writes the outputs of `rows` × `tiles`.
pub(super) unsafe fn run<T: Element>(
    kernel: PackedKernel,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match kernel {
            PackedKernel::Portable => run_portable(job, rows, tiles),
            #[cfg(target_arch = "x86_64")]
            PackedKernel::Avx2(cpu) => super::k_avx2::run(cpu, job, rows, tiles),
            #[cfg(target_arch = "x86_64")]
            PackedKernel::AvxVnni(cpu) => super::k_avx2::run_vnni(cpu, job, rows, tiles),
            #[cfg(target_arch = "x86_64")]
            PackedKernel::Avx512Vnni(cpu) => super::k_avx512::run(cpu, job, rows, tiles),
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
/// As `run`.
unsafe fn run_portable<T: Element>(job: &Job<T>, rows: Range<usize>, tiles: Range<usize>) {
    let (m, n, k, format) = (job.m, job.out_features, job.in_features, job.format);
    let blocks = k / BLOCK;
    let halves_len = if format == Format::Q6_K {
        m * blocks
    } else {
        0
    };
    let rest_len = if job.split { m * k } else { 0 };
    // SAFETY: the caller guarantees the buffers' extents, `rest`'s (split rows) and
    // `first_halves`' as the others'.
    let (input, rest, first) = unsafe {
        (
            job.inputs(),
            std::slice::from_raw_parts(job.rest, rest_len),
            std::slice::from_raw_parts(job.first_halves, halves_len),
        )
    };
    let (weight, bytes) = (&input.weight, input.weight.bytes);
    // The integer sums of `256a + b` (split rows) or `a` times the values `i` of column `lane`
    // of the tile super-block at `at`.
    let dot = |row: usize, b: usize, at: usize, lane: usize, i: Range<usize>| {
        let (mut high, mut low) = (0i32, 0i32);
        for i in i {
            let q = i32::from(value_at(format, bytes, at, lane, (b % 8) * BLOCK + i));
            high += q * i32::from(input.whole[row * k + b * BLOCK + i]);
            if job.split {
                low += q * i32::from(rest[row * k + b * BLOCK + i]);
            }
        }
        if job.split {
            (high << 8) + low
        } else {
            high
        }
    };
    for column in tiles.start * TILE..(tiles.end * TILE).min(n) {
        let (t, lane) = (column / TILE, column % TILE);
        // SAFETY: the bias, when given, holds `n` floats.
        let bias = (!job.bias.is_null()).then(|| unsafe { *job.bias.add(column) });
        for row in rows.clone() {
            let mut acc = 0f32;
            for s in 0..k / SUPER_BLOCK {
                let at = weight.tile_block(t, s);
                let (d, dmin) = halves(format, bytes, at, lane);
                for b in 8 * s..8 * s + 8 {
                    let unit = input.units[row * blocks + b];
                    if format == Format::Q6_K {
                        let first_half = first[row * blocks + b];
                        let totals = [first_half, input.totals[row * blocks + b] - first_half];
                        // Each half's scale, and its sum less 32 times its activations' sum.
                        let parts = [0, 1].map(|p| {
                            let (sc, _) = scale_min(format, bytes, at, lane, 2 * (b % 8) + p);
                            let sum = dot(row, b, at, lane, 16 * p..16 * p + 16);
                            (sc, sum - 32 * totals[p])
                        });
                        if job.split {
                            for (sc, sum) in parts {
                                acc = (sum as f32).mul_add((d * f32::from(sc)) * unit, acc);
                            }
                        } else {
                            let sum: i32 = parts.iter().map(|&(sc, sum)| i32::from(sc) * sum).sum();
                            acc = (sum as f32).mul_add(d * unit, acc);
                        }
                    } else {
                        let (sc, m) = scale_min(format, bytes, at, lane, b % 8);
                        let sum = dot(row, b, at, lane, 0..BLOCK);
                        acc = (sum as f32).mul_add((d * f32::from(sc)) * unit, acc);
                        acc = (-(dmin * f32::from(m))).mul_add(input.sums[row * blocks + b], acc);
                    }
                }
            }
            // SAFETY: (row, column) is inside the `m × n` output and this thread alone owns
            // the column's tile.
            unsafe { *job.out.add(row * n + column) = T::store(acc + bias.unwrap_or(0.0)) };
        }
    }
}
