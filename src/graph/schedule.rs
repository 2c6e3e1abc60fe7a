//! The order a flush encodes its commands in.
//!
//! wgpu puts a barrier before a dispatch that uses a buffer an earlier command of the command
//! buffer used, unless both uses only read it (`segment::Barriers`), and on Vulkan that barrier
//! waits for all the compute work before it. So a dispatch recorded after one that waits starts
//! behind it even when it needs nothing from it. A linear's backward, for one, records dW's
//! product split into ranges of K, the dispatch that sums the ranges (which waits for the
//! product), the bias gradient's two stages, and then dX's product, which needs none of them:
//! in recorded order dX starts after dW and its sum have finished, where it could have filled
//! the cores that dW's last wave leaves idle.
//!
//! `order` moves such dispatches forward. Where a dispatch would wait, the dispatches recorded
//! after it (at most `WINDOW` of them, none past a copy or an upload) that would not wait at
//! that point, and that share no buffer with a command they pass where either of the two writes
//! it, go first: they run beside the work before the barrier. What each command reads and
//! writes is unchanged, so the results are the same bits.

use super::segment::{Barriers, Use};

/// How far past a waiting dispatch `order` looks for dispatches to move before it. A linear's
/// backward records dX's product three commands after the sum of dW's ranges (the bias
/// gradient's two stages between them). 4 ran the 8 x 512 --amp step as fast as 16 or 64 on an
/// H100 (PROFILING.md), and costs the host a quarter of 16's look-ups. A `lab` build's
/// `WGRAD_SCHEDULE` sets it (`recorded`: 0, the recorded order).
pub const WINDOW: usize = 4;

/// One command's buffers as the scheduler sees them.
#[derive(Clone, Debug, Default)]
pub struct Uses {
    /// Whether the command is a dispatch (only dispatches move; copies and uploads end a
    /// look-ahead).
    pub dispatch: bool,
    /// Each buffer once, with the use wgpu tracks (the first binding's, as `Barriers` models).
    pub tracked: Vec<(u64, Use)>,
    /// Each buffer once, and whether any binding writes it.
    pub writes: Vec<(u64, bool)>,
}

impl Uses {
    /// Whether running `self` and `other` in either order may give different results: a
    /// buffer both use that one of them writes.
    fn conflicts(&self, other: &Uses) -> bool {
        self.writes.iter().any(|(id, w)| {
            other
                .writes
                .iter()
                .any(|(id2, w2)| id == id2 && (*w || *w2))
        })
    }
}

/// The order to encode commands in (indices into `uses`), moving dispatches ahead of one that
/// would wait at a barrier where they need not wait themselves (see the module's note); and how
/// many moved.
pub fn order(uses: &[Uses], window: usize) -> (Vec<usize>, u64) {
    let n = uses.len();
    let mut order = Vec::with_capacity(n);
    let mut done = vec![false; n];
    let mut model = Barriers::default();
    let mut passed: Vec<usize> = Vec::new();
    let mut moved = 0;
    for i in 0..n {
        if done[i] {
            continue;
        }
        let u = &uses[i];
        if u.dispatch && model.waits(&u.tracked) {
            passed.clear();
            passed.push(i);
            let mut seen = 0;
            for j in i + 1..n {
                if seen == window || !uses[j].dispatch {
                    break;
                }
                if done[j] {
                    continue;
                }
                seen += 1;
                let e = &uses[j];
                if !model.waits(&e.tracked) && !passed.iter().any(|&p| uses[p].conflicts(e)) {
                    model.record(e.tracked.iter().copied());
                    order.push(j);
                    done[j] = true;
                    moved += 1;
                } else {
                    passed.push(j);
                }
            }
        }
        model.record(u.tracked.iter().copied());
        order.push(i);
        done[i] = true;
    }
    (order, moved)
}

#[cfg(test)]
mod tests {
    use super::{order, Use, Uses};

    /// A dispatch reading `reads` and writing `writes`.
    fn d(reads: &[u64], writes: &[u64]) -> Uses {
        let mut u = Uses {
            dispatch: true,
            ..Uses::default()
        };
        for &r in reads {
            u.tracked.push((r, Use::StorageRead));
            u.writes.push((r, false));
        }
        for &w in writes {
            u.tracked.push((w, Use::StorageWrite));
            u.writes.push((w, true));
        }
        u
    }

    #[test]
    fn a_linears_dx_goes_beside_its_dw_not_behind_dws_sum() {
        // 0 dz = f(g); 1 dW's partials = x^T dz; 2 their sum into the gradients (buffer 9);
        // 3 dX = dz W^T; 4 the next op on dX.
        let cmds = [
            d(&[1], &[2]),
            d(&[3, 2], &[4]),
            d(&[4], &[9]),
            d(&[2, 5], &[6]),
            d(&[6], &[7]),
        ];
        // dX (3) needs no barrier after dW (1): dz was last read, its output is new. It passes
        // the sum (2), which it shares no buffer with.
        assert_eq!(order(&cmds, 16), (vec![0, 1, 3, 2, 4], 1));
        assert_eq!(order(&cmds, 0), (vec![0, 1, 2, 3, 4], 0));
    }

    #[test]
    fn nothing_passes_a_command_it_depends_on_or_that_reads_what_it_writes() {
        // 1 waits (reads 2, written by 0). 2 reads what 1 writes: it waits anyway. 3 writes
        // buffer 3, which 1 reads (a buffer the pool gave back and handed out again): it may
        // not pass 1 though it would not wait. 4 is free of all of them and goes first.
        let cmds = [
            d(&[1], &[2]),
            d(&[2, 3], &[4]),
            d(&[4], &[5]),
            d(&[6], &[3]),
            d(&[6], &[8]),
        ];
        assert_eq!(order(&cmds, 16), (vec![0, 4, 1, 2, 3], 1));
    }

    #[test]
    fn dispatches_do_not_move_past_a_copy() {
        let copy = Uses {
            dispatch: false,
            tracked: vec![(10, Use::CopySrc), (11, Use::CopyDst)],
            writes: vec![(10, false), (11, true)],
        };
        let cmds = [d(&[1], &[2]), d(&[2], &[3]), copy, d(&[6], &[7])];
        assert_eq!(order(&cmds, 16), (vec![0, 1, 2, 3], 0));
    }

    #[test]
    fn every_order_is_a_permutation_that_keeps_each_conflicting_pair_in_place() {
        // Random chains over a few buffers: whatever moves, two commands that share a buffer
        // one of them writes keep their recorded order.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for _ in 0..200 {
            let n = 2 + next(30) as usize;
            let cmds: Vec<Uses> = (0..n)
                .map(|_| {
                    let w = next(8);
                    let mut reads: Vec<u64> = (0..next(3)).map(|_| next(8)).collect();
                    reads.retain(|&r| r != w);
                    reads.sort_unstable();
                    reads.dedup();
                    let mut u = d(&reads, &[w]);
                    u.dispatch = next(10) != 0;
                    u
                })
                .collect();
            let (o, _) = order(&cmds, 1 + next(16) as usize);
            let mut sorted = o.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            let at: Vec<usize> = {
                let mut at = vec![0; n];
                for (p, &i) in o.iter().enumerate() {
                    at[i] = p;
                }
                at
            };
            for a in 0..n {
                for b in a + 1..n {
                    if cmds[a].conflicts(&cmds[b]) {
                        assert!(at[a] < at[b], "{a} and {b} swapped in {o:?}");
                    }
                    if !cmds[a].dispatch || !cmds[b].dispatch {
                        assert!(at[a] < at[b], "{a} and {b} crossed a copy in {o:?}");
                    }
                }
            }
        }
    }
}
