//! Binding of `srt_runtime::detokenizer`: the class `srt._rust.IncrementalDetokenizer`.
//! Its only importer is `srt.managers.incremental_detokenizer`, which documents the semantics.
//! Decoding runs with the GIL released; a second thread calling the same object meanwhile gets
//! pyo3's "already borrowed" error rather than a data race.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use srt_runtime::detokenizer::{IncrementalDetokenizer, RequestOptions};

use crate::to_py_err;

/// Incremental detokenizer over a `tokenizer.json`, with the decode state of many requests.
#[pyclass(module = "srt._rust", name = "IncrementalDetokenizer")]
pub struct PyIncrementalDetokenizer {
    inner: IncrementalDetokenizer,
}

#[pymethods]
impl PyIncrementalDetokenizer {
    #[new]
    fn new(py: Python<'_>, tokenizer_json: &str) -> PyResult<Self> {
        let inner = py
            .detach(|| IncrementalDetokenizer::from_file(tokenizer_json))
            .map_err(to_py_err)?;
        Ok(PyIncrementalDetokenizer { inner })
    }

    #[pyo3(signature = (rid, *, skip_special_tokens, context_ids))]
    fn add_request(
        &mut self,
        py: Python<'_>,
        rid: &str,
        skip_special_tokens: bool,
        context_ids: Vec<u32>,
    ) -> PyResult<()> {
        let options = RequestOptions {
            skip_special_tokens,
            context_ids,
        };
        let inner = &mut self.inner;
        py.detach(|| inner.add_request(rid, options))
            .map_err(to_py_err)
    }

    fn step(&mut self, py: Python<'_>, rid: &str, new_ids: Vec<u32>) -> PyResult<String> {
        let inner = &mut self.inner;
        py.detach(|| inner.step(rid, &new_ids)).map_err(to_py_err)
    }

    fn step_batch(
        &mut self,
        py: Python<'_>,
        rids: Vec<PyBackedStr>,
        new_ids: Vec<Vec<u32>>,
    ) -> PyResult<Vec<String>> {
        let inner = &mut self.inner;
        py.detach(|| inner.step_batch(&rids, &new_ids))
            .map_err(to_py_err)
    }

    fn finish(&mut self, py: Python<'_>, rid: &str) -> PyResult<String> {
        let inner = &mut self.inner;
        py.detach(|| inner.finish(rid)).map_err(to_py_err)
    }

    fn free(&mut self, rid: &str) -> PyResult<()> {
        self.inner.free(rid).map_err(to_py_err)
    }

    fn __len__(&self) -> usize {
        self.inner.num_requests()
    }

    fn __contains__(&self, rid: &str) -> bool {
        self.inner.contains(rid)
    }
}

/// Registers the detokenizer class on `srt._rust`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyIncrementalDetokenizer>()
}
