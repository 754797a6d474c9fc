//! Row-wise operators of the models on the CPU, each one pass over its rows, in float32 or
//! bf16 ([`Element`]): RMSNorm (optionally after adding the layer's output to the residual
//! stream), the gated SiLU, and the rotary position embedding.
//!
//! Why: between two linear layers a decode step runs these on a few rows, where PyTorch's
//! separate element-wise operators (five for an RMSNorm) cost more in fixed overhead and extra
//! passes than the arithmetic. Each row is computed alone, so results do not depend on the batch.
//!
//! Arithmetic is float32 in every case; bf16 values are rounded (to nearest even) where
//! PyTorch's bf16 operators round theirs: after each product and sum that PyTorch stores as a
//! bf16 tensor. The instruction-set tiers (`isa`) compute the same bits: the sums run in the
//! same fixed order on every tier, and no product is fused into an add, except in the gated
//! SiLU's exponential, which fuses the same products on every tier (`silu.rs`).

use crate::element::Element;
use crate::error::{check_len, check_rows, elements};
use crate::isa::{self, Isa};
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

/// Mutable element pointer shared by threads that write disjoint rows.
struct Rows<T>(*mut T);

impl<T> Clone for Rows<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Rows<T> {}

// SAFETY: every user splits the rows between threads so that no two write the same element, and
// the buffer outlives the parallel region.
unsafe impl<T> Sync for Rows<T> {}

impl<T> Rows<T> {
    /// Rows `first..first + count` of width `dim`.
    ///
    /// # Safety
    /// They lie inside the buffer, which outlives `'a`, and no other thread touches them.
    unsafe fn rows<'a>(self, first: usize, count: usize, dim: usize) -> &'a mut [T] {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(first * dim), count * dim) }
    }
}

/// `out[r] = weight · x[r] / sqrt(mean(x[r]²) + eps)` for each row of `weight.len()` floats.
/// With `residual`, each row of `x` is first added into it (in place) and the sum normalized:
/// the pre-norm of a decoder layer. In bf16 the sum is rounded as it is stored, the normalized
/// value is rounded before the weight multiplies it, and the product is rounded (Hugging Face's
/// `weight * x.to(input_dtype)`).
pub fn rms_norm<T: Element>(
    x: &[T],
    residual: Option<&mut [T]>,
    weight: &[T],
    eps: f32,
    out: &mut [T],
) -> Result<()> {
    rms_norm_on(isa::active(), x, residual, weight, eps, out)
}

/// [`rms_norm`] on the tier `isa` (or the detected one, if lower).
pub fn rms_norm_on<T: Element>(
    isa: Isa,
    x: &[T],
    residual: Option<&mut [T]>,
    weight: &[T],
    eps: f32,
    out: &mut [T],
) -> Result<()> {
    let dim = weight.len();
    if dim == 0 || !x.len().is_multiple_of(dim) {
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
        simd::rms_norm_rows(isa, input, residual, weight, eps, out);
    });
    Ok(())
}

/// `out[r] = silu(gate[r]) · up[r]` where each row of `gate_up` is `[gate | up]`, both of
/// `out`'s row width `dim`. In bf16 `silu(gate)` is rounded before the product, as PyTorch's
/// `F.silu(gate) * up` rounds it.
pub fn silu_and_mul<T: Element>(gate_up: &[T], dim: usize, out: &mut [T]) -> Result<()> {
    silu_and_mul_on(isa::active(), gate_up, dim, out)
}

/// [`silu_and_mul`] on the tier `isa` (or the detected one, if lower).
pub fn silu_and_mul_on<T: Element>(
    isa: Isa,
    gate_up: &[T],
    dim: usize,
    out: &mut [T],
) -> Result<()> {
    let row = elements("a row of the input", &[2, dim])?;
    if dim == 0 || !gate_up.len().is_multiple_of(row) {
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
        silu::silu_and_mul_rows(isa, input, dim, out);
    });
    Ok(())
}

/// Rotates each `head_dim`-wide head of each token's row of `x` by the token's row of `cos` and
/// `sin` (`[tokens, head_dim]`; `sin` signed as `[-sin | sin]`), in the rotate-half layout:
/// `out = x · cos + [x₂ | x₁] · sin`, each product rounded before the sum, as PyTorch computes it
/// (in bf16, each product and the sum rounded to bf16). `x` and `out` are contiguous rows of the
/// same width.
pub fn rotary<T: Element>(
    x: &[T],
    cos: &[T],
    sin: &[T],
    head_dim: usize,
    out: &mut [T],
) -> Result<()> {
    rotary_on(isa::active(), x, cos, sin, head_dim, out)
}

/// [`rotary`] on the tier `isa` (or the detected one, if lower).
pub fn rotary_on<T: Element>(
    isa: Isa,
    x: &[T],
    cos: &[T],
    sin: &[T],
    head_dim: usize,
    out: &mut [T],
) -> Result<()> {
    check_len("the output", out.len(), x.len())?;
    let tokens = rotary_tokens(cos, head_dim)?;
    // Contiguous rows are rows at a stride of their own width.
    let stride = x.len().checked_div(tokens).unwrap_or(0);
    rotary_strided_on(isa, x, stride, cos, sin, head_dim, out)
}

/// [`rotary`] of input rows that lie `x_stride` elements apart (each row's heads contiguous):
/// the query or key columns of a fused QKV projection's output, read in place. `x` runs from
/// the first row's start to at least the last row's end; the output is contiguous, its length
/// giving the row width.
pub fn rotary_strided<T: Element>(
    x: &[T],
    x_stride: usize,
    cos: &[T],
    sin: &[T],
    head_dim: usize,
    out: &mut [T],
) -> Result<()> {
    rotary_strided_on(isa::active(), x, x_stride, cos, sin, head_dim, out)
}

/// [`rotary_strided`] on the tier `isa` (or the detected one, if lower).
pub fn rotary_strided_on<T: Element>(
    isa: Isa,
    x: &[T],
    x_stride: usize,
    cos: &[T],
    sin: &[T],
    head_dim: usize,
    out: &mut [T],
) -> Result<()> {
    let tokens = rotary_tokens(cos, head_dim)?;
    check_len("the sine table", sin.len(), cos.len())?;
    if tokens == 0 || !out.len().is_multiple_of(tokens * head_dim) {
        return Err(Error::InvalidArgument(format!(
            "{} floats are not whole heads of {head_dim} for {tokens} tokens",
            out.len()
        )));
    }
    let width = out.len() / tokens;
    check_rows("the input", x.len(), tokens, x_stride, width)?;
    let (elements, out) = (out.len(), Rows(out.as_mut_ptr()));
    for_row_ranges(tokens, elements, &|first, count| {
        // In bounds: `check_rows` bounded the last row's end by `x.len()`.
        let input = &x[first * x_stride..(first + count - 1) * x_stride + width];
        let tables = first * head_dim..(first + count) * head_dim;
        // SAFETY: `for_row_ranges` hands each thread its own rows, inside the checked length.
        let out = unsafe { out.rows(first, count, width) };
        simd::rotary_rows(
            isa,
            input,
            x_stride,
            &cos[tables.clone()],
            &sin[tables],
            head_dim,
            out,
        );
    });
    Ok(())
}

/// The tokens of rotary tables of `cos.len()` elements for heads of `head_dim` (even).
fn rotary_tokens<T>(cos: &[T], head_dim: usize) -> Result<usize> {
    if head_dim == 0 || !head_dim.is_multiple_of(2) || !cos.len().is_multiple_of(head_dim) {
        return Err(Error::InvalidArgument(format!(
            "rotary tables of {} floats do not hold rows of an even head size {head_dim}",
            cos.len()
        )));
    }
    Ok(cos.len() / head_dim)
}

/// The row loops, compiled for each tier of `Isa` from one portable body (the compiler
/// vectorizes its fixed-size loops for the tier's registers).
mod simd {
    use super::LANES;
    use crate::element::Element;
    use crate::isa::portable_tiers;

    portable_tiers!(pub(super) fn rms_norm_rows(
        x: &[T], residual: Option<&mut [T]>, weight: &[T], eps: f32, out: &mut [T]
    ) = rms_norm_portable);
    portable_tiers!(pub(super) fn rotary_rows(
        x: &[T], stride: usize, cos: &[T], sin: &[T], dim: usize, out: &mut [T]
    ) = rotary_portable);

    #[inline(always)]
    fn rms_norm_portable<T: Element>(
        x: &[T],
        residual: Option<&mut [T]>,
        weight: &[T],
        eps: f32,
        out: &mut [T],
    ) {
        let dim = weight.len();
        let source: &[T] = match residual {
            Some(residual) => {
                for (sum, &value) in residual.iter_mut().zip(x) {
                    *sum = T::store(sum.load() + value.load());
                }
                residual
            }
            None => x,
        };
        for (row, out_row) in source.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
            let mut squares = [0f32; LANES];
            let chunks = row.chunks_exact(LANES);
            let tail: f32 = chunks.remainder().iter().map(|v| v.load() * v.load()).sum();
            for chunk in chunks {
                for lane in 0..LANES {
                    squares[lane] += chunk[lane].load() * chunk[lane].load();
                }
            }
            let mean = (squares.iter().sum::<f32>() + tail) / dim as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            for ((o, &value), &w) in out_row.iter_mut().zip(row).zip(weight) {
                let normalized = T::store(value.load() * scale);
                *o = T::store(w.load() * normalized.load());
            }
        }
    }

    #[inline(always)]
    fn rotary_portable<T: Element>(
        x: &[T],
        stride: usize,
        cos: &[T],
        sin: &[T],
        dim: usize,
        out: &mut [T],
    ) {
        let half = dim / 2;
        let width = out.len() / (cos.len() / dim);
        // Row r of the input starts at r · stride; the caller's slice ends at the last row's end.
        let inputs = (0..out.len() / width).map(|r| &x[r * stride..r * stride + width]);
        let rows = inputs.zip(out.chunks_exact_mut(width));
        // Each product rounded to T, then the sum: PyTorch's `x * cos + swapped * sin`.
        let term = |a: T, b: T| T::store(a.load() * b.load()).load();
        for ((row, out_row), (cos, sin)) in
            rows.zip(cos.chunks_exact(dim).zip(sin.chunks_exact(dim)))
        {
            for (head, out_head) in row.chunks_exact(dim).zip(out_row.chunks_exact_mut(dim)) {
                let (first, second) = head.split_at(half);
                let (out_first, out_second) = out_head.split_at_mut(half);
                let (cos_first, cos_second) = cos.split_at(half);
                let (sin_first, sin_second) = sin.split_at(half);
                // Zipped, not indexed: indexing six slices of one length keeps bounds checks
                // that stop the compiler from vectorizing the bf16 loop.
                let lanes = first
                    .iter()
                    .zip(second)
                    .zip(cos_first.iter().zip(sin_first));
                for (o, ((&a, &b), (&c, &s))) in out_first.iter_mut().zip(lanes) {
                    *o = T::store(term(a, c) + term(b, s));
                }
                let lanes = second
                    .iter()
                    .zip(first)
                    .zip(cos_second.iter().zip(sin_second));
                for (o, ((&b, &a), (&c, &s))) in out_second.iter_mut().zip(lanes) {
                    *o = T::store(term(b, c) + term(a, s));
                }
            }
        }
    }
}

mod silu;

#[cfg(test)]
mod tests;
