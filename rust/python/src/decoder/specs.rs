//! The typed specs a Python model's layers cross into Rust as (`ProjectionSpec`, `MoeSpec`,
//! `LayerSpec`: keyword fields, which the stub in `_rust.pyi` names and a test holds to the
//! binding's), and their held buffers read as the core's structures (`decoder::Projection`,
//! `Mlp`, `FeedForward`) for one step. A layer spec takes each projection as one
//! `ProjectionSpec` or a list of them, its parts (`Parts`).

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::decoder::{Experts, FeedForward, Mlp, Part, Projection, Weight};
use srt_kernels::quant::{Format, PackedMatrix, QuantMatrix};

use crate::boundary::contiguous;
use crate::to_py_err;

/// A quantized projection of a decoder layer (`decoder::Projection`'s fields): its format, its
/// tiles (`packed`) or blocks, its shape, optional float32 bias, and the rows from which its
/// product rounds activations to one int8. The buffers are held from here on.
#[pyclass(frozen, module = "srt._rust")]
pub(crate) struct ProjectionSpec {
    format: Format,
    packed: bool,
    pub(super) bytes: PyBuffer<u8>,
    shape: (usize, usize),
    pub(super) bias: Option<PyBuffer<f32>>,
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

/// A projection as a layer spec takes it: one `ProjectionSpec`, or a list of them whose outputs
/// sit side by side (a fused weight whose shards differ in format, `QuantizedParts`).
#[derive(FromPyObject)]
pub(crate) enum ProjectionArg {
    One(Py<ProjectionSpec>),
    Parts(Vec<Py<ProjectionSpec>>),
}

/// A projection's parts (one or more), held.
pub(crate) struct Parts(Vec<Py<ProjectionSpec>>);

impl Parts {
    fn new(what: &str, arg: ProjectionArg) -> PyResult<Parts> {
        match arg {
            ProjectionArg::One(spec) => Ok(Parts(vec![spec])),
            ProjectionArg::Parts(specs) if specs.is_empty() => Err(PyValueError::new_err(format!(
                "the {what} projection has no parts"
            ))),
            ProjectionArg::Parts(specs) => Ok(Parts(specs)),
        }
    }

    pub(super) fn clone_ref(&self, py: Python<'_>) -> Parts {
        Parts(self.0.iter().map(|spec| spec.clone_ref(py)).collect())
    }

    /// Each part's spec, in order.
    pub(super) fn specs(&self) -> impl Iterator<Item = &ProjectionSpec> {
        self.0.iter().map(Py::get)
    }
}

/// A sparse mixture of experts of a decoder layer (`decoder::Experts`' fields): the router's
/// float32 `[experts, hidden_size]` weight, each expert's gate/up and down projections, how
/// many experts each token takes, and whether their weights are divided by their sum. The
/// buffers are held from here on.
#[pyclass(frozen, module = "srt._rust")]
pub(crate) struct MoeSpec {
    pub(super) router: PyBuffer<f32>,
    pub(super) gate_up: Vec<Parts>,
    pub(super) down: Vec<Parts>,
    top_k: usize,
    renormalize: bool,
}

#[pymethods]
impl MoeSpec {
    #[new]
    #[pyo3(signature = (*, router, gate_up, down, top_k, renormalize))]
    fn new(
        router: PyBuffer<f32>,
        gate_up: Vec<ProjectionArg>,
        down: Vec<ProjectionArg>,
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
        let parts = |what, args: Vec<ProjectionArg>| {
            args.into_iter()
                .map(|arg| Parts::new(what, arg))
                .collect::<PyResult<Vec<_>>>()
        };
        Ok(MoeSpec {
            router,
            gate_up: parts("gate_up", gate_up)?,
            down: parts("down", down)?,
            top_k,
            renormalize,
        })
    }
}

/// A layer's feed-forward: the gated MLP's two projections, or a mixture of experts.
pub(crate) enum FeedForwardSpec {
    Dense(Parts, Parts),
    Sparse(Py<MoeSpec>),
}

impl FeedForwardSpec {
    pub(super) fn clone_ref(&self, py: Python<'_>) -> FeedForwardSpec {
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
pub(crate) struct LayerSpec {
    pub(super) input_norm: Py<PyAny>,
    pub(super) qkv: Parts,
    pub(super) o: Parts,
    pub(super) q_norm: Option<Py<PyAny>>,
    pub(super) k_norm: Option<Py<PyAny>>,
    pub(super) post_norm: Py<PyAny>,
    pub(super) feed_forward: FeedForwardSpec,
    pub(super) k_cache: Py<PyAny>,
    pub(super) v_cache: Py<PyAny>,
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
        qkv: ProjectionArg,
        o: ProjectionArg,
        post_norm: Py<PyAny>,
        k_cache: Py<PyAny>,
        v_cache: Py<PyAny>,
        gate_up: Option<ProjectionArg>,
        down: Option<ProjectionArg>,
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
            (Some(gate_up), Some(down), None) => {
                FeedForwardSpec::Dense(Parts::new("gate_up", gate_up)?, Parts::new("down", down)?)
            }
            (None, None, Some(moe)) => FeedForwardSpec::Sparse(moe),
            _ => {
                return Err(PyValueError::new_err(
                    "a layer's feed-forward is gate_up and down, or moe",
                ))
            }
        };
        Ok(LayerSpec {
            input_norm,
            qkv: Parts::new("qkv", qkv)?,
            o: Parts::new("o", o)?,
            q_norm,
            k_norm,
            post_norm,
            feed_forward,
            k_cache,
            v_cache,
        })
    }
}

/// A projection's weight over its held buffer, its length checked against its shape.
pub(super) fn weight(projection: &ProjectionSpec) -> PyResult<Weight<'_>> {
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

/// A part over its held buffers.
fn part(buffers: &ProjectionSpec) -> PyResult<Part<'_>> {
    let bias = buffers
        .bias
        .as_ref()
        .map(|b| contiguous("a bias", b, false))
        .transpose()?;
    // SAFETY: the stack holds the bias acquired; nothing writes it during the step (every
    // writable buffer is checked not to overlap it).
    let bias = bias.map(|b| unsafe { b.as_ref() });
    Ok(Part {
        weight: weight(buffers)?,
        bias,
        one_int8_from: buffers.one_int8_from,
    })
}

/// A projection over its parts' held buffers.
pub(super) fn projection(parts: &Parts) -> PyResult<Projection<'_>> {
    Ok(Projection {
        parts: parts.specs().map(part).collect::<PyResult<_>>()?,
    })
}

/// A gated MLP over its projections' held buffers.
pub(super) fn mlp<'a>(gate_up: &'a Parts, down: &'a Parts) -> PyResult<Mlp<'a>> {
    Ok(Mlp {
        gate_up: projection(gate_up)?,
        down: projection(down)?,
    })
}

/// A layer's feed-forward over its held buffers.
pub(super) fn feed_forward(spec: &FeedForwardSpec) -> PyResult<FeedForward<'_>> {
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
