//! index_select: entries of one axis picked by a u32 index vector (embedding lookup).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{resolve_dim, DType, Tensor, MAX_RANK};
use crate::kernels::gather::{self, GatherParams};
use crate::kernels::pack8;
use crate::kernels::scatter::{self, ScatterParams};
use crate::ops::elementwise::launch_copy;
use crate::ops::Out;

/// The backward of index_select along dim 0: rows of g added into the rows they were read
/// from, grouped on the host by index (deterministic: no atomics).
struct IndexSelectBackward {
    indices: Tensor,
    src_shape: Vec<usize>,
}

impl Backward for IndexSelectBackward {
    fn name(&self) -> &'static str {
        "index_select"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let Some(host) = self.indices.host_u32() else {
            return Err(Error::InvalidArgument {
                op: "index_select backward",
                reason: "needs indices made from host data (Tensor::from_u32), to group rows without a read-back".into(),
            });
        };
        let csr = RowGroups::new(
            host,
            self.indices.layout().offset,
            self.indices.strides()[0],
            self.indices.numel(),
        );
        let csr_tensor = Tensor::from_u32(g.device(), &csr.data, &[csr.data.len()])?;
        let g = g.contiguous()?;
        ctx.put_with(0, |out| match out {
            Out::New => {
                let t = Tensor::zeros(g.device(), &self.src_shape)?;
                scatter_rows(&g, &csr, &csr_tensor, &t, true)?;
                Ok(t)
            }
            Out::Write(t) => {
                t.fill_(0.0)?;
                scatter_rows(&g, &csr, &csr_tensor, t, true)?;
                Ok(t.clone())
            }
            Out::Acc(t) => {
                scatter_rows(&g, &csr, &csr_tensor, t, true)?;
                Ok(t.clone())
            }
        })
    }
}

/// Positions grouped by the row they index: rows, then starts (n_rows + 1), then positions.
struct RowGroups {
    n_rows: usize,
    data: Vec<u32>,
}

impl RowGroups {
    fn new(host: &[u32], offset: usize, stride: usize, len: usize) -> RowGroups {
        let mut pairs: Vec<(u32, u32)> = (0..len)
            .map(|j| (host[offset + j * stride], j as u32))
            .collect();
        pairs.sort_unstable();
        let mut rows = Vec::new();
        let mut starts = Vec::new();
        for (k, (row, _)) in pairs.iter().enumerate() {
            if rows.last() != Some(row) {
                rows.push(*row);
                starts.push(k as u32);
            }
        }
        starts.push(pairs.len() as u32);
        let n_rows = rows.len();
        let mut data = rows;
        data.extend(starts);
        data.extend(pairs.iter().map(|(_, j)| *j));
        RowGroups { n_rows, data }
    }
}

/// dx[rows] (+)= grouped sums of g's rows; dx must have contiguous rows, else via a copy.
fn scatter_rows(
    g: &Tensor,
    csr: &RowGroups,
    csr_tensor: &Tensor,
    dx: &Tensor,
    acc: bool,
) -> Result<()> {
    let cols: usize = dx.shape()[1..].iter().product();
    let out_row_stride = if dx.is_contiguous() {
        Some(cols)
    } else if dx.rank() == 2 && dx.strides()[1] == 1 {
        Some(dx.strides()[0])
    } else {
        None
    };
    let Some(out_row_stride) = out_row_stride else {
        let t = Tensor::zeros(g.device(), dx.shape())?;
        scatter_rows(g, csr, csr_tensor, &t, true)?;
        launch_copy(&t, if acc { Out::Acc(dx) } else { Out::Write(dx) })?;
        return Ok(());
    };
    let params = ScatterParams {
        n_rows: csr.n_rows as u32,
        cols: cols as u32,
        dy_offset: g.layout().offset as u32,
        dy_row_stride: cols as u32,
        out_offset: dx.layout().offset as u32,
        out_row_stride: out_row_stride as u32,
        starts_offset: csr.n_rows as u32,
        positions_offset: (2 * csr.n_rows + 1) as u32,
    };
    let groups = g.device().grid(csr.n_rows as u64);
    g.device().record(
        &scatter::INDEX_ADD_ROWS,
        &scatter::spec(acc),
        &params,
        &[dx.storage(), g.storage(), csr_tensor.storage()],
        groups,
    );
    Ok(())
}

impl Tensor {
    /// out[.., j, ..] = self[.., indices[j], ..] along `dim`; `indices` is a 1-D u32 tensor.
    /// An index past the end reads 0 (the GPU cannot raise an error mid-kernel).
    pub fn index_select(&self, dim: isize, indices: &Tensor) -> Result<Tensor> {
        const OP: &str = "index_select";
        self.expect_dtype(OP, DType::F32)?;
        indices.expect_dtype(OP, DType::U32)?;
        self.expect_same_device(OP, indices)?;
        if indices.rank() != 1 {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: "1-D indices".into(),
                got: indices.shape().to_vec(),
            });
        }
        let d = resolve_dim(OP, dim, self.rank())?;
        if self.rank() > MAX_RANK {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("rank {} above {MAX_RANK}", self.rank()),
            });
        }
        let mut shape = self.shape().to_vec();
        shape[d] = indices.numel();
        let out = Tensor::uninit(self.device(), &shape, DType::F32, OP)?;
        let numel = out.numel() as u64;
        if numel == 0 {
            return Ok(out);
        }
        let params = GatherParams {
            numel: numel as u32,
            rank: self.rank() as u32,
            dim: d as u32,
            src_len: self.shape()[d] as u32,
            in_offset: self.layout().offset as u32,
            idx_offset: indices.layout().offset as u32,
            idx_stride: indices.strides()[0] as u32,
            _pad: 0,
            shape: pack8(&shape),
            strides: pack8(self.strides()),
        };
        let groups = self.device().grid(numel.div_ceil(gather::WORKGROUP));
        self.device().record(
            &gather::INDEX_SELECT,
            &crate::kernels::Spec::new(),
            &params,
            &[out.storage(), self.storage(), indices.storage()],
            groups,
        );
        if d != 0 {
            if crate::autograd::grad_enabled() && self.needs_grad() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "backward is implemented along dim 0 (embedding rows), not dim {d}"
                    ),
                });
            }
            return Ok(out);
        }
        Ok(record(out, &[self], || IndexSelectBackward {
            indices: indices.clone(),
            src_shape: self.shape().to_vec(),
        }))
    }
}
