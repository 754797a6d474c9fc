//! `srt._rust.rms_norm`, `silu_and_mul` and `rotary`: the binding of `srt_core::ops`. Tensors
//! arrive as float32 numpy views of CPU tensors; lengths are checked by the core, writability and
//! overlap here. The work runs with the GIL released.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_core::ops;

use crate::boundary::{contiguous, overlap};
use crate::to_py_err;

/// `out = weight · x / sqrt(mean(x²) + eps)` per row; with `residual`, `residual += x` first (in
/// place) and the sum is normalized.
#[pyfunction]
#[pyo3(signature = (x, residual, weight, eps, out))]
fn rms_norm(
    py: Python<'_>,
    x: PyBuffer<f32>,
    residual: Option<PyBuffer<f32>>,
    weight: PyBuffer<f32>,
    eps: f32,
    out: PyBuffer<f32>,
) -> PyResult<()> {
    let input = contiguous("the input", &x, false)?;
    let residual = residual
        .as_ref()
        .map(|r| contiguous("the residual", r, true))
        .transpose()?;
    let scale = contiguous("the weight", &weight, false)?;
    let output = contiguous("the output", &out, true)?;
    let mut written = vec![output];
    written.extend(residual);
    for (i, &target) in written.iter().enumerate() {
        let others = [input, scale]
            .into_iter()
            .chain(written[i + 1..].iter().copied());
        if others.into_iter().any(|other| overlap(target, other)) {
            return Err(PyValueError::new_err(
                "an output of rms_norm overlaps another operand",
            ));
        }
    }
    // SAFETY: the buffers stay acquired until this function returns, and the two written ones
    // overlap no other operand, so each mutable slice aliases nothing.
    let (input, residual, scale, output) = unsafe {
        (
            input.as_ref(),
            residual.map(|r| &mut *r.as_ptr()),
            scale.as_ref(),
            &mut *output.as_ptr(),
        )
    };
    py.detach(|| ops::rms_norm(input, residual, scale, eps, output))
        .map_err(to_py_err)
}

/// `out = silu(gate) · up` per row, where a row of `gate_up` is `[gate | up]`, each `dim` wide.
#[pyfunction]
fn silu_and_mul(
    py: Python<'_>,
    gate_up: PyBuffer<f32>,
    dim: usize,
    out: PyBuffer<f32>,
) -> PyResult<()> {
    let input = contiguous("the input", &gate_up, false)?;
    let output = contiguous("the output", &out, true)?;
    if overlap(input, output) {
        return Err(PyValueError::new_err("the output overlaps the input"));
    }
    // SAFETY: both buffers stay acquired until this function returns and do not overlap.
    let (input, output) = unsafe { (input.as_ref(), &mut *output.as_ptr()) };
    py.detach(|| ops::silu_and_mul(input, dim, output))
        .map_err(to_py_err)
}

/// `out = x · cos + [x₂ | x₁] · sin` for every head of each token's row of `x`.
#[pyfunction]
fn rotary(
    py: Python<'_>,
    x: PyBuffer<f32>,
    cos: PyBuffer<f32>,
    sin: PyBuffer<f32>,
    head_dim: usize,
    out: PyBuffer<f32>,
) -> PyResult<()> {
    let input = contiguous("the input", &x, false)?;
    let cos = contiguous("the cosine table", &cos, false)?;
    let sin = contiguous("the sine table", &sin, false)?;
    let output = contiguous("the output", &out, true)?;
    if [input, cos, sin]
        .into_iter()
        .any(|other| overlap(other, output))
    {
        return Err(PyValueError::new_err("the output overlaps an input"));
    }
    // SAFETY: the buffers stay acquired until this function returns; the output overlaps none
    // of the inputs.
    let (input, cos, sin, output) = unsafe {
        (
            input.as_ref(),
            cos.as_ref(),
            sin.as_ref(),
            &mut *output.as_ptr(),
        )
    };
    py.detach(|| ops::rotary(input, cos, sin, head_dim, output))
        .map_err(to_py_err)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(rotary, m)?)?;
    m.add_function(wrap_pyfunction!(silu_and_mul, m)?)
}
