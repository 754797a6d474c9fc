//! `srt._rust.quant_pack*`: the binding of `srt_kernels::quant`'s integer path (weights repacked
//! into tiles, activations rounded to int8). Buffers arrive as for `quant.rs`: uint8 for
//! blocks and tiles, float32 or bfloat16 bits (int16) for activations and outputs, shared, not
//! copied; shapes are checked by the core, writability and overlap here. The work runs with
//! the GIL released.

use std::ptr::NonNull;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::element::{Bf16, Element};
use srt_kernels::quant::{self, Format, PackedKernel, PackedMatrix, QuantMatrix};

use crate::boundary::{bf16_bits, contiguous, overlap, product_slices, Floats, Ids};
use crate::to_py_err;

/// The integer kernel `quant_packed_linear` runs on this CPU ("avx512_vnni", "avx2"), or None
/// where there is none (the float kernels of `quant_linear` should run instead).
#[pyfunction]
fn quant_packed_kernel() -> Option<&'static str> {
    PackedKernel::best().map(PackedKernel::name)
}

/// Bytes of a packed `[n, k]` weight of `fmt`.
#[pyfunction]
fn quant_packed_len(fmt: &str, n: usize, k: usize) -> PyResult<usize> {
    let format = Format::parse(fmt).map_err(to_py_err)?;
    quant::packed_len(format, n, k).map_err(to_py_err)
}

/// Writes the `[n, k]` weight in blocks of `fmt` into `out` in the tile layout.
#[pyfunction]
fn quant_pack(
    py: Python<'_>,
    fmt: &str,
    blocks: PyBuffer<u8>,
    n: usize,
    k: usize,
    out: PyBuffer<u8>,
) -> PyResult<()> {
    let format = Format::parse(fmt).map_err(to_py_err)?;
    let weight = contiguous("the blocks", &blocks, false)?;
    let output = contiguous("the packed weight", &out, true)?;
    if overlap(weight, output) {
        return Err(PyValueError::new_err(
            "the packed weight overlaps the blocks",
        ));
    }
    // SAFETY: both buffers stay acquired until this function returns and do not overlap.
    let (weight, output) = unsafe { (weight.as_ref(), &mut *output.as_ptr()) };
    let matrix = QuantMatrix::new(format, weight, n, k).map_err(to_py_err)?;
    py.detach(|| quant::pack(&matrix, output))
        .map_err(to_py_err)
}

/// `out[m, n] = x[m, k] · Wᵀ + bias` on the packed weight `W`, `x` and `out` both float32 or
/// both bfloat16 bits, the bias float32. Activations are split into two int8 parts, or with
/// `int8_activations` rounded to one int8 per value per block of 32 (llama.cpp's Q8: half the
/// integer work, for products of many rows; not for the K-quants yet).
#[pyfunction]
#[pyo3(signature = (fmt, x, m, packed, n, k, bias, out, int8_activations=false))]
#[allow(clippy::too_many_arguments)]
fn quant_packed_linear(
    py: Python<'_>,
    fmt: &str,
    x: &Bound<'_, PyAny>,
    m: usize,
    packed: PyBuffer<u8>,
    n: usize,
    k: usize,
    bias: Option<PyBuffer<f32>>,
    out: &Bound<'_, PyAny>,
    int8_activations: bool,
) -> PyResult<()> {
    let format = Format::parse(fmt).map_err(to_py_err)?;
    let weight = contiguous("the packed weight", &packed, false)?;
    let bias = bias
        .as_ref()
        .map(|b| contiguous("the bias", b, false))
        .transpose()?;
    let op = Product {
        kernel: PackedKernel::best().unwrap_or(PackedKernel::Portable),
        format,
        activations: if int8_activations {
            Activations::Int8
        } else {
            Activations::Split
        },
    };
    match (
        Floats::get("the input", x)?,
        Floats::get("the output", out)?,
    ) {
        (Floats::F32(x), Floats::F32(out)) => {
            let (x, out) = (
                contiguous("the input", &x, false)?,
                contiguous("the output", &out, true)?,
            );
            op.run(py, weight, (n, k), x, m, bias, out)
        }
        (Floats::Bf16(x), Floats::Bf16(out)) => {
            let (x, out) = (
                contiguous("the input", &x, false)?,
                contiguous("the output", &out, true)?,
            );
            op.run(py, weight, (n, k), bf16_bits(x), m, bias, bf16_bits(out))
        }
        _ => Err(PyValueError::new_err(
            "the input and the output must both be float32 or both bfloat16",
        )),
    }
}

/// How a packed product rounds its activations: which core function runs.
#[derive(Clone, Copy)]
enum Activations {
    /// Two int8 parts per value (`quant::linear_packed`).
    Split,
    /// One int8 per value (`quant::linear_packed_one_int8`).
    Int8,
}

/// Which product runs: the kernel, the weight's format and the activations' rounding.
struct Product {
    kernel: PackedKernel,
    format: Format,
    activations: Activations,
}

impl Product {
    #[allow(clippy::too_many_arguments)]
    fn run<T: Element>(
        &self,
        py: Python<'_>,
        weight: NonNull<[u8]>,
        (n, k): (usize, usize),
        x: NonNull<[T]>,
        m: usize,
        bias: Option<NonNull<[f32]>>,
        out: NonNull<[T]>,
    ) -> PyResult<()> {
        // SAFETY: every buffer stays acquired by the caller until it returns.
        let (x, weight, bias, out) = unsafe { product_slices(x, weight, bias, out)? };
        let matrix = PackedMatrix::new(self.format, weight, n, k).map_err(to_py_err)?;
        let kernel = self.kernel;
        py.detach(|| match self.activations {
            Activations::Split => quant::linear_packed(kernel, &matrix, x, m, bias, out),
            Activations::Int8 => quant::linear_packed_one_int8(kernel, &matrix, x, m, bias, out),
        })
        .map_err(to_py_err)
    }
}

/// The packed `[n, k]` weight, or its rows `ids`, as float32 (`out` float32) or bfloat16 bits
/// (`out` int16), equal to `quant_dequantize` on the blocks it was packed from.
#[pyfunction]
#[pyo3(signature = (fmt, packed, n, k, out, ids=None))]
fn quant_packed_dequantize(
    py: Python<'_>,
    fmt: &str,
    packed: PyBuffer<u8>,
    n: usize,
    k: usize,
    out: &Bound<'_, PyAny>,
    ids: Option<Ids>,
) -> PyResult<()> {
    let ids = ids.as_ref().map(|ids| ids.0.as_slice());
    decode(
        py,
        (fmt, &packed, n, k),
        out,
        |matrix, out| quant::dequantize_packed(matrix, ids, out),
        |matrix, out| quant::dequantize_packed(matrix, ids, out),
    )
}

/// The packed `[n, k]` weight transposed, `[k, n]`, as float32 or bfloat16 bits, each weight
/// equal to `quant_packed_dequantize`'s.
#[pyfunction]
fn quant_packed_dequantize_transposed(
    py: Python<'_>,
    fmt: &str,
    packed: PyBuffer<u8>,
    n: usize,
    k: usize,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    decode(
        py,
        (fmt, &packed, n, k),
        out,
        quant::dequantize_packed_transposed,
        quant::dequantize_packed_transposed,
    )
}

/// Runs `on_f32` or `on_bf16` on the packed weight (its format's name, its bytes, `[n, k]`) and
/// the output, by the output's type (float32, or int16 holding bfloat16 bits), with the GIL
/// released.
fn decode(
    py: Python<'_>,
    (fmt, packed, n, k): (&str, &PyBuffer<u8>, usize, usize),
    out: &Bound<'_, PyAny>,
    on_f32: impl FnOnce(&PackedMatrix<'_>, &mut [f32]) -> srt_kernels::Result<()> + Send,
    on_bf16: impl FnOnce(&PackedMatrix<'_>, &mut [Bf16]) -> srt_kernels::Result<()> + Send,
) -> PyResult<()> {
    let (format, bytes) = (
        Format::parse(fmt).map_err(to_py_err)?,
        contiguous("the packed weight", packed, false)?,
    );
    let weight = (format, bytes, n, k);
    match Floats::get("the output", out)? {
        Floats::F32(out) => decode_into(py, weight, contiguous("the output", &out, true)?, on_f32),
        Floats::Bf16(out) => {
            let out = bf16_bits(contiguous("the output", &out, true)?);
            decode_into(py, weight, out, on_bf16)
        }
    }
}

/// Runs `op` on the packed weight and the output, with the GIL released.
fn decode_into<T: Element>(
    py: Python<'_>,
    (format, weight, n, k): (Format, NonNull<[u8]>, usize, usize),
    out: NonNull<[T]>,
    op: impl FnOnce(&PackedMatrix<'_>, &mut [T]) -> srt_kernels::Result<()> + Send,
) -> PyResult<()> {
    if overlap(weight, out) {
        return Err(PyValueError::new_err(
            "the output overlaps the packed weight",
        ));
    }
    // SAFETY: both buffers stay acquired by the caller until it returns and do not overlap.
    let (weight, out) = unsafe { (weight.as_ref(), &mut *out.as_ptr()) };
    let matrix = PackedMatrix::new(format, weight, n, k).map_err(to_py_err)?;
    py.detach(|| op(&matrix, out)).map_err(to_py_err)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(quant_packed_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(quant_packed_len, m)?)?;
    m.add_function(wrap_pyfunction!(quant_pack, m)?)?;
    m.add_function(wrap_pyfunction!(quant_packed_linear, m)?)?;
    m.add_function(wrap_pyfunction!(quant_packed_dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(quant_packed_dequantize_transposed, m)?)?;
    Ok(())
}
