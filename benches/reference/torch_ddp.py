#!/usr/bin/env python3
"""Time PyTorch DistributedDataParallel training steps over NCCL, the anchor for
`mpirun -np N wgrad bench step`.

PyTorch as its users write it: bf16 autocast, SDPA attention, torch.compile of the DDP model,
AdamW(fused=True), gradient norm clipped to 1.0; each rank its own --batch of random tokens; a
step = forward + backward (DDP's bucketed allreduce overlapping it) + clip + AdamW + reading
the loss. Rank 0 prints one JSON object: the median step after --warmup steps and the tokens/s
of all ranks. Models: distilgpt2 (a config.json: models/distilgpt2/config.json) or a
torch_llama.py preset (smollm2-135m).

    python3 -m torch.distributed.run --nproc_per_node 2 benches/reference/torch_ddp.py \\
        --model distilgpt2 --batch 8 --seq 1024
"""
import argparse
import json
import os
import statistics
import sys
import time


def build(model_name, config):
    import transformers

    if model_name == "distilgpt2":
        cfg = transformers.GPT2Config.from_json_file(config)
        cfg.attn_pdrop = cfg.embd_pdrop = cfg.resid_pdrop = 0.0
        try:
            cfg._attn_implementation = "sdpa"
        except (AttributeError, ValueError):
            pass
        return cfg, transformers.GPT2LMHeadModel(cfg)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_llama import build_model

    return build_model(model_name)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="distilgpt2")
    p.add_argument("--config", default="models/distilgpt2/config.json")
    p.add_argument("--batch", type=int, default=8, help="sequences a rank")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    cfg, model = build(a.model, a.config)
    model = model.cuda().train()
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, device_ids=[local])
    forward = torch.compile(ddp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1 + rank)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq + 1), device="cuda", generator=gen)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    times = []
    for _ in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(input_ids=x).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    timed = times[max(a.warmup, 1):]
    median = statistics.median(timed)
    if rank == 0:
        print(json.dumps({
            "engine": "pytorch-ddp",
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "device": torch.cuda.get_device_name(),
            "model": a.model,
            "params": params,
            "world_size": world,
            "batch": a.batch,
            "seq": a.seq,
            "steps": len(timed),
            "median_ms": median,
            "min_ms": min(timed),
            "max_ms": max(timed),
            "tokens_per_s": world * a.batch * a.seq / (median * 1e-3),
        }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
