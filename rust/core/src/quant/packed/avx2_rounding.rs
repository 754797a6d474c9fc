//! The AVX2 roundings of activations to int8 (`prefill::round_blocks`'s one part per value,
//! `packed::split_block`'s two), for the AVX2 kernels in `avx2.rs`: the same values, units and
//! sums as the portable roundings, with the largest magnitude and the finiteness test from one
//! integer maximum of the magnitudes' bits.

use std::arch::x86_64::*;
use std::ops::Range;

use super::BLOCK;
use crate::element::Element;
use crate::isa::Avx2;

/// Block `b` of `x` as four vectors of float32, or `None` when it holds a NaN or an infinity;
/// with its largest magnitude.
///
/// # Safety
/// `x` holds block `b`; the CPU has AVX2.
#[inline(always)]
unsafe fn load_block<T: Element>(x: *const T, b: usize) -> Option<([__m256; 4], f32)> {
    // SAFETY: 32 elements at block `b` (f32, or 16-bit `Bf16` when `T::REDUCED`: the only
    // `Element`s), as the caller guarantees.
    unsafe {
        let at = x.add(b * BLOCK);
        let v: [__m256; 4] = std::array::from_fn(|i| {
            if T::REDUCED {
                let bits = _mm_loadu_si128(at.cast::<u16>().add(8 * i).cast());
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
            } else {
                _mm256_loadu_ps(at.cast::<f32>().add(8 * i))
            }
        });
        // Magnitudes' bits order as the magnitudes do, infinities and NaNs above every finite.
        let mask = _mm256_set1_epi32(0x7fff_ffff);
        let bits = v.map(|v| _mm256_and_si256(_mm256_castps_si256(v), mask));
        let top = _mm256_max_epu32(
            _mm256_max_epu32(bits[0], bits[1]),
            _mm256_max_epu32(bits[2], bits[3]),
        );
        let top = _mm_max_epu32(
            _mm256_castsi256_si128(top),
            _mm256_extracti128_si256::<1>(top),
        );
        let top = _mm_max_epu32(top, _mm_shuffle_epi32::<0b0100_1110>(top));
        let top = _mm_max_epu32(top, _mm_shuffle_epi32::<0b1011_0001>(top));
        let largest = _mm_cvtsi128_si32(top) as u32;
        (largest <= f32::MAX.to_bits()).then(|| (v, f32::from_bits(largest)))
    }
}

/// The sum of the 8 lanes.
#[inline(always)]
unsafe fn total(v: __m256i) -> i32 {
    // SAFETY: register-only AVX2 operations; the caller has AVX2.
    unsafe {
        let v = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b0100_1110>(v));
        _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32::<0b1011_0001>(v)))
    }
}

/// `t` rounded to the nearest integer (ties to even), clamped to ±127, as int32 lanes.
#[inline(always)]
unsafe fn nearest(t: __m256) -> __m256i {
    // SAFETY: register-only AVX operations; the caller has AVX2.
    unsafe {
        let rounded = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let clamped = _mm256_min_ps(
            _mm256_max_ps(rounded, _mm256_set1_ps(-127.0)),
            _mm256_set1_ps(127.0),
        );
        _mm256_cvtps_epi32(clamped)
    }
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

/// `prefill::round_block` over blocks `blocks` of `x` with AVX2: the same values, units, sums
/// and totals. Every block's 32 values are written (never read), so `values` may start
/// uninitialized.
///
/// # Safety
/// `x` holds the blocks `blocks`, `values` as many × 32 bytes,
/// `units`, `totals` and `sums` an entry per block (all indexed by the block's number).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn round_blocks<T: Element>(
    _: Avx2,
    x: *const T,
    blocks: Range<usize>,
    values: *mut i8,
    units: *mut f32,
    totals: *mut i32,
    sums: *mut f32,
) {
    // SAFETY: every block `b` of `blocks` lies inside the buffers, as the caller guarantees.
    unsafe {
        for b in blocks {
            let out = values.add(b * BLOCK);
            let (unit, sum) = match load_block(x, b) {
                None => {
                    std::ptr::write_bytes(out, 0, BLOCK);
                    (f32::NAN, 0)
                }
                Some((_, 0.0)) => {
                    std::ptr::write_bytes(out, 0, BLOCK);
                    (0.0, 0)
                }
                Some((_, largest)) if 127.0 / largest == f32::INFINITY => {
                    // The scale overflows: zeros times it are NaNs, which the portable
                    // rounding turns into 0 and these instructions would not.
                    super::prefill::round_blocks(x, b..b + 1, values, units, totals, sums);
                    continue;
                }
                Some((v, largest)) => {
                    let scale = _mm256_set1_ps(127.0 / largest);
                    let whole = v.map(|v| nearest(_mm256_mul_ps(v, scale)));
                    store_bytes(whole, out);
                    let sum = _mm256_add_epi32(
                        _mm256_add_epi32(whole[0], whole[1]),
                        _mm256_add_epi32(whole[2], whole[3]),
                    );
                    (largest / 127.0, total(sum))
                }
            };
            *units.add(b) = unit;
            *totals.add(b) = sum;
            *sums.add(b) = unit * sum as f32;
        }
    }
}

/// `packed::split_block` with AVX2: the same parts, unit and sum.
///
/// # Safety
/// `block`, `high` and `low` hold 32 elements each.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn split_block<T: Element>(
    _: Avx2,
    block: &[T],
    high: &mut [i8],
    low: &mut [i8],
) -> Option<(f32, i32)> {
    // SAFETY: 32 elements at `block` and 32 bytes at `high` and `low`, as the caller
    // guarantees.
    unsafe {
        let (v, largest) = load_block(block.as_ptr(), 0)?;
        if largest == 0.0 {
            high.fill(0);
            low.fill(0);
            return Some((0.0, 0));
        }
        let inverse = 127.0 / largest;
        if inverse == f32::INFINITY {
            // As in `round_blocks`: such blocks take the portable split.
            return super::split_block(block, high, low);
        }
        let scale = _mm256_set1_ps(inverse);
        let t = v.map(|v| _mm256_mul_ps(v, scale));
        let whole = t.map(|t| nearest(t));
        let rest: [__m256i; 4] = std::array::from_fn(|i| {
            let remainder = _mm256_sub_ps(t[i], _mm256_cvtepi32_ps(whole[i]));
            nearest(_mm256_mul_ps(remainder, _mm256_set1_ps(256.0)))
        });
        store_bytes(whole, high.as_mut_ptr());
        store_bytes(rest, low.as_mut_ptr());
        let parts = |i: usize| _mm256_add_epi32(_mm256_slli_epi32::<8>(whole[i]), rest[i]);
        let sum = _mm256_add_epi32(
            _mm256_add_epi32(parts(0), parts(1)),
            _mm256_add_epi32(parts(2), parts(3)),
        );
        Some((largest / 127.0 / 256.0, total(sum)))
    }
}
