// kernels/adamw.cuh: the optimiser's kernels over the flat fp32 parameter and
// gradient arrays (n floats):
//  - grad_norm_l2: the L2 norm of the gradients, from fixed per-block fp64 partials of
//    a grid-stride share, summed in order on the host (deterministic).
//  - adamw_step: AdamW on one tensor with decoupled weight decay and the gradients
//    scaled by gscale (clipping); refreshes the floatX copy of the weights.
// One thread per element; the trainer's own simple kernels (no lab version).
#pragma once

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

// L2 norm of g (n): fixed per-block partials summed in order on the host
double grad_norm_l2(const float *g, size_t n) {
    double *d_part, part[NORM_BLOCKS];
    cudaCheck(cudaMalloc(&d_part, NORM_BLOCKS * sizeof(double)));
    grad_norm_kernel<<<NORM_BLOCKS, 256>>>(d_part, g, n);
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

// p, m1, m2 (n) fp32 updated in place from grads * gscale; px (n) = floatX copy of p
// (skipped when px aliases p: fp32 build); bc1, bc2: the bias corrections 1 - beta^t
void adamw_step(float *p, floatX *px, const float *grads, float *m1, float *m2, size_t n, float lr, float beta1,
                float beta2, float eps, float decay, float gscale, float bc1, float bc2) {
    adamw_kernel<<<ceil_div(n, 256), 256>>>(p, px, grads, m1, m2, n, lr, beta1, beta2, eps, decay, gscale, bc1, bc2);
    launchCheck();
}
