//! The AVX-512 VNNI instructions of the K-quants' kernels (`k_simd.rs`): a whole tile of 16
//! columns per vector, `vpdpbusd` for the products; and the K-quants' transposed
//! dequantization, which reads the groups of values as the kernels do.

use std::arch::x86_64::*;
use std::ops::Range;

use super::k_layout::{halves_at, mins_at, scales_at};
use super::k_simd::{self, KFormat, Lanes, Q4K, Q5K, Q6K};
use super::vnni::{bias_lanes, store, transposed};
use super::{Job, PackedMatrix, TILE};
use crate::element::Element;
use crate::isa::Avx512Vnni;
use crate::quant::{Format, BLOCK, SUPER_BLOCK};

/// Rows `rows` of tiles `tiles` of a K-quant `job`.
///
/// # Safety
/// As `k_simd::run`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
pub(super) unsafe fn run<T: Element>(
    cpu: Avx512Vnni,
    job: &Job<T>,
    rows: Range<usize>,
    tiles: Range<usize>,
) {
    // SAFETY: forwarded; each format's reader matches `job.format`; the token proves the
    // instructions.
    unsafe {
        match job.format {
            Format::Q4_K => k_simd::run::<_, Q4K, T>(cpu, job, rows, tiles),
            Format::Q5_K => k_simd::run::<_, Q5K, T>(cpu, job, rows, tiles),
            Format::Q6_K => k_simd::run::<_, Q6K, T>(cpu, job, rows, tiles),
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 | Format::Q8_0 => {
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
    unsafe fn dots(self, sum: __m512i, w: [__m512i; 2], a: *const i8, two: bool) -> __m512i {
        // SAFETY: see the impl.
        unsafe {
            let sum = self.dot(sum, w[0], a);
            match two {
                true => self.dot(sum, w[1], a.add(16)),
                false => sum,
            }
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
    unsafe fn add(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_add_epi32(a, b) }
    }

    #[inline(always)]
    unsafe fn times_signed(self, sum: __m512i, at: *const u8) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_mullo_epi32(sum, _mm512_cvtepi8_epi32(_mm_loadu_si128(at.cast()))) }
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

/// `layout::transpose_tile` for a K-quant's tile: each group of four weights of the tile's 16
/// columns (`KFormat::groups`, as the product reads them) transposed in registers into four
/// rows of 16 (`vnni::transposed`), then widened to floats and scaled as
/// `k_blocks::weight` scales one weight (`(d·sc)·q - dmin·m`, or Q6_K's `(d·sc)·(q - 32)`,
/// each operation rounded as written).
///
/// # Safety
/// As `layout::transpose_tile`; `weight` is a K-quant.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
pub(super) unsafe fn transpose_tile<T: Element>(
    cpu: Avx512Vnni,
    weight: &PackedMatrix<'_>,
    t: usize,
    out: *mut T,
) {
    // SAFETY: forwarded; each format's reader matches `weight.format`.
    unsafe {
        match weight.format {
            Format::Q4_K => transpose_as::<Q4K, T>(cpu, weight, t, out),
            Format::Q5_K => transpose_as::<Q5K, T>(cpu, weight, t, out),
            Format::Q6_K => transpose_as::<Q6K, T>(cpu, weight, t, out),
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 | Format::Q8_0 => {
                unreachable!("the formats of blocks of 32 take vnni.rs")
            }
        }
    }
}

#[inline(always)]
unsafe fn transpose_as<F: KFormat, T: Element>(
    cpu: Avx512Vnni,
    weight: &PackedMatrix<'_>,
    t: usize,
    out: *mut T,
) {
    let (n, format) = (weight.out_features, F::FORMAT);
    let width = TILE.min(n - t * TILE);
    // SAFETY: every tile super-block read lies inside the checked packed buffer; every row
    // written is below `in_features` and `store` writes `width` columns from `16t`, inside
    // `out`.
    unsafe {
        for s in 0..weight.in_features / SUPER_BLOCK {
            let at = weight.bytes.as_ptr().add(weight.tile_block(t, s));
            let d = cpu.halves(at.add(halves_at(format)));
            for j in 0..8 {
                let min = if F::MINS {
                    let dmin = cpu.halves(at.add(halves_at(format) + 2 * TILE));
                    cpu.mul(dmin, cpu.small(at.add(mins_at(format) + TILE * j), false))
                } else {
                    cpu.zero_float()
                };
                for p in 0..F::PARTS {
                    let sc = cpu.small(
                        at.add(scales_at(format) + TILE * (F::PARTS * j + p)),
                        !F::MINS,
                    );
                    let scale = cpu.mul(d, sc);
                    for h in 0..4 {
                        // Both groups of a sub-block of 32, or Q6_K's half's one.
                        let used = if F::PARTS == 1 { 2 } else { 1 };
                        let groups = F::groups(cpu, at, j, h, p, 0);
                        for (g, group) in groups.into_iter().enumerate().take(used) {
                            // Group `h + 4g` of a sub-block of 32, or Q6_K's `h + 4p`.
                            let first = s * SUPER_BLOCK + BLOCK * j + 4 * (h + 4 * (g + p));
                            for (i, q) in transposed(group).into_iter().enumerate() {
                                let value = if F::MINS {
                                    _mm512_sub_ps(_mm512_mul_ps(scale, q), min)
                                } else {
                                    let zero = _mm512_set1_ps(F::ZERO as f32);
                                    _mm512_mul_ps(scale, _mm512_sub_ps(q, zero))
                                };
                                store(value, out.add((first + i) * n + t * TILE), width);
                            }
                        }
                    }
                }
            }
        }
    }
}
