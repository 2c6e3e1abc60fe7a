//! Element type conversion (f32 <-> f16). Gradients stay f32 whatever a tensor's type, so the
//! backward of a cast passes the gradient through.

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::kernels::cast::{self, CastParams};

struct CastBackward;

impl Backward for CastBackward {
    fn name(&self) -> &'static str {
        "cast"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        ctx.put(0, g.clone())
    }
}

fn expect_float(op: &'static str, dtype: DType) -> Result<()> {
    if dtype == DType::U32 {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: dtype,
        });
    }
    Ok(())
}

impl Tensor {
    /// This tensor with elements of type `dtype` (f32 or f16; the same tensor when it already
    /// is). One dispatch.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        let src = self.contiguous()?;
        let out = Tensor::uninit(self.device(), self.shape(), dtype, "to_dtype")?;
        src.detach().cast_into(&out)?;
        Ok(record(out, &[self], || CastBackward))
    }

    /// Converts this tensor into `out` (same shape, both contiguous), no autograd record.
    pub(crate) fn cast_into(&self, out: &Tensor) -> Result<()> {
        const OP: &str = "cast";
        expect_float(OP, self.dtype())?;
        expect_float(OP, out.dtype())?;
        self.expect_same_device(OP, out)?;
        if self.shape() != out.shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!("an output of shape {:?}", self.shape()),
                got: out.shape().to_vec(),
            });
        }
        if !self.is_contiguous() || !out.is_contiguous() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "both tensors must be contiguous".into(),
            });
        }
        let numel = self.numel() as u64;
        if numel == 0 {
            return Ok(());
        }
        let dev = self.device();
        let params = CastParams {
            numel: numel as u32,
            a_off: self.layout().offset as u32,
            out_off: out.layout().offset as u32,
            _pad: 0,
        };
        dev.record(
            &cast::CAST,
            &cast::spec(self.dtype(), out.dtype()),
            &params,
            &[out.storage(), self.storage()],
            dev.grid(numel.div_ceil(cast::WORKGROUP)),
        );
        Ok(())
    }
}
