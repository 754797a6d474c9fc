//! The binding layer: exposes `srt-core` to Python as the private module `srt._rust`.
//! Only ints, bytes and strings cross this boundary; the Python facades in `srt` are its only
//! importers.

use pyo3::prelude::*;

#[pymodule]
fn _rust(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", srt_core::VERSION)?;
    Ok(())
}
