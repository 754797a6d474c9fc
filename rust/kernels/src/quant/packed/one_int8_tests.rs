//! Unit tests of `one_int8.rs`: every kernel against the portable one bit for bit, and the portable one against a
//! float64 product within the bound that rounding the activations allows.

use super::tests::packed;
use super::*;
use crate::element::Bf16;
use crate::quant::tests::{blocks, dequantized, FORMATS};
use crate::quant::QuantMatrix;
use crate::test_values::values;

fn product<T: Element>(
    kernel: PackedKernel,
    weight: &PackedMatrix<'_>,
    x: &[T],
    m: usize,
    bias: Option<&[f32]>,
) -> Vec<T> {
    let mut out = vec![T::store(f32::NAN); m * weight.out_features];
    linear_packed_one_int8(kernel, weight, x, m, bias, &mut out).unwrap();
    out
}

fn bits<T: Element>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.load().to_bits()).collect()
}

#[test]
fn every_kernel_equals_the_portable_one_bit_for_bit_and_rows_do_not_depend_on_the_batch() {
    // 1..=13 rows meet every register tile and its remainders; 70 and 131 rows span panels
    // and end them in partial register tiles;
    // 61 columns end inside a tile, 300 (19 tiles) span tile chunks and leave an odd tile;
    // 2 × 4100 × 512 passes the parallel threshold.
    for format in FORMATS {
        for (n, k, rows) in [
            (61, 288, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13][..]),
            (300, 96, &[4, 70, 131][..]),
            (4100, 512, &[2][..]),
        ] {
            let data = blocks(format, n, k, 31);
            let weight = QuantMatrix::new(format, &data, n, k).unwrap();
            let bytes = packed(&weight);
            let tiles = PackedMatrix::new(format, &bytes, n, k).unwrap();
            let bias = values(n, 5);
            for &m in rows {
                let x = values(m * k, 37);
                let halves: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
                let want = product(PackedKernel::Portable, &tiles, &x, m, Some(&bias));
                let want_bf16 = product(PackedKernel::Portable, &tiles, &halves, m, None);
                for kernel in PackedKernel::detected() {
                    let got = product(kernel, &tiles, &x, m, Some(&bias));
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{kernel:?} {format:?} [{n}, {k}] {m}"
                    );
                    let got = product(kernel, &tiles, &halves, m, None);
                    assert_eq!(
                        bits(&got),
                        bits(&want_bf16),
                        "{kernel:?} {format:?} bf16 {m}"
                    );
                    let alone = product(kernel, &tiles, &x[(m - 1) * k..], 1, Some(&bias));
                    assert_eq!(bits(&alone), bits(&want[(m - 1) * n..]), "{kernel:?} {m}");
                }
            }
        }
    }
}

/// Bounds the error of the product of `x` and `w` (`[n, k]`, row-major) against the float64
/// product: per block, an activation rounded to int8 misses by at most half its step
/// `max|x| / 127` (a little more for the float32 product that scales it), so the sum moves by
/// at most `0.51 · step · Σ|w|`; float32 sums add a relative 1e-5 of `Σ|x·w|`.
fn bound(x: &[f32], w: &[f32], k: usize) -> f64 {
    let mut total = 0f64;
    for (xs, ws) in x.chunks_exact(BLOCK).zip(w[..k].chunks_exact(BLOCK)) {
        let step = xs.iter().fold(0f64, |a, &v| a.max(f64::from(v.abs()))) / 127.0;
        let weights: f64 = ws.iter().map(|&v| f64::from(v.abs())).sum();
        let products: f64 = xs
            .iter()
            .zip(ws)
            .map(|(&a, &b)| f64::from(a * b).abs())
            .sum();
        total += 0.51 * step * weights + 1e-5 * products;
    }
    total + 1e-6
}

#[test]
fn the_product_is_within_the_rounding_of_the_activations() {
    for format in FORMATS {
        for (m, n, k) in [(1, 37, 64), (7, 40, 160), (20, 33, 96)] {
            let data = blocks(format, n, k, 8);
            let weight = QuantMatrix::new(format, &data, n, k).unwrap();
            let bytes = packed(&weight);
            let tiles = PackedMatrix::new(format, &bytes, n, k).unwrap();
            let w = dequantized(&weight);
            let x = values(m * k, 2);
            let bias = values(n, 4);
            let out = product(PackedKernel::Portable, &tiles, &x, m, Some(&bias));
            let mut loose = 0;
            for row in 0..m {
                for col in 0..n {
                    let (xs, ws) = (&x[row * k..][..k], &w[col * k..][..k]);
                    let exact: f64 = xs
                        .iter()
                        .zip(ws)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum::<f64>()
                        + f64::from(bias[col]);
                    let error = (f64::from(out[row * n + col]) - exact).abs();
                    assert!(
                        error <= bound(xs, ws, k),
                        "{format:?} ({m}, {n}, {k}) [{row}, {col}]: error {error}"
                    );
                    // Rounding, not truncation: most errors stay well inside the bound.
                    loose += usize::from(error > 0.25 * bound(xs, ws, k));
                }
            }
            assert!(
                loose * 10 < m * n,
                "{format:?}: {loose} of {} near the bound",
                m * n
            );
        }
    }
}

#[test]
fn a_non_finite_activation_makes_only_its_rows_outputs_nan() {
    let (n, k) = (20, 64);
    let data = blocks(Format::Q4_1, n, k, 9);
    let weight = QuantMatrix::new(Format::Q4_1, &data, n, k).unwrap();
    let bytes = packed(&weight);
    let tiles = PackedMatrix::new(Format::Q4_1, &bytes, n, k).unwrap();
    let mut x = values(3 * k, 4);
    x[k + 40] = f32::INFINITY;
    x[2 * k + 3] = f32::NAN;
    for kernel in PackedKernel::detected() {
        let out = product(kernel, &tiles, &x, 3, None);
        assert!(out[..n].iter().all(|v| v.is_finite()), "{kernel:?}");
        assert!(out[n..].iter().all(|v| v.is_nan()), "{kernel:?}");
    }
}

#[test]
fn sizes_are_checked() {
    let data = blocks(Format::Q4_1, 5, 64, 3);
    let weight = QuantMatrix::new(Format::Q4_1, &data, 5, 64).unwrap();
    let bytes = packed(&weight);
    let tiles = PackedMatrix::new(Format::Q4_1, &bytes, 5, 64).unwrap();
    let x = vec![0f32; 2 * 64];
    let mut out = vec![0f32; 2 * 5];
    for kernel in PackedKernel::detected() {
        assert!(linear_packed_one_int8(kernel, &tiles, &x, 2, None, &mut out).is_ok());
        assert!(linear_packed_one_int8(kernel, &tiles, &x[1..], 2, None, &mut out).is_err());
        let short_bias = Some(&[0.0; 4][..]);
        assert!(linear_packed_one_int8(kernel, &tiles, &x, 2, short_bias, &mut out).is_err());
        assert!(linear_packed_one_int8(kernel, &tiles, &x, 3, None, &mut out).is_err());
        assert!(linear_packed_one_int8(kernel, &tiles, &x, usize::MAX, None, &mut out).is_err());
        assert!(linear_packed_one_int8::<f32>(kernel, &tiles, &[], 0, None, &mut []).is_ok());
    }
}
