//! `srt._rust.DecoderStack`: the binding of `srt_kernels::decoder`. A stack holds the buffers of
//! every layer (norm weights, quantized projections and their float32 biases, a mixture's
//! float32 router, the layer's K/V caches), described by typed specs (`LayerSpec`,
//! `ProjectionSpec`, `MoeSpec`: keyword fields, which the stub in `_rust.pyi` names and a test
//! holds to the binding's) and acquired once when it is made, so that a decode step passes only its own tensors:
//! the hidden state, the residual stream, the rotary tables, the output slots, the sequences'
//! slots and lengths. Float32 buffers, or bfloat16 bits as int16, all of one type. The core
//! checks every size and slot before anything is written; writability and overlap are checked
//! here (the caches when the stack is made, the step's outputs at every step).

use std::ptr::NonNull;

use pyo3::buffer::{Element as BufferElement, PyBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::decoder::{
    self, DecoderLayer, Experts, FeedForward, Heads, Mlp, Projection, Tokens, Weight,
};
use srt_kernels::element::{Bf16, Element};
use srt_kernels::quant::{Format, PackedKernel, PackedMatrix, QuantMatrix};

use crate::boundary::{contiguous, overlap};
use crate::to_py_err;

/// A quantized projection of a decoder layer (`decoder::Projection`'s fields): its format, its
/// tiles (`packed`) or blocks, its shape, optional float32 bias, and the rows from which its
/// product rounds activations to one int8. The buffers are held from here on.
#[pyclass(frozen, module = "srt._rust")]
struct ProjectionSpec {
    format: Format,
    packed: bool,
    bytes: PyBuffer<u8>,
    shape: (usize, usize),
    bias: Option<PyBuffer<f32>>,
    one_int8_from: Option<usize>,
}

#[pymethods]
impl ProjectionSpec {
    #[new]
    #[pyo3(signature = (*, format, packed, weight, out_features, in_features, bias, one_int8_from))]
    fn new(
        format: &str,
        packed: bool,
        weight: PyBuffer<u8>,
        out_features: usize,
        in_features: usize,
        bias: Option<PyBuffer<f32>>,
        one_int8_from: Option<usize>,
    ) -> PyResult<Self> {
        Ok(ProjectionSpec {
            format: Format::parse(format).map_err(to_py_err)?,
            packed,
            bytes: weight,
            shape: (out_features, in_features),
            bias,
            one_int8_from,
        })
    }
}

/// A sparse mixture of experts of a decoder layer (`decoder::Experts`' fields): the router's
/// float32 `[experts, hidden_size]` weight, each expert's gate/up and down projections, how
/// many experts each token takes, and whether their weights are divided by their sum. The
/// buffers are held from here on.
#[pyclass(frozen, module = "srt._rust")]
struct MoeSpec {
    router: PyBuffer<f32>,
    gate_up: Vec<Py<ProjectionSpec>>,
    down: Vec<Py<ProjectionSpec>>,
    top_k: usize,
    renormalize: bool,
}

#[pymethods]
impl MoeSpec {
    #[new]
    #[pyo3(signature = (*, router, gate_up, down, top_k, renormalize))]
    fn new(
        router: PyBuffer<f32>,
        gate_up: Vec<Py<ProjectionSpec>>,
        down: Vec<Py<ProjectionSpec>>,
        top_k: usize,
        renormalize: bool,
    ) -> PyResult<Self> {
        if gate_up.is_empty() || gate_up.len() != down.len() {
            return Err(PyValueError::new_err(format!(
                "a mixture has a gate_up and a down projection per expert, not {} and {}",
                gate_up.len(),
                down.len()
            )));
        }
        Ok(MoeSpec {
            router,
            gate_up,
            down,
            top_k,
            renormalize,
        })
    }
}

/// A layer's feed-forward: the gated MLP's two projections, or a mixture of experts.
enum FeedForwardSpec {
    Dense(Py<ProjectionSpec>, Py<ProjectionSpec>),
    Sparse(Py<MoeSpec>),
}

impl FeedForwardSpec {
    fn clone_ref(&self, py: Python<'_>) -> FeedForwardSpec {
        match self {
            FeedForwardSpec::Dense(gate_up, down) => {
                FeedForwardSpec::Dense(gate_up.clone_ref(py), down.clone_ref(py))
            }
            FeedForwardSpec::Sparse(moe) => FeedForwardSpec::Sparse(moe.clone_ref(py)),
        }
    }
}

/// A decoder layer's buffers (`decoder::DecoderLayer`'s): its norm weights (with per-head q
/// and k norms where the model has them, as Qwen3 does), its projections (q/k/v and o, then
/// the gated MLP's `gate_up` and `down`, or a mixture of experts, `moe`) and K/V caches. The
/// norms and caches are float32, or bfloat16 bits as int16, of one type for the whole stack:
/// `DecoderStack` reads them as that type.
#[pyclass(frozen, module = "srt._rust")]
struct LayerSpec {
    input_norm: Py<PyAny>,
    qkv: Py<ProjectionSpec>,
    o: Py<ProjectionSpec>,
    q_norm: Option<Py<PyAny>>,
    k_norm: Option<Py<PyAny>>,
    post_norm: Py<PyAny>,
    feed_forward: FeedForwardSpec,
    k_cache: Py<PyAny>,
    v_cache: Py<PyAny>,
}

#[pymethods]
impl LayerSpec {
    #[new]
    #[pyo3(signature = (
        *, input_norm, qkv, o, post_norm, k_cache, v_cache, gate_up=None, down=None, moe=None,
        q_norm=None, k_norm=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        input_norm: Py<PyAny>,
        qkv: Py<ProjectionSpec>,
        o: Py<ProjectionSpec>,
        post_norm: Py<PyAny>,
        k_cache: Py<PyAny>,
        v_cache: Py<PyAny>,
        gate_up: Option<Py<ProjectionSpec>>,
        down: Option<Py<ProjectionSpec>>,
        moe: Option<Py<MoeSpec>>,
        q_norm: Option<Py<PyAny>>,
        k_norm: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        if q_norm.is_some() != k_norm.is_some() {
            return Err(PyValueError::new_err(
                "a layer has both per-head norms (q_norm and k_norm) or neither",
            ));
        }
        let feed_forward = match (gate_up, down, moe) {
            (Some(gate_up), Some(down), None) => FeedForwardSpec::Dense(gate_up, down),
            (None, None, Some(moe)) => FeedForwardSpec::Sparse(moe),
            _ => {
                return Err(PyValueError::new_err(
                    "a layer's feed-forward is gate_up and down, or moe",
                ))
            }
        };
        Ok(LayerSpec {
            input_norm,
            qkv,
            o,
            q_norm,
            k_norm,
            post_norm,
            feed_forward,
            k_cache,
            v_cache,
        })
    }
}

/// One layer's buffers, norms and caches of element `P` (f32, or i16 holding bf16 bits).
struct LayerBuffers<P> {
    input_norm: PyBuffer<P>,
    qkv: Py<ProjectionSpec>,
    o: Py<ProjectionSpec>,
    qk_norms: Option<(PyBuffer<P>, PyBuffer<P>)>,
    post_norm: PyBuffer<P>,
    feed_forward: FeedForwardSpec,
    k_cache: PyBuffer<P>,
    v_cache: PyBuffer<P>,
}

impl<P> LayerBuffers<P> {
    /// Every projection, in the order the layer runs them (a mixture's expert by expert).
    fn projections(&self) -> Vec<&ProjectionSpec> {
        let mut projections = vec![self.qkv.get(), self.o.get()];
        match &self.feed_forward {
            FeedForwardSpec::Dense(gate_up, down) => {
                projections.extend([gate_up.get(), down.get()])
            }
            FeedForwardSpec::Sparse(moe) => {
                let moe = moe.get();
                for (gate_up, down) in moe.gate_up.iter().zip(&moe.down) {
                    projections.extend([gate_up.get(), down.get()]);
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
            Layers::Bf16(layers) => check_caches(layers, bf16_cast)?,
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
                step(py, self, layers, floats, &ids, bf16_cast)
            }
        }
    }
}

fn bf16_cast(buffer: NonNull<[i16]>) -> NonNull<[Bf16]> {
    crate::boundary::bf16_bits(buffer)
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

/// A projection's weight over its held buffer, its length checked against its shape.
fn weight(projection: &ProjectionSpec) -> PyResult<Weight<'_>> {
    let bytes = contiguous("a projection", &projection.bytes, false)?;
    let (format, (n, k)) = (projection.format, projection.shape);
    // SAFETY: the buffer is held by the stack, which outlives the returned borrow; nothing
    // writes it while a step runs (every writable buffer is checked not to overlap it).
    let bytes = unsafe { bytes.as_ref() };
    if projection.packed {
        PackedMatrix::new(format, bytes, n, k).map(Weight::Packed)
    } else {
        QuantMatrix::new(format, bytes, n, k).map(Weight::Blocks)
    }
    .map_err(to_py_err)
}

/// A projection over its held buffers.
fn projection(buffers: &ProjectionSpec) -> PyResult<Projection<'_>> {
    let bias = buffers
        .bias
        .as_ref()
        .map(|b| contiguous("a bias", b, false))
        .transpose()?;
    // SAFETY: the stack holds the bias acquired; nothing writes it during the step (every
    // writable buffer is checked not to overlap it).
    let bias = bias.map(|b| unsafe { b.as_ref() });
    Ok(Projection {
        weight: weight(buffers)?,
        bias,
        one_int8_from: buffers.one_int8_from,
    })
}

/// A gated MLP over its projections' held buffers.
fn mlp<'a>(gate_up: &'a Py<ProjectionSpec>, down: &'a Py<ProjectionSpec>) -> PyResult<Mlp<'a>> {
    Ok(Mlp {
        gate_up: projection(gate_up.get())?,
        down: projection(down.get())?,
    })
}

/// A layer's feed-forward over its held buffers.
fn feed_forward(spec: &FeedForwardSpec) -> PyResult<FeedForward<'_>> {
    Ok(match spec {
        FeedForwardSpec::Dense(gate_up, down) => FeedForward::Dense(mlp(gate_up, down)?),
        FeedForwardSpec::Sparse(moe) => {
            let moe = moe.get();
            let router = contiguous("a router", &moe.router, false)?;
            FeedForward::Sparse(Experts {
                // SAFETY: as the projections' weights.
                router: unsafe { router.as_ref() },
                experts: moe
                    .gate_up
                    .iter()
                    .zip(&moe.down)
                    .map(|(gate_up, down)| mlp(gate_up, down))
                    .collect::<PyResult<_>>()?,
                top_k: moe.top_k,
                renormalize: moe.renormalize,
            })
        }
    })
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
            qkv: projection(layer.qkv.get())?,
            o: projection(layer.o.get())?,
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
