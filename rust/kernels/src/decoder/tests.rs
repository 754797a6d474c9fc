//! Unit tests of `decoder.rs`: a stack of two layers against a float64 reference of the same
//! layers on the dequantized weights (within the rounding of the activations to two int8
//! parts), row independence, and refused calls that change nothing.

use super::*;
use crate::quant::tests::{blocks, dequantized};
use crate::quant::{pack, packed_len, Format, QuantMatrix};
use crate::test_values::values;

const HEADS: Heads = Heads {
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    eps: 1e-5,
    scale: 0.176_776_7,
};
const DIM: usize = 64;
const INTERMEDIATE: usize = 96;
const POOL: usize = 32;
const LAYERS: usize = 2;

/// A random projection: its blocks, their tiles and its dequantized `[n, k]` weight.
struct Random {
    blocks: Vec<u8>,
    tiles: Vec<u8>,
    dense: Vec<f32>,
    bias: Option<Vec<f32>>,
    n: usize,
    k: usize,
}

impl Random {
    fn new(n: usize, k: usize, seed: u64, bias: bool) -> Random {
        let format = Format::Q4_1;
        let data = blocks(format, n, k, seed);
        let matrix = QuantMatrix::new(format, &data, n, k).unwrap();
        let mut tiles = vec![0; packed_len(format, n, k).unwrap()];
        pack(&matrix, &mut tiles).unwrap();
        let bias = bias.then(|| values(n, seed + 1));
        let dense = dequantized(&matrix);
        Random {
            blocks: data,
            tiles,
            dense,
            bias,
            n,
            k,
        }
    }

    fn projection(&self, products: Products) -> Projection<'_> {
        let (n, k) = (self.n, self.k);
        let (weight, one_int8_from) = match products {
            Products::Blocks => (
                Weight::Blocks(QuantMatrix::new(Format::Q4_1, &self.blocks, n, k).unwrap()),
                None,
            ),
            Products::Tiles { one_int8_from } => (
                Weight::Packed(PackedMatrix::new(Format::Q4_1, &self.tiles, n, k).unwrap()),
                one_int8_from,
            ),
        };
        Projection {
            weight,
            bias: self.bias.as_deref(),
            one_int8_from,
        }
    }

    /// `x · Wᵀ + bias` in float64 for rows of `k`.
    fn apply(&self, x: &[f64]) -> Vec<f64> {
        x.chunks_exact(self.k)
            .flat_map(|row| {
                (0..self.n).map(move |j| {
                    let w = &self.dense[j * self.k..(j + 1) * self.k];
                    let dot: f64 = row.iter().zip(w).map(|(a, &b)| a * f64::from(b)).sum();
                    dot + self.bias.as_ref().map_or(0.0, |b| f64::from(b[j]))
                })
            })
            .collect()
    }
}

/// What the projections compute on: GGUF blocks (float32), or tiles (two int8 parts, one from
/// `one_int8_from` rows).
#[derive(Clone, Copy)]
enum Products {
    Blocks,
    Tiles { one_int8_from: Option<usize> },
}

const TWO_PARTS: Products = Products::Tiles {
    one_int8_from: None,
};

struct Layer {
    input_norm: Vec<f32>,
    /// Per-head q and k norms (the second layer's: Qwen3's shape beside Llama's).
    qk_norms: Option<(Vec<f32>, Vec<f32>)>,
    post_norm: Vec<f32>,
    qkv: Random,
    o: Random,
    gate_up: Random,
    down: Random,
}

impl Layer {
    fn mlp(&self, products: Products) -> Mlp<'_> {
        Mlp {
            gate_up: self.gate_up.projection(products),
            down: self.down.projection(products),
        }
    }
}

fn layers() -> Vec<Layer> {
    let (q, kv) = (
        HEADS.heads * HEADS.head_dim,
        HEADS.kv_heads * HEADS.head_dim,
    );
    (0..LAYERS as u64)
        .map(|i| Layer {
            input_norm: values(DIM, 10 * i + 1).iter().map(|v| 1.0 + v).collect(),
            qk_norms: (i == 1).then(|| {
                let norm = |seed| {
                    values(HEADS.head_dim, seed)
                        .iter()
                        .map(|v| 1.0 + v)
                        .collect()
                };
                (norm(10 * i + 7), norm(10 * i + 8))
            }),
            post_norm: values(DIM, 10 * i + 2).iter().map(|v| 1.0 + v).collect(),
            qkv: Random::new(q + 2 * kv, DIM, 10 * i + 3, true),
            o: Random::new(DIM, q, 10 * i + 4, false),
            gate_up: Random::new(2 * INTERMEDIATE, DIM, 10 * i + 5, false),
            down: Random::new(DIM, INTERMEDIATE, 10 * i + 6, false),
        })
        .collect()
}

/// The batch: sequences of 5, 1 and 9 tokens over distinct slots, the last one new.
struct Batch {
    slots: Vec<i32>,
    seq_lens: Vec<i32>,
    out_slots: Vec<i64>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

const WIDTH: usize = 10;

fn batch() -> Batch {
    let seq_lens = vec![5, 1, 9];
    let mut slots = vec![0; seq_lens.len() * WIDTH];
    let mut next = 1;
    for (row, &len) in seq_lens.iter().enumerate() {
        for slot in &mut slots[row * WIDTH..row * WIDTH + len as usize] {
            *slot = next;
            next += 2; // every other slot: sequences interleave in the pool
        }
    }
    let out_slots = seq_lens
        .iter()
        .enumerate()
        .map(|(row, &len)| i64::from(slots[row * WIDTH + len as usize - 1]))
        .collect();
    let half = HEADS.head_dim / 2;
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for &len in &seq_lens {
        let angles: Vec<f32> = (0..half)
            .map(|i| (len - 1) as f32 * 10_000f32.powf(-((2 * i) as f32) / HEADS.head_dim as f32))
            .collect();
        cos.extend(angles.iter().chain(&angles).map(|a| a.cos()));
        sin.extend(angles.iter().map(|a| -a.sin()));
        sin.extend(angles.iter().map(|a| a.sin()));
    }
    Batch {
        slots,
        seq_lens,
        out_slots,
        cos,
        sin,
    }
}

fn caches() -> Vec<(Vec<f32>, Vec<f32>)> {
    let width = HEADS.kv_heads * HEADS.head_dim;
    (0..LAYERS as u64)
        .map(|i| (values(POOL * width, 100 + i), values(POOL * width, 200 + i)))
        .collect()
}

/// Runs the stack on f32 buffers with `products`: the last layer's output and the residual.
fn run(
    products: Products,
    layers: &[Layer],
    batch: &Batch,
    caches: &mut [(Vec<f32>, Vec<f32>)],
    hidden: &[f32],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut stack: Vec<DecoderLayer<'_, f32>> = layers
        .iter()
        .zip(caches.iter_mut())
        .map(|(layer, (k, v))| DecoderLayer {
            input_norm: &layer.input_norm,
            qkv: layer.qkv.projection(products),
            o: layer.o.projection(products),
            qk_norms: layer.qk_norms.as_ref().map(|(q, k)| (&q[..], &k[..])),
            post_norm: &layer.post_norm,
            feed_forward: FeedForward::Dense(layer.mlp(products)),
            k_cache: k,
            v_cache: v,
        })
        .collect();
    let tokens = Tokens {
        cos: &batch.cos,
        sin: &batch.sin,
        out_slots: &batch.out_slots,
        slots: &batch.slots,
        seq_lens: &batch.seq_lens,
    };
    let (mut hidden, mut residual) = (hidden.to_vec(), vec![0.0; hidden.len()]);
    let kernel = PackedKernel::best().unwrap_or(PackedKernel::Portable);
    decode_layers(
        kernel,
        &HEADS,
        &mut stack,
        &tokens,
        &mut hidden,
        &mut residual,
    )?;
    Ok((hidden, residual))
}

fn rms_norm(x: &[f64], weight: &[f32]) -> Vec<f64> {
    x.chunks_exact(weight.len())
        .flat_map(|row| {
            let mean = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
            let inverse = 1.0 / (mean + f64::from(HEADS.eps)).sqrt();
            row.iter()
                .zip(weight)
                .map(move |(v, &w)| v * inverse * f64::from(w))
        })
        .collect()
}

/// Rotates the heads of token `t`'s row `x` by the batch's tables.
fn rotate(x: &[f64], batch: &Batch, t: usize) -> Vec<f64> {
    let d = HEADS.head_dim;
    let (cos, sin) = (&batch.cos[t * d..][..d], &batch.sin[t * d..][..d]);
    x.chunks_exact(d)
        .flat_map(|head| {
            (0..d).map(move |i| {
                let swapped = head[(i + d / 2) % d];
                head[i] * f64::from(cos[i]) + swapped * f64::from(sin[i])
            })
        })
        .collect()
}

/// The stack in float64 on the dequantized weights, writing the caches as the stack does.
fn reference(
    layers: &[Layer],
    batch: &Batch,
    caches: &mut [(Vec<f64>, Vec<f64>)],
    hidden: &[f32],
) -> (Vec<f64>, Vec<f64>) {
    let (d, q_width, kv_width) = (
        HEADS.head_dim,
        HEADS.heads * HEADS.head_dim,
        HEADS.kv_heads * HEADS.head_dim,
    );
    let mut h: Vec<f64> = hidden.iter().map(|&v| f64::from(v)).collect();
    let mut r = vec![0.0; h.len()];
    for (layer, (k_cache, v_cache)) in layers.iter().zip(caches.iter_mut()) {
        r.iter_mut().zip(&h).for_each(|(r, h)| *r += h);
        let qkv = layer.qkv.apply(&rms_norm(&r, &layer.input_norm));
        let mut attended = Vec::new();
        for (t, row) in qkv.chunks_exact(q_width + 2 * kv_width).enumerate() {
            let (mut q, mut k) = (
                row[..q_width].to_vec(),
                row[q_width..q_width + kv_width].to_vec(),
            );
            if let Some((q_norm, k_norm)) = &layer.qk_norms {
                (q, k) = (rms_norm(&q, q_norm), rms_norm(&k, k_norm));
            }
            let (q, k) = (rotate(&q, batch, t), rotate(&k, batch, t));
            let slot = batch.out_slots[t] as usize;
            k_cache[slot * kv_width..][..kv_width].copy_from_slice(&k);
            v_cache[slot * kv_width..][..kv_width].copy_from_slice(&row[q_width + kv_width..]);
            let slots = &batch.slots[t * WIDTH..][..batch.seq_lens[t] as usize];
            for head in 0..HEADS.heads {
                let kv = head / (HEADS.heads / HEADS.kv_heads) * d;
                let query = &q[head * d..][..d];
                let scores: Vec<f64> = slots
                    .iter()
                    .map(|&s| {
                        let key = &k_cache[s as usize * kv_width + kv..][..d];
                        query.iter().zip(key).map(|(a, b)| a * b).sum::<f64>()
                            * f64::from(HEADS.scale)
                    })
                    .collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                attended.extend((0..d).map(|i| {
                    slots
                        .iter()
                        .zip(&weights)
                        .map(|(&s, w)| w * v_cache[s as usize * kv_width + kv + i])
                        .sum::<f64>()
                        / total
                }));
            }
        }
        h = layer.o.apply(&attended);
        r.iter_mut().zip(&h).for_each(|(r, h)| *r += h);
        let gate_up = layer.gate_up.apply(&rms_norm(&r, &layer.post_norm));
        let act: Vec<f64> = gate_up
            .chunks_exact(2 * INTERMEDIATE)
            .flat_map(|row| {
                let (gate, up) = row.split_at(INTERMEDIATE);
                gate.iter().zip(up).map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            })
            .collect();
        h = layer.down.apply(&act);
    }
    (h, r)
}

/// Whether `got` is within `tolerance` of `want`, relative to `want`'s largest magnitude.
fn close(got: &[f32], want: &[f64], tolerance: f64) -> bool {
    let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(&g, w)| (f64::from(g) - w).abs() <= tolerance * scale)
}

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
    down.one_int8_from = Some(1);
    let stacked = DecoderLayer {
        input_norm: &layer.input_norm,
        qkv: layer.qkv.projection(Products::Blocks),
        o: layer.o.projection(Products::Blocks),
        qk_norms: None,
        post_norm: &layer.post_norm,
        feed_forward: FeedForward::Dense(Mlp {
            gate_up: layer.gate_up.projection(Products::Blocks),
            down,
        }),
        k_cache: &mut k,
        v_cache: &mut v,
    };
    let (q_width, kv_width) = (
        HEADS.heads * HEADS.head_dim,
        HEADS.kv_heads * HEADS.head_dim,
    );
    let widths = (q_width, kv_width, HEADS.head_dim);
    let refused = check_layer(&stacked, DIM, widths);
    assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.contains("down")));
    let short = vec![1.0; HEADS.head_dim - 1];
    let stacked = DecoderLayer {
        feed_forward: FeedForward::Dense(layer.mlp(Products::Blocks)),
        qk_norms: Some((&layer.input_norm[..HEADS.head_dim], &short)),
        ..stacked
    };
    let refused = check_layer(&stacked, DIM, widths);
    assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.contains("k norm")));
}

#[test]
fn k_quants_are_refused() {
    let layer = &layers()[0];
    let (mut k, mut v) = caches().swap_remove(0);
    let data = blocks(Format::Q4_K, DIM, 256, 3);
    let down = Projection {
        weight: Weight::Blocks(QuantMatrix::new(Format::Q4_K, &data, DIM, 256).unwrap()),
        bias: None,
        one_int8_from: None,
    };
    let stacked = DecoderLayer {
        input_norm: &layer.input_norm,
        qkv: layer.qkv.projection(Products::Blocks),
        o: layer.o.projection(Products::Blocks),
        qk_norms: None,
        post_norm: &layer.post_norm,
        feed_forward: FeedForward::Dense(Mlp {
            gate_up: layer.gate_up.projection(Products::Blocks),
            down,
        }),
        k_cache: &mut k,
        v_cache: &mut v,
    };
    let widths = (
        HEADS.heads * HEADS.head_dim,
        HEADS.kv_heads * HEADS.head_dim,
        HEADS.head_dim,
    );
    let refused = check_layer(&stacked, DIM, widths);
    assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.contains("Q4_K")));
}

/// Experts of the tiny mixture: `(gate_up, down)` of 32 rows each.
fn experts(count: u64) -> Vec<(Random, Random)> {
    (0..count)
        .map(|e| {
            (
                Random::new(2 * 32, DIM, 300 + 2 * e, false),
                Random::new(DIM, 32, 301 + 2 * e, false),
            )
        })
        .collect()
}

fn mlps(experts: &[(Random, Random)], products: Products) -> Vec<Mlp<'_>> {
    experts
        .iter()
        .map(|(gate_up, down)| Mlp {
            gate_up: gate_up.projection(products),
            down: down.projection(products),
        })
        .collect()
}

#[test]
fn a_mixture_of_one_expert_gives_its_mlps_bits() {
    let one = experts(1);
    let router = values(DIM, 9);
    let x = values(3 * DIM, 7);
    let products = TWO_PARTS;
    let kernel = PackedKernel::best().unwrap_or(PackedKernel::Portable);
    let mut scratch = Scratch::default();
    let (mut dense, mut sparse) = (vec![0f32; 3 * DIM], vec![0f32; 3 * DIM]);
    let mlp = mlps(&one, products)[0];
    let buffers = (&mut scratch.gate_up, &mut scratch.act);
    mlp_rows(kernel, &mlp, &x, 3, &mut dense, buffers).unwrap();
    let experts = Experts {
        router: &router,
        experts: vec![mlp],
        top_k: 1,
        renormalize: true,
    };
    mixture(kernel, &experts, &x, 3, &mut sparse, &mut scratch).unwrap();
    assert_eq!(dense, sparse);
}

#[test]
fn a_mixture_weighs_each_rows_experts() {
    let all = experts(4);
    let router = values(4 * DIM, 9);
    let x = values(3 * DIM, 7);
    let kernel = PackedKernel::best().unwrap_or(PackedKernel::Portable);
    for products in [TWO_PARTS, Products::Blocks] {
        let mut scratch = Scratch::default();
        let experts = Experts {
            router: &router,
            experts: mlps(&all, products),
            top_k: 2,
            renormalize: false,
        };
        let mut out = vec![0f32; 3 * DIM];
        mixture(kernel, &experts, &x, 3, &mut out, &mut scratch).unwrap();
        let (mut ids, mut weights) = (vec![0; 6], vec![0f32; 6]);
        moe::route(&x, &router, 4, 2, false, &mut ids, &mut weights).unwrap();
        // Each row through its two experts alone (a row's bits do not depend on the batch),
        // weighed and summed in float64.
        for (row, x) in x.chunks_exact(DIM).enumerate() {
            let mut want = vec![0f64; DIM];
            for j in 0..2 {
                let mut y = vec![0f32; DIM];
                let mlp = &experts.experts[ids[2 * row + j] as usize];
                let buffers = (&mut scratch.gate_up, &mut scratch.act);
                mlp_rows(kernel, mlp, x, 1, &mut y, buffers).unwrap();
                for (w, y) in want.iter_mut().zip(y) {
                    *w += f64::from(y) * f64::from(weights[2 * row + j]);
                }
            }
            assert!(close(&out[row * DIM..][..DIM], &want, 1e-6), "row {row}");
        }
        let used: std::collections::HashSet<_> = ids.iter().collect();
        assert!(used.len() > 2, "the rows do not all take the same experts");
    }
}

#[test]
fn a_mixture_of_the_wrong_shape_is_refused() {
    let layer = &layers()[0];
    let all = experts(2);
    let router = values(2 * DIM, 9);
    let (mut k, mut v) = caches().swap_remove(0);
    let widths = (
        HEADS.heads * HEADS.head_dim,
        HEADS.kv_heads * HEADS.head_dim,
        HEADS.head_dim,
    );
    let sparse = |router, top_k| {
        FeedForward::Sparse(Experts {
            router,
            experts: mlps(&all, Products::Blocks),
            top_k,
            renormalize: true,
        })
    };
    for (feed_forward, says) in [
        (sparse(&router[1..], 2), "router"),
        (sparse(&router[..], 3), "cannot route"),
    ] {
        let stacked = DecoderLayer {
            input_norm: &layer.input_norm,
            qkv: layer.qkv.projection(Products::Blocks),
            o: layer.o.projection(Products::Blocks),
            qk_norms: None,
            post_norm: &layer.post_norm,
            feed_forward,
            k_cache: &mut k,
            v_cache: &mut v,
        };
        let refused = check_layer(&stacked, DIM, widths);
        assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.contains(says)));
    }
}
