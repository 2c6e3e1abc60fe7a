//! Parameters laid out in flat chunks: every parameter is a view into one chunk's data buffer
//! and its gradient a view into the chunk's gradient buffer, so one optimizer dispatch updates
//! a whole chunk. Decayed parameters come first in a chunk (AdamW's no-decay set is a suffix);
//! offsets are multiples of 4 elements (the vec4 kernel paths stay available). A chunk holds at
//! most the adapter's max storage binding.
//!
//! A parameter of rank 2 or more that is over the binding limit itself (GPT-2's 50257 x 768
//! token embedding, 154 MB, on an adapter with 128 MiB bindings) is split by rows into as few
//! shards as fit, each a parameter of its own named `{name}.shard{i}`, in chunks as the others
//! are; `shards(name)` lists them with their first rows, and `read`, `read_grad`, `write` see
//! the parameter whole. Under the limit a parameter is one tensor under its own name.
//!
//! For mixed precision (`enable_half`), each chunk's decayed prefix (the matmul weights and the
//! embeddings) also gets an f16 copy that the optimizer kernel rewrites with every update, so
//! the matmuls read f16 weights with no cast kernel in the step. A parameter's f16 copy is a
//! view into it that stands for the f32 parameter in the graph: its gradient lands in the f32
//! gradient.

use crate::autograd::alias_for_grad;
use crate::error::{Error, Result};
use crate::graph::{DType, Device, Tensor};

/// A parameter to allocate.
#[derive(Clone, Debug)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// Whether AdamW's weight decay applies (not to biases and LayerNorm weights).
    pub decay: bool,
}

/// One flat chunk: data and gradient buffers; `n_decay` elements of decayed parameters first.
pub(crate) struct Chunk {
    pub data: Tensor,
    pub grad: Tensor,
    pub numel: usize,
    pub n_decay: usize,
    /// f16 copy of `data[..n_decay]` (mixed precision only; 4 unused elements when n_decay
    /// is 0).
    pub half: Option<Tensor>,
}

/// One stored tensor: a whole parameter, or one row shard of it.
struct Param {
    name: String,
    tensor: Tensor,
    chunk: usize,
    offset: usize,
    /// The f16 copy standing for `tensor` (mixed precision, decayed parameters only).
    half: Option<Tensor>,
}

/// A parameter as its spec declares it, stored as one tensor or as row shards.
struct Logical {
    spec: ParamSpec,
    /// (index into `Parameters::params`, first row) of each shard, in row order.
    shards: Vec<(usize, usize)>,
}

/// One row shard of a parameter (the whole parameter when it is not split).
#[derive(Clone, Copy)]
pub struct RowShard<'a> {
    /// The stored tensor's name: the parameter's own, or `{name}.shard{i}`.
    pub name: &'a str,
    /// The parameter's row that is the shard's row 0.
    pub first_row: usize,
    pub tensor: &'a Tensor,
}

pub struct Parameters {
    device: Device,
    pub(crate) chunks: Vec<Chunk>,
    params: Vec<Param>,
    logical: Vec<Logical>,
}

/// The name of shard `i` of parameter `name`.
pub fn shard_name(name: &str, i: usize) -> String {
    format!("{name}.shard{i}")
}

/// Rows per shard of a (rows, cols) parameter whose shards hold at most `capacity` elements
/// each: `rows` when it fits whole; else as few equal shards as fit (the last one shorter);
/// None when one row is over `capacity`.
fn rows_per_shard(rows: usize, cols: usize, capacity: usize) -> Option<usize> {
    if cols > capacity {
        return None;
    }
    let numel = rows * cols;
    let mut n = numel.div_ceil(capacity).max(1);
    while rows.div_ceil(n) * cols > capacity {
        n += 1;
    }
    Some(rows.div_ceil(n).max(1))
}

/// Parameter offsets are multiples of this many elements (16 bytes: vec4 loads).
const ALIGN: usize = 4;

impl Parameters {
    /// Allocates every parameter (zero-filled), requiring gradients; a parameter of rank 2 or
    /// more over the binding limit is split by rows (see the module doc).
    pub fn new(device: &Device, specs: &[ParamSpec]) -> Result<Parameters> {
        let limit = device.gpu().limits.max_storage_buffer_binding_size;
        let capacity = limit as usize / 4 - (limit as usize / 4) % ALIGN;
        let too_large = |what: String, numel: usize| Error::BindingTooLarge {
            what,
            bytes: numel as u64 * 4,
            limit,
        };
        // The stored tensors: each spec whole, or its row shards.
        let mut stored: Vec<ParamSpec> = Vec::new();
        let mut logical = Vec::new();
        for spec in specs {
            let numel: usize = spec.shape.iter().product();
            let described = || format!("parameter `{}` of shape {:?}", spec.name, spec.shape);
            let mut shards = Vec::new();
            if numel <= capacity {
                shards.push((stored.len(), 0));
                stored.push(spec.clone());
            } else if spec.shape.len() < 2 {
                return Err(too_large(described(), numel));
            } else {
                let rows = spec.shape[0];
                let cols = numel / rows;
                let Some(per) = rows_per_shard(rows, cols, capacity) else {
                    return Err(too_large(
                        format!("one row of {} (split by rows to fit)", described()),
                        cols,
                    ));
                };
                for (i, first) in (0..rows).step_by(per).enumerate() {
                    let mut shape = spec.shape.clone();
                    shape[0] = per.min(rows - first);
                    shards.push((stored.len(), first));
                    stored.push(ParamSpec {
                        name: shard_name(&spec.name, i),
                        shape,
                        decay: spec.decay,
                    });
                }
            }
            logical.push(Logical {
                spec: spec.clone(),
                shards,
            });
        }
        // Decayed first, each group in the given order.
        let mut order: Vec<usize> = (0..stored.len()).collect();
        order.sort_by_key(|&i| !stored[i].decay);
        let mut placed = vec![(0usize, 0usize); stored.len()]; // (chunk, offset)
        let mut sizes: Vec<(usize, usize)> = vec![(0, 0)]; // (numel, n_decay) per chunk
        for &i in &order {
            let spec = &stored[i];
            let numel: usize = spec.shape.iter().product();
            let (mut used, _) = *sizes.last().expect("one chunk at least");
            if used + numel > capacity {
                sizes.push((0, 0));
                used = 0;
            }
            let chunk = sizes.len() - 1;
            placed[i] = (chunk, used);
            let end = (used + numel).next_multiple_of(ALIGN);
            sizes[chunk].0 = end;
            if spec.decay {
                sizes[chunk].1 = end;
            }
        }
        let mut chunks = Vec::new();
        for &(numel, n_decay) in &sizes {
            let numel = numel.max(ALIGN);
            chunks.push(Chunk {
                data: Tensor::zeros(device, &[numel])?,
                grad: Tensor::zeros(device, &[numel])?,
                numel,
                n_decay,
                half: None,
            });
        }
        let mut params = Vec::new();
        for (spec, &(c, off)) in stored.iter().zip(&placed) {
            let numel: usize = spec.shape.iter().product();
            let chunk = &chunks[c];
            let tensor = chunk
                .data
                .narrow(0, off, numel)?
                .reshape(&spec.shape)?
                .requires_grad();
            tensor.set_grad_buffer(chunk.grad.narrow(0, off, numel)?.reshape(&spec.shape)?);
            params.push(Param {
                name: spec.name.clone(),
                tensor,
                chunk: c,
                offset: off,
                half: None,
            });
        }
        Ok(Parameters {
            device: device.clone(),
            chunks,
            params,
            logical,
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The stored tensor named `name`: a parameter under the limit, or one row shard
    /// (`{name}.shard{i}`) of a split one.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.tensor)
    }

    /// (name, tensor) of every stored tensor in the order the specs were given, a split
    /// parameter as its shards.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.params.iter().map(|p| (p.name.as_str(), &p.tensor))
    }

    /// The parameters as their specs declared them (whole shapes), in order.
    pub fn specs(&self) -> impl Iterator<Item = &ParamSpec> {
        self.logical.iter().map(|l| &l.spec)
    }

    /// The row shards of parameter `name` in row order (one, itself, when it is not split).
    pub fn shards(&self, name: &str) -> Option<Vec<RowShard<'_>>> {
        let l = self.logical.iter().find(|l| l.spec.name == name)?;
        Some(
            l.shards
                .iter()
                .map(|&(i, first_row)| RowShard {
                    name: &self.params[i].name,
                    first_row,
                    tensor: &self.params[i].tensor,
                })
                .collect(),
        )
    }

    fn logical(&self, op: &'static str, name: &str) -> Result<Vec<RowShard<'_>>> {
        self.shards(name).ok_or_else(|| Error::InvalidArgument {
            op,
            reason: format!("no parameter `{name}`"),
        })
    }

    /// The values of parameter `name`, whole (its shards' concatenated), read back.
    pub fn read(&self, name: &str) -> Result<Vec<f32>> {
        let mut v = Vec::new();
        for s in self.logical("Parameters::read", name)? {
            v.extend(s.tensor.to_vec()?);
        }
        Ok(v)
    }

    /// The gradient of parameter `name`, whole, read back; None when backward wrote none
    /// since `zero_grad` (a split parameter: into none of its shards; a shard left out reads 0).
    pub fn read_grad(&self, name: &str) -> Result<Option<Vec<f32>>> {
        let shards = self.logical("Parameters::read_grad", name)?;
        if shards.iter().all(|s| s.tensor.grad().is_none()) {
            return Ok(None);
        }
        let mut v = Vec::new();
        for s in shards {
            match s.tensor.grad() {
                Some(g) => v.extend(g.to_vec()?),
                None => v.extend(std::iter::repeat_n(0.0, s.tensor.numel())),
            }
        }
        Ok(Some(v))
    }

    /// Uploads `data` (the whole parameter, row-major) into parameter `name`'s shards.
    pub fn write(&self, name: &str, data: &[f32]) -> Result<()> {
        let shards = self.logical("Parameters::write", name)?;
        let numel: usize = shards.iter().map(|s| s.tensor.numel()).sum();
        if data.len() != numel {
            let shape = self
                .specs()
                .find(|s| s.name == name)
                .map(|s| s.shape.clone());
            return Err(Error::ElementCount {
                op: "Parameters::write",
                shape: shape.unwrap_or_default(),
                expected: numel,
                got: data.len(),
            });
        }
        let mut start = 0;
        for s in shards {
            let n = s.tensor.numel();
            s.tensor.copy_from_slice(&data[start..start + n])?;
            start += n;
        }
        Ok(())
    }

    /// Gives every decayed parameter an f16 copy (see the module doc), filled from the f32
    /// values now; nothing when already on.
    pub fn enable_half(&mut self) -> Result<()> {
        if self.chunks.iter().any(|c| c.half.is_some()) {
            return Ok(());
        }
        for c in &mut self.chunks {
            // A chunk without decayed parameters gets a token copy: the update kernel binds one.
            let numel = c.n_decay.max(ALIGN);
            c.half = Some(Tensor::uninit(
                &self.device,
                &[numel],
                DType::F16,
                "params",
            )?);
        }
        for p in &mut self.params {
            let numel = p.tensor.numel();
            let chunk = &self.chunks[p.chunk];
            if let Some(half) = chunk.half.as_ref().filter(|_| p.offset < chunk.n_decay) {
                let view = half.narrow(0, p.offset, numel)?.reshape(p.tensor.shape())?;
                p.half = Some(alias_for_grad(&p.tensor, view)?);
            }
        }
        self.refresh_half()
    }

    /// Rewrites the f16 copies from the f32 values (after weights were loaded or restored;
    /// the optimizer keeps them current otherwise). One cast dispatch per chunk.
    pub fn refresh_half(&self) -> Result<()> {
        for c in &self.chunks {
            if let Some(half) = &c.half {
                let n = c.n_decay;
                c.data.narrow(0, 0, n)?.cast_into(&half.narrow(0, 0, n)?)?;
            }
        }
        Ok(())
    }

    /// The f16 copy of parameter `name`, when mixed precision is on and it has one.
    pub fn half(&self, name: &str) -> Option<&Tensor> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.half.as_ref())
    }

    pub fn len(&self) -> usize {
        self.params.len()
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Elements over all parameters.
    pub fn numel(&self) -> usize {
        self.params.iter().map(|p| p.tensor.numel()).sum()
    }

    /// The NaN and infinite elements of each parameter, counted on the GPU (a
    /// `count_nonfinite` dispatch per stored tensor, one read-back for all): (name, count) of
    /// every parameter that has some, in the specs' order.
    pub fn count_nonfinite(&self) -> Result<Vec<(String, u64)>> {
        let counts = Tensor::from_u32(
            &self.device,
            &vec![0; self.params.len()],
            &[self.params.len()],
        )?;
        for (slot, p) in self.params.iter().enumerate() {
            crate::kernels::count_nonfinite::record(&self.device, &counts, slot, &p.tensor)?;
        }
        let counts = counts.to_vec_u32()?;
        Ok(self
            .logical
            .iter()
            .map(|l| {
                let n = l.shards.iter().map(|&(i, _)| counts[i] as u64).sum();
                (l.spec.name.clone(), n)
            })
            .filter(|&(_, n)| n > 0)
            .collect())
    }

    /// An error naming the first parameter that holds a NaN or an infinity (and how many), read
    /// from `source` (a file, for the message); Ok when every element is finite.
    pub fn check_finite(&self, source: &str) -> Result<()> {
        let bad = self.count_nonfinite()?;
        let Some((tensor, count)) = bad.first().cloned() else {
            return Ok(());
        };
        let others = match bad.len() - 1 {
            0 => String::new(),
            1 => ", and 1 more tensor has some".into(),
            n => format!(", and {n} more tensors have some"),
        };
        Err(Error::NonFinite {
            path: source.to_string(),
            tensor,
            count,
            others,
        })
    }

    /// Moves chunk `c`'s gradient into `grad` (f32, contiguous, the chunk's length, on this
    /// device: a data-parallel run's exported bucket, `dist::nccl`). Every parameter of the
    /// chunk writes its gradient there from now on; all of them are marked zero.
    pub fn move_grad(&mut self, c: usize, grad: Tensor) -> Result<()> {
        let numel = self.chunks.get(c).map(|ch| ch.numel);
        if numel != Some(grad.numel())
            || grad.dtype() != DType::F32
            || !grad.is_contiguous()
            || grad.rank() != 1
        {
            return Err(Error::InvalidArgument {
                op: "Parameters::move_grad",
                reason: format!(
                    "chunk {c} of {} needs a contiguous f32 gradient of {numel:?} elements, got \
                     {:?} {:?}",
                    self.chunks.len(),
                    grad.dtype(),
                    grad.shape()
                ),
            });
        }
        for p in self.params.iter().filter(|p| p.chunk == c) {
            let numel = p.tensor.numel();
            let view = grad.narrow(0, p.offset, numel)?.reshape(p.tensor.shape())?;
            p.tensor.set_grad_buffer(view);
        }
        self.chunks[c].grad = grad;
        Ok(())
    }

    /// Marks every gradient zero (no dispatch: the next backward overwrites).
    pub fn zero_grad(&self) {
        for p in &self.params {
            p.tensor.zero_grad();
        }
    }

    /// Zero-fills the gradients no backward wrote since `zero_grad`, so an optimizer reading the
    /// flat chunks sees zeros there (one dispatch per such parameter; none in a usual step).
    pub(crate) fn zero_unwritten_grads(&self) -> Result<()> {
        for p in &self.params {
            if p.tensor.grad_is_stale() {
                let chunk_grad = p
                    .tensor
                    .grad_buffer()
                    .expect("parameters are given grad buffers at creation");
                chunk_grad.fill_(0.0)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::rows_per_shard;

    #[test]
    fn rows_per_shard_takes_as_few_shards_as_fit() {
        // DistilGPT-2's wte under lavapipe's 128 MiB (2^25 f32): 2 shards of 25129 rows.
        assert_eq!(rows_per_shard(50257, 768, 1 << 25), Some(25129));
        // Under 2 GiB: whole.
        assert_eq!(rows_per_shard(50257, 768, 1 << 29), Some(50257));
        // 10 x 60 in 256-element shards: 3 shards of 4 rows (240 elements) fit. 10 x 70: 3
        // shards of 4 rows (280) do not, 4 shards of 3 rows (210) do.
        assert_eq!(rows_per_shard(10, 60, 256), Some(4));
        assert_eq!(rows_per_shard(10, 70, 256), Some(3));
        // One row over the capacity cannot be split by rows.
        assert_eq!(rows_per_shard(3, 300, 256), None);
        for (rows, cols, cap) in [(50257, 128, 2_621_440), (97, 33, 100), (1, 5, 5)] {
            let per = rows_per_shard(rows, cols, cap).expect("a row fits");
            assert!(per * cols <= cap, "{rows} x {cols} in {cap}: {per} rows");
            // No fewer shards would fit.
            let n = rows.div_ceil(per);
            assert!(n == 1 || rows.div_ceil(n - 1) * cols > cap);
        }
    }
}
