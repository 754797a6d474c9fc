//! The checks of a decode call: every size, slot and sequence, before anything is written.

use super::{DecoderLayer, FeedForward, Heads, Part, Tokens, Weight};
use crate::attention::{self, DecodeShape};
use crate::element::Element;
use crate::error::{check_len, elements};
use crate::{Error, Result};

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// Checks every size, slot and sequence of a call; the decode attention's shape.
pub(super) fn check<T: Element>(
    heads: &Heads,
    layers: &[DecoderLayer<'_, T>],
    tokens: &Tokens<'_, T>,
    hidden: &[T],
    residual: &[T],
) -> Result<DecodeShape> {
    let Heads {
        heads: query_heads,
        kv_heads,
        head_dim,
        ..
    } = *heads;
    let batch = tokens.seq_lens.len();
    if batch == 0 || !hidden.len().is_multiple_of(batch) || hidden.is_empty() {
        return Err(invalid(format!(
            "a hidden state of {} elements is not one row per sequence of {batch}",
            hidden.len()
        )));
    }
    let dim = hidden.len() / batch;
    check_len("the residual", residual.len(), hidden.len())?;
    check_len("the output slots", tokens.out_slots.len(), batch)?;
    let per_token = elements("the rotary tables", &[batch, head_dim])?;
    elements("the queries of the batch", &[batch, query_heads, head_dim])?;
    check_len("the cosines", tokens.cos.len(), per_token)?;
    check_len("the sines", tokens.sin.len(), per_token)?;
    let q_width = elements("the queries", &[query_heads, head_dim])?;
    let kv_width = elements("the keys", &[kv_heads, head_dim])?;
    if kv_width == 0 || !tokens.slots.len().is_multiple_of(batch) {
        return Err(invalid(format!(
            "{} slots are not one row per sequence of {batch}, or there are no K/V heads",
            tokens.slots.len()
        )));
    }
    let mut pool_slots = None;
    for (index, layer) in layers.iter().enumerate() {
        let layer_slots = check_layer(layer, dim, (q_width, kv_width, head_dim))
            .map_err(|e| invalid(format!("layer {index}: {e}")))?;
        if pool_slots.is_some_and(|slots| slots != layer_slots) {
            return Err(invalid(format!(
                "layer {index} caches {layer_slots} slots, the first layer {pool_slots:?}"
            )));
        }
        pool_slots = Some(layer_slots);
    }
    let pool_slots = pool_slots.unwrap_or(0);
    if let Some(bad) = tokens
        .out_slots
        .iter()
        .find(|&&slot| usize::try_from(slot).map_or(true, |s| s >= pool_slots))
    {
        return Err(invalid(format!(
            "output slot {bad} is outside the caches' {pool_slots} slots"
        )));
    }
    let shape = DecodeShape {
        batch,
        heads: query_heads,
        kv_heads,
        head_dim,
        pool_slots,
        width: tokens.slots.len() / batch,
    };
    let (queries, cache) = (batch * q_width, pool_slots * kv_width);
    let lens = [
        ("the query", queries),
        ("the K cache", cache),
        ("the V cache", cache),
        ("the output", queries),
        ("the slots", tokens.slots.len()),
    ];
    attention::check(&shape, lens, tokens.slots, tokens.seq_lens)?;
    Ok(shape)
}

/// Checks one layer against the hidden size `dim`, the attention widths and the head size; its
/// caches' slots.
pub(super) fn check_layer<T: Element>(
    layer: &DecoderLayer<'_, T>,
    dim: usize,
    (q_width, kv_width, head_dim): (usize, usize, usize),
) -> Result<usize> {
    check_len("the input norm", layer.input_norm.len(), dim)?;
    if let Some((q_norm, k_norm)) = layer.qk_norms {
        check_len("the q norm", q_norm.len(), head_dim)?;
        check_len("the k norm", k_norm.len(), head_dim)?;
    }
    check_len("the post-attention norm", layer.post_norm.len(), dim)?;
    let mut expected = vec![
        ("qkv", &layer.qkv, q_width + 2 * kv_width, dim),
        ("o", &layer.o, dim, q_width),
    ];
    let mlps = match &layer.feed_forward {
        FeedForward::Dense(mlp) => std::slice::from_ref(mlp),
        FeedForward::Sparse(experts) => {
            let count = experts.experts.len();
            if count == 0 || experts.top_k == 0 || experts.top_k > count {
                return Err(invalid(format!(
                    "a mixture of {count} experts cannot route each token to {}",
                    experts.top_k
                )));
            }
            check_len("the router", experts.router.len(), count * dim)?;
            &experts.experts[..]
        }
    };
    for mlp in mlps {
        let intermediate = mlp.gate_up.out_features() / 2;
        expected.push(("gate_up", &mlp.gate_up, 2 * intermediate, dim));
        expected.push(("down", &mlp.down, dim, intermediate));
    }
    for (what, projection, out, input) in expected {
        for part in &projection.parts {
            check_part(what, part, input)?;
        }
        let n = projection.out_features();
        if n != out || out == 0 {
            return Err(invalid(format!(
                "the {what} projection has {n} outputs in {} parts, expected {out}",
                projection.parts.len()
            )));
        }
    }
    check_len("the V cache", layer.v_cache.len(), layer.k_cache.len())?;
    if !layer.k_cache.len().is_multiple_of(kv_width) {
        return Err(invalid(format!(
            "a K cache of {} elements is not rows of {kv_width}",
            layer.k_cache.len()
        )));
    }
    Ok(layer.k_cache.len() / kv_width)
}

/// Checks one part of projection `what`, which takes `input` features: its shape, its bias,
/// and that only a kernel that exists rounds its activations to one int8.
fn check_part(what: &str, part: &Part<'_>, input: usize) -> Result<()> {
    if part.one_int8_from.is_some() && matches!(part.weight, Weight::Blocks(_)) {
        return Err(invalid(format!(
            "the {what} projection is blocks, which have no one-int8 kernel"
        )));
    }
    let (n, k) = part.weight.shape();
    if k != input || n == 0 {
        return Err(invalid(format!(
            "a part of the {what} projection is [{n}, {k}], expected [rows, {input}]"
        )));
    }
    if let Some(bias) = part.bias {
        check_len("a bias", bias.len(), n)?;
    }
    Ok(())
}
