"""An independent PyTorch model of SPEC.md (Multi-Head Attention Residuals).

Written from doc/SPEC.md alone, not from the C trainer: its purpose is to check that
the C/CUDA code computes what the SPEC says (check_grads.py). The GPU speed baseline is
fast_model.py, the same function laid out for speed (check_fast_model.py compares the two).
It runs on CPU in float64 and on CUDA in bf16 (bench_torch.py --impl ref).

The parameters mirror the checkpoint layout one to one (mhar_io.param_layout): per-layer
weights are stacked along a leading L axis, e.g. wq has shape (L, NH*HD, C), so loading a
checkpoint and comparing gradients needs no renaming. Linear weights are (out, in) and are
applied as y = x @ W^T (F.linear).

Team choices where SPEC is silent are marked "CHOICE".
"""

import math
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from mhar_io import Config, Checkpoint, param_layout

RMS_EPS = 1e-6        # SPEC 3 (rmsnorm) and SPEC 4 (routing statistic r_i)
ROPE_BASE = 10000.0   # SPEC 3


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """Norm and routing statistics run in at least float32: float64 stays float64 (the
    gradient check), bf16 activations are upcast (the GPU baseline)."""
    return torch.promote_types(t.dtype, torch.float32)


def rmsnorm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """SPEC 3: rmsnorm(x; g) = x / sqrt(mean(x^2) + 1e-6) * g, mean over the last axis."""
    xf = x.to(_compute_dtype(x))
    return xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS) * g


def rope(x: torch.Tensor) -> torch.Tensor:
    """SPEC 3: rotate-half RoPE, base 10000, on x of shape (B, T, heads, HD); the position of
    row t is t (CHOICE: positions restart at 0 in every sequence of the batch).
    For i < HD/2: angle = t * 10000^(-2i/HD),
      out[i]        = x[i] cos - x[i+HD/2] sin
      out[i+HD/2]   = x[i+HD/2] cos + x[i] sin
    Angles are computed in float64 and rounded once to x's dtype."""
    T, HD = x.shape[1], x.shape[3]
    half = HD // 2
    i = torch.arange(half, dtype=torch.float64, device=x.device)
    inv_freq = ROPE_BASE ** (-2.0 * i / HD)                          # (HD/2,)
    t = torch.arange(T, dtype=torch.float64, device=x.device)
    angle = t[:, None] * inv_freq[None, :]                            # (T, HD/2)
    cos = angle.cos().to(x.dtype)[None, :, None, :]                  # (1, T, 1, HD/2)
    sin = angle.sin().to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def route(sources: List[torch.Tensor], q: torch.Tensor, gamma: torch.Tensor,
          H: int) -> torch.Tensor:
    """One MHAR routing site (SPEC 4), for every position at once.

    sources: n tensors (B, T, C), the v_0 .. v_{n-1} this site may read
    q, gamma: (C,) the site's pseudo-query q_j and key-norm weight gamma_j
    H: routing heads; head h owns channels [h*C/H, (h+1)*C/H)
        r_i    = 1 / sqrt(|v_i|^2 / C + 1e-6)     (full-width RMS, NOT per head)
        k_i    = gamma * r_i * v_i                (keys normalised, values raw)
        s[h,i] = sum_{c in head h} q[c] k_i[c]    (no temperature, no 1/sqrt scale)
        a[h,:] = softmax over i of s[h,:]
        out[c] = sum_i a[h(c), i] v_i[c]
    (r_i could be cached per source; recomputing it here keeps the function self-contained.)
    """
    dt = _compute_dtype(sources[0])
    v = torch.stack([s.to(dt) for s in sources], dim=0)              # (n, B, T, C)
    n, B, T, C = v.shape
    r = torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)   # (n, B, T, 1)
    k = gamma * r * v                                                 # (n, B, T, C)
    s = (q * k).view(n, B, T, H, C // H).sum(dim=-1)                  # (n, B, T, H)
    a = torch.softmax(s, dim=0)                                       # softmax over depth
    out = (a.unsqueeze(-1) * v.view(n, B, T, H, C // H)).sum(dim=0)   # (B, T, H, C/H)
    return out.reshape(B, T, C)


@torch.no_grad()
def init_tensors(cfg: Config, dtype: torch.dtype = torch.float64, device=None,
                 generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
    """Every parameter at its initial value, by name, drawn tensor by tensor in the checkpoint
    layout's order and shapes (so one seed gives model.py, fast_model.py and plain_model.py the
    same parameters):
    SPEC 6: all matrices N(0, 0.02^2); all norm weights and gamma 1; routing queries 0.
    SPEC 8 (hc): alpha 0.02 N(0,1), A = I + 0.02 N(0,1), beta = e_0 + 0.02 N(0,1).
    SPEC 9: delta's null sources and gates 0.
    CHOICE: the padded rows V..Vp-1 of wte are set to 0 (they never enter the loss)."""
    out = {}
    for name, shape in param_layout(cfg):
        p = torch.empty(shape, dtype=dtype, device=device)
        if name in ("ln1w", "ln2w", "qnw", "knw", "lnfw", "rg"):
            p.fill_(1.0)
        elif name in ("rq", "dnull", "dalpha"):
            p.zero_()
        elif name in ("hcalpha", "hca", "hcbeta"):
            p.normal_(0.0, 0.02, generator=generator)
            if name == "hca":
                p += torch.eye(cfg.n, dtype=p.dtype, device=p.device)
            if name == "hcbeta":
                p[:, 0] += 1.0
        else:
            p.normal_(0.0, 0.02, generator=generator)
        out[name] = p
    out["wte"][cfg.V:].zero_()
    return out


class MHAR(nn.Module):
    """The transformer of SPEC 3 with the residual modes of SPEC 4, 5 and 9."""

    def __init__(self, cfg: Config):
        super().__init__()
        problems = cfg.problems()
        if problems:
            raise ValueError("bad config: " + "; ".join(problems))
        self.cfg = cfg
        # One nn.Parameter per checkpoint tensor, same name, same shape (mhar_io.param_layout).
        # std mode has no rq/rg (CHOICE: no routing parameters at all in std mode).
        for name, shape in param_layout(cfg):
            self.register_parameter(name, nn.Parameter(torch.empty(shape)))
        self.init_weights()

    # ------------------------------------------------------------------ initialisation

    @torch.no_grad()
    def init_weights(self, generator: Optional[torch.Generator] = None):
        """init_tensors' draws, in this model's dtype and device."""
        tensors = init_tensors(self.cfg, self.wte.dtype, self.wte.device, generator)
        for name, p in self.named_parameters():
            p.copy_(tensors[name])

    @torch.no_grad()
    def load_checkpoint(self, ck: Checkpoint):
        """Copy the parameters of a checkpoint (any float dtype) into this model."""
        if ck.cfg != self.cfg:
            raise ValueError(f"checkpoint config {ck.cfg} does not match model config {self.cfg}")
        for name, p in self.named_parameters():
            p.copy_(torch.from_numpy(ck.params[name].copy()).to(p.dtype))

    # ------------------------------------------------------------------ sublayers

    def attention(self, l: int, u: torch.Tensor) -> torch.Tensor:
        """SPEC 3 attention sublayer of block l on the normalised input u (B, T, C)."""
        cfg = self.cfg
        B, T, _ = u.shape
        NH, NKV, HD = cfg.NH, cfg.NKV, cfg.HD
        q = F.linear(u, self.wq[l]).view(B, T, NH, HD)
        k = F.linear(u, self.wk[l]).view(B, T, NKV, HD)
        v = F.linear(u, self.wv[l]).view(B, T, NKV, HD)
        # QK-norm: rmsnorm over HD of every head, weights shared across heads; then RoPE.
        q = rope(rmsnorm(q, self.qnw[l]))
        k = rope(rmsnorm(k, self.knw[l]))
        # GQA: query head h reads kv head h // (NH/NKV), i.e. each kv head serves NH/NKV
        # consecutive query heads.
        rep = NH // NKV
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2).to(q.dtype)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))                # (B, NH, T, HD)
        if hasattr(F, "scaled_dot_product_attention"):                 # torch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(HD)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))
            causal = torch.ones(T, T, dtype=torch.bool, device=u.device).tril()
            att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).reshape(B, T, NH * HD)
        return F.linear(y, self.wo[l])

    def mlp(self, l: int, u: torch.Tensor) -> torch.Tensor:
        """SPEC 3 SwiGLU MLP: Wd (silu(Wg u) * (Wu u))."""
        return F.linear(F.silu(F.linear(u, self.wg[l])) * F.linear(u, self.wu[l]), self.wd[l])

    def sublayer(self, j: int, x: torch.Tensor) -> torch.Tensor:
        """f_j(rmsnorm(x; g_j)): even j = attention of block j/2, odd j = its MLP (SPEC 2)."""
        l = j // 2
        if j % 2 == 0:
            return self.attention(l, rmsnorm(x, self.ln1w[l]))
        return self.mlp(l, rmsnorm(x, self.ln2w[l]))

    # ------------------------------------------------------------------ residual modes

    def _stream_std(self, x0: torch.Tensor) -> torch.Tensor:
        """SPEC 4 std: x_{j+1} = x_j + f_j(rmsnorm(x_j; g_j)); h_final = x_{2L}."""
        x = x0
        for j in range(2 * self.cfg.L):
            x = x + self.sublayer(j, x)
        return x

    def _stream_full(self, x0: torch.Tensor) -> torch.Tensor:
        """SPEC 4 mhar, full mode: sources v_0 = embedding, v_{j+1} = raw output of sublayer j;
        h_j = route_j(v_0..v_j); h_final = route_2L(v_0..v_2L). No running sum."""
        H = self.cfg.H
        sources = [x0]
        for j in range(2 * self.cfg.L):
            h = route(sources, self.rq[j], self.rg[j], H)
            sources.append(self.sublayer(j, h))
        j = 2 * self.cfg.L
        return route(sources, self.rq[j], self.rg[j], H)

    def _stream_block(self, x0: torch.Tensor, S: int) -> torch.Tensor:
        """SPEC 5 block mode: sources of site j are [b_0, b_1, .., b_m] (b_0 = embedding,
        b_m = sum of the outputs of block m's S sublayers) plus the partial sum of the current
        block's outputs so far, when there is one. The final site reads the same way."""
        H = self.cfg.H
        blocks = [x0]          # b_0, b_1, ..., the completed blocks
        partial = None         # sum of the outputs of the current block so far (None if p = 0)
        for j in range(2 * self.cfg.L):
            sources = blocks if partial is None else blocks + [partial]
            out = self.sublayer(j, route(sources, self.rq[j], self.rg[j], H))
            partial = out if partial is None else partial + out
            if (j + 1) % S == 0:   # block complete
                blocks.append(partial)
                partial = None
        j = 2 * self.cfg.L
        sources = blocks if partial is None else blocks + [partial]
        return route(sources, self.rq[j], self.rg[j], H)

    def _stream_delta(self, x0: torch.Tensor, S: int) -> torch.Tensor:
        """SPEC 9 delta: the std stream x_j, and at every site j
            h_j = x_j + alpha_j * route_j([n_j, b_0, b_1, .., b_m]),  m = j // S
        n_j the site's null source (the same vector at every position), b_0 = x_0 and
        b_k = x_{kS} - x_{(k-1)S} (taken literally, as stream differences). The final site
        reads all completed blocks, m = 2L // S (CHOICE, SPEC 9: a trailing partial block is
        not a source)."""
        H, L2 = self.cfg.H, 2 * self.cfg.L
        xs = [x0]                                   # x_0 .. x_j
        for j in range(L2 + 1):
            blocks = [xs[k * S] - xs[(k - 1) * S] for k in range(1, j // S + 1)]
            sources = [self.dnull[j].expand_as(x0), x0] + blocks
            h = xs[j] + self.dalpha[j] * route(sources, self.rq[j], self.rg[j], H)
            if j == L2:
                return h
            xs.append(xs[j] + self.sublayer(j, h))

    def _stream_hc(self, x0: torch.Tensor) -> torch.Tensor:
        """SPEC 8 hyper-connections with n streams X_r (stacked as (n, B, T, C)):
        X_r = embedding for every r; per sublayer j, w = softmax(alpha_j),
        h_j = sum_r w[r] X_r, o_j = f_j(rmsnorm(h_j)), X'_r = sum_s A_j[r,s] X_s + beta_j[r] o_j;
        h_final = mean over r of X_r."""
        n = self.cfg.n
        X = x0.unsqueeze(0).expand(n, *x0.shape)
        for j in range(2 * self.cfg.L):
            w = torch.softmax(self.hcalpha[j], dim=0)
            h = torch.einsum("r,rbtc->btc", w, X)
            o = self.sublayer(j, h)
            X = torch.einsum("rs,sbtc->rbtc", self.hca[j], X) + self.hcbeta[j][:, None, None, None] * o
        return X.mean(dim=0)

    # ------------------------------------------------------------------ forward

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None):
        """idx, targets: (B, T) int64. Returns the mean cross-entropy over all B*T positions
        (SPEC 3) when targets are given, else the logits (B, T, V)."""
        if idx.shape[1] > self.cfg.T:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds the model's T={self.cfg.T}")
        x0 = F.embedding(idx, self.wte)      # v_0 = wte[token]; no position embedding (SPEC 3)
        return self.head(self.stream(x0), targets)

    def stream(self, x0: torch.Tensor) -> torch.Tensor:
        """Embedding -> h_final, by the residual mode of the config (SPEC 4, 5, 9)."""
        if self.cfg.mode == "std":
            return self._stream_std(x0)
        if self.cfg.mode == "hc":
            return self._stream_hc(x0)
        if self.cfg.mode == "delta":
            return self._stream_delta(x0, self.cfg.S)
        if self.cfg.S == 1:
            return self._stream_full(x0)
        return self._stream_block(x0, self.cfg.S)

    def head(self, h: torch.Tensor, targets: Optional[torch.Tensor] = None):
        """Final norm g_f, tied LM head over the V real rows only (padded rows never enter the
        softmax), mean cross-entropy over all positions (SPEC 3)."""
        V = self.cfg.V
        logits = F.linear(rmsnorm(h, self.lnfw), self.wte[:V])
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
