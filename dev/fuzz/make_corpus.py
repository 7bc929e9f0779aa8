#!/usr/bin/env python3
"""Write the fuzzers' seed corpora, dev/fuzz/corpus/{shard,ckpt,tok}/: small valid files of
each format and a few near misses (each a few KB, committed).

    /usr/bin/python3 dev/fuzz/make_corpus.py      (needs numpy; uses dev/torch_ref/mhar_io.py)
"""
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "torch_ref"))
import mhar_io  # noqa: E402


def put(sub, name, data):
    d = os.path.join(HERE, "corpus", sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes(data))


def header(*ints):
    h = np.zeros(256, dtype="<i4")
    h[:len(ints)] = ints
    return h.tobytes()


# token shards: uint16 and uint32, a token out of the fuzzer's small vocabulary, a truncated one
toks = np.arange(40) % 7
put("shard", "u16.bin", header(20240520, 1, 40) + toks.astype("<u2").tobytes())
put("shard", "u32.bin", header(20240801, 7, 40) + toks.astype("<u4").tobytes())
put("shard", "u16_big_token.bin", header(20240520, 1, 40) + (toks * 9000).astype("<u2").tobytes())
put("shard", "u16_truncated.bin", (header(20240520, 1, 40) + toks.astype("<u2").tobytes())[:-6])

# checkpoints of the smallest configs: std and mhar (block S=2), parameters only and with AdamW
# state, float32 and float64, version 2 and version 1
rng = np.random.default_rng(1)
for name, mode, H, S, content, bpe in (("std_params", "std", 1, 1, 0, 4), ("mhar_train", "mhar", 2, 2, 1, 4),
                                       ("mhar_grads_f64", "mhar", 1, 1, 2, 8)):
    cfg = mhar_io.Config(V=3, Vp=128, T=4, L=1, C=4, NH=2, NKV=1, F=2, mode=mode, H=H, S=S)
    prm = {n: rng.standard_normal(s) for n, s in mhar_io.param_layout(cfg)}
    p = os.path.join(HERE, "corpus", "ckpt", name + ".bin")
    os.makedirs(os.path.dirname(p), exist_ok=True)
    mhar_io.write_checkpoint(p, cfg, prm, content=content, bytes_per_elem=bpe, step=3,
                             m=prm if content == 1 else None, v={k: abs(a) for k, a in prm.items()},
                             batch=(1, 4), loss=1.5)
raw = bytearray(open(os.path.join(HERE, "corpus", "ckpt", "std_params.bin"), "rb").read())
raw[4:8] = struct.pack("<i", 1)
raw[120:124] = b"\0\0\0\0"
put("ckpt", "std_params_v1.bin", raw)

# tokenizer files: 4 tokens (the last one the EOT), one with a multi-byte UTF-8 token
def tokfile(tokens, eot):
    body = b"".join(struct.pack("<I", len(t)) + t for t in tokens)
    return header(0x4B54484D, 1, len(tokens), eot) + body


put("tok", "four.bin", tokfile([b"a", b" b", "\u00e9".encode(), b"<|endoftext|>"], 3))
put("tok", "split_utf8.bin", tokfile([b"\xe2", b"\x82\xac", b"x", b"<|endoftext|>"], 3))
put("tok", "eot_out_of_range.bin", tokfile([b"a", b"b"], 5))
