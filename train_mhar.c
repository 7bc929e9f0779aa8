/*
train_mhar.c: the CPU reference trainer of Multi-Head Attention Residuals.

A Qwen3-style transformer (RMSNorm, RoPE, GQA with QK-norm, SwiGLU, tied
embeddings) whose residual stream is either the usual running sum (std) or
MHAR routing: the input of every sublayer is a learned softmax mix, over depth,
of all earlier sublayer outputs, with one softmax per routing head. The model
is specified in doc/SPEC.md; section numbers below refer to it.

Every forward and backward pass is written out by hand in plain C. Each layer
has X_forward and X_backward side by side; backward functions add (+=) into
their gradient outputs. The routing lives in source_stat_forward,
route_forward and route_backward; hyper-connections (hc mode, SPEC section 8)
in the hc_* layers. Read top to bottom: layers, then the model,
then the optimiser and checkpoints. The training loop itself (main) is
common/train_loop.h, shared with the CUDA trainer train_mhar.cu.

Build: make train_mhar. Floats are `real`, float by default; the test build
compiles this same file with -DMHAR_REAL=double for finite differences.
*/
#include <sys/stat.h>
#include <tgmath.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "common/util.h"
#include "common/config.h"
#include "common/args.h"
#include "common/dataloader.h"
#include "common/checkpoint.h"
#include "common/logger.h"
#include "common/tokenizer.h"

#define TRAINER_HAS_HC   // common/train_loop.h: this trainer runs -r hc

#ifndef MHAR_REAL
#define MHAR_REAL float
#endif
typedef MHAR_REAL real;

// ----------------------------------------------------------------------------
// Matrix multiply
//
// Every matmul of the model multiplies by a weight W of shape (OC, IC), the
// layout of PyTorch's Linear:
//   forward   out  (N, OC)  = inp (N, IC) . W^T
//   backward  dinp (N, IC) += dout (N, OC) . W
//             dW   (OC, IC) += dout^T . inp
// All three go through gemm(), which computes C (+)= A B for A and B given with
// arbitrary strides. It is cache-blocked in the classic way: a KC x NC block of
// B and an MC x KC block of A are copied ("packed") into contiguous panels, and
// a small MR x NR tile of C is kept in registers while it streams through
// them. The compiler vectorises the tile loop. Each element of C is summed in
// the same order whatever the number of threads, so results are identical for
// any OMP_NUM_THREADS.

#define GEMM_MR 6     // rows of the register tile
#define GEMM_NR 32    // columns of the register tile (two AVX-512 vectors of float)
#define GEMM_KC 256   // depth of one packed block
#define GEMM_MC 96    // rows of A packed per thread (multiple of MR)
#define GEMM_NC 2048  // columns of B packed at once (multiple of NR)

// Copy the mc x kc block A(i, k) = A[i*sa_m + k*sa_k] into panels of MR rows,
// each stored k-major, zero-padded to a whole panel.
static void gemm_pack_a(real *dst, const real *A, size_t sa_m, size_t sa_k, int mc, int kc) {
    for (int i0 = 0; i0 < mc; i0 += GEMM_MR) {
        for (int k = 0; k < kc; k++) {
            for (int r = 0; r < GEMM_MR; r++) {
                dst[r] = i0 + r < mc ? A[(size_t)(i0 + r) * sa_m + (size_t)k * sa_k] : 0;
            }
            dst += GEMM_MR;
        }
    }
}

// Copy the kc x nc block B(k, j) = B[k*sb_k + j*sb_n] into panels of NR columns.
static void gemm_pack_b_panel(real *dst, const real *B, size_t sb_k, size_t sb_n, int kc, int nr) {
    for (int k = 0; k < kc; k++) {
        for (int c = 0; c < GEMM_NR; c++) {
            dst[(size_t)k * GEMM_NR + c] = c < nr ? B[(size_t)k * sb_k + (size_t)c * sb_n] : 0;
        }
    }
}

// The register tile: C[0:mr, 0:nr] (+)= Apanel . Bpanel over kc.
static void gemm_tile(int kc, const real *restrict Ap, const real *restrict Bp, real *C, size_t ldc,
                      int mr, int nr, int overwrite) {
    real acc[GEMM_MR][GEMM_NR];
    for (int r = 0; r < GEMM_MR; r++) {
        for (int c = 0; c < GEMM_NR; c++) { acc[r][c] = 0; }
    }
    for (int k = 0; k < kc; k++) {
        const real *b = Bp + (size_t)k * GEMM_NR;
        for (int r = 0; r < GEMM_MR; r++) {
            real a = Ap[(size_t)k * GEMM_MR + r];
            for (int c = 0; c < GEMM_NR; c++) { acc[r][c] += a * b[c]; }
        }
    }
    for (int r = 0; r < mr; r++) {
        real *row = C + (size_t)r * ldc;
        for (int c = 0; c < nr; c++) { row[c] = overwrite ? acc[r][c] : row[c] + acc[r][c]; }
    }
}

// C (M, N, row-major) = or += A (M, K) . B (K, N), where A(i, k) = A[i*sa_m + k*sa_k]
// and B(k, j) = B[k*sb_k + j*sb_n].
static void gemm(real *C, const real *A, size_t sa_m, size_t sa_k, const real *B, size_t sb_k,
                 size_t sb_n, int M, int N, int K, int accumulate) {
    if (K == 0 && !accumulate) { memset(C, 0, (size_t)M * N * sizeof(real)); }
    real *Bp = (real *)malloc_check((size_t)GEMM_KC * GEMM_NC * sizeof(real));
    for (int j0 = 0; j0 < N; j0 += GEMM_NC) {
        int nc = N - j0 < GEMM_NC ? N - j0 : GEMM_NC;
        for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
            int kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
            int overwrite = !accumulate && k0 == 0;
            int npanels = (nc + GEMM_NR - 1) / GEMM_NR;
            #pragma omp parallel for schedule(static)
            for (int jp = 0; jp < npanels; jp++) {
                int nr = nc - jp * GEMM_NR < GEMM_NR ? nc - jp * GEMM_NR : GEMM_NR;
                gemm_pack_b_panel(Bp + (size_t)jp * kc * GEMM_NR,
                                  B + (size_t)k0 * sb_k + (size_t)(j0 + jp * GEMM_NR) * sb_n, sb_k, sb_n, kc, nr);
            }
            int nblocks = (M + GEMM_MC - 1) / GEMM_MC;
            #pragma omp parallel
            {
                real *Ap = (real *)malloc_check((size_t)GEMM_MC * GEMM_KC * sizeof(real));
                #pragma omp for schedule(static)
                for (int ib = 0; ib < nblocks; ib++) {
                    int i0 = ib * GEMM_MC;
                    int mc = M - i0 < GEMM_MC ? M - i0 : GEMM_MC;
                    gemm_pack_a(Ap, A + (size_t)i0 * sa_m + (size_t)k0 * sa_k, sa_m, sa_k, mc, kc);
                    for (int jp = 0; jp < npanels; jp++) {
                        int nr = nc - jp * GEMM_NR < GEMM_NR ? nc - jp * GEMM_NR : GEMM_NR;
                        for (int ir = 0; ir < mc; ir += GEMM_MR) {
                            int mr = mc - ir < GEMM_MR ? mc - ir : GEMM_MR;
                            gemm_tile(kc, Ap + (size_t)ir * kc, Bp + (size_t)jp * kc * GEMM_NR,
                                      C + (size_t)(i0 + ir) * N + j0 + jp * GEMM_NR, (size_t)N, mr, nr, overwrite);
                        }
                    }
                }
                free(Ap);
            }
        }
    }
    free(Bp);
}

// out (N, OC) = inp (N, IC) . weight^T, weight (OC, IC)
void matmul_forward(real *out, const real *inp, const real *weight, size_t N, int IC, int OC) {
    gemm(out, inp, IC, 1, weight, 1, IC, (int)N, OC, IC, 0);
}

// dinp (N, IC) += dout . weight;  dweight (OC, IC) += dout^T . inp
void matmul_backward(real *dinp, real *dweight, const real *dout, const real *inp, const real *weight,
                     size_t N, int IC, int OC) {
    // out[n][o] = sum_i inp[n][i] * weight[o][i]
    gemm(dinp, dout, OC, 1, weight, IC, 1, (int)N, IC, OC, 1);
    gemm(dweight, dout, 1, OC, inp, IC, 1, OC, IC, (int)N, 1);
}

// ----------------------------------------------------------------------------
// Embedding

// out (N, C) = wte[inp[n]]: the first source v_0 (SPEC section 4)
void encoder_forward(real *out, const int *inp, const real *wte, size_t N, int C) {
    for (size_t n = 0; n < N; n++) {
        memcpy(out + n * C, wte + (size_t)inp[n] * C, C * sizeof(real));
    }
}

// dwte[inp[n]] += dout[n]; serial, since the same token can appear twice
void encoder_backward(real *dwte, const real *dout, const int *inp, size_t N, int C) {
    for (size_t n = 0; n < N; n++) {
        real *d = dwte + (size_t)inp[n] * C;
        const real *g = dout + n * C;
        for (int c = 0; c < C; c++) { d[c] += g[c]; }
    }
}

// ----------------------------------------------------------------------------
// RMSNorm, used for the pre-norms (vectors of C), the final norm, and QK-norm
// (each head's vector of HD, weights shared across heads).

// out (N, D) = inp / sqrt(mean(inp^2) + 1e-6) * w;  rstd (N) kept for backward
void rmsnorm_forward(real *out, real *rstd, const real *inp, const real *w, size_t N, int D) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real *x = inp + n * D;
        real ss = 0;
        for (int i = 0; i < D; i++) { ss += x[i] * x[i]; }
        real s = 1 / sqrt(ss / D + (real)1e-6);
        for (int i = 0; i < D; i++) { out[n * D + i] = x[i] * s * w[i]; }
        rstd[n] = s;
    }
}

// dinp (N, D) += ...;  dw (D) += ...
void rmsnorm_backward(real *dinp, real *dw, const real *dout, const real *inp, const real *rstd,
                      const real *w, size_t N, int D) {
    // out[i] = x[i] * s * w[i], with s = (mean(x^2) + eps)^(-1/2), ds/dx[i] = -s^3 x[i] / D
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real *x = inp + n * D, *g = dout + n * D;
        real s = rstd[n], gwx = 0;
        for (int i = 0; i < D; i++) { gwx += g[i] * w[i] * x[i]; }
        for (int i = 0; i < D; i++) {
            dinp[n * D + i] += s * g[i] * w[i] - s * s * s / D * gwx * x[i];
        }
    }
    // dw[i] = sum_n dout[n][i] * x[n][i] * s[n]; serial over n, so the order is fixed
    for (size_t n = 0; n < N; n++) {
        const real *x = inp + n * D, *g = dout + n * D;
        for (int i = 0; i < D; i++) { dw[i] += g[i] * x[i] * rstd[n]; }
    }
}

// ----------------------------------------------------------------------------
// RoPE, rotate-half convention, applied to queries and keys after QK-norm.
// cosv, sinv (T, HD/2): angle t * 10000^(-2i/HD) at position t.

// out (B, T, nh, HD) = rotate(inp); out may equal inp
void rope_forward(real *out, const real *inp, const real *cosv, const real *sinv, int B, int T, int nh, int HD) {
    int half = HD / 2;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < nh; h++) {
                size_t off = (((size_t)b * T + t) * nh + h) * HD;
                for (int i = 0; i < half; i++) {
                    real c = cosv[t * half + i], s = sinv[t * half + i];
                    real x1 = inp[off + i], x2 = inp[off + i + half];
                    out[off + i] = x1 * c - x2 * s;
                    out[off + i + half] = x2 * c + x1 * s;
                }
            }
        }
    }
}

// dinp += rotate^T(dout): the rotation by -angle
void rope_backward(real *dinp, const real *dout, const real *cosv, const real *sinv, int B, int T, int nh, int HD) {
    int half = HD / 2;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < nh; h++) {
                size_t off = (((size_t)b * T + t) * nh + h) * HD;
                for (int i = 0; i < half; i++) {
                    real c = cosv[t * half + i], s = sinv[t * half + i];
                    real g1 = dout[off + i], g2 = dout[off + i + half];
                    // out1 = x1 c - x2 s;  out2 = x2 c + x1 s
                    dinp[off + i] += g1 * c + g2 * s;
                    dinp[off + i + half] += g2 * c - g1 * s;
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// Causal self-attention with grouped-query heads: query head h reads key/value
// head h / (NH/NKV). Scores are scaled by 1/sqrt(HD).

// out (B, T, NH, HD); att (B, NH, T, T) keeps the probabilities (row t, columns
// 0..t); q (B, T, NH, HD); k, v (B, T, NKV, HD)
void attention_forward(real *out, real *att, const real *q, const real *k, const real *v,
                       int B, int T, int NH, int NKV, int HD) {
    real scale = 1 / sqrt((real)HD);
    int group = NH / NKV;
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const real *qt = q + (((size_t)b * T + t) * NH + h) * HD;
                real *p = att + (((size_t)b * NH + h) * T + t) * T;
                int kvh = h / group;
                real maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const real *kt = k + (((size_t)b * T + t2) * NKV + kvh) * HD;
                    real dot = 0;
                    for (int i = 0; i < HD; i++) { dot += qt[i] * kt[i]; }
                    p[t2] = dot * scale;
                    if (p[t2] > maxv) { maxv = p[t2]; }
                }
                real sum = 0;
                for (int t2 = 0; t2 <= t; t2++) { p[t2] = exp(p[t2] - maxv); sum += p[t2]; }
                for (int t2 = 0; t2 <= t; t2++) { p[t2] /= sum; }
                real *o = out + (((size_t)b * T + t) * NH + h) * HD;
                for (int i = 0; i < HD; i++) { o[i] = 0; }
                for (int t2 = 0; t2 <= t; t2++) {
                    const real *vt = v + (((size_t)b * T + t2) * NKV + kvh) * HD;
                    for (int i = 0; i < HD; i++) { o[i] += p[t2] * vt[i]; }
                }
            }
        }
    }
}

// dq (B, T, NH, HD), dk, dv (B, T, NKV, HD) += ... given dout (B, T, NH, HD)
void attention_backward(real *dq, real *dk, real *dv, const real *dout, const real *att,
                        const real *q, const real *k, const real *v, int B, int T, int NH, int NKV, int HD) {
    real scale = 1 / sqrt((real)HD);
    int group = NH / NKV;
    // one task per (b, kv head): the query heads of a group all write dk and dv of that head
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < NKV; kvh++) {
            real *dp = (real *)malloc_check((size_t)T * sizeof(real));
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int t = 0; t < T; t++) {
                    const real *p = att + (((size_t)b * NH + h) * T + t) * T;
                    const real *g = dout + (((size_t)b * T + t) * NH + h) * HD;
                    const real *qt = q + (((size_t)b * T + t) * NH + h) * HD;
                    real *dqt = dq + (((size_t)b * T + t) * NH + h) * HD;
                    // o = sum_t2 p[t2] v[t2]: dv[t2] += p[t2] g, dp[t2] = g . v[t2]
                    real pdp = 0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const real *vt = v + (((size_t)b * T + t2) * NKV + kvh) * HD;
                        real *dvt = dv + (((size_t)b * T + t2) * NKV + kvh) * HD;
                        real d = 0;
                        for (int i = 0; i < HD; i++) { d += g[i] * vt[i]; dvt[i] += p[t2] * g[i]; }
                        dp[t2] = d;
                        pdp += p[t2] * d;
                    }
                    // p = softmax(score): dscore = p * (dp - sum p dp); score = scale * q . k
                    for (int t2 = 0; t2 <= t; t2++) {
                        real dsc = p[t2] * (dp[t2] - pdp) * scale;
                        const real *kt = k + (((size_t)b * T + t2) * NKV + kvh) * HD;
                        real *dkt = dk + (((size_t)b * T + t2) * NKV + kvh) * HD;
                        for (int i = 0; i < HD; i++) { dqt[i] += dsc * kt[i]; dkt[i] += dsc * qt[i]; }
                    }
                }
            }
            free(dp);
        }
    }
}

// ----------------------------------------------------------------------------
// SwiGLU: out = silu(g) * u, silu(z) = z * sigmoid(z). All tensors (N*F).

void swiglu_forward(real *out, const real *g, const real *u, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real sig = 1 / (1 + exp(-g[i]));
        out[i] = g[i] * sig * u[i];
    }
}

void swiglu_backward(real *dg, real *du, const real *dout, const real *g, const real *u, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        // out = g sig(g) u;  d(g sig(g))/dg = sig (1 + g (1 - sig))
        real sig = 1 / (1 + exp(-g[i]));
        dg[i] += dout[i] * u[i] * sig * (1 + g[i] * (1 - sig));
        du[i] += dout[i] * g[i] * sig;
    }
}

// ----------------------------------------------------------------------------
// Slots: out = a + b (b may be NULL: a plain copy). Writes slot j+1 from the
// output of sublayer j (config.h explains the slots). Its backward is the
// pass-through of dslots in model_backward.
void residual_forward(real *out, const real *a, const real *b, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { out[i] = b ? a[i] + b[i] : a[i]; }
}

// ----------------------------------------------------------------------------
// MHAR routing (SPEC section 4). A routing site reads n sources v_i (slots of
// the slot buffer, listed in src), and per position and routing head h mixes
// them with a softmax over depth:
//   k_i    = gamma * r_i * v_i,      r_i = 1 / sqrt(|v_i|^2 / C + 1e-6)
//   s[h,i] = sum_{c in head h} q[c] k_i[c]
//   a[h,:] = softmax_i s[h,:]
//   out[c] = sum_i a[h(c), i] v_i[c]
// Head h owns channels [h*C/H, (h+1)*C/H). H = 1 is AttnRes.

// r (N) = 1 / sqrt(|v|^2 / C + 1e-6) of a freshly written source v (N, C).
// Computed once per source and reused by every later site.
void source_stat_forward(real *r, const real *v, size_t N, int C) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        real ss = 0;
        for (int c = 0; c < C; c++) { ss += v[n * C + c] * v[n * C + c]; }
        r[n] = 1 / sqrt(ss / C + (real)1e-6);
    }
}

// out (N, C): the routed mix; a (N, H, n): weights kept for backward.
// slots (nslots, N, C), r (nslots, N); q, gamma (C) of this site.
void route_forward(real *out, real *a, const real *slots, const real *r, const int *src, int n,
                   const real *q, const real *gamma, size_t N, int C, int H) {
    int HC = C / H;
    real *qg = (real *)malloc_check(C * sizeof(real));   // q * gamma, the same for every position
    for (int c = 0; c < C; c++) { qg[c] = q[c] * gamma[c]; }
    #pragma omp parallel for
    for (size_t t = 0; t < N; t++) {
        real *at = a + t * H * n;
        // scores s[h,i] = r_i * sum_{c in h} q gamma v_i, kept in at[] until the softmax
        for (int i = 0; i < n; i++) {
            const real *vi = slots + ((size_t)src[i] * N + t) * C;
            real ri = r[(size_t)src[i] * N + t];
            for (int h = 0; h < H; h++) {
                real e = 0;
                for (int c = h * HC; c < (h + 1) * HC; c++) { e += qg[c] * vi[c]; }
                at[(size_t)h * n + i] = ri * e;
            }
        }
        for (int h = 0; h < H; h++) {   // softmax over depth, per head
            real *sh = at + (size_t)h * n, maxv = -INFINITY, sum = 0;
            for (int i = 0; i < n; i++) { if (sh[i] > maxv) { maxv = sh[i]; } }
            for (int i = 0; i < n; i++) { sh[i] = exp(sh[i] - maxv); sum += sh[i]; }
            for (int i = 0; i < n; i++) { sh[i] /= sum; }
        }
        real *o = out + t * C;
        for (int c = 0; c < C; c++) { o[c] = 0; }
        for (int i = 0; i < n; i++) {
            const real *vi = slots + ((size_t)src[i] * N + t) * C;
            for (int h = 0; h < H; h++) {
                real ahi = at[(size_t)h * n + i];
                for (int c = h * HC; c < (h + 1) * HC; c++) { o[c] += ahi * vi[c]; }
            }
        }
    }
    free(qg);
}

// Backward of one site, given dout = G (N, C): adds into the sources' gradients
// dslots (nslots, N, C) and into dq, dgamma (C).
// Positions are processed in fixed blocks of ROUTE_BLOCK; each block sums its
// share of dq/dgamma, and the blocks are added in order at the end, so the
// result is the same for any number of threads.
//
// This is the per-site form: site j walks its sources and adds to each. The
// CUDA trainer computes the same sums in the per-slot (gather) form, which
// writes each source's gradient once instead of once per reading site. Slot k
// is read only by sites j >= k, so when the backward reaches site k every
// reader of slot k has its G_j:
//   site j (route_site_backward):  G_j = dL/dh_j through the next norm, and
//                                  S_j[h] = G_j[h] . out_j[h]  (= sum_i a p)
//   slot k (route_slot_backward):  for each reader j of k, per head h:
//                                  p = G_j[h] . v_k[h], e = qg_j[h] . v_k[h],
//                                  a = exp(r_k e - lse_j[h]), ds = a (p - S_j[h]);
//                                  dv_k += sum_j [ds r_k qg_j - (r_k^3/C)(ds e) v_k + a G_j]
//                                  and keeps ds r_k per (reader, position)
//   q/gamma (route_slot_qgamma,    qv_(j,k)[c] = sum_t ds r_k v_k[c], the per-(site, source)
//    route_param_backward):        share; dq_j = gamma_j sum_k qv_(j,k), dgamma_j = q_j sum_k qv_(j,k)
// The loop below computes these per position t and source i in one pass.
#define ROUTE_BLOCK 32
void route_backward(real *dslots, real *dq, real *dgamma, const real *dout, const real *a,
                    const real *slots, const real *r, const int *src, int n, const real *q,
                    const real *gamma, size_t N, int C, int H) {
    int HC = C / H;
    size_t nblocks = (N + ROUTE_BLOCK - 1) / ROUTE_BLOCK;
    real *qg = (real *)malloc_check(C * sizeof(real));
    real *part = (real *)calloc_check(nblocks * C, sizeof(real));   // per block: sum_{t,i} ds r_i v_i[c]
    for (int c = 0; c < C; c++) { qg[c] = q[c] * gamma[c]; }
    #pragma omp parallel for
    for (size_t blk = 0; blk < nblocks; blk++) {
        real *acc = part + blk * C;
        real *p = (real *)malloc_check(3 * (size_t)H * n * sizeof(real));
        real *e = p + (size_t)H * n, *ds = e + (size_t)H * n;
        size_t tend = (blk + 1) * ROUTE_BLOCK < N ? (blk + 1) * ROUTE_BLOCK : N;
        for (size_t t = blk * ROUTE_BLOCK; t < tend; t++) {
            const real *G = dout + t * C, *at = a + t * H * n;
            // one pass over each source: p[h,i] = G[h] . v_i[h] and e[h,i] = (q gamma)[h] . v_i[h],
            // so that the score is s[h,i] = r_i e[h,i]
            for (int i = 0; i < n; i++) {
                const real *vi = slots + ((size_t)src[i] * N + t) * C;
                for (int h = 0; h < H; h++) {
                    real ph = 0, eh = 0;
                    for (int c = h * HC; c < (h + 1) * HC; c++) { ph += G[c] * vi[c]; eh += qg[c] * vi[c]; }
                    p[h * n + i] = ph;
                    e[h * n + i] = eh;
                }
            }
            // out = sum_i a v_i, a = softmax(s): ds[h,i] = a[h,i] (p[h,i] - sum_k a[h,k] p[h,k])
            for (int h = 0; h < H; h++) {
                real S = 0;
                for (int i = 0; i < n; i++) { S += at[h * n + i] * p[h * n + i]; }
                for (int i = 0; i < n; i++) { ds[h * n + i] = at[h * n + i] * (p[h * n + i] - S); }
            }
            // s[h,i] = r_i sum_c q gamma v_i, r_i = (|v_i|^2/C + eps)^(-1/2). With u_i = ds q gamma:
            //   dv_i += r_i u_i - (r_i^3 / C)(u_i . v_i) v_i + a G,   where u_i . v_i = sum_h ds[h,i] e[h,i]
            //   dq += gamma sum ds r_i v_i,  dgamma += q sum ds r_i v_i   (summed per block in acc)
            for (int i = 0; i < n; i++) {
                const real *vi = slots + ((size_t)src[i] * N + t) * C;
                real *dvi = dslots + ((size_t)src[i] * N + t) * C;
                real ri = r[(size_t)src[i] * N + t], uv = 0;
                for (int h = 0; h < H; h++) { uv += ds[h * n + i] * e[h * n + i]; }
                real k3 = ri * ri * ri / C * uv;
                for (int h = 0; h < H; h++) {
                    real dshi = ds[h * n + i], ahi = at[h * n + i], w = dshi * ri;
                    for (int c = h * HC; c < (h + 1) * HC; c++) {
                        dvi[c] += w * qg[c] - k3 * vi[c] + ahi * G[c];
                        acc[c] += w * vi[c];
                    }
                }
            }
        }
        free(p);
    }
    for (int c = 0; c < C; c++) {
        real total = 0;
        for (size_t blk = 0; blk < nblocks; blk++) { total += part[blk * C + c]; }
        dq[c] += gamma[c] * total;
        dgamma[c] += q[c] * total;
    }
    free(qg);
    free(part);
}

// ----------------------------------------------------------------------------
// Hyper-connections (SPEC section 8), hc mode. Per position the state is n
// streams X_r of width C, stored (N, n, C): a position's n streams are
// adjacent, so one pass over a position reads all of them (the GPU layout too).
//   w_j     = softmax(alpha_j)                       hc_weights
//   h_j     = sum_r w_j[r] X_r                       hc_read (the sublayer's input)
//   X'_r    = sum_s A_j[r,s] X_s + beta_j[r] o_j     hc_update (o_j: the sublayer's output)
//   X_r     = wte[token] at the start (hc_expand); h_final = hc_read with w = 1/n
// Memory: backward needs the streams X before every sublayer (and the final
// ones): n*C values per position per sublayer, (2L+1) n C in all, n times the
// one slot row of std mode (100M, n = 4, C = 512: 8 KiB per position per
// sublayer in fp32, 4 KiB in bf16, against std's 2 KiB / 1 KiB).
// Parameter gradients are sums over positions: each fixed block of HC_BLOCK
// positions sums its share, and the blocks are added in order, so the result
// is the same for any number of threads.
#define HC_BLOCK 32

// w (n) = softmax(alpha (n)): the read weights of one sublayer
void hc_weights_forward(real *w, const real *alpha, int n) {
    real maxv = -INFINITY, sum = 0;
    for (int r = 0; r < n; r++) { if (alpha[r] > maxv) { maxv = alpha[r]; } }
    for (int r = 0; r < n; r++) { w[r] = exp(alpha[r] - maxv); sum += w[r]; }
    for (int r = 0; r < n; r++) { w[r] /= sum; }
}

// dalpha (n) += ..., given dw (n) = dL/dw
void hc_weights_backward(real *dalpha, const real *dw, const real *w, int n) {
    // w = softmax(alpha): dalpha[s] = w[s] (dw[s] - sum_t w[t] dw[t])
    real S = 0;
    for (int t = 0; t < n; t++) { S += w[t] * dw[t]; }
    for (int s = 0; s < n; s++) { dalpha[s] += w[s] * (dw[s] - S); }
}

// X (N, n, C) = n copies of x0 (N, C): the streams' start
void hc_expand_forward(real *X, const real *x0, size_t N, int C, int n) {
    #pragma omp parallel for
    for (size_t t = 0; t < N; t++) {
        for (int r = 0; r < n; r++) { memcpy(X + (t * n + r) * C, x0 + t * C, C * sizeof(real)); }
    }
}

// dx0 (N, C) += sum_r dX_r
void hc_expand_backward(real *dx0, const real *dX, size_t N, int C, int n) {
    // X_r = x0 for every r
    #pragma omp parallel for
    for (size_t t = 0; t < N; t++) {
        for (int r = 0; r < n; r++) {
            const real *d = dX + (t * n + r) * C;
            for (int c = 0; c < C; c++) { dx0[t * C + c] += d[c]; }
        }
    }
}

// out (N, C) = sum_r w[r] X_r;  X (N, n, C), w (n)
void hc_read_forward(real *out, const real *X, const real *w, size_t N, int C, int n) {
    #pragma omp parallel for
    for (size_t t = 0; t < N; t++) {
        real *o = out + t * C;
        for (int c = 0; c < C; c++) { o[c] = 0; }
        for (int r = 0; r < n; r++) {
            const real *x = X + (t * n + r) * C;
            for (int c = 0; c < C; c++) { o[c] += w[r] * x[c]; }
        }
    }
}

// dX (N, n, C) += ...;  dw (n) += sum over positions (dw may be NULL: h_final's fixed weights)
void hc_read_backward(real *dX, real *dw, const real *dout, const real *X, const real *w, size_t N, int C, int n) {
    // out = sum_r w[r] X_r: dX_r += w[r] dout, dw[r] += dout . X_r
    size_t nblocks = (N + HC_BLOCK - 1) / HC_BLOCK;
    real *part = (real *)calloc_check(nblocks * n, sizeof(real));
    #pragma omp parallel for
    for (size_t blk = 0; blk < nblocks; blk++) {
        size_t tend = (blk + 1) * HC_BLOCK < N ? (blk + 1) * HC_BLOCK : N;
        for (size_t t = blk * HC_BLOCK; t < tend; t++) {
            const real *g = dout + t * C;
            for (int r = 0; r < n; r++) {
                const real *x = X + (t * n + r) * C;
                real *dx = dX + (t * n + r) * C, dot = 0;
                for (int c = 0; c < C; c++) { dx[c] += w[r] * g[c]; dot += g[c] * x[c]; }
                part[blk * n + r] += dot;
            }
        }
    }
    for (size_t blk = 0; dw != NULL && blk < nblocks; blk++) {
        for (int r = 0; r < n; r++) { dw[r] += part[blk * n + r]; }
    }
    free(part);
}

// Xn (N, n, C): Xn_r = sum_s A[r,s] X_s + beta[r] o;  X (N, n, C), o (N, C), A (n, n), beta (n)
void hc_update_forward(real *Xn, const real *X, const real *o, const real *A, const real *beta,
                       size_t N, int C, int n) {
    #pragma omp parallel for
    for (size_t t = 0; t < N; t++) {
        const real *ot = o + t * C;
        for (int r = 0; r < n; r++) {
            real *y = Xn + (t * n + r) * C;
            for (int c = 0; c < C; c++) { y[c] = beta[r] * ot[c]; }
            for (int s = 0; s < n; s++) {
                const real *x = X + (t * n + s) * C;
                for (int c = 0; c < C; c++) { y[c] += A[r * n + s] * x[c]; }
            }
        }
    }
}

// dX (N, n, C), dout (N, C) += ...;  dA (n, n), dbeta (n) += sums over positions; given dXn (N, n, C)
void hc_update_backward(real *dX, real *dout, real *dA, real *dbeta, const real *dXn, const real *X,
                        const real *o, const real *A, const real *beta, size_t N, int C, int n) {
    // Xn_r = sum_s A[r,s] X_s + beta[r] o:
    //   dX_s += sum_r A[r,s] dXn_r,  do += sum_r beta[r] dXn_r,
    //   dA[r,s] += dXn_r . X_s,      dbeta[r] += dXn_r . o
    size_t nblocks = (N + HC_BLOCK - 1) / HC_BLOCK, np = (size_t)n * n + n;
    real *part = (real *)calloc_check(nblocks * np, sizeof(real));   // per block: dA (n, n), then dbeta (n)
    #pragma omp parallel for
    for (size_t blk = 0; blk < nblocks; blk++) {
        real *pA = part + blk * np, *pb = pA + (size_t)n * n;
        size_t tend = (blk + 1) * HC_BLOCK < N ? (blk + 1) * HC_BLOCK : N;
        for (size_t t = blk * HC_BLOCK; t < tend; t++) {
            const real *ot = o + t * C;
            real *dot_ = dout + t * C;
            for (int r = 0; r < n; r++) {
                const real *g = dXn + (t * n + r) * C;
                real sb = 0;
                for (int c = 0; c < C; c++) { dot_[c] += beta[r] * g[c]; sb += g[c] * ot[c]; }
                pb[r] += sb;
                for (int s = 0; s < n; s++) {
                    const real *x = X + (t * n + s) * C;
                    real *dx = dX + (t * n + s) * C, sa = 0;
                    for (int c = 0; c < C; c++) { dx[c] += A[r * n + s] * g[c]; sa += g[c] * x[c]; }
                    pA[r * n + s] += sa;
                }
            }
        }
    }
    for (size_t blk = 0; blk < nblocks; blk++) {
        for (int i = 0; i < n * n; i++) { dA[i] += part[blk * np + i]; }
        for (int r = 0; r < n; r++) { dbeta[r] += part[blk * np + (size_t)n * n + r]; }
    }
    free(part);
}

// ----------------------------------------------------------------------------
// Delta AttnRes (SPEC section 9): std's residual stream x_j is kept, and each
// routing site adds a gated routed mix to it,
//   mix_j = route_j([n_j, b_0, b_1 .. b_m]),   h_j = x_j + alpha_j * mix_j
// with the routing above over slots (config.h: slot J = 2L+1 holds the null
// source n_j of the site being routed, broadcast to every position; slot J+k
// the block sum b_k; b_0 = x_0 is slot 0). With alpha_j = 0, h_j = x_j + 0 is
// x_j bit for bit, so a converted std model computes exactly what it did.

// out (N, C) = the null source n (C) at every position, so that route_forward
// reads it like any other source
void null_source_forward(real *out, const real *null, size_t N, int C) {
    #pragma omp parallel for
    for (size_t t = 0; t < N; t++) { memcpy(out + t * C, null, C * sizeof(real)); }
}

// dnull (C) += sum over positions of dout (N, C), the routing's dv of the
// broadcast source. Serial over positions, so the order is fixed.
void null_source_backward(real *dnull, const real *dout, size_t N, int C) {
    // out[t][c] = null[c] for every t
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        real acc = 0;
        for (size_t t = 0; t < N; t++) { acc += dout[t * C + c]; }
        dnull[c] += acc;
    }
}

// h (N*C) = x + alpha * mix: site j's input, from the stream x_j, its routed
// mix and its gate alpha (a scalar)
void delta_gate_forward(real *h, const real *x, const real *mix, real alpha, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { h[i] = x[i] + alpha * mix[i]; }
}

// dx (N*C) += dh;  dmix (N*C) += alpha dh;  *dalpha += sum_i dh[i] mix[i]
// (the sum in fixed chunks added in order: the same bits for any thread count)
#define GATE_CHUNK 4096
void delta_gate_backward(real *dx, real *dmix, real *dalpha, const real *dh, const real *mix, real alpha, size_t n) {
    // h = x + alpha * mix
    size_t nchunks = (n + GATE_CHUNK - 1) / GATE_CHUNK;
    double *part = (double *)calloc_check(nchunks, sizeof(double));
    #pragma omp parallel for
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t end = (ci + 1) * GATE_CHUNK < n ? (ci + 1) * GATE_CHUNK : n;
        double acc = 0;
        for (size_t i = ci * GATE_CHUNK; i < end; i++) {
            dx[i] += dh[i];
            dmix[i] += alpha * dh[i];
            acc += (double)dh[i] * mix[i];
        }
        part[ci] = acc;
    }
    double total = 0;
    for (size_t ci = 0; ci < nchunks; ci++) { total += part[ci]; }
    *dalpha += (real)total;
    free(part);
}

// ----------------------------------------------------------------------------
// Classifier: softmax over the V real logits and cross-entropy with targets.

// probs (N, V) = softmax(logits); losses (N) = -log probs[target]
void crossentropy_forward(real *losses, real *probs, const real *logits, const int *targets, size_t N, int V) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real *x = logits + n * V;
        real *p = probs + n * V, maxv = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++) { if (x[i] > maxv) { maxv = x[i]; } }
        for (int i = 0; i < V; i++) { p[i] = exp(x[i] - maxv); sum += p[i]; }
        for (int i = 0; i < V; i++) { p[i] /= sum; }
        losses[n] = log(sum) - (x[targets[n]] - maxv);   // -log p[target], finite even if p underflows
    }
}

// dlogits (N, V) += (probs - onehot(target)) * dloss, dloss = d objective / d losses[n]
void crossentropy_backward(real *dlogits, const real *probs, const int *targets, real dloss, size_t N, int V) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        for (int i = 0; i < V; i++) {
            dlogits[n * V + i] += (probs[n * V + i] - (i == targets[n])) * dloss;
        }
    }
}

// ----------------------------------------------------------------------------
// The model

// Named views into one allocation, in checkpoint order (config.h's enum).
typedef struct {
    real *wte, *ln1w, *wq, *wk, *wv, *qnw, *knw, *wo, *ln2w, *wg, *wu, *wd, *lnfw, *rq, *rg;
    real *hcalpha, *hca, *hcbeta, *dnull, *dalpha;
} ParamTensors;

static void point_params(ParamTensors *p, real *mem, const size_t sizes[NUM_PARAM_TENSORS]) {
    real **ptrs[NUM_PARAM_TENSORS] = {&p->wte, &p->ln1w, &p->wq, &p->wk, &p->wv, &p->qnw, &p->knw,
                                      &p->wo, &p->ln2w, &p->wg, &p->wu, &p->wd, &p->lnfw, &p->rq, &p->rg,
                                      &p->hcalpha, &p->hca, &p->hcbeta, &p->dnull, &p->dalpha};
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { *ptrs[i] = mem; mem += sizes[i]; }
}

// Forward activations kept for backward, in one allocation. N = B*T positions,
// J = 2L+1 routing sites, NS = num_slots (J, or delta's J + 1 + blocks),
// QD = NH*HD, KVD = NKV*HD, n hc streams.
#define NUM_ACT_TENSORS 25
typedef struct {
    real *slots;    // (NS, N, C) sources v_i / block sums (mhar), residual stream x_j (std, delta),
                    //            then delta's null source and block sums b_k (config.h);
                    //            wte[token] then the sublayer outputs o_j (hc)
    real *hcx;      // (J, N, n, C)  hc streams before sublayer j; [2L] = the final streams (hc)
    real *hc_w;     // (J, n)     hc read weights softmax(alpha_j); [2L] = 1/n (hc)
    real *slot_r;   // (NS, N)    r_i of each slot that is a routing source (mhar, delta)
    real *route_a;  // routing weights: site j at offset pair_off[j]*N*H, shape (N, H, n_j) (mhar, delta)
    real *h;        // (J, N, C)  site inputs h_j, h_final at j = 2L (mhar, hc, delta; std reads slots)
    real *mix;      // (J, N, C)  delta: routed mixes mix_j
    real *ln;       // (J, N, C)  normalised sublayer inputs u_j; [2L] = final norm
    real *ln_rstd;  // (J, N)
    real *qr;       // (L, N, QD)  Wq u, before QK-norm
    real *kr;       // (L, N, KVD)
    real *q;        // (L, N, QD)  after QK-norm and RoPE
    real *k;        // (L, N, KVD)
    real *v;        // (L, N, KVD)
    real *q_rstd;   // (L, N, NH)
    real *k_rstd;   // (L, N, NKV)
    real *att;      // (L, B, NH, T, T)  attention probabilities
    real *atty;     // (L, N, QD)  attention output before Wo
    real *mg;       // (L, N, F)  gate pre-activation Wg u
    real *mu;       // (L, N, F)  up projection Wu u
    real *mh;       // (L, N, F)  silu(mg) * mu
    real *out;      // (N, C)  output of the current sublayer (scratch)
    real *logits;   // (N, V)  the V real rows of the tied head; backward reuses it for dlogits
    real *probs;    // (N, V)  softmax of the logits
    real *losses;   // (N)     cross-entropy of each position
} Acts;

// Backward scratch and gradients of activations, in one allocation.
#define NUM_GRAD_ACT_TENSORS 18
typedef struct {
    real *dslots;   // (NS, N, C)  gradient of every slot, accumulated over all the sites that read it
    real *dhcx;     // (N, n, C)  hc: gradient of the streams at the depth the backward has reached
    real *dhcx2;    // (N, n, C)  hc: the streams' gradient one sublayer down (swapped with dhcx)
    real *dh;       // (N, C)  gradient of the input h_j of the current site
    real *dmix;     // (N, C)  delta: gradient of the current site's routed mix
    real *dsub;     // (N, C)  delta: gradient of the current sublayer's output (stream + block sum)
    real *dln;      // (N, C)  gradient of the normalised input u_j
    real *datty;    // (N, QD)
    real *dq, *dqn, *dqr;   // (N, QD)  grads of q after RoPE, after QK-norm, raw
    real *dk, *dkn, *dkr;   // (N, KVD)
    real *dv;       // (N, KVD)
    real *dmh, *dmg, *dmu;  // (N, F)
} GradActs;

typedef struct {
    Config cfg;
    size_t sizes[NUM_PARAM_TENSORS];
    size_t nparams;
    ParamTensors params, grads;
    real *params_mem, *grads_mem;
    real *adam_m, *adam_v;          // AdamW state, allocated at the first update
    int maxB, maxT;                 // activation buffers fit batches up to maxB x maxT
    Acts acts;
    GradActs gacts;
    real *acts_mem, *gacts_mem;
    real *rope_cos, *rope_sin;      // (T, HD/2)
    size_t *pair_off;               // (J+1) routing pairs before site j
    int *inputs, *targets;          // the current batch (B, T)
    int B, T;                       // shape of the last forward
    float lr_new;                   // delta: learning rate of the new parameters (param_is_new) as a
                                    // multiple of the step's (-lr_new; 1 by default)
    float lr_route;                 // mhar: the routing queries' learning-rate multiple (-lr_route; 1)
    real loss;                      // mean loss of the last forward with targets
    real ce_dloss;                  // the dloss with which the last forward already wrote dlogits over the
                                    // logits; 0: model_backward runs crossentropy_backward
} Model;

// Allocate parameters and gradients and set them to SPEC section 6's
// initialisation. Activations come later, sized for the largest batch.
void model_build(Model *m, const Config *cfg, uint64_t seed, float init_std) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    param_sizes(cfg, m->sizes);
    m->nparams = param_count(cfg);
    m->params_mem = (real *)malloc_check(m->nparams * sizeof(real));
    m->grads_mem = (real *)calloc_check(m->nparams, sizeof(real));
    point_params(&m->params, m->params_mem, m->sizes);
    point_params(&m->grads, m->grads_mem, m->sizes);
    m->lr_new = 1.0f;
    m->lr_route = 1.0f;
    float *init = (float *)malloc_check(m->nparams * sizeof(float));
    params_init(init, cfg, seed, init_std);
    for (size_t i = 0; i < m->nparams; i++) { m->params_mem[i] = init[i]; }
    free(init);
    int half = cfg->HD / 2;
    m->rope_cos = (real *)malloc_check((size_t)cfg->T * half * sizeof(real));
    m->rope_sin = (real *)malloc_check((size_t)cfg->T * half * sizeof(real));
    for (int t = 0; t < cfg->T; t++) {
        for (int i = 0; i < half; i++) {
            double angle = t * pow(10000.0, -2.0 * i / cfg->HD);
            m->rope_cos[t * half + i] = (real)cos(angle);
            m->rope_sin[t * half + i] = (real)sin(angle);
        }
    }
    int J = 2 * cfg->L + 1, src[1024];
    m->pair_off = (size_t *)malloc_check((J + 1) * sizeof(size_t));
    m->pair_off[0] = 0;
    for (int j = 0; j < J; j++) { m->pair_off[j + 1] = m->pair_off[j] + site_sources(cfg, j, src); }
}

// Allocate activations for batches of up to B x T (once).
static void model_alloc_acts(Model *m, int B, int T) {
    const Config *c = &m->cfg;
    size_t N = (size_t)B * T, C = c->C, L = c->L, J = 2 * L + 1, F = c->F, NS = num_slots(c);
    size_t QD = (size_t)c->NH * c->HD, KVD = (size_t)c->NKV * c->HD;
    int mhar = c->mode == RES_MHAR, hc = c->mode == RES_HC, delta = c->mode == RES_DELTA, routed = mhar || delta;
    size_t pairs = routed ? m->pair_off[J] : 0, hn = hc ? (size_t)c->n : 0;
    size_t asz[NUM_ACT_TENSORS] = {
        NS * N * C, J * N * hn * C, J * hn,
        routed ? NS * N : 0, pairs * N * c->H, routed || hc ? J * N * C : 0, delta ? J * N * C : 0, J * N * C, J * N,
        L * N * QD, L * N * KVD, L * N * QD, L * N * KVD, L * N * KVD, L * N * c->NH, L * N * c->NKV,
        L * B * c->NH * T * T, L * N * QD, L * N * F, L * N * F, L * N * F, N * C, N * c->V, N * c->V, N};
    real **aptr[NUM_ACT_TENSORS] = {
        &m->acts.slots, &m->acts.hcx, &m->acts.hc_w, &m->acts.slot_r, &m->acts.route_a, &m->acts.h, &m->acts.mix,
        &m->acts.ln, &m->acts.ln_rstd,
        &m->acts.qr, &m->acts.kr, &m->acts.q, &m->acts.k, &m->acts.v, &m->acts.q_rstd, &m->acts.k_rstd,
        &m->acts.att, &m->acts.atty, &m->acts.mg, &m->acts.mu, &m->acts.mh, &m->acts.out, &m->acts.logits,
        &m->acts.probs, &m->acts.losses};
    size_t total = 0;
    for (int i = 0; i < NUM_ACT_TENSORS; i++) { total += asz[i]; }
    m->acts_mem = (real *)calloc_check(total, sizeof(real));
    real *p = m->acts_mem;
    for (int i = 0; i < NUM_ACT_TENSORS; i++) { *aptr[i] = p; p += asz[i]; }

    size_t gsz[NUM_GRAD_ACT_TENSORS] = {
        NS * N * C, N * hn * C, N * hn * C, N * C, delta ? N * C : 0, delta ? N * C : 0, N * C,
        N * QD, N * QD, N * QD, N * QD, N * KVD, N * KVD, N * KVD, N * KVD,
        N * F, N * F, N * F};
    real **gptr[NUM_GRAD_ACT_TENSORS] = {
        &m->gacts.dslots, &m->gacts.dhcx, &m->gacts.dhcx2, &m->gacts.dh, &m->gacts.dmix, &m->gacts.dsub,
        &m->gacts.dln, &m->gacts.datty, &m->gacts.dq, &m->gacts.dqn,
        &m->gacts.dqr, &m->gacts.dk, &m->gacts.dkn, &m->gacts.dkr, &m->gacts.dv, &m->gacts.dmh,
        &m->gacts.dmg, &m->gacts.dmu};
    total = 0;
    for (int i = 0; i < NUM_GRAD_ACT_TENSORS; i++) { total += gsz[i]; }
    m->gacts_mem = (real *)calloc_check(total, sizeof(real));
    p = m->gacts_mem;
    for (int i = 0; i < NUM_GRAD_ACT_TENSORS; i++) { *gptr[i] = p; p += gsz[i]; }

    m->inputs = (int *)calloc_check(N, sizeof(int));
    m->targets = (int *)calloc_check(N, sizeof(int));
    m->maxB = B; m->maxT = T;
}

// Attention sublayer of block l: out (N, C) = Wo attn(rope(qknorm(Wq u)), ...)
static void attention_sublayer_forward(Model *m, int l, const real *u, real *out, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    ParamTensors *p = &m->params;
    size_t N = (size_t)B * T, C = c->C, HD = c->HD, QD = c->NH * HD, KVD = c->NKV * HD;
    real *qr = a->qr + l * N * QD, *kr = a->kr + l * N * KVD;
    real *q = a->q + l * N * QD, *k = a->k + l * N * KVD, *v = a->v + l * N * KVD;
    real *q_rstd = a->q_rstd + l * N * c->NH, *k_rstd = a->k_rstd + l * N * c->NKV;
    real *att = a->att + l * B * c->NH * T * T, *atty = a->atty + l * N * QD;
    matmul_forward(qr, u, p->wq + l * QD * C, N, C, QD);
    matmul_forward(kr, u, p->wk + l * KVD * C, N, C, KVD);
    matmul_forward(v, u, p->wv + l * KVD * C, N, C, KVD);
    rmsnorm_forward(q, q_rstd, qr, p->qnw + l * HD, N * c->NH, HD);
    rmsnorm_forward(k, k_rstd, kr, p->knw + l * HD, N * c->NKV, HD);
    rope_forward(q, q, m->rope_cos, m->rope_sin, B, T, c->NH, HD);
    rope_forward(k, k, m->rope_cos, m->rope_sin, B, T, c->NKV, HD);
    attention_forward(atty, att, q, k, v, B, T, c->NH, c->NKV, HD);
    matmul_forward(out, atty, p->wo + l * C * QD, N, QD, C);
}

// dln (N, C) += gradient of the input u, given dout; weight grads +=
static void attention_sublayer_backward(Model *m, int l, const real *u, const real *dout, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    ParamTensors *p = &m->params, *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, HD = c->HD, QD = c->NH * HD, KVD = c->NKV * HD;
    real *qr = a->qr + l * N * QD, *kr = a->kr + l * N * KVD;
    real *q = a->q + l * N * QD, *k = a->k + l * N * KVD, *v = a->v + l * N * KVD;
    real *q_rstd = a->q_rstd + l * N * c->NH, *k_rstd = a->k_rstd + l * N * c->NKV;
    real *att = a->att + l * B * c->NH * T * T, *atty = a->atty + l * N * QD;
    memset(g->datty, 0, N * QD * sizeof(real));
    matmul_backward(g->datty, dp->wo + l * C * QD, dout, atty, p->wo + l * C * QD, N, QD, C);
    memset(g->dq, 0, N * QD * sizeof(real));
    memset(g->dk, 0, N * KVD * sizeof(real));
    memset(g->dv, 0, N * KVD * sizeof(real));
    attention_backward(g->dq, g->dk, g->dv, g->datty, att, q, k, v, B, T, c->NH, c->NKV, HD);
    memset(g->dqn, 0, N * QD * sizeof(real));
    memset(g->dkn, 0, N * KVD * sizeof(real));
    rope_backward(g->dqn, g->dq, m->rope_cos, m->rope_sin, B, T, c->NH, HD);
    rope_backward(g->dkn, g->dk, m->rope_cos, m->rope_sin, B, T, c->NKV, HD);
    memset(g->dqr, 0, N * QD * sizeof(real));
    memset(g->dkr, 0, N * KVD * sizeof(real));
    rmsnorm_backward(g->dqr, dp->qnw + l * HD, g->dqn, qr, q_rstd, p->qnw + l * HD, N * c->NH, HD);
    rmsnorm_backward(g->dkr, dp->knw + l * HD, g->dkn, kr, k_rstd, p->knw + l * HD, N * c->NKV, HD);
    matmul_backward(g->dln, dp->wq + l * QD * C, g->dqr, u, p->wq + l * QD * C, N, C, QD);
    matmul_backward(g->dln, dp->wk + l * KVD * C, g->dkr, u, p->wk + l * KVD * C, N, C, KVD);
    matmul_backward(g->dln, dp->wv + l * KVD * C, g->dv, u, p->wv + l * KVD * C, N, C, KVD);
}

// MLP sublayer of block l: out (N, C) = Wd (silu(Wg u) * (Wu u))
static void mlp_sublayer_forward(Model *m, int l, const real *u, real *out, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    ParamTensors *p = &m->params;
    size_t N = (size_t)B * T, C = c->C, F = c->F;
    real *mg = a->mg + l * N * F, *mu = a->mu + l * N * F, *mh = a->mh + l * N * F;
    matmul_forward(mg, u, p->wg + l * F * C, N, C, F);
    matmul_forward(mu, u, p->wu + l * F * C, N, C, F);
    swiglu_forward(mh, mg, mu, N * F);
    matmul_forward(out, mh, p->wd + l * C * F, N, F, C);
}

static void mlp_sublayer_backward(Model *m, int l, const real *u, const real *dout, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    ParamTensors *p = &m->params, *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, F = c->F;
    real *mg = a->mg + l * N * F, *mu = a->mu + l * N * F, *mh = a->mh + l * N * F;
    memset(g->dmh, 0, N * F * sizeof(real));
    matmul_backward(g->dmh, dp->wd + l * C * F, dout, mh, p->wd + l * C * F, N, F, C);
    memset(g->dmg, 0, N * F * sizeof(real));
    memset(g->dmu, 0, N * F * sizeof(real));
    swiglu_backward(g->dmg, g->dmu, g->dmh, mg, mu, N * F);
    matmul_backward(g->dln, dp->wg + l * F * C, g->dmg, u, p->wg + l * F * C, N, C, F);
    matmul_backward(g->dln, dp->wu + l * F * C, g->dmu, u, p->wu + l * F * C, N, C, F);
}

#define SLOT(j) (a->slots + (size_t)(j) * N * C)
#define DSLOT(j) (m->gacts.dslots + (size_t)(j) * N * C)
#define HCX(j) (a->hcx + (size_t)(j) * N * c->n * C)

// delta: write site j's null source n_j into slot J (config.h), with its r
static void delta_null_slot(Model *m, int j, size_t N) {
    Acts *a = &m->acts;
    size_t C = m->cfg.C, J = 2 * (size_t)m->cfg.L + 1;
    null_source_forward(SLOT(J), m->params.dnull + j * C, N, (int)C);
    source_stat_forward(a->slot_r + J * N, SLOT(J), N, (int)C);
}

// The input of sublayer j (j = 2L: of the final norm). std: the residual
// stream x_j = slot j. mhar: route_j over the slots of site j's sources.
// delta: x_j + alpha_j * route_j([n_j, b_0, b_1 .. b_m]).
// hc: the read of the streams before sublayer j with w_j = softmax(alpha_j);
// the final read takes the mean, w = 1/n.
static real *site_forward(Model *m, int j, size_t N) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    size_t C = c->C;
    if (c->mode == RES_STD) { return SLOT(j); }
    if (c->mode == RES_HC) {
        real *w = a->hc_w + (size_t)j * c->n, *hj = a->h + (size_t)j * N * C;
        if (j < 2 * c->L) { hc_weights_forward(w, m->params.hcalpha + (size_t)j * c->n, c->n); }
        else { for (int r = 0; r < c->n; r++) { w[r] = (real)1 / c->n; } }
        hc_read_forward(hj, HCX(j), w, N, c->C, c->n);
        return hj;
    }
    int src[1024];
    int n = site_sources(c, j, src);
    real *hj = a->h + (size_t)j * N * C;
    real *mix = c->mode == RES_DELTA ? a->mix + (size_t)j * N * C : hj;   // mhar: the mix is h_j
    if (c->mode == RES_DELTA) { delta_null_slot(m, j, N); }
    route_forward(mix, a->route_a + m->pair_off[j] * N * c->H, a->slots, a->slot_r, src, n,
                  m->params.rq + j * C, m->params.rg + j * C, N, c->C, c->H);
    if (c->mode == RES_DELTA) { delta_gate_forward(hj, SLOT(j), mix, m->params.dalpha[j], N * C); }
    return hj;
}

// Where the norm backward of site j adds the gradient of its input: straight
// into dslot j (std), or into the scratch dh, cleared, for site_backward (mhar
// and delta: route_backward; hc: hc_read_backward).
static real *site_dinput(Model *m, int j, size_t N) {
    size_t C = m->cfg.C;
    if (m->cfg.mode == RES_STD) { return DSLOT(j); }
    memset(m->gacts.dh, 0, N * C * sizeof(real));
    return m->gacts.dh;
}

// Backward of site_forward, given dh_j in the scratch dh: into the slots'
// gradients and the site's parameters.
static void site_backward(Model *m, int j, size_t N) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    size_t C = c->C;
    if (c->mode == RES_STD) { return; }
    if (c->mode == RES_HC) {   // into the streams' gradient dhcx; the final read's weights are fixed
        int n = c->n, last = j == 2 * c->L;
        real *w = a->hc_w + (size_t)j * n, dw[64] = {0};
        hc_read_backward(m->gacts.dhcx, last ? NULL : dw, m->gacts.dh, HCX(j), w, N, c->C, n);
        if (!last) { hc_weights_backward(m->grads.hcalpha + (size_t)j * n, dw, w, n); }
        return;
    }
    int src[1024];
    int n = site_sources(c, j, src);
    real *dmix = g->dh;   // mhar: h_j is the mix
    size_t J = 2 * (size_t)c->L + 1;
    if (c->mode == RES_DELTA) {
        // h_j = x_j + alpha_j * mix_j: dx_j += dh_j into dslot j, where std's norm backward adds it
        dmix = g->dmix;
        memset(dmix, 0, N * C * sizeof(real));
        delta_gate_backward(DSLOT(j), dmix, m->grads.dalpha + j, g->dh, a->mix + (size_t)j * N * C,
                            m->params.dalpha[j], N * C);
        delta_null_slot(m, j, N);   // slot J holds the null of the last site the forward routed
        memset(DSLOT(J), 0, N * C * sizeof(real));
    }
    // mix_j = route_j(sources)
    route_backward(g->dslots, m->grads.rq + j * C, m->grads.rg + j * C, dmix,
                   a->route_a + m->pair_off[j] * N * c->H, a->slots, a->slot_r, src, n,
                   m->params.rq + j * C, m->params.rg + j * C, N, c->C, c->H);
    // slot J = n_j broadcast to every position
    if (c->mode == RES_DELTA) { null_source_backward(m->grads.dnull + j * C, DSLOT(J), N, (int)C); }
}

// Forward pass on inputs (B, T). With targets, also the softmax, the per-position
// losses and their mean in m->loss; without, it stops at the logits (sampling).
// dloss: 0 when no backward follows (evaluation, sampling) or when the caller
// wants the logits; else the dloss of the model_backward that comes next. Then
// the cross-entropy's backward runs here, right after its forward, and the
// logits buffer holds dlogits afterwards; model_backward skips that step. The
// arithmetic is the same either way; train_mhar.cu fuses the two into one
// kernel (one pass over the logits), and this mirrors its contract.
void model_forward(Model *m, const int *inputs, const int *targets, int B, int T, real dloss) {
    const Config *c = &m->cfg;
    if (m->acts_mem == NULL) { model_alloc_acts(m, B, T); }
    if (B > m->maxB || T > m->maxT || T > c->T) {
        die("batch %dx%d exceeds the %dx%d the activations were sized for", B, T, m->maxB, m->maxT);
    }
    m->B = B; m->T = T;
    m->ce_dloss = 0;
    Acts *a = &m->acts;
    ParamTensors *p = &m->params;
    size_t N = (size_t)B * T, C = c->C, L = c->L, J = 2 * L + 1, S = c->S;
    int mhar = c->mode == RES_MHAR, hc = c->mode == RES_HC, delta = c->mode == RES_DELTA;
    size_t hn = (size_t)c->n;
    memcpy(m->inputs, inputs, N * sizeof(int));
    encoder_forward(SLOT(0), inputs, p->wte, N, c->C);
    if (mhar || delta) { source_stat_forward(a->slot_r, SLOT(0), N, c->C); }   // v_0 = b_0 = x_0
    if (hc) { hc_expand_forward(HCX(0), SLOT(0), N, c->C, c->n); }
    for (size_t j = 0; j < 2 * L; j++) {
        size_t l = j / 2;
        real *hj = site_forward(m, (int)j, N);
        real *u = a->ln + j * N * C;
        rmsnorm_forward(u, a->ln_rstd + j * N, hj, (j % 2 == 0 ? p->ln1w : p->ln2w) + l * C, N, c->C);
        if (j % 2 == 0) { attention_sublayer_forward(m, (int)l, u, a->out, B, T); }
        else { mlp_sublayer_forward(m, (int)l, u, a->out, B, T); }
        // slot j+1 = output of sublayer j, plus slot j when they chain (config.h)
        residual_forward(SLOT(j + 1), a->out, slot_chains(c, (int)j) ? SLOT(j) : NULL, N * C);
        if (mhar) { source_stat_forward(a->slot_r + (j + 1) * N, SLOT(j + 1), N, c->C); }
        // hc: slot j+1 is o_j alone (nothing chains); the streams take it in
        if (hc) {
            hc_update_forward(HCX(j + 1), HCX(j), SLOT(j + 1), p->hca + j * hn * hn, p->hcbeta + j * hn, N, c->C, c->n);
        }
        // delta: b_k (k = the block of sublayer j) as the running sum of its outputs. SPEC writes
        // b_k = x_{kS} - x_{(k-1)S}, the same in exact arithmetic; the sum is exact where the
        // difference of two large stream values cancels, and it is what block mode computes.
        size_t k = delta ? j / S + 1 : 0;
        if (delta && k <= (size_t)delta_blocks(c)) {
            real *bk = SLOT(J + k);
            residual_forward(bk, a->out, j % S != 0 ? bk : NULL, N * C);
            if (j % S == S - 1) { source_stat_forward(a->slot_r + (J + k) * N, bk, N, c->C); }
        }
    }
    real *hf = site_forward(m, (int)(2 * L), N);
    real *uf = a->ln + 2 * L * N * C;
    rmsnorm_forward(uf, a->ln_rstd + 2 * L * N, hf, p->lnfw, N, c->C);
    matmul_forward(a->logits, uf, p->wte, N, c->C, c->V);   // tied head: the V real rows of wte
    if (targets == NULL) { return; }
    memcpy(m->targets, targets, N * sizeof(int));
    crossentropy_forward(a->losses, a->probs, a->logits, targets, N, c->V);
    if (dloss != 0) {   // model_backward's first step: dlogits over the logits
        memset(a->logits, 0, N * c->V * sizeof(real));
        crossentropy_backward(a->logits, a->probs, targets, dloss, N, c->V);
        m->ce_dloss = dloss;
    }
    double sum = 0;
    for (size_t n = 0; n < N; n++) { sum += a->losses[n]; }
    m->loss = (real)(sum / N);
}

void model_zero_grad(Model *m) { memset(m->grads_mem, 0, m->nparams * sizeof(real)); }

// Backward pass of the last forward; adds into m->grads. dloss scales each
// position's loss: 1/(B*T) for the mean, divided again by the number of
// accumulated micro-batches. The logits buffer is reused for dlogits (already
// written by the forward when it was given this dloss: m->ce_dloss).
void model_backward(Model *m, real dloss) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    ParamTensors *p = &m->params, *dp = &m->grads;
    int B = m->B, T = m->T;
    size_t N = (size_t)B * T, C = c->C, L = c->L, J = 2 * L + 1, S = c->S, hn = (size_t)c->n;
    int hc = c->mode == RES_HC;
    memset(g->dslots, 0, (size_t)num_slots(c) * N * C * sizeof(real));
    if (hc) { memset(g->dhcx, 0, N * hn * C * sizeof(real)); }
    // losses = crossentropy(softmax(logits)); logits = uf . wte[:V]^T
    real *dlogits = a->logits;   // the logits are spent: reuse their buffer
    if (m->ce_dloss == 0) {
        memset(dlogits, 0, N * c->V * sizeof(real));
        crossentropy_backward(dlogits, a->probs, m->targets, dloss, N, c->V);
    } else if (m->ce_dloss != dloss) {
        die("internal: model_backward with dloss %g after a forward given dloss %g", (double)dloss, (double)m->ce_dloss);
    }
    m->ce_dloss = 0;
    real *uf = a->ln + 2 * L * N * C;
    memset(g->dln, 0, N * C * sizeof(real));
    matmul_backward(g->dln, dp->wte, dlogits, uf, p->wte, N, c->C, c->V);
    // uf = rmsnorm(h_final; lnfw)
    real *hf = c->mode == RES_STD ? SLOT(2 * L) : a->h + 2 * L * N * C;   // (hc: site_backward fills dhcx)
    real *dhf = site_dinput(m, (int)(2 * L), N);
    rmsnorm_backward(dhf, dp->lnfw, g->dln, hf, a->ln_rstd + 2 * L * N, p->lnfw, N, c->C);
    site_backward(m, (int)(2 * L), N);
    for (long jj = 2 * (long)L - 1; jj >= 0; jj--) {
        size_t j = (size_t)jj, l = j / 2;
        // slot j+1 = out_j (+ slot j): every later site has added into dslot j+1 by now
        real *dout = DSLOT(j + 1);
        if (hc) {   // streams after sublayer j = A_j X + beta_j o_j: dhcx holds their gradient
            memset(g->dhcx2, 0, N * hn * C * sizeof(real));
            hc_update_backward(g->dhcx2, dout, dp->hca + j * hn * hn, dp->hcbeta + j * hn, g->dhcx, HCX(j),
                               SLOT(j + 1), p->hca + j * hn * hn, p->hcbeta + j * hn, N, c->C, c->n);
            real *t = g->dhcx; g->dhcx = g->dhcx2; g->dhcx2 = t;   // now the gradient of the streams before j
        }
        if (slot_chains(c, (int)j)) {
            real *dprev = DSLOT(j);
            for (size_t i = 0; i < N * C; i++) { dprev[i] += dout[i]; }
        }
        // delta: out_j is also a term of its block's sum b_k (when the block is complete, a source):
        // its gradient is dx_{j+1} + db_k (every site reading b_k has added into dslot J+k by now)
        size_t k = c->mode == RES_DELTA ? j / S + 1 : 0;
        if (c->mode == RES_DELTA && k <= (size_t)delta_blocks(c)) {
            residual_forward(g->dsub, dout, DSLOT(J + k), N * C);
            dout = g->dsub;
        }
        real *u = a->ln + j * N * C;
        memset(g->dln, 0, N * C * sizeof(real));
        if (j % 2 == 0) { attention_sublayer_backward(m, (int)l, u, dout, B, T); }
        else { mlp_sublayer_backward(m, (int)l, u, dout, B, T); }
        // u = rmsnorm(h_j; g_j)
        real *hj = c->mode == RES_STD ? SLOT(j) : a->h + j * N * C;
        real *dhj = site_dinput(m, (int)j, N);
        real *w = (j % 2 == 0 ? p->ln1w : p->ln2w) + l * C, *dw = (j % 2 == 0 ? dp->ln1w : dp->ln2w) + l * C;
        rmsnorm_backward(dhj, dw, g->dln, hj, a->ln_rstd + j * N, w, N, c->C);
        site_backward(m, (int)j, N);
    }
    // hc: the streams start as copies of slot 0
    if (hc) { hc_expand_backward(DSLOT(0), g->dhcx, N, c->C, c->n); }
    // slot 0 = wte[inputs]
    encoder_backward(dp->wte, DSLOT(0), m->inputs, N, c->C);
}

#undef SLOT
#undef DSLOT
#undef HCX


// ----------------------------------------------------------------------------
// Optimisation: global gradient norm, AdamW, learning-rate schedule

// L2 norm of all gradients. Fixed chunks summed in order: the same bits for
// any number of threads.
double grad_norm(const Model *m) {
    const size_t chunk = 1 << 16;
    size_t nchunks = (m->nparams + chunk - 1) / chunk;
    double *part = (double *)calloc_check(nchunks, sizeof(double));
    #pragma omp parallel for
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t end = (ci + 1) * chunk < m->nparams ? (ci + 1) * chunk : m->nparams;
        double s = 0;
        for (size_t i = ci * chunk; i < end; i++) { s += (double)m->grads_mem[i] * m->grads_mem[i]; }
        part[ci] = s;
    }
    double total = 0;
    for (size_t ci = 0; ci < nchunks; ci++) { total += part[ci]; }
    free(part);
    return sqrt(total);
}

// One AdamW step (decoupled weight decay on the matrices only, config.h) with
// the gradients multiplied by gscale (gradient clipping). t counts steps from 1.
void adamw_update(Model *m, float lr, float beta1, float beta2, float eps, float wd, float gscale, int t) {
    if (m->adam_m == NULL) {
        m->adam_m = (real *)calloc_check(m->nparams, sizeof(real));
        m->adam_v = (real *)calloc_check(m->nparams, sizeof(real));
    }
    real bc1 = 1 - pow((real)beta1, (real)t), bc2 = 1 - pow((real)beta2, (real)t);
    size_t off = 0;
    for (int ti = 0; ti < NUM_PARAM_TENSORS; ti++) {
        real decay = param_is_decayed(ti) ? wd : 0;
        real lrt = lr * param_lr_scale(&m->cfg, ti, m->lr_new, m->lr_route);   // -lr_new, -lr_route
        #pragma omp parallel for
        for (size_t i = off; i < off + m->sizes[ti]; i++) {
            real g = m->grads_mem[i] * gscale;
            real mi = beta1 * m->adam_m[i] + (1 - beta1) * g;
            real vi = beta2 * m->adam_v[i] + (1 - beta2) * g * g;
            m->adam_m[i] = mi;
            m->adam_v[i] = vi;
            real update = (mi / bc1) / (sqrt(vi / bc2) + eps) + decay * m->params_mem[i];
            m->params_mem[i] -= lrt * update;
        }
        off += m->sizes[ti];
    }
}

// ----------------------------------------------------------------------------
// Checkpoints (format in common/checkpoint.h). Tensors are stored as float32
// whatever `real` is here.

static void write_reals(FILE *f, const void *xv, size_t n, int elem, const char *path) {
    const real *x = (const real *)xv;
    if ((size_t)elem == sizeof(real)) { fwrite_check(x, sizeof(real), n, f, path); return; }
    const size_t chunk = 1 << 16;
    void *buf = malloc_check(chunk * 8);
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        for (size_t j = 0; j < k; j++) {
            if (elem == 4) { ((float *)buf)[j] = (float)x[i + j]; } else { ((double *)buf)[j] = (double)x[i + j]; }
        }
        fwrite_check(buf, elem, k, f, path);
    }
    free(buf);
}

static void read_reals(FILE *f, void *xv, size_t n, int elem, const char *path) {
    real *x = (real *)xv;
    if ((size_t)elem == sizeof(real)) { fread_check(x, sizeof(real), n, f, path); return; }
    const size_t chunk = 1 << 16;
    void *buf = malloc_check(chunk * 8);
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        fread_check(buf, elem, k, f, path);
        for (size_t j = 0; j < k; j++) {
            x[i + j] = elem == 4 ? (real)((float *)buf)[j] : (real)((double *)buf)[j];
        }
    }
    free(buf);
}

static void *alloc_reals(size_t n) { return calloc_check(n, sizeof(real)); }

// Save parameters (content CKPT_PARAMS), parameters + AdamW state (CKPT_TRAIN),
// or the gradients (CKPT_GRADS), via path.tmp and a rename.
void model_save(const Model *m, const char *path, CkptInfo info) {
    ckpt_save(path, &m->cfg, info, m->nparams, info.content == CKPT_GRADS ? m->grads_mem : m->params_mem,
              m->adam_m, m->adam_v, write_reals);
}

// Load a checkpoint into a model built with the same config (dies on any
// mismatch). Loads AdamW state too when the file has it.
void model_load(Model *m, const char *path, CkptInfo *info) {
    ckpt_load(path, &m->cfg, info, m->nparams, m->params_mem, (void **)&m->adam_m, (void **)&m->adam_v,
              read_reals, alloc_reals);
}

void model_free(Model *m) {
    free(m->params_mem); free(m->grads_mem); free(m->adam_m); free(m->adam_v);
    free(m->acts_mem); free(m->gacts_mem);
    free(m->rope_cos); free(m->rope_sin); free(m->pair_off); free(m->inputs); free(m->targets);
}

#ifdef TESTING
// Move every parameter away from its initialisation (used by test_mhar.c and
// dev/mhar_grads.c), so that gradient checks exercise every path: matrices
// N(0, 0.3^2), norm weights and gammas 1 + N(0, 0.2^2), routing queries N(0, 1);
// hc: alpha N(0, 1), A = I + N(0, 0.3^2), beta = e_0 + N(0, 0.3^2).
void model_randomize(Model *m, uint64_t seed) {
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 7;
    real *p = m->params_mem;
    for (int ti = 0; ti < NUM_PARAM_TENSORS; ti++) {
        for (size_t i = 0; i < m->sizes[ti]; i++) {
            double z = rng_normal(&rng);
            if (ti == P_RQ || ti == P_HCALPHA) { p[i] = (real)z; }
            else if (ti == P_HCA) { p[i] = (real)((i / m->cfg.n % m->cfg.n == i % m->cfg.n ? 1 : 0) + 0.3 * z); }
            else if (ti == P_HCBETA) { p[i] = (real)((i % m->cfg.n == 0 ? 1 : 0) + 0.3 * z); }
            else if (ti == P_LN1W || ti == P_LN2W || ti == P_QNW || ti == P_KNW || ti == P_LNFW || ti == P_RG) {
                p[i] = (real)(1 + 0.2 * z);
            } else { p[i] = (real)(0.3 * z); }
        }
        p += m->sizes[ti];
    }
}
#endif

// ----------------------------------------------------------------------------
// Training loop: common/train_loop.h (shared with train_mhar.cu), with the CPU's hooks

static void device_init(char *desc, size_t n) {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    snprintf(desc, n, "CPU, %d threads", threads);
}

static void device_sync(void) {}

static void device_finish(char *desc, size_t n) { snprintf(desc, n, "%s", ""); }

// row t of the last forward's logits, as float
static void model_logits_row(Model *m, int t, float *out) {
    const real *row = m->acts.logits + (size_t)t * m->cfg.V;
    for (int i = 0; i < m->cfg.V; i++) { out[i] = (float)row[i]; }
}

#include "common/train_loop.h"

#ifndef TESTING
int main(int argc, char **argv) { return train_main(argc, argv); }
#endif
