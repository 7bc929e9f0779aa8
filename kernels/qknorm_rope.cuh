// kernels/qknorm_rope.cuh: QK-norm and RoPE fused, rows (B*T*nh, HD):
// out = rope(rmsnorm(inp; w)), w (HD), cosv, sinv (T, HD/2) fp32; rstd (rows) kept.
// The backward writes dinp (floatX) from dout (fp32) and adds dw from partials.
// One predicate, qk_packed_dispatch (HD/PACK a power of two from 2 to 32, rows
// 16-byte aligned), picks the kernels:
//  - fast: a lane owns one 16-byte pack of a row; the rotate-half partner is one
//    shuffle away. Lab dev/cuda/elementwise.cu qk v3.
//  - fallback: one warp per row, lane j holds the pairs j, j + 32, ... (bf16 HD = 8,
//    fp32 HD = 256). Lab dev/cuda/elementwise.cu qk v2.
#pragma once

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
//    is 16-byte aligned. The fp32 build runs the same code at PACK = 4.
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
                                   size_t rows, int T, int nh, int rows_per_part, size_t ld) {
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
            reinterpret_cast<Pack *>(dinp + n / nh * ld + n % nh * HD)[p] = dp;
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
// (deterministic)
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
                                            size_t rows, int T, int nh, int HD, int rows_per_part, size_t ld) {
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
        floatX *dn = dinp + n / nh * ld + n % nh * HD;
        for (int u = 0; u < QK_PAIRS; u++) {
            int j = lane + 32 * u;
            if (j >= half) { break; }
            dn[j] = fromF<floatX>(s * dy1[u] * toF(w[j]) - k3 * x1[u]);
            dn[j + half] = fromF<floatX>(s * dy2[u] * toF(w[j + half]) - k3 * x2[u]);
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
// norm weights. partial: scratch of RED_PARTS_MAX * HD floats. dinp's positions are
// ld elements apart (ld >= nh HD: it may be a column block of a wider row, as the
// trainer's dqkv is).
void qknorm_rope_backward(floatX *dinp, float *dw, const float *dout, const floatX *inp, const float *rstd,
                          const floatX *w, const float *cosv, const float *sinv, int B, int T, int nh, int HD,
                          size_t ld, float *partial) {
    // out = rope(y), y = rmsnorm(inp; w) (qknorm_rope_forward)
    size_t rows = (size_t)B * T * nh;
    int R = red_rows_per_part(rows), P = (int)ceil_div(rows, R);
    uintptr_t bits = (uintptr_t)dinp | (uintptr_t)dout | (uintptr_t)inp | (uintptr_t)w | (uintptr_t)cosv |
                     (uintptr_t)sinv | (uintptr_t)(ld * sizeof(floatX));
    bool packed = qk_packed_dispatch(HD, bits, [&](auto dim) {
        constexpr int D = decltype(dim)::hd;
        qknorm_rope_backward_packed_kernel<D><<<P, 256>>>(dinp, partial, dout, inp, rstd, w, cosv, sinv, rows, T, nh,
                                                          R, ld);
    });
    if (!packed) {
        qknorm_rope_backward_kernel<<<P, 256>>>(dinp, partial, dout, inp, rstd, w, cosv, sinv, rows, T, nh, HD, R, ld);
    }
    launchCheck();
    // dw[i] = sum over the rows of dy[i] x[i] s: the partials, summed in order
    reduce_partials_warp_kernel<<<ceil_div(HD, 8), 256>>>(dw, partial, P, HD);
    launchCheck();
}
