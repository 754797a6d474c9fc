//! Decode attention of one sequence on AVX-512 BF16 over bf16 caches, for head sizes of 32 to
//! 128 in steps of 32: the query heads that share a K/V head attend to it together.
//!
//! Why: the portable body reduces each (query head, key) product to a float on its own (a
//! horizontal sum of one vector per product, as many instructions again as the products) and
//! adds each weighted V row into float32 sums kept in memory, so it runs at a fraction of the
//! cache's bandwidth. Here:
//! - scores come 16 keys at a time: a key's products sum into one vector, and the 16 vectors
//!   of a block reduce together into one vector of 16 scores (45 instructions for 16 sums, the
//!   same tree for every key, so a score does not depend on the key's place in its block);
//! - the weighted sums of V stay in registers over a block of 32 keys: a K/V head's query
//!   heads (up to four, fewer for larger heads: at most 16 accumulators) share each V row
//!   loaded, which widens to float32 with a shift and a mask, its even elements in one vector
//!   and its odd ones in another. Every K/V head takes the block in turn, so a row comes from
//!   memory once;
//! - in both passes the rows `AHEAD` keys on are requested into the second-level cache while
//!   this block is read, the K pass's requests running on into the first V rows, so that
//!   neither pass starts on rows still in memory.
//!
//! The softmax between the two passes is the portable body's (`Task::weigh`), so the
//! arithmetic differs from the other tiers only in the order of the sums.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{prefetch, Level, Scratch, Task};
use crate::element::Bf16;

/// Keys per block of scores (one vector of 16 float32).
const KEYS: usize = 16;
/// Elements of a head per vector of bf16 pairs.
const CHUNK: usize = 32;
/// Most float32 accumulators the weighted sum keeps in registers (of 32).
const ACCUMULATORS: usize = 16;
/// Keys per block of the weighted sum: every run of heads takes the block's V rows in turn,
/// from the first-level cache after the first run.
const VALUE_KEYS: usize = 32;
/// How many keys ahead of the block being read its pass requests rows, into the second-level
/// cache: a decode step streams most rows from memory (every layer's caches together far
/// exceed the caches), and a row from memory takes about as long to arrive as a few blocks
/// take to read. Measured on Zen 4 (16 sequences of 300 and of 1,060 keys, 30 layers' caches
/// in turn, 2 threads): 7 to 27% faster than requesting the next block into the first level;
/// 64 keys ahead into the first level was slower than that, 128 into the second in between.
/// Running the K pass's requests on into the V rows saved another 5 to 20% (most for short
/// sequences, whose first rows are a larger share of their keys).
const AHEAD: usize = 64;

/// Whether this kernel takes heads of `head_dim` elements.
pub(super) fn takes(head_dim: usize) -> bool {
    head_dim.is_multiple_of(CHUNK) && (1..=4).contains(&(head_dim / CHUNK))
}

/// Attends query heads `heads` of sequence `seq`.
///
/// # Safety
/// The CPU has AVX-512 F, BW and BF16; the call was checked; `takes(head_dim)`; `heads` lies
/// within the query heads and no other thread runs them for `seq`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn run(
    task: &Task<'_, Bf16>,
    seq: usize,
    heads: Range<usize>,
    scratch: &mut Scratch,
) {
    // SAFETY: forwarded; the head size is CHUNKS vectors of pairs in each arm.
    unsafe {
        match task.shape.head_dim / CHUNK {
            1 => run_chunks::<1>(task, seq, heads, scratch),
            2 => run_chunks::<2>(task, seq, heads, scratch),
            3 => run_chunks::<3>(task, seq, heads, scratch),
            _ => run_chunks::<4>(task, seq, heads, scratch),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn run_chunks<const CHUNKS: usize>(
    task: &Task<'_, Bf16>,
    seq: usize,
    heads: Range<usize>,
    scratch: &mut Scratch,
) {
    let shape = &task.shape;
    let len = task.seq_lens[seq] as usize;
    let row_slots = &task.slots[seq * shape.width..seq * shape.width + len];
    let scores = &mut scratch.scores;
    scores.clear();
    scores.resize(heads.len() * len, 0.0);
    // SAFETY: forwarded from `run`; `scores` holds a row of `len` per head.
    unsafe { score::<CHUNKS>(task, seq, heads.clone(), row_slots, scores) };
    task.weigh(len, scratch);
    let d = shape.head_dim;
    let group = shape.heads / shape.kv_heads;
    let sums = &mut scratch.sums;
    sums.clear();
    sums.resize(heads.len() * d, 0.0);
    // The task's heads in runs that share a K/V head, each at most `most` long.
    let most = (ACCUMULATORS / (2 * CHUNKS)).min(4);
    for start in (0..len).step_by(VALUE_KEYS) {
        let block = &row_slots[start..(start + VALUE_KEYS).min(len)];
        for &ahead in row_slots.iter().skip(start + AHEAD).take(VALUE_KEYS) {
            prefetch(task.cache_row(task.v_cache, ahead), Level::Second);
        }
        let mut head = heads.start;
        while head < heads.end {
            let kv = head / group;
            let count = ((kv + 1) * group).min(heads.end).min(head + most) - head;
            let first = head - heads.start;
            let weights = &scratch.scores[first * len..(first + count) * len];
            let block_weights = Weights {
                all: weights,
                len,
                start,
            };
            let out = &mut sums[first * d..(first + count) * d];
            // SAFETY: forwarded; `count` is at most `most`, so its arm's accumulators fit.
            unsafe {
                match count {
                    1 => weigh_values::<CHUNKS, 1>(task, kv, block, block_weights, out),
                    2 => weigh_values::<CHUNKS, 2>(task, kv, block, block_weights, out),
                    3 => weigh_values::<CHUNKS, 3>(task, kv, block, block_weights, out),
                    _ => weigh_values::<CHUNKS, 4>(task, kv, block, block_weights, out),
                }
            }
            head += count;
        }
    }
    // Each chunk of 32 sums is its 16 even elements, then its 16 odd ones: interleave them.
    for chunk in sums.chunks_exact_mut(CHUNK) {
        let mut split = [0f32; CHUNK];
        split.copy_from_slice(chunk);
        let (evens, odds) = split.split_at(CHUNK / 2);
        for ((pair, &even), &odd) in chunk.chunks_exact_mut(2).zip(evens).zip(odds) {
            pair.copy_from_slice(&[even, odd]);
        }
    }
    // SAFETY: forwarded: this task owns these heads' outputs of `seq`.
    unsafe { task.finish(seq, heads, scratch) };
}

/// Fills `scores` (`[heads, len]`) with `q · k · scale` of query heads `heads` of `seq` and
/// its keys, a block of 16 keys at a time, all of the task's heads per block.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn score<const CHUNKS: usize>(
    task: &Task<'_, Bf16>,
    seq: usize,
    heads: Range<usize>,
    row_slots: &[i32],
    scores: &mut [f32],
) {
    let shape = &task.shape;
    let (d, len) = (shape.head_dim, row_slots.len());
    let group = shape.heads / shape.kv_heads;
    let row = shape.kv_heads * d;
    let scale = _mm512_set1_ps(task.scale);
    for start in (0..len).step_by(KEYS) {
        let take = (len - start).min(KEYS);
        // One stream: the sequence's K rows, then its first `AHEAD` V rows (the V pass
        // requests the rest), `AHEAD` keys on; the first block requests the whole window.
        let window = if start == 0 {
            KEYS..AHEAD + KEYS
        } else {
            start + AHEAD..start + AHEAD + KEYS
        };
        for index in window {
            let (cache, key) = if index < len {
                (task.k_cache, index)
            } else {
                (task.v_cache, index - len)
            };
            match row_slots.get(key) {
                Some(&slot) if index < len || key < AHEAD => {
                    prefetch(task.cache_row(cache, slot), Level::Second)
                }
                _ => {}
            }
        }
        // A short last block repeats its last key; only `take` scores are stored.
        let rows: [*const Bf16; KEYS] = std::array::from_fn(|j| {
            let slot = row_slots[start + j.min(take - 1)] as usize;
            // In bounds: `check` kept every slot below the pool size.
            task.k_cache[slot * row..].as_ptr()
        });
        for (i, head) in heads.clone().enumerate() {
            let offset = head / group * d;
            // SAFETY: the query head's `d` elements lie in `q` (checked sizes); each row
            // pointer plus `offset` starts a K head of `d` elements inside the cache.
            let sums = unsafe {
                let query: [__m512bh; CHUNKS] = std::array::from_fn(|c| {
                    load_pairs(
                        task.q
                            .as_ptr()
                            .add((seq * shape.heads + head) * d + c * CHUNK),
                    )
                });
                let products: [__m512; KEYS] = std::array::from_fn(|j| {
                    let mut acc = _mm512_setzero_ps();
                    for (c, &q) in query.iter().enumerate() {
                        acc = _mm512_dpbf16_ps(acc, q, load_pairs(rows[j].add(offset + c * CHUNK)));
                    }
                    acc
                });
                _mm512_mul_ps(sum_each(products), scale)
            };
            let mask: __mmask16 = if take == KEYS { !0 } else { (1 << take) - 1 };
            // SAFETY: `take` scores from `start` lie in head `i`'s row of `len`.
            unsafe { _mm512_mask_storeu_ps(scores[i * len + start..].as_mut_ptr(), mask, sums) };
        }
    }
}

/// The weights of a run of query heads (`[heads, len]`) and where a block of keys starts.
#[derive(Clone, Copy)]
struct Weights<'a> {
    all: &'a [f32],
    len: usize,
    start: usize,
}

/// Adds `weight · v` for each key of `block` into `out` (`[HEADS, d]`, each chunk of 32 as 16
/// sums of even elements then 16 of odd ones) for `HEADS` query heads of K/V head `kv`, in
/// registers for the block.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn weigh_values<const CHUNKS: usize, const HEADS: usize>(
    task: &Task<'_, Bf16>,
    kv: usize,
    block: &[i32],
    weights: Weights<'_>,
    out: &mut [f32],
) {
    let d = task.shape.head_dim;
    let row = task.shape.kv_heads * d;
    // [head][chunk][even elements, odd elements]
    let mut acc = [[[_mm512_setzero_ps(); 2]; CHUNKS]; HEADS];
    for (sums, head_out) in acc.iter_mut().zip(out.chunks_exact(d)) {
        for (c, pair) in sums.iter_mut().enumerate() {
            // SAFETY: 32 float32 of this head's `d` from `c * 32`.
            *pair = unsafe { load_sums(&head_out[c * CHUNK..]) };
        }
    }
    let high_halves = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    for (t, &slot) in block.iter().enumerate() {
        // In bounds: `check` kept every slot below the pool size.
        let values = task.v_cache[slot as usize * row + kv * d..][..d].as_ptr();
        for c in 0..CHUNKS {
            // SAFETY: 32 bf16 of this K/V head's `d` from `c * 32`.
            let pairs = unsafe { _mm512_loadu_si512(values.add(c * CHUNK).cast()) };
            // A bf16 is the upper half of its float32: the even elements shift up, the odd
            // ones lose their lower neighbours.
            let even = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(pairs));
            let odd = _mm512_castsi512_ps(_mm512_and_si512(pairs, high_halves));
            for (h, sums) in acc.iter_mut().enumerate() {
                let weight = _mm512_set1_ps(weights.all[h * weights.len + weights.start + t]);
                sums[c][0] = _mm512_fmadd_ps(weight, even, sums[c][0]);
                sums[c][1] = _mm512_fmadd_ps(weight, odd, sums[c][1]);
            }
        }
    }
    for (sums, head_out) in acc.iter().zip(out.chunks_exact_mut(d)) {
        for (c, [even, odd]) in sums.iter().enumerate() {
            let at = head_out[c * CHUNK..(c + 1) * CHUNK].as_mut_ptr();
            // SAFETY: 32 float32 of this head's `d` from `c * 32`.
            unsafe {
                _mm512_storeu_ps(at, *even);
                _mm512_storeu_ps(at.add(CHUNK / 2), *odd);
            }
        }
    }
}

/// The 16 sums of even elements and the 16 of odd ones at the start of `sums`.
///
/// # Safety
/// `sums` holds at least 32 float32.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_sums(sums: &[f32]) -> [__m512; 2] {
    // SAFETY: the caller's promise.
    unsafe {
        [
            _mm512_loadu_ps(sums.as_ptr()),
            _mm512_loadu_ps(sums.as_ptr().add(CHUNK / 2)),
        ]
    }
}

/// 32 bf16 from `at`.
///
/// # Safety
/// `at` starts 32 readable bf16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn load_pairs(at: *const Bf16) -> __m512bh {
    // SAFETY: the caller's promise; __m512bh is 32 bf16 lanes, the bits loaded.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(at.cast())) }
}

/// Lane `j` of the result is the sum of the lanes of `v[j]`, by the same tree for every `j`:
/// lanes `i` and `i + 2` of each 128-bit quarter, then the two pairs of the quarter, then
/// quarters 0 + 1 and 2 + 3, then the two halves.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
fn sum_each(v: [__m512; KEYS]) -> __m512 {
    let pairs: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    });
    let quarters: [__m512; 4] = std::array::from_fn(|i| {
        let (a, b) = (
            _mm512_castps_pd(pairs[2 * i]),
            _mm512_castps_pd(pairs[2 * i + 1]),
        );
        let (low, high) = (_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
        _mm512_add_ps(_mm512_castpd_ps(low), _mm512_castpd_ps(high))
    });
    let halves = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    halves(
        halves(quarters[0], quarters[1]),
        halves(quarters[2], quarters[3]),
    )
}
