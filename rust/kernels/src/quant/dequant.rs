//! `dequantize` and the embedding lookups of `quant`: blocks expanded to float32 or bfloat16
//! rows, on several threads for whole matrices, with the AVX-512 decoder where the CPU has it
//! (bit-identical to the scalar one, which rounds as the `gguf` package does).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{block, check_floats, Format, QuantMatrix, PARALLEL_MIN_WORK};
use crate::element::Element;
use crate::error::elements;
use crate::isa::Avx512;
use crate::parallel;
use crate::{Error, Result};

/// Rows decoded per claim when dequantizing on several threads.
const DEQUANT_ROWS: usize = 64;

/// Fills `out` (`count` rows of `k` values) by `decode(row, values)` for each row, on several
/// threads when there is enough of it.
pub(super) fn decode_rows<T: Element>(
    k: usize,
    count: usize,
    out: &mut [T],
    decode: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let threads = if count.saturating_mul(k) >= PARALLEL_MIN_WORK / 4 {
        parallel::max_threads()
    } else {
        1
    };
    let chunks: Vec<std::sync::Mutex<&mut [T]>> = out
        .chunks_mut(DEQUANT_ROWS * k)
        .map(std::sync::Mutex::new)
        .collect();
    let next = AtomicUsize::new(0);
    parallel::run(threads, &|_, _| loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let Some(chunk) = chunks.get(index) else {
            break;
        };
        // Each chunk is claimed by one thread only (the counter), so the lock never waits and
        // is never poisoned: decoding does not panic on rows whose lengths were checked.
        let mut rows = chunk
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (offset, values) in rows.chunks_exact_mut(k).enumerate() {
            decode(index * DEQUANT_ROWS + offset, values);
        }
    });
}

/// Decodes rows `ids` of `weight` into `out` (`count` rows of `in_features` values), each
/// float converted to `T`.
fn decode_block_rows<T: Element>(
    weight: &QuantMatrix<'_>,
    ids: &(dyn Fn(usize) -> usize + Sync),
    count: usize,
    out: &mut [T],
) {
    // The AVX-512 decoder takes Q4_0, Q4_1 and Q8_0; the 5-bit formats and the K-quants
    // decode in plain Rust (lookups and load-time dequantization, not products).
    let simd = Avx512::active()
        .filter(|_| matches!(weight.format, Format::Q4_0 | Format::Q4_1 | Format::Q8_0));
    decode_rows(weight.in_features, count, out, &|i, values| {
        let row = weight.row(ids(i));
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = simd {
            // SAFETY: `row` holds the row's blocks, `values` its `in_features` elements.
            return unsafe { super::avx512::decode_row(cpu, weight.format, row.as_ptr(), values) };
        }
        block::decode_row(weight.format, row, values);
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
}

/// Every weight of `weight` as float32 or bf16 (rounded once, as PyTorch rounds),
/// `[out_features, in_features]` row-major in `out`; in float32, bit-identical to the `gguf`
/// package's `dequantize`.
pub fn dequantize<T: Element>(weight: &QuantMatrix<'_>, out: &mut [T]) -> Result<()> {
    let expected = elements("the output", &[weight.out_features, weight.in_features])?;
    check_floats("the output", out.len(), expected)?;
    decode_block_rows(weight, &|row| row, weight.out_features, out);
    Ok(())
}

fn check_ids(weight: &QuantMatrix<'_>, ids: &[u32]) -> Result<()> {
    match ids.iter().find(|&&id| id as usize >= weight.out_features) {
        Some(bad) => Err(Error::InvalidArgument(format!(
            "row {bad} is out of range for a weight of {} rows",
            weight.out_features
        ))),
        None => Ok(()),
    }
}

/// Rows `ids` of `weight` as float32 or bf16 (an embedding lookup): `[ids.len(), in_features]`
/// in `out`.
pub fn dequantize_rows<T: Element>(
    weight: &QuantMatrix<'_>,
    ids: &[u32],
    out: &mut [T],
) -> Result<()> {
    check_ids(weight, ids)?;
    check_floats(
        "the output",
        out.len(),
        elements("the output", &[ids.len(), weight.in_features])?,
    )?;
    decode_block_rows(weight, &|i| ids[i] as usize, ids.len(), out);
    Ok(())
}
