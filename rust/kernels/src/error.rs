//! The error type of the kernels. The binding layer maps `InvalidArgument` to Python's
//! `ValueError` and `Invariant` to `srt._rust.InvariantError`.

use std::fmt;

/// Why a kernel refused its call: an argument it cannot take (a length, a shape, a format), or
/// one of its invariants found broken.
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

/// The result of a kernel call.
pub type Result<T> = std::result::Result<T, Error>;

/// The number of elements of `what`, of shape `dims`: the product of the dimensions, or
/// `InvalidArgument` when it does not fit in `usize`. Sizes that come from callers go through
/// this (never a bare `*`): a product that wraps around would let a short buffer pass a length
/// check that the kernel then reads past.
pub(crate) fn elements(what: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |product, &dim| product.checked_mul(dim))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{what} of shape {dims:?} has more elements than memory can hold"
            ))
        })
}

/// `InvalidArgument` unless a buffer of floats named `what` holds `expected` of them.
pub(crate) fn check_len(what: &str, len: usize, expected: usize) -> Result<()> {
    if len != expected {
        return Err(Error::InvalidArgument(format!(
            "{what} has {len} floats, expected {expected}"
        )));
    }
    Ok(())
}

/// `InvalidArgument` unless `rows` rows of `width` elements, `stride` apart, fit in a buffer of
/// `len` elements named `what`: `stride >= width` (rows never overlap) and the last row's end,
/// `(rows - 1) · stride + width`, computed without overflow, at most `len`.
pub(crate) fn check_rows(
    what: &str,
    len: usize,
    rows: usize,
    stride: usize,
    width: usize,
) -> Result<()> {
    if stride < width {
        return Err(Error::InvalidArgument(format!(
            "{what}'s rows are {stride} elements apart, less than their width {width}"
        )));
    }
    let end = rows
        .checked_sub(1)
        .map_or(Some(0), |last| last.checked_mul(stride)?.checked_add(width))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{what}'s {rows} rows {stride} elements apart span more than memory can hold"
            ))
        })?;
    if end > len {
        return Err(Error::InvalidArgument(format!(
            "{what} has {len} elements, but its {rows} rows {stride} apart end at {end}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_refuses_products_that_overflow() {
        assert_eq!(elements("x", &[3, 4, 5]), Ok(60));
        assert_eq!(elements("x", &[]), Ok(1));
        assert_eq!(elements("x", &[usize::MAX, 0]), Ok(0));
        let err = elements("the input", &[usize::MAX / 2, 3]).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        assert!(err.to_string().starts_with("the input of shape"), "{err}");
    }

    #[test]
    fn check_rows_bounds_the_last_row_and_refuses_overlapping_rows() {
        // 3 rows of 4, 10 apart: the last ends at 24.
        assert_eq!(check_rows("x", 24, 3, 10, 4), Ok(()));
        assert_eq!(check_rows("x", 100, 3, 10, 4), Ok(()));
        assert!(check_rows("x", 23, 3, 10, 4).is_err());
        assert!(check_rows("x", 100, 3, 3, 4).is_err());
        assert_eq!(check_rows("x", 0, 0, 10, 4), Ok(()));
        assert_eq!(check_rows("x", 4, 1, usize::MAX, 4), Ok(()));
        let err = check_rows("x", usize::MAX, 3, usize::MAX / 2 + 1, 4).unwrap_err();
        assert!(err.to_string().contains("more than memory"), "{err}");
        let err = check_rows("x", usize::MAX, 2, usize::MAX, 4).unwrap_err();
        assert!(err.to_string().contains("more than memory"), "{err}");
    }
}
