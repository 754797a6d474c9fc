//! AVX-512 F/BW decoding of GGUF blocks (`dequantize`, `dequantize_rows`: embedding lookups and
//! the dense path), two 16-lane vectors a block, and the bf16 rounding that the integer
//! kernels' stores share.
//!
//! Built only by Rust 1.89 and later, where these intrinsics are stable (see `quant.rs`).

use std::arch::x86_64::*;

use super::{Format, BLOCK};
use crate::element::Element;
use crate::isa::Avx512;

/// Expands one block to its 32 weights, given its first byte.
trait Decode {
    const BYTES: usize;
    /// # Safety
    /// `block` points at `BYTES` readable bytes; the CPU has AVX-512 F and BW.
    unsafe fn decode(block: *const u8) -> [__m512; 2];
    /// `decode` rounded as `block::decode` (and the `gguf` package) round: for `dequantize`.
    /// # Safety
    /// As `decode`.
    unsafe fn decode_exact(block: *const u8) -> [__m512; 2];
}

/// The 16 bytes of nibbles at `qs` as 32 floats 0..=15.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> [__m512; 2] {
    // SAFETY: the caller guarantees 16 readable bytes at `qs` and the CPU features.
    unsafe {
        let bytes = _mm_loadu_si128(qs.cast());
        let mask = _mm_set1_epi8(0x0f);
        let low = _mm_and_si128(bytes, mask);
        let high = _mm_and_si128(_mm_srli_epi16::<4>(bytes), mask);
        let float = |v: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
        [float(low), float(high)]
    }
}

/// The halves at `block` (two for Q4_1: d then m) as floats in the low lanes.
#[inline(always)]
unsafe fn halves(block: *const u8) -> __m128 {
    // SAFETY: the caller guarantees 4 readable bytes at `block`; AVX-512 F implies F16C.
    unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128(block.cast::<i32>().read_unaligned())) }
}

struct Q40;
struct Q41;
struct Q80;

impl Decode for Q40 {
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn decode(block: *const u8) -> [__m512; 2] {
        // SAFETY: 18 bytes at `block`: the scale's 2 (read with 2 nibble bytes) and 16 of
        // nibbles at 2. d·q − 8d is d·(q − 8) rounded once.
        unsafe {
            let d = _mm512_broadcastss_ps(halves(block));
            let m = _mm512_mul_ps(d, _mm512_set1_ps(-8.0));
            nibbles(block.add(2)).map(|q| _mm512_fmadd_ps(q, d, m))
        }
    }
    #[inline(always)]
    unsafe fn decode_exact(block: *const u8) -> [__m512; 2] {
        // SAFETY: as `decode`. (The fused d·q − 8d is the same float for finite scales, but
        // not for an infinite one, where it is NaN instead of ±∞ for q ≠ 8.)
        unsafe {
            let d = _mm512_broadcastss_ps(halves(block));
            let eight = _mm512_set1_ps(8.0);
            nibbles(block.add(2)).map(|q| _mm512_mul_ps(d, _mm512_sub_ps(q, eight)))
        }
    }
}

impl Decode for Q41 {
    const BYTES: usize = 20;
    #[inline(always)]
    unsafe fn decode(block: *const u8) -> [__m512; 2] {
        // SAFETY: 20 bytes at `block`: d and m in the first 4, 16 of nibbles at 4.
        unsafe {
            let dm = halves(block);
            let d = _mm512_broadcastss_ps(dm);
            let m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
            nibbles(block.add(4)).map(|q| _mm512_fmadd_ps(q, d, m))
        }
    }
    #[inline(always)]
    unsafe fn decode_exact(block: *const u8) -> [__m512; 2] {
        // SAFETY: as `decode`; the product is rounded, then the sum.
        unsafe {
            let dm = halves(block);
            let d = _mm512_broadcastss_ps(dm);
            let m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
            nibbles(block.add(4)).map(|q| _mm512_add_ps(_mm512_mul_ps(q, d), m))
        }
    }
}

impl Decode for Q80 {
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn decode(block: *const u8) -> [__m512; 2] {
        // SAFETY: 34 bytes at `block`: the scale's 2 (read with 2 value bytes) and 32 signed
        // values at 2, read 16 at a time.
        unsafe {
            let d = _mm512_broadcastss_ps(halves(block));
            let values = |at: usize| {
                let sixteen = _mm_loadu_si128(block.add(2 + at).cast());
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sixteen)), d)
            };
            [values(0), values(16)]
        }
    }
    #[inline(always)]
    unsafe fn decode_exact(block: *const u8) -> [__m512; 2] {
        // SAFETY: as `decode`, which rounds once, as the reference does.
        unsafe { Self::decode(block) }
    }
}

/// Decodes the row of blocks at `row` into `out` (`out.len() / 32` blocks), as `T`.
///
/// # Safety
/// `row` holds `out.len() / 32` blocks of `format`: Q4_0, Q4_1 or Q8_0.
#[target_feature(enable = "avx512f,avx512bw,f16c,fma")]
pub(super) unsafe fn decode_row<T: Element>(
    _: Avx512,
    format: Format,
    row: *const u8,
    out: &mut [T],
) {
    // SAFETY: forwarded; each format's decoder matches `format`.
    unsafe {
        match format {
            Format::Q4_0 => decode_row_as::<Q40, T>(row, out),
            Format::Q4_1 => decode_row_as::<Q41, T>(row, out),
            Format::Q8_0 => decode_row_as::<Q80, T>(row, out),
            Format::Q5_0 | Format::Q5_1 | Format::Q4_K | Format::Q5_K | Format::Q6_K => {
                unreachable!("{format:?} decodes in plain Rust (`dequant.rs`)")
            }
        }
    }
}

#[inline(always)]
unsafe fn decode_row_as<D: Decode, T: Element>(row: *const u8, out: &mut [T]) {
    for (b, values) in out.chunks_exact_mut(BLOCK).enumerate() {
        // SAFETY: block `b` of the row is readable (the caller's word); `values` holds 32
        // elements, which are `f32` or, when `T::REDUCED`, `Bf16` (16 bits: the only
        // `Element`s), so the stores write exactly its 128 or 64 bytes.
        unsafe {
            let w = D::decode_exact(row.add(b * D::BYTES));
            if T::REDUCED {
                let target = values.as_mut_ptr().cast::<__m256i>();
                _mm256_storeu_si256(target, bf16(w[0]));
                _mm256_storeu_si256(target.add(1), bf16(w[1]));
            } else {
                let target = values.as_mut_ptr().cast::<f32>();
                _mm512_storeu_ps(target, w[0]);
                _mm512_storeu_ps(target.add(16), w[1]);
            }
        }
    }
}

/// 16 floats rounded to bfloat16 bits as `Bf16::from_f32` rounds (ties to even, NaNs
/// kept quiet).
#[inline(always)]
pub(super) unsafe fn bf16(v: __m512) -> __m256i {
    // SAFETY: register-only AVX-512 F operations; the caller has AVX-512 F.
    unsafe {
        let bits = _mm512_castps_si512(v);
        let high = _mm512_srli_epi32::<16>(bits);
        let bias = _mm512_add_epi32(
            _mm512_and_si512(high, _mm512_set1_epi32(1)),
            _mm512_set1_epi32(0x7fff),
        );
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias));
        let quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet))
    }
}
