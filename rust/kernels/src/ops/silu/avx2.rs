//! The gated SiLU in AVX2 with FMA, 8 lanes a step: `super::silu`'s operations in its order.

use std::arch::x86_64::*;

use super::{
    for_chunks, prefetch, EXPONENT_OFFSET, EXP_MIN, EXP_POLY, LN2_HIGH, LN2_LOW, PREFETCH_BYTES,
    SHIFTER,
};
use crate::element::Bf16;
use crate::isa::Avx2;

const LANES: usize = 8;

/// `out = silu(gate) · up` over rows of `[gate | up]`, in float32.
#[target_feature(enable = "avx2,fma")]
pub(super) fn rows_f32(cpu: Avx2, gate_up: &[f32], dim: usize, out: &mut [f32]) {
    for_chunks::<f32, LANES>(gate_up, dim, out, |gate, up, out| {
        prefetch(gate.as_ptr().wrapping_add(PREFETCH_BYTES / 4).cast());
        prefetch(up.as_ptr().wrapping_add(PREFETCH_BYTES / 4).cast());
        // SAFETY: each pointer addresses an array of 8 floats (read and written unaligned).
        unsafe {
            let product = _mm256_mul_ps(
                silu(cpu, _mm256_loadu_ps(gate.as_ptr())),
                _mm256_loadu_ps(up.as_ptr()),
            );
            _mm256_storeu_ps(out.as_mut_ptr(), product);
        }
    });
}

/// [`rows_f32`] in bf16: silu(gate) rounded to bf16 before the product, the product rounded.
/// 16 values a step, loaded as 8 pairs: the even values widen by a shift, the odd ones by a
/// mask, and the two rounded halves merge back into pairs, with no lane crossing.
#[target_feature(enable = "avx2,fma")]
pub(super) fn rows_bf16(cpu: Avx2, gate_up: &[Bf16], dim: usize, out: &mut [Bf16]) {
    for_chunks::<Bf16, { 2 * LANES }>(gate_up, dim, out, |gate, up, out| {
        prefetch(gate.as_ptr().wrapping_add(PREFETCH_BYTES / 2).cast());
        prefetch(up.as_ptr().wrapping_add(PREFETCH_BYTES / 2).cast());
        // SAFETY: 16 bf16 values are 256 bits, read and written unaligned.
        let (gate, up) = unsafe {
            (
                _mm256_loadu_si256(gate.as_ptr().cast()),
                _mm256_loadu_si256(up.as_ptr().cast()),
            )
        };
        let even = step_bf16(
            cpu,
            _mm256_slli_epi32::<16>(gate),
            _mm256_slli_epi32::<16>(up),
        );
        let odd = step_bf16(cpu, high(cpu, gate), high(cpu, up));
        let pairs = _mm256_or_si256(_mm256_srli_epi32::<16>(even), high(cpu, odd));
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), pairs) };
    });
}

/// The bf16 result (in each lane's upper half) of 8 bf16 gates and ups held as float32 bits.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn step_bf16(cpu: Avx2, gate: __m256i, up: __m256i) -> __m256i {
    let silu = _mm256_castsi256_ps(high(
        cpu,
        round_bf16(cpu, silu(cpu, _mm256_castsi256_ps(gate))),
    ));
    round_bf16(cpu, _mm256_mul_ps(silu, _mm256_castsi256_ps(up)))
}

/// `super::silu` of 8 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn silu(_: Avx2, g: __m256) -> __m256 {
    // exp_silu(x) for x = -|g|, written with a = |g| and the negations moved into the fused
    // operations (exact, and rounding to nearest is symmetric: the same bits).
    let a = _mm256_andnot_ps(_mm256_set1_ps(-0.0), g);
    let keep = _mm256_cmp_ps::<_CMP_LE_OQ>(a, _mm256_set1_ps(-EXP_MIN));
    let shifter = _mm256_set1_ps(SHIFTER);
    let log2e = _mm256_set1_ps(std::f32::consts::LOG2_E);
    let shifted = _mm256_fnmadd_ps(a, log2e, shifter);
    let n = _mm256_sub_ps(shifted, shifter);
    let r = _mm256_fnmsub_ps(n, _mm256_set1_ps(LN2_HIGH), a);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LOW), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let offset = _mm256_set1_epi32(EXPONENT_OFFSET as i32);
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_castps_si256(shifted), offset));
    let e = _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)));
    // (g < 0 ? g · e : g) / (1 + e).
    let negative = _mm256_cmp_ps::<_CMP_LT_OQ>(g, _mm256_setzero_ps());
    let numerator = _mm256_blendv_ps(g, _mm256_mul_ps(g, e), negative);
    _mm256_div_ps(numerator, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

/// Each lane's upper half (a bf16 value as float32 bits).
#[target_feature(enable = "avx2")]
#[inline]
fn high(_: Avx2, bits: __m256i) -> __m256i {
    _mm256_and_si256(bits, _mm256_set1_epi32(-0x1_0000))
}

/// `Bf16::from_f32` of each lane, in the lane's upper half (the lower half is left over):
/// round to nearest even by integer addition. No NaN test, as in the AVX-512 kernel's
/// `round_bf16`: every NaN here is quiet with a zero lower half, which the addition keeps.
#[target_feature(enable = "avx2")]
#[inline]
fn round_bf16(_: Avx2, values: __m256) -> __m256i {
    let bits = _mm256_castps_si256(values);
    let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    _mm256_add_epi32(_mm256_add_epi32(bits, odd), _mm256_set1_epi32(0x7fff))
}
