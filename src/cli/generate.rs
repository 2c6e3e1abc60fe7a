//! `wgrad generate`: continues a prompt with a model directory, one position per new token
//! through the KV cache, printing the text as it comes; a timing line goes to stderr.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use wgrad::memory::{check_fits, Workload};
use wgrad::model::{check_request, generate, HfConfig, Sampling};
use wgrad::session::load_model;
use wgrad::{Device, Error, Result};

#[derive(clap::Args)]
pub struct Args {
    /// A Hugging Face model directory (GPT-2, Llama, Qwen2 or Qwen3: config.json, model.safetensors or its shards, tokenizer).
    #[arg(long)]
    model: PathBuf,
    /// The text to continue (empty: start from <|endoftext|>).
    #[arg(long, default_value = "")]
    prompt: String,
    /// New tokens at most (prompt + new tokens must fit the model's positions).
    #[arg(long, default_value_t = 50)]
    max_tokens: usize,
    /// 0: greedy; otherwise the logits are divided by it before sampling.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample within the smallest set of tokens whose probabilities reach P.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(args: &Args) -> Result<()> {
    let dev = Device::new()?;
    let config = HfConfig::read(&args.model.join("config.json"))?.model;
    check_fits(&dev, &config, Workload::Generate)?;
    let (hf, model, tokenizer) = load_model(&dev, &args.model)?;
    // The end of text: the tokenizer's <|endoftext|>, else config.json's eos_token_id (a
    // Llama tokenizer's </s> or <|end_of_text|>; the first where it lists several).
    let eot = tokenizer.end_of_text().or_else(|| {
        let eos = hf.field("eos_token_id")?;
        let id = eos.as_u64().or_else(|| eos.as_array()?.first()?.as_u64())?;
        u32::try_from(id)
            .ok()
            .filter(|&id| (id as usize) < config.vocab_size)
    });
    let mut prompt = tokenizer.encode(&args.prompt)?;
    let shown_prompt = prompt.len();
    if prompt.is_empty() {
        prompt.push(eot.ok_or_else(|| {
            Error::InvalidArgument {
                op: "--prompt",
                reason: "an empty prompt starts from the end-of-text token, which neither the \
                     tokenizer (<|endoftext|>) nor config.json (eos_token_id) gives"
                    .into(),
            }
        })?);
    }
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    check_request(&model, prompt.len(), args.max_tokens, &sampling)?;
    let start = Instant::now();
    let mut out = std::io::stdout().lock();
    let io = |source| Error::Io {
        path: "stdout".into(),
        source,
    };
    write!(out, "{}", args.prompt).map_err(io)?;
    out.flush().map_err(io)?;
    // Decoded text so far; print what a new token adds once it decodes to whole characters
    // (byte-level BPE may split one character over tokens).
    let mut ids: Vec<u32> = Vec::new();
    let mut printed = 0;
    let new = generate(&model, &prompt, args.max_tokens, &sampling, eot, |id| {
        if Some(id) == eot {
            return Ok(());
        }
        ids.push(id);
        let text = tokenizer.decode(&ids)?;
        if !text.ends_with('\u{FFFD}') {
            write!(out, "{}", &text[printed..]).map_err(io)?;
            out.flush().map_err(io)?;
            printed = text.len();
        }
        Ok(())
    })?;
    let text = tokenizer.decode(&ids)?;
    writeln!(out, "{}", &text[printed.min(text.len())..]).map_err(io)?;
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "{} new tokens after a prompt of {} in {:.2} s ({:.1} ms/token{})",
        new.len(),
        shown_prompt,
        secs,
        secs * 1e3 / new.len().max(1) as f64,
        if new.last() == eot.as_ref() {
            ", stopped at <|endoftext|>"
        } else {
            ""
        }
    );
    Ok(())
}
