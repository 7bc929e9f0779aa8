// kernels/route_backward.cuh: the MHAR routing backward (SPEC section 4's site
// backward) in three deterministic passes (fixed-order sums, no atomics):
//  - route_site_backward, per site j (lab dev/cuda/route.cu v3): the site norm's
//    backward: G_j = dL/dh_j (N, C) floatX, S_j[h] = G_j[h] . h_j[h] (N, H), dg, u_j.
//  - route_slot_backward, per slot k from the last down: gathers dslot_k (N, C) fp32
//    from the sites that read it (all >= k: their G, S are stored), and dsr (N, H,
//    nrp) = ds r per reader. Predicate route_gather_lean: fast = lab v12's lean
//    gather (bf16, <= 32 readers and heads); fallback = lab v8's gather.
//  - route_slot_qgamma, per slot k: qv (pairs, C) = sum_t ds r v_k. Predicate
//    route_qg_tc_fits: fast = lab v16 on tensor cores (bf16); fallback = lab v11 on
//    the CUDA cores. route_param_backward adds qv into dq and dgamma per site.
#pragma once

// The lean gather's 32-bit element indices (lab v12's scheme), shared with the
// host check route_gather_index_check. Per lane, once: its first channel in row t
// of a (., N, C) array (the row's start when the lane is past C in every chunk,
// so that zero-byte copies read a valid address), chunk ch's offset from it
// (0 where the lane is past C: a zero-byte copy), an lse/S entry of row t (the
// kernel takes row t's first, glean_ls(t, 0, H), and adds the head), and dsr's entry
// (t, hd, 0). Per reader j:
// + j N C (G), + j N H (lse, S), + j C (qg, from the lane's first channel).
__host__ __device__ __forceinline__ bool glean_live(int ch, int lane, int C, int VEC) { return ch * 32 * VEC + lane * VEC < C; }
__host__ __device__ __forceinline__ unsigned glean_row(unsigned t, int lane, int C, int VEC) {
    return t * (unsigned)C + (lane * VEC < C ? (unsigned)(lane * VEC) : 0u);
}
__host__ __device__ __forceinline__ unsigned glean_chunk(int ch, int lane, int C, int VEC) {
    return glean_live(ch, lane, C, VEC) ? (unsigned)(ch * 32 * VEC) : 0u;
}
__host__ __device__ __forceinline__ unsigned glean_ls(unsigned t, int lane, int H) { return t * (unsigned)H + (lane < H ? (unsigned)lane : 0u); }
__host__ __device__ __forceinline__ unsigned glean_dsr(unsigned t, int hd, int H, int nrp) { return (t * (unsigned)H + (unsigned)hd) * (unsigned)nrp; }
// dsr's entry of reader jj for chunk ch's head hdc, from the lane's base of chunk 0's head hd0 (glean_dsr)
__host__ __device__ __forceinline__ unsigned glean_dsr_at(unsigned base0, int hdc, int hd0, int nrp, int jj) {
    return base0 + (unsigned)((hdc - hd0) * nrp + jj);
}
__host__ __device__ __forceinline__ unsigned glean_add(unsigned base, unsigned j, unsigned stride) { return j * stride + base; }
// x = a lane's 8 channels of a row in pair order (route_pair_index), p at the lane's first (4 lane, + 256 ch)
__device__ __forceinline__ void ld_f_pairs(float (&x)[8], const float *p) {
    const float4 a = *reinterpret_cast<const float4 *>(p), b = *reinterpret_cast<const float4 *>(p + 128);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}
// the ring stage of reader i, and the lane holding its site (i >= nr: a zero-byte copy from that lane's site)
__host__ __device__ __forceinline__ int glean_stage(int i) { return i & (ROUTE_RING - 1); }
__host__ __device__ __forceinline__ int glean_src_lane(int i) { return i & 31; }
// Whether a slot's gather takes the lean path: the ring (bf16, VEC = 8), at most 32
// readers (one per lane) and 32 heads (the bound of the first port, which staged one
// lse/S entry per lane; kept, as larger H is untested), and every index
// below 2^31: J N C into G, J N H into lse and S, N H nrp into dsr.
static bool route_gather_lean(const RouteGeo &g, int nr, size_t N, size_t J) {
    const size_t lim = (size_t)1 << 31, C = g.C, H = g.H, nrp = ((size_t)nr + 3) & ~(size_t)3;
    return g.vec == 8 && sizeof(floatX) == 2 && g.H <= 32 && nr <= 32 && J * N * C < lim && J * N * H < lim &&
           N * H * nrp < lim;
}
// Backward of the site's RMSNorm (lab v3), for one position: u = h * rstd * g gives
// G = dL/dh = rstd (g dU - xhat mean(g dU xhat)), xhat = h * rstd; adds dU * xhat to accg.
// S[ch] = G[h] . h[h] over this lane's head: the S_h = sum_i a p of SPEC's site backward.
// u (the row of u, or NULL): also stores u = xhat * g, the forward's operations on the
// stored h and rstd in its order (route_forward_kernel's epilogue), so bit for bit its u.
template <int VEC, int NCH, int SEG>
__device__ __forceinline__ void norm_backward_lane(float (&G)[NCH][VEC], float (&S)[NCH], float (&accg)[NCH][VEC],
                                                   floatX *u, const float *dU, const floatX *h, float rs,
                                                   const float (&gw)[NCH][VEC], int lane, const RouteGeo &geo) {
    constexpr int W = 32 * VEC;
    const int C = geo.C;
    float md = 0.0f;
    // two passes over this lane's dU and h (the second re-reads them from L1):
    // fewer live registers than keeping dU and xhat across the warp sum
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        float du[VEC], hv[VEC];
        ld_f(du, dU, c0, C);
        unpack(ld_lane<VEC>(h, c0, C), hv);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            const float xh = hv[k] * rs;
            md += gw[ch][k] * du[k] * xh;
            accg[ch][k] += du[k] * xh;
        }
    }
    md = warp_sum(md) / C;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        float du[VEC], hv[VEC], uu[VEC], d = 0.0f;
        ld_f(du, dU, c0, C);
        unpack(ld_lane<VEC>(h, c0, C), hv);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            const float xh = hv[k] * rs;
            G[ch][k] = rs * (gw[ch][k] * du[k] - xh * md);
            d += G[ch][k] * xh;
            uu[k] = xh * gw[ch][k];
        }
        S[ch] = d / rs;   // G . h = G . xhat / rstd
        if (u != NULL && c0 < C) { st_lane(u + c0, uu); }
    }
    head_sum<NCH, SEG>(S, geo);
}

// Site j's norm backward (lab v3): G (N, C) floatX, S (N, H), and part_dg
// (ceil(N/32), C): per-block sums of dU * xhat for the norm weight's gradient;
// Uout (N, C), when not NULL: u_j recomputed (norm_backward_lane).
// Block = 8 warps x 4 positions.
template <int VEC, int NCH, int SEG>
__global__ void __launch_bounds__(256, ROUTE_MIN_BLOCKS(VEC, NCH))
route_site_backward_kernel(floatX *Gout, float *Sout, float *part_dg, floatX *Uout, const float *__restrict__ dU,
                           const floatX *__restrict__ hbuf, const float *__restrict__ rstd,
                           const floatX *__restrict__ g, int N, RouteGeo geo) {
    constexpr int W = 32 * VEC;
    __shared__ __align__(16) float red[8][W];
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, C = geo.C, H = geo.H;
    float gw[NCH][VEC], accg[NCH][VEC];
    int hd[NCH];
    bool first[NCH];
    lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        ld_param(gw[ch], g, ch * W + lane * VEC, C);
#pragma unroll
        for (int k = 0; k < VEC; k++) { accg[ch][k] = 0.0f; }
    }
    for (int pp = 0; pp < ROUTE_POS_PER_BLOCK / 8; pp++) {
        const int t = blockIdx.x * ROUTE_POS_PER_BLOCK + pp * 8 + w;
        if (t >= N) { continue; }   // warp-uniform
        float G[NCH][VEC], S[NCH];
        norm_backward_lane<VEC, NCH, SEG>(G, S, accg, Uout != NULL ? Uout + (size_t)t * C : NULL, dU + (size_t)t * C,
                                          hbuf + (size_t)t * C, rstd[t], gw, lane, geo);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int c0 = ch * W + lane * VEC;
            if (c0 >= C) { continue; }
            st_lane(Gout + (size_t)t * C + c0, G[ch]);
            if (first[ch]) { Sout[(size_t)t * H + hd[ch]] = S[ch]; }
        }
    }
    block_sum_store<VEC, NCH>(accg, red, part_dg + (size_t)blockIdx.x * C, C);
}

// Backward of site j's u = rmsnorm(h; g), given dU = dL/du (N, C) fp32: stores
// G = dL/dh (N, C) floatX and S (N, H) for the slot gathers, and adds the norm
// weight's gradient into dg (C). part: scratch of ceil(N/32) * C floats. u (N, C),
// when not NULL: u recomputed bit for bit from h and rstd, for the weight
// gradients of the sublayer that reads it (mhar keeps one u buffer; reading h
// here once for both saves a pass over it).
void route_site_backward(floatX *G, float *S, float *dg, float *part, floatX *u, const float *dU, const floatX *h,
                         const float *rstd, const floatX *g, size_t N, const RouteGeo &geo) {
    unsigned nblk = ceil_div(N, ROUTE_POS_PER_BLOCK);
    route_dispatch(geo, [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NCH = decltype(lanes)::nch, SEG = decltype(lanes)::seg;
        route_site_backward_kernel<VEC, NCH, SEG><<<nblk, 256>>>(G, S, part, u, dU, h, rstd, g, (int)N, geo);
    });
    launchCheck();
    // dg[c] += sum_t dU[t][c] xhat[t][c]: the per-block partials, in a fixed order
    route_reduce_parts(dg, part, NULL, (int)nblk, 1, geo.C, 1);
}

// The gather hands ds r to the q/gamma pass as dsr (N, H, nrp): the readers of
// each (position, head) padded to a multiple of 4, so that the pass reads four
// of them per 16-byte load. nrp for a slot of nr readers:
__host__ __device__ constexpr int route_nrp(int nr) { return (nr + 3) & ~3; }

// Gradient of slot k from the nr sites j that read it (lab v3, the gather),
// one warp per position. SPEC section 4's site backward, summed over the sites:
//   dslot_k = sum_j [ r ds_j qg_j + a_j G_j ] - (r^3 / C) (sum_j u_j . v) v,
// with v = v_k, r = r_k, and per head p = G_j . v, e = qg_j . v,
// a_j = exp(r e - lse_j), ds_j = a_j (p - S_j), u_j . v = sum_h ds_j e, all
// recomputed here. When chain (slot k+1 = out_k + slot k), dslot holds
// dslot_{k+1} on entry and the result adds it (in place). The fp32 result is
// stored only when keep32 (something reads it: the gather of slot k-1 when
// slot k chains onto it, or the encoder for slot 0); dslotX (N, C), when not
// NULL, gets a floatX copy (the input of the matmul backwards of the sublayer
// that wrote slot k). Also writes dsr (N, H, nrp) = ds_j r for the dq/dgamma pass
// (nrp = nr rounded up to 4; the padding readers nr .. nrp are not written).
// Gall (J, N, C), Sall and lseall (J, N, H), qg (J, C); readers (nr) increasing;
// NC = N C and NH = N H (LEAN only).
// The reader loop is bound by instruction issue: head indices computed once,
// compile-time head sums, each reader's G row and qg_j read once, exp2f weights.
// LEAN (fast, lab v12; where route_gather_lean holds): 32-bit element indices
// (glean_*: per-lane parts once, + j N C, + j N H, + j C per reader); lane l holds
// readers[l], reader jj's site comes by one shuffle; G rows through the ring by
// cp.async (readers past nr: zero-byte copies from a valid address into the stage
// just consumed; all groups waited for after the loop); lse and S rows through L1,
// prefetched when the row is issued; v packed behind an empty asm, unpacked per reader.
// Fallback (lab v8): G rows through the ring (bf16, VEC = 8) or one reader ahead in
// registers, lse and S prefetched into L1, 64-bit addresses, v_k unpacked once.
// FULL (LEAN, C = NCH 32 VEC: every lane's packs are live): C is a compile-time constant
// and the tests for lanes past C fold away, as in the lab's kernels (templated on C):
// the predicated qg loads with their zero fills, the copies' sizes and chunk offsets,
// the branches around the stores (NOTES_route.md, "The lean gather's FULL instance").
// FULL reads qg in pair order (route_pair_index; lab v23): each of its warp's two 16-byte
// loads a chunk reads 512 contiguous bytes, half the L1 wavefronts of row order (L1's
// wavefronts are the loop's busiest unit).
template <int VEC, int NCH, int SEG, bool LEAN, bool FULL>
__global__ void __launch_bounds__(256, ROUTE_MIN_BLOCKS(VEC, NCH))
route_slot_backward_kernel(float *dslot, floatX *dslotX, float *dsr, const floatX *__restrict__ v,
                           const float *__restrict__ rk, const floatX *__restrict__ Gall,
                           const float *__restrict__ Sall, const float *__restrict__ lseall,
                           const int *__restrict__ readers, int nr, const float *__restrict__ qg, int chain, int keep32,
                           int N, unsigned NC, unsigned NH, RouteGeo geo) {
    constexpr int W = 32 * VEC;
    constexpr bool RING = route_ring<VEC>();
    static_assert(!LEAN || RING, "the lean gather needs the row ring (bf16, VEC = 8)");
    static_assert(!FULL || LEAN, "FULL is a case of the lean gather");
    const int lane = threadIdx.x % 32, t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= N) { return; }
    const int C = FULL ? NCH * W : geo.C, H = geo.H;
    int hd[NCH];
    bool first[NCH];
    lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
    // v_k in fp32 (fallback: the compiler may keep it packed and unpack it per
    // reader, to stay within the register bound; LEAN: held packed, unpacked per
    // reader), and the next reader's G (no ring). Lanes past C: G and qg are zeros,
    // so p = e = 0 there whatever v_k holds (ld_lane_clamped), and they skip the rest.
    extern __shared__ __align__(16) unsigned char route_smem[];
    Packed<VEC> *ring = ring_packs<VEC, NCH>(route_smem);
    Packed<VEC> nxt[NCH], vraw[NCH];
    float vf[NCH][VEC], dv[NCH][VEC];
    const float r = rk[t], rl = r * ROUTE_LOG2E;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const Packed<VEC> vp = ld_lane_clamped<VEC>(v + (size_t)t * C, ch * W + lane * VEC, C);
        if constexpr (LEAN) { vraw[ch] = vp; }
        else { unpack(vp, vf[ch]); }
#pragma unroll
        for (int k = 0; k < VEC; k++) { dv[ch][k] = 0.0f; }
    }
    float uv = 0.0f;   // this lane's share of sum_j u_j . v
    // RING: reader jj's G row into stage jj % ROUTE_RING (one commit group per reader), and its
    // lse and S rows into L1 (prefetch: rows of H <= 32 floats are one line)
    auto issue = [&](int jj) {
        if (jj < nr) {
            const size_t row = (size_t)readers[jj] * N + t;
            ring_fill<VEC, NCH>(ring, jj & (ROUTE_RING - 1), Gall + row * C, lane, C);
            if (lane < 2) { prefetch_l1((lane ? Sall : lseall) + row * H); }
        }
        cp_async_commit();
    };
    // LEAN, per lane: its reader (lane l: readers[l]; site 0 past nr), its G row in site 0
    // and row t's first lse/S entry there (glean_*), its shared address in stage 0, dsr's
    // entries of (t, hd)
    const int nrp = route_nrp(nr);
    int jl = 0;
    unsigned gl = 0, lsb = 0, dsb = 0;
    uint32_t sg = 0;
    if constexpr (LEAN) {
        jl = lane < nr ? __ldg(readers + lane) : 0;
        gl = glean_row((unsigned)t, lane, C, VEC);
        lsb = glean_ls((unsigned)t, 0, H);   // row t's first lse/S entry
        sg = (uint32_t)__cvta_generic_to_shared(ring + lane);
        dsb = glean_dsr((unsigned)t, hd[0], H, nrp);   // chunk ch's: + (hd[ch] - hd[0]) nrp
    }
    // LEAN: reader i's G row (this lane's packs; zeros past C) into stage i % ROUTE_RING,
    // one commit group, and its lse and S rows into L1; past nr the copies read zero
    // bytes and nothing is prefetched
    auto issue_lean = [&](int i) {
        const unsigned j = (unsigned)__shfl_sync(0xffffffffu, jl, glean_src_lane(i));
        const uint32_t st = (uint32_t)glean_stage(i), live = i < nr;
        const unsigned g = glean_add(gl, j, NC);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            cp_async16z(sg + (st * NCH + ch) * 32 * 16,
                        Gall + (g + (FULL ? (unsigned)(ch * W) : glean_chunk(ch, lane, C, VEC))),
                        live && (FULL || glean_live(ch, lane, C, VEC)) ? 16u : 0u);
        }
        if (live && lane < 2) { prefetch_l1((lane ? Sall : lseall) + glean_add(lsb, j, NH)); }   // into L1
        cp_async_commit();
    };
    if constexpr (LEAN) {
        for (int i = 0; i < ROUTE_RING - 1; i++) { issue_lean(i); }
    } else if constexpr (RING) {
        for (int jj = 0; jj < ROUTE_RING - 1; jj++) { issue(jj); }
    } else {
        size_t row = (size_t)readers[0] * N + t;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_lane<VEC>(Gall + row * C, ch * W + lane * VEC, C); }
        if (lane < 2) { prefetch_l1((lane ? Sall : lseall) + row * H); }
    }
    for (int jj = 0; jj < nr; jj++) {
        // reader j's qg_j (LEAN: at this lane's first channel), lse and S rows (through L1)
        const float *qgj, *lsej, *Sj;
        Packed<VEC> Gp[NCH];
        float G[NCH][VEC], qv[NCH][VEC], p[NCH], e[NCH];   // reader j's G row and qg_j, each read once
        if constexpr (LEAN) {
            cp_async_wait<ROUTE_RING - 2>();   // reader jj's G row is in (this lane's part of it)
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                Gp[ch] = ring[(glean_stage(jj) * NCH + ch) * 32 + lane];
                opaque_words(vraw[ch]);        // v's unpack stays in the loop (v held packed)
                unpack(vraw[ch], vf[ch]);
            }
            opaque_words(dsb);                 // (not recomputed from t in the store's branch)
            issue_lean(jj + ROUTE_RING - 1);   // into the stage of reader jj-1, which this lane has read
            const unsigned jr = (unsigned)__shfl_sync(0xffffffffu, jl, jj);
            qgj = qg + glean_add((unsigned)(lane * (FULL ? 4 : VEC)), jr, (unsigned)C);   // FULL: pair order
            lsej = lseall + glean_add(lsb, jr, NH);   // through L1 (prefetched at the issue)
            Sj = Sall + glean_add(lsb, jr, NH);
        } else {
            const int j = readers[jj];
            const size_t row = (size_t)j * N + t;
            qgj = qg + (size_t)j * C; lsej = lseall + row * H; Sj = Sall + row * H;
            if constexpr (RING) {
                cp_async_wait<ROUTE_RING - 2>();   // reader jj's G row is in (this lane's part of it)
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) { Gp[ch] = ring[((jj & (ROUTE_RING - 1)) * NCH + ch) * 32 + lane]; }
                issue(jj + ROUTE_RING - 1);
            } else {
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) { Gp[ch] = nxt[ch]; }
                if (jj + 1 < nr) {   // prefetch the next reader's G, lse and S
                    size_t rown = (size_t)readers[jj + 1] * N + t;
#pragma unroll
                    for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_lane<VEC>(Gall + rown * C, ch * W + lane * VEC, C); }
                    if (lane < 2) { prefetch_l1((lane ? Sall : lseall) + rown * H); }
                }
            }
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float pd = 0.0f, ed = 0.0f;
            unpack(Gp[ch], G[ch]);
            if constexpr (FULL) { ld_f_pairs(qv[ch], qgj + ch * W); }
            else if constexpr (LEAN) { ld_f(qv[ch], qgj, ch * W, C - lane * VEC); }
            else { ld_f(qv[ch], qgj, ch * W + lane * VEC, C); }
#pragma unroll
            for (int k = 0; k < VEC; k++) { pd += G[ch][k] * vf[ch][k]; ed += qv[ch][k] * vf[ch][k]; }
            p[ch] = pd; e[ch] = ed;
        }
        head_sum<NCH, SEG>(p, geo);
        head_sum<NCH, SEG>(e, geo);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int c0 = ch * W + lane * VEC;
            if (!FULL && c0 >= C) { continue; }
            // out = sum_i a v_i, a = softmax(s): ds = a (p - S);  s = r e
            // a = exp(r e - lse), as 2^((r e - lse) log2 e): one MUFU.EX2 and a multiply
            const float av = exp2f(fmaf(rl, e[ch], -lsej[hd[ch]] * ROUTE_LOG2E));
            const float ds = av * (p[ch] - Sj[hd[ch]]), rds = r * ds;
#pragma unroll
            for (int k = 0; k < VEC; k++) { dv[ch][k] = fmaf(av, G[ch][k], fmaf(rds, qv[ch][k], dv[ch][k])); }
            if (first[ch]) {   // the head's first lane: u_j . v = sum_h ds_h e_h, and ds r
                uv += ds * e[ch];
                if constexpr (LEAN) { dsr[glean_dsr_at(dsb, hd[ch], hd[0], nrp, jj)] = rds; }
                else { dsr[((size_t)t * H + hd[ch]) * nrp + jj] = rds; }   // (N, H, nrp)
            }
        }
    }
    if constexpr (LEAN) {
        cp_async_wait<0>();   // the zero-byte copies of readers nr .. nr + ROUTE_RING - 2 (none may land after exit)
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { unpack(vraw[ch], vf[ch]); }
    }
    // k_i = gamma r_i v_i, r_i = (|v_i|^2/C + eps)^(-1/2): dv -= (r^3 / C) (sum_j u_j . v) v
    const float k3 = r * r * r / C * warp_sum(uv);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * W + lane * VEC;
        if (!FULL && c0 >= C) { continue; }
#pragma unroll
        for (int k = 0; k < VEC; k++) { dv[ch][k] -= k3 * vf[ch][k]; }
        if (chain) {   // slot k+1 = out_k + slot k: the pass-through
            float old[VEC];
            ld_f(old, dslot + (size_t)t * C, c0, C);
#pragma unroll
            for (int k = 0; k < VEC; k++) { dv[ch][k] += old[k]; }
        }
        if (keep32) { st_f(dslot + (size_t)t * C + c0, dv[ch]); }
        if (dslotX) { st_lane(dslotX + (size_t)t * C + c0, dv[ch]); }
    }
}

// dq/dgamma pass of slot k (forward: s[h] = r_k (qg_j[h] . v_k[h]), so qg_j's
// gradient takes ds r v_k): part (P, nr, C) = partition p's sum over its
// ROUTE_PART_ROWS positions of dsr[t, h(c), jj] * v_k[t][c], for every reading
// site jj. Block = 256 threads of CPT adjacent channels (all in one head), so
// 256*CPT channels; grid (ceil(C / (256 CPT)), P). Each thread sums its own
// channels over the partition's positions in position order (no reduction
// inside the block), for up to ROUTE_PARAM_RG readers held in registers (more
// readers: one more pass over the partition per group).
// Positions go in tiles of tp through two cp.async stages of shared memory (the
// tile's v rows (tp, 256 CPT) and dsr rows (tp, H, nrp)); a thread reads four
// readers' ds r per 16-byte broadcast. The padding readers nr .. nrp hold whatever
// the buffer held: their sums are computed and never stored.
#define ROUTE_PARAM_RG 32
template <int CPT>
__global__ void __launch_bounds__(256, 2)
route_slot_param_kernel(float *part, const float *__restrict__ dsr, const floatX *__restrict__ v, int nr, int N, int C,
                        int H, int tp) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int CB = 256 * CPT, VE = 16 / sizeof(floatX);   // channels per block; floatX per 16 bytes
    const int nrp = route_nrp(nr), p = blockIdx.y, cb0 = blockIdx.x * CB, HC = C / H;
    const size_t dsrow = (size_t)H * nrp;                       // floats of dsr per position
    const size_t stage = (size_t)tp * (CB * sizeof(floatX) + dsrow * sizeof(float));   // bytes per stage
    const int cl = threadIdx.x * CPT, c = cb0 + cl, hd = c < C ? c / HC : 0;
    const int t0 = p * ROUTE_PART_ROWS, t1 = min(t0 + ROUTE_PART_ROWS, N);
    const int ncb = min(CB, C - cb0);   // channels of this block
    const bool async = ncb % VE == 0 && C % VE == 0;   // 16-byte copies line up
    auto vs_of = [&](int s) { return reinterpret_cast<floatX *>(smem_raw + s * stage); };              // (tp, CB)
    auto ds_of = [&](int s) { return reinterpret_cast<float *>(smem_raw + s * stage + (size_t)tp * CB * sizeof(floatX)); };
    // tile ta .. ta+tn into stage s, one commit group (empty past the partition)
    auto issue = [&](int s, int ta) {
        if (ta < t1) {
            const int tn = min(tp, t1 - ta);
            floatX *vs = vs_of(s);
            float *ds = ds_of(s);
            if (async) {
                const int nq = ncb / VE;   // 16-byte chunks per row
                for (int q = threadIdx.x; q < tn * nq; q += blockDim.x) {
                    const int t = q / nq, col = q - t * nq;
                    cp_async16(vs + (size_t)t * CB + col * VE, v + (size_t)(ta + t) * C + cb0 + col * VE);
                }
                const float *src = dsr + (size_t)ta * dsrow;   // dsrow is a multiple of 4 floats
                for (size_t i = threadIdx.x; i < tn * dsrow / 4; i += blockDim.x) { cp_async16(ds + 4 * i, src + 4 * i); }
            } else {   // plain copies (this stage is not being read: the previous tile's barrier)
                for (int q = threadIdx.x; q < tn * ncb; q += blockDim.x) {
                    const int t = q / ncb, col = q - t * ncb;
                    vs[(size_t)t * CB + col] = v[(size_t)(ta + t) * C + cb0 + col];
                }
                for (size_t i = threadIdx.x; i < tn * dsrow; i += blockDim.x) { ds[i] = dsr[(size_t)ta * dsrow + i]; }
            }
        }
        cp_async_commit();
    };
    for (int j0 = 0; j0 < nr; j0 += ROUTE_PARAM_RG) {
        float acc[ROUTE_PARAM_RG][CPT];
#pragma unroll
        for (int r = 0; r < ROUTE_PARAM_RG; r++) {
#pragma unroll
            for (int k = 0; k < CPT; k++) { acc[r][k] = 0.0f; }
        }
        __syncthreads();   // the previous reader group's last tile is read
        issue(0, t0);
        for (int ta = t0, s = 0; ta < t1; ta += tp, s ^= 1) {
            issue(s ^ 1, ta + tp);   // the next tile, while this one is summed
            cp_async_wait<1>();
            __syncthreads();         // tile ta is in stage s, from every thread's copies
            const int tn = min(tp, t1 - ta);
            if (c < C) {
                const floatX *vs = vs_of(s);
                const float *ds = ds_of(s) + (size_t)hd * nrp + j0;
                for (int t = 0; t < tn; t++) {
                    float vv[CPT];
                    unpack(*reinterpret_cast<const Packed<CPT> *>(vs + (size_t)t * CB + cl), vv);
                    const float *d = ds + t * dsrow;
#pragma unroll
                    for (int r4 = 0; r4 < ROUTE_PARAM_RG / 4; r4++) {
                        if (j0 + 4 * r4 < nr) {   // block-uniform
                            const float4 d4 = *reinterpret_cast<const float4 *>(d + 4 * r4);
#pragma unroll
                            for (int k = 0; k < CPT; k++) {
                                acc[4 * r4 + 0][k] += d4.x * vv[k];
                                acc[4 * r4 + 1][k] += d4.y * vv[k];
                                acc[4 * r4 + 2][k] += d4.z * vv[k];
                                acc[4 * r4 + 3][k] += d4.w * vv[k];
                            }
                        }
                    }
                }
            }
            __syncthreads();   // stage s is read: the next iteration refills it
        }
        if (c < C) {
#pragma unroll
            for (int r = 0; r < ROUTE_PARAM_RG; r++) {
                if (j0 + r < nr) {
#pragma unroll
                    for (int k = 0; k < CPT; k++) { part[((size_t)p * nr + j0 + r) * C + c + k] = acc[r][k]; }
                }
            }
        }
    }
}

// Positions per tile of route_slot_param_kernel<CPT>, and its shared memory
// (two stages): the largest power of two up to 32 whose two stages fit in 96 KB
// (so that two blocks share an SM)
static int route_param_tile(int CPT, int nr, int H, size_t *smem) {
    const size_t row = 256 * (size_t)CPT * sizeof(floatX) + (size_t)H * route_nrp(nr) * sizeof(float);
    int tp = 32;
    while (tp > 1 && 2 * tp * row > 96 * 1024) { tp /= 2; }
    *smem = 2 * tp * row;
    return tp;
}

// Launches route_slot_param_kernel<CPT> over P partitions of positions (grid:
// 256 * CPT channels per block), raising its shared-memory limit when a tile needs more
template <int CPT>
static void route_slot_param(float *part, const float *dsr, const floatX *v, int nr, size_t N, unsigned P,
                             const RouteGeo &geo) {
    size_t smem;
    int tp = route_param_tile(CPT, nr, geo.H, &smem);
    static size_t smem_set = 0;
    if (smem > smem_set) {
        cudaCheck(cudaFuncSetAttribute(route_slot_param_kernel<CPT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
        smem_set = smem;
    }
    route_slot_param_kernel<CPT><<<dim3(ceil_div(geo.C, 256 * CPT), P), 256, smem>>>(part, dsr, v, nr, (int)N, geo.C,
                                                                                     geo.H, tp);
    launchCheck();
}

// The q/gamma pass on tensor cores (lab v16; bf16 build): per head the pass is a matrix
// product, QV^T (readers x channels) = DSR^T (readers x positions) V (positions x channels)
// over a partition of positions, here on mma.sync m16n8k16 (fragment layouts: the flash
// attention kernels' comment): M = readers (two m-tiles, nr <= 32), N = channels (warp w:
// channels 64 w .. of the block's 512), K = positions (16 a stage, two stages of shared
// memory filled by cp.async, zeros past the partition). ds r is fp32: it goes in as two
// bf16 parts, hi = bf16(x) and lo = bf16(x - hi) (two products, 16 bits of mantissa); v is
// bf16 already and comes through ldmatrix.trans. The same partials as route_slot_param_kernel,
// part (P, nr, C), over partitions of `rows` positions (ROUTE_PART_ROWS = 128, a multiple of
// ROUTE_QG_TC_TP: the partials' buffer holds ceil(N / 128) partitions).
#define ROUTE_QG_TC_TP 16   // positions a stage (one k-step)
// dsr's row stride in shared memory (floats): H nrp padded to 4 mod 32, so that a fragment's
// 8 readers x 4 positions hit 32 distinct banks; and the bytes of one stage (v rows, then dsr rows)
__host__ __device__ __forceinline__ int route_qg_tc_ps(int H, int nrp) {
    const int hn = H * nrp;
    return hn + (((4 - hn) % 32) + 32) % 32;
}
__host__ __device__ __forceinline__ size_t route_qg_tc_stage(int C, int H, int nr) {
    const int CB = C < 512 ? C : 512;
    return (size_t)ROUTE_QG_TC_TP * (CB + 8) * 2 + (size_t)ROUTE_QG_TC_TP * route_qg_tc_ps(H, route_nrp(nr)) * 4;
}
// The shapes it takes: 64-channel warps, 8-channel n-tiles inside the heads, two m-tiles of readers
static bool route_qg_tc_fits(int C, int H, int nr) {
    return sizeof(floatX) == 2 && C % 64 == 0 && (C / H) % 8 == 0 && nr >= 1 && nr <= 32 &&
           2 * route_qg_tc_stage(C, H, nr) <= 200 * 1024;
}

#ifndef PRECISION_FP32
// x0, x1 (fp32) -> bf16x2 hi and lo parts (x0 in the low halves)
__device__ __forceinline__ void split2_bf16(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = pack_bf16(x0 - hf.x, x1 - hf.y);
}

// part (P, nr, C) = partition p's sum over its positions t of dsr[t, h(c), jj] * v_k[t][c],
// for every reader jj. Grid (ceil(C / 512), P), 256 threads. A (readers x positions) of
// head h, m-tile mt: reg0 = (reader 16 mt + g, positions 2q, 2q+1), reg1 = reader + 8,
// reg2 = positions + 8, reg3 = both; readers past nr are zeros (dsr's padding readers
// [nr, nrp) hold whatever the buffer held and are never read). B (positions x channels):
// the stage's v rows, by ldmatrix.trans, two n-tiles of 8 channels at a time. Two blocks an SM.
__global__ void __launch_bounds__(256, 2)
route_slot_param_tc_kernel(float *part, const float *__restrict__ dsr, const floatX *__restrict__ v, int nr, int N,
                           int C, int H, int rows) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int TP = ROUTE_QG_TC_TP;
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, q = lane % 4;
    const int nrp = route_nrp(nr), HN = H * nrp, PS = route_qg_tc_ps(H, nrp), HC = C / H;
    const int cb0 = blockIdx.x * 512, CB = min(512, C - cb0), LDV = CB + 8, p = blockIdx.y;
    const int t0 = p * rows, t1 = min(t0 + rows, N), mtn = (nr + 15) / 16, cw = w * 64;
    const size_t vbytes = (size_t)TP * LDV * 2, stage = route_qg_tc_stage(C, H, nr);
    auto vs_of = [&](int s) { return reinterpret_cast<bf16 *>(smem_raw + s * stage); };
    auto ds_of = [&](int s) { return reinterpret_cast<float *>(smem_raw + s * stage + vbytes); };
    auto issue = [&](int s, int ta) {   // positions ta .. ta+TP into stage s (zeros past t1); one commit group
        if (ta < t1) {
            bf16 *vs = vs_of(s);
            float *ds = ds_of(s);
            const int nq = CB / 8, nd = HN / 4;   // 16-byte pieces of a v row, of a dsr row
            for (int i = threadIdx.x; i < TP * nq; i += blockDim.x) {
                const int t = i / nq, col = i - t * nq;
                const bool ok = ta + t < t1;
                cp_async16z((uint32_t)__cvta_generic_to_shared(vs + t * LDV + col * 8),
                            v + (size_t)(ok ? ta + t : t0) * C + cb0 + col * 8, ok ? 16u : 0u);
            }
            for (int i = threadIdx.x; i < TP * nd; i += blockDim.x) {
                const int t = i / nd, col = i - t * nd;
                const bool ok = ta + t < t1;
                cp_async16z((uint32_t)__cvta_generic_to_shared(ds + t * PS + col * 4),
                            dsr + (size_t)(ok ? ta + t : t0) * HN + col * 4, ok ? 16u : 0u);
            }
        }
        cp_async_commit();
    };
    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int nt = 0; nt < 8; nt++) { acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f; }
    }
    const bool wlive = cw < CB;   // warp-uniform
    issue(0, t0);
    for (int ta = t0, s = 0; ta < t1; ta += TP, s ^= 1) {
        issue(s ^ 1, ta + TP);   // the next stage, while this one is summed
        cp_async_wait<1>();
        __syncthreads();         // stage s is in, from every thread's copies
        if (wlive) {
            const float *ds = ds_of(s);
            uint32_t bb[4][4];   // B of n-tiles 2 nn (bb[nn][0..1]) and 2 nn + 1 (bb[nn][2..3])
#pragma unroll
            for (int nn = 0; nn < 4; nn++) { ldsm_x4_t(bb[nn], bt_addr(vs_of(s), LDV, 0, cw + nn * 16, lane)); }
            int hprev = -1;
            uint32_t ah[2][4], al[2][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const int h = (cb0 + cw + nt * 8) / HC;
                if (h != hprev) {   // A of head h (warp-uniform): ds r of the stage's positions, hi and lo
                    hprev = h;
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
                        for (int reg = 0; reg < 4; reg++) {
                            const int jj = 16 * mt + g + (reg & 1) * 8, t = 2 * q + (reg >> 1) * 8;
                            const float x0 = jj < nr ? ds[t * PS + h * nrp + jj] : 0.0f;
                            const float x1 = jj < nr ? ds[(t + 1) * PS + h * nrp + jj] : 0.0f;
                            split2_bf16(x0, x1, ah[mt][reg], al[mt][reg]);
                        }
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    if (mt < mtn) {
                        mma16816(acc[mt][nt], ah[mt], bb[nt / 2][(nt % 2) * 2], bb[nt / 2][(nt % 2) * 2 + 1]);
                        mma16816(acc[mt][nt], al[mt], bb[nt / 2][(nt % 2) * 2], bb[nt / 2][(nt % 2) * 2 + 1]);
                    }
                }
            }
        }
        __syncthreads();   // stage s is read: the next iteration refills it
    }
    cp_async_wait<0>();
    if (!wlive) { return; }
    // D (reader 16 mt + g + 8 half, channels cb0 + cw + 8 nt + 2q, +1)
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int jj = 16 * mt + g + 8 * half;
                if (mt < mtn && jj < nr) {
                    *reinterpret_cast<float2 *>(part + ((size_t)p * nr + jj) * C + cb0 + cw + nt * 8 + 2 * q) =
                        make_float2(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
                }
            }
        }
    }
}
#endif

// Launches route_slot_param_tc_kernel over ceil(N / rows) partitions (returned), raising
// its shared-memory limit when a slot needs more
static unsigned route_slot_param_tc(float *part, const float *dsr, const floatX *v, int nr, size_t N, int rows,
                                    const RouteGeo &geo) {
    const unsigned P = ceil_div(N, rows);
#ifndef PRECISION_FP32
    const size_t smem = 2 * route_qg_tc_stage(geo.C, geo.H, nr);
    static size_t smem_set = 0;
    if (smem > smem_set) {
        cudaCheck(cudaFuncSetAttribute(route_slot_param_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = smem;
    }
    route_slot_param_tc_kernel<<<dim3(ceil_div(geo.C, 512), P), 256, smem>>>(part, dsr, v, nr, (int)N, geo.C, geo.H,
                                                                             rows);
    launchCheck();
#else
    (void)part; (void)dsr; (void)v; (void)nr; (void)rows; (void)geo;
    die("internal: the tensor-core q/gamma pass is bf16 only");
#endif
    return P;
}

// Launches route_slot_backward_kernel<VEC, NCH, SEG, LEAN, FULL>, raising its shared-memory limit once
template <int VEC, int NCH, int SEG, bool LEAN, bool FULL = false>
static void route_slot_backward_launch(float *dslot, floatX *dslotX, float *dsr, const floatX *v, const float *r,
                                       const floatX *G, const float *S, const float *lse, const int *readers, int nr,
                                       const float *qg, int chain, int keep32, size_t N, const RouteGeo &geo) {
    constexpr size_t smem = route_ring_smem<VEC, NCH>();   // both paths: the ring of G rows only
    static bool limit_set = false;
    route_smem_limit(route_slot_backward_kernel<VEC, NCH, SEG, LEAN, FULL>, smem, limit_set);
    route_slot_backward_kernel<VEC, NCH, SEG, LEAN, FULL><<<ceil_div(N, 8), 256, smem>>>(
        dslot, dslotX, dsr, v, r, G, S, lse, readers, nr, qg, chain, keep32, (int)N, (unsigned)(N * geo.C),
        (unsigned)(N * geo.H), geo);
}

// Backward of every routing site into slot k's gradient (see the kernel above),
// given the G, S of every site j >= k (J sites) and the forward's lse: writes dslot (N, C)
// when keep32 (adding the dslot_{k+1} it holds when chain), its floatX copy dslotX (N, C)
// unless NULL, and dsr (N, H, nrp): ds r of each of the nr readers, for route_slot_qgamma.
// v (N, C) and r (N) are slot k's; readers (nr) are the sites that read it (device). The
// gather takes its lean path where route_gather_lean holds (per slot; its FULL instance
// where C = NCH 32 VEC, reading qgp: qg (J, C) in pair order, route_qg_forward); every path
// computes the same sums in the same order.
void route_slot_backward(float *dslot, floatX *dslotX, float *dsr, const floatX *v, const float *r, const floatX *G,
                         const float *S, const float *lse, const int *readers, int nr, const float *qg,
                         const float *qgp, int chain, int keep32, size_t N, size_t J, const RouteGeo &geo) {
    route_dispatch(geo, [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NCH = decltype(lanes)::nch, SEG = decltype(lanes)::seg;
        if constexpr (route_ring<VEC>()) {
            if (route_gather_lean(geo, nr, N, J)) {   // FULL where every lane's packs are live
                if (geo.C == NCH * 32 * VEC) {
                    route_slot_backward_launch<VEC, NCH, SEG, true, true>(dslot, dslotX, dsr, v, r, G, S, lse, readers,
                                                                          nr, qgp, chain, keep32, N, geo);
                } else {
                    route_slot_backward_launch<VEC, NCH, SEG, true>(dslot, dslotX, dsr, v, r, G, S, lse, readers, nr,
                                                                    qg, chain, keep32, N, geo);
                }
                return;
            }
        }
        route_slot_backward_launch<VEC, NCH, SEG, false>(dslot, dslotX, dsr, v, r, G, S, lse, readers, nr, qg, chain,
                                                         keep32, N, geo);
    });
    launchCheck();
}

// The q/gamma pass of slot k, after its gather: s[h,i] = r_i sum_c q gamma v_i, so
// dq += gamma sum_t ds r v and dgamma += q sum_t ds r v. Writes, for each of the nr
// readers, the pair's qv (C) = sum over positions of ds r v_k (rows rd_pair, device),
// from dsr (N, H, nrp) and slot k's v (N, C); qpart (ceil(N/128) * nr * C) is scratch.
// The one predicate route_qg_tc_fits (bf16, C a multiple of 64, heads of 8 channels or
// more, at most 32 readers): on tensor cores (fast), else on the CUDA cores (fallback,
// route_slot_param_kernel: fp32 and the other shapes); both over partitions of
// ROUTE_PART_ROWS positions. The pass runs on the one stream, after the gather.
void route_slot_qgamma(float *qv, float *qpart, const float *dsr, const floatX *v, const int *rd_pair, int nr,
                       size_t N, const RouteGeo &geo) {
    unsigned P = ceil_div(N, ROUTE_PART_ROWS);
    if (route_qg_tc_fits(geo.C, geo.H, nr)) { P = route_slot_param_tc(qpart, dsr, v, nr, N, ROUTE_PART_ROWS, geo); }
    else if ((geo.C / geo.H) % 2 == 0) { route_slot_param<2>(qpart, dsr, v, nr, N, P, geo); }   // two channels a thread, of one head
    else { route_slot_param<1>(qpart, dsr, v, nr, N, P, geo); }
    // qv[rd_pair[jj]] (C) = the sum over the P partitions of reader jj's partials
    route_reduce_parts(qv, qpart, rd_pair, (int)P, nr, geo.C, 0);
}

// The lean gather's index math on the CPU, for a model's layout, slots and N: the
// glean_* functions and lane_heads as the kernel calls them against the 64-bit
// formulas, for every lean slot, reader (and the zero-byte copies after them), lane
// and chunk, at positions 0, 1, N/2, N-2, N-1: G pack, head and head-first flag,
// lse/S entry (in bounds), qg channels, dsr entry, reader lane and ring stage.
// Returns the number of slots on the lean path; dies on a mismatch. rd (J, J) host.
static int route_gather_index_check(const RouteGeo &geo, const int *rd, const int *slot_nr, size_t J, size_t N) {
    int lean = 0;
    route_dispatch(geo, [&](auto lanes) {
        constexpr int VEC = decltype(lanes)::vec, NCH = decltype(lanes)::nch, SEG = decltype(lanes)::seg;
        if constexpr (route_ring<VEC>()) {
            const int C = geo.C, H = geo.H, HC = C / H, W = 32 * VEC;
            const unsigned NC = (unsigned)(N * C), NH = (unsigned)(N * H);
            const size_t ts[5] = {0, 1, N / 2, N - 2, N - 1};
            auto fail = [&](const char *what, size_t k, int i, size_t t, int lane, int ch) {
                die("route_gather_index_check: %s (C=%d H=%d VEC=%d NCH=%d SEG=%d, slot %zu, reader %d, position %zu, "
                    "lane %d, chunk %d)", what, C, H, VEC, NCH, SEG, k, i, t, lane, ch);
            };
            for (size_t k = 0; k < J; k++) {
                const int nr = slot_nr[k], nrp = route_nrp(nr);
                if (!route_gather_lean(geo, nr, N, J)) { continue; }
                lean++;
                for (int i = 0; i < nr + ROUTE_RING - 1; i++) {   // reader i: issued at iteration i - ROUTE_RING + 1
                    const int it = i - (ROUTE_RING - 1);           // (the prologue: it < 0)
                    for (int x = (it > 0 ? it : 0); x < i; x++) {  // read at it (after the G row), or pending
                        if (glean_stage(x) == glean_stage(i)) { fail("stage in use", k, i, 0, -1, -1); }
                    }
                    const int sl = glean_src_lane(i);
                    if (i < nr && sl != i) { fail("reader's lane", k, i, 0, -1, -1); }
                    const size_t j = sl < nr ? (size_t)rd[k * J + sl] : 0;   // lane sl's site (kernel: jl)
                    if (j >= J || (i < nr && j != (size_t)rd[k * J + i])) { fail("reader's site", k, i, 0, -1, -1); }
                    for (int q = 0; q < 5; q++) {
                        const size_t t = ts[q] < N ? ts[q] : N - 1, row = j * N + t;
                        for (int lane = 0; lane < 32; lane++) {
                            int hd[NCH];
                            bool first[NCH];
                            lane_heads<VEC, NCH, SEG>(hd, first, lane, geo);
                            const unsigned gl = glean_row((unsigned)t, lane, C, VEC);
                            if ((size_t)glean_add(glean_ls((unsigned)t, lane, H), (unsigned)j, NH) >= J * N * H) {
                                fail("lse/S entry out of bounds", k, i, t, lane, -1);
                            }
                            for (int ch = 0; ch < NCH; ch++) {
                                const int c0 = ch * W + lane * VEC;
                                const bool live = glean_live(ch, lane, C, VEC);
                                const size_t g = (size_t)glean_add(gl, (unsigned)j, NC) + glean_chunk(ch, lane, C, VEC);
                                if (live != (c0 < C)) { fail("live chunk", k, i, t, lane, ch); }
                                if (live && g != row * C + c0) { fail("G pack", k, i, t, lane, ch); }
                                if (!live && (g < row * C || g + VEC > (row + 1) * C || g % VEC != 0)) {
                                    fail("zero-byte G copy's address", k, i, t, lane, ch);
                                }
                                if (hd[ch] < 0 || hd[ch] >= 32) { fail("head beyond 32", k, i, t, lane, ch); }
                                if (i >= nr || !live) { continue; }
                                if (hd[ch] != c0 / HC || first[ch] != (c0 % HC == 0)) { fail("head", k, i, t, lane, ch); }
                                // the entry the kernel reads: glean_ls(t, 0, H) + j N H + hd (= glean_ls(t, hd, H) + j N H)
                                if ((size_t)glean_add(glean_ls((unsigned)t, hd[ch], H), (unsigned)j, NH) != row * H + hd[ch]) {
                                    fail("lse/S entry", k, i, t, lane, ch);
                                }
                                if ((size_t)glean_add((unsigned)(lane * VEC), (unsigned)j, (unsigned)C) + ch * W != j * C + c0) {
                                    fail("qg", k, i, t, lane, ch);
                                }
                                if ((size_t)glean_dsr_at(glean_dsr((unsigned)t, hd[0], H, nrp), hd[ch], hd[0], nrp, i) !=
                                    (t * H + hd[ch]) * (size_t)nrp + i) {
                                    fail("dsr entry", k, i, t, lane, ch);
                                }
                            }
                        }
                    }
                }
            }
        }
    });
    return lean;
}

// dq_j[c] += gamma_j[c] * s, dgamma_j[c] += q_j[c] * s, where s sums site j's
// pairs qv[pair_off[j] .. pair_off[j+1]) in source order. Grid (C/256, J).
__global__ void route_param_backward_kernel(float *dq, float *dgamma, const float *qv, const int *pair_off,
                                            const floatX *q, const floatX *gamma, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y;
    if (c >= C) { return; }
    float s = 0.0f;
    for (int pr = pair_off[j]; pr < pair_off[j + 1]; pr++) { s += qv[(size_t)pr * C + c]; }
    size_t o = (size_t)j * C + c;
    dq[o] += toF(gamma[o]) * s;
    dgamma[o] += toF(q[o]) * s;
}

// dq, dgamma (J, C) += the routing query and key-norm gradients of every site,
// from the per-pair sums qv (pairs, C) of the slot gathers (all slots done).
// q, gamma (J, C); pair_off (J+1) on the device.
void route_param_backward(float *dq, float *dgamma, const float *qv, const int *pair_off, const floatX *q,
                          const floatX *gamma, int J, int C) {
    route_param_backward_kernel<<<dim3(ceil_div(C, 256), J), 256>>>(dq, dgamma, qv, pair_off, q, gamma, C);
    launchCheck();
}
