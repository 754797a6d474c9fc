//! `srt._rust.RadixTree`: the binding of `srt_core::RadixTree`. Node handles are plain ints;
//! token and slot runs are lists of ints. Long runs are processed without the GIL.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use srt_core::{Error, NodeHandle, RadixTree};

use crate::allocator::PyTokenAllocator;
use crate::boundary::{maybe_detach, read_ints, IntCache, Ints};
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

    /// Reads only the slots of the part not cached yet (the scheduler's inserts are mostly
    /// cached already), with the GIL held since they come from a Python list.
    fn insert(&mut self, tokens: Ints, slots: &Bound<'_, PyAny>) -> PyResult<usize> {
        let (num_tokens, num_slots) = (tokens.0.len(), slots.len()?);
        if num_tokens != num_slots {
            return Err(PyValueError::new_err(format!(
                "insert got {num_tokens} tokens but {num_slots} slots"
            )));
        }
        let mut read_error = None;
        let result = self.inner.insert_with(&tokens.0, |start, end| {
            read_ints(slots, start, end)
                .map_err(|e| read_error = Some(e))
                .ok()
        });
        match read_error {
            Some(error) => Err(error),
            None => result.map_err(to_py_err),
        }
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
        maybe_detach(py, tree.evictable_size(), || {
            let slots = tree.evict(num_tokens);
            pool.free(&slots)
                .map_err(|e| Error::Invariant(format!("evicted {e}")))?;
            Ok(slots.len())
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
