//! The code each instruction-set tier runs for one sequence of decode attention: the portable
//! body compiled for the tier's registers, and on AVX-512 BF16 with bf16 caches, `grouped.rs`
//! for head sizes it takes, else the portable body with the products of query and key heads in
//! `vdpbf16ps` (32 bf16 pairs multiplied into 16 float32 sums per
//! instruction, the products exact, no widening of either operand). The weighted sum of V widens
//! each row to float32 on every tier: it scales a row by a float32 weight, which a bf16 product
//! would round.

use std::any::TypeId;
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::grouped;
use super::{dot, Scratch, Task};
use crate::element::{Bf16, Element};
#[cfg(target_arch = "x86_64")]
use crate::isa::Avx512Bf16;
use crate::isa::{portable_tiers, Isa};

/// Runs query heads `heads` of sequence `seq` of `task` on tier `isa`, or the detected one if
/// lower.
///
/// # Safety
/// The call was checked, `heads` lies within the query heads, and no other thread runs them
/// for `seq`.
pub(super) unsafe fn run<T: Element>(
    task: &Task<'_, T>,
    isa: Isa,
    seq: usize,
    heads: Range<usize>,
    scratch: &mut Scratch,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(cpu) =
            Avx512Bf16::at_most(isa).filter(|_| TypeId::of::<T>() == TypeId::of::<Bf16>())
        {
            // SAFETY: T is Bf16 (same type, so the same layout); the token proves the CPU has
            // the kernels' features; the rest is the caller's promise.
            return unsafe {
                let task = &*(task as *const Task<'_, T>).cast::<Task<'_, Bf16>>();
                if grouped::takes(task.shape.head_dim) {
                    grouped::run(cpu, task, seq, heads, scratch)
                } else {
                    run_avx512_bf16(cpu, task, seq, heads, scratch)
                }
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = TypeId::of::<Bf16>();
    // SAFETY: forwarded from the caller.
    unsafe { run_portable(isa, task, seq, heads, scratch) }
}

portable_tiers!(unsafe fn run_portable(
    task: &Task<'_, T>, seq: usize, heads: Range<usize>, scratch: &mut Scratch
) = portable);

/// The body every tier but AVX-512 BF16 runs: the float32 products of `dot`.
///
/// # Safety
/// As [`run`].
#[inline(always)]
unsafe fn portable<T: Element>(
    task: &Task<'_, T>,
    seq: usize,
    heads: Range<usize>,
    scratch: &mut Scratch,
) {
    // SAFETY: forwarded from the caller.
    unsafe { task.run_with(seq, heads, scratch, dot::<T>) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512bf16")]
unsafe fn run_avx512_bf16(
    cpu: Avx512Bf16,
    task: &Task<'_, Bf16>,
    seq: usize,
    heads: Range<usize>,
    scratch: &mut Scratch,
) {
    // SAFETY: forwarded from `run`; this copy is compiled for AVX-512 BF16.
    unsafe { task.run_with(seq, heads, scratch, |a, b| dot_bf16(cpu, a, b)) }
}

/// `a · b` for bf16 rows of equal length, 32 pairs per `vdpbf16ps`; the tail is loaded masked
/// (zeros past the end contribute nothing).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub(super) fn dot_bf16(_: Avx512Bf16, a: &[Bf16], b: &[Bf16]) -> f32 {
    use std::arch::x86_64::*;
    const STEP: usize = 32;
    let len = a.len().min(b.len());
    let mut sums = _mm512_setzero_ps();
    let mut start = 0;
    while start < len {
        let take = (len - start).min(STEP);
        let mask: __mmask32 = if take == STEP { !0 } else { (1 << take) - 1 };
        // SAFETY: the mask covers `take` elements from `start`, inside both slices (masked-off
        // lanes are neither read nor faulted on); `Bf16` is 16 bits, as the loads read.
        let (x, y) = unsafe {
            (
                _mm512_maskz_loadu_epi16(mask, a.as_ptr().add(start).cast()),
                _mm512_maskz_loadu_epi16(mask, b.as_ptr().add(start).cast()),
            )
        };
        // SAFETY: both are 512-bit vectors; __m512bh is 32 bf16 lanes, the bits loaded above.
        let (x, y) = unsafe {
            (
                std::mem::transmute::<__m512i, __m512bh>(x),
                std::mem::transmute::<__m512i, __m512bh>(y),
            )
        };
        sums = _mm512_dpbf16_ps(sums, x, y);
        start += take;
    }
    _mm512_reduce_add_ps(sums)
}
