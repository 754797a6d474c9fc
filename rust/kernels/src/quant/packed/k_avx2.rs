//! The AVX2 and AVX-VNNI instructions of the K-quants' kernels (`k_simd.rs`): half a tile, 8
//! columns, per vector. The two tiers differ only in their products ([`Products`]).
//!
//! AVX2 multiplies with `vpmaddubsw` (unsigned weight bytes times signed activation bytes,
//! adjacent pairs added into 16 bits) and `vpmaddwd` by ones (the pairs into each column's 32
//! bits). The K-quants' values are at most 63 and the activations within ±127, so a pair is at
//! most 16,002 in magnitude and never saturates: the sums are exact, as `vpdpbusd`'s are.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2::store;
use super::k_simd::{self, Lanes, Q4K, Q5K, Q6K};
use super::Job;
use crate::element::Element;
use crate::isa::{Avx2, AvxVnni};
use crate::quant::Format;

/// Rows `rows` of tiles `tiles` of a K-quant `job`, with AVX2's products.
///
/// # Safety
/// As `k_simd::run`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run<T: Element>(
    cpu: Avx2,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded; the token proves the instructions.
    unsafe { run_with(Halves(cpu), job, rows, tiles) }
}

/// `run` with AVX-VNNI's products.
///
/// # Safety
/// As `k_simd::run`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn run_vnni<T: Element>(
    cpu: AvxVnni,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded; the token proves the instructions.
    unsafe { run_with(Halves(cpu), job, rows, tiles) }
}

#[inline(always)]
unsafe fn run_with<P: Products, T: Element>(
    isa: Halves<P>,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded; each format's reader matches `job.format`.
    unsafe {
        match job.format {
            Format::Q4_K => k_simd::run::<_, Q4K, T>(isa, job, rows, tiles),
            Format::Q5_K => k_simd::run::<_, Q5K, T>(isa, job, rows, tiles),
            Format::Q6_K => k_simd::run::<_, Q6K, T>(isa, job, rows, tiles),
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 | Format::Q8_0 => {
                unreachable!("the formats of blocks of 32 take avx2.rs")
            }
        }
    }
}

/// How a 256-bit tier multiplies four weight bytes by four activations per column.
pub(super) trait Products: Copy {
    /// `sum` plus, per 32-bit lane, the four unsigned bytes of `w` times the four signed
    /// bytes of `a`.
    ///
    /// # Safety
    /// The CPU has the tier's instructions.
    unsafe fn dot(sum: __m256i, w: __m256i, a: __m256i) -> __m256i;
    /// `dot` of `w0` with `a0`, then of `w1` with `a1`.
    ///
    /// # Safety
    /// As `dot`.
    #[inline(always)]
    unsafe fn dot_two(sum: __m256i, w0: __m256i, a0: __m256i, w1: __m256i, a1: __m256i) -> __m256i {
        // SAFETY: the caller's promise.
        unsafe { Self::dot(Self::dot(sum, w0, a0), w1, a1) }
    }
}

impl Products for Avx2 {
    #[inline(always)]
    unsafe fn dot(sum: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 operations; the caller has AVX2. No pair saturates (see
        // the module).
        unsafe {
            let pairs = _mm256_maddubs_epi16(w, a);
            _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }

    /// Both products' pairs added in 16 bits (at most 32,004 in magnitude), then widened
    /// once: a `vpmaddwd` and a `vpaddd` fewer per two products. Zen 4 capped to AVX2, GOP/s
    /// at 2048 rows of SmolLM2's ffn_down shape, builds alternated 3 times: Q4_K 272-275 ->
    /// 327-331, Q5_K 226-255 -> 241-278. Q6_K's halves (`k_q6.rs`) take one group at a time:
    /// pairing them gained 7% here and halved the AVX-512 kernel's speed (its registers).
    #[inline(always)]
    unsafe fn dot_two(sum: __m256i, w0: __m256i, a0: __m256i, w1: __m256i, a1: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 operations; the caller has AVX2.
        unsafe {
            let pairs =
                _mm256_add_epi16(_mm256_maddubs_epi16(w0, a0), _mm256_maddubs_epi16(w1, a1));
            _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

impl Products for AvxVnni {
    #[inline(always)]
    unsafe fn dot(sum: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: a register-only AVX-VNNI operation; the caller runs with it enabled.
        unsafe { _mm256_dpbusd_avx_epi32(sum, w, a) }
    }
}

/// A 256-bit tier's lanes: half a tile.
#[derive(Clone, Copy)]
pub(super) struct Halves<P>(P);

// SAFETY (every method): register operations of AVX2, FMA and F16C, which the token inside
// proves and the functions they inline into enable, and loads and stores of the extents each
// method's contract gives.
impl<P: Products> Lanes for Halves<P> {
    const WIDTH: usize = 8;
    const WIDE: bool = false;
    type Bytes = __m256i;
    type Sum = __m256i;
    type Float = __m256;

    #[inline(always)]
    unsafe fn load(self, at: *const u8) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_loadu_si256(at.cast()) }
    }

    #[inline(always)]
    unsafe fn zero_bytes(self) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_setzero_si256() }
    }

    #[inline(always)]
    unsafe fn and(self, v: __m256i, mask: u8) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_and_si256(v, _mm256_set1_epi8(mask as i8)) }
    }

    #[inline(always)]
    unsafe fn or(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_or_si256(a, b) }
    }

    #[inline(always)]
    unsafe fn shift_left<const S: u32>(self, v: __m256i) -> __m256i {
        // SAFETY: see the impl. (The count in a register: AVX2's immediate form takes an i32
        // constant, which `S` cannot become on stable Rust; the constant folds all the same.)
        unsafe { _mm256_sll_epi16(v, _mm_cvtsi32_si128(S as i32)) }
    }

    #[inline(always)]
    unsafe fn shift_right<const S: u32>(self, v: __m256i) -> __m256i {
        // SAFETY: see the impl and `shift_left`.
        unsafe { _mm256_srl_epi16(v, _mm_cvtsi32_si128(S as i32)) }
    }

    #[inline(always)]
    unsafe fn zero(self) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_setzero_si256() }
    }

    #[inline(always)]
    unsafe fn dot(self, sum: __m256i, w: __m256i, a: *const i8) -> __m256i {
        // SAFETY: see the impl.
        unsafe { P::dot(sum, w, _mm256_set1_epi32(a.cast::<i32>().read_unaligned())) }
    }

    #[inline(always)]
    unsafe fn dots(self, sum: __m256i, w: [__m256i; 2], a: *const i8, two: bool) -> __m256i {
        // SAFETY: see the impl.
        unsafe {
            if !two {
                return self.dot(sum, w[0], a);
            }
            let first = _mm256_set1_epi32(a.cast::<i32>().read_unaligned());
            let second = _mm256_set1_epi32(a.add(16).cast::<i32>().read_unaligned());
            P::dot_two(sum, w[0], first, w[1], second)
        }
    }

    #[inline(always)]
    unsafe fn combine(self, high: __m256i, low: __m256i, zero: i32) -> __m256i {
        // SAFETY: see the impl.
        unsafe {
            let whole = _mm256_add_epi32(_mm256_slli_epi32::<8>(high), low);
            _mm256_sub_epi32(whole, _mm256_set1_epi32(zero))
        }
    }

    #[inline(always)]
    unsafe fn add(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_add_epi32(a, b) }
    }

    #[inline(always)]
    unsafe fn times_signed(self, sum: __m256i, at: *const u8) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_mullo_epi32(sum, _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.cast()))) }
    }

    #[inline(always)]
    unsafe fn zero_float(self) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(self, v: f32) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn halves(self, at: *const u8) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast())) }
    }

    #[inline(always)]
    unsafe fn small(self, at: *const u8, signed: bool) -> __m256 {
        // SAFETY: see the impl.
        unsafe {
            let bytes = _mm_loadl_epi64(at.cast());
            let wide = if signed {
                _mm256_cvtepi8_epi32(bytes)
            } else {
                _mm256_cvtepu8_epi32(bytes)
            };
            _mm256_cvtepi32_ps(wide)
        }
    }

    #[inline(always)]
    unsafe fn mul(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn scale_add(self, sum: __m256i, scale: __m256, acc: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc) }
    }

    #[inline(always)]
    unsafe fn sub_product(self, a: __m256, b: __m256, acc: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_fnmadd_ps(a, b, acc) }
    }

    #[inline(always)]
    unsafe fn store<T: Element>(
        self,
        acc: __m256,
        bias: *const f32,
        column: usize,
        target: *mut T,
        width: usize,
    ) {
        // SAFETY: see the impl.
        unsafe { store(acc, bias, column, target, width) }
    }
}
