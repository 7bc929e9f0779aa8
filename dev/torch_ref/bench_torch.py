#!/usr/bin/env python3
"""Speed baseline: training steps of the PyTorch MHAR model, timed; and a sweep for the fastest setup.

Two implementations of the same SPEC model (check_fast_model.py proves they agree):
  --impl fast   fast_model.py: per-block nn.Linear, fused QKV and gate/up, RoPE tables, SDPA with
                enable_gqa, aligned LM-head GEMM, routing with cached statistics (the baseline)
  --impl ref    model.py: the float64 reference as written (stacked parameters, RoPE angles per
                forward, repeat_interleave for GQA), for comparison
A step is bf16 autocast forward + backward, clipping at global norm 1.0
(clip_grad_norm_ with foreach), fused AdamW (SPEC 6's betas, eps, decay on the matrices).
Options: --compile-mode (torch.compile's mode, or none), --sdpa (the attention backend, forced
with torch.nn.attention.sdpa_kernel; auto lets torch choose), --gqa (fast: native enable_gqa or
repeat_interleave; auto probes whether the backend takes enable_gqa), --head (fast: vp or v).
It prints one line that names the whole configuration, then the measurements:
    torch <mode> impl fast compile default sdpa cudnn gqa native head vp tok_s N peak_mib N step_ms X loss X graphs N
dev/bench_gpu.sh reads tok_s and peak_mib by name. Timing starts after --warmup steps (they
include compilation); every step takes the next batch of a pool of random tokens.

--sweep runs each configuration in its own process (a failing backend prints its error and the
sweep goes on): first every --sweep-sdpa backend with the first --sweep-modes mode, then the best
backend with each further mode; --sweep-ref adds one run of --impl ref after the first phase.
Runs that would pass --sweep-budget seconds in all are cut (timeout) or skipped. It ends with a
table, the best run's line (same format as above, so bench_gpu.sh can read it) and its flags.

    python3 dev/torch_ref/bench_torch.py --mode std                      # the 100M model, B=16, T=2048
    python3 dev/torch_ref/bench_torch.py --mode mhar --H 8 --compile-mode max-autotune-no-cudagraphs --sdpa cudnn
    python3 dev/torch_ref/bench_torch.py --mode std --sweep --sweep-ref --steps 10 --warmup 3
    python3 dev/torch_ref/bench_torch.py --device cpu --dtype fp32 --L 2 --C 64 --NH 4 --NKV 2 \\
        --F 128 --T 32 --B 2 --steps 3 --warmup 1 --no-compile                # a CPU smoke test
"""
import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fast_model import HAS_GQA, HAS_SDPA, FastMHAR  # noqa: E402
from mhar_io import Config  # noqa: E402
from model import MHAR  # noqa: E402

TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "none"]
CUDAGRAPH_MODES = {"reduce-overhead", "max-autotune"}
SDPA_BACKENDS = ["auto", "cudnn", "flash", "efficient", "math"]
REF_DECAYED = {"wte", "wq", "wk", "wv", "wo", "wg", "wu", "wd"}   # model.py's matrices


def fail(msg):
    sys.exit(f"error: {msg}")


def parse_args(argv=None):
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
    ap.add_argument("--impl", choices=["fast", "ref"], default="fast")
    ap.add_argument("--compile-mode", choices=COMPILE_MODES, default="default")
    ap.add_argument("--no-compile", action="store_true", help="same as --compile-mode none")
    ap.add_argument("--sdpa", choices=SDPA_BACKENDS, default="auto")
    ap.add_argument("--gqa", choices=["auto", "native", "repeat"], default="auto",
                    help="fast: SDPA's enable_gqa, or repeat_interleave of k and v (ref: always repeat)")
    ap.add_argument("--head", choices=["vp", "v"], default="vp",
                    help="fast: LM-head GEMM over all Vp rows then the V columns, or over wte[:V] (ref: v)")
    ap.add_argument("--sweep", action="store_true", help="time each configuration in a subprocess")
    ap.add_argument("--sweep-sdpa", default="cudnn,flash,efficient")
    ap.add_argument("--sweep-modes", default="default,reduce-overhead,max-autotune-no-cudagraphs,max-autotune")
    ap.add_argument("--sweep-ref", action="store_true", help="also time --impl ref once")
    ap.add_argument("--sweep-budget", type=float, default=540, help="seconds for the whole sweep")
    a = ap.parse_args(argv)
    if a.no_compile:
        a.compile_mode = "none"
    for opt, vals, allowed in (("--sweep-sdpa", a.sweep_sdpa, SDPA_BACKENDS),
                               ("--sweep-modes", a.sweep_modes, COMPILE_MODES)):
        bad = [v for v in vals.split(",") if v not in allowed]
        if bad or not vals:
            fail(f"{opt} {vals}: unknown {','.join(bad) or 'empty list'}; choose from {','.join(allowed)}")
    return a


# ------------------------------------------------------------------------------ one run

def sdpa_context(backend):
    """A context that forces one SDPA backend (torch >= 2.3), or nothing for auto."""
    if backend == "auto":
        return contextlib.nullcontext()
    if not HAS_SDPA or TORCH_VERSION < (2, 3):
        fail(f"--sdpa {backend} needs torch >= 2.3 (torch.nn.attention.sdpa_kernel), have "
             f"{torch.__version__}; pass --sdpa auto")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    names = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION",
             "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
    return sdpa_kernel([getattr(SDPBackend, names[backend])])


def probe_sdpa(cfg, device, dtype, gqa):
    """Run SDPA (forward and backward) once on small tensors of the model's head layout, under
    the active backend setting. Returns (works, the backend torch picks as a name or None)."""
    T = min(cfg.T, 256)
    kv_heads = cfg.NKV if gqa else cfg.NH
    def mk(heads):  # (1, heads, T, HD) viewed from (1, T, heads, HD), as the models pass them;
        # zeros: no draws, so the model's initialisation does not depend on the probe
        return torch.zeros(1, T, heads, cfg.HD, device=device, dtype=dtype).transpose(1, 2).requires_grad_()
    q, k, v = mk(cfg.NH), mk(kv_heads), mk(kv_heads)
    kw = {"enable_gqa": True} if gqa else {}
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw).sum().backward()
    except (RuntimeError, NotImplementedError):
        return False, None
    try:
        from torch.nn.attention import SDPBackend
        choice = int(torch._fused_sdp_choice(q, k, v, is_causal=True, **kw))
        names = {int(b): n.lower().replace("_attention", "") for n, b in SDPBackend.__members__.items()}
        return True, names.get(choice)
    except Exception:  # the private chooser is only for the label
        return True, None


def build(a, cfg):
    """The model, its decayed and other parameters, and the labels of the attention setup."""
    dev_dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    sdpa_label = a.sdpa if HAS_SDPA else "none"
    if not HAS_SDPA and a.sdpa != "auto":
        fail(f"--sdpa {a.sdpa}: torch {torch.__version__} has no F.scaled_dot_product_attention; pass --sdpa auto")
    if a.impl == "ref":
        gqa = "repeat"                     # model.py repeats k and v; it slices wte[:V]
        model = MHAR(cfg)
        decay = [p for n, p in model.named_parameters() if n in REF_DECAYED]
        other = [p for n, p in model.named_parameters() if n not in REF_DECAYED]
        head = "v"
    else:
        if a.gqa == "native" and not HAS_GQA:
            fail(f"--gqa native needs torch >= 2.5 (enable_gqa), have {torch.__version__}; pass --gqa repeat")
        gqa = a.gqa
        if gqa == "auto":
            gqa = "native" if HAS_GQA and probe_sdpa(cfg, a.device, dev_dtype, True)[0] else "repeat"
        attn = "plain" if not HAS_SDPA else ("sdpa_gqa" if gqa == "native" else "sdpa_repeat")
        model = FastMHAR(cfg, attn=attn, head=a.head)
        decay = model.matrices()
        ids = {id(p) for p in decay}
        other = [p for p in model.parameters() if id(p) not in ids]
        head = a.head
    if HAS_SDPA and a.sdpa == "auto":
        works, chosen = probe_sdpa(cfg, a.device, dev_dtype, gqa == "native")
        sdpa_label = f"auto:{chosen}" if works and chosen else "auto"
    return model.to(a.device), decay, other, f"sdpa {sdpa_label} gqa {gqa} head {head}"


def run_one(a):
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        fail("no CUDA device for --device cuda; pass --device cpu for a smoke test")
    compile_mode = a.compile_mode
    if compile_mode != "none" and not hasattr(torch, "compile"):
        fail(f"--compile-mode {compile_mode} needs torch.compile (torch >= 2.0), have {torch.__version__}; "
             "pass --compile-mode none")
    cuda = a.device.startswith("cuda")
    cfg = Config(V=a.V, Vp=(a.V + 127) // 128 * 128, T=a.T, L=a.L, C=a.C, NH=a.NH, NKV=a.NKV, F=a.F,
                 mode=a.mode, H=a.H if a.mode == "mhar" else 1, S=a.S if a.mode == "mhar" else 1)
    torch.manual_seed(1337)
    with sdpa_context(a.sdpa):
        model, decay, other, attn_label = build(a, cfg)
        fused = {"fused": True} if cuda and TORCH_VERSION >= (2, 0) else {}
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                                lr=5e-4, betas=(0.9, 0.95), eps=1e-8, **fused)
        params = list(model.parameters())
        foreach = {"foreach": True} if cuda and TORCH_VERSION >= (2, 0) else {}
        run = model if compile_mode == "none" else \
            torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
        mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None) \
            if compile_mode in CUDAGRAPH_MODES else None
        pool = []
        for _ in range(4):
            tok = torch.randint(0, a.V, (a.B, a.T + 1), device=a.device)
            pool.append((tok[:, :-1].contiguous(), tok[:, 1:].contiguous()))

        def step(i):
            if mark_step is not None:
                mark_step()
            x, y = pool[i % len(pool)]
            with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16,
                                enabled=a.dtype == "bf16"):
                loss = run(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0, **foreach)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        def sync():
            if cuda:
                torch.cuda.synchronize()

        for i in range(a.warmup):
            step(i)
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for i in range(a.steps):
            loss = step(i)
        sync()
        dt = time.perf_counter() - t0
    tok_s = a.steps * a.B * a.T / dt
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
    graphs = "-"
    if compile_mode != "none":
        try:
            graphs = str(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        except Exception:  # the counter is only informative
            pass
    name = a.mode if a.mode == "std" else f"mhar_H{a.H}_S{a.S}"
    print(f"torch {name} impl {a.impl} compile {compile_mode} {attn_label} tok_s {tok_s:.0f} "
          f"peak_mib {peak:.0f} step_ms {1000 * dt / a.steps:.1f} loss {loss.item():.4f} graphs {graphs}",
          flush=True)


# ------------------------------------------------------------------------------ the sweep

def child_flags(a, impl, mode, sdpa):
    flags = ["--mode", a.mode, "--H", str(a.H), "--S", str(a.S)]
    for name in ("L", "C", "NH", "NKV", "F", "V", "T", "B", "steps", "warmup"):
        flags += [f"--{name}", str(getattr(a, name))]
    flags += ["--device", a.device, "--dtype", a.dtype, "--impl", impl, "--compile-mode", mode, "--sdpa", sdpa]
    if impl == "fast":
        flags += ["--gqa", a.gqa, "--head", a.head]
    return flags


def run_child(flags, timeout):
    """Run one configuration; returns (its 'torch ...' line or None, error text, seconds)."""
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + flags, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the run and its compile workers
        proc.communicate()
        return None, f"timeout after {timeout:.0f} s", time.time() - t0
    line = next((l for l in out.splitlines() if l.startswith("torch ")), None)
    if proc.returncode != 0 or line is None:
        lines = [l for l in err.splitlines() if l.strip()]
        return None, f"exit {proc.returncode}: " + (lines[-1].strip() if lines else "no output"), time.time() - t0
    return line, "", time.time() - t0


def field(line, key):
    toks = line.split()
    return toks[toks.index(key) + 1]


def sweep(a):
    start = time.time()
    modes, backends = a.sweep_modes.split(","), a.sweep_sdpa.split(",")
    results = []   # (impl, mode, sdpa, line or None, error)

    def go(impl, mode, sdpa):
        left = a.sweep_budget - (time.time() - start)
        label = f"impl {impl} compile {mode} sdpa {sdpa}"
        if left < 30:
            results.append((impl, mode, sdpa, None, "skipped: sweep budget spent"))
            print(f"sweep {label}: skipped (budget)", flush=True)
            return
        line, err, secs = run_child(child_flags(a, impl, mode, sdpa), left)
        results.append((impl, mode, sdpa, line, err))
        what = f"tok_s {field(line, 'tok_s')} peak_mib {field(line, 'peak_mib')}" if line else f"FAILED: {err}"
        print(f"sweep {label}: {what} ({secs:.0f} s)", flush=True)

    for sdpa in backends:
        go("fast", modes[0], sdpa)
    ok = [r for r in results if r[3]]
    best_sdpa = max(ok, key=lambda r: float(field(r[3], "tok_s")))[2] if ok else backends[0]
    if a.sweep_ref:
        go("ref", modes[0], "auto")
    for mode in modes[1:]:
        go("fast", mode, best_sdpa)

    print(f"\n{'impl':<5} {'compile':<27} {'sdpa':<16} {'gqa':<7} {'tok_s':>9} {'peak_mib':>9}  (sweep, {time.time() - start:.0f} s)")
    for impl, mode, sdpa, line, err in results:
        if line:
            print(f"{impl:<5} {mode:<27} {field(line, 'sdpa'):<16} {field(line, 'gqa'):<7} "
                  f"{field(line, 'tok_s'):>9} {field(line, 'peak_mib'):>9}")
        else:
            print(f"{impl:<5} {mode:<27} {sdpa:<16} {'-':<7} {'-':>9} {'-':>9}  {err}")
    ok = [r for r in results if r[3]]
    if not ok:
        fail("no configuration of the sweep ran; see the errors above")
    best = max(ok, key=lambda r: float(field(r[3], "tok_s")))
    print("\nbest:")
    print(best[3])
    flags = f"--impl {best[0]} --compile-mode {best[1]} --sdpa {best[2]}"
    if best[0] == "fast":
        flags += f" --gqa {field(best[3], 'gqa')} --head {field(best[3], 'head')}"
    print(f"best flags: {flags}")


def main():
    a = parse_args()
    if a.sweep:
        sweep(a)
    else:
        run_one(a)


if __name__ == "__main__":
    main()
