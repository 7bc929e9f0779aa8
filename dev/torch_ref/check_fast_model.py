#!/usr/bin/python3
"""Check that fast_model.py (the speed baseline) and plain_model.py (its control) compute the same
function as model.py, and smoke-test bench_torch.py on the CPU.

model.py is the SPEC reference (check_grads.py ties it to the C trainer); fast_model.py is laid
out for speed (fused projections, per-block nn.Linear, RoPE tables, SDPA, cached routing
statistics). Here both run in float64 on CPU with the same parameters (model.py's, copied across
with FastMHAR.load_layout) and the same batch, and must agree on
  - the loss, the logits (B, T, V), and the gradient of every parameter tensor (mapped back to
    the checkpoint layout with FastMHAR.layout), per tensor  max|fast - ref| / max|ref|;
for std, attnres (H=1), mhar H=2, block S=2 (H=2) and block S=4 (H=4; 2L=6 sublayers, so a
final partial block), with every attention implementation the installed torch has (torch 1.13:
"plain"; torch >= 2.5 adds SDPA with enable_gqa and SDPA after repeat_interleave), and both LM
head forms ("vp": GEMM over all Vp rows, then the V columns; "v": GEMM over wte[:V]); fast with
norm="fused" (F.rms_norm) where torch has it (>= 2.4). plain_model.py (std only) the same way, with
every attention form, both heads and both norms the installed torch has, its parameters copied
with PlainGPT.load_layout and its gradients read back with layout(grad=True).

Parameters are random beyond SPEC 6's init (queries, gamma and norm weights perturbed, padded
rows of wte non-zero), so every term matters and the padded rows would show if they leaked in.

Tolerance 1e-12: both models are float64 and differ only in summation order and the grouping of
the routing score (r_i sum (q gamma) v instead of sum q (gamma r_i v)), ~1e-16..1e-14 here.
A misread formula gives 1e-4..1; a negative control (one weight changed by 1e-9 relative) must
exceed the tolerance too, so the measure can fail at well below any real mistake.
Also checked: SPEC 6 init statistics, that one seed initialises all three models identically,
the layout round trips, and that the RoPE tables keep full precision through .double().

Last, bench_torch.py on the CPU at a tiny shape (no compile): every impl and diagnostic switch
runs a few steps in this process and prints a complete line (fast, plain and ref start from the
same parameters and batches, so their float32 losses agree); then --hunt runs two
configurations in subprocesses and prints its table and best flags (~5 s).

    /usr/bin/python3 dev/torch_ref/check_fast_model.py [--seed N]
Ends with "N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import contextlib
import io
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bench_torch  # noqa: E402
import plain_model  # noqa: E402
from fast_model import HAS_RMS_NORM, FastMHAR, available_attn_impls, rope_tables  # noqa: E402
from mhar_io import Config  # noqa: E402
from model import MHAR  # noqa: E402
from plain_model import PlainGPT  # noqa: E402

TOL = 1e-12
TINY = dict(V=97, Vp=128, T=8, L=3, C=32, NH=4, NKV=2, F=48)
B = 2
MODES = {                   # name -> (mode, H, S)
    "std": ("std", 1, 1),
    "attnres": ("mhar", 1, 1),
    "mhar2": ("mhar", 2, 1),
    "block2": ("mhar", 2, 2),
    "block4": ("mhar", 4, 4),
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b| (max|a - b| when b is all zeros)."""
    diff = float((a - b).abs().max()) if a.numel() else 0.0
    scale = float(b.abs().max()) if b.numel() else 0.0
    return diff / scale if scale > 0 else diff


class Tally:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def check(self, label, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"  {'ok  ' if ok else 'FAIL'} {label:<34} {detail}")
        return ok


def random_ref(cfg: Config, seed: int) -> MHAR:
    """model.py in float64 with SPEC 6 init, then every non-matrix parameter perturbed and the
    padded rows of wte filled, so that no term of the function is trivial."""
    g = torch.Generator().manual_seed(seed)
    ref = MHAR(cfg)
    ref.init_weights(generator=g)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name in ("ln1w", "ln2w", "qnw", "knw", "lnfw", "rg"):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif name == "rq":
                p.normal_(0.0, 0.5, generator=g)
        ref.wte[cfg.V:].normal_(0.0, 0.02, generator=g)
    return ref.double()


def loss_logits_grads(model, idx, tgt):
    model.zero_grad(set_to_none=True)
    loss = model(idx, tgt)
    loss.backward()
    with torch.no_grad():
        logits = model(idx)
    return loss.detach(), logits


def make_fast(cfg, attn, head, norm="manual", ce="v"):
    return FastMHAR(cfg, attn=attn, head=head, norm=norm, ce=ce).double()


def make_plain(cfg, attn, head, norm="manual", ce="v"):
    m = PlainGPT(cfg, attn=attn, head=head, norm=norm, ce=ce).double()
    m.init_rope()                      # exact float64 RoPE tables
    return m


def compare_config(tally, name, cfg, attn, head, seed, corrupt=False, make=make_fast, norm="manual",
                   what="fast", ce="v"):
    """One model (make: fast or plain) in one config and one (attn, head, norm, ce) form; returns
    the worst relative error. ce="masked" must give model.py's loss over V and its gradients."""
    ref = random_ref(cfg, seed)
    fast = make(cfg, attn, head, norm, ce)
    params = {n: p.detach().clone() for n, p in ref.named_parameters()}
    if corrupt:          # the negative control: one weight off by 1e-9 relative
        params["qnw"][1, 3] *= 1 + 1e-9
    fast.load_layout(params)
    g = torch.Generator().manual_seed(seed + 1)
    idx = torch.randint(0, cfg.V, (B, cfg.T), generator=g)
    tgt = torch.randint(0, cfg.V, (B, cfg.T), generator=g)
    loss_r, logits_r = loss_logits_grads(ref, idx, tgt)
    loss_f, logits_f = loss_logits_grads(fast, idx, tgt)
    errs = {"loss": rel_err(loss_f, loss_r), "logits": rel_err(logits_f, logits_r)}
    grads_f = fast.layout(grad=True)
    for n, p in ref.named_parameters():
        errs["d" + n] = rel_err(grads_f[n], p.grad)
    worst = max(errs, key=errs.get)
    label = f"{what} {name} attn={attn} head={head}" + (f" norm={norm}" if norm != "manual" else "") + \
        (f" ce={ce}" if ce != "v" else "") + \
        (" corrupted" if corrupt else "")
    if corrupt:
        tally.check(label, errs[worst] > TOL,
                    f"negative control: worst {errs[worst]:.1e} ({worst}) must exceed {TOL:.0e}")
    else:
        for k, e in errs.items():
            if e > TOL:
                tally.check(f"{label} {k}", False, f"rel {e:.2e} > {TOL:.0e}")
        tally.check(label, errs[worst] <= TOL,
                    f"{len(errs)} tensors, worst {errs[worst]:.1e} ({worst}), loss {float(loss_r):.4f}")
    return errs[worst]


def check_init(tally, seed):
    """SPEC 6 on a model large enough for statistics; plus the layout round trip."""
    cfg = Config(V=1000, Vp=1024, T=64, L=2, C=128, NH=4, NKV=2, F=384, mode="mhar", H=4, S=1)
    torch.manual_seed(seed)
    m = FastMHAR(cfg)
    lay = m.layout()
    mats = ["wq", "wk", "wv", "wo", "wg", "wu", "wd"]
    stds = {n: float(lay[n].std()) for n in mats}
    stds["wte"] = float(lay["wte"][:cfg.V].std())
    # std of >= 32k N(0, 0.02^2) draws: relative sampling error ~ 1/sqrt(2 n) < 0.4%; allow 3%
    bad = {n: s for n, s in stds.items() if abs(s / 0.02 - 1) > 0.03}
    tally.check("init: matrices N(0, 0.02^2)", not bad,
                ", ".join(f"{n} {s:.4f}" for n, s in stds.items()))
    ones = ["ln1w", "ln2w", "qnw", "knw", "lnfw", "rg"]
    tally.check("init: norm weights and gamma 1", all(bool((lay[n] == 1).all()) for n in ones))
    tally.check("init: queries 0, padded wte rows 0",
                bool((lay["rq"] == 0).all()) and bool((lay["wte"][cfg.V:] == 0).all()))
    tally.check("init: one parameter per layout tensor",
                sum(p.numel() for p in m.parameters()) == sum(t.numel() for t in lay.values()))
    m2 = FastMHAR(cfg)
    m2.load_layout(lay)
    tally.check("layout round trip", all(torch.equal(m2.layout()[n], t) for n, t in lay.items()))
    torch.manual_seed(seed)
    ref = MHAR(cfg)
    tally.check("init: same seed, same parameters as model.py",
                all(torch.equal(p, lay[n]) for n, p in ref.named_parameters()))


def check_plain_init(tally, seed):
    """plain_model.py: SPEC 6 init equal to model.py's for one seed, the layout round trip, one
    parameter per layout tensor (wte counted once: the head is tied to it), exact RoPE tables."""
    cfg = Config(V=1000, Vp=1024, T=64, L=2, C=128, NH=4, NKV=2, F=384, mode="std")
    torch.manual_seed(seed)
    m = PlainGPT(cfg)
    lay = m.layout()
    torch.manual_seed(seed)
    ref = MHAR(cfg)
    tally.check("plain init: same seed, same parameters as model.py",
                all(torch.equal(p, lay[n]) for n, p in ref.named_parameters()))
    tally.check("plain: head tied to wte, one parameter per layout tensor",
                m.lm_head.weight is m.wte.weight and
                sum(p.numel() for p in m.parameters()) == sum(t.numel() for t in lay.values()))
    m2 = PlainGPT(cfg)
    m2.load_layout(lay)
    tally.check("plain layout round trip", all(torch.equal(m2.layout()[n], t) for n, t in lay.items()))
    m = make_plain(Config(mode="std", **TINY), None, "vp")
    cos, sin = rope_tables(TINY["T"], TINY["C"] // TINY["NH"])
    tally.check("plain rope tables: exact in float64", torch.equal(m.rope_cos, cos) and torch.equal(m.rope_sin, sin))


def check_rope_tables(tally):
    cfg = Config(mode="std", **TINY)
    m = FastMHAR(cfg).double()
    cos, sin = rope_tables(cfg.T, cfg.HD)
    ok64 = torch.equal(m.rope_cos, cos) and torch.equal(m.rope_sin, sin)
    m = m.float()
    ok32 = torch.equal(m.rope_cos, cos.float()) and torch.equal(m.rope_sin, sin.float())
    tally.check("rope tables: float64, rounded once", ok64 and ok32,
                "float64 model: exact float64 tables; float32 model: tables rounded once")


BENCH_TINY = ["--device", "cpu", "--L", "2", "--C", "32", "--NH", "4", "--NKV", "2", "--F", "48", "--V", "97",
              "--T", "8", "--B", "2", "--steps", "2", "--warmup", "1", "--no-compile"]
BENCH_FIELDS = ("impl", "compile", "sdpa", "gqa", "head", "norm", "ce", "resid", "clip", "tok_s", "peak_mib",
                "step_ms", "loss", "graphs", "warmup_s")


def bench_line(flags):
    """bench_torch.py's run in this process: its result line, or the error it exits with."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            bench_torch.run_one(bench_torch.parse_args(BENCH_TINY + flags))
    except SystemExit as e:
        return None, str(e.code)
    line = next((l for l in out.getvalue().splitlines() if l.startswith("torch ")), None)
    return line, "" if line else "no result line"


def check_bench(tally):
    runs = [["--dtype", "fp32"], ["--dtype", "fp32", "--impl", "plain"], ["--dtype", "fp32", "--impl", "ref"],
            ["--impl", "plain"], ["--impl", "plain", "--no-clip"], ["--no-clip"], ["--impl", "ref", "--no-clip"],
            ["--loss-vp"], ["--impl", "plain", "--loss-vp"], ["--loss-masked"], ["--impl", "plain", "--loss-masked"],
            ["--mode", "mhar", "--H", "2", "--loss-masked"], ["--head", "v"], ["--impl", "plain", "--head", "v"],
            ["--residual-dtype", "bf16"], ["--impl", "plain", "--residual-dtype", "bf16"],
            ["--impl", "plain", "--norm", "manual"], ["--mode", "mhar", "--H", "2", "--residual-dtype", "bf16"]]
    if HAS_RMS_NORM:
        runs += [["--norm", "fused"], ["--mode", "mhar", "--H", "2", "--norm", "fused"]]
    losses = {}
    for flags in runs:
        line, err = bench_line(flags)
        toks = line.split() if line else []
        ok = line is not None and all(f in toks for f in BENCH_FIELDS) and \
            math.isfinite(float(bench_torch.field(line, "loss")))
        tally.check("bench " + " ".join(flags), ok, line[len("torch "):].split(" tok_s")[0] if line else err)
        if ok and flags[:2] == ["--dtype", "fp32"]:
            losses[bench_torch.field(line, "impl")] = float(bench_torch.field(line, "loss"))
    spread = max(losses.values()) - min(losses.values()) if len(losses) == 3 else float("inf")
    tally.check("bench: fast, plain, ref start alike", spread < 1e-4,
                "float32 losses " + ", ".join(f"{k} {v:.6f}" for k, v in losses.items()))
    for flags, want in ((["--impl", "plain", "--mode", "mhar"], "std only"),
                        (["--impl", "ref", "--loss-vp"], "--impl ref is model.py"),
                        (["--loss-vp", "--head", "v"], "needs --head vp"),
                        (["--loss-masked", "--head", "v"], "needs --head vp"),
                        (["--loss-masked", "--loss-vp"], "give one"),
                        (["--dtype", "fp32", "--residual-dtype", "bf16"], "needs --dtype bf16")):
        line, err = bench_line(flags)
        tally.check("bench refuses " + " ".join(flags), line is None and want in err, err)
    flags = BENCH_TINY + ["--hunt", "--hunt-runs", "fast,plain", "--sdpa", "auto", "--gqa", "auto"]
    proc = subprocess.run([sys.executable, bench_torch.__file__] + flags, capture_output=True, text=True)
    out = proc.stdout.splitlines()
    rows = [l.split()[0] for l in out if l.split() and l.split()[0] in ("fast", "plain")]
    best = next((l for l in out if l.startswith("best flags: --impl ")), None)
    tally.check("bench --hunt: two runs, a table, best flags", proc.returncode == 0 and rows == sorted(rows, key=(
        lambda n: -float(next(l for l in out if l.startswith(n + " ")).split()[1]))) and len(rows) == 2 and
        best is not None, best or (proc.stderr.strip().splitlines() or ["no output"])[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    tally = Tally()
    attns = available_attn_impls()
    print(f"[fast_model vs model.py, float64, torch {torch.__version__}, attention: {', '.join(attns)}]")
    for i, (name, (mode, H, S)) in enumerate(MODES.items()):
        cfg = Config(mode=mode, H=H, S=S, **TINY)
        for attn in attns:
            compare_config(tally, name, cfg, attn, "vp", args.seed + i)
        compare_config(tally, name, cfg, attns[-1], "v", args.seed + i)
    if HAS_RMS_NORM:
        for name in ("std", "mhar2"):
            mode, H, S = MODES[name]
            compare_config(tally, name, Config(mode=mode, H=H, S=S, **TINY), attns[0], "vp", args.seed,
                           norm="fused")
    else:
        print(f"  (fast norm=fused skipped: torch {torch.__version__} has no F.rms_norm)")
    for name in ("std", "mhar2"):   # the loss over Vp columns with the padded ones at -inf
        mode, H, S = MODES[name]
        compare_config(tally, name, Config(mode=mode, H=H, S=S, **TINY), attns[0], "vp", args.seed, ce="masked")
    compare_config(tally, "mhar2", Config(mode="mhar", H=2, S=1, **TINY), attns[0], "vp",
                   args.seed, corrupt=True)
    print(f"[plain_model vs model.py, float64, std; norms: {', '.join(plain_model.available_norms())}]")
    std = Config(mode="std", **TINY)
    for attn in plain_model.available_attn_impls():
        for norm in plain_model.available_norms():
            compare_config(tally, "std", std, attn, "vp", args.seed + 7, make=make_plain, norm=norm, what="plain")
    compare_config(tally, "std", std, attns[-1], "v", args.seed + 7, make=make_plain, what="plain")
    compare_config(tally, "std", std, attns[0], "vp", args.seed + 7, make=make_plain, what="plain", ce="masked")
    compare_config(tally, "std", std, attns[0], "vp", args.seed + 7, make=make_plain, what="plain", corrupt=True)
    print("[SPEC 6 init, layout, RoPE tables]")
    check_init(tally, args.seed)
    check_plain_init(tally, args.seed)
    check_rope_tables(tally)
    print("[bench_torch.py on the CPU: every impl and switch, then --hunt]")
    check_bench(tally)
    print(f"{tally.passed} passed, {tally.failed} failed")
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
