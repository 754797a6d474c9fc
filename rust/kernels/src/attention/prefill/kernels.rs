//! K and V packed into bf16 pairs for `vdpbf16ps`, and the two products of a tile of rows
//! against one packed key block, in portable code (the float32 equivalent of the instruction;
//! `avx512.rs` has the vector ones).
//!
//! Both are stored in slices of 32 lanes (two vectors): a block of keys is `[BLOCK_KEYS / 32]
//! [head_dim / 2][32]` pairs (32 keys' pairs, pair row after pair row), a block of values
//! `[head_dim / 32][BLOCK_KEYS / 2][32]` (32 columns, key pair after key pair), so that a tile's
//! pass over 32 keys or 32 columns reads one contiguous run instead of a strided one whose rows
//! crowd a few sets of the first-level cache.
//!
//! `vdpbf16ps` multiplies 16 lanes of two bf16 each, adjacent pairs summed into 16 float32: the
//! pairs must run along the reduction. In `q · kᵀ` that is the head dimension, which a query
//! row already stores as adjacent pairs (one broadcast 32-bit word), so the keys are packed:
//! lane `j` holds key `j`'s pair. In `p · v` it is the keys: a row of weights stores adjacent
//! key pairs, so V is packed: lane `c` holds column `c` of two adjacent keys. A pair is one
//! `u32`: the first element in the low 16 bits, as memory holds it.

use super::{BLOCK_KEYS, TILE_ROWS};
use crate::attention::exp_nonpositive;
use crate::element::Bf16;

/// The `u32` of a bf16 pair: `low` first in memory.
#[inline(always)]
fn pair(low: Bf16, high: Bf16) -> u32 {
    u32::from(low.0) | (u32::from(high.0) << 16)
}

/// Lanes of a slice of packed keys or values.
pub(crate) const SLICE: usize = 32;

/// Where pair `p` of key `j` of a block lies in its packed keys.
#[inline(always)]
pub(crate) fn key_index(p: usize, j: usize, d: usize) -> usize {
    (j / SLICE) * (d / 2) * SLICE + p * SLICE + j % SLICE
}

/// Where column `c` of key pair `jp` of a block lies in its packed values.
#[inline(always)]
pub(crate) fn value_index(jp: usize, c: usize) -> usize {
    (c / SLICE) * (BLOCK_KEYS / 2) * SLICE + jp * SLICE + c % SLICE
}

/// The two halves of a pair as float32.
#[inline(always)]
fn halves(pair: u32) -> (f32, f32) {
    (
        Bf16(pair as u16).to_f32(),
        Bf16((pair >> 16) as u16).to_f32(),
    )
}

/// One block of up to `BLOCK_KEYS` keys of every KV head, K and V packed; keys past the
/// block's count are zeros (their weights are always zero: no row sees them).
pub(crate) struct PackedBlock {
    /// `[kv_heads]` packed key blocks.
    keys: Vec<u32>,
    /// `[kv_heads]` packed value blocks.
    values: Vec<u32>,
}

impl PackedBlock {
    /// Packs `count` keys and values: key `j` of the block is row `row(j)` of `k` and `v`
    /// (`[rows, kv_heads, d]`; every row checked to lie inside them).
    pub(crate) fn new(
        kv_heads: usize,
        d: usize,
        count: usize,
        row: impl Fn(usize) -> usize,
        k: &[Bf16],
        v: &[Bf16],
    ) -> PackedBlock {
        let per_block = BLOCK_KEYS * d / 2;
        let mut keys = vec![0u32; kv_heads * per_block];
        let mut values = vec![0u32; kv_heads * per_block];
        let zeros = vec![Bf16::default(); d];
        for head in 0..kv_heads {
            let packed_keys = &mut keys[head * per_block..(head + 1) * per_block];
            let packed_values = &mut values[head * per_block..(head + 1) * per_block];
            let at = |j: usize| (row(j) * kv_heads + head) * d;
            for j in 0..count {
                let key = &k[at(j)..][..d];
                // Pair p of key j at key_index(p, j, d): one column of its slice.
                let column = &mut packed_keys[key_index(0, j, d)..];
                for (slot, two) in column.iter_mut().step_by(SLICE).zip(key.chunks_exact(2)) {
                    *slot = pair(two[0], two[1]);
                }
            }
            for jp in 0..count.div_ceil(2) {
                let low = &v[at(2 * jp)..][..d];
                // A missing second key of the last pair is zeros.
                let high = if 2 * jp + 1 < count {
                    &v[at(2 * jp + 1)..][..d]
                } else {
                    &zeros[..d]
                };
                // Columns c0..c0 + 32 of key pair jp: one contiguous run of a slice.
                for c0 in (0..d).step_by(SLICE) {
                    let run = &mut packed_values[value_index(jp, c0)..][..SLICE];
                    let (low, high) = (&low[c0..c0 + SLICE], &high[c0..c0 + SLICE]);
                    for ((slot, &l), &h) in run.iter_mut().zip(low).zip(high) {
                        *slot = pair(l, h);
                    }
                }
            }
        }
        PackedBlock { keys, values }
    }
}

/// A sequence's K and V as packed blocks, which sequences whose keys are the same rows (a
/// cached prefix they share) share.
pub(crate) struct Packed<'a> {
    pub(crate) blocks: Vec<&'a PackedBlock>,
    pub(crate) head_dim: usize,
}

impl Packed<'_> {
    /// Key block `block` of `kv_head`: `[BLOCK_KEYS / 32][head_dim / 2][32]` pairs.
    pub(crate) fn keys(&self, kv_head: usize, block: usize) -> &[u32] {
        let per_block = BLOCK_KEYS * self.head_dim / 2;
        &self.blocks[block].keys[kv_head * per_block..(kv_head + 1) * per_block]
    }

    /// Value block `block` of `kv_head`: `[head_dim / 32][BLOCK_KEYS / 2][32]` pairs.
    pub(crate) fn values(&self, kv_head: usize, block: usize) -> &[u32] {
        let per_block = BLOCK_KEYS * self.head_dim / 2;
        &self.blocks[block].values[kv_head * per_block..(kv_head + 1) * per_block]
    }
}

/// A tile of rows (at most `Micro::ROWS`) against one packed block: what the three steps of
/// [`Micro`] read. Each step's safety asks that it be sound: every query inside `q`, the keys
/// and values whole blocks, `width` a multiple of 32 up to `BLOCK_KEYS`, `visible[i] <= width`.
#[derive(Clone, Copy)]
pub(crate) struct Tile<'t> {
    /// The call's queries, and where each row's `d` elements start in them.
    pub(crate) q: &'t [Bf16],
    pub(crate) queries: &'t [usize],
    /// The block's packed keys and values, whole.
    pub(crate) keys: &'t [u32],
    pub(crate) values: &'t [u32],
    /// How many of the block's keys each row sees (at most `width`).
    pub(crate) visible: &'t [usize],
    /// The block's first keys the products cover, a multiple of 32 up to `BLOCK_KEYS`: the
    /// tile's rows see none past them, so the products stop there.
    pub(crate) width: usize,
    /// The head size.
    pub(crate) d: usize,
    /// The scores' scale.
    pub(crate) scale: f32,
}

/// The online softmax of a tile's rows, carried from block to block.
pub(crate) struct Rows<'r> {
    /// Each row's largest scaled score so far (`-inf` before the first block).
    pub(crate) max: &'r mut [f32],
    /// Each row's sum of terms so far, `LANES` partial sums a row.
    pub(crate) sums: &'r mut [f32],
    /// Each row's weighted sum of values so far, rows of `d`.
    pub(crate) acc: &'r mut [f32],
}

/// The two products and the online softmax of a tile of rows against one packed block. A value
/// of the implementation is its proof that the CPU runs its instructions (the vector one is the
/// AVX-512 BF16 token). The slices a step writes or carries hold the tile's rows: `scores` and
/// `weights` rows of `BLOCK_KEYS`, `acc` rows of `d`.
pub(crate) trait Micro: Copy {
    /// Rows per tile, at most `MAX_TILE_ROWS`.
    const ROWS: usize;

    /// `scores[i][j] = q_i · key j` for each row `i` of the tile (`q_i` its query) and
    /// `j < width`: unscaled, the softmax scales them on the way (one fused step there instead
    /// of a product here).
    ///
    /// # Safety
    /// The tile is sound (see [`Tile`]) and `scores` holds its rows.
    unsafe fn scores(self, tile: Tile<'_>, scores: &mut [f32]);

    /// One block's step of the online softmax for the tile's rows, row `i` seeing the first
    /// `visible[i]` of its `scores` (each times `scale` the float32 score): raises the row's
    /// maximum to their maximum, writes their terms `e^(score - max)` rounded to bf16 to
    /// `weights` (zeros up to `width` past the visible ones), and rescales by
    /// `e^(old max - max)` the row's sum before adding the terms to it, and the row's weighted
    /// sum.
    ///
    /// # Safety
    /// The tile is sound, the slices hold its rows, and a row seeing nothing has a finite
    /// maximum.
    unsafe fn softmax(self, tile: Tile<'_>, scores: &[f32], weights: &mut [Bf16], rows: Rows<'_>);

    /// `acc[i][c] += Σ_{j < width} weights[i][j] · value j column c` for the tile's rows.
    ///
    /// # Safety
    /// The tile is sound, and `weights` and `acc` hold its rows.
    unsafe fn weighted_sum(self, tile: Tile<'_>, weights: &[Bf16], acc: &mut [f32]);
}

/// Portable code, each pair's two products summed before they join the float32 sum.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

impl Micro for Portable {
    const ROWS: usize = TILE_ROWS;

    unsafe fn scores(self, tile: Tile<'_>, scores: &mut [f32]) {
        let Tile {
            q, keys, width, d, ..
        } = tile;
        for (&offset, row) in tile.queries.iter().zip(scores.chunks_exact_mut(BLOCK_KEYS)) {
            let query = &q[offset..offset + d];
            for (j, score) in row[..width].iter_mut().enumerate() {
                let mut sum = 0f32;
                for (p, two) in query.chunks_exact(2).enumerate() {
                    let (kl, kh) = halves(keys[key_index(p, j, d)]);
                    sum += two[0].to_f32() * kl + two[1].to_f32() * kh;
                }
                *score = sum;
            }
        }
    }

    unsafe fn softmax(self, tile: Tile<'_>, scores: &[f32], weights: &mut [Bf16], rows: Rows<'_>) {
        let Tile {
            width, d, scale, ..
        } = tile;
        let Rows { max, sums, acc } = rows;
        for (r, &seen) in tile.visible.iter().enumerate() {
            let row: Vec<f32> = scores[r * BLOCK_KEYS..][..seen]
                .iter()
                .map(|&s| s * scale)
                .collect();
            let mut lanes = [f32::NEG_INFINITY; LANES];
            for chunk in row.chunks(LANES) {
                for (lane, &s) in lanes.iter_mut().zip(chunk) {
                    *lane = greater(*lane, s);
                }
            }
            let old_max = max[r];
            let new_max = greater(old_max, reduce(lanes, greater));
            max[r] = new_max;
            let mut block = [0f32; LANES];
            let out = &mut weights[r * BLOCK_KEYS..][..width];
            for (j, weight) in out.iter_mut().enumerate() {
                let e = if j < seen {
                    exp_nonpositive(row[j] - new_max)
                } else {
                    0.0
                };
                block[j % LANES] += e;
                *weight = Bf16::from_f32(e);
            }
            // e^(-inf) is 0: the first block leaves nothing to rescale.
            let correction = exp_nonpositive(old_max - new_max);
            for (sum, b) in sums[r * LANES..][..LANES].iter_mut().zip(block) {
                *sum = *sum * correction + b;
            }
            if correction != 1.0 {
                acc[r * d..][..d].iter_mut().for_each(|a| *a *= correction);
            }
        }
    }

    unsafe fn weighted_sum(self, tile: Tile<'_>, weights: &[Bf16], acc: &mut [f32]) {
        let Tile {
            values, width, d, ..
        } = tile;
        for (row, out) in weights
            .chunks_exact(BLOCK_KEYS)
            .zip(acc.chunks_exact_mut(d))
        {
            for (jp, two) in row[..width].chunks_exact(2).enumerate() {
                let (wl, wh) = (two[0].to_f32(), two[1].to_f32());
                for (c, o) in out.iter_mut().enumerate() {
                    let (vl, vh) = halves(values[value_index(jp, c)]);
                    *o += wl * vl + wh * vh;
                }
            }
        }
    }
}

/// Lanes of the partial maxima and sums (one AVX-512 register: the compiler vectorizes the
/// fixed-size loops, which a running float reduction would keep scalar). A row's sum of weights
/// stays `LANES` partial sums until its output is written.
pub(crate) const LANES: usize = 16;

/// The larger of `a` and `b` (`b` if either is NaN: a comparison, which vectorizes to one
/// instruction, unlike `f32::max`'s NaN rules).
#[inline(always)]
fn greater(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `lanes` folded by `op` pairwise, halves at a time (four vector steps, not fifteen
/// dependent scalar ones).
#[inline(always)]
pub(crate) fn reduce(mut lanes: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut half = LANES / 2;
    while half > 0 {
        for i in 0..half {
            lanes[i] = op(lanes[i], lanes[i + half]);
        }
        half /= 2;
    }
    lanes[0]
}
