//! Shared helpers of the integration tests: one Device per test binary, seeded random inputs,
//! `Arr` (row-major f64 arrays with views and broadcasting, the operands of the CPU f64
//! references), the references themselves (`reference`: one per op), output poisoning,
//! `assert_close`, the loss and gradients of a function of leaves (`loss_grads`), and the
//! workgroup memory a WGSL variant declares.
//!
//! Error metric of `assert_close`: |got - want| / max(|want|, 1), i.e. relative error for
//! values of magnitude 1 or more and absolute error below that. A non-finite `got` passes only
//! when `want` is the same infinity (NaN never passes).

#![allow(dead_code)]

pub mod golden;
pub mod reference;

use std::sync::OnceLock;

use naga::valid::{Capabilities, ValidationFlags, Validator};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use wgrad::kernels::{compose_source, KernelDesc, Spec};
use wgrad::{Device, Options, Result, Tensor};

/// Default tolerance of f32 kernels against the f64 reference.
pub const TOL: f64 = 1e-4;

// The shared Device is used from the test threads at once: it must be Send + Sync.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<Tensor>();
};

static DEVICE: OnceLock<Device> = OnceLock::new();
static TREE_DEVICE: OnceLock<Device> = OnceLock::new();

/// The test binary's shared device (lavapipe on a machine without a GPU).
pub fn dev() -> &'static Device {
    DEVICE.get_or_init(|| Device::new().expect("creating the wgrad Device"))
}

/// A second shared device with subgroup operations turned off: the workgroup-memory
/// reduction fallback.
pub fn tree_dev() -> &'static Device {
    TREE_DEVICE.get_or_init(|| dev_with(|o| o.adapter.disable |= wgrad::wgpu::Features::SUBGROUP))
}

/// A device of its own, for tests that count submits or buffer creations (the shared device
/// sees the other test threads' work).
pub fn private_dev() -> Device {
    Device::new().expect("creating a private wgrad Device")
}

/// A private Device with the environment's options (`Options::from_env`: the adapter it
/// names, say) and `f` applied to them.
pub fn dev_with(f: impl FnOnce(&mut Options)) -> Device {
    let mut options = Options::from_env().expect("the environment's options");
    f(&mut options);
    Device::with_options(&options).expect("creating a private wgrad Device")
}

/// A private Device whose f32 products stay on the tiled f32 kernel (on an adapter with
/// cooperative matrices they would otherwise run as X3 products): for tests of that kernel.
pub fn tiled_dev() -> Device {
    dev_with(|o| o.precision.f32_matmul = wgrad::config::F32Matmul::Tiled)
}

/// A private Device that sums a split product's ranges of K in a second dispatch (as on Metal
/// and DX12), for tests that count that dispatch.
pub fn split_sum_dev() -> Device {
    dev_with(|o| o.kernels.split_in_one_dispatch = Some(false))
}

/// A seeded RNG per test: seed = FNV-1a(tag) ^ $WGRAD_TEST_SEED (0 when unset), so a run is
/// reproducible and another seed gives fresh inputs.
pub fn rng(tag: &str) -> StdRng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tag.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let extra = std::env::var("WGRAD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    StdRng::seed_from_u64(h ^ extra)
}

/// `n` uniform draws in [lo, hi).
pub fn rand_vec(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// Fills the pool's free list of `numel` f32s with NaN buffers, so an op whose output then
/// takes one of them leaves NaN in every element it does not write.
pub fn poison(dev: &Device, numel: usize) {
    if numel == 0 {
        return;
    }
    let junk: Vec<Tensor> = (0..3)
        .map(|_| Tensor::full(dev, &[numel], f32::NAN).expect("poison fill"))
        .collect();
    drop(junk);
}

// ------------------------------------------------------------------------------------------
// Comparison.

/// Fails on a length mismatch, on any non-finite `got` that `want` does not equally have, and
/// when the worst |got - want| / max(|want|, 1) exceeds `tol`; reports the worst element.
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: got {} elements, want {}",
        got.len(),
        want.len()
    );
    let mut worst: Option<(usize, f64)> = None;
    let mut bad = 0usize;
    let mut first_nonfinite: Option<usize> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let err = if !w.is_finite() || !g.is_finite() {
            if g == w {
                0.0 // the same infinity
            } else {
                first_nonfinite.get_or_insert(i);
                f64::INFINITY
            }
        } else {
            (g - w).abs() / w.abs().max(1.0)
        };
        if err > tol {
            bad += 1;
        }
        if worst.is_none_or(|(_, e)| err > e) {
            worst = Some((i, err));
        }
    }
    if let Some((i, err)) = worst {
        if err > tol {
            let nf = first_nonfinite
                .map(|j| {
                    format!(
                        "; first non-finite mismatch at [{j}]: got {}, want {}",
                        got[j], want[j]
                    )
                })
                .unwrap_or_default();
            panic!(
                "{what}: {bad} of {} elements off; worst [{i}]: got {}, want {} (error {err:.3e} > \
                 tol {tol:e}){nf}",
                got.len(),
                got[i],
                want[i]
            );
        }
    }
}

/// Checks the shape of `t`, then its values against `want`.
#[track_caller]
pub fn check(t: &Tensor, want: &Arr, tol: f64, what: &str) {
    assert_eq!(t.shape(), &want.shape[..], "{what}: shape");
    let got = t.to_vec().unwrap_or_else(|e| panic!("{what}: to_vec: {e}"));
    assert_close(&got, &want.data, tol, what);
}

/// `t` against `want` by the relative error of the whole tensor, ||got - want|| / ||want||
/// (Frobenius norms) under `tol`, every element finite: the metric for products whose rounding
/// error grows with the inner dim (an f16 product over K = 3000 reaches 1e-2 elementwise on
/// outputs near 0 while the whole product stays at 3e-4).
pub fn check_rel_norm(t: &Tensor, want: &Arr, tol: f64, what: &str) {
    assert_eq!(t.shape(), &want.shape[..], "{what}: shape");
    let got = t.to_vec().unwrap_or_else(|e| panic!("{what}: to_vec: {e}"));
    if let Some(i) = got.iter().position(|g| !g.is_finite()) {
        panic!("{what}: element {i} is {}", got[i]);
    }
    let diff: f64 = got
        .iter()
        .zip(&want.data)
        .map(|(&g, w)| (g as f64 - w).powi(2))
        .sum();
    let norm: f64 = want.data.iter().map(|w| w * w).sum();
    let rel = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
    assert!(rel < tol, "{what}: relative error {rel:.3e} over {tol:.0e}");
}

/// ||a - b|| / ||b|| (2-norms, in f32): how far a mixed-precision run's gradient is from f32's.
pub fn relative(a: &[f32], b: &[f32]) -> f32 {
    let norm = b.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f32>()
        .sqrt();
    diff / norm
}

// ------------------------------------------------------------------------------------------
// f64 arrays: the operands of the CPU f64 references (`reference`, which adds the ops).

pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Coordinates of row-major linear index `i` in `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d];
        i /= shape[d];
    }
    c
}

/// Numpy broadcasting of two shapes (panics when they do not broadcast).
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Vec<usize> {
    let rank = a.len().max(b.len());
    (0..rank)
        .map(|i| {
            let da = if i + a.len() >= rank {
                a[i + a.len() - rank]
            } else {
                1
            };
            let db = if i + b.len() >= rank {
                b[i + b.len() - rank]
            } else {
                1
            };
            match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => panic!("reference: {a:?} and {b:?} do not broadcast"),
            }
        })
        .collect()
}

/// A row-major f64 array.
#[derive(Clone, Debug, PartialEq)]
pub struct Arr {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Arr {
    pub fn new(shape: &[usize], data: Vec<f64>) -> Arr {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "Arr::new {shape:?}"
        );
        Arr {
            shape: shape.to_vec(),
            data,
        }
    }

    pub fn from_f32(shape: &[usize], data: &[f32]) -> Arr {
        Arr::new(shape, data.iter().map(|&x| x as f64).collect())
    }

    /// Uniform draws in [lo, hi) (drawn as f32, so the GPU sees exactly these values).
    pub fn rand(rng: &mut StdRng, shape: &[usize], lo: f32, hi: f32) -> Arr {
        let n = shape.iter().product();
        Arr::from_f32(shape, &rand_vec(rng, n, lo, hi))
    }

    pub fn full(shape: &[usize], v: f64) -> Arr {
        Arr::new(shape, vec![v; shape.iter().product()])
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn f32s(&self) -> Vec<f32> {
        self.data.iter().map(|&x| x as f32).collect()
    }

    /// The same values in a new f32 tensor.
    pub fn upload(&self, dev: &Device) -> Tensor {
        Tensor::from_slice(dev, &self.f32s(), &self.shape).expect("upload")
    }

    pub fn at(&self, idx: &[usize]) -> f64 {
        let s = contiguous_strides(&self.shape);
        self.data[idx.iter().zip(&s).map(|(i, s)| i * s).sum::<usize>()]
    }

    /// An array of `shape` whose element at coordinates c is `f(c)`.
    pub fn build(shape: &[usize], f: impl Fn(&[usize]) -> f64) -> Arr {
        let n: usize = shape.iter().product();
        Arr::new(shape, (0..n).map(|i| f(&unravel(i, shape))).collect())
    }

    pub fn map(&self, f: impl Fn(f64) -> f64) -> Arr {
        Arr::new(&self.shape, self.data.iter().map(|&x| f(x)).collect())
    }

    pub fn reshape(&self, shape: &[usize]) -> Arr {
        Arr::new(shape, self.data.clone())
    }

    /// Dim i of the result is dim `dims[i]` of self.
    pub fn permute(&self, dims: &[usize]) -> Arr {
        let shape: Vec<usize> = dims.iter().map(|&d| self.shape[d]).collect();
        Arr::build(&shape, |c| {
            let mut src = vec![0; self.rank()];
            for (i, &d) in dims.iter().enumerate() {
                src[d] = c[i];
            }
            self.at(&src)
        })
    }

    pub fn transpose(&self, d0: usize, d1: usize) -> Arr {
        let mut dims: Vec<usize> = (0..self.rank()).collect();
        dims.swap(d0, d1);
        self.permute(&dims)
    }

    /// The last two dims swapped.
    pub fn t(&self) -> Arr {
        let r = self.rank();
        self.transpose(r - 2, r - 1)
    }

    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Arr {
        let mut shape = self.shape.clone();
        shape[dim] = len;
        Arr::build(&shape, |c| {
            let mut src = c.to_vec();
            src[dim] += start;
            self.at(&src)
        })
    }

    pub fn broadcast_to(&self, shape: &[usize]) -> Arr {
        let extra = shape.len() - self.rank();
        Arr::build(shape, |c| {
            let src: Vec<usize> = (0..self.rank())
                .map(|d| if self.shape[d] == 1 { 0 } else { c[d + extra] })
                .collect();
            self.at(&src)
        })
    }

    /// Elementwise `f(a, b)` with numpy broadcasting.
    pub fn zip(&self, other: &Arr, f: impl Fn(f64, f64) -> f64) -> Arr {
        let shape = broadcast_shapes(&self.shape, &other.shape);
        let a = self.broadcast_to(&shape);
        let b = other.broadcast_to(&shape);
        Arr::new(
            &shape,
            a.data.iter().zip(&b.data).map(|(&x, &y)| f(x, y)).collect(),
        )
    }

    /// Folds `dim` with `f` from `init`, then `post(acc, len)`.
    pub fn reduce(
        &self,
        dim: usize,
        keepdim: bool,
        init: f64,
        f: impl Fn(f64, f64) -> f64,
        post: impl Fn(f64, usize) -> f64,
    ) -> Arr {
        let mut shape = self.shape.clone();
        let len = shape[dim];
        shape[dim] = 1;
        let out = Arr::build(&shape, |c| {
            let mut src = c.to_vec();
            let mut acc = init;
            for r in 0..len {
                src[dim] = r;
                acc = f(acc, self.at(&src));
            }
            post(acc, len)
        });
        if keepdim {
            out
        } else {
            shape.remove(dim);
            out.reshape(&shape)
        }
    }
}

/// Tolerance of a fused attention against the unfused reference (both f32):
/// |fused - unfused| / max(|unfused|, 1).
pub const FUSED_VS_UNFUSED: f64 = 1e-4;

/// sum(out * w) and the gradients of the leaves `ins`, from `f` (a fused op or its
/// reference).
pub fn loss_grads(
    ins: &[Tensor],
    w: &Tensor,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
    let o = f(ins)?;
    o.mul(w)?.sum_all()?.backward()?;
    let grads = ins
        .iter()
        .map(|p| p.grad().expect("reached by backward").to_vec())
        .collect::<Result<_>>()?;
    Ok((o.to_vec()?, grads))
}

pub fn as_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Bytes of the `var<workgroup>` arrays in a kernel variant's module, as naga lays them out:
/// (all declared, those its entry point uses).
pub fn workgroup_bytes_in_wgsl(kernel: &KernelDesc, spec: &Spec) -> (u32, u32) {
    let src = compose_source(kernel.family, spec, false);
    let module = naga::front::wgsl::parse_str(&src).expect("parses (see tests/portability.rs)");
    let info = Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module)
        .expect("validates");
    let ep = module
        .entry_points
        .iter()
        .position(|e| e.name == kernel.name)
        .expect("the entry point is in its family");
    let (mut declared, mut used) = (0, 0);
    for (handle, var) in module.global_variables.iter() {
        if var.space == naga::AddressSpace::WorkGroup {
            let size = module.types[var.ty].inner.size(module.to_ctx());
            declared += size;
            if !info.get_entry_point(ep)[handle].is_empty() {
                used += size;
            }
        }
    }
    (declared, used)
}

/// The cooperative-matrix tiles a search may choose on `d` (`x3`: for X3 products, f32 operands
/// as high and low f16 parts), as tile choices; none without cooperative matrices.
pub fn coop_search_tiles(d: &Device, x3: bool) -> Vec<wgrad::kernels::tuning::TileChoice> {
    use wgrad::kernels::matmul_coop::{Coop, SEARCH_TILES};
    let limit = d.gpu().limits.max_compute_workgroup_storage_size;
    match Coop::available(d.gpu()) {
        Some(coop) => SEARCH_TILES
            .iter()
            .filter(|t| t.valid(coop, limit, x3))
            .map(|t| wgrad::kernels::tuning::TileChoice::Coop(*t))
            .collect(),
        None => Vec::new(),
    }
}

/// A scratch directory under the system's temporary directory, removed when dropped.
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("wgrad-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        Scratch(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The names of the entries in `dir`, sorted.
pub fn file_names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("listing")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Seeded ids (B, T + 1) below `vocab` cut into inputs (B, T) and next-token targets (B, T).
pub fn next_token_batch(dev: &Device, b: usize, t: usize, vocab: u32) -> Result<(Tensor, Tensor)> {
    let ids: Vec<u32> = (0..b * (t + 1))
        .map(|i| (i as u32 * 7919 + 13) % vocab)
        .collect();
    let x: Vec<u32> = (0..b)
        .flat_map(|r| ids[r * (t + 1)..r * (t + 1) + t].to_vec())
        .collect();
    let y: Vec<u32> = (0..b)
        .flat_map(|r| ids[r * (t + 1) + 1..(r + 1) * (t + 1)].to_vec())
        .collect();
    Ok((
        Tensor::from_u32(dev, &x, &[b, t])?,
        Tensor::from_u32(dev, &y, &[b, t])?,
    ))
}
