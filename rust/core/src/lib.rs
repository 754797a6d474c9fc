//! The pure Rust core of srt. Nothing here knows about Python: the pyo3 bindings live in the
//! `srt-python` crate, which is the only place where Python types appear.

pub mod error;
pub mod ring;

pub use error::{Error, Result};

/// The version of the core, shared by the Python package (`srt._rust.__version__`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
