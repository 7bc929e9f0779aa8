#!/usr/bin/env python3
"""Write a token shard (SPEC section 7, uint16) of random or patterned tokens.

Used by benchmarks that need data of the right shape but not real text:
    python3 dev/make_shard.py OUT.bin --tokens 200000 --vocab 50257 [--seed 0]
Standard library only.
"""
import argparse
import random
import struct

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("out")
ap.add_argument("--tokens", type=int, default=200000)
ap.add_argument("--vocab", type=int, default=50257)
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()
if not 2 <= args.vocab <= 65535:
    raise SystemExit(f"error: --vocab {args.vocab} does not fit uint16 tokens; use 2..65535")
rng = random.Random(args.seed)
toks = [rng.randrange(args.vocab) for _ in range(args.tokens)]
header = [20240520, 1, args.tokens] + [0] * 253
with open(args.out + ".tmp", "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{args.tokens}H", *toks))
import os
os.replace(args.out + ".tmp", args.out)
