// kernels/crossentropy.cuh: softmax over the V real logits of rows of Vp (padded,
// a multiple of 128) and cross-entropy with the targets: losses (N), lse (N) fp32;
// dlogits = (softmax - onehot) dloss written over the logits, 0 in the padding.
//  - crossentropy_fused (a training step): forward and backward in one kernel, a
//    persistent grid with the rows staged in shared memory and fetched ahead by TMA
//    (sm_90). Lab dev/cuda/elementwise.cu ce v4.
//  - crossentropy_forward / crossentropy_backward: evaluation (forward alone), and
//    the fallback where a row of Vp does not fit in shared memory, the device or the
//    build is below sm_90, or dloss is not known at forward time
//    (crossentropy_use_fused). Lab dev/cuda/elementwise.cu ce v2.
#pragma once

// ----------------------------------------------------------------------------
// Classifier: softmax over the V real logits and cross-entropy with targets.
// Statistics in fp32. The probabilities are not stored: the backward pass
// recomputes them from the logits and lse (the fused kernel: from the row in
// shared memory).
// A training step runs crossentropy_fused (forward and backward in one kernel,
// from model_forward); evaluation runs crossentropy_forward alone, and
// crossentropy_backward runs after a forward that was not given dloss, or where
// the fused kernel does not run (crossentropy_use_fused).

#define CE_THREADS 512

// The logits rows start at multiples of Vp (a multiple of 128), so every 16-byte
// Pack of a row is aligned.

// The forward and backward kernels: one block per position n.
// One pass over the row: each thread keeps a running
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

// Fused forward and backward (the kernel lab's v4, dev/cuda/elementwise.cu), for
// a training step: the trainer knows dloss before the forward, and the logits of
// a training forward are read again only by the backward. So one kernel writes
// losses, lse AND dlogits (in place over the logits), reading the row from HBM
// once where the two kernels above read it twice.
// A persistent grid: one block of CE_THREADS an SM at Vp = 50304 (as many as are
// resident at once, at most N), block g takes the rows n = g + j gridDim.x,
// j = 0, 1, ..., with nbuf row buffers in shared memory (2 where they fit: 201 KB
// at Vp = 50304 in bf16; 1 in the fp32 build there), row j in buffer j % nbuf.
// Thread 0 fetches a row by TMA 1D bulk copies (cp.async.bulk, sm_90) that
// complete on the buffer's mbarrier; row j + nbuf is fetched into buffer j % nbuf
// as soon as every thread is done with row j, so while the block reduces a row and
// writes its dlogits, the next row is already on its way and HBM stays busy.
// Per row: pass 1 takes the packs from shared memory and keeps the online max
// and sum in base 2 (one FMA and one exp2f per value); after the block merge,
// pass 2 writes dlogits from the same packs. Full packs skip the per-value
// column check. Thread t takes the packs t, t + CE_THREADS, ... in both passes.
// In place is safe: a row is fetched once, by its own block, and its dlogits are
// written only after that fetch completed; the fetches in flight are of later
// rows, which no block writes before it has fetched them.
// The fetch copies the row's first nreal packs (nreal x 16 bytes, a multiple of
// 16 as cp.async.bulk needs; rows start at multiples of Vp, 16-byte aligned).
#define CE_FUSED_NBUF_MAX 2
#define CE_FUSED_CHUNK 16384u   // bytes per bulk copy: a row of 100 KB goes as 7 copies on one mbarrier
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

// The fetch's mbarriers (sm_90; compiled to nothing below it, where
// crossentropy_setup keeps the host from launching the kernel).
// thread 0: the mbarriers bar[0..nb) with an arrival count of 1, visible to the async proxy (TMA)
__device__ __forceinline__ void ce_mbar_init(uint64_t *bar, int nb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (int b = 0; b < nb; b++) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((unsigned)__cvta_generic_to_shared(&bar[b]))
                     : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// thread 0: arm the mbarrier bar for `bytes`, then copy them from global src to
// shared dst by TMA bulk copies that complete on bar
__device__ __forceinline__ void ce_fetch_row(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // the block's generic-proxy reads of dst (a previous row) before the async-proxy writes
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
    for (unsigned off = 0; off < bytes; off += CE_FUSED_CHUNK) {
        const unsigned c = bytes - off < CE_FUSED_CHUNK ? bytes - off : CE_FUSED_CHUNK;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"((unsigned)__cvta_generic_to_shared((char *)dst + off)), "l"((const char *)src + off),
                     "r"(c), "r"(b)
                     : "memory");
    }
#endif
}

// every thread: wait until the mbarrier bar completes the phase of this parity; a
// wait past 2^34 clocks (~10 s) is a pipeline bug: trap, so the launch fails instead of hanging
__device__ __forceinline__ void ce_mbar_wait(uint64_t *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    long long t0 = 0;
    for (int spin = 0;; spin++) {
        unsigned done;
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(b), "r"(parity) : "memory");
        if (done) { return; }
        if (spin == 0) { t0 = clock64(); }
        else if (clock64() - t0 > (1ll << 34)) { __trap(); }
    }
#endif
}

// dlogits, logits (N, Vp) (the same buffer in the trainer); losses, lse, targets (N);
// dynamic shared memory: nbuf x Vp floatX
__global__ void __launch_bounds__(CE_THREADS, 1)
crossentropy_fused_kernel(floatX *dlogits, float *losses, float *lse, const floatX *logits, const int *targets,
                          float dloss, size_t N, int V, int Vp, int nbuf) {
    extern __shared__ Pack ce_buf[];                  // nbuf buffers of Vp / PACK packs; the first nreal used
    __shared__ uint64_t ce_bar[CE_FUSED_NBUF_MAX];    // buffer b's mbarrier: completes when its row has arrived
    const float LN2f = 0.6931471805599453f;
    const int full = V / PACK, nreal = (V + PACK - 1) / PACK, npk = Vp / PACK;
    const unsigned bytes = (unsigned)nreal * 16u;
    const size_t G = gridDim.x;
    if (threadIdx.x == 0) {
        ce_mbar_init(ce_bar, nbuf);
        for (int j = 0; j < nbuf && blockIdx.x + j * G < N; j++) {
            ce_fetch_row(ce_buf + (size_t)j * npk, logits + (blockIdx.x + j * G) * Vp, bytes, &ce_bar[j]);
        }
    }
    __syncthreads();   // the mbarriers initialised before anyone waits on them
    size_t j = 0;      // this block's row count so far
    for (size_t n = blockIdx.x; n < N; n += G, j++) {
        const int b = (int)(j % nbuf);
        const Pack *row = ce_buf + (size_t)b * npk;
        Pack *drow = (Pack *)(dlogits + n * Vp);
        const int target = targets[n], tk = target / PACK, te = target % PACK;   // loaded while pass 1 runs
        ce_mbar_wait(&ce_bar[b], (unsigned)(j / nbuf) & 1u);   // the buffer's (j / nbuf)-th fetch has landed
        // pass 1: online softmax in base 2
        float m = -INFINITY, s = 0.0f;
        #pragma unroll 4
        for (int k = threadIdx.x; k < nreal; k += blockDim.x) {
            const Pack x = row[k];
            if (k < full) { ce_fused_update<true>(x, PACK, m, s); }
            else { ce_fused_update<false>(x, V - k * PACK, m, s); }
        }
        const float M = block_max(m);
        const float ML = M * CE_LOG2E;
        const float S = block_sum(m == -INFINITY ? 0.0f : s * exp2f(m * CE_LOG2E - ML));
        const float l2 = ML + log2f(S);   // lse in base 2
        if (threadIdx.x == 0) {
            lse[n] = l2 * LN2f;
            losses[n] = l2 * LN2f - toF(row[tk].v[te]);
        }
        // pass 2: a pack in one 16-byte shared load; the padding packs are written without being read
        for (int k = threadIdx.x; k < npk; k += blockDim.x) {
            Pack d, x;
            if (k < nreal) { *(uint4 *)&x = *(const uint4 *)&row[k]; }
            if (k < full) {
                d = ce_fused_grad<true>(x, PACK, k == tk ? te : -1, l2, dloss);
            } else if (k < nreal) {
                d = ce_fused_grad<false>(x, V - k * PACK, k == tk ? te : -1, l2, dloss);
            } else {
                #pragma unroll
                for (int e = 0; e < PACK; e++) { d.v[e] = fromF<floatX>(0.0f); }
            }
            drow[k] = d;
        }
        __syncthreads();   // every thread is done with buffer b
        if (threadIdx.x == 0 && n + nbuf * G < N) {
            ce_fetch_row(ce_buf + (size_t)b * npk, logits + (n + nbuf * G) * Vp, bytes, &ce_bar[b]);
        }
    }
}

// The fused kernel's launch, as set by crossentropy_setup (0 buffers: not runnable)
int ce_fused_vp = 0;          // the Vp it was set up for
int ce_fused_nbuf = 0;        // row buffers in shared memory (1 or 2; 0: the fused kernel does not run)
unsigned ce_fused_grid = 0;   // blocks resident at once on the device (the grid, where N is larger)

// Once per model (model_build): the fused kernel's row buffers at this Vp (2 where
// they fit in the device's shared memory per block next to the static 272 bytes,
// else 1, else none), its shared memory limit and its grid. None either below
// sm_90 (no TMA) or where this build has no sm_90 code for it (GPU_ARCH).
void crossentropy_setup(int Vp) {
    ce_fused_vp = Vp;
    ce_fused_nbuf = 0;
    int dev = 0, optin = 0, major = 0, sms = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaFuncAttributes fa;
    cudaCheck(cudaFuncGetAttributes(&fa, crossentropy_fused_kernel));
    if (major < 9 || fa.binaryVersion < 90) { return; }
    int nbuf = 0;
    for (int nb = CE_FUSED_NBUF_MAX; nb >= 1 && nbuf == 0; nb--) {
        if ((size_t)nb * Vp * sizeof(floatX) + 1024 <= (size_t)optin) { nbuf = nb; }
    }
    if (nbuf == 0) { return; }
    const size_t smem = (size_t)nbuf * Vp * sizeof(floatX);
    cudaCheck(cudaFuncSetAttribute(crossentropy_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, crossentropy_fused_kernel, CE_THREADS, smem));
    if (per_sm < 1) { return; }
    ce_fused_nbuf = nbuf;
    ce_fused_grid = (unsigned)(sms * per_sm);
}

// whether crossentropy_fused runs at this Vp (set up by crossentropy_setup); where
// not, the two kernels above do the work
bool crossentropy_use_fused(int Vp) { return Vp == ce_fused_vp && ce_fused_nbuf > 0; }

// crossentropy_forward and crossentropy_backward in one pass: losses (N), lse (N)
// and dlogits (N, Vp) = (probs - onehot(target)) * dloss, 0 in the padding
// columns, written over the logits (dlogits == logits)
void crossentropy_fused(floatX *dlogits, float *losses, float *lse, const floatX *logits, const int *targets,
                        float dloss, size_t N, int V, int Vp) {
    const size_t smem = (size_t)ce_fused_nbuf * Vp * sizeof(floatX);
    const unsigned grid = N < ce_fused_grid ? (unsigned)N : ce_fused_grid;
    crossentropy_fused_kernel<<<grid, CE_THREADS, smem>>>(dlogits, losses, lse, logits, targets, dloss, N, V, Vp,
                                                          ce_fused_nbuf);
    launchCheck();
}
