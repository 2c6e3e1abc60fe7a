//! Measurement knobs (`--features lab`): forced tiles, ablations, constants to sweep. A default
//! build reads none of these variables (setting one is an error there) and `Lab` is empty:
//! each knob's accessor returns "not set", a constant the compiler folds away, so nothing of
//! them runs on the recording path.
//!
//! Several make results wrong on purpose (`WGRAD_COOP_ABLATE`, `WGRAD_SKIP_KERNELS`,
//! `WGRAD_COOP_PAD_SMEM`): they time what is left of a kernel or a step.

use super::KernelPolicy;
use crate::error::Result;
use crate::kernels::attention::{Pass, Tile as AttentionTile};
use crate::kernels::matmul::Tile;
use crate::kernels::matmul_coop::{Ablation, CoopTile};

/// The measurement switches, whichever the build.
pub const LAB_ONLY: [&str; 18] = [
    "WGRAD_MATMUL_TILE",
    "WGRAD_COOP_TILE",
    "WGRAD_ATTN_TILE",
    "WGRAD_ATTN_F32_TILE",
    "WGRAD_SPLIT_MAX",
    "WGRAD_SPLIT_TAIL",
    "WGRAD_SPLIT_TARGET",
    "WGRAD_SPLIT_SUM",
    "WGRAD_TIMING_TRACE",
    "WGRAD_SKIP_KERNELS",
    "WGRAD_COOP_ABLATE",
    "WGRAD_ATTN_ABLATE",
    "WGRAD_COOP_PAD_SMEM",
    "WGRAD_BIAS_GRAD",
    "WGRAD_LN_CHUNKS",
    "WGRAD_LN_GROUP",
    "WGRAD_SCHEDULE",
    "WGRAD_FIRST_SUBMIT",
];

/// The variables this build reads as measurement switches.
pub fn variables() -> &'static [&'static str] {
    if cfg!(feature = "lab") {
        &LAB_ONLY
    } else {
        &[]
    }
}

/// The parts of the cooperative-matrix attention's block loop `WGRAD_ATTN_ABLATE` leaves out,
/// bit i for part i (attention_coop.wgsl's ABLATE).
#[cfg(feature = "lab")]
const ATTN_ABLATE_PARTS: [&str; 8] = [
    "softmax", "staging", "scores", "out", "sync", "barriers", "puts", "rope",
];

type Row = (&'static str, &'static str, String, &'static str);

#[cfg(not(feature = "lab"))]
mod imp {
    use super::*;

    /// No knobs in a default build: every accessor says "not set".
    #[derive(Clone, Debug, Default)]
    pub struct Lab;

    impl Lab {
        pub(crate) fn read<'v>(
            _get: &dyn Fn(&str) -> Option<&'v str>,
            _kernels: &mut KernelPolicy,
        ) -> Result<Lab> {
            Ok(Lab)
        }

        pub(crate) fn rows(&self) -> Vec<Row> {
            Vec::new()
        }

        pub fn matmul_tile(&self) -> Option<Tile> {
            None
        }

        pub fn coop_tile(&self) -> Option<CoopTile> {
            None
        }

        pub fn attention_tile(&self, _pass: Pass) -> Option<(u32, u32)> {
            None
        }

        pub fn attention_f32_tiles(&self) -> &[(Pass, AttentionTile)] {
            &[]
        }

        pub fn split_max(&self) -> Option<usize> {
            None
        }

        pub fn split_tail(&self) -> Option<usize> {
            None
        }

        pub fn split_target(&self) -> Option<usize> {
            None
        }

        pub fn timing_trace(&self) -> bool {
            false
        }

        #[inline(always)]
        pub fn skips(&self, _kernel: &str) -> bool {
            false
        }

        pub fn ablation(&self) -> Ablation {
            Ablation::NONE
        }

        pub fn attention_ablation(&self) -> u32 {
            0
        }

        pub fn bias_grad_in_product(&self) -> Option<bool> {
            None
        }

        pub fn layernorm_chunks(&self) -> Option<(usize, usize)> {
            None
        }

        pub fn layernorm_group(&self) -> Option<usize> {
            None
        }

        pub fn schedule_window(&self) -> Option<usize> {
            None
        }

        pub fn first_submit(&self) -> Option<usize> {
            None
        }
    }
}

#[cfg(feature = "lab")]
mod imp {
    use super::*;
    use crate::config::env::{choose, number};
    use crate::error::Error;

    /// Every measurement knob; None / empty: the engine's own choice.
    #[derive(Clone, Debug, Default)]
    pub struct Lab {
        /// `WGRAD_MATMUL_TILE=128x64x8/8x4v`: every tiled-kernel product on this tile.
        pub matmul_tile: Option<Tile>,
        /// `WGRAD_COOP_TILE=2x2/4x4/32[/2]`: every cooperative-matrix product on this tile.
        pub coop_tile: Option<CoopTile>,
        /// `WGRAD_ATTN_TILE=SGxBC`, `fwd=SGxBC,bwd=SGxBC`: the cooperative-matrix attention's
        /// blocking, forward and backward.
        pub attention_tile: [Option<(u32, u32)>; 2],
        /// `WGRAD_ATTN_F32_TILE=fwd=32x32/16x8,dq=...,dkv=...`: the f32 attention's tiles.
        pub attention_f32_tiles: Vec<(Pass, AttentionTile)>,
        /// `WGRAD_SPLIT_MAX=N`: at most N ranges of K a product (1: none split).
        pub split_max: Option<usize>,
        /// `WGRAD_SPLIT_TAIL=N`: the longest sum (load latencies) a split runs in its own
        /// dispatch.
        pub split_tail: Option<usize>,
        /// `WGRAD_SPLIT_TARGET=N`: the workgroups a product should have before K is split.
        pub split_target: Option<usize>,
        /// `WGRAD_TIMING_TRACE=1`: every timed product of a search, rep by rep, on stderr.
        pub timing_trace: bool,
        /// `WGRAD_SKIP_KERNELS=name,...`: these entry points are not recorded (results wrong).
        pub skip_kernels: Vec<String>,
        /// `WGRAD_COOP_ABLATE=...` and `WGRAD_COOP_PAD_SMEM=BYTES` (results wrong).
        pub ablation: Ablation,
        /// `WGRAD_ATTN_ABLATE=softmax,staging,scores,out,sync,barriers,puts,rope`: parts of the cooperative-matrix
        /// attention's block loop left out (results wrong), a bit each (`ATTN_ABLATE_PARTS`).
        pub attention_ablation: u32,
        /// `WGRAD_BIAS_GRAD=product|reduce`: where a linear's bias gradient comes from.
        pub bias_grad_in_product: Option<bool>,
        /// `WGRAD_LN_CHUNKS=MAX,MIN_ROWS`: the LayerNorm backward's chunks of rows.
        pub layernorm_chunks: Option<(usize, usize)>,
        /// `WGRAD_LN_GROUP=N`: chunks a group where the LayerNorm backward sums in groups.
        pub layernorm_group: Option<usize>,
        /// `WGRAD_SCHEDULE=recorded|N`: how far a flush looks ahead (0: the recorded order).
        pub schedule_window: Option<usize>,
        /// `WGRAD_FIRST_SUBMIT=N`: the dispatches of a training step's first submit.
        pub first_submit: Option<usize>,
    }

    fn bad(op: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            op,
            reason: reason.into(),
        }
    }

    fn pair(s: &str, sep: char) -> Option<(usize, usize)> {
        let (a, b) = s.split_once(sep)?;
        Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
    }

    impl Lab {
        pub(crate) fn read<'v>(
            get: &dyn Fn(&str) -> Option<&'v str>,
            kernels: &mut KernelPolicy,
        ) -> Result<Lab> {
            let mut l = Lab::default();
            if let Some(v) = get("WGRAD_MATMUL_TILE") {
                l.matmul_tile = Some(Tile::parse(v).ok_or_else(|| {
                    bad(
                        "WGRAD_MATMUL_TILE",
                        format!("`{v}` is not BMxBNxBK/TMxTN[v]"),
                    )
                })?);
            }
            if let Some(v) = get("WGRAD_COOP_TILE") {
                l.coop_tile = Some(CoopTile::parse(v).ok_or_else(|| {
                    bad(
                        "WGRAD_COOP_TILE",
                        format!("`{v}` is not SGMxSGN/FMxFN[/BK[/STAGES]]"),
                    )
                })?);
            }
            if let Some(v) = get("WGRAD_ATTN_TILE") {
                let (mut both, mut fwd, mut bwd) = (None, None, None);
                for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let (slot, t) = match part.split_once('=') {
                        Some(("fwd", t)) => (&mut fwd, t),
                        Some(("bwd", t)) => (&mut bwd, t),
                        None => (&mut both, part),
                        Some(_) => {
                            return Err(bad(
                                "WGRAD_ATTN_TILE",
                                format!("`{part}` is not SGxBC, fwd=SGxBC or bwd=SGxBC"),
                            ))
                        }
                    };
                    let t = pair(t, 'x').map(|(a, b)| (a as u32, b as u32));
                    *slot = Some(t.ok_or_else(|| {
                        bad(
                            "WGRAD_ATTN_TILE",
                            format!("`{part}`: not SGxBC (e.g. 4x16)"),
                        )
                    })?);
                }
                l.attention_tile = [fwd.or(both), bwd.or(both)];
            }
            if let Some(v) = get("WGRAD_ATTN_F32_TILE") {
                let (tiles, unread) = crate::kernels::attention::parse_forced_tiles(v);
                if !unread.is_empty() {
                    return Err(bad(
                        "WGRAD_ATTN_F32_TILE",
                        format!("{unread:?}: expected fwd|dq|dkv=BRxBC/ROWLxCOLL"),
                    ));
                }
                l.attention_f32_tiles = tiles;
            }
            let num = |name: &'static str| -> Result<Option<usize>> {
                get(name)
                    .map(|v| number(name, v).map(|n| n as usize))
                    .transpose()
            };
            l.split_max = num("WGRAD_SPLIT_MAX")?.map(|n| n.max(1));
            l.split_tail = num("WGRAD_SPLIT_TAIL")?;
            l.split_target = num("WGRAD_SPLIT_TARGET")?;
            l.layernorm_group = num("WGRAD_LN_GROUP")?.filter(|&g| g > 0);
            l.first_submit = num("WGRAD_FIRST_SUBMIT")?;
            if let Some(v) = get("WGRAD_SPLIT_SUM") {
                kernels.split_in_one_dispatch = Some(choose(
                    "WGRAD_SPLIT_SUM",
                    v,
                    &[("one", true), ("dispatch", false)],
                )?);
            }
            if let Some(v) = get("WGRAD_TIMING_TRACE") {
                l.timing_trace = choose("WGRAD_TIMING_TRACE", v, &[("1", true), ("0", false)])?;
            }
            if let Some(v) = get("WGRAD_SKIP_KERNELS") {
                l.skip_kernels = v
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
            }
            if let Some(v) = get("WGRAD_COOP_ABLATE") {
                l.ablation = Ablation::parse(v).map_err(|part| {
                    bad(
                        "WGRAD_COOP_ABLATE",
                        format!("`{part}` is not one of {}", Ablation::PARTS.join(", ")),
                    )
                })?;
            }
            if let Some(v) = get("WGRAD_ATTN_ABLATE") {
                for part in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let bit = ATTN_ABLATE_PARTS
                        .iter()
                        .position(|&p| p == part)
                        .ok_or_else(|| {
                            bad(
                                "WGRAD_ATTN_ABLATE",
                                format!("`{part}` is not one of {}", ATTN_ABLATE_PARTS.join(", ")),
                            )
                        })?;
                    l.attention_ablation |= 1 << bit;
                }
            }
            if let Some(v) = get("WGRAD_COOP_PAD_SMEM") {
                l.ablation.pad_bytes = number("WGRAD_COOP_PAD_SMEM", v)? as u32;
            }
            if let Some(v) = get("WGRAD_BIAS_GRAD") {
                l.bias_grad_in_product = Some(choose(
                    "WGRAD_BIAS_GRAD",
                    v,
                    &[("product", true), ("reduce", false)],
                )?);
            }
            if let Some(v) = get("WGRAD_LN_CHUNKS") {
                l.layernorm_chunks = Some(
                    pair(v, ',')
                        .filter(|&(a, b)| a >= 1 && b >= 1)
                        .ok_or_else(|| {
                            bad(
                                "WGRAD_LN_CHUNKS",
                                format!("`{v}` is not MAX_CHUNKS,MIN_ROWS (each at least 1)"),
                            )
                        })?,
                );
            }
            if let Some(v) = get("WGRAD_SCHEDULE") {
                l.schedule_window = Some(if v.trim() == "recorded" {
                    0
                } else {
                    number("WGRAD_SCHEDULE", v)? as usize
                });
            }
            Ok(l)
        }

        pub(crate) fn rows(&self) -> Vec<Row> {
            let o = |x: Option<String>| x.unwrap_or_else(|| "default".into());
            vec![
                (
                    "lab",
                    "matmul tile",
                    o(self.matmul_tile.map(|t| t.name())),
                    "WGRAD_MATMUL_TILE",
                ),
                (
                    "lab",
                    "coop tile",
                    o(self.coop_tile.map(|t| t.name())),
                    "WGRAD_COOP_TILE",
                ),
                (
                    "lab",
                    "attention ablation",
                    format!("{:#x}", self.attention_ablation),
                    "WGRAD_ATTN_ABLATE",
                ),
                (
                    "lab",
                    "attention tile",
                    format!("{:?}", self.attention_tile),
                    "WGRAD_ATTN_TILE",
                ),
                (
                    "lab",
                    "attention f32 tiles",
                    format!("{:?}", self.attention_f32_tiles),
                    "WGRAD_ATTN_F32_TILE",
                ),
                (
                    "lab",
                    "split max",
                    o(self.split_max.map(|n| n.to_string())),
                    "WGRAD_SPLIT_MAX",
                ),
                (
                    "lab",
                    "split tail",
                    o(self.split_tail.map(|n| n.to_string())),
                    "WGRAD_SPLIT_TAIL",
                ),
                (
                    "lab",
                    "split target",
                    o(self.split_target.map(|n| n.to_string())),
                    "WGRAD_SPLIT_TARGET",
                ),
                (
                    "lab",
                    "timing trace",
                    self.timing_trace.to_string(),
                    "WGRAD_TIMING_TRACE",
                ),
                (
                    "lab",
                    "skipped kernels",
                    format!("{:?}", self.skip_kernels),
                    "WGRAD_SKIP_KERNELS",
                ),
                (
                    "lab",
                    "coop ablation",
                    format!("{:?}", self.ablation),
                    "WGRAD_COOP_ABLATE",
                ),
                (
                    "lab",
                    "bias grad in product",
                    o(self.bias_grad_in_product.map(|b| b.to_string())),
                    "WGRAD_BIAS_GRAD",
                ),
                (
                    "lab",
                    "layernorm chunks",
                    o(self.layernorm_chunks.map(|c| format!("{c:?}"))),
                    "WGRAD_LN_CHUNKS",
                ),
                (
                    "lab",
                    "layernorm group",
                    o(self.layernorm_group.map(|n| n.to_string())),
                    "WGRAD_LN_GROUP",
                ),
                (
                    "lab",
                    "schedule window",
                    o(self.schedule_window.map(|n| n.to_string())),
                    "WGRAD_SCHEDULE",
                ),
                (
                    "lab",
                    "first submit",
                    o(self.first_submit.map(|n| n.to_string())),
                    "WGRAD_FIRST_SUBMIT",
                ),
            ]
        }

        pub fn matmul_tile(&self) -> Option<Tile> {
            self.matmul_tile
        }

        pub fn coop_tile(&self) -> Option<CoopTile> {
            self.coop_tile
        }

        pub fn attention_tile(&self, pass: Pass) -> Option<(u32, u32)> {
            self.attention_tile[(pass != Pass::Forward) as usize]
        }

        pub fn attention_f32_tiles(&self) -> &[(Pass, AttentionTile)] {
            &self.attention_f32_tiles
        }

        pub fn split_max(&self) -> Option<usize> {
            self.split_max
        }

        pub fn split_tail(&self) -> Option<usize> {
            self.split_tail
        }

        pub fn split_target(&self) -> Option<usize> {
            self.split_target
        }

        pub fn timing_trace(&self) -> bool {
            self.timing_trace
        }

        pub fn skips(&self, kernel: &str) -> bool {
            self.skip_kernels.iter().any(|s| s == kernel)
        }

        pub fn ablation(&self) -> Ablation {
            self.ablation
        }

        pub fn attention_ablation(&self) -> u32 {
            self.attention_ablation
        }

        pub fn bias_grad_in_product(&self) -> Option<bool> {
            self.bias_grad_in_product
        }

        pub fn layernorm_chunks(&self) -> Option<(usize, usize)> {
            self.layernorm_chunks
        }

        pub fn layernorm_group(&self) -> Option<usize> {
            self.layernorm_group
        }

        pub fn schedule_window(&self) -> Option<usize> {
            self.schedule_window
        }

        pub fn first_submit(&self) -> Option<usize> {
            self.first_submit
        }
    }
}

pub use imp::Lab;

#[cfg(all(test, feature = "lab"))]
mod tests {
    use crate::config::Options;
    use crate::kernels::attention::Pass;

    #[test]
    fn lab_variables_set_their_knobs_and_bad_values_name_the_variable() {
        let o = Options::from_vars(&[
            ("WGRAD_COOP_TILE", "2x4/4x2/64"),
            ("WGRAD_ATTN_TILE", "4x32,bwd=2x16"),
            ("WGRAD_SPLIT_SUM", "dispatch"),
            ("WGRAD_SKIP_KERNELS", "attn_fwd,adamw"),
            ("WGRAD_SCHEDULE", "recorded"),
            ("WGRAD_COOP_ABLATE", "nostore"),
            ("WGRAD_ATTN_ABLATE", "softmax,puts"),
        ])
        .expect("read");
        let lab = &o.lab;
        assert_eq!(lab.coop_tile().map(|t| t.name()), Some("2x4/4x2/64".into()));
        assert_eq!(
            (
                lab.attention_tile(Pass::Forward),
                lab.attention_tile(Pass::Dkv)
            ),
            (Some((4, 32)), Some((2, 16)))
        );
        assert_eq!(o.kernels.split_in_one_dispatch, Some(false));
        assert!(lab.skips("adamw") && !lab.skips("matmul"));
        assert_eq!(lab.schedule_window(), Some(0));
        assert!(lab.ablation().leaves_out("nostore") && !lab.ablation().leaves_out("noglobal"));
        assert_eq!(lab.attention_ablation(), 1 | 64);
        assert!(o.variables_set().contains(&"WGRAD_COOP_TILE"));
        for (name, value) in [
            ("WGRAD_COOP_TILE", "2x2"),
            ("WGRAD_COOP_ABLATE", "nothing"),
            ("WGRAD_ATTN_ABLATE", "softmax,all"),
            ("WGRAD_LN_CHUNKS", "0,2"),
        ] {
            let e = Options::from_vars(&[(name, value)])
                .expect_err(name)
                .to_string();
            assert!(e.contains(name), "{e}");
        }
    }
}
