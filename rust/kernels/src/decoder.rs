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

use crate::attention;
use crate::element::Element;
use crate::moe;
use crate::ops;
use crate::quant::{self, linear_packed, PackedKernel, PackedMatrix, QuantMatrix};
use crate::Result;

mod check;
#[cfg(test)]
mod tests;

use check::check;
#[cfg(test)]
use check::check_layer;

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

/// One weight of a projection, its bias, and from how many rows its product rounds activations
/// to one int8.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    pub weight: Weight<'a>,
    /// `out_features` floats, when the part has a bias.
    pub bias: Option<&'a [f32]>,
    /// Steps of at least this many rows take `quant::linear_packed_one_int8` (activations
    /// rounded to one int8 per value) where fewer take `linear_packed` (two int8 parts), as
    /// the part's plan in `QuantizedWeight.linear` does; `None`: every step takes
    /// `linear_packed`. Only for packed weights of blocks of 32 (the K-quants have no
    /// one-int8 kernel).
    pub one_int8_from: Option<usize>,
}

/// A projection: its parts' outputs side by side, in order. One part, or for a fused weight
/// whose checkpoint shards differ in format (llama.cpp's Q4_K_M: q and k in Q4_K, v in Q6_K),
/// one per format, as `QuantizedParts` holds them in Python.
#[derive(Debug, Clone)]
pub struct Projection<'a> {
    pub parts: Vec<Part<'a>>,
}

impl Projection<'_> {
    /// The parts' outputs together.
    pub fn out_features(&self) -> usize {
        self.parts.iter().map(|part| part.weight.shape().0).sum()
    }
}

impl<'a> From<Part<'a>> for Projection<'a> {
    fn from(part: Part<'a>) -> Self {
        Projection { parts: vec![part] }
    }
}

/// A gated MLP: `gate_up` has `2 · intermediate` outputs (gate, then up), `down` takes them
/// back to the hidden size.
#[derive(Debug, Clone)]
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
    let intermediate = mlp.gate_up.out_features() / 2;
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

/// `out = x · Wᵀ + bias` for `rows` rows of `x`: each part's product (`product`) into its
/// columns of `out`, directly where there is one part.
fn project<T: Element>(
    kernel: PackedKernel,
    projection: &Projection<'_>,
    x: &[T],
    rows: usize,
    out: &mut [T],
) -> Result<()> {
    if let [part] = &projection.parts[..] {
        return product(kernel, part, x, rows, out);
    }
    let width = out.len() / rows;
    let mut start = 0;
    let mut columns = Vec::new();
    for part in &projection.parts {
        let n = part.weight.shape().0;
        columns.resize(rows * n, T::store(0.0));
        product(kernel, part, x, rows, &mut columns)?;
        for (out, part_out) in out.chunks_exact_mut(width).zip(columns.chunks_exact(n)) {
            out[start..start + n].copy_from_slice(part_out);
        }
        start += n;
    }
    Ok(())
}

/// `out = x · Wᵀ + bias` of one part, as `QuantizedWeight.linear` computes it for decode-sized
/// products: on tiles in the activations' type (two int8 parts, or one from `one_int8_from`
/// rows); on blocks in float32, the output then rounded to `T`.
fn product<T: Element>(
    kernel: PackedKernel,
    part: &Part<'_>,
    x: &[T],
    rows: usize,
    out: &mut [T],
) -> Result<()> {
    match &part.weight {
        Weight::Packed(weight) if part.one_int8_from.is_some_and(|from| rows >= from) => {
            quant::linear_packed_one_int8(kernel, weight, x, rows, part.bias, out)
        }
        Weight::Packed(weight) => linear_packed(kernel, weight, x, rows, part.bias, out),
        Weight::Blocks(weight) => {
            let input: Vec<f32> = x.iter().map(|v| v.load()).collect();
            let mut product = vec![0f32; out.len()];
            quant::linear(weight, &input, rows, part.bias, &mut product)?;
            for (o, &p) in out.iter_mut().zip(&product) {
                *o = T::store(p);
            }
            Ok(())
        }
    }
}
