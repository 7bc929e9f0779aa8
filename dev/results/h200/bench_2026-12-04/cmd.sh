#!/usr/bin/env bash
# main with the lean gather's FULL instance: test_mhar on the GPU, then make bench-gpu's command, and the
# per-op tables of block S=4 and S=8
cd "$(dirname "$0")"
chmod +x train_mhar train_mhar_cu train_mhar_cu_fp32 test_mhar
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
cd ../..
cp runs/c5/train_mhar runs/c5/train_mhar_cu runs/c5/train_mhar_cu_fp32 runs/c5/test_mhar .
./test_mhar > $R/test_mhar.txt 2>&1; echo "rc $?" >> $R/test_mhar.txt
grep -E "FAIL|SKIP" $R/test_mhar.txt | head; tail -2 $R/test_mhar.txt
tar czf $OUT/r.tgz -C $OUT r
PYTHON=/opt/torch/.venv/bin/python MAKE=0 TRAINER=runs/c5/train_mhar_cu TORCH_ARGS="--impl plain --compile-mode default --sdpa flash --gqa native --head vp --norm fused --loss-masked --residual-dtype bf16" bash dev/bench_gpu.sh > $R/bench_gpu.txt 2>&1; echo "rc $?" >> $R/bench_gpu.txt
tar czf $OUT/r.tgz -C $OUT r
for S in 4 8; do
  runs/c5/train_mhar_cu -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 \
      -val_every 0 -n 6 -op_times 1 -r mhar -H 8 -S $S > $R/optimes_block$S.txt 2>&1
done
tar czf $OUT/r.tgz -C $OUT r
sed -n '/tokens\/s/,$p' $R/bench_gpu.txt | head -40
