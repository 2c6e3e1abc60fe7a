//! Every variant a training step may run on a given adapter, for the tests that compile and
//! translate them all (tests/portability.rs).

use super::{
    pre_binding, pre_vectors, CStore, Coop, OperandAccess, Variant, COOP_TILES, MATMUL_COOP,
    MATMUL_COOP_BIAS, MATMUL_COOP_BIAS_GELU, MATMUL_COOP_BIAS_RES, MATMUL_COOP_SPLIT,
    MATMUL_COOP_X3, MATMUL_COOP_X3_BIAS, MATMUL_COOP_X3_BIAS_GELU, MATMUL_COOP_X3_BIAS_RES,
    MATMUL_COOP_X3_SUMS, X3_TILES,
};
use crate::kernels::matmul::{SplitEpilogue, Types, STEP_TYPES};
use crate::kernels::{DType, KernelDesc, Spec};

fn spec(
    t: super::CoopTile,
    acc: bool,
    ty: Types,
    coop: Coop,
    ab: (OperandAccess, OperandAccess),
    c: CStore,
) -> Spec {
    Variant::new(t, acc, ty, coop, ab, c).spec()
}

#[allow(clippy::too_many_arguments)]
fn spec_ones(
    t: super::CoopTile,
    acc: bool,
    ty: Types,
    coop: Coop,
    ab: (OperandAccess, OperandAccess),
    c: CStore,
    ones: bool,
    x3: bool,
) -> Spec {
    Variant {
        ones,
        x3,
        ..Variant::new(t, acc, ty, coop, ab, c)
    }
    .spec()
}

/// Every variant for an adapter offering `coop` with `max_workgroup_bytes`: each default tile
/// and a two-stage one, accumulate or not, each of the step's storage types, each way of
/// reading A and B, each epilogue; and, with the ways of reading A and of reading B paired in
/// order (as many pairs as the shorter list), each epilogue storing C in vectors (where the
/// adapter's fragments allow it) and each split product.
pub fn variants(coop: Coop, max_workgroup_bytes: u32) -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    for ty in STEP_TYPES {
        // Each way of reading an operand of type `t`: along either dim, gathered or vectors
        // (and, f16, 16-byte vectors).
        let accesses = |t: DType| {
            let mut ways = Vec::new();
            for along_cols in [false, true] {
                for (vec, wide) in [(false, false), (true, false), (true, true)] {
                    if !wide || t == DType::F16 {
                        ways.push(OperandAccess {
                            along_cols,
                            vec,
                            wide,
                        });
                    }
                }
            }
            ways
        };
        let (a_ways, b_ways) = (accesses(ty.a), accesses(ty.b));
        for t in COOP_TILES
            .into_iter()
            .chain([super::tile(2, 4, 4, 2, 32, 2)])
            .filter(|t| t.valid(coop, max_workgroup_bytes, false))
        {
            for acc in [false, true] {
                for &a in &a_ways {
                    for &b in &b_ways {
                        for kernel in [&MATMUL_COOP, &MATMUL_COOP_BIAS, &MATMUL_COOP_BIAS_GELU] {
                            v.push((kernel, spec(t, acc, ty, coop, (a, b), CStore::Elems)));
                        }
                        // GELU's pre-activation stored f16 (autocast).
                        let s = spec(t, acc, ty, coop, (a, b), CStore::Elems);
                        v.push((&MATMUL_COOP_BIAS_GELU, pre_binding(s, false, true)));
                        // A residual is added to a new f32 output.
                        if !acc && ty.c == DType::F32 {
                            let s = spec(t, acc, ty, coop, (a, b), CStore::Elems);
                            v.push((&MATMUL_COOP_BIAS_RES, s));
                        }
                    }
                }
                // C stored in vectors through the scratch tile (where the adapter's fragments
                // allow it): each epilogue, the ways of reading A and B paired in order.
                if coop.stores_vectors() {
                    for (&a, &b) in a_ways.iter().zip(&b_ways) {
                        let s = spec(t, acc, ty, coop, (a, b), CStore::Vec4);
                        for kernel in [&MATMUL_COOP, &MATMUL_COOP_BIAS, &MATMUL_COOP_BIAS_GELU] {
                            v.push((kernel, s.clone()));
                        }
                        // `pre` in vectors too (GELU's pre-activation, the residual).
                        v.push((&MATMUL_COOP_BIAS_GELU, pre_vectors(s.clone())));
                        v.push((&MATMUL_COOP_BIAS_GELU, pre_binding(s.clone(), true, true)));
                        if !acc && ty.c == DType::F32 {
                            v.push((&MATMUL_COOP_BIAS_RES, s.clone()));
                            v.push((&MATMUL_COOP_BIAS_RES, pre_vectors(s)));
                        }
                    }
                }
                // A split product in one dispatch, with each epilogue its sum serves (the ways
                // of reading A and B paired in order).
                for (&a, &b) in a_ways.iter().zip(&b_ways) {
                    let s = |ones| spec_ones(t, acc, ty, coop, (a, b), CStore::Elems, ones, false);
                    for epi in [SplitEpilogue::Plain, SplitEpilogue::Bias] {
                        v.push((&MATMUL_COOP_SPLIT, epi.spec(s(false))));
                    }
                    if !acc && ty.c == DType::F32 {
                        v.push((
                            &MATMUL_COOP_SPLIT,
                            SplitEpilogue::BiasResidual.spec(s(false)),
                        ));
                    }
                    if ty.c == DType::F32 {
                        v.push((&MATMUL_COOP_SPLIT, SplitEpilogue::ColumnSums.spec(s(true))));
                    }
                }
            }
        }
    }
    v.extend(x3_variants(coop, max_workgroup_bytes));
    v
}

/// The X3 variants (f32 operands and C): each default X3 tile, accumulate or not, the four
/// ways of reading an f32 operand (A's paired with B's in reverse order: each way of each
/// operand once), each epilogue, column sums (A_ONES) and, not accumulating, the residual; C
/// stored element by element and, where the adapter's fragments allow it, in vectors.
fn x3_variants(coop: Coop, max_workgroup_bytes: u32) -> Vec<(&'static KernelDesc, Spec)> {
    let ty = Types {
        a: DType::F32,
        b: DType::F32,
        c: DType::F32,
        half: false,
    };
    let ways: Vec<OperandAccess> = [false, true]
        .into_iter()
        .flat_map(|along_cols| {
            [false, true].map(|vec| OperandAccess {
                along_cols,
                vec,
                wide: false,
            })
        })
        .collect();
    // C stored element by element, and in vectors where the adapter's fragments allow it.
    let stores: &[CStore] = if coop.stores_vectors() {
        &[CStore::Elems, CStore::Vec4]
    } else {
        &[CStore::Elems]
    };
    let mut v = Vec::new();
    for t in X3_TILES
        .into_iter()
        .filter(|t| t.valid(coop, max_workgroup_bytes, true))
    {
        for acc in [false, true] {
            for (&a, &b) in ways.iter().zip(ways.iter().rev()) {
                let spec = |ones, c| spec_ones(t, acc, ty, coop, (a, b), c, ones, true);
                for kernel in [
                    &MATMUL_COOP_X3,
                    &MATMUL_COOP_X3_BIAS,
                    &MATMUL_COOP_X3_BIAS_GELU,
                ] {
                    for &c in stores {
                        v.push((kernel, spec(false, c)));
                    }
                }
                for &c in stores {
                    v.push((&MATMUL_COOP_X3_SUMS, spec(true, c)));
                    if !acc {
                        v.push((&MATMUL_COOP_X3_BIAS_RES, spec(false, c)));
                    }
                }
                // Vector stores with `pre` in vectors too (GELU's pre-activation, the residual).
                if stores.len() > 1 {
                    v.push((
                        &MATMUL_COOP_X3_BIAS_GELU,
                        pre_vectors(spec(false, CStore::Vec4)),
                    ));
                    if !acc {
                        v.push((
                            &MATMUL_COOP_X3_BIAS_RES,
                            pre_vectors(spec(false, CStore::Vec4)),
                        ));
                    }
                }
            }
        }
    }
    v
}
