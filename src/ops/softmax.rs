//! Softmax and log-softmax over the last axis (f32 statistics, one workgroup per row).

use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::kernels::softmax::{self, SoftmaxParams};

impl Tensor {
    pub fn softmax(&self) -> Result<Tensor> {
        self.softmax_impl(false)
    }

    pub fn log_softmax(&self) -> Result<Tensor> {
        self.softmax_impl(true)
    }

    fn softmax_impl(&self, log: bool) -> Result<Tensor> {
        let op = if log { "log_softmax" } else { "softmax" };
        self.expect_dtype(op, DType::F32)?;
        if self.rank() == 0 {
            return Err(Error::ShapeMismatch {
                op,
                expected: "a tensor of rank 1 or more".into(),
                got: vec![],
            });
        }
        let x = self.contiguous()?;
        let cols = *x.shape().last().expect("rank checked above");
        let rows = if cols == 0 { 0 } else { x.numel() / cols };
        let out = Tensor::uninit(x.device(), x.shape(), DType::F32, op)?;
        if rows == 0 {
            return Ok(out);
        }
        let params = SoftmaxParams {
            rows: rows as u32,
            cols: cols as u32,
            in_offset: x.layout().offset as u32,
            _pad: 0,
        };
        let groups = x.device().grid(rows as u64);
        x.device().record(
            &softmax::SOFTMAX_ROWS,
            &softmax::spec(log),
            &params,
            &[out.storage(), x.storage()],
            groups,
        );
        Ok(out)
    }
}
