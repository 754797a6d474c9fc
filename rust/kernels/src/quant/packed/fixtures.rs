//! What the packed kernels' tests share (`tests.rs`, `one_int8_tests.rs`, `k_tests.rs`): a
//! weight of random blocks with its tiles, products into fresh outputs, the float64 product, and
//! the checks that every format and both roundings of the activations pass.

use super::*;
use crate::element::Bf16;
use crate::quant::tests::{blocks, dequantized, scale_at};
use crate::quant::{dequantize_rows, QuantMatrix};
use crate::test_values::values;

/// How a product rounds the activations: split into two int8 parts (`linear_packed`) or to
/// one int8 (`linear_packed_one_int8`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Rounding {
    Split,
    OneInt8,
}

impl Rounding {
    /// The product of `x` (`[m, k]`) by `weight` with `kernel`, into an output that held NaNs
    /// before.
    pub(super) fn product<T: Element>(
        self,
        kernel: PackedKernel,
        weight: &PackedMatrix<'_>,
        x: &[T],
        m: usize,
        bias: Option<&[f32]>,
    ) -> Vec<T> {
        let mut out = vec![T::store(f32::NAN); m * weight.out_features];
        let linear = match self {
            Rounding::Split => linear_packed::<T>,
            Rounding::OneInt8 => linear_packed_one_int8::<T>,
        };
        linear(kernel, weight, x, m, bias, &mut out).unwrap();
        out
    }
}

/// A weight's blocks and the tiles packed from them.
pub(super) struct Tiled {
    pub(super) format: Format,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) blocks: Vec<u8>,
    pub(super) bytes: Vec<u8>,
}

impl Tiled {
    /// Random blocks of `format` (`quant::tests::blocks`), `[n, k]`, packed.
    pub(super) fn random(format: Format, n: usize, k: usize, seed: u64) -> Self {
        Tiled::of(format, blocks(format, n, k, seed), n, k)
    }

    /// Random blocks as `random`'s, the scale `d` of the first block of rows 0 to 3 at the edges
    /// of half precision: subnormal, largest, infinite, NaN.
    pub(super) fn with_edge_scales(format: Format, n: usize, k: usize, seed: u64) -> Self {
        let mut data = blocks(format, n, k, seed);
        let row_bytes = k / format.block_weights() * format.block_bytes();
        for (row, half) in [0x0001u16, 0x7bff, 0x7c00, 0x7e00]
            .iter()
            .enumerate()
            .take(n)
        {
            let at = row * row_bytes + scale_at(format);
            data[at..at + 2].copy_from_slice(&half.to_le_bytes());
        }
        Tiled::of(format, data, n, k)
    }

    /// The blocks `blocks` of `format`, `[n, k]`, packed.
    pub(super) fn of(format: Format, blocks: Vec<u8>, n: usize, k: usize) -> Self {
        let weight = QuantMatrix::new(format, &blocks, n, k).unwrap();
        let bytes = packed(&weight);
        Tiled {
            format,
            n,
            k,
            blocks,
            bytes,
        }
    }

    /// The weight as blocks.
    pub(super) fn weight(&self) -> QuantMatrix<'_> {
        QuantMatrix::new(self.format, &self.blocks, self.n, self.k).unwrap()
    }

    /// The weight as tiles.
    pub(super) fn tiles(&self) -> PackedMatrix<'_> {
        PackedMatrix::new(self.format, &self.bytes, self.n, self.k).unwrap()
    }
}

/// `weight` packed into a buffer that held other bytes before.
pub(super) fn packed(weight: &QuantMatrix<'_>) -> Vec<u8> {
    let (n, k) = (weight.out_features(), weight.in_features());
    let mut out = vec![0xa5; packed_len(weight.format(), n, k).unwrap()];
    pack(weight, &mut out).unwrap();
    out
}

/// The bits of each value, as float32.
pub(super) fn bits<T: Element>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.load().to_bits()).collect()
}

/// Bounds the error of a product of `x` and `w` (`[n, k]`, row-major) against the float64
/// product when rounding moves each activation by at most `share` of its block's step
/// `max|x| / 127`: per block `share · step · Σ|w|`, plus a relative 1e-5 of `Σ|x·w|` for the
/// float32 sums.
pub(super) fn bound(x: &[f32], w: &[f32], k: usize, share: f64) -> f64 {
    let mut total = 0f64;
    for (xs, ws) in x.chunks_exact(BLOCK).zip(w[..k].chunks_exact(BLOCK)) {
        let step = xs.iter().fold(0f64, |a, &v| a.max(f64::from(v.abs()))) / 127.0;
        let weights: f64 = ws.iter().map(|&v| f64::from(v.abs())).sum();
        let products: f64 = xs
            .iter()
            .zip(ws)
            .map(|(&a, &b)| f64::from(a * b).abs())
            .sum();
        total += share * step * weights + 1e-5 * products;
    }
    total + 1e-6
}

/// `Σ xs·ws + bias` in float64.
pub(super) fn exact(xs: &[f32], ws: &[f32], bias: f32) -> f64 {
    xs.iter()
        .zip(ws)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum::<f64>()
        + f64::from(bias)
}

/// One output of a product against the float64 product: its row and column, the input row and
/// the weight row it multiplies, and how far it lies from the float64 value.
pub(super) struct Miss<'a> {
    pub(super) row: usize,
    pub(super) col: usize,
    pub(super) x: &'a [f32],
    pub(super) w: &'a [f32],
    pub(super) error: f64,
}

impl std::fmt::Display for Miss<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}, {}]: error {}", self.row, self.col, self.error)
    }
}

/// Every output of `out` (`[m, n]`), the product of `x` (`[m, k]`) and `w` (`[n, k]`) plus
/// `bias`, against the float64 product.
pub(super) fn misses<'a>(
    out: &'a [f32],
    x: &'a [f32],
    w: &'a [f32],
    bias: &'a [f32],
) -> impl Iterator<Item = Miss<'a>> {
    let n = bias.len();
    let (m, k) = (out.len() / n, w.len() / n);
    (0..m).flat_map(move |row| {
        (0..n).map(move |col| {
            let (x, w) = (&x[row * k..][..k], &w[col * k..][..k]);
            let error = (f64::from(out[row * n + col]) - exact(x, w, bias[col])).abs();
            Miss {
                row,
                col,
                x,
                w,
                error,
            }
        })
    })
}

/// The tiles dequantize to the blocks' weights bit for bit: all of them as float32, transposed
/// (`transposed_equals`) as float32 and bf16, and some rows by id as bf16.
pub(super) fn dequantizes_to_the_blocks(tiled: &Tiled) {
    let (format, n, k) = (tiled.format, tiled.n, tiled.k);
    let (weight, tiles) = (tiled.weight(), tiled.tiles());
    let mut all = vec![f32::NAN; n * k];
    dequantize_packed(&tiles, None, &mut all).unwrap();
    assert_eq!(
        bits(&all),
        bits(&dequantized(&weight)),
        "{format:?} [{n}, {k}]"
    );
    transposed_equals(&tiles, &all);
    let mut halves = vec![Bf16::default(); n * k];
    dequantize_packed(&tiles, None, &mut halves).unwrap();
    transposed_equals(&tiles, &halves);
    let ids = [n as u32 - 1, 0, (n / 2) as u32, 0];
    let mut rows = vec![Bf16::default(); ids.len() * k];
    dequantize_packed(&tiles, Some(&ids), &mut rows).unwrap();
    let mut expected = vec![Bf16::default(); ids.len() * k];
    dequantize_rows(&weight, &ids, &mut expected).unwrap();
    assert_eq!(rows, expected, "{format:?} [{n}, {k}] rows");
}

/// The transposed dequantization (and, where it runs, its AVX-512 tile decoder) equals the
/// rows `rows` (`[n, k]`) transposed, bit for bit.
pub(super) fn transposed_equals<T: Element>(tiles: &PackedMatrix<'_>, rows: &[T]) {
    let (n, k) = (tiles.out_features, tiles.in_features);
    let want: Vec<T> = (0..k * n).map(|i| rows[(i % n) * k + i / n]).collect();
    let mut got = vec![T::store(f32::NAN); k * n];
    dequantize_packed_transposed(tiles, &mut got).unwrap();
    assert_eq!(bits(&got), bits(&want), "{:?} [{n}, {k}]", tiles.format);
    for t in 0..n.div_ceil(TILE) {
        let mut portable = vec![T::store(f32::NAN); k * n];
        // SAFETY: `portable` holds `[k, n]` elements; one thread.
        unsafe { layout::transpose_tile(tiles, t, portable.as_mut_ptr()) };
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = crate::isa::Avx512::detected().filter(|_| !tiles.format.is_k()) {
            let mut simd = vec![T::store(f32::NAN); k * n];
            // SAFETY: as above; the token proves the CPU has AVX-512 F and BW.
            unsafe { vnni::transpose_tile(cpu, tiles, t, simd.as_mut_ptr()) };
            assert_eq!(bits(&simd), bits(&portable), "{:?} tile {t}", tiles.format);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = crate::isa::Avx512Vnni::detected().filter(|_| tiles.format.is_k()) {
            let mut simd = vec![T::store(f32::NAN); k * n];
            // SAFETY: as above; the token proves the CPU has AVX-512 VNNI.
            unsafe { k_avx512::transpose_tile(cpu, tiles, t, simd.as_mut_ptr()) };
            assert_eq!(bits(&simd), bits(&portable), "{:?} tile {t}", tiles.format);
        }
        let columns = t * TILE..(t * TILE + TILE).min(n);
        for (row, values) in portable.chunks_exact(n).enumerate() {
            assert_eq!(
                bits(&values[columns.clone()]),
                bits(&want[row * n..][columns.clone()])
            );
        }
    }
}

/// Every kernel's product with `rounding` of `x` (`[m, k]`) equals the portable kernel's bit for bit, with
/// the bias in float32 and without it in bf16, and the last row alone equals the batch's last
/// row (a row's outputs do not depend on the others). Returns the portable float32 outputs.
pub(super) fn every_kernel_equals_the_portable_one(
    rounding: Rounding,
    tiles: &PackedMatrix<'_>,
    x: &[f32],
    m: usize,
    bias: &[f32],
) -> Vec<f32> {
    let (format, n, k) = (tiles.format, tiles.out_features, tiles.in_features);
    let halves: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
    let want = rounding.product::<f32>(PackedKernel::Portable, tiles, x, m, Some(bias));
    let want_bf16 = rounding.product::<Bf16>(PackedKernel::Portable, tiles, &halves, m, None);
    for kernel in PackedKernel::detected() {
        let got = rounding.product::<f32>(kernel, tiles, x, m, Some(bias));
        assert_eq!(
            bits(&got),
            bits(&want),
            "{kernel:?} {rounding:?} {format:?} [{n}, {k}] rows {m}"
        );
        let got = rounding.product::<Bf16>(kernel, tiles, &halves, m, None);
        assert_eq!(
            bits(&got),
            bits(&want_bf16),
            "{kernel:?} {format:?} bf16 rows {m}"
        );
        let alone = rounding.product::<f32>(kernel, tiles, &x[(m - 1) * k..], 1, Some(bias));
        assert_eq!(
            bits(&alone),
            bits(&want[(m - 1) * n..]),
            "{kernel:?} {format:?} {m}"
        );
    }
    want
}

/// `every_kernel_equals_the_portable_one` on random weights of every format of blocks of 32,
/// for each `(n, k, row counts)` of `cases`, the weights, the bias and the activations drawn
/// from `seeds`.
pub(super) fn every_kernel_on_blocks_of_32(
    rounding: Rounding,
    cases: &[(usize, usize, &[usize])],
    seeds: [u64; 3],
) {
    for format in crate::quant::tests::FORMATS {
        for &(n, k, rows) in cases {
            let tiled = Tiled::random(format, n, k, seeds[0]);
            let bias = values(n, seeds[1]);
            for &m in rows {
                let x = values(m * k, seeds[2]);
                every_kernel_equals_the_portable_one(rounding, &tiled.tiles(), &x, m, &bias);
            }
        }
    }
}

/// Of three rows of activations, the second holding an infinity at `infinite` and the third a
/// NaN, every kernel's product with `rounding` leaves the first row's outputs finite and makes the others'
/// NaN.
pub(super) fn only_the_non_finite_rows_are_nan(
    rounding: Rounding,
    tiles: &PackedMatrix<'_>,
    infinite: usize,
) {
    let (format, n, k) = (tiles.format, tiles.out_features, tiles.in_features);
    let mut x = values(3 * k, 4);
    x[k + infinite] = f32::INFINITY;
    x[2 * k + 3] = f32::NAN;
    for kernel in PackedKernel::detected() {
        let out = rounding.product::<f32>(kernel, tiles, &x, 3, None);
        assert!(
            out[..n].iter().all(|v| v.is_finite()),
            "{kernel:?} {rounding:?} {format:?}"
        );
        assert!(
            out[n..].iter().all(|v| v.is_nan()),
            "{kernel:?} {rounding:?} {format:?}"
        );
    }
}
