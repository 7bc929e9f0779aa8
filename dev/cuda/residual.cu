/*
dev/cuda/residual.cu: kernel lab for the residual stream of the CUDA trainer's
std mode (issue 5, "CUDA trainer speed"): the residual add x' = x + out fused
with the next site's RMSNorm, and the norm's backward fused with the running
gradient of the residual stream.

Build (from the repository root; or `make lab`):
    nvcc -O3 -arch=sm_90a -o dev/cuda/residual dev/cuda/residual.cu
Run:
    ./residual --cpu-selftest            the fp64 reference backward vs central differences; no GPU needed
    ./residual --bytes                   byte counts and floors per step (100m); no GPU needed
    ./residual --op OP --version N --check   version N of OP against the fp64 reference, twice
                                             (the two runs must be bit-identical)
    ./residual --op OP --version N --bench   version N of OP timed at the trainer's shapes
    ./residual --all                     --check and --bench of every op and version
  OP: fwd, bwd; without --op: both. Without --version: every version.
  Neither --check nor --bench: both.
  options: --seed S (inputs; default 1234), --reps R (timed repeats, default 20),
           --quick (--check on the small shapes only: for compute-sanitizer)

The ops (SPEC section 4, std: x_{j+1} = x_j + f_j(rmsnorm(x_j; g_j))):
  fwd   x, out (N, C) bf16 (slot j and the output of sublayer j), w (C) bf16:
        y = x + out (bf16: slot j+1), u = rmsnorm(y; w) = y rstd w (bf16), rstd (N)
        fp32, eps 1e-6. 100m: N = B*T = 32768, C = 512, 24 calls a step.
  bwd   du (N, C) fp32 (dL/du of site j, from the matmul backwards), x (N, C) bf16
        (slot j), rstd (N), w (C); dres (N, C) fp32 holds dL/dx_{j+1} on entry:
        dres += dL/dx_j of the norm (dres becomes dL/dx_j), dcopy (N, C) bf16 =
        dres (the dout of sublayer j-1's matmul backwards), dw (C) fp32 +=
        sum_n du x rstd (deterministic). 24 calls a step (plus the final site).

Versions:
  fwd v1  the trainer before this lab: residual_forward_kernel (one element a
          thread), then rmsnorm_forward_kernel (one warp per row, 2-byte loads).
      v2  residual_norm_forward_kernel (train_mhar.cu): one warp per row, 16-byte
          packs, the row in registers: y written, rstd from the rounded y, u written.
          The same kernel with u = NULL writes r, the routing statistic of a
          chained block-mode slot, and with x = NULL too, r of a source alone
          (source_stat_forward); the check requires both to equal rstd bit for bit.
  bwd v1  the trainer before this lab, per site: the site's row of the (J, N, C)
          dslots zeroed (one memset a step in the trainer; 1/J of it here),
          rmsnorm_backward_kernel adding into it, rmsnorm_dw_partial_kernel,
          reduce_partials_kernel; then accumulate_kernel (dslot_j += dslot_{j+1})
          and cast (the floatX dout).
      v2  rmsnorm_backward_residual_kernel (train_mhar.cu): one pass per row,
          16-byte packs: dres read, added to, written in place; dcopy written;
          each block's dw share summed over its rows and warps in a fixed order
          into a partial, then rmsnorm_dw_reduce_kernel (32 partial lanes per
          channel, summed in lane order).
      v3  rmsnorm_backward_residual_kernel (kernels/rmsnorm.cuh): v2's arithmetic in
          v2's order (the check requires dres, dcopy and dw bit-identical to v2's
          on the same inputs), with (b) the loads a row ahead: each warp issues x,
          du and dres of its next row before it reduces, computes and stores the
          current one (C <= 512 in bf16; wider rows issue their three loads
          together), w in shared memory, 128 registers, 2 blocks an SM as v2;
          and (a) the dw reduction deferred: each site's partials stay in a slice
          of their own, and one launch (rmsnorm_dw_reduce_sites_kernel, v2's
          reduction body with blockIdx.y the site) sums them all after the last
          site: 1 reduction launch a step in place of 24. The bench times the 24
          row kernels and that one launch, then the reductions alone (v2's 24,
          v3's one).
      v4  v3 without the row ahead (an ablation, not a candidate): the three loads
          of a row together at its top, one row in flight a warp, with the
          deferred reduction; v4 against v2 is (a)'s share, v3 against v4 (b)'s.
  Also checked with fwd v2: rmsnorm_apply (u recomputed from the stored y and
  rstd, as mhar mode's backward does from h_j) must give the forward's u bit
  for bit.

Tolerances (the check prints, per output, rel = max|gpu - ref| / max|ref|; PASS
needs, for every element, |gpu - ref| <= rtol |ref| + atol max|ref|, and finite
values). The reference computes in fp64 from the bf16 inputs, without rounding
y to bf16:
  - y: rtol 2^-8: one rounding of the fp32 sum to bf16 (bf16 keeps 8
    significant bits: round-to-nearest is off by at most 2^-8 relative).
  - rstd: rtol 2^-7: the GPU normalises the rounded y (each value off by at
    most 2^-8 relative, so the mean square by at most ~2^-7, its rsqrt by ~2^-8;
    rtol 2^-7 leaves room for the fp32 sum). Measured: 2e-4..9e-4.
  - u: rtol 3 x 2^-8: y's rounding (2^-8), rstd's (2^-8) and u's own (2^-8).
    Measured on the H200: 3.0e-3..5.2e-3 (max-normalised), for v1 (the old
    trainer kernels) and v2 alike. (A first version of this file took bf16's
    rounding as 2^-9 and set 2^-7 here, which v1 and v2 both failed.)
  - dres (fp32): rtol 1e-5, atol 1e-5 max: fp32 arithmetic on one row (a sum of
    C products, then s g w - s^3/C (g.wx) x, which cancels), no bf16 rounding.
  - dcopy: rtol 2^-8 (dres rounded once), atol 1e-5 max.
  - dw: rtol 1e-4, atol 1e-4 max (fp32 sums over up to 32768 rows of terms of
    both signs).
The rstd that bwd reads is the fp64 reference's, rounded to fp32.

Predicted at the 100m shape (--bytes; 4.0 TB/s): fwd v2 0.81 ms a step
(24 x 134 MB), against the trainer profile's 2.02 ms for v1 (residual 1.31 +
norm 0.71); bwd v2 1.61 ms (24 x 268 MB) plus 24 small dw reductions, against
6.5 ms for v1 with its memsets (3.08 norm + 3.05 residual/cast/zero dln + 0.38
zero dslots). Register budget: the kernels hold a row per lane in registers;
at C = 2048 (the 1b preset, NP = 8) the backward's four arrays of 64 floats
per lane spill (correct, slower): untried fix, reload x and du from L1.

Predicted for bwd v3 (100m, 24 calls; model in NOTES_residual.md, "bwd v3"):
1.83 ms (v2 2.036; floor 1.611): ~0.11 ms from the dw reductions (24 launches
of ~5 us each, the reduction and the gaps on either side, become one of ~8 us
that reads the 24 MB of partials back), ~0.10 ms from the loads a row ahead (the
less certain half). Measured on the H200 (2026-12-02): v3 1.715 ms, v4 1.712, v2
2.042; the row ahead gave nothing, the one reduction 0.08 ms (NOTES_residual.md).

STATUS (H200, 2026-11-29; dev/results/lab/residual_h200_2026-11-29.txt): --check all
PASS on 6 shapes for fwd and bwd, v1 and v2, repeats bit-identical, v2's
recomputed u and stat-only r bit-identical to the forward's, after the u/rstd
tolerance fix above (bf16 unit roundoff 2^-8, not 2^-9). --bench (24 calls, 100m;
copy 4236 GB/s): fwd v1 1.902 -> v2 0.901 ms (1.12x the 0.81 ms floor at 4.0 TB/s,
which was the prediction), bwd v1 5.929 -> v2 2.036 ms (1.26x the 1.61 ms floor).
In the trainer (bench-gpu run 4, std, ms a step): fwd residual + norm 0.905 (was
2.02), bwd norm into the running residual gradient 2.12 (was 6.5 with the
residual/cast/zero and the dslots memset): the lab's v2 within 0.4% and 4%,
~5.5 ms a step saved. Left: bwd's 0.4 ms over its floor (24 dw reductions
among it); the C = 2048 spill (untried fix above). Before the GPU run the file
was written and compiled without a GPU; compute-sanitizer is not in the log.
*/
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

// The trainer's bf16 build: the kernels copied from train_mhar.cu compile unchanged.
typedef __nv_bfloat16 floatX;

// ----------------------------------------------------------------------------
// The trainer's small helpers (train_mhar.cu); lab_util.cuh has the checked CUDA calls

static void die(const char *msg, int C) { fprintf(stderr, "error: "); fprintf(stderr, msg, C); fprintf(stderr, "\n"); exit(1); }

#include "lab_util.cuh"   // the labs' shared helpers: the trainer's small ones, inputs, checks, timing

// ============================================================================
// v1: the trainer's kernels before this lab (bodies unchanged; its RMSNorm
// kernels are in lab_util.cuh, shared with elementwise.cu)
// ============================================================================

__global__ void residual_forward_v1_kernel(floatX *out, const floatX *a, const floatX *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = b ? fromF<floatX>(toF(a[i]) + toF(b[i])) : a[i]; }
}

__global__ void reduce_partials_v1_kernel(float *dw, const float *partial, int P, int D) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D) { return; }
    float s = 0.0f;
    for (int p = 0; p < P; p++) { s += partial[(size_t)p * D + i]; }
    dw[i] += s;
}

__global__ void accumulate_v1_kernel(float *a, const float *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { a[i] += b[i]; }
}

__global__ void cast_v1_kernel(floatX *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = fromF<floatX>(in[i]); }
}

// ============================================================================
// v2: the current train_mhar.cu (bodies unchanged)
// ============================================================================

template <int VEC> struct alignas(VEC * sizeof(floatX) < 16 ? VEC * sizeof(floatX) : 16) RowX { floatX x[VEC]; };
template <int VEC> struct alignas(VEC * 4 < 16 ? VEC * 4 : 16) RowF { float x[VEC]; };
template <int VEC, int NP> struct RowLanes { static constexpr int vec = VEC, np = NP; };
#define RVEC (16 / (int)sizeof(floatX))

template <typename F> void row_dispatch(int C, bool aligned, F f) {
    const bool packs = aligned && C % RVEC == 0;
    const int np = (int)ceil_div(C, 32 * (packs ? RVEC : 1));
    if (np > 16) { die("C = %d is too wide for the residual-stream kernels", C); }
#define ROW_CASES(V)                                                                           \
    if (np <= 1) { f(RowLanes<V, 1>()); } else if (np <= 2) { f(RowLanes<V, 2>()); }         \
    else if (np <= 4) { f(RowLanes<V, 4>()); } else if (np <= 8) { f(RowLanes<V, 8>()); }     \
    else { f(RowLanes<V, 16>()); }
    if (packs) { ROW_CASES(RVEC) } else { ROW_CASES(1) }
#undef ROW_CASES
}
inline bool aligned16(const void *p) { return p == NULL || (uintptr_t)p % 16 == 0; }

// One warp per row n (8 rows per block of 256): y = x + out rounded to floatX
// (x NULL: y = out, not written), s = 1 / sqrt(mean(y^2) + 1e-6) of the rounded
// y, stat[n] = s, and when u is not NULL u = y * s * w.
template <int VEC, int NP>
__global__ void residual_norm_forward_kernel(floatX *y, floatX *u, float *stat, const floatX *x, const floatX *out,
                                             const floatX *w, size_t N, int C) {
    const size_t n = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (n >= N) { return; }
    float v[NP][VEC], ss = 0.0f;
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int c0 = (lane + 32 * p) * VEC;
        if (c0 >= C) { continue; }
        RowX<VEC> a = *reinterpret_cast<const RowX<VEC> *>(out + n * C + c0);
        if (x != NULL) {
            RowX<VEC> b = *reinterpret_cast<const RowX<VEC> *>(x + n * C + c0);
#pragma unroll
            for (int k = 0; k < VEC; k++) { a.x[k] = fromF<floatX>(toF(a.x[k]) + toF(b.x[k])); }
            *reinterpret_cast<RowX<VEC> *>(y + n * C + c0) = a;
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) { v[p][k] = toF(a.x[k]); ss += v[p][k] * v[p][k]; }
    }
    ss = warp_sum(ss);
    const float s = 1.0f / sqrtf(ss / C + 1e-6f);
    if (lane == 0) { stat[n] = s; }
    if (u == NULL) { return; }
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int c0 = (lane + 32 * p) * VEC;
        if (c0 >= C) { continue; }
        RowX<VEC> o;
#pragma unroll
        for (int k = 0; k < VEC; k++) { o.x[k] = fromF<floatX>(v[p][k] * s * toF(w[c0 + k])); }
        *reinterpret_cast<RowX<VEC> *>(u + n * C + c0) = o;
    }
}

// One thread per pack of VEC values: u = (h * rstd[n]) * w in fp32, rounded once.
template <int VEC>
__global__ void rmsnorm_apply_kernel(floatX *u, const floatX *h, const float *rstd, const floatX *w, size_t N, int C) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= N * C) { return; }
    const size_t n = i / C;
    const int c = (int)(i % C);
    const float s = rstd[n];
    RowX<VEC> hp = *reinterpret_cast<const RowX<VEC> *>(h + i), o;
#pragma unroll
    for (int k = 0; k < VEC; k++) { o.x[k] = fromF<floatX>(toF(hp.x[k]) * s * toF(w[c + k])); }
    *reinterpret_cast<RowX<VEC> *>(u + i) = o;
}

// Block b (8 warps) owns the R rows [b R, b R + R); warp w takes rows w, w + 8, ...
// of them. Per row: d = dL/dx of u = rmsnorm(x; w) given du; dres = d (+ dres
// when add), and its floatX copy dcopy (when not NULL). The block's share of
// dw[c] = sum_n du x rstd, summed per lane over its rows in order, then over
// the 8 warps in order through shared memory, goes to partial[b] (C).
template <int VEC, int NP>
__global__ void __launch_bounds__(256)
rmsnorm_backward_residual_kernel(float *dres, floatX *dcopy, float *partial, const float *du, const floatX *x,
                                 const float *rstd, const floatX *w, size_t N, int C, int R, int add) {
    __shared__ float red[8][32 * VEC];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float wf[NP][VEC], acc[NP][VEC];
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int c0 = (lane + 32 * p) * VEC;
#pragma unroll
        for (int k = 0; k < VEC; k++) { wf[p][k] = c0 < C ? toF(w[c0 + k]) : 0.0f; acc[p][k] = 0.0f; }
    }
    const size_t n0 = (size_t)blockIdx.x * R, n1 = n0 + R < N ? n0 + R : N;
    for (size_t n = n0 + warp; n < n1; n += 8) {
        float xf[NP][VEC], g[NP][VEC], gwx = 0.0f;
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int c0 = (lane + 32 * p) * VEC;
            if (c0 >= C) { continue; }
            RowX<VEC> xp = *reinterpret_cast<const RowX<VEC> *>(x + n * C + c0);
            RowF<VEC> gp = *reinterpret_cast<const RowF<VEC> *>(du + n * C + c0);
#pragma unroll
            for (int k = 0; k < VEC; k++) { xf[p][k] = toF(xp.x[k]); g[p][k] = gp.x[k]; gwx += g[p][k] * wf[p][k] * xf[p][k]; }
        }
        gwx = warp_sum(gwx);
        const float s = rstd[n], k3 = s * s * s / C * gwx;
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int c0 = (lane + 32 * p) * VEC;
            if (c0 >= C) { continue; }
            RowF<VEC> r = {};
            if (add) { r = *reinterpret_cast<const RowF<VEC> *>(dres + n * C + c0); }
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float d = s * g[p][k] * wf[p][k] - k3 * xf[p][k];
                r.x[k] = add ? r.x[k] + d : d;
                acc[p][k] += g[p][k] * xf[p][k] * s;
            }
            *reinterpret_cast<RowF<VEC> *>(dres + n * C + c0) = r;
            if (dcopy) {
                RowX<VEC> o;
#pragma unroll
                for (int k = 0; k < VEC; k++) { o.x[k] = fromF<floatX>(r.x[k]); }
                *reinterpret_cast<RowX<VEC> *>(dcopy + n * C + c0) = o;
            }
        }
    }
    // the block's dw share: chunk p of 32 VEC channels at a time, warps summed in order
#pragma unroll
    for (int p = 0; p < NP; p++) {
        __syncthreads();   // red may still be read for chunk p - 1
#pragma unroll
        for (int k = 0; k < VEC; k++) { red[warp][lane * VEC + k] = acc[p][k]; }
        __syncthreads();
        for (int i = threadIdx.x; i < 32 * VEC; i += blockDim.x) {
            const int c = p * 32 * VEC + i;
            if (c >= C) { continue; }
            float t = 0.0f;
            for (int ww = 0; ww < 8; ww++) { t += red[ww][i]; }
            partial[(size_t)blockIdx.x * C + c] = t;
        }
    }
}

// dw (D) += sum over the P partials of partial (P, D), in a fixed order. Block
// (32 channels) x (32 partial lanes): lane y sums partials y, y + 32, ... in
// order (independent loads), then the 32 lane sums are added in lane order.
// Grid ceil(D / 32).
__global__ void __launch_bounds__(1024) rmsnorm_dw_reduce_kernel(float *dw, const float *partial, int P, int D) {
    __shared__ float s[32][33];
    const int i = blockIdx.x * 32 + threadIdx.x;
    float t = 0.0f;
    if (i < D) {
        for (int p = threadIdx.y; p < P; p += 32) { t += partial[(size_t)p * D + i]; }
    }
    s[threadIdx.y][threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.y == 0 && i < D) {
        float sum = 0.0f;
        for (int y = 0; y < 32; y++) { sum += s[y][threadIdx.x]; }
        dw[i] += sum;
    }
}

// ============================================================================
// v3: the candidate for the trainer (kernels/rmsnorm.cuh): v2's arithmetic in
// v2's order, with the row's loads issued a row ahead and the dw reduction
// deferred to one launch for all the sites
// ============================================================================

// One row's inputs in registers: x as floatX packs (converted where used, the same
// values as v2's fp32 copies), du and the running dres as fp32 packs, rstd.
template <int VEC, int NP> struct BwdRow {
    RowX<VEC> x[NP];
    RowF<VEC> g[NP], r[NP];
    float s;
};

// Issue row n's loads (x, du, dres when add, rstd): nothing here waits for them.
template <int VEC, int NP>
__device__ __forceinline__ void bwd_row_load(BwdRow<VEC, NP> &row, const floatX *__restrict__ x,
                                             const float *__restrict__ du, const float *dres,
                                             const float *__restrict__ rstd, size_t n, int C, int lane, int add) {
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int c0 = (lane + 32 * p) * VEC;
        if (c0 >= C) { continue; }
        row.x[p] = *reinterpret_cast<const RowX<VEC> *>(x + n * C + c0);
        row.g[p] = *reinterpret_cast<const RowF<VEC> *>(du + n * C + c0);
        if (add) { row.r[p] = *reinterpret_cast<const RowF<VEC> *>(dres + n * C + c0); }
    }
    row.s = rstd[n];
}

// Block b (8 warps) owns the R rows [b R, b R + R); warp w takes rows w, w + 8, ...
// of them, in order. With NP <= 2 (C <= 512 in bf16) two rows fit in the 128
// registers of two blocks an SM, and a warp issues its next row's loads before it
// reduces, computes and stores the current one (two rows in flight a warp, where
// v2 has du and x of one row, then its dres after the reduction); wider rows issue
// their three loads together at the top of the row. w sits in shared memory (fp32),
// not in registers. The arithmetic and its order are v2's, element by element:
// the same dres, dcopy and partial bits. partial[b] (C) gets the block's dw share,
// summed per lane over its rows in order, then over the 8 warps in order.
template <int VEC, int NP, bool AHEAD_OK = true>
__global__ void __launch_bounds__(256, AHEAD_OK && NP <= 2 ? 2 : 1)
rmsnorm_backward_residual_v3_kernel(float *dres, floatX *__restrict__ dcopy, float *__restrict__ partial,
                                    const float *__restrict__ du, const floatX *__restrict__ x,
                                    const float *__restrict__ rstd, const floatX *__restrict__ w, size_t N, int C,
                                    int R, int add) {
    __shared__ float red[8][32 * VEC];
    __shared__ RowF<VEC> wsh[NP * 32];   // w in fp32, pack c0 / VEC (0 past C): shared, not registers
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float acc[NP][VEC];
    for (int i = threadIdx.x; i < NP * 32; i += blockDim.x) {
#pragma unroll
        for (int k = 0; k < VEC; k++) { wsh[i].x[k] = i * VEC + k < C ? toF(w[i * VEC + k]) : 0.0f; }
    }
#pragma unroll
    for (int p = 0; p < NP; p++) {
#pragma unroll
        for (int k = 0; k < VEC; k++) { acc[p][k] = 0.0f; }
    }
    __syncthreads();
    const size_t n0 = (size_t)blockIdx.x * R, n1 = n0 + R < N ? n0 + R : N;
    // a row ahead when two rows fit in 128 registers (NP <= 2: C <= 512 in bf16), else the
    // row's three loads together at the top of its iteration
    constexpr bool ahead = AHEAD_OK && NP <= 2;   // AHEAD_OK false: v4, the ablation
    size_t n = n0 + warp;
    BwdRow<VEC, NP> cur;
    if (ahead && n < n1) { bwd_row_load(cur, x, du, dres, rstd, n, C, lane, add); }
    for (; n < n1; n += 8) {
        BwdRow<VEC, NP> next;
        if (!ahead) { bwd_row_load(cur, x, du, dres, rstd, n, C, lane, add); }
        else if (n + 8 < n1) { bwd_row_load(next, x, du, dres, rstd, n + 8, C, lane, add); }
        float gwx = 0.0f;
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int c0 = (lane + 32 * p) * VEC;
            if (c0 >= C) { continue; }
            const RowF<VEC> wp = wsh[lane + 32 * p];
#pragma unroll
            for (int k = 0; k < VEC; k++) { gwx += cur.g[p].x[k] * wp.x[k] * toF(cur.x[p].x[k]); }
        }
        gwx = warp_sum(gwx);
        const float s = cur.s, k3 = s * s * s / C * gwx;
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int c0 = (lane + 32 * p) * VEC;
            if (c0 >= C) { continue; }
            const RowF<VEC> wp = wsh[lane + 32 * p];
            RowF<VEC> r;
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float g = cur.g[p].x[k], wf = wp.x[k], xf = toF(cur.x[p].x[k]);
                const float d = s * g * wf - k3 * xf;
                r.x[k] = add ? cur.r[p].x[k] + d : d;
                acc[p][k] += g * xf * s;
            }
            *reinterpret_cast<RowF<VEC> *>(dres + n * C + c0) = r;
            if (dcopy) {
                RowX<VEC> o;
#pragma unroll
                for (int k = 0; k < VEC; k++) { o.x[k] = fromF<floatX>(r.x[k]); }
                *reinterpret_cast<RowX<VEC> *>(dcopy + n * C + c0) = o;
            }
        }
        if (ahead) { cur = next; }
    }
    // the block's dw share: chunk p of 32 VEC channels at a time, warps summed in order
#pragma unroll
    for (int p = 0; p < NP; p++) {
        __syncthreads();   // red may still be read for chunk p - 1
#pragma unroll
        for (int k = 0; k < VEC; k++) { red[warp][lane * VEC + k] = acc[p][k]; }
        __syncthreads();
        for (int i = threadIdx.x; i < 32 * VEC; i += blockDim.x) {
            const int c = p * 32 * VEC + i;
            if (c >= C) { continue; }
            float t = 0.0f;
            for (int ww = 0; ww < 8; ww++) { t += red[ww][i]; }
            partial[(size_t)blockIdx.x * C + c] = t;
        }
    }
}

// The dw pointers of up to DW_SITES_MAX sites, passed by value (2 KB of kernel
// parameters); more sites take more launches.
#define DW_SITES_MAX 256
struct DwSites { float *dw[DW_SITES_MAX]; };

// For each site s < S (blockIdx.y): dw[s] (D) += the sum over the P partials of
// site s's partial (P, D) at part + s * stride, in v2's order (lane y sums
// partials y, y + 32, ... in order, then the 32 lane sums in lane order): the
// same bits as v2's rmsnorm_dw_reduce_kernel, for all the sites in one launch.
// Grid (ceil(D / 32), S), block (32, 32).
__global__ void __launch_bounds__(1024)
rmsnorm_dw_reduce_sites_kernel(DwSites sites, const float *part, size_t stride, int P, int D) {
    __shared__ float s[32][33];
    const float *partial = part + blockIdx.y * stride;
    const int i = blockIdx.x * 32 + threadIdx.x;
    float t = 0.0f;
    if (i < D) {
        for (int p = threadIdx.y; p < P; p += 32) { t += partial[(size_t)p * D + i]; }
    }
    s[threadIdx.y][threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.y == 0 && i < D) {
        float sum = 0.0f;
        for (int y = 0; y < 32; y++) { sum += s[y][threadIdx.x]; }
        sites.dw[blockIdx.y][i] += sum;
    }
}

// dw[s] (C) += the sum of site s's partials (the P = ceil(N / red_rows_per_part(N))
// blocks of rmsnorm_backward_residual_v3_kernel over N rows) at part + s * stride,
// for the S sites; one launch per DW_SITES_MAX sites.
static void dw_reduce_sites(float *const *dw, const float *part, size_t stride, int S, size_t N, int C) {
    const int P = (int)ceil_div(N, red_rows_per_part(N));
    for (int s0 = 0; s0 < S; s0 += DW_SITES_MAX) {
        const int n = S - s0 < DW_SITES_MAX ? S - s0 : DW_SITES_MAX;
        DwSites t = {};
        for (int s = 0; s < n; s++) { t.dw[s] = dw[s0 + s]; }
        rmsnorm_dw_reduce_sites_kernel<<<dim3(ceil_div(C, 32), n), dim3(32, 32)>>>(t, part + s0 * stride, stride, P, C);
        launchCheck();
    }
}

// ============================================================================
// The ops, per version
// ============================================================================

struct FwdBufs {
    const floatX *x, *out, *w;   // inputs: slot j, sublayer output, norm weight
    floatX *y, *u;               // outputs: slot j+1, normalised input of site j+1
    float *rstd;
    size_t N;
    int C;
};

static void fwd_run(int ver, const FwdBufs &b) {
    if (ver == 1) {
        residual_forward_v1_kernel<<<ceil_div(b.N * b.C, 256), 256>>>(b.y, b.out, b.x, b.N * b.C);
        launchCheck();
        rmsnorm_forward_v1_kernel<<<ceil_div(b.N, 8), 256>>>(b.u, b.rstd, b.y, b.w, b.N, b.C);
    } else {
        row_dispatch(b.C, aligned16(b.y) && aligned16(b.u) && aligned16(b.x) && aligned16(b.out), [&](auto lanes) {
            constexpr int VEC = decltype(lanes)::vec, NP = decltype(lanes)::np;
            residual_norm_forward_kernel<VEC, NP><<<ceil_div(b.N, 8), 256>>>(b.y, b.u, b.rstd, b.x, b.out, b.w, b.N, b.C);
        });
    }
    launchCheck();
}

// the trainer's u recompute (rmsnorm_apply until session 8; since then part of its
// route_site_backward): u = y * rstd * w from the stored y, rstd
static void apply_run(floatX *u, const floatX *h, const float *rstd, const floatX *w, size_t N, int C) {
    if (C % RVEC == 0 && aligned16(u) && aligned16(h)) {
        rmsnorm_apply_kernel<RVEC><<<ceil_div(N * C / RVEC, 256), 256>>>(u, h, rstd, w, N, C);
    } else {
        rmsnorm_apply_kernel<1><<<ceil_div(N * C, 256), 256>>>(u, h, rstd, w, N, C);
    }
    launchCheck();
}

struct BwdBufs {
    const float *du, *rstd;      // inputs: dL/du of the site, rstd of the forward
    const floatX *x, *w;         // slot j, norm weight
    float *dres;                 // v2: dL/dx_{j+1} on entry, dL/dx_j on exit (in place)
    float *dnext, *dslot;        // v1: dslot_{j+1} (input), dslot_j (output)
    floatX *dcopy;
    float *dw, *partial;
    size_t N;
    int C;
};

// v1: returns the buffer holding dL/dx_j (dslot); v2, v3: dres. v3 writes the
// site's dw partials into b.partial and leaves them there: its caller reduces
// them (dw_reduce_sites, once for all the sites).
static float *bwd_run(int ver, const BwdBufs &b) {
    const size_t n = b.N * b.C;
    const int R = red_rows_per_part(b.N), P = (int)ceil_div(b.N, R);
    if (ver == 1) {
        zero(b.dslot, n * sizeof(float));
        rmsnorm_backward_v1_kernel<float><<<ceil_div(b.N, 8), 256>>>(b.dslot, b.du, b.x, b.rstd, b.w, b.N, b.C);
        launchCheck();
        rmsnorm_dw_partial_v1_kernel<<<dim3(ceil_div(b.C, 32), P), dim3(32, 8)>>>(b.partial, b.du, b.x, b.rstd, b.N, b.C, R);
        launchCheck();
        reduce_partials_v1_kernel<<<ceil_div(b.C, 256), 256>>>(b.dw, b.partial, P, b.C);
        launchCheck();
        accumulate_v1_kernel<<<ceil_div(n, 256), 256>>>(b.dslot, b.dnext, n);
        launchCheck();
        cast_v1_kernel<<<ceil_div(n, 256), 256>>>(b.dcopy, b.dslot, n);
        launchCheck();
        return b.dslot;
    }
    if (ver >= 3) {
        row_dispatch(b.C, aligned16(b.dres) && aligned16(b.dcopy) && aligned16(b.du) && aligned16(b.x), [&](auto lanes) {
            constexpr int VEC = decltype(lanes)::vec, NP = decltype(lanes)::np;
            if (ver == 3) {
                rmsnorm_backward_residual_v3_kernel<VEC, NP><<<P, 256>>>(b.dres, b.dcopy, b.partial, b.du, b.x,
                                                                         b.rstd, b.w, b.N, b.C, R, 1);
            } else {
                rmsnorm_backward_residual_v3_kernel<VEC, NP, false><<<P, 256>>>(b.dres, b.dcopy, b.partial, b.du, b.x,
                                                                                b.rstd, b.w, b.N, b.C, R, 1);
            }
        });
        launchCheck();
        return b.dres;
    }
    row_dispatch(b.C, aligned16(b.dres) && aligned16(b.dcopy) && aligned16(b.du) && aligned16(b.x), [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NP = decltype(lanes)::np;
        rmsnorm_backward_residual_kernel<VEC, NP><<<P, 256>>>(b.dres, b.dcopy, b.partial, b.du, b.x, b.rstd, b.w,
                                                               b.N, b.C, R, 1);
    });
    launchCheck();
    rmsnorm_dw_reduce_kernel<<<ceil_div(b.C, 32), dim3(32, 32)>>>(b.dw, b.partial, P, b.C);
    launchCheck();
    return b.dres;
}

// ============================================================================
// Inputs: made on the device from a counter-based hash, then copied to the
// host for the reference.
// ============================================================================

// rows of different scales (0.05 .. 3.05), so rstd varies 60x
template <typename T>
__global__ void fill_rows_kernel(T *p, size_t rows, int D, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * D; i += (size_t)gridDim.x * blockDim.x) {
        float scale = 0.05f + 3.0f * urand(seed ^ 0x5bd1e995ull, i / D);
        p[i] = fromF<T>(scale * nrand(seed, i));
    }
}

// ============================================================================
// CPU references, fp64 (train_mhar.c's definitions)
// ============================================================================

// y = x + out, u = y / sqrt(mean(y^2) + 1e-6) * w, rstd; rows (N, C)
static void ref_forward(const double *x, const double *out, const double *w, size_t N, int C, double *y, double *u,
                        double *rstd) {
    for (size_t n = 0; n < N; n++) {
        double ss = 0;
        for (int c = 0; c < C; c++) { y[n * C + c] = x[n * C + c] + out[n * C + c]; ss += y[n * C + c] * y[n * C + c]; }
        double s = 1.0 / sqrt(ss / C + 1e-6);
        rstd[n] = s;
        for (int c = 0; c < C; c++) { u[n * C + c] = y[n * C + c] * s * w[c]; }
    }
}

// backward of u = rmsnorm(x; w) given du: dx[n] += s du w - s^3/C (du . w x) x; dw += du x s
static void ref_backward(const double *du, const double *x, const double *w, size_t N, int C, double *dx, double *dw) {
    for (size_t n = 0; n < N; n++) {
        double ss = 0, gwx = 0;
        for (int c = 0; c < C; c++) { ss += x[n * C + c] * x[n * C + c]; gwx += du[n * C + c] * w[c] * x[n * C + c]; }
        double s = 1.0 / sqrt(ss / C + 1e-6);
        for (int c = 0; c < C; c++) {
            dx[n * C + c] += s * du[n * C + c] * w[c] - s * s * s / C * gwx * x[n * C + c];
            dw[c] += du[n * C + c] * x[n * C + c] * s;
        }
    }
}

// ============================================================================
// CPU self-test: the reference backward against central differences of the
// forward (loss = sum(u * R) for random R, through y = x + out), no GPU.
// ============================================================================

static int cpu_selftest(uint64_t seed) {
    host_rng = seed;
    const size_t N = 3;
    const int C = 8;
    const double h = 1e-6;
    std::vector<double> x(N * C), out(N * C), w(C), R(N * C), y(N * C), u(N * C), rs(N);
    for (auto &v : x) { v = host_normal(); }
    for (auto &v : out) { v = 0.5 * host_normal(); }
    for (auto &v : w) { v = 1.0 + 0.3 * host_normal(); }
    for (auto &v : R) { v = host_normal(); }
    auto loss = [&]() {
        ref_forward(x.data(), out.data(), w.data(), N, C, y.data(), u.data(), rs.data());
        double l = 0;
        for (size_t i = 0; i < N * C; i++) { l += u[i] * R[i]; }
        return l;
    };
    // analytic: dL/du = R; dL/dx = dL/dy (y = x + out)
    ref_forward(x.data(), out.data(), w.data(), N, C, y.data(), u.data(), rs.data());
    std::vector<double> dx(N * C, 0.0), dw(C, 0.0);
    ref_backward(R.data(), y.data(), w.data(), N, C, dx.data(), dw.data());
    double worst = 0;
    for (size_t i = 0; i < N * C; i++) {
        double keep = x[i];
        x[i] = keep + h; double lp = loss();
        x[i] = keep - h; double lm = loss();
        x[i] = keep;
        double num = (lp - lm) / (2 * h);
        worst = std::max(worst, fabs(num - dx[i]) / std::max(1.0, fabs(num)));
    }
    for (int c = 0; c < C; c++) {
        double keep = w[c];
        w[c] = keep + h; double lp = loss();
        w[c] = keep - h; double lm = loss();
        w[c] = keep;
        double num = (lp - lm) / (2 * h);
        worst = std::max(worst, fabs(num - dw[c]) / std::max(1.0, fabs(num)));
    }
    bool ok = worst < 1e-6;
    printf("cpu selftest: residual + rmsnorm backward vs central differences (dx, dw): worst error %.1e: %s\n", worst,
           ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

// ============================================================================
// Byte counts per call (N rows of C): each buffer counted once per kernel that
// touches it; the weight (C) and the dw partials (<= 1 MB, L2) left out.
//   fwd   8 NC + 4 N     x, out read; y, u written (bf16); rstd
//   bwd  16 NC + 4 N     du (fp32), x read; dres read and written (fp32); dcopy
//                        written; rstd
// These are the minimum of each op; the GB/s of every version divide them by
// its time. What v1 moves:
//   fwd  10 NC + 4 N     residual: 6 NC; rmsnorm: y read again, u written
//   bwd  42 NC + 8 N     zero 4 NC; norm backward du, x, dslot RMW 14 NC; dw
//                        partials du, x 6 NC; accumulate 12 NC; cast 6 NC
// ============================================================================

static double fwd_bytes(double N, double C) { return N * (8 * C + 4); }
static double bwd_bytes(double N, double C) { return N * (16 * C + 4); }
static double fwd_moved(int ver, double N, double C) { return ver == 1 ? N * (10 * C + 4) : fwd_bytes(N, C); }
static double bwd_moved(int ver, double N, double C) { return ver == 1 ? N * (42 * C + 8) : bwd_bytes(N, C); }

static const size_t N100 = 16 * 2048;
static const int C100 = 512, CALLS100 = 24;   // 100m: B=16, T=2048, C=512; 2L = 24 residual adds a step

static void print_bytes(void) {
    printf("100m (N=%zu, C=%d), %d calls a step; floors at 4.0 TB/s\n", N100, C100, CALLS100);
    for (int v = 1; v <= 2; v++) {
        double f = CALLS100 * fwd_moved(v, N100, C100), b = CALLS100 * bwd_moved(v, N100, C100);
        printf("  v%d  fwd moves %6.2f GB (%.3f ms), bwd moves %6.2f GB (%.3f ms)\n", v, f / 1e9, f / 4e9, b / 1e9,
               b / 4e9);
    }
    double f = CALLS100 * fwd_bytes(N100, C100), b = CALLS100 * bwd_bytes(N100, C100);
    printf("  floor: fwd %.2f GB = %.3f ms, bwd %.2f GB = %.3f ms per step\n", f / 1e9, f / 4e9, b / 1e9, b / 4e9);
}

// ============================================================================
// Checks
// ============================================================================

static bool quick = false;

static bool check_fwd_shape(int ver, size_t N, int C, uint64_t seed) {
    const size_t n = N * C;
    floatX *x = dalloc<floatX>(n), *out = dalloc<floatX>(n), *w = dalloc<floatX>(C), *y = dalloc<floatX>(n);
    floatX *u = dalloc<floatX>(n), *u2 = dalloc<floatX>(n);
    float *rstd = dalloc<float>(N), *r = dalloc<float>(N);
    fill_rows_kernel<floatX><<<4096, 256>>>(x, N, C, seed);
    launchCheck();
    fill_normal(out, n, seed + 1, 0.0f, 0.5f);
    fill_normal(w, C, seed + 2, 1.0f, 0.3f);
    std::vector<double> hx = fetch_bf16_d(x, n), ho = fetch_bf16_d(out, n), hw = fetch_bf16_d(w, C);
    std::vector<double> ry(n), ru(n), rr(N);
    ref_forward(hx.data(), ho.data(), hw.data(), N, C, ry.data(), ru.data(), rr.data());
    FwdBufs b = {x, out, w, y, u, rstd, N, C};
    bool ok = true;
    std::vector<unsigned char> first[3];
    for (int rep = 0; rep < 2; rep++) {
        cudaCheck(cudaMemset(y, 0xFF, n * 2)); cudaCheck(cudaMemset(u, 0xFF, n * 2));   // NaN
        cudaCheck(cudaMemset(rstd, 0xFF, N * 4));
        fwd_run(ver, b);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<unsigned char> o[3] = {fetch_bytes(y, n * 2), fetch_bytes(u, n * 2), fetch_bytes(rstd, N * 4)};
        if (repeat_done(rep, o, first, ok)) { break; }
        printf("  fwd v%d N=%-6zu C=%-5d", ver, N, C);
        ok &= compare("y", bytes_bf16_to_f(o[0]), ry, 0x1p-8, 0);
        ok &= compare("u", bytes_bf16_to_f(o[1]), ru, 3 * 0x1p-8, 0);
        ok &= compare("rstd", bytes_f32(o[2]), rr, 0x1p-7, 0);
        if (ver == 2) {
            // u recomputed from the stored y and rstd (mhar's backward does this from h_j): bit for bit
            cudaCheck(cudaMemset(u2, 0xFF, n * 2));
            apply_run(u2, y, rstd, w, N, C);
            bool same = fetch_bytes(u2, n * 2) == o[1];
            ok &= same;
            printf(" recompute-u %s", same ? "bit-identical" : "DIFFERENT (FAIL)");
            // stat-only form (block mode's chained slot): r equals rstd, y unchanged
            cudaCheck(cudaMemset(r, 0xFF, N * 4));
            row_dispatch(C, true, [&](auto lanes) {
                constexpr int VEC = decltype(lanes)::vec, NP = decltype(lanes)::np;
                residual_norm_forward_kernel<VEC, NP><<<ceil_div(N, 8), 256>>>(y, nullptr, r, x, out, nullptr, N, C);
            });
            launchCheck();
            bool same_r = fetch_bytes(r, N * 4) == o[2] && fetch_bytes(y, n * 2) == o[0];
            // source_stat_forward's form: r of y alone (x = NULL, nothing written)
            cudaCheck(cudaMemset(r, 0xFF, N * 4));
            row_dispatch(C, true, [&](auto lanes) {
                constexpr int VEC = decltype(lanes)::vec, NP = decltype(lanes)::np;
                residual_norm_forward_kernel<VEC, NP><<<ceil_div(N, 8), 256>>>(nullptr, nullptr, r, nullptr, y, nullptr,
                                                                               N, C);
            });
            launchCheck();
            same_r = same_r && fetch_bytes(r, N * 4) == o[2];
            ok &= same_r;
            printf(" stat-only %s", same_r ? "bit-identical" : "DIFFERENT (FAIL)");
        }
        printf("\n");
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(y));
    cudaCheck(cudaFree(u)); cudaCheck(cudaFree(u2)); cudaCheck(cudaFree(rstd)); cudaCheck(cudaFree(r));
    return ok;
}

static bool check_bwd_shape(int ver, size_t N, int C, uint64_t seed) {
    const size_t n = N * C;
    floatX *x = dalloc<floatX>(n), *w = dalloc<floatX>(C), *dcopy = dalloc<floatX>(n);
    float *du = dalloc<float>(n), *dnext = dalloc<float>(n), *dres = dalloc<float>(n), *dslot = dalloc<float>(n);
    float *rstd = dalloc<float>(N), *dw = dalloc<float>(C), *partial = dalloc<float>((size_t)RED_PARTS_MAX * C);
    fill_rows_kernel<floatX><<<4096, 256>>>(x, N, C, seed);
    launchCheck();
    fill_normal(w, C, seed + 2, 1.0f, 0.3f);
    fill_normal(du, n, seed + 3, 0.0f, 1.0f);
    fill_normal(dnext, n, seed + 4, 0.0f, 0.1f);
    std::vector<double> hx = fetch_bf16_d(x, n), hw = fetch_bf16_d(w, C), hdu = fetch_f32_d(du, n);
    std::vector<double> rdx = fetch_f32_d(dnext, n), rdw(C, 0.0);
    std::vector<float> hr(N);
    for (size_t r = 0; r < N; r++) {
        double ss = 0;
        for (int c = 0; c < C; c++) { ss += hx[r * C + c] * hx[r * C + c]; }
        hr[r] = (float)(1.0 / sqrt(ss / C + 1e-6));
    }
    cudaCheck(cudaMemcpy(rstd, hr.data(), N * 4, cudaMemcpyHostToDevice));
    ref_backward(hdu.data(), hx.data(), hw.data(), N, C, rdx.data(), rdw.data());   // rdx = dnext + dx
    BwdBufs b = {du, rstd, x, w, dres, dnext, dslot, dcopy, dw, partial, N, C};
    bool ok = true;
    std::vector<unsigned char> first[3];
    for (int rep = 0; rep < 2; rep++) {
        cudaCheck(cudaMemset(dslot, 0xFF, n * 4)); cudaCheck(cudaMemset(dcopy, 0xFF, n * 2));   // NaN
        cudaCheck(cudaMemset(partial, 0xFF, (size_t)RED_PARTS_MAX * C * 4));
        cudaCheck(cudaMemcpy(dres, dnext, n * 4, cudaMemcpyDeviceToDevice));   // v2 works in place
        cudaCheck(cudaMemset(dw, 0, C * 4));   // dw accumulates (the trainer zeroes the grads once a step)
        float *res = bwd_run(ver, b);
        if (ver >= 3) { dw_reduce_sites(&dw, partial, 0, 1, N, C); }
        cudaCheck(cudaDeviceSynchronize());
        std::vector<unsigned char> o[3] = {fetch_bytes(res, n * 4), fetch_bytes(dcopy, n * 2), fetch_bytes(dw, C * 4)};
        if (repeat_done(rep, o, first, ok)) { break; }
        printf("  bwd v%d N=%-6zu C=%-5d", ver, N, C);
        ok &= compare("dres", bytes_f32(o[0]), rdx, 1e-5, 1e-5);
        ok &= compare("dcopy", bytes_bf16_to_f(o[1]), rdx, 0x1p-8, 1e-5);
        ok &= compare("dw", bytes_f32(o[2]), rdw, 1e-4, 1e-4);
        if (ver >= 3) {   // v2 on the same inputs: dres, dcopy and dw bit for bit
            cudaCheck(cudaMemset(dcopy, 0xFF, n * 2));
            cudaCheck(cudaMemset(partial, 0xFF, (size_t)RED_PARTS_MAX * C * 4));
            cudaCheck(cudaMemcpy(dres, dnext, n * 4, cudaMemcpyDeviceToDevice));
            cudaCheck(cudaMemset(dw, 0, C * 4));
            bwd_run(2, b);
            cudaCheck(cudaDeviceSynchronize());
            bool same = fetch_bytes(dres, n * 4) == o[0] && fetch_bytes(dcopy, n * 2) == o[1] &&
                        fetch_bytes(dw, C * 4) == o[2];
            ok &= same;
            printf(" v2 %s", same ? "bit-identical" : "DIFFERENT (FAIL)");
        }
        printf("\n");
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(dcopy)); cudaCheck(cudaFree(du));
    cudaCheck(cudaFree(dnext)); cudaCheck(cudaFree(dres)); cudaCheck(cudaFree(dslot)); cudaCheck(cudaFree(rstd));
    cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(partial));
    return ok;
}

// shapes: 100m, 1b-wide rows, and small ones with partial lanes (C = 32, 200),
// one width that 8 does not divide (36: one value a pack), odd row counts
static const size_t SHAPES[][2] = {{N100, 512}, {4096, 2048}, {555, 32}, {300, 200}, {77, 36}, {1000, 512}};
static bool check_op(bool fwd, int ver, uint64_t seed) {
    printf("%s v%d check (tolerances: %s)\n", fwd ? "fwd" : "bwd", ver,
           fwd ? "y rtol 2^-8; u rtol 3 x 2^-8; rstd rtol 2^-7"
               : "dres rtol 1e-5 + atol 1e-5 max; dcopy rtol 2^-8 + atol 1e-5 max; dw rtol 1e-4 + atol 1e-4 max");
    bool ok = true;
    for (size_t s = quick ? 2 : 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
        ok &= fwd ? check_fwd_shape(ver, SHAPES[s][0], (int)SHAPES[s][1], seed + 10 * s)
                  : check_bwd_shape(ver, SHAPES[s][0], (int)SHAPES[s][1], seed + 10 * s);
    }
    printf("%s v%d check: %s\n", fwd ? "fwd" : "bwd", ver, ok ? "PASS" : "FAIL");
    return ok;
}

// ============================================================================
// Bench: CUDA events around one step's 24 calls at the 100m shape (every site
// on its own slot buffers, as in the trainer, so L2 does not hold the inputs
// between calls); 2 warm-ups, then the median of --reps repeats.
// ============================================================================

static void print_time(const char *op, int ver, const char *what, float ms, float mn, double bytes, double copy_gbs,
                       double profile_ms) {
    double floor4 = bytes / 4.0e9, floorc = bytes / (copy_gbs * 1e6);
    printf("  %-4s v%d %-30s %8.3f ms (min %.3f) %6.3f GB %6.0f GB/s  floor %.3f ms at 4.0 TB/s (%.2fx), %.3f at copy",
           op, ver, what, ms, mn, bytes / 1e9, bytes / (ms * 1e-3) / 1e9, floor4, ms / floor4, floorc);
    if (profile_ms > 0) { printf("  [trainer profile, H200: %.2f ms]", profile_ms); }
    printf("\n");
}

// The H200 per-op profile of the trainer before this lab (run 3, std, ms per
// step): fwd residual 1.306 + fwd norm 0.714 (25 calls, 24 of them after a
// residual add); bwd route + norm 3.079 + residual + cast 3.049 (which also
// holds the zero of dln, 24 x 67 MB) + zero dslots 0.379.
static const double PROF_FWD = 1.306 + 0.714, PROF_BWD = 3.079 + 3.049 + 0.379;

static void bench_op(bool fwd, int ver, int reps, uint64_t seed, double copy_gbs) {
    const size_t N = N100, n = N * C100;
    const int C = C100, J = CALLS100 + 1;
    floatX *slots = dalloc<floatX>((size_t)J * n), *w = dalloc<floatX>(C);
    fill_rows_kernel<floatX><<<8192, 256>>>(slots, (size_t)J * N, C, seed);
    launchCheck();
    fill_normal(w, C, seed + 2, 1.0f, 0.3f);
    char what[64];
    float mn, ms;
    if (fwd) {   // site j+1 from slot j and the (per-layer) sublayer output
        floatX *outs = dalloc<floatX>((size_t)CALLS100 * n), *u = dalloc<floatX>((size_t)J * n);
        float *rstd = dalloc<float>((size_t)J * N);
        fill_normal(outs, (size_t)CALLS100 * n, seed + 1, 0.0f, 0.5f);
        ms = time_median(reps, [&]() {
            for (int j = 0; j < CALLS100; j++) {
                FwdBufs b = {slots + j * n, outs + j * n, w, slots + (j + 1) * n, u + (j + 1) * n, rstd + (j + 1) * N, N, C};
                fwd_run(ver, b);
            }
        }, &mn);
        snprintf(what, sizeof what, "fwd %d x (N=%zu C=%d)", CALLS100, N, C);
        print_time("res", ver, what, ms, mn, CALLS100 * fwd_bytes(N, C), copy_gbs, ver == 1 ? PROF_FWD : 0);
        cudaCheck(cudaFree(outs)); cudaCheck(cudaFree(u)); cudaCheck(cudaFree(rstd));
    } else {     // one du and one dres (the trainer's dln and running gradient), slot j per site
        float *du = dalloc<float>(n), *rstd = dalloc<float>((size_t)J * N), *dw = dalloc<float>(C);
        float *dres = dalloc<float>(n), *dsl = dalloc<float>((size_t)J * n);
        // v3: each site's partials in a slice of their own, its dw its own (C), as in the trainer
        const size_t slice = (size_t)RED_PARTS_MAX * C;
        float *partial = dalloc<float>((ver >= 3 ? CALLS100 : 1) * slice);
        float *dws = dalloc<float>((size_t)CALLS100 * C);
        std::vector<float *> dw_site(CALLS100);
        for (int j = 0; j < CALLS100; j++) { dw_site[j] = dws + (size_t)j * C; }
        floatX *dcopy = dalloc<floatX>(n);
        fill_normal(du, n, seed + 3, 0.0f, 1.0f);
        fill_normal(rstd, (size_t)J * N, seed + 5, 1.0f, 0.1f);
        zero(dres, n * 4); zero(dsl, (size_t)J * n * 4); zero(dw, C * 4); zero(dws, (size_t)CALLS100 * C * 4);
        ms = time_median(reps, [&]() {
            for (int j = CALLS100 - 1; j >= 0; j--) {
                BwdBufs b = {du, rstd + j * N, slots + j * n, w, dres, dsl + (j + 1) * n, dsl + j * n, dcopy, dw,
                             partial + (ver >= 3 ? j * slice : 0), N, C};
                bwd_run(ver, b);
            }
            if (ver >= 3) { dw_reduce_sites(dw_site.data(), partial, slice, CALLS100, N, C); }
        }, &mn);
        snprintf(what, sizeof what, "bwd %d x (N=%zu C=%d)%s", CALLS100, N, C, ver >= 3 ? " + 1 dw" : "");
        print_time("res", ver, what, ms, mn, CALLS100 * bwd_bytes(N, C), copy_gbs, ver == 1 ? PROF_BWD : 0);
        if (ver >= 2) {   // the dw reductions alone (their partials as the run above left them)
            const int R = red_rows_per_part(N), P = (int)ceil_div(N, R);
            float rmn, rms = time_median(reps, [&]() {
                if (ver >= 3) { dw_reduce_sites(dw_site.data(), partial, slice, CALLS100, N, C); return; }
                for (int j = 0; j < CALLS100; j++) {
                    rmsnorm_dw_reduce_kernel<<<ceil_div(C, 32), dim3(32, 32)>>>(dw, partial, P, C);
                    launchCheck();
                }
            }, &rmn);
            printf("       v%d dw reductions alone: %.3f ms (min %.3f), %d launch%s\n", ver, rms, rmn,
                   ver >= 3 ? 1 : CALLS100, ver >= 3 ? "" : "es");
        }
        cudaCheck(cudaFree(du)); cudaCheck(cudaFree(rstd)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dres));
        cudaCheck(cudaFree(dsl)); cudaCheck(cudaFree(partial)); cudaCheck(cudaFree(dcopy)); cudaCheck(cudaFree(dws));
    }
    cudaCheck(cudaFree(slots)); cudaCheck(cudaFree(w));
}

// ============================================================================

int main(int argc, char **argv) {
    int ver = 0, reps = 20;
    bool do_check = false, do_bench = false, do_all = false, do_self = false, do_bytes = false;
    bool op_fwd = false, op_bwd = false;
    uint64_t seed = 1234;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        auto val = [&](void) -> const char * {
            if (i + 1 >= argc) { fprintf(stderr, "error: %s needs a value\n", a); exit(1); }
            return argv[++i];
        };
        if (!strcmp(a, "--version")) { ver = atoi(val()); }
        else if (!strcmp(a, "--op")) {
            const char *o = val();
            if (!strcmp(o, "fwd")) { op_fwd = true; }
            else if (!strcmp(o, "bwd")) { op_bwd = true; }
            else { fprintf(stderr, "error: --op takes fwd or bwd\n"); return 1; }
        }
        else if (!strcmp(a, "--check")) { do_check = true; }
        else if (!strcmp(a, "--bench")) { do_bench = true; }
        else if (!strcmp(a, "--all")) { do_all = true; }
        else if (!strcmp(a, "--cpu-selftest")) { do_self = true; }
        else if (!strcmp(a, "--bytes")) { do_bytes = true; }
        else if (!strcmp(a, "--seed")) { seed = strtoull(val(), NULL, 10); }
        else if (!strcmp(a, "--reps")) { reps = atoi(val()); }
        else if (!strcmp(a, "--quick")) { quick = true; }
        else { fprintf(stderr, "error: unknown flag %s (see the top of dev/cuda/residual.cu)\n", a); return 1; }
    }
    if (do_self) { return cpu_selftest(seed); }
    if (do_bytes) { print_bytes(); return 0; }
    if (ver < 0 || ver > 4 || (ver >= 3 && op_fwd) || reps < 1) {
        fprintf(stderr, "usage: residual [--op fwd|bwd] [--version 1..4 (3, 4: bwd only)] [--check] [--bench] [--seed S]"
                        " [--reps R];"
                        "  residual --all;  residual --cpu-selftest;  residual --bytes\n");
        return 1;
    }
    if (do_all || (!op_fwd && !op_bwd)) { op_fwd = op_bwd = true; }
    if (do_all || (!do_check && !do_bench)) { do_check = do_bench = true; }
    if (do_all) { ver = 0; }
    const int v0 = ver ? ver : 1, v1 = ver ? ver : 4;   // fwd has versions 1..2, bwd 1..4
    print_device(seed);
    bool ok = true;
    if (do_check) {
        for (int v = v0; v <= v1; v++) {
            if (op_fwd && v <= 2) { ok &= check_op(true, v, seed); }
            if (op_bwd) { ok &= check_op(false, v, seed); }
        }
    }
    if (do_bench) {
        double gbs = bench_intro(reps);
        for (int v = v0; v <= v1; v++) {
            if (op_fwd && v <= 2) { bench_op(true, v, reps, seed, gbs); }
            if (op_bwd) { bench_op(false, v, reps, seed, gbs); }
        }
    }
    if (do_check) { printf("all checks: %s\n", ok ? "PASS" : "FAIL"); }
    return ok ? 0 : 1;
}
