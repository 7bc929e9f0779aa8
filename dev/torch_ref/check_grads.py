#!/usr/bin/python3
"""Compare the C trainer's hand-written gradients with autograd on the SPEC model (model.py).

For every residual mode, on a tiny config with GQA (NKV < NH):
  1. write a shard of random tokens (mhar_io.write_shard);
  2. run the C tool: dev/mhar_grads ... -i SHARD -o CKPT -g GRADS
     (it initialises a model, writes CKPT in float32 and GRADS = dLoss/dparam in float64);
  3. load CKPT into model.py in float64, run forward + autograd backward on the same batch;
  4. per tensor, the worst relative error  rel = max|g_torch - g_C| / max|g_C|,
     and for the loss  |loss_torch - loss_C| / |loss_C|.

Threshold 1e-9: both sides compute in float64 (unit roundoff 1.1e-16) from the same float32
parameters, and differ only in summation order; on this tiny config that gives errors of
order 1e-15 .. 1e-13. Any misreading of SPEC (a missing term, a wrong head or source index,
a wrong scale) produces errors of order 1e-4 .. 1, and a float32 step anywhere in the C
float64 path shows up near 1e-7. 1e-9 sits well between the two.

Normalising by the tensor's max|g_C| (not elementwise) keeps tiny gradient entries, whose
relative error is meaningless, from dominating, while any error that matters at the scale of
the tensor is still caught.

  /usr/bin/python3 dev/torch_ref/check_grads.py                 # all modes, C tool
  /usr/bin/python3 dev/torch_ref/check_grads.py --modes std,block4 --keep
  /usr/bin/python3 dev/torch_ref/check_grads.py --self-test      # no C tool needed
"""

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import mhar_io  # noqa: E402
from model import MHAR, route  # noqa: E402

THRESHOLD = 1e-9

# The tiny config: GQA on (NKV < NH); L = 3 gives 2L = 6 sublayers, so block S=4 also has a
# final partial block (6 is not a multiple of 4) and S=2 block boundaries fall after MLPs.
TINY = dict(L=3, C=32, NH=4, NKV=2, F=48, V=97, T=8, B=2)

# mode name -> (tool's -r value, H, S, n); std and hc pass no -H/-S, hc passes -hc_n n
MODES = {
    "std":     ("std", None, None, None),
    "attnres": ("attnres", 1, 1, None),
    "mhar2":   ("mhar", 2, 1, None),
    "mhar4":   ("mhar", 4, 1, None),
    "block2":  ("mhar", 2, 2, None),
    "block4":  ("mhar", 4, 4, None),
    "hc2":     ("hc", None, None, 2),
    "hc4":     ("hc", None, None, 4),
    "delta2":  ("delta", 2, 2, None),   # SPEC 9; 2L = 6 sublayers: 3 whole blocks
    "delta4":  ("delta", 4, 4, None),   # one whole block and a trailing partial one
    "delta1s1": ("delta", 1, 1, None),  # every output its own block
}


def rel_err(a, b) -> float:
    """max|a - b| / max|b|; falls back to max|a - b| when b is all zeros."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return diff / scale if scale > 0 else diff


def worst(*errs) -> float:
    """The largest error; NaN when any is NaN (Python's max would drop it and pass a NaN run)."""
    errs = [float(e) for e in errs]
    return math.nan if any(math.isnan(e) for e in errs) else max(errs)


def _crc32c_bytewise(data) -> int:
    """CRC-32C one bit at a time, straight from its definition: the reference for mhar_io.crc32c."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


class Tally:
    """Counts checks and prints one line per check."""

    def __init__(self, quiet=False):
        self.passed, self.failed, self.failures, self.quiet = 0, 0, [], quiet

    def check(self, label, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(label)
        if not self.quiet:
            print(f"  {'ok  ' if ok else 'FAIL'} {label:<28} {detail}")
        return ok


# ----------------------------------------------------------------------------------------
# the comparison against the C tool


def tool_command(tool):
    return [sys.executable, tool] if tool.endswith(".py") else [tool]


def run_mode(mode, tool, workdir, seed, tally, extra_args=()):
    r, H, S, n = MODES[mode]
    c = TINY
    if not tally.quiet:
        print(f"[{mode}] -r {r}" + (f" H={H} S={S}" if H else "") + (f" n={n}" if n else "") +
              f"  L={c['L']} C={c['C']} NH={c['NH']} NKV={c['NKV']} F={c['F']} V={c['V']}"
              f" T={c['T']} B={c['B']} seed={seed}")
    shard = os.path.join(workdir, f"{mode}_shard.bin")
    ckpt = os.path.join(workdir, f"{mode}_ckpt.bin")
    grads = os.path.join(workdir, f"{mode}_grads.bin")

    rng = np.random.default_rng(seed)
    ntok = c["B"] * c["T"] + 1 + 7    # a few extra tokens: only the first B*T+1 may be read
    mhar_io.write_shard(shard, rng.integers(0, c["V"], size=ntok))

    cmd = tool_command(tool) + ["-r", r]
    if H is not None:
        cmd += ["-H", str(H), "-S", str(S)]
    if n is not None:
        cmd += ["-hc_n", str(n)]
    for k in ("L", "C", "NH", "NKV", "F", "V", "T", "B"):
        cmd += [f"-{k}", str(c[k])]
    cmd += ["-seed", str(seed), "-i", shard, "-o", ckpt, "-g", grads, *extra_args]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        tally.check(f"{mode}: tool run", False, "no answer within 600 s: " + " ".join(cmd))
        return
    with open(os.path.join(workdir, f"{mode}_tool.log"), "w") as f:   # kept with --keep
        f.write(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        tally.check(f"{mode}: tool run", False,
                    f"exit {proc.returncode}: {msg[-1] if msg else '(no output)'}")
        return

    # -- the files must say what we asked for
    try:
        ck = mhar_io.read_checkpoint(ckpt)
        gd = mhar_io.read_checkpoint(grads)
    except (mhar_io.MharFormatError, OSError) as e:
        tally.check(f"{mode}: tool output", False, str(e))
        return
    want = dict(L=c["L"], C=c["C"], NH=c["NH"], NKV=c["NKV"], F=c["F"], V=c["V"],
                mode={"std": "std", "hc": "hc", "delta": "delta"}.get(r, "mhar"))
    if H is not None:
        want.update(H=H, S=S)
    if n is not None:
        want.update(n=n)
    problems = [f"{k}={getattr(ck.cfg, k)} (asked {v})" for k, v in want.items()
                if getattr(ck.cfg, k) != v]
    if ck.content != mhar_io.CONTENT_PARAMS:
        problems.append(f"{ckpt} content {ck.content}, expected 0")
    if gd.content != mhar_io.CONTENT_GRADS:
        problems.append(f"{grads} content {gd.content}, expected 2")
    if gd.bytes_per_elem != 8:
        problems.append(f"{grads} has {gd.bytes_per_elem} bytes per element, expected 8")
    if gd.cfg != ck.cfg:
        problems.append(f"gradient dump config {gd.cfg} differs from checkpoint {ck.cfg}")
    if (gd.batch_B, gd.batch_T) != (c["B"], c["T"]):
        problems.append(f"dump batch B={gd.batch_B} T={gd.batch_T}, asked B={c['B']} T={c['T']}")
    if problems:
        tally.check(f"{mode}: headers", False, "; ".join(problems))
        return

    # -- autograd in float64 from the checkpoint's parameters, on the dump's batch
    model = MHAR(ck.cfg).double()
    model.load_checkpoint(ck)
    x, y = mhar_io.load_batch(shard, gd.batch_B, gd.batch_T)
    loss = model(torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()

    err = abs(loss.item() - gd.loss) / abs(gd.loss)
    tally.check(f"{mode}: loss", err <= THRESHOLD,
                f"rel {err:.2e}  (torch {loss.item():.15f}, C {gd.loss:.15f})")
    for name, p in model.named_parameters():
        g_t, g_c = p.grad.numpy(), gd.params[name]
        err = rel_err(g_t, g_c)
        tally.check(f"{mode}: {name}", err <= THRESHOLD,
                    f"rel {err:.2e}  max|g_C| {np.max(np.abs(g_c)):.3e}  shape {tuple(g_c.shape)}")


def run_tool_checks(args):
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        print(f"check_grads: unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
        return 2
    args.tool = os.path.abspath(args.tool)   # the tool runs with cwd = repo root
    if not os.path.isfile(args.tool):
        print(f"check_grads: {args.tool}: no such tool (build it with `make dev/mhar_grads`"
              f" at the repo root, or pass --tool PATH)")
        print("0 passed, 1 failed")
        return 2
    workdir = tempfile.mkdtemp(prefix="mhar_check_")
    tally = Tally()
    try:
        for mode in modes:
            run_mode(mode, args.tool, workdir, args.seed, tally)
    finally:
        if args.keep:
            print(f"kept files in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if tally.failures:
        print("failed: " + ", ".join(tally.failures))
    print(f"{tally.passed} passed, {tally.failed} failed")
    return 1 if tally.failed else 0


# ----------------------------------------------------------------------------------------
# self-test: no C tool needed


def spec_route_forward(v, q, gamma, H):
    """SPEC 4 forward, written out head by head (independent of model.route's reshapes).
    v: (n, P, C) sources at P positions. Returns out (P, C), a (H, n, P), r (n, P)."""
    n, P, C = v.shape
    r = 1.0 / torch.sqrt((v * v).sum(-1) / C + 1e-6)
    a = torch.empty(H, n, P, dtype=v.dtype)
    out = torch.empty(P, C, dtype=v.dtype)
    w = C // H
    for h in range(H):
        ch = slice(h * w, (h + 1) * w)
        k = gamma[ch] * r[:, :, None] * v[:, :, ch]           # (n, P, w)
        s = (q[ch] * k).sum(-1)                                 # (n, P)
        e = torch.exp(s - s.max(0).values)
        a[h] = e / e.sum(0)
        out[:, ch] = (a[h][:, :, None] * v[:, :, ch]).sum(0)
    return out, a, r


def spec_route_backward(v, q, gamma, H, G, a, r):
    """SPEC 4's hand backward formulas, literally. Returns dq (C), dgamma (C), dv (n, P, C)."""
    n, P, C = v.shape
    w = C // H
    dq = torch.zeros(C, dtype=v.dtype)
    dgamma = torch.zeros(C, dtype=v.dtype)
    dv = torch.zeros_like(v)
    for h in range(H):
        ch = slice(h * w, (h + 1) * w)
        p = (G[None, :, ch] * v[:, :, ch]).sum(-1)              # p[h,i] = G[h] . v_i[h]  (n, P)
        S_h = (a[h] * p).sum(0)                                   # (P,)
        ds = a[h] * (p - S_h)                                     # (n, P)
        rv = r[:, :, None] * v[:, :, ch]
        dq[ch] += (ds[:, :, None] * gamma[ch] * rv).sum((0, 1))
        dgamma[ch] += (ds[:, :, None] * q[ch] * rv).sum((0, 1))
    for i in range(n):
        u = torch.empty(P, C, dtype=v.dtype)
        aG = torch.empty(P, C, dtype=v.dtype)
        for h in range(H):
            ch = slice(h * w, (h + 1) * w)
            p = (G[None, :, ch] * v[:, :, ch]).sum(-1)
            ds = a[h] * (p - (a[h] * p).sum(0))
            u[:, ch] = ds[i][:, None] * q[ch] * gamma[ch]
            aG[:, ch] = a[h, i][:, None] * G[:, ch]
        ri = r[i][:, None]
        uv = (u * v[i]).sum(-1, keepdim=True)
        dv[i] += ri * u - (ri ** 3 / C) * uv * v[i] + aG
    return dq, dgamma, dv


def block_reference_stream(model, x0, S):
    """SPEC 5 taken literally: site j (m = j // S, p = j - mS) reads [b_0, .., b_m] and, when
    p >= 1, the sum of the current block's first p outputs; all sums rebuilt from scratch.
    (model._stream_block keeps running sums instead.)"""
    L2, H = 2 * model.cfg.L, model.cfg.H
    outs = []

    def sources(j):
        m, p = j // S, j - (j // S) * S
        src = [x0] + [sum(outs[(b - 1) * S:b * S]) for b in range(1, m + 1)]
        if p >= 1:
            src.append(sum(outs[m * S:m * S + p]))
        return src

    for j in range(L2):
        outs.append(model.sublayer(j, route(sources(j), model.rq[j], model.rg[j], H)))
    return route(sources(L2), model.rq[L2], model.rg[L2], H)


def spec_sublayers_literal(model, l, u):
    """SPEC 3's attention and MLP sublayers of block l, one position and one head at a time
    (independent of model.attention's batched reshapes, repeat_interleave and RoPE tensors).
    u: (T, C) float64, a single sequence. Returns (attention out, MLP out), each (T, C)."""
    cfg = model.cfg
    T, NH, NKV, HD = u.shape[0], cfg.NH, cfg.NKV, cfg.HD

    def rms(x, g):
        return x / torch.sqrt((x * x).mean() + 1e-6) * g

    def rope_at(x, t):
        out = x.clone()
        for i in range(HD // 2):
            ang = t * 10000.0 ** (-2.0 * i / HD)
            c, s = math.cos(ang), math.sin(ang)
            out[i] = x[i] * c - x[i + HD // 2] * s
            out[i + HD // 2] = x[i + HD // 2] * c + x[i] * s
        return out

    Wq, Wk, Wv, Wo = model.wq[l], model.wk[l], model.wv[l], model.wo[l]
    qs = [[rope_at(rms((Wq @ u[t])[h * HD:(h + 1) * HD], model.qnw[l]), t) for h in range(NH)]
          for t in range(T)]
    ks = [[rope_at(rms((Wk @ u[t])[g * HD:(g + 1) * HD], model.knw[l]), t) for g in range(NKV)]
          for t in range(T)]
    vs = [[(Wv @ u[t])[g * HD:(g + 1) * HD] for g in range(NKV)] for t in range(T)]
    att_out = torch.zeros(T, cfg.C, dtype=u.dtype)
    for t in range(T):
        y = torch.zeros(NH * HD, dtype=u.dtype)
        for h in range(NH):
            g = h // (NH // NKV)                        # the kv head query head h reads
            sc = torch.stack([qs[t][h] @ ks[t2][g] / math.sqrt(HD) for t2 in range(t + 1)])
            w = torch.softmax(sc, 0)
            y[h * HD:(h + 1) * HD] = sum(w[t2] * vs[t2][g] for t2 in range(t + 1))
        att_out[t] = Wo @ y
    z = u @ model.wg[l].T
    mlp_out = (z * torch.sigmoid(z) * (u @ model.wu[l].T)) @ model.wd[l].T
    return att_out, mlp_out


def _random_model(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    model = MHAR(cfg)
    model.init_weights(generator=g)
    with torch.no_grad():
        if cfg.mode in ("mhar", "delta"):
            model.rq.normal_(0.0, 0.5, generator=g)
            model.rg.add_(torch.randn(model.rg.shape, generator=g) * 0.2)
        if cfg.mode == "delta":
            model.dnull.normal_(0.0, 0.3, generator=g)
            model.dalpha.normal_(0.0, 0.3, generator=g)
        if cfg.mode == "hc":
            model.hcalpha.normal_(0.0, 1.0, generator=g)
            model.hca.add_(torch.randn(model.hca.shape, generator=g) * 0.3)
            model.hcbeta.add_(torch.randn(model.hcbeta.shape, generator=g) * 0.3)
    return model.double()


def _loss_and_grads(model, stream_fn, idx, tgt):
    model.zero_grad()
    loss = model.head(stream_fn(torch.nn.functional.embedding(idx, model.wte)), tgt)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def self_test(args):
    torch.manual_seed(args.seed)
    tally = Tally()
    f64 = torch.float64

    print("[routing vs SPEC 4 formulas: forward, and autograd vs the hand backward]")
    # The SPEC says its formulas agree with autograd to 1e-15; measured here 0 .. 4e-15
    # (max-normalised). 1e-13 leaves room for summation order, far below any real mistake.
    # Query scale: keys are RMS-normalised, so a query of std qscale/sqrt(C/H) gives scores of
    # std ~qscale, i.e. softmax weights that are neither uniform nor saturated.
    for n, H, C, qscale in ((1, 1, 16, 1.0), (3, 1, 16, 1.0), (4, 2, 16, 1.0),
                            (5, 4, 32, 1.0), (6, 8, 32, 3.0), (4, 32, 32, 1.0)):
        P = 5
        v = (torch.randn(n, P, C, dtype=f64) * torch.rand(n, P, 1, dtype=f64) * 3)
        v.requires_grad_(True)
        q = (torch.randn(C, dtype=f64) * qscale / (C // H) ** 0.5).requires_grad_(True)
        gamma = (1 + 0.3 * torch.randn(C, dtype=f64)).requires_grad_(True)
        G = torch.randn(P, C, dtype=f64)
        out = route(list(v.view(n, 1, P, C)), q, gamma, H).view(P, C)
        dq_a, dg_a, dv_a = torch.autograd.grad(out, (q, gamma, v), G)
        with torch.no_grad():
            out_s, a, r = spec_route_forward(v, q, gamma, H)
            dq_s, dg_s, dv_s = spec_route_backward(v, q, gamma, H, G, a, r)
        e = worst(rel_err(out.detach(), out_s), rel_err(dq_a, dq_s), rel_err(dg_a, dg_s),
                rel_err(dv_a, dv_s))
        amin, amax = float(a.min()), float(a.max())
        tally.check(f"route n={n} H={H} C={C}", e <= 1e-13,
                    f"worst rel {e:.2e} (out, dq, dgamma, dv); weights {amin:.2f}..{amax:.2f}")

    print("[zero queries give the uniform average of the sources]")
    for n, H in ((1, 1), (3, 2), (7, 8)):
        v = torch.randn(n, 2, 3, 16, dtype=f64) * 5
        out = route(list(v), torch.zeros(16, dtype=f64), 1 + torch.rand(16, dtype=f64), H)
        e = rel_err(out, v.mean(0))
        tally.check(f"uniform n={n} H={H}", e <= 1e-15, f"rel {e:.2e}")

    print("[gradcheck of route (finite differences vs autograd)]")
    v = torch.randn(3, 1, 2, 8, dtype=f64, requires_grad=True)
    q = torch.randn(8, dtype=f64, requires_grad=True)
    gm = (1 + 0.2 * torch.randn(8, dtype=f64)).requires_grad_(True)
    ok = torch.autograd.gradcheck(lambda v, q, g: route(list(v), q, g, 2), (v, q, gm),
                                  raise_exception=False)
    tally.check("gradcheck route H=2", ok, "")

    print("[attention (QK-norm, RoPE, GQA, causal) and SwiGLU vs SPEC 3, written per position]")
    for NH, NKV in ((4, 2), (4, 1), (2, 2)):
        cfg = mhar_io.Config(V=29, Vp=128, T=6, L=2, C=16, NH=NH, NKV=NKV, F=24, mode="std")
        model = _random_model(cfg, args.seed)
        with torch.no_grad():   # non-trivial QK-norm weights (QK-norm fixes the score scale)
            model.qnw.add_(0.5 * torch.randn(model.qnw.shape, dtype=f64))
            model.knw.add_(0.5 * torch.randn(model.knw.shape, dtype=f64))
            u = torch.randn(1, 6, 16, dtype=f64)
            e = 0.0
            for l in range(cfg.L):
                att_ref, mlp_ref = spec_sublayers_literal(model, l, u[0])
                e = worst(e, rel_err(model.attention(l, u)[0], att_ref),
                        rel_err(model.mlp(l, u)[0], mlp_ref))
        # measured ~1e-16; 1e-13 as for routing (same operations, different summation order)
        tally.check(f"sublayers NH={NH} NKV={NKV}", e <= 1e-13, f"worst rel {e:.2e}")

    print("[block mode]")
    base = dict(V=29, Vp=128, T=6, L=3, C=16, NH=4, NKV=2, F=24, mode="mhar", H=2)
    idx = torch.randint(0, 29, (2, 6))
    tgt = torch.randint(0, 29, (2, 6))
    model = _random_model(mhar_io.Config(**base, S=1), args.seed)
    l_full, g_full = _loss_and_grads(model, model._stream_full, idx, tgt)
    l_blk, g_blk = _loss_and_grads(model, lambda x: model._stream_block(x, 1), idx, tgt)
    e = worst(*([abs(l_full - l_blk) / abs(l_full)] + [rel_err(g_blk[k], g_full[k]) for k in g_full]))
    tally.check("block S=1 == full mode", e <= 1e-14, f"worst rel over loss+grads {e:.2e}")
    for S in (2, 3, 4, 7):
        model = _random_model(mhar_io.Config(**base, S=S), args.seed + S)
        l_m, g_m = _loss_and_grads(model, model.stream, idx, tgt)
        l_r, g_r = _loss_and_grads(model, lambda x: block_reference_stream(model, x, S), idx, tgt)
        e = worst(*([abs(l_m - l_r) / abs(l_r)] + [rel_err(g_m[k], g_r[k]) for k in g_r]))
        tally.check(f"block S={S} == SPEC 5 sources", e <= 1e-14,
                    f"worst rel over loss+grads {e:.2e}")
    # and block mode is not secretly full mode: with S=2 the loss must differ
    model = _random_model(mhar_io.Config(**base, S=2), args.seed)
    l2, _ = _loss_and_grads(model, model.stream, idx, tgt)
    l1, _ = _loss_and_grads(model, model._stream_full, idx, tgt)
    tally.check("block S=2 != full mode", abs(l2 - l1) > 1e-6, f"|dloss| {abs(l2 - l1):.2e}")

    print("[delta (SPEC 9): a converted std model computes exactly the same]")
    dbase = dict(V=29, Vp=128, T=6, L=3, C=16, NH=4, NKV=2, F=24)
    std = _random_model(mhar_io.Config(**dbase, mode="std"), args.seed)
    for H, S in ((2, 2), (4, 4)):
        delta = MHAR(mhar_io.Config(**dbase, mode="delta", H=H, S=S)).double()   # q=0, null=0, alpha=0
        with torch.no_grad():
            for name, p in std.named_parameters():
                getattr(delta, name).copy_(p)
        l_s, g_s = _loss_and_grads(std, std.stream, idx, tgt)
        l_d, g_d = _loss_and_grads(delta, delta.stream, idx, tgt)
        # the loss exactly (x + 0 * mix = x); the std gradients up to autograd's summation order
        # (x_0 is also b_0, read by every site: its gradient sums more, zero, terms), measured 3.7e-16
        ge = worst(*(rel_err(g_d[k], g_s[k]) for k in g_s))
        zero = all(float(g_d[k].abs().max()) == 0 for k in ("rq", "rg", "dnull"))
        alpha = float(g_d["dalpha"].abs().min())
        tally.check(f"delta H={H} S={S} alpha=0 == std", l_s == l_d and ge <= 1e-14 and zero and alpha > 0,
                    f"loss {l_d:.15f} vs {l_s:.15f}; std grads rel {ge:.1e}; q/gamma/null grads 0: "
                    f"{zero}; min|dalpha| {alpha:.1e}")
    dmodel = _random_model(mhar_io.Config(**dbase, mode="delta", H=2, S=2), args.seed)
    l_d, _ = _loss_and_grads(dmodel, dmodel.stream, idx, tgt)
    with torch.no_grad():
        dmodel.dalpha.zero_()
    l_0, _ = _loss_and_grads(dmodel, dmodel.stream, idx, tgt)
    l_s, _ = _loss_and_grads(dmodel, dmodel._stream_std, idx, tgt)
    tally.check("delta with moved alpha != std", abs(l_d - l_s) > 1e-6 and l_0 == l_s,
                f"|dloss| {abs(l_d - l_s):.2e}; alpha=0: {l_0 == l_s}")

    print("[hyper-connections vs SPEC 8]")
    # the SPEC's per-position backward formulas of one sublayer against autograd
    for n in (1, 2, 4):
        P, C = 5, 16
        X = torch.randn(n, P, C, dtype=f64, requires_grad=True)
        o = torch.randn(P, C, dtype=f64, requires_grad=True)
        alpha = torch.randn(n, dtype=f64, requires_grad=True)
        A = (torch.eye(n, dtype=f64) + 0.3 * torch.randn(n, n, dtype=f64)).requires_grad_(True)
        beta = torch.randn(n, dtype=f64, requires_grad=True)
        w = torch.softmax(alpha, 0)
        h = (w[:, None, None] * X).sum(0)
        Xn = torch.einsum("rs,spc->rpc", A, X) + beta[:, None, None] * o
        dXn, dh = torch.randn(n, P, C, dtype=f64), torch.randn(P, C, dtype=f64)
        auto = torch.autograd.grad((Xn * dXn).sum() + (h * dh).sum(), (X, o, alpha, A, beta))
        with torch.no_grad():
            dbeta = torch.einsum("rpc,pc->r", dXn, o)
            do = torch.einsum("r,rpc->pc", beta, dXn)
            dA = torch.einsum("rpc,spc->rs", dXn, X)
            dX = torch.einsum("rs,rpc->spc", A, dXn) + w[:, None, None] * dh
            dw = torch.einsum("pc,spc->s", dh, X)
            dalpha = w * (dw - (w * dw).sum())
        e = worst(*(rel_err(a, b) for a, b in zip(auto, (dX, do, dalpha, dA, dbeta))))
        tally.check(f"hc backward formulas n={n}", e <= 1e-13, f"worst rel {e:.2e} (dX, do, dalpha, dA, dbeta)")
    # model._stream_hc against the SPEC's recurrence written stream by stream
    hcbase = dict(V=29, Vp=128, T=6, L=2, C=16, NH=4, NKV=2, F=24, mode="hc")
    for n in (1, 3):
        model = _random_model(mhar_io.Config(**hcbase, n=n), args.seed + n)

        def literal(x0, model=model, n=n):
            Xs = [x0] * n
            for j in range(2 * model.cfg.L):
                w = torch.softmax(model.hcalpha[j], 0)
                h = sum(w[r] * Xs[r] for r in range(n))
                o = model.sublayer(j, h)
                Xs = [sum(model.hca[j][r, s] * Xs[s] for s in range(n)) + model.hcbeta[j][r] * o
                      for r in range(n)]
            return sum(Xs) / n
        l_m, g_m = _loss_and_grads(model, model.stream, idx, tgt)
        l_r, g_r = _loss_and_grads(model, literal, idx, tgt)
        e = worst(abs(l_m - l_r) / abs(l_r), *(rel_err(g_m[k], g_r[k]) for k in g_r))
        tally.check(f"hc n={n} == SPEC 8 recurrence", e <= 1e-13, f"worst rel over loss+grads {e:.2e}")
    m = MHAR(mhar_io.Config(**hcbase, n=4)).requires_grad_(False)
    eye = torch.eye(4, dtype=m.hca.dtype)
    e0 = torch.zeros(4, dtype=m.hcbeta.dtype)
    e0[0] = 1
    dev = max(float(m.hcalpha.abs().max()), float((m.hca - eye).abs().max()),
              float((m.hcbeta - e0).abs().max()))
    tally.check("hc init: alpha ~0, A ~I, beta ~e_0", 0 < dev < 0.12, f"max deviation {dev:.3f} (0.02 N(0,1))")

    print("[initialisation (SPEC 6) and the LM head]")
    cfg = mhar_io.Config(**base, S=1)
    m = MHAR(cfg).requires_grad_(False)
    ok = (float(m.rq.abs().max()) == 0.0 and bool((m.rg == 1).all()) and
          bool((m.ln1w == 1).all()) and bool((m.qnw == 1).all()) and
          bool((m.wte[cfg.V:] == 0).all()) and abs(float(m.wq.std()) - 0.02) < 0.002)
    tally.check("init: q=0, norms=1, N(0,.02)", ok, f"std(wq) {float(m.wq.std()):.4f}")
    model = _random_model(cfg, args.seed)
    model.zero_grad()
    model(idx, tgt).backward()
    e = float(model.wte.grad[cfg.V:].abs().max())
    tally.check("padded wte rows get no grad", e == 0.0, f"max|grad| {e:.1e}")
    logits = model(idx)
    tally.check("logits over V real rows", tuple(logits.shape) == (2, 6, cfg.V),
                f"shape {tuple(logits.shape)}")

    print("[bf16 autocast smoke test (the GPU baseline's precision, here on CPU)]")
    model32 = _random_model(mhar_io.Config(**base, S=2), args.seed).float()
    loss32 = model32(idx, tgt).item()
    model32.zero_grad()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss16 = model32(idx, tgt)
    loss16.backward()
    finite = all(bool(torch.isfinite(p.grad).all()) for p in model32.parameters())
    e = abs(loss16.item() - loss32) / abs(loss32)
    # bf16 has an 8-bit mantissa (rel. step 2^-8 = 3.9e-3); a few roundings deep, the loss
    # should agree with float32 to ~1e-2. This only catches gross dtype mistakes.
    tally.check("bf16 autocast loss ~ fp32", finite and e < 2e-2,
                f"fp32 {loss32:.5f}, bf16 {loss16.item():.5f}, rel {e:.1e}, grads finite {finite}")

    print("[file formats]")
    _io_self_test(tally, args.seed)

    print("[check_grads pipeline with the stand-in tool (fake_mhar_grads.py)]")
    fake = os.path.join(HERE, "fake_mhar_grads.py")
    workdir = tempfile.mkdtemp(prefix="mhar_selftest_")
    try:
        inner = Tally(quiet=True)
        for mode in MODES:
            run_mode(mode, fake, workdir, args.seed, inner)
        tally.check("pipeline: all modes pass", inner.failed == 0 and inner.passed > 0,
                    f"{inner.passed} passed, {inner.failed} failed")
        inner = Tally(quiet=True)
        run_mode("block4", fake, workdir, args.seed, inner, extra_args=("--corrupt", "wk"))
        tally.check("pipeline: corrupted wk caught", inner.failures == ["block4: wk"],
                    f"failures {inner.failures}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if tally.failures:
        print("failed: " + ", ".join(tally.failures))
    print(f"{tally.passed} passed, {tally.failed} failed")
    return 1 if tally.failed else 0


def _expect_error(tally, label, fn, needle, path):
    try:
        fn()
    except mhar_io.MharFormatError as e:
        msg = str(e)
        return tally.check(label, msg.startswith(path) and needle in msg, msg)
    return tally.check(label, False, "no error raised")


def _io_self_test(tally, seed):
    rng = np.random.default_rng(seed)
    d = tempfile.mkdtemp(prefix="mhar_io_")
    try:
        # shards, both widths
        for hi, label in ((50000, "uint16"), (100000, "uint32")):
            p = os.path.join(d, f"shard_{label}.bin")
            toks = rng.integers(0, hi, size=123)
            mhar_io.write_shard(p, toks)
            back = mhar_io.read_shard(p)
            magic = int(np.fromfile(p, dtype="<i4", count=1)[0])
            tally.check(f"shard {label} round trip", np.array_equal(back, toks),
                        f"magic {magic}")
        x, y = mhar_io.load_batch(p, 3, 5)
        tally.check("batch = first B*T+1 tokens", np.array_equal(x.ravel(), toks[:15]) and
                    np.array_equal(y.ravel(), toks[1:16]), "")
        # checkpoints: content 0/1/2, float32/float64, std and mhar
        for mode, content, bpe in (("mhar", 0, 4), ("std", 1, 4), ("mhar", 2, 8), ("hc", 1, 4)):
            cfg = mhar_io.Config(V=29, Vp=128, T=6, L=2, C=16, NH=4, NKV=2, F=24, mode=mode,
                                 H=2, S=3, n=3 if mode == "hc" else 0)
            mk = lambda: {n: rng.standard_normal(s) for n, s in mhar_io.param_layout(cfg)}
            prm, m, v = mk(), mk(), mk()
            p = os.path.join(d, f"ck_{mode}_{content}.bin")
            mhar_io.write_checkpoint(p, cfg, prm, content=content, bytes_per_elem=bpe, step=11,
                                     m=m, v=v, batch=(2, 6), loss=3.25)
            ck = mhar_io.read_checkpoint(p)
            dt = np.float32 if bpe == 4 else np.float64
            same = lambda A, B: all(np.array_equal(A[k], B[k].astype(dt)) for k in B)
            ok = ck.cfg == cfg and ck.step == 11 and same(ck.params, prm)
            if content == 1:
                ok = ok and same(ck.m, m) and same(ck.v, v)
            if content == 2:
                ok = ok and ck.loss == 3.25 and (ck.batch_B, ck.batch_T) == (2, 6)
            raw = open(p, "rb").read(4)
            tally.check(f"ckpt {mode} content {content} f{bpe * 8}", ok and raw == b"MHAR",
                        f"{os.path.getsize(p)} bytes, starts {raw!r}")
        # errors: bad magic, bad version, truncated, inconsistent config, shard mixed up
        good = os.path.join(d, "ck_mhar_0.bin")
        data = bytearray(open(good, "rb").read())
        ck0 = mhar_io.read_checkpoint(good)
        bad = os.path.join(d, "bad.bin")

        def write(b):
            with open(bad, "wb") as f:
                f.write(bytes(b))

        b = bytearray(data); b[0:4] = b"GPT2"; write(b)
        _expect_error(tally, "error: bad magic", lambda: mhar_io.read_checkpoint(bad),
                      "not an MHAR checkpoint", bad)
        b = bytearray(data); b[4:8] = np.array([3], "<i4").tobytes(); write(b)
        _expect_error(tally, "error: bad version", lambda: mhar_io.read_checkpoint(bad),
                      "version 3", bad)
        b = bytearray(data); b[-1] ^= 0x10; write(b)
        _expect_error(tally, "error: one flipped bit fails the checksum", lambda: mhar_io.read_checkpoint(bad),
                      "checksum mismatch", bad)
        b = bytearray(data); b[4:8] = np.array([1], "<i4").tobytes(); b[120:124] = b"\0\0\0\0"; write(b)
        tally.check("version-1 file (no checksum) still reads",
                    mhar_io.read_checkpoint(bad).params["wte"].shape == ck0.params["wte"].shape, bad)
        tally.check("crc32c('123456789') == 0xE3069283 (short and lane-split paths agree)",
                    mhar_io.crc32c(b"123456789") == 0xE3069283 and
                    mhar_io.crc32c(bytes(range(256)) * 40) == _crc32c_bytewise(bytes(range(256)) * 40),
                    hex(mhar_io.crc32c(b"123456789")))
        write(data[:-4])
        _expect_error(tally, "error: truncated", lambda: mhar_io.read_checkpoint(bad),
                      "size", bad)
        b = bytearray(data); b[11 * 4:12 * 4] = np.array([5], "<i4").tobytes(); write(b)
        _expect_error(tally, "error: H does not divide C", lambda: mhar_io.read_checkpoint(bad),
                      "H=5", bad)
        shard = os.path.join(d, "shard_uint16.bin")
        _expect_error(tally, "error: shard as checkpoint",
                      lambda: mhar_io.read_checkpoint(shard), "token shard", shard)
        _expect_error(tally, "error: short shard", lambda: mhar_io.load_batch(shard, 10, 20),
                      "needs 201", shard)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ----------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description="Compare the C tool's gradients with autograd on "
                                             "the SPEC model, for every residual mode.")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated subset of {','.join(MODES)} (default: all)")
    ap.add_argument("--tool", default=os.path.join(REPO, "dev", "mhar_grads"),
                    help="path of the gradient tool (default: <repo>/dev/mhar_grads)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary files")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--self-test", action="store_true",
                    help="test the model and this script without the C tool")
    args = ap.parse_args(argv)
    return self_test(args) if args.self_test else run_tool_checks(args)


if __name__ == "__main__":
    sys.exit(main())
