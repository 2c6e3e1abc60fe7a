//! Batched matmul: (..., M, K) @ (..., K, N) -> (..., M, N), batch dims broadcast. Transposed
//! operands are read through their strides; a broadcast batch that cannot be expressed as one
//! stride is materialized first.

use crate::error::{Error, Result};
use crate::graph::{broadcast_shape, coalesce_joint, DType, Tensor};
use crate::kernels::matmul::{self, MatmulParams};

impl Tensor {
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        const OP: &str = "matmul";
        self.expect_dtype(OP, DType::F32)?;
        other.expect_dtype(OP, DType::F32)?;
        self.expect_same_device(OP, other)?;
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
        let mut a = self.broadcast_to(&a_shape)?;
        let mut b = other.broadcast_to(&b_shape)?;
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
        let mut out_shape = batch_shape;
        out_shape.extend([m, n]);
        let out = Tensor::uninit(self.device(), &out_shape, DType::F32, OP)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        if k == 0 {
            return Tensor::zeros(self.device(), &out_shape);
        }
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
            c_off: 0,
            c_bs: (m * n) as u32,
            _pad: [0; 2],
        };
        let tile = matmul::choose_tile(m, n, batch);
        let groups = [
            n.div_ceil(tile.bn as usize) as u32,
            m.div_ceil(tile.bm as usize) as u32,
            batch as u32,
        ];
        self.device().record(
            &matmul::MATMUL,
            &matmul::spec(tile),
            &params,
            &[out.storage(), a.storage(), b.storage()],
            groups,
        );
        Ok(out)
    }
}
