// kernels/adamw.cuh: the optimiser's kernels over the flat fp32 parameter and
// gradient arrays (n floats):
//  - grad_norm_l2: the L2 norm of the gradients, from fixed per-block fp64 partials of
//    a grid-stride share (float4 loads), summed in order on the host (deterministic).
//  - adamw_step: AdamW on one tensor with decoupled weight decay and the gradients
//    scaled by gscale (clipping); refreshes the floatX copy of the weights.
// One thread per element; the trainer's own simple kernels (no lab version).
#pragma once

#define NORM_BLOCKS 1024   // the partials of grad_norm_l2: a fixed count, so a fixed order of sums
#define NORM_THREADS 256
#define NORM_UNROLL 4       // float4 loads in flight per thread and round (16 floats)

// part[block] = sum of squares (fp64) of a fixed share of g: in each round the grid takes
// NORM_BLOCKS * NORM_THREADS * NORM_UNROLL float4s, thread t of block b the ones at
// (round base) + (u * NORM_BLOCKS + b) * NORM_THREADS + t for u < NORM_UNROLL, all loads
// first (64 bytes in flight per thread: the sum is bound by HBM, not by latency). The last
// n % 4 floats go to block 0's thread 0. g is 16-byte aligned (the gradient allocation).
__global__ void __launch_bounds__(NORM_THREADS) grad_norm_kernel(double *part, const float *g, size_t n) {
    __shared__ double sh[NORM_THREADS];
    const float4 *g4 = reinterpret_cast<const float4 *>(g);
    const size_t n4 = n / 4, stride = (size_t)NORM_BLOCKS * NORM_THREADS;
    double s = 0;
    for (size_t base = (size_t)blockIdx.x * NORM_THREADS + threadIdx.x; base < n4; base += stride * NORM_UNROLL) {
        float4 v[NORM_UNROLL];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; u++) {
            const size_t i = base + u * stride;
            v[u] = i < n4 ? g4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; u++) {
            s += (double)v[u].x * v[u].x + (double)v[u].y * v[u].y + (double)v[u].z * v[u].z + (double)v[u].w * v[u].w;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        for (size_t i = 4 * n4; i < n; i++) { s += (double)g[i] * g[i]; }
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = NORM_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) { sh[threadIdx.x] += sh[threadIdx.x + w]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { part[blockIdx.x] = sh[0]; }
}

// L2 norm of g (n floats, 16-byte aligned): fixed per-block partials (part: NORM_BLOCKS
// doubles of device scratch) summed in order on the host. The readback waits for the
// backward: the host needs the norm before AdamW (clipping, and the stop on a non-finite norm).
double grad_norm_l2(const float *g, size_t n, double *part) {
    double host[NORM_BLOCKS];
    grad_norm_kernel<<<NORM_BLOCKS, NORM_THREADS>>>(part, g, n);
    launchCheck();
    cudaCheck(cudaMemcpy(host, part, NORM_BLOCKS * sizeof(double), cudaMemcpyDeviceToHost));
    double total = 0;
    for (int i = 0; i < NORM_BLOCKS; i++) { total += host[i]; }
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

// p, m1, m2 (n) fp32 updated in place from grads * gscale; px (n) = floatX copy of p
// (skipped when px aliases p: fp32 build); bc1, bc2: the bias corrections 1 - beta^t
void adamw_step(float *p, floatX *px, const float *grads, float *m1, float *m2, size_t n, float lr, float beta1,
                float beta2, float eps, float decay, float gscale, float bc1, float bc2) {
    adamw_kernel<<<ceil_div(n, 256), 256>>>(p, px, grads, m1, m2, n, lr, beta1, beta2, eps, decay, gscale, bc1, bc2);
    launchCheck();
}
