//! Unit tests of `gemm.rs`: the kernel against a float64 reference, and batch invariance.

use super::*;
use crate::test_values::values;

fn packed(weight: &[f32], n: usize, k: usize) -> Vec<f32> {
    let mut packed = vec![f32::NAN; packed_len(n, k).unwrap()];
    pack_weight(weight, n, k, &mut packed).unwrap();
    packed
}

fn reference(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for row in 0..m {
        for col in 0..n {
            let dot: f64 = (0..k)
                .map(|i| f64::from(x[row * k + i]) * f64::from(weight[col * k + i]))
                .sum();
            out[row * n + col] = dot + bias.map_or(0.0, |b| f64::from(b[col]));
        }
    }
    out
}

fn run(x: &[f32], packed: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * n];
    linear(x, m, packed, n, k, bias, &mut out).unwrap();
    out
}

#[test]
fn packing_lays_out_panels_of_sixteen_columns_padded_with_zeros() {
    let (n, k) = (18, 3);
    let weight: Vec<f32> = (0..n * k).map(|i| i as f32).collect();
    let packed = packed(&weight, n, k);
    assert_eq!(packed.len(), 32 * k);
    // Panel 0, inner index 1, lane 5 is weight[5][1].
    assert_eq!(packed[PANEL + 5], weight[5 * k + 1]);
    // Panel 1, inner index 2, lane 1 is weight[17][2]; lane 2 is padding.
    assert_eq!(packed[(k + 2) * PANEL + 1], weight[17 * k + 2]);
    assert_eq!(packed[(k + 2) * PANEL + 2], 0.0);
}

#[test]
fn equals_a_float64_reference_for_every_tile_shape() {
    if !supported() {
        return;
    }
    // Rows 1..=13 meet every tile of 1..=6 rows and 1..=4 panels; 37 and 300 columns end in a
    // partial panel; 700 rows span several row blocks at k = 100.
    for (m, n, k) in [
        (1, 37, 5),
        (2, 70, 19),
        (3, 300, 8),
        (7, 33, 64),
        (13, 16, 1),
        (700, 40, 100),
    ] {
        for with_bias in [false, true] {
            let x = values(m * k, 1);
            let weight = values(n * k, 2);
            let bias = with_bias.then(|| values(n, 3));
            let out = run(&x, &packed(&weight, n, k), bias.as_deref(), m, n, k);
            let expected = reference(&x, &weight, bias.as_deref(), m, n, k);
            for (index, (&got, &want)) in out.iter().zip(&expected).enumerate() {
                let tolerance = 1e-5 * (k as f64).sqrt() * (1.0 + want.abs());
                assert!(
                    (f64::from(got) - want).abs() <= tolerance,
                    "({m}, {n}, {k}) element {index}: {got} vs {want}"
                );
            }
        }
    }
    for m in 4..=13 {
        let (n, k) = (48, 24);
        let x = values(m * k, m as u64);
        let weight = values(n * k, 7);
        let out = run(&x, &packed(&weight, n, k), None, m, n, k);
        let expected = reference(&x, &weight, None, m, n, k);
        for (&got, &want) in out.iter().zip(&expected) {
            assert!(
                (f64::from(got) - want).abs() <= 1e-4,
                "m = {m}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn a_row_comes_out_the_same_bits_alone_and_in_any_batch() {
    if !supported() {
        return;
    }
    // Large enough to run on several threads, with a partial last panel.
    let (n, k) = (2050, 576);
    let weight = values(n * k, 11);
    let bias = values(n, 12);
    let packed = packed(&weight, n, k);
    let batch = 33;
    let x = values(batch * k, 13);
    let together = run(&x, &packed, Some(&bias), batch, n, k);
    for row in [0, 5, 32] {
        let alone = run(&x[row * k..(row + 1) * k], &packed, Some(&bias), 1, n, k);
        assert_eq!(alone, together[row * n..(row + 1) * n], "row {row}");
    }
    let pair = run(&x[5 * k..7 * k], &packed, Some(&bias), 2, n, k);
    assert_eq!(pair, together[5 * n..7 * n]);
}

#[test]
fn wrong_lengths_and_empty_shapes_are_refused() {
    let weight = values(16 * 4, 1);
    let packed = packed(&weight, 16, 4);
    let mut out = vec![0.0; 32];
    let short = linear(&values(7, 2), 2, &packed, 16, 4, None, &mut out);
    assert!(matches!(short, Err(Error::InvalidArgument(message)) if message.contains("input")));
    let bias = linear(&values(8, 2), 2, &packed, 16, 4, Some(&[0.0; 3]), &mut out);
    assert!(matches!(bias, Err(Error::InvalidArgument(message)) if message.contains("bias")));
    let mut small = vec![0.0; 2];
    assert!(pack_weight(&weight, 16, 4, &mut small).is_err());
    assert!(pack_weight(&[], 0, 4, &mut []).is_err());
    let mut none: Vec<f32> = Vec::new();
    if supported() {
        assert!(linear(&[], 0, &packed, 16, 4, None, &mut none).is_ok());
    }
}

/// A row count whose products with small sizes wrap around `usize` to small numbers:
/// `(2^(bits-1) + 1) · 2 = 2` and `· 16 = 16`, modulo `2^bits`.
const WRAPPING: usize = (1 << (usize::BITS - 1)) + 1;

#[test]
fn sizes_whose_products_overflow_are_refused() {
    let refused = |x: &[f32], m: usize, n: usize, k: usize| {
        let packed = packed(&values(16 * k, 1), 16, k);
        let mut out = [0.0; 48];
        let result = linear(x, m, &packed, n, k, None, &mut out[..x.len() * 8]);
        matches!(result, Err(Error::InvalidArgument(_)))
    };
    // Buffers sized as the wrapped products would pass a plain `m * k` check, and the kernel
    // would then read and write `m` rows of them.
    assert!(refused(&[1.0; 2], WRAPPING, 16, 2));
    assert!(refused(&[1.0; 3], usize::MAX / 2, 16, 3));
    assert!(refused(&[1.0; 2], 1, WRAPPING, 2));
    assert!(packed_len(usize::MAX / 2, 3).is_err());
    assert!(packed_len(usize::MAX, 1).is_err());
    let mut target = vec![0.0; 32];
    let packing = pack_weight(&[1.0; 2], WRAPPING, 2, &mut target);
    assert!(matches!(packing, Err(Error::InvalidArgument(_))));
}
