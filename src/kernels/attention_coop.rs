//! Launcher of `wgsl/attention_coop.wgsl`: fused causal attention on cooperative matrices, the
//! mixed-precision counterpart of `attention` (same params, bindings and passes; f16 products,
//! f32 softmax and accumulation). Chosen for an autocast forward on adapters with cooperative
//! matrices, when D and every view's offset and strides are multiples of 4 (the kernels read q,
//! k, v, dO four elements at a time).

use super::attention::{AttentionParams, Pass, HEAD_DIMS};
use super::matmul_coop::Coop;
use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "attention_coop",
    source: include_str!("../../wgsl/attention_coop.wgsl"),
    workgroup_reduce: false,
};

const PARAMS: u64 = std::mem::size_of::<AttentionParams>() as u64;

/// O (B, H, T, D), lse (B, H, T) <- q, k, v.
pub static ATTN_COOP_FWD: KernelDesc = KernelDesc {
    name: "attn_coop_fwd",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite, // O
        Access::ReadWrite, // lse
        Access::Read,      // q
        Access::Read,      // k
        Access::Read,      // v
    ],
    params_size: PARAMS,
};

/// dQ (B, H, T, D), D (B, H, T) <- q, k, v, dO, lse, O.
pub static ATTN_COOP_DQ: KernelDesc = KernelDesc {
    name: "attn_coop_dq",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite, // dQ
        Access::ReadWrite, // D
        Access::Read,      // q
        Access::Read,      // k
        Access::Read,      // v
        Access::Read,      // dO
        Access::Read,      // lse
        Access::Read,      // O
    ],
    params_size: PARAMS,
};

/// dK, dV (B, H, T, D) <- q, k, v, dO, lse, D (after `ATTN_COOP_DQ`).
pub static ATTN_COOP_DKV: KernelDesc = KernelDesc {
    name: "attn_coop_dkv",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite, // dK
        Access::ReadWrite, // dV
        Access::Read,      // q
        Access::Read,      // k
        Access::Read,      // v
        Access::Read,      // dO
        Access::Read,      // lse
        Access::Read,      // D
    ],
    params_size: PARAMS,
};

pub fn kernel(pass: Pass) -> &'static KernelDesc {
    match pass {
        Pass::Forward => &ATTN_COOP_FWD,
        Pass::Dq => &ATTN_COOP_DQ,
        Pass::Dkv => &ATTN_COOP_DKV,
    }
}

/// A pass's blocking: `sg` subgroups of fragment rows (the workgroup's own rows: queries, or
/// keys for dK/dV), blocks of `bc` rows of the other side, head dim padded to `dmax`; the
/// [row][d] products (O, dQ, dV, dK) go through the f32 scratch in `parts` column ranges (so
/// the scratch is dmax / parts wide, and more subgroups fit the workgroup memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub sg: u32,
    pub bc: u32,
    pub dmax: u32,
    pub parts: u32,
}

impl Tile {
    /// The workgroup's own rows.
    pub fn rows(&self, coop: Coop) -> u32 {
        self.sg * coop.fs
    }

    /// Bytes of workgroup memory `pass` declares (mirrors the `var<workgroup>` arrays of
    /// attention_coop.wgsl; the ones a pass does not use have one element).
    pub fn workgroup_bytes(&self, pass: Pass, coop: Coop) -> u32 {
        let rows = self.rows(coop);
        let dkv = pass == Pass::Dkv;
        let bwd = pass != Pass::Forward;
        let (qrows, krows) = if dkv {
            (self.bc, rows)
        } else {
            (rows, self.bc)
        };
        let ds = self.dmax + 8;
        let ps = self.bc + 8;
        let one = |used: bool, n: u32| if used { n } else { 1 };
        let halves = qrows * ds // q_sh
            + 2 * krows * ds // k_sh, v_sh
            + one(bwd, qrows * ds) // do_sh
            + one(pass != Pass::Dq, rows * ps) // pp_sh
            + one(bwd, rows * ps); // ds_sh
        let floats = rows * (self.bc.max(self.dmax / self.parts) + 4) // sc
            + one(bwd, rows * (self.bc + 4)) // sc2
            + 2 * one(dkv, self.bc); // lse_c, dvec_c
        2 * halves + 4 * floats
    }
}

/// The tile of `pass` at padded head dim `dmax` on `coop`: the first of the candidates (most
/// rows per workgroup first) that fits `max_workgroup_bytes`.
pub fn tile(pass: Pass, dmax: u32, coop: Coop, max_workgroup_bytes: u32) -> Option<Tile> {
    // DistilGPT-2 at 8 x 512 (D 64) on an H200: the forward ran in 1.7 ms with 4 x 32 against
    // 3.7 ms with 2 x 64 (2026-11-22); dQ in 2.35 ms with 4 x 16 against 4.45 ms with 2 x 32
    // (2026-11-23). dK/dV hold more tiles: 4 x 16 fits with its scratch in 2 column parts.
    let candidates: &[(u32, u32, u32)] = match pass {
        Pass::Forward => &[(4, 32, 1), (2, 32, 1), (2, 16, 1), (1, 16, 1)],
        Pass::Dq => &[(4, 16, 1), (2, 32, 1), (2, 16, 1), (1, 16, 1)],
        Pass::Dkv => &[(4, 16, 2), (2, 32, 1), (2, 16, 1), (1, 16, 1)],
    };
    forced_tile()
        .into_iter()
        .chain(candidates.iter().copied())
        .map(|(sg, bc, parts)| Tile {
            sg,
            bc,
            dmax,
            parts,
        })
        .find(|t| {
            t.dmax.is_multiple_of(coop.fs)
                && t.bc.is_multiple_of(coop.fs)
                // Each part whole fragments, and a lane's columns inside one part.
                && t.parts >= 1
                && t.dmax.is_multiple_of(t.parts * coop.fs)
                && t.parts <= coop.sgs / coop.fs
                && t.workgroup_bytes(pass, coop) <= max_workgroup_bytes
        })
}

/// `WGRAD_ATTN_TILE=SGxBC[xPARTS]` (e.g. `4x32`, `4x16x2`) tries that blocking first, where it
/// fits (a measurement switch).
fn forced_tile() -> Option<(u32, u32, u32)> {
    static FORCED: std::sync::OnceLock<Option<(u32, u32, u32)>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        let s = std::env::var("WGRAD_ATTN_TILE").ok()?;
        let mut it = s.split('x').map(|x| x.parse().ok());
        let (sg, bc) = (it.next()??, it.next()??);
        let parts = match it.next() {
            Some(p) => p?,
            None => 1,
        };
        Some((sg, bc, parts))
    })
}

/// `acc_a`: add into the first output (dQ, or dK) instead of overwriting it; `acc_b` the
/// same for dV.
pub fn spec(pass: Pass, t: Tile, coop: Coop, acc_a: bool, acc_b: bool) -> Spec {
    coop.with_fragments(Spec::new())
        .u32("KIND", pass as u32)
        .u32("FS", coop.fs)
        .u32("SGS", coop.sgs)
        .u32("SG", t.sg)
        .u32("BC", t.bc)
        .u32("DMAX", t.dmax)
        .u32("DPARTS", t.parts)
        .bool("ACC_DQ", pass == Pass::Dq && acc_a)
        .bool("ACC_DK", pass == Pass::Dkv && acc_a)
        .bool("ACC_DV", pass == Pass::Dkv && acc_b)
}

/// Every variant on `coop` with `max_workgroup_bytes`: each pass, padded head dim and
/// accumulate flag.
pub fn variants(coop: Coop, max_workgroup_bytes: u32) -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    for dmax in HEAD_DIMS {
        for pass in [Pass::Forward, Pass::Dq, Pass::Dkv] {
            let Some(t) = tile(pass, dmax, coop, max_workgroup_bytes) else {
                continue;
            };
            let accs: &[(bool, bool)] = match pass {
                Pass::Forward => &[(false, false)],
                Pass::Dq => &[(false, false), (true, false)],
                Pass::Dkv => &[(false, false), (true, false), (false, true), (true, true)],
            };
            for &(a, b) in accs {
                v.push((kernel(pass), spec(pass, t, coop, a, b)));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pass_and_head_dim_has_a_tile_on_nvidia_and_apple() {
        for (coop, limit) in [(Coop::NVIDIA, 49152), (Coop::APPLE, 32768)] {
            for dmax in HEAD_DIMS {
                for pass in [Pass::Forward, Pass::Dq, Pass::Dkv] {
                    let t = tile(pass, dmax, coop, limit);
                    assert!(t.is_some(), "{pass:?} at D {dmax} on {coop:?}");
                }
            }
        }
    }
}
