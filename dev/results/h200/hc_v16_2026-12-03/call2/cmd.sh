#!/usr/bin/env bash
# v16 (hc forward and backward, leaner, the same bits) against main: lab check and bench, SASS
# counts, 6 training steps of each, trainer A/B, then test_mhar on the GPU with v16
cd "$(dirname "$0")"
chmod +x hc tr_main train_mhar train_mhar_cu train_mhar_cu_fp32 test_mhar sass.sh
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
./hc --op bwd --version 16 --check > $R/check_bwd_v16.txt 2>&1; echo "rc $?" >> $R/check_bwd_v16.txt
./hc --op fwd --version 16 --check > $R/check_fwd_v16.txt 2>&1; echo "rc $?" >> $R/check_fwd_v16.txt
for i in 1 2; do ./hc --op bwd --version 12 --bench; ./hc --op bwd --version 16 --bench; done > $R/bench_bwd.txt 2>&1
./hc --op fwd --version 16 --bench > $R/bench_fwd.txt 2>&1
./sass.sh tr_main > $R/sass_main.txt 2>&1; ./sass.sh train_mhar_cu > $R/sass_v16.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r
cd ../..
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257
for b in tr_main train_mhar_cu; do
  runs/c2/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 \
      -n 6 -r hc -hc_n 4 2>&1 | grep "^step" | cut -d'|' -f1-4 > $R/steps_$b.txt
done
cmp -s $R/steps_tr_main.txt $R/steps_train_mhar_cu.txt && echo "6 steps: identical" > $R/steps_cmp.txt || echo "6 steps: DIFFER" > $R/steps_cmp.txt
ROUNDS=3 PROFILE_GREP=hc bash dev/ab_gpu.sh runs/c2/tr_main runs/c2/train_mhar_cu "-r hc -hc_n 4" > $R/ab.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r
cp runs/c2/train_mhar runs/c2/train_mhar_cu runs/c2/train_mhar_cu_fp32 runs/c2/test_mhar .
./test_mhar > $R/test_mhar.txt 2>&1; echo "rc $?" >> $R/test_mhar.txt
tar czf $OUT/r.tgz -C $OUT r
tail -2 $R/check_bwd_v16.txt $R/check_fwd_v16.txt; grep -E "^bwd v1|fwd v15" $R/bench_bwd.txt $R/bench_fwd.txt | cut -c1-150
grep instructions $R/sass_*.txt | sed 's/.*kernel/kernel/' | cut -c1-60,200-; cat $R/steps_cmp.txt; paste $R/steps_tr_main.txt $R/steps_train_mhar_cu.txt | head -3
sed -n '3,4p' $R/ab.txt; grep -E "hc|total" $R/ab.txt | tail -8; grep -E "FAIL|passed" $R/test_mhar.txt | tail -5
