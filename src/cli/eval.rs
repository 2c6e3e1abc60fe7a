//! `wgrad eval`: the mean next-token loss and perplexity of a model directory over a text file
//! cut into consecutive chunks of --seq tokens. Prints one line, or `--json`.

use std::path::PathBuf;

use wgrad::memory::{check_fits, Workload};
use wgrad::model::{check_eval_seq, evaluate_text, HfConfig};
use wgrad::session::load_model;
use wgrad::{Device, Result};

#[derive(clap::Args)]
pub struct Args {
    /// A Hugging Face model directory (GPT-2, Llama, Qwen2 or Qwen3: config.json, model.safetensors or its shards, tokenizer).
    #[arg(long)]
    model: PathBuf,
    /// The UTF-8 text to score (builtin:austen-persuasion.txt: the corpus compiled in).
    #[arg(long)]
    text: PathBuf,
    /// Tokens per chunk [default: the model's n_positions].
    #[arg(long)]
    seq: Option<usize>,
    /// One JSON object: loss, perplexity, tokens, sequences.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let dev = Device::new()?;
    let config = HfConfig::read(&args.model.join("config.json"))?.model;
    let seq = args.seq.unwrap_or(config.n_positions);
    check_eval_seq(config.n_positions, seq)?;
    check_fits(&dev, &config, Workload::Forward { batch: 1, seq })?;
    let (_, model, tokenizer) = load_model(&dev, &args.model)?;
    let seq = args.seq.unwrap_or(model.config.n_positions);
    let report = evaluate_text(&model, &tokenizer, &args.text, seq)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("the report serializes")
        );
    } else {
        println!(
            "loss {:.4}, perplexity {:.2} over {} sequences of {seq} tokens ({} tokens, {} \
             predictions)",
            report.loss,
            report.perplexity,
            report.sequences,
            report.tokens,
            report.sequences * (seq - 1)
        );
    }
    Ok(())
}
