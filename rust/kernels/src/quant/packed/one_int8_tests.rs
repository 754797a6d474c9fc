//! Unit tests of `one_int8.rs`: every kernel against the portable one bit for bit, and the
//! portable one against a float64 product within the bound that rounding the activations allows.

use super::fixtures::{
    bound, every_kernel_equals_the_portable_one, every_kernel_on_blocks_of_32, misses,
    only_the_non_finite_rows_are_nan, Rounding, Tiled,
};
use super::*;
use crate::quant::tests::{dequantized, FORMATS};
use crate::test_values::values;

#[test]
fn every_kernel_equals_the_portable_one_bit_for_bit_and_rows_do_not_depend_on_the_batch() {
    // 1..=13 rows meet every register tile and its remainders; 70 and 131 rows span panels
    // (a whole one widens Q5_0's and Q5_1's tiles to bytes on AVX-512 VNNI) and end them in
    // partial register tiles;
    // 61 columns end inside a tile, 300 (19 tiles) span tile chunks and leave an odd tile;
    // 2 × 4100 × 512 passes the parallel threshold.
    every_kernel_on_blocks_of_32(
        Rounding::OneInt8,
        &[
            (61, 288, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]),
            (300, 96, &[4, 70, 131]),
            (4100, 512, &[2]),
        ],
        [31, 5, 37],
    );
}

#[test]
fn the_largest_values_and_activations_sum_exactly() {
    // Every value the format's largest (all bits set: Q4's 15, Q5's 31; Q8_0's -1) times
    // activations that all round to +127, then to -127: the sums that the AVX2 kernels keep in
    // 16-bit lanes reach their largest magnitudes, and overflowing them would change the
    // products.
    let (n, k, m) = (40, 96, 5);
    let x: Vec<f32> = (0..m * k)
        .map(|i| if i / k % 2 == 0 { 1.5 } else { -1.5 })
        .collect();
    for format in FORMATS {
        let block_bytes = format.block_bytes();
        let mut blocks = vec![0xff; n * k / BLOCK * block_bytes];
        let one = 0x3c00u16.to_le_bytes();
        for block in blocks.chunks_exact_mut(block_bytes) {
            block[..2].copy_from_slice(&one);
            if format.has_offset() {
                block[2..4].copy_from_slice(&one);
            }
        }
        let tiled = Tiled::of(format, blocks, n, k);
        for rounding in [Rounding::Split, Rounding::OneInt8] {
            every_kernel_equals_the_portable_one(rounding, &tiled.tiles(), &x, m, &values(n, 6));
        }
    }
}

/// Rounding an activation to one int8 moves it by at most half its step `max|x| / 127` (a
/// little more for the float32 product that scales it).
const ONE_INT8_SHARE: f64 = 0.51;

#[test]
fn the_product_is_within_the_rounding_of_the_activations() {
    for format in FORMATS {
        for (m, n, k) in [(1, 37, 64), (7, 40, 160), (20, 33, 96)] {
            let tiled = Tiled::random(format, n, k, 8);
            let (tiles, w) = (tiled.tiles(), dequantized(&tiled.weight()));
            let x = values(m * k, 2);
            let bias = values(n, 4);
            let out = Rounding::OneInt8.product(PackedKernel::Portable, &tiles, &x, m, Some(&bias));
            let mut loose = 0;
            for miss in misses(&out, &x, &w, &bias) {
                let allowed = bound(miss.x, miss.w, k, ONE_INT8_SHARE);
                assert!(miss.error <= allowed, "{format:?} ({m}, {n}, {k}) {miss}");
                // Rounding, not truncation: most errors stay well inside the bound.
                loose += usize::from(miss.error > 0.25 * allowed);
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
    only_the_non_finite_rows_are_nan(
        Rounding::OneInt8,
        &Tiled::random(Format::Q4_1, 20, 64, 9).tiles(),
        40,
    );
}

#[test]
fn sizes_are_checked() {
    let tiled = Tiled::random(Format::Q4_1, 5, 64, 3);
    let tiles = tiled.tiles();
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
