//! Kernel variants by name, for the tools that print or inspect one (`wgrad wgsl`, the `lab`
//! build's shader_stats example):
//!
//! - `coop:TILE[:ENTRY[:vec]]`: the cooperative-matrix matmul on NVIDIA's fragments (16x16x16,
//!   subgroups of 32), f16 x f16 -> f32, both operands read as 16-byte units along their
//!   unit-stride dim (the 4096³ case of `wgrad bench matmul --dtype f16`); ENTRY one of its
//!   entry points (`matmul_coop_bias_gelu`, ...); `:vec` stores C 4 columns a lane;
//! - `tiled:TILE[:ENTRY[:v4]]`: the tiled f32 kernel; `:v4` reads both operands in vectors of
//!   4 (a vector tile's aligned products);
//! - `attn:fwd|bwd:IN[:GRAD[:OUT]]`: the cooperative-matrix attention at head dim 64, q, k, v
//!   of type IN, dO of GRAD, outputs of OUT (each f32 or f16; GRAD and OUT default to IN).
//!
//! TILE as `CoopTile::name` and `Tile::name` print them (`2x2/4x4/32`, `128x64x8/8x4v`).

use super::attention::Pass;
use super::attention_coop::{self, Io};
use super::matmul::{self, Tile, Types};
use super::matmul_coop::{self, CStore, Coop, CoopTile, OperandAccess, Variant};
use super::{compose_source, DType, Family, KernelDesc, Spec};

/// One kernel variant: what it was asked as, its family, entry point and specialization.
pub struct Named {
    pub name: String,
    pub family: &'static Family,
    pub entry: &'static str,
    pub spec: Spec,
}

impl Named {
    /// The complete WGSL naga compiles for it (with subgroup operations).
    pub fn source(&self) -> String {
        compose_source(self.family, &self.spec, true)
    }
}

/// The variant `name` names (see the module's note), or what is wrong with the name.
pub fn parse(name: &str) -> Result<Named, String> {
    let bad = |what: &str| format!("`{name}`: {what}");
    let (kind, rest) = name
        .split_once(':')
        .ok_or_else(|| bad("expected coop:TILE, tiled:TILE or attn:fwd|bwd:TYPE"))?;
    let mut parts = rest.split(':');
    let first = parts.next().unwrap_or_default();
    let entry = parts.next();
    let flag = parts.next();
    let named = |family, entry, spec| Named {
        name: name.to_string(),
        family,
        entry,
        spec,
    };
    match kind {
        "coop" => {
            let t = CoopTile::parse(first).ok_or_else(|| bad("TILE is SGMxSGN/FMxFN[/BK]"))?;
            let entry = entry_named(
                entry,
                &[
                    &matmul_coop::MATMUL_COOP,
                    &matmul_coop::MATMUL_COOP_BIAS,
                    &matmul_coop::MATMUL_COOP_BIAS_GELU,
                    &matmul_coop::MATMUL_COOP_BIAS_RES,
                    &matmul_coop::MATMUL_COOP_SUMS,
                ],
            )
            .ok_or_else(|| bad("not an entry point of matmul_coop"))?;
            let c = match flag {
                None => CStore::Elems,
                Some("vec") => CStore::Vec4,
                Some(f) => return Err(bad(&format!("`:{f}` is not `:vec`"))),
            };
            let wide = OperandAccess {
                along_cols: true,
                vec: true,
                wide: true,
            };
            let variant = Variant {
                ones: entry == "matmul_coop_sums",
                ..Variant::new(t, false, Types::F16, Coop::NVIDIA, (wide, wide), c)
            };
            Ok(named(&matmul_coop::FAMILY, entry, variant.spec()))
        }
        "tiled" => {
            let t = Tile::parse(first).ok_or_else(|| bad("TILE is BMxBNxBK/TMxTN[v]"))?;
            let entry = entry_named(
                entry,
                &[
                    &matmul::MATMUL,
                    &matmul::MATMUL_BIAS,
                    &matmul::MATMUL_BIAS_GELU,
                    &matmul::MATMUL_BIAS_RES,
                    &matmul::MATMUL_SUMS,
                ],
            )
            .ok_or_else(|| bad("not an entry point of matmul"))?;
            let v4 = match flag {
                None => false,
                Some("v4") if t.vec => true,
                Some(f) => return Err(bad(&format!("`:{f}`: `:v4` on a vector tile only"))),
            };
            let spec = matmul::spec_ones(t, false, Types::F32, (v4, v4), entry == "matmul_sums");
            Ok(named(&matmul::FAMILY, entry, spec))
        }
        "attn" => {
            let dtype = |s: Option<&str>, default: Option<DType>| match s {
                Some("f32") => Ok(DType::F32),
                Some("f16") => Ok(DType::F16),
                None => default.ok_or_else(|| bad("the input type (f32 or f16) is missing")),
                Some(t) => Err(bad(&format!("`{t}` is neither f32 nor f16"))),
            };
            let pass = match first {
                "fwd" => Pass::Forward,
                "bwd" => Pass::Dkv,
                p => return Err(bad(&format!("`{p}` is neither fwd nor bwd"))),
            };
            let input = dtype(entry, None)?;
            let grad = dtype(flag, Some(input))?;
            let out = dtype(parts.next(), Some(input))?;
            let t = attention_coop::tile(pass, 64, Coop::NVIDIA, 48 << 10)
                .ok_or_else(|| bad("no tile fits NVIDIA's 48 KiB"))?;
            let io = Io { input, grad, out };
            let spec = attention_coop::spec(pass, t, Coop::NVIDIA, false, false, io);
            let k = attention_coop::kernel(pass);
            Ok(named(k.family, k.name, spec))
        }
        k => Err(bad(&format!("`{k}` is not coop, tiled or attn"))),
    }
}

/// The entry point `name` among a family's `kernels` (the first where no name is given).
fn entry_named(name: Option<&str>, kernels: &[&'static KernelDesc]) -> Option<&'static str> {
    match name {
        None => Some(kernels[0].name),
        Some(n) => kernels.iter().map(|k| k.name).find(|k| *k == n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_variants_compose_and_bad_names_say_why() {
        for name in [
            "coop:2x2/4x4/32",
            "coop:2x4/4x2/64:matmul_coop_bias_gelu:vec",
            "tiled:128x64x8/8x4v:matmul_bias_res:v4",
            "attn:bwd:f16:f32:f16",
        ] {
            let n = parse(name).expect(name);
            let src = n.source();
            assert!(src.contains(&format!("fn {}(", n.entry)), "{name}");
        }
        for (name, says) in [
            ("coop:2x2", "TILE"),
            ("tiled:64x64x8/4x4:matmul_bias:v4", "vector tile"),
            ("attn:up:f16", "neither fwd"),
            ("gemm:1", "not coop"),
        ] {
            let e = parse(name).err().expect(name);
            assert!(e.contains(says), "{name}: {e}");
        }
    }
}
