//! The decoder's mixture of experts: one expert gives its MLP's bits, each row is its experts'
//! weighed sum, and a router or `top_k` of the wrong shape is refused.

use super::fixtures::*;
use super::reference::close;
use crate::decoder::*;
use crate::test_values::values;
use crate::Error;

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
    let mlp = mlps(&one, products).swap_remove(0);
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
        let stacked = layer.stacked(Products::Blocks, feed_forward, (&mut k, &mut v));
        let refused = check_layer(&stacked, DIM, ATTENTION_WIDTHS);
        assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.contains(says)));
    }
}
