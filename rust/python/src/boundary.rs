//! What crosses the boundary: runs of token or slot ids arrive as int32 buffers (`array('i')`,
//! numpy int32: what srt passes around) and are copied out in one piece, with no per-item
//! Python work; lists and tuples of ints are accepted too, for convenience, at Python speed.
//! Runs of slot ids leave as `array('i')`, which the model runner reads with `torch.frombuffer`.
//! The CPU kernels' tensors arrive as numpy views of their memory, shared, never copied.

use std::ptr::NonNull;

use pyo3::buffer::{Element, PyBuffer, PyUntypedBuffer};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyTuple, PyType};
use srt_kernels::element::Bf16;

/// Runs of at least this many ids are processed with the GIL released. Shorter ones keep it:
/// releasing and retaking the GIL costs more than the work, and the scheduler is one thread.
const DETACH_MIN: usize = 1 << 14;

/// A run of ids (each a non-negative int32) read from an int32 buffer or a sequence of ints.
pub(crate) struct Ids(pub(crate) Vec<u32>);

impl<'a, 'py> FromPyObject<'a, 'py> for Ids {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
            return Ok(Ids(obj.extract()?));
        }
        let Ok(raw) = PyUntypedBuffer::get(&obj) else {
            return Err(PyTypeError::new_err(format!(
                "expected ids as an int32 buffer (array('i'), numpy int32) or a list of ints, \
                 got {}",
                obj.get_type().name()?
            )));
        };
        if raw.dimensions() != 1 {
            return Err(PyValueError::new_err(format!(
                "expected a 1-D buffer of ids, got {} dimensions",
                raw.dimensions()
            )));
        }
        if raw.item_count() == 0 && raw.item_size() == 4 {
            // An empty `array` exposes a 1-byte-aligned dummy pointer, which `as_typed`
            // would reject as misaligned; there is nothing to read anyway.
            return Ok(Ids(Vec::new()));
        }
        let buffer: &PyBuffer<i32> = raw.as_typed().map_err(|_| {
            PyTypeError::new_err(format!(
                "expected int32 ids (array('i'), numpy int32), got buffer format {:?}",
                raw.format().to_string_lossy()
            ))
        })?;
        // One copy (a memcpy when contiguous, strided otherwise); the buffer is released after.
        let ids = buffer.to_vec(obj.py())?;
        if let Some(bad) = ids.iter().find(|&&id| id < 0) {
            return Err(PyOverflowError::new_err(format!(
                "id {bad} is negative (ids must fit in u32)"
            )));
        }
        Ok(Ids(ids.into_iter().map(|id| id as u32).collect()))
    }
}

/// `array.array`, looked up once.
static ARRAY_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// A new `array('i')` holding `ids`: one bytes object filled in place, copied once by `array`.
/// Every id must fit in int32 (slot ids are below the KV pool size).
pub(crate) fn int32_array<'py>(py: Python<'py>, ids: &[u32]) -> PyResult<Bound<'py, PyAny>> {
    if let Some(bad) = ids.iter().find(|&&id| id > i32::MAX as u32) {
        return Err(PyOverflowError::new_err(format!(
            "id {bad} does not fit in int32"
        )));
    }
    let bytes = PyBytes::new_with(py, size_of_val(ids), |buf| {
        for (out, id) in buf.chunks_exact_mut(4).zip(ids) {
            out.copy_from_slice(&id.to_ne_bytes());
        }
        Ok(())
    })?;
    let array = ARRAY_TYPE.import(py, "array", "array")?;
    array.call1((intern!(py, "i"), bytes))
}

/// Runs `f` with the GIL released when `n` (the size of its work) is large enough to pay for it.
pub(crate) fn maybe_detach<T, F>(py: Python<'_>, n: usize, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if n >= DETACH_MIN {
        py.detach(f)
    } else {
        f()
    }
}

/// A typed buffer's memory (a CPU tensor's numpy view, an int32 array), which must be
/// C-contiguous, and writable when `writable`.
pub(crate) fn contiguous<T: Element>(
    what: &str,
    buffer: &PyBuffer<T>,
    writable: bool,
) -> PyResult<NonNull<[T]>> {
    if writable && buffer.readonly() {
        return Err(PyValueError::new_err(format!("{what} is read-only")));
    }
    buffer
        .as_slice_ptr()
        .ok_or_else(|| PyValueError::new_err(format!("{what} is not C-contiguous")))
}

/// Whether the memory of two buffers shares any byte.
pub(crate) fn overlap<A, B>(a: NonNull<[A]>, b: NonNull<[B]>) -> bool {
    let (a_start, a_end) = address_range(a);
    let (b_start, b_end) = address_range(b);
    a_start < b_end && b_start < a_end
}

/// A product's buffers as slices: the input, the weight and the bias read, the output written.
pub(crate) type ProductSlices<'a, X, W, O> = (&'a [X], &'a [W], Option<&'a [f32]>, &'a mut [O]);

/// A product's buffers (the input `x`, the weight, the bias, the output `out`) as slices, or a
/// `ValueError` when the output overlaps an input.
///
/// # Safety
/// Every buffer stays acquired by the caller (its memory alive) for `'a`.
pub(crate) unsafe fn product_slices<'a, X, W, O>(
    x: NonNull<[X]>,
    weight: NonNull<[W]>,
    bias: Option<NonNull<[f32]>>,
    out: NonNull<[O]>,
) -> PyResult<ProductSlices<'a, X, W, O>> {
    if overlap(weight, out) || overlap(x, out) || bias.is_some_and(|b| overlap(b, out)) {
        return Err(PyValueError::new_err("the output overlaps an input"));
    }
    // SAFETY: the caller keeps every buffer acquired for `'a`; the output overlaps none of the
    // inputs, so the one mutable slice aliases nothing.
    Ok(unsafe {
        (
            x.as_ref(),
            weight.as_ref(),
            bias.map(|b| b.as_ref()),
            &mut *out.as_ptr(),
        )
    })
}

/// A float32 product's buffers (the input `x`, the weight named `what`, the bias, the output
/// `out`) as slices: C-contiguous, the output writable and overlapping none of the inputs.
pub(crate) fn float_product<'a, W: Element>(
    x: &'a PyBuffer<f32>,
    (what, weight): (&str, &'a PyBuffer<W>),
    bias: Option<&'a PyBuffer<f32>>,
    out: &'a PyBuffer<f32>,
) -> PyResult<ProductSlices<'a, f32, W, f32>> {
    let input = contiguous("the input", x, false)?;
    let weight = contiguous(what, weight, false)?;
    let bias = bias.map(|b| contiguous("the bias", b, false)).transpose()?;
    let output = contiguous("the output", out, true)?;
    // SAFETY: the buffers are borrowed for `'a`, so they stay acquired that long.
    unsafe { product_slices(input, weight, bias, output) }
}

/// The addresses a buffer spans. Its length is the exporter's word: the arithmetic saturates
/// rather than wrap, so that a wrong length can only make buffers look overlapping (refused),
/// never disjoint.
fn address_range<T>(buffer: NonNull<[T]>) -> (usize, usize) {
    let start = buffer.cast::<T>().as_ptr() as usize;
    let bytes = buffer.len().saturating_mul(size_of::<T>());
    (start, start.saturating_add(bytes))
}

/// A bf16 tensor's memory, received as int16 (its bits), as bf16 elements: the same bytes and
/// count (both types are 16 bits, `Bf16` a transparent `u16`).
pub(crate) fn bf16_bits(buffer: NonNull<[i16]>) -> NonNull<[Bf16]> {
    NonNull::slice_from_raw_parts(buffer.cast::<Bf16>(), buffer.len())
}

/// A CPU tensor's memory as float32 or bfloat16 (whose bits arrive as an int16 buffer).
pub(crate) enum Floats {
    F32(PyBuffer<f32>),
    Bf16(PyBuffer<i16>),
}

impl Floats {
    /// `obj`'s buffer, named `what` in errors. Acquired once and typed by its format, so that
    /// a bf16 buffer costs no failed float32 attempt (an exception made and dropped: a few
    /// percent of a decode step's kernel call).
    pub(crate) fn get(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<Floats> {
        let refused = || {
            PyValueError::new_err(format!(
                "{what} must be a float32 or an int16 (bfloat16 bits) buffer"
            ))
        };
        let buffer = PyUntypedBuffer::get(obj).map_err(|_| refused())?;
        if <f32 as Element>::is_compatible_format(buffer.format()) {
            buffer.into_typed().map(Floats::F32)
        } else {
            buffer.into_typed().map(Floats::Bf16)
        }
        .map_err(|_| refused())
    }
}

/// Buffers of one element type, as the row-wise kernels and decode attention take them: all
/// float32, or all bfloat16 bits (int16).
pub(crate) enum SameFloats<const N: usize> {
    F32([PyBuffer<f32>; N]),
    Bf16([PyBuffer<i16>; N]),
}

impl<const N: usize> SameFloats<N> {
    /// The buffers of `objs`, each named in errors, which must all be of one type.
    pub(crate) fn get(objs: [(&str, &Bound<'_, PyAny>); N]) -> PyResult<Self> {
        let (mut f32s, mut bf16s) = (Vec::with_capacity(N), Vec::with_capacity(N));
        for (what, obj) in objs {
            match Floats::get(what, obj)? {
                Floats::F32(buffer) => f32s.push(buffer),
                Floats::Bf16(buffer) => bf16s.push(buffer),
            }
        }
        if let Ok(all) = f32s.try_into() {
            return Ok(SameFloats::F32(all));
        }
        if let Ok(all) = bf16s.try_into() {
            return Ok(SameFloats::Bf16(all));
        }
        let names: Vec<&str> = objs.iter().map(|&(what, _)| what).collect();
        Err(PyValueError::new_err(format!(
            "{} must all be float32 or all bfloat16",
            names.join(", ")
        )))
    }
}
