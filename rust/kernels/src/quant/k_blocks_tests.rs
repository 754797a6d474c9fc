//! Unit tests of `k_blocks.rs`: hand-made super-blocks with their weights worked out by hand,
//! and random ones against a transcription of GGML's `dequantize_row_q*_K` loops.

use super::*;
use crate::test_values::values;

const HALF_ONE_HALF: u16 = 0x3800;
const HALF_ONE_QUARTER: u16 = 0x3400;

fn q4_k_like(format: Format) -> Vec<u8> {
    let mut block = vec![0u8; format.block_bytes()];
    block[..2].copy_from_slice(&HALF_ONE_HALF.to_le_bytes());
    block[2..4].copy_from_slice(&HALF_ONE_QUARTER.to_le_bytes());
    let scales = &mut block[4..16];
    scales[0] = 3; // sub-block 0: scale 3
    scales[4] = 5; // sub-block 0: min 5
    scales[1] = 0xc0 | 7; // sub-block 1: scale 7; top bits 3 of sub-block 5's scale
    scales[5] = 0x40 | 9; // sub-block 1: min 9; top bits 1 of sub-block 5's min
    scales[8] = 0x30; // sub-block 4: scale 0, min 3
    scales[9] = 0x21; // sub-block 5: scale 1 | 48 = 49, min 2 | 16 = 18
    let nibbles = block.len() - 128;
    block[nibbles] = 0xa4; // weight 0: 4; weight 32: 10
    block[nibbles + 65] = 0xf0; // weight 129: 0; weight 161: 15
    block
}

#[test]
fn q4_k_and_q5_k_decode_as_ggml_defines_them() {
    let w = decode(Format::Q4_K, &q4_k_like(Format::Q4_K));
    // (d·sc)·q - dmin·m with d = 0.5, dmin = 0.25.
    assert_eq!(w[0], 0.5 * 3.0 * 4.0 - 0.25 * 5.0);
    assert_eq!(w[1], -1.25);
    assert_eq!(w[32], 0.5 * 7.0 * 10.0 - 0.25 * 9.0);
    assert_eq!(w[129], -0.75);
    assert_eq!(w[161], 0.5 * 49.0 * 15.0 - 0.25 * 18.0);

    let mut block = q4_k_like(Format::Q5_K);
    block[16] = 0x01; // weight 0's fifth bit
    block[17] = 0x20; // weight 32·5 + 1 = 161's
    let w = decode(Format::Q5_K, &block);
    assert_eq!(w[0], 0.5 * 3.0 * 20.0 - 0.25 * 5.0);
    assert_eq!(w[32], 0.5 * 7.0 * 10.0 - 0.25 * 9.0);
    assert_eq!(w[161], 0.5 * 49.0 * 31.0 - 0.25 * 18.0);
    assert_eq!(w[129], -0.75);
}

#[test]
fn q6_k_decodes_as_ggml_defines_it() {
    let mut block = vec![0u8; 210];
    block[208..].copy_from_slice(&HALF_ONE_HALF.to_le_bytes());
    block[192] = (-3i8) as u8; // sub-block 0
    block[192 + 4] = 1;
    block[192 + 6] = 2;
    block[192 + 15] = 100;
    block[0] = 0x21; // weight 0: low nibble 1; weight 64: 2
    block[32] = 0x50; // weight 96: low nibble 5
    block[128] = 0b1100_0010; // weight 0: high bits 2; weight 64: 0; weight 96: 3
    block[127] = 0xf0; // weight 255: low nibble 15
    block[191] = 0xc0; // weight 255: high bits 3
    let w = decode(Format::Q6_K, &block);
    assert_eq!(w[0], 0.5 * -3.0 * (33.0 - 32.0));
    assert_eq!(w[1], 0.5 * -3.0 * -32.0);
    assert_eq!(w[64], 0.5 * 1.0 * (2.0 - 32.0));
    assert_eq!(w[96], 0.5 * 2.0 * (53.0 - 32.0));
    assert_eq!(w[255], 0.5 * 100.0 * 31.0);
}

/// Random super-blocks of `format`, the halves of moderate size.
fn random_blocks(format: Format, count: usize, seed: u64) -> Vec<u8> {
    let noise = values(count * format.block_bytes(), seed);
    let mut out: Vec<u8> = noise.iter().map(|v| ((v + 1.0) * 127.99) as u8).collect();
    for block in out.chunks_exact_mut(format.block_bytes()) {
        let at = if format == Format::Q6_K { 208 } else { 0 };
        block[at..at + 2].copy_from_slice(&0x2c3du16.to_le_bytes());
        if format != Format::Q6_K {
            block[2..4].copy_from_slice(&0x1d07u16.to_le_bytes());
        }
    }
    out
}

/// GGML's `get_scale_min_k4`.
fn ggml_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// GGML's `dequantize_row_q4_K` and `dequantize_row_q5_K` for one super-block.
fn ggml_q45(x: &[u8], fifth: bool) -> Vec<f32> {
    let d = block::f16_to_f32(u16::from_le_bytes([x[0], x[1]]));
    let min = block::f16_to_f32(u16::from_le_bytes([x[2], x[3]]));
    let scales = &x[4..16];
    let (qh, mut ql) = if fifth {
        (&x[16..48], &x[48..])
    } else {
        (&x[0..0], &x[16..])
    };
    let mut y = Vec::new();
    let (mut is, mut u1, mut u2) = (0, 1u8, 2u8);
    for _ in (0..256).step_by(64) {
        let (sc, m) = ggml_scale_min(is, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = ggml_scale_min(is + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        let bit = |l: usize, u: u8| if fifth && qh[l] & u != 0 { 16.0 } else { 0.0 };
        for (l, &q) in ql[..32].iter().enumerate() {
            y.push(d1 * (f32::from(q & 0xF) + bit(l, u1)) - m1);
        }
        for (l, &q) in ql[..32].iter().enumerate() {
            y.push(d2 * (f32::from(q >> 4) + bit(l, u2)) - m2);
        }
        ql = &ql[32..];
        is += 2;
        u1 <<= 2;
        u2 <<= 2;
    }
    y
}

/// GGML's `dequantize_row_q6_K` for one super-block.
fn ggml_q6(x: &[u8]) -> Vec<f32> {
    let d = block::f16_to_f32(u16::from_le_bytes([x[208], x[209]]));
    let mut y = vec![0f32; 256];
    for n in 0..2 {
        let (ql, qh, sc) = (&x[64 * n..], &x[128 + 32 * n..], &x[192 + 8 * n..]);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            let scale = |i: usize| d * f32::from(sc[i] as i8);
            let y = &mut y[128 * n..];
            y[l] = scale(is) * f32::from(q1);
            y[l + 32] = scale(is + 2) * f32::from(q2);
            y[l + 64] = scale(is + 4) * f32::from(q3);
            y[l + 96] = scale(is + 6) * f32::from(q4);
        }
    }
    y
}

#[test]
fn random_super_blocks_decode_as_ggmls_loops_bit_for_bit() {
    for format in [Format::Q4_K, Format::Q5_K, Format::Q6_K] {
        let data = random_blocks(format, 40, 5);
        for block in data.chunks_exact(format.block_bytes()) {
            let want = match format {
                Format::Q6_K => ggml_q6(block),
                _ => ggml_q45(block, format == Format::Q5_K),
            };
            let got = decode(format, block);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{format:?}");
        }
    }
}
