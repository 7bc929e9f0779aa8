#!/usr/bin/python3
"""Draw the routing probe's CSV (dev/route_probe) as a heatmap PNG.

One panel per routing head: routing sites on y (top = site 0, the input of the
first attention; bottom = the final norm), sources on x (the slot each source
lives in: emb, attn0, mlp0, ... in full mode; emb, b1, b2, ... and the partial
block sums in block mode), color = mean routing weight over positions. Cells a
site cannot read (later sources) are blank. A last column shows, per site, how
much the heads disagree: the mean pairwise Jensen-Shannon divergence (bits)
between the heads' averaged distributions, and its per-position version.

    python3 dev/plot_routing.py runs/x/route.csv --out runs/x/route.png [--title TEXT]

Needs Debian's python3-matplotlib and python3-numpy (apt-get install python3-matplotlib).
"""
import argparse
import csv
import math
import os
import sys

COLUMNS = ["site", "head", "source_index", "source_slot", "source_label", "weight",
           "site_feeds", "js_avg_bits", "js_pos_bits"]


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_probe(path):
    """Rows of the CSV as dicts with typed values; dies with one line on a bad file."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != COLUMNS:
                fail(f"{path} has columns {reader.fieldnames}, not those of dev/route_probe "
                     f"({','.join(COLUMNS)}); make it with dev/route_probe -o")
            rows = []
            for r in reader:
                rows.append(dict(site=int(r["site"]), head=int(r["head"]), slot=int(r["source_slot"]),
                                 label=r["source_label"], weight=float(r["weight"]), feeds=r["site_feeds"],
                                 js_avg=float(r["js_avg_bits"]), js_pos=float(r["js_pos_bits"])))
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}; run dev/route_probe -o {path} first")
    except (ValueError, KeyError, TypeError):
        fail(f"{path} has a malformed row; re-create it with dev/route_probe -o")
    if not rows:
        fail(f"{path} has a header but no rows; re-create it with dev/route_probe -o")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="CSV written by dev/route_probe -o")
    ap.add_argument("--out", default=None, help="output PNG (default: the CSV's name with .png)")
    ap.add_argument("--title", default=None, help="figure title (default: the CSV's path)")
    ap.add_argument("--annotate", choices=["auto", "yes", "no"], default="auto",
                    help="print the weight in each cell (auto: when the grid is small)")
    ap.add_argument("--relative", action="store_true",
                    help="color = weight * n_j, the weight relative to the uniform 1/n_j of zero queries "
                         "(red: read more than uniform, blue: less); cell numbers stay the weights")
    args = ap.parse_args()
    out = args.out or os.path.splitext(args.csv)[0] + ".png"
    rows = read_probe(args.csv)

    import matplotlib
    matplotlib.use("Agg")   # no display needed
    import matplotlib.pyplot as plt
    import numpy as np

    nsites = max(r["site"] for r in rows) + 1
    H = max(r["head"] for r in rows) + 1
    nslots = max(r["slot"] for r in rows) + 1
    # W[h, site, slot] = mean weight; NaN where the site does not read the slot
    W = np.full((H, nsites, nslots), np.nan)
    slot_label = {}
    feeds = [""] * nsites
    js_avg = np.full(nsites, np.nan)
    js_pos = np.full(nsites, np.nan)
    for r in rows:
        W[r["head"], r["site"], r["slot"]] = r["weight"]
        slot_label[r["slot"]] = r["label"]
        feeds[r["site"]] = r["feeds"]
        js_avg[r["site"]], js_pos[r["site"]] = r["js_avg"], r["js_pos"]
    # partial block sums all share the label "partial": name them by slot
    xt = [slot_label.get(k, "") if slot_label.get(k) != "partial" else f"part{k}" for k in range(nslots)]
    yt = [f"{j} > {feeds[j]}" for j in range(nsites)]

    # layout: up to 4 head panels per row, then the JS bars and the colorbar.
    # The axes fill the figure exactly (labels spill out and bbox_inches="tight"
    # keeps them), so the figure size sets the axes' size: cells come out square.
    ncols = min(H, 4)
    nrows = math.ceil(H / ncols)
    cell = 0.36 if nslots <= 12 else 0.22   # inches per cell
    pw, ph, jw, cw = nslots * cell, nsites * cell, 2.2, 0.15
    ws, hs = 0.3, 1.2   # gaps between panels in inches (room for tick labels and titles)
    fig_w, fig_h = ncols * pw + jw + cw + (ncols + 1) * ws, nrows * ph + (nrows - 1) * hs
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=100)
    ratios = [pw] * ncols + [jw, cw]
    gs = fig.add_gridspec(nrows, ncols + 2, width_ratios=ratios, left=0, right=1, bottom=0, top=1,
                          wspace=ws / (sum(ratios) / len(ratios)), hspace=hs / ph)
    # the color scale: absolute weights up to the largest weight of a site with
    # more than one source (site 0 always reads emb with weight 1 and would wash
    # out the others), or weights relative to uniform, centered on 1
    nsrc = np.sum(~np.isnan(W[0]), axis=1)   # n_j per site
    multi = W[:, nsrc > 1, :]
    vmax = float(np.nanmax(multi)) if multi.size and not np.all(np.isnan(multi)) else 1.0
    if args.relative:
        from matplotlib.colors import TwoSlopeNorm
        C = W * nsrc[None, :, None]
        rmax = max(1.5, float(np.nanmax(C[:, nsrc > 1, :])) if np.any(nsrc > 1) else 1.5)
        norm, cmap_name, cbar_label = TwoSlopeNorm(vmin=0, vcenter=1, vmax=rmax), "RdBu_r", "weight x n_j (1 = uniform)"
    else:
        C = W
        norm, cmap_name, cbar_label = None, "viridis", "mean routing weight"
    annotate = args.annotate == "yes" or (args.annotate == "auto" and nsites * nslots <= 100 and H <= 8)
    cmap = plt.get_cmap(cmap_name).copy()
    cmap.set_bad("white")
    im = None
    for h in range(H):
        ax = fig.add_subplot(gs[h // ncols, h % ncols])
        if norm is None:
            im = ax.imshow(C[h], cmap=cmap, vmin=0, vmax=vmax, aspect="auto", interpolation="nearest")
        else:
            im = ax.imshow(C[h], cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=10)
        ax.set_xticks(range(nslots))
        ax.set_xticklabels(xt, rotation=90, fontsize=7)
        ax.set_yticks(range(nsites))
        ax.set_yticklabels(yt if h % ncols == 0 else [], fontsize=7)
        if h % ncols == 0:
            ax.set_ylabel("routing site > what it feeds", fontsize=8)
        if h // ncols == nrows - 1:
            ax.set_xlabel("source", fontsize=8)
        if annotate:
            for j in range(nsites):
                for k in range(nslots):
                    w = W[h, j, k]
                    if not np.isnan(w):
                        dark = (w < 0.6 * vmax) if norm is None else abs(norm(C[h, j, k]) - 0.5) > 0.3
                        ax.text(k, j, f"{w:.2f}"[1:] if w < 0.995 else "1", ha="center", va="center",
                                fontsize=6, color="white" if dark else "black")
    # JS per site: how differently the heads read depth at that site
    axj = fig.add_subplot(gs[:, ncols])
    y = np.arange(nsites)
    if H > 1:
        axj.barh(y - 0.2, js_avg, height=0.4, color="tab:blue", label="averaged")
        axj.barh(y + 0.2, js_pos, height=0.4, color="tab:orange", label="per position")
        xmax = max(0.05, float(np.nanmax(js_pos)) * 1.6)
        for j in range(nsites):   # the numbers too: small values make invisible bars
            axj.text(max(js_avg[j], js_pos[j]) + 0.02 * xmax, j, f"{js_avg[j]:.3f}/{js_pos[j]:.3f}",
                     va="center", fontsize=6)
        axj.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
        axj.set_xlim(0, xmax)
    else:
        axj.text(0.5, 0.5, "H = 1:\nno head pairs", ha="center", va="center", transform=axj.transAxes)
    axj.set_ylim(nsites - 0.5, -0.5)
    axj.set_yticks(range(nsites))
    axj.set_yticklabels([str(j) for j in range(nsites)], fontsize=7)
    axj.set_title("head disagreement", fontsize=10)
    axj.set_xlabel("mean pairwise JS (bits)", fontsize=8)
    axj.tick_params(axis="x", labelsize=7)
    cax = fig.add_subplot(gs[:, ncols + 1])
    fig.colorbar(im, cax=cax, extend="max" if norm is None and vmax < 1 else "neither").set_label(cbar_label, fontsize=8)
    cax.tick_params(labelsize=7)
    fig.suptitle(args.title or f"MHAR routing: {args.csv}", fontsize=11, y=1 + 0.4 / fig_h, va="bottom")
    try:
        fig.savefig(out, bbox_inches="tight")
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror}; check the --out directory")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
