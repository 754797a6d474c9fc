//! The gated SiLU in AVX-512 F/BW, 16 lanes a step: `super::silu`'s operations in its order.

use std::arch::x86_64::*;

use super::{for_chunks, EXPONENT_OFFSET, EXP_MIN, EXP_POLY, LN2_HIGH, LN2_LOW, SHIFTER};
use crate::element::Bf16;

const LANES: usize = 16;

/// `out = silu(gate) · up` over rows of `[gate | up]`, in float32.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
pub(super) fn rows_f32(gate_up: &[f32], dim: usize, out: &mut [f32]) {
    for_chunks::<f32, LANES>(gate_up, dim, out, |gate, up, out| {
        // SAFETY: each pointer addresses an array of 16 floats (read and written unaligned).
        unsafe {
            let product = _mm512_mul_ps(
                silu(_mm512_loadu_ps(gate.as_ptr())),
                _mm512_loadu_ps(up.as_ptr()),
            );
            _mm512_storeu_ps(out.as_mut_ptr(), product);
        }
    });
}

/// [`rows_f32`] in bf16: silu(gate) rounded to bf16 before the product, the product rounded.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
pub(super) fn rows_bf16(gate_up: &[Bf16], dim: usize, out: &mut [Bf16]) {
    for_chunks::<Bf16, LANES>(gate_up, dim, out, |gate, up, out| {
        let silu = widen(round_bf16(silu(load_bf16(gate))));
        let product = round_bf16(_mm512_mul_ps(silu, load_bf16(up)));
        // SAFETY: 16 bf16 values (256 bits) to `out`'s 16, unaligned.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm512_cvtepi32_epi16(product)) };
    });
}

/// `super::silu` of 16 lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn silu(g: __m512) -> __m512 {
    let sign = _mm512_set1_epi32(i32::MIN);
    let x = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(g), sign));
    // exp_silu(x), x = -|g|.
    let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(EXP_MIN));
    let clamped = _mm512_max_ps(x, _mm512_set1_ps(EXP_MIN));
    let shifter = _mm512_set1_ps(SHIFTER);
    let log2e = _mm512_set1_ps(std::f32::consts::LOG2_E);
    let shifted = _mm512_fmadd_ps(clamped, log2e, shifter);
    let n = _mm512_sub_ps(shifted, shifter);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HIGH), clamped);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LOW), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let offset = _mm512_set1_epi32(EXPONENT_OFFSET as i32);
    let scale = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_castps_si512(shifted), offset));
    let e = _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(scale));
    // g · (numerator / (1 + e)).
    let one = _mm512_set1_ps(1.0);
    let positive = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(g, _mm512_setzero_ps());
    let numerator = _mm512_mask_blend_ps(positive, e, one);
    _mm512_mul_ps(g, _mm512_div_ps(numerator, _mm512_add_ps(one, e)))
}

/// 16 bf16 values as float32 (exact: their bits shifted to the top).
#[target_feature(enable = "avx512f")]
#[inline]
fn load_bf16(values: &[Bf16; LANES]) -> __m512 {
    // SAFETY: 16 bf16 values are 256 bits, read unaligned.
    let bits = unsafe { _mm256_loadu_si256(values.as_ptr().cast()) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
}

/// The bf16 bits (in each lane's low half) of `Bf16::from_f32` of each lane: round to nearest
/// even by integer addition; a NaN keeps its upper bits and becomes quiet.
#[target_feature(enable = "avx512f")]
#[inline]
fn round_bf16(values: __m512) -> __m512i {
    let bits = _mm512_castps_si512(values);
    let high = _mm512_srli_epi32::<16>(bits);
    let odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
    let bias = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(values, values);
    _mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40))
}

/// The float32 of bf16 bits in each lane's low half.
#[target_feature(enable = "avx512f")]
#[inline]
fn widen(bits: __m512i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits))
}
