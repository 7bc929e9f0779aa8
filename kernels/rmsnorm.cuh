// kernels/rmsnorm.cuh: RMSNorm over rows of C, u = x / sqrt(mean(x^2) + 1e-6) * w,
// outside the routing kernels (std mode and the final norm; routing sites fuse theirs).
//  - rmsnorm_forward (N, C): one warp per row; the std embedding's norm (site 0).
//  - residual_norm_forward: the residual add y = x + out (the slot), fused with the
//    next norm (std) or the new slot's routing statistic r (block mode), one warp
//    per row with the row in registers. Lab dev/cuda/residual.cu fwd v2.
//  - rmsnorm_backward_residual: the norm's backward added into the running gradient
//    of the residual stream, dw from per-block partials summed in a fixed order,
//    in std once for all the sites (rmsnorm_dw_reduce_sites). Lab
//    dev/cuda/residual.cu bwd v3.
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
// Lab: dev/cuda/residual.cu (fwd v2, bwd v3).
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

// One row's inputs of the norm backward in registers: x as floatX packs (converted
// where used), du and the running dres as fp32 packs, and its rstd.
template <int VEC, int NP> struct BwdRow {
    RowX<VEC> x[NP];
    RowF<VEC> g[NP], r[NP];
    float s;
};

// Issues row n's loads (x, du, dres when add, rstd); nothing here waits for them.
template <int VEC, int NP>
__device__ __forceinline__ void bwd_row_load(BwdRow<VEC, NP> &row, const floatX *__restrict__ x,
                                             const float *__restrict__ du, const float *dres,
                                             const float *__restrict__ rstd, size_t n, int C, int lane, int add) {
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int c0 = (lane + 32 * p) * VEC;
        if (c0 >= C) { continue; }
        row.x[p] = *reinterpret_cast<const RowX<VEC> *>(x + n * C + c0);
        row.g[p] = *reinterpret_cast<const RowF<VEC> *>(du + n * C + c0);
        if (add) { row.r[p] = *reinterpret_cast<const RowF<VEC> *>(dres + n * C + c0); }
    }
    row.s = rstd[n];
}

// Block b (8 warps) owns the R rows [b R, b R + R); warp w takes rows w, w + 8, ...
// of them, in order. Per row: d = dL/dx of u = rmsnorm(x; w) given du; dres = d
// (+ dres when add), and its floatX copy dcopy (when not NULL). The block's share
// of dw[c] = sum_n du x rstd, summed per lane over its rows in order, then over the
// 8 warps in order through shared memory, goes to partial[b] (C).
// Loads in flight: with NP <= 2 (C <= 512 in bf16) two rows fit in the 128 registers
// of two blocks an SM, and a warp issues its next row's loads before it reduces,
// computes and stores the current one; wider rows issue their three loads together
// at the top of the row. w sits in shared memory (fp32), not in registers.
// Lab: dev/cuda/residual.cu bwd v3.
template <int VEC, int NP>
__global__ void __launch_bounds__(256, NP <= 2 ? 2 : 1)
rmsnorm_backward_residual_kernel(float *dres, floatX *__restrict__ dcopy, float *__restrict__ partial,
                                 const float *__restrict__ du, const floatX *__restrict__ x,
                                 const float *__restrict__ rstd, const floatX *__restrict__ w, size_t N, int C, int R,
                                 int add) {
    __shared__ float red[8][32 * VEC];
    __shared__ RowF<VEC> wsh[NP * 32];   // w in fp32 by pack (0 past C)
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float acc[NP][VEC];
    for (int i = threadIdx.x; i < NP * 32; i += blockDim.x) {
#pragma unroll
        for (int k = 0; k < VEC; k++) { wsh[i].x[k] = i * VEC + k < C ? toF(w[i * VEC + k]) : 0.0f; }
    }
#pragma unroll
    for (int p = 0; p < NP; p++) {
#pragma unroll
        for (int k = 0; k < VEC; k++) { acc[p][k] = 0.0f; }
    }
    __syncthreads();
    constexpr bool ahead = NP <= 2;
    const size_t n0 = (size_t)blockIdx.x * R, n1 = n0 + R < N ? n0 + R : N;
    size_t n = n0 + warp;
    BwdRow<VEC, NP> cur;
    if (ahead && n < n1) { bwd_row_load(cur, x, du, dres, rstd, n, C, lane, add); }
    for (; n < n1; n += 8) {
        BwdRow<VEC, NP> next;
        if (!ahead) { bwd_row_load(cur, x, du, dres, rstd, n, C, lane, add); }
        else if (n + 8 < n1) { bwd_row_load(next, x, du, dres, rstd, n + 8, C, lane, add); }
        float gwx = 0.0f;
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int c0 = (lane + 32 * p) * VEC;
            if (c0 >= C) { continue; }
            const RowF<VEC> wp = wsh[lane + 32 * p];
#pragma unroll
            for (int k = 0; k < VEC; k++) { gwx += cur.g[p].x[k] * wp.x[k] * toF(cur.x[p].x[k]); }
        }
        gwx = warp_sum(gwx);
        const float s = cur.s, k3 = s * s * s / C * gwx;
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int c0 = (lane + 32 * p) * VEC;
            if (c0 >= C) { continue; }
            const RowF<VEC> wp = wsh[lane + 32 * p];
            RowF<VEC> r;
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float g = cur.g[p].x[k], wf = wp.x[k], xf = toF(cur.x[p].x[k]);
                const float d = s * g * wf - k3 * xf;
                r.x[k] = add ? cur.r[p].x[k] + d : d;
                acc[p][k] += g * xf * s;
            }
            *reinterpret_cast<RowF<VEC> *>(dres + n * C + c0) = r;
            if (dcopy) {
                RowX<VEC> o;
#pragma unroll
                for (int k = 0; k < VEC; k++) { o.x[k] = fromF<floatX>(r.x[k]); }
                *reinterpret_cast<RowX<VEC> *>(dcopy + n * C + c0) = o;
            }
        }
        if (ahead) { cur = next; }
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

// The dw pointers of up to DW_SITES_MAX sites, passed by value (2 KB of kernel
// parameters); more sites take more launches.
#define DW_SITES_MAX 256
struct DwSites { float *dw[DW_SITES_MAX]; };

// For site s = blockIdx.y: dw[s] (D) += the sum over the P partials of its partial
// (P, D) at part + s * stride, in a fixed order. Block (32 channels) x (32 partial
// lanes): lane y sums partials y, y + 32, ... in order (independent loads), then
// the 32 lane sums are added in lane order. Grid (ceil(D / 32), sites).
__global__ void __launch_bounds__(1024)
rmsnorm_dw_reduce_sites_kernel(DwSites sites, const float *part, size_t stride, int P, int D) {
    __shared__ float s[32][33];
    const float *partial = part + blockIdx.y * stride;
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
        sites.dw[blockIdx.y][i] += sum;
    }
}

// dw_of(s) (C) += the sum of the partials that rmsnorm_backward_residual wrote for
// site s over N rows, at part + s * stride (stride >= RED_PARTS_MAX * C floats), for
// the S sites s = 0 .. S-1: one launch (per DW_SITES_MAX sites) in place of one per
// site, the same sums in the same order. dw_of: a host function of the site index.
template <typename F> void rmsnorm_dw_reduce_sites(F dw_of, const float *part, size_t stride, int S, size_t N, int C) {
    const int P = (int)ceil_div(N, red_rows_per_part(N));
    for (int s0 = 0; s0 < S; s0 += DW_SITES_MAX) {
        const int n = S - s0 < DW_SITES_MAX ? S - s0 : DW_SITES_MAX;
        DwSites t = {};
        for (int s = 0; s < n; s++) { t.dw[s] = dw_of(s0 + s); }
        rmsnorm_dw_reduce_sites_kernel<<<dim3(ceil_div(C, 32), n), dim3(32, 32)>>>(t, part + s0 * stride, stride, P, C);
        launchCheck();
    }
}

// Backward of u = rmsnorm(x; w) (N, C) on the residual stream (std), given
// du = dL/du (fp32):
//   dres (N, C) fp32 = (add ? dres : 0) + dL/dx   (dres: the running gradient
//                      of the residual stream, one buffer for all the sites)
//   dcopy (N, C)     = floatX copy of the new dres, which the matmul backwards
//                      of the sublayer before read as its dout (NULL: none)
//   partial (P, C)   = per-block sums of dL/dw (P <= RED_PARTS_MAX blocks)
//   dw (C)          += dL/dw, the partials summed in a fixed order, when dw is not
//                      NULL; with dw NULL the partials stay for rmsnorm_dw_reduce_sites
//                      (std: every site's in its own slice, one reduction at the end)
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
    if (dw != NULL) { rmsnorm_dw_reduce_sites([&](int) { return dw; }, partial, 0, 1, N, C); }
}

// ----------------------------------------------------------------------------
// Slots (config.h explains them): slot j+1 = out_j, the output of sublayer j,
// plus slot j when slot_chains(j). A slot that does not chain is written by
// the sublayer's last matmul itself (model_forward). A chained slot is written
// by residual_norm_forward, which computes in the same pass what the next step
// needs: in std mode the next site's pre-norm u_{j+1} and its rstd, in block
// mode the source statistic r of the new slot (the slots that do not chain get
// theirs from the next site's routing forward). The backward of the add is the
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
