//! The CPU kernels of srt, on instruction-set tiers: each tier's functions take a token that
//! only detection of the CPU's features can make (`isa`). Nothing here knows about Python (the
//! pyo3 bindings live in the `srt-python` crate) or about serving (the radix tree, allocator,
//! detokenizer and rings are the `srt-runtime` crate).

pub mod attention;
pub mod decoder;
pub mod element;
pub mod error;
pub mod gemm;
pub mod isa;
pub mod moe;
pub mod ops;
pub mod parallel;
pub mod quant;
pub mod scatter;
#[cfg(test)]
mod test_values;

pub use error::{Error, Result};
