//! The error type of the serving structures. The binding layer maps `InvalidArgument` to Python's
//! `ValueError` and `Invariant` to `srt._rust.InvariantError`.

use std::fmt;

/// Why an operation of the serving structures failed. Expected shortfalls (an allocator out of slots, a full ring) are
/// not errors: they are `None`/`false` results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The caller passed something the operation cannot take.
    InvalidArgument(String),
    /// A data structure found one of its invariants broken: a bug, never a user error.
    Invariant(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(message) | Error::Invariant(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

/// The result of a fallible operation of the serving structures.
pub type Result<T> = std::result::Result<T, Error>;
