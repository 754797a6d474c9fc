//! The router of a sparse mixture of experts (Qwen3-MoE's, OLMoE's): which `top_k` experts each
//! token goes to, and with what weights.
//!
//! Per row `x` of the input: logits `l = x · routerᵀ` in float32, probabilities
//! `p = softmax(l)`, the `top_k` largest (a tie goes to the lower expert index), in descending
//! order, divided by their sum when `renormalize` (Qwen3-MoE's `norm_topk_prob`).
//!
//! Why one kernel: the Python mixture (`srt.layers.moe`) routes through it on the CPU, and so
//! does the fused decode step (`decoder.rs`), so that both pick the same experts with the same
//! weights, bit for bit. It is the same portable code on every CPU (no tier dispatch), each
//! row computed alone.

use crate::element::Element;
use crate::{Error, Result};

/// Routes each row of `x` (`[rows, hidden]`, `hidden = router.len() / experts`) through
/// `router` (`[experts, hidden]` float32): its experts in `ids` and their weights in `weights`
/// (`[rows, top_k]` each).
pub fn route<T: Element>(
    x: &[T],
    router: &[f32],
    experts: usize,
    top_k: usize,
    renormalize: bool,
    ids: &mut [i64],
    weights: &mut [f32],
) -> Result<()> {
    if experts == 0 || router.is_empty() || !router.len().is_multiple_of(experts) {
        return Err(Error::InvalidArgument(format!(
            "a router of {} floats is not rows for {experts} experts",
            router.len()
        )));
    }
    let hidden = router.len() / experts;
    if !x.len().is_multiple_of(hidden) {
        return Err(Error::InvalidArgument(format!(
            "an input of {} elements is not rows of {hidden}",
            x.len()
        )));
    }
    if top_k == 0 || top_k > experts {
        return Err(Error::InvalidArgument(format!(
            "top {top_k} of {experts} experts"
        )));
    }
    let rows = x.len() / hidden;
    if ids.len() != rows * top_k || weights.len() != rows * top_k {
        return Err(Error::InvalidArgument(format!(
            "{rows} rows of {top_k} experts each need {} ids and weights, not {} and {}",
            rows * top_k,
            ids.len(),
            weights.len()
        )));
    }
    let mut row = vec![0f32; hidden];
    let mut probs = vec![0f32; experts];
    let mut taken = vec![false; experts];
    for ((input, ids), weights) in x
        .chunks_exact(hidden)
        .zip(ids.chunks_exact_mut(top_k))
        .zip(weights.chunks_exact_mut(top_k))
    {
        for (r, v) in row.iter_mut().zip(input) {
            *r = v.load();
        }
        for (p, weight) in probs.iter_mut().zip(router.chunks_exact(hidden)) {
            *p = dot(&row, weight);
        }
        softmax(&mut probs);
        taken.fill(false);
        for (id, weight) in ids.iter_mut().zip(weights.iter_mut()) {
            let mut best: Option<usize> = None;
            for (e, &p) in probs.iter().enumerate() {
                if !taken[e] && best.is_none_or(|b| p > probs[b]) {
                    best = Some(e);
                }
            }
            let best = best.expect("top_k <= experts leaves an expert to take");
            taken[best] = true;
            *id = best as i64;
            *weight = probs[best];
        }
        if renormalize {
            let total: f32 = weights.iter().sum();
            weights.iter_mut().for_each(|w| *w /= total);
        }
    }
    Ok(())
}

/// `a · b` in float32, over eight running sums (which the compiler keeps in vector registers).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut sums = [0f32; 8];
    let (a_chunks, b_chunks) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for ((sum, a), b) in sums.iter_mut().zip(x).zip(y) {
            *sum += a * b;
        }
    }
    ((sums[0] + sums[4]) + (sums[1] + sums[5])) + ((sums[2] + sums[6]) + (sums[3] + sums[7])) + tail
}

/// `values` replaced by their softmax.
fn softmax(values: &mut [f32]) {
    let top = values.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut total = 0f32;
    for v in values.iter_mut() {
        *v = (*v - top).exp();
        total += *v;
    }
    values.iter_mut().for_each(|v| *v /= total);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::to_bf16;
    use crate::test_values::values;

    /// The routing in float64, for comparison: each row's experts and weights.
    fn reference(x: &[f32], router: &[f32], experts: usize, top_k: usize) -> Vec<(i64, f64)> {
        let hidden = router.len() / experts;
        x.chunks_exact(hidden)
            .flat_map(|row| {
                let logits: Vec<f64> = router
                    .chunks_exact(hidden)
                    .map(|w| {
                        row.iter()
                            .zip(w)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum()
                    })
                    .collect();
                let top = logits.iter().cloned().fold(f64::MIN, f64::max);
                let exps: Vec<f64> = logits.iter().map(|l| (l - top).exp()).collect();
                let total: f64 = exps.iter().sum();
                let mut order: Vec<usize> = (0..experts).collect();
                order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]).then(a.cmp(&b)));
                order.truncate(top_k);
                let chosen: f64 = order.iter().map(|&e| exps[e] / total).sum();
                order
                    .into_iter()
                    .map(move |e| (e as i64, exps[e] / total / chosen))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn routes_each_row_to_its_most_probable_experts() {
        let (experts, hidden, top_k, rows) = (8, 36, 3, 5);
        let router = values(experts * hidden, 1);
        let x = values(rows * hidden, 2);
        let (mut ids, mut weights) = (vec![0; rows * top_k], vec![0f32; rows * top_k]);
        route(&x, &router, experts, top_k, true, &mut ids, &mut weights).unwrap();
        let want = reference(&x, &router, experts, top_k);
        for ((id, w), (want_id, want_w)) in ids.iter().zip(&weights).zip(want) {
            assert_eq!(*id, want_id);
            assert!((f64::from(*w) - want_w).abs() < 1e-6, "{w} {want_w}");
        }
        for row in weights.chunks_exact(top_k) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        // Without renormalizing, the weights are the probabilities themselves (summing below 1),
        // and a bf16 input routes as its float32 values do.
        let (mut raw_ids, mut raw) = (vec![0; rows * top_k], vec![0f32; rows * top_k]);
        route(&x, &router, experts, top_k, false, &mut raw_ids, &mut raw).unwrap();
        assert_eq!(raw_ids, ids);
        assert!(raw
            .chunks_exact(top_k)
            .all(|row| row.iter().sum::<f32>() < 1.0));
        let half = to_bf16(&x);
        let widened: Vec<f32> = half.iter().map(|v| v.load()).collect();
        let (mut half_ids, mut half_w) = (vec![0; rows * top_k], vec![0f32; rows * top_k]);
        let (mut wide_ids, mut wide_w) = (vec![0; rows * top_k], vec![0f32; rows * top_k]);
        route(
            &half,
            &router,
            experts,
            top_k,
            true,
            &mut half_ids,
            &mut half_w,
        )
        .unwrap();
        route(
            &widened,
            &router,
            experts,
            top_k,
            true,
            &mut wide_ids,
            &mut wide_w,
        )
        .unwrap();
        assert_eq!((half_ids, half_w), (wide_ids, wide_w));
    }

    #[test]
    fn ties_go_to_the_lower_expert_and_bad_shapes_are_refused() {
        let router = vec![0f32; 4 * 2]; // every expert equally likely
        let (mut ids, mut weights) = (vec![0; 2], vec![0f32; 2]);
        route(&[1.0, 2.0], &router, 4, 2, false, &mut ids, &mut weights).unwrap();
        assert_eq!((ids, weights), (vec![0, 1], vec![0.25, 0.25]));
        let (mut ids, mut weights) = (vec![0; 2], vec![0f32; 2]);
        let mut refused = |x: &[f32], experts, top_k| {
            matches!(
                route(x, &router, experts, top_k, true, &mut ids, &mut weights),
                Err(Error::InvalidArgument(_))
            )
        };
        assert!(refused(&[1.0, 2.0], 3, 2)); // 8 floats are not rows for 3 experts
        assert!(refused(&[1.0, 2.0, 3.0], 4, 2)); // not rows of 2
        assert!(refused(&[1.0, 2.0], 4, 5)); // more than there are
        assert!(refused(&[1.0, 2.0, 3.0, 4.0], 4, 2)); // two rows, room for one
    }
}
