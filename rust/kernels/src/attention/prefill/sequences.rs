//! The body shared by both prefill entries: the sequences of one call, their K and V packed
//! by block of keys (once per distinct block), and their tasks run on one parallel region.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{
    kernels, PrefillShape, Products, Scratch, Task, BLOCK_KEYS, BLOCK_TOKENS, PARALLEL_MIN_PAIRS,
};
use crate::element::Bf16;
use crate::parallel;
use crate::{Error, Result};

/// What the sequences of one call share: the heads, every query (`[tokens, heads,
/// head_dim]`, sequence after sequence), the rows of K and V (`[rows, kv_heads, head_dim]`)
/// and which row holds each of the sequences' keys.
pub(super) struct Inputs<'a> {
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) q: &'a [Bf16],
    pub(super) k: &'a [Bf16],
    pub(super) v: &'a [Bf16],
    /// The row of K and V of entry `i` of the sequences' keys, one sequence after another.
    pub(super) row: &'a (dyn Fn(usize) -> usize + Sync),
    pub(super) scale: f32,
}

/// One sequence of a call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seq {
    pub(super) prefix: usize,
    pub(super) new: usize,
    /// Its first query's token among the call's.
    pub(super) first_query: usize,
    /// Its first key's entry among the call's keys (see `Inputs::row`).
    pub(super) first_key: usize,
}

/// Attends every sequence's new tokens, on the threads of a parallel region: first K and V
/// are packed (a block of keys per work item, once for sequences that share it), then every
/// (sequence, token block, KV head) task runs, the costliest first (most keys seen), so that
/// the threads finish together however the sequences' lengths differ.
///
/// The caller checked the heads and every length: queries and output hold the sequences'
/// tokens, each sequence's keys map to rows inside K and V.
pub(super) fn attend(
    products: Products,
    inputs: &Inputs<'_>,
    seqs: &[Seq],
    out: &mut [Bf16],
) -> Result<()> {
    let seqs: Vec<Seq> = seqs.iter().copied().filter(|s| s.new > 0).collect();
    if seqs.is_empty() {
        // Nothing to attend (and with no queries, the heads' sizes were not checked).
        return Ok(());
    }
    let pairs = seqs
        .iter()
        .map(|s| {
            s.new
                .saturating_mul(inputs.heads)
                .saturating_mul(s.prefix + s.new)
        })
        .fold(0, usize::saturating_add);
    let threads = if pairs < PARALLEL_MIN_PAIRS {
        1
    } else {
        parallel::max_threads()
    };
    let (blocks, indices) = pack(inputs, &seqs, threads)?;
    let packs: Vec<kernels::Packed<'_>> = indices
        .iter()
        .map(|indices| kernels::Packed {
            blocks: indices.iter().map(|&i| &blocks[i]).collect(),
            head_dim: inputs.head_dim,
        })
        .collect();
    let per_token = inputs.heads * inputs.head_dim;
    let tasks: Vec<Task<'_>> = seqs
        .iter()
        .zip(&packs)
        .map(|(s, packed)| Task {
            shape: PrefillShape {
                heads: inputs.heads,
                kv_heads: inputs.kv_heads,
                head_dim: inputs.head_dim,
                prefix: s.prefix,
                new: s.new,
            },
            q: &inputs.q[s.first_query * per_token..][..s.new * per_token],
            packed,
            scale: inputs.scale,
            // SAFETY: the caller checked that `out` holds every sequence's queries.
            out: unsafe { out.as_mut_ptr().add(s.first_query * per_token) },
        })
        .collect();
    let mut order: Vec<(usize, usize, usize)> = Vec::new();
    for (index, s) in seqs.iter().enumerate() {
        for block in 0..s.new.div_ceil(BLOCK_TOKENS) {
            order.extend((0..inputs.kv_heads).map(|kv_head| (index, block, kv_head)));
        }
    }
    // Stable: among equal costs, the order above (a block's KV heads together).
    order.sort_by_key(|&(index, block, _)| {
        let s = &seqs[index];
        std::cmp::Reverse(s.prefix + ((block + 1) * BLOCK_TOKENS).min(s.new))
    });
    let next = AtomicUsize::new(0);
    parallel::run(threads.min(order.len()), &|_, _| {
        let mut scratch = Scratch::default();
        while let Some(&(index, block, kv_head)) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            // SAFETY: the caller checked every length; task (index, block, kv_head) is claimed
            // by this thread alone and writes only its own rows of its sequence's output.
            unsafe { tasks[index].run(kv_head, block, products, &mut scratch) };
        }
    });
    Ok(())
}

/// Every distinct block of the sequences' keys packed, a block per work item of up to
/// `threads` threads, and for each sequence the indices of its blocks. A block is its keys'
/// rows: sequences whose blocks read the same rows (a cached prefix they share) share one.
fn pack(
    inputs: &Inputs<'_>,
    seqs: &[Seq],
    threads: usize,
) -> Result<(Vec<kernels::PackedBlock>, Vec<Vec<usize>>)> {
    let mut distinct: HashMap<Vec<usize>, usize> = HashMap::new();
    let mut blocks: Vec<Vec<usize>> = Vec::new();
    let indices = seqs
        .iter()
        .map(|s| {
            let keys = s.prefix + s.new;
            (0..keys.div_ceil(BLOCK_KEYS))
                .map(|b| {
                    let first = s.first_key + b * BLOCK_KEYS;
                    let count = BLOCK_KEYS.min(keys - b * BLOCK_KEYS);
                    let rows: Vec<usize> = (first..first + count).map(inputs.row).collect();
                    *distinct.entry(rows.clone()).or_insert_with(|| {
                        blocks.push(rows);
                        blocks.len() - 1
                    })
                })
                .collect()
        })
        .collect();
    let next = AtomicUsize::new(0);
    let packed = Mutex::new(Vec::with_capacity(blocks.len()));
    parallel::run(threads.min(blocks.len()), &|_, _| {
        let mut mine = Vec::new();
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(rows) = blocks.get(index) else {
                break;
            };
            let block = kernels::PackedBlock::new(
                inputs.kv_heads,
                inputs.head_dim,
                rows.len(),
                |j| rows[j],
                inputs.k,
                inputs.v,
            );
            mine.push((index, block));
        }
        packed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .append(&mut mine);
    });
    let mut packed = packed
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if packed.len() != blocks.len() {
        return Err(Error::Invariant(format!(
            "packed {} of {} key blocks",
            packed.len(),
            blocks.len()
        )));
    }
    packed.sort_by_key(|&(index, _)| index);
    Ok((
        packed.into_iter().map(|(_, block)| block).collect(),
        indices,
    ))
}
