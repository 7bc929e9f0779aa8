"""SPEC's std model written plainly, the way a PyTorch user writes a nanoGPT-style transformer.

fast_model.py is the baseline of the GPU benchmark, laid out for speed by hand. This file is a
control for it: the same function (doc/SPEC.md sections 2, 3 and 6, std residual only) written
the obvious way, so bench_torch.py --impl plain can tell whether the hand layout, or the
benchmark's harness, is what costs speed:

- nn.Embedding for wte, tied to an nn.Linear LM head (lm_head.weight is wte.weight).
- One nn.Linear (no bias) per matrix: wq, wk, wv, wo of attention and wg, wu, wd of the MLP
  (no fused QKV or gate/up GEMMs).
- RMSNorm modules with a weight (pre-norms ln1, ln2, the final ln_f, and QK-norm over HD):
  F.rms_norm where torch has it (>= 2.4), else x * rsqrt(mean(x^2) + eps) * w in >= float32.
- RoPE (rotate-half, base 10000) from cos/sin tables kept as buffers.
- Causal attention: F.scaled_dot_product_attention(is_causal=True) with enable_gqa (torch >= 2.5),
  or after repeat_interleave of k and v, or (torch 1.13, no SDPA) a masked softmax.
- LM head over all Vp rows (lm_head), loss = mean cross-entropy over the first V columns only
  (padded rows never enter the softmax, SPEC 3); head="v" multiplies by wte[:V] instead.

Diagnostic options for bench_torch.py (defaults give SPEC's model):
  norm="manual"         the hand-written norm even where F.rms_norm exists
  ce="vp"               cross-entropy over all Vp columns (the padded logits enter the softmax:
                        NOT SPEC's model, only to time nanoGPT's habit)
  ce="masked"           over all Vp columns with the padded ones at -inf: SPEC's loss without a
                        sliced copy of the logits (fast_model.vp_cross_entropy)
  residual_dtype=dtype  cast the embedding to dtype (bf16 under autocast keeps the residual
                        stream in bf16 instead of the embedding's float32)

Parameters map to the checkpoint layout (mhar_io.param_layout) through load_layout() and
layout(); check_fast_model.py compares this model with model.py in float64 that way.
"""

import math
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from mhar_io import Config
from model import init_tensors   # the shared initial draws (one seed, the same parameters)
from fast_model import vp_cross_entropy

RMS_EPS = 1e-6        # SPEC 3
ROPE_BASE = 10000.0   # SPEC 3
TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")                    # torch >= 2.0
HAS_GQA = HAS_SDPA and TORCH_VERSION >= (2, 5)                           # enable_gqa
HAS_RMS_NORM = hasattr(F, "rms_norm")                                    # torch >= 2.4
ATTN_IMPLS = ("sdpa_gqa", "sdpa_repeat", "plain")


def available_attn_impls() -> List[str]:
    """The attention forms the installed torch can run, fastest first."""
    return [a for a in ATTN_IMPLS if a == "plain" or (a == "sdpa_repeat" and HAS_SDPA) or
            (a == "sdpa_gqa" and HAS_GQA)]


def available_norms() -> List[str]:
    return ["fused", "manual"] if HAS_RMS_NORM else ["manual"]


class RMSNorm(nn.Module):
    """SPEC 3: x / sqrt(mean(x^2) + 1e-6) * w over the last axis (what nn.RMSNorm computes)."""

    def __init__(self, dim: int, fused: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.fused = fused and HAS_RMS_NORM

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return F.rms_norm(x, (x.shape[-1],), self.weight, RMS_EPS)
        xf = x.to(torch.promote_types(x.dtype, torch.float32))     # bf16 -> float32, float64 stays
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS) * self.weight


def rope_tables(T: int, HD: int):
    """cos and sin (T, HD/2) of the angles t * 10000^(-2i/HD), in float64."""
    inv_freq = ROPE_BASE ** (-2.0 * torch.arange(HD // 2, dtype=torch.float64) / HD)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angle.cos(), angle.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x (B, T, heads, HD); position t is the row's index in its sequence."""
    T = x.shape[1]
    cos, sin = cos[:T, None, :], sin[:T, None, :]                    # (T, 1, HD/2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    """Causal self-attention with GQA, QK-norm and RoPE (SPEC 3)."""

    def __init__(self, cfg: Config, attn: str, fused_norm: bool):
        super().__init__()
        self.n_head, self.n_kv, self.hd, self.attn = cfg.NH, cfg.NKV, cfg.HD, attn
        self.wq = nn.Linear(cfg.C, cfg.NH * cfg.HD, bias=False)
        self.wk = nn.Linear(cfg.C, cfg.NKV * cfg.HD, bias=False)
        self.wv = nn.Linear(cfg.C, cfg.NKV * cfg.HD, bias=False)
        self.wo = nn.Linear(cfg.NH * cfg.HD, cfg.C, bias=False)
        self.q_norm = RMSNorm(cfg.HD, fused_norm)
        self.k_norm = RMSNorm(cfg.HD, fused_norm)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_norm(self.wq(x).view(B, T, self.n_head, self.hd))
        k = self.k_norm(self.wk(x).view(B, T, self.n_kv, self.hd))
        v = self.wv(x).view(B, T, self.n_kv, self.hd)
        # the norm returns >= float32 under autocast; attention takes v's dtype for all three
        q = apply_rope(q, cos, sin).type_as(v).transpose(1, 2)      # (B, NH, T, HD)
        k = apply_rope(k, cos, sin).type_as(v).transpose(1, 2)      # (B, NKV, T, HD)
        v = v.transpose(1, 2)
        if self.attn == "sdpa_gqa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            rep = self.n_head // self.n_kv            # query head h reads kv head h // rep
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            if self.attn == "sdpa_repeat":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_head * self.hd))


class MLP(nn.Module):
    """SwiGLU: wd(silu(wg x) * wu x)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.wg = nn.Linear(cfg.C, cfg.F, bias=False)
        self.wu = nn.Linear(cfg.C, cfg.F, bias=False)
        self.wd = nn.Linear(cfg.F, cfg.C, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wd(F.silu(self.wg(x)) * self.wu(x))


class Block(nn.Module):
    """Pre-norm block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, cfg: Config, attn: str, fused_norm: bool):
        super().__init__()
        self.ln1 = RMSNorm(cfg.C, fused_norm)
        self.attn = Attention(cfg, attn, fused_norm)
        self.ln2 = RMSNorm(cfg.C, fused_norm)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cos, sin)
        return x + self.mlp(self.ln2(x))


class PlainGPT(nn.Module):
    """SPEC 3's transformer, std residual. attn: "sdpa_gqa", "sdpa_repeat" or "plain" (default:
    the first the installed torch has); head: "vp" or "v"; norm: "fused" (F.rms_norm) or "manual"
    (default: the first of those the installed torch has); ce and residual_dtype: see the
    module docstring."""

    def __init__(self, cfg: Config, attn: Optional[str] = None, head: str = "vp", norm: Optional[str] = None,
                 ce: str = "v", residual_dtype: Optional[torch.dtype] = None):
        super().__init__()
        problems = cfg.problems()
        if problems:
            raise ValueError("bad config: " + "; ".join(problems))
        if cfg.mode != "std":
            raise ValueError(f"plain_model.py has the std residual only, not mode {cfg.mode!r}")
        attn = attn or available_attn_impls()[0]
        norm = norm or available_norms()[0]
        if attn not in available_attn_impls():
            raise ValueError(f"attention {attn!r} is not available with torch {torch.__version__} "
                             f"(available: {', '.join(available_attn_impls())})")
        if head not in ("vp", "v") or norm not in ("fused", "manual"):
            raise ValueError(f"head {head!r} (use vp or v), norm {norm!r} (use fused or manual)")
        if norm == "fused" and not HAS_RMS_NORM:
            raise ValueError(f"norm 'fused' needs F.rms_norm (torch >= 2.4), have {torch.__version__}")
        if ce not in ("v", "vp", "masked") or (ce != "v" and head != "vp"):
            raise ValueError(f"ce {ce!r} with head {head!r}: use 'v', or 'vp' or 'masked' (they read all Vp "
                             f"logits) with head 'vp'")
        self.cfg, self.head, self.ce, self.residual_dtype = cfg, head, ce, residual_dtype
        # nn.Linear's and nn.Embedding's own initialisation is replaced by init_weights; its draws
        # go to a forked generator, so one seed gives this model the parameters model.py and
        # fast_model.py get (same random stream, same order)
        with torch.random.fork_rng(devices=[]):
            self.wte = nn.Embedding(cfg.Vp, cfg.C)
            self.blocks = nn.ModuleList(Block(cfg, attn, norm == "fused") for _ in range(cfg.L))
            self.ln_f = RMSNorm(cfg.C, norm == "fused")
            self.lm_head = nn.Linear(cfg.C, cfg.Vp, bias=False)
        self.lm_head.weight = self.wte.weight                        # tied (SPEC 3)
        self.init_rope()
        self.init_weights()

    def init_rope(self):
        """The RoPE tables as buffers in the parameters' dtype and device, rounded once from
        float64 (call again after .double(), for exact float64 tables)."""
        cos, sin = rope_tables(self.cfg.T, self.cfg.HD)
        w = self.wte.weight
        self.register_buffer("rope_cos", cos.to(w.device, w.dtype), persistent=False)
        self.register_buffer("rope_sin", sin.to(w.device, w.dtype), persistent=False)

    @torch.no_grad()
    def init_weights(self, generator: Optional[torch.Generator] = None):
        """SPEC 6: matrices N(0, 0.02^2), norm weights 1; the padded rows of wte 0 (model.py's
        CHOICE). Drawn in the checkpoint layout's order and shapes, as model.py draws them."""
        tensors = init_tensors(self.cfg, self.wte.weight.dtype, self.wte.weight.device, generator)
        self.load_layout(tensors)

    def matrices(self) -> List[nn.Parameter]:
        """The parameters that take weight decay (SPEC 6's matrices; wte once, it is tied)."""
        return [p for p in self.parameters() if p.dim() == 2]

    # ------------------------------------------------------------------ checkpoint layout

    def _pairs(self):
        """(layout name, layer or None, parameter) for every parameter."""
        yield "wte", None, self.wte.weight
        for l, b in enumerate(self.blocks):
            for name, p in (("ln1w", b.ln1.weight), ("wq", b.attn.wq.weight), ("wk", b.attn.wk.weight),
                            ("wv", b.attn.wv.weight), ("qnw", b.attn.q_norm.weight),
                            ("knw", b.attn.k_norm.weight), ("wo", b.attn.wo.weight),
                            ("ln2w", b.ln2.weight), ("wg", b.mlp.wg.weight), ("wu", b.mlp.wu.weight),
                            ("wd", b.mlp.wd.weight)):
                yield name, l, p
        yield "lnfw", None, self.ln_f.weight

    @torch.no_grad()
    def load_layout(self, tensors: Dict[str, torch.Tensor]):
        """Copy parameters given in the checkpoint layout (mhar_io.param_layout names/shapes)."""
        for name, l, p in self._pairs():
            p.copy_(tensors[name] if l is None else tensors[name][l])

    def layout(self, grad: bool = False) -> Dict[str, torch.Tensor]:
        """The parameters (or their gradients; wte's is the sum of the embedding's and the
        head's) in the checkpoint layout, as new tensors."""
        per: Dict[str, list] = {}
        for name, l, p in self._pairs():
            t = (p.grad if p.grad is not None else torch.zeros_like(p)) if grad else p.detach()
            per.setdefault(name, []).append(t.clone() if l is None else t)
        return {n: ts[0] if n in ("wte", "lnfw") else torch.stack(ts) for n, ts in per.items()}

    # ------------------------------------------------------------------ forward

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None):
        """idx, targets (B, T) int64 -> mean cross-entropy over all B*T positions, or the logits
        (B, T, V) without targets."""
        V = self.cfg.V
        if idx.shape[1] > self.cfg.T:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds the model's T={self.cfg.T}")
        x = self.wte(idx)
        if self.residual_dtype is not None:
            x = x.to(self.residual_dtype)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin)
        x = self.ln_f(x)
        if self.head == "v":
            logits = F.linear(x, self.wte.weight[:V])
        else:
            logits = self.lm_head(x)                                    # (B, T, Vp)
            if targets is not None and self.ce != "v":
                return vp_cross_entropy(logits, targets, V, self.ce == "masked")
            logits = logits[..., :V]
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
