//! Records a planned product (`plan::Run`): an X3 product's operand maxima first, then the
//! product's kernel (each range of K with its sum in the same dispatch, or f32 partials and a
//! second kernel that sums them), with the epilogue's bindings.

use super::plan::{Kernel, Run, Split};
use crate::error::Result;
use crate::graph::{DType, Device, Storage, Tensor};
use crate::kernels::matmul::{self, MatmulParams, OperandLayout, SplitEpilogue};
use crate::kernels::{matmul_coop, KernelDesc, Spec};

const OP: &str = "matmul";

/// The tensors a planned product binds, checked by the caller: A and B as read, C, and what
/// the epilogue adds or writes beside it.
pub(super) struct Bound<'a> {
    pub a: &'a Tensor,
    pub b: &'a Tensor,
    pub a_layout: OperandLayout,
    pub b_layout: OperandLayout,
    pub out: &'a Tensor,
    /// The bias (N), contiguous.
    pub bias: Option<&'a Tensor>,
    /// B's column sums (N, f32).
    pub sums: Option<&'a Tensor>,
    /// The residual (M, N, f32).
    pub residual: Option<&'a Tensor>,
    /// GELU's pre-activation (M, N; f16 or f32).
    pub pre: Option<&'a Tensor>,
}

/// Records `run` over `t`, `params` holding the views' offsets and strides.
pub(super) fn record(dev: &Device, run: &Run, t: &Bound<'_>, params: MatmulParams) -> Result<()> {
    let (kernels, spec) = kernel_and_spec(dev, run, t);
    let (bm, bn, _) = run.kernel.block();
    let (m_run, n, batch) = (
        run.m_run,
        t.out.shape()[t.out.rank() - 1],
        params.batch as usize,
    );
    let groups = [
        n.div_ceil(bn) as u32,
        m_run.div_ceil(bm) as u32,
        batch as u32,
    ];
    let params = MatmulParams {
        m: m_run as u32,
        ..params
    };
    // An X3 product's operands' largest magnitudes first (its sixth binding), and its
    // bindings 4 and 5 filled where the entry point does not read them.
    let x3_extra = if matches!(run.kernel, Kernel::Coop { x3: true, .. }) {
        let scales = record_absmax(dev, (t.a, &t.a_layout), (t.b, &t.b_layout))?;
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
    let (a, b, out) = (t.a, t.b, t.out);
    match run.split {
        Split::InOneDispatch { splits, k_split } => {
            // Partials tile by tile; the last range of each tile sums them and stores C.
            let tiles = m_run.div_ceil(bm) * n.div_ceil(bn);
            let part = Tensor::uninit(dev, &[splits * tiles * bm * bn], DType::F32, OP)?;
            let (epi, bias_off, pre) = match (t.bias, t.sums, t.residual) {
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
                res_off: t.residual.map_or(0, |r| r.layout().offset as u32),
                ..params
            };
            // Binding 4 where no bias is read: A (read anyway).
            let bias_or_a = t.bias.unwrap_or(a);
            let kernel = match run.kernel {
                Kernel::Coop { .. } => &matmul_coop::MATMUL_COOP_SPLIT,
                Kernel::Tiled(_) => &matmul::MATMUL_SPLIT,
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
        }
        Split::SecondDispatch { splits, k_split } => {
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
            record_split_sum(dev, run, t, &params, (&part, splits));
        }
        Split::Whole => {
            if let Some(sums) = t.sums {
                let params = MatmulParams {
                    bias_off: sums.layout().offset as u32,
                    ..params
                };
                let s = vec![
                    out.storage(),
                    a.storage(),
                    b.storage(),
                    b.storage(),
                    sums.storage(),
                ];
                dev.record(kernels[3], &spec, &params, &bind(s), groups);
                return Ok(());
            }
            let Some(bias) = t.bias else {
                let s = vec![out.storage(), a.storage(), b.storage()];
                dev.record(kernels[0], &spec, &params, &bind(s), groups);
                return Ok(());
            };
            let params = MatmulParams {
                bias_off: bias.layout().offset as u32,
                ..params
            };
            let mut s = vec![out.storage(), a.storage(), b.storage(), bias.storage()];
            if let Some(pre) = t.pre {
                s.push(pre.storage());
                dev.record(kernels[2], &spec, &params, &bind(s), groups);
            } else if let Some(residual) = t.residual {
                let params = MatmulParams {
                    res_off: residual.layout().offset as u32,
                    ..params
                };
                s.push(residual.storage());
                dev.record(kernels[4], &spec, &params, &bind(s), groups);
            } else {
                dev.record(kernels[1], &spec, &params, &bind(s), groups);
            }
        }
    }
    Ok(())
}

/// The entry points of `run`'s kernel (plain, bias, bias + GELU, column sums, bias +
/// residual) and its specialization.
fn kernel_and_spec(dev: &Device, run: &Run, t: &Bound<'_>) -> ([&'static KernelDesc; 5], Spec) {
    let pre_f16 = t.pre.is_some_and(|p| p.dtype() == DType::F16);
    let ones = t.sums.is_some();
    match run.kernel {
        Kernel::Coop { coop, tile, x3 } => {
            let kernels = if x3 {
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
            };
            let spec = matmul_coop::Variant {
                ones,
                x3,
                ablation: dev.options().lab.ablation(),
                ..matmul_coop::Variant::new(
                    tile,
                    run.kernel_acc,
                    run.kernel_types,
                    coop,
                    (t.a_layout.access(), t.b_layout.access()),
                    run.c_store,
                )
            }
            .spec();
            let spec = if run.pre_vectors || pre_f16 {
                matmul_coop::pre_binding(spec, run.pre_vectors, pre_f16)
            } else {
                spec
            };
            (kernels, spec)
        }
        Kernel::Tiled(tile) => (
            [
                &matmul::MATMUL,
                &matmul::MATMUL_BIAS,
                &matmul::MATMUL_BIAS_GELU,
                &matmul::MATMUL_SUMS,
                &matmul::MATMUL_BIAS_RES,
            ],
            matmul::spec_ones(
                tile,
                run.kernel_acc,
                run.kernel_types,
                matmul::vector_reads(tile, &t.a_layout, &t.b_layout),
                ones,
            )
            .with_ty("PE", if pre_f16 { "f16" } else { "f32" }),
        ),
    }
}

/// The second kernel of a split summed apart: the `splits` partials of `part` (S, M, N) into
/// C, adding the bias, the residual, or storing the column sums, as the product's epilogue.
fn record_split_sum(
    dev: &Device,
    run: &Run,
    t: &Bound<'_>,
    params: &MatmulParams,
    (part, splits): (&Tensor, usize),
) {
    let (m_run, n) = (run.m_run, t.out.shape()[t.out.rank() - 1]);
    let (bias, sums, residual, out) = (t.bias, t.sums, t.residual, t.out);
    let sum = matmul::SplitSumParams {
        m: m_run as u32,
        n: n as u32,
        splits: splits as u32,
        c_off: params.c_off,
        c_ms: params.c_ms,
        c_ns: params.c_ns,
        bias_off: match (bias, sums) {
            (Some(b), _) => b.layout().offset as u32,
            (None, Some(s)) => s.layout().offset as u32,
            (None, None) => 0,
        },
        res_off: residual.map_or(0, |r| r.layout().offset as u32),
    };
    // A lane sums 4 elements of a row through vector bindings where every row of C, the bias,
    // the residual and the sums start on a vector.
    let aligned = |t: Option<&Tensor>| t.is_none_or(|t| t.layout().offset % 4 == 0);
    let vec4 = n.is_multiple_of(4)
        && params.c_ns == 1
        && params.c_off.is_multiple_of(4)
        && params.c_ms.is_multiple_of(4)
        && aligned(bias)
        && aligned(sums)
        && aligned(residual);
    let sum_spec = matmul::split_sum_spec(out.dtype(), run.acc, vec4);
    let per_lane = if vec4 { 4 } else { 1 };
    let grid = dev.grid((m_run * n).div_ceil(256 * per_lane) as u64);
    let (kernel, storages): (&KernelDesc, Vec<&Storage>) = match (bias, residual, sums) {
        (Some(bias), Some(r), _) => (
            &matmul::MATMUL_SPLIT_SUM_BIAS_RES,
            vec![out.storage(), part.storage(), bias.storage(), r.storage()],
        ),
        (Some(bias), None, _) => (
            &matmul::MATMUL_SPLIT_SUM_BIAS,
            vec![out.storage(), part.storage(), bias.storage()],
        ),
        (None, _, Some(s)) => (
            &matmul::MATMUL_SPLIT_SUM_SUMS,
            vec![out.storage(), part.storage(), part.storage(), s.storage()],
        ),
        (None, _, None) => (
            &matmul::MATMUL_SPLIT_SUM,
            vec![out.storage(), part.storage()],
        ),
    };
    dev.record(kernel, &sum_spec, &sum, &storages, grid);
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
pub(super) fn record_absmax(
    dev: &Device,
    (a, al): (&Tensor, &OperandLayout),
    (b, bl): (&Tensor, &OperandLayout),
) -> Result<Tensor> {
    use crate::kernels::absmax;
    let parts = absmax::PARTS as usize;
    let scales = Tensor::uninit(dev, &[2 * parts], DType::U32, OP)?;
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
