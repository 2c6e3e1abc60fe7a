//! index_select: entries of one axis picked by a u32 index vector (embedding lookup), and
//! `index_select_shards`: rows of a table stored as row shards (an embedding over the storage
//! binding limit), one dispatch per shard.

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
        put_rows(ctx, 0, &g.contiguous()?, &csr, &self.src_shape)
    }
}

/// Input `i` (of `shape`) gets the rows of g grouped by `csr` added into the rows they were
/// read from, zero elsewhere: one scatter dispatch (none when no row was read).
fn put_rows(
    ctx: &mut BackwardCtx<'_>,
    i: usize,
    g: &Tensor,
    csr: &RowGroups,
    shape: &[usize],
) -> Result<()> {
    let csr_tensor = if csr.n_rows == 0 {
        None
    } else {
        Some(Tensor::from_u32(g.device(), &csr.data, &[csr.data.len()])?)
    };
    let add_rows = |dx: &Tensor| match &csr_tensor {
        Some(t) => scatter_rows(g, csr, t, dx, true),
        None => Ok(()),
    };
    ctx.put_with(i, |out| match out {
        Out::New => {
            let t = Tensor::zeros(g.device(), shape)?;
            add_rows(&t)?;
            Ok(t)
        }
        Out::Write(t) => {
            t.fill_(0.0)?;
            add_rows(t)?;
            Ok(t.clone())
        }
        Out::Acc(t) => {
            add_rows(t)?;
            Ok(t.clone())
        }
    })
}

/// The backward of `index_select_shards`: each shard gets the rows of g whose index falls in
/// its rows (grouped on the host per shard, numbered from the shard's first row).
struct IndexSelectShardsBackward {
    indices: Tensor,
    /// (first table row, rows) of each shard.
    bounds: Vec<(usize, usize)>,
    cols: usize,
}

impl Backward for IndexSelectShardsBackward {
    fn name(&self) -> &'static str {
        "index_select_shards"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let Some(host) = self.indices.host_u32() else {
            return Err(Error::InvalidArgument {
                op: "index_select_shards backward",
                reason: "needs indices made from host data (Tensor::from_u32), to group rows without a read-back".into(),
            });
        };
        let g = g.contiguous()?;
        for (i, &(lo, rows)) in self.bounds.iter().enumerate() {
            if !ctx.needed(i) {
                continue;
            }
            let csr = RowGroups::in_range(
                host,
                self.indices.layout().offset,
                self.indices.strides()[0],
                self.indices.numel(),
                lo..lo + rows,
            );
            put_rows(ctx, i, &g, &csr, &[rows, self.cols])?;
        }
        Ok(())
    }
}

/// Positions grouped by the row they index: rows, then starts (n_rows + 1), then positions.
struct RowGroups {
    n_rows: usize,
    data: Vec<u32>,
}

impl RowGroups {
    fn new(host: &[u32], offset: usize, stride: usize, len: usize) -> RowGroups {
        let pairs: Vec<(u32, u32)> = (0..len)
            .map(|j| (host[offset + j * stride], j as u32))
            .collect();
        RowGroups::from_pairs(pairs)
    }

    /// The groups of the rows in `rows` (a shard's), numbered from its first row.
    fn in_range(
        host: &[u32],
        offset: usize,
        stride: usize,
        len: usize,
        rows: std::ops::Range<usize>,
    ) -> RowGroups {
        let pairs: Vec<(u32, u32)> = (0..len)
            .map(|j| (host[offset + j * stride] as usize, j as u32))
            .filter(|(row, _)| rows.contains(row))
            .map(|(row, j)| ((row - rows.start) as u32, j))
            .collect();
        RowGroups::from_pairs(pairs)
    }

    /// (row, position) pairs grouped by row.
    fn from_pairs(mut pairs: Vec<(u32, u32)>) -> RowGroups {
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

/// Records one gather dispatch: out = src gathered along `dim` by `indices`, src holding the
/// rows from `row_lo` of the table the indices address; `keep_others`: indices outside src's
/// rows leave their output elements as they are (else they read 0).
fn record_gather(
    out: &Tensor,
    src: &Tensor,
    dim: usize,
    indices: &Tensor,
    row_lo: usize,
    keep_others: bool,
) {
    let numel = out.numel() as u64;
    let params = GatherParams {
        numel: numel as u32,
        rank: src.rank() as u32,
        dim: dim as u32,
        src_len: src.shape()[dim] as u32,
        in_offset: src.layout().offset as u32,
        idx_offset: indices.layout().offset as u32,
        idx_stride: indices.strides()[0] as u32,
        row_lo: row_lo as u32,
        shape: pack8(out.shape()),
        strides: pack8(src.strides()),
    };
    let groups = src.device().grid(numel.div_ceil(gather::WORKGROUP));
    src.device().record(
        &gather::INDEX_SELECT,
        &gather::spec(keep_others),
        &params,
        &[out.storage(), src.storage(), indices.storage()],
        groups,
    );
}

impl Tensor {
    /// out[j, :] = table[indices[j], :] where `table` is the row-wise concatenation of `shards`
    /// (each (rows_i, C), f32): an embedding stored as row shards because it is over the
    /// adapter's storage-binding limit. One gather dispatch per shard, each writing the rows
    /// whose index falls in its shard (the first also writes 0 for an index past the table);
    /// one shard is `index_select`. Backward: one scatter-add per shard.
    pub fn index_select_shards(shards: &[&Tensor], indices: &Tensor) -> Result<Tensor> {
        const OP: &str = "index_select_shards";
        let Some(first) = shards.first() else {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "no shards".into(),
            });
        };
        if shards.len() == 1 {
            return first.index_select(0, indices);
        }
        indices.expect_dtype(OP, DType::U32)?;
        if indices.rank() != 1 {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: "1-D indices".into(),
                got: indices.shape().to_vec(),
            });
        }
        let cols = first.shape().get(1).copied().unwrap_or(0);
        let mut bounds = Vec::with_capacity(shards.len());
        let mut lo = 0;
        for (i, s) in shards.iter().enumerate() {
            s.expect_dtype(OP, DType::F32)?;
            s.expect_same_device(OP, indices)?;
            if s.rank() != 2 || s.shape()[1] != cols {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    expected: format!("shard {i} of shape (rows, {cols}) as shard 0"),
                    got: s.shape().to_vec(),
                });
            }
            bounds.push((lo, s.shape()[0]));
            lo += s.shape()[0];
        }
        let out = Tensor::uninit(first.device(), &[indices.numel(), cols], DType::F32, OP)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        for (i, (s, &(lo, _))) in shards.iter().zip(&bounds).enumerate() {
            record_gather(&out, s, 0, indices, lo, i > 0);
        }
        Ok(record(out, shards, || IndexSelectShardsBackward {
            indices: indices.clone(),
            bounds,
            cols,
        }))
    }

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
        if out.numel() == 0 {
            return Ok(out);
        }
        record_gather(&out, self, d, indices, 0, false);
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
