//! Q6_K's blocks of one-int8 rows in the K-quants' SIMD driver (`k_simd.rs`): both halves of a
//! block of 32 meet their scales in integers, so that the block takes the float work of one
//! (see `k_kernel.rs` for the arithmetic).

use super::k_simd::{KFormat, Lanes};
use super::{Job, BLOCK, TILE};

/// Where `halves_in_integers` reads: block `b` (sub-block `j` of the tile super-blocks at
/// `base`) for rows `row..`, and `rows`' offsets of this part's columns.
pub(super) struct Block<'a, const N: usize> {
    pub(super) base: &'a [*const u8; N],
    pub(super) row: usize,
    pub(super) j: usize,
    pub(super) b: usize,
    pub(super) offset: usize,
    pub(super) scales: usize,
    pub(super) d_at: usize,
}

/// Q6_K's block `at.b` of one-int8 rows `at.row..at.row + R` into `acc`: each half's sum less
/// 32 times its activations' sum, times its scale, the two added in int32, then one conversion
/// and one product with `d·u` (`k_kernel.rs`): the float work of one block of 32, where a half
/// at a time took it twice.
///
/// # Safety
/// As `rows`, whose offsets `at` holds; `F` is Q6_K's.
#[inline(always)]
pub(super) unsafe fn halves_in_integers<L: Lanes, F: KFormat, T, const R: usize, const N: usize>(
    isa: L,
    job: &Job<T>,
    at: &Block<'_, N>,
    acc: &mut [[L::Float; N]; R],
) {
    let k = job.in_features;
    let blocks = k / BLOCK;
    // SAFETY: as `rows`: every offset stays inside the tile super-blocks, the rows'
    // activations and their per-block values.
    unsafe {
        let mut sums = [[[isa.zero(); N]; R]; 2];
        for (p, sums) in sums.iter_mut().enumerate() {
            for h in 0..4 {
                let mut w = [isa.zero_bytes(); N];
                for (w, base) in w.iter_mut().zip(at.base) {
                    *w = F::groups(isa, *base, at.j, h, p, at.offset)[0];
                }
                for (r, sums) in sums.iter_mut().enumerate() {
                    let a = job
                        .whole
                        .add((at.row + r) * k + at.b * BLOCK + 4 * h + 16 * p);
                    for t in 0..N {
                        sums[t] = isa.dot(sums[t], w[t], a);
                    }
                }
            }
        }
        let mut d = [isa.zero_float(); N];
        for (d, base) in d.iter_mut().zip(at.base) {
            *d = isa.halves(base.add(at.d_at));
        }
        for r in 0..R {
            let block = (at.row + r) * blocks + at.b;
            let unit = isa.splat(*job.units.add(block));
            let first = *job.first_halves.add(block);
            let zeros = [F::ZERO * first, F::ZERO * (*job.totals.add(block) - first)];
            for t in 0..N {
                let mut sum = isa.zero();
                for p in 0..2 {
                    let half = isa.combine(isa.zero(), sums[p][r][t], zeros[p]);
                    let scale = at.base[t].add(at.scales + TILE * (2 * at.j + p));
                    sum = isa.add(sum, isa.times_signed(half, scale));
                }
                acc[r][t] = isa.scale_add(sum, isa.mul(d[t], unit), acc[r][t]);
            }
        }
    }
}
