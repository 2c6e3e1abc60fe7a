//! The host-staged reduction against a fake world: this process is rank 0 of two, and the
//! other rank's buffers are given by the test.

use std::cell::RefCell;
use std::rc::Rc;

use super::*;
use crate::nn::ParamSpec;
use crate::Device;

/// Rank 0 of a world of two whose other rank holds `other` in every allreduce and `root` in
/// every broadcast from it; records the collectives called.
struct FakeWorld {
    rank: usize,
    other: Vec<f32>,
    root: Vec<f32>,
    calls: RefCell<Vec<String>>,
}

impl Collective for FakeWorld {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        2
    }
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        self.calls
            .borrow_mut()
            .push(format!("broadcast {}", buf.len()));
        if root != self.rank {
            buf.copy_from_slice(&self.root[..buf.len()]);
        }
        Ok(())
    }
    fn broadcast_bytes(&self, buf: &mut [u8], _root: usize) -> Result<()> {
        self.calls
            .borrow_mut()
            .push(format!("broadcast {} bytes", buf.len()));
        Ok(())
    }
    fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        self.calls
            .borrow_mut()
            .push(format!("allreduce {}", buf.len()));
        assert_eq!(buf.len(), self.other.len(), "the other rank's buffer");
        buf.iter_mut().zip(&self.other).for_each(|(b, o)| *b += o);
        Ok(())
    }
    fn any(&self, flag: bool) -> Result<bool> {
        self.calls.borrow_mut().push("any".into());
        Ok(flag)
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn abort(&self, reason: &str) -> ! {
        panic!("abort: {reason}")
    }
}

fn params(dev: &Device) -> Result<Parameters> {
    Parameters::new(
        dev,
        &[
            ParamSpec {
                name: "w".into(),
                shape: vec![3, 4],
                decay: true,
            },
            ParamSpec {
                name: "b".into(),
                shape: vec![4],
                decay: false,
            },
        ],
    )
}

/// loss = sum(w * c) + sum(b * d) over `params`' w and b, backward run: dw = c, db = d.
/// Returns the loss, c and d.
fn linear_loss(dev: &Device, p: &Parameters) -> Result<(Tensor, Vec<f32>, [f32; 4])> {
    let w = p.get("w").expect("w").clone();
    let b = p.get("b").expect("b").clone();
    let c: Vec<f32> = (0..12).map(|i| 1.0 + i as f32).collect();
    let d = [0.25f32, -0.5, 0.75, -1.0];
    let ct = Tensor::from_slice(dev, &c, &[3, 4])?;
    let dt = Tensor::from_slice(dev, &d, &[4])?;
    let loss = w.mul(&ct)?.sum_all()?.add(&b.mul(&dt)?.sum_all()?)?;
    loss.backward()?;
    Ok((loss, c, d))
}

#[test]
fn gradients_and_loss_are_averaged_over_the_ranks() -> Result<()> {
    let dev = Device::new()?;
    let p = params(&dev)?;
    let w = p.get("w").expect("w").clone();
    let b = p.get("b").expect("b").clone();
    w.copy_from_slice(&(0..12).map(|i| i as f32 * 0.5).collect::<Vec<_>>())?;
    b.copy_from_slice(&[1.0, 2.0, 3.0, 4.0])?;
    let (loss, c, _) = linear_loss(&dev, &p)?;
    let local_loss = loss.detach().to_vec()?[0];

    // The other rank's flat staging: chunk gradients in chunk order, then its loss.
    let layout: Vec<usize> = p.chunks.iter().map(|ch| ch.numel).collect();
    let total: usize = layout.iter().sum();
    let other: Vec<f32> = (0..total).map(|i| 100.0 + i as f32).chain([7.0]).collect();
    let world = Rc::new(FakeWorld {
        rank: 0,
        other: other.clone(),
        root: Vec::new(),
        calls: RefCell::new(Vec::new()),
    });
    let before: Vec<Vec<f32>> = p
        .chunks
        .iter()
        .map(|ch| ch.grad.to_vec())
        .collect::<Result<_>>()?;
    let mut reduction = HostReduction::new(world.clone());
    let mean_loss = reduction.average(&p, &loss.detach())?;
    assert_eq!(*world.calls.borrow(), [format!("allreduce {}", total + 1)]);
    assert_eq!(mean_loss.to_vec()?, [(local_loss + 7.0) * 0.5]);
    let mut at = 0;
    for (chunk, local) in p.chunks.iter().zip(&before) {
        let got = chunk.grad.to_vec()?;
        let want: Vec<f32> = local
            .iter()
            .zip(&other[at..at + chunk.numel])
            .map(|(l, o)| (l + o) * 0.5)
            .collect();
        assert_eq!(got, want, "chunk at {at}");
        at += chunk.numel;
    }
    // The named view sees the averaged values: w (decayed, so first in chunk 0) has
    // (c + the other rank's) / 2.
    let wg = p.read_grad("w")?.expect("w has a gradient");
    let want: Vec<f32> = c.iter().zip(&other).map(|(c, o)| (c + o) * 0.5).collect();
    assert_eq!(wg, want);
    Ok(())
}

#[test]
fn weights_come_from_rank_0_and_disagreement_is_an_error() -> Result<()> {
    let dev = Device::new()?;
    let p = params(&dev)?;
    let total: usize = p.chunks.iter().map(|ch| ch.numel).sum();
    let root: Vec<f32> = (0..total).map(|i| i as f32 - 3.0).collect();
    let follower = FakeWorld {
        rank: 1,
        other: Vec::new(),
        root: root.clone(),
        calls: RefCell::new(Vec::new()),
    };
    broadcast_weights(&follower, &p)?;
    let got: Vec<f32> = p
        .chunks
        .iter()
        .map(|ch| ch.data.to_vec())
        .collect::<Result<Vec<_>>>()?
        .concat();
    assert_eq!(got, root);

    // Rank 0 broadcasts its own fingerprint: the ranks agree.
    let mine = weights_fingerprint(&p)?;
    let pieces: Vec<f32> = (0..4)
        .map(|i| ((mine >> (16 * i)) & 0xffff) as f32)
        .collect();
    let agreeing = FakeWorld {
        rank: 1,
        other: Vec::new(),
        root: pieces.clone(),
        calls: RefCell::new(Vec::new()),
    };
    weights_agree(&agreeing, &p, 3)?;
    // One bit off in rank 0's fingerprint: an error naming the step and both fingerprints.
    let mut off = pieces;
    off[0] = ((mine & 0xffff) ^ 1) as f32;
    let differing = FakeWorld {
        rank: 1,
        other: Vec::new(),
        root: off,
        calls: RefCell::new(Vec::new()),
    };
    let e = weights_agree(&differing, &p, 3).expect_err("the fingerprints differ");
    let text = e.to_string();
    assert!(
        text.contains("rank 1 of 2") && text.contains("after step 3"),
        "{text}"
    );
    Ok(())
}

#[test]
fn a_rank_takes_its_rows_of_the_global_batch() -> Result<()> {
    let global: Vec<u32> = (0..24).collect(); // 4 rows of 6
    assert_eq!(shard_rows(&global, 6, 0, 2)?, &global[..12]);
    assert_eq!(shard_rows(&global, 6, 1, 2)?, &global[12..]);
    let e = shard_rows(&global, 6, 2, 2).expect_err("past the batch");
    assert!(e.to_string().contains("rank 2"), "{e}");
    Ok(())
}

/// What NCCL's reduction does with the gradients (`Reduction::attach`), on a buffer made
/// outside the pool as the exported one is: the backward writes every parameter's gradient
/// into it, and the loss's slot after them takes a copy at a byte offset.
#[test]
fn gradients_moved_into_an_external_buffer_are_written_there() -> Result<()> {
    use crate::graph::{DType, Layout};

    let dev = Device::new()?;
    let mut p = params(&dev)?;
    let numel = p.chunks[0].numel;
    let buffer = dev.gpu().device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test:bucket"),
        size: (numel as u64 + 4) * 4,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bucket = Tensor::from_parts(
        dev.wrap_external(buffer)?,
        Layout::contiguous(&[numel + 4]),
        DType::F32,
    );
    bucket.fill_(-1.0)?;
    p.move_grad(0, bucket.with_layout(Layout::contiguous(&[numel])))?;
    // A gradient of another length is refused, naming the chunk.
    let short = Tensor::zeros(&dev, &[numel - 4])?;
    let e = p.move_grad(0, short).expect_err("too short");
    assert!(e.to_string().contains("chunk 0"), "{e}");

    let (loss, c, d) = linear_loss(&dev, &p)?;
    dev.copy_storage_at((loss.storage(), 0), (bucket.storage(), numel as u64 * 4), 4)?;
    let all = bucket.to_vec()?;
    assert_eq!(p.read_grad("w")?.expect("w's gradient"), c);
    assert_eq!(p.read_grad("b")?.expect("b's gradient"), d);
    // w first (decayed), then b, then padding, then the loss's slot.
    assert_eq!(&all[..12], &c[..]);
    assert_eq!(&all[12..16], &d[..]);
    assert_eq!(all[numel], loss.to_vec()?[0]);
    // A copy past the buffer is an error, not a write elsewhere.
    let e = dev
        .copy_storage_at(
            (loss.storage(), 0),
            (bucket.storage(), (numel as u64 + 4) * 4),
            4,
        )
        .expect_err("past the end");
    assert!(e.to_string().contains("outside"), "{e}");
    Ok(())
}
