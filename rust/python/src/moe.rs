//! `srt._rust.moe_route` and `moe_route_bf16`: the binding of `srt_kernels::moe`, the router of a
//! sparse mixture of experts. The input arrives as a float32 numpy view of a CPU tensor, or as
//! an int16 view of a bf16 tensor's bits; the router's weight as float32; the outputs as int64
//! (expert ids) and float32 (weights). Lengths are checked by the core, writability and
//! overlap here. The work runs with the GIL released.

use std::ptr::NonNull;

use pyo3::buffer::{Element as BufferElement, PyBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::element::Element;
use srt_kernels::moe;

use crate::boundary::{bf16_bits, contiguous, overlap};
use crate::to_py_err;

#[allow(clippy::too_many_arguments)]
fn route_any<P: BufferElement, T: Element>(
    py: Python<'_>,
    x: &PyBuffer<P>,
    router: &PyBuffer<f32>,
    experts: usize,
    top_k: usize,
    renormalize: bool,
    ids: &PyBuffer<i64>,
    weights: &PyBuffer<f32>,
    cast: fn(NonNull<[P]>) -> NonNull<[T]>,
) -> PyResult<()> {
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

/// Each row of `x` (float32 `[rows, hidden]`) routed through `router` (float32
/// `[experts, hidden]`): its `top_k` experts, in descending weight, into `ids` (int64
/// `[rows, top_k]`) and their weights into `weights` (float32), divided by their sum when
/// `renormalize`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn moe_route(
    py: Python<'_>,
    x: PyBuffer<f32>,
    router: PyBuffer<f32>,
    experts: usize,
    top_k: usize,
    renormalize: bool,
    ids: PyBuffer<i64>,
    weights: PyBuffer<f32>,
) -> PyResult<()> {
    route_any(
        py,
        &x,
        &router,
        experts,
        top_k,
        renormalize,
        &ids,
        &weights,
        |b| b,
    )
}

/// `moe_route` of a bf16 input (an int16 view of its bits).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn moe_route_bf16(
    py: Python<'_>,
    x: PyBuffer<i16>,
    router: PyBuffer<f32>,
    experts: usize,
    top_k: usize,
    renormalize: bool,
    ids: PyBuffer<i64>,
    weights: PyBuffer<f32>,
) -> PyResult<()> {
    route_any(
        py,
        &x,
        &router,
        experts,
        top_k,
        renormalize,
        &ids,
        &weights,
        bf16_bits,
    )
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(moe_route, m)?)?;
    m.add_function(wrap_pyfunction!(moe_route_bf16, m)?)
}
