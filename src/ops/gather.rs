//! index_select: entries of one axis picked by a u32 index vector (embedding lookup).

use crate::error::{Error, Result};
use crate::graph::{resolve_dim, DType, Tensor, MAX_RANK};
use crate::kernels::gather::{self, GatherParams};
use crate::kernels::pack8;

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
        Ok(out)
    }
}
