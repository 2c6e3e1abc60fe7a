//! Launchers of `wgsl/elementwise.wgsl`: unary and scalar ops, binary ops with broadcasting,
//! compare, ternary ops (where, and the backward rules of elementwise ops), fill.

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "elementwise",
    source: include_str!("../../wgsl/elementwise.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in elementwise.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ElementwiseParams {
    pub numel: u32,
    pub rank: u32,
    pub scalar: f32,
    pub scalar2: f32,
    pub shape: [u32; 8],
    pub a_strides: [u32; 8],
    pub b_strides: [u32; 8],
    pub c_strides: [u32; 8],
    pub out_strides: [u32; 8],
    /// Element offsets of a, b, c and out.
    pub offsets: [u32; 4],
}

const PARAMS: u64 = std::mem::size_of::<ElementwiseParams>() as u64;

pub static UNARY: KernelDesc = KernelDesc {
    name: "unary",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: PARAMS,
};
pub static BINARY: KernelDesc = KernelDesc {
    name: "binary",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read],
    params_size: PARAMS,
};
pub static TERNARY: KernelDesc = KernelDesc {
    name: "ternary",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read, Access::Read],
    params_size: PARAMS,
};
pub static FILL: KernelDesc = KernelDesc {
    name: "fill",
    family: &FAMILY,
    storage: &[Access::ReadWrite],
    params_size: PARAMS,
};

/// Threads per workgroup (`WG` in the shader).
pub const WORKGROUP: u64 = 256;

/// Unary ops and ops with scalar operands: the `OP` codes of `unary_op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Copy = 0,
    Neg = 1,
    Exp = 2,
    Log = 3,
    Sqrt = 4,
    Rsqrt = 5,
    Abs = 6,
    Relu = 7,
    Tanh = 8,
    Sigmoid = 9,
    Gelu = 10,
    Sin = 11,
    Cos = 12,
    Square = 13,
    Recip = 14,
    AddScalar = 20,
    MulScalar = 21,
    PowScalar = 22,
    MaxScalar = 23,
    MinScalar = 24,
    RsubScalar = 25,
    RdivScalar = 26,
    Clamp = 27,
    Affine = 28,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 24] = [
        UnaryOp::Copy,
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Abs,
        UnaryOp::Relu,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Square,
        UnaryOp::Recip,
        UnaryOp::AddScalar,
        UnaryOp::MulScalar,
        UnaryOp::PowScalar,
        UnaryOp::MaxScalar,
        UnaryOp::MinScalar,
        UnaryOp::RsubScalar,
        UnaryOp::RdivScalar,
        UnaryOp::Clamp,
        UnaryOp::Affine,
    ];
}

/// Binary ops and comparisons (comparisons give 1.0 or 0.0): the `OP` codes of `binary_op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Max = 4,
    Min = 5,
    Pow = 6,
    Eq = 10,
    Ne = 11,
    Lt = 12,
    Le = 13,
    Gt = 14,
    Ge = 15,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 13] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
    ];
}

/// The `OP` codes of `ternary_op`: where, and the backward rules (g, x, y) -> dx.
pub mod ternary {
    use super::{BinaryOp, UnaryOp};

    /// a != 0 ? b : c.
    pub const WHERE: u32 = 0;
    /// g where x equals the extremum y (the backward of max and min reductions).
    pub const EXTREMUM_BACKWARD: u32 = 300;
    /// y (g - s), s = sum(g y) over the row.
    pub const SOFTMAX_BACKWARD: u32 = 301;
    /// g - exp(y) s, s = sum(g) over the row.
    pub const LOG_SOFTMAX_BACKWARD: u32 = 302;

    /// d(op)/dx times g, from x (the input) and y (the output).
    pub const fn unary_backward(op: UnaryOp) -> u32 {
        100 + op as u32
    }

    /// d(op)/d(left or right operand) times g, from the two operands.
    pub const fn binary_backward(op: BinaryOp, right: bool) -> u32 {
        200 + 2 * op as u32 + right as u32
    }

    /// Every code the engine dispatches.
    pub fn all() -> Vec<u32> {
        let mut v = vec![
            WHERE,
            EXTREMUM_BACKWARD,
            SOFTMAX_BACKWARD,
            LOG_SOFTMAX_BACKWARD,
        ];
        v.extend(UnaryOp::ALL.iter().map(|op| unary_backward(*op)));
        for op in &BinaryOp::ALL[..7] {
            v.push(binary_backward(*op, false));
            v.push(binary_backward(*op, true));
        }
        v
    }
}

/// The specialization of an elementwise kernel: op code; the vectorized contiguous path
/// (`vec4`) or the strided scalar path; overwrite or accumulate (`acc`) into the output.
pub fn spec(op: u32, vec4: bool, acc: bool) -> Spec {
    spec_out(op, vec4, acc, false)
}

/// `spec` with the output stored as f16 (`f16_out`): the kernel computes in f32 and rounds
/// each value once as it stores it.
pub fn spec_out(op: u32, vec4: bool, acc: bool, f16_out: bool) -> Spec {
    spec_typed(op, vec4, acc, f16_out, [false; 3])
}

/// `spec_out` with each of the inputs a, b, c stored as f16 where `f16_in` says (read and
/// computed as f32).
pub fn spec_typed(op: u32, vec4: bool, acc: bool, f16_out: bool, f16_in: [bool; 3]) -> Spec {
    let ty = |f16: bool| match (vec4, f16) {
        (true, false) => "vec4<f32>",
        (true, true) => "vec4<f16>",
        (false, false) => "f32",
        (false, true) => "f16",
    };
    Spec::new()
        .u32("OP", op)
        .ty("V", ty(false))
        .ty("VO", ty(f16_out))
        .ty("VA", ty(f16_in[0]))
        .ty("VB", ty(f16_in[1]))
        .ty("VC", ty(f16_in[2]))
        .bool("STRIDED", !vec4)
        .bool("ACC", acc)
}

/// Every variant; the f16 outputs where the adapter has shader-f16 (`f16`).
pub fn variants(f16: bool) -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    for vec4 in [false, true] {
        for acc in [false, true] {
            for op in UnaryOp::ALL {
                v.push((&UNARY, spec(op as u32, vec4, acc)));
            }
            for op in BinaryOp::ALL {
                v.push((&BINARY, spec(op as u32, vec4, acc)));
            }
            for code in ternary::all() {
                v.push((&TERNARY, spec(code, vec4, acc)));
            }
        }
        v.push((&FILL, spec(0, vec4, false)));
        if f16 {
            // GELU's gradient under autocast, stored f16 for the products that read it, from
            // (g, z, g): z, and the gradient of a GELU linear's output, stored f16 there.
            let gelu = ternary::unary_backward(UnaryOp::Gelu);
            v.push((&TERNARY, spec_out(gelu, vec4, false, true)));
            for f16_out in [false, true] {
                for g in [false, true] {
                    v.push((
                        &TERNARY,
                        spec_typed(gelu, vec4, false, f16_out, [g, true, g]),
                    ));
                }
                v.push((
                    &TERNARY,
                    spec_typed(gelu, vec4, false, f16_out, [true, false, true]),
                ));
            }
        }
    }
    v
}
