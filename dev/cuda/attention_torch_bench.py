#!/usr/bin/env python3
"""PyTorch's own causal GQA attention, timed at the lab's shapes, beside dev/cuda/attention --bench.

torch.nn.functional.scaled_dot_product_attention (is_causal=True, bf16) with each backend forced
by torch.nn.attention.sdpa_kernel: FLASH_ATTENTION and CUDNN_ATTENTION by default. q is allocated
(B, T, NH, HD) and k, v (B, T, NKV, HD) as the trainer stores them, then viewed as (B, heads, T, HD)
(no copy). GQA: enable_gqa=True where the backend takes it ("gqa native"); where it refuses, k and v
are repeated to NH heads before the timed region ("gqa repeat": the kernel then reads G times the
K/V bytes and the backward returns per-query-head dk, dv without the sum over the group, which is
left out of the time). Forward and backward are timed apart with CUDA events: the median of --reps
calls after --warmup calls; the backward is torch.autograd.grad of the forward's output with a
fixed dout in the output's strides. TFLOP/s use the lab's counts: forward 4 HD, backward 10 HD per (query, key) pair of the
causal triangle, pairs = B NH T (T + 1) / 2.

    /opt/torch/.venv/bin/python dev/cuda/attention_torch_bench.py
    /opt/torch/.venv/bin/python dev/cuda/attention_torch_bench.py --shape 16,2048,8,4,64 --backends cudnn
One line per (shape, backend): "sdpa BACKEND B,T,NH,NKV,HD gqa native|repeat fwd X ms Y TFLOP/s bwd X ms
Y TFLOP/s", or "sdpa BACKEND ...: unavailable (reason)". Exit 1 when no backend ran at all.
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "math": "MATH"}
DEFAULT_SHAPES = ["16,2048,8,4,64", "16,1024,16,8,128"]   # 100m; 350m/1b's HD = 128


def fail(msg):
    print(f"attention_torch_bench.py: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_shape(text):
    try:
        B, T, NH, NKV, HD = (int(x) for x in text.split(","))
    except ValueError:
        fail(f"--shape {text!r}: want B,T,NH,NKV,HD (five integers), e.g. 16,2048,8,4,64")
    if min(B, T, NH, NKV, HD) <= 0 or NH % NKV:
        fail(f"--shape {text!r}: need positive sizes and NH a multiple of NKV")
    return B, T, NH, NKV, HD


def time_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def bench(backend, shape, warmup, reps):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, T, NH, NKV, HD = shape
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda heads: torch.randn(B, T, heads, HD, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v = mk(NH).transpose(1, 2), mk(NKV).transpose(1, 2), mk(NKV).transpose(1, 2)
    ctx = lambda: sdpa_kernel([getattr(SDPBackend, BACKENDS[backend])])
    mode, kw, kk, vv = "native", {"enable_gqa": True}, k, v
    try:
        with ctx():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
        torch.cuda.synchronize()
    except (RuntimeError, TypeError):
        mode, kw = "repeat", {}
        kk, vv = k.repeat_interleave(NH // NKV, dim=1), v.repeat_interleave(NH // NKV, dim=1)
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, kk, vv))
    with ctx():
        fwd = time_ms(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, **kw), warmup, reps)
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, **kw)
        dout = torch.empty_like(out).normal_(generator=g)   # empty_like keeps out's strides
        bwd = time_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True), warmup, reps)
    pairs = B * NH * T * (T + 1) / 2
    return mode, fwd, 4 * HD * pairs / (fwd * 1e-3) / 1e12, bwd, 10 * HD * pairs / (bwd * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", action="append", help="B,T,NH,NKV,HD (repeatable; default: the 100m and HD=128 shapes)")
    ap.add_argument("--backends", default="flash,cudnn", help="comma list of " + ",".join(BACKENDS))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    backends = a.backends.split(",")
    for b in backends:
        if b not in BACKENDS:
            fail(f"--backends: unknown backend {b!r}; choose from {','.join(BACKENDS)}")
    if a.reps < 1 or a.warmup < 0:
        fail(f"--reps {a.reps} --warmup {a.warmup}: need reps >= 1 and warmup >= 0")
    if not torch.cuda.is_available():
        fail("no CUDA device visible to torch; run on the GPU machine")
    shapes = [parse_shape(s) for s in (a.shape or DEFAULT_SHAPES)]
    print(f"torch {torch.__version__}, cuda {torch.version.cuda}, cudnn {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}; median of {a.reps} after {a.warmup} warm-up calls")
    ran = 0
    for shape in shapes:
        tag = ",".join(str(x) for x in shape)
        for b in backends:
            try:
                mode, fwd, ftf, bwd, btf = bench(b, shape, a.warmup, a.reps)
            except Exception as e:   # a backend that refuses the shape: say so, go on with the others
                print(f"sdpa {b:<6} {tag:<18} unavailable ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
                continue
            ran += 1
            print(f"sdpa {b:<6} {tag:<18} gqa {mode:<6} fwd {fwd:7.3f} ms {ftf:6.1f} TFLOP/s   "
                  f"bwd {bwd:7.3f} ms {btf:6.1f} TFLOP/s", flush=True)
    sys.exit(0 if ran else 1)


if __name__ == "__main__":
    main()
