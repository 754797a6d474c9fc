//! The AVX2 instructions of the activation roundings, for the AVX2 kernels (with AVX-VNNI's
//! products or without): a block in four vectors of 8 floats; the largest magnitude and the
//! finiteness test from one integer maximum of the magnitudes' bits.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Instructions, Out};
use crate::element::Element;
use crate::isa::Avx2;

/// `rounding::round_blocks` with AVX2's instructions.
///
/// # Safety
/// As `rounding::round_blocks`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn round_blocks<T: Element, const SPLIT: bool>(
    cpu: Avx2,
    out: &Out<T>,
    blocks: Range<usize>,
) {
    // SAFETY: forwarded from the caller; the token proves AVX2.
    unsafe { super::round_blocks::<T, _, SPLIT>(cpu, out, blocks) }
}

/// `t` rounded to the nearest integer (ties to even), clamped to ±127, as floats.
#[inline(always)]
unsafe fn nearest(t: __m256) -> __m256 {
    // SAFETY: register-only AVX operations; the caller has AVX2.
    unsafe {
        let rounded = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        _mm256_min_ps(
            _mm256_max_ps(rounded, _mm256_set1_ps(-127.0)),
            _mm256_set1_ps(127.0),
        )
    }
}

/// Elements `8i..8i + 8` of the block at `x`, as float32.
///
/// # Safety
/// `x` holds 32 elements; the CPU has AVX2.
#[inline(always)]
unsafe fn load8<T: Element>(x: *const T, i: usize) -> __m256 {
    // SAFETY: 32 elements at `x` (f32, or 16-bit `Bf16` when `T::REDUCED`: the only
    // `Element`s), as the caller guarantees.
    unsafe {
        if T::REDUCED {
            let bits = _mm_loadu_si128(x.cast::<u16>().add(8 * i).cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
        } else {
            _mm256_loadu_ps(x.cast::<f32>().add(8 * i))
        }
    }
}

/// The magnitudes' bits of `v`.
#[inline(always)]
unsafe fn magnitude(v: __m256) -> __m256i {
    // SAFETY: a register-only AVX2 operation; the caller has AVX2.
    unsafe { _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fff_ffff)) }
}

/// Eight values times `scale` split into their parts `a` and `b`, with `256a + b`.
#[inline(always)]
unsafe fn split8(v: __m256, scale: __m256) -> (__m256i, __m256i, __m256i) {
    // SAFETY: register-only AVX2 operations; the caller has AVX2.
    unsafe {
        let t = _mm256_mul_ps(v, scale);
        let a = nearest(t);
        let remainder = _mm256_mul_ps(_mm256_sub_ps(t, a), _mm256_set1_ps(256.0));
        let (a, b) = (
            _mm256_cvtps_epi32(a),
            _mm256_cvtps_epi32(nearest(remainder)),
        );
        (a, b, _mm256_add_epi32(_mm256_slli_epi32::<8>(a), b))
    }
}

/// Four vectors added lane by lane.
#[inline(always)]
unsafe fn add4(v: [__m256i; 4]) -> __m256i {
    // SAFETY: register-only AVX2 operations; the caller has AVX2.
    unsafe { _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3])) }
}

/// Four vectors of int32 lanes within ±127 as 32 bytes in order, at `out`.
#[inline(always)]
unsafe fn store_bytes(v: [__m256i; 4], out: *mut i8) {
    // SAFETY: a 32-byte store at `out`, as the caller guarantees; the CPU has AVX2.
    unsafe {
        // The packs work within 128-bit lanes: dwords come out as v0 v1 v2 v3 of the low
        // lanes, then of the high lanes; the permutation puts them back in order.
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(v[0], v[1]),
            _mm256_packs_epi32(v[2], v[3]),
        );
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        _mm256_storeu_si256(out.cast(), _mm256_permutevar8x32_epi32(bytes, order));
    }
}

impl<T: Element> Instructions<T> for Avx2 {
    type Block = [__m256; 4];
    type Sum = __m256i;

    #[inline(always)]
    unsafe fn load(self, x: *const T) -> ([__m256; 4], u32) {
        // SAFETY: 32 elements at `x`, as the caller guarantees.
        unsafe {
            let v = [load8(x, 0), load8(x, 1), load8(x, 2), load8(x, 3)];
            // Magnitudes' bits order as the magnitudes do, infinities and NaNs above every
            // finite.
            let top = _mm256_max_epu32(
                _mm256_max_epu32(magnitude(v[0]), magnitude(v[1])),
                _mm256_max_epu32(magnitude(v[2]), magnitude(v[3])),
            );
            let top = _mm_max_epu32(
                _mm256_castsi256_si128(top),
                _mm256_extracti128_si256::<1>(top),
            );
            let top = _mm_max_epu32(top, _mm_shuffle_epi32::<0b0100_1110>(top));
            let top = _mm_max_epu32(top, _mm_shuffle_epi32::<0b1011_0001>(top));
            (v, _mm_cvtsi128_si32(top) as u32)
        }
    }

    #[inline(always)]
    unsafe fn one_int8(self, block: &[__m256; 4], inverse: f32, whole: *mut i8) -> __m256i {
        // SAFETY: register operations and a 32-byte store at `whole`, as the caller guarantees.
        unsafe {
            let scale = _mm256_set1_ps(inverse);
            let a = [
                _mm256_cvtps_epi32(nearest(_mm256_mul_ps(block[0], scale))),
                _mm256_cvtps_epi32(nearest(_mm256_mul_ps(block[1], scale))),
                _mm256_cvtps_epi32(nearest(_mm256_mul_ps(block[2], scale))),
                _mm256_cvtps_epi32(nearest(_mm256_mul_ps(block[3], scale))),
            ];
            store_bytes(a, whole);
            add4(a)
        }
    }

    #[inline(always)]
    unsafe fn split(
        self,
        block: &[__m256; 4],
        inverse: f32,
        whole: *mut i8,
        rest: *mut i8,
    ) -> __m256i {
        // SAFETY: register operations and 32-byte stores at `whole` and `rest`, as the caller
        // guarantees.
        unsafe {
            let scale = _mm256_set1_ps(inverse);
            let parts = [
                split8(block[0], scale),
                split8(block[1], scale),
                split8(block[2], scale),
                split8(block[3], scale),
            ];
            store_bytes([parts[0].0, parts[1].0, parts[2].0, parts[3].0], whole);
            store_bytes([parts[0].1, parts[1].1, parts[2].1, parts[3].1], rest);
            add4([parts[0].2, parts[1].2, parts[2].2, parts[3].2])
        }
    }

    #[inline(always)]
    unsafe fn total(self, sum: __m256i) -> i32 {
        // SAFETY: register-only AVX2 operations; the caller has AVX2.
        unsafe {
            let v = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256::<1>(sum),
            );
            let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b0100_1110>(v));
            _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32::<0b1011_0001>(v)))
        }
    }
}
