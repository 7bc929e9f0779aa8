#!/usr/bin/env bash
# call 2: v13 (the stream gradient stored at every second site) against v12: lab check/bench,
# trainer A/B, 30 training steps of each
cd "$(dirname "$0")"
chmod +x hc tr_v12 tr_v13
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/gpu.txt 2>&1
./hc --op bwd --version 13 --check > $R/check_v13.txt 2>&1; echo "rc $?" >> $R/check_v13.txt
./hc --op bwd --version 12 --check > $R/check_v12.txt 2>&1; echo "rc $?" >> $R/check_v12.txt
./hc --op bwd --version 13 --bench > $R/bench_v13.txt 2>&1
./hc --op bwd --version 12 --bench > $R/bench_v12.txt 2>&1
cd ../..
ROUNDS=3 PROFILE_GREP=hc bash dev/ab_gpu.sh runs/c2/tr_v12 runs/c2/tr_v13 "-r hc -hc_n 4" > $R/ab.txt 2>&1
for v in v12 v13; do
    runs/c2/tr_$v -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 \
        -val_every 0 -n 30 -r hc -hc_n 4 > $R/steps_$v.txt 2>&1
done
tar czf $OUT/r.tgz -C $OUT r
tail -n 30 $R/check_v13.txt; tail -n 3 $R/check_v12.txt; grep "bwd" $R/bench_v13.txt $R/bench_v12.txt; tail -n 22 $R/ab.txt
paste <(grep "^step" $R/steps_v12.txt | cut -d'|' -f1-4) <(grep "^step" $R/steps_v13.txt | cut -d'|' -f2-4) | sed -n '1,6p;25,30p'
