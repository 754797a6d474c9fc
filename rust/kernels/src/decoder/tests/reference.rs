//! The decoder stack in float64 on the dequantized weights, which the stack's results are held
//! to.

use super::fixtures::{Batch, Layer, HEADS, INTERMEDIATE, WIDTH};

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
pub(super) fn reference(
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
pub(super) fn close(got: &[f32], want: &[f64], tolerance: f64) -> bool {
    let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(&g, w)| (f64::from(g) - w).abs() <= tolerance * scale)
}
