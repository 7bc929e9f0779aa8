// kernels/attention.cuh: causal self-attention with grouped-query heads.
// q, out (B, T, NH, HD); k, v (B, T, NKV, HD); query head h reads key/value head
// h / (NH/NKV); scores scaled by 1/sqrt(HD). The forward keeps only lse (B, NH, T),
// each row's log-sum-exp, and the backward recomputes p = exp(score - lse): no
// (T, T) matrix is stored. Any T (sampling runs T = 1, 2, 3, ...).
// One predicate, attention_use_flash(HD), picks the kernels:
//  - fast: FlashAttention-2 on tensor cores, the bf16 build at HD = 64 or 128 on
//    an sm_90 GPU built with sm_90a code: Hopper's wgmma (bf16 in, fp32
//    accumulation) on tiles brought by TMA into mbarrier rings. Forward: 128
//    query rows and 256 threads a block, two blocks per SM (lab
//    dev/cuda/attention.cu v5, variant 2). Backward: a dk/dv pass and a dq pass,
//    one warpgroup (64 keys or query rows) a block (lab v6, variant 1).
//  - fallback: one warp per row on the CUDA cores in fp32 with an online softmax,
//    every other case (the fp32 build, other head dims, other GPUs or an -arch
//    without sm_90a). Lab: dev/cuda/attention.cu v1.

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
                                               const floatX *q, const floatX *k, const floatX *v, int T, int NH, int NKV, int HD,
                                               size_t ldv) {
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
                dv[((size_t)b * T + t2) * ldv + kvh * HD + d] = fromF<floatX>(dva[rr][i]);
            }
        }
    }
}

#ifndef PRECISION_FP32
// ----------------------------------------------------------------------------
// Flash kernels (bf16 build, sm_90a): the FlashAttention-2 scheme, the online
// softmax in base 2. No atomics: each output element is written by one thread.
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Forward (lab v5, variant 2): Hopper's own instructions, sm_90a. The same online
// softmax in base 2, executed by
//   - wgmma.mma_async m64nNk16 (bf16 in, fp32 accumulate): one warpgroup (4 warps)
//     per 64 query rows; S = Q K^T with both operands in shared memory (K-major
//     descriptors), O += P V with P from registers and V from shared memory
//     (N-major descriptor: V is stored key-major, so wgmma transposes it);
//   - TMA (cp.async.bulk.tensor.3d) for the Q, K and V tiles in the 128-byte
//     swizzle, described by 3D tensor maps (columns, T, B) made on the host;
//   - a ring of ST = 2 K/V stages with mbarriers: per stage "K full" and "V full"
//     (thread 0's arrive.expect_tx + the TMA bytes) and "empty" (the 8 warps
//     arrive once their wgmmas reading the stage completed); thread 0 issues
//     every copy between its own steps, and refills a stage once it is empty.
// Block: 128 query rows (two warpgroups), 256 threads, two blocks per SM; kv tiles
// of BC = 128 keys at HD = 64, 64 at HD = 128 (register budget of S and O).
// grid (NH, B, ceil(T/128)), the q tile slowest and heaviest first.
// Any T: a tile's rows past T are out of bounds of its batch in the 3D tensor
// map and arrive as zeros (TMA still counts the whole box's bytes); keys past T
// are later than every row < T, so the causal mask drops them; kv tiles up to
// the block's last row < T are visited; rows past T are computed (the wgmmas are
// warpgroup-wide) but their out and lse are not stored.
// Shared-memory tiles: R rows x HD columns are HD/64 panels of R x 64 bf16 (one
// 128-byte row per tile row, each panel 1024-byte aligned); the swizzle stores
// 16-byte chunk c of row r at chunk c ^ (r % 8), the layout wgmma's swizzle mode 1
// reads (the lab's v5_selftest replays this index arithmetic on the host).
// Fragments (wgmma m64nNk16, warp w of the warpgroup, g = lane/4, t = lane%4):
//   accumulator d[4i + 2h + e] = D[16w + g + 8h][8i + 2t + e]
//   register A  a[2i + h], halves e = A[16w + g + 8h][8i + 2t + e]   (i, h, e in {0,1})
// so S's accumulator of keys 16kc..16kc+15, rounded pairwise to bf16, is P's A
// fragment kc: a[kc][r] = pack(d[8kc + 2r], d[8kc + 2r + 1]).
// out (B, T, NH, HD) = O / l; lse (B, NH, T) = (m + log2 l) ln 2.
// smem: 1 KB alignment slack + Q (128 HD) + 2 stages of K and V (BC HD each), bf16.
template <int HD>
struct FwdCfg {
    static constexpr int BR = 128, BC = HD == 64 ? 128 : 64, NP = HD / 64, ST = 2, THREADS = 256;
    static constexpr int PANEL_Q = BR * 128, PANEL_KV = BC * 128;   // bytes of one 64-column panel
    static constexpr int Q_BYTES = NP * PANEL_Q, KV_BYTES = NP * PANEL_KV;
    static constexpr int NBARS = 1 + 3 * ST;                         // q full; per stage K full, V full, empty
    static constexpr size_t SMEM = 1024 + Q_BYTES + 2 * (size_t)ST * KV_BYTES + 8 * NBARS;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATT_WGMMA 1
#endif

// descriptor of a shared-memory operand in the 128-byte swizzle (mode 1 in bits
// 62-63): start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29,
// stride byte offset >> 4 in 32-45, base offset 0 (panels are 1024-byte aligned).
// K-major (Q, K): 128-byte rows, SBO = 1024 between groups of 8 rows, LBO unused.
// N-major (V): 128-byte k rows, SBO = 1024 between groups of 8 k rows, LBO = the
// offset between 64-column panels (unused by the n64 instructions issued here).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

#ifdef ATT_WGMMA
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
// waits for the completion of the barrier's phase with this parity; a wait past
// 2^34 clocks (~10 s) is a pipeline bug: trap, so the launch fails instead of hanging
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    uint32_t done = 0;
    long long t0 = 0;
    for (int spin = 0; ; spin++) {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_u32(b)), "r"(parity) : "memory");
        if (done) { return; }
        if (spin == 0) { t0 = clock64(); }
        else if (clock64() - t0 > (1ll << 34)) { __trap(); }
    }
}
// rows [t, t + box rows) x columns [c0, c0 + 64) of batch b of the 3D tensor map into
// dst, completing the box's bytes on bar; rows past T arrive as zeros
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int t, int b) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(c0), "r"(t), "r"(b), "r"(smem_u32(bar)) : "memory");
}
// bytes (a multiple of 16; both addresses 16-byte aligned) from global to shared
// memory, completing them on bar
__device__ __forceinline__ void bulk_load_1d(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// wait until at most N committed wgmma groups of this thread are pending
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { wgmma_wait<0>(); }
// the compiler must not move accumulator reads or writes across the asynchronous wgmma window
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) { asm volatile("" : "+f"(d[i])::"memory"); }
}
template <int N>
__device__ __forceinline__ void reg_fence_u(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int r = 0; r < 4; r++) { asm volatile("" : "+r"(a[i][r])::"memory"); }
}

// accumulator operand lists: read-write (scale-d 1) or write-only (scale-d 0: D = A B)
#define WG_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_W8(i) "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3]), "=f"(d[i + 4]), "=f"(d[i + 5]), \
                 "=f"(d[i + 6]), "=f"(d[i + 7])
#define WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define WG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
// d (64 x N fp32) = A (64 x 16, smem, K-major) B (16 x N, smem, K-major) + (SD ? d : 0), N = 128 or 64
template <int N, int SD>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db) {
    static_assert(N == 128 || N == 64, "n128 and n64 only");
    if constexpr (N == 128 && SD) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64 "%64, %65, 1, 1, 1, 0, 0;\n"
                     : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40), WG_F8(48), WG_F8(56)
                     : "l"(da), "l"(db));
    } else if constexpr (N == 128) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64 "%64, %65, 0, 1, 1, 0, 0;\n"
                     : WG_W8(0), WG_W8(8), WG_W8(16), WG_W8(24), WG_W8(32), WG_W8(40), WG_W8(48), WG_W8(56)
                     : "l"(da), "l"(db));
    } else if constexpr (SD) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 "%32, %33, 1, 1, 1, 0, 0;\n"
                     : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24)
                     : "l"(da), "l"(db));
    } else {
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 "%32, %33, 0, 1, 1, 0, 0;\n"
                     : WG_W8(0), WG_W8(8), WG_W8(16), WG_W8(24)
                     : "l"(da), "l"(db));
    }
}
// d (64 x 64 fp32) += A (64 x 16, registers) B (16 x 64, smem, N-major: imm-trans-b = 1)
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#undef WG_F8
#undef WG_W8
#undef WG_D32
#undef WG_D64
#endif  // ATT_WGMMA

// tq describes q as (NH HD, T, B) with boxes of 64 x 128 x 1; tk, tv describe k, v
// as (NKV HD, T, B) with boxes of 64 x BC x 1. sl2 = log2(e) / sqrt(HD).
template <int HD>
__global__ void __launch_bounds__(FwdCfg<HD>::THREADS, 2)
attention_forward_wgmma_kernel(bf16 *out, float *lse, const __grid_constant__ CUtensorMap tq,
                               const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                               int T, int NH, int NKV, float sl2) {
#ifdef ATT_WGMMA
    using C = FwdCfg<HD>;
    constexpr int BR = C::BR, BC = C::BC, NP = C::NP, ST = C::ST;
    extern __shared__ unsigned char wg_smem[];
    unsigned char *sQ = wg_smem + ((1024 - (smem_u32(wg_smem) & 1023)) & 1023);
    unsigned char *sK = sQ + C::Q_BYTES, *sV = sK + ST * C::KV_BYTES;
    uint64_t *qfull = (uint64_t *)(sV + ST * C::KV_BYTES), *kfull = qfull + 1, *vfull = kfull + ST, *empty = vfull + ST;
    const int qb = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y;
    const int kvh = h / (NH / NKV), q0 = qb * BR, nkv = (min(q0 + BR, T) - 1) / BC + 1;   // up to the last row < T
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        mbar_init(qfull, 1);
        for (int s = 0; s < ST; s++) { mbar_init(kfull + s, 1); mbar_init(vfull + s, 1); mbar_init(empty + s, 8); }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // visible to the async proxy (TMA)
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();

    auto load_kv = [&](int j) {   // K and V of kv tile j into stage j % ST (empty: released or never used)
        const int s = j % ST;
        mbar_expect_tx(kfull + s, C::KV_BYTES);
        for (int p = 0; p < NP; p++) { tma_load_3d(sK + s * C::KV_BYTES + p * C::PANEL_KV, &tk, kfull + s, kvh * HD + 64 * p, j * BC, b); }
        mbar_expect_tx(vfull + s, C::KV_BYTES);
        for (int p = 0; p < NP; p++) { tma_load_3d(sV + s * C::KV_BYTES + p * C::PANEL_KV, &tv, vfull + s, kvh * HD + 64 * p, j * BC, b); }
    };
    if (threadIdx.x == 0) {   // Q and the first ST kv tiles; the rest after each release (below)
        mbar_expect_tx(qfull, C::Q_BYTES);
        for (int p = 0; p < NP; p++) { tma_load_3d(sQ + p * C::PANEL_Q, &tq, qfull, h * HD + 64 * p, q0, b); }
        for (int j = 0; j < ST && j < nkv; j++) { load_kv(j); }
    }

    // warpgroup wg owns rows q0 + 64 wg .. +63, warp wl of it rows rw .. rw + 15
    const int wg = warp / 4, wl = warp % 4, g = lane / 4, t4 = lane % 4;
    const int rw = q0 + wg * 64 + wl * 16;
    float o[NP][32], sc[BC / 2];
    uint32_t pa[BC / 16][4];
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int i = 0; i < 32; i++) { o[p][i] = 0.f; }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const uint32_t qaddr = smem_u32(sQ) + wg * 64 * 128;
    mbar_wait(qfull, 0);
    __syncwarp();   // warp 0 converged (lane 0 issued copies) before the .aligned wgmma instructions

    auto settle = [&]() {   // every issued wgmma of this thread completed; its registers are final
        wgmma_wait_all();
        reg_fence(sc);
#pragma unroll
        for (int p = 0; p < NP; p++) { reg_fence(o[p]); }
        reg_fence_u(pa);
    };
    for (int j = 0; j < nkv; j++) {
        const int s = j % ST, k0 = j * BC;
        // S_j = Q K_j^T: k16 step kk reads panel kk / 4, 32 bytes a step inside it
        mbar_wait(kfull + s, (j / ST) & 1);
        __syncwarp();
        const uint32_t kaddr = smem_u32(sK + s * C::KV_BYTES);
        wgmma_fence();
        wgmma_ss<BC, 0>(sc, wg_desc(qaddr, 16, 1024), wg_desc(kaddr, 16, 1024));
#pragma unroll
        for (int kk = 1; kk < HD / 16; kk++) {
            const uint32_t koff = (kk % 4) * 32;
            wgmma_ss<BC, 1>(sc, wg_desc(qaddr + (kk / 4) * C::PANEL_Q + koff, 16, 1024),
                            wg_desc(kaddr + (kk / 4) * C::PANEL_KV + koff, 16, 1024));
        }
        wgmma_commit();
        settle();
        // causal mask where the tile crosses the diagonal of some row of this warp (keys past T included)
        if (k0 + BC - 1 > rw) {
#pragma unroll
            for (int i = 0; i < BC / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (k0 + 8 * i + 2 * t4 + (e & 1) > rw + g + 8 * (e >> 1)) { sc[4 * i + e] = -INFINITY; }
                }
        }
        // online softmax; tile 0 holds key 0, visible to every row, so m is finite from then on
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < BC / 8; i++) { mx = fmaxf(mx, fmaxf(sc[4 * i + 2 * r], sc[4 * i + 2 * r + 1])); }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(m[r], mx * sl2), alpha = exp2f(m[r] - mnew);
            m[r] = mnew;
            l[r] *= alpha;
#pragma unroll
            for (int i = 0; i < BC / 8; i++) {
                sc[4 * i + 2 * r] = exp2f(fmaf(sc[4 * i + 2 * r], sl2, -mnew));
                sc[4 * i + 2 * r + 1] = exp2f(fmaf(sc[4 * i + 2 * r + 1], sl2, -mnew));
                l[r] += sc[4 * i + 2 * r] + sc[4 * i + 2 * r + 1];
            }
#pragma unroll
            for (int p = 0; p < NP; p++)
#pragma unroll
                for (int i = 0; i < 8; i++) { o[p][4 * i + 2 * r] *= alpha; o[p][4 * i + 2 * r + 1] *= alpha; }
        }
        // P_j -> bf16 A fragments (register pairs of the accumulator)
#pragma unroll
        for (int kc = 0; kc < BC / 16; kc++)
#pragma unroll
            for (int r = 0; r < 4; r++) { pa[kc][r] = pack_bf16(sc[8 * kc + 2 * r], sc[8 * kc + 2 * r + 1]); }
        // O += P_j V_j: k16 step kc reads key rows 16 kc.., 2048 bytes a step
        mbar_wait(vfull + s, (j / ST) & 1);
        __syncwarp();
        const uint32_t vaddr = smem_u32(sV + s * C::KV_BYTES);
#pragma unroll
        for (int p = 0; p < NP; p++) { reg_fence(o[p]); }
        reg_fence_u(pa);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < BC / 16; kc++)
#pragma unroll
            for (int p = 0; p < NP; p++) {
                wgmma_rs_n64(o[p], pa[kc], wg_desc(vaddr + p * C::PANEL_KV + kc * 2048, C::PANEL_KV, 1024));
            }
        wgmma_commit();
        settle();
        // this warp is done with stage s; thread 0 refills it with tile j + ST once all 8 warps are (phase j / ST)
        __syncwarp();
        if (lane == 0) { mbar_arrive(empty + s); }
        if (threadIdx.x == 0 && j + ST < nkv) {
            mbar_wait(empty + s, (j / ST) & 1);
            load_kv(j + ST);
        }
        __syncwarp();   // warp 0 reconverges before its next .aligned wgmma instructions
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    const int row0 = rw + g;   // and row0 + 8: stored only where < T
    const bool in0 = row0 < T, in1 = row0 + 8 < T;
    if (t4 == 0) {
        float *lrow = lse + ((size_t)b * NH + h) * T + row0;
        if (in0) { lrow[0] = (m[0] + log2f(l[0])) * LN2; }
        if (in1) { lrow[8] = (m[1] + log2f(l[1])) * LN2; }
    }
    const float inv0 = 1.f / l[0], inv1 = 1.f / l[1];
    bf16 *o0 = out + (((size_t)b * T + row0) * NH + h) * HD, *o1 = o0 + (size_t)8 * NH * HD;
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int col = 64 * p + 8 * i + 2 * t4;
            if (in0) { *(uint32_t *)(o0 + col) = pack_bf16(o[p][4 * i] * inv0, o[p][4 * i + 1] * inv0); }
            if (in1) { *(uint32_t *)(o1 + col) = pack_bf16(o[p][4 * i + 2] * inv1, o[p][4 * i + 3] * inv1); }
        }
#else
    __trap();   // built without sm_90a: attention_setup's probe keeps the host from launching it
#endif
}

// 1 where this build has the wgmma forward's device code (sm_90a), else 0
__global__ void attention_wgmma_probe_kernel(int *built) {
#ifdef ATT_WGMMA
    *built = 1;
#else
    *built = 0;
#endif
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

// Backward (lab v6, variant 1): v2's deterministic split, a dk/dv pass and a dq pass
// (S and dP computed in both: 7 products instead of 5, the price of no atomics), every
// product a wgmma m64n64k16 (bf16 in, fp32 accumulate) on the forward's layouts: a
// tile of 64 rows x HD lands by TMA (3D maps, boxes of 64 rows) as HD/64 panels of
// 64 rows x 128 bytes (8 KB each) in the 128-byte swizzle. Read with its rows as M or
// N (K = the head dimension) a tile is a K-major operand (the forward's Q and K);
// read with its rows as K it is N-major (the forward's V). The products whose A is
// P^T, dS^T or dS take it from registers: a 64 x 64 accumulator repacks into four k16
// A fragments exactly as the forward's P (wg_pack).
//   dk/dv pass, grid (NKV, B, ceil(T/64)), the kv tile slowest and tile 0 (the most q
//   tiles) first: a block owns 64 keys of kv head kvh (its K and V tiles, loaded once)
//   and walks every query head of the group and every q tile of 64 rows from its
//   diagonal on:
//     S^T = K Q^T, dP^T = V dO^T (both operands K-major), issued together;
//     P^T = exp2(S^T sl2 - lse[query] log2e) (0 where query < key), computed while
//     dP^T runs; dS^T = P^T (dP^T - D[query]);
//     dV += P^T dO, dK += dS^T Q (A from registers, B = dO, Q read N-major).
//   The accumulators' COLUMN is the query: lse and D of the q tile (64 floats each)
//   travel with the Q and dO tiles into the stage and are read as float2 at column
//   8i + 2t. They come by two 256-byte bulk copies when the 64 entries lie inside
//   the (b, h) row and are 16-byte aligned (bulk: T % 4 == 0 and aligned buffers),
//   otherwise thread 0 copies them (the last, partial q tile; T % 4 != 0).
//   dq pass, grid (NH, B, ceil(T/64)), the q tile slowest and heaviest first: a
//   block owns 64 query rows of head h (Q and dO, loaded once) and walks the kv
//   tiles up to its diagonal: S = Q K^T, dP = dO V^T, P, dS = P (dP - D),
//   dQ += dS K (A = dS from registers, K read N-major).
// Block: one warpgroup (128 threads); no producer warp: thread 0 issues every copy
// into a ring of ST = 2 stages (dk/dv: Q, dO, lse, D; dq: K, V) with a "full"
// barrier (thread 0's arrive.expect_tx + the bytes) and an "empty" one (the 4 warps
// arrive once the products reading the stage completed) per stage; thread 0 refills
// a stage once it is empty. dK and dQ are scaled by 1/sqrt(HD) once at the end; dq
// and dk are stored in fp32 (their consumers, RoPE and the QK-norm backward, want no
// rounding), dv in bf16.
// Any T: rows past T of every tile arrive as zeros (3D maps, as in the forward);
// queries past T get lse = +inf (p = exp2(-inf) = 0, so dS = 0) and D = 0; keys past
// T are later than every query < T, so the causal mask drops them; nothing past T
// is stored. Accumulator element v of thread (warp w, lane 4g + t) is row 16w + g +
// 8((v >> 1) & 1), column 8(v >> 2) + 2t + (v & 1) of the 64 x 64 product.
// smem: 1 KB alignment slack + the block's own two tiles + ST stages of two tiles
// (+ 2 x 64 floats in the dk/dv pass) + barriers.
template <int HD>
struct BwdCfg {
    static constexpr int NP = HD / 64, TILE = NP * 64 * 128, ST = 2, THREADS = 128;
    static constexpr int NBARS = 1 + 2 * ST;   // own tiles full; per stage full, empty
    static constexpr size_t DKDV_SMEM = 1024 + 2 * (size_t)TILE + 2 * (size_t)ST * TILE + 2 * ST * 256 + 8 * NBARS;
    static constexpr size_t DQ_SMEM = 1024 + 2 * (size_t)TILE + 2 * (size_t)ST * TILE + 8 * NBARS;
};

#ifdef ATT_WGMMA
// d (64 x 64) = A B^T over the head dimension, A the 64 rows of the tile at a, B
// those of the tile at b (both K-major: HD/16 k16 steps, 32 bytes apart inside a
// panel); issued and committed as one group, not waited for
template <int HD>
__device__ __forceinline__ void wg_rowdot(float (&d)[32], uint32_t a, uint32_t b) {
    wgmma_ss<64, 0>(d, wg_desc(a, 16, 1024), wg_desc(b, 16, 1024));
#pragma unroll
    for (int kk = 1; kk < HD / 16; kk++) {
        const uint32_t off = (kk / 4) * 8192 + (kk % 4) * 32;
        wgmma_ss<64, 1>(d, wg_desc(a + off, 16, 1024), wg_desc(b + off, 16, 1024));
    }
    wgmma_commit();
}
// acc (64 x HD as NP panels of 64 columns) += A (64 x 64, four k16 register
// fragments) B, B the tile at b read N-major (k = its rows, 2048 bytes a k16 step;
// n = its columns, panel p); issued, not committed
template <int NP>
__device__ __forceinline__ void wg_accum(float (&acc)[NP][32], const uint32_t (&a)[4][4], uint32_t b) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++)
#pragma unroll
        for (int p = 0; p < NP; p++) { wgmma_rs_n64(acc[p], a[kc], wg_desc(b + p * 8192 + kc * 2048, 8192, 1024)); }
}
// a 64 x 64 fp32 accumulator -> the four bf16 k16 A fragments (the forward's P pack)
__device__ __forceinline__ void wg_pack(uint32_t (&a)[4][4], const float (&x)[32]) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++)
#pragma unroll
        for (int r = 0; r < 4; r++) { a[kc][r] = pack_bf16(x[8 * kc + 2 * r], x[8 * kc + 2 * r + 1]); }
}
// the backward's barriers, consecutive: own tiles (1 arrival), full[ST] (1), empty[ST] (one per warp)
template <int ST>
__device__ __forceinline__ void bwd_init_bars(uint64_t *own) {
    mbar_init(own, 1);
    for (int s = 0; s < ST; s++) { mbar_init(own + 1 + s, 1); mbar_init(own + 1 + ST + s, 4); }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // visible to the async proxy (TMA)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#endif

// dk (fp32), dv (bf16), each (B, T, NKV, HD) (dv's positions ldv elements apart), of the
// block's 64 keys of kv head blockIdx.x. tq, tdo describe q, dout as (NH HD, T, B), tk, tv k, v as (NKV HD, T,
// B), boxes of 64 x 64 x 1; lse, Dt (B, NH, T); bulk: see above.
template <int HD>
__global__ void __launch_bounds__(BwdCfg<HD>::THREADS, 1)
attention_backward_dkdv_wgmma_kernel(float *dk, bf16 *dv, const __grid_constant__ CUtensorMap tq,
                                     const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                                     const __grid_constant__ CUtensorMap tdo, const float *lse, const float *Dt,
                                     int T, int NH, int NKV, int bulk, float scale, float sl2, size_t ldv) {
#ifdef ATT_WGMMA
    using C = BwdCfg<HD>;
    constexpr int NP = C::NP, TILE = C::TILE, ST = C::ST;
    extern __shared__ unsigned char wg_smem[];
    unsigned char *sK = wg_smem + ((1024 - (smem_u32(wg_smem) & 1023)) & 1023);
    unsigned char *sV = sK + TILE, *sQ = sV + TILE, *sdO = sQ + ST * TILE;
    float *sL = (float *)(sdO + ST * TILE), *sD = sL + ST * 64;
    uint64_t *own = (uint64_t *)(sD + ST * 64), *full = own + 1, *empty = full + ST;
    const int kvh = blockIdx.x, b = blockIdx.y, kt = blockIdx.z;
    const int G = NH / NKV, k0 = kt * 64, nq = (T + 63) / 64 - kt, nit = G * nq;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    if (threadIdx.x == 0) { bwd_init_bars<ST>(own); }
    __syncthreads();
    // step it: query head kvh G + it / nq, q tile kt + it % nq, into stage it % ST
    // (empty: released or never used)
    auto load = [&](int it) {
        const int s = it % ST, h = kvh * G + it / nq, qt0 = (kt + it % nq) * 64;
        const size_t lo = ((size_t)b * NH + h) * T + qt0;
        const bool whole = bulk && qt0 + 64 <= T;
        if (!whole) {   // by hand; past T: lse = +inf (p = 0), D = 0
            for (int c = 0; c < 64; c++) {
                sL[s * 64 + c] = qt0 + c < T ? lse[lo + c] : INFINITY;
                sD[s * 64 + c] = qt0 + c < T ? Dt[lo + c] : 0.f;
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // before a later bulk copy to these words
        }
        mbar_expect_tx(full + s, 2 * TILE + (whole ? 512 : 0));   // releases the writes above to the waiters
        for (int p = 0; p < NP; p++) {
            tma_load_3d(sQ + s * TILE + p * 8192, &tq, full + s, h * HD + 64 * p, qt0, b);
            tma_load_3d(sdO + s * TILE + p * 8192, &tdo, full + s, h * HD + 64 * p, qt0, b);
        }
        if (whole) {
            bulk_load_1d(sL + s * 64, lse + lo, 256, full + s);
            bulk_load_1d(sD + s * 64, Dt + lo, 256, full + s);
        }
    };
    if (threadIdx.x == 0) {
        mbar_expect_tx(own, 2 * TILE);
        for (int p = 0; p < NP; p++) {
            tma_load_3d(sK + p * 8192, &tk, own, kvh * HD + 64 * p, k0, b);
            tma_load_3d(sV + p * 8192, &tv, own, kvh * HD + 64 * p, k0, b);
        }
        for (int it = 0; it < ST && it < nit; it++) { load(it); }
    }
    float dka[NP][32], dva[NP][32], st[32], dpt[32];
    uint32_t pa[4][4], da[4][4];
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int i = 0; i < 32; i++) { dka[p][i] = 0.f; dva[p][i] = 0.f; }
    const int key = k0 + 16 * warp + g;   // this thread's keys: key, key + 8
    const uint32_t kaddr = smem_u32(sK), vaddr = smem_u32(sV);
    auto fence_acc = [&]() {
#pragma unroll
        for (int p = 0; p < NP; p++) { reg_fence(dka[p]); reg_fence(dva[p]); }
        reg_fence_u(pa);
        reg_fence_u(da);
    };
    mbar_wait(own, 0);
    __syncwarp();   // warp 0 converged (lane 0 issued copies) before the .aligned wgmma instructions
    for (int it = 0; it < nit; it++) {
        const int s = it % ST, qt0 = (kt + it % nq) * 64;
        const uint32_t qaddr = smem_u32(sQ + s * TILE), doaddr = smem_u32(sdO + s * TILE);
        mbar_wait(full + s, (it / ST) & 1);
        __syncwarp();
        wgmma_fence();
        wg_rowdot<HD>(st, kaddr, qaddr);     // S^T = K Q^T
        wg_rowdot<HD>(dpt, vaddr, doaddr);   // dP^T = V dO^T
        wgmma_wait<1>();                     // S^T complete; dP^T may still run
        reg_fence(st);
        fence_acc();
        const float *cL = sL + s * 64, *cD = sD + s * 64;
        const bool mask = qt0 < k0 + 63;   // the diagonal tile: some query precedes some key
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float2 L = *(const float2 *)(cL + 8 * i + 2 * t4);
            const float L2[2] = {L.x * LOG2E, L.y * LOG2E};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(fmaf(st[4 * i + e], sl2, -L2[e & 1]));
                if (mask && qt0 + 8 * i + 2 * t4 + (e & 1) < key + 8 * (e >> 1)) { p = 0.f; }
                st[4 * i + e] = p;
            }
        }
        wgmma_wait<0>();
        reg_fence(dpt);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float2 D = *(const float2 *)(cD + 8 * i + 2 * t4);
            const float Dv[2] = {D.x, D.y};
#pragma unroll
            for (int e = 0; e < 4; e++) { dpt[4 * i + e] = st[4 * i + e] * (dpt[4 * i + e] - Dv[e & 1]); }   // dS^T
        }
        wg_pack(pa, st);
        wg_pack(da, dpt);
        fence_acc();
        wgmma_fence();
        wg_accum<NP>(dva, pa, doaddr);   // dV += P^T dO
        wg_accum<NP>(dka, da, qaddr);    // dK += dS^T Q
        wgmma_commit();
        wgmma_wait<0>();
        fence_acc();
        // this warp is done with stage s; thread 0 refills it with step it + ST once all 4 warps are
        __syncwarp();
        if (lane == 0) { mbar_arrive(empty + s); }
        if (threadIdx.x == 0 && it + ST < nit) {
            mbar_wait(empty + s, (it / ST) & 1);
            load(it + ST);
        }
        __syncwarp();   // warp 0 reconverges before its next .aligned wgmma instructions
    }
    // dka[p][4i + 2hh + e] -> key key + 8hh, column 64p + 8i + 2t + e; keys past T are not stored
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        if (key + 8 * hh >= T) { continue; }
        const size_t ro = (((size_t)b * T + key + 8 * hh) * NKV + kvh) * HD;
        const size_t rv = ((size_t)b * T + key + 8 * hh) * ldv + kvh * HD;
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int col = 64 * p + 8 * i + 2 * t4;
                *(float2 *)(dk + ro + col) = make_float2(dka[p][4 * i + 2 * hh] * scale, dka[p][4 * i + 2 * hh + 1] * scale);
                *(uint32_t *)(dv + rv + col) = pack_bf16(dva[p][4 * i + 2 * hh], dva[p][4 * i + 2 * hh + 1]);
            }
    }
#else
    __trap();   // built without sm_90a: attention_setup's probe keeps the host from launching it
#endif
}

// dq (B, T, NH, HD) fp32 of the block's 64 query rows of head blockIdx.x; the
// tensor maps and lse, Dt as for the dk/dv pass.
template <int HD>
__global__ void __launch_bounds__(BwdCfg<HD>::THREADS, 1)
attention_backward_dq_wgmma_kernel(float *dq, const __grid_constant__ CUtensorMap tq,
                                   const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                                   const __grid_constant__ CUtensorMap tdo, const float *lse, const float *Dt,
                                   int T, int NH, int NKV, float scale, float sl2) {
#ifdef ATT_WGMMA
    using C = BwdCfg<HD>;
    constexpr int NP = C::NP, TILE = C::TILE, ST = C::ST;
    extern __shared__ unsigned char wg_smem[];
    unsigned char *sQ = wg_smem + ((1024 - (smem_u32(wg_smem) & 1023)) & 1023);
    unsigned char *sdO = sQ + TILE, *sK = sdO + TILE, *sV = sK + ST * TILE;
    uint64_t *own = (uint64_t *)(sV + ST * TILE), *full = own + 1, *empty = full + ST;
    const int h = blockIdx.x, b = blockIdx.y, qt = gridDim.z - 1 - blockIdx.z;   // the last q tile first
    const int kvh = h / (NH / NKV), q0 = qt * 64, nkv = qt + 1;   // kv tiles up to the diagonal
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    if (threadIdx.x == 0) { bwd_init_bars<ST>(own); }
    __syncthreads();
    auto load = [&](int j) {   // kv tile j into stage j % ST (empty: released or never used)
        const int s = j % ST;
        mbar_expect_tx(full + s, 2 * TILE);
        for (int p = 0; p < NP; p++) {
            tma_load_3d(sK + s * TILE + p * 8192, &tk, full + s, kvh * HD + 64 * p, 64 * j, b);
            tma_load_3d(sV + s * TILE + p * 8192, &tv, full + s, kvh * HD + 64 * p, 64 * j, b);
        }
    };
    if (threadIdx.x == 0) {
        mbar_expect_tx(own, 2 * TILE);
        for (int p = 0; p < NP; p++) {
            tma_load_3d(sQ + p * 8192, &tq, own, h * HD + 64 * p, q0, b);
            tma_load_3d(sdO + p * 8192, &tdo, own, h * HD + 64 * p, q0, b);
        }
        for (int j = 0; j < ST && j < nkv; j++) { load(j); }
    }
    // this thread's rows: row, row + 8; past T: lse = +inf (p = 0), D = 0
    const int row = q0 + 16 * warp + g;
    const size_t lo = ((size_t)b * NH + h) * T + row;
    const float L2[2] = {row < T ? lse[lo] * LOG2E : INFINITY, row + 8 < T ? lse[lo + 8] * LOG2E : INFINITY};
    const float Dv[2] = {row < T ? Dt[lo] : 0.f, row + 8 < T ? Dt[lo + 8] : 0.f};
    float dqa[NP][32], sc[32], dp[32];
    uint32_t dsa[4][4];
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int i = 0; i < 32; i++) { dqa[p][i] = 0.f; }
    const uint32_t qaddr = smem_u32(sQ), doaddr = smem_u32(sdO);
    auto fence_acc = [&]() {
#pragma unroll
        for (int p = 0; p < NP; p++) { reg_fence(dqa[p]); }
        reg_fence_u(dsa);
    };
    mbar_wait(own, 0);
    __syncwarp();
    for (int j = 0; j < nkv; j++) {
        const int s = j % ST, kt0 = 64 * j;
        const uint32_t kaddr = smem_u32(sK + s * TILE), vaddr = smem_u32(sV + s * TILE);
        mbar_wait(full + s, (j / ST) & 1);
        __syncwarp();
        wgmma_fence();
        wg_rowdot<HD>(sc, qaddr, kaddr);    // S = Q K^T
        wg_rowdot<HD>(dp, doaddr, vaddr);   // dP = dO V^T
        wgmma_wait<1>();
        reg_fence(sc);
        fence_acc();
        const bool mask = kt0 + 63 > q0;   // the diagonal tile (keys past T included)
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(fmaf(sc[4 * i + e], sl2, -L2[e >> 1]));
                if (mask && kt0 + 8 * i + 2 * t4 + (e & 1) > row + 8 * (e >> 1)) { p = 0.f; }
                sc[4 * i + e] = p;
            }
        wgmma_wait<0>();
        reg_fence(dp);
#pragma unroll
        for (int i = 0; i < 32; i++) { dp[i] = sc[i] * (dp[i] - Dv[(i >> 1) & 1]); }   // dS
        wg_pack(dsa, dp);
        fence_acc();
        wgmma_fence();
        wg_accum<NP>(dqa, dsa, kaddr);   // dQ += dS K
        wgmma_commit();
        wgmma_wait<0>();
        fence_acc();
        __syncwarp();
        if (lane == 0) { mbar_arrive(empty + s); }
        if (threadIdx.x == 0 && j + ST < nkv) {
            mbar_wait(empty + s, (j / ST) & 1);
            load(j + ST);
        }
        __syncwarp();
    }
    // dqa[p][4i + 2hh + e] -> row row + 8hh, column 64p + 8i + 2t + e; rows past T are not stored
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        if (row + 8 * hh >= T) { continue; }
        float *o = dq + (((size_t)b * T + row + 8 * hh) * NH + h) * HD;
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                *(float2 *)(o + 64 * p + 8 * i + 2 * t4) =
                    make_float2(dqa[p][4 * i + 2 * hh] * scale, dqa[p][4 * i + 2 * hh + 1] * scale);
            }
    }
#else
    __trap();
#endif
}

// Tensor maps of the wgmma kernels: q, dout (B, T, NH HD) and k, v (B, T, NKV HD) as 3D
// bf16 tensors (columns fastest) with boxes of 64 columns x box_rows rows x 1 batch
// in the 128-byte swizzle; rows past T of a batch are out of bounds (zero-filled),
// never the next batch's. The encoder is the driver's cuTensorMapEncodeTiled, taken
// through the runtime (cudaGetDriverEntryPointByVersion): no -lcuda.
CUtensorMap att_tmap_3d(const bf16 *base, size_t cols, int T, int B, int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (!encode) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult qr = cudaDriverEntryPointSymbolNotFound;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &qr));
        if (qr != cudaDriverEntryPointSuccess || !p) {
            die("attention: the CUDA driver has no cuTensorMapEncodeTiled (query result %d); update the driver", (int)qr);
        }
        encode = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    CUtensorMap m;
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[2] = {(cuuint64_t)(cols * sizeof(bf16)), (cuuint64_t)((size_t)T * cols * sizeof(bf16))};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, estr[3] = {1, 1, 1};
    const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, estr,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        die("attention: cuTensorMapEncodeTiled failed (CUresult %d) for a (%d, %d, %zu) bf16 tensor at %p, box 64 x %d",
            (int)r, B, T, cols, (const void *)base, box_rows);
    }
    return m;
}

// The tensor maps of one call, made once per (q, k, v, dout, B, T, NH, NKV, HD, boxes)
// and kept: every layer's q, k, v are their own slices of the activations, and B, T
// change between training, evaluation and sampling calls, so the key is the call's
// pointers, shape and box rows (the forward's: 128 and BC, dout NULL; the backward's:
// 64 and 64, with dout), not a model-build-time list. Encoding is host-only work (no
// device call); a full table is overwritten round-robin.
struct AttTmaps {
    const void *q, *k, *v, *dout;
    int B, T, NH, NKV, HD, box_q, box_kv;
    CUtensorMap tq, tk, tv, tdo;   // tdo only with dout
};
#define ATT_TMAP_SLOTS 256
AttTmaps att_tmaps[ATT_TMAP_SLOTS];
int att_tmaps_used = 0, att_tmaps_next = 0;

// q and dout share box_q rows, k and v box_kv
const AttTmaps &att_tmaps_get(const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout, int B, int T, int NH,
                              int NKV, int HD, int box_q, int box_kv) {
    for (int i = 0; i < att_tmaps_used; i++) {
        const AttTmaps &e = att_tmaps[i];
        if (e.q == q && e.k == k && e.v == v && e.dout == dout && e.B == B && e.T == T && e.NH == NH &&
            e.NKV == NKV && e.HD == HD && e.box_q == box_q && e.box_kv == box_kv) {
            return e;
        }
    }
    AttTmaps &e = att_tmaps[att_tmaps_next];
    att_tmaps_next = (att_tmaps_next + 1) % ATT_TMAP_SLOTS;
    if (att_tmaps_used < ATT_TMAP_SLOTS) { att_tmaps_used++; }
    e.q = q; e.k = k; e.v = v; e.dout = dout; e.B = B; e.T = T; e.NH = NH; e.NKV = NKV; e.HD = HD;
    e.box_q = box_q; e.box_kv = box_kv;
    e.tq = att_tmap_3d(q, (size_t)NH * HD, T, B, box_q);
    e.tk = att_tmap_3d(k, (size_t)NKV * HD, T, B, box_kv);
    e.tv = att_tmap_3d(v, (size_t)NKV * HD, T, B, box_kv);
    if (dout) { e.tdo = att_tmap_3d(dout, (size_t)NH * HD, T, B, box_q); }
    return e;
}

// Launchers at head dim HD: the wgmma forward (FwdCfg) and backward (BwdCfg).
template <int HD> struct Flash {
    static constexpr size_t fwd_smem = FwdCfg<HD>::SMEM, dkdv_smem = BwdCfg<HD>::DKDV_SMEM, dq_smem = BwdCfg<HD>::DQ_SMEM;
    static constexpr size_t max_smem = fwd_smem > dq_smem ? (fwd_smem > dkdv_smem ? fwd_smem : dkdv_smem)
                                                          : (dq_smem > dkdv_smem ? dq_smem : dkdv_smem);

    // allow each kernel its dynamic shared memory (over the default 48 KB)
    static void setup() {
        cudaCheck(cudaFuncSetAttribute(attention_forward_wgmma_kernel<HD>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem));
        cudaCheck(cudaFuncSetAttribute(attention_backward_dkdv_wgmma_kernel<HD>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkdv_smem));
        cudaCheck(cudaFuncSetAttribute(attention_backward_dq_wgmma_kernel<HD>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem));
    }
    // attention_forward's contract: out (B, T, NH, HD), lse (B, NH, T)
    static void forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV) {
        typedef FwdCfg<HD> C;
        const AttTmaps &tm = att_tmaps_get(q, k, v, NULL, B, T, NH, NKV, HD, C::BR, C::BC);
        attention_forward_wgmma_kernel<HD><<<dim3(NH, B, ceil_div(T, C::BR)), C::THREADS, fwd_smem>>>(
            out, lse, tm.tq, tm.tk, tm.tv, T, NH, NKV, LOG2E / sqrtf((float)HD));
        launchCheck();
    }
    // attention_backward's contract: prep (Dt), then the dk/dv pass and the dq pass.
    // lse and Dt move by bulk copies when every (b, h) row of them is 16-byte aligned.
    static void backward(float *dq, float *dk, bf16 *dv, size_t ldv, float *Dt, const bf16 *dout, const bf16 *out,
                         const float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV) {
        typedef BwdCfg<HD> C;
        const float scale = 1.0f / sqrtf((float)HD), sl2 = scale * LOG2E;
        attention_backward_prep_flash_kernel<HD><<<ceil_div((size_t)B * T * NH * (HD / 8), 256), 256>>>(Dt, dout, out, B, T, NH);
        launchCheck();
        const AttTmaps &tm = att_tmaps_get(q, k, v, dout, B, T, NH, NKV, HD, 64, 64);
        const int bulk = T % 4 == 0 && (uintptr_t)lse % 16 == 0 && (uintptr_t)Dt % 16 == 0;
        attention_backward_dkdv_wgmma_kernel<HD><<<dim3(NKV, B, ceil_div(T, 64)), C::THREADS, dkdv_smem>>>(
            dk, dv, tm.tq, tm.tk, tm.tv, tm.tdo, lse, Dt, T, NH, NKV, bulk, scale, sl2, ldv);
        launchCheck();
        attention_backward_dq_wgmma_kernel<HD><<<dim3(NH, B, ceil_div(T, 64)), C::THREADS, dq_smem>>>(
            dq, tm.tq, tm.tk, tm.tv, tm.tdo, lse, Dt, T, NH, NKV, scale, sl2);
        launchCheck();
    }
};

int att_smem_optin = 0;   // the device's opt-in shared memory per block (bytes), read by attention_setup
bool att_wgmma_ok = false;   // an sm_90 device and sm_90a code for the wgmma kernels, read by attention_setup
#endif  // !PRECISION_FP32

// The dispatch rule: the fast kernels in the bf16 build at HD = 64 or 128 on an
// sm_90 device (H100/H200: wgmma, TMA) with sm_90a code in this build, when the
// device gives a block their shared memory (at most 100,392 bytes, the dk/dv pass
// at HD = 128); the simple kernels otherwise.
bool attention_use_flash(int HD) {
#ifdef PRECISION_FP32
    (void)HD;
    return false;
#else
    if (!att_wgmma_ok) { return false; }
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
// floatX (the input of a matmul backward; its positions ldv >= NKV HD elements apart:
// a column block of the trainer's dqkv), given dout (B, T, NH, HD) in floatX,
// the forward output out and its lse. Dt (B, NH, T) is scratch. Both paths are
// deterministic (every element written once by one thread) and take any T; the
// fast one (Flash::backward) is the wgmma dk/dv and dq passes above.
void attention_backward(float *dq, float *dk, floatX *dv, size_t ldv, float *Dt, const floatX *dout, const floatX *out,
                        const float *lse, const floatX *q, const floatX *k, const floatX *v, int B, int T, int NH, int NKV,
                        int HD) {
#ifndef PRECISION_FP32
    if (attention_use_flash(HD)) {
        if (HD == 64) { Flash<64>::backward(dq, dk, dv, ldv, Dt, dout, out, lse, q, k, v, B, T, NH, NKV); }
        else { Flash<128>::backward(dq, dk, dv, ldv, Dt, dout, out, lse, q, k, v, B, T, NH, NKV); }
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
        dk, dv, dout, lse, Dt, q, k, v, T, NH, NKV, HD, ldv);
    launchCheck();
}

// Once per model: the simple kernels take up to (4 * 32 * 257 + 64) * 4 bytes
// = 132 KB of shared memory at HD = 256, and the flash kernels up to 98 KB:
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
    int major = 0, minor = 0;
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    att_wgmma_ok = false;
    if (major == 9 && minor == 0) {   // does this build hold the sm_90a code? (-arch=sm_90 or sm_80 would not)
        int *d = NULL, built = 0;
        cudaCheck(cudaMalloc(&d, sizeof(int)));
        attention_wgmma_probe_kernel<<<1, 1>>>(d);
        launchCheck();
        cudaCheck(cudaMemcpy(&built, d, sizeof(int), cudaMemcpyDeviceToHost));
        cudaCheck(cudaFree(d));
        att_wgmma_ok = built == 1;
    }
    if (attention_use_flash(HD)) {
        if (HD == 64) { Flash<64>::setup(); }
        else { Flash<128>::setup(); }
    }
#endif
}
