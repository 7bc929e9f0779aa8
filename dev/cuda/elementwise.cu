/*
dev/cuda/elementwise.cu: kernel lab for the three bf16 memory-bound ops of the
CUDA trainer (issue 5, "CUDA trainer speed"): cross-entropy, QK-norm + RoPE,
and SwiGLU. The v2/v3 kernels of these ops went into train_mhar.cu without a
lab file first; this file catches up, so that each version can be validated
against a CPU reference and timed on its own.

Build (from the repository root; or `make lab`):
    nvcc -O3 -arch=sm_90a -o dev/cuda/elementwise dev/cuda/elementwise.cu
Run:
    ./elementwise --cpu-selftest            the fp64 references vs central differences; no GPU needed
    ./elementwise --bytes                   byte counts and floors per step (100m, 1b); no GPU needed
    ./elementwise --op OP --version N --check   version N of OP against the fp64 reference, twice
                                                (the two runs must be bit-identical)
    ./elementwise --op OP --version N --bench   version N of OP timed at the trainer's shapes
    ./elementwise --all                     --check and --bench of every op and version
  OP: ce (cross-entropy), qk (QK-norm + RoPE), swiglu; without --op: every op.
  Without --version: every version of the op (ce, qk and swiglu 1-4). Neither --check nor --bench: both.
  options: --seed S (inputs; default 1234), --reps R (timed repeats, default 20),
           --quick (--check on the small shapes only: for compute-sanitizer)

The ops (SPEC section 3; CPU: train_mhar.c; GPU: train_mhar.cu):
  ce      logits (N, Vp) bf16, rows padded from V real columns to Vp (a multiple
          of 128), targets (N) int. Forward: losses (N) = lse - logit[target],
          lse (N) = log sum_{i<V} exp(logit[i]), fp32. Backward, in place:
          dlogits = (softmax - onehot(target)) * dloss for i < V, 0 in the padding
          columns, bf16 over the logits. 100m: N = B*T = 32768, V = 50257, Vp = 50304.
  qk      rows = B*T*nh vectors of HD (bf16), in (b, t, h) order. Forward:
          out = rope(rmsnorm(inp; w)), w (HD) bf16, eps 1e-6, rotate-half RoPE
          (pairs (i, i + HD/2) turn by the angle at t; cos, sin tables (T, HD/2)
          fp32), rstd (rows) fp32 kept. Backward: dinp (bf16) from dout (fp32, as
          attention's backward writes it), dw (HD) fp32 += (deterministic: per-block
          partials summed in a fixed order). 100m: B=16, T=2048, nh=8 (q) and 4 (k),
          HD=64, 12 layers; 1b: B=16, T=1024, nh=16 and 8, HD=128, 18 layers.
  swiglu  n = N*F elements: out = silu(g) * u (bf16); backward dg, du (bf16) from
          dout (fp32). 100m: N = 32768, F = 1536, 12 layers.

Versions (NOTES_elementwise.md has the byte counts, floors and H200 figures):
  ce  v1  the trainer's kernels at 3dc0648: forward two passes over the row
          (block_max, then block_sum), scalar 2-byte loads; backward one thread
          per element with a 64-bit division per element.
      v2  the current trainer's: forward one pass with an online softmax over
          16-byte packs; backward one block per row over packs.
      v3  forward and backward fused in one kernel (in train_mhar.cu since branch ew; needs
          dloss at forward time); the row is staged in shared memory so the
          logits are read from HBM once: saves the forward's 3.3 GB read.
      v4  v3's arithmetic (the same bits) in a persistent grid, one block of 512
          threads an SM with 2 row buffers in shared memory (201 KB at Vp = 50304):
          the next row arrives by TMA bulk copies (sm_90) while the block reduces
          the current one and writes its dlogits, so an SM's loads never wait for
          its reductions and writes (v3: read phase, then write phase, a block per
          row). --check also runs v3 and says whether the outputs are bit-identical.
  qk  v1  the trainer's kernels at 3dc0648: rmsnorm_forward_kernel, then
          rope_forward_kernel in place; backward zero + rope_backward_kernel into
          an fp32 scratch, zero + rmsnorm_backward_kernel, rmsnorm_dw_partial_kernel,
          reduce_partials_kernel.
      v2  the current trainer's fused qknorm_rope_forward_kernel /
          qknorm_rope_backward_kernel (one warp per row, 2-byte and 4-byte loads).
      v3  (in train_mhar.cu since branch ew) a lane owns a 16-byte pack (8 values) of a row,
          HD/8 lanes per row; the rotate-half partner comes by one shuffle. The
          backward writes dinp (v1, v2 add into a zeroed buffer): no memset, no
          read of dinp; its dw partials are summed by a warp per channel.
          Needs HD in {16, 32, 64, 128, 256}.
      v4  forward: v3's arithmetic (the same bits), a lane takes a pack of 2 rows and
          issues every load (data, w, angles) before using any, at 4 blocks an SM;
          a lane loads half of its angles' values and swaps with its partner.
          Backward: v3's. The bench adds a line at 4 rows a lane.
  swiglu  v1  one element per thread (the trainer before 74133cf).
          v2  8 consecutive elements per thread, scalar loop (74133cf): measured
              SLOWER on the H200 (bwd 5.96 vs 3.16 ms per step), kept as a negative result.
          v3  16-byte packs, one pack per thread, one element a thread when n or a
              pointer does not allow packs (the trainer's until the gate/up matmul became one).
          v4  v3's arithmetic over the trainer's (N, 2F) rows [g | u] (and [dg | du]), dout in
              bf16 (the current trainer's, kernels/swiglu.cuh); packs need F % PACK == 0.

Tolerances (the check prints, per output, rel = max|gpu - ref| / max|ref|, the
metric of test_mhar and README_cuda; PASS needs, for every element,
|gpu - ref| <= rtol |ref| + atol max|ref|, and finite values):
  - bf16 outputs (dlogits, qk out, dinp, swiglu out, dg, du): rtol 2^-7. The
    kernels compute in fp32 and round once to bf16 (8 significant bits: at most
    2^-8 relative); 2^-7 leaves a factor 2 for the fp32 arithmetic before it.
    atol 1e-5 for dlogits and swiglu (products; the only cancellations, p - 1 and
    1 + g (1 - sigmoid g), happen in fp32), 1e-4 for qk out and dinp (y1 c - y2 s
    and s dy w - k3 x cancel in fp32, with terms as large as the largest output).
    qk v1's forward rounds the normed row to bf16 before the rotation: its out
    gets atol 2^-7 (a rotated pair of values each off by 2^-8 is off by up to
    2^-8 sqrt(2) max|out|).
  - padding columns of dlogits: exactly 0.
  - fp32 outputs: losses, lse rtol 1e-5, atol 1e-5 (sums of up to 50257 exp in
    fp32, then one log); rstd rtol 1e-5; dw rtol 1e-4, atol 1e-4 (fp32 sums
    over up to 2.6e5 rows of terms of both signs).

STATUS: ce v4 and qk v4 ran on an H200 (2026-12-02): --check PASS, bit-identical to v3; ce v4
1.979 ms against v3's 2.024, qk v4's forward 0.502 against 0.478 per step; neither moved into the
trainer (NOTES_elementwise.md, "ce v4 and qk v4 measured"); compute-sanitizer memcheck of ce v4
--quick: 0 errors. The rest: run on an H200 (2026-11-29): --check PASS for every op and
version, repeats bit-identical; --bench in dev/results/lab/elementwise_h200_2026-11-29.txt
(NOTES_elementwise.md).
Before that it was written and compiled on a machine without a GPU (nvcc 13.0, no
warnings), where --cpu-selftest and --bytes ran.
Before the GPU run, the v3 kernels' lane and pack indexing was checked by a
lane-by-lane numpy simulation against the reference (NOTES_elementwise.md).
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


#include "lab_util.cuh"   // the labs' shared helpers: the trainer's small ones, inputs, checks, timing

// Butterfly reductions (warp_sum: lab_util.cuh): every lane ends with the same value, in a fixed order.
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

// Deterministic per-channel sums over many rows (red_rows_per_part: lab_util.cuh).
// dw (D) += sum over the P partitions of partial (P, D), in partition order
__global__ void reduce_partials_kernel(float *dw, const float *partial, int P, int D) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D) { return; }
    float s = 0.0f;
    for (int p = 0; p < P; p++) { s += partial[(size_t)p * D + i]; }
    dw[i] += s;
}

// 16-byte packs of floatX: 8 bf16 values, loaded and stored in one instruction.
#define PACK (16 / (int)sizeof(floatX))
struct alignas(16) Pack { floatX v[PACK]; };

// ============================================================================
// Cross-entropy
// ============================================================================

#define CE_THREADS 512

// ---- v1: train_mhar.cu at 3dc0648 (crossentropy_forward_kernel /
// crossentropy_backward_kernel; bodies unchanged). Two passes over the row; a
// thread per element in the backward, with n = idx / Vp a 64-bit division.

__global__ void ce_forward_v1_kernel(float *losses, float *lse, const floatX *logits, const int *targets, int V,
                                     int Vp) {
    size_t n = blockIdx.x;
    const floatX *x = logits + n * Vp;
    float maxv = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) { maxv = fmaxf(maxv, toF(x[i])); }
    maxv = block_max(maxv);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) { sum += expf(toF(x[i]) - maxv); }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        float l = maxv + logf(sum);
        lse[n] = l;
        losses[n] = l - toF(x[targets[n]]);
    }
}

__global__ void ce_backward_v1_kernel(floatX *dlogits, const floatX *logits, const float *lse, const int *targets,
                                      float dloss, size_t N, int V, int Vp) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * Vp) { return; }
    size_t n = idx / Vp;
    int i = (int)(idx % Vp);
    float p = i < V ? expf(toF(logits[idx]) - lse[n]) : 0.0f;   // padding columns: no gradient
    dlogits[idx] = fromF<floatX>((p - (i == targets[n] ? 1.0f : 0.0f)) * dloss);
}

// ---- v2: the current train_mhar.cu (crossentropy_forward_kernel /
// crossentropy_backward_kernel; bodies unchanged). The logits rows start at
// multiples of Vp (a multiple of 128), so every 16-byte Pack of a row is aligned.

// One block per position n, one pass over the row: each thread keeps a running
// max m and sum s of exp(x - m) over its packs (online softmax), then the block
// merges them: lse = M + log(sum s exp(m - M)).
__global__ void ce_forward_v2_kernel(float *losses, float *lse, const floatX *logits, const int *targets, int V,
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

// One block per position n, a pack per thread and step.
__global__ void ce_backward_v2_kernel(floatX *dlogits, const floatX *logits, const float *lse, const int *targets,
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

// ---- v3 (H200: 2.03 ms per step; the trainer's crossentropy_fused_kernel):
// forward and backward in one kernel.
// The trainer knows dloss (1/(B*T*accumulation steps)) before the forward, and
// the training forward's logits are only ever read again by the backward. So
// one kernel can write losses, lse AND dlogits (in place). One block per row:
// pass 1 reads the row from global memory once (16-byte packs, CE3_UNROLL loads
// in flight per thread), keeps v2's online max/sum (in base 2: one FMA and one
// exp2f per value), and copies each pack to shared memory; after the block
// merge, pass 2 takes the packs from shared memory and writes dlogits. HBM
// traffic: the row read once and written once, where v2's forward + backward
// read it twice.
// Shared memory: Vp * 2 bytes (100.6 KB at Vp = 50304): 2 blocks per SM on an
// H100/H200 (228 KB), so one block's reductions and writes overlap the other's loads.
// In place is safe: every global read of the row happens in pass 1, before the
// barriers of block_max/block_sum; the target logit is read from shared memory.
// Per value: pass 1 one FMA + exp2f + add (+ the max), pass 2 one FMA + exp2f +
// multiply; full packs skip the per-value column check that v2 makes.
#define CE3_THREADS 512
#define CE3_UNROLL 4
#define CE3_LOG2E 1.4426950408889634f

// pass 1's update of (m, s) with the first ne values of a pack; FULL: all PACK
// values are real columns (every pack but the last), so no per-value check
template <bool FULL>
__device__ __forceinline__ void ce3_update(const Pack &x, int ne, float &m, float &s) {
    float v[PACK], pm = -INFINITY;
    #pragma unroll
    for (int e = 0; e < PACK; e++) { v[e] = toF(x.v[e]); if (FULL || e < ne) { pm = fmaxf(pm, v[e]); } }
    if (pm > m) { s *= exp2f((m - pm) * CE3_LOG2E); m = pm; }
    const float mL = m * CE3_LOG2E;
    #pragma unroll
    for (int e = 0; e < PACK; e++) { if (FULL || e < ne) { s += exp2f(fmaf(v[e], CE3_LOG2E, -mL)); } }
}

// pass 2: (p - onehot) dloss for a pack; te = the target's place in it, or -1
template <bool FULL>
__device__ __forceinline__ Pack ce3_grad(const Pack &x, int ne, int te, float l2, float dloss) {
    Pack d;
    #pragma unroll
    for (int e = 0; e < PACK; e++) {
        float p = FULL || e < ne ? exp2f(fmaf(toF(x.v[e]), CE3_LOG2E, -l2)) : 0.0f;
        if (e == te) { p -= 1.0f; }
        d.v[e] = fromF<floatX>(p * dloss);
    }
    return d;
}

__global__ void __launch_bounds__(CE3_THREADS, 2)
ce_fused_v3_kernel(floatX *dlogits, float *losses, float *lse, const floatX *logits, const int *targets, float dloss,
                   int V, int Vp) {
    extern __shared__ Pack ce3_row[];   // (Vp / PACK) packs; only the first nreal are used
    const float LN2 = 0.6931471805599453f;
    size_t n = blockIdx.x;
    const Pack *row = (const Pack *)(logits + n * Vp);
    Pack *drow = (Pack *)(dlogits + n * Vp);
    const int full = V / PACK, nreal = (V + PACK - 1) / PACK, npk = Vp / PACK;
    // pass 1: online softmax in base 2; m = running max of the logits, s = sum of 2^(x log2e - m log2e)
    float m = -INFINITY, s = 0.0f;
    for (int k0 = threadIdx.x; k0 < nreal; k0 += CE3_UNROLL * blockDim.x) {
        Pack x[CE3_UNROLL];
        #pragma unroll
        for (int u = 0; u < CE3_UNROLL; u++) {   // the loads first: CE3_UNROLL x 16 bytes in flight
            const int k = k0 + u * blockDim.x;
            if (k < nreal) { x[u] = row[k]; }
        }
        #pragma unroll
        for (int u = 0; u < CE3_UNROLL; u++) {
            const int k = k0 + u * blockDim.x;
            if (k >= nreal) { break; }
            ce3_row[k] = x[u];
            if (k < full) { ce3_update<true>(x[u], PACK, m, s); }
            else { ce3_update<false>(x[u], V - k * PACK, m, s); }
        }
    }
    const float M = block_max(m);
    const float ML = M * CE3_LOG2E;
    const float S = block_sum(m == -INFINITY ? 0.0f : s * exp2f(m * CE3_LOG2E - ML));
    const float l2 = ML + log2f(S);   // lse in base 2
    const int target = targets[n], tk = target / PACK, te = target % PACK;
    if (threadIdx.x == 0) {   // the barriers in block_sum make every thread's ce3_row stores visible
        lse[n] = l2 * LN2;
        losses[n] = l2 * LN2 - toF(ce3_row[tk].v[te]);
    }
    // pass 2: from shared memory; the padding packs are written without being read
    for (int k = threadIdx.x; k < npk; k += blockDim.x) {
        Pack d;
        if (k < full) {
            d = ce3_grad<true>(ce3_row[k], PACK, k == tk ? te : -1, l2, dloss);
        } else if (k < nreal) {
            d = ce3_grad<false>(ce3_row[k], V - k * PACK, k == tk ? te : -1, l2, dloss);
        } else {
            #pragma unroll
            for (int e = 0; e < PACK; e++) { d.v[e] = fromF<floatX>(0.0f); }
        }
        drow[k] = d;
    }
}

// ---- v4: v3's arithmetic in a persistent grid that keeps HBM busy between rows.
// v3 alternates, in every block, a read phase (its loads) and a reduce + write
// phase (no loads), with a block launch and barriers between rows; 2 blocks an
// SM overlap only where they happen to be out of phase. v4 runs one block of
// CE4_THREADS an SM (the grid: as many blocks as fit at once, at most N), each
// over the rows n = blockIdx.x + j gridDim.x, j = 0, 1, ..., with nbuf (2 where
// they fit) row buffers in shared memory: row j sits in buffer j % nbuf. Thread 0
// fetches a row with TMA 1D bulk copies (cp.async.bulk, sm_90) that complete on
// the buffer's mbarrier, so while the block reduces row j and writes its dlogits,
// row j + 1 is already on its way; row j + nbuf is fetched into buffer j % nbuf
// once every thread is done with row j. Per row: wait for its buffer, pass 1
// (v3's online max/sum, from shared memory), block_max/block_sum, losses and lse,
// pass 2 (v3's dlogits, written to global memory).
// Same results as v3, bit for bit: CE4_THREADS = CE3_THREADS, and thread t takes
// the packs t, t + 512, ... of a row in the same order with the same functions in
// both passes, and the block merge is the same.
// In place is safe: a row is fetched once, by its own block, and its dlogits are
// written only after the fetch completed (the mbarrier wait); the fetches in
// flight are of later rows, which no block writes before it has fetched them.
// Needs sm_90 (TMA, mbarrier transaction counts); the row's first nreal packs
// are fetched (nreal x 16 bytes, a multiple of 16 as cp.async.bulk needs, from a
// row start 256-byte aligned since Vp is a multiple of 128).
#define CE4_THREADS CE3_THREADS
#define CE4_NBUF_MAX 2
#define CE4_CHUNK 16384u   // bytes per bulk copy: a row of 100 KB goes as 7 copies on one mbarrier

__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

// thread 0: the mbarriers bar[0..nb) with an arrival count of 1, visible to the async proxy (TMA)
__device__ __forceinline__ void ce4_init(uint64_t *bar, int nb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (int b = 0; b < nb; b++) { asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[b])) : "memory"); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// thread 0: arm the mbarrier bar for `bytes`, then copy bytes from global src to shared dst by
// TMA bulk copies that complete on bar
__device__ __forceinline__ void ce4_fetch(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // order the block's generic-proxy reads of dst (a previous row) before the async-proxy writes
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const unsigned b = smem_u32(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
    for (unsigned off = 0; off < bytes; off += CE4_CHUNK) {
        const unsigned c = bytes - off < CE4_CHUNK ? bytes - off : CE4_CHUNK;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(smem_u32((char *)dst + off)), "l"((const char *)src + off), "r"(c), "r"(b)
                     : "memory");
    }
#endif
}

// every thread: wait until the mbarrier bar completes the phase of this parity; a wait past
// 2^34 clocks (~10 s) is a pipeline bug: trap, so the launch fails instead of hanging
__device__ __forceinline__ void ce4_wait(uint64_t *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    long long t0 = 0;
    for (int spin = 0;; spin++) {
        unsigned done;
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
        if (done) { return; }
        if (spin == 0) { t0 = clock64(); }
        else if (clock64() - t0 > (1ll << 34)) { __trap(); }
    }
#endif
}

__global__ void __launch_bounds__(CE4_THREADS, 1)
ce_fused_v4_kernel(floatX *dlogits, float *losses, float *lse, const floatX *logits, const int *targets, float dloss,
                   size_t N, int V, int Vp, int nbuf) {
    extern __shared__ Pack ce4_buf[];              // nbuf buffers of Vp / PACK packs; the first nreal used
    __shared__ uint64_t ce4_bar[CE4_NBUF_MAX];     // buffer b's mbarrier: completes when its row has arrived
    const float LN2 = 0.6931471805599453f;
    const int full = V / PACK, nreal = (V + PACK - 1) / PACK, npk = Vp / PACK;
    const unsigned bytes = (unsigned)nreal * 16u;
    const size_t G = gridDim.x;
    if (threadIdx.x == 0) {
        ce4_init(ce4_bar, nbuf);
        for (int j = 0; j < nbuf && blockIdx.x + j * G < N; j++) {
            ce4_fetch(ce4_buf + (size_t)j * npk, logits + (blockIdx.x + j * G) * Vp, bytes, &ce4_bar[j]);
        }
    }
    __syncthreads();   // the mbarriers initialised before anyone waits on them
    size_t j = 0;
    for (size_t n = blockIdx.x; n < N; n += G, j++) {
        const int b = (int)(j % nbuf);
        const Pack *row = ce4_buf + (size_t)b * npk;
        Pack *drow = (Pack *)(dlogits + n * Vp);
        const int target = targets[n], tk = target / PACK, te = target % PACK;   // loaded while pass 1 runs
        ce4_wait(&ce4_bar[b], (unsigned)(j / nbuf) & 1u);   // the buffer's (j / nbuf)-th fetch has landed
        // pass 1 (v3's): online softmax in base 2 over the packs t, t + blockDim.x, ...
        float m = -INFINITY, s = 0.0f;
        #pragma unroll 4
        for (int k = threadIdx.x; k < nreal; k += blockDim.x) {
            const Pack x = row[k];
            if (k < full) { ce3_update<true>(x, PACK, m, s); }
            else { ce3_update<false>(x, V - k * PACK, m, s); }
        }
        const float M = block_max(m);
        const float ML = M * CE3_LOG2E;
        const float S = block_sum(m == -INFINITY ? 0.0f : s * exp2f(m * CE3_LOG2E - ML));
        const float l2 = ML + log2f(S);   // lse in base 2
        if (threadIdx.x == 0) {
            lse[n] = l2 * LN2;
            losses[n] = l2 * LN2 - toF(row[tk].v[te]);
        }
        // pass 2 (v3's): from shared memory, a pack in one 16-byte load (v3's code loads it value by
        // value); the padding packs are written without being read
        for (int k = threadIdx.x; k < npk; k += blockDim.x) {
            Pack d, x;
            if (k < nreal) { *(uint4 *)&x = *(const uint4 *)&row[k]; }
            if (k < full) {
                d = ce3_grad<true>(x, PACK, k == tk ? te : -1, l2, dloss);
            } else if (k < nreal) {
                d = ce3_grad<false>(x, V - k * PACK, k == tk ? te : -1, l2, dloss);
            } else {
                #pragma unroll
                for (int e = 0; e < PACK; e++) { d.v[e] = fromF<floatX>(0.0f); }
            }
            drow[k] = d;
        }
        __syncthreads();   // every thread is done with buffer b
        if (threadIdx.x == 0 && n + nbuf * G < N) {
            ce4_fetch(ce4_buf + (size_t)b * npk, logits + (n + nbuf * G) * Vp, bytes, &ce4_bar[b]);
        }
    }
}

struct CeBufs {
    floatX *logits;        // (N, Vp); the backward overwrites it with dlogits
    const int *targets;    // (N)
    float *losses, *lse;   // (N)
    size_t N;
    int V, Vp;
    float dloss;
};

// v4's row buffers at this Vp: 2 where they fit in shared memory next to the static
// 272 bytes (block_max/block_sum's, the mbarriers), else 1, else 0 (unsupported);
// 0 also on a device below sm_90 (no TMA)
static int ce4_nbuf(int Vp) {
    int maxsm = 0, major = 0;
    cudaCheck(cudaDeviceGetAttribute(&maxsm, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major < 9) { return 0; }
    for (int nb = CE4_NBUF_MAX; nb >= 1; nb--) {
        if ((size_t)nb * Vp * sizeof(floatX) + 1024 <= (size_t)maxsm) { return nb; }
    }
    return 0;
}

static int ce4_nbuf_force = 0;   // the check's run of v4 with 1 buffer (the fp32 trainer's case at Vp = 50304)

static bool ce_supported(int ver, int V, int Vp) {
    if (Vp % 128 != 0 || V > Vp) { return false; }
    if (ver == 3) {   // the row in shared memory, next to block_max/block_sum's 256 bytes
        int maxsm = 0;
        cudaCheck(cudaDeviceGetAttribute(&maxsm, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
        return (size_t)Vp * sizeof(floatX) + 1024 <= (size_t)maxsm;
    }
    if (ver == 4) { return ce4_nbuf(Vp) > 0; }
    return ver >= 1 && ver <= 2;
}

// v3 and v4 do the forward and the backward here
static void ce_forward(int ver, const CeBufs &b) {
    if (ver == 1) {
        ce_forward_v1_kernel<<<(unsigned)b.N, CE_THREADS>>>(b.losses, b.lse, b.logits, b.targets, b.V, b.Vp);
    } else if (ver == 2) {
        ce_forward_v2_kernel<<<(unsigned)b.N, CE_THREADS>>>(b.losses, b.lse, b.logits, b.targets, b.V, b.Vp);
    } else if (ver == 3) {
        static size_t smem_set = 0;   // raise the limit once per size, not inside a timed call
        size_t smem = (size_t)b.Vp * sizeof(floatX);
        if (smem > smem_set) {
            cudaCheck(cudaFuncSetAttribute(ce_fused_v3_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            smem_set = smem;
        }
        ce_fused_v3_kernel<<<(unsigned)b.N, CE3_THREADS, smem>>>(b.logits, b.losses, b.lse, b.logits, b.targets,
                                                                 b.dloss, b.V, b.Vp);
    } else {
        // the grid: as many blocks as are resident at once (1 an SM at the 100m shape), at most N;
        // set up once per Vp, not inside a timed call
        static int vp_set = 0, nbuf_set = -1, nbuf = 0;
        static unsigned grid_max = 0;
        if (b.Vp != vp_set || ce4_nbuf_force != nbuf_set) {
            nbuf = ce4_nbuf_force ? ce4_nbuf_force : ce4_nbuf(b.Vp);
            nbuf_set = ce4_nbuf_force;
            const size_t smem = (size_t)nbuf * b.Vp * sizeof(floatX);
            cudaCheck(cudaFuncSetAttribute(ce_fused_v4_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            int sms = 0, per_sm = 0;
            cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
            cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ce_fused_v4_kernel, CE4_THREADS, smem));
            grid_max = (unsigned)(sms * (per_sm > 0 ? per_sm : 1));
            vp_set = b.Vp;
        }
        const size_t smem = (size_t)nbuf * b.Vp * sizeof(floatX);
        const unsigned grid = b.N < grid_max ? (unsigned)b.N : grid_max;
        ce_fused_v4_kernel<<<grid, CE4_THREADS, smem>>>(b.logits, b.losses, b.lse, b.logits, b.targets, b.dloss, b.N,
                                                        b.V, b.Vp, nbuf);
    }
    launchCheck();
}

// in place: dlogits over the logits; v3, v4: nothing left to do
static void ce_backward(int ver, const CeBufs &b) {
    if (ver == 1) {
        ce_backward_v1_kernel<<<ceil_div(b.N * b.Vp, 256), 256>>>(b.logits, b.logits, b.lse, b.targets, b.dloss, b.N,
                                                                  b.V, b.Vp);
    } else if (ver == 2) {
        ce_backward_v2_kernel<<<(unsigned)b.N, CE_THREADS>>>(b.logits, b.logits, b.lse, b.targets, b.dloss, b.V,
                                                             b.Vp);
    } else {
        return;
    }
    launchCheck();
}

// ============================================================================
// QK-norm + RoPE
// ============================================================================

// ---- v1: train_mhar.cu at 3dc0648 (rmsnorm_forward_kernel, rmsnorm_backward_kernel,
// rmsnorm_dw_partial_kernel, rope_forward_kernel, rope_backward_kernel; bodies
// unchanged), called as its attention sublayer called them. The three RMSNorm
// kernels are in lab_util.cuh (residual.cu's v1 uses them too).

// cosv, sinv (T, HD/2): angle t * 10000^(-2i/HD) at position t. One thread per pair.
__global__ void rope_forward_v1_kernel(floatX *out, const floatX *inp, const float *cosv, const float *sinv,
                                       int B, int T, int nh, int HD) {
    int half = HD / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * nh * half) { return; }
    int i = (int)(idx % half);
    size_t row = idx / half;              // (b, t, h)
    int t = (int)((row / nh) % T);
    size_t off = row * HD;
    float c = cosv[t * half + i], s = sinv[t * half + i];
    float x1 = toF(inp[off + i]), x2 = toF(inp[off + i + half]);
    out[off + i] = fromF<floatX>(x1 * c - x2 * s);
    out[off + i + half] = fromF<floatX>(x2 * c + x1 * s);
}

__global__ void rope_backward_v1_kernel(float *dinp, const float *dout, const float *cosv, const float *sinv,
                                        int B, int T, int nh, int HD) {
    int half = HD / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * nh * half) { return; }
    int i = (int)(idx % half);
    size_t row = idx / half;
    int t = (int)((row / nh) % T);
    size_t off = row * HD;
    float c = cosv[t * half + i], s = sinv[t * half + i];
    float g1 = dout[off + i], g2 = dout[off + i + half];
    // out1 = x1 c - x2 s;  out2 = x2 c + x1 s
    dinp[off + i] += g1 * c + g2 * s;
    dinp[off + i + half] += g2 * c - g1 * s;
}

// ---- v2: the current train_mhar.cu (qknorm_rope_forward_kernel /
// qknorm_rope_backward_kernel; bodies unchanged). One warp per row (b, t, h);
// lane j holds the pairs j, j + 32, ... so the norm and the rotation happen in registers.

#define QK_PAIRS 4   // pairs per lane: HD up to 256

// out (rows, HD) = rope(rmsnorm(inp; w)), rows = B*T*nh in (b, t, h) order;
// rstd (rows) kept for the backward; out may not alias inp.
__global__ void qknorm_rope_forward_v2_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *w,
                                              const float *cosv, const float *sinv, size_t rows, int T, int nh,
                                              int HD) {
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

// Block p handles the rows of partition p (rows_per_part of them), warp by warp,
// and writes partial[p] (HD): its rows' share of dw, summed in a fixed order.
__global__ void qknorm_rope_backward_v2_kernel(floatX *dinp, float *partial, const float *dout, const floatX *inp,
                                               const float *rstd, const floatX *w, const float *cosv,
                                               const float *sinv, size_t rows, int T, int nh, int HD,
                                               int rows_per_part) {
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
            floatX *d = dinp + n * HD;
            d[j] = fromF<floatX>(toF(d[j]) + s * dy1[u] * toF(w[j]) - k3 * x1[u]);
            d[j + half] = fromF<floatX>(toF(d[j + half]) + s * dy2[u] * toF(w[j + half]) - k3 * x2[u]);
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

// ---- v3 (H200: fwd 0.48, bwd 0.82 ms per step; now train_mhar.cu's
// qknorm_rope_*_packed_kernel): a lane per 16-byte pack.
// A row of HD bf16 is G = HD/8 packs; lanes g*G .. g*G + G-1 of a warp hold row
// group g (32/G rows per warp), lane p of the group the values 8p .. 8p+7. The
// rotate-half partner of value j < HD/2 is j + HD/2, which sits in pack p + G/2:
// lane ^ (G/2). The row's sums (of x^2, and of dy w x) are butterflies over the G
// lanes (xor offsets below G stay inside the group). Every load and store is
// 16 bytes (dout: two float4), where v2 moves 2 bytes (4 for dout) per lane and
// instruction. The backward WRITES dinp: the trainer zeroes dqr/dkr right before
// and nothing else adds to them, so the memset and the read-modify-write go.
// The dw partials are per (warp, row group) in shared memory, summed in a fixed
// order, then over the blocks by reduce_partials_warp_kernel: deterministic.

template <int HD>
__global__ void __launch_bounds__(256)
qk_forward_v3_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *w, const float *cosv,
                     const float *sinv, size_t rows, int T, int nh) {
    constexpr int G = HD / PACK, RPW = 32 / G, HALF = HD / 2;
    static_assert(HD % (2 * PACK) == 0 && 32 % G == 0, "HD must be 16, 32, 64, 128 or 256");
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
    const float4 *cp = reinterpret_cast<const float4 *>(cosv + (size_t)t * HALF + j0);
    const float4 *sp = reinterpret_cast<const float4 *>(sinv + (size_t)t * HALF + j0);
    const float4 c0 = cp[0], c1 = cp[1], s0 = sp[0], s1 = sp[1];
    const float c[PACK] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const float sn[PACK] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    const bool first = p < G / 2;   // out1 = y1 c - y2 sn (first half), out2 = y2 c + y1 sn
    Pack op;
    #pragma unroll
    for (int e = 0; e < PACK; e++) {
        op.v[e] = fromF<floatX>(first ? y[e] * c[e] - yo[e] * sn[e] : y[e] * c[e] + yo[e] * sn[e]);
    }
    reinterpret_cast<Pack *>(out + n * HD)[p] = op;
    if (p == 0) { rstd[n] = s; }
}

// ---- v4 forward (the backward is v3's): v3's arithmetic, RPL rows a lane, every load first.
// Why v3's forward runs at 1.57x its floor (1.46x at the 1b shapes, where the calls are twice
// as long, so not only launch gaps): a lane has one 16-byte load of HBM in flight, and at 39
// registers 1536 threads an SM, 24 KB an SM, under what Little's law asks (~30 GB/s an SM x
// ~1 us); then the cos/sin loads (64 bytes a lane, from L2) issue only after the data came
// back and the two shuffle rounds: a second round trip in series, with no HBM load in flight.
// SwiGLU v3, two independent 16-byte loads a thread and nothing dependent, runs at the copy
// rate. v4: a lane takes RPL rows (the rows base + r RPW + lane / G, r < RPL: each warp
// instruction still covers RPW consecutive rows), issues the RPL data loads, w and the RPL
// cos/sin loads before it uses any of them. __launch_bounds__ keeps 4 blocks an SM at RPL = 2
// (64 registers: 1024 threads x 32 bytes = 32 KB of HBM in flight), 3 at RPL = 4 (85: 768 x 64
// bytes = 48 KB), and the table loads' latency hides under the data's. To fit that in 64 registers, a lane loads half of its
// angles' table values (32 bytes a row, not 64) and gets the other half from its partner.
// Per row the arithmetic is v3's, on the same values: the same bits.
template <int HD, int RPL>
__global__ void __launch_bounds__(256, RPL <= 2 ? 4 : 3)
qk_forward_v4_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *w, const float *cosv,
                     const float *sinv, size_t rows, int T, int nh) {
    constexpr int G = HD / PACK, RPW = 32 / G, HALF = HD / 2;
    static_assert(HD % (2 * PACK) == 0 && 32 % G == 0, "HD must be 16, 32, 64, 128 or 256");
    const int lane = threadIdx.x % 32, p = lane % G;
    const size_t base = ((size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * RPW * RPL + lane / G;
    const int j0 = (p * PACK) % HALF;
    const bool first = p < G / 2;   // out1 = y1 c - y2 sn (first half), out2 = y2 c + y1 sn
    // a lane and its partner (lane ^ G/2) need the same PACK angles: the first-half lane loads
    // their cosines, the second-half lane their sines, and they swap by shuffles (8 registers
    // a row in flight instead of 16)
    const float *tab = first ? cosv : sinv;
    Pack xp[RPL];
    float4 a0[RPL], a1[RPL];
    #pragma unroll
    for (int r = 0; r < RPL; r++) {   // every load first: RPL x (16 bytes of HBM, 32 of table)
        const size_t n = base + (size_t)r * RPW;
        if (n < rows) {
            xp[r] = reinterpret_cast<const Pack *>(inp + n * HD)[p];
            const float4 *ap = reinterpret_cast<const float4 *>(tab + (size_t)((n / nh) % T) * HALF + j0);
            a0[r] = ap[0]; a1[r] = ap[1];
        } else {
            a0[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f); a1[r] = a0[r];
        }
    }
    const Pack wp = reinterpret_cast<const Pack *>(w)[p];
    float wv[PACK];
    #pragma unroll
    for (int e = 0; e < PACK; e++) { wv[e] = toF(wp.v[e]); }
    #pragma unroll
    for (int r = 0; r < RPL; r++) {
        const size_t n = base + (size_t)r * RPW;
        const bool valid = n < rows;   // every lane takes part in the shuffles
        float x[PACK], ss = 0.0f;
        #pragma unroll
        for (int e = 0; e < PACK; e++) { x[e] = valid ? toF(xp[r].v[e]) : 0.0f; }
        #pragma unroll
        for (int e = 0; e < PACK; e++) { ss += x[e] * x[e]; }
        #pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) { ss += __shfl_xor_sync(0xffffffffu, ss, o); }
        const float s = 1.0f / sqrtf(ss / HD + 1e-6f);
        float y[PACK], yo[PACK];
        #pragma unroll
        for (int e = 0; e < PACK; e++) { y[e] = x[e] * s * wv[e]; }                               // the norm
        #pragma unroll
        for (int e = 0; e < PACK; e++) { yo[e] = __shfl_xor_sync(0xffffffffu, y[e], G / 2); }   // the partner's
        const float mine[PACK] = {a0[r].x, a0[r].y, a0[r].z, a0[r].w, a1[r].x, a1[r].y, a1[r].z, a1[r].w};
        float theirs[PACK];
        #pragma unroll
        for (int e = 0; e < PACK; e++) { theirs[e] = __shfl_xor_sync(0xffffffffu, mine[e], G / 2); }
        if (valid) {
            Pack op;
            #pragma unroll
            for (int e = 0; e < PACK; e++) {
                const float c = first ? mine[e] : theirs[e], sn = first ? theirs[e] : mine[e];
                op.v[e] = fromF<floatX>(first ? y[e] * c - yo[e] * sn : y[e] * c + yo[e] * sn);
            }
            reinterpret_cast<Pack *>(out + n * HD)[p] = op;
            if (p == 0) { rstd[n] = s; }
        }
    }
}

// Block b handles the rows of partition b (rows_per_part of them): each warp
// takes RPW rows a step. partial[b] (HD) = the partition's share of dw.
template <int HD>
__global__ void __launch_bounds__(256)
qk_backward_v3_kernel(floatX *dinp, float *partial, const float *dout, const floatX *inp, const float *rstd,
                      const floatX *w, const float *cosv, const float *sinv, size_t rows, int T, int nh,
                      int rows_per_part) {
    constexpr int G = HD / PACK, RPW = 32 / G, HALF = HD / 2, WARPS = 8;
    static_assert(HD % (2 * PACK) == 0 && 32 % G == 0, "HD must be 16, 32, 64, 128 or 256");
    __shared__ alignas(16) float acc[WARPS * RPW][HD];   // 8 KB at every HD
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
            const float4 *gp = reinterpret_cast<const float4 *>(dout + n * HD + p * PACK);
            const float4 g0 = gp[0], g1 = gp[1];
            g[0] = g0.x; g[1] = g0.y; g[2] = g0.z; g[3] = g0.w; g[4] = g1.x; g[5] = g1.y; g[6] = g1.z; g[7] = g1.w;
            const Pack xp = reinterpret_cast<const Pack *>(inp + n * HD)[p];
            const int t = (int)((n / nh) % T);
            const float4 *cp = reinterpret_cast<const float4 *>(cosv + (size_t)t * HALF + j0);
            const float4 *sp = reinterpret_cast<const float4 *>(sinv + (size_t)t * HALF + j0);
            const float4 c0 = cp[0], c1 = cp[1], s0 = sp[0], s1 = sp[1];
            c[0] = c0.x; c[1] = c0.y; c[2] = c0.z; c[3] = c0.w; c[4] = c1.x; c[5] = c1.y; c[6] = c1.z; c[7] = c1.w;
            sn[0] = s0.x; sn[1] = s0.y; sn[2] = s0.z; sn[3] = s0.w; sn[4] = s1.x; sn[5] = s1.y; sn[6] = s1.z; sn[7] = s1.w;
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
    float4 *a = reinterpret_cast<float4 *>(&acc[warp * RPW + r][p * PACK]);
    a[0] = make_float4(dw[0], dw[1], dw[2], dw[3]);
    a[1] = make_float4(dw[4], dw[5], dw[6], dw[7]);
    __syncthreads();
    for (int i = threadIdx.x; i < HD; i += blockDim.x) {
        float t = 0.0f;
        for (int y = 0; y < WARPS * RPW; y++) { t += acc[y][i]; }
        partial[(size_t)blockIdx.x * HD + i] = t;
    }
}

// v3's sum of the partials: one warp per channel; lane l sums the partitions
// l, l + 32, ... in order (independent loads, up to 16 in flight), then a fixed
// butterfly: deterministic, like reduce_partials_kernel, but without its chain of
// P = 512 dependent adds behind L2 loads by a single thread per channel (a guess
// at tens of microseconds a call, 24 calls a step; to be measured).
__global__ void reduce_partials_warp_kernel(float *dw, const float *partial, int P, int D) {
    int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (i >= D) { return; }
    float s = 0.0f;
    for (int p = lane; p < P; p += 32) { s += partial[(size_t)p * D + i]; }
    s = warp_sum(s);
    if (lane == 0) { dw[i] += s; }
}

struct QkBufs {
    const floatX *inp;     // (rows, HD): the pre-norm q or k
    floatX *out;           // (rows, HD)
    float *rstd;           // (rows)
    const floatX *w;       // (HD)
    const float *cosv, *sinv;   // (T, HD/2)
    const float *dout;     // (rows, HD) fp32
    floatX *dinp;          // (rows, HD)
    float *dw;             // (HD), accumulated
    float *partial;        // RED_PARTS_MAX * HD
    float *scratch;        // (rows, HD) fp32: v1's rope gradient
    int B, T, nh, HD;
    size_t rows() const { return (size_t)B * T * nh; }
};

static bool qk_supported(int ver, int HD) {
    if (HD % 2 != 0 || HD > 256) { return false; }
    if (ver == 3 || ver == 4) { return HD == 16 || HD == 32 || HD == 64 || HD == 128 || HD == 256; }
    return ver >= 1 && ver <= 2;
}

template <int HD> static void qk_forward_v3(const QkBufs &b) {
    constexpr int RPW = 32 / (HD / PACK);
    qk_forward_v3_kernel<HD><<<ceil_div(b.rows(), 8 * RPW), 256>>>(b.out, b.rstd, b.inp, b.w, b.cosv, b.sinv,
                                                                   b.rows(), b.T, b.nh);
}
static int qk4_rpl = 2;   // v4's rows a lane: 2, or 4 (the bench's second v4 line, the check's comparison)
template <int HD> static void qk_forward_v4(const QkBufs &b) {
    constexpr int RPW = 32 / (HD / PACK);
    if (qk4_rpl == 4) {
        qk_forward_v4_kernel<HD, 4><<<ceil_div(b.rows(), 8 * RPW * 4), 256>>>(b.out, b.rstd, b.inp, b.w, b.cosv,
                                                                             b.sinv, b.rows(), b.T, b.nh);
    } else {
        qk_forward_v4_kernel<HD, 2><<<ceil_div(b.rows(), 8 * RPW * 2), 256>>>(b.out, b.rstd, b.inp, b.w, b.cosv,
                                                                             b.sinv, b.rows(), b.T, b.nh);
    }
}
template <int HD> static void qk_backward_v3(const QkBufs &b, int R, int P) {
    qk_backward_v3_kernel<HD><<<P, 256>>>(b.dinp, b.partial, b.dout, b.inp, b.rstd, b.w, b.cosv, b.sinv, b.rows(),
                                          b.T, b.nh, R);
}

static void qk_forward(int ver, const QkBufs &b) {
    const size_t rows = b.rows();
    const int HD = b.HD;
    if (ver == 1) {   // rmsnorm_forward(q, rstd, qr, w), then rope_forward(q, q) in place
        rmsnorm_forward_v1_kernel<<<ceil_div(rows, 8), 256>>>(b.out, b.rstd, b.inp, b.w, rows, HD);
        launchCheck();
        rope_forward_v1_kernel<<<ceil_div(rows * (HD / 2), 256), 256>>>(b.out, b.out, b.cosv, b.sinv, b.B, b.T, b.nh,
                                                                        HD);
    } else if (ver == 2) {
        qknorm_rope_forward_v2_kernel<<<ceil_div(rows, 8), 256>>>(b.out, b.rstd, b.inp, b.w, b.cosv, b.sinv, rows,
                                                                  b.T, b.nh, HD);
    } else if (ver == 3) {
        switch (HD) {
            case 16: qk_forward_v3<16>(b); break;
            case 32: qk_forward_v3<32>(b); break;
            case 64: qk_forward_v3<64>(b); break;
            case 128: qk_forward_v3<128>(b); break;
            default: qk_forward_v3<256>(b); break;
        }
    } else {
        switch (HD) {
            case 16: qk_forward_v4<16>(b); break;
            case 32: qk_forward_v4<32>(b); break;
            case 64: qk_forward_v4<64>(b); break;
            case 128: qk_forward_v4<128>(b); break;
            default: qk_forward_v4<256>(b); break;
        }
    }
    launchCheck();
}

// dinp = gradient of inp (v1, v2: zeroed, then added into, as the trainer does);
// dw += gradient of w. v4's backward is v3's.
static void qk_backward(int ver, const QkBufs &b) {
    const size_t rows = b.rows();
    const int HD = b.HD;
    const int R = red_rows_per_part(rows), P = (int)ceil_div(rows, R);
    if (ver == 1) {
        // rope_backward(dqn, dq) into a zeroed fp32 scratch, then rmsnorm_backward(dqr, dw, dqn, qr, ...)
        zero(b.scratch, rows * HD * sizeof(float));
        rope_backward_v1_kernel<<<ceil_div(rows * (HD / 2), 256), 256>>>(b.scratch, b.dout, b.cosv, b.sinv, b.B, b.T,
                                                                         b.nh, HD);
        launchCheck();
        zero(b.dinp, rows * HD * sizeof(floatX));
        rmsnorm_backward_v1_kernel<floatX><<<ceil_div(rows, 8), 256>>>(b.dinp, b.scratch, b.inp, b.rstd, b.w, rows,
                                                                      HD);
        launchCheck();
        rmsnorm_dw_partial_v1_kernel<<<dim3(ceil_div(HD, 32), P), dim3(32, 8)>>>(b.partial, b.scratch, b.inp, b.rstd,
                                                                                 rows, HD, R);
    } else if (ver == 2) {
        zero(b.dinp, rows * HD * sizeof(floatX));
        qknorm_rope_backward_v2_kernel<<<P, 256>>>(b.dinp, b.partial, b.dout, b.inp, b.rstd, b.w, b.cosv, b.sinv,
                                                   rows, b.T, b.nh, HD, R);
    } else {
        switch (HD) {
            case 16: qk_backward_v3<16>(b, R, P); break;
            case 32: qk_backward_v3<32>(b, R, P); break;
            case 64: qk_backward_v3<64>(b, R, P); break;
            case 128: qk_backward_v3<128>(b, R, P); break;
            default: qk_backward_v3<256>(b, R, P); break;
        }
    }
    launchCheck();
    if (ver >= 3) {
        reduce_partials_warp_kernel<<<ceil_div(HD, 8), 256>>>(b.dw, b.partial, P, HD);
    } else {
        reduce_partials_kernel<<<ceil_div(HD, 256), 256>>>(b.dw, b.partial, P, HD);
    }
    launchCheck();
}

// ============================================================================
// SwiGLU: out = silu(g) * u, silu(z) = z * sigmoid(z). All tensors (n = N*F).
// ============================================================================

// ---- v1: one element per thread (train_mhar.cu before 74133cf; bodies unchanged)

__global__ void swiglu_forward_v1_kernel(floatX *out, const floatX *g, const floatX *u, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float gi = toF(g[i]), sig = 1.0f / (1.0f + expf(-gi));
    out[i] = fromF<floatX>(gi * sig * toF(u[i]));
}

__global__ void swiglu_backward_v1_kernel(floatX *dg, floatX *du, const float *dout, const floatX *g, const floatX *u,
                                          size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    // out = g sig(g) u;  d(g sig(g))/dg = sig (1 + g (1 - sig))
    float gi = toF(g[i]), ui = toF(u[i]), sig = 1.0f / (1.0f + expf(-gi));
    dg[i] = fromF<floatX>(dout[i] * ui * sig * (1.0f + gi * (1.0f - sig)));
    du[i] = fromF<floatX>(dout[i] * gi * sig);
}

// ---- v2: 74133cf, 8 consecutive elements per thread in a scalar loop (bodies
// unchanged). NEGATIVE RESULT: slower than v1 on the H200 (per step of 12 layers,
// fwd 3.05 vs 2.68 ms, bwd 5.96 vs 3.16 ms). A warp's load instruction touches 32
// addresses 16 bytes apart, 2 bytes of each: 8 instructions per tensor re-walk the
// same sectors, where v1's one instruction reads 64 contiguous bytes.
#define SWIGLU_VEC 8

__global__ void swiglu_forward_v2_kernel(floatX *out, const floatX *g, const floatX *u, size_t n) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * SWIGLU_VEC;
    if (i0 >= n) { return; }
    #pragma unroll
    for (int e = 0; e < SWIGLU_VEC; e++) {
        size_t i = i0 + e;
        if (i < n) {
            float gi = toF(g[i]), sig = 1.0f / (1.0f + expf(-gi));
            out[i] = fromF<floatX>(gi * sig * toF(u[i]));
        }
    }
}

__global__ void swiglu_backward_v2_kernel(floatX *dg, floatX *du, const float *dout, const floatX *g, const floatX *u,
                                          size_t n) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * SWIGLU_VEC;
    if (i0 >= n) { return; }
    #pragma unroll
    for (int e = 0; e < SWIGLU_VEC; e++) {
        size_t i = i0 + e;
        if (i < n) {
            // out = g sig(g) u;  d(g sig(g))/dg = sig (1 + g (1 - sig))
            float gi = toF(g[i]), ui = toF(u[i]), sig = 1.0f / (1.0f + expf(-gi));
            dg[i] = fromF<floatX>(dout[i] * ui * sig * (1.0f + gi * (1.0f - sig)));
            du[i] = fromF<floatX>(dout[i] * gi * sig);
        }
    }
}

// ---- v3: train_mhar.cu before the one gate/up matmul (swiglu_forward_kernel / swiglu_backward_kernel,
// packs_fit; bodies unchanged). Thread k handles the 16-byte pack k of each tensor,
// so a warp reads whole cache lines. When n or a pointer does not allow packs, the
// same kernels run one element a thread.

__device__ inline float silu_sig(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void swiglu_forward_v3_kernel(floatX *out, const floatX *g, const floatX *u, size_t n, int vec) {
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
static int packs_fit(size_t n, const void *a, const void *b, const void *c, const void *d) {
    uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d;
    return n % PACK == 0 && bits % 16 == 0;
}

__global__ void swiglu_backward_v3_kernel(floatX *dg, floatX *du, const float *dout, const floatX *g, const floatX *u,
                                          size_t n, int vec) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * vec;
    if (i0 >= n) { return; }
    // out = g sig(g) u;  d(g sig(g))/dg = sig (1 + g (1 - sig))
    if (vec == 1) {
        float gi = toF(g[i0]), ui = toF(u[i0]), sig = silu_sig(gi);
        dg[i0] = fromF<floatX>(dout[i0] * ui * sig * (1.0f + gi * (1.0f - sig)));
        du[i0] = fromF<floatX>(dout[i0] * gi * sig);
        return;
    }
    Pack gp = *(const Pack *)(g + i0), up = *(const Pack *)(u + i0), dgp, dup;
    float d[PACK];
    for (int e = 0; e < PACK; e += 4) { *(float4 *)(d + e) = *(const float4 *)(dout + i0 + e); }
    for (int e = 0; e < PACK; e++) {
        float gi = toF(gp.v[e]), ui = toF(up.v[e]), sig = silu_sig(gi);
        dgp.v[e] = fromF<floatX>(d[e] * ui * sig * (1.0f + gi * (1.0f - sig)));
        dup.v[e] = fromF<floatX>(d[e] * gi * sig);
    }
    *(Pack *)(dg + i0) = dgp;
    *(Pack *)(du + i0) = dup;
}

// ---- v4: the current train_mhar.cu (kernels/swiglu.cuh; bodies unchanged): v3's
// arithmetic with g and u in one (N, 2F) buffer, row n = [g_n | u_n] (the one gate/up
// matmul writes both), dg and du written the same way into dgu, and dout in bf16 (the down
// matmul's backward rounds its fp32 sums once). Packs need F % PACK == 0.

// element i of an (N, F) tensor -> its g in the (N, 2F) buffer (u is F further)
__device__ inline size_t gu_index(size_t i, int F) { return i / F * 2 * F + i % F; }

__global__ void swiglu_forward_v4_kernel(floatX *out, const floatX *gu, size_t n, int F, int vec) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * vec;
    if (i0 >= n) { return; }
    const floatX *g = gu + gu_index(i0, F), *u = g + F;
    if (vec == 1) {
        float gi = toF(g[0]);
        out[i0] = fromF<floatX>(gi * silu_sig(gi) * toF(u[0]));
        return;
    }
    Pack gp = *(const Pack *)g, up = *(const Pack *)u, op;
    for (int e = 0; e < PACK; e++) {
        float gi = toF(gp.v[e]);
        op.v[e] = fromF<floatX>(gi * silu_sig(gi) * toF(up.v[e]));
    }
    *(Pack *)(out + i0) = op;
}

__global__ void swiglu_backward_v4_kernel(floatX *dgu, const floatX *dout, const floatX *gu, size_t n, int F, int vec) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * vec;
    if (i0 >= n) { return; }
    const size_t at = gu_index(i0, F);
    const floatX *g = gu + at, *u = g + F;
    floatX *dg = dgu + at, *du = dg + F;
    // out = g sig(g) u;  d(g sig(g))/dg = sig (1 + g (1 - sig))
    if (vec == 1) {
        float gi = toF(g[0]), ui = toF(u[0]), sig = silu_sig(gi);
        float d = toF(dout[i0]);
        dg[0] = fromF<floatX>(d * ui * sig * (1.0f + gi * (1.0f - sig)));
        du[0] = fromF<floatX>(d * gi * sig);
        return;
    }
    Pack gp = *(const Pack *)g, up = *(const Pack *)u, dp = *(const Pack *)(dout + i0), dgp, dup;
    for (int e = 0; e < PACK; e++) {
        float gi = toF(gp.v[e]), ui = toF(up.v[e]), d = toF(dp.v[e]), sig = silu_sig(gi);
        dgp.v[e] = fromF<floatX>(d * ui * sig * (1.0f + gi * (1.0f - sig)));
        dup.v[e] = fromF<floatX>(d * gi * sig);
    }
    *(Pack *)dg = dgp;
    *(Pack *)du = dup;
}

// v4's buffers: gu, dgu (N, 2F); out, dout (N, F), dout bf16
struct SwBufs4 {
    const floatX *gu;
    floatX *out;
    const floatX *dout;
    floatX *dgu;
    size_t N;
    int F;
};
static void swiglu_v4(const SwBufs4 &b, bool fwd) {
    const size_t n = b.N * b.F;
    const bool fit = b.F % PACK == 0 && ((uintptr_t)b.gu | (uintptr_t)b.out | (uintptr_t)b.dout | (uintptr_t)b.dgu) % 16 == 0;
    const int vec = fit ? PACK : 1;
    if (fwd) { swiglu_forward_v4_kernel<<<ceil_div(n, 256 * (size_t)vec), 256>>>(b.out, b.gu, n, b.F, vec); }
    else { swiglu_backward_v4_kernel<<<ceil_div(n, 256 * (size_t)vec), 256>>>(b.dgu, b.dout, b.gu, n, b.F, vec); }
    launchCheck();
}

struct SwBufs {
    const floatX *g, *u;   // (n)
    floatX *out;           // (n)
    const float *dout;     // (n) fp32
    floatX *dg, *du;       // (n)
    size_t n;
};

static void swiglu_forward(int ver, const SwBufs &b) {
    if (ver == 1) {
        swiglu_forward_v1_kernel<<<ceil_div(b.n, 256), 256>>>(b.out, b.g, b.u, b.n);
    } else if (ver == 2) {
        swiglu_forward_v2_kernel<<<ceil_div(b.n, 256 * SWIGLU_VEC), 256>>>(b.out, b.g, b.u, b.n);
    } else {
        int vec = packs_fit(b.n, b.out, b.g, b.u, NULL) ? PACK : 1;
        swiglu_forward_v3_kernel<<<ceil_div(b.n, 256 * (size_t)vec), 256>>>(b.out, b.g, b.u, b.n, vec);
    }
    launchCheck();
}

static void swiglu_backward(int ver, const SwBufs &b) {
    if (ver == 1) {
        swiglu_backward_v1_kernel<<<ceil_div(b.n, 256), 256>>>(b.dg, b.du, b.dout, b.g, b.u, b.n);
    } else if (ver == 2) {
        swiglu_backward_v2_kernel<<<ceil_div(b.n, 256 * SWIGLU_VEC), 256>>>(b.dg, b.du, b.dout, b.g, b.u, b.n);
    } else {
        int vec = packs_fit(b.n, b.dg, b.du, b.g, b.u) && (uintptr_t)b.dout % 16 == 0 ? PACK : 1;
        swiglu_backward_v3_kernel<<<ceil_div(b.n, 256 * (size_t)vec), 256>>>(b.dg, b.du, b.dout, b.g, b.u, b.n, vec);
    }
    launchCheck();
}

// ============================================================================
// Inputs: made on the device from a counter-based hash (so even the 3.3 GB of
// logits take milliseconds), then copied to the host for the reference.
// ============================================================================

// QK-norm input: rows of different scales (0.05 .. 3.05), so rstd varies 60x
__global__ void fill_rows_kernel(floatX *p, size_t rows, int D, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * D; i += (size_t)gridDim.x * blockDim.x) {
        float scale = 0.05f + 3.0f * urand(seed ^ 0x5bd1e995ull, i / D);
        p[i] = fromF<floatX>(scale * nrand(seed, i));
    }
}

// SwiGLU gate: N(0, 3^2), and every 997th value uniform in +-90 (sigmoid saturated;
// expf(90) overflows to inf in fp32, which the kernels must survive)
__global__ void fill_gate_kernel(floatX *p, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = i % 997 == 0 ? 180.0f * (urand(seed ^ 0x27d4eb2full, i) - 0.5f) : 3.0f * nrand(seed, i);
        p[i] = fromF<floatX>(v);
    }
}

// Cross-entropy: logits 2.5 N(0,1) plus a spike of +10 at one column per row (the
// last column V-1, the first, or a hashed one, so the running max moves late or
// early); the padding columns hold 30000, so any kernel that reads them into the
// softmax fails the check. Targets: the spike column for a third of the rows (small
// losses, p - 1 near 0), V-1 for some, a hashed column otherwise.
__device__ inline int ce_spike(uint64_t seed, size_t n, int V) {
    return n % 4 == 0 ? V - 1 : n % 4 == 1 ? 0 : (int)(mix64(seed ^ (n * 7919 + 17)) % (uint64_t)V);
}
__global__ void ce_fill_kernel(floatX *logits, size_t N, int V, int Vp, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * Vp; i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / Vp;
        int c = (int)(i % Vp);
        float v = c >= V ? 30000.0f : 2.5f * nrand(seed, i) + (c == ce_spike(seed, n, V) ? 10.0f : 0.0f);
        logits[i] = fromF<floatX>(v);
    }
}
__global__ void ce_targets_kernel(int *targets, size_t N, int V, uint64_t seed) {
    size_t n = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) { return; }
    targets[n] = n % 3 == 0 ? ce_spike(seed, n, V) : n % 5 == 1 ? V - 1 : (int)(mix64(seed ^ (n + 0x9e37ull)) % V);
}

// RoPE tables as the trainer builds them (Model setup): angle t * 10000^(-2i/HD)
static void rope_tables(std::vector<float> &cs, std::vector<float> &sn, int T, int HD) {
    int half = HD / 2;
    cs.resize((size_t)T * half); sn.resize((size_t)T * half);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            double angle = t * pow(10000.0, -2.0 * i / HD);
            cs[(size_t)t * half + i] = (float)cos(angle);
            sn[(size_t)t * half + i] = (float)sin(angle);
        }
    }
}

// ============================================================================
// CPU references, fp64 (train_mhar.c's definitions)
// ============================================================================

// One row: x (Vp), the first V real. loss, lse, and dx (Vp) = (softmax - onehot) dloss, 0 past V.
static void ref_ce_row(const double *x, int V, int Vp, int target, double dloss, double *loss, double *lse,
                       double *dx) {
    double M = -INFINITY, S = 0;
    for (int i = 0; i < V; i++) { M = std::max(M, x[i]); }
    for (int i = 0; i < V; i++) { S += exp(x[i] - M); }
    double l = M + log(S);
    *lse = l;
    *loss = l - x[target];
    if (dx) {
        for (int i = 0; i < Vp; i++) { dx[i] = i < V ? (exp(x[i] - l) - (i == target ? 1.0 : 0.0)) * dloss : 0.0; }
    }
}

// out (rows, HD) = rope(rmsnorm(x; w)), rstd (rows)
static void ref_qk_forward(const double *x, const double *w, const double *cs, const double *sn, size_t rows, int T,
                           int nh, int HD, double *out, double *rstd) {
    int half = HD / 2;
    std::vector<double> y(HD);
    for (size_t n = 0; n < rows; n++) {
        const double *xr = x + n * HD;
        double ss = 0;
        for (int i = 0; i < HD; i++) { ss += xr[i] * xr[i]; }
        double s = 1 / sqrt(ss / HD + 1e-6);
        if (rstd) { rstd[n] = s; }
        for (int i = 0; i < HD; i++) { y[i] = xr[i] * s * w[i]; }
        int t = (int)((n / nh) % T);
        for (int j = 0; j < half; j++) {
            double c = cs[(size_t)t * half + j], si = sn[(size_t)t * half + j];
            out[n * HD + j] = y[j] * c - y[j + half] * si;
            out[n * HD + j + half] = y[j + half] * c + y[j] * si;
        }
    }
}

// dinp (rows, HD) = gradient of sum(out * dout) with respect to x; dw (HD) = with respect to w
static void ref_qk_backward(const double *dout, const double *x, const double *w, const double *cs, const double *sn,
                            size_t rows, int T, int nh, int HD, double *dinp, double *dw) {
    int half = HD / 2;
    std::vector<double> dy(HD);
    for (int i = 0; i < HD; i++) { dw[i] = 0; }
    for (size_t n = 0; n < rows; n++) {
        const double *xr = x + n * HD, *g = dout + n * HD;
        double ss = 0;
        for (int i = 0; i < HD; i++) { ss += xr[i] * xr[i]; }
        double s = 1 / sqrt(ss / HD + 1e-6);
        int t = (int)((n / nh) % T);
        for (int j = 0; j < half; j++) {   // dy = rotate back by the angle
            double c = cs[(size_t)t * half + j], si = sn[(size_t)t * half + j];
            dy[j] = g[j] * c + g[j + half] * si;
            dy[j + half] = g[j + half] * c - g[j] * si;
        }
        double gwx = 0;
        for (int i = 0; i < HD; i++) { gwx += dy[i] * w[i] * xr[i]; }
        for (int i = 0; i < HD; i++) {
            dinp[n * HD + i] = s * dy[i] * w[i] - s * s * s / HD * gwx * xr[i];
            dw[i] += dy[i] * xr[i] * s;
        }
    }
}

static void ref_swiglu(double g, double u, double dout, double *out, double *dg, double *du) {
    double sig = 1 / (1 + exp(-g));
    *out = g * sig * u;
    *dg = dout * u * sig * (1 + g * (1 - sig));
    *du = dout * g * sig;
}

// ============================================================================
// CPU self-test: each reference backward against central differences of its
// forward (loss = sum(out * R) for random R), on small problems. No GPU.
// ============================================================================

static int cpu_selftest(uint64_t seed) {
    host_rng = seed;
    const double h = 1e-6;
    bool ok = true;
    // cross-entropy: loss = dloss * sum_n losses[n]
    {
        const int N = 3, V = 11, Vp = 16;
        const double dloss = 0.37;
        std::vector<double> x((size_t)N * Vp), dx((size_t)N * Vp);
        int tg[N] = {0, 10, 4};
        for (auto &v : x) { v = 2 * host_normal(); }
        double worst = 0;
        for (int n = 0; n < N; n++) {
            double loss, lse;
            ref_ce_row(&x[(size_t)n * Vp], V, Vp, tg[n], dloss, &loss, &lse, &dx[(size_t)n * Vp]);
            for (int i = 0; i < Vp; i++) {
                double *xi = &x[(size_t)n * Vp + i], keep = *xi, lp, lm, l2;
                *xi = keep + h; ref_ce_row(&x[(size_t)n * Vp], V, Vp, tg[n], dloss, &lp, &l2, NULL);
                *xi = keep - h; ref_ce_row(&x[(size_t)n * Vp], V, Vp, tg[n], dloss, &lm, &l2, NULL);
                *xi = keep;
                double fd = dloss * (lp - lm) / (2 * h);
                worst = std::max(worst, fabs(fd - dx[(size_t)n * Vp + i]) / (fabs(fd) + 1e-3));
            }
        }
        bool pass = worst < 1e-6;
        ok &= pass;
        printf("  ce: dlogits vs central differences (incl. padding = 0): worst rel %.1e  %s\n", worst,
               pass ? "ok" : "FAIL");
    }
    // QK-norm + RoPE: loss = sum(out * R)
    {
        const int B = 1, T = 3, nh = 2, HD = 8;
        const size_t rows = (size_t)B * T * nh;
        std::vector<float> csf, snf;
        rope_tables(csf, snf, T, HD);
        std::vector<double> cs(csf.begin(), csf.end()), sn(snf.begin(), snf.end());
        std::vector<double> x(rows * HD), w(HD), R(rows * HD), out(rows * HD), dinp(rows * HD), dw(HD);
        for (auto &v : x) { v = host_normal(); }
        for (auto &v : w) { v = 1 + 0.3 * host_normal(); }
        for (auto &v : R) { v = host_normal(); }
        ref_qk_backward(R.data(), x.data(), w.data(), cs.data(), sn.data(), rows, T, nh, HD, dinp.data(), dw.data());
        auto loss = [&]() {
            ref_qk_forward(x.data(), w.data(), cs.data(), sn.data(), rows, T, nh, HD, out.data(), NULL);
            double l = 0;
            for (size_t i = 0; i < rows * HD; i++) { l += out[i] * R[i]; }
            return l;
        };
        double worst = 0;
        for (size_t i = 0; i < rows * HD + HD; i++) {
            double *p = i < rows * HD ? &x[i] : &w[i - rows * HD], keep = *p;
            *p = keep + h; double lp = loss();
            *p = keep - h; double lm = loss();
            *p = keep;
            double fd = (lp - lm) / (2 * h), an = i < rows * HD ? dinp[i] : dw[i - rows * HD];
            worst = std::max(worst, fabs(fd - an) / (fabs(fd) + 1e-3));
        }
        bool pass = worst < 1e-6;
        ok &= pass;
        printf("  qk: dinp and dw vs central differences: worst rel %.1e  %s\n", worst, pass ? "ok" : "FAIL");
    }
    // SwiGLU: d(out * r)/dg, d(out * r)/du
    {
        double worst = 0;
        for (int k = 0; k < 200; k++) {
            double g = k < 100 ? 4 * host_normal() : 60 * (host_uniform() - 0.5), u = host_normal(), r = host_normal();
            double o, dg, du, op, om, d1, d2;
            ref_swiglu(g, u, r, &o, &dg, &du);
            ref_swiglu(g + h, u, r, &op, &d1, &d2); ref_swiglu(g - h, u, r, &om, &d1, &d2);
            worst = std::max(worst, fabs(r * (op - om) / (2 * h) - dg) / (fabs(dg) + 1e-3));
            ref_swiglu(g, u + h, r, &op, &d1, &d2); ref_swiglu(g, u - h, r, &om, &d1, &d2);
            worst = std::max(worst, fabs(r * (op - om) / (2 * h) - du) / (fabs(du) + 1e-3));
        }
        bool pass = worst < 1e-6;
        ok &= pass;
        printf("  swiglu: dg and du vs central differences: worst rel %.1e  %s\n", worst, pass ? "ok" : "FAIL");
    }
    printf("CPU self-test: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

// ============================================================================
// Byte counts. Each buffer counted once per kernel that touches it (re-reads
// inside a kernel assumed to hit L1/L2); weights, the RoPE tables (<= 1 MB,
// L2-resident) and the dw partials (<= 1 MB) left out.
//   ce      fwd   N (2V + 12)        logits' V real columns read, targets, losses, lse
//           bwd   N (2V + 2Vp + 8)   the row read, dlogits written (all Vp), lse, targets
//           v3/v4 N (2V + 2Vp + 12)  fused: the row read once, dlogits, targets, losses, lse
//   qk      fwd   rows (4 HD + 4)    inp read, out written (bf16), rstd
//           bwd   rows (8 HD + 4)    dout (fp32) and inp read, rstd, dinp written
//   swiglu  fwd   6 n                g, u read, out written
//           bwd   12 n               dout (fp32), g, u read, dg, du written
// These are the minimum of each op; the effective GB/s of every version divides
// them by its time (so the GB/s rank the versions). What each version moves:
//   qk v1 fwd  rows (8 HD + 4)   (rmsnorm writes the row, rope reads and writes it again)
//   qk v1 bwd  rows (34 HD + 8)  (fp32 scratch zeroed, rope RMW, dinp zeroed, norm
//                                 backward RMW of dinp, dw pass re-reads scratch and inp)
//   qk v2 bwd  rows (12 HD + 4)  (dinp zeroed, then read-modify-written)
//   ce v1 fwd  up to N (4V + 12) (the second pass re-reads the row; from L2 if it stays)
// ============================================================================

static double ce_bytes_fwd(double N, double V) { return N * (2 * V + 12); }
static double ce_bytes_bwd(double N, double V, double Vp) { return N * (2 * V + 2 * Vp + 8); }
static double ce_bytes_fused(double N, double V, double Vp) { return N * (2 * V + 2 * Vp + 12); }
static double qk_bytes_fwd(double rows, double HD) { return rows * (4 * HD + 4); }
static double qk_bytes_bwd(double rows, double HD) { return rows * (8 * HD + 4); }
static double qk_moved_fwd(int ver, double rows, double HD) { return ver == 1 ? rows * (8 * HD + 4) : qk_bytes_fwd(rows, HD); }
static double qk_moved_bwd(int ver, double rows, double HD) {
    return ver == 1 ? rows * (34 * HD + 8) : ver == 2 ? rows * (12 * HD + 4) : qk_bytes_bwd(rows, HD);
}
static double sw_bytes_fwd(double n) { return 6 * n; }
static double sw_bytes_bwd(double n) { return 12 * n; }

// The model shapes the lab times: 100m (SPEC's 100M model, B=16) and 1b (our preset, B=16)
struct Model {
    const char *name;
    int B, T, L, NH, NKV, HD, F, V, Vp;
};
static const Model M100 = {"100m", 16, 2048, 12, 8, 4, 64, 1536, 50257, 50304};
static const Model M1B = {"1b", 16, 1024, 18, 16, 8, 128, 6144, 50257, 50304};

static void print_bytes(void) {
    const double TB[3] = {4.0e12, 4.3e12, 4.8e12};
    printf("Byte counts per optimizer step (one micro-batch), floors at 4.0 / 4.3 / 4.8 TB/s:\n");
    for (const Model *m : {&M100, &M1B}) {
        double N = (double)m->B * m->T, rows_step = N * (m->NH + m->NKV) * m->L, n_step = N * m->F * m->L;
        printf("%s: B=%d T=%d L=%d NH=%d NKV=%d HD=%d F=%d V=%d Vp=%d\n", m->name, m->B, m->T, m->L, m->NH, m->NKV,
               m->HD, m->F, m->V, m->Vp);
        struct { const char *what; double bytes; } rows[] = {
            {"ce fwd (1 call)", ce_bytes_fwd(N, m->V)},
            {"ce bwd (1 call)", ce_bytes_bwd(N, m->V, m->Vp)},
            {"ce fwd + bwd, v1/v2", ce_bytes_fwd(N, m->V) + ce_bytes_bwd(N, m->V, m->Vp)},
            {"ce fused, v3/v4", ce_bytes_fused(N, m->V, m->Vp)},
            {"qk fwd, v2/v3 (min)", qk_bytes_fwd(rows_step, m->HD)},
            {"qk fwd, v1 moves", qk_moved_fwd(1, rows_step, m->HD)},
            {"qk bwd, v3 (min)", qk_bytes_bwd(rows_step, m->HD)},
            {"qk bwd, v2 moves", qk_moved_bwd(2, rows_step, m->HD)},
            {"qk bwd, v1 moves", qk_moved_bwd(1, rows_step, m->HD)},
            {"swiglu fwd", sw_bytes_fwd(n_step)},
            {"swiglu bwd", sw_bytes_bwd(n_step)},
        };
        for (auto &r : rows) {
            printf("  %-22s %7.3f GB   %6.3f / %6.3f / %6.3f ms\n", r.what, r.bytes / 1e9, r.bytes / TB[0] * 1e3,
                   r.bytes / TB[1] * 1e3, r.bytes / TB[2] * 1e3);
        }
    }
}

// ============================================================================
// Checks
// ============================================================================

static bool quick = false;   // --quick: the small shapes only (for compute-sanitizer)

// Cross-entropy at (N, V, Vp). stride > 1: check the rows 0, stride, 2 stride, ...
// and the last one only (the 100m shape: the fp64 reference of all 32768 rows
// would take minutes).
static bool check_ce_shape(int ver, size_t N, int V, int Vp, size_t stride, uint64_t seed) {
    if (!ce_supported(ver, V, Vp)) { printf("  ce v%d N=%zu V=%d Vp=%d: skip (unsupported)\n", ver, N, V, Vp); return true; }
    floatX *logits = dalloc<floatX>(N * Vp), *pristine = dalloc<floatX>(N * Vp);
    int *targets = dalloc<int>(N);
    float *losses = dalloc<float>(N), *lse = dalloc<float>(N);
    ce_fill_kernel<<<8192, 256>>>(pristine, N, V, Vp, seed);
    launchCheck();
    ce_targets_kernel<<<ceil_div(N, 256), 256>>>(targets, N, V, seed);
    launchCheck();
    const float dloss = 1.0f / (float)N;   // the trainer's mean over B*T positions
    CeBufs b = {logits, targets, losses, lse, N, V, Vp, dloss};
    std::vector<size_t> rows;
    for (size_t n = 0; n < N; n += stride) { rows.push_back(n); }
    if (rows.back() != N - 1) { rows.push_back(N - 1); }
    // reference on the chosen rows, from the device's inputs
    std::vector<int> tg(N);
    cudaCheck(cudaMemcpy(tg.data(), targets, N * sizeof(int), cudaMemcpyDeviceToHost));
    std::vector<double> rloss(rows.size()), rlse(rows.size()), rdl(rows.size() * Vp);
    for (size_t k = 0; k < rows.size(); k++) {
        std::vector<double> x = fetch_bf16_d(pristine + rows[k] * Vp, Vp);
        ref_ce_row(x.data(), V, Vp, tg[rows[k]], dloss, &rloss[k], &rlse[k], &rdl[k * Vp]);
    }
    bool ok = true;
    // one run of version v: losses, lse and the checked rows of dlogits (concatenated), as bytes
    auto run = [&](int v, std::vector<unsigned char> (&out)[3]) {
        cudaCheck(cudaMemcpy(logits, pristine, N * Vp * sizeof(floatX), cudaMemcpyDeviceToDevice));
        cudaCheck(cudaMemset(losses, 0xFF, N * 4)); cudaCheck(cudaMemset(lse, 0xFF, N * 4));   // NaN
        ce_forward(v, b);
        ce_backward(v, b);
        cudaCheck(cudaDeviceSynchronize());
        out[0] = fetch_bytes(losses, N * 4);
        out[1] = fetch_bytes(lse, N * 4);
        out[2].clear();
        for (size_t r : rows) {
            std::vector<unsigned char> d = fetch_bytes(logits + r * Vp, (size_t)Vp * sizeof(floatX));
            out[2].insert(out[2].end(), d.begin(), d.end());
        }
    };
    std::vector<unsigned char> first[3];
    for (int rep = 0; rep < 2; rep++) {
        std::vector<unsigned char> out[3];
        run(ver, out);
        if (repeat_done(rep, out, first, ok)) { break; }
        std::vector<float> fl = bytes_f32(out[0]), fe = bytes_f32(out[1]), gl(rows.size()), ge(rows.size());
        for (size_t k = 0; k < rows.size(); k++) { gl[k] = fl[rows[k]]; ge[k] = fe[rows[k]]; }
        std::vector<float> gd = bytes_bf16_to_f(out[2]);
        size_t pad_bad = 0;
        for (size_t k = 0; k < rows.size(); k++) {
            for (int i = V; i < Vp; i++) { pad_bad += gd[k * Vp + i] != 0.0f; }
        }
        printf("  ce v%d N=%-5zu V=%-5d Vp=%-5d rows %-5zu", ver, N, V, Vp, rows.size());
        ok &= compare("losses", gl, rloss, 1e-5, 1e-5);
        ok &= compare("lse", ge, rlse, 1e-5, 1e-5);
        ok &= compare("dlogits", gd, rdl, 0x1p-7, 1e-5);
        printf(" padding %s\n", pad_bad ? "NONZERO (FAIL)" : "0");
        ok &= pad_bad == 0;
    }
    if (ver == 4 && ce_supported(3, V, Vp)) {   // v4 is v3's arithmetic: the same bits, or a note why not
        std::vector<unsigned char> v3out[3];
        run(3, v3out);
        const bool same = v3out[0] == first[0] && v3out[1] == first[1] && v3out[2] == first[2];
        printf("  ce v4 vs v3: losses, lse, dlogits %s\n", same ? "bit-identical" : "DIFFER (within the tolerances above)");
    }
    cudaCheck(cudaFree(logits)); cudaCheck(cudaFree(pristine)); cudaCheck(cudaFree(targets));
    cudaCheck(cudaFree(losses)); cudaCheck(cudaFree(lse));
    return ok;
}

static bool check_ce(int ver, uint64_t seed) {
    printf("ce v%d check (tolerances: losses, lse rtol 1e-5 + atol 1e-5 max; dlogits rtol 2^-7 + atol 1e-5 max;"
           " padding exactly 0)\n", ver);
    bool ok = true;
    if (!quick) { ok &= check_ce_shape(ver, 64, 50257, 50304, 1, seed + 1); }
    ok &= check_ce_shape(ver, 37, 77, 128, 1, seed + 2);
    ok &= check_ce_shape(ver, 130, 1000, 1024, 1, seed + 3);
    ok &= check_ce_shape(ver, 5, 5, 128, 1, seed + 4);
    ok &= check_ce_shape(ver, 3001, 1000, 1024, 7, seed + 6);   // N > the grid: v4's blocks take several rows
    if (ver == 4) {   // and with one buffer: fetch, compute, fetch
        ce4_nbuf_force = 1;
        printf("  (ce v4 with 1 row buffer)\n");
        ok &= check_ce_shape(ver, 3001, 1000, 1024, 7, seed + 6);
        ce4_nbuf_force = 0;
    }
    if (!quick) { ok &= check_ce_shape(ver, 32768, 50257, 50304, 61, seed + 5); }   // 100m shape, 539 rows checked
    printf("ce v%d check: %s\n", ver, ok ? "PASS" : "FAIL");
    return ok;
}

// QK-norm + RoPE at (B, T, nh, HD): forward, then backward from the version's own rstd
static bool check_qk_shape(int ver, int B, int T, int nh, int HD, uint64_t seed) {
    if (!qk_supported(ver, HD)) {
        printf("  qk v%d B=%d T=%d nh=%d HD=%d: skip (v3 needs HD in {16, 32, 64, 128, 256})\n", ver, B, T, nh, HD);
        return true;
    }
    const size_t rows = (size_t)B * T * nh, nel = rows * HD;
    std::vector<float> csf, snf;
    rope_tables(csf, snf, T, HD);
    QkBufs b;
    floatX *inp = dalloc<floatX>(nel), *w = dalloc<floatX>(HD);
    float *cosv = dalloc<float>(csf.size()), *sinv = dalloc<float>(snf.size()), *dout = dalloc<float>(nel);
    b.out = dalloc<floatX>(nel); b.rstd = dalloc<float>(rows); b.dinp = dalloc<floatX>(nel);
    b.dw = dalloc<float>(HD); b.partial = dalloc<float>((size_t)RED_PARTS_MAX * HD); b.scratch = dalloc<float>(nel);
    b.inp = inp; b.w = w; b.cosv = cosv; b.sinv = sinv; b.dout = dout;
    b.B = B; b.T = T; b.nh = nh; b.HD = HD;
    fill_rows_kernel<<<4096, 256>>>(inp, rows, HD, seed);
    launchCheck();
    fill_normal(w, HD, seed + 11, 1.0f, 0.3f);
    fill_normal(dout, nel, seed + 12, 0.0f, 1.0f);
    cudaCheck(cudaMemcpy(cosv, csf.data(), csf.size() * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(sinv, snf.data(), snf.size() * 4, cudaMemcpyHostToDevice));
    // reference
    std::vector<double> x = fetch_bf16_d(inp, nel), wd = fetch_bf16_d(w, HD), dd = fetch_f32_d(dout, nel);
    std::vector<double> cs(csf.begin(), csf.end()), sn(snf.begin(), snf.end());
    std::vector<double> rout(nel), rrstd(rows), rdinp(nel), rdw(HD);
    ref_qk_forward(x.data(), wd.data(), cs.data(), sn.data(), rows, T, nh, HD, rout.data(), rrstd.data());
    ref_qk_backward(dd.data(), x.data(), wd.data(), cs.data(), sn.data(), rows, T, nh, HD, rdinp.data(), rdw.data());
    bool ok = true;
    std::vector<unsigned char> first[4];
    for (int rep = 0; rep < 2; rep++) {
        cudaCheck(cudaMemset(b.out, 0xFF, nel * 2)); cudaCheck(cudaMemset(b.rstd, 0xFF, rows * 4));
        cudaCheck(cudaMemset(b.dinp, 0xFF, nel * 2)); cudaCheck(cudaMemset(b.partial, 0xFF, RED_PARTS_MAX * HD * 4));
        cudaCheck(cudaMemset(b.dw, 0, HD * 4));   // dw accumulates (the trainer zeroes the grads once a step)
        qk_forward(ver, b);
        qk_backward(ver, b);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<unsigned char> out[4] = {fetch_bytes(b.out, nel * 2), fetch_bytes(b.rstd, rows * 4),
                                             fetch_bytes(b.dinp, nel * 2), fetch_bytes(b.dw, HD * 4)};
        if (repeat_done(rep, out, first, ok)) { break; }
        printf("  qk v%d B=%-2d T=%-4d nh=%-2d HD=%-3d rows %-7zu", ver, B, T, nh, HD, rows);
        ok &= compare("out", bytes_bf16_to_f(out[0]), rout, 0x1p-7, ver == 1 ? 0x1p-7 : 1e-4);
        ok &= compare("rstd", bytes_f32(out[1]), rrstd, 1e-5, 0);
        ok &= compare("dinp", bytes_bf16_to_f(out[2]), rdinp, 0x1p-7, 1e-4);
        ok &= compare("dw", bytes_f32(out[3]), rdw, 1e-4, 1e-4);
        printf("\n");
    }
    if (ver == 4) {   // v4's forward is v3's arithmetic: the same out and rstd, at 2 and 4 rows a lane
        const char *what[2] = {"v3", "v4 with 4 rows a lane"};
        for (int k = 0; k < 2; k++) {
            cudaCheck(cudaMemset(b.out, 0xFF, nel * 2)); cudaCheck(cudaMemset(b.rstd, 0xFF, rows * 4));
            qk4_rpl = 4;
            qk_forward(k == 0 ? 3 : 4, b);
            qk4_rpl = 2;
            cudaCheck(cudaDeviceSynchronize());
            const bool same = fetch_bytes(b.out, nel * 2) == first[0] && fetch_bytes(b.rstd, rows * 4) == first[1];
            printf("  qk v4 vs %s: out, rstd %s\n", what[k], same ? "bit-identical" : "DIFFER (within the tolerances above)");
        }
    }
    cudaCheck(cudaFree(inp)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(cosv)); cudaCheck(cudaFree(sinv));
    cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(b.out)); cudaCheck(cudaFree(b.rstd)); cudaCheck(cudaFree(b.dinp));
    cudaCheck(cudaFree(b.dw)); cudaCheck(cudaFree(b.partial)); cudaCheck(cudaFree(b.scratch));
    return ok;
}

static bool check_qk(int ver, uint64_t seed) {
    printf("qk v%d check (tolerances: out rtol 2^-7 + atol %s max; rstd rtol 1e-5; dinp rtol 2^-7 + atol 1e-4 max;"
           " dw rtol 1e-4 + atol 1e-4 max)\n", ver, ver == 1 ? "2^-7" : "1e-4");
    bool ok = true;
    if (!quick) {
        ok &= check_qk_shape(ver, 16, 2048, 8, 64, seed + 1);    // 100m q
        ok &= check_qk_shape(ver, 16, 2048, 4, 64, seed + 2);    // 100m k
        ok &= check_qk_shape(ver, 16, 1024, 16, 128, seed + 3);  // 1b q
        ok &= check_qk_shape(ver, 16, 1024, 8, 128, seed + 4);   // 1b k
    }
    ok &= check_qk_shape(ver, 3, 37, 5, 32, seed + 5);       // small, odd row count (555)
    ok &= check_qk_shape(ver, 2, 19, 3, 48, seed + 6);       // HD=48: v1, v2 only
    ok &= check_qk_shape(ver, 1, 300, 2, 64, seed + 7);      // 600 rows: 10 partitions, the last partial
    ok &= check_qk_shape(ver, 1, 100, 3, 128, seed + 8);
    printf("qk v%d check: %s\n", ver, ok ? "PASS" : "FAIL");
    return ok;
}

// n = N*F elements (F: v4's row width; the other versions see n elements in a row)
static bool check_sw_shape(int ver, size_t N, int F, uint64_t seed) {
    const size_t n = N * F;
    floatX *g = dalloc<floatX>(n), *u = dalloc<floatX>(n);
    float *dout = dalloc<float>(n);
    SwBufs b = {g, u, dalloc<floatX>(n), dout, dalloc<floatX>(n), dalloc<floatX>(n), n};
    fill_gate_kernel<<<4096, 256>>>(g, n, seed);
    launchCheck();
    fill_normal(u, n, seed + 21, 0.0f, 1.0f);
    fill_normal(dout, n, seed + 22, 0.0f, 1e-2f);
    // v4: g and u side by side in each row of gu, dout in bf16 (the reference takes its values)
    floatX *gu = NULL, *dgu = NULL, *dout16 = NULL;
    if (ver == 4) {
        gu = dalloc<floatX>(2 * n); dgu = dalloc<floatX>(2 * n); dout16 = dalloc<floatX>(n);
        cudaCheck(cudaMemcpy2D(gu, 4 * (size_t)F, g, 2 * (size_t)F, 2 * (size_t)F, N, cudaMemcpyDeviceToDevice));
        cudaCheck(cudaMemcpy2D(gu + F, 4 * (size_t)F, u, 2 * (size_t)F, 2 * (size_t)F, N, cudaMemcpyDeviceToDevice));
        fill_normal(dout16, n, seed + 22, 0.0f, 1e-2f);   // dout's draws, in bf16
    }
    const SwBufs4 b4 = {gu, b.out, dout16, dgu, N, F};
    std::vector<double> gd = fetch_bf16_d(g, n), ud = fetch_bf16_d(u, n),
                        dd = ver == 4 ? fetch_bf16_d(dout16, n) : fetch_f32_d(dout, n);
    std::vector<double> rout(n), rdg(n), rdu(n);
    for (size_t i = 0; i < n; i++) { ref_swiglu(gd[i], ud[i], dd[i], &rout[i], &rdg[i], &rdu[i]); }
    gd.clear(); gd.shrink_to_fit(); ud.clear(); ud.shrink_to_fit(); dd.clear(); dd.shrink_to_fit();
    bool ok = true;
    std::vector<unsigned char> first[3];
    for (int rep = 0; rep < 2; rep++) {
        cudaCheck(cudaMemset(b.out, 0xFF, n * 2)); cudaCheck(cudaMemset(b.dg, 0xFF, n * 2));
        cudaCheck(cudaMemset(b.du, 0xFF, n * 2));
        if (ver == 4) {
            cudaCheck(cudaMemset(dgu, 0xFF, n * 4));
            swiglu_v4(b4, true);
            swiglu_v4(b4, false);
            cudaCheck(cudaMemcpy2D(b.dg, 2 * (size_t)F, dgu, 4 * (size_t)F, 2 * (size_t)F, N, cudaMemcpyDeviceToDevice));
            cudaCheck(cudaMemcpy2D(b.du, 2 * (size_t)F, dgu + F, 4 * (size_t)F, 2 * (size_t)F, N, cudaMemcpyDeviceToDevice));
        } else {
            swiglu_forward(ver, b);
            swiglu_backward(ver, b);
        }
        cudaCheck(cudaDeviceSynchronize());
        std::vector<unsigned char> out[3] = {fetch_bytes(b.out, n * 2), fetch_bytes(b.dg, n * 2),
                                             fetch_bytes(b.du, n * 2)};
        if (repeat_done(rep, out, first, ok)) { break; }
        printf("  swiglu v%d n=%-9zu F=%-5d%s", ver, n, F,
               (ver == 3 && n % PACK) || (ver == 4 && F % PACK) ? " (one element a thread)" : "");
        ok &= compare("out", bytes_bf16_to_f(out[0]), rout, 0x1p-7, 1e-5);
        ok &= compare("dg", bytes_bf16_to_f(out[1]), rdg, 0x1p-7, 1e-5);
        ok &= compare("du", bytes_bf16_to_f(out[2]), rdu, 0x1p-7, 1e-5);
        printf("\n");
    }
    cudaCheck(cudaFree(g)); cudaCheck(cudaFree(u)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(b.out));
    cudaCheck(cudaFree(b.dg)); cudaCheck(cudaFree(b.du));
    if (ver == 4) { cudaCheck(cudaFree(gu)); cudaCheck(cudaFree(dgu)); cudaCheck(cudaFree(dout16)); }
    return ok;
}

static bool check_sw(int ver, uint64_t seed) {
    printf("swiglu v%d check (tolerances: out, dg, du rtol 2^-7 + atol 1e-5 max)\n", ver);
    bool ok = true;
    if (!quick) { ok &= check_sw_shape(ver, 32768, 1536, seed + 1); }   // the 100m shape
    ok &= check_sw_shape(ver, 1000003, 1, seed + 2);   // odd n (v3), F = 1 (v4): the one-element paths
    ok &= check_sw_shape(ver, 8, 4099, seed + 3);
    ok &= check_sw_shape(ver, 37, 96, seed + 4);       // v4: packs in short rows
    printf("swiglu v%d check: %s\n", ver, ok ? "PASS" : "FAIL");
    return ok;
}

// ============================================================================
// Bench: CUDA events around one step's calls of the op at the trainer's shapes
// (every layer on its own buffers, as in the trainer, so L2 does not hold the
// inputs between calls); 2 warm-ups, then the median of --reps repeats.
// ============================================================================

static void print_time(const char *op, int ver, const char *what, float ms, float mn, double bytes, double copy_gbs,
                       double profile_ms) {
    double floor4 = bytes / 4.0e9, floorc = bytes / (copy_gbs * 1e6);   // ms: bytes / (B/s) * 1e3
    printf("  %-6s v%d %-40s %8.3f ms", op, ver, what, ms);
    if (mn > 0) { printf(" (min %.3f)", mn); } else { printf("            "); }
    printf(" %6.3f GB %6.0f GB/s  floor %.3f ms at 4.0 TB/s (%.2fx), %.3f at copy", bytes / 1e9,
           bytes / (ms * 1e-3) / 1e9, floor4, ms / floor4, floorc);
    if (profile_ms > 0) { printf("  [trainer profile, H200: %.2f ms]", profile_ms); }
    printf("\n");
}

// The H200 per-op profile of the trainer (session 2, 100m, B=16, T=2048; ms per
// step; bench_gpu_h200_2026-11-29.txt (a raw log of that session, removed from the tree; in git history) for v2/v3; the v1 figures
// from the profile before df51936 / 5f86eff). 0: not measured.
static const double PROF_CE[5][2] = {{0, 0}, {4.94, 5.82}, {1.40, 1.65}, {0, 0}, {0, 0}};
static const double PROF_QK[5][2] = {{0, 0}, {2.12, 4.22}, {1.24, 2.86}, {0, 0}, {0, 0}};
static const double PROF_SW[5][2] = {{0, 0}, {2.68, 3.16}, {3.05, 5.96}, {0.90, 1.69}, {0, 0}};

static void bench_ce(int ver, int reps, uint64_t seed, double copy_gbs) {
    const Model &m = M100;
    const size_t N = (size_t)m.B * m.T;
    const int V = m.V, Vp = m.Vp;
    if (!ce_supported(ver, V, Vp)) { printf("  ce v%d: skip (unsupported)\n", ver); return; }
    floatX *logits = dalloc<floatX>(N * Vp), *pristine = dalloc<floatX>(N * Vp);
    int *targets = dalloc<int>(N);
    float *losses = dalloc<float>(N), *lse = dalloc<float>(N);
    ce_fill_kernel<<<8192, 256>>>(pristine, N, V, Vp, seed);
    launchCheck();
    ce_targets_kernel<<<ceil_div(N, 256), 256>>>(targets, N, V, seed);
    launchCheck();
    CeBufs b = {logits, targets, losses, lse, N, V, Vp, 1.0f / (float)N};
    auto restore = [&]() { cudaCheck(cudaMemcpyAsync(logits, pristine, N * Vp * sizeof(floatX), cudaMemcpyDeviceToDevice)); };
    char what[96];
    float mn;
    if (ver <= 2) {
        restore();
        float f = time_median(reps, [&]() { ce_forward(ver, b); }, no_pre, &mn);
        snprintf(what, sizeof what, "fwd N=%zu V=%d Vp=%d", N, V, Vp);
        print_time("ce", ver, what, f, mn, ce_bytes_fwd(N, V), copy_gbs, PROF_CE[ver][0]);
        float g = time_median(reps, [&]() { ce_backward(ver, b); }, restore, &mn);
        snprintf(what, sizeof what, "bwd (in place)");
        print_time("ce", ver, what, g, mn, ce_bytes_bwd(N, V, Vp), copy_gbs, PROF_CE[ver][1]);
        printf("  ce     v%d fwd + bwd %.3f ms  [trainer profile, H200: %.2f ms]\n", ver, f + g,
               PROF_CE[ver][0] + PROF_CE[ver][1]);
    } else {
        float f = time_median(reps, [&]() { ce_forward(ver, b); }, restore, &mn);
        snprintf(what, sizeof what, "fused fwd + bwd N=%zu V=%d Vp=%d", N, V, Vp);
        print_time("ce", ver, what, f, mn, ce_bytes_fused(N, V, Vp), copy_gbs, PROF_CE[ver][0]);
        printf("  ce     v%d compare with v2's fwd + bwd (trainer profile: %.2f ms)\n", ver, PROF_CE[2][0] + PROF_CE[2][1]);
    }
    cudaCheck(cudaFree(logits)); cudaCheck(cudaFree(pristine)); cudaCheck(cudaFree(targets));
    cudaCheck(cudaFree(losses)); cudaCheck(cudaFree(lse));
}

// One step of a model's QK-norm + RoPE: L layers x (q with NH heads, k with NKV heads)
static void bench_qk(int ver, const Model &m, int reps, uint64_t seed, double copy_gbs) {
    if (!qk_supported(ver, m.HD)) { printf("  qk v%d %s: skip (unsupported HD=%d)\n", ver, m.name, m.HD); return; }
    const int HD = m.HD, L = m.L;
    std::vector<float> csf, snf;
    rope_tables(csf, snf, m.T, HD);
    float *cosv = dalloc<float>(csf.size()), *sinv = dalloc<float>(snf.size());
    cudaCheck(cudaMemcpy(cosv, csf.data(), csf.size() * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(sinv, snf.data(), snf.size() * 4, cudaMemcpyHostToDevice));
    float tf[2], tb[2];
    double bf[2], bb[2];
    for (int qk = 0; qk < 2; qk++) {
        const int nh = qk == 0 ? m.NH : m.NKV;
        const size_t rows = (size_t)m.B * m.T * nh, nel = rows * HD;
        // per layer: inp (qr), out (q), rstd, w, dw; shared by the layers, as in the trainer:
        // dout (dq, fp32), dinp (dqr), the partials and v1's fp32 scratch
        floatX *inp = dalloc<floatX>(nel * L), *out = dalloc<floatX>(nel * L), *w = dalloc<floatX>((size_t)HD * L);
        float *rstd = dalloc<float>(rows * L), *dw = dalloc<float>((size_t)HD * L);
        float *dout = dalloc<float>(nel), *partial = dalloc<float>((size_t)RED_PARTS_MAX * HD);
        float *scratch = ver == 1 ? dalloc<float>(nel) : nullptr;
        floatX *dinp = dalloc<floatX>(nel);
        fill_rows_kernel<<<4096, 256>>>(inp, rows * L, HD, seed + qk);
        launchCheck();
        fill_normal(w, (size_t)HD * L, seed + 11, 1.0f, 0.3f);
        fill_normal(dout, nel, seed + 12, 0.0f, 1.0f);
        zero(dw, (size_t)HD * L * 4);
        std::vector<QkBufs> lay(L);
        for (int l = 0; l < L; l++) {
            QkBufs &b = lay[l];
            b.inp = inp + l * nel; b.out = out + l * nel; b.rstd = rstd + l * rows; b.w = w + (size_t)l * HD;
            b.cosv = cosv; b.sinv = sinv; b.dout = dout; b.dinp = dinp; b.dw = dw + (size_t)l * HD;
            b.partial = partial; b.scratch = scratch;
            b.B = m.B; b.T = m.T; b.nh = nh; b.HD = HD;
        }
        float mn;
        tf[qk] = time_median(reps, [&]() { for (int l = 0; l < L; l++) { qk_forward(ver, lay[l]); } }, no_pre, &mn);
        bf[qk] = qk_bytes_fwd((double)rows * L, HD);
        char what[96];
        snprintf(what, sizeof what, "%s fwd %d x (B=%d T=%d nh=%d HD=%d)", m.name, L, m.B, m.T, nh, HD);
        print_time("qk", ver, what, tf[qk], mn, bf[qk], copy_gbs, 0);
        if (ver == 4) {   // the same with 4 rows a lane
            qk4_rpl = 4;
            float f4 = time_median(reps, [&]() { for (int l = 0; l < L; l++) { qk_forward(ver, lay[l]); } }, no_pre, &mn);
            qk4_rpl = 2;
            snprintf(what, sizeof what, "%s fwd, 4 rows a lane", m.name);
            print_time("qk", ver, what, f4, mn, bf[qk], copy_gbs, 0);
        }
        tb[qk] = time_median(reps, [&]() { for (int l = 0; l < L; l++) { qk_backward(ver, lay[l]); } }, no_pre, &mn);
        bb[qk] = qk_bytes_bwd((double)rows * L, HD);
        snprintf(what, sizeof what, "%s bwd %d x (B=%d T=%d nh=%d HD=%d)", m.name, L, m.B, m.T, nh, HD);
        print_time("qk", ver, what, tb[qk], mn, bb[qk], copy_gbs, 0);
        {   // the backward's last kernel alone: L sums of the P x HD dw partials
            const int R = red_rows_per_part(rows), P = (int)ceil_div(rows, R);
            float r = time_median(reps, [&]() {
                for (int l = 0; l < L; l++) {
                    if (ver >= 3) { reduce_partials_warp_kernel<<<ceil_div(HD, 8), 256>>>(lay[l].dw, partial, P, HD); }
                    else { reduce_partials_kernel<<<ceil_div(HD, 256), 256>>>(lay[l].dw, partial, P, HD); }
                }
                launchCheck();
            }, no_pre, &mn);
            printf("  qk     v%d   of which the dw partials' sum: %d x (P=%d, HD=%d) %.3f ms (%s)\n", ver, L, P, HD, r,
                   ver >= 3 ? "a warp per channel" : "reduce_partials_kernel, a thread per channel");
        }
        cudaCheck(cudaFree(inp)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(rstd));
        cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(partial)); cudaCheck(cudaFree(dinp));
        if (scratch) { cudaCheck(cudaFree(scratch)); }
    }
    const bool is100 = &m == &M100;
    print_time("qk", ver, "per step: fwd q + k", tf[0] + tf[1], 0, bf[0] + bf[1], copy_gbs, is100 ? PROF_QK[ver][0] : 0);
    print_time("qk", ver, "per step: bwd q + k", tb[0] + tb[1], 0, bb[0] + bb[1], copy_gbs, is100 ? PROF_QK[ver][1] : 0);
    cudaCheck(cudaFree(cosv)); cudaCheck(cudaFree(sinv));
}

// One step of the 100m model's SwiGLU: 12 layers of n = N*F
static void bench_sw(int ver, int reps, uint64_t seed, double copy_gbs) {
    const Model &m = M100;
    const int L = m.L;
    const size_t n = (size_t)m.B * m.T * m.F;
    // per layer: g (mg), u (mu), out (mh); shared, as in the trainer: dout (dmh, fp32), dg, du
    floatX *g = dalloc<floatX>(n * L), *u = dalloc<floatX>(n * L), *out = dalloc<floatX>(n * L);
    float *dout = dalloc<float>(n);
    floatX *dg = dalloc<floatX>(n), *du = dalloc<floatX>(n);
    fill_gate_kernel<<<4096, 256>>>(g, n * L, seed);
    launchCheck();
    fill_normal(u, n * L, seed + 21, 0.0f, 1.0f);
    fill_normal(dout, n, seed + 22, 0.0f, 1e-2f);
    std::vector<SwBufs> lay(L);
    for (int l = 0; l < L; l++) { lay[l] = {g + l * n, u + l * n, out + l * n, dout, dg, du, n}; }
    // v4: g, u of a layer in one (N, 2F) buffer (the values do not matter for the time), dout in
    // bf16, dg, du into one (N, 2F) buffer
    floatX *gu = NULL, *dgu = NULL, *dout16 = NULL;
    std::vector<SwBufs4> lay4(L);
    if (ver == 4) {
        gu = dalloc<floatX>(2 * n * L); dgu = dalloc<floatX>(2 * n); dout16 = dalloc<floatX>(n);
        fill_gate_kernel<<<4096, 256>>>(gu, 2 * n * L, seed);
        launchCheck();
        fill_normal(dout16, n, seed + 22, 0.0f, 1e-2f);
        for (int l = 0; l < L; l++) { lay4[l] = {gu + 2 * l * n, out + l * n, dout16, dgu, (size_t)m.B * m.T, m.F}; }
    }
    auto run = [&](bool fwd) {
        for (int l = 0; l < L; l++) {
            if (ver == 4) { swiglu_v4(lay4[l], fwd); }
            else if (fwd) { swiglu_forward(ver, lay[l]); }
            else { swiglu_backward(ver, lay[l]); }
        }
    };
    float mn;
    char what[96];
    float f = time_median(reps, [&]() { run(true); }, no_pre, &mn);
    snprintf(what, sizeof what, "per step: fwd %d x (n=%zu)", L, n);
    print_time("swiglu", ver, what, f, mn, sw_bytes_fwd((double)n * L), copy_gbs, PROF_SW[ver][0]);
    float b = time_median(reps, [&]() { run(false); }, no_pre, &mn);
    snprintf(what, sizeof what, "per step: bwd %d x (n=%zu)%s", L, n, ver == 4 ? ", dout bf16" : "");
    print_time("swiglu", ver, what, b, mn, ver == 4 ? 10.0 * n * L : sw_bytes_bwd((double)n * L), copy_gbs,
               PROF_SW[ver][1]);
    if (ver == 4) { cudaCheck(cudaFree(gu)); cudaCheck(cudaFree(dgu)); cudaCheck(cudaFree(dout16)); }
    cudaCheck(cudaFree(g)); cudaCheck(cudaFree(u)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(dout));
    cudaCheck(cudaFree(dg)); cudaCheck(cudaFree(du));
}

// ============================================================================

// the versions of each op: 1..VMAX
#define CE_VMAX 4
#define QK_VMAX 4
#define SW_VMAX 4

int main(int argc, char **argv) {
    int ver = 0, reps = 20;
    bool do_check = false, do_bench = false, do_all = false, do_self = false, do_bytes = false;
    bool op_ce = false, op_qk = false, op_sw = false;
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
            if (!strcmp(o, "ce")) { op_ce = true; }
            else if (!strcmp(o, "qk")) { op_qk = true; }
            else if (!strcmp(o, "swiglu")) { op_sw = true; }
            else { fprintf(stderr, "error: --op takes ce, qk or swiglu\n"); return 1; }
        }
        else if (!strcmp(a, "--check")) { do_check = true; }
        else if (!strcmp(a, "--bench")) { do_bench = true; }
        else if (!strcmp(a, "--all")) { do_all = true; }
        else if (!strcmp(a, "--cpu-selftest")) { do_self = true; }
        else if (!strcmp(a, "--bytes")) { do_bytes = true; }
        else if (!strcmp(a, "--seed")) { seed = strtoull(val(), NULL, 10); }
        else if (!strcmp(a, "--reps")) { reps = atoi(val()); }
        else if (!strcmp(a, "--quick")) { quick = true; }
        else { fprintf(stderr, "error: unknown flag %s (see the top of dev/cuda/elementwise.cu)\n", a); return 1; }
    }
    if (do_self) { return cpu_selftest(seed); }
    if (do_bytes) { print_bytes(); return 0; }
    if (ver < 0 || ver > 4 || reps < 1) {
        fprintf(stderr, "usage: elementwise [--op ce|qk|swiglu] [--version 1..4] [--check] [--bench] [--seed S]"
                        " [--reps R];  elementwise --all;  elementwise --cpu-selftest;  elementwise --bytes\n");
        return 1;
    }
    if (do_all || (!op_ce && !op_qk && !op_sw)) { op_ce = op_qk = op_sw = true; }
    if (do_all || (!do_check && !do_bench)) { do_check = do_bench = true; }
    if (do_all) { ver = 0; }
    const int v0 = ver ? ver : 1, v1 = ver ? ver : 4;
    print_device(seed);
    bool ok = true;
    if (do_check) {
        for (int v = v0; v <= v1; v++) {
            if (op_ce && v <= CE_VMAX) { ok &= check_ce(v, seed); }
            if (op_qk && v <= QK_VMAX) { ok &= check_qk(v, seed); }
            if (op_sw && v <= SW_VMAX) { ok &= check_sw(v, seed); }
        }
    }
    if (do_bench) {
        double gbs = bench_intro(reps);
        for (int v = v0; v <= v1; v++) {
            if (op_ce && v <= CE_VMAX) { bench_ce(v, reps, seed, gbs); }
            if (op_qk && v <= QK_VMAX) { bench_qk(v, M100, reps, seed, gbs); bench_qk(v, M1B, reps, seed, gbs); }
            if (op_sw && v <= SW_VMAX) { bench_sw(v, reps, seed, gbs); }
        }
    }
    if (do_check) { printf("all checks: %s\n", ok ? "PASS" : "FAIL"); }
    return ok ? 0 : 1;
}
