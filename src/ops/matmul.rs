//! Batched matmul: (..., M, K) @ (..., K, N) -> (..., M, N), batch dims broadcast. Transposed
//! operands are read through their strides; a broadcast batch that cannot be expressed as one
//! stride is materialized first.

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::SPLIT_TICKETS;
use crate::graph::{broadcast_shape, coalesce_joint, DType, Device, Storage, Tensor};
use crate::kernels::matmul::{self, MatmulParams, SplitEpilogue};
use crate::kernels::matmul_coop;
use crate::kernels::tuning::{self, rows_aligned, ProductKey, TileChoice};
use crate::ops::elementwise::launch_copy;
use crate::ops::{autocast, autocast_enabled, Out};

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

/// The kernel a product runs on.
enum Choice {
    Coop(matmul_coop::Coop, matmul_coop::CoopTile),
    Tiled(matmul::Tile),
}

/// Whether a product of `key` (f32 operands, not mixed precision) runs as an X3 product on
/// the adapter's cooperative matrices.
fn x3(dev: &Device, key: &ProductKey) -> bool {
    !key.half && !key.a_f16 && !key.b_f16 && dev.f32_on_tensor_cores()
}

/// The cooperative matrices a product of `key` runs on: the adapter's, for a mixed-precision
/// product, and for an f32 one as three f16 products (`x3`).
fn coop_for(dev: &Device, key: &ProductKey) -> Option<matmul_coop::Coop> {
    matmul_coop::Coop::available(dev.gpu()).filter(|_| key.half || x3(dev, key))
}

/// Whether `tile` suits the kernel a product of `key` runs on and fits the adapter.
fn runs(dev: &Device, key: &ProductKey, tile: TileChoice) -> bool {
    let limits = &dev.gpu().limits;
    match (tile, coop_for(dev, key)) {
        (TileChoice::Coop(t), Some(coop)) => t.valid(
            coop,
            limits.max_compute_workgroup_storage_size,
            x3(dev, key),
        ),
        (TileChoice::Tiled(t), None) => {
            t.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
                && t.lanes() <= limits.max_compute_invocations_per_workgroup
        }
        _ => false,
    }
}

/// The tile the shape heuristics choose for a product of `key` (no measurement).
pub fn heuristic_tile(dev: &Device, key: &ProductKey) -> TileChoice {
    let (m, n, batch) = (key.m as usize, key.n as usize, key.batch as usize);
    // A `lab` build's forced tile (`WGRAD_COOP_TILE`, `WGRAD_MATMUL_TILE`), where it runs.
    let lab = &dev.options().lab;
    let forced = match coop_for(dev, key) {
        Some(_) => lab.coop_tile().map(TileChoice::Coop),
        None => lab.matmul_tile().map(TileChoice::Tiled),
    };
    if let Some(t) = forced.filter(|t| runs(dev, key, *t)) {
        return t;
    }
    match coop_for(dev, key) {
        Some(coop) => TileChoice::Coop(matmul_coop::choose_tile(
            m,
            n,
            batch,
            coop,
            dev.gpu().limits.max_compute_workgroup_storage_size,
            x3(dev, key),
        )),
        None => TileChoice::Tiled(matmul::choose_tile(m, n, batch)),
    }
}

/// The tiles a search measures for a product of `key` (those its kernel can run here).
pub fn candidate_tiles(dev: &Device, key: &ProductKey) -> Vec<TileChoice> {
    let all: Vec<TileChoice> = match coop_for(dev, key) {
        Some(_) => matmul_coop::SEARCH_TILES
            .iter()
            .map(|t| TileChoice::Coop(*t))
            .collect(),
        None => tuning::tiled_search_tiles()
            .into_iter()
            .map(TileChoice::Tiled)
            .collect(),
    };
    all.into_iter().filter(|t| runs(dev, key, *t)).collect()
}

/// Cooperative matrices for a mixed-precision product where the adapter has them, else the
/// tiled kernel; the tile measured for the product on this adapter (`Device::tile_for`) when it
/// suits that kernel and fits, else the one the shape heuristics choose.
fn choose_kernel(dev: &Device, key: &ProductKey) -> Choice {
    let tile = dev
        .tile_for(key)
        .filter(|t| runs(dev, key, *t))
        .unwrap_or_else(|| heuristic_tile(dev, key));
    match (tile, coop_for(dev, key)) {
        (TileChoice::Coop(t), Some(coop)) => Choice::Coop(coop, t),
        (TileChoice::Tiled(t), _) => Choice::Tiled(t),
        (TileChoice::Coop(_), None) => unreachable!("heuristic and checked tiles suit the kernel"),
    }
}

/// The measured number of K ranges for a product of `key`, where the table's tile for it suits
/// the kernel it runs on here (a table searched for the tiled f32 kernel does not speak for an
/// X3 product).
fn measured_split(dev: &Device, key: &ProductKey) -> Option<u32> {
    match dev.tile_for(key) {
        Some(t) if !runs(dev, key, t) => None,
        _ => dev.split_for(key),
    }
}

/// The most ranges of K an M x N product may split into: its f32 partial products (S, M, N)
/// fit one storage binding (at least 1).
pub fn max_splits(dev: &Device, m: usize, n: usize) -> usize {
    let limit = dev.gpu().limits.max_storage_buffer_binding_size as usize;
    (limit / (4 * m * n).max(1)).max(1)
}

/// The kernel variant a product runs on, as benchmarks print it (with the measured number of
/// K ranges, where the tile table holds one).
pub fn matmul_variant(device: &Device, key: &ProductKey) -> String {
    let kernel = match choose_kernel(device, key) {
        Choice::Coop(coop, tile) if x3(device, key) => format!("{} x3", tile.describe(coop.fs)),
        Choice::Coop(coop, tile) => tile.describe(coop.fs),
        Choice::Tiled(tile) => format!(
            "tiled {}{}",
            tile.name(),
            if key.half { " f16" } else { "" }
        ),
    };
    match measured_split(device, key) {
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
        let cr = out.rank();
        let sums = match epilogue {
            Epilogue::BColumnSums(sums) => {
                if sums.shape() != [n] || sums.dtype() != DType::F32 || !sums.is_contiguous() {
                    return Err(Error::InvalidArgument {
                        op: OP,
                        reason: format!(
                            "column sums go into a contiguous f32 tensor of shape [{n}], not {:?} {:?}",
                            sums.dtype(),
                            sums.shape()
                        ),
                    });
                }
                Some(sums)
            }
            _ => None,
        };
        let residual = match epilogue {
            Epilogue::BiasResidual { residual, .. } => {
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
                            "a residual is added to a new or overwritten contiguous output of \
                             one product, from a contiguous f32 tensor of its shape {:?} in \
                             another buffer, not {:?} {:?}",
                            out.shape(),
                            residual.dtype(),
                            residual.shape()
                        ),
                    });
                }
                Some(residual)
            }
            _ => None,
        };
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
        let (ar, br) = (a.rank(), b.rank());
        let params = MatmulParams {
            m: m as u32,
            n: n as u32,
            k: k as u32,
            batch: batch as u32,
            a_off: a.layout().offset as u32,
            a_bs: a_bs as u32,
            a_ms: a.strides()[ar - 2] as u32,
            a_ks: a.strides()[ar - 1] as u32,
            b_off: b.layout().offset as u32,
            b_bs: b_bs as u32,
            b_ks: b.strides()[br - 2] as u32,
            b_ns: b.strides()[br - 1] as u32,
            c_off: out.layout().offset as u32,
            c_bs: c_bs as u32,
            c_ms: out.strides()[cr - 2] as u32,
            c_ns: out.strides()[cr - 1] as u32,
            bias_off: 0,
            k_split: 0,
            res_off: 0,
            scale_off: 0,
        };
        let types = matmul::Types {
            a: a.dtype(),
            b: b.dtype(),
            c: out.dtype(),
            half: half_precision(&a, &b),
        };
        let key = ProductKey {
            m: m as u32,
            n: n as u32,
            k: k as u32,
            batch: batch as u32,
            half: types.half,
            a_f16: types.a == DType::F16,
            b_f16: types.b == DType::F16,
            a_t: params.a_ms == 1 && params.a_ks != 1,
            b_t: params.b_ks == 1 && params.b_ns != 1,
            // Column sums run the plain product with one more row: its measured tile serves.
            bias: matches!(
                epilogue,
                Epilogue::Bias(_) | Epilogue::BiasGelu { .. } | Epilogue::BiasResidual { .. }
            ),
            gelu: matches!(epilogue, Epilogue::BiasGelu { .. }),
            residual: matches!(epilogue, Epilogue::BiasResidual { .. }),
            aligned: [&a, &b, &out]
                .iter()
                .all(|t| rows_aligned(t.layout().offset, t.shape(), t.strides())),
        };
        let dev = self.device();
        // The tiled kernel's residual entry point tunes apart from its bias one, and so does
        // an X3 product's (it stores no tiles straight from its accumulators, so its residual
        // products run the residual epilogue). The mixed-precision cooperative-matrix kernel
        // runs some residual products as bias products and a copy (below), so there the bias
        // product's entry serves. (A table without residual entries serves them with their
        // bias entries.)
        let key = ProductKey {
            residual: key.residual && (coop_for(dev, &key).is_none() || x3(dev, &key)),
            ..key
        };
        let choice = choose_kernel(dev, &key);
        // GELU's pre-activation stored f16 (under autocast: its gradient reads it as f16).
        let pre_f16 =
            matches!(epilogue, Epilogue::BiasGelu { pre, .. } if pre.dtype() == DType::F16);
        let on_x3 = matches!(choice, Choice::Coop(..)) && x3(dev, &key);
        if let Some(sums) = sums {
            if batch != 1 || (matches!(choice, Choice::Coop(..)) && !m.is_multiple_of(8)) {
                return self.product_and_reduced_sums(other, sums, (&out, acc), out_dtype);
            }
        }
        // With column sums the kernels run one more row of A (ones) and of C (the sums).
        let m_run = m + sums.is_some() as usize;
        let (bm, bn, bk) = match choice {
            Choice::Coop(coop, t) => (t.bm(coop.fs), t.bn(coop.fs), t.bk),
            Choice::Tiled(t) => (t.bm, t.bn, t.bk),
        };
        let tiles = m_run.div_ceil(bm as usize) * n.div_ceil(bn as usize) * batch;
        // The bias (N) a bias epilogue adds, contiguous.
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
                Some(bias.contiguous()?)
            }
        };
        // Too few workgroups over a long K: ranges of K in workgroups of their own, partial
        // products summed in the same dispatch by each tile's last range or by a second
        // kernel, either adding a bias product's bias and residual (plain, bias and residual
        // products; batch 1; GELU's epilogue does not split).
        let split = match epilogue {
            Epilogue::None
            | Epilogue::Bias(_)
            | Epilogue::BColumnSums(_)
            | Epilogue::BiasResidual { .. }
                if batch == 1 =>
            {
                match measured_split(dev, &key) {
                    // Measured (or forced by a search): at most one range a K step.
                    Some(s) => (s as usize).clamp(1, k.div_ceil(bk as usize)),
                    None => {
                        let target = dev.options().lab.split_target();
                        matmul::split_k(tiles, k, target.unwrap_or(matmul::SPLIT_TARGET_GROUPS))
                    }
                }
                .min(max_splits(dev, m_run, n))
                .min(dev.options().lab.split_max().unwrap_or(usize::MAX))
            }
            _ => 1,
        };
        // Ranges a whole number of K steps long (so vector units stay aligned).
        let k_split = k.div_ceil(split).next_multiple_of(bk as usize);
        let splits = k.div_ceil(k_split);
        let one_dispatch =
            split > 1 && sums_in_one_dispatch(dev, &choice, on_x3, (m_run, n), splits);
        // A residual product whose tiles the cooperative-matrix kernel could store straight
        // from its accumulators (unsplit, f32 C on 16-byte rows) is a bias product, and a
        // second dispatch adds the residual: the residual epilogue cost more than the add at
        // 8 x 512 --amp on an H200 (the step 23.21 / 23.26 -> 23.38 / 23.68 ms, 2026-11-25), and
        // no less with the tiles through the scratch on an H100 (16.83-16.97 ms against
        // 16.92-17.13, 2026-11-26; docs/decisions.md). Split, the sum adds it. So does a second dispatch for a residual in the
        // buffer of an operand or the bias: the epilogue binds it read-write (the kernels'
        // second output binding), and one dispatch may not use a buffer both ways.
        if let Epilogue::BiasResidual { bias, residual } = epilogue {
            let coop_direct = matches!(choice, Choice::Coop(..))
                && !x3(dev, &key)
                && split == 1
                && rows_on_16_bytes(out.dtype(), (params.c_off, params.c_ms, params.c_bs));
            let id = residual.storage().buffer_id();
            let shared = [&a, &b, bias].iter().any(|t| t.storage().buffer_id() == id);
            if coop_direct || shared {
                let y = self.matmul_epilogue_into(
                    other,
                    Epilogue::Bias(bias),
                    Out::Write(&out),
                    out_dtype,
                )?;
                launch_copy(residual, Out::Acc(&y))?;
                return Ok(out);
            }
        }
        // With a split summed by a second kernel the plain matmul kernel writes f32 partials
        // (no bias), the sum adds the bias and adds into or writes C.
        let (kernel_types, kernel_acc) = match split {
            _ if split == 1 || one_dispatch => (types, acc),
            _ => (
                matmul::Types {
                    c: DType::F32,
                    ..types
                },
                false,
            ),
        };
        let layout = |t: &Tensor, rows, cols, bs| matmul::OperandLayout {
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
        let (kernels, spec) = match choice {
            Choice::Coop(coop, tile) => {
                let a_access = a_layout.access();
                let b_access = b_layout.access();
                // C through the scratch tile, in vectors of 4 where C takes them (unsplit: a
                // split's partials are summed elsewhere).
                let c_store = if split == 1
                    && stores_vectors(
                        kernel_types.c,
                        &params,
                        (batch, m, n),
                        out.storage().bound_bytes() as usize / out.dtype().size(),
                    ) {
                    matmul_coop::CStore::Vec4
                } else {
                    matmul_coop::CStore::Elems
                };

                (
                    if on_x3 {
                        [
                            &matmul_coop::MATMUL_COOP_X3,
                            &matmul_coop::MATMUL_COOP_X3_BIAS,
                            &matmul_coop::MATMUL_COOP_X3_BIAS_GELU,
                            &matmul_coop::MATMUL_COOP_X3_SUMS,
                            &matmul_coop::MATMUL_COOP_X3_BIAS_RES,
                        ]
                    } else {
                        [
                            &matmul_coop::MATMUL_COOP,
                            &matmul_coop::MATMUL_COOP_BIAS,
                            &matmul_coop::MATMUL_COOP_BIAS_GELU,
                            &matmul_coop::MATMUL_COOP_SUMS,
                            &matmul_coop::MATMUL_COOP_BIAS_RES,
                        ]
                    },
                    {
                        let spec = matmul_coop::Variant {
                            ones: sums.is_some(),
                            x3: on_x3,
                            ablation: dev.options().lab.ablation(),
                            ..matmul_coop::Variant::new(
                                tile,
                                kernel_acc,
                                kernel_types,
                                coop,
                                (a_access, b_access),
                                c_store,
                            )
                        }
                        .spec();
                        // The vector epilogue's `pre` (GELU's pre-activation, new and
                        // contiguous from 0; or the residual, contiguous from res_off) in
                        // vectors too, where its rows start on vectors inside the binding.
                        let pre_rows_on_vectors = n.is_multiple_of(4)
                            && match (epilogue, residual) {
                                (Epilogue::BiasGelu { .. }, _) => true,
                                (_, Some(r)) => {
                                    let off = r.layout().offset;
                                    off.is_multiple_of(4)
                                        && off + m * n <= r.storage().bound_bytes() as usize / 4
                                }
                                _ => false,
                            };
                        let vectors = c_store == matmul_coop::CStore::Vec4
                            && coop.stores_vectors()
                            && pre_rows_on_vectors;
                        if vectors || pre_f16 {
                            matmul_coop::pre_binding(spec, vectors, pre_f16)
                        } else {
                            spec
                        }
                    },
                )
            }
            Choice::Tiled(tile) => (
                [
                    &matmul::MATMUL,
                    &matmul::MATMUL_BIAS,
                    &matmul::MATMUL_BIAS_GELU,
                    &matmul::MATMUL_SUMS,
                    &matmul::MATMUL_BIAS_RES,
                ],
                matmul::spec_ones(
                    tile,
                    kernel_acc,
                    kernel_types,
                    matmul::vector_reads(tile, &a_layout, &b_layout),
                    sums.is_some(),
                )
                .with_ty("PE", if pre_f16 { "f16" } else { "f32" }),
            ),
        };
        let groups = [
            n.div_ceil(bn as usize) as u32,
            m_run.div_ceil(bm as usize) as u32,
            batch as u32,
        ];
        let params = MatmulParams {
            m: m_run as u32,
            ..params
        };
        // An X3 product's operands' largest magnitudes first (its sixth binding), and its
        // bindings 4 and 5 filled where the entry point does not read them.
        let x3_extra = if on_x3 {
            let scales = record_absmax(dev, (&a, &a_layout), (&b, &b_layout))?;
            Some((scales, Tensor::uninit(dev, &[4], DType::U32, OP)?))
        } else {
            None
        };
        let params = MatmulParams {
            scale_off: x3_extra
                .as_ref()
                .map_or(0, |(s, _)| s.layout().offset as u32),
            ..params
        };
        let bind = |s| x3_bindings(s, x3_extra.as_ref());
        if one_dispatch {
            // Partials tile by tile; the last range of each tile sums them and stores C.
            let tiles = m_run.div_ceil(bm as usize) * n.div_ceil(bn as usize);
            let part = Tensor::uninit(dev, &[splits * tiles * (bm * bn) as usize], DType::F32, OP)?;
            let (epi, bias_off, pre) = match (&bias, sums, residual) {
                (Some(b), _, Some(r)) => (SplitEpilogue::BiasResidual, b.layout().offset, Some(r)),
                (Some(b), _, None) => (SplitEpilogue::Bias, b.layout().offset, None),
                (None, Some(s), _) => (SplitEpilogue::ColumnSums, s.layout().offset, Some(s)),
                (None, None, _) => (SplitEpilogue::Plain, 0, None),
            };
            // Where the epilogue reads or writes no `pre`: a buffer of its own (one bound for
            // writing may not be bound twice).
            let spare = match pre {
                Some(_) => None,
                None => Some(Tensor::uninit(dev, &[4], DType::U32, OP)?),
            };
            let pre = pre.or(spare.as_ref()).expect("one of the two");
            let params = MatmulParams {
                batch: splits as u32,
                k_split: k_split as u32,
                a_bs: 0,
                b_bs: 0,
                bias_off: bias_off as u32,
                res_off: residual.map_or(0, |r| r.layout().offset as u32),
                ..params
            };
            // Binding 4 where no bias is read: A (read anyway).
            let bias_or_a = bias.as_ref().unwrap_or(&a);
            let kernel = match choice {
                Choice::Coop(..) => &matmul_coop::MATMUL_COOP_SPLIT,
                Choice::Tiled(_) => &matmul::MATMUL_SPLIT,
            };
            dev.record_split(
                kernel,
                &epi.spec(spec),
                &params,
                &[
                    out.storage(),
                    a.storage(),
                    b.storage(),
                    bias_or_a.storage(),
                    pre.storage(),
                    part.storage(),
                ],
                [groups[0], groups[1], splits as u32],
                true,
            );
            return Ok(out);
        }
        if split > 1 {
            let part = Tensor::uninit(dev, &[splits, m_run, n], DType::F32, OP)?; // (S, M, N)
            let split_params = MatmulParams {
                batch: splits as u32,
                k_split: k_split as u32,
                a_bs: 0,
                b_bs: 0,
                c_off: 0,
                c_bs: (m_run * n) as u32,
                c_ms: n as u32,
                c_ns: 1,
                ..params
            };
            dev.record(
                kernels[0],
                &spec,
                &split_params,
                &bind(vec![part.storage(), a.storage(), b.storage()]),
                [groups[0], groups[1], splits as u32],
            );
            let sum = matmul::SplitSumParams {
                m: m_run as u32,
                n: n as u32,
                splits: splits as u32,
                c_off: params.c_off,
                c_ms: params.c_ms,
                c_ns: params.c_ns,
                bias_off: match (&bias, sums) {
                    (Some(b), _) => b.layout().offset as u32,
                    (None, Some(s)) => s.layout().offset as u32,
                    (None, None) => 0,
                },
                res_off: residual.map_or(0, |r| r.layout().offset as u32),
            };
            // A lane sums 4 elements of a row through vector bindings where every row of C, the
            // bias, the residual and the sums start on a vector.
            let aligned = |t: Option<&Tensor>| t.is_none_or(|t| t.layout().offset % 4 == 0);
            let vec4 = n.is_multiple_of(4)
                && params.c_ns == 1
                && params.c_off.is_multiple_of(4)
                && params.c_ms.is_multiple_of(4)
                && aligned(bias.as_ref())
                && aligned(sums)
                && aligned(residual);
            let sum_spec = matmul::split_sum_spec(out.dtype(), acc, vec4);
            let per_lane = if vec4 { 4 } else { 1 };
            let grid = dev.grid((m_run * n).div_ceil(256 * per_lane) as u64);
            match &bias {
                Some(bias) if residual.is_some() => dev.record(
                    &matmul::MATMUL_SPLIT_SUM_BIAS_RES,
                    &sum_spec,
                    &sum,
                    &[
                        out.storage(),
                        part.storage(),
                        bias.storage(),
                        residual.expect("matched").storage(),
                    ],
                    grid,
                ),
                None if sums.is_some() => dev.record(
                    &matmul::MATMUL_SPLIT_SUM_SUMS,
                    &sum_spec,
                    &sum,
                    &[
                        out.storage(),
                        part.storage(),
                        part.storage(),
                        sums.expect("matched").storage(),
                    ],
                    grid,
                ),
                None => dev.record(
                    &matmul::MATMUL_SPLIT_SUM,
                    &sum_spec,
                    &sum,
                    &[out.storage(), part.storage()],
                    grid,
                ),
                Some(bias) => dev.record(
                    &matmul::MATMUL_SPLIT_SUM_BIAS,
                    &sum_spec,
                    &sum,
                    &[out.storage(), part.storage(), bias.storage()],
                    grid,
                ),
            }
            return Ok(out);
        }
        if let Some(sums) = sums {
            let params = MatmulParams {
                bias_off: sums.layout().offset as u32,
                ..params
            };
            dev.record(
                kernels[3],
                &spec,
                &params,
                &bind(vec![
                    out.storage(),
                    a.storage(),
                    b.storage(),
                    b.storage(),
                    sums.storage(),
                ]),
                groups,
            );
            return Ok(out);
        }
        match bias {
            None => {
                dev.record(
                    kernels[0],
                    &spec,
                    &params,
                    &bind(vec![out.storage(), a.storage(), b.storage()]),
                    groups,
                );
            }
            Some(bias) => {
                let params = MatmulParams {
                    bias_off: bias.layout().offset as u32,
                    ..params
                };
                let storages = [out.storage(), a.storage(), b.storage(), bias.storage()];
                if let Epilogue::BiasGelu { pre, .. } = epilogue {
                    if pre.shape() != out.shape()
                        || !pre.is_contiguous()
                        || pre.layout().offset != 0
                        || !matches!(pre.dtype(), DType::F32 | DType::F16)
                    {
                        return Err(Error::InvalidArgument {
                            op: "linear",
                            reason: "the pre-activation buffer must be a new contiguous f32 or f16 tensor of the output's shape".into(),
                        });
                    }
                    let mut s = storages.to_vec();
                    s.push(pre.storage());
                    dev.record(kernels[2], &spec, &params, &bind(s), groups);
                } else if let Some(residual) = residual {
                    let params = MatmulParams {
                        res_off: residual.layout().offset as u32,
                        ..params
                    };
                    let mut s = storages.to_vec();
                    s.push(residual.storage());
                    dev.record(kernels[4], &spec, &params, &bind(s), groups);
                } else {
                    dev.record(kernels[1], &spec, &params, &bind(storages.to_vec()), groups);
                }
            }
        }
        Ok(out)
    }
}

/// Outputs a lane of a split tile's last range sums at once (SPLIT_CHUNK in
/// matmul_split_tail.wgsl): a pass over them waits about one load's latency a range.
pub const SPLIT_CHUNK: u32 = 8;

/// The most load latencies (ranges times passes over the tile) the sum a split tile's last
/// range runs in the product's own dispatch may wait; a longer sum goes to a second dispatch,
/// whose workgroups share it (the LM head's dX at 4 x 128 splits 16 ways on tiles of 4 passes).
/// A `lab` build's `WGRAD_SPLIT_TAIL=N` sets it.
pub const SPLIT_TAIL_STEPS: usize = 16;

/// Whether a product split into `splits` ranges of K sums them in its own dispatch
/// (`Device::split_in_one_dispatch`): on the tiled kernel or the cooperative-matrix one (not X3,
/// whose operands' scales take the partials' binding), a ticket for each of its tiles, and a
/// short enough sum.
fn sums_in_one_dispatch(
    dev: &Device,
    choice: &Choice,
    on_x3: bool,
    (m, n): (usize, usize),
    splits: usize,
) -> bool {
    let most = dev.options().lab.split_tail().unwrap_or(SPLIT_TAIL_STEPS);
    let (bm, bn, lanes) = match choice {
        Choice::Tiled(t) => (t.bm, t.bn, t.lanes()),
        Choice::Coop(_, _) if on_x3 => return false,
        Choice::Coop(coop, t) => (t.bm(coop.fs), t.bn(coop.fs), t.lanes(coop.sgs)),
    };
    let tiles = m.div_ceil(bm as usize) * n.div_ceil(bn as usize);
    let passes = (bm * bn).div_ceil(lanes * SPLIT_CHUNK) as usize;
    // The partials (whole tiles) and the tickets within one binding each.
    let binding = dev.gpu().limits.max_storage_buffer_binding_size as usize;
    let part_bytes = 4 * splits * tiles * (bm * bn) as usize;
    dev.split_in_one_dispatch()
        && tiles <= SPLIT_TICKETS.min(binding / 4)
        && part_bytes <= binding
        && splits * passes <= most
}

/// An X3 product's bindings: `s` with bindings 4 and 5 filled, where the entry point does not
/// read them, by B (read) and `spare` (a buffer of its own: a buffer bound for writing may not
/// be bound twice), then the partial maxima. Others: `s`.
fn x3_bindings<'a>(mut s: Vec<&'a Storage>, x3: Option<&'a (Tensor, Tensor)>) -> Vec<&'a Storage> {
    if let Some((scales, spare)) = x3 {
        if s.len() < 4 {
            s.push(s[2]);
        }
        if s.len() < 5 {
            s.push(spare.storage());
        }
        s.push(scales.storage());
    }
    s
}

/// The partial maxima of |x| over A and over B (`absmax`: 2 x `absmax::PARTS` u32 bits), which
/// an X3 product reads to scale its operands.
fn record_absmax(
    dev: &Device,
    (a, al): (&Tensor, &matmul::OperandLayout),
    (b, bl): (&Tensor, &matmul::OperandLayout),
) -> Result<Tensor> {
    use crate::kernels::absmax;
    let parts = absmax::PARTS as usize;
    let scales = Tensor::uninit(dev, &[2 * parts], DType::U32, "matmul")?;
    let params = absmax::AbsmaxParams {
        a: absmax::OperandView::of(al),
        b: absmax::OperandView::of(bl),
        out_off: scales.layout().offset as u32,
        _pad: [0; 3],
    };
    dev.record(
        &absmax::ABSMAX,
        &absmax::spec(),
        &params,
        &[scales.storage(), a.storage(), b.storage()],
        [absmax::PARTS, 2, 1],
    );
    Ok(scales)
}

/// Whether C's rows start on 16 bytes: an f32 C whose offset, row stride and batch stride are
/// multiples of 4 (a residual product into such a C is a bias product and an add: see
/// `matmul_epilogue_into`).
fn rows_on_16_bytes(c: DType, (c_off, c_ms, c_bs): (u32, u32, u32)) -> bool {
    c == DType::F32 && [c_off, c_ms, c_bs].iter().all(|x| x.is_multiple_of(4))
}

/// Whether the cooperative-matrix kernel may bind C (`batch` of (m, n) through `p`'s C
/// offset and strides, in a binding of `bound` elements) as vectors of 4 and store 4
/// consecutive columns at once (`CStore::Vec4`): f16 or f32 elements, unit-stride columns,
/// offset and row and batch strides multiples of 4 (every row starts on a vector), and the
/// vector holding C's last element inside the binding.
fn stores_vectors(
    c: DType,
    p: &MatmulParams,
    (batch, m, n): (usize, usize, usize),
    bound: usize,
) -> bool {
    let aligned = [p.c_off, p.c_ms, if batch > 1 { p.c_bs } else { 0 }]
        .iter()
        .all(|x| x.is_multiple_of(4));
    let last = p.c_off as usize
        + (batch.max(1) - 1) * p.c_bs as usize
        + (m.max(1) - 1) * p.c_ms as usize
        + n.max(1)
        - 1;
    matches!(c, DType::F16 | DType::F32) && p.c_ns == 1 && aligned && (last / 4 + 1) * 4 <= bound
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(t: &Tensor, batch: usize, bs: usize) -> matmul::OperandLayout {
        let r = t.rank();
        matmul::OperandLayout {
            dtype: t.dtype(),
            offset: t.layout().offset,
            batch_stride: bs,
            batch,
            rows: t.shape()[r - 2],
            row_stride: t.strides()[r - 2],
            cols: t.shape()[r - 1],
            col_stride: t.strides()[r - 1],
            bound_elements: t.storage().bound_bytes() as usize / 4,
        }
    }

    /// A product written into, then added into, a view of the first 61 columns of rows 64 wide,
    /// f16 and f32: C's rows start on vectors of 4 and N is not a multiple of 4, so on
    /// cooperative matrices the epilogue stores 4 columns at once and each row's ragged end
    /// element by element. The view holds the product (f64 of the f16 operands) and the columns
    /// past it keep what they held.
    #[test]
    fn products_into_narrowed_rows_leave_the_columns_past_them() {
        let dev = Device::new().expect("a device (lavapipe without a GPU)");
        let (m, k, n, w) = (150, 40, 61, 64);
        let half = |v: f32| half::f16::from_f32(v).to_f64();
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.02)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.02)
            .collect();
        let x = Tensor::from_slice_as(&dev, &a, &[m, k], DType::F16).expect("upload");
        let y = Tensor::from_slice_as(&dev, &b, &[k, n], DType::F16).expect("upload");
        let want = |i: usize, j: usize| {
            (0..k)
                .map(|l| half(a[i * k + l]) * half(b[l * n + j]))
                .sum::<f64>()
        };
        for dtype in [DType::F16, DType::F32] {
            let full =
                Tensor::from_slice_as(&dev, &vec![7.0; m * w], &[m, w], dtype).expect("upload");
            let view = full.narrow(1, 0, n).expect("view");
            for acc in [false, true] {
                let out = if acc {
                    Out::Acc(&view)
                } else {
                    Out::Write(&view)
                };
                autocast(true, || {
                    x.matmul_epilogue_into(&y, Epilogue::None, out, dtype)
                })
                .expect("product");
                let got = full
                    .to_dtype(DType::F32)
                    .and_then(|t| t.to_vec())
                    .expect("read back");
                for i in 0..m {
                    for j in 0..w {
                        let g = got[i * w + j] as f64;
                        let (e, tol) = match j < n {
                            // written, then added to what was written
                            true if acc => (2.0 * want(i, j), 4e-3),
                            true => (want(i, j), 2e-3),
                            false => (7.0, 0.0),
                        };
                        assert!(
                            (g - e).abs() <= tol * e.abs().max(1.0),
                            "{dtype:?} {}: ({i}, {j}) {g} against {e}",
                            if acc { "added" } else { "written" }
                        );
                    }
                }
            }
        }
    }

    /// The largest of the partial maxima is the bits of the largest finite |x| of each view
    /// (not of the elements around it, even those sharing its vectors of 4; infinities and
    /// NaN left out).
    #[test]
    fn absmax_partials_hold_each_views_largest_magnitude() {
        use crate::kernels::absmax::PARTS;
        let dev = Device::new().expect("a device (lavapipe without a GPU)");
        let parts = PARTS as usize;
        let max_of = |bits: &[u32]| *bits.iter().max().expect("partials");
        // A narrowed view of a (300, 70) matrix: its largest element outside the view.
        let mut data: Vec<f32> = (0..300 * 70)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
            .collect();
        data[0] = 1e6; // row 0, outside the rows kept
        data[2 * 70 + 1] = 1e6; // beside the view's element (1, 0) in one vector of 4
        data[5 * 70 + 3] = -7.5; // the view's largest magnitude, negative
        data[299 * 70 + 69] = -1e6; // the last row, outside too
        let full = Tensor::from_slice(&dev, &data, &[300, 70]).expect("upload");
        let a = full
            .narrow(0, 1, 250)
            .and_then(|v| v.narrow(1, 2, 60))
            .expect("view");
        // B: a transposed view (columns unit-stride along K), read along its rows.
        let bdata: Vec<f32> = (0..40 * 33).map(|i| (i as f32).sin() * 1e-6).collect();
        let b_src = Tensor::from_slice(&dev, &bdata, &[40, 33]).expect("upload");
        let b = b_src.t().expect("transpose");
        let want_b = bdata.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let scales =
            record_absmax(&dev, (&a, &layout(&a, 1, 0)), (&b, &layout(&b, 1, 0))).expect("absmax");
        let bits = scales.to_vec_u32().expect("read back");
        assert_eq!(bits.len(), 2 * parts);
        assert_eq!(f32::from_bits(max_of(&bits[..parts])), 7.5);
        assert_eq!(f32::from_bits(max_of(&bits[parts..])), want_b);
        // A NaN and an infinity left out; a batch of 3 views, 2000 rows apart.
        let mut big = vec![0.25f32; 3 * 2000 * 8];
        big[2 * 2000 * 8 + 1999 * 8 + 7] = f32::NAN;
        big[2000 * 8 + 5] = f32::NEG_INFINITY;
        big[2 * 2000 * 8 + 3] = 5.0;
        big[4] = -3.0;
        let t = Tensor::from_slice(&dev, &big, &[3, 2000, 8]).expect("upload");
        let l = layout(&t, 3, 2000 * 8);
        let scales = record_absmax(&dev, (&t, &l), (&t, &l)).expect("absmax");
        let bits = scales.to_vec_u32().expect("read back");
        assert_eq!(f32::from_bits(max_of(&bits[..parts])), 5.0);
        // Only the first batch: 3.
        let l1 = matmul::OperandLayout { batch: 1, ..l };
        let scales = record_absmax(&dev, (&t, &l1), (&t, &l1)).expect("absmax");
        let bits = scales.to_vec_u32().expect("read back");
        assert_eq!(f32::from_bits(max_of(&bits[parts..])), 3.0);
        // Rows of 50 padded to 52, read in vectors: the padding (1e9) masked; the largest in
        // the last vector of a row, and (B) in the last row.
        let mut padded: Vec<f32> = (0..600 * 52).map(|i| (i % 7) as f32 * 0.1).collect();
        for r in 0..600 {
            padded[r * 52 + 50] = 1e9;
            padded[r * 52 + 51] = -1e9;
        }
        padded[17 * 52 + 49] = -4.5;
        padded[599 * 52 + 48] = 6.25;
        let t = Tensor::from_slice(&dev, &padded, &[600, 52]).expect("upload");
        let head = t
            .narrow(0, 0, 599)
            .and_then(|v| v.narrow(1, 0, 50))
            .expect("view");
        let all = t.narrow(1, 0, 50).expect("view");
        let (lh, la) = (layout(&head, 1, 0), layout(&all, 1, 0));
        assert_eq!(crate::kernels::absmax::OperandView::of(&lh).vec, 1);
        let scales = record_absmax(&dev, (&head, &lh), (&all, &la)).expect("absmax");
        let bits = scales.to_vec_u32().expect("read back");
        assert_eq!(f32::from_bits(max_of(&bits[..parts])), 4.5);
        assert_eq!(f32::from_bits(max_of(&bits[parts..])), 6.25);
    }
}
