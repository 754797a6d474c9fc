//! Binding of `srt_core::detokenizer`: the class `srt._rust.IncrementalDetokenizer`.
//! Its only importer is `srt.managers.incremental_detokenizer`, which documents the semantics.
//! Decoding runs with the GIL released; a second thread calling the same object meanwhile gets
//! pyo3's "already borrowed" error rather than a data race.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use srt_core::detokenizer::{IncrementalDetokenizer, RequestOptions, StepOutput};

use crate::to_py_err;

/// A step's result as it crosses: (new text, matched stop string or None).
type PyStepOutput = (String, Option<String>);

/// A batch's results as they cross: the texts and the matched stop strings, in request order
/// (two lists rather than a tuple per request: fewer Python objects per step).
type PyBatchOutput = (Vec<String>, Vec<Option<String>>);

fn to_py(output: StepOutput) -> PyStepOutput {
    (output.text, output.matched_stop)
}

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

    #[pyo3(signature = (rid, *, skip_special_tokens, stop, include_stop_str_in_output, context_ids))]
    fn add_request(
        &mut self,
        py: Python<'_>,
        rid: &str,
        skip_special_tokens: bool,
        stop: Vec<String>,
        include_stop_str_in_output: bool,
        context_ids: Vec<u32>,
    ) -> PyResult<()> {
        let options = RequestOptions {
            skip_special_tokens,
            stop,
            include_stop_str_in_output,
            context_ids,
        };
        let inner = &mut self.inner;
        py.detach(|| inner.add_request(rid, options))
            .map_err(to_py_err)
    }

    fn step(&mut self, py: Python<'_>, rid: &str, new_ids: Vec<u32>) -> PyResult<PyStepOutput> {
        let inner = &mut self.inner;
        py.detach(|| inner.step(rid, &new_ids))
            .map(to_py)
            .map_err(to_py_err)
    }

    fn step_batch(
        &mut self,
        py: Python<'_>,
        rids: Vec<PyBackedStr>,
        new_ids: Vec<Vec<u32>>,
    ) -> PyResult<PyBatchOutput> {
        let inner = &mut self.inner;
        let outputs = py
            .detach(|| inner.step_batch(&rids, &new_ids))
            .map_err(to_py_err)?;
        Ok(outputs
            .into_iter()
            .map(|output| (output.text, output.matched_stop))
            .unzip())
    }

    fn finish(&mut self, py: Python<'_>, rid: &str) -> PyResult<PyStepOutput> {
        let inner = &mut self.inner;
        py.detach(|| inner.finish(rid))
            .map(to_py)
            .map_err(to_py_err)
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
