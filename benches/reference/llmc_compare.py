#!/usr/bin/env python3
"""The Python half of benches/reference/llmc_compare.sh: what llm.c needs and what it prints.

    unmanage CUDA_UTILS        remove llm.c's out-of-memory fallback to managed memory
                               (llmc/cuda_utils.cuh, cudaMallocConditionallyManaged): an
                               allocation that fails is an error, as in wgrad and PyTorch;
                               CUDA 13's cudaMemAdvise no longer takes the device id it passes
    tokens PATH COUNT          COUNT random GPT-2 token ids (vocab 50257) in llm.c's .bin format
                               (llmc/dataloader.h: 256 int32 header of magic 20240520,
                               version 1, token count; then uint16 tokens)
    steps LOG B T WARMUP       train_gpt2cu's per-step lines (`step N/M | loss ... | X ms | ...`),
                               the median ms of the steps after WARMUP, as one JSON line
    table WGRAD LLMC TORCH     the three engines' JSON side by side; --json: one object a shape
    check                      tests of the above on files and lines made here (no GPU)
"""
import json
import os
import random
import re
import statistics
import struct
import sys
import tempfile

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256  # llmc/dataloader.h
VOCAB = 50257  # GPT-2's tokenizer; llm.c pads the embedding to 50304, the data stays below 50257

# cuda_utils.cuh, the body of cudaMallocConditionallyManaged after its cudaMalloc: on
# cudaErrorMemoryAllocation it takes managed memory, advised to live on the host.
FALLBACK = re.compile(
    r"if\s*\(\s*err\s*==\s*cudaErrorMemoryAllocation\s*\)\s*\{.*?cudaMallocManaged.*?"
    r"\}\s*else\s*\{\s*cudaCheck_\(\s*err\s*,\s*file\s*,\s*line\s*\)\s*;\s*return\s+0\s*;\s*\}",
    re.S,
)
NO_FALLBACK = (
    "// wgrad's llmc_compare.sh removed the managed-memory fallback here: out of memory is an error\n"
    "    cudaCheck_(err, file, line);\n"
    "    return 0;"
)

# train_gpt2.cu's printf0("step %4d/%d | loss %7.6f (%+.2fz)| norm ... | lr ... | %.2f ms | ...")
STEP = re.compile(r"^step\s+(\d+)/(\d+) \| loss (\S+) .*?\| ([0-9.]+) ms \|")
DEVICE = re.compile(r"^\| device\s+\| (.*?)\s*\|$")


def unmanage(source):
    """Returns cuda_utils.cuh's text without the fallback; raises if it is not there once."""
    found = FALLBACK.findall(source)
    if len(found) != 1:
        raise ValueError(f"expected the managed-memory fallback once in cuda_utils.cuh, found {len(found)}")
    patched = FALLBACK.sub(lambda _: NO_FALLBACK, source)
    for name in ("cudaMallocManaged", "cudaMemAdvise"):
        if name in patched:
            raise ValueError(f"{name} is still in cuda_utils.cuh after the patch")
    return patched


def write_tokens(path, count, seed=0):
    rng = random.Random(seed)
    header = [0] * HEADER_INTS
    header[0:3] = [MAGIC, VERSION, count]
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        f.write(struct.pack(f"<{count}H", *(rng.randrange(VOCAB) for _ in range(count))))


def read_tokens(path):
    """Reads a .bin as llm.c's dataloader_load_shard_ does, with its checks."""
    with open(path, "rb") as f:
        header = struct.unpack(f"<{HEADER_INTS}i", f.read(HEADER_INTS * 4))
        assert header[0] == MAGIC, "bad magic"
        assert header[1] == VERSION, "bad version"
        count = header[2]
        assert count > 0
        assert os.path.getsize(path) == HEADER_INTS * 4 + count * 2, "file size is not as expected"
        return list(struct.unpack(f"<{count}H", f.read(count * 2)))


def steps(lines, batch, seq, warmup):
    """train_gpt2cu's log as one row: the median of the step times after `warmup` steps."""
    ms, loss, device = [], None, None
    for line in lines:
        if m := DEVICE.match(line.strip()):
            device = m.group(1)
        if m := STEP.match(line.strip()):
            if int(m.group(1)) > warmup:  # printed from 1
                ms.append(float(m.group(4)))
            loss = float(m.group(3))
    row = {"engine": "llm.c", "device": device, "batch": batch, "seq": seq}
    if not ms:
        return {**row, "error": f"no step lines after {warmup} warm-up steps"}
    return {**row, "steps": len(ms), "median_ms": statistics.median(ms), "min_ms": min(ms),
            "max_ms": max(ms), "tokens_per_s": batch * seq / (statistics.median(ms) * 1e-3),
            "loss_last": loss}


def read_rows(path):
    """JSON lines, or one (pretty-printed) JSON object a file for wgrad's --json."""
    text = open(path).read() if os.path.exists(path) else ""
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError:
        return [json.loads(text)]


def table(wgrad_rows, llmc_rows, torch_rows, shapes, as_json):
    def median(rows, b, t):
        r = next((r for r in rows if (r.get("batch"), r.get("seq")) == (b, t)), {})
        return r.get("median_ms")

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    # The card, as llm.c (CUDA's name) or PyTorch saw it: timings compare on one card only.
    device = next((r["device"] for r in llmc_rows + torch_rows if r.get("device")), None)
    out = []
    for b, t in shapes:
        w, l, p = median(wgrad_rows, b, t), median(llmc_rows, b, t), median(torch_rows, b, t)
        out.append({"device": device, "batch": b, "seq": t, "wgrad_ms": w, "llmc_ms": l, "torch_best_ms": p,
                    "wgrad_over_llmc": ratio(w, l), "wgrad_over_torch": ratio(w, p)})
    if as_json:
        return "\n".join(json.dumps(r) for r in out)

    def cell(v, fmt):
        return format(v, fmt) if v is not None else "failed"

    head = f"{'B x T':>11} {'wgrad ms':>9} {'llm.c ms':>9} {'PyTorch best ms':>16} {'wgrad/llm.c':>12} {'wgrad/PyTorch':>14}"
    rows = []
    for r in out:
        shape = f"{r['batch']} x {r['seq']}"
        rows.append(f"{shape:>11} {cell(r['wgrad_ms'], '.2f'):>9} {cell(r['llmc_ms'], '.2f'):>9} "
                    f"{cell(r['torch_best_ms'], '.2f'):>16} {cell(r['wgrad_over_llmc'], '.2f'):>12} "
                    f"{cell(r['wgrad_over_torch'], '.2f'):>14}")
    return "\n".join([f"device: {device}", head] + rows)


# What llm.c's files hold at the commit .gt/llmc came from (f1e2ace, 2025-05-10), for `check`.
SAMPLE_CUDA_UTILS = """\
int cudaMallocConditionallyManaged(void** out, size_t bytes, const char *file, int line) {
    // try to allocate
    cudaError_t err = cudaMalloc(out, bytes);
    if(err == cudaErrorMemoryAllocation) {
        // if we OOM, fallback to a managed allocation. slower but at least won't crash.
        cudaGetLastError(); // reset the error before the next API call
        cudaCheck_(cudaMallocManaged(out, bytes), file, line);
        cudaCheck_(cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), file, line);
        return 1;
    } else {
        cudaCheck_(err, file, line);
        return 0;
    }
}
"""


def sample_log(n):
    """A train_gpt2cu log as its printf formats write one: header table, val loss, n steps."""
    fmt = "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s"
    lines = ["| device                | %-50s |" % "NVIDIA H100 80GB HBM3", "val loss 11.009888"]
    for s in range(n):
        lines.append(fmt % (s + 1, n, 11.0 - s * 0.01, float("nan") if s == 0 else 0.5, 9.1234,
                            -1.2, 1e-4, 900.0 if s == 0 else 100.0 + s, 41.3, 81234.0))
    lines += ["val loss 10.9", "generating:", "---", "", "---", "total average iteration time: 104.0 ms"]
    return lines


def check():
    patched = unmanage(SAMPLE_CUDA_UTILS)
    assert "cudaCheck_(err, file, line);\n    return 0;" in patched and "return 1" not in patched
    try:
        unmanage(patched)
        raise AssertionError("a second patch should find no fallback")
    except ValueError:
        pass
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.bin")
        write_tokens(path, 1000, seed=1)
        tokens = read_tokens(path)
        assert len(tokens) == 1000 and max(tokens) < VOCAB and len(set(tokens)) > 900
        assert os.path.getsize(path) == 1024 + 2000
    row = steps(sample_log(10), 8, 1024, warmup=5)
    assert row["steps"] == 5 and row["median_ms"] == 107.0 and row["device"] == "NVIDIA H100 80GB HBM3", row
    assert abs(row["loss_last"] - 10.91) < 1e-6, row
    assert "error" in steps(sample_log(3), 8, 1024, warmup=5)
    t = table([{"batch": 8, "seq": 1024, "median_ms": 120.0}], [row], [], [(8, 1024)], as_json=True)
    assert json.loads(t) == {"device": "NVIDIA H100 80GB HBM3", "batch": 8, "seq": 1024,
                             "wgrad_ms": 120.0, "llmc_ms": 107.0, "torch_best_ms": None,
                             "wgrad_over_llmc": 1.121, "wgrad_over_torch": None}, t
    print("llmc_compare.py check: ok")


def main(argv):
    cmd, args = argv[0], argv[1:]
    if cmd == "unmanage":
        with open(args[0]) as f:
            patched = unmanage(f.read())
        with open(args[0], "w") as f:
            f.write(patched)
    elif cmd == "tokens":
        write_tokens(args[0], int(args[1]))
    elif cmd == "steps":
        with open(args[0], errors="replace") as f:
            print(json.dumps(steps(f, int(args[1]), int(args[2]), int(args[3]))))
    elif cmd == "table":
        as_json = "--json" in args
        files = [a for a in args if a != "--json"]
        shapes = [tuple(int(v) for v in s.split("x")) for s in files[3].split(",")]
        print(table(*(read_rows(p) for p in files[:3]), shapes, as_json))
    elif cmd == "check":
        check()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    try:
        main(sys.argv[1:] or ["help"])
    except ValueError as e:
        sys.exit(f"llmc_compare.py: {e}")
