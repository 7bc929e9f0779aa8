/*
dev/cuda/hc.cu: kernel lab for hyper-connections (SPEC section 8, hc mode): the n residual
streams' update and read, and (v3) the read's pre-norm, forward and backward, at the boundary
between two sublayers.

Build (from the repository root; or `make lab`):
    nvcc -O3 -arch=sm_90a -o dev/cuda/hc dev/cuda/hc.cu
Run:
    ./hc --cpu-selftest            the fp64 references' backwards vs central differences, and v3's
                                   fp32 emulation against the references; no GPU needed
    ./hc --bytes                   bytes per position per sublayer and a step's floors (100m); no GPU needed
    ./hc --dxp-chain               what bf16 or 24-bit stream gradients lose over 24 boundaries; no GPU needed
    ./hc --op OP --version N --check   version N of OP against the fp64 reference, twice
                                       (the two runs must be bit-identical)
    ./hc --op OP --version N --bench   version N of OP timed at the 100m shape
    ./hc --all                     --check and --bench of every op and version
  OP: fwd, bwd; without --op: both. Without --version: every version (1, 2, 3, 5, 6, 7, 8, 9,
  10, 12, 15, 16, 17; v5 to v12 are backwards only, their forward is v3's; v15 is a forward alone,
  v17 a backward alone; v4 is in commit 7959a47, v11 in commit 634d014, v13 and v14 in commit
  d267c89, each merged and reverted, measured and not kept).
  options: --seed S (inputs; default 1234), --reps R (timed repeats, default 20),
           --quick (--check on the first two shapes only)

The ops (kernels/hc.cuh gives the formulas): streams X (N, n, C) bf16, a position's n streams adjacent.
  fwd   X_j, o_j (N, C) bf16, A_j (n, n), beta_j (n), w_{j+1} (n):
        X_{j+1} = A X + beta o (bf16), h_{j+1} = sum_r w[r] X_{j+1,r}: v1, v2 write h (bf16);
        v3 also takes the norm weight g (C) and writes u = rmsnorm(h; g) (bf16) and rstd (N)
        fp32 instead (h stays in registers).
  bwd   dXp (N, n, C) fp32 = A_j^T dX_{j+1}, X_j, w_j, X_{j-1}, o_{j-1}, A_{j-1}, beta_{j-1}, and
        v1, v2: dh_j (N, C) fp32; v3: du_j (N, C) fp32, rstd (N), g (C), with dh_j = the norm's
        backward of du_j, h_j recomputed from X_j:
        dXp <- A_{j-1}^T dX_j with dX_j = dXp + w_j dh_j; dout_{j-1} = beta_{j-1} . dX_j (bf16);
        dw_j, dA_{j-1}, dbeta_{j-1} (v3: and dg_j, dalpha_j) += sums over positions (deterministic).
  100m: N = 16 * 2048 = 32768, C = 512, n = 4; 24 sublayer boundaries a step each way.

Storage, decided here: the streams are bf16 (floatX), like the std trainer's slots (the residual
stream x_j is a floatX slot of (N, C)); their gradient dXp is fp32, like std's running dres, since
it accumulates across all later sublayers. fp32 streams would double the streams' memory (8 KiB
per position per sublayer instead of 4 at n = 4) and the forward's bytes.

Versions:
  v1  one thread per (position, channel), unfused: fwd = an update kernel, then a read kernel
      (reading X_{j+1} back); bwd = an elementwise kernel writing dX_j (fp32, a temporary) and
      the new dXp and dout, then a parameter kernel (one block per part of positions, reading
      dh, X_j, dX_j, X_{j-1}, o_{j-1} again) and the reduction (one thread per column, serial
      over the partials: hc_reduce_v1_kernel).
  v2  (the trainer's before v3; here with the names _v2) one warp per position, 16-byte packs,
      the n x n mix in registers; the update and the next read in one pass (fwd); the read's
      backward, the update's backward and the parameter sums in one pass (bwd), then v1's
      reduction. The trainer ran std's norm kernels beside it: rmsnorm_forward of the stored
      h, and rmsnorm_backward_residual into an fp32 dh (N, C), then v2's bwd read dh; then
      a memset and a softmax-backward launch for dalpha. --check of v2 also runs the
      trainer's edge paths (check_edges_v2: X_0 as the embedding alone, the final site, the
      first sublayer).
  v3  kernels/hc.cuh: v2 with the pre-norm fused into both kernels. fwd: h stays in registers
      (NPK 16-byte packs per lane, a template parameter: C <= 2048), the warp sums h^2, and
      u and rstd are written as std's norm computes them (rmsnorm.cuh: s = 1 / sqrtf(mean +
      1e-6), u = h s g). bwd: a first pass over the row reads X_j and du, recomputes h in the
      forward's fp32 order, and keeps h and du g in registers while the warp sums du g h
      (k3 = s^3 / C of it); it also sums, per lane, du g . X_r and h . X_r, so that dw_r =
      dh . X_r = s (du g . X_r) - k3 (h . X_r) needs no second read of X_j; the norm weight's
      gradient du h s goes into a per-warp share in shared memory (lane-major: no bank
      conflicts). The second pass is v2's body with dh = s du g - k3 h. Each lane sums its
      parameter terms over the warp's positions (v2 summed the warp per position), then the
      lanes, then the warps in order into the block's partials: (P, 2n + n^2) and (P, C).
      One reduction launch (hc_reduce_v3_kernel) sums every column with std's scheme (32
      partial lanes, then lane order) and adds the softmax's backward into dalpha. A sublayer
      boundary is then 1 kernel forward and 2 backward, against v2's trainer path of 2 and 6.
      --check of v3 runs check_edges_v3 (the trainer's calls: sublayer 0's update from the
      embedding, site 0's read and norm alone, the final site, xpb, site 0's backward).
      ptxas (sm_90a, CUDA 13) at n = 4, C = 512 (NPK 2): fwd 73, bwd 128 registers, no spills
      (v2 with the same compiler: fwd 80, bwd 148). n = 8 at C > 512 and n = 4 at C = 2048
      spill in the bwd (correct, slower; 100m runs n = 4, C = 512).
      Since v5 the v3 backward lives here with the names _v3; its forward is kernels/hc.cuh's.
  v5  the trainer's backward before v9 (here with the names _v5 since): v3's, except that it
      does not read X_j. X_j is the update
      of X_{j-1} and o_{j-1}, which the backward reads anyway (for dA, dbeta and dXp), so its
      first pass recomputes X_j from them with the forward's arithmetic (hc_update_at: one
      product, then fused multiply-adds in stream order, then the bf16 rounding), which gives
      the stored bits exactly; the second pass reads X_{j-1} and o_{j-1} again, from L1 or L2.
      DRAM bytes: (10n + 8) C instead of (12n + 8) C, 24 KiB at 100m instead of 28. The inputs
      here are therefore consistent (make_inputs draws Xprev and o and computes X from them,
      as the forward would), and --check of v5 runs v3 first on the same inputs and requires
      v5's outputs to be v3's bits. In the trainer the last streams X_{2L} are then read by
      nobody: the forward does not write them (Xn = NULL, checked in the edges).
  v6  v5 with the position's dXp rows staged in shared memory by cp.async when the position
      starts (64 KiB a block at 100m), so that their DRAM round trip overlaps the first pass
      instead of following the row's sums. v5's bits (--check requires them).
  v7  v6 with the copies issued one position ahead (when the warp finishes the previous one).
  v8  v5 with dXp stored in 24 bits a value (fp32 rounded to nearest even at bit 8; the top 16
      bits in a uint16 array, the next 8 in a uint8 array): (8n + 8) C bytes a position, 20 KiB
      at 100m. On the same 24-bit inputs its outputs are v5's bits, dXp_out v5's rounded to 24
      bits (--check requires both); the reference check allows dXp the extra 2^-17 rounding.
      None of v6..v8 is in the trainer: NOTES_hc.md ("v6, v7, v8") has their measurements.
  v9  kernels/hc.cuh's backward: v5 with each position split over a pair of warps, each
      holding half of the row's channels (half 0 the first 8 ceil(C / 16)), so that a lane
      keeps half as many packs: 96 registers at n = 4, C = 512 without spills (v5: 127), blocks
      of 4 warps, 4 an SM (16 warps, as v5: the barrier id in a register reserves all 16 of a
      block's barriers; 5 blocks, with immediate ids, measured slower: NOTES_hc.md, "v9").
      The row's sum for the norm's k3 is the two halves' warp sums, exchanged through shared
      memory at a named barrier of the pair.
      Its sums over the channels are in another order than v5's, so --check holds it to the
      fp64 reference alone (v5's tolerances), and runs the edges.
  v10 kernels/hc.cuh's backward with the bf16 trainer's storage of dXp: v9 with v8's 24 bits a
      value (HcGrad24; v9 is the same kernel with HcGradF32, the fp32 trainer's). On the same
      24-bit inputs its outputs are v9's bits and dXp_out v9's rounded to 24 bits (--check
      requires both); against the reference dXp gets v8's allowance (2^-17 of the value), in
      the edges too (dXp encoded before the call, decoded after). The lab keeps v10's packing
      (shifts and masks) as the storage type HcGrad24v10 below.
  v12 kernels/hc.cuh's backward: v10 with the 24-bit values packed and unpacked by byte
      permutes (HcGrad24: 1.5 instructions a value to load, about 6 to round and store; v10's
      shifts and masks took about 5 and 11). The same format and arithmetic: --check requires
      v10's bits, dXp_out included.
  v15 kernels/hc.cuh's forward: v3's kernel at more warps an SM, blocks of 4 warps, 6 an SM
      (80 registers at n = 4, C = 512, no spills, 24 warps; v3: 112, 2 blocks of 8, 16 warps).
      --check requires v3's bits, and --bench times v3, v15 and two others beside them (8 warps
      3 blocks, 4 warps 5 blocks). The lab keeps its kernel as hc_update_read_norm_v15_kernel.
  v16 kernels/hc.cuh's forward and backward: v15 and v12 with fewer instructions, the same bits.
      Both round their values to bf16 in pairs (cvt.rn.bf16x2.f32, one conversion for two: Xn
      and u in the forward, X_j's recompute in the backward). The forward loads the norm weight
      before the row's sum instead of after it. The backward keeps, in registers across its
      positions, the norm weight (loaded once) and the lane's shares of its gradient (v12 added
      them in shared memory at every position), and o_{j-1} across the pair's barrier (v12
      loaded it in both passes); that takes 127 registers, the most that 4 blocks an SM allow,
      and the barriers hold it to 4 anyway (v12 asked for 5 and took 96). --check requires v3's
      bits of the forward (with v15's variants) and v12's bits of the backward, dXp_out included,
      and runs the edges. The lab keeps v12's kernel as hc_norm_read_update_backward_v12_kernel.
  v17 kernels/hc.cuh's backward: v16 with each position's inputs staged one position ahead. Where
      a lane holds one pack and dXp is in 24 bits (the bf16 build at C <= 512), it copies the next
      position's X_{j-1}, o, du and dXp into its warp's shared memory by cp.async (6.5 KiB a warp
      at n = 4; two stages, 52 KiB a block) and loads its rstd, then computes the current one from
      the other stage: v16 waited on those loads at the start of both passes, and reloaded X_{j-1}
      from L1 in pass 2. The same arithmetic: --check requires v16's bits, dXp_out included, and
      runs the edges. The lab keeps v16's kernel as hc_norm_read_update_backward_v16_kernel.

Bytes per position per sublayer (n = 4, C = 512), the floor of each op (--bytes):
  fwd v2: reads X (2nC) and o (2C), writes X' (2nC) and h (2C): (4n + 4) C = 10 KiB
  bwd v2: reads dXp (4nC), dh (4C), X_j (2nC), X_{j-1} (2nC), o (2C), writes dXp (4nC), dout (2C):
          (12n + 8) C = 28 KiB
  v2's trainer path adds std's norm kernels: fwd reads h, writes u (4C: 2 KiB), bwd reads du and
          h, writes dh (10C: 5 KiB): 12 + 33 = 45 KiB.
  v3: fwd reads X, o, writes X' and u (+ rstd): 10 KiB; bwd reads dXp, du (4C), X_j, X_{j-1}, o
          (+ rstd), writes dXp, dout: 28 KiB. 38 KiB in all.
  v5: bwd as v3 without X_j: (10n + 8) C = 24 KiB; with v3's forward 34 KiB in all.
  std's residual path at the same places (dev/cuda/residual.cu v2): fwd 4 KiB (x, out, y, u; the
  norm included), bwd 8 KiB. Over std's: v2 path +33 KiB, v3 +26 KiB a position a sublayer:
  24 x 32768 x 26 KiB = 21 GB a micro-step, 5.2 ms at 4.0 TB/s (v2 path 6.6 ms).

Against the goals (memory at most 1.3x std, speed at least 0.90x std tokens/s at 100m, B = 16):
NOTES_hc.md has the measurements: in one session std 700K tokens/s and 12.0 GiB, hc v2 585K and
16.1 GiB (0.836x, 1.34x); dev/bench_gpu.sh's std 685K, 12.04 GiB. Predictions for v3, not yet
measured:
  memory: the h rows (25 sites x N x C bf16 = 0.78 GiB) and the fp32 dh (N x C, 64 MiB) leave;
     the partials grow by P x C floats (2 MiB): 16.1 - 0.84 = ~15.3 GiB, ~1.27x std.
  time: the v2 path's std-norm passes (fwd 2 KiB, bwd 5 KiB of the 45 a position), the h
     write, and 4 of the 8 launches a boundary leave. v2's reduction is one thread per column
     serial over P = 1024 partials (L2 latency bound: tens of microseconds a call, if the
     loads pipeline 4 deep, ~1 ms a step); v3's is 32 lanes a column. The v2 trainer path
     took 9.2 ms a step over std's in that session (56.0 - 46.8 ms; 8.2 ms against
     bench_gpu.sh's 47.8 ms), 1.23x .. 1.39x its 6.6 ms byte floor. The same ratios on v3's
     5.2 ms give +6.5 .. +7.3 ms: 0.865x .. 0.88x; with the reduction's saving as estimated,
     0.88x .. 0.90x. So v3 reaches the memory goal and is at the edge of the speed goal or
     below it; the device run decides.
  bf16 stream gradients dXp would take the bwd to (8n + 8) C = 20 KiB (+18 KiB over std's,
     3.6 ms at the floor: ~0.92x). Not done: dXp accumulates the gradient of every later
     sublayer and would be rounded at each of the 24 boundaries. --dxp-chain measures it on
     the host (24 boundaries, test_mhar's hc parameters, against the fp64 chain; seeds 1, 7,
     99): the embedding's gradient is off by 8.6e-3 .. 9.5e-3 normwise with bf16 dXp (fp32:
     3.0e-7 .. 4.8e-7), dA by up to 3.6e-3 .. 9.4e-3, i.e. 2 to 2.4 bf16 roundings (2^-8 =
     3.9e-3) where fp32 dXp adds nothing measurable; std keeps its running dres in fp32 for
     the same reason. The accuracy does not hold at fp32's level, so dXp stays fp32. (Since
     v10 the bf16 trainer stores it in 24 bits: --dxp-chain gives 2.8e-5 .. 3.9e-5 for the
     embedding's gradient and up to 3.6e-5 for dA, a hundredth of one bf16 rounding.)
  Storing no streams at all is possible: A, beta, alpha do not depend on the input, so X_j is a
  fixed linear mix of the embedding and o_0 .. o_{j-1} (the slots the trainer keeps anyway), with
  n x (j+1) coefficients per sublayer; the read h_j is then a static AttnRes-like mix of all
  earlier slots (memory of std, bytes like full mhar's routing).

Tolerances (rel = max|gpu - ref| / max|ref|; PASS needs every |gpu - ref| <= rtol |ref| + atol max|ref|).
The reference computes in fp64 from the bf16 inputs:
  - X' (bf16): rtol 2^-7, atol 1e-6: A X + beta o in fp32 (n + 1 terms), rounded once; the
    reference rounds its fp64 sum too, and where the two sums straddle a rounding boundary they
    land one bf16 ulp apart, up to 2^-7 of the value (NOTES_hc.md: the first H200 run failed a
    2^-8 bound this way).
  - h (bf16, v1 v2): rtol 2^-7 + atol 2^-8: h is summed from the rounded X' (each off by 2^-8) and
    rounded. The reference rounds X' to bf16 too (as the kernel does), so this is h's own rounding
    plus fp32.
  - u (bf16, v3): rtol 2^-8, atol 1e-5, against the fp64 norm of h = sum_r w[r] X'_r of the
    kernel's own X' (so an X' rounding that the X' check allows does not count again): before
    its rounding u carries fp32 error only (h: n terms; the mean square: C terms of one sign,
    within (C/32 + 5) 2^-24 relative; sqrtf and the division correctly rounded: u within ~2e-6
    of itself relative, and h's cancellation within n 2^-24 max|X| absolute), and rounding to
    bf16 moves it by at most 2^-8 of itself; 1e-5 of max|u| covers the fp32 part.
  - rstd (fp32, v3): rtol 1e-5, atol 0: the same fp32 error, ~2e-6 relative.
  - dXp, dX (fp32): rtol 1e-5, atol 1e-6: fp32 sums of n + 1 terms; v3's dh adds the norm
    backward's fp32 error: s du g - k3 h per element, with k3 from a C-term sum of both signs
    (within (C/32 + 5) 2^-24 sum|du g h|), a few 1e-7 of max|dh| at C = 512.
  - dout (bf16): rtol 2^-8, atol 1e-6.
  - dw, dA, dbeta (fp32 sums over N positions x C channels of both signs): rtol 1e-4, atol 1e-5.
    v3's dw_r = s (du g . X_r) - k3 (h . X_r) has the error of v2's dh . X_r with dh's own
    (each term within the same fp32 bound of s |du g X_r| + |k3 h X_r|). Where dw cancels to
    residue (n = 1: dw = dh . h = 0 by the norm's scale invariance) it passes also within
    gamma S_r of the reference, S_r the sum of those terms' magnitudes (ref_dw_scale3 derives
    gamma); the self-test's emulation measures the error against that bound.
  - dg (v3, fp32 sums over N positions of du h s, both signs): rtol 1e-4, atol 1e-4 as std's dw
    (residual.cu). dalpha (v3) = w (dw - sum_t w_t dw_t): rtol 1e-4, atol 1e-4 (dw's error, twice).
  The self-test's fp32 emulation of v3 (host fp32 in the kernels' order, lane by lane, the warp
  sums as warp_sum's butterfly) passes these at every check shape: normwise u 2.0e-3 .. 3.3e-3,
  rstd <= 1.3e-7, dXp <= 1.4e-7, dout 2.0e-3 .. 3.2e-3 (--cpu-selftest prints them).
*/
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include <vector>
#include <algorithm>

typedef __nv_bfloat16 floatX;


#include "lab_util.cuh"
#include "../../kernels/hc.cuh"   // v3

// v1 and v2's reduction (kernels/hc.cuh before v3): grads[i] += sum over the P partials (P, NP) of
// column i, in partial order; one thread per column.
// grads points at dw (n), then dA (n, n), then dbeta (n): three destinations, given separately.
__global__ void hc_reduce_v1_kernel(float *dw, float *dA, float *dbeta, const float *partial, int P, int n) {
    const int NP = 2 * n + n * n, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= NP) { return; }
    float s = 0.0f;
    for (int p = 0; p < P; p++) { s += partial[(size_t)p * NP + i]; }
    if (i < n) { if (dw) { dw[i] += s; } }
    else if (i < n + n * n) { if (dA) { dA[i - n] += s; } }
    else if (dbeta) { dbeta[i - n - n * n] += s; }
}

// ============================================================================
// v2: the streams' update and read fused across the sublayer boundary, the norm outside
// (kernels/hc.cuh before v3; bodies unchanged, the names with _v2)
// ============================================================================

// Forward: Xn = A X + beta o (rounded to floatX), h = sum_r w[r] Xn_r (from the rounded Xn, so
// the backward's recomputation agrees). o = NULL: no update, Xn = X is not written (the read alone).
// xb = 1: X is (N, C), the n equal streams X_0 = wte[token] (never stored as n copies).
template <int NS>
__global__ void hc_update_read_v2_kernel(floatX *Xn, floatX *h, const floatX *X, const floatX *o, const float *A,
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
__global__ void hc_read_update_backward_v2_kernel(float *dXp_out, floatX *dout, float *dx0, float *partial,
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

// Forward at the boundary of sublayer j and j+1: Xn = A X + beta o, h = sum_r w[r] Xn_r.
// o = NULL: the read alone (h = sum_r w[r] X_r; Xn unused). xb = 1: X is the embedding (N, C),
// standing for the n equal streams X_0 (j = 0).
static void hc_update_read_forward_v2(floatX *Xn, floatX *h, const floatX *X, const floatX *o, const float *A,
                                   const float *beta, const float *w, size_t N, int C, int n, int xb = 0,
                                   cudaStream_t st = 0) {
    if (C % 8 != 0) { fprintf(stderr, "error: hc kernels need C a multiple of 8, not %d\n", C); exit(1); }
    hc_dispatch(n, [&](auto ns) {
        hc_update_read_v2_kernel<decltype(ns)::value><<<ceil_div(N, HC_WARPS), 32 * HC_WARPS, 0, st>>>(
            Xn, h, X, o, A, beta, w, N, C, xb);
    });
    launchCheck();
}

// Backward of the read of sublayer j and the update of sublayer j-1 (top of file), then the
// deterministic sums: dw_j (n), dA_{j-1} (n, n), dbeta_{j-1} (n) += (any may be NULL: not kept).
// dXp: in A_j^T dX_{j+1} (dXp_in NULL: zero), out A_{j-1}^T dX_j (dXp_out may equal dXp_in).
// Xprev = NULL: sublayer 0; dx0 (N, C) fp32 += the embedding's gradient sum_r dX_0 (pass X = NULL,
// dw = NULL: its streams are equal, so dalpha_0 is 0; dout and dXp_out unused).
// Otherwise dx0 is unused (NULL). xpb = 1: Xprev is the embedding (N, C) standing for
// X_0 (j = 1). partial: hc_partial_floats(N, n, C) floats of scratch.
static void hc_read_update_backward_v2(float *dXp_out, floatX *dout, float *dx0, float *dw, float *dA, float *dbeta,
                                    float *partial,
                                    const float *dXp_in, const float *dh, const floatX *X, const float *w,
                                    const floatX *Xprev, const floatX *o, const float *A, const float *beta,
                                    size_t N, int C, int n, int xpb = 0, cudaStream_t st = 0) {
    if (C % 8 != 0) { fprintf(stderr, "error: hc kernels need C a multiple of 8, not %d\n", C); exit(1); }
    const int rows = hc_rows_per_part(N), P = (int)ceil_div(N, rows);
    hc_dispatch(n, [&](auto ns) {
        hc_read_update_backward_v2_kernel<decltype(ns)::value><<<P, 32 * HC_WARPS, 0, st>>>(
            dXp_out, dout, dx0, partial, dXp_in, dh, X, w, Xprev, o, A, beta, N, C, rows, xpb);
    });
    launchCheck();
    hc_reduce_v1_kernel<<<1, 128, 0, st>>>(dw, dA, dbeta, partial, P, n);
    launchCheck();
}


// ============================================================================
// v3: the backward as kernels/hc.cuh had it before v5 (X_j read, not recomputed); the names
// with _v3. The forward v3 is kernels/hc.cuh's (since v5 its update is hc_update_at, the fp32
// order both now share).
// ============================================================================

// Backward of the norm and the read of sublayer j and of the update of sublayer j-1 (top of
// file), given du = dL/du_j (N, C) fp32 and rstd (N) of the forward. dXp (N, n, C) fp32: in,
// A_j^T dX_{j+1} (NULL: zero, the final site); out, A_{j-1}^T dX_j (in place).
// h_j = sum_r w[r] X_j,r is recomputed from X (xb = 1: X is (N, C), the n equal streams X_0).
// Xprev = NULL: sublayer 0, dx0 (N, C) fp32 += sum_r dX_0 (the embedding's gradient, the
// trainer's fp32 dslot 0 that encoder_backward reads); dout, dXp_out not written.
// partial (gridDim.x, 2n + n^2): this block's share of dw_j (n), dA_{j-1} (n, n), dbeta_{j-1} (n);
// gpart (gridDim.x, C): its share of the norm weight's gradient dg_j. Each lane sums its terms
// over its warp's positions in order; then the lanes (fixed butterfly) and the warps (in order).
// dw_j[r] = dh . X_r with dh = s du g - k3 h is summed as s (du g . X_r) - k3 (h . X_r) (k3 =
// s^3 / C sum_c du g h), both dot products from the first pass over the row.
// xpb = 1: Xprev is (N, C), the n equal streams X_0 (the update of sublayer 0).
// Dynamic shared memory: HC_WARPS x 256 NPK floats, each warp's running share of dg, channel
// c = 8 (lane + 32 q) + k at (8 q + k) 32 + lane (a lane's 32-bit words in distinct banks).
template <int NS, int NPK>
__global__ void __launch_bounds__(32 * HC_WARPS)
hc_norm_read_update_backward_v3_kernel(float *dXp_out, floatX *dout, float *dx0, float *partial, float *gpart,
                                    const float *dXp_in, const float *du, const float *rstd, const floatX *g,
                                    const floatX *X, const float *w, const floatX *Xprev, const floatX *o,
                                    const float *A, const float *beta, size_t N, int C, int rows_per_part, int xb,
                                    int xpb) {
    constexpr int NP = 2 * NS + NS * NS;
    extern __shared__ float hc_gsh[];   // (HC_WARPS, 256 NPK)
    __shared__ float red[HC_WARPS][NP];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *gsh = hc_gsh + (size_t)warp * 256 * NPK + lane;   // this lane's dg shares, stride 32
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
#pragma unroll
    for (int i = 0; i < 8 * NPK; i++) { gsh[32 * i] = 0.0f; }
    const size_t p0 = (size_t)blockIdx.x * rows_per_part, p1 = p0 + rows_per_part < N ? p0 + rows_per_part : N;
    for (size_t p = p0 + warp; p < p1; p += HC_WARPS) {
        const float s = rstd[p];
        // pass 1: h = sum_r w[r] X_r (the forward's order), dug = du g, and the row's sums
        float h[NPK][8], dug[NPK][8], gwx = 0.0f, P[NS], Q[NS];
#pragma unroll
        for (int r = 0; r < NS; r++) { P[r] = 0.0f; Q[r] = 0.0f; }
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int c0 = (lane + 32 * q) * 8;
#pragma unroll
            for (int k = 0; k < 8; k++) { h[q][k] = 0.0f; dug[q][k] = 0.0f; }
            if (c0 >= C) { continue; }
            float x[NS][8];
#pragma unroll
            for (int r = 0; r < NS; r++) {
                HcPackX v = *reinterpret_cast<const HcPackX *>(X + (xb ? p * C : (p * NS + r) * C) + c0);
#pragma unroll
                for (int k = 0; k < 8; k++) { x[r][k] = toF(v.x[k]); h[q][k] += wr[r] * x[r][k]; }
            }
            HcPackF d0 = *reinterpret_cast<const HcPackF *>(du + p * C + c0);
            float gf[8];
            hc_load_g8(gf, g + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) {   // dg_j += du h s (std's order);  sum_c du g h;  du g . X_r, h . X_r
                dug[q][k] = d0.x[k] * gf[k];
                gwx += dug[q][k] * h[q][k];
                gsh[32 * (8 * q + k)] += d0.x[k] * h[q][k] * s;
#pragma unroll
                for (int r = 0; r < NS; r++) { P[r] += dug[q][k] * x[r][k]; Q[r] += h[q][k] * x[r][k]; }
            }
        }
        gwx = warp_sum(gwx);
        const float k3 = s * s * s / C * gwx;
#pragma unroll
        for (int r = 0; r < NS; r++) { acc[r] += s * P[r] - k3 * Q[r]; }   // dw[r] += dh . X_r
        // pass 2: dh, then the read's and the update's backward
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int c0 = (lane + 32 * q) * 8;
            if (c0 >= C) { continue; }
            float d[NS][8];
#pragma unroll
            for (int r = 0; r < NS; r++) {   // dX_j = dXp + w dh,  dh = s du g - k3 h
                HcPackF dv;
                if (dXp_in) { dv = *reinterpret_cast<const HcPackF *>(dXp_in + (p * NS + r) * C + c0); }
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    d[r][k] = (dXp_in ? dv.x[k] : 0.0f) + wr[r] * (s * dug[q][k] - k3 * h[q][k]);
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
                float t = 0.0f;
#pragma unroll
                for (int r = 0; r < NS; r++) { t += b[r] * d[r][k]; acc[NS + NS * NS + r] += d[r][k] * ov[k]; }
                op.x[k] = fromF<floatX>(t);
            }
            *reinterpret_cast<HcPackX *>(dout + p * C + c0) = op;
#pragma unroll
            for (int s2 = 0; s2 < NS; s2++) {   // dXp_{j-1},s = sum_r A[r,s] dX_r;  dA[r,s] += dX_r . Xprev_s
                HcPackX xv = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s2) * C) + c0);
                HcPackF out;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float xs = toF(xv.x[k]), v = 0.0f;
#pragma unroll
                    for (int r = 0; r < NS; r++) { v += a[r][s2] * d[r][k]; acc[NS + r * NS + s2] += d[r][k] * xs; }
                    out.x[k] = v;
                }
                *reinterpret_cast<HcPackF *>(dXp_out + (p * NS + s2) * C + c0) = out;
            }
        }
    }
    // the block's shares: the lanes' sums (fixed butterfly), then the warps in order
#pragma unroll
    for (int i = 0; i < NP; i++) { acc[i] = warp_sum(acc[i]); }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NP; i++) { red[warp][i] = acc[i]; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NP; i += blockDim.x) {
        float t = 0.0f;
        for (int k = 0; k < HC_WARPS; k++) { t += red[k][i]; }
        partial[(size_t)blockIdx.x * NP + i] = t;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int i = 32 * (8 * (c / 256) + c % 8) + c / 8 % 32;
        float t = 0.0f;
        for (int k = 0; k < HC_WARPS; k++) { t += hc_gsh[(size_t)k * 256 * NPK + i]; }
        gpart[(size_t)blockIdx.x * C + c] = t;
    }
}

// v3 to v8's reduction (kernels/hc.cuh's before hc_reduce_sites_kernel, which sums every site of a
// backward in one launch; here with the name _v3): one site a launch.
// The deterministic sums of hc_norm_read_update_backward's P block partials (std's scheme,
// rmsnorm_dw_reduce_kernel): column i < NP = 2n + n^2 of the scalars (P, NP), then column
// NP + c of the norm's (P, C) after them. Block (32 columns) x (32 partial lanes): lane y sums
// partials y, y + 32, ... in order, then the 32 lane sums are added in lane order. Column i
// goes to dw[i] (i < n), dA[i - n] (i < n + n^2), dbeta, then dg (each += when not NULL).
// Block 0 holds the dw columns (n <= 8): with dalpha it also adds the softmax's backward
// dalpha[s] += w[s] (dw[s] - sum_t w[t] dw[t]) of this call's sums (the CPU's
// hc_weights_backward). Grid ceil((NP + C) / 32).
__global__ void __launch_bounds__(1024) hc_reduce_v3_kernel(float *dw, float *dA, float *dbeta, float *dg,
                                                            float *dalpha, const float *w, const float *partial, int P,
                                                            int n, int C) {
    __shared__ float sh[32][33];
    const int NP = 2 * n + n * n, i = blockIdx.x * 32 + threadIdx.x;
    const float *col = NULL;
    size_t stride = 0;
    if (i < NP) { col = partial + i; stride = NP; }
    else if (i < NP + C) { col = partial + (size_t)P * NP + (i - NP); stride = C; }
    float t = 0.0f;
    if (col) {
        for (int p = threadIdx.y; p < P; p += 32) { t += col[(size_t)p * stride]; }
    }
    sh[threadIdx.y][threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.y == 0) {
        float sum = 0.0f;
        for (int y = 0; y < 32; y++) { sum += sh[y][threadIdx.x]; }
        sh[0][threadIdx.x] = sum;   // this column's total (row 0 is read by its own thread only above)
        if (i < n) { if (dw) { dw[i] += sum; } }
        else if (i < n + n * n) { if (dA) { dA[i - n] += sum; } }
        else if (i < NP) { if (dbeta) { dbeta[i - n - n * n] += sum; } }
        else if (i < NP + C) { if (dg) { dg[i - NP] += sum; } }
    }
    if (blockIdx.x == 0 && dalpha) {
        __syncthreads();
        if (threadIdx.x == 0 && threadIdx.y == 0) {
            float S = 0.0f;
            for (int r = 0; r < n; r++) { S += w[r] * sh[0][r]; }
            for (int r = 0; r < n; r++) { dalpha[r] += w[r] * (sh[0][r] - S); }
        }
    }
}

// Backward of the norm and read of sublayer j and the update of sublayer j-1 (top of file),
// given du = dL/du_j and the forward's rstd, then the deterministic sums: dw_j (n), dA_{j-1}
// (n, n), dbeta_{j-1} (n), dg_j (C) += (any may be NULL: not kept), and dalpha_j (n) += w
// (dw_j - sum_t w_t dw_j,t), the softmax's backward of the sums of this call (NULL: none).
// dXp: in A_j^T dX_{j+1} (dXp_in NULL: zero), out A_{j-1}^T dX_j (dXp_out may equal dXp_in).
// X: the streams X_j read by sublayer j (xb = 1: the embedding (N, C), X_0).
// Xprev = NULL: sublayer 0; dx0 (N, C) fp32 += the embedding's gradient sum_r dX_0 (pass
// dw = NULL: its streams are equal, so dalpha_0 is 0; dout and dXp_out unused).
// Otherwise dx0 is unused (NULL). xpb = 1: Xprev is the embedding (N, C) standing for
// X_0 (j = 1). partial: hc_partial_floats(N, n, C) floats of scratch.
static void hc_norm_read_update_backward_v3(float *dXp_out, floatX *dout, float *dx0, float *dw, float *dalpha,
                                         float *dA, float *dbeta, float *dg, float *partial, const float *dXp_in,
                                         const float *du, const float *rstd, const floatX *g, const floatX *X,
                                         const float *w, const floatX *Xprev, const floatX *o, const float *A,
                                         const float *beta, size_t N, int C, int n, int xb, int xpb,
                                         cudaStream_t st = 0) {
    const int rows = hc_rows_per_part(N), P = (int)ceil_div(N, rows), NP = 2 * n + n * n;
    float *gpart = partial + (size_t)P * NP;
    hc_dispatch(n, [&](auto ns) {
        hc_pack_dispatch(C, C, g, [&](auto npk) {
            const size_t smem = (size_t)HC_WARPS * 256 * decltype(npk)::value * sizeof(float);
            auto kernel = hc_norm_read_update_backward_v3_kernel<decltype(ns)::value, decltype(npk)::value>;
            if (smem > 48 * 1024) {
                cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            }
            kernel<<<P, 32 * HC_WARPS, smem, st>>>(dXp_out, dout, dx0, partial, gpart, dXp_in, du, rstd, g, X, w,
                                                   Xprev, o, A, beta, N, C, rows, xb, xpb);
        });
    });
    launchCheck();
    hc_reduce_v3_kernel<<<ceil_div(NP + C, 32), dim3(32, 32), 0, st>>>(dw, dA, dbeta, dg, dalpha, w, partial, P, n, C);
    launchCheck();
}

// ============================================================================
// ============================================================================
// v5: the trainer's backward before v9 (kernels/hc.cuh; bodies unchanged, the names with _v5):
// one warp per position, the whole row a lane's packs (127 registers at n = 4, C = 512: two
// blocks of 8 warps an SM). v6, v7, v8 below are variants of it.
// ============================================================================
// Backward of the norm and the read of sublayer j and of the update of sublayer j-1 (top of
// file), given du = dL/du_j (N, C) fp32 and rstd (N) of the forward. dXp (N, n, C) fp32: in,
// A_j^T dX_{j+1} (NULL: zero, the final site); out, A_{j-1}^T dX_j (in place).
// h_j = sum_r w[r] X_j,r is recomputed from X_j, itself recomputed from Xprev and o (the
// forward's bits); X is read only at site 0 (Xprev = NULL; xb = 1: X is (N, C), the n equal
// streams X_0). Xprev = NULL: sublayer 0, dx0 (N, C) fp32 += sum_r dX_0 (the embedding's
// gradient, the trainer's fp32 dslot 0 that encoder_backward reads); dout, dXp_out not written.
// partial (gridDim.x, 2n + n^2): this block's share of dw_j (n), dA_{j-1} (n, n), dbeta_{j-1} (n);
// gpart (gridDim.x, C): its share of the norm weight's gradient dg_j. Each lane sums its terms
// over its warp's positions in order; then the lanes (fixed butterfly) and the warps (in order).
// dw_j[r] = dh . X_r with dh = s du g - k3 h is summed as s (du g . X_r) - k3 (h . X_r) (k3 =
// s^3 / C sum_c du g h), both dot products from the first pass over the row.
// xpb = 1: Xprev is (N, C), the n equal streams X_0 (the update of sublayer 0).
// Dynamic shared memory: HC_WARPS x 256 NPK floats, each warp's running share of dg, channel
// c = 8 (lane + 32 q) + k at (8 q + k) 32 + lane (a lane's 32-bit words in distinct banks).
// Two blocks an SM where the registers allow it without spills (n = 4 at C <= 512, the 100M
// shape; n = 2 at C <= 1024): the recomputation of X_j needs registers v3 did not, and without
// the bound ptxas takes 166 at n = 4, C = 512, one block an SM.
constexpr int hc_bwd_min_blocks_v5(int ns, int npk) { return ns * npk <= 8 && ns <= 4 && npk <= 4 ? 2 : 1; }
template <int NS, int NPK>
__global__ void __launch_bounds__(32 * HC_WARPS, hc_bwd_min_blocks_v5(NS, NPK))
hc_norm_read_update_backward_v5_kernel(float *dXp_out, floatX *dout, float *dx0, float *partial, float *gpart,
                                       const float *dXp_in, const float *du, const float *rstd, const floatX *g,
                                       const floatX *X, const float *w, const floatX *Xprev, const floatX *o,
                                       const float *A, const float *beta, size_t N, int C, int rows_per_part,
                                       int xb, int xpb) {
    constexpr int NP = 2 * NS + NS * NS;
    extern __shared__ float hc_gsh[];   // (HC_WARPS, 256 NPK)
    __shared__ float red[HC_WARPS][NP];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *gsh = hc_gsh + (size_t)warp * 256 * NPK + lane;   // this lane's dg shares, stride 32
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
#pragma unroll
    for (int i = 0; i < 8 * NPK; i++) { gsh[32 * i] = 0.0f; }
    const size_t p0 = (size_t)blockIdx.x * rows_per_part, p1 = p0 + rows_per_part < N ? p0 + rows_per_part : N;
    for (size_t p = p0 + warp; p < p1; p += HC_WARPS) {
        const float s = rstd[p];
        // pass 1: h = sum_r w[r] X_r (the forward's order), dug = du g, and the row's sums
        float h[NPK][8], dug[NPK][8], gwx = 0.0f, P[NS], Q[NS];
#pragma unroll
        for (int r = 0; r < NS; r++) { P[r] = 0.0f; Q[r] = 0.0f; }
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int c0 = (lane + 32 * q) * 8;
#pragma unroll
            for (int k = 0; k < 8; k++) { h[q][k] = 0.0f; dug[q][k] = 0.0f; }
            if (c0 >= C) { continue; }
            float x[NS][8];
            if (Xprev) {   // X_j = A_{j-1} X_{j-1} + beta_{j-1} o_{j-1}, the forward's bits (pass 2 reads both again)
                float xp[NS][8], ov[8];
#pragma unroll
                for (int s2 = 0; s2 < NS; s2++) {
                    HcPackX v = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s2) * C) + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { xp[s2][k] = toF(v.x[k]); }
                }
                HcPackX v = *reinterpret_cast<const HcPackX *>(o + p * C + c0);
#pragma unroll
                for (int k = 0; k < 8; k++) { ov[k] = toF(v.x[k]); }
#pragma unroll
                for (int r = 0; r < NS; r++) {
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        x[r][k] = toF(fromF<floatX>(hc_update_at<NS>(a[r], b[r], xp, ov[k], k)));
                    }
                }
            } else {   // site 0: X_0, the n equal streams of the embedding (xb), or stored streams
#pragma unroll
                for (int r = 0; r < NS; r++) {
                    HcPackX v = *reinterpret_cast<const HcPackX *>(X + (xb ? p * C : (p * NS + r) * C) + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { x[r][k] = toF(v.x[k]); }
                }
            }
#pragma unroll
            for (int r = 0; r < NS; r++) {
#pragma unroll
                for (int k = 0; k < 8; k++) { h[q][k] += wr[r] * x[r][k]; }
            }
            HcPackF d0 = *reinterpret_cast<const HcPackF *>(du + p * C + c0);
            float gf[8];
            hc_load_g8(gf, g + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) {   // dg_j += du h s (std's order);  sum_c du g h;  du g . X_r, h . X_r
                dug[q][k] = d0.x[k] * gf[k];
                gwx += dug[q][k] * h[q][k];
                gsh[32 * (8 * q + k)] += d0.x[k] * h[q][k] * s;
#pragma unroll
                for (int r = 0; r < NS; r++) { P[r] += dug[q][k] * x[r][k]; Q[r] += h[q][k] * x[r][k]; }
            }
        }
        gwx = warp_sum(gwx);
        const float k3 = s * s * s / C * gwx;
#pragma unroll
        for (int r = 0; r < NS; r++) { acc[r] += s * P[r] - k3 * Q[r]; }   // dw[r] += dh . X_r
        // pass 2: dh, then the read's and the update's backward
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int c0 = (lane + 32 * q) * 8;
            if (c0 >= C) { continue; }
            float d[NS][8];
#pragma unroll
            for (int r = 0; r < NS; r++) {   // dX_j = dXp + w dh,  dh = s du g - k3 h
                HcPackF dv;
                if (dXp_in) { dv = *reinterpret_cast<const HcPackF *>(dXp_in + (p * NS + r) * C + c0); }
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    d[r][k] = (dXp_in ? dv.x[k] : 0.0f) + wr[r] * (s * dug[q][k] - k3 * h[q][k]);
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
                float t = 0.0f;
#pragma unroll
                for (int r = 0; r < NS; r++) { t += b[r] * d[r][k]; acc[NS + NS * NS + r] += d[r][k] * ov[k]; }
                op.x[k] = fromF<floatX>(t);
            }
            *reinterpret_cast<HcPackX *>(dout + p * C + c0) = op;
#pragma unroll
            for (int s2 = 0; s2 < NS; s2++) {   // dXp_{j-1},s = sum_r A[r,s] dX_r;  dA[r,s] += dX_r . Xprev_s
                HcPackX xv = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s2) * C) + c0);
                HcPackF out;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float xs = toF(xv.x[k]), v = 0.0f;
#pragma unroll
                    for (int r = 0; r < NS; r++) { v += a[r][s2] * d[r][k]; acc[NS + r * NS + s2] += d[r][k] * xs; }
                    out.x[k] = v;
                }
                *reinterpret_cast<HcPackF *>(dXp_out + (p * NS + s2) * C + c0) = out;
            }
        }
    }
    // the block's shares: the lanes' sums (fixed butterfly), then the warps in order
#pragma unroll
    for (int i = 0; i < NP; i++) { acc[i] = warp_sum(acc[i]); }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NP; i++) { red[warp][i] = acc[i]; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NP; i += blockDim.x) {
        float t = 0.0f;
        for (int k = 0; k < HC_WARPS; k++) { t += red[k][i]; }
        partial[(size_t)blockIdx.x * NP + i] = t;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int i = 32 * (8 * (c / 256) + c % 8) + c / 8 % 32;
        float t = 0.0f;
        for (int k = 0; k < HC_WARPS; k++) { t += hc_gsh[(size_t)k * 256 * NPK + i]; }
        gpart[(size_t)blockIdx.x * C + c] = t;
    }
}

// v5's launcher (kernels/hc.cuh's before v9)
static void hc_norm_read_update_backward_v5(float *dXp_out, floatX *dout, float *dx0, float *dw, float *dalpha,
                                            float *dA, float *dbeta, float *dg, float *partial, const float *dXp_in,
                                            const float *du, const float *rstd, const floatX *g, const floatX *X,
                                            const float *w, const floatX *Xprev, const floatX *o, const float *A,
                                            const float *beta, size_t N, int C, int n, int xb, int xpb,
                                            cudaStream_t st = 0) {
    const int rows = hc_rows_per_part(N), P = (int)ceil_div(N, rows), NP = 2 * n + n * n;
    float *gpart = partial + (size_t)P * NP;
    hc_dispatch(n, [&](auto ns) {
        hc_pack_dispatch(C, C, g, [&](auto npk) {
            const size_t smem = (size_t)HC_WARPS * 256 * decltype(npk)::value * sizeof(float);
            auto kernel = hc_norm_read_update_backward_v5_kernel<decltype(ns)::value, decltype(npk)::value>;
            if (smem > 48 * 1024) {
                cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            }
            kernel<<<P, 32 * HC_WARPS, smem, st>>>(dXp_out, dout, dx0, partial, gpart, dXp_in, du, rstd, g, X, w,
                                                   Xprev, o, A, beta, N, C, rows, xb, xpb);
        });
    });
    launchCheck();
    hc_reduce_v3_kernel<<<ceil_div(NP + C, 32), dim3(32, 32), 0, st>>>(dw, dA, dbeta, dg, dalpha, w, partial, P, n, C);
    launchCheck();
}


// v6, v7, v8: v5's backward with dXp moved another way (one kernel, hc_..._v6_kernel<.., VER>).
// v6, v7: v5 with the position's stream gradient dXp_in staged in shared memory by cp.async
// (16 bytes a copy, each lane its own chunks), so that its DRAM round trip overlaps the first
// pass: v5 loads dXp in the second pass, after the row's sums, so each position waits for two
// round trips one after the other. v6 issues the copies when the position starts; v7 one
// position ahead (when the warp finishes the previous one; its first before the loop). The
// arithmetic is v5's, in v5's order: the same bits. Shared memory per block: v5's dg shares,
// then HC_WARPS stages of n x 256 NPK floats (64 KiB at n = 4, C = 512); chunk (r, q, half) of
// lane l at ((r NPK + q) 2 + half) 32 + l in float4 units (a quarter warp reads 128 contiguous
// bytes: no bank conflicts). A stage is rewritten only after its lane has read its own chunks
// (the copies of a lane land in its own chunks only). Where the stages do not fit
// (HC_STAGE_MAX bytes a block) the launcher runs v5.
// ============================================================================
#define HC_STAGE_MAX (96 * 1024)
__device__ __forceinline__ void hc_cp16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void hc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void hc_cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// this lane's chunks of position p's dXp rows into its warp's stage (nothing past C)
template <int NS, int NPK>
__device__ __forceinline__ void hc_stage_dxp(float4 *stage, const float *dXp, size_t p, int C, int lane) {
#pragma unroll
    for (int r = 0; r < NS; r++) {
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int c0 = (lane + 32 * q) * 8;
            if (c0 >= C) { continue; }
            const float *src = dXp + (p * NS + r) * C + c0;
            hc_cp16(stage + ((r * NPK + q) * 2) * 32 + lane, src);
            hc_cp16(stage + ((r * NPK + q) * 2 + 1) * 32 + lane, src + 4);
        }
    }
    hc_cp_commit();
}

// v8: v5 with the stream gradient dXp stored in 24 bits a value instead of 32: fp32 rounded to
// nearest even at bit 8 and kept as its top 16 bits (hi, (N, n, C) uint16: sign, exponent, 7
// bits of significand, i.e. a bf16) and the next 8 (lo, (N, n, C) uint8). Relative rounding
// error at most 2^-17 (7.6e-6) a store, against bf16's 2^-9; the kernel's arithmetic stays
// fp32, in v5's order, so on the same (24-bit) inputs every output is v5's bits and dXp_out is
// v5's rounded to 24 bits. DRAM bytes (8n + 8) C + 4 instead of (10n + 8) C + 4: 20 KiB a
// position at 100m instead of 24.

// 8 values of a 24-bit array at element i (a multiple of 8): one 16-byte and one 8-byte load
__device__ __forceinline__ void hc24_load8(float v[8], const uint16_t *hi, const uint8_t *lo, size_t i) {
    const uint4 hv = *reinterpret_cast<const uint4 *>(hi + i);
    const uint2 lv = *reinterpret_cast<const uint2 *>(lo + i);
    const uint32_t hw[4] = {hv.x, hv.y, hv.z, hv.w}, lw[2] = {lv.x, lv.y};
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t hk = (hw[k / 2] >> (16 * (k % 2))) & 0xFFFFu, lk = (lw[k / 4] >> (8 * (k % 4))) & 0xFFu;
        v[k] = __uint_as_float((hk << 16) | (lk << 8));
    }
}
// fp32 -> its top 24 bits, rounded to nearest even (the 8 dropped bits)
__device__ __host__ __forceinline__ uint32_t hc24_round(uint32_t u) { return (u + 0x7Fu + ((u >> 8) & 1u)) >> 8; }
__device__ __forceinline__ void hc24_store8(uint16_t *hi, uint8_t *lo, size_t i, const float v[8]) {
    uint32_t hw[4] = {0, 0, 0, 0}, lw[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t t = hc24_round(__float_as_uint(v[k]));
        hw[k / 2] |= (t >> 8) << (16 * (k % 2));
        lw[k / 4] |= (t & 0xFFu) << (8 * (k % 4));
    }
    *reinterpret_cast<uint4 *>(hi + i) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
    *reinterpret_cast<uint2 *>(lo + i) = make_uint2(lw[0], lw[1]);
}
// v10's storage of dXp (kernels/hc.cuh's HcGrad24 before v12): the same format, packed and
// unpacked with shifts and masks (v8's load; v8's store with infinities and NaNs truncated)
struct HcGrad24v10 { uint16_t *hi; uint8_t *lo; };
__host__ __device__ inline bool hc_grad_null(HcGrad24v10 g) { return g.hi == NULL; }
__device__ __forceinline__ void hc_grad_load8(float v[8], HcGrad24v10 g, size_t i) { hc24_load8(v, g.hi, g.lo, i); }
__device__ __forceinline__ void hc_grad_store8(HcGrad24v10 g, size_t i, const float v[8]) {
    uint32_t hw[4] = {0, 0, 0, 0}, lw[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t u = __float_as_uint(v[k]), t = (u & 0x7F800000u) == 0x7F800000u ? u >> 8 : hc24_round(u);
        hw[k / 2] |= (t >> 8) << (16 * (k % 2));
        lw[k / 4] |= (t & 0xFFu) << (8 * (k % 4));
    }
    *reinterpret_cast<uint4 *>(g.hi + i) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
    *reinterpret_cast<uint2 *>(g.lo + i) = make_uint2(lw[0], lw[1]);
}
// dXp in 24 bits: v8, v10, v12, v16, v17
static bool dxp24(int ver) { return ver == 8 || ver == 10 || ver == 12 || ver == 16 || ver == 17; }

// v15's forward (kernels/hc.cuh's before v16; v3 is the same kernel at 8 warps, no minimum of
// blocks): each value of Xn and u rounded to floatX alone, the norm weight loaded after the row's
// sum. v16 rounds them in pairs and loads g before the sum: the same bits (check_fwd_variants).
template <int NS, int NPK, int WARPS, int MINB>
__global__ void __launch_bounds__(32 * WARPS, hc_fwd_min_blocks(NS, NPK, MINB))
hc_update_read_norm_v15_kernel(floatX *Xn, floatX *u, float *rstd, const floatX *X, const floatX *o, const float *A,
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
#pragma unroll
            for (int k = 0; k < 8; k++) {
                y.x[k] = fromF<floatX>(o ? hc_update_at<NS>(a[r], b[r], x, ov[k], k) : x[r][k]);
                hv[q][k] += wr[r] * toF(y.x[k]);
            }
            if (o && Xn) { *reinterpret_cast<HcPackX *>(Xn + (p * NS + r) * C + c0) = y; }
        }
#pragma unroll
        for (int k = 0; k < 8; k++) { ss += hv[q][k] * hv[q][k]; }
    }
    ss = warp_sum(ss);   // u = rmsnorm(h; g)
    const float s = 1.0f / sqrtf(ss / C + 1e-6f);
    if (lane == 0) { rstd[p] = s; }
#pragma unroll
    for (int q = 0; q < NPK; q++) {
        const int c0 = (lane + 32 * q) * 8;
        if (c0 >= C) { continue; }
        float gf[8];
        hc_load_g8(gf, g + c0);
        HcPackX up;
#pragma unroll
        for (int k = 0; k < 8; k++) { up.x[k] = fromF<floatX>(hv[q][k] * s * gf[k]); }
        *reinterpret_cast<HcPackX *>(u + p * C + c0) = up;
    }
}
template <int WARPS, int MINB>
static void hc_update_read_norm_forward_v15(floatX *Xn, floatX *u, float *rstd, const floatX *X, const floatX *o,
                                            const float *A, const float *beta, const float *w, const floatX *g,
                                            size_t N, int C, int n, int xb = 0) {
    hc_dispatch(n, [&](auto ns) {
        hc_pack_dispatch(C, C, g, [&](auto npk) {
            hc_update_read_norm_v15_kernel<decltype(ns)::value, decltype(npk)::value, WARPS, MINB>
                <<<ceil_div(N, WARPS), 32 * WARPS>>>(Xn, u, rstd, X, o, A, beta, w, g, N, C, xb);
        });
    });
    launchCheck();
}

// v12's backward (kernels/hc.cuh's before v16; v9 and v10 are the same kernel with the storages
// HcGradF32 and HcGrad24v10): the norm weight loaded and its gradient's shares added in shared
// memory at every position, o loaded in both passes, each Xj value rounded alone; __launch_bounds__
// asks for 5 blocks an SM (96 registers) where v16 asks for 4 (127: the barriers allow 4 anyway).
constexpr int hc_bwd_min_blocks_v12(int ns, int npk) {
    return ns * npk <= 4 && npk <= 2 ? 5 : ns * npk <= 8 && ns <= 4 && npk <= 4 ? 4 : 2;
}
template <int NS, int NPK, typename G>
__global__ void __launch_bounds__(32 * HC_BWD_WARPS, hc_bwd_min_blocks_v12(NS, NPK))
hc_norm_read_update_backward_v12_kernel(G dXp_out, floatX *dout, float *dx0, float *partial, float *gpart, G dXp_in,
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
#pragma unroll
    for (int i = 0; i < 8 * NPK; i++) { gsh[32 * i] = 0.0f; }
    const size_t p0 = (size_t)blockIdx.x * rows_per_part, p1 = p0 + rows_per_part < N ? p0 + rows_per_part : N;
    int par = 0;
    for (size_t p = p0 + pair; p < p1; p += PAIRS, par ^= 1) {
        const float s = rstd[p];
        // pass 1: h = sum_r w[r] X_r (the forward's order), dug = du g, and the half row's sums
        float h[NPK][8], dug[NPK][8], gwx = 0.0f, P[NS], Q[NS];
#pragma unroll
        for (int r = 0; r < NS; r++) { P[r] = 0.0f; Q[r] = 0.0f; }
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int lc = (lane + 32 * q) * 8, c0 = cb + lc;
#pragma unroll
            for (int k = 0; k < 8; k++) { h[q][k] = 0.0f; dug[q][k] = 0.0f; }
            if (lc >= Ch) { continue; }
            float x[NS][8];
            if (Xprev) {   // X_j = A_{j-1} X_{j-1} + beta_{j-1} o_{j-1}, the forward's bits (pass 2 reads both again)
                float xp[NS][8], ov[8];
#pragma unroll
                for (int s2 = 0; s2 < NS; s2++) {
                    HcPackX v = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s2) * C) + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { xp[s2][k] = toF(v.x[k]); }
                }
                HcPackX v = *reinterpret_cast<const HcPackX *>(o + p * C + c0);
#pragma unroll
                for (int k = 0; k < 8; k++) { ov[k] = toF(v.x[k]); }
#pragma unroll
                for (int r = 0; r < NS; r++) {
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        x[r][k] = toF(fromF<floatX>(hc_update_at<NS>(a[r], b[r], xp, ov[k], k)));
                    }
                }
            } else {   // site 0: X_0, the n equal streams of the embedding (xb), or stored streams
#pragma unroll
                for (int r = 0; r < NS; r++) {
                    HcPackX v = *reinterpret_cast<const HcPackX *>(X + (xb ? p * C : (p * NS + r) * C) + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { x[r][k] = toF(v.x[k]); }
                }
            }
#pragma unroll
            for (int r = 0; r < NS; r++) {
#pragma unroll
                for (int k = 0; k < 8; k++) { h[q][k] += wr[r] * x[r][k]; }
            }
            HcPackF d0 = *reinterpret_cast<const HcPackF *>(du + p * C + c0);
            float gf[8];
            hc_load_g8(gf, g + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) {   // dg_j += du h s (std's order);  sum_c du g h;  du g . X_r, h . X_r
                dug[q][k] = d0.x[k] * gf[k];
                gwx += dug[q][k] * h[q][k];
                gsh[32 * (8 * q + k)] += d0.x[k] * h[q][k] * s;
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
                if (!hc_grad_null(dXp_in)) { hc_grad_load8(dv, dXp_in, (p * NS + r) * C + c0); }
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
            HcPackX op;
            float ov[8];
            HcPackX o0 = *reinterpret_cast<const HcPackX *>(o + p * C + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) { ov[k] = toF(o0.x[k]); }
#pragma unroll
            for (int k = 0; k < 8; k++) {   // do = sum_r beta[r] dX_r;  dbeta[r] += dX_r . o
                float t = 0.0f;
#pragma unroll
                for (int r = 0; r < NS; r++) { t += b[r] * d[r][k]; acc[NS + NS * NS + r] += d[r][k] * ov[k]; }
                op.x[k] = fromF<floatX>(t);
            }
            *reinterpret_cast<HcPackX *>(dout + p * C + c0) = op;
#pragma unroll
            for (int s2 = 0; s2 < NS; s2++) {   // dXp_{j-1},s = sum_r A[r,s] dX_r;  dA[r,s] += dX_r . Xprev_s
                HcPackX xv = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s2) * C) + c0);
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
template <typename G>
static void hc_norm_read_update_backward_v12(G dXp_out, floatX *dout, float *dx0, float *partial, G dXp_in,
                                             const float *du, const float *rstd, const floatX *g, const floatX *X,
                                             const float *w, const floatX *Xprev, const floatX *o, const float *A,
                                             const float *beta, size_t N, int C, int n, int xb, int xpb) {
    const int rows = hc_rows_per_part(N), P = (int)ceil_div(N, rows), NP = 2 * n + n * n;
    float *gpart = partial + (size_t)P * NP;
    hc_dispatch(n, [&](auto ns) {
        hc_pack_dispatch(C, hc_bwd_half0(C), g, [&](auto npk) {
            constexpr int NS_ = decltype(ns)::value, NPK_ = decltype(npk)::value;
            const size_t smem = (size_t)HC_BWD_WARPS * 256 * NPK_ * sizeof(float);
            auto kernel = hc_norm_read_update_backward_v12_kernel<NS_, NPK_, G>;
            if (smem > 48 * 1024) {
                cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            }
            kernel<<<P, 32 * HC_BWD_WARPS, smem>>>(dXp_out, dout, dx0, partial, gpart, dXp_in, du, rstd, g, X, w,
                                                   Xprev, o, A, beta, N, C, rows, xb, xpb);
        });
    });
    launchCheck();
}

// v16's backward (kernels/hc.cuh's before v17): each position's inputs loaded from global memory
// when its pass needs them (pass 1: X_{j-1}, o, du, rstd; pass 2: dXp and X_{j-1} again)
template <int NS, int NPK, typename G>
__global__ void __launch_bounds__(32 * HC_BWD_WARPS, hc_bwd_min_blocks(NS, NPK))
hc_norm_read_update_backward_v16_kernel(G dXp_out, floatX *dout, float *dx0, float *partial, float *gpart, G dXp_in,
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
    const size_t p0 = (size_t)blockIdx.x * rows_per_part, p1 = p0 + rows_per_part < N ? p0 + rows_per_part : N;
    int par = 0;
    for (size_t p = p0 + pair; p < p1; p += PAIRS, par ^= 1) {
        const float s = rstd[p];
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
                    HcPackX v = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s2) * C) + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { xp[s2][k] = toF(v.x[k]); }
                }
                HcPackX v = *reinterpret_cast<const HcPackX *>(o + p * C + c0);
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
                    HcPackX v = *reinterpret_cast<const HcPackX *>(X + (xb ? p * C : (p * NS + r) * C) + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { x[r][k] = toF(v.x[k]); }
                }
            }
#pragma unroll
            for (int r = 0; r < NS; r++) {
#pragma unroll
                for (int k = 0; k < 8; k++) { h[q][k] += wr[r] * x[r][k]; }
            }
            HcPackF d0 = *reinterpret_cast<const HcPackF *>(du + p * C + c0);
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
                if (!hc_grad_null(dXp_in)) { hc_grad_load8(dv, dXp_in, (p * NS + r) * C + c0); }
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
                HcPackX xv = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s2) * C) + c0);
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
template <typename G>
static void hc_norm_read_update_backward_v16(G dXp_out, floatX *dout, float *dx0, float *partial, G dXp_in,
                                             const float *du, const float *rstd, const floatX *g, const floatX *X,
                                             const float *w, const floatX *Xprev, const floatX *o, const float *A,
                                             const float *beta, size_t N, int C, int n, int xb, int xpb) {
    const int rows = hc_rows_per_part(N), P = (int)ceil_div(N, rows), NP = 2 * n + n * n;
    float *gpart = partial + (size_t)P * NP;
    hc_dispatch(n, [&](auto ns) {
        hc_pack_dispatch(C, hc_bwd_half0(C), g, [&](auto npk) {
            constexpr int NS_ = decltype(ns)::value, NPK_ = decltype(npk)::value;
            const size_t smem = (size_t)HC_BWD_WARPS * 256 * NPK_ * sizeof(float);
            auto kernel = hc_norm_read_update_backward_v16_kernel<NS_, NPK_, G>;
            if (smem > 48 * 1024) {
                cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            }
            kernel<<<P, 32 * HC_BWD_WARPS, smem>>>(dXp_out, dout, dx0, partial, gpart, dXp_in, du, rstd, g, X, w,
                                                   Xprev, o, A, beta, N, C, rows, xb, xpb);
        });
    });
    launchCheck();
}

// the lab's conversions: fp32 (count values) -> 24-bit arrays, and back
__global__ void hc24_encode_kernel(uint16_t *hi, uint8_t *lo, const float *x, size_t count) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) { return; }
    const uint32_t t = hc24_round(__float_as_uint(x[i]));
    hi[i] = (uint16_t)(t >> 8); lo[i] = (uint8_t)(t & 0xFFu);
}
__global__ void hc24_decode_kernel(float *x, const uint16_t *hi, const uint8_t *lo, size_t count) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) { return; }
    x[i] = __uint_as_float(((uint32_t)hi[i] << 16) | ((uint32_t)lo[i] << 8));
}

// v6, v7, v8 (VER): v5's kernel with dXp read and written as the version says (v8: dxh, dxl
// instead of dXp_in, dXp_out, which are then NULL; v6, v7: dxh and dxl NULL)
template <int NS, int NPK, int VER>
__global__ void __launch_bounds__(32 * HC_WARPS, hc_bwd_min_blocks_v5(NS, NPK))
hc_norm_read_update_backward_v6_kernel(float *dXp_out, uint16_t *dxh_out, uint8_t *dxl_out, floatX *dout, float *dx0,
                                       float *partial, float *gpart, const float *dXp_in, const uint16_t *dxh_in,
                                       const uint8_t *dxl_in, const float *du, const float *rstd, const floatX *g,
                                       const floatX *X, const float *w, const floatX *Xprev, const floatX *o,
                                       const float *A, const float *beta, size_t N, int C, int rows_per_part, int xb,
                                       int xpb) {
    constexpr int NP = 2 * NS + NS * NS;
    constexpr bool STAGED = VER != 8, AHEAD = VER == 7;
    const bool has_in = VER == 8 ? dxh_in != NULL : dXp_in != NULL;
    extern __shared__ float4 hc_ssh[];   // (HC_WARPS, 64 NPK) float4 of dg shares, then (HC_WARPS, 64 NS NPK) stages
    __shared__ float red[HC_WARPS][NP];
    float *hc_gsh = reinterpret_cast<float *>(hc_ssh);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *gsh = hc_gsh + (size_t)warp * 256 * NPK + lane;   // this lane's dg shares, stride 32
    float4 *stage = hc_ssh + (size_t)HC_WARPS * 64 * NPK + (size_t)warp * 64 * NS * NPK;
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
#pragma unroll
    for (int i = 0; i < 8 * NPK; i++) { gsh[32 * i] = 0.0f; }
    const size_t p0 = (size_t)blockIdx.x * rows_per_part, p1 = p0 + rows_per_part < N ? p0 + rows_per_part : N;
    if (AHEAD && has_in && p0 + warp < p1) { hc_stage_dxp<NS, NPK>(stage, dXp_in, p0 + warp, C, lane); }
    for (size_t p = p0 + warp; p < p1; p += HC_WARPS) {
        if (STAGED && !AHEAD && has_in) { hc_stage_dxp<NS, NPK>(stage, dXp_in, p, C, lane); }
        const float s = rstd[p];
        // pass 1: h = sum_r w[r] X_r (the forward's order), dug = du g, and the row's sums
        float h[NPK][8], dug[NPK][8], gwx = 0.0f, P[NS], Q[NS];
#pragma unroll
        for (int r = 0; r < NS; r++) { P[r] = 0.0f; Q[r] = 0.0f; }
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int c0 = (lane + 32 * q) * 8;
#pragma unroll
            for (int k = 0; k < 8; k++) { h[q][k] = 0.0f; dug[q][k] = 0.0f; }
            if (c0 >= C) { continue; }
            float x[NS][8];
            if (Xprev) {   // X_j = A_{j-1} X_{j-1} + beta_{j-1} o_{j-1}, the forward's bits (pass 2 reads both again)
                float xp[NS][8], ov[8];
#pragma unroll
                for (int s2 = 0; s2 < NS; s2++) {
                    HcPackX v = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s2) * C) + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { xp[s2][k] = toF(v.x[k]); }
                }
                HcPackX v = *reinterpret_cast<const HcPackX *>(o + p * C + c0);
#pragma unroll
                for (int k = 0; k < 8; k++) { ov[k] = toF(v.x[k]); }
#pragma unroll
                for (int r = 0; r < NS; r++) {
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        x[r][k] = toF(fromF<floatX>(hc_update_at<NS>(a[r], b[r], xp, ov[k], k)));
                    }
                }
            } else {   // site 0: X_0, the n equal streams of the embedding (xb), or stored streams
#pragma unroll
                for (int r = 0; r < NS; r++) {
                    HcPackX v = *reinterpret_cast<const HcPackX *>(X + (xb ? p * C : (p * NS + r) * C) + c0);
#pragma unroll
                    for (int k = 0; k < 8; k++) { x[r][k] = toF(v.x[k]); }
                }
            }
#pragma unroll
            for (int r = 0; r < NS; r++) {
#pragma unroll
                for (int k = 0; k < 8; k++) { h[q][k] += wr[r] * x[r][k]; }
            }
            HcPackF d0 = *reinterpret_cast<const HcPackF *>(du + p * C + c0);
            float gf[8];
            hc_load_g8(gf, g + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) {   // dg_j += du h s (std's order);  sum_c du g h;  du g . X_r, h . X_r
                dug[q][k] = d0.x[k] * gf[k];
                gwx += dug[q][k] * h[q][k];
                gsh[32 * (8 * q + k)] += d0.x[k] * h[q][k] * s;
#pragma unroll
                for (int r = 0; r < NS; r++) { P[r] += dug[q][k] * x[r][k]; Q[r] += h[q][k] * x[r][k]; }
            }
        }
        gwx = warp_sum(gwx);
        const float k3 = s * s * s / C * gwx;
#pragma unroll
        for (int r = 0; r < NS; r++) { acc[r] += s * P[r] - k3 * Q[r]; }   // dw[r] += dh . X_r
        if (STAGED && has_in) { hc_cp_wait_all(); }   // this lane's staged dXp chunks have landed
        // pass 2: dh, then the read's and the update's backward
#pragma unroll
        for (int q = 0; q < NPK; q++) {
            const int c0 = (lane + 32 * q) * 8;
            if (c0 >= C) { continue; }
            float d[NS][8];
#pragma unroll
            for (int r = 0; r < NS; r++) {   // dX_j = dXp + w dh,  dh = s du g - k3 h
                float dv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                if (has_in && VER == 8) { hc24_load8(dv, dxh_in, dxl_in, (p * NS + r) * C + c0); }
                if (has_in && STAGED) {
                    const float4 lo = stage[((r * NPK + q) * 2) * 32 + lane];
                    const float4 hi = stage[((r * NPK + q) * 2 + 1) * 32 + lane];
                    dv[0] = lo.x; dv[1] = lo.y; dv[2] = lo.z; dv[3] = lo.w;
                    dv[4] = hi.x; dv[5] = hi.y; dv[6] = hi.z; dv[7] = hi.w;
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
            HcPackX op;
            float ov[8];
            HcPackX o0 = *reinterpret_cast<const HcPackX *>(o + p * C + c0);
#pragma unroll
            for (int k = 0; k < 8; k++) { ov[k] = toF(o0.x[k]); }
#pragma unroll
            for (int k = 0; k < 8; k++) {   // do = sum_r beta[r] dX_r;  dbeta[r] += dX_r . o
                float t = 0.0f;
#pragma unroll
                for (int r = 0; r < NS; r++) { t += b[r] * d[r][k]; acc[NS + NS * NS + r] += d[r][k] * ov[k]; }
                op.x[k] = fromF<floatX>(t);
            }
            *reinterpret_cast<HcPackX *>(dout + p * C + c0) = op;
#pragma unroll
            for (int s2 = 0; s2 < NS; s2++) {   // dXp_{j-1},s = sum_r A[r,s] dX_r;  dA[r,s] += dX_r . Xprev_s
                HcPackX xv = *reinterpret_cast<const HcPackX *>(Xprev + (xpb ? p * C : (p * NS + s2) * C) + c0);
                HcPackF out;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float xs = toF(xv.x[k]), v = 0.0f;
#pragma unroll
                    for (int r = 0; r < NS; r++) { v += a[r][s2] * d[r][k]; acc[NS + r * NS + s2] += d[r][k] * xs; }
                    out.x[k] = v;
                }
                if (VER == 8) { hc24_store8(dxh_out, dxl_out, (p * NS + s2) * C + c0, out.x); }
                else { *reinterpret_cast<HcPackF *>(dXp_out + (p * NS + s2) * C + c0) = out; }
            }
        }
        if (AHEAD && has_in && p + HC_WARPS < p1) { hc_stage_dxp<NS, NPK>(stage, dXp_in, p + HC_WARPS, C, lane); }
    }
    // the block's shares: the lanes' sums (fixed butterfly), then the warps in order
#pragma unroll
    for (int i = 0; i < NP; i++) { acc[i] = warp_sum(acc[i]); }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NP; i++) { red[warp][i] = acc[i]; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NP; i += blockDim.x) {
        float t = 0.0f;
        for (int k = 0; k < HC_WARPS; k++) { t += red[k][i]; }
        partial[(size_t)blockIdx.x * NP + i] = t;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int i = 32 * (8 * (c / 256) + c % 8) + c / 8 % 32;
        float t = 0.0f;
        for (int k = 0; k < HC_WARPS; k++) { t += hc_gsh[(size_t)k * 256 * NPK + i]; }
        gpart[(size_t)blockIdx.x * C + c] = t;
    }
}

// v6 (ver 6), v7 (ver 7) where their stages fit, else v5 (kernels/hc.cuh); v8 (ver 8: dXp in
// dxh, dxl; dXp_in, dXp_out unused). The other arguments are hc_norm_read_update_backward's.
static void hc_norm_read_update_backward_v6(int ver, float *dXp_out, uint16_t *dxh_out, uint8_t *dxl_out,
                                            floatX *dout, float *dx0, float *dw, float *dalpha, float *dA,
                                            float *dbeta, float *dg, float *partial, const float *dXp_in,
                                            const uint16_t *dxh_in, const uint8_t *dxl_in, const float *du,
                                            const float *rstd, const floatX *g, const floatX *X, const float *w,
                                            const floatX *Xprev, const floatX *o, const float *A, const float *beta,
                                            size_t N, int C, int n, int xb, int xpb, cudaStream_t st = 0) {
    const int q = (int)ceil_div(C, 256), npk = q <= 2 ? q : q <= 4 ? 4 : 8;   // hc_pack_dispatch's NPK
    if (ver != 8 && (size_t)HC_WARPS * n * 256 * npk * sizeof(float) > HC_STAGE_MAX) {
        hc_norm_read_update_backward_v5(dXp_out, dout, dx0, dw, dalpha, dA, dbeta, dg, partial, dXp_in, du, rstd, g, X,
                                     w, Xprev, o, A, beta, N, C, n, xb, xpb, st);
        return;
    }
    const int rows = hc_rows_per_part(N), P = (int)ceil_div(N, rows), NP = 2 * n + n * n;
    float *gpart = partial + (size_t)P * NP;
    hc_dispatch(n, [&](auto ns) {
        hc_pack_dispatch(C, C, g, [&](auto npk) {
            constexpr int NS_ = decltype(ns)::value, NPK_ = decltype(npk)::value;
            const size_t smem = (size_t)HC_WARPS * 256 * NPK_ * sizeof(float) * (ver == 8 ? 1 : 1 + NS_);
            auto launch = [&](auto kernel) {
                if (smem > 48 * 1024) {
                    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                }
                kernel<<<P, 32 * HC_WARPS, smem, st>>>(dXp_out, dxh_out, dxl_out, dout, dx0, partial, gpart, dXp_in,
                                                       dxh_in, dxl_in, du, rstd, g, X, w, Xprev, o, A, beta, N, C,
                                                       rows, xb, xpb);
            };
            if (ver == 6) { launch(hc_norm_read_update_backward_v6_kernel<NS_, NPK_, 6>); }
            else if (ver == 7) { launch(hc_norm_read_update_backward_v6_kernel<NS_, NPK_, 7>); }
            else { launch(hc_norm_read_update_backward_v6_kernel<NS_, NPK_, 8>); }
        });
    });
    launchCheck();
    hc_reduce_v3_kernel<<<ceil_div(NP + C, 32), dim3(32, 32), 0, st>>>(dw, dA, dbeta, dg, dalpha, w, partial, P, n, C);
    launchCheck();
}

// ============================================================================
// ============================================================================
// fp64 CPU reference (from the bf16 inputs as doubles)
// ============================================================================

// float -> bf16 bits, round to nearest even (finite inputs)
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static double round_bf16(double v) { return (double)bf2f(f2bf((float)v)); }
// fp32 rounded to its top 24 bits (v8's storage of dXp; hc24_round)
static float round24(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = hc24_round(u) << 8;
    memcpy(&v, &u, 4);
    return v;
}

// fwd: Xn = A X + beta o (rounded to bf16 when rnd), h = sum_r w[r] Xn_r (unrounded)
static void ref_forward(const double *X, const double *o, const double *A, const double *beta, const double *w,
                        size_t N, int C, int n, bool rnd, double *Xn, double *h) {
    for (size_t p = 0; p < N; p++) {
        for (int c = 0; c < C; c++) {
            double hv = 0;
            for (int r = 0; r < n; r++) {
                double v = beta[r] * o[p * C + c];
                for (int s = 0; s < n; s++) { v += A[r * n + s] * X[(p * n + s) * C + c]; }
                if (rnd) { v = round_bf16(v); }
                Xn[(p * n + r) * C + c] = v;
                hv += w[r] * v;
            }
            h[p * C + c] = hv;
        }
    }
}

// bwd (kernels/hc.cuh): dX = dXp + w dh; dXp_new = A^T dX; dout = beta . dX; dw += dh . X;
// dA += dX Xprev^T; dbeta += dX . o
static void ref_backward(const double *dXp, const double *dh, const double *X, const double *w, const double *Xprev,
                         const double *o, const double *A, const double *beta, size_t N, int C, int n,
                         double *dXp_new, double *dout, double *dw, double *dA, double *dbeta) {
    std::vector<double> d(n);
    for (size_t p = 0; p < N; p++) {
        for (int c = 0; c < C; c++) {
            double g = dh[p * C + c], so = 0;
            for (int r = 0; r < n; r++) {
                d[r] = dXp[(p * n + r) * C + c] + w[r] * g;
                dw[r] += g * X[(p * n + r) * C + c];
                so += beta[r] * d[r];
                dbeta[r] += d[r] * o[p * C + c];
            }
            dout[p * C + c] = so;
            for (int s = 0; s < n; s++) {
                double v = 0;
                for (int r = 0; r < n; r++) {
                    v += A[r * n + s] * d[r];
                    dA[r * n + s] += d[r] * Xprev[(p * n + s) * C + c];
                }
                dXp_new[(p * n + s) * C + c] = v;
            }
        }
    }
}

// v3's norm: u = h s g, s = 1 / sqrt(mean(h^2) + 1e-6) per position (rstd = s), as std's rmsnorm
static void ref_norm(const double *h, const double *g, size_t N, int C, double *u, double *rstd) {
    for (size_t p = 0; p < N; p++) {
        double ss = 0;
        for (int c = 0; c < C; c++) { ss += h[p * C + c] * h[p * C + c]; }
        double s = 1.0 / sqrt(ss / C + 1e-6);
        rstd[p] = s;
        for (int c = 0; c < C; c++) { u[p * C + c] = h[p * C + c] * s * g[c]; }
    }
}

// h = sum_r w[r] X_r (X (N, n, C))
static void ref_read(const double *X, const double *w, size_t N, int C, int n, double *h) {
    for (size_t p = 0; p < N; p++) {
        for (int c = 0; c < C; c++) {
            double v = 0;
            for (int r = 0; r < n; r++) { v += w[r] * X[(p * n + r) * C + c]; }
            h[p * C + c] = v;
        }
    }
}

// v3's norm backward, given du and the forward's s = rstd (kernels/rmsnorm.cuh's formula):
// dh = s du g - s^3 / C (sum_c du g h) h;  dg += du h s
static void ref_norm_backward(const double *du, const double *h, const double *rstd, const double *g, size_t N,
                              int C, double *dh, double *dg) {
    for (size_t p = 0; p < N; p++) {
        double s = rstd[p], gwx = 0;
        for (int c = 0; c < C; c++) { gwx += du[p * C + c] * g[c] * h[p * C + c]; }
        for (int c = 0; c < C; c++) {
            dh[p * C + c] = s * du[p * C + c] * g[c] - s * s * s / C * gwx * h[p * C + c];
            dg[c] += du[p * C + c] * h[p * C + c] * s;
        }
    }
}

// ============================================================================
// v1: one thread per element, unfused
// ============================================================================

__global__ void hc_update_v1_kernel(floatX *Xn, const floatX *X, const floatX *o, const float *A, const float *beta,
                                    size_t N, int C, int n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;   // (p, r, c)
    if (i >= N * n * C) { return; }
    size_t p = i / ((size_t)n * C);
    int r = (int)(i / C % n), c = (int)(i % C);
    float v = beta[r] * toF(o[p * C + c]);
    for (int s = 0; s < n; s++) { v += A[r * n + s] * toF(X[(p * n + s) * C + c]); }
    Xn[i] = fromF<floatX>(v);
}

__global__ void hc_read_v1_kernel(floatX *h, const floatX *X, const float *w, size_t N, int C, int n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;   // (p, c)
    if (i >= N * C) { return; }
    size_t p = i / C;
    int c = (int)(i % C);
    float v = 0.0f;
    for (int r = 0; r < n; r++) { v += w[r] * toF(X[(p * n + r) * C + c]); }
    h[i] = fromF<floatX>(v);
}

// dX = dXp + w dh (kept in dX for the parameter kernel); dXp <- A^T dX; dout = beta . dX
__global__ void hc_backward_v1_kernel(float *dX, float *dXp, floatX *dout, const float *dh, const float *w,
                                      const float *A, const float *beta, size_t N, int C, int n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;   // (p, c)
    if (i >= N * C) { return; }
    size_t p = i / C;
    int c = (int)(i % C);
    float d[HC_MAX_N], so = 0.0f;
    for (int r = 0; r < n; r++) {
        d[r] = dXp[(p * n + r) * C + c] + w[r] * dh[i];
        dX[(p * n + r) * C + c] = d[r];
        so += beta[r] * d[r];
    }
    dout[i] = fromF<floatX>(so);
    for (int s = 0; s < n; s++) {
        float v = 0.0f;
        for (int r = 0; r < n; r++) { v += A[r * n + s] * d[r]; }
        dXp[(p * n + s) * C + c] = v;
    }
}

// partial (P, 2n + n^2): one block per part of rows positions; thread t sums its channels'
// terms over the part's positions, then the block's threads are summed in order by thread 0
__global__ void hc_params_v1_kernel(float *partial, const float *dX, const float *dh, const floatX *X,
                                    const floatX *Xprev, const floatX *o, size_t N, int C, int n, int rows) {
    extern __shared__ float sh[];   // (blockDim.x, NP)
    const int NP = 2 * n + n * n;
    float *mine = sh + (size_t)threadIdx.x * NP;
    for (int i = 0; i < NP; i++) { mine[i] = 0.0f; }
    size_t p0 = (size_t)blockIdx.x * rows, p1 = p0 + rows < N ? p0 + rows : N;
    for (size_t p = p0; p < p1; p++) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float g = dh[p * C + c], ov = toF(o[p * C + c]);
            for (int r = 0; r < n; r++) {
                float d = dX[(p * n + r) * C + c];
                mine[r] += g * toF(X[(p * n + r) * C + c]);
                mine[n + n * n + r] += d * ov;
                for (int s = 0; s < n; s++) { mine[n + r * n + s] += d * toF(Xprev[(p * n + s) * C + c]); }
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 0; i < NP; i++) {
            float s = 0.0f;
            for (int t = 0; t < (int)blockDim.x; t++) { s += sh[(size_t)t * NP + i]; }
            partial[(size_t)blockIdx.x * NP + i] = s;
        }
    }
}

// ============================================================================
// checks and benchmarks
// ============================================================================

static bool quick = false;
struct Shape { size_t N; int C, n; };
// the last two reach v3's pack counts 4 (C = 776: three packs of a lane and a fourth for lane 0
// only) and 8 (C = 2048, the widest the kernels take)
static const Shape check_shapes[] = {{37, 8, 1},  {129, 64, 2}, {300, 512, 4}, {1000, 512, 4},
                                     {77, 256, 8}, {50, 776, 2}, {40, 2048, 4}};
static const Shape bench_shape = {16 * 2048, 512, 4};

// X' = A X + beta o rounded to bf16, in kernels/hc.cuh's fp32 order (hc_update_at: one product,
// then fused multiply-adds in stream order), so the same bits as the forward kernel; xb = 1: X
// is (N, C), the n equal streams of the embedding
static void host_update(float *Xn, const float *X, const float *o, const float *A, const float *beta, size_t N,
                        int C, int n, bool xb) {
    for (size_t p = 0; p < N; p++) {
        for (int r = 0; r < n; r++) {
            for (int c = 0; c < C; c++) {
                float v = beta[r] * o[p * C + c];
                for (int t = 0; t < n; t++) { v = fmaf(A[r * n + t], X[(xb ? p : p * n + t) * C + c], v); }
                Xn[(p * n + r) * C + c] = bf2f(f2bf(v));
            }
        }
    }
}

// host inputs (bf16 values kept as floats so both sides see the same numbers). dh is v1/v2's
// dL/dh and v3's du (dL/du); g the norm weight (v3), rstd (v3's backward) the fp64 rstd of
// h = sum_r w[r] X_r rounded to fp32, as the forward would have stored it.
struct Inputs {
    std::vector<float> X, Xprev, o, dXp, dh, A, beta, w, Aprev, bprev, g, rstd;
};
static Inputs make_inputs(const Shape &s, uint64_t seed) {
    host_rng = seed;
    Inputs in;
    size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
    auto bf = [](double v) { return bf2f(f2bf((float)v)); };
    in.X.resize(NS); in.Xprev.resize(NS); in.o.resize(NC); in.dXp.resize(NS); in.dh.resize(NC);
    for (auto &v : in.X) { v = bf(host_normal()); }   // replaced below by the update of Xprev and o
    for (auto &v : in.Xprev) { v = bf(host_normal()); }
    for (auto &v : in.o) { v = bf(0.5 * host_normal()); }
    for (auto &v : in.dXp) { v = (float)(0.01 * host_normal()); }
    for (auto &v : in.dh) { v = (float)(0.01 * host_normal()); }
    int n = s.n;
    in.A.resize(n * n); in.Aprev.resize(n * n); in.beta.resize(n); in.bprev.resize(n); in.w.resize(n);
    for (int i = 0; i < n * n; i++) {
        in.A[i] = (float)((i / n == i % n) + 0.3 * host_normal());
        in.Aprev[i] = (float)((i / n == i % n) + 0.3 * host_normal());
    }
    double ws = 0;
    for (int r = 0; r < n; r++) {
        in.beta[r] = (float)((r == 0) + 0.3 * host_normal());
        in.bprev[r] = (float)((r == 0) + 0.3 * host_normal());
        in.w[r] = (float)exp(host_normal());
        ws += in.w[r];
    }
    for (int r = 0; r < n; r++) { in.w[r] = (float)(in.w[r] / ws); }
    // X_j as the forward made it from X_{j-1} and o_{j-1} (v5's backward recomputes it; the
    // earlier versions read it)
    host_update(in.X.data(), in.Xprev.data(), in.o.data(), in.Aprev.data(), in.bprev.data(), s.N, s.C, n, false);
    in.g.resize(s.C);
    for (auto &v : in.g) { v = bf(1 + 0.1 * host_normal()); }
    std::vector<double> h(NC), u(NC), rs(s.N);
    std::vector<double> X = std::vector<double>(in.X.begin(), in.X.end()), w(in.w.begin(), in.w.end()),
                        g(in.g.begin(), in.g.end());
    ref_read(X.data(), w.data(), s.N, s.C, n, h.data());
    ref_norm(h.data(), g.data(), s.N, s.C, u.data(), rs.data());
    in.rstd.assign(rs.begin(), rs.end());
    return in;
}
static std::vector<double> D(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }

template <typename T> static T *upload(const std::vector<float> &v) {
    std::vector<T> h(v.size());
    for (size_t i = 0; i < v.size(); i++) { h[i] = fromF<T>(v[i]); }
    T *d = dalloc<T>(v.size());
    cudaCheck(cudaMemcpy(d, h.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// device buffers of one shape (v3: u and rstd out of fwd; g, rstd_in into bwd, dg out)
struct Dev {
    floatX *X, *Xprev, *o, *Xn, *h, *dout, *u, *g;
    float *dXp, *dXtmp, *dh, *A, *beta, *w, *Aprev, *bprev, *dw, *dA, *dbeta, *partial, *rstd, *rstd_in, *dg, *dalpha;
    uint16_t *dxh;   // v8: dXp in 24 bits (hc24_encode of dXp before a run, decoded into dXp after)
    uint8_t *dxl;
    int P, rows;
};
static Dev dev_make(const Shape &s, const Inputs &in) {
    Dev d;
    size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
    d.X = upload<floatX>(in.X); d.Xprev = upload<floatX>(in.Xprev); d.o = upload<floatX>(in.o);
    d.Xn = dalloc<floatX>(NS); d.h = dalloc<floatX>(NC); d.dout = dalloc<floatX>(NC); d.u = dalloc<floatX>(NC);
    d.dXp = upload<float>(in.dXp); d.dXtmp = dalloc<float>(NS); d.dh = upload<float>(in.dh);
    d.dxh = dalloc<uint16_t>(NS); d.dxl = dalloc<uint8_t>(NS);
    d.A = upload<float>(in.A); d.beta = upload<float>(in.beta); d.w = upload<float>(in.w);
    d.Aprev = upload<float>(in.Aprev); d.bprev = upload<float>(in.bprev);
    d.g = upload<floatX>(in.g); d.rstd_in = upload<float>(in.rstd);
    d.rstd = dalloc<float>(s.N); d.dg = dalloc<float>(s.C);
    int n = s.n;
    d.dw = dalloc<float>(n); d.dA = dalloc<float>(n * n); d.dbeta = dalloc<float>(n); d.dalpha = dalloc<float>(n);
    d.rows = hc_rows_per_part(s.N);
    d.P = (int)ceil_div(s.N, d.rows);
    d.partial = dalloc<float>(hc_partial_floats(s.N, n, s.C));
    return d;
}
static void dev_free(Dev &d) {
    void *ps[] = {d.X, d.Xprev, d.o, d.Xn, d.h, d.dout, d.u, d.g, d.dXp, d.dXtmp, d.dh, d.A, d.beta, d.w, d.Aprev,
                  d.bprev, d.dw, d.dA, d.dbeta, d.partial, d.rstd, d.rstd_in, d.dg, d.dalpha, d.dxh, d.dxl};
    for (void *p : ps) { cudaCheck(cudaFree(p)); }
}

// v9, v10 and v12 (v12's kernel above; G: HcGradF32 for v9, HcGrad24v10 for v10, HcGrad24 for
// v12), v16 and v17 (V = 16: the lab's copy; V = 17: kernels/hc.cuh; G: HcGrad24), as one site's
// backward with v5's arguments:
// the kernel, then its sums (hc_reduce_sites with one site; the trainer reduces all the sites of
// a backward in one launch)
template <int V = 12, typename G>
static void hc_backward_v9(G dXp_out, floatX *dout, float *dx0, float *dw, float *dalpha, float *dA, float *dbeta,
                           float *dg, float *partial, G dXp_in, const float *du, const float *rstd, const floatX *g,
                           const floatX *X, const float *w, const floatX *Xprev, const floatX *o, const float *A,
                           const float *beta, size_t N, int C, int n, int xb, int xpb) {
    if (V == 17) {
        hc_norm_read_update_backward(dXp_out, dout, dx0, partial, dXp_in, du, rstd, g, X, w, Xprev, o, A, beta, N, C,
                                     n, xb, xpb);
    } else if (V == 16) {
        hc_norm_read_update_backward_v16(dXp_out, dout, dx0, partial, dXp_in, du, rstd, g, X, w, Xprev, o, A, beta,
                                         N, C, n, xb, xpb);
    } else {
        hc_norm_read_update_backward_v12(dXp_out, dout, dx0, partial, dXp_in, du, rstd, g, X, w, Xprev, o, A, beta, N,
                                         C, n, xb, xpb);
    }
    const HcSums sums = {dw, dalpha, dA, dbeta, dg, w};
    hc_reduce_sites([&](int) { return sums; }, partial, 0, 1, N, n, C);
}

// fwd of the update of j and the read of j+1 (v3: and its norm)
static void run_fwd(int ver, const Shape &s, Dev &d) {
    if (ver == 1) {
        hc_update_v1_kernel<<<ceil_div(s.N * s.n * s.C, 256), 256>>>(d.Xn, d.X, d.o, d.A, d.beta, s.N, s.C, s.n);
        launchCheck();
        hc_read_v1_kernel<<<ceil_div(s.N * s.C, 256), 256>>>(d.h, d.Xn, d.w, s.N, s.C, s.n);
        launchCheck();
    } else if (ver == 2) {
        hc_update_read_forward_v2(d.Xn, d.h, d.X, d.o, d.A, d.beta, d.w, s.N, s.C, s.n);
    } else {   // v3: v15's kernel at blocks of 8 warps, no minimum of blocks an SM
        hc_update_read_norm_forward_v15<8, 1>(d.Xn, d.u, d.rstd, d.X, d.o, d.A, d.beta, d.w, d.g, s.N, s.C, s.n);
    }
}
// bwd of the read of j (w, X; v3: and its norm, du = d.dh, rstd_in, g) and the update of j-1
// (Aprev, bprev, Xprev, o); dXp in place
static void run_bwd(int ver, const Shape &s, Dev &d) {
    if (ver == 1) {
        hc_backward_v1_kernel<<<ceil_div(s.N * s.C, 256), 256>>>(d.dXtmp, d.dXp, d.dout, d.dh, d.w, d.Aprev, d.bprev,
                                                                 s.N, s.C, s.n);
        launchCheck();
        const int NP = 2 * s.n + s.n * s.n;
        hc_params_v1_kernel<<<d.P, 64, 64 * NP * sizeof(float)>>>(d.partial, d.dXtmp, d.dh, d.X, d.Xprev, d.o, s.N,
                                                                  s.C, s.n, d.rows);
        launchCheck();
        hc_reduce_v1_kernel<<<1, 128>>>(d.dw, d.dA, d.dbeta, d.partial, d.P, s.n);
        launchCheck();
    } else if (ver == 2) {
        hc_read_update_backward_v2(d.dXp, d.dout, NULL, d.dw, d.dA, d.dbeta, d.partial, d.dXp, d.dh, d.X, d.w,
                                   d.Xprev, d.o, d.Aprev, d.bprev, s.N, s.C, s.n);
    } else if (ver == 3) {
        hc_norm_read_update_backward_v3(d.dXp, d.dout, NULL, d.dw, d.dalpha, d.dA, d.dbeta, d.dg, d.partial, d.dXp,
                                        d.dh, d.rstd_in, d.g, d.X, d.w, d.Xprev, d.o, d.Aprev, d.bprev, s.N, s.C, s.n,
                                        0, 0);
    } else if (ver == 9) {   // v9 (kernels/hc.cuh): v5 split over a pair of warps a position
        hc_backward_v9(HcGradF32{d.dXp}, d.dout, NULL, d.dw, d.dalpha, d.dA, d.dbeta, d.dg, d.partial,
                       HcGradF32{d.dXp}, d.dh, d.rstd_in, d.g, NULL, d.w, d.Xprev, d.o, d.Aprev, d.bprev, s.N, s.C,
                       s.n, 0, 0);
    } else if (ver == 10) {   // v10: v9 with dXp in 24 bits, in place in d.dxh, d.dxl (as v8)
        hc_backward_v9(HcGrad24v10{d.dxh, d.dxl}, d.dout, NULL, d.dw, d.dalpha, d.dA, d.dbeta, d.dg, d.partial,
                       HcGrad24v10{d.dxh, d.dxl}, d.dh, d.rstd_in, d.g, NULL, d.w, d.Xprev, d.o, d.Aprev, d.bprev,
                       s.N, s.C, s.n, 0, 0);
    } else if (ver == 12 || ver == 16 || ver == 17) {   // v12: v10 by byte permutes; v16: v12, leaner; v17: staged
        auto run = [&](auto v) {
            hc_backward_v9<decltype(v)::value>(HcGrad24{d.dxh, d.dxl}, d.dout, NULL, d.dw, d.dalpha, d.dA, d.dbeta,
                                                 d.dg, d.partial, HcGrad24{d.dxh, d.dxl}, d.dh, d.rstd_in, d.g, NULL,
                                                 d.w, d.Xprev, d.o, d.Aprev, d.bprev, s.N, s.C, s.n, 0, 0);
        };
        if (ver == 17) { run(std::integral_constant<int, 17>()); }
        else if (ver == 16) { run(std::integral_constant<int, 16>()); }
        else { run(std::integral_constant<int, 12>()); }
    } else if (ver == 5) {   // v5: X = NULL, X_j recomputed from Xprev and o
        hc_norm_read_update_backward_v5(d.dXp, d.dout, NULL, d.dw, d.dalpha, d.dA, d.dbeta, d.dg, d.partial, d.dXp,
                                        d.dh, d.rstd_in, d.g, NULL, d.w, d.Xprev, d.o, d.Aprev, d.bprev, s.N, s.C, s.n,
                                        0, 0);
    } else {   // v6, v7: dXp staged (v5 itself where the stages do not fit); v8: dXp in 24 bits, in
               // place in d.dxh, d.dxl (check_op encodes d.dXp into them before and decodes after)
        const bool b24 = ver == 8;
        hc_norm_read_update_backward_v6(ver, b24 ? NULL : d.dXp, b24 ? d.dxh : NULL, b24 ? d.dxl : NULL, d.dout, NULL,
                                        d.dw, d.dalpha, d.dA, d.dbeta, d.dg, d.partial, b24 ? NULL : d.dXp,
                                        b24 ? d.dxh : NULL, b24 ? d.dxl : NULL, d.dh, d.rstd_in, d.g, NULL, d.w,
                                        d.Xprev, d.o, d.Aprev, d.bprev, s.N, s.C, s.n, 0, 0);
    }
}

// v3 fwd's u and rstd against the fp64 norm of h = sum_r w[r] Xn_r, Xn the kernel's own output
// (so a rounding of Xn that lands one ulp from the reference's, which the Xn check allows, does
// not count twice); the tolerances are the header's
static bool check_norm_fwd(const char *tag, const std::vector<double> &Xn, const std::vector<float> &w,
                           const std::vector<float> &g, const std::vector<unsigned char> &u,
                           const std::vector<unsigned char> &rstd, size_t N, int C, int n) {
    std::vector<double> h(N * C), ur(N * C), rr(N);
    ref_read(Xn.data(), D(w).data(), N, C, n, h.data());
    ref_norm(h.data(), D(g).data(), N, C, ur.data(), rr.data());
    char nu[64], nr[64];
    snprintf(nu, sizeof(nu), "%su", tag); snprintf(nr, sizeof(nr), "%srstd", tag);
    bool ok = compare(nu, bytes_bf16_to_f(u), ur, 1.0 / 256, 1e-5);
    ok &= compare(nr, bytes_f32(rstd), rr, 1e-5, 0);
    return ok;
}

// dalpha = w (dw - sum_t w_t dw_t), the softmax's backward (v3's reduction adds it)
static std::vector<double> ref_softmax_backward(const std::vector<double> &dw, const std::vector<float> &w) {
    double S = 0;
    for (size_t t = 0; t < dw.size(); t++) { S += w[t] * dw[t]; }
    std::vector<double> da(dw.size());
    for (size_t r = 0; r < dw.size(); r++) { da[r] = w[r] * (dw[r] - S); }
    return da;
}

// the v3 backward's reference: the norm's backward (dh, dg), then the v2 reference with that dh
static void ref_backward3(const Inputs &in, const std::vector<double> &dXp, const std::vector<double> &X,
                          const std::vector<double> &Xprev, const Shape &s, double *dXn, double *dout, double *dw,
                          double *dA, double *db, double *dg) {
    size_t NC = s.N * s.C;
    std::vector<double> h(NC), dh(NC);
    ref_read(X.data(), D(in.w).data(), s.N, s.C, s.n, h.data());
    ref_norm_backward(D(in.dh).data(), h.data(), D(in.rstd).data(), D(in.g).data(), s.N, s.C, dh.data(), dg);
    ref_backward(dXp.data(), dh.data(), X.data(), D(in.w).data(), Xprev.data(), D(in.o).data(), D(in.Aprev).data(),
                 D(in.bprev).data(), s.N, s.C, s.n, dXn, dout, dw, dA, db);
}

// v3's dw_r = sum_p sum_c dh_pc X_prc with dh = s du g - k3 h (the norm's backward): the scale of
// its fp32 terms, S_r = sum_p sum_c (|s du g| + |k3 h|) |X_r|. dw can cancel to nothing: at n = 1,
// h = X (w = 1) and dh . h = 0 by the norm's scale invariance, so dw = 0 exactly and both sides
// hold rounding residue, which a bound relative to max|ref| cannot judge; a bound relative to S
// can. Every term passes through at most C/32 (a lane's channels) + 5 (the warp's butterfly) +
// N (a warp's positions and the blocks' partials) fp32 additions, plus the product and k3's own
// C-term sum (C/32 + 5): gamma = (2 C/32 + N + 16) 2^-24 bounds the error by gamma S to first order.
static std::vector<double> ref_dw_scale3(const Inputs &in, const Shape &s, double *gamma) {
    size_t NC = s.N * s.C;
    std::vector<double> h(NC), S(s.n, 0.0);
    ref_read(D(in.X).data(), D(in.w).data(), s.N, s.C, s.n, h.data());
    for (size_t p = 0; p < s.N; p++) {
        double sp = in.rstd[p], gwx = 0;
        for (int c = 0; c < s.C; c++) { gwx += (double)in.dh[p * s.C + c] * in.g[c] * h[p * s.C + c]; }
        double k3 = sp * sp * sp / s.C * gwx;
        for (int c = 0; c < s.C; c++) {
            double t = fabs(sp * in.dh[p * s.C + c] * in.g[c]) + fabs(k3 * h[p * s.C + c]);
            for (int r = 0; r < s.n; r++) { S[r] += t * fabs((double)in.X[(p * s.n + r) * s.C + c]); }
        }
    }
    *gamma = (2.0 * s.C / 32 + (double)s.N + 16) * ldexp(1.0, -24);
    return S;
}

// compare's test, or (either passes) |got - ref| <= gamma scale[i]: for sums whose terms cancel
static bool compare_scaled(const char *name, const std::vector<float> &got, const std::vector<double> &ref,
                           double rtol, double atol, const std::vector<double> &scale, double gamma) {
    double mref = 0, worst = 0;
    for (double r : ref) { mref = std::max(mref, fabs(r)); }
    bool ok = got.size() == ref.size();
    for (size_t i = 0; i < ref.size() && i < got.size(); i++) {
        double e = std::isfinite((double)got[i]) ? fabs((double)got[i] - ref[i]) : INFINITY;
        worst = std::max(worst, scale[i] > 0 ? e / scale[i] : e);
        if (!(e <= rtol * fabs(ref[i]) + atol * mref || e <= gamma * scale[i])) { ok = false; }
    }
    printf(" %s %.1e of its terms' scale (bound %.1e)%s", name, worst, gamma, ok ? "" : "(FAIL)");
    return ok;
}

static bool check_op(bool fwd, int ver, uint64_t seed) {
    bool ok = true;
    int ns = quick ? 2 : (int)(sizeof(check_shapes) / sizeof(check_shapes[0]));
    for (int si = 0; si < ns; si++) {
        const Shape &s = check_shapes[si];
        Inputs in = make_inputs(s, seed + si);
        size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
        if (dxp24(ver)) {   // 24-bit dXp read (v8, v10, v12, and v5, v9, v10 beside them)
            for (float &v : in.dXp) { v = round24(v); }
        }
        printf("%s v%d N=%zu C=%d n=%d:", fwd ? "fwd" : "bwd", ver, s.N, s.C, s.n);
        std::vector<unsigned char> first[7];
        // v5's backward runs after v3's on the same inputs (rep -1) and must give its bits; v6's,
        // v7's and v8's after v5's, likewise (v8's dXp: v5's rounded to 24 bits); v10's after v9's
        // (its dXp: v9's rounded to 24 bits); v12's after v10's; v16's after v12's; v17's after v16's
        const int base = ver == 5 ? 3 : ver == 10 ? 9 : ver == 12 ? 10 : ver == 16 ? 12 : ver == 17 ? 16 : 5;
        std::vector<unsigned char> v3bits[7];
        for (int rep = (!fwd && ver >= 5 && ver != 9) ? -1 : 0; rep < 2; rep++) {
            const int v = rep < 0 ? base : ver;
            Dev d = dev_make(s, in);
            zero(d.dw, s.n * 4); zero(d.dA, s.n * s.n * 4); zero(d.dbeta, s.n * 4); zero(d.dg, s.C * 4);
            zero(d.dalpha, s.n * 4);
            if (fwd) { run_fwd(v, s, d); }
            else if (dxp24(v)) {
                hc24_encode_kernel<<<ceil_div(NS, 256), 256>>>(d.dxh, d.dxl, d.dXp, NS);
                launchCheck();
                run_bwd(v, s, d);
                hc24_decode_kernel<<<ceil_div(NS, 256), 256>>>(d.dXp, d.dxh, d.dxl, NS);
                launchCheck();
            } else { run_bwd(v, s, d); }
            cudaCheck(cudaDeviceSynchronize());
            std::vector<unsigned char> out[7];
            if (fwd) {
                out[0] = fetch_bytes(d.Xn, NS * 2);
                if (ver < 3) { out[1] = fetch_bytes(d.h, NC * 2); }
                else { out[1] = fetch_bytes(d.u, NC * 2); out[2] = fetch_bytes(d.rstd, s.N * 4); }
            } else {
                out[0] = fetch_bytes(d.dXp, NS * 4); out[1] = fetch_bytes(d.dout, NC * 2);
                out[2] = fetch_bytes(d.dw, s.n * 4); out[3] = fetch_bytes(d.dA, s.n * s.n * 4);
                out[4] = fetch_bytes(d.dbeta, s.n * 4);
                if (v >= 3) { out[5] = fetch_bytes(d.dg, s.C * 4); out[6] = fetch_bytes(d.dalpha, s.n * 4); }
            }
            if (rep < 0) {
                if (dxp24(ver)) {   // v8, v10, v12 store dXp in 24 bits: their base's (v5's, v9's, v10's) rounded
                    for (size_t i = 0; i < NS; i++) {
                        float v;
                        memcpy(&v, out[0].data() + 4 * i, 4);
                        v = round24(v);
                        memcpy(out[0].data() + 4 * i, &v, 4);
                    }
                }
                for (int k = 0; k < 7; k++) { v3bits[k] = out[k]; }
                dev_free(d);
                continue;
            }
            if (rep == 0 && ver >= 5 && ver != 9 && !fwd) {
                bool same = true;
                for (int k = 0; k < 7; k++) { same &= out[k] == v3bits[k]; }
                printf("  v%d's bits %s", base, same ? "identical" : "DIFFERENT (FAIL)");
                ok &= same;
            }
            if (rep == 0) {
                if (fwd) {
                    std::vector<double> Xn(NS), h(NC);
                    ref_forward(D(in.X).data(), D(in.o).data(), D(in.A).data(), D(in.beta).data(), D(in.w).data(),
                                s.N, s.C, s.n, true, Xn.data(), h.data());
                    ok &= compare("Xn", bytes_bf16_to_f(out[0]), Xn, 1.0 / 128, 1e-6);
                    if (ver < 3) {
                        ok &= compare("h", bytes_bf16_to_f(out[1]), h, 1.0 / 128, 1.0 / 256);
                    } else {
                        std::vector<float> xg = bytes_bf16_to_f(out[0]);
                        ok &= check_norm_fwd("", D(xg), in.w, in.g, out[1], out[2], s.N, s.C, s.n);
                    }
                } else {
                    std::vector<double> dXn(NS), dout(NC), dw(s.n, 0.0), dA(s.n * s.n, 0.0), db(s.n, 0.0),
                        dg(s.C, 0.0);
                    if (ver < 3) {
                        ref_backward(D(in.dXp).data(), D(in.dh).data(), D(in.X).data(), D(in.w).data(),
                                     D(in.Xprev).data(), D(in.o).data(), D(in.Aprev).data(), D(in.bprev).data(), s.N,
                                     s.C, s.n, dXn.data(), dout.data(), dw.data(), dA.data(), db.data());
                    } else {
                        ref_backward3(in, D(in.dXp), D(in.X), D(in.Xprev), s, dXn.data(), dout.data(), dw.data(),
                                      dA.data(), db.data(), dg.data());
                    }
                    // v8, v10, v12 store dXp rounded to 24 bits: one more rounding, 2^-17 of the value
                    ok &= compare("dXp", bytes_f32(out[0]), dXn, dxp24(ver) ? 1e-5 + 1.0 / 131072 : 1e-5,
                                  1e-6);
                    ok &= compare("dout", bytes_bf16_to_f(out[1]), dout, 1.0 / 256, 1e-6);
                    if (ver < 3) {
                        ok &= compare("dw", bytes_f32(out[2]), dw, 1e-4, 1e-5);
                    } else {
                        double gamma;
                        std::vector<double> S = ref_dw_scale3(in, s, &gamma);
                        ok &= compare_scaled("dw", bytes_f32(out[2]), dw, 1e-4, 1e-5, S, gamma);
                    }
                    ok &= compare("dA", bytes_f32(out[3]), dA, 1e-4, 1e-5);
                    ok &= compare("dbeta", bytes_f32(out[4]), db, 1e-4, 1e-5);
                    if (ver >= 3) {
                        ok &= compare("dg", bytes_f32(out[5]), dg, 1e-4, 1e-4);
                        std::vector<double> da = ref_softmax_backward(dw, in.w);
                        ok &= compare("dalpha", bytes_f32(out[6]), da, 1e-4, 1e-4);
                    }
                }
            }
            dev_free(d);
            if (repeat_done(rep, out, first, ok)) { break; }
        }
    }
    return ok;
}

// X_0 (the n equal streams of the embedding) of the inputs: x0 = stream 0 of X as one (N, C)
// row, X0 = x0 copied into every stream
static void embedding_streams(const Shape &s, const Inputs &in, std::vector<float> &x0, std::vector<float> &X0) {
    size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
    int n = s.n;
    x0.resize(NC); X0.resize(NS);
    for (size_t p = 0; p < s.N; p++) {
        for (int c = 0; c < s.C; c++) {
            x0[p * s.C + c] = in.X[(p * n) * s.C + c];
            for (int r = 0; r < n; r++) { X0[(p * n + r) * s.C + c] = x0[p * s.C + c]; }
        }
    }
}

// v2's trainer paths beside the op above (v2's launchers): the forward of sublayer 0's update
// from the embedding alone (xb: the n equal streams X_0 never stored), the final site's backward
// (dXp_in = NULL), the update of sublayer 0 in the backward (xpb: Xprev = the embedding), and
// sublayer 0's read backward (Xprev = X = NULL: dx0 += sum_r dX_0, the embedding's fp32 gradient).
static bool check_edges_v2(uint64_t seed) {
    bool ok = true;
    const Shape s = {300, 512, 4};
    Inputs in = make_inputs(s, seed + 99);
    size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
    int n = s.n;
    std::vector<float> x0, X0;
    embedding_streams(s, in, x0, X0);
    Dev d = dev_make(s, in);
    floatX *dx0 = upload<floatX>(x0);
    std::vector<double> Xn(NS), h(NC), dXn(NS), dout(NC), dw(n), dA(n * n), db(n);
    auto zero_grads = [&]() { zero(d.dw, n * 4); zero(d.dA, n * n * 4); zero(d.dbeta, n * 4); };
    auto clear = [&]() { std::fill(dw.begin(), dw.end(), 0.0); std::fill(dA.begin(), dA.end(), 0.0);
                         std::fill(db.begin(), db.end(), 0.0); };
    printf("edges v2 N=%zu C=%d n=%d:", s.N, s.C, n);
    // 1. forward from the embedding (xb = 1)
    hc_update_read_forward_v2(d.Xn, d.h, dx0, d.o, d.A, d.beta, d.w, s.N, s.C, n, 1);
    ref_forward(D(X0).data(), D(in.o).data(), D(in.A).data(), D(in.beta).data(), D(in.w).data(), s.N, s.C, n, true,
                Xn.data(), h.data());
    ok &= compare("xb:Xn", bytes_bf16_to_f(fetch_bytes(d.Xn, NS * 2)), Xn, 1.0 / 128, 1e-6);
    ok &= compare("xb:h", bytes_bf16_to_f(fetch_bytes(d.h, NC * 2)), h, 1.0 / 128, 1.0 / 256);
    // 2. the final site: dXp_in = NULL (zero)
    std::vector<double> zeros(NS, 0.0);
    zero_grads(); clear();
    hc_read_update_backward_v2(d.dXtmp, d.dout, NULL, d.dw, d.dA, d.dbeta, d.partial, NULL, d.dh, d.X, d.w, d.Xprev,
                               d.o, d.Aprev, d.bprev, s.N, s.C, n);
    ref_backward(zeros.data(), D(in.dh).data(), D(in.X).data(), D(in.w).data(), D(in.Xprev).data(), D(in.o).data(),
                 D(in.Aprev).data(), D(in.bprev).data(), s.N, s.C, n, dXn.data(), dout.data(), dw.data(), dA.data(),
                 db.data());
    ok &= compare("final:dXp", bytes_f32(fetch_bytes(d.dXtmp, NS * 4)), dXn, 1e-5, 1e-6);
    ok &= compare("final:dA", bytes_f32(fetch_bytes(d.dA, n * n * 4)), dA, 1e-4, 1e-5);
    // 3. the update of sublayer 0 (xpb = 1: Xprev = the embedding)
    zero_grads(); clear();
    hc_read_update_backward_v2(d.dXtmp, d.dout, NULL, d.dw, d.dA, d.dbeta, d.partial, d.dXp, d.dh, d.X, d.w, dx0,
                               d.o, d.Aprev, d.bprev, s.N, s.C, n, 1);
    ref_backward(D(in.dXp).data(), D(in.dh).data(), D(in.X).data(), D(in.w).data(), D(X0).data(), D(in.o).data(),
                 D(in.Aprev).data(), D(in.bprev).data(), s.N, s.C, n, dXn.data(), dout.data(), dw.data(), dA.data(),
                 db.data());
    ok &= compare("xpb:dXp", bytes_f32(fetch_bytes(d.dXtmp, NS * 4)), dXn, 1e-5, 1e-6);
    ok &= compare("xpb:dA", bytes_f32(fetch_bytes(d.dA, n * n * 4)), dA, 1e-4, 1e-5);
    // 4. sublayer 0's read: dx0 += sum_r (dXp_r + w[r] dh), onto dx0 = dh (any start value)
    cudaCheck(cudaMemcpy(d.dXtmp, d.dh, NC * 4, cudaMemcpyDeviceToDevice));
    hc_read_update_backward_v2(NULL, NULL, d.dXtmp, NULL, NULL, NULL, d.partial, d.dXp, d.dh, NULL, d.w, NULL, NULL,
                               NULL, NULL, s.N, s.C, n);
    for (size_t p = 0; p < s.N; p++) {
        for (int c = 0; c < s.C; c++) {
            double v = in.dh[p * s.C + c];
            for (int r = 0; r < n; r++) { v += in.dXp[(p * n + r) * s.C + c] + (double)in.w[r] * in.dh[p * s.C + c]; }
            dout[p * s.C + c] = v;
        }
    }
    ok &= compare("first:dx0", bytes_f32(fetch_bytes(d.dXtmp, NC * 4)), dout, 1e-5, 1e-6);
    printf("\n");
    cudaCheck(cudaFree(dx0));
    dev_free(d);
    return ok;
}

// The trainer's paths (kernels/hc.cuh, as train_mhar.cu calls them) with the backward of v3 or
// v5: the forward of sublayer 0's update from the embedding (xb), and of the last sublayer
// without its streams (Xn = NULL: u and rstd must not change), site 0's read and norm alone
// (o = NULL, xb: site_forward), the final site's backward (dXp_in = NULL), the update of
// sublayer 0 in the backward (xpb: Xprev = the embedding; X_1 is then the update of the
// embedding's streams), and site 0's norm and read backward (X = the embedding with xb, Xprev =
// NULL: dx0 += sum_r dX_0, the embedding's fp32 gradient, and dg). v5 gets X = NULL wherever
// Xprev is given. The tolerances are check_op's.
static bool check_edges_v3(uint64_t seed, int ver) {
    bool ok = true;
    const Shape s = {300, 512, 4};
    Inputs in = make_inputs(s, seed + 99);
    if (dxp24(ver)) { for (float &v : in.dXp) { v = round24(v); } }   // v10 and later: 24-bit dXp, the reference's too
    size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
    int n = s.n;
    std::vector<float> x0, X0;
    embedding_streams(s, in, x0, X0);
    Dev d = dev_make(s, in);
    floatX *dx0 = upload<floatX>(x0);
    std::vector<double> Xn(NS), h(NC), dXn(NS), dout(NC), dw(n), dA(n * n), db(n), dg(s.C);
    auto zero_grads = [&]() { zero(d.dw, n * 4); zero(d.dA, n * n * 4); zero(d.dbeta, n * 4); zero(d.dg, s.C * 4); };
    auto clear = [&]() { std::fill(dw.begin(), dw.end(), 0.0); std::fill(dA.begin(), dA.end(), 0.0);
                         std::fill(db.begin(), db.end(), 0.0); std::fill(dg.begin(), dg.end(), 0.0); };
    printf("edges v%d N=%zu C=%d n=%d:", ver, s.N, s.C, n);
    const double t24 = dxp24(ver) ? 1.0 / 131072 : 0.0;   // v10 and later round dXp_out to 24 bits: 2^-17
    auto backward = [&](float *dXp_out, floatX *dout, float *dx0, float *dw, float *dalpha, float *dA, float *dbeta,
                        float *dg, const float *dXp_in, const float *rstd, const floatX *X, const floatX *Xprev,
                        const floatX *o, const float *A, const float *beta, int xb, int xpb) {
        if (ver == 3) {
            hc_norm_read_update_backward_v3(dXp_out, dout, dx0, dw, dalpha, dA, dbeta, dg, d.partial, dXp_in, d.dh,
                                            rstd, d.g, X, d.w, Xprev, o, A, beta, s.N, s.C, n, xb, xpb);
        } else if (ver == 5) {
            hc_norm_read_update_backward_v5(dXp_out, dout, dx0, dw, dalpha, dA, dbeta, dg, d.partial, dXp_in, d.dh,
                                            rstd, d.g, Xprev ? NULL : X, d.w, Xprev, o, A, beta, s.N, s.C, n, xb,
                                            xpb);
        } else if (ver >= 6 && ver <= 8) {
            hc_norm_read_update_backward_v6(ver, dXp_out, NULL, NULL, dout, dx0, dw, dalpha, dA, dbeta, dg, d.partial,
                                            dXp_in, NULL, NULL, d.dh, rstd, d.g, Xprev ? NULL : X, d.w, Xprev, o, A,
                                            beta, s.N, s.C, n, xb, xpb);
        } else if (ver == 9) {   // v9 (kernels/hc.cuh)
            hc_backward_v9(HcGradF32{dXp_out}, dout, dx0, dw, dalpha, dA, dbeta, dg, d.partial,
                           HcGradF32{(float *)dXp_in}, d.dh, rstd, d.g, Xprev ? NULL : X, d.w, Xprev, o, A, beta,
                           s.N, s.C, n, xb, xpb);
        } else {   // v10, v12, v16, v17: dXp_in encoded into d.dxh, d.dxl, the kernel in place there, dXp_out decoded
            if (dXp_in) { hc24_encode_kernel<<<ceil_div(NS, 256), 256>>>(d.dxh, d.dxl, dXp_in, NS); launchCheck(); }
            auto run = [&](auto g24) {   // G: the version's storage type
                decltype(g24) none = {};
                auto call = [&](auto v) {
                    hc_backward_v9<decltype(v)::value>(dXp_out ? g24 : none, dout, dx0, dw, dalpha, dA, dbeta, dg,
                                                         d.partial, dXp_in ? g24 : none, d.dh, rstd, d.g,
                                                         Xprev ? NULL : X, d.w, Xprev, o, A, beta, s.N, s.C, n, xb,
                                                         xpb);
                };
                if (ver == 17) { call(std::integral_constant<int, 17>()); }
                else if (ver == 16) { call(std::integral_constant<int, 16>()); }
                else { call(std::integral_constant<int, 12>()); }
            };
            if (ver == 10) { run(HcGrad24v10{d.dxh, d.dxl}); } else { run(HcGrad24{d.dxh, d.dxl}); }
            if (dXp_out) { hc24_decode_kernel<<<ceil_div(NS, 256), 256>>>(dXp_out, d.dxh, d.dxl, NS); launchCheck(); }
        }
    };
    // 1. sublayer 0's update from the embedding (xb = 1), site 1's read and norm
    hc_update_read_norm_forward(d.Xn, d.u, d.rstd, dx0, d.o, d.A, d.beta, d.w, d.g, s.N, s.C, n, 1);
    ref_forward(D(X0).data(), D(in.o).data(), D(in.A).data(), D(in.beta).data(), D(in.w).data(), s.N, s.C, n, true,
                Xn.data(), h.data());
    std::vector<float> xg = bytes_bf16_to_f(fetch_bytes(d.Xn, NS * 2));
    ok &= compare("xb:Xn", xg, Xn, 1.0 / 128, 1e-6);
    ok &= check_norm_fwd("xb:", D(xg), in.w, in.g, fetch_bytes(d.u, NC * 2), fetch_bytes(d.rstd, s.N * 4), s.N,
                         s.C, n);
    // 1b. the same without the streams (Xn = NULL, the trainer's last sublayer): u and rstd bit for bit
    {
        std::vector<unsigned char> u1 = fetch_bytes(d.u, NC * 2), r1 = fetch_bytes(d.rstd, s.N * 4);
        zero(d.u, NC * 2); zero(d.rstd, s.N * 4);
        hc_update_read_norm_forward(NULL, d.u, d.rstd, dx0, d.o, d.A, d.beta, d.w, d.g, s.N, s.C, n, 1);
        bool same = fetch_bytes(d.u, NC * 2) == u1 && fetch_bytes(d.rstd, s.N * 4) == r1;
        printf("  noXn:u,rstd %s", same ? "identical" : "DIFFERENT (FAIL)");
        ok &= same;
    }
    // 2. site 0: the read of X_0 and its norm alone (o = NULL, xb = 1)
    hc_update_read_norm_forward(NULL, d.u, d.rstd, dx0, NULL, NULL, NULL, d.w, d.g, s.N, s.C, n, 1);
    ok &= check_norm_fwd("read0:", D(X0), in.w, in.g, fetch_bytes(d.u, NC * 2), fetch_bytes(d.rstd, s.N * 4), s.N,
                         s.C, n);
    // 3. the final site: dXp_in = NULL (zero)
    std::vector<double> zeros(NS, 0.0);
    zero_grads(); clear();
    backward(d.dXtmp, d.dout, NULL, d.dw, d.dalpha, d.dA, d.dbeta, d.dg, NULL, d.rstd_in, d.X, d.Xprev, d.o, d.Aprev,
             d.bprev, 0, 0);
    ref_backward3(in, zeros, D(in.X), D(in.Xprev), s, dXn.data(), dout.data(), dw.data(), dA.data(), db.data(),
                  dg.data());
    ok &= compare("final:dXp", bytes_f32(fetch_bytes(d.dXtmp, NS * 4)), dXn, 1e-5 + t24, 1e-6);
    ok &= compare("final:dA", bytes_f32(fetch_bytes(d.dA, n * n * 4)), dA, 1e-4, 1e-5);
    ok &= compare("final:dg", bytes_f32(fetch_bytes(d.dg, s.C * 4)), dg, 1e-4, 1e-4);
    // 4. the update of sublayer 0 (xpb = 1: Xprev = the embedding)
    // X_1 = the update of X_0 (what the forward stored); rstd_in stays the inputs' (any positive value)
    std::vector<float> X1(NS);
    host_update(X1.data(), x0.data(), in.o.data(), in.Aprev.data(), in.bprev.data(), s.N, s.C, n, true);
    floatX *dX1 = upload<floatX>(X1);
    zero_grads(); clear();
    backward(d.dXtmp, d.dout, NULL, d.dw, d.dalpha, d.dA, d.dbeta, d.dg, d.dXp, d.rstd_in, dX1, dx0, d.o, d.Aprev,
             d.bprev, 0, 1);
    ref_backward3(in, D(in.dXp), D(X1), D(X0), s, dXn.data(), dout.data(), dw.data(), dA.data(), db.data(),
                  dg.data());
    ok &= compare("xpb:dXp", bytes_f32(fetch_bytes(d.dXtmp, NS * 4)), dXn, 1e-5 + t24, 1e-6);
    ok &= compare("xpb:dA", bytes_f32(fetch_bytes(d.dA, n * n * 4)), dA, 1e-4, 1e-5);
    // 5. site 0's norm and read (X = the embedding, xb = 1; Xprev = NULL): dx0 += sum_r (dXp_r +
    // w[r] dh), onto dx0 = du (any start value); dg; rstd_in is then the embedding read's
    std::vector<double> hx(NC), ux(NC), rx(s.N), dh(NC);
    ref_read(D(X0).data(), D(in.w).data(), s.N, s.C, n, hx.data());
    ref_norm(hx.data(), D(in.g).data(), s.N, s.C, ux.data(), rx.data());
    std::vector<float> rxf(rx.begin(), rx.end());
    float *rstd0 = upload<float>(rxf);
    zero_grads(); clear();
    cudaCheck(cudaMemcpy(d.dXtmp, d.dh, NC * 4, cudaMemcpyDeviceToDevice));
    backward(NULL, NULL, d.dXtmp, NULL, NULL, NULL, NULL, d.dg, d.dXp, rstd0, dx0, NULL, NULL, NULL, NULL, 1, 0);
    ref_norm_backward(D(in.dh).data(), hx.data(), D(rxf).data(), D(in.g).data(), s.N, s.C, dh.data(), dg.data());
    for (size_t p = 0; p < s.N; p++) {
        for (int c = 0; c < s.C; c++) {
            double v = in.dh[p * s.C + c];
            for (int r = 0; r < n; r++) { v += in.dXp[(p * n + r) * s.C + c] + (double)in.w[r] * dh[p * s.C + c]; }
            dout[p * s.C + c] = v;
        }
    }
    ok &= compare("first:dx0", bytes_f32(fetch_bytes(d.dXtmp, NC * 4)), dout, 1e-5, 1e-6);
    ok &= compare("first:dg", bytes_f32(fetch_bytes(d.dg, s.C * 4)), dg, 1e-4, 1e-4);
    printf("\n");
    cudaCheck(cudaFree(dx0)); cudaCheck(cudaFree(rstd0)); cudaCheck(cudaFree(dX1));
    dev_free(d);
    return ok;
}

// v15: v3's kernel with more warps an SM. ptxas at n = 4, NPK = 2 (C = 512): v3 112 registers,
// 2 blocks of 8 warps an SM (16 warps); (8 warps, 3 blocks) and (4 warps, 6 blocks: v15) fit 80
// registers without spills (24 warps), (4 warps, 5 blocks) 96 (20 warps). v16 (the forward,
// kernels/hc.cuh): v15's blocks, its values rounded to floatX in pairs (one conversion for two)
// and the norm weight loaded before the row's sum. The same arithmetic: --check requires v3's
// bits of Xn, u and rstd at every shape for each; --bench times the five side by side.
static double fwd_bytes(const Shape &s, int ver);
template <int W, int M>
static void fwd_v15(const Shape &s, Dev &d) {
    hc_update_read_norm_forward_v15<W, M>(d.Xn, d.u, d.rstd, d.X, d.o, d.A, d.beta, d.w, d.g, s.N, s.C, s.n);
}
static void fwd_v16(const Shape &s, Dev &d) {
    hc_update_read_norm_forward(d.Xn, d.u, d.rstd, d.X, d.o, d.A, d.beta, d.w, d.g, s.N, s.C, s.n);
}
static const struct { const char *name; void (*run)(const Shape &, Dev &); } fwd15[] = {
    {"v3 (8 warps, 2 blocks)", fwd_v15<8, 1>}, {"8 warps, 3 blocks", fwd_v15<8, 3>},
    {"4 warps, 5 blocks", fwd_v15<4, 5>}, {"v15 (4 warps, 6 blocks)", fwd_v15<4, 6>},
    {"v16 (v15, leaner)", fwd_v16}};
static const int fwd15_n = (int)(sizeof(fwd15) / sizeof(fwd15[0]));
static bool check_fwd_v15(uint64_t seed) {
    bool ok = true;
    int ns = quick ? 2 : (int)(sizeof(check_shapes) / sizeof(check_shapes[0]));
    for (int si = 0; si < ns; si++) {
        const Shape &s = check_shapes[si];
        Inputs in = make_inputs(s, seed + si);
        Dev d = dev_make(s, in);
        printf("fwd v15, v16 N=%zu C=%d n=%d:", s.N, s.C, s.n);
        std::vector<unsigned char> ref[3];
        for (int v = 0; v < fwd15_n; v++) {
            zero(d.Xn, s.N * s.n * s.C * 2); zero(d.u, s.N * s.C * 2); zero(d.rstd, s.N * 4);
            fwd15[v].run(s, d);
            std::vector<unsigned char> out[3] = {fetch_bytes(d.Xn, s.N * s.n * s.C * 2),
                                                 fetch_bytes(d.u, s.N * s.C * 2), fetch_bytes(d.rstd, s.N * 4)};
            if (v == 0) { for (int k = 0; k < 3; k++) { ref[k] = out[k]; } continue; }
            const bool same = out[0] == ref[0] && out[1] == ref[1] && out[2] == ref[2];
            printf("  %s: %s", fwd15[v].name, same ? "v3's bits" : "DIFFERENT (FAIL)");
            ok &= same;
        }
        printf("\n");
        dev_free(d);
    }
    return ok;
}
static void bench_fwd_v15(int reps, uint64_t seed) {
    const Shape &s = bench_shape;
    Dev d = dev_make(s, make_inputs(s, seed));
    const double bytes = fwd_bytes(s, 3);
    for (int round = 0; round < 2; round++) {
        for (int v = 0; v < fwd15_n; v++) {
            float mn, ms = time_median(reps, [&]() { fwd15[v].run(s, d); }, &mn);
            printf("fwd v15, v16 N=%zu C=%d n=%d, %-24s %.4f ms (min %.4f), %.0f GB/s\n", s.N, s.C, s.n, fwd15[v].name,
                   ms, mn, bytes / (ms * 1e-3) / 1e9);
        }
    }
    dev_free(d);
}

// hc_reduce_sites (kernels/hc.cuh, the trainer's sums of all the sites in one launch) against a
// launch of hc_reduce_v3_kernel per site, on the same random partials: every output bit for bit.
// Three sites at N = 3000 (94 partials), n = 4, C = 264 (a last block of columns cut short), with
// the trainer's three kinds of site: site 0 (dg alone), a middle one (all), the final read (no
// dalpha); the outputs start from random values (the sums are +=).
static bool check_reduce_sites(uint64_t seed) {
    const int S = 3, n = 4, C = 264, NP = 2 * n + n * n, Q = NP + C;
    const size_t N = 3000, stride = hc_partial_floats(N, n, C) + 40;   // a stride over the minimum
    const int P = (int)ceil_div(N, hc_rows_per_part(N));
    float *parts = dalloc<float>(S * stride), *w = dalloc<float>(S * n), *outs[2];
    fill_normal(parts, S * stride, seed + 7, 0.0f, 1.0f);
    fill_normal(w, S * n, seed + 8, 0.25f, 0.05f);
    for (int k = 0; k < 2; k++) {   // per site: dw (n), dalpha (n), dA (n^2), dbeta (n), dg (C)
        outs[k] = dalloc<float>(S * Q + S * n);
        fill_normal(outs[k], S * Q + S * n, seed + 9, 0.0f, 1.0f);
    }
    auto sums = [&](int k, int j) {   // site j's pointers into outs[k]; j = 0 and j = S-1 as the trainer's
        float *o = outs[k] + j * (Q + n);
        HcSums t = {o, o + n, o + 2 * n, o + 2 * n + n * n, o + NP + n, w + j * n};
        if (j == 0) { t.dw = t.dalpha = t.dA = t.dbeta = NULL; }
        if (j == S - 1) { t.dalpha = NULL; }
        return t;
    };
    for (int j = 0; j < S; j++) {
        HcSums t = sums(0, j);
        hc_reduce_v3_kernel<<<ceil_div(Q, 32), dim3(32, 32)>>>(t.dw, t.dA, t.dbeta, t.dg, t.dalpha, t.w,
                                                               parts + j * stride, P, n, C);
        launchCheck();
    }
    hc_reduce_sites([&](int j) { return sums(1, j); }, parts, stride, S, N, n, C);
    const bool same = fetch_bytes(outs[0], (S * Q + S * n) * 4) == fetch_bytes(outs[1], (S * Q + S * n) * 4);
    printf("hc_reduce_sites, %d sites (N=%zu n=%d C=%d) against a hc_reduce_v3_kernel launch each: %s\n", S, N, n,
           C, same ? "identical" : "DIFFERENT (FAIL)");
    void *ps[] = {parts, w, outs[0], outs[1]};
    for (void *p : ps) { cudaCheck(cudaFree(p)); }
    return same;
}

// the op's minimum bytes (top of file); v3 and v5 add the rstd row (4 B a position) each way
static double fwd_bytes(const Shape &s, int ver) { return ((4.0 * s.n + 4) * s.C + (ver >= 3 ? 4 : 0)) * s.N; }
static double bwd_bytes(const Shape &s, int ver) {   // v5 and later do not read X_j: (10n + 8) C; v8: (8n + 8) C
    return (((dxp24(ver) ? 8.0 : ver >= 5 ? 10.0 : 12.0) * s.n + 8) * s.C + (ver >= 3 ? 4 : 0)) * s.N;
}

static void bench_op(bool fwd, int ver, int reps, uint64_t seed, double gbs) {
    const Shape &s = bench_shape;
    Inputs in = make_inputs(s, seed);
    Dev d = dev_make(s, in);
    if (dxp24(ver)) {
        hc24_encode_kernel<<<ceil_div(s.N * s.n * s.C, 256), 256>>>(d.dxh, d.dxl, d.dXp, s.N * s.n * s.C);
    }
    float mn;
    float ms = time_median(reps, [&]() { if (fwd) { run_fwd(ver, s, d); } else { run_bwd(ver, s, d); } }, &mn);
    double bytes = fwd ? fwd_bytes(s, ver) : bwd_bytes(s, ver);
    printf("%s v%d N=%zu C=%d n=%d: %.3f ms (min %.3f), %.0f GB/s; floor %.3f ms at 4.0 TB/s, %.3f at %.0f GB/s;"
           " x24 a step: %.2f ms\n", fwd ? "fwd" : "bwd", ver, s.N, s.C, s.n, ms, mn, bytes / (ms * 1e-3) / 1e9,
           bytes / 4.0e12 * 1e3, bytes / (gbs * 1e9) * 1e3, gbs, 24 * ms);
    if (!fwd && ver == 5) {   // the share of the parameter sums' reduction launch (every version from v3 has it)
        const int NP = 2 * s.n + s.n * s.n;
        float rms = time_median(reps, [&]() {
            hc_reduce_v3_kernel<<<ceil_div(NP + s.C, 32), dim3(32, 32)>>>(d.dw, d.dA, d.dbeta, d.dg, d.dalpha, d.w,
                                                                       d.partial, d.P, s.n, s.C);
            launchCheck();
        }, &mn);
        printf("  of which hc_reduce_v3_kernel alone (%d partials, %d columns): %.4f ms; x24 a step: %.2f ms\n", d.P,
               NP + s.C, rms, 24 * rms);
    }
    if (!fwd && ver == 9) {   // the sums of a step's 25 sites (24 boundaries and the final read): a launch each
                              // (v3 to v9's way) against one hc_reduce_sites launch, on the same partials
        const int S = 25, NP = 2 * s.n + s.n * s.n;
        const size_t stride = hc_partial_floats(s.N, s.n, s.C);
        float *parts = dalloc<float>(S * stride);
        for (int k = 0; k < S; k++) {
            cudaCheck(cudaMemcpy(parts + k * stride, d.partial, stride * 4, cudaMemcpyDeviceToDevice));
        }
        float one = time_median(reps, [&]() {
            for (int k = 0; k < S; k++) {
                hc_reduce_v3_kernel<<<ceil_div(NP + s.C, 32), dim3(32, 32)>>>(d.dw, d.dA, d.dbeta, d.dg, d.dalpha,
                                                                           d.w, parts + k * stride, d.P, s.n, s.C);
                launchCheck();
            }
        }, &mn);
        const HcSums sums = {d.dw, d.dalpha, d.dA, d.dbeta, d.dg, d.w};
        float all = time_median(reps, [&]() { hc_reduce_sites([&](int) { return sums; }, parts, stride, S, s.N, s.n,
                                                              s.C); }, &mn);
        printf("  the sums of %d sites (%d partials, %d columns each): %d launches %.4f ms, hc_reduce_sites (one"
               " launch) %.4f ms\n", S, d.P, NP + s.C, S, one, all);
        cudaCheck(cudaFree(parts));
    }
    dev_free(d);
}

static void print_bytes(void) {
    const Shape &s = bench_shape;
    const double K = 1024.0 * s.N, C = s.C;
    // the trainer's path per sublayer: v2 with std's norm kernels beside it (rmsnorm_forward reads h,
    // writes u: 4C; rmsnorm_backward_residual reads du and h, writes dh: 10C), or v3 alone
    const double f2 = fwd_bytes(s, 2) + 4 * C * s.N, b2 = bwd_bytes(s, 2) + 10 * C * s.N;
    const double f3 = fwd_bytes(s, 3), b3 = bwd_bytes(s, 3), b5 = bwd_bytes(s, 5), b8 = bwd_bytes(s, 8);
    const double fstd = 8 * C * s.N, bstd = 16 * C * s.N;   // std's residual path (residual.cu v2): 4 + 8 KiB
    printf("100m (N=%zu C=%d n=%d), bytes per position per sublayer, the op alone: fwd %.1f KiB, bwd %.1f KiB\n",
           s.N, s.C, s.n, fwd_bytes(s, 2) / K, bwd_bytes(s, 2) / K);
    printf("with the pre-norm: v2 + std's norm kernels fwd %.1f + bwd %.1f KiB; v3 (fused) fwd %.1f + bwd %.1f KiB;"
           " v5 bwd %.1f KiB (v8, dXp in 24 bits: %.1f); std's residual path %.1f + %.1f KiB\n", f2 / K, b2 / K,
           f3 / K, b3 / K, b5 / K, b8 / K, fstd / K, bstd / K);
    printf("a micro-step (24 boundaries each way): v2 path %.2f GB (%.2f ms at 4.0 TB/s), v3 %.2f GB (%.2f ms),"
           " v3 + v5 %.2f GB (%.2f ms); over std's: v2 +%.2f ms, v3 +%.2f ms, v3 + v5 +%.2f ms\n",
           24 * (f2 + b2) / 1e9, 24 * (f2 + b2) / 4.0e9, 24 * (f3 + b3) / 1e9, 24 * (f3 + b3) / 4.0e9,
           24 * (f3 + b5) / 1e9, 24 * (f3 + b5) / 4.0e9, 24 * (f2 + b2 - fstd - bstd) / 4.0e9,
           24 * (f3 + b3 - fstd - bstd) / 4.0e9, 24 * (f3 + b5 - fstd - bstd) / 4.0e9);
    printf("kept for the backward: streams %d B per position per sublayer (bf16), %.2f GB for 24 boundaries;"
           " v2 also h, %.2f GB for 25 sites (v3 none)\n", 2 * s.n * s.C, 24.0 * s.N * s.n * s.C * 2 / 1e9,
           25.0 * s.N * s.C * 2 / 1e9);
}

// ============================================================================
// fp32 emulation of v3 (no GPU needed): the kernels' arithmetic on the host in fp32, lane by
// lane (lane l holds channels 8 (l + 32 q) + k; the warp's sums are the butterfly of
// warp_sum), for the per-element outputs: fwd's Xn, u, rstd and bwd's dXp, dout, held to
// check_op's tolerances against the fp64 reference at every check shape. It shows the
// tolerances cover fp32 arithmetic of this shape (the host may round a * b + c twice where
// the GPU fuses it: an error of the same size), and dw (the lanes', the butterfly's and the
// positions' order), held to its scale bound. The other parameter sums keep v2's tolerances
// (dA, dbeta) and std's norm weight's (dg, residual.cu).
// ============================================================================

static float bfr(float v) { return bf2f(f2bf(v)); }
// warp_sum's butterfly over 32 lane values (lane 0's result; every lane's is the same)
static float emu_warp_sum(std::vector<float> v) {
    for (int o = 16; o > 0; o >>= 1) {
        std::vector<float> t(32);
        for (int l = 0; l < 32; l++) { t[l] = v[l] + v[l ^ o]; }
        v = t;
    }
    return v[0];
}

static bool emu_v3(const Shape &s, uint64_t seed) {
    Inputs in = make_inputs(s, seed);
    const int C = s.C, n = s.n, NPK = (int)ceil_div(C, 256);   // the packs that hold channels
    size_t NS = s.N * n * C, NC = s.N * C;
    std::vector<float> Xn(NS), u(NC), rstd(s.N), dXn(NS), dout(NC), dw32(n, 0.0f);
    for (size_t p = 0; p < s.N; p++) {
        // fwd: X' = A X + beta o (rounded), h += w X', ss per lane, then the norm
        std::vector<float> h(C), ssl(32, 0.0f);
        for (int l = 0; l < 32; l++) {
            for (int q = 0; q < NPK; q++) {
                for (int k = 0; k < 8; k++) {
                    int c = 8 * (l + 32 * q) + k;
                    if (c >= C) { continue; }
                    float hv = 0.0f;
                    for (int r = 0; r < n; r++) {
                        float v = in.beta[r] * in.o[p * C + c];
                        for (int t = 0; t < n; t++) { v = fmaf(in.A[r * n + t], in.X[(p * n + t) * C + c], v); }
                        Xn[(p * n + r) * C + c] = bfr(v);
                        hv += in.w[r] * Xn[(p * n + r) * C + c];
                    }
                    h[c] = hv;
                    ssl[l] += hv * hv;
                }
            }
        }
        float sf = 1.0f / sqrtf(emu_warp_sum(ssl) / C + 1e-6f);
        rstd[p] = sf;
        for (int c = 0; c < C; c++) { u[p * C + c] = bfr(h[c] * sf * in.g[c]); }
        // bwd: h of X, du g, sum_c du g h per lane, then dh, dX, dXp_new, dout
        std::vector<float> hb(C), dg(C), gl(32, 0.0f);
        for (int l = 0; l < 32; l++) {
            for (int q = 0; q < NPK; q++) {
                for (int k = 0; k < 8; k++) {
                    int c = 8 * (l + 32 * q) + k;
                    if (c >= C) { continue; }
                    float hv = 0.0f;
                    for (int r = 0; r < n; r++) { hv += in.w[r] * in.X[(p * n + r) * C + c]; }
                    hb[c] = hv;
                    dg[c] = in.dh[p * C + c] * in.g[c];
                    gl[l] += dg[c] * hv;
                }
            }
        }
        const float sb = in.rstd[p], k3 = sb * sb * sb / C * emu_warp_sum(gl);
        // dw_r: per lane du g . X_r and h . X_r, the warp's sums, then s a - k3 b, summed over positions
        for (int r = 0; r < n; r++) {
            std::vector<float> al(32, 0.0f), bl(32, 0.0f);
            for (int l = 0; l < 32; l++) {
                for (int q = 0; q < NPK; q++) {
                    for (int k = 0; k < 8; k++) {
                        int c = 8 * (l + 32 * q) + k;
                        if (c >= C) { continue; }
                        al[l] += dg[c] * in.X[(p * n + r) * C + c];
                        bl[l] += hb[c] * in.X[(p * n + r) * C + c];
                    }
                }
            }
            dw32[r] += sb * emu_warp_sum(al) - k3 * emu_warp_sum(bl);
        }
        for (int c = 0; c < C; c++) {
            float d[HC_MAX_N], t = 0.0f;
            for (int r = 0; r < n; r++) { d[r] = in.dXp[(p * n + r) * C + c] + in.w[r] * (sb * dg[c] - k3 * hb[c]); }
            for (int r = 0; r < n; r++) { t += in.bprev[r] * d[r]; }
            dout[p * C + c] = bfr(t);
            for (int t2 = 0; t2 < n; t2++) {
                float v = 0.0f;
                for (int r = 0; r < n; r++) { v += in.Aprev[r * n + t2] * d[r]; }
                dXn[(p * n + t2) * C + c] = v;
            }
        }
    }
    printf("cpu-selftest: v3 fp32 emulation N=%zu C=%d n=%d:", s.N, C, n);
    std::vector<double> Xr(NS), hr(NC), dXr(NS), dor(NC), dw(n, 0.0), dA(n * n, 0.0), db(n, 0.0), dgr(C, 0.0);
    ref_forward(D(in.X).data(), D(in.o).data(), D(in.A).data(), D(in.beta).data(), D(in.w).data(), s.N, C, n, true,
                Xr.data(), hr.data());
    bool ok = compare("Xn", Xn, Xr, 1.0 / 128, 1e-6);
    std::vector<unsigned char> ub(NC * 2), rb(s.N * 4);
    for (size_t i = 0; i < NC; i++) { uint16_t b = f2bf(u[i]); memcpy(&ub[2 * i], &b, 2); }
    memcpy(rb.data(), rstd.data(), s.N * 4);
    ok &= check_norm_fwd("", D(Xn), in.w, in.g, ub, rb, s.N, C, n);
    ref_backward3(in, D(in.dXp), D(in.X), D(in.Xprev), s, dXr.data(), dor.data(), dw.data(), dA.data(), db.data(),
                  dgr.data());
    ok &= compare("dXp", dXn, dXr, 1e-5, 1e-6);
    ok &= compare("dout", dout, dor, 1.0 / 256, 1e-6);
    double gamma;
    std::vector<double> S = ref_dw_scale3(in, s, &gamma);
    ok &= compare_scaled("dw", dw32, dw, 1e-4, 1e-5, S, gamma);
    printf(" %s\n", ok ? "PASS" : "FAIL");
    return ok;
}

// ============================================================================
// --dxp-chain (no GPU): how much do bf16 or 24-bit stream gradients lose? The backward of 24 sublayer
// boundaries, as the trainer chains them (dX_j = dXp_j + w_j dh_j, dXp_{j-1} = A_{j-1}^T dX_j,
// dA_{j-1} += dX_j X_{j-1}^T over positions), with test_mhar's hc parameters (A = I + 0.1 z,
// w = softmax(0.5 z)), random streams X and random site gradients dh_j of one scale; dXp kept
// in fp64 (the reference), in fp32 (v3), and in fp32 arithmetic stored as bf16 or in 24 bits
// (v8, v10) at every boundary. Prints the normwise error (max|err| / max|ref|) of the embedding's
// gradient sum_r dX_0 and the worst over boundaries of dA, against one rounding of each.
// ============================================================================

static int dxp_chain(uint64_t seed) {
    host_rng = seed;
    const size_t N = 256;
    const int C = 512, n = 4, J = 24;
    std::vector<double> A((size_t)J * n * n), w((size_t)(J + 1) * n);
    for (size_t i = 0; i < A.size(); i++) { A[i] = (i / n % n == i % n) + 0.1 * host_normal(); }
    for (int j = 0; j <= J; j++) {
        double s = 0;
        for (int r = 0; r < n; r++) { w[j * n + r] = exp(0.5 * host_normal()); s += w[j * n + r]; }
        for (int r = 0; r < n; r++) { w[j * n + r] /= s; }
    }
    std::vector<float> X(N * n * C), dh(N * C);
    for (auto &v : X) { v = bfr((float)host_normal()); }
    const size_t NS = N * n * C;
    std::vector<double> d64(NS, 0.0), dA64((size_t)J * n * n, 0.0), e64(N * C);
    std::vector<float> d32(NS, 0.0f), d16(NS, 0.0f), d24(NS, 0.0f), dA32((size_t)J * n * n, 0.0f),
        dA16((size_t)J * n * n, 0.0f), dA24((size_t)J * n * n, 0.0f), e32(N * C), e16(N * C), e24(N * C);
    // dX = dXp + w dh; the update's backward through A_{j-1}; dA_{j-1} += dX X^T (X: the same random
    // streams at every boundary: the error's growth, not the values, is measured)
    for (int j = J; j >= 0; j--) {
        for (auto &v : dh) { v = (float)(0.01 * host_normal()); }
        for (size_t p = 0; p < N; p++) {
            for (int c = 0; c < C; c++) {
                double x64[HC_MAX_N];
                float x32[HC_MAX_N], x16[HC_MAX_N], x24[HC_MAX_N];
                for (int r = 0; r < n; r++) {
                    size_t i = (p * n + r) * C + c;
                    x64[r] = d64[i] + w[j * n + r] * dh[p * C + c];
                    x32[r] = d32[i] + (float)w[j * n + r] * dh[p * C + c];
                    x16[r] = d16[i] + (float)w[j * n + r] * dh[p * C + c];
                    x24[r] = d24[i] + (float)w[j * n + r] * dh[p * C + c];
                }
                if (j == 0) {
                    double s64 = 0; float s32 = 0, s16 = 0, s24 = 0;
                    for (int r = 0; r < n; r++) { s64 += x64[r]; s32 += x32[r]; s16 += x16[r]; s24 += x24[r]; }
                    e64[p * C + c] = s64; e32[p * C + c] = s32; e16[p * C + c] = s16; e24[p * C + c] = s24;
                    continue;
                }
                const double *a = &A[(size_t)(j - 1) * n * n];
                for (int s = 0; s < n; s++) {
                    size_t i = (p * n + s) * C + c;
                    double v64 = 0; float v32 = 0, v16 = 0, v24 = 0;
                    for (int r = 0; r < n; r++) {
                        v64 += a[r * n + s] * x64[r]; v32 += (float)a[r * n + s] * x32[r];
                        v16 += (float)a[r * n + s] * x16[r]; v24 += (float)a[r * n + s] * x24[r];
                        size_t k = (size_t)(j - 1) * n * n + r * n + s;
                        dA64[k] += x64[r] * X[i]; dA32[k] += x32[r] * X[i]; dA16[k] += x16[r] * X[i];
                        dA24[k] += x24[r] * X[i];
                    }
                    d64[i] = v64; d32[i] = v32; d16[i] = bfr(v16); d24[i] = round24(v24);
                }
            }
        }
    }
    auto nerr = [](const std::vector<float> &g, const std::vector<double> &r, size_t off, size_t len) {
        double m = 0, e = 0;
        for (size_t i = off; i < off + len; i++) { m = std::max(m, fabs(r[i])); e = std::max(e, fabs(g[i] - r[i])); }
        return e / m;
    };
    double a32 = 0, a16 = 0, a24 = 0;
    for (int j = 0; j < J; j++) {
        a32 = std::max(a32, nerr(dA32, dA64, (size_t)j * n * n, n * n));
        a16 = std::max(a16, nerr(dA16, dA64, (size_t)j * n * n, n * n));
        a24 = std::max(a24, nerr(dA24, dA64, (size_t)j * n * n, n * n));
    }
    printf("dxp-chain: %d boundaries, N=%zu C=%d n=%d: embedding gradient error fp32 dXp %.1e, 24-bit dXp %.1e,"
           " bf16 dXp %.1e; dA (worst boundary) fp32 %.1e, 24-bit %.1e, bf16 %.1e; one bf16 rounding 3.9e-03,"
           " one 24-bit rounding 7.6e-06\n", J, N, C, n, nerr(e32, e64, 0, N * C), nerr(e24, e64, 0, N * C),
           nerr(e16, e64, 0, N * C), a32, a24, a16);
    return 0;
}

// ============================================================================
// CPU self-test: the reference backward against central differences. One boundary: the update
// of j-1 (X = A Xprev + beta o) and the read of j (h = sum_r w[r] X_r) under the loss
// R . X + P . h, so that dL/dX = R + w P, i.e. the backward's dXp input is R and dh is P; every
// input (Xprev, o, A, beta, w) is moved by +-eps.
// ============================================================================

static int cpu_selftest(uint64_t seed) {
    host_rng = seed;
    const size_t N = 3;
    const int C = 8, n = 3;
    const double eps = 1e-6;
    std::vector<double> Xprev(N * n * C), o(N * C), A(n * n), beta(n), w(n), R(N * n * C), P(N * C);
    for (auto &v : Xprev) { v = host_normal(); }
    for (auto &v : o) { v = host_normal(); }
    for (int i = 0; i < n * n; i++) { A[i] = (i / n == i % n) + 0.3 * host_normal(); }
    for (auto &v : beta) { v = host_normal(); }
    double ws = 0;
    for (auto &v : w) { v = exp(host_normal()); ws += v; }
    for (auto &v : w) { v /= ws; }
    for (auto &v : R) { v = host_normal(); }
    for (auto &v : P) { v = host_normal(); }
    // X = A Xprev + beta o (the update of j-1), h = sum w X (the read of j);
    // loss = R . X + P . h, so dL/dX = R + w P: dXp (= A_j^T dX_{j+1}) = R, dh = P.
    // v3 (norm): the pre-norm u = rmsnorm(h; g) of the read under the loss R . X + P . u (dL/du
    // = P, given to the norm's backward as du), with g moved too; s exact at every evaluation.
    std::vector<double> X(N * n * C), h(N * C), g(C), u(N * C), rs(N);
    for (auto &v : g) { v = 1 + 0.3 * host_normal(); }
    bool norm = false;
    auto loss = [&]() {
        ref_forward(Xprev.data(), o.data(), A.data(), beta.data(), w.data(), N, C, n, false, X.data(), h.data());
        if (norm) { ref_norm(h.data(), g.data(), N, C, u.data(), rs.data()); }
        double l = 0;
        for (size_t i = 0; i < N * n * C; i++) { l += R[i] * X[i]; }
        for (size_t i = 0; i < N * C; i++) { l += P[i] * (norm ? u[i] : h[i]); }
        return l;
    };
    bool ok = true;
    for (int v = 0; v < 2; v++) {
        norm = v == 1;
        loss();
        std::vector<double> dXprev(N * n * C), dout(N * C), dw(n, 0.0), dA(n * n, 0.0), db(n, 0.0), dh(P), dg(C, 0.0);
        if (norm) { ref_norm_backward(P.data(), h.data(), rs.data(), g.data(), N, C, dh.data(), dg.data()); }
        ref_backward(R.data(), dh.data(), X.data(), w.data(), Xprev.data(), o.data(), A.data(), beta.data(), N, C, n,
                     dXprev.data(), dout.data(), dw.data(), dA.data(), db.data());
        double worst = 0;
        auto fd = [&](double &x, double analytic) {
            double keep = x;
            x = keep + eps; double lp = loss();
            x = keep - eps; double lm = loss();
            x = keep;
            double num = (lp - lm) / (2 * eps);
            worst = std::max(worst, fabs(num - analytic) / std::max(1.0, fabs(num)));
        };
        for (size_t i = 0; i < N * n * C; i++) { fd(Xprev[i], dXprev[i]); }
        for (size_t i = 0; i < N * C; i++) { fd(o[i], dout[i]); }
        for (int i = 0; i < n * n; i++) { fd(A[i], dA[i]); }
        for (int r = 0; r < n; r++) { fd(beta[r], db[r]); }
        // w enters through h only; the reference's dw is dh . X, the derivative at fixed X
        for (int r = 0; r < n; r++) { fd(w[r], dw[r]); }
        for (int c = 0; norm && c < C; c++) { fd(g[c], dg[c]); }
        ok &= worst < 1e-7;
        printf("cpu-selftest: %s vs central differences, N=%zu C=%d n=%d: worst rel %.2e %s\n",
               norm ? "v3's fp64 reference (the norm fused)" : "fp64 reference backward", N, C, n, worst,
               worst < 1e-7 ? "PASS" : "FAIL");
    }
    for (const Shape &sh : check_shapes) { ok &= emu_v3(sh, seed + 7); }
    // the launch arithmetic: partial counts at the check and bench shapes
    bool parts = true;
    for (const Shape &s : check_shapes) { parts &= ceil_div(s.N, hc_rows_per_part(s.N)) <= HC_PARTS_MAX; }
    parts &= ceil_div(bench_shape.N, hc_rows_per_part(bench_shape.N)) <= HC_PARTS_MAX;
    printf("cpu-selftest: partials per sum at most %d at every shape: %s\n", HC_PARTS_MAX, parts ? "PASS" : "FAIL");
    ok &= parts;
    printf("cpu-selftest: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

// ============================================================================

int main(int argc, char **argv) {
    int ver = 0, reps = 20;
    bool do_check = false, do_bench = false, do_all = false, do_self = false, do_bytes = false, do_chain = false;
    bool op_fwd = false, op_bwd = false;
    uint64_t seed = 1234;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        auto val = [&](void) -> const char * {
            if (i + 1 >= argc) { fprintf(stderr, "error: %s needs a value\n", a); exit(1); }
            return argv[++i];
        };
        if (!strcmp(a, "--version")) { ver = atoi(val()); }
        else if (!strcmp(a, "--op")) {
            const char *o = val();
            if (!strcmp(o, "fwd")) { op_fwd = true; }
            else if (!strcmp(o, "bwd")) { op_bwd = true; }
            else { fprintf(stderr, "error: --op takes fwd or bwd\n"); return 1; }
        }
        else if (!strcmp(a, "--check")) { do_check = true; }
        else if (!strcmp(a, "--bench")) { do_bench = true; }
        else if (!strcmp(a, "--all")) { do_all = true; }
        else if (!strcmp(a, "--cpu-selftest")) { do_self = true; }
        else if (!strcmp(a, "--bytes")) { do_bytes = true; }
        else if (!strcmp(a, "--dxp-chain")) { do_chain = true; }
        else if (!strcmp(a, "--seed")) { seed = strtoull(val(), NULL, 10); }
        else if (!strcmp(a, "--reps")) { reps = atoi(val()); }
        else if (!strcmp(a, "--quick")) { quick = true; }
        else { fprintf(stderr, "error: unknown flag %s (see the top of dev/cuda/hc.cu)\n", a); return 1; }
    }
    if (do_self) { return cpu_selftest(seed); }
    if (do_bytes) { print_bytes(); return 0; }
    if (do_chain) { return dxp_chain(seed); }
    if (ver < 0 || ver == 4 || ver == 11 || ver == 13 || ver == 14 || ver > 17 || reps < 1) {
        fprintf(stderr, "usage: hc [--op fwd|bwd] [--version 1|2|3|5|6|7|8|9|10|12|15|16|17] [--check] [--bench]"
                        " [--seed S] [--reps R];"
                        "  hc --all;  hc --cpu-selftest;  hc --bytes  (v4: commit 7959a47; v11: commit 634d014;"
                        " v13, v14: commit d267c89)\n");
        return 1;
    }
    if (do_all || (!op_fwd && !op_bwd)) { op_fwd = op_bwd = true; }
    if (do_all || (!do_check && !do_bench)) { do_check = do_bench = true; }
    if (do_all) { ver = 0; }
    // v5 to v12 are backwards only (their forward is v3's), v15 a forward only; v16 both (its forward
    // is checked and timed with v15's variants: once, where both are run)
    std::vector<int> vers;
    for (int v : {1, 2, 3, 5, 6, 7, 8, 9, 10, 12, 15, 16, 17}) { if (ver == 0 || ver == v) { vers.push_back(v); } }
    auto fwd_variants = [&](int v) { return v == 16 || (v == 15 && ver == 15); };
    print_device(seed);
    bool ok = true;
    if (do_check) {
        for (int v : vers) {
            if (op_fwd && v < 5) { ok &= check_op(true, v, seed); }
            if (op_fwd && fwd_variants(v)) { ok &= check_fwd_v15(seed); }
            if (op_bwd && v != 15) { ok &= check_op(false, v, seed); }
        }
        if (ver == 0 || ver == 2) { ok &= check_edges_v2(seed); }
        if (ver == 0 || ver == 3) { ok &= check_edges_v3(seed, 3); }
        for (int v : {5, 6, 7, 9, 10, 12, 16, 17}) { if (ver == 0 || ver == v) { ok &= check_edges_v3(seed, v); } }
        if (op_bwd && (ver == 0 || ver == 9)) { ok &= check_reduce_sites(seed); }
    }
    if (do_bench) {
        double gbs = bench_intro(reps);
        for (int v : vers) {
            if (op_fwd && v < 5) { bench_op(true, v, reps, seed, gbs); }
            if (op_fwd && fwd_variants(v)) { bench_fwd_v15(reps, seed); }
            if (op_bwd && v != 15) { bench_op(false, v, reps, seed, gbs); }
        }
    }
    if (do_check) { printf("all checks: %s\n", ok ? "PASS" : "FAIL"); }
    return ok ? 0 : 1;
}
