//! A search's choices checked inside the training step: a product timed alone can rank its
//! tiles otherwise than the step does (there its operands come from the kernels before it,
//! other products run beside it, a wave's last workgroups share the GPU with the next
//! dispatch). For each product a search measured, the configurations close to its fastest in
//! isolation are set in the tile table in turn, the step runs with GPU timestamps, and the one
//! under which the step's GPU is busy least is kept. Searches measure; nothing here asserts on
//! timing.
//!
//! On an H100 (2026-11-26) the search alone wrote tables slower in the step than the ones
//! they replaced: at 8 x 512 --amp 21.2 ms against 20.7, at 4 x 128 --amp 4.84-4.85 against
//! 4.77-4.79 for a table set partly by hand. With the check, 8 x 512 ran as the table it
//! replaced (20.71-20.78 ms against 20.76-20.88, same machine) and 4 x 128 still 0.02-0.19 ms
//! behind the table set partly by hand (4.98-5.05 against 4.80-5.01). The check kept the LM
//! head's dX in 11 ranges (one wave), which the search ranked below 16, and left out a tile the
//! search ranked first under which the step's GPU was busy 0.55 ms longer (PROFILING.md).

use crate::error::Result;
use crate::graph::{Device, GpuInterval};
use crate::kernels::tuning::ProductKey;

use super::{Measured, Search};

/// Configurations of a product tried in the step: those within this factor of its fastest
/// time in isolation...
pub const NEAR: f64 = 1.25;
/// ... at most this many, fastest first (the search's winner among them).
pub const MOST: usize = 8;
/// Steps timed per configuration (after one untimed step that compiles its pipelines); the
/// median of their GPU busy times counts.
pub const STEPS: usize = 5;

/// What the step measured for one product.
pub struct Refined {
    pub key: ProductKey,
    /// The search's choice (the fastest alone).
    pub searched: Measured,
    /// The configuration kept: the one whose step's GPU was busy least.
    pub chosen: Measured,
    /// Each configuration tried, with the median GPU-busy milliseconds of a step under it.
    pub tried: Vec<(Measured, f64)>,
}

impl Refined {
    /// The step's GPU-busy milliseconds under the search's choice and under the one kept.
    pub fn busy_ms(&self) -> (f64, f64) {
        let of = |m: &Measured| {
            self.tried
                .iter()
                .find(|(t, _)| t.tile == m.tile && t.split == m.split)
                .map_or(f64::NAN, |(_, ms)| *ms)
        };
        (of(&self.searched), of(&self.chosen))
    }
}

/// The configurations of `search` worth trying in the step: distinct (tile, split) pairs
/// within `NEAR` of the fastest alone, at most `MOST`, fastest first.
pub fn candidates(search: &Search) -> Vec<Measured> {
    let best = search.best().ms;
    let mut sorted = search.measured.clone();
    sorted.sort_by(|a, b| a.ms.total_cmp(&b.ms));
    let mut out: Vec<Measured> = Vec::new();
    for m in sorted {
        if out.len() == MOST || m.ms > best * NEAR {
            break;
        }
        if !out.iter().any(|o| o.tile == m.tile && o.split == m.split) {
            out.push(m);
        }
    }
    out
}

/// The time the GPU was busy: the union of the intervals (overlapping dispatches counted
/// once, the gaps between them not at all), in milliseconds.
pub fn busy_ms(intervals: &[GpuInterval]) -> f64 {
    let mut spans: Vec<(f64, f64)> = intervals
        .iter()
        .filter(|i| i.end_ns > i.start_ns)
        .map(|i| (i.start_ns, i.end_ns))
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut open: Option<(f64, f64)> = None;
    for (s, e) in spans {
        open = match open {
            Some((os, oe)) if s <= oe => Some((os, oe.max(e))),
            Some((os, oe)) => {
                total += oe - os;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((os, oe)) = open {
        total += oe - os;
    }
    total * 1e-6
}

/// Checks `searches` (a `search_step`'s, whose winners are in the device's table) inside the
/// step `step` runs: for each product, largest alone first, each of its `candidates` is set
/// in the table and the step run `STEPS + 1` times; the candidate with the least median GPU
/// busy time stays in the table (the others' choices as they stand then). None where the
/// adapter has no timestamps. The step's work is real: a training step trains.
pub fn refine_step(
    device: &Device,
    searches: &[Search],
    mut step: impl FnMut() -> Result<()>,
) -> Result<Option<Vec<Refined>>> {
    if device.set_gpu_timing(true).is_none() {
        return Ok(None);
    }
    let result = refine_with_timing(device, searches, &mut step);
    device.set_gpu_timing(false);
    result.map(Some)
}

fn refine_with_timing(
    device: &Device,
    searches: &[Search],
    step: &mut impl FnMut() -> Result<()>,
) -> Result<Vec<Refined>> {
    let mut order: Vec<&Search> = searches.iter().collect();
    order.sort_by(|a, b| b.best().ms.total_cmp(&a.best().ms));
    let mut refined = Vec::new();
    for search in order {
        let tried_list = candidates(search);
        let mut tried = Vec::with_capacity(tried_list.len());
        for m in tried_list {
            device.set_tile(search.key, m.tile, m.split, m.ms);
            tried.push((m, step_busy_ms(device, step)?));
        }
        let (chosen, _) = *tried
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("the search's winner is a candidate");
        device.set_tile(search.key, chosen.tile, chosen.split, chosen.ms);
        refined.push(Refined {
            key: search.key,
            searched: search.best(),
            chosen,
            tried,
        });
    }
    Ok(refined)
}

/// The median GPU-busy milliseconds of `STEPS` steps, after one untimed step.
fn step_busy_ms(device: &Device, step: &mut impl FnMut() -> Result<()>) -> Result<f64> {
    step()?;
    device.take_gpu_intervals()?;
    let mut times = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        step()?;
        times.push(busy_ms(&device.take_gpu_intervals()?));
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(start_ns: f64, end_ns: f64) -> GpuInterval {
        GpuInterval {
            label: "k",
            variant: "".into(),
            groups: [1, 1, 1],
            start_ns,
            end_ns,
        }
    }

    #[test]
    fn busy_time_counts_overlaps_once_and_gaps_not_at_all() {
        // [0, 10] and [5, 20] overlap (20), [30, 35] apart (5), [40, 40] empty.
        let ivs = [iv(30.0, 35.0), iv(0.0, 10.0), iv(5.0, 20.0), iv(40.0, 40.0)];
        assert!((busy_ms(&ivs) - 25e-6).abs() < 1e-12, "{}", busy_ms(&ivs));
        assert_eq!(busy_ms(&[]), 0.0);
        // One interval inside another.
        assert!((busy_ms(&[iv(0.0, 100.0), iv(10.0, 20.0)]) - 100e-6).abs() < 1e-12);
    }
}
