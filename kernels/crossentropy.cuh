// kernels/crossentropy.cuh: softmax over the V real logits of rows of Vp (padded,
// a multiple of 128) and cross-entropy with the targets: losses (N), lse (N) fp32;
// dlogits = (softmax - onehot) dloss written over the logits, 0 in the padding.
//  - crossentropy_fused (a training step): forward and backward in one kernel, the
//    row staged in shared memory. Lab dev/cuda/elementwise.cu ce v3.
//  - crossentropy_forward / crossentropy_backward: evaluation (forward alone), and
//    the fallback where a row of Vp does not fit in shared memory or dloss is not
//    known at forward time (crossentropy_use_fused). Lab dev/cuda/elementwise.cu ce v2.
#pragma once

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
// Vp = 50304 in bf16: 2 blocks per SM on an H100/H200).
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
