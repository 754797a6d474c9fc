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
        let want: Vec<f64> = gate_up
            .chunks_exact(2 * dim)
            .flat_map(|row| {
                let (gate, up) = row.split_at(dim);
                gate.iter().zip(up).map(|(&g, &u)| {
                    let g = f64::from(g);
                    g / (1.0 + (-g).exp()) * f64::from(u)
                })
            })
            .collect();
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
