/*
dev/cuda/attention.cu: kernel lab for causal GQA attention (issue 5, "CUDA
trainer speed"), forward and backward, developed here before anything moves
into train_mhar.cu.

Build (no cuDNN, CUTLASS or cuBLAS; no -lcuda: v5 takes cuTensorMapEncodeTiled from the runtime):
    nvcc -O3 -arch=sm_90a -o attention dev/cuda/attention.cu
Run:
    ./attention --cpu-selftest               CPU reference only, needs no GPU
    ./attention --version N --check          validate version N against the CPU reference
    ./attention --version N --bench          time version N at the preset shapes
    ./attention --version 2,3,5 --bench      several versions side by side (one table)
    ./attention --all [--check] [--bench]    every version (both modes when neither is named)
  options: --shape B,T,NH,NKV,HD (check and bench this shape only), --reps N, --seed S,
           --variant K[,K..] (v4's variants, 0-9; ablations 1, 2, 8, 9 are skipped by --check;
                              v5's, 0-5; v6's, 0-2)
    ./attention --bench-list 2,4.0,4.5 [--shape ..] [--reps N] [--rounds R]
    ./attention --bench-list 5.2,5.4 [--shape ..] [--reps N] [--rounds R]
                                             forward and backward of several (version.variant) on one
                                             input set, in turns (tables: backward vs v2, forward vs the first)

The op (SPEC section 3; CPU: attention_forward/attention_backward in train_mhar.c):
  q (B, T, NH, HD), k, v (B, T, NKV, HD), out (B, T, NH, HD), row-major, bf16;
  query head h reads kv head h / (NH/NKV); scores scaled by 1/sqrt(HD); causal;
  lse (B, NH, T) fp32 = natural log-sum-exp of each row's scaled scores, kept
  for the backward pass, which recomputes p = exp(s*scale - lse) and takes
  D = rowsum(dout * out) (B, NH, T) fp32. All accumulation in fp32.

Versions (NOTES_attention.md has the design, the two floors and predictions):
  v1  one warp per row, fp32 CUDA cores, online softmax; the simple, correct one.
  v2  flash-style on tensor cores (mma.sync m16n8k16 bf16 -> fp32, ldmatrix,
      cp.async double buffering): forward with 64 query rows per block of 4
      warps; backward = prep (D) + dk/dv pass over q tiles (one block owns a kv
      tile of one kv head, across all the query heads of its group) + dq pass
      over kv tiles (one block owns a q tile). No floating-point atomics: every
      output element is written by exactly one thread, in a fixed order, so
      the results are bit-reproducible.
  v3  v2's kernels with 8 warps per block (128 rows): each K/V (or Q/dO) tile
      staged in shared memory serves twice as many rows.
  v4  v3's forward and ONE fused backward kernel (after prep): a block owns a kv
      tile and computes S, P, dP, dS once per (q tile, head) for dK, dV and the
      dQ contribution dS K (5 matmuls instead of 7), which it adds to an fp32 dQ
      in global memory in a fixed order (per-(b, h, q tile) turn counters):
      deterministic, no floating-point atomics. HD = 64 only; any T.
      Variants 3-7 ("lite"): the same kernel with red.add, per-warp turns and cheap releases,
      heavy-first tickets, lockstep visits, L2-local ticket batches; 1, 2, 8, 9: timing-only
      ablations (NOTES_attention.md, "v4 variants").
  v5  the forward on Hopper's own instructions (sm_90a only): wgmma.mma_async (S = Q K^T with
      both operands in shared memory, O += P V with P from registers), Q/K/V tiles by TMA in
      the 128-byte swizzle, an mbarrier ring of K/V stages filled by a producer warp for two
      consumer warpgroups (128 query rows a block). Variant 0 overlaps each softmax with the
      next S and the previous P V on the tensor cores; variant 1 runs them in turn; variant 2 is
      1 without the producer warp (thread 0 refills the ring), two blocks per SM; variant 3 is 0
      with the two warpgroups taking turns to issue (named barriers, ping-pong); variant 4 is 2's
      block (no producer warp) with an overlap inside each warpgroup: S_{j+1} and P_{j-1} V_{j-1}
      in flight while the softmax of S_j runs (two S accumulators, kv tiles of 64, 4 stages, one
      block per SM by registers; v5_overlap_order); variant 5 is 2's block with FlashAttention-3's
      order (one S accumulator: P_{j-1} V_{j-1} in flight during the softmax of S_j; kv tiles of
      64, two blocks per SM at HD 64; v5_fa3_order). --cpu-selftest runs both orders on a host
      model of the block. ptxas serialises the wgmmas of variants 0 and 3 (warning C7514), not
      those of 4 and 5. Same out and lse layouts as v2; the backward is v2's (v1's where
      T % 128 != 0). --check also compares out and lse with v2's (v1's where T % 128 != 0).
      Variants 2, 4 and 5 take any T (3D tensor maps: rows past T zero-filled by TMA, never
      stored); 2 is the trainer's forward.
  v6  the backward on wgmma + TMA (sm_90a only), v2's deterministic split: prep, a dk/dv pass
      (a warpgroup owns 64 keys: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q) and a dq
      pass (a warpgroup owns 64 query rows: S, dP, dQ += dS K), P and dS as register A operands,
      tiles by TMA into an mbarrier ring filled by thread 0. Variant 0: two warpgroups a block;
      1: one; 2: 0 with the next step's S, dP issued behind the current accumulation. Same dq, dk,
      dv as v2 (forward: v5.0, v5.2 where T % 128 != 0); --check also compares them with v2's backward
      on the same inputs (v1's where T % 128 != 0). Variant 1 takes any T (3D tensor maps as v5.2's);
      it is the trainer's backward (with dq, dk in fp32 there).
Limits of v2/v3/v5/v6: HD in {64, 128}, T a multiple of 128 (v5 variants 2, 4, 5, v6 variant 1: any T), NH
a multiple of NKV; v5, v6 need sm_90.

STATUS (H200, 2026-11-29; dev/results/lab/attention_h200_2026-11-29.txt, attention_v4_h200_2026-11-29.txt):
v1-v3 and v4 with variants 3-7 pass --check, repeats bit-identical; racecheck of v4 0 hazards.
Backward at 16,2048,8,4,64: v2 0.957 ms; v4 1.494; best lite (4.4) 1.109; ablations: v4 without
turns 1.222, lite without order (racy red) 0.807, without dQ 0.593 (v4) / 0.531 (lite). Ordering
the dQ adds costs ~0.35 ms over racy adds, the dQ traffic itself ~0.28 ms: no deterministic fused
variant beats v2's 7-matmul split, and the trainer keeps v2 (v3's forward at HD=64).
*/
#include <cuda.h>          // CUtensorMap and its enums (types only: no -lcuda)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <vector>
#include <algorithm>
#include <type_traits>

typedef __nv_bfloat16 bf16;

#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)
static void cuda_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e), file, line, what);
        exit(1);
    }
}
// after every launch: the launch error now; with sync_launches, the execution error too
static bool sync_launches = false;
static void launch_check(const char *name) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && sync_launches) { e = cudaDeviceSynchronize(); }
    if (e != cudaSuccess) { fprintf(stderr, "CUDA error after %s: %s\n", name, cudaGetErrorString(e)); exit(1); }
}

struct Shape { int B, T, NH, NKV, HD; };

// ----------------------------------------------------------------------------
// host helpers: bf16 rounding (round to nearest even), random numbers

static inline uint16_t f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return 0x7fc0; }   // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

static uint64_t rng_state = 1;
static inline uint64_t rng_u64() {   // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double rng_uniform() { return ((rng_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static inline double rng_normal() { return sqrt(-2 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform()); }

// n bf16 values ~ N(0, sd^2): bits for the GPU, the same values as double for the CPU
static void random_bf16(std::vector<uint16_t> &bits, std::vector<double> &vals, size_t n, double sd) {
    bits.resize(n); vals.resize(n);
    for (size_t i = 0; i < n; i++) { bits[i] = f2bf((float)(sd * rng_normal())); vals[i] = bf2f(bits[i]); }
}

// ----------------------------------------------------------------------------
// CPU reference, fp64. Same definition as train_mhar.c, organised per row with
// the lse so that the GPU versions' saved statistic is checked too.

// out (B, T, NH, HD), lse (B, NH, T) natural log-sum-exp of the scaled scores
static void cpu_attention_forward(double *out, double *lse, const double *q, const double *k, const double *v,
                                  Shape s) {
    const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HD = s.HD, G = NH / NKV;
    const double scale = 1.0 / sqrt((double)HD);
    std::vector<double> p(T);
    for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
    for (int h = 0; h < NH; h++) {
        const double *qt = q + (((size_t)b * T + t) * NH + h) * HD;
        const int kvh = h / G;
        double mx = -INFINITY;
        for (int j = 0; j <= t; j++) {
            const double *kj = k + (((size_t)b * T + j) * NKV + kvh) * HD;
            double dot = 0;
            for (int d = 0; d < HD; d++) { dot += qt[d] * kj[d]; }
            p[j] = dot * scale;
            mx = fmax(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
        double *o = out + (((size_t)b * T + t) * NH + h) * HD;
        for (int d = 0; d < HD; d++) { o[d] = 0; }
        for (int j = 0; j <= t; j++) {
            const double *vj = v + (((size_t)b * T + j) * NKV + kvh) * HD;
            for (int d = 0; d < HD; d++) { o[d] += p[j] / sum * vj[d]; }
        }
        lse[((size_t)b * NH + h) * T + t] = mx + log(sum);
    }
}

// dq (B, T, NH, HD), dk, dv (B, T, NKV, HD) = gradients of sum(out * dout); overwritten
static void cpu_attention_backward(double *dq, double *dk, double *dv, const double *dout, const double *q,
                                   const double *k, const double *v, const double *lse, Shape s) {
    const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HD = s.HD, G = NH / NKV;
    const double scale = 1.0 / sqrt((double)HD);
    memset(dq, 0, sizeof(double) * (size_t)B * T * NH * HD);
    memset(dk, 0, sizeof(double) * (size_t)B * T * NKV * HD);
    memset(dv, 0, sizeof(double) * (size_t)B * T * NKV * HD);
    std::vector<double> p(T), dp(T);
    for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
    for (int h = 0; h < NH; h++) {
        const size_t qo = (((size_t)b * T + t) * NH + h) * HD;
        const double *qt = q + qo, *g = dout + qo;
        const int kvh = h / G;
        const double L = lse[((size_t)b * NH + h) * T + t];
        double D = 0;   // D = sum_j p_j dp_j = dout . out
        for (int j = 0; j <= t; j++) {
            const size_t ko = (((size_t)b * T + j) * NKV + kvh) * HD;
            double dot = 0, dd = 0;
            for (int d = 0; d < HD; d++) { dot += qt[d] * k[ko + d]; dd += g[d] * v[ko + d]; }
            p[j] = exp(dot * scale - L);
            dp[j] = dd;
            D += p[j] * dd;
        }
        for (int j = 0; j <= t; j++) {
            const size_t ko = (((size_t)b * T + j) * NKV + kvh) * HD;
            const double ds = p[j] * (dp[j] - D) * scale;   // d(score before scaling)
            for (int d = 0; d < HD; d++) {
                dq[qo + d] += ds * k[ko + d];
                dk[ko + d] += ds * qt[d];
                dv[ko + d] += p[j] * g[d];
            }
        }
    }
}

// ----------------------------------------------------------------------------
// CPU self-test (no GPU): the reference forward against a naive definition that
// materialises the masked (T, T) score matrix, the backward against central
// finite differences of L = sum(out * W), and what bf16 output rounding alone
// costs in relative error (the floor under the GPU tolerance).

static double rel_l2(const double *a, const double *r, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { num += (a[i] - r[i]) * (a[i] - r[i]); den += r[i] * r[i]; }
    return sqrt(num / den);
}

static void naive_forward(double *out, double *lse, const double *q, const double *k, const double *v, Shape s) {
    const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HD = s.HD;
    std::vector<double> S((size_t)T * T);
    for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
        const int kvh = h * NKV / NH;   // same group map as h / (NH/NKV) when NKV divides NH
        for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) {
            double dot = 0;
            for (int d = 0; d < HD; d++) {
                dot += q[(((size_t)b * T + i) * NH + h) * HD + d] * k[(((size_t)b * T + j) * NKV + kvh) * HD + d];
            }
            S[(size_t)i * T + j] = j <= i ? dot / sqrt((double)HD) : -INFINITY;
        }
        for (int i = 0; i < T; i++) {
            double z = 0;
            for (int j = 0; j < T; j++) { z += exp(S[(size_t)i * T + j]); }   // exp(-inf) = 0
            lse[((size_t)b * NH + h) * T + i] = log(z);
            for (int d = 0; d < HD; d++) {
                double acc = 0;
                for (int j = 0; j < T; j++) {
                    acc += exp(S[(size_t)i * T + j]) / z * v[(((size_t)b * T + j) * NKV + kvh) * HD + d];
                }
                out[(((size_t)b * T + i) * NH + h) * HD + d] = acc;
            }
        }
    }
}

static int fragment_selftest();
static int v5_selftest();
static int v6_selftest();

static int cpu_selftest() {
    int fails = fragment_selftest() + v5_selftest() + v6_selftest();
    // bf16 rounding: exact values, ties to even, NaN
    struct { float f; uint16_t h; } cases[] = {{1.0f, 0x3f80}, {-2.5f, 0xc020}, {1.00390625f, 0x3f80},
                                               {1.01171875f, 0x3f82}, {3.0e38f, 0x7f62}};
    for (auto &c : cases) {
        if (f2bf(c.f) != c.h) { printf("FAIL f2bf(%g) = %04x, want %04x\n", c.f, f2bf(c.f), c.h); fails++; }
    }
    if ((f2bf(NAN) & 0x7fff) <= 0x7f80) { printf("FAIL f2bf(NaN) is not NaN\n"); fails++; }
    printf("bf16 rounding: %s\n", fails ? "FAIL" : "ok");

    Shape shapes[] = {{1, 5, 4, 2, 4}, {2, 9, 2, 1, 8}, {1, 7, 3, 3, 6}, {2, 33, 4, 2, 16}};
    for (Shape s : shapes) {
        const size_t nq = (size_t)s.B * s.T * s.NH * s.HD, nk = (size_t)s.B * s.T * s.NKV * s.HD;
        const size_t nl = (size_t)s.B * s.NH * s.T;
        std::vector<double> q(nq), k(nk), v(nk), w(nq), out(nq), lse(nl), out2(nq), lse2(nl);
        for (auto &x : q) { x = 2 * rng_normal(); }   // peaky scores: the softmax is far from uniform
        for (auto &x : k) { x = rng_normal(); }
        for (auto &x : v) { x = rng_normal(); }
        for (auto &x : w) { x = rng_normal(); }
        cpu_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
        naive_forward(out2.data(), lse2.data(), q.data(), k.data(), v.data(), s);
        const double eo = rel_l2(out.data(), out2.data(), nq), el = rel_l2(lse.data(), lse2.data(), nl);
        const bool fwd_ok = eo < 1e-12 && el < 1e-12;

        std::vector<double> dq(nq), dk(nk), dv(nk);
        cpu_attention_backward(dq.data(), dk.data(), dv.data(), w.data(), q.data(), k.data(), v.data(), lse.data(), s);
        auto loss = [&](void) {
            cpu_attention_forward(out2.data(), lse2.data(), q.data(), k.data(), v.data(), s);
            double L = 0;
            for (size_t i = 0; i < nq; i++) { L += out2[i] * w[i]; }
            return L;
        };
        // every element of q, k and v (the shapes are tiny): max |fd - analytic| / max |analytic|
        const double eps = 1e-6;
        double err[3] = {0, 0, 0}, mag[3] = {0, 0, 0};
        std::vector<double> *xs[3] = {&q, &k, &v}, *gs[3] = {&dq, &dk, &dv};
        for (int which = 0; which < 3; which++) {
            std::vector<double> &x = *xs[which], &gr = *gs[which];
            for (size_t i = 0; i < x.size(); i++) {
                const double x0 = x[i];
                x[i] = x0 + eps; const double lp = loss();
                x[i] = x0 - eps; const double lm = loss();
                x[i] = x0;
                const double fd = (lp - lm) / (2 * eps);
                err[which] = fmax(err[which], fabs(fd - gr[i]));
                mag[which] = fmax(mag[which], fabs(gr[i]));
            }
        }
        const double e0 = err[0] / mag[0], e1 = err[1] / mag[1], e2 = err[2] / mag[2];
        const bool bwd_ok = e0 < 1e-7 && e1 < 1e-7 && e2 < 1e-7;

        // what rounding out to bf16 alone does to ||out - ref|| / ||ref||
        std::vector<double> outr(nq);
        for (size_t i = 0; i < nq; i++) { outr[i] = bf2f(f2bf((float)out[i])); }
        printf("B=%d T=%d NH=%d NKV=%d HD=%d: forward vs naive: out %.1e lse %.1e %s | backward vs finite "
               "differences (max err / max |grad|): dq %.1e dk %.1e dv %.1e %s | bf16 rounding of out alone: %.1e\n",
               s.B, s.T, s.NH, s.NKV, s.HD, eo, el, fwd_ok ? "ok" : "FAIL", e0, e1, e2, bwd_ok ? "ok" : "FAIL",
               rel_l2(outr.data(), out.data(), nq));
        fails += !fwd_ok + !bwd_ok;
    }
    printf("cpu selftest: %s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}

// ----------------------------------------------------------------------------
// GPU: shared pieces

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) { x += __shfl_xor_sync(0xffffffffu, x, o); }
    return x;
}

// D[b, h, t] = sum_d dout[b, t, h, d] * out[b, t, h, d] (fp32), for every backward version.
// HD/8 consecutive lanes own one row (16-byte loads); rows in memory order (b, t, h).
template <int HD>
__global__ void attention_backward_prep_kernel(float *Dd, const bf16 *dout, const bf16 *out, int B, int T, int NH) {
    constexpr int L = HD / 8;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t row = idx / L, nrows = (size_t)B * T * NH;
    const int c = (int)(idx % L);
    float sum = 0.f;
    if (row < nrows) {
        uint4 a = *(const uint4 *)(dout + row * HD + c * 8), o = *(const uint4 *)(out + row * HD + c * 8);
        const bf16 *pa = (const bf16 *)&a, *po = (const bf16 *)&o;
#pragma unroll
        for (int i = 0; i < 8; i++) { sum += __bfloat162float(pa[i]) * __bfloat162float(po[i]); }
    }
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) { sum += __shfl_xor_sync(0xffffffffu, sum, off); }
    if (row < nrows && c == 0) {
        const int h = (int)(row % NH), t = (int)((row / NH) % T), b = (int)(row / ((size_t)NH * T));
        Dd[((size_t)b * NH + h) * T + t] = sum;
    }
}

// ----------------------------------------------------------------------------
// v1: one warp per row on CUDA cores, fp32. Lane l owns head dims l + 32 i.

// forward. grid: B*T*NH warps, warp w = row (b, t, h) in memory order (h fastest,
// so a block's warps have about the same number of keys). Online softmax over
// keys 0..t: m = running max, l = running sum of exp(s - m), o rescaled when m grows.
template <int NI>
__global__ void attention_forward_v1_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                            int B, int T, int NH, int NKV, float scale) {
    constexpr int HD = NI * 32;
    const size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= (size_t)B * T * NH) { return; }
    const int h = (int)(w % NH), t = (int)((w / NH) % T), b = (int)(w / ((size_t)NH * T));
    const int kvh = h / (NH / NKV);
    float qr[NI], o[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) { qr[i] = __bfloat162float(q[w * HD + lane + 32 * i]) * scale; o[i] = 0.f; }
    float m = -INFINITY, l = 0.f;
    const bf16 *kb = k + ((size_t)b * T * NKV + kvh) * HD, *vb = v + ((size_t)b * T * NKV + kvh) * HD;
    for (int j = 0; j <= t; j++) {
        const size_t off = (size_t)j * NKV * HD;
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < NI; i++) { dot += qr[i] * __bfloat162float(kb[off + lane + 32 * i]); }
        const float s = warp_sum(dot);
        const float mnew = fmaxf(m, s), corr = expf(m - mnew), p = expf(s - mnew);
        l = l * corr + p;
        m = mnew;
#pragma unroll
        for (int i = 0; i < NI; i++) { o[i] = o[i] * corr + p * __bfloat162float(vb[off + lane + 32 * i]); }
    }
#pragma unroll
    for (int i = 0; i < NI; i++) { out[w * HD + lane + 32 * i] = __float2bfloat16(o[i] / l); }
    if (lane == 0) { lse[((size_t)b * NH + h) * T + t] = m + logf(l); }
}

// dq. One warp per query row (b, t, h): for keys j <= t, p = exp(s - lse),
// dp = dout . v_j, ds = p (dp - D); dq = scale * sum_j ds k_j.
template <int NI>
__global__ void attention_backward_dq_v1_kernel(bf16 *dq, const bf16 *q, const bf16 *k, const bf16 *v,
                                                const bf16 *dout, const float *lse, const float *Dd,
                                                int B, int T, int NH, int NKV, float scale) {
    constexpr int HD = NI * 32;
    const size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= (size_t)B * T * NH) { return; }
    const int h = (int)(w % NH), t = (int)((w / NH) % T), b = (int)(w / ((size_t)NH * T));
    const int kvh = h / (NH / NKV);
    const float L = lse[((size_t)b * NH + h) * T + t], D = Dd[((size_t)b * NH + h) * T + t];
    float qr[NI], g[NI], acc[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) {
        qr[i] = __bfloat162float(q[w * HD + lane + 32 * i]) * scale;
        g[i] = __bfloat162float(dout[w * HD + lane + 32 * i]);
        acc[i] = 0.f;
    }
    const bf16 *kb = k + ((size_t)b * T * NKV + kvh) * HD, *vb = v + ((size_t)b * T * NKV + kvh) * HD;
    for (int j = 0; j <= t; j++) {
        const size_t off = (size_t)j * NKV * HD;
        float kr[NI], dot = 0.f, dd = 0.f;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            kr[i] = __bfloat162float(kb[off + lane + 32 * i]);
            dot += qr[i] * kr[i];
            dd += g[i] * __bfloat162float(vb[off + lane + 32 * i]);
        }
        const float s = warp_sum(dot), dp = warp_sum(dd);
        const float ds = expf(s - L) * (dp - D);
#pragma unroll
        for (int i = 0; i < NI; i++) { acc[i] += ds * kr[i]; }
    }
#pragma unroll
    for (int i = 0; i < NI; i++) { dq[w * HD + lane + 32 * i] = __float2bfloat16(acc[i] * scale); }
}

// dk, dv. One warp per key row (b, j, kvh): over the group's query heads h and
// rows t >= j: dv += p dout_t, dk += scale * p (dp - D) q_t. The warp owns its
// outputs, so no atomics.
template <int NI>
__global__ void attention_backward_dkdv_v1_kernel(bf16 *dk, bf16 *dv, const bf16 *q, const bf16 *k, const bf16 *v,
                                                  const bf16 *dout, const float *lse, const float *Dd,
                                                  int B, int T, int NH, int NKV, float scale) {
    constexpr int HD = NI * 32;
    const size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= (size_t)B * T * NKV) { return; }
    const int kvh = (int)(w % NKV), j = (int)((w / NKV) % T), b = (int)(w / ((size_t)NKV * T));
    const int G = NH / NKV;
    float kr[NI], vr[NI], ak[NI], av[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) {
        kr[i] = __bfloat162float(k[w * HD + lane + 32 * i]) * scale;
        vr[i] = __bfloat162float(v[w * HD + lane + 32 * i]);
        ak[i] = 0.f; av[i] = 0.f;
    }
    for (int h = kvh * G; h < (kvh + 1) * G; h++) {
        const float *Lh = lse + ((size_t)b * NH + h) * T, *Dh = Dd + ((size_t)b * NH + h) * T;
        for (int t = j; t < T; t++) {
            const size_t off = (((size_t)b * T + t) * NH + h) * HD;
            float qr[NI], g[NI], dot = 0.f, dd = 0.f;
#pragma unroll
            for (int i = 0; i < NI; i++) {
                qr[i] = __bfloat162float(q[off + lane + 32 * i]);
                g[i] = __bfloat162float(dout[off + lane + 32 * i]);
                dot += qr[i] * kr[i];
                dd += g[i] * vr[i];
            }
            const float s = warp_sum(dot), dp = warp_sum(dd);
            const float p = expf(s - Lh[t]), ds = p * (dp - Dh[t]);
#pragma unroll
            for (int i = 0; i < NI; i++) { av[i] += p * g[i]; ak[i] += ds * qr[i]; }
        }
    }
#pragma unroll
    for (int i = 0; i < NI; i++) {
        dk[w * HD + lane + 32 * i] = __float2bfloat16(ak[i] * scale);
        dv[w * HD + lane + 32 * i] = __float2bfloat16(av[i]);
    }
}

// ----------------------------------------------------------------------------
// v2/v3 building blocks: cp.async, ldmatrix, mma.sync m16n8k16 (bf16 in, fp32 acc).
//
// Fragment layouts of m16n8k16 (g = lane / 4, t = lane % 4):
//   A 16x16: reg0 = A[g][2t..2t+1], reg1 = A[g+8][2t..], reg2 = A[g][2t+8..], reg3 = A[g+8][2t+8..]
//   B 16x8 : reg0 = B[2t..2t+1][g], reg1 = B[2t+8..2t+9][g]
//   C 16x8 : c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
// Two adjacent C tiles of a 16x16 block, rounded to bf16 pairwise, are exactly
// the A fragment of that block: softmax probabilities go from the first matmul
// to the second without touching shared memory.
// Shared-memory tiles are row-major with rows padded by PAD bf16 (16 bytes), so
// the 8 row addresses of each ldmatrix 8x8 matrix hit 8 different 16-byte bank
// groups: (2*HD + 16) bytes = 4 words mod 32 between rows.

#define PAD 8

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
// c += a * b
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   // .x (low half) = lo
    return *(uint32_t *)&v;
}

// Per-lane ldmatrix addresses into a row-major tile M with row stride ld:
//  a_addr:  A fragment of the 16x16 block at (r0, c0)         (M[m][k], plain)
//  bt_addr: B fragments of two n-tiles, B[k][n] = M[k][n]:  rows k0..k0+15, cols n0..n0+15 (use .trans)
//           r[0..1] = n-tile n0, r[2..3] = n-tile n0+8
//  bn_addr: B fragments of two n-tiles, B[k][n] = M[n][k]:  rows n0..n0+15, cols k0..k0+15 (plain)
//           r[0..1] = n-tile n0, r[2..3] = n-tile n0+8
template <typename E>
__host__ __device__ __forceinline__ const E *a_addr(const E *M, int ld, int r0, int c0, int lane) {
    return M + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8;
}
template <typename E>
__host__ __device__ __forceinline__ const E *bt_addr(const E *M, int ld, int k0, int n0, int lane) {
    return M + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
}
template <typename E>
__host__ __device__ __forceinline__ const E *bn_addr(const E *M, int ld, int n0, int k0, int lane) {
    return M + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8;
}

// Host emulation of ldmatrix and mma.sync m16n8k16 from the PTX manual's fragment
// layouts, run by --cpu-selftest on the address helpers above with the call
// pattern of the kernels: S = Q K^T (a_addr, bn_addr), the C -> A repacking of
// P, and O = P V (bt_addr, .trans). It also checks the coordinate formula the
// kernels use for masks, lse/D and stores: s[n][e] of lane (g = lane/4, t = lane%4)
// is row g + 8 (e >> 1), column 8 n + 2 t + (e & 1). Small integers: exact in float.
typedef float EmuReg[2];   // one 32-bit register = a pair of 16-bit values (lo, hi)
static void emu_ldsm(EmuReg r[32][4], const float *const addr[32], bool trans) {
    for (int i = 0; i < 4; i++) {
        float mat[8][8];
        for (int rr = 0; rr < 8; rr++)
            for (int c = 0; c < 8; c++) { mat[rr][c] = addr[8 * i + rr][c]; }
        for (int L = 0; L < 32; L++)
            for (int j = 0; j < 2; j++) {
                r[L][i][j] = trans ? mat[2 * (L % 4) + j][L / 4] : mat[L / 4][2 * (L % 4) + j];
            }
    }
}
static void emu_mma(float c[32][4], EmuReg a[32][4], EmuReg b0[32], EmuReg b1[32]) {
    float A[16][16], Bm[16][8], C[16][8];
    for (int L = 0; L < 32; L++) {
        const int g = L / 4, t = L % 4;
        for (int j = 0; j < 2; j++) {
            A[g][2 * t + j] = a[L][0][j]; A[g + 8][2 * t + j] = a[L][1][j];
            A[g][2 * t + 8 + j] = a[L][2][j]; A[g + 8][2 * t + 8 + j] = a[L][3][j];
            Bm[2 * t + j][g] = b0[L][j]; Bm[2 * t + 8 + j][g] = b1[L][j];
            C[g][2 * t + j] = c[L][j]; C[g + 8][2 * t + j] = c[L][2 + j];
        }
    }
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++)
            for (int kx = 0; kx < 16; kx++) { C[m][n] += A[m][kx] * Bm[kx][n]; }
    for (int L = 0; L < 32; L++) {
        const int g = L / 4, t = L % 4;
        for (int j = 0; j < 2; j++) { c[L][j] = C[g][2 * t + j]; c[L][2 + j] = C[g + 8][2 * t + j]; }
    }
}
static int fragment_selftest() {
    constexpr int HDt = 32, BCt = 32, LDt = HDt + PAD;
    static float Q[16 * LDt], K[BCt * LDt], V[BCt * LDt];
    for (int i = 0; i < 16 * LDt; i++) { Q[i] = (float)((int)(rng_u64() % 7) - 3); }
    for (int i = 0; i < BCt * LDt; i++) { K[i] = (float)((int)(rng_u64() % 7) - 3); V[i] = (float)((int)(rng_u64() % 7) - 3); }
    static float s[BCt / 8][32][4], o[HDt / 8][32][4];
    memset(s, 0, sizeof s); memset(o, 0, sizeof o);
    const float *addr[32];
    EmuReg qf[32][4], bb[32][4], b0[32], b1[32];
    auto split = [&](int lo) {   // registers lo, lo+1 of bb -> b0, b1
        for (int L = 0; L < 32; L++)
            for (int j = 0; j < 2; j++) { b0[L][j] = bb[L][lo][j]; b1[L][j] = bb[L][lo + 1][j]; }
    };
    for (int kk = 0; kk < HDt / 16; kk++) {   // S = Q K^T, as in the forward kernel
        for (int L = 0; L < 32; L++) { addr[L] = a_addr(Q, LDt, 0, kk * 16, L); }
        emu_ldsm(qf, addr, false);
        for (int nn = 0; nn < BCt / 16; nn++) {
            for (int L = 0; L < 32; L++) { addr[L] = bn_addr(K, LDt, nn * 16, kk * 16, L); }
            emu_ldsm(bb, addr, false);
            split(0); emu_mma(s[2 * nn], qf, b0, b1);
            split(2); emu_mma(s[2 * nn + 1], qf, b0, b1);
        }
    }
    int bad = 0;
    float S[16][BCt];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < BCt; c++) {
            S[r][c] = 0;
            for (int d = 0; d < HDt; d++) { S[r][c] += Q[r * LDt + d] * K[c * LDt + d]; }
        }
    for (int n = 0; n < BCt / 8; n++)
        for (int L = 0; L < 32; L++)
            for (int e = 0; e < 4; e++) {
                bad += s[n][L][e] != S[L / 4 + 8 * (e >> 1)][8 * n + 2 * (L % 4) + (e & 1)];
            }
    for (int kc = 0; kc < BCt / 16; kc++) {   // O = P V with P = S repacked from C to A fragments
        EmuReg a[32][4];
        for (int L = 0; L < 32; L++) {
            a[L][0][0] = s[2 * kc][L][0]; a[L][0][1] = s[2 * kc][L][1];
            a[L][1][0] = s[2 * kc][L][2]; a[L][1][1] = s[2 * kc][L][3];
            a[L][2][0] = s[2 * kc + 1][L][0]; a[L][2][1] = s[2 * kc + 1][L][1];
            a[L][3][0] = s[2 * kc + 1][L][2]; a[L][3][1] = s[2 * kc + 1][L][3];
        }
        for (int dn = 0; dn < HDt / 16; dn++) {
            for (int L = 0; L < 32; L++) { addr[L] = bt_addr(V, LDt, kc * 16, dn * 16, L); }
            emu_ldsm(bb, addr, true);
            split(0); emu_mma(o[2 * dn], a, b0, b1);
            split(2); emu_mma(o[2 * dn + 1], a, b0, b1);
        }
    }
    for (int n = 0; n < HDt / 8; n++)
        for (int L = 0; L < 32; L++)
            for (int e = 0; e < 4; e++) {
                const int r = L / 4 + 8 * (e >> 1), c = 8 * n + 2 * (L % 4) + (e & 1);
                float ref = 0;
                for (int j = 0; j < BCt; j++) { ref += S[r][j] * V[j * LDt + c]; }
                bad += o[n][L][e] != ref;
            }
    // v4's dQ = dS K: A = dS (16 q x BCt keys) read with ldmatrix.trans from dS^T stored as
    // BCt key rows of 16 q columns (bn_addr with rows = keys, columns = queries), B = V via bt_addr
    {
        constexpr int LDS = 16 + PAD;
        static float St[BCt * LDS];
        static float r[HDt / 8][32][4];
        memset(r, 0, sizeof r);
        for (int i = 0; i < BCt * LDS; i++) { St[i] = (float)((int)(rng_u64() % 7) - 3); }
        for (int kc = 0; kc < BCt / 16; kc++) {
            EmuReg a[32][4];
            for (int L = 0; L < 32; L++) { addr[L] = bn_addr(St, LDS, kc * 16, 0, L); }
            emu_ldsm(a, addr, true);
            for (int dn = 0; dn < HDt / 16; dn++) {
                for (int L = 0; L < 32; L++) { addr[L] = bt_addr(V, LDt, kc * 16, dn * 16, L); }
                emu_ldsm(bb, addr, true);
                split(0); emu_mma(r[2 * dn], a, b0, b1);
                split(2); emu_mma(r[2 * dn + 1], a, b0, b1);
            }
        }
        for (int n = 0; n < HDt / 8; n++)
            for (int L = 0; L < 32; L++)
                for (int e = 0; e < 4; e++) {
                    const int rr = L / 4 + 8 * (e >> 1), c = 8 * n + 2 * (L % 4) + (e & 1);
                    float ref = 0;
                    for (int j = 0; j < BCt; j++) { ref += St[j * LDS + rr] * V[j * LDt + c]; }
                    bad += r[n][L][e] != ref;
                }
    }
    printf("fragment emulation (ldmatrix/mma layouts, address helpers, C->A repack, coordinates, v4 dS^T -> A): %s\n",
           bad ? "FAIL" : "ok");
    return bad ? 1 : 0;
}

// ROWS x HD bf16 from global (row stride gstride elements) into a padded smem tile, 16 bytes per cp.async
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, size_t gstride) {
    constexpr int CPR = HD / 8;
    static_assert(ROWS * CPR % NT == 0, "tile chunks must divide among the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CPR / NT; i++) {
        const int c = threadIdx.x + i * NT, r = c / CPR, cc = c % CPR;
        cp_async16(s + r * (HD + PAD) + cc * 8, g + r * gstride + cc * 8);
    }
}

// A warp's 16 rows of fp32 accumulators acc[HD/8][4] (C layout) times mul, as bf16
// into its 16 smem rows sO (stride HD+PAD), then 16-byte coalesced stores to
// global rows g (row stride gstride).
template <int HD>
__device__ __forceinline__ void store_rows(bf16 *g, size_t gstride, bf16 *sO, const float (*acc)[4],
                                           float mul0, float mul1, int lane) {
    constexpr int LD = HD + PAD;
    const int gr = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        *(uint32_t *)(sO + gr * LD + n * 8 + 2 * t4) = pack_bf16(acc[n][0] * mul0, acc[n][1] * mul0);
        *(uint32_t *)(sO + (gr + 8) * LD + n * 8 + 2 * t4) = pack_bf16(acc[n][2] * mul1, acc[n][3] * mul1);
    }
    __syncwarp();
#pragma unroll
    for (int c = lane; c < 16 * HD / 8; c += 32) {
        const int r = c / (HD / 8), cc = c % (HD / 8);
        *(uint4 *)(g + r * gstride + cc * 8) = *(const uint4 *)(sO + r * LD + cc * 8);
    }
}

// ----------------------------------------------------------------------------
// v2/v3 forward: FlashAttention-2 style.
// grid (T/BR, NH, B), BR = 16*NWARPS query rows per block, warp w owns rows
// q0+16w..+15. Q tile -> registers (A fragments) once. Loop over kv tiles of BC
// keys up to the diagonal, double-buffered with cp.async: S = Q K^T (16 x BC per
// warp, fp32 in registers), causal mask on tiles that cross the diagonal, online
// softmax in base 2 (m = running max of s*scale*log2e, l = per-thread partial
// sums, reduced over the 4 lanes of a row at the end), P -> bf16 A fragments,
// O += P V with V via ldmatrix.trans. Out = O / l; lse = (m + log2 l) ln 2.
// Heavy (late) q tiles are launched first. smem: (BR + 4 BC) (HD+8) bf16.
template <int HD, int NWARPS, int BC>
__global__ void __launch_bounds__(NWARPS * 32)
attention_forward_flash_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                               int T, int NH, int NKV, float sl2) {
    constexpr int BR = NWARPS * 16, LD = HD + PAD, NT = NWARPS * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sQ = (bf16 *)smem_raw, *sK = sQ + BR * LD, *sV = sK + 2 * BC * LD;
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (NH / NKV), warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int q0 = qb * BR, r0 = q0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const bf16 *qg = q + ((size_t)b * T + q0) * qs + (size_t)h * HD;
    const bf16 *kg = k + (size_t)b * T * ks + (size_t)kvh * HD, *vg = v + (size_t)b * T * ks + (size_t)kvh * HD;
    const int nkv = (q0 + BR - 1) / BC + 1;

    load_tile<BR, HD, NT>(sQ, qg, qs);
    load_tile<BC, HD, NT>(sK, kg, ks);
    load_tile<BC, HD, NT>(sV, vg, ks);
    cp_async_commit();

    uint32_t qf[HD / 16][4];
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) { o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f; }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    for (int j = 0; j < nkv; j++) {
        if (j + 1 < nkv) {
            const int nb = (j + 1) & 1;
            load_tile<BC, HD, NT>(sK + nb * BC * LD, kg + (size_t)(j + 1) * BC * ks, ks);
            load_tile<BC, HD, NT>(sV + nb * BC * LD, vg + (size_t)(j + 1) * BC * ks, ks);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) { ldsm_x4(qf[kk], a_addr(sQ, LD, warp * 16, kk * 16, lane)); }
        }
        const int k0 = j * BC;
        if (k0 <= r0 + 15) {   // warp-uniform: some key of the tile is visible to some row of the warp
            const bf16 *cK = sK + (j & 1) * BC * LD, *cV = sV + (j & 1) * BC * LD;
            float s[BC / 8][4];
#pragma unroll
            for (int n = 0; n < BC / 8; n++) { s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f; }
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int nn = 0; nn < BC / 16; nn++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bn_addr(cK, LD, nn * 16, kk * 16, lane));
                    mma16816(s[2 * nn], qf[kk], bb[0], bb[1]);
                    mma16816(s[2 * nn + 1], qf[kk], bb[2], bb[3]);
                }
            }
            if (k0 + BC - 1 > r0) {   // the tile crosses the diagonal of this warp's rows
#pragma unroll
                for (int n = 0; n < BC / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (k0 + n * 8 + 2 * t4 + (e & 1) > r0 + g + (e >> 1) * 8) { s[n][e] = -INFINITY; }
                    }
            }
            // Online softmax. Tile 0 holds key 0, visible to every row, so m is
            // finite from the first tile on and exp2(m_old - m_new) never sees -inf - -inf.
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < BC / 8; n++) { mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1])); }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[r], mx * sl2), alpha = exp2f(m[r] - mnew);
                m[r] = mnew;
                l[r] *= alpha;
#pragma unroll
                for (int n = 0; n < HD / 8; n++) { o[n][2 * r] *= alpha; o[n][2 * r + 1] *= alpha; }
#pragma unroll
                for (int n = 0; n < BC / 8; n++) {
                    s[n][2 * r] = exp2f(fmaf(s[n][2 * r], sl2, -mnew));
                    s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], sl2, -mnew));
                    l[r] += s[n][2 * r] + s[n][2 * r + 1];
                }
            }
#pragma unroll
            for (int kc = 0; kc < BC / 16; kc++) {
                const uint32_t a[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                                       pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                       pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bt_addr(cV, LD, kc * 16, dn * 16, lane));
                    mma16816(o[2 * dn], a, bb[0], bb[1]);
                    mma16816(o[2 * dn + 1], a, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();   // this buffer is refilled by the next iteration's prefetch
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    if (t4 == 0) {
        float *lrow = lse + ((size_t)b * NH + h) * T + r0 + g;
        lrow[0] = (m[0] + log2f(l[0])) * LN2;
        lrow[8] = (m[1] + log2f(l[1])) * LN2;
    }
    // the warp's own rows of sQ are free (its Q fragments are in registers)
    store_rows<HD>(out + ((size_t)b * T + r0) * qs + (size_t)h * HD, qs, sQ + warp * 16 * LD, o, 1.f / l[0],
                   1.f / l[1], lane);
}

// ----------------------------------------------------------------------------
// v2/v3 backward, pass 1: dk, dv.
// grid (T/BK, NKV, B), BK = 16*NWARPS keys per block, warp w owns keys
// k0+16w..+15 of kv head kvh and accumulates their dK, dV (16 x HD each, fp32
// registers) over every query head of the group and every q tile of BQ rows at
// or after the block's first key, double-buffered (Q, dO, lse, D) with cp.async.
// Per tile, in the transposed orientation (keys are the M dimension):
//   S^T = K Q^T, P^T = exp2(S^T scale log2e - lse log2e) (0 where q < key),
//   dP^T = V dO^T, dS^T = P^T (dP^T - D),
//   dV += P^T dO, dK += dS^T Q     (P^T, dS^T -> bf16 A fragments from registers).
// dK is scaled once at the end. KV_REGS keeps K, V A fragments in registers
// (HD=64); otherwise they are re-read from smem per tile (HD=128, register budget).
// smem: 2 BK + 4 BQ rows of (HD+8) bf16 + 4 BQ floats.
template <int HD, int NWARPS, int BQ, bool KV_REGS>
__global__ void __launch_bounds__(NWARPS * 32)
attention_backward_dkdv_flash_kernel(bf16 *dk, bf16 *dv, const bf16 *q, const bf16 *k, const bf16 *v,
                                     const bf16 *dout, const float *lse, const float *Dd,
                                     int T, int NH, int NKV, float scale, float sl2) {
    constexpr int BK = NWARPS * 16, LD = HD + PAD, NT = NWARPS * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sK = (bf16 *)smem_raw, *sV = sK + BK * LD, *sQ = sV + BK * LD, *sdO = sQ + 2 * BQ * LD;
    float *sL = (float *)(sdO + 2 * BQ * LD), *sD = sL + 2 * BQ;
    const int kb = gridDim.x - 1 - blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int G = NH / NKV, k0 = kb * BK, kw0 = k0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const int i0 = k0 / BQ, nq = T / BQ - i0, nit = G * nq;

    // issue the loads of iteration it (head kvh*G + it/nq, q tile i0 + it%nq) into buffer buf
    auto issue = [&](int it, int buf) {
        const int h = kvh * G + it / nq, qt0 = (i0 + it % nq) * BQ;
        const size_t go = ((size_t)b * T + qt0) * qs + (size_t)h * HD;
        load_tile<BQ, HD, NT>(sQ + buf * BQ * LD, q + go, qs);
        load_tile<BQ, HD, NT>(sdO + buf * BQ * LD, dout + go, qs);
        const size_t lo = ((size_t)b * NH + h) * T + qt0;
        if (threadIdx.x < BQ / 4) {
            cp_async16(sL + buf * BQ + threadIdx.x * 4, lse + lo + threadIdx.x * 4);
        } else if (threadIdx.x < BQ / 2) {
            cp_async16(sD + buf * BQ + (threadIdx.x - BQ / 4) * 4, Dd + lo + (threadIdx.x - BQ / 4) * 4);
        }
    };
    const size_t kgo = ((size_t)b * T + k0) * ks + (size_t)kvh * HD;
    load_tile<BK, HD, NT>(sK, k + kgo, ks);
    load_tile<BK, HD, NT>(sV, v + kgo, ks);
    issue(0, 0);
    cp_async_commit();

    uint32_t kf[KV_REGS ? HD / 16 : 1][4], vf[KV_REGS ? HD / 16 : 1][4];
    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) { dka[n][e] = 0.f; dva[n][e] = 0.f; }

    for (int it = 0; it < nit; it++) {
        if (it + 1 < nit) {
            issue(it + 1, (it + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (KV_REGS && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (KV_REGS ? HD / 16 : 0); kk++) {
                ldsm_x4(kf[kk], a_addr(sK, LD, warp * 16, kk * 16, lane));
                ldsm_x4(vf[kk], a_addr(sV, LD, warp * 16, kk * 16, lane));
            }
        }
        const int buf = it & 1, qt0 = (i0 + it % nq) * BQ;
        if (qt0 + BQ - 1 >= kw0) {   // warp-uniform: some query of the tile sees some key of the warp
            const bf16 *cQ = sQ + buf * BQ * LD, *cdO = sdO + buf * BQ * LD;
            const float *cL = sL + buf * BQ, *cD = sD + buf * BQ;
            float s[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
            for (int n = 0; n < BQ / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) { s[n][e] = 0.f; dp[n][e] = 0.f; }
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t ka[4], va[4];
                if (KV_REGS) {
#pragma unroll
                    for (int e = 0; e < 4; e++) { ka[e] = kf[KV_REGS ? kk : 0][e]; va[e] = vf[KV_REGS ? kk : 0][e]; }
                } else {
                    ldsm_x4(ka, a_addr(sK, LD, warp * 16, kk * 16, lane));
                    ldsm_x4(va, a_addr(sV, LD, warp * 16, kk * 16, lane));
                }
#pragma unroll
                for (int nn = 0; nn < BQ / 16; nn++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bn_addr(cQ, LD, nn * 16, kk * 16, lane));
                    mma16816(s[2 * nn], ka, bb[0], bb[1]);
                    mma16816(s[2 * nn + 1], ka, bb[2], bb[3]);
                    ldsm_x4(bb, bn_addr(cdO, LD, nn * 16, kk * 16, lane));
                    mma16816(dp[2 * nn], va, bb[0], bb[1]);
                    mma16816(dp[2 * nn + 1], va, bb[2], bb[3]);
                }
            }
            const bool mask = qt0 < kw0 + 15;   // some query of the tile precedes some key of the warp
#pragma unroll
            for (int n = 0; n < BQ / 8; n++) {
                const float2 L = *(const float2 *)(cL + n * 8 + 2 * t4), D = *(const float2 *)(cD + n * 8 + 2 * t4);
                const float L2[2] = {L.x * LOG2E, L.y * LOG2E}, Dv[2] = {D.x, D.y};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(fmaf(s[n][e], sl2, -L2[e & 1]));
                    if (mask && qt0 + n * 8 + 2 * t4 + (e & 1) < kw0 + g + (e >> 1) * 8) { p = 0.f; }
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - Dv[e & 1]);
                }
            }
#pragma unroll
            for (int kc = 0; kc < BQ / 16; kc++) {
                const uint32_t ap[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                                        pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                        pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
                const uint32_t ad[4] = {pack_bf16(dp[2 * kc][0], dp[2 * kc][1]), pack_bf16(dp[2 * kc][2], dp[2 * kc][3]),
                                        pack_bf16(dp[2 * kc + 1][0], dp[2 * kc + 1][1]),
                                        pack_bf16(dp[2 * kc + 1][2], dp[2 * kc + 1][3])};
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bt_addr(cdO, LD, kc * 16, dn * 16, lane));
                    mma16816(dva[2 * dn], ap, bb[0], bb[1]);
                    mma16816(dva[2 * dn + 1], ap, bb[2], bb[3]);
                    ldsm_x4_t(bb, bt_addr(cQ, LD, kc * 16, dn * 16, lane));
                    mma16816(dka[2 * dn], ad, bb[0], bb[1]);
                    mma16816(dka[2 * dn + 1], ad, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();
    }
    // each warp only ever read its own 16 rows of sK and sV: reuse them for staging
    store_rows<HD>(dk + kgo + (size_t)warp * 16 * ks, ks, sK + warp * 16 * LD, dka, scale, scale, lane);
    store_rows<HD>(dv + kgo + (size_t)warp * 16 * ks, ks, sV + warp * 16 * LD, dva, 1.f, 1.f, lane);
}

// ----------------------------------------------------------------------------
// v2/v3 backward, pass 2: dq.
// grid (T/BR, NH, B), BR = 16*NWARPS query rows per block, warp w owns rows
// q0+16w..+15; Q and dO tiles -> registers (A fragments) once. Loop over kv
// tiles of BC keys up to the diagonal, double-buffered:
//   S = Q K^T, P = exp2(S scale log2e - lse log2e) (0 above the diagonal),
//   dP = dO V^T (V as B via plain ldmatrix), dS = P (dP - D), dQ += dS K (K via .trans).
// dQ scaled once at the end. smem: (2 BR + 4 BC) (HD+8) bf16.
template <int HD, int NWARPS, int BC>
__global__ void __launch_bounds__(NWARPS * 32)
attention_backward_dq_flash_kernel(bf16 *dq, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                                   const float *lse, const float *Dd, int T, int NH, int NKV, float scale,
                                   float sl2) {
    constexpr int BR = NWARPS * 16, LD = HD + PAD, NT = NWARPS * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sQ = (bf16 *)smem_raw, *sdO = sQ + BR * LD, *sK = sdO + BR * LD, *sV = sK + 2 * BC * LD;
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (NH / NKV), warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int q0 = qb * BR, r0 = q0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const size_t qgo = ((size_t)b * T + q0) * qs + (size_t)h * HD;
    const bf16 *kg = k + (size_t)b * T * ks + (size_t)kvh * HD, *vg = v + (size_t)b * T * ks + (size_t)kvh * HD;
    const int nkv = (q0 + BR - 1) / BC + 1;

    load_tile<BR, HD, NT>(sQ, q + qgo, qs);
    load_tile<BR, HD, NT>(sdO, dout + qgo, qs);
    load_tile<BC, HD, NT>(sK, kg, ks);
    load_tile<BC, HD, NT>(sV, vg, ks);
    cp_async_commit();

    const float *Lrow = lse + ((size_t)b * NH + h) * T + r0 + g, *Drow = Dd + ((size_t)b * NH + h) * T + r0 + g;
    const float L2[2] = {Lrow[0] * LOG2E, Lrow[8] * LOG2E}, Dv[2] = {Drow[0], Drow[8]};

    uint32_t qf[HD / 16][4], df[HD / 16][4];
    float dqa[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) { dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.f; }

    for (int j = 0; j < nkv; j++) {
        if (j + 1 < nkv) {
            const int nb = (j + 1) & 1;
            load_tile<BC, HD, NT>(sK + nb * BC * LD, kg + (size_t)(j + 1) * BC * ks, ks);
            load_tile<BC, HD, NT>(sV + nb * BC * LD, vg + (size_t)(j + 1) * BC * ks, ks);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                ldsm_x4(qf[kk], a_addr(sQ, LD, warp * 16, kk * 16, lane));
                ldsm_x4(df[kk], a_addr(sdO, LD, warp * 16, kk * 16, lane));
            }
        }
        const int k0 = j * BC;
        if (k0 <= r0 + 15) {
            const bf16 *cK = sK + (j & 1) * BC * LD, *cV = sV + (j & 1) * BC * LD;
            float s[BC / 8][4], dp[BC / 8][4];
#pragma unroll
            for (int n = 0; n < BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) { s[n][e] = 0.f; dp[n][e] = 0.f; }
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int nn = 0; nn < BC / 16; nn++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bn_addr(cK, LD, nn * 16, kk * 16, lane));
                    mma16816(s[2 * nn], qf[kk], bb[0], bb[1]);
                    mma16816(s[2 * nn + 1], qf[kk], bb[2], bb[3]);
                    ldsm_x4(bb, bn_addr(cV, LD, nn * 16, kk * 16, lane));
                    mma16816(dp[2 * nn], df[kk], bb[0], bb[1]);
                    mma16816(dp[2 * nn + 1], df[kk], bb[2], bb[3]);
                }
            }
            const bool mask = k0 + BC - 1 > r0;
#pragma unroll
            for (int n = 0; n < BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(fmaf(s[n][e], sl2, -L2[e >> 1]));
                    if (mask && k0 + n * 8 + 2 * t4 + (e & 1) > r0 + g + (e >> 1) * 8) { p = 0.f; }
                    s[n][e] = p * (dp[n][e] - Dv[e >> 1]);   // dS
                }
#pragma unroll
            for (int kc = 0; kc < BC / 16; kc++) {
                const uint32_t a[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                                       pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                       pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bt_addr(cK, LD, kc * 16, dn * 16, lane));
                    mma16816(dqa[2 * dn], a, bb[0], bb[1]);
                    mma16816(dqa[2 * dn + 1], a, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();
    }
    store_rows<HD>(dq + qgo + (size_t)warp * 16 * qs, qs, sQ + warp * 16 * LD, dqa, scale, scale, lane);
}

// ----------------------------------------------------------------------------
// v4 backward: one fused kernel (FlashAttention-2 style), 5 matmuls per tile
// instead of v2's 7, deterministic without floating-point atomics.
//
// Block = one kv tile of BK = 64 keys of one kv head (4 warps, warp w owns keys
// k0+16w..+15, as in v2's dk/dv pass). It loops over the G query heads of the
// group and the q tiles i >= j (BQ = BK = 64 rows, j = its kv tile) and per tile:
//   S^T = K Q^T, P^T, dP^T = V dO^T, dS^T = P^T (dP^T - D)   (keys as M, registers)
//   dV += P^T dO, dK += dS^T Q                               (registers, as v2)
//   dS^T -> smem (bf16), then warp w: dQc[16w..16w+15][:] = dS K over the 64 keys
//   (A = dS through ldmatrix.trans of dS^T, B = K through ldmatrix.trans),
//   dQ[b, h, tile i] += scale * dQc in fp32 global memory, IN A FIXED ORDER.
// FLOPs: 5 matmuls of 2*64*64*64 per (kv tile, q tile, head) = 10 HD per pair.
//
// Fixed order: the contributions to q tile i come from kv tiles j = i, i-1, ..., 0
// in that order (descending; the diagonal tile first). turns[b, h, i] counts the
// contributions made so far: kv tile j adds when it reads i - j (acquire), then
// releases i - j + 1; the diagonal tile (turn 0) stores instead of adding (dqacc
// needs no zeroing) and kv tile 0 (the last turn) writes the final dq (OutT) and
// resets the counter to 0, so the counters are all 0 again when the kernel ends
// (zeroed once at allocation, never memset per call). The fp32 sums are thus
// formed in the same order every run: bit-identical results.
//
// Why descending: block j visits (head k, tile i) at its step k (nq - j) + (i - j),
// block j+1 visits it at step k (nq - j - 1) + (i - j - 1), k + 1 steps earlier.
// Blocks of one (b, kvh) that start together therefore never wait for a turn in
// the steady state (ascending order would make block j lag block j-1 by a step per
// j, a wavefront idling half the first wave; no visiting order avoids it).
//
// Forward progress: a block takes a ticket t = atomicAdd(ticket, 1) when it starts
// and works on the tile the ticket names (not its blockIdx): tickets go kv tile
// major, highest kv tile first (t -> j = nkt-1 - t / (B NKV), (b, kvh) = t % (B NKV)).
// A block waits only for turns of blocks of its (b, kvh) with a higher kv tile,
// i.e. smaller tickets. A ticket is drawn only by a block that is running, and a
// running block stays resident until it exits, so every block it waits for is
// resident (or done); by induction over t (ticket 0, the top kv tile of its
// (b, kvh), waits for nothing; a block never waits for a lower kv tile) every
// block finishes. This holds for any number of resident blocks and any block
// scheduling order of the hardware. The last ticket resets the ticket counter
// (every block has drawn by then). An integer atomic decides only who does which
// tile, never the order of a floating-point sum.
// Cost of the order: the heavy (low j) blocks start last. List scheduling of the
// 100m shape's 2048 blocks on 264 slots gives a makespan 12% over the average
// (heavy-first, as v2's dk/dv pass could do, would be 1%), plus the dQ traffic:
// 16 KB read + 16 KB written per (kv tile, q tile, head), 2.2 GB through L2 at the
// 100m shape (the working set, one (b, h)'s 512 KB of dq per active group, stays in L2).
// A spin that exceeds ~2^26 polls (seconds) traps instead of hanging.
//
// Tails: any T. Rows past T are zero-filled, get lse = +inf (p = 0) and D = 0, are
// never stored; kv and q tiles share one grid of 64 (BK = BQ), so the diagonal tile
// masks every key past T. smem: 2 BK + 4 BQ rows of (HD+8) bf16, BK rows of (BQ+8)
// bf16 for dS^T, 4 BQ floats.

__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(unsigned *p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// ROWS x HD bf16 into a padded smem tile; rows at or past nvalid are zero-filled
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void load_tile_n(bf16 *s, const bf16 *g, size_t gstride, int nvalid) {
    constexpr int CPR = HD / 8;
    static_assert(ROWS * CPR % NT == 0, "tile chunks must divide among the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CPR / NT; i++) {
        const int c = threadIdx.x + i * NT, r = c / CPR, cc = c % CPR;
        bf16 *dst = s + r * (HD + PAD) + cc * 8;
        if (r < nvalid) { cp_async16(dst, g + r * gstride + cc * 8); }
        else { *(uint4 *)dst = make_uint4(0, 0, 0, 0); }
    }
}
// a warp's 16 rows of accumulators (C layout) times mul to global rows (stride gstride), rows < nrows
__device__ __forceinline__ void put2(float *p, float x, float y) { *(float2 *)p = make_float2(x, y); }
__device__ __forceinline__ void put2(bf16 *p, float x, float y) { *(uint32_t *)p = pack_bf16(x, y); }
template <int HD, typename OutT>
__device__ __forceinline__ void store_rows_out(OutT *g, size_t gstride, const float (*acc)[4], float mul, int nrows,
                                               int lane) {
    const int gr = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        if (gr < nrows) { put2(g + gr * gstride + n * 8 + 2 * t4, acc[n][0] * mul, acc[n][1] * mul); }
        if (gr + 8 < nrows) { put2(g + (gr + 8) * gstride + n * 8 + 2 * t4, acc[n][2] * mul, acc[n][3] * mul); }
    }
}

// dq, dk: OutT (bf16 in the lab, fp32 in the trainer); dv bf16. dqacc: fp32 (B, T, NH, HD)
// scratch for the partial sums (may be dq itself when OutT is float). turns: B*NH*nkt
// counters, ticket: one counter, all 0 at entry (and again at exit).
// ABL (timing-only ablations, never checked, never for the trainer): 0 = v4 as designed; 1 = no turn
// waits, fences or releases (the dQ adds race: wrong, unordered results); 2 = no dQ at all (no dS^T store,
// no dS K product, no global dQ traffic, no turns).
template <int HD, typename OutT, int ABL = 0>
__global__ void __launch_bounds__(128)
attention_backward_fused_kernel(OutT *dq, float *dqacc, OutT *dk, bf16 *dv, const bf16 *q, const bf16 *k,
                                const bf16 *v, const bf16 *dout, const float *lse, const float *Dd,
                                unsigned *turns, unsigned *ticket, int B, int T, int NH, int NKV, float scale,
                                float sl2) {
    constexpr int NWARPS = 4, BK = 64, BQ = 64, LD = HD + PAD, LDS = BQ + PAD, NT = NWARPS * 32;
    static_assert(HD == 64, "v4 keeps K, V fragments and dK, dV, dQ accumulators in registers: HD = 64");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sK = (bf16 *)smem_raw, *sV = sK + BK * LD, *sQ = sV + BK * LD, *sdO = sQ + 2 * BQ * LD;
    bf16 *sS = sdO + 2 * BQ * LD;   // dS^T: BK rows (keys) of BQ (queries)
    float *sL = (float *)(sS + BK * LDS), *sD = sL + 2 * BQ;
    __shared__ unsigned s_ticket;
    const int nkt = (T + BK - 1) / BK, NG = B * NKV;
    if (threadIdx.x == 0) {
        const unsigned t = atomicAdd(ticket, 1u);
        if (t == gridDim.x - 1) { atomicExch(ticket, 0u); }   // the last ticket: every block has drawn
        s_ticket = t;
    }
    __syncthreads();
    const int tk = (int)s_ticket, j = nkt - 1 - tk / NG, grp = tk % NG, kvh = grp % NKV, b = grp / NKV;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int G = NH / NKV, k0 = j * BK, kw0 = k0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const int nq = nkt - j, nit = G * nq;

    auto issue = [&](int it, int buf) {
        const int h = kvh * G + it / nq, qt0 = (j + it % nq) * BQ;
        const size_t go = ((size_t)b * T + qt0) * qs + (size_t)h * HD;
        load_tile_n<BQ, HD, NT>(sQ + buf * BQ * LD, q + go, qs, T - qt0);
        load_tile_n<BQ, HD, NT>(sdO + buf * BQ * LD, dout + go, qs, T - qt0);
        if (threadIdx.x < 2 * BQ) {   // threads [0, BQ) lse, [BQ, 2 BQ) D; past T: lse = +inf (p = 0), D = 0
            const int i = threadIdx.x % BQ, isL = threadIdx.x < BQ;
            float *dst = (isL ? sL : sD) + buf * BQ + i;
            if (qt0 + i < T) { cp_async4(dst, (isL ? lse : Dd) + ((size_t)b * NH + h) * T + qt0 + i); }
            else { *dst = isL ? INFINITY : 0.f; }
        }
    };
    const size_t kgo = ((size_t)b * T + k0) * ks + (size_t)kvh * HD;
    load_tile_n<BK, HD, NT>(sK, k + kgo, ks, T - k0);
    load_tile_n<BK, HD, NT>(sV, v + kgo, ks, T - k0);
    issue(0, 0);
    cp_async_commit();

    uint32_t kf[HD / 16][4], vf[HD / 16][4];
    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) { dka[n][e] = 0.f; dva[n][e] = 0.f; }

    unsigned *rel_ptr = turns;   // the turn counter to advance for the previous q tile, and its new value
    unsigned rel_val = 0;
    for (int it = 0; it < nit; it++) {
        if (it + 1 < nit) {
            issue(it + 1, (it + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        if (ABL == 0 && it > 0) { __threadfence(); }   // the previous tile's dq stores, visible before its turn passes on
        __syncthreads();
        if (ABL == 0 && it > 0 && threadIdx.x == 0) { st_release(rel_ptr, rel_val); }
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                ldsm_x4(kf[kk], a_addr(sK, LD, warp * 16, kk * 16, lane));
                ldsm_x4(vf[kk], a_addr(sV, LD, warp * 16, kk * 16, lane));
            }
        }
        const int buf = it & 1, h = kvh * G + it / nq, i = j + it % nq, qt0 = i * BQ;
        const bf16 *cQ = sQ + buf * BQ * LD, *cdO = sdO + buf * BQ * LD;
        const float *cL = sL + buf * BQ, *cD = sD + buf * BQ;
        {
            float s[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
            for (int n = 0; n < BQ / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) { s[n][e] = 0.f; dp[n][e] = 0.f; }
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int nn = 0; nn < BQ / 16; nn++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bn_addr(cQ, LD, nn * 16, kk * 16, lane));
                    mma16816(s[2 * nn], kf[kk], bb[0], bb[1]);
                    mma16816(s[2 * nn + 1], kf[kk], bb[2], bb[3]);
                    ldsm_x4(bb, bn_addr(cdO, LD, nn * 16, kk * 16, lane));
                    mma16816(dp[2 * nn], vf[kk], bb[0], bb[1]);
                    mma16816(dp[2 * nn + 1], vf[kk], bb[2], bb[3]);
                }
            }
            const bool mask = qt0 < kw0 + 15;   // the diagonal tile (keys past T included)
#pragma unroll
            for (int n = 0; n < BQ / 8; n++) {
                const float2 L = *(const float2 *)(cL + n * 8 + 2 * t4), D = *(const float2 *)(cD + n * 8 + 2 * t4);
                const float L2[2] = {L.x * LOG2E, L.y * LOG2E}, Dv[2] = {D.x, D.y};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(fmaf(s[n][e], sl2, -L2[e & 1]));
                    if (mask && qt0 + n * 8 + 2 * t4 + (e & 1) < kw0 + g + (e >> 1) * 8) { p = 0.f; }
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - Dv[e & 1]);
                }
            }
            // dS^T (bf16, the values the dK product uses) -> this warp's 16 rows of sS
#pragma unroll
            for (int n = 0; n < (ABL == 2 ? 0 : BQ / 8); n++) {
                *(uint32_t *)(sS + (warp * 16 + g) * LDS + n * 8 + 2 * t4) = pack_bf16(dp[n][0], dp[n][1]);
                *(uint32_t *)(sS + (warp * 16 + g + 8) * LDS + n * 8 + 2 * t4) = pack_bf16(dp[n][2], dp[n][3]);
            }
#pragma unroll
            for (int kc = 0; kc < BQ / 16; kc++) {
                uint32_t ap[4], ad[4];
                ap[0] = pack_bf16(s[2 * kc][0], s[2 * kc][1]); ap[1] = pack_bf16(s[2 * kc][2], s[2 * kc][3]);
                ap[2] = pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]); ap[3] = pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3]);
                ad[0] = pack_bf16(dp[2 * kc][0], dp[2 * kc][1]); ad[1] = pack_bf16(dp[2 * kc][2], dp[2 * kc][3]);
                ad[2] = pack_bf16(dp[2 * kc + 1][0], dp[2 * kc + 1][1]); ad[3] = pack_bf16(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bt_addr(cdO, LD, kc * 16, dn * 16, lane));
                    mma16816(dva[2 * dn], ap, bb[0], bb[1]);
                    mma16816(dva[2 * dn + 1], ap, bb[2], bb[3]);
                    ldsm_x4_t(bb, bt_addr(cQ, LD, kc * 16, dn * 16, lane));
                    mma16816(dka[2 * dn], ad, bb[0], bb[1]);
                    mma16816(dka[2 * dn + 1], ad, bb[2], bb[3]);
                }
            }
        }
        if (ABL != 2) {
            __syncthreads();   // sS complete
            const unsigned turn = (unsigned)(i - j);
            const int r0 = qt0 + warp * 16;
            const size_t ro = ((size_t)b * T + r0) * qs + (size_t)h * HD;
            // Wait for turn i - j of (b, h, q tile i) and load the partial sum (from L2, never a
            // stale L1 line) before the dS K product below, which hides the load latency.
            float2 part[2][HD / 8];
            if (turn != 0) {
                const unsigned *cnt = turns + ((size_t)b * NH + h) * nkt + i;
                unsigned polls = 0;
                while (ABL == 0 && ld_acquire(cnt) != turn) {
                    __nanosleep(64);
                    if (++polls == (1u << 26)) { __trap(); }   // seconds: a bug, not a wait; fail loudly
                }
#pragma unroll
                for (int half = 0; half < 2; half++)
#pragma unroll
                    for (int n = 0; n < HD / 8; n++) {
                        const int row = g + 8 * half;
                        part[half][n] = r0 + row < T ? __ldcg((const float2 *)(dqacc + ro + (size_t)row * qs + n * 8 + 2 * t4))
                                                     : make_float2(0.f, 0.f);
                    }
            }
            // warp w: rows 16w..16w+15 of the q tile, dQc = dS K over the block's keys. On the
            // diagonal tile keys past the warp's last row have dS = 0: chunks kc > w are skipped.
            float dqc[HD / 8][4];
#pragma unroll
            for (int n = 0; n < HD / 8; n++) { dqc[n][0] = dqc[n][1] = dqc[n][2] = dqc[n][3] = 0.f; }
            const int kcmax = qt0 == k0 ? warp + 1 : BK / 16;
#pragma unroll
            for (int kc = 0; kc < BK / 16; kc++) {
                if (kc < kcmax) {
                    uint32_t a[4];
                    ldsm_x4_t(a, bn_addr(sS, LDS, kc * 16, warp * 16, lane));   // A[q][key] = dS^T[key][q]
#pragma unroll
                    for (int dn = 0; dn < HD / 16; dn++) {
                        uint32_t bb[4];
                        ldsm_x4_t(bb, bt_addr(sK, LD, kc * 16, dn * 16, lane));
                        mma16816(dqc[2 * dn], a, bb[0], bb[1]);
                        mma16816(dqc[2 * dn + 1], a, bb[2], bb[3]);
                    }
                }
            }
            // partial + scale * dQc (in this order, every run); kv tile 0 (the last turn) writes dq
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int row = g + 8 * half;
                if (r0 + row < T) {
#pragma unroll
                    for (int n = 0; n < HD / 8; n++) {
                        const size_t off = ro + (size_t)row * qs + n * 8 + 2 * t4;
                        float x = dqc[n][2 * half] * scale, y = dqc[n][2 * half + 1] * scale;
                        if (turn != 0) { x = part[half][n].x + x; y = part[half][n].y + y; }
                        if (j == 0) { put2(dq + off, x, y); }
                        else { __stcg((float2 *)(dqacc + off), make_float2(x, y)); }
                    }
                }
            }
            // the turn is passed on at the top of the next iteration (or after the loop), after a
            // fence that by then mostly finds these stores done
            rel_ptr = turns + ((size_t)b * NH + h) * nkt + i;
            rel_val = j == 0 ? 0u : turn + 1;   // kv tile 0 is the last turn: reset to 0
        }
        __syncthreads();   // buffers free for the next prefetch
    }
    if (ABL == 0) {
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) { st_release(rel_ptr, rel_val); }
    }
    if (kw0 >= T) { return; }   // warp-uniform; no barrier follows
    store_rows_out<HD>(dk + kgo + (size_t)warp * 16 * ks, ks, dka, scale, T - kw0, lane);
    store_rows_out<HD>(dv + kgo + (size_t)warp * 16 * ks, ks, dva, 1.f, T - kw0, lane);
}

// ----------------------------------------------------------------------------
// v4 variants 3-9: the "lite" fused backward (same tiles and the same 5 matmuls as v4 above),
// written after v4 measured 1.499 ms against v2's 0.964 at the 100m shape (NOTES, v4 section).
// What changes, and why (each a suspect for v4's ~2 us of extra time per (kv tile, q tile, head)):
//  * dQ is added with red.global.add.v2.f32 (the L2 does the add; fire and forget) instead of
//    ld.cg + add + st.cg: no load round trip on the block's critical path, no 32 registers of
//    partial sums. The first turn stores (no zeroing); the order of the adds is still fixed by
//    turns, so each dq element gets the same fp32 operations in the same order: bit-identical.
//  * Turns per (b, h, q tile, WARP): warp w adds only rows 16w..16w+15 of the q tile, so it waits
//    for and passes on its own counter; no block-wide fence. v4 had every thread run
//    __threadfence() (fence.sc.gpu, waiting for its stores to reach L2) on every tile. Here lane 0
//    passes the turn on with one st.release.gpu after __syncwarp (the pattern of CUTLASS's
//    semaphore and of cooperative groups' grid sync: a barrier, then one thread's release covers
//    the writes of the threads before the barrier), and only in the middle of the NEXT tile
//    (after its S, dP products and dS^T store), when the reds have long reached L2 and the release's fence
//    finds nothing to wait for.
//  * PREPOLL: lane 0 reads the counter (ld.relaxed, not waited for) at the top of the tile; if it
//    already shows the turn when the dQ adds are due, a fence.acq_rel.gpu makes it an acquire
//    pattern (strong read, then fence) with no round trip in the way; otherwise it spins with
//    ld.acquire as v4 did.
//  * No barrier at the end of each tile: the prefetch at the top of tile it refills the buffer
//    of tile it-1, which every warp finished reading before tile it-1's "sS complete" barrier.
//  * Order and tickets (CHAIN, TICK, LOCK), from a list-scheduling model of the 100m grid
//    (2048 blocks, 264 slots, unit steps; NOTES): v4's order (descending chain j = i..0, light
//    kv tiles first) finishes 12.5% after the average slot load; heavy kv tiles first with an
//    ascending chain (j = 0..i) and v4's visiting order waits 8% (block j lags j-1 by k+1 steps
//    per head k): +9%. With LOCK (a block visits its q tiles i DESCENDING, the G heads of a tile
//    back to back: every block of a (b, kvh) visits (head, q tile) at the same step index, so a
//    block that started no later than its successor is never behind it): +1.1..1.6%, i.e. the
//    tail is gone. And L2: v4's kv-tile-major tickets keep all B*NKV = 64 (b, kvh) groups active at
//    once: 64 x (1 MB of Q, dO + 1 MB of fp32 dq) streams through a 60 MB L2, and consecutive
//    contributions to one dq tile come many steps apart: the dq adds and Q/dO loads likely miss
//    L2 (~2.2 GB of dq traffic at the 100m shape). TICK = 16 (32) hands out the tickets in batches of
//    16 (32) (b, kvh) groups, kv tile major (heavy first) inside a batch: ~18 (~33) groups active;
//    model +1.6..6.2% (+1.5..3.1%) for a release latency of 1/4..1 step: each batch start
//    replays the lockstep chain's small lags (dev/cuda/v4_order_model.py).
//  * Forward progress (every CHAIN/TICK pair allowed by the static_asserts): a block waits only
//    for the block of its (b, kvh) with the preceding kv tile of the chain (j+1 descending, j-1
//    ascending), whose ticket is smaller (TICK 0 hands out higher j first, TICK 1 and 2 lower j
//    first); a ticket is drawn only by a running block, which stays resident until it exits, so
//    by induction over tickets every block finishes, for any residency and block order. A
//    block's deferred release waits only for its own next tile's barrier, which waits only for
//    smaller tickets: no cycle. The last turn of each counter (j = 0 descending, j = i
//    ascending) resets it to 0 (nobody reads it again in this launch): the counters are 0 after
//    every call.
// CHAIN 0 (no order) and DQ = false are timing-only ablations (racy / no dQ): never checked,
// never for the trainer. dq is fp32 (the trainer's dq; here the lab's dq32 scratch).
__device__ __forceinline__ unsigned ld_relaxed(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_relaxed(unsigned *p, unsigned v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ void red_add_v2(float *p, float x, float y) {
    asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
}

// CHAIN: 0 none (ablation), 1 descending (j = i..0, v4's), 2 ascending (j = 0..i).
// TICK: 0 kv tile major, highest j first (v4's); 1 kv tile major, lowest j first; TICK >= 2: batches
// of TICK (b, kvh) groups, kv tile major, lowest j first inside a batch. LOCK: q tiles descending, heads
// inner (else v4's: heads outer, q tiles ascending). turns: B*NH*nkt*4 counters, ticket: one.
template <typename OutT, int CHAIN, int TICK, bool LOCK, bool DQ, bool PREPOLL>
__global__ void __launch_bounds__(128)
attention_backward_fused_lite_kernel(float *dq, OutT *dk, bf16 *dv, const bf16 *q, const bf16 *k, const bf16 *v,
                                     const bf16 *dout, const float *lse, const float *Dd, unsigned *turns,
                                     unsigned *ticket, int B, int T, int NH, int NKV, float scale, float sl2) {
    static_assert(CHAIN != 1 || TICK == 0, "descending chain: its predecessor j+1 must hold a smaller ticket");
    static_assert(CHAIN != 2 || TICK != 0, "ascending chain: its predecessor j-1 must hold a smaller ticket");
    constexpr int HD = 64, BK = 64, BQ = 64, LD = HD + PAD, LDS = BQ + PAD, NT = 128, SB = TICK;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sK = (bf16 *)smem_raw, *sV = sK + BK * LD, *sQ = sV + BK * LD, *sdO = sQ + 2 * BQ * LD;
    bf16 *sS = sdO + 2 * BQ * LD;
    float *sL = (float *)(sS + BK * LDS), *sD = sL + 2 * BQ;
    __shared__ unsigned s_ticket;
    const int nkt = (T + BK - 1) / BK, NG = B * NKV;
    if (threadIdx.x == 0) {
        const unsigned t = atomicAdd(ticket, 1u);
        if (t == gridDim.x - 1) { atomicExch(ticket, 0u); }
        s_ticket = t;
    }
    __syncthreads();
    const int tk = (int)s_ticket;
    int j, grp;
    if (TICK == 0) { j = nkt - 1 - tk / NG; grp = tk % NG; }
    else if (TICK == 1) { j = tk / NG; grp = tk % NG; }
    else {   // batches of SB groups
        const int g0 = tk / (SB * nkt) * SB, sb = min(SB, NG - g0), r = tk - g0 * nkt;
        j = r / sb; grp = g0 + r % sb;
    }
    const int kvh = grp % NKV, b = grp / NKV;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int G = NH / NKV, k0 = j * BK, kw0 = k0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const int nq = nkt - j, nit = G * nq;
    auto head_of = [&](int it) { return kvh * G + (LOCK ? it % G : it / nq); };
    auto qtile_of = [&](int it) { return LOCK ? nkt - 1 - it / G : j + it % nq; };

    auto issue = [&](int it, int buf) {
        const int h = head_of(it), qt0 = qtile_of(it) * BQ;
        const size_t go = ((size_t)b * T + qt0) * qs + (size_t)h * HD;
        load_tile_n<BQ, HD, NT>(sQ + buf * BQ * LD, q + go, qs, T - qt0);
        load_tile_n<BQ, HD, NT>(sdO + buf * BQ * LD, dout + go, qs, T - qt0);
        if (threadIdx.x < 2 * BQ) {
            const int i = threadIdx.x % BQ, isL = threadIdx.x < BQ;
            float *dst = (isL ? sL : sD) + buf * BQ + i;
            if (qt0 + i < T) { cp_async4(dst, (isL ? lse : Dd) + ((size_t)b * NH + h) * T + qt0 + i); }
            else { *dst = isL ? INFINITY : 0.f; }
        }
    };
    const size_t kgo = ((size_t)b * T + k0) * ks + (size_t)kvh * HD;
    load_tile_n<BK, HD, NT>(sK, k + kgo, ks, T - k0);
    load_tile_n<BK, HD, NT>(sV, v + kgo, ks, T - k0);
    issue(0, 0);
    cp_async_commit();

    uint32_t kf[HD / 16][4], vf[HD / 16][4];
    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) { dka[n][e] = 0.f; dva[n][e] = 0.f; }

    unsigned *rel_ptr = nullptr;   // this warp's turn counter still to pass on, and its new value
    unsigned rel_val = 0;
    for (int it = 0; it < nit; it++) {
        if (it + 1 < nit) {
            issue(it + 1, (it + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();   // tile it in smem; every warp done with tile it-1's sS
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                ldsm_x4(kf[kk], a_addr(sK, LD, warp * 16, kk * 16, lane));
                ldsm_x4(vf[kk], a_addr(sV, LD, warp * 16, kk * 16, lane));
            }
        }
        const int buf = it & 1, h = head_of(it), i = qtile_of(it), qt0 = i * BQ, r0 = qt0 + warp * 16;
        const bf16 *cQ = sQ + buf * BQ * LD, *cdO = sdO + buf * BQ * LD;
        const float *cL = sL + buf * BQ, *cD = sD + buf * BQ;
        unsigned *cnt = turns + (((size_t)b * NH + h) * nkt + i) * 4 + warp;
        const unsigned turn = CHAIN == 1 ? (unsigned)(i - j) : (unsigned)j;
        const bool first = CHAIN == 1 ? i == j : j == 0, last = CHAIN == 1 ? j == 0 : j == i;
        unsigned seen = ~0u;
        if (CHAIN != 0 && DQ && PREPOLL && !first && lane == 0) { seen = ld_relaxed(cnt); }
        {
            float s[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
            for (int n = 0; n < BQ / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) { s[n][e] = 0.f; dp[n][e] = 0.f; }
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int nn = 0; nn < BQ / 16; nn++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bn_addr(cQ, LD, nn * 16, kk * 16, lane));
                    mma16816(s[2 * nn], kf[kk], bb[0], bb[1]);
                    mma16816(s[2 * nn + 1], kf[kk], bb[2], bb[3]);
                    ldsm_x4(bb, bn_addr(cdO, LD, nn * 16, kk * 16, lane));
                    mma16816(dp[2 * nn], vf[kk], bb[0], bb[1]);
                    mma16816(dp[2 * nn + 1], vf[kk], bb[2], bb[3]);
                }
            }
            const bool mask = qt0 < kw0 + 15;
#pragma unroll
            for (int n = 0; n < BQ / 8; n++) {
                const float2 L = *(const float2 *)(cL + n * 8 + 2 * t4), D = *(const float2 *)(cD + n * 8 + 2 * t4);
                const float L2[2] = {L.x * LOG2E, L.y * LOG2E}, Dv[2] = {D.x, D.y};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(fmaf(s[n][e], sl2, -L2[e & 1]));
                    if (mask && qt0 + n * 8 + 2 * t4 + (e & 1) < kw0 + g + (e >> 1) * 8) { p = 0.f; }
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - Dv[e & 1]);
                }
            }
            if (DQ) {
#pragma unroll
                for (int n = 0; n < BQ / 8; n++) {
                    *(uint32_t *)(sS + (warp * 16 + g) * LDS + n * 8 + 2 * t4) = pack_bf16(dp[n][0], dp[n][1]);
                    *(uint32_t *)(sS + (warp * 16 + g + 8) * LDS + n * 8 + 2 * t4) = pack_bf16(dp[n][2], dp[n][3]);
                }
            }
            // pass on the previous tile's turn: its adds were issued before this tile's first barrier
            // and (like the pre-poll load) are back by now, so the release's fence has nothing to wait for
            if (CHAIN != 0 && DQ && rel_ptr != nullptr) {
                __syncwarp();
                if (lane == 0) { st_release(rel_ptr, rel_val); }
                rel_ptr = nullptr;
            }
#pragma unroll
            for (int kc = 0; kc < BQ / 16; kc++) {
                uint32_t ap[4], ad[4];
                ap[0] = pack_bf16(s[2 * kc][0], s[2 * kc][1]); ap[1] = pack_bf16(s[2 * kc][2], s[2 * kc][3]);
                ap[2] = pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]); ap[3] = pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3]);
                ad[0] = pack_bf16(dp[2 * kc][0], dp[2 * kc][1]); ad[1] = pack_bf16(dp[2 * kc][2], dp[2 * kc][3]);
                ad[2] = pack_bf16(dp[2 * kc + 1][0], dp[2 * kc + 1][1]); ad[3] = pack_bf16(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bt_addr(cdO, LD, kc * 16, dn * 16, lane));
                    mma16816(dva[2 * dn], ap, bb[0], bb[1]);
                    mma16816(dva[2 * dn + 1], ap, bb[2], bb[3]);
                    ldsm_x4_t(bb, bt_addr(cQ, LD, kc * 16, dn * 16, lane));
                    mma16816(dka[2 * dn], ad, bb[0], bb[1]);
                    mma16816(dka[2 * dn + 1], ad, bb[2], bb[3]);
                }
            }
        }
        if (DQ) {
            __syncthreads();   // sS complete
            float dqc[HD / 8][4];
#pragma unroll
            for (int n = 0; n < HD / 8; n++) { dqc[n][0] = dqc[n][1] = dqc[n][2] = dqc[n][3] = 0.f; }
            const int kcmax = qt0 == k0 ? warp + 1 : BK / 16;   // diagonal tile: dS = 0 past the warp's rows
#pragma unroll
            for (int kc = 0; kc < BK / 16; kc++) {
                if (kc < kcmax) {
                    uint32_t a[4];
                    ldsm_x4_t(a, bn_addr(sS, LDS, kc * 16, warp * 16, lane));
#pragma unroll
                    for (int dn = 0; dn < HD / 16; dn++) {
                        uint32_t bb[4];
                        ldsm_x4_t(bb, bt_addr(sK, LD, kc * 16, dn * 16, lane));
                        mma16816(dqc[2 * dn], a, bb[0], bb[1]);
                        mma16816(dqc[2 * dn + 1], a, bb[2], bb[3]);
                    }
                }
            }
            if (CHAIN != 0 && !first) {   // this warp's turn of (b, h, q tile i)
                if (lane == 0) {
                    if (PREPOLL && seen == turn) {
                        fence_acq_rel_gpu();   // strong read + fence: an acquire pattern
                    } else {
                        unsigned polls = 0;
                        while (ld_acquire(cnt) != turn) {
                            __nanosleep(32);
                            if (++polls == (1u << 26)) { __trap(); }
                        }
                    }
                }
                __syncwarp();
            }
            const size_t ro = ((size_t)b * T + r0) * qs + (size_t)h * HD;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int row = g + 8 * half;
                if (r0 + row < T) {
#pragma unroll
                    for (int n = 0; n < HD / 8; n++) {
                        float *p = dq + ro + (size_t)row * qs + n * 8 + 2 * t4;
                        const float x = dqc[n][2 * half] * scale, y = dqc[n][2 * half + 1] * scale;
                        if (first) { __stcg((float2 *)p, make_float2(x, y)); }
                        else { red_add_v2(p, x, y); }
                    }
                }
            }
            if (CHAIN != 0) {
                if (last) {
                    if (lane == 0) { st_relaxed(cnt, 0u); }   // nobody reads it again in this launch
                } else {
                    rel_ptr = cnt;
                    rel_val = turn + 1;
                }
            }
        } else {
            __syncthreads();   // no dQ: no "sS complete" barrier, so guard the buffers of the next prefetch here
        }
    }
    if (CHAIN != 0 && DQ && rel_ptr != nullptr) {
        __syncwarp();
        if (lane == 0) { st_release(rel_ptr, rel_val); }
    }
    if (kw0 >= T) { return; }
    store_rows_out<HD>(dk + kgo + (size_t)warp * 16 * ks, ks, dka, scale, T - kw0, lane);
    store_rows_out<HD>(dv + kgo + (size_t)warp * 16 * ks, ks, dva, 1.f, T - kw0, lane);
}

// ----------------------------------------------------------------------------
// v5 forward: Hopper's own instructions (sm_90a). FlashAttention-2's algorithm as v2/v3
// (online softmax in base 2, P kept in registers), executed by:
//   - wgmma.mma_async m64nNk16 (bf16 in, fp32 accumulate), one warpgroup (4 warps, 128
//     threads) per 64 query rows: S = Q K^T with A = Q and B = K both from shared memory
//     (K-major descriptors), O += P V with A = P from registers and B = V from shared
//     memory (N-major descriptor: V is stored key-major, so wgmma transposes it);
//   - TMA (cp.async.bulk.tensor.2d) for the Q, K and V tiles, in the 128-byte swizzle,
//     with a CUtensorMap per tensor made on the host (cuTensorMapEncodeTiled through
//     cudaGetDriverEntryPointByVersion: no -lcuda);
//   - an mbarrier pipeline of ST stages: per stage a "K full" and a "V full" barrier
//     (producer's arrive.expect_tx + TMA bytes) and an "empty" barrier (8 consumer warps
//     arrive when their wgmmas reading the stage completed);
//   - warp specialisation: warps 0-7 = two consumer warpgroups (128 query rows), warp 8 =
//     producer (one lane issues every TMA). 288 threads, one block per SM by registers.
// Shared-memory tiles: a tile of R rows x HD columns is HD/64 panels of R x 64 bf16, one
// 128-byte row per tile row, each panel 1024-byte aligned; TMA's 128-byte swizzle stores
// the 16-byte chunk c of row r at chunk c ^ (r % 8) (XOR of address bits 4-6 with 7-9),
// which is the layout wgmma's swizzle mode 1 reads. v5_selftest() (--cpu-selftest)
// replays the whole index arithmetic on the host.
// Fragment layouts (PTX ISA, wgmma m64nNk16, warp w of the warpgroup, g = lane/4, t = lane%4):
//   accumulator d[4i + 2h + e] = D[16w + g + 8h][8i + 2t + e]   (i < N/8, h, e in {0,1})
//   register A  a[r], r = 2i + h, halves e = A[16w + g + 8h][8i + 2t + e]   (i, h in {0,1})
// so S's accumulator of keys 16kc..16kc+15, rounded pairwise to bf16, is P's A fragment:
// a[kc] = {d[8kc], d[8kc+1]}, {d[8kc+2], d[8kc+3]}, {d[8kc+4], d[8kc+5]}, {d[8kc+6], d[8kc+7]}.
// grid (NH, B, ceil(T/128)), the q tile slowest and heaviest first; limits: HD 64 or 128, any T.
// Any T: the tensor maps are 3D (columns, T, B), so a tile's rows past T are out of bounds of
// its own batch and TMA fills them with zeros (and still counts the whole box's bytes); keys past
// T are later than every row < T, so the causal mask drops them; kv tiles wholly past the block's
// last row < T are not visited; rows past T are computed (the wgmmas are warpgroup-wide) but their
// out and lse are not stored.

// descriptor of a shared-memory operand in the 128-byte swizzle (mode 1 in bits 62-63):
// start address >> 4 in bits 0-13, leading byte offset >> 4 in bits 16-29, stride byte
// offset >> 4 in bits 32-45, base offset 0 (every panel starts on a 1024-byte boundary).
// K-major (Q, K): rows of 128 bytes, SBO = 1024 between groups of 8 rows, LBO unused (1).
// N-major (V): k rows of 128 bytes (64 n), SBO = 1024 between groups of 8 k rows, LBO =
// the byte offset between 64-column panels (unused by the n64 instructions v5 issues).
__host__ __device__ __forceinline__ uint64_t v5_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
// byte offset, from a 1024-byte aligned panel, where TMA's 128-byte swizzle puts element (row, col) (col < 64)
__host__ __device__ __forceinline__ uint32_t v5_swz(uint32_t row, uint32_t col) {
    const uint32_t lin = row * 128 + col * 2;
    return lin ^ (((lin >> 7) & 7) << 4);
}

// MODE (the variant): 0 = producer warp, overlapped consumers; 1 = producer warp, serial consumers;
// 2 = no producer warp (thread 0 issues the copies between its own steps), serial consumers, 256
// threads and 2 stages so that two blocks share an SM; 3 = 0 with the warpgroups issuing in turns;
// 4 = 2's block (no producer warp, 256 threads) with each warpgroup's S_{j+1} and P_{j-1} V_{j-1} in
// flight during the softmax of S_j (two S accumulators, ping-pong), kv tiles of 64, 4 stages;
// 5 = 2's block with P_{j-1} V_{j-1} in flight during the softmax of S_j (one S accumulator).
template <int HD, int MODE = 0>
struct V5Cfg {
    // Modes 0 and 1, one block per SM: ptxas caps 288 threads at 168 registers (it counts whole
    // warpgroups: 384 x 168 = 64K), and two such blocks at 96, which spills the 64 S + 32 O
    // accumulators; HD 128 takes kv tiles of 64 so that S (32), P (16) and O (64 registers) of the
    // overlapped mode fit in 168. Mode 2: 2 x 256 threads x 128 registers, 2 x (82 or 99 KB) smem.
    // Mode 4 holds two S (2 x 32 at BC = 64), P (16) and O (32 or 64 registers) at once: one block
    // per SM at both head sizes (ptxas: 146 / 190 registers, 81 / 161 KB smem); capped at 128
    // registers for two blocks it spills (HD 64: 248 bytes, and serialises the wgmmas, C7512), and
    // BC = 128 needs 255 with spills. ST >= 3: step j issues S_{j+1} before it releases tile j - 1.
    // Mode 5 holds one S, P and O: two blocks per SM at HD 64 (116 registers, 2 x 81 KB); at HD 128
    // two blocks would spill (168 bytes, C7512), so one (148 registers, 161 KB).
    static constexpr bool PRODUCER = MODE < 4 && MODE != 2;   // warp 8 issues every copy
    static constexpr int BR = 128, BC = HD == 64 && MODE < 4 ? 128 : 64, NP = HD / 64;
    static constexpr int ST = MODE == 2 ? 2 : HD == 64 || MODE >= 4 ? 4 : 3;
    static constexpr int THREADS = PRODUCER ? 288 : 256, MINB = MODE == 2 || (MODE == 5 && HD == 64) ? 2 : 1;
    static constexpr int PANEL_Q = BR * 128, PANEL_KV = BC * 128;   // bytes of one 64-column panel
    static constexpr int Q_BYTES = NP * PANEL_Q, KV_BYTES = NP * PANEL_KV;
    static constexpr int NBARS = 1 + 3 * ST;                         // q full; per stage K full, V full, empty
    static constexpr size_t SMEM = 1024 + Q_BYTES + 2 * (size_t)ST * KV_BYTES + 8 * NBARS;   // + alignment slack
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define V5_DEVICE 1
#endif

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

#ifdef V5_DEVICE
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
// waits for the completion of the barrier's phase with this parity; a wait past 2^34 clocks (~10 s)
// is a pipeline bug: trap, so the launch fails instead of hanging the device
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    uint32_t done = 0;
    long long t0 = 0;
    for (int spin = 0; ; spin++) {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_u32(b)), "r"(parity) : "memory");
        if (done) { return; }
        if (spin == 0) { t0 = clock64(); }
        else if (clock64() - t0 > (1ll << 34)) { __trap(); }
    }
}
// rows [t, t + box rows) x columns [c0, c0 + 64) of batch b of the 3D tensor map (columns, T, B) into dst,
// completing the box's tx bytes on bar; rows past T arrive as zeros
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int t, int b) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(c0), "r"(t), "r"(b), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// the compiler must not move accumulator reads or writes across the asynchronous wgmma window
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) { asm volatile("" : "+f"(d[i])::"memory"); }
}

template <int N>
__device__ __forceinline__ void reg_fence_u(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int r = 0; r < 4; r++) { asm volatile("" : "+r"(a[i][r])::"memory"); }
}

// operand lists of the accumulators: read-write (scale-d 1), or write-only (scale-d 0: D = A B, the
// old d is not read, so it need not be live)
#define V5_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
#define V5_W8(i) "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3]), "=f"(d[i + 4]), "=f"(d[i + 5]), \
                 "=f"(d[i + 6]), "=f"(d[i + 7])
#define V5_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define V5_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
// d (64 x N fp32) = A (64 x 16, smem, K-major) * B (16 x N, smem, K-major) + (SD ? d : 0), N = 128 or 64
template <int N, int SD>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db) {
    static_assert(N == 128 || N == 64, "v5 issues n128 and n64 only");
    if constexpr (N == 128 && SD) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " V5_D64 "%64, %65, 1, 1, 1, 0, 0;\n"
                     : V5_F8(0), V5_F8(8), V5_F8(16), V5_F8(24), V5_F8(32), V5_F8(40), V5_F8(48), V5_F8(56)
                     : "l"(da), "l"(db));
    } else if constexpr (N == 128) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " V5_D64 "%64, %65, 0, 1, 1, 0, 0;\n"
                     : V5_W8(0), V5_W8(8), V5_W8(16), V5_W8(24), V5_W8(32), V5_W8(40), V5_W8(48), V5_W8(56)
                     : "l"(da), "l"(db));
    } else if constexpr (SD) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " V5_D32 "%32, %33, 1, 1, 1, 0, 0;\n"
                     : V5_F8(0), V5_F8(8), V5_F8(16), V5_F8(24)
                     : "l"(da), "l"(db));
    } else {
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " V5_D32 "%32, %33, 0, 1, 1, 0, 0;\n"
                     : V5_W8(0), V5_W8(8), V5_W8(16), V5_W8(24)
                     : "l"(da), "l"(db));
    }
}
// d (64 x 64 fp32) += A (64 x 16, registers) * B (16 x 64, smem, N-major: imm-trans-b = 1)
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " V5_D32 "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : V5_F8(0), V5_F8(8), V5_F8(16), V5_F8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#undef V5_F8
#undef V5_W8
#undef V5_D32
#undef V5_D64
#endif

// Mode 4's step order for one warpgroup over its n >= 1 kv tiles, shared by the kernel and its host
// model (v5_order_selftest, --cpu-selftest). x(op, s, j) performs one operation: op a V5Op tag, s which
// S accumulator (0: sc, 1: sb; a tag, so that each array keeps its registers), j a kv tile.
// Step j < n - 1 starts with S_j complete in cur and P_{j-1} V_{j-1} in flight (j > 0):
//   issue S_{j+1} into nxt; softmax of S_j (reads cur only); wait_group 1 retires P_{j-1} V_{j-1};
//   release tile j - 1 (thread 0: refill its stage with tile j - 1 + ST); O *= alpha; P_j = cur;
//   issue P_j V_j; wait_group 1 retires S_{j+1}.
// So the softmax of S_j runs under S_{j+1} and P_{j-1} V_{j-1}, and no instruction but a wgmma touches
// the registers of a group in flight (else ptxas serialises the wgmmas: C7514, C7515). The last step
// has no next S. A warpgroup's last tile is never released: its stage is not refilled (below).
enum V5Op { V5_WAIT_K, V5_WAIT_V, V5_ISSUE_S, V5_ISSUE_PV, V5_WAIT1, V5_WAIT0, V5_FENCE_S, V5_FENCE_OP, V5_SOFTMAX,
            V5_RESCALE, V5_PACK, V5_RELEASE, V5_REFILL };
template <int K> using v5_tag = std::integral_constant<int, K>;
template <class X>
__host__ __device__ __forceinline__ void v5_overlap_order(X &x, int n) {
    const v5_tag<0> A;
    const v5_tag<1> B;
    auto retire_pv = [&](auto cur, int j, auto wait) {   // P_{j-1} V_{j-1} complete: O, pa free
        x(wait, cur, 0);
        x(v5_tag<V5_FENCE_OP>(), cur, 0);
        if (j > 0) { x(v5_tag<V5_RELEASE>(), cur, j - 1); x(v5_tag<V5_REFILL>(), cur, j - 1); }
        x(v5_tag<V5_RESCALE>(), cur, j);
        x(v5_tag<V5_PACK>(), cur, j);
        x(v5_tag<V5_WAIT_V>(), cur, j);
        x(v5_tag<V5_ISSUE_PV>(), cur, j);
    };
    auto step = [&](auto cur, auto nxt, int j) {
        x(v5_tag<V5_WAIT_K>(), nxt, j + 1);
        x(v5_tag<V5_ISSUE_S>(), nxt, j + 1);
        x(v5_tag<V5_SOFTMAX>(), cur, j);
        retire_pv(cur, j, v5_tag<V5_WAIT1>());
        x(v5_tag<V5_WAIT1>(), nxt, 0);   // S_{j+1} complete; P_j V_j may run
        x(v5_tag<V5_FENCE_S>(), nxt, 0);
    };
    auto last = [&](auto cur, int j) {
        x(v5_tag<V5_SOFTMAX>(), cur, j);
        retire_pv(cur, j, v5_tag<V5_WAIT0>());
        x(v5_tag<V5_WAIT0>(), cur, 0);
        x(v5_tag<V5_FENCE_S>(), cur, 0);
        x(v5_tag<V5_FENCE_OP>(), cur, 0);
    };
    x(v5_tag<V5_WAIT_K>(), A, 0);
    x(v5_tag<V5_ISSUE_S>(), A, 0);
    x(v5_tag<V5_WAIT0>(), A, 0);
    x(v5_tag<V5_FENCE_S>(), A, 0);
    int j = 0;
    for (; j + 2 < n; j += 2) {   // steps j and j + 1, neither the last: S_j in sc, S_{j+1} in sb
        step(A, B, j);
        step(B, A, j + 1);
    }
    if (j + 1 < n) {
        step(A, B, j);
        last(B, j + 1);
    } else {
        last(A, j);
    }
}

// Mode 5's order (FlashAttention-3's algorithm 2, one S accumulator; x and n as above). Step j >= 1
// starts with P_{j-1} in pa and nothing in flight: issue S_j; O *= alpha_{j-1}; issue P_{j-1} V_{j-1};
// wait_group 1 retires S_j; softmax of S_j (under P_{j-1} V_{j-1}); wait_group 0; release tile j - 1
// (thread 0: refill); P_j = S_j. The last P V after the loop. Only P V runs under a softmax.
template <class X>
__host__ __device__ __forceinline__ void v5_fa3_order(X &x, int n) {
    const v5_tag<0> A;
    x(v5_tag<V5_WAIT_K>(), A, 0);
    x(v5_tag<V5_ISSUE_S>(), A, 0);
    x(v5_tag<V5_WAIT0>(), A, 0);
    x(v5_tag<V5_FENCE_S>(), A, 0);
    x(v5_tag<V5_SOFTMAX>(), A, 0);
    x(v5_tag<V5_PACK>(), A, 0);
    for (int j = 1; j < n; j++) {
        x(v5_tag<V5_WAIT_K>(), A, j);
        x(v5_tag<V5_ISSUE_S>(), A, j);
        x(v5_tag<V5_RESCALE>(), A, j - 1);
        x(v5_tag<V5_WAIT_V>(), A, j - 1);
        x(v5_tag<V5_ISSUE_PV>(), A, j - 1);
        x(v5_tag<V5_WAIT1>(), A, 0);   // S_j complete; P_{j-1} V_{j-1} may run
        x(v5_tag<V5_FENCE_S>(), A, 0);
        x(v5_tag<V5_SOFTMAX>(), A, j);
        x(v5_tag<V5_WAIT0>(), A, 0);   // P_{j-1} V_{j-1} complete: O, pa free
        x(v5_tag<V5_FENCE_OP>(), A, 0);
        x(v5_tag<V5_RELEASE>(), A, j - 1);
        x(v5_tag<V5_REFILL>(), A, j - 1);
        x(v5_tag<V5_PACK>(), A, j);
    }
    x(v5_tag<V5_RESCALE>(), A, n - 1);
    x(v5_tag<V5_WAIT_V>(), A, n - 1);
    x(v5_tag<V5_ISSUE_PV>(), A, n - 1);
    x(v5_tag<V5_WAIT0>(), A, 0);
    x(v5_tag<V5_FENCE_S>(), A, 0);
    x(v5_tag<V5_FENCE_OP>(), A, 0);
}

template <int HD, int MODE>
__global__ void __launch_bounds__(V5Cfg<HD, MODE>::THREADS, V5Cfg<HD, MODE>::MINB)
attention_forward_wgmma_kernel(bf16 *out, float *lse, const __grid_constant__ CUtensorMap tq,
                               const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                               int T, int NH, int NKV, float sl2) {
#ifdef V5_DEVICE
    using C = V5Cfg<HD, MODE>;
    constexpr int BR = C::BR, BC = C::BC, NP = C::NP, ST = C::ST;
    extern __shared__ unsigned char v5_smem[];
    unsigned char *sQ = v5_smem + ((1024 - (smem_u32(v5_smem) & 1023)) & 1023);
    unsigned char *sK = sQ + C::Q_BYTES, *sV = sK + ST * C::KV_BYTES;
    uint64_t *qfull = (uint64_t *)(sV + ST * C::KV_BYTES), *kfull = qfull + 1, *vfull = kfull + ST, *empty = vfull + ST;
    // the q tile is the slowest grid index, heaviest first: every heavy block of the grid starts before
    // any light one (one block per SM leaves no other block to fill a late heavy block's tail)
    const int qb = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y;
    const int kvh = h / (NH / NKV), q0 = qb * BR, nkv = (min(q0 + BR, T) - 1) / BC + 1;   // up to the last row < T
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        mbar_init(qfull, 1);
        for (int s = 0; s < ST; s++) { mbar_init(kfull + s, 1); mbar_init(vfull + s, 1); mbar_init(empty + s, 8); }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // visible to the async proxy (TMA)
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();

    auto load_q = [&]() {
        mbar_expect_tx(qfull, C::Q_BYTES);
        for (int p = 0; p < NP; p++) { tma_load_3d(sQ + p * C::PANEL_Q, &tq, qfull, h * HD + 64 * p, q0, b); }
    };
    auto load_kv = [&](int j) {   // K and V of kv tile j into stage j % ST (free: released or never used)
        const int s = j % ST;
        mbar_expect_tx(kfull + s, C::KV_BYTES);
        for (int p = 0; p < NP; p++) {
            tma_load_3d(sK + s * C::KV_BYTES + p * C::PANEL_KV, &tk, kfull + s, kvh * HD + 64 * p, j * BC, b);
        }
        mbar_expect_tx(vfull + s, C::KV_BYTES);
        for (int p = 0; p < NP; p++) {
            tma_load_3d(sV + s * C::KV_BYTES + p * C::PANEL_KV, &tv, vfull + s, kvh * HD + 64 * p, j * BC, b);
        }
    };
    if (C::PRODUCER && warp == 8) {   // producer: one lane issues every copy; waits for a stage's release to refill it
        if (lane == 0) {
            load_q();
            for (int j = 0; j < nkv; j++) {
                // tile j is stage j % ST's (j / ST)-th use: wait for the release of its previous use, phase j / ST - 1
                if (j >= ST) { mbar_wait(empty + j % ST, ((j / ST) + 1) & 1); }
                load_kv(j);
            }
        }
        return;
    }
    if (!C::PRODUCER && threadIdx.x == 0) {   // the first ST tiles; the rest after each release (below)
        load_q();
        for (int j = 0; j < ST && j < nkv; j++) { load_kv(j); }
    }

    // consumers: warpgroup wg owns rows q0 + 64 wg .. +63, warp wl of it rows rw .. rw + 15
    const int wg = warp / 4, wl = warp % 4, g = lane / 4, t4 = lane % 4;
    const int rw = q0 + wg * 64 + wl * 16;
    float o[NP][32], sc[BC / 2], sb[BC / 2];   // sb: mode 4's second S accumulator (unused, so absent, elsewhere)
    uint32_t pa[BC / 16][4];
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int i = 0; i < 32; i++) { o[p][i] = 0.f; }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
    const uint32_t qaddr = smem_u32(sQ) + wg * 64 * 128;
    mbar_wait(qfull, 0);
    __syncwarp();   // the warp converged (mode 2: lane 0 of warp 0 issued copies) before .aligned instructions

    auto wait_k = [&](int j) { mbar_wait(kfull + j % ST, (j / ST) & 1); __syncwarp(); };
    auto wait_v = [&](int j) { mbar_wait(vfull + j % ST, (j / ST) & 1); __syncwarp(); };
    // S_j = Q K_j^T into sacc (sc; mode 4: sc or sb; the first k step overwrites it), K_j landed: issued and
    // committed, not waited for
    auto issue_s = [&](float (&sacc)[BC / 2], int j) {
        const uint32_t kaddr = smem_u32(sK + (j % ST) * C::KV_BYTES);
        wgmma_fence();
        // k16 step kk: panel kk / 4, 32 bytes a step inside it
        wgmma_ss<BC, 0>(sacc, v5_desc(qaddr, 16, 1024), v5_desc(kaddr, 16, 1024));
#pragma unroll
        for (int kk = 1; kk < HD / 16; kk++) {
            const uint32_t koff = (kk % 4) * 32;
            wgmma_ss<BC, 1>(sacc, v5_desc(qaddr + (kk / 4) * C::PANEL_Q + koff, 16, 1024),
                            v5_desc(kaddr + (kk / 4) * C::PANEL_KV + koff, 16, 1024));
        }
        wgmma_commit();
    };
    // on a completed S_j in sacc: causal mask, running max m, alpha = exp2(m_old - m_new),
    // sacc = P_j = exp2(s sl2 - m), l
    auto softmax = [&](float (&sacc)[BC / 2], int j) {
        const int k0 = j * BC;
        if (k0 + BC - 1 > rw) {   // the tile crosses the diagonal of some row of this warp
#pragma unroll
            for (int i = 0; i < BC / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (k0 + 8 * i + 2 * t4 + (e & 1) > rw + g + 8 * (e >> 1)) { sacc[4 * i + e] = -INFINITY; }
                }
        }
        // as v2: tile 0 holds key 0, visible to every row, so m is finite from then on
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < BC / 8; i++) { mx = fmaxf(mx, fmaxf(sacc[4 * i + 2 * r], sacc[4 * i + 2 * r + 1])); }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(m[r], mx * sl2);
            alpha[r] = exp2f(m[r] - mnew);
            m[r] = mnew;
            l[r] *= alpha[r];
#pragma unroll
            for (int i = 0; i < BC / 8; i++) {
                sacc[4 * i + 2 * r] = exp2f(fmaf(sacc[4 * i + 2 * r], sl2, -mnew));
                sacc[4 * i + 2 * r + 1] = exp2f(fmaf(sacc[4 * i + 2 * r + 1], sl2, -mnew));
                l[r] += sacc[4 * i + 2 * r] + sacc[4 * i + 2 * r + 1];
            }
        }
    };
    auto rescale = [&]() {
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                o[p][4 * i] *= alpha[0]; o[p][4 * i + 1] *= alpha[0];
                o[p][4 * i + 2] *= alpha[1]; o[p][4 * i + 3] *= alpha[1];
            }
    };
    // P_j (in sacc) -> bf16 A fragments pa (register pairs of the accumulator, see the top comment)
    auto pack = [&](const float (&sacc)[BC / 2]) {
#pragma unroll
        for (int kc = 0; kc < BC / 16; kc++) {
            pa[kc][0] = pack_bf16(sacc[8 * kc], sacc[8 * kc + 1]);
            pa[kc][1] = pack_bf16(sacc[8 * kc + 2], sacc[8 * kc + 3]);
            pa[kc][2] = pack_bf16(sacc[8 * kc + 4], sacc[8 * kc + 5]);
            pa[kc][3] = pack_bf16(sacc[8 * kc + 6], sacc[8 * kc + 7]);
        }
    };
    // O += P_j V_j, V_j landed: issued and committed, not waited for
    auto issue_pv = [&](int j) {
        const uint32_t vaddr = smem_u32(sV + (j % ST) * C::KV_BYTES);
#pragma unroll
        for (int p = 0; p < NP; p++) { reg_fence(o[p]); }
        reg_fence_u(pa);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < BC / 16; kc++)   // k16 step kc: key rows 16 kc.., 2048 bytes a step
#pragma unroll
            for (int p = 0; p < NP; p++) {
                wgmma_rs_n64(o[p], pa[kc], v5_desc(vaddr + p * C::PANEL_KV + kc * 2048, C::PANEL_KV, 1024));
            }
        wgmma_commit();
    };
    // after the wgmmas reading stage j % ST completed: this warp releases the stage to the producer
    auto release = [&](int j) {
        __syncwarp();
        if (lane == 0) { mbar_arrive(empty + j % ST); }
    };
    auto settle = [&]() {   // every issued wgmma of this thread completed; its registers are final
        wgmma_wait<0>();
        reg_fence(sc);
#pragma unroll
        for (int p = 0; p < NP; p++) { reg_fence(o[p]); }
        reg_fence_u(pa);
    };

    // mode 3: the warpgroups take turns to issue their wgmmas (named barriers 1 + wg, 256 threads:
    // one warpgroup's bar.sync completes on the other's bar.arrive), so that one's softmax runs
    // while the other's matrix products do. Each waits for its data before taking its turn.
    // Counts: each barrier sees nkv + 1 syncs and nkv + 1 arrivals, never two arrivals ahead.
    auto turn_take = [&]() {   // barrier 1 + wg (immediate ids: ptxas then reserves 3 barriers, not 16)
        if (MODE != 3) { return; }
        if (wg == 0) { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
        else { asm volatile("bar.sync 2, 256;\n" ::: "memory"); }
    };
    auto turn_pass = [&]() {   // barrier 2 - wg: the other warpgroup's
        if (MODE != 3) { return; }
        if (wg == 0) { asm volatile("bar.arrive 2, 256;\n" ::: "memory"); }
        else { asm volatile("bar.arrive 1, 256;\n" ::: "memory"); }
    };

    if (MODE == 1 || MODE == 2) {   // S_j, softmax, P_j V_j, one after the other
        for (int j = 0; j < nkv; j++) {
            wait_k(j);
            issue_s(sc, j);
            settle();
            softmax(sc, j);
            rescale();
            pack(sc);
            wait_v(j);
            issue_pv(j);
            settle();
            release(j);
            if (MODE == 2) {
                // thread 0 refills stage j % ST with tile j + ST once all 8 warps released tile j (phase j / ST)
                if (threadIdx.x == 0 && j + ST < nkv) {
                    mbar_wait(empty + j % ST, (j / ST) & 1);
                    load_kv(j + ST);
                }
                __syncwarp();   // warp 0 reconverges before its next .aligned wgmma instructions
            }
        }
    } else if (MODE == 4 || MODE == 5) {   // the orders v5_overlap_order (4) and v5_fa3_order (5)
        static_assert(MODE != 4 || (ST >= 3 && BC >= 64), "mode 4: the ring must hold tiles j - 1..j + 1");
        static_assert(MODE != 5 || (ST >= 2 && BC >= 64), "mode 5: the ring must hold tiles j - 1..j");
        // A warpgroup visits its own kv tiles: warpgroup 0's rows end 64 earlier, so at BC = 64 it
        // stops one tile short of the block's nkv (that tile lies wholly after its rows: p = 0 and
        // alpha = 1 there, it would add nothing). Tile j's stage is released in step j + 1, after
        // P_j V_j retired, and refilled by thread 0 with tile j + ST; before that release step j waits
        // for tile j + 1 in mode 4 (loaded in step j + 2 - ST < j: ST >= 3) and for tile j in mode 5
        // (step j + 1 - ST < j: ST >= 2): no cycle. No tile after the block's last needs a
        // warpgroup's last stage (n - 1 + ST >= nkv - 2 + ST > nkv - 1): the last tile is not released.
        const int n = (min(q0 + 64 * wg + 64, T) - 1) / BC + 1;   // nkv or nkv - 1
        auto x = [&](auto op, auto which, int j) {
            constexpr int OP = decltype(op)::value;
            float(&sacc)[BC / 2] = decltype(which)::value ? sb : sc;
            if constexpr (OP == V5_WAIT_K) { wait_k(j); }
            else if constexpr (OP == V5_WAIT_V) { wait_v(j); }
            else if constexpr (OP == V5_ISSUE_S) { issue_s(sacc, j); }
            else if constexpr (OP == V5_ISSUE_PV) { issue_pv(j); }
            else if constexpr (OP == V5_WAIT1) { wgmma_wait<1>(); }
            else if constexpr (OP == V5_WAIT0) { wgmma_wait<0>(); }
            else if constexpr (OP == V5_FENCE_S) { reg_fence(sacc); }
            else if constexpr (OP == V5_FENCE_OP) {
#pragma unroll
                for (int p = 0; p < NP; p++) { reg_fence(o[p]); }
                reg_fence_u(pa);
            }
            else if constexpr (OP == V5_SOFTMAX) { softmax(sacc, j); }
            else if constexpr (OP == V5_RESCALE) { rescale(); }
            else if constexpr (OP == V5_PACK) { pack(sacc); }
            else if constexpr (OP == V5_RELEASE) { release(j); }
            else {   // V5_REFILL: thread 0 loads tile j + ST into tile j's stage once all 8 warps released it
                if (threadIdx.x == 0 && j + ST < nkv) {
                    mbar_wait(empty + j % ST, (j / ST) & 1);
                    load_kv(j + ST);
                }
                __syncwarp();   // warp 0 reconverges before its next .aligned wgmma instructions
            }
        };
        if constexpr (MODE == 4) { v5_overlap_order(x, n); } else { v5_fa3_order(x, n); }
    } else {          // modes 0, 3: S_{j+1} and P_j V_j in flight while the softmax of S_{j+1} runs
        wait_k(0);
        if (MODE == 3 && wg == 1) { turn_pass(); }   // warpgroup 0 goes first
        turn_take();
        issue_s(sc, 0);
        turn_pass();
        settle();
        softmax(sc, 0);   // O = 0: no rescale
        for (int j = 0; j < nkv; j++) {
            pack(sc);
            if (j + 1 < nkv) { wait_k(j + 1); }
            wait_v(j);
            turn_take();
            if (j + 1 < nkv) { issue_s(sc, j + 1); }
            issue_pv(j);
            if (wg == 0 || j + 1 < nkv) { turn_pass(); }   // warpgroup 1's last pass would have no taker
            if (j + 1 < nkv) {
                wgmma_wait<1>();   // S_{j+1} complete (groups complete in order); P_j V_j may still run
                reg_fence(sc);
                softmax(sc, j + 1);
            }
            settle();
            if (j + 1 < nkv) { rescale(); }
            release(j);
        }
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    const int row0 = rw + g;   // and row0 + 8: stored only where < T
    const bool in0 = row0 < T, in1 = row0 + 8 < T;
    if (t4 == 0) {
        float *lrow = lse + ((size_t)b * NH + h) * T + row0;
        if (in0) { lrow[0] = (m[0] + log2f(l[0])) * LN2; }
        if (in1) { lrow[8] = (m[1] + log2f(l[1])) * LN2; }
    }
    const float inv0 = 1.f / l[0], inv1 = 1.f / l[1];
    bf16 *o0 = out + (((size_t)b * T + row0) * NH + h) * HD, *o1 = o0 + (size_t)8 * NH * HD;
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int col = 64 * p + 8 * i + 2 * t4;
            if (in0) { *(uint32_t *)(o0 + col) = pack_bf16(o[p][4 * i] * inv0, o[p][4 * i + 1] * inv0); }
            if (in1) { *(uint32_t *)(o1 + col) = pack_bf16(o[p][4 * i + 2] * inv1, o[p][4 * i + 3] * inv1); }
        }
#else
    __trap();   // built without sm_90a: the host never launches v5 then (v5_device_unsupported)
#endif
}

// Host emulation of v5's shared-memory and register layouts (run by --cpu-selftest): TMA's
// 128-byte swizzle fills Q, K and V panels of small integers; the wgmma operands are read
// back through v5_desc's descriptors decoded as the PTX ISA's canonical layouts (K-major:
// element (mn, k) at start + (mn/8) SBO + (mn%8) 128 + 2k; N-major: element (k, n) at
// start + (n/64) LBO + 2 (n%64) + (k%8) 128 + (k/8) SBO; then the swizzle XOR on address
// bits 4-6 from bits 7-9); S = Q K^T lands in the accumulator layout, is repacked into
// register A fragments with the kernel's pairing, and O = P V is accumulated the same way.
// Checks: every smem byte of a tile written once, every accumulator and A element hit
// exactly once, and S and O equal their direct products (exact small integers).
static uint32_t emu_swizzle(uint32_t addr, uint64_t desc) {
    if ((desc >> 62) != 1) { return 0xffffffffu; }   // v5 uses the 128-byte mode only
    return addr ^ (((addr >> 7) & 7) << 4);
}
static uint32_t emu_kmajor(uint64_t desc, int mn, int k) {
    const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
    return emu_swizzle(start + (mn / 8) * sbo + (mn % 8) * 128 + 2 * k, desc);
}
static uint32_t emu_nmajor(uint64_t desc, int k, int n) {
    const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4;
    const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
    return emu_swizzle(start + (n / 64) * lbo + 2 * (n % 64) + (k % 8) * 128 + (k / 8) * sbo, desc);
}

template <int HD, int MODE = 0>
static int v5_selftest_hd() {
    typedef V5Cfg<HD, MODE> C;
    constexpr int BR = C::BR, BC = C::BC, NP = C::NP;
    int bad = 0;
    // one stage: sQ at 0, sK, sV after it (offsets as in the kernel; the kernel's base is 1024-aligned)
    const uint32_t qbase = 0, kbase = C::Q_BYTES, vbase = kbase + C::KV_BYTES, total = vbase + C::KV_BYTES;
    std::vector<int> smem(total / 2, INT32_MIN), hits(total / 2, 0);
    std::vector<int> Q(BR * HD), K(BC * HD), V(BC * HD);
    for (auto &x : Q) { x = (int)(rng_u64() % 7) - 3; }
    for (auto &x : K) { x = (int)(rng_u64() % 7) - 3; }
    for (auto &x : V) { x = (int)(rng_u64() % 7) - 3; }
    // TMA: box (64 columns, R rows) of panel p to base + p * PANEL
    auto tma = [&](const std::vector<int> &src, int R, uint32_t base, uint32_t panel) {
        for (int p = 0; p < NP; p++)
            for (int r = 0; r < R; r++)
                for (int c = 0; c < 64; c++) {
                    const uint32_t a = base + p * panel + v5_swz(r, c);
                    smem[a / 2] = src[r * HD + 64 * p + c];
                    hits[a / 2]++;
                }
    };
    tma(Q, BR, qbase, C::PANEL_Q); tma(K, BC, kbase, C::PANEL_KV); tma(V, BC, vbase, C::PANEL_KV);
    for (int x : hits) { bad += x != 1; }
    const int tma_bad = bad;

    for (int wg = 0; wg < 2; wg++) {
        // S = Q K^T for this warpgroup's 64 rows: d[thread][v], thread = 32 w + lane
        static double sc[128][BC / 2];
        memset(sc, 0, sizeof sc);
        const uint32_t qaddr = qbase + wg * 64 * 128;
        for (int kk = 0; kk < HD / 16; kk++) {
            const uint32_t koff = (kk % 4) * 32;
            const uint64_t da = v5_desc(qaddr + (kk / 4) * C::PANEL_Q + koff, 16, 1024);
            const uint64_t db = v5_desc(kbase + (kk / 4) * C::PANEL_KV + koff, 16, 1024);
            double A[64][16], B[16][BC];
            for (int mm = 0; mm < 64; mm++)
                for (int k = 0; k < 16; k++) { A[mm][k] = smem[emu_kmajor(da, mm, k) / 2]; }
            for (int n = 0; n < BC; n++)
                for (int k = 0; k < 16; k++) { B[k][n] = smem[emu_kmajor(db, n, k) / 2]; }
            for (int th = 0; th < 128; th++)
                for (int v = 0; v < BC / 2; v++) {
                    const int w = th / 32, lane = th % 32;
                    const int row = 16 * w + lane / 4 + 8 * ((v >> 1) & 1), col = 8 * (v >> 2) + 2 * (lane % 4) + (v & 1);
                    for (int k = 0; k < 16; k++) { sc[th][v] += A[row][k] * B[k][col]; }
                }
        }
        // accumulator coverage and values
        std::vector<int> cov(64 * BC, 0);
        for (int th = 0; th < 128; th++)
            for (int v = 0; v < BC / 2; v++) {
                const int w = th / 32, lane = th % 32;
                const int row = 16 * w + lane / 4 + 8 * ((v >> 1) & 1), col = 8 * (v >> 2) + 2 * (lane % 4) + (v & 1);
                cov[row * BC + col]++;
                double ref = 0;
                for (int d = 0; d < HD; d++) { ref += (double)Q[(64 * wg + row) * HD + d] * K[col * HD + d]; }
                bad += sc[th][v] != ref;
            }
        for (int x : cov) { bad += x != 1; }
        // P = S (no softmax: the layouts are under test) repacked as the kernel does; O = P V
        static double o[128][NP][32];
        memset(o, 0, sizeof o);
        for (int kc = 0; kc < BC / 16; kc++) {
            double A[64][16];
            std::vector<int> acov(64 * 16, 0);
            for (int th = 0; th < 128; th++) {
                const int w = th / 32, lane = th % 32;
                // pa[kc][r] = pair (sc[8kc + 2r], sc[8kc + 2r + 1]); register r = 2i + h holds A[16w + g + 8h][8i + 2t + e]
                for (int r = 0; r < 4; r++)
                    for (int e = 0; e < 2; e++) {
                        const int i = r >> 1, hh = r & 1;
                        const int row = 16 * w + lane / 4 + 8 * hh, k = 8 * i + 2 * (lane % 4) + e;
                        A[row][k] = sc[th][8 * kc + 2 * r + e];
                        acov[row * 16 + k]++;
                    }
            }
            for (int x : acov) { bad += x != 1; }
            for (int p = 0; p < NP; p++) {
                const uint64_t db = v5_desc(vbase + p * C::PANEL_KV + kc * 2048, C::PANEL_KV, 1024);
                double B[16][64];
                for (int k = 0; k < 16; k++)
                    for (int n = 0; n < 64; n++) { B[k][n] = smem[emu_nmajor(db, k, n) / 2]; }
                for (int th = 0; th < 128; th++)
                    for (int v = 0; v < 32; v++) {
                        const int w = th / 32, lane = th % 32;
                        const int row = 16 * w + lane / 4 + 8 * ((v >> 1) & 1), col = 8 * (v >> 2) + 2 * (lane % 4) + (v & 1);
                        for (int k = 0; k < 16; k++) { o[th][p][v] += A[row][k] * B[k][col]; }
                    }
            }
        }
        // the kernel's epilogue coordinates: o[p][4i + 2h + e] -> row rw + g + 8h, column 64p + 8i + 2t + e
        std::vector<double> Sd(64 * BC);
        for (int r = 0; r < 64; r++)
            for (int c = 0; c < BC; c++) {
                double x = 0;
                for (int d = 0; d < HD; d++) { x += (double)Q[(64 * wg + r) * HD + d] * K[c * HD + d]; }
                Sd[r * BC + c] = x;
            }
        std::vector<int> ocov(64 * HD, 0);
        for (int th = 0; th < 128; th++)
            for (int p = 0; p < NP; p++)
                for (int i = 0; i < 8; i++)
                    for (int hh = 0; hh < 2; hh++)
                        for (int e = 0; e < 2; e++) {
                            const int w = th / 32, lane = th % 32;
                            const int row = 16 * w + lane / 4 + 8 * hh, col = 64 * p + 8 * i + 2 * (lane % 4) + e;
                            ocov[row * HD + col]++;
                            double ref = 0;
                            for (int c = 0; c < BC; c++) { ref += Sd[row * BC + c] * V[c * HD + col]; }
                            bad += o[th][p][4 * i + 2 * hh + e] != ref;
                        }
        for (int x : ocov) { bad += x != 1; }
    }
    // descriptor fields round-trip, and every panel base is 1024-aligned (base offset 0)
    const uint64_t dd = v5_desc(0x12340, 0x4000, 1024);
    bad += (dd & 0x3FFF) != (0x12340 >> 4) || ((dd >> 16) & 0x3FFF) != (0x4000 >> 4) ||
           ((dd >> 32) & 0x3FFF) != 64 || ((dd >> 49) & 7) != 0 || (dd >> 62) != 1;
    bad += (C::PANEL_Q % 1024) || (C::PANEL_KV % 1024) || (C::Q_BYTES % 1024) || (C::KV_BYTES % 1024);
    printf("v5 emulation HD=%d BC=%d (TMA 128B swizzle, wgmma descriptors K-/N-major, accumulator and A fragments, "
           "epilogue coordinates): %s (tma coverage errors %d, total %d)\n", HD, BC, bad ? "FAIL" : "ok", tma_bad, bad);
    return bad ? 1 : 0;
}

// Host model of the pipeline of modes 4 and 5 (run by --cpu-selftest): one block, its two warpgroups
// executing the operations of v5_overlap_order or v5_fa3_order (the kernel's own order, recorded),
// thread 0's copies and refills, the mbarriers with their parity waits, the wgmma groups (retired in
// order, at random times or by wait_group) and the TMA copies (landing at random times), interleaved
// at random. On small numbers in fp64 (64 rows a warpgroup, 64 keys a tile, 8 columns) it checks:
// no deadlock; no instruction but a wgmma
// touches the registers of a group in flight (S arrays, O, pa: what ptxas serialises, C7514/C7515);
// every wgmma reads the tile it expects, at issue and at retirement; no copy lands in a stage that a
// group in flight reads; tiles 0..nkv-1 each copied once; out and lse of the rows < T equal to the
// direct softmax (rows past T zero-filled, keys past T zero and masked, as TMA and the kernel do).
struct V5OrderOp { int op, s, j; };
struct V5OrderRec {
    std::vector<V5OrderOp> ops;
    template <class O, class S>
    __host__ __device__ void operator()(O, S, int j) {   // host only (v5_overlap_order is __host__ __device__)
#ifndef __CUDA_ARCH__
        ops.push_back({O::value, S::value, j});
#endif
    }
};
// errors of one block (q tile qb of T rows, ring of ST stages) under one random interleaving
static int v5_order_case(int mode, int T, int qb, int ST, uint64_t seed, bool *deadlock) {
    const int BC = 64, BR = 128, D = 8, q0 = qb * BR, nkv = (std::min(q0 + BR, T) - 1) / BC + 1;
    const int nrows_total = (T + BR - 1) / BR * BR, nkeys = std::max(nkv * BC, T);
    uint64_t st = seed;
    auto rnd = [&]() { st = st * 6364136223846793005ull + 1442695040888963407ull; return (uint32_t)(st >> 33); };
    auto val = [&]() { return ((double)(rnd() % 2001) - 1000.0) / 1000.0; };
    std::vector<double> Q((size_t)nrows_total * D), K((size_t)nkeys * D), V((size_t)nkeys * D);
    for (int r = 0; r < nrows_total; r++)
        for (int d = 0; d < D; d++) { Q[r * D + d] = r < T ? val() : 0.0; }   // TMA zero-fills rows past T
    for (int r = 0; r < nkeys; r++)
        for (int d = 0; d < D; d++) { K[r * D + d] = r < T ? val() : 0.0; V[r * D + d] = r < T ? val() : 0.0; }
    int bad = 0;
    *deadlock = false;
    // barriers: completed phases; a parity wait passes while the phase in progress has the other parity
    std::vector<int> kfull(ST, 0), vfull(ST, 0), empty(ST, 0), empty_arr(ST, 0), ktag(ST, -1), vtag(ST, -1);
    std::vector<int> copies(nkv, 0);
    struct Load { bool v; int stage, tile; };
    std::vector<Load> loads;   // copies in flight
    auto copy_tile = [&](int t) {
        copies[t]++;
        loads.push_back({false, t % ST, t});
        loads.push_back({true, t % ST, t});
    };
    for (int t = 0; t < ST && t < nkv; t++) { copy_tile(t); }
    struct Group { bool pv; int s, j, stage; };
    struct WG {
        std::vector<V5OrderOp> ops;
        size_t pc = 0;
        std::vector<Group> inflight;   // committed, not retired; oldest first
        double S[2][64][64], P[64][64], O[64][8], m[64], l[64], alpha[64];
        int stag[2] = {-1, -1}, ptag = -1;
        int r0, n;
    };
    WG wg[2];
    for (int w = 0; w < 2; w++) {
        WG &g = wg[w];
        g.r0 = q0 + 64 * w;
        g.n = (std::min(g.r0 + 64, T) - 1) / BC + 1;   // the kernel's n
        V5OrderRec rec;
        if (mode == 4) { v5_overlap_order(rec, g.n); } else { v5_fa3_order(rec, g.n); }
        g.ops = rec.ops;
        for (int r = 0; r < 64; r++) {
            g.m[r] = -INFINITY; g.l[r] = 0;
            for (int d = 0; d < D; d++) { g.O[r][d] = 0; }
        }
    }
    auto stage_read = [&](int stage, bool v) {   // does a group in flight read this stage's K (V)?
        for (WG &g : wg)
            for (const Group &q : g.inflight) { if (q.stage == stage && q.pv == v) { return true; } }
        return false;
    };
    auto retire = [&](WG &g) {
        const Group q = g.inflight.front();
        g.inflight.erase(g.inflight.begin());
        if (!q.pv) {
            if (ktag[q.stage] != q.j) { bad++; }
            for (int r = 0; r < 64; r++)
                for (int c = 0; c < 64; c++) {
                    double x = 0;
                    for (int d = 0; d < D; d++) { x += Q[(g.r0 + r) * D + d] * K[(q.j * BC + c) * D + d]; }
                    g.S[q.s][r][c] = x;
                }
            g.stag[q.s] = q.j;
        } else {
            if (vtag[q.stage] != q.j || g.ptag != q.j) { bad++; }
            for (int r = 0; r < 64; r++)
                for (int d = 0; d < D; d++) {
                    double x = 0;
                    for (int c = 0; c < 64; c++) { x += g.P[r][c] * V[(q.j * BC + c) * D + d]; }
                    g.O[r][d] += x;
                }
        }
    };
    auto busy = [&](WG &g, int what) {   // a group in flight holds these registers: 0, 1 = S arrays, 2 = O and pa
        for (const Group &q : g.inflight) { if (q.pv ? what == 2 : what == q.s) { return true; } }
        return false;
    };
    // one operation of warpgroup w; false when it must wait (a barrier phase not complete yet)
    auto exec = [&](int w) {
        WG &g = wg[w];
        const V5OrderOp o = g.ops[g.pc];
        const int stage = o.j % ST, par = (o.j / ST) & 1;
        switch (o.op) {
        case V5_WAIT_K: if ((kfull[stage] & 1) == par) { return false; } bad += ktag[stage] != o.j; break;
        case V5_WAIT_V: if ((vfull[stage] & 1) == par) { return false; } bad += vtag[stage] != o.j; break;
        case V5_ISSUE_S: bad += ktag[stage] != o.j; g.inflight.push_back({false, o.s, o.j, stage}); break;
        case V5_ISSUE_PV: bad += vtag[stage] != o.j || g.ptag != o.j; g.inflight.push_back({true, 0, o.j, stage}); break;
        case V5_WAIT1: while (g.inflight.size() > 1) { retire(g); } break;
        case V5_WAIT0: while (!g.inflight.empty()) { retire(g); } break;
        case V5_FENCE_S: case V5_FENCE_OP: break;
        case V5_SOFTMAX: {
            bad += busy(g, o.s) || g.stag[o.s] != o.j;
            for (int r = 0; r < 64; r++) {
                double mx = -INFINITY;
                for (int c = 0; c < 64; c++) {
                    if (o.j * BC + c > g.r0 + r) { g.S[o.s][r][c] = -INFINITY; }   // causal (keys past T too)
                    mx = std::max(mx, g.S[o.s][r][c]);
                }
                const double mnew = std::max(g.m[r], mx);
                g.alpha[r] = exp(g.m[r] - mnew);
                g.m[r] = mnew;
                g.l[r] *= g.alpha[r];
                for (int c = 0; c < 64; c++) { g.S[o.s][r][c] = exp(g.S[o.s][r][c] - mnew); g.l[r] += g.S[o.s][r][c]; }
            }
            break;
        }
        case V5_RESCALE:
            bad += busy(g, 2);
            for (int r = 0; r < 64; r++)
                for (int d = 0; d < D; d++) { g.O[r][d] *= g.alpha[r]; }
            break;
        case V5_PACK:
            bad += busy(g, o.s) || busy(g, 2) || g.stag[o.s] != o.j;
            memcpy(g.P, g.S[o.s], sizeof g.P);
            g.ptag = o.j;
            break;
        case V5_RELEASE:
            for (const Group &q : g.inflight) { bad += q.stage == stage; }   // its reads of tile j complete
            if ((empty_arr[stage] += 4) == 8) { empty_arr[stage] = 0; empty[stage]++; }
            break;
        case V5_REFILL:
            if (w == 0 && o.j + ST < nkv) {   // thread 0
                if ((empty[stage] & 1) == par) { return false; }
                copy_tile(o.j + ST);
            }
            break;
        }
        g.pc++;
        return true;
    };
    for (long iter = 0;; iter++) {
        // the possible events: an operation of either warpgroup, a copy landing, a group retiring
        std::vector<int> ev;
        for (int w = 0; w < 2; w++) { if (wg[w].pc < wg[w].ops.size()) { ev.push_back(w); } }
        for (size_t i = 0; i < loads.size(); i++) { ev.push_back(100 + (int)i); }
        for (int w = 0; w < 2; w++) { if (!wg[w].inflight.empty()) { ev.push_back(200 + w); } }
        if (ev.empty()) { break; }
        bool moved = false;
        // try events in a random order until one can happen
        for (size_t k = ev.size(); k > 0 && !moved; k--) {
            const size_t pick = rnd() % k;
            const int e = ev[pick];
            ev.erase(ev.begin() + pick);
            if (e < 100) { moved = exec(e); }
            else if (e < 200) {
                const Load L = loads[e - 100];
                loads.erase(loads.begin() + (e - 100));
                bad += stage_read(L.stage, L.v);   // a copy over a stage that a group in flight reads
                if (L.v) { vtag[L.stage] = L.tile; vfull[L.stage]++; } else { ktag[L.stage] = L.tile; kfull[L.stage]++; }
                moved = true;
            } else { retire(wg[e - 200]); moved = true; }
        }
        if (!moved) { *deadlock = true; return bad + 1; }
    }
    for (int t = 0; t < nkv; t++) { bad += copies[t] != 1; }
    for (WG &g : wg) {
        bad += g.pc != g.ops.size() || !g.inflight.empty();
        for (int r = 0; r < 64 && g.r0 + r < T; r++) {   // rows past T are not stored
            const int row = g.r0 + r;
            double mx = -INFINITY, sum = 0, ref[8] = {0};
            std::vector<double> p(row + 1);
            for (int c = 0; c <= row; c++) {
                double x = 0;
                for (int d = 0; d < D; d++) { x += Q[row * D + d] * K[c * D + d]; }
                p[c] = x;
                mx = std::max(mx, x);
            }
            for (int c = 0; c <= row; c++) { p[c] = exp(p[c] - mx); sum += p[c]; }
            for (int c = 0; c <= row; c++)
                for (int d = 0; d < D; d++) { ref[d] += p[c] / sum * V[c * D + d]; }
            for (int d = 0; d < D; d++) { bad += fabs(g.O[r][d] / g.l[r] - ref[d]) > 1e-12; }
            bad += fabs(g.m[r] + log(g.l[r]) - (mx + log(sum))) > 1e-12;
        }
    }
    return bad;
}
static int v5_order_selftest() {
    const int Ts[] = {7, 64, 65, 100, 127, 128, 129, 200, 256, 300, 640, 1024};
    int fails = 0;
    for (int mode : {4, 5}) {
        int bad = 0, cases = 0, blocks = 0;
        const std::vector<int> sts = mode == 4 ? std::vector<int>{3, V5Cfg<64, 4>::ST, 6}
                                               : std::vector<int>{2, V5Cfg<64, 5>::ST};
        for (int ST : sts)
            for (int T : Ts)
                for (int qb = 0; qb < (T + 127) / 128; qb++)
                    for (uint64_t seed = 1; seed <= 6; seed++) {
                        bool dl;
                        const int b = v5_order_case(mode, T, qb, ST, seed * 7919 + T * 131 + qb, &dl);
                        if (b && bad < 5) { printf("  v5.%d order: T=%d q tile %d ST=%d seed %llu: %d errors%s\n", mode, T, qb,
                                                    ST, (unsigned long long)seed, b, dl ? " (deadlock)" : ""); }
                        bad += b > 0;
                        cases++;
                        blocks += seed == 1 && ST == sts[0];
                    }
        // the model can fail: mode 4 with 2 stages waits in step j for tile j + 1 before it frees tile j - 1
        int dl2 = 0;
        if (mode == 4) {
            for (int T : {256, 1024}) {
                bool dl;
                v5_order_case(4, T, T / 128 - 1, 2, 1, &dl);
                dl2 += dl;
            }
        }
        printf("v5.%d order model (%s): %s, %d of %d runs failing%s (two warpgroups, thread 0's refills, wgmma groups "
               "and copies at random times; %d blocks of T = 7..1024, ST =", mode,
               mode == 4 ? "v5_overlap_order" : "v5_fa3_order", bad ? "FAIL" : "ok", bad, cases,
               mode != 4 ? "" : dl2 == 2 ? "; ST = 2 deadlocks, as it must" : "; ST = 2 does NOT deadlock: the model is blind",
               blocks);
        for (int ST : sts) { printf(" %d", ST); }
        printf(")\n");
        fails += bad || (mode == 4 && dl2 != 2);
    }
    return fails;
}
static int v5_selftest() {
    // modes 4 and 5 take kv tiles of 64 at HD 64, a geometry of its own; at HD 128 every mode has BC = 64
    return v5_selftest_hd<64>() + v5_selftest_hd<128>() + v5_selftest_hd<64, 4>() + v5_order_selftest();
}

// ----------------------------------------------------------------------------
// v6: the backward on wgmma (sm_90a), v2's deterministic split: prep (D), a dk/dv pass, a dq pass.
// Every matrix product is a wgmma m64nNk16 (bf16 -> fp32) with operands in v5's layouts: tiles of
// 64 rows x HD columns land by TMA as HD/64 panels of 64 rows x 128 bytes in the 128-byte swizzle
// (8 KB a panel, 1024-aligned). A tile read with rows as M or N (K = the head dimension) is a
// K-major operand (v5's Q and K); read with rows as K (N = the head dimension) it is N-major
// (v5's V). The products whose A is P, dS or their transposes take A from registers: a 64 x 64
// accumulator repacks into the four k16 A fragments exactly as v5's P does.
//   dk/dv pass, a warpgroup owns 64 keys (rows of its K and V subtiles), per q tile of 64 rows:
//     S^T = K Q^T (A = K, B = Q, both K-major)    dP^T = V dO^T (A = V, B = dO, K-major)
//     P^T = exp2(S^T sl2 - lse2[query]) (0 where query < key), dS^T = P^T (dP^T - D[query])
//     dV += P^T dO (A = P^T regs, B = dO N-major)  dK += dS^T Q (A = dS^T regs, B = Q N-major)
//   dq pass, a warpgroup owns 64 query rows, per kv tile of 64 keys:
//     S = Q K^T, dP = dO V^T (K-major), P, dS = P (dP - D), dQ += dS K (A = dS regs, B = K N-major)
// Accumulator element v of thread (warp w of the warpgroup, lane = 4g + t) is row 16w + g + 8((v>>1)&1),
// column 8(v>>2) + 2t + (v&1): in the transposed products the column is a query, so lse and D are
// indexed by column (staged per q tile in shared memory by a bulk copy beside the Q and dO tiles).
// Block = NWG warpgroups (variants 0 and 2: 2, 128 keys or rows; variant 1: 1, 64), no producer warp:
// thread 0 issues every copy, into a ring of ST stages (Q, dO, lse, D tiles in dk/dv; K, V tiles in
// dq) with a full barrier (TMA bytes) and an empty barrier (one arrival per consumer warp) per stage;
// the block's own tiles (K, V or Q, dO) load once. S^T and dP^T are in flight together and P^T is
// computed while dP^T runs; then without OVL (variants 0, 1) the step waits for its dV, dK (dQ)
// products, with OVL (variant 2) it issues the next step's S^T, dP^T behind them and the next
// step's first wait retires them (then the stage is released). Every output element is written once by one
// thread (dK, dV, dQ from registers, scaled as v2's): deterministic. grid dk/dv (NKV, B, ceil(T/BLK))
// and dq (NH, B, ceil(T/BLK)), the slowest index heaviest first. Limits: HD 64 or 128; any T (checked
// for variant 1 only, the trainer's): the tensor maps are 3D (columns, T, B) as v5's, so rows past T
// arrive as zeros; queries past T get lse = +inf (p = 0, dS = 0) and D = 0 (dk/dv: thread 0 copies
// lse and D of a q tile by hand when its 64 entries are not all inside the row or T % 4 != 0, where
// the bulk copy's 16-byte alignment fails); keys past T are later than every query < T (the causal
// mask); nothing past T is stored.
template <int HD, int NWG>
struct V6Cfg {
    static constexpr int NP = HD / 64, PANEL = 64 * 128, TILE = NP * PANEL;   // bytes of a 64-row tile
    // ring stages: two warpgroups sync through every stage's release, so a deeper ring lets one run
    // up to ST - 1 steps ahead of the other (their softmaxes then overlap the other's products);
    // one warpgroup a block keeps 2 so that 3-4 blocks fit an SM
    static constexpr int ST = NWG == 2 ? (HD == 64 ? 4 : 3) : 2, THREADS = 128 * NWG, BLK = 64 * NWG;
    static constexpr int NBARS = 1 + 2 * ST;   // own tiles full; per stage full, empty
    // dk/dv: K, V subtiles; ST x (Q, dO); ST x (lse, D) of 64 floats each
    static constexpr size_t DKDV_SMEM = 1024 + 2 * (size_t)NWG * TILE + 2 * (size_t)ST * TILE + 2 * ST * 256 + 8 * NBARS;
    // dq: Q, dO subtiles; ST x (K, V)
    static constexpr size_t DQ_SMEM = 1024 + 2 * (size_t)NWG * TILE + 2 * (size_t)ST * TILE + 8 * NBARS;
};

#ifdef V5_DEVICE
// bytes (a multiple of 16, both addresses 16-aligned) from global to shared, completing tx bytes on bar
__device__ __forceinline__ void bulk_load_1d(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
// d (64 x 64) = A B over the head dimension: A rows from the 64-row tile at a, B rows from the one at b
// (both K-major, HD / 16 k16 steps of 32 bytes, panel by panel); issued and committed, not waited for
template <int HD>
__device__ __forceinline__ void v6_issue_rowdot(float (&d)[32], uint32_t a, uint32_t b) {
    wgmma_ss<64, 0>(d, v5_desc(a, 16, 1024), v5_desc(b, 16, 1024));
#pragma unroll
    for (int kk = 1; kk < HD / 16; kk++) {
        const uint32_t off = (kk / 4) * 8192 + (kk % 4) * 32;
        wgmma_ss<64, 1>(d, v5_desc(a + off, 16, 1024), v5_desc(b + off, 16, 1024));
    }
    wgmma_commit();
}
// acc (64 x HD, NP panels of 64 columns) += A (64 x 64, four k16 register fragments) * B, B = the
// 64-row tile at b read N-major (k = its rows, 2048 bytes a k16 step; n = its columns, panel p)
template <int NP>
__device__ __forceinline__ void v6_issue_acc(float (&acc)[NP][32], const uint32_t (&a)[4][4], uint32_t b) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++)
#pragma unroll
        for (int p = 0; p < NP; p++) { wgmma_rs_n64(acc[p], a[kc], v5_desc(b + p * 8192 + kc * 2048, 8192, 1024)); }
}
// a 64 x 64 fp32 accumulator -> the four bf16 k16 A fragments (v5's pack)
__device__ __forceinline__ void v6_pack(uint32_t (&a)[4][4], const float (&x)[32]) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++)
#pragma unroll
        for (int r = 0; r < 4; r++) { a[kc][r] = pack_bf16(x[8 * kc + 2 * r], x[8 * kc + 2 * r + 1]); }
}
// the ring's barriers: own (1), full[ST], empty[ST] (one arrival per consumer warp)
__device__ __forceinline__ void v6_init_bars(uint64_t *own, int ST, int nwarps) {
    mbar_init(own, 1);
    for (int s = 0; s < ST; s++) { mbar_init(own + 1 + s, 1); mbar_init(own + 1 + ST + s, nwarps); }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#endif

// dK, dV (B, T, NKV, HD) bf16 for the block's BLK keys of kv head blockIdx.x; lse, D (B, NH, T).
template <int HD, int NWG, bool OVL>
__global__ void __launch_bounds__(V6Cfg<HD, NWG>::THREADS, 1)
attention_backward_dkdv_wgmma_kernel(bf16 *dk, bf16 *dv, const __grid_constant__ CUtensorMap tq,
                                     const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                                     const __grid_constant__ CUtensorMap tdo, const float *lse, const float *Dd,
                                     int T, int NH, int NKV, int bulk, float scale, float sl2) {
#ifdef V5_DEVICE
    using C = V6Cfg<HD, NWG>;
    constexpr int NP = C::NP, TILE = C::TILE, ST = C::ST;
    extern __shared__ unsigned char v6_smem[];
    unsigned char *sK = v6_smem + ((1024 - (smem_u32(v6_smem) & 1023)) & 1023);
    unsigned char *sV = sK + NWG * TILE, *sQ = sV + NWG * TILE, *sdO = sQ + ST * TILE;
    float *sL = (float *)(sdO + ST * TILE), *sD = sL + ST * 64;
    uint64_t *own = (uint64_t *)(sD + ST * 64), *full = own + 1, *empty = full + ST;
    const int kvh = blockIdx.x, b = blockIdx.y, kb = blockIdx.z;   // kv tile 0 (the most q tiles) first
    const int G = NH / NKV, k0 = kb * C::BLK, i0 = k0 / 64, nq = (T + 63) / 64 - i0, nit = G * nq;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, wl = warp % 4, g = lane / 4, t4 = lane % 4;
    if (threadIdx.x == 0) { v6_init_bars(own, ST, 4 * NWG); }
    __syncthreads();
    // step it: query head kvh G + it / nq, q tile i0 + it % nq, into stage it % ST. lse and D by
    // bulk copies where the tile's 64 entries lie in the row and are 16-byte aligned (bulk: T % 4 == 0),
    // else by thread 0, with lse = +inf (p = 0) and D = 0 past T
    auto load = [&](int it) {
        const int s = it % ST, h = kvh * G + it / nq, qt0 = (i0 + it % nq) * 64;
        const size_t lo = ((size_t)b * NH + h) * T + qt0;
        const bool whole = bulk && qt0 + 64 <= T;
        if (!whole) {
            for (int c = 0; c < 64; c++) {
                sL[s * 64 + c] = qt0 + c < T ? lse[lo + c] : INFINITY;
                sD[s * 64 + c] = qt0 + c < T ? Dd[lo + c] : 0.f;
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // before a later bulk copy to these words
        }
        mbar_expect_tx(full + s, 2 * TILE + (whole ? 512 : 0));   // releases the writes above to the waiters
        for (int p = 0; p < NP; p++) {
            tma_load_3d(sQ + s * TILE + p * 8192, &tq, full + s, h * HD + 64 * p, qt0, b);
            tma_load_3d(sdO + s * TILE + p * 8192, &tdo, full + s, h * HD + 64 * p, qt0, b);
        }
        if (whole) {
            bulk_load_1d(sL + s * 64, lse + lo, 256, full + s);
            bulk_load_1d(sD + s * 64, Dd + lo, 256, full + s);
        }
    };
    if (threadIdx.x == 0) {
        mbar_expect_tx(own, 2 * NWG * TILE);
        for (int w = 0; w < NWG; w++)
            for (int p = 0; p < NP; p++) {
                tma_load_3d(sK + w * TILE + p * 8192, &tk, own, kvh * HD + 64 * p, k0 + 64 * w, b);
                tma_load_3d(sV + w * TILE + p * 8192, &tv, own, kvh * HD + 64 * p, k0 + 64 * w, b);
            }
        for (int it = 0; it < ST && it < nit; it++) { load(it); }
    }
    float dka[NP][32], dva[NP][32], st[32], dpt[32];
    uint32_t pa[4][4], da[4][4];
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int i = 0; i < 32; i++) { dka[p][i] = 0.f; dva[p][i] = 0.f; }
    const int kw0 = k0 + 64 * wg, key = kw0 + 16 * wl + g;   // this thread's keys: key, key + 8
    const uint32_t kaddr = smem_u32(sK + wg * TILE), vaddr = smem_u32(sV + wg * TILE);
    mbar_wait(own, 0);
    __syncwarp();
    auto active = [&](int it) { return (i0 + it % nq) * 64 + 63 >= kw0; };   // warpgroup-uniform: some query of
                                                                            // q tile it sees some key of the warpgroup
    // step it's data landed; S^T and dP^T issued (two commit groups), not waited for
    auto issue_sd = [&](int it) {
        const int s = it % ST;
        mbar_wait(full + s, (it / ST) & 1);
        __syncwarp();
        if (active(it)) {
            wgmma_fence();
            v6_issue_rowdot<HD>(st, kaddr, smem_u32(sQ + s * TILE));
            v6_issue_rowdot<HD>(dpt, vaddr, smem_u32(sdO + s * TILE));
        }
    };
    auto fence_acc = [&]() {
#pragma unroll
        for (int p = 0; p < NP; p++) { reg_fence(dka[p]); reg_fence(dva[p]); }
        reg_fence_u(pa);
        reg_fence_u(da);
    };
    // on issued S^T, dP^T of an active step: P^T, dS^T, then dV += P^T dO, dK += dS^T Q issued (one
    // group), not waited for. The first wait also retires the previous step's dV, dK group (OVL).
    auto finish = [&](int it) {
        const int s = it % ST, qt0 = (i0 + it % nq) * 64;
        const uint32_t qaddr = smem_u32(sQ + s * TILE), doaddr = smem_u32(sdO + s * TILE);
        wgmma_wait<1>();   // S^T complete; dP^T may still run
        reg_fence(st);
        fence_acc();
        const float *cL = sL + s * 64, *cD = sD + s * 64;
        const bool mask = qt0 < kw0 + 63;   // some query of the tile precedes some key
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float2 L = *(const float2 *)(cL + 8 * i + 2 * t4);
            const float L2[2] = {L.x * LOG2E, L.y * LOG2E};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(fmaf(st[4 * i + e], sl2, -L2[e & 1]));
                if (mask && qt0 + 8 * i + 2 * t4 + (e & 1) < key + 8 * (e >> 1)) { p = 0.f; }
                st[4 * i + e] = p;
            }
        }
        wgmma_wait<0>();
        reg_fence(dpt);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float2 D = *(const float2 *)(cD + 8 * i + 2 * t4);
            const float Dv[2] = {D.x, D.y};
#pragma unroll
            for (int e = 0; e < 4; e++) { dpt[4 * i + e] = st[4 * i + e] * (dpt[4 * i + e] - Dv[e & 1]); }
        }
        v6_pack(pa, st);
        v6_pack(da, dpt);
        fence_acc();
        wgmma_fence();
        v6_issue_acc<NP>(dva, pa, doaddr);
        v6_issue_acc<NP>(dka, da, qaddr);
        wgmma_commit();
    };
    // every warp of the block done with stage it % ST: thread 0 refills it with step it + ST
    auto release = [&](int it) {
        __syncwarp();
        if (lane == 0) { mbar_arrive(empty + it % ST); }
        if (threadIdx.x == 0 && it + ST < nit) {
            mbar_wait(empty + it % ST, (it / ST) & 1);
            load(it + ST);
        }
        __syncwarp();
    };
    if (!OVL) {   // each step's products in turn
        for (int it = 0; it < nit; it++) {
            issue_sd(it);
            if (active(it)) {
                finish(it);
                wgmma_wait<0>();
                fence_acc();
            }
            release(it);
        }
    } else {      // step it + 1's S^T, dP^T issued behind step it's dV, dK
        issue_sd(0);
        for (int it = 0; it < nit; it++) {
            if (active(it)) { finish(it); }   // retires step it - 1's dV, dK at its first wait
            else { wgmma_wait<0>(); fence_acc(); }
            if (it > 0) { release(it - 1); }
            if (it + 1 < nit) { issue_sd(it + 1); }
        }
        wgmma_wait<0>();
        fence_acc();
    }
    // o[p][4i + 2h + e] -> key key + 8h, column 64p + 8i + 2t + e; keys past T are not stored
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        if (key + 8 * hh >= T) { continue; }
        const size_t ro = (((size_t)b * T + key + 8 * hh) * NKV + kvh) * HD;
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int col = 64 * p + 8 * i + 2 * t4;
                *(uint32_t *)(dk + ro + col) = pack_bf16(dka[p][4 * i + 2 * hh] * scale, dka[p][4 * i + 2 * hh + 1] * scale);
                *(uint32_t *)(dv + ro + col) = pack_bf16(dva[p][4 * i + 2 * hh], dva[p][4 * i + 2 * hh + 1]);
            }
    }
#else
    __trap();   // built without sm_90a: the host never launches v6 then
#endif
}

// dQ (B, T, NH, HD) bf16 for the block's BLK query rows of head blockIdx.x.
template <int HD, int NWG, bool OVL>
__global__ void __launch_bounds__(V6Cfg<HD, NWG>::THREADS, 1)
attention_backward_dq_wgmma_kernel(bf16 *dq, const __grid_constant__ CUtensorMap tq,
                                   const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                                   const __grid_constant__ CUtensorMap tdo, const float *lse, const float *Dd,
                                   int T, int NH, int NKV, float scale, float sl2) {
#ifdef V5_DEVICE
    using C = V6Cfg<HD, NWG>;
    constexpr int NP = C::NP, TILE = C::TILE, ST = C::ST;
    extern __shared__ unsigned char v6_smem[];
    unsigned char *sQ = v6_smem + ((1024 - (smem_u32(v6_smem) & 1023)) & 1023);
    unsigned char *sdO = sQ + NWG * TILE, *sK = sdO + NWG * TILE, *sV = sK + ST * TILE;
    uint64_t *own = (uint64_t *)(sV + ST * TILE), *full = own + 1, *empty = full + ST;
    const int h = blockIdx.x, b = blockIdx.y, qb = gridDim.z - 1 - blockIdx.z;   // the last q tile first
    const int kvh = h / (NH / NKV), q0 = qb * C::BLK, nkv = (min(q0 + C::BLK, T) - 1) / 64 + 1;   // up to the last row < T
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, wl = warp % 4, g = lane / 4, t4 = lane % 4;
    if (threadIdx.x == 0) { v6_init_bars(own, ST, 4 * NWG); }
    __syncthreads();
    auto load = [&](int j) {   // kv tile j into stage j % ST
        const int s = j % ST;
        mbar_expect_tx(full + s, 2 * TILE);
        for (int p = 0; p < NP; p++) {
            tma_load_3d(sK + s * TILE + p * 8192, &tk, full + s, kvh * HD + 64 * p, 64 * j, b);
            tma_load_3d(sV + s * TILE + p * 8192, &tv, full + s, kvh * HD + 64 * p, 64 * j, b);
        }
    };
    if (threadIdx.x == 0) {
        mbar_expect_tx(own, 2 * NWG * TILE);
        for (int w = 0; w < NWG; w++)
            for (int p = 0; p < NP; p++) {
                tma_load_3d(sQ + w * TILE + p * 8192, &tq, own, h * HD + 64 * p, q0 + 64 * w, b);
                tma_load_3d(sdO + w * TILE + p * 8192, &tdo, own, h * HD + 64 * p, q0 + 64 * w, b);
            }
        for (int j = 0; j < ST && j < nkv; j++) { load(j); }
    }
    const int rq0 = q0 + 64 * wg, row = rq0 + 16 * wl + g;   // this thread's rows: row, row + 8
    const float *Lr = lse + ((size_t)b * NH + h) * T + row, *Dr = Dd + ((size_t)b * NH + h) * T + row;
    // past T: lse = +inf (p = 0), D = 0
    const float L2[2] = {row < T ? Lr[0] * LOG2E : INFINITY, row + 8 < T ? Lr[8] * LOG2E : INFINITY};
    const float Dv[2] = {row < T ? Dr[0] : 0.f, row + 8 < T ? Dr[8] : 0.f};
    float dqa[NP][32], sc[32], dp[32];
    uint32_t dsa[4][4];
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int i = 0; i < 32; i++) { dqa[p][i] = 0.f; }
    const uint32_t qaddr = smem_u32(sQ + wg * TILE), doaddr = smem_u32(sdO + wg * TILE);
    mbar_wait(own, 0);
    __syncwarp();
    auto active = [&](int j) { return 64 * j <= rq0 + 63; };   // warpgroup-uniform: some key visible to some row
    auto issue_sd = [&](int j) {   // S = Q K^T, dP = dO V^T of kv tile j issued, not waited for
        const int s = j % ST;
        mbar_wait(full + s, (j / ST) & 1);
        __syncwarp();
        if (active(j)) {
            wgmma_fence();
            v6_issue_rowdot<HD>(sc, qaddr, smem_u32(sK + s * TILE));
            v6_issue_rowdot<HD>(dp, doaddr, smem_u32(sV + s * TILE));
        }
    };
    auto fence_acc = [&]() {
#pragma unroll
        for (int p = 0; p < NP; p++) { reg_fence(dqa[p]); }
        reg_fence_u(dsa);
    };
    auto finish = [&](int j) {   // P, dS, then dQ += dS K issued; the first wait retires the previous dQ group (OVL)
        const int s = j % ST, kt0 = 64 * j;
        wgmma_wait<1>();
        reg_fence(sc);
        fence_acc();
        const bool mask = kt0 + 63 > rq0;   // the diagonal tile
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(fmaf(sc[4 * i + e], sl2, -L2[e >> 1]));
                if (mask && kt0 + 8 * i + 2 * t4 + (e & 1) > row + 8 * (e >> 1)) { p = 0.f; }
                sc[4 * i + e] = p;
            }
        wgmma_wait<0>();
        reg_fence(dp);
#pragma unroll
        for (int i = 0; i < 32; i++) { dp[i] = sc[i] * (dp[i] - Dv[(i >> 1) & 1]); }
        v6_pack(dsa, dp);
        fence_acc();
        wgmma_fence();
        v6_issue_acc<NP>(dqa, dsa, smem_u32(sK + s * TILE));
        wgmma_commit();
    };
    auto release = [&](int j) {
        __syncwarp();
        if (lane == 0) { mbar_arrive(empty + j % ST); }
        if (threadIdx.x == 0 && j + ST < nkv) {
            mbar_wait(empty + j % ST, (j / ST) & 1);
            load(j + ST);
        }
        __syncwarp();
    };
    if (!OVL) {
        for (int j = 0; j < nkv; j++) {
            issue_sd(j);
            if (active(j)) {
                finish(j);
                wgmma_wait<0>();
                fence_acc();
            }
            release(j);
        }
    } else {
        issue_sd(0);
        for (int j = 0; j < nkv; j++) {
            if (active(j)) { finish(j); }
            else { wgmma_wait<0>(); fence_acc(); }
            if (j > 0) { release(j - 1); }
            if (j + 1 < nkv) { issue_sd(j + 1); }
        }
        wgmma_wait<0>();
        fence_acc();
    }
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {   // rows past T are not stored
        if (row + 8 * hh >= T) { continue; }
        bf16 *o = dq + (((size_t)b * T + row + 8 * hh) * NH + h) * HD;
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                *(uint32_t *)(o + 64 * p + 8 * i + 2 * t4) =
                    pack_bf16(dqa[p][4 * i + 2 * hh] * scale, dqa[p][4 * i + 2 * hh + 1] * scale);
            }
    }
#else
    __trap();
#endif
}

// Host emulation of v6's operand layouts (run by --cpu-selftest), on v5's decoders (emu_kmajor,
// emu_nmajor): whole blocks of both passes (variant 0, two warpgroups, at T = 192; every block of
// variant 1, one warpgroup, at T = 150 with its tails; HD 64 and 128) on small integers, through the
// smem images TMA's swizzle makes of each 64-row tile, the kernels' descriptors and step offsets,
// the accumulator layout, v6_pack's A fragments, the kernels' column/row indexing of lse and D,
// their causal masks and skip conditions, and their epilogue coordinates. exp2 is replaced by an
// exact integer stand-in (P = S + L), so dK, dV and dQ must equal the direct causal products
// exactly; every output element must be written exactly once.
struct V6Emu {
    std::vector<int> smem;   // one int per bf16 slot
    std::vector<int> hits;
    explicit V6Emu(size_t bytes) : smem(bytes / 2, INT32_MIN), hits(bytes / 2, 0) {}
    // TMA: rows [r0, r0 + 64) of src (T rows of HD) as HD/64 panels of 8 KB at base; rows past T: zeros
    void tma(const std::vector<int> &src, int HD, int T, int r0, uint32_t base) {
        for (int p = 0; p < HD / 64; p++)
            for (int r = 0; r < 64; r++)
                for (int c = 0; c < 64; c++) {
                    const uint32_t a = base + p * 8192 + v5_swz(r, c);
                    smem[a / 2] = r0 + r < T ? src[(size_t)(r0 + r) * HD + 64 * p + c] : 0;
                    hits[a / 2]++;
                }
    }
    // v6_issue_rowdot: acc[thread][v] = sum over the head dimension, tiles at a (rows = M), b (rows = N)
    void rowdot(double (*acc)[32], int HD, uint32_t a, uint32_t b) const {
        for (int th = 0; th < 128; th++)
            for (int v = 0; v < 32; v++) { acc[th][v] = 0; }
        for (int kk = 0; kk < HD / 16; kk++) {
            const uint32_t off = (kk / 4) * 8192 + (kk % 4) * 32;
            const uint64_t da = v5_desc(a + off, 16, 1024), db = v5_desc(b + off, 16, 1024);
            for (int th = 0; th < 128; th++)
                for (int v = 0; v < 32; v++) {
                    const int w = th / 32, lane = th % 32;
                    const int row = 16 * w + lane / 4 + 8 * ((v >> 1) & 1), col = 8 * (v >> 2) + 2 * (lane % 4) + (v & 1);
                    for (int k = 0; k < 16; k++) {
                        acc[th][v] += (double)smem[emu_kmajor(da, row, k) / 2] * smem[emu_kmajor(db, col, k) / 2];
                    }
                }
        }
    }
    // v6_pack then v6_issue_acc: acc[thread][p][v] += A B, A = x (an accumulator) as fragments, B N-major at b
    void accum(double (*acc)[2][32], int HD, const double (*x)[32], uint32_t b, int *bad) const {
        for (int kc = 0; kc < 4; kc++) {
            double A[64][16];
            int cov[64][16] = {};
            for (int th = 0; th < 128; th++)
                for (int r = 0; r < 4; r++)
                    for (int e = 0; e < 2; e++) {   // a[kc][r] = (x[8kc + 2r], x[8kc + 2r + 1])
                        const int w = th / 32, lane = th % 32;
                        const int row = 16 * w + lane / 4 + 8 * (r & 1), k = 8 * (r >> 1) + 2 * (lane % 4) + e;
                        A[row][k] = x[th][8 * kc + 2 * r + e];
                        cov[row][k]++;
                    }
            for (int r = 0; r < 64; r++)
                for (int k = 0; k < 16; k++) { *bad += cov[r][k] != 1; }
            for (int p = 0; p < HD / 64; p++) {
                const uint64_t db = v5_desc(b + p * 8192 + kc * 2048, 8192, 1024);
                for (int th = 0; th < 128; th++)
                    for (int v = 0; v < 32; v++) {
                        const int w = th / 32, lane = th % 32;
                        const int row = 16 * w + lane / 4 + 8 * ((v >> 1) & 1), col = 8 * (v >> 2) + 2 * (lane % 4) + (v & 1);
                        for (int k = 0; k < 16; k++) { acc[th][p][v] += A[row][k] * smem[emu_nmajor(db, k, col) / 2]; }
                    }
            }
        }
    }
};

// One head (G = 1) of both passes with NWG warpgroups a block at sequence length T: the dk/dv blocks
// kb0..kb1 and the dq blocks qb0..qb1 (each owns the BLK keys or query rows of its index). As the
// kernels at any T: TMA zero-fills rows past T; lse and D of queries past T are +inf and 0, and the
// stand-in maps lse = +inf to p = 0 (exp2(x - inf) = 0); nq and nkv as the kernels'; outputs past T
// must not be written, every other output element of the emulated blocks exactly once.
template <int HD, int NWG>
static int v6_selftest_case(int T, int kb0, int kb1, int qb0, int qb1) {
    typedef V6Cfg<HD, NWG> C;
    constexpr int NP = C::NP, TILE = C::TILE, ST = C::ST, BLK = C::BLK;
    int bad = 0;
    std::vector<int> Q(T * HD), K(T * HD), V(T * HD), dO(T * HD), L(T), D(T);
    for (auto *x : {&Q, &K, &V, &dO}) for (auto &y : *x) { y = (int)(rng_u64() % 5) - 2; }
    for (int t = 0; t < T; t++) { L[t] = (int)(rng_u64() % 7) - 3; D[t] = (int)(rng_u64() % 7) - 3; }
    auto S = [&](const std::vector<int> &A, int i, const std::vector<int> &B, int j) {
        double x = 0;
        for (int d = 0; d < HD; d++) { x += (double)A[i * HD + d] * B[j * HD + d]; }
        return x;
    };
    auto Lq = [&](int q) { return q < T ? (double)L[q] : INFINITY; };   // the kernels' lse, D past T
    auto Dq = [&](int q) { return q < T ? (double)D[q] : 0.0; };
    auto P = [](double s, double l) { return l == INFINITY ? 0.0 : s + l; };   // exp2's stand-in
    static double acc1[128][32], acc2[128][32], o1[2][128][2][32], o2[2][128][2][32];
    // ---- dk/dv blocks; smem offsets as in the kernel (base 0, 1024-aligned)
    for (int kb = kb0; kb <= kb1; kb++) {
        const uint32_t sK = 0, sV = sK + NWG * TILE, sQ = sV + NWG * TILE, sdO = sQ + ST * TILE;
        V6Emu em(sdO + ST * TILE);
        const int k0 = kb * BLK, i0 = k0 / 64, nq = (T + 63) / 64 - i0;
        for (int w = 0; w < NWG; w++) { em.tma(K, HD, T, k0 + 64 * w, sK + w * TILE); em.tma(V, HD, T, k0 + 64 * w, sV + w * TILE); }
        memset(o1, 0, sizeof o1); memset(o2, 0, sizeof o2);   // o1 = dK, o2 = dV
        for (int it = 0; it < nq; it++) {   // one head
            const int s = it % ST, qt0 = (i0 + it % nq) * 64;
            std::fill(em.hits.begin() + (sQ + s * TILE) / 2, em.hits.begin() + (sdO + ST * TILE) / 2, 0);
            em.tma(Q, HD, T, qt0, sQ + s * TILE); em.tma(dO, HD, T, qt0, sdO + s * TILE);
            for (int wg = 0; wg < NWG; wg++) {
                const int kw0 = k0 + 64 * wg;
                if (!(qt0 + 63 >= kw0)) { continue; }
                em.rowdot(acc1, HD, sK + wg * TILE, sQ + s * TILE);   // S^T
                em.rowdot(acc2, HD, sV + wg * TILE, sdO + s * TILE);  // dP^T
                const bool mask = qt0 < kw0 + 63;
                for (int th = 0; th < 128; th++) {
                    const int wl = th / 32, g = th % 32 / 4, t4 = th % 4, key = kw0 + 16 * wl + g;
                    for (int i = 0; i < 8; i++)
                        for (int e = 0; e < 4; e++) {
                            const int c = 8 * i + 2 * t4 + (e & 1);   // the kernel's cL / cD index
                            double p = P(acc1[th][4 * i + e], Lq(qt0 + c));
                            if (mask && qt0 + 8 * i + 2 * t4 + (e & 1) < key + 8 * (e >> 1)) { p = 0; }
                            acc1[th][4 * i + e] = p;
                            acc2[th][4 * i + e] = p * (acc2[th][4 * i + e] - Dq(qt0 + c));
                        }
                }
                em.accum(o2[wg], HD, acc1, sdO + s * TILE, &bad);
                em.accum(o1[wg], HD, acc2, sQ + s * TILE, &bad);
            }
        }
        for (int x : em.hits) { bad += x > 1; }
        std::vector<int> cov(BLK * HD, 0);
        for (int wg = 0; wg < NWG; wg++)
            for (int th = 0; th < 128; th++)
                for (int hh = 0; hh < 2; hh++)
                    for (int p = 0; p < NP; p++)
                        for (int i = 0; i < 8; i++)
                            for (int e = 0; e < 2; e++) {
                                const int key = k0 + 64 * wg + 16 * (th / 32) + th % 32 / 4 + 8 * hh;
                                const int col = 64 * p + 8 * i + 2 * (th % 4) + e;
                                if (key >= T) { continue; }   // the kernel's epilogue: not stored
                                cov[(key - k0) * HD + col]++;
                                double rk = 0, rv = 0;
                                for (int q = key; q < T; q++) {
                                    const double p_ = S(K, key, Q, q) + L[q];
                                    rv += p_ * dO[q * HD + col];
                                    rk += p_ * (S(V, key, dO, q) - D[q]) * Q[q * HD + col];
                                }
                                bad += o1[wg][th][p][4 * i + 2 * hh + e] != rk;
                                bad += o2[wg][th][p][4 * i + 2 * hh + e] != rv;
                            }
        for (int r = 0; r < BLK; r++)
            for (int c = 0; c < HD; c++) { bad += cov[r * HD + c] != (k0 + r < T ? 1 : 0); }
    }
    const int bad_dkdv = bad;
    // ---- dq blocks
    for (int qb = qb0; qb <= qb1; qb++) {
        const uint32_t sQ = 0, sdO = sQ + NWG * TILE, sK = sdO + NWG * TILE, sV = sK + ST * TILE;
        V6Emu em(sV + ST * TILE);
        const int q0 = qb * BLK, nkv = (std::min(q0 + BLK, T) - 1) / 64 + 1;
        for (int w = 0; w < NWG; w++) { em.tma(Q, HD, T, q0 + 64 * w, sQ + w * TILE); em.tma(dO, HD, T, q0 + 64 * w, sdO + w * TILE); }
        memset(o1, 0, sizeof o1);
        for (int j = 0; j < nkv; j++) {
            const int s = j % ST, kt0 = 64 * j;
            em.tma(K, HD, T, kt0, sK + s * TILE); em.tma(V, HD, T, kt0, sV + s * TILE);
            for (int wg = 0; wg < NWG; wg++) {
                const int rq0 = q0 + 64 * wg;
                if (!(kt0 <= rq0 + 63)) { continue; }
                em.rowdot(acc1, HD, sQ + wg * TILE, sK + s * TILE);
                em.rowdot(acc2, HD, sdO + wg * TILE, sV + s * TILE);
                const bool mask = kt0 + 63 > rq0;
                for (int th = 0; th < 128; th++) {
                    const int row = rq0 + 16 * (th / 32) + th % 32 / 4, t4 = th % 4;
                    for (int i = 0; i < 8; i++)
                        for (int e = 0; e < 4; e++) {
                            double p = P(acc1[th][4 * i + e], Lq(row + 8 * (e >> 1)));
                            if (mask && kt0 + 8 * i + 2 * t4 + (e & 1) > row + 8 * (e >> 1)) { p = 0; }
                            acc1[th][4 * i + e] = p;
                        }
                    for (int i = 0; i < 32; i++) { acc2[th][i] = acc1[th][i] * (acc2[th][i] - Dq(row + 8 * ((i >> 1) & 1))); }
                }
                em.accum(o1[wg], HD, acc2, sK + s * TILE, &bad);
            }
        }
        std::vector<int> cov(BLK * HD, 0);
        for (int wg = 0; wg < NWG; wg++)
            for (int th = 0; th < 128; th++)
                for (int hh = 0; hh < 2; hh++)
                    for (int p = 0; p < NP; p++)
                        for (int i = 0; i < 8; i++)
                            for (int e = 0; e < 2; e++) {
                                const int row = q0 + 64 * wg + 16 * (th / 32) + th % 32 / 4 + 8 * hh;
                                const int col = 64 * p + 8 * i + 2 * (th % 4) + e;
                                if (row >= T) { continue; }   // not stored
                                cov[(row - q0) * HD + col]++;
                                double r = 0;
                                for (int k = 0; k <= row; k++) {
                                    r += (S(Q, row, K, k) + L[row]) * (S(dO, row, V, k) - D[row]) * K[k * HD + col];
                                }
                                bad += o1[wg][th][p][4 * i + 2 * hh + e] != r;
                            }
        for (int r = 0; r < BLK; r++)
            for (int c = 0; c < HD; c++) { bad += cov[r * HD + c] != (q0 + r < T ? 1 : 0); }
    }
    bad += (C::DKDV_SMEM > 227 * 1024) || (C::DQ_SMEM > 227 * 1024) || (C::TILE % 1024);
    printf("v6 emulation HD=%d NWG=%d T=%d (dk/dv blocks %d-%d, dq blocks %d-%d: TMA tiles, K-/N-major descriptors, "
           "transposed products, register A fragments, masks, lse/D indexing, tails, epilogue coordinates): %s "
           "(dk/dv errors %d, total %d)\n", HD, NWG, T, kb0, kb1, qb0, qb1, bad ? "FAIL" : "ok", bad_dkdv, bad);
    return bad ? 1 : 0;
}
// variant 0's blocks 0 at T = 192 (three q tiles for the dk/dv block, incl. warpgroup 1's fully masked
// first one; two kv tiles for the dq block, incl. warpgroup 0's skipped one), and every block of
// variant 1 (the trainer's) at T = 150: partial last tiles of keys and queries, 22 rows past T
template <int HD>
static int v6_selftest_hd() { return v6_selftest_case<HD, 2>(192, 0, 0, 0, 0) + v6_selftest_case<HD, 1>(150, 0, 2, 0, 2); }
static int v6_selftest() { return v6_selftest_hd<64>() + v6_selftest_hd<128>(); }

// ----------------------------------------------------------------------------
// host: launchers and dispatch

struct Bufs {
    bf16 *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse, *D;
    float *dq32;        // v4: fp32 partial sums of dq (B, T, NH, HD)
    unsigned *turns;    // v4: B*NH*ceil(T/64) turn counters, then the ticket counter; zero between calls
};

template <typename K>
static void set_smem(K kern, size_t bytes) {
    cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int NI>
static void forward_v1(const Shape &s, const Bufs &d) {
    const size_t warps = (size_t)s.B * s.T * s.NH;
    attention_forward_v1_kernel<NI><<<(unsigned)((warps + 7) / 8), 256>>>(d.out, d.lse, d.q, d.k, d.v, s.B, s.T, s.NH,
                                                                         s.NKV, 1.f / sqrtf((float)s.HD));
    launch_check("attention_forward_v1_kernel");
}

template <int HD>
static void backward_prep(const Shape &s, const Bufs &d) {
    const size_t threads = (size_t)s.B * s.T * s.NH * (HD / 8);
    attention_backward_prep_kernel<HD><<<(unsigned)((threads + 255) / 256), 256>>>(d.D, d.dout, d.out, s.B, s.T, s.NH);
    launch_check("attention_backward_prep_kernel");
}

template <int NI>
static void backward_v1(const Shape &s, const Bufs &d) {
    backward_prep<NI * 32>(s, d);
    const float scale = 1.f / sqrtf((float)s.HD);
    const size_t wq = (size_t)s.B * s.T * s.NH, wk = (size_t)s.B * s.T * s.NKV;
    attention_backward_dkdv_v1_kernel<NI><<<(unsigned)((wk + 7) / 8), 256>>>(d.dk, d.dv, d.q, d.k, d.v, d.dout, d.lse,
                                                                             d.D, s.B, s.T, s.NH, s.NKV, scale);
    launch_check("attention_backward_dkdv_v1_kernel");
    attention_backward_dq_v1_kernel<NI><<<(unsigned)((wq + 7) / 8), 256>>>(d.dq, d.q, d.k, d.v, d.dout, d.lse, d.D,
                                                                           s.B, s.T, s.NH, s.NKV, scale);
    launch_check("attention_backward_dq_v1_kernel");
}

// flash configuration: warps per block of the forward, dq and dk/dv kernels; kv tile of forward and dq; q tile of dk/dv
template <int HD, int NW, int BC, int BQ, bool KV_REGS>
struct Flash {
    static size_t fwd_smem() { return (size_t)(NW * 16 + 4 * BC) * (HD + PAD) * sizeof(bf16); }
    static size_t dq_smem() { return (size_t)(2 * NW * 16 + 4 * BC) * (HD + PAD) * sizeof(bf16); }
    static size_t dkdv_smem() { return (size_t)(2 * NW * 16 + 4 * BQ) * (HD + PAD) * sizeof(bf16) + 4 * BQ * sizeof(float); }
    static void forward(const Shape &s, const Bufs &d) {
        static bool init = false;
        auto kern = attention_forward_flash_kernel<HD, NW, BC>;
        if (!init) { set_smem(kern, fwd_smem()); init = true; }
        kern<<<dim3(s.T / (NW * 16), s.NH, s.B), NW * 32, fwd_smem()>>>(d.out, d.lse, d.q, d.k, d.v, s.T, s.NH, s.NKV,
                                                                     LOG2E / sqrtf((float)HD));
        launch_check("attention_forward_flash_kernel");
    }
    static void backward(const Shape &s, const Bufs &d) {
        static bool init = false;
        auto kdkdv = attention_backward_dkdv_flash_kernel<HD, NW, BQ, KV_REGS>;
        auto kdq = attention_backward_dq_flash_kernel<HD, NW, BC>;
        if (!init) { set_smem(kdkdv, dkdv_smem()); set_smem(kdq, dq_smem()); init = true; }
        const float scale = 1.f / sqrtf((float)HD), sl2 = scale * LOG2E;
        backward_prep<HD>(s, d);
        kdkdv<<<dim3(s.T / (NW * 16), s.NKV, s.B), NW * 32, dkdv_smem()>>>(d.dk, d.dv, d.q, d.k, d.v, d.dout, d.lse,
                                                                         d.D, s.T, s.NH, s.NKV, scale, sl2);
        launch_check("attention_backward_dkdv_flash_kernel");
        kdq<<<dim3(s.T / (NW * 16), s.NH, s.B), NW * 32, dq_smem()>>>(d.dq, d.q, d.k, d.v, d.dout, d.lse, d.D, s.T,
                                                                    s.NH, s.NKV, scale, sl2);
        launch_check("attention_backward_dq_flash_kernel");
    }
    // registers, local memory and resident blocks per SM of the three kernels, read off the device
    static void info(const char *tag) {
        forward_info(tag, "fwd", (const void *)attention_forward_flash_kernel<HD, NW, BC>, NW * 32, fwd_smem());
        forward_info(tag, "dkdv", (const void *)attention_backward_dkdv_flash_kernel<HD, NW, BQ, KV_REGS>, NW * 32,
                     dkdv_smem());
        forward_info(tag, "dq", (const void *)attention_backward_dq_flash_kernel<HD, NW, BC>, NW * 32, dq_smem());
    }
    static void forward_info(const char *tag, const char *name, const void *kern, int threads, size_t smem) {
        cudaFuncAttributes a;
        int blocks = 0;
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cudaCheck(cudaFuncGetAttributes(&a, kern));
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kern, threads, smem));
        printf("  %s HD=%d %-4s: %3d regs, %zu B local, %6zu B smem, %d threads, %d blocks/SM (%d warps)\n", tag, HD,
               name, a.numRegs, (size_t)a.localSizeBytes, smem, threads, blocks, blocks * threads / 32);
    }
};
// v2: 4 warps (64 rows); v3: 8 warps (128 rows). HD=128 dk/dv: q tiles of 32, K/V fragments from smem.
typedef Flash<64, 4, 64, 64, true> V2_64;
typedef Flash<128, 4, 64, 32, false> V2_128;
typedef Flash<64, 8, 64, 64, true> V3_64;
typedef Flash<128, 8, 64, 32, false> V3_128;

// v4: v3's forward (v1's where T % 128 != 0: the lab's flash forwards take no tails; the check of
// v4's tails needs some forward) and the fused backward: prep + attention_backward_fused_kernel.
static size_t v4_smem() { return (size_t)(2 * 64 + 4 * 64 + 64) * (64 + PAD) * sizeof(bf16) + 4 * 64 * sizeof(float); }
static void forward_v4(const Shape &s, const Bufs &d) {
    if (s.T % 128 == 0) { V3_64::forward(s, d); } else { forward_v1<2>(s, d); }
}
// v4's variants (--variant K). 0: v4 as designed and measured. 1, 2: v4 timing ablations. 3-7: the lite
// kernel's deterministic candidates. 8, 9: lite timing ablations. Ablations are never --check'ed.
// lite variants write dq in fp32 (d.dq32, as the trainer's dq); v4's 0-2 write bf16 d.dq.
struct V4Variant { const char *name; bool timing_only, dq_fp32; const void *kern; };
typedef void (*LiteKern)(float *, bf16 *, bf16 *, const bf16 *, const bf16 *, const bf16 *, const bf16 *,
                         const float *, const float *, unsigned *, unsigned *, int, int, int, int, float, float);
static const int NVARIANTS = 10;
static const V4Variant v4_variants[NVARIANTS] = {
    {"v4: desc chain, light-first, ld/add/st + __threadfence", false, false, (const void *)attention_backward_fused_kernel<64, bf16, 0>},
    {"ABLATION v4 no turn waits/fences (racy)", true, false, (const void *)attention_backward_fused_kernel<64, bf16, 1>},
    {"ABLATION v4 no dQ at all", true, false, (const void *)attention_backward_fused_kernel<64, bf16, 2>},
    {"lite: v4 order (desc, light-first), red + warp turns", false, true, (const void *)attention_backward_fused_lite_kernel<bf16, 1, 0, false, true, true>},
    {"lite: asc chain, heavy-first, lockstep visits", false, true, (const void *)attention_backward_fused_lite_kernel<bf16, 2, 1, true, true, true>},
    {"lite: asc, heavy-first in batches of 16 groups, lockstep", false, true, (const void *)attention_backward_fused_lite_kernel<bf16, 2, 16, true, true, true>},
    {"lite: asc, heavy-first in batches of 32 groups, lockstep", false, true, (const void *)attention_backward_fused_lite_kernel<bf16, 2, 32, true, true, true>},
    {"lite: as 5, ld.acquire at use (no pre-poll)", false, true, (const void *)attention_backward_fused_lite_kernel<bf16, 2, 16, true, true, false>},
    {"ABLATION lite as 5, no order (racy red, FA2-like)", true, true, (const void *)attention_backward_fused_lite_kernel<bf16, 0, 16, true, true, true>},
    {"ABLATION lite as 5, no dQ at all", true, true, (const void *)attention_backward_fused_lite_kernel<bf16, 0, 16, true, false, true>},
};
static int g_variant = 0;   // the v4 variant run_backward uses
static void backward_v4(const Shape &s, const Bufs &d) {
    static bool init[NVARIANTS] = {};
    const V4Variant &V = v4_variants[g_variant];
    if (!init[g_variant]) {
        cudaCheck(cudaFuncSetAttribute(V.kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)v4_smem()));
        init[g_variant] = true;
    }
    const float scale = 1.f / sqrtf(64.f), sl2 = scale * LOG2E;
    backward_prep<64>(s, d);
    const int nkt = (s.T + 63) / 64;
    unsigned *ticket = d.turns + (size_t)s.B * s.NH * nkt * 4;   // after the lite variants' per-warp counters
    const unsigned grid = nkt * s.NKV * s.B;
    if (g_variant < 3) {
        auto kern = (void (*)(bf16 *, float *, bf16 *, bf16 *, const bf16 *, const bf16 *, const bf16 *, const bf16 *,
                              const float *, const float *, unsigned *, unsigned *, int, int, int, int, float,
                              float))V.kern;
        kern<<<grid, 128, v4_smem()>>>(d.dq, d.dq32, d.dk, d.dv, d.q, d.k, d.v, d.dout, d.lse, d.D, d.turns, ticket,
                                       s.B, s.T, s.NH, s.NKV, scale, sl2);
    } else {
        ((LiteKern)V.kern)<<<grid, 128, v4_smem()>>>(d.dq32, d.dk, d.dv, d.q, d.k, d.v, d.dout, d.lse, d.D, d.turns,
                                                     ticket, s.B, s.T, s.NH, s.NKV, scale, sl2);
    }
    launch_check(V.name);
}

// v5: the wgmma/TMA forward (attention_forward_wgmma_kernel) and v2's backward, which reads v5's out and lse.
// The tensor maps describe q (B, T, NH*HD bf16) and k, v (B, T, NKV*HD) as 3D tensors (columns fastest)
// with boxes of 64 columns x box_rows rows x 1 batch in the 128-byte swizzle; rows past T of a batch are
// out of bounds (zero-filled), not the next batch's. Made once per (buffers, shape).
static PFN_cuTensorMapEncodeTiled_v12000 tmap_encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (!fn) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !p) {
            fprintf(stderr, "v5: the driver has no cuTensorMapEncodeTiled (query result %d); update the driver\n", (int)q);
            exit(1);
        }
        fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}
static CUtensorMap make_tmap_3d(const bf16 *base, size_t cols, size_t T, size_t B, int box_rows) {
    CUtensorMap m;
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[2] = {(cuuint64_t)cols * sizeof(bf16), (cuuint64_t)(T * cols * sizeof(bf16))};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, estr[3] = {1, 1, 1};
    const CUresult r = tmap_encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, estr,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "v5: cuTensorMapEncodeTiled failed (CUresult %d) for %zu x %zu x %zu bf16, box 64 x %d\n", (int)r,
                B, T, cols, box_rows);
        exit(1);
    }
    return m;
}
__global__ void v5_probe_kernel(int *built) {
#ifdef V5_DEVICE
    *built = 1;
#else
    *built = 0;
#endif
}
// why v5 cannot run on this GPU or build, or NULL; asked once
static const char *v5_device_unsupported() {
    static int state = -1;
    static char why[160];
    if (state < 0) {
        int dev, major, minor;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        if (major != 9 || minor != 0) {
            snprintf(why, sizeof why, "v5 needs an sm_90 GPU (H100/H200) for wgmma and TMA; this one is sm_%d%d", major, minor);
            state = 0;
        } else {
            int *d, h = 0;
            cudaCheck(cudaMalloc(&d, sizeof(int)));
            v5_probe_kernel<<<1, 1>>>(d);
            launch_check("v5_probe_kernel");
            cudaCheck(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
            cudaCheck(cudaFree(d));
            if (!h) { snprintf(why, sizeof why, "v5: built without sm_90a code; build with nvcc -arch=sm_90a"); }
            state = h;
        }
    }
    return state ? NULL : why;
}
// v5's variants (--variant K with --version 5) = the kernel's MODE: 0 = S_{j+1} and P_j V_j in flight
// during the softmax of S_{j+1} (the intended kernel); 1 = each warpgroup's steps in turn; 2 = as 1
// without the producer warp, two blocks per SM; 3 = as 0 with the two warpgroups issuing in turns;
// 4 = 2's block with S_{j+1} and P_{j-1} V_{j-1} in flight during the softmax of S_j (two S arrays,
// one block per SM); 5 = 2's block with P_{j-1} V_{j-1} in flight during the softmax of S_j (one S
// array, two blocks per SM at HD 64)
static const int V5_NVARIANTS = 6;
static const char *v5_variant_name[V5_NVARIANTS] = {"overlap: S(j+1), PV(j) in flight during softmax(j+1)",
                                                    "serial: S, softmax, PV in turn",
                                                    "serial, no producer warp, 2 blocks/SM",
                                                    "overlap + warpgroups take turns to issue (ping-pong)",
                                                    "no producer warp, S(j+1), PV(j-1) in flight during softmax(j)",
                                                    "no producer warp, PV(j-1) in flight during softmax(j) (FA3 alg. 2)"};
template <int HD>
struct V5 {
    template <int MODE>
    static void launch(const Shape &s, const Bufs &d, const CUtensorMap &tq, const CUtensorMap &tk,
                       const CUtensorMap &tv) {
        typedef V5Cfg<HD, MODE> C;
        static bool init = false;
        if (!init) { set_smem(attention_forward_wgmma_kernel<HD, MODE>, C::SMEM); init = true; }
        attention_forward_wgmma_kernel<HD, MODE><<<dim3(s.NH, s.B, (s.T + C::BR - 1) / C::BR), C::THREADS, C::SMEM>>>(
            d.out, d.lse, tq, tk, tv, s.T, s.NH, s.NKV, LOG2E / sqrtf((float)HD));
        char what[64];
        snprintf(what, sizeof what, "attention_forward_wgmma_kernel (v5.%d)", MODE);
        launch_check(what);
    }
    static void forward(const Shape &s, const Bufs &d, int var) {
        // boxes: q tiles of BR = 128 rows in every mode; K/V tiles of BC rows (HD 64: 128, but 64 in mode 4)
        const int br = V5Cfg<HD>::BR, bc = var >= 4 ? V5Cfg<HD, 4>::BC : V5Cfg<HD>::BC;
        static const void *key[3] = {};
        static Shape ks = {0, 0, 0, 0, 0};
        static int kbc = 0;
        static CUtensorMap tq, tk, tv;
        if (key[0] != d.q || key[1] != d.k || key[2] != d.v || memcmp(&ks, &s, sizeof s) || kbc != bc) {
            tq = make_tmap_3d(d.q, (size_t)s.NH * HD, s.T, s.B, br);
            tk = make_tmap_3d(d.k, (size_t)s.NKV * HD, s.T, s.B, bc);
            tv = make_tmap_3d(d.v, (size_t)s.NKV * HD, s.T, s.B, bc);
            key[0] = d.q; key[1] = d.k; key[2] = d.v; ks = s; kbc = bc;
        }
        if (var == 0) { launch<0>(s, d, tq, tk, tv); }
        else if (var == 1) { launch<1>(s, d, tq, tk, tv); }
        else if (var == 2) { launch<2>(s, d, tq, tk, tv); }
        else if (var == 3) { launch<3>(s, d, tq, tk, tv); }
        else if (var == 4) { launch<4>(s, d, tq, tk, tv); }
        else { launch<5>(s, d, tq, tk, tv); }
    }
    template <int MODE>
    static void info1() {
        char tag[16];
        snprintf(tag, sizeof tag, "v5.%d", MODE);
        Flash<HD, 4, 64, 64, true>::forward_info(tag, "fwd", (const void *)attention_forward_wgmma_kernel<HD, MODE>,
                                                 V5Cfg<HD, MODE>::THREADS, V5Cfg<HD, MODE>::SMEM);
    }
    static void info() { info1<0>(); info1<1>(); info1<2>(); info1<3>(); info1<4>(); info1<5>(); }
};

// v6: v5's forward (variant 0; variant 2 where T % 128 != 0) and the wgmma backward: prep +
// attention_backward_dkdv_wgmma_kernel + attention_backward_dq_wgmma_kernel. 3D tensor maps (as v5's) of
// q, dout (columns NH*HD, T, B) and k, v (NKV*HD, T, B), boxes of 64 columns x 64 rows x 1; made once
// per (buffers, shape). Variants (--variant K with --version 6): 0 = two warpgroups a block (128 keys
// or query rows), 1 = one (64), both with each step's products in turn; 2 = 0 with the next step's S,
// dP issued behind this step's accumulation. Variant 1 (the trainer's) is checked at any T, the
// others at T % 128 == 0 (`unsupported`).
static const int V6_NVARIANTS = 3;
static const char *v6_variant_name[V6_NVARIANTS] = {"2 warpgroups a block (128 keys / query rows), serial steps",
                                                    "1 warpgroup a block (64 keys / query rows), serial steps",
                                                    "2 warpgroups a block, next S/dP issued behind dK/dV (dQ)"};
template <int HD>
struct V6 {
    template <int NWG, bool OVL>
    static void launch(const Shape &s, const Bufs &d, const CUtensorMap (&tm)[4]) {
        typedef V6Cfg<HD, NWG> C;
        auto kdkdv = attention_backward_dkdv_wgmma_kernel<HD, NWG, OVL>;
        auto kdq = attention_backward_dq_wgmma_kernel<HD, NWG, OVL>;
        static bool init = false;
        if (!init) { set_smem(kdkdv, C::DKDV_SMEM); set_smem(kdq, C::DQ_SMEM); init = true; }
        const float scale = 1.f / sqrtf((float)HD), sl2 = scale * LOG2E;
        const int nb = (s.T + C::BLK - 1) / C::BLK, bulk = s.T % 4 == 0;   // d.lse, d.D: cudaMalloc'd, 256-aligned
        backward_prep<HD>(s, d);
        kdkdv<<<dim3(s.NKV, s.B, nb), C::THREADS, C::DKDV_SMEM>>>(d.dk, d.dv, tm[0], tm[1], tm[2], tm[3], d.lse, d.D,
                                                                s.T, s.NH, s.NKV, bulk, scale, sl2);
        char what[64];
        snprintf(what, sizeof what, "attention_backward_dkdv_wgmma_kernel (v6.%d)", OVL ? 2 : NWG == 2 ? 0 : 1);
        launch_check(what);
        kdq<<<dim3(s.NH, s.B, nb), C::THREADS, C::DQ_SMEM>>>(d.dq, tm[0], tm[1], tm[2], tm[3], d.lse, d.D, s.T, s.NH,
                                                           s.NKV, scale, sl2);
        snprintf(what, sizeof what, "attention_backward_dq_wgmma_kernel (v6.%d)", OVL ? 2 : NWG == 2 ? 0 : 1);
        launch_check(what);
    }
    static void backward(const Shape &s, const Bufs &d, int var) {
        static const void *key[4] = {};
        static Shape ks = {0, 0, 0, 0, 0};
        static CUtensorMap tm[4];   // q, k, v, dout
        if (key[0] != d.q || key[1] != d.k || key[2] != d.v || key[3] != d.dout || memcmp(&ks, &s, sizeof s)) {
            tm[0] = make_tmap_3d(d.q, (size_t)s.NH * HD, s.T, s.B, 64);
            tm[1] = make_tmap_3d(d.k, (size_t)s.NKV * HD, s.T, s.B, 64);
            tm[2] = make_tmap_3d(d.v, (size_t)s.NKV * HD, s.T, s.B, 64);
            tm[3] = make_tmap_3d(d.dout, (size_t)s.NH * HD, s.T, s.B, 64);
            key[0] = d.q; key[1] = d.k; key[2] = d.v; key[3] = d.dout; ks = s;
        }
        if (var == 0) { launch<2, false>(s, d, tm); }
        else if (var == 1) { launch<1, false>(s, d, tm); }
        else { launch<2, true>(s, d, tm); }
    }
    template <int NWG, bool OVL>
    static void info1() {
        char tag[16];
        snprintf(tag, sizeof tag, "v6.%d", OVL ? 2 : NWG == 2 ? 0 : 1);
        typedef V6Cfg<HD, NWG> C;
        Flash<HD, 4, 64, 64, true>::forward_info(tag, "dkdv",
                                                 (const void *)attention_backward_dkdv_wgmma_kernel<HD, NWG, OVL>,
                                                 C::THREADS, C::DKDV_SMEM);
        Flash<HD, 4, 64, 64, true>::forward_info(tag, "dq", (const void *)attention_backward_dq_wgmma_kernel<HD, NWG, OVL>,
                                                 C::THREADS, C::DQ_SMEM);
    }
    static void info() { info1<2, false>(); info1<1, false>(); info1<2, true>(); }
};

static const int NVERSIONS = 6;
static const char *version_name[NVERSIONS + 1] = {"", "v1 warp-per-row fp32", "v2 flash mma.sync 4 warps",
                                                  "v3 flash mma.sync 8 warps",
                                                  "v4 v3 fwd + fused bwd (ordered fp32 dQ)",
                                                  "v5 fwd wgmma + TMA + mbarrier pipeline (v2 bwd)",
                                                  "v6 bwd wgmma + TMA, split dk/dv + dq (v5.0 fwd)"};

// the version's constraints on the shape, or NULL
static const char *unsupported(int ver, const Shape &s) {
    if (s.NKV <= 0 || s.NH % s.NKV) { return "NH must be a multiple of NKV"; }
    if (s.HD != 64 && s.HD != 128) { return "HD must be 64 or 128"; }
    if (ver == 4 && s.HD != 64) { return "v4: HD must be 64 (register budget)"; }
    if ((ver == 2 || ver == 3) && s.T % 128) { return "T must be a multiple of 128"; }
    // v5 variants 2 (the trainer's), 4 and 5, v6 variant 1 (the trainer's) take any T; the others are
    // checked at T % 128 == 0 only
    if (ver == 5 && g_variant != 2 && g_variant < 4 && s.T % 128) {
        return "T must be a multiple of 128 (v5 variants 0, 1, 3)";
    }
    if (ver == 6 && g_variant != 1 && s.T % 128) { return "T must be a multiple of 128 (v6 variants 0, 2)"; }
    if (ver == 5 || ver == 6) { return v5_device_unsupported(); }
    return NULL;
}

static void run_forward(int ver, const Shape &s, const Bufs &d) {
    if (ver == 1) { s.HD == 64 ? forward_v1<2>(s, d) : forward_v1<4>(s, d); }
    else if (ver == 2) { s.HD == 64 ? V2_64::forward(s, d) : V2_128::forward(s, d); }
    else if (ver == 3) { s.HD == 64 ? V3_64::forward(s, d) : V3_128::forward(s, d); }
    else if (ver == 5) { s.HD == 64 ? V5<64>::forward(s, d, g_variant) : V5<128>::forward(s, d, g_variant); }
    else if (ver == 6) {   // v5.0; v5.2 (any T) at tails
        const int fv = s.T % 128 ? 2 : 0;
        s.HD == 64 ? V5<64>::forward(s, d, fv) : V5<128>::forward(s, d, fv);
    }
    else { forward_v4(s, d); }
}
// needs out and lse of a forward run (the backward reads them, as in the trainer)
static void run_backward(int ver, const Shape &s, const Bufs &d) {
    if (ver == 1) { s.HD == 64 ? backward_v1<2>(s, d) : backward_v1<4>(s, d); }
    else if (ver == 2 || (ver == 5 && s.T % 128 == 0)) { s.HD == 64 ? V2_64::backward(s, d) : V2_128::backward(s, d); }
    else if (ver == 5) { s.HD == 64 ? backward_v1<2>(s, d) : backward_v1<4>(s, d); }   // the lab's v2 takes no tails
    else if (ver == 3) { s.HD == 64 ? V3_64::backward(s, d) : V3_128::backward(s, d); }
    else if (ver == 6) { s.HD == 64 ? V6<64>::backward(s, d, g_variant) : V6<128>::backward(s, d, g_variant); }
    else { backward_v4(s, d); }
}

static size_t nq_of(const Shape &s) { return (size_t)s.B * s.T * s.NH * s.HD; }
static size_t nk_of(const Shape &s) { return (size_t)s.B * s.T * s.NKV * s.HD; }
static size_t nl_of(const Shape &s) { return (size_t)s.B * s.NH * s.T; }
static size_t nturns_of(const Shape &s) { return (size_t)s.B * s.NH * ((s.T + 63) / 64) * 4 + 1; }   // per warp (lite), then the ticket

static void alloc_bufs(Bufs &d, const Shape &s) {
    const size_t nq = nq_of(s), nk = nk_of(s), nl = nl_of(s);
    cudaCheck(cudaMalloc(&d.q, nq * 2)); cudaCheck(cudaMalloc(&d.out, nq * 2));
    cudaCheck(cudaMalloc(&d.dout, nq * 2)); cudaCheck(cudaMalloc(&d.dq, nq * 2));
    cudaCheck(cudaMalloc(&d.k, nk * 2)); cudaCheck(cudaMalloc(&d.v, nk * 2));
    cudaCheck(cudaMalloc(&d.dk, nk * 2)); cudaCheck(cudaMalloc(&d.dv, nk * 2));
    cudaCheck(cudaMalloc(&d.lse, nl * 4)); cudaCheck(cudaMalloc(&d.D, nl * 4));
    cudaCheck(cudaMalloc(&d.dq32, nq * 4));
    cudaCheck(cudaMalloc(&d.turns, nturns_of(s) * sizeof(unsigned)));
    cudaCheck(cudaMemset(d.turns, 0, nturns_of(s) * sizeof(unsigned)));   // once: v4 leaves them at 0
}
static void free_bufs(Bufs &d) {
    void *p[] = {d.q, d.k, d.v, d.out, d.dout, d.dq, d.dk, d.dv, d.lse, d.D, d.dq32, d.turns};
    for (void *x : p) { cudaCheck(cudaFree(x)); }
}

// ----------------------------------------------------------------------------
// check: fresh random inputs, CPU fp64 reference on the same bf16 values, every
// output poisoned (all bits 1: NaN in bf16 and fp32) before each run.
//
// Tolerance, ||out - ref|| / ||ref|| < 1e-2 for the bf16 outputs: bf16 keeps 8
// significant bits (unit roundoff 2^-9 = 2e-3), so rounding each output alone
// gives about 1.7e-3 (--cpu-selftest prints it); the flash versions also round
// P and dS to bf16 before the second matmul, which adds noise of the same order,
// averaged over the sum. Expected 1e-3..5e-3; an indexing, masking or race bug
// gives 1e-1 and up. lse is fp32 from fp32 accumulation: < 1e-4.
// NaN or Inf anywhere fails. Two runs must also give the same bits (no atomics).

static double rel_err_bf16(const std::vector<uint16_t> &a, const std::vector<double> &ref, bool *finite) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double x = bf2f(a[i]);
        if (!std::isfinite(x)) { *finite = false; }
        num += (x - ref[i]) * (x - ref[i]); den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}
static double rel_err_f32(const std::vector<float> &a, const std::vector<double> &ref, bool *finite) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(a[i])) { *finite = false; }
        num += (a[i] - ref[i]) * (a[i] - ref[i]); den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}
template <typename X>
static void download(std::vector<X> &h, const void *d, size_t n) {
    h.resize(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(X), cudaMemcpyDeviceToHost));
}

static bool check_version(int ver, Shape s, double qsd) {
    const char *why = unsupported(ver, s);
    if (why) { printf("v%d B=%d T=%d NH=%d NKV=%d HD=%d: skipped (%s)\n", ver, s.B, s.T, s.NH, s.NKV, s.HD, why); return true; }
    const size_t nq = nq_of(s), nk = nk_of(s), nl = nl_of(s);
    std::vector<uint16_t> hq, hk, hv, hdo;
    std::vector<double> q, k, v, dout;
    random_bf16(hq, q, nq, qsd);   // qsd > 1: peaky softmax rows, stresses the running max
    random_bf16(hk, k, nk, 1.0);
    random_bf16(hv, v, nk, 1.0);
    random_bf16(hdo, dout, nq, 1.0);
    std::vector<double> out(nq), lse(nl), dq(nq), dk(nk), dv(nk);
    cpu_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    cpu_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), lse.data(), s);

    Bufs d;
    alloc_bufs(d, s);
    cudaCheck(cudaMemcpy(d.q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.dout, hdo.data(), nq * 2, cudaMemcpyHostToDevice));
    std::vector<uint16_t> go[2], gdq[2], gdk[2], gdv[2];
    std::vector<float> gl[2], gdq32[2];
    const bool dq_fp32 = ver == 4 && v4_variants[g_variant].dq_fp32;   // lite: dq in fp32 (d.dq32)
    bool counters_zero = true;   // v4 must leave its turn and ticket counters at 0
    for (int rep = 0; rep < 2; rep++) {
        cudaCheck(cudaMemset(d.dq32, 0xff, nq * 4));   // v4's scratch: never read before written
        cudaCheck(cudaMemset(d.out, 0xff, nq * 2)); cudaCheck(cudaMemset(d.lse, 0xff, nl * 4));
        cudaCheck(cudaMemset(d.dq, 0xff, nq * 2)); cudaCheck(cudaMemset(d.dk, 0xff, nk * 2));
        cudaCheck(cudaMemset(d.dv, 0xff, nk * 2)); cudaCheck(cudaMemset(d.D, 0xff, nl * 4));
        run_forward(ver, s, d);
        cudaCheck(cudaDeviceSynchronize());
        run_backward(ver, s, d);
        cudaCheck(cudaDeviceSynchronize());
        download(go[rep], d.out, nq); download(gl[rep], d.lse, nl);
        if (dq_fp32) { download(gdq32[rep], d.dq32, nq); } else { download(gdq[rep], d.dq, nq); }
        download(gdk[rep], d.dk, nk); download(gdv[rep], d.dv, nk);
        std::vector<unsigned> tc;
        download(tc, d.turns, nturns_of(s));
        for (unsigned x : tc) { counters_zero &= x == 0; }
    }
    // v5 against v2's forward on the same inputs (v1's where T % 128 != 0: v2 takes no tails): out and lse
    double e2o = 0, e2l = 0;
    if (ver == 5) {
        std::vector<uint16_t> o2;
        std::vector<float> l2;
        run_forward(s.T % 128 ? 1 : 2, s, d);
        cudaCheck(cudaDeviceSynchronize());
        download(o2, d.out, nq); download(l2, d.lse, nl);
        std::vector<double> o2d(nq), l2d(nl);
        for (size_t i = 0; i < nq; i++) { o2d[i] = bf2f(o2[i]); }
        for (size_t i = 0; i < nl; i++) { l2d[i] = l2[i]; }
        bool fin2 = true;
        e2o = rel_err_bf16(go[0], o2d, &fin2);
        e2l = rel_err_f32(gl[0], l2d, &fin2);
    }
    // v6 against v2's backward on the same inputs and the same out, lse (v5's forward): dq, dk, dv
    // (v1's where T % 128 != 0: v2 takes no tails)
    double e2q = 0, e2k = 0, e2v = 0;
    const int ref6 = s.T % 128 ? 1 : 2;
    if (ver == 6) {
        std::vector<uint16_t> q2, k2, v2;
        cudaCheck(cudaMemset(d.dq, 0xff, nq * 2)); cudaCheck(cudaMemset(d.dk, 0xff, nk * 2));
        cudaCheck(cudaMemset(d.dv, 0xff, nk * 2)); cudaCheck(cudaMemset(d.D, 0xff, nl * 4));
        run_backward(ref6, s, d);
        cudaCheck(cudaDeviceSynchronize());
        download(q2, d.dq, nq); download(k2, d.dk, nk); download(v2, d.dv, nk);
        std::vector<double> q2d(nq), k2d(nk), v2d(nk);
        for (size_t i = 0; i < nq; i++) { q2d[i] = bf2f(q2[i]); }
        for (size_t i = 0; i < nk; i++) { k2d[i] = bf2f(k2[i]); v2d[i] = bf2f(v2[i]); }
        bool fin2 = true;
        e2q = rel_err_bf16(gdq[0], q2d, &fin2);
        e2k = rel_err_bf16(gdk[0], k2d, &fin2);
        e2v = rel_err_bf16(gdv[0], v2d, &fin2);
        if (!fin2) { e2q = NAN; }   // v2 itself not finite: fails below
    }
    free_bufs(d);
    bool finite = true;
    const double eo = rel_err_bf16(go[0], out, &finite), el = rel_err_f32(gl[0], lse, &finite);
    const double eq = dq_fp32 ? rel_err_f32(gdq32[0], dq, &finite) : rel_err_bf16(gdq[0], dq, &finite);
    const double ek = rel_err_bf16(gdk[0], dk, &finite);
    const double ev = rel_err_bf16(gdv[0], dv, &finite);
    const bool same = go[0] == go[1] && gl[0] == gl[1] && gdq[0] == gdq[1] && gdk[0] == gdk[1] && gdv[0] == gdv[1] &&
                      gdq32[0].size() == gdq32[1].size() &&
                      (gdq32[0].empty() || !memcmp(gdq32[0].data(), gdq32[1].data(), gdq32[0].size() * sizeof(float)));
    const double tol = 1e-2;
    const bool ok = finite && same && counters_zero && eo < tol && el < 1e-4 && eq < tol && ek < tol && ev < tol &&
                    e2o < tol && e2l < 1e-4 && e2q < tol && e2k < tol && e2v < tol;
    char tag[96] = "";
    if (ver == 4) { snprintf(tag, sizeof tag, ".%d", g_variant); }
    if (ver == 5) { snprintf(tag, sizeof tag, ".%d (vs v2 fwd: out %.2e lse %.2e)", g_variant, e2o, e2l); }
    if (ver == 6) { snprintf(tag, sizeof tag, ".%d (vs v%d bwd: dq %.2e dk %.2e dv %.2e)", g_variant, ref6, e2q, e2k, e2v); }
    printf("v%d%s B=%d T=%d NH=%d NKV=%d HD=%d q.sd=%g: rel err out %.2e lse %.2e dq%s %.2e dk %.2e dv %.2e | %s | "
           "repeat %s%s | %s\n", ver, tag, s.B, s.T, s.NH, s.NKV, s.HD, qsd, eo, el, dq_fp32 ? "(fp32)" : "", eq, ek, ev,
           finite ? "all finite" : "NaN/Inf", same ? "bit-identical" : "DIFFERS",
           counters_zero ? "" : " | COUNTERS NOT RESET", ok ? "PASS" : "FAIL");
    return ok;
}

static const Shape *g_check_shape = NULL;   // --shape with --check: that shape only (q.sd 2)
static bool check(int ver) {
    if (g_check_shape) { return check_version(ver, *g_check_shape, 2.0); }
    // T multiples of 128 (v2/v3); GQA 2, 4, 1 (MHA) and MQA; peaky and mild softmax; four with
    // tails (T % 64 != 0; v1, v4, v5.2 and v6.1): partial q and kv tiles, and T = 7 (one partial tile,
    // TMA boxes taller than the tensor; sampling's short T; T % 4 != 0: v6's lse, D copied by hand);
    // T = 1024: 8 (HD 64) and
    // 16 (HD 128) kv tiles for the last q tile, so that v5's ring of 4 (3) stages wraps
    struct { Shape s; double qsd; } cases[] = {
        {{2, 256, 8, 4, 64}, 1.0}, {{1, 512, 8, 2, 64}, 4.0}, {{1, 384, 4, 4, 64}, 1.0},
        {{1, 256, 16, 8, 128}, 1.0}, {{2, 128, 4, 1, 128}, 3.0},
        {{1, 200, 8, 4, 64}, 2.0}, {{2, 100, 4, 1, 64}, 1.0}, {{1, 200, 8, 2, 128}, 2.0}, {{2, 7, 4, 2, 128}, 1.0},
        {{9, 256, 8, 4, 64}, 1.0},    // 36 (b, kvh) groups: several ticket batches of v4's lite variants
        {{1, 1024, 4, 2, 64}, 2.0}, {{1, 1024, 4, 2, 128}, 2.0}};
    bool ok = true;
    for (auto &c : cases) { ok &= check_version(ver, c.s, c.qsd); }
    return ok;
}

// ----------------------------------------------------------------------------
// bench: CUDA events around each call, warm-up, median of reps. FLOPs counted
// as the causal work of the op: pairs = T(T+1)/2 (query, key) pairs per (b, h);
// forward 2 matmuls = 4 HD pairs, backward 5 matmuls (S recomputed, dP, dV, dK,
// dQ) = 10 HD pairs, per (b, h). (v2/v3's split backward executes 7: S and dP in
// both passes; the table counts the op's 5, as FlashAttention's papers do.)
// Ceilings (METHOD.md, measured here on an H200, KINDS.md): 790 TFLOP/s dense
// bf16 (cuBLAS-class wgmma; mma.sync tops out near 60-70% of it), 4.3 TB/s copy.

static const double PEAK_TFLOPS = 790.0, PEAK_TBS = 4.3;

struct BenchRow { int ver, var; Shape s; double fwd_ms, bwd_ms; };

static double median(std::vector<float> x) { std::sort(x.begin(), x.end()); return x[x.size() / 2]; }

static void fill_random_device(bf16 *d, size_t n, double sd) {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; i++) { h[i] = f2bf((float)(sd * rng_normal())); }
    cudaCheck(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
}

static void floors(const Shape &s, double *ffl, double *fby, double *bfl, double *bby) {
    const double pairs = (double)s.B * s.NH * s.T * (s.T + 1) / 2.0;
    const double nq = (double)nq_of(s), nk = (double)nk_of(s), nl = (double)nl_of(s);
    *ffl = 4.0 * s.HD * pairs;                                 // FLOPs
    *fby = 2 * (nq + 2 * nk) + 2 * nq + 4 * nl;                // q, k, v in; out, lse out
    *bfl = 10.0 * s.HD * pairs;
    *bby = 2 * (3 * nq + 2 * nk) + 4 * nl + 2 * (nq + 2 * nk); // q, k, v, out, dout, lse in; dq, dk, dv out
}

static BenchRow bench_one(int ver, Shape s, int reps) {
    BenchRow row = {ver, g_variant, s, NAN, NAN};
    const char *why = unsupported(ver, s);
    if (why) { printf("v%d: skipped (%s)\n", ver, why); return row; }
    Bufs d;
    alloc_bufs(d, s);
    fill_random_device(d.q, nq_of(s), 1.0); fill_random_device(d.k, nk_of(s), 1.0);
    fill_random_device(d.v, nk_of(s), 1.0); fill_random_device(d.dout, nq_of(s), 1.0);
    if (ver == 1) { reps = std::min(reps, 5); }   // v1 is slow; its numbers are for orientation only
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    std::vector<float> tf, tb;
    for (int i = 0; i < 3 + reps; i++) {
        float ms;
        cudaCheck(cudaEventRecord(e0));
        run_forward(ver, s, d);
        cudaCheck(cudaEventRecord(e1));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3) { tf.push_back(ms); }
        cudaCheck(cudaEventRecord(e0));
        run_backward(ver, s, d);
        cudaCheck(cudaEventRecord(e1));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3) { tb.push_back(ms); }
    }
    row.fwd_ms = median(tf);
    row.bwd_ms = median(tb);
    std::sort(tf.begin(), tf.end()); std::sort(tb.begin(), tb.end());
    char vtag[16] = "";
    if (ver == 5 || ver == 6) { snprintf(vtag, sizeof vtag, ".%d", g_variant); }
    printf("v%d%s B=%d T=%d NH=%d NKV=%d HD=%d: fwd median %.3f ms (min %.3f max %.3f), bwd median %.3f ms "
           "(min %.3f max %.3f), %d reps\n", ver, vtag, s.B, s.T, s.NH, s.NKV, s.HD, row.fwd_ms, tf.front(), tf.back(),
           row.bwd_ms, tb.front(), tb.back(), reps);
    cudaCheck(cudaEventDestroy(e0)); cudaCheck(cudaEventDestroy(e1));
    free_bufs(d);
    return row;
}

static void print_table(const std::vector<BenchRow> &rows) {
    printf("\n%-4s %-22s | %9s %8s %6s | %9s %8s %6s | floors fwd/bwd: flop ms, byte ms\n", "ver", "B,T,NH,NKV,HD",
           "fwd ms", "TFLOP/s", "%790", "bwd ms", "TFLOP/s", "%790");
    for (const BenchRow &r : rows) {
        double ffl, fby, bfl, bby;
        floors(r.s, &ffl, &fby, &bfl, &bby);
        char sh[64];
        snprintf(sh, sizeof sh, "%d,%d,%d,%d,%d", r.s.B, r.s.T, r.s.NH, r.s.NKV, r.s.HD);
        const double ft = ffl / (r.fwd_ms * 1e-3) / 1e12, bt = bfl / (r.bwd_ms * 1e-3) / 1e12;
        char id[16];
        if (r.ver == 5 || r.ver == 6) { snprintf(id, sizeof id, "v%d.%d", r.ver, r.var); } else { snprintf(id, sizeof id, "v%d", r.ver); }
        printf("%-4s %-22s | %9.3f %8.1f %5.1f%% | %9.3f %8.1f %5.1f%% | %.3f/%.3f, %.3f/%.3f\n", id, sh, r.fwd_ms,
               ft, 100 * ft / PEAK_TFLOPS, r.bwd_ms, bt, 100 * bt / PEAK_TFLOPS, ffl / PEAK_TFLOPS / 1e9,
               bfl / PEAK_TFLOPS / 1e9, fby / PEAK_TBS / 1e9, bby / PEAK_TBS / 1e9);
    }
}

// --bench-list: several (version.variant) configurations on ONE set of inputs per shape, in `rounds`
// round-robin passes (so drift hits all alike): per pass the median of reps of the forward, then of
// the backward (prep + kernels) on that forward's out and lse. Two tables, backward then forward:
// each pass's median, the best, model TFLOP/s and the speedup over a reference's best (backward: v2;
// forward: the first configuration listed, e.g. 5.2 in --bench-list 5.2,5.4).
struct Cfg { int ver, var; };
static void bench_list(const std::vector<Cfg> &cfgs, Shape s, int reps, int rounds) {
    Bufs d;
    alloc_bufs(d, s);
    fill_random_device(d.q, nq_of(s), 1.0); fill_random_device(d.k, nk_of(s), 1.0);
    fill_random_device(d.v, nk_of(s), 1.0); fill_random_device(d.dout, nq_of(s), 1.0);
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    std::vector<std::vector<double>> med(cfgs.size()), fmed(cfgs.size());
    auto timed = [&](std::vector<float> &t, auto &&call) {   // 3 warm-up calls, then reps timed
        for (int i = 0; i < 3 + reps; i++) {
            float ms;
            cudaCheck(cudaEventRecord(e0));
            call();
            cudaCheck(cudaEventRecord(e1));
            cudaCheck(cudaEventSynchronize(e1));
            cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 3) { t.push_back(ms); }
        }
    };
    for (int r = 0; r < rounds; r++)
        for (size_t c = 0; c < cfgs.size(); c++) {
            g_variant = cfgs[c].var;   // before unsupported(), which reads it
            if (unsupported(cfgs[c].ver, s)) { continue; }
            std::vector<float> tf, tb;
            timed(tf, [&]() { run_forward(cfgs[c].ver, s, d); });
            timed(tb, [&]() { run_backward(cfgs[c].ver, s, d); });
            fmed[c].push_back(median(tf));
            med[c].push_back(median(tb));
            printf("pass %d cfg %d.%d fwd median %.3f ms, bwd median %.3f ms\n", r, cfgs[c].ver, cfgs[c].var,
                   fmed[c].back(), med[c].back());
            fflush(stdout);   // a later configuration that traps must not take these figures with it
        }
    cudaCheck(cudaEventDestroy(e0)); cudaCheck(cudaEventDestroy(e1));
    free_bufs(d);
    double ffl, fby, bfl, bby, v2best = NAN;
    floors(s, &ffl, &fby, &bfl, &bby);
    for (size_t c = 0; c < cfgs.size(); c++)
        if (cfgs[c].ver == 2 && !med[c].empty()) { v2best = *std::min_element(med[c].begin(), med[c].end()); }
    const double f0best = fmed[0].empty() ? NAN : *std::min_element(fmed[0].begin(), fmed[0].end());
    for (int fw = 0; fw < 2; fw++) {
        const auto &M = fw ? fmed : med;
        printf("\nbench-list B=%d T=%d NH=%d NKV=%d HD=%d, %s, median of %d reps per pass\n", s.B, s.T, s.NH, s.NKV,
               s.HD, fw ? "forward" : "backward (prep + kernels)", reps);
        printf("%-5s | %-58s | %s | %7s %7s %6s\n", "cfg", "what", fw ? "fwd ms per pass" : "bwd ms per pass", "best",
               "TFLOP/s", fw ? "vs 1st" : "vs v2");
        for (size_t c = 0; c < cfgs.size(); c++) {
            const int ver = cfgs[c].ver, var = cfgs[c].var;
            char id[16];
            if (ver >= 4) { snprintf(id, sizeof id, "v%d.%d", ver, var); } else { snprintf(id, sizeof id, "v%d", ver); }
            const char *what = ver == 4 ? v4_variants[var].name : ver == 5 ? v5_variant_name[var]
                             : ver == 6 ? v6_variant_name[var] : version_name[ver];
            if (M[c].empty()) { printf("%-5s | %-58.58s | skipped\n", id, what); continue; }
            const double best = *std::min_element(M[c].begin(), M[c].end());
            printf("%-5s | %-58.58s |", id, what);
            for (double m : M[c]) { printf(" %.3f", m); }
            printf(" | %7.3f %7.1f %5.2fx\n", best, (fw ? ffl : bfl) / (best * 1e-3) / 1e12, (fw ? f0best : v2best) / best);
        }
    }
}

// ----------------------------------------------------------------------------

static void usage() {
    fprintf(stderr, "usage: attention [--cpu-selftest] [--version N[,N...] | --all] [--check] [--bench]\n"
                    "                 [--shape B,T,NH,NKV,HD] [--reps N] [--seed S]\n"
                    "                 [--variant K[,K...]]   v4 (0-9), v5 (0-5) or v6 (0-2) variants for --check/--bench (default 0)\n"
                    "                 [--bench-list V[.K],...] [--rounds R]   e.g. 2,4.0,4.5 or 5.2,5.4: one input set, R passes\n");
    exit(2);
}
static std::vector<int> parse_ints(const char *a) {
    std::vector<int> v;
    for (const char *p = a; *p;) {
        char *e;
        v.push_back((int)strtol(p, &e, 10));
        if (e == p) { usage(); }
        p = *e == ',' ? e + 1 : e;
    }
    return v;
}

int main(int argc, char **argv) {
    int reps = 30, rounds = 2;
    std::vector<int> vers;
    std::vector<int> variants = {0};
    std::vector<Cfg> blist;
    bool all = false, do_check = false, do_bench = false, selftest = false, have_shape = false;
    Shape user = {0, 0, 0, 0, 0};
    uint64_t seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--version") && i + 1 < argc) { vers = parse_ints(argv[++i]); }
        else if (!strcmp(a, "--all")) { all = true; }
        else if (!strcmp(a, "--check")) { do_check = true; }
        else if (!strcmp(a, "--bench")) { do_bench = true; }
        else if (!strcmp(a, "--cpu-selftest")) { selftest = true; }
        else if (!strcmp(a, "--reps") && i + 1 < argc) { reps = atoi(argv[++i]); }
        else if (!strcmp(a, "--seed") && i + 1 < argc) { seed = strtoull(argv[++i], NULL, 10); }
        else if (!strcmp(a, "--variant") && i + 1 < argc) { variants = parse_ints(argv[++i]); }
        else if (!strcmp(a, "--rounds") && i + 1 < argc) { rounds = atoi(argv[++i]); }
        else if (!strcmp(a, "--bench-list") && i + 1 < argc) {
            for (const char *p = argv[++i]; *p;) {
                char *e;
                Cfg c = {(int)strtol(p, &e, 10), 0};
                if (e == p) { usage(); }
                if (*e == '.') { p = e + 1; c.var = (int)strtol(p, &e, 10); if (e == p) { usage(); } }
                blist.push_back(c);
                p = *e == ',' ? e + 1 : e;
            }
        }
        else if (!strcmp(a, "--shape") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d,%d,%d,%d,%d", &user.B, &user.T, &user.NH, &user.NKV, &user.HD) != 5) { usage(); }
            have_shape = true;
            g_check_shape = &user;
        } else { usage(); }
    }
    rng_state = seed;
    printf("seed %llu\n", (unsigned long long)seed);
    if (selftest) { return cpu_selftest(); }
    for (int x : variants) { if (x < 0 || x >= NVARIANTS) { usage(); } }
    for (int x : variants) {
        if (x >= V5_NVARIANTS && std::find(vers.begin(), vers.end(), 5) != vers.end()) {
            fprintf(stderr, "--variant %d: v5 has variants 0..%d; pass one of them with --version 5\n", x, V5_NVARIANTS - 1);
            return 2;
        }
    }
    for (int x : variants) {
        if (x >= V6_NVARIANTS && std::find(vers.begin(), vers.end(), 6) != vers.end()) {
            fprintf(stderr, "--variant %d: v6 has variants 0..%d; pass one of them with --version 6\n", x, V6_NVARIANTS - 1);
            return 2;
        }
    }
    for (const Cfg &c : blist) {
        if (c.ver < 1 || c.ver > NVERSIONS || c.var < 0 ||
            c.var >= (c.ver == 5 ? V5_NVARIANTS : c.ver == 6 ? V6_NVARIANTS : NVARIANTS)) { usage(); }
    }
    if (!blist.empty()) {
        cudaDeviceProp prop;
        cudaCheck(cudaGetDeviceProperties(&prop, 0));
        printf("device: %s, %d SMs\nkernel resources:\n", prop.name, prop.multiProcessorCount);
        for (const Cfg &c : blist) {
            if (c.ver == 2) { V2_64::info("v2"); }
            if (c.ver == 4) {
                char tag[16];
                snprintf(tag, sizeof tag, "v4.%d", c.var);
                V2_64::forward_info(tag, "bwd", v4_variants[c.var].kern, 128, v4_smem());
            }
        }
        const Shape bs = have_shape ? user : Shape{16, 2048, 8, 4, 64};
        if (std::any_of(blist.begin(), blist.end(), [](const Cfg &c) { return c.ver == 5; })) {
            bs.HD == 128 ? V5<128>::info() : V5<64>::info();
        }
        if (std::any_of(blist.begin(), blist.end(), [](const Cfg &c) { return c.ver == 6; })) {
            bs.HD == 128 ? V6<128>::info() : V6<64>::info();
        }
        bench_list(blist, bs, reps, rounds);
        return 0;
    }
    if (all) { vers.clear(); for (int x = 1; x <= NVERSIONS; x++) { vers.push_back(x); } }
    if (vers.empty()) { usage(); }
    for (int x : vers) { if (x < 1 || x > NVERSIONS) { usage(); } }
    if (!do_check && !do_bench) {
        if (!all) { usage(); }
        do_check = do_bench = true;
    }
    if (reps < 1) { usage(); }

    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, %.0f MB L2, %zu KB smem/block opt-in\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize / 1e6, prop.sharedMemPerBlockOptin / 1024);
    bool ok = true;
    std::vector<std::pair<int, int>> failed;   // (version, variant) that failed --check: never timed
    auto has = [&](int x) { return std::find(vers.begin(), vers.end(), x) != vers.end(); };
    for (int x : {5, 6}) {
        if (has(x) && v5_device_unsupported()) {   // one line, then every other version as usual
            printf("v%d skipped: %s\n", x, v5_device_unsupported());
            vers.erase(std::find(vers.begin(), vers.end(), x));
            if (vers.empty()) { return 0; }
        }
    }
    // --variant applies to v4, v5 and v6; with several of them, each takes the values in its range
    auto variant_list = [&](int x) {
        if (x != 4 && x != 5 && x != 6) { return std::vector<int>{0}; }
        const int n = x == 5 ? V5_NVARIANTS : x == 6 ? V6_NVARIANTS : NVARIANTS;
        std::vector<int> r;
        for (int v : variants) { if (v < n) { r.push_back(v); } }
        return r;
    };
    if (do_check) {
        sync_launches = true;   // attribute an execution error to its kernel
        for (int x : vers)
            for (int var : variant_list(x)) {
                if (x == 4) {
                    printf("--- check %s, variant %d: %s\n", version_name[x], var, v4_variants[var].name);
                    if (v4_variants[var].timing_only) { printf("variant %d: timing-only ablation, not checked\n", var); continue; }
                } else if (x == 5) {
                    printf("--- check %s, variant %d: %s\n", version_name[x], var, v5_variant_name[var]);
                } else if (x == 6) {
                    printf("--- check %s, variant %d: %s\n", version_name[x], var, v6_variant_name[var]);
                } else {
                    printf("--- check %s\n", version_name[x]);
                }
                g_variant = var;
                if (!check(x)) { ok = false; failed.push_back({x, var}); }
            }
        sync_launches = false;
        printf("check: %s\n", ok ? "PASS" : "FAIL");
    }
    if (do_bench) {
        std::vector<Shape> shapes;
        if (have_shape) { shapes.push_back(user); }
        else {
            shapes.push_back({16, 2048, 8, 4, 64});    // 100m: C=512
            shapes.push_back({16, 1024, 16, 8, 64});   // 350m: C=1024
            shapes.push_back({16, 1024, 16, 8, 128});  // 1b:   C=2048
        }
        printf("kernel resources:\n");
        if (has(2)) { V2_64::info("v2"); V2_128::info("v2"); }
        if (has(3)) { V3_64::info("v3"); V3_128::info("v3"); }
        if (has(4)) { V2_64::forward_info("v4", "bwd", v4_variants[variants[0]].kern, 128, v4_smem()); }
        if (has(5)) { V5<64>::info(); V5<128>::info(); }
        if (has(6)) { V6<64>::info(); V6<128>::info(); }
        std::vector<BenchRow> rows;
        for (const Shape &s : shapes)
            for (int x : vers)
                for (int var : variant_list(x)) {
                    if (x == 4 && var != variants[0]) { continue; }   // v4: the first variant only, as before
                    if (std::find(failed.begin(), failed.end(), std::make_pair(x, var)) != failed.end()) {
                        printf("v%d.%d: not timed (failed its check)\n", x, var);
                        continue;
                    }
                    g_variant = var;
                    rows.push_back(bench_one(x, s, reps));
                }
        print_table(rows);
    }
    return ok ? 0 : 1;
}
