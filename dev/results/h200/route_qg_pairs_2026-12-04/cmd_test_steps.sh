#!/usr/bin/env bash
# qg in pair order for the gather (trainer B): test_mhar with B, 6 steps of A (main) and B (mhar, block S=4, S=8, delta S=8, std): bits
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c8/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
for b in train_mhar_cu_A train_mhar_cu_B; do
  for md in "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r mhar -H 8 -S 8" "-r delta -H 8 -S 8" "-r std"; do
    runs/c8/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 $md \
      | grep ^step | cut -d'|' -f1-4 >> $R/steps_$b.txt
  done
done
cmp $R/steps_train_mhar_cu_A.txt $R/steps_train_mhar_cu_B.txt && echo "30 steps: bit-identical"; tail -2 $R/steps_train_mhar_cu_B.txt
cp runs/c8/train_mhar runs/c8/train_mhar_cu_fp32 runs/c8/test_mhar .
cp runs/c8/train_mhar_cu_B train_mhar_cu
./test_mhar > $R/test_mhar.txt 2>&1; echo "rc $?" >> $R/test_mhar.txt
grep -E "FAIL|SKIP" $R/test_mhar.txt | head; tail -2 $R/test_mhar.txt
tar -czf $OUT/r.tgz -C $OUT r
