// kernels/swiglu.cuh: SwiGLU over N rows of F, out = silu(g) * u, and its backward
// dg, du (floatX) from dout. g and u share one (N, 2F) buffer: row n holds g's F values,
// then u's (the gate/up matmul writes both as one product, and its backward reads dg, du
// the same way). One thread per 16-byte pack of each tensor; where F or a pointer does
// not allow packs (the one predicate packs_fit), the same kernels run one element a
// thread. Lab dev/cuda/elementwise.cu swiglu v3 (there with g and u apart).
#pragma once

// ----------------------------------------------------------------------------
// SwiGLU: out (N, F) = silu(g) * u, silu(z) = z * sigmoid(z); gu (N, 2F) = [g | u].

// Thread k handles the 16-byte pack k of out (8 bf16 or 4 fp32 values: PACK,
// common.cuh), and the packs of g and u at the same (row, column), so a warp reads
// whole cache lines. When F or a pointer does not allow packs, the same kernels run
// one element a thread.

__device__ inline float silu_sig(float g) { return 1.0f / (1.0f + expf(-g)); }

// element i of an (N, F) tensor -> its g in the (N, 2F) buffer (u is F further)
__device__ inline size_t gu_index(size_t i, int F) { return i / F * 2 * F + i % F; }

__global__ void swiglu_forward_kernel(floatX *out, const floatX *gu, size_t n, int F, int vec) {
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

// 1 if F and every pointer allow 16-byte packs (a pack never straddles a row), else 0
int packs_fit(int F, const void *a, const void *b, const void *c) {
    uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return F % PACK == 0 && bits % 16 == 0;
}

// out (N, F) from gu (N, 2F)
void swiglu_forward(floatX *out, const floatX *gu, size_t N, int F) {
    size_t n = N * F;
    int vec = packs_fit(F, out, gu, NULL) ? PACK : 1;
    swiglu_forward_kernel<<<ceil_div(n, 256 * (size_t)vec), 256>>>(out, gu, n, F, vec);
    launchCheck();
}

__global__ void swiglu_backward_kernel(floatX *dgu, const floatX *dout, const floatX *gu, size_t n, int F, int vec) {
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

// Writes (does not add) dgu (N, 2F) = [dg | du] in floatX: it feeds the gate/up matmul's
// backward. dout (N, F) is floatX too: the down matmul's backward sums in fp32 and rounds
// once, as for attention's datty (half the bytes of an fp32 dout, in the matmul and here).
void swiglu_backward(floatX *dgu, const floatX *dout, const floatX *gu, size_t N, int F) {
    size_t n = N * F;
    int vec = packs_fit(F, dgu, gu, dout) ? PACK : 1;
    swiglu_backward_kernel<<<ceil_div(n, 256 * (size_t)vec), 256>>>(dgu, dout, gu, n, F, vec);
    launchCheck();
}
