//! The environment, read once: each variable parsed into its option, a value an option cannot
//! take named with the values it can, a variable this build does not know refused (a switch
//! removed or kept for `lab` builds would otherwise be ignored without a word).

use std::path::PathBuf;

use super::{lab, AttentionSync, F32Matmul, Float, OptionRow, Options, PoolReuse, WaitMode};
use crate::error::{Error, Result};

/// The variables of a default build, with what each sets.
pub const VARIABLES: [(&str, &str); 18] = [
    ("WGRAD_BACKEND", "backends searched"),
    ("WGRAD_ADAPTER", "adapter by name"),
    ("WGRAD_DISABLE_FEATURES", "optional features left off"),
    ("WGRAD_MAX_BINDING", "storage-binding cap in bytes"),
    ("WGRAD_LOGITS", "logits under --amp"),
    ("WGRAD_ATTN_HALF", "attention's f16 under --amp"),
    ("WGRAD_GELU_HALF", "GELU's f16 under --amp"),
    ("WGRAD_DZ", "GELU's gradient under --amp"),
    ("WGRAD_F32_MATMUL", "how f32 products run"),
    ("WGRAD_SHADER_CHECKS", "naga's bounds checks"),
    ("WGRAD_ATTN_SYNC", "the attention's barrier"),
    ("WGRAD_WAIT", "how the CPU waits"),
    ("WGRAD_COMPILE_THREADS", "pipeline compile threads"),
    ("WGRAD_POOL_REUSE", "when the pool reuses"),
    ("WGRAD_POOL_BUDGET_MIB", "the pool's budget"),
    ("WGRAD_MEMORY_LIMIT_MIB", "GPU memory the pool may hold"),
    ("WGRAD_CACHE_DIR", "where tile tables live"),
    ("WGRAD_DIST_TIMEOUT_S", "how long a collective waits"),
];

/// What MPI launchers set in each process they start: (Open MPI's, MPICH's) names of the
/// world size and of the rank on this host.
const LAUNCHER_WORLD_SIZE: [&str; 2] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"];
const LAUNCHER_LOCAL_RANK: [&str; 2] = ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"];

/// Read by the test suite, not by the engine.
const TEST_VARIABLES: [&str; 1] = ["WGRAD_TEST_SEED"];

/// Switches that measured slower than what replaced them and are gone, with what they set;
/// docs/decisions.md has a row for each.
const REMOVED: [&str; 14] = [
    "WGRAD_COOP_WORDS",
    "WGRAD_COOP_SPREAD",
    "WGRAD_COOP_GROUP",
    "WGRAD_COOP_WHOLE",
    "WGRAD_COOP_PREFETCH",
    "WGRAD_COOP_C_VEC",
    "WGRAD_COOP_F16_TILES",
    "WGRAD_COOP_DIRECT",
    "WGRAD_RESIDUAL",
    "WGRAD_ATTN_PREFETCH",
    "WGRAD_ATTN_DIRECT",
    "WGRAD_ATTN_READ",
    "WGRAD_LN_SUM",
    "WGRAD_LINEAR_CAST",
];

/// The environment's variables that concern wgrad (its own, and where the cache goes).
pub fn current() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("WGRAD_")
                || k == "XDG_CACHE_HOME"
                || k == "HOME"
                || LAUNCHER_WORLD_SIZE.contains(&k.as_str())
                || LAUNCHER_LOCAL_RANK.contains(&k.as_str())
        })
        .collect()
}

/// The options `vars` set over the defaults.
pub fn read<'v>(vars: &'v [(String, String)]) -> Result<Options> {
    let lookup = |name: &str| value(vars, name);
    let get: &dyn Fn(&str) -> Option<&'v str> = &lookup;
    for (name, _) in vars {
        check_known(name)?;
    }
    let mut o = Options::default();
    let a = &mut o.adapter;
    if let Some(v) = get("WGRAD_BACKEND") {
        a.backends = Some(backends(v)?);
    }
    a.name = get("WGRAD_ADAPTER").map(str::to_string);
    if let Some(v) = get("WGRAD_DISABLE_FEATURES") {
        a.disable = features(v)?;
    }
    if let Some(v) = get("WGRAD_MAX_BINDING") {
        a.max_storage_binding = Some(binding_cap(v)?);
    }
    let p = &mut o.precision;
    if let Some(v) = get("WGRAD_LOGITS") {
        p.logits = choose(
            "WGRAD_LOGITS",
            v,
            &[("f16", Float::F16), ("f32", Float::F32)],
        )?;
    }
    if let Some(v) = get("WGRAD_ATTN_HALF") {
        let f16 = [("1", Float::F16), ("0", Float::F32)];
        p.attention = choose("WGRAD_ATTN_HALF", v, &f16)?;
    }
    if let Some(v) = get("WGRAD_GELU_HALF") {
        let f16 = [("all", Float::F16), ("none", Float::F32)];
        p.gelu = choose("WGRAD_GELU_HALF", v, &f16)?;
    }
    if let Some(v) = get("WGRAD_DZ") {
        p.gelu_grad = choose("WGRAD_DZ", v, &[("f16", Float::F16), ("f32", Float::F32)])?;
    }
    if let Some(v) = get("WGRAD_F32_MATMUL") {
        let ways = [
            ("tensor_cores", F32Matmul::TensorCores),
            ("tiled", F32Matmul::Tiled),
        ];
        p.f32_matmul = choose("WGRAD_F32_MATMUL", v, &ways)?;
    }
    let k = &mut o.kernels;
    if let Some(v) = get("WGRAD_SHADER_CHECKS") {
        k.shader_checks = choose("WGRAD_SHADER_CHECKS", v, &[("1", true), ("0", false)])?;
    }
    if let Some(v) = get("WGRAD_ATTN_SYNC") {
        let ways = [
            ("subgroup", AttentionSync::Subgroup),
            ("workgroup", AttentionSync::Workgroup),
        ];
        k.attention_sync = choose("WGRAD_ATTN_SYNC", v, &ways)?;
    }
    let e = &mut o.execution;
    if let Some(v) = get("WGRAD_WAIT") {
        let ways = [("spin", WaitMode::Spin), ("block", WaitMode::Block)];
        e.wait = Some(choose("WGRAD_WAIT", v, &ways)?);
    }
    if let Some(v) = get("WGRAD_COMPILE_THREADS") {
        e.compile_threads = Some(number("WGRAD_COMPILE_THREADS", v)? as usize);
    }
    if let Some(v) = get("WGRAD_POOL_REUSE") {
        let ways = [
            ("any", PoolReuse::Any),
            ("segments", PoolReuse::AcrossSegments),
        ];
        o.pool.reuse = Some(choose("WGRAD_POOL_REUSE", v, &ways)?);
    }
    if let Some(v) = get("WGRAD_POOL_BUDGET_MIB") {
        o.pool.budget = Some(number("WGRAD_POOL_BUDGET_MIB", v)? << 20);
    }
    if let Some(v) = get("WGRAD_MEMORY_LIMIT_MIB") {
        let mib = number("WGRAD_MEMORY_LIMIT_MIB", v)?;
        let bytes = mib.checked_mul(1 << 20).filter(|&b| b > 0);
        o.pool.memory_limit = Some(bytes.ok_or_else(|| Error::InvalidArgument {
            op: "WGRAD_MEMORY_LIMIT_MIB",
            reason: format!("{mib} MiB: give a positive number of MiB (unset it for no cap)"),
        })?);
    }
    o.paths.cache_dir = match (get("WGRAD_CACHE_DIR"), get("XDG_CACHE_HOME"), get("HOME")) {
        (Some(d), _, _) => Some(PathBuf::from(d)),
        (None, Some(d), _) => Some(PathBuf::from(d).join("wgrad")),
        (None, None, Some(h)) => Some(PathBuf::from(h).join(".cache/wgrad")),
        (None, None, None) => None,
    };
    let launcher = |names: [&'static str; 2]| -> Result<Option<usize>> {
        let found = names.iter().find_map(|&n| get(n).map(|v| (n, v)));
        found
            .map(|(n, v)| number(n, v).map(|x| x as usize))
            .transpose()
    };
    o.dist.launcher_world_size = launcher(LAUNCHER_WORLD_SIZE)?;
    o.adapter.local_rank = launcher(LAUNCHER_LOCAL_RANK)?;
    if let Some(v) = get("WGRAD_DIST_TIMEOUT_S") {
        let seconds = number("WGRAD_DIST_TIMEOUT_S", v)?;
        if seconds == 0 {
            return Err(Error::InvalidArgument {
                op: "WGRAD_DIST_TIMEOUT_S",
                reason: "0 seconds: give how long a collective may wait, in seconds".into(),
            });
        }
        o.dist.timeout = std::time::Duration::from_secs(seconds);
    }
    o.lab = lab::Lab::read(get, &mut o.kernels)?;
    o.from_env = VARIABLES
        .iter()
        .map(|(name, _)| *name)
        .chain(lab::variables().iter().copied())
        .filter(|name| get(name).is_some())
        .collect();
    Ok(o)
}

/// The value of variable `name` in `vars`.
fn value<'v>(vars: &'v [(String, String)], name: &str) -> Option<&'v str> {
    vars.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// An error for a variable this build does not read.
fn check_known(name: &str) -> Result<()> {
    let known = VARIABLES.iter().any(|(n, _)| *n == name)
        || TEST_VARIABLES.contains(&name)
        || lab::variables().contains(&name)
        || !name.starts_with("WGRAD_");
    if known {
        return Ok(());
    }
    let reason = if REMOVED.contains(&name) {
        "this switch was removed: what it chose measured slower than the default \
         (docs/decisions.md); unset it"
            .to_string()
    } else if lab::LAB_ONLY.contains(&name) {
        "a measurement switch, read only by a build with `--features lab` \
         (docs/ENVIRONMENT.md); unset it or build with the feature"
            .to_string()
    } else {
        "not a variable wgrad reads (docs/ENVIRONMENT.md lists them); unset it".to_string()
    };
    Err(Error::InvalidArgument {
        op: leak(name),
        reason,
    })
}

/// A variable's name as the error's `op` (names are few and read once a process).
fn leak(name: &str) -> &'static str {
    VARIABLES
        .iter()
        .map(|(n, _)| *n)
        .chain(REMOVED)
        .chain(lab::LAB_ONLY.iter().copied())
        .find(|n| *n == name)
        .unwrap_or("environment")
}

/// The value of `choices` that `v` names, else an error listing them.
pub(super) fn choose<T: Copy>(name: &'static str, v: &str, choices: &[(&str, T)]) -> Result<T> {
    let v = v.trim();
    choices
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(v))
        .map(|(_, t)| *t)
        .ok_or_else(|| Error::InvalidArgument {
            op: name,
            reason: format!(
                "`{v}` is not one of {}",
                choices
                    .iter()
                    .map(|(k, _)| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
}

/// A whole number.
pub(super) fn number(name: &'static str, v: &str) -> Result<u64> {
    v.trim().parse().map_err(|e| Error::InvalidArgument {
        op: name,
        reason: format!("`{v}` is not a whole number: {e}"),
    })
}

fn backends(v: &str) -> Result<wgpu::Backends> {
    let mut all = wgpu::Backends::empty();
    for name in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let ways = [
            ("vulkan", wgpu::Backends::VULKAN),
            ("metal", wgpu::Backends::METAL),
            ("dx12", wgpu::Backends::DX12),
            ("gl", wgpu::Backends::GL),
            ("noop", wgpu::Backends::NOOP),
        ];
        all |= choose("WGRAD_BACKEND", name, &ways)?;
    }
    Ok(all)
}

/// The features of a comma list of their names.
fn features(v: &str) -> Result<wgpu::Features> {
    use wgpu::Features as F;
    let mut off = F::empty();
    for name in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let ways = [
            ("subgroups", F::SUBGROUP),
            ("subgroup_barrier", F::SUBGROUP_BARRIER),
            ("f16", F::SHADER_F16),
            (
                "timestamps",
                F::TIMESTAMP_QUERY
                    | F::TIMESTAMP_QUERY_INSIDE_PASSES
                    | F::TIMESTAMP_QUERY_INSIDE_ENCODERS,
            ),
            // Timestamps around passes only: `wgrad profile` then times each submit's pass,
            // which costs nothing between dispatches.
            ("timestamps_inside_passes", F::TIMESTAMP_QUERY_INSIDE_PASSES),
            ("immediates", F::IMMEDIATES),
            ("cooperative_matrix", F::EXPERIMENTAL_COOPERATIVE_MATRIX),
        ];
        off |= choose("WGRAD_DISABLE_FEATURES", name, &ways)?;
    }
    Ok(off)
}

fn binding_cap(v: &str) -> Result<u64> {
    check_binding_cap(number("WGRAD_MAX_BINDING", v)?)
}

/// A binding cap in bytes: at least 1 KiB (a floor that keeps every small tensor of the tests
/// and kernels bindable) and a multiple of 4 (whole f32 elements).
pub fn check_binding_cap(cap: u64) -> Result<u64> {
    if cap < 1024 || !cap.is_multiple_of(4) {
        return Err(Error::InvalidArgument {
            op: "WGRAD_MAX_BINDING",
            reason: format!(
                "a binding cap of {cap} bytes: it must be at least 1024 and a multiple of 4"
            ),
        });
    }
    Ok(cap)
}

/// The rows of `Options::rows`.
pub fn rows(o: &Options) -> Vec<OptionRow> {
    let f = |x: Float| format!("{x:?}").to_lowercase();
    let opt = |x: Option<String>, none: &str| x.unwrap_or_else(|| none.to_string());
    let a = &o.adapter;
    let p = &o.precision;
    let k = &o.kernels;
    let e = &o.execution;
    let mut rows = vec![
        (
            "adapter",
            "backends",
            opt(a.backends.map(|b| format!("{b:?}")), "vulkan, metal, dx12"),
            "WGRAD_BACKEND",
        ),
        (
            "adapter",
            "name",
            opt(a.name.clone(), "the best one"),
            "WGRAD_ADAPTER",
        ),
        (
            "adapter",
            "disabled features",
            if a.disable.is_empty() {
                "none".into()
            } else {
                format!("{:?}", a.disable)
            },
            "WGRAD_DISABLE_FEATURES",
        ),
        (
            "adapter",
            "max storage binding",
            opt(
                a.max_storage_binding.map(|b| format!("{b} bytes")),
                "the adapter's",
            ),
            "WGRAD_MAX_BINDING",
        ),
        ("precision", "logits (--amp)", f(p.logits), "WGRAD_LOGITS"),
        (
            "precision",
            "attention (--amp)",
            f(p.attention),
            "WGRAD_ATTN_HALF",
        ),
        ("precision", "gelu (--amp)", f(p.gelu), "WGRAD_GELU_HALF"),
        (
            "precision",
            "gelu gradient (--amp)",
            f(p.gelu_grad),
            "WGRAD_DZ",
        ),
        (
            "precision",
            "f32 matmul",
            serde_json::to_value(p.f32_matmul)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            "WGRAD_F32_MATMUL",
        ),
        (
            "kernels",
            "shader bounds checks",
            k.shader_checks.to_string(),
            "WGRAD_SHADER_CHECKS",
        ),
        (
            "kernels",
            "attention sync",
            format!("{:?}", k.attention_sync).to_lowercase(),
            "WGRAD_ATTN_SYNC",
        ),
        (
            "kernels",
            "split sum in one dispatch",
            opt(k.split_in_one_dispatch.map(|b| b.to_string()), "by backend"),
            if cfg!(feature = "lab") {
                "WGRAD_SPLIT_SUM"
            } else {
                "(code; WGRAD_SPLIT_SUM in lab)"
            },
        ),
        (
            "execution",
            "wait",
            opt(
                e.wait.map(|w| format!("{w:?}").to_lowercase()),
                "by adapter",
            ),
            "WGRAD_WAIT",
        ),
        (
            "execution",
            "compile threads",
            opt(e.compile_threads.map(|n| n.to_string()), "one per core"),
            "WGRAD_COMPILE_THREADS",
        ),
        (
            "pool",
            "reuse",
            opt(
                o.pool.reuse.map(|r| format!("{r:?}").to_lowercase()),
                "by workload",
            ),
            "WGRAD_POOL_REUSE",
        ),
        (
            "pool",
            "budget",
            opt(
                o.pool.budget.map(|b| format!("{} MiB", b >> 20)),
                "twice the peak live",
            ),
            "WGRAD_POOL_BUDGET_MIB",
        ),
        (
            "pool",
            "memory limit",
            opt(
                o.pool.memory_limit.map(|b| format!("{} MiB", b >> 20)),
                "the adapter's memory",
            ),
            "WGRAD_MEMORY_LIMIT_MIB",
        ),
        (
            "paths",
            "cache dir",
            opt(
                o.paths.cache_dir.as_ref().map(|d| d.display().to_string()),
                "none",
            ),
            "WGRAD_CACHE_DIR",
        ),
        (
            "dist",
            "collective timeout",
            format!("{} s", o.dist.timeout.as_secs()),
            "WGRAD_DIST_TIMEOUT_S",
        ),
    ];
    rows.extend(o.lab.rows());
    rows.into_iter()
        .map(|(group, name, value, variable)| OptionRow {
            group,
            name,
            value,
            variable,
            from_env: o.from_env.contains(&variable),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn an_mpi_launcher_sets_the_world_size_and_the_local_rank() {
        let none = read(&vars(&[])).expect("read");
        assert_eq!(none.dist.launcher_world_size, None);
        assert_eq!(none.adapter.local_rank, None);
        let ompi = vars(&[
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("WGRAD_DIST_TIMEOUT_S", "30"),
        ]);
        let o = read(&ompi).expect("read");
        assert_eq!(o.dist.launcher_world_size, Some(4));
        assert_eq!(o.adapter.local_rank, Some(1));
        assert_eq!(o.dist.timeout.as_secs(), 30);
        let mpich = read(&vars(&[("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "0")])).expect("read");
        assert_eq!(mpich.dist.launcher_world_size, Some(2));
        assert_eq!(mpich.adapter.local_rank, Some(0));
        let e = read(&vars(&[("WGRAD_DIST_TIMEOUT_S", "0")])).expect_err("0 s refused");
        assert!(e.to_string().contains("WGRAD_DIST_TIMEOUT_S"), "{e}");
    }

    #[test]
    fn variables_set_their_options_and_bad_values_name_the_variable() {
        let o = read(&vars(&[
            ("WGRAD_LOGITS", "f32"),
            ("WGRAD_F32_MATMUL", "tiled"),
            ("WGRAD_POOL_BUDGET_MIB", "64"),
            ("WGRAD_MEMORY_LIMIT_MIB", "512"),
            ("WGRAD_DISABLE_FEATURES", "subgroups, f16"),
            ("HOME", "/home/u"),
        ]))
        .expect("read");
        assert_eq!(o.precision.logits, Float::F32);
        assert_eq!(o.precision.f32_matmul, F32Matmul::Tiled);
        assert_eq!(o.precision.attention, Float::F16);
        assert_eq!(o.pool.budget, Some(64 << 20));
        assert_eq!(o.pool.memory_limit, Some(512 << 20));
        assert!(o
            .adapter
            .disable
            .contains(wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16));
        assert_eq!(
            o.paths.cache_dir,
            Some(PathBuf::from("/home/u/.cache/wgrad"))
        );
        assert_eq!(
            o.variables_set(),
            [
                "WGRAD_DISABLE_FEATURES",
                "WGRAD_LOGITS",
                "WGRAD_F32_MATMUL",
                "WGRAD_POOL_BUDGET_MIB",
                "WGRAD_MEMORY_LIMIT_MIB"
            ]
        );
        let row = o.rows().into_iter().find(|r| r.variable == "WGRAD_LOGITS");
        assert!(row.is_some_and(|r| r.from_env && r.value == "f32"));
        for (name, value, says) in [
            ("WGRAD_LOGITS", "bf16", "`f16`, `f32`"),
            ("WGRAD_MAX_BINDING", "100", "at least 1024"),
            ("WGRAD_DISABLE_FEATURES", "subgroup", "`subgroups`"),
            ("WGRAD_COMPILE_THREADS", "many", "whole number"),
            ("WGRAD_MEMORY_LIMIT_MIB", "0", "positive"),
            ("WGRAD_MEMORY_LIMIT_MIB", "18446744073709551615", "positive"),
            ("WGRAD_COOP_WORDS", "0", "removed"),
            ("WGRAD_NO_SUCH", "1", "not a variable"),
        ] {
            let e = read(&vars(&[(name, value)])).expect_err(name).to_string();
            assert!(e.contains(says), "{name}={value}: {e}");
        }
    }

    #[test]
    fn precision_differences_name_each_field() {
        let a = super::super::Precision::default();
        let b = super::super::Precision {
            logits: Float::F32,
            ..a
        };
        assert_eq!(
            a.differences(&b),
            ["logits: \"f16\" -> \"f32\" (WGRAD_LOGITS)"]
        );
        assert!(a.differences(&a).is_empty());
    }
}
