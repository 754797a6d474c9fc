//! Row scatter: copies rows of a source, which may lie at a stride (the K or V columns of a
//! fused QKV projection's output), into the rows of a buffer named by slot indices. This is the
//! KV cache's store of new tokens on the CPU.
//!
//! Why: PyTorch's `index_copy_` of a strided `[tokens, kv_heads, head_dim]` view copies element
//! by element (about 1.8 GB/s for SmolLM2's 384-byte K rows); a row is contiguous in both the
//! source and the buffer, so each is one `memcpy`.
//!
//! Every slot is checked before any row is written: a refused call leaves the buffer as it was.
//! Rows are copied in order on the calling thread, so when a slot repeats the last row wins.
//! One thread is enough: a call is a few hundred kilobytes of copies at most (a prefill
//! chunk's rows of one layer), and splitting it would have to rule out two threads writing
//! the same repeated slot.

use crate::error::check_rows;
use crate::{Error, Result};

/// Copies row `i` of `src` (`width` elements, starting at `i · src_stride`) to row `slots[i]`
/// of `buffer` (rows of `width` elements), for each of the `slots.len()` rows. Slots are int64,
/// as the KV pool's slot tensors are; each must be a row of `buffer`.
pub fn scatter_rows<T: Copy>(
    src: &[T],
    src_stride: usize,
    width: usize,
    slots: &[i64],
    buffer: &mut [T],
) -> Result<()> {
    if width == 0 || !buffer.len().is_multiple_of(width) {
        return Err(Error::InvalidArgument(format!(
            "a buffer of {} elements does not hold rows of {width}",
            buffer.len()
        )));
    }
    check_rows("the source", src.len(), slots.len(), src_stride, width)?;
    let rows = buffer.len() / width;
    if let Some(&bad) = slots
        .iter()
        .find(|&&slot| usize::try_from(slot).map_or(true, |slot| slot >= rows))
    {
        return Err(Error::InvalidArgument(format!(
            "slot {bad} is not one of the buffer's {rows} rows"
        )));
    }
    for (i, &slot) in slots.iter().enumerate() {
        // Both ranges are in bounds: `check_rows` bounded the source's rows and the loop above
        // every slot (a non-negative value below `rows`, so it fits in usize).
        let target = slot as usize * width;
        buffer[target..target + width].copy_from_slice(&src[i * src_stride..][..width]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::Bf16;

    /// The scatter written the obvious way: element by element, last slot wins.
    fn reference<T: Copy>(src: &[T], stride: usize, width: usize, slots: &[i64], buffer: &mut [T]) {
        for (i, &slot) in slots.iter().enumerate() {
            for j in 0..width {
                buffer[slot as usize * width + j] = src[i * stride + j];
            }
        }
    }

    fn source(len: usize) -> Vec<f32> {
        crate::test_values::values(len, 7)
    }

    #[test]
    fn scatter_equals_the_reference_for_contiguous_and_strided_rows() {
        let (width, rows) = (192, 40);
        // 30 rows: strided as K among [q | k | v] columns (stride 5 · width) and contiguous;
        // slots in any order, one of them the last row.
        let slots: Vec<i64> = (0..30).map(|i| (i * 17 + 3) % rows as i64).collect();
        assert!(slots.contains(&(rows as i64 - 1)));
        for stride in [width, 5 * width, width + 1] {
            let src = source(29 * stride + width);
            let mut got = vec![f32::NAN; rows * width];
            let mut want = got.clone();
            scatter_rows(&src, stride, width, &slots, &mut got).unwrap();
            reference(&src, stride, width, &slots, &mut want);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "stride {stride}"
            );
        }
    }

    #[test]
    fn bf16_rows_and_repeated_slots_scatter_as_the_reference() {
        let (width, stride) = (64, 320);
        let src: Vec<Bf16> = source(3 * stride + width)
            .iter()
            .map(|&v| Bf16::from_f32(v))
            .collect();
        let slots = [2, 0, 2, 5];
        let mut got = vec![Bf16(0x7fc0); 6 * width];
        let mut want = got.clone();
        scatter_rows(&src, stride, width, &slots, &mut got).unwrap();
        reference(&src, stride, width, &slots, &mut want);
        assert_eq!(got, want);
        // Rows no slot names are untouched.
        assert!(got[width..2 * width].iter().all(|&v| v == Bf16(0x7fc0)));
        assert_eq!(
            &got[2 * width..3 * width],
            &src[2 * stride..2 * stride + width]
        );
    }

    #[test]
    fn no_slots_write_nothing() {
        let mut buffer = vec![1.0f32; 8];
        scatter_rows(&[], 4, 4, &[], &mut buffer).unwrap();
        assert_eq!(buffer, vec![1.0; 8]);
    }

    #[test]
    fn slots_outside_the_buffer_are_refused_before_anything_is_written() {
        let src = source(4 * 8);
        let mut buffer = vec![0.0f32; 3 * 8];
        for bad in [3, -1, i64::MAX, i64::MIN] {
            let err = scatter_rows(&src, 8, 8, &[0, 1, bad, 2], &mut buffer).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)));
            assert!(err.to_string().contains(&format!("slot {bad} ")), "{err}");
            assert_eq!(buffer, vec![0.0; 3 * 8], "slot {bad}");
        }
    }

    #[test]
    fn shapes_that_do_not_fit_are_refused() {
        let src = source(40);
        let mut buffer = vec![0.0f32; 24];
        let invalid = |r: Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
        // A width of 0, and a buffer that is not whole rows.
        assert!(invalid(scatter_rows(&src, 8, 0, &[0], &mut buffer)));
        assert!(invalid(scatter_rows(&src, 8, 7, &[0], &mut buffer)));
        // Rows closer than their width, and a last row past the source's end.
        assert!(invalid(scatter_rows(&src, 4, 8, &[0, 1], &mut buffer)));
        assert!(invalid(scatter_rows(&src, 20, 8, &[0, 1, 2], &mut buffer)));
        // A stride whose product with the rows overflows.
        assert!(invalid(scatter_rows(
            &src,
            usize::MAX / 2,
            8,
            &[0, 1, 2],
            &mut buffer
        )));
        assert!(scatter_rows(&src, 16, 8, &[0, 1, 2], &mut buffer).is_ok());
    }
}
