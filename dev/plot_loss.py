#!/usr/bin/python3
"""Draw train and val loss curves of one or more training logs into a PNG.

Reads the log.txt that train_mhar writes with -o DIR (format in common/logger.h):
    step 12 train_loss 5.123456789 lr 3.0000e-04 grad_norm 1.2345 ms 812.3 tok_s 1260
    step 50 val_loss 4.987654321
Each run gets one color: train loss as a thin line (optionally EMA-smoothed, the
raw curve then drawn faintly behind it), val loss as markers joined by a line.
The legend names each run by its directory, or by --labels.

    python3 dev/plot_loss.py runs/std/log.txt runs/mhar/log.txt --out loss.png
    python3 dev/plot_loss.py runs/std runs/mhar --labels std "mhar H=8" --ema 0.9 --title "100M"

A directory argument means DIR/log.txt. A resumed run appends to its log; when
a step appears twice, the later line wins. Needs Debian's python3-matplotlib.
"""
import argparse
import os
import re
import sys

TRAIN_RE = re.compile(r"^step (\d+) train_loss (\S+)")
VAL_RE = re.compile(r"^step (\d+) val_loss (\S+)")


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_log(path):
    """(train, val): lists of (step, loss) sorted by step, the last line of a step winning."""
    train, val = {}, {}
    try:
        with open(path) as f:
            for line in f:
                for regex, into in ((TRAIN_RE, train), (VAL_RE, val)):
                    m = regex.match(line)
                    if m:
                        try:
                            into[int(m.group(1))] = float(m.group(2))
                        except ValueError:
                            pass   # a line cut short while the trainer was writing it
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}; pass the log.txt written by train_mhar -o DIR")
    except UnicodeDecodeError:
        fail(f"{path} is not a text file; pass the log.txt written by train_mhar -o DIR")
    if not train and not val:
        fail(f"{path} has no 'step N train_loss X' or 'step N val_loss X' lines; "
             "pass the log.txt written by train_mhar -o DIR (format in common/logger.h)")
    return sorted(train.items()), sorted(val.items())


def ema(values, beta):
    """Exponential moving average with bias correction (starts at the first value, not at 0)."""
    out, s = [], 0.0
    for i, v in enumerate(values):
        s = beta * s + (1 - beta) * v
        out.append(s / (1 - beta ** (i + 1)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", help="log.txt files (or run directories holding one)")
    ap.add_argument("--labels", nargs="+", default=None, help="one legend name per log (default: directory names)")
    ap.add_argument("--out", default="loss.png", help="output PNG (default loss.png)")
    ap.add_argument("--title", default="training loss", help="figure title")
    ap.add_argument("--ema", type=float, default=0.0, metavar="BETA",
                    help="smooth the train loss with an EMA of this factor, e.g. 0.9; 0 = off (default)")
    ap.add_argument("--ymax", type=float, default=None, help="upper y limit (cuts off the first steps' high loss)")
    args = ap.parse_args()
    if not 0.0 <= args.ema < 1.0:
        fail(f"--ema {args.ema} must be in [0, 1): 0 is off, 0.9 a typical smoothing")
    paths = [os.path.join(p, "log.txt") if os.path.isdir(p) else p for p in args.logs]
    if args.labels is not None and len(args.labels) != len(paths):
        fail(f"--labels has {len(args.labels)} names for {len(paths)} logs; give one name per log")
    labels = args.labels or [os.path.basename(os.path.dirname(os.path.abspath(p))) for p in paths]
    runs = [read_log(p) for p in paths]   # read all first: a bad log fails before any drawing

    import matplotlib
    matplotlib.use("Agg")   # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, ((train, val), label) in enumerate(zip(runs, labels)):
        color = colors[k % len(colors)]
        if train:
            steps, losses = zip(*train)
            if args.ema > 0:
                ax.plot(steps, losses, color=color, linewidth=0.6, alpha=0.25)
                ax.plot(steps, ema(losses, args.ema), color=color, linewidth=1.0, label=f"{label} train (EMA {args.ema:g})")
            else:
                ax.plot(steps, losses, color=color, linewidth=0.8, label=f"{label} train")
        if val:
            steps, losses = zip(*val)
            ax.plot(steps, losses, color=color, linewidth=1.2, linestyle="--", marker="o", markersize=4,
                    label=f"{label} val (last {losses[-1]:.4f})")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(args.title)
    if args.ymax is not None:
        ax.set_ylim(top=args.ymax)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(args.out)
    except OSError as e:
        fail(f"cannot write {args.out}: {e.strerror}; check the --out directory")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
