//! Every candidate tile of the f32 fused attention (`candidate_tiles`) at every padded head
//! dim: its `Tile::workgroup_bytes` against the WGSL, and, run through
//! `Device::force_attention_tiles`, the forward and the gradients (new, then accumulated)
//! against the unfused reference.
//!
//! Shapes: q, k, v, O are (B, H, T, D) with T 70 (no multiple of any block) and D three below
//! its padded head dim (not a multiple of 4).

mod common;

use common::*;
use wgrad::kernels::attention::{
    candidate_tiles, chosen_tile, parse_forced_tiles, spec, tile, Pass, Tile, HEAD_DIMS,
};
use wgrad::Result;

/// NVIDIA's Vulkan driver gives a core about 48 KiB of workgroup memory (PROFILING.md).
const NVIDIA_BYTES_PER_CORE: u32 = 48 << 10;

#[test]
fn candidate_tiles_run_and_declare_their_workgroup_bytes() {
    for dmax in HEAD_DIMS {
        for pass in Pass::ALL {
            let tiles = candidate_tiles(pass, dmax);
            assert_eq!(tiles[0], tile(pass, dmax), "the default comes first");
            for (i, t) in tiles.iter().enumerate() {
                assert!(t.runs(pass), "{pass:?} {t:?}: the kernel runs it");
                assert!(!tiles[..i].contains(t), "{pass:?} {t:?} listed twice");
                let bytes = t.workgroup_bytes(pass);
                let (declared, _) =
                    workgroup_bytes_in_wgsl(pass.kernel(), &spec(pass, *t, false, false));
                assert_eq!(
                    bytes, declared,
                    "{pass:?} {t:?}: workgroup_bytes vs the WGSL"
                );
                assert!(bytes <= 32 << 10, "{pass:?} {t:?}: {bytes} bytes");
                eprintln!(
                    "{pass:?} DMAX {dmax} {}: {bytes} bytes, {} lanes, {} a core by memory",
                    t.name(),
                    t.lanes(),
                    NVIDIA_BYTES_PER_CORE / bytes
                );
            }
        }
    }
    // Names round-trip; what the kernel cannot run is refused.
    let t = Tile::parse("16x32/8x16", 64).expect("parses");
    assert_eq!(Tile::parse(&t.name(), 64), Some(t));
    assert_eq!(Tile::parse("16x32", 64), None);
    let refused = [
        (Pass::Forward, "32x32/16x16", 32), // 8 vectors of d's over 16 lanes
        (Pass::Forward, "32x32/32x16", 64), // 512 lanes
        (Pass::Dq, "16x16/32x8", 64),       // 32 lane rows for 16 queries
        (Pass::Dkv, "8x12/8x16", 64),       // 12 keys over 16 lane columns
    ];
    for (pass, name, dmax) in refused {
        let t = Tile::parse(name, dmax).expect("parses");
        assert!(!t.runs(pass), "{pass:?} {name} at DMAX {dmax}");
    }
}

#[test]
fn forced_tiles_are_read_per_pass_at_every_head_dim() {
    let (tiles, unread) =
        parse_forced_tiles("fwd=32x32/16x8, dkv=16x32/8x16,bogus,dq=16x16,dq=16x16/16x16");
    assert_eq!(unread, ["bogus", "dq=16x16"]);
    let want: Vec<(Pass, Tile)> = [
        (Pass::Forward, "32x32/16x8"),
        (Pass::Dkv, "16x32/8x16"),
        (Pass::Dq, "16x16/16x16"),
    ]
    .iter()
    .flat_map(|&(pass, name)| {
        HEAD_DIMS.map(|dmax| (pass, Tile::parse(name, dmax).expect("parses")))
    })
    .collect();
    assert_eq!(tiles, want);
}

#[test]
fn every_candidate_tile_matches_the_unfused_reference() -> Result<()> {
    // A device of its own: the tiles it is forced to run hold for it alone.
    let d = &private_dev();
    let limits = &d.gpu().limits;
    let (max_bytes, max_lanes) = (
        limits.max_compute_workgroup_storage_size,
        limits.max_compute_invocations_per_workgroup,
    );
    for dmax in HEAD_DIMS {
        let shape = [1, 2, 70, dmax as usize - 3];
        let [q, k, v] = [0, 1, 2].map(|i| {
            let tag = format!("tiles{shape:?}{i}");
            Arr::rand(&mut rng(&tag), &shape, -2.0, 2.0)
        });
        let w = Arr::rand(&mut rng(&format!("w{shape:?}")), &shape, -1.0, 1.0).upload(d);
        let leaves = || [&q, &k, &v].map(|a| a.upload(d).requires_grad());
        d.force_attention_tiles(&[]);
        let (o_ref, grads_ref) = loss_grads(&leaves(), &w, |p| {
            p[0].causal_attention_reference(&p[1], &p[2])
        })?;
        let o_ref = as_f64(&o_ref);

        // Case i forces every pass's i-th candidate (a shorter list repeats its last).
        let candidates = Pass::ALL.map(|pass| candidate_tiles(pass, dmax));
        let cases = candidates.iter().map(Vec::len).max().unwrap_or(0);
        for i in 0..cases {
            let forced = [0, 1, 2].map(|p| {
                let list = &candidates[p];
                (Pass::ALL[p], list[i.min(list.len() - 1)])
            });
            d.force_attention_tiles(&forced);
            for (pass, t) in forced {
                let chosen = chosen_tile(pass, dmax, (max_bytes, max_lanes), &forced);
                assert_eq!(chosen, t, "{pass:?}: the adapter takes the forced tile");
            }
            let names = forced.map(|(_, t)| t.name());
            let what = |n: &str, step: &str| format!("{n} {step}, DMAX {dmax}, tiles {names:?}");

            let ins = leaves();
            let fused = |p: &[wgrad::Tensor]| p[0].causal_attention(&p[1], &p[2]);
            let (o, grads) = loss_grads(&ins, &w, fused)?;
            assert_close(&o, &o_ref, FUSED_VS_UNFUSED, &what("O", "forward"));
            // Again into the same leaves: the kernels add into the gradients (ACC_*).
            let (_, twice) = loss_grads(&ins, &w, fused)?;
            for (j, name) in ["dq", "dk", "dv"].iter().enumerate() {
                let want = as_f64(&grads_ref[j]);
                assert_close(&grads[j], &want, FUSED_VS_UNFUSED, &what(name, "new"));
                let want: Vec<f64> = want.iter().map(|g| 2.0 * g).collect();
                assert_close(
                    &twice[j],
                    &want,
                    FUSED_VS_UNFUSED,
                    &what(name, "accumulated"),
                );
            }
            eprintln!("DMAX {dmax}: tiles {names:?} match the unfused reference");
        }
    }
    Ok(())
}
