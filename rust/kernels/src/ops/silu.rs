//! The gated SiLU's row loop: `out = silu(gate) · up`, with explicit AVX2+FMA (8 lanes) and
//! AVX-512 F/BW (16 lanes) kernels beside the portable scalar reference.
//!
//! What must stay true: every tier computes the bits of [`silu`], the reference. The vector
//! kernels run its operations in its order: the same fused multiply-adds (`f32::mul_add` here,
//! `vfmadd` there), an IEEE-exact division, exact scaling by the power of two, and the bf16
//! rounding of [`Bf16::from_f32`] by integer addition (the kernels' `round_bf16` say why their
//! NaNs need no test). A row's tail, shorter than a vector, runs through the vector kernel on a
//! zero-padded copy, so it gets the same bits too.
//!
//! The exponential is silu's own ([`exp_silu`]), not attention's `exp_nonpositive`: that one
//! computes without fused products, which would cost the vector kernels twice the operations.
//! The price is the scalar tier on an x86 CPU without FMA, where `mul_add` is a library call
//! (tens of ns a value): that tier is the reference and a fallback, not a fast path.

#[cfg(target_arch = "x86_64")]
use std::any::TypeId;

#[cfg(target_arch = "x86_64")]
use crate::element::Bf16;
use crate::element::Element;
use crate::isa::Isa;
#[cfg(target_arch = "x86_64")]
use crate::isa::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Below this `exp_silu` returns 0 (and `2^n` would leave float32's normal range). Nothing is
/// clamped: past it (or for NaN) the steps compute garbage that the result then discards.
const EXP_MIN: f32 = -87.0;
/// ln 2 in two parts: `n · LN2_HIGH` is exact for the `n` in [-126, 0] that occur.
const LN2_HIGH: f32 = 0.693_359_4;
const LN2_LOW: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: `x · log2(e) + SHIFTER`, rounded, holds round-half-even(x · log2(e)) in its low
/// mantissa bits (two's complement after subtracting `SHIFTER`'s bits).
const SHIFTER: f32 = 12_582_912.0;
/// Added to the bits of `x · log2(e) + SHIFTER` and shifted left by 23: the bits of `2^n`
/// (the bias 127 minus `SHIFTER`'s bits, modulo 2^32).
const EXPONENT_OFFSET: u32 = 127u32.wrapping_sub(SHIFTER.to_bits());
/// `e^r` on [-ln2/2, ln2/2] by Horner's rule from the highest coefficient: a degree-6
/// polynomial fitted to the relative error (at most 7.1e-8 in float32, about one ulp).
const EXP_POLY: [f32; 7] = [
    1.383_684_6e-3,
    8.374_816e-3,
    4.166_822_5e-2,
    1.666_642e-1,
    4.999_999e-1,
    1.0,
    1.0,
];

/// `e^x` for `x <= 0`; 0 below `EXP_MIN` and for NaN (silu's `e^-|g|`, where either makes the
/// sigmoid exactly 0 or 1).
#[inline(always)]
fn exp_silu(x: f32) -> f32 {
    let shifted = x.mul_add(std::f32::consts::LOG2_E, SHIFTER);
    let n = shifted - SHIFTER;
    let r = n.mul_add(-LN2_HIGH, x);
    let r = n.mul_add(-LN2_LOW, r);
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    // 2^n, n in [-126, 0] where the result is kept: exact, so `p · scale` rounds once, as
    // AVX-512's `vscalefps(p, n)` does.
    let scale = f32::from_bits(shifted.to_bits().wrapping_add(EXPONENT_OFFSET) << 23);
    if x >= EXP_MIN {
        p * scale
    } else {
        0.0
    }
}

/// `g · sigmoid(g)`, the reference every tier matches: with `e = e^-|g| <= 1` nothing
/// overflows, and it is one division, `g / (1 + e)` or `(g · e) / (1 + e)` for negative `g`.
/// silu(NaN) and silu(-inf) are NaN, silu(+inf) is +inf, and below -87 the result is -0.
#[inline(always)]
fn silu(g: f32) -> f32 {
    let e = exp_silu(-g.abs());
    let numerator = if g < 0.0 { g * e } else { g };
    numerator / (1.0 + e)
}

/// `out = silu(gate) · up` for each row of `gate_up` (`[gate | up]`, `2 · dim` wide) on the
/// tier `isa`, or the detected one if lower. In bf16 `silu(gate)` is rounded before the product.
pub(super) fn silu_and_mul_rows<T: Element>(isa: Isa, gate_up: &[T], dim: usize, out: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let (wide, narrow) = (Avx512::at_most(isa), Avx2::at_most(isa));
        if let (Some(gate_up), Some(out)) = (cast::<T, f32>(gate_up), cast_mut::<T, f32>(out)) {
            match (wide, narrow) {
                // SAFETY: the token proves the CPU has the kernel's features.
                (Some(cpu), _) => return unsafe { avx512::rows_f32(cpu, gate_up, dim, out) },
                // SAFETY: as above.
                (None, Some(cpu)) => return unsafe { avx2::rows_f32(cpu, gate_up, dim, out) },
                (None, None) => {}
            }
        }
        if let (Some(gate_up), Some(out)) = (cast::<T, Bf16>(gate_up), cast_mut::<T, Bf16>(out)) {
            match (wide, narrow) {
                // SAFETY: as above.
                (Some(cpu), _) => return unsafe { avx512::rows_bf16(cpu, gate_up, dim, out) },
                // SAFETY: as above.
                (None, Some(cpu)) => return unsafe { avx2::rows_bf16(cpu, gate_up, dim, out) },
                (None, None) => {}
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    for (row, out_row) in gate_up.chunks_exact(2 * dim).zip(out.chunks_exact_mut(dim)) {
        let (gate, up) = row.split_at(dim);
        for ((o, &g), &u) in out_row.iter_mut().zip(gate).zip(up) {
            *o = T::store(T::store(silu(g.load())).load() * u.load());
        }
    }
}

/// Runs `step` on each row's `N`-wide chunks of gate, up and output, and on its tail copied
/// into zero-padded chunks (silu(0) · 0 is 0, nothing traps).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn for_chunks<T: Copy + Default, const N: usize>(
    gate_up: &[T],
    dim: usize,
    out: &mut [T],
    mut step: impl FnMut(&[T; N], &[T; N], &mut [T; N]),
) {
    for (row, out_row) in gate_up.chunks_exact(2 * dim).zip(out.chunks_exact_mut(dim)) {
        let (gate, up) = row.split_at(dim);
        let ((gate, gate_tail), (up, up_tail)) = (gate.as_chunks::<N>(), up.as_chunks::<N>());
        let (out_row, out_tail) = out_row.as_chunks_mut::<N>();
        for ((o, g), u) in out_row.iter_mut().zip(gate).zip(up) {
            step(g, u, o);
        }
        if !out_tail.is_empty() {
            let len = out_tail.len();
            let (mut g, mut u, mut o) = ([T::default(); N], [T::default(); N], [T::default(); N]);
            g[..len].copy_from_slice(gate_tail);
            u[..len].copy_from_slice(up_tail);
            step(&g, &u, &mut o);
            out_tail.copy_from_slice(&o[..len]);
        }
    }
}

/// How far ahead of a step the vector kernels fetch its gate and up values into the cache
/// (measured: 4 KiB beat 1 KiB and none on 2048-row bf16 calls that stream from memory). A
/// step's vector work is long, so a miss the hardware prefetcher leaves stalls it.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 4096;

/// Starts fetching the cache line at `address`, which may lie anywhere: a prefetch never
/// faults, and the kernels compute it with `wrapping_add`, never dereferenced.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch(address: *const i8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: a prefetch is a hint; it reads nothing the program sees and never faults.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(address) }
}

/// `values` as `U`'s when `T` is `U`.
#[cfg(target_arch = "x86_64")]
fn cast<T: 'static, U: 'static>(values: &[T]) -> Option<&[U]> {
    // SAFETY: `T` and `U` are one type, so the memory holds `values.len()` valid `U`s.
    (TypeId::of::<T>() == TypeId::of::<U>())
        .then(|| unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), values.len()) })
}

/// [`cast`] for a mutable slice.
#[cfg(target_arch = "x86_64")]
fn cast_mut<T: 'static, U: 'static>(values: &mut [T]) -> Option<&mut [U]> {
    // SAFETY: as in `cast`; the borrow of `values` moves to the result.
    (TypeId::of::<T>() == TypeId::of::<U>()).then(|| unsafe {
        std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), values.len())
    })
}
