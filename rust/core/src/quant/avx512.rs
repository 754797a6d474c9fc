//! The AVX-512 F/BW kernel of `quant::linear`: the AVX2 kernel's scheme (see `avx2.rs`) with
//! 16-lane vectors, so a block is two vectors and its nibbles widen to floats in two steps
//! instead of four, and 32 registers, so a tile holds up to 24 accumulators and up to 12 rows
//! share each decoded block.
//!
//! A tile's width divides `GROUP` for every row count, so tiles of the widest shape cover every
//! column of a group and only a matrix's last, partial group runs one column at a time.
//!
//! Built only by Rust 1.89 and later, where these intrinsics are stable (see `quant.rs`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Format, Job, BLOCK, COLUMN_GROUP};
use crate::element::Element;

/// The most rows in a tile.
const TILE_ROWS: usize = 12;

/// Columns walked by every row tile before the next ones.
const GROUP: usize = COLUMN_GROUP;

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
/// The CPU has AVX-512 F and BW; `row` holds `out.len() / 32` blocks of `format`.
#[target_feature(enable = "avx512f,avx512bw,f16c,fma")]
pub(super) unsafe fn decode_row<T: Element>(format: Format, row: *const u8, out: &mut [T]) {
    // SAFETY: forwarded; each format's decoder matches `format`.
    unsafe {
        match format {
            Format::Q4_0 => decode_row_as::<Q40, T>(row, out),
            Format::Q4_1 => decode_row_as::<Q41, T>(row, out),
            Format::Q8_0 => decode_row_as::<Q80, T>(row, out),
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

/// Computes the output columns `columns` for every row of `job`.
///
/// # Safety
/// The CPU has AVX-512 F and BW; `job`'s pointers hold `m·in` inputs, the `[out, in]` blocks,
/// `out` biases (or are null) and `m·out` outputs; no other thread writes `columns`.
#[target_feature(enable = "avx512f,avx512bw,f16c,fma")]
pub(super) unsafe fn run(job: &Job, columns: Range<usize>) {
    // SAFETY: forwarded; each format's decoder matches `job.format`.
    unsafe {
        match job.format {
            Format::Q4_0 => run_as::<Q40>(job, columns),
            Format::Q4_1 => run_as::<Q41>(job, columns),
            Format::Q8_0 => run_as::<Q80>(job, columns),
        }
    }
}

#[inline(always)]
unsafe fn run_as<D: Decode>(job: &Job, columns: Range<usize>) {
    let tiles = job.m.div_ceil(TILE_ROWS);
    let mut group = columns.start;
    while group < columns.end {
        let group_end = (group + GROUP).min(columns.end);
        // The rows are spread evenly over the tiles (13 rows: 7 + 6, not 12 + 1).
        let mut row = 0;
        for tile in 0..tiles {
            let rows = (job.m - row).div_ceil(tiles - tile);
            // SAFETY: rows `row..row + rows` (1..=8 of them) and columns `group..group_end`
            // lie inside the job and this thread's share, as the caller guarantees.
            unsafe { by_rows::<D>(job, row, rows, group..group_end) };
            row += rows;
        }
        group = group_end;
    }
}

/// Runs `rows` rows (1..=12) from `row` over `columns` in tiles of the widest shape that fits
/// the 32 registers (2C decoded weights, R·C sums, 2 inputs), the columns short of a whole tile
/// one at a time.
#[inline(always)]
unsafe fn by_rows<D: Decode>(job: &Job, row: usize, rows: usize, columns: Range<usize>) {
    // SAFETY: forwarded from `run_as`; each arm's `R` equals `rows`.
    unsafe {
        match rows {
            1 => span::<D, 1, 8>(job, row, columns),
            2 => span::<D, 2, 4>(job, row, columns),
            3 => span::<D, 3, 4>(job, row, columns),
            4 => span::<D, 4, 4>(job, row, columns),
            5 => span::<D, 5, 4>(job, row, columns),
            6 => span::<D, 6, 2>(job, row, columns),
            7 => span::<D, 7, 2>(job, row, columns),
            8 => span::<D, 8, 2>(job, row, columns),
            9 => span::<D, 9, 2>(job, row, columns),
            10 => span::<D, 10, 2>(job, row, columns),
            11 => span::<D, 11, 2>(job, row, columns),
            _ => span::<D, 12, 2>(job, row, columns),
        }
    }
}

#[inline(always)]
unsafe fn span<D: Decode, const R: usize, const C: usize>(
    job: &Job,
    row: usize,
    columns: Range<usize>,
) {
    let mut column = columns.start;
    // SAFETY: every tile lies inside `columns` and the rows `row..row + R`, as the caller's.
    unsafe {
        while column + C <= columns.end {
            tile::<D, R, C>(job, row, column);
            column += C;
        }
        while column < columns.end {
            tile::<D, R, 1>(job, row, column);
            column += 1;
        }
    }
}

/// Output rows `row..row + R`, columns `column..column + C`. The tile's blocks are decoded
/// first (2C registers), then each row's 32 inputs are loaded once and meet all C of them, so
/// there is one load per C multiply-adds.
#[inline(always)]
unsafe fn tile<D: Decode, const R: usize, const C: usize>(job: &Job, row: usize, column: usize) {
    let k = job.in_features;
    let blocks = k / BLOCK;
    let row_bytes = blocks * D::BYTES;
    // SAFETY: the caller keeps rows and columns inside the job, so every offset below stays
    // inside the buffers `Job` describes; loads and stores are unaligned ones.
    unsafe {
        let x = job.x.add(row * k);
        let weight = job.weight.add(column * row_bytes);
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for b in 0..blocks {
            let mut w = [[_mm512_setzero_ps(); 2]; C];
            for (c, lanes) in w.iter_mut().enumerate() {
                *lanes = D::decode(weight.add(c * row_bytes + b * D::BYTES));
            }
            for (r, sums) in acc.iter_mut().enumerate() {
                let inputs = x.add(r * k + b * BLOCK);
                let (low, high) = (_mm512_loadu_ps(inputs), _mm512_loadu_ps(inputs.add(16)));
                for (sum, lanes) in sums.iter_mut().zip(&w) {
                    *sum = _mm512_fmadd_ps(lanes[1], high, _mm512_fmadd_ps(lanes[0], low, *sum));
                }
            }
        }
        for (r, sums) in acc.iter().enumerate() {
            for (c, sum) in sums.iter().enumerate() {
                let bias = if job.bias.is_null() {
                    0.0
                } else {
                    *job.bias.add(column + c)
                };
                *job.out.add((row + r) * job.out_features + column + c) = total(*sum) + bias;
            }
        }
    }
}

/// The sum of a vector's 16 lanes, always added in the same order.
#[inline(always)]
unsafe fn total(v: __m512) -> f32 {
    // SAFETY: register-only AVX-512 F and SSE operations; the caller has AVX-512 F.
    unsafe {
        let eight = _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        );
        let four = _mm_add_ps(
            _mm256_castps256_ps128(eight),
            _mm256_extractf128_ps::<1>(eight),
        );
        let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
        _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)))
    }
}
