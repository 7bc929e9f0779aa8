#!/usr/bin/env bash
# v16 committed: the lab's backward v12 against v16 in one call (alternating), v12's check, then
# make bench-gpu's command with the v16 trainer, and the per-op table of block S=4 and S=8
cd "$(dirname "$0")"
chmod +x hc train_mhar_cu
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
./hc --op bwd --version 12 --check --quick > $R/check_bwd_v12.txt 2>&1; echo "rc $?" >> $R/check_bwd_v12.txt
for i in 1 2 3; do ./hc --op bwd --version 12 --bench; ./hc --op bwd --version 16 --bench; done > $R/bench_bwd.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r
cd ../..
PYTHON=/opt/torch/.venv/bin/python MAKE=0 TRAINER=runs/c3/train_mhar_cu TORCH_ARGS="--impl plain --compile-mode default --sdpa flash --gqa native --head vp --norm fused --loss-masked --residual-dtype bf16" bash dev/bench_gpu.sh > $R/bench_gpu.txt 2>&1; echo "rc $?" >> $R/bench_gpu.txt
for S in 4 8; do
  runs/c3/train_mhar_cu -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 \
      -val_every 0 -n 6 -op_times 1 -r mhar -H 8 -S $S > $R/optimes_block$S.txt 2>&1
done
tar czf $OUT/r.tgz -C $OUT r
tail -2 $R/check_bwd_v12.txt; grep "^bwd v1" $R/bench_bwd.txt | cut -c1-60
sed -n '/tokens\/s/,$p' $R/bench_gpu.txt | head -40
