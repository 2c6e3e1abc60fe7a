//! LayerNorm over the last dim, fused. The forward is one dispatch that also saves mean and
//! rstd, and stores y as f32 or (`layer_norm_as`) f16 for a matmul that reads f16 operands: the
//! statistics and the normalization are f32 either way. The backward works from the saved
//! statistics (never recomputed): one workgroup per chunk of rows computes each row's dx and
//! the chunk's partial dgamma and dbeta into a scratch, and the partials are summed into both
//! parameter gradients, each written into its target as its `Out` says (overwritten or added
//! into) by a second dispatch. dy may be f32 or f16
//! (an f16 gradient where the consumer made one); dx, dgamma, dbeta are f32.
//! `layer_norm_unfused` is the same function in existing ops: the reference tests compare.
//!
//! Shapes: x (..., C) seen as (rows, C); gamma, beta (C); mean, rstd (rows).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::kernels::layernorm::{self, LayerNormParams, Write};
use crate::ops::elementwise::launch_copy;
use crate::ops::{check_store_dtype, Out};

const OP: &str = "layer_norm";

/// The backward gives each chunk at least this many rows (one workgroup per chunk, its rows
/// one after another: few rows a chunk keep its latency short).
const MIN_CHUNK_ROWS: usize = 2;
/// At most this many chunks: bounds the (2, n_chunks, C) scratch and stage 2's loops (16 lanes
/// a column, so more chunks make stage 2 longer). Measured on an H200 with `WGRAD_LN_CHUNKS`
/// (DistilGPT-2 --amp, both stages for 13 LayerNorms, 2026-11-24, stage 2 over 16 lanes a
/// column): at 8 x 512 (4096 rows) 512 chunks of 4 rows 0.60 ms, 1024 of 4 0.51, 1024 of 2
/// 0.51, 2048 of 2 0.61, 4096 of 1 0.92; at 4 x 128 (512 rows) 0.37, 0.37, 0.31, 0.32, 0.30.
/// (With one lane a column in stage 2, 512 of 4 was best: 0.80 and 0.41 ms.)
const MAX_CHUNKS: usize = 1024;

/// (chunks, rows per chunk) of the backward over `rows` rows of `x`'s device when it sums
/// dgamma and dbeta (a `lab` build's `WGRAD_LN_CHUNKS=MAX,MIN_ROWS` overrides the two
/// constants). RMSNorm's backward sums dweight in the same chunks.
pub(super) fn chunks(x: &Tensor, rows: usize) -> (usize, usize) {
    let (max_chunks, min_rows) = x
        .device()
        .options()
        .lab
        .layernorm_chunks()
        .unwrap_or((MAX_CHUNKS, MIN_CHUNK_ROWS));
    let n_chunks = rows.div_ceil(min_rows).clamp(1, max_chunks);
    (n_chunks, rows.div_ceil(n_chunks))
}

/// What backward needs: the forward's input and scale, and the statistics it saved.
struct LayerNormBackward {
    x: Tensor,     // (..., C) contiguous
    gamma: Tensor, // (C) contiguous
    mean: Tensor,  // (rows)
    rstd: Tensor,  // (rows)
}

/// (rows, C) of a (..., C) tensor of rank >= 1.
pub(super) fn rows_cols(x: &Tensor) -> (usize, usize) {
    let cols = x.shape().last().copied().unwrap_or(1);
    // No columns: no rows either.
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    (rows, cols)
}

const ASKED: &str = "a gradient that was asked for is made";

impl Backward for LayerNormBackward {
    fn name(&self) -> &'static str {
        OP
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        // The kernels read dy as contiguous rows (a broadcast gradient, e.g. from a mean,
        // costs one copy here).
        let dy = g.contiguous()?;
        // Every gradient wanted from one call, which is handed all their targets at once.
        match [0, 1, 2].map(|i| ctx.needed(i)) {
            [true, true, true] => ctx.put_triple_with([0, 1, 2], |x, g, b| {
                let [x, g, b] = self.grads(&dy, [Some(x), Some(g), Some(b)])?;
                Ok((x.expect(ASKED), g.expect(ASKED), b.expect(ASKED)))
            }),
            [true, true, false] => ctx.put_pair_with(0, 1, |x, g| {
                let [x, g, _] = self.grads(&dy, [Some(x), Some(g), None])?;
                Ok((x.expect(ASKED), g.expect(ASKED)))
            }),
            [true, false, true] => ctx.put_pair_with(0, 2, |x, b| {
                let [x, _, b] = self.grads(&dy, [Some(x), None, Some(b)])?;
                Ok((x.expect(ASKED), b.expect(ASKED)))
            }),
            [false, true, true] => ctx.put_pair_with(1, 2, |g, b| {
                let [_, g, b] = self.grads(&dy, [None, Some(g), Some(b)])?;
                Ok((g.expect(ASKED), b.expect(ASKED)))
            }),
            [true, false, false] => ctx.put_with(0, |x| {
                Ok(self.grads(&dy, [Some(x), None, None])?[0]
                    .take()
                    .expect(ASKED))
            }),
            [false, true, false] => ctx.put_with(1, |g| {
                Ok(self.grads(&dy, [None, Some(g), None])?[1]
                    .take()
                    .expect(ASKED))
            }),
            [false, false, true] => ctx.put_with(2, |b| {
                Ok(self.grads(&dy, [None, None, Some(b)])?[2]
                    .take()
                    .expect(ASKED))
            }),
            [false, false, false] => Ok(()),
        }
    }
}

/// The (dgamma, dbeta) targets' modes and the two buffers bound for them (a target not asked
/// for is not touched: its binding gets the other's), None where neither is asked for.
fn param_targets<'a>(
    g: Option<&'a (Tensor, bool)>,
    b: Option<&'a (Tensor, bool)>,
) -> Option<([Write; 2], [&'a Tensor; 2])> {
    let mode = |t: Option<&(Tensor, bool)>| t.map_or(Write::None, |t| Write::of(t.1));
    let bound = match (g, b) {
        (Some((g, _)), Some((b, _))) => [g, b],
        (Some((g, _)), None) => [g, g],
        (None, Some((b, _))) => [b, b],
        (None, None) => return None,
    };
    Some(([mode(g), mode(b)], bound))
}

impl LayerNormBackward {
    /// The gradients asked for, each written per its `Out`: dx alone in one dispatch (a row a
    /// workgroup); with dgamma or dbeta, the chunks' partials (with dx where asked for), then
    /// their sums.
    fn grads(
        &self,
        dy: &Tensor,
        [dx, dgamma, dbeta]: [Option<Out<'_>>; 3],
    ) -> Result<[Option<Tensor>; 3]> {
        let x = &self.x;
        let device = x.device();
        let (rows, cols) = rows_cols(x);
        let read = [dy, x, &self.gamma, &self.mean, &self.rstd];
        let dx = dx
            .map(|o| o.resolve(OP, device, x.shape(), &read))
            .transpose()?;
        let param = |o: Option<Out<'_>>| o.map(|o| o.resolve(OP, device, &[cols], &[])).transpose();
        let (g, b) = (param(dgamma)?, param(dbeta)?);
        // The kernels write dx as contiguous rows: a strided target gets a new tensor, copied
        // in after.
        let fresh = match &dx {
            Some((t, _)) if !t.is_contiguous() => {
                Some(Tensor::uninit(device, x.shape(), DType::F32, OP)?)
            }
            _ => None,
        };
        let dx_kernel = match (&dx, &fresh) {
            (Some(_), Some(f)) => Some((f, false)),
            (Some((t, acc)), None) => Some((t, *acc)),
            (None, _) => None,
        };
        match param_targets(g.as_ref(), b.as_ref()) {
            None => self.launch(dy, dx_kernel, None),
            Some(targets) => {
                let n_chunks = chunks(x, rows).0;
                let partial = Tensor::uninit(device, &[2, n_chunks, cols], DType::F32, OP)?;
                self.launch(dy, dx_kernel, Some(&partial));
                param_sums(&partial, targets);
            }
        }
        let dx = match (dx, fresh) {
            (Some((t, acc)), Some(f)) => Some(launch_copy(
                &f,
                if acc { Out::Acc(&t) } else { Out::Write(&t) },
            )?),
            (dx, _) => dx.map(|t| t.0),
        };
        Ok([dx, g.map(|t| t.0), b.map(|t| t.0)])
    }

    /// The backward kernel: dx into `dx` (contiguous; added into where its flag says) and the
    /// (2, n_chunks, C) partial sums into `partial`, each where given. Without the partials,
    /// one row a workgroup.
    fn launch(&self, dy: &Tensor, dx: Option<(&Tensor, bool)>, partial: Option<&Tensor>) {
        let x = &self.x;
        let device = x.device();
        let rows = rows_cols(x).0;
        let (n_chunks, chunk_rows) = match partial {
            Some(_) => chunks(x, rows),
            None => (rows, 1),
        };
        // A binding the variant does not touch gets the other written buffer.
        let (dx_buf, partial_buf) = match (dx, partial) {
            (Some((t, _)), Some(p)) => (t, p),
            (Some((t, _)), None) => (t, t),
            (None, Some(p)) => (p, p),
            (None, None) => return,
        };
        let params = LayerNormParams {
            n_chunks: n_chunks as u32,
            chunk_rows: chunk_rows as u32,
            ..self.params(dy, dx_buf)
        };
        device.record(
            &layernorm::LAYERNORM_BACKWARD,
            &layernorm::backward_spec(dy.dtype(), dx.map(|(_, acc)| acc), partial.is_some()),
            &params,
            &[
                dx_buf.storage(),
                x.storage(),
                dy.storage(),
                self.mean.storage(),
                self.rstd.storage(),
                self.gamma.storage(),
                partial_buf.storage(),
            ],
            device.grid(n_chunks as u64),
        );
    }

    /// The backward's params every launch shares: the shape, and where x, gamma, dy and dx
    /// (`dx_buf`) start.
    fn params(&self, dy: &Tensor, dx_buf: &Tensor) -> LayerNormParams {
        let (rows, cols) = rows_cols(&self.x);
        LayerNormParams {
            rows: rows as u32,
            cols: cols as u32,
            x_offset: self.x.layout().offset as u32,
            gamma_offset: self.gamma.layout().offset as u32,
            dy_offset: dy.layout().offset as u32,
            out_offset: dx_buf.layout().offset as u32,
            ..Default::default()
        }
    }
}

/// Stage 2: dgamma and dbeta from the (2, n_chunks, C) partials into their targets
/// (`param_targets`: modes, buffers; any stride), in one dispatch. RMSNorm's dweight too: its
/// (1, n_chunks, C) partials with dbeta's mode `Write::None` (that half is never read).
pub(super) fn param_sums(
    partial: &Tensor,
    ([g_mode, b_mode], [gt, bt]): ([Write; 2], [&Tensor; 2]),
) {
    let device = partial.device();
    let (n_chunks, cols) = (partial.shape()[1], partial.shape()[2]);
    let params = LayerNormParams {
        cols: cols as u32,
        n_chunks: n_chunks as u32,
        dgamma_offset: gt.layout().offset as u32,
        dgamma_stride: gt.strides()[0] as u32,
        dbeta_offset: bt.layout().offset as u32,
        dbeta_stride: bt.strides()[0] as u32,
        ..Default::default()
    };
    device.record(
        &layernorm::LAYERNORM_BACKWARD_SUM,
        &layernorm::sum_spec(g_mode, b_mode),
        &params,
        &[gt.storage(), bt.storage(), partial.storage()],
        device.grid((cols as u64).div_ceil(layernorm::SUM_COLUMNS)),
    );
}

/// Checks the operands of a LayerNorm and returns C.
fn check_args(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<usize> {
    for t in [x, gamma, beta] {
        t.expect_dtype(OP, DType::F32)?;
        x.expect_same_device(OP, t)?;
    }
    norm_cols(OP, x, &[("gamma", gamma), ("beta", beta)], eps)
}

/// What a norm over the last dim checks of its operands besides their types (LayerNorm's and
/// RMSNorm's): x of rank 1 or more, each named parameter of shape (C), eps finite and not
/// negative, x within 32-bit indexing. Returns C.
pub(super) fn norm_cols(
    op: &'static str,
    x: &Tensor,
    params: &[(&str, &Tensor)],
    eps: f32,
) -> Result<usize> {
    let Some(&cols) = x.shape().last() else {
        return Err(Error::ShapeMismatch {
            op,
            expected: "x of rank 1 or more, (..., C)".into(),
            got: vec![],
        });
    };
    for (name, t) in params {
        if t.shape() != [cols] {
            return Err(Error::ShapeMismatch {
                op,
                expected: format!(
                    "{name} of shape [{cols}] (C, the last dim of x of shape {:?})",
                    x.shape()
                ),
                got: t.shape().to_vec(),
            });
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("eps must be finite and non-negative, got {eps}"),
        });
    }
    if x.numel() > u32::MAX as usize {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("{} elements exceed the kernels' 32-bit indexing", x.numel()),
        });
    }
    Ok(cols)
}

impl Tensor {
    /// LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * gamma + beta, with the
    /// biased variance (as PyTorch) and f32 statistics. x (..., C); gamma, beta (C).
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        self.layer_norm_as(gamma, beta, eps, DType::F32)
    }

    /// `layer_norm` with y stored as `dtype`: f32, or f16 for a consumer that reads f16
    /// operands (a mixed-precision matmul: the rounding is the kernel's store, no cast
    /// kernel). The statistics and the normalization are f32 either way.
    pub fn layer_norm_as(
        &self,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
        dtype: DType,
    ) -> Result<Tensor> {
        check_args(self, gamma, beta, eps)?;
        let device = self.device();
        check_store_dtype(OP, device, dtype)?;
        let x = self.contiguous()?;
        let gamma = gamma.contiguous()?;
        let beta = beta.contiguous()?;
        let (rows, cols) = rows_cols(&x);
        let y = Tensor::uninit(device, x.shape(), dtype, OP)?;
        let mean = Tensor::uninit(device, &[rows], DType::F32, OP)?;
        let rstd = Tensor::uninit(device, &[rows], DType::F32, OP)?;
        let params = LayerNormParams {
            rows: rows as u32,
            cols: cols as u32,
            eps,
            x_offset: x.layout().offset as u32,
            gamma_offset: gamma.layout().offset as u32,
            beta_offset: beta.layout().offset as u32,
            ..Default::default()
        };
        device.record(
            &layernorm::LAYERNORM_FORWARD,
            &layernorm::forward_spec(dtype),
            &params,
            &[
                y.storage(),
                x.storage(),
                beta.storage(),
                mean.storage(),
                rstd.storage(),
                gamma.storage(),
            ],
            device.grid(rows as u64),
        );
        Ok(record(y, &[&x, &gamma, &beta], || LayerNormBackward {
            x: x.detach(),
            gamma: gamma.detach(),
            mean,
            rstd,
        }))
    }

    /// The same LayerNorm composed of existing ops (mean, sub, square, rsqrt, mul, add): the
    /// unfused reference of `layer_norm`, several dispatches each way.
    pub fn layer_norm_unfused(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        check_args(self, gamma, beta, eps)?;
        let mean = self.mean(-1, true)?;
        let xc = self.sub(&mean)?;
        let var = xc.square()?.mean(-1, true)?;
        let rstd = var.add_scalar(eps)?.rsqrt()?;
        xc.mul(&rstd)?.mul(gamma)?.add(beta)
    }
}

/// The CPU f64 reference of what the backward computes from the saved statistics (`mean`,
/// `rstd` per row of `gamma.len()` columns): the gradients [dx, dgamma, dbeta] of
/// sum(layer_norm(x) * dy). With xhat = (x - mean) rstd and dxhat = dy gamma per row,
/// dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)); dgamma = sum over rows of
/// dy xhat; dbeta = sum over rows of dy. The tests' one LayerNorm backward reference (theirs
/// takes its statistics from x, then calls this).
pub fn backward_reference(
    x: &[f64],
    gamma: &[f64],
    dy: &[f64],
    stats: &[(f64, f64)],
) -> [Vec<f64>; 3] {
    let cols = gamma.len();
    let n = cols as f64;
    let (mut dx, mut dgamma, mut dbeta) = (Vec::new(), vec![0.0; cols], vec![0.0; cols]);
    for ((row, dy), &(mean, rstd)) in x.chunks(cols).zip(dy.chunks(cols)).zip(stats) {
        let xhat: Vec<f64> = row.iter().map(|&v| (v - mean) * rstd).collect();
        let dxhat: Vec<f64> = (0..cols).map(|c| dy[c] * gamma[c]).collect();
        let m1 = dxhat.iter().sum::<f64>() / n;
        let m2 = (0..cols).map(|c| dxhat[c] * xhat[c]).sum::<f64>() / n;
        for c in 0..cols {
            dx.push(rstd * (dxhat[c] - m1 - xhat[c] * m2));
            dgamma[c] += dy[c] * xhat[c];
            dbeta[c] += dy[c];
        }
    }
    [dx, dgamma, dbeta]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    /// dgamma and dbeta into strided targets at offsets of one buffer (every third element from
    /// 1 and from 2, 0.5 beforehand), written, added into or not asked for, each with and
    /// without dx: against f64, the elements around the targets untouched, two dispatches.
    #[test]
    fn parameter_gradients_into_strided_targets_in_every_mode() {
        let modes = [None, Some(false), Some(true)]; // none, written, added into
        {
            let dev = Device::new().expect("a device (lavapipe without a GPU)");
            // (rows, C): 2 chunks in one group; 19 chunks in 4 groups, C past 1024.
            for (rows, cols) in [(3, 5), (37, 1030)] {
                let fill = |n: usize, k: usize| -> Vec<f32> {
                    (0..n)
                        .map(|i| ((i * k % 97) as f32 - 48.0) / 40.0)
                        .collect()
                };
                let (x, gamma, dy) = (fill(rows * cols, 31), fill(cols, 7), fill(rows * cols, 13));
                let stats: Vec<(f32, f32)> = x
                    .chunks(cols)
                    .map(|r| (r.iter().sum::<f32>() / cols as f32, 0.5 + r[0].abs()))
                    .collect();
                let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
                let stats64: Vec<(f64, f64)> =
                    stats.iter().map(|&(m, r)| (m as f64, r as f64)).collect();
                let want = backward_reference(&f64s(&x), &f64s(&gamma), &f64s(&dy), &stats64);
                let upload = |v: &[f32], shape: &[usize]| {
                    Tensor::from_slice(&dev, v, shape).expect("upload")
                };
                let (mean, rstd): (Vec<f32>, Vec<f32>) = stats.iter().copied().unzip();
                let bw = LayerNormBackward {
                    x: upload(&x, &[rows, cols]),
                    gamma: upload(&gamma, &[cols]),
                    mean: upload(&mean, &[rows]),
                    rstd: upload(&rstd, &[rows]),
                };
                let dy = upload(&dy, &[rows, cols]);
                for g_mode in modes {
                    for b_mode in modes {
                        if g_mode.is_none() && b_mode.is_none() {
                            continue;
                        }
                        for with_dx in [false, true] {
                            let what = format!(
                                "{rows}x{cols}, dgamma {g_mode:?}, dbeta {b_mode:?}, dx {with_dx}"
                            );
                            let both = upload(&vec![0.5; 3 * cols + 1], &[3 * cols + 1]);
                            let column = |k: usize| {
                                both.narrow(0, 1, 3 * cols)
                                    .and_then(|t| t.reshape(&[cols, 3]))
                                    .and_then(|t| t.narrow(1, k, 1))
                                    .and_then(|t| t.squeeze(1))
                                    .expect("a strided view")
                            };
                            let (gt, bt) = (column(0), column(1));
                            let out = |t, m: Option<bool>| match m {
                                None => None,
                                Some(false) => Some(Out::Write(t)),
                                Some(true) => Some(Out::Acc(t)),
                            };
                            let dx_out = with_dx.then_some(Out::New);
                            dev.sync().expect("sync");
                            let before = dev.counters().dispatches;
                            let [dx, _, _] = bw
                                .grads(&dy, [dx_out, out(&gt, g_mode), out(&bt, b_mode)])
                                .expect("the backward");
                            dev.sync().expect("sync");
                            let count = dev.counters().dispatches - before;
                            assert_eq!(count, 2, "{what}");
                            let got = both.to_vec().expect("read back");
                            for (k, (m, want)) in [(g_mode, &want[1]), (b_mode, &want[2])]
                                .into_iter()
                                .enumerate()
                            {
                                for c in 0..cols {
                                    let w = match m {
                                        None => 0.5,
                                        Some(false) => want[c],
                                        Some(true) => 0.5 + want[c],
                                    };
                                    let g = got[1 + 3 * c + k] as f64;
                                    assert!(
                                        (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                                        "{what}: target {k} [{c}]: got {g}, want {w}"
                                    );
                                }
                            }
                            for (i, &v) in got.iter().enumerate() {
                                if i == 0 || i % 3 == 0 {
                                    assert_eq!(v, 0.5, "{what}: element {i} around the targets");
                                }
                            }
                            if let Some(dx) = dx {
                                let dx = dx.to_vec().expect("read back");
                                for (i, (&g, &w)) in dx.iter().zip(&want[0]).enumerate() {
                                    assert!(
                                        (g as f64 - w).abs() <= 1e-4 * w.abs().max(1.0),
                                        "{what}: dx [{i}]: got {g}, want {w}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
