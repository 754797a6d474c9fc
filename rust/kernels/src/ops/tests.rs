//! Unit tests of `ops.rs` against float64 references.

use super::*;

/// Deterministic values in [-4, 4).
fn values(len: usize, seed: u64) -> Vec<f32> {
    crate::test_values::values(len, seed)
        .into_iter()
        .map(|v| v * 4.0)
        .collect()
}

fn assert_close(got: &[f32], want: &[f64], tolerance: f64) {
    assert_eq!(got.len(), want.len());
    for (index, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= tolerance * (1.0 + w.abs()),
            "{index}: {g} vs {w}"
        );
    }
}

/// `silu(gate) · up` per row of `[gate | up]` (`2 · dim` wide), in float64.
fn silu_reference(gate_up: &[f32], dim: usize) -> Vec<f64> {
    gate_up
        .chunks_exact(2 * dim)
        .flat_map(|row| {
            let (gate, up) = row.split_at(dim);
            gate.iter().zip(up).map(|(&g, &u)| {
                let g = f64::from(g);
                g / (1.0 + (-g).exp()) * f64::from(u)
            })
        })
        .collect()
}

fn rms_reference(x: &[f32], weight: &[f32], eps: f32) -> Vec<f64> {
    let dim = weight.len();
    x.chunks_exact(dim)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dim as f64;
            let scale = 1.0 / (mean + f64::from(eps)).sqrt();
            row.iter()
                .zip(weight)
                .map(move |(&v, &w)| f64::from(w) * f64::from(v) * scale)
        })
        .collect()
}

#[test]
fn rms_norm_equals_a_float64_reference_with_and_without_the_residual() {
    // 37 floats a row: not a multiple of the lanes. 2000 rows run on several threads.
    for rows in [1, 3, 2000] {
        let dim = 37;
        let x = values(rows * dim, 1);
        let weight = values(dim, 2);
        let mut out = vec![f32::NAN; x.len()];
        rms_norm(&x, None, &weight, 1e-6, &mut out).unwrap();
        assert_close(&out, &rms_reference(&x, &weight, 1e-6), 1e-5);
        let mut residual = values(rows * dim, 3);
        let summed: Vec<f32> = residual.iter().zip(&x).map(|(r, v)| r + v).collect();
        rms_norm(&x, Some(&mut residual), &weight, 1e-5, &mut out).unwrap();
        assert_eq!(residual, summed);
        assert_close(&out, &rms_reference(&summed, &weight, 1e-5), 1e-5);
    }
}

#[test]
fn silu_and_mul_equals_a_float64_reference() {
    for rows in [1, 5, 1500] {
        let dim = 45;
        let mut gate_up = values(rows * 2 * dim, 4);
        gate_up[0] = -100.0;
        gate_up[1] = 100.0;
        let mut out = vec![f32::NAN; rows * dim];
        silu_and_mul(&gate_up, dim, &mut out).unwrap();
        let want = silu_reference(&gate_up, dim);
        assert_close(&out, &want, 1e-6);
    }
}

#[test]
fn rotary_rotates_every_head_of_every_token_by_its_own_row() {
    let (tokens, heads, dim) = (3, 5, 6);
    let x = values(tokens * heads * dim, 5);
    let cos = values(tokens * dim, 6);
    let sin = values(tokens * dim, 7);
    let mut out = vec![f32::NAN; x.len()];
    rotary(&x, &cos, &sin, dim, &mut out).unwrap();
    for t in 0..tokens {
        for h in 0..heads {
            let head = &x[(t * heads + h) * dim..][..dim];
            for i in 0..dim {
                let swapped = head[(i + dim / 2) % dim];
                let want = head[i] * cos[t * dim + i] + swapped * sin[t * dim + i];
                assert_eq!(
                    out[(t * heads + h) * dim + i],
                    want,
                    "token {t} head {h} lane {i}"
                );
            }
        }
    }
}

#[test]
fn shapes_that_do_not_fit_are_refused() {
    assert!(rotary(
        &values(12, 1),
        &values(6, 1),
        &values(6, 1),
        3,
        &mut [0.0; 12]
    )
    .is_err());
    assert!(rotary(
        &values(10, 1),
        &values(8, 1),
        &values(8, 1),
        4,
        &mut [0.0; 10]
    )
    .is_err());
    let mut out = vec![0.0; 6];
    assert!(rms_norm(&values(7, 1), None, &[1.0; 3], 1e-6, &mut out).is_err());
    assert!(rms_norm(&values(6, 1), None, &[], 1e-6, &mut out).is_err());
    assert!(rms_norm(
        &values(6, 1),
        Some(&mut [0.0; 3]),
        &[1.0; 3],
        1e-6,
        &mut out
    )
    .is_err());
    assert!(silu_and_mul(&values(12, 1), 3, &mut out[..5]).is_err());
    assert!(silu_and_mul(&values(10, 1), 3, &mut out).is_err());
}

#[test]
fn sizes_past_usize_are_refused() {
    let invalid = |r: Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
    let mut out = [0.0; 2];
    // 2 · 2^(bits-1) wraps to 0 and 2 · (2^(bits-1) + 1) to 2: rows of "2 floats".
    for dim in [
        1 << (usize::BITS - 1),
        (1 << (usize::BITS - 1)) + 1,
        usize::MAX,
    ] {
        assert!(invalid(silu_and_mul(&values(4, 1), dim, &mut out)), "{dim}");
    }
    let huge_even = usize::MAX - 1;
    assert!(invalid(rotary(
        &[0.0; 2], &[0.0; 2], &[0.0; 2], huge_even, &mut out
    )));
}

use crate::element::{to_bf16, Bf16};

/// The tiers this CPU runs, lowest first.
fn tiers() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|&isa| isa <= isa::detected())
        .collect()
}

fn widen(values: &[Bf16]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}

/// Rounds like a bf16 tensor does.
fn round(value: f32) -> f32 {
    Bf16::from_f32(value).to_f32()
}

#[test]
fn every_tier_computes_the_same_bits() {
    let (rows, dim) = (9, 45);
    let x = values(rows * 2 * dim, 11);
    let weight = values(dim, 12);
    let cos = values(rows * dim * 2 / 5, 13);
    let sin = values(rows * dim * 2 / 5, 14);
    let run = |isa: Isa| {
        let mut norm = vec![f32::NAN; x.len() / 2];
        let mut residual = values(norm.len(), 15);
        rms_norm_on(
            isa,
            &x[..norm.len()],
            Some(&mut residual),
            &weight,
            1e-6,
            &mut norm,
        )
        .unwrap();
        let mut silu = vec![f32::NAN; rows * dim];
        silu_and_mul_on(isa, &x, dim, &mut silu).unwrap();
        let mut rotated = vec![f32::NAN; x.len()];
        rotary_on(isa, &x, &cos, &sin, 18, &mut rotated).unwrap();
        let bf = to_bf16(&x);
        let mut silu_bf = vec![Bf16(0); rows * dim];
        silu_and_mul_on(isa, &bf, dim, &mut silu_bf).unwrap();
        (norm, residual, silu, rotated, silu_bf)
    };
    let want = run(Isa::Scalar);
    for isa in tiers() {
        assert_eq!(run(isa), want, "{isa:?}");
    }
}

#[test]
fn bf16_rms_norm_rounds_where_pytorch_does() {
    for rows in [1, 4, 1200] {
        let dim = 67;
        let x = to_bf16(&values(rows * dim, 21));
        let weight = to_bf16(&values(dim, 22));
        let mut residual = to_bf16(&values(rows * dim, 23));
        let summed: Vec<f32> = widen(&residual)
            .iter()
            .zip(widen(&x))
            .map(|(r, v)| round(r + v))
            .collect();
        let mut out = vec![Bf16(0); x.len()];
        for isa in tiers() {
            let mut residual = residual.clone();
            rms_norm_on(isa, &x, Some(&mut residual), &weight, 1e-6, &mut out).unwrap();
            assert_eq!(widen(&residual), summed);
            // The float64 reference of the bf16 sums, rounded as PyTorch rounds twice: the
            // normalized value, then its product with the weight. The float32 sum of squares
            // may differ from float64 in its last bits, so a value may land one bf16 step away.
            let reference = rms_reference(&summed, &widen(&weight), 1e-6);
            for (i, (&got, &want)) in widen(&out).iter().zip(&reference).enumerate() {
                let step = 2f64.powi(-7) * want.abs().max(1e-30);
                assert!(
                    (f64::from(got) - want).abs() <= step,
                    "{isa:?} {i}: {got} vs {want}"
                );
            }
        }
        rms_norm(&x, Some(&mut residual), &weight, 1e-6, &mut out).unwrap();
        assert_eq!(widen(&residual), summed);
    }
}

#[test]
fn bf16_silu_and_mul_and_rotary_equal_float32_rounded_as_pytorch_rounds() {
    let (rows, dim) = (7, 40);
    let gate_up = to_bf16(&values(rows * 2 * dim, 31));
    let wide = widen(&gate_up);
    for isa in tiers() {
        let mut out = vec![Bf16(0); rows * dim];
        silu_and_mul_on(isa, &gate_up, dim, &mut out).unwrap();
        let mut silu = vec![0f32; rows * 2 * dim];
        for (i, value) in silu.iter_mut().enumerate() {
            // The float32 kernel on [silu(g) | 1]: silu(g) alone, to round before the product.
            *value = if i % (2 * dim) < dim { wide[i] } else { 1.0 };
        }
        let mut silu_only = vec![0f32; rows * dim];
        silu_and_mul_on(isa, &silu, dim, &mut silu_only).unwrap();
        let want: Vec<f32> = silu_only
            .iter()
            .enumerate()
            .map(|(i, &s)| round(round(s) * wide[(i / dim) * 2 * dim + dim + i % dim]))
            .collect();
        assert_eq!(widen(&out), want, "{isa:?}");
    }
    let (tokens, heads, head_dim) = (3, 4, 10);
    let x = to_bf16(&values(tokens * heads * head_dim, 32));
    let cos = to_bf16(&values(tokens * head_dim, 33));
    let sin = to_bf16(&values(tokens * head_dim, 34));
    let (wx, wc, ws) = (widen(&x), widen(&cos), widen(&sin));
    for isa in tiers() {
        let mut out = vec![Bf16(0); x.len()];
        rotary_on(isa, &x, &cos, &sin, head_dim, &mut out).unwrap();
        for (i, &got) in widen(&out).iter().enumerate() {
            let (t, lane) = (i / (heads * head_dim), i % head_dim);
            let head = i - lane;
            let swapped = wx[head + (lane + head_dim / 2) % head_dim];
            let table = t * head_dim + lane;
            let want = round(round(wx[i] * wc[table]) + round(swapped * ws[table]));
            assert_eq!(got, want, "{isa:?} {i}");
        }
    }
}

#[test]
fn bf16_shapes_that_do_not_fit_are_refused() {
    let mut out = vec![Bf16(0); 6];
    let x = to_bf16(&values(7, 1));
    assert!(rms_norm(&x, None, &[Bf16(0); 3], 1e-6, &mut out).is_err());
    assert!(silu_and_mul(&x[..6], 3, &mut out[..5]).is_err());
    assert!(rotary(&x[..6], &out[..3], &out[..3], 3, &mut [Bf16(0); 6]).is_err());
}

/// The bits of float32s, so that NaNs compare equal to themselves.
fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Gates with the special values (infinities, NaN, past the exponential's range, tiny and
/// subnormal, signed zeros) between ordinary ones, against ups of either sign.
fn special_gate_up(rows: usize, dim: usize) -> Vec<f32> {
    let specials = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        100.0,
        -100.0,
        87.5,
        -87.5,
        -86.9,
        1e-30,
        -1e-30,
        1e-40,
        -1e-40,
        0.0,
        -0.0,
        f32::MAX,
        f32::MIN,
    ];
    let mut gate_up = values(rows * 2 * dim, 41);
    for (i, g) in gate_up
        .chunks_exact_mut(2 * dim)
        .flat_map(|row| &mut row[..dim])
        .enumerate()
    {
        if i % 3 == 0 {
            *g = specials[(i / 3) % specials.len()];
        }
    }
    // Some ups special too: NaN and infinities meet silu values of every kind.
    for (i, u) in gate_up
        .chunks_exact_mut(2 * dim)
        .flat_map(|row| &mut row[dim..])
        .enumerate()
    {
        if i % 4 == 1 {
            *u = specials[(i / 4 + 1) % specials.len()];
        }
    }
    gate_up
}

/// `gate_up` in bf16 with NaNs of every kind among the values: signaling ones and ones whose
/// payload fills the mantissa (which rounding by addition must not carry into the exponent).
fn special_gate_up_bf16(gate_up: &[f32]) -> Vec<Bf16> {
    let nans = [0x7f81, 0xff81, 0x7fff, 0xffff, 0x7fc0, 0x7fa5];
    let mut bf = to_bf16(gate_up);
    for (i, v) in bf.iter_mut().enumerate() {
        if i % 7 == 3 {
            *v = Bf16(nans[(i / 7) % nans.len()]);
        }
    }
    bf
}

#[test]
fn silu_and_mul_of_special_values_and_ragged_rows_is_the_same_on_every_tier() {
    for dim in [1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 47, 64] {
        let rows = 5;
        let gate_up = special_gate_up(rows, dim);
        let run = |isa: Isa| {
            let mut out = vec![f32::NAN; rows * dim];
            silu_and_mul_on(isa, &gate_up, dim, &mut out).unwrap();
            let bf = special_gate_up_bf16(&gate_up);
            let mut out_bf = vec![Bf16(1); rows * dim];
            silu_and_mul_on(isa, &bf, dim, &mut out_bf).unwrap();
            (bits(&out), out_bf)
        };
        let want = run(Isa::Scalar);
        for isa in tiers() {
            assert_eq!(run(isa), want, "{isa:?} dim {dim}");
        }
    }
}

#[test]
fn silu_of_special_values_behaves_as_pytorch() {
    let silu = |g: f32| {
        let mut out = [0f32];
        silu_and_mul(&[g, 1.0], 1, &mut out).unwrap();
        out[0]
    };
    assert_eq!(silu(f32::INFINITY), f32::INFINITY);
    // -inf · sigmoid(-inf) = -inf · 0: NaN, as PyTorch's `x / (1 + exp(-x))` gives.
    assert!(silu(f32::NEG_INFINITY).is_nan());
    assert!(silu(f32::NAN).is_nan());
    assert_eq!(silu(100.0), 100.0);
    assert_eq!(silu(-100.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(silu(0.0).to_bits(), 0);
    assert_eq!(silu(-0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(silu(1e-30), 5e-31);
    assert_eq!(silu(f32::MAX), f32::MAX);
    // The bf16 kernel's NaN stays NaN through both roundings.
    let mut out = [Bf16(0)];
    silu_and_mul(&to_bf16(&[f32::NAN, 1.0]), 1, &mut out).unwrap();
    assert!(out[0].to_f32().is_nan());
}

#[test]
fn silu_and_mul_is_accurate_on_every_tier_over_a_wide_range() {
    for dim in [1, 15, 17, 33, 200] {
        let rows = 40;
        let gate_up: Vec<f32> = values(rows * 2 * dim, 51)
            .into_iter()
            .map(|v| v * 6.0)
            .collect();
        let want = silu_reference(&gate_up, dim);
        for isa in tiers() {
            let mut out = vec![f32::NAN; rows * dim];
            silu_and_mul_on(isa, &gate_up, dim, &mut out).unwrap();
            assert_close(&out, &want, 1e-6);
        }
    }
}

/// `rows` rows of `width` copied out of `wide` at `stride` apart: the contiguous input that a
/// strided one stands for.
fn gather<T: Copy>(wide: &[T], rows: usize, stride: usize, width: usize) -> Vec<T> {
    (0..rows)
        .flat_map(|r| wide[r * stride..][..width].iter().copied())
        .collect()
}

#[test]
fn strided_rotary_equals_contiguous_bit_for_bit_on_every_tier() {
    // 9 heads of 64 a row among 15 (SmolLM2's q of [q | k | v]), and an odd stride; 300 tokens
    // run on several threads.
    let (heads, head_dim) = (9, 64);
    let width = heads * head_dim;
    for (tokens, stride) in [(1, 960), (5, 960), (300, 960), (7, width + 3), (4, width)] {
        let wide = values((tokens - 1) * stride + width, 41);
        let cos = values(tokens * head_dim, 42);
        let sin = values(tokens * head_dim, 43);
        let plain = gather(&wide, tokens, stride, width);
        let (wide_bf, plain_bf) = (to_bf16(&wide), to_bf16(&plain));
        let (cos_bf, sin_bf) = (to_bf16(&cos), to_bf16(&sin));
        for isa in tiers() {
            let mut want = vec![f32::NAN; tokens * width];
            rotary_on(isa, &plain, &cos, &sin, head_dim, &mut want).unwrap();
            let mut got = vec![f32::NAN; tokens * width];
            rotary_strided_on(isa, &wide, stride, &cos, &sin, head_dim, &mut got).unwrap();
            assert_eq!(got, want, "{isa:?} {tokens} tokens, stride {stride}");
            let mut want = vec![Bf16(0); tokens * width];
            rotary_on(isa, &plain_bf, &cos_bf, &sin_bf, head_dim, &mut want).unwrap();
            let mut got = vec![Bf16(0); tokens * width];
            let x = &wide_bf;
            rotary_strided_on(isa, x, stride, &cos_bf, &sin_bf, head_dim, &mut got).unwrap();
            assert_eq!(got, want, "bf16 {isa:?} {tokens} tokens, stride {stride}");
        }
    }
}

#[test]
fn strided_rotary_refuses_rows_that_overlap_or_run_past_the_input() {
    let (tokens, head_dim, width) = (3, 4, 8);
    let cos = values(tokens * head_dim, 1);
    let mut out = vec![0.0; tokens * width];
    let invalid = |r: Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
    let x = values(2 * 10 + width, 2);
    let rotate = |x: &[f32], stride: usize, out: &mut [f32]| {
        rotary_strided(x, stride, &cos, &cos, head_dim, out)
    };
    assert!(rotate(&x, 10, &mut out).is_ok());
    // Rows closer than their width would read one token's heads as another's.
    assert!(invalid(rotate(&x, 6, &mut out)));
    // The last row ends one element past the input.
    assert!(invalid(rotate(&x[..x.len() - 1], 10, &mut out)));
    // A stride whose product with the rows overflows.
    assert!(invalid(rotate(&x, usize::MAX / 2 + 1, &mut out)));
    // An output that is not whole heads for the tokens.
    assert!(invalid(rotate(&x, 10, &mut out[..23])));
}
