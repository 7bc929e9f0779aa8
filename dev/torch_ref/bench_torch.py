#!/usr/bin/env python3
"""Speed baseline: one training step of the PyTorch MHAR model (model.py), timed.

On a GPU this is the baseline of issue 5. It applies torch.compile (when torch has it), bf16
autocast, SDPA attention (model.py on torch 2.x), fused AdamW and clipping at 1.0. It prints one
line:
    torch <mode> tok_s <tokens per second> peak_mib <torch.cuda.max_memory_allocated in MiB>
dev/bench_gpu.sh reads that line. Timing starts after --warmup steps, which include the
compilation. Every step draws a fresh random batch from a pool made beforehand.

    python3 dev/torch_ref/bench_torch.py --mode mhar --H 8            # the 100M model, B=16, T=2048
    python3 dev/torch_ref/bench_torch.py --device cpu --dtype fp32 --L 2 --C 64 --NH 4 --NKV 2 \\
        --F 128 --T 32 --B 2 --steps 3 --warmup 1 --no-compile        # a smoke test on a CPU
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mhar_io import Config  # noqa: E402
from model import MHAR  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["std", "mhar"], default="std")
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--S", type=int, default=1)
    for name, default in (("L", 12), ("C", 512), ("NH", 8), ("NKV", 4), ("F", 1536), ("V", 50257)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device for --device cuda; pass --device cpu for a smoke test")

    cfg = Config(V=a.V, Vp=(a.V + 127) // 128 * 128, T=a.T, L=a.L, C=a.C, NH=a.NH, NKV=a.NKV, F=a.F,
                 mode=a.mode, H=a.H if a.mode == "mhar" else 1, S=a.S if a.mode == "mhar" else 1)
    torch.manual_seed(1337)
    model = MHAR(cfg).to(a.device)
    decay = [p for n, p in model.named_parameters() if n in {"wte", "wq", "wk", "wv", "wo", "wg", "wu", "wd"}]
    other = [p for n, p in model.named_parameters() if n not in {"wte", "wq", "wk", "wv", "wo", "wg", "wu", "wd"}]
    fused = {"fused": True} if a.device == "cuda" and torch.__version__ >= "2" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=5e-4, betas=(0.9, 0.95), eps=1e-8, **fused)
    run = model
    if not a.no_compile and hasattr(torch, "compile"):
        run = torch.compile(model)
    pool = [torch.randint(0, a.V, (a.B, a.T + 1), device=a.device) for _ in range(4)]

    def step(i):
        batch = pool[i % len(pool)]
        with torch.autocast(device_type="cuda" if a.device == "cuda" else "cpu", dtype=torch.bfloat16,
                            enabled=a.dtype == "bf16"):
            loss = run(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    for i in range(a.warmup):
        step(i)
    sync()
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(a.steps):
        loss = step(i)
    sync()
    dt = time.perf_counter() - t0
    tok_s = a.steps * a.B * a.T / dt
    peak = torch.cuda.max_memory_allocated() / 2**20 if a.device == "cuda" else 0.0
    name = a.mode if a.mode == "std" else f"mhar_H{a.H}_S{a.S}"
    print(f"torch {name} tok_s {tok_s:.0f} peak_mib {peak:.0f} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
