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
//!   heads (up to four, fewer for larger heads: at most 16 accumulators) share each pair of V
//!   rows loaded, which interleave into bf16 pairs (one unpack per half), and one `vdpbf16ps`
//!   per head adds both keys' products with the head's two weights (bf16 values already:
//!   `Task::weigh` rounds them). Widening each row to float32 and two fused multiply-adds per
//!   key and head took 5-15% longer per decode step (16 sequences of 300 and of 1,060 keys,
//!   30 layers' caches, 2 threads, Zen 4, alternated in one process). Every K/V head takes the
//!   block in turn, so a row comes from memory once;
//! - in both passes the rows `AHEAD` keys on are requested into the second-level cache while
//!   this block is read, the K pass's requests running on into the first V rows, so that
//!   neither pass starts on rows still in memory.
//!
//! The softmax between the two passes is the portable body's (`Task::weigh`), so the
//! arithmetic differs from the other tiers only in the order of the sums (and in
//! `vdpbf16ps`'s handling of subnormals, as in the score pass).

use std::arch::x86_64::*;
use std::ops::Range;

use super::{prefetch, Level, Scratch, Task};
use crate::element::Bf16;
use crate::isa::Avx512Bf16;

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
/// The call was checked; `takes(head_dim)`; `heads` lies
/// within the query heads and no other thread runs them for `seq`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn run(
    cpu: Avx512Bf16,
    task: &Task<'_, Bf16>,
    seq: usize,
    heads: Range<usize>,
    scratch: &mut Scratch,
) {
    // SAFETY: forwarded; the head size is CHUNKS vectors of pairs in each arm.
    unsafe {
        match task.shape.head_dim / CHUNK {
            1 => run_chunks::<1>(cpu, task, seq, heads, scratch),
            2 => run_chunks::<2>(cpu, task, seq, heads, scratch),
            3 => run_chunks::<3>(cpu, task, seq, heads, scratch),
            _ => run_chunks::<4>(cpu, task, seq, heads, scratch),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn run_chunks<const CHUNKS: usize>(
    cpu: Avx512Bf16,
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
    unsafe { score::<CHUNKS>(cpu, task, seq, heads.clone(), row_slots, scores) };
    task.weigh(len, scratch);
    // The weights are bf16 values (`Task::weigh` rounds them): their upper 16 bits are exact.
    let stride = len.next_multiple_of(2);
    let pairs = &mut scratch.pairs;
    pairs.clear();
    pairs.resize(heads.len() * stride, 0);
    for (row, weights) in pairs
        .chunks_exact_mut(stride)
        .zip(scratch.scores.chunks_exact(len))
    {
        for (bits, &w) in row.iter_mut().zip(weights) {
            *bits = (w.to_bits() >> 16) as u16;
        }
    }
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
            let block_weights = Weights {
                all: &scratch.pairs[first * stride..(first + count) * stride],
                stride,
                start,
            };
            let out = &mut sums[first * d..(first + count) * d];
            // SAFETY: forwarded; `count` is at most `most`, so its arm's accumulators fit.
            unsafe {
                match count {
                    1 => weigh_values::<CHUNKS, 1>(cpu, task, kv, block, block_weights, out),
                    2 => weigh_values::<CHUNKS, 2>(cpu, task, kv, block, block_weights, out),
                    3 => weigh_values::<CHUNKS, 3>(cpu, task, kv, block, block_weights, out),
                    _ => weigh_values::<CHUNKS, 4>(cpu, task, kv, block, block_weights, out),
                }
            }
            head += count;
        }
    }
    // Each chunk of 32 sums is in `weigh_values`'s order (the low then the high four elements
    // of each eight): put them back in order.
    for chunk in sums.chunks_exact_mut(CHUNK) {
        let mut split = [0f32; CHUNK];
        split.copy_from_slice(chunk);
        for (lane, &sum) in split.iter().enumerate() {
            let (half, within) = (lane / 16, lane % 16);
            chunk[8 * (within / 4) + 4 * half + within % 4] = sum;
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
    cpu: Avx512Bf16,
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
                        cpu,
                        task.q
                            .as_ptr()
                            .add((seq * shape.heads + head) * d + c * CHUNK),
                    )
                });
                let products: [__m512; KEYS] = std::array::from_fn(|j| {
                    let mut acc = _mm512_setzero_ps();
                    for (c, &q) in query.iter().enumerate() {
                        acc = _mm512_dpbf16_ps(
                            acc,
                            q,
                            load_pairs(cpu, rows[j].add(offset + c * CHUNK)),
                        );
                    }
                    acc
                });
                _mm512_mul_ps(sum_each(cpu, products), scale)
            };
            let mask: __mmask16 = if take == KEYS { !0 } else { (1 << take) - 1 };
            // SAFETY: `take` scores from `start` lie in head `i`'s row of `len`.
            unsafe { _mm512_mask_storeu_ps(scores[i * len + start..].as_mut_ptr(), mask, sums) };
        }
    }
}

/// The weights of a run of query heads as bf16 bits (`[heads, stride]`, each row padded with
/// a zero weight to an even length) and where a block of keys starts (an even key).
#[derive(Clone, Copy)]
struct Weights<'a> {
    all: &'a [u16],
    stride: usize,
    start: usize,
}

/// Adds `weight · v` for each key of `block` into `out` (`[HEADS, d]`, each chunk of 32 as 16
/// sums of elements 0-3, 8-11, 16-19, 24-27, then 16 of elements 4-7, 12-15, 20-23, 28-31)
/// for `HEADS` query heads of K/V head `kv`, in registers for the block. Keys go in pairs: the
/// two V rows interleave into bf16 pairs (an unpack per half), each head's two weights are one
/// broadcast 32 bits, and one `vdpbf16ps` adds both products (a key past the block pairs with
/// the block's last row and the zero weight padding its head's row).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn weigh_values<const CHUNKS: usize, const HEADS: usize>(
    cpu: Avx512Bf16,
    task: &Task<'_, Bf16>,
    kv: usize,
    block: &[i32],
    weights: Weights<'_>,
    out: &mut [f32],
) {
    let d = task.shape.head_dim;
    let row = task.shape.kv_heads * d;
    // [head][chunk][low halves, high halves]
    let mut acc = [[[_mm512_setzero_ps(); 2]; CHUNKS]; HEADS];
    for (sums, head_out) in acc.iter_mut().zip(out.chunks_exact(d)) {
        for (c, pair) in sums.iter_mut().enumerate() {
            // SAFETY: 32 float32 of this head's `d` from `c * 32`.
            *pair = unsafe { load_sums(cpu, &head_out[c * CHUNK..]) };
        }
    }
    let values = |t: usize| {
        // In bounds: `check` kept every slot below the pool size.
        task.v_cache[block[t] as usize * row + kv * d..][..d].as_ptr()
    };
    for t in (0..block.len()).step_by(2) {
        let (first, second) = (values(t), values((t + 1).min(block.len() - 1)));
        let pair: [__m512i; HEADS] = std::array::from_fn(|h| {
            let at = h * weights.stride + weights.start + t;
            // SAFETY: `at + 1` lies in head `h`'s row (its length is even, `at` is even).
            let bits = unsafe { weights.all.as_ptr().add(at).cast::<i32>().read_unaligned() };
            _mm512_set1_epi32(bits)
        });
        for c in 0..CHUNKS {
            // SAFETY: 32 bf16 of this K/V head's `d` from `c * 32` in each row.
            let (a, b) = unsafe {
                (
                    _mm512_loadu_si512(first.add(c * CHUNK).cast()),
                    _mm512_loadu_si512(second.add(c * CHUNK).cast()),
                )
            };
            let halves = [_mm512_unpacklo_epi16(a, b), _mm512_unpackhi_epi16(a, b)];
            for (sums, weight) in acc.iter_mut().zip(&pair) {
                for (sum, half) in sums[c].iter_mut().zip(halves) {
                    *sum = _mm512_dpbf16_ps(*sum, bf16_lanes(*weight), bf16_lanes(half));
                }
            }
        }
    }
    for (sums, head_out) in acc.iter().zip(out.chunks_exact_mut(d)) {
        for (c, [low, high]) in sums.iter().enumerate() {
            let at = head_out[c * CHUNK..(c + 1) * CHUNK].as_mut_ptr();
            // SAFETY: 32 float32 of this head's `d` from `c * 32`.
            unsafe {
                _mm512_storeu_ps(at, *low);
                _mm512_storeu_ps(at.add(CHUNK / 2), *high);
            }
        }
    }
}

/// The 32 bf16 lanes of a vector of 16 pairs.
#[inline(always)]
fn bf16_lanes(pairs: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data; the pairs' bits are the bf16 lanes.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(pairs) }
}

/// The two vectors of 16 sums at the start of `sums`.
///
/// # Safety
/// `sums` holds at least 32 float32.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_sums(_: Avx512Bf16, sums: &[f32]) -> [__m512; 2] {
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
unsafe fn load_pairs(_: Avx512Bf16, at: *const Bf16) -> __m512bh {
    // SAFETY: the caller's promise; __m512bh is 32 bf16 lanes, the bits loaded.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(at.cast())) }
}

/// Lane `j` of the result is the sum of the lanes of `v[j]`, by the same tree for every `j`:
/// lanes `i` and `i + 2` of each 128-bit quarter, then the two pairs of the quarter, then
/// quarters 0 + 1 and 2 + 3, then the two halves.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
fn sum_each(_: Avx512Bf16, v: [__m512; KEYS]) -> __m512 {
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
