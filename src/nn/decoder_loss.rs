//! The decoder's training loss: the LM head and cross-entropy, fused where the logits fit one
//! storage binding and by chunks of rows where they do not.

use crate::config::Float;
use crate::error::{Error, Result};
use crate::graph::{DType, Device, Tensor};
use crate::nn::decoder::{Decoder, Kernels};

/// The training loss's logit rows start this many elements apart (GPT-2's 50,257 classes in
/// rows of 50,304): the LM head's product then stores whole rows straight from its
/// accumulators, and the backward products read the logits' gradient in aligned vectors.
const LOGIT_ROW_ALIGN: usize = 64;

/// The training loss's logits under mixed precision where the LM head is one product: f16,
/// as PyTorch's autocast makes them (bf16 there; cross-entropy then sums in f32, as here), on
/// `device`, unless its `Precision::logits` keeps them f32. Half the bytes the LM head stores
/// and cross-entropy's two passes read.
fn logits_dtype(device: &Device) -> DType {
    match device.options().precision.logits {
        Float::F16 => DType::F16,
        Float::F32 => DType::F32,
    }
}

impl Decoder {
    /// Mean next-token cross-entropy of `ids` (B, T) against `targets` (B, T).
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
        if self.kernels == Kernels::Fused && ids.rank() == 2 {
            let per_chunk = self.logit_rows_per_binding();
            return crate::ops::autocast(self.amp, || self.fused_loss(ids, targets, per_chunk));
        }
        let logits = self.forward(ids)?;
        match self.kernels {
            Kernels::Fused => logits.cross_entropy(targets, None),
            Kernels::Reference => logits.cross_entropy_unfused(targets, None),
        }
    }

    /// Rows of logits (V f32 each, padded to `LOGIT_ROW_ALIGN`) that fit one storage binding.
    fn logit_rows_per_binding(&self) -> usize {
        let limit = self
            .params
            .device()
            .gpu()
            .limits
            .max_storage_buffer_binding_size as usize;
        (limit / (4 * self.config.vocab_size.next_multiple_of(LOGIT_ROW_ALIGN))).max(1)
    }

    /// The loss of `loss` with the fused kernels: the LM head's logits (B*T, V) in rows padded
    /// to `LOGIT_ROW_ALIGN` and cross-entropy on them. With --amp the logits and their gradient
    /// are f16 (the LM head's backward products round the gradient to f16 anyway). When the
    /// logits are over one storage binding, the LM head and cross-entropy run over chunks of
    /// `per_chunk` token rows, each chunk's mean weighted by its share of the rows (the same
    /// mean; the logits live in one buffer per chunk).
    fn fused_loss(&self, ids: &Tensor, targets: &Tensor, per_chunk: usize) -> Result<Tensor> {
        let n = ids.numel();
        let hidden = self.forward_hidden(ids)?;
        let c = hidden.shape()[2];
        let hidden = hidden.reshape(&[n, c])?; // (B*T, C)
        let single = self.head_shards()?.len() == 1;
        // f16 gradients where the LM head is one matmul under autocast.
        let grad_dtype = if self.amp && single {
            DType::F16
        } else {
            DType::F32
        };
        // The logits themselves f16 there too (`logits_dtype`).
        let logits_dtype = if self.amp && single {
            logits_dtype(hidden.device())
        } else {
            DType::F32
        };
        if n <= per_chunk {
            let logits = self.loss_logits(&hidden, logits_dtype)?; // (B*T, V)
            return logits.cross_entropy_grad_as(&targets.reshape(&[n])?, None, grad_dtype);
        }
        let host = targets
            .host_u32()
            .filter(|h| h.len() == n && targets.is_contiguous())
            .ok_or_else(|| Error::InvalidArgument {
                op: "model loss",
                reason: "targets need the host copy Tensor::from_u32 keeps (the loss splits them \
                         with the logits, which are over one storage binding)"
                    .into(),
            })?
            .clone();
        let device = self.params.device();
        let mut total: Option<Tensor> = None;
        for r0 in (0..n).step_by(per_chunk) {
            let rows = per_chunk.min(n - r0);
            let logits = self.loss_logits(&hidden.narrow(0, r0, rows)?, logits_dtype)?; // (rows, V)
            let t = Tensor::from_u32(device, &host[r0..r0 + rows], &[rows])?;
            let part = logits
                .cross_entropy_grad_as(&t, None, grad_dtype)?
                .mul_scalar(rows as f32 / n as f32)?;
            total = Some(match total {
                None => part,
                Some(sum) => sum.add(&part)?,
            });
        }
        total.ok_or_else(|| Error::InvalidArgument {
            op: "model loss",
            reason: "no tokens".into(),
        })
    }

    /// The loss's logits (N, V) of hidden states (N, C): `lm_head`, its rows padded to
    /// `LOGIT_ROW_ALIGN` elements and made as `dtype` where the head is one tensor (else f32).
    fn loss_logits(&self, hidden: &Tensor, dtype: DType) -> Result<Tensor> {
        match self.head_shards()?.as_slice() {
            [head] => hidden.linear_padded_as(&self.w(head.name)?.t()?, LOGIT_ROW_ALIGN, dtype),
            _ => self.lm_head(hidden),
        }
    }
}
