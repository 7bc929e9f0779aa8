#!/usr/bin/env bash
# make bench-gpu's command on main e9b4d49 (the gather's qg in pair order), then attention in the same call:
# the lab's trainer kernels (forward v5.2, backward v6.1) beside SDPA's flash and cuDNN backends
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c9/*
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
PYTHON=/opt/torch/.venv/bin/python MAKE=0 TRAINER=runs/c9/train_mhar_cu TORCH_ARGS="--impl plain --compile-mode default --sdpa flash --gqa native --head vp --norm fused --loss-masked --residual-dtype bf16" bash dev/bench_gpu.sh > $R/bench_gpu.txt 2>&1; echo "rc $?" >> $R/bench_gpu.txt
sed -n '/tokens\/s/,$p' $R/bench_gpu.txt | head -40
for s in 16,2048,8,4,64 16,1024,16,8,128; do
  timeout 60 runs/c9/attention --bench-list 2,5.2,6.1 --shape $s --reps 30 --rounds 2 > $R/attention_lab_$s.txt 2>&1
  grep -E "^bench-list|^v[0-9.]+ +\|" $R/attention_lab_$s.txt
done
timeout 90 /opt/torch/.venv/bin/python dev/cuda/attention_torch_bench.py > $R/attention_sdpa.txt 2>&1; cat $R/attention_sdpa.txt
tar czf $OUT/r.tgz -C $OUT r
