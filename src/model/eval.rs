//! Next-token cross-entropy and perplexity of a model over a token sequence: consecutive,
//! non-overlapping chunks of T tokens (the remainder dropped), T - 1 predictions each; the
//! loss is the mean over chunks of each chunk's mean, which is what Hugging Face's
//! `model(input_ids=chunk, labels=chunk).loss` averaged over the chunks gives. Chunks run in
//! batches, forward only.

use std::path::Path;

use serde::Serialize;

use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::model::data::TokenDataset;
use crate::model::tokenizer::Tokenizer;
use crate::nn::Decoder;

/// Bytes of logits one evaluation batch may hold (and never more than one storage binding):
/// (B, T-1, V) f32 stays under lavapipe's 128 MiB binding, and a real GPU is busy at this size
/// already.
const EVAL_LOGITS_BYTES: usize = 64 << 20;
/// Chunks per batch at most.
const MAX_EVAL_BATCH: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct EvalReport {
    /// Mean next-token cross-entropy (nats).
    pub loss: f64,
    /// exp(loss).
    pub perplexity: f64,
    /// Tokens in the evaluated chunks (`sequences` x T).
    pub tokens: usize,
    /// Chunks of T tokens evaluated.
    pub sequences: usize,
}

/// Chunks per batch for chunks of `seq` tokens through `model`: its logits within one storage
/// binding of its adapter (and EVAL_LOGITS_BYTES).
pub fn eval_batch_size(model: &Decoder, seq: usize) -> usize {
    let max_binding = model
        .params
        .device()
        .gpu()
        .limits
        .max_storage_buffer_binding_size;
    let bytes = EVAL_LOGITS_BYTES.min(usize::try_from(max_binding).unwrap_or(usize::MAX));
    (bytes / (seq.saturating_sub(1).max(1) * model.config.vocab_size * 4)).clamp(1, MAX_EVAL_BATCH)
}

/// The loss and perplexity of `model` on `tokens` cut into chunks of `seq` tokens (2 <= seq
/// <= n_positions), `batch` chunks per forward pass.
pub fn evaluate(model: &Decoder, tokens: &[u32], seq: usize, batch: usize) -> Result<EvalReport> {
    check_seq(model, seq)?;
    mean_loss(model, tokens, seq, batch)
}

fn check_seq(model: &Decoder, seq: usize) -> Result<()> {
    check_eval_seq(model.config.n_positions, seq)
}

/// An error unless chunks of `seq` tokens fit a model of `n_pos` positions and make one
/// prediction at least: `wgrad eval` checks it before estimating the run's memory.
pub fn check_eval_seq(n_pos: usize, seq: usize) -> Result<()> {
    if seq < 2 || seq > n_pos {
        return Err(Error::InvalidArgument {
            op: "--seq",
            reason: format!(
                "a sequence of {seq} tokens: it must be 2 tokens at least (one prediction) and \
                 at most the model's {n_pos} positions"
            ),
        });
    }
    Ok(())
}

/// `evaluate` over the whole UTF-8 text file `path` (tokenized once, cached beside it), in
/// batches sized by `eval_batch_size`.
pub fn evaluate_text(
    model: &Decoder,
    tokenizer: &Tokenizer,
    path: &Path,
    seq: usize,
) -> Result<EvalReport> {
    check_seq(model, seq)?;
    let data = TokenDataset::load_with_held_out(path, tokenizer, 0.0)?;
    let n = data.tokens().len();
    if n < seq {
        return Err(Error::Dataset {
            path: path.display().to_string(),
            reason: format!("the text holds {n} tokens, fewer than one sequence of {seq}"),
        });
    }
    let batch = eval_batch_size(model, seq);
    evaluate(model, data.tokens(), seq, batch)
}

/// As `evaluate`, with chunks of up to n_positions + 1 tokens (the last token of a chunk is
/// only a target): the held-out loss of training, whose windows are T + 1 tokens.
pub(crate) fn mean_loss(
    model: &Decoder,
    tokens: &[u32],
    chunk: usize,
    batch: usize,
) -> Result<EvalReport> {
    let sequences = tokens.len() / chunk.max(1);
    if chunk < 2 || chunk > model.config.n_positions + 1 || sequences == 0 || batch == 0 {
        return Err(Error::InvalidArgument {
            op: "evaluate",
            reason: format!(
                "{} tokens hold no chunk of {chunk} tokens in batches of {batch} (the model has \
                 {} positions)",
                tokens.len(),
                model.config.n_positions
            ),
        });
    }
    let dev = model.params.device().clone();
    let vocab = model.config.vocab_size as u32;
    if let Some(&bad) = tokens[..sequences * chunk].iter().find(|&&t| t >= vocab) {
        return Err(Error::InvalidArgument {
            op: "evaluate",
            reason: format!("token id {bad} is outside the model's vocabulary of {vocab}"),
        });
    }
    let t = chunk - 1;
    // (sum of the batch's chunk losses on the GPU, chunks in it), read at the end: the GPU
    // works through the batches while the host records the next.
    let mut pending: Vec<(Tensor, usize)> = Vec::new();
    no_grad(|| -> Result<()> {
        for first in (0..sequences).step_by(batch) {
            let b = batch.min(sequences - first);
            let rows = &tokens[first * chunk..(first + b) * chunk];
            let inputs: Vec<u32> = rows.chunks(chunk).flat_map(|c| &c[..t]).copied().collect();
            let targets: Vec<u32> = rows.chunks(chunk).flat_map(|c| &c[1..]).copied().collect();
            let x = Tensor::from_u32(&dev, &inputs, &[b, t])?;
            let y = Tensor::from_u32(&dev, &targets, &[b, t])?;
            pending.push((model.loss(&x, &y)?, b));
            dev.flush();
        }
        Ok(())
    })?;
    let mut total = 0f64;
    for (loss, b) in pending {
        total += loss.item()? as f64 * b as f64;
    }
    let loss = total / sequences as f64;
    Ok(EvalReport {
        loss,
        perplexity: loss.exp(),
        tokens: sequences * chunk,
        sequences,
    })
}
