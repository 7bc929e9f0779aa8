#!/usr/bin/env bash
# The README's main job, end to end on a fresh machine: install what is
# missing (Debian), build, fetch Moby Dick, tokenise it, train a small MHAR
# model on the CPU for a few minutes, print samples along the way, and draw
# the loss curve (runs/quickstart/loss.png) with Debian's python3-matplotlib.
# A rerun replaces the previous quickstart run (-overwrite 1).
#   make quickstart            (or: bash dev/quickstart.sh [extra train_mhar flags])
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v gcc >/dev/null || missing+=(gcc)
command -v make >/dev/null || missing+=(make)
command -v npm >/dev/null || missing+=(npm)
command -v xz >/dev/null || missing+=(xz-utils)
printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n' | gcc -E -x c - >/dev/null 2>&1 || missing+=(libpcre2-dev)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "quickstart: installing ${missing[*]}"
        apt-get update -qq && apt-get install -y -qq "${missing[@]}"
    else
        echo "error: missing ${missing[*]}; fix: sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

make -s train_mhar
[ -f data/tiny/tokenizer.bin ] || make -s data/tiny

# tiny preset: L=4 C=128 NH=4 NKV=2 F=384 T=128; mhar with 4 routing heads
./train_mhar -preset tiny -r mhar -H 4 \
    -i 'data/tiny/*_train_*.bin' -j 'data/tiny/*_val_*.bin' -tok data/tiny/tokenizer.bin \
    -b 8 -n 300 -lr 2e-3 -warmup 30 -val_every 50 -sample_every 150 -sample_len 64 \
    -o runs/quickstart -overwrite 1 "$@"
LAST=$(ls runs/quickstart/ckpt_*.bin | tail -1)
echo "quickstart: log in runs/quickstart/log.txt, checkpoint $LAST"

# the loss curve: Debian's matplotlib is under /usr/bin/python3 (another python3 on PATH may lack it)
PLOT="/usr/bin/python3 dev/plot_loss.py runs/quickstart --out runs/quickstart/loss.png"
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "quickstart: installing python3-matplotlib for the loss plot"
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-matplotlib >/dev/null || true
fi
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && $PLOT >/dev/null; then
    echo "quickstart: loss curve in runs/quickstart/loss.png"
else
    echo "quickstart: no loss plot: /usr/bin/python3 has no matplotlib; fix: sudo apt-get install -y python3-matplotlib, then: $PLOT"
fi
