//! The pure Rust core of srt. Nothing here knows about Python: the pyo3 bindings live in the
//! `srt-python` crate, which is the only place where Python types appear.

pub mod allocator;
pub mod attention;
pub mod decode_window;
pub mod decoder;
pub mod detokenizer;
pub mod element;
pub mod error;
pub mod gemm;
pub mod isa;
pub mod moe;
pub mod ops;
pub mod parallel;
pub mod quant;
pub mod radix;
pub mod ring;
pub mod scatter;
#[cfg(test)]
mod test_tokenizer;
#[cfg(test)]
mod test_values;

pub use allocator::TokenAllocator;
pub use error::{Error, Result};
pub use radix::{NodeHandle, RadixTree};

/// The version of the core, shared by the Python package (`srt._rust.__version__`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
