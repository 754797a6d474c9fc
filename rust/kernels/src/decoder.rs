//! A decode step through a stack of Llama-style decoder layers whose projections are quantized
//! weights (packed tiles or GGUF blocks), in one call: the kernels the model's Python layers
//! call one by one (`ops`, `quant::linear_packed` or `linear_packed_one_int8`,
//! `attention::decode_attention`), called here in the same order on the same values, so the
//! results are the same bits.
//!
//! Why: at one sequence, a decode step of SmolLM2 (30 layers) is about 300 kernel calls of
//! 5 to 40 µs of arithmetic each, and each call from Python costs 5 to 10 µs more (module
//! calls, output tensors, numpy views of every argument): measured, the Python around the
//! kernels was more than half of the step. Here a step pays for that once.
//!
//! Per layer, `h` the layer's input and `r` the residual stream (`r` starts at zero):
//! - `r += h`; `x = rms_norm(r) · input_norm`;
//! - `[q | k | v] = x · qkvᵀ + bias`; with per-head norms (Qwen3), each head of `q` and `k`
//!   `rms_norm`ed by `q_norm` and `k_norm`; `q` and `k` rotated; `k` and `v` written to the K/V caches
//!   at the tokens' slots; `a` = attention of `q` over each sequence's slots; `h = a · oᵀ + bias`;
//! - `r += h`; `x = rms_norm(r) · post_norm`; `h = (silu(gate) · up)(x · gate_upᵀ) · downᵀ`,
//!   or, in a mixture of experts, `h = Σ wₑ · (silu(gate) · up)(x · gate_upₑᵀ) · downₑᵀ` over
//!   the experts `moe::route` picks for each token, with its weights `wₑ`: the experts in
//!   ascending order, each adding its tokens' outputs times their weights into a float32
//!   sum, rounded at the end, as the Python mixture (`srt.layers.moe`) sums them.
//!
//! The last layer's `h` is returned in `hidden`; the caller adds it to `r` and applies the final
//! norm, as after the Python layers. Every size, slot and sequence is checked before anything is
//! written, so a refused call changes nothing.

use crate::attention::{self, DecodeShape};
use crate::element::Element;
use crate::error::{check_len, elements};
use crate::moe;
use crate::ops;
use crate::quant::{self, linear_packed, PackedKernel, PackedMatrix, QuantMatrix};
use crate::{Error, Result};

#[cfg(test)]
mod tests;

/// A projection's weight: packed tiles (the integer kernel) or GGUF blocks (the float
/// kernel, on CPUs without the integer one).
#[derive(Debug, Clone, Copy)]
pub enum Weight<'a> {
    Packed(PackedMatrix<'a>),
    Blocks(QuantMatrix<'a>),
}

impl Weight<'_> {
    /// `(out_features, in_features)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Weight::Packed(w) => (w.out_features(), w.in_features()),
            Weight::Blocks(w) => (w.out_features(), w.in_features()),
        }
    }

    /// The block format.
    pub fn format(&self) -> quant::Format {
        match self {
            Weight::Packed(w) => w.format(),
            Weight::Blocks(w) => w.format(),
        }
    }
}

/// A projection, its bias, and from how many rows its product rounds activations to one int8.
#[derive(Debug, Clone, Copy)]
pub struct Projection<'a> {
    pub weight: Weight<'a>,
    /// `out_features` floats, when the projection has a bias.
    pub bias: Option<&'a [f32]>,
    /// Steps of at least this many rows take `quant::linear_packed_one_int8` (activations
    /// rounded to one int8 per value) where fewer take `linear_packed` (two int8 parts), as
    /// the projection's plan in `QuantizedWeight.linear` does; `None`: every step takes
    /// `linear_packed`. Only for packed weights.
    pub one_int8_from: Option<usize>,
}

/// A gated MLP: `gate_up` has `2 · intermediate` outputs (gate, then up), `down` takes them
/// back to the hidden size.
#[derive(Debug, Clone, Copy)]
pub struct Mlp<'a> {
    pub gate_up: Projection<'a>,
    pub down: Projection<'a>,
}

/// A sparse mixture of gated-MLP experts and its router (`moe::route`).
#[derive(Debug, Clone)]
pub struct Experts<'a> {
    /// `[experts, hidden_size]` float32.
    pub router: &'a [f32],
    pub experts: Vec<Mlp<'a>>,
    pub top_k: usize,
    /// Whether a token's expert weights are divided by their sum.
    pub renormalize: bool,
}

/// A decoder layer's feed-forward.
#[derive(Debug, Clone)]
pub enum FeedForward<'a> {
    Dense(Mlp<'a>),
    Sparse(Experts<'a>),
}

/// One decoder layer: its weights and its K/V caches (`[pool_slots, kv_heads, head_dim]`).
pub struct DecoderLayer<'a, T> {
    pub input_norm: &'a [T],
    /// `[heads + 2 · kv_heads] · head_dim` outputs: q, then k, then v.
    pub qkv: Projection<'a>,
    pub o: Projection<'a>,
    /// Per-head RMSNorm weights of q and k (`head_dim` each), where the model has them.
    pub qk_norms: Option<(&'a [T], &'a [T])>,
    pub post_norm: &'a [T],
    pub feed_forward: FeedForward<'a>,
    pub k_cache: &'a mut [T],
    pub v_cache: &'a mut [T],
}

/// The attention shape and constants every layer shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// RMSNorm's epsilon.
    pub eps: f32,
    /// The attention scores' scale.
    pub scale: f32,
}

/// What the step's sequences bring, one new token each.
pub struct Tokens<'a, T> {
    /// `[batch, head_dim]`: each token's rotary cos and signed sin (`ops::rotary`'s tables).
    pub cos: &'a [T],
    pub sin: &'a [T],
    /// `[batch]`: the cache slot each token's K/V is written to.
    pub out_slots: &'a [i64],
    /// `[batch, width]`: each sequence's slots, the new token's included.
    pub slots: &'a [i32],
    /// `[batch]`: each sequence's length, the new token included.
    pub seq_lens: &'a [i32],
}

/// Runs `layers` on `hidden` (`[batch, hidden_size]`, the first layer's input; on return the
/// last layer's output) and the residual stream `residual` (same shape, updated in place), with
/// `kernel` for every projection.
pub fn decode_layers<T: Element>(
    kernel: PackedKernel,
    heads: &Heads,
    layers: &mut [DecoderLayer<'_, T>],
    tokens: &Tokens<'_, T>,
    hidden: &mut [T],
    residual: &mut [T],
) -> Result<()> {
    let batch = tokens.seq_lens.len();
    let shape = check(heads, layers, tokens, hidden, residual)?;
    let Some(first) = layers.first() else {
        return Ok(());
    };
    let dim = first.input_norm.len();
    let (q_width, kv_width) = (
        heads.heads * heads.head_dim,
        heads.kv_heads * heads.head_dim,
    );
    let qkv_width = q_width + 2 * kv_width;
    let zeros = |width: usize| vec![T::store(0.0); batch * width];
    let (mut normed, mut qkv) = (zeros(dim), zeros(qkv_width));
    let (mut q, mut q_rotated) = (zeros(q_width), zeros(q_width));
    let (mut k, mut k_rotated) = (zeros(kv_width), zeros(kv_width));
    let mut attended = zeros(q_width);
    let mut scratch = Scratch::default();
    for layer in layers.iter_mut() {
        ops::rms_norm(
            hidden,
            Some(residual),
            layer.input_norm,
            heads.eps,
            &mut normed,
        )?;
        project(kernel, &layer.qkv, &normed, batch, &mut qkv)?;
        for (row, (q, k)) in qkv.chunks_exact(qkv_width).zip(
            q.chunks_exact_mut(q_width)
                .zip(k.chunks_exact_mut(kv_width)),
        ) {
            q.copy_from_slice(&row[..q_width]);
            k.copy_from_slice(&row[q_width..q_width + kv_width]);
        }
        if let Some((q_norm, k_norm)) = layer.qk_norms {
            // Normalized into the rotation's buffers, then swapped in: no more allocations.
            ops::rms_norm(&q, None, q_norm, heads.eps, &mut q_rotated)?;
            ops::rms_norm(&k, None, k_norm, heads.eps, &mut k_rotated)?;
            std::mem::swap(&mut q, &mut q_rotated);
            std::mem::swap(&mut k, &mut k_rotated);
        }
        ops::rotary(&q, tokens.cos, tokens.sin, heads.head_dim, &mut q_rotated)?;
        ops::rotary(&k, tokens.cos, tokens.sin, heads.head_dim, &mut k_rotated)?;
        for (i, &slot) in tokens.out_slots.iter().enumerate() {
            // `check` bounded every slot by the caches' rows.
            let at = slot as usize * kv_width..(slot as usize + 1) * kv_width;
            let v = &qkv[i * qkv_width + q_width + kv_width..(i + 1) * qkv_width];
            layer.k_cache[at.clone()].copy_from_slice(&k_rotated[i * kv_width..][..kv_width]);
            layer.v_cache[at].copy_from_slice(v);
        }
        attention::decode_attention(
            &shape,
            &q_rotated,
            layer.k_cache,
            layer.v_cache,
            tokens.slots,
            tokens.seq_lens,
            heads.scale,
            &mut attended,
        )?;
        project(kernel, &layer.o, &attended, batch, hidden)?;
        ops::rms_norm(
            hidden,
            Some(residual),
            layer.post_norm,
            heads.eps,
            &mut normed,
        )?;
        match &layer.feed_forward {
            FeedForward::Dense(mlp) => {
                let buffers = (&mut scratch.gate_up, &mut scratch.act);
                mlp_rows(kernel, mlp, &normed, batch, hidden, buffers)?
            }
            FeedForward::Sparse(experts) => {
                mixture(kernel, experts, &normed, batch, hidden, &mut scratch)?
            }
        }
    }
    Ok(())
}

/// The feed-forward's working rows, sized on use and kept across layers.
struct Scratch<T> {
    gate_up: Vec<T>,
    act: Vec<T>,
    /// A mixture's: the rows routed to one expert, and its output for them.
    routed: Vec<T>,
    expert_out: Vec<T>,
}

impl<T> Default for Scratch<T> {
    fn default() -> Self {
        Scratch {
            gate_up: Vec::new(),
            act: Vec::new(),
            routed: Vec::new(),
            expert_out: Vec::new(),
        }
    }
}

/// `out = (silu(gate) · up)(x · gate_upᵀ) · downᵀ` for `rows` rows of `x`, through the
/// working rows `gate_up` and `act`.
fn mlp_rows<T: Element>(
    kernel: PackedKernel,
    mlp: &Mlp<'_>,
    x: &[T],
    rows: usize,
    out: &mut [T],
    (gate_up, act): (&mut Vec<T>, &mut Vec<T>),
) -> Result<()> {
    let intermediate = mlp.gate_up.weight.shape().0 / 2;
    gate_up.resize(rows * 2 * intermediate, T::store(0.0));
    act.resize(rows * intermediate, T::store(0.0));
    project(kernel, &mlp.gate_up, x, rows, gate_up)?;
    ops::silu_and_mul(gate_up, intermediate, act)?;
    project(kernel, &mlp.down, act, rows, out)
}

/// `out` = each row of `x` through its experts, weighted (the module's docs): every expert's
/// routed rows in one product each, as the Python mixture runs them.
fn mixture<T: Element>(
    kernel: PackedKernel,
    experts: &Experts<'_>,
    x: &[T],
    rows: usize,
    out: &mut [T],
    scratch: &mut Scratch<T>,
) -> Result<()> {
    let (dim, top_k) = (x.len() / rows, experts.top_k);
    let (mut ids, mut weights) = (vec![0i64; rows * top_k], vec![0f32; rows * top_k]);
    moe::route(
        x,
        experts.router,
        experts.experts.len(),
        top_k,
        experts.renormalize,
        &mut ids,
        &mut weights,
    )?;
    let mut sum = vec![0f32; rows * dim];
    let mut routed = Vec::with_capacity(rows);
    for (expert, mlp) in experts.experts.iter().enumerate() {
        // The rows this expert takes, in order, and the weight each gives it.
        routed.clear();
        let chosen = ids.chunks_exact(top_k).zip(weights.chunks_exact(top_k));
        for (row, (ids, weights)) in chosen.enumerate() {
            if let Some(at) = ids.iter().position(|&id| id == expert as i64) {
                routed.push((row, weights[at]));
            }
        }
        if routed.is_empty() {
            continue;
        }
        scratch.routed.clear();
        for &(row, _) in &routed {
            scratch.routed.extend_from_slice(&x[row * dim..][..dim]);
        }
        scratch.expert_out.resize(routed.len() * dim, T::store(0.0));
        let buffers = (&mut scratch.gate_up, &mut scratch.act);
        let (gathered, expert_out) = (&scratch.routed, &mut scratch.expert_out);
        mlp_rows(kernel, mlp, gathered, routed.len(), expert_out, buffers)?;
        for (&(row, weight), y) in routed.iter().zip(expert_out.chunks_exact(dim)) {
            // Separate product and sum (no fused multiply-add), as PyTorch's `y * w` then
            // `index_add_` round them.
            for (s, y) in sum[row * dim..][..dim].iter_mut().zip(y) {
                *s += y.load() * weight;
            }
        }
    }
    for (o, &s) in out.iter_mut().zip(&sum) {
        *o = T::store(s);
    }
    Ok(())
}

/// `out = x · Wᵀ + bias`, as `QuantizedWeight.linear` computes it for decode-sized products:
/// on tiles in the activations' type (two int8 parts, or one from `one_int8_from` rows); on
/// blocks in float32, the output then rounded to `T`.
fn project<T: Element>(
    kernel: PackedKernel,
    projection: &Projection<'_>,
    x: &[T],
    rows: usize,
    out: &mut [T],
) -> Result<()> {
    match &projection.weight {
        Weight::Packed(weight) if projection.one_int8_from.is_some_and(|from| rows >= from) => {
            quant::linear_packed_one_int8(kernel, weight, x, rows, projection.bias, out)
        }
        Weight::Packed(weight) => linear_packed(kernel, weight, x, rows, projection.bias, out),
        Weight::Blocks(weight) => {
            let input: Vec<f32> = x.iter().map(|v| v.load()).collect();
            let mut product = vec![0f32; out.len()];
            quant::linear(weight, &input, rows, projection.bias, &mut product)?;
            for (o, &p) in out.iter_mut().zip(&product) {
                *o = T::store(p);
            }
            Ok(())
        }
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// Checks every size, slot and sequence of a call; the decode attention's shape.
fn check<T: Element>(
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
fn check_layer<T: Element>(
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
        let intermediate = mlp.gate_up.weight.shape().0 / 2;
        expected.push(("gate_up", &mlp.gate_up, 2 * intermediate, dim));
        expected.push(("down", &mlp.down, dim, intermediate));
    }
    for (what, projection, out, input) in expected {
        let format = projection.weight.format();
        if format.is_k() {
            // Not wrong, but not yet proved: the stack's tests hold it to the layers' kernels
            // for the formats of blocks of 32 only.
            return Err(invalid(format!(
                "the {what} projection is {format:?}: the fused decode step does not run \
                 K-quants yet"
            )));
        }
        let (n, k) = projection.weight.shape();
        if (n, k) != (out, input) || out == 0 {
            return Err(invalid(format!(
                "the {what} projection is [{n}, {k}], expected [{out}, {input}]"
            )));
        }
        if let Some(bias) = projection.bias {
            check_len("a bias", bias.len(), out)?;
        }
        if matches!(projection.weight, Weight::Blocks(_)) && projection.one_int8_from.is_some() {
            return Err(invalid(format!(
                "the {what} projection is blocks, which have no one-int8 kernel"
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
