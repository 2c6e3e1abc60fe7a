//! Launcher of `wgsl/absmax.wgsl`: the partial maxima of |x| over the two f32 operands of a
//! product that runs on the tensor cores as three f16 products (`matmul_coop`'s X3 variant,
//! which scales each operand by a power of two found from them).

use bytemuck::{Pod, Zeroable};

use super::matmul::OperandLayout;
use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "absmax",
    source: include_str!("../../wgsl/absmax.wgsl"),
    workgroup_reduce: true,
};

/// Workgroups (partial maxima) per operand; the product's subgroups each fold all of them.
pub const PARTS: u32 = 128;

/// One operand as a (batch, rows, cols) view; mirrors `Operand` in absmax.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable, PartialEq, Eq)]
pub struct OperandView {
    pub off: u32,
    pub bs: u32,
    pub rs: u32,
    pub cs: u32,
    pub batch: u32,
    pub rows: u32,
    pub cols: u32,
    /// Read in vectors of 4 along the rows (1) or element by element (0).
    pub vec: u32,
}

impl OperandView {
    /// The view of `l`'s elements, its unit-stride dim (if either is) as the columns, so a
    /// row's lanes read neighbouring elements; rows that follow each other in memory merged
    /// into one (and batches likewise), and a broadcast batch read once. The largest magnitude
    /// depends on neither the order nor repeats. Read in vectors where the columns are
    /// unit-stride, every row starts on a vector of 4 and the last row's last vector (rounded
    /// up to 4 elements) lies inside the binding.
    pub fn of(l: &OperandLayout) -> OperandView {
        let transposed = l.col_stride != 1 && l.row_stride == 1;
        let ((mut rows, mut rs), (mut cols, cs)) = if transposed {
            ((l.cols, l.col_stride), (l.rows, l.row_stride))
        } else {
            ((l.rows, l.row_stride), (l.cols, l.col_stride))
        };
        let (mut batch, mut bs) = (l.batch, l.batch_stride);
        if bs == 0 {
            batch = 1;
        }
        if cs == 1 && (rs == cols || rows == 1) {
            (cols, rows, rs) = (rows * cols, 1, 0);
            if batch > 1 && bs == cols {
                (cols, batch, bs) = (batch * cols, 1, 0);
            }
        }
        let end = l.offset + (batch - 1) * bs + (rows - 1) * rs + cols.next_multiple_of(4);
        let vec = cs == 1
            && l.offset.is_multiple_of(4)
            && (rows == 1 || rs.is_multiple_of(4))
            && (batch == 1 || bs.is_multiple_of(4))
            && end <= l.bound_elements / 4 * 4;
        OperandView {
            off: l.offset as u32,
            bs: bs as u32,
            rs: rs as u32,
            cs: cs as u32,
            batch: batch as u32,
            rows: rows as u32,
            cols: cols as u32,
            vec: vec as u32,
        }
    }
}

/// Mirrors `Params` in absmax.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AbsmaxParams {
    pub a: OperandView,
    pub b: OperandView,
    /// Where operand 0's partials start in the output (operand 1's follow, `PARTS` later).
    pub out_off: u32,
    pub _pad: [u32; 3],
}

/// Bindings: the partial maxima (u32 bits, 2 x `PARTS` from `out_off`), A, B (f32). Grid
/// (`PARTS`, 2).
pub static ABSMAX: KernelDesc = KernelDesc {
    name: "absmax",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read],
    params_size: std::mem::size_of::<AbsmaxParams>() as u64,
};

pub fn spec() -> Spec {
    Spec::new().u32("PARTS", PARTS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::DType;

    #[test]
    fn views_read_along_the_unit_stride_dim_and_merge_what_is_contiguous() {
        let l = OperandLayout {
            dtype: DType::F32,
            offset: 3,
            batch_stride: 0,
            batch: 1,
            rows: 768,
            row_stride: 1,
            cols: 4096,
            col_stride: 768,
            bound_elements: 3 + 768 * 4096,
        };
        // Contiguous: one row (from element 3: not in vectors).
        let v = OperandView::of(&l);
        assert_eq!(
            (v.rows, v.cols, v.cs, v.off, v.vec),
            (1, 768 * 4096, 1, 3, 0)
        );
        let v = OperandView::of(&OperandLayout {
            offset: 4,
            bound_elements: 4 + 768 * 4096,
            ..l
        });
        assert_eq!((v.rows, v.vec), (1, 1));
        // Rows padded apart stay rows.
        let padded = OperandLayout {
            row_stride: 1,
            col_stride: 776,
            ..l
        };
        let v = OperandView::of(&padded);
        assert_eq!((v.rows, v.rs, v.cols, v.cs, v.vec), (4096, 776, 768, 1, 0));
        // Rows of 50,257 padded to 50,264 from element 0: vectors, if the last row's last
        // vector (rounded up) lies in the binding.
        let lm = OperandLayout {
            offset: 0,
            rows: 50257,
            row_stride: 1,
            cols: 4096,
            col_stride: 50264,
            bound_elements: 4096 * 50264,
            ..l
        };
        let v = OperandView::of(&lm);
        assert_eq!((v.rows, v.rs, v.cols, v.vec), (4096, 50264, 50257, 1));
        let v = OperandView::of(&OperandLayout {
            bound_elements: 4095 * 50264 + 50258,
            ..lm
        });
        assert_eq!(v.vec, 0);
        // Contiguous batches merge; a broadcast batch is read once.
        let batched = OperandLayout {
            row_stride: 4096,
            col_stride: 1,
            rows: 768,
            cols: 4096,
            batch: 3,
            batch_stride: 768 * 4096,
            ..l
        };
        let v = OperandView::of(&batched);
        assert_eq!((v.batch, v.rows, v.cols), (1, 1, 3 * 768 * 4096));
        let v = OperandView::of(&OperandLayout {
            batch_stride: 0,
            ..batched
        });
        assert_eq!((v.batch, v.rows, v.cols), (1, 1, 768 * 4096));
        // Neither dim unit-stride: as it is.
        let v = OperandView::of(&OperandLayout {
            row_stride: 10,
            col_stride: 2,
            rows: 5,
            cols: 4,
            batch: 1,
            ..l
        });
        assert_eq!((v.rows, v.rs, v.cols, v.cs), (5, 10, 4, 2));
    }
}
