#!/usr/bin/env bash
# the encoder plan by a counting sort: 6 steps of std against main's bits, then A/B (std, hc) with the head's and
# the encoder's per-op rows
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
chmod +x runs/c3/base runs/c3/enc
mkdir -p data/bench
[ -f data/bench/random_3m.bin ] || python3 dev/make_shard.py data/bench/random_3m.bin --tokens 3000000 --vocab 50257 > /dev/null
for b in base enc; do
  runs/c3/$b -preset 100m -T 2048 -b 16 -warmup 1 -i data/bench/random_3m.bin -j '' -sample_every 0 -val_every 0 -n 6 -r std \
    | grep ^step | cut -d'|' -f1-4 > $R/steps_$b.txt
done
cmp $R/steps_base.txt $R/steps_enc.txt && echo "6 steps: bit-identical"; tail -1 $R/steps_enc.txt
ROUNDS=2 PROFILE_GREP='head|encoder' bash dev/ab_gpu.sh runs/c3/base runs/c3/enc "-r std" "-r hc -hc_n 4" > $R/ab.txt 2>&1
grep -A3 "^mode" $R/ab.txt | head -4; grep -E "profile|matmul head|encoder|total" $R/ab.txt
