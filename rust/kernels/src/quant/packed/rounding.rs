//! Activations rounded to int8 per block of 32, for the integer kernels: one driver over the
//! instruction-set tiers, which differ only in their instructions ([`Instructions`]).
//!
//! Two roundings, each with its kernels:
//! - **one int8** per value (`one_int8.rs`, llama.cpp's Q8 activations): a block is `u·a` with
//!   `u` = the largest magnitude / 127 and `a` = `x · (127 / largest)` rounded to nearest (ties
//!   to even) and clamped to ±127; beside it its integer sum `Σa` and `u·Σa`;
//! - **split** into two int8 parts (`packed.rs`): a block is `s·(a + b/256)`, `a` as above and
//!   `b` the remainder `x · (127 / largest) - a` times 256, rounded and clamped likewise; its unit
//!   is `u/256` and its integer sum `Σ(256a + b)`.
//!
//! The driver decides everything but the arithmetic on a block's 32 values, the same way for
//! every tier: a block holding a NaN or an infinity has zero parts, a NaN unit and sum and a
//! total of 0 (so its rows' outputs are NaN); an all-zero block has zero parts, unit and sum; a
//! block whose largest magnitude is below 127 / `f32::MAX` (the scale overflows, and zero times
//! it is a NaN, which the SIMD conversions would clamp and plain Rust casts to 0) takes the
//! portable instructions. Many values are rounded on several threads, each a range of blocks.
//!
//! What must stay true: every tier gives the portable tier's parts, units, totals and sums bit
//! for bit, so a kernel's output does not depend on the tier that rounded its activations.

use std::ops::Range;

use super::{PackedKernel, BLOCK};
use crate::element::Element;
#[cfg(target_arch = "x86_64")]
use crate::isa::{Avx2, Avx512};
use crate::parallel;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

/// Activation values below which rounding them runs on the calling thread alone.
const PARALLEL_MIN: usize = 1 << 16;

/// Activation rows rounded per block of 32 (see the module).
pub(crate) struct RoundedRows {
    /// `[m, k]` parts `a`.
    pub(crate) whole: Vec<i8>,
    /// `[m, k]` parts `b` of the split rounding (empty for one int8).
    pub(crate) rest: Vec<i8>,
    /// `[m, k / 32]` units: `u` for one int8, `u/256` split.
    pub(crate) units: Vec<f32>,
    /// `[m, k / 32]` integer sums: `Σa` for one int8, `Σ(256a + b)` split.
    pub(crate) totals: Vec<i32>,
    /// `[m, k / 32]` each unit times its integer sum.
    pub(crate) sums: Vec<f32>,
}

impl RoundedRows {
    /// The rows of `x` (`k` a multiple of 32, `x.len()` a multiple of `k`) rounded to one int8
    /// per value, with `kernel`'s instructions (the same results with every kernel).
    pub(crate) fn one_int8<T: Element>(x: &[T], kernel: PackedKernel) -> RoundedRows {
        round::<T, false>(x, kernel)
    }

    /// The rows of `x` split into two int8 parts per value, as `one_int8` takes them.
    pub(crate) fn split<T: Element>(x: &[T], kernel: PackedKernel) -> RoundedRows {
        round::<T, true>(x, kernel)
    }
}

/// A tier's arithmetic on blocks of 32 activations.
pub(super) trait Instructions<T: Element>: Copy {
    /// A loaded block, in the tier's registers.
    type Block;
    /// A block's integer sum, before its lanes are added up.
    type Sum: Copy;

    /// Loads the block at `x`, with the bits of its largest magnitude (above `f32::MAX`'s for a
    /// NaN or an infinity).
    ///
    /// # Safety
    /// `x` holds 32 elements; the CPU has the tier's instructions.
    unsafe fn load(self, x: *const T) -> (Self::Block, u32);

    /// `load` for the four blocks at `x`; a tier that folds their maxima together says so here.
    ///
    /// # Safety
    /// `x` holds 4 × 32 elements; the CPU has the tier's instructions.
    #[inline(always)]
    unsafe fn load4(self, x: *const T) -> ([Self::Block; 4], [u32; 4]) {
        // SAFETY: as the caller guarantees. (No closures here and in the driver: a closure
        // does not take the instructions of the tier's function it is inlined into, and an
        // intrinsic called from it is a call.)
        unsafe {
            let (b0, m0) = self.load(x);
            let (b1, m1) = self.load(x.add(BLOCK));
            let (b2, m2) = self.load(x.add(2 * BLOCK));
            let (b3, m3) = self.load(x.add(3 * BLOCK));
            ([b0, b1, b2, b3], [m0, m1, m2, m3])
        }
    }

    /// Writes the block's values times `inverse` (finite), rounded to nearest (ties to even)
    /// and clamped to ±127, as 32 bytes in order at `whole`; returns their sum.
    ///
    /// # Safety
    /// `whole` holds 32 bytes; the CPU has the tier's instructions.
    unsafe fn one_int8(self, block: &Self::Block, inverse: f32, whole: *mut i8) -> Self::Sum;

    /// Writes the block's parts `a` at `whole` (as `one_int8`) and `b` at `rest`; returns
    /// `Σ(256a + b)`.
    ///
    /// # Safety
    /// `whole` and `rest` hold 32 bytes each; the CPU has the tier's instructions.
    unsafe fn split(
        self,
        block: &Self::Block,
        inverse: f32,
        whole: *mut i8,
        rest: *mut i8,
    ) -> Self::Sum;

    /// A sum's lanes added up.
    ///
    /// # Safety
    /// The CPU has the tier's instructions.
    unsafe fn total(self, sum: Self::Sum) -> i32;

    /// `total` of four sums; a tier that folds them together says so here.
    ///
    /// # Safety
    /// The CPU has the tier's instructions.
    #[inline(always)]
    unsafe fn totals4(self, sums: [Self::Sum; 4]) -> [i32; 4] {
        // SAFETY: as the caller guarantees.
        unsafe {
            [
                self.total(sums[0]),
                self.total(sums[1]),
                self.total(sums[2]),
                self.total(sums[3]),
            ]
        }
    }
}

/// Where a rounding writes: the buffers of `RoundedRows`, by block number.
pub(super) struct Out<T> {
    x: *const T,
    whole: *mut i8,
    rest: *mut i8,
    units: *mut f32,
    totals: *mut i32,
    sums: *mut f32,
}

// SAFETY: the threads read `x` and write disjoint ranges of blocks (see `round`).
unsafe impl<T> Sync for Out<T> {}

impl<T> Out<T> {
    /// Where block `b`'s parts go (`rest` is not written for one int8).
    ///
    /// # Safety
    /// Block `b` lies inside the buffers.
    #[inline(always)]
    unsafe fn parts(&self, b: usize) -> (*mut i8, *mut i8) {
        // SAFETY: as the caller guarantees (`rest` is only an address for one int8).
        unsafe { (self.whole.add(b * BLOCK), self.rest.wrapping_add(b * BLOCK)) }
    }

    /// Writes block `b`'s unit, integer sum and their product.
    ///
    /// # Safety
    /// Entry `b` lies inside the per-block buffers.
    #[inline(always)]
    unsafe fn finish(&self, b: usize, unit: f32, total: i32) {
        // SAFETY: as the caller guarantees.
        unsafe {
            *self.units.add(b) = unit;
            *self.totals.add(b) = total;
            *self.sums.add(b) = unit * total as f32;
        }
    }
}

/// Which tier's instructions round for `kernel`: the AVX2 kernels (with AVX-VNNI or without)
/// round with AVX2's, the AVX-512 VNNI kernel with AVX-512's.
#[derive(Clone, Copy)]
enum Tier {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

impl From<PackedKernel> for Tier {
    fn from(kernel: PackedKernel) -> Tier {
        match kernel {
            PackedKernel::Portable => Tier::Portable,
            #[cfg(target_arch = "x86_64")]
            PackedKernel::Avx2(cpu) => Tier::Avx2(cpu),
            #[cfg(target_arch = "x86_64")]
            PackedKernel::AvxVnni(cpu) => Tier::Avx2(cpu.into()),
            #[cfg(target_arch = "x86_64")]
            PackedKernel::Avx512Vnni(cpu) => Tier::Avx512(cpu.into()),
            #[cfg(not(target_arch = "x86_64"))]
            PackedKernel::Avx2(_) | PackedKernel::AvxVnni(_) | PackedKernel::Avx512Vnni(_) => {
                unreachable!("detection makes no x86 token off x86-64")
            }
        }
    }
}

fn round<T: Element, const SPLIT: bool>(x: &[T], kernel: PackedKernel) -> RoundedRows {
    let count = x.len() / BLOCK;
    // The parts start uninitialized: every block's 32 are written below, once (zeroing them
    // first cost about 1% of a prefill pass).
    let mut rows = RoundedRows {
        whole: Vec::with_capacity(x.len()),
        rest: Vec::with_capacity(if SPLIT { x.len() } else { 0 }),
        units: vec![0.0; count],
        totals: vec![0; count],
        sums: vec![0.0; count],
    };
    let out = Out {
        x: x.as_ptr(),
        whole: rows.whole.as_mut_ptr(),
        rest: rows.rest.as_mut_ptr(),
        units: rows.units.as_mut_ptr(),
        totals: rows.totals.as_mut_ptr(),
        sums: rows.sums.as_mut_ptr(),
    };
    let threads = if x.len() >= PARALLEL_MIN {
        parallel::max_threads()
    } else {
        1
    };
    let tier = Tier::from(kernel);
    parallel::run(threads, &|thread, threads| {
        let blocks = count * thread / threads..count * (thread + 1) / threads;
        // SAFETY: the tier's token proves the CPU has its instructions; `blocks` belongs to
        // this thread alone (the blocks are split into disjoint ranges by thread) and lies
        // inside the buffers, sized above.
        unsafe {
            match tier {
                Tier::Portable => round_blocks::<T, _, SPLIT>(Portable, &out, blocks),
                #[cfg(target_arch = "x86_64")]
                Tier::Avx2(cpu) => avx2::round_blocks::<T, SPLIT>(cpu, &out, blocks),
                #[cfg(target_arch = "x86_64")]
                Tier::Avx512(cpu) => avx512::round_blocks::<T, SPLIT>(cpu, &out, blocks),
            }
        }
    });
    // SAFETY: the threads above wrote every block's parts (`round_block` writes all 32 of
    // each, in every case), and the region has ended.
    unsafe {
        rows.whole.set_len(x.len());
        if SPLIT {
            rows.rest.set_len(x.len());
        }
    }
    rows
}

/// The bits of the smallest magnitude whose scale `127 / largest` is finite.
const SMALLEST_ORDINARY: u32 = {
    let mut bits = (127.0f32 / f32::MAX).to_bits();
    while 127.0 / f32::from_bits(bits - 1) != f32::INFINITY {
        bits -= 1;
    }
    while 127.0 / f32::from_bits(bits) == f32::INFINITY {
        bits += 1;
    }
    bits
};

/// The largest magnitude of a block whose bits are `bits`, where the block takes a tier's
/// instructions: finite, not zero, and with a finite scale `127 / largest`.
#[inline(always)]
fn ordinary(bits: u32) -> Option<f32> {
    (SMALLEST_ORDINARY..=f32::MAX.to_bits())
        .contains(&bits)
        .then(|| f32::from_bits(bits))
}

/// A block's unit: `u`, or `u/256` split.
#[inline(always)]
fn unit<const SPLIT: bool>(largest: f32) -> f32 {
    let unit = largest / 127.0;
    if SPLIT {
        unit / 256.0
    } else {
        unit
    }
}

/// Rounds blocks `blocks` with `isa`'s instructions: each block's parts, unit, integer sum and
/// sum. Four ordinary blocks (the rule) go together, so that a tier may fold their maxima and
/// sums; any other block goes alone. Inlined into each tier's function, which enables its
/// instructions.
///
/// # Safety
/// `out`'s buffers hold the blocks `blocks`; the CPU has `isa`'s instructions.
#[inline(always)]
pub(super) unsafe fn round_blocks<T: Element, I: Instructions<T>, const SPLIT: bool>(
    isa: I,
    out: &Out<T>,
    blocks: Range<usize>,
) {
    let mut b = blocks.start;
    // SAFETY: every block `b` of `blocks` and entry `b` of each per-block buffer lie inside
    // the buffers, as the caller guarantees.
    unsafe {
        while b + 4 <= blocks.end {
            let (group, bits) = isa.load4(out.x.add(b * BLOCK));
            let largest = [
                ordinary(bits[0]),
                ordinary(bits[1]),
                ordinary(bits[2]),
                ordinary(bits[3]),
            ];
            if let [Some(l0), Some(l1), Some(l2), Some(l3)] = largest {
                // Written lane by lane, so that the compiler divides the four at once.
                let inverse = [127.0 / l0, 127.0 / l1, 127.0 / l2, 127.0 / l3];
                let units = [
                    unit::<SPLIT>(l0),
                    unit::<SPLIT>(l1),
                    unit::<SPLIT>(l2),
                    unit::<SPLIT>(l3),
                ];
                let sums = [
                    round_parts::<T, I, SPLIT>(isa, &group[0], inverse[0], out, b),
                    round_parts::<T, I, SPLIT>(isa, &group[1], inverse[1], out, b + 1),
                    round_parts::<T, I, SPLIT>(isa, &group[2], inverse[2], out, b + 2),
                    round_parts::<T, I, SPLIT>(isa, &group[3], inverse[3], out, b + 3),
                ];
                let totals = isa.totals4(sums);
                for i in 0..4 {
                    out.finish(b + i, units[i], totals[i]);
                }
            } else {
                for b in b..b + 4 {
                    round_block::<T, I, SPLIT>(isa, out, b);
                }
            }
            b += 4;
        }
        for b in b..blocks.end {
            round_block::<T, I, SPLIT>(isa, out, b);
        }
    }
}

/// An ordinary block's parts at the scale `inverse`, written where block `b`'s go; returns its
/// integer sum.
///
/// # Safety
/// As `round_blocks`, for block `b`.
#[inline(always)]
unsafe fn round_parts<T: Element, I: Instructions<T>, const SPLIT: bool>(
    isa: I,
    block: &I::Block,
    inverse: f32,
    out: &Out<T>,
    b: usize,
) -> I::Sum {
    // SAFETY: as the caller guarantees.
    unsafe {
        let (whole, rest) = out.parts(b);
        if SPLIT {
            isa.split(block, inverse, whole, rest)
        } else {
            isa.one_int8(block, inverse, whole)
        }
    }
}

/// Block `b` alone, whatever it holds (see the module).
///
/// # Safety
/// As `round_blocks`, for block `b`.
#[inline(always)]
unsafe fn round_block<T: Element, I: Instructions<T>, const SPLIT: bool>(
    isa: I,
    out: &Out<T>,
    b: usize,
) {
    // SAFETY: block `b` and entry `b` of each per-block buffer lie inside the buffers, as the
    // caller guarantees.
    unsafe {
        let x = out.x.add(b * BLOCK);
        let (whole, rest) = out.parts(b);
        let (block, bits) = isa.load(x);
        let (unit, total) = if let Some(largest) = ordinary(bits) {
            let sum = round_parts::<T, I, SPLIT>(isa, &block, 127.0 / largest, out, b);
            (unit::<SPLIT>(largest), isa.total(sum))
        } else if bits == 0 || bits > f32::MAX.to_bits() {
            std::ptr::write_bytes(whole, 0, BLOCK);
            if SPLIT {
                std::ptr::write_bytes(rest, 0, BLOCK);
            }
            (if bits == 0 { 0.0 } else { f32::NAN }, 0)
        } else {
            let largest = f32::from_bits(bits);
            (
                unit::<SPLIT>(largest),
                overflowing::<T, SPLIT>(x, 127.0 / largest, whole, rest),
            )
        };
        out.finish(b, unit, total);
    }
}

/// A block whose scale `inverse` overflowed, with the portable instructions (see the module).
///
/// # Safety
/// As `Instructions::split`, and `x` holds 32 elements.
#[cold]
unsafe fn overflowing<T: Element, const SPLIT: bool>(
    x: *const T,
    inverse: f32,
    whole: *mut i8,
    rest: *mut i8,
) -> i32 {
    // SAFETY: as the caller guarantees.
    unsafe {
        let (block, _) = Instructions::<T>::load(Portable, x);
        if SPLIT {
            Instructions::<T>::split(Portable, &block, inverse, whole, rest)
        } else {
            Instructions::<T>::one_int8(Portable, &block, inverse, whole)
        }
    }
}

/// Plain Rust, any CPU: the reference the other tiers equal bit for bit.
#[derive(Clone, Copy)]
pub(super) struct Portable;

/// `t` rounded to nearest (ties to even) and clamped to ±127; a NaN (a zero times an
/// overflowed scale) becomes 0.
fn nearest(t: f32) -> i8 {
    t.round_ties_even().clamp(-127.0, 127.0) as i8
}

impl<T: Element> Instructions<T> for Portable {
    type Block = [f32; BLOCK];
    type Sum = i32;

    #[inline(always)]
    unsafe fn load(self, x: *const T) -> ([f32; BLOCK], u32) {
        // SAFETY: 32 elements at `x`, as the caller guarantees.
        let block: [f32; BLOCK] = std::array::from_fn(|i| unsafe { *x.add(i) }.load());
        // Magnitudes' bits order as the magnitudes do, infinities and NaNs above every finite.
        let bits = block.iter().map(|v| v.to_bits() & 0x7fff_ffff).max();
        (block, bits.unwrap_or(0))
    }

    #[inline(always)]
    unsafe fn one_int8(self, block: &[f32; BLOCK], inverse: f32, whole: *mut i8) -> i32 {
        let mut total = 0;
        for (i, v) in block.iter().enumerate() {
            let a = nearest(v * inverse);
            // SAFETY: 32 bytes at `whole`, as the caller guarantees.
            unsafe { *whole.add(i) = a };
            total += i32::from(a);
        }
        total
    }

    #[inline(always)]
    unsafe fn split(
        self,
        block: &[f32; BLOCK],
        inverse: f32,
        whole: *mut i8,
        rest: *mut i8,
    ) -> i32 {
        let mut total = 0;
        for (i, v) in block.iter().enumerate() {
            // `t - a` is exact (|t| ≤ 127 and `a` its nearest integer), and so is its product
            // by 256: the low part rounds the remainder once.
            let t = v * inverse;
            let a = nearest(t);
            let b = nearest((t - f32::from(a)) * 256.0);
            // SAFETY: 32 bytes at `whole` and at `rest`, as the caller guarantees.
            unsafe { (*whole.add(i), *rest.add(i)) = (a, b) };
            total += 256 * i32::from(a) + i32::from(b);
        }
        total
    }

    #[inline(always)]
    unsafe fn total(self, sum: i32) -> i32 {
        sum
    }
}
