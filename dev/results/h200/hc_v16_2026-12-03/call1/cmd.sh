#!/usr/bin/env bash
# v16 (hc: paired bf16 roundings, g and o kept in registers, dg in registers, bwd at 128 registers) against main
cd "$(dirname "$0")"
chmod +x tr_main tr_v16 sass.sh
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
./sass.sh tr_main > $R/sass_main.txt 2>&1; ./sass.sh tr_v16 > $R/sass_v16.txt 2>&1
cd ../..
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257
for b in main v16; do
  runs/c1/tr_$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 -r hc -hc_n 4 > $R/steps_$b.txt 2>&1
done
for b in main v16; do awk -F'|' '/^step/ {print $1, $2, $4}' $R/steps_$b.txt > $R/s_$b; done
cmp $R/s_main $R/s_v16 && echo "6 steps: identical" > $R/steps_cmp.txt || echo "6 steps: DIFFER" > $R/steps_cmp.txt
ROUNDS=3 PROFILE_GREP=hc bash dev/ab_gpu.sh runs/c1/tr_main runs/c1/tr_v16 "-r hc -hc_n 4" > $R/ab.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r
cat $R/steps_cmp.txt; head -3 $R/steps_v16.txt; cat $R/s_v16; grep instructions $R/sass_*.txt; tail -25 $R/ab.txt
