//! LayerNorm over the last dim, fused. The forward is one dispatch that also saves mean and
//! rstd, and stores y as f32 or (`layer_norm_as`) f16 for a matmul that reads f16 operands: the
//! statistics and the normalization are f32 either way. The backward is two dispatches from
//! the saved statistics (never recomputed): one workgroup per chunk of rows computes each
//! row's dx and the chunk's partial dgamma and dbeta into a scratch, then one dispatch sums
//! the partials into both parameter gradients, each written into its target as its `Out`
//! says (overwritten or added into). dy may be f32 or f16 (an f16 gradient where the consumer
//! made one); dx, dgamma, dbeta are f32.
//! `layer_norm_unfused` is the same function in existing ops: the reference tests compare.
//!
//! Shapes: x (..., C) seen as (rows, C); gamma, beta (C); mean, rstd (rows).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::kernels::layernorm::{self, LayerNormParams, Write};
use crate::ops::elementwise::launch_copy;
use crate::ops::Out;

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

/// (chunks, rows per chunk) of the backward over `rows` rows when it sums dgamma and dbeta.
/// `WGRAD_LN_CHUNKS=MAX,MIN_ROWS` overrides the two constants (a measurement switch).
fn chunks(rows: usize) -> (usize, usize) {
    static LIMITS: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    let &(max_chunks, min_rows) = LIMITS.get_or_init(|| {
        std::env::var("WGRAD_LN_CHUNKS")
            .ok()
            .and_then(|v| {
                let (a, b) = v.split_once(',')?;
                Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
            })
            .filter(|&(a, b): &(usize, usize)| a >= 1 && b >= 1)
            .unwrap_or((MAX_CHUNKS, MIN_CHUNK_ROWS))
    });
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
fn rows_cols(x: &Tensor) -> (usize, usize) {
    let cols = x.shape().last().copied().unwrap_or(1);
    // No columns: no rows either.
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    (rows, cols)
}

impl Backward for LayerNormBackward {
    fn name(&self) -> &'static str {
        OP
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        // The kernels read dy as contiguous rows (a broadcast gradient, e.g. from a mean,
        // costs one copy here).
        let dy = g.contiguous()?;
        let (need_gamma, need_beta) = (ctx.needed(1), ctx.needed(2));
        let partial = if need_gamma || need_beta {
            let (rows, cols) = rows_cols(&self.x);
            let n_chunks = chunks(rows).0;
            Some(Tensor::uninit(
                self.x.device(),
                &[2, n_chunks, cols],
                DType::F32,
                OP,
            )?)
        } else {
            None
        };
        if ctx.needed(0) {
            ctx.put_with(0, |out| self.dx(&dy, out, partial.as_ref()))?;
        } else if let Some(partial) = &partial {
            self.launch(&dy, None, Some(partial));
        }
        let Some(partial) = partial else {
            return Ok(());
        };
        match (need_gamma, need_beta) {
            (true, true) => ctx.put_pair_with(1, 2, |g, b| {
                let [g, b] = self.param_sums(&partial, Some(g), Some(b))?;
                Ok((
                    g.expect("dgamma was asked for"),
                    b.expect("dbeta was asked for"),
                ))
            }),
            (true, false) => ctx.put_with(1, |g| {
                let [g, _] = self.param_sums(&partial, Some(g), None)?;
                Ok(g.expect("dgamma was asked for"))
            }),
            _ => ctx.put_with(2, |b| {
                let [_, b] = self.param_sums(&partial, None, Some(b))?;
                Ok(b.expect("dbeta was asked for"))
            }),
        }
    }
}

impl LayerNormBackward {
    /// dx, written per `out`, and the chunks' partial dgamma and dbeta into `partial` where
    /// given: one dispatch.
    fn dx(&self, dy: &Tensor, out: Out<'_>, partial: Option<&Tensor>) -> Result<Tensor> {
        let x = &self.x;
        let mut inputs = vec![dy, x, &self.gamma, &self.mean, &self.rstd];
        inputs.extend(partial);
        let (target, acc) = out.resolve(OP, x.device(), x.shape(), &inputs)?;
        if !target.is_contiguous() {
            // The kernel writes contiguous rows: compute into a new tensor, then copy it in.
            let fresh = self.dx(dy, Out::New, partial)?;
            let out = if acc {
                Out::Acc(&target)
            } else {
                Out::Write(&target)
            };
            return launch_copy(&fresh, out);
        }
        self.launch(dy, Some((&target, acc)), partial);
        Ok(target)
    }

    /// The backward kernel: dx into `dx` (contiguous; added into where its flag says) and the
    /// (2, n_chunks, C) partial sums into `partial`, each where given. Without the partials,
    /// one row a workgroup.
    fn launch(&self, dy: &Tensor, dx: Option<(&Tensor, bool)>, partial: Option<&Tensor>) {
        let x = &self.x;
        let device = x.device();
        let (rows, cols) = rows_cols(x);
        let (n_chunks, chunk_rows) = match partial {
            Some(_) => chunks(rows),
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
            rows: rows as u32,
            cols: cols as u32,
            x_offset: x.layout().offset as u32,
            gamma_offset: self.gamma.layout().offset as u32,
            dy_offset: dy.layout().offset as u32,
            out_offset: dx_buf.layout().offset as u32,
            n_chunks: n_chunks as u32,
            chunk_rows: chunk_rows as u32,
            ..Default::default()
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

    /// Stage 2: dgamma and dbeta from the partials, each written per its `Out` (any stride)
    /// where given, in one dispatch.
    fn param_sums(
        &self,
        partial: &Tensor,
        dgamma: Option<Out<'_>>,
        dbeta: Option<Out<'_>>,
    ) -> Result<[Option<Tensor>; 2]> {
        let device = partial.device();
        let (n_chunks, cols) = (partial.shape()[1], partial.shape()[2]);
        let resolve = |out: Option<Out<'_>>| -> Result<Option<(Tensor, bool)>> {
            out.map(|o| o.resolve(OP, device, &[cols], &[partial]))
                .transpose()
        };
        let (g, b) = (resolve(dgamma)?, resolve(dbeta)?);
        let mode = |t: &Option<(Tensor, bool)>| t.as_ref().map_or(Write::None, |t| Write::of(t.1));
        let spec = layernorm::sum_spec(mode(&g), mode(&b));
        // A target not asked for is not touched: its binding gets the other.
        let (gt, bt) = match (&g, &b) {
            (Some((g, _)), Some((b, _))) => (g, b),
            (Some((g, _)), None) => (g, g),
            (None, Some((b, _))) => (b, b),
            (None, None) => return Ok([None, None]),
        };
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
            &spec,
            &params,
            &[gt.storage(), bt.storage(), partial.storage()],
            device.grid((cols as u64).div_ceil(layernorm::SUM_COLUMNS)),
        );
        Ok([g.map(|t| t.0), b.map(|t| t.0)])
    }
}

/// Checks the operands of a LayerNorm and returns C.
fn check_args(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<usize> {
    for t in [x, gamma, beta] {
        t.expect_dtype(OP, DType::F32)?;
        x.expect_same_device(OP, t)?;
    }
    let Some(&cols) = x.shape().last() else {
        return Err(Error::ShapeMismatch {
            op: OP,
            expected: "x of rank 1 or more, (..., C)".into(),
            got: vec![],
        });
    };
    for (name, t) in [("gamma", gamma), ("beta", beta)] {
        if t.shape() != [cols] {
            return Err(Error::ShapeMismatch {
                op: OP,
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
            op: OP,
            reason: format!("eps must be finite and non-negative, got {eps}"),
        });
    }
    if x.numel() > u32::MAX as usize {
        return Err(Error::InvalidArgument {
            op: OP,
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
        let gpu = device.gpu();
        match dtype {
            DType::F32 => {}
            DType::F16 if gpu.has(wgpu::Features::SHADER_F16) => {}
            DType::F16 => {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "an f16 output needs f16 in shaders (shader-f16), which {} lacks",
                        gpu.info.name
                    ),
                })
            }
            DType::U32 => {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    expected: DType::F32,
                    got: DType::U32,
                })
            }
        }
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
