//! The AVX-512 VNNI instructions of the K-quants' kernels (`k_simd.rs`): a whole tile of 16
//! columns per vector, `vpdpbusd` for the products.

use std::arch::x86_64::*;
use std::ops::Range;

use super::k_simd::{self, Lanes, Q4K, Q5K, Q6K};
use super::vnni::{bias_lanes, store};
use super::Job;
use crate::element::Element;
use crate::isa::Avx512Vnni;
use crate::quant::Format;

/// `linear_packed`'s tiles `tiles` of a K-quant `job`, for every row.
///
/// # Safety
/// As `k_simd::run`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
pub(super) unsafe fn run<T: Element>(cpu: Avx512Vnni, job: &Job<T>, tiles: Range<usize>) {
    // SAFETY: forwarded; each format's reader matches `job.format`; the token proves the
    // instructions.
    unsafe {
        match job.format {
            Format::Q4_K => k_simd::run::<_, Q4K, T>(cpu, job, tiles),
            Format::Q5_K => k_simd::run::<_, Q5K, T>(cpu, job, tiles),
            Format::Q6_K => k_simd::run::<_, Q6K, T>(cpu, job, tiles),
            Format::Q4_0 | Format::Q4_1 | Format::Q8_0 => {
                unreachable!("the formats of blocks of 32 take vnni.rs")
            }
        }
    }
}

// SAFETY (every method): register operations of AVX-512 F, BW, VNNI, F16C and FMA, which the
// token proves and the functions they inline into enable, and loads and stores of the extents
// each method's contract gives.
impl Lanes for Avx512Vnni {
    const WIDTH: usize = 16;
    const WIDE: bool = true;
    type Bytes = __m512i;
    type Sum = __m512i;
    type Float = __m512;

    #[inline(always)]
    unsafe fn load(self, at: *const u8) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_loadu_si512(at.cast()) }
    }

    #[inline(always)]
    unsafe fn zero_bytes(self) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    unsafe fn and(self, v: __m512i, mask: u8) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_and_si512(v, _mm512_set1_epi8(mask as i8)) }
    }

    #[inline(always)]
    unsafe fn or(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_or_si512(a, b) }
    }

    #[inline(always)]
    unsafe fn shift_left<const S: u32>(self, v: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_slli_epi16::<S>(v) }
    }

    #[inline(always)]
    unsafe fn shift_right<const S: u32>(self, v: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_srli_epi16::<S>(v) }
    }

    #[inline(always)]
    unsafe fn zero(self) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    unsafe fn dot(self, sum: __m512i, w: __m512i, a: *const i8) -> __m512i {
        // SAFETY: see the impl.
        unsafe {
            let four = _mm512_set1_epi32(a.cast::<i32>().read_unaligned());
            _mm512_dpbusd_epi32(sum, w, four)
        }
    }

    #[inline(always)]
    unsafe fn combine(self, high: __m512i, low: __m512i, zero: i32) -> __m512i {
        // SAFETY: see the impl.
        unsafe {
            let whole = _mm512_add_epi32(_mm512_slli_epi32::<8>(high), low);
            _mm512_sub_epi32(whole, _mm512_set1_epi32(zero))
        }
    }

    #[inline(always)]
    unsafe fn zero_float(self) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(self, v: f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn halves(self, at: *const u8) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(at.cast())) }
    }

    #[inline(always)]
    unsafe fn small(self, at: *const u8, signed: bool) -> __m512 {
        // SAFETY: see the impl.
        unsafe {
            let bytes = _mm_loadu_si128(at.cast());
            let wide = if signed {
                _mm512_cvtepi8_epi32(bytes)
            } else {
                _mm512_cvtepu8_epi32(bytes)
            };
            _mm512_cvtepi32_ps(wide)
        }
    }

    #[inline(always)]
    unsafe fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn scale_add(self, sum: __m512i, scale: __m512, acc: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc) }
    }

    #[inline(always)]
    unsafe fn sub_product(self, a: __m512, b: __m512, acc: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_fnmadd_ps(a, b, acc) }
    }

    #[inline(always)]
    unsafe fn store<T: Element>(
        self,
        acc: __m512,
        bias: *const f32,
        column: usize,
        target: *mut T,
        width: usize,
    ) {
        // SAFETY: see the impl.
        unsafe {
            store(
                _mm512_add_ps(acc, bias_lanes(bias, column, width)),
                target,
                width,
            )
        }
    }
}
