//! `srt._rust.quant_*`: the binding of `srt_kernels::quant`. Blocks arrive as C-contiguous uint8
//! buffers, floats as float32 ones and bfloat16 as int16 ones (numpy views of CPU tensors,
//! shared, not copied); shapes are checked by the core, writability and overlap here. The work
//! runs with the GIL released.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::quant::{self, Format, QuantMatrix};

use crate::boundary::{bf16_bits, contiguous, float_product, overlap, Ids};
use crate::to_py_err;

/// Bytes per block of the format named `fmt`: of 32 weights, or a K-quant's super-block of
/// 256.
#[pyfunction]
fn quant_block_bytes(fmt: &str) -> PyResult<usize> {
    Ok(Format::parse(fmt).map_err(to_py_err)?.block_bytes())
}

/// `out[m, n] = x[m, k] · Wᵀ + bias` for W `[n, k]` in blocks of `fmt`.
#[pyfunction]
#[pyo3(signature = (fmt, x, m, blocks, n, k, bias, out))]
#[allow(clippy::too_many_arguments)]
fn quant_linear(
    py: Python<'_>,
    fmt: &str,
    x: PyBuffer<f32>,
    m: usize,
    blocks: PyBuffer<u8>,
    n: usize,
    k: usize,
    bias: Option<PyBuffer<f32>>,
    out: PyBuffer<f32>,
) -> PyResult<()> {
    let format = Format::parse(fmt).map_err(to_py_err)?;
    let (input, weight, bias, output) =
        float_product(&x, ("the blocks", &blocks), bias.as_ref(), &out)?;
    let matrix = QuantMatrix::new(format, weight, n, k).map_err(to_py_err)?;
    py.detach(|| quant::linear(&matrix, input, m, bias, output))
        .map_err(to_py_err)
}

/// The weight `[n, k]` in blocks of `fmt` as float32 (`out` float32) or bfloat16 bits (`out`
/// int16), all rows or the rows `ids`.
#[pyfunction]
#[pyo3(signature = (fmt, blocks, n, k, out, ids=None))]
fn quant_dequantize(
    py: Python<'_>,
    fmt: &str,
    blocks: PyBuffer<u8>,
    n: usize,
    k: usize,
    out: &Bound<'_, PyAny>,
    ids: Option<Ids>,
) -> PyResult<()> {
    let format = Format::parse(fmt).map_err(to_py_err)?;
    let weight = contiguous("the blocks", &blocks, false)?;
    if let Ok(out) = PyBuffer::<f32>::get(out) {
        let output = contiguous("the output", &out, true)?;
        if overlap(weight, output) {
            return Err(PyValueError::new_err("the output overlaps the blocks"));
        }
        // SAFETY: both buffers stay acquired until this function returns and do not overlap.
        let (weight, output) = unsafe { (weight.as_ref(), &mut *output.as_ptr()) };
        let matrix = QuantMatrix::new(format, weight, n, k).map_err(to_py_err)?;
        return py
            .detach(|| match &ids {
                None => quant::dequantize(&matrix, output),
                Some(ids) => quant::dequantize_rows(&matrix, &ids.0, output),
            })
            .map_err(to_py_err);
    }
    let out = PyBuffer::<i16>::get(out).map_err(|_| {
        PyValueError::new_err("the output must be a float32 or an int16 (bfloat16 bits) buffer")
    })?;
    let output = contiguous("the output", &out, true)?;
    if overlap(weight, output) {
        return Err(PyValueError::new_err("the output overlaps the blocks"));
    }
    // SAFETY: both buffers stay acquired until this function returns and do not overlap;
    // `bf16_bits` views the same 16-bit elements as `Bf16`, valid for every bit pattern.
    let (weight, output) = unsafe { (weight.as_ref(), &mut *bf16_bits(output).as_ptr()) };
    let matrix = QuantMatrix::new(format, weight, n, k).map_err(to_py_err)?;
    py.detach(|| match &ids {
        None => quant::dequantize(&matrix, output),
        Some(ids) => quant::dequantize_rows(&matrix, &ids.0, output),
    })
    .map_err(to_py_err)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(quant_block_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(quant_linear, m)?)?;
    m.add_function(wrap_pyfunction!(quant_dequantize, m)?)?;
    Ok(())
}
