//! How each format's values meet the activations in the AVX2 kernels (`avx2.rs`): the groups of
//! four weights a tile block's values hold, for half a tile (`Groups`), and the products they
//! add into each column's sum (`Values`: AVX2's `vpmaddubsw`, or AVX-VNNI's `vpdpbusd` in
//! `Dot`). See `avx2.rs` for why the sums of the formats differ.

use std::arch::x86_64::*;
use std::marker::PhantomData;

/// How a format's groups of four weights come out of a tile block's values.
pub(super) trait Groups {
    /// The two groups of four weights at `h` (0..4) of the half tile `half` of a block's
    /// values: weights `4h..4h+4` and `16+4h..16+4h+4` of its 8 columns.
    ///
    /// # Safety
    /// `at` points at a tile block's values; the CPU has AVX2.
    unsafe fn groups(at: *const u8, h: usize, half: usize) -> [__m256i; 2];
}

/// How a format's values meet the activations.
pub(super) trait Values: Groups {
    /// Whether the sums hold no zero point (Q8_0's signed values) to take off afterwards.
    const SIGNED: bool;
    /// How many of a block's four steps (two `add`s each, `h` = 0..4) a sum of `add`s holds
    /// before `widen`: the whole block, or fewer where its lanes would overflow.
    const STEPS: usize = 4;
    /// `sum` plus each column's four weights of `w` times the four activations of `a`.
    ///
    /// # Safety
    /// The CPU has AVX2.
    unsafe fn add(sum: __m256i, w: __m256i, a: __m256i) -> __m256i;
    /// A block's sum of `add`s as 8 int32 lanes: as it is, where `add` sums in them.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    unsafe fn widen(sum: __m256i) -> __m256i {
        sum
    }
}

/// `sum` plus each column's 16-bit pairs of products `pairs`, added into its int32 lane.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn add_pairs(sum: __m256i, pairs: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 operations; the caller has AVX2.
    unsafe { _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))) }
}

/// Q4_0 and Q4_1: the low and high nibbles of the same bytes; sums in 16-bit lanes.
pub(super) struct Nibbles;
/// Q5_0 and Q5_1: `Nibbles` with the fifth bits of the plane after them (`layout.rs`); sums in
/// 32-bit lanes (16 products of up to 31 × 128 would overflow 16 bits).
pub(super) struct FiveBits;
/// `FiveBits` summed in 16-bit lanes for two steps, then widened: a lane's four pairs of
/// products of up to 31 × 127 (activations are clamped to ±127) reach at most 31,496. Where
/// the registers allow a sum per row beside the widened one (the one-int8 kernel): `FiveBits`
/// took a `vpmaddwd` and a `vpaddd` per `vpmaddubsw`, this one a `vpaddw`, and a `vpmaddwd`
/// and a `vpaddd` per four.
pub(super) struct FiveBitsIn16;
/// Q8_0: the values made signed again; sums in 32-bit lanes.
pub(super) struct Bytes;
/// Q8_0's values as stored (the weight plus 128).
pub(super) struct Stored;

impl Groups for Nibbles {
    #[inline(always)]
    unsafe fn groups(at: *const u8, h: usize, half: usize) -> [__m256i; 2] {
        // SAFETY: the values hold 4 × 64 bytes at `at`, as the caller guarantees.
        unsafe {
            let packed = _mm256_loadu_si256(at.add(64 * h + 32 * half).cast());
            let mask = _mm256_set1_epi8(0x0f);
            [
                _mm256_and_si256(packed, mask),
                _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask),
            ]
        }
    }
}

impl Values for Nibbles {
    const SIGNED: bool = false;

    #[inline(always)]
    unsafe fn add(sum: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 operations; the caller has AVX2.
        unsafe { _mm256_add_epi16(sum, _mm256_maddubs_epi16(w, a)) }
    }

    #[inline(always)]
    unsafe fn widen(sum: __m256i) -> __m256i {
        // SAFETY: as above.
        unsafe { _mm256_madd_epi16(sum, _mm256_set1_epi16(1)) }
    }
}

impl Groups for FiveBits {
    #[inline(always)]
    unsafe fn groups(at: *const u8, h: usize, half: usize) -> [__m256i; 2] {
        // SAFETY: the nibbles hold 4 × 64 bytes at `at`, the plane 64 after them, as the
        // caller guarantees.
        unsafe {
            let [low, high] = Nibbles::groups(at, h, half);
            let bits = _mm256_loadu_si256(at.add(256 + 32 * half).cast());
            // Bits `h` and `h + 4` of each plane byte onto bit 4, by 16-bit shifts whose bits
            // carried across bytes land outside the mask (left by at most 4 into bits 0..4,
            // right by at most 3 into bits 5..8).
            let (low_bits, high_bits) = match h {
                0 => (_mm256_slli_epi16::<4>(bits), bits),
                1 => (_mm256_slli_epi16::<3>(bits), _mm256_srli_epi16::<1>(bits)),
                2 => (_mm256_slli_epi16::<2>(bits), _mm256_srli_epi16::<2>(bits)),
                _ => (_mm256_slli_epi16::<1>(bits), _mm256_srli_epi16::<3>(bits)),
            };
            let bit = _mm256_set1_epi8(0x10);
            [
                _mm256_or_si256(low, _mm256_and_si256(low_bits, bit)),
                _mm256_or_si256(high, _mm256_and_si256(high_bits, bit)),
            ]
        }
    }
}

impl Values for FiveBits {
    const SIGNED: bool = false;

    #[inline(always)]
    unsafe fn add(sum: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 operations; the caller has AVX2.
        unsafe { add_pairs(sum, _mm256_maddubs_epi16(w, a)) }
    }
}

impl Groups for FiveBitsIn16 {
    #[inline(always)]
    unsafe fn groups(at: *const u8, h: usize, half: usize) -> [__m256i; 2] {
        // SAFETY: the caller's promise, forwarded.
        unsafe { FiveBits::groups(at, h, half) }
    }
}

impl Values for FiveBitsIn16 {
    const SIGNED: bool = false;
    const STEPS: usize = 2;

    #[inline(always)]
    unsafe fn add(sum: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: as `Nibbles`.
        unsafe { Nibbles::add(sum, w, a) }
    }

    #[inline(always)]
    unsafe fn widen(sum: __m256i) -> __m256i {
        // SAFETY: as `Nibbles`.
        unsafe { Nibbles::widen(sum) }
    }
}

impl Groups for Bytes {
    #[inline(always)]
    unsafe fn groups(at: *const u8, h: usize, half: usize) -> [__m256i; 2] {
        // SAFETY: the values hold 8 × 64 bytes at `at`, as the caller guarantees.
        unsafe {
            let signed = |g: usize| {
                let stored = _mm256_loadu_si256(at.add(64 * g + 32 * half).cast());
                _mm256_xor_si256(stored, _mm256_set1_epi8(-128))
            };
            [signed(h), signed(h + 4)]
        }
    }
}

impl Values for Bytes {
    const SIGNED: bool = true;

    #[inline(always)]
    unsafe fn add(sum: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 operations; the caller has AVX2.
        unsafe {
            add_pairs(
                sum,
                _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w)),
            )
        }
    }
}

impl Groups for Stored {
    #[inline(always)]
    unsafe fn groups(at: *const u8, h: usize, half: usize) -> [__m256i; 2] {
        // SAFETY: the values hold 8 × 64 bytes at `at`, as the caller guarantees.
        unsafe {
            let stored = |g: usize| _mm256_loadu_si256(at.add(64 * g + 32 * half).cast());
            [stored(h), stored(h + 4)]
        }
    }
}

/// With AVX-VNNI, for every format: `vpdpbusd` multiplies unsigned weight bytes by signed
/// activation bytes and adds each column's four products into its 32-bit lane, in one
/// instruction where AVX2 takes two or four. Q8_0's stored values (weight plus 128) are such
/// bytes as they are, their zero point taken off afterwards as Q4_0's is. `G`: the format's
/// groups (`Stored` for Q8_0).
pub(super) struct Dot<G>(PhantomData<G>);

impl<G: Groups> Groups for Dot<G> {
    #[inline(always)]
    unsafe fn groups(at: *const u8, h: usize, half: usize) -> [__m256i; 2] {
        // SAFETY: the caller's promise, forwarded.
        unsafe { G::groups(at, h, half) }
    }
}

impl<G: Groups> Values for Dot<G> {
    const SIGNED: bool = false;

    #[inline(always)]
    unsafe fn add(sum: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: a register-only AVX-VNNI operation; the caller runs with AVX-VNNI enabled.
        unsafe { _mm256_dpbusd_avx_epi32(sum, w, a) }
    }
}
