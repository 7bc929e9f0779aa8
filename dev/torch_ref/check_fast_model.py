#!/usr/bin/python3
"""Check that fast_model.py (the speed baseline) computes the same function as model.py.

model.py is the SPEC reference (check_grads.py ties it to the C trainer); fast_model.py is laid
out for speed (fused projections, per-block nn.Linear, RoPE tables, SDPA, cached routing
statistics). Here both run in float64 on CPU with the same parameters (model.py's, copied across
with FastMHAR.load_layout) and the same batch, and must agree on
  - the loss, the logits (B, T, V), and the gradient of every parameter tensor (mapped back to
    the checkpoint layout with FastMHAR.layout), per tensor  max|fast - ref| / max|ref|;
for std, attnres (H=1), mhar H=2, block S=2 (H=2) and block S=4 (H=4; 2L=6 sublayers, so a
final partial block), with every attention implementation the installed torch has (torch 1.13:
"plain"; torch >= 2.5 adds SDPA with enable_gqa and SDPA after repeat_interleave), and both LM
head forms ("vp": GEMM over all Vp rows, then the V columns; "v": GEMM over wte[:V]).

Parameters are random beyond SPEC 6's init (queries, gamma and norm weights perturbed, padded
rows of wte non-zero), so every term matters and the padded rows would show if they leaked in.

Tolerance 1e-12: both models are float64 and differ only in summation order and the grouping of
the routing score (r_i sum (q gamma) v instead of sum q (gamma r_i v)), ~1e-16..1e-14 here.
A misread formula gives 1e-4..1; a negative control (one weight changed by 1e-9 relative) must
exceed the tolerance too, so the measure can fail at well below any real mistake.
Also checked: SPEC 6 init statistics, that one seed initialises both models identically, the
layout round trip, and that the RoPE tables keep full precision through .double().

    /usr/bin/python3 dev/torch_ref/check_fast_model.py [--seed N]
Ends with "N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from fast_model import FastMHAR, available_attn_impls, rope_tables  # noqa: E402
from mhar_io import Config  # noqa: E402
from model import MHAR  # noqa: E402

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


def compare_config(tally, name, cfg, attn, head, seed, corrupt=False):
    """One model config and one (attn, head) form; returns the worst relative error."""
    ref = random_ref(cfg, seed)
    fast = FastMHAR(cfg, attn=attn, head=head).double()
    fast.load_layout(dict(ref.named_parameters()))
    if corrupt:          # the negative control: one weight off by 1e-9 relative
        with torch.no_grad():
            fast.blocks[1].qnw[3] *= 1 + 1e-9
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
    label = f"{name} attn={attn} head={head}" + (" corrupted" if corrupt else "")
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


def check_rope_tables(tally):
    cfg = Config(mode="std", **TINY)
    m = FastMHAR(cfg).double()
    cos, sin = rope_tables(cfg.T, cfg.HD)
    ok64 = torch.equal(m.rope_cos, cos) and torch.equal(m.rope_sin, sin)
    m = m.float()
    ok32 = torch.equal(m.rope_cos, cos.float()) and torch.equal(m.rope_sin, sin.float())
    tally.check("rope tables: float64, rounded once", ok64 and ok32,
                "float64 model: exact float64 tables; float32 model: tables rounded once")


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
    compare_config(tally, "mhar2", Config(mode="mhar", H=2, S=1, **TINY), attns[0], "vp",
                   args.seed, corrupt=True)
    print("[SPEC 6 init, layout, RoPE tables]")
    check_init(tally, args.seed)
    check_rope_tables(tally)
    print(f"{tally.passed} passed, {tally.failed} failed")
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
