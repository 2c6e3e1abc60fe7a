//! The matmul tile search and the in-step check (`wgrad::tune`): the products they cover, the
//! configurations they keep, and every tile they may choose giving a linear's products (against
//! f64 where the tiles read vectors); padded and unpadded rows tuned apart.

use crate::common::reference::linear;
use crate::common::*;
use rand::rngs::StdRng;
use wgrad::{Device, Tensor};

/// A tile search over a step's products: plain, bias and GELU products each get a measured
/// configuration (K ranges where a plain or bias product may split K; a GELU product does
/// not), and the step gives the same gradients on the tuned configurations.
#[test]
fn tile_search_covers_plain_bias_and_gelu_products() {
    use wgrad::ops::Activation;
    let d = tiled_dev();
    let mut rng = rng("tile search");
    // h = rows: the bias product's K is long enough to split, as the dW products' are.
    let (rows, c, h) = (512, 40, 512);
    let x = Arr::rand(&mut rng, &[rows, c], -1.0, 1.0).upload(&d);
    let w1 = Arr::rand(&mut rng, &[c, h], -0.5, 0.5)
        .upload(&d)
        .requires_grad();
    let b1 = Arr::rand(&mut rng, &[h], -0.5, 0.5)
        .upload(&d)
        .requires_grad();
    // Small enough that z = y W2 + b2 over h = 512 stays near 1: the gradients (sums over 512
    // rows) then differ between configurations by rounding well under TOL.
    let w2 = Arr::rand(&mut rng, &[h, c], -0.1, 0.1)
        .upload(&d)
        .requires_grad();
    let b2 = Arr::rand(&mut rng, &[c], -0.5, 0.5)
        .upload(&d)
        .requires_grad();
    let step = || -> wgrad::Result<Vec<Vec<f32>>> {
        for p in [&w1, &b1, &w2, &b2] {
            p.zero_grad();
        }
        let y = x.linear(&w1, Some(&b1), Activation::Gelu)?;
        let z = y.linear(&w2, Some(&b2), Activation::None)?;
        z.square()?.sum_all()?.backward()?;
        [&w1, &b1, &w2, &b2]
            .iter()
            .map(|p| p.grad().expect("reached by backward").to_vec())
            .collect()
    };
    let before = step().unwrap();
    let searches = wgrad::tune::search_step(&d, 1, || step().map(drop)).unwrap();
    let keys: Vec<_> = searches.iter().map(|s| s.key).collect();
    assert!(keys.iter().any(|k| k.gelu && k.bias), "{keys:?}");
    assert!(
        keys.iter()
            .any(|k| k.bias && !k.gelu && k.k as usize == rows),
        "{keys:?}"
    );
    assert!(
        keys.iter().any(|k| !k.bias && k.k as usize == rows),
        "{keys:?}"
    );
    let tuned = d.tile_rows();
    for s in &searches {
        let best = s.best();
        assert!(
            tuned
                .iter()
                .any(|(k, t, split, _)| *k == s.key && *t == best.tile && *split == best.split),
            "{}: the winner is in the table",
            s.key.describe()
        );
        // Splits are measured for plain and bias products (K = 512: one range, and those of
        // ranges at least SEARCH_MIN_K long).
        let splits: Vec<_> = s.measured.iter().filter_map(|m| m.split).collect();
        let ranges: Vec<u32> = wgrad::tune::SPLITS
            .into_iter()
            .filter(|&n| n == 1 || rows / n as usize >= wgrad::tune::SEARCH_MIN_K)
            .collect();
        assert_eq!(ranges, [1, 2, 3, 4]);
        if s.key.gelu {
            assert!(splits.is_empty(), "{}", s.key.describe());
        } else if s.key.k as usize == rows {
            // Each of those numbers of ranges, for each of the fastest whole-K tiles.
            let mut whole: Vec<_> = s.measured.iter().filter(|m| m.split.is_none()).collect();
            whole.sort_by(|a, b| a.ms.total_cmp(&b.ms));
            let tries = wgrad::tune::SPLIT_TILES.min(whole.len());
            assert_eq!(splits, ranges.repeat(tries), "{}", s.key.describe());
            let split_tiles: Vec<_> = s
                .measured
                .iter()
                .filter(|m| m.split.is_some())
                .map(|m| m.tile)
                .collect();
            for w in &whole[..tries] {
                assert_eq!(
                    split_tiles.iter().filter(|&&t| t == w.tile).count(),
                    ranges.len(),
                    "{}: {} is among the fastest whole, so it is tried split",
                    s.key.describe(),
                    w.tile.name()
                );
            }
        }
    }
    same_gradients(&step().unwrap(), &before, "the tuned configurations");
}

/// A search's winners checked inside the step (`tune::in_step`): each product tries its
/// candidates (the search's winner first, each distinct, within `NEAR` of it), each timed in
/// the step; the one with the least GPU-busy time is in the table, and the step's gradients
/// are the same on it.
#[test]
fn in_step_check_keeps_the_candidate_the_step_ran_fastest_on() {
    use wgrad::ops::Activation;
    use wgrad::tune::in_step;
    let d = tiled_dev();
    assert!(
        d.gpu().has(wgrad::wgpu::Features::TIMESTAMP_QUERY),
        "the test adapter times the GPU (lavapipe does)"
    );
    let mut rng = rng("in-step check");
    let (rows, c, h) = (512, 40, 512);
    let x = Arr::rand(&mut rng, &[rows, c], -1.0, 1.0).upload(&d);
    let w1 = Arr::rand(&mut rng, &[c, h], -0.5, 0.5)
        .upload(&d)
        .requires_grad();
    let w2 = Arr::rand(&mut rng, &[h, c], -0.1, 0.1)
        .upload(&d)
        .requires_grad();
    let step = || -> wgrad::Result<Vec<Vec<f32>>> {
        for p in [&w1, &w2] {
            p.zero_grad();
        }
        let y = x.linear(&w1, None, Activation::None)?;
        let z = y.linear(&w2, None, Activation::None)?;
        z.square()?.sum_all()?.backward()?;
        [&w1, &w2]
            .iter()
            .map(|p| p.grad().expect("reached by backward").to_vec())
            .collect()
    };
    let before = step().unwrap();
    let searches = wgrad::tune::search_step(&d, 1, || step().map(drop)).unwrap();
    let refined = in_step::refine_step(&d, &searches, || step().map(drop))
        .unwrap()
        .expect("an adapter with timestamps checks in the step");
    assert_eq!(refined.len(), searches.len());
    let table = d.tile_rows();
    for s in &searches {
        let what = s.key.describe();
        // refine_step goes largest first: each search's own result.
        let r = refined
            .iter()
            .find(|r| r.key == s.key)
            .expect("every product checked");
        let cands = in_step::candidates(s);
        assert!(!cands.is_empty() && cands.len() <= in_step::MOST, "{what}");
        let best = s.best();
        assert!(
            cands[0].tile == best.tile && cands[0].split == best.split,
            "{what}: winner first"
        );
        for (i, m) in cands.iter().enumerate() {
            assert!(
                m.ms <= best.ms * in_step::NEAR,
                "{what}: {} too slow alone",
                m.name()
            );
            assert!(
                !cands[..i]
                    .iter()
                    .any(|o| o.tile == m.tile && o.split == m.split),
                "{what}: {} tried twice",
                m.name()
            );
        }
        let tried: Vec<_> = r.tried.iter().map(|(m, _)| (m.tile, m.split)).collect();
        let want: Vec<_> = cands.iter().map(|m| (m.tile, m.split)).collect();
        assert_eq!(tried, want, "{what}: the candidates, in order");
        let least = r
            .tried
            .iter()
            .map(|(_, ms)| *ms)
            .fold(f64::INFINITY, f64::min);
        assert!(least.is_finite() && least > 0.0, "{what}: {least}");
        let (_, kept_ms) = r.busy_ms();
        assert_eq!(kept_ms, least, "{what}: the kept one ran the step fastest");
        assert!(
            table.iter().any(|(k, t, split, _)| *k == s.key
                && *t == r.chosen.tile
                && *split == r.chosen.split),
            "{what}: the kept one is in the table"
        );
    }
    same_gradients(&step().unwrap(), &before, "the kept configurations");
}

/// Each gradient of `after` within TOL of `before`'s (a step on other configurations).
#[track_caller]
fn same_gradients(after: &[Vec<f32>], before: &[Vec<f32>], on: &str) {
    for (i, (a, b)) in after.iter().zip(before).enumerate() {
        let want: Vec<f64> = b.iter().map(|&v| v as f64).collect();
        assert_close(a, &want, TOL, &format!("gradient {i} on {on}"));
    }
}

/// A linear's forward (bias and GELU epilogue), a second one's with a residual, their dX, and
/// their dW with the bias gradient as column sums, at sizes no tile divides; two backwards,
/// the second's gradients added into the first's. The outputs and gradients of a step on `d`
/// (parameters from a fixed seed), and the products' keys.
struct LinearProducts {
    params: Vec<Tensor>,
}

impl LinearProducts {
    const SHAPE: (usize, usize, usize, usize) = (131, 45, 77, 36);

    fn new(d: &Device) -> LinearProducts {
        let mut rng = rng("searched tiles");
        let (rows, c, h, o) = Self::SHAPE;
        let mut param =
            |shape: &[usize], r: f32| Arr::rand(&mut rng, shape, -r, r).upload(d).requires_grad();
        let params = vec![
            param(&[rows, c], 1.0),
            param(&[c, h], 0.5),
            param(&[h], 0.5),
            param(&[h, o], 0.3),
            param(&[o], 0.5),
            param(&[rows, o], 1.0),
        ];
        LinearProducts { params }
    }

    fn backward(&self) -> wgrad::Result<Vec<Vec<f32>>> {
        use wgrad::ops::Activation;
        let [x, w, b, w2, b2, res] = &self.params[..] else {
            unreachable!()
        };
        let y = x.linear(w, Some(b), Activation::Gelu)?;
        let z = y.linear_residual(w2, b2, res)?;
        z.square()?.sum_all()?.backward()?;
        let mut out = vec![y.to_vec()?, z.to_vec()?];
        for p in &self.params {
            out.push(p.grad().expect("reached by backward").to_vec()?);
        }
        Ok(out)
    }

    fn step(&self) -> wgrad::Result<Vec<Vec<f32>>> {
        for p in &self.params {
            p.zero_grad();
        }
        let mut out = self.backward()?;
        out.extend(self.backward()?);
        Ok(out)
    }

    /// A step's outputs, and the keys of its products.
    fn logged_step(&self, d: &Device) -> (Vec<Vec<f32>>, Vec<wgrad::kernels::tuning::ProductKey>) {
        d.log_products(true);
        let out = self.step().unwrap();
        let keys = d.take_product_log();
        d.log_products(false);
        (out, keys)
    }

    /// Each tile for every product in turn, whole and (where a product may split K) in 2
    /// ranges of K: a step's outputs against `want` within `tol`.
    fn check_tiles(
        &self,
        d: &Device,
        keys: &[wgrad::kernels::tuning::ProductKey],
        tiles: &[wgrad::kernels::tuning::TileChoice],
        want: &[Vec<f32>],
        tol: f64,
    ) {
        for &t in tiles {
            for split in [None, Some(2)] {
                for key in keys {
                    let split = split.filter(|_| !key.gelu && key.batch == 1);
                    d.set_tile(*key, t, split, 1.0);
                }
                let got = self.step().unwrap();
                let worst = got
                    .iter()
                    .zip(want)
                    .flat_map(|(g, w)| g.iter().zip(w))
                    .map(|(&g, &w)| (g as f64 - w as f64).abs() / (w as f64).abs().max(1.0))
                    .fold(0.0, f64::max);
                println!("tile {t:?} split {split:?}: worst error {worst:.3e}");
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    let w: Vec<f64> = w.iter().map(|&v| v as f64).collect();
                    let what = format!("tile {t:?} split {split:?}: output {i}");
                    assert_close(g, &w, tol, &what);
                }
            }
        }
    }
}

/// Every tile a search may choose for the tiled kernel (interleaved and vector-run register
/// blocks), and blocks the accumulators hold only rounded up to vectors (3x3, 2x3), give a
/// linear's products (`LinearProducts`), against the heuristic's tiles (which the tests above
/// check against f64).
#[test]
fn every_searched_tile_gives_a_linears_products() {
    use wgrad::kernels::matmul::Tile;
    use wgrad::kernels::tuning::{tiled_search_tiles, TileChoice};
    let d = tiled_dev();
    let lin = LinearProducts::new(&d);
    let (want, keys) = lin.logged_step(&d);
    assert!(keys.iter().any(|k| k.residual), "{keys:?}");
    assert!(keys.iter().any(|k| k.gelu), "{keys:?}");
    let mut tiles = tiled_search_tiles();
    assert!(tiles.iter().any(|t| t.vec) && tiles.iter().any(|t| !t.vec));
    tiles.extend(["48x48x16/3x3", "32x48x16/2x3"].map(|n| Tile::parse(n).unwrap()));
    let limit = d.gpu().limits.max_compute_workgroup_storage_size;
    for t in &tiles {
        assert!(
            t.workgroup_bytes() <= limit,
            "tile {} needs {} bytes of workgroup memory, the adapter has {limit}: it would not run",
            t.name(),
            t.workgroup_bytes()
        );
    }
    let tiles: Vec<_> = tiles.into_iter().map(TileChoice::Tiled).collect();
    lin.check_tiles(&d, &keys, &tiles, &want, TOL);
}

const X3_TOL: f64 = 1e-4;

/// Every tile a search may choose for an X3 product (f32 operands as three f16 products on
/// cooperative matrices), whole and in 2 ranges of K, gives a linear's products
/// (`LinearProducts`) within `X3_TOL` of the tiled f32 kernel's (on a Device that keeps them
/// there). Without cooperative matrices there is no X3 tile, and the heuristic's tiles are the
/// tiled kernel's.
#[test]
fn every_x3_tile_gives_a_linears_products_to_f32_precision() {
    let tiled = tiled_dev();
    let (want, _) = LinearProducts::new(&tiled).logged_step(&tiled);
    let d = private_dev();
    let lin = LinearProducts::new(&d);
    let (got, keys) = lin.logged_step(&d);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let w: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        assert_close(g, &w, X3_TOL, &format!("heuristic tiles: output {i}"));
    }
    // The tiles an X3 product can run here (none without cooperative matrices).
    let tiles = coop_search_tiles(&d, true);
    lin.check_tiles(&d, &keys, &tiles, &want, X3_TOL);
}

/// An (rows, cols) operand: contiguous, or (`narrow`) a view 4 elements into rows of a multiple
/// of 4 longer than it, the rest of each row NaN: a kernel that reads past the view's end (as
/// whole vectors do) and fails to mask it gives NaN.
fn padded_operand(
    d: &Device,
    rng: &mut StdRng,
    rows: usize,
    cols: usize,
    narrow: bool,
) -> (Tensor, Arr) {
    let logical = Arr::rand(rng, &[rows, cols], -1.0, 1.0);
    if !narrow {
        return (logical.upload(d), logical);
    }
    let width = cols.next_multiple_of(4) + 8;
    let stored = Arr::build(&[rows, width], |i| match i[1].checked_sub(4) {
        Some(c) if c < cols => logical.at(&[i[0], c]),
        _ => f64::NAN,
    });
    let view = stored.upload(d).narrow(1, 4, cols).unwrap();
    (view, logical)
}

/// The tiled kernel's vector reads (`matmul.wgsl`'s A_V4, B_V4) on every vector tile the engine
/// or a search chooses: A read along k or (transposed) m, B along n or (transposed) k; rows of
/// a multiple of 4 and views narrower than their rows (the last vector partly outside, NaN
/// there: a kernel that does not mask what lies past K gives NaN); whole K and ranges of it (3
/// asked; 2 where BK is 32); a batch of 3 over a broadcast B; and a linear's backward, whose
/// weight gradient takes A's row of ones beside a vector of x^T's (the bias gradient). Against
/// f64; every product's dispatch says it read both operands as vectors, a split product's that
/// its partials were summed (in its own dispatch or a second), the weight gradient's that it
/// ran with the row of ones.
#[test]
fn vector_reads_match_f64_on_every_layout() {
    use wgrad::kernels::tuning::{tiled_search_tiles, TileChoice};
    use wgrad::ops::Activation;
    let d = tiled_dev();
    assert_eq!(
        d.set_gpu_timing(true),
        Some(wgrad::graph::TimingMode::PerDispatch),
        "the test reads each dispatch's variant from timestamps inside passes"
    );
    let mut rng = rng("vector reads");
    let mut tiles: Vec<_> = tiled_search_tiles().into_iter().filter(|t| t.vec).collect();
    tiles.sort_by_key(|t| t.name());
    tiles.dedup();
    assert!(tiles.len() >= 4, "{tiles:?}");
    // Runs `product` once to learn its keys, then on `tile` (split where a key allows), and
    // checks that each matmul dispatch read A and B in vectors, that a split ran where asked
    // and (`ones`) that a product took A's row of ones.
    let on_tile = |tile, split: Option<u32>, ones: bool, product: &dyn Fn() -> Vec<Tensor>| {
        d.log_products(true);
        drop(product());
        let keys = d.take_product_log();
        d.log_products(false);
        for key in keys {
            let split = split.filter(|_| !key.gelu && key.batch == 1);
            d.set_tile(key, TileChoice::Tiled(tile), split, 1.0);
        }
        d.take_gpu_intervals().unwrap();
        let out = product();
        for t in &out {
            t.to_vec().unwrap();
        }
        let intervals = d.take_gpu_intervals().unwrap();
        // A split product sums its ranges in its own dispatch (`matmul_split`) or in a
        // second (`matmul_split_sum*`).
        let (sums, products): (Vec<_>, Vec<_>) = intervals
            .iter()
            .filter(|i| i.label.starts_with("matmul"))
            .partition(|i| i.label.starts_with("matmul_split_sum"));
        assert!(!products.is_empty());
        let split_ran = !sums.is_empty() || products.iter().any(|i| i.label == "matmul_split");
        assert_eq!(
            split_ran,
            split.is_some(),
            "tile {}: {intervals:?}",
            tile.name()
        );
        for i in &products {
            let flags = i.variant.split(',').collect::<Vec<_>>();
            assert!(
                flags.contains(&"A_V4=true") && flags.contains(&"B_V4=true"),
                "tile {}: {} {}",
                tile.name(),
                i.label,
                i.variant
            );
        }
        if ones {
            assert!(
                products.iter().any(|i| i.variant.contains("ONES=true")),
                "tile {}: {products:?}",
                tile.name()
            );
        }
        out
    };
    for &tile in &tiles {
        for split in [None, Some(3)] {
            for (ta, tb, narrow) in (0..8).map(|i| (i & 1 != 0, i & 2 != 0, i & 4 != 0)) {
                let (m, k, n) = if narrow { (70, 45, 38) } else { (68, 44, 36) };
                let (x, a) = match ta {
                    false => padded_operand(&d, &mut rng, m, k, narrow),
                    true => {
                        let (x, a) = padded_operand(&d, &mut rng, k, m, narrow);
                        (x.t().unwrap(), a.t())
                    }
                };
                let (y, b) = match tb {
                    false => padded_operand(&d, &mut rng, k, n, narrow),
                    true => {
                        let (y, b) = padded_operand(&d, &mut rng, n, k, narrow);
                        (y.t().unwrap(), b.t())
                    }
                };
                let c = on_tile(tile, split, false, &|| vec![x.matmul(&y).unwrap()]);
                let what = format!(
                    "tile {} split {split:?}: {m}x{k}x{n}, transposed {ta} {tb}, narrow {narrow}",
                    tile.name()
                );
                check(&c[0], &a.matmul(&b), TOL, &what);
            }
            // A batch of 3 (68, 44) matrices times one (44, 36) (B's batch stride 0); a
            // batch does not split.
            if split.is_none() {
                let a = Arr::rand(&mut rng, &[3, 68, 44], -1.0, 1.0);
                let b = Arr::rand(&mut rng, &[44, 36], -1.0, 1.0);
                let (x, y) = (a.upload(&d), b.upload(&d));
                let c = on_tile(tile, None, false, &|| vec![x.matmul(&y).unwrap()]);
                check(
                    &c[0],
                    &a.matmul(&b),
                    TOL,
                    &format!("tile {}: batch of 3", tile.name()),
                );
            }
            // dW = x^T dz with the bias gradient as its row of ones: x^T read along m, the
            // ones starting a vector (44 features) or inside one (45).
            for narrow in [false, true] {
                let (rows, c_in, c_out) = if narrow { (70, 45, 36) } else { (68, 44, 36) };
                let (x, xa) = padded_operand(&d, &mut rng, rows, c_in, narrow);
                let wa = Arr::rand(&mut rng, &[c_in, c_out], -0.5, 0.5);
                let ba = Arr::rand(&mut rng, &[c_out], -0.5, 0.5);
                let (w, b) = (wa.upload(&d).requires_grad(), ba.upload(&d).requires_grad());
                let grads = on_tile(tile, split, true, &|| {
                    w.zero_grad();
                    b.zero_grad();
                    let y = x.linear(&w, Some(&b), Activation::None).unwrap();
                    y.square().unwrap().sum_all().unwrap().backward().unwrap();
                    vec![y, w.grad().unwrap(), b.grad().unwrap()]
                });
                let y = linear(&xa, &wa, Some(&ba));
                let dz = y.map(|v| 2.0 * v);
                let what = format!(
                    "tile {} split {split:?}: linear {rows}x{c_in}x{c_out}, narrow {narrow}",
                    tile.name()
                );
                check(&grads[0], &y, TOL, &format!("{what}: y"));
                check(&grads[1], &xa.t().matmul(&dz), TOL, &format!("{what}: dW"));
                check(&grads[2], &dz.sum(0, false), TOL, &format!("{what}: db"));
            }
        }
    }
}

/// The LM head's product into 64-aligned rows (a training step's logits) and the same product
/// into rows as long as N tune apart (the kernels read and store the two differently: vectors
/// or gathered elements), the search runs each on operands laid out as its key says, and both
/// give x W on the tuned configurations.
#[test]
fn padded_and_unpadded_rows_tune_apart() {
    use wgrad::kernels::tuning::ProductKey;
    use wgrad::ops::Activation;
    let d = private_dev();
    let mut rng = rng("aligned keys");
    let (rows, k, n) = (64, 32, 97);
    let x = Arr::rand(&mut rng, &[rows, k], -1.0, 1.0);
    // W as the tied embedding's transposed view: (N, K) rows of K.
    let wt = Arr::rand(&mut rng, &[n, k], -0.5, 0.5);
    let want = x.matmul(&wt.t());
    let (xd, wd) = (x.upload(&d), wt.upload(&d).t().unwrap());
    let run = || -> wgrad::Result<(Tensor, Tensor)> {
        Ok((
            xd.linear_padded(&wd, 64)?,
            xd.linear(&wd, None, Activation::None)?,
        ))
    };
    let searches = wgrad::tune::search_step(&d, 1, || run().map(drop)).unwrap();
    let keys: Vec<_> = searches.iter().map(|s| s.key).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys[0].aligned && !keys[1].aligned, "{keys:?}");
    assert_eq!(
        ProductKey {
            aligned: true,
            ..keys[1]
        },
        keys[0]
    );
    let (padded, plain) = run().unwrap();
    assert_eq!(padded.strides(), [128, 1]);
    check(&padded, &want, TOL, "padded rows, tuned");
    check(&plain, &want, TOL, "rows of N, tuned");
}
