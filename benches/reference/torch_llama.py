#!/usr/bin/env python3
"""Time PyTorch + transformers Llama training steps ("PyTorch best"), beside `wgrad bench step
--preset smollm2-135m --amp`.

The model: LlamaForCausalLM built from a config, random weights, nothing downloaded. Presets:
  smollm2-135m  SmolLM2-135M's shape: V 49152, C 576, intermediate 1536, 30 layers, 9 heads,
                3 key-value heads, head_dim 64, max_position_embeddings 8192, rope_theta 100000,
                RMSNorm eps 1e-5, SiLU, lm_head tied to the embedding (134.5M parameters)
  tiny          tests/fixtures/llama-small's shape (V 512, C 128, 2 layers, 4/2 heads), untied
                -- a smoke test, not a benchmark

The step, "PyTorch best": weights f32, forward under bf16 autocast, SDPA attention, the whole
forward and the cross-entropy (logits upcast to f32) in one torch.compile graph (--compile
model: torch.compile(model) and the loss outside it; none: eager), backward,
clip_grad_norm_(1.0), torch.optim.AdamW(lr 1e-4, weight decay 0.1, fused=True), zero_grad,
reading the loss with .item(), torch.cuda.synchronize(); random token ids with next-token
targets, the same batch every step. Reported: step 0 (compiling), the median, min and max of
--steps steps after --warmup steps (step 0 among the warm-up), tokens/s, peak GPU memory.

    python3 benches/reference/torch_llama.py --batch 8 --seq 1024 --steps 20 --warmup 5
    python3 benches/reference/torch_llama.py --shapes 4x512,8x1024 --json   # one JSON per line
    python3 benches/reference/torch_llama.py --preset tiny --batch 4 --seq 128 --steps 5
"""
import argparse
import json
import statistics
import sys
import time

PRESETS = {
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
}


def build_model(preset):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        initializer_range=0.02,
        use_cache=False,
        **PRESETS[preset],
    )
    try:
        cfg._attn_implementation = "sdpa"
    except (AttributeError, ValueError):
        pass
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    return cfg, model


def run(preset, compile_mode, batch, seq, steps, warmup):
    import torch
    import torch.nn.functional as F
    import transformers

    torch._dynamo.reset()  # each shape compiled afresh, static, as a lone run would be
    torch.set_float32_matmul_precision("high")  # what autocast leaves in f32 may use TF32
    cfg, model = build_model(preset)
    model = model.cuda().train()
    params = sum(p.numel() for p in model.parameters())
    attn = getattr(model.config, "_attn_implementation", None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device="cuda", generator=gen)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    forward = torch.compile(model) if compile_mode == "model" else model

    def loss_fn(x, y):
        logits = forward(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))

    if compile_mode == "loss":
        loss_fn = torch.compile(loss_fn)

    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    timed = times[max(warmup, 1):] or times[-1:]
    median = statistics.median(timed)
    return {
        "engine": "pytorch",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(),
        "model": preset,
        "params": params,
        "mode": f"best(bf16 autocast, compile {compile_mode}, fused AdamW, {attn})",
        "compile": compile_mode,
        "attn": attn,
        "batch": batch,
        "seq": seq,
        "steps": len(timed),
        "warmup": max(warmup, 1),
        "step0_ms": times[0],
        "median_ms": median,
        "min_ms": min(timed),
        "max_ms": max(timed),
        "tokens_per_s": batch * seq / (median * 1e-3),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }


def print_table(rows):
    print(f"{'model':>13} {'B x T':>11} {'compile':>7} {'step0 ms':>9} {'median ms':>9} "
          f"{'min':>8} {'max':>8} {'tokens/s':>10} {'peak GiB':>8} {'loss':>7}")
    for r in rows:
        shape = f"{r['batch']} x {r['seq']}"
        if "error" in r:
            print(f"{r['model']:>13} {shape:>11} {r['compile']:>7} error: {r['error']}")
            continue
        print(f"{r['model']:>13} {shape:>11} {r['compile']:>7} {r['step0_ms']:>9.1f} "
              f"{r['median_ms']:>9.2f} {r['min_ms']:>8.2f} {r['max_ms']:>8.2f} "
              f"{r['tokens_per_s']:>10.0f} {r['peak_gib']:>8.2f} {r['loss_last']:>7.3f}")
    if rows and "device" in rows[0]:
        r = rows[0]
        print(f"{r['device']}; torch {r['torch']}, transformers {r['transformers']}; "
              f"{r['params']} parameters; attention {r['attn']}; medians of {r['steps']} steps "
              f"after {r['warmup']} warm-up")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="smollm2-135m", choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--shapes", help="BxT list (e.g. 4x512,8x1024); overrides --batch/--seq")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", default="loss", choices=["loss", "model", "none"],
                   help="loss: model + cross-entropy in one graph (default); model: "
                        "torch.compile(model); none: eager")
    p.add_argument("--json", action="store_true", help="one JSON object per shape, one a line")
    args = p.parse_args()
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else [(args.batch, args.seq)])
    rows = []
    for b, t in shapes:
        try:
            row = run(args.preset, args.compile, b, t, args.steps, args.warmup)
        except Exception as e:  # report and go on with the next shape
            row = {"engine": "pytorch", "model": args.preset, "compile": args.compile,
                   "batch": b, "seq": t, "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    if not args.json:
        print_table(rows)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
