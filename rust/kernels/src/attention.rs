//! Decode attention on the CPU, straight from the paged KV cache: one new query token per
//! sequence against every K/V row its slots name, with no gathered copy of the cache. The query,
//! cache and output are float32 or bf16 ([`Element`]); scores, softmax and the weighted sum
//! are float32 in both, and a bf16 output is rounded once at the end.
//!
//! Why: a decode step's attention reads little (a few hundred K/V rows per sequence) but the
//! PyTorch path gathers each layer's K and V into padded tensors and calls a general attention
//! kernel, whose fixed costs per call are most of its time at decode sizes. Here each sequence
//! is one task that reads its rows in place, on PyTorch's OpenMP threads, each row whole (every
//! KV head's floats are adjacent in the cache) and once for K, once for V.
//!
//! Layouts: `q` and `out` are `[batch, heads, head_dim]`; the K and V caches are
//! `[pool_slots, kv_heads, head_dim]`; `slots` is `[batch, width]`, a sequence's slots first and
//! anything after its length ignored. Query head `h` reads KV head `h / (heads / kv_heads)`.
//!
//! What must stay true: a sequence's result depends only on its own query and rows (batch
//! invariance): each task sums in a fixed order, whatever the batch and the threads. The order
//! is the instruction-set tier's (`tiers.rs`): the bf16 products of the AVX-512 BF16 tier pair
//! elements differently, so tiers agree within rounding, not bit for bit.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::element::Element;
use crate::error::elements;
use crate::isa::{self, Isa};
use crate::parallel;
use crate::{Error, Result};

#[cfg(target_arch = "x86_64")]
mod grouped;
pub mod prefill;
mod tiers;

/// The shape of one decode attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    /// Sequences, one query token each.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// K/V heads (divides `heads`).
    pub kv_heads: usize,
    /// Floats per head.
    pub head_dim: usize,
    /// Rows of the K and V caches (slots of the pool).
    pub pool_slots: usize,
    /// Slots per sequence in `slots`.
    pub width: usize,
}

/// Calls with fewer K/V rows than this in all run on the calling thread.
const PARALLEL_MIN_ROWS: usize = 256;

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// Checks a decode attention call's lengths (`lens`: query, K cache, V cache, output, slots),
/// slots and sequence lengths against `shape`.
pub(crate) fn check(
    shape: &DecodeShape,
    lens: [(&str, usize); 5],
    slots: &[i32],
    seq_lens: &[i32],
) -> Result<()> {
    let DecodeShape {
        batch,
        heads,
        kv_heads,
        head_dim,
        pool_slots,
        width,
    } = *shape;
    if kv_heads == 0 || head_dim == 0 || heads % kv_heads != 0 {
        return Err(invalid(format!(
            "{heads} query heads cannot share {kv_heads} K/V heads of {head_dim} floats"
        )));
    }
    // Checked products: a size that wrapped around would let short buffers through, and the
    // tasks index them by these sizes without further checks.
    let queries = elements("the query", &[batch, heads, head_dim])?;
    let cache = elements("a K/V cache", &[pool_slots, kv_heads, head_dim])?;
    let expected = [
        queries,
        cache,
        cache,
        queries,
        elements("the slots", &[batch, width])?,
    ];
    for ((what, len), want) in lens.into_iter().zip(expected) {
        if len != want {
            return Err(invalid(format!(
                "{what} has {len} elements, expected {want}"
            )));
        }
    }
    if seq_lens.len() != batch {
        return Err(invalid(format!(
            "{} sequence lengths for {batch} sequences",
            seq_lens.len()
        )));
    }
    for (seq, &len) in seq_lens.iter().enumerate() {
        let len = usize::try_from(len).unwrap_or(0);
        if len == 0 || len > width {
            return Err(invalid(format!(
                "sequence {seq} has length {}, outside 1..={width}",
                seq_lens[seq]
            )));
        }
        let row = &slots[seq * width..seq * width + len];
        if let Some(&bad) = row
            .iter()
            .find(|&&slot| usize::try_from(slot).map_or(true, |s| s >= pool_slots))
        {
            return Err(invalid(format!(
                "sequence {seq} names slot {bad}, outside the pool's {pool_slots} slots"
            )));
        }
    }
    Ok(())
}

/// `out = softmax(q · Kᵀ · scale) · V` for each sequence over its first `seq_lens[b]` slots.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention<T: Element>(
    shape: &DecodeShape,
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    slots: &[i32],
    seq_lens: &[i32],
    scale: f32,
    out: &mut [T],
) -> Result<()> {
    decode_attention_on(
        isa::active(),
        shape,
        q,
        k_cache,
        v_cache,
        slots,
        seq_lens,
        scale,
        out,
    )
}

/// [`decode_attention`] on the tier `isa` (or the detected one, if lower).
#[allow(clippy::too_many_arguments)]
pub fn decode_attention_on<T: Element>(
    isa: Isa,
    shape: &DecodeShape,
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    slots: &[i32],
    seq_lens: &[i32],
    scale: f32,
    out: &mut [T],
) -> Result<()> {
    let lens = [
        ("the query", q.len()),
        ("the K cache", k_cache.len()),
        ("the V cache", v_cache.len()),
        ("the output", out.len()),
        ("the slots", slots.len()),
    ];
    check(shape, lens, slots, seq_lens)?;
    let rows: usize = seq_lens.iter().map(|&len| len as usize).sum();
    let threads = if rows >= PARALLEL_MIN_ROWS {
        parallel::max_threads()
    } else {
        1
    };
    // A task is a sequence, or with fewer sequences than threads, a share of a sequence's query
    // heads (each head's arithmetic is the same whatever the share: the results do not change),
    // so that one sequence decodes on every thread. No more threads than tasks.
    let parts = threads.div_ceil(shape.batch).clamp(1, shape.heads.max(1));
    let tasks = shape.batch * parts;
    let threads = threads.min(tasks);
    let task = Task {
        shape: *shape,
        q,
        k_cache,
        v_cache,
        slots,
        seq_lens,
        scale,
        out: out.as_mut_ptr(),
    };
    let next = AtomicUsize::new(0);
    parallel::run(threads, &|_, _| {
        let mut scratch = Scratch::default();
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            if index >= tasks {
                break;
            }
            let (seq, part) = (index / parts, index % parts);
            let heads = part * shape.heads / parts..(part + 1) * shape.heads / parts;
            // SAFETY: `check` validated every length and slot; these heads of sequence `seq`
            // are claimed by this thread alone, and its task writes only their rows of `out`.
            unsafe { tiers::run(&task, isa, seq, heads, &mut scratch) };
        }
    });
    Ok(())
}

/// A thread's float32 scratch: the scores (`[heads, len]`), the weighted sums of V and each
/// head's inverse sum of weights.
#[derive(Default)]
pub(crate) struct Scratch {
    scores: Vec<f32>,
    sums: Vec<f32>,
    inverses: Vec<f32>,
    /// The weights as bf16 bits, each head's row padded to an even length (`grouped.rs`).
    #[cfg(target_arch = "x86_64")]
    pairs: Vec<u16>,
}

/// One call's inputs, shared by the threads; each task (a sequence, or a share of its query
/// heads) writes its own rows of `out`.
pub(crate) struct Task<'a, T> {
    shape: DecodeShape,
    q: &'a [T],
    k_cache: &'a [T],
    v_cache: &'a [T],
    slots: &'a [i32],
    seq_lens: &'a [i32],
    scale: f32,
    out: *mut T,
}

// SAFETY: the inputs are shared slices; `out` outlives the parallel region and each task writes
// a disjoint range of it (its sequence's rows of its heads).
unsafe impl<T: Sync> Sync for Task<'_, T> {}

impl<T: Element> Task<'_, T> {
    /// The `kv_heads * head_dim` elements at `slot` in a K or V cache.
    #[inline(always)]
    fn cache_row<'c>(&self, cache: &'c [T], slot: i32) -> &'c [T] {
        let row = self.shape.kv_heads * self.shape.head_dim;
        // In bounds: `check` kept every slot below the pool size.
        let start = slot as usize * row;
        &cache[start..start + row]
    }

    /// Attends query heads `heads` of sequence `seq`, with `dot` for the products of a query
    /// head and a key head (the tier's; see `tiers.rs`).
    ///
    /// # Safety
    /// The call was checked, `heads` lies within the query heads, and no other thread runs
    /// these heads of this sequence.
    #[inline(always)]
    unsafe fn run_with(
        &self,
        seq: usize,
        heads: Range<usize>,
        scratch: &mut Scratch,
        dot: impl Fn(&[T], &[T]) -> f32,
    ) {
        let DecodeShape {
            heads: all_heads,
            kv_heads,
            head_dim: d,
            width,
            ..
        } = self.shape;
        let group = all_heads / kv_heads;
        let len = self.seq_lens[seq] as usize;
        let row_slots = &self.slots[seq * width..seq * width + len];
        let (first, count) = (heads.start, heads.len());
        let queries = &self.q[(seq * all_heads + first) * d..(seq * all_heads + heads.end) * d];
        // The K/V head of the task's `i`-th query head.
        let kv_of = |i: usize| (first + i) / group * d..((first + i) / group + 1) * d;
        // Scores are [count, len]: query head `first`'s row, then the next head's.
        let scores = &mut scratch.scores;
        scores.clear();
        scores.resize(count * len, 0.0);
        for (t, &slot) in row_slots.iter().enumerate() {
            if let Some(&ahead) = row_slots.get(t + PREFETCH_ROWS) {
                prefetch(self.cache_row(self.k_cache, ahead), Level::First);
            }
            let keys = self.cache_row(self.k_cache, slot);
            for (i, query) in queries.chunks_exact(d).enumerate() {
                scores[i * len + t] = dot(query, &keys[kv_of(i)]) * self.scale;
            }
        }
        self.weigh(len, scratch);
        let sums = &mut scratch.sums;
        sums.clear();
        sums.resize(count * d, 0.0);
        for (t, &slot) in row_slots.iter().enumerate() {
            if let Some(&ahead) = row_slots.get(t + PREFETCH_ROWS) {
                prefetch(self.cache_row(self.v_cache, ahead), Level::First);
            }
            let values = self.cache_row(self.v_cache, slot);
            for (i, head_sums) in sums.chunks_exact_mut(d).enumerate() {
                axpy(scratch.scores[i * len + t], &values[kv_of(i)], head_sums);
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.finish(seq, heads, scratch) };
    }

    /// Turns the scores (`[heads, len]`) into the weights of V and each head's inverse sum
    /// of weights. Float32 scales the weights before the sum; a reduced type does as
    /// PyTorch's CPU flash attention does for it: each exponential rounded to T before its
    /// product with V, and the float32 sum of the unrounded ones dividing the weighted sum at
    /// the end.
    #[inline(always)]
    fn weigh(&self, len: usize, scratch: &mut Scratch) {
        let inverses = &mut scratch.inverses;
        inverses.clear();
        for weights in scratch.scores.chunks_exact_mut(len) {
            let inverse = 1.0 / exponentiate(weights);
            if T::REDUCED {
                weights.iter_mut().for_each(|w| *w = T::store(*w).load());
                inverses.push(inverse);
            } else {
                weights.iter_mut().for_each(|w| *w *= inverse);
                inverses.push(1.0);
            }
        }
    }

    /// Writes the weighted sums of query heads `heads` of sequence `seq`, each scaled by its
    /// head's inverse, rounded to T.
    ///
    /// # Safety
    /// No other thread writes these heads of this sequence.
    #[inline(always)]
    unsafe fn finish(&self, seq: usize, heads: Range<usize>, scratch: &Scratch) {
        let (all_heads, d) = (self.shape.heads, self.shape.head_dim);
        // SAFETY: this task owns these heads' outputs of its sequence.
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                self.out.add((seq * all_heads + heads.start) * d),
                heads.len() * d,
            )
        };
        for ((head_out, head_sums), &inverse) in out
            .chunks_exact_mut(d)
            .zip(scratch.sums.chunks_exact(d))
            .zip(scratch.inverses.iter())
        {
            for (o, &sum) in head_out.iter_mut().zip(head_sums) {
                *o = T::store(if T::REDUCED { sum * inverse } else { sum });
            }
        }
    }
}

/// How many rows ahead of the one being read the next rows are requested from memory: slots
/// freed and reused in any order scatter a sequence's rows over the cache, where the hardware
/// prefetcher cannot follow them.
const PREFETCH_ROWS: usize = 4;

/// Which cache `prefetch` asks lines into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// The first level: rows read within a few rows from now.
    First,
    /// The second level: rows read further ahead, which would crowd the first level's few
    /// outstanding misses.
    #[cfg(target_arch = "x86_64")]
    Second,
}

/// Asks for `row`'s cache lines ahead of use (a hint; nothing on other architectures).
#[inline(always)]
fn prefetch<T>(row: &[T], level: Level) {
    #[cfg(target_arch = "x86_64")]
    for line in row.chunks(64 / size_of::<T>()) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let at = line.as_ptr().cast();
        // SAFETY: prefetching is a hint that never faults; the address is inside `row`.
        unsafe {
            match level {
                Level::First => _mm_prefetch::<_MM_HINT_T0>(at),
                Level::Second => _mm_prefetch::<_MM_HINT_T1>(at),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (row, level);
}

/// Lanes of the partial sums: one AVX register (the compiler vectorizes the fixed-size loops).
const LANES: usize = 8;

/// `a · b` in float32, in `LANES` partial sums (the order of every tier but AVX-512 BF16's).
#[inline(always)]
fn dot<T: Element>(a: &[T], b: &[T]) -> f32 {
    let mut partial = [0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x.load() * y.load())
        .sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for lane in 0..LANES {
            partial[lane] += x[lane].load() * y[lane].load();
        }
    }
    partial.iter().sum::<f32>() + tail
}

/// Replaces `scores` by `e^(score - max score)` and returns their sum.
#[inline(always)]
fn exponentiate(scores: &mut [f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = scores.chunks_exact(LANES);
    let mut max = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for chunk in chunks {
        for lane in 0..LANES {
            lanes[lane] = lanes[lane].max(chunk[lane]);
        }
    }
    max = lanes.iter().copied().fold(max, f32::max);
    for score in scores.iter_mut() {
        *score = exp_nonpositive(*score - max);
    }
    let mut sums = [0f32; LANES];
    let chunks = scores.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for lane in 0..LANES {
            sums[lane] += chunk[lane];
        }
    }
    sums.iter().sum::<f32>() + tail
}

/// `e^x` for `x <= 0` within about one ulp (Cephes' `expf`: `x = n ln 2 + r`, a degree-6
/// polynomial in `r`, times `2^n`); 0 for `x` below -87 (and for NaN). Plain arithmetic that
/// the compiler vectorizes, unlike a call to the C library's `expf` per element: no early
/// return, and `n` read out of a float's bits rather than by `as i32`, whose saturation keeps
/// the loops around it scalar.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it to an integer-valued float of magnitude below 2^22 leaves the
    // integer in the low mantissa bits, as two's complement after subtracting its own bits.
    const SHIFTER: f32 = 12_582_912.0;
    // Within [-87, 0], so that n below stays an integer in [-126, 0] (a NaN gives garbage
    // bits, of no consequence: the result is 0 for it).
    let clamped = x.clamp(-87.0, 0.0);
    let n = (clamped * std::f32::consts::LOG2_E + 0.5).floor();
    let r = clamped - n * LN2_HIGH - n * LN2_LOW;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let mantissa = p * r * r + r + 1.0;
    let exponent = (n + SHIFTER).to_bits().wrapping_sub(SHIFTER.to_bits());
    let value = mantissa * f32::from_bits(exponent.wrapping_add(127) << 23);
    if x.is_nan() || x < -87.0 {
        0.0
    } else {
        value
    }
}

#[inline(always)]
fn axpy<T: Element>(weight: f32, x: &[T], out: &mut [f32]) {
    for (o, &value) in out.iter_mut().zip(x) {
        *o += weight * value.load();
    }
}

#[cfg(test)]
mod tests;
