//! Unit tests of `quant.rs`: decoding against hand-made blocks, and the float kernel against a
//! float64 product with the decoded weight.

use super::*;
use crate::element::Bf16;
use crate::test_values::values;

pub(super) const FORMATS: [Format; 5] = [
    Format::Q4_0,
    Format::Q4_1,
    Format::Q5_0,
    Format::Q5_1,
    Format::Q8_0,
];
pub(super) const K_FORMATS: [Format; 3] = [Format::Q4_K, Format::Q5_K, Format::Q6_K];

/// Every format, each with the input width `k` given for blocks of 32 scaled to its blocks (a
/// K-quant's is 8 times as wide), so that each meets as many blocks.
fn every_format(k: usize) -> impl Iterator<Item = (Format, usize)> {
    FORMATS
        .into_iter()
        .chain(K_FORMATS)
        .map(move |format| (format, k * format.block_weights() / BLOCK))
}

/// Where a block's half scale `d` lies (Q6_K's last).
pub(crate) fn scale_at(format: Format) -> usize {
    if format == Format::Q6_K {
        208
    } else {
        0
    }
}

/// Half-precision bits of small exact values used as scales.
const HALF_ONE_EIGHTH: u16 = 0x3000; // 0.125
const HALF_MINUS_TWO: u16 = 0xc000; // -2.0

/// Deterministic random blocks: every byte random, with scales drawn from a few halves of
/// moderate size (random bits could make infinities).
pub(crate) fn blocks(format: Format, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let count = n * k / format.block_weights();
    let noise = values(count * format.block_bytes(), seed);
    let scales = values(count * 2, seed + 1);
    let mut out: Vec<u8> = noise.iter().map(|v| ((v + 1.0) * 127.99) as u8).collect();
    for (b, block) in out.chunks_exact_mut(format.block_bytes()).enumerate() {
        // A half in about ±[0.001, 0.06]: sign, exponent 5..=10, random mantissa.
        let half = |v: f32| {
            let bits = (v.abs() * 1023.0) as u16 | ((5 + (v.abs() * 5.99) as u16) << 10);
            if v < 0.0 {
                bits | 0x8000
            } else {
                bits
            }
        };
        let at = scale_at(format);
        block[at..at + 2].copy_from_slice(&half(scales[2 * b].abs()).to_le_bytes());
        // Q4_1's and Q5_1's offset `m`, Q4_K's and Q5_K's `dmin`.
        if format.has_offset() || matches!(format, Format::Q4_K | Format::Q5_K) {
            block[2..4].copy_from_slice(&half(scales[2 * b + 1]).to_le_bytes());
        }
    }
    out
}

pub(crate) fn dequantized(weight: &QuantMatrix<'_>) -> Vec<f32> {
    let mut out = vec![f32::NAN; weight.out_features() * weight.in_features()];
    dequantize(weight, &mut out).unwrap();
    out
}

fn reference(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for row in 0..m {
        for col in 0..n {
            let dot: f64 = (0..k)
                .map(|i| f64::from(x[row * k + i]) * f64::from(w[col * k + i]))
                .sum();
            out[row * n + col] = dot + bias.map_or(0.0, |b| f64::from(b[col]));
        }
    }
    out
}

#[test]
fn halves_and_bfloat16_convert_exactly() {
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(HALF_MINUS_TWO), -2.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x83ff), -1023.0 * 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x7bff), 65504.0);
    assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    assert!(f16_to_f32(0x7e00).is_nan());
    // bfloat16 (the rounding dequantized blocks are stored with): 1 + 2⁻⁸ is a tie between 1
    // and 1 + 2⁻⁷ and goes to the even 1; just above it rounds up; the largest float rounds to
    // infinity.
    let bits = |value: f32| Bf16::from_f32(value).0;
    assert_eq!(bits(1.0 + 2f32.powi(-8)), 0x3f80);
    assert_eq!(bits(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3f81);
    assert_eq!(bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    assert_eq!(bits(f32::MAX), 0x7f80);
    assert_eq!(bits(-0.0), 0x8000);
    assert_eq!(bits(f32::NAN) & 0x7fc0, 0x7fc0);
}

#[test]
fn blocks_decode_as_ggml_defines_them() {
    let mut q4_0 = vec![0u8; 18];
    q4_0[..2].copy_from_slice(&HALF_ONE_EIGHTH.to_le_bytes());
    q4_0[2] = 0xf0; // weight 0: nibble 0 → -1; weight 16: nibble 15 → 0.875
    q4_0[17] = 0x29; // weight 15: 9 → 0.125; weight 31: 2 → -0.75
    let w = block::decode(Format::Q4_0, &q4_0);
    assert_eq!(
        (w[0], w[16], w[15], w[31], w[1]),
        (-1.0, 0.875, 0.125, -0.75, -1.0)
    );

    let mut q4_1 = vec![0u8; 20];
    q4_1[..2].copy_from_slice(&HALF_ONE_EIGHTH.to_le_bytes());
    q4_1[2..4].copy_from_slice(&HALF_MINUS_TWO.to_le_bytes());
    q4_1[4] = 0x3c; // weight 0: 12 → -0.5; weight 16: 3 → -1.625
    let w = block::decode(Format::Q4_1, &q4_1);
    assert_eq!((w[0], w[16], w[1]), (-0.5, -1.625, -2.0));

    // Q5_0 and Q5_1: the nibbles after a 32-bit word whose bit `j` is weight `j`'s fifth.
    let mut q5_0 = vec![0u8; 22];
    q5_0[..2].copy_from_slice(&HALF_ONE_EIGHTH.to_le_bytes());
    q5_0[2..6].copy_from_slice(&(1u32 | 1 << 16 | 1 << 31).to_le_bytes());
    q5_0[6] = 0xf0; // weight 0: 16 → 0; weight 16: 31 → 1.875
    q5_0[21] = 0x29; // weight 15: 9 → -0.875; weight 31: 18 → 0.25
    let w = block::decode(Format::Q5_0, &q5_0);
    assert_eq!(
        (w[0], w[16], w[15], w[31], w[1]),
        (0.0, 1.875, -0.875, 0.25, -2.0)
    );

    let mut q5_1 = vec![0u8; 24];
    q5_1[..2].copy_from_slice(&HALF_ONE_EIGHTH.to_le_bytes());
    q5_1[2..4].copy_from_slice(&HALF_MINUS_TWO.to_le_bytes());
    q5_1[4..8].copy_from_slice(&(1u32 << 1).to_le_bytes());
    q5_1[9] = 0x03; // weight 1: 19 → 0.375; weight 17: 0 → -2
    let w = block::decode(Format::Q5_1, &q5_1);
    assert_eq!((w[1], w[17], w[0]), (0.375, -2.0, -2.0));

    let mut q8_0 = vec![0u8; 34];
    q8_0[..2].copy_from_slice(&HALF_MINUS_TWO.to_le_bytes());
    q8_0[2] = 0x80; // -128 → 256
    q8_0[33] = 0x7f; // 127 → -254
    let w = block::decode(Format::Q8_0, &q8_0);
    assert_eq!((w[0], w[31], w[5]), (256.0, -254.0, -0.0));
}

#[test]
fn matrices_and_buffers_are_checked() {
    let data = vec![0u8; 2 * 20 * 2];
    assert!(QuantMatrix::new(Format::Q4_1, &data, 2, 64).is_ok());
    for (n, k) in [(2, 63), (2, 0), (0, 64), (3, 64), (2, 32), (usize::MAX, 64)] {
        let err = QuantMatrix::new(Format::Q4_1, &data, n, k).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "[{n}, {k}]");
    }
    assert!(Format::parse("q5_2").is_err());
    assert_eq!(Format::parse("q5_0"), Ok(Format::Q5_0));
    assert_eq!(Format::parse("q8_0"), Ok(Format::Q8_0));
    assert_eq!(Format::parse("q6_k"), Ok(Format::Q6_K));
    let k_data = vec![0u8; 3 * 144];
    assert!(QuantMatrix::new(Format::Q4_K, &k_data, 3, 256).is_ok());
    for (n, k) in [(3, 128), (6, 128), (3, 512), (2, 256)] {
        let err = QuantMatrix::new(Format::Q4_K, &k_data, n, k).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "Q4_K [{n}, {k}]");
    }

    let weight = QuantMatrix::new(Format::Q4_1, &data, 2, 64).unwrap();
    let x = vec![0f32; 3 * 64];
    let mut out = vec![0f32; 3 * 2];
    assert!(linear(&weight, &x, 3, None, &mut out).is_ok());
    assert!(linear(&weight, &x, 2, None, &mut out).is_err());
    assert!(linear(&weight, &x[1..], 3, None, &mut out).is_err());
    assert!(linear(&weight, &x, 3, Some(&[0.0]), &mut out).is_err());
    assert!(linear(&weight, &x, usize::MAX, None, &mut out).is_err());
    assert!(dequantize(&weight, &mut out).is_err());
    assert!(dequantize_rows(&weight, &[0, 2], &mut vec![0f32; 128]).is_err());
    assert!(dequantize_rows(&weight, &[1], &mut vec![0f32; 128]).is_err());
    assert!(dequantize_rows(&weight, &[1, 0], &mut vec![Bf16::default(); 128]).is_ok());
}

#[test]
fn the_product_equals_a_float64_reference() {
    // Rows 1..=13 and 33 meet every tile shape and uneven row splits; 1, 7, 37 and 300
    // columns end inside a column group; 32 inputs is a single block.
    let shapes = [
        (1, 37, 64),
        (2, 1, 32),
        (3, 300, 96),
        (7, 19, 128),
        (13, 40, 32),
        (33, 9, 160),
    ];
    for (m, n, k) in shapes {
        for (format, k) in every_format(k) {
            let data = blocks(format, n, k, 7);
            let weight = QuantMatrix::new(format, &data, n, k).unwrap();
            let w = dequantized(&weight);
            let x = values(m * k, 1);
            let bias = values(n, 3);
            let expected = reference(&x, &w, Some(&bias), m, n, k);
            let mut out = vec![f32::NAN; m * n];
            linear(&weight, &x, m, Some(&bias), &mut out).unwrap();
            let scale = w.iter().fold(0f64, |a, &v| a.max(f64::from(v.abs())));
            for (index, (&got, &want)) in out.iter().zip(&expected).enumerate() {
                let tolerance = 1e-6 * (k as f64) * scale + 1e-6 * want.abs();
                assert!(
                    (f64::from(got) - want).abs() <= tolerance,
                    "{format:?} ({m}, {n}, {k}) element {index}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn a_rows_result_does_not_depend_on_the_batch() {
    for (format, k) in every_format(96) {
        let n = 45;
        let data = blocks(format, n, k, 11);
        let weight = QuantMatrix::new(format, &data, n, k).unwrap();
        let x = values(33 * k, 5);
        let mut alone = vec![0f32; n];
        linear(&weight, &x[..k], 1, None, &mut alone).unwrap();
        for m in 1..=33 {
            let mut out = vec![0f32; m * n];
            linear(&weight, &x[..m * k], m, None, &mut out).unwrap();
            assert_eq!(out[..n], alone[..], "{format:?} rows {m}");
        }
    }
}

#[test]
fn large_products_split_over_threads_equal_the_single_thread_result() {
    // 2 rows × 4100 columns × 256 inputs passes the parallel threshold; 4100 is no multiple of
    // the column group.
    let (m, n, k) = (2, 4100, 256);
    let data = blocks(Format::Q8_0, n, k, 13);
    let weight = QuantMatrix::new(Format::Q8_0, &data, n, k).unwrap();
    let x = values(m * k, 17);
    let w = dequantized(&weight);
    let mut out = vec![0f32; m * n];
    linear(&weight, &x, m, None, &mut out).unwrap();
    for (index, (&got, want)) in out.iter().zip(reference(&x, &w, None, m, n, k)).enumerate() {
        assert!(
            (f64::from(got) - want).abs() <= 1e-4,
            "element {index}: {got} vs {want}"
        );
    }
}

#[test]
fn row_lookups_and_bfloat16_equal_the_full_dequantization() {
    for (format, k) in every_format(96) {
        let n = 70;
        let data = blocks(format, n, k, 19);
        let weight = QuantMatrix::new(format, &data, n, k).unwrap();
        let all = dequantized(&weight);
        let ids = [69u32, 0, 5, 5, 33];
        let mut rows = vec![f32::NAN; ids.len() * k];
        dequantize_rows(&weight, &ids, &mut rows).unwrap();
        let mut halves = vec![Bf16::default(); ids.len() * k];
        dequantize_rows(&weight, &ids, &mut halves).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            let want = &all[id as usize * k..][..k];
            assert_eq!(&rows[i * k..][..k], want, "{format:?} row {id}");
            let rounded: Vec<Bf16> = want.iter().map(|&v| Bf16::from_f32(v)).collect();
            assert_eq!(&halves[i * k..][..k], &rounded[..], "{format:?} row {id}");
        }
        let mut full = vec![Bf16::default(); n * k];
        dequantize(&weight, &mut full).unwrap();
        assert!(full.iter().zip(&all).all(|(&h, &v)| h == Bf16::from_f32(v)));
    }
}

#[test]
fn dequantizing_equals_the_scalar_decoding_bit_for_bit() {
    for (format, k) in every_format(160) {
        let n = 67;
        let mut data = blocks(format, n, k, 31);
        // Scales at the edges of half precision: subnormal, largest, infinite, NaN.
        for (row, half) in [0x0001u16, 0x7bff, 0x7c00, 0x7e00, 0xfc00]
            .iter()
            .enumerate()
        {
            let at = row * k / format.block_weights() * format.block_bytes() + scale_at(format);
            data[at..at + 2].copy_from_slice(&half.to_le_bytes());
        }
        let weight = QuantMatrix::new(format, &data, n, k).unwrap();
        let mut expected = vec![0f32; n * k];
        for (row, values) in expected.chunks_exact_mut(k).enumerate() {
            block::decode_row(format, weight.row(row), values);
        }
        let got = dequantized(&weight);
        assert!(
            got.iter()
                .zip(&expected)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{format:?}"
        );
        let mut halves = vec![Bf16::default(); n * k];
        dequantize(&weight, &mut halves).unwrap();
        for (index, (&h, &v)) in halves.iter().zip(&expected).enumerate() {
            assert_eq!(h, Bf16::from_f32(v), "{format:?} element {index} ({v})");
        }
    }
}
