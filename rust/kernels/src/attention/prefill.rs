//! Prefill (extend) attention on the CPU, bf16: a sequence's new tokens attend causally to its
//! cached prefix and to themselves, block by block (flash attention: an online softmax over
//! blocks of keys), so no score matrix larger than a block is ever held. One sequence with its
//! K and V contiguous (`prefill_attention`), or a whole pass read from the cache by slot
//! (`paged.rs`); both run `sequences.rs`.
//!
//! Why: PyTorch's CPU flash kernel multiplies bf16 blocks at float32 speed on a CPU without
//! AMX (its time does not change between bf16 and float32), a third of what AVX-512 BF16's
//! `vdpbf16ps` does. Here both products, `q · kᵀ` and `p · v`, are `vdpbf16ps` with float32
//! sums, over K and V packed once per call into bf16 pairs (see `kernels::PackedBlock`), or, on
//! a CPU with AMX-BF16, `tdpbf16ps` on tiles that read the same packed pairs (`amx.rs`: 2.8 to
//! 3.6 times `vdpbf16ps`'s speed on SmolLM2's shapes, measured on an Emerald Rapids guest).
//!
//! Layouts: `q` and `out` are `[new, heads, head_dim]`; `k` and `v` are `[prefix + new,
//! kv_heads, head_dim]`, the cached prefix first. New token `t` (position `prefix + t`) sees
//! keys `0..=prefix + t`; query head `h` reads KV head `h / (heads / kv_heads)`.
//!
//! Arithmetic, as PyTorch's CPU flash attention does it for bf16: scores, the running maximum
//! and the sum of weights are float32; each weight is rounded to bf16 before its product with
//! V; the output is the float32 weighted sum divided by the float32 sum, rounded once. A row's
//! sum is 16 partial sums until its output; on AVX-512 BF16 each weight is `2^t` with
//! `t = score · log2 e - max · log2 e`, by a polynomial accurate to float32's own rounding.
//!
//! A task is one KV head and a block of `BLOCK_TOKENS` new tokens: its rows are those tokens'
//! query heads that read the KV head (token-major), so every key block loaded serves all of
//! them. Tasks write disjoint rows of `out`, and each sums in a fixed order whatever the
//! threads.

use crate::element::Bf16;
use crate::error::elements;
use crate::isa::{self, AmxBf16, Avx512Bf16, Isa};
use crate::{Error, Result};

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod kernels;
mod paged;
mod sequences;

use kernels::{Rows, Tile};
pub use paged::{prefill_attention_paged, prefill_attention_paged_on, PagedBatch};
use sequences::{attend, Inputs, Seq};

/// Keys per block: longer blocks spread each row's fixed costs of the online softmax (the
/// maximum's reduction, the rescaling of its sums) and each tile's loads and stores of its sums
/// over more keys; measured faster than 128 even though a block of K and V (64 KiB) no longer
/// fits the first-level cache.
pub(crate) const BLOCK_KEYS: usize = 256;
/// New tokens per task.
const BLOCK_TOKENS: usize = 32;
/// Rows per tile of the two products in registers (24 accumulator registers of 32; measured a
/// little faster than 8 rows and 16 registers): `Micro::ROWS` of the portable and vector
/// products.
pub(crate) const TILE_ROWS: usize = 12;
/// The most rows of any products' tile (AMX's: 16).
pub(crate) const MAX_TILE_ROWS: usize = 16;
/// Head sizes must be a multiple of this: the weighted sum runs over 32-column slices.
pub const HEAD_DIM_MULTIPLE: usize = 32;
/// Calls with fewer (query head, key) pairs than this run on the calling thread: a parallel
/// region costs more than it saves on a few new tokens, and on a busy machine a team waits
/// for its slowest thread to be scheduled.
const PARALLEL_MIN_PAIRS: usize = 1 << 16;

/// Which instructions a call's two products run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Products {
    /// Portable float32 code.
    Portable,
    /// `vdpbf16ps` (AVX-512 BF16).
    Vector(Avx512Bf16),
    /// AMX-BF16's tiles (`amx.rs`), the softmax in AVX-512 BF16.
    Tiles(AmxBf16),
}

impl Products {
    /// The fastest this CPU runs at tier `isa` (or the detected one, if lower).
    fn at_most(isa: Isa) -> Products {
        AmxBf16::at_most(isa).map_or_else(
            || Avx512Bf16::at_most(isa).map_or(Products::Portable, Products::Vector),
            Products::Tiles,
        )
    }

    /// Every kind this CPU runs, the portable one first: for tests that compare them.
    #[cfg(test)]
    fn detected() -> Vec<Products> {
        let vector = Avx512Bf16::detected().map(Products::Vector);
        let tiles = AmxBf16::detected().map(Products::Tiles);
        [Some(Products::Portable), vector, tiles]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// The shape of one prefill attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillShape {
    /// Query heads.
    pub heads: usize,
    /// K/V heads (divides `heads`).
    pub kv_heads: usize,
    /// Elements per head, a multiple of [`HEAD_DIM_MULTIPLE`].
    pub head_dim: usize,
    /// Cached tokens before the new ones.
    pub prefix: usize,
    /// New tokens (queries).
    pub new: usize,
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// Query heads that share K/V heads evenly, and a head size the products take.
fn check_heads(heads: usize, kv_heads: usize, head_dim: usize) -> Result<()> {
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(invalid(format!(
            "{heads} query heads cannot share {kv_heads} K/V heads"
        )));
    }
    if head_dim == 0 || !head_dim.is_multiple_of(HEAD_DIM_MULTIPLE) {
        return Err(invalid(format!(
            "head size {head_dim} is not a positive multiple of {HEAD_DIM_MULTIPLE}"
        )));
    }
    Ok(())
}

fn check(shape: &PrefillShape, lens: [(&str, usize); 4]) -> Result<()> {
    let PrefillShape {
        heads,
        kv_heads,
        head_dim,
        prefix,
        new,
    } = *shape;
    check_heads(heads, kv_heads, head_dim)?;
    let total = prefix
        .checked_add(new)
        .ok_or_else(|| invalid(format!("{prefix} + {new} tokens overflow")))?;
    // Checked products: the tasks index the buffers by these sizes without further checks.
    let queries = elements("the query", &[new, heads, head_dim])?;
    let keys = elements("K or V", &[total, kv_heads, head_dim])?;
    for ((what, len), want) in lens.into_iter().zip([queries, keys, keys, queries]) {
        if len != want {
            return Err(invalid(format!(
                "{what} has {len} elements, expected {want}"
            )));
        }
    }
    Ok(())
}

/// `out = softmax(q · kᵀ · scale + causal mask) · v` for one sequence (see the module's
/// layouts), on the best tier of this CPU.
pub fn prefill_attention(
    shape: &PrefillShape,
    q: &[Bf16],
    k: &[Bf16],
    v: &[Bf16],
    scale: f32,
    out: &mut [Bf16],
) -> Result<()> {
    prefill_attention_on(isa::active(), shape, q, k, v, scale, out)
}

/// [`prefill_attention`] on the tier `isa` (or the detected one, if lower): AMX-BF16's tiles
/// where the CPU has them and `isa` is the top tier, `vdpbf16ps` on AVX-512 BF16, their
/// float32 equivalent in portable code on every other tier.
pub fn prefill_attention_on(
    isa: Isa,
    shape: &PrefillShape,
    q: &[Bf16],
    k: &[Bf16],
    v: &[Bf16],
    scale: f32,
    out: &mut [Bf16],
) -> Result<()> {
    prefill_attention_with(Products::at_most(isa), shape, q, k, v, scale, out)
}

fn prefill_attention_with(
    products: Products,
    shape: &PrefillShape,
    q: &[Bf16],
    k: &[Bf16],
    v: &[Bf16],
    scale: f32,
    out: &mut [Bf16],
) -> Result<()> {
    let lens = [
        ("the query", q.len()),
        ("K", k.len()),
        ("V", v.len()),
        ("the output", out.len()),
    ];
    check(shape, lens)?;
    let inputs = Inputs {
        heads: shape.heads,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        q,
        k,
        v,
        row: &|key| key,
        scale,
    };
    let only = Seq {
        prefix: shape.prefix,
        new: shape.new,
        first_query: 0,
        first_key: 0,
    };
    attend(products, &inputs, &[only], out)
}

/// A thread's scratch for one task: scores and weights of a tile's key block, the running
/// maximum, partial sums and weighted sum of each row, each row's last visible key and query
/// offset.
#[derive(Default)]
pub(crate) struct Scratch {
    scores: Vec<f32>,
    weights: Vec<Bf16>,
    max: Vec<f32>,
    sums: Vec<f32>,
    acc: Vec<f32>,
    last_key: Vec<usize>,
    offsets: Vec<usize>,
}

/// One call's inputs, shared by the threads.
struct Task<'a> {
    shape: PrefillShape,
    q: &'a [Bf16],
    packed: &'a kernels::Packed<'a>,
    scale: f32,
    out: *mut Bf16,
}

// SAFETY: the inputs are shared read-only; `out` outlives the parallel region and each task
// writes a disjoint set of its rows (its tokens' query heads of its KV head).
unsafe impl Sync for Task<'_> {}

impl Task<'_> {
    /// Attends the rows of KV head `kv_head` and token block `block`.
    ///
    /// # Safety
    /// The call was checked and no other thread runs the same task.
    unsafe fn run(&self, kv_head: usize, block: usize, products: Products, scratch: &mut Scratch) {
        // SAFETY: forwarded from the caller; a token proves the CPU has its instructions.
        unsafe {
            match products {
                #[cfg(target_arch = "x86_64")]
                Products::Vector(cpu) => avx512::run(cpu, self, kv_head, block, scratch),
                #[cfg(target_arch = "x86_64")]
                Products::Tiles(cpu) => amx::run(cpu, self, kv_head, block, scratch),
                #[cfg(not(target_arch = "x86_64"))]
                Products::Vector(_) | Products::Tiles(_) => {
                    unreachable!("detection makes no x86 token off x86-64")
                }
                Products::Portable => self.run_with(kernels::Portable, kv_head, block, scratch),
            }
        }
    }

    /// The task's body, over the products of `M`.
    ///
    /// # Safety
    /// As [`Task::run`].
    #[inline(always)]
    unsafe fn run_with<M: kernels::Micro>(
        &self,
        micro: M,
        kv_head: usize,
        block: usize,
        scratch: &mut Scratch,
    ) {
        let PrefillShape {
            heads,
            kv_heads,
            head_dim: d,
            prefix,
            new,
        } = self.shape;
        let group = heads / kv_heads;
        let first_token = block * BLOCK_TOKENS;
        let tokens = (new - first_token).min(BLOCK_TOKENS);
        let rows = tokens * group;
        // Row r is token first_token + r / group, query head kv_head * group + r % group: its
        // query is one contiguous run of q.
        let query = |r: usize| {
            let head = kv_head * group + r % group;
            (first_token + r / group) * heads * d + head * d
        };
        // A tile's scores and weights are written before they are read (up to its width):
        // they are sized once per thread, not cleared per task.
        scratch.scores.resize(M::ROWS * BLOCK_KEYS, 0.0);
        scratch
            .weights
            .resize(M::ROWS * BLOCK_KEYS, Bf16::default());
        scratch.max.clear();
        scratch.max.resize(rows, f32::NEG_INFINITY);
        scratch.sums.clear();
        scratch.sums.resize(rows * kernels::LANES, 0.0);
        scratch.acc.clear();
        scratch.acc.resize(rows * d, 0.0);
        scratch.last_key.clear();
        scratch
            .last_key
            .extend((0..rows).map(|r| prefix + first_token + r / group));
        scratch.offsets.clear();
        scratch.offsets.extend((0..rows).map(query));
        let key_blocks = (prefix + first_token + tokens - 1) / BLOCK_KEYS + 1;
        for key_block in 0..key_blocks {
            let keys = self.packed.keys(kv_head, key_block);
            let values = self.packed.values(kv_head, key_block);
            let first_key = key_block * BLOCK_KEYS;
            // A tile at a time through all three steps, so that its scores and weights stay
            // in the first-level cache between them.
            for r0 in (0..rows).step_by(M::ROWS) {
                let n = M::ROWS.min(rows - r0);
                let visible: [usize; MAX_TILE_ROWS] = std::array::from_fn(|i| {
                    let last = scratch.last_key[r0 + i.min(n - 1)];
                    (last + 1).saturating_sub(first_key).min(BLOCK_KEYS)
                });
                let visible = &visible[..n];
                // Rows are token-major: the tile's last row sees the most keys. A tile that
                // sees none of the block skips it (every row sees block 0, so its maxima are
                // finite and nothing would change); one that sees part of it stops its
                // products at the next multiple of 32 keys.
                let width = visible[n - 1].next_multiple_of(32);
                if width == 0 {
                    continue;
                }
                let tile = Tile {
                    q: self.q,
                    queries: &scratch.offsets[r0..r0 + n],
                    keys,
                    values,
                    visible,
                    width,
                    d,
                    scale: self.scale,
                };
                let scores = &mut scratch.scores[..n * BLOCK_KEYS];
                let weights = &mut scratch.weights[..n * BLOCK_KEYS];
                let acc = &mut scratch.acc[r0 * d..(r0 + n) * d];
                let rows = Rows {
                    max: &mut scratch.max[r0..r0 + n],
                    sums: &mut scratch.sums[r0 * kernels::LANES..(r0 + n) * kernels::LANES],
                    acc: &mut *acc,
                };
                // SAFETY: the caller promises M's instructions; the tile is sound: its
                // offsets are of whole queries inside q (checked lengths), `keys` and `values`
                // whole packed blocks, `width` a multiple of 32 of at most BLOCK_KEYS that no
                // row sees past; the other slices are exactly the tile's n rows; every row
                // seeing nothing of this block saw key 0, so its maximum is finite.
                unsafe {
                    micro.scores(tile, scores);
                    micro.softmax(tile, scores, weights, rows);
                    micro.weighted_sum(tile, weights, acc);
                }
            }
        }
        for (r, &offset) in scratch.offsets.iter().enumerate() {
            // SAFETY: row r of this task is `d` elements of `out` at its query's offset, which
            // no other task writes.
            let out = unsafe { std::slice::from_raw_parts_mut(self.out.add(offset), d) };
            let lanes = std::array::from_fn(|i| scratch.sums[r * kernels::LANES + i]);
            let inverse = 1.0 / kernels::reduce(lanes, |a, b| a + b);
            for (o, &a) in out.iter_mut().zip(&scratch.acc[r * d..(r + 1) * d]) {
                *o = Bf16::from_f32(a * inverse);
            }
        }
    }
}

#[cfg(test)]
mod tests;
