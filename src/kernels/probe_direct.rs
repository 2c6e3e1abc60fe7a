//! A measurement probe (`lab`): the cooperative-matrix matmul with its fragments loaded
//! straight from the storage buffers (`wgsl/matmul_direct.wgsl`), no workgroup memory and no
//! barriers; the subgroups of a workgroup share what they read through the L1 cache. Square
//! f16 products only (n a multiple of the workgroup tile): it measures whether tensor cores fed
//! this way outrun `matmul_coop`'s staging through workgroup memory (`profile::ceilings::
//! direct_probe`, the `matmul_probe` example).

use bytemuck::{Pod, Zeroable};

use super::matmul_coop::Coop;
use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "matmul_direct",
    source: include_str!("../../wgsl/matmul_direct.wgsl"),
    workgroup_reduce: false,
};

pub static MATMUL_DIRECT: KernelDesc = KernelDesc {
    name: "matmul_direct",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read],
    params_size: std::mem::size_of::<DirectParams>() as u64,
};

/// Mirrors `Params` in the WGSL.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct DirectParams {
    pub n: u32,
    pub _pad: [u32; 3],
}

/// The probe's shape: SG_M x SG_N subgroups of FM x FN fragments each; operands bound as
/// `vec4<f16>` (`wide`) or f16; the next step's fragments loaded while a step multiplies
/// (`prefetch`). Named `SGMxSGN/FMxFN[/h][/np]` (h: f16 bindings; np: no prefetch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirectTile {
    pub sg_m: u32,
    pub sg_n: u32,
    pub fm: u32,
    pub fn_: u32,
    pub wide: bool,
    pub prefetch: bool,
}

impl DirectTile {
    pub fn name(&self) -> String {
        format!(
            "{}x{}/{}x{}{}{}",
            self.sg_m,
            self.sg_n,
            self.fm,
            self.fn_,
            if self.wide { "" } else { "/h" },
            if self.prefetch { "" } else { "/np" }
        )
    }

    pub fn parse(s: &str) -> Option<DirectTile> {
        let mut parts = s.split('/');
        let pair = |p: Option<&str>| -> Option<(u32, u32)> {
            let (x, y) = p?.split_once('x')?;
            Some((x.parse().ok()?, y.parse().ok()?))
        };
        let (sg_m, sg_n) = pair(parts.next())?;
        let (fm, fn_) = pair(parts.next())?;
        let mut t = DirectTile {
            sg_m,
            sg_n,
            fm,
            fn_,
            wide: true,
            prefetch: true,
        };
        for flag in parts {
            match flag {
                "h" => t.wide = false,
                "np" => t.prefetch = false,
                _ => return None,
            }
        }
        let ok =
            (1..=8).contains(&(sg_m * sg_n)) && (1..=8).contains(&fm) && (1..=8).contains(&fn_);
        ok.then_some(t)
    }

    /// Rows and columns of C a workgroup computes.
    pub fn block(&self, coop: Coop) -> (u32, u32) {
        (
            self.sg_m * self.fm * coop.fs,
            self.sg_n * self.fn_ * coop.fs,
        )
    }

    pub fn spec(&self, coop: Coop) -> Spec {
        coop.with_fragments(Spec::new())
            .u32("FS", coop.fs)
            .u32("SGS", coop.sgs)
            .u32("SG_M", self.sg_m)
            .u32("SG_N", self.sg_n)
            .u32("FM", self.fm)
            .u32("FN", self.fn_)
            .u32("W", if self.wide { 4 } else { 1 })
            .u32("GROUP_M", 8)
            .ty("ET", if self.wide { "vec4<f16>" } else { "f16" })
            .source("BODY", body(*self))
    }
}

/// The entry point for tile `t`, every fragment a variable of its own (a loop kept by the
/// compiler would index them at run time): generated once per tile and kept for the process.
fn body(t: DirectTile) -> &'static str {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static CACHE: Mutex<BTreeMap<DirectTile, &'static str>> = Mutex::new(BTreeMap::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry(t)
        .or_insert_with(|| Box::leak(body_source(t).into_boxed_str()))
}

fn body_source(t: DirectTile) -> String {
    use std::fmt::Write;
    let (fm, fn_) = (t.fm, t.fn_);
    let mut s = String::new();
    let w = |s: &mut String, line: String| {
        s.push_str(&line);
        s.push('\n');
    };
    w(&mut s, "@compute @workgroup_size(WG)".into());
    w(
        &mut s,
        "fn matmul_direct(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32) {"
            .into(),
    );
    w(&mut s, "    let n = p.n;".into());
    w(
        &mut s,
        "    let tile = tile_of(wid.x, n / BM, n / BN);".into(),
    );
    w(
        &mut s,
        "    let row0 = tile.x * BM + (sg / SG_N) * FM * FS;".into(),
    );
    w(
        &mut s,
        "    let col0 = tile.y * BN + (sg % SG_N) * FN * FS;".into(),
    );
    w(&mut s, "    let st = n / W;".into());
    for i in 0..fm {
        w(&mut s, format!("    let ao{i} = (row0 + {i}u * FS) * st;"));
    }
    for j in 0..fn_ {
        w(&mut s, format!("    let bo{j} = (col0 + {j}u * FS) / W;"));
    }
    for i in 0..fm {
        for j in 0..fn_ {
            w(&mut s, format!("    var acc{i}_{j} = MC();"));
        }
    }
    let loads = |s: &mut String, prefix: &str, decl: &str, k: &str| {
        for i in 0..fm {
            let _ = writeln!(s, "        let ia{i} = ao{i} + {k} / W;");
            let _ = writeln!(
                s,
                "        {decl}{prefix}a{i} = coopLoadT<MA>(&a[ia{i}], st);"
            );
        }
        for j in 0..fn_ {
            let _ = writeln!(s, "        let ib{j} = bo{j} + {k} * st;");
            let _ = writeln!(
                s,
                "        {decl}{prefix}b{j} = coopLoadT<MB>(&b[ib{j}], st);"
            );
        }
    };
    let multiply = |s: &mut String, indent: &str| {
        for i in 0..fm {
            for j in 0..fn_ {
                let _ = writeln!(
                    s,
                    "{indent}acc{i}_{j} = coopMultiplyAdd(a{i}, b{j}, acc{i}_{j});"
                );
            }
        }
    };
    if t.prefetch {
        // The first step's fragments, then each step loads the next before multiplying.
        w(&mut s, "    {".into());
        loads(&mut s, "f", "let ", "0u");
        for i in 0..fm {
            w(&mut s, format!("        a{i} = fa{i};"));
        }
        for j in 0..fn_ {
            w(&mut s, format!("        b{j} = fb{j};"));
        }
        w(&mut s, "    }".into());
        // The declarations must come before that block: insert them.
        let mut decl = String::new();
        for i in 0..fm {
            let _ = writeln!(decl, "    var a{i} = MA();");
        }
        for j in 0..fn_ {
            let _ = writeln!(decl, "    var b{j} = MB();");
        }
        let at = s.rfind("    {\n").expect("the block just written");
        s.insert_str(at, &decl);
        w(&mut s, "    for (var k = FS; k < n; k += FS) {".into());
        loads(&mut s, "n", "let ", "k");
        multiply(&mut s, "        ");
        for i in 0..fm {
            w(&mut s, format!("        a{i} = na{i};"));
        }
        for j in 0..fn_ {
            w(&mut s, format!("        b{j} = nb{j};"));
        }
        w(&mut s, "    }".into());
        multiply(&mut s, "    ");
    } else {
        w(&mut s, "    for (var k = 0u; k < n; k += FS) {".into());
        loads(&mut s, "", "let ", "k");
        multiply(&mut s, "        ");
        w(&mut s, "    }".into());
    }
    for i in 0..fm {
        for j in 0..fn_ {
            w(
                &mut s,
                format!("    let oc{i}_{j} = (row0 + {i}u * FS) * n + col0 + {j}u * FS;"),
            );
            w(
                &mut s,
                format!("    coopStoreT(acc{i}_{j}, &c[oc{i}_{j}], n);"),
            );
        }
    }
    w(&mut s, "}".into());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in ["2x2/4x4", "2x4/4x4/h", "1x1/2x2/np", "4x2/2x4/h/np"] {
            let t = DirectTile::parse(name).expect(name);
            assert_eq!(t.name(), name);
        }
        assert!(DirectTile::parse("3x3/4x4").is_none());
        assert!(DirectTile::parse("2x2/4x4/x").is_none());
    }

    #[test]
    fn every_fragment_multiplies_and_stores() {
        let t = DirectTile::parse("2x2/4x2").unwrap();
        let src = body_source(t);
        assert_eq!(src.matches("coopMultiplyAdd(").count(), 2 * 8);
        assert_eq!(src.matches("coopStoreT(").count(), 8);
        let np = body_source(DirectTile::parse("2x2/4x2/np").unwrap());
        assert_eq!(np.matches("coopMultiplyAdd(").count(), 8);
    }
}
