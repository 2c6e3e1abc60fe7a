#!/usr/bin/env python3
"""Time PyTorch's causal attention (SDPA), forward and backward, beside the attention lines of
`wgrad profile` (`attn_coop_fwd`, `attn_coop_bwd`: us a layer).

The work: q, k, v of (B, H, T, D) with H / KV query heads a key/value head, f16 or bf16,
`torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=...)` on
the backend PyTorch picks (flash attention on an H100) or the one named; the backward from a
random dO, with q, k and v requiring gradients (dQ, dK, dV). Each figure is the median of
--reps timed repetitions (CUDA events around each) after --warmup. TFLOP/s count the causal
square at half: forward 4 B H T^2 D / 2, backward 2.5 times that (as PROFILING.md counts
wgrad's).

    python3 benches/reference/torch_attention.py                       # GPT-2: 8 x 12 x 1024 x 64
    python3 benches/reference/torch_attention.py --heads 9 --kv-heads 3 --json   # SmolLM2-135M
    python3 benches/reference/torch_attention.py --shapes 4x128,8x512,8x1024 --dtype bf16
"""
import argparse
import json
import statistics
import sys


def timed(torch, fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)  # us
    return statistics.median(times)


def run(args, b, t):
    import torch
    import torch.nn.functional as F

    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    h, kv, d = args.heads, args.kv_heads or args.heads, args.head_dim
    if h % kv:
        raise ValueError(f"--heads {h} is not a multiple of --kv-heads {kv}")

    def rand(heads):
        x = torch.randn(b, heads, t, d, device=dev, dtype=dtype, generator=g)
        return x.requires_grad_(True)

    q, k, v = rand(h), rand(kv), rand(kv)
    dout = torch.randn(b, h, t, d, device=dev, dtype=dtype, generator=g)
    gqa = kv != h

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    backend = None
    if args.backend != "auto":
        from torch.nn.attention import SDPBackend

        backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[args.backend]

    def with_backend(fn):
        if backend is None:
            return fn()
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(backend):
            return fn()

    out = with_backend(forward)

    def backward():
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    fwd_us = timed(torch, lambda: with_backend(forward), args.warmup, args.reps)
    bwd_us = timed(torch, lambda: with_backend(backward), args.warmup, args.reps)
    flop = 4.0 * b * h * t * t * d / 2.0
    return {"engine": "pytorch-sdpa", "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0), "backend": args.backend,
            "dtype": args.dtype, "batch": b, "heads": h, "kv_heads": kv, "seq": t, "head_dim": d,
            "fwd_us": round(fwd_us, 2), "bwd_us": round(bwd_us, 2),
            "fwd_tflops": round(flop / fwd_us / 1e6, 1),
            "bwd_tflops": round(2.5 * flop / bwd_us / 1e6, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="8x1024", help="BxT list")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    p.add_argument("--backend", default="auto", choices=["auto", "flash", "efficient", "cudnn", "math"])
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--json", action="store_true", help="one JSON object per shape, one a line")
    args = p.parse_args()
    rows = []
    for s in args.shapes.split(","):
        b, t = (int(x) for x in s.split("x"))
        try:
            row = run(args, b, t)
        except Exception as e:  # report and go on with the next shape
            row = {"engine": "pytorch-sdpa", "batch": b, "seq": t, "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    if not args.json:
        print(f"{'B x H x T x D':>18} {'fwd us':>9} {'TFLOP/s':>8} {'bwd us':>9} {'TFLOP/s':>8}")
        for r in rows:
            name = f"{r['batch']} x {r.get('heads', '?')} x {r['seq']} x {r.get('head_dim', '?')}"
            if "error" in r:
                print(f"{name:>18} {r['error']}")
            else:
                print(f"{name:>18} {r['fwd_us']:>9.1f} {r['fwd_tflops']:>8.1f} {r['bwd_us']:>9.1f} {r['bwd_tflops']:>8.1f}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
