//! Float32 linear layers on the CPU: `out = x · Wᵀ (+ bias)` for a weight packed once.
//!
//! Why our own kernel: at the row counts of decoding (one to a few hundred rows) the BLAS that
//! PyTorch ships reaches a third to a half of an AVX2 core's multiply-add throughput, less on
//! AMD cores, and that product is most of a decode step. This one keeps a 6×16 block of the
//! output in registers while it walks the inner dimension, reading the weight in the order it
//! was packed, and reaches most of the peak at those sizes with the same float32 arithmetic.
//!
//! Layout: the weight `[n, k]` (row-major, PyTorch's `nn.Linear.weight`) is packed into panels
//! of `PANEL` output columns, `[ceil(n / PANEL)][k][PANEL]`, the last panel padded with zeros.
//!
//! What must stay true: each output element is the sum over the inner dimension taken in order
//! `0..k` in one float32 accumulator, plus the bias after; so a row's result does not depend on
//! the other rows of the batch, the batch size, or the threads (batch invariance).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{check_len, elements};
use crate::isa::Avx2;
use crate::parallel;
use crate::{Error, Result};

/// Output columns per packed panel: two 8-lane AVX registers.
pub const PANEL: usize = 16;

/// Products with fewer multiply-adds than this run on the calling thread alone: starting a
/// parallel region costs about as much as they do.
const PARALLEL_MIN_WORK: usize = 1 << 20;

/// Whether this CPU runs the kernel: x86-64 with AVX2 and FMA, unless the kernels' tier is
/// capped below AVX2 (`isa::set_ceiling`), when the caller keeps PyTorch's product.
pub fn supported() -> bool {
    Avx2::active().is_some()
}

/// The number of floats of a packed `[n, k]` weight (`InvalidArgument` past `usize`).
pub fn packed_len(n: usize, k: usize) -> Result<usize> {
    elements("the packed weight", &[n.div_ceil(PANEL), PANEL, k])
}

fn check_shape(n: usize, k: usize) -> Result<()> {
    if n == 0 || k == 0 {
        return Err(Error::InvalidArgument(format!(
            "a linear layer needs at least one input and one output feature, got [{n}, {k}]"
        )));
    }
    Ok(())
}

/// Packs a row-major `[n, k]` weight into `packed` (`packed_len(n, k)` floats).
pub fn pack_weight(weight: &[f32], n: usize, k: usize, packed: &mut [f32]) -> Result<()> {
    check_shape(n, k)?;
    check_len("the weight", weight.len(), elements("the weight", &[n, k])?)?;
    check_len("the packed weight", packed.len(), packed_len(n, k)?)?;
    for (panel, block) in packed.chunks_exact_mut(k * PANEL).enumerate() {
        for (inner, lanes) in block.chunks_exact_mut(PANEL).enumerate() {
            for (lane, value) in lanes.iter_mut().enumerate() {
                let column = panel * PANEL + lane;
                *value = if column < n {
                    weight[column * k + inner]
                } else {
                    0.0
                };
            }
        }
    }
    Ok(())
}

/// One product, shared read-only by the threads; each writes only the output columns of the
/// panels it claims. Only the x86-64 kernel reads it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Job {
    x: *const f32,
    packed: *const f32,
    bias: *const f32,
    out: *mut f32,
    m: usize,
    n: usize,
    k: usize,
}

// SAFETY: the pointers come from slices that outlive the parallel region (`linear` returns after
// it), the inputs are only read, and threads write disjoint column ranges of `out`, each panel
// being claimed by exactly one thread through an atomic counter.
unsafe impl Sync for Job {}

/// `out[m, n] = x[m, k] · Wᵀ + bias`, with `packed` from `pack_weight` and the work shared by
/// the process's OpenMP threads (see `parallel`).
pub fn linear(
    x: &[f32],
    m: usize,
    packed: &[f32],
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    // Every size is checked here, once per call: the kernel's offsets are products of them,
    // and they stay inside the buffers only because these products neither wrap nor differ.
    check_shape(n, k)?;
    check_len("the input", x.len(), elements("the input", &[m, k])?)?;
    check_len("the packed weight", packed.len(), packed_len(n, k)?)?;
    check_len("the output", out.len(), elements("the output", &[m, n])?)?;
    if let Some(bias) = bias {
        check_len("the bias", bias.len(), n)?;
    }
    let Some(cpu) = Avx2::active() else {
        return Err(Error::InvalidArgument(
            "the CPU linear kernel needs an x86-64 CPU with AVX2 and FMA".into(),
        ));
    };
    if m == 0 {
        return Ok(());
    }
    let job = Job {
        x: x.as_ptr(),
        packed: packed.as_ptr(),
        bias: bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
        out: out.as_mut_ptr(),
        m,
        n,
        k,
    };
    let panels = n.div_ceil(PANEL);
    let group = kernel::panels_per_tile(m);
    let threads = if m.saturating_mul(n).saturating_mul(k) >= PARALLEL_MIN_WORK {
        parallel::max_threads()
    } else {
        1
    };
    // Panels are claimed in chunks, so a thread slowed by a busy core takes fewer of them.
    let chunk = panels.div_ceil(threads * 8).next_multiple_of(group);
    let next = AtomicUsize::new(0);
    parallel::run(threads, &|_, _| loop {
        let start = next.fetch_add(chunk, Ordering::Relaxed);
        if start >= panels {
            break;
        }
        // SAFETY: the lengths were checked above, and this thread alone owns panels
        // `start..start + chunk`.
        unsafe { kernel::run(cpu, &job, start..(start + chunk).min(panels)) };
    });
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
mod kernel {
    pub(super) fn panels_per_tile(_m: usize) -> usize {
        1
    }

    pub(super) unsafe fn run(
        _: crate::isa::Avx2,
        _job: &super::Job,
        _panels: std::ops::Range<usize>,
    ) {
        unreachable!("detection makes no AVX2 token off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
mod kernel;

#[cfg(test)]
mod tests;
