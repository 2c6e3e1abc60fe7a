//! Gradients of index_select (an embedding lookup): repeated indices, views and op results as
//! sources; along dim 1 refused.

use crate::common::*;
use crate::{all_pass, gc, grad_check, Dom, EMBED_IDX};
use wgrad::{Error, Tensor};

// ------------------------------------------------------------------------------------------
// index_select (embedding lookup).

#[test]
fn grad_index_select_embedding_repeated_indices() {
    let idx = Tensor::from_u32(dev(), &EMBED_IDX, &[6]).unwrap();
    gc(
        "index_select [6, 4] rows [0, 3, 3, 5, 0, 1]",
        &[(&[6, 4], Dom::Sym(2.0))],
        |t| t[0].index_select(0, &idx),
        |a| a[0].index_select(0, &EMBED_IDX),
    );
}

#[test]
fn grad_index_select_of_views_and_nodes() {
    let idx = Tensor::from_u32(dev(), &EMBED_IDX, &[6]).unwrap();
    all_pass(vec![
        // Rows of a column slice: the gradient lands in a strided view of the weight's.
        grad_check(
            "index_select of [6, 7].narrow(1, 2, 4)",
            &[(&[6, 7], Dom::Sym(2.0))],
            |t| t[0].narrow(1, 2, 4)?.index_select(0, &idx),
            |a| a[0].narrow(1, 2, 4).index_select(0, &EMBED_IDX),
        ),
        // Rows of a transposed weight (a non-contiguous gradient target).
        grad_check(
            "index_select of [4, 6].t()",
            &[(&[4, 6], Dom::Sym(2.0))],
            |t| t[0].t()?.index_select(0, &idx),
            |a| a[0].t().index_select(0, &EMBED_IDX),
        ),
        // Rows of an op's result, then another op.
        grad_check(
            "index_select of tanh(x), squared",
            &[(&[6, 4], Dom::Sym(2.0))],
            |t| t[0].tanh()?.index_select(0, &idx)?.square(),
            |a| {
                a[0].map(f64::tanh)
                    .index_select(0, &EMBED_IDX)
                    .map(|v| v * v)
            },
        ),
    ]);
}

#[test]
fn index_select_backward_along_dim_1_is_refused() {
    let d = dev();
    let idx = Tensor::from_u32(d, &[1, 0], &[2]).unwrap();
    let x = Tensor::zeros(d, &[3, 4]).unwrap().requires_grad();
    match x.index_select(1, &idx) {
        Err(e @ Error::InvalidArgument { .. }) => {
            assert!(e.to_string().contains("dim 0"), "{e}")
        }
        other => panic!("want InvalidArgument, got {other:?}"),
    }
}
