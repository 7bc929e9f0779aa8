#!/usr/bin/env bash
# r of the new slot in the routing forward (lab v21; trainer B): lab check and bench against v16,
# test_mhar with B, 6 steps of A and B (mhar, block S=4, delta S=8, std): bits
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c1/*
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
runs/c1/route --version 21 --check > $R/check_v21.txt 2>&1; echo "rc $?" >> $R/check_v21.txt
grep -E "FAIL|v21 r of|rc " $R/check_v21.txt | head -12
for v in 16 21 16 21; do runs/c1/route --version $v --bench 2>&1 | grep -E "^v[0-9]+ L="; done > $R/bench_lab.txt
for v in 16 21; do runs/c1/route --version $v --bench --S 4 2>&1 | grep -E "^v[0-9]+ L="; done >> $R/bench_lab.txt
cut -c1-120 $R/bench_lab.txt
for b in train_mhar_cu_A train_mhar_cu_B; do
  for md in "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r delta -H 8 -S 8" "-r std"; do
    runs/c1/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 $md \
      | grep ^step | cut -d'|' -f1-4 >> $R/steps_$b.txt
  done
done
cmp $R/steps_train_mhar_cu_A.txt $R/steps_train_mhar_cu_B.txt && echo "24 steps: bit-identical"; tail -2 $R/steps_train_mhar_cu_B.txt
cp runs/c1/train_mhar runs/c1/train_mhar_cu runs/c1/train_mhar_cu_fp32 runs/c1/test_mhar .
./test_mhar > $R/test_mhar.txt 2>&1; echo "rc $?" >> $R/test_mhar.txt
grep -E "FAIL|SKIP" $R/test_mhar.txt | head; tail -2 $R/test_mhar.txt
tar -czf $OUT/r.tgz -C $OUT r
