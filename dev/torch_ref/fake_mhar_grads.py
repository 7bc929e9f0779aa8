#!/usr/bin/python3
"""A stand-in for the C tool dev/mhar_grads, with the same command line, built on model.py.

It exists only to test check_grads.py's plumbing (files, headers, comparison, exit codes)
without the C code: its gradients come from the very model they are compared against, so a
pass against it proves nothing about SPEC. --corrupt NAME perturbs one gradient tensor, so
the self-test can show that check_grads notices and names it.

  ./fake_mhar_grads.py -r mhar -H 4 -S 2 -L 2 -C 32 -NH 4 -NKV 2 -F 48 -V 97 -T 8 -B 2 \
      -seed 7 -i SHARD.bin -o CKPT.bin -g GRADS.bin [--corrupt wq]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import mhar_io  # noqa: E402
from model import MHAR  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-r", choices=("std", "mhar", "attnres", "hc", "delta"), required=True)
    for name, default in (("-hc_n", 4), ("-H", 1), ("-S", 1), ("-L", 2), ("-C", 32), ("-NH", 4), ("-NKV", 2),
                          ("-F", 48), ("-V", 97), ("-T", 8), ("-B", 2), ("-seed", 7)):
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("-i", required=True)
    ap.add_argument("-o", required=True)
    ap.add_argument("-g", required=True)
    ap.add_argument("--corrupt", default=None, help="perturb this gradient tensor")
    a = ap.parse_args(argv)

    H = 1 if a.r in ("attnres", "hc", "std") else a.H
    mode = {"std": "std", "hc": "hc", "delta": "delta"}.get(a.r, "mhar")
    cfg = mhar_io.Config(V=a.V, Vp=(a.V + 127) // 128 * 128, T=a.T, L=a.L, C=a.C, NH=a.NH,
                         NKV=a.NKV, F=a.F, mode=mode, H=H, S=a.S if mode in ("mhar", "delta") else 1,
                         n=a.hc_n if mode == "hc" else 0)
    g = torch.Generator().manual_seed(a.seed)
    model = MHAR(cfg)
    model.init_weights(generator=g)
    with torch.no_grad():  # move routing parameters away from their 0 / 1 init
        if cfg.mode in ("mhar", "delta"):
            model.rq.normal_(0.0, 0.5, generator=g)
            model.rg.add_(torch.randn(model.rg.shape, generator=g) * 0.2)
        if cfg.mode == "delta":   # and delta's null sources and gates from their 0 init
            model.dnull.normal_(0.0, 0.3, generator=g)
            model.dalpha.normal_(0.0, 0.3, generator=g)
        if cfg.mode == "hc":
            model.hcalpha.normal_(0.0, 1.0, generator=g)
            model.hca.add_(torch.randn(model.hca.shape, generator=g) * 0.3)
            model.hcbeta.add_(torch.randn(model.hcbeta.shape, generator=g) * 0.3)
    params = {n: p.detach().numpy() for n, p in model.named_parameters()}
    mhar_io.write_checkpoint(a.o, cfg, params)  # float32, content 0

    # forward + backward in float64 from the float32 parameters just written
    ck = mhar_io.read_checkpoint(a.o)
    model = MHAR(cfg).double()
    model.load_checkpoint(ck)
    x, y = mhar_io.load_batch(a.i, a.B, a.T)
    loss = model(torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    if a.corrupt:
        grads[a.corrupt].flat[0] += 1e-6 * abs(grads[a.corrupt]).max()
    mhar_io.write_checkpoint(a.g, cfg, grads, content=mhar_io.CONTENT_GRADS, bytes_per_elem=8,
                             batch=(a.B, a.T), loss=loss.item())
    return 0


if __name__ == "__main__":
    sys.exit(main())
