//! Unit tests of the K-quants' tiles and kernels (`k_layout.rs`, `k_kernel.rs`): the layout's
//! size against the file's (its weights against the super-blocks' are `tests.rs`'s), the
//! portable kernel against a float64 product within the bound that rounding the activations
//! allows, and every tier against the portable kernel bit for bit; each with the activations
//! split into two int8 parts and rounded to one.

use super::fixtures::{
    every_kernel_equals_the_portable_one, exact, misses, only_the_non_finite_rows_are_nan,
    Rounding, Tiled,
};
use super::*;
use crate::quant::tests::{blocks, dequantized, scale_at, K_FORMATS};
use crate::quant::{f16_to_f32, k_blocks};
use crate::quant::{QuantMatrix, SUPER_BLOCK};
use crate::test_values::values;

/// Random blocks of `format` whose super-block `nan` (if any) has a NaN scale `d`.
fn k_blocks_with(format: Format, n: usize, k: usize, seed: u64, nan: Option<usize>) -> Vec<u8> {
    let mut data = blocks(format, n, k, seed);
    if let Some(s) = nan {
        let at = s * format.block_bytes() + scale_at(format);
        data[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    }
    data
}

#[test]
fn the_tiles_hold_about_the_files_bytes() {
    // Per tile of 16 columns and super-block: Q4_K 2368 bytes against the file's 16 × 144,
    // Q5_K 2880 against 16 × 176, Q6_K 3360, the file's 16 × 210 exactly.
    for (format, tile_bytes) in [
        (Format::Q4_K, 2368),
        (Format::Q5_K, 2880),
        (Format::Q6_K, 3360),
    ] {
        let (n, k) = (64, 1024);
        let len = packed_len(format, n, k).unwrap();
        assert_eq!(len, n / TILE * k / SUPER_BLOCK * tile_bytes, "{format:?}");
        let file = n * k / SUPER_BLOCK * format.block_bytes();
        assert!(
            len as f64 <= 1.03 * file as f64,
            "{format:?}: {len} against {file}"
        );
        assert!(packed_len(format, n, 288).is_err());
        assert!(packed_len(format, n, 32).is_err());
    }
}

/// Per weight, the magnitudes of the terms its value is made of (`|d·sc·q| + |dmin·m|`, or
/// Q6_K's `|d·sc·(q - 32)|`): what the float steps of the kernel round, cancelling or not.
fn terms(weight: &QuantMatrix<'_>) -> Vec<f64> {
    let format = weight.format();
    let per_sub_block = SUPER_BLOCK / k_blocks::sub_blocks(format);
    let mut out = Vec::new();
    for row in 0..weight.out_features() {
        for block in weight.row(row).chunks_exact(format.block_bytes()) {
            let parts = k_blocks::parts(format, block);
            let (d, dmin) = (f16_to_f32(parts.d), f16_to_f32(parts.dmin));
            for (i, &q) in parts.values.iter().enumerate() {
                let j = i / per_sub_block;
                let sc = f64::from(d) * f64::from(parts.scales[j]);
                out.push(if format == Format::Q6_K {
                    (sc * (f64::from(q) - 32.0)).abs()
                } else {
                    (sc * f64::from(q)).abs() + (f64::from(dmin) * f64::from(parts.mins[j])).abs()
                });
            }
        }
    }
    out
}

/// Both roundings, each with the share of its block's step `s = max|x| / 127` by which it may
/// miss an activation: the split one's two parts by `s/256`, one int8 by half a step (a little
/// more for the float32 product that scales it).
const ROUNDINGS: [(Rounding, f64); 2] = [(Rounding::Split, 1.0 / 256.0), (Rounding::OneInt8, 0.51)];

/// As `tests::bound`: per block, the rounded activations miss them by at most `share · s`, so
/// the sum moves by at most `share · s · Σ|w|`; the float steps add a relative 1e-5 of the
/// terms they round (`terms`), which for Q4_K and Q5_K may cancel.
fn bound(x: &[f32], w: &[f32], terms: &[f64], share: f64) -> f64 {
    let mut total = 0f64;
    for ((xs, ws), ts) in x
        .chunks_exact(BLOCK)
        .zip(w.chunks_exact(BLOCK))
        .zip(terms.chunks_exact(BLOCK))
    {
        let step = xs.iter().fold(0f64, |a, &v| a.max(f64::from(v.abs()))) / 127.0;
        let weights: f64 = ws.iter().map(|&v| f64::from(v.abs())).sum();
        let rounded: f64 = xs
            .iter()
            .zip(ts)
            .map(|(&a, &t)| f64::from(a.abs()) * t)
            .sum();
        total += share * step * weights + 1e-5 * rounded;
    }
    total + 1e-6
}

#[test]
fn the_integer_product_is_within_the_rounding_of_the_activations() {
    for (rounding, share) in ROUNDINGS {
        for format in K_FORMATS {
            for (m, n, k) in [(1, 37, 256), (2, 1, 512), (5, 40, 768), (9, 19, 256)] {
                let tiled = Tiled::random(format, n, k, 7);
                let (tiles, weight) = (tiled.tiles(), tiled.weight());
                let (w, t) = (dequantized(&weight), terms(&weight));
                let x = values(m * k, 1);
                let bias = values(n, 3);
                let out = rounding.product(PackedKernel::Portable, &tiles, &x, m, Some(&bias));
                for miss in misses(&out, &x, &w, &bias) {
                    let allowed = bound(miss.x, miss.w, &t[miss.col * k..][..k], share);
                    assert!(
                        miss.error <= allowed,
                        "{rounding:?} {format:?} ({m}, {n}, {k}) {miss}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_kernel_equals_the_portable_one_bit_for_bit_and_rows_do_not_depend_on_the_batch() {
    // Rows 1..=20 meet every register tile and uneven row splits, 127 the one-int8 product's
    // panels of 60 rows (the last of 7); 61 columns end inside a tile; column 40's second
    // super-block has a NaN scale; 4100 × 2 passes the parallel threshold.
    let rows: Vec<usize> = (1..=20).chain([127]).collect();
    for (rounding, _) in ROUNDINGS {
        for format in K_FORMATS {
            for (n, k, rows, nan) in [
                (61, 512, &rows[..], Some(40 * 2 + 1)),
                (33, 256, &[1, 7][..], None),
                (4100, 256, &[2][..], None),
            ] {
                let tiled = Tiled::of(format, k_blocks_with(format, n, k, 23, nan), n, k);
                let bias = values(n, 2);
                for &m in rows {
                    let x = values(m * k, 29);
                    let want = every_kernel_equals_the_portable_one(
                        rounding,
                        &tiled.tiles(),
                        &x,
                        m,
                        &bias,
                    );
                    if nan.is_some() {
                        assert!(want[40].is_nan() && want[39].is_finite(), "{format:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_non_finite_activation_makes_only_its_rows_outputs_nan() {
    for (rounding, _) in ROUNDINGS {
        for format in K_FORMATS {
            only_the_non_finite_rows_are_nan(
                rounding,
                &Tiled::random(format, 20, 512, 9).tiles(),
                300,
            );
        }
    }
}

#[test]
fn the_largest_values_and_activations_stay_exact() {
    // Every value at its largest (Q4_K 15, Q5_K 31, Q6_K 63), the largest scales and mins, and
    // activations at ±1 (every high part ±127, the sums of the module's bound): the integer
    // sums must not overflow, so every tier equals the portable kernel and the float64 product.
    let (n, k, m) = (16, 512, 2);
    for format in K_FORMATS {
        let mut data = blocks(format, n, k, 5);
        for block in data.chunks_exact_mut(format.block_bytes()) {
            block.fill(0xff);
            let at = scale_at(format);
            block[at..at + 2].copy_from_slice(&0x2400u16.to_le_bytes()); // d = 2⁻⁶
            if format == Format::Q6_K {
                block[192..208].fill(127);
            } else {
                block[2..4].copy_from_slice(&0x2000u16.to_le_bytes()); // dmin = 2⁻⁷
            }
        }
        let tiled = Tiled::of(format, data, n, k);
        let (tiles, w) = (tiled.tiles(), dequantized(&tiled.weight()));
        let x: Vec<f32> = (0..m * k).map(|i| if i < k { 1.0 } else { -1.0 }).collect();
        for (rounding, _) in ROUNDINGS {
            let want = rounding.product(PackedKernel::Portable, &tiles, &x, m, None);
            for row in 0..m {
                let exact = exact(&x[row * k..][..k], &w[..k], 0.0);
                let got = f64::from(want[row * n]);
                assert!(
                    (got - exact).abs() <= 1e-5 * exact.abs(),
                    "{rounding:?} {format:?}: {got} vs {exact}"
                );
            }
            for kernel in PackedKernel::detected() {
                assert_eq!(
                    rounding.product(kernel, &tiles, &x, m, None),
                    want,
                    "{kernel:?} {rounding:?} {format:?}"
                );
            }
        }
    }
}
