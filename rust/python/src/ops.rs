//! `srt._rust.rms_norm`, `silu_and_mul` and `rotary`: the binding of `srt_kernels::ops`, and the
//! kernels' instruction-set tier (`cpu_isa`, `set_cpu_isa`). Float32 tensors arrive as float32
//! numpy views of CPU tensors, bf16 tensors as int16 views of their bits (numpy has no bf16),
//! each kernel taking either (the buffers' format says which); lengths are checked by the core,
//! writability and overlap here. The work runs with the GIL released.

use std::ptr::NonNull;

use pyo3::buffer::{Element as BufferElement, PyBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::element::Element;
use srt_kernels::isa::{self, Ceiling};
use srt_kernels::ops;

use crate::boundary::{bf16_bits, contiguous, overlap, SameFloats};
use crate::to_py_err;

/// How a buffer of `P` (float32, or int16 holding bf16 bits) is read as elements `T`.
type Cast<P, T> = fn(NonNull<[P]>) -> NonNull<[T]>;

fn same<T>(buffer: NonNull<[T]>) -> NonNull<[T]> {
    buffer
}

fn rms_norm_any<P: BufferElement, T: Element>(
    py: Python<'_>,
    [x, weight, out]: [PyBuffer<P>; 3],
    residual: Option<&Bound<'_, PyAny>>,
    eps: f32,
    cast: Cast<P, T>,
) -> PyResult<()> {
    let residual = residual
        .map(|r| {
            PyBuffer::<P>::get(r)
                .map_err(|_| PyValueError::new_err("the residual must be of the input's type"))
        })
        .transpose()?;
    let input = cast(contiguous("the input", &x, false)?);
    let residual = residual
        .as_ref()
        .map(|r| contiguous("the residual", r, true).map(cast))
        .transpose()?;
    let scale = cast(contiguous("the weight", &weight, false)?);
    let output = cast(contiguous("the output", &out, true)?);
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
    // overlap no other operand, so each mutable slice aliases nothing. `cast` keeps the bytes
    // and their count (bf16 and int16 are both 16 bits).
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

/// `out = weight · x / sqrt(mean(x²) + eps)` per row; with `residual`, `residual += x` first (in
/// place) and the sum is normalized. Float32 tensors, or bf16 ones (int16 views of their bits,
/// rounded as PyTorch rounds), all of one type.
#[pyfunction]
#[pyo3(signature = (x, residual, weight, eps, out))]
fn rms_norm(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    residual: Option<&Bound<'_, PyAny>>,
    weight: &Bound<'_, PyAny>,
    eps: f32,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    match SameFloats::get([
        ("the input", x),
        ("the weight", weight),
        ("the output", out),
    ])? {
        SameFloats::F32(buffers) => rms_norm_any(py, buffers, residual, eps, same),
        SameFloats::Bf16(buffers) => rms_norm_any(py, buffers, residual, eps, bf16_bits),
    }
}

fn silu_and_mul_any<P: BufferElement, T: Element>(
    py: Python<'_>,
    [gate_up, out]: [PyBuffer<P>; 2],
    dim: usize,
    cast: Cast<P, T>,
) -> PyResult<()> {
    let input = cast(contiguous("the input", &gate_up, false)?);
    let output = cast(contiguous("the output", &out, true)?);
    if overlap(input, output) {
        return Err(PyValueError::new_err("the output overlaps the input"));
    }
    // SAFETY: both buffers stay acquired until this function returns and do not overlap;
    // `cast` keeps the bytes and their count.
    let (input, output) = unsafe { (input.as_ref(), &mut *output.as_ptr()) };
    py.detach(|| ops::silu_and_mul(input, dim, output))
        .map_err(to_py_err)
}

/// `out = silu(gate) · up` per row, where a row of `gate_up` is `[gate | up]`, each `dim` wide.
/// Float32, or bf16 (int16 views of the bits; silu rounded before the product), both of one
/// type.
#[pyfunction]
fn silu_and_mul(
    py: Python<'_>,
    gate_up: &Bound<'_, PyAny>,
    dim: usize,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    match SameFloats::get([("the input", gate_up), ("the output", out)])? {
        SameFloats::F32(buffers) => silu_and_mul_any(py, buffers, dim, same),
        SameFloats::Bf16(buffers) => silu_and_mul_any(py, buffers, dim, bf16_bits),
    }
}

fn rotary_any<P: BufferElement, T: Element>(
    py: Python<'_>,
    [x, cos, sin, out]: [PyBuffer<P>; 4],
    x_stride: usize,
    head_dim: usize,
    cast: Cast<P, T>,
) -> PyResult<()> {
    let input = cast(contiguous("the input", &x, false)?);
    let cos = cast(contiguous("the cosine table", &cos, false)?);
    let sin = cast(contiguous("the sine table", &sin, false)?);
    let output = cast(contiguous("the output", &out, true)?);
    if [input, cos, sin]
        .into_iter()
        .any(|other| overlap(other, output))
    {
        return Err(PyValueError::new_err("the output overlaps an input"));
    }
    // SAFETY: the buffers stay acquired until this function returns; the output overlaps none
    // of the inputs; `cast` keeps the bytes and their count.
    let (input, cos, sin, output) = unsafe {
        (
            input.as_ref(),
            cos.as_ref(),
            sin.as_ref(),
            &mut *output.as_ptr(),
        )
    };
    py.detach(|| ops::rotary_strided(input, x_stride, cos, sin, head_dim, output))
        .map_err(to_py_err)
}

/// `out = x · cos + [x₂ | x₁] · sin` for every head of each token's row of `x`, whose rows lie
/// `x_stride` elements apart (`x` spans the first row's start to the last row's end); `out` is
/// contiguous. Float32, or bf16 (int16 views of the bits; each product and the sum rounded),
/// all of one type.
#[pyfunction]
fn rotary(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    x_stride: usize,
    cos: &Bound<'_, PyAny>,
    sin: &Bound<'_, PyAny>,
    head_dim: usize,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let buffers = SameFloats::get([
        ("the input", x),
        ("the cosine table", cos),
        ("the sine table", sin),
        ("the output", out),
    ])?;
    match buffers {
        SameFloats::F32(buffers) => rotary_any(py, buffers, x_stride, head_dim, same),
        SameFloats::Bf16(buffers) => rotary_any(py, buffers, x_stride, head_dim, bf16_bits),
    }
}

/// The tier the CPU kernels run now, and the highest this CPU runs: each one of "scalar",
/// "avx2", "avx512", "avx512_vnni", "avx512_bf16".
#[pyfunction]
fn cpu_isa() -> (&'static str, &'static str) {
    (isa::active().name(), isa::detected().name())
}

/// Caps the CPU kernels' tier at `name` (one of `cpu_isa`'s names, or "avx2_vnni": the AVX2
/// tier with AVX-VNNI; a cap above what the CPU has changes nothing).
#[pyfunction]
fn set_cpu_isa(name: &str) -> PyResult<()> {
    isa::set_ceiling(Ceiling::parse(name).map_err(to_py_err)?);
    Ok(())
}

/// Whether bf16 matrix products run natively (AVX-512 BF16 or AMX-BF16), and whether the CPU
/// has AMX-BF16; the first is false when the tier is capped below the CPU's.
#[pyfunction]
fn cpu_bf16_matmul() -> (bool, bool) {
    (isa::native_bf16_matmul(), isa::amx_bf16())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(rotary, m)?)?;
    m.add_function(wrap_pyfunction!(silu_and_mul, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_isa, m)?)?;
    m.add_function(wrap_pyfunction!(set_cpu_isa, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_bf16_matmul, m)?)
}
