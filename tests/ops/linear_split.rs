//! A linear's products split into ranges of K (forced, as a tile search times them) against
//! f64: the bias, residual and bias-gradient epilogues the split sum serves, in a second
//! dispatch or in the product's own, written and added into, in f32 and under autocast; and
//! dX encoded beside dW's split product.

use crate::common::reference::linear;
use crate::common::{assert_close, poison, rand_vec, rng, split_sum_dev, Arr};
use crate::linear::{absmax_dispatches, grads, halves, round};
use wgrad::ops::Activation;
use wgrad::{Result, Tensor};

/// A bias product split into ranges of K (forced, as a tile search times it): the ranges write
/// partial products without the bias and the split sum adds it (broadcast over rows) as it
/// writes an f32 or f16 output; in f32 (the tiled kernel) and under autocast (cooperative
/// matrices where the adapter has them, else the tiled kernel's f16 tiles: against operands
/// rounded to f16); against an f64 reference at odd shapes (one row, K past the last whole
/// range, N not a multiple of 4, and one that is), the bias a view at an offset. The bias
/// gradient is the seed's column sums as ever, and a GELU product does not split. The sum in
/// a second dispatch (`split_sum_dev`), counted; in the product's own dispatch:
/// `a_split_product_sums_its_ranges_in_its_own_dispatch`.
#[test]
fn a_bias_product_split_into_ranges_of_k_matches_f64() -> Result<()> {
    use wgrad::ops::autocast;
    use wgrad::DType;
    let d = &split_sum_dev();
    let mut r = rng("linear split k");
    let f16 = d.gpu().has(wgrad::wgpu::Features::SHADER_F16);
    let modes: &[(bool, DType)] = if f16 {
        &[
            (false, DType::F32),
            (false, DType::F16),
            (true, DType::F32),
            (true, DType::F16),
        ]
    } else {
        &[(false, DType::F32)]
    };
    let round =
        |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect() };
    for (rows, k, n) in [(1, 1001, 29), (37, 3001, 30), (6, 700, 3), (33, 1280, 64)] {
        let xs = rand_vec(&mut r, rows * k, -1.0, 1.0);
        let ws = rand_vec(&mut r, k * n, -0.5, 0.5);
        let bs = rand_vec(&mut r, n + 3, -0.5, 0.5);
        let seed = rand_vec(&mut r, rows * n, -1.0, 1.0);
        // y = x W + b, b = bs[3..]
        let bias = Arr::from_f32(&[n], &bs[3..]);
        let reference = |xs: &[f32], ws: &[f32]| {
            let (x, w) = (Arr::from_f32(&[rows, k], xs), Arr::from_f32(&[k, n], ws));
            linear(&x, &w, Some(&bias)).data
        };
        let want = reference(&xs, &ws);
        let want_half = reference(&round(&xs), &round(&ws));
        // db: the seed's column sums, 3 elements into the bias's buffer.
        let want_db = [
            vec![0.0; 3],
            Arr::from_f32(&[rows, n], &seed).sum(0, false).data,
        ]
        .concat();
        let x = Tensor::from_slice(d, &xs, &[rows, k])?;
        let w = Tensor::from_slice(d, &ws, &[k, n])?;
        for split in [2, 3, 5, 12] {
            d.force_split(Some(split));
            for &(half, dtype) in modes {
                let b_base = Tensor::from_slice(d, &bs, &[n + 3])?.requires_grad();
                let b = b_base.narrow(0, 3, n)?;
                poison(d, rows * n);
                d.sync()?;
                let before = d.counters().dispatches;
                let y = autocast(half, || x.linear_as(&w, Some(&b), Activation::None, dtype))?;
                d.sync()?;
                let what = format!(
                    "{rows}x{k}x{n} in {split} ranges of K, {dtype:?} out{}",
                    if half { ", autocast" } else { "" }
                );
                assert_eq!(
                    d.counters().dispatches - before,
                    2 + absmax_dispatches(d, half),
                    "{what}: the partial products and their sum"
                );
                let tol = if dtype == DType::F16 { 1e-3 } else { 1e-4 };
                let want = if half { &want_half } else { &want };
                assert_close(&y.to_vec()?, want, tol, &what);
                if dtype == DType::F32 {
                    y.backward_with(&Tensor::from_slice(d, &seed, &[rows, n])?)?;
                    let db = b_base.grad().expect("reached by backward").to_vec()?;
                    assert_close(&db, &want_db, 1e-5, &format!("db, {what}"));
                }
            }
        }
        let b = Tensor::from_slice(d, &bs[3..], &[n])?;
        d.sync()?;
        let before = d.counters().dispatches;
        x.linear(&w, Some(&b), Activation::Gelu)?;
        d.sync()?;
        assert_eq!(
            d.counters().dispatches - before,
            1 + absmax_dispatches(d, false),
            "{rows}x{k}x{n}: a GELU product is one dispatch, forced split or not"
        );
    }
    d.force_split(None);
    Ok(())
}

/// A linear's bias gradient comes out of its dW product (x^T extended by a row of ones): dW and
/// db match f64 sums, unsplit and in ranges of K (the split sum stores the row), written and
/// then added into (a second backward), in f32 and under autocast; an input width that is not
/// a multiple of 8 (which the cooperative-matrix kernel cannot extend), or over 1,024 rows in
/// f32, sums dz by a reduction. Split sums in a second dispatch (`split_sum_dev`), counted.
#[test]
fn a_bias_gradient_from_the_dw_product_matches_f64() -> Result<()> {
    use wgrad::ops::autocast;
    let d = &split_sum_dev();
    let mut r = rng("linear db in dW");
    let halves = halves(d);
    // A width the cooperative-matrix kernel cannot extend, or more than 1,024 rows in f32
    // (where the extra tile row cost more than a reduction), sums dz (f32) by a reduction.
    let coop = wgrad::kernels::matmul_coop::Coop::available(d.gpu()).is_some();
    for (rows, k, n) in [(300, 24, 40), (257, 8, 3), (64, 13, 20), (1100, 16, 12)] {
        let xs = rand_vec(&mut r, rows * k, -1.0, 1.0);
        let ws = rand_vec(&mut r, k * n, -0.5, 0.5);
        let gs = rand_vec(&mut r, rows * n, -1.0, 1.0);
        for &half in halves {
            let fold = (half || rows <= 1024) && !(coop && k % 8 != 0);
            let x64 = Arr::new(&[rows, k], round(&xs, half));
            let g64 = Arr::new(&[rows, n], round(&gs, half));
            let reduced = Arr::new(&[rows, n], round(&gs, half && fold));
            let want_dw = x64.t().matmul(&g64).data;
            let want_db = reduced.sum(0, false).data;
            for split in [None, Some(2), Some(5)] {
                d.force_split(split);
                let x = Tensor::from_slice(d, &xs, &[rows, k])?;
                let w = Tensor::from_slice(d, &ws, &[k, n])?.requires_grad();
                let b = Tensor::zeros(d, &[n])?.requires_grad();
                let g = Tensor::from_slice(d, &gs, &[rows, n])?;
                let what = format!(
                    "{rows}x{k}x{n}, split {split:?}{}",
                    if half { ", autocast" } else { "" }
                );
                for pass in 1..=2 {
                    let y = autocast(half, || x.linear(&w, Some(&b), Activation::None))?;
                    d.sync()?;
                    let c0 = d.counters();
                    y.backward_with(&g)?;
                    d.sync()?;
                    if pass == 1 && fold && rows <= 1024 {
                        // The product with db (and the split sum), nothing else: x needs no
                        // gradient. (Over 1,024 rows the launcher's own rule may split K.)
                        let c = d.counters() - c0;
                        let want = if split.is_some() { 2 } else { 1 };
                        let want = want + absmax_dispatches(d, half);
                        assert_eq!(c.backward_dispatches, want, "{what}: {c:?}");
                    }
                    let scale = pass as f64;
                    let tol = if half { 2e-3 } else { 1e-4 };
                    let dw: Vec<f64> = want_dw.iter().map(|v| v * scale).collect();
                    let db: Vec<f64> = want_db.iter().map(|v| v * scale).collect();
                    let got = grads(&[w.clone(), b.clone()])?;
                    assert_close(&got[0], &dw, tol, &format!("dW, {what}, pass {pass}"));
                    assert_close(&got[1], &db, tol, &format!("db, {what}, pass {pass}"));
                }
            }
            d.force_split(None);
        }
    }
    Ok(())
}

/// residual + (x W + b) with the add in the product's epilogue (one dispatch; two split into
/// ranges of K, the split sum adding bias and residual; two where the cooperative-matrix
/// kernel stores its tiles straight to C), in f32 and under autocast, against
/// f64 at odd shapes with leading dims and the residual a view at an offset; its gradients:
/// the residual's is the seed itself, x's, W's and b's those of the linear. A residual that
/// is not a contiguous f32 tensor of the output's shape is added by a second dispatch. Split
/// sums in a second dispatch (`split_sum_dev`), counted.
#[test]
fn a_residual_linear_matches_f64() -> Result<()> {
    use wgrad::ops::autocast;
    let d = &split_sum_dev();
    let mut r = rng("linear residual");
    let coop = wgrad::kernels::matmul_coop::Coop::available(d.gpu()).is_some();
    let halves = halves(d);
    // The residual sits after `pad` elements of another tensor in its buffer (8: on a vector,
    // so the split sum reads it in vectors of 4).
    for (lead, rows, k, n, pad) in [
        (vec![], 1, 37, 29, 5),
        (vec![2], 65, 96, 40, 5),
        (vec![3], 43, 768, 64, 8),
    ] {
        let all = lead.iter().product::<usize>() * rows;
        let mut x_shape = lead.clone();
        x_shape.extend([rows, k]);
        let mut y_shape = lead.clone();
        y_shape.extend([rows, n]);
        let xs = rand_vec(&mut r, all * k, -1.0, 1.0);
        let ws = rand_vec(&mut r, k * n, -0.5, 0.5);
        let bs = rand_vec(&mut r, n, -0.5, 0.5);
        let rs = rand_vec(&mut r, pad + all * n, -2.0, 2.0);
        let gs = rand_vec(&mut r, all * n, -1.0, 1.0);
        for &half in halves {
            let x64 = Arr::new(&[all, k], round(&xs, half));
            let w64 = Arr::new(&[k, n], round(&ws, half));
            let g64 = Arr::from_f32(&[all, n], &gs);
            let resid = Arr::from_f32(&[all, n], &rs[pad..]);
            let want_y = linear(&x64, &w64, Some(&Arr::from_f32(&[n], &bs)))
                .zip(&resid, |p, q| p + q)
                .data;
            // Under autocast the backward products round the seed to f16 as well.
            let gh = Arr::new(&[all, n], round(&gs, half));
            let want_dx = gh.matmul(&w64.t()).data;
            let want_dw = x64.t().matmul(&gh).data;
            let want_db = g64.sum(0, false).data;
            for split in [1, 3] {
                d.force_split(Some(split));
                let what = format!(
                    "{y_shape:?} from K = {k} in {split} ranges{}",
                    if half { ", autocast" } else { "" }
                );
                let x = Tensor::from_slice(d, &xs, &x_shape)?.requires_grad();
                let w = Tensor::from_slice(d, &ws, &[k, n])?.requires_grad();
                let b = Tensor::from_slice(d, &bs, &[n])?.requires_grad();
                let base = Tensor::from_slice(d, &rs, &[pad + all * n])?.requires_grad();
                let res = base.narrow(0, pad, all * n)?.reshape(&y_shape)?;
                poison(d, all * n);
                d.sync()?;
                let before = d.counters().dispatches;
                let y = autocast(half, || x.linear_residual(&w, &b, &res))?;
                d.sync()?;
                // Unsplit into tiles the cooperative-matrix kernel could store straight from its
                // accumulators (f32 rows on 16 bytes), the residual is a second dispatch.
                let direct = half && coop && n % 4 == 0;
                let want = if split > 1 || direct { 2 } else { 1 };
                let want = want + absmax_dispatches(d, half);
                assert_eq!(d.counters().dispatches - before, want, "{what}");
                assert_eq!(y.shape(), y_shape.as_slice(), "{what}");
                let tol = if half { 2e-3 } else { 1e-4 };
                assert_close(&y.to_vec()?, &want_y, tol, &format!("y, {what}"));
                y.backward_with(&Tensor::from_slice(d, &gs, &y_shape)?)?;
                let got = grads(&[x, w, b, base])?;
                assert_close(&got[0], &want_dx, tol, &format!("dx, {what}"));
                assert_close(&got[1], &want_dw, tol, &format!("dW, {what}"));
                assert_close(&got[2], &want_db, tol, &format!("db, {what}"));
                assert!(
                    got[3][..pad].iter().all(|&v| v == 0.0),
                    "{what}: before the residual"
                );
                assert_eq!(
                    &got[3][pad..],
                    gs.as_slice(),
                    "{what}: the residual's gradient"
                );
            }
            d.force_split(None);
        }
    }
    // A residual that is not contiguous: the linear, then an add.
    let (rows, k, n) = (6, 8, 5);
    let xs = rand_vec(&mut r, rows * k, -1.0, 1.0);
    let ws = rand_vec(&mut r, k * n, -0.5, 0.5);
    let bs = rand_vec(&mut r, n, -0.5, 0.5);
    let rs = rand_vec(&mut r, rows * n, -2.0, 2.0);
    let x = Tensor::from_slice(d, &xs, &[rows, k])?;
    let w = Tensor::from_slice(d, &ws, &[k, n])?;
    let b = Tensor::from_slice(d, &bs, &[n])?;
    let res = Tensor::from_slice(d, &rs, &[n, rows])?.t()?;
    d.sync()?;
    let before = d.counters().dispatches;
    let y = x.linear_residual(&w, &b, &res)?;
    d.sync()?;
    assert_eq!(
        d.counters().dispatches - before,
        2 + absmax_dispatches(d, false),
        "a transposed residual"
    );
    let want = linear(
        &Arr::from_f32(&[rows, k], &xs),
        &Arr::from_f32(&[k, n], &ws),
        Some(&Arr::from_f32(&[n], &bs)),
    )
    .zip(&Arr::from_f32(&[n, rows], &rs).t(), |p, q| p + q)
    .data;
    assert_close(&y.to_vec()?, &want, 1e-4, "a transposed residual");
    // The input as its own residual (one buffer, read by the product and added after it):
    // y = x + x W + b, dx = g + g W^T.
    let n = k;
    let ws = rand_vec(&mut r, n * n, -0.5, 0.5);
    let bv = rand_vec(&mut r, n, -0.5, 0.5);
    let gs = rand_vec(&mut r, rows * n, -1.0, 1.0);
    let x = Tensor::from_slice(d, &xs, &[rows, n])?.requires_grad();
    let w = Tensor::from_slice(d, &ws, &[n, n])?;
    let b = Tensor::from_slice(d, &bv, &[n])?;
    d.sync()?;
    let before = d.counters().dispatches;
    let y = x.linear_residual(&w, &b, &x)?;
    d.sync()?;
    assert_eq!(
        d.counters().dispatches - before,
        2 + absmax_dispatches(d, false),
        "the input as its residual"
    );
    let (x64, w64, g64) = (
        Arr::from_f32(&[rows, n], &xs),
        Arr::from_f32(&[n, n], &ws),
        Arr::from_f32(&[rows, n], &gs),
    );
    let want_y = x64
        .zip(&x64.matmul(&w64), |p, q| p + q)
        .zip(&Arr::from_f32(&[n], &bv), |p, q| p + q)
        .data;
    let want_dx = g64.zip(&g64.matmul(&w64.t()), |p, q| p + q).data;
    assert_close(&y.to_vec()?, &want_y, 1e-4, "the input as its residual");
    y.backward_with(&Tensor::from_slice(d, &gs, &[rows, n])?)?;
    let dx = grads(&[x])?.remove(0);
    assert_close(&dx, &want_dx, 1e-4, "dx, the input as its residual");
    Ok(())
}

/// A tiled-kernel product split into ranges of K sums them in its own dispatch where the
/// device does (the last range of each tile adds the others' partials:
/// `matmul_split_tail.wgsl`; on Vulkan, lavapipe among them): one dispatch fewer than with the
/// sum in a second dispatch, for each epilogue the sum serves (plain, bias, bias and residual,
/// the column sums beside dW, added into the gradients on a second pass; the bias and the
/// residual views at offsets), in f32 and (without cooperative matrices, which keep the second
/// dispatch) under autocast, each against f64 into NaN-poisoned buffers three times over (each
/// product sets its tickets back to 0 for the next), and bit for bit the same as with the
/// second dispatch, on a tile whose sum fits that dispatch.
#[test]
fn a_split_product_sums_its_ranges_in_its_own_dispatch() -> Result<()> {
    use wgrad::kernels::matmul::Tile;
    use wgrad::kernels::matmul_coop::Coop;
    use wgrad::kernels::tuning::TileChoice;
    use wgrad::ops::autocast;
    let options = |one| {
        let mut o = wgrad::Options::default();
        o.precision.f32_matmul = wgrad::config::F32Matmul::Tiled;
        o.kernels.split_in_one_dispatch = one;
        o
    };
    // The sum in the product's dispatch wherever it is the default, against a second
    // dispatch.
    let one = wgrad::Device::with_options(&options(None))?;
    let vulkan = one.gpu().info.backend == wgrad::wgpu::Backend::Vulkan;
    if vulkan {
        assert!(
            one.split_in_one_dispatch(),
            "Vulkan sums a split in one dispatch"
        );
    }
    let one = match vulkan {
        true => wgrad::Device::with_options(&options(Some(true)))?,
        false => one,
    };
    let two = wgrad::Device::with_options(&options(Some(false)))?;
    assert!(!two.split_in_one_dispatch());
    let saved = one.split_in_one_dispatch() as u64;
    // The tiled kernel's 32 x 32 outputs a tile: one pass of its last range's sum. With
    // cooperative matrices (f32 products on the tiled kernel, autocast ones on those), tiles of
    // 1 to 8 fragments a subgroup (SG_MxSG_N/FMxFN), one and two stages.
    let tiled = TileChoice::Tiled(Tile::new(32, 32, 16, 2, 2));
    let coop = Coop::available(one.gpu());
    let tiles: Vec<(TileChoice, &[bool])> = match coop {
        Some(_) => std::iter::once((tiled, &[false][..]))
            .chain(
                [
                    "2x2/1x1/32",
                    "1x1/2x2/32",
                    "2x2/2x2/32",
                    "2x4/4x2/32",
                    "2x2/2x2/32/2",
                ]
                .iter()
                .map(|t| {
                    (
                        TileChoice::parse(&format!("coop {t}")).expect("a tile"),
                        &[true][..],
                    )
                }),
            )
            .collect(),
        None => vec![(tiled, halves(&one))],
    };
    // Passes of the tile's last range over it: a sum of `split` ranges runs in the product's
    // dispatch where split x passes is at most SPLIT_TAIL_STEPS (the 1x1/2x2 tile: 4 passes,
    // 2 and 3 ranges; 2x4/4x2: 8 passes, 2 ranges), with WGRAD_SPLIT_TAIL and WGRAD_SPLIT_MAX
    // unset.
    let passes = |tile: TileChoice| {
        let (outputs, lanes) = match (tile, coop) {
            (TileChoice::Tiled(t), _) => (t.bm * t.bn, t.lanes()),
            (TileChoice::Coop(t), Some(c)) => (t.bm(c.fs) * t.bn(c.fs), t.lanes(c.sgs)),
            (TileChoice::Coop(_), None) => {
                unreachable!("cooperative tiles where the adapter has them")
            }
        };
        outputs.div_ceil(lanes * wgrad::ops::SPLIT_CHUNK) as usize
    };
    let tile_bk = |tile: TileChoice| match tile {
        TileChoice::Tiled(t) => t.bk as usize,
        TileChoice::Coop(t) => t.bk as usize,
    };
    let mut r = rng("split in one dispatch");
    for (tile, halves) in tiles {
        for (rows, k, n) in [(37, 3001, 30), (1, 1001, 29), (70, 700, 64)] {
            let xs = rand_vec(&mut r, rows * k, -1.0, 1.0);
            let ws = rand_vec(&mut r, k * n, -0.5, 0.5);
            let bs = rand_vec(&mut r, n, -0.5, 0.5);
            let rs = rand_vec(&mut r, rows * n, -2.0, 2.0);
            let gs = rand_vec(&mut r, rows * n, -1.0, 1.0);
            for &half in halves {
                let x64 = Arr::new(&[rows, k], round(&xs, half));
                let w64 = Arr::new(&[k, n], round(&ws, half));
                let g64 = Arr::new(&[rows, n], round(&gs, half));
                let bias = linear(&x64, &w64, Some(&Arr::from_f32(&[n], &bs)));
                let res = bias.zip(&Arr::from_f32(&[rows, n], &rs), |p, q| p + q).data;
                let (plain, bias) = (x64.matmul(&w64).data, bias.data);
                let (dw, db) = (x64.t().matmul(&g64).data, g64.sum(0, false).data);
                let tol = if half { 2e-3 } else { 1e-4 };
                for split in [2, 3, 5] {
                    let mut counts = Vec::new();
                    let mut outputs = Vec::new();
                    for d in [&one, &two] {
                        d.force_tile(Some(tile));
                        d.force_split(Some(split));
                        let what = |e: &str| {
                            format!(
                                "{e}, {rows}x{k}x{n} in {split} ranges{} on {}, sum in {} dispatch",
                                if half { ", autocast" } else { "" },
                                tile.name(),
                                if d.same(&one) {
                                    "the product's"
                                } else {
                                    "a second"
                                }
                            )
                        };
                        let x = Tensor::from_slice(d, &xs, &[rows, k])?;
                        let w = Tensor::from_slice(d, &ws, &[k, n])?;
                        // The bias and the residual views at offsets in their buffers.
                        let pad = |v: &[f32], at: usize| [vec![9.0; at], v.to_vec()].concat();
                        let b = Tensor::from_slice(d, &pad(&bs, 3), &[n + 3])?.narrow(0, 3, n)?;
                        let resid = Tensor::from_slice(d, &pad(&rs, 5), &[rows * n + 5])?
                            .narrow(0, 5, rows * n)?
                            .reshape(&[rows, n])?;
                        let g = Tensor::from_slice(d, &gs, &[rows, n])?;
                        let mut count = Vec::new();
                        let mut out = Vec::new();
                        let mut dispatches = |f: &mut dyn FnMut() -> Result<Tensor>| {
                            // NaN in the buffers an output may take: an element left unstored
                            // fails.
                            poison(d, rows * n);
                            poison(d, k * n);
                            d.sync()?;
                            let before = d.counters().dispatches;
                            let y = f()?;
                            d.sync()?;
                            count.push(d.counters().dispatches - before);
                            Ok::<Tensor, wgrad::Error>(y)
                        };
                        for rep in 0..3 {
                            let y =
                                dispatches(&mut || autocast(half, || x.matmul(&w)))?.to_vec()?;
                            assert_close(&y, &plain, tol, &what(&format!("plain {rep}")));
                            out.push(y);
                            let lin = |act| autocast(half, || x.linear(&w, Some(&b), act));
                            let y = dispatches(&mut || lin(Activation::None))?.to_vec()?;
                            assert_close(&y, &bias, tol, &what(&format!("bias {rep}")));
                            out.push(y);
                            let y = dispatches(&mut || {
                                autocast(half, || x.linear_residual(&w, &b, &resid))
                            })?
                            .to_vec()?;
                            assert_close(&y, &res, tol, &what(&format!("res {rep}")));
                            out.push(y);
                        }
                        // dW with db from its ones row, twice: the second pass adds into both.
                        let wg = w.detach().requires_grad();
                        let bg = b.detach().requires_grad();
                        for pass in 1..=2 {
                            let y = autocast(half, || x.linear(&wg, Some(&bg), Activation::None))?;
                            dispatches(&mut || {
                                y.backward_with(&g)?;
                                Ok(y.clone())
                            })?;
                            let scale = pass as f64;
                            let got = grads(&[wg.clone(), bg.clone()])?;
                            let (w2, b2): (Vec<f64>, Vec<f64>) = (
                                dw.iter().map(|v| v * scale).collect(),
                                db.iter().map(|v| v * scale).collect(),
                            );
                            assert_close(&got[0], &w2, tol, &what(&format!("dW, pass {pass}")));
                            // db under autocast: the sums row of the f16 product (g rounded,
                            // as the reference), or where the cooperative-matrix kernel takes
                            // no ones row (M not a multiple of 8: dW's here) a reduction of g
                            // in f32, up to rows x f16's rounding off the reference.
                            let db_tol = if half { 1e-2 } else { tol };
                            let what_db = what(&format!("db, pass {pass}"));
                            assert_close(&got[1], &b2, db_tol, &what_db);
                            out.extend(got);
                        }
                        counts.push(count);
                        outputs.push(out);
                        d.force_tile(None);
                        d.force_split(None);
                    }
                    // The products' K: the forward's k (9 products), dW's rows (2 passes);
                    // split into `split` ranges whole K steps long, so fewer where K is
                    // short (dW over one row does not split). The sum runs in the product's
                    // dispatch where it is split and its ranges times the tile's passes are
                    // at most SPLIT_TAIL_STEPS.
                    let (bk, passes) = (tile_bk(tile), passes(tile));
                    let saves = |k: usize| {
                        let ranges = k.div_ceil(k.div_ceil(split as usize).next_multiple_of(bk));
                        let one = ranges > 1 && ranges * passes <= wgrad::ops::SPLIT_TAIL_STEPS;
                        if one {
                            saved
                        } else {
                            0
                        }
                    };
                    let fewer: Vec<u64> = (counts[0].iter().enumerate())
                        .map(|(i, c)| c + saves(if i < 9 { k } else { rows }))
                        .collect();
                    let what = format!("{rows}x{k}x{n} in {split} ranges on {}", tile.name());
                    assert_eq!(
                        fewer, counts[1],
                        "{what}: dispatches with the sum in the product's dispatch, then a second"
                    );
                    // The same sums in the same order: the same bits.
                    assert!(
                        outputs[0] == outputs[1],
                        "{rows}x{k}x{n} in {split} ranges on {}: the two ways' outputs differ",
                        tile.name()
                    );
                }
            }
        }
    }
    Ok(())
}

/// A linear's dX product, recorded after dW's product, the dispatch that sums dW's ranges of K
/// and the bias gradient's reduction, is encoded beside dW's product (`graph::schedule`): it
/// reads what dW read and writes a new buffer, where the sum waits at a barrier. The step's
/// counters say so, and dX, dW and db match f64 sums (the order changes no number). Split sums
/// in a second dispatch (`split_sum_dev`); over 1,024 rows (db by a reduction, not from the
/// product). Fails with `WGRAD_SCHEDULE=recorded`, which keeps the recorded order.
#[test]
fn a_linears_dx_is_encoded_beside_its_split_dw() -> Result<()> {
    let d = &split_sum_dev();
    let mut r = rng("linear dx beside dw");
    let (rows, k, n) = (1100, 24, 40);
    let xs = rand_vec(&mut r, rows * k, -1.0, 1.0);
    let ws = rand_vec(&mut r, k * n, -0.5, 0.5);
    let gs = rand_vec(&mut r, rows * n, -1.0, 1.0);
    let (x64, w64, g64) = (
        Arr::from_f32(&[rows, k], &xs),
        Arr::from_f32(&[k, n], &ws),
        Arr::from_f32(&[rows, n], &gs),
    );
    let want_dx = g64.matmul(&w64.t()).data;
    let want_dw = x64.t().matmul(&g64).data;
    let want_db = g64.sum(0, false).data;
    d.force_split(Some(3));
    let x = Tensor::from_slice(d, &xs, &[rows, k])?.requires_grad();
    let w = Tensor::from_slice(d, &ws, &[k, n])?.requires_grad();
    let b = Tensor::zeros(d, &[n])?.requires_grad();
    let y = x.linear(&w, Some(&b), Activation::None)?;
    d.sync()?;
    let c0 = d.counters();
    y.backward_with(&Tensor::from_slice(d, &gs, &[rows, n])?)?;
    d.sync()?;
    let c = d.counters() - c0;
    d.force_split(None);
    assert!(
        c.moved >= 1,
        "dX's product encoded ahead of dW's split sum: {c:?}"
    );
    let got = grads(&[x, w, b])?;
    assert_close(&got[0], &want_dx, 1e-4, "dX");
    assert_close(&got[1], &want_dw, 1e-4, "dW");
    assert_close(&got[2], &want_db, 1e-4, "db");
    Ok(())
}
