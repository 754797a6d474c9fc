//! `srt._rust.linear` and its weight packing: the binding of `srt_kernels::gemm`. Floats arrive as
//! C-contiguous float32 buffers (numpy views of CPU tensors, shared, not copied); shapes are
//! checked by the core, writability and overlap here. The product runs with the GIL released.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::gemm;

use crate::boundary::{contiguous, float_product, overlap};
use crate::to_py_err;

/// Whether this CPU runs `linear` (x86-64 with AVX2 and FMA).
#[pyfunction]
fn linear_supported() -> bool {
    gemm::supported()
}

/// The number of floats of a packed `[n, k]` weight (`ValueError` past the address space).
#[pyfunction]
fn packed_weight_len(n: usize, k: usize) -> PyResult<usize> {
    gemm::packed_len(n, k).map_err(to_py_err)
}

/// Packs a row-major `[n, k]` float32 weight into `packed` for `linear`.
#[pyfunction]
fn pack_weight(
    py: Python<'_>,
    weight: PyBuffer<f32>,
    n: usize,
    k: usize,
    packed: PyBuffer<f32>,
) -> PyResult<()> {
    let source = contiguous("the weight", &weight, false)?;
    let target = contiguous("the packed weight", &packed, true)?;
    if overlap(source, target) {
        return Err(PyValueError::new_err(
            "the weight and the packed weight overlap",
        ));
    }
    // SAFETY: both buffers stay acquired (and their memory alive) until this function returns;
    // they do not overlap, so the shared and the mutable slice alias nothing.
    let (source, target) = unsafe { (source.as_ref(), &mut *target.as_ptr()) };
    py.detach(|| gemm::pack_weight(source, n, k, target))
        .map_err(to_py_err)
}

/// `out[m, n] = x[m, k] · Wᵀ + bias` over a weight packed by `pack_weight`.
#[pyfunction]
#[pyo3(signature = (x, m, packed, n, k, bias, out))]
#[allow(clippy::too_many_arguments)]
fn linear(
    py: Python<'_>,
    x: PyBuffer<f32>,
    m: usize,
    packed: PyBuffer<f32>,
    n: usize,
    k: usize,
    bias: Option<PyBuffer<f32>>,
    out: PyBuffer<f32>,
) -> PyResult<()> {
    let (input, weight, bias, output) =
        float_product(&x, ("the packed weight", &packed), bias.as_ref(), &out)?;
    py.detach(|| gemm::linear(input, m, weight, n, k, bias, output))
        .map_err(to_py_err)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(linear_supported, m)?)?;
    m.add_function(wrap_pyfunction!(packed_weight_len, m)?)?;
    m.add_function(wrap_pyfunction!(pack_weight, m)?)?;
    m.add_function(wrap_pyfunction!(linear, m)?)?;
    Ok(())
}
