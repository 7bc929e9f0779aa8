#!/usr/bin/env python3
"""Speed baseline: training steps of the PyTorch MHAR model, timed; a sweep for the fastest setup,
and a hunt for what separates the baseline from a plain whole-model compile.

Three implementations of the same SPEC model (check_fast_model.py proves they agree):
  --impl fast   fast_model.py: per-block nn.Linear, fused QKV and gate/up, RoPE tables, SDPA with
                enable_gqa, aligned LM-head GEMM, routing with cached statistics (the baseline)
  --impl plain  plain_model.py (std only): the model as a PyTorch user writes it from SPEC,
                nanoGPT style (nn.Linear per matrix, RMSNorm modules with F.rms_norm, nn.Embedding
                tied to the head), a control for fast
  --impl ref    model.py: the float64 reference as written (stacked parameters, RoPE angles per
                forward, repeat_interleave for GQA), for comparison
A step is bf16 autocast forward + backward, clipping at global norm 1.0
(clip_grad_norm_ with foreach), fused AdamW (SPEC 6's betas, eps, decay on the matrices).
Options: --compile-mode (torch.compile's mode, or none), --sdpa (the attention backend, forced
with torch.nn.attention.sdpa_kernel; auto lets torch choose), --gqa (fast, plain: native
enable_gqa or repeat_interleave; auto probes whether the backend takes enable_gqa), --head
(fast, plain: vp or v), --norm (fast, plain: manual = model.py's rmsnorm, fused = F.rms_norm;
auto = manual for fast, fused for plain where torch has it), --loss-masked (fast, plain: the loss
over all Vp columns with the padded ones at -inf, SPEC's loss without slicing the logits).
Diagnostic switches (fast, plain; the defaults are the baseline): --no-clip (no clip_grad_norm_;
any impl), --loss-vp (cross-entropy over all Vp columns: NOT SPEC's model, the padded logits
enter the softmax; only to time it), --residual-dtype bf16 (the residual stream in bf16, the
autocast dtype, instead of float32).
It prints one line that names the whole configuration, then the measurements:
    torch <mode> impl fast compile default sdpa flash gqa native head vp norm manual ce v resid fp32
      clip 1.0 tok_s N peak_mib N step_ms X loss X graphs N warmup_s X
dev/bench_gpu.sh reads tok_s and peak_mib by name. Timing starts after --warmup steps (they
include compilation; warmup_s is their time); every step takes the next batch of a pool of
random tokens. One seed gives fast and plain the same parameters and batches, so their loss
agrees to bf16 rounding.

--sweep runs each configuration in its own process (a failing backend prints its error and the
sweep goes on): first every --sweep-sdpa backend with the first --sweep-modes mode, then the best
backend with each further mode; --sweep-ref adds one run of --impl ref after the first phase.
Runs that would pass --sweep-budget seconds in all are cut (timeout) or skipped. It ends with a
table, the best run's line (same format as above, so bench_gpu.sh can read it) and its flags.

--hunt (std) times, each in its own process within --hunt-budget seconds, the baseline (fast),
plain, then fast with one switch flipped at a time (no-clip, loss-vp, loss-masked, norm fused,
head v, residual bf16), then plain variants; base flags --compile-mode default --sdpa flash --gqa native
--head vp unless given. --hunt-runs picks runs by name, --hunt-logs keeps each run's output.
It ends with a table, best first, with each run's speed relative to fast, the best flags, and the
best "same-work" flags: the fastest run with clipping on and SPEC's loss over V (what our trainer
does; --loss-masked counts, --loss-vp and --no-clip do not).

    python3 dev/torch_ref/bench_torch.py --mode std                      # the 100M model, B=16, T=2048
    python3 dev/torch_ref/bench_torch.py --mode mhar --H 8 --compile-mode max-autotune-no-cudagraphs --sdpa cudnn
    python3 dev/torch_ref/bench_torch.py --mode std --sweep --sweep-ref --steps 10 --warmup 3
    python3 dev/torch_ref/bench_torch.py --hunt --hunt-logs hunt_logs     # ~280 s on an H200
    python3 dev/torch_ref/bench_torch.py --device cpu --dtype fp32 --L 2 --C 64 --NH 4 --NKV 2 \\
        --F 128 --T 32 --B 2 --steps 3 --warmup 1 --no-compile [--impl plain]   # a CPU smoke test
"""
import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

T_START = time.time()   # --hunt's budget counts from here, so it covers importing torch too

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fast_model import HAS_GQA, HAS_RMS_NORM, HAS_SDPA, FastMHAR  # noqa: E402
from mhar_io import Config  # noqa: E402
from model import MHAR  # noqa: E402
from plain_model import PlainGPT  # noqa: E402

TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "none"]
CUDAGRAPH_MODES = {"reduce-overhead", "max-autotune"}
SDPA_BACKENDS = ["auto", "cudnn", "flash", "efficient", "math"]
REF_DECAYED = {"wte", "wq", "wk", "wv", "wo", "wg", "wu", "wd"}   # model.py's matrices
# --hunt's runs, the most informative first: the baseline, the plain model (a model-code cause
# shows as plain > fast), then fast with one switch flipped (a harness or layout cause shows as
# that run > fast), then plain variants (which of plain's differences matters, and the
# nanoGPT-style harness without clipping and with the loss over Vp)
HUNT_RUNS = [
    ("fast", []),
    ("plain", ["--impl", "plain"]),
    ("fast-no-clip", ["--no-clip"]),
    ("fast-loss-vp", ["--loss-vp"]),
    ("fast-loss-masked", ["--loss-masked"]),
    ("fast-norm-fused", ["--norm", "fused"]),
    ("fast-head-v", ["--head", "v"]),
    ("fast-resid-bf16", ["--residual-dtype", "bf16"]),
    ("plain-norm-manual", ["--impl", "plain", "--norm", "manual"]),
    ("plain-no-clip-loss-vp", ["--impl", "plain", "--no-clip", "--loss-vp"]),
    ("plain-loss-masked-resid-bf16", ["--impl", "plain", "--loss-masked", "--residual-dtype", "bf16"]),
]


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
    ap.add_argument("--impl", choices=["fast", "plain", "ref"], default="fast",
                    help="fast_model.py (the baseline), plain_model.py (std only), or model.py")
    ap.add_argument("--compile-mode", choices=COMPILE_MODES, default="default")
    ap.add_argument("--no-compile", action="store_true", help="same as --compile-mode none")
    ap.add_argument("--sdpa", choices=SDPA_BACKENDS, default=None, help="default auto (--hunt: flash)")
    ap.add_argument("--gqa", choices=["auto", "native", "repeat"], default=None,
                    help="fast, plain: SDPA's enable_gqa, or repeat_interleave of k and v (ref: always "
                         "repeat); default auto (--hunt: native)")
    ap.add_argument("--head", choices=["vp", "v"], default="vp",
                    help="fast, plain: LM-head GEMM over all Vp rows then the V columns, or over wte[:V] (ref: v)")
    ap.add_argument("--norm", choices=["auto", "manual", "fused"], default="auto",
                    help="fast, plain: model.py's rmsnorm (manual) or F.rms_norm (fused, torch >= 2.4); "
                         "auto: manual for fast, fused for plain where torch has it")
    ap.add_argument("--no-clip", action="store_true", help="diagnostic: skip clip_grad_norm_")
    ap.add_argument("--loss-vp", action="store_true",
                    help="diagnostic only (fast, plain): cross-entropy over all Vp columns, so the padded "
                         "logits enter the softmax: a slightly different model from SPEC's")
    ap.add_argument("--loss-masked", action="store_true",
                    help="fast, plain: cross-entropy over all Vp columns with the padded ones at -inf: "
                         "SPEC's loss without the sliced copy of the logits (needs --head vp)")
    ap.add_argument("--residual-dtype", choices=["fp32", "bf16"], default="fp32",
                    help="diagnostic (fast, plain; needs --dtype bf16): bf16 keeps the residual stream in the "
                         "autocast dtype instead of the embedding's float32")
    ap.add_argument("--sweep", action="store_true", help="time each configuration in a subprocess")
    ap.add_argument("--sweep-sdpa", default="cudnn,flash,efficient")
    ap.add_argument("--sweep-modes", default="default,reduce-overhead,max-autotune-no-cudagraphs,max-autotune")
    ap.add_argument("--sweep-ref", action="store_true", help="also time --impl ref once")
    ap.add_argument("--sweep-budget", type=float, default=540, help="seconds for the whole sweep")
    ap.add_argument("--hunt", action="store_true",
                    help="time the baseline, plain, and single-switch variants, each in a subprocess (std); "
                         "--impl, --norm and the diagnostic switches are what it varies, so it ignores them")
    ap.add_argument("--hunt-budget", type=float, default=280,
                    help="seconds for the whole hunt, from the start of this process")
    ap.add_argument("--hunt-runs", default=",".join(n for n, _ in HUNT_RUNS),
                    help="the hunt's runs by name, in this order")
    ap.add_argument("--hunt-run-max", type=float, default=150, help="seconds at most for one hunt run")
    ap.add_argument("--hunt-logs", default="", help="a folder for each hunt run's stdout and stderr")
    a = ap.parse_args(argv)
    if a.loss_vp and a.loss_masked:
        fail("--loss-vp and --loss-masked are two forms of the loss; give one")
    a.ce = "vp" if a.loss_vp else "masked" if a.loss_masked else "v"
    if a.no_compile:
        a.compile_mode = "none"
    a.sdpa = a.sdpa or ("flash" if a.hunt else "auto")
    a.gqa = a.gqa or ("native" if a.hunt else "auto")
    names = dict(HUNT_RUNS)
    bad = [n for n in a.hunt_runs.split(",") if n not in names]
    if bad or not a.hunt_runs:
        fail(f"--hunt-runs {a.hunt_runs}: unknown {','.join(bad) or 'empty list'}; choose from {','.join(names)}")
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
        if a.norm != "auto" or a.ce != "v" or a.residual_dtype != "fp32":
            fail("--impl ref is model.py as written: --norm, --loss-vp/--loss-masked and --residual-dtype are for "
                 "--impl fast and plain")
        gqa, head, norm = "repeat", "v", "manual"   # model.py repeats k and v; it slices wte[:V]
        model = MHAR(cfg)
        decay = [p for n, p in model.named_parameters() if n in REF_DECAYED]
        other = [p for n, p in model.named_parameters() if n not in REF_DECAYED]
    else:
        if a.impl == "plain" and cfg.mode != "std":
            fail(f"--impl plain is std only (plain_model.py), not --mode {cfg.mode}")
        if a.gqa == "native" and not HAS_GQA:
            fail(f"--gqa native needs torch >= 2.5 (enable_gqa), have {torch.__version__}; pass --gqa repeat")
        norm = a.norm if a.norm != "auto" else "fused" if a.impl == "plain" and HAS_RMS_NORM else "manual"
        if norm == "fused" and not HAS_RMS_NORM:
            fail(f"--norm fused needs F.rms_norm (torch >= 2.4), have {torch.__version__}; pass --norm manual")
        if a.ce != "v" and a.head != "vp":
            fail(f"--loss-{a.ce} reads all Vp logits: it needs --head vp")
        if a.residual_dtype == "bf16" and a.dtype != "bf16":
            fail("--residual-dtype bf16 needs --dtype bf16 (autocast)")
        gqa = a.gqa
        if gqa == "auto":
            gqa = "native" if HAS_GQA and probe_sdpa(cfg, a.device, dev_dtype, True)[0] else "repeat"
        attn = "plain" if not HAS_SDPA else ("sdpa_gqa" if gqa == "native" else "sdpa_repeat")
        resid = torch.bfloat16 if a.residual_dtype == "bf16" else None
        cls = FastMHAR if a.impl == "fast" else PlainGPT
        model = cls(cfg, attn=attn, head=a.head, norm=norm, ce=a.ce, residual_dtype=resid)
        decay = model.matrices()
        ids = {id(p) for p in decay}
        other = [p for p in model.parameters() if id(p) not in ids]
        head = a.head
    if HAS_SDPA and a.sdpa == "auto":
        works, chosen = probe_sdpa(cfg, a.device, dev_dtype, gqa == "native")
        sdpa_label = f"auto:{chosen}" if works and chosen else "auto"
    label = (f"sdpa {sdpa_label} gqa {gqa} head {head} norm {norm} ce {a.ce} "
             f"resid {a.residual_dtype} clip {'off' if a.no_clip else '1.0'}")
    return model.to(a.device), decay, other, label


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
            if not a.no_clip:
                torch.nn.utils.clip_grad_norm_(params, 1.0, **foreach)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        def sync():
            if cuda:
                torch.cuda.synchronize()

        t_warm = time.perf_counter()
        for i in range(a.warmup):
            step(i)
        sync()
        warmup_s = time.perf_counter() - t_warm
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
          f"peak_mib {peak:.0f} step_ms {1000 * dt / a.steps:.1f} loss {loss.item():.4f} graphs {graphs} "
          f"warmup_s {warmup_s:.1f}", flush=True)


# ------------------------------------------------------------------------------ the sweep

def shape_flags(a):
    """The flags every child shares: model shape, steps, device and precision."""
    flags = ["--mode", a.mode, "--H", str(a.H), "--S", str(a.S)]
    for name in ("L", "C", "NH", "NKV", "F", "V", "T", "B", "steps", "warmup"):
        flags += [f"--{name}", str(getattr(a, name))]
    return flags + ["--device", a.device, "--dtype", a.dtype]


def child_flags(a, impl, mode, sdpa):
    flags = shape_flags(a) + ["--impl", impl, "--compile-mode", mode, "--sdpa", sdpa]
    if impl != "ref":
        flags += ["--gqa", a.gqa, "--head", a.head, "--norm", a.norm, "--residual-dtype", a.residual_dtype]
        flags += {"v": [], "vp": ["--loss-vp"], "masked": ["--loss-masked"]}[a.ce]
    return flags + (["--no-clip"] if a.no_clip else [])


def line_flags(line):
    """bench_torch.py's flags for the configuration a result line names."""
    impl = field(line, "impl")
    sdpa = field(line, "sdpa").split(":")[0]
    flags = f"--impl {impl} --compile-mode {field(line, 'compile')} --sdpa {'auto' if sdpa == 'none' else sdpa}"
    if impl != "ref":
        flags += f" --gqa {field(line, 'gqa')} --head {field(line, 'head')} --norm {field(line, 'norm')}"
        flags += {"v": "", "vp": " --loss-vp", "masked": " --loss-masked"}[field(line, "ce")]
        flags += " --residual-dtype bf16" if field(line, "resid") == "bf16" else ""
    return flags + (" --no-clip" if field(line, "clip") == "off" else "")


def run_child(flags, timeout, log=None):
    """Run one configuration; returns (its 'torch ...' line or None, error text, seconds). With log
    (a path prefix), its stdout and stderr are kept in log.out and log.err."""
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + flags, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the run and its compile workers
        out, err = proc.communicate()
        if log:
            write_log(log, flags, out, err)
        return None, f"timeout after {timeout:.0f} s", time.time() - t0
    if log:
        write_log(log, flags, out, err)
    line = next((l for l in out.splitlines() if l.startswith("torch ")), None)
    if proc.returncode != 0 or line is None:
        lines = [l for l in err.splitlines() if l.strip()]
        return None, f"exit {proc.returncode}: " + (lines[-1].strip() if lines else "no output"), time.time() - t0
    return line, "", time.time() - t0


def write_log(prefix, flags, out, err):
    with open(prefix + ".out", "w") as f:
        f.write("flags: " + " ".join(flags) + "\n" + (out or ""))
    with open(prefix + ".err", "w") as f:
        f.write(err or "")


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
    print(f"best flags: {line_flags(best[3])}")


# ------------------------------------------------------------------------------ the hunt

def hunt(a):
    """Time HUNT_RUNS (those --hunt-runs names) one by one, each in its own process; then a table,
    best first, with tok_s relative to the run named fast (the baseline), and the best flags."""
    if a.mode != "std":
        fail("--hunt compares against plain_model.py, which is std only: pass --mode std")
    start = T_START
    runs = dict(HUNT_RUNS)
    base = shape_flags(a) + ["--impl", "fast", "--compile-mode", a.compile_mode, "--sdpa", a.sdpa,
                             "--gqa", a.gqa, "--head", a.head]
    if a.hunt_logs:
        os.makedirs(a.hunt_logs, exist_ok=True)
    print(f"hunt: torch {torch.__version__}, {a.device}, budget {a.hunt_budget:.0f} s; base flags: "
          f"--impl fast --compile-mode {a.compile_mode} --sdpa {a.sdpa} --gqa {a.gqa} --head {a.head}", flush=True)
    results = []   # (name, line or None, error)
    for name in a.hunt_runs.split(","):
        left = a.hunt_budget - (time.time() - start)
        if left < 20:
            results.append((name, None, "skipped: hunt budget spent"))
            print(f"hunt {name}: skipped (budget)", flush=True)
            continue
        log = os.path.join(a.hunt_logs, name) if a.hunt_logs else None
        line, err, secs = run_child(base + runs[name], min(left, a.hunt_run_max), log)
        results.append((name, line, err))
        what = f"tok_s {field(line, 'tok_s')} peak_mib {field(line, 'peak_mib')}" if line else f"FAILED: {err}"
        print(f"hunt {name} ({' '.join(runs[name]) or 'baseline'}): {what} ({secs:.0f} s)", flush=True)

    ok = sorted((r for r in results if r[1]), key=lambda r: -float(field(r[1], "tok_s")))
    ref = next((float(field(l, "tok_s")) for n, l, _ in results if n == "fast" and l), None)
    print(f"\n{'run':<22} {'tok_s':>9} {'vs fast':>8} {'peak_mib':>9} {'step_ms':>8} {'loss':>8} "
          f"{'warmup_s':>8} {'graphs':>6}  (hunt, {time.time() - start:.0f} s; best first)")
    for name, line, _ in ok:
        tps = float(field(line, "tok_s"))
        rel = f"{tps / ref:.3f}" if ref else "-"
        print(f"{name:<22} {tps:>9.0f} {rel:>8} {field(line, 'peak_mib'):>9} {field(line, 'step_ms'):>8} "
              f"{field(line, 'loss'):>8} {field(line, 'warmup_s'):>8} {field(line, 'graphs'):>6}")
    for name, line, err in results:
        if not line:
            print(f"{name:<22} {'-':>9} {'-':>8} {'-':>9} {'-':>8} {'-':>8} {'-':>8} {'-':>6}  {err}")
    if not ok:
        fail("no run of the hunt finished; see the errors above" +
             (f" and the logs in {a.hunt_logs}" if a.hunt_logs else " (--hunt-logs keeps them)"))
    print("\nbest:")
    print(ok[0][1])
    print(f"best flags: {line_flags(ok[0][1])}")
    # the fastest run that trains what our trainer trains: gradient clipping on and the loss over
    # V columns (SPEC's model: ce v or masked); --no-clip and --loss-vp only time what those cost
    same = [r for r in ok if field(r[1], "clip") != "off" and field(r[1], "ce") != "vp"]
    if same:
        print(f"best same-work flags: {line_flags(same[0][1])}")


def main():
    a = parse_args()
    if a.hunt:
        hunt(a)
    elif a.sweep:
        sweep(a)
    else:
        run_one(a)


if __name__ == "__main__":
    main()
