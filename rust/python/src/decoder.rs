//! `srt._rust.DecoderStack`: the binding of `srt_kernels::decoder`. A stack holds the buffers of
//! every layer (norm weights, quantized projections and their float32 biases, a mixture's
//! float32 router, the layer's K/V caches), described by typed specs (`specs.rs`) and acquired
//! once when it is made, so that a decode step passes only its own tensors: the hidden state,
//! the residual stream, the rotary tables, the output slots, the sequences' slots and lengths.
//! Float32 buffers, or bfloat16 bits as int16, all of one type. The core checks every size and
//! slot before anything is written; writability and overlap are checked here (the caches when
//! the stack is made, the step's outputs at every step).

use std::ptr::NonNull;

use pyo3::buffer::{Element as BufferElement, PyBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::decoder::{self, DecoderLayer, Heads, Tokens};
use srt_kernels::element::Element;
use srt_kernels::quant::PackedKernel;

use crate::boundary::{bf16_bits, contiguous, overlap};
use crate::to_py_err;

mod specs;

use specs::{
    feed_forward, projection, weight, FeedForwardSpec, LayerSpec, MoeSpec, Parts, ProjectionSpec,
};

/// One layer's buffers, norms and caches of element `P` (f32, or i16 holding bf16 bits).
struct LayerBuffers<P> {
    input_norm: PyBuffer<P>,
    qkv: Parts,
    o: Parts,
    qk_norms: Option<(PyBuffer<P>, PyBuffer<P>)>,
    post_norm: PyBuffer<P>,
    feed_forward: FeedForwardSpec,
    k_cache: PyBuffer<P>,
    v_cache: PyBuffer<P>,
}

impl<P> LayerBuffers<P> {
    /// Every part of every projection, in the order the layer runs them (a mixture's expert
    /// by expert).
    fn projections(&self) -> Vec<&ProjectionSpec> {
        let mut projections: Vec<_> = self.qkv.specs().chain(self.o.specs()).collect();
        match &self.feed_forward {
            FeedForwardSpec::Dense(gate_up, down) => {
                projections.extend(gate_up.specs().chain(down.specs()))
            }
            FeedForwardSpec::Sparse(moe) => {
                let moe = moe.get();
                for (gate_up, down) in moe.gate_up.iter().zip(&moe.down) {
                    projections.extend(gate_up.specs().chain(down.specs()));
                }
            }
        }
        projections
    }
}

enum Layers {
    F32(Vec<LayerBuffers<f32>>),
    Bf16(Vec<LayerBuffers<i16>>),
}

/// A stack of decoder layers with quantized projections, run one decode step at a time.
#[pyclass(frozen, module = "srt._rust")]
struct DecoderStack {
    heads: Heads,
    layers: Layers,
}

#[pymethods]
impl DecoderStack {
    /// `layers`: every layer's `LayerSpec`, the norms and caches all float32 or all bfloat16
    /// bits (int16).
    #[new]
    #[pyo3(signature = (heads, kv_heads, head_dim, eps, scale, layers))]
    fn new(
        py: Python<'_>,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        eps: f32,
        scale: f32,
        layers: Vec<Py<LayerSpec>>,
    ) -> PyResult<Self> {
        let heads = Heads {
            heads,
            kv_heads,
            head_dim,
            eps,
            scale,
        };
        let float32 = match layers.first() {
            Some(first) => PyBuffer::<f32>::get(first.get().input_norm.bind(py)).is_ok(),
            None => true,
        };
        let layers = if float32 {
            Layers::F32(collect(py, &layers)?)
        } else {
            Layers::Bf16(collect(py, &layers)?)
        };
        let stack = DecoderStack { heads, layers };
        match &stack.layers {
            Layers::F32(layers) => check_caches(layers, |b| b)?,
            Layers::Bf16(layers) => check_caches(layers, bf16_bits)?,
        }
        Ok(stack)
    }

    /// The number of layers.
    fn __len__(&self) -> usize {
        match &self.layers {
            Layers::F32(layers) => layers.len(),
            Layers::Bf16(layers) => layers.len(),
        }
    }

    /// One decode step: `hidden` (`[batch, hidden_size]`, the first layer's input, replaced by
    /// the last layer's output) and `residual` (same shape, updated in place), each token's
    /// rotary `cos` and signed `sin` (`[batch, head_dim]`), its output slot (int64), and each
    /// sequence's slots (`[batch, width]` int32) and length (int32), the new token included.
    #[allow(clippy::too_many_arguments)]
    fn decode(
        &self,
        py: Python<'_>,
        hidden: &Bound<'_, PyAny>,
        residual: &Bound<'_, PyAny>,
        cos: &Bound<'_, PyAny>,
        sin: &Bound<'_, PyAny>,
        out_slots: PyBuffer<i64>,
        slots: PyBuffer<i32>,
        seq_lens: PyBuffer<i32>,
    ) -> PyResult<()> {
        let ids = (out_slots, slots, seq_lens);
        match &self.layers {
            Layers::F32(layers) => {
                let floats = [hidden, residual, cos, sin].map(PyBuffer::<f32>::get);
                step(py, self, layers, floats, &ids, |b| b)
            }
            Layers::Bf16(layers) => {
                let floats = [hidden, residual, cos, sin].map(PyBuffer::<i16>::get);
                step(py, self, layers, floats, &ids, bf16_bits)
            }
        }
    }
}

fn collect<P: BufferElement>(
    py: Python<'_>,
    layers: &[Py<LayerSpec>],
) -> PyResult<Vec<LayerBuffers<P>>> {
    layers
        .iter()
        .map(|layer| {
            let layer = layer.get();
            let floats = |buffer: &Py<PyAny>| -> PyResult<PyBuffer<P>> {
                PyBuffer::get(buffer.bind(py)).map_err(|_| {
                    PyValueError::new_err(
                        "the norms and caches must all be float32 or all int16 (bfloat16 bits)",
                    )
                })
            };
            Ok(LayerBuffers {
                input_norm: floats(&layer.input_norm)?,
                qkv: layer.qkv.clone_ref(py),
                o: layer.o.clone_ref(py),
                qk_norms: match (&layer.q_norm, &layer.k_norm) {
                    (Some(q), Some(k)) => Some((floats(q)?, floats(k)?)),
                    _ => None,
                },
                post_norm: floats(&layer.post_norm)?,
                feed_forward: layer.feed_forward.clone_ref(py),
                k_cache: floats(&layer.k_cache)?,
                v_cache: floats(&layer.v_cache)?,
            })
        })
        .collect()
}

/// Every buffer the stack reads, as bytes: the caches, then everything else.
fn read_only<P: BufferElement>(layer: &LayerBuffers<P>) -> PyResult<Vec<NonNull<[u8]>>> {
    let mut buffers = vec![bytes(contiguous("a norm", &layer.input_norm, false)?)];
    buffers.push(bytes(contiguous("a norm", &layer.post_norm, false)?));
    for norm in layer.qk_norms.iter().flat_map(|(q, k)| [q, k]) {
        buffers.push(bytes(contiguous("a norm", norm, false)?));
    }
    for projection in layer.projections() {
        buffers.push(contiguous("a projection", &projection.bytes, false)?);
        if let Some(bias) = &projection.bias {
            buffers.push(bytes(contiguous("a bias", bias, false)?));
        }
    }
    if let FeedForwardSpec::Sparse(moe) = &layer.feed_forward {
        buffers.push(bytes(contiguous("a router", &moe.get().router, false)?));
    }
    Ok(buffers)
}

/// A buffer's memory as bytes (the same addresses), for overlap checks across element types.
fn bytes<T>(buffer: NonNull<[T]>) -> NonNull<[u8]> {
    NonNull::slice_from_raw_parts(buffer.cast::<u8>(), buffer.len() * size_of::<T>())
}

/// The caches: writable, contiguous, not overlapping one another or any weight of the stack.
fn check_caches<P: BufferElement, T: Element>(
    layers: &[LayerBuffers<P>],
    cast: fn(NonNull<[P]>) -> NonNull<[T]>,
) -> PyResult<()> {
    let mut caches = Vec::new();
    let mut weights = Vec::new();
    for layer in layers {
        for cache in [&layer.k_cache, &layer.v_cache] {
            caches.push(bytes(cast(contiguous("a K/V cache", cache, true)?)));
        }
        weights.extend(read_only(layer)?);
        for projection in layer.projections() {
            weight(projection)?;
        }
    }
    for (i, cache) in caches.iter().enumerate() {
        if caches[i + 1..]
            .iter()
            .chain(&weights)
            .any(|&other| overlap(*cache, other))
        {
            return Err(PyValueError::new_err(
                "a K/V cache overlaps another cache or a weight of the stack",
            ));
        }
    }
    Ok(())
}

/// A step's id buffers: the output slots (int64), the sequences' slots and lengths (int32).
type StepIds = (PyBuffer<i64>, PyBuffer<i32>, PyBuffer<i32>);

fn step<P: BufferElement, T: Element>(
    py: Python<'_>,
    stack: &DecoderStack,
    layers: &[LayerBuffers<P>],
    floats: [PyResult<PyBuffer<P>>; 4],
    (out_slots, slots, seq_lens): &StepIds,
    cast: fn(NonNull<[P]>) -> NonNull<[T]>,
) -> PyResult<()> {
    let [hidden, residual, cos, sin] = floats.map(|buffer| {
        buffer.map_err(|_| {
            PyValueError::new_err(
                "the hidden state, residual, cos and sin must be of the stack's type (float32 or \
                 int16 bfloat16 bits)",
            )
        })
    });
    let (hidden, residual, cos, sin) = (hidden?, residual?, cos?, sin?);
    let outputs = [
        cast(contiguous("the hidden state", &hidden, true)?),
        cast(contiguous("the residual", &residual, true)?),
    ];
    let (cos, sin) = (
        cast(contiguous("the cosines", &cos, false)?),
        cast(contiguous("the sines", &sin, false)?),
    );
    let out_slots = contiguous("the output slots", out_slots, false)?;
    let (slots, seq_lens) = (
        contiguous("the slots", slots, false)?,
        contiguous("the sequence lengths", seq_lens, false)?,
    );
    let step_inputs = [
        bytes(cos),
        bytes(sin),
        bytes(out_slots),
        bytes(slots),
        bytes(seq_lens),
    ];
    let mut caches = Vec::with_capacity(2 * layers.len());
    let mut weights = Vec::new();
    for layer in layers {
        caches.push(cast(contiguous("a K/V cache", &layer.k_cache, true)?));
        caches.push(cast(contiguous("a K/V cache", &layer.v_cache, true)?));
        weights.extend(read_only(layer)?);
    }
    // The caches overlap neither one another nor the weights (checked when the stack was made).
    let cache_bytes: Vec<NonNull<[u8]>> = caches.iter().map(|&c| bytes(c)).collect();
    let [hidden_bytes, residual_bytes] = outputs.map(bytes);
    if overlap(hidden_bytes, residual_bytes)
        || [hidden_bytes, residual_bytes].iter().any(|&out| {
            step_inputs
                .iter()
                .chain(&cache_bytes)
                .chain(&weights)
                .any(|&other| overlap(out, other))
        })
        || step_inputs
            .iter()
            .any(|&input| cache_bytes.iter().any(|&cache| overlap(input, cache)))
    {
        return Err(PyValueError::new_err(
            "the hidden state, the residual, the step's inputs and the K/V caches must not \
             overlap",
        ));
    }
    let mut core = Vec::with_capacity(layers.len());
    for (layer, cache) in layers.iter().zip(caches.chunks_exact(2)) {
        let norm = |buffer: &PyBuffer<P>| -> PyResult<&[T]> {
            // SAFETY: as the projections'.
            Ok(unsafe { cast(contiguous("a norm", buffer, false)?).as_ref() })
        };
        // SAFETY: the caches are writable, held by the stack, and overlap no other buffer of
        // the step, so each mutable slice is the only reference to its memory.
        let (k_cache, v_cache) = unsafe { (&mut *cache[0].as_ptr(), &mut *cache[1].as_ptr()) };
        core.push(DecoderLayer {
            input_norm: norm(&layer.input_norm)?,
            qkv: projection(&layer.qkv)?,
            o: projection(&layer.o)?,
            qk_norms: match &layer.qk_norms {
                Some((q, k)) => Some((norm(q)?, norm(k)?)),
                None => None,
            },
            post_norm: norm(&layer.post_norm)?,
            feed_forward: feed_forward(&layer.feed_forward)?,
            k_cache,
            v_cache,
        });
    }
    // SAFETY: every buffer stays acquired until this function returns; the two outputs overlap
    // nothing else of the step (checked above).
    let (hidden, residual, tokens) = unsafe {
        (
            &mut *outputs[0].as_ptr(),
            &mut *outputs[1].as_ptr(),
            Tokens {
                cos: cos.as_ref(),
                sin: sin.as_ref(),
                out_slots: out_slots.as_ref(),
                slots: slots.as_ref(),
                seq_lens: seq_lens.as_ref(),
            },
        )
    };
    let kernel = PackedKernel::best().unwrap_or(PackedKernel::Portable);
    py.detach(|| decoder::decode_layers(kernel, &stack.heads, &mut core, &tokens, hidden, residual))
        .map_err(to_py_err)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ProjectionSpec>()?;
    m.add_class::<MoeSpec>()?;
    m.add_class::<LayerSpec>()?;
    m.add_class::<DecoderStack>()
}
