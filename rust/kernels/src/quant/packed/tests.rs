//! Unit tests of `packed.rs`: the layout against the blocks it came from (every format's, the
//! K-quants' super-blocks too), the integer kernels against each other (bit for bit) and
//! against a float64 product within the bound that rounding the activations to int8 allows.

use super::fixtures::{
    bound, dequantizes_to_the_blocks, every_kernel_on_blocks_of_32, misses,
    only_the_non_finite_rows_are_nan, Rounding, Tiled,
};
use super::*;
use crate::quant::tests::{dequantized, FORMATS, K_FORMATS};
use crate::test_values::values;

#[test]
fn the_packed_weight_dequantizes_to_the_blocks_weights_bit_for_bit() {
    // Blocks of 32, then the K-quants' super-blocks of 256.
    let shapes = [
        [(1, 32), (16, 64), (37, 96), (70, 160)],
        [(1, 256), (16, 512), (37, 768), (70, 256)],
    ];
    for (formats, shapes) in [&FORMATS[..], &K_FORMATS[..]].into_iter().zip(shapes) {
        for (format, (n, k)) in formats.iter().flat_map(|&f| shapes.map(|s| (f, s))) {
            dequantizes_to_the_blocks(&Tiled::with_edge_scales(format, n, k, 41));
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

    let tiled = Tiled::random(Format::Q4_1, 5, 64, 3);
    assert!(pack(&tiled.weight(), &mut vec![0; 639]).is_err());
    let bytes = &tiled.bytes;
    assert!(PackedMatrix::new(Format::Q4_1, &bytes[1..], 5, 64).is_err());
    assert!(PackedMatrix::new(Format::Q4_0, bytes, 5, 64).is_ok());
    let tiles = tiled.tiles();
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

/// Rounding the activations into two int8 parts moves each by at most `s/256` (the low part's
/// step, `s = max|x| / 127`, when clamped; half of it otherwise).
const SPLIT_SHARE: f64 = 1.0 / 256.0;

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
            let tiled = Tiled::random(format, n, k, 7);
            let (tiles, w) = (tiled.tiles(), dequantized(&tiled.weight()));
            let x = values(m * k, 1);
            let bias = values(n, 3);
            let out = Rounding::Split.product(PackedKernel::Portable, &tiles, &x, m, Some(&bias));
            for miss in misses(&out, &x, &w, &bias) {
                let allowed = bound(miss.x, miss.w, k, SPLIT_SHARE);
                assert!(miss.error <= allowed, "{format:?} ({m}, {n}, {k}) {miss}");
            }
        }
    }
}

#[test]
fn every_kernel_equals_the_portable_one_bit_for_bit_and_rows_do_not_depend_on_the_batch() {
    // 1..=9 and 17 rows meet every tile shape and uneven row splits; 61 columns end inside a
    // tile and leave tiles short of a group of four; 4100 × 2 passes the parallel threshold.
    every_kernel_on_blocks_of_32(
        Rounding::Split,
        &[(61, 288, &[1, 2, 3, 4, 5, 8, 9, 17]), (4100, 512, &[2])],
        [23, 2, 29],
    );
}

#[test]
fn a_non_finite_activation_makes_only_its_rows_outputs_nan() {
    only_the_non_finite_rows_are_nan(
        Rounding::Split,
        &Tiled::random(Format::Q4_0, 20, 64, 9).tiles(),
        40,
    );
}
