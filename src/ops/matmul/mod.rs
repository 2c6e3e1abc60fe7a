//! Batched matmul: (..., M, K) @ (..., K, N) -> (..., M, N), batch dims broadcast. Transposed
//! operands are read through their strides; a broadcast batch that cannot be expressed as one
//! stride is materialized first.
//!
//! Here: the op, its backward and the checks on its operands. What kernel, tile and split a
//! product runs on is `plan`'s to decide (pure: tested without a GPU), what it records
//! `launch`'s.

mod launch;
pub mod plan;

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{broadcast_shape, coalesce_joint, DType, Device, Tensor};
use crate::kernels::matmul::{self, MatmulParams, OperandLayout};
use crate::kernels::matmul_coop::{self, Coop};
use crate::kernels::tuning::{self, rows_aligned, ProductKey, TileChoice};
use crate::ops::elementwise::launch_copy;
use crate::ops::{autocast, autocast_enabled, Out};

use plan::{EpilogueKind, Kernel, LabChoices, OutLayout, Plan, Product, Tables, Target};

/// What the matmul kernel applies to each product element before storing it.
#[derive(Clone, Copy)]
pub(crate) enum Epilogue<'a> {
    None,
    /// + bias[column].
    Bias(&'a Tensor),
    /// z = product + bias[column] stored to `pre`, gelu(z) stored to the output.
    BiasGelu {
        bias: &'a Tensor,
        pre: &'a Tensor,
    },
    /// The column sums of B (N, f32, contiguous) written into this tensor beside the product,
    /// added into it where the product is added into its output: the kernel takes A with one
    /// more row, of ones, and stores that row of C there (a linear's bias gradient with dW =
    /// x^T dz, one dispatch). A batched product, or one whose M the cooperative-matrix kernel
    /// cannot extend (M not a multiple of 8), sums B by a reduction instead.
    BColumnSums(&'a Tensor),
    /// Adds bias[column] and residual[row, column]: a linear whose output a block adds to its
    /// residual stream, a contiguous f32 tensor of the output's shape (batch 1; the output
    /// written, not added into).
    BiasResidual {
        bias: &'a Tensor,
        residual: &'a Tensor,
    },
}

/// dA = g B^T and dB = A^T g, each written into its gradient by the matmul kernel (accumulate
/// on for a later contribution), then summed over any batch dims the operand was broadcast on.
/// `half`: the forward ran under autocast, so the backward products do too.
struct MatmulBackward {
    a: Tensor,
    b: Tensor,
    half: bool,
}

impl Backward for MatmulBackward {
    fn name(&self) -> &'static str {
        "matmul"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        autocast(self.half, || {
            if ctx.needed(0) {
                let bt = self.b.t()?;
                put_product(ctx, 0, g, &bt, self.a.shape())?;
            }
            if ctx.needed(1) {
                let at = self.a.t()?;
                put_product(ctx, 1, &at, g, self.b.shape())?;
            }
            Ok(())
        })
    }
}

fn put_product(
    ctx: &mut BackwardCtx<'_>,
    i: usize,
    l: &Tensor,
    r: &Tensor,
    shape: &[usize],
) -> Result<()> {
    let mut full = broadcast_shape(
        "matmul",
        &l.shape()[..l.rank() - 2],
        &r.shape()[..r.rank() - 2],
    )?;
    full.extend([l.shape()[l.rank() - 2], r.shape()[r.rank() - 1]]);
    ctx.put_summed_to(i, shape, &full, |out| l.matmul_into(r, out))
}

/// Whether a product of these operands runs in f16: under autocast, or when an operand is
/// stored as f16.
pub(crate) fn half_precision(a: &Tensor, b: &Tensor) -> bool {
    autocast_enabled() || a.dtype() == DType::F16 || b.dtype() == DType::F16
}

fn expect_float(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() == DType::F16 {
        Ok(())
    } else {
        t.expect_dtype(op, DType::F32)
    }
}

/// What `device`'s adapter and options allow a product (`plan::Target`).
pub fn target(device: &Device) -> Target {
    let limits = &device.gpu().limits;
    let lab = &device.options().lab;
    Target {
        coop: Coop::available(device.gpu()),
        f32_tensor_cores: device.f32_on_tensor_cores(),
        split_in_one_dispatch: device.split_in_one_dispatch(),
        max_workgroup_bytes: limits.max_compute_workgroup_storage_size,
        max_lanes: limits.max_compute_invocations_per_workgroup,
        max_binding: limits.max_storage_buffer_binding_size,
        lab: LabChoices {
            coop_tile: lab.coop_tile(),
            matmul_tile: lab.matmul_tile(),
            split_target: lab.split_target(),
            split_max: lab.split_max(),
            split_tail: lab.split_tail(),
        },
    }
}

/// The device's tile table (and a search's forced tile and split), as the plan asks for it.
impl Tables for Device {
    fn tile(&self, key: &ProductKey) -> Option<TileChoice> {
        self.tile_for(key)
    }
    fn split(&self, key: &ProductKey) -> Option<u32> {
        self.split_for(key)
    }
}

/// The tile the shape heuristics choose for a product of `key` (no measurement).
pub fn heuristic_tile(dev: &Device, key: &ProductKey) -> TileChoice {
    target(dev).heuristic_tile(key)
}

/// The tiles a search measures for a product of `key` (those its kernel can run here).
pub fn candidate_tiles(dev: &Device, key: &ProductKey) -> Vec<TileChoice> {
    let t = target(dev);
    let all: Vec<TileChoice> = match t.coop_for(key) {
        Some(_) => matmul_coop::SEARCH_TILES
            .iter()
            .map(|t| TileChoice::Coop(*t))
            .collect(),
        None => tuning::tiled_search_tiles()
            .into_iter()
            .map(TileChoice::Tiled)
            .collect(),
    };
    all.into_iter().filter(|c| t.runs(key, *c)).collect()
}

/// The most ranges of K an M x N product may split into: its f32 partial products (S, M, N)
/// fit one storage binding (at least 1).
pub fn max_splits(dev: &Device, m: usize, n: usize) -> usize {
    target(dev).max_splits(m, n)
}

/// The kernel variant a product runs on, as benchmarks print it (with the measured number of
/// K ranges, where the tile table holds one).
pub fn matmul_variant(device: &Device, key: &ProductKey) -> String {
    let t = target(device);
    let kernel = match t.kernel(key, device) {
        Kernel::Coop {
            coop,
            tile,
            x3: true,
        } => format!("{} x3", tile.describe(coop.fs)),
        Kernel::Coop { coop, tile, .. } => tile.describe(coop.fs),
        Kernel::Tiled(tile) => format!(
            "tiled {}{}",
            tile.name(),
            if key.half { " f16" } else { "" }
        ),
    };
    match t.measured_split(key, device) {
        Some(s) if !key.gelu && key.batch == 1 => format!("{kernel} split {s}"),
        _ => kernel,
    }
}

impl Tensor {
    /// The product (f32 out; f16 operands or autocast make it a mixed-precision product).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let out = self.matmul_into(other, Out::New)?;
        Ok(record(out, &[self, other], || MatmulBackward {
            a: self.detach(),
            b: other.detach(),
            half: half_precision(self, other),
        }))
    }

    /// The product written per `out` (f32 when new); an output view whose batch dims do not
    /// merge into one stride gets the product through a copy.
    pub(crate) fn matmul_into(&self, other: &Tensor, out: Out<'_>) -> Result<Tensor> {
        self.matmul_epilogue_into(other, Epilogue::None, out, DType::F32)
    }

    /// `Epilogue::BColumnSums` where the kernel cannot extend A: the column sums of `other` into
    /// `sums` by a reduction, then the plain product into `out`; both added into (`acc`) or
    /// written.
    fn product_and_reduced_sums(
        &self,
        other: &Tensor,
        sums: &Tensor,
        (out, acc): (&Tensor, bool),
        out_dtype: DType,
    ) -> Result<Tensor> {
        let target = |t| if acc { Out::Acc(t) } else { Out::Write(t) };
        let n = other.shape()[other.rank() - 1];
        other.detach().sum_to_shape_into(&[n], target(sums))?;
        self.matmul_epilogue_into(other, Epilogue::None, target(out), out_dtype)
    }

    /// The product with `epilogue` applied inside the matmul kernel, written per `out` (a new
    /// output has element type `new_dtype`, f32 or f16: the cast is the kernel's store).
    pub(crate) fn matmul_epilogue_into(
        &self,
        other: &Tensor,
        epilogue: Epilogue<'_>,
        out: Out<'_>,
        new_dtype: DType,
    ) -> Result<Tensor> {
        const OP: &str = "matmul";
        expect_float(OP, self)?;
        expect_float(OP, other)?;
        self.expect_same_device(OP, other)?;
        let out_dtype = match out {
            Out::New => new_dtype,
            Out::Write(t) | Out::Acc(t) => t.dtype(),
        };
        if out_dtype == DType::U32 {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: DType::F32,
                got: DType::U32,
            });
        }
        if self.rank() < 2 || other.rank() < 2 {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: "operands of rank 2 or more".into(),
                got: if self.rank() < 2 {
                    self.shape().to_vec()
                } else {
                    other.shape().to_vec()
                },
            });
        }
        let (m, k) = (self.shape()[self.rank() - 2], self.shape()[self.rank() - 1]);
        let (k2, n) = (
            other.shape()[other.rank() - 2],
            other.shape()[other.rank() - 1],
        );
        if k != k2 {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!(
                    "a right operand with {k} rows for the left {:?}",
                    self.shape()
                ),
                got: other.shape().to_vec(),
            });
        }
        let batch_shape = broadcast_shape(
            OP,
            &self.shape()[..self.rank() - 2],
            &other.shape()[..other.rank() - 2],
        )?;
        let mut a_shape = batch_shape.clone();
        a_shape.extend([m, k]);
        let mut b_shape = batch_shape.clone();
        b_shape.extend([k, n]);
        let mut a = self.detach().broadcast_to(&a_shape)?;
        let mut b = other.detach().broadcast_to(&b_shape)?;
        let nb = batch_shape.len();
        let (mut bshape, mut bstrides) =
            coalesce_joint(&batch_shape, &[&a.strides()[..nb], &b.strides()[..nb]]);
        if bshape.len() > 1 {
            // The batch dims of one operand do not merge into one stride: copy both.
            a = a.contiguous()?;
            b = b.contiguous()?;
            (bshape, bstrides) =
                coalesce_joint(&batch_shape, &[&a.strides()[..nb], &b.strides()[..nb]]);
        }
        let batch = bshape.first().copied().unwrap_or(1);
        let (a_bs, b_bs) = (
            bstrides[0].first().copied().unwrap_or(0),
            bstrides[1].first().copied().unwrap_or(0),
        );
        let mut out_shape = batch_shape.clone();
        out_shape.extend([m, n]);
        let (out, acc) =
            out.resolve_typed(OP, self.device(), &out_shape, &[self, other], out_dtype)?;
        if let (Epilogue::BColumnSums(sums), true) = (epilogue, out.numel() == 0 || k == 0) {
            // Nothing to extend (zeros over no rows).
            return self.product_and_reduced_sums(other, sums, (&out, acc), out_dtype);
        }
        if out.numel() == 0 {
            return Ok(out);
        }
        if k == 0 {
            if !acc {
                out.fill_(0.0)?;
            }
            return Ok(out);
        }
        let (cshape, cstrides) = coalesce_joint(&batch_shape, &[&out.strides()[..nb]]);
        if cshape.len() > 1 {
            let fresh = self.matmul_epilogue_into(other, epilogue, Out::New, out_dtype)?;
            return launch_copy(
                &fresh,
                if acc {
                    Out::Acc(&out)
                } else {
                    Out::Write(&out)
                },
            );
        }
        let c_bs = cstrides[0].first().copied().unwrap_or(0);
        let checked = check_epilogue(epilogue, (&out, acc), (&a, &b), batch, n)?;
        let max_groups = self
            .device()
            .gpu()
            .limits
            .max_compute_workgroups_per_dimension as usize;
        if batch > max_groups {
            return Err(Error::TooManyWorkgroups {
                what: format!("matmul over a batch of {batch}"),
                count: batch as u64,
                limit: max_groups as u64,
            });
        }
        let layout = |t: &Tensor, rows, cols, bs| OperandLayout {
            dtype: t.dtype(),
            offset: t.layout().offset,
            batch_stride: bs,
            batch,
            rows,
            row_stride: t.strides()[t.rank() - 2],
            cols,
            col_stride: t.strides()[t.rank() - 1],
            bound_elements: t.storage().bound_bytes() as usize / t.dtype().size(),
        };
        // A's rows as stored (with column sums the kernels take one more, of ones).
        let (a_layout, b_layout) = (layout(&a, m, k, a_bs), layout(&b, k, n, b_bs));
        let cr = out.rank();
        let product = Product {
            m,
            n,
            k,
            batch,
            types: matmul::Types {
                a: a.dtype(),
                b: b.dtype(),
                c: out.dtype(),
                half: half_precision(&a, &b),
            },
            a: a_layout,
            b: b_layout,
            c: OutLayout {
                dtype: out.dtype(),
                offset: out.layout().offset,
                batch_stride: c_bs,
                row_stride: out.strides()[cr - 2],
                col_stride: out.strides()[cr - 1],
                bound: out.storage().bound_bytes() as usize / out.dtype().size(),
            },
            acc,
            epilogue: checked.kind,
            aligned: [&a, &b, &out]
                .iter()
                .all(|t| rows_aligned(t.layout().offset, t.shape(), t.strides())),
        };
        let dev = self.device();
        let run = match plan::plan(&product, &target(dev), dev) {
            Plan::SumsByReduction => {
                let sums = checked.sums.expect("column sums were asked for");
                return self.product_and_reduced_sums(other, sums, (&out, acc), out_dtype);
            }
            Plan::ResidualByAdd => {
                let (bias, residual) = checked.bias_residual.expect("a residual product");
                let y = self.matmul_epilogue_into(
                    other,
                    Epilogue::Bias(bias),
                    Out::Write(&out),
                    out_dtype,
                )?;
                launch_copy(residual, Out::Acc(&y))?;
                return Ok(out);
            }
            Plan::Run(run) => run,
        };
        let params = MatmulParams {
            m: m as u32,
            n: n as u32,
            k: k as u32,
            batch: batch as u32,
            a_off: a_layout.offset as u32,
            a_bs: a_bs as u32,
            a_ms: a_layout.row_stride as u32,
            a_ks: a_layout.col_stride as u32,
            b_off: b_layout.offset as u32,
            b_bs: b_bs as u32,
            b_ks: b_layout.row_stride as u32,
            b_ns: b_layout.col_stride as u32,
            c_off: product.c.offset as u32,
            c_bs: c_bs as u32,
            c_ms: product.c.row_stride as u32,
            c_ns: product.c.col_stride as u32,
            bias_off: 0,
            k_split: 0,
            res_off: 0,
            scale_off: 0,
        };
        let bias = checked.bias.map(|b| b.contiguous()).transpose()?;
        let bound = launch::Bound {
            a: &a,
            b: &b,
            a_layout,
            b_layout,
            out: &out,
            bias: bias.as_ref(),
            sums: checked.sums,
            residual: checked.bias_residual.map(|(_, r)| r),
            pre: checked.pre,
        };
        launch::record(dev, &run, &bound, params)?;
        Ok(out)
    }
}

/// An epilogue's tensors, checked against the product: the plan's view of it, and what the
/// kernels bind.
struct CheckedEpilogue<'a> {
    kind: EpilogueKind,
    bias: Option<&'a Tensor>,
    sums: Option<&'a Tensor>,
    bias_residual: Option<(&'a Tensor, &'a Tensor)>,
    pre: Option<&'a Tensor>,
}

/// Checks `epilogue`'s tensors against a product of `batch` matrices with `n` columns into
/// `out` (added into where `acc`) from `a` and `b`.
fn check_epilogue<'a>(
    epilogue: Epilogue<'a>,
    (out, acc): (&Tensor, bool),
    (a, b): (&Tensor, &Tensor),
    batch: usize,
    n: usize,
) -> Result<CheckedEpilogue<'a>> {
    let bias = match epilogue {
        Epilogue::None | Epilogue::BColumnSums(_) => None,
        Epilogue::Bias(bias)
        | Epilogue::BiasGelu { bias, .. }
        | Epilogue::BiasResidual { bias, .. } => {
            if bias.shape() != [n] {
                return Err(Error::ShapeMismatch {
                    op: "linear",
                    expected: format!("a bias of shape [{n}]"),
                    got: bias.shape().to_vec(),
                });
            }
            Some(bias)
        }
    };
    let mut checked = CheckedEpilogue {
        kind: EpilogueKind::None,
        bias,
        sums: None,
        bias_residual: None,
        pre: None,
    };
    match epilogue {
        Epilogue::None => {}
        Epilogue::Bias(_) => checked.kind = EpilogueKind::Bias,
        Epilogue::BColumnSums(sums) => {
            if sums.shape() != [n] || sums.dtype() != DType::F32 || !sums.is_contiguous() {
                return Err(Error::InvalidArgument {
                    op: "matmul",
                    reason: format!(
                        "column sums go into a contiguous f32 tensor of shape [{n}], not {:?} {:?}",
                        sums.dtype(),
                        sums.shape()
                    ),
                });
            }
            checked.kind = EpilogueKind::ColumnSums;
            checked.sums = Some(sums);
        }
        Epilogue::BiasGelu { pre, .. } => {
            if pre.shape() != out.shape()
                || !pre.is_contiguous()
                || pre.layout().offset != 0
                || !matches!(pre.dtype(), DType::F32 | DType::F16)
            {
                return Err(Error::InvalidArgument {
                    op: "linear",
                    reason: "the pre-activation buffer must be a new contiguous f32 or f16 \
                             tensor of the output's shape"
                        .into(),
                });
            }
            checked.kind = EpilogueKind::BiasGelu {
                pre_f16: pre.dtype() == DType::F16,
            };
            checked.pre = Some(pre);
        }
        Epilogue::BiasResidual { bias, residual } => {
            if residual.shape() != out.shape()
                || residual.dtype() != DType::F32
                || !residual.is_contiguous()
                || batch != 1
                || acc
                || !out.is_contiguous()
                || residual.storage().buffer_id() == out.storage().buffer_id()
            {
                return Err(Error::InvalidArgument {
                    op: "linear",
                    reason: format!(
                        "a residual is added to a new or overwritten contiguous output of one \
                         product, from a contiguous f32 tensor of its shape {:?} in another \
                         buffer, not {:?} {:?}",
                        out.shape(),
                        residual.dtype(),
                        residual.shape()
                    ),
                });
            }
            let id = residual.storage().buffer_id();
            checked.kind = EpilogueKind::BiasResidual {
                offset: residual.layout().offset,
                bound: residual.storage().bound_bytes() as usize / 4,
                shared: [a, b, bias].iter().any(|t| t.storage().buffer_id() == id),
            };
            checked.bias_residual = Some((bias, residual));
        }
    }
    Ok(checked)
}

/// Outputs a lane of a split tile's last range sums at once (SPLIT_CHUNK in
/// matmul_split_tail.wgsl): a pass over them waits about one load's latency a range.
pub const SPLIT_CHUNK: u32 = 8;

/// The most load latencies (ranges times passes over the tile) the sum a split tile's last
/// range runs in the product's own dispatch may wait; a longer sum goes to a second dispatch,
/// whose workgroups share it (the LM head's dX at 4 x 128 splits 16 ways on tiles of 4 passes).
/// A `lab` build's `WGRAD_SPLIT_TAIL=N` sets it.
pub const SPLIT_TAIL_STEPS: usize = 16;

#[cfg(test)]
mod tests;
