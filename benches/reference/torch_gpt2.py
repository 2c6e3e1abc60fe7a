#!/usr/bin/env python3
"""Time PyTorch + transformers GPT-2 training steps, as `wgrad bench step` does.

Same shapes, optimizer and synchronization: a GPT2LMHeadModel from a config.json (random
weights, no dropout), random token ids with next-token targets, AdamW (lr 1e-4, weight decay
0.1, gradient norm clipped to 1.0), a step = forward + backward + clip + AdamW step + reading
the loss (torch.cuda.synchronize), the median of --steps steps after --warmup steps.

Modes: fp32, tf32, bf16 (autocast), bf16-compile (autocast + torch.compile of the loss
function, which traces the model's forward too; plain foreach AdamW; the config's default
attention), and best ("PyTorch best", as benches/reference/torch_llama.py: bf16 autocast, SDPA
attention, the forward and the cross-entropy in one torch.compile graph, TF32 allowed for what
autocast leaves in f32, torch.optim.AdamW(fused=True)). The default --modes are the first four
(what compare.sh shows); --best runs best alone, --modes ...,best adds it.
Prints one JSON object per (mode, B, T) line; --table prints a table instead.

    python3 benches/reference/torch_gpt2.py --config models/gpt2/config.json --shapes 8x1024 --best
"""
import argparse
import json
import statistics
import sys
import time


def run(config_path, mode, batch, seq, steps, warmup):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config.from_json_file(config_path)
    cfg.attn_pdrop = cfg.embd_pdrop = cfg.resid_pdrop = 0.0
    best = mode == "best"
    if best:
        # Compiled afresh for each shape, static, as a lone run would be (bf16-compile keeps
        # the compile cache across rows, as it always has: a later shape may recompile dynamic).
        torch._dynamo.reset()
        try:
            cfg._attn_implementation = "sdpa"
        except (AttributeError, ValueError):
            pass
    torch.backends.cuda.matmul.allow_tf32 = mode in ("tf32", "best")
    torch.backends.cudnn.allow_tf32 = mode in ("tf32", "best")
    model = GPT2LMHeadModel(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=best or None)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device="cuda")
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def loss_fn(x, y):
        logits = model(input_ids=x).logits
        if best:
            logits = logits.float()
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    if mode in ("bf16-compile", "best"):
        loss_fn = torch.compile(loss_fn)
    autocast = mode in ("bf16", "bf16-compile", "best")

    times, first = [], None
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        if i == 0:
            first = ms
        if i >= warmup:
            times.append(ms)
    return {
        "engine": "pytorch",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "mode": mode,
        "attn": getattr(model.config, "_attn_implementation", None),
        "batch": batch,
        "seq": seq,
        "step0_ms": first,
        "median_ms": statistics.median(times),
        "tokens_per_s": batch * seq / (statistics.median(times) * 1e-3),
        "loss_last": value,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="models/distilgpt2/config.json")
    p.add_argument("--modes", default="fp32,tf32,bf16,bf16-compile")
    p.add_argument("--shapes", default="4x128,8x512,16x1024", help="BxT list")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--best", action="store_true", help="the best mode alone (same as --modes best)")
    p.add_argument("--table", action="store_true", help="a table instead of JSON lines")
    args = p.parse_args()
    modes = ["best"] if args.best else args.modes.split(",")
    rows = []
    for shape in args.shapes.split(","):
        b, t = (int(v) for v in shape.split("x"))
        for mode in modes:
            try:
                row = run(args.config, mode, b, t, args.steps, args.warmup)
            except Exception as e:  # report and go on with the next row
                row = {"engine": "pytorch", "mode": mode, "batch": b, "seq": t, "error": str(e)}
            rows.append(row)
            if not args.table:
                print(json.dumps(row), flush=True)
    if args.table:
        print(f"{'B x T':>11} {'mode':>12} {'step0 ms':>9} {'median ms':>9} {'tokens/s':>10} {'loss':>7}")
        for r in rows:
            shape = f"{r['batch']} x {r['seq']}"
            if "error" in r:
                print(f"{shape:>11} {r['mode']:>12} error: {r['error']}")
            else:
                print(f"{shape:>11} {r['mode']:>12} {r['step0_ms']:>9.1f} {r['median_ms']:>9.2f} "
                      f"{r['tokens_per_s']:>10.0f} {r['loss_last']:>7.3f}")


if __name__ == "__main__":
    sys.exit(main())
