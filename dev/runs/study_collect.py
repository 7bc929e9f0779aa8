#!/usr/bin/python3
"""Collect the study's run logs into one table and one figure.

Reads the matrix (dev/runs/study_matrix.txt: run names, seeds, flags, the common flags) and
every finished run's log under the results folder (dev/results/study/<run>/log.txt, the
trainer's format: "step N val_loss X", common/logger.h). A run is named METHOD_sSEED.

Per method:
  tail      mean val loss over the last quarter of training: the val points at steps
            > 0.75 * the run's last step (the paper's "tail mean over the last quarter")
  tail mean +- std over the seeds done (sample std, ddof 1; "-" for one seed)
  delta     tail(method, seed) - tail(std, seed) for each seed both have finished:
            mean +- std of these paired differences, and how many pairs
  tokens    steps x tokens per step (the trainer's line in the run's train.txt, else the matrix's -d)
Missing runs are listed as such; a val loss that is NaN or infinite is an error (exit 1),
never dropped. Probe outputs beside a log (probe_width.csv, probe.csv from dev/route_probe)
add a table of the width disagreement (SPEC section 10), the JS between heads and the mean
query norm over sites (how far the queries moved off their zero init), and
width.png beside the figure (dev/plot_width.py).

    /usr/bin/python3 dev/runs/study_collect.py [--results DIR] [--matrix FILE] [--table FILE] [--fig FILE]

Needs Debian's python3-numpy and python3-matplotlib (for the figure; --fig none skips it).
"""
import argparse
import csv
import math
import os
import re
import sys

# The paper's numbers (doc/SPEC.md section 6 and the paper's tables): val-loss change
# against std at 100M (its anneal corpus, 20K steps, one seed), and its 3-seed FineWeb study.
PAPER = {
    "std": "0 (baseline)",
    "attnres": "-0.060; FineWeb 3 seeds: -0.043 +- 0.003",
    "mhar8": "-0.061; FineWeb 3 seeds: -0.045 +- 0.007",
    "mhar16": "-0.035",
    "hc4": "-0.032 (hyper-connections)",
    "mhar8lr8": "not in the paper (our extension: -lr_route 8)",
}
PAPER_WIDTH = "100M: 0.273 trained, 0.038 null"


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_matrix(path):
    """(common flags, [(name, method, seed, flags)]) of a study matrix file."""
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        fail(f"cannot read the matrix {path}: {e.strerror}; pass --matrix dev/runs/study_matrix.txt")
    common, runs = None, []
    for ln, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "common":
            common = words[1:]
            continue
        if len(words) < 3 or not words[1].isdigit():
            fail(f"{path}:{ln}: '{line}' is not 'NAME SEED SPEED FLAGS...'")
        m = re.fullmatch(r"(.+)_s(\d+)", words[0])
        if m is None or int(m.group(2)) != int(words[1]):
            fail(f"{path}:{ln}: run name {words[0]} must be METHOD_sSEED with SEED = {words[1]}")
        runs.append((words[0], m.group(1), int(words[1]), " ".join(words[3:])))
    if common is None:
        fail(f"{path} has no 'common FLAGS...' line")
    return common, runs


def flag(common, name, default):
    for i, w in enumerate(common[:-1]):
        if w == "-" + name:
            return common[i + 1]
    return default


def read_log(path):
    """(val points [(step, loss)], last step, mean tok/s after step 5) of a trainer log."""
    vals, last, tps = [], 0, []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            w = line.split()
            if len(w) >= 4 and w[0] == "step" and w[2] in ("val_loss", "train_loss"):
                try:
                    step, x = int(w[1]), float(w[3])
                except ValueError:
                    fail(f"{path}:{ln}: cannot read '{line.strip()}'; the log is damaged")
                if w[2] == "val_loss":
                    if not math.isfinite(x):
                        fail(f"{path}:{ln}: val loss {w[3]} at step {step} is not finite; the run diverged "
                             f"(rerun it, e.g. with a lower -lr) or the log is damaged: it is not dropped")
                    vals.append((step, x))
                else:
                    last = max(last, step)
                    if step > 5 and len(w) >= 12 and w[10] == "tok_s":
                        tps.append(float(w[11]))
    if not vals:
        fail(f"{path} has no val_loss lines; is it a trainer log (common/logger.h) of a run with -val_every?")
    return vals, last, (sum(tps) / len(tps) if tps else float("nan"))


def tail_mean(vals, last):
    tail = [x for s, x in vals if s > 0.75 * last]
    if not tail:
        return float("nan")
    return sum(tail) / len(tail)


def mean_std(xs):
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(xs) / n
    if n == 1:
        return m, float("nan")
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def fmt(m, s, digits=4, sign=False):
    if math.isnan(m):
        return "-"
    body = f"{m:+.{digits}f}" if sign else f"{m:.{digits}f}"
    return body + ("" if math.isnan(s) else f" +- {s:.{digits}f}")


def read_width(path):
    """Mean trained and null KL over sites with >= 2 sources of a route_probe -k CSV."""
    rows = list(csv.DictReader(open(path)))
    multi = [r for r in rows if int(r["n_sources"]) >= 2]
    if not multi:
        fail(f"{path} has no site with two or more sources; re-create it with dev/route_probe -k")
    kl = [float(r["kl_nats"]) for r in multi]
    nl = [float(r["kl_null_nats"]) for r in multi]
    qn = [float(r["q_norm"]) for r in multi]
    if not all(math.isfinite(x) for x in kl + nl):
        fail(f"{path} holds a KL that is not finite; the checkpoint may hold NaNs")
    return sum(kl) / len(kl), sum(nl) / len(nl), sum(qn) / len(qn)


def read_js(path):
    """Mean per-position and averaged JS (bits) over sites with >= 2 sources of a route_probe -o CSV."""
    sites = {}
    for r in csv.DictReader(open(path)):
        s = sites.setdefault(r["site"], [0, r["js_avg_bits"], r["js_pos_bits"]])
        s[0] += r["head"] == "0"
    multi = [(float(a), float(p)) for n, a, p in sites.values() if n >= 2]
    if not multi or any(math.isnan(a) for a, _ in multi):
        return float("nan"), float("nan")
    return sum(a for a, _ in multi) / len(multi), sum(p for _, p in multi) / len(multi)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="dev/results/study", help="folder of the run folders")
    ap.add_argument("--matrix", default="dev/runs/study_matrix.txt")
    ap.add_argument("--table", default=None, help="markdown table (default RESULTS/table.md)")
    ap.add_argument("--fig", default=None, help="PNG of the val loss curves (default RESULTS/val_loss.png; none: skip)")
    args = ap.parse_args()
    table_path = args.table or os.path.join(args.results, "table.md")
    fig_path = args.fig or os.path.join(args.results, "val_loss.png")
    common, runs = read_matrix(args.matrix)
    tok_step = int(flag(common, "d", "0"))
    steps_planned = int(flag(common, "n", "0"))

    methods, flags_of = [], {}
    for name, method, seed, flags in runs:
        if method not in flags_of:
            methods.append(method)
            flags_of[method] = flags
    res = {}   # (method, seed) -> dict
    for name, method, seed, flags in runs:
        path = os.path.join(args.results, name, "log.txt")
        if not os.path.exists(path):
            continue
        vals, last, tps = read_log(path)
        if steps_planned and last != steps_planned:
            fail(f"{path} ends at step {last}, the matrix plans {steps_planned}: an unfinished run does not "
                 f"belong in {args.results}; delete its folder and run it again")
        d = os.path.dirname(path)
        # tokens per step: the trainer's own line in train.txt (study.sh keeps it), else the matrix's -d
        per_step = tok_step
        if os.path.exists(os.path.join(d, "train.txt")):
            m_ = re.search(r"micro-batches per step = (\d+) tokens", open(os.path.join(d, "train.txt")).read())
            per_step = int(m_.group(1)) if m_ else per_step
        r = dict(name=name, vals=vals, last=last, tail=tail_mean(vals, last), tps=tps,
                 final=vals[-1][1], tokens=last * per_step if per_step else None)
        if os.path.exists(os.path.join(d, "probe_width.csv")):
            r["width"] = read_width(os.path.join(d, "probe_width.csv"))
        if os.path.exists(os.path.join(d, "probe.csv")):
            r["js"] = read_js(os.path.join(d, "probe.csv"))
        res[(method, seed)] = r
    seeds_of = {m: sorted(s for (mm, s) in ((r[1], r[2]) for r in runs) if mm == m) for m in methods}

    out = []
    out.append("# The study: val loss per method (dev/runs/study.sh, collected by dev/runs/study_collect.py)\n")
    out.append(f"Matrix: `{args.matrix}`; common flags: `{' '.join(common)}`.")
    out.append(f"Tail = mean val loss over the val points at steps > 3/4 of the run; mean +- sample std over seeds; "
               f"delta = tail(method, seed) - tail(std, seed), paired by seed (mean +- std of the paired differences).\n")
    out.append("| method | flags | seeds done | tail val loss | delta vs std (paired) | pairs | final val loss | tokens per run | tok/s | paper: delta vs std |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for m in methods:
        done = [s for s in seeds_of[m] if (m, s) in res]
        tails = [res[(m, s)]["tail"] for s in done]
        pairs = [res[(m, s)]["tail"] - res[("std", s)]["tail"] for s in done if ("std", s) in res]
        missing = [s for s in seeds_of[m] if s not in done]
        seeds_txt = f"{len(done)} of {len(seeds_of[m])}" + (f" (missing: {', '.join('s%d' % s for s in missing)})" if missing else "")
        if not done:
            out.append(f"| {m} | `{flags_of[m]}` | {seeds_txt} | not run | - | - | - | - | - | {PAPER.get(m, '-')} |")
            continue
        toks = sorted({res[(m, s)]["tokens"] for s in done if res[(m, s)]["tokens"]})
        tps = mean_std([res[(m, s)]["tps"] for s in done])[0]
        if m == "std":
            delta, npairs = "0 (baseline)", "-"
        else:
            delta = fmt(*mean_std(pairs), sign=True) if pairs else "no paired seed"
            npairs = str(len(pairs))
        out.append(f"| {m} | `{flags_of[m]}` | {seeds_txt} | {fmt(*mean_std(tails))} | {delta} | {npairs} | "
                   f"{fmt(*mean_std([res[(m, s)]['final'] for s in done]))} | {'/'.join(f'{t:,}' for t in toks) or '?'} | "
                   f"{'-' if math.isnan(tps) else f'{tps:,.0f}'} | {PAPER.get(m, '-')} |")
    out.append("")
    out.append("Per run (tail val loss):\n")
    out.append("| run | tail | final | last step |")
    out.append("|---|---|---|---|")
    for name, method, seed, flags in runs:
        r = res.get((method, seed))
        out.append(f"| {name} | {r['tail']:.4f} | {r['final']:.4f} | {r['last']} |" if r else f"| {name} | not run | - | - |")
    probed = [m for m in methods if any("width" in res.get((m, s), {}) for s in seeds_of[m])]
    if probed:
        out.append("")
        out.append(f"Routing probe (dev/route_probe -k, -o): width disagreement KL(a_s || alpha), nats, 4 slices, mean over "
                   f"sites with two or more sources (paper: {PAPER_WIDTH}); JS between routing heads, bits.\n")
        out.append("| method | probed | KL trained | KL null | excess | JS averaged | JS per position | mean query norm |q_j| |")
        out.append("|---|---|---|---|---|---|---|---|")
        for m in probed:
            rs = [res[(m, s)] for s in seeds_of[m] if "width" in res.get((m, s), {})]
            kl = mean_std([r["width"][0] for r in rs])
            nl = mean_std([r["width"][1] for r in rs])
            ex = mean_std([r["width"][0] - r["width"][1] for r in rs])
            js = [r["js"] for r in rs if "js" in r]
            ja = mean_std([j[0] for j in js if not math.isnan(j[0])])
            jp = mean_std([j[1] for j in js if not math.isnan(j[1])])
            qn = mean_std([r["width"][2] for r in rs])
            out.append(f"| {m} | {len(rs)} | {fmt(*kl)} | {fmt(*nl)} | {fmt(*ex)} | {fmt(*ja)} | {fmt(*jp)} | {fmt(*qn, digits=3)} |")
    text = "\n".join(out) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(table_path)), exist_ok=True)
    with open(table_path + ".tmp", "w") as f:
        f.write(text)
    os.replace(table_path + ".tmp", table_path)
    print(text, end="")
    print(f"wrote {table_path}")

    if fig_path != "none" and res:
        draw(fig_path, methods, seeds_of, res)
        print(f"wrote {fig_path}")
        # the width disagreement per site of every probed run, beside val_loss.png
        csvs = [(res[(m, s)]["name"], os.path.join(args.results, res[(m, s)]["name"], "probe_width.csv"))
                for m in probed for s in seeds_of[m] if "width" in res.get((m, s), {})]
        if csvs:
            width_png = os.path.join(os.path.dirname(fig_path) or ".", "width.png")
            import subprocess
            here = os.path.dirname(os.path.abspath(__file__))
            subprocess.run([sys.executable, os.path.join(here, "..", "plot_width.py"), *[c for _, c in csvs],
                            "--labels", *[n for n, _ in csvs], "--out", width_png], check=True)


def draw(path, methods, seeds_of, res):
    """Left: val loss per method, mean over seeds with a min..max band. Right: the paired
    difference against std at each val step, mean over seeds with a +- std band. Both zoom on
    the later two thirds of training; grey marks the last quarter (the table's tail)."""
    import numpy as np
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    lo_all, d_all, last = [], [], 0
    for k, m in enumerate(methods):
        done = [s for s in seeds_of[m] if (m, s) in res]
        if not done:
            continue
        steps = sorted(set.intersection(*[{s for s, _ in res[(m, d)]["vals"]} for d in done]))
        y = np.array([[dict(res[(m, d)]["vals"])[s] for s in steps] for d in done])
        color = f"C{k % 10}"
        ax.plot(steps, y.mean(0), color=color, label=f"{m} ({len(done)} seeds)")
        ax.fill_between(steps, y.min(0), y.max(0), color=color, alpha=0.2)
        lo_all.append(y[:, len(steps) // 3:])
        last = max(last, steps[-1])
        paired = [d for d in done if ("std", d) in res]
        if m != "std" and paired:
            base = [dict(res[("std", d)]["vals"]) for d in paired]
            st = [s for s in steps if all(s in b for b in base)]
            diff = np.array([[dict(res[(m, d)]["vals"])[s] - b[s] for s in st] for d, b in zip(paired, base)])
            sd = diff.std(0, ddof=1) if len(paired) > 1 else np.zeros(len(st))
            bx.plot(st, diff.mean(0), color=color, label=f"{m} - std ({len(paired)} pairs)")
            bx.fill_between(st, diff.mean(0) - sd, diff.mean(0) + sd, color=color, alpha=0.2)
            later = slice(len(st) // 3, None)
            d_all.append(np.concatenate([(diff.mean(0) - sd)[later], (diff.mean(0) + sd)[later]]))
    if lo_all:   # zoom on the later two thirds, where the methods separate
        vals = np.concatenate([v.ravel() for v in lo_all])
        pad = 0.05 * (vals.max() - vals.min() + 1e-9)
        ax.set_ylim(vals.min() - pad, vals.max() + pad)
    if d_all:   # the same zoom for the differences: early ones are large and say little
        vals = np.concatenate(d_all + [np.zeros(1)])
        pad = 0.05 * (vals.max() - vals.min() + 1e-9)
        bx.set_ylim(vals.min() - pad, vals.max() + pad)
    for a in (ax, bx):   # the tail: the last quarter, whose val points the table averages
        a.axvspan(0.75 * last, last, color="0.9", zorder=0)
    ax.set_xlabel("step"); ax.set_ylabel("val loss"); ax.grid(alpha=0.3); ax.legend(fontsize=8)
    ax.set_title("val loss: mean over seeds, band min..max", fontsize=10)
    bx.axhline(0, color="k", lw=0.8)
    bx.set_xlabel("step"); bx.set_ylabel("val loss - std's (same seed)"); bx.grid(alpha=0.3)
    bx.set_title("paired difference against std: mean, band +- std over seeds", fontsize=10)
    if bx.lines[1:]:
        bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=120)
    os.replace(path + ".tmp.png", path)


if __name__ == "__main__":
    main()
