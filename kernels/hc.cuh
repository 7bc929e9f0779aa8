// Hyper-connections (SPEC section 8): the n residual streams of hc mode, on the GPU, with the
// pre-norm of each sublayer (u_j = rmsnorm(h_j; g_j)) fused in.
//
// The op, per position (N = B*T positions, width C, n streams; sublayer j, norm weight g = g_j):
//   forward   X_{j+1,r} = sum_s A_j[r,s] X_{j,s} + beta_j[r] o_j      (the update of sublayer j)
//             h_{j+1}   = sum_r w_{j+1}[r] X_{j+1,r}                   (the read of sublayer j+1)
//             u_{j+1}   = h_{j+1} s g, s = 1 / sqrt(mean(h_{j+1}^2) + 1e-6)  (its pre-norm; rstd = s)
//   backward  dh_j      = s du_j g - s^3 / C (sum_c du_j g h_j) h_j        (the norm of j, given du_j)
//             dX_j      = dXp_j + w_j dh_j                             (the read of j; dXp_j = A_j^T dX_{j+1})
//             dXp_{j-1} = A_{j-1}^T dX_j,  do_{j-1} = beta_{j-1} . dX_j  (the update of j-1)
//             dg_j += du_j h_j s,  dw_j += dh_j . X_j,  dA_{j-1} += dX_j X_{j-1}^T,
//             dbeta_{j-1} += dX_j . o_{j-1}                              (sums over positions)
// Shapes: streams X (N, n, C) floatX (a position's n streams adjacent); o, u (N, C) floatX;
// rstd (N) fp32 (std's layout: the trainer's ln_rstd row of the site); stream gradients dXp
// (N, n, C) (an accumulator across sublayers: fp32 arithmetic, stored in fp32 or, in the bf16
// build, 24 bits a value: HcGrad below); du (N, C) fp32 (the sublayer's input gradient from its
// matmul backwards); the sublayer's dout (N, C) floatX;
// A (n, n), beta (n), w (n) fp32 on the device (hc_prepare makes them from the parameters once
// per forward); g (C) floatX, the norm weight, and its gradient dg (C) fp32.
// h is never stored: the forward keeps it in registers between its sum of squares and u, and
// the backward recomputes it, in the same fp32 order, from X_j. Nor does the backward read X_j:
// it recomputes X_j = A_{j-1} X_{j-1} + beta_{j-1} o_{j-1} (hc_update_at, the forward's order
// and rounding, so the same bits) from the two tensors it reads anyway for the update's
// backward. The last streams X_{2L} are therefore never read, and the forward need not write them.
// The final read h_final = mean of the streams is the forward with w = 1/n (its norm: lnfw);
// its backward is the backward with dXp = NULL (zero) and w = 1/n. The first read (X_0 = n
// copies of the embedding) needs no stream buffer: h_0 = sum_r w_0[r] wte[token], read from
// the embedding row (xb = 1); the backward of sublayer 0's read, with Xprev = NULL, adds
// sum_r dX_0 into the embedding's fp32 gradient instead of an update's.
//
// The kernel's idea: the update of sublayer j, the read of sublayer j+1 and its norm touch the
// same n streams, so one pass does them all (forward), and the norm's and the read's backward
// of j and the update's backward of j-1 likewise (backward). The forward has one warp per
// position, the backward a pair of warps, each with half the row; lane l holds the 16-byte
// packs of 8 channels l, l + 32, ... of its warp's channels (NPK of them, a template
// parameter: 1, 2, 4 or 8, so C <= 2048), n a template parameter (1, 2, 4, 8) so the n x n mix
// stays in registers. The row of h (and in the backward du g) stays in registers across the
// row's sum (the norm's mean square, or sum_c du g h). Bytes per position per sublayer (bf16 streams,
// n = 4, C = 512): forward reads X and o, writes X' and u (and rstd): (2n + 2) 2C = 10 KiB;
// backward reads dXp (4nC), du (4C), X_{j-1} (2nC), o_{j-1} (2C) and writes dXp (4nC) and
// dout (2C): (10n + 8) C = 24 KiB (28 when it read X_j too: lab v3; pass 2's second reads of
// X_{j-1} and o_{j-1} come from L1 or L2), or with dXp in 24 bits (3nC each way) (8n + 8) C =
// 20 KiB. The parameter gradients are summed deterministically: positions are cut into fixed
// parts (hc_rows_per_part), a block sums its part in a fixed order into a partial of n + n^2 +
// n floats (dw, dA, dbeta) and one of C floats (dg, as std's norm backward). After the
// backward's last site, one launch of hc_reduce_sites_kernel adds the partials of every column
// of every site in a fixed order (std's rmsnorm_dw_reduce_kernel's scheme) and turns dw into
// dalpha (the softmax's backward).
// Lab: dev/cuda/hc.cu v16 (the forward: v15, v3 at 24 warps an SM, its bf16 roundings in pairs)
// and v17 (the backward: v16's, whose inputs a lane stages in shared memory one position ahead
// where it holds one pack; v16: v12, dXp in 24 bits packed by byte permutes, with its bf16
// roundings in pairs and fewer loads; v9 is v12 with dXp in fp32; v1 there: one thread per
// element, unfused; v2: the fused streams with the norm outside, h stored; v3: X_j read, not
// recomputed; v5: a warp a position; v8: v5 with the 24 bits; v10: v12 packed with shifts and
// masks).
//
// Include after: floatX, toF/fromF, warp_sum, ceil_div, cudaCheck, launchCheck (the trainer's and
// the labs' helpers).
#pragma once

#define HC_MAX_N 8           // streams supported by the fused kernels (template cases 1, 2, 4, 8)
#define HC_WARPS 4           // warps (positions in flight) per block of the forward
#define HC_FWD_MINB 6        // the forward's blocks an SM where its registers allow (hc_fwd_min_blocks)
#define HC_PARTS_MAX 1024    // at most this many partials per parameter sum

// positions per partial: at least 32, at most HC_PARTS_MAX partials; fixed by N alone
static inline int hc_rows_per_part(size_t N) {
    size_t r = (N + HC_PARTS_MAX - 1) / HC_PARTS_MAX;
    return (int)(r < 32 ? 32 : r);
}

// 8 channels of floatX or float, as one or two 16-byte loads
struct __align__(16) HcPackX { floatX x[8]; };
struct __align__(16) HcPackF { float x[8]; };
// 2 channels of floatX: the norm weight g is read in pairs (a parameter tensor starts at an even
// element offset: config.h's sizes are multiples of C, a multiple of 8 here, or 2 L HD together)
struct alignas(2 * sizeof(floatX)) HcPair { floatX x[2]; };
__device__ inline void hc_load_g8(float gf[8], const floatX *g) {
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
        HcPair v = *reinterpret_cast<const HcPair *>(g + k);
        gf[k] = toF(v.x[0]); gf[k + 1] = toF(v.x[1]);
    }
}

// a and b rounded to floatX (ya, yb) and back to fp32 (in place), the two in one conversion where
// floatX is bf16 (cvt.rn.bf16x2.f32: the bits of two __float2bfloat16 roundings)
__device__ __forceinline__ void hc_round2(float &a, float &b, floatX &ya, floatX &yb) {
    if constexpr (sizeof(floatX) == 2) {
        const __nv_bfloat162 t = __floats2bfloat162_rn(a, b);
        ya = t.x;
        yb = t.y;
        a = __low2float(t);
        b = __high2float(t);
    } else {
        ya = fromF<floatX>(a);
        yb = fromF<floatX>(b);
    }
}
__device__ __forceinline__ void hc_round2(float &a, float &b) {
    floatX ya, yb;
    hc_round2(a, b, ya, yb);
}

// X'_r = beta[r] o + sum_s A[r,s] X_s at channel k of a pack, in this fp32 order (one product,
// then fused multiply-adds in s order): the forward stores it rounded to floatX, and the backward
// recomputes the same bits from X and o instead of reading X' back.
template <int NS>
__device__ __forceinline__ float hc_update_at(const float (&ar)[NS], float br, const float (&x)[NS][8], float ov,
                                              int k) {
    float v = br * ov;
#pragma unroll
    for (int s = 0; s < NS; s++) { v = __fmaf_rn(ar[s], x[s][k], v); }
    return v;
}

// The forward's __launch_bounds__ minimum of blocks an SM: MINB where ptxas fits its 65536 /
// (32 WARPS MINB) registers without spills and the kernel would take more (bf16 streams, n = 4,
// npk = 2: the 100M shape, 112 registers unbounded; n = 2, npk = 4), else 1 (the registers
// decide; the fp32 build's norm weight takes twice the registers and would spill).
constexpr int hc_fwd_min_blocks(int ns, int npk, int minb) {
    return sizeof(floatX) == 2 && ((ns == 4 && npk == 2) || (ns == 2 && npk == 4)) ? minb : 1;
}

// Forward: Xn = A X + beta o (rounded to floatX), h = sum_r w[r] Xn_r in fp32 (from the rounded
// Xn, in the order the backward recomputes it), then u = h s g (floatX) and rstd = s, s = 1 /
// sqrt(mean(h^2) + 1e-6) as std's norm (rmsnorm.cuh). o = NULL: no update, Xn = X is not
// written (the read and its norm alone). xb = 1: X is (N, C), the n equal streams X_0 =
// wte[token] (never stored as n copies). Lane l: packs l + 32 q (q < NPK) of 8 channels.
// WARPS a block, MINB blocks an SM (hc_fwd_min_blocks): the trainer's are HC_WARPS and
// HC_FWD_MINB, 24 warps an SM at the 100M shape (80 registers); the lab times others.
template <int NS, int NPK, int WARPS = HC_WARPS, int MINB = HC_FWD_MINB>
__global__ void __launch_bounds__(32 * WARPS, hc_fwd_min_blocks(NS, NPK, MINB))
hc_update_read_norm_kernel(floatX *Xn, floatX *u, float *rstd, const floatX *X, const floatX *o, const float *A,
                           const float *beta, const float *w, const floatX *g, size_t N, int C, int xb) {
    const size_t p = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (p >= N) { return; }
    float a[NS][NS], b[NS], wr[NS];
#pragma unroll
    for (int r = 0; r < NS; r++) {
        b[r] = o ? beta[r] : 0.0f;
        wr[r] = w[r];
#pragma unroll
        for (int s = 0; s < NS; s++) { a[r][s] = o ? A[r * NS + s] : (r == s ? 1.0f : 0.0f); }
    }
    float hv[NPK][8], ss = 0.0f;
#pragma unroll
    for (int q = 0; q < NPK; q++) {
        const int c0 = (lane + 32 * q) * 8;
#pragma unroll
        for (int k = 0; k < 8; k++) { hv[q][k] = 0.0f; }
        if (c0 >= C) { continue; }
        float x[NS][8], ov[8];
#pragma unroll
        for (int s = 0; s < NS; s++) {
            HcPackX v = *reinterpret_cast<const HcPackX *>(X + (xb ? p * C : (p * NS + s) * C) + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) { x[s][k] = toF(v.x[k]); }
        }
        if (o) {
            HcPackX v = *reinterpret_cast<const HcPackX *>(o + p * C + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) { ov[k] = toF(v.x[k]); }
        }
#pragma unroll
        for (int r = 0; r < NS; r++) {   // X'_r = sum_s A[r,s] X_s + beta[r] o;  h += w[r] X'_r
            HcPackX y;
            float v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) { v[k] = o ? hc_update_at<NS>(a[r], b[r], x, ov[k], k) : x[r][k]; }
#pragma unroll
            for (int k = 0; k < 8; k += 2) { hc_round2(v[k], v[k + 1], y.x[k], y.x[k + 1]); }
#pragma unroll
            for (int k = 0; k < 8; k++) { hv[q][k] += wr[r] * v[k]; }
            if (o && Xn) { *reinterpret_cast<HcPackX *>(Xn + (p * NS + r) * C + c0) = y; }
        }
#pragma unroll
        for (int k = 0; k < 8; k++) { ss += hv[q][k] * hv[q][k]; }
    }
    // the norm weight at this lane's channels: loaded before the row's sum (its latency under the
    // sum) where the registers hold it (NPK <= 2), else pack by pack after it
    HcPair gp[NPK][4];
    auto load_g = [&](int q) {
        const int c0 = (lane + 32 * q) * 8;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            gp[q][k] = c0 < C ? *reinterpret_cast<const HcPair *>(g + c0 + 2 * k) : HcPair{};
        }
    };
    if constexpr (NPK <= 2) {
#pragma unroll
        for (int q = 0; q < NPK; q++) { load_g(q); }
    }
    ss = warp_sum(ss);   // u = rmsnorm(h; g)
    const float s = 1.0f / sqrtf(ss / C + 1e-6f);
    if (lane == 0) { rstd[p] = s; }
#pragma unroll
    for (int q = 0; q < NPK; q++) {
        const int c0 = (lane + 32 * q) * 8;
        if (c0 >= C) { continue; }
        if constexpr (NPK > 2) { load_g(q); }
        HcPackX up;
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
            float t0 = hv[q][k] * s * toF(gp[q][k / 2].x[0]), t1 = hv[q][k + 1] * s * toF(gp[q][k / 2].x[1]);
            hc_round2(t0, t1, up.x[k], up.x[k + 1]);
        }
        *reinterpret_cast<HcPackX *>(u + p * C + c0) = up;
    }
}

// The stream gradient dXp (N, n, C) as the backward stores it between sites: fp32 (HcGradF32), or
// 24 bits a value (HcGrad24: the fp32 value rounded to nearest even at bit 8, its top 16 bits in
// hi (a bf16) and the next 8 in lo; relative rounding error at most 2^-17 a store, against
// bf16's 2^-9). The arithmetic is fp32 either way. The 24 bits cut the backward's DRAM bytes
// from (10n + 8) C to (8n + 8) C a position (24 to 20 KiB at n = 4, C = 512); the bf16 build
// stores them (HcGrad below), the fp32 build fp32. NULL pointers: no tensor (zero).
// bytes: a value's; of(buf, count): the view of a buffer of count values (count a multiple of 8)
struct HcGradF32 {
    float *v;
    static constexpr size_t bytes = 4;
    static HcGradF32 of(void *buf, size_t) { return {(float *)buf}; }
};
struct HcGrad24 {
    uint16_t *hi;
    uint8_t *lo;
    static constexpr size_t bytes = 3;
    static HcGrad24 of(void *buf, size_t count) { return {(uint16_t *)buf, (uint8_t *)buf + 2 * count}; }
};
__host__ __device__ inline bool hc_grad_null(HcGradF32 g) { return g.v == NULL; }
__host__ __device__ inline bool hc_grad_null(HcGrad24 g) { return g.hi == NULL; }
// 8 values at element i (a multiple of 8)
__device__ __forceinline__ void hc_grad_load8(float v[8], HcGradF32 g, size_t i) {
    const HcPackF t = *reinterpret_cast<const HcPackF *>(g.v + i);
#pragma unroll
    for (int k = 0; k < 8; k++) { v[k] = t.x[k]; }
}
__device__ __forceinline__ void hc_grad_store8(HcGradF32 g, size_t i, const float v[8]) {
    HcPackF t;
#pragma unroll
    for (int k = 0; k < 8; k++) { t.x[k] = v[k]; }
    *reinterpret_cast<HcPackF *>(g.v + i) = t;
}
// 8 values from their hi (16 bytes) and lo (8 bytes) words, by byte permutes (PRMT) alone: z[m]
// holds low bytes 2m and 2m + 1 at its bytes 1 and 3, zeros at 0 and 2, and each value takes
// two bytes of hi and two of z: 1.5 instructions a value
__device__ __forceinline__ void hc_grad24_unpack8(float v[8], uint4 hv, uint2 lv) {
    const uint32_t hw[4] = {hv.x, hv.y, hv.z, hv.w};
    const uint32_t z[4] = {__byte_perm(lv.x, 0u, 0x1404), __byte_perm(lv.x, 0u, 0x3424),
                           __byte_perm(lv.y, 0u, 0x1404), __byte_perm(lv.y, 0u, 0x3424)};
#pragma unroll
    for (int m = 0; m < 4; m++) {
        v[2 * m] = __uint_as_float(__byte_perm(hw[m], z[m], 0x1054));       // hi half 0, z byte 1
        v[2 * m + 1] = __uint_as_float(__byte_perm(hw[m], z[m], 0x3276));   // hi half 1, z byte 3
    }
}
// 8 values at element i: one 16-byte and one 8-byte load
__device__ __forceinline__ void hc_grad_load8(float v[8], HcGrad24 g, size_t i) {
    hc_grad24_unpack8(v, *reinterpret_cast<const uint4 *>(g.hi + i), *reinterpret_cast<const uint2 *>(g.lo + i));
}
// fp32 -> its bits rounded to nearest even at bit 8, in place (the top 24 bits are the stored value;
// the low 8 are dropped by the packing); infinities and NaNs are truncated, so a NaN stays a NaN
__device__ __forceinline__ uint32_t hc_grad24_round_hi(float x) {
    const uint32_t u = __float_as_uint(x);
    return fabsf(x) < __uint_as_float(0x7F800000u) ? u + 0x7Fu + ((u >> 8) & 1u) : u;
}
// 8 values rounded, their top 16 bits (bytes 2, 3) to hi and their byte 1 to lo, by byte permutes
__device__ __forceinline__ void hc_grad_store8(HcGrad24 g, size_t i, const float v[8]) {
    uint32_t r[8];
#pragma unroll
    for (int k = 0; k < 8; k++) { r[k] = hc_grad24_round_hi(v[k]); }
    const uint4 hv = make_uint4(__byte_perm(r[0], r[1], 0x7632), __byte_perm(r[2], r[3], 0x7632),
                                __byte_perm(r[4], r[5], 0x7632), __byte_perm(r[6], r[7], 0x7632));
    const uint2 lv = make_uint2(__byte_perm(__byte_perm(r[0], r[1], 0x51), __byte_perm(r[2], r[3], 0x51), 0x5410),
                                __byte_perm(__byte_perm(r[4], r[5], 0x51), __byte_perm(r[6], r[7], 0x51), 0x5410));
    *reinterpret_cast<uint4 *>(g.hi + i) = hv;
    *reinterpret_cast<uint2 *>(g.lo + i) = lv;
}
// the trainer's storage: 24 bits where the activations are bf16
typedef std::conditional<sizeof(floatX) == 2, HcGrad24, HcGradF32>::type HcGrad;

// The backward's stages (STAGE in the kernel: one pack a lane, the 24-bit dXp, the bf16 build at
// C <= 512): a lane copies its position's inputs into shared memory with cp.async one position
// ahead of the one it computes, so that their DRAM latency hides under a whole position's work
// instead of stalling both passes. A warp's stage, in rows of its 32 lanes: NS rows of 16-byte
// packs of the streams read (Xprev; X at site 0), one of o, two of du (fp32, 8 channels), NS of
// dXp's hi words (16 bytes), then NS rows of its lo words (8 bytes a lane). Each lane reads back
// only what it copied itself, so cp.async.wait_group alone orders the two (no barrier).
template <int NS> __host__ __device__ constexpr int hc_stage_bytes() { return 32 * (16 * (2 * NS + 3) + 8 * NS); }
template <int NPK, typename G> __host__ __device__ constexpr bool hc_bwd_staged() {
    return NPK == 1 && std::is_same<G, HcGrad24>::value;
}
__device__ __forceinline__ void hc_cp_async(void *smem, const void *gmem, std::integral_constant<int, 16>) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                 "l"(gmem) : "memory");
}
__device__ __forceinline__ void hc_cp_async(void *smem, const void *gmem, std::integral_constant<int, 8>) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                 "l"(gmem) : "memory");
}
// this lane's slot in a stage b: of 16-byte row i, and of the 8-byte row r of dXp's lo words
template <typename B> __device__ __forceinline__ B *hc_slot16(B *b, int i, int lane) {
    return b + (32 * i + lane) * 16;
}
template <int NS, typename B> __device__ __forceinline__ B *hc_slot_lo(B *b, int r, int lane) {
    return b + 512 * (2 * NS + 3) + (32 * r + lane) * 8;
}
// position p's inputs at channels c0 .. c0 + 7 into stage b (this lane's slots; asynchronous)
template <int NS>
__device__ __forceinline__ void hc_stage_position(unsigned char *b, int lane, size_t p, int C, int c0,
                                                  const floatX *Xs, int xsb, const floatX *o, const float *du,
                                                  HcGrad24 dXp) {
    using B16 = std::integral_constant<int, 16>;
#pragma unroll
    for (int s = 0; s < NS; s++) {
        hc_cp_async(hc_slot16(b, s, lane), Xs + (xsb ? p * C : (p * NS + s) * C) + c0, B16());
    }
    if (o) { hc_cp_async(hc_slot16(b, NS, lane), o + p * C + c0, B16()); }
    hc_cp_async(hc_slot16(b, NS + 1, lane), du + p * C + c0, B16());
    hc_cp_async(hc_slot16(b, NS + 2, lane), du + p * C + c0 + 4, B16());
    if (dXp.hi) {
#pragma unroll
        for (int r = 0; r < NS; r++) {
            hc_cp_async(hc_slot16(b, NS + 3 + r, lane), dXp.hi + (p * NS + r) * C + c0, B16());
            hc_cp_async(hc_slot_lo<NS>(b, r, lane), dXp.lo + (p * NS + r) * C + c0, std::integral_constant<int, 8>());
        }
    }
}
// this lane's slot of row i of a stage, as a T
template <typename T> __device__ __forceinline__ const T &hc_stage_at(const unsigned char *b, int i, int lane) {
    return *reinterpret_cast<const T *>(hc_slot16(b, i, lane));
}

// Backward of the norm and the read of sublayer j and of the update of sublayer j-1 (top of
// file), given du = dL/du_j (N, C) fp32 and rstd (N) of the forward. dXp (N, n, C), stored as G
// (HcGradF32 or HcGrad24): in, A_j^T dX_{j+1} (NULL: zero, the final site); out, A_{j-1}^T dX_j
// (in place).
// h_j = sum_r w[r] X_j,r is recomputed from X_j, itself recomputed from Xprev and o (the
// forward's bits); X is read only at site 0 (Xprev = NULL; xb = 1: X is (N, C), the n equal
// streams X_0). Xprev = NULL: sublayer 0, dx0 (N, C) fp32 += sum_r dX_0 (the embedding's
// gradient, the trainer's fp32 dslot 0 that encoder_backward reads); dout, dXp_out not written.
// xpb = 1: Xprev is (N, C), the n equal streams X_0 (the update of sublayer 0).
// A pair of warps per position (warps 2i and 2i + 1 of the block), each holding half of its
// channels: half 0 the first C0 = 8 ceil(C / 16), half 1 the rest; lane l of half hf the
// packs of 8 channels at hf C0 + 8 (l + 32 q), q < NPK = ceil(C0 / 256). Blocks of 4 warps,
// 4 blocks an SM (16 warps; below). Across its positions a lane keeps in registers the
// parameter sums, A, beta and w, and where it holds one pack (C <= 512: KEEP in the kernel) also
// the norm weight g at its channels (loaded once) and its share of dg; across the pair's
// barrier, h, du g (and with KEEP o). The row's sum sum_c du g h (for the norm's
// k3) is the two halves' warp sums, added in half order: each warp's lane 0 writes its half
// into xch[parity][pair][hf], the pair meets at a named barrier (id 1 + pair, 64 threads), and
// both add the two. xch alternates with the position's parity: the pair's next write to an
// entry follows its next barrier, which the partner reaches only after reading this one.
// partial (gridDim.x, 2n + n^2): this block's share of dw_j (n), dA_{j-1} (n, n), dbeta_{j-1} (n);
// gpart (gridDim.x, C): its share of the norm weight's gradient dg_j. Each lane sums its terms
// over its pair's positions in order; then the lanes (fixed butterfly) and the warps (in order).
// dw_j[r] = dh . X_r with dh = s du g - k3 h is summed as s (du g . X_r) - k3 (h . X_r) (k3 =
// s^3 / C sum_c du g h), both dot products from the first pass over the row.
// Dynamic shared memory: HC_BWD_WARPS x 256 NPK floats, each warp's share of dg (with KEEP written
// at the end, else added at every position), channel hf C0 + 8 (lane + 32 q) + k at (8 q + k) 32 +
// lane (a lane's words in distinct banks); with STAGE, under them, each warp's two stages
// (hc_stage_bytes: 6.5 KiB a stage at n = 4, 52 KiB a block, 4 blocks in an SM's 228 KiB).
// Blocks an SM: __launch_bounds__ asks for 4 (128 registers: 127 at n = 4, C = 512, the 100M
// shape, no spills) up to n npk = 8, else 2. The barrier id in a register makes ptxas reserve
// all 16 of a block's barriers, so the SM runs at most 4 blocks, 16 warps, whatever the
// registers allow: with the ids as immediates (3 barriers, 5 blocks, 20 warps) this kernel was
// slower on the H200 (lab NOTES_hc.md, "v9").
#define HC_BWD_WARPS 4   // warps per block of the backward: two positions in flight, a pair each
// channels of half 0 of a row of C (the larger half: 8 ceil(C / 16), whole 16-byte packs)
__host__ __device__ constexpr int hc_bwd_half0(int C) { return 8 * ((C / 8 + 1) / 2); }
constexpr int hc_bwd_min_blocks(int ns, int npk) { return ns * npk <= 8 && ns <= 4 && npk <= 4 ? 4 : 2; }
template <int NS, int NPK, typename G>
__global__ void __launch_bounds__(32 * HC_BWD_WARPS, hc_bwd_min_blocks(NS, NPK))
hc_norm_read_update_backward_kernel(G dXp_out, floatX *dout, float *dx0, float *partial, float *gpart, G dXp_in,
                                    const float *du, const float *rstd, const floatX *g,
                                    const floatX *X, const float *w, const floatX *Xprev, const floatX *o,
                                    const float *A, const float *beta, size_t N, int C, int rows_per_part, int xb,
                                    int xpb) {
    constexpr int NP = 2 * NS + NS * NS, PAIRS = HC_BWD_WARPS / 2;
    extern __shared__ float hc_gsh[];   // (HC_BWD_WARPS, 256 NPK)
    __shared__ float red[HC_BWD_WARPS][NP];
    __shared__ float xch[2][PAIRS][2];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, pair = warp / 2, hf = warp % 2;
    const int C0 = hc_bwd_half0(C), cb = hf * C0, Ch = hf ? C - C0 : C0;   // this warp's channels [cb, cb + Ch)
    float *gsh = hc_gsh + (size_t)warp * 256 * NPK + lane;   // this lane's dg shares, stride 32
    // KEEP (one pack a lane, C <= 512): g, the lane's dg shares and o stay in registers; wider
    // rows would spill them, so there g is loaded and dg added in shared memory at every
    // position, and o is loaded again in pass 2
    constexpr bool KEEP = NPK == 1;
    // STAGE (hc_bwd_staged): the inputs come from this warp's two stages, position p's from stage
    // par (the parity below), copied during the position before; the stages take the dynamic
    // shared memory, and the dg shares are written over them at the end, after a block barrier
    constexpr bool STAGE = hc_bwd_staged<NPK, G>();
    constexpr int SB = hc_stage_bytes<NS>();
    unsigned char *stg = reinterpret_cast<unsigned char *>(hc_gsh) + (size_t)warp * 2 * SB;
    const floatX *Xs = Xprev ? Xprev : X;   // the streams read: X_{j-1}, or X_0 at site 0
    const int xsb = Xprev ? xpb : xb;
    const size_t p0 = (size_t)blockIdx.x * rows_per_part, p1 = p0 + rows_per_part < N ? p0 + rows_per_part : N;
    float s_next = 0.0f;   // STAGE: rstd of the next position, loaded a position ahead
    if constexpr (STAGE) {
        if (p0 + pair < p1 && lane * 8 < Ch) {
            hc_stage_position<NS>(stg, lane, p0 + pair, C, cb + lane * 8, Xs, xsb, o, du, dXp_in);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        if (p0 + pair < p1) { s_next = rstd[p0 + pair]; }
    }
    float a[NS][NS], b[NS], wr[NS], acc[NP], gf[NPK][8], dg[NPK][8];
#pragma unroll
    for (int r = 0; r < NS; r++) {
        b[r] = Xprev ? beta[r] : 1.0f;
        wr[r] = w[r];
#pragma unroll
        for (int s = 0; s < NS; s++) { a[r][s] = Xprev ? A[r * NS + s] : 0.0f; }
    }
#pragma unroll
    for (int i = 0; i < NP; i++) { acc[i] = 0.0f; }
    if constexpr (KEEP) {
#pragma unroll
        for (int q = 0; q < NPK; q++) {   // the norm weight at this lane's channels (the same at every position)
            const int lc = (lane + 32 * q) * 8;
#pragma unroll
            for (int k = 0; k < 8; k++) { gf[q][k] = 0.0f; dg[q][k] = 0.0f; }
            if (lc < Ch) { hc_load_g8(gf[q], g + cb + lc); }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8 * NPK; i++) { gsh[32 * i] = 0.0f; }
    }
    int par = 0;
    for (size_t p = p0 + pair; p < p1; p += PAIRS, par ^= 1) {
        float s;
        const unsigned char *cur = stg + par * SB;   // STAGE: position p's inputs
        if constexpr (STAGE) {   // the next position's into the other stage, then wait for this one's
            s = s_next;
            if (p + PAIRS < p1) {
                if (lane * 8 < Ch) {
                    hc_stage_position<NS>(stg + (par ^ 1) * SB, lane, p + PAIRS, C, cb + lane * 8, Xs, xsb, o, du,
                                          dXp_in);
                }
                s_next = rstd[p + PAIRS];
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        } else {
            s = rstd[p];
        }
        // pass 1: h = sum_r w[r] X_r (the forward's order), dug = du g, and the half row's sums
        float h[NPK][8], dug[NPK][8], ov[NPK][8], gwx = 0.0f, P[NS], Q[NS];
#pragma unroll
        for (int r = 0; r < NS; r++) { P[r] = 0.0f; Q[r] = 0.0f; }
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int lc = (lane + 32 * q) * 8, c0 = cb + lc;
#pragma unroll
            for (int k = 0; k < 8; k++) { h[q][k] = 0.0f; dug[q][k] = 0.0f; }
            if (lc >= Ch) { continue; }
            float x[NS][8];
            if (Xprev) {   // X_j = A_{j-1} X_{j-1} + beta_{j-1} o_{j-1}, the forward's bits (pass 2 reads Xprev again)
                float xp[NS][8];
#pragma unroll
                for (int s2 = 0; s2 < NS; s2++) {
                    const size_t i = (xpb ? p * C : (p * NS + s2) * C) + c0;
                    HcPackX v = STAGE ? hc_stage_at<HcPackX>(cur, s2, lane)
                                      : *reinterpret_cast<const HcPackX *>(Xprev + i);
#pragma unroll
                    for (int k = 0; k < 8; k++) { xp[s2][k] = toF(v.x[k]); }
                }
                HcPackX v = STAGE ? hc_stage_at<HcPackX>(cur, NS, lane)
                                  : *reinterpret_cast<const HcPackX *>(o + p * C + c0);
#pragma unroll
                for (int k = 0; k < 8; k++) { ov[q][k] = toF(v.x[k]); }
#pragma unroll
                for (int r = 0; r < NS; r++) {
#pragma unroll
                    for (int k = 0; k < 8; k += 2) {
                        x[r][k] = hc_update_at<NS>(a[r], b[r], xp, ov[q][k], k);
                        x[r][k + 1] = hc_update_at<NS>(a[r], b[r], xp, ov[q][k + 1], k + 1);
                        hc_round2(x[r][k], x[r][k + 1]);
                    }
                }
            } else {   // site 0: X_0, the n equal streams of the embedding (xb), or stored streams
#pragma unroll
                for (int r = 0; r < NS; r++) {
                    HcPackX v = STAGE ? hc_stage_at<HcPackX>(cur, r, lane)
                                      : *reinterpret_cast<const HcPackX *>(X + (xb ? p * C : (p * NS + r) * C) + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { x[r][k] = toF(v.x[k]); }
                }
            }
#pragma unroll
            for (int r = 0; r < NS; r++) {
#pragma unroll
                for (int k = 0; k < 8; k++) { h[q][k] += wr[r] * x[r][k]; }
            }
            HcPackF d0;
            if constexpr (STAGE) {
                const float4 d1 = hc_stage_at<float4>(cur, NS + 1, lane), d2 = hc_stage_at<float4>(cur, NS + 2, lane);
                d0 = {{d1.x, d1.y, d1.z, d1.w, d2.x, d2.y, d2.z, d2.w}};
            } else {
                d0 = *reinterpret_cast<const HcPackF *>(du + p * C + c0);
            }
            if constexpr (!KEEP) { hc_load_g8(gf[q], g + c0); }
#pragma unroll
            for (int k = 0; k < 8; k++) {   // dg_j += du h s (std's order);  sum_c du g h;  du g . X_r, h . X_r
                dug[q][k] = d0.x[k] * gf[q][k];
                gwx += dug[q][k] * h[q][k];
                if constexpr (KEEP) { dg[q][k] += d0.x[k] * h[q][k] * s; }
                else { gsh[32 * (8 * q + k)] += d0.x[k] * h[q][k] * s; }
#pragma unroll
                for (int r = 0; r < NS; r++) { P[r] += dug[q][k] * x[r][k]; Q[r] += h[q][k] * x[r][k]; }
            }
        }
        gwx = warp_sum(gwx);   // this half's sum, then the pair's: half 0's + half 1's
        if (lane == 0) { xch[par][pair][hf] = gwx; }
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + pair), "r"(64) : "memory");
        gwx = xch[par][pair][0] + xch[par][pair][1];
        const float k3 = s * s * s / C * gwx;
#pragma unroll
        for (int r = 0; r < NS; r++) { acc[r] += s * P[r] - k3 * Q[r]; }   // dw[r] += dh . X_r
        // pass 2: dh, then the read's and the update's backward
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int lc = (lane + 32 * q) * 8, c0 = cb + lc;
            if (lc >= Ch) { continue; }
            float d[NS][8];
#pragma unroll
            for (int r = 0; r < NS; r++) {   // dX_j = dXp + w dh,  dh = s du g - k3 h
                float dv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                if constexpr (STAGE) {
                    if (!hc_grad_null(dXp_in)) {
                        const uint2 lv = *reinterpret_cast<const uint2 *>(hc_slot_lo<NS>(cur, r, lane));
                        hc_grad24_unpack8(dv, hc_stage_at<uint4>(cur, NS + 3 + r, lane), lv);
                    }
                } else if (!hc_grad_null(dXp_in)) {
                    hc_grad_load8(dv, dXp_in, (p * NS + r) * C + c0);
                }
#pragma unroll
                for (int k = 0; k < 8; k++) { d[r][k] = dv[k] + wr[r] * (s * dug[q][k] - k3 * h[q][k]); }
            }
            if (Xprev == NULL) {   // sublayer 0: the streams were copies of the embedding
                HcPackF e = *reinterpret_cast<const HcPackF *>(dx0 + p * C + c0);
#pragma unroll
                for (int k = 0; k < 8; k++) {
#pragma unroll
                    for (int r = 0; r < NS; r++) { e.x[k] += d[r][k]; }
                }
                *reinterpret_cast<HcPackF *>(dx0 + p * C + c0) = e;
                continue;
            }
            if constexpr (!KEEP) {
                HcPackX v = *reinterpret_cast<const HcPackX *>(o + p * C + c0);
#pragma unroll
                for (int k = 0; k < 8; k++) { ov[q][k] = toF(v.x[k]); }
            }
            HcPackX op;
#pragma unroll
            for (int k = 0; k < 8; k += 2) {   // do = sum_r beta[r] dX_r;  dbeta[r] += dX_r . o
                float t[2] = {0.0f, 0.0f};
#pragma unroll
                for (int k2 = 0; k2 < 2; k2++) {
#pragma unroll
                    for (int r = 0; r < NS; r++) {
                        t[k2] += b[r] * d[r][k + k2];
                        acc[NS + NS * NS + r] += d[r][k + k2] * ov[q][k + k2];
                    }
                }
                hc_round2(t[0], t[1], op.x[k], op.x[k + 1]);
            }
            *reinterpret_cast<HcPackX *>(dout + p * C + c0) = op;
#pragma unroll
            for (int s2 = 0; s2 < NS; s2++) {   // dXp_{j-1},s = sum_r A[r,s] dX_r;  dA[r,s] += dX_r . Xprev_s
                const size_t i = (xpb ? p * C : (p * NS + s2) * C) + c0;
                HcPackX xv = STAGE ? hc_stage_at<HcPackX>(cur, s2, lane)
                                   : *reinterpret_cast<const HcPackX *>(Xprev + i);
                float out[8];
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float xs = toF(xv.x[k]), v = 0.0f;
#pragma unroll
                    for (int r = 0; r < NS; r++) { v += a[r][s2] * d[r][k]; acc[NS + r * NS + s2] += d[r][k] * xs; }
                    out[k] = v;
                }
                hc_grad_store8(dXp_out, (p * NS + s2) * C + c0, out);
            }
        }
    }
    // the block's shares: the lanes' sums (fixed butterfly), then the warps in order
    if constexpr (STAGE) {   // every warp done with the stages before the dg shares overwrite them
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();
    }
    if constexpr (KEEP) {
#pragma unroll
        for (int i = 0; i < 8 * NPK; i++) { gsh[32 * i] = dg[i / 8][i % 8]; }
    }
#pragma unroll
    for (int i = 0; i < NP; i++) { acc[i] = warp_sum(acc[i]); }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NP; i++) { red[warp][i] = acc[i]; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NP; i += blockDim.x) {
        float t = 0.0f;
        for (int k = 0; k < HC_BWD_WARPS; k++) { t += red[k][i]; }
        partial[(size_t)blockIdx.x * NP + i] = t;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {   // channel c: half c >= C0, held by the warps of that half
        const int h2 = c >= C0, lc = c - h2 * C0, i = 32 * (8 * (lc / 256) + lc % 8) + lc / 8 % 32;
        float t = 0.0f;
        for (int k = h2; k < HC_BWD_WARPS; k += 2) { t += hc_gsh[(size_t)k * 256 * NPK + i]; }
        gpart[(size_t)blockIdx.x * C + c] = t;
    }
}

// Where one site's parameter sums go (each += when not NULL): dw (n), the norm weight's dg (C), and
// the update's dA (n, n) and dbeta (n) of the sublayer before it; dalpha (n) += the softmax's
// backward of this site's dw sums, which needs its read weights w (n).
struct HcSums { float *dw, *dalpha, *dA, *dbeta, *dg; const float *w; };
#define HC_SITES_MAX 64   // sites a launch of hc_reduce_sites_kernel (48 B each: 3 KiB of parameters)
struct HcSites { HcSums s[HC_SITES_MAX]; };

// The deterministic sums of hc_norm_read_update_backward's P block partials (std's scheme,
// rmsnorm_dw_reduce_kernel), for site blockIdx.y, whose partials start at part + blockIdx.y *
// stride: column i < NP = 2n + n^2 of the scalars (P, NP), then column NP + c of the norm's
// (P, C) after them. Block (32 columns) x (32 partial lanes): lane y sums partials y, y + 32,
// ... in order, then the 32 lane sums are added in lane order. Column i goes to dw[i] (i < n),
// dA[i - n] (i < n + n^2), dbeta, then dg. Block x = 0 holds the dw columns (n <= 8): with dalpha
// it also adds the softmax's backward dalpha[s] += w[s] (dw[s] - sum_t w[t] dw[t]) of this
// site's sums (the CPU's hc_weights_backward). Grid (ceil((NP + C) / 32), sites).
__global__ void __launch_bounds__(1024) hc_reduce_sites_kernel(HcSites sites, const float *part, size_t stride,
                                                               int P, int n, int C) {
    __shared__ float sh[32][33];
    const HcSums out = sites.s[blockIdx.y];   // this site's
    const float *partial = part + blockIdx.y * stride;
    const int NP = 2 * n + n * n, i = blockIdx.x * 32 + threadIdx.x;
    const float *col = NULL;
    size_t cstride = 0;
    if (i < NP) { col = partial + i; cstride = NP; }
    else if (i < NP + C) { col = partial + (size_t)P * NP + (i - NP); cstride = C; }
    float t = 0.0f;
    if (col) {
        for (int p = threadIdx.y; p < P; p += 32) { t += col[(size_t)p * cstride]; }
    }
    sh[threadIdx.y][threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.y == 0) {
        float sum = 0.0f;
        for (int y = 0; y < 32; y++) { sum += sh[y][threadIdx.x]; }
        sh[0][threadIdx.x] = sum;   // this column's total (row 0 is read by its own thread only above)
        if (i < n) { if (out.dw) { out.dw[i] += sum; } }
        else if (i < n + n * n) { if (out.dA) { out.dA[i - n] += sum; } }
        else if (i < NP) { if (out.dbeta) { out.dbeta[i - n - n * n] += sum; } }
        else if (i < NP + C) { if (out.dg) { out.dg[i - NP] += sum; } }
    }
    if (blockIdx.x == 0 && out.dalpha) {
        __syncthreads();
        if (threadIdx.x == 0 && threadIdx.y == 0) {
            float S = 0.0f;
            for (int r = 0; r < n; r++) { S += out.w[r] * sh[0][r]; }
            for (int r = 0; r < n; r++) { out.dalpha[r] += out.w[r] * (sh[0][r] - S); }
        }
    }
}

// Once per forward, from the model's parameters (floatX in the trainer, so any Tp): the fp32
// values the kernels read. w (2L+1, n): row j < 2L = softmax(alpha_j), row 2L = 1/n (the final
// mean); A32 (2L, n, n), beta32 (2L, n) = A, beta as fp32. One thread per sublayer row.
template <typename Tp>
__global__ void hc_prepare_kernel(float *w, float *A32, float *beta32, const Tp *alpha, const Tp *A, const Tp *beta,
                                  int J2, int n) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j > J2) { return; }
    float *wj = w + (size_t)j * n;
    if (j == J2) {
        for (int r = 0; r < n; r++) { wj[r] = 1.0f / n; }
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int r = 0; r < n; r++) { m = fmaxf(m, toF(alpha[(size_t)j * n + r])); }
    for (int r = 0; r < n; r++) { wj[r] = expf(toF(alpha[(size_t)j * n + r]) - m); s += wj[r]; }
    for (int r = 0; r < n; r++) { wj[r] /= s; beta32[(size_t)j * n + r] = toF(beta[(size_t)j * n + r]); }
    for (int i = 0; i < n * n; i++) { A32[(size_t)j * n * n + i] = toF(A[(size_t)j * n * n + i]); }
}

// ---------------------------------------------------------------------------
// Host launchers (device pointers; the default stream unless given). n must be 1, 2, 4 or 8
// and C a multiple of 8 with 16-byte aligned rows (C % 8 == 0 gives that for cudaMalloc'd buffers).

template <typename F> static void hc_dispatch(int n, F f) {
    if (n == 1) { f(std::integral_constant<int, 1>()); }
    else if (n == 2) { f(std::integral_constant<int, 2>()); }
    else if (n == 4) { f(std::integral_constant<int, 4>()); }
    else if (n == 8) { f(std::integral_constant<int, 8>()); }
    else { fprintf(stderr, "error: hc kernels take n = 1, 2, 4 or 8 streams, not %d\n", n); exit(1); }
}

// Calls f(integral_constant NPK) with NPK = the 8-channel packs per lane, cw / 256 rounded up to
// 1, 2, 4 or 8, for a warp holding cw channels of a row (the forward: the whole row, cw = C;
// the backward: half of it); dies when C is not a multiple of 8 or is over 2048, or when the
// norm weight g is not aligned for hc_load_g8.
template <typename F> static void hc_pack_dispatch(int C, int cw, const floatX *g, F f) {
    if ((uintptr_t)g % (2 * sizeof(floatX)) != 0) {
        fprintf(stderr, "error: hc kernels read the norm weight in pairs; it is not %d-byte aligned\n",
                (int)(2 * sizeof(floatX)));
        exit(1);
    }
    if (C % 8 != 0 || C < 8 || C > 2048) {
        fprintf(stderr, "error: hc kernels need C a multiple of 8 from 8 to 2048, not %d\n", C);
        exit(1);
    }
    const int q = (int)ceil_div(cw, 256);
    if (q == 1) { f(std::integral_constant<int, 1>()); }
    else if (q == 2) { f(std::integral_constant<int, 2>()); }
    else if (q <= 4) { f(std::integral_constant<int, 4>()); }
    else { f(std::integral_constant<int, 8>()); }
}

// Forward at the boundary of sublayer j and j+1: Xn = A X + beta o, h = sum_r w[r] Xn_r,
// u = rmsnorm(h; g) (N, C) and its rstd (N). o = NULL: the read and norm alone (h = sum_r
// w[r] X_r; Xn unused). Xn = NULL with o: the streams are not written (X_{2L}, which no
// backward reads). xb = 1: X is the embedding (N, C), standing for the n equal streams
// X_0 (j = 0).
template <int WARPS = HC_WARPS, int MINB = HC_FWD_MINB>
static void hc_update_read_norm_forward(floatX *Xn, floatX *u, float *rstd, const floatX *X, const floatX *o,
                                        const float *A, const float *beta, const float *w, const floatX *g, size_t N,
                                        int C, int n, int xb = 0, cudaStream_t st = 0) {
    hc_dispatch(n, [&](auto ns) {
        hc_pack_dispatch(C, C, g, [&](auto npk) {
            hc_update_read_norm_kernel<decltype(ns)::value, decltype(npk)::value, WARPS, MINB>
                <<<ceil_div(N, WARPS), 32 * WARPS, 0, st>>>(Xn, u, rstd, X, o, A, beta, w, g, N, C, xb);
        });
    });
    launchCheck();
}

// floats of partial space hc_norm_read_update_backward needs for N positions, n streams, width C:
// (P, 2n + n^2) for dw, dA, dbeta, then (P, C) for the norm weight
static size_t hc_partial_floats(size_t N, int n, int C) {
    return (size_t)ceil_div(N, hc_rows_per_part(N)) * (2 * n + n * n + C);
}

// Backward of the norm and read of sublayer j and the update of sublayer j-1 (top of file),
// given du = dL/du_j and the forward's rstd. The parameter sums of the site (dw_j (n), dA_{j-1}
// (n, n), dbeta_{j-1} (n), dg_j (C)) are left as P block partials in partial
// (hc_partial_floats(N, n, C) floats), for hc_reduce_sites: one launch for all the sites of a
// backward, after the last, instead of one per site.
// dXp, stored as G (HcGradF32 or HcGrad24): in A_j^T dX_{j+1} (dXp_in NULL: zero), out A_{j-1}^T
// dX_j (dXp_out may equal dXp_in).
// X: read only at site 0 (Xprev = NULL): the streams X_0 (xb = 1: the embedding (N, C));
// elsewhere X_j is recomputed from Xprev and o, and X may be NULL.
// Xprev = NULL: sublayer 0; dx0 (N, C) fp32 += the embedding's gradient sum_r dX_0 (its
// streams are equal, so dalpha_0 is 0: reduce its sums with dw = dalpha = NULL; dout and
// dXp_out unused). Otherwise dx0 is unused (NULL). xpb = 1: Xprev is the embedding (N, C)
// standing for X_0 (j = 1).
template <typename G>
static void hc_norm_read_update_backward(G dXp_out, floatX *dout, float *dx0, float *partial, G dXp_in, const float *du,
                                         const float *rstd, const floatX *g, const floatX *X, const float *w,
                                         const floatX *Xprev, const floatX *o, const float *A, const float *beta,
                                         size_t N, int C, int n, int xb, int xpb, cudaStream_t st = 0) {
    const int rows = hc_rows_per_part(N), P = (int)ceil_div(N, rows), NP = 2 * n + n * n;
    float *gpart = partial + (size_t)P * NP;
    hc_dispatch(n, [&](auto ns) {
        hc_pack_dispatch(C, hc_bwd_half0(C), g, [&](auto npk) {   // NPK: the packs of half 0
            constexpr int NS_ = decltype(ns)::value, NPK_ = decltype(npk)::value;
            const size_t gsh = (size_t)HC_BWD_WARPS * 256 * NPK_ * sizeof(float);   // the dg shares
            const size_t stages = hc_bwd_staged<NPK_, G>() ? 2 * HC_BWD_WARPS * hc_stage_bytes<NS_>() : 0;
            const size_t smem = stages > gsh ? stages : gsh;   // the stages lie under the shares
            auto kernel = hc_norm_read_update_backward_kernel<NS_, NPK_, G>;
            if (smem > 48 * 1024) {
                cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               cudaSharedmemCarveoutMaxShared));
            }
            kernel<<<P, 32 * HC_BWD_WARPS, smem, st>>>(dXp_out, dout, dx0, partial, gpart, dXp_in, du, rstd, g, X, w,
                                                       Xprev, o, A, beta, N, C, rows, xb, xpb);
        });
    });
    launchCheck();
}

// The parameter sums of S sites from their partials (hc_norm_read_update_backward's, site s at
// part + s * stride, stride >= hc_partial_floats(N, n, C)): sums_of(s) (a host function of the
// site index) names where site s's go. One launch per HC_SITES_MAX sites; each column is summed
// in the same fixed order as a launch per site would.
template <typename F>
static void hc_reduce_sites(F sums_of, const float *part, size_t stride, int S, size_t N, int n, int C,
                            cudaStream_t st = 0) {
    const int P = (int)ceil_div(N, hc_rows_per_part(N)), NP = 2 * n + n * n;
    for (int s0 = 0; s0 < S; s0 += HC_SITES_MAX) {
        const int k = S - s0 < HC_SITES_MAX ? S - s0 : HC_SITES_MAX;
        HcSites t = {};
        for (int s = 0; s < k; s++) { t.s[s] = sums_of(s0 + s); }
        hc_reduce_sites_kernel<<<dim3(ceil_div(NP + C, 32), k), dim3(32, 32), 0, st>>>(t, part + s0 * stride, stride,
                                                                                       P, n, C);
        launchCheck();
    }
}

// w (2L+1, n), A32 (2L, n, n), beta32 (2L, n) fp32 from the parameters alpha, A, beta (2L = J2 sublayers)
template <typename Tp>
static void hc_prepare(float *w, float *A32, float *beta32, const Tp *alpha, const Tp *A, const Tp *beta, int J2,
                       int n, cudaStream_t st = 0) {
    hc_prepare_kernel<Tp><<<ceil_div(J2 + 1, 32), 32, 0, st>>>(w, A32, beta32, alpha, A, beta, J2, n);
    launchCheck();
}
