//! The gated SiLU in AVX2 with FMA, 8 lanes a step: `super::silu`'s operations in its order.

use std::arch::x86_64::*;

use super::{for_chunks, EXPONENT_OFFSET, EXP_MIN, EXP_POLY, LN2_HIGH, LN2_LOW, SHIFTER};
use crate::element::Bf16;

const LANES: usize = 8;

/// `out = silu(gate) · up` over rows of `[gate | up]`, in float32.
#[target_feature(enable = "avx2,fma")]
pub(super) fn rows_f32(gate_up: &[f32], dim: usize, out: &mut [f32]) {
    for_chunks::<f32, LANES>(gate_up, dim, out, |gate, up, out| {
        // SAFETY: each pointer addresses an array of 8 floats (read and written unaligned).
        unsafe {
            let product = _mm256_mul_ps(
                silu(_mm256_loadu_ps(gate.as_ptr())),
                _mm256_loadu_ps(up.as_ptr()),
            );
            _mm256_storeu_ps(out.as_mut_ptr(), product);
        }
    });
}

/// [`rows_f32`] in bf16: silu(gate) rounded to bf16 before the product, the product rounded.
#[target_feature(enable = "avx2,fma")]
pub(super) fn rows_bf16(gate_up: &[Bf16], dim: usize, out: &mut [Bf16]) {
    for_chunks::<Bf16, LANES>(gate_up, dim, out, |gate, up, out| {
        let silu = widen(round_bf16(silu(load_bf16(gate))));
        let product = round_bf16(_mm256_mul_ps(silu, load_bf16(up)));
        // Each lane holds at most 0xffff, so the unsigned saturation of the pack keeps it.
        let packed = _mm_packus_epi32(
            _mm256_castsi256_si128(product),
            _mm256_extracti128_si256::<1>(product),
        );
        // SAFETY: 8 bf16 values (128 bits) to `out`'s 8, unaligned.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), packed) };
    });
}

/// `super::silu` of 8 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn silu(g: __m256) -> __m256 {
    let x = _mm256_or_ps(g, _mm256_set1_ps(-0.0));
    // exp_silu(x), x = -|g|.
    let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(EXP_MIN));
    let clamped = _mm256_max_ps(x, _mm256_set1_ps(EXP_MIN));
    let shifter = _mm256_set1_ps(SHIFTER);
    let log2e = _mm256_set1_ps(std::f32::consts::LOG2_E);
    let shifted = _mm256_fmadd_ps(clamped, log2e, shifter);
    let n = _mm256_sub_ps(shifted, shifter);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HIGH), clamped);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LOW), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let offset = _mm256_set1_epi32(EXPONENT_OFFSET as i32);
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_castps_si256(shifted), offset));
    let e = _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)));
    // g · (numerator / (1 + e)).
    let one = _mm256_set1_ps(1.0);
    let positive = _mm256_cmp_ps::<_CMP_GE_OQ>(g, _mm256_setzero_ps());
    let numerator = _mm256_blendv_ps(e, one, positive);
    _mm256_mul_ps(g, _mm256_div_ps(numerator, _mm256_add_ps(one, e)))
}

/// 8 bf16 values as float32 (exact: their bits shifted to the top).
#[target_feature(enable = "avx2")]
#[inline]
fn load_bf16(values: &[Bf16; LANES]) -> __m256 {
    // SAFETY: 8 bf16 values are 128 bits, read unaligned.
    let bits = unsafe { _mm_loadu_si128(values.as_ptr().cast()) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
}

/// The bf16 bits (in each lane's low half) of `Bf16::from_f32` of each lane: round to nearest
/// even by integer addition; a NaN keeps its upper bits and becomes quiet.
#[target_feature(enable = "avx2")]
#[inline]
fn round_bf16(values: __m256) -> __m256i {
    let bits = _mm256_castps_si256(values);
    let high = _mm256_srli_epi32::<16>(bits);
    let odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
    let bias = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff));
    let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(bits, bias));
    let quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(values, values));
    _mm256_blendv_epi8(rounded, quiet, nan)
}

/// The float32 of bf16 bits in each lane's low half.
#[target_feature(enable = "avx2")]
#[inline]
fn widen(bits: __m256i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
}
