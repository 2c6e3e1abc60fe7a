//! Mixed-precision matmul on the kernel the adapter picks: the tiled WGSL kernel without
//! cooperative matrices (lavapipe, CI), the cooperative-matrix kernel with them (an NVIDIA GPU
//! under Vulkan, where these tests are run by hand). f16 operands (stored as f16, or f32
//! rounded under autocast), f32 accumulation, f32 or f16 outputs, epilogues, accumulation,
//! and the backward products of an autocast forward, all against the CPU f64 reference.
//!
//! Tolerances: against the f64 product of the unrounded inputs, a relative error (norm of the
//! difference over norm of the product) under 1e-2 (the bound; the rounding of the
//! operands to f16 costs about 3e-4); against the f64 product of the operands rounded to f16,
//! 1e-5 elementwise (f32 accumulation only), which shows the kernel rounds the operands and
//! nothing else.

mod common;

use common::reference::{gelu, gelu_grad, linear};
use common::*;
use rand::rngs::StdRng;
use wgrad::kernels::matmul::{choose_tile, TILES};
use wgrad::ops::{autocast, Activation};
use wgrad::{DType, Device, Tensor};

const HALF_TOL: f64 = 1e-2;
const ROUNDED_TOL: f64 = 1e-5;

fn round_f16(a: &Arr) -> Arr {
    a.map(|x| half::f16::from_f64(x).to_f64())
}

fn upload_as(d: &Device, a: &Arr, dtype: DType) -> Tensor {
    Tensor::from_slice_as(d, &a.f32s(), &a.shape, dtype).expect("upload")
}

/// A (M, K) @ B (K, N) with operands stored as `dtype` (f32 ones under autocast), each
/// possibly a transposed view.
fn check_half(
    d: &Device,
    rng: &mut StdRng,
    (m, k, n): (usize, usize, usize),
    ta: bool,
    tb: bool,
    dtype: DType,
) {
    let a = Arr::rand(rng, &[m, k], -1.0, 1.0);
    let b = Arr::rand(rng, &[k, n], -1.0, 1.0);
    let x = if ta {
        upload_as(d, &a.t(), dtype).t().unwrap()
    } else {
        upload_as(d, &a, dtype)
    };
    let y = if tb {
        upload_as(d, &b.t(), dtype).t().unwrap()
    } else {
        upload_as(d, &b, dtype)
    };
    poison(d, m * n);
    let c = autocast(true, || x.matmul(&y)).unwrap();
    assert_eq!(c.dtype(), DType::F32);
    let what = format!("f16 matmul {m}x{k}x{n}, operands {dtype:?}, A^T {ta}, B^T {tb}");
    check_rel_norm(&c, &a.matmul(&b), HALF_TOL, &what);
    let rounded = round_f16(&a).matmul(&round_f16(&b));
    let what = format!("{what} (rounded)");
    if k <= 1024 {
        check(&c, &rounded, ROUNDED_TOL, &what);
    } else {
        // f32 accumulation over a long K: its rounding grows with K, elementwise past 1e-5
        // (1.4e-5 at K = 3000); the whole product stays far under.
        check_rel_norm(&c, &rounded, ROUNDED_TOL, &what);
    }
}

const SIZES: [(usize, usize, usize); 5] = [
    (1, 1, 1),
    (7, 5, 3),
    (65, 63, 17),
    (130, 257, 33),
    (300, 200, 100),
];

#[test]
fn f16_operands_odd_sizes_against_f64() {
    let mut rng = rng("f16 matmul");
    for s in SIZES {
        check_half(dev(), &mut rng, s, false, false, DType::F16);
    }
}

#[test]
fn f16_operands_transposed_views() {
    let mut rng = rng("f16 matmul t");
    for s in &SIZES[1..4] {
        for (ta, tb) in [(true, false), (false, true), (true, true)] {
            check_half(dev(), &mut rng, *s, ta, tb, DType::F16);
        }
    }
}

#[test]
fn f16_every_tile_size() {
    let mut rng = rng("f16 matmul tiles");
    let shapes = [
        (1030, 17, 1040),
        (520, 17, 513),
        (257, 31, 260),
        (65, 63, 17),
    ];
    for (tile, s) in TILES.iter().zip(shapes) {
        assert_eq!(
            choose_tile(s.0, s.2, 1),
            *tile,
            "shape {s:?} picks tile {tile:?}"
        );
        check_half(dev(), &mut rng, s, false, false, DType::F16);
        check_half(dev(), &mut rng, s, true, true, DType::F16);
    }
}

#[test]
fn autocast_rounds_f32_operands_to_f16() {
    let mut rng = rng("autocast matmul");
    for s in &SIZES[2..] {
        check_half(dev(), &mut rng, *s, false, false, DType::F32);
    }
    // Outside autocast the same f32 operands multiply in f32.
    let d = dev();
    let a = Arr::rand(&mut rng, &[33, 40], -1.0, 1.0);
    let b = Arr::rand(&mut rng, &[40, 21], -1.0, 1.0);
    let c = a.upload(d).matmul(&b.upload(d)).unwrap();
    check(&c, &a.matmul(&b), TOL, "f32 matmul outside autocast");
}

#[test]
fn mixed_storage_types_and_batches() {
    let d = dev();
    let mut rng = rng("f16 matmul mixed");
    let a = Arr::rand(&mut rng, &[3, 19, 45], -1.0, 1.0);
    let b = Arr::rand(&mut rng, &[45, 23], -1.0, 1.0);
    // A f32 (an activation), B f16 (a weight copy), broadcast over A's batch.
    let c = a.upload(d).matmul(&upload_as(d, &b, DType::F16)).unwrap();
    let b3 = b.reshape(&[1, 45, 23]).broadcast_to(&[3, 45, 23]);
    check(
        &c,
        &round_f16(&a).matmul(&round_f16(&b3)),
        ROUNDED_TOL,
        "f32 A @ f16 B, batched",
    );
}

/// Two autocast backward passes of x W (x uploaded as `xt`, W as `wl`, N columns) with random
/// upstream gradients, which W's gradient accumulates; returns the f64 reference for it, from
/// the f16-rounded operands.
fn backward_twice(
    d: &Device,
    rng: &mut StdRng,
    x: &Arr,
    xt: &Tensor,
    wl: &Tensor,
    n: usize,
) -> Arr {
    let rows = x.shape[0];
    let (g1, g2) = (
        Arr::rand(rng, &[rows, n], -1.0, 1.0),
        Arr::rand(rng, &[rows, n], -1.0, 1.0),
    );
    for g in [&g1, &g2] {
        let y = autocast(true, || xt.matmul(wl)).unwrap();
        y.backward_with(&g.upload(d)).unwrap();
    }
    let xr = round_f16(x).t();
    xr.matmul(&round_f16(&g1))
        .zip(&xr.matmul(&round_f16(&g2)), |a, b| a + b)
}

/// Random x (m, k), w (k, n), bias (n) and, in f64, round_f16(x) @ round_f16(w) + bias.
fn bias_product(rng: &mut StdRng, m: usize, k: usize, n: usize) -> (Arr, Arr, Arr, Arr) {
    let x = Arr::rand(rng, &[m, k], -1.0, 1.0);
    let w = Arr::rand(rng, &[k, n], -0.3, 0.3);
    let bias = Arr::rand(rng, &[n], -0.5, 0.5);
    let z = linear(&round_f16(&x), &round_f16(&w), Some(&bias));
    (x, w, bias, z)
}

#[test]
fn f16_outputs_epilogues_and_accumulation() {
    let d = dev();
    let mut rng = rng("f16 matmul epilogue");
    let (m, k, n) = (37, 70, 29);
    let (x, w, bias, z) = bias_product(&mut rng, m, k, n);
    let (xt, wt, bt) = (x.upload(d), upload_as(d, &w, DType::F16), bias.upload(d));
    for (act, want) in [
        (Activation::None, z.clone()),
        (Activation::Gelu, z.map(gelu)),
    ] {
        let y = autocast(true, || xt.linear_as(&wt, Some(&bt), act, DType::F16)).unwrap();
        assert_eq!(
            y.dtype(),
            DType::F16,
            "{act:?}: the output is stored as f16"
        );
        // The stored values are the f32 results rounded once to f16.
        check(
            &y,
            &want.map(|v| half::f16::from_f64(v).to_f64()),
            2e-3,
            &format!("f16 out, {act:?}"),
        );
    }
    // Accumulation: a second backward adds its dW = x^T g into the f32 gradient (the
    // matmul kernel's accumulate path with f16 operands).
    let wl = w.upload(d).requires_grad();
    let want = backward_twice(d, &mut rng, &x, &xt, &wl, n);
    check(
        &wl.grad().unwrap(),
        &want,
        ROUNDED_TOL,
        "two f16 dW products accumulated in f32",
    );
}

/// GELU products over whole workgroup tiles and on the edge: the outputs (f16 and f32) and the
/// input gradient, which reads the saved pre-activation back, must agree with f64.
#[test]
fn gelu_products_inside_and_on_the_edge() {
    let d = dev();
    let mut rng = rng("f16 matmul gelu direct");
    for (m, k, n) in [(150, 96, 160), (256, 64, 256), (130, 32, 130)] {
        let (x, w, bias, z) = bias_product(&mut rng, m, k, n);
        let (wt, bt) = (upload_as(d, &w, DType::F16), bias.upload(d));
        for dtype in [DType::F16, DType::F32] {
            let xl = x.upload(d).requires_grad();
            let y = autocast(true, || {
                xl.linear_as(&wt, Some(&bt), Activation::Gelu, dtype)
            })
            .unwrap();
            let want = z.map(gelu);
            let what = format!("GELU product {m}x{k}x{n} into {dtype:?}");
            match dtype {
                DType::F16 => check(
                    &y,
                    &want.map(|v| half::f16::from_f64(v).to_f64()),
                    2e-3,
                    &what,
                ),
                _ => check(&y, &want, ROUNDED_TOL, &what),
            }
            if dtype == DType::F32 {
                let g = Arr::rand(&mut rng, &[m, n], -1.0, 1.0);
                y.backward_with(&g.upload(d)).unwrap();
                let dz = g.zip(&z, |g, v| g * gelu_grad(v));
                let dx = dz.matmul(&w.map(|v| half::f16::from_f64(v).to_f64()).t());
                check(
                    &xl.grad().unwrap(),
                    &dx,
                    2e-2,
                    &format!("{what}: dx through pre"),
                );
            }
        }
    }
}

/// A bias product into f32 on cooperative matrices: the workgroup tiles wholly inside C start
/// their accumulators from the bias and store straight to C; the tiles on the edge (150 rows
/// is not a whole number of tiles) go through the scratch epilogue. Both must agree with f64.
#[test]
fn bias_products_into_f32_inside_and_on_the_edge() {
    let mut rng = rng("f16 matmul bias into f32");
    for s in [(150, 96, 160), (256, 64, 192)] {
        check_bias_product(&mut rng, s, DType::F32);
    }
}

/// x (m, k) f32 under autocast times w (k, n) f16 plus a bias, stored as `dtype`, against f64
/// (f16 outputs: the f64 result rounded once to f16).
fn check_bias_product(rng: &mut StdRng, (m, k, n): (usize, usize, usize), dtype: DType) {
    let d = dev();
    let (x, w, bias, want) = bias_product(rng, m, k, n);
    let (xt, wt, bt) = (x.upload(d), upload_as(d, &w, DType::F16), bias.upload(d));
    let y = autocast(true, || {
        xt.linear_as(&wt, Some(&bt), Activation::None, dtype)
    })
    .unwrap();
    assert_eq!(y.dtype(), dtype);
    let what = format!("bias product {m}x{k}x{n} into {dtype:?}");
    match dtype {
        DType::F16 => check(&y, &round_f16(&want), 2e-3, &what),
        _ => check(&y, &want, ROUNDED_TOL, &what),
    }
}

#[test]
fn autocast_backward_products_against_f64() {
    let d = dev();
    let mut rng = rng("f16 matmul backward");
    let (m, k, n) = (45, 66, 31);
    let a = Arr::rand(&mut rng, &[m, k], -1.0, 1.0);
    let b = Arr::rand(&mut rng, &[k, n], -1.0, 1.0);
    let g = Arr::rand(&mut rng, &[m, n], -1.0, 1.0);
    let x = a.upload(d).requires_grad();
    let y = b.upload(d).requires_grad();
    let c = autocast(true, || x.matmul(&y)).unwrap();
    // Backward outside the autocast scope: the rule remembers its forward's precision.
    c.backward_with(&g.upload(d)).unwrap();
    let (ga, gb) = (x.grad().unwrap(), y.grad().unwrap());
    check(&ga, &g.matmul(&b.t()), HALF_TOL, "dA = g B^T");
    check(&gb, &a.t().matmul(&g), HALF_TOL, "dB = A^T g");
    check(
        &ga,
        &round_f16(&g).matmul(&round_f16(&b).t()),
        ROUNDED_TOL,
        "dA in f16 (rounded)",
    );
    check(
        &gb,
        &round_f16(&a).t().matmul(&round_f16(&g)),
        ROUNDED_TOL,
        "dB in f16 (rounded)",
    );
}

#[test]
fn casts_round_trip_and_pass_gradients_through() {
    let d = dev();
    let mut rng = rng("cast");
    let a = Arr::rand(&mut rng, &[5, 13], -4.0, 4.0);
    let x = a.upload(d).requires_grad();
    let h = x.to_dtype(DType::F16).unwrap();
    assert_eq!(h.dtype(), DType::F16);
    check(&h, &round_f16(&a), 0.0, "f32 -> f16");
    let back = h.to_dtype(DType::F32).unwrap();
    check(&back, &round_f16(&a), 0.0, "f16 -> f32");
    let g = Arr::rand(&mut rng, &[5, 13], -1.0, 1.0);
    back.backward_with(&g.upload(d)).unwrap();
    check(
        &x.grad().unwrap(),
        &g,
        0.0,
        "the gradient passes through both casts",
    );
}

/// Operands laid out every way the mixed-precision kernels read them: unit-stride along K or
/// along M/N (transposed views), rows whose length is a multiple of 8, of 4 only (a partial
/// last unit), or neither (units gathered element by element), views at an aligned and at an
/// unaligned offset, f16 and f32 storage; several tiles in each dim. (On adapters with
/// cooperative matrices these are the vector and gathered unit paths of that kernel.)
#[test]
fn f16_operand_layouts_and_offsets() {
    let d = dev();
    let mut rng = rng("f16 matmul layouts");
    // The last shape splits K (few outputs over a long K).
    for s in [
        (40, 64, 48),
        (36, 44, 52),
        (130, 96, 72),
        (257, 136, 264),
        (40, 3000, 36),
    ] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for dtype in [DType::F16, DType::F32] {
                check_half(d, &mut rng, s, ta, tb, dtype);
            }
        }
    }
    // Views into larger tensors: rows 1.. (offset and row stride K = 48: vector units),
    // columns 4.. of rows of 52 (offset 4, stride 52: vector units, stride past K), columns 1..
    // (offset 1: gathered units).
    let (m, k, n) = (67, 48, 40);
    let tall = Arr::rand(&mut rng, &[m + 1, k], -1.0, 1.0);
    let wide = Arr::rand(&mut rng, &[m, k + 4], -1.0, 1.0);
    let b = Arr::rand(&mut rng, &[k, n], -1.0, 1.0);
    let y = upload_as(d, &b, DType::F16);
    for dtype in [DType::F16, DType::F32] {
        let (t, w) = (upload_as(d, &tall, dtype), upload_as(d, &wide, dtype));
        for (what, view, want) in [
            ("rows 1..", t.narrow(0, 1, m).unwrap(), tall.narrow(0, 1, m)),
            (
                "columns 4..",
                w.narrow(1, 4, k).unwrap(),
                wide.narrow(1, 4, k),
            ),
            (
                "columns 1..",
                w.narrow(1, 1, k).unwrap(),
                wide.narrow(1, 1, k),
            ),
        ] {
            poison(d, m * n);
            let c = autocast(true, || view.matmul(&y)).unwrap();
            check(
                &c,
                &round_f16(&want).matmul(&round_f16(&b)),
                ROUNDED_TOL,
                &format!("A = {what} of a {dtype:?} tensor"),
            );
        }
    }
}

/// Tiles inside C read each step of K that lies whole in their range without bounds or masks
/// (the cooperative-matrix kernel's loop over `fetch_whole`); a ragged last step, tiles on C's
/// edge and split ranges of K keep the bounded loads. Products with all of these on the
/// heuristic's tiles (every searched tile: the next test), A and B in both layouts, f16 and
/// autocast f32 operands, against f64 on the rounded operands; and f32 products.
#[test]
fn f16_tiles_inside_c_whole_steps_ragged_k_and_splits() {
    let mut rng = rng("f16 matmul inside c");
    for s in [
        (256, 200, 256),
        (256, 256, 384),
        (384, 72, 136),
        (128, 20, 256),
        (128, 4100, 128),
    ] {
        for (ta, tb) in [(false, false), (true, true)] {
            check_half(dev(), &mut rng, s, ta, tb, DType::F16);
        }
        check_half(dev(), &mut rng, s, false, true, DType::F32);
        // f32 without autocast: on cooperative matrices these are X3 products (the loop that
        // fetches a step ahead), against f64 on the unrounded operands.
        let (m, k, n) = s;
        let a = Arr::rand(&mut rng, &[m, k], -1.0, 1.0);
        let b = Arr::rand(&mut rng, &[k, n], -1.0, 1.0);
        let c = a.upload(dev()).matmul(&b.upload(dev())).unwrap();
        check_rel_norm(
            &c,
            &a.matmul(&b),
            ROUNDED_TOL,
            &format!("f32 matmul {m}x{k}x{n}"),
        );
    }
}

/// Products with tiles inside C, a ragged last step of K and tiles on both of C's edges on every
/// cooperative-matrix tile a search may choose (one and two stages, BK 32 and 64), whole and in
/// 2 ranges of K, set in the device's tile table; without cooperative matrices, the heuristic's
/// tile alone (the tiled kernel's tiles are checked in tests/ops/tuning.rs).
#[test]
fn f16_whole_steps_on_every_cooperative_tile() {
    let d = dev();
    let mut rng = rng("f16 matmul every coop tile");
    let tiles = coop_search_tiles(d, false);
    for (m, k, n) in [(264, 232, 272), (520, 72, 136)] {
        let a = Arr::rand(&mut rng, &[m, k], -1.0, 1.0);
        let b = Arr::rand(&mut rng, &[k, n], -1.0, 1.0);
        let (x, y) = (upload_as(d, &a, DType::F16), upload_as(d, &b, DType::F16));
        let want = round_f16(&a).matmul(&round_f16(&b));
        d.log_products(true);
        let c = autocast(true, || x.matmul(&y)).unwrap();
        let keys = d.take_product_log();
        d.log_products(false);
        check(
            &c,
            &want,
            ROUNDED_TOL,
            &format!("{m}x{k}x{n}, the heuristic's tile"),
        );
        for &t in &tiles {
            for split in [None, Some(2)] {
                for key in &keys {
                    d.set_tile(*key, t, split, 1.0);
                }
                poison(d, m * n);
                let c = autocast(true, || x.matmul(&y)).unwrap();
                check(
                    &c,
                    &want,
                    ROUNDED_TOL,
                    &format!("{m}x{k}x{n}, tile {t:?} split {split:?}"),
                );
            }
        }
    }
}

/// Gradients large enough for whole tiles (which the cooperative-matrix kernel starts from the
/// gradient and stores straight back), accumulated twice; and a product written whole.
#[test]
fn f16_products_over_whole_tiles_write_and_accumulate() {
    let d = dev();
    let mut rng = rng("f16 matmul whole tiles");
    let (t, m, n) = (300, 136, 264);
    let x = Arr::rand(&mut rng, &[t, m], -1.0, 1.0);
    let w = Arr::rand(&mut rng, &[m, n], -1.0, 1.0);
    let wl = w.upload(d).requires_grad();
    let xt = x.upload(d);
    let want = backward_twice(d, &mut rng, &x, &xt, &wl, n);
    // Two sums of 300 products each: f32 rounding reaches 1.2e-5 elementwise; compared whole.
    check_rel_norm(
        &wl.grad().unwrap(),
        &want,
        ROUNDED_TOL,
        "two dW = x^T g over whole tiles, accumulated",
    );
    poison(d, t * n);
    let y = autocast(true, || xt.matmul(&wl)).unwrap();
    check_rel_norm(
        &y,
        &round_f16(&x).matmul(&round_f16(&w)),
        ROUNDED_TOL,
        "x W over whole tiles",
    );
}

/// Products into rows padded to 64 elements (as the LM head's logits are), N not a multiple of
/// 4, and bias products into f16 with N a multiple of 4: where C's rows start on vectors of 4,
/// the cooperative-matrix kernel binds C as vectors and its epilogue stores 4 columns a lane at
/// once, the row's last, partial vector element by element (f32 plain products store their
/// tiles inside C straight from the accumulators instead, the tiles on C's edge through the
/// scratch). f16 and f32 outputs against f64.
#[test]
fn products_stored_in_vectors_of_four_and_their_ragged_ends() {
    let d = dev();
    let mut rng = rng("f16 matmul vector stores");
    for (m, k, n) in [(150, 96, 130), (64, 40, 61), (33, 24, 7)] {
        let x = Arr::rand(&mut rng, &[m, k], -1.0, 1.0);
        let w = Arr::rand(&mut rng, &[k, n], -1.0, 1.0);
        let want = round_f16(&x).matmul(&round_f16(&w));
        let (xt, wt) = (upload_as(d, &x, DType::F16), upload_as(d, &w, DType::F16));
        for dtype in [DType::F16, DType::F32] {
            let y = autocast(true, || xt.linear_padded_as(&wt, 64, dtype)).unwrap();
            assert_eq!(y.strides(), &[n.next_multiple_of(64), 1]);
            let what = format!("{m}x{k}x{n} into rows of {} {dtype:?}", y.strides()[0]);
            match dtype {
                // f16 rows padded are read back through a product with the identity (a copy
                // takes only f32 views), exact: one term of each sum is not zero.
                DType::F16 => {
                    let eye = Arr::build(&[n, n], |i| (i[0] == i[1]) as u8 as f64);
                    let y = autocast(true, || y.matmul(&upload_as(d, &eye, DType::F16))).unwrap();
                    check(&y, &round_f16(&want), 2e-3, &what)
                }
                _ => check(&y, &want, ROUNDED_TOL, &what),
            }
        }
    }
    for s in [(150, 96, 160), (256, 64, 192), (40, 32, 12)] {
        check_bias_product(&mut rng, s, DType::F16);
    }
}
