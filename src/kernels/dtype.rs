//! The element types kernels bind (and tensors hold).

/// Element types of tensors and kernel bindings: f32 is the engine's type, f16 the operand
/// type of mixed-precision matmuls (and of what they write for a matmul consumer), u32 holds
/// indices (token ids, gather indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    U32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 => 2,
        }
    }

    pub fn wgsl(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::U32 => "u32",
        }
    }
}
