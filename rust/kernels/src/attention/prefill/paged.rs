//! Prefill attention of a whole pass in one call: every sequence's new tokens, their K and V
//! read from the layer's cache by slot (the pass wrote its new tokens' rows there first).
//!
//! Why: one call per sequence cost a parallel region, a packing on one thread and, with a
//! cached prefix, a gathered copy of its K and V per sequence and layer; a sequence of a few
//! new tokens after a long prefix (a question after a shared system prompt) made too few tasks
//! to keep two threads busy. Here the sequences' packings share one region and their tasks
//! another, the costliest first.

use super::{attend, check_heads, invalid, Inputs, Products, Seq};
use crate::element::Bf16;
use crate::error::elements;
use crate::isa::{self, Isa};
use crate::Result;

/// A pass's sequences as [`prefill_attention_paged`] takes them.
#[derive(Debug, Clone, Copy)]
pub struct PagedBatch<'a> {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Per sequence, the cached tokens before its new ones.
    pub prefix_lens: &'a [i32],
    /// Per sequence, its new tokens (queries).
    pub new_lens: &'a [i32],
    /// Each sequence's slots in the cache, its prefix's then its new tokens', one sequence
    /// after another.
    pub slots: &'a [i32],
}

/// `out = softmax(q · kᵀ · scale + causal mask) · v` for every sequence of `batch`: `q` and
/// `out` are `[tokens, heads, head_dim]` (the sequences' new tokens in order), the caches
/// `[slots, kv_heads, head_dim]`; new token `t` of a sequence sees its keys up to `prefix +
/// t`. On the best tier of this CPU.
pub fn prefill_attention_paged(
    batch: &PagedBatch<'_>,
    q: &[Bf16],
    k_cache: &[Bf16],
    v_cache: &[Bf16],
    scale: f32,
    out: &mut [Bf16],
) -> Result<()> {
    prefill_attention_paged_on(isa::active(), batch, q, k_cache, v_cache, scale, out)
}

/// [`prefill_attention_paged`] on the tier `isa` (or the detected one, if lower).
pub fn prefill_attention_paged_on(
    isa: Isa,
    batch: &PagedBatch<'_>,
    q: &[Bf16],
    k_cache: &[Bf16],
    v_cache: &[Bf16],
    scale: f32,
    out: &mut [Bf16],
) -> Result<()> {
    let seqs = check(batch, q, k_cache, v_cache, out)?;
    let inputs = Inputs {
        heads: batch.heads,
        kv_heads: batch.kv_heads,
        head_dim: batch.head_dim,
        q,
        k: k_cache,
        v: v_cache,
        // `check` bounded every slot by the caches' rows.
        row: &|key| batch.slots[key] as usize,
        scale,
    };
    attend(Products::at_most(isa), &inputs, &seqs, out)
}

/// The sequences of `batch`, every length and slot checked against the buffers.
fn check(
    batch: &PagedBatch<'_>,
    q: &[Bf16],
    k_cache: &[Bf16],
    v_cache: &[Bf16],
    out: &[Bf16],
) -> Result<Vec<Seq>> {
    let (heads, kv_heads, head_dim) = (batch.heads, batch.kv_heads, batch.head_dim);
    check_heads(heads, kv_heads, head_dim)?;
    if batch.prefix_lens.len() != batch.new_lens.len() {
        return Err(invalid(format!(
            "{} prefix lengths for {} sequences",
            batch.prefix_lens.len(),
            batch.new_lens.len()
        )));
    }
    let length = |what: &str, len: i32| {
        usize::try_from(len).map_err(|_| invalid(format!("a negative {what} length {len}")))
    };
    let mut seqs = Vec::with_capacity(batch.new_lens.len());
    let (mut queries, mut keys) = (0usize, 0usize);
    for (&prefix, &new) in batch.prefix_lens.iter().zip(batch.new_lens) {
        let (prefix, new) = (length("prefix", prefix)?, length("new", new)?);
        seqs.push(Seq {
            prefix,
            new,
            first_query: queries,
            first_key: keys,
        });
        // Each term is at most an i32, so neither sum overflows before it exceeds the slots.
        queries += new;
        keys += prefix + new;
        if keys > batch.slots.len() {
            break;
        }
    }
    if keys != batch.slots.len() {
        return Err(invalid(format!(
            "{} slots for sequences of {keys} tokens",
            batch.slots.len()
        )));
    }
    let want = elements("the query", &[queries, heads, head_dim])?;
    for (what, len) in [("the query", q.len()), ("the output", out.len())] {
        if len != want {
            return Err(invalid(format!(
                "{what} has {len} elements, expected {want} ({queries} tokens)"
            )));
        }
    }
    let row = elements("a cache row", &[kv_heads, head_dim])?;
    if k_cache.len() != v_cache.len() || !k_cache.len().is_multiple_of(row) {
        return Err(invalid(format!(
            "caches of {} and {} elements are not rows of {row}",
            k_cache.len(),
            v_cache.len()
        )));
    }
    let rows = k_cache.len() / row;
    if let Some(&slot) = batch
        .slots
        .iter()
        .find(|&&slot| usize::try_from(slot).map_or(true, |slot| slot >= rows))
    {
        return Err(invalid(format!(
            "slot {slot} is outside the {rows} rows of the cache"
        )));
    }
    Ok(seqs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::prefill::{prefill_attention_on, PrefillShape};
    use crate::element::to_bf16;
    use crate::test_values::values;

    const SCALE: f32 = 0.125;
    const ROWS: usize = 700;
    /// (prefix, new) per sequence: a fresh one, a few tokens after a prefix, one spanning key
    /// blocks, an empty one, and one whose prefix is the third's first 300 rows (`pass`).
    const SEQS: [(usize, usize); 5] = [(0, 40), (70, 5), (300, 33), (12, 0), (300, 7)];

    struct Pass {
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        q: Vec<Bf16>,
        k: Vec<Bf16>,
        v: Vec<Bf16>,
        slots: Vec<i32>,
    }

    fn pass(heads: usize, kv_heads: usize, head_dim: usize) -> Pass {
        let tokens: usize = SEQS.iter().map(|s| s.1).sum();
        let keys: usize = SEQS.iter().map(|s| s.0 + s.1).sum();
        // Distinct slots, scattered over the cache: a multiplicative walk modulo its rows.
        let mut slots: Vec<i32> = (0..keys).map(|i| ((i * 263 + 11) % ROWS) as i32).collect();
        // The last sequence's prefix shares the third's rows: one packing of those blocks
        // serves both.
        let (third, last) = (40 + 75, keys - 307);
        slots.copy_within(third..third + 300, last);
        let cache = ROWS * kv_heads * head_dim;
        let scaled = |seed| {
            values(cache, seed)
                .iter()
                .map(|x| x * 4.0)
                .collect::<Vec<_>>()
        };
        Pass {
            heads,
            kv_heads,
            head_dim,
            q: to_bf16(&values(tokens * heads * head_dim, 1)),
            k: to_bf16(&scaled(2)),
            v: to_bf16(&values(cache, 3)),
            slots,
        }
    }

    fn lens(pick: fn(&(usize, usize)) -> usize) -> Vec<i32> {
        SEQS.iter().map(|s| pick(s) as i32).collect()
    }

    fn batch<'a>(pass: &'a Pass, prefix: &'a [i32], new: &'a [i32]) -> PagedBatch<'a> {
        PagedBatch {
            heads: pass.heads,
            kv_heads: pass.kv_heads,
            head_dim: pass.head_dim,
            prefix_lens: prefix,
            new_lens: new,
            slots: &pass.slots,
        }
    }

    /// Rows `slots` of a cache, as a contiguous `[len, kv_heads, head_dim]` copy.
    fn gather(cache: &[Bf16], slots: &[i32], row: usize) -> Vec<Bf16> {
        slots
            .iter()
            .flat_map(|&s| cache[s as usize * row..][..row].iter().copied())
            .collect()
    }

    #[test]
    fn a_pass_equals_its_sequences_attended_one_by_one() {
        for (heads, kv_heads, head_dim) in [(9, 3, 64), (4, 4, 32), (2, 1, 128)] {
            let pass = pass(heads, kv_heads, head_dim);
            let (prefix, new) = (lens(|s| s.0), lens(|s| s.1));
            for isa in [Isa::Scalar, isa::detected()] {
                let mut out = vec![Bf16::default(); pass.q.len()];
                let batch = batch(&pass, &prefix, &new);
                prefill_attention_paged_on(isa, &batch, &pass.q, &pass.k, &pass.v, SCALE, &mut out)
                    .unwrap();
                let (per_token, row) = (heads * head_dim, kv_heads * head_dim);
                let (mut first_query, mut first_key) = (0, 0);
                for &(prefix, new) in &SEQS {
                    let slots = &pass.slots[first_key..first_key + prefix + new];
                    let queries = first_query * per_token..(first_query + new) * per_token;
                    let mut alone = vec![Bf16::default(); new * per_token];
                    let shape = PrefillShape {
                        heads,
                        kv_heads,
                        head_dim,
                        prefix,
                        new,
                    };
                    let (k, v) = (gather(&pass.k, slots, row), gather(&pass.v, slots, row));
                    prefill_attention_on(
                        isa,
                        &shape,
                        &pass.q[queries.clone()],
                        &k,
                        &v,
                        SCALE,
                        &mut alone,
                    )
                    .unwrap();
                    assert_eq!(
                        out[queries],
                        alone[..],
                        "{isa:?} {heads}/{kv_heads} x {head_dim}"
                    );
                    first_query += new;
                    first_key += prefix + new;
                }
            }
        }
    }

    #[test]
    fn refuses_lengths_and_slots_that_do_not_fit() {
        let pass = pass(4, 2, 32);
        let (prefix, new) = (lens(|s| s.0), lens(|s| s.1));
        let mut out = vec![Bf16::default(); pass.q.len()];
        let mut call = |batch: &PagedBatch<'_>, q: &[Bf16], k: &[Bf16]| {
            prefill_attention_paged(batch, q, k, &pass.v[..k.len()], SCALE, &mut out)
        };
        let good = batch(&pass, &prefix, &new);
        assert!(call(&good, &pass.q, &pass.k).is_ok());
        let negative: Vec<i32> = prefix
            .iter()
            .map(|&p| if p == 70 { -1 } else { p })
            .collect();
        assert!(call(&batch(&pass, &negative, &new), &pass.q, &pass.k).is_err());
        assert!(call(&batch(&pass, &prefix[1..], &new), &pass.q, &pass.k).is_err());
        let longer: Vec<i32> = new.iter().map(|&n| n + 1).collect();
        assert!(call(&batch(&pass, &prefix, &longer), &pass.q, &pass.k).is_err());
        assert!(call(&good, &pass.q[1..], &pass.k).is_err());
        // The cache without the row of the largest slot.
        let short = *pass.slots.iter().max().unwrap() as usize * 2 * 32;
        assert!(call(&good, &pass.q, &pass.k[..short]).is_err());
        let mut far = pass.slots.clone();
        far[3] = i32::MAX;
        let far_batch = PagedBatch {
            slots: &far,
            ..good
        };
        assert!(call(&far_batch, &pass.q, &pass.k).is_err());
        let heads = PagedBatch {
            kv_heads: 3,
            ..good
        };
        assert!(call(&heads, &pass.q, &pass.k).is_err());
        // Heads whose cache rows overflow a usize are refused, not wrapped (no queries, so
        // that only the rows' size can overflow).
        let huge = PagedBatch {
            heads: 1 << 60,
            kv_heads: 1 << 60,
            prefix_lens: &[1],
            new_lens: &[0],
            slots: &pass.slots[..1],
            ..good
        };
        let refused = prefill_attention_paged(&huge, &[], &pass.k, &pass.v, SCALE, &mut []);
        assert!(refused
            .unwrap_err()
            .to_string()
            .contains("more elements than memory"));
        // As many query heads, sharing one K/V head, and no queries: nothing to do.
        let one_kv_head = PagedBatch {
            kv_heads: 1,
            ..huge
        };
        let empty = prefill_attention_paged(&one_kv_head, &[], &pass.k, &pass.v, SCALE, &mut []);
        assert!(empty.is_ok());
    }

    #[test]
    fn no_sequences_and_no_new_tokens_write_nothing() {
        let pass = pass(4, 2, 32);
        let empty = PagedBatch {
            prefix_lens: &[],
            new_lens: &[],
            slots: &[],
            ..batch(&pass, &[], &[])
        };
        assert!(prefill_attention_paged(&empty, &[], &pass.k, &pass.v, SCALE, &mut []).is_ok());
        let only_prefix = PagedBatch {
            prefix_lens: &[3],
            new_lens: &[0],
            slots: &pass.slots[..3],
            ..empty
        };
        assert!(
            prefill_attention_paged(&only_prefix, &[], &pass.k, &pass.v, SCALE, &mut []).is_ok()
        );
    }
}
