//! Whether a run fits before anything is allocated: `check_fits` estimates the GPU memory a
//! GPT-2 command needs (parameters, gradients, AdamW's moments, the f16 copies of mixed
//! precision, the activations of one micro-batch; the KV cache of generation) with checked
//! arithmetic, and compares it with the adapter's buffer limits and with its memory: the cap
//! `PoolPolicy::memory_limit` where set, else the host's memory for a CPU adapter (lavapipe's
//! buffers are host memory), else `UNKNOWN_MEMORY` (wgpu does not report a GPU's memory; past
//! the estimate, the pool's out-of-memory error scope catches what does not fit). A refusal is
//! `Error::OutOfMemory` naming each part's bytes and what to lower, as PyTorch's message does.
//!
//! The estimate is a lower bound (what the run surely holds at once): a run it lets through may
//! still run out, and then fails with the same error from the pool.

use crate::config::Options;
use crate::error::{human_bytes, Error, Result};
use crate::graph::Device;
use crate::nn::{Family, ModelConfig};

/// The memory assumed where neither the cap nor the adapter tells it: 1 TiB, more than any
/// single GPU holds (an H200 has 141 GB). Refuses the sizes no adapter can hold (n_layer 1e9
/// would otherwise abort in the host's allocation of its parameter list) without refusing a
/// run a real GPU might fit; set `WGRAD_MEMORY_LIMIT_MIB` to check against the GPU's own.
pub const UNKNOWN_MEMORY: u64 = 1 << 40;

/// What a command runs on the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Training steps of `batch` x `seq` tokens a micro-batch (micro-batches run one after
    /// another: `--grad-accum` adds no GPU memory), with or without mixed precision.
    Train { batch: usize, seq: usize, amp: bool },
    /// Forward passes of `batch` x `seq` tokens (eval).
    Forward { batch: usize, seq: usize },
    /// Generation: one sequence through a KV cache of the model's positions.
    Generate,
}

impl From<&crate::session::TrainOptions> for Workload {
    /// A training run's micro-batch.
    fn from(o: &crate::session::TrainOptions) -> Workload {
        Workload::Train {
            batch: o.batch,
            seq: o.seq,
            amp: o.amp,
        }
    }
}

/// The bytes of each part of a run, as `check_fits` estimated them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// (part, bytes), in the order they are listed in an error.
    pub parts: Vec<(&'static str, u64)>,
    pub total: u64,
    /// The largest single tensor of the activations, and its bytes (it must fit one storage
    /// binding).
    pub largest: (&'static str, u64),
}

impl Footprint {
    /// The bytes that follow the batch (activations; for generation, the KV cache).
    pub fn activations(&self) -> u64 {
        self.parts
            .iter()
            .filter(|(part, _)| *part == "activations" || *part == "KV cache")
            .map(|(_, b)| b)
            .sum()
    }
}

/// The config.json fields of the sizes the estimate grows with: layers, width, vocabulary,
/// positions (GPT-2's names, or the Llama family's).
fn size_fields(config: &ModelConfig) -> [&'static str; 4] {
    match config.family {
        Family::Gpt2 => ["n_layer", "n_embd", "vocab_size", "n_positions"],
        _ => [
            "num_hidden_layers",
            "hidden_size",
            "vocab_size",
            "max_position_embeddings",
        ],
    }
}

/// "a llama of num_hidden_layers 30, hidden_size 576, ...": the model as its config.json
/// says it.
fn model_sizes(config: &ModelConfig) -> String {
    let values = [
        config.n_layer,
        config.n_embd,
        config.vocab_size,
        config.n_positions,
    ];
    let sizes: Vec<String> = size_fields(config)
        .iter()
        .zip(values)
        .map(|(field, v)| format!("{field} {v}"))
        .collect();
    format!("a {} of {}", config.family.model_type(), sizes.join(", "))
}

/// "config.json's n_layer, n_embd, vocab_size, n_positions" in the model's own names.
fn smaller_model(config: &ModelConfig) -> String {
    format!("config.json's {}", size_fields(config).join(", "))
}

/// Overflow of the estimate: a size no adapter holds.
fn overflow(config: &ModelConfig) -> Error {
    Error::OutOfMemory {
        what: model_sizes(config),
        bytes: u64::MAX,
        limit: "its size overflows 64-bit arithmetic".into(),
        advice: format!("Use a smaller model ({})", smaller_model(config)),
    }
}

/// The estimate of `work` on a model of `config`.
pub fn footprint(config: &ModelConfig, work: Workload) -> Result<Footprint> {
    let of = || overflow(config);
    let m = |a: u64, b: u64| a.checked_mul(b).ok_or_else(of);
    let add = |a: u64, b: u64| a.checked_add(b).ok_or_else(of);
    let (c, v, p, l) = (
        config.n_embd as u64,
        config.vocab_size as u64,
        config.n_positions as u64,
        config.n_layer as u64,
    );
    let numel = u64::try_from(config.parameter_count()).map_err(|_| of())?;
    // The MLP's widest activation: GPT-2's (B x T, n_inner), SwiGLU's gate and up (B x T,
    // 2 n_inner).
    let f = config.n_inner as u64;
    let (mlp_width, mlp_saved) = match config.family {
        crate::nn::Family::Gpt2 => (f, m(2, f)?),
        _ => (m(2, f)?, m(3, f)?),
    };
    let kv_width = m(config.n_kv_head as u64, config.head_dim as u64)?;
    let weights = m(4, numel)?;
    let mut parts = vec![("parameters", weights)];
    let f32_row = |tokens: u64, width: u64| m(m(tokens, width)?, 4);
    let mlp = "the MLP's activations (B x T, its hidden width)";
    let largest = match work {
        Workload::Train { batch, seq, amp } => {
            parts.push(("gradients", weights));
            parts.push(("AdamW moments", m(2, weights)?));
            if amp {
                parts.push(("f16 weight copies", numel.checked_mul(2).ok_or_else(of)?));
            }
            let tokens = m(batch as u64, seq as u64)?;
            // Saved for the backward pass, per layer and token: the two norms' outputs, q k v,
            // the attention's output, the MLP's activations (GPT-2: pre-activation and output;
            // SwiGLU: gate, up and output), the two residual sums (GPT-2: 16C values).
            let per_token = [
                m(4, c)?,
                config.qkv_width() as u64,
                config.attn_width() as u64,
                mlp_saved,
            ]
            .into_iter()
            .try_fold(0u64, &add)?;
            let saved = m(l, f32_row(tokens, per_token)?)?;
            // The logits, kept for the loss's backward (f16 under --amp; their gradient, made
            // a chunk at a time, not counted).
            let logits = m(tokens, v)?;
            let logits = m(logits, if amp { 2 } else { 4 })?;
            parts.push(("activations", add(saved, logits)?));
            (mlp, f32_row(tokens, mlp_width)?)
        }
        Workload::Forward { batch, seq } => {
            let tokens = m(batch as u64, seq as u64)?;
            let hidden = m(2, f32_row(tokens, mlp_width)?)?;
            parts.push(("activations", add(hidden, f32_row(tokens, v)?)?));
            (mlp, f32_row(tokens, mlp_width)?)
        }
        Workload::Generate => {
            parts.push(("KV cache", m(2, m(l, f32_row(p, kv_width)?)?)?));
            (
                "one layer's K or V cache (n_positions, key/value heads x head_dim)",
                f32_row(p, kv_width)?,
            )
        }
    };
    let total = parts.iter().try_fold(0u64, |t, (_, b)| add(t, *b))?;
    Ok(Footprint {
        parts,
        total,
        largest,
    })
}

/// The memory a run on `device` may use, and how to say it.
fn memory(device: &Device) -> (u64, String) {
    let options: &Options = device.options();
    let gpu = device.gpu();
    if let Some(cap) = options.pool.memory_limit {
        return (
            cap,
            format!(
                "the memory cap is {cap} bytes ({}, WGRAD_MEMORY_LIMIT_MIB)",
                human_bytes(cap)
            ),
        );
    }
    if gpu.info.device_type == wgpu::DeviceType::Cpu {
        if let Some(host) = host_memory() {
            return (
                host,
                format!(
                    "adapter `{}` keeps its buffers in the host's {host} bytes ({}) of memory",
                    gpu.info.name,
                    human_bytes(host)
                ),
            );
        }
    }
    (
        UNKNOWN_MEMORY,
        format!(
            "no single GPU holds more than {} (wgpu does not tell adapter `{}`'s own: set \
             WGRAD_MEMORY_LIMIT_MIB to check against it)",
            human_bytes(UNKNOWN_MEMORY),
            gpu.info.name
        ),
    )
}

/// The host's physical memory (Linux: /proc/meminfo's MemTotal), None where unknown.
fn host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What to lower for `work`.
fn advice(work: Workload) -> String {
    match work {
        Workload::Train { .. } => "Lower --batch or --seq (a smaller --batch with a larger \
             --grad-accum trains on as many tokens a step; --grad-accum itself adds no memory), \
             or use a smaller model"
            .into(),
        Workload::Forward { .. } => "Lower --seq, or use a smaller model".into(),
        Workload::Generate => "Use a smaller model (n_positions sets the KV cache)".into(),
    }
}

/// An error unless `work` on a model of `config` fits `device`: its largest activation within
/// one storage binding, its estimated total within the memory (see the module doc). Call it
/// before building the model; returns the estimate.
pub fn check_fits(device: &Device, config: &ModelConfig, work: Workload) -> Result<Footprint> {
    let f = footprint(config, work)?;
    let binding = device.gpu().limits.max_storage_buffer_binding_size;
    let (name, bytes) = f.largest;
    if bytes > binding {
        return Err(Error::OutOfMemory {
            what: name.to_string(),
            bytes,
            limit: format!(
                "one storage binding of adapter `{}` holds at most {binding} bytes ({})",
                device.gpu().info.name,
                human_bytes(binding)
            ),
            advice: advice(work),
        });
    }
    let (memory, said) = memory(device);
    if f.total > memory {
        let parts: Vec<String> = f
            .parts
            .iter()
            .map(|(part, b)| format!("{part} {}", human_bytes(*b)))
            .collect();
        let run = match work {
            Workload::Train { batch, seq, amp } => format!(
                "training (--batch {batch}, --seq {seq}{})",
                if amp { ", --amp" } else { "" }
            ),
            Workload::Forward { batch, seq } => format!("evaluating {batch} x {seq} tokens"),
            Workload::Generate => "generating".into(),
        };
        return Err(Error::OutOfMemory {
            what: format!("{run} {} ({})", model_sizes(config), parts.join(", ")),
            bytes: f.total,
            limit: said,
            advice: if f.total - f.activations() > memory {
                format!(
                    "The model alone (parameters and optimizer state) does not fit: use a \
                     smaller model ({})",
                    smaller_model(config)
                )
            } else {
                advice(work)
            },
        });
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(n_layer: usize, n_embd: usize, vocab_size: usize, n_positions: usize) -> ModelConfig {
        ModelConfig {
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.02,
            ..ModelConfig::gpt2(vocab_size, n_positions, n_embd, n_layer, 1)
        }
    }

    #[test]
    fn the_estimate_counts_gpt2s_parameters_and_overflows_into_an_error() {
        // GPT-2 small: 124,439,808 parameters (Hugging Face's count, wte tied).
        let gpt2 = config(12, 768, 50257, 1024);
        let f = footprint(&gpt2, Workload::Generate).expect("fits u64");
        assert_eq!(f.parts[0], ("parameters", 4 * 124_439_808));
        let train = Workload::Train {
            batch: 8,
            seq: 512,
            amp: false,
        };
        let t = footprint(&gpt2, train).expect("fits u64");
        assert_eq!(
            t.parts[1].1, t.parts[0].1,
            "gradients as large as the weights"
        );
        assert_eq!(t.parts[2].1, 2 * t.parts[0].1, "two moments");
        assert!(t.total > 16 * 124_439_808);
        // Sizes past 64 bits are an error, not a wrap.
        let huge = config(usize::MAX / 2, 1 << 20, 1 << 40, 1 << 40);
        let e = footprint(&huge, train).expect_err("overflows");
        assert!(e.to_string().contains("overflows"), "{e}");
        assert!(e.to_string().contains("a gpt2 of n_layer"), "{e}");
        // A Llama-family model is named by its own config.json fields.
        let llama = ModelConfig {
            family: Family::Llama,
            rope_theta: 10000.0,
            ..huge
        };
        let e = footprint(&llama, train).expect_err("overflows").to_string();
        for says in [
            "a llama of num_hidden_layers",
            "hidden_size 1048576",
            "config.json's num_hidden_layers, hidden_size, vocab_size, max_position_embeddings",
        ] {
            assert!(e.contains(says), "{says}: {e}");
        }
        let e = footprint(
            &gpt2,
            Workload::Train {
                batch: usize::MAX,
                seq: 2,
                amp: false,
            },
        )
        .expect_err("overflows");
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    }
}
