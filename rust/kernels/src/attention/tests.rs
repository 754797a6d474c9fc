//! Unit tests of `attention.rs`: against a float64 reference, batch invariance, refusals.

use super::*;
use crate::test_values::values;

struct Case {
    shape: DecodeShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    slots: Vec<i32>,
    seq_lens: Vec<i32>,
}

/// Sequences of the given lengths over a pool of scattered slots; 9 query heads over 3 K/V
/// heads of 20 floats (a head size that is not a multiple of 8).
fn case(seq_lens: &[i32]) -> Case {
    case_of(seq_lens, 9, 3, 20)
}

/// Sequences of the given lengths over a pool of scattered slots, in heads of this shape.
fn case_of(seq_lens: &[i32], heads: usize, kv_heads: usize, head_dim: usize) -> Case {
    let pool_slots = 97;
    let width = *seq_lens.iter().max().unwrap() as usize + 2;
    let batch = seq_lens.len();
    let mut slots = vec![-1; batch * width];
    for (seq, &len) in seq_lens.iter().enumerate() {
        for t in 0..len as usize {
            slots[seq * width + t] = ((seq * 31 + t * 7 + 1) % pool_slots) as i32;
        }
    }
    let shape = DecodeShape {
        batch,
        heads,
        kv_heads,
        head_dim,
        pool_slots,
        width,
    };
    Case {
        shape,
        q: values(batch * heads * head_dim, 1),
        k: values(pool_slots * kv_heads * head_dim, 2),
        v: values(pool_slots * kv_heads * head_dim, 3),
        slots,
        seq_lens: seq_lens.to_vec(),
    }
}

fn attend(case: &Case) -> Result<Vec<f32>> {
    let mut out = vec![f32::NAN; case.q.len()];
    decode_attention(
        &case.shape,
        &case.q,
        &case.k,
        &case.v,
        &case.slots,
        &case.seq_lens,
        0.25,
        &mut out,
    )?;
    Ok(out)
}

fn reference(case: &Case) -> Vec<f64> {
    let DecodeShape {
        batch,
        heads,
        kv_heads,
        head_dim: d,
        width,
        ..
    } = case.shape;
    let mut out = vec![0f64; batch * heads * d];
    for seq in 0..batch {
        for head in 0..heads {
            let kv = head / (heads / kv_heads);
            let q = &case.q[(seq * heads + head) * d..][..d];
            let rows: Vec<usize> = (0..case.seq_lens[seq] as usize)
                .map(|t| (case.slots[seq * width + t] as usize * kv_heads + kv) * d)
                .collect();
            let scores: Vec<f64> = rows
                .iter()
                .map(|&r| {
                    0.25 * (0..d)
                        .map(|i| f64::from(q[i]) * f64::from(case.k[r + i]))
                        .sum::<f64>()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            for i in 0..d {
                let value: f64 = rows
                    .iter()
                    .zip(&weights)
                    .map(|(&r, w)| w * f64::from(case.v[r + i]))
                    .sum();
                out[(seq * heads + head) * d + i] = value / sum;
            }
        }
    }
    out
}

#[test]
fn equals_a_float64_reference() {
    // Enough rows in all to run on several threads.
    let case = case(&[1, 5, 40, 17, 64]);
    let out = attend(&case).unwrap();
    for (index, (&got, want)) in out.iter().zip(reference(&case)).enumerate() {
        assert!(
            (f64::from(got) - want).abs() < 1e-5,
            "element {index}: {got} vs {want}"
        );
    }
}

#[test]
fn a_sequence_comes_out_the_same_bits_alone_and_in_a_batch() {
    let batch = case(&[3, 50, 12, 33]);
    let together = attend(&batch).unwrap();
    let per_seq = batch.shape.heads * batch.shape.head_dim;
    let width = batch.shape.width;
    for seq in 0..4 {
        let alone = Case {
            shape: DecodeShape {
                batch: 1,
                ..batch.shape
            },
            q: batch.q[seq * per_seq..(seq + 1) * per_seq].to_vec(),
            k: batch.k.clone(),
            v: batch.v.clone(),
            slots: batch.slots[seq * width..(seq + 1) * width].to_vec(),
            seq_lens: vec![batch.seq_lens[seq]],
        };
        assert_eq!(
            attend(&alone).unwrap(),
            together[seq * per_seq..(seq + 1) * per_seq]
        );
    }
}

#[test]
fn a_long_sequence_alone_shares_its_heads_between_threads_and_keeps_its_bits() {
    // Alone and long enough for several threads, the sequence's query heads are split between
    // them; in a batch of as many sequences as threads, each is one task.
    let batch = case(&[300, 260]);
    let together = attend(&batch).unwrap();
    let per_seq = batch.shape.heads * batch.shape.head_dim;
    let width = batch.shape.width;
    let alone = Case {
        shape: DecodeShape {
            batch: 1,
            ..batch.shape
        },
        q: batch.q[..per_seq].to_vec(),
        k: batch.k.clone(),
        v: batch.v.clone(),
        slots: batch.slots[..width].to_vec(),
        seq_lens: vec![300],
    };
    let out = attend(&alone).unwrap();
    assert_eq!(out, together[..per_seq]);
    for (&got, want) in out.iter().zip(reference(&alone)) {
        assert!((f64::from(got) - want).abs() < 1e-5);
    }
}

#[test]
fn bad_slots_lengths_and_shapes_are_refused() {
    let mut bad_slot = case(&[4, 6]);
    bad_slot.slots[bad_slot.shape.width + 5] = 97;
    let message = attend(&bad_slot).unwrap_err().to_string();
    assert!(message.contains("sequence 1 names slot 97"), "{message}");
    let mut empty = case(&[4, 6]);
    empty.seq_lens[0] = 0;
    assert!(attend(&empty)
        .unwrap_err()
        .to_string()
        .contains("sequence 0 has length 0"));
    let mut long = case(&[4, 6]);
    long.seq_lens[1] = long.shape.width as i32 + 1;
    assert!(attend(&long).is_err());
    let mut heads = case(&[4]);
    heads.shape.kv_heads = 2;
    assert!(attend(&heads)
        .unwrap_err()
        .to_string()
        .contains("cannot share"));
    let mut short = case(&[4]);
    short.q.pop();
    assert!(attend(&short)
        .unwrap_err()
        .to_string()
        .contains("the query has"));
}

#[test]
fn the_exponential_is_within_two_ulp_of_the_c_library() {
    for i in 0..=200_000 {
        let x = -(i as f32) * 87.0 / 200_000.0;
        let (ours, libm) = (exp_nonpositive(x), x.exp());
        assert!(
            (ours - libm).abs() <= 2.0 * f32::EPSILON * libm,
            "e^{x}: {ours} vs {libm}"
        );
    }
    assert_eq!(exp_nonpositive(-100.0), 0.0);
    assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_nonpositive(0.0), 1.0);
}

#[test]
fn shapes_whose_products_overflow_are_refused() {
    // (2^(bits-1) + 1) · 2 wraps around to 2: a plain product would accept these two-float
    // buffers for 2^(bits-1) + 1 sequences.
    let wrapping = (1usize << (usize::BITS - 1)) + 1;
    let shapes = [
        (wrapping, 1, 1, 2, 1, 1),
        (1, 1, 1, 2, wrapping, 1),
        (1, usize::MAX / 2, 1, 3, 1, 1),
        (wrapping, 1, 1, 1, 1, 2),
    ];
    for (batch, heads, kv_heads, head_dim, pool_slots, width) in shapes {
        let shape = DecodeShape {
            batch,
            heads,
            kv_heads,
            head_dim,
            pool_slots,
            width,
        };
        let mut out = [0.0; 2];
        let result = decode_attention(
            &shape,
            &[0.0; 2],
            &[0.0; 2],
            &[0.0; 2],
            &[1, 1],
            &[1],
            1.0,
            &mut out,
        );
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "{shape:?}: {result:?}"
        );
    }
}

use crate::element::{to_bf16, Bf16};

/// The tiers this CPU runs, lowest first.
fn tiers() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|&isa| isa <= isa::detected())
        .collect()
}

fn attend_on<T: Element>(isa: Isa, case: &Case, q: &[T], k: &[T], v: &[T]) -> Vec<T> {
    let mut out = vec![T::store(f32::NAN); q.len()];
    decode_attention_on(
        isa,
        &case.shape,
        q,
        k,
        v,
        &case.slots,
        &case.seq_lens,
        0.25,
        &mut out,
    )
    .unwrap();
    out
}

#[test]
fn every_tier_equals_the_float64_reference_in_float32() {
    let case = case(&[1, 5, 40, 17, 64]);
    let want = reference(&case);
    for isa in tiers() {
        let out = attend_on(isa, &case, &case.q, &case.k, &case.v);
        for (index, (&got, &want)) in out.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(got) - want).abs() < 1e-5,
                "{isa:?} element {index}: {got} vs {want}"
            );
        }
    }
}

/// Checks every tier's bf16 result on `case`'s values rounded to bf16 against the float64
/// reference of the rounded values.
fn check_bf16_tiers_against_the_reference(mut case: Case) {
    let (q, k, v) = (to_bf16(&case.q), to_bf16(&case.k), to_bf16(&case.v));
    let widen = |values: &[Bf16]| values.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    (case.q, case.k, case.v) = (widen(&q), widen(&k), widen(&v));
    let want = reference(&case);
    let shape = case.shape;
    for isa in tiers() {
        let out = attend_on(isa, &case, &q, &k, &v);
        for (index, (got, &want)) in out.iter().zip(&want).enumerate() {
            // The output's rounding (half a bf16 step, 2^-8 of the value at most), the weights'
            // (2^-8 of each, so of the sum of |weight · v| <= max |v| = 1), and the float32
            // sums' error.
            let got = f64::from(got.to_f32());
            assert!(
                (got - want).abs() <= want.abs() / 256.0 + 1.0 / 256.0 + 1e-5,
                "{isa:?} {shape:?} element {index}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn bf16_caches_give_the_reference_of_their_values_within_two_roundings() {
    // Head size 20: the AVX-512 BF16 products run one masked step per head.
    check_bf16_tiers_against_the_reference(case(&[1, 5, 40, 17, 64, 300]));
}

#[test]
fn bf16_heads_of_32_to_128_give_the_reference_within_two_roundings() {
    // AVX-512 BF16 takes these head sizes in `grouped.rs`: lengths around its blocks of 16
    // keys, groups of one to eight query heads per K/V head (eight: two runs of four).
    for (heads, kv_heads, head_dim) in
        [(9, 3, 64), (8, 2, 128), (4, 4, 32), (16, 2, 96), (6, 1, 64)]
    {
        let case = case_of(&[1, 15, 16, 17, 40, 300], heads, kv_heads, head_dim);
        check_bf16_tiers_against_the_reference(case);
    }
}

#[test]
fn bf16_sequences_come_out_the_same_bits_alone_and_in_a_batch_on_every_tier() {
    // Heads of 64 go to `grouped.rs` on AVX-512 BF16; 300 rows alone are enough for several
    // threads, which then share the sequence's query heads.
    for batch in [case(&[3, 50, 12, 33]), case_of(&[3, 50, 12, 300], 9, 3, 64)] {
        sequences_come_out_the_same_bits_alone_and_in_a_batch(&batch);
    }
}

fn sequences_come_out_the_same_bits_alone_and_in_a_batch(batch: &Case) {
    let (q, k, v) = (to_bf16(&batch.q), to_bf16(&batch.k), to_bf16(&batch.v));
    let per_seq = batch.shape.heads * batch.shape.head_dim;
    let width = batch.shape.width;
    for isa in tiers() {
        let together = attend_on(isa, batch, &q, &k, &v);
        for seq in 0..batch.shape.batch {
            let alone = Case {
                shape: DecodeShape {
                    batch: 1,
                    ..batch.shape
                },
                q: Vec::new(),
                k: Vec::new(),
                v: Vec::new(),
                slots: batch.slots[seq * width..(seq + 1) * width].to_vec(),
                seq_lens: vec![batch.seq_lens[seq]],
            };
            let query = &q[seq * per_seq..(seq + 1) * per_seq];
            assert_eq!(
                attend_on(isa, &alone, query, &k, &v),
                together[seq * per_seq..(seq + 1) * per_seq],
                "{isa:?} sequence {seq}"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_bf16_pair_products_equal_a_float64_dot_product() {
    let Some(cpu) = isa::Avx512Bf16::detected() else {
        eprintln!("skipped: this CPU has no AVX-512 BF16");
        return;
    };
    for len in [1, 2, 31, 32, 33, 64, 100, 128] {
        let (a, b) = (to_bf16(&values(len, 41)), to_bf16(&values(len, 42)));
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(x.to_f32()) * f64::from(y.to_f32()))
            .sum();
        // SAFETY: the token proves the CPU has AVX-512 BF16.
        let got = unsafe { tiers::dot_bf16(cpu, &a, &b) };
        assert!(
            (f64::from(got) - want).abs() < 1e-5,
            "{len}: {got} vs {want}"
        );
    }
}
