/*
train_mhar.cu: the CUDA trainer of Multi-Head Attention Residuals.

The same model, flags, data loader, checkpoints, schedule, sampling and log as
the CPU reference train_mhar.c, which this file mirrors function by function:
read the two side by side. SPEC.md is the contract; section numbers refer to it.
Matmuls go through cuBLAS; every other op is a hand-written kernel below its
host wrapper of the CPU file's name. Attention keeps only the per-row
log-sum-exp (no (T, T) matrix): in the bf16 build at head dims 64 and 128,
flash kernels on tensor cores (mma.sync) from the kernel lab dev/cuda/;
otherwise simple tiled kernels with an online softmax, one warp per row.

Precision, chosen at build time:
  (default)        bf16 mixed precision: weights copies and activations in
                   bf16 (floatX); fp32 master weights, AdamW state, parameter
                   gradients, routing source gradients (dslots), softmax and
                   norm statistics; every reduction sums in fp32; cuBLAS with
                   fp32 compute. `make train_mhar_cu`.
  -DPRECISION_FP32 everything fp32, cuBLAS with pedantic fp32 compute (no
                   TF32), to verify against the CPU. `make train_mhar_cu_fp32`.
  -DTESTING        no main; exports the C API of common/gpu_api.h under
                   mhar_gpu_fp32_* or mhar_gpu_bf16_*, for test_mhar.c.

Determinism: no floating-point atomics anywhere. Per-channel reductions over
positions (norm weights, routing q and gamma) write per-block partials that a
second kernel sums in a fixed order; attention's dk and dv are owned by one
block per key tile and kv head, dq by one block per query tile; the embedding gradient walks each token's
positions in order; cuBLAS runs with atomics off on one stream. Two runs with
the same seed give the same bits.

Routing (SPEC section 4): every source lives in one buffer slots
[2L+1, B, T, C] that each sublayer writes once (config.h's slot design, shared
with std and block mode); r_i is computed once per source. The routing kernels
are the fused ones of the lab dev/cuda/route.cu (v2 forward, v3 backward): the
forward pass is one pass over a site's sources with an online softmax, with
the site's RMSNorm in the same kernel, and keeps per site the log-sum-exp of
the weights (not a itself) and, like the CPU file, the routed input h_j. The
backward pass stores each site's dL/dh_j, then gathers each slot's gradient
from all the sites that read it, in fp32, visiting the slots in reverse order:
one (B, T, C) fp32 slot gradient at a time, written once.
*/
#include <sys/resource.h>
#include <type_traits>
#include <sys/stat.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include "common/util.h"
#include "common/config.h"
#include "common/args.h"
#include "common/dataloader.h"
#include "common/checkpoint.h"
#include "common/logger.h"
#include "common/tokenizer.h"
#include "common/gpu_api.h"

#ifdef PRECISION_FP32
typedef float floatX;
#define MHAR_PREC fp32
#define PRECISION_NAME "fp32"
#define CUDA_FLOATX CUDA_R_32F
#define CUBLAS_COMPUTE CUBLAS_COMPUTE_32F_PEDANTIC   // true fp32: no TF32 tensor cores
#else
typedef __nv_bfloat16 floatX;
#define MHAR_PREC bf16
#define PRECISION_NAME "bf16"
#define CUDA_FLOATX CUDA_R_16BF
#define CUBLAS_COMPUTE CUBLAS_COMPUTE_32F            // bf16 inputs, fp32 accumulation
#endif

// API names mhar_gpu_<precision>_<name> (common/gpu_api.h)
#define MHAR_API3(p, n) mhar_gpu_##p##_##n
#define MHAR_API2(p, n) MHAR_API3(p, n)
#define MHAR_API(n) MHAR_API2(MHAR_PREC, n)

namespace {   // everything but the API and main is internal to this object

// ----------------------------------------------------------------------------
// Checked CUDA and cuBLAS calls: one line naming the call site, then exit 1.

void cuda_check(cudaError_t e, const char *file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "error: CUDA: %s (%s:%d)\n", cudaGetErrorString(e), file, line);
        exit(1);
    }
}
void cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: cuBLAS: %s (%s:%d)\n", cublasGetStatusString(s), file, line);
        exit(1);
    }
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)
#define launchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

cublasHandle_t cublas;   // one handle, on the default stream

inline unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
void zero(void *p, size_t bytes) { if (bytes) { cudaCheck(cudaMemsetAsync(p, 0, bytes, 0)); } }

// ----------------------------------------------------------------------------
// Per-op timing of one optimizer step, for the breakdown of dev/bench_gpu.sh.
// MHAR_PROFILE=k (environment) times step k: prof("name") records a CUDA event,
// and the GPU time up to the next prof() call is booked to "name". At the end of
// that step a table of milliseconds per name is printed. Off (the default), a
// prof() call costs one branch.

#define PROF_EVENTS 4096
struct Prof {
    int step_wanted, step;        // step to time (0: none), optimizer steps begun so far
    int n;                        // events recorded in this step
    cudaEvent_t ev[PROF_EVENTS];
    const char *name[PROF_EVENTS];
} prof_state;

void prof(const char *name) {
    Prof *p = &prof_state;
    if (p->step_wanted == 0 || p->step != p->step_wanted || p->n >= PROF_EVENTS) { return; }
    if (p->ev[p->n] == NULL) { cudaCheck(cudaEventCreate(&p->ev[p->n])); }
    cudaCheck(cudaEventRecord(p->ev[p->n], 0));
    p->name[p->n++] = name;
}

// called as an optimizer step begins (prof_step_begin) and ends (prof_step_end)
void prof_step_begin(void) {
    Prof *p = &prof_state;
    if (p->step == 0) {
        const char *e = getenv("MHAR_PROFILE");
        p->step_wanted = e != NULL ? atoi(e) : 0;
    }
    p->step++;
    p->n = 0;
}
void prof_step_end(void) {
    Prof *p = &prof_state;
    if (p->step_wanted == 0 || p->step != p->step_wanted || p->n == 0) { return; }
    prof("end");
    cudaCheck(cudaEventSynchronize(p->ev[p->n - 1]));
    const char *names[64];
    float ms[64], total = 0;
    int calls[64], k = 0;
    for (int i = 0; i + 1 < p->n; i++) {
        float t;
        cudaCheck(cudaEventElapsedTime(&t, p->ev[i], p->ev[i + 1]));
        int j = 0;
        while (j < k && strcmp(names[j], p->name[i]) != 0) { j++; }
        if (j == k) {
            if (k == 64) { continue; }
            names[k] = p->name[i]; ms[k] = 0; calls[k] = 0; k++;
        }
        ms[j] += t; calls[j]++; total += t;
    }
    printf("profile of step %d (GPU time between marks, ms):\n", p->step);
    for (int j = 0; j < k; j++) {   // in order of first appearance
        printf("  %-26s %9.3f ms %6.1f%% %6d calls\n", names[j], ms[j], 100.0f * ms[j] / total, calls[j]);
    }
    printf("  %-26s %9.3f ms\n", "total", total);
}

__device__ __host__ inline float toF(float x) { return x; }
__device__ __host__ inline float toF(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __host__ inline T fromF(float x);
template <> __device__ __host__ inline float fromF<float>(float x) { return x; }
template <> __device__ __host__ inline __nv_bfloat16 fromF<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// Butterfly reductions: every lane ends with the same value, in a fixed order.
__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, o); }
    return v;
}
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o)); }
    return v;
}
// Sum over a block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();   // part[] may still be read by a previous call
    if (lane == 0) { part[warp] = v; }
    __syncthreads();
    float x = lane < nwarps ? part[lane] : 0.0f;
    return warp_sum(x);
}
__device__ float block_max(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) { part[warp] = v; }
    __syncthreads();
    float x = lane < nwarps ? part[lane] : -INFINITY;
    return warp_max(x);
}

// out (n) = (T) in (n): float -> floatX copies (and a plain copy in fp32)
template <typename Tout, typename Tin>
__global__ void cast_kernel(Tout *out, const Tin *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = fromF<Tout>(toF(in[i])); }
}
template <typename Tout, typename Tin>
void cast(Tout *out, const Tin *in, size_t n) {
    if (n == 0) { return; }
    cast_kernel<<<ceil_div(n, 256), 256>>>(out, in, n);
    launchCheck();
}

// Deterministic per-channel sums over many rows: a kernel writes one partial
// per (partition of rows, channel); a second sums the partitions in order.
// Row partitions hold at least 64 rows and there are at most RED_PARTS_MAX.
#define RED_PARTS_MAX 512
int red_rows_per_part(size_t rows) {
    size_t r = (rows + RED_PARTS_MAX - 1) / RED_PARTS_MAX;
    return (int)(r < 64 ? 64 : r);
}

// ----------------------------------------------------------------------------
// Matrix multiply (cuBLAS)
//
// Every matmul multiplies by a weight W of shape (OC, IC), row-major like the
// CPU file. cuBLAS is column-major, where a row-major (R, K) matrix is its
// (K, R) transpose, so each product below is written for the transposes:
//   forward   out  (N, OC)  = inp (N, IC) . W^T     <=>  out^T  = W^T(op T) . inp^T
//   backward  dinp (N, IC) += dout (N, OC) . W      <=>  dinp^T += W^T . dout^T
//             dW   (OC, IC) += dout^T . inp         <=>  dW^T   += inp^T . dout
// Inputs are floatX; dW accumulates (beta 1) in fp32. dinp, in fp32 or, where
// its consumer reads floatX, in floatX (attention's datty), accumulates with
// DINP_ADD (+=) or is overwritten with DINP_SET (=, beta 0: its old contents,
// even NaN, are never read), which saves zeroing it first: the first matmul
// into a gradient buffer sets it, the later ones add.

// out (N, OC) = inp (N, IC) . weight^T, weight (OC, IC)
void matmul_forward(floatX *out, const floatX *inp, const floatX *weight, size_t N, int IC, int OC) {
    const float one = 1.0f, zero_f = 0.0f;
    cublasCheck(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, (int)N, IC, &one, weight, CUDA_FLOATX, IC,
                             inp, CUDA_FLOATX, IC, &zero_f, out, CUDA_FLOATX, OC, CUBLAS_COMPUTE, CUBLAS_GEMM_DEFAULT));
}

enum { DINP_SET = 0, DINP_ADD = 1 };
// The two halves of matmul_forward's backward (out[n][o] = sum_i inp[n][i] * weight[o][i]).
// dinp (N, IC) = or += dout . weight (dinp_mode DINP_SET or DINP_ADD; Tdinp: float or floatX)
template <typename Tdinp>
void matmul_backward_inp(Tdinp *dinp, const floatX *dout, const floatX *weight, size_t N, int IC, int OC,
                         int dinp_mode) {
    const float one = 1.0f, beta_dinp = dinp_mode == DINP_ADD ? 1.0f : 0.0f;
    const cudaDataType dinp_type = sizeof(Tdinp) == sizeof(float) ? CUDA_R_32F : CUDA_FLOATX;
    cublasCheck(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, IC, (int)N, OC, &one, weight, CUDA_FLOATX, IC,
                             dout, CUDA_FLOATX, OC, &beta_dinp, dinp, dinp_type, IC, CUBLAS_COMPUTE, CUBLAS_GEMM_DEFAULT));
}
// dweight (OC, IC) += dout^T . inp (fp32)
void matmul_backward_weight(float *dweight, const floatX *dout, const floatX *inp, size_t N, int IC, int OC) {
    const float one = 1.0f;
    cublasCheck(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, (int)N, &one, inp, CUDA_FLOATX, IC,
                             dout, CUDA_FLOATX, OC, &one, dweight, CUDA_R_32F, IC, CUBLAS_COMPUTE, CUBLAS_GEMM_DEFAULT));
}
// both: dinp, then dweight
template <typename Tdinp>
void matmul_backward(Tdinp *dinp, float *dweight, const floatX *dout, const floatX *inp, const floatX *weight,
                     size_t N, int IC, int OC, int dinp_mode) {
    matmul_backward_inp(dinp, dout, weight, N, IC, OC, dinp_mode);
    matmul_backward_weight(dweight, dout, inp, N, IC, OC);
}

// ----------------------------------------------------------------------------
// Embedding

__global__ void encoder_forward_kernel(floatX *out, const int *inp, const floatX *wte, size_t N, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * C) { return; }
    size_t n = i / C, c = i % C;
    out[i] = wte[(size_t)inp[n] * C + c];
}

// out (N, C) = wte[inp[n]]: the first source v_0 (SPEC section 4). inp on the device.
void encoder_forward(floatX *out, const int *inp, const floatX *wte, size_t N, int C) {
    encoder_forward_kernel<<<ceil_div(N * C, 256), 256>>>(out, inp, wte, N, C);
    launchCheck();
}

// One block row per distinct token s: dwte[tok[s]] += dout[n] over that token's
// positions n in increasing order (the CPU's serial order, without atomics).
__global__ void encoder_backward_kernel(float *dwte, const float *dout, const int *order, const int *seg_start,
                                        const int *seg_tok, int C) {
    int s = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float *d = dwte + (size_t)seg_tok[s] * C + c;
    float acc = *d;
    for (int k = seg_start[s]; k < seg_start[s + 1]; k++) { acc += dout[(size_t)order[k] * C + c]; }
    *d = acc;
}

int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

// dwte[inp[n]] += dout[n]. inp is the host copy of the batch; the host groups
// the positions by token (sorted by (token, position)) into the device scratch
// `scratch` (3N+1 ints), then one kernel row per token sums them in order.
void encoder_backward(float *dwte, const float *dout, const int *inp, size_t N, int C, int *scratch) {
    uint64_t *key = (uint64_t *)malloc_check(N * sizeof(uint64_t));
    int *host = (int *)malloc_check((3 * N + 1) * sizeof(int));
    for (size_t n = 0; n < N; n++) { key[n] = (uint64_t)(uint32_t)inp[n] << 32 | (uint64_t)n; }
    qsort(key, N, sizeof(uint64_t), cmp_u64);
    int *order = host, *seg_start = host + N, nseg = 0;
    int *seg_tok = host + 2 * N + 1;
    for (size_t k = 0; k < N; k++) {
        order[k] = (int)(key[k] & 0xffffffffu);
        int tok = (int)(key[k] >> 32);
        if (k == 0 || tok != seg_tok[nseg - 1]) { seg_start[nseg] = (int)k; seg_tok[nseg++] = tok; }
    }
    seg_start[nseg] = (int)N;
    // device layout: order (N) | seg_start (N+1) | seg_tok (N)
    cudaCheck(cudaMemcpy(scratch, host, (3 * N + 1) * sizeof(int), cudaMemcpyHostToDevice));
    dim3 grid(nseg, ceil_div(C, 128));
    encoder_backward_kernel<<<grid, 128>>>(dwte, dout, scratch, scratch + N, scratch + 2 * N + 1, C);
    launchCheck();
    free(key); free(host);
}

// ----------------------------------------------------------------------------
// RMSNorm of the pre-norms and the final norm (vectors of C; QK-norm has its
// own fused kernels below). std mode: rmsnorm_forward normalises the embedding
// (site 0), and every later site's norm is fused with the residual add before
// it (residual_norm_forward); the backward adds into the one running gradient
// of the residual stream (rmsnorm_backward_residual). mhar mode: route_forward
// applies the forward norm, and the site's backward (route_site_backward)
// recomputes u for the weight gradients that read it.

__global__ void rmsnorm_forward_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *w, size_t N, int D) {
    size_t n = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (n >= N) { return; }
    const floatX *x = inp + n * D;
    float ss = 0.0f;
    for (int i = lane; i < D; i += 32) { float xi = toF(x[i]); ss += xi * xi; }
    ss = warp_sum(ss);
    float s = 1.0f / sqrtf(ss / D + 1e-6f);
    for (int i = lane; i < D; i += 32) { out[n * D + i] = fromF<floatX>(toF(x[i]) * s * toF(w[i])); }
    if (lane == 0) { rstd[n] = s; }
}

// out (N, D) = inp / sqrt(mean(inp^2) + 1e-6) * w;  rstd (N) kept for backward
void rmsnorm_forward(floatX *out, float *rstd, const floatX *inp, const floatX *w, size_t N, int D) {
    rmsnorm_forward_kernel<<<ceil_div(N, 8), 256>>>(out, rstd, inp, w, N, D);
    launchCheck();
}

// The residual stream's row kernels (std mode; the forward one also serves the
// chained slots of block mode): one warp per row of C channels. Lane l holds
// the packs l, l + 32, ... (NP of them) of RVEC floatX values each: 16-byte
// loads when C and the pointers allow (RVEC = 8 in bf16, 4 in fp32), else one
// value a pack. The row stays in registers between the reduction and its use.
// Lab: dev/cuda/residual.cu (v2).
template <int VEC> struct alignas(VEC * sizeof(floatX) < 16 ? VEC * sizeof(floatX) : 16) RowX { floatX x[VEC]; };
template <int VEC> struct alignas(VEC * 4 < 16 ? VEC * 4 : 16) RowF { float x[VEC]; };
template <int VEC, int NP> struct RowLanes { static constexpr int vec = VEC, np = NP; };
#define RVEC (16 / (int)sizeof(floatX))

// Calls f(RowLanes<VEC, NP>()) with VEC = RVEC when C and the pointers (16-byte
// alignment) allow it, else 1, and NP the packs per lane rounded up to 1, 2, 4,
// 8 or 16. Dies past that: C > 16 * 32 * VEC (4096 in bf16, 2048 in fp32, 512
// for widths that RVEC does not divide).
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

// Backward of u = rmsnorm(x; w) (N, C) on the residual stream (std), given
// du = dL/du (fp32):
//   dres (N, C) fp32 = (add ? dres : 0) + dL/dx   (dres: the running gradient
//                      of the residual stream, one buffer for all the sites)
//   dcopy (N, C)     = floatX copy of the new dres, which the matmul backwards
//                      of the sublayer before read as its dout (NULL: none)
//   dw (C)          += dL/dw, from per-block partials (scratch partial,
//                      RED_PARTS_MAX * C floats) summed in a fixed order.
void rmsnorm_backward_residual(float *dres, floatX *dcopy, float *dw, const float *du, const floatX *x,
                               const float *rstd, const floatX *w, size_t N, int C, int add, float *partial) {
    // u[i] = x[i] s w[i], s = (mean(x^2) + eps)^(-1/2), ds/dx[i] = -s^3 x[i] / C:
    // dx[i] = s du[i] w[i] - s^3 / C (sum_k du[k] w[k] x[k]) x[i];  dw[i] = sum_n du[i] x[i] s
    const int R = red_rows_per_part(N), P = (int)ceil_div(N, R);
    row_dispatch(C, aligned16(dres) && aligned16(dcopy) && aligned16(du) && aligned16(x), [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NP = decltype(lanes)::np;
        rmsnorm_backward_residual_kernel<VEC, NP><<<P, 256>>>(dres, dcopy, partial, du, x, rstd, w, N, C, R, add);
    });
    launchCheck();
    rmsnorm_dw_reduce_kernel<<<ceil_div(C, 32), dim3(32, 32)>>>(dw, partial, P, C);
    launchCheck();
}

// ----------------------------------------------------------------------------
// 16-byte packs of floatX: 8 bf16 or 4 fp32 values, loaded and stored in one
// instruction (QK-norm + RoPE, SwiGLU and the classifier).
#define PACK (16 / (int)sizeof(floatX))
struct alignas(16) Pack { floatX v[PACK]; };

// x (PACK) = p[0 .. PACK-1] in fp32, as PACK/4 loads of 16 bytes (p 16-byte aligned)
__device__ __forceinline__ void ld_pack_f32(float (&x)[PACK], const float *p) {
    #pragma unroll
    for (int q = 0; q < PACK / 4; q++) {
        const float4 v = reinterpret_cast<const float4 *>(p)[q];
        x[4 * q] = v.x; x[4 * q + 1] = v.y; x[4 * q + 2] = v.z; x[4 * q + 3] = v.w;
    }
}

// ----------------------------------------------------------------------------
// QK-norm and RoPE, fused: train_mhar.c's rmsnorm_forward (per head, weights of
// HD) followed by rope_forward, in one pass over the heads' rows. RoPE uses the
// rotate-half convention: pairs (i, i + HD/2) turn by the angle t * 10000^(-2i/HD),
// cosv, sinv (T, HD/2). The rows (b, t, h) hold HD values each; rows = B*T*nh.
//
// Two kernel pairs, from the kernel lab dev/cuda/elementwise.cu (NOTES_elementwise.md):
//  - packed (the lab's v3): a lane owns one 16-byte pack of a row (PACK values),
//    so G = HD/PACK lanes hold a row and a warp holds 32/G rows. The rotate-half
//    partner of value j < HD/2 is j + HD/2, in pack p + G/2: lane ^ (G/2). The
//    row sums are butterflies over the row's G lanes. It runs where G is a power
//    of two from 2 to 32 (bf16: HD 16 .. 256; fp32: HD 8 .. 128) and every row
//    is 16-byte aligned. H200, 100m, per step of 12 layers (q and k), bf16: fwd
//    0.48 ms, bwd 0.82 ms, against 1.20 and 2.71 ms for the per-pair kernels.
//    The lab ran bf16 only; the fp32 build runs the same code at PACK = 4.
//  - per-pair (the lab's v2): one warp per row, lane j holds the pairs j, j + 32,
//    ...; every other head dim (the test preset's HD = 8 in bf16, fp32 HD = 256).
// Both backward kernels WRITE dinp (nothing else adds to dqr, dkr) and dw's
// per-partition partials, which are then summed in a fixed order: deterministic.

// Packed forward: out (rows, HD) = rope(rmsnorm(inp; w)), rstd (rows) kept for
// the backward; out may not alias inp. A block of 8 warps takes 8 * 32/G rows.
template <int HD>
__global__ void __launch_bounds__(256)
qknorm_rope_forward_packed_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *w, const float *cosv,
                                  const float *sinv, size_t rows, int T, int nh) {
    constexpr int G = HD / PACK, RPW = 32 / G, HALF = HD / 2;
    static_assert(HD % (2 * PACK) == 0 && G <= 32 && 32 % G == 0, "packed QK-norm: HD/PACK must be 2, 4, .. 32");
    const int lane = threadIdx.x % 32, p = lane % G;
    const size_t n = ((size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * RPW + lane / G;
    const bool valid = n < rows;   // no early return: every lane takes part in the shuffles
    float x[PACK], wv[PACK], ss = 0.0f;
    if (valid) {
        const Pack xp = reinterpret_cast<const Pack *>(inp + n * HD)[p];
        #pragma unroll
        for (int e = 0; e < PACK; e++) { x[e] = toF(xp.v[e]); }
    } else {
        #pragma unroll
        for (int e = 0; e < PACK; e++) { x[e] = 0.0f; }
    }
    const Pack wp = reinterpret_cast<const Pack *>(w)[p];
    #pragma unroll
    for (int e = 0; e < PACK; e++) { wv[e] = toF(wp.v[e]); ss += x[e] * x[e]; }
    #pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) { ss += __shfl_xor_sync(0xffffffffu, ss, o); }
    const float s = 1.0f / sqrtf(ss / HD + 1e-6f);
    float y[PACK], yo[PACK];
    #pragma unroll
    for (int e = 0; e < PACK; e++) { y[e] = x[e] * s * wv[e]; }                               // the norm
    #pragma unroll
    for (int e = 0; e < PACK; e++) { yo[e] = __shfl_xor_sync(0xffffffffu, y[e], G / 2); }   // the partner's
    if (!valid) { return; }
    const int t = (int)((n / nh) % T), j0 = (p * PACK) % HALF;
    float c[PACK], sn[PACK];
    ld_pack_f32(c, cosv + (size_t)t * HALF + j0);
    ld_pack_f32(sn, sinv + (size_t)t * HALF + j0);
    const bool first = p < G / 2;   // out1 = y1 c - y2 sn (first half), out2 = y2 c + y1 sn
    Pack op;
    #pragma unroll
    for (int e = 0; e < PACK; e++) {
        op.v[e] = fromF<floatX>(first ? y[e] * c[e] - yo[e] * sn[e] : y[e] * c[e] + yo[e] * sn[e]);
    }
    reinterpret_cast<Pack *>(out + n * HD)[p] = op;
    if (p == 0) { rstd[n] = s; }
}

// Packed backward: dinp (rows, HD) = gradient of inp (written), given dout (fp32);
// partial[b] (HD) = partition b's share of dw. Block b takes the rows of
// partition b (rows_per_part of them), each warp 32/G rows a step.
template <int HD>
__global__ void __launch_bounds__(256)
qknorm_rope_backward_packed_kernel(floatX *dinp, float *partial, const float *dout, const floatX *inp,
                                   const float *rstd, const floatX *w, const float *cosv, const float *sinv,
                                   size_t rows, int T, int nh, int rows_per_part) {
    constexpr int G = HD / PACK, RPW = 32 / G, HALF = HD / 2, WARPS = 8;
    static_assert(HD % (2 * PACK) == 0 && G <= 32 && 32 % G == 0, "packed QK-norm: HD/PACK must be 2, 4, .. 32");
    __shared__ alignas(16) float acc[WARPS * RPW][HD];   // 8 KB (bf16) or 4 KB (fp32) at every HD
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, p = lane % G, r = lane / G;
    const size_t n0 = (size_t)blockIdx.x * rows_per_part;
    const size_t n1 = n0 + rows_per_part < rows ? n0 + rows_per_part : rows;
    const bool first = p < G / 2;
    const int j0 = (p * PACK) % HALF;
    float wv[PACK], dw[PACK];
    {
        const Pack wp = reinterpret_cast<const Pack *>(w)[p];
        #pragma unroll
        for (int e = 0; e < PACK; e++) { wv[e] = toF(wp.v[e]); dw[e] = 0.0f; }
    }
    for (size_t nb = n0 + (size_t)warp * RPW; nb < n1; nb += WARPS * RPW) {   // the same trip count in a warp
        const size_t n = nb + r;
        const bool valid = n < n1;
        float g[PACK], x[PACK], c[PACK], sn[PACK], s = 0.0f;
        if (valid) {
            ld_pack_f32(g, dout + n * HD + p * PACK);
            const Pack xp = reinterpret_cast<const Pack *>(inp + n * HD)[p];
            const int t = (int)((n / nh) % T);
            ld_pack_f32(c, cosv + (size_t)t * HALF + j0);
            ld_pack_f32(sn, sinv + (size_t)t * HALF + j0);
            #pragma unroll
            for (int e = 0; e < PACK; e++) { x[e] = toF(xp.v[e]); }
            s = rstd[n];
        } else {
            #pragma unroll
            for (int e = 0; e < PACK; e++) { g[e] = x[e] = c[e] = sn[e] = 0.0f; }
        }
        float go[PACK], dy[PACK], gwx = 0.0f;
        #pragma unroll
        for (int e = 0; e < PACK; e++) { go[e] = __shfl_xor_sync(0xffffffffu, g[e], G / 2); }
        // out1 = y1 c - y2 sn, out2 = y2 c + y1 sn: dy1 = g1 c + g2 sn, dy2 = g2 c - g1 sn
        #pragma unroll
        for (int e = 0; e < PACK; e++) {
            dy[e] = first ? g[e] * c[e] + go[e] * sn[e] : g[e] * c[e] - go[e] * sn[e];
            gwx += dy[e] * wv[e] * x[e];
        }
        #pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) { gwx += __shfl_xor_sync(0xffffffffu, gwx, o); }
        if (valid) {
            // y[i] = x[i] s w[i], s = (mean(x^2) + eps)^(-1/2), ds/dx[i] = -s^3 x[i] / HD
            const float k3 = s * s * s / HD * gwx;
            Pack dp;
            #pragma unroll
            for (int e = 0; e < PACK; e++) {
                dp.v[e] = fromF<floatX>(s * dy[e] * wv[e] - k3 * x[e]);
                dw[e] += dy[e] * x[e] * s;
            }
            reinterpret_cast<Pack *>(dinp + n * HD)[p] = dp;
        }
    }
    // dw per (warp, row group) into shared memory, then summed over them in a fixed order
    float4 *a = reinterpret_cast<float4 *>(&acc[warp * RPW + r][p * PACK]);
    #pragma unroll
    for (int q = 0; q < PACK / 4; q++) { a[q] = make_float4(dw[4 * q], dw[4 * q + 1], dw[4 * q + 2], dw[4 * q + 3]); }
    __syncthreads();
    for (int i = threadIdx.x; i < HD; i += blockDim.x) {
        float t = 0.0f;
        for (int y = 0; y < WARPS * RPW; y++) { t += acc[y][i]; }
        partial[(size_t)blockIdx.x * HD + i] = t;
    }
}

// dw (D) += sum over the P partitions of partial (P, D): one warp per channel;
// lane l sums the partitions l, l + 32, ... in order, then a fixed butterfly
// (deterministic; the lab's earlier kernel, one thread per channel walking all P
// partials, took 0.11 ms for 12 calls at P = 512, HD = 64, this one 0.05 ms)
__global__ void reduce_partials_warp_kernel(float *dw, const float *partial, int P, int D) {
    int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (i >= D) { return; }
    float s = 0.0f;
    for (int p = lane; p < P; p += 32) { s += partial[(size_t)p * D + i]; }
    s = warp_sum(s);
    if (lane == 0) { dw[i] += s; }
}

#define QK_PAIRS 4   // per-pair kernels: pairs per lane, HD up to 256

// Per-pair forward: out (rows, HD) = rope(rmsnorm(inp; w)); rstd (rows) kept for
// the backward; out may not alias inp. One warp per row.
__global__ void qknorm_rope_forward_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *w,
                                           const float *cosv, const float *sinv, size_t rows, int T, int nh, int HD) {
    size_t n = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32, half = HD / 2;
    if (n >= rows) { return; }
    const floatX *x = inp + n * HD;
    float x1[QK_PAIRS], x2[QK_PAIRS], ss = 0.0f;
    for (int u = 0; u < QK_PAIRS; u++) {
        int j = lane + 32 * u;
        x1[u] = j < half ? toF(x[j]) : 0.0f;
        x2[u] = j < half ? toF(x[j + half]) : 0.0f;
        ss += x1[u] * x1[u] + x2[u] * x2[u];
    }
    ss = warp_sum(ss);
    float s = 1.0f / sqrtf(ss / HD + 1e-6f);
    int t = (int)((n / nh) % T);
    for (int u = 0; u < QK_PAIRS; u++) {
        int j = lane + 32 * u;
        if (j >= half) { break; }
        float y1 = x1[u] * s * toF(w[j]), y2 = x2[u] * s * toF(w[j + half]);   // the norm
        float c = cosv[t * half + j], sn = sinv[t * half + j];                 // the rotation
        out[n * HD + j] = fromF<floatX>(y1 * c - y2 * sn);
        out[n * HD + j + half] = fromF<floatX>(y2 * c + y1 * sn);
    }
    if (lane == 0) { rstd[n] = s; }
}

// Per-pair backward: dinp (rows, HD) = gradient of inp (written); block p takes
// the rows of partition p (rows_per_part of them), warp by warp, and writes
// partial[p] (HD): its rows' share of dw, summed in a fixed order.
__global__ void qknorm_rope_backward_kernel(floatX *dinp, float *partial, const float *dout, const floatX *inp,
                                            const float *rstd, const floatX *w, const float *cosv, const float *sinv,
                                            size_t rows, int T, int nh, int HD, int rows_per_part) {
    __shared__ float acc[8][2 * 32 * QK_PAIRS];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = HD / 2;
    size_t n0 = (size_t)blockIdx.x * rows_per_part, n1 = n0 + rows_per_part < rows ? n0 + rows_per_part : rows;
    float dw1[QK_PAIRS] = {0}, dw2[QK_PAIRS] = {0};
    for (size_t n = n0 + warp; n < n1; n += 8) {
        int t = (int)((n / nh) % T);
        float s = rstd[n], dy1[QK_PAIRS], dy2[QK_PAIRS], x1[QK_PAIRS], x2[QK_PAIRS], gwx = 0.0f;
        for (int u = 0; u < QK_PAIRS; u++) {
            int j = lane + 32 * u;
            dy1[u] = dy2[u] = x1[u] = x2[u] = 0.0f;
            if (j >= half) { continue; }
            // out1 = y1 c - y2 sn, out2 = y2 c + y1 sn: dy is dout turned back by the angle
            float c = cosv[t * half + j], sn = sinv[t * half + j];
            float g1 = dout[n * HD + j], g2 = dout[n * HD + j + half];
            dy1[u] = g1 * c + g2 * sn;
            dy2[u] = g2 * c - g1 * sn;
            x1[u] = toF(inp[n * HD + j]);
            x2[u] = toF(inp[n * HD + j + half]);
            gwx += dy1[u] * toF(w[j]) * x1[u] + dy2[u] * toF(w[j + half]) * x2[u];
        }
        gwx = warp_sum(gwx);
        // y[i] = x[i] s w[i], s = (mean(x^2) + eps)^(-1/2), ds/dx[i] = -s^3 x[i] / HD
        float k3 = s * s * s / HD * gwx;
        for (int u = 0; u < QK_PAIRS; u++) {
            int j = lane + 32 * u;
            if (j >= half) { break; }
            dinp[n * HD + j] = fromF<floatX>(s * dy1[u] * toF(w[j]) - k3 * x1[u]);
            dinp[n * HD + j + half] = fromF<floatX>(s * dy2[u] * toF(w[j + half]) - k3 * x2[u]);
            dw1[u] += dy1[u] * x1[u] * s;
            dw2[u] += dy2[u] * x2[u] * s;
        }
    }
    for (int u = 0; u < QK_PAIRS; u++) {
        int j = lane + 32 * u;
        if (j < half) { acc[warp][j] = dw1[u]; acc[warp][j + half] = dw2[u]; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < HD; i += blockDim.x) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) { t += acc[y][i]; }
        partial[(size_t)blockIdx.x * HD + i] = t;
    }
}

// Whether the packed kernels compile at HD: G = HD/PACK lanes per row, a power of two from 2 to 32
constexpr bool qk_packed_fits(int HD) {
    return HD % (2 * PACK) == 0 && HD / PACK <= 32 && 32 % (HD / PACK) == 0;
}

// A compiled head dim, passed to qk_packed_dispatch's f
template <int HD> struct QkDim { static constexpr int hd = HD; };

// f(QkDim<HD>()) where the packed kernels compile at HD (returns true), else nothing (false)
template <int HD, typename F> bool qk_packed_call(F f) {
    if constexpr (qk_packed_fits(HD)) { f(QkDim<HD>()); return true; }
    return false;
}

// Calls f(QkDim<HD>()) and returns true when the packed kernels run at HD and
// every pointer or-ed into ptr_bits is 16-byte aligned; returns false otherwise.
template <typename F> bool qk_packed_dispatch(int HD, uintptr_t ptr_bits, F f) {
    if (ptr_bits % 16 != 0) { return false; }
    switch (HD) {
    case 8: return qk_packed_call<8>(f);
    case 16: return qk_packed_call<16>(f);
    case 32: return qk_packed_call<32>(f);
    case 64: return qk_packed_call<64>(f);
    case 128: return qk_packed_call<128>(f);
    case 256: return qk_packed_call<256>(f);
    default: return false;
    }
}

// out (B, T, nh, HD) = rope(rmsnorm(inp; w)) per head row; rstd (B, T, nh) kept
// for the backward; w (HD); cosv, sinv (T, HD/2)
void qknorm_rope_forward(floatX *out, float *rstd, const floatX *inp, const floatX *w, const float *cosv,
                         const float *sinv, int B, int T, int nh, int HD) {
    size_t rows = (size_t)B * T * nh;
    uintptr_t bits = (uintptr_t)out | (uintptr_t)inp | (uintptr_t)w | (uintptr_t)cosv | (uintptr_t)sinv;
    bool packed = qk_packed_dispatch(HD, bits, [&](auto dim) {
        constexpr int D = decltype(dim)::hd, RPW = 32 / (D / PACK);
        qknorm_rope_forward_packed_kernel<D><<<ceil_div(rows, 8 * RPW), 256>>>(out, rstd, inp, w, cosv, sinv, rows,
                                                                               T, nh);
    });
    if (!packed) {
        qknorm_rope_forward_kernel<<<ceil_div(rows, 8), 256>>>(out, rstd, inp, w, cosv, sinv, rows, T, nh, HD);
    }
    launchCheck();
}

// dinp (B, T, nh, HD) = gradient of inp (written, not added; floatX: it feeds a
// matmul backward) given dout (fp32, from attention); dw (HD) += gradient of the
// norm weights. partial: scratch of RED_PARTS_MAX * HD floats.
void qknorm_rope_backward(floatX *dinp, float *dw, const float *dout, const floatX *inp, const float *rstd,
                          const floatX *w, const float *cosv, const float *sinv, int B, int T, int nh, int HD,
                          float *partial) {
    // out = rope(y), y = rmsnorm(inp; w) (qknorm_rope_forward)
    size_t rows = (size_t)B * T * nh;
    int R = red_rows_per_part(rows), P = (int)ceil_div(rows, R);
    uintptr_t bits = (uintptr_t)dinp | (uintptr_t)dout | (uintptr_t)inp | (uintptr_t)w | (uintptr_t)cosv |
                     (uintptr_t)sinv;
    bool packed = qk_packed_dispatch(HD, bits, [&](auto dim) {
        constexpr int D = decltype(dim)::hd;
        qknorm_rope_backward_packed_kernel<D><<<P, 256>>>(dinp, partial, dout, inp, rstd, w, cosv, sinv, rows, T, nh,
                                                          R);
    });
    if (!packed) {
        qknorm_rope_backward_kernel<<<P, 256>>>(dinp, partial, dout, inp, rstd, w, cosv, sinv, rows, T, nh, HD, R);
    }
    launchCheck();
    // dw[i] = sum over the rows of dy[i] x[i] s: the partials, summed in order
    reduce_partials_warp_kernel<<<ceil_div(HD, 8), 256>>>(dw, partial, P, HD);
    launchCheck();
}

// ----------------------------------------------------------------------------
// Causal self-attention with grouped-query heads: query head h reads key/value
// head h / (NH/NKV). Scores are scaled by 1/sqrt(HD). q, out (B, T, NH, HD);
// k, v (B, T, NKV, HD). The forward pass keeps only lse (B, NH, T), each row's
// log-sum-exp of its scaled scores, and the backward pass recomputes the
// probabilities p = exp(score - lse): no (T, T) matrix is ever stored.
//
// Two implementations; attention_use_flash picks one per call:
//  - flash kernels on tensor cores, from the kernel lab dev/cuda/attention.cu:
//    the bf16 build at HD = 64 or 128 (the 100m, 350m and 1b presets);
//  - simple kernels: everything else, i.e. the fp32 build (the one verified
//    against the CPU to ~1e-5) and other head dims (test HD=8, tiny HD=32).
// Both take any T (sampling runs the forward at T = 1, 2, 3, ...).

// Simple kernels. A block owns a tile of ATT_TILE = 32 rows (query rows in the
// forward and dq kernels, key rows in the dk/dv kernel) of one head; each of
// its 8 warps owns 4 of those rows. It walks the tiles of the other side one at
// a time through shared memory (float, rows padded to HD+1 against bank
// conflicts): lane j of a warp scores the tile's row j, and the products with
// the tile are summed with lane broadcasts. Shared memory is O(ATT_TILE * HD),
// whatever T is.

#define ATT_TILE 32
#define ATT_WARPS 8
#define ATT_RPW (ATT_TILE / ATT_WARPS)   // rows per warp
#define HD_MAX 256
#define ATT_DPL (HD_MAX / 32)            // head dims per lane, at most

// sh[r][d] = x[b, t0 + r, hh, d] as float (row stride HD+1), zero past T
template <typename Tin>
__device__ void att_load_tile(float *sh, const Tin *x, int b, int t0, int hh, int nh, int T, int HD) {
    for (int idx = threadIdx.x; idx < ATT_TILE * HD; idx += blockDim.x) {
        int r = idx / HD, d = idx % HD, t = t0 + r;
        sh[r * (HD + 1) + d] = t < T ? toF(x[(((size_t)b * T + t) * nh + hh) * HD + d]) : 0.0f;
    }
}

// grid (T/32, NH, B). out (B, T, NH, HD); lse (B, NH, T)
__global__ void attention_forward_kernel(floatX *out, float *lse, const floatX *q, const floatX *k, const floatX *v,
                                         int T, int NH, int NKV, int HD) {
    extern __shared__ float sh[];
    int ld = HD + 1;
    float *Qs = sh, *Ks = Qs + ATT_TILE * ld, *Vs = Ks + ATT_TILE * ld;
    int q0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float scale = 1.0f / sqrtf((float)HD);
    att_load_tile(Qs, q, b, q0, h, NH, T, HD);
    float o[ATT_RPW][ATT_DPL], mrow[ATT_RPW], lrow[ATT_RPW];
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        mrow[rr] = -INFINITY; lrow[rr] = 0.0f;
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) { o[rr][i] = 0.0f; }
    }
    int qlast = (q0 + ATT_TILE < T ? q0 + ATT_TILE : T) - 1;
    for (int k0 = 0; k0 <= qlast; k0 += ATT_TILE) {
        __syncthreads();   // the previous tile is consumed
        att_load_tile(Ks, k, b, k0, kvh, NKV, T, HD);
        att_load_tile(Vs, v, b, k0, kvh, NKV, T, HD);
        __syncthreads();
        #pragma unroll
        for (int rr = 0; rr < ATT_RPW; rr++) {
            int r = warp * ATT_RPW + rr, t = q0 + r;
            if (t >= T || k0 > t) { continue; }   // warp-uniform
            int t2 = k0 + lane;
            float s = -INFINITY;
            if (t2 <= t) {
                float dot = 0.0f;
                for (int d = 0; d < HD; d++) { dot += Qs[r * ld + d] * Ks[lane * ld + d]; }
                s = dot * scale;
            }
            // online softmax: rescale the running sum and output to the new max
            float mnew = fmaxf(mrow[rr], warp_max(s));
            float corr = expf(mrow[rr] - mnew);
            float p = t2 <= t ? expf(s - mnew) : 0.0f;
            lrow[rr] = lrow[rr] * corr + warp_sum(p);
            mrow[rr] = mnew;
            #pragma unroll
            for (int i = 0; i < ATT_DPL; i++) { o[rr][i] *= corr; }
            for (int j = 0; j < ATT_TILE; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
                #pragma unroll
                for (int i = 0; i < ATT_DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < HD) { o[rr][i] += pj * Vs[j * ld + d]; }
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        int t = q0 + warp * ATT_RPW + rr;
        if (t >= T) { continue; }
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < HD) { out[(((size_t)b * T + t) * NH + h) * HD + d] = fromF<floatX>(o[rr][i] / lrow[rr]); }
        }
        if (lane == 0) { lse[((size_t)b * NH + h) * T + t] = mrow[rr] + logf(lrow[rr]); }
    }
}

// Dt (B, NH, T) = dout . out per query row (= sum_t2 p dp); one warp per row
__global__ void attention_backward_prep_kernel(float *Dt, const floatX *dout, const floatX *out, int B, int T, int NH, int HD) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // (b, t, h)
    int lane = threadIdx.x % 32;
    if (row >= (size_t)B * T * NH) { return; }
    float s = 0.0f;
    for (int d = lane; d < HD; d += 32) { s += toF(dout[row * HD + d]) * toF(out[row * HD + d]); }
    s = warp_sum(s);
    int h = (int)(row % NH), t = (int)((row / NH) % T), b = (int)(row / NH / T);
    if (lane == 0) { Dt[((size_t)b * NH + h) * T + t] = s; }
}

// grid (T/32, NH, B): dq of a tile of query rows, walking the key tiles
__global__ void attention_backward_dq_kernel(float *dq, const floatX *dout, const float *lse, const float *Dt,
                                             const floatX *q, const floatX *k, const floatX *v, int T, int NH, int NKV, int HD) {
    extern __shared__ float sh[];
    int ld = HD + 1;
    float *Qs = sh, *dOs = Qs + ATT_TILE * ld, *Ks = dOs + ATT_TILE * ld, *Vs = Ks + ATT_TILE * ld;
    int q0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float scale = 1.0f / sqrtf((float)HD);
    att_load_tile(Qs, q, b, q0, h, NH, T, HD);
    att_load_tile(dOs, dout, b, q0, h, NH, T, HD);
    float acc[ATT_RPW][ATT_DPL];
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) { acc[rr][i] = 0.0f; }
    }
    int qlast = (q0 + ATT_TILE < T ? q0 + ATT_TILE : T) - 1;
    for (int k0 = 0; k0 <= qlast; k0 += ATT_TILE) {
        __syncthreads();
        att_load_tile(Ks, k, b, k0, kvh, NKV, T, HD);
        att_load_tile(Vs, v, b, k0, kvh, NKV, T, HD);
        __syncthreads();
        #pragma unroll
        for (int rr = 0; rr < ATT_RPW; rr++) {
            int r = warp * ATT_RPW + rr, t = q0 + r;
            if (t >= T || k0 > t) { continue; }
            int t2 = k0 + lane;
            float dsc = 0.0f;
            if (t2 <= t) {
                float dot = 0.0f, dp = 0.0f;
                for (int d = 0; d < HD; d++) {
                    dot += Qs[r * ld + d] * Ks[lane * ld + d];
                    dp += dOs[r * ld + d] * Vs[lane * ld + d];
                }
                // o = sum p v: dp = g . v;  p = softmax(score): dscore = p (dp - sum p dp); score = scale q . k
                float p = expf(dot * scale - lse[((size_t)b * NH + h) * T + t]);
                dsc = p * (dp - Dt[((size_t)b * NH + h) * T + t]) * scale;
            }
            for (int j = 0; j < ATT_TILE; j++) {
                float dj = __shfl_sync(0xffffffffu, dsc, j);
                #pragma unroll
                for (int i = 0; i < ATT_DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < HD) { acc[rr][i] += dj * Ks[j * ld + d]; }
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        int t = q0 + warp * ATT_RPW + rr;
        if (t >= T) { continue; }
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < HD) { dq[(((size_t)b * T + t) * NH + h) * HD + d] = acc[rr][i]; }
        }
    }
}

// grid (T/32, NKV, B): dk and dv of a tile of key rows of one kv head, walking
// every query head of its group and every query tile at or after the key tile.
// The block is the only writer of these rows: no atomics.
__global__ void attention_backward_dkdv_kernel(float *dk, floatX *dv, const floatX *dout, const float *lse, const float *Dt,
                                               const floatX *q, const floatX *k, const floatX *v, int T, int NH, int NKV, int HD) {
    extern __shared__ float sh[];
    int ld = HD + 1;
    float *Ks = sh, *Vs = Ks + ATT_TILE * ld, *Qs = Vs + ATT_TILE * ld, *dOs = Qs + ATT_TILE * ld;
    float *lse_s = dOs + ATT_TILE * ld, *D_s = lse_s + ATT_TILE;
    int k0 = blockIdx.x * ATT_TILE, kvh = blockIdx.y, b = blockIdx.z, group = NH / NKV;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float scale = 1.0f / sqrtf((float)HD);
    att_load_tile(Ks, k, b, k0, kvh, NKV, T, HD);
    att_load_tile(Vs, v, b, k0, kvh, NKV, T, HD);
    float dka[ATT_RPW][ATT_DPL], dva[ATT_RPW][ATT_DPL];
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) { dka[rr][i] = 0.0f; dva[rr][i] = 0.0f; }
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int q0 = k0; q0 < T; q0 += ATT_TILE) {
            __syncthreads();
            att_load_tile(Qs, q, b, q0, h, NH, T, HD);
            att_load_tile(dOs, dout, b, q0, h, NH, T, HD);
            if (threadIdx.x < ATT_TILE) {
                int t = q0 + threadIdx.x;
                lse_s[threadIdx.x] = t < T ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
                D_s[threadIdx.x] = t < T ? Dt[((size_t)b * NH + h) * T + t] : 0.0f;
            }
            __syncthreads();
            #pragma unroll
            for (int rr = 0; rr < ATT_RPW; rr++) {
                int r = warp * ATT_RPW + rr, t2 = k0 + r;
                if (t2 >= T) { continue; }
                int t = q0 + lane;   // this lane's query row
                float p = 0.0f, dsc = 0.0f;
                if (t < T && t >= t2) {
                    float dot = 0.0f, dp = 0.0f;
                    for (int d = 0; d < HD; d++) {
                        dot += Qs[lane * ld + d] * Ks[r * ld + d];
                        dp += dOs[lane * ld + d] * Vs[r * ld + d];
                    }
                    p = expf(dot * scale - lse_s[lane]);
                    dsc = p * (dp - D_s[lane]) * scale;
                }
                // dv[t2] += p[t, t2] g[t];  dk[t2] += dscore[t, t2] q[t]
                for (int j = 0; j < ATT_TILE; j++) {
                    float pj = __shfl_sync(0xffffffffu, p, j), dj = __shfl_sync(0xffffffffu, dsc, j);
                    #pragma unroll
                    for (int i = 0; i < ATT_DPL; i++) {
                        int d = lane + 32 * i;
                        if (d < HD) {
                            dva[rr][i] += pj * dOs[j * ld + d];
                            dka[rr][i] += dj * Qs[j * ld + d];
                        }
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        int t2 = k0 + warp * ATT_RPW + rr;
        if (t2 >= T) { continue; }
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < HD) {
                size_t off = (((size_t)b * T + t2) * NKV + kvh) * HD + d;
                dk[off] = dka[rr][i];
                dv[off] = fromF<floatX>(dva[rr][i]);
            }
        }
    }
}

// cp.async of 16 or 4 bytes global -> shared (asynchronous, completed by
// commit + wait groups; used by the flash attention kernels and the routing
// kernels' row ring). cp_async16_zfill copies 16 bytes when valid, else
// writes 16 zero bytes (reading nothing).
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, bool valid) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

#ifndef PRECISION_FP32
// ----------------------------------------------------------------------------
// Flash attention kernels (bf16 build), moved from the kernel lab
// dev/cuda/attention.cu; dev/cuda/NOTES_attention.md has their design, their
// validation against an fp64 reference and their H200 times. In use: the lab's
// v3 forward at HD = 64 (8 warps, 128 query rows per block) and v2's at HD = 128
// (4 warps: v3 is slower there), and v2's backward (4 warps) at both.
// FlashAttention-2 scheme on mma.sync m16n8k16 (bf16 in, fp32 accumulation),
// ldmatrix(.trans) from padded smem rows, cp.async double buffering, the
// online softmax in base 2. No atomics: each output element is written by one
// thread, so reruns are bit-identical.
//
// What changed on the way from the lab:
//  - any T (the lab needed T % 128 == 0): rows past T are zero-filled on load
//    and never stored, the backward gives them lse = +inf so that their p is 0,
//    tiles wholly past T are not visited, and lse and D move by 4-byte
//    cp.async (a row of (B, NH, T) is 16-byte aligned only when T % 4 == 0);
//  - dq and dk are written in fp32 straight from the accumulators
//    (attention_sublayer_backward says why).
//
// Fragment layouts of m16n8k16 (g = lane / 4, t = lane % 4):
//   A 16x16: reg0 = A[g][2t..2t+1], reg1 = A[g+8][2t..], reg2 = A[g][2t+8..], reg3 = A[g+8][2t+8..]
//   B 16x8 : reg0 = B[2t..2t+1][g], reg1 = B[2t+8..2t+9][g]
//   C 16x8 : c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
// so a lane's accumulator s[n][e] is row g + 8 (e >> 1), column 8 n + 2 t + (e & 1).
// Two adjacent C tiles of a 16x16 block, rounded to bf16 pairwise, are exactly
// its A fragment: P goes from the first matmul to the second in registers.
// Shared-memory tiles are row-major with rows padded by FA_PAD bf16 (16 bytes),
// so the 8 row addresses of each ldmatrix 8x8 matrix hit 8 different bank groups.

typedef __nv_bfloat16 bf16;
#define FA_PAD 8
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// PTX wrappers (cp.async: above, with the routing kernels' ring): ldmatrix of
// four 8x8 bf16 matrices (plain or transposed), and the m16n8k16 tensor-core product.

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
// c (16x8 fp32) += a (16x16 bf16) * b (16x8 bf16)
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
// the A fragment of the 16x16 block made of two C tiles c[0] (columns 0-7) and c[1] (8-15), as bf16
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float (*c)[4]) {
    a[0] = pack_bf16(c[0][0], c[0][1]); a[1] = pack_bf16(c[0][2], c[0][3]);
    a[2] = pack_bf16(c[1][0], c[1][1]); a[3] = pack_bf16(c[1][2], c[1][3]);
}

// Per-lane ldmatrix addresses into a row-major smem tile M with row stride ld:
//  a_addr:  A fragment of the 16x16 block at (r0, c0)         (M[m][k], plain)
//  bt_addr: B fragments of two n-tiles, B[k][n] = M[k][n]:  rows k0..k0+15, cols n0..n0+15 (use .trans)
//  bn_addr: B fragments of two n-tiles, B[k][n] = M[n][k]:  rows n0..n0+15, cols k0..k0+15 (plain)
//  (bt/bn: r[0..1] = n-tile n0, r[2..3] = n-tile n0+8)
__device__ __forceinline__ const bf16 *a_addr(const bf16 *M, int ld, int r0, int c0, int lane) {
    return M + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8;
}
__device__ __forceinline__ const bf16 *bt_addr(const bf16 *M, int ld, int k0, int n0, int lane) {
    return M + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
}
__device__ __forceinline__ const bf16 *bn_addr(const bf16 *M, int ld, int n0, int k0, int lane) {
    return M + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8;
}

// ROWS x HD bf16 from global g (row stride gstride) into the padded smem tile s,
// 16 bytes per cp.async; rows at or past nvalid (past the end of the sequence)
// are zero-filled instead, so that they only ever meet masks or zeros.
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, size_t gstride, int nvalid) {
    constexpr int CPR = HD / 8;
    static_assert(ROWS * CPR % NT == 0, "tile chunks must divide among the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CPR / NT; i++) {
        const int c = threadIdx.x + i * NT, r = c / CPR, cc = c % CPR;
        bf16 *dst = s + r * (HD + FA_PAD) + cc * 8;
        if (r < nvalid) { cp_async16(dst, g + r * gstride + cc * 8); }
        else { *(uint4 *)dst = make_uint4(0, 0, 0, 0); }
    }
}

// A warp's 16 rows of fp32 accumulators acc[HD/8][4] (C layout), times mul0
// (rows 0-7) and mul1 (rows 8-15), as bf16 into its 16 smem rows sO (stride
// HD+FA_PAD), then 16-byte coalesced stores to global rows g (row stride gstride);
// rows at or past nrows are not stored.
template <int HD>
__device__ __forceinline__ void store_rows(bf16 *g, size_t gstride, bf16 *sO, const float (*acc)[4],
                                           float mul0, float mul1, int nrows, int lane) {
    constexpr int LD = HD + FA_PAD;
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
        if (r < nrows) { *(uint4 *)(g + r * gstride + cc * 8) = *(const uint4 *)(sO + r * LD + cc * 8); }
    }
}

// The same rows times mul into fp32 global rows g, straight from the registers:
// each float2 store of a row's 4 lanes fills one 32-byte sector.
template <int HD>
__device__ __forceinline__ void store_rows_f32(float *g, size_t gstride, const float (*acc)[4], float mul, int nrows,
                                               int lane) {
    const int gr = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        if (gr < nrows) { *(float2 *)(g + gr * gstride + n * 8 + 2 * t4) = make_float2(acc[n][0] * mul, acc[n][1] * mul); }
        if (gr + 8 < nrows) {
            *(float2 *)(g + (gr + 8) * gstride + n * 8 + 2 * t4) = make_float2(acc[n][2] * mul, acc[n][3] * mul);
        }
    }
}

// Forward. grid (ceil(T/BR), NH, B), BR = 16 NWARPS query rows per block, the
// heavy (late) q tiles first; warp w owns rows q0+16w..+15, its Q tile in
// registers (A fragments). Loop over kv tiles of BC keys up to the block's last
// row, double-buffered: S = Q K^T (16 x BC per warp, fp32), causal mask on the
// tiles that cross the warp's diagonal, online softmax in base 2 (m = running
// max of s*scale*log2e, l = per-thread partial sums, reduced over a row's 4
// lanes at the end), P -> bf16 A fragments, O += P V (V via ldmatrix.trans).
// out (B, T, NH, HD) = O / l; lse (B, NH, T) = (m + log2 l) ln 2.
// sl2 = log2(e) / sqrt(HD). smem: (BR + 4 BC) (HD+8) bf16.
template <int HD, int NWARPS, int BC>
__global__ void __launch_bounds__(NWARPS * 32)
attention_forward_flash_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                               int T, int NH, int NKV, float sl2) {
    constexpr int BR = NWARPS * 16, LD = HD + FA_PAD, NT = NWARPS * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sQ = (bf16 *)smem_raw, *sK = sQ + BR * LD, *sV = sK + 2 * BC * LD;
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (NH / NKV), warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int q0 = qb * BR, r0 = q0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const bf16 *qg = q + ((size_t)b * T + q0) * qs + (size_t)h * HD;
    const bf16 *kg = k + (size_t)b * T * ks + (size_t)kvh * HD, *vg = v + (size_t)b * T * ks + (size_t)kvh * HD;
    const int nkv = (min(q0 + BR, T) - 1) / BC + 1;   // kv tiles up to the block's last row

    load_tile<BR, HD, NT>(sQ, qg, qs, T - q0);
    load_tile<BC, HD, NT>(sK, kg, ks, T);
    load_tile<BC, HD, NT>(sV, vg, ks, T);
    cp_async_commit();

    uint32_t qf[HD / 16][4];
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) { o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f; }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    for (int j = 0; j < nkv; j++) {
        if (j + 1 < nkv) {
            const int nb = (j + 1) & 1, kn = (j + 1) * BC;
            load_tile<BC, HD, NT>(sK + nb * BC * LD, kg + (size_t)kn * ks, ks, T - kn);
            load_tile<BC, HD, NT>(sV + nb * BC * LD, vg + (size_t)kn * ks, ks, T - kn);
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
        if (r0 < T && k0 <= r0 + 15) {   // warp-uniform: the warp has rows, and some see some key of the tile
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
            if (k0 + BC - 1 > r0) {   // the tile crosses the diagonal of this warp's rows (keys past T included)
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
                uint32_t a[4];
                c_to_a(a, s + 2 * kc);
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
    if (r0 >= T) { return; }   // warp-uniform; no barrier follows
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    if (t4 == 0) {
        float *lrow = lse + ((size_t)b * NH + h) * T + r0 + g;
        if (r0 + g < T) { lrow[0] = (m[0] + log2f(l[0])) * LN2; }
        if (r0 + g + 8 < T) { lrow[8] = (m[1] + log2f(l[1])) * LN2; }
    }
    // the warp's own rows of sQ are free (its Q fragments are in registers)
    store_rows<HD>(out + ((size_t)b * T + r0) * qs + (size_t)h * HD, qs, sQ + warp * 16 * LD, o, 1.f / l[0],
                   1.f / l[1], T - r0, lane);
}

// Dt (B, NH, T) = dout . out per query row, for the flash backward: HD/8
// consecutive lanes own one row (16-byte loads), rows in memory order (b, t, h).
template <int HD>
__global__ void attention_backward_prep_flash_kernel(float *Dt, const bf16 *dout, const bf16 *out, int B, int T, int NH) {
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
        Dt[((size_t)b * NH + h) * T + t] = sum;
    }
}

// Backward, pass 1: dk (fp32), dv (bf16), each (B, T, NKV, HD).
// grid (ceil(T/BK), NKV, B), BK = 16 NWARPS keys per block, launched in
// reverse key order as in the lab (the light late tiles first: flipping it is
// an untried tail-balance idea); warp w owns keys k0+16w..+15 of kv head kvh
// and accumulates their dK, dV (16 x HD each, fp32 registers) over every query
// head of the group and every q tile of BQ rows at or after the block's first
// key, double-buffered (Q, dO, lse, D). Per tile, in the transposed
// orientation (keys are the M dimension):
//   S^T = K Q^T, P^T = exp2(S^T scale log2e - lse log2e) (0 where q < key),
//   dP^T = V dO^T, dS^T = P^T (dP^T - D),
//   dV += P^T dO, dK += dS^T Q     (P^T, dS^T -> bf16 A fragments from registers).
// dK is scaled once at the end. KV_REGS keeps K, V A fragments in registers
// (HD=64); otherwise they are re-read from smem per tile (HD=128, register budget).
// smem: 2 BK + 4 BQ rows of (HD+8) bf16 + 4 BQ floats.
template <int HD, int NWARPS, int BQ, bool KV_REGS>
__global__ void __launch_bounds__(NWARPS * 32)
attention_backward_dkdv_flash_kernel(float *dk, bf16 *dv, const bf16 *q, const bf16 *k, const bf16 *v,
                                     const bf16 *dout, const float *lse, const float *Dt,
                                     int T, int NH, int NKV, float scale, float sl2) {
    constexpr int BK = NWARPS * 16, LD = HD + FA_PAD, NT = NWARPS * 32;
    static_assert(2 * BQ <= NT, "one thread per lse and per D entry of a q tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sK = (bf16 *)smem_raw, *sV = sK + BK * LD, *sQ = sV + BK * LD, *sdO = sQ + 2 * BQ * LD;
    float *sL = (float *)(sdO + 2 * BQ * LD), *sD = sL + 2 * BQ;
    const int kb = gridDim.x - 1 - blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int G = NH / NKV, k0 = kb * BK, kw0 = k0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const int i0 = k0 / BQ, nq = (T + BQ - 1) / BQ - i0, nit = G * nq;

    // issue the loads of iteration it (head kvh*G + it/nq, q tile i0 + it%nq) into buffer buf
    auto issue = [&](int it, int buf) {
        const int h = kvh * G + it / nq, qt0 = (i0 + it % nq) * BQ;
        const size_t go = ((size_t)b * T + qt0) * qs + (size_t)h * HD;
        load_tile<BQ, HD, NT>(sQ + buf * BQ * LD, q + go, qs, T - qt0);
        load_tile<BQ, HD, NT>(sdO + buf * BQ * LD, dout + go, qs, T - qt0);
        if (threadIdx.x < 2 * BQ) {   // threads [0, BQ) lse, [BQ, 2 BQ) D; past T: lse = +inf (p = 0), D = 0
            const int i = threadIdx.x % BQ, isL = threadIdx.x < BQ;
            float *dst = (isL ? sL : sD) + buf * BQ + i;
            if (qt0 + i < T) { cp_async4(dst, (isL ? lse : Dt) + ((size_t)b * NH + h) * T + qt0 + i); }
            else { *dst = isL ? INFINITY : 0.f; }
        }
    };
    const size_t kgo = ((size_t)b * T + k0) * ks + (size_t)kvh * HD;
    load_tile<BK, HD, NT>(sK, k + kgo, ks, T - k0);
    load_tile<BK, HD, NT>(sV, v + kgo, ks, T - k0);
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
        if (kw0 < T && qt0 + BQ - 1 >= kw0) {   // warp-uniform: the warp has keys, some seen by some query of the tile
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
                uint32_t ap[4], ad[4];
                c_to_a(ap, s + 2 * kc);
                c_to_a(ad, dp + 2 * kc);
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
    if (kw0 >= T) { return; }   // warp-uniform; no barrier follows
    store_rows_f32<HD>(dk + kgo + (size_t)warp * 16 * ks, ks, dka, scale, T - kw0, lane);
    // each warp only ever read its own 16 rows of sV: stage dV there
    store_rows<HD>(dv + kgo + (size_t)warp * 16 * ks, ks, sV + warp * 16 * LD, dva, 1.f, 1.f, T - kw0, lane);
}

// Backward, pass 2: dq (B, T, NH, HD) fp32.
// grid (ceil(T/BR), NH, B), BR = 16 NWARPS query rows per block, warp w owns
// rows q0+16w..+15; its Q and dO tiles in registers (A fragments). Loop over kv
// tiles of BC keys up to the block's last row, double-buffered:
//   S = Q K^T, P = exp2(S scale log2e - lse log2e) (0 above the diagonal),
//   dP = dO V^T (V as B via plain ldmatrix), dS = P (dP - D), dQ += dS K (K via .trans).
// dQ scaled once at the end. smem: (2 BR + 4 BC) (HD+8) bf16.
template <int HD, int NWARPS, int BC>
__global__ void __launch_bounds__(NWARPS * 32)
attention_backward_dq_flash_kernel(float *dq, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                                   const float *lse, const float *Dt, int T, int NH, int NKV, float scale,
                                   float sl2) {
    constexpr int BR = NWARPS * 16, LD = HD + FA_PAD, NT = NWARPS * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sQ = (bf16 *)smem_raw, *sdO = sQ + BR * LD, *sK = sdO + BR * LD, *sV = sK + 2 * BC * LD;
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (NH / NKV), warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int q0 = qb * BR, r0 = q0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const size_t qgo = ((size_t)b * T + q0) * qs + (size_t)h * HD;
    const bf16 *kg = k + (size_t)b * T * ks + (size_t)kvh * HD, *vg = v + (size_t)b * T * ks + (size_t)kvh * HD;
    const int nkv = (min(q0 + BR, T) - 1) / BC + 1;   // kv tiles up to the block's last row

    load_tile<BR, HD, NT>(sQ, q + qgo, qs, T - q0);
    load_tile<BR, HD, NT>(sdO, dout + qgo, qs, T - q0);
    load_tile<BC, HD, NT>(sK, kg, ks, T);
    load_tile<BC, HD, NT>(sV, vg, ks, T);
    cp_async_commit();

    // this lane's two rows r0+g, r0+g+8; past T: lse = +inf (p = 0), D = 0
    const size_t lo = ((size_t)b * NH + h) * T;
    const int ra = r0 + g, rb = ra + 8;
    const float L2[2] = {ra < T ? lse[lo + ra] * LOG2E : INFINITY, rb < T ? lse[lo + rb] * LOG2E : INFINITY};
    const float Dv[2] = {ra < T ? Dt[lo + ra] : 0.f, rb < T ? Dt[lo + rb] : 0.f};

    uint32_t qf[HD / 16][4], df[HD / 16][4];
    float dqa[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) { dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.f; }

    for (int j = 0; j < nkv; j++) {
        if (j + 1 < nkv) {
            const int nb = (j + 1) & 1, kn = (j + 1) * BC;
            load_tile<BC, HD, NT>(sK + nb * BC * LD, kg + (size_t)kn * ks, ks, T - kn);
            load_tile<BC, HD, NT>(sV + nb * BC * LD, vg + (size_t)kn * ks, ks, T - kn);
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
        if (r0 < T && k0 <= r0 + 15) {   // warp-uniform
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
                uint32_t a[4];
                c_to_a(a, s + 2 * kc);
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
    if (r0 < T) { store_rows_f32<HD>(dq + qgo + (size_t)warp * 16 * qs, qs, dqa, scale, T - r0, lane); }
}

// Launchers of the flash kernels at head dim HD, in the lab's fastest
// configuration at each (NOTES_attention.md): forward blocks of FWD_WARPS warps
// (v3's 8 at HD=64, v2's 4 at HD=128), backward blocks of 4 warps (v2); kv tiles
// of BC keys (forward, dq); q tiles of BQ rows in the dk/dv pass, which keeps
// its K/V fragments in registers at HD=64 only (register budget).
template <int HD> struct Flash {
    static constexpr int FWD_WARPS = HD == 64 ? 8 : 4, BWD_WARPS = 4, BC = 64, BQ = HD == 64 ? 64 : 32;
    static constexpr bool KV_REGS = HD == 64;
    static constexpr size_t ROW = (HD + FA_PAD) * sizeof(bf16);   // bytes of a padded smem row
    static constexpr size_t fwd_smem = (FWD_WARPS * 16 + 4 * BC) * ROW;
    static constexpr size_t dq_smem = (2 * BWD_WARPS * 16 + 4 * BC) * ROW;
    static constexpr size_t dkdv_smem = (2 * BWD_WARPS * 16 + 4 * BQ) * ROW + 4 * BQ * sizeof(float);
    static constexpr size_t max_smem = fwd_smem > dq_smem ? (fwd_smem > dkdv_smem ? fwd_smem : dkdv_smem)
                                                          : (dq_smem > dkdv_smem ? dq_smem : dkdv_smem);

    // allow each kernel its dynamic shared memory (over the default 48 KB)
    static void setup() {
        cudaCheck(cudaFuncSetAttribute(attention_forward_flash_kernel<HD, FWD_WARPS, BC>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem));
        cudaCheck(cudaFuncSetAttribute(attention_backward_dkdv_flash_kernel<HD, BWD_WARPS, BQ, KV_REGS>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkdv_smem));
        cudaCheck(cudaFuncSetAttribute(attention_backward_dq_flash_kernel<HD, BWD_WARPS, BC>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem));
    }
    // attention_forward's contract: out (B, T, NH, HD), lse (B, NH, T)
    static void forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV) {
        dim3 grid(ceil_div(T, FWD_WARPS * 16), NH, B);
        attention_forward_flash_kernel<HD, FWD_WARPS, BC><<<grid, FWD_WARPS * 32, fwd_smem>>>(
            out, lse, q, k, v, T, NH, NKV, LOG2E / sqrtf((float)HD));
        launchCheck();
    }
    // attention_backward's contract: prep (Dt), then the dk/dv pass and the dq pass
    static void backward(float *dq, float *dk, bf16 *dv, float *Dt, const bf16 *dout, const bf16 *out, const float *lse,
                         const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV) {
        const float scale = 1.0f / sqrtf((float)HD), sl2 = scale * LOG2E;
        attention_backward_prep_flash_kernel<HD><<<ceil_div((size_t)B * T * NH * (HD / 8), 256), 256>>>(Dt, dout, out, B, T, NH);
        launchCheck();
        attention_backward_dkdv_flash_kernel<HD, BWD_WARPS, BQ, KV_REGS><<<dim3(ceil_div(T, BWD_WARPS * 16), NKV, B),
                                                                           BWD_WARPS * 32, dkdv_smem>>>(
            dk, dv, q, k, v, dout, lse, Dt, T, NH, NKV, scale, sl2);
        launchCheck();
        attention_backward_dq_flash_kernel<HD, BWD_WARPS, BC><<<dim3(ceil_div(T, BWD_WARPS * 16), NH, B),
                                                                BWD_WARPS * 32, dq_smem>>>(
            dq, q, k, v, dout, lse, Dt, T, NH, NKV, scale, sl2);
        launchCheck();
    }
};

int att_smem_optin = 0;   // the device's opt-in shared memory per block (bytes), read by attention_setup
#endif  // !PRECISION_FP32

// The dispatch rule: the flash kernels in the bf16 build at HD = 64 or 128 when
// the device gives a block their shared memory (at most 104 KB, HD = 128: any
// sm_80 or sm_90 part); the simple kernels otherwise.
bool attention_use_flash(int HD) {
#ifdef PRECISION_FP32
    (void)HD;
    return false;
#else
    if (HD == 64) { return att_smem_optin >= (int)Flash<64>::max_smem; }
    if (HD == 128) { return att_smem_optin >= (int)Flash<128>::max_smem; }
    return false;
#endif
}

// out (B, T, NH, HD); lse (B, NH, T) keeps each row's log-sum-exp of the scaled
// scores; q (B, T, NH, HD); k, v (B, T, NKV, HD)
void attention_forward(floatX *out, float *lse, const floatX *q, const floatX *k, const floatX *v,
                       int B, int T, int NH, int NKV, int HD) {
#ifndef PRECISION_FP32
    if (attention_use_flash(HD)) {
        if (HD == 64) { Flash<64>::forward(out, lse, q, k, v, B, T, NH, NKV); }
        else { Flash<128>::forward(out, lse, q, k, v, B, T, NH, NKV); }
        return;
    }
#endif
    size_t shmem = 3 * ATT_TILE * (HD + 1) * sizeof(float);
    attention_forward_kernel<<<dim3(ceil_div(T, ATT_TILE), NH, B), ATT_WARPS * 32, shmem>>>(out, lse, q, k, v, T, NH, NKV, HD);
    launchCheck();
}

// Writes (does not add) dq (B, T, NH, HD), dk (B, T, NKV, HD) in fp32 and dv in
// floatX (the input of a matmul backward), given dout (B, T, NH, HD) in floatX,
// the forward output out and its lse. Dt (B, NH, T) is scratch.
void attention_backward(float *dq, float *dk, floatX *dv, float *Dt, const floatX *dout, const floatX *out, const float *lse,
                        const floatX *q, const floatX *k, const floatX *v, int B, int T, int NH, int NKV, int HD) {
#ifndef PRECISION_FP32
    if (attention_use_flash(HD)) {
        if (HD == 64) { Flash<64>::backward(dq, dk, dv, Dt, dout, out, lse, q, k, v, B, T, NH, NKV); }
        else { Flash<128>::backward(dq, dk, dv, Dt, dout, out, lse, q, k, v, B, T, NH, NKV); }
        return;
    }
#endif
    attention_backward_prep_kernel<<<ceil_div((size_t)B * T * NH, 8), 256>>>(Dt, dout, out, B, T, NH, HD);
    launchCheck();
    size_t shmem = 4 * ATT_TILE * (HD + 1) * sizeof(float);
    attention_backward_dq_kernel<<<dim3(ceil_div(T, ATT_TILE), NH, B), ATT_WARPS * 32, shmem>>>(
        dq, dout, lse, Dt, q, k, v, T, NH, NKV, HD);
    launchCheck();
    attention_backward_dkdv_kernel<<<dim3(ceil_div(T, ATT_TILE), NKV, B), ATT_WARPS * 32, shmem + 2 * ATT_TILE * sizeof(float)>>>(
        dk, dv, dout, lse, Dt, q, k, v, T, NH, NKV, HD);
    launchCheck();
}

// Once per model: the simple kernels take up to (4 * 32 * 257 + 64) * 4 bytes
// = 132 KB of shared memory at HD = 256, and the flash kernels up to 104 KB:
// allow more than the default 48 KB.
void attention_setup(int HD) {
    if (HD > HD_MAX) { die("head dim C/NH=%d is over the CUDA trainer's %d; use more heads (-NH)", HD, HD_MAX); }
    int bytes = (4 * ATT_TILE * (HD + 1) + 2 * ATT_TILE) * (int)sizeof(float);
    cudaCheck(cudaFuncSetAttribute(attention_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    cudaCheck(cudaFuncSetAttribute(attention_backward_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    cudaCheck(cudaFuncSetAttribute(attention_backward_dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
#ifndef PRECISION_FP32
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&att_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (attention_use_flash(HD)) {
        if (HD == 64) { Flash<64>::setup(); }
        else { Flash<128>::setup(); }
    }
#endif
}

// ----------------------------------------------------------------------------
// SwiGLU: out = silu(g) * u, silu(z) = z * sigmoid(z). All tensors (N*F).

// Thread k handles the 16-byte pack k of each tensor (8 bf16 or 4 fp32 values:
// PACK, defined before QK-norm), so a warp reads whole cache lines. When n
// or a pointer does not allow packs, the same kernels run one element a thread.

__device__ inline float silu_sig(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void swiglu_forward_kernel(floatX *out, const floatX *g, const floatX *u, size_t n, int vec) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * vec;
    if (i0 >= n) { return; }
    if (vec == 1) {
        float gi = toF(g[i0]);
        out[i0] = fromF<floatX>(gi * silu_sig(gi) * toF(u[i0]));
        return;
    }
    Pack gp = *(const Pack *)(g + i0), up = *(const Pack *)(u + i0), op;
    for (int e = 0; e < PACK; e++) {
        float gi = toF(gp.v[e]);
        op.v[e] = fromF<floatX>(gi * silu_sig(gi) * toF(up.v[e]));
    }
    *(Pack *)(out + i0) = op;
}

// 1 if n and every pointer allow 16-byte packs, else 0
int packs_fit(size_t n, const void *a, const void *b, const void *c, const void *d) {
    uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d;
    return n % PACK == 0 && bits % 16 == 0;
}

void swiglu_forward(floatX *out, const floatX *g, const floatX *u, size_t n) {
    int vec = packs_fit(n, out, g, u, NULL) ? PACK : 1;
    swiglu_forward_kernel<<<ceil_div(n, 256 * (size_t)vec), 256>>>(out, g, u, n, vec);
    launchCheck();
}

__global__ void swiglu_backward_kernel(floatX *dg, floatX *du, const floatX *dout, const floatX *g, const floatX *u,
                                       size_t n, int vec) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * vec;
    if (i0 >= n) { return; }
    // out = g sig(g) u;  d(g sig(g))/dg = sig (1 + g (1 - sig))
    if (vec == 1) {
        float gi = toF(g[i0]), ui = toF(u[i0]), sig = silu_sig(gi);
        float d = toF(dout[i0]);
        dg[i0] = fromF<floatX>(d * ui * sig * (1.0f + gi * (1.0f - sig)));
        du[i0] = fromF<floatX>(d * gi * sig);
        return;
    }
    Pack gp = *(const Pack *)(g + i0), up = *(const Pack *)(u + i0), dp = *(const Pack *)(dout + i0), dgp, dup;
    for (int e = 0; e < PACK; e++) {
        float gi = toF(gp.v[e]), ui = toF(up.v[e]), d = toF(dp.v[e]), sig = silu_sig(gi);
        dgp.v[e] = fromF<floatX>(d * ui * sig * (1.0f + gi * (1.0f - sig)));
        dup.v[e] = fromF<floatX>(d * gi * sig);
    }
    *(Pack *)(dg + i0) = dgp;
    *(Pack *)(du + i0) = dup;
}

// Writes (does not add) dg, du in floatX: they feed matmul backwards. dout is
// floatX too: the down matmul's backward sums in fp32 and rounds once, as for
// attention's datty (an fp32 dout cost 2x its bytes in the matmul and here).
void swiglu_backward(floatX *dg, floatX *du, const floatX *dout, const floatX *g, const floatX *u, size_t n) {
    int vec = packs_fit(n, dg, du, g, u) && (uintptr_t)dout % 16 == 0 ? PACK : 1;
    swiglu_backward_kernel<<<ceil_div(n, 256 * (size_t)vec), 256>>>(dg, du, dout, g, u, n, vec);
    launchCheck();
}

// ----------------------------------------------------------------------------
// Slots (config.h explains them): slot j+1 = out_j, the output of sublayer j,
// plus slot j when slot_chains(j). A slot that does not chain is written by
// the sublayer's last matmul itself (model_forward). A chained slot is written
// by residual_norm_forward, which computes in the same pass what the next step
// needs: in std mode the next site's pre-norm u_{j+1} and its rstd, in block
// mode the source statistic r of the new slot. The backward of the add is the
// pass-through of the slot gradient in model_backward.

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

// y (N, C) = x + out, the next slot, and the statistic of y in the same pass:
// with w, u (N, C) = rmsnorm(y; w) and stat = its rstd (std: the residual add
// fused with the next site's pre-norm); with u = w = NULL, stat = r, the source
// statistic of the new slot (the chained slots of block mode); with x = y = NULL
// too, r of the source out alone (source_stat_forward).
void residual_norm_forward(floatX *y, floatX *u, float *stat, const floatX *x, const floatX *out, const floatX *w,
                           size_t N, int C) {
    row_dispatch(C, aligned16(y) && aligned16(u) && aligned16(x) && aligned16(out), [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NP = decltype(lanes)::np;
        residual_norm_forward_kernel<VEC, NP><<<ceil_div(N, 8), 256>>>(y, u, stat, x, out, w, N, C);
    });
    launchCheck();
}

// ----------------------------------------------------------------------------
// MHAR routing (SPEC section 4). A routing site reads n sources v_i (slots of
// the slot buffer, listed in src, a device array), and per position and
// routing head h mixes them with a softmax over depth:
//   k_i    = gamma * r_i * v_i,      r_i = 1 / sqrt(|v_i|^2 / C + 1e-6)
//   s[h,i] = sum_{c in head h} q[c] k_i[c] = r_i * sum_{c in h} qg[c] v_i[c],  qg = q * gamma
//   a[h,:] = softmax_i s[h,:]
//   out[c] = sum_i a[h(c), i] v_i[c]
// Head h owns channels [h*C/H, (h+1)*C/H). H = 1 is AttnRes.
//
// The fused kernels come from the lab dev/cuda/route.cu (its v2 forward and
// v3 backward, with v5's and v8's changes; NOTES_route.md has the byte counts
// and the measurements):
// - route_forward, per site: ONE pass over the sources with an online softmax
//   per head, and the RMSNorm that follows the site in the same kernel. It
//   keeps h_j (for the norm backward) and lse_j (N, H), the log-sum-exp of each
//   head's scores; the weights a = exp(s - lse) are recomputed in backward.
// - route_site_backward, per site j: the norm backward only. It stores
//   G_j = dL/dh_j (floatX) and S_j[h] = G_j[h] . h_j[h] (= sum_i a p).
// - route_slot_backward, per slot k: the sites that read slot k are all >= k,
//   so once site k has stored its G, one kernel gathers the contributions of
//   every reader and writes the fp32 gradient of slot k once (no fp32
//   read-modify-write per (site, source) pair). Its dq/dgamma share goes into
//   a per-(site, source) sum qv, and route_param_backward adds those up per
//   site, in source order, at the end of the backward pass.
//
// Lane layout of the fused kernels: one warp per position. A vector of C
// channels is cut into NCH chunks of 32*VEC channels; lane l holds channels
// ch*32*VEC + l*VEC .. +VEC of chunk ch (VEC = 8: one 16-byte load in bf16),
// and lanes past C hold zeros. A routing head is a group of `seg` consecutive
// lanes inside a chunk (seg a power of two), or `cph` whole chunks: its sums
// are a butterfly over seg lanes, then a sum over its chunks. route_geometry
// picks the layout: VEC = 8, or VEC = 1 for heads that 8 does not divide.

// Lane layout for width C and H routing heads (chosen once, in model_build).
// grp[ch]: bit c2 set when chunk c2 holds the same heads as chunk ch.
typedef struct { int C, H, vec, nch, seg, cph; unsigned grp[32]; } RouteGeo;

// The layout for width C and H heads: VEC = 8 if it divides C/H and the heads
// fit the chunks of 256 channels, else VEC = 1 (chunks of 32); NCH = the
// chunks needed, rounded up to a compiled count. Dies when neither fits.
RouteGeo route_geometry(int C, int H) {
    const int vecs[2] = {8, 1}, max_nch[2] = {8, 32};   // the compiled layouts (route_dispatch)
    int HC = C / H;
    for (int k = 0; k < 2; k++) {
        int vec = vecs[k], W = 32 * vec, nch = 1, seg, cph;
        if (HC % vec != 0) { continue; }
        while (nch * W < C) { nch *= 2; }
        if (nch > max_nch[k]) { continue; }
        if (H == 1) { seg = 32; cph = nch; }                 // one head: every lane of every chunk
        else if (W % HC == 0) { seg = HC / vec; cph = 1; }   // several heads per chunk
        else if (HC % W == 0) { seg = 32; cph = HC / W; }    // heads of whole chunks
        else { continue; }
        RouteGeo g;
        memset(&g, 0, sizeof(g));
        g.C = C; g.H = H; g.vec = vec; g.nch = nch; g.seg = seg; g.cph = cph;
        for (int ch = 0; ch < nch; ch++) {
            for (int c2 = 0; c2 < nch; c2++) { if (c2 / cph == ch / cph) { g.grp[ch] |= 1u << c2; } }
        }
        return g;
    }
    die("C=%d with H=%d routing heads (C/H=%d): the CUDA routing kernels need C <= 2048 and C/H a power of two "
        "or a multiple of 256, or else C/H a multiple of 32 and C <= 1024 (H = 1 takes any C up to 1024)", C, H, HC);
    return RouteGeo();
}

// A compiled layout: VEC channels per lane in each of NCH chunks, and SEG lanes
// per routing head (0: read geo.seg at run time). A compile-time SEG turns the
// head sums into unrolled butterflies and the head index of a lane into shifts:
// the gather was bound by instruction issue (ncu: 0.74 issued warps per
// scheduler at 26% of DRAM bandwidth) with SEG, HC and the head index computed
// at run time inside its loop over readers.
template <int VEC, int NCH, int SEG> struct RouteLanes { static constexpr int vec = VEC, nch = NCH, seg = SEG; };

// Calls f(RouteLanes<VEC, NCH, SEG>()) for the layout of g: the compiled
// instances of the fused kernels (VEC = 8 with its SEG, VEC = 1 generic).
template <int NCH, typename F> void route_dispatch_seg(const RouteGeo &g, F f) {
    switch (g.seg) {
    case 1: f(RouteLanes<8, NCH, 1>()); break;
    case 2: f(RouteLanes<8, NCH, 2>()); break;
    case 4: f(RouteLanes<8, NCH, 4>()); break;
    case 8: f(RouteLanes<8, NCH, 8>()); break;
    case 16: f(RouteLanes<8, NCH, 16>()); break;
    case 32: f(RouteLanes<8, NCH, 32>()); break;
    default: die("internal: no routing kernels for VEC=8 NCH=%d SEG=%d", NCH, g.seg);
    }
}
template <typename F> void route_dispatch(const RouteGeo &g, F f) {
    switch (g.vec * 100 + g.nch) {
    case 801: route_dispatch_seg<1>(g, f); break;
    case 802: route_dispatch_seg<2>(g, f); break;
    case 804: route_dispatch_seg<4>(g, f); break;
    case 808: route_dispatch_seg<8>(g, f); break;
    case 101: f(RouteLanes<1, 1, 0>()); break;
    case 102: f(RouteLanes<1, 2, 0>()); break;
    case 104: f(RouteLanes<1, 4, 0>()); break;
    case 108: f(RouteLanes<1, 8, 0>()); break;
    case 116: f(RouteLanes<1, 16, 0>()); break;
    case 132: f(RouteLanes<1, 32, 0>()); break;
    default: die("internal: no routing kernels for VEC=%d NCH=%d", g.vec, g.nch);
    }
}

// Blocks per SM the fused kernels are compiled for: the lab's register budget
// (3 x 256 threads) for bf16 at up to 16 channels per lane (C <= 512)
#define ROUTE_MIN_BLOCKS(VEC, NCH) ((sizeof(floatX) == 2 && (VEC) * (NCH) <= 16 && (NCH) <= 8) ? 3 : 1)
#define ROUTE_POS_PER_BLOCK 32   // positions per block of route_site_backward (8 warps x 4)
#define ROUTE_PART_ROWS 128      // positions per partition of route_slot_param_kernel

// VEC floatX values, loaded and stored as one piece (16 bytes for 8 bf16,
// two 16-byte pieces for 8 floats); PackedF the same for fp32 buffers.
template <int VEC> struct alignas(VEC * sizeof(floatX) < 16 ? VEC * sizeof(floatX) : 16) Packed { floatX x[VEC]; };
template <int VEC> struct alignas(VEC * 4 < 16 ? VEC * 4 : 16) PackedF { float x[VEC]; };

// this lane's VEC values at channel c0 of a row (zeros when c0 >= C)
// (a 16-byte pack goes through an int4: zeroing it element by element cost ~30
// byte-permute instructions per load in the fused kernels' loops)
template <int VEC> __device__ __forceinline__ Packed<VEC> ld_lane(const floatX *row, int c0, int C) {
    Packed<VEC> z;
    if constexpr (sizeof(Packed<VEC>) == 16) {
        int4 w = make_int4(0, 0, 0, 0);
        if (c0 < C) { w = *reinterpret_cast<const int4 *>(row + c0); }
        memcpy(&z, &w, 16);
    } else if (c0 < C) {
        z = *reinterpret_cast<const Packed<VEC> *>(row + c0);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) { z.x[k] = fromF<floatX>(0.0f); }
    }
    return z;
}
// bf16 -> fp32 is exact: a bf16 is the top half of an fp32. Two per 32-bit word
// with one shift or mask each (the generic conversion used two instructions for
// the high half).
template <int VEC> __device__ __forceinline__ void unpack(const Packed<VEC> &p, float (&x)[VEC]) {
    if constexpr (sizeof(floatX) == 2 && VEC % 2 == 0) {
        uint32_t w[VEC / 2];
        memcpy(w, &p, sizeof(w));
#pragma unroll
        for (int k = 0; k < VEC / 2; k++) {
            x[2 * k] = __uint_as_float(w[k] << 16);
            x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) { x[k] = toF(p.x[k]); }
    }
}
template <int VEC> __device__ __forceinline__ void st_lane(floatX *p, const float (&x)[VEC]) {
    Packed<VEC> v;
#pragma unroll
    for (int k = 0; k < VEC; k++) { v.x[k] = fromF<floatX>(x[k]); }
    *reinterpret_cast<Packed<VEC> *>(p) = v;
}
// as ld_lane, but lanes past C read channel 0 of the row: finite values, not
// zeros. Only for values whose every use in a sum is multiplied by a zeroed
// operand; it lets the compiler reload the value instead of spilling it.
template <int VEC> __device__ __forceinline__ Packed<VEC> ld_lane_clamped(const floatX *row, int c0, int C) {
    return *reinterpret_cast<const Packed<VEC> *>(row + (c0 < C ? c0 : 0));
}
// this lane's VEC values at channel c0 of a parameter vector p (C), as float
// (zeros when c0 >= C): scalar loads, since the parameter tensors inside the
// one parameter allocation are not 16-byte aligned in general
template <int VEC> __device__ __forceinline__ void ld_param(float (&x)[VEC], const floatX *p, int c0, int C) {
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        if (c0 < C) { x[k] = toF(p[c0 + k]); }
        else { x[k] = 0.0f; }
    }
}
// fp32: x = p[c0 .. c0+VEC) (zeros when c0 >= C); and the store
template <int VEC> __device__ __forceinline__ void ld_f(float (&x)[VEC], const float *p, int c0, int C) {
    if (c0 < C) {
        PackedF<VEC> v = *reinterpret_cast<const PackedF<VEC> *>(p + c0);
#pragma unroll
        for (int k = 0; k < VEC; k++) { x[k] = v.x[k]; }
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) { x[k] = 0.0f; }
    }
}
template <int VEC> __device__ __forceinline__ void st_f(float *p, const float (&x)[VEC]) {
    PackedF<VEC> v;
#pragma unroll
    for (int k = 0; k < VEC; k++) { v.x[k] = x[k]; }
    *reinterpret_cast<PackedF<VEC> *>(p) = v;
}

// The row ring. The fused kernels stream rows (a site's sources in forward, the
// G rows of a slot's readers in the gather), one warp per position. Loaded one
// row ahead into registers, a warp has one row in flight while it computes on
// the previous one, and ncu showed those kernels at 26-46% of DRAM bandwidth.
// With a bf16 lane pack of 16 bytes (VEC = 8) they instead copy rows
// ROUTE_RING - 1 ahead into shared memory with cp.async (no registers held).
// Each lane reads back only the bytes it copied itself, so a lane's own wait
// suffices for the rows; values copied by one lane for all (the forward's r of
// a source) need a __syncwarp after the wait. Shared memory per block of 8
// warps: packs [8][ROUTE_RING][NCH][32], then floats [8][ROUTE_RING].
// An empty asm that "modifies" its words: what is computed from them after it
// stays after it, so the compiler neither hoists the unpack of a packed value
// out of a loop (and holds or spills the floats) nor reuses an earlier unpack.
template <typename T> __device__ __forceinline__ void opaque_words(T &x) {
    static_assert(sizeof(T) % 4 == 0, "whole 32-bit words");
    uint32_t w[sizeof(T) / 4];
    memcpy(w, &x, sizeof(T));
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) / 4); k++) { asm volatile("" : "+r"(w[k])); }
    memcpy(&x, w, sizeof(T));
}
#define ROUTE_RING 4   // a power of two
#define ROUTE_LOG2E 1.4426950408889634f   // log2(e): the gather's exp(x) = exp2f(x log2 e)
template <int VEC> __host__ __device__ constexpr bool route_ring() { return sizeof(Packed<VEC>) == 16; }
template <int VEC, int NCH> __host__ __device__ constexpr size_t route_ring_smem() {
    return route_ring<VEC>() ? 8 * ROUTE_RING * ((size_t)NCH * 32 * 16 + sizeof(float)) : 0;
}
// this warp's stages of packs and its floats
template <int VEC, int NCH> __device__ __forceinline__ Packed<VEC> *ring_packs(unsigned char *smem) {
    return reinterpret_cast<Packed<VEC> *>(smem) + (size_t)(threadIdx.x / 32) * ROUTE_RING * NCH * 32;
}
template <int VEC, int NCH> __device__ __forceinline__ float *ring_floats(unsigned char *smem) {
    return reinterpret_cast<float *>(smem + (size_t)8 * ROUTE_RING * NCH * 32 * sizeof(Packed<VEC>)) +
           (threadIdx.x / 32) * ROUTE_RING;
}
// cp.async of this lane's packs of a row into ring stage st (zeros past C);
// the caller commits the group
template <int VEC, int NCH>
__device__ __forceinline__ void ring_fill(Packed<VEC> *ring, int st, const floatX *row, int lane, int C) {
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 32 * VEC + lane * VEC;
        cp_async16_zfill(ring + (st * NCH + ch) * 32 + lane, row + (c0 < C ? c0 : 0), c0 < C);
    }
}
// The routing forward's issue of source i of n (slots src[i], position t) into ring
// stage i % ROUTE_RING, its r copied by lane 0 into ring_r; one commit group per
// source (an empty one past n, so that the waits count the same)
template <int VEC, int NCH>
__device__ __forceinline__ void ring_issue_source(Packed<VEC> *ring, float *ring_r, const floatX *slots, const float *r,
                                                  const int *src, int i, int n, size_t N, int t, int lane, int C) {
    if (i < n) {
        const size_t row = (size_t)src[i] * N + t;
        ring_fill<VEC, NCH>(ring, i & (ROUTE_RING - 1), slots + row * C, lane, C);
        if (lane == 0) { cp_async4(ring_r + (i & (ROUTE_RING - 1)), r + row); }
    }
    cp_async_commit();
}
// cp.async of 16 bytes from gmem to the shared address s, of which src_size
// are read (0: none; the rest is zero-filled); the caller commits the group
__device__ __forceinline__ void cp_async16z(uint32_t s, const void *gmem, uint32_t src_size) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size) : "memory");
}
// The lean gather's 32-bit element indices (lab v12's scheme), shared with the
// host check route_gather_index_check. Per lane, once: its first channel in row t
// of a (., N, C) array (the row's start when the lane is past C in every chunk,
// so that zero-byte copies read a valid address), chunk ch's offset from it
// (0 where the lane is past C: a zero-byte copy), an lse/S entry of row t (the
// kernel takes row t's first, glean_ls(t, 0, H), and adds the head), and dsr's entry
// (t, hd, 0). Per reader j:
// + j N C (G), + j N H (lse, S), + j C (qg, from the lane's first channel).
__host__ __device__ __forceinline__ bool glean_live(int ch, int lane, int C, int VEC) { return ch * 32 * VEC + lane * VEC < C; }
__host__ __device__ __forceinline__ unsigned glean_row(unsigned t, int lane, int C, int VEC) {
    return t * (unsigned)C + (lane * VEC < C ? (unsigned)(lane * VEC) : 0u);
}
__host__ __device__ __forceinline__ unsigned glean_chunk(int ch, int lane, int C, int VEC) {
    return glean_live(ch, lane, C, VEC) ? (unsigned)(ch * 32 * VEC) : 0u;
}
__host__ __device__ __forceinline__ unsigned glean_ls(unsigned t, int lane, int H) { return t * (unsigned)H + (lane < H ? (unsigned)lane : 0u); }
__host__ __device__ __forceinline__ unsigned glean_dsr(unsigned t, int hd, int H, int nrp) { return (t * (unsigned)H + (unsigned)hd) * (unsigned)nrp; }
// dsr's entry of reader jj for chunk ch's head hdc, from the lane's base of chunk 0's head hd0 (glean_dsr)
__host__ __device__ __forceinline__ unsigned glean_dsr_at(unsigned base0, int hdc, int hd0, int nrp, int jj) {
    return base0 + (unsigned)((hdc - hd0) * nrp + jj);
}
__host__ __device__ __forceinline__ unsigned glean_add(unsigned base, unsigned j, unsigned stride) { return j * stride + base; }
// the ring stage of reader i, and the lane holding its site (i >= nr: a zero-byte copy from that lane's site)
__host__ __device__ __forceinline__ int glean_stage(int i) { return i & (ROUTE_RING - 1); }
__host__ __device__ __forceinline__ int glean_src_lane(int i) { return i & 31; }
// Whether a slot's gather takes the lean path: the ring (bf16, VEC = 8), at most 32
// readers (one per lane) and 32 heads (the bound of the first port, which staged one
// lse/S entry per lane; kept, as larger H is untested), and every index
// below 2^31: J N C into G, J N H into lse and S, N H nrp into dsr.
static bool route_gather_lean(const RouteGeo &g, int nr, size_t N, size_t J) {
    const size_t lim = (size_t)1 << 31, C = g.C, H = g.H, nrp = ((size_t)nr + 3) & ~(size_t)3;
    return g.vec == 8 && sizeof(floatX) == 2 && g.H <= 32 && nr <= 32 && J * N * C < lim && J * N * H < lim &&
           N * H * nrp < lim;
}
// Raises a kernel's dynamic shared-memory limit once when smem needs more than the default 48 KB
template <typename K> void route_smem_limit(K kernel, size_t smem, bool &done) {
    if (!done && smem > 48 * 1024) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    done = true;
}

// x[ch] (this lane's partial of its head's sum in chunk ch) -> the head's full
// sum, in every lane: a butterfly over the head's SEG lanes (geo.seg when SEG is
// 0), then the sum over the chunks of its group (in chunk order).
template <int NCH, int SEG> __device__ __forceinline__ void head_sum(float (&x)[NCH], const RouteGeo &geo) {
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        if (SEG > 0) {
#pragma unroll
            for (int o = 1; o < SEG; o <<= 1) { x[ch] += __shfl_xor_sync(0xffffffffu, x[ch], o); }
        } else {
            for (int o = 1; o < geo.seg; o <<= 1) { x[ch] += __shfl_xor_sync(0xffffffffu, x[ch], o); }
        }
    }
    if (NCH > 1 && (SEG == 0 || SEG == 32) && geo.cph > 1) {   // heads of several chunks
        float y[NCH];
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            y[ch] = 0.0f;
#pragma unroll
            for (int c2 = 0; c2 < NCH; c2++) { if ((geo.grp[ch] >> c2) & 1u) { y[ch] += x[c2]; } }
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { x[ch] = y[ch]; }
    }
}

// The routing head of each of this lane's chunks, and whether the lane is the
// head's first (the one that stores per-head values); computed once per thread,
// outside the loops (shifts when SEG < 32 is compiled in). Also on the host
// (route_gather_index_check).
template <int VEC, int NCH, int SEG>
__host__ __device__ __forceinline__ void lane_heads(int (&hd)[NCH], bool (&first)[NCH], int lane, const RouteGeo &geo) {
    constexpr int SG = SEG > 0 && SEG < 32 ? SEG : 1;   // (a divisor also where unused)
    const int HC = geo.C / geo.H;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 32 * VEC + lane * VEC;
        if (SEG > 0 && SEG < 32) { hd[ch] = ch * (32 / SG) + lane / SG; first[ch] = lane % SG == 0; }
        else { hd[ch] = c0 / HC; first[ch] = c0 % HC == 0; }
        first[ch] = first[ch] && c0 < geo.C;
    }
}

// r (N) = 1 / sqrt(|v|^2 / C + 1e-6) of a freshly written source v (N, C).
// Computed once per source and reused by every later site.
// (residual_norm_forward's row kernel: one warp per row, 16-byte loads.)
void source_stat_forward(float *r, const floatX *v, size_t N, int C) {
    residual_norm_forward(NULL, NULL, r, NULL, v, NULL, N, C);
}

__global__ void route_qg_kernel(float *qg, const floatX *q, const floatX *gamma, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { qg[i] = toF(q[i]) * toF(gamma[i]); }
}

// qg (J, C) fp32 = q * gamma of every site, once per forward: the scores are
// s = r_i (qg . v_i), in forward and in backward.
void route_qg_forward(float *qg, const floatX *q, const floatX *gamma, size_t n) {
    route_qg_kernel<<<ceil_div(n, 256), 256>>>(qg, q, gamma, n);
    launchCheck();
}

// The grouped forward (lab v13; route_fwd_plan in config.h makes the groups):
// the kernel of a group's first site also runs the softmax of the next KX
// sites over its own sources (their lists start with them) and stores each as
// a partial: hbar = acc / l (N, C) fp32 and lse_p = m + log l (N, H) fp32.
// Those sites' kernels (PART) start from it and read only their other sources.
// The extra sites need the row ring with VEC = 8. Such a kernel keeps the qg
// of its KX + 1 sites in shared memory after the ring, not in registers:
// float4 [KX+1][NCH][2][32] (lane l's channels 8l .. 8l+4, then 8l+4 .. 8l+8
// of each chunk: a warp's loads hit no bank twice). The most extra sites
// per layout: the largest KX that compiles without spills (sm_90a, ptxas -v;
// NOTES_route.md "v13 in the trainer"); 0 without the ring (fp32, VEC = 1).
template <int VEC, int NCH> __host__ __device__ constexpr int route_fwd_kx_max() {
    return route_ring<VEC>() && VEC == 8 && NCH <= 4 ? 3 : 0;
}
template <int VEC, int NCH, int KX> __host__ __device__ constexpr size_t route_fwd_smem() {
    return route_ring_smem<VEC, NCH>() + (KX > 0 ? (size_t)(KX + 1) * NCH * 32 * VEC * sizeof(float) : 0);
}
// where the partials of extra site x start: hbar in ph, lse_p in pl (x = 0 .. KX-1)
typedef struct { float *ph, *pl; } RoutePartials;

// One site, fused (lab v2). Per position t (one warp): for each source i in
// order, e = qg . v_i per head, s = r_i e, and an online-softmax update of the
// running max m, sum l and unnormalised mix acc (fp32 registers); the sources
// come through the row ring (bf16), or one source ahead in registers. Then
// h = acc / l, lse = m + log l, and the site's RMSNorm: u = h * rstd * g, from
// h rounded to floatX as it is stored (rstd from the fp32 h).
// Grouped (above): KX > 0: also the online softmax of the KX sites whose qg
// follow this site's in qg ((KX+1, C)) over these sources, and their partials
// out, (KX, N, C) at out.ph and (KX, N, H) at out.pl. PART: start from the
// partial hbar in.ph (N, C), lse_p in.pl (N, H). KX = 0 without PART is the
// plain site kernel.
template <int VEC, int NCH, int SEG, int KX = 0, bool PART = false>
__global__ void __launch_bounds__(256, KX == 0 ? ROUTE_MIN_BLOCKS(VEC, NCH) : (NCH <= 2 ? 2 : 1))
route_forward_kernel(floatX *uout, float *rstd, floatX *hout, float *lse, const floatX *__restrict__ slots,
                     const float *__restrict__ r, const int *__restrict__ src, int n, const float *__restrict__ qg,
                     const floatX *__restrict__ g, int N, RouteGeo geo, RoutePartials out, RoutePartials in) {
    static_assert(KX <= route_fwd_kx_max<VEC, NCH>(), "extra sites need the ring (VEC = 8), and registers");
    constexpr int W = 32 * VEC;
    const int lane = threadIdx.x % 32, t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    extern __shared__ __align__(16) unsigned char route_smem[];
    float4 *qgs = reinterpret_cast<float4 *>(route_smem + route_ring_smem<VEC, NCH>());   // (KX > 0)
    if constexpr (KX > 0) {   // the sites' qg, zeros past C; every thread, before any returns
        for (int i = threadIdx.x; i < (KX + 1) * NCH * 64; i += blockDim.x) {
            const int x = i / (NCH * 64), c = (i % (NCH * 64)) / 64 * W + i % 32 * 8 + (i % 64) / 32 * 4;
            const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            qgs[i] = c < geo.C ? *reinterpret_cast<const float4 *>(qg + (size_t)x * geo.C + c) : z;
        }
        __syncthreads();
    }
    if (t >= N) { return; }
    const int C = geo.C, H = geo.H;
    constexpr bool RING = route_ring<VEC>();
    Packed<VEC> *ring = ring_packs<VEC, NCH>(route_smem);
    float *ring_r = ring_floats<VEC, NCH>(route_smem);
    float qgl[NCH][VEC], acc[NCH][VEC], m[NCH], l[NCH];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        if constexpr (KX == 0) { ld_f(qgl[ch], qg, ch * W + lane * VEC, C); }   // (KX > 0: in qgs)
#pragma unroll
        for (int k = 0; k < VEC; k++) { acc[ch][k] = 0.0f; }
        m[ch] = -INFINITY; l[ch] = 0.0f;
    }
    if constexpr (PART) {   // from the partial: sum 1 at the running max lse_p, mix hbar
        int hd[NCH];
        bool first[NCH];
        lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int c0 = ch * W + lane * VEC;
            ld_f(acc[ch], in.ph + (size_t)t * C, c0, C);
            m[ch] = c0 < C ? in.pl[(size_t)t * H + hd[ch]] : 0.0f;
            l[ch] = 1.0f;
        }
    }
    // the extra sites' running max, sum and mix
    constexpr int KA = KX > 0 ? KX : 1;
    float xacc[KA][NCH][VEC], xm[KA][NCH], xl[KA][NCH];
#pragma unroll
    for (int x = 0; x < KX; x++) {
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
            for (int k = 0; k < VEC; k++) { xacc[x][ch][k] = 0.0f; }
            xm[x][ch] = -INFINITY; xl[x][ch] = 0.0f;
        }
    }
    // RING: source i (and its r) into stage i % ROUTE_RING
    auto issue = [&](int i) { ring_issue_source<VEC, NCH>(ring, ring_r, slots, r, src, i, n, N, t, lane, C); };
    Packed<VEC> nxt[NCH];   // (no ring: source i+1, loaded while source i is used)
    float rn = 0.0f;
    if constexpr (RING) {
        for (int i = 0; i < ROUTE_RING - 1; i++) { issue(i); }
    } else {
        size_t row = (size_t)src[0] * N + t;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_lane<VEC>(slots + row * C, ch * W + lane * VEC, C); }
        rn = r[row];
    }
    for (int i = 0; i < n; i++) {
        Packed<VEC> cur[NCH];   // source i, kept packed (unpacked on use: fewer registers)
        float e[NCH], ri;
        if constexpr (RING) {
            cp_async_wait<ROUTE_RING - 2>();   // source i's group is complete (later ones may not be)
            __syncwarp();                      // and lane 0's copy of its r is visible to the warp
            const int st = i & (ROUTE_RING - 1);
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { cur[ch] = ring[(st * NCH + ch) * 32 + lane]; }
            ri = ring_r[st];
            issue(i + ROUTE_RING - 1);   // into the stage of source i-1, which every lane has read
        } else {
            ri = rn;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { cur[ch] = nxt[ch]; }
            if (i + 1 < n) {   // prefetch source i+1
                size_t row = (size_t)src[i + 1] * N + t;
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_lane<VEC>(slots + row * C, ch * W + lane * VEC, C); }
                rn = r[row];
            }
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float v[VEC], d = 0.0f;
            unpack(cur[ch], v);
            if constexpr (KX > 0) {
                const float4 a = qgs[ch * 64 + lane], b = qgs[ch * 64 + 32 + lane];
                const float q8[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int k = 0; k < VEC; k++) { d += q8[k % 8] * v[k]; }
            } else {
#pragma unroll
                for (int k = 0; k < VEC; k++) { d += qgl[ch][k] * v[k]; }
            }
            e[ch] = d;
        }
        head_sum<NCH, SEG>(e, geo);
        // a = softmax_i s: rescale the running sum and mix to the new max (m = -inf at i = 0: sc = 0)
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float s = ri * e[ch], mn = fmaxf(m[ch], s), v[VEC];
            float sc = expf(m[ch] - mn), p = expf(s - mn);
            l[ch] = l[ch] * sc + p;
            unpack(cur[ch], v);
#pragma unroll
            for (int k = 0; k < VEC; k++) { acc[ch][k] = acc[ch][k] * sc + p * v[k]; }
            m[ch] = mn;
        }
        // the same for each extra site (VEC = 8)
#pragma unroll
        for (int x = 0; x < KX; x++) {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {   // unpacked again per site: fewer registers
                if constexpr (KX > 0) { opaque_words(cur[ch]); }
            }
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const float4 a = qgs[((x + 1) * NCH + ch) * 64 + lane], b = qgs[((x + 1) * NCH + ch) * 64 + 32 + lane];
                const float q8[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                float v[VEC], d = 0.0f;
                unpack(cur[ch], v);
#pragma unroll
                for (int k = 0; k < VEC; k++) { d += q8[k % 8] * v[k]; }
                e[ch] = d;
            }
            head_sum<NCH, SEG>(e, geo);
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                float s = ri * e[ch], mn = fmaxf(xm[x][ch], s), v[VEC];
                float sc = expf(xm[x][ch] - mn), p = expf(s - mn);
                xl[x][ch] = xl[x][ch] * sc + p;
                unpack(cur[ch], v);
#pragma unroll
                for (int k = 0; k < VEC; k++) { xacc[x][ch][k] = xacc[x][ch][k] * sc + p * v[k]; }
                xm[x][ch] = mn;
            }
        }
    }
    if constexpr (KX > 0) {   // the extra sites' partials: hbar = acc / l, lse_p = m + log l
        int hd[NCH];
        bool first[NCH];
        lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
#pragma unroll
        for (int x = 0; x < KX; x++) {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const int c0 = ch * W + lane * VEC;
                if (c0 >= C) { continue; }
                const float inv = 1.0f / xl[x][ch];
#pragma unroll
                for (int k = 0; k < VEC; k++) { xacc[x][ch][k] *= inv; }
                st_f(out.ph + ((size_t)x * N + t) * C + c0, xacc[x][ch]);
                if (first[ch]) { out.pl[((size_t)x * N + t) * H + hd[ch]] = xm[x][ch] + logf(xl[x][ch]); }
            }
        }
    }
    // h = sum_i a v_i;  u = rmsnorm(h; g)
    float ss = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float inv = 1.0f / l[ch];
#pragma unroll
        for (int k = 0; k < VEC; k++) { acc[ch][k] *= inv; ss += acc[ch][k] * acc[ch][k]; }
    }
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / C + 1e-6f);
    int hd[NCH];
    bool first[NCH];
    lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        if (c0 >= C) { continue; }
        // u from h as stored (rounded to floatX), so that the site's backward
        // (norm_backward_lane) can recompute it bit for bit from h and rstd
        float gw[VEC], hq[VEC], uu[VEC];
        ld_param(gw, g, c0, C);
#pragma unroll
        for (int k = 0; k < VEC; k++) { hq[k] = toF(fromF<floatX>(acc[ch][k])); uu[k] = hq[k] * rs * gw[k]; }
        st_lane(hout + (size_t)t * C + c0, hq);
        st_lane(uout + (size_t)t * C + c0, uu);
        if (first[ch]) { lse[(size_t)t * H + hd[ch]] = m[ch] + logf(l[ch]); }
    }
    if (lane == 0) { rstd[t] = rs; }
}

// ----------------------------------------------------------------------------
// v14 of the routing forward (lab dev/cuda/route.cu route_fwd_v14_kernel;
// NOTES_route.md "v14 in the trainer"): route_forward_kernel's outputs,
// partials and plan with fewer instructions per (site, source row), for the
// bf16 ring layouts (VEC = 8, NCH <= 4); the default there, and
// MHAR_FWD_KERNEL=v13 runs route_forward_kernel instead (fp32 and the other
// layouts always do). Measured on the H200 at 100M full mode: the forward
// 2.85 -> 2.55 ms a step; alone per site (block mode) the same as v13.
//   - base 2: qg2 = qg log2(e), so s2 = r_i qg2.v is the score in base 2 and
//     every weight or rescale factor is one ex2.approx; lse and lse_p are
//     stored in natural log, (m2 + log2 l) ln 2, as before.
//   - the head partials of all the group's sites in one transposing butterfly
//     (fwd14_reduce): each round halves the values a lane keeps, so a lane ends
//     up owning SL of them and runs the softmax scalars (max, sum, weight) for
//     those only; the weights go back to the head's lanes by one shuffle each
//     (fwd14_bcast).
//   - lazy rescale: a running max m2 is raised only when a score passes it by
//     more than FWD14_TAU (then a weight is at most 2^TAU), decided for the
//     warp by one vote; otherwise a row costs one ex2 per owned value and
//     acc += p v. Exact in real arithmetic: l and acc carry the same 2^-m2.
//   - the source row unpacked once for all the group's sites.
#define FWD14_TAU 8.0f
#define ROUTE_LN2 0.6931471805599453f

// whether a layout has the v14 kernels: the ring (bf16, VEC = 8) and C <= 1024
template <int VEC, int NCH> __host__ __device__ constexpr bool route_fwd14_ok() {
    return route_ring<VEC>() && VEC == 8 && NCH <= 4;
}
// 2^x as one MUFU.EX2 (results below 2^-126 flushed to zero; 2^-inf = 0)
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
constexpr int cx_log2(int x) { return x <= 1 ? 0 : 1 + cx_log2(x / 2); }       // floor(log2 x)
constexpr int cx_pow2_ceil(int x) { return x <= 1 ? 1 : 2 * cx_pow2_ceil((x + 1) / 2); }

// v14's values in a lane (layout <8, NCH, SEG>, KX extra sites): value k =
// x NCH + ch is this lane's part of site x's score in chunk ch, summed over
// the head's chunks first when a head spans several (cph > 1: the head's
// chunks then hold equal copies). V values, padded with zeros to P = 2^LP. A
// head is a segment of SEG = 2^R lanes; after T = min(R, LP) transposing
// rounds a lane owns SL = P / 2^T values: its slot m holds value value_of(m).
template <int NCH, int SEG, int KX> struct Fwd14Lanes {
    static constexpr int V = (KX + 1) * NCH, P = cx_pow2_ceil(V), LP = cx_log2(P), R = cx_log2(SEG);
    static constexpr int T = R < LP ? R : LP, SL = P >> T;
    static __device__ __forceinline__ int value_of(int m, int lane) {
        return m + (((lane & (SEG - 1)) >> (R - T)) << (LP - T));
    }
};

// y (P): this lane's part of each value -> y (SL): the head segment's sum of
// each value this lane owns (Fwd14Lanes). Round r pairs value m with m + half:
// the lane with segment bit SEG >> (r+1) set keeps the upper half and sends the
// lower, its partner the reverse; the segment bits below the T rounds end with
// a plain butterfly on the SL kept values.
template <class G> __device__ __forceinline__ void fwd14_reduce(float (&y)[G::P], int lane) {
#pragma unroll
    for (int r = 0; r < G::T; r++) {
        const int half = G::P >> (r + 1), o = (1 << G::R) >> (r + 1);
        const bool hi = (lane & o) != 0;
#pragma unroll
        for (int m = 0; m < half; m++) {
            const float send = hi ? y[m] : y[m + half], keep = hi ? y[m + half] : y[m];
            y[m] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (int o = (1 << G::R) >> (G::T + 1); o > 0; o >>= 1) {
#pragma unroll
        for (int m = 0; m < G::SL; m++) { y[m] += __shfl_xor_sync(0xffffffffu, y[m], o); }
    }
}
// value k (of V) of this lane's head segment, read from a lane that owns it
// (slot k mod SL of the segment's lane (k / SL) << (R - T)); z (SL): the owned
// values; k a compile-time index after unrolling. fwd14_bcast: all V of them.
template <class G> __device__ __forceinline__ float fwd14_bcast1(const float (&z)[G::SL], int k) {
    if constexpr (G::T == 0) { return z[k]; }
    else { return __shfl_sync(0xffffffffu, z[k % G::SL], (k / G::SL) << (G::R - G::T), 1 << G::R); }
}
template <class G> __device__ __forceinline__ void fwd14_bcast(float (&out)[G::V], const float (&z)[G::SL]) {
#pragma unroll
    for (int k = 0; k < G::V; k++) { out[k] = fwd14_bcast1<G>(z, k); }
}

// One site, v14 (route_forward_kernel's contract, layout <8, NCH, SEG>):
// u (N, C) floatX, rstd (N), h (N, C) floatX, lse (N, H) natural log, from
// the n sources src (slots (nslots, N, C), r (nslots, N)) and qg (KX+1, C);
// KX > 0: the next KX sites' partials out.ph (KX, N, C) fp32 hbar and out.pl
// (KX, N, H) lse_p (natural log); PART: start from in.ph (N, C), in.pl (N, H).
// One warp per position; sources through the row ring; the group's qg2 in
// registers (KX = 0) or in shared memory after the ring (route_forward_kernel's
// float4 [KX+1][NCH][2][32] table, scaled by log2 e).
template <int NCH, int SEG, int KX = 0, bool PART = false>
__global__ void __launch_bounds__(256, KX == 0 ? ROUTE_MIN_BLOCKS(8, NCH) : (NCH <= 2 ? 2 : 1))
route_forward14_kernel(floatX *uout, float *rstd, floatX *hout, float *lse, const floatX *__restrict__ slots,
                       const float *__restrict__ r, const int *__restrict__ src, int n, const float *__restrict__ qg,
                       const floatX *__restrict__ g, int N, RouteGeo geo, RoutePartials out, RoutePartials in) {
    static_assert(route_fwd14_ok<8, NCH>() && SEG >= 1 && KX <= route_fwd_kx_max<8, NCH>(), "v14: bf16 ring layouts");
    typedef Fwd14Lanes<NCH, SEG, KX> G;
    constexpr int VEC = 8, W = 32 * VEC, XS = KX + 1, V = G::V, P = G::P, SL = G::SL;
    // <8, 2, SEG> with 3 extra sites (2 blocks a SM: 128 registers): the copy of row i + ROUTE_RING - 1 is
    // issued at the end of iteration i, after the math, not before it: before, ptxas spilled 4-16 bytes at
    // SEG = 1, 2, 4, 8, 16 (also with the row unpacked twice); the ring is then one row less ahead during the math
    constexpr bool LATE_ISSUE = NCH == 2 && KX == 3;
    const int lane = threadIdx.x % 32, t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    extern __shared__ __align__(16) unsigned char route_smem[];
    float4 *qgs = reinterpret_cast<float4 *>(route_smem + route_ring_smem<VEC, NCH>());   // (KX > 0)
    if constexpr (KX > 0) {   // the sites' qg2, zeros past C; every thread, before any returns
        for (int i = threadIdx.x; i < XS * NCH * 64; i += blockDim.x) {
            const int x = i / (NCH * 64), c = (i % (NCH * 64)) / 64 * W + i % 32 * 8 + (i % 64) / 32 * 4;
            float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (c < geo.C) {
                z = *reinterpret_cast<const float4 *>(qg + (size_t)x * geo.C + c);
                z = make_float4(z.x * ROUTE_LOG2E, z.y * ROUTE_LOG2E, z.z * ROUTE_LOG2E, z.w * ROUTE_LOG2E);
            }
            qgs[i] = z;
        }
        __syncthreads();
    }
    if (t >= N) { return; }
    const int C = geo.C, H = geo.H, HC = C / H;
    Packed<VEC> *ring = ring_packs<VEC, NCH>(route_smem);
    float *ring_r = ring_floats<VEC, NCH>(route_smem);
    float qgl[KX == 0 ? NCH : 1][VEC];   // KX = 0: qg2 in registers
    float acc[XS][NCH][VEC];             // site x's unnormalised mix (x = 0: this site)
    float m2[SL], l[SL];                 // running max (base 2) and sum of each owned value
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        if constexpr (KX == 0) {
            ld_f(qgl[ch], qg, c0, C);
#pragma unroll
            for (int k = 0; k < VEC; k++) { qgl[ch][k] *= ROUTE_LOG2E; }
        }
#pragma unroll
        for (int x = 0; x < XS; x++) {
            if (PART && x == 0) { ld_f(acc[0][ch], in.ph + (size_t)t * C, c0, C); }   // mix hbar
            else {
#pragma unroll
                for (int k = 0; k < VEC; k++) { acc[x][ch][k] = 0.0f; }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < SL; m++) {   // PART: this site's values start at sum 1, running max lse_p (base 2)
        const int k = G::value_of(m, lane), c = k % NCH * W + (lane & ~(SEG - 1)) * VEC;   // head's first channel
        m2[m] = -INFINITY; l[m] = 0.0f;
        if (PART && k < NCH) { m2[m] = c < C ? in.pl[(size_t)t * H + c / HC] * ROUTE_LOG2E : 0.0f; l[m] = 1.0f; }
    }
    // source i (and its r) into ring stage i % ROUTE_RING
    auto issue = [&](int i) { ring_issue_source<VEC, NCH>(ring, ring_r, slots, r, src, i, n, N, t, lane, C); };
    for (int i = 0; i < ROUTE_RING - 1; i++) { issue(i); }
    for (int i = 0; i < n; i++) {
        cp_async_wait<ROUTE_RING - 2>();   // source i's group is complete
        __syncwarp();                      // and lane 0's copy of its r is visible
        const int st = i & (ROUTE_RING - 1);
        float v[NCH][VEC];   // source i, unpacked once for every site
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { unpack(ring[(st * NCH + ch) * 32 + lane], v[ch]); }
        const float ri = ring_r[st];
        if (!LATE_ISSUE) { issue(i + ROUTE_RING - 1); }   // into the stage of source i-1, which every lane has read
        float y[P];   // this lane's part of each value (qg2 . v per site and chunk), zero padding
#pragma unroll
        for (int k = 0; k < P; k++) { y[k] = 0.0f; }
#pragma unroll
        for (int x = 0; x < XS; x++) {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                float q8[VEC];
                if constexpr (KX == 0) {
#pragma unroll
                    for (int k = 0; k < VEC; k++) { q8[k] = qgl[ch][k]; }
                } else {
                    const float4 a = qgs[(x * NCH + ch) * 64 + lane], b = qgs[(x * NCH + ch) * 64 + 32 + lane];
                    q8[0] = a.x; q8[1] = a.y; q8[2] = a.z; q8[3] = a.w; q8[4] = b.x; q8[5] = b.y; q8[6] = b.z; q8[7] = b.w;
                }
                float d = q8[0] * v[ch][0];
#pragma unroll
                for (int k = 1; k < VEC; k++) { d = fmaf(q8[k], v[ch][k], d); }
                y[x * NCH + ch] = d;
            }
        }
        if constexpr (SEG == 32 && NCH > 1) {   // heads of several chunks: each chunk's value is its head's part
            if (geo.cph > 1) {
#pragma unroll
                for (int x = 0; x < XS; x++) {
                    float z[NCH];
#pragma unroll
                    for (int ch = 0; ch < NCH; ch++) {
                        z[ch] = 0.0f;
#pragma unroll
                        for (int c2 = 0; c2 < NCH; c2++) { if ((geo.grp[ch] >> c2) & 1u) { z[ch] += y[x * NCH + c2]; } }
                    }
#pragma unroll
                    for (int ch = 0; ch < NCH; ch++) { y[x * NCH + ch] = z[ch]; }
                }
            }
        }
        fwd14_reduce<G>(y, lane);
        float s2[SL];
        bool up = false;
#pragma unroll
        for (int m = 0; m < SL; m++) { s2[m] = ri * y[m]; up |= s2[m] > m2[m] + FWD14_TAU; }
        if (__any_sync(0xffffffffu, up)) {   // raise every owned max (always on the first row of a fresh site)
            float sc[SL];
#pragma unroll
            for (int m = 0; m < SL; m++) {
                const float mn = fmaxf(m2[m], s2[m]);
                sc[m] = ex2_approx(m2[m] - mn);   // m2 = -inf: 0
                l[m] *= sc[m];
                m2[m] = mn;
            }
#pragma unroll
            for (int x = 0; x < XS; x++) {
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) {
                    const float f = fwd14_bcast1<G>(sc, x * NCH + ch);
#pragma unroll
                    for (int k = 0; k < VEC; k++) { acc[x][ch][k] *= f; }
                }
            }
        }
        float p[SL];
#pragma unroll
        for (int m = 0; m < SL; m++) { p[m] = ex2_approx(s2[m] - m2[m]); l[m] += p[m]; }
#pragma unroll
        for (int x = 0; x < XS; x++) {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const float w = fwd14_bcast1<G>(p, x * NCH + ch);
#pragma unroll
                for (int k = 0; k < VEC; k++) { acc[x][ch][k] = fmaf(w, v[ch][k], acc[x][ch][k]); }
            }
        }
        if (LATE_ISSUE) { issue(i + ROUTE_RING - 1); }
    }
    // lse (x = 0) and lse_p (x >= 1) of each owned value, natural log, by one lane per (segment, value) and
    // only for a head's first chunk; then 1 / l of every value to the head's lanes
    float inv[SL], invv[V];
#pragma unroll
    for (int m = 0; m < SL; m++) {
        inv[m] = 1.0f / l[m];
        const int k = G::value_of(m, lane), x = k / NCH, ch = k % NCH, c = ch * W + (lane & ~(SEG - 1)) * VEC;
        if (k < V && (lane & ((1 << (G::R - G::T)) - 1)) == 0 && c < C && ch % geo.cph == 0) {
            const float ls = (m2[m] + log2f(l[m])) * ROUTE_LN2;
            if (x == 0) { lse[(size_t)t * H + c / HC] = ls; }
            else { out.pl[((size_t)(x - 1) * N + t) * H + c / HC] = ls; }
        }
    }
    fwd14_bcast<G>(invv, inv);
#pragma unroll
    for (int x = 1; x < XS; x++) {   // the extra sites' partials: hbar = acc / l
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int c0 = ch * W + lane * VEC;
            if (c0 >= C) { continue; }
#pragma unroll
            for (int k = 0; k < VEC; k++) { acc[x][ch][k] *= invv[x * NCH + ch]; }
            st_f(out.ph + ((size_t)(x - 1) * N + t) * C + c0, acc[x][ch]);
        }
    }
    // h = sum_i a v_i;  u = rmsnorm(h; g), from h rounded to floatX as stored (route_forward_kernel's epilogue)
    float ss = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
        for (int k = 0; k < VEC; k++) { acc[0][ch][k] *= invv[ch]; ss += acc[0][ch][k] * acc[0][ch][k]; }
    }
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / C + 1e-6f);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        if (c0 >= C) { continue; }
        float gw[VEC], hq[VEC], uu[VEC];
        ld_param(gw, g, c0, C);
#pragma unroll
        for (int k = 0; k < VEC; k++) { hq[k] = toF(fromF<floatX>(acc[0][ch][k])); uu[k] = hq[k] * rs * gw[k]; }
        st_lane(hout + (size_t)t * C + c0, hq);
        st_lane(uout + (size_t)t * C + c0, uu);
    }
    if (lane == 0) { rstd[t] = rs; }
}

// The most sites a routing forward group has for a layout (1 + its most extra sites)
int route_fwd_kmax(const RouteGeo &geo) {
    int k = 1;
    route_dispatch(geo, [&](auto lanes) { k = 1 + route_fwd_kx_max<decltype(lanes)::vec, decltype(lanes)::nch>(); });
    return k;
}

template <int VEC, int NCH, int SEG, int KX, bool PART>
void route_forward_launch(floatX *u, float *rstd, floatX *h, float *lse, const floatX *slots, const float *r,
                          const int *src, int n, const float *qg, const floatX *g, size_t N, const RouteGeo &geo,
                          RoutePartials out, RoutePartials in) {
    constexpr size_t smem = route_fwd_smem<VEC, NCH, KX>();
    static bool limit_set = false;
    route_smem_limit(route_forward_kernel<VEC, NCH, SEG, KX, PART>, smem, limit_set);
    route_forward_kernel<VEC, NCH, SEG, KX, PART><<<ceil_div(N, 8), 256, smem>>>(u, rstd, h, lse, slots, r, src, n, qg,
                                                                                g, (int)N, geo, out, in);
}
// the same launch for route_forward14_kernel (same shared memory: the ring, then the qg table)
template <int NCH, int SEG, int KX, bool PART>
void route_forward14_launch(floatX *u, float *rstd, floatX *h, float *lse, const floatX *slots, const float *r,
                            const int *src, int n, const float *qg, const floatX *g, size_t N, const RouteGeo &geo,
                            RoutePartials out, RoutePartials in) {
    constexpr size_t smem = route_fwd_smem<8, NCH, KX>();
    static bool limit_set = false;
    route_smem_limit(route_forward14_kernel<NCH, SEG, KX, PART>, smem, limit_set);
    route_forward14_kernel<NCH, SEG, KX, PART><<<ceil_div(N, 8), 256, smem>>>(u, rstd, h, lse, slots, r, src, n, qg, g,
                                                                            (int)N, geo, out, in);
}

// whether the layout of geo has the v14 routing forward (route_fwd14_ok)
bool route_fwd14_layout(const RouteGeo &geo) {
    bool ok = false;
    route_dispatch(geo, [&](auto lanes) { ok = route_fwd14_ok<decltype(lanes)::vec, decltype(lanes)::nch>(); });
    return ok;
}

// u (N, C) = rmsnorm(route(sources); g) and its rstd (N): the input of the
// sublayer after the site. Keeps h (N, C), the routed mix, and lse (N, H) for
// backward. slots (nslots, N, C), r (nslots, N); the site reads the n slots
// src[0..n); qg (C) and the norm weight g (C) are the site's.
// Grouped forward (route_fwd_plan): kx > 0: the site leads a group and also
// writes the partials of the next kx sites (whose qg follow its own in qg) into
// out; in.ph != NULL: the site starts from the partial in, and src, n are its
// sources after its group leader's. kx = 0 and in.ph == NULL: the plain kernel.
// v14: route_forward14_kernel (the default) where the layout has it
// (route_fwd14_ok), else (or with MHAR_FWD_KERNEL=v13) route_forward_kernel.
void route_forward(floatX *u, float *rstd, floatX *h, float *lse, const floatX *slots, const float *r, const int *src,
                   int n, const float *qg, const floatX *g, size_t N, const RouteGeo &geo, int kx, RoutePartials out,
                   RoutePartials in, bool v14) {
    route_dispatch(geo, [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NCH = decltype(lanes)::nch, SEG = decltype(lanes)::seg;
        constexpr int XM = route_fwd_kx_max<VEC, NCH>();
        if (kx > XM || (in.ph != NULL && (kx > 0 || XM == 0))) {
            die("internal: routing forward with %d extra sites%s (layout VEC=%d NCH=%d: at most %d)", kx,
                in.ph != NULL ? " from a partial" : "", VEC, NCH, XM);
        }
        auto launch = [&](auto kxc, auto partc) {   // std::integral_constant: the instance
            constexpr int KX = decltype(kxc)::value;
            constexpr bool PART = decltype(partc)::value;
            if constexpr (route_fwd14_ok<VEC, NCH>()) {
                if (v14) {
                    route_forward14_launch<NCH, SEG, KX, PART>(u, rstd, h, lse, slots, r, src, n, qg, g, N, geo, out, in);
                    return;
                }
            }
            route_forward_launch<VEC, NCH, SEG, KX, PART>(u, rstd, h, lse, slots, r, src, n, qg, g, N, geo, out, in);
        };
        using std::integral_constant;
        if (in.ph != NULL) { launch(integral_constant<int, 0>(), integral_constant<bool, (XM > 0)>()); }
        else if (kx == 0) { launch(integral_constant<int, 0>(), integral_constant<bool, false>()); }
        else if (kx == 1) { launch(integral_constant<int, (XM >= 1 ? 1 : 0)>(), integral_constant<bool, false>()); }
        else if (kx == 2) { launch(integral_constant<int, (XM >= 2 ? 2 : 0)>(), integral_constant<bool, false>()); }
        else { launch(integral_constant<int, (XM >= 3 ? 3 : 0)>(), integral_constant<bool, false>()); }
    });
    launchCheck();
}

// Sum each warp's acc (its positions) into out (C), warps in order, one chunk
// at a time through shared red (8, 32*VEC). Every thread of the block calls it.
template <int VEC, int NCH>
__device__ void block_sum_store(float (&acc)[NCH][VEC], float (*red)[32 * VEC], float *out, int C) {
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        st_f(&red[w][lane * VEC], acc[ch]);
        __syncthreads();
        for (int i = threadIdx.x; i < 32 * VEC; i += blockDim.x) {
            int c = ch * 32 * VEC + i;
            if (c < C) {
                float s = 0.0f;
                for (int k = 0; k < 8; k++) { s += red[k][i]; }
                out[c] = s;
            }
        }
        __syncthreads();
    }
}

// Backward of the site's RMSNorm (lab v3), for one position: u = h * rstd * g gives
// G = dL/dh = rstd (g dU - xhat mean(g dU xhat)), xhat = h * rstd; adds dU * xhat to accg.
// S[ch] = G[h] . h[h] over this lane's head: the S_h = sum_i a p of SPEC's site backward.
// u (the row of u, or NULL): also stores u = xhat * g, the forward's operations on the
// stored h and rstd in its order (route_forward_kernel's epilogue), so bit for bit its u.
template <int VEC, int NCH, int SEG>
__device__ __forceinline__ void norm_backward_lane(float (&G)[NCH][VEC], float (&S)[NCH], float (&accg)[NCH][VEC],
                                                   floatX *u, const float *dU, const floatX *h, float rs,
                                                   const float (&gw)[NCH][VEC], int lane, const RouteGeo &geo) {
    constexpr int W = 32 * VEC;
    const int C = geo.C;
    float md = 0.0f;
    // two passes over this lane's dU and h (the second re-reads them from L1):
    // fewer live registers than keeping dU and xhat across the warp sum
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        float du[VEC], hv[VEC];
        ld_f(du, dU, c0, C);
        unpack(ld_lane<VEC>(h, c0, C), hv);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            const float xh = hv[k] * rs;
            md += gw[ch][k] * du[k] * xh;
            accg[ch][k] += du[k] * xh;
        }
    }
    md = warp_sum(md) / C;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        float du[VEC], hv[VEC], uu[VEC], d = 0.0f;
        ld_f(du, dU, c0, C);
        unpack(ld_lane<VEC>(h, c0, C), hv);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            const float xh = hv[k] * rs;
            G[ch][k] = rs * (gw[ch][k] * du[k] - xh * md);
            d += G[ch][k] * xh;
            uu[k] = xh * gw[ch][k];
        }
        S[ch] = d / rs;   // G . h = G . xhat / rstd
        if (u != NULL && c0 < C) { st_lane(u + c0, uu); }
    }
    head_sum<NCH, SEG>(S, geo);
}

// Site j's norm backward (lab v3): G (N, C) floatX, S (N, H), and part_dg
// (ceil(N/32), C): per-block sums of dU * xhat for the norm weight's gradient;
// Uout (N, C), when not NULL: u_j recomputed (norm_backward_lane).
// Block = 8 warps x 4 positions.
template <int VEC, int NCH, int SEG>
__global__ void __launch_bounds__(256, ROUTE_MIN_BLOCKS(VEC, NCH))
route_site_backward_kernel(floatX *Gout, float *Sout, float *part_dg, floatX *Uout, const float *__restrict__ dU,
                           const floatX *__restrict__ hbuf, const float *__restrict__ rstd,
                           const floatX *__restrict__ g, int N, RouteGeo geo) {
    constexpr int W = 32 * VEC;
    __shared__ __align__(16) float red[8][W];
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, C = geo.C, H = geo.H;
    float gw[NCH][VEC], accg[NCH][VEC];
    int hd[NCH];
    bool first[NCH];
    lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        ld_param(gw[ch], g, ch * W + lane * VEC, C);
#pragma unroll
        for (int k = 0; k < VEC; k++) { accg[ch][k] = 0.0f; }
    }
    for (int pp = 0; pp < ROUTE_POS_PER_BLOCK / 8; pp++) {
        const int t = blockIdx.x * ROUTE_POS_PER_BLOCK + pp * 8 + w;
        if (t >= N) { continue; }   // warp-uniform
        float G[NCH][VEC], S[NCH];
        norm_backward_lane<VEC, NCH, SEG>(G, S, accg, Uout != NULL ? Uout + (size_t)t * C : NULL, dU + (size_t)t * C,
                                          hbuf + (size_t)t * C, rstd[t], gw, lane, geo);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int c0 = ch * W + lane * VEC;
            if (c0 >= C) { continue; }
            st_lane(Gout + (size_t)t * C + c0, G[ch]);
            if (first[ch]) { Sout[(size_t)t * H + hd[ch]] = S[ch]; }
        }
    }
    block_sum_store<VEC, NCH>(accg, red, part_dg + (size_t)blockIdx.x * C, C);
}

// out (C) (= or +=) the sum over P partials of part (P, nm, C), matrix m =
// blockIdx.y, in a fixed order: lane y of the ROUTE_RED_LANES partial lanes sums
// partials y, y + ROUTE_RED_LANES, ... in order, then the lane sums are added in
// lane order. out row: out_row[m] when out_row (device), else m. Block (32
// channels) x (ROUTE_RED_LANES); grid (C/32, nm). A single serial sum over
// P = 1024 partials on C/256 blocks was latency-bound.
#define ROUTE_RED_LANES 32
__global__ void __launch_bounds__(32 * ROUTE_RED_LANES)
route_reduce_parts_kernel(float *out, const float *__restrict__ part, const int *__restrict__ out_row, int P, int nm,
                          int C, int add) {
    __shared__ float acc[ROUTE_RED_LANES][33];
    const int c = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y;
    float s = 0.0f;
    if (c < C) {
        for (int p = threadIdx.y; p < P; p += ROUTE_RED_LANES) { s += part[((size_t)p * nm + m) * C + c]; }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int y = 0; y < ROUTE_RED_LANES; y++) { t += acc[y][threadIdx.x]; }
        float *o = out + (size_t)(out_row ? out_row[m] : m) * C + c;
        *o = add ? *o + t : t;
    }
}

// The launch of route_reduce_parts_kernel: out rows (= or +=) sums of part (P, nm, C)
void route_reduce_parts(float *out, const float *part, const int *out_row, int P, int nm, int C, int add) {
    route_reduce_parts_kernel<<<dim3(ceil_div(C, 32), nm), dim3(32, ROUTE_RED_LANES)>>>(out, part, out_row, P, nm, C,
                                                                                       add);
    launchCheck();
}

// Backward of site j's u = rmsnorm(h; g), given dU = dL/du (N, C) fp32: stores
// G = dL/dh (N, C) floatX and S (N, H) for the slot gathers, and adds the norm
// weight's gradient into dg (C). part: scratch of ceil(N/32) * C floats. u (N, C),
// when not NULL: u recomputed bit for bit from h and rstd, for the weight
// gradients of the sublayer that reads it (mhar keeps one u buffer; reading h
// here once for both saves a pass over it).
void route_site_backward(floatX *G, float *S, float *dg, float *part, floatX *u, const float *dU, const floatX *h,
                         const float *rstd, const floatX *g, size_t N, const RouteGeo &geo) {
    unsigned nblk = ceil_div(N, ROUTE_POS_PER_BLOCK);
    route_dispatch(geo, [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NCH = decltype(lanes)::nch, SEG = decltype(lanes)::seg;
        route_site_backward_kernel<VEC, NCH, SEG><<<nblk, 256>>>(G, S, part, u, dU, h, rstd, g, (int)N, geo);
    });
    launchCheck();
    // dg[c] += sum_t dU[t][c] xhat[t][c]: the per-block partials, in a fixed order
    route_reduce_parts(dg, part, NULL, (int)nblk, 1, geo.C, 1);
}

// Prefetch into L1 the 128-byte line holding p (a hint: no register is held,
// unlike a load)
__device__ __forceinline__ void prefetch_l1(const void *p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// The gather hands ds r to the q/gamma pass as dsr (N, H, nrp): the readers of
// each (position, head) padded to a multiple of 4, so that the pass reads four
// of them per 16-byte load. nrp for a slot of nr readers:
__host__ __device__ constexpr int route_nrp(int nr) { return (nr + 3) & ~3; }

// Gradient of slot k from the nr sites j that read it (lab v3, the gather),
// one warp per position. SPEC section 4's site backward, summed over the sites:
//   dslot_k = sum_j [ r ds_j qg_j + a_j G_j ] - (r^3 / C) (sum_j u_j . v) v,
// with v = v_k, r = r_k, and per head p = G_j . v, e = qg_j . v,
// a_j = exp(r e - lse_j), ds_j = a_j (p - S_j), u_j . v = sum_h ds_j e, all
// recomputed here. When chain (slot k+1 = out_k + slot k), dslot holds
// dslot_{k+1} on entry and the result adds it (in place). The fp32 result is
// stored only when keep32 (something reads it: the gather of slot k-1 when
// slot k chains onto it, or the encoder for slot 0); dslotX (N, C), when not
// NULL, gets a floatX copy (the input of the matmul backwards of the sublayer
// that wrote slot k). Also writes dsr (N, H, nrp) = ds_j r for the dq/dgamma pass
// (nrp = nr rounded up to 4; the padding readers nr .. nrp are not written).
// Gall (J, N, C), Sall and lseall (J, N, H), qg (J, C); readers (nr) increasing;
// NC = N C and NH = N H (LEAN only).
// The loop over the readers is bound by instruction issue (ncu), so it is kept
// lean: head indices computed once, compile-time head sums, each reader's G row
// and qg_j read once, the weight through exp2f, two FMAs per element of dv.
// Two paths (the template bool LEAN, chosen per slot by route_slot_backward):
// - LEAN (lab v12's scheme; bf16 ring layouts where route_gather_lean holds: at
//   most 32 readers and 32 heads, every index < 2^31): 32-bit element indices
//   (per-lane parts computed once, + j N C, + j N H, + j C per reader); lane l
//   holds readers[l] and reader jj's site comes by one shuffle; the G row comes
//   through the ring by cp.async (readers past nr are zero-byte copies from a
//   valid address into the stage just consumed; all groups are waited for after
//   the loop), the reader's lse and S rows through L1, prefetched when its row is
//   issued (session 7: staging them in the ring by per-lane 4-byte cp.async
//   tripled the shared-memory wavefronts and made the gather 5.6 -> 6.6 ms a
//   step; NOTES_route.md, "Why lab v12's gather lost"); v stays packed (8 registers at C = 512)
//   behind an empty asm, unpacked per reader. (Lab v12's loop: 237 SASS
//   instructions per reader against this kernel's old 312; NOTES_route.md, "v12".)
// - otherwise (VEC = 1, fp32, more than 32 readers or heads, large sizes): the G
//   rows through the ring (bf16, VEC = 8) or one reader ahead in registers, lse
//   and S rows prefetched into L1, 64-bit addresses; v_k unpacked once.
template <int VEC, int NCH, int SEG, bool LEAN>
__global__ void __launch_bounds__(256, ROUTE_MIN_BLOCKS(VEC, NCH))
route_slot_backward_kernel(float *dslot, floatX *dslotX, float *dsr, const floatX *__restrict__ v,
                           const float *__restrict__ rk, const floatX *__restrict__ Gall,
                           const float *__restrict__ Sall, const float *__restrict__ lseall,
                           const int *__restrict__ readers, int nr, const float *__restrict__ qg, int chain, int keep32,
                           int N, unsigned NC, unsigned NH, RouteGeo geo) {
    constexpr int W = 32 * VEC;
    constexpr bool RING = route_ring<VEC>();
    static_assert(!LEAN || RING, "the lean gather needs the row ring (bf16, VEC = 8)");
    const int lane = threadIdx.x % 32, t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= N) { return; }
    const int C = geo.C, H = geo.H;
    int hd[NCH];
    bool first[NCH];
    lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
    // v_k in fp32 (old path: the compiler may keep it packed and unpack it per
    // reader, to stay within the register bound; LEAN: held packed, unpacked per
    // reader), and the next reader's G (no ring). Lanes past C: G and qg are zeros,
    // so p = e = 0 there whatever v_k holds (ld_lane_clamped), and they skip the rest.
    extern __shared__ __align__(16) unsigned char route_smem[];
    Packed<VEC> *ring = ring_packs<VEC, NCH>(route_smem);
    Packed<VEC> nxt[NCH], vraw[NCH];
    float vf[NCH][VEC], dv[NCH][VEC];
    const float r = rk[t], rl = r * ROUTE_LOG2E;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const Packed<VEC> vp = ld_lane_clamped<VEC>(v + (size_t)t * C, ch * W + lane * VEC, C);
        if constexpr (LEAN) { vraw[ch] = vp; }
        else { unpack(vp, vf[ch]); }
#pragma unroll
        for (int k = 0; k < VEC; k++) { dv[ch][k] = 0.0f; }
    }
    float uv = 0.0f;   // this lane's share of sum_j u_j . v
    // RING: reader jj's G row into stage jj % ROUTE_RING (one commit group per reader), and its
    // lse and S rows into L1 (prefetch: rows of H <= 32 floats are one line)
    auto issue = [&](int jj) {
        if (jj < nr) {
            const size_t row = (size_t)readers[jj] * N + t;
            ring_fill<VEC, NCH>(ring, jj & (ROUTE_RING - 1), Gall + row * C, lane, C);
            if (lane < 2) { prefetch_l1((lane ? Sall : lseall) + row * H); }
        }
        cp_async_commit();
    };
    // LEAN, per lane: its reader (lane l: readers[l]; site 0 past nr), its G row in site 0
    // and row t's first lse/S entry there (glean_*), its shared address in stage 0, dsr's
    // entries of (t, hd)
    const int nrp = route_nrp(nr);
    int jl = 0;
    unsigned gl = 0, lsb = 0, dsb = 0;
    uint32_t sg = 0;
    if constexpr (LEAN) {
        jl = lane < nr ? __ldg(readers + lane) : 0;
        gl = glean_row((unsigned)t, lane, C, VEC);
        lsb = glean_ls((unsigned)t, 0, H);   // row t's first lse/S entry
        sg = (uint32_t)__cvta_generic_to_shared(ring + lane);
        dsb = glean_dsr((unsigned)t, hd[0], H, nrp);   // chunk ch's: + (hd[ch] - hd[0]) nrp
    }
    // LEAN: reader i's G row (this lane's packs; zeros past C) into stage i % ROUTE_RING,
    // one commit group, and its lse and S rows into L1; past nr the copies read zero
    // bytes and nothing is prefetched
    auto issue_lean = [&](int i) {
        const unsigned j = (unsigned)__shfl_sync(0xffffffffu, jl, glean_src_lane(i));
        const uint32_t st = (uint32_t)glean_stage(i), live = i < nr;
        const unsigned g = glean_add(gl, j, NC);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            cp_async16z(sg + (st * NCH + ch) * 32 * 16, Gall + (g + glean_chunk(ch, lane, C, VEC)),
                        live && glean_live(ch, lane, C, VEC) ? 16u : 0u);
        }
        if (live && lane < 2) { prefetch_l1((lane ? Sall : lseall) + glean_add(lsb, j, NH)); }   // into L1
        cp_async_commit();
    };
    if constexpr (LEAN) {
        for (int i = 0; i < ROUTE_RING - 1; i++) { issue_lean(i); }
    } else if constexpr (RING) {
        for (int jj = 0; jj < ROUTE_RING - 1; jj++) { issue(jj); }
    } else {
        size_t row = (size_t)readers[0] * N + t;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_lane<VEC>(Gall + row * C, ch * W + lane * VEC, C); }
        if (lane < 2) { prefetch_l1((lane ? Sall : lseall) + row * H); }
    }
    for (int jj = 0; jj < nr; jj++) {
        // reader j's qg_j (LEAN: at this lane's first channel), lse and S rows (through L1)
        const float *qgj, *lsej, *Sj;
        Packed<VEC> Gp[NCH];
        float G[NCH][VEC], qv[NCH][VEC], p[NCH], e[NCH];   // reader j's G row and qg_j, each read once
        if constexpr (LEAN) {
            cp_async_wait<ROUTE_RING - 2>();   // reader jj's G row is in (this lane's part of it)
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                Gp[ch] = ring[(glean_stage(jj) * NCH + ch) * 32 + lane];
                opaque_words(vraw[ch]);        // v's unpack stays in the loop (v held packed)
                unpack(vraw[ch], vf[ch]);
            }
            opaque_words(dsb);                 // (not recomputed from t in the store's branch)
            issue_lean(jj + ROUTE_RING - 1);   // into the stage of reader jj-1, which this lane has read
            const unsigned jr = (unsigned)__shfl_sync(0xffffffffu, jl, jj);
            qgj = qg + glean_add((unsigned)(lane * VEC), jr, (unsigned)C);
            lsej = lseall + glean_add(lsb, jr, NH);   // through L1 (prefetched at the issue)
            Sj = Sall + glean_add(lsb, jr, NH);
        } else {
            const int j = readers[jj];
            const size_t row = (size_t)j * N + t;
            qgj = qg + (size_t)j * C; lsej = lseall + row * H; Sj = Sall + row * H;
            if constexpr (RING) {
                cp_async_wait<ROUTE_RING - 2>();   // reader jj's G row is in (this lane's part of it)
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) { Gp[ch] = ring[((jj & (ROUTE_RING - 1)) * NCH + ch) * 32 + lane]; }
                issue(jj + ROUTE_RING - 1);
            } else {
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) { Gp[ch] = nxt[ch]; }
                if (jj + 1 < nr) {   // prefetch the next reader's G, lse and S
                    size_t rown = (size_t)readers[jj + 1] * N + t;
#pragma unroll
                    for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_lane<VEC>(Gall + rown * C, ch * W + lane * VEC, C); }
                    if (lane < 2) { prefetch_l1((lane ? Sall : lseall) + rown * H); }
                }
            }
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float pd = 0.0f, ed = 0.0f;
            unpack(Gp[ch], G[ch]);
            if constexpr (LEAN) { ld_f(qv[ch], qgj, ch * W, C - lane * VEC); }
            else { ld_f(qv[ch], qgj, ch * W + lane * VEC, C); }
#pragma unroll
            for (int k = 0; k < VEC; k++) { pd += G[ch][k] * vf[ch][k]; ed += qv[ch][k] * vf[ch][k]; }
            p[ch] = pd; e[ch] = ed;
        }
        head_sum<NCH, SEG>(p, geo);
        head_sum<NCH, SEG>(e, geo);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int c0 = ch * W + lane * VEC;
            if (c0 >= C) { continue; }
            // out = sum_i a v_i, a = softmax(s): ds = a (p - S);  s = r e
            // a = exp(r e - lse), as 2^((r e - lse) log2 e): one MUFU.EX2 and a multiply
            const float av = exp2f(fmaf(rl, e[ch], -lsej[hd[ch]] * ROUTE_LOG2E));
            const float ds = av * (p[ch] - Sj[hd[ch]]), rds = r * ds;
#pragma unroll
            for (int k = 0; k < VEC; k++) { dv[ch][k] = fmaf(av, G[ch][k], fmaf(rds, qv[ch][k], dv[ch][k])); }
            if (first[ch]) {   // the head's first lane: u_j . v = sum_h ds_h e_h, and ds r
                uv += ds * e[ch];
                if constexpr (LEAN) { dsr[glean_dsr_at(dsb, hd[ch], hd[0], nrp, jj)] = rds; }
                else { dsr[((size_t)t * H + hd[ch]) * nrp + jj] = rds; }   // (N, H, nrp)
            }
        }
    }
    if constexpr (LEAN) {
        cp_async_wait<0>();   // the zero-byte copies of readers nr .. nr + ROUTE_RING - 2 (none may land after exit)
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { unpack(vraw[ch], vf[ch]); }
    }
    // k_i = gamma r_i v_i, r_i = (|v_i|^2/C + eps)^(-1/2): dv -= (r^3 / C) (sum_j u_j . v) v
    const float k3 = r * r * r / C * warp_sum(uv);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        if (c0 >= C) { continue; }
#pragma unroll
        for (int k = 0; k < VEC; k++) { dv[ch][k] -= k3 * vf[ch][k]; }
        if (chain) {   // slot k+1 = out_k + slot k: the pass-through
            float old[VEC];
            ld_f(old, dslot + (size_t)t * C, c0, C);
#pragma unroll
            for (int k = 0; k < VEC; k++) { dv[ch][k] += old[k]; }
        }
        if (keep32) { st_f(dslot + (size_t)t * C + c0, dv[ch]); }
        if (dslotX) { st_lane(dslotX + (size_t)t * C + c0, dv[ch]); }
    }
}

// dq/dgamma pass of slot k (forward: s[h] = r_k (qg_j[h] . v_k[h]), so qg_j's
// gradient takes ds r v_k): part (P, nr, C) = partition p's sum over its
// ROUTE_PART_ROWS positions of dsr[t, h(c), jj] * v_k[t][c], for every reading
// site jj. Block = 256 threads of CPT adjacent channels (all in one head), so
// 256*CPT channels; grid (ceil(C / (256 CPT)), P). Each thread sums its own
// channels over the partition's positions in position order (no reduction
// inside the block), for up to ROUTE_PARAM_RG readers held in registers (more
// readers: one more pass over the partition per group).
// The positions go in tiles of tp through two stages of shared memory: while
// the block computes on one tile, cp.async copies the next one into the other
// stage (the tile's v rows (tp, 256 CPT) floatX, and its dsr rows (tp, H, nrp),
// one contiguous range as the gather stores them). A thread reads its channels
// of v and four readers' ds r per 16-byte broadcast read. The padding readers
// nr .. nrp of a row hold whatever the buffer held: their sums are computed and
// never stored, and nothing else mixes with them.
#define ROUTE_PARAM_RG 32
template <int CPT>
__global__ void __launch_bounds__(256, 2)
route_slot_param_kernel(float *part, const float *__restrict__ dsr, const floatX *__restrict__ v, int nr, int N, int C,
                        int H, int tp) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int CB = 256 * CPT, VE = 16 / sizeof(floatX);   // channels per block; floatX per 16 bytes
    const int nrp = route_nrp(nr), p = blockIdx.y, cb0 = blockIdx.x * CB, HC = C / H;
    const size_t dsrow = (size_t)H * nrp;                       // floats of dsr per position
    const size_t stage = (size_t)tp * (CB * sizeof(floatX) + dsrow * sizeof(float));   // bytes per stage
    const int cl = threadIdx.x * CPT, c = cb0 + cl, hd = c < C ? c / HC : 0;
    const int t0 = p * ROUTE_PART_ROWS, t1 = min(t0 + ROUTE_PART_ROWS, N);
    const int ncb = min(CB, C - cb0);   // channels of this block
    const bool async = ncb % VE == 0 && C % VE == 0;   // 16-byte copies line up
    auto vs_of = [&](int s) { return reinterpret_cast<floatX *>(smem_raw + s * stage); };              // (tp, CB)
    auto ds_of = [&](int s) { return reinterpret_cast<float *>(smem_raw + s * stage + (size_t)tp * CB * sizeof(floatX)); };
    // tile ta .. ta+tn into stage s, one commit group (empty past the partition)
    auto issue = [&](int s, int ta) {
        if (ta < t1) {
            const int tn = min(tp, t1 - ta);
            floatX *vs = vs_of(s);
            float *ds = ds_of(s);
            if (async) {
                const int nq = ncb / VE;   // 16-byte chunks per row
                for (int q = threadIdx.x; q < tn * nq; q += blockDim.x) {
                    const int t = q / nq, col = q - t * nq;
                    cp_async16(vs + (size_t)t * CB + col * VE, v + (size_t)(ta + t) * C + cb0 + col * VE);
                }
                const float *src = dsr + (size_t)ta * dsrow;   // dsrow is a multiple of 4 floats
                for (size_t i = threadIdx.x; i < tn * dsrow / 4; i += blockDim.x) { cp_async16(ds + 4 * i, src + 4 * i); }
            } else {   // plain copies (this stage is not being read: the previous tile's barrier)
                for (int q = threadIdx.x; q < tn * ncb; q += blockDim.x) {
                    const int t = q / ncb, col = q - t * ncb;
                    vs[(size_t)t * CB + col] = v[(size_t)(ta + t) * C + cb0 + col];
                }
                for (size_t i = threadIdx.x; i < tn * dsrow; i += blockDim.x) { ds[i] = dsr[(size_t)ta * dsrow + i]; }
            }
        }
        cp_async_commit();
    };
    for (int j0 = 0; j0 < nr; j0 += ROUTE_PARAM_RG) {
        float acc[ROUTE_PARAM_RG][CPT];
#pragma unroll
        for (int r = 0; r < ROUTE_PARAM_RG; r++) {
#pragma unroll
            for (int k = 0; k < CPT; k++) { acc[r][k] = 0.0f; }
        }
        __syncthreads();   // the previous reader group's last tile is read
        issue(0, t0);
        for (int ta = t0, s = 0; ta < t1; ta += tp, s ^= 1) {
            issue(s ^ 1, ta + tp);   // the next tile, while this one is summed
            cp_async_wait<1>();
            __syncthreads();         // tile ta is in stage s, from every thread's copies
            const int tn = min(tp, t1 - ta);
            if (c < C) {
                const floatX *vs = vs_of(s);
                const float *ds = ds_of(s) + (size_t)hd * nrp + j0;
                for (int t = 0; t < tn; t++) {
                    float vv[CPT];
                    unpack(*reinterpret_cast<const Packed<CPT> *>(vs + (size_t)t * CB + cl), vv);
                    const float *d = ds + t * dsrow;
#pragma unroll
                    for (int r4 = 0; r4 < ROUTE_PARAM_RG / 4; r4++) {
                        if (j0 + 4 * r4 < nr) {   // block-uniform
                            const float4 d4 = *reinterpret_cast<const float4 *>(d + 4 * r4);
#pragma unroll
                            for (int k = 0; k < CPT; k++) {
                                acc[4 * r4 + 0][k] += d4.x * vv[k];
                                acc[4 * r4 + 1][k] += d4.y * vv[k];
                                acc[4 * r4 + 2][k] += d4.z * vv[k];
                                acc[4 * r4 + 3][k] += d4.w * vv[k];
                            }
                        }
                    }
                }
            }
            __syncthreads();   // stage s is read: the next iteration refills it
        }
        if (c < C) {
#pragma unroll
            for (int r = 0; r < ROUTE_PARAM_RG; r++) {
                if (j0 + r < nr) {
#pragma unroll
                    for (int k = 0; k < CPT; k++) { part[((size_t)p * nr + j0 + r) * C + c + k] = acc[r][k]; }
                }
            }
        }
    }
}

// Positions per tile of route_slot_param_kernel<CPT>, and its shared memory
// (two stages): the largest power of two up to 32 whose two stages fit in 96 KB
// (so that two blocks share an SM)
static int route_param_tile(int CPT, int nr, int H, size_t *smem) {
    const size_t row = 256 * (size_t)CPT * sizeof(floatX) + (size_t)H * route_nrp(nr) * sizeof(float);
    int tp = 32;
    while (tp > 1 && 2 * tp * row > 96 * 1024) { tp /= 2; }
    *smem = 2 * tp * row;
    return tp;
}

// Launches route_slot_param_kernel<CPT> over P partitions of positions (grid:
// 256 * CPT channels per block), raising its shared-memory limit when a tile needs more
template <int CPT>
static void route_slot_param(float *part, const float *dsr, const floatX *v, int nr, size_t N, unsigned P,
                             const RouteGeo &geo) {
    size_t smem;
    int tp = route_param_tile(CPT, nr, geo.H, &smem);
    static size_t smem_set = 0;
    if (smem > smem_set) {
        cudaCheck(cudaFuncSetAttribute(route_slot_param_kernel<CPT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
        smem_set = smem;
    }
    route_slot_param_kernel<CPT><<<dim3(ceil_div(geo.C, 256 * CPT), P), 256, smem>>>(part, dsr, v, nr, (int)N, geo.C,
                                                                                     geo.H, tp);
    launchCheck();
}

// The q/gamma pass on tensor cores (lab v16; bf16 build): per head the pass is a matrix
// product, QV^T (readers x channels) = DSR^T (readers x positions) V (positions x channels)
// over a partition of positions, here on mma.sync m16n8k16 (fragment layouts: the flash
// attention kernels' comment): M = readers (two m-tiles, nr <= 32), N = channels (warp w:
// channels 64 w .. of the block's 512), K = positions (16 a stage, two stages of shared
// memory filled by cp.async, zeros past the partition). ds r is fp32: it goes in as two
// bf16 parts, hi = bf16(x) and lo = bf16(x - hi) (two products, 16 bits of mantissa); v is
// bf16 already and comes through ldmatrix.trans. The same partials as route_slot_param_kernel,
// part (P, nr, C), over partitions of `rows` positions (Model.qg_rows: 128, or MHAR_QGAMMA_ROWS,
// a multiple of 16 from 128 up, which the partials' buffer holds; the lab measured the pass at
// 0.59 ms a step at 100M mhar H=8 with 128, 0.83 with 256, against 0.99 on the CUDA cores).
#define ROUTE_QG_TC_TP 16   // positions a stage (one k-step)
// dsr's row stride in shared memory (floats): H nrp padded to 4 mod 32, so that a fragment's
// 8 readers x 4 positions hit 32 distinct banks; and the bytes of one stage (v rows, then dsr rows)
__host__ __device__ __forceinline__ int route_qg_tc_ps(int H, int nrp) {
    const int hn = H * nrp;
    return hn + (((4 - hn) % 32) + 32) % 32;
}
__host__ __device__ __forceinline__ size_t route_qg_tc_stage(int C, int H, int nr) {
    const int CB = C < 512 ? C : 512;
    return (size_t)ROUTE_QG_TC_TP * (CB + 8) * 2 + (size_t)ROUTE_QG_TC_TP * route_qg_tc_ps(H, route_nrp(nr)) * 4;
}
// The shapes it takes: 64-channel warps, 8-channel n-tiles inside the heads, two m-tiles of readers
static bool route_qg_tc_fits(int C, int H, int nr) {
    return sizeof(floatX) == 2 && C % 64 == 0 && (C / H) % 8 == 0 && nr >= 1 && nr <= 32 &&
           2 * route_qg_tc_stage(C, H, nr) <= 200 * 1024;
}

#ifndef PRECISION_FP32
// x0, x1 (fp32) -> bf16x2 hi and lo parts (x0 in the low halves)
__device__ __forceinline__ void split2_bf16(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = pack_bf16(x0 - hf.x, x1 - hf.y);
}

// part (P, nr, C) = partition p's sum over its positions t of dsr[t, h(c), jj] * v_k[t][c],
// for every reader jj. Grid (ceil(C / 512), P), 256 threads. A (readers x positions) of
// head h, m-tile mt: reg0 = (reader 16 mt + g, positions 2q, 2q+1), reg1 = reader + 8,
// reg2 = positions + 8, reg3 = both; readers past nr are zeros (dsr's padding readers
// [nr, nrp) hold whatever the buffer held and are never read). B (positions x channels):
// the stage's v rows, by ldmatrix.trans, two n-tiles of 8 channels at a time. Two blocks an SM.
__global__ void __launch_bounds__(256, 2)
route_slot_param_tc_kernel(float *part, const float *__restrict__ dsr, const floatX *__restrict__ v, int nr, int N,
                           int C, int H, int rows) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int TP = ROUTE_QG_TC_TP;
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, q = lane % 4;
    const int nrp = route_nrp(nr), HN = H * nrp, PS = route_qg_tc_ps(H, nrp), HC = C / H;
    const int cb0 = blockIdx.x * 512, CB = min(512, C - cb0), LDV = CB + 8, p = blockIdx.y;
    const int t0 = p * rows, t1 = min(t0 + rows, N), mtn = (nr + 15) / 16, cw = w * 64;
    const size_t vbytes = (size_t)TP * LDV * 2, stage = route_qg_tc_stage(C, H, nr);
    auto vs_of = [&](int s) { return reinterpret_cast<bf16 *>(smem_raw + s * stage); };
    auto ds_of = [&](int s) { return reinterpret_cast<float *>(smem_raw + s * stage + vbytes); };
    auto issue = [&](int s, int ta) {   // positions ta .. ta+TP into stage s (zeros past t1); one commit group
        if (ta < t1) {
            bf16 *vs = vs_of(s);
            float *ds = ds_of(s);
            const int nq = CB / 8, nd = HN / 4;   // 16-byte pieces of a v row, of a dsr row
            for (int i = threadIdx.x; i < TP * nq; i += blockDim.x) {
                const int t = i / nq, col = i - t * nq;
                const bool ok = ta + t < t1;
                cp_async16z((uint32_t)__cvta_generic_to_shared(vs + t * LDV + col * 8),
                            v + (size_t)(ok ? ta + t : t0) * C + cb0 + col * 8, ok ? 16u : 0u);
            }
            for (int i = threadIdx.x; i < TP * nd; i += blockDim.x) {
                const int t = i / nd, col = i - t * nd;
                const bool ok = ta + t < t1;
                cp_async16z((uint32_t)__cvta_generic_to_shared(ds + t * PS + col * 4),
                            dsr + (size_t)(ok ? ta + t : t0) * HN + col * 4, ok ? 16u : 0u);
            }
        }
        cp_async_commit();
    };
    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int nt = 0; nt < 8; nt++) { acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f; }
    }
    const bool wlive = cw < CB;   // warp-uniform
    issue(0, t0);
    for (int ta = t0, s = 0; ta < t1; ta += TP, s ^= 1) {
        issue(s ^ 1, ta + TP);   // the next stage, while this one is summed
        cp_async_wait<1>();
        __syncthreads();         // stage s is in, from every thread's copies
        if (wlive) {
            const float *ds = ds_of(s);
            uint32_t bb[4][4];   // B of n-tiles 2 nn (bb[nn][0..1]) and 2 nn + 1 (bb[nn][2..3])
#pragma unroll
            for (int nn = 0; nn < 4; nn++) { ldsm_x4_t(bb[nn], bt_addr(vs_of(s), LDV, 0, cw + nn * 16, lane)); }
            int hprev = -1;
            uint32_t ah[2][4], al[2][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const int h = (cb0 + cw + nt * 8) / HC;
                if (h != hprev) {   // A of head h (warp-uniform): ds r of the stage's positions, hi and lo
                    hprev = h;
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
                        for (int reg = 0; reg < 4; reg++) {
                            const int jj = 16 * mt + g + (reg & 1) * 8, t = 2 * q + (reg >> 1) * 8;
                            const float x0 = jj < nr ? ds[t * PS + h * nrp + jj] : 0.0f;
                            const float x1 = jj < nr ? ds[(t + 1) * PS + h * nrp + jj] : 0.0f;
                            split2_bf16(x0, x1, ah[mt][reg], al[mt][reg]);
                        }
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    if (mt < mtn) {
                        mma16816(acc[mt][nt], ah[mt], bb[nt / 2][(nt % 2) * 2], bb[nt / 2][(nt % 2) * 2 + 1]);
                        mma16816(acc[mt][nt], al[mt], bb[nt / 2][(nt % 2) * 2], bb[nt / 2][(nt % 2) * 2 + 1]);
                    }
                }
            }
        }
        __syncthreads();   // stage s is read: the next iteration refills it
    }
    cp_async_wait<0>();
    if (!wlive) { return; }
    // D (reader 16 mt + g + 8 half, channels cb0 + cw + 8 nt + 2q, +1)
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int jj = 16 * mt + g + 8 * half;
                if (mt < mtn && jj < nr) {
                    *reinterpret_cast<float2 *>(part + ((size_t)p * nr + jj) * C + cb0 + cw + nt * 8 + 2 * q) =
                        make_float2(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
                }
            }
        }
    }
}
#endif

// Launches route_slot_param_tc_kernel over ceil(N / rows) partitions (returned), raising
// its shared-memory limit when a slot needs more
static unsigned route_slot_param_tc(float *part, const float *dsr, const floatX *v, int nr, size_t N, int rows,
                                    const RouteGeo &geo) {
    const unsigned P = ceil_div(N, rows);
#ifndef PRECISION_FP32
    const size_t smem = 2 * route_qg_tc_stage(geo.C, geo.H, nr);
    static size_t smem_set = 0;
    if (smem > smem_set) {
        cudaCheck(cudaFuncSetAttribute(route_slot_param_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = smem;
    }
    route_slot_param_tc_kernel<<<dim3(ceil_div(geo.C, 512), P), 256, smem>>>(part, dsr, v, nr, (int)N, geo.C, geo.H,
                                                                             rows);
    launchCheck();
#else
    (void)part; (void)dsr; (void)v; (void)nr; (void)rows; (void)geo;
    die("internal: the tensor-core q/gamma pass is bf16 only");
#endif
    return P;
}

// Launches route_slot_backward_kernel<VEC, NCH, SEG, LEAN>, raising its shared-memory limit once
template <int VEC, int NCH, int SEG, bool LEAN>
static void route_slot_backward_launch(float *dslot, floatX *dslotX, float *dsr, const floatX *v, const float *r,
                                       const floatX *G, const float *S, const float *lse, const int *readers, int nr,
                                       const float *qg, int chain, int keep32, size_t N, const RouteGeo &geo) {
    constexpr size_t smem = route_ring_smem<VEC, NCH>();   // both paths: the ring of G rows only
    static bool limit_set = false;
    route_smem_limit(route_slot_backward_kernel<VEC, NCH, SEG, LEAN>, smem, limit_set);
    route_slot_backward_kernel<VEC, NCH, SEG, LEAN><<<ceil_div(N, 8), 256, smem>>>(
        dslot, dslotX, dsr, v, r, G, S, lse, readers, nr, qg, chain, keep32, (int)N, (unsigned)(N * geo.C),
        (unsigned)(N * geo.H), geo);
}

// Backward of every routing site into slot k's gradient (see the kernel above),
// given the G, S of every site j >= k (J sites) and the forward's lse: writes dslot (N, C)
// when keep32 (adding the dslot_{k+1} it holds when chain), its floatX copy dslotX (N, C)
// unless NULL, and dsr (N, H, nrp): ds r of each of the nr readers, for route_slot_qgamma.
// v (N, C) and r (N) are slot k's; readers (nr) are the sites that read it (device). The
// gather takes its lean path where lean is set and route_gather_lean holds (a run-time
// choice per slot, between two compiled instances; Model.gather_lean); both paths compute
// the same sums in the same order.
void route_slot_backward(float *dslot, floatX *dslotX, float *dsr, const floatX *v, const float *r, const floatX *G,
                         const float *S, const float *lse, const int *readers, int nr, const float *qg, int chain,
                         int keep32, size_t N, size_t J, int lean, const RouteGeo &geo) {
    route_dispatch(geo, [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NCH = decltype(lanes)::nch, SEG = decltype(lanes)::seg;
        if constexpr (route_ring<VEC>()) {
            if (lean && route_gather_lean(geo, nr, N, J)) {
                route_slot_backward_launch<VEC, NCH, SEG, true>(dslot, dslotX, dsr, v, r, G, S, lse, readers, nr, qg,
                                                                chain, keep32, N, geo);
                return;
            }
        }
        route_slot_backward_launch<VEC, NCH, SEG, false>(dslot, dslotX, dsr, v, r, G, S, lse, readers, nr, qg, chain,
                                                         keep32, N, geo);
    });
    launchCheck();
}

// The q/gamma pass of slot k, after its gather: s[h,i] = r_i sum_c q gamma v_i, so
// dq += gamma sum_t ds r v and dgamma += q sum_t ds r v. Writes, for each of the nr
// readers, the pair's qv (C) = sum over positions of ds r v_k (rows rd_pair, device),
// from dsr (N, H, nrp) and slot k's v (N, C); qpart (ceil(N/128) * nr * C) is scratch.
// On tensor cores, over partitions of qg_rows positions, where qg_rows > 0 and
// route_qg_tc_fits holds (bf16; Model.qg_rows), else on the CUDA cores
// (route_slot_param_kernel, fp32). Until session 9 the pass ran on a second stream beside
// the sublayer backwards that follow, and slowed their matmuls by about 0.9 ms a step at
// 100M mhar H=8 whether it took 1.0 ms (CUDA cores) or 0.6 (tensor cores); on the one
// stream it costs what it takes (NOTES_route.md, "Session 9").
void route_slot_qgamma(float *qv, float *qpart, const float *dsr, const floatX *v, const int *rd_pair, int nr,
                       size_t N, int qg_rows, const RouteGeo &geo) {
    unsigned P = ceil_div(N, ROUTE_PART_ROWS);
    if (qg_rows > 0 && route_qg_tc_fits(geo.C, geo.H, nr)) { P = route_slot_param_tc(qpart, dsr, v, nr, N, qg_rows, geo); }
    else if ((geo.C / geo.H) % 2 == 0) { route_slot_param<2>(qpart, dsr, v, nr, N, P, geo); }   // two channels a thread, of one head
    else { route_slot_param<1>(qpart, dsr, v, nr, N, P, geo); }
    // qv[rd_pair[jj]] (C) = the sum over the P partitions of reader jj's partials
    route_reduce_parts(qv, qpart, rd_pair, (int)P, nr, geo.C, 0);
}

// The lean gather's index math, on the CPU, for a model's layout, slots and N
// positions: the glean_* functions and lane_heads (as the kernel calls them)
// against the 64-bit formulas of the old path, for every slot that takes the lean
// path, each of its readers and the zero-byte copies after them, every lane and
// chunk, at positions 0, 1, N/2, N-2, N-1: the G pack copied (live chunks: row
// j N + t, channel c0; dead ones: a whole pack inside the same row, 0 bytes), the
// lane's head (= c0 / (C / H), below 32, also past C) and head-first flag, that
// the lse/S entry a lane reads (row t's first, + j N H, + its head) is
// (j N + t) H + hd and inside the arrays, the qg channels, the dsr
// entry, and that reader i's site is in lane i and its stage is not one read or
// pending. Returns the number of slots on the lean path; dies on a mismatch.
// rd (J, J) host: row k lists the readers of slot k.
static int route_gather_index_check(const RouteGeo &geo, const int *rd, const int *slot_nr, size_t J, size_t N) {
    int lean = 0;
    route_dispatch(geo, [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NCH = decltype(lanes)::nch, SEG = decltype(lanes)::seg;
        if constexpr (route_ring<VEC>()) {
            const int C = geo.C, H = geo.H, HC = C / H, W = 32 * VEC;
            const unsigned NC = (unsigned)(N * C), NH = (unsigned)(N * H);
            const size_t ts[5] = {0, 1, N / 2, N - 2, N - 1};
            auto fail = [&](const char *what, size_t k, int i, size_t t, int lane, int ch) {
                die("route_gather_index_check: %s (C=%d H=%d VEC=%d NCH=%d SEG=%d, slot %zu, reader %d, position %zu, "
                    "lane %d, chunk %d)", what, C, H, VEC, NCH, SEG, k, i, t, lane, ch);
            };
            for (size_t k = 0; k < J; k++) {
                const int nr = slot_nr[k], nrp = route_nrp(nr);
                if (!route_gather_lean(geo, nr, N, J)) { continue; }
                lean++;
                for (int i = 0; i < nr + ROUTE_RING - 1; i++) {   // reader i: issued at iteration i - ROUTE_RING + 1
                    const int it = i - (ROUTE_RING - 1);           // (the prologue: it < 0)
                    for (int x = (it > 0 ? it : 0); x < i; x++) {  // read at it (after the G row), or pending
                        if (glean_stage(x) == glean_stage(i)) { fail("stage in use", k, i, 0, -1, -1); }
                    }
                    const int sl = glean_src_lane(i);
                    if (i < nr && sl != i) { fail("reader's lane", k, i, 0, -1, -1); }
                    const size_t j = sl < nr ? (size_t)rd[k * J + sl] : 0;   // lane sl's site (kernel: jl)
                    if (j >= J || (i < nr && j != (size_t)rd[k * J + i])) { fail("reader's site", k, i, 0, -1, -1); }
                    for (int q = 0; q < 5; q++) {
                        const size_t t = ts[q] < N ? ts[q] : N - 1, row = j * N + t;
                        for (int lane = 0; lane < 32; lane++) {
                            int hd[NCH];
                            bool first[NCH];
                            lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
                            const unsigned gl = glean_row((unsigned)t, lane, C, VEC);
                            if ((size_t)glean_add(glean_ls((unsigned)t, lane, H), (unsigned)j, NH) >= J * N * H) {
                                fail("lse/S entry out of bounds", k, i, t, lane, -1);
                            }
                            for (int ch = 0; ch < NCH; ch++) {
                                const int c0 = ch * W + lane * VEC;
                                const bool live = glean_live(ch, lane, C, VEC);
                                const size_t g = (size_t)glean_add(gl, (unsigned)j, NC) + glean_chunk(ch, lane, C, VEC);
                                if (live != (c0 < C)) { fail("live chunk", k, i, t, lane, ch); }
                                if (live && g != row * C + c0) { fail("G pack", k, i, t, lane, ch); }
                                if (!live && (g < row * C || g + VEC > (row + 1) * C || g % VEC != 0)) {
                                    fail("zero-byte G copy's address", k, i, t, lane, ch);
                                }
                                if (hd[ch] < 0 || hd[ch] >= 32) { fail("head beyond 32", k, i, t, lane, ch); }
                                if (i >= nr || !live) { continue; }
                                if (hd[ch] != c0 / HC || first[ch] != (c0 % HC == 0)) { fail("head", k, i, t, lane, ch); }
                                // the entry the kernel reads: glean_ls(t, 0, H) + j N H + hd (= glean_ls(t, hd, H) + j N H)
                                if ((size_t)glean_add(glean_ls((unsigned)t, hd[ch], H), (unsigned)j, NH) != row * H + hd[ch]) {
                                    fail("lse/S entry", k, i, t, lane, ch);
                                }
                                if ((size_t)glean_add((unsigned)(lane * VEC), (unsigned)j, (unsigned)C) + ch * W != j * C + c0) {
                                    fail("qg", k, i, t, lane, ch);
                                }
                                if ((size_t)glean_dsr_at(glean_dsr((unsigned)t, hd[0], H, nrp), hd[ch], hd[0], nrp, i) !=
                                    (t * H + hd[ch]) * (size_t)nrp + i) {
                                    fail("dsr entry", k, i, t, lane, ch);
                                }
                            }
                        }
                    }
                }
            }
        }
    });
    return lean;
}

// dq_j[c] += gamma_j[c] * s, dgamma_j[c] += q_j[c] * s, where s sums site j's
// pairs qv[pair_off[j] .. pair_off[j+1]) in source order. Grid (C/256, J).
__global__ void route_param_backward_kernel(float *dq, float *dgamma, const float *qv, const int *pair_off,
                                            const floatX *q, const floatX *gamma, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y;
    if (c >= C) { return; }
    float s = 0.0f;
    for (int pr = pair_off[j]; pr < pair_off[j + 1]; pr++) { s += qv[(size_t)pr * C + c]; }
    size_t o = (size_t)j * C + c;
    dq[o] += toF(gamma[o]) * s;
    dgamma[o] += toF(q[o]) * s;
}

// dq, dgamma (J, C) += the routing query and key-norm gradients of every site,
// from the per-pair sums qv (pairs, C) of the slot gathers (all slots done).
// q, gamma (J, C); pair_off (J+1) on the device.
void route_param_backward(float *dq, float *dgamma, const float *qv, const int *pair_off, const floatX *q,
                          const floatX *gamma, int J, int C) {
    route_param_backward_kernel<<<dim3(ceil_div(C, 256), J), 256>>>(dq, dgamma, qv, pair_off, q, gamma, C);
    launchCheck();
}

// ----------------------------------------------------------------------------
// Classifier: softmax over the V real logits and cross-entropy with targets.
// One block per position; statistics in fp32. The probabilities are not
// stored: the backward pass recomputes them from the logits and lse.
// A training step runs crossentropy_fused (forward and backward in one kernel,
// from model_forward); evaluation runs crossentropy_forward alone, and
// crossentropy_backward runs after a forward that was not given dloss, or where
// a row of Vp does not fit in shared memory (crossentropy_use_fused).

#define CE_THREADS 512

// The logits rows start at multiples of Vp (a multiple of 128), so every 16-byte
// Pack of a row is aligned.

// One block per position n, one pass over the row: each thread keeps a running
// max m and sum s of exp(x - m) over its packs (online softmax), then the block
// merges them: lse = M + log(sum s exp(m - M)).
__global__ void crossentropy_forward_kernel(float *losses, float *lse, const floatX *logits, const int *targets, int V,
                                            int Vp) {
    size_t n = blockIdx.x;
    const Pack *row = (const Pack *)(logits + n * Vp);
    float m = -INFINITY, s = 0.0f;
    for (int k = threadIdx.x; k * PACK < V; k += blockDim.x) {
        Pack x = row[k];
        float pm = -INFINITY;
        for (int e = 0; e < PACK; e++) { if (k * PACK + e < V) { pm = fmaxf(pm, toF(x.v[e])); } }
        if (pm > m) { s *= expf(m - pm); m = pm; }
        for (int e = 0; e < PACK; e++) { if (k * PACK + e < V) { s += expf(toF(x.v[e]) - m); } }
    }
    float M = block_max(m);
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M));
    if (threadIdx.x == 0) {
        float l = M + logf(S);
        lse[n] = l;
        losses[n] = l - toF(logits[n * Vp + targets[n]]);
    }
}

// losses (N) = -log softmax(logits)[target]; lse (N) = log sum exp logits (for backward).
// logits (N, Vp): rows padded to Vp; the columns V..Vp-1 are not part of the softmax.
void crossentropy_forward(float *losses, float *lse, const floatX *logits, const int *targets, size_t N, int V, int Vp) {
    crossentropy_forward_kernel<<<(unsigned)N, CE_THREADS>>>(losses, lse, logits, targets, V, Vp);
    launchCheck();
}

// One block per position n, a pack per thread and step.
__global__ void crossentropy_backward_kernel(floatX *dlogits, const floatX *logits, const float *lse, const int *targets,
                                             float dloss, int V, int Vp) {
    size_t n = blockIdx.x;
    const Pack *row = (const Pack *)(logits + n * Vp);
    Pack *drow = (Pack *)(dlogits + n * Vp);
    float l = lse[n];
    int target = targets[n];
    for (int k = threadIdx.x; k * PACK < Vp; k += blockDim.x) {
        Pack x = row[k], d;
        for (int e = 0; e < PACK; e++) {
            int i = k * PACK + e;
            float p = i < V ? expf(toF(x.v[e]) - l) : 0.0f;   // padding columns: no gradient
            d.v[e] = fromF<floatX>((p - (i == target ? 1.0f : 0.0f)) * dloss);
        }
        drow[k] = d;
    }
}

// dlogits (N, Vp) = (probs - onehot(target)) * dloss, 0 in the padding columns; may
// overwrite the logits in place
void crossentropy_backward(floatX *dlogits, const floatX *logits, const float *lse, const int *targets, float dloss,
                           size_t N, int V, int Vp) {
    crossentropy_backward_kernel<<<(unsigned)N, CE_THREADS>>>(dlogits, logits, lse, targets, dloss, V, Vp);
    launchCheck();
}

// Fused forward and backward (the kernel lab's v3, dev/cuda/elementwise.cu), for
// a training step: the trainer knows dloss before the forward, and the logits of
// a training forward are read again only by the backward. So one kernel writes
// losses, lse AND dlogits (in place over the logits), reading the row from HBM
// once where the two kernels above read it twice. One block per position n:
// pass 1 reads the row (16-byte packs, CE_FUSED_UNROLL loads in flight per
// thread), keeps the online max and sum in base 2 (one FMA and one exp2f per
// value) and copies each pack into shared memory; after the block merge, pass 2
// takes the packs from shared memory and writes dlogits. Full packs skip the
// per-value column check. Shared memory: Vp * sizeof(floatX) (100.6 KB at
// Vp = 50304 in bf16: 2 blocks per SM on an H100/H200). H200, 100m, bf16:
// 2.03 ms per step, against 1.31 + 1.65 ms for the two kernels above.
// In place is safe: every global read of the row happens in pass 1, before the
// barriers of block_max/block_sum; the target logit is read from shared memory.
#define CE_FUSED_UNROLL 4
#define CE_LOG2E 1.4426950408889634f

// pass 1's update of the running max m and sum s = sum 2^((x - m) log2e) with
// the first ne values of a pack; FULL: all PACK values are real columns
template <bool FULL>
__device__ __forceinline__ void ce_fused_update(const Pack &x, int ne, float &m, float &s) {
    float v[PACK], pm = -INFINITY;
    #pragma unroll
    for (int e = 0; e < PACK; e++) { v[e] = toF(x.v[e]); if (FULL || e < ne) { pm = fmaxf(pm, v[e]); } }
    if (pm > m) { s *= exp2f((m - pm) * CE_LOG2E); m = pm; }
    const float mL = m * CE_LOG2E;
    #pragma unroll
    for (int e = 0; e < PACK; e++) { if (FULL || e < ne) { s += exp2f(fmaf(v[e], CE_LOG2E, -mL)); } }
}

// pass 2: (p - onehot) dloss for a pack, p = 2^(x log2e - l2), l2 = lse in base 2;
// te = the target's place in the pack, or -1; values past the first ne get 0
template <bool FULL>
__device__ __forceinline__ Pack ce_fused_grad(const Pack &x, int ne, int te, float l2, float dloss) {
    Pack d;
    #pragma unroll
    for (int e = 0; e < PACK; e++) {
        float p = FULL || e < ne ? exp2f(fmaf(toF(x.v[e]), CE_LOG2E, -l2)) : 0.0f;
        if (e == te) { p -= 1.0f; }
        d.v[e] = fromF<floatX>(p * dloss);
    }
    return d;
}

__global__ void __launch_bounds__(CE_THREADS, 2)
crossentropy_fused_kernel(floatX *dlogits, float *losses, float *lse, const floatX *logits, const int *targets,
                          float dloss, int V, int Vp) {
    extern __shared__ Pack ce_row[];   // (Vp / PACK) packs; only the first nreal are used
    const float LN2f = 0.6931471805599453f;
    size_t n = blockIdx.x;
    const Pack *row = (const Pack *)(logits + n * Vp);
    Pack *drow = (Pack *)(dlogits + n * Vp);
    const int full = V / PACK, nreal = (V + PACK - 1) / PACK, npk = Vp / PACK;
    // pass 1: online softmax in base 2
    float m = -INFINITY, s = 0.0f;
    for (int k0 = threadIdx.x; k0 < nreal; k0 += CE_FUSED_UNROLL * blockDim.x) {
        Pack x[CE_FUSED_UNROLL];
        #pragma unroll
        for (int u = 0; u < CE_FUSED_UNROLL; u++) {   // the loads first: CE_FUSED_UNROLL x 16 bytes in flight
            const int k = k0 + u * blockDim.x;
            if (k < nreal) { x[u] = row[k]; }
        }
        #pragma unroll
        for (int u = 0; u < CE_FUSED_UNROLL; u++) {
            const int k = k0 + u * blockDim.x;
            if (k >= nreal) { break; }
            ce_row[k] = x[u];
            if (k < full) { ce_fused_update<true>(x[u], PACK, m, s); }
            else { ce_fused_update<false>(x[u], V - k * PACK, m, s); }
        }
    }
    const float M = block_max(m);
    const float ML = M * CE_LOG2E;
    const float S = block_sum(m == -INFINITY ? 0.0f : s * exp2f(m * CE_LOG2E - ML));
    const float l2 = ML + log2f(S);   // lse in base 2
    const int target = targets[n], tk = target / PACK, te = target % PACK;
    if (threadIdx.x == 0) {   // the barriers in block_sum make every thread's ce_row stores visible
        lse[n] = l2 * LN2f;
        losses[n] = l2 * LN2f - toF(ce_row[tk].v[te]);
    }
    // pass 2, from shared memory; the padding packs are written without being read
    for (int k = threadIdx.x; k < npk; k += blockDim.x) {
        Pack d;
        if (k < full) {
            d = ce_fused_grad<true>(ce_row[k], PACK, k == tk ? te : -1, l2, dloss);
        } else if (k < nreal) {
            d = ce_fused_grad<false>(ce_row[k], V - k * PACK, k == tk ? te : -1, l2, dloss);
        } else {
            #pragma unroll
            for (int e = 0; e < PACK; e++) { d.v[e] = fromF<floatX>(0.0f); }
        }
        drow[k] = d;
    }
}

size_t ce_fused_smem = 0;   // the fused kernel's dynamic shared memory limit, as set so far (bytes)

// Once per model (model_build): lets the fused kernel take a row of Vp floatX in
// shared memory, when the device has that much per block (next to block_max's
// and block_sum's 256 bytes)
void crossentropy_setup(int Vp) {
    size_t smem = (size_t)Vp * sizeof(floatX);
    if (smem <= ce_fused_smem) { return; }
    int dev = 0, optin = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem + 1024 > (size_t)optin) { return; }
    cudaCheck(cudaFuncSetAttribute(crossentropy_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    ce_fused_smem = smem;
}

// whether crossentropy_fused runs at this Vp; where not, the two kernels above do the work
bool crossentropy_use_fused(int Vp) { return (size_t)Vp * sizeof(floatX) <= ce_fused_smem; }

// crossentropy_forward and crossentropy_backward in one pass: losses (N), lse (N)
// and dlogits (N, Vp) = (probs - onehot(target)) * dloss, 0 in the padding
// columns, written over the logits (dlogits == logits)
void crossentropy_fused(floatX *dlogits, float *losses, float *lse, const floatX *logits, const int *targets,
                        float dloss, size_t N, int V, int Vp) {
    size_t smem = (size_t)Vp * sizeof(floatX);
    crossentropy_fused_kernel<<<(unsigned)N, CE_THREADS, smem>>>(dlogits, losses, lse, logits, targets, dloss, V, Vp);
    launchCheck();
}

// ----------------------------------------------------------------------------
// The model

// Named views into one allocation, in checkpoint order (config.h's enum):
// ParamTensors<floatX> for the weights the kernels read, ParamTensors<float>
// for the fp32 master weights and gradients.
template <typename T> struct ParamTensors {
    T *wte, *ln1w, *wq, *wk, *wv, *qnw, *knw, *wo, *ln2w, *wg, *wu, *wd, *lnfw, *rq, *rg;
};

template <typename T> void point_params(ParamTensors<T> *p, T *mem, const size_t sizes[NUM_PARAM_TENSORS]) {
    T **ptrs[NUM_PARAM_TENSORS] = {&p->wte, &p->ln1w, &p->wq, &p->wk, &p->wv, &p->qnw, &p->knw,
                                   &p->wo, &p->ln2w, &p->wg, &p->wu, &p->wd, &p->lnfw, &p->rq, &p->rg};
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { *ptrs[i] = mem; mem += sizes[i]; }
}

// Forward activations kept for backward, in one device allocation. N = B*T
// positions, J = 2L+1 slots / routing sites, QD = NH*HD, KVD = NKV*HD.
// floatX unless marked fp32.
#define NUM_ACT_TENSORS 23
typedef struct {
    floatX *slots;  // (J, N, C)  sources v_i / block sums (mhar), residual stream x_j (std)
    float *slot_r;  // (J, N)     fp32: r_i of each slot (mhar)
    float *route_lse; // (J, N, H)  fp32 log-sum-exp of each site's routing scores per head (mhar):
                      //            the weights a = exp(s - lse) are recomputed in backward
    float *route_qg;  // (J, C)     fp32 q * gamma of every site, refreshed by each forward (mhar)
    floatX *h;      // (J, N, C)  routed inputs h_j, h_final at j = 2L (mhar; std reads slots)
    floatX *ln;     // (J, N, C)  normalised sublayer inputs u_j; [2L] = final norm. mhar: one (N, C)
                    //            buffer, u of the last site written; the backward recomputes u_j
                    //            into it from h_j and rstd_j (route_site_backward, fused)
    float *ln_rstd; // (J, N)     fp32
    floatX *qr;     // (L, N, QD)  Wq u, before QK-norm
    floatX *kr;     // (L, N, KVD)
    floatX *q;      // (L, N, QD)  after QK-norm and RoPE
    floatX *k;      // (L, N, KVD)
    floatX *v;      // (L, N, KVD)
    float *q_rstd;  // (L, N, NH)  fp32
    float *k_rstd;  // (L, N, NKV) fp32
    float *att_lse; // (L, B, NH, T)  fp32 log-sum-exp of each attention row (the CPU keeps att)
    floatX *atty;   // (L, N, QD)  attention output before Wo
    floatX *mg;     // (L, N, F)  gate pre-activation Wg u
    floatX *mu;     // (L, N, F)  up projection Wu u
    floatX *mh;     // (L, N, F)  silu(mg) * mu
    floatX *out;    // (N, C)  output of the current sublayer when its slot chains (scratch; else the
                    //         sublayer writes its slot directly, and full mhar has none)
    floatX *logits; // (N, V)  (dlogits in backward)
    float *losses;  // (N)  fp32 (the CPU keeps probs and losses outside Acts)
    float *ce_lse;  // (N)  fp32 log-sum-exp of the logits
} Acts;

// Backward scratch and gradients of activations, in one device allocation.
// fp32 unless marked floatX (those are inputs of matmul backwards).
#define NUM_GRAD_ACT_TENSORS 21
typedef struct {
    float *dslots;  // (N, C)  gradient of one slot at a time, from slot 2L down to slot 0. std: the
                    // running gradient of the residual stream, dL/dx_j after site j's norm backward
                    // added into it; mhar: route_slot_backward turns dslot j+1 into dslot j in place
    float *dln;     // (N, C)  gradient of the normalised input u_j
    floatX *dout;   // (N, C)  floatX copy of the gradient of the current sublayer's output
    floatX *datty;  // (N, QD)  gradient of the attention output (floatX: attention_sublayer_backward says why)
    float *dq;      // (N, QD)  grad of q (after QK-norm and RoPE)
    floatX *dqr;    // (N, QD)  grad of the raw Wq u
    float *dk;      // (N, KVD)
    floatX *dkr;    // (N, KVD)
    floatX *dv;     // (N, KVD)
    floatX *dmh;    // (N, F)
    floatX *dmg, *dmu;  // (N, F)
    floatX *route_G;   // (J, N, C)  G_j = dL/dh_j of every site, kept for the slot gathers (mhar)
    float *route_S;    // (J, N, H)  G_j[h] . h_j[h] (mhar)
    float *route_dsr;  // (N, H, J rounded up to 4)  ds r of the slot being gathered, per reading site (mhar)
    float *route_part; // (N/32, C)  per-block partials of the site passes' norm-weight sums (mhar)
    float *route_qpart; // (N/128 * J, C)  per-partition partials of the q/gamma passes (mhar)
    float *route_qv;   // (pairs, C)  sum over positions of ds r v per (site, source) pair (mhar)
    float *route_fwdp; // (K-1, N, C), then (K-1, N, H): the grouped routing forward's partials (mhar,
                       // K = Model.fwd_kmax > 1); forward scratch, inside route_G when they fit
    float *att_D;   // (B, NH, T)  dout . out per attention row
    float *partial; // (RED_PARTS_MAX, C)  per-partition sums of the deterministic reductions
} GradActs;

typedef struct {
    Config cfg;
    size_t sizes[NUM_PARAM_TENSORS];
    size_t nparams;
    ParamTensors<floatX> params;    // the weights the kernels read (the master itself in fp32)
    ParamTensors<float> master, grads;
    float *params_mem, *grads_mem;  // fp32 master weights and gradients (device)
    floatX *paramsX_mem;            // floatX copy of the master (== params_mem in fp32)
    float *adam_m, *adam_v;         // AdamW state, allocated at the first update
    int maxB, maxT;                 // activation buffers fit batches up to maxB x maxT
    Acts acts;
    GradActs gacts;
    void *acts_mem, *gacts_mem;
    float *rope_cos, *rope_sin;     // (T, HD/2) device
    size_t *pair_off;               // (J+1) routing pairs before site j (host)
    int *site_src;                  // (J, J) device: the slots read by site j, row j
    int *site_n;                    // (J) host: the number of sources of site j
    int *slot_rd;                   // (J, J) device: the sites reading slot k (increasing), row k
    int *slot_rd_pair;              // (J, J) device: their (site, source) pair indices, row k
    int *slot_nr;                   // (J) host: the number of sites reading slot k
    int *d_pair_off;                // (J+1) device: pair_off as int
    RouteGeo route_geo;             // lane layout of the fused routing kernels (mhar)
    int *fwd_lead;                  // (J) host: the first site of site j's routing forward group (route_fwd_plan)
    int fwd_kmax, fwd_starts;       // the largest group; the sites that start from a partial
    int fwd_v14;                    // routing forward kernel: 1 = v14 (the default, where the layout has it), 0 = v13
    int fwd_v14_asked;              // v14 wanted (not MHAR_FWD_KERNEL=v13); fwd_v14 0 then: this layout has no v14
    int gather_lean;                // the slot gather's lean path where route_gather_lean holds (not MHAR_GATHER=old)
    int qg_rows;                    // the q/gamma pass on tensor cores where route_qg_tc_fits holds, over partitions of
                                    // qg_rows positions (128, MHAR_QGAMMA_ROWS); 0: on CUDA cores (MHAR_QGAMMA=cuda, fp32)
    int *d_inputs, *d_targets;      // the current batch (B, T) on the device
    int *enc_scratch;               // (3N+1) device: the positions of each token (encoder_backward)
    int *inputs, *targets;          // host copies of the current batch
    float *losses_host;             // (N)
    int B, T;                       // shape of the last forward
    float loss;                     // mean loss of the last forward with targets
    float ce_dloss;                 // the dloss with which the last forward already wrote dlogits over the
                                    // logits (crossentropy_fused); 0: model_backward runs crossentropy_backward
} Model;

// Copy float32 host parameters (checkpoint layout) into the master and floatX copies.
void model_set_params(Model *m, const float *host) {
    cudaCheck(cudaMemcpy(m->params_mem, host, m->nparams * sizeof(float), cudaMemcpyHostToDevice));
    if ((void *)m->paramsX_mem != (void *)m->params_mem) { cast(m->paramsX_mem, m->params_mem, m->nparams); }
}

// Allocate parameters and gradients and set them to SPEC section 6's
// initialisation (params_init: the same float32 bits as the CPU trainer).
// Activations come later, sized for the largest batch.
void model_build(Model *m, const Config *cfg, uint64_t seed, float init_std) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    param_sizes(cfg, m->sizes);
    m->nparams = param_count(cfg);
    if (cublas == NULL) {
        cublasCheck(cublasCreate(&cublas));
        cublasCheck(cublasSetAtomicsMode(cublas, CUBLAS_ATOMICS_NOT_ALLOWED));   // deterministic
        cublasCheck(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));              // no TF32 unless asked
    }
    attention_setup(cfg->HD);
    crossentropy_setup(cfg->Vp);
    cudaCheck(cudaMalloc(&m->params_mem, m->nparams * sizeof(float)));
    cudaCheck(cudaMalloc(&m->grads_mem, m->nparams * sizeof(float)));
    zero(m->grads_mem, m->nparams * sizeof(float));
#ifdef PRECISION_FP32
    m->paramsX_mem = m->params_mem;
#else
    cudaCheck(cudaMalloc(&m->paramsX_mem, m->nparams * sizeof(floatX)));
#endif
    point_params(&m->params, m->paramsX_mem, m->sizes);
    point_params(&m->master, m->params_mem, m->sizes);
    point_params(&m->grads, m->grads_mem, m->sizes);
    float *init = (float *)malloc_check(m->nparams * sizeof(float));
    params_init(init, cfg, seed, init_std);
    model_set_params(m, init);
    free(init);
    int half = cfg->HD / 2;
    float *cs = (float *)malloc_check((size_t)cfg->T * half * 2 * sizeof(float));
    for (int t = 0; t < cfg->T; t++) {
        for (int i = 0; i < half; i++) {
            double angle = t * pow(10000.0, -2.0 * i / cfg->HD);
            cs[t * half + i] = (float)cos(angle);
            cs[(size_t)cfg->T * half + t * half + i] = (float)sin(angle);
        }
    }
    cudaCheck(cudaMalloc(&m->rope_cos, (size_t)cfg->T * half * 2 * sizeof(float)));
    m->rope_sin = m->rope_cos + (size_t)cfg->T * half;
    cudaCheck(cudaMemcpy(m->rope_cos, cs, (size_t)cfg->T * half * 2 * sizeof(float), cudaMemcpyHostToDevice));
    free(cs);
    int J = 2 * cfg->L + 1;
    int *src = (int *)calloc_check((size_t)J * J, sizeof(int));
    m->pair_off = (size_t *)malloc_check((J + 1) * sizeof(size_t));
    m->site_n = (int *)malloc_check(J * sizeof(int));
    m->pair_off[0] = 0;
    for (int j = 0; j < J; j++) {
        m->site_n[j] = site_sources(cfg, j, src + (size_t)j * J);
        m->pair_off[j + 1] = m->pair_off[j] + m->site_n[j];
    }
    cudaCheck(cudaMalloc(&m->site_src, (size_t)J * J * sizeof(int)));
    cudaCheck(cudaMemcpy(m->site_src, src, (size_t)J * J * sizeof(int), cudaMemcpyHostToDevice));
    // the other way round, for the slot gathers: the sites reading slot k and the pair of each
    int *rd = (int *)calloc_check((size_t)2 * J * J, sizeof(int)), *rd_pair = rd + (size_t)J * J;
    int *off = (int *)malloc_check((J + 1) * sizeof(int));
    m->slot_nr = (int *)calloc_check(J, sizeof(int));
    for (int j = 0; j < J; j++) {
        off[j] = (int)m->pair_off[j];
        for (int i = 0; i < m->site_n[j]; i++) {
            int k = src[(size_t)j * J + i], x = m->slot_nr[k]++;
            rd[(size_t)k * J + x] = j;
            rd_pair[(size_t)k * J + x] = (int)m->pair_off[j] + i;
        }
    }
    off[J] = (int)m->pair_off[J];
    cudaCheck(cudaMalloc(&m->slot_rd, (size_t)2 * J * J * sizeof(int)));
    m->slot_rd_pair = m->slot_rd + (size_t)J * J;
    cudaCheck(cudaMemcpy(m->slot_rd, rd, (size_t)2 * J * J * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&m->d_pair_off, (J + 1) * sizeof(int)));
    cudaCheck(cudaMemcpy(m->d_pair_off, off, (J + 1) * sizeof(int), cudaMemcpyHostToDevice));
    // the routing forward's groups (route_fwd_plan): at most MHAR_FWD_GROUP sites (default 4; 1: every
    // site alone, the plain kernel) and what the layout's kernels hold; by cost (route_fwd_plan), or wherever the slots
    // allow with MHAR_FWD_PLAN=all (the GPU checks, to run the grouped kernels on small models)
    m->fwd_lead = (int *)malloc_check(J * sizeof(int));
    m->fwd_kmax = 1;
    m->fwd_v14 = m->fwd_v14_asked = m->gather_lean = m->qg_rows = 0;
    for (int j = 0; j < J; j++) { m->fwd_lead[j] = j; }
    if (cfg->mode == RES_MHAR) {
        m->route_geo = route_geometry(cfg->C, cfg->H);
        // the routing forward's kernel: v14 (default: route_forward14_kernel, bf16 VEC = 8 layouts with
        // C <= 1024; others have only v13) or MHAR_FWD_KERNEL=v13 (route_forward_kernel everywhere)
        const char *fk = getenv("MHAR_FWD_KERNEL");
        m->fwd_v14_asked = 1;
        if (fk != NULL && fk[0] != '\0' && strcmp(fk, "v14") != 0) {
            if (strcmp(fk, "v13") != 0) { die("MHAR_FWD_KERNEL=%s: give v13 or v14 (the default)", fk); }
            m->fwd_v14_asked = 0;
        }
        m->fwd_v14 = m->fwd_v14_asked && route_fwd14_layout(m->route_geo) ? 1 : 0;
        // the slot gather's path: lean where its layout allows (default) or MHAR_GATHER=old (the
        // previous path everywhere: an A/B in one binary; the same sums in the same order)
        const char *ga = getenv("MHAR_GATHER");
        if (ga != NULL && ga[0] != '\0' && strcmp(ga, "old") != 0 && strcmp(ga, "lean") != 0) {
            die("MHAR_GATHER=%s: give old or lean (the default)", ga);
        }
        m->gather_lean = !(ga != NULL && strcmp(ga, "old") == 0);
        // the q/gamma pass: on tensor cores where the shape allows (bf16; default) or MHAR_QGAMMA=cuda (the
        // CUDA-core pass everywhere: an A/B in one binary; only dq and dgamma move, by fp32 rounding)
        const char *qe = getenv("MHAR_QGAMMA");
        if (qe != NULL && qe[0] != '\0' && strcmp(qe, "cuda") != 0 && strcmp(qe, "tc") != 0) {
            die("MHAR_QGAMMA=%s: give cuda or tc (the default)", qe);
        }
        const char *qr = getenv("MHAR_QGAMMA_ROWS");
        m->qg_rows = qr != NULL && qr[0] != '\0' ? atoi(qr) : 128;
        if (m->qg_rows < 128 || m->qg_rows % ROUTE_QG_TC_TP != 0) {
            die("MHAR_QGAMMA_ROWS=%s: give the positions a q/gamma partition has, a multiple of %d from 128 up "
                "(default 128)", qr, ROUTE_QG_TC_TP);
        }
        if (sizeof(floatX) != 2 || (qe != NULL && strcmp(qe, "cuda") == 0)) { m->qg_rows = 0; }
        const char *e = getenv("MHAR_FWD_GROUP"), *pl = getenv("MHAR_FWD_PLAN");
        int want = e != NULL && e[0] != '\0' ? atoi(e) : 4;
        if (want < 1) { die("MHAR_FWD_GROUP=%s: give the most sites a routing forward group has (1: no groups)", e); }
        int kmax = want < route_fwd_kmax(m->route_geo) ? want : route_fwd_kmax(m->route_geo);
        int all = pl != NULL && strcmp(pl, "all") == 0;
        m->fwd_starts = route_fwd_plan(J, m->site_n, src, J, cfg->C, cfg->H, (int)sizeof(floatX), kmax, all,
                                       m->fwd_lead);
        for (int j = 0; j < J; j++) {   // the largest group made (sizes the partials)
            if (j - m->fwd_lead[j] + 1 > m->fwd_kmax) { m->fwd_kmax = j - m->fwd_lead[j] + 1; }
        }
    }
    free(src); free(rd); free(off);
}

// Lay out tensors of mixed element sizes in one device allocation (each 256-byte aligned, zeroed).
typedef struct { void **ptr; size_t count, elem; } TensorSpec;
void *alloc_tensors(TensorSpec *spec, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) { total += (spec[i].count * spec[i].elem + 255) / 256 * 256; }
    char *mem;
    cudaCheck(cudaMalloc((void **)&mem, total > 0 ? total : 256));
    zero(mem, total);
    char *p = mem;
    for (int i = 0; i < n; i++) { *spec[i].ptr = p; p += (spec[i].count * spec[i].elem + 255) / 256 * 256; }
    return mem;
}

// Allocate activations for batches of up to B x T (once).
void model_alloc_acts(Model *m, int B, int T) {
    const Config *c = &m->cfg;
    size_t N = (size_t)B * T, C = c->C, L = c->L, J = 2 * L + 1, F = c->F;
    size_t QD = (size_t)c->NH * c->HD, KVD = (size_t)c->NKV * c->HD;
    int mhar = c->mode == RES_MHAR;
    size_t pairs = mhar ? m->pair_off[J] : 0;
    int any_chain = 0;   // does some slot chain (std, block mode)? Then a->out is needed
    for (size_t j = 0; j + 1 < J; j++) { any_chain |= slot_chains(c, (int)j); }
    Acts *a = &m->acts;
    const size_t X = sizeof(floatX), S = sizeof(float);
    TensorSpec as[NUM_ACT_TENSORS] = {
        {(void **)&a->slots, J * N * C, X}, {(void **)&a->slot_r, mhar ? J * N : 0, S},
        {(void **)&a->route_lse, mhar ? J * N * c->H : 0, S}, {(void **)&a->route_qg, mhar ? J * C : 0, S},
        {(void **)&a->h, mhar ? J * N * C : 0, X},
        {(void **)&a->ln, mhar ? N * C : J * N * C, X}, {(void **)&a->ln_rstd, J * N, S},
        {(void **)&a->qr, L * N * QD, X}, {(void **)&a->kr, L * N * KVD, X},
        {(void **)&a->q, L * N * QD, X}, {(void **)&a->k, L * N * KVD, X}, {(void **)&a->v, L * N * KVD, X},
        {(void **)&a->q_rstd, L * N * c->NH, S}, {(void **)&a->k_rstd, L * N * c->NKV, S},
        {(void **)&a->att_lse, L * N * c->NH, S}, {(void **)&a->atty, L * N * QD, X},
        {(void **)&a->mg, L * N * F, X}, {(void **)&a->mu, L * N * F, X}, {(void **)&a->mh, L * N * F, X},
        {(void **)&a->out, any_chain ? N * C : 0, X}, {(void **)&a->logits, N * c->Vp, X},
        {(void **)&a->losses, N, S}, {(void **)&a->ce_lse, N, S}};
    m->acts_mem = alloc_tensors(as, NUM_ACT_TENSORS);

    GradActs *g = &m->gacts;
    // routing scratch: site partials (N/32 blocks) and slot partials (N/128 partitions x up to J readers)
    size_t route_parts = mhar ? ceil_div(N, ROUTE_POS_PER_BLOCK) : 0;
    size_t route_qparts = mhar ? ceil_div(N, ROUTE_PART_ROWS) * J : 0;
    // the grouped forward's partials go into route_G (written and read only in backward) when they
    // fit (bf16 with groups of 4: whenever L >= 3), else into a buffer of their own
    size_t fwdp = mhar ? (size_t)(m->fwd_kmax - 1) * N * (C + c->H) : 0;
    int fwdp_in_G = fwdp * sizeof(float) <= J * N * C * sizeof(floatX);
    TensorSpec gs[NUM_GRAD_ACT_TENSORS] = {
        {(void **)&g->dslots, N * C, S}, {(void **)&g->dln, N * C, S},
        {(void **)&g->dout, N * C, X}, {(void **)&g->datty, N * QD, X},
        {(void **)&g->dq, N * QD, S}, {(void **)&g->dqr, N * QD, X},
        {(void **)&g->dk, N * KVD, S}, {(void **)&g->dkr, N * KVD, X},
        {(void **)&g->dv, N * KVD, X}, {(void **)&g->dmh, N * F, X}, {(void **)&g->dmg, N * F, X},
        {(void **)&g->dmu, N * F, X},
        {(void **)&g->route_G, mhar ? J * N * C : 0, X}, {(void **)&g->route_S, mhar ? J * N * c->H : 0, S},
        {(void **)&g->route_dsr, mhar ? N * c->H * route_nrp((int)J) : 0, S}, {(void **)&g->route_part, route_parts * C, S},
        {(void **)&g->route_qpart, route_qparts * C, S},
        {(void **)&g->route_qv, pairs * C, S}, {(void **)&g->route_fwdp, fwdp_in_G ? 0 : fwdp, S},
        {(void **)&g->att_D, N * c->NH, S}, {(void **)&g->partial, (size_t)RED_PARTS_MAX * C, S}};
    m->gacts_mem = alloc_tensors(gs, NUM_GRAD_ACT_TENSORS);
    if (fwdp_in_G) { g->route_fwdp = (float *)g->route_G; }   // (256-byte aligned, as every tensor here)

    cudaCheck(cudaMalloc(&m->d_inputs, N * sizeof(int)));
    cudaCheck(cudaMalloc(&m->d_targets, N * sizeof(int)));
    cudaCheck(cudaMalloc(&m->enc_scratch, (3 * N + 1) * sizeof(int)));
    m->inputs = (int *)calloc_check(N, sizeof(int));
    m->targets = (int *)calloc_check(N, sizeof(int));
    m->losses_host = (float *)calloc_check(N, sizeof(float));
    m->maxB = B; m->maxT = T;
#ifndef TESTING
    const char *fwd_kernel = m->fwd_v14 ? "kernel v14 (MHAR_FWD_KERNEL=v13: the previous one)"
                             : m->fwd_v14_asked ? "kernel v13 (this layout has no v14)"
                                                : "kernel v13 (MHAR_FWD_KERNEL=v13)";
    if (mhar && m->fwd_kmax > 1) {
        printf("routing forward: groups of up to %d sites, %d of %zu sites start from a partial (partials %s; "
               "MHAR_FWD_GROUP=1: none); %s\n", m->fwd_kmax, m->fwd_starts, J, fwdp_in_G ? "in route_G" : "own buffer",
               fwd_kernel);
    } else if (mhar) {
        printf("routing forward: every site alone (no group pays at this shape, or MHAR_FWD_GROUP=1); %s\n", fwd_kernel);
    }
#endif
    if (mhar) {   // the lean gather's index math for this shape, on the CPU (dies on a mismatch)
        int *rd = (int *)malloc_check(J * J * sizeof(int));
        cudaCheck(cudaMemcpy(rd, m->slot_rd, J * J * sizeof(int), cudaMemcpyDeviceToHost));
        int lean = route_gather_index_check(m->route_geo, rd, m->slot_nr, J, N);
        free(rd);
#ifndef TESTING
        int qtc = 0;   // the slots whose q/gamma pass runs on tensor cores
        for (size_t k = 0; k < J; k++) { qtc += m->qg_rows > 0 && route_qg_tc_fits(c->C, c->H, m->slot_nr[k]); }
        printf("routing gather: lean path (v12) for %d of %zu slots%s, index check at N = %zu passed; q/gamma pass on "
               "tensor cores for %d%s\n", lean, J, m->gather_lean ? "" : " (off: MHAR_GATHER=old)", N, qtc,
               m->qg_rows > 0 ? "" : " (MHAR_QGAMMA=cuda)");
#else
        (void)lean;
#endif
    }
}

// Attention sublayer of block l: out (N, C) = Wo attn(rope(qknorm(Wq u)), ...)
void attention_sublayer_forward(Model *m, int l, const floatX *u, floatX *out, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    ParamTensors<floatX> *p = &m->params;
    size_t N = (size_t)B * T, C = c->C, HD = c->HD, QD = c->NH * HD, KVD = c->NKV * HD;
    floatX *qr = a->qr + l * N * QD, *kr = a->kr + l * N * KVD;
    floatX *q = a->q + l * N * QD, *k = a->k + l * N * KVD, *v = a->v + l * N * KVD;
    float *q_rstd = a->q_rstd + l * N * c->NH, *k_rstd = a->k_rstd + l * N * c->NKV;
    float *lse = a->att_lse + l * N * c->NH;
    floatX *atty = a->atty + l * N * QD;
    prof("fwd matmul qkv");
    matmul_forward(qr, u, p->wq + l * QD * C, N, C, QD);
    matmul_forward(kr, u, p->wk + l * KVD * C, N, C, KVD);
    matmul_forward(v, u, p->wv + l * KVD * C, N, C, KVD);
    prof("fwd qk-norm + rope");
    qknorm_rope_forward(q, q_rstd, qr, p->qnw + l * HD, m->rope_cos, m->rope_sin, B, T, c->NH, HD);
    qknorm_rope_forward(k, k_rstd, kr, p->knw + l * HD, m->rope_cos, m->rope_sin, B, T, c->NKV, HD);
    prof("fwd attention");
    attention_forward(atty, lse, q, k, v, B, T, c->NH, c->NKV, HD);
    prof("fwd matmul o");
    matmul_forward(out, atty, p->wo + l * C * QD, N, QD, C);
}

// dln (N, C) = gradient of the input u (set by the first matmul, then added
// to), given dout (floatX); weight grads += but for Wq, Wk, Wv, which read u:
// attention_sublayer_weight_backward adds those once the site's backward has
// recomputed u (mhar keeps one u buffer)
void attention_sublayer_backward(Model *m, int l, const floatX *dout, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    ParamTensors<floatX> *p = &m->params;
    ParamTensors<float> *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, HD = c->HD, QD = c->NH * HD, KVD = c->NKV * HD;
    floatX *qr = a->qr + l * N * QD, *kr = a->kr + l * N * KVD;
    floatX *q = a->q + l * N * QD, *k = a->k + l * N * KVD, *v = a->v + l * N * KVD;
    float *q_rstd = a->q_rstd + l * N * c->NH, *k_rstd = a->k_rstd + l * N * c->NKV;
    float *lse = a->att_lse + l * N * c->NH;
    floatX *atty = a->atty + l * N * QD;
    // out = atty . Wo^T. datty is floatX: the matmul sums in fp32 and rounds
    // once; in the bf16 build the flash kernels take it as bf16 mma operands
    // anyway, and their D = rowsum(datty * atty) then comes from the very
    // values that make dP, as dS = P (dP - D) needs (D = sum_j P dP).
    prof("bwd matmul o");
    matmul_backward(g->datty, dp->wo + l * C * QD, dout, atty, p->wo + l * C * QD, N, QD, C, DINP_SET);
    // atty = attention(q, k, v): writes dq, dk (fp32, from fp32 accumulators:
    // no rounding before RoPE and the QK-norm backward, whose projection
    // -s^3/D (g.x) x can cancel) and dv (floatX: only the Wv matmul reads it)
    prof("bwd attention");
    attention_backward(g->dq, g->dk, g->dv, g->att_D, g->datty, atty, lse, q, k, v, B, T, c->NH, c->NKV, HD);
    // q = rope(qn), k = rope(kn)
    prof("bwd qk-norm + rope");
    // q = rope(rmsnorm(qr; qnw)), k = rope(rmsnorm(kr; knw)): writes dqr, dkr
    qknorm_rope_backward(g->dqr, dp->qnw + l * HD, g->dq, qr, q_rstd, p->qnw + l * HD, m->rope_cos, m->rope_sin,
                         B, T, c->NH, HD, g->partial);
    qknorm_rope_backward(g->dkr, dp->knw + l * HD, g->dk, kr, k_rstd, p->knw + l * HD, m->rope_cos, m->rope_sin,
                         B, T, c->NKV, HD, g->partial);
    prof("bwd matmul qkv");
    // qr = u Wq^T, kr = u Wk^T, v = u Wv^T: dln
    matmul_backward_inp(g->dln, g->dqr, p->wq + l * QD * C, N, C, QD, DINP_SET);
    matmul_backward_inp(g->dln, g->dkr, p->wk + l * KVD * C, N, C, KVD, DINP_ADD);
    matmul_backward_inp(g->dln, g->dv, p->wv + l * KVD * C, N, C, KVD, DINP_ADD);
}
// the rest of its backward: dWq, dWk, dWv += from the dqr, dkr, dv it left and the input u
void attention_sublayer_weight_backward(Model *m, int l, const floatX *u, int B, int T) {
    const Config *c = &m->cfg;
    GradActs *g = &m->gacts;
    ParamTensors<float> *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, QD = c->NH * c->HD, KVD = c->NKV * c->HD;
    prof("bwd matmul qkv");
    // qr = u Wq^T, kr = u Wk^T, v = u Wv^T: the weights
    matmul_backward_weight(dp->wq + l * QD * C, g->dqr, u, N, C, QD);
    matmul_backward_weight(dp->wk + l * KVD * C, g->dkr, u, N, C, KVD);
    matmul_backward_weight(dp->wv + l * KVD * C, g->dv, u, N, C, KVD);
}

// MLP sublayer of block l: out (N, C) = Wd (silu(Wg u) * (Wu u))
void mlp_sublayer_forward(Model *m, int l, const floatX *u, floatX *out, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    ParamTensors<floatX> *p = &m->params;
    size_t N = (size_t)B * T, C = c->C, F = c->F;
    floatX *mg = a->mg + l * N * F, *mu = a->mu + l * N * F, *mh = a->mh + l * N * F;
    prof("fwd matmul gate/up");
    matmul_forward(mg, u, p->wg + l * F * C, N, C, F);
    matmul_forward(mu, u, p->wu + l * F * C, N, C, F);
    prof("fwd swiglu");
    swiglu_forward(mh, mg, mu, N * F);
    prof("fwd matmul down");
    matmul_forward(out, mh, p->wd + l * C * F, N, F, C);
}

// dln (N, C) = gradient of the input u (set, then added to), given dout; weight
// grads += but for Wg, Wu (mlp_sublayer_weight_backward, as for attention)
void mlp_sublayer_backward(Model *m, int l, const floatX *dout, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    ParamTensors<floatX> *p = &m->params;
    ParamTensors<float> *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, F = c->F;
    floatX *mg = a->mg + l * N * F, *mu = a->mu + l * N * F, *mh = a->mh + l * N * F;
    // out = mh Wd^T
    prof("bwd matmul down");
    matmul_backward(g->dmh, dp->wd + l * C * F, dout, mh, p->wd + l * C * F, N, F, C, DINP_SET);
    // mh = silu(mg) * mu   (writes dmg, dmu)
    prof("bwd swiglu");
    swiglu_backward(g->dmg, g->dmu, g->dmh, mg, mu, N * F);
    // mg = u Wg^T, mu = u Wu^T: dln
    prof("bwd matmul gate/up");
    matmul_backward_inp(g->dln, g->dmg, p->wg + l * F * C, N, C, F, DINP_SET);
    matmul_backward_inp(g->dln, g->dmu, p->wu + l * F * C, N, C, F, DINP_ADD);
}
// the rest of its backward: dWg, dWu += from the dmg, dmu it left and the input u
void mlp_sublayer_weight_backward(Model *m, int l, const floatX *u, int B, int T) {
    const Config *c = &m->cfg;
    GradActs *g = &m->gacts;
    ParamTensors<float> *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, F = c->F;
    prof("bwd matmul gate/up");
    // mg = u Wg^T, mu = u Wu^T: the weights
    matmul_backward_weight(dp->wg + l * F * C, g->dmg, u, N, C, F);
    matmul_backward_weight(dp->wu + l * F * C, g->dmu, u, N, C, F);
}

#define SLOT(j) (a->slots + (size_t)(j) * N * C)
// u_j: std keeps every site's; mhar one buffer (Acts.ln)
#define ULN(j) (a->ln + (m->cfg.mode == RES_STD ? (size_t)(j) * N * C : 0))
#define SITE_SRC(j) (m->site_src + (size_t)(j) * (2 * m->cfg.L + 1))
#define SLOT_RD(k) (m->slot_rd + (size_t)(k) * (2 * m->cfg.L + 1))
#define SLOT_RD_PAIR(k) (m->slot_rd_pair + (size_t)(k) * (2 * m->cfg.L + 1))

// The norm weight of site j (C) and its gradient: ln1w of block j/2 before an
// attention sublayer (j even), ln2w before an MLP (j odd), lnfw at j = 2L.
const floatX *site_norm_w(Model *m, int j) {
    const ParamTensors<floatX> *p = &m->params;
    size_t C = m->cfg.C, l = j / 2;
    return j == 2 * m->cfg.L ? p->lnfw : (j % 2 == 0 ? p->ln1w : p->ln2w) + l * C;
}
float *site_norm_dw(Model *m, int j) {
    ParamTensors<float> *dp = &m->grads;
    size_t C = m->cfg.C, l = j / 2;
    return j == 2 * m->cfg.L ? dp->lnfw : (j % 2 == 0 ? dp->ln1w : dp->ln2w) + l * C;
}

#ifdef CHECK_U_RECOMPUTE
// Debug build (-DCHECK_U_RECOMPUTE, mhar): keeps a copy of every site's forward
// u_j and compares the backward's recomputed u_j with it byte for byte.
floatX *u_saved = NULL;
int u_checked = 0, u_differ = 0;
void u_check(Model *m, int j, const floatX *u, size_t N, int save) {
    size_t bytes = N * m->cfg.C * sizeof(floatX);
    if (u_saved == NULL) { cudaCheck(cudaMalloc(&u_saved, (2 * m->cfg.L + 1) * bytes)); }
    char *slot = (char *)u_saved + j * bytes;
    if (save) { cudaCheck(cudaMemcpy(slot, u, bytes, cudaMemcpyDeviceToDevice)); return; }
    char *a = (char *)malloc_check(2 * bytes);
    cudaCheck(cudaMemcpy(a, slot, bytes, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(a + bytes, u, bytes, cudaMemcpyDeviceToHost));
    u_checked++; u_differ += memcmp(a, a + bytes, bytes) != 0;
    free(a);
    if (j == 0) { printf("u recompute check: %d sites, %d differ: %s\n", u_checked, u_differ, u_differ ? "FAIL" : "bit-identical"); }
}
#endif

// The normalised input u_j = rmsnorm(h_j; w) of sublayer j (j = 2L: of the LM
// head), written into ULN(j) with its rstd; returns u_j. std: h_j is the
// residual stream x_j = slot j; site 0 normalises the embedding here, and each
// later site's norm was computed with its slot by residual_norm_forward. mhar:
// h_j = route_j over the slots of site j's sources, and route_forward applies
// the norm in the same kernel (keeping h_j and lse_j for backward).
// Grouped (m->fwd_lead): a group's first site also writes the partials of
// the group's other sites into route_fwdp, and each of those starts from its
// own and reads only the sources after its leader's.
floatX *site_forward(Model *m, int j, size_t N, const floatX *w) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    size_t C = c->C, H = c->H, J = 2 * (size_t)c->L + 1;
    floatX *u = ULN(j);
    float *rstd = a->ln_rstd + (size_t)j * N;
    if (c->mode == RES_STD) {
        if (j == 0) { rmsnorm_forward(u, rstd, SLOT(0), w, N, c->C); }
        return u;
    }
    // partial x (site lead + 1 + x): hbar (N, C) at ph + x N C, lse_p (N, H) at pl + x N H
    const int lead = m->fwd_lead[j];
    float *ph = m->gacts.route_fwdp, *pl = ph + (size_t)(m->fwd_kmax - 1) * N * C;
    int kx = 0;
    while (lead == j && (size_t)(j + kx + 1) < J && m->fwd_lead[j + kx + 1] == j) { kx++; }
    RoutePartials out = {kx > 0 ? ph : NULL, kx > 0 ? pl : NULL}, in = {NULL, NULL};
    int n0 = 0;   // sources already in the partial
    if (lead != j) {
        in.ph = ph + (size_t)(j - lead - 1) * N * C;
        in.pl = pl + (size_t)(j - lead - 1) * N * H;
        n0 = m->site_n[lead];
    }
    route_forward(u, rstd, a->h + (size_t)j * N * C, a->route_lse + (size_t)j * N * H, a->slots, a->slot_r,
                  SITE_SRC(j) + n0, m->site_n[j] - n0, a->route_qg + (size_t)j * C, w, N, m->route_geo, kx, out, in,
                  m->fwd_v14);
#ifdef CHECK_U_RECOMPUTE
    u_check(m, j, u, N, 1);
#endif
    return u;
}

// Backward of site j's u_j = rmsnorm(h_j; w), given g->dln = dL/du_j; adds the
// norm weight's gradient into dw. std: h_j = slot j = x_j, and x_{j+1} = x_j +
// out_j, so dslots, which holds dL/dx_{j+1} (nothing at the last site), gets
// the norm's dL/dx_j added and becomes dL/dx_j; the same kernel writes its
// floatX copy g->dout, the dout of sublayer j-1. mhar: route_site_backward
// stores G_j = dL/dh_j and S_j, and recomputes u_j into u when u is not NULL
// (std keeps every u_j). Every site that reads slot j is >= j, so all of
// them have stored theirs by now: route_slot_backward gathers slot j's gradient
// into dslots, over the dslot j+1 it holds (added in when slot j+1 = out_j + slot j),
// and route_slot_qgamma sums its readers' shares of the q and gamma gradients.
void site_backward(Model *m, int j, size_t N, const floatX *w, float *dw, floatX *u) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    size_t C = c->C, H = c->H, J = 2 * (size_t)c->L + 1;
    if (c->mode == RES_STD) {
        rmsnorm_backward_residual(g->dslots, j > 0 ? g->dout : NULL, dw, g->dln, SLOT(j), a->ln_rstd + j * N, w, N,
                                  c->C, (size_t)j + 1 < J, g->partial);
        return;
    }
    prof("bwd route: site G, S");
    route_site_backward(g->route_G + j * N * C, g->route_S + j * N * H, dw, g->route_part, u, g->dln,
                        a->h + j * N * C, a->ln_rstd + j * N, w, N, m->route_geo);
    int chain = (size_t)j + 1 < J && slot_chains(c, j);
    // the fp32 dslot j is read by the gather of slot j-1 when slot j chains onto it, and by the encoder
    int keep32 = j == 0 || slot_chains(c, j - 1);
    prof("bwd route: slot gather");
    // dslot j (j > 0) is the output gradient of sublayer j-1: its floatX copy goes straight into g->dout
    route_slot_backward(g->dslots, j > 0 ? g->dout : NULL, g->route_dsr, SLOT(j), a->slot_r + j * N, g->route_G,
                        g->route_S, a->route_lse, SLOT_RD(j), m->slot_nr[j], a->route_qg, chain, keep32, N, J,
                        m->gather_lean, m->route_geo);
    prof("bwd route: q/gamma pass");
    route_slot_qgamma(g->route_qv, g->route_qpart, g->route_dsr, SLOT(j), SLOT_RD_PAIR(j), m->slot_nr[j], N, m->qg_rows,
                      m->route_geo);
}

// Forward pass on host inputs (B, T). With targets, also the per-position
// losses and their mean in m->loss; without, it stops at the logits (sampling).
// dloss: 0 when no backward follows (evaluation, sampling) or when the caller
// wants the logits; else the dloss of the model_backward that comes next. Then
// the cross-entropy's backward runs here too, fused with its forward
// (crossentropy_fused: one pass over the logits instead of two), and the logits
// buffer holds dlogits afterwards; model_backward skips that step.
void model_forward(Model *m, const int *inputs, const int *targets, int B, int T, float dloss) {
    const Config *c = &m->cfg;
    if (m->acts_mem == NULL) { model_alloc_acts(m, B, T); }
    if ((size_t)B * T > (size_t)m->maxB * m->maxT || T > m->maxT || T > c->T) {
        die("batch %dx%d exceeds the %dx%d the activations were sized for", B, T, m->maxB, m->maxT);
    }
    m->B = B; m->T = T;
    m->ce_dloss = 0;
    Acts *a = &m->acts;
    ParamTensors<floatX> *p = &m->params;
    size_t N = (size_t)B * T, C = c->C, L = c->L;
    int mhar = c->mode == RES_MHAR;
    memcpy(m->inputs, inputs, N * sizeof(int));
    prof("fwd encoder");
    cudaCheck(cudaMemcpy(m->d_inputs, inputs, N * sizeof(int), cudaMemcpyHostToDevice));
    encoder_forward(SLOT(0), m->d_inputs, p->wte, N, c->C);
    if (mhar) {
        route_qg_forward(a->route_qg, p->rq, p->rg, (2 * L + 1) * C);
        source_stat_forward(a->slot_r, SLOT(0), N, c->C);
    }
    for (size_t j = 0; j < 2 * L; j++) {
        size_t l = j / 2;
        prof("fwd route + norm");
        floatX *u = site_forward(m, (int)j, N, site_norm_w(m, (int)j));
        // slot j+1 = output of sublayer j, plus slot j when they chain (config.h): the
        // sublayer writes its output into slot j+1 itself when it does not chain
        int chain = slot_chains(c, (int)j);
        floatX *out = chain ? a->out : SLOT(j + 1);
        if (j % 2 == 0) { attention_sublayer_forward(m, (int)l, u, out, B, T); }
        else { mlp_sublayer_forward(m, (int)l, u, out, B, T); }
        prof("fwd residual + r");
        if (!mhar) {   // x_{j+1} = x_j + out_j, and site j+1's u_{j+1} = rmsnorm(x_{j+1}) with it
            residual_norm_forward(SLOT(j + 1), ULN(j + 1), a->ln_rstd + (j + 1) * N, SLOT(j), out,
                                  site_norm_w(m, (int)j + 1), N, c->C);
        } else if (chain) {   // block sum: slot j+1 = out_j + slot j, and its r
            residual_norm_forward(SLOT(j + 1), NULL, a->slot_r + (j + 1) * N, SLOT(j), out, NULL, N, c->C);
        } else {   // r of slot j+1 = out_j, which the sublayer wrote
            source_stat_forward(a->slot_r + (j + 1) * N, SLOT(j + 1), N, c->C);
        }
    }
    prof("fwd route + norm");
    floatX *uf = site_forward(m, (int)(2 * L), N, p->lnfw);
    // tied head over all Vp rows of wte: the padding rows are 0, and a row length of Vp (a
    // multiple of 128) keeps cuBLAS on its aligned tensor-core path (V = 50257 is odd)
    prof("fwd matmul head");
    matmul_forward(a->logits, uf, p->wte, N, c->C, c->Vp);
    if (targets == NULL) { return; }
    memcpy(m->targets, targets, N * sizeof(int));
    int fused = dloss != 0 && crossentropy_use_fused(c->Vp);
    prof(fused ? "fwd+bwd crossentropy" : "fwd crossentropy");
    cudaCheck(cudaMemcpy(m->d_targets, targets, N * sizeof(int), cudaMemcpyHostToDevice));
    if (fused) {   // losses, and dlogits over the logits (model_backward's first step)
        crossentropy_fused(a->logits, a->losses, a->ce_lse, a->logits, m->d_targets, dloss, N, c->V, c->Vp);
        m->ce_dloss = dloss;
    } else {
        crossentropy_forward(a->losses, a->ce_lse, a->logits, m->d_targets, N, c->V, c->Vp);
    }
    cudaCheck(cudaMemcpy(m->losses_host, a->losses, N * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (size_t n = 0; n < N; n++) { sum += m->losses_host[n]; }
    m->loss = (float)(sum / N);
}

// Called once per optimizer step, first: also where the step's timing starts.
void model_zero_grad(Model *m) {
    prof_step_begin();
    prof("zero grads");
    zero(m->grads_mem, m->nparams * sizeof(float));
}

// Backward pass of the last forward; adds into m->grads. dloss scales each
// position's loss: 1/(B*T) for the mean, divided again by the number of
// accumulated micro-batches. The logits buffer is reused for dlogits (already
// written by the forward when it was given this dloss: m->ce_dloss).
// Order: the final site, then for j = 2L-1 .. 0 sublayer j and site j. In mhar
// mode site j ends with the gather of slot j (site_backward), and the routing
// q and gamma gradients are summed once at the end (route_param_backward).
void model_backward(Model *m, float dloss) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    ParamTensors<floatX> *p = &m->params;
    ParamTensors<float> *dp = &m->grads;
    int B = m->B, T = m->T;
    size_t N = (size_t)B * T, C = c->C, L = c->L;
    // losses = crossentropy(softmax(logits)); logits = uf . wte[:V]^T
    floatX *dlogits = a->logits;   // the logits are spent: overwrite them in place
    if (m->ce_dloss == 0) {
        prof("bwd crossentropy");
        crossentropy_backward(dlogits, a->logits, a->ce_lse, m->d_targets, dloss, N, c->V, c->Vp);
    } else if (m->ce_dloss != dloss) {
        die("internal: model_backward with dloss %g after a forward given dloss %g", dloss, m->ce_dloss);
    }
    m->ce_dloss = 0;
    floatX *uf = ULN(2 * L);   // (mhar: the one u buffer still holds the final site's)
    prof("bwd matmul head");
    matmul_backward(g->dln, dp->wte, dlogits, uf, p->wte, N, c->C, c->Vp, DINP_SET);
    // uf = rmsnorm(h_final; lnfw)
    prof("bwd route + norm");
    site_backward(m, (int)(2 * L), N, p->lnfw, dp->lnfw, NULL);
    for (long jj = 2 * (long)L - 1; jj >= 0; jj--) {
        size_t j = (size_t)jj, l = j / 2;
        // slot j+1 = out_j (+ slot j): every site reading slot j+1 is done, so dslot j+1 is
        // complete; it is dL/dout_j. std: site j+1's norm backward wrote its floatX copy g->dout,
        // and dslots goes on to become dslot j in site j's (a chained slot passes its gradient on)
        // (mhar: route_slot_backward adds the chained slot's gradient, and its gather of slot
        // j+1 wrote the floatX copy into g->dout)
        if (j % 2 == 0) { attention_sublayer_backward(m, (int)l, g->dout, B, T); }
        else { mlp_sublayer_backward(m, (int)l, g->dout, B, T); }
        // u = rmsnorm(h_j; g_j). mhar keeps one u buffer: the site's backward recomputes u_j
        // into it, bit for bit, and the sublayer's weight gradients that read u come after
        floatX *u = ULN(j);
        prof("bwd route + norm");
        site_backward(m, (int)j, N, site_norm_w(m, (int)j), site_norm_dw(m, (int)j),
                      c->mode == RES_MHAR ? u : NULL);
#ifdef CHECK_U_RECOMPUTE
        if (c->mode == RES_MHAR) { u_check(m, (int)j, u, N, 0); }
#endif
        if (j % 2 == 0) { attention_sublayer_weight_backward(m, (int)l, u, B, T); }
        else { mlp_sublayer_weight_backward(m, (int)l, u, B, T); }
    }
    // slot 0 = wte[inputs]
    prof("bwd encoder");
    encoder_backward(dp->wte, g->dslots, m->inputs, N, c->C, m->enc_scratch);
    // s[h,i] = r_i (q_j gamma_j) . v_i at every site j: dq, dgamma from the gathers' per-pair sums
    prof("bwd route params");
    if (c->mode == RES_MHAR) {
        route_param_backward(dp->rq, dp->rg, g->route_qv, m->d_pair_off, p->rq, p->rg, (int)(2 * L + 1), c->C);
    }
}

#undef SLOT
#undef ULN
#undef SITE_SRC
#undef SLOT_RD
#undef SLOT_RD_PAIR

// ----------------------------------------------------------------------------
// Optimisation: global gradient norm, AdamW, learning-rate schedule

#define NORM_BLOCKS 512

// part[block] = sum of squares (fp64) of a fixed grid-stride share of g
__global__ void grad_norm_kernel(double *part, const float *g, size_t n) {
    __shared__ double sh[256];
    double s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        s += (double)g[i] * g[i];
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) { sh[threadIdx.x] += sh[threadIdx.x + w]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { part[blockIdx.x] = sh[0]; }
}

// L2 norm of all gradients: fixed per-block partials summed in order on the host.
double grad_norm(const Model *m) {
    prof("grad norm");
    double *d_part, part[NORM_BLOCKS];
    cudaCheck(cudaMalloc(&d_part, NORM_BLOCKS * sizeof(double)));
    grad_norm_kernel<<<NORM_BLOCKS, 256>>>(d_part, m->grads_mem, m->nparams);
    launchCheck();
    cudaCheck(cudaMemcpy(part, d_part, NORM_BLOCKS * sizeof(double), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d_part));
    double total = 0;
    for (int i = 0; i < NORM_BLOCKS; i++) { total += part[i]; }
    return sqrt(total);
}

__global__ void adamw_kernel(float *p, floatX *px, const float *grads, float *m1, float *m2, size_t n, float lr,
                             float beta1, float beta2, float eps, float decay, float gscale, float bc1, float bc2) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float g = grads[i] * gscale;
    float mi = beta1 * m1[i] + (1.0f - beta1) * g;
    float vi = beta2 * m2[i] + (1.0f - beta2) * g * g;
    m1[i] = mi;
    m2[i] = vi;
    float update = (mi / bc1) / (sqrtf(vi / bc2) + eps) + decay * p[i];
    float np = p[i] - lr * update;
    p[i] = np;
    if ((void *)px != (void *)p) { px[i] = fromF<floatX>(np); }   // the floatX copy (bf16 build)
}

// One AdamW step (decoupled weight decay on the matrices only, config.h) with
// the gradients multiplied by gscale (gradient clipping). t counts steps from 1.
// Updates the fp32 master and refreshes its floatX copy.
void adamw_update(Model *m, float lr, float beta1, float beta2, float eps, float wd, float gscale, int t) {
    if (m->adam_m == NULL) {
        cudaCheck(cudaMalloc(&m->adam_m, m->nparams * sizeof(float)));
        cudaCheck(cudaMalloc(&m->adam_v, m->nparams * sizeof(float)));
        zero(m->adam_m, m->nparams * sizeof(float));
        zero(m->adam_v, m->nparams * sizeof(float));
    }
    prof("adamw");
    float bc1 = 1 - powf(beta1, (float)t), bc2 = 1 - powf(beta2, (float)t);
    size_t off = 0;
    for (int ti = 0; ti < NUM_PARAM_TENSORS; ti++) {
        float decay = param_is_decayed(ti) ? wd : 0;
        size_t n = m->sizes[ti];
        if (n > 0) {
            adamw_kernel<<<ceil_div(n, 256), 256>>>(m->params_mem + off, m->paramsX_mem + off, m->grads_mem + off,
                                                    m->adam_m + off, m->adam_v + off, n, lr, beta1, beta2, eps,
                                                    decay, gscale, bc1, bc2);
            launchCheck();
        }
        off += n;
    }
    prof_step_end();
}


// ----------------------------------------------------------------------------
// Checkpoints (format in common/checkpoint.h): float32 master weights and
// AdamW state, the same files as train_mhar.c writes, so either trainer loads
// the other's. Tensors travel through a host buffer.

static void write_floats(FILE *f, const void *dev, size_t n, int elem, const char *path) {
    float *host = (float *)malloc_check(n * sizeof(float));
    cudaCheck(cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    if (elem == 4) { fwrite_check(host, sizeof(float), n, f, path); }
    else {
        for (size_t i = 0; i < n; i++) { double d = host[i]; fwrite_check(&d, sizeof(double), 1, f, path); }
    }
    free(host);
}

static void read_floats(FILE *f, void *dev, size_t n, int elem, const char *path) {
    float *host = (float *)malloc_check(n * sizeof(float));
    if (elem == 4) { fread_check(host, sizeof(float), n, f, path); }
    else {
        for (size_t i = 0; i < n; i++) { double d; fread_check(&d, sizeof(double), 1, f, path); host[i] = (float)d; }
    }
    cudaCheck(cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice));
    free(host);
}

static void *alloc_floats(size_t n) {
    void *p;
    cudaCheck(cudaMalloc(&p, n * sizeof(float)));
    zero(p, n * sizeof(float));
    return p;
}

// Save parameters (content CKPT_PARAMS), parameters + AdamW state (CKPT_TRAIN),
// or the gradients (CKPT_GRADS), via path.tmp and a rename.
void model_save(const Model *m, const char *path, CkptInfo info) {
    ckpt_save(path, &m->cfg, info, m->nparams, info.content == CKPT_GRADS ? m->grads_mem : m->params_mem,
              m->adam_m, m->adam_v, write_floats);
}

// Load a checkpoint into a model built with the same config (dies on any
// mismatch). Loads AdamW state too when the file has it.
void model_load(Model *m, const char *path, CkptInfo *info) {
    ckpt_load(path, &m->cfg, info, m->nparams, m->params_mem, (void **)&m->adam_m, (void **)&m->adam_v,
              read_floats, alloc_floats);
    if ((void *)m->paramsX_mem != (void *)m->params_mem) { cast(m->paramsX_mem, m->params_mem, m->nparams); }
}

void model_free(Model *m) {
    cudaCheck(cudaFree(m->params_mem)); cudaCheck(cudaFree(m->grads_mem));
    if ((void *)m->paramsX_mem != (void *)m->params_mem) { cudaCheck(cudaFree(m->paramsX_mem)); }
    cudaCheck(cudaFree(m->adam_m)); cudaCheck(cudaFree(m->adam_v));
    cudaCheck(cudaFree(m->acts_mem)); cudaCheck(cudaFree(m->gacts_mem));
    cudaCheck(cudaFree(m->rope_cos)); cudaCheck(cudaFree(m->site_src));
    cudaCheck(cudaFree(m->slot_rd)); cudaCheck(cudaFree(m->d_pair_off));
    cudaCheck(cudaFree(m->d_inputs)); cudaCheck(cudaFree(m->d_targets)); cudaCheck(cudaFree(m->enc_scratch));
    free(m->pair_off); free(m->site_n); free(m->slot_nr); free(m->fwd_lead);
    free(m->inputs); free(m->targets); free(m->losses_host);
}


// ----------------------------------------------------------------------------
// Training loop: common/train_loop.h (shared with train_mhar.c), with the GPU's hooks

static void device_init(char *desc, size_t n) {
    int ndev = 0;
    cudaError_t derr = cudaGetDeviceCount(&ndev);
    if (derr != cudaSuccess || ndev == 0) {
        die("no CUDA device (%s); run the CPU trainer train_mhar instead",
            derr != cudaSuccess ? cudaGetErrorString(derr) : "0 devices");
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    snprintf(desc, n, "%s on %.200s", PRECISION_NAME, prop.name);
}

static void device_sync(void) { cudaCheck(cudaDeviceSynchronize()); }

// GPU memory in use at the end of training, then release cuBLAS
static void device_finish(char *desc, size_t n) {
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    snprintf(desc, n, "GPU memory in use %.1f MiB of %.1f MiB; ", (total_b - free_b) / 1048576.0, total_b / 1048576.0);
    if (cublas != NULL) { cublasCheck(cublasDestroy(cublas)); cublas = NULL; }
}

// row t of the last forward's logits, copied to the host as float
static void model_logits_row(Model *m, int t, float *out) {
    int V = m->cfg.V;
    floatX *row = (floatX *)malloc_check((size_t)V * sizeof(floatX));
    cudaCheck(cudaMemcpy(row, m->acts.logits + (size_t)t * m->cfg.Vp, (size_t)V * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (int i = 0; i < V; i++) { out[i] = toF(row[i]); }
    free(row);
}

#include "common/train_loop.h"

}  // namespace

// ----------------------------------------------------------------------------
// The test API (common/gpu_api.h): built with -DTESTING instead of main.
#ifdef TESTING
extern "C" {

int MHAR_API(device_check)(char *why, size_t why_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) { snprintf(why, why_len, "%s", cudaGetErrorString(e)); cudaGetLastError(); return 0; }
    if (n == 0) { snprintf(why, why_len, "cudaGetDeviceCount reports 0 devices"); return 0; }
    return n;
}

void *MHAR_API(create)(const Config *cfg, const float *params, int maxB, int maxT) {
    Model *m = (Model *)malloc_check(sizeof(Model));
    model_build(m, cfg, 0, 0.02f);
    model_set_params(m, params);
    model_alloc_acts(m, maxB, maxT);
    return m;
}

double MHAR_API(forward_backward)(void *model, const int *inputs, const int *targets, int B, int T, float *logits,
                                  float *grads) {
    Model *m = (Model *)model;
    size_t N = (size_t)B * T;
    model_zero_grad(m);
    float dloss = (float)(1.0 / N);
    if (logits != NULL) {   // from a forward without targets: the training forward below writes dlogits over them
        model_forward(m, inputs, NULL, B, T, 0);
        size_t n = N * m->cfg.V, V = m->cfg.V, Vp = m->cfg.Vp;
        floatX *tmp = (floatX *)malloc_check(n * sizeof(floatX));   // the V real columns of each row
        cudaCheck(cudaMemcpy2D(tmp, V * sizeof(floatX), m->acts.logits, Vp * sizeof(floatX), V * sizeof(floatX), N,
                               cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) { logits[i] = toF(tmp[i]); }
        free(tmp);
    }
    model_forward(m, inputs, targets, B, T, dloss);   // as a training step: the fused cross-entropy
    model_backward(m, dloss);
    if (grads != NULL) { cudaCheck(cudaMemcpy(grads, m->grads_mem, m->nparams * sizeof(float), cudaMemcpyDeviceToHost)); }
    return m->loss;
}

double MHAR_API(train_step)(void *model, const int *inputs, const int *targets, int B, int T, float lr, float beta1,
                            float beta2, float eps, float wd, float clip, int t, double *norm_out) {
    Model *m = (Model *)model;
    model_zero_grad(m);
    float dloss = (float)(1.0 / ((double)B * T));
    model_forward(m, inputs, targets, B, T, dloss);
    model_backward(m, dloss);
    double norm = grad_norm(m);
    float gscale = clip > 0 && norm > clip ? (float)(clip / norm) : 1.0f;
    adamw_update(m, lr, beta1, beta2, eps, wd, gscale, t);
    cudaCheck(cudaDeviceSynchronize());
    if (norm_out != NULL) { *norm_out = norm; }
    return m->loss;
}

void MHAR_API(get_params)(void *model, float *params) {
    Model *m = (Model *)model;
    cudaCheck(cudaMemcpy(params, m->params_mem, m->nparams * sizeof(float), cudaMemcpyDeviceToHost));
}

void MHAR_API(free)(void *model) {
    model_free((Model *)model);
    free(model);
}

}  // extern "C"
#endif

// ----------------------------------------------------------------------------
// Training loop
#ifndef TESTING
int main(int argc, char **argv) { return train_main(argc, argv); }
#endif
