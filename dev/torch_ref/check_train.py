#!/usr/bin/env python3
"""Check the C trainer's optimisation against PyTorch: AdamW, clipping, LR schedule, accumulation.

check_grads.py shows that the hand-written gradients are right. This script checks what the
trainer does with them. The CPU and the CUDA trainer share that logic, so a bug in it would hit
both, and their comparison with each other could not catch it. Here torch.optim.AdamW (its own
implementation) continues a C training run, step for step:

  1. ./train_mhar (float32) trains a tiny model for 6 steps with gradient accumulation
     (2 micro-batches per step), weight decay, an LR schedule with warmup, and a clip value that
     some steps' gradient norms exceed and others do not (about 1.2 to 1.4 here, clip 1.3).
     It writes a checkpoint after every step.
  2. From the step-1 checkpoint (parameters, AdamW m and v), PyTorch in float64 takes steps 2..6
     on the same batches: the loss averaged over the micro-batches, the global norm clipped as
     SPEC section 6 says, torch.optim.AdamW with weight decay on the matrices only, and the LR
     of SPEC's schedule (linear warmup, then cosine to 0.1x peak).
  3. It compares the losses of steps 2..6, and the parameters, m and v after step 6, per tensor.

Tolerance: the C side runs in float32, so each step's gradients carry relative errors of about
1e-6. Adam divides by sqrt(v), which limits each update to about lr, and the differences stay
near 1e-6 of each tensor's scale (measured: at most 7e-6). A wrong schedule, bias correction,
decay set or clip gives 1e-3 or more. We allow 1e-4, relative to the largest value of each
tensor. Losses must agree to 1e-5 (float32 forward, measured ~1e-7). The gradient norm must agree
to 1e-4, because the log prints it with 4 decimals.

    /usr/bin/python3 dev/torch_ref/check_train.py [--trainer ./train_mhar] [--keep]
Ends with "N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mhar_io import read_checkpoint, write_shard  # noqa: E402
from model import MHAR  # noqa: E402

DECAYED = {"wte", "wq", "wk", "wv", "wo", "wg", "wu", "wd"}   # matrices (README: -wd)
DELTA_NEW = {"rq", "rg", "dnull", "dalpha"}   # delta's new parameters: learning rate -lr_new x -lr
TOL = 1e-4

RUN = dict(B=2, T=16, accum=2, steps=6, lr=1e-2, warmup=2, lr_min=0.1, wd=0.1,
           beta1=0.9, beta2=0.95, eps=1e-8, clip=1.3, V=97)
# mode -> (flags, clip). The clip lies inside each mode's range of gradient norms over the 6
# steps, so that clipped and unclipped steps both occur: std and block2 run at 1.16 .. 1.43;
# hc's are lower, 0.98 .. 1.06, so hc clips at 1.01 (steps 2, 3 unclipped, 4 .. 6 clipped).
MODES = {
    "std": (["-r", "std"], RUN["clip"]),
    "block2": (["-r", "mhar", "-H", "4", "-S", "2"], RUN["clip"]),
    "hc4": (["-r", "hc", "-hc_n", "4"], 1.01),   # alpha, A, beta stay out of DECAYED (SPEC section 8)
    # SPEC 9 from its init (alpha = 0 at step 1); the new parameters at half the learning rate
    "delta": (["-r", "delta", "-H", "2", "-S", "2", "-lr_new", "0.5"], RUN["clip"]),
}


def lr_at(step, r):
    """SPEC section 6: linear warmup to the peak, then cosine decay to lr_min * peak at the last step."""
    if step < r["warmup"]:
        return r["lr"] * (step + 1) / r["warmup"]
    lo = r["lr"] * r["lr_min"]
    progress = (step - r["warmup"]) / (r["steps"] - 1 - r["warmup"])
    return lo + 0.5 * (1 + math.cos(math.pi * progress)) * (r["lr"] - lo)


def worst(*errs):
    """The largest error; NaN when any is NaN (Python's max would drop it and pass a NaN run)."""
    return math.nan if any(math.isnan(e) for e in errs) else max(errs)


def rel_err(a, b):
    """max|a - b| / max|b|; NaN when either holds a NaN (np.max propagates it)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not b.size:
        return 0.0
    return float(np.max(np.abs(a - b)) / worst(float(np.max(np.abs(b))), 1e-30))


def check_mode(name, flags, clip, trainer, tmp, results):
    r = dict(RUN, clip=clip)
    d = os.path.join(tmp, name)
    shard = os.path.join(tmp, "train.bin")
    cmd = [trainer, "-preset", "test", "-V", str(r["V"]), *flags, "-b", str(r["B"]), "-T", str(r["T"]),
           "-d", str(r["B"] * r["T"] * r["accum"]), "-n", str(r["steps"]), "-lr", str(r["lr"]),
           "-warmup", str(r["warmup"]), "-lr_min", str(r["lr_min"]), "-wd", str(r["wd"]),
           "-clip", str(r["clip"]), "-i", shard, "-j", "", "-val_every", "0", "-sample_every", "0",
           "-ckpt_every", "1", "-o", d]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        results.append((False, f"{name}: trainer failed: {run.stderr.strip()}"))
        return
    c_losses, c_norms = {}, {}
    for line in open(os.path.join(d, "log.txt")):
        f = line.split()
        if f[2] == "train_loss":
            c_losses[int(f[1])] = float(f[3])
            c_norms[int(f[1])] = float(f[7])

    start = read_checkpoint(os.path.join(d, "ckpt_000001.bin"))
    end = read_checkpoint(os.path.join(d, f"ckpt_{r['steps']:06d}.bin"))
    model = MHAR(start.cfg).double()
    model.load_checkpoint(start)
    params = dict(model.named_parameters())
    new = DELTA_NEW if start.cfg.mode == "delta" else set()
    lr_new = float(flags[flags.index("-lr_new") + 1]) if "-lr_new" in flags else 1.0
    groups = [{"params": [p for n, p in params.items() if n in DECAYED], "weight_decay": r["wd"]},
              {"params": [p for n, p in params.items() if n not in DECAYED and n not in new], "weight_decay": 0.0},
              {"params": [p for n, p in params.items() if n in new], "weight_decay": 0.0, "lr_mult": lr_new}]
    opt = torch.optim.AdamW(groups, lr=r["lr"], betas=(r["beta1"], r["beta2"]), eps=r["eps"], foreach=False)
    for n, p in params.items():   # continue from the C run's AdamW state after step 1
        opt.state[p] = {"step": torch.tensor(1.0),
                        "exp_avg": torch.from_numpy(start.m[n].astype(np.float64)),
                        "exp_avg_sq": torch.from_numpy(start.v[n].astype(np.float64))}

    tokens = np.fromfile(shard, dtype="<u2", offset=1024).astype(np.int64)
    BT = r["B"] * r["T"]
    worst_loss, worst_norm, clipped = 0.0, 0.0, 0
    for step in range(1, r["steps"]):   # 0-based step index; the log numbers it step + 1
        opt.zero_grad()
        loss_sum = 0.0
        for micro in range(r["accum"]):
            pos = (step * r["accum"] + micro) * BT   # the C loader reads the shard front to back
            x = torch.from_numpy(tokens[pos:pos + BT]).view(r["B"], r["T"])
            y = torch.from_numpy(tokens[pos + 1:pos + BT + 1]).view(r["B"], r["T"])
            loss = model(x, y)
            (loss / r["accum"]).backward()
            loss_sum += loss.item()
        loss_mean = loss_sum / r["accum"]
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params.values()))
        if norm > r["clip"]:   # SPEC section 6: clip the global norm at the clip value
            clipped += 1
            for p in params.values():
                p.grad.mul_(r["clip"] / norm)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, r) * g.get("lr_mult", 1.0)
        opt.step()
        worst_loss = worst(worst_loss, abs(loss_mean - c_losses[step + 1]) / abs(c_losses[step + 1]))
        worst_norm = worst(worst_norm, abs(norm - c_norms[step + 1]) / c_norms[step + 1])
    results.append((worst_loss < 1e-5, f"{name}: losses of steps 2-{r['steps']} (worst rel {worst_loss:.2e})"))
    results.append((worst_norm < 1e-4, f"{name}: gradient norms of steps 2-{r['steps']} (worst rel {worst_norm:.2e})"))
    results.append((0 < clipped < r["steps"] - 1,
                    f"{name}: clipped and unclipped steps both occur ({clipped} of {r['steps'] - 1} clipped)"))
    state = {n: opt.state[p] for n, p in params.items()}
    for n, p in params.items():
        e = worst(rel_err(p.detach().numpy(), end.params[n]),
                rel_err(state[n]["exp_avg"].numpy(), end.m[n]),
                rel_err(state[n]["exp_avg_sq"].numpy(), end.v[n]))
        results.append((e < TOL, f"{name}: {n:5s} parameters, m and v after step {r['steps']} (worst rel {e:.2e})"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default="./train_mhar")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    if not os.access(args.trainer, os.X_OK):
        print(f"error: {args.trainer} not found; fix: run make train_mhar first")
        print("0 passed, 1 failed")
        sys.exit(1)
    torch.set_default_dtype(torch.float64)
    tmp = tempfile.mkdtemp(prefix="mhar_check_train_")
    rng = np.random.default_rng(5)
    write_shard(os.path.join(tmp, "train.bin"), rng.integers(0, RUN["V"], 4000))
    results = []
    for name, (flags, clip) in MODES.items():
        check_mode(name, flags, clip, args.trainer, tmp, results)
    for ok, msg in results:
        print(("ok   " if ok else "FAIL ") + msg)
    npass = sum(ok for ok, _ in results)
    print(f"{npass} passed, {len(results) - npass} failed")
    if args.keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp)
    sys.exit(0 if npass == len(results) else 1)


if __name__ == "__main__":
    main()
