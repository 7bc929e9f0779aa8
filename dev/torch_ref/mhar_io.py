"""Readers and writers for the MHAR project's binary files (numpy only, no torch).

Three formats, all little-endian, all with a header of 256 int32:

1. Token shards (SPEC section 7, the llm.c layout)
     [0] magic 20240520, [1] version 1, [2] token count N, then N uint16 tokens;
     or  magic 20240801, version 7, uint32 tokens (vocabularies over 65,535).

2. Checkpoints (the project's own format, SPEC section 7)
     [0] magic 0x5241484D (the bytes "MHAR"), [1] version 2 (version 1: the same without [30]),
     [2] V  [3] Vp  [4] T  [5] L  [6] C  [7] NH  [8] NKV  [9] F
     [10] residual mode (0 std, 1 mhar, 2 hc, 3 delta)  [11] H  [12] S  [13] HD
     [14] content (0 params, 1 params + AdamW m and v, 2 gradient dump)
     [15] step  [16..23] loader/rng state (not interpreted here)
     [24] bytes per element (4 float32, 8 float64)
     [25] B  [26] T of the batch (gradient dumps)
     [27..28] loss as one float64 (gradient dumps)
     [29] n, the hc streams (0 in other modes)
     [30] CRC-32C of the whole file, computed with this field read as 0 (version 2)
   then the tensors of param_layout(cfg), concatenated, row-major; with content 1 two more
   copies of that layout follow (m, then v).

3. Gradient dumps: a checkpoint with content 2 whose parameter section holds dLoss/dparam.

Every reader checks magic, version, the config's consistency, the exact file size and the
checksum (checkpoints of version 2), and
raises MharFormatError with a one-line message naming the file.
"""

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4

SHARD_MAGIC_U16, SHARD_VERSION_U16 = 20240520, 1
SHARD_MAGIC_U32, SHARD_VERSION_U32 = 20240801, 7

CKPT_MAGIC = 0x5241484D  # little-endian bytes 4D 48 41 52 = "MHAR"
CKPT_VERSION = 2
CKPT_CRC_INT = 30  # header int holding the CRC-32C (version 2)
CONTENT_PARAMS, CONTENT_PARAMS_ADAM, CONTENT_GRADS = 0, 1, 2
MODE_STD, MODE_MHAR, MODE_HC, MODE_DELTA = 0, 1, 2, 3
_MODE_IDS = {"std": MODE_STD, "mhar": MODE_MHAR, "hc": MODE_HC, "delta": MODE_DELTA}

# Magic numbers of other files that might be handed to us by mistake (for a better error).
_OTHER_MAGICS = {
    SHARD_MAGIC_U16: "an llm.c token shard",
    SHARD_MAGIC_U32: "an llm.c token shard (uint32)",
    20240326: "an llm.c GPT-2 checkpoint",
    20240328: "an llm.c tokenizer file",
}


def _crc32c_table():
    t = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t[i] = c
    return t


_CRC_T = _crc32c_table()


def _crc_zero_bytes_op(nbytes):
    """The linear map 'feed nbytes zero bytes' on a raw CRC-32C register, as 4 byte tables."""
    def apply(cols, r):
        x = 0
        for b in range(32):
            if r >> b & 1:
                x ^= cols[b]
        return x
    op = [1 << b for b in range(32)]                                   # identity
    base = [int(_CRC_T[(1 << b) & 0xFF]) ^ ((1 << b) >> 8) for b in range(32)]   # one zero byte
    while nbytes:
        if nbytes & 1:
            op = [apply(base, c) for c in op]
        base = [apply(base, c) for c in base]
        nbytes >>= 1
    return [[apply(op, v << (8 * q)) for v in range(256)] for q in range(4)]


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of data, as common/util.h's crc32c_update(0, data, n).

    numpy runs K lanes of the byte-wise table CRC side by side and combines them (the CRC
    register is linear over GF(2)), so gigabyte checkpoints take seconds, not hours."""
    a = np.frombuffer(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data,
                      dtype=np.uint8)
    n = a.size
    lanes = max(1, min(1 << 18, n // 2048))
    m = n // lanes if lanes > 1 else 0
    acc = 0xFFFFFFFF
    if lanes > 1:
        cols = np.ascontiguousarray(a[:lanes * m].reshape(lanes, m).T)   # (m, lanes)
        r = np.zeros(lanes, dtype=np.uint32)
        for j in range(m):
            r = _CRC_T[(r ^ cols[j]) & 0xFF] ^ (r >> 8)
        t0, t1, t2, t3 = _crc_zero_bytes_op(m)
        for x in r.tolist():
            acc = t0[acc & 0xFF] ^ t1[(acc >> 8) & 0xFF] ^ t2[(acc >> 16) & 0xFF] ^ t3[acc >> 24] ^ x
    for byte in a[lanes * m:].tolist():
        acc = int(_CRC_T[(acc ^ byte) & 0xFF]) ^ (acc >> 8)
    return acc ^ 0xFFFFFFFF


def _file_crc(raw: bytearray) -> int:
    """The checkpoint checksum: CRC-32C of the file with header int [30] read as 0."""
    keep = raw[CKPT_CRC_INT * 4:CKPT_CRC_INT * 4 + 4]
    raw[CKPT_CRC_INT * 4:CKPT_CRC_INT * 4 + 4] = b"\0\0\0\0"
    crc = crc32c(raw)
    raw[CKPT_CRC_INT * 4:CKPT_CRC_INT * 4 + 4] = keep
    return crc


class MharFormatError(ValueError):
    """A file is not what it claims to be (bad magic, version, config or size)."""


def _fail(path, msg):
    raise MharFormatError(f"{path}: {msg}")


# ----------------------------------------------------------------------------------------
# config


@dataclass
class Config:
    """The model configuration recorded in a checkpoint header (SPEC section 2)."""
    V: int          # vocabulary size
    Vp: int         # padded vocabulary (rows of wte)
    T: int          # max sequence length
    L: int          # transformer blocks (2L sublayers)
    C: int          # model width
    NH: int         # query heads
    NKV: int        # key/value heads (GQA)
    F: int          # SwiGLU hidden width
    mode: str = "mhar"  # "std", "mhar" (attnres is mhar with H = 1), "hc" or "delta" (SPEC section 9)
    H: int = 1      # routing heads (mhar, delta)
    S: int = 1      # sublayers per block (mhar: 1 = full mode; delta)
    n: int = 0      # hyper-connection streams (hc only; SPEC section 8)

    @property
    def HD(self) -> int:
        return self.C // self.NH

    def problems(self) -> List[str]:
        """Everything inconsistent about this config (empty list when valid)."""
        p = []
        for name in ("V", "Vp", "T", "L", "C", "NH", "NKV", "F"):
            if getattr(self, name) <= 0:
                p.append(f"{name}={getattr(self, name)} must be positive")
        if p:
            return p
        if self.Vp < self.V:
            p.append(f"Vp={self.Vp} is smaller than V={self.V}")
        if self.C % self.NH:
            p.append(f"NH={self.NH} does not divide C={self.C}")
        elif self.HD % 2:
            p.append(f"head dim HD={self.HD} must be even for RoPE")
        if self.NH % self.NKV:
            p.append(f"NKV={self.NKV} does not divide NH={self.NH}")
        if self.mode not in _MODE_IDS:
            p.append(f"unknown residual mode {self.mode!r}")
        if self.mode in ("mhar", "delta"):
            if self.H <= 0 or self.C % self.H:
                p.append(f"routing heads H={self.H} must divide C={self.C}")
            if self.S <= 0:
                p.append(f"block size S={self.S} must be >= 1")
        if self.mode == "hc" and not 1 <= self.n <= 64:
            p.append(f"hc streams n={self.n} must be 1..64")
        return p


def param_layout(cfg: Config) -> List[Tuple[str, Tuple[int, ...]]]:
    """Names and shapes of the parameter tensors, in file order (SPEC section 7 / brief)."""
    L, C, HD, F = cfg.L, cfg.C, cfg.HD, cfg.F
    layout = [
        ("wte", (cfg.Vp, C)),
        ("ln1w", (L, C)),                 # pre-norm weight g_j of attention sublayers j = 2l
        ("wq", (L, cfg.NH * HD, C)),
        ("wk", (L, cfg.NKV * HD, C)),
        ("wv", (L, cfg.NKV * HD, C)),
        ("qnw", (L, HD)),
        ("knw", (L, HD)),
        ("wo", (L, C, cfg.NH * HD)),
        ("ln2w", (L, C)),                 # pre-norm weight g_j of MLP sublayers j = 2l+1
        ("wg", (L, F, C)),
        ("wu", (L, F, C)),
        ("wd", (L, C, F)),
        ("lnfw", (C,)),                   # final norm g_f
    ]
    if cfg.mode in ("mhar", "delta"):
        layout += [("rq", (2 * L + 1, C)),   # routing queries q_j, one per site
                   ("rg", (2 * L + 1, C))]   # routing key-norm weights gamma_j
    if cfg.mode == "hc":
        n = cfg.n
        layout += [("hcalpha", (2 * L, n)),     # read logits alpha_j: w_j = softmax(alpha_j)
                   ("hca", (2 * L, n, n)),      # stream mix A_j[r, s]
                   ("hcbeta", (2 * L, n))]      # write weights beta_j
    if cfg.mode == "delta":
        layout += [("dnull", (2 * L + 1, C)),   # null sources n_j, one per site
                   ("dalpha", (2 * L + 1,))]    # gates alpha_j of the routed mix
    return layout


def num_params(cfg: Config) -> int:
    return sum(int(np.prod(s)) for _, s in param_layout(cfg))


# ----------------------------------------------------------------------------------------
# token shards


def read_shard(path: str) -> np.ndarray:
    """All tokens of a shard, as int64."""
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        _fail(path, f"{size} bytes is too small for a token shard header ({HEADER_BYTES})")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, n = int(header[0]), int(header[1]), int(header[2])
    if magic == SHARD_MAGIC_U16:
        if version != SHARD_VERSION_U16:
            _fail(path, f"shard version {version}, expected {SHARD_VERSION_U16} for uint16 shards")
        dtype = np.dtype("<u2")
    elif magic == SHARD_MAGIC_U32:
        if version != SHARD_VERSION_U32:
            _fail(path, f"shard version {version}, expected {SHARD_VERSION_U32} for uint32 shards")
        dtype = np.dtype("<u4")
    else:
        what = "an MHAR checkpoint" if magic == CKPT_MAGIC else f"magic {magic}"
        _fail(path, f"not a token shard ({what}; expected {SHARD_MAGIC_U16} or {SHARD_MAGIC_U32})")
    if n < 0:
        _fail(path, f"negative token count {n}")
    expected = HEADER_BYTES + n * dtype.itemsize
    if size != expected:
        _fail(path, f"size {size} bytes, but the header's {n} tokens imply {expected}")
    tokens = np.fromfile(path, dtype=dtype, count=n, offset=HEADER_BYTES)
    return tokens.astype(np.int64)


def write_shard(path: str, tokens) -> None:
    """Write tokens as a shard: uint16 when every token fits, else the uint32 variant."""
    tokens = np.asarray(tokens, dtype=np.int64).ravel()
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2 ** 32):
        raise ValueError(f"{path}: tokens out of range [0, 2^32)")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    if tokens.size == 0 or tokens.max() < 2 ** 16:
        header[0], header[1], dtype = SHARD_MAGIC_U16, SHARD_VERSION_U16, "<u2"
    else:
        header[0], header[1], dtype = SHARD_MAGIC_U32, SHARD_VERSION_U32, "<u4"
    header[2] = tokens.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(dtype).tobytes())


def load_batch(path: str, B: int, T: int) -> Tuple[np.ndarray, np.ndarray]:
    """The team's batch convention: the first B*T+1 tokens of the shard;
    inputs = tokens[0:B*T] as (B, T), targets = tokens[1:B*T+1] as (B, T)."""
    tokens = read_shard(path)
    need = B * T + 1
    if tokens.size < need:
        _fail(path, f"only {tokens.size} tokens, a B={B} T={T} batch needs {need}")
    buf = tokens[:need]
    return buf[:-1].reshape(B, T), buf[1:].reshape(B, T)


# ----------------------------------------------------------------------------------------
# checkpoints and gradient dumps


@dataclass
class Checkpoint:
    cfg: Config
    content: int                          # CONTENT_PARAMS / CONTENT_PARAMS_ADAM / CONTENT_GRADS
    params: Dict[str, np.ndarray]         # parameters, or dLoss/dparam when content == 2
    step: int = 0
    bytes_per_elem: int = 4
    m: Optional[Dict[str, np.ndarray]] = None   # AdamW first moment (content 1)
    v: Optional[Dict[str, np.ndarray]] = None   # AdamW second moment (content 1)
    batch_B: int = 0                      # gradient dumps: the batch the grads are for
    batch_T: int = 0
    loss: Optional[float] = None          # gradient dumps: the loss on that batch
    loader_state: np.ndarray = field(default_factory=lambda: np.zeros(8, dtype=np.int32))


def _header_to_config(path, h) -> Config:
    mode_id = int(h[10])
    names = {v: k for k, v in _MODE_IDS.items()}
    if mode_id not in names:
        _fail(path, f"unknown residual mode {mode_id} in header[10] (0 std, 1 mhar, 2 hc, 3 delta)")
    cfg = Config(V=int(h[2]), Vp=int(h[3]), T=int(h[4]), L=int(h[5]), C=int(h[6]),
                 NH=int(h[7]), NKV=int(h[8]), F=int(h[9]),
                 mode=names[mode_id], H=int(h[11]), S=int(h[12]),
                 n=int(h[29]) if mode_id == MODE_HC else 0)
    problems = cfg.problems()
    if problems:
        _fail(path, "inconsistent config: " + "; ".join(problems))
    if int(h[13]) != cfg.HD:
        _fail(path, f"header HD={int(h[13])} but C/NH = {cfg.C}/{cfg.NH} = {cfg.HD}")
    return cfg


def read_checkpoint(path: str) -> Checkpoint:
    """Read a checkpoint or gradient dump; tensors keep the file's dtype (float32/float64)."""
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        _fail(path, f"{size} bytes is too small for a checkpoint header ({HEADER_BYTES})")
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    h = np.frombuffer(raw, dtype="<i4")
    magic = int(h[0]) & 0xFFFFFFFF
    if magic != CKPT_MAGIC:
        what = _OTHER_MAGICS.get(int(h[0]), f"magic 0x{magic:08X}")
        _fail(path, f"not an MHAR checkpoint ({what}; expected magic 0x{CKPT_MAGIC:08X} 'MHAR')")
    version = int(h[1])
    if version not in (1, CKPT_VERSION):
        _fail(path, f"checkpoint version {version}, this reader knows versions 1 and {CKPT_VERSION}")
    cfg = _header_to_config(path, h)
    content, bpe = int(h[14]), int(h[24])
    if content not in (CONTENT_PARAMS, CONTENT_PARAMS_ADAM, CONTENT_GRADS):
        _fail(path, f"unknown content {content} in header[14] (0 params, 1 +AdamW, 2 grads)")
    if bpe not in (4, 8):
        _fail(path, f"bytes per element {bpe} in header[24], expected 4 or 8")
    dtype = np.dtype("<f4") if bpe == 4 else np.dtype("<f8")
    copies = 3 if content == CONTENT_PARAMS_ADAM else 1
    n = num_params(cfg)
    expected = HEADER_BYTES + copies * n * bpe
    if size != expected:
        _fail(path, f"size {size} bytes, but the header's config and content imply {expected}")
    with open(path, "rb") as f:
        whole = bytearray(f.read())
    if version >= 2:
        stored, crc = int(h[CKPT_CRC_INT]) & 0xFFFFFFFF, _file_crc(whole)
        if stored != crc:
            _fail(path, f"checksum mismatch (header 0x{stored:08X}, contents 0x{crc:08X}): the file is corrupt")
    data = np.frombuffer(bytes(whole[HEADER_BYTES:]), dtype=dtype, count=copies * n)
    if not np.all(np.isfinite(data)):
        _fail(path, f"a non-finite value at element {int(np.argmin(np.isfinite(data)))} of the tensors")

    def split(flat):
        out, off = {}, 0
        for name, shape in param_layout(cfg):
            k = int(np.prod(shape))
            out[name] = flat[off:off + k].reshape(shape)
            off += k
        return out

    ck = Checkpoint(cfg=cfg, content=content, params=split(data[:n]), step=int(h[15]),
                    bytes_per_elem=bpe, loader_state=h[16:24].copy())
    if content == CONTENT_PARAMS_ADAM:
        ck.m, ck.v = split(data[n:2 * n]), split(data[2 * n:])
    if content == CONTENT_GRADS:
        ck.batch_B, ck.batch_T = int(h[25]), int(h[26])
        if ck.batch_B <= 0 or ck.batch_T <= 0 or ck.batch_T > cfg.T:
            _fail(path, f"gradient dump with batch B={ck.batch_B} T={ck.batch_T} (max T {cfg.T})")
        ck.loss = float(np.frombuffer(raw[27 * 4:29 * 4], dtype="<f8")[0])
    return ck


def write_checkpoint(path: str, cfg: Config, params: Dict[str, np.ndarray], *,
                     content: int = CONTENT_PARAMS, bytes_per_elem: int = 4, step: int = 0,
                     m=None, v=None, batch=(0, 0), loss: Optional[float] = None) -> None:
    """Write params (or grads, content=2) in the layout of param_layout(cfg)."""
    problems = cfg.problems()
    if problems:
        raise ValueError(f"{path}: refusing to write inconsistent config: " + "; ".join(problems))
    if bytes_per_elem not in (4, 8):
        raise ValueError(f"{path}: bytes_per_elem must be 4 or 8, not {bytes_per_elem}")
    if content == CONTENT_PARAMS_ADAM and (m is None or v is None):
        raise ValueError(f"{path}: content 1 needs the AdamW m and v tensors")
    dtype = "<f4" if bytes_per_elem == 4 else "<f8"
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[0] = np.array(CKPT_MAGIC, dtype=np.uint32).view(np.int32)
    h[1] = CKPT_VERSION
    h[2:10] = [cfg.V, cfg.Vp, cfg.T, cfg.L, cfg.C, cfg.NH, cfg.NKV, cfg.F]
    h[10] = _MODE_IDS[cfg.mode]
    h[29] = cfg.n if cfg.mode == "hc" else 0
    h[11], h[12], h[13] = cfg.H, cfg.S, cfg.HD
    h[14], h[15], h[24] = content, step, bytes_per_elem
    if content == CONTENT_GRADS:
        h[25], h[26] = batch
    raw = bytearray(h.tobytes())
    if content == CONTENT_GRADS and loss is not None:
        raw[27 * 4:29 * 4] = np.array([loss], dtype="<f8").tobytes()

    def flat(tensors, label):
        parts = []
        for name, shape in param_layout(cfg):
            if name not in tensors:
                raise ValueError(f"{path}: {label} has no tensor {name!r}")
            a = np.asarray(tensors[name])
            if tuple(a.shape) != tuple(shape):
                raise ValueError(f"{path}: {label} tensor {name!r} has shape {tuple(a.shape)},"
                                 f" the config needs {tuple(shape)}")
            parts.append(a.astype(dtype).ravel())
        return b"".join(p.tobytes() for p in parts)

    body = flat(params, "params")
    if content == CONTENT_PARAMS_ADAM:
        body += flat(m, "AdamW m") + flat(v, "AdamW v")
    whole = raw + body
    whole[CKPT_CRC_INT * 4:CKPT_CRC_INT * 4 + 4] = np.array(_file_crc(whole), dtype="<u4").tobytes()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(bytes(whole))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
