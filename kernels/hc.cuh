// Hyper-connections (SPEC section 8): the n residual streams of hc mode, on the GPU.
//
// The op, per position (N = B*T positions, width C, n streams; sublayer j):
//   forward   X_{j+1,r} = sum_s A_j[r,s] X_{j,s} + beta_j[r] o_j      (the update of sublayer j)
//             h_{j+1}   = sum_r w_{j+1}[r] X_{j+1,r}                   (the read of sublayer j+1)
//   backward  dX_j      = dXp_j + w_j dh_j                             (the read of j; dXp_j = A_j^T dX_{j+1})
//             dXp_{j-1} = A_{j-1}^T dX_j,  do_{j-1} = beta_{j-1} . dX_j  (the update of j-1)
//             dw_j += dh_j . X_j,  dA_{j-1} += dX_j X_{j-1}^T,  dbeta_{j-1} += dX_j . o_{j-1}  (sums over positions)
// Shapes: streams X (N, n, C) floatX (a position's n streams adjacent); o, h (N, C) floatX;
// stream gradients dXp (N, n, C) fp32 (an accumulator across sublayers, fp32 like std's dres);
// dh (N, C) fp32 (from the pre-norm's backward); the sublayer's dout (N, C) floatX; A (n, n),
// beta (n), w (n) fp32 on the device (hc_prepare makes them from the parameters once per forward).
// The final read h_final = mean of the streams is the forward with w = 1/n; its backward is
// the backward with dXp = NULL (zero) and w = 1/n. The first read (X_0 = n copies of the
// embedding) needs no stream buffer: h_0 = wte[token]; the backward of sublayer 0's read,
// with Xprev = NULL, adds sum_r dX_0 into the embedding's fp32 gradient instead of an update's.
//
// The kernel's idea: the update of sublayer j and the read of sublayer j+1 touch the same
// n streams, so one pass does both (forward), and the read's backward of j and the update's
// backward of j-1 likewise (backward). One warp per position, 16-byte packs of 8 channels per
// lane, n a template parameter (1, 2, 4, 8) so the n x n mix stays in registers. Bytes per
// position per sublayer (bf16 streams, n = 4, C = 512): forward reads X and o, writes X' and
// h: (2n + 2) 2C = 10 KiB; backward reads dXp (4nC), dh (4C), X_j (2nC), X_{j-1} (2nC),
// o_{j-1} (2C) and writes dXp (4nC) and dout (2C): (12n + 8) C = 28 KiB. The parameter
// gradients are summed deterministically: positions are cut into fixed parts (hc_rows_per_part),
// a block sums its part in a fixed order into a partial of n + n^2 + n floats, and
// hc_reduce_kernel adds the partials in part order.
// Lab: dev/cuda/hc.cu v2 (v1 there: one thread per element, unfused).
//
// Include after: floatX, toF/fromF, warp_sum, ceil_div, launchCheck (the trainer's and the labs' helpers).
#pragma once

#define HC_MAX_N 8           // streams supported by the fused kernels (template cases 1, 2, 4, 8)
#define HC_WARPS 8           // warps (positions in flight) per block
#define HC_PARTS_MAX 1024    // at most this many partials per parameter sum

// positions per partial: at least 32, at most HC_PARTS_MAX partials; fixed by N alone
static inline int hc_rows_per_part(size_t N) {
    size_t r = (N + HC_PARTS_MAX - 1) / HC_PARTS_MAX;
    return (int)(r < 32 ? 32 : r);
}

// 8 channels of floatX or float, as one or two 16-byte loads
struct __align__(16) HcPackX { floatX x[8]; };
struct __align__(16) HcPackF { float x[8]; };

// Forward: Xn = A X + beta o (rounded to floatX), h = sum_r w[r] Xn_r (from the rounded Xn, so
// the backward's recomputation agrees). o = NULL: no update, Xn = X is not written (the read alone).
// xb = 1: X is (N, C), the n equal streams X_0 = wte[token] (never stored as n copies).
template <int NS>
__global__ void hc_update_read_kernel(floatX *Xn, floatX *h, const floatX *X, const floatX *o, const float *A,
                                      const float *beta, const float *w, size_t N, int C, int xb) {
    const size_t p = (size_t)blockIdx.x * HC_WARPS + threadIdx.x / 32;
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
    for (int c0 = lane * 8; c0 < C; c0 += 32 * 8) {
        float x[NS][8], ov[8], hv[8];
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
        for (int k = 0; k < 8; k++) { hv[k] = 0.0f; }
#pragma unroll
        for (int r = 0; r < NS; r++) {
            HcPackX y;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float v = x[r][k];
                if (o) {
                    v = b[r] * ov[k];
#pragma unroll
                    for (int s = 0; s < NS; s++) { v += a[r][s] * x[s][k]; }
                }
                y.x[k] = fromF<floatX>(v);
                hv[k] += wr[r] * toF(y.x[k]);
            }
            if (o) { *reinterpret_cast<HcPackX *>(Xn + (p * NS + r) * C + c0) = y; }
        }
        HcPackX hp;
#pragma unroll
        for (int k = 0; k < 8; k++) { hp.x[k] = fromF<floatX>(hv[k]); }
        *reinterpret_cast<HcPackX *>(h + p * C + c0) = hp;
    }
}

// Backward of the read of sublayer j and the update of sublayer j-1 (top of file). dXp (N, n, C)
// fp32: in, A_j^T dX_{j+1} (NULL: zero, the final site); out, A_{j-1}^T dX_j (in place).
// Xprev = NULL: sublayer 0, dx0 (N, C) fp32 += sum_r dX_0 (the embedding's gradient, the
// trainer's fp32 dslot 0 that encoder_backward reads); nothing else written.
// partial (gridDim.x, 2n + n^2): this block's share of dw_j (n), dA_{j-1} (n, n), dbeta_{j-1} (n).
// X = NULL: sublayer 0's streams, all equal (its dw terms are then left 0: with equal streams
// every dw[r] is the same, and the softmax's backward of equal dw is exactly 0).
// xpb = 1: Xprev is (N, C), the n equal streams X_0 (the update of sublayer 0).
template <int NS>
__global__ void hc_read_update_backward_kernel(float *dXp_out, floatX *dout, float *dx0, float *partial,
                                               const float *dXp_in,
                                               const float *dh, const floatX *X, const float *w, const floatX *Xprev,
                                               const floatX *o, const float *A, const float *beta, size_t N, int C,
                                               int rows_per_part, int xpb) {
    constexpr int NP = 2 * NS + NS * NS;
    __shared__ float red[HC_WARPS][NP];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float a[NS][NS], b[NS], wr[NS], acc[NP];
#pragma unroll
    for (int r = 0; r < NS; r++) {
        b[r] = Xprev ? beta[r] : 1.0f;
        wr[r] = w[r];
#pragma unroll
        for (int s = 0; s < NS; s++) { a[r][s] = Xprev ? A[r * NS + s] : 0.0f; }
    }
#pragma unroll
    for (int i = 0; i < NP; i++) { acc[i] = 0.0f; }
    const size_t p0 = (size_t)blockIdx.x * rows_per_part, p1 = p0 + rows_per_part < N ? p0 + rows_per_part : N;
    for (size_t p = p0 + warp; p < p1; p += HC_WARPS) {
        float dw[NS], dA[NS][NS], db[NS];   // this position's terms, summed over the lane's channels
#pragma unroll
        for (int r = 0; r < NS; r++) {
            dw[r] = 0.0f; db[r] = 0.0f;
#pragma unroll
            for (int s = 0; s < NS; s++) { dA[r][s] = 0.0f; }
        }
        for (int c0 = lane * 8; c0 < C; c0 += 32 * 8) {
            float g[8], d[NS][8];
            HcPackF g0 = *reinterpret_cast<const HcPackF *>(dh + p * C + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) { g[k] = g0.x[k]; }
#pragma unroll
            for (int r = 0; r < NS; r++) {   // dX_j = dXp + w dh;  dw[r] += dh . X_j,r
                HcPackF dv;
                if (dXp_in) { dv = *reinterpret_cast<const HcPackF *>(dXp_in + (p * NS + r) * C + c0); }
#pragma unroll
                for (int k = 0; k < 8; k++) { d[r][k] = (dXp_in ? dv.x[k] : 0.0f) + wr[r] * g[k]; }
                if (X) {
                    HcPackX xv = *reinterpret_cast<const HcPackX *>(X + (p * NS + r) * C + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { dw[r] += g[k] * toF(xv.x[k]); }
                }
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
            HcPackX op;
            float ov[8];
            HcPackX o0 = *reinterpret_cast<const HcPackX *>(o + p * C + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) { ov[k] = toF(o0.x[k]); }
#pragma unroll
            for (int k = 0; k < 8; k++) {   // do = sum_r beta[r] dX_r;  dbeta[r] += dX_r . o
                float s = 0.0f;
#pragma unroll
                for (int r = 0; r < NS; r++) { s += b[r] * d[r][k]; db[r] += d[r][k] * ov[k]; }
                op.x[k] = fromF<floatX>(s);
            }
            *reinterpret_cast<HcPackX *>(dout + p * C + c0) = op;
#pragma unroll
            for (int s = 0; s < NS; s++) {   // dXp_{j-1},s = sum_r A[r,s] dX_r;  dA[r,s] += dX_r . Xprev_s
                HcPackX xv = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s) * C) + c0);
                HcPackF out;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float xs = toF(xv.x[k]), v = 0.0f;
#pragma unroll
                    for (int r = 0; r < NS; r++) { v += a[r][s] * d[r][k]; dA[r][s] += d[r][k] * xs; }
                    out.x[k] = v;
                }
                *reinterpret_cast<HcPackF *>(dXp_out + (p * NS + s) * C + c0) = out;
            }
        }
        // this position's sums over the warp (fixed butterfly), added to the warp's running sums in order
#pragma unroll
        for (int r = 0; r < NS; r++) {
            acc[r] += warp_sum(dw[r]);
            acc[NS + NS * NS + r] += warp_sum(db[r]);
#pragma unroll
            for (int s = 0; s < NS; s++) { acc[NS + r * NS + s] += warp_sum(dA[r][s]); }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NP; i++) { red[warp][i] = acc[i]; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NP; i += blockDim.x) {   // the warps in order
        float s = 0.0f;
        for (int k = 0; k < HC_WARPS; k++) { s += red[k][i]; }
        partial[(size_t)blockIdx.x * NP + i] = s;
    }
}

// grads[i] += sum over the P partials (P, NP) of column i, in partial order; one thread per column.
// grads points at dw (n), then dA (n, n), then dbeta (n): three destinations, given separately.
__global__ void hc_reduce_kernel(float *dw, float *dA, float *dbeta, const float *partial, int P, int n) {
    const int NP = 2 * n + n * n, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= NP) { return; }
    float s = 0.0f;
    for (int p = 0; p < P; p++) { s += partial[(size_t)p * NP + i]; }
    if (i < n) { if (dw) { dw[i] += s; } }
    else if (i < n + n * n) { if (dA) { dA[i - n] += s; } }
    else if (dbeta) { dbeta[i - n - n * n] += s; }
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

// dalpha (n) += w (dw - sum_t w_t dw_t); one thread
__global__ void hc_weights_backward_kernel(float *dalpha, const float *dw, const float *w, int n) {
    if (threadIdx.x != 0 || blockIdx.x != 0) { return; }
    float S = 0.0f;
    for (int t = 0; t < n; t++) { S += w[t] * dw[t]; }
    for (int s = 0; s < n; s++) { dalpha[s] += w[s] * (dw[s] - S); }
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

// Forward at the boundary of sublayer j and j+1: Xn = A X + beta o, h = sum_r w[r] Xn_r.
// o = NULL: the read alone (h = sum_r w[r] X_r; Xn unused). xb = 1: X is the embedding (N, C),
// standing for the n equal streams X_0 (j = 0).
static void hc_update_read_forward(floatX *Xn, floatX *h, const floatX *X, const floatX *o, const float *A,
                                   const float *beta, const float *w, size_t N, int C, int n, int xb = 0,
                                   cudaStream_t st = 0) {
    if (C % 8 != 0) { fprintf(stderr, "error: hc kernels need C a multiple of 8, not %d\n", C); exit(1); }
    hc_dispatch(n, [&](auto ns) {
        hc_update_read_kernel<decltype(ns)::value><<<ceil_div(N, HC_WARPS), 32 * HC_WARPS, 0, st>>>(
            Xn, h, X, o, A, beta, w, N, C, xb);
    });
    launchCheck();
}

// floats of partial space hc_read_update_backward needs for N positions and n streams
static size_t hc_partial_floats(size_t N, int n) {
    return (size_t)ceil_div(N, hc_rows_per_part(N)) * (2 * n + n * n);
}

// Backward of the read of sublayer j and the update of sublayer j-1 (top of file), then the
// deterministic sums: dw_j (n), dA_{j-1} (n, n), dbeta_{j-1} (n) += (any may be NULL: not kept).
// dXp: in A_j^T dX_{j+1} (dXp_in NULL: zero), out A_{j-1}^T dX_j (dXp_out may equal dXp_in).
// Xprev = NULL: sublayer 0; dx0 (N, C) fp32 += the embedding's gradient sum_r dX_0 (pass X = NULL,
// dw = NULL: its streams are equal, so dalpha_0 is 0; dout and dXp_out unused).
// Otherwise dx0 is unused (NULL). xpb = 1: Xprev is the embedding (N, C) standing for
// X_0 (j = 1). partial: hc_partial_floats(N, n) floats of scratch.
static void hc_read_update_backward(float *dXp_out, floatX *dout, float *dx0, float *dw, float *dA, float *dbeta,
                                    float *partial,
                                    const float *dXp_in, const float *dh, const floatX *X, const float *w,
                                    const floatX *Xprev, const floatX *o, const float *A, const float *beta,
                                    size_t N, int C, int n, int xpb = 0, cudaStream_t st = 0) {
    if (C % 8 != 0) { fprintf(stderr, "error: hc kernels need C a multiple of 8, not %d\n", C); exit(1); }
    const int rows = hc_rows_per_part(N), P = (int)ceil_div(N, rows);
    hc_dispatch(n, [&](auto ns) {
        hc_read_update_backward_kernel<decltype(ns)::value><<<P, 32 * HC_WARPS, 0, st>>>(
            dXp_out, dout, dx0, partial, dXp_in, dh, X, w, Xprev, o, A, beta, N, C, rows, xpb);
    });
    launchCheck();
    hc_reduce_kernel<<<1, 128, 0, st>>>(dw, dA, dbeta, partial, P, n);
    launchCheck();
}

// w (2L+1, n), A32 (2L, n, n), beta32 (2L, n) fp32 from the parameters alpha, A, beta (2L = J2 sublayers)
template <typename Tp>
static void hc_prepare(float *w, float *A32, float *beta32, const Tp *alpha, const Tp *A, const Tp *beta, int J2,
                       int n, cudaStream_t st = 0) {
    hc_prepare_kernel<Tp><<<ceil_div(J2 + 1, 32), 32, 0, st>>>(w, A32, beta32, alpha, A, beta, J2, n);
    launchCheck();
}
// dalpha (n) += w (dw - sum_t w_t dw_t): the softmax's backward of one sublayer, given its dw (fp32)
static void hc_weights_backward(float *dalpha, const float *dw, const float *w, int n, cudaStream_t st = 0) {
    hc_weights_backward_kernel<<<1, 32, 0, st>>>(dalpha, dw, w, n);
    launchCheck();
}
