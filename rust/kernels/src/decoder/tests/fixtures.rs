//! What the decoder's tests run on: two random layers (the second with Qwen3's per-head q/k
//! norms) whose projections are Q4_1 blocks (or of another format, `Random::of`), their tiles and their dequantized weights; a batch
//! of three sequences over interleaved slots; the caches; and the stack run on them.

use crate::decoder::*;
use crate::quant::tests::{blocks, dequantized};
use crate::quant::{pack, packed_len, Format, QuantMatrix};
use crate::test_values::values;

pub(super) const HEADS: Heads = Heads {
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    eps: 1e-5,
    scale: 0.176_776_7,
};
pub(super) const DIM: usize = 64;
pub(super) const INTERMEDIATE: usize = 96;
pub(super) const POOL: usize = 32;
pub(super) const LAYERS: usize = 2;

/// A random projection: its blocks, their tiles and its dequantized `[n, k]` weight.
pub(super) struct Random {
    format: Format,
    blocks: Vec<u8>,
    tiles: Vec<u8>,
    dense: Vec<f32>,
    bias: Option<Vec<f32>>,
    n: usize,
    k: usize,
}

impl Random {
    /// A Q4_1 projection.
    pub(super) fn new(n: usize, k: usize, seed: u64, bias: bool) -> Random {
        Random::of(Format::Q4_1, n, k, seed, bias)
    }

    pub(super) fn of(format: Format, n: usize, k: usize, seed: u64, bias: bool) -> Random {
        let data = blocks(format, n, k, seed);
        let matrix = QuantMatrix::new(format, &data, n, k).unwrap();
        let mut tiles = vec![0; packed_len(format, n, k).unwrap()];
        pack(&matrix, &mut tiles).unwrap();
        let bias = bias.then(|| values(n, seed + 1));
        let dense = dequantized(&matrix);
        Random {
            format,
            blocks: data,
            tiles,
            dense,
            bias,
            n,
            k,
        }
    }

    pub(super) fn projection(&self, products: Products) -> Projection<'_> {
        let (n, k) = (self.n, self.k);
        let (weight, one_int8_from) = match products {
            Products::Blocks => (
                Weight::Blocks(QuantMatrix::new(self.format, &self.blocks, n, k).unwrap()),
                None,
            ),
            Products::Tiles { one_int8_from } => (
                Weight::Packed(PackedMatrix::new(self.format, &self.tiles, n, k).unwrap()),
                one_int8_from,
            ),
        };
        Part {
            weight,
            bias: self.bias.as_deref(),
            one_int8_from,
        }
        .into()
    }

    /// `x · Wᵀ + bias` in float64 for rows of `k`.
    pub(super) fn apply(&self, x: &[f64]) -> Vec<f64> {
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
pub(super) enum Products {
    Blocks,
    Tiles { one_int8_from: Option<usize> },
}

pub(super) const TWO_PARTS: Products = Products::Tiles {
    one_int8_from: None,
};

pub(super) struct Layer {
    pub(super) input_norm: Vec<f32>,
    /// Per-head q and k norms (the second layer's: Qwen3's shape beside Llama's).
    pub(super) qk_norms: Option<(Vec<f32>, Vec<f32>)>,
    pub(super) post_norm: Vec<f32>,
    pub(super) qkv: Random,
    pub(super) o: Random,
    pub(super) gate_up: Random,
    pub(super) down: Random,
}

impl Layer {
    pub(super) fn mlp(&self, products: Products) -> Mlp<'_> {
        Mlp {
            gate_up: self.gate_up.projection(products),
            down: self.down.projection(products),
        }
    }

    /// The layer as the stack takes it: its norms, its attention's projections on
    /// `products`, `feed_forward`, and the caches `k` and `v`.
    pub(super) fn stacked<'a>(
        &'a self,
        products: Products,
        feed_forward: FeedForward<'a>,
        (k, v): (&'a mut [f32], &'a mut [f32]),
    ) -> DecoderLayer<'a, f32> {
        DecoderLayer {
            input_norm: &self.input_norm,
            qkv: self.qkv.projection(products),
            o: self.o.projection(products),
            qk_norms: self.qk_norms.as_ref().map(|(q, k)| (&q[..], &k[..])),
            post_norm: &self.post_norm,
            feed_forward,
            k_cache: k,
            v_cache: v,
        }
    }
}

pub(super) fn layers() -> Vec<Layer> {
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
pub(super) struct Batch {
    pub(super) slots: Vec<i32>,
    pub(super) seq_lens: Vec<i32>,
    pub(super) out_slots: Vec<i64>,
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
}

pub(super) const WIDTH: usize = 10;

/// The attention widths and head size `check_layer` takes: q's, k's (and v's), a head's.
pub(super) const ATTENTION_WIDTHS: (usize, usize, usize) = (
    HEADS.heads * HEADS.head_dim,
    HEADS.kv_heads * HEADS.head_dim,
    HEADS.head_dim,
);

pub(super) fn batch() -> Batch {
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

pub(super) fn caches() -> Vec<(Vec<f32>, Vec<f32>)> {
    let width = HEADS.kv_heads * HEADS.head_dim;
    (0..LAYERS as u64)
        .map(|i| (values(POOL * width, 100 + i), values(POOL * width, 200 + i)))
        .collect()
}

/// Runs the stack on f32 buffers with `products`: the last layer's output and the residual.
pub(super) fn run(
    products: Products,
    layers: &[Layer],
    batch: &Batch,
    caches: &mut [(Vec<f32>, Vec<f32>)],
    hidden: &[f32],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut stack: Vec<DecoderLayer<'_, f32>> = layers
        .iter()
        .zip(caches.iter_mut())
        .map(|(layer, (k, v))| {
            let feed_forward = FeedForward::Dense(layer.mlp(products));
            layer.stacked(products, feed_forward, (k, v))
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
