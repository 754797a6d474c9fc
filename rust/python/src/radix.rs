//! `srt._rust.RadixTree`: the binding of `srt_runtime::RadixTree`. Node handles are plain ints;
//! token and slot runs come in as int32 buffers (see `boundary`) and slots leave as
//! `array('i')`. Long runs are processed without the GIL.

use pyo3::prelude::*;
use srt_runtime::{Error, NodeHandle, RadixTree};

use crate::allocator::PyTokenAllocator;
use crate::boundary::{int32_array, maybe_detach, Ids};
use crate::to_py_err;

/// The prefix cache's radix tree: token-id prefixes → the KV slots that hold them.
#[pyclass(name = "RadixTree", module = "srt._rust")]
pub(crate) struct PyRadixTree {
    inner: RadixTree,
}

#[pymethods]
impl PyRadixTree {
    #[new]
    #[pyo3(signature = (page_size = 1))]
    fn new(page_size: usize) -> PyResult<Self> {
        let inner = RadixTree::new(page_size).map_err(to_py_err)?;
        Ok(PyRadixTree { inner })
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
        tokens: Ids,
    ) -> PyResult<(Bound<'py, PyAny>, NodeHandle)> {
        let inner = &mut self.inner;
        let (slots, node) = maybe_detach(py, tokens.0.len(), || inner.match_prefix(&tokens.0));
        Ok((int32_array(py, &slots)?, node))
    }

    fn insert(&mut self, py: Python<'_>, tokens: Ids, slots: Ids) -> PyResult<usize> {
        let inner = &mut self.inner;
        maybe_detach(py, tokens.0.len(), || inner.insert(&tokens.0, &slots.0)).map_err(to_py_err)
    }

    fn lock(&mut self, node: NodeHandle) -> PyResult<i64> {
        self.inner.lock(node).map_err(to_py_err)
    }

    fn unlock(&mut self, node: NodeHandle) -> PyResult<i64> {
        self.inner.unlock(node).map_err(to_py_err)
    }

    fn evict<'py>(&mut self, py: Python<'py>, num_tokens: usize) -> PyResult<Bound<'py, PyAny>> {
        let inner = &mut self.inner;
        let slots = maybe_detach(py, num_tokens, || inner.evict(num_tokens));
        int32_array(py, &slots)
    }

    /// Evicts like `evict` and frees the slots straight into `allocator`, so they never become
    /// Python ints; returns how many were evicted. A slot the allocator refuses means the tree
    /// held a slot that was not allocated: an `InvariantError`.
    fn evict_into(
        &mut self,
        py: Python<'_>,
        mut allocator: PyRefMut<'_, PyTokenAllocator>,
        num_tokens: usize,
    ) -> PyResult<usize> {
        let (tree, pool) = (&mut self.inner, allocator.inner_mut());
        maybe_detach(py, num_tokens, || {
            let slots = tree.evict(num_tokens);
            pool.free(&slots)
                .map_err(|e| Error::Invariant(format!("evicted {e}")))?;
            Ok::<_, Error>(slots.len())
        })
        .map_err(to_py_err)
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
