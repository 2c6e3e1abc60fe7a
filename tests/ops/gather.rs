//! index_select (gather) against f64: along dim 0 and 1, repeated and out-of-range indices,
//! views as sources and as indices, an embedding lookup.

use crate::common::*;
use crate::{make, Dom, V};
use rand::Rng;
use wgrad::{Device, Tensor};

// ------------------------------------------------------------------------------------------
// index_select.

fn check_index_select(d: &Device, tag: &str, x: &Tensor, a: &Arr, dim: isize, idx: &[u32]) {
    let i = Tensor::from_u32(d, idx, &[idx.len()]).unwrap();
    let ud = if dim < 0 {
        dim + a.rank() as isize
    } else {
        dim
    } as usize;
    let want = a.index_select(ud, idx);
    poison(d, want.numel());
    let got = x.index_select(dim, &i).unwrap();
    check(
        &got,
        &want,
        0.0,
        &format!("index_select {tag} dim {dim} {idx:?}"),
    );
}

#[test]
fn index_select_dim0_repeats_and_out_of_range() {
    let d = dev();
    let a = Arr::rand(&mut rng("gather 0"), &[7, 5], -1.0, 1.0);
    check_index_select(d, "[7,5]", &a.upload(d), &a, 0, &[3, 0, 3, 6, 9, 1, 6]);
}

#[test]
fn index_select_dim1_repeats_and_out_of_range() {
    let d = dev();
    let a = Arr::rand(&mut rng("gather 1"), &[4, 6], -1.0, 1.0);
    check_index_select(
        d,
        "[4,6]",
        &a.upload(d),
        &a,
        1,
        &[5, 5, 0, 100, 2, u32::MAX],
    );
    let b = Arr::rand(&mut rng("gather -1"), &[3, 4, 5], -1.0, 1.0);
    check_index_select(d, "[3,4,5]", &b.upload(d), &b, -1, &[4, 0, 4]);
    check_index_select(d, "[3,4,5]", &b.upload(d), &b, 1, &[3, 3, 1, 0, 4]);
}

#[test]
fn index_select_from_views_and_with_index_views() {
    let d = dev();
    let mut rng = rng("gather views");
    let (x, a) = make(d, &mut rng, Dom::Sym(1.0), V::T(6, 4));
    check_index_select(d, "transposed [4,6]", &x, &a, 0, &[3, 1, 1, 7]);
    check_index_select(d, "transposed [4,6]", &x, &a, 1, &[5, 0, 2]);
    let (x, a) = make(d, &mut rng, Dom::Sym(1.0), V::N(&[9, 8], 1, 2, 5));
    check_index_select(d, "narrowed [9,5]", &x, &a, 0, &[8, 0, 4, 9]);
    // Indices at an offset (narrowed) and with a stride (a column of a 2-D u32 tensor).
    let src = Arr::rand(&mut rng, &[10, 3], -1.0, 1.0);
    let x = src.upload(d);
    let all = Tensor::from_u32(d, &[9, 9, 2, 5, 0, 7, 11, 3, 1, 4], &[10]).unwrap();
    let idx = all.narrow(0, 2, 5).unwrap(); // [2, 5, 0, 7, 11]
    poison(d, 15);
    let got = x.index_select(0, &idx).unwrap();
    check(
        &got,
        &src.index_select(0, &[2, 5, 0, 7, 11]),
        0.0,
        "narrowed indices",
    );
    let grid = Tensor::from_u32(d, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], &[4, 3]).unwrap();
    let col = grid.narrow(1, 1, 1).unwrap().squeeze(1).unwrap(); // [1, 4, 7, 10], stride 3
    assert_eq!(col.strides(), &[3]);
    poison(d, 12);
    let got = x.index_select(0, &col).unwrap();
    check(
        &got,
        &src.index_select(0, &[1, 4, 7, 10]),
        0.0,
        "strided indices",
    );
}

#[test]
fn index_select_embedding_lookup() {
    let d = dev();
    let mut rng = rng("gather embedding");
    let table = Arr::rand(&mut rng, &[1000, 33], -1.0, 1.0);
    let idx: Vec<u32> = (0..257).map(|_| rng.random_range(0..1010)).collect();
    check_index_select(d, "[1000,33]", &table.upload(d), &table, 0, &idx);
}
