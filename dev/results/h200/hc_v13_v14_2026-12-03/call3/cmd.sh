#!/usr/bin/env bash
# call 3: v13's check (each site against its own fp64 reference), v14 (the streams stored after
# every second sublayer) check and bench, trainer A/Bs v12 -> v14 and v13 -> v14, 30 steps of v14
cd "$(dirname "$0")"
chmod +x hc tr_v12 tr_v13 tr_v14
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
./hc --op bwd --version 13 --check > $R/check_v13.txt 2>&1; echo "rc $?" >> $R/check_v13.txt
./hc --version 14 --check > $R/check_v14.txt 2>&1; echo "rc $?" >> $R/check_v14.txt
./hc --version 14 --bench > $R/bench_v14.txt 2>&1
cd ../..
ROUNDS=3 PROFILE_GREP=hc bash dev/ab_gpu.sh runs/c3/tr_v12 runs/c3/tr_v14 "-r hc -hc_n 4" > $R/ab_v12_v14.txt 2>&1
ROUNDS=2 PROFILE_GREP=hc bash dev/ab_gpu.sh runs/c3/tr_v13 runs/c3/tr_v14 "-r hc -hc_n 4" > $R/ab_v13_v14.txt 2>&1
runs/c3/tr_v14 -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 \
    -val_every 0 -n 30 -r hc -hc_n 4 > $R/steps_v14.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r
grep -v "^ *reader\|^ *v12's" $R/check_v13.txt | tail -n 12; grep -c FAIL $R/check_v13.txt; tail -n 12 $R/check_v14.txt; cat $R/bench_v14.txt | tail -n 5
tail -n 20 $R/ab_v12_v14.txt; head -n 5 $R/ab_v13_v14.txt | tail -n 2; grep -E "bwd hc|fwd hc|total" $R/ab_v13_v14.txt
grep "^step" $R/steps_v14.txt | sed -n '1,6p;25,30p'
