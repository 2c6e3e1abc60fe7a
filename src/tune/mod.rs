//! Tile search for matmul products: every tile the product's kernel can run here multiplies
//! fresh random operands laid out as the product's key says, timed on the GPU; then, for a
//! product that may split K, the `SPLIT_TILES` fastest tiles in each of `SPLITS` numbers of K ranges (how
//! many workgroups fill the GPU in whole waves is measured, not known); the fastest goes into
//! the device's tile table (`Device::set_tile`), which `save_tiles` writes to the
//! adapter's cache file for later runs; `in_step` then checks the winners inside the step.
//! Searches measure; nothing here asserts on timing.

pub mod in_step;

use std::path::PathBuf;

use crate::error::Result;
use crate::graph::{DType, Device, Tensor};
use crate::kernels::tuning::{ProductKey, TileChoice};
use crate::ops::matmul::max_splits;
use crate::ops::matmul::Epilogue;
use crate::ops::{autocast, candidate_tiles, heuristic_tile, Out};
use crate::profile::timed::{gpu_ms, warm_up};

/// The numbers of K ranges a search tries on a product that may split K (each range at least
/// `SEARCH_MIN_K` long): every count to 16, then 20, 24 and 32. Which count fills the GPU in
/// whole waves depends on its cores and on how many workgroups of the tile share one, which
/// wgpu does not say: on an H100 (132 cores, two 128x128 tiles a core) the 4 x 128 LM head's
/// dX (6 x 4 tiles) ran 276 us in 11 ranges (264 workgroups: one wave), 345 in 16 and 435 in 12
/// (2026-11-26); 11 was not among the counts tried before.
pub const SPLITS: [u32; 19] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 24, 32,
];

/// The shortest range of K a search times: half the heuristic's `SPLIT_MIN_K`, so that a
/// 512-row dW product may split in 3 or 4 (H200, 2026-11-25: the 4 x 128 step searched again
/// with 128 and 16 ranges at most chose 3 for the attention projection's dW and 16 for the LM
/// head's dX; its GPU work 5.01 -> 4.96 ms).
pub const SEARCH_MIN_K: usize = 128;

/// Milliseconds of arithmetic a step's search runs before its first product.
const FIRST_WARM_MS: f64 = 500.0;

/// How many of the fastest whole-K tiles a search tries in `SPLITS` ranges.
pub const SPLIT_TILES: usize = 3;

/// One configuration's time on a product.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    pub tile: TileChoice,
    /// K ranges, where the search set them (None: the launcher's rule).
    pub split: Option<u32>,
    /// Median milliseconds per product.
    pub ms: f64,
}

impl Measured {
    /// `coop 2x2/4x4/32`, with ` split 4` where the search set the K ranges.
    pub fn name(&self) -> String {
        match self.split {
            Some(s) => format!("{} split {s}", self.tile.name()),
            None => self.tile.name(),
        }
    }
}

/// What a search measured for one product.
pub struct Search {
    pub key: ProductKey,
    /// The tile the heuristics would have chosen.
    pub default: TileChoice,
    /// Every candidate, in the order measured.
    pub measured: Vec<Measured>,
}

fn best_of(measured: &[Measured]) -> Measured {
    *measured
        .iter()
        .min_by(|a, b| a.ms.total_cmp(&b.ms))
        .expect("a search measures one tile at least")
}

impl Search {
    pub fn best(&self) -> Measured {
        best_of(&self.measured)
    }

    /// The default tile's time (with the launcher's K ranges), when it was among the
    /// candidates.
    pub fn default_ms(&self) -> Option<f64> {
        self.measured
            .iter()
            .find(|m| m.tile == self.default && m.split.is_none())
            .map(|m| m.ms)
    }
}

/// Random operands for `key`: A (batch, M, K) and B (batch, K, N) in their storage types,
/// transposed views where the key says so; where the key is `aligned`, rows padded to 8
/// elements (views of wider buffers), as a training step pads the LM head's 50,257-wide rows.
pub fn operands(device: &Device, key: &ProductKey) -> Result<(Tensor, Tensor)> {
    let (m, n, k, batch) = (
        key.m as usize,
        key.n as usize,
        key.k as usize,
        key.batch as usize,
    );
    let make = |rows: usize, cols: usize, t: bool, f16: bool, seed: u64| -> Result<Tensor> {
        let (outer, inner) = if t { (cols, rows) } else { (rows, cols) };
        let x = Tensor::rand_uniform(
            device,
            &[batch, outer, row_length(key, inner)],
            -1.0,
            1.0,
            seed,
        )?;
        let x = if f16 { x.to_dtype(DType::F16)? } else { x };
        let x = x.narrow(-1, 0, inner)?;
        if t {
            x.t()
        } else {
            Ok(x)
        }
    };
    Ok((
        make(m, k, key.a_t, key.a_f16, 1)?,
        make(k, n, key.b_t, key.b_f16, 2)?,
    ))
}

/// The row length (elements) of an operand or output whose rows hold `inner`: rounded up to
/// 8 where the key is `aligned`.
fn row_length(key: &ProductKey, inner: usize) -> usize {
    if key.aligned {
        inner.next_multiple_of(8)
    } else {
        inner
    }
}

/// Median GPU milliseconds of `a @ b` as `key` says: under autocast when `half`; plus a bias,
/// a bias and a residual, or a bias and GELU into an output of the autocast type (f16 under
/// autocast), as `linear` records them; into rows padded as `operands` pads them; over `reps`
/// products after untimed ones that compile the pipelines and bring the GPU's clocks up
/// (`profile::timed::gpu_ms`: the split-K sum, where there is one, included).
pub fn time_product(
    device: &Device,
    a: &Tensor,
    b: &Tensor,
    key: &ProductKey,
    reps: usize,
) -> Result<f64> {
    let half = key.half;
    let n = b.shape()[b.rank() - 1];
    let mut shape = a.shape().to_vec();
    *shape.last_mut().expect("an operand of rank 2 or more") = n;
    let out_dtype = if key.gelu && half {
        DType::F16
    } else {
        DType::F32
    };
    // Padded output rows where the key says so and N is not a multiple of 8 (not for a
    // residual, which goes into a contiguous output).
    let padded = match row_length(key, n) {
        len if len > n && !key.residual => {
            let mut wide = shape.clone();
            *wide.last_mut().expect("rank 2 or more") = len;
            Some(Tensor::uninit(device, &wide, out_dtype, "tune")?.narrow(-1, 0, n)?)
        }
        _ => None,
    };
    let out = || match &padded {
        Some(t) => Out::Write(t),
        None => Out::New,
    };
    let bias = if key.bias {
        Some(Tensor::rand_uniform(device, &[n], -1.0, 1.0, 3)?)
    } else {
        None
    };
    let pre = if key.gelu {
        Some(Tensor::zeros(device, &shape)?)
    } else {
        None
    };
    let residual = if key.residual {
        Some(Tensor::rand_uniform(device, &shape, -1.0, 1.0, 4)?)
    } else {
        None
    };
    gpu_ms(device, reps, || {
        autocast(half, || {
            let epilogue = match (&bias, &pre, &residual) {
                (Some(bias), Some(pre), _) => Epilogue::BiasGelu { bias, pre },
                (Some(bias), None, Some(residual)) => Epilogue::BiasResidual { bias, residual },
                (Some(bias), None, None) => Epilogue::Bias(bias),
                _ => Epilogue::None,
            };
            a.matmul_epilogue_into(b, epilogue, out(), out_dtype)
        })
    })
}

/// Measures every candidate tile of `key`, records the fastest in the device's table, and
/// returns what it measured.
pub fn search(device: &Device, key: &ProductKey, reps: usize) -> Result<Search> {
    let (a, b) = operands(device, key)?;
    let time = |tile: TileChoice, split: Option<u32>| -> Result<Measured> {
        device.force_tile(Some(tile));
        device.force_split(split);
        if device.options().lab.timing_trace() {
            eprintln!("timing: {key:?} {} split {split:?}", tile.name());
        }
        let ms = time_product(device, &a, &b, key, reps);
        device.force_tile(None);
        device.force_split(None);
        Ok(Measured {
            tile,
            split,
            ms: ms?,
        })
    };
    let mut measured = candidate_tiles(device, key)
        .into_iter()
        .map(|tile| time(tile, None))
        .collect::<Result<Vec<_>>>()?;
    // Plain and bias products of batch 1 may split K (a GELU product may not): the
    // `SPLIT_TILES` fastest tiles in each number of ranges (each at least SEARCH_MIN_K long,
    // their partial products within one storage binding). The tile that wins whole may lose
    // split: the LM head's dX (4096 x 768 x 50257, H200) ran 2.29 ms on the fastest whole tile
    // in 4 ranges, 2.02 on another in 8.
    if !key.gelu && key.batch == 1 {
        let mut whole = measured.clone();
        whole.sort_by(|a, b| a.ms.total_cmp(&b.ms));
        let most = max_splits(device, key.m as usize, key.n as usize);
        for tile in whole.iter().take(SPLIT_TILES).map(|m| m.tile) {
            for split in SPLITS {
                let long = key.k as usize / split as usize >= SEARCH_MIN_K;
                if split == 1 || (long && split as usize <= most) {
                    measured.push(time(tile, Some(split))?);
                }
            }
        }
    }
    let search = Search {
        key: *key,
        default: heuristic_tile(device, key),
        measured,
    };
    let best = search.best();
    device.set_tile(*key, best.tile, best.split, best.ms);
    Ok(search)
}

/// Writes the device's tile table to the adapter's cache file (written whole, then renamed);
/// returns the path, or None where no cache directory can be named.
pub fn save_tiles(device: &Device) -> Result<Option<PathBuf>> {
    let Some(path) = device.tile_cache_file() else {
        return Ok(None);
    };
    crate::model::atomic::write_file(&path, device.tile_table_json().as_bytes())?;
    Ok(Some(path))
}

/// Searches every distinct product that one call of `step` records (a training step, say), in
/// the order first recorded; the winners go into the device's table.
pub fn search_step(
    device: &Device,
    reps: usize,
    step: impl FnOnce() -> Result<()>,
) -> Result<Vec<Search>> {
    device.log_products(true);
    let ran = step().and_then(|_| device.sync());
    let keys = device.take_product_log();
    device.log_products(false);
    ran?;
    // The step compiled its pipelines with the GPU idle: an H200's first product searched
    // after it read 0.48 ms where the step runs it in 0.17 (2026-11-23), with each timing's
    // own 30 ms of warm-up; half a second of arithmetic brings the clocks up first.
    if !keys.is_empty() {
        warm_up(device, FIRST_WARM_MS)?;
    }
    keys.iter().map(|key| search(device, key, reps)).collect()
}
