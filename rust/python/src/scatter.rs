//! `srt._rust.scatter_rows`: the binding of `srt_kernels::scatter`, the KV pool's store on the CPU.
//! Rows arrive as float32 or int16 (bfloat16 bits) numpy views of CPU tensors, copied as they
//! are (a copy needs no arithmetic, so bf16 stays int16 here); slots as an int64 buffer. The core
//! checks the lengths and slots, this file writability and overlap. Large calls release the GIL.

use pyo3::buffer::{Element as BufferElement, PyBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use srt_kernels::scatter;

use crate::boundary::{contiguous, maybe_detach, overlap, Floats};
use crate::to_py_err;

fn scatter_any<P: BufferElement + Copy + Send + Sync>(
    py: Python<'_>,
    src: &PyBuffer<P>,
    src_stride: usize,
    width: usize,
    slots: &PyBuffer<i64>,
    buffer: &PyBuffer<P>,
) -> PyResult<()> {
    let source = contiguous("the source", src, false)?;
    let slots = contiguous("the slots", slots, false)?;
    let target = contiguous("the buffer", buffer, true)?;
    if overlap(source, target) || overlap(slots, target) {
        return Err(PyValueError::new_err(
            "the buffer overlaps the source or the slots",
        ));
    }
    // SAFETY: the buffers stay acquired until this function returns, and the written one
    // overlaps neither of the others, so the mutable slice aliases nothing.
    let (source, slots, target) =
        unsafe { (source.as_ref(), slots.as_ref(), &mut *target.as_ptr()) };
    let work = slots.len().saturating_mul(width);
    maybe_detach(py, work, || {
        scatter::scatter_rows(source, src_stride, width, slots, target)
    })
    .map_err(to_py_err)
}

/// Copies row `i` of `src` (`width` elements at `i · src_stride`) to row `slots[i]` (int64) of
/// `buffer`, for every slot; `src` spans the first row's start to the last row's end. Both are
/// float32, or both int16 (bfloat16 bits). Every slot is checked before anything is written.
#[pyfunction]
fn scatter_rows(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    src_stride: usize,
    width: usize,
    slots: PyBuffer<i64>,
    buffer: &Bound<'_, PyAny>,
) -> PyResult<()> {
    match (
        Floats::get("the source", src)?,
        Floats::get("the buffer", buffer)?,
    ) {
        (Floats::F32(src), Floats::F32(buffer)) => {
            scatter_any(py, &src, src_stride, width, &slots, &buffer)
        }
        (Floats::Bf16(src), Floats::Bf16(buffer)) => {
            scatter_any(py, &src, src_stride, width, &slots, &buffer)
        }
        _ => Err(PyValueError::new_err(
            "the source and the buffer must both be float32 or both bfloat16",
        )),
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scatter_rows, m)?)
}
