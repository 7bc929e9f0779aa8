// kernels/attention.cuh: causal self-attention with grouped-query heads.
// q, out (B, T, NH, HD); k, v (B, T, NKV, HD); query head h reads key/value head
// h / (NH/NKV); scores scaled by 1/sqrt(HD). The forward keeps only lse (B, NH, T),
// each row's log-sum-exp, and the backward recomputes p = exp(score - lse): no
// (T, T) matrix is stored. Any T (sampling runs T = 1, 2, 3, ...).
// One predicate, attention_use_flash(HD), picks the kernels:
//  - fast: FlashAttention-2 on tensor cores (mma.sync m16n8k16, bf16 in, fp32
//    accumulation), the bf16 build at HD = 64 or 128. Lab: dev/cuda/attention.cu
//    v3 forward at HD = 64 (8 warps), v2 forward at HD = 128 (4 warps), v2 backward.
//  - fallback: one warp per row on the CUDA cores in fp32 with an online softmax,
//    every other case (the fp32 build, other head dims). Lab: dev/cuda/attention.cu v1.

// Fallback. A block owns a tile of ATT_TILE = 32 rows (query rows in the
// forward and dq kernels, key rows in the dk/dv kernel) of one head; each of
// its 8 warps owns 4 of those rows. It walks the tiles of the other side one at
// a time through shared memory (float, rows padded to HD+1 against bank
// conflicts): lane j of a warp scores the tile's row j, and the products with
// the tile are summed with lane broadcasts. Shared memory is O(ATT_TILE * HD).
#pragma once

#define ATT_TILE 32
#define ATT_WARPS 8
#define ATT_RPW (ATT_TILE / ATT_WARPS)   // rows per warp
#define HD_MAX 256
#define ATT_DPL (HD_MAX / 32)            // head dims per lane, at most

// sh[r][d] = x[b, t0 + r, hh, d] as float (row stride HD+1), zero past T
template <typename Tin>
__device__ void att_load_tile(float *sh, const Tin *x, int b, int t0, int hh, int nh, int T, int HD) {
    for (int idx = threadIdx.x; idx < ATT_TILE * HD; idx += blockDim.x) {
        int r = idx / HD, d = idx % HD, t = t0 + r;
        sh[r * (HD + 1) + d] = t < T ? toF(x[(((size_t)b * T + t) * nh + hh) * HD + d]) : 0.0f;
    }
}

// grid (T/32, NH, B). out (B, T, NH, HD); lse (B, NH, T)
__global__ void attention_forward_kernel(floatX *out, float *lse, const floatX *q, const floatX *k, const floatX *v,
                                         int T, int NH, int NKV, int HD) {
    extern __shared__ float sh[];
    int ld = HD + 1;
    float *Qs = sh, *Ks = Qs + ATT_TILE * ld, *Vs = Ks + ATT_TILE * ld;
    int q0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float scale = 1.0f / sqrtf((float)HD);
    att_load_tile(Qs, q, b, q0, h, NH, T, HD);
    float o[ATT_RPW][ATT_DPL], mrow[ATT_RPW], lrow[ATT_RPW];
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        mrow[rr] = -INFINITY; lrow[rr] = 0.0f;
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) { o[rr][i] = 0.0f; }
    }
    int qlast = (q0 + ATT_TILE < T ? q0 + ATT_TILE : T) - 1;
    for (int k0 = 0; k0 <= qlast; k0 += ATT_TILE) {
        __syncthreads();   // the previous tile is consumed
        att_load_tile(Ks, k, b, k0, kvh, NKV, T, HD);
        att_load_tile(Vs, v, b, k0, kvh, NKV, T, HD);
        __syncthreads();
        #pragma unroll
        for (int rr = 0; rr < ATT_RPW; rr++) {
            int r = warp * ATT_RPW + rr, t = q0 + r;
            if (t >= T || k0 > t) { continue; }   // warp-uniform
            int t2 = k0 + lane;
            float s = -INFINITY;
            if (t2 <= t) {
                float dot = 0.0f;
                for (int d = 0; d < HD; d++) { dot += Qs[r * ld + d] * Ks[lane * ld + d]; }
                s = dot * scale;
            }
            // online softmax: rescale the running sum and output to the new max
            float mnew = fmaxf(mrow[rr], warp_max(s));
            float corr = expf(mrow[rr] - mnew);
            float p = t2 <= t ? expf(s - mnew) : 0.0f;
            lrow[rr] = lrow[rr] * corr + warp_sum(p);
            mrow[rr] = mnew;
            #pragma unroll
            for (int i = 0; i < ATT_DPL; i++) { o[rr][i] *= corr; }
            for (int j = 0; j < ATT_TILE; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
                #pragma unroll
                for (int i = 0; i < ATT_DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < HD) { o[rr][i] += pj * Vs[j * ld + d]; }
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        int t = q0 + warp * ATT_RPW + rr;
        if (t >= T) { continue; }
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < HD) { out[(((size_t)b * T + t) * NH + h) * HD + d] = fromF<floatX>(o[rr][i] / lrow[rr]); }
        }
        if (lane == 0) { lse[((size_t)b * NH + h) * T + t] = mrow[rr] + logf(lrow[rr]); }
    }
}

// Dt (B, NH, T) = dout . out per query row (= sum_t2 p dp); one warp per row
__global__ void attention_backward_prep_kernel(float *Dt, const floatX *dout, const floatX *out, int B, int T, int NH, int HD) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // (b, t, h)
    int lane = threadIdx.x % 32;
    if (row >= (size_t)B * T * NH) { return; }
    float s = 0.0f;
    for (int d = lane; d < HD; d += 32) { s += toF(dout[row * HD + d]) * toF(out[row * HD + d]); }
    s = warp_sum(s);
    int h = (int)(row % NH), t = (int)((row / NH) % T), b = (int)(row / NH / T);
    if (lane == 0) { Dt[((size_t)b * NH + h) * T + t] = s; }
}

// grid (T/32, NH, B): dq of a tile of query rows, walking the key tiles
__global__ void attention_backward_dq_kernel(float *dq, const floatX *dout, const float *lse, const float *Dt,
                                             const floatX *q, const floatX *k, const floatX *v, int T, int NH, int NKV, int HD) {
    extern __shared__ float sh[];
    int ld = HD + 1;
    float *Qs = sh, *dOs = Qs + ATT_TILE * ld, *Ks = dOs + ATT_TILE * ld, *Vs = Ks + ATT_TILE * ld;
    int q0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float scale = 1.0f / sqrtf((float)HD);
    att_load_tile(Qs, q, b, q0, h, NH, T, HD);
    att_load_tile(dOs, dout, b, q0, h, NH, T, HD);
    float acc[ATT_RPW][ATT_DPL];
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) { acc[rr][i] = 0.0f; }
    }
    int qlast = (q0 + ATT_TILE < T ? q0 + ATT_TILE : T) - 1;
    for (int k0 = 0; k0 <= qlast; k0 += ATT_TILE) {
        __syncthreads();
        att_load_tile(Ks, k, b, k0, kvh, NKV, T, HD);
        att_load_tile(Vs, v, b, k0, kvh, NKV, T, HD);
        __syncthreads();
        #pragma unroll
        for (int rr = 0; rr < ATT_RPW; rr++) {
            int r = warp * ATT_RPW + rr, t = q0 + r;
            if (t >= T || k0 > t) { continue; }
            int t2 = k0 + lane;
            float dsc = 0.0f;
            if (t2 <= t) {
                float dot = 0.0f, dp = 0.0f;
                for (int d = 0; d < HD; d++) {
                    dot += Qs[r * ld + d] * Ks[lane * ld + d];
                    dp += dOs[r * ld + d] * Vs[lane * ld + d];
                }
                // o = sum p v: dp = g . v;  p = softmax(score): dscore = p (dp - sum p dp); score = scale q . k
                float p = expf(dot * scale - lse[((size_t)b * NH + h) * T + t]);
                dsc = p * (dp - Dt[((size_t)b * NH + h) * T + t]) * scale;
            }
            for (int j = 0; j < ATT_TILE; j++) {
                float dj = __shfl_sync(0xffffffffu, dsc, j);
                #pragma unroll
                for (int i = 0; i < ATT_DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < HD) { acc[rr][i] += dj * Ks[j * ld + d]; }
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        int t = q0 + warp * ATT_RPW + rr;
        if (t >= T) { continue; }
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < HD) { dq[(((size_t)b * T + t) * NH + h) * HD + d] = acc[rr][i]; }
        }
    }
}

// grid (T/32, NKV, B): dk and dv of a tile of key rows of one kv head, walking
// every query head of its group and every query tile at or after the key tile.
// The block is the only writer of these rows: no atomics.
__global__ void attention_backward_dkdv_kernel(float *dk, floatX *dv, const floatX *dout, const float *lse, const float *Dt,
                                               const floatX *q, const floatX *k, const floatX *v, int T, int NH, int NKV, int HD) {
    extern __shared__ float sh[];
    int ld = HD + 1;
    float *Ks = sh, *Vs = Ks + ATT_TILE * ld, *Qs = Vs + ATT_TILE * ld, *dOs = Qs + ATT_TILE * ld;
    float *lse_s = dOs + ATT_TILE * ld, *D_s = lse_s + ATT_TILE;
    int k0 = blockIdx.x * ATT_TILE, kvh = blockIdx.y, b = blockIdx.z, group = NH / NKV;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float scale = 1.0f / sqrtf((float)HD);
    att_load_tile(Ks, k, b, k0, kvh, NKV, T, HD);
    att_load_tile(Vs, v, b, k0, kvh, NKV, T, HD);
    float dka[ATT_RPW][ATT_DPL], dva[ATT_RPW][ATT_DPL];
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) { dka[rr][i] = 0.0f; dva[rr][i] = 0.0f; }
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int q0 = k0; q0 < T; q0 += ATT_TILE) {
            __syncthreads();
            att_load_tile(Qs, q, b, q0, h, NH, T, HD);
            att_load_tile(dOs, dout, b, q0, h, NH, T, HD);
            if (threadIdx.x < ATT_TILE) {
                int t = q0 + threadIdx.x;
                lse_s[threadIdx.x] = t < T ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
                D_s[threadIdx.x] = t < T ? Dt[((size_t)b * NH + h) * T + t] : 0.0f;
            }
            __syncthreads();
            #pragma unroll
            for (int rr = 0; rr < ATT_RPW; rr++) {
                int r = warp * ATT_RPW + rr, t2 = k0 + r;
                if (t2 >= T) { continue; }
                int t = q0 + lane;   // this lane's query row
                float p = 0.0f, dsc = 0.0f;
                if (t < T && t >= t2) {
                    float dot = 0.0f, dp = 0.0f;
                    for (int d = 0; d < HD; d++) {
                        dot += Qs[lane * ld + d] * Ks[r * ld + d];
                        dp += dOs[lane * ld + d] * Vs[r * ld + d];
                    }
                    p = expf(dot * scale - lse_s[lane]);
                    dsc = p * (dp - D_s[lane]) * scale;
                }
                // dv[t2] += p[t, t2] g[t];  dk[t2] += dscore[t, t2] q[t]
                for (int j = 0; j < ATT_TILE; j++) {
                    float pj = __shfl_sync(0xffffffffu, p, j), dj = __shfl_sync(0xffffffffu, dsc, j);
                    #pragma unroll
                    for (int i = 0; i < ATT_DPL; i++) {
                        int d = lane + 32 * i;
                        if (d < HD) {
                            dva[rr][i] += pj * dOs[j * ld + d];
                            dka[rr][i] += dj * Qs[j * ld + d];
                        }
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
        int t2 = k0 + warp * ATT_RPW + rr;
        if (t2 >= T) { continue; }
        #pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < HD) {
                size_t off = (((size_t)b * T + t2) * NKV + kvh) * HD + d;
                dk[off] = dka[rr][i];
                dv[off] = fromF<floatX>(dva[rr][i]);
            }
        }
    }
}

#ifndef PRECISION_FP32
// ----------------------------------------------------------------------------
// Flash kernels (bf16 build): the FlashAttention-2 scheme, ldmatrix(.trans) from
// padded smem rows, cp.async double buffering, the online softmax in base 2. No
// atomics: each output element is written by one thread. Unlike the lab they take
// any T: rows past T are zero-filled on load and never stored, the backward gives
// them lse = +inf (p = 0), tiles wholly past T are not visited, and lse and D move
// by 4-byte cp.async (a row of (B, NH, T) is 16-byte aligned only when T % 4 == 0);
// dq and dk are written in fp32 from the accumulators.
// A lane's accumulator s[n][e] is row g + 8 (e >> 1), column 8 n + 2 t + (e & 1)
// (common.cuh's fragment layouts); two adjacent C tiles of a 16x16 block, rounded
// to bf16 pairwise, are its A fragment: P goes from one matmul to the next in
// registers. Smem rows are padded by FA_PAD bf16 (16 bytes) so the 8 row addresses
// of each ldmatrix 8x8 matrix hit 8 different bank groups (load_tile, store_rows).
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Forward. grid (ceil(T/BR), NH, B), BR = 16 NWARPS query rows per block, the
// heavy (late) q tiles first; warp w owns rows q0+16w..+15, its Q tile in
// registers (A fragments). Loop over kv tiles of BC keys up to the block's last
// row, double-buffered: S = Q K^T (16 x BC per warp, fp32), causal mask on the
// tiles that cross the warp's diagonal, online softmax in base 2 (m = running
// max of s*scale*log2e, l = per-thread partial sums, reduced over a row's 4
// lanes at the end), P -> bf16 A fragments, O += P V (V via ldmatrix.trans).
// out (B, T, NH, HD) = O / l; lse (B, NH, T) = (m + log2 l) ln 2.
// sl2 = log2(e) / sqrt(HD). smem: (BR + 4 BC) (HD+8) bf16.
template <int HD, int NWARPS, int BC>
__global__ void __launch_bounds__(NWARPS * 32)
attention_forward_flash_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                               int T, int NH, int NKV, float sl2) {
    constexpr int BR = NWARPS * 16, LD = HD + FA_PAD, NT = NWARPS * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sQ = (bf16 *)smem_raw, *sK = sQ + BR * LD, *sV = sK + 2 * BC * LD;
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (NH / NKV), warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int q0 = qb * BR, r0 = q0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const bf16 *qg = q + ((size_t)b * T + q0) * qs + (size_t)h * HD;
    const bf16 *kg = k + (size_t)b * T * ks + (size_t)kvh * HD, *vg = v + (size_t)b * T * ks + (size_t)kvh * HD;
    const int nkv = (min(q0 + BR, T) - 1) / BC + 1;   // kv tiles up to the block's last row

    load_tile<BR, HD, NT>(sQ, qg, qs, T - q0);
    load_tile<BC, HD, NT>(sK, kg, ks, T);
    load_tile<BC, HD, NT>(sV, vg, ks, T);
    cp_async_commit();

    uint32_t qf[HD / 16][4];
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) { o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f; }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    for (int j = 0; j < nkv; j++) {
        if (j + 1 < nkv) {
            const int nb = (j + 1) & 1, kn = (j + 1) * BC;
            load_tile<BC, HD, NT>(sK + nb * BC * LD, kg + (size_t)kn * ks, ks, T - kn);
            load_tile<BC, HD, NT>(sV + nb * BC * LD, vg + (size_t)kn * ks, ks, T - kn);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) { ldsm_x4(qf[kk], a_addr(sQ, LD, warp * 16, kk * 16, lane)); }
        }
        const int k0 = j * BC;
        if (r0 < T && k0 <= r0 + 15) {   // warp-uniform: the warp has rows, and some see some key of the tile
            const bf16 *cK = sK + (j & 1) * BC * LD, *cV = sV + (j & 1) * BC * LD;
            float s[BC / 8][4];
#pragma unroll
            for (int n = 0; n < BC / 8; n++) { s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f; }
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int nn = 0; nn < BC / 16; nn++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bn_addr(cK, LD, nn * 16, kk * 16, lane));
                    mma16816(s[2 * nn], qf[kk], bb[0], bb[1]);
                    mma16816(s[2 * nn + 1], qf[kk], bb[2], bb[3]);
                }
            }
            if (k0 + BC - 1 > r0) {   // the tile crosses the diagonal of this warp's rows (keys past T included)
#pragma unroll
                for (int n = 0; n < BC / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (k0 + n * 8 + 2 * t4 + (e & 1) > r0 + g + (e >> 1) * 8) { s[n][e] = -INFINITY; }
                    }
            }
            // Online softmax. Tile 0 holds key 0, visible to every row, so m is
            // finite from the first tile on and exp2(m_old - m_new) never sees -inf - -inf.
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < BC / 8; n++) { mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1])); }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[r], mx * sl2), alpha = exp2f(m[r] - mnew);
                m[r] = mnew;
                l[r] *= alpha;
#pragma unroll
                for (int n = 0; n < HD / 8; n++) { o[n][2 * r] *= alpha; o[n][2 * r + 1] *= alpha; }
#pragma unroll
                for (int n = 0; n < BC / 8; n++) {
                    s[n][2 * r] = exp2f(fmaf(s[n][2 * r], sl2, -mnew));
                    s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], sl2, -mnew));
                    l[r] += s[n][2 * r] + s[n][2 * r + 1];
                }
            }
#pragma unroll
            for (int kc = 0; kc < BC / 16; kc++) {
                uint32_t a[4];
                c_to_a(a, s + 2 * kc);
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bt_addr(cV, LD, kc * 16, dn * 16, lane));
                    mma16816(o[2 * dn], a, bb[0], bb[1]);
                    mma16816(o[2 * dn + 1], a, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();   // this buffer is refilled by the next iteration's prefetch
    }
    if (r0 >= T) { return; }   // warp-uniform; no barrier follows
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    if (t4 == 0) {
        float *lrow = lse + ((size_t)b * NH + h) * T + r0 + g;
        if (r0 + g < T) { lrow[0] = (m[0] + log2f(l[0])) * LN2; }
        if (r0 + g + 8 < T) { lrow[8] = (m[1] + log2f(l[1])) * LN2; }
    }
    // the warp's own rows of sQ are free (its Q fragments are in registers)
    store_rows<HD>(out + ((size_t)b * T + r0) * qs + (size_t)h * HD, qs, sQ + warp * 16 * LD, o, 1.f / l[0],
                   1.f / l[1], T - r0, lane);
}

// Dt (B, NH, T) = dout . out per query row, for the flash backward: HD/8
// consecutive lanes own one row (16-byte loads), rows in memory order (b, t, h).
template <int HD>
__global__ void attention_backward_prep_flash_kernel(float *Dt, const bf16 *dout, const bf16 *out, int B, int T, int NH) {
    constexpr int L = HD / 8;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t row = idx / L, nrows = (size_t)B * T * NH;
    const int c = (int)(idx % L);
    float sum = 0.f;
    if (row < nrows) {
        uint4 a = *(const uint4 *)(dout + row * HD + c * 8), o = *(const uint4 *)(out + row * HD + c * 8);
        const bf16 *pa = (const bf16 *)&a, *po = (const bf16 *)&o;
#pragma unroll
        for (int i = 0; i < 8; i++) { sum += __bfloat162float(pa[i]) * __bfloat162float(po[i]); }
    }
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) { sum += __shfl_xor_sync(0xffffffffu, sum, off); }
    if (row < nrows && c == 0) {
        const int h = (int)(row % NH), t = (int)((row / NH) % T), b = (int)(row / ((size_t)NH * T));
        Dt[((size_t)b * NH + h) * T + t] = sum;
    }
}

// Backward, pass 1: dk (fp32), dv (bf16), each (B, T, NKV, HD).
// grid (ceil(T/BK), NKV, B), BK = 16 NWARPS keys per block, launched in
// reverse key order as in the lab (the light late tiles first: flipping it is
// an untried tail-balance idea); warp w owns keys k0+16w..+15 of kv head kvh
// and accumulates their dK, dV (16 x HD each, fp32 registers) over every query
// head of the group and every q tile of BQ rows at or after the block's first
// key, double-buffered (Q, dO, lse, D). Per tile, in the transposed
// orientation (keys are the M dimension):
//   S^T = K Q^T, P^T = exp2(S^T scale log2e - lse log2e) (0 where q < key),
//   dP^T = V dO^T, dS^T = P^T (dP^T - D),
//   dV += P^T dO, dK += dS^T Q     (P^T, dS^T -> bf16 A fragments from registers).
// dK is scaled once at the end. KV_REGS keeps K, V A fragments in registers
// (HD=64); otherwise they are re-read from smem per tile (HD=128, register budget).
// smem: 2 BK + 4 BQ rows of (HD+8) bf16 + 4 BQ floats.
template <int HD, int NWARPS, int BQ, bool KV_REGS>
__global__ void __launch_bounds__(NWARPS * 32)
attention_backward_dkdv_flash_kernel(float *dk, bf16 *dv, const bf16 *q, const bf16 *k, const bf16 *v,
                                     const bf16 *dout, const float *lse, const float *Dt,
                                     int T, int NH, int NKV, float scale, float sl2) {
    constexpr int BK = NWARPS * 16, LD = HD + FA_PAD, NT = NWARPS * 32;
    static_assert(2 * BQ <= NT, "one thread per lse and per D entry of a q tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sK = (bf16 *)smem_raw, *sV = sK + BK * LD, *sQ = sV + BK * LD, *sdO = sQ + 2 * BQ * LD;
    float *sL = (float *)(sdO + 2 * BQ * LD), *sD = sL + 2 * BQ;
    const int kb = gridDim.x - 1 - blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int G = NH / NKV, k0 = kb * BK, kw0 = k0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const int i0 = k0 / BQ, nq = (T + BQ - 1) / BQ - i0, nit = G * nq;

    // issue the loads of iteration it (head kvh*G + it/nq, q tile i0 + it%nq) into buffer buf
    auto issue = [&](int it, int buf) {
        const int h = kvh * G + it / nq, qt0 = (i0 + it % nq) * BQ;
        const size_t go = ((size_t)b * T + qt0) * qs + (size_t)h * HD;
        load_tile<BQ, HD, NT>(sQ + buf * BQ * LD, q + go, qs, T - qt0);
        load_tile<BQ, HD, NT>(sdO + buf * BQ * LD, dout + go, qs, T - qt0);
        if (threadIdx.x < 2 * BQ) {   // threads [0, BQ) lse, [BQ, 2 BQ) D; past T: lse = +inf (p = 0), D = 0
            const int i = threadIdx.x % BQ, isL = threadIdx.x < BQ;
            float *dst = (isL ? sL : sD) + buf * BQ + i;
            if (qt0 + i < T) { cp_async4(dst, (isL ? lse : Dt) + ((size_t)b * NH + h) * T + qt0 + i); }
            else { *dst = isL ? INFINITY : 0.f; }
        }
    };
    const size_t kgo = ((size_t)b * T + k0) * ks + (size_t)kvh * HD;
    load_tile<BK, HD, NT>(sK, k + kgo, ks, T - k0);
    load_tile<BK, HD, NT>(sV, v + kgo, ks, T - k0);
    issue(0, 0);
    cp_async_commit();

    uint32_t kf[KV_REGS ? HD / 16 : 1][4], vf[KV_REGS ? HD / 16 : 1][4];
    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) { dka[n][e] = 0.f; dva[n][e] = 0.f; }

    for (int it = 0; it < nit; it++) {
        if (it + 1 < nit) {
            issue(it + 1, (it + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (KV_REGS && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (KV_REGS ? HD / 16 : 0); kk++) {
                ldsm_x4(kf[kk], a_addr(sK, LD, warp * 16, kk * 16, lane));
                ldsm_x4(vf[kk], a_addr(sV, LD, warp * 16, kk * 16, lane));
            }
        }
        const int buf = it & 1, qt0 = (i0 + it % nq) * BQ;
        if (kw0 < T && qt0 + BQ - 1 >= kw0) {   // warp-uniform: the warp has keys, some seen by some query of the tile
            const bf16 *cQ = sQ + buf * BQ * LD, *cdO = sdO + buf * BQ * LD;
            const float *cL = sL + buf * BQ, *cD = sD + buf * BQ;
            float s[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
            for (int n = 0; n < BQ / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) { s[n][e] = 0.f; dp[n][e] = 0.f; }
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t ka[4], va[4];
                if (KV_REGS) {
#pragma unroll
                    for (int e = 0; e < 4; e++) { ka[e] = kf[KV_REGS ? kk : 0][e]; va[e] = vf[KV_REGS ? kk : 0][e]; }
                } else {
                    ldsm_x4(ka, a_addr(sK, LD, warp * 16, kk * 16, lane));
                    ldsm_x4(va, a_addr(sV, LD, warp * 16, kk * 16, lane));
                }
#pragma unroll
                for (int nn = 0; nn < BQ / 16; nn++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bn_addr(cQ, LD, nn * 16, kk * 16, lane));
                    mma16816(s[2 * nn], ka, bb[0], bb[1]);
                    mma16816(s[2 * nn + 1], ka, bb[2], bb[3]);
                    ldsm_x4(bb, bn_addr(cdO, LD, nn * 16, kk * 16, lane));
                    mma16816(dp[2 * nn], va, bb[0], bb[1]);
                    mma16816(dp[2 * nn + 1], va, bb[2], bb[3]);
                }
            }
            const bool mask = qt0 < kw0 + 15;   // some query of the tile precedes some key of the warp
#pragma unroll
            for (int n = 0; n < BQ / 8; n++) {
                const float2 L = *(const float2 *)(cL + n * 8 + 2 * t4), D = *(const float2 *)(cD + n * 8 + 2 * t4);
                const float L2[2] = {L.x * LOG2E, L.y * LOG2E}, Dv[2] = {D.x, D.y};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(fmaf(s[n][e], sl2, -L2[e & 1]));
                    if (mask && qt0 + n * 8 + 2 * t4 + (e & 1) < kw0 + g + (e >> 1) * 8) { p = 0.f; }
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - Dv[e & 1]);
                }
            }
#pragma unroll
            for (int kc = 0; kc < BQ / 16; kc++) {
                uint32_t ap[4], ad[4];
                c_to_a(ap, s + 2 * kc);
                c_to_a(ad, dp + 2 * kc);
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bt_addr(cdO, LD, kc * 16, dn * 16, lane));
                    mma16816(dva[2 * dn], ap, bb[0], bb[1]);
                    mma16816(dva[2 * dn + 1], ap, bb[2], bb[3]);
                    ldsm_x4_t(bb, bt_addr(cQ, LD, kc * 16, dn * 16, lane));
                    mma16816(dka[2 * dn], ad, bb[0], bb[1]);
                    mma16816(dka[2 * dn + 1], ad, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();
    }
    if (kw0 >= T) { return; }   // warp-uniform; no barrier follows
    store_rows_f32<HD>(dk + kgo + (size_t)warp * 16 * ks, ks, dka, scale, T - kw0, lane);
    // each warp only ever read its own 16 rows of sV: stage dV there
    store_rows<HD>(dv + kgo + (size_t)warp * 16 * ks, ks, sV + warp * 16 * LD, dva, 1.f, 1.f, T - kw0, lane);
}

// Backward, pass 2: dq (B, T, NH, HD) fp32.
// grid (ceil(T/BR), NH, B), BR = 16 NWARPS query rows per block, warp w owns
// rows q0+16w..+15; its Q and dO tiles in registers (A fragments). Loop over kv
// tiles of BC keys up to the block's last row, double-buffered:
//   S = Q K^T, P = exp2(S scale log2e - lse log2e) (0 above the diagonal),
//   dP = dO V^T (V as B via plain ldmatrix), dS = P (dP - D), dQ += dS K (K via .trans).
// dQ scaled once at the end. smem: (2 BR + 4 BC) (HD+8) bf16.
template <int HD, int NWARPS, int BC>
__global__ void __launch_bounds__(NWARPS * 32)
attention_backward_dq_flash_kernel(float *dq, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                                   const float *lse, const float *Dt, int T, int NH, int NKV, float scale,
                                   float sl2) {
    constexpr int BR = NWARPS * 16, LD = HD + FA_PAD, NT = NWARPS * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sQ = (bf16 *)smem_raw, *sdO = sQ + BR * LD, *sK = sdO + BR * LD, *sV = sK + 2 * BC * LD;
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (NH / NKV), warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int q0 = qb * BR, r0 = q0 + warp * 16;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const size_t qgo = ((size_t)b * T + q0) * qs + (size_t)h * HD;
    const bf16 *kg = k + (size_t)b * T * ks + (size_t)kvh * HD, *vg = v + (size_t)b * T * ks + (size_t)kvh * HD;
    const int nkv = (min(q0 + BR, T) - 1) / BC + 1;   // kv tiles up to the block's last row

    load_tile<BR, HD, NT>(sQ, q + qgo, qs, T - q0);
    load_tile<BR, HD, NT>(sdO, dout + qgo, qs, T - q0);
    load_tile<BC, HD, NT>(sK, kg, ks, T);
    load_tile<BC, HD, NT>(sV, vg, ks, T);
    cp_async_commit();

    // this lane's two rows r0+g, r0+g+8; past T: lse = +inf (p = 0), D = 0
    const size_t lo = ((size_t)b * NH + h) * T;
    const int ra = r0 + g, rb = ra + 8;
    const float L2[2] = {ra < T ? lse[lo + ra] * LOG2E : INFINITY, rb < T ? lse[lo + rb] * LOG2E : INFINITY};
    const float Dv[2] = {ra < T ? Dt[lo + ra] : 0.f, rb < T ? Dt[lo + rb] : 0.f};

    uint32_t qf[HD / 16][4], df[HD / 16][4];
    float dqa[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) { dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.f; }

    for (int j = 0; j < nkv; j++) {
        if (j + 1 < nkv) {
            const int nb = (j + 1) & 1, kn = (j + 1) * BC;
            load_tile<BC, HD, NT>(sK + nb * BC * LD, kg + (size_t)kn * ks, ks, T - kn);
            load_tile<BC, HD, NT>(sV + nb * BC * LD, vg + (size_t)kn * ks, ks, T - kn);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                ldsm_x4(qf[kk], a_addr(sQ, LD, warp * 16, kk * 16, lane));
                ldsm_x4(df[kk], a_addr(sdO, LD, warp * 16, kk * 16, lane));
            }
        }
        const int k0 = j * BC;
        if (r0 < T && k0 <= r0 + 15) {   // warp-uniform
            const bf16 *cK = sK + (j & 1) * BC * LD, *cV = sV + (j & 1) * BC * LD;
            float s[BC / 8][4], dp[BC / 8][4];
#pragma unroll
            for (int n = 0; n < BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) { s[n][e] = 0.f; dp[n][e] = 0.f; }
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int nn = 0; nn < BC / 16; nn++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bn_addr(cK, LD, nn * 16, kk * 16, lane));
                    mma16816(s[2 * nn], qf[kk], bb[0], bb[1]);
                    mma16816(s[2 * nn + 1], qf[kk], bb[2], bb[3]);
                    ldsm_x4(bb, bn_addr(cV, LD, nn * 16, kk * 16, lane));
                    mma16816(dp[2 * nn], df[kk], bb[0], bb[1]);
                    mma16816(dp[2 * nn + 1], df[kk], bb[2], bb[3]);
                }
            }
            const bool mask = k0 + BC - 1 > r0;
#pragma unroll
            for (int n = 0; n < BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(fmaf(s[n][e], sl2, -L2[e >> 1]));
                    if (mask && k0 + n * 8 + 2 * t4 + (e & 1) > r0 + g + (e >> 1) * 8) { p = 0.f; }
                    s[n][e] = p * (dp[n][e] - Dv[e >> 1]);   // dS
                }
#pragma unroll
            for (int kc = 0; kc < BC / 16; kc++) {
                uint32_t a[4];
                c_to_a(a, s + 2 * kc);
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bt_addr(cK, LD, kc * 16, dn * 16, lane));
                    mma16816(dqa[2 * dn], a, bb[0], bb[1]);
                    mma16816(dqa[2 * dn + 1], a, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();
    }
    if (r0 < T) { store_rows_f32<HD>(dq + qgo + (size_t)warp * 16 * qs, qs, dqa, scale, T - r0, lane); }
}

// Launchers of the flash kernels at head dim HD, in the lab's fastest
// configuration at each (NOTES_attention.md): forward blocks of FWD_WARPS warps
// (v3's 8 at HD=64, v2's 4 at HD=128), backward blocks of 4 warps (v2); kv tiles
// of BC keys (forward, dq); q tiles of BQ rows in the dk/dv pass, which keeps
// its K/V fragments in registers at HD=64 only (register budget).
template <int HD> struct Flash {
    static constexpr int FWD_WARPS = HD == 64 ? 8 : 4, BWD_WARPS = 4, BC = 64, BQ = HD == 64 ? 64 : 32;
    static constexpr bool KV_REGS = HD == 64;
    static constexpr size_t ROW = (HD + FA_PAD) * sizeof(bf16);   // bytes of a padded smem row
    static constexpr size_t fwd_smem = (FWD_WARPS * 16 + 4 * BC) * ROW;
    static constexpr size_t dq_smem = (2 * BWD_WARPS * 16 + 4 * BC) * ROW;
    static constexpr size_t dkdv_smem = (2 * BWD_WARPS * 16 + 4 * BQ) * ROW + 4 * BQ * sizeof(float);
    static constexpr size_t max_smem = fwd_smem > dq_smem ? (fwd_smem > dkdv_smem ? fwd_smem : dkdv_smem)
                                                          : (dq_smem > dkdv_smem ? dq_smem : dkdv_smem);

    // allow each kernel its dynamic shared memory (over the default 48 KB)
    static void setup() {
        cudaCheck(cudaFuncSetAttribute(attention_forward_flash_kernel<HD, FWD_WARPS, BC>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem));
        cudaCheck(cudaFuncSetAttribute(attention_backward_dkdv_flash_kernel<HD, BWD_WARPS, BQ, KV_REGS>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkdv_smem));
        cudaCheck(cudaFuncSetAttribute(attention_backward_dq_flash_kernel<HD, BWD_WARPS, BC>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem));
    }
    // attention_forward's contract: out (B, T, NH, HD), lse (B, NH, T)
    static void forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV) {
        dim3 grid(ceil_div(T, FWD_WARPS * 16), NH, B);
        attention_forward_flash_kernel<HD, FWD_WARPS, BC><<<grid, FWD_WARPS * 32, fwd_smem>>>(
            out, lse, q, k, v, T, NH, NKV, LOG2E / sqrtf((float)HD));
        launchCheck();
    }
    // attention_backward's contract: prep (Dt), then the dk/dv pass and the dq pass
    static void backward(float *dq, float *dk, bf16 *dv, float *Dt, const bf16 *dout, const bf16 *out, const float *lse,
                         const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV) {
        const float scale = 1.0f / sqrtf((float)HD), sl2 = scale * LOG2E;
        attention_backward_prep_flash_kernel<HD><<<ceil_div((size_t)B * T * NH * (HD / 8), 256), 256>>>(Dt, dout, out, B, T, NH);
        launchCheck();
        attention_backward_dkdv_flash_kernel<HD, BWD_WARPS, BQ, KV_REGS><<<dim3(ceil_div(T, BWD_WARPS * 16), NKV, B),
                                                                           BWD_WARPS * 32, dkdv_smem>>>(
            dk, dv, q, k, v, dout, lse, Dt, T, NH, NKV, scale, sl2);
        launchCheck();
        attention_backward_dq_flash_kernel<HD, BWD_WARPS, BC><<<dim3(ceil_div(T, BWD_WARPS * 16), NH, B),
                                                                BWD_WARPS * 32, dq_smem>>>(
            dq, q, k, v, dout, lse, Dt, T, NH, NKV, scale, sl2);
        launchCheck();
    }
};

int att_smem_optin = 0;   // the device's opt-in shared memory per block (bytes), read by attention_setup
#endif  // !PRECISION_FP32

// The dispatch rule: the flash kernels in the bf16 build at HD = 64 or 128 when
// the device gives a block their shared memory (at most 104 KB, HD = 128: any
// sm_80 or sm_90 part); the simple kernels otherwise.
bool attention_use_flash(int HD) {
#ifdef PRECISION_FP32
    (void)HD;
    return false;
#else
    if (HD == 64) { return att_smem_optin >= (int)Flash<64>::max_smem; }
    if (HD == 128) { return att_smem_optin >= (int)Flash<128>::max_smem; }
    return false;
#endif
}

// out (B, T, NH, HD); lse (B, NH, T) keeps each row's log-sum-exp of the scaled
// scores; q (B, T, NH, HD); k, v (B, T, NKV, HD)
void attention_forward(floatX *out, float *lse, const floatX *q, const floatX *k, const floatX *v,
                       int B, int T, int NH, int NKV, int HD) {
#ifndef PRECISION_FP32
    if (attention_use_flash(HD)) {
        if (HD == 64) { Flash<64>::forward(out, lse, q, k, v, B, T, NH, NKV); }
        else { Flash<128>::forward(out, lse, q, k, v, B, T, NH, NKV); }
        return;
    }
#endif
    size_t shmem = 3 * ATT_TILE * (HD + 1) * sizeof(float);
    attention_forward_kernel<<<dim3(ceil_div(T, ATT_TILE), NH, B), ATT_WARPS * 32, shmem>>>(out, lse, q, k, v, T, NH, NKV, HD);
    launchCheck();
}

// Writes (does not add) dq (B, T, NH, HD), dk (B, T, NKV, HD) in fp32 and dv in
// floatX (the input of a matmul backward), given dout (B, T, NH, HD) in floatX,
// the forward output out and its lse. Dt (B, NH, T) is scratch.
void attention_backward(float *dq, float *dk, floatX *dv, float *Dt, const floatX *dout, const floatX *out, const float *lse,
                        const floatX *q, const floatX *k, const floatX *v, int B, int T, int NH, int NKV, int HD) {
#ifndef PRECISION_FP32
    if (attention_use_flash(HD)) {
        if (HD == 64) { Flash<64>::backward(dq, dk, dv, Dt, dout, out, lse, q, k, v, B, T, NH, NKV); }
        else { Flash<128>::backward(dq, dk, dv, Dt, dout, out, lse, q, k, v, B, T, NH, NKV); }
        return;
    }
#endif
    attention_backward_prep_kernel<<<ceil_div((size_t)B * T * NH, 8), 256>>>(Dt, dout, out, B, T, NH, HD);
    launchCheck();
    size_t shmem = 4 * ATT_TILE * (HD + 1) * sizeof(float);
    attention_backward_dq_kernel<<<dim3(ceil_div(T, ATT_TILE), NH, B), ATT_WARPS * 32, shmem>>>(
        dq, dout, lse, Dt, q, k, v, T, NH, NKV, HD);
    launchCheck();
    attention_backward_dkdv_kernel<<<dim3(ceil_div(T, ATT_TILE), NKV, B), ATT_WARPS * 32, shmem + 2 * ATT_TILE * sizeof(float)>>>(
        dk, dv, dout, lse, Dt, q, k, v, T, NH, NKV, HD);
    launchCheck();
}

// Once per model: the simple kernels take up to (4 * 32 * 257 + 64) * 4 bytes
// = 132 KB of shared memory at HD = 256, and the flash kernels up to 104 KB:
// allow more than the default 48 KB.
void attention_setup(int HD) {
    if (HD > HD_MAX) { die("head dim C/NH=%d is over the CUDA trainer's %d; use more heads (-NH)", HD, HD_MAX); }
    int bytes = (4 * ATT_TILE * (HD + 1) + 2 * ATT_TILE) * (int)sizeof(float);
    cudaCheck(cudaFuncSetAttribute(attention_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    cudaCheck(cudaFuncSetAttribute(attention_backward_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    cudaCheck(cudaFuncSetAttribute(attention_backward_dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
#ifndef PRECISION_FP32
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&att_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (attention_use_flash(HD)) {
        if (HD == 64) { Flash<64>::setup(); }
        else { Flash<128>::setup(); }
    }
#endif
}
