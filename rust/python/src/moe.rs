//! `srt._rust.moe_route`: the binding of `srt_kernels::moe`, the router of a sparse mixture of
//! experts. The input arrives as a float32 numpy view of a CPU tensor, or as an int16 view of a
//! bf16 tensor's bits (one function for both: the buffer's format says which); the router's
//! weight as float32; the outputs as int64 (expert ids) and float32 (weights). Lengths are
//! checked by the core, writability and overlap here. The work runs with the GIL released.

use std::ptr::NonNull;

use pyo3::buffer::{Element as BufferElement, PyBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::element::Element;
use srt_kernels::moe;

use crate::boundary::{bf16_bits, contiguous, overlap, Floats};
use crate::to_py_err;

/// How many experts there are, how many each row takes, and whether their weights are divided
/// by their sum.
#[derive(Clone, Copy)]
struct Route {
    experts: usize,
    top_k: usize,
    renormalize: bool,
}

fn route_any<P: BufferElement, T: Element>(
    py: Python<'_>,
    x: &PyBuffer<P>,
    router: &PyBuffer<f32>,
    route: Route,
    ids: &PyBuffer<i64>,
    weights: &PyBuffer<f32>,
    cast: fn(NonNull<[P]>) -> NonNull<[T]>,
) -> PyResult<()> {
    let Route {
        experts,
        top_k,
        renormalize,
    } = route;
    let input = cast(contiguous("the input", x, false)?);
    let router = contiguous("the router", router, false)?;
    let ids = contiguous("the expert ids", ids, true)?;
    let weights = contiguous("the expert weights", weights, true)?;
    if overlap(ids, weights)
        || overlap(ids, input)
        || overlap(ids, router)
        || overlap(weights, input)
        || overlap(weights, router)
    {
        return Err(PyValueError::new_err(
            "the expert ids and weights must not overlap each other or the inputs",
        ));
    }
    // SAFETY: every buffer stays acquired until this function returns; the two outputs overlap
    // nothing else (checked above); `cast` keeps the bytes and their count.
    let (input, router, ids, weights) = unsafe {
        (
            input.as_ref(),
            router.as_ref(),
            &mut *ids.as_ptr(),
            &mut *weights.as_ptr(),
        )
    };
    py.detach(|| moe::route(input, router, experts, top_k, renormalize, ids, weights))
        .map_err(to_py_err)
}

/// Each row of `x` (`[rows, hidden]`, float32 or bf16 bits as int16) routed through `router`
/// (float32 `[experts, hidden]`): its `top_k` experts, in descending weight, into `ids` (int64
/// `[rows, top_k]`) and their weights into `weights` (float32), divided by their sum when
/// `renormalize`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn moe_route(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    router: PyBuffer<f32>,
    experts: usize,
    top_k: usize,
    renormalize: bool,
    ids: PyBuffer<i64>,
    weights: PyBuffer<f32>,
) -> PyResult<()> {
    let route = Route {
        experts,
        top_k,
        renormalize,
    };
    match Floats::get("the input", x)? {
        Floats::F32(x) => route_any(py, &x, &router, route, &ids, &weights, |b| b),
        Floats::Bf16(x) => route_any(py, &x, &router, route, &ids, &weights, bf16_bits),
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(moe_route, m)?)
}
