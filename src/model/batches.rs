//! Batches of consecutive tokens, (B, T+1) each: row b holds T inputs and, shifted by one, T
//! targets. A part of n tokens is cut into m = (n - 1) / T windows of T+1 tokens that overlap
//! by one token (window k starts at shift + k*T). An epoch visits every window once: in a
//! seeded random order with a seeded shift in [0, (n - 1) - m*T] for training, in order from 0
//! for evaluation. The order of epoch e depends only on (seed, e), so a `DataPosition`
//! (epoch, windows visited in it) is all a resumed run needs to continue the same stream.

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where a sampler is in its stream: save it with a checkpoint, give it back to resume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Full passes over the windows done.
    pub epoch: u64,
    /// Windows of the current epoch already handed out.
    pub index: u64,
}

/// B rows of T+1 consecutive tokens, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub tokens: Vec<u32>, // (B, T+1)
    pub batch: usize,
    pub seq_len: usize,
}

impl Batch {
    /// Row `b`: T+1 tokens.
    pub fn row(&self, b: usize) -> &[u32] {
        let w = self.seq_len + 1;
        &self.tokens[b * w..(b + 1) * w]
    }

    /// The model's inputs, (B, T): each row without its last token.
    pub fn inputs(&self) -> Vec<u32> {
        (0..self.batch)
            .flat_map(|b| &self.row(b)[..self.seq_len])
            .copied()
            .collect()
    }

    /// The next-token targets, (B, T): each row without its first token.
    pub fn targets(&self) -> Vec<u32> {
        (0..self.batch)
            .flat_map(|b| &self.row(b)[1..])
            .copied()
            .collect()
    }
}

/// SplitMix64: a tiny generator whose stream is fixed by its seed on every platform.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n >= 1); the modulo bias is below n / 2^64, negligible here.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub struct BatchSampler {
    tokens: Arc<[u32]>,
    part: Range<usize>,
    batch: usize,
    seq_len: usize,
    /// None: windows in order, no shift.
    seed: Option<u64>,
    windows: usize,
    slack: usize,
    position: DataPosition,
    /// The current epoch's (shift, window order), built on first use.
    epoch_plan: Option<(u64, usize, Vec<u32>)>,
}

impl BatchSampler {
    /// Seeded random windows of `tokens[part]`.
    pub fn shuffled(
        tokens: Arc<[u32]>,
        part: Range<usize>,
        batch: usize,
        seq_len: usize,
        seed: u64,
    ) -> Result<BatchSampler> {
        BatchSampler::new(tokens, part, batch, seq_len, Some(seed))
    }

    /// The windows of `tokens[part]` in order (evaluation).
    pub fn sequential(
        tokens: Arc<[u32]>,
        part: Range<usize>,
        batch: usize,
        seq_len: usize,
    ) -> Result<BatchSampler> {
        BatchSampler::new(tokens, part, batch, seq_len, None)
    }

    fn new(
        tokens: Arc<[u32]>,
        part: Range<usize>,
        batch: usize,
        seq_len: usize,
        seed: Option<u64>,
    ) -> Result<BatchSampler> {
        let n = part.len();
        if batch == 0 || seq_len == 0 || part.end > tokens.len() || n < seq_len + 1 {
            return Err(Error::InvalidArgument {
                op: "BatchSampler",
                reason: format!(
                    "B {batch} x T {seq_len} over {n} tokens ({part:?} of {}): B and T must be \
                     positive and the part hold T + 1 tokens at least",
                    tokens.len()
                ),
            });
        }
        let windows = (n - 1) / seq_len;
        Ok(BatchSampler {
            tokens,
            part,
            batch,
            seq_len,
            seed,
            windows,
            slack: (n - 1) - windows * seq_len,
            position: DataPosition::default(),
            epoch_plan: None,
        })
    }

    /// Windows in one epoch.
    pub fn windows_per_epoch(&self) -> usize {
        self.windows
    }

    /// Whole batches in one epoch (an evaluation pass over the held-out part takes these).
    pub fn batches_per_epoch(&self) -> usize {
        self.windows / self.batch
    }

    pub fn position(&self) -> DataPosition {
        self.position
    }

    /// Continues from `position` (one this sampler, or one over the same tokens, T and seed,
    /// handed out; B may differ).
    pub fn set_position(&mut self, position: DataPosition) -> Result<()> {
        if position.index > self.windows as u64 {
            return Err(Error::InvalidArgument {
                op: "BatchSampler::set_position",
                reason: format!(
                    "window {} of an epoch of {} windows: the position belongs to other data",
                    position.index, self.windows
                ),
            });
        }
        self.position = position;
        Ok(())
    }

    /// The (shift, window order) of `epoch`.
    fn plan(&self, epoch: u64) -> (usize, Vec<u32>) {
        let mut order: Vec<u32> = (0..self.windows as u32).collect();
        let Some(seed) = self.seed else {
            return (0, order);
        };
        let mut rng = SplitMix64(seed ^ epoch.wrapping_mul(0xd1b5_4a32_d192_ed03));
        let shift = rng.below(self.slack as u64 + 1) as usize;
        for i in (1..order.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        (shift, order)
    }

    /// The next batch, (B, T+1); crosses into the next epoch when this one runs out.
    pub fn next_batch(&mut self) -> Batch {
        let w = self.seq_len + 1;
        let mut tokens = Vec::with_capacity(self.batch * w);
        for _ in 0..self.batch {
            if self.position.index as usize == self.windows {
                self.position.epoch += 1;
                self.position.index = 0;
            }
            let epoch = self.position.epoch;
            if self.epoch_plan.as_ref().map(|p| p.0) != Some(epoch) {
                let (shift, order) = self.plan(epoch);
                self.epoch_plan = Some((epoch, shift, order));
            }
            let (_, shift, order) = self.epoch_plan.as_ref().expect("planned just above");
            let k = order[self.position.index as usize] as usize;
            let start = self.part.start + shift + k * self.seq_len;
            tokens.extend_from_slice(&self.tokens[start..start + w]);
            self.position.index += 1;
        }
        Batch {
            tokens,
            batch: self.batch,
            seq_len: self.seq_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counting(n: u32) -> Arc<[u32]> {
        (0..n).collect::<Vec<u32>>().into()
    }

    #[test]
    fn rows_are_consecutive_and_an_epoch_visits_every_window_once() {
        let tokens = counting(1000);
        let mut s = BatchSampler::shuffled(tokens, 100..1000, 4, 16, 42).expect("sampler");
        assert_eq!(s.windows_per_epoch(), 899 / 16);
        let mut starts = Vec::new();
        while starts.len() < s.windows_per_epoch() - s.windows_per_epoch() % 4 {
            let b = s.next_batch();
            assert_eq!(b.tokens.len(), 4 * 17);
            for r in 0..4 {
                let row = b.row(r);
                assert!(row.windows(2).all(|p| p[1] == p[0] + 1), "{row:?}");
                assert!(row[0] >= 100 && row[16] < 1000);
                starts.push(row[0]);
            }
            assert_eq!(b.inputs()[..16], b.row(0)[..16]);
            assert_eq!(b.targets()[..16], b.row(0)[1..]);
        }
        let shift = starts.iter().min().expect("rows") - 100;
        starts.sort();
        starts.dedup();
        assert_eq!(
            starts.len(),
            s.windows_per_epoch() - s.windows_per_epoch() % 4
        );
        assert!(starts.iter().all(|&x| (x - 100 - shift) % 16 == 0));
    }

    #[test]
    fn the_stream_is_fixed_by_the_seed_and_resumes_from_a_position() {
        let tokens = counting(500);
        let make = |seed| BatchSampler::shuffled(tokens.clone(), 0..500, 3, 8, seed).unwrap();
        let mut a = make(1);
        let first: Vec<Batch> = (0..50).map(|_| a.next_batch()).collect(); // 2.4 epochs
        assert!(a.position().epoch >= 2);
        let mut b = make(1);
        assert_eq!((0..50).map(|_| b.next_batch()).collect::<Vec<_>>(), first);
        let mut c = make(2);
        assert_ne!(c.next_batch(), first[0]);

        let mut resumed = make(1);
        let mut d = make(1);
        for _ in 0..23 {
            d.next_batch();
        }
        let saved = serde_json::to_string(&d.position()).expect("serializing");
        resumed
            .set_position(serde_json::from_str(&saved).expect("parsing"))
            .expect("restoring");
        assert_eq!(resumed.next_batch(), first[23]);
        let err = resumed.set_position(DataPosition {
            epoch: 0,
            index: 10_000,
        });
        assert!(err.unwrap_err().to_string().contains("10000"));
    }

    #[test]
    fn sequential_batches_walk_the_part_in_order() {
        let tokens = counting(100);
        let mut s = BatchSampler::sequential(tokens, 60..100, 2, 9).expect("sampler");
        assert_eq!((s.windows_per_epoch(), s.batches_per_epoch()), (4, 2));
        let b = s.next_batch();
        assert_eq!((b.row(0)[0], b.row(1)[0], b.row(1)[9]), (60, 69, 78));
        let b = s.next_batch();
        assert_eq!((b.row(0)[0], b.row(1)[9]), (78, 96));
        assert_eq!(s.next_batch().row(0)[0], 60, "wraps to the next epoch");
    }
}
