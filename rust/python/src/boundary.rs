//! What crosses the boundary: runs of token or slot ids arrive as Python lists (or any sequence)
//! of ints and are read into `Vec<u32>` once; long runs are then processed without the GIL.

use pyo3::exceptions::PyOverflowError;
use pyo3::ffi;
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList};

/// Runs of at least this many ids are processed with the GIL released. Shorter ones keep it:
/// releasing and retaking the GIL costs more than the work, and the scheduler is one thread.
const DETACH_MIN: usize = 1 << 14;

/// A run of ids read from a Python sequence of ints (each must fit in `u32`).
pub(crate) struct Ints(pub(crate) Vec<u32>);

impl<'a, 'py> FromPyObject<'a, 'py> for Ints {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let len = obj.len()?;
        read_ints(&obj, 0, len).map(Ints)
    }
}

/// Items `start..end` of a sequence of ints (`end` at most its length), each fitting in `u32`.
/// Lists (what the scheduler passes) are read in place without the iterator protocol; other
/// sequences take pyo3's generic path.
pub(crate) fn read_ints(obj: &Bound<'_, PyAny>, start: usize, end: usize) -> PyResult<Vec<u32>> {
    let Ok(list) = obj.cast::<PyList>() else {
        let all: Vec<u32> = obj.extract()?;
        return Ok(all.get(start..end).unwrap_or_default().to_vec());
    };
    let end = end.min(list.len());
    let mut ids = Vec::with_capacity(end.saturating_sub(start));
    for i in start..end {
        // SAFETY: `list` is a live list (we hold the GIL and a reference to it) and
        // `i < end <= len`; nothing runs between the calls that could shrink it, since reading
        // an int runs no Python code. `PyList_GetItem` returns a borrowed reference that stays
        // valid while the list holds it, and we are done with it before the next call.
        let item = unsafe { ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t) };
        if item.is_null() {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: `item` is a valid borrowed pointer (checked above).
        let value = unsafe { ffi::PyLong_AsLong(item) };
        if value == -1 && PyErr::occurred(obj.py()) {
            return Err(PyErr::fetch(obj.py()));
        }
        let id = u32::try_from(value)
            .map_err(|_| PyOverflowError::new_err(format!("id {value} does not fit in u32")))?;
        ids.push(id);
    }
    Ok(ids)
}

/// Python int objects for ids `0..len`, made once and shared by every list handed out, as
/// CPython shares its small ints: building a list of slots is then a pointer copy per slot
/// rather than an allocation. Grows to the largest id seen (at most the KV pool size).
#[derive(Default)]
pub(crate) struct IntCache {
    ints: Vec<Py<PyInt>>,
}

impl IntCache {
    /// A new Python list of `ids`.
    pub(crate) fn list<'py>(
        &mut self,
        py: Python<'py>,
        ids: &[u32],
    ) -> PyResult<Bound<'py, PyList>> {
        if let Some(&max) = ids.iter().max() {
            let needed = max as usize + 1;
            let start = self.ints.len();
            if needed > start {
                self.ints.reserve(needed - start);
                for id in start..needed {
                    self.ints.push(PyInt::new(py, id).unbind());
                }
            }
        }
        PyList::new(py, ids.iter().map(|&id| self.ints[id as usize].bind(py)))
    }
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
