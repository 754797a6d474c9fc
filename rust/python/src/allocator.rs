//! `srt._rust.TokenAllocator`: the binding of `srt_runtime::TokenAllocator`. Slots leave as
//! `array('i')` and come back as int32 buffers; a shortfall is `None`, a bad free a `ValueError`
//! naming the slot.

use pyo3::prelude::*;
use srt_runtime::TokenAllocator;

use crate::boundary::{int32_array, maybe_detach, Ids};
use crate::to_py_err;

/// The free list of KV slots (whole pages of them when `page_size > 1`); slot 0 is padding.
#[pyclass(name = "TokenAllocator", module = "srt._rust")]
pub(crate) struct PyTokenAllocator {
    inner: TokenAllocator,
}

impl PyTokenAllocator {
    /// The core allocator, for the radix tree's `evict_into`.
    pub(crate) fn inner_mut(&mut self) -> &mut TokenAllocator {
        &mut self.inner
    }
}

#[pymethods]
impl PyTokenAllocator {
    #[new]
    #[pyo3(signature = (size, page_size = 1))]
    fn new(size: usize, page_size: usize) -> PyResult<Self> {
        let inner = TokenAllocator::new(size, page_size).map_err(to_py_err)?;
        Ok(PyTokenAllocator { inner })
    }

    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    #[getter]
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    fn available(&self) -> usize {
        self.inner.available()
    }

    fn alloc<'py>(&mut self, py: Python<'py>, n: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
        let inner = &mut self.inner;
        match maybe_detach(py, n, || inner.alloc(n)).map_err(to_py_err)? {
            Some(slots) => Ok(Some(int32_array(py, &slots)?)),
            None => Ok(None),
        }
    }

    fn free(&mut self, py: Python<'_>, slots: Ids) -> PyResult<()> {
        let inner = &mut self.inner;
        maybe_detach(py, slots.0.len(), || inner.free(&slots.0)).map_err(to_py_err)
    }

    fn clear(&mut self) {
        self.inner.clear();
    }

    fn is_allocated(&self, slot: u32) -> bool {
        self.inner.is_allocated(slot)
    }
}

/// Adds the allocator's class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTokenAllocator>()
}
