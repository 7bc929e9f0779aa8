#!/usr/bin/env bash
# route site backward staged (lab v18: 2 slots a warp, v19: 4): lab check and bench against v16, 6 steps, trainer A/B
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c4/route runs/c4/base runs/c4/s2 runs/c4/s4
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
for v in 18 19; do runs/c4/route --version $v --check > $R/check_v$v.txt 2>&1; echo "rc $?" >> $R/check_v$v.txt; done
grep -hE "FAIL|check:|against v16" $R/check_v1*.txt | sort | uniq -c | head
for v in 16 18 19 16 18 19; do runs/c4/route --version $v --bench 2>&1 | grep -E "^v1[0-9] L="; done > $R/bench_lab.txt
cut -c1-40,110-175 $R/bench_lab.txt
for b in base s2 s4; do
  runs/c4/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 -r mhar -H 8 \
    | grep ^step | cut -d'|' -f1-4 > $R/steps_$b.txt
done
cmp $R/steps_base.txt $R/steps_s2.txt && cmp $R/steps_base.txt $R/steps_s4.txt && echo "6 steps: bit-identical"; tail -1 $R/steps_s2.txt
ROUNDS=2 PROFILE_GREP='site' bash dev/ab_gpu.sh runs/c4/base runs/c4/s2 "-r mhar -H 8" "-r mhar -H 8 -S 8" > $R/ab_s2.txt 2>&1
grep -A3 "^mode" $R/ab_s2.txt | head -4; grep -E "profile|site" $R/ab_s2.txt
ROUNDS=2 PROFILE_GREP='site' bash dev/ab_gpu.sh runs/c4/base runs/c4/s4 "-r mhar -H 8" > $R/ab_s4.txt 2>&1
grep -A2 "^mode" $R/ab_s4.txt | head -3; grep -E "profile|site" $R/ab_s4.txt
