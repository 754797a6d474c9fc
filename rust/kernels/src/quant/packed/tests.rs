//! Unit tests of `packed.rs`: the layout against the blocks it came from, the integer kernels
//! against each other (bit for bit) and against a float64 product within the bound that
//! rounding the activations to int8 allows.

use super::*;
use crate::element::Bf16;
use crate::quant::tests::{blocks, dequantized, FORMATS};
use crate::quant::{dequantize_rows, QuantMatrix};
use crate::test_values::values;

pub(super) fn packed(weight: &QuantMatrix<'_>) -> Vec<u8> {
    let (n, k) = (weight.out_features(), weight.in_features());
    let mut out = vec![0xa5; packed_len(weight.format(), n, k).unwrap()];
    pack(weight, &mut out).unwrap();
    out
}

pub(super) fn product<T: Element>(
    kernel: PackedKernel,
    weight: &PackedMatrix<'_>,
    x: &[T],
    m: usize,
    bias: Option<&[f32]>,
) -> Vec<T> {
    let mut out = vec![T::store(f32::NAN); m * weight.out_features];
    linear_packed(kernel, weight, x, m, bias, &mut out).unwrap();
    out
}

#[test]
fn the_packed_weight_dequantizes_to_the_blocks_weights_bit_for_bit() {
    for format in FORMATS {
        for (n, k) in [(1, 32), (16, 64), (37, 96), (70, 160)] {
            let mut data = blocks(format, n, k, 41);
            // Scales at the edges of half precision: subnormal, largest, infinite, NaN.
            for (row, half) in [0x0001u16, 0x7bff, 0x7c00, 0x7e00]
                .iter()
                .enumerate()
                .take(n)
            {
                data[row * k / BLOCK * format.block_bytes()..][..2]
                    .copy_from_slice(&half.to_le_bytes());
            }
            let weight = QuantMatrix::new(format, &data, n, k).unwrap();
            let bytes = packed(&weight);
            let tiles = PackedMatrix::new(format, &bytes, n, k).unwrap();
            let mut all = vec![f32::NAN; n * k];
            dequantize_packed(&tiles, None, &mut all).unwrap();
            let want = dequantized(&weight);
            assert!(
                all.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
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
    }
}

/// The transposed dequantization (and, where it runs, its AVX-512 tile decoder) equals the
/// rows `rows` (`[n, k]`) transposed, bit for bit.
pub(super) fn transposed_equals<T: Element + PartialEq + std::fmt::Debug>(
    tiles: &PackedMatrix<'_>,
    rows: &[T],
) {
    let (n, k) = (tiles.out_features, tiles.in_features);
    let bits = |v: &[T]| v.iter().map(|x| x.load().to_bits()).collect::<Vec<_>>();
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

#[test]
fn sizes_and_ids_are_checked() {
    assert!(packed_len(Format::Q4_1, 0, 32).is_err());
    assert!(packed_len(Format::Q4_1, 3, 48).is_err());
    assert!(packed_len(Format::Q8_0, usize::MAX, 32).is_err());
    assert_eq!(packed_len(Format::Q4_0, 17, 64).unwrap(), 2 * 2 * 320);
    assert_eq!(packed_len(Format::Q8_0, 16, 32).unwrap(), 576);

    let data = blocks(Format::Q4_1, 5, 64, 3);
    let weight = QuantMatrix::new(Format::Q4_1, &data, 5, 64).unwrap();
    assert!(pack(&weight, &mut vec![0; 639]).is_err());
    let bytes = packed(&weight);
    assert!(PackedMatrix::new(Format::Q4_1, &bytes[1..], 5, 64).is_err());
    assert!(PackedMatrix::new(Format::Q4_0, &bytes, 5, 64).is_ok());
    let tiles = PackedMatrix::new(Format::Q4_1, &bytes, 5, 64).unwrap();
    assert!(dequantize_packed(&tiles, Some(&[5]), &mut vec![0f32; 64]).is_err());
    assert!(dequantize_packed(&tiles, None, &mut vec![0f32; 64]).is_err());
    assert!(dequantize_packed_transposed(&tiles, &mut vec![0f32; 64 * 4]).is_err());
    let x = vec![0f32; 2 * 64];
    let mut out = vec![0f32; 2 * 5];
    for kernel in PackedKernel::detected() {
        assert!(linear_packed(kernel, &tiles, &x, 2, None, &mut out).is_ok());
        assert!(linear_packed(kernel, &tiles, &x[1..], 2, None, &mut out).is_err());
        assert!(linear_packed(kernel, &tiles, &x, 2, Some(&[0.0; 4]), &mut out).is_err());
        assert!(linear_packed(kernel, &tiles, &x, 3, None, &mut out).is_err());
    }
}

/// Bounds the error of the integer product of `x` and `w` (`[n, k]`, row-major) against the
/// float64 product: per block, the two parts of an activation miss it by at most `s/256` (the
/// low part's step, `s = max|x| / 127`, when clamped; half of it otherwise), so the sum moves by
/// at most `s/256 · Σ|w|`; float32 sums add a relative 1e-5 of `Σ|x·w|`.
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
        total += step / 256.0 * weights + 1e-5 * products;
    }
    total + 1e-6
}

#[test]
fn the_integer_product_is_within_the_rounding_of_the_activations() {
    let shapes = [
        (1, 37, 64),
        (2, 1, 32),
        (5, 300, 96),
        (9, 19, 128),
        (33, 40, 160),
    ];
    for format in FORMATS {
        for (m, n, k) in shapes {
            let data = blocks(format, n, k, 7);
            let weight = QuantMatrix::new(format, &data, n, k).unwrap();
            let bytes = packed(&weight);
            let tiles = PackedMatrix::new(format, &bytes, n, k).unwrap();
            let w = dequantized(&weight);
            let x = values(m * k, 1);
            let bias = values(n, 3);
            let out = product(PackedKernel::Portable, &tiles, &x, m, Some(&bias));
            for row in 0..m {
                for col in 0..n {
                    let (xs, ws) = (&x[row * k..][..k], &w[col * k..][..k]);
                    let exact: f64 = xs
                        .iter()
                        .zip(ws)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum::<f64>()
                        + f64::from(bias[col]);
                    let got = f64::from(out[row * n + col]);
                    assert!(
                        (got - exact).abs() <= bound(xs, ws, k),
                        "{format:?} ({m}, {n}, {k}) [{row}, {col}]: {got} vs {exact}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_kernel_equals_the_portable_one_bit_for_bit_and_rows_do_not_depend_on_the_batch() {
    // 1..=9 and 17 rows meet every tile shape and uneven row splits; 61 columns end inside a
    // tile and leave tiles short of a group of four; 4100 × 2 passes the parallel threshold.
    for format in FORMATS {
        for (n, k, rows) in [
            (61, 288, &[1, 2, 3, 4, 5, 8, 9, 17][..]),
            (4100, 512, &[2][..]),
        ] {
            let data = blocks(format, n, k, 23);
            let weight = QuantMatrix::new(format, &data, n, k).unwrap();
            let bytes = packed(&weight);
            let tiles = PackedMatrix::new(format, &bytes, n, k).unwrap();
            let bias = values(n, 2);
            for &m in rows {
                let x = values(m * k, 29);
                let halves: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
                let want = product(PackedKernel::Portable, &tiles, &x, m, Some(&bias));
                let want_bf16 = product(PackedKernel::Portable, &tiles, &halves, m, None);
                for kernel in PackedKernel::detected() {
                    let got = product(kernel, &tiles, &x, m, Some(&bias));
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{kernel:?} {format:?} [{n}, {k}] rows {m}"
                    );
                    let got = product(kernel, &tiles, &halves, m, None);
                    assert_eq!(got, want_bf16, "{kernel:?} {format:?} bf16 rows {m}");
                    let alone = product(kernel, &tiles, &x[(m - 1) * k..], 1, Some(&bias));
                    assert_eq!(&got_last(&want, m, n), &alone[..], "{kernel:?} {format:?}");
                }
            }
        }
    }
}

fn got_last(out: &[f32], m: usize, n: usize) -> Vec<f32> {
    out[(m - 1) * n..m * n].to_vec()
}

#[test]
fn a_non_finite_activation_makes_only_its_rows_outputs_nan() {
    let (n, k) = (20, 64);
    let data = blocks(Format::Q4_0, n, k, 9);
    let weight = QuantMatrix::new(Format::Q4_0, &data, n, k).unwrap();
    let bytes = packed(&weight);
    let tiles = PackedMatrix::new(Format::Q4_0, &bytes, n, k).unwrap();
    let mut x = values(3 * k, 4);
    x[k + 40] = f32::INFINITY;
    x[2 * k + 3] = f32::NAN;
    for kernel in PackedKernel::detected() {
        let out = product(kernel, &tiles, &x, 3, None);
        assert!(out[..n].iter().all(|v| v.is_finite()), "{kernel:?}");
        assert!(out[n..].iter().all(|v| v.is_nan()), "{kernel:?}");
    }
}
