//! Unit tests of `prefill.rs`: every kind of products this CPU runs (portable, `vdpbf16ps`,
//! AMX tiles) against a float64 reference over the same bf16 inputs, with and without a cached prefix, grouped heads or not, lengths that fill no block
//! and lengths around the edges of key blocks and of 32-key slices (tiles that skip a block,
//! or stop partway through one); the vector `2^t`; refusals of bad shapes.

use super::*;
use crate::element::to_bf16;
use crate::test_values::values;

struct Case {
    shape: PrefillShape,
    q: Vec<Bf16>,
    k: Vec<Bf16>,
    v: Vec<Bf16>,
}

fn case(heads: usize, kv_heads: usize, head_dim: usize, prefix: usize, new: usize) -> Case {
    let total = prefix + new;
    let seed = (heads * 100 + prefix * 7 + new) as u64;
    // Keys scaled by 4: scores spread over several units, so that the softmax is neither flat
    // nor one-hot and the running maximum moves between blocks.
    let keys: Vec<f32> = values(total * kv_heads * head_dim, seed + 2)
        .iter()
        .map(|x| x * 4.0)
        .collect();
    Case {
        shape: PrefillShape {
            heads,
            kv_heads,
            head_dim,
            prefix,
            new,
        },
        q: to_bf16(&values(new * heads * head_dim, seed + 1)),
        k: to_bf16(&keys),
        v: to_bf16(&values(total * kv_heads * head_dim, seed + 3)),
    }
}

const SCALE: f32 = 0.125;

fn attend(case: &Case, products: Products) -> Vec<f32> {
    attend_scaled(case, products, SCALE)
}

fn attend_scaled(case: &Case, products: Products, scale: f32) -> Vec<f32> {
    let mut out = vec![Bf16::default(); case.q.len()];
    let (shape, q, k, v) = (&case.shape, &case.q, &case.k, &case.v);
    prefill_attention_with(products, shape, q, k, v, scale, &mut out).unwrap();
    out.iter().map(|x| x.to_f32()).collect()
}

/// Float64 attention of each new token's query heads over its visible keys.
fn reference(case: &Case) -> Vec<f64> {
    reference_scaled(case, SCALE)
}

fn reference_scaled(case: &Case, scale: f32) -> Vec<f64> {
    let PrefillShape {
        heads,
        kv_heads,
        head_dim: d,
        prefix,
        new,
    } = case.shape;
    let group = heads / kv_heads;
    let at = |x: &[Bf16], i: usize| f64::from(x[i].to_f32());
    let mut out = vec![0.0; new * heads * d];
    for t in 0..new {
        for h in 0..heads {
            let g = h / group;
            let visible = prefix + t + 1;
            let scores: Vec<f64> = (0..visible)
                .map(|key| {
                    (0..d)
                        .map(|c| {
                            at(&case.q, (t * heads + h) * d + c)
                                * at(&case.k, (key * kv_heads + g) * d + c)
                        })
                        .sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            for c in 0..d {
                out[(t * heads + h) * d + c] = (0..visible)
                    .map(|key| weights[key] * at(&case.v, (key * kv_heads + g) * d + c))
                    .sum::<f64>()
                    / sum;
            }
        }
    }
    out
}

/// Bf16 weights and output (8 significant bits each) on outputs below 1: within 1e-2.
const TOLERANCE: f64 = 1e-2;

fn max_error(got: &[f32], expected: &[f64]) -> f64 {
    got.iter()
        .zip(expected)
        .map(|(&g, &e)| (f64::from(g) - e).abs())
        .fold(0.0, f64::max)
}

#[test]
fn equals_the_float64_reference_on_every_tier() {
    let shapes = [
        (9, 3, 64, 0, 1),
        (9, 3, 64, 0, 45),
        (9, 3, 64, 0, 100),
        (9, 3, 64, 70, 33),
        (4, 4, 32, 5, 1),
        (6, 1, 32, 31, 64),
        (2, 2, 96, 64, 40),
        // Several key blocks: the running maximum and sum carried across blocks.
        (9, 3, 64, 200, 90),
        (3, 1, 32, 0, 300),
    ];
    for (heads, kv_heads, d, prefix, new) in shapes {
        equals_the_reference_on_both_tiers(heads, kv_heads, d, prefix, new);
    }
}

/// The portable tier and this CPU's both attend this shape within `TOLERANCE` of the float64
/// reference.
fn equals_the_reference_on_both_tiers(
    heads: usize,
    kv_heads: usize,
    d: usize,
    prefix: usize,
    new: usize,
) {
    let case = case(heads, kv_heads, d, prefix, new);
    let expected = reference(&case);
    for products in Products::detected() {
        let error = max_error(&attend(&case, products), &expected);
        assert!(
            error < TOLERANCE,
            "{heads}/{kv_heads} heads of {d}, {prefix} + {new} tokens, {products:?}: {error}"
        );
    }
}

#[test]
fn equals_the_reference_around_block_edges() {
    // (prefix, new) around multiples of BLOCK_KEYS and of 32 keys: the last tiles of a token
    // block see part of a key block (their products stop at a multiple of 32 keys), the first
    // ones none of it (they skip it), and rows of one tile see different numbers of keys.
    let b = BLOCK_KEYS;
    let lengths = [
        (0, b - 1),
        (0, b + 1),
        (b - 1, 2),
        (b, 33),
        (b - 33, 70),
        (31, b + 2),
        (2 * b - 5, 40),
    ];
    for (prefix, new) in lengths {
        for (heads, kv_heads, d) in [(9, 3, 64), (2, 1, 32)] {
            equals_the_reference_on_both_tiers(heads, kv_heads, d, prefix, new);
        }
    }
}

#[test]
fn equals_the_reference_with_a_negative_or_zero_scale() {
    // The softmax scales raw scores on the way: a negative scale makes the smallest raw score
    // of a block its maximum, a zero one makes every weight equal.
    let case = case(9, 3, 64, BLOCK_KEYS - 20, 50);
    for scale in [-0.125, 0.0] {
        let expected = reference_scaled(&case, scale);
        for products in Products::detected() {
            let error = max_error(&attend_scaled(&case, products, scale), &expected);
            assert!(error < TOLERANCE, "scale {scale}, {products:?}: {error}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn vector_exp2_has_float32_accuracy() {
    use std::arch::x86_64::*;
    let Some(cpu) = isa::Avx512Bf16::detected() else {
        eprintln!("skipped: this CPU has no AVX-512 BF16");
        return;
    };
    // Down to -120: below -126 the results are denormal (and below -127 clamped).
    let inputs: Vec<f32> = (0..16 * 375).map(|i| -(i as f32) * 0.02).collect();
    for chunk in inputs.chunks_exact(16) {
        let mut got = [0f32; 16];
        // SAFETY: the token proves the CPU has AVX-512; `chunk` and `got` hold 16 floats.
        unsafe {
            let t = _mm512_loadu_ps(chunk.as_ptr());
            _mm512_storeu_ps(got.as_mut_ptr(), avx512::exp2(cpu, 0x7fff, t));
        }
        for (lane, (&t, &g)) in chunk.iter().zip(&got).enumerate() {
            let want = f64::from(t).exp2();
            if lane == 15 {
                assert_eq!(g, 0.0, "lane outside the mask");
            } else {
                let error = (f64::from(g) / want - 1.0).abs();
                assert!(error < 1e-6, "2^{t}: {g}, expected {want}");
            }
        }
    }
    // -inf (a first block's correction) gives a term that is zero in bf16, not NaN.
    let mut got = [1f32; 16];
    // SAFETY: as above.
    unsafe {
        let t = _mm512_set1_ps(f32::NEG_INFINITY);
        _mm512_storeu_ps(got.as_mut_ptr(), avx512::exp2(cpu, !0, t));
    }
    assert!(got.iter().all(|&g| (0.0..1e-38).contains(&g)), "{got:?}");
}

#[test]
fn a_token_ignores_the_tokens_after_it() {
    // BLOCK_KEYS + 10 new tokens after BLOCK_KEYS + 12 cached: three key blocks; the first 20
    // (one token block) see only the first two.
    let prefix = BLOCK_KEYS + 12;
    let long = case(9, 3, 64, prefix, BLOCK_KEYS + 10);
    let mut short = case(9, 3, 64, prefix, BLOCK_KEYS + 10);
    short.shape.new = 20;
    short.q.truncate(20 * 9 * 64);
    short.k.truncate((prefix + 20) * 3 * 64);
    short.v.truncate((prefix + 20) * 3 * 64);
    for products in Products::detected() {
        let (long_out, short_out) = (attend(&long, products), attend(&short, products));
        assert_eq!(&long_out[..short_out.len()], &short_out[..]);
    }
}

#[test]
fn refuses_bad_shapes() {
    let good = case(6, 2, 32, 3, 5);
    let mut out = vec![Bf16::default(); good.q.len()];
    let mut call = |shape: PrefillShape, k_len: usize| {
        prefill_attention(&shape, &good.q, &good.k[..k_len], &good.v, SCALE, &mut out)
    };
    let full = good.k.len();
    assert!(call(good.shape, full).is_ok());
    for (shape, k_len) in [
        (
            PrefillShape {
                head_dim: 48,
                ..good.shape
            },
            full,
        ),
        (
            PrefillShape {
                kv_heads: 4,
                ..good.shape
            },
            full,
        ),
        (
            PrefillShape {
                kv_heads: 0,
                ..good.shape
            },
            full,
        ),
        (
            PrefillShape {
                prefix: 4,
                ..good.shape
            },
            full,
        ),
        (
            PrefillShape {
                prefix: usize::MAX,
                ..good.shape
            },
            full,
        ),
        (good.shape, full - 1),
    ] {
        assert!(
            matches!(call(shape, k_len), Err(Error::InvalidArgument(_))),
            "{shape:?}"
        );
    }
}
