//! Matmul against f64: odd sizes, transposed operands, every tile, long inner dims split into
//! ranges of K, batches and broadcast batches, views, K = 0, broadcast rows and columns, and
//! f32 precision at any magnitude.

use crate::common::reference::linear;
use crate::common::*;
use rand::rngs::StdRng;
use wgrad::kernels::matmul::{choose_tile, TILES};
use wgrad::{Device, Tensor};

// ------------------------------------------------------------------------------------------
// Matmul.

/// A (M, K) @ B (K, N) with A and/or B given as transposed views of stored transposes.
fn check_matmul(
    d: &Device,
    rng: &mut StdRng,
    (m, k, n): (usize, usize, usize),
    ta: bool,
    tb: bool,
) {
    let (x, a) = if ta {
        let at = Arr::rand(rng, &[k, m], -1.0, 1.0);
        (at.upload(d).t().unwrap(), at.t())
    } else {
        let a = Arr::rand(rng, &[m, k], -1.0, 1.0);
        (a.upload(d), a)
    };
    let (y, b) = if tb {
        let bt = Arr::rand(rng, &[n, k], -1.0, 1.0);
        (bt.upload(d).t().unwrap(), bt.t())
    } else {
        let b = Arr::rand(rng, &[k, n], -1.0, 1.0);
        (b.upload(d), b)
    };
    poison(d, m * n);
    let c = x.matmul(&y).unwrap();
    check(
        &c,
        &a.matmul(&b),
        TOL,
        &format!("matmul {m}x{k}x{n} (MxKxN), A transposed {ta}, B transposed {tb}"),
    );
}

/// The worst per-row relative error of C (`||c_r - want_r|| / ||want_r||`), every element
/// finite.
fn worst_row_error(c: &Tensor, want: &Arr) -> f64 {
    let got = c.to_vec().unwrap();
    assert!(got.iter().all(|g| g.is_finite()), "a non-finite element");
    let n = want.shape[1];
    got.chunks(n)
        .zip(want.data.chunks(n))
        .map(|(g, w)| {
            let diff: f64 = g.iter().zip(w).map(|(&g, w)| (g as f64 - w).powi(2)).sum();
            let norm: f64 = w.iter().map(|w| w * w).sum();
            (diff / norm).sqrt()
        })
        .fold(0.0, f64::max)
}

/// f32 products keep f32's precision at any magnitude: operands of 2^-60 to 2^30, A's rows
/// alternating between its largest magnitude and 2^-12 of it, B stored or transposed, K up to
/// 3000 (split into ranges), the bias epilogue. Each row of C within 2e-5 of f64 (f32's
/// rounding over K = 3000 reaches about 3e-6; one f16 product about 3e-4). On an adapter
/// with cooperative matrices these are X3 products (three f16 products of each operand's
/// scaled high and low parts), which must stay as close (`WGRAD_F32_MATMUL=tiled` runs the
/// tiled kernel instead); the errors are printed (`--nocapture`) to compare the two.
#[test]
fn f32_products_keep_f32_precision_at_any_magnitude() {
    let d = dev();
    let mut rng = rng("f32 precision");
    for (m, k, n, sa, sb, tb) in [
        (130, 257, 70, -40, 30, false),
        (64, 1024, 96, 20, -60, true),
        (33, 3000, 17, 0, 0, false),
        (256, 768, 256, -10, -5, true),
    ] {
        let a = Arr::rand(&mut rng, &[m, k], -1.0, 1.0);
        let a = Arr::build(&[m, k], |i| {
            a.at(i) * 2f64.powi(sa - 12 * (i[0] % 2) as i32)
        });
        let b = Arr::rand(&mut rng, &[k, n], -1.0, 1.0).map(|x| x * 2f64.powi(sb));
        let bias = Arr::rand(&mut rng, &[n], -1.0, 1.0).map(|x| x * 2f64.powi(sa + sb));
        let x = a.upload(d);
        let y = if tb {
            b.t().upload(d).t().unwrap()
        } else {
            b.upload(d)
        };
        let what = format!("f32 product {m}x{k}x{n}, A 2^{sa}, B 2^{sb}, B transposed {tb}");
        let plain = worst_row_error(&x.matmul(&y).unwrap(), &a.matmul(&b));
        let want = linear(&a, &b, Some(&bias));
        let biased = worst_row_error(
            &x.linear(&y, Some(&bias.upload(d)), wgrad::ops::Activation::None)
                .unwrap(),
            &want,
        );
        println!("{what}: worst row error {plain:.3e}, with the bias {biased:.3e}");
        assert!(plain < 2e-5, "{what}: worst row error {plain:.3e}");
        assert!(biased < 2e-5, "{what} + bias: worst row error {biased:.3e}");
    }
}

const MATMUL_SIZES: [(usize, usize, usize); 5] = [
    (1, 1, 1),
    (7, 5, 3),
    (65, 63, 17),
    (130, 257, 33),
    (300, 200, 100),
];

#[test]
fn matmul_odd_sizes() {
    let mut rng = rng("matmul");
    for s in MATMUL_SIZES {
        check_matmul(dev(), &mut rng, s, false, false);
    }
}

#[test]
fn matmul_transposed_operands() {
    let mut rng = rng("matmul t");
    for s in &MATMUL_SIZES[1..4] {
        for (ta, tb) in [(true, false), (false, true), (true, true)] {
            check_matmul(dev(), &mut rng, *s, ta, tb);
        }
    }
}

#[test]
fn matmul_every_tile_size() {
    let mut rng = rng("matmul tiles");
    // Shapes for which choose_tile picks each tile, so each kernel variant runs at odd sizes.
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
        check_matmul(dev(), &mut rng, s, false, false);
        check_matmul(dev(), &mut rng, s, true, true);
    }
}

#[test]
fn matmul_every_tile_size_batched() {
    let d = dev();
    let mut rng = rng("matmul tiles batched");
    // (batch, m, k, n): batches large enough for each tile; B broadcast over the batch.
    let shapes = [
        (16, 130, 19, 200),
        (16, 70, 19, 66),
        (8, 40, 23, 97),
        (3, 13, 9, 11),
    ];
    for (tile, (bt, m, k, n)) in TILES.iter().zip(shapes) {
        assert_eq!(
            choose_tile(m, n, bt),
            *tile,
            "batch {bt} of {m}x{n} picks {tile:?}"
        );
        let a = Arr::rand(&mut rng, &[bt, m, k], -1.0, 1.0);
        let b = Arr::rand(&mut rng, &[k, n], -1.0, 1.0);
        let want = a.matmul(&b);
        poison(d, want.numel());
        let c = a.upload(d).matmul(&b.upload(d)).unwrap();
        check(
            &c,
            &want,
            TOL,
            &format!("matmul [{bt}, {m}, {k}] @ [{k}, {n}]"),
        );
    }
}

#[test]
fn matmul_long_inner_dim() {
    let mut rng = rng("matmul long k");
    check_matmul(dev(), &mut rng, (3, 5003, 2), false, false);
    check_matmul(dev(), &mut rng, (3, 5003, 2), true, true);
}

/// Few outputs over a long K run as ranges of K in workgroups of their own, summed by a second
/// kernel (`matmul::split_k`): written, added into an existing gradient, and through views.
#[test]
fn matmul_split_k_writes_accumulates_and_reaches_views() {
    use wgrad::kernels::matmul::split_k;
    let d = dev();
    let mut rng = rng("matmul split k");
    let (m, k, n) = (37, 3001, 29);
    let target = wgrad::kernels::matmul::SPLIT_TARGET_GROUPS;
    assert!(split_k(4, k, target) > 1, "the shape splits K");
    check_matmul(d, &mut rng, (m, k, n), false, false);
    check_matmul(d, &mut rng, (m, k, n), true, false);
    // dW = x^T g over K = 3001 rows, twice: the second adds into the first.
    let x = Arr::rand(&mut rng, &[k, m], -1.0, 1.0);
    let w = Arr::rand(&mut rng, &[m, n], -1.0, 1.0);
    let (g1, g2) = (
        Arr::rand(&mut rng, &[k, n], -1.0, 1.0),
        Arr::rand(&mut rng, &[k, n], -1.0, 1.0),
    );
    let wl = w.upload(d).requires_grad();
    let xt = x.upload(d);
    for g in [&g1, &g2] {
        xt.matmul(&wl).unwrap().backward_with(&g.upload(d)).unwrap();
    }
    let want = x.t().matmul(&g1).zip(&x.t().matmul(&g2), |a, b| a + b);
    check(
        &wl.grad().unwrap(),
        &want,
        TOL,
        "two split-K dW accumulated",
    );
}

/// The numbers of K ranges a tile search tries (and a table may hold): every one, and one
/// larger than K has steps, gives the product, written and accumulated.
#[test]
fn matmul_every_measured_split_of_k() {
    use wgrad::tune::SPLITS;
    let d = private_dev();
    let mut rng = rng("matmul measured splits");
    let (m, k, n) = (37, 3001, 29);
    for split in SPLITS.into_iter().chain([100_000]) {
        d.force_split(Some(split));
        check_matmul(&d, &mut rng, (m, k, n), false, false);
        check_matmul(&d, &mut rng, (m, k, n), true, true);
        let x = Arr::rand(&mut rng, &[k, m], -1.0, 1.0);
        let w = Arr::rand(&mut rng, &[m, n], -1.0, 1.0);
        let (g1, g2) = (
            Arr::rand(&mut rng, &[k, n], -1.0, 1.0),
            Arr::rand(&mut rng, &[k, n], -1.0, 1.0),
        );
        let wl = w.upload(&d).requires_grad();
        let xt = x.upload(&d);
        for g in [&g1, &g2] {
            xt.matmul(&wl)
                .unwrap()
                .backward_with(&g.upload(&d))
                .unwrap();
        }
        let want = x.t().matmul(&g1).zip(&x.t().matmul(&g2), |a, b| a + b);
        check(
            &wl.grad().unwrap(),
            &want,
            TOL,
            &format!("dW accumulated, K in {split} ranges"),
        );
    }
    d.force_split(None);
}

#[test]
fn matmul_batched_and_broadcast_batches() {
    let d = dev();
    let mut rng = rng("matmul batched");
    let (m, k, n) = (13, 9, 11);
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, m, k], &[3, k, n]),
        (&[2, 3, m, k], &[3, k, n]),
        (&[m, k], &[4, k, n]),
        (&[4, m, k], &[k, n]),
        (&[2, 1, m, k], &[1, 3, k, n]),
        (&[1, 3, m, k], &[3, k, n]),
    ];
    for &(sa, sb) in cases {
        let a = Arr::rand(&mut rng, sa, -1.0, 1.0);
        let b = Arr::rand(&mut rng, sb, -1.0, 1.0);
        let want = a.matmul(&b);
        poison(d, want.numel());
        let c = a.upload(d).matmul(&b.upload(d)).unwrap();
        check(&c, &want, TOL, &format!("matmul {sa:?} @ {sb:?}"));
    }
}

#[test]
fn matmul_batched_views() {
    let d = dev();
    let mut rng = rng("matmul batched views");
    let (m, k, n) = (17, 33, 65);
    // B transposed per batch: [3, n, k] -> [3, k, n].
    let a = Arr::rand(&mut rng, &[3, m, k], -1.0, 1.0);
    let bt = Arr::rand(&mut rng, &[3, n, k], -1.0, 1.0);
    poison(d, 3 * m * n);
    let c = a.upload(d).matmul(&bt.upload(d).t().unwrap()).unwrap();
    check(&c, &a.matmul(&bt.t()), TOL, "matmul [3,m,k] @ [3,n,k].t()");
    // A with the batch in the middle: [m, 3, k] permuted to [3, m, k] (batch stride k).
    let am = Arr::rand(&mut rng, &[m, 3, k], -1.0, 1.0);
    let b = Arr::rand(&mut rng, &[3, k, n], -1.0, 1.0);
    poison(d, 3 * m * n);
    let x = am.upload(d).permute(&[1, 0, 2]).unwrap();
    let c = x.matmul(&b.upload(d)).unwrap();
    check(
        &c,
        &am.permute(&[1, 0, 2]).matmul(&b),
        TOL,
        "matmul [m,3,k].permute(1,0,2) @ [3,k,n]",
    );
    // Narrowed operands (offsets, row strides wider than the row).
    let abig = Arr::rand(&mut rng, &[70, 40], -1.0, 1.0);
    let bbig = Arr::rand(&mut rng, &[40, 30], -1.0, 1.0);
    let x = abig
        .upload(d)
        .narrow(0, 3, 65)
        .unwrap()
        .narrow(1, 5, 33)
        .unwrap();
    let y = bbig
        .upload(d)
        .narrow(0, 2, 33)
        .unwrap()
        .narrow(1, 1, 27)
        .unwrap();
    poison(d, 65 * 27);
    let c = x.matmul(&y).unwrap();
    let want = abig
        .narrow(0, 3, 65)
        .narrow(1, 5, 33)
        .matmul(&bbig.narrow(0, 2, 33).narrow(1, 1, 27));
    check(&c, &want, TOL, "matmul of narrowed views");
}

#[test]
fn matmul_with_k_zero_gives_zeros() {
    let d = dev();
    let a = Tensor::from_slice(d, &[], &[5, 0]).unwrap();
    let b = Tensor::from_slice(d, &[], &[0, 7]).unwrap();
    poison(d, 35);
    check(
        &a.matmul(&b).unwrap(),
        &Arr::full(&[5, 7], 0.0),
        0.0,
        "[5,0] @ [0,7]",
    );
    let a = Tensor::from_slice(d, &[], &[2, 5, 0]).unwrap();
    poison(d, 70);
    check(
        &a.matmul(&b).unwrap(),
        &Arr::full(&[2, 5, 7], 0.0),
        0.0,
        "[2,5,0] @ [0,7]",
    );
}

// ------------------------------------------------------------------------------------------
// Broadcast operands.

#[test]
fn matmul_with_broadcast_rows_and_columns() {
    let d = dev();
    let mut rng = rng("matmul stride 0");
    // A's rows all the same (m stride 0); B's columns all the same (n stride 0).
    let arow = Arr::rand(&mut rng, &[1, 21], -1.0, 1.0);
    let bcol = Arr::rand(&mut rng, &[21, 1], -1.0, 1.0);
    let x = arow.upload(d).broadcast_to(&[19, 21]).unwrap();
    let y = bcol.upload(d).broadcast_to(&[21, 23]).unwrap();
    poison(d, 19 * 23);
    let want = arow
        .broadcast_to(&[19, 21])
        .matmul(&bcol.broadcast_to(&[21, 23]));
    check(&x.matmul(&y).unwrap(), &want, TOL, "broadcast operands");
}
