//! The gated SiLU in AVX-512 F/BW, 16 lanes a step: `super::silu`'s operations in its order.

use std::arch::x86_64::*;

use super::{for_chunks, prefetch, EXP_MIN, EXP_POLY, LN2_HIGH, LN2_LOW, PREFETCH_BYTES, SHIFTER};
use crate::element::Bf16;
use crate::isa::Avx512;

const LANES: usize = 16;

/// `out = silu(gate) · up` over rows of `[gate | up]`, in float32.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
pub(super) fn rows_f32(cpu: Avx512, gate_up: &[f32], dim: usize, out: &mut [f32]) {
    for_chunks::<f32, LANES>(gate_up, dim, out, |gate, up, out| {
        prefetch(gate.as_ptr().wrapping_add(PREFETCH_BYTES / 4).cast());
        prefetch(up.as_ptr().wrapping_add(PREFETCH_BYTES / 4).cast());
        // SAFETY: each pointer addresses an array of 16 floats (read and written unaligned).
        unsafe {
            let product = _mm512_mul_ps(
                silu(cpu, _mm512_loadu_ps(gate.as_ptr())),
                _mm512_loadu_ps(up.as_ptr()),
            );
            _mm512_storeu_ps(out.as_mut_ptr(), product);
        }
    });
}

/// [`rows_f32`] in bf16: silu(gate) rounded to bf16 before the product, the product rounded.
/// 32 values a step, loaded as 16 pairs: the even values widen by a shift, the odd ones by a
/// mask, and the two rounded halves merge back into pairs, with no lane crossing.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
pub(super) fn rows_bf16(cpu: Avx512, gate_up: &[Bf16], dim: usize, out: &mut [Bf16]) {
    for_chunks::<Bf16, { 2 * LANES }>(gate_up, dim, out, |gate, up, out| {
        prefetch(gate.as_ptr().wrapping_add(PREFETCH_BYTES / 2).cast());
        prefetch(up.as_ptr().wrapping_add(PREFETCH_BYTES / 2).cast());
        // SAFETY: 32 bf16 values are 512 bits, read and written unaligned.
        let (gate, up) = unsafe {
            (
                _mm512_loadu_si512(gate.as_ptr().cast()),
                _mm512_loadu_si512(up.as_ptr().cast()),
            )
        };
        let even = step_bf16(
            cpu,
            _mm512_slli_epi32::<16>(gate),
            _mm512_slli_epi32::<16>(up),
        );
        let odd = step_bf16(cpu, high(cpu, gate), high(cpu, up));
        // (even >> 16) | (odd & 0xffff0000).
        let pairs = _mm512_ternarylogic_epi32::<0xf8>(
            _mm512_srli_epi32::<16>(even),
            odd,
            _mm512_set1_epi32(-0x1_0000),
        );
        // SAFETY: as above.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), pairs) };
    });
}

/// The bf16 result (in each lane's upper half) of 16 bf16 gates and ups held as float32 bits.
#[target_feature(enable = "avx512f")]
#[inline]
fn step_bf16(cpu: Avx512, gate: __m512i, up: __m512i) -> __m512i {
    let silu = _mm512_castsi512_ps(high(
        cpu,
        round_bf16(cpu, silu(cpu, _mm512_castsi512_ps(gate))),
    ));
    round_bf16(cpu, _mm512_mul_ps(silu, _mm512_castsi512_ps(up)))
}

/// `super::silu` of 16 lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn silu(_: Avx512, g: __m512) -> __m512 {
    // exp_silu(x) for x = -|g|, written with a = |g| and the negations moved into the fused
    // operations (exact, and rounding to nearest is symmetric: the same bits).
    let a = _mm512_castsi512_ps(_mm512_and_si512(
        _mm512_castps_si512(g),
        _mm512_set1_epi32(i32::MAX),
    ));
    let keep = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, _mm512_set1_ps(-EXP_MIN));
    let shifter = _mm512_set1_ps(SHIFTER);
    let log2e = _mm512_set1_ps(std::f32::consts::LOG2_E);
    let n = _mm512_sub_ps(_mm512_fnmadd_ps(a, log2e, shifter), shifter);
    let r = _mm512_fnmsub_ps(n, _mm512_set1_ps(LN2_HIGH), a);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LOW), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let e = _mm512_maskz_scalef_ps(keep, p, n);
    // (g < 0 ? g · e : g) / (1 + e).
    let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(g, _mm512_setzero_ps());
    let numerator = _mm512_mask_mul_ps(g, negative, g, e);
    _mm512_div_ps(numerator, _mm512_add_ps(_mm512_set1_ps(1.0), e))
}

/// Each lane's upper half (a bf16 value as float32 bits).
#[target_feature(enable = "avx512f")]
#[inline]
fn high(_: Avx512, bits: __m512i) -> __m512i {
    _mm512_and_si512(bits, _mm512_set1_epi32(-0x1_0000))
}

/// `Bf16::from_f32` of each lane, in the lane's upper half (the lower half is left over):
/// round to nearest even by integer addition.
///
/// No NaN test: in this kernel every NaN is quiet with a zero lower half (the bf16 inputs'
/// lower halves are zero, x86 quiets the NaN it propagates, and its default NaN is
/// 0xffc00000), so the addition cannot carry out of the lower half and leaves the NaN's upper
/// bits, which already hold the quiet bit `Bf16::from_f32` sets.
#[target_feature(enable = "avx512f")]
#[inline]
fn round_bf16(_: Avx512, values: __m512) -> __m512i {
    let bits = _mm512_castps_si512(values);
    // bits + 0x7fff + (bit 16): 0x8000 where the upper half is odd.
    let odd = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x1_0000));
    let even = _mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff));
    _mm512_mask_add_epi32(even, odd, bits, _mm512_set1_epi32(0x8000))
}
