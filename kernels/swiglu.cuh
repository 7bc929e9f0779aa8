// kernels/swiglu.cuh: SwiGLU over n = N*F elements, out = silu(g) * u, and its
// backward dg, du (floatX) from dout. One thread per 16-byte pack of each tensor;
// where n or a pointer does not allow packs (the one predicate packs_fit), the same
// kernels run one element a thread. Lab dev/cuda/elementwise.cu swiglu v3.
#pragma once

// ----------------------------------------------------------------------------
// SwiGLU: out = silu(g) * u, silu(z) = z * sigmoid(z). All tensors (N*F).

// Thread k handles the 16-byte pack k of each tensor (8 bf16 or 4 fp32 values:
// PACK, common.cuh), so a warp reads whole cache lines. When n
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
// attention's datty (half the bytes of an fp32 dout, in the matmul and here).
void swiglu_backward(floatX *dg, floatX *du, const floatX *dout, const floatX *g, const floatX *u, size_t n) {
    int vec = packs_fit(n, dg, du, g, u) && (uintptr_t)dout % 16 == 0 ? PACK : 1;
    swiglu_backward_kernel<<<ceil_div(n, 256 * (size_t)vec), 256>>>(dg, du, dout, g, u, n, vec);
    launchCheck();
}
