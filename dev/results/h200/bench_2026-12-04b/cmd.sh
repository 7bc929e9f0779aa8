#!/usr/bin/env bash
# make bench-gpu's command with the landed form
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c5/*
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
PYTHON=/opt/torch/.venv/bin/python MAKE=0 TRAINER=runs/c5/train_mhar_cu TORCH_ARGS="--impl plain --compile-mode default --sdpa flash --gqa native --head vp --norm fused --loss-masked --residual-dtype bf16" bash dev/bench_gpu.sh > $R/bench_gpu.txt 2>&1; echo "rc $?" >> $R/bench_gpu.txt
tar czf $OUT/r.tgz -C $OUT r
sed -n '/tokens\/s/,$p' $R/bench_gpu.txt | head -40
