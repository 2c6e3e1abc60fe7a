//! Data-parallel training under `mpirun` (`--features mpi`; Open MPI or MPICH on the PATH),
//! on the tiny preset and whatever adapter is found (lavapipe in CI, both ranks sharing it):
//!
//! - 2 ranks of --batch B give the losses of 1 process of --batch 2B (the same global batches;
//!   within f32 reduction-order tolerance), and their weights are the same bits (each rank
//!   prints its fingerprint; the run itself checks at every save);
//! - rank 0 alone saves, and the checkpoint records the world size;
//! - a 2-rank run saved and resumed under 2 ranks continues its loss sequence, here over
//!   MPI's TCP transport (what ranks on several hosts use; shared memory left out);
//! - a rank killed mid-run ends the job with an error, and a rank that hangs makes the others
//!   end it after `WGRAD_DIST_TIMEOUT_S`, not wait for ever.

#![cfg(feature = "mpi")]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const WGRAD: &str = env!("CARGO_BIN_EXE_wgrad");

/// What every run trains: the tiny preset, 16 tokens a sequence (warm-up 1 so the rate moves
/// from the second step), gradient clipping on (the norm of the averaged gradient).
const TRAIN: [&str; 8] = [
    "train", "--preset", "tiny", "--seq", "16", "--warmup", "1", "--json",
];

/// `mpirun -np n` of wgrad with `args`, Open MPI allowed to run as root and to place more
/// ranks than cores (CI containers); MPICH ignores both variables.
fn mpirun(n: usize, args: &[&str]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", &n.to_string(), WGRAD])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("XDG_RUNTIME_DIR", std::env::temp_dir());
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The losses of the JSON step lines on stdout.
fn losses(out: &Output) -> Vec<f64> {
    text(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON step line");
            v["loss"].as_f64().expect("a loss")
        })
        .collect()
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn two_ranks_of_batch_b_train_as_one_process_of_batch_2b() {
    let dir = std::env::temp_dir().join(format!("wgrad-mpi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out_dir = dir.join("run");
    let out_arg = out_dir.to_str().expect("a UTF-8 temp path");

    let one = Command::new(WGRAD)
        .args(TRAIN)
        .args(["--batch", "4", "--steps", "3"])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("wgrad runs");
    check(&one, "1 process, --batch 4");
    let two = mpirun(2, &TRAIN)
        .args([
            "--batch",
            "2",
            "--steps",
            "3",
            "--out",
            out_arg,
            "--save-every",
            "1",
        ])
        .output()
        .expect("mpirun runs");
    check(&two, "mpirun -np 2, --batch 2");

    let (a, b) = (losses(&one), losses(&two));
    assert_eq!(
        a.len(),
        3,
        "one process's step lines:\n{}",
        text(&one.stdout)
    );
    // Rank 0 alone prints its steps.
    assert_eq!(b.len(), 3, "2 ranks' step lines:\n{}", text(&two.stdout));
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        // f32 sums in another order (two halves of the batch, then the allreduce), through
        // three AdamW steps: a few ulps of the loss grow to about 1e-5 relative.
        let rel = (x - y).abs() / x.abs();
        assert!(
            rel < 1e-4,
            "step {}: loss {x} alone, {y} on 2 ranks",
            step + 1
        );
    }

    let stderr = text(&two.stderr);
    let prints: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split_once(": weights fnv1a64 ").map(|(_, f)| f))
        .collect();
    assert_eq!(prints.len(), 2, "one fingerprint a rank:\n{stderr}");
    assert_eq!(prints[0], prints[1], "the ranks' weights differ:\n{stderr}");

    assert_eq!(
        saved_world_size(&out_dir.join("wgrad_state.safetensors")),
        2
    );
    // Resuming with another number of ranks would change the batches: refused.
    let alone = Command::new(WGRAD)
        .args(["train", "--resume", out_arg, "--steps", "4"])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("wgrad runs");
    assert!(!alone.status.success(), "a 2-rank checkpoint resumed alone");
    assert!(
        text(&alone.stderr).contains("mpirun -np 2"),
        "{}",
        text(&alone.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_two_rank_run_resumes_where_it_stopped_over_tcp() {
    let dir = std::env::temp_dir().join(format!("wgrad-mpi-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out_dir = dir.join("run");
    let out_arg = out_dir.to_str().expect("a UTF-8 temp path");
    // Open MPI's TCP transport alone, as between hosts (MPICH ignores these variables).
    let tcp = |cmd: &mut Command| {
        cmd.env("OMPI_MCA_btl", "tcp,self")
            .env("OMPI_MCA_pml", "ob1");
    };
    let mut straight = mpirun(2, &TRAIN);
    straight.args(["--batch", "2", "--steps", "4"]);
    tcp(&mut straight);
    let straight = straight.output().expect("mpirun runs");
    check(&straight, "4 steps on 2 ranks");
    let mut first = mpirun(2, &TRAIN);
    first.args(["--batch", "2", "--steps", "2", "--out", out_arg]);
    tcp(&mut first);
    let first = first.output().expect("mpirun runs");
    check(&first, "2 steps on 2 ranks, saved");
    let mut rest = mpirun(2, &["train", "--json", "--resume", out_arg, "--steps", "4"]);
    tcp(&mut rest);
    let rest = rest.output().expect("mpirun runs");
    check(&rest, "resumed on 2 ranks to step 4");

    let want = losses(&straight);
    let got: Vec<f64> = losses(&first).into_iter().chain(losses(&rest)).collect();
    assert_eq!(want.len(), 4, "{}", text(&straight.stdout));
    assert_eq!(
        got.len(),
        4,
        "{}\n{}",
        text(&first.stdout),
        text(&rest.stdout)
    );
    for (step, (x, y)) in want.iter().zip(&got).enumerate() {
        // The same ranks summing in the same order, the optimizer's state restored: the same
        // losses but for the last bits of a reloaded loss scale or moment.
        let rel = (x - y).abs() / x.abs();
        assert!(rel < 1e-6, "step {}: {x} straight, {y} resumed", step + 1);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The world size in a checkpoint's hyper-parameters (its safetensors header's metadata).
fn saved_world_size(state: &std::path::Path) -> u64 {
    let bytes = std::fs::read(state).expect("a checkpoint");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("JSON");
    let hyper = header["__metadata__"]["hyper_parameters"]
        .as_str()
        .expect("hyper-parameters");
    let hyper: serde_json::Value = serde_json::from_str(hyper).expect("JSON");
    hyper["world_size"].as_u64().expect("a world size")
}

/// The pid of the wgrad process of rank `rank` whose environment holds `tag`.
#[cfg(target_os = "linux")]
fn rank_pid(tag: &str, rank: usize) -> Option<i32> {
    let want = [
        format!("OMPI_COMM_WORLD_RANK={rank}"),
        format!("PMI_RANK={rank}"),
    ];
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let env = std::fs::read(e.path().join("environ")).ok()?;
        let vars: Vec<String> = env
            .split(|&b| b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        let exe = std::fs::read_link(e.path().join("exe")).ok()?;
        let ours = vars.iter().any(|v| v == tag) && vars.iter().any(|v| want.contains(v));
        (ours && exe.file_name()? == "wgrad").then_some(pid)
    })
}

/// Starts a long 2-rank run, waits for rank 0's first step, sends `signal` to rank 1 and
/// returns how the job ended, how long that took after the signal, and rank 1's pid.
#[cfg(target_os = "linux")]
fn disturb_rank_1(signal: i32, timeout_s: &str) -> (Output, Duration, i32) {
    // Not a WGRAD_ variable: wgrad refuses the ones it does not know.
    let key = format!("MPI_TEST_TAG_{}_{signal}", std::process::id());
    let tag = format!("{key}=1");
    let mut child = mpirun(2, &TRAIN)
        .args(["--batch", "1", "--steps", "200"])
        .env(&key, "1")
        .env("WGRAD_DIST_TIMEOUT_S", timeout_s)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("rank 0's first step");
    if !first.starts_with('{') {
        let out = child.wait_with_output().expect("mpirun ends");
        panic!("no step line ({first}):\n{}", text(&out.stderr));
    }
    let pid = rank_pid(&tag, 1).expect("rank 1's process");
    // SAFETY: kill(2) on a process this test started (through mpirun).
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    let hit = Instant::now();
    let out = child.wait_with_output().expect("mpirun ends");
    (out, hit.elapsed(), pid)
}

#[cfg(target_os = "linux")]
#[test]
fn a_rank_that_dies_or_hangs_ends_the_job() {
    // Killed: the launcher sees it die and ends the other rank.
    let (out, waited, _) = disturb_rank_1(libc::SIGKILL, "600");
    assert!(!out.status.success(), "the job went on without rank 1");
    assert!(waited < Duration::from_secs(120), "ended after {waited:?}");

    // Stopped: rank 0 waits 5 s in the allreduce, then ends the job naming why.
    let (out, waited, pid) = disturb_rank_1(libc::SIGSTOP, "5");
    // SAFETY: as above; the stopped rank may outlive mpirun.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "the job went on without rank 1");
    assert!(
        stderr.contains("WGRAD_DIST_TIMEOUT_S") && stderr.contains("rank 0 of 2"),
        "{stderr}"
    );
    assert!(waited < Duration::from_secs(120), "ended after {waited:?}");
}
