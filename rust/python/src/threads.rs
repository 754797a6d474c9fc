//! `srt._rust.pin_threads` and `thread_cpus`: the binding of `srt_kernels::parallel`'s pinning,
//! for the scheduler process, whose OpenMP threads run PyTorch's operators and srt's kernels.

use pyo3::prelude::*;
use srt_kernels::parallel;

use crate::to_py_err;

/// Pins OpenMP's threads one CPU each (thread `t` to `cpus[t]`); returns how many were pinned.
#[pyfunction]
fn pin_threads(py: Python<'_>, cpus: Vec<usize>) -> PyResult<usize> {
    py.detach(|| parallel::pin_threads(&cpus))
        .map_err(to_py_err)
}

/// The CPUs the calling thread may run on.
#[pyfunction]
fn thread_cpus() -> Vec<usize> {
    parallel::thread_cpus()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pin_threads, m)?)?;
    m.add_function(wrap_pyfunction!(thread_cpus, m)?)?;
    Ok(())
}
