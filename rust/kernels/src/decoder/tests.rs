//! Unit tests of `decoder.rs`: a stack of two layers against a float64 reference of the same
//! layers on the dequantized weights (within the rounding of the activations to two int8
//! parts), row independence, and refused calls that change nothing; the mixture of experts in
//! `mixture.rs`.

use super::*;
use crate::quant::tests::blocks;
use crate::quant::Format;
use crate::test_values::values;
use crate::Error;

mod fixtures;
mod mixture;
mod reference;

use fixtures::*;
use reference::{close, reference};

#[test]
fn the_stack_matches_a_float64_reference_and_writes_the_caches() {
    // On tiles, activations are rounded to about 15 bits per block of 32 before each product;
    // on blocks, the products are float32. (Rounded to one int8 per value, the random layers
    // here amplify the rounding to 16% of an output within a layer: that product is held to
    // its own kernel's tests instead, and the Python model's to the dequantized model's.)
    for (products, tolerance) in [(TWO_PARTS, 2e-3), (Products::Blocks, 1e-5)] {
        let (layers, batch) = (layers(), batch());
        let hidden = values(batch.seq_lens.len() * DIM, 7);
        let mut caches = caches();
        let mut wide: Vec<(Vec<f64>, Vec<f64>)> = caches
            .iter()
            .map(|(k, v)| {
                let widen = |x: &Vec<f32>| x.iter().map(|&v| f64::from(v)).collect();
                (widen(k), widen(v))
            })
            .collect();
        let (h, r) = run(products, &layers, &batch, &mut caches, &hidden).unwrap();
        let (want_h, want_r) = reference(&layers, &batch, &mut wide, &hidden);
        assert!(close(&h, &want_h, tolerance), "{h:?}\n{want_h:?}");
        assert!(close(&r, &want_r, tolerance));
        for ((k, v), (want_k, want_v)) in caches.iter().zip(&wide) {
            assert!(close(k, want_k, tolerance) && close(v, want_v, tolerance));
        }
    }
}

#[test]
fn a_sequence_gets_the_same_bits_alone_as_in_the_batch() {
    let (layers, all) = (layers(), batch());
    let hidden = values(all.seq_lens.len() * DIM, 7);
    let d = HEADS.head_dim;
    let alone = Batch {
        slots: all.slots[2 * WIDTH..].to_vec(),
        seq_lens: vec![all.seq_lens[2]],
        out_slots: vec![all.out_slots[2]],
        cos: all.cos[2 * d..].to_vec(),
        sin: all.sin[2 * d..].to_vec(),
    };
    for one_int8_from in [None, Some(1)] {
        let products = Products::Tiles { one_int8_from };
        let mut caches = caches();
        let (h, r) = run(products, &layers, &all, &mut caches, &hidden).unwrap();
        let mut fresh = self::caches();
        let (h2, r2) = run(products, &layers, &alone, &mut fresh, &hidden[2 * DIM..]).unwrap();
        assert_eq!(h[2 * DIM..], h2[..]);
        assert_eq!(r[2 * DIM..], r2[..]);
    }
}

#[test]
fn steps_of_one_int8_from_rows_or_more_round_activations_to_one_int8() {
    let (layers, batch) = (layers(), batch());
    let hidden = values(batch.seq_lens.len() * DIM, 7);
    let rows = batch.seq_lens.len();
    let step = |one_int8_from: Option<usize>| {
        let products = Products::Tiles { one_int8_from };
        run(products, &layers, &batch, &mut caches(), &hidden).unwrap()
    };
    let (two_parts, one_int8) = (step(None), step(Some(1)));
    assert_ne!(two_parts, one_int8);
    assert_eq!(step(Some(rows)), one_int8);
    assert_eq!(step(Some(rows + 1)), two_parts);
}

#[test]
fn a_projection_in_parts_writes_each_parts_outputs_side_by_side() {
    // q/k rows in Q4_1 and v rows in Q8_0, as a fused weight of two formats is held.
    let (qk, v) = (
        Random::of(Format::Q4_1, 64, DIM, 3, true),
        Random::of(Format::Q8_0, 32, DIM, 4, true),
    );
    let (rows, width) = (3, 96);
    let x = values(rows * DIM, 7);
    let kernel = PackedKernel::best().unwrap_or(PackedKernel::Portable);
    let one_int8 = Products::Tiles {
        one_int8_from: Some(1),
    };
    for products in [TWO_PARTS, one_int8, Products::Blocks] {
        let (qk, v) = (qk.projection(products), v.projection(products));
        let parts = Projection {
            parts: [&qk, &v].iter().flat_map(|p| p.parts.clone()).collect(),
        };
        let mut out = vec![0f32; rows * width];
        project(kernel, &parts, &x, rows, &mut out).unwrap();
        let (mut qk_out, mut v_out) = (vec![0f32; rows * 64], vec![0f32; rows * 32]);
        project(kernel, &qk, &x, rows, &mut qk_out).unwrap();
        project(kernel, &v, &x, rows, &mut v_out).unwrap();
        for (row, out) in out.chunks_exact(width).enumerate() {
            assert_eq!(out[..64], qk_out[row * 64..][..64]);
            assert_eq!(out[64..], v_out[row * 32..][..32]);
        }
    }
}

#[test]
fn a_refused_call_changes_nothing() {
    let layers = layers();
    let hidden = values(3 * DIM, 7);
    let original = caches();
    let mut bad_slot = batch();
    bad_slot.out_slots[1] = POOL as i64;
    let mut bad_len = batch();
    bad_len.seq_lens[0] = WIDTH as i32 + 1;
    let mut short_table = batch();
    short_table.cos.pop();
    for bad in [bad_slot, bad_len, short_table] {
        let mut caches = original.clone();
        assert!(matches!(
            run(TWO_PARTS, &layers, &bad, &mut caches, &hidden),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(caches, original);
    }
    let mut wrong = self::layers();
    wrong[1].down = Random::new(DIM, DIM, 9, false);
    let mut caches = original.clone();
    let refused = run(Products::Blocks, &wrong, &batch(), &mut caches, &hidden);
    assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.starts_with("layer 1")));
    assert_eq!(caches, original);
}

#[test]
fn blocks_refuse_one_int8_activations() {
    let layer = &layers()[0];
    let (mut k, mut v) = caches().swap_remove(0);
    let mut down = layer.down.projection(Products::Blocks);
    down.parts[0].one_int8_from = Some(1);
    let feed_forward = FeedForward::Dense(Mlp {
        gate_up: layer.gate_up.projection(Products::Blocks),
        down,
    });
    let stacked = layer.stacked(Products::Blocks, feed_forward, (&mut k, &mut v));
    let refused = check_layer(&stacked, DIM, ATTENTION_WIDTHS);
    assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.contains("down")));
    let short = vec![1.0; HEADS.head_dim - 1];
    let stacked = DecoderLayer {
        feed_forward: FeedForward::Dense(layer.mlp(Products::Blocks)),
        qk_norms: Some((&layer.input_norm[..HEADS.head_dim], &short)),
        ..stacked
    };
    let refused = check_layer(&stacked, DIM, ATTENTION_WIDTHS);
    assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.contains("k norm")));
}

#[test]
fn a_k_quant_projection_rounds_activations_to_one_int8_from_its_rows() {
    let format = Format::Q4_K;
    let matrix_blocks = blocks(format, DIM, 256, 3);
    let matrix = QuantMatrix::new(format, &matrix_blocks, DIM, 256).unwrap();
    let mut tiles = vec![0; quant::packed_len(format, DIM, 256).unwrap()];
    quant::pack(&matrix, &mut tiles).unwrap();
    let weight = PackedMatrix::new(format, &tiles, DIM, 256).unwrap();
    let down = |one_int8_from| -> Projection<'_> {
        Part {
            weight: Weight::Packed(weight),
            bias: None,
            one_int8_from,
        }
        .into()
    };
    let (rows, kernel) = (3, PackedKernel::best().unwrap_or(PackedKernel::Portable));
    let x = values(rows * 256, 5);
    let product = |one_int8: bool| {
        let mut out = vec![0f32; rows * DIM];
        if one_int8 {
            quant::linear_packed_one_int8(kernel, &weight, &x, rows, None, &mut out).unwrap();
        } else {
            linear_packed(kernel, &weight, &x, rows, None, &mut out).unwrap();
        }
        out
    };
    for (one_int8_from, one_int8) in [(Some(rows), true), (Some(rows + 1), false), (None, false)] {
        let mut out = vec![0f32; rows * DIM];
        project(kernel, &down(one_int8_from), &x, rows, &mut out).unwrap();
        assert_eq!(out, product(one_int8), "one_int8_from {one_int8_from:?}");
    }
    assert_ne!(product(true), product(false));
}
