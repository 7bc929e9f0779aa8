#!/usr/bin/env bash
# lab v20 (site norm backward fused into the slot gather): check, bench against v16; trainer 6 steps and A/B
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c1/route runs/c1/base runs/c1/fused
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
runs/c1/route --version 20 --check > $R/check_v20.txt 2>&1; echo "rc $?" >> $R/check_v20.txt
grep -E "FAIL|against v16|rc " $R/check_v20.txt | head -12
for v in 16 20 16 20; do runs/c1/route --version $v --bench 2>&1 | grep -E "^v[0-9]+ L=|alone"; done > $R/bench_lab.txt
for v in 16 20; do runs/c1/route --version $v --bench --S 4 2>&1 | grep -E "^v[0-9]+ L="; done >> $R/bench_lab.txt
cut -c1-200 $R/bench_lab.txt
for b in base fused; do
  for md in "-r mhar -H 8" "-r mhar -H 8 -S 4"; do
    runs/c1/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 $md \
      | grep ^step | cut -d'|' -f1-4 >> $R/steps_$b.txt
  done
done
paste -d'\n' $R/steps_base.txt $R/steps_fused.txt
ROUNDS=2 PROFILE_GREP='route' bash dev/ab_gpu.sh runs/c1/base runs/c1/fused "-r mhar -H 8" "-r mhar -H 8 -S 4" "-r mhar -H 8 -S 8" > $R/ab.txt 2>&1
cat $R/ab.txt | grep -vE '^\s*$' | head -60
timeout 120 compute-sanitizer --tool racecheck runs/c1/route --version 20 --check > $R/racecheck_v20.txt 2>&1; echo "rc $?" >> $R/racecheck_v20.txt
grep -E "hazard|ERROR|RACECHECK SUMMARY|rc " $R/racecheck_v20.txt | head -5
tar -czf $OUT/r.tgz -C $OUT r
