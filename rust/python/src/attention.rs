//! `srt._rust.decode_attention`, `prefill_attention_bf16` and `prefill_attention_paged_bf16`:
//! the binding of `srt_kernels::attention`. The query, the layer's K and V caches and the output
//! arrive as float32 numpy views of CPU tensors, or int16 views of the bits for bf16 (decode
//! attention takes either: the buffers' format says which), the slots and lengths as int32
//! buffers; every length and slot is checked by the core before any is read.

use std::ptr::NonNull;

use pyo3::buffer::{Element as BufferElement, PyBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::attention::prefill::{self, PrefillShape};
use srt_kernels::attention::{self, DecodeShape};
use srt_kernels::element::Element;

use crate::boundary::{bf16_bits, contiguous, overlap, SameFloats};
use crate::to_py_err;

/// `out[b] = softmax(q[b] · Kᵀ · scale) · V` over the first `seq_lens[b]` slots of row `b` of
/// `slots` (`[batch, width]`), for each query head against its KV head. The query, caches and
/// output are float32, or bf16 (int16 views of their bits: float32 arithmetic, the output
/// rounded once), all of one type.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn decode_attention(
    py: Python<'_>,
    q: &Bound<'_, PyAny>,
    k_cache: &Bound<'_, PyAny>,
    v_cache: &Bound<'_, PyAny>,
    slots: PyBuffer<i32>,
    seq_lens: PyBuffer<i32>,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let kv = Kv {
        slots,
        seq_lens,
        kv_heads,
        head_dim,
        scale,
    };
    let buffers = SameFloats::get([
        ("the query", q),
        ("the K cache", k_cache),
        ("the V cache", v_cache),
        ("the output", out),
    ])?;
    match buffers {
        SameFloats::F32(buffers) => attend(py, buffers, &kv, |b| b),
        SameFloats::Bf16(buffers) => attend(py, buffers, &kv, bf16_bits),
    }
}

/// The arguments that do not depend on the element type.
struct Kv {
    slots: PyBuffer<i32>,
    seq_lens: PyBuffer<i32>,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
}

fn attend<P: BufferElement, T: Element>(
    py: Python<'_>,
    [q, k_cache, v_cache, out]: [PyBuffer<P>; 4],
    kv: &Kv,
    cast: fn(NonNull<[P]>) -> NonNull<[T]>,
) -> PyResult<()> {
    let Kv {
        kv_heads,
        head_dim,
        scale,
        ..
    } = *kv;
    let query = cast(contiguous("the query", &q, false)?);
    let keys = cast(contiguous("the K cache", &k_cache, false)?);
    let values = cast(contiguous("the V cache", &v_cache, false)?);
    let slot_ids = contiguous("the slots", &kv.slots, false)?;
    let lens = contiguous("the sequence lengths", &kv.seq_lens, false)?;
    let output = cast(contiguous("the output", &out, true)?);
    if overlap(query, output)
        || overlap(keys, output)
        || overlap(values, output)
        || overlap(slot_ids, output)
        || overlap(lens, output)
    {
        return Err(PyValueError::new_err("the output overlaps an input"));
    }
    let batch = lens.len();
    // The shape is inferred from the buffers' lengths; the caller's sizes are multiplied with
    // checks (a wrapped product could be zero, or let the core's length checks pass).
    let (Some(per_query), Some(per_row)) =
        (batch.checked_mul(head_dim), kv_heads.checked_mul(head_dim))
    else {
        return Err(PyValueError::new_err(format!(
            "{kv_heads} K/V heads of {head_dim} floats for {batch} sequences do not fit in memory"
        )));
    };
    if per_query == 0 || per_row == 0 {
        return Err(PyValueError::new_err(
            "decode attention needs sequences and K/V heads",
        ));
    }
    let shape = DecodeShape {
        batch,
        heads: query.len() / per_query,
        kv_heads,
        head_dim,
        pool_slots: keys.len() / per_row,
        width: slot_ids.len() / batch,
    };
    // SAFETY: every buffer stays acquired until this function returns; the output overlaps
    // none of the inputs, so the one mutable slice aliases nothing; `cast` keeps the bytes and
    // their count.
    let (query, keys, values, slot_ids, lens, output) = unsafe {
        (
            query.as_ref(),
            keys.as_ref(),
            values.as_ref(),
            slot_ids.as_ref(),
            lens.as_ref(),
            &mut *output.as_ptr(),
        )
    };
    py.detach(|| {
        attention::decode_attention(&shape, query, keys, values, slot_ids, lens, scale, output)
    })
    .map_err(to_py_err)
}

/// Causal attention of one sequence's `new` tokens (bf16 `q`, `[new, heads, head_dim]`) over
/// its `prefix` cached tokens and themselves (bf16 `k`, `v`, `[prefix + new, kv_heads,
/// head_dim]`), into bf16 `out` (q's shape); `new` is inferred from q's length.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn prefill_attention_bf16(
    py: Python<'_>,
    q: PyBuffer<i16>,
    k: PyBuffer<i16>,
    v: PyBuffer<i16>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    prefix: usize,
    scale: f32,
    out: PyBuffer<i16>,
) -> PyResult<()> {
    let query = bf16_bits(contiguous("the query", &q, false)?);
    let keys = bf16_bits(contiguous("K", &k, false)?);
    let values = bf16_bits(contiguous("V", &v, false)?);
    let output = bf16_bits(contiguous("the output", &out, true)?);
    if overlap(query, output) || overlap(keys, output) || overlap(values, output) {
        return Err(PyValueError::new_err("the output overlaps an input"));
    }
    let per_token = heads
        .checked_mul(head_dim)
        .filter(|&n| n > 0)
        .ok_or_else(|| PyValueError::new_err(format!("{heads} heads of {head_dim} elements")))?;
    let shape = PrefillShape {
        heads,
        kv_heads,
        head_dim,
        prefix,
        new: query.len() / per_token,
    };
    // SAFETY: every buffer stays acquired until this function returns; the output overlaps
    // none of the inputs, so the one mutable slice aliases nothing; `bf16_bits` keeps the
    // bytes and their count. The core checks every length against `shape`.
    let (query, keys, values, output) = unsafe {
        (
            query.as_ref(),
            keys.as_ref(),
            values.as_ref(),
            &mut *output.as_ptr(),
        )
    };
    py.detach(|| prefill::prefill_attention(&shape, query, keys, values, scale, output))
        .map_err(to_py_err)
}

/// Causal attention of a pass's sequences at once (bf16 `q`, `[tokens, heads, head_dim]`, the
/// sequences' new tokens in order) over their keys in a layer's caches (bf16 `k_cache`,
/// `v_cache`, `[slots, kv_heads, head_dim]`): sequence `i` has `prefix_lens[i]` cached tokens
/// then `new_lens[i]` new ones, whose slots follow one another in `slots` (int32), into bf16
/// `out` (q's shape).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn prefill_attention_paged_bf16(
    py: Python<'_>,
    q: PyBuffer<i16>,
    k_cache: PyBuffer<i16>,
    v_cache: PyBuffer<i16>,
    slots: PyBuffer<i32>,
    prefix_lens: PyBuffer<i32>,
    new_lens: PyBuffer<i32>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    out: PyBuffer<i16>,
) -> PyResult<()> {
    let query = bf16_bits(contiguous("the query", &q, false)?);
    let keys = bf16_bits(contiguous("the K cache", &k_cache, false)?);
    let values = bf16_bits(contiguous("the V cache", &v_cache, false)?);
    let output = bf16_bits(contiguous("the output", &out, true)?);
    let ids = [
        contiguous("the slots", &slots, false)?,
        contiguous("the prefix lengths", &prefix_lens, false)?,
        contiguous("the new lengths", &new_lens, false)?,
    ];
    if overlap(query, output) || overlap(keys, output) || overlap(values, output) {
        return Err(PyValueError::new_err("the output overlaps an input"));
    }
    if ids.iter().any(|&ids| overlap(ids, output)) {
        return Err(PyValueError::new_err(
            "the output overlaps the slots or lengths",
        ));
    }
    // SAFETY: every buffer stays acquired until this function returns; the output overlaps
    // none of the inputs, so the one mutable slice aliases nothing; `bf16_bits` keeps the
    // bytes and their count. The core checks every length and slot.
    let (query, keys, values, output, [slots, prefix_lens, new_lens]) = unsafe {
        (
            query.as_ref(),
            keys.as_ref(),
            values.as_ref(),
            &mut *output.as_ptr(),
            ids.map(|ids| ids.as_ref()),
        )
    };
    let batch = prefill::PagedBatch {
        heads,
        kv_heads,
        head_dim,
        prefix_lens,
        new_lens,
        slots,
    };
    py.detach(|| prefill::prefill_attention_paged(&batch, query, keys, values, scale, output))
        .map_err(to_py_err)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(prefill_attention_bf16, m)?)?;
    m.add_function(wrap_pyfunction!(prefill_attention_paged_bf16, m)?)?;
    m.add_function(wrap_pyfunction!(decode_attention, m)?)
}
