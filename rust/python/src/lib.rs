//! The binding layer: exposes `srt-runtime` and `srt-kernels` to Python as the private module
//! `srt._rust`. What crosses this boundary: ints, floats and bools, bytes and strings, runs of
//! ids as int32 buffers (`array('i')`, numpy int32), and the CPU kernels' tensors as buffers of
//! their memory (numpy views, shared, never copied; see `boundary.rs`). The Python facades in
//! `srt` are its only importers. Each structure or kernel family has one binding file that
//! registers its classes and functions.

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

mod allocator;
mod attention;
mod boundary;
mod decoder;
mod detokenizer;
mod gemm;
mod moe;
mod ops;
mod packed;
mod quant;
mod radix;
mod ring;
mod scatter;
mod threads;

create_exception!(
    _rust,
    InvariantError,
    PyRuntimeError,
    "A data structure of srt's Rust crates found one of its invariants broken (a bug in srt)."
);

/// Why an operation of either crate failed, as the binding raises it.
pub(crate) enum Failure {
    InvalidArgument(String),
    Invariant(String),
}

impl From<srt_runtime::Error> for Failure {
    fn from(error: srt_runtime::Error) -> Self {
        match error {
            srt_runtime::Error::InvalidArgument(message) => Failure::InvalidArgument(message),
            srt_runtime::Error::Invariant(message) => Failure::Invariant(message),
        }
    }
}

impl From<srt_kernels::Error> for Failure {
    fn from(error: srt_kernels::Error) -> Self {
        match error {
            srt_kernels::Error::InvalidArgument(message) => Failure::InvalidArgument(message),
            srt_kernels::Error::Invariant(message) => Failure::Invariant(message),
        }
    }
}

/// Maps an error of the runtime or the kernels to its Python exception: bad arguments become
/// `ValueError`, broken invariants `InvariantError`.
pub(crate) fn to_py_err(error: impl Into<Failure>) -> PyErr {
    match error.into() {
        Failure::InvalidArgument(message) => PyValueError::new_err(message),
        Failure::Invariant(message) => InvariantError::new_err(message),
    }
}

#[pymodule]
fn _rust(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", srt_runtime::VERSION)?;
    m.add("InvariantError", m.py().get_type::<InvariantError>())?;
    radix::register(m)?;
    allocator::register(m)?;
    detokenizer::register(m)?;
    ring::register(m)?;
    gemm::register(m)?;
    attention::register(m)?;
    ops::register(m)?;
    moe::register(m)?;
    scatter::register(m)?;
    threads::register(m)?;
    quant::register(m)?;
    packed::register(m)?;
    decoder::register(m)?;
    Ok(())
}
