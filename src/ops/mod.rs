//! The public tensor ops. Each file records its op's forward dispatches (and, with the
//! autograd issue, its backward rule) in one place; kernels live in `crate::kernels`.

mod create;
mod elementwise;
mod gather;
mod matmul;
mod reduce;
mod softmax;
mod view;

pub use crate::kernels::elementwise::{BinaryOp, UnaryOp};
pub use crate::kernels::reduce::ReduceOp;
