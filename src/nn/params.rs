//! Parameters laid out in flat chunks: every parameter is a view into one chunk's data buffer
//! and its gradient a view into the chunk's gradient buffer, so one optimizer dispatch updates
//! a whole chunk. Decayed parameters come first in a chunk (AdamW's no-decay set is a suffix);
//! offsets are multiples of 4 elements (the vec4 kernel paths stay available). A chunk holds at
//! most the adapter's max storage binding.
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

struct Param {
    name: String,
    tensor: Tensor,
    chunk: usize,
    offset: usize,
    /// The f16 copy standing for `tensor` (mixed precision, decayed parameters only).
    half: Option<Tensor>,
}

pub struct Parameters {
    device: Device,
    pub(crate) chunks: Vec<Chunk>,
    params: Vec<Param>,
}

/// Parameter offsets are multiples of this many elements (16 bytes: vec4 loads).
const ALIGN: usize = 4;

impl Parameters {
    /// Allocates every parameter (zero-filled), requiring gradients.
    pub fn new(device: &Device, specs: &[ParamSpec]) -> Result<Parameters> {
        let limit = device.gpu().limits.max_storage_buffer_binding_size as usize / 4;
        let capacity = limit - limit % ALIGN;
        // Decayed first, each group in the given order.
        let mut order: Vec<usize> = (0..specs.len()).collect();
        order.sort_by_key(|&i| !specs[i].decay);
        let mut placed = vec![(0usize, 0usize); specs.len()]; // (chunk, offset)
        let mut sizes: Vec<(usize, usize)> = vec![(0, 0)]; // (numel, n_decay) per chunk
        for &i in &order {
            let numel: usize = specs[i].shape.iter().product();
            if numel > capacity {
                return Err(Error::BindingTooLarge {
                    what: format!(
                        "parameter `{}` of shape {:?}",
                        specs[i].name, specs[i].shape
                    ),
                    bytes: numel as u64 * 4,
                    limit: device.gpu().limits.max_storage_buffer_binding_size,
                });
            }
            let (mut used, _) = *sizes.last().expect("one chunk at least");
            if used + numel > capacity {
                sizes.push((0, 0));
                used = 0;
            }
            let chunk = sizes.len() - 1;
            placed[i] = (chunk, used);
            let end = (used + numel).next_multiple_of(ALIGN);
            sizes[chunk].0 = end;
            if specs[i].decay {
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
        for (spec, &(c, off)) in specs.iter().zip(&placed) {
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
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The parameter named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.tensor)
    }

    /// (name, tensor) in the order the specs were given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.params.iter().map(|p| (p.name.as_str(), &p.tensor))
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
