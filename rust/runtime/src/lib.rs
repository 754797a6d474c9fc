//! The serving structures of srt: the radix tree of cached prefixes, the KV-slot allocator, the
//! incremental detokenizer and the shared-memory rings that join its processes. Nothing here
//! knows about Python (the pyo3 bindings live in the `srt-python` crate) or computes on tensors
//! (the `srt-kernels` crate).

pub mod allocator;
pub mod decode_window;
pub mod detokenizer;
pub mod error;
pub mod radix;
pub mod ring;
#[cfg(test)]
mod test_tokenizer;

pub use allocator::TokenAllocator;
pub use error::{Error, Result};
pub use radix::{NodeHandle, RadixTree};

/// The version of the runtime, shared by the Python package (`srt._rust.__version__`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
