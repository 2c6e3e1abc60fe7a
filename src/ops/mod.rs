//! The public tensor ops. Each file records its op's forward dispatches and its backward rule
//! in one place; kernels live in `crate::kernels`.

mod attention;
mod autocast;
mod cast;
mod cat;
mod create;
mod cross_entropy;
mod elementwise;
mod gather;
mod layernorm;
mod linear;
pub(crate) mod matmul;
mod reduce;
mod rmsnorm;
mod shard_matmul;
mod softmax;
mod swiglu;
mod view;

pub use crate::kernels::elementwise::{BinaryOp, UnaryOp};
pub use crate::kernels::reduce::ReduceOp;
pub(crate) use attention::stores_half as attention_stores_half;
pub use attention::Rope;
pub use autocast::{autocast, autocast_enabled};
pub use layernorm::backward_reference as layer_norm_backward_reference;
pub(crate) use linear::cast_input as linear_casts_input;
pub use linear::Activation;
pub use matmul::{candidate_tiles, heuristic_tile, matmul_variant};
pub use matmul::{SPLIT_CHUNK, SPLIT_TAIL_STEPS};

pub(crate) use elementwise::launch_copy;
pub(crate) use reduce::ReduceBackward;

use crate::error::{Error, Result};
use crate::graph::{DType, Device, Tensor};

/// Where an op writes its result: a new tensor, over an existing one, or added into an
/// existing one (gradient accumulation in place: the producing kernel does the add).
#[derive(Clone, Copy)]
pub(crate) enum Out<'a> {
    New,
    Write(&'a Tensor),
    Acc(&'a Tensor),
}

impl Out<'_> {
    /// The output tensor (checked against `shape`) and whether the kernel accumulates.
    pub(crate) fn resolve(
        self,
        op: &'static str,
        device: &Device,
        shape: &[usize],
        inputs: &[&Tensor],
    ) -> Result<(Tensor, bool)> {
        self.resolve_typed(op, device, shape, inputs, DType::F32)
    }

    /// `resolve` for an op whose output has the element type `dtype`.
    pub(crate) fn resolve_typed(
        self,
        op: &'static str,
        device: &Device,
        shape: &[usize],
        inputs: &[&Tensor],
        dtype: DType,
    ) -> Result<(Tensor, bool)> {
        let (t, acc) = match self {
            Out::New => return Ok((Tensor::uninit(device, shape, dtype, op)?, false)),
            Out::Write(t) => (t, false),
            Out::Acc(t) => (t, true),
        };
        if t.shape() != shape {
            return Err(Error::ShapeMismatch {
                op,
                expected: format!("an output of shape {shape:?}"),
                got: t.shape().to_vec(),
            });
        }
        t.expect_dtype(op, dtype)?;
        if !t.device().same(device) {
            return Err(Error::DeviceMismatch { op });
        }
        if inputs.iter().any(|i| i.same_storage(t)) {
            return Err(Error::InvalidArgument {
                op,
                reason: "the output aliases an input (write into a separate tensor)".into(),
            });
        }
        Ok((t.clone(), acc))
    }
}

/// Checks that an op can store its output as `dtype`: f32, or f16 where the adapter has f16 in
/// shaders (a fused op's `_as` variants, for a consumer that reads f16 operands).
pub(crate) fn check_store_dtype(op: &'static str, device: &Device, dtype: DType) -> Result<()> {
    let gpu = device.gpu();
    match dtype {
        DType::F32 => Ok(()),
        DType::F16 if gpu.has(wgpu::Features::SHADER_F16) => Ok(()),
        DType::F16 => Err(Error::InvalidArgument {
            op,
            reason: format!(
                "an f16 output needs f16 in shaders (shader-f16), which {} lacks",
                gpu.info.name
            ),
        }),
        DType::U32 => Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: DType::U32,
        }),
    }
}
