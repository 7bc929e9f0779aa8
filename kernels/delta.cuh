// Delta AttnRes (SPEC section 9) on the GPU: the backward of a site's null source
// (delta_null_backward, lab dev/cuda/delta.cu), then the rest of a delta site (below:
// the null's broadcast, the gate's backward, a sublayer's dout). The gated norm of the
// forward is residual_norm_gated_forward in kernels/rmsnorm.cuh (one kernel body with std's).
//
// Site j routes [n_j, b_0, b_1 .. b_m]; the null source n_j (C) is the same vector at
// every position, so its statistic r, its key and its per-head score
//   e_h = sum_{c in h} qg[c] n[c],   s_h = r e_h        (qg = q_j gamma_j, fp32)
// do not depend on the position, and neither does any reader but site j. Its
// gradient, the sum over positions of SPEC section 4's dv for the source, is then
//   a_h(t)  = exp(s_h - lse[t,h]),   p_h(t) = G[t,h] . n[h],   ds_h(t) = a_h(t) (p_h(t) - S[t,h])
//   A_h = sum_t ds_h(t),   B = sum_t sum_h ds_h(t) e_h,   Gs[c] = sum_t a_{h(c)}(t) G[t,c]
//   dnull[c] += r qg[c] A_{h(c)} - (r^3 / C) n[c] B + Gs[c]
//   qv[c]     = r n[c] A_{h(c)}      (the (site, null) pair's sum over positions of ds r v,
//                                    which route_param_backward turns into dq, dgamma)
// from G = dL/dmix_j (N, C floatX: alpha_j dh_j), S (N, H: G[h] . mix_j[h]) and the
// forward's lse (N, H): one pass over G_j, no (N, C) null slot and no slot gather.
//
// Two kernels, deterministic (fixed partitions summed in order): a warp per position
// accumulates A, B and Gs over the rows of its block's partition; the block's eight
// warps are summed in warp order into part (P, C + H + 1); delta_null_reduce_kernel sums
// the P partitions in order and applies the formula above.
// Include after the trainer's floatX, toF, fromF, warp_sum, ceil_div, red_rows_per_part and launchCheck.
#pragma once

#define DELTA_NULL_HMAX 32    // routing heads (the trainer's routing kernels hold H <= 32 too)
#define DELTA_NULL_CMAX 1024  // channels: 32 per lane at most

// part (P, C + H + 1): partition p's Gs (C), A (H), B (1) over rows [p R, (p+1) R).
// Block of 256 threads = 8 warps; warp w takes rows p R + w, p R + w + 8, ...; lane l
// owns channels l, l + 32, ... (C % 32 == 0).
template <int CPL>   // channels per lane, C / 32
__global__ void delta_null_partial_kernel(float *part, const floatX *G, const float *S, const float *lse,
                                          const floatX *null, const float *qg, const float *rnull, int N, int C,
                                          int H, int R) {
    __shared__ float e[DELTA_NULL_HMAX];
    __shared__ float red[8][DELTA_NULL_CMAX + DELTA_NULL_HMAX + 1];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, HC = C / H;
    float n[CPL], gs[CPL];
#pragma unroll
    for (int k = 0; k < CPL; k++) { n[k] = toF(null[lane + 32 * k]); gs[k] = 0.0f; }
    // e_h, by warp 0: per head, the lanes' channels of that head, then a warp sum
    if (warp == 0) {
        for (int h = 0; h < H; h++) {
            float x = 0.0f;
#pragma unroll
            for (int k = 0; k < CPL; k++) {
                const int c = lane + 32 * k;
                if (c / HC == h) { x += qg[c] * n[k]; }
            }
            x = warp_sum(x);
            if (lane == 0) { e[h] = x; }
        }
    }
    __syncthreads();
    const float r = *rnull;
    float A[DELTA_NULL_HMAX], B = 0.0f;
    for (int h = 0; h < H; h++) { A[h] = 0.0f; }
    const int t0 = blockIdx.x * R, t1 = min(t0 + R, N);
    for (int t = t0 + warp; t < t1; t += 8) {
        float g[CPL];
#pragma unroll
        for (int k = 0; k < CPL; k++) { g[k] = toF(G[(size_t)t * C + lane + 32 * k]); }
        for (int h = 0; h < H; h++) {
            float p = 0.0f;
#pragma unroll
            for (int k = 0; k < CPL; k++) {
                if ((lane + 32 * k) / HC == h) { p += g[k] * n[k]; }
            }
            p = warp_sum(p);
            const float a = expf(r * e[h] - lse[(size_t)t * H + h]);
            const float ds = a * (p - S[(size_t)t * H + h]);
            A[h] += ds;
            B += ds * e[h];
#pragma unroll
            for (int k = 0; k < CPL; k++) {
                if ((lane + 32 * k) / HC == h) { gs[k] += a * g[k]; }
            }
        }
    }
    // the block's warps in warp order
#pragma unroll
    for (int k = 0; k < CPL; k++) { red[warp][lane + 32 * k] = gs[k]; }
    if (lane == 0) {
        for (int h = 0; h < H; h++) { red[warp][C + h] = A[h]; }
        red[warp][C + H] = B;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C + H + 1; i += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < 8; w++) { s += red[w][i]; }
        part[(size_t)blockIdx.x * (C + H + 1) + i] = s;
    }
}

// dnull (C) += r qg A - (r^3/C) n B + Gs;  qv (C) = r n A, from the P partitions in order
__global__ void delta_null_reduce_kernel(float *dnull, float *qv, const float *part, const floatX *null,
                                         const float *qg, const float *rnull, int P, int C, int H) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    const int h = c / (C / H), W = C + H + 1;
    float gs = 0.0f, A = 0.0f, B = 0.0f;
    for (int p = 0; p < P; p++) {
        gs += part[(size_t)p * W + c];
        A += part[(size_t)p * W + C + h];
        B += part[(size_t)p * W + C + H];
    }
    const float r = *rnull, n = toF(null[c]);
    dnull[c] += r * qg[c] * A - r * r * r / C * n * B + gs;
    qv[c] = r * n * A;
}

// The backward of site j's null source (above): dnull (C) +=, qv (C) = the pair's sum.
// G (N, C) = dL/dmix_j, S (N, H), lse (N, H) of site j; null (C) its n_j, qg (C) its
// q gamma, rnull (1) its r, all on the device. part: scratch of RED_PARTS_MAX * (C + H + 1)
// floats. C % 32 == 0, C <= 1024, H <= 32, H divides C.
static void delta_null_backward(float *dnull, float *qv, float *part, const floatX *G, const float *S, const float *lse,
                                const floatX *null, const float *qg, const float *rnull, size_t N, int C, int H) {
    const int R = red_rows_per_part(N), P = (int)ceil_div(N, R);
    switch (C / 32) {
#define DELTA_NULL_CASE(k) \
    case k: delta_null_partial_kernel<k><<<P, 256>>>(part, G, S, lse, null, qg, rnull, (int)N, C, H, R); break;
        DELTA_NULL_CASE(1) DELTA_NULL_CASE(2) DELTA_NULL_CASE(4) DELTA_NULL_CASE(8) DELTA_NULL_CASE(16)
        DELTA_NULL_CASE(32)
#undef DELTA_NULL_CASE
        default: die("delta_null_backward: C=%d; the kernel takes C = 32 * (1, 2, 4, 8, 16, 32)", C);
    }
    launchCheck();
    delta_null_reduce_kernel<<<ceil_div(C, 128), 128>>>(dnull, qv, part, null, qg, rnull, P, C, H);
    launchCheck();
}

// ----------------------------------------------------------------------------
// The rest of a delta site on the GPU (train_mhar.cu's site_forward / site_backward):
//  - delta_null_fill: slot J (N, C) = the site's null source at every position, so
//    that route_forward reads it like any other source.
//  - delta_gate_backward: given dh = dL/dh_j (the norm's backward, fp32) of
//    h_j = x_j + alpha_j mix_j: dres (+)= dh (the running gradient of the residual
//    stream: dx_j += dh_j, std's arithmetic), G_j = alpha_j dh (floatX: the routing's
//    dL/dmix_j), S_j[h] = G_j[h] . mix_j[h] and dalpha_j += sum dh . mix_j (fixed
//    partitions summed in order).
//  - delta_dout: the floatX dout of a sublayer, dres + db (db: its block sum's gradient
//    when the block is a source, else NULL).

__global__ void delta_null_fill_kernel(floatX *out, const floatX *null, size_t N, int C) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * C) { out[i] = null[i % C]; }
}

// out (N, C) = null (C) at every position
void delta_null_fill(floatX *out, const floatX *null, size_t N, int C) {
    delta_null_fill_kernel<<<ceil_div(N * C, 256), 256>>>(out, null, N, C);
    launchCheck();
}

// Block b (8 warps) owns rows [b R, b R + R); warp w takes rows w, w + 8, ...; per row
// and head, the lanes walk the head's channels. part[b] = the block's sum of dh . mix.
__global__ void __launch_bounds__(256)
delta_gate_backward_kernel(float *dres, floatX *G, float *S, float *part, const float *dh, const floatX *mix,
                           const float *alpha, size_t N, int C, int H, int R, int add) {
    __shared__ float red[8];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, HC = C / H;
    const float al = *alpha;
    float acc = 0.0f;
    const size_t n0 = (size_t)blockIdx.x * R, n1 = n0 + R < N ? n0 + R : N;
    for (size_t n = n0 + warp; n < n1; n += 8) {
        for (int h = 0; h < H; h++) {
            float s = 0.0f;
            for (int c = h * HC + lane; c < (h + 1) * HC; c += 32) {
                const size_t i = n * C + c;
                const float d = dh[i], mx = toF(mix[i]);
                dres[i] = add ? dres[i] + d : d;
                const floatX g = fromF<floatX>(al * d);
                G[i] = g;
                s += toF(g) * mx;
                acc += d * mx;
            }
            s = warp_sum(s);
            if (lane == 0) { S[n * H + h] = s; }
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) { red[warp] = acc; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < 8; w++) { t += red[w]; }
        part[blockIdx.x] = t;
    }
}

// *dalpha += the P partials in order
__global__ void delta_alpha_reduce_kernel(float *dalpha, const float *part, int P) {
    float t = 0.0f;
    for (int p = 0; p < P; p++) { t += part[p]; }
    *dalpha += t;
}

// Backward of h_j = x_j + alpha mix_j given dh (N, C) fp32: dres (N, C) = (add ? dres : 0)
// + dh; G (N, C) floatX = alpha dh; S (N, H) = G[h] . mix[h]; *dalpha += sum dh . mix.
// alpha: the gate on the device (fp32); part: RED_PARTS_MAX floats of scratch.
void delta_gate_backward(float *dres, floatX *G, float *S, float *dalpha, float *part, const float *dh,
                         const floatX *mix, const float *alpha, size_t N, int C, int H, int add) {
    const int R = red_rows_per_part(N), P = (int)ceil_div(N, R);
    delta_gate_backward_kernel<<<P, 256>>>(dres, G, S, part, dh, mix, alpha, N, C, H, R, add);
    launchCheck();
    delta_alpha_reduce_kernel<<<1, 1>>>(dalpha, part, P);
    launchCheck();
}

__global__ void delta_dout_kernel(floatX *dout, const float *dres, const float *db, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { dout[i] = fromF<floatX>(db != NULL ? dres[i] + db[i] : dres[i]); }
}

// dout (n) = floatX of dres + db (db NULL: of dres): the output gradient of a sublayer
// whose output is in the stream and, when its block is complete, in the block's sum
void delta_dout(floatX *dout, const float *dres, const float *db, size_t n) {
    delta_dout_kernel<<<ceil_div(n, 256), 256>>>(dout, dres, db, n);
    launchCheck();
}
