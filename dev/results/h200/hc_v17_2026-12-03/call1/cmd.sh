#!/usr/bin/env bash
# hc v17 (the backward's inputs staged one position ahead): lab check and bench against v16, 6 steps, trainer A/B
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c1/hc runs/c1/base runs/c1/v17
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
runs/c1/hc --op bwd --version 17 --check > $R/check_v17.txt 2>&1; echo "rc $?" >> $R/check_v17.txt
grep -E "FAIL|all checks|^rc" $R/check_v17.txt | head
timeout 150 compute-sanitizer --tool racecheck runs/c1/hc --op bwd --version 17 --check --quick > $R/racecheck_v17.txt 2>&1
echo "racecheck rc $?" >> $R/racecheck_v17.txt; tail -3 $R/racecheck_v17.txt
for i in 1 2; do for v in 16 17; do runs/c1/hc --op bwd --version $v --bench 2>&1 | grep "^bwd v"; done; done > $R/bench_lab.txt
cat $R/bench_lab.txt
for b in base v17; do
  runs/c1/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 -r hc -hc_n 4 \
    | grep ^step | cut -d'|' -f1-4 > $R/steps_$b.txt
done
cmp $R/steps_base.txt $R/steps_v17.txt && echo "6 steps: bit-identical"; tail -1 $R/steps_v17.txt
ROUNDS=2 PROFILE_GREP=hc bash dev/ab_gpu.sh runs/c1/base runs/c1/v17 "-r hc -hc_n 4" > $R/ab.txt 2>&1; tail -12 $R/ab.txt
