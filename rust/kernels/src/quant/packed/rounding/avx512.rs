//! The AVX-512 instructions of the activation roundings, for the AVX-512 VNNI kernels: a block
//! in two vectors of 16 float32 bits (its halves for float32; its even and odd elements for
//! bfloat16, each pair's two halves of 32 bits, with no widening shuffle, narrowed back by one
//! when stored); the largest magnitude and the finiteness test from one integer maximum of the
//! magnitudes' bits; the rounding folded into the conversion.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Instructions, Out, BLOCK};
use crate::element::Element;
use crate::isa::Avx512;

/// `rounding::round_blocks` with AVX-512's instructions.
///
/// # Safety
/// As `rounding::round_blocks`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn round_blocks<T: Element, const SPLIT: bool>(
    cpu: Avx512,
    out: &Out<T>,
    blocks: Range<usize>,
) {
    // SAFETY: forwarded from the caller; the token proves AVX-512 F and BW.
    unsafe { super::round_blocks::<T, _, SPLIT>(cpu, out, blocks) }
}

/// `t` rounded to nearest (ties to even) and clamped to ±127, as int32 lanes. Clamping to
/// integers before rounding gives what rounding first does.
#[inline(always)]
unsafe fn nearest(t: __m512) -> __m512i {
    // SAFETY: register-only AVX-512 F operations; the caller has AVX-512 F.
    unsafe {
        let t = _mm512_min_ps(
            _mm512_max_ps(t, _mm512_set1_ps(-127.0)),
            _mm512_set1_ps(127.0),
        );
        _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t)
    }
}

/// Two vectors of int32 lanes within ±127, in `Instructions::load`'s order for `T`, as the
/// block's 32 bytes in order at `out`.
#[inline(always)]
unsafe fn store_bytes<T: Element>(v: [__m512i; 2], out: *mut i8) {
    // SAFETY: register operations and a 32-byte store at `out`, as the caller guarantees.
    unsafe {
        if T::REDUCED {
            // Each lane's even and odd byte side by side in its low 16 bits, then narrowed.
            let pairs = _mm512_or_si512(
                _mm512_and_si512(v[0], _mm512_set1_epi32(0xff)),
                _mm512_slli_epi32::<8>(v[1]),
            );
            _mm256_storeu_si256(out.cast(), _mm512_cvtepi32_epi16(pairs));
        } else {
            _mm_storeu_si128(out.cast(), _mm512_cvtepi32_epi8(v[0]));
            _mm_storeu_si128(out.add(16).cast(), _mm512_cvtepi32_epi8(v[1]));
        }
    }
}

impl<T: Element> Instructions<T> for Avx512 {
    type Block = [__m512; 2];
    type Sum = __m512i;

    #[inline(always)]
    unsafe fn load(self, x: *const T) -> ([__m512; 2], u32) {
        // SAFETY: as the caller guarantees.
        unsafe {
            let v = load_bits::<T>(x);
            (floats(v), _mm512_reduce_max_epu32(magnitude(v)))
        }
    }

    /// The four blocks' maxima folded together, in one vector.
    #[inline(always)]
    unsafe fn load4(self, x: *const T) -> ([[__m512; 2]; 4], [u32; 4]) {
        // SAFETY: as the caller guarantees.
        unsafe {
            let v = [
                load_bits::<T>(x),
                load_bits::<T>(x.add(BLOCK)),
                load_bits::<T>(x.add(2 * BLOCK)),
                load_bits::<T>(x.add(3 * BLOCK)),
            ];
            let top = fold4::<true>([
                magnitude(v[0]),
                magnitude(v[1]),
                magnitude(v[2]),
                magnitude(v[3]),
            ]);
            let mut bits = [0u32; 4];
            _mm_storeu_si128(bits.as_mut_ptr().cast(), top);
            (
                [floats(v[0]), floats(v[1]), floats(v[2]), floats(v[3])],
                bits,
            )
        }
    }

    #[inline(always)]
    unsafe fn one_int8(self, block: &[__m512; 2], inverse: f32, whole: *mut i8) -> __m512i {
        // SAFETY: register operations and a 32-byte store at `whole`, as the caller guarantees.
        unsafe {
            let scale = _mm512_set1_ps(inverse);
            let a = [
                nearest(_mm512_mul_ps(block[0], scale)),
                nearest(_mm512_mul_ps(block[1], scale)),
            ];
            store_bytes::<T>(a, whole);
            _mm512_add_epi32(a[0], a[1])
        }
    }

    #[inline(always)]
    unsafe fn split(
        self,
        block: &[__m512; 2],
        inverse: f32,
        whole: *mut i8,
        rest: *mut i8,
    ) -> __m512i {
        // SAFETY: register operations and 32-byte stores at `whole` and `rest`, as the caller
        // guarantees.
        unsafe {
            let scale = _mm512_set1_ps(inverse);
            let (low, high) = (split16(block[0], scale), split16(block[1], scale));
            store_bytes::<T>([low.0, high.0], whole);
            store_bytes::<T>([low.1, high.1], rest);
            _mm512_add_epi32(low.2, high.2)
        }
    }

    #[inline(always)]
    unsafe fn total(self, sum: __m512i) -> i32 {
        // SAFETY: a register-only AVX-512 F operation; the caller has AVX-512 F.
        unsafe { _mm512_reduce_add_epi32(sum) }
    }

    /// The four sums folded together, in one vector.
    #[inline(always)]
    unsafe fn totals4(self, sums: [__m512i; 4]) -> [i32; 4] {
        // SAFETY: register operations and a store to a local array; the caller has AVX-512 F.
        unsafe {
            let mut totals = [0i32; 4];
            _mm_storeu_si128(totals.as_mut_ptr().cast(), fold4::<false>(sums));
            totals
        }
    }
}

/// A block's 32 elements as two vectors of float32 bits: its halves for float32, its even and
/// odd elements for bfloat16.
///
/// # Safety
/// `x` holds 32 elements; the CPU has AVX-512 F.
#[inline(always)]
unsafe fn load_bits<T: Element>(x: *const T) -> [__m512i; 2] {
    // SAFETY: 32 elements at `x` (f32, or 16-bit `Bf16` when `T::REDUCED`: the only
    // `Element`s), as the caller guarantees.
    unsafe {
        if T::REDUCED {
            let pairs = _mm512_loadu_si512(x.cast());
            [
                _mm512_slli_epi32::<16>(pairs),
                _mm512_and_si512(pairs, _mm512_set1_epi32(0xffff_0000_u32 as i32)),
            ]
        } else {
            [
                _mm512_loadu_si512(x.cast()),
                _mm512_loadu_si512(x.add(16).cast()),
            ]
        }
    }
}

/// The magnitudes' bits of a block, folded to 16 lanes by their maximum. Magnitudes' bits
/// order as the magnitudes do, infinities and NaNs above every finite one.
#[inline(always)]
unsafe fn magnitude(v: [__m512i; 2]) -> __m512i {
    // SAFETY: register-only AVX-512 F operations; the caller has AVX-512 F.
    unsafe {
        let mask = _mm512_set1_epi32(0x7fff_ffff);
        _mm512_max_epu32(_mm512_and_si512(v[0], mask), _mm512_and_si512(v[1], mask))
    }
}

/// Sixteen values times `scale` split into their parts `a` and `b`, with `256a + b`.
#[inline(always)]
unsafe fn split16(v: __m512, scale: __m512) -> (__m512i, __m512i, __m512i) {
    // SAFETY: register-only AVX-512 F operations; the caller has AVX-512 F.
    unsafe {
        let t = _mm512_mul_ps(v, scale);
        let a = nearest(t);
        let remainder = _mm512_sub_ps(t, _mm512_cvtepi32_ps(a));
        let b = nearest(_mm512_mul_ps(remainder, _mm512_set1_ps(256.0)));
        (a, b, _mm512_add_epi32(_mm512_slli_epi32::<8>(a), b))
    }
}

/// Two vectors of float32 bits as floats.
#[inline(always)]
unsafe fn floats(v: [__m512i; 2]) -> [__m512; 2] {
    // SAFETY: register-only casts; the caller has AVX-512 F.
    unsafe { [_mm512_castsi512_ps(v[0]), _mm512_castsi512_ps(v[1])] }
}

/// The unsigned maximum (`MAX`) or the sum of two vectors' lanes.
#[inline(always)]
unsafe fn combine<const MAX: bool>(a: __m512i, c: __m512i) -> __m512i {
    // SAFETY: register-only AVX-512 F operations; the caller has AVX-512 F.
    unsafe {
        if MAX {
            _mm512_max_epu32(a, c)
        } else {
            _mm512_add_epi32(a, c)
        }
    }
}

/// Lane `i` (of 4) of the result: every lane of `v[i]` combined (`combine::<MAX>`).
#[inline(always)]
unsafe fn fold4<const MAX: bool>(v: [__m512i; 4]) -> __m128i {
    // SAFETY: register-only AVX-512 F operations; the caller has AVX-512 F.
    unsafe {
        // 128-bit lanes 0, 1 of `a` and of `c` against lanes 2, 3: each vector in 2 lanes.
        let p = combine::<MAX>(
            _mm512_shuffle_i32x4::<0x44>(v[0], v[1]),
            _mm512_shuffle_i32x4::<0xee>(v[0], v[1]),
        );
        let q = combine::<MAX>(
            _mm512_shuffle_i32x4::<0x44>(v[2], v[3]),
            _mm512_shuffle_i32x4::<0xee>(v[2], v[3]),
        );
        // Then each vector in one 128-bit lane (lane i for `v[i]`), then in each element.
        let lanes = combine::<MAX>(
            _mm512_shuffle_i32x4::<0x88>(p, q),
            _mm512_shuffle_i32x4::<0xdd>(p, q),
        );
        let pairs = combine::<MAX>(lanes, _mm512_shuffle_epi32::<0x4e>(lanes));
        let all = combine::<MAX>(pairs, _mm512_shuffle_epi32::<0xb1>(pairs));
        let first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm512_castsi512_si128(_mm512_permutexvar_epi32(first, all))
    }
}
