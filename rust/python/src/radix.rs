//! `srt._rust.RadixTree`: the binding of `srt_core::RadixTree`. Node handles are plain ints;
//! token and slot runs are lists of ints. Long runs are processed without the GIL.

use pyo3::prelude::*;
use pyo3::types::PyList;
use srt_core::{NodeHandle, RadixTree};

use crate::boundary::{maybe_detach, IntCache, Ints};
use crate::to_py_err;

/// The prefix cache's radix tree: token-id prefixes → the KV slots that hold them.
#[pyclass(name = "RadixTree", module = "srt._rust")]
pub(crate) struct PyRadixTree {
    inner: RadixTree,
    ints: IntCache,
}

#[pymethods]
impl PyRadixTree {
    #[new]
    #[pyo3(signature = (page_size = 1))]
    fn new(page_size: usize) -> PyResult<Self> {
        let inner = RadixTree::new(page_size).map_err(to_py_err)?;
        Ok(PyRadixTree {
            inner,
            ints: IntCache::default(),
        })
    }

    #[getter]
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    fn root(&self) -> NodeHandle {
        self.inner.root()
    }

    fn match_prefix<'py>(
        &mut self,
        py: Python<'py>,
        tokens: Ints,
    ) -> PyResult<(Bound<'py, PyList>, NodeHandle)> {
        let inner = &mut self.inner;
        let (slots, node) = maybe_detach(py, tokens.0.len(), || inner.match_prefix(&tokens.0));
        Ok((self.ints.list(py, &slots)?, node))
    }

    fn insert(&mut self, py: Python<'_>, tokens: Ints, slots: Ints) -> PyResult<usize> {
        let inner = &mut self.inner;
        maybe_detach(py, tokens.0.len(), || inner.insert(&tokens.0, &slots.0)).map_err(to_py_err)
    }

    fn lock(&mut self, node: NodeHandle) -> PyResult<i64> {
        self.inner.lock(node).map_err(to_py_err)
    }

    fn unlock(&mut self, node: NodeHandle) -> PyResult<i64> {
        self.inner.unlock(node).map_err(to_py_err)
    }

    fn evict<'py>(&mut self, py: Python<'py>, num_tokens: usize) -> PyResult<Bound<'py, PyList>> {
        let inner = &mut self.inner;
        let slots = maybe_detach(py, inner.evictable_size(), || inner.evict(num_tokens));
        self.ints.list(py, &slots)
    }

    fn evictable_size(&self) -> usize {
        self.inner.evictable_size()
    }

    fn protected_size(&self) -> usize {
        self.inner.protected_size()
    }

    fn total_size(&self) -> usize {
        self.inner.total_size()
    }

    fn reset(&mut self) {
        self.inner.reset();
    }

    fn validate(&self) -> PyResult<()> {
        self.inner.validate().map_err(to_py_err)
    }
}

/// Adds the radix tree's class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRadixTree>()
}
