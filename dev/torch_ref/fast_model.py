"""The MHAR model of doc/SPEC.md written for speed: the PyTorch baseline of the GPU benchmark.

It computes the same function as model.py (check_fast_model.py compares the two in float64:
loss, logits and every parameter gradient) for std, mhar (any H; attnres is H = 1) and block
mode (any S), but is laid out the way a fast PyTorch transformer is written, so that the
"vs PyTorch" figures are measured against a strong baseline (bench_torch.py --impl fast):

- One nn.Linear (no bias) per matrix and block, not per-layer slices of stacked (L, ...)
  parameters (whose backward scatters each layer's gradient into a zero (L, ...) buffer).
- Fused projections: Wq|Wk|Wv as one ((NH + 2 NKV) HD, C) matrix and Wg|Wu as one (2F, C)
  matrix; one GEMM each instead of three and two, with the same outputs row for row.
- RoPE cos/sin are computed once (in float64, rounded to the buffer's dtype) and kept as
  buffers, instead of arange/pow/cos/sin in float64 inside every forward.
- Attention: F.scaled_dot_product_attention with enable_gqa (torch >= 2.5), so k and v are not
  copied NH/NKV times; or SDPA after repeat_interleave; or, without SDPA (torch 1.13), a plain
  masked softmax. All three compute SPEC 3's attention (check_fast_model.py runs each one that
  the installed torch has).
- The LM head multiplies by all Vp rows of wte (an aligned GEMM: Vp is a multiple of 128) and
  the loss reads the first V columns only, so padded rows never enter the softmax and get zero
  gradient from the head; head="v" multiplies by wte[:V] instead (as model.py does).
- Routing keeps the sources in a list and their RMS statistic r_i (SPEC 4: it depends only on
  the source) computed once per source, instead of stacking all sources and recomputing every
  r_i at every site. s[h,i] = r_i sum_{c in h} (q gamma)[c] v_i[c] is SPEC 4's score with the
  factors regrouped.

Precision under bf16 autocast follows model.py: norms and routing in float32, the residual
stream in float32 (the embedding is float32), the matrix products in bf16.

Diagnostic options for bench_torch.py (defaults give the baseline above):
  norm="fused"          F.rms_norm (torch >= 2.4) for every rmsnorm instead of model.py's
  ce="vp"               cross-entropy over all Vp columns (the padded logits enter the softmax:
                        NOT SPEC's model, only to time what that costs)
  ce="masked"           cross-entropy over all Vp columns with the padded ones set to -inf: SPEC's
                        loss (they get probability 0 and no gradient) without a sliced copy of
                        the (B*T, V) logits; ce="v" (the default) slices the first V columns
  residual_dtype=dtype  cast the embedding to dtype (bf16 under autocast keeps the residual
                        stream, or mhar's sources, in bf16 instead of float32)

Parameters map to the checkpoint layout (mhar_io.param_layout) through load_layout() and
layout(); check_fast_model.py uses that to copy model.py's parameters across.
"""

import math
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from mhar_io import Config
from model import RMS_EPS, ROPE_BASE, _compute_dtype, init_tensors, rmsnorm  # the same norm (SPEC 3), init and constants

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")                      # torch >= 2.0
HAS_GQA = HAS_SDPA and tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)
HAS_RMS_NORM = hasattr(F, "rms_norm")                                      # torch >= 2.4
ATTN_IMPLS = ("sdpa_gqa", "sdpa_repeat", "plain")


def available_attn_impls() -> List[str]:
    """The attention implementations the installed torch can run."""
    return [a for a in ATTN_IMPLS if a == "plain" or (a == "sdpa_repeat" and HAS_SDPA) or
            (a == "sdpa_gqa" and HAS_GQA)]


def fused_rmsnorm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """SPEC 3's rmsnorm as torch's F.rms_norm (torch >= 2.4). The same function in float32 and
    float64; for a bf16 x under autocast (QK-norm) torch computes in float32 and may round the
    normalised value to bf16 before the weight, where model.py's rmsnorm does not round."""
    return F.rms_norm(x, (x.shape[-1],), g, RMS_EPS)


def rope_tables(T: int, HD: int):
    """cos and sin of SPEC 3's angles t * 10000^(-2i/HD), (T, HD/2), in float64."""
    i = torch.arange(HD // 2, dtype=torch.float64)
    inv_freq = ROPE_BASE ** (-2.0 * i / HD)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angle.cos(), angle.sin()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """SPEC 3 rotate-half RoPE on x (B, T, heads, HD) with tables (T, HD/2); position t is the
    row's index in its sequence (model.py's CHOICE)."""
    half = x.shape[-1] // 2
    cos = cos[None, :x.shape[1], None, :].to(x.dtype)
    sin = sin[None, :x.shape[1], None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rms_stat(v: torch.Tensor) -> torch.Tensor:
    """SPEC 4's r_i = 1 / sqrt(|v_i|^2 / C + 1e-6) of one source v_i (B, T, C): (B, T, 1)."""
    vf = v.to(_compute_dtype(v))
    return torch.rsqrt(vf.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)


def route(sources: List[torch.Tensor], stats: List[torch.Tensor], q: torch.Tensor,
          gamma: torch.Tensor, H: int) -> torch.Tensor:
    """One routing site (SPEC 4) for every position: sources v_i (B, T, C) with their r_i
    (B, T, 1), site query q and key-norm weight gamma (C,), H heads of C/H channels.
        s[h,i] = r_i * sum_{c in head h} (q gamma)[c] v_i[c]      (= q . k_i over head h)
        a[h,:] = softmax over i;  out[c] = sum_i a[h(c), i] v_i[c]
    Output (B, T, C) in the compute dtype (>= float32). Sources enter the products in their own
    dtype (type promotion computes in float32 with q, gamma, a), so autograd keeps no per-site
    float32 copies of bf16 sources."""
    B, T, C = sources[0].shape
    w = (q * gamma).view(H, C // H)
    heads = [v.view(B, T, H, C // H) for v in sources]
    s = torch.stack([(vh * w).sum(dim=-1) * r for vh, r in zip(heads, stats)], dim=0)  # (n, B, T, H)
    a = torch.softmax(s, dim=0).unsqueeze(-1)                                           # (n, B, T, H, 1)
    out = a[0] * heads[0]
    for i in range(1, len(heads)):
        out = out + a[i] * heads[i]
    return out.reshape(B, T, C)


def _linear(n_in: int, n_out: int) -> nn.Linear:
    """nn.Linear without bias, left uninitialised (skip_init: no draws from the generator)."""
    return nn.utils.skip_init(nn.Linear, n_in, n_out, bias=False)


class Block(nn.Module):
    """Transformer block l: attention sublayer 2l and MLP sublayer 2l+1 (SPEC 3), each with its
    pre-norm weight. Weights are (out, in), applied as y = x W^T. Created uninitialised (no
    random draws: FastMHAR.init_weights draws every tensor)."""

    def __init__(self, cfg: Config):
        super().__init__()
        C, HD, NH, NKV = cfg.C, cfg.HD, cfg.NH, cfg.NKV
        self.ln1w = nn.Parameter(torch.empty(C))
        self.qkv = _linear(C, (NH + 2 * NKV) * HD)       # rows: Wq, then Wk, then Wv
        self.qnw = nn.Parameter(torch.empty(HD))
        self.knw = nn.Parameter(torch.empty(HD))
        self.wo = _linear(NH * HD, C)
        self.ln2w = nn.Parameter(torch.empty(C))
        self.gu = _linear(C, 2 * cfg.F)                  # rows: Wg, then Wu
        self.wd = _linear(cfg.F, C)


def vp_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, V: int, masked: bool) -> torch.Tensor:
    """Mean cross-entropy from logits (..., Vp) over all Vp columns. masked: the padded columns
    V..Vp-1 are set to -inf first, so the loss and its gradient are those over the first V columns
    (SPEC 3's), computed without slicing; otherwise the padded logits enter the softmax."""
    Vp = logits.shape[-1]
    if masked:
        col = torch.arange(Vp, device=logits.device)
        logits = logits.masked_fill(col >= V, float("-inf"))
    return F.cross_entropy(logits.reshape(-1, Vp), targets.reshape(-1))


class FastMHAR(nn.Module):
    """SPEC 3 transformer with the residual modes of SPEC 4 and 5, for speed.

    attn: "sdpa_gqa", "sdpa_repeat" or "plain" (see the module docstring); default: the first
    of those the installed torch has. head: "vp" (GEMM over all Vp rows, loss over the first V
    columns) or "v" (GEMM over wte[:V]). norm ("manual": model.py's rmsnorm, or "fused"), ce
    and residual_dtype: the diagnostic options of the module docstring."""

    def __init__(self, cfg: Config, attn: Optional[str] = None, head: str = "vp", norm: str = "manual",
                 ce: str = "v", residual_dtype: Optional[torch.dtype] = None):
        super().__init__()
        problems = cfg.problems()
        if problems:
            raise ValueError("bad config: " + "; ".join(problems))
        attn = attn or available_attn_impls()[0]
        if attn not in available_attn_impls():
            raise ValueError(f"attention {attn!r} is not available with torch {torch.__version__} "
                             f"(available: {', '.join(available_attn_impls())})")
        if head not in ("vp", "v"):
            raise ValueError(f"head {head!r}: use 'vp' or 'v'")
        if norm not in ("manual", "fused") or (norm == "fused" and not HAS_RMS_NORM):
            raise ValueError(f"norm {norm!r}: use 'manual' or 'fused' (F.rms_norm, torch >= 2.4; "
                             f"have {torch.__version__})")
        if ce not in ("v", "vp", "masked") or (ce != "v" and head != "vp"):
            raise ValueError(f"ce {ce!r} with head {head!r}: use 'v', or 'vp' or 'masked' (they read all Vp "
                             f"logits) with head 'vp'")
        self.cfg, self.attn, self.head_rows = cfg, attn, head
        self.norm = fused_rmsnorm if norm == "fused" else rmsnorm
        self.ce, self.residual_dtype = ce, residual_dtype
        self.wte = nn.Parameter(torch.empty(cfg.Vp, cfg.C))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.L))
        self.lnfw = nn.Parameter(torch.empty(cfg.C))
        if cfg.mode == "mhar":                     # one query and gamma per site j = 0 .. 2L
            self.rq = nn.Parameter(torch.empty(2 * cfg.L + 1, cfg.C))
            self.rg = nn.Parameter(torch.empty(2 * cfg.L + 1, cfg.C))
        cos, sin = rope_tables(cfg.T, cfg.HD)
        self.register_buffer("rope_cos", cos.float(), persistent=False)
        self.register_buffer("rope_sin", sin.float(), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator: Optional[torch.Generator] = None):
        """SPEC 6: matrices N(0, 0.02^2), norm weights and gamma 1, routing queries 0; the padded
        rows V..Vp-1 of wte 0 (model.py's CHOICE). Drawn tensor by tensor in the checkpoint
        layout's order and shapes, as model.py draws them, so one seed gives both models the
        same parameters."""
        tensors = init_tensors(self.cfg, self.wte.dtype, self.wte.device, generator)
        self.load_layout(tensors)

    def _apply(self, fn, *args, **kwargs):
        """Keep the RoPE tables in the model's float dtype, rounded once from float64."""
        super()._apply(fn, *args, **kwargs)
        cos, sin = rope_tables(self.cfg.T, self.cfg.HD)
        self.rope_cos = cos.to(self.wte.device, self.wte.dtype)
        self.rope_sin = sin.to(self.wte.device, self.wte.dtype)
        return self

    def matrices(self) -> List[nn.Parameter]:
        """The parameters that take weight decay (the matrices of SPEC 6)."""
        return [p for n, p in self.named_parameters() if p.dim() == 2 and n not in ("rq", "rg")]

    # ------------------------------------------------------------------ checkpoint layout

    @torch.no_grad()
    def load_layout(self, tensors: Dict[str, torch.Tensor]):
        """Copy parameters given in the checkpoint layout (mhar_io.param_layout names/shapes)."""
        cfg = self.cfg
        self.wte.copy_(tensors["wte"])
        self.lnfw.copy_(tensors["lnfw"])
        for l, b in enumerate(self.blocks):
            b.ln1w.copy_(tensors["ln1w"][l])
            b.qkv.weight.copy_(torch.cat([tensors["wq"][l], tensors["wk"][l], tensors["wv"][l]], 0))
            b.qnw.copy_(tensors["qnw"][l])
            b.knw.copy_(tensors["knw"][l])
            b.wo.weight.copy_(tensors["wo"][l])
            b.ln2w.copy_(tensors["ln2w"][l])
            b.gu.weight.copy_(torch.cat([tensors["wg"][l], tensors["wu"][l]], 0))
            b.wd.weight.copy_(tensors["wd"][l])
        if cfg.mode == "mhar":
            self.rq.copy_(tensors["rq"])
            self.rg.copy_(tensors["rg"])

    def layout(self, grad: bool = False) -> Dict[str, torch.Tensor]:
        """The parameters (or their gradients) in the checkpoint layout, as new tensors."""
        cfg = self.cfg
        get = (lambda p: p.grad if p.grad is not None else torch.zeros_like(p)) if grad else \
            (lambda p: p.detach())
        nq, nkv = cfg.NH * cfg.HD, cfg.NKV * cfg.HD
        per = {n: [] for n in ("ln1w", "wq", "wk", "wv", "qnw", "knw", "wo", "ln2w", "wg", "wu", "wd")}
        for b in self.blocks:
            qkv, gu = get(b.qkv.weight), get(b.gu.weight)
            for n, t in (("ln1w", get(b.ln1w)), ("wq", qkv[:nq]), ("wk", qkv[nq:nq + nkv]),
                         ("wv", qkv[nq + nkv:]), ("qnw", get(b.qnw)), ("knw", get(b.knw)),
                         ("wo", get(b.wo.weight)), ("ln2w", get(b.ln2w)), ("wg", gu[:cfg.F]),
                         ("wu", gu[cfg.F:]), ("wd", get(b.wd.weight))):
                per[n].append(t)
        out = {"wte": get(self.wte).clone(), "lnfw": get(self.lnfw).clone()}
        out.update({n: torch.stack(ts) for n, ts in per.items()})
        if cfg.mode == "mhar":
            out["rq"], out["rg"] = get(self.rq).clone(), get(self.rg).clone()
        return out

    # ------------------------------------------------------------------ sublayers

    def attention(self, b: Block, u: torch.Tensor) -> torch.Tensor:
        """SPEC 3 attention sublayer on the normalised input u (B, T, C)."""
        cfg = self.cfg
        B, T, _ = u.shape
        NH, NKV, HD = cfg.NH, cfg.NKV, cfg.HD
        q, k, v = b.qkv(u).split([NH * HD, NKV * HD, NKV * HD], dim=-1)
        q = rope(self.norm(q.view(B, T, NH, HD), b.qnw), self.rope_cos, self.rope_sin)
        k = rope(self.norm(k.view(B, T, NKV, HD), b.knw), self.rope_cos, self.rope_sin)
        # q and k leave the norm in >= float32; SDPA takes one dtype (under autocast bf16, the
        # dtype autocast would cast q and k to)
        v = v.view(B, T, NKV, HD)
        q, k = q.to(v.dtype), k.to(v.dtype)
        rep = NH // NKV                  # query head h reads kv head h // rep
        if self.attn != "sdpa_gqa" and rep > 1:
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))                  # (B, heads, T, HD)
        if self.attn == "sdpa_gqa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif self.attn == "sdpa_repeat":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))
            causal = torch.ones(T, T, dtype=torch.bool, device=u.device).tril()
            y = att.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        return b.wo(y.transpose(1, 2).reshape(B, T, NH * HD))

    def mlp(self, b: Block, u: torch.Tensor) -> torch.Tensor:
        """SPEC 3 SwiGLU: Wd (silu(Wg u) * (Wu u)), Wg and Wu as one GEMM."""
        g, up = b.gu(u).chunk(2, dim=-1)
        return b.wd(F.silu(g) * up)

    def sublayer(self, j: int, x: torch.Tensor) -> torch.Tensor:
        """f_j(rmsnorm(x; g_j)): even j attention of block j/2, odd j its MLP (SPEC 2)."""
        b = self.blocks[j // 2]
        if j % 2 == 0:
            return self.attention(b, self.norm(x, b.ln1w))
        return self.mlp(b, self.norm(x, b.ln2w))

    # ------------------------------------------------------------------ residual modes

    def stream(self, x0: torch.Tensor) -> torch.Tensor:
        """Embedding -> h_final by the config's residual mode (SPEC 4, 5)."""
        cfg = self.cfg
        n_sub = 2 * cfg.L
        if cfg.mode == "std":                     # x_{j+1} = x_j + f_j(rmsnorm(x_j))
            x = x0
            for j in range(n_sub):
                x = x + self.sublayer(j, x)
            return x
        H, S = cfg.H, cfg.S
        # Block mode (S = 1 is full mode): completed blocks b_0 = embedding, b_1, ... with their
        # r statistics, plus the partial sum of the current block when it has >= 1 output.
        blocks, stats = [x0], [rms_stat(x0)]
        partial = None
        for j in range(n_sub):
            if partial is None:
                h = route(blocks, stats, self.rq[j], self.rg[j], H)
            else:
                h = route(blocks + [partial], stats + [rms_stat(partial)], self.rq[j], self.rg[j], H)
            out = self.sublayer(j, h)
            partial = out if partial is None else partial + out
            if (j + 1) % S == 0:
                blocks.append(partial)
                stats.append(rms_stat(partial))
                partial = None
        if partial is not None:
            blocks, stats = blocks + [partial], stats + [rms_stat(partial)]
        return route(blocks, stats, self.rq[n_sub], self.rg[n_sub], H)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None):
        """idx, targets (B, T) int64 -> mean cross-entropy over all B*T positions (SPEC 3), or
        the logits (B, T, V) without targets."""
        if idx.shape[1] > self.cfg.T:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds the model's T={self.cfg.T}")
        V = self.cfg.V
        x0 = F.embedding(idx, self.wte)
        if self.residual_dtype is not None:
            x0 = x0.to(self.residual_dtype)
        h = self.norm(self.stream(x0), self.lnfw)
        if self.ce != "v" and targets is not None:
            return vp_cross_entropy(F.linear(h, self.wte), targets, V, self.ce == "masked")
        if self.head_rows == "vp":
            logits = F.linear(h, self.wte)[..., :V]
        else:
            logits = F.linear(h, self.wte[:V])
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
