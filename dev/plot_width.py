#!/usr/bin/python3
"""Draw the width disagreement of one or more checkpoints (dev/route_probe -k CSV) as a PNG.

Per routing site (x): KL(a_s || alpha) of the trained query (solid) and of random queries of
the same norm (dashed, the null), in nats (SPEC section 10). The legend gives each file's mean
over the sites with two or more sources, the number the paper reports (100M: 0.273 trained,
0.038 null).

    python3 dev/plot_width.py runs/a/probe_width.csv [more.csv ...] [--labels A ...] --out width.png

Needs Debian's python3-matplotlib and python3-numpy.
"""
import argparse
import csv
import math
import sys

COLUMNS = ["site", "site_feeds", "n_sources", "q_norm", "kl_nats", "kl_null_nats"]


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_width(path):
    """(sites, feeds, n, kl, null) of a route_probe -k CSV; dies with one line on a bad file."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != COLUMNS:
                fail(f"{path} has columns {reader.fieldnames}, not those of dev/route_probe -k "
                     f"({','.join(COLUMNS)}); make it with dev/route_probe -k")
            rows = [(int(r["site"]), r["site_feeds"], int(r["n_sources"]), float(r["kl_nats"]),
                     float(r["kl_null_nats"])) for r in reader]
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}; run dev/route_probe -k {path} first")
    except (ValueError, KeyError, TypeError):
        fail(f"{path} has a malformed row; re-create it with dev/route_probe -k")
    if not rows:
        fail(f"{path} has a header but no rows; re-create it with dev/route_probe -k")
    for r in rows:
        if not (math.isfinite(r[3]) and math.isfinite(r[4])):
            fail(f"{path}: site {r[0]} has KL {r[3]} / null {r[4]}, not finite; the checkpoint may hold NaNs")
    return rows


def site_means(rows):
    """Mean trained and null KL over the sites with two or more sources."""
    multi = [r for r in rows if r[2] >= 2]
    if not multi:
        return float("nan"), float("nan")
    return sum(r[3] for r in multi) / len(multi), sum(r[4] for r in multi) / len(multi)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="CSVs written by dev/route_probe -k")
    ap.add_argument("--labels", nargs="+", default=None, help="legend labels, one per CSV (default: the paths)")
    ap.add_argument("--out", required=True, help="output PNG")
    ap.add_argument("--title", default="width disagreement KL(a_s || alpha) per routing site (SPEC 10)")
    args = ap.parse_args()
    if args.labels is not None and len(args.labels) != len(args.csv):
        fail(f"--labels has {len(args.labels)} names for {len(args.csv)} CSVs; give one per CSV")
    runs = [read_width(p) for p in args.csv]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for k, rows in enumerate(runs):
        label = args.labels[k] if args.labels else args.csv[k]
        kl, nl = site_means(rows)
        color = f"C{k % 10}"
        xs = [r[0] for r in rows]
        ax.plot(xs, [r[3] for r in rows], "-o", color=color, ms=3, label=f"{label}: trained {kl:.3f}")
        ax.plot(xs, [r[4] for r in rows], "--", color=color, alpha=0.7, label=f"{label}: null {nl:.3f}")
    ticks = runs[0]
    ax.set_xticks([r[0] for r in ticks])
    ax.set_xticklabels([f"{r[0]} {r[1]}" for r in ticks], rotation=70, fontsize=7)
    ax.set_xlabel("routing site (what it feeds)")
    ax.set_ylabel("KL, nats")
    ax.set_title(args.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
