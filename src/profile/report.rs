//! Aggregating profiled steps into the tables `wgrad profile` prints and the JSON it writes.

use std::collections::BTreeMap;

use serde::Serialize;

use super::StepRecord;
use crate::graph::{GpuInterval, TimingMode};

#[derive(Clone, Copy, Debug, Serialize)]
pub struct StepStats {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

/// GPU time of one kernel name, per steady-state step.
#[derive(Clone, Debug, Serialize)]
pub struct KernelRow {
    pub name: String,
    /// Dispatches per step.
    pub count: f64,
    /// GPU milliseconds per step.
    pub total_ms: f64,
    /// Microseconds per dispatch.
    pub avg_us: f64,
    /// Share of the step's summed kernel time.
    pub share: f64,
}

/// GPU time of one kind of dispatch (kernel, variant and grid: one product of one shape, say),
/// per steady-state step.
#[derive(Clone, Debug, Serialize)]
pub struct DispatchRow {
    pub name: String,
    /// The kernel variant (`Spec::describe`).
    pub variant: String,
    /// Workgroups in x, y, z.
    pub groups: [u32; 3],
    /// Dispatches per step.
    pub count: f64,
    /// GPU milliseconds per step.
    pub total_ms: f64,
    /// Microseconds per dispatch.
    pub avg_us: f64,
    /// Share of the step's summed kernel time.
    pub share: f64,
}

/// CPU milliseconds per step in one phase.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseRow {
    pub phase: String,
    pub ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProfileReport {
    pub steps: usize,
    pub warmup: usize,
    pub step_ms: StepStats,
    /// The same step with no GPU timestamps (`Profiler::untimed_steps`), as `bench step`
    /// times it: what the profiled step costs beside it is the profiler's own overhead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untimed_step_ms: Option<StepStats>,
    pub step0_ms: f64,
    pub step0_pipelines_compiled: u64,
    /// Step 0's compiling, summed over the compile workers (several run at once), and how
    /// long its flushes waited for it.
    pub step0_compile_ms: f64,
    pub step0_compile_wait_ms: f64,
    pub submits_per_step: f64,
    pub dispatches_per_step: f64,
    pub forward_dispatches_per_step: f64,
    pub backward_dispatches_per_step: f64,
    pub optimizer_dispatches_per_step: f64,
    pub buffers_created_per_step: f64,
    pub pool_hit_rate: f64,
    pub bytes_live: u64,
    pub peak_bytes_live: u64,
    /// Bytes of the pool's free buffers after the last step.
    pub bytes_free: u64,
    /// Dispatches per step encoded behind a pipeline barrier (each waits for all the compute
    /// work before it; see `graph::segment::Barriers`).
    pub barriers_per_step: f64,
    /// Dispatches per step encoded ahead of an earlier-recorded one that waits at a barrier
    /// (`graph::schedule`), to run beside the work before it.
    pub moved_per_step: f64,
    pub pipelines_compiled_per_step: f64,
    pub bind_groups_created_per_step: f64,
    pub bytes_uploaded_per_step: f64,
    /// Summed kernel time per step (per-pass time where kernels cannot be timed one by one).
    pub gpu_busy_ms: f64,
    /// gpu_busy_ms / median step time.
    pub gpu_busy_share: f64,
    /// The gaps between timed intervals summed over a step (time no interval covers, between
    /// the first's start and the last's end), median over the steady steps. Timed per pass
    /// (`WGRAD_DISABLE_FEATURES=timestamps_inside_passes`), the GPU waiting for the CPU's
    /// next submit, and the copies between the passes of one submit; per dispatch, also the
    /// gaps between dispatches.
    pub gpu_idle_between_ms: f64,
    pub timing: Option<TimingMode>,
    pub kernels: Vec<KernelRow>,
    /// Per kernel, variant and grid, the most time first.
    pub dispatches: Vec<DispatchRow>,
    pub phases: Vec<PhaseRow>,
}

/// Rows of the dispatch table `to_text` prints (the JSON has them all).
const DISPATCH_ROWS: usize = 20;

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Milliseconds between consecutive timed intervals (in start order) where none runs.
fn idle_between_ms(intervals: &[GpuInterval]) -> f64 {
    let mut spans: Vec<(f64, f64)> = intervals.iter().map(|i| (i.start_ns, i.end_ns)).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut idle = 0.0;
    let mut end = spans.first().map_or(0.0, |s| s.1);
    for (s, e) in spans.into_iter().skip(1) {
        idle += (s - end).max(0.0);
        end = end.max(e);
    }
    idle * 1e-6
}

pub(super) fn build(
    steps: &[StepRecord],
    warmup: usize,
    timing: Option<TimingMode>,
    untimed_ms: &[f64],
) -> ProfileReport {
    let steady: Vec<&StepRecord> = steps.iter().skip(warmup.max(1)).collect();
    let n = steady.len().max(1) as f64;
    let per = |f: &dyn Fn(&StepRecord) -> f64| steady.iter().map(|s| f(s)).sum::<f64>() / n;
    let walls: Vec<f64> = steady.iter().map(|s| s.wall_ms).collect();
    let step_ms = StepStats {
        min: if walls.is_empty() {
            0.0
        } else {
            walls.iter().copied().fold(f64::INFINITY, f64::min)
        },
        median: median(walls.clone()),
        max: walls.iter().copied().fold(0.0, f64::max),
    };
    let untimed_step_ms = (!untimed_ms.is_empty()).then(|| StepStats {
        min: untimed_ms.iter().copied().fold(f64::INFINITY, f64::min),
        median: median(untimed_ms.to_vec()),
        max: untimed_ms.iter().copied().fold(0.0, f64::max),
    });

    // Dispatch count and GPU ms over the steady steps, by kernel and by kernel, variant and
    // workgroups.
    let mut kernels: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    let mut shapes: BTreeMap<(&str, &str, [u32; 3]), (f64, f64)> = BTreeMap::new();
    for s in &steady {
        for i in &s.gpu {
            let ms = (i.end_ns - i.start_ns) * 1e-6;
            for e in [
                kernels.entry(i.label).or_default(),
                shapes.entry((i.label, &i.variant, i.groups)).or_default(),
            ] {
                e.0 += 1.0;
                e.1 += ms;
            }
        }
    }
    let busy: f64 = kernels.values().map(|(_, ms)| ms).sum::<f64>() / n;
    let idle_between = median(steady.iter().map(|s| idle_between_ms(&s.gpu)).collect());
    // (count, total ms, avg us, share) per step.
    let per_step = |count: f64, ms: f64| {
        (
            count / n,
            ms / n,
            if count > 0.0 { ms * 1e3 / count } else { 0.0 },
            if busy > 0.0 { ms / n / busy } else { 0.0 },
        )
    };
    let mut rows: Vec<KernelRow> = kernels
        .into_iter()
        .map(|(name, (count, ms))| {
            let (count, total_ms, avg_us, share) = per_step(count, ms);
            KernelRow {
                name: name.to_string(),
                count,
                total_ms,
                avg_us,
                share,
            }
        })
        .collect();
    rows.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    let mut dispatches: Vec<DispatchRow> = shapes
        .into_iter()
        .map(|((name, variant, groups), (count, ms))| {
            let (count, total_ms, avg_us, share) = per_step(count, ms);
            DispatchRow {
                name: name.to_string(),
                variant: variant.to_string(),
                groups,
                count,
                total_ms,
                avg_us,
                share,
            }
        })
        .collect();
    dispatches.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));

    let mut phases: BTreeMap<&str, f64> = BTreeMap::new();
    for s in &steady {
        for span in &s.cpu {
            *phases.entry(span.name).or_default() += (span.end_us - span.start_us) * 1e-3;
        }
    }
    // The `queue.submit` spans are part of encode+submit: listed under it.
    let submit_ms = phases.remove("queue.submit");
    let mut phases: Vec<PhaseRow> = phases
        .into_iter()
        .map(|(phase, ms)| PhaseRow {
            phase: phase.to_string(),
            ms: ms / n,
        })
        .collect();
    phases.push(PhaseRow {
        phase: "encode+submit".into(),
        ms: per(&|s| s.counters.encode_submit_ns as f64 * 1e-6),
    });
    phases.push(PhaseRow {
        phase: "encode+submit: arena writes".into(),
        ms: per(&|s| s.counters.arena_write_ns as f64 * 1e-6),
    });
    if let Some(ms) = submit_ms {
        phases.push(PhaseRow {
            phase: "encode+submit: queue.submit".into(),
            ms: ms / n,
        });
    }
    phases.push(PhaseRow {
        phase: "waiting on the GPU".into(),
        ms: per(&|s| s.counters.wait_ns as f64 * 1e-6),
    });

    let (first, last) = (steps.first(), steady.last().copied().or(steps.last()));
    let created = per(&|s| (s.pool_after.buffers_created - s.pool_before.buffers_created) as f64);
    let requests = per(&|s| (s.pool_after.requests - s.pool_before.requests) as f64);
    let reuses = per(&|s| (s.pool_after.reuses - s.pool_before.reuses) as f64);
    ProfileReport {
        steps: steps.len(),
        warmup,
        step_ms,
        step0_ms: first.map(|s| s.wall_ms).unwrap_or(0.0),
        step0_pipelines_compiled: first.map(|s| s.pipelines_compiled).unwrap_or(0),
        step0_compile_ms: first.map(|s| s.compile_ms).unwrap_or(0.0),
        step0_compile_wait_ms: first
            .map(|s| s.counters.compile_wait_ns as f64 * 1e-6)
            .unwrap_or(0.0),
        submits_per_step: per(&|s| s.counters.submits as f64),
        dispatches_per_step: per(&|s| s.counters.dispatches as f64),
        forward_dispatches_per_step: per(&|s| s.counters.forward_dispatches as f64),
        backward_dispatches_per_step: per(&|s| s.counters.backward_dispatches as f64),
        optimizer_dispatches_per_step: per(&|s| s.counters.optimizer_dispatches as f64),
        buffers_created_per_step: created,
        pool_hit_rate: if requests > 0.0 {
            reuses / requests
        } else {
            1.0
        },
        bytes_live: last.map(|s| s.pool_after.bytes_live).unwrap_or(0),
        bytes_free: last.map(|s| s.pool_after.bytes_cached).unwrap_or(0),
        barriers_per_step: per(&|s| s.counters.barriers as f64),
        moved_per_step: per(&|s| s.counters.moved as f64),
        peak_bytes_live: steps
            .iter()
            .map(|s| s.pool_after.peak_bytes_live)
            .max()
            .unwrap_or(0),
        pipelines_compiled_per_step: per(&|s| s.pipelines_compiled as f64),
        bind_groups_created_per_step: per(&|s| s.counters.bind_groups_created as f64),
        bytes_uploaded_per_step: per(&|s| s.counters.bytes_uploaded as f64),
        gpu_busy_ms: busy,
        gpu_busy_share: if step_ms.median > 0.0 {
            busy / step_ms.median
        } else {
            0.0
        },
        gpu_idle_between_ms: idle_between,
        timing,
        untimed_step_ms,
        kernels: rows,
        dispatches,
        phases,
    }
}

impl ProfileReport {
    /// The tables `wgrad profile` prints.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "wall time per step: min {:.2} ms, median {:.2} ms, max {:.2} ms over {} steady steps; step 0 (cold) {:.1} ms, {} pipelines compiled ({:.0} ms of compiling, flushes waited {:.0} ms)",
            self.step_ms.min,
            self.step_ms.median,
            self.step_ms.max,
            self.steps.saturating_sub(self.warmup.max(1)),
            self.step0_ms,
            self.step0_pipelines_compiled,
            self.step0_compile_ms,
            self.step0_compile_wait_ms
        );
        if let Some(u) = &self.untimed_step_ms {
            let extra = self.step_ms.median - u.median;
            let _ = writeln!(
                s,
                "untimed (no timestamps, as `bench step` times it): median {:.2} ms; profiling adds {:.2} ms a step ({:+.0}%): the kernels' times below are those of the timed step",
                u.median,
                extra,
                if u.median > 0.0 { extra / u.median * 100.0 } else { 0.0 }
            );
        }
        let _ = writeln!(
            s,
            "GPU busy {:.2} ms per step = {:.0}% of the median wall time{}",
            self.gpu_busy_ms,
            self.gpu_busy_share * 100.0,
            match self.timing {
                Some(TimingMode::PerPass) => format!(
                    "; idle between timed passes {:.3} ms",
                    self.gpu_idle_between_ms
                ),
                Some(TimingMode::PerDispatch) => format!(
                    "; idle between timed dispatches {:.3} ms",
                    self.gpu_idle_between_ms
                ),
                None => String::new(),
            }
        );
        match self.timing {
            Some(TimingMode::PerDispatch) => {}
            Some(TimingMode::PerPass) => s.push_str(
                "note: GPU time is per pass (the adapter cannot time inside passes, or\n      WGRAD_DISABLE_FEATURES=timestamps_inside_passes): idle between passes is the GPU\n      waiting for the next submit, or a copy between two passes of one submit\n",
            ),
            None => s.push_str("note: this adapter has no timestamp queries; no GPU times\n"),
        }
        let _ = writeln!(
            s,
            "\n{:<26} {:>8} {:>10} {:>10} {:>7}",
            "GPU kernel", "count", "total ms", "avg us", "share"
        );
        for k in &self.kernels {
            let _ = writeln!(
                s,
                "{:<26} {:>8.1} {:>10.3} {:>10.1} {:>6.1}%",
                k.name,
                k.count,
                k.total_ms,
                k.avg_us,
                k.share * 100.0
            );
        }
        if self.timing == Some(TimingMode::PerDispatch) && !self.dispatches.is_empty() {
            let _ = writeln!(
                s,
                "\n{:<26} {:>18} {:>8} {:>10} {:>10} {:>7}",
                "dispatch (top by time)", "workgroups", "count", "total ms", "avg us", "share"
            );
            for d in self.dispatches.iter().take(DISPATCH_ROWS) {
                let [x, y, z] = d.groups;
                let _ = writeln!(
                    s,
                    "{:<26} {:>18} {:>8.1} {:>10.3} {:>10.1} {:>6.1}%",
                    d.name,
                    format!("{x}x{y}x{z}"),
                    d.count,
                    d.total_ms,
                    d.avg_us,
                    d.share * 100.0
                );
            }
            let _ = writeln!(
                s,
                "(each dispatch's variant is in --json's `dispatches` and the --trace events)"
            );
        }
        let _ = writeln!(s, "\n{:<30} {:>10}", "CPU phase", "ms/step");
        for p in &self.phases {
            let _ = writeln!(s, "{:<30} {:>10.3}", p.phase, p.ms);
        }
        let _ = writeln!(s, "\nper step:");
        let rows: [(&str, String); 14] = [
            (
                "dispatches",
                format!(
                    "{:.0} (forward {:.0}, backward {:.0}, optimizer {:.0})",
                    self.dispatches_per_step,
                    self.forward_dispatches_per_step,
                    self.backward_dispatches_per_step,
                    self.optimizer_dispatches_per_step
                ),
            ),
            (
                "dispatch barriers",
                format!("{:.0}", self.barriers_per_step),
            ),
            ("moved ahead of one", format!("{:.0}", self.moved_per_step)),
            (
                "queue.submit calls",
                format!("{:.1}", self.submits_per_step),
            ),
            (
                "buffers created",
                format!("{:.1}", self.buffers_created_per_step),
            ),
            (
                "pool hit rate",
                format!("{:.1}%", self.pool_hit_rate * 100.0),
            ),
            ("bytes live", self.bytes_live.to_string()),
            ("peak bytes live", self.peak_bytes_live.to_string()),
            ("bytes free in pool", self.bytes_free.to_string()),
            (
                "pipelines compiled",
                format!("{:.1}", self.pipelines_compiled_per_step),
            ),
            (
                "bind groups created",
                format!("{:.1}", self.bind_groups_created_per_step),
            ),
            (
                "bytes uploaded",
                format!("{:.0}", self.bytes_uploaded_per_step),
            ),
            ("GPU busy ms", format!("{:.3}", self.gpu_busy_ms)),
            ("median wall ms", format!("{:.3}", self.step_ms.median)),
        ];
        for (k, v) in rows {
            let _ = writeln!(s, "  {k:<22} {v}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start_us: f64, end_us: f64) -> GpuInterval {
        GpuInterval {
            label: "compute pass",
            variant: "".into(),
            groups: [0; 3],
            start_ns: start_us * 1e3,
            end_ns: end_us * 1e3,
        }
    }

    #[test]
    fn idle_between_counts_only_time_no_interval_covers() {
        // Out of order, one interval inside another, gaps of 30 and 50 us.
        let spans = [
            at(200.0, 260.0),
            at(0.0, 100.0),
            at(20.0, 70.0),
            at(130.0, 150.0),
        ];
        assert!((idle_between_ms(&spans) - 0.080).abs() < 1e-12);
        assert_eq!(idle_between_ms(&[]), 0.0);
        assert_eq!(idle_between_ms(&[at(5.0, 9.0)]), 0.0);
    }
}
