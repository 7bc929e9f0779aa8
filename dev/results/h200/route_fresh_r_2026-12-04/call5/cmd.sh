#!/usr/bin/env bash
# the landed form (v21's r in the routing forward, the slots no chained add writes): test_mhar on the GPU,
# 30 steps against main (mhar H=8, block S=4, block S=8, delta H=8 S=8, std): bits; block per-op tables
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c5/*
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
cp runs/c5/train_mhar runs/c5/train_mhar_cu runs/c5/train_mhar_cu_fp32 runs/c5/test_mhar .
./test_mhar > $R/test_mhar.txt 2>&1; echo "rc $?" >> $R/test_mhar.txt
grep -E "FAIL|SKIP" $R/test_mhar.txt | head; tail -2 $R/test_mhar.txt
for b in train_mhar_cu_A train_mhar_cu; do
  for md in "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r mhar -H 8 -S 8" "-r delta -H 8 -S 8" "-r std"; do
    runs/c5/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 $md \
      | grep ^step | cut -d'|' -f1-4 >> $R/steps_$b.txt
  done
done
cmp $R/steps_train_mhar_cu_A.txt $R/steps_train_mhar_cu.txt && echo "30 steps: bit-identical"; tail -1 $R/steps_train_mhar_cu.txt
for S in 4 8; do
  runs/c5/train_mhar_cu -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 \
      -val_every 0 -n 6 -op_times 1 -r mhar -H 8 -S $S > $R/optimes_block$S.txt 2>&1
done
tar -czf $OUT/r.tgz -C $OUT r
