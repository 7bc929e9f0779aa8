// kernels/route_forward.cuh: the MHAR routing forward (SPEC section 4), per site.
// A site reads n sources v_i (slots (nslots, N, C) bf16/fp32, listed in src) with
// their r_i (nslots, N), and per position and routing head h (C/H channels):
//   s[h,i] = r_i * sum_{c in h} qg[c] v_i[c],  qg = q * gamma   (C)
//   a[h,:] = softmax_i s[h,:],   h[c] = sum_i a[h(c), i] v_i[c]
// then the site's RMSNorm u = rmsnorm(h; g). Outputs u, h (N, C), rstd (N) and
// lse (N, H) (the weights are recomputed in backward), and, when asked (fresh),
// r of the site's new slot, its last source. One warp per position, one pass over
// the sources with an online softmax, the sources streamed through the cp.async
// row ring (common.cuh).
// The one predicate route_fwd14_ok picks the kernel:
//  - fast: route_forward14_kernel, lab dev/cuda/route.cu v14 (with v13's groups:
//    a group's first site also computes the next sites' partial softmaxes over its
//    sources; route_fwd_plan chooses the groups) and v21 (the new slot's r from the
//    row in the ring), bf16 layouts of 8 channels a lane and C <= 1024;
//  - fallback: route_forward_kernel, lab v2 with v8's row ring, one site at a time:
//    fp32, VEC = 1 layouts (heads of channels that 8 does not divide), C > 1024.
// Also here: the lane layout (RouteGeo, route_dispatch, head_sum, lane_heads) shared
// with route_backward.cuh, and route_qg_forward.
//
// The planner route_fwd_plan is plain C: it is all that a file gets that includes
// this header without nvcc (test_mhar.c) or with ROUTE_FWD_PLAN_ONLY (the lab).
#pragma once

// Groups of the routing forward (the CUDA trainer's route_forward, lab
// dev/cuda/route.cu v13). The queries do not depend on the input, so while the
// kernel of site g reads its sources it can also run the softmax of a later
// site g+m over those same sources and store it as a partial (the fp32 mix
// (N, C) and the log-sum-exp per head (N, H)); site g+m then starts from the
// partial and reads only the rest of its own sources. Site g+m may join site
// g's group when g's source list (n[g] slots) is a strict prefix of its own
// and no slot of it is written after site g: slot k >= 1 is written once, by
// sublayer k-1, between sites k-1 and k (common/config.h's slots), so slot k <= g.
// Groups are runs of consecutive sites, at most kmax long. A group is taken
// only where it costs less per position, counting bytes (a source row: vbytes*C
// + 4 for its r; a partial: 4(C + H) written and read again) and the extra
// sites' work: each extra site's pass over a source row of the leader costs
// ROUTE_FWD_XCOST rows (measured: dev/cuda/NOTES_route.md), or wherever it may when
// all != 0 (the largest group first; the checks, to run the grouped path on
// small models). src: row j (stride ld) holds site j's n[j] slots.
// Writes lead[j], the first site of j's group (j itself when it leads or is
// alone); returns the number of sites that start from a partial.
#define ROUTE_FWD_XCOST 0.55
static int route_fwd_plan(int J, const int *n, const int *src, int ld, int C, int H, int vbytes, int kmax, int all,
                          int *lead) {
    const double row = (double)vbytes * C + 4, part = 2.0 * 4 * (C + H);
    double *best = (double *)malloc(((size_t)J + 1) * sizeof(double));   // bytes of sites j..J-1
    int *len = (int *)malloc((size_t)J * sizeof(int));                    // the group that starts at j
    if (best == NULL || len == NULL) { fprintf(stderr, "error: out of host memory\n"); exit(1); }
    best[J] = 0;
    for (int j = J - 1; j >= 0; j--) {
        const int *sj = src + (size_t)j * ld;
        int ok = 1;
        for (int i = 0; i < n[j]; i++) { ok = ok && sj[i] <= j; }   // written before site j, never after
        best[j] = n[j] * row + best[j + 1];
        len[j] = 1;
        double cost = n[j] * row;   // the group j .. j+k-1 alone
        for (int k = 2; ok && k <= kmax && j + k <= J; k++) {
            const int g = j + k - 1, *sg = src + (size_t)g * ld;
            ok = n[g] > n[j];
            for (int i = 0; ok && i < n[j]; i++) { ok = sg[i] == sj[i]; }
            if (!ok) { break; }
            cost += (n[g] - n[j]) * row + part + ROUTE_FWD_XCOST * n[j] * row;
            if (all || cost + best[j + k] < best[j]) { best[j] = cost + best[j + k]; len[j] = k; }
        }
    }
    int starts = 0;
    for (int j = 0; j < J; j += len[j]) {
        for (int m = 0; m < len[j]; m++) { lead[j + m] = j; }
        starts += len[j] - 1;
    }
    free(best); free(len);
    return starts;
}

#if defined(__CUDACC__) && !defined(ROUTE_FWD_PLAN_ONLY)

// ----------------------------------------------------------------------------
// MHAR routing (SPEC section 4). A routing site reads n sources v_i (slots of
// the slot buffer, listed in src, a device array), and per position and
// routing head h mixes them with a softmax over depth:
//   k_i    = gamma * r_i * v_i,      r_i = 1 / sqrt(|v_i|^2 / C + 1e-6)
//   s[h,i] = sum_{c in head h} q[c] k_i[c] = r_i * sum_{c in h} qg[c] v_i[c],  qg = q * gamma
//   a[h,:] = softmax_i s[h,:]
//   out[c] = sum_i a[h(c), i] v_i[c]
// Head h owns channels [h*C/H, (h+1)*C/H). H = 1 is AttnRes.
//
// The fused kernels (lab dev/cuda/route.cu):
// - route_forward, per site: ONE pass over the sources with an online softmax
//   per head, and the RMSNorm that follows the site in the same kernel. It
//   keeps h_j (for the norm backward) and lse_j (N, H), the log-sum-exp of each
//   head's scores; the weights a = exp(s - lse) are recomputed in backward.
// - route_site_backward, per site j: the norm backward only. It stores
//   G_j = dL/dh_j (floatX) and S_j[h] = G_j[h] . h_j[h] (= sum_i a p).
// - route_slot_backward, per slot k: the sites that read slot k are all >= k,
//   so once site k has stored its G, one kernel gathers the contributions of
//   every reader and writes the fp32 gradient of slot k once (no fp32
//   read-modify-write per (site, source) pair). Its dq/dgamma share goes into
//   a per-(site, source) sum qv, and route_param_backward adds those up per
//   site, in source order, at the end of the backward pass.
//
// Lane layout of the fused kernels: one warp per position. A vector of C
// channels is cut into NCH chunks of 32*VEC channels; lane l holds channels
// ch*32*VEC + l*VEC .. +VEC of chunk ch (VEC = 8: one 16-byte load in bf16),
// and lanes past C hold zeros. A routing head is a group of `seg` consecutive
// lanes inside a chunk (seg a power of two), or `cph` whole chunks: its sums
// are a butterfly over seg lanes, then a sum over its chunks. route_geometry
// picks the layout: VEC = 8, or VEC = 1 for heads that 8 does not divide.

// Lane layout for width C and H routing heads (chosen once, in model_build).
// grp[ch]: bit c2 set when chunk c2 holds the same heads as chunk ch.
typedef struct { int C, H, vec, nch, seg, cph; unsigned grp[32]; } RouteGeo;

// The layout for width C and H heads: VEC = 8 if it divides C/H and the heads
// fit the chunks of 256 channels, else VEC = 1 (chunks of 32); NCH = the
// chunks needed, rounded up to a compiled count. Dies when neither fits.
RouteGeo route_geometry(int C, int H) {
    const int vecs[2] = {8, 1}, max_nch[2] = {8, 32};   // the compiled layouts (route_dispatch)
    int HC = C / H;
    for (int k = 0; k < 2; k++) {
        int vec = vecs[k], W = 32 * vec, nch = 1, seg, cph;
        if (HC % vec != 0) { continue; }
        while (nch * W < C) { nch *= 2; }
        if (nch > max_nch[k]) { continue; }
        if (H == 1) { seg = 32; cph = nch; }                 // one head: every lane of every chunk
        else if (W % HC == 0) { seg = HC / vec; cph = 1; }   // several heads per chunk
        else if (HC % W == 0) { seg = 32; cph = HC / W; }    // heads of whole chunks
        else { continue; }
        RouteGeo g;
        memset(&g, 0, sizeof(g));
        g.C = C; g.H = H; g.vec = vec; g.nch = nch; g.seg = seg; g.cph = cph;
        for (int ch = 0; ch < nch; ch++) {
            for (int c2 = 0; c2 < nch; c2++) { if (c2 / cph == ch / cph) { g.grp[ch] |= 1u << c2; } }
        }
        return g;
    }
    die("C=%d with H=%d routing heads (C/H=%d): the CUDA routing kernels need C <= 2048 and C/H a power of two "
        "or a multiple of 256, or else C/H a multiple of 32 and C <= 1024 (H = 1 takes any C up to 1024)", C, H, HC);
    return RouteGeo();
}

// A compiled layout: VEC channels per lane in each of NCH chunks, and SEG lanes
// per routing head (0: read geo.seg at run time). A compile-time SEG turns the
// head sums into unrolled butterflies and the head index of a lane into shifts
// (the gather's reader loop is bound by instruction issue).
template <int VEC, int NCH, int SEG> struct RouteLanes { static constexpr int vec = VEC, nch = NCH, seg = SEG; };

// Calls f(RouteLanes<VEC, NCH, SEG>()) for the layout of g: the compiled
// instances of the fused kernels (VEC = 8 with its SEG, VEC = 1 generic).
template <int NCH, typename F> void route_dispatch_seg(const RouteGeo &g, F f) {
    switch (g.seg) {
    case 1: f(RouteLanes<8, NCH, 1>()); break;
    case 2: f(RouteLanes<8, NCH, 2>()); break;
    case 4: f(RouteLanes<8, NCH, 4>()); break;
    case 8: f(RouteLanes<8, NCH, 8>()); break;
    case 16: f(RouteLanes<8, NCH, 16>()); break;
    case 32: f(RouteLanes<8, NCH, 32>()); break;
    default: die("internal: no routing kernels for VEC=8 NCH=%d SEG=%d", NCH, g.seg);
    }
}
template <typename F> void route_dispatch(const RouteGeo &g, F f) {
    switch (g.vec * 100 + g.nch) {
    case 801: route_dispatch_seg<1>(g, f); break;
    case 802: route_dispatch_seg<2>(g, f); break;
    case 804: route_dispatch_seg<4>(g, f); break;
    case 808: route_dispatch_seg<8>(g, f); break;
    case 101: f(RouteLanes<1, 1, 0>()); break;
    case 102: f(RouteLanes<1, 2, 0>()); break;
    case 104: f(RouteLanes<1, 4, 0>()); break;
    case 108: f(RouteLanes<1, 8, 0>()); break;
    case 116: f(RouteLanes<1, 16, 0>()); break;
    case 132: f(RouteLanes<1, 32, 0>()); break;
    default: die("internal: no routing kernels for VEC=%d NCH=%d", g.vec, g.nch);
    }
}

// Blocks per SM the fused kernels are compiled for: the lab's register budget
// (3 x 256 threads) for bf16 at up to 16 channels per lane (C <= 512)
#define ROUTE_MIN_BLOCKS(VEC, NCH) ((sizeof(floatX) == 2 && (VEC) * (NCH) <= 16 && (NCH) <= 8) ? 3 : 1)
#define ROUTE_POS_PER_BLOCK 32   // positions per block of route_site_backward (8 warps x 4)
#define ROUTE_PART_ROWS 128      // positions per partition of route_slot_param_kernel

// Raises a kernel's dynamic shared-memory limit once when smem needs more than the default 48 KB
template <typename K> void route_smem_limit(K kernel, size_t smem, bool &done) {
    if (!done && smem > 48 * 1024) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    done = true;
}

// x[ch] (this lane's partial of its head's sum in chunk ch) -> the head's full
// sum, in every lane: a butterfly over the head's SEG lanes (geo.seg when SEG is
// 0), then the sum over the chunks of its group (in chunk order).
template <int NCH, int SEG> __device__ __forceinline__ void head_sum(float (&x)[NCH], const RouteGeo &geo) {
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        if (SEG > 0) {
#pragma unroll
            for (int o = 1; o < SEG; o <<= 1) { x[ch] += __shfl_xor_sync(0xffffffffu, x[ch], o); }
        } else {
            for (int o = 1; o < geo.seg; o <<= 1) { x[ch] += __shfl_xor_sync(0xffffffffu, x[ch], o); }
        }
    }
    if (NCH > 1 && (SEG == 0 || SEG == 32) && geo.cph > 1) {   // heads of several chunks
        float y[NCH];
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            y[ch] = 0.0f;
#pragma unroll
            for (int c2 = 0; c2 < NCH; c2++) { if ((geo.grp[ch] >> c2) & 1u) { y[ch] += x[c2]; } }
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { x[ch] = y[ch]; }
    }
}

// The routing head of each of this lane's chunks, and whether the lane is the
// head's first (the one that stores per-head values); computed once per thread,
// outside the loops (shifts when SEG < 32 is compiled in). Also on the host
// (route_gather_index_check).
template <int VEC, int NCH, int SEG>
__host__ __device__ __forceinline__ void lane_heads(int (&hd)[NCH], bool (&first)[NCH], int lane, const RouteGeo &geo) {
    constexpr int SG = SEG > 0 && SEG < 32 ? SEG : 1;   // (a divisor also where unused)
    const int HC = geo.C / geo.H;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 32 * VEC + lane * VEC;
        if (SEG > 0 && SEG < 32) { hd[ch] = ch * (32 / SG) + lane / SG; first[ch] = lane % SG == 0; }
        else { hd[ch] = c0 / HC; first[ch] = c0 % HC == 0; }
        first[ch] = first[ch] && c0 < geo.C;
    }
}

// r (N) = 1 / sqrt(|v|^2 / C + 1e-6) of a freshly written source v (N, C).
// Computed once per source and reused by every later site.
// (residual_norm_forward's row kernel: one warp per row, 16-byte loads.)
void source_stat_forward(float *r, const floatX *v, size_t N, int C) {
    residual_norm_forward(NULL, NULL, r, NULL, v, NULL, N, C);
}

// Pair order of a row of C channels, C a multiple of 256 (chunks of 32 lanes x 8 channels): lane l's
// channels 8l .. 8l+4 of a chunk go to 4l .. 4l+4, and 8l+4 .. 8l+8 to 128 + 4l .. 128 + 4l + 4, so
// that a warp's two 16-byte loads of its lanes' 8 channels each read 512 contiguous bytes (in row
// order each reads 16 bytes of every 32: twice the L1 wavefronts). The forward's shared qg uses it too.
__host__ __device__ __forceinline__ size_t route_pair_index(size_t c) {
    return c / 256 * 256 + c % 8 / 4 * 128 + c % 256 / 8 * 4 + c % 4;
}
__global__ void route_qg_kernel(float *qg, float *qgp, const floatX *q, const floatX *gamma, size_t n, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const float x = toF(q[i]) * toF(gamma[i]);
    qg[i] = x;
    if (qgp != NULL) { qgp[i / C * C + route_pair_index(i % C)] = x; }
}

// qg (J, C) fp32 = q * gamma of every site, once per forward: the scores are
// s = r_i (qg . v_i), in forward and in backward. qgp (J, C): the same rows in
// pair order (route_pair_index) where C is a multiple of 256, for the slot gather.
void route_qg_forward(float *qg, float *qgp, const floatX *q, const floatX *gamma, size_t J, int C) {
    const size_t n = J * (size_t)C;
    route_qg_kernel<<<ceil_div(n, 256), 256>>>(qg, C % 256 == 0 ? qgp : NULL, q, gamma, n, C);
    launchCheck();
}

// The grouped forward (route_fwd_plan, below, makes the groups): the kernel of a
// group's first site also runs the softmax of the next KX sites over its own
// sources (their lists start with them) and stores each as a partial: hbar =
// acc / l (N, C) fp32 and lse_p = m + log l (N, H) fp32. Those sites' kernels
// (PART) start from it and read only their other sources. Such a kernel keeps
// the qg of its KX + 1 sites in shared memory after the ring, not in registers:
// float4 [KX+1][NCH][2][32] (lane l's channels 8l .. 8l+4, then 8l+4 .. 8l+8
// of each chunk: a warp's loads hit no bank twice). The most extra sites per
// layout: the largest KX that compiles without spills (sm_90a); 0 without the
// fast kernel (fp32, VEC = 1, C > 1024).
template <int VEC, int NCH> __host__ __device__ constexpr int route_fwd_kx_max() {
    return route_ring<VEC>() && VEC == 8 && NCH <= 4 ? 3 : 0;
}
template <int VEC, int NCH, int KX> __host__ __device__ constexpr size_t route_fwd_smem() {
    return route_ring_smem<VEC, NCH>() + (KX > 0 ? (size_t)(KX + 1) * NCH * 32 * VEC * sizeof(float) : 0);
}
// where the partials of extra site x start: hbar in ph, lse_p in pl (x = 0 .. KX-1)
typedef struct { float *ph, *pl; } RoutePartials;

// Fallback: one site (lab dev/cuda/route.cu v2, with v8's row ring), for the
// layouts without the fast kernel. Per position t (one warp): for each source i
// in order, e = qg . v_i per head, s = r_i e, and an online-softmax update of the
// running max m, sum l and unnormalised mix acc (fp32 registers); the sources
// come through the row ring (bf16), or one source ahead in registers. Then
// h = acc / l, lse = m + log l, and the site's RMSNorm: u = h * rstd * g, from
// h rounded to floatX as it is stored (rstd from the fp32 h).
template <int VEC, int NCH, int SEG>
__global__ void __launch_bounds__(256, ROUTE_MIN_BLOCKS(VEC, NCH))
route_forward_kernel(floatX *uout, float *rstd, floatX *hout, float *lse, const floatX *__restrict__ slots,
                     const float *__restrict__ r, const int *__restrict__ src, int n, const float *__restrict__ qg,
                     const floatX *__restrict__ g, int N, RouteGeo geo) {
    constexpr int W = 32 * VEC;
    const int lane = threadIdx.x % 32, t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    extern __shared__ __align__(16) unsigned char route_smem[];
    if (t >= N) { return; }
    const int C = geo.C, H = geo.H;
    constexpr bool RING = route_ring<VEC>();
    Packed<VEC> *ring = ring_packs<VEC, NCH>(route_smem);
    float *ring_r = ring_floats<VEC, NCH>(route_smem);
    float qgl[NCH][VEC], acc[NCH][VEC], m[NCH], l[NCH];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        ld_f(qgl[ch], qg, ch * W + lane * VEC, C);
#pragma unroll
        for (int k = 0; k < VEC; k++) { acc[ch][k] = 0.0f; }
        m[ch] = -INFINITY; l[ch] = 0.0f;
    }
    // RING: source i (and its r) into stage i % ROUTE_RING
    auto issue = [&](int i) { ring_issue_source<VEC, NCH>(ring, ring_r, slots, r, src, i, n, n, N, t, lane, C); };
    Packed<VEC> nxt[NCH];   // (no ring: source i+1, loaded while source i is used)
    float rn = 0.0f;
    if constexpr (RING) {
        for (int i = 0; i < ROUTE_RING - 1; i++) { issue(i); }
    } else {
        size_t row = (size_t)src[0] * N + t;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_lane<VEC>(slots + row * C, ch * W + lane * VEC, C); }
        rn = r[row];
    }
    for (int i = 0; i < n; i++) {
        Packed<VEC> cur[NCH];   // source i, kept packed (unpacked on use: fewer registers)
        float e[NCH], ri;
        if constexpr (RING) {
            cp_async_wait<ROUTE_RING - 2>();   // source i's group is complete (later ones may not be)
            __syncwarp();                      // and lane 0's copy of its r is visible to the warp
            const int st = i & (ROUTE_RING - 1);
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { cur[ch] = ring[(st * NCH + ch) * 32 + lane]; }
            ri = ring_r[st];
            issue(i + ROUTE_RING - 1);   // into the stage of source i-1, which every lane has read
        } else {
            ri = rn;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { cur[ch] = nxt[ch]; }
            if (i + 1 < n) {   // prefetch source i+1
                size_t row = (size_t)src[i + 1] * N + t;
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_lane<VEC>(slots + row * C, ch * W + lane * VEC, C); }
                rn = r[row];
            }
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float v[VEC], d = 0.0f;
            unpack(cur[ch], v);
#pragma unroll
            for (int k = 0; k < VEC; k++) { d += qgl[ch][k] * v[k]; }
            e[ch] = d;
        }
        head_sum<NCH, SEG>(e, geo);
        // a = softmax_i s: rescale the running sum and mix to the new max (m = -inf at i = 0: sc = 0)
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float s = ri * e[ch], mn = fmaxf(m[ch], s), v[VEC];
            float sc = expf(m[ch] - mn), p = expf(s - mn);
            l[ch] = l[ch] * sc + p;
            unpack(cur[ch], v);
#pragma unroll
            for (int k = 0; k < VEC; k++) { acc[ch][k] = acc[ch][k] * sc + p * v[k]; }
            m[ch] = mn;
        }
    }
    // h = sum_i a v_i;  u = rmsnorm(h; g)
    float ss = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float inv = 1.0f / l[ch];
#pragma unroll
        for (int k = 0; k < VEC; k++) { acc[ch][k] *= inv; ss += acc[ch][k] * acc[ch][k]; }
    }
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / C + 1e-6f);
    int hd[NCH];
    bool first[NCH];
    lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        if (c0 >= C) { continue; }
        // u from h as stored (rounded to floatX), so that the site's backward
        // (norm_backward_lane) can recompute it bit for bit from h and rstd
        float gw[VEC], hq[VEC], uu[VEC];
        ld_param(gw, g, c0, C);
#pragma unroll
        for (int k = 0; k < VEC; k++) { hq[k] = toF(fromF<floatX>(acc[ch][k])); uu[k] = hq[k] * rs * gw[k]; }
        st_lane(hout + (size_t)t * C + c0, hq);
        st_lane(uout + (size_t)t * C + c0, uu);
        if (first[ch]) { lse[(size_t)t * H + hd[ch]] = m[ch] + logf(l[ch]); }
    }
    if (lane == 0) { rstd[t] = rs; }
}

// ----------------------------------------------------------------------------
// The fast kernel (lab dev/cuda/route.cu v14, route_fwd_v14_kernel, with v13's
// groups): route_forward_kernel's outputs, plus the grouped partials, with fewer
// instructions per (site, source row), for the bf16 ring layouts (VEC = 8, NCH <= 4):
//   - base 2: qg2 = qg log2(e), so s2 = r_i qg2.v is the score in base 2 and
//     every weight or rescale factor is one ex2.approx; lse and lse_p are
//     stored in natural log, (m2 + log2 l) ln 2, as before.
//   - the head partials of all the group's sites in one transposing butterfly
//     (fwd14_reduce): each round halves the values a lane keeps, so a lane ends
//     up owning SL of them and runs the softmax scalars (max, sum, weight) for
//     those only; the weights go back to the head's lanes by one shuffle each
//     (fwd14_bcast).
//   - lazy rescale: a running max m2 is raised only when a score passes it by
//     more than FWD14_TAU (then a weight is at most 2^TAU), decided for the
//     warp by one vote; otherwise a row costs one ex2 per owned value and
//     acc += p v. Exact in real arithmetic: l and acc carry the same 2^-m2.
//   - the source row unpacked once for all the group's sites.
#define FWD14_TAU 8.0f
#define ROUTE_LN2 0.6931471805599453f

// whether a layout has the v14 kernels: the ring (bf16, VEC = 8) and C <= 1024
template <int VEC, int NCH> __host__ __device__ constexpr bool route_fwd14_ok() {
    return route_ring<VEC>() && VEC == 8 && NCH <= 4;
}
// 2^x as one MUFU.EX2 (results below 2^-126 flushed to zero; 2^-inf = 0)
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
constexpr int cx_log2(int x) { return x <= 1 ? 0 : 1 + cx_log2(x / 2); }       // floor(log2 x)
constexpr int cx_pow2_ceil(int x) { return x <= 1 ? 1 : 2 * cx_pow2_ceil((x + 1) / 2); }

// v14's values in a lane (layout <8, NCH, SEG>, KX extra sites): value k =
// x NCH + ch is this lane's part of site x's score in chunk ch, summed over
// the head's chunks first when a head spans several (cph > 1: the head's
// chunks then hold equal copies). V values, padded with zeros to P = 2^LP. A
// head is a segment of SEG = 2^R lanes; after T = min(R, LP) transposing
// rounds a lane owns SL = P / 2^T values: its slot m holds value value_of(m).
template <int NCH, int SEG, int KX> struct Fwd14Lanes {
    static constexpr int V = (KX + 1) * NCH, P = cx_pow2_ceil(V), LP = cx_log2(P), R = cx_log2(SEG);
    static constexpr int T = R < LP ? R : LP, SL = P >> T;
    static __device__ __forceinline__ int value_of(int m, int lane) {
        return m + (((lane & (SEG - 1)) >> (R - T)) << (LP - T));
    }
};

// y (P): this lane's part of each value -> y (SL): the head segment's sum of
// each value this lane owns (Fwd14Lanes). Round r pairs value m with m + half:
// the lane with segment bit SEG >> (r+1) set keeps the upper half and sends the
// lower, its partner the reverse; the segment bits below the T rounds end with
// a plain butterfly on the SL kept values.
template <class G> __device__ __forceinline__ void fwd14_reduce(float (&y)[G::P], int lane) {
#pragma unroll
    for (int r = 0; r < G::T; r++) {
        const int half = G::P >> (r + 1), o = (1 << G::R) >> (r + 1);
        const bool hi = (lane & o) != 0;
#pragma unroll
        for (int m = 0; m < half; m++) {
            const float send = hi ? y[m] : y[m + half], keep = hi ? y[m + half] : y[m];
            y[m] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (int o = (1 << G::R) >> (G::T + 1); o > 0; o >>= 1) {
#pragma unroll
        for (int m = 0; m < G::SL; m++) { y[m] += __shfl_xor_sync(0xffffffffu, y[m], o); }
    }
}
// value k (of V) of this lane's head segment, read from a lane that owns it
// (slot k mod SL of the segment's lane (k / SL) << (R - T)); z (SL): the owned
// values; k a compile-time index after unrolling. fwd14_bcast: all V of them.
template <class G> __device__ __forceinline__ float fwd14_bcast1(const float (&z)[G::SL], int k) {
    if constexpr (G::T == 0) { return z[k]; }
    else { return __shfl_sync(0xffffffffu, z[k % G::SL], (k / G::SL) << (G::R - G::T), 1 << G::R); }
}
template <class G> __device__ __forceinline__ void fwd14_bcast(float (&out)[G::V], const float (&z)[G::SL]) {
#pragma unroll
    for (int k = 0; k < G::V; k++) { out[k] = fwd14_bcast1<G>(z, k); }
}

// One site, v14 (route_forward_kernel's contract, layout <8, NCH, SEG>):
// u (N, C) floatX, rstd (N), h (N, C) floatX, lse (N, H) natural log, from
// the n sources src (slots (nslots, N, C), r (nslots, N)) and qg (KX+1, C);
// KX > 0: the next KX sites' partials out.ph (KX, N, C) fp32 hbar and out.pl
// (KX, N, H) lse_p (natural log); PART: start from in.ph (N, C), in.pl (N, H).
// rnew (N), when not NULL: the last source is the site's new slot, whose r no
// one has computed yet; the kernel computes it from the row in the ring (the
// order of residual_norm_forward's row kernel, so the same bits) and stores it there.
// One warp per position; sources through the row ring; the group's qg2 in
// registers (KX = 0) or in shared memory after the ring (route_forward_kernel's
// float4 [KX+1][NCH][2][32] table, scaled by log2 e).
template <int NCH, int SEG, int KX = 0, bool PART = false>
__global__ void __launch_bounds__(256, KX == 0 ? ROUTE_MIN_BLOCKS(8, NCH) : (NCH <= 2 ? 2 : 1))
route_forward14_kernel(floatX *uout, float *rstd, floatX *hout, float *lse, const floatX *__restrict__ slots,
                       const float *r, float *rnew, const int *__restrict__ src, int n, const float *__restrict__ qg,
                       const floatX *__restrict__ g, int N, RouteGeo geo, RoutePartials out, RoutePartials in) {
    static_assert(route_fwd14_ok<8, NCH>() && SEG >= 1 && KX <= route_fwd_kx_max<8, NCH>(), "v14: bf16 ring layouts");
    typedef Fwd14Lanes<NCH, SEG, KX> G;
    constexpr int VEC = 8, W = 32 * VEC, XS = KX + 1, V = G::V, P = G::P, SL = G::SL;
    // <8, 2, SEG> with 3 extra sites (2 blocks a SM: 128 registers): the copy of row i + ROUTE_RING - 1 is
    // issued at the end of iteration i, after the math, not before it: before, ptxas spilled 4-16 bytes at
    // SEG = 1, 2, 4, 8, 16 (also with the row unpacked twice); the ring is then one row less ahead during the math
    constexpr bool LATE_ISSUE = NCH == 2 && KX == 3;
    const int lane = threadIdx.x % 32, t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    extern __shared__ __align__(16) unsigned char route_smem[];
    float4 *qgs = reinterpret_cast<float4 *>(route_smem + route_ring_smem<VEC, NCH>());   // (KX > 0)
    if constexpr (KX > 0) {   // the sites' qg2, zeros past C; every thread, before any returns
        for (int i = threadIdx.x; i < XS * NCH * 64; i += blockDim.x) {
            const int x = i / (NCH * 64), c = (i % (NCH * 64)) / 64 * W + i % 32 * 8 + (i % 64) / 32 * 4;
            float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (c < geo.C) {
                z = *reinterpret_cast<const float4 *>(qg + (size_t)x * geo.C + c);
                z = make_float4(z.x * ROUTE_LOG2E, z.y * ROUTE_LOG2E, z.z * ROUTE_LOG2E, z.w * ROUTE_LOG2E);
            }
            qgs[i] = z;
        }
        __syncthreads();
    }
    if (t >= N) { return; }
    const int C = geo.C, H = geo.H, HC = C / H;
    Packed<VEC> *ring = ring_packs<VEC, NCH>(route_smem);
    float *ring_r = ring_floats<VEC, NCH>(route_smem);
    float qgl[KX == 0 ? NCH : 1][VEC];   // KX = 0: qg2 in registers
    float acc[XS][NCH][VEC];             // site x's unnormalised mix (x = 0: this site)
    float m2[SL], l[SL];                 // running max (base 2) and sum of each owned value
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        if constexpr (KX == 0) {
            ld_f(qgl[ch], qg, c0, C);
#pragma unroll
            for (int k = 0; k < VEC; k++) { qgl[ch][k] *= ROUTE_LOG2E; }
        }
#pragma unroll
        for (int x = 0; x < XS; x++) {
            if (PART && x == 0) { ld_f(acc[0][ch], in.ph + (size_t)t * C, c0, C); }   // mix hbar
            else {
#pragma unroll
                for (int k = 0; k < VEC; k++) { acc[x][ch][k] = 0.0f; }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < SL; m++) {   // PART: this site's values start at sum 1, running max lse_p (base 2)
        const int k = G::value_of(m, lane), c = k % NCH * W + (lane & ~(SEG - 1)) * VEC;   // head's first channel
        m2[m] = -INFINITY; l[m] = 0.0f;
        if (PART && k < NCH) { m2[m] = c < C ? in.pl[(size_t)t * H + c / HC] * ROUTE_LOG2E : 0.0f; l[m] = 1.0f; }
    }
    // source i (and its r) into ring stage i % ROUTE_RING
    const int nr = rnew != NULL ? n - 1 : n;   // the sources whose r is read
    auto issue = [&](int i) { ring_issue_source<VEC, NCH>(ring, ring_r, slots, r, src, i, n, nr, N, t, lane, C); };
    for (int i = 0; i < ROUTE_RING - 1; i++) { issue(i); }
    for (int i = 0; i < n; i++) {
        cp_async_wait<ROUTE_RING - 2>();   // source i's group is complete
        __syncwarp();                      // and lane 0's copy of its r is visible
        const int st = i & (ROUTE_RING - 1);
        float v[NCH][VEC];   // source i, unpacked once for every site
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { unpack(ring[(st * NCH + ch) * 32 + lane], v[ch]); }
        float ri;
        if (i < nr) { ri = ring_r[st]; }
        else {   // the new slot: r = 1 / sqrt(|v|^2 / C + 1e-6), summed as residual_norm_forward's row kernel
            float ss = 0.0f;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
                for (int k = 0; k < VEC; k++) { ss = fmaf(v[ch][k], v[ch][k], ss); }   // zeros past C add nothing
            }
            ss = warp_sum(ss);
            ri = 1.0f / sqrtf(ss / C + 1e-6f);
            if (lane == 0) { rnew[t] = ri; }
        }
        if (!LATE_ISSUE) { issue(i + ROUTE_RING - 1); }   // into the stage of source i-1, which every lane has read
        float y[P];   // this lane's part of each value (qg2 . v per site and chunk), zero padding
#pragma unroll
        for (int k = 0; k < P; k++) { y[k] = 0.0f; }
#pragma unroll
        for (int x = 0; x < XS; x++) {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                float q8[VEC];
                if constexpr (KX == 0) {
#pragma unroll
                    for (int k = 0; k < VEC; k++) { q8[k] = qgl[ch][k]; }
                } else {
                    const float4 a = qgs[(x * NCH + ch) * 64 + lane], b = qgs[(x * NCH + ch) * 64 + 32 + lane];
                    q8[0] = a.x; q8[1] = a.y; q8[2] = a.z; q8[3] = a.w; q8[4] = b.x; q8[5] = b.y; q8[6] = b.z; q8[7] = b.w;
                }
                float d = q8[0] * v[ch][0];
#pragma unroll
                for (int k = 1; k < VEC; k++) { d = fmaf(q8[k], v[ch][k], d); }
                y[x * NCH + ch] = d;
            }
        }
        if constexpr (SEG == 32 && NCH > 1) {   // heads of several chunks: each chunk's value is its head's part
            if (geo.cph > 1) {
#pragma unroll
                for (int x = 0; x < XS; x++) {
                    float z[NCH];
#pragma unroll
                    for (int ch = 0; ch < NCH; ch++) {
                        z[ch] = 0.0f;
#pragma unroll
                        for (int c2 = 0; c2 < NCH; c2++) { if ((geo.grp[ch] >> c2) & 1u) { z[ch] += y[x * NCH + c2]; } }
                    }
#pragma unroll
                    for (int ch = 0; ch < NCH; ch++) { y[x * NCH + ch] = z[ch]; }
                }
            }
        }
        fwd14_reduce<G>(y, lane);
        float s2[SL];
        bool up = false;
#pragma unroll
        for (int m = 0; m < SL; m++) { s2[m] = ri * y[m]; up |= s2[m] > m2[m] + FWD14_TAU; }
        if (__any_sync(0xffffffffu, up)) {   // raise every owned max (always on the first row of a fresh site)
            float sc[SL];
#pragma unroll
            for (int m = 0; m < SL; m++) {
                const float mn = fmaxf(m2[m], s2[m]);
                sc[m] = ex2_approx(m2[m] - mn);   // m2 = -inf: 0
                l[m] *= sc[m];
                m2[m] = mn;
            }
#pragma unroll
            for (int x = 0; x < XS; x++) {
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) {
                    const float f = fwd14_bcast1<G>(sc, x * NCH + ch);
#pragma unroll
                    for (int k = 0; k < VEC; k++) { acc[x][ch][k] *= f; }
                }
            }
        }
        float p[SL];
#pragma unroll
        for (int m = 0; m < SL; m++) { p[m] = ex2_approx(s2[m] - m2[m]); l[m] += p[m]; }
#pragma unroll
        for (int x = 0; x < XS; x++) {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const float w = fwd14_bcast1<G>(p, x * NCH + ch);
#pragma unroll
                for (int k = 0; k < VEC; k++) { acc[x][ch][k] = fmaf(w, v[ch][k], acc[x][ch][k]); }
            }
        }
        if (LATE_ISSUE) { issue(i + ROUTE_RING - 1); }
    }
    // lse (x = 0) and lse_p (x >= 1) of each owned value, natural log, by one lane per (segment, value) and
    // only for a head's first chunk; then 1 / l of every value to the head's lanes
    float inv[SL], invv[V];
#pragma unroll
    for (int m = 0; m < SL; m++) {
        inv[m] = 1.0f / l[m];
        const int k = G::value_of(m, lane), x = k / NCH, ch = k % NCH, c = ch * W + (lane & ~(SEG - 1)) * VEC;
        if (k < V && (lane & ((1 << (G::R - G::T)) - 1)) == 0 && c < C && ch % geo.cph == 0) {
            const float ls = (m2[m] + log2f(l[m])) * ROUTE_LN2;
            if (x == 0) { lse[(size_t)t * H + c / HC] = ls; }
            else { out.pl[((size_t)(x - 1) * N + t) * H + c / HC] = ls; }
        }
    }
    fwd14_bcast<G>(invv, inv);
#pragma unroll
    for (int x = 1; x < XS; x++) {   // the extra sites' partials: hbar = acc / l
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int c0 = ch * W + lane * VEC;
            if (c0 >= C) { continue; }
#pragma unroll
            for (int k = 0; k < VEC; k++) { acc[x][ch][k] *= invv[x * NCH + ch]; }
            st_f(out.ph + ((size_t)(x - 1) * N + t) * C + c0, acc[x][ch]);
        }
    }
    // h = sum_i a v_i;  u = rmsnorm(h; g), from h rounded to floatX as stored (route_forward_kernel's epilogue)
    float ss = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
        for (int k = 0; k < VEC; k++) { acc[0][ch][k] *= invv[ch]; ss += acc[0][ch][k] * acc[0][ch][k]; }
    }
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / C + 1e-6f);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        if (c0 >= C) { continue; }
        float gw[VEC], hq[VEC], uu[VEC];
        ld_param(gw, g, c0, C);
#pragma unroll
        for (int k = 0; k < VEC; k++) { hq[k] = toF(fromF<floatX>(acc[0][ch][k])); uu[k] = hq[k] * rs * gw[k]; }
        st_lane(hout + (size_t)t * C + c0, hq);
        st_lane(uout + (size_t)t * C + c0, uu);
    }
    if (lane == 0) { rstd[t] = rs; }
}

// The most sites a routing forward group has for a layout (1 + its most extra sites)
int route_fwd_kmax(const RouteGeo &geo) {
    int k = 1;
    route_dispatch(geo, [&](auto lanes) { k = 1 + route_fwd_kx_max<decltype(lanes)::vec, decltype(lanes)::nch>(); });
    return k;
}

// The fallback's launch (shared memory: the ring where it has one)
template <int VEC, int NCH, int SEG>
void route_forward_fallback(floatX *u, float *rstd, floatX *h, float *lse, const floatX *slots, const float *r,
                            const int *src, int n, const float *qg, const floatX *g, size_t N, const RouteGeo &geo) {
    constexpr size_t smem = route_ring_smem<VEC, NCH>();
    static bool limit_set = false;
    route_smem_limit(route_forward_kernel<VEC, NCH, SEG>, smem, limit_set);
    route_forward_kernel<VEC, NCH, SEG><<<ceil_div(N, 8), 256, smem>>>(u, rstd, h, lse, slots, r, src, n, qg, g,
                                                                       (int)N, geo);
}
// The fast kernel's launch (shared memory: the ring, then the qg table)
template <int NCH, int SEG, int KX, bool PART>
void route_forward14_launch(floatX *u, float *rstd, floatX *h, float *lse, const floatX *slots, const float *r,
                            float *rnew, const int *src, int n, const float *qg, const floatX *g, size_t N,
                            const RouteGeo &geo, RoutePartials out, RoutePartials in) {
    constexpr size_t smem = route_fwd_smem<8, NCH, KX>();
    static bool limit_set = false;
    route_smem_limit(route_forward14_kernel<NCH, SEG, KX, PART>, smem, limit_set);
    route_forward14_kernel<NCH, SEG, KX, PART><<<ceil_div(N, 8), 256, smem>>>(u, rstd, h, lse, slots, r, rnew, src, n,
                                                                            qg, g, (int)N, geo, out, in);
}

// u (N, C) = rmsnorm(route(sources); g) and its rstd (N): the input of the
// sublayer after the site. Keeps h (N, C), the routed mix, and lse (N, H) for
// backward. slots (nslots, N, C), r (nslots, N); the site reads the n slots
// src[0..n); qg (C) and the norm weight g (C) are the site's.
// Grouped forward (route_fwd_plan): kx > 0: the site leads a group and also
// writes the partials of the next kx sites (whose qg follow its own in qg) into
// out; in.ph != NULL: the site starts from the partial in, and src, n are its
// sources after its group leader's. kx = 0 and in.ph == NULL: a site alone.
// fresh >= 0: the last source src[n-1] is slot fresh, written since the last
// site and read by no site before this one; its r (row fresh of r) is computed
// here, as source_stat_forward would (the same bits), instead of in a pass of its own.
// The one predicate: route_fwd14_ok (bf16, VEC = 8, C <= 1024) runs the fast
// kernel (grouped or not; r of the new slot in the kernel), every other layout
// the fallback (never grouped: route_fwd_kmax is 1 there; source_stat_forward first).
void route_forward(floatX *u, float *rstd, floatX *h, float *lse, const floatX *slots, float *r, const int *src,
                   int n, const float *qg, const floatX *g, size_t N, const RouteGeo &geo, int kx, RoutePartials out,
                   RoutePartials in, int fresh) {
    float *rnew = fresh >= 0 ? r + (size_t)fresh * N : NULL;
    route_dispatch(geo, [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NCH = decltype(lanes)::nch, SEG = decltype(lanes)::seg;
        constexpr int XM = route_fwd_kx_max<VEC, NCH>();
        if (kx > XM || (in.ph != NULL && (kx > 0 || XM == 0))) {
            die("internal: routing forward with %d extra sites%s (layout VEC=%d NCH=%d: at most %d)", kx,
                in.ph != NULL ? " from a partial" : "", VEC, NCH, XM);
        }
        if constexpr (route_fwd14_ok<VEC, NCH>()) {
            auto launch = [&](auto kxc, auto partc) {   // std::integral_constant: the instance
                route_forward14_launch<NCH, SEG, decltype(kxc)::value, decltype(partc)::value>(
                    u, rstd, h, lse, slots, r, rnew, src, n, qg, g, N, geo, out, in);
            };
            using std::integral_constant;
            if (in.ph != NULL) { launch(integral_constant<int, 0>(), integral_constant<bool, true>()); }
            else if (kx == 0) { launch(integral_constant<int, 0>(), integral_constant<bool, false>()); }
            else if (kx == 1) { launch(integral_constant<int, (XM >= 1 ? 1 : 0)>(), integral_constant<bool, false>()); }
            else if (kx == 2) { launch(integral_constant<int, (XM >= 2 ? 2 : 0)>(), integral_constant<bool, false>()); }
            else { launch(integral_constant<int, (XM >= 3 ? 3 : 0)>(), integral_constant<bool, false>()); }
        } else {
            if (rnew != NULL) { source_stat_forward(rnew, slots + (size_t)fresh * N * geo.C, N, geo.C); }
            route_forward_fallback<VEC, NCH, SEG>(u, rstd, h, lse, slots, r, src, n, qg, g, N, geo);
        }
    });
    launchCheck();
}

#endif  // __CUDACC__ && !ROUTE_FWD_PLAN_ONLY
