//! Softmax and log-softmax over the last axis (f32 statistics, one workgroup per row).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::kernels::elementwise::{self, ternary};
use crate::kernels::softmax::{self, SoftmaxParams};
use crate::ops::elementwise::launch;

/// softmax: dx = y (g - sum(g y)); log-softmax: dx = g - exp(y) sum(g); sums over the row.
struct SoftmaxBackward {
    y: Tensor,
    log: bool,
}

impl Backward for SoftmaxBackward {
    fn name(&self) -> &'static str {
        if self.log {
            "log_softmax"
        } else {
            "softmax"
        }
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let (sum, code) = if self.log {
            (g.sum(-1, true)?, ternary::LOG_SOFTMAX_BACKWARD)
        } else {
            (g.mul(&self.y)?.sum(-1, true)?, ternary::SOFTMAX_BACKWARD)
        };
        let sum = sum.broadcast_to(g.shape())?;
        ctx.put_with(0, |out| {
            launch(
                "softmax_backward",
                &elementwise::TERNARY,
                code,
                g.shape(),
                &[g, &sum, &self.y],
                (0.0, 0.0),
                out,
            )
        })
    }
}

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
        let rows = x.numel().checked_div(cols).unwrap_or(0);
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
        let y = out.clone();
        Ok(record(out, &[&x], || SoftmaxBackward { y, log }))
    }
}
