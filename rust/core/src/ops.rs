//! Float32 row-wise operators of the models on the CPU, each one pass over its rows: RMSNorm
//! (optionally after adding the layer's output to the residual stream), the gated SiLU, and the
//! rotary position embedding.
//!
//! Why: between two linear layers a decode step runs these on a few rows, where PyTorch's
//! separate element-wise operators (five for an RMSNorm) cost more in fixed overhead and extra
//! passes than the arithmetic. Each row is computed alone, so results do not depend on the batch.

use crate::error::{check_len, elements};
use crate::parallel;
use crate::{Error, Result};

/// Calls with fewer elements than this run on the calling thread alone.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;

/// Lanes of the partial sums (one AVX register; the compiler vectorizes the fixed-size loops).
const LANES: usize = 8;

/// Runs `work(first_row, rows)` over `rows` rows, split between threads when the call is large.
fn for_row_ranges(rows: usize, elements: usize, work: &(dyn Fn(usize, usize) + Sync)) {
    let threads = if elements >= PARALLEL_MIN_ELEMENTS {
        parallel::max_threads()
    } else {
        1
    };
    parallel::run(threads, &|thread, threads| {
        let (start, end) = (rows * thread / threads, rows * (thread + 1) / threads);
        if start < end {
            work(start, end - start);
        }
    });
}

/// Mutable float pointer shared by threads that write disjoint rows.
#[derive(Clone, Copy)]
struct Rows(*mut f32);

// SAFETY: every user splits the rows between threads so that no two write the same element, and
// the buffer outlives the parallel region.
unsafe impl Sync for Rows {}

impl Rows {
    /// Rows `first..first + count` of width `dim`.
    ///
    /// # Safety
    /// They lie inside the buffer, which outlives `'a`, and no other thread touches them.
    unsafe fn rows<'a>(self, first: usize, count: usize, dim: usize) -> &'a mut [f32] {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(first * dim), count * dim) }
    }
}

/// `out[r] = weight · x[r] / sqrt(mean(x[r]²) + eps)` for each row of `weight.len()` floats.
/// With `residual`, each row of `x` is first added into it (in place) and the sum normalized:
/// the pre-norm of a decoder layer.
pub fn rms_norm(
    x: &[f32],
    residual: Option<&mut [f32]>,
    weight: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<()> {
    let dim = weight.len();
    if dim == 0 || x.len() % dim != 0 {
        return Err(Error::InvalidArgument(format!(
            "rows of {dim} floats cannot hold an input of {} floats",
            x.len()
        )));
    }
    check_len("the output", out.len(), x.len())?;
    if let Some(residual) = &residual {
        check_len("the residual", residual.len(), x.len())?;
    }
    let rows = x.len() / dim;
    let (out, residual) = (
        Rows(out.as_mut_ptr()),
        residual.map(|r| Rows(r.as_mut_ptr())),
    );
    for_row_ranges(rows, x.len(), &|first, count| {
        let input = &x[first * dim..(first + count) * dim];
        // SAFETY: `for_row_ranges` hands each thread its own rows, inside the checked lengths.
        let (out, residual) = unsafe {
            (
                out.rows(first, count, dim),
                residual.map(|r| r.rows(first, count, dim)),
            )
        };
        simd::rms_norm_rows(input, residual, weight, eps, out);
    });
    Ok(())
}

/// `out[r] = silu(gate[r]) · up[r]` where each row of `gate_up` is `[gate | up]`, both of
/// `out`'s row width `dim`.
pub fn silu_and_mul(gate_up: &[f32], dim: usize, out: &mut [f32]) -> Result<()> {
    let row = elements("a row of the input", &[2, dim])?;
    if dim == 0 || gate_up.len() % row != 0 {
        return Err(Error::InvalidArgument(format!(
            "rows of 2 × {dim} floats cannot hold an input of {} floats",
            gate_up.len()
        )));
    }
    check_len("the output", out.len(), gate_up.len() / 2)?;
    let rows = out.len() / dim;
    let out = Rows(out.as_mut_ptr());
    for_row_ranges(rows, gate_up.len(), &|first, count| {
        let input = &gate_up[first * row..(first + count) * row];
        // SAFETY: `for_row_ranges` hands each thread its own rows, inside the checked length.
        let out = unsafe { out.rows(first, count, dim) };
        simd::silu_and_mul_rows(input, dim, out);
    });
    Ok(())
}

/// Rotates each `head_dim`-wide head of each token's row of `x` by the token's row of `cos` and
/// `sin` (`[tokens, head_dim]`; `sin` signed as `[-sin | sin]`), in the rotate-half layout:
/// `out = x · cos + [x₂ | x₁] · sin`, each product rounded before the sum, as PyTorch computes it.
pub fn rotary(x: &[f32], cos: &[f32], sin: &[f32], head_dim: usize, out: &mut [f32]) -> Result<()> {
    if head_dim == 0 || head_dim % 2 != 0 || cos.len() % head_dim != 0 {
        return Err(Error::InvalidArgument(format!(
            "rotary tables of {} floats do not hold rows of an even head size {head_dim}",
            cos.len()
        )));
    }
    let tokens = cos.len() / head_dim;
    check_len("the sine table", sin.len(), cos.len())?;
    check_len("the output", out.len(), x.len())?;
    if tokens == 0 || x.len() % (tokens * head_dim) != 0 {
        return Err(Error::InvalidArgument(format!(
            "{} floats are not whole heads of {head_dim} for {tokens} tokens",
            x.len()
        )));
    }
    let width = x.len() / tokens;
    let out = Rows(out.as_mut_ptr());
    for_row_ranges(tokens, x.len(), &|first, count| {
        let input = &x[first * width..(first + count) * width];
        let tables = first * head_dim..(first + count) * head_dim;
        // SAFETY: `for_row_ranges` hands each thread its own rows, inside the checked length.
        let out = unsafe { out.rows(first, count, width) };
        simd::rotary_rows(input, &cos[tables.clone()], &sin[tables], head_dim, out);
    });
    Ok(())
}

/// The row loops, compiled for AVX2 when the CPU has it and portably otherwise.
mod simd {
    use super::LANES;
    use crate::attention::exp_nonpositive;

    pub(super) fn rms_norm_rows(
        x: &[f32],
        residual: Option<&mut [f32]>,
        weight: &[f32],
        eps: f32,
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { rms_norm_avx2(x, residual, weight, eps, out) };
        }
        rms_norm_portable(x, residual, weight, eps, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn rms_norm_avx2(
        x: &[f32],
        residual: Option<&mut [f32]>,
        weight: &[f32],
        eps: f32,
        out: &mut [f32],
    ) {
        rms_norm_portable(x, residual, weight, eps, out);
    }

    #[inline(always)]
    fn rms_norm_portable(
        x: &[f32],
        residual: Option<&mut [f32]>,
        weight: &[f32],
        eps: f32,
        out: &mut [f32],
    ) {
        let dim = weight.len();
        let source: &[f32] = match residual {
            Some(residual) => {
                for (sum, &value) in residual.iter_mut().zip(x) {
                    *sum += value;
                }
                residual
            }
            None => x,
        };
        for (row, out_row) in source.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
            let mut squares = [0f32; LANES];
            let chunks = row.chunks_exact(LANES);
            let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
            for chunk in chunks {
                for lane in 0..LANES {
                    squares[lane] += chunk[lane] * chunk[lane];
                }
            }
            let mean = (squares.iter().sum::<f32>() + tail) / dim as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            for ((o, &value), &w) in out_row.iter_mut().zip(row).zip(weight) {
                *o = w * (value * scale);
            }
        }
    }

    pub(super) fn silu_and_mul_rows(gate_up: &[f32], dim: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { silu_and_mul_avx2(gate_up, dim, out) };
        }
        silu_and_mul_portable(gate_up, dim, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn silu_and_mul_avx2(gate_up: &[f32], dim: usize, out: &mut [f32]) {
        silu_and_mul_portable(gate_up, dim, out);
    }

    pub(super) fn rotary_rows(x: &[f32], cos: &[f32], sin: &[f32], dim: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { rotary_avx2(x, cos, sin, dim, out) };
        }
        rotary_portable(x, cos, sin, dim, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn rotary_avx2(x: &[f32], cos: &[f32], sin: &[f32], dim: usize, out: &mut [f32]) {
        rotary_portable(x, cos, sin, dim, out);
    }

    #[inline(always)]
    fn rotary_portable(x: &[f32], cos: &[f32], sin: &[f32], dim: usize, out: &mut [f32]) {
        let half = dim / 2;
        let width = x.len() / (cos.len() / dim);
        let rows = x.chunks_exact(width).zip(out.chunks_exact_mut(width));
        for ((row, out_row), (cos, sin)) in
            rows.zip(cos.chunks_exact(dim).zip(sin.chunks_exact(dim)))
        {
            for (head, out_head) in row.chunks_exact(dim).zip(out_row.chunks_exact_mut(dim)) {
                let (first, second) = head.split_at(half);
                let (out_first, out_second) = out_head.split_at_mut(half);
                let (cos_first, cos_second) = cos.split_at(half);
                let (sin_first, sin_second) = sin.split_at(half);
                for i in 0..half {
                    out_first[i] = first[i] * cos_first[i] + second[i] * sin_first[i];
                    out_second[i] = second[i] * cos_second[i] + first[i] * sin_second[i];
                }
            }
        }
    }

    #[inline(always)]
    fn silu_and_mul_portable(gate_up: &[f32], dim: usize, out: &mut [f32]) {
        for (row, out_row) in gate_up.chunks_exact(2 * dim).zip(out.chunks_exact_mut(dim)) {
            let (gate, up) = row.split_at(dim);
            for ((o, &g), &u) in out_row.iter_mut().zip(gate).zip(up) {
                // silu(g) = g · sigmoid(g), with e^(-|g|) <= 1 so that nothing overflows.
                let e = exp_nonpositive(-g.abs());
                let sigmoid = if g >= 0.0 {
                    1.0 / (1.0 + e)
                } else {
                    e / (1.0 + e)
                };
                *o = g * sigmoid * u;
            }
        }
    }
}

#[cfg(test)]
mod tests;
