//! The binding layer: exposes `srt-core` to Python as the private module `srt._rust`.
//! What crosses this boundary: ints, floats and bools, bytes and strings, runs of ids as int32
//! buffers (`array('i')`, numpy int32), and the CPU kernels' tensors as buffers of their memory
//! (numpy views, shared, never copied; see `boundary.rs`). The Python facades in `srt` are its
//! only importers. Each core structure has one binding file that registers its classes.

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
    "A data structure of srt's Rust core found one of its invariants broken (a bug in srt)."
);

/// Maps a core error to its Python exception: bad arguments become `ValueError`, broken
/// invariants `InvariantError`.
pub(crate) fn to_py_err(error: srt_core::Error) -> PyErr {
    match error {
        srt_core::Error::InvalidArgument(message) => PyValueError::new_err(message),
        srt_core::Error::Invariant(message) => InvariantError::new_err(message),
    }
}

#[pymodule]
fn _rust(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", srt_core::VERSION)?;
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
