#!/usr/bin/python3
"""Draw the learned hyper-connection parameters of an hc checkpoint (SPEC section 8) as a PNG.

Three panels, one row per sublayer j (attn0, mlp0, attn1, ...; top = the first):
  read weights  w_j = softmax(alpha_j): how much of each stream r sublayer j reads (rows sum to 1);
  stream mix    A_j[r, s], drawn as one row of n x n cells per sublayer (r major, s minor), with
                the value written in each cell: how stream s flows into stream r across sublayer j
                (the identity at initialisation);
  write weights beta_j[r]: how much of the sublayer's output o_j each stream r receives
                (e_0 at initialisation: only stream 0).
The initialisation (alpha ~ 0, A ~ I, beta ~ e_0, all within 0.02 N(0,1)) gives w ~ 1/n, so
anything else in the picture was learned.

    python3 dev/plot_hc.py runs/x/ckpt_000300.bin --out doc/hc_params.png [--title TEXT]

Needs Debian's python3-matplotlib and python3-numpy (apt-get install python3-matplotlib).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_ref"))

import numpy as np  # noqa: E402

import mhar_io  # noqa: E402


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def softmax(a):
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--title", default=None)
    a = ap.parse_args(argv)
    try:
        ck = mhar_io.read_checkpoint(a.checkpoint)
    except (mhar_io.MharFormatError, OSError) as e:
        fail(str(e).replace("\n", " "))
    if ck.content == mhar_io.CONTENT_GRADS:
        fail(f"{a.checkpoint} is a gradient dump, not a checkpoint; give a trainer's ckpt_STEP.bin")
    if ck.cfg.mode != "hc":
        fail(f"{a.checkpoint} has no hyper-connections: {ck.cfg.mode} mode; give a checkpoint of train_mhar -r hc")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, p = ck.cfg, ck.params
    n, J = cfg.n, 2 * cfg.L
    w = softmax(p["hcalpha"].astype(np.float64))            # (2L, n)
    A = p["hca"].astype(np.float64).reshape(J, n * n)      # (2L, n*n), r major
    beta = p["hcbeta"].astype(np.float64)                  # (2L, n)
    names = [f"{'attn' if j % 2 == 0 else 'mlp'}{j // 2}" for j in range(J)]

    fig, axes = plt.subplots(1, 3, figsize=(4 + 1.1 * n + 0.55 * n * n, 1.2 + 0.42 * J),
                             gridspec_kw={"width_ratios": [n, n * n, n]})
    panels = [
        (w, "read weights w = softmax(alpha)", [f"{r}" for r in range(n)], "stream r", "viridis", (0, 1)),
        (A, "stream mix A[r, s]", [f"{r},{s}" for r in range(n) for s in range(n)], "r, s (stream s -> r)",
         "RdBu_r", None),
        (beta, "write weights beta[r]", [f"{r}" for r in range(n)], "stream r", "RdBu_r", None),
    ]
    for ax, (M, title, xt, xl, cmap, lim) in zip(axes, panels):
        if lim is None:
            m = max(float(np.abs(M).max()), 1e-9)
            lim = (-m, m)
        im = ax.imshow(M, cmap=cmap, vmin=lim[0], vmax=lim[1], aspect="auto")
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(M.shape[1]))
        ax.set_xticklabels(xt, fontsize=7, rotation=90 if M.shape[1] > 8 else 0)
        ax.set_xlabel(xl, fontsize=8)
        ax.set_yticks(range(J))
        ax.set_yticklabels(names, fontsize=8)
        for y in range(M.shape[0]):
            for x in range(M.shape[1]):
                v = M[y, x]
                ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if (cmap == "viridis" and v < 0.5) or
                        (cmap != "viridis" and abs(v) > 0.6 * lim[1]) else "black")
        fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    fig.suptitle(a.title or f"hyper-connections, n={n}, L={cfg.L}, C={cfg.C}: {os.path.basename(a.checkpoint)}"
                 f" (step {ck.step})", fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"plot_hc: {a.out}: {J} sublayers, n={n}; read weights {w.min():.3f} .. {w.max():.3f}, "
          f"max |A - I| {np.abs(A - np.eye(n).ravel()).max():.3f}, beta {beta.min():.3f} .. {beta.max():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
