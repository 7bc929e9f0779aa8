// kernels/rmsnorm.cuh: RMSNorm over rows of C, u = x / sqrt(mean(x^2) + 1e-6) * w,
// outside the routing kernels (std mode and the final norm; routing sites fuse theirs).
//  - rmsnorm_forward (N, C): one warp per row; the std embedding's norm (site 0).
//  - residual_norm_forward: the residual add y = x + out (the slot), fused with the
//    next norm (std) or the new slot's routing statistic r (block mode), one warp
//    per row with the row in registers. Lab dev/cuda/residual.cu fwd v2.
//  - rmsnorm_backward_residual: the norm's backward added into the running gradient
//    of the residual stream, dw from per-block partials summed in a fixed order.
//    Lab dev/cuda/residual.cu bwd v2.
// The row kernels take 16-byte packs where C and the pointers allow, else one value
// a pack (row_dispatch, one predicate): the same kernel template either way.
#pragma once

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
// GATED (delta mode, SPEC section 9): out is the routed mix and y = x + alpha * out,
// *alpha the site's gate (fp32); y is written only when y is not NULL. With
// alpha = 0, y = x + 0 = x, and the rest of the body is the std path's: the same
// u and s bits as std computes for the stream x.
template <int VEC, int NP, bool GATED>
__global__ void residual_norm_forward_kernel(floatX *y, floatX *u, float *stat, const floatX *x, const floatX *out,
                                             const floatX *w, size_t N, int C, const float *alpha) {
    const size_t n = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (n >= N) { return; }
    float v[NP][VEC], ss = 0.0f;
    const float al = GATED ? *alpha : 0.0f;
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int c0 = (lane + 32 * p) * VEC;
        if (c0 >= C) { continue; }
        RowX<VEC> a = *reinterpret_cast<const RowX<VEC> *>(out + n * C + c0);
        if (x != NULL) {
            RowX<VEC> b = *reinterpret_cast<const RowX<VEC> *>(x + n * C + c0);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                a.x[k] = fromF<floatX>(GATED ? toF(b.x[k]) + al * toF(a.x[k]) : toF(a.x[k]) + toF(b.x[k]));
            }
            if (!GATED || y != NULL) { *reinterpret_cast<RowX<VEC> *>(y + n * C + c0) = a; }
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
        residual_norm_forward_kernel<VEC, NP, false><<<ceil_div(N, 8), 256>>>(y, u, stat, x, out, w, N, C, nullptr);
    });
    launchCheck();
}

// delta's gated site input (SPEC section 9): y (N, C) = x + alpha * mix rounded to
// floatX (written unless NULL), stat = its rstd and, with w, u = rmsnorm(y; w): the
// kernel above (GATED), so that alpha = 0 gives std's bits. alpha: one fp32 on the device.
void residual_norm_gated_forward(floatX *y, floatX *u, float *stat, const floatX *x, const floatX *mix,
                                 const floatX *w, const float *alpha, size_t N, int C) {
    row_dispatch(C, aligned16(y) && aligned16(u) && aligned16(x) && aligned16(mix), [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NP = decltype(lanes)::np;
        residual_norm_forward_kernel<VEC, NP, true><<<ceil_div(N, 8), 256>>>(y, u, stat, x, mix, w, N, C, alpha);
    });
    launchCheck();
}
