//! Unit tests of `rounding.rs`: both roundings of every tier equal the portable tier's bit for
//! bit (ties to even, all-zero, subnormal, overflowing and non-finite blocks, float32 and
//! bf16, one thread and several), with the parts the module's arithmetic gives.

use super::super::PackedKernel;
use super::{RoundedRows, BLOCK};
use crate::element::Bf16;
use crate::test_values::values;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn every_kernel_rounds_activations_alike_with_ties_to_even() {
    let mut x = values(40 * BLOCK, 78);
    // Largest 127: then `t = x`, so these halves tie; an all-zero block, subnormals, and
    // non-finite blocks.
    let ties = [127.0, 0.5, 1.5, 2.5, -0.5, -2.5, -127.0, 3.25];
    x[..ties.len()].copy_from_slice(&ties);
    x[BLOCK..2 * BLOCK].fill(0.0);
    x[2 * BLOCK..3 * BLOCK].fill(f32::from_bits(1));
    // Largest below 127 / f32::MAX: the scale overflows, and zeros stay zeros.
    x[5 * BLOCK..6 * BLOCK].fill(0.0);
    x[5 * BLOCK + 3] = 1e-38;
    x[5 * BLOCK + 9] = -3e-39;
    x[3 * BLOCK + 7] = f32::NAN;
    x[4 * BLOCK] = f32::NEG_INFINITY;
    let halves: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
    let portable = RoundedRows::one_int8(&x, PackedKernel::Portable);
    assert_eq!(portable.whole[..ties.len()], [127, 0, 2, 2, 0, -2, -127, 3]);
    assert_eq!(portable.units[0], 1.0);
    assert_eq!(portable.totals[1], 0);
    assert!(portable.units[3].is_nan() && portable.sums[4].is_nan());
    assert!(portable.whole[3 * BLOCK..5 * BLOCK].iter().all(|&v| v == 0));
    let tiny = &portable.whole[5 * BLOCK..6 * BLOCK];
    assert_eq!((tiny[3], tiny[9], tiny[0]), (127, -127, 0));
    for kernel in PackedKernel::detected() {
        for (rows, want) in [
            (RoundedRows::one_int8(&x, kernel), &portable),
            (
                RoundedRows::one_int8(&halves, kernel),
                &RoundedRows::one_int8(&halves, PackedKernel::Portable),
            ),
        ] {
            assert_eq!(rows.whole, want.whole, "{kernel:?}");
            assert_eq!(rows.totals, want.totals, "{kernel:?}");
            assert_eq!(bits(&rows.units), bits(&want.units), "{kernel:?}");
            assert_eq!(bits(&rows.sums), bits(&want.sums), "{kernel:?}");
        }
    }
}

#[test]
fn every_kernel_rounds_many_rows_alike_on_several_threads() {
    // 3001 blocks (past the threshold for threads, split into ranges that do not start or end
    // on the AVX-512 rounding's groups of four), magnitudes spread over 2^±40, with a few
    // all-zero and non-finite blocks among them.
    let mut x: Vec<f32> = values(3001 * BLOCK, 11)
        .iter()
        .enumerate()
        .map(|(i, v)| v * 2f32.powi((i / BLOCK % 81) as i32 - 40))
        .collect();
    x[17 * BLOCK..18 * BLOCK].fill(0.0);
    x[1502 * BLOCK + 5] = f32::NAN;
    x[2999 * BLOCK] = f32::INFINITY;
    let halves: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
    for kernel in PackedKernel::detected() {
        for (rows, want) in [
            (
                RoundedRows::one_int8(&x, kernel),
                RoundedRows::one_int8(&x, PackedKernel::Portable),
            ),
            (
                RoundedRows::one_int8(&halves, kernel),
                RoundedRows::one_int8(&halves, PackedKernel::Portable),
            ),
        ] {
            assert_eq!(rows.whole, want.whole, "{kernel:?}");
            assert_eq!(rows.totals, want.totals, "{kernel:?}");
            assert_eq!(bits(&rows.units), bits(&want.units), "{kernel:?}");
            assert_eq!(bits(&rows.sums), bits(&want.sums), "{kernel:?}");
        }
    }
}

#[test]
fn every_kernel_splits_activations_alike() {
    let mut x = values(40 * BLOCK, 77);
    // Ties at both steps (largest 127: t = x, so halves tie; then remainders of 1/512), an
    // all-zero block, subnormals, and non-finite blocks.
    let ties = [
        127.0,
        0.5,
        1.5,
        2.5,
        -0.5,
        -2.5,
        3.0 + 1.0 / 512.0,
        -(1.0 / 512.0),
    ];
    x[..ties.len()].copy_from_slice(&ties);
    x[BLOCK..2 * BLOCK].fill(0.0);
    x[2 * BLOCK..3 * BLOCK].fill(f32::from_bits(1));
    x[3 * BLOCK + 7] = f32::NAN;
    x[4 * BLOCK] = f32::NEG_INFINITY;
    // Largest below 127 / f32::MAX: the scale overflows, and zeros stay zeros.
    x[5 * BLOCK..6 * BLOCK].fill(0.0);
    x[5 * BLOCK + 3] = 1e-38;
    x[5 * BLOCK + 9] = -3e-39;
    let halves: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
    let portable = RoundedRows::split(&x, PackedKernel::Portable);
    assert_eq!(portable.whole[5 * BLOCK..5 * BLOCK + 4], [0, 0, 0, 127]);
    assert_eq!(portable.whole[..ties.len()], [127, 0, 2, 2, 0, -2, 3, 0]);
    assert_eq!(
        portable.rest[..ties.len()],
        [0, 127, -127, 127, -127, -127, 0, -0]
    );
    for kernel in PackedKernel::detected() {
        for (rows, want) in [
            (RoundedRows::split(&x, kernel), &portable),
            (
                RoundedRows::split(&halves, kernel),
                &RoundedRows::split(&halves, PackedKernel::Portable),
            ),
        ] {
            assert_eq!(rows.whole, want.whole, "{kernel:?}");
            assert_eq!(rows.rest, want.rest, "{kernel:?}");
            assert_eq!(rows.totals, want.totals, "{kernel:?}");
            assert_eq!(bits(&rows.units), bits(&want.units), "{kernel:?}");
            assert_eq!(bits(&rows.sums), bits(&want.sums), "{kernel:?}");
        }
    }
}
