/*
dev/cuda/route.cu: kernel lab for MHAR routing (issue 5, "CUDA trainer speed",
the routing part). Developed here, alone, before anything moves into
train_mhar.cu. SPEC.md section 4 (routing and its backward) and section 5
(block mode) are the contract; common/config.h gives the slot geometry
(site_sources), which this file uses as is.

Build (from the repository root):
    nvcc -O3 -arch=sm_90a -o route dev/cuda/route.cu
Run:
    ./route --cpu-selftest          float64 reference vs central differences, S=1 == full
                                    mode, bf16 storage error per output; no GPU needed
    ./route --bytes [shape flags]   byte counts per version; no GPU needed
    ./route --version N --check     version N against the float64 reference (fresh random inputs)
    ./route --version N --bench     version N timed at the 100M shapes (events, warm-up, median)
    --vmax M                        with --version N: versions N..M (inputs drawn once)
    ./route --all                   --check and --bench of every version (1..21)
  shape flags (bench/bytes): --L 12 --S 1 --C 512 --H 8 --N 32768 (N = B*T = 16*2048); --seed X

What is timed: a whole-model routing pass with the sublayers replaced by fixed
random outputs. Inputs: slots [2L+1, N, C] bf16 (the sources, written before
routing starts), per site j: q_j, gamma_j (routing) and g_j (the RMSNorm that
follows the site), all fp32, and dU_j [N, C] fp32 = dL/du_j, the gradient the
sublayer's backward would hand back. Forward, for j = 0 .. 2L:
    h_j = route_j(sources of j)   (bf16, kept for the norm backward)
    u_j = rmsnorm(h_j; g_j)       (bf16, the sublayer input), rstd_j (fp32)
    a_j (N, H, n_j) fp32 weights and/or lse_j (N, H) fp32 log-sum-exp per head
Backward, j = 2L .. 0: G_j = dL/dh_j from the norm backward, dg_j; then the
routing backward: dq_j, dgamma_j and the routing part of dslots [2L+1, N, C]
fp32 (the sum over every site that reads a slot; the block-mode pass-through
dslot_j += dslot_{j+1} belongs to the sublayer chain, not to routing).

Versions (NOTES_route.md has the byte counts and predictions):
  v1  simple, per site: route kernel (scores, per-head softmax, mix; a stored)
      + separate RMSNorm; backward: norm backward (fp32 G), route backward that
      read-modify-writes the fp32 dslots of every (site, source) pair, and a
      separate pass over the sources for dq/dgamma. The trainer's algorithm today.
  v2  fused: forward is one pass over the sources with an online softmax per
      head, the RMSNorm applied in the epilogue (writes h, u, rstd, lse; a only
      when asked, for the check). Backward per site fused too: norm backward,
      then one pass over the sources (a recomputed from lse), dq/dgamma/dg
      partials in the same pass; dslots still read-modify-written per pair.
  v3  v2's forward; backward "gather" (issue 5 idea (b)): per site only a small
      kernel (norm backward, stores G_j in bf16 and S_j[h] = G_j[h].h_j[h]);
      then, once per slot k, one kernel sums the contributions of ALL sites that
      read slot k (p, e, a, ds recomputed from v_k, G_j, lse_j, S_j) and writes
      dslot_k once. No fp32 read-modify-write, no per-pair pass over sources.
  v4  v3's site kernels; the trainer's gather and q/gamma pass as of commit
      3346376 (readers in groups of 8 in registers, partitions of 128 rows,
      32-lane fixed-order reduction of the partials).
  v5  branch rbwd2 (now in the trainer): the gather prefetches the next
      reader's lse and S with its G, writes a bf16 copy of dslot; the q/gamma pass stages tiles of v and dsr in shared memory and keeps
      all readers of a thread's two channels in registers. --check also requires
      the bf16 copy to equal bf16(dslot_0) bit for bit. The next reader's lse
      and S rows are prefetched into L1 (no registers).
  v6  v5 with the next reader's lse and S prefetched into registers instead
      (more registers: spills at C=512), for comparison.
  v7  two slots per pass over G (prepared 2026-11-29, NOT YET RUN on a GPU):
      the pass of slot hi also adds, for a partner slot lo < hi, the terms of
      lo's readers j >= hi into an fp32 partial (N, C) (and their u.v sum);
      lo's own pass later adds its readers j < hi and finishes. Each G_j row
      (with lse_j, S_j) read by hi's pass serves both slots. Pairs: Prob::v7_*
      (build_v7_plan, by bytes saved); the q/gamma pass is v5's. --check runs it
      with every pair that shares a row (more pairs at small L), poisons its
      scratch and repeats the backward (bit-identical required).
  v8  the row ring (the trainer's since commit 19e9f72; checked and benchmarked
      on the H200, session 4): v5 with the forward's sources and the gather's G rows
      copied ROUTE_RING - 1 = 3 rows ahead into shared memory with cp.async
      (one commit group per row) instead of one row ahead into registers; the
      gather still prefetches each reader's lse and S into L1 when its row is
      issued. Site kernel, q/gamma pass and reductions are v5's; same bytes as
      v5, and --check requires v5's bf16 dslot copy equality.
  v9  v8 with a leaner gather (route_gather_v9_kernel, MINB = 2 blocks/SM): v_k
      unpacked to fp32 once, each reader's G row and qg_j unpacked / loaded
      once, the weight as exp2f of a log2-scaled argument, dv as two FMAs.
      96 registers. v10: the same at 3 blocks/SM (80 registers, no spill at
      C=512 H=8). Session 4 on the H200: both PASS; bwd v8 8.709, v9 8.964,
      v10 8.750 ms: no gain here (the trainer's gather with the same changes,
      branch gather-lean: 5.81 -> 5.44 ms in one profile).
  v11 v8 with a double-buffered q/gamma pass (written 2026-11-30, NOT YET RUN on
      a GPU): the gather writes dsr as (N, H, nrp) (nrp = nr rounded up to 4;
      the padding readers never written) instead of (N, nr, H), so a tile's dsr
      is one contiguous range; route_param_v11_kernel stages tiles of v and dsr
      with 16-byte cp.async into two shared-memory stages, tile i+1 in flight
      while tile i is summed (v5's sums, unchanged). Forward, gather (but for
      the dsr layout), site kernel and reductions are v8's. --check poisons dsr
      (its padding stays NaN) and the partials, and repeats the backward with
      the pass's plain v copy (the fallback for rows not in 16-byte chunks):
      bit-identical required. --bench also times each version's q/gamma pass
      alone ("q/gamma pass alone" line, v4 and up).
  v12 v11 with a leaner gather (route_gather_v12_kernel; written 2026-11-30, NOT
      YET RUN on a GPU): same math in the same order; 32-bit element indices with
      the per-lane parts computed once and j * (slot size) per reader; readers
      from a register per lane by shuffle (nr <= 32); lse and S copied into the
      ring with the G row (cp.async) instead of an L1 prefetch and global loads;
      readers past nr issued as zero-byte copies (no branch around the issue);
      v held packed (unpacked per reader, one integer instruction per value).
      Checks as v11's (poisoning, the repeat with the plain v copy); expected but
      not required: hashes equal to v11's. --cpu-selftest checks its index math
      against v11's on every lab shape.
  v13 v12's backward with a grouped forward (issue 5, "two-phase forward";
      written and measured on the H200 2026-11-30): the queries do not depend on
      the input, so site j's kernel (route_fwd_v13_kernel<C, H, KX>) also runs
      the online softmax of the next KX sites over its own sources when their
      lists start with them, and stores each as a partial: hbar = acc / l
      (N, C) fp32 and lse_p = m + log l (N, H) fp32; those sites start from it
      (max lse_p, sum 1, mix hbar) and read only their remaining sources.
      Groups: route_fwd_plan (kernels/route_forward.cuh, the trainer's planner too), by
      cost (bytes and the extra sites' work) for --bench and --bytes, wherever
      the slots allow for --check. With
      KX > 0 the qg of all KX + 1 sites in shared memory; KX <= 3 (no spills
      at C = 512 and 1024). The kernel writes no a: --check recomputes it from the stored
      lse (route_a_kernel), as the backward does. The partials live in Gb (the
      backward's G rows, free during the forward) when they fit, as the
      trainer's live in route_G; --check poisons them first. --cpu-selftest
      checks the plans on every L <= 13 and S, and the partials' algebra in
      float64.
  v14 v13 with a leaner grouped forward (route_fwd_v14_kernel<C, H, KX>; written
      2026-11-30, measured in session 7): same interface, plan, partials (lse_p in
      natural log) and backward (v12's); fewer instructions per (site, source
      row) pair: scores in base 2 (log2 e folded into qg once, one ex2.approx.ftz
      a weight), the KX + 1 sites' head partials reduced together by a
      transposing butterfly (each lane then owns some of the (site, head) sums
      and runs their max / sum / weight; the weights go back by one indexed
      shuffle each), the running max raised only when a score passes it by more
      than FWD14_TAU = 8 (base 2; one warp vote a row, else acc += p v: one FMA
      a channel), the row unpacked once for all sites. No spills at C = 512 and
      1024, KX 0..3. --cpu-selftest emulates the butterfly lane by lane on
      every (C, H, KX) built and the lazy rescale in fp32 against float64.
  v15 v14 with the gather's position-independent products on tensor cores
      (route_gather_v15_kernel<C, H>; session 9): per tile of 8 positions and
      head, E^T = QG V^T (e = qg_j . v) and, after the reader loop, U^T = QG^T
      DS^T (U = sum_j ds_j qg_j: dv += r U - (r^3 / C)(U . v) v) on mma.sync
      m16n8k16, qg and ds in two bf16 parts each; the loop keeps p = G . v, the
      weight and dv += a G. Per-slot A fragments from route_qfrag15_kernel, once
      per backward. nr <= 32. --cpu-selftest emulates it lane by lane.
  v16 v14 with the q/gamma pass on tensor cores (route_param_v16_kernel;
      session 9): QV^T = DSR^T V per head on mma.sync, ds r in two bf16 parts,
      v by ldmatrix.trans; the same partials over partitions of v16_rows (256,
      V16_ROWS=128 in the environment) positions. --cpu-selftest emulates it.
  v17 v16 with the gather's four products on tensor cores (route_gather_v17_kernel
      <C, H, NP>; session 10): a warp per NP positions (V17_NP=1 or 2, default 2),
      head by head: p = G v and sum_j a_j G_j as block matrix-vector products on
      mma.sync (one of eight columns used), e = qg v and U = sum_j ds_j qg_j with
      qg from a per-block image in shared memory (ldmatrix), the G fragments
      transposed in registers (movmatrix), no shuffles for the head sums. C = 512,
      heads of 32 or 64 channels, V17_MIN_NR (4) <= nr <= 32 (other slots: v12's
      gather). A persistent grid. --cpu-selftest emulates it lane by lane.
  v18 v16 with the site kernel's rows staged (route_site_v18_kernel<C, H, SLOTS>,
      2026-12-03): each warp copies its positions' dU and h rows into shared
      memory by cp.async, one position ahead (SLOTS = 2, 3 blocks an SM as v3),
      and computes from there (v3's arithmetic). --check also requires v16's
      bits from the same forward.
  v19 v18 with all four of a warp's positions copied at its start (SLOTS = 4,
      96 KiB of stages a block at C = 512, 2 blocks an SM).
  v20 v16 with site j's norm backward fused into slot j's gather
      (route_gather_v20_kernel, 2026-12-04): slot j's first reader is site j, so
      the warp of position t computes G_j and S_j (v3's arithmetic) into its ring
      stage 0 and stores them for the later slots, then gathers as v12. The site
      pass, bound by DRAM, runs inside the gather, bound by instruction issue;
      G_j and S_j are not read back. dg: per-block sums over 8 positions
      (reduce_lanes_kernel). --check also prints the relative difference from
      v16's backward from the same forward (not bit for bit; see check_config).
  v21 v16 with the new slot's r computed by the forward (route_fwd_v14_kernel with
      FRESH, 2026-12-04): site j's last source is slot j, which no earlier site
      reads, so site j's kernel computes r_j from the row in its ring (the sum in
      source_stat_kernel's order) and stores it; no pass of r over the slots. In
      the trainer, the source_stat_forward pass after each sublayer goes (block
      mode's chained adds keep computing their slot's r: there it is free).
      --check poisons r first and requires source_stat_kernel's bits for every slot.
  v22 v21 with the gather in the head-lane layout (route_gather_v22_kernel, Hl,
      2026-12-04): lane l holds 8 NCH consecutive channels (packs l NCH ..), all in
      one head when H | 32, so a head is 32 / H lanes and its sums of p and e are
      log2(32 / H) shuffles of one value (v12: log2(SEG) of NCH values: 12
      shuffles a reader at C = 512, H = 8, against 4), and the weight, ds and the
      dsr store come once a lane and reader instead of once a chunk. The site
      kernel stores G, and qg_hl_kernel qg, in that layout's order (hl_pack), so
      their rows still load in coalesced 16-byte packs; v and dslot keep the row
      order (once a position). --check prints the difference from v16's backward
      (the same products, summed in another order).
  v23 v21 with v12's gather reading qg in pair order (qg_pair_kernel, 2026-12-04):
      lane l's channels 8l .. 8l+4 of each chunk at 4l, 8l+4 .. 8l+8 at 128 + 4l, so
      that each 16-byte load of a warp reads 512 contiguous bytes (row order: 16 of
      every 32 bytes, twice the L1 wavefronts; ncu had the trainer's gather bound
      by L1's wavefronts, 79% of peak, a quarter of them bank conflicts). The
      same values and arithmetic: --check requires v16's bits from the same forward.

Determinism: no float atomics. Per-channel sums over positions (dq, dgamma,
dg) are written as per-block partials and summed in a fixed order.

STATUS (H200, 2026-11-29): --check PASS for v1, v2, v4, v5 (v5's bf16 dslot
copy equal to bf16(dslot) bit for bit); v3 6 of 8 shapes ok when a timeout cut
it; v6 not run. --bench (100M, full mode, H=8) v4 vs v5 only: backward 11.755
-> 9.454 ms (2.55x -> 1.97x the floor at copy rate), forward 3.91 ms both. In
the trainer (MHAR_PROFILE, ms a step, mhar H=8): q/gamma parts 4.18 -> 1.48
(predicted 0.6-1.0), slot gather 9.67 -> 9.28 (predicted 5-6.5; still 2.6x its
byte floor: the L1 prefetch of lse/S bought little), the 1.58 ms cast gone into
the gather; block S=4: gather 3.93 -> 3.89, q/gamma 1.96 -> 1.21. Next ideas
(NOTES_route.md): ncu on the gather, two slots per pass over G, the q/gamma
pass fused into the gather, the two-phase forward on a second stream.
v7 (two slots per pass) is written and checked on the CPU only (plan walk and
float64 algebra in --cpu-selftest); NOTES_route.md has its bytes, prediction
and the device command.
v8 (row ring, session 4): --check PASS (v5-v8, 8 configs each); --bench 100M
full mode H=8, v5 -> v8: forward 3.915 -> 3.288 ms (1.22x -> 1.03x its floor),
backward 9.656 -> 8.735 ms (2.00x -> 1.81x). The trainer's version measured
forward route 4.27 -> 3.22 and slot gather 6.64 -> 5.98 ms a step
(NOTES_route.md, "v8 (row ring)" and "Round 3"). v9, v10 (leaner gather):
PASS, backward 8.964 and 8.750 ms against v8's 8.709: no gain.
v11 (double-buffered q/gamma pass): compiled and emulated on the host only
(--cpu-selftest: the pass's schedule and indexing against a float64 sum);
NOTES_route.md, "v11", has the device command.
v12 (leaner gather): compiled only; NOTES_route.md, "v12", has the device command.
v11, v12: measured in session 5 (NOTES_route.md, "Round 4", "v12").
v13 (grouped forward, session 6): --check PASS (8 configs, groups wherever
allowed); --bench 100M full mode H=8, plan by cost (8.63 GB, 12 sites from a
partial): forward v12 3.301 -> v13 2.996 ms (1.03x -> 1.47x its floor): the
extra sites' work, not bytes, bounds the grouped kernels now (NOTES_route.md,
"v13 measured").
v14 (leaner grouped forward, session 7): --check PASS (8 configs); --bench 100M
full mode H=8, same plan and bytes: forward v13 2.990 -> v14 2.600 ms (1.48x ->
1.28x its floor of 2.03). In the trainer (route_forward14_kernel, its default
for bf16): "fwd route + norm" 2.85 -> 2.55 ms a step; block mode (every site
alone) unchanged (NOTES_route.md, "v14 measured").
v15, v16 (session 9): --check PASS (8 configs each). --bench 100M full mode H=8:
backward v14 7.53 -> v15 8.21 ms (block S=4 4.83 -> 5.80): the fragments' L2
traffic and the phases' latency cost more than the leaner loop saves (ncu: 17%
fewer instructions at one slot); v16 7.32 ms (7.14 with V16_ROWS=128), its
q/gamma pass alone 0.99 -> 0.83 (0.59) ms. v16's pass is the trainer's since
session 9, on the main stream (NOTES_route.md, "Session 9").
v17 (session 10, no device lent): compiled, and emulated lane by lane on the host
(--cpu-selftest: 8 shapes, two mutations caught); NOT YET RUN on a GPU.
NOTES_route.md, "v17", has its cost model and the device command.
v18, v19 (2026-12-03): --check PASS (8 configs each, v16's bits); --bench 100M full
mode H=8, alternating twice: backward v16 7.322 / 7.312, v18 7.323 / 7.314, v19
7.508 / 7.478 ms: no gain; not ported (NOTES_route.md, "v18, v19").
v20 (2026-12-04): --check within tolerance at the 8 configs (dslots 3.3e-3 ..
7.6e-3 against tolerances from the emulated bf16 error), 0 racecheck hazards;
--bench alternating twice: backward v16 7.252 / 7.261, v20 7.041 / 7.038 ms (full
mode H=8), block S=4 4.714 -> 4.442. Its trainer port lost (0.983x mhar): not
ported (NOTES_route.md, "v20").
v21 (2026-12-04): --check PASS at the 8 configs (r bit-identical to source_stat_kernel's,
the backward to v16's); --bench alternating twice: forward v16 2.595 / 2.593, v21 2.492 /
2.497 ms (full mode H=8), block S=4 1.664 -> 1.502. In the trainer (the slots that no chained
add writes): tokens/s 1.0048x mhar H=8, 1.0035x block S=4 and S=8; landed (NOTES_route.md, "v21").
v22 (2026-12-04): --check PASS at the 8 configs (the backward within 1e-6 of v16's); --bench:
backward v21 7.256 / 7.262, v22 7.637 / 7.654 ms (full mode H=8), block S=4 4.705 -> 5.076:
slower, not ported (NOTES_route.md, "v22, v23").
v23 (2026-12-04): --check PASS at the 8 configs, the backward bit-identical to v16's; --bench:
backward v21 7.241 -> v23 7.107 ms, block S=4 4.693 -> 4.657. In the trainer (the gather's FULL
instance): slot gather 4.82 -> 4.67 ms a step, tokens/s 1.005x mhar H=8; landed.
*/
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include <array>
#include <algorithm>
#include <type_traits>
#include "../../common/config.h"
#define ROUTE_FWD_PLAN_ONLY   // the trainer's grouping planner only, no kernels
#include "../../kernels/route_forward.cuh"

#define LAB_VMAX 23   // the last version (--all, --vmax, --bytes, the usage line)

typedef __nv_bfloat16 bf16;

// ----------------------------------------------------------------------------
// Checked CUDA calls

static void cuda_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "error: CUDA: %s in %s (%s:%d)\n", cudaGetErrorString(e), what, file, line);
        exit(1);
    }
}
#define CK(call) cuda_check((call), #call, __FILE__, __LINE__)
#define LAUNCH_CHECK() cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

static unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// ----------------------------------------------------------------------------
// Host bf16 (round to nearest even), independent of the device headers

static uint16_t f2bf_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return 0x7fc0; }   // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf_bits2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double bfr(double x) { return bf_bits2f(f2bf_bits((float)x)); }   // round through bf16

// ----------------------------------------------------------------------------
// Problem geometry: the sites' sources (config.h) and, per slot, its readers.

struct Prob {
    int L, S, C, H, N, J;
    int P;                      // sum over sites of n_j (the (site, source) pairs)
    int nmax;                   // max n_j, max readers
    std::vector<int> n;         // (J) sources per site
    std::vector<int> src;       // (J, J) row j: the slots site j reads, in softmax order
    std::vector<int> pair_off;  // (J+1) offset of site j's pairs (for a)
    std::vector<int> nr;        // (J) readers per slot
    std::vector<int> rd;        // (J, J) row k: the sites reading slot k, increasing
    // v7 plan (two slots per pass over G; build_v7_plan): the pass of slot k also
    // adds, for its partner slot lo = v7_lo[k] < k, the terms of lo's readers j >= k
    // into an fp32 partial; the later pass of lo (v7_hi[lo] = k) adds lo's readers
    // j < k and finishes. v7_ul (J, J, 3) row k: the pass of slot k's entries
    // (j, ia, ib), j increasing: ia = j's index among slot k's readers (-1: j does
    // not read k), ib = its index among lo's readers (-1: none, or k has no lo).
    std::vector<int> v7_lo, v7_hi, v7_nu, v7_ul;
    int v7_pairs = 0, v7_rows = 0;   // pairs made; G rows read by all passes (v5: P)
    // v13 plan (grouped forward; build_v13_plan): lead13[j] = the first site of j's group
    std::vector<int> lead13;
    int v13_starts = 0, v13_rows = 0;   // sites that start from a partial; source rows read (v12: P)
};

// index of x in the nr-long row, -1 when absent
static int find_in(const int *row, int nr, int x) {
    for (int i = 0; i < nr; i++) { if (row[i] == x) { return i; } }
    return -1;
}

// v7's pairs, bottom up: for the lowest slot lo above the last pair's hi, the
// partner hi > lo that saves the most bytes, if any: rows shared (readers j >= hi
// of lo that also read hi, read once instead of twice) x (G_j + lse_j + S_j)
// against the partial's cost (v_lo and r_lo read again, the (N, C) fp32 partial
// written and read, its u.v sum). Pairs never overlap, so one partial buffer and
// one second dsr buffer suffice. min_gain: bytes per position a pair must save
// (the self-test passes a negative one to pair whatever shares a row).
static void build_v7_plan(Prob &p, double min_gain) {
    const int J = p.J;
    const double rowB = 2.0 * p.C + 8.0 * p.H, extra = 2.0 * p.C + 4 + 8.0 * p.C + 8;
    p.v7_lo.assign(J, -1); p.v7_hi.assign(J, -1); p.v7_nu.assign(J, 0); p.v7_ul.assign((size_t)J * J * 3, -1);
    p.v7_pairs = 0; p.v7_rows = 0;
    int last_hi = -1;
    for (int lo = 0; lo < J; lo++) {
        if (lo <= last_hi) { continue; }
        int best = -1;
        double best_gain = min_gain;
        for (int hi = lo + 1; hi < J; hi++) {
            int shared = 0;
            for (int i = 0; i < p.nr[lo]; i++) {
                int j = p.rd[(size_t)lo * J + i];
                if (j >= hi && find_in(&p.rd[(size_t)hi * J], p.nr[hi], j) >= 0) { shared++; }
            }
            double gain = shared * rowB - extra;
            if (shared > 0 && gain > best_gain) { best = hi; best_gain = gain; }
        }
        if (best >= 0) { p.v7_lo[best] = lo; p.v7_hi[lo] = best; last_hi = best; p.v7_pairs++; }
    }
    for (int k = 0; k < J; k++) {
        const int *rk = &p.rd[(size_t)k * J], lo = p.v7_lo[k], hi = p.v7_hi[k];
        int *ul = &p.v7_ul[(size_t)k * J * 3], nu = 0;
        for (int j = k; j < J; j++) {   // readers are >= the slot: j increasing
            int ia = find_in(rk, p.nr[k], j);
            if (ia >= 0 && hi >= 0 && j >= hi) { ia = -1; }   // k's partial (hi's pass) has it
            int ib = lo >= 0 ? find_in(&p.rd[(size_t)lo * J], p.nr[lo], j) : -1;
            if (ia < 0 && ib < 0) { continue; }
            ul[3 * nu] = j; ul[3 * nu + 1] = ia; ul[3 * nu + 2] = ib;
            nu++;
        }
        p.v7_nu[k] = nu;
        p.v7_rows += nu;
    }
}

// v13's most extra sites a kernel runs, per C: the largest KX whose
// route_fwd_v13_kernel compiles without spills at every H (ptxas -v, sm_90a;
// NOTES_route.md "v13"), at most 3: 3 at C = 512 and 1024.
// v13_kmax: the most sites a group.
template <int C> constexpr int v13_kx_max() { return 3; }
static int v13_kmax(int C) { return 1 + (C <= 512 ? v13_kx_max<512>() : v13_kx_max<1024>()); }

// v13's groups (route_fwd_plan in kernels/route_forward.cuh, bf16 sources): by cost, or every
// group the slots allow (all: --check and the self-test, to run every kind of site)
static void build_v13_plan(Prob &p, int kmax, bool all) {
    p.lead13.assign(p.J, 0);
    p.v13_starts = route_fwd_plan(p.J, p.n.data(), p.src.data(), p.J, p.C, p.H, 2, kmax, all ? 1 : 0, p.lead13.data());
    p.v13_rows = 0;
    for (int j = 0; j < p.J; j++) { p.v13_rows += p.n[j] - (p.lead13[j] == j ? 0 : p.n[p.lead13[j]]); }
}
// the extra sites of leader j (0 when j is not a leader)
static int v13_extra(const Prob &p, int j) {
    int x = 0;
    while (p.lead13[j] == j && j + x + 1 < p.J && p.lead13[j + x + 1] == j) { x++; }
    return x;
}

// full_lists: build the full-mode lists 0..j by hand instead of site_sources
// (the self-test compares the two for S = 1).
static Prob make_prob(int L, int S, int C, int H, int N, bool full_lists = false) {
    Prob p;
    p.L = L; p.S = S; p.C = C; p.H = H; p.N = N; p.J = 2 * L + 1;
    Config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.mode = RES_MHAR; cfg.L = L; cfg.C = C; cfg.H = H; cfg.S = S;
    p.n.assign(p.J, 0); p.src.assign((size_t)p.J * p.J, -1);
    p.nr.assign(p.J, 0); p.rd.assign((size_t)p.J * p.J, -1);
    p.pair_off.assign(p.J + 1, 0);
    std::vector<int> buf(1024);
    for (int j = 0; j < p.J; j++) {
        int n;
        if (full_lists) { n = j + 1; for (int i = 0; i < n; i++) { buf[i] = i; } }
        else { n = site_sources(&cfg, j, buf.data()); }
        p.n[j] = n;
        for (int i = 0; i < n; i++) { p.src[(size_t)j * p.J + i] = buf[i]; }
        p.pair_off[j + 1] = p.pair_off[j] + n;
    }
    for (int j = 0; j < p.J; j++) {   // readers in increasing site order
        for (int i = 0; i < p.n[j]; i++) {
            int k = p.src[(size_t)j * p.J + i];
            p.rd[(size_t)k * p.J + p.nr[k]++] = j;
        }
    }
    p.P = p.pair_off[p.J];
    p.nmax = 0;
    for (int j = 0; j < p.J; j++) { p.nmax = std::max(p.nmax, std::max(p.n[j], p.nr[j])); }
    build_v7_plan(p, 0.0);
    build_v13_plan(p, v13_kmax(C), false);
    return p;
}

// ----------------------------------------------------------------------------
// CPU reference, float64, whole model. SPEC section 4 term by term.
//
// Emulation switches reproduce where a GPU version rounds to bf16, so that
// (emulated - exact) measures the error that storage alone causes; the GPU
// check's tolerance per output is derived from it (see check_version).
struct Emu {
    bool round_h;    // h stored in bf16 and read back by the norm backward (all versions)
    bool round_u;    // u written in bf16 (all versions)
    bool round_G;    // G_j stored in bf16 and read by the gather (v3)
    bool S_from_h;   // S_h = G[h].h_stored[h] instead of sum_i a p (v2, v3)
    bool rstd_from_hst;   // the norm reads the stored bf16 h (v1's separate RMSNorm)
};
static const Emu EMU_EXACT = {false, false, false, false, false};

struct Ref {
    std::vector<double> r;                   // (J, N)
    std::vector<double> h, hst, u, rstd;     // (J, N, C), hst = h as stored; rstd (J, N)
    std::vector<double> a, lse;              // (pairs, N, H) at pair_off[j]*N*H; (J, N, H)
    std::vector<double> dslots, dq, dgamma, dg;   // (J, N, C); (J, C) x3
};

// Forward of every site. slots (J, N, C); q, gm, g (J, C).
static void ref_forward(const Prob &P, const double *slots, const double *q, const double *gm, const double *g,
                        const Emu &E, Ref &R) {
    const int C = P.C, H = P.H, HC = C / H, J = P.J;
    const size_t N = P.N;
    R.r.assign(J * N, 0);
    for (size_t k = 0; k < (size_t)J * N; k++) {
        double ss = 0;
        for (int c = 0; c < C; c++) { ss += slots[k * C + c] * slots[k * C + c]; }
        R.r[k] = 1 / sqrt(ss / C + 1e-6);
    }
    R.h.assign(J * N * C, 0); R.hst.assign(J * N * C, 0); R.u.assign(J * N * C, 0);
    R.rstd.assign(J * N, 0); R.a.assign((size_t)P.P * N * H, 0); R.lse.assign(J * N * H, 0);
    std::vector<double> s;
    for (int j = 0; j < J; j++) {
        const int n = P.n[j];
        const int *src = &P.src[(size_t)j * J];
        s.assign((size_t)H * n, 0);
        for (size_t t = 0; t < N; t++) {
            for (int i = 0; i < n; i++) {
                const double *v = slots + ((size_t)src[i] * N + t) * C;
                for (int hh = 0; hh < H; hh++) {
                    double e = 0;
                    for (int c = hh * HC; c < (hh + 1) * HC; c++) { e += q[j * C + c] * gm[j * C + c] * v[c]; }
                    s[(size_t)hh * n + i] = R.r[(size_t)src[i] * N + t] * e;
                }
            }
            double *at = &R.a[(size_t)P.pair_off[j] * N * H + t * H * n];   // (N, H, n) of site j
            for (int hh = 0; hh < H; hh++) {
                double mx = -INFINITY, sum = 0;
                for (int i = 0; i < n; i++) { mx = std::max(mx, s[(size_t)hh * n + i]); }
                for (int i = 0; i < n; i++) { sum += exp(s[(size_t)hh * n + i] - mx); }
                for (int i = 0; i < n; i++) { at[(size_t)hh * n + i] = exp(s[(size_t)hh * n + i] - mx) / sum; }
                R.lse[((size_t)j * N + t) * H + hh] = mx + log(sum);
            }
            double *h = &R.h[((size_t)j * N + t) * C];
            for (int c = 0; c < C; c++) {
                double o = 0;
                for (int i = 0; i < n; i++) { o += at[(size_t)(c / HC) * n + i] * slots[((size_t)src[i] * N + t) * C + c]; }
                h[c] = o;
            }
            double ss = 0;
            for (int c = 0; c < C; c++) { double x = E.rstd_from_hst ? bfr(h[c]) : h[c]; ss += x * x; }
            double rs = 1 / sqrt(ss / C + 1e-6);
            R.rstd[(size_t)j * N + t] = rs;
            for (int c = 0; c < C; c++) {
                double uu = (E.rstd_from_hst ? bfr(h[c]) : h[c]) * rs * g[j * C + c];
                R.u[((size_t)j * N + t) * C + c] = E.round_u ? bfr(uu) : uu;
                R.hst[((size_t)j * N + t) * C + c] = E.round_h ? bfr(h[c]) : h[c];
            }
        }
    }
}

// Backward of every site in reverse order, given dU (J, N, C). Uses R's forward.
static void ref_backward(const Prob &P, const double *slots, const double *q, const double *gm, const double *g,
                         const double *dU, const Emu &E, Ref &R) {
    const int C = P.C, H = P.H, HC = C / H, J = P.J;
    const size_t N = P.N;
    R.dslots.assign(J * N * C, 0); R.dq.assign((size_t)J * C, 0); R.dgamma.assign((size_t)J * C, 0);
    R.dg.assign((size_t)J * C, 0);
    std::vector<double> G(C), Gp(C), acc(C), p, e, ds, S(H);
    for (int j = J - 1; j >= 0; j--) {
        const int n = P.n[j];
        const int *src = &P.src[(size_t)j * J];
        p.assign((size_t)H * n, 0); e.assign((size_t)H * n, 0); ds.assign((size_t)H * n, 0);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (size_t t = 0; t < N; t++) {
            // u = rmsnorm(h; g): G = rstd (g dU - xhat mean(g dU xhat)), dg += dU xhat
            const double *hs = &R.hst[((size_t)j * N + t) * C], *du = dU + ((size_t)j * N + t) * C;
            double rs = R.rstd[(size_t)j * N + t], mm = 0;
            for (int c = 0; c < C; c++) { mm += g[j * C + c] * du[c] * hs[c] * rs; }
            mm /= C;
            for (int c = 0; c < C; c++) {
                double xh = hs[c] * rs;
                G[c] = rs * (g[j * C + c] * du[c] - xh * mm);
                Gp[c] = E.round_G ? bfr(G[c]) : G[c];
                R.dg[(size_t)j * C + c] += du[c] * xh;
            }
            const double *at = &R.a[(size_t)P.pair_off[j] * N * H + t * H * n];
            for (int i = 0; i < n; i++) {
                const double *v = slots + ((size_t)src[i] * N + t) * C;
                for (int hh = 0; hh < H; hh++) {
                    double pp = 0, ee = 0;
                    for (int c = hh * HC; c < (hh + 1) * HC; c++) { pp += Gp[c] * v[c]; ee += q[j * C + c] * gm[j * C + c] * v[c]; }
                    p[(size_t)hh * n + i] = pp; e[(size_t)hh * n + i] = ee;
                }
            }
            for (int hh = 0; hh < H; hh++) {
                double Sh = 0;
                if (E.S_from_h) { for (int c = hh * HC; c < (hh + 1) * HC; c++) { Sh += G[c] * hs[c]; } }
                else { for (int i = 0; i < n; i++) { Sh += at[(size_t)hh * n + i] * p[(size_t)hh * n + i]; } }
                S[hh] = Sh;
                for (int i = 0; i < n; i++) { ds[(size_t)hh * n + i] = at[(size_t)hh * n + i] * (p[(size_t)hh * n + i] - Sh); }
            }
            for (int i = 0; i < n; i++) {
                const double *v = slots + ((size_t)src[i] * N + t) * C;
                double *dv = &R.dslots[((size_t)src[i] * N + t) * C];
                double ri = R.r[(size_t)src[i] * N + t], uv = 0;
                for (int hh = 0; hh < H; hh++) { uv += ds[(size_t)hh * n + i] * e[(size_t)hh * n + i]; }
                for (int c = 0; c < C; c++) {
                    int hh = c / HC;
                    double dsh = ds[(size_t)hh * n + i], qg = q[j * C + c] * gm[j * C + c];
                    dv[c] += ri * dsh * qg - ri * ri * ri / C * uv * v[c] + at[(size_t)hh * n + i] * Gp[c];
                    acc[c] += dsh * ri * v[c];
                }
            }
        }
        for (int c = 0; c < C; c++) {
            R.dq[(size_t)j * C + c] = gm[j * C + c] * acc[c];
            R.dgamma[(size_t)j * C + c] = q[j * C + c] * acc[c];
        }
    }
}

// ----------------------------------------------------------------------------
// Random inputs (fresh per check; the seed is printed)

struct HostIn {
    std::vector<uint16_t> slots;           // (J, N, C) bf16 bits
    std::vector<float> q, gm, g, dU;       // (J, C) x3, (J, N, C)
};
static HostIn make_inputs(const Prob &P, uint64_t seed) {
    HostIn in;
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 7;
    const size_t N = P.N, C = P.C, J = P.J;
    in.slots.resize(J * N * C);
    for (size_t k = 0; k < J; k++) {
        double scale = 0.5 + 1.5 * rng_f32(&rng);   // sources of different sizes, like real outputs
        for (size_t x = 0; x < N * C; x++) { in.slots[k * N * C + x] = f2bf_bits((float)(scale * rng_normal(&rng))); }
    }
    in.q.resize(J * C); in.gm.resize(J * C); in.g.resize(J * C); in.dU.resize(J * N * C);
    for (size_t x = 0; x < J * C; x++) {
        in.q[x] = (float)(0.3 * rng_normal(&rng));   // scores spread a few units: a is far from uniform
        in.gm[x] = (float)(1 + 0.2 * rng_normal(&rng));
        in.g[x] = (float)(1 + 0.2 * rng_normal(&rng));
    }
    for (size_t x = 0; x < J * N * C; x++) { in.dU[x] = (float)rng_normal(&rng); }
    return in;
}
static std::vector<double> to_d(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }
static std::vector<double> bf_to_d(const std::vector<uint16_t> &v) {
    std::vector<double> o(v.size());
    for (size_t i = 0; i < v.size(); i++) { o[i] = bf_bits2f(v[i]); }
    return o;
}

// ||x - y|| / ||y||; infinite when x holds a NaN or an infinity (NaN never passes)
static double rel_err(const double *x, const double *y, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(x[i])) { return INFINITY; }
        num += (x[i] - y[i]) * (x[i] - y[i]);
        den += y[i] * y[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

// ----------------------------------------------------------------------------
// CPU self-test: no GPU needed.

// L = sum_j sum_{t,c} dU_j u_j, the scalar whose gradient the backward computes
static double ref_loss(const Prob &P, const std::vector<double> &slots, const std::vector<double> &q,
                       const std::vector<double> &gm, const std::vector<double> &g, const std::vector<double> &dU) {
    Ref R;
    ref_forward(P, slots.data(), q.data(), gm.data(), g.data(), EMU_EXACT, R);
    double L = 0;
    for (size_t x = 0; x < R.u.size(); x++) { L += dU[x] * R.u[x]; }
    return L;
}

// Central differences on every input element of a small problem.
static bool selftest_fd(int L, int S, int C, int H, int N, uint64_t seed) {
    Prob P = make_prob(L, S, C, H, N);
    HostIn in = make_inputs(P, seed);
    std::vector<double> slots = bf_to_d(in.slots), q = to_d(in.q), gm = to_d(in.gm), g = to_d(in.g), dU = to_d(in.dU);
    Ref R;
    ref_forward(P, slots.data(), q.data(), gm.data(), g.data(), EMU_EXACT, R);
    ref_backward(P, slots.data(), q.data(), gm.data(), g.data(), dU.data(), EMU_EXACT, R);
    struct { const char *name; std::vector<double> *x; const std::vector<double> *grad; } tab[] = {
        {"slots", &slots, &R.dslots}, {"q", &q, &R.dq}, {"gamma", &gm, &R.dgamma}, {"g", &g, &R.dg}};
    bool ok = true;
    printf("  FD  L=%d S=%d C=%d H=%d N=%d (%d sites, %d pairs):", L, S, C, H, N, P.J, P.P);
    for (auto &e : tab) {
        double num = 0, den = 0;
        for (size_t k = 0; k < e.x->size(); k++) {
            double x0 = (*e.x)[k], eps = 1e-5 * std::max(1.0, fabs(x0));
            (*e.x)[k] = x0 + eps; double lp = ref_loss(P, slots, q, gm, g, dU);
            (*e.x)[k] = x0 - eps; double lm = ref_loss(P, slots, q, gm, g, dU);
            (*e.x)[k] = x0;
            double fd = (lp - lm) / (2 * eps), an = (*e.grad)[k];
            num += (fd - an) * (fd - an); den += an * an;
        }
        double err = sqrt(num / den);
        ok = ok && err < 1e-7;
        printf("  %s %.1e", e.name, err);
    }
    printf("  %s\n", ok ? "ok" : "FAIL");
    return ok;
}

// Block mode with S = 1 must be exactly full mode: same bits from both lists.
static bool selftest_s1(uint64_t seed) {
    Prob Pb = make_prob(3, 1, 24, 3, 5), Pf = make_prob(3, 1, 24, 3, 5, true);
    bool same_lists = Pb.src == Pf.src && Pb.n == Pf.n;
    HostIn in = make_inputs(Pb, seed);
    std::vector<double> slots = bf_to_d(in.slots), q = to_d(in.q), gm = to_d(in.gm), g = to_d(in.g), dU = to_d(in.dU);
    Ref Rb, Rf;
    for (auto pr : {std::make_pair(&Pb, &Rb), std::make_pair(&Pf, &Rf)}) {
        ref_forward(*pr.first, slots.data(), q.data(), gm.data(), g.data(), EMU_EXACT, *pr.second);
        ref_backward(*pr.first, slots.data(), q.data(), gm.data(), g.data(), dU.data(), EMU_EXACT, *pr.second);
    }
    bool same = same_lists && Rb.u == Rf.u && Rb.a == Rf.a && Rb.dslots == Rf.dslots && Rb.dq == Rf.dq &&
                Rb.dgamma == Rf.dgamma && Rb.dg == Rf.dg;
    printf("  block S=1 vs full mode (L=3): source lists %s, outputs and gradients %s\n",
           same_lists ? "equal" : "DIFFER", same ? "bit-identical" : "DIFFER");
    // and block mode really is different for S = 2 (site 4 of L=3 reads b0, b1, b2 = slots 0, 2, 4)
    Prob P2 = make_prob(3, 2, 24, 3, 5);
    bool s2 = P2.n[4] == 3 && P2.src[4 * P2.J + 0] == 0 && P2.src[4 * P2.J + 1] == 2 && P2.src[4 * P2.J + 2] == 4 &&
              P2.n[5] == 4 && P2.src[5 * P2.J + 3] == 5;
    printf("  block S=2 geometry (site 4 reads slots 0,2,4; site 5 reads 0,2,4,5): %s\n", s2 ? "ok" : "FAIL");
    return same && s2;
}

static const char *OUT_NAMES[] = {"h", "u", "rstd", "a", "lse", "dslots", "dq", "dgamma", "dg"};
enum { O_H, O_U, O_RSTD, O_A, O_LSE, O_DSLOTS, O_DQ, O_DGAMMA, O_DG, NUM_OUT };
static const std::vector<double> &ref_out(const Ref &R, int o) {
    switch (o) {
    case O_H: return R.h; case O_U: return R.u; case O_RSTD: return R.rstd; case O_A: return R.a;
    case O_LSE: return R.lse; case O_DSLOTS: return R.dslots; case O_DQ: return R.dq;
    case O_DGAMMA: return R.dgamma; default: return R.dg;
    }
}
// The outputs a version's storage rounds, for the emulated reference
static Emu version_emu(int ver) {
    Emu e = {true, true, ver >= 3, ver >= 2, ver == 1};
    return e;
}

// err_emu[o] = ||emulated - exact|| / ||exact||: the error bf16 storage alone causes
static void emu_errors(const Prob &P, const HostIn &in, const Ref &Rx, int ver, double err[NUM_OUT]) {
    std::vector<double> slots = bf_to_d(in.slots), q = to_d(in.q), gm = to_d(in.gm), g = to_d(in.g), dU = to_d(in.dU);
    Ref Re;
    Emu E = version_emu(ver);
    ref_forward(P, slots.data(), q.data(), gm.data(), g.data(), E, Re);
    ref_backward(P, slots.data(), q.data(), gm.data(), g.data(), dU.data(), E, Re);
    for (int o = 0; o < NUM_OUT; o++) {
        const std::vector<double> &y = ref_out(Rx, o);
        const std::vector<double> &x = o == O_H ? Re.hst : ref_out(Re, o);   // h is compared as stored
        err[o] = rel_err(x.data(), y.data(), y.size());
    }
}

// v7's plan, checked by walking the backward's schedule on the host: slots k =
// J-1 .. 0, site k's G stored just before the pass of slot k, and slot k's
// gradient due right after it (sublayer k-1's backward needs it). Every pass may
// read only stored G rows, in increasing j; every (slot, reader) term and ds r
// entry must land exactly once, at the reader's index in the slot's list, and
// before the slot is due; the one partial buffer (and second dsr buffer) holds
// one pair's at a time. why: the first failure.
static bool v7_plan_ok(const Prob &P, const char **why) {
    const int J = P.J;
    std::vector<int> cnt((size_t)J * J, 0), dsrw((size_t)J * J, 0), stored(J, 0), done(J, 0);
    int live = -1, rows = 0;   // live: the lo slot whose partial the buffer holds
#define V7_FAIL(msg) do { *why = msg; return false; } while (0)
    for (int k = J - 1; k >= 0; k--) {
        stored[k] = 1;
        const int lo = P.v7_lo[k], hi = P.v7_hi[k];
        if (lo >= 0 && hi >= 0) { V7_FAIL("a slot is both the hi and the lo of pairs"); }
        if (lo >= 0 && (lo >= k || P.v7_hi[lo] != k)) { V7_FAIL("pair lists disagree"); }
        if (lo >= 0 && live != -1) { V7_FAIL("the partial buffer is still busy"); }
        if (hi >= 0 && live != k) { V7_FAIL("a lo slot's partial is not in the buffer"); }
        const int *ul = &P.v7_ul[(size_t)k * J * 3];
        for (int u = 0; u < P.v7_nu[k]; u++) {
            const int j = ul[3 * u], ia = ul[3 * u + 1], ib = ul[3 * u + 2];
            if (j < 0 || j >= J || !stored[j]) { V7_FAIL("a pass reads a G not stored yet"); }
            if (u > 0 && j <= ul[3 * u - 3]) { V7_FAIL("entries not in increasing j"); }
            if (ia < 0 && ib < 0) { V7_FAIL("an entry serves neither slot"); }
            if (ia >= 0) {
                if (ia >= P.nr[k] || P.rd[(size_t)k * J + ia] != j) { V7_FAIL("ia is not j's index among k's readers"); }
                cnt[(size_t)k * J + j]++; dsrw[(size_t)k * J + ia]++;
            }
            if (ib >= 0) {
                if (lo < 0 || ib >= P.nr[lo] || P.rd[(size_t)lo * J + ib] != j) { V7_FAIL("ib is not j's index among lo's readers"); }
                if (done[lo]) { V7_FAIL("a term lands after its slot was due"); }
                cnt[(size_t)lo * J + j]++; dsrw[(size_t)lo * J + ib]++;
            }
            rows++;
        }
        if (lo >= 0) { live = lo; }
        if (hi >= 0) { live = -1; }
        done[k] = 1;
        for (int i = 0; i < P.nr[k]; i++) {   // slot k is due: all its terms in, once
            if (cnt[(size_t)k * J + P.rd[(size_t)k * J + i]] != 1 || dsrw[(size_t)k * J + i] != 1) {
                V7_FAIL("a slot is due with a term missing or twice");
            }
        }
    }
    if (live != -1) { V7_FAIL("a partial is never finished"); }
    if (rows != P.v7_rows) { V7_FAIL("v7_rows miscounted"); }
    for (int k = 0; k < J; k++) {   // nothing outside the reader lists (ia, ib checked against them)
        int n = 0;
        for (int j = 0; j < J; j++) { n += cnt[(size_t)k * J + j]; }
        if (n != P.nr[k]) { V7_FAIL("a slot got terms from a site that does not read it"); }
    }
#undef V7_FAIL
    return true;
}

// The plan on every geometry (full mode and block S = 2..4, L = 2..12; the byte
// rule and "pair whatever shares a row"); prints the 100M figures.
static bool selftest_v7_plans(void) {
    int n = 0, bad = 0;
    for (int L = 2; L <= 12; L++) {
        for (int S = 1; S <= 4; S++) {
            for (int rule = 0; rule < 2; rule++) {
                Prob P = make_prob(L, S, 512, 8, 1);
                if (rule == 1) { build_v7_plan(P, -1e30); }
                const char *why = "";
                n++;
                if (!v7_plan_ok(P, &why)) {
                    bad++;
                    printf("  v7 plan L=%d S=%d rule %d: FAIL (%s)\n", L, S, rule, why);
                }
            }
        }
    }
    Prob P1 = make_prob(12, 1, 512, 8, 1), P4 = make_prob(12, 4, 512, 8, 1);
    printf("  v7 plan (schedule walk, %d geometries: L=2..12, S=1..4, two pairing rules): %s; L=12 C=512 H=8: "
           "full %d pairs, %d of %d G rows; S=4 %d pairs, %d of %d\n",
           n, bad ? "FAIL" : "ok", P1.v7_pairs, P1.v7_rows, P1.P, P4.v7_pairs, P4.v7_rows, P4.P);
    return bad == 0;
}

// v7's algebra in float64 on the host, pass by pass as the kernels run it (the
// partial, its u.v sum in the finish's k3 term, ds r at the plan's indices, the
// q/gamma sums from those), against the reference backward. pair_all: the
// "pair whatever shares a row" rule (more pairs on small problems).
static bool selftest_v7_numeric(int L, int S, int C, int H, int N, uint64_t seed, bool pair_all) {
    Prob P = make_prob(L, S, C, H, N);
    if (pair_all) { build_v7_plan(P, -1e30); }
    HostIn in = make_inputs(P, seed);
    std::vector<double> slots = bf_to_d(in.slots), q = to_d(in.q), gm = to_d(in.gm), g = to_d(in.g), dU = to_d(in.dU);
    Ref R;
    ref_forward(P, slots.data(), q.data(), gm.data(), g.data(), EMU_EXACT, R);
    ref_backward(P, slots.data(), q.data(), gm.data(), g.data(), dU.data(), EMU_EXACT, R);
    const int J = P.J, HC = C / H;
    const size_t NN = N;
    std::vector<double> G((size_t)J * NN * C), Sv((size_t)J * NN * H);   // the site kernels' G and S = G.h
    for (int j = 0; j < J; j++) {
        for (size_t t = 0; t < NN; t++) {
            const double *hs = &R.hst[((size_t)j * NN + t) * C], *du = &dU[((size_t)j * NN + t) * C];
            double rs = R.rstd[(size_t)j * NN + t], mm = 0;
            for (int c = 0; c < C; c++) { mm += g[j * C + c] * du[c] * hs[c] * rs; }
            mm /= C;
            for (int c = 0; c < C; c++) {
                double x = rs * (g[j * C + c] * du[c] - hs[c] * rs * mm);
                G[((size_t)j * NN + t) * C + c] = x;
                Sv[((size_t)j * NN + t) * H + c / HC] += x * hs[c];
            }
        }
    }
    std::vector<double> dsl((size_t)J * NN * C), part(NN * C), Tp(NN), qvacc((size_t)J * J * C, 0.0);
    std::vector<std::vector<double>> dsr(J);
    for (int k = 0; k < J; k++) { dsr[k].assign(NN * P.nr[k] * H, NAN); }
    // one reader's terms for slot s at position t (gather7_term)
    auto term = [&](int s, int j, size_t t, double *dv, double &T, double *dsrrow) {
        const double *v = &slots[((size_t)s * NN + t) * C], *Gj = &G[((size_t)j * NN + t) * C];
        const double r = R.r[(size_t)s * NN + t];
        for (int hh = 0; hh < H; hh++) {
            double p = 0, e = 0;
            for (int c = hh * HC; c < (hh + 1) * HC; c++) { p += Gj[c] * v[c]; e += q[j * C + c] * gm[j * C + c] * v[c]; }
            const double a = exp(r * e - R.lse[((size_t)j * NN + t) * H + hh]);
            const double ds = a * (p - Sv[((size_t)j * NN + t) * H + hh]);
            for (int c = hh * HC; c < (hh + 1) * HC; c++) { dv[c] += r * ds * q[j * C + c] * gm[j * C + c] + a * Gj[c]; }
            T += ds * e;
            dsrrow[hh] = ds * r;
        }
    };
    std::vector<double> dva(C), dvb(C);
    for (int k = J - 1; k >= 0; k--) {
        const int lo = P.v7_lo[k], hi = P.v7_hi[k];
        const int *ul = &P.v7_ul[(size_t)k * J * 3];
        for (size_t t = 0; t < NN; t++) {
            double Ta = 0, Tb = 0;
            for (int c = 0; c < C; c++) { dva[c] = hi >= 0 ? part[t * C + c] : 0.0; dvb[c] = 0; }
            for (int u = 0; u < P.v7_nu[k]; u++) {
                const int j = ul[3 * u], ia = ul[3 * u + 1], ib = ul[3 * u + 2];
                if (ia >= 0) { term(k, j, t, dva.data(), Ta, &dsr[k][(t * P.nr[k] + ia) * H]); }
                if (ib >= 0) { term(lo, j, t, dvb.data(), Tb, &dsr[lo][(t * P.nr[lo] + ib) * H]); }
            }
            const double r = R.r[(size_t)k * NN + t], k3 = r * r * r / C * (Ta + (hi >= 0 ? Tp[t] : 0.0));
            for (int c = 0; c < C; c++) { dsl[((size_t)k * NN + t) * C + c] = dva[c] - k3 * slots[((size_t)k * NN + t) * C + c]; }
            if (lo >= 0) {
                for (int c = 0; c < C; c++) { part[t * C + c] = dvb[c]; }
                Tp[t] = Tb;
            }
        }
        for (int i = 0; i < P.nr[k]; i++) {   // the q/gamma pass of slot k on its dsr
            const int j = P.rd[(size_t)k * J + i];
            for (size_t t = 0; t < NN; t++) {
                for (int c = 0; c < C; c++) {
                    qvacc[((size_t)k * J + j) * C + c] += dsr[k][(t * P.nr[k] + i) * H + c / HC] * slots[((size_t)k * NN + t) * C + c];
                }
            }
        }
    }
    std::vector<double> dq((size_t)J * C), dgm((size_t)J * C);
    for (int j = 0; j < J; j++) {
        for (int c = 0; c < C; c++) {
            double sum = 0;
            for (int i = 0; i < P.n[j]; i++) { sum += qvacc[((size_t)P.src[(size_t)j * J + i] * J + j) * C + c]; }
            dq[(size_t)j * C + c] = gm[j * C + c] * sum;
            dgm[(size_t)j * C + c] = q[j * C + c] * sum;
        }
    }
    double e1 = rel_err(dsl.data(), R.dslots.data(), dsl.size()), e2 = rel_err(dq.data(), R.dq.data(), dq.size()),
           e3 = rel_err(dgm.data(), R.dgamma.data(), dgm.size());
    bool ok = e1 < 1e-10 && e2 < 1e-10 && e3 < 1e-10;
    printf("  v7 algebra L=%-2d S=%d C=%-3d H=%d N=%d (%d pairs, %d of %d G rows%s): dslots %.1e dq %.1e dgamma %.1e  %s\n",
           L, S, C, H, N, P.v7_pairs, P.v7_rows, P.P, pair_all ? ", pair-all rule" : "", e1, e2, e3, ok ? "ok" : "FAIL");
    return ok;
}

static bool selftest_v11_param(int C, int H, int nr, int N, int tp_force, bool force_sync, uint64_t seed);   // below
static bool selftest_v12_index(void);   // below
static bool selftest_v13(uint64_t seed);   // below
static bool selftest_v14(uint64_t seed);   // below
static bool selftest_v15(uint64_t seed);   // below
static bool selftest_v16(uint64_t seed);   // below
static bool selftest_v17(uint64_t seed);   // below

static int cpu_selftest(uint64_t seed) {
    printf("CPU self-test (float64 reference), seed %llu\n", (unsigned long long)seed);
    bool ok = true;
    ok &= selftest_fd(2, 1, 16, 4, 2, seed + 1);
    ok &= selftest_fd(2, 1, 16, 1, 2, seed + 2);
    ok &= selftest_fd(2, 2, 16, 4, 2, seed + 3);
    ok &= selftest_fd(3, 3, 16, 2, 2, seed + 4);
    ok &= selftest_s1(seed + 5);
    ok &= selftest_v7_plans();
    ok &= selftest_v7_numeric(12, 1, 512, 8, 2, seed + 7, false);
    ok &= selftest_v7_numeric(12, 4, 512, 8, 2, seed + 8, false);
    ok &= selftest_v7_numeric(5, 1, 32, 4, 3, seed + 9, true);
    ok &= selftest_v7_numeric(6, 2, 32, 2, 3, seed + 10, true);
    ok &= selftest_v7_numeric(6, 3, 16, 1, 3, seed + 11, true);
    // v11's q/gamma pass: tiles, stages, reader groups (nr > 32), partial tiles and blocks, the plain v copy
    ok &= selftest_v11_param(512, 8, 21, 300, 0, false, seed + 12);    // the 100M slot of 21 readers: tp 16
    ok &= selftest_v11_param(512, 8, 25, 128, 0, false, seed + 13);
    ok &= selftest_v11_param(512, 2, 12, 200, 0, false, seed + 14);    // tp 32
    ok &= selftest_v11_param(1024, 16, 40, 257, 0, false, seed + 15);  // two reader groups, two blocks
    ok &= selftest_v11_param(256, 2, 64, 140, 8, false, seed + 16);    // two full groups, no padding
    ok &= selftest_v11_param(768, 4, 5, 130, 4, false, seed + 17);     // a half block (256 channels)
    ok &= selftest_v11_param(264, 4, 3, 70, 0, false, seed + 18);      // ncb = 264: a division per v chunk
    ok &= selftest_v11_param(260, 4, 7, 50, 0, false, seed + 19);      // C % 8 = 4 (CPT 1): the plain v copy
    ok &= selftest_v11_param(512, 2, 33, 200, 0, true, seed + 20);     // the plain copy forced, a group of 1 reader
    ok &= selftest_v11_param(512, 1, 1, 129, 8, false, seed + 21);
    ok &= selftest_v12_index();   // v12's gather: its index math against v11's on every lab shape
    ok &= selftest_v13(seed + 22);   // v13's plans on every L, S, and its partials' algebra in float64
    ok &= selftest_v14(seed + 23);   // v14's transposing head sums (lane emulation) and lazy rescale
    ok &= selftest_v15(seed + 24);   // v15's tensor-core gather: fragments, layouts and phases (lane emulation)
    ok &= selftest_v16(seed + 25);   // v16's q/gamma pass on tensor cores (lane emulation)
    ok &= selftest_v17(seed + 26);   // v17's gather with every product on tensor cores (design; lane emulation)
    // What bf16 storage costs each output: the basis of the GPU tolerances
    Prob P = make_prob(12, 1, 512, 8, 48);
    HostIn in = make_inputs(P, seed + 6);
    std::vector<double> slots = bf_to_d(in.slots), q = to_d(in.q), gm = to_d(in.gm), g = to_d(in.g), dU = to_d(in.dU);
    Ref Rx;
    ref_forward(P, slots.data(), q.data(), gm.data(), g.data(), EMU_EXACT, Rx);
    ref_backward(P, slots.data(), q.data(), gm.data(), g.data(), dU.data(), EMU_EXACT, Rx);
    printf("  bf16 storage error ||emulated - exact|| / ||exact||, L=12 C=512 H=8 N=48:\n  %-4s", "ver");
    for (int o = 0; o < NUM_OUT; o++) { printf(" %9s", OUT_NAMES[o]); }
    printf("\n");
    for (int ver = 1; ver <= 3; ver++) {
        double err[NUM_OUT];
        emu_errors(P, in, Rx, ver, err);
        printf("  v%-3d", ver);
        for (int o = 0; o < NUM_OUT; o++) { printf(" %9.2e", err[o]); }
        printf("\n");
    }
    printf("CPU self-test: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

// ----------------------------------------------------------------------------
// Byte counts: the DRAM bytes each version moves if every buffer is read or
// written once per kernel that touches it (re-reads inside one kernel assumed
// to hit L1/L2; params and lists ignored). Per step; divide by N for a token.

struct Bytes { double fwd, bwd; };
static Bytes count_bytes(const Prob &P, int ver) {
    const double N = P.N, C = P.C, H = P.H, J = P.J, Pp = P.P;
    const double V = 2 * C, F = 4 * C;                 // one bf16 vector, one fp32 vector
    const double nblk = ceil(N / 32), npart = ceil(N / (ver >= 4 && ver < 16 ? 128 : 256));
    Bytes b;
    double stats = J * N * (V + 4);                    // r_i: read each slot once, write r
    if (ver == 1) {
        b.fwd = stats + N * (Pp * (V + 4)              // sources + r
                             + Pp * H * 4              // a (scores, then weights, in cache)
                             + J * H * 4 + J * V       // lse, h
                             + J * (V + V + 4));       // rmsnorm: read h, write u, rstd
        b.bwd = N * J * F                              // memset dslots
                + N * J * (F + V + 4 + F)              // norm backward: dU, h, rstd -> G fp32
                + 2 * J * nblk * F                     // dg partials
                + N * (J * F + Pp * H * 4              // route backward: G, a
                       + Pp * (V + 4)                  // sources, r
                       + Pp * 2 * F                    // dslots read-modify-write
                       + Pp * H * 4)                   // ds
                + N * Pp * (H * 4 + V + 4)             // dq/dgamma pass: ds, sources, r
                + 2 * J * npart * F;                   // its partials
    } else {
        b.fwd = stats + N * (Pp * (V + 4) + J * (V + V + 4 + H * 4));   // sources, r; h, u, rstd, lse
        if (ver >= 13) {   // the plan's source rows; each partial (mix and lse) written, then read
            b.fwd += N * ((P.v13_rows - Pp) * (V + 4) + P.v13_starts * 2 * (F + H * 4));
        }
        if (ver == 2) {
            b.bwd = N * J * F                          // memset dslots
                    + N * J * (F + V + 4 + H * 4)      // dU, h, rstd, lse
                    + N * Pp * (V + 4 + 2 * F)         // sources, r, dslots read-modify-write
                    + 2 * 2 * J * nblk * F;            // dq/dgamma and dg partials
        } else {
            b.bwd = N * J * (F + V + 4 + V + H * 4)    // site: dU, h, rstd -> G bf16, S
                    + 2 * J * nblk * F                 // dg partials
                    + N * J * (V + 4 + F)              // gather: v_k, r_k, write dslot_k
                    + N * (ver == 7 ? P.v7_rows : Pp) * (V + 2 * H * 4)   // per reader row: G_j, S_j, lse_j
                    + N * Pp * H * 4 * 2               // ds r scratch: write, read
                    + N * J * V                        // dq/dgamma pass re-reads v_k
                    + 2 * Pp * npart * F;              // its partials
            if (ver >= 5) { b.bwd += N * J * V; }      // bf16 copy of dslot_k (the trainer drops its cast)
            if (ver == 7) { b.bwd += N * P.v7_pairs * (V + 4 + 2 * F + 8); }   // per pair: v_lo, r_lo again;
                                                                               // the partial and its u.v, out and in
            if (ver >= 11) {   // the q/gamma pass also reads dsr's padding readers [nr, nrp)
                for (int k = 0; k < P.J; k++) { b.bwd += N * H * 4 * (((P.nr[k] + 3) & ~3) - P.nr[k]); }
            }
            if (ver == 20) {   // site j's G_j and S_j reach slot j's gather on chip; dg partials per 8 positions
                b.bwd += -N * J * (V + H * 4) + 2 * J * (ceil(N / 8) - nblk) * F;
            }
        }
        if (ver >= 21) { b.fwd -= N * J * (V + 4); }   // no pass of r over the slots; site j computes r_j
    }
    return b;
}

// ----------------------------------------------------------------------------
// GPU: common device helpers

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) { x += __shfl_xor_sync(0xffffffffu, x, o); }
    return x;
}
__device__ __forceinline__ uint4 ld_raw(const bf16 *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }
__device__ __forceinline__ void unpack8(uint4 raw, float (&x)[8]) {
    const __nv_bfloat162 *b = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int k = 0; k < 4; k++) { float2 f = __bfloat1622float2(b[k]); x[2 * k] = f.x; x[2 * k + 1] = f.y; }
}
__device__ __forceinline__ void st_bf8(bf16 *p, const float (&x)[8]) {
    uint4 raw;
    __nv_bfloat162 *b = reinterpret_cast<__nv_bfloat162 *>(&raw);
#pragma unroll
    for (int k = 0; k < 4; k++) { b[k] = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]); }
    *reinterpret_cast<uint4 *>(p) = raw;
}
__device__ __forceinline__ void ld_f8(const float *p, float (&x)[8]) {
    float4 a = *reinterpret_cast<const float4 *>(p), b = *reinterpret_cast<const float4 *>(p + 4);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}
__device__ __forceinline__ void st_f8(float *p, const float (&x)[8]) {
    *reinterpret_cast<float4 *>(p) = make_float4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<float4 *>(p + 4) = make_float4(x[4], x[5], x[6], x[7]);
}

// Lane layout of the fast kernels (v2, v3): one warp per position; a vector of
// C channels is NCH = C/256 chunks of 256, and lane l holds channels
// ch*256 + 8l .. +8 of each chunk (16-byte loads, coalesced). Routing head
// hd = c / HC; the lanes sharing a head inside a chunk are SEG consecutive
// lanes, so a per-head sum is a butterfly over SEG lanes (then over CPH chunks
// when a head is wider than a chunk).
template <int C, int H> struct Geo {
    static constexpr int NCH = C / 256;
    static constexpr int HC = C / H;
    static constexpr int SEG = HC >= 256 ? 32 : HC / 8;
    static constexpr int CPH = HC > 256 ? HC / 256 : 1;
    static_assert(C % 256 == 0, "C must be a multiple of 256");
    static_assert(HC % 8 == 0 && (HC <= 256 ? 256 % HC == 0 : HC % 256 == 0), "C/H must be 8,16,..,256 or a multiple of 256");
};
template <int C, int H> __device__ __forceinline__ int head_of(int ch, int lane) { return (ch * 256 + lane * 8) / Geo<C, H>::HC; }
template <int C, int H> __device__ __forceinline__ bool head_first(int ch, int lane) { return (ch * 256 + lane * 8) % Geo<C, H>::HC == 0; }
// v22's head-lane layout: lane l holds the NCH packs l NCH .. l NCH + NCH - 1 of a row (channels
// 8 NCH l .. +8 NCH, consecutive), so that with H | 32 a lane's channels lie in one head and a head
// is HL = 32 / H consecutive lanes. G and qg are stored in "hl order", pack p of the row at pack
// hl_pack(p), so that the lane's packs are still one coalesced 16-byte load a chunk (pack ch 32 + l).
template <int C, int H> struct Hl {
    static constexpr int NCH = C / 256, HL = 32 / H;
    static_assert(32 % H == 0 && C / H == 8 * NCH * HL, "v22's head-lane layout needs H | 32");
};
__host__ __device__ __forceinline__ int hl_pack(int p, int nch) { return (p % nch) * 32 + p / nch; }

// x[ch] (this lane's partial of its head in chunk ch) -> the head's full sum, in every lane
template <int C, int H> __device__ __forceinline__ void head_sum(float (&x)[C / 256]) {
    constexpr int NCH = Geo<C, H>::NCH, SEG = Geo<C, H>::SEG, CPH = Geo<C, H>::CPH;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
        for (int o = 1; o < SEG; o <<= 1) { x[ch] += __shfl_xor_sync(0xffffffffu, x[ch], o); }
    }
    if constexpr (CPH > 1) {
#pragma unroll
        for (int g0 = 0; g0 < NCH; g0 += CPH) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < CPH; k++) { s += x[g0 + k]; }
#pragma unroll
            for (int k = 0; k < CPH; k++) { x[g0 + k] = s; }
        }
    }
}

#define POS_PER_BLOCK 32   // positions per block in kernels that write per-block partials (8 warps x 4)
#define PART_ROWS 256      // positions per partition in the channel-major partial kernels

// r (rows) = 1 / sqrt(|v|^2 / C + 1e-6), one warp per row of v (rows, C) bf16.
// All versions: the statistic of a source, once per source.
__global__ void source_stat_kernel(float *r, const bf16 *v, size_t rows, int C) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) { return; }
    float ss = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        float x[8];
        unpack8(ld_raw(v + row * C + c), x);
#pragma unroll
        for (int k = 0; k < 8; k++) { ss += x[k] * x[k]; }
    }
    ss = warp_sum(ss);
    if (lane == 0) { r[row] = 1.0f / sqrtf(ss / C + 1e-6f); }
}

// out[c] = sa[c] * sum_p part[p][c] (sa NULL: 1); outb[c] = sb[c] * the same sum (if outb).
// Partition order fixed: deterministic. part (P, C).
__global__ void reduce_part_kernel(float *out, const float *sa, float *outb, const float *sb, const float *part, int P, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float s = 0.0f;
    for (int p = 0; p < P; p++) { s += part[(size_t)p * C + c]; }
    out[c] = sa ? sa[c] * s : s;
    if (outb) { outb[c] = sb[c] * s; }
}
// out (C) = the sum over P partials (P, C), for P in the thousands (v20's dg: a partial per 8
// positions): lane y of 32 sums partials y, y + 32, ... in order, then the lanes in order.
// Block (32 channels, 32 lanes), grid C / 32.
__global__ void reduce_lanes_kernel(float *out, const float *part, int P, int C) {
    __shared__ float acc[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < C) {
        for (int p = threadIdx.y; p < P; p += 32) { s += part[(size_t)p * C + c]; }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int y = 0; y < 32; y++) { t += acc[y][threadIdx.x]; }
        out[c] = t;
    }
}

// ----------------------------------------------------------------------------
// v1: the simple kernels (runtime C and H, scalar loads, fp32 math)

// One site forward: a (N, H, n) weights, lse (N, H), h (N, C) bf16.
// One warp per position: per (head, source) a warp dot product for the score,
// a per-head softmax by lanes h, then the mix one channel per lane (re-reads
// the sources, from L1/L2).
__global__ void route_fwd_v1_kernel(bf16 *hout, float *a, float *lse, const bf16 *slots, const float *r,
                                    const int *src, int n, const float *q, const float *gm, int N, int C, int H) {
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32, HC = C / H;
    if (t >= N) { return; }
    float *at = a + (size_t)t * H * n;
    for (int i = 0; i < n; i++) {
        const bf16 *vi = slots + ((size_t)src[i] * N + t) * C;
        float ri = r[(size_t)src[i] * N + t];
        for (int hh = 0; hh < H; hh++) {
            float d = 0.0f;
            for (int c = hh * HC + lane; c < (hh + 1) * HC; c += 32) { d += q[c] * gm[c] * __bfloat162float(vi[c]); }
            d = warp_sum(d);
            if (lane == 0) { at[hh * n + i] = ri * d; }
        }
    }
    __syncwarp();
    for (int hh = lane; hh < H; hh += 32) {
        float mx = -INFINITY, sum = 0.0f;
        for (int i = 0; i < n; i++) { mx = fmaxf(mx, at[hh * n + i]); }
        for (int i = 0; i < n; i++) { float e = expf(at[hh * n + i] - mx); at[hh * n + i] = e; sum += e; }
        for (int i = 0; i < n; i++) { at[hh * n + i] /= sum; }
        lse[(size_t)t * H + hh] = mx + logf(sum);
    }
    __syncwarp();
    for (int c = lane; c < C; c += 32) {
        int hh = c / HC;
        float o = 0.0f;
        for (int i = 0; i < n; i++) { o += at[hh * n + i] * __bfloat162float(slots[((size_t)src[i] * N + t) * C + c]); }
        hout[(size_t)t * C + c] = __float2bfloat16(o);
    }
}

// u (N, C) = rmsnorm(h; g) in bf16, rstd (N). One warp per position.
__global__ void rmsnorm_fwd_v1_kernel(bf16 *u, float *rstd, const bf16 *h, const float *g, int N, int C) {
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= N) { return; }
    const bf16 *x = h + (size_t)t * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) { float v = __bfloat162float(x[c]); ss += v * v; }
    ss = warp_sum(ss);
    float rs = 1.0f / sqrtf(ss / C + 1e-6f);
    for (int c = lane; c < C; c += 32) { u[(size_t)t * C + c] = __float2bfloat16(__bfloat162float(x[c]) * rs * g[c]); }
    if (lane == 0) { rstd[t] = rs; }
}

// Norm backward: G (N, C) fp32 = dL/dh; part_dg (nblk, C) per-block sums of dU * xhat.
// Block of 8 warps = POS_PER_BLOCK positions; each warp sums its positions into
// its own shared row, rows then added in order. Dynamic shared memory 8*C floats.
__global__ void rmsnorm_bwd_v1_kernel(float *G, float *part_dg, const float *dU, const bf16 *h, const float *rstd,
                                      const float *g, int N, int C) {
    extern __shared__ float rows[];   // (8, C)
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *mine = rows + (size_t)w * C;
    for (int c = lane; c < C; c += 32) { mine[c] = 0.0f; }
    for (int k = 0; k < POS_PER_BLOCK / 8; k++) {
        int t = blockIdx.x * POS_PER_BLOCK + k * 8 + w;
        if (t >= N) { continue; }
        const float *du = dU + (size_t)t * C;
        const bf16 *x = h + (size_t)t * C;
        float rs = rstd[t], m = 0.0f;
        for (int c = lane; c < C; c += 32) { m += g[c] * du[c] * __bfloat162float(x[c]) * rs; }
        m = warp_sum(m) / C;
        for (int c = lane; c < C; c += 32) {
            float xh = __bfloat162float(x[c]) * rs;
            G[(size_t)t * C + c] = rs * (g[c] * du[c] - xh * m);
            mine[c] += du[c] * xh;
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < 8; k++) { s += rows[(size_t)k * C + c]; }
        part_dg[(size_t)blockIdx.x * C + c] = s;
    }
}

// One site backward (routing part): adds into dslots (fp32) for each of the
// site's n sources, writes ds (N, H, n) for the dq/dgamma pass. One warp per
// position; three passes over the sources (p; u.v; the update), the second and
// third from L1/L2.
__global__ void route_bwd_v1_kernel(float *dslots, float *ds, const float *G, const float *a, const bf16 *slots,
                                    const float *r, const int *src, int n, const float *q, const float *gm,
                                    int N, int C, int H) {
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32, HC = C / H;
    if (t >= N) { return; }
    const float *Gt = G + (size_t)t * C, *at = a + (size_t)t * H * n;
    float *dst = ds + (size_t)t * H * n;
    for (int i = 0; i < n; i++) {   // p[h,i] = G[h] . v_i[h] into dst
        const bf16 *vi = slots + ((size_t)src[i] * N + t) * C;
        for (int hh = 0; hh < H; hh++) {
            float p = 0.0f;
            for (int c = hh * HC + lane; c < (hh + 1) * HC; c += 32) { p += Gt[c] * __bfloat162float(vi[c]); }
            p = warp_sum(p);
            if (lane == 0) { dst[hh * n + i] = p; }
        }
    }
    __syncwarp();
    for (int hh = lane; hh < H; hh += 32) {   // ds = a (p - sum_k a p)
        float S = 0.0f;
        for (int i = 0; i < n; i++) { S += at[hh * n + i] * dst[hh * n + i]; }
        for (int i = 0; i < n; i++) { dst[hh * n + i] = at[hh * n + i] * (dst[hh * n + i] - S); }
    }
    __syncwarp();
    for (int i = 0; i < n; i++) {
        const bf16 *vi = slots + ((size_t)src[i] * N + t) * C;
        float ri = r[(size_t)src[i] * N + t], uv = 0.0f;
        for (int c = lane; c < C; c += 32) { uv += dst[(c / HC) * n + i] * q[c] * gm[c] * __bfloat162float(vi[c]); }
        uv = warp_sum(uv);
        float k3 = ri * ri * ri / C * uv;
        float *dv = dslots + ((size_t)src[i] * N + t) * C;
        for (int c = lane; c < C; c += 32) {
            int hh = c / HC;
            dv[c] += ri * dst[hh * n + i] * q[c] * gm[c] - k3 * __bfloat162float(vi[c]) + at[hh * n + i] * Gt[c];
        }
    }
}

// part (P, C): partition p's sum over its PART_ROWS positions and the n sources
// of ds[t, h(c), i] r_i v_i[c]. Block (32 channels) x (8 position lanes).
__global__ void route_param_v1_kernel(float *part, const float *ds, const bf16 *slots, const float *r,
                                      const int *src, int n, int N, int C, int H) {
    __shared__ float acc[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, p = blockIdx.y, HC = C / H;
    int t0 = p * PART_ROWS, t1 = min(t0 + PART_ROWS, N);
    float s = 0.0f;
    if (c < C) {
        for (int t = t0 + threadIdx.y; t < t1; t += 8) {
            for (int i = 0; i < n; i++) {
                s += ds[((size_t)t * H + c / HC) * n + i] * r[(size_t)src[i] * N + t] *
                     __bfloat162float(slots[((size_t)src[i] * N + t) * C + c]);
            }
        }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sum = 0.0f;
        for (int y = 0; y < 8; y++) { sum += acc[y][threadIdx.x]; }
        part[(size_t)p * C + c] = sum;
    }
}

// ----------------------------------------------------------------------------
// v8: the row ring (the trainer's route_forward_kernel and
// route_slot_backward_kernel since commit 19e9f72). The fused forward and the
// gather stream rows (a site's sources, the G rows of a slot's readers), one
// warp per position; loaded one row ahead into registers, a warp has one row
// in flight while it computes on the previous one. With the ring it copies rows
// ROUTE_RING - 1 ahead into shared memory with cp.async instead (no registers
// held): row i goes to stage i % ROUTE_RING, one commit group per row (empty
// past the last row, so that the group count per iteration stays one). At row
// i: wait until at most ROUTE_RING - 2 groups are pending (row i is in), read
// it back, then issue row i + ROUTE_RING - 1 into the stage of row i - 1. Each
// lane reads back only the 16-byte packs it copied itself, so its own wait
// suffices; a value one lane copies for the warp (the forward's r of a source,
// lane 0) needs a __syncwarp after the wait. C is a multiple of 256 here, so
// no lane is past C (the trainer zero-fills those). Dynamic shared memory per
// block of 8 warps: packs [8][ROUTE_RING][NCH][32] x 16 B, then floats
// [8][ROUTE_RING]: 32.1 KB at C = 512, 64.1 KB at C = 1024 (limit raised).
#define ROUTE_RING 4   // a power of two
extern __shared__ __align__(16) unsigned char ring_smem_raw[];   // the ring kernels' dynamic shared memory

template <int C> __host__ __device__ constexpr size_t ring_smem() {
    return 8 * ROUTE_RING * ((size_t)(C / 256) * 32 * sizeof(uint4) + sizeof(float));
}
// this warp's stages of packs (ROUTE_RING, NCH, 32) and its floats (ROUTE_RING)
template <int C> __device__ __forceinline__ uint4 *ring_packs() {
    return reinterpret_cast<uint4 *>(ring_smem_raw) + (size_t)(threadIdx.x >> 5) * ROUTE_RING * (C / 256) * 32;
}
template <int C> __device__ __forceinline__ float *ring_floats() {
    return reinterpret_cast<float *>(ring_smem_raw + (size_t)8 * ROUTE_RING * (C / 256) * 32 * sizeof(uint4)) +
           (threadIdx.x >> 5) * ROUTE_RING;
}
// cp.async global -> shared of 16 bytes (.cg: not kept in L1) or 4 bytes
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// cp.async of this lane's packs of row (C bf16) into this warp's ring stage st; the caller commits
template <int C> __device__ __forceinline__ void ring_fill(int st, const bf16 *row, int lane) {
    constexpr int NCH = C / 256;
    uint4 *ring = ring_packs<C>();
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) { cp_async16(ring + (st * NCH + ch) * 32 + lane, row + ch * 256 + lane * 8); }
}
// The forward's ring (v8): source i of the site (slot src[i], position t) into
// stage i % ROUTE_RING, and its r (copied by lane 0); one commit group, empty when i >= n
template <int C>
__device__ __forceinline__ void fwd_ring_issue(int i, int n, const int *src, const bf16 *slots, const float *r, int N,
                                               int t, int lane, int nr = 1 << 30) {
    if (i < n) {
        const size_t row = (size_t)__ldg(src + i) * N + t;
        ring_fill<C>(i & (ROUTE_RING - 1), slots + row * C, lane);
        if (lane == 0 && i < nr) { cp_async4(ring_floats<C>() + (i & (ROUTE_RING - 1)), r + row); }   // v21: n - 1
    }
    cp_async_commit();
}
// Raises kernel's dynamic shared-memory limit once, when smem is above the default 48 KB
template <typename K> static void ring_smem_limit(K kernel, size_t smem, bool &done) {
    if (!done && smem > 48 * 1024) {
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    done = true;
}

// ----------------------------------------------------------------------------
// v2: fused forward (also v3's forward) and fused per-site backward

// One site forward, fused: h (N, C) bf16, u = rmsnorm(h; g) (N, C) bf16,
// rstd (N), lse (N, H); a (N, H, n) only when a != NULL.
// One warp per position, ONE pass over the n sources: per source, the score of
// each head (butterfly over the head's lanes), then an online-softmax update
// of the running max m, sum l and unnormalised mix acc (all fp32 registers);
// the next source's 16-byte loads are issued before the current one is used
// (RING, v8: sources ROUTE_RING - 1 ahead through the row ring, and their r;
// dynamic shared memory ring_smem<C>()).
// Epilogue: h = acc / l, lse = m + log l, the RMS over the full width, u.
template <int C, int H, bool RING = false>
__global__ void __launch_bounds__(256, C <= 512 ? 3 : 1) route_fwd_v2_kernel(bf16 *hout, bf16 *uout, float *rstd, float *lse, float *a,
                                                            const bf16 *__restrict__ slots, const float *__restrict__ r,
                                                            const int *__restrict__ src, int n, const float *__restrict__ q,
                                                            const float *__restrict__ gm, const float *__restrict__ g, int N) {
    constexpr int NCH = Geo<C, H>::NCH;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= N) { return; }
    float qg[NCH][8], acc[NCH][8], m[NCH], l[NCH];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float qa[8], ga[8];
        ld_f8(q + ch * 256 + lane * 8, qa);
        ld_f8(gm + ch * 256 + lane * 8, ga);
#pragma unroll
        for (int k = 0; k < 8; k++) { qg[ch][k] = qa[k] * ga[k]; acc[ch][k] = 0.0f; }
        m[ch] = -INFINITY; l[ch] = 0.0f;
    }
    uint4 nxt[NCH];
    float rn;
    if constexpr (RING) {   // sources 0 .. ROUTE_RING - 2 in flight
        for (int i = 0; i < ROUTE_RING - 1; i++) { fwd_ring_issue<C>(i, n, src, slots, r, N, t, lane); }
    } else {
        size_t row = (size_t)__ldg(src) * N + t;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_raw(slots + row * C + ch * 256 + lane * 8); }
        rn = __ldg(r + row);
    }
    for (int i = 0; i < n; i++) {
        uint4 cur[NCH];   // source i, packed bf16 (unpacked on use: fewer registers)
        float e[NCH], ri;
        if constexpr (RING) {
            cp_async_wait<ROUTE_RING - 2>();   // source i's group is complete (later ones may not be)
            __syncwarp();                      // and lane 0's copy of its r is visible to the warp
            const int st = i & (ROUTE_RING - 1);
            const uint4 *ring = ring_packs<C>();
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { cur[ch] = ring[(st * NCH + ch) * 32 + lane]; }
            ri = ring_floats<C>()[st];
            // into the stage of source i-1, which every lane has read
            fwd_ring_issue<C>(i + ROUTE_RING - 1, n, src, slots, r, N, t, lane);
        } else {
            ri = rn;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { cur[ch] = nxt[ch]; }
            if (i + 1 < n) {   // prefetch source i+1
                size_t row = (size_t)__ldg(src + i + 1) * N + t;
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_raw(slots + row * C + ch * 256 + lane * 8); }
                rn = __ldg(r + row);
            }
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float v[8], d = 0.0f;
            unpack8(cur[ch], v);
#pragma unroll
            for (int k = 0; k < 8; k++) { d += qg[ch][k] * v[k]; }
            e[ch] = d;
        }
        head_sum<C, H>(e);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float s = ri * e[ch], mn = fmaxf(m[ch], s), v[8];
            float sc = expf(m[ch] - mn), p = expf(s - mn);   // m = -inf at i = 0: sc = 0
            l[ch] = l[ch] * sc + p;
            unpack8(cur[ch], v);
#pragma unroll
            for (int k = 0; k < 8; k++) { acc[ch][k] = acc[ch][k] * sc + p * v[k]; }
            m[ch] = mn;
            if (a != nullptr && head_first<C, H>(ch, lane)) { a[((size_t)t * H + head_of<C, H>(ch, lane)) * n + i] = s; }
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float inv = 1.0f / l[ch];
#pragma unroll
        for (int k = 0; k < 8; k++) { acc[ch][k] *= inv; ss += acc[ch][k] * acc[ch][k]; }
    }
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / C + 1e-6f);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 256 + lane * 8;
        float gw[8], uu[8];
        ld_f8(g + c0, gw);
#pragma unroll
        for (int k = 0; k < 8; k++) { uu[k] = acc[ch][k] * rs * gw[k]; }
        st_bf8(hout + (size_t)t * C + c0, acc[ch]);
        st_bf8(uout + (size_t)t * C + c0, uu);
        if (head_first<C, H>(ch, lane)) { lse[(size_t)t * H + head_of<C, H>(ch, lane)] = m[ch] + logf(l[ch]); }
    }
    if (lane == 0) { rstd[t] = rs; }
    if (a != nullptr) {   // scores -> weights; __syncwarp orders this warp's global writes
        __syncwarp();
        for (int x = lane; x < H * n; x += 32) {
            float *ax = a + (size_t)t * H * n + x;
            *ax = expf(*ax - lse[(size_t)t * H + x / n]);
        }
    }
}

// ----------------------------------------------------------------------------
// v13: grouped forward (issue 5, "two-phase forward"). Groups come from
// route_fwd_plan (kernels/route_forward.cuh): site j leads a group of 1 + KX sites j .. j+KX,
// whose source lists start with site j's n sources (slots written before site
// j). While it reads those sources, site j's kernel also runs the online
// softmax of each extra site j+x (x = 1..KX, its own qg) and stores it as a
// partial: hbar = acc / l (N, C) fp32 and lse_p = m + log l (N, H) fp32.
// Site j+x's kernel then starts from its partial (running max lse_p, sum 1,
// mix hbar) and reads only its sources from index n_j on. Same math, other
// summation order; the partials add no bf16 rounding.

// With extra sites (KX > 0) the qg of all KX + 1 sites live in shared memory,
// after the ring, not in registers: float4 [KX+1][NCH][2][32] (lane l's
// channels ch*256 + 8l .. +4, then +4 .. +8: a warp's 16-byte loads cover 512
// consecutive bytes, no bank conflict).
template <int C, int KX> constexpr size_t fwd13_smem() {
    return ring_smem<C>() + (KX > 0 ? (size_t)(KX + 1) * C * sizeof(float) : 0);
}
template <int C> __device__ __forceinline__ float4 *fwd13_qgx() {   // (at ring_smem<C>())
    return reinterpret_cast<float4 *>(ring_smem_raw + (size_t)8 * ROUTE_RING * ((C / 256) * 32 * sizeof(uint4) + sizeof(float)));
}

// Site forward as v8's (route_fwd_v2_kernel<C, H, true>), plus:
//   KX > 0: the extra sites' softmax over this site's n sources, from their q,
//     gamma, which follow this site's in q, gm ((KX+1, C)); partials out:
//     ph (KX, N, C), pl (KX, N, H).
//   inh != NULL: this site starts from a partial inh (N, C), inl (N, H); src,
//     n are then its sources after the leader's.
// a is not written (check_config recomputes it from lse: route_a_kernel).
template <int C, int H, int KX>
__global__ void __launch_bounds__(256, KX == 0 ? (C <= 512 ? 3 : 1) : (C <= 512 ? 2 : 1))
route_fwd_v13_kernel(bf16 *hout, bf16 *uout, float *rstd, float *lse, const bf16 *__restrict__ slots,
                     const float *__restrict__ r, const int *__restrict__ src, int n, const float *__restrict__ q,
                     const float *__restrict__ gm, const float *__restrict__ g, float *ph, float *pl, const float *__restrict__ inh,
                     const float *__restrict__ inl, int N) {
    constexpr int NCH = Geo<C, H>::NCH;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if constexpr (KX > 0) {   // every thread of the block, before any returns
        float4 *qs = fwd13_qgx<C>();
        for (int i = threadIdx.x; i < (KX + 1) * C / 4; i += blockDim.x) {
            const int x = i / (C / 4), c = (i % (C / 4)) * 4;   // channel c of site x (0: this one)
            const float4 a = *reinterpret_cast<const float4 *>(q + x * C + c);
            const float4 b = *reinterpret_cast<const float4 *>(gm + x * C + c);
            qs[((x * NCH + c / 256) * 2 + (c % 8) / 4) * 32 + (c % 256) / 8] =
                make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
        }
        __syncthreads();
    }
    if (t >= N) { return; }
    float qg[NCH][8], acc[NCH][8], m[NCH], l[NCH];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 256 + lane * 8;
        if constexpr (KX == 0) {
            float qa[8], ga[8];
            ld_f8(q + c0, qa);
            ld_f8(gm + c0, ga);
#pragma unroll
            for (int k = 0; k < 8; k++) { qg[ch][k] = qa[k] * ga[k]; }
        }
        if (inh != nullptr) {   // from the partial: sum 1 at the running max lse_p, mix hbar
            ld_f8(inh + (size_t)t * C + c0, acc[ch]);
            m[ch] = inl[(size_t)t * H + head_of<C, H>(ch, lane)]; l[ch] = 1.0f;
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) { acc[ch][k] = 0.0f; }
            m[ch] = -INFINITY; l[ch] = 0.0f;
        }
    }
    float xacc[KX > 0 ? KX : 1][NCH][8], xm[KX > 0 ? KX : 1][NCH], xl[KX > 0 ? KX : 1][NCH];   // the extra sites'
#pragma unroll
    for (int x = 0; x < KX; x++) {
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
            for (int k = 0; k < 8; k++) { xacc[x][ch][k] = 0.0f; }
            xm[x][ch] = -INFINITY; xl[x][ch] = 0.0f;
        }
    }
    for (int i = 0; i < ROUTE_RING - 1; i++) { fwd_ring_issue<C>(i, n, src, slots, r, N, t, lane); }
    for (int i = 0; i < n; i++) {
        uint4 cur[NCH];
        float e[NCH], ri;
        cp_async_wait<ROUTE_RING - 2>();
        __syncwarp();
        const int st = i & (ROUTE_RING - 1);
        const uint4 *ring = ring_packs<C>();
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { cur[ch] = ring[(st * NCH + ch) * 32 + lane]; }
        ri = ring_floats<C>()[st];
        fwd_ring_issue<C>(i + ROUTE_RING - 1, n, src, slots, r, N, t, lane);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float v[8], d = 0.0f;
            unpack8(cur[ch], v);
            if constexpr (KX > 0) {
                const float4 a = fwd13_qgx<C>()[ch * 64 + lane], b = fwd13_qgx<C>()[ch * 64 + 32 + lane];
                d = a.x * v[0] + a.y * v[1] + a.z * v[2] + a.w * v[3] + b.x * v[4] + b.y * v[5] + b.z * v[6] + b.w * v[7];
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++) { d += qg[ch][k] * v[k]; }
            }
            e[ch] = d;
        }
        head_sum<C, H>(e);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float s = ri * e[ch], mn = fmaxf(m[ch], s), v[8];
            float sc = expf(m[ch] - mn), p = expf(s - mn);
            l[ch] = l[ch] * sc + p;
            unpack8(cur[ch], v);
#pragma unroll
            for (int k = 0; k < 8; k++) { acc[ch][k] = acc[ch][k] * sc + p * v[k]; }
            m[ch] = mn;
        }
#pragma unroll
        for (int x = 0; x < KX; x++) {   // the same update for each extra site, its qg from shared memory
            const float4 *qs = fwd13_qgx<C>() + (x + 1) * NCH * 64 + lane;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const float4 a = qs[ch * 64], b = qs[ch * 64 + 32];
                float v[8];
                unpack8(cur[ch], v);
                e[ch] = a.x * v[0] + a.y * v[1] + a.z * v[2] + a.w * v[3] + b.x * v[4] + b.y * v[5] + b.z * v[6] +
                        b.w * v[7];
            }
            head_sum<C, H>(e);
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                float s = ri * e[ch], mn = fmaxf(xm[x][ch], s), v[8];
                float sc = expf(xm[x][ch] - mn), p = expf(s - mn);
                xl[x][ch] = xl[x][ch] * sc + p;
                unpack8(cur[ch], v);
#pragma unroll
                for (int k = 0; k < 8; k++) { xacc[x][ch][k] = xacc[x][ch][k] * sc + p * v[k]; }
                xm[x][ch] = mn;
            }
        }
    }
    // the extra sites' partials: hbar = acc / l, lse_p = m + log l
#pragma unroll
    for (int x = 0; x < KX; x++) {
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int c0 = ch * 256 + lane * 8;
            const float inv = 1.0f / xl[x][ch];
#pragma unroll
            for (int k = 0; k < 8; k++) { xacc[x][ch][k] *= inv; }
            st_f8(ph + ((size_t)x * N + t) * C + c0, xacc[x][ch]);
            if (head_first<C, H>(ch, lane)) {
                pl[((size_t)x * N + t) * H + head_of<C, H>(ch, lane)] = xm[x][ch] + logf(xl[x][ch]);
            }
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float inv = 1.0f / l[ch];
#pragma unroll
        for (int k = 0; k < 8; k++) { acc[ch][k] *= inv; ss += acc[ch][k] * acc[ch][k]; }
    }
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / C + 1e-6f);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 256 + lane * 8;
        float gw[8], uu[8];
        ld_f8(g + c0, gw);
#pragma unroll
        for (int k = 0; k < 8; k++) { uu[k] = acc[ch][k] * rs * gw[k]; }
        st_bf8(hout + (size_t)t * C + c0, acc[ch]);
        st_bf8(uout + (size_t)t * C + c0, uu);
        if (head_first<C, H>(ch, lane)) { lse[(size_t)t * H + head_of<C, H>(ch, lane)] = m[ch] + logf(l[ch]); }
    }
    if (lane == 0) { rstd[t] = rs; }
}

// ----------------------------------------------------------------------------
// v14: v13's grouped forward with fewer instructions per (site, source row)
// pair. Same interface, plan and partials (hbar fp32, lse_p natural log) as
// route_fwd_v13_kernel; only the loop's arithmetic changes:
//   - base 2: qg2 = qg log2(e) (registers for KX = 0, shared memory else), so
//     s2 = r_i qg2.v is the score in base 2 and a weight is one ex2 (MUFU.EX2,
//     ex2_ftz); lse = (m2 + log2 l) ln 2 at the end.
//   - the (KX + 1) x U head partials of a lane (U = NCH / CPH: a lane's heads per
//     site; chunks of one head summed in the lane first) are reduced together by
//     a transposing butterfly (fwd14_reduce): each round halves the values a lane
//     keeps, so a lane ends up owning SL = P / 2^T of the P (V padded to a power
//     of two) segment sums, and computes the softmax scalars (max, sum, weight)
//     for those only; the weights go back to the segment by one indexed shuffle
//     each (fwd14_bcast).
//   - lazy rescale: a slot's running max m2 is raised only when a score exceeds
//     it by more than FWD14_TAU (base 2; a weight is then at most 2^TAU), decided
//     for the whole warp by one vote; otherwise a row costs one ex2 per owned
//     slot and acc += p v (one FMA a channel). Exact in real arithmetic (the sum
//     l and acc carry the same factor 2^-m2 whatever m2 is).
//   - the row unpacked once for all the group's sites.
#define FWD14_TAU 8.0f
#define FWD14_LOG2E 1.4426950408889634f
#define FWD14_LN2 0.6931471805599453f

// 2^x as one MUFU.EX2 (results below 2^-126 flushed to zero; 2^-inf = +0)
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
constexpr int ilog2c(int x) { return x <= 1 ? 0 : 1 + ilog2c(x / 2); }
constexpr int pow2c(int x) { return x <= 1 ? 1 : 2 * pow2c((x + 1) / 2); }

// v14's value layout. Per site a lane has U head partials (value k = x U + u:
// site x, its u-th head in this lane, chunks u CPH .. u CPH + CPH - 1). V values,
// padded to P (a power of two; padding values are 0). A head segment is SEG = 2^R
// lanes; T = min(R, log2 P) transposing rounds leave SL = P / 2^T slots a lane;
// slot m of a lane holds value m + (lane's segment bits above R - T) << (log2 P - T).
template <int C, int H, int KX> struct Fwd14 {
    static constexpr int NCH = Geo<C, H>::NCH, SEG = Geo<C, H>::SEG, CPH = Geo<C, H>::CPH;
    static constexpr int U = NCH / CPH, V = (KX + 1) * U, P = pow2c(V);
    static constexpr int R = ilog2c(SEG), LP = ilog2c(P), T = R < LP ? R : LP, SL = P >> T;
    // the value slot m of this lane holds (the padding when >= V)
    static __host__ __device__ __forceinline__ int value_of(int m, int lane) {
        return m + (((lane & (SEG - 1)) >> (R - T)) << (LP - T));
    }
};

// y[0..P): this lane's partial of each value -> y[0..SL): the segment's full sum
// of each value this lane owns (Fwd14's layout). Round r pairs value m with
// m + half; the lane whose bit (SEG >> (r+1)) is 0 keeps the lower half.
template <class G> __device__ __forceinline__ void fwd14_reduce(float (&y)[G::P], int lane) {
#pragma unroll
    for (int r = 0; r < G::T; r++) {
        const int half = G::P >> (r + 1), o = G::SEG >> (r + 1);
        const bool hi = (lane & o) != 0;
#pragma unroll
        for (int m = 0; m < half; m++) {
            const float send = hi ? y[m] : y[m + half], keep = hi ? y[m + half] : y[m];
            y[m] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (int o = G::SEG >> (G::T + 1); o > 0; o >>= 1) {   // lanes past the transposed bits: plain butterfly
#pragma unroll
        for (int m = 0; m < G::SL; m++) { y[m] += __shfl_xor_sync(0xffffffffu, y[m], o); }
    }
}
// value k of the segment, from the lane that owns it (slot k mod SL)
template <class G, int K> __device__ __forceinline__ float fwd14_bcast(const float (&z)[G::SL]) {
    if constexpr (G::T == 0) { return z[K]; }
    else { return __shfl_sync(0xffffffffu, z[K & (G::SL - 1)], (K >> (G::LP - G::T)) << (G::R - G::T), G::SEG); }
}
template <class G, int K = 0> __device__ __forceinline__ void fwd14_bcast_all(float (&out)[G::V], const float (&z)[G::SL]) {
    if constexpr (K < G::V) {
        out[K] = fwd14_bcast<G, K>(z);
        fwd14_bcast_all<G, K + 1>(out, z);
    }
}

// Site forward, grouped (v13's contract: shapes, partials, plan): h (N, C) bf16,
// u (N, C) bf16, rstd (N), lse (N, H) of this site; KX > 0: the next KX sites'
// partials ph (KX, N, C) fp32 (hbar = acc / l), pl (KX, N, H) fp32 (m + log l,
// natural log), their q, gamma after this site's in q, gm; inh != NULL: start from
// the partial inh (N, C), inl (N, H), src and n then the sources after the
// leader's. One warp per position, sources through the row ring (v8).
// FRESH (v21): the last source is the site's own new slot (in every plan, site j's
// last source is slot j, which no earlier site reads): its r is not read but
// computed from the row in the ring, in source_stat_kernel's order (the same
// bits), and stored into rnew (N), so that no pass of its own computes it.
template <int C, int H, int KX, bool FRESH = false>
__global__ void __launch_bounds__(256, KX == 0 ? (C <= 512 ? 3 : 1) : (C <= 512 ? 2 : 1))
route_fwd_v14_kernel(bf16 *hout, bf16 *uout, float *rstd, float *lse, const bf16 *__restrict__ slots,
                     const float *r, const int *__restrict__ src, int n, const float *__restrict__ q,
                     const float *__restrict__ gm, const float *__restrict__ g, float *ph, float *pl, const float *__restrict__ inh,
                     const float *__restrict__ inl, int N, float *rnew = nullptr) {
    typedef Fwd14<C, H, KX> G;
    constexpr int NCH = G::NCH, CPH = G::CPH, U = G::U, V = G::V, P = G::P, SL = G::SL, XS = KX + 1;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if constexpr (KX > 0) {   // qg2 of the KX + 1 sites into shared memory (v13's layout), every thread
        float4 *qs = fwd13_qgx<C>();
        for (int i = threadIdx.x; i < XS * C / 4; i += blockDim.x) {
            const int x = i / (C / 4), c = (i % (C / 4)) * 4;
            const float4 a = *reinterpret_cast<const float4 *>(q + x * C + c);
            const float4 b = *reinterpret_cast<const float4 *>(gm + x * C + c);
            qs[((x * NCH + c / 256) * 2 + (c % 8) / 4) * 32 + (c % 256) / 8] =
                make_float4(a.x * b.x * FWD14_LOG2E, a.y * b.y * FWD14_LOG2E, a.z * b.z * FWD14_LOG2E,
                            a.w * b.w * FWD14_LOG2E);
        }
        __syncthreads();
    }
    if (t >= N) { return; }
    float qg[KX == 0 ? NCH : 1][8];   // KX = 0: qg2 in registers
    float acc[XS][NCH][8];            // site x's unnormalised mix (0: this site)
    float m2[SL], l[SL];              // running max (base 2) and sum of the values this lane owns
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 256 + lane * 8;
        if constexpr (KX == 0) {
            float qa[8], ga[8];
            ld_f8(q + c0, qa);
            ld_f8(gm + c0, ga);
#pragma unroll
            for (int k = 0; k < 8; k++) { qg[ch][k] = qa[k] * ga[k] * FWD14_LOG2E; }
        }
#pragma unroll
        for (int x = 0; x < XS; x++) {
            if (x == 0 && inh != nullptr) { ld_f8(inh + (size_t)t * C + c0, acc[0][ch]); }
            else {
#pragma unroll
                for (int k = 0; k < 8; k++) { acc[x][ch][k] = 0.0f; }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < SL; m++) {   // from the partial: sum 1 at the running max lse_p (site 0 only)
        const int k = G::value_of(m, lane);
        if (inh != nullptr && k < U) {
            m2[m] = inl[(size_t)t * H + head_of<C, H>(k * CPH, lane)] * FWD14_LOG2E; l[m] = 1.0f;
        } else {
            m2[m] = -INFINITY; l[m] = 0.0f;
        }
    }
    const int nr = FRESH ? n - 1 : n;   // the sources whose r is read
    for (int i = 0; i < ROUTE_RING - 1; i++) { fwd_ring_issue<C>(i, n, src, slots, r, N, t, lane, nr); }
    for (int i = 0; i < n; i++) {
        cp_async_wait<ROUTE_RING - 2>();
        __syncwarp();
        const int st = i & (ROUTE_RING - 1);
        float v[NCH][8];   // source i, unpacked once for every site
        {
            const uint4 *ring = ring_packs<C>();
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { unpack8(ring[(st * NCH + ch) * 32 + lane], v[ch]); }
        }
        float ri;
        if (!FRESH || i < nr) { ri = ring_floats<C>()[st]; }
        else {   // v21: r of the new slot, 1 / sqrt(|v|^2 / C + 1e-6), summed as source_stat_kernel
            float ss = 0.0f;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
                for (int k = 0; k < 8; k++) { ss = fmaf(v[ch][k], v[ch][k], ss); }
            }
            ss = warp_sum(ss);
            ri = 1.0f / sqrtf(ss / C + 1e-6f);
            if (lane == 0) { rnew[t] = ri; }
        }
        fwd_ring_issue<C>(i + ROUTE_RING - 1, n, src, slots, r, N, t, lane, nr);
        float y[P];   // per value, this lane's part of qg2.v
#pragma unroll
        for (int k = 0; k < P; k++) { y[k] = 0.0f; }
#pragma unroll
        for (int x = 0; x < XS; x++) {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                float d;
                if constexpr (KX == 0) {
                    d = qg[ch][0] * v[ch][0];
#pragma unroll
                    for (int k = 1; k < 8; k++) { d = fmaf(qg[ch][k], v[ch][k], d); }
                } else {
                    const float4 *qs = fwd13_qgx<C>() + (x * NCH + ch) * 64 + lane;
                    const float4 a = qs[0], b = qs[32];
                    d = a.x * v[ch][0];
                    d = fmaf(a.y, v[ch][1], d); d = fmaf(a.z, v[ch][2], d); d = fmaf(a.w, v[ch][3], d);
                    d = fmaf(b.x, v[ch][4], d); d = fmaf(b.y, v[ch][5], d); d = fmaf(b.z, v[ch][6], d);
                    d = fmaf(b.w, v[ch][7], d);
                }
                y[x * U + ch / CPH] += d;
            }
        }
        fwd14_reduce<G>(y, lane);
        float s2[SL];
        bool up = false;
#pragma unroll
        for (int m = 0; m < SL; m++) { s2[m] = ri * y[m]; up |= s2[m] > m2[m] + FWD14_TAU; }
        if (__any_sync(0xffffffffu, up)) {   // raise the max of every owned value (rare after the first rows)
            float sc[SL], scv[V];
#pragma unroll
            for (int m = 0; m < SL; m++) {
                const float mn = fmaxf(m2[m], s2[m]);
                sc[m] = ex2_ftz(m2[m] - mn);   // m2 = -inf: 0
                l[m] *= sc[m];
                m2[m] = mn;
            }
            fwd14_bcast_all<G>(scv, sc);
#pragma unroll
            for (int x = 0; x < XS; x++) {
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
                    for (int k = 0; k < 8; k++) { acc[x][ch][k] *= scv[x * U + ch / CPH]; }
                }
            }
        }
        float p[SL], pv[V];
#pragma unroll
        for (int m = 0; m < SL; m++) { p[m] = ex2_ftz(s2[m] - m2[m]); l[m] += p[m]; }
        fwd14_bcast_all<G>(pv, p);
#pragma unroll
        for (int x = 0; x < XS; x++) {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
                for (int k = 0; k < 8; k++) { acc[x][ch][k] = fmaf(pv[x * U + ch / CPH], v[ch][k], acc[x][ch][k]); }
            }
        }
    }
    // lse of each owned value (natural log), by the lane of its segment with the untransposed bits 0;
    // 1 / l to every lane
    float inv[SL], invv[V];
#pragma unroll
    for (int m = 0; m < SL; m++) {
        inv[m] = 1.0f / l[m];
        const int k = G::value_of(m, lane);
        if (k < V && (lane & ((1 << (G::R - G::T)) - 1)) == 0) {
            const int x = k / U, hd = head_of<C, H>((k % U) * CPH, lane);
            const float ls = (m2[m] + log2f(l[m])) * FWD14_LN2;
            if (x == 0) { lse[(size_t)t * H + hd] = ls; }
            else { pl[((size_t)(x - 1) * N + t) * H + hd] = ls; }
        }
    }
    fwd14_bcast_all<G>(invv, inv);
#pragma unroll
    for (int x = 1; x < XS; x++) {   // the extra sites' partials hbar = acc / l
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
            for (int k = 0; k < 8; k++) { acc[x][ch][k] *= invv[x * U + ch / CPH]; }
            st_f8(ph + ((size_t)(x - 1) * N + t) * C + ch * 256 + lane * 8, acc[x][ch]);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
        for (int k = 0; k < 8; k++) { acc[0][ch][k] *= invv[ch / CPH]; ss += acc[0][ch][k] * acc[0][ch][k]; }
    }
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / C + 1e-6f);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 256 + lane * 8;
        float gw[8], uu[8];
        ld_f8(g + c0, gw);
#pragma unroll
        for (int k = 0; k < 8; k++) { uu[k] = acc[0][ch][k] * rs * gw[k]; }
        st_bf8(hout + (size_t)t * C + c0, acc[0][ch]);
        st_bf8(uout + (size_t)t * C + c0, uu);
    }
    if (lane == 0) { rstd[t] = rs; }
}

// The weights a (N, H, n) of one site from its sources and stored lse (N, H), as
// the backward recomputes them: a = exp(r_i qg.v_i[h] - lse[h]). One thread per
// (position, head); for --check of versions whose forward does not write a (v13).
__global__ void route_a_kernel(float *a, const float *lse, const bf16 *slots, const float *r, const int *src, int n,
                               const float *q, const float *gm, int N, int C, int H) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= N * H) { return; }
    const int t = x / H, hh = x % H, HC = C / H;
    for (int i = 0; i < n; i++) {
        const size_t row = (size_t)src[i] * N + t;
        float e = 0.0f;
        for (int c = hh * HC; c < (hh + 1) * HC; c++) { e += q[c] * gm[c] * __bfloat162float(slots[row * C + c]); }
        a[(size_t)x * n + i] = expf(r[row] * e - lse[x]);
    }
}

// Sum each warp's acc (its positions) into out[c] (C) in warp order: shared red (8, C).
template <int C>
__device__ __forceinline__ void block_sum_store(float (&acc)[C / 256][8], float (*red)[C], float *out) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int ch = 0; ch < C / 256; ch++) { st_f8(&red[w][ch * 256 + lane * 8], acc[ch]); }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) { s += red[k][c]; }
        out[c] = s;
    }
    __syncthreads();
}

// Norm backward of site j for one position, in registers: G = dL/dh (fp32),
// hv = h (as stored), S[ch] = G[h].h[h] of this lane's heads; adds dU * xhat to accg.
template <int C, int H>
__device__ __forceinline__ void norm_bwd_regs(float (&G)[C / 256][8], float (&S)[C / 256], float (&accg)[C / 256][8],
                                              const float *dU, const bf16 *h, float rs, const float (&gw)[C / 256][8], int lane,
                                              bool h_shared = false) {
    constexpr int NCH = C / 256;
    float du[NCH][8], xh[NCH][8], md = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float hv[8];
        ld_f8(dU + ch * 256 + lane * 8, du[ch]);
        const bf16 *hp = h + ch * 256 + lane * 8;   // v18, v19: a row staged in shared memory (no __ldg)
        unpack8(h_shared ? *reinterpret_cast<const uint4 *>(hp) : ld_raw(hp), hv);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            xh[ch][k] = hv[k] * rs;
            md += gw[ch][k] * du[ch][k] * xh[ch][k];
            accg[ch][k] += du[ch][k] * xh[ch][k];
        }
    }
    md = warp_sum(md) / C;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float d = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            G[ch][k] = rs * (gw[ch][k] * du[ch][k] - xh[ch][k] * md);
            d += G[ch][k] * xh[ch][k];
        }
        S[ch] = d / rs;   // G . h = G . xhat / rstd
    }
    head_sum<C, H>(S);
}

// One site backward, fused (v2): norm backward, then ONE pass over the site's
// n sources: p = G.v_i and e = (q gamma).v_i per head, a = exp(r_i e - lse)
// recomputed, ds = a (p - S) with S = G.h, then dslots[src_i] += r ds q gamma
// - (r^3/C)(u.v) v + a G (fp32 read-modify-write) and the dq/dgamma sum
// ds r v in registers. Block = 8 warps x 4 positions (POS_PER_BLOCK); writes
// per-block partials part_qv, part_dg (nblk, C).
template <int C, int H>
__global__ void __launch_bounds__(256, C <= 512 ? 2 : 1) route_bwd_v2_kernel(float *dslots, float *part_qv, float *part_dg,
                                                            const float *__restrict__ dU, const bf16 *__restrict__ hbuf,
                                                            const float *__restrict__ rstd, const float *__restrict__ lse,
                                                            const bf16 *__restrict__ slots, const float *__restrict__ r,
                                                            const int *__restrict__ src, int n, const float *__restrict__ q,
                                                            const float *__restrict__ gm, const float *__restrict__ g, int N) {
    constexpr int NCH = Geo<C, H>::NCH;
    __shared__ __align__(16) float red[8][C];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float qg[NCH][8], gw[NCH][8], accq[NCH][8], accg[NCH][8];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float qa[8], ga[8];
        ld_f8(q + ch * 256 + lane * 8, qa);
        ld_f8(gm + ch * 256 + lane * 8, ga);
        ld_f8(g + ch * 256 + lane * 8, gw[ch]);
#pragma unroll
        for (int k = 0; k < 8; k++) { qg[ch][k] = qa[k] * ga[k]; accq[ch][k] = 0.0f; accg[ch][k] = 0.0f; }
    }
    for (int pp = 0; pp < POS_PER_BLOCK / 8; pp++) {
        const int t = blockIdx.x * POS_PER_BLOCK + pp * 8 + w;
        if (t >= N) { continue; }
        float G[NCH][8], S[NCH], ls[NCH];
        norm_bwd_regs<C, H>(G, S, accg, dU + (size_t)t * C, hbuf + (size_t)t * C, rstd[t], gw, lane);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { ls[ch] = lse[(size_t)t * H + head_of<C, H>(ch, lane)]; }
        uint4 nxt[NCH];
        float rn;
        {
            size_t row = (size_t)__ldg(src) * N + t;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_raw(slots + row * C + ch * 256 + lane * 8); }
            rn = __ldg(r + row);
        }
        for (int i = 0; i < n; i++) {
            float v[NCH][8], p[NCH], e[NCH], ep[NCH];
            const float ri = rn;
            const size_t row = (size_t)__ldg(src + i) * N + t;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { unpack8(nxt[ch], v[ch]); }
            if (i + 1 < n) {
                size_t rown = (size_t)__ldg(src + i + 1) * N + t;
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_raw(slots + rown * C + ch * 256 + lane * 8); }
                rn = __ldg(r + rown);
            }
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                float pd = 0.0f, ed = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) { pd += G[ch][k] * v[ch][k]; ed += qg[ch][k] * v[ch][k]; }
                p[ch] = pd; e[ch] = ed; ep[ch] = ed;
            }
            head_sum<C, H>(p);
            head_sum<C, H>(e);
            float ds[NCH], av[NCH], uv = 0.0f;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                av[ch] = expf(ri * e[ch] - ls[ch]);
                ds[ch] = av[ch] * (p[ch] - S[ch]);
                uv += ds[ch] * ep[ch];   // u_i . v_i = sum_h ds[h] e[h], from the lanes' partials
            }
            uv = warp_sum(uv);
            const float k3 = ri * ri * ri / C * uv;
            float *dv = dslots + row * C;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                float old[8];
                ld_f8(dv + ch * 256 + lane * 8, old);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    old[k] += ri * ds[ch] * qg[ch][k] - k3 * v[ch][k] + av[ch] * G[ch][k];
                    accq[ch][k] += ds[ch] * ri * v[ch][k];
                }
                st_f8(dv + ch * 256 + lane * 8, old);
            }
        }
    }
    block_sum_store<C>(accq, red, part_qv + (size_t)blockIdx.x * C);
    block_sum_store<C>(accg, red, part_dg + (size_t)blockIdx.x * C);
}

// ----------------------------------------------------------------------------
// v3: per-site norm backward + per-slot gather

// Site j (v3): norm backward only. Gout (N, C) bf16 = G_j, Sout (N, H) =
// G_j[h].h_j[h] (= sum_i a p, what ds needs), part_dg (nblk, C). Block = 8
// warps x 4 positions.
// HL (v22): G stored in hl order (hl_pack), for the head-lane gather.
template <int C, int H, bool HL = false>
__global__ void __launch_bounds__(256, C <= 512 ? 3 : 1) route_site_v3_kernel(bf16 *Gout, float *Sout, float *part_dg,
                                                             const float *__restrict__ dU, const bf16 *__restrict__ hbuf,
                                                             const float *__restrict__ rstd, const float *__restrict__ g, int N) {
    constexpr int NCH = Geo<C, H>::NCH;
    __shared__ __align__(16) float red[8][C];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float gw[NCH][8], accg[NCH][8];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        ld_f8(g + ch * 256 + lane * 8, gw[ch]);
#pragma unroll
        for (int k = 0; k < 8; k++) { accg[ch][k] = 0.0f; }
    }
    for (int pp = 0; pp < POS_PER_BLOCK / 8; pp++) {
        const int t = blockIdx.x * POS_PER_BLOCK + pp * 8 + w;
        if (t >= N) { continue; }
        float G[NCH][8], S[NCH];
        norm_bwd_regs<C, H>(G, S, accg, dU + (size_t)t * C, hbuf + (size_t)t * C, rstd[t], gw, lane);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            st_bf8(Gout + (size_t)t * C + (HL ? hl_pack(ch * 32 + lane, NCH) * 8 : ch * 256 + lane * 8), G[ch]);
            if (head_first<C, H>(ch, lane)) { Sout[(size_t)t * H + head_of<C, H>(ch, lane)] = S[ch]; }
        }
    }
    block_sum_store<C>(accg, red, part_dg + (size_t)blockIdx.x * C);
}

// Site j (v18, v19): v3's site kernel with each warp's rows of dU and h staged in shared memory
// by cp.async, SLOTS positions at a time (a ring: position pp + SLOTS - 1 is copied while pp is
// computed). v18: SLOTS = 2, one position ahead, 3 blocks an SM as v3; v19: SLOTS = 4, all four of
// a warp's positions copied at its start, 2 blocks an SM (96 KiB of stages a block at C = 512).
// A lane reads back only the channels it copied, so cp.async.wait_group alone orders the two.
// The same arithmetic as v3 (norm_bwd_regs): the same bits.
template <int C> __host__ __device__ constexpr size_t site_stage_bytes() { return (size_t)C * (sizeof(float) + sizeof(bf16)); }
template <int C, int H, int SLOTS>
__global__ void __launch_bounds__(256, SLOTS == 4 ? 2 : (C <= 512 ? 3 : 1))
route_site_v18_kernel(bf16 *Gout, float *Sout, float *part_dg, const float *__restrict__ dU,
                      const bf16 *__restrict__ hbuf, const float *__restrict__ rstd, const float *__restrict__ g, int N) {
    constexpr int NCH = Geo<C, H>::NCH, PP = POS_PER_BLOCK / 8;
    constexpr size_t ROW = site_stage_bytes<C>();   // a position's dU (C fp32), then its h (C bf16)
    extern __shared__ __align__(16) unsigned char site_stages[];
    __shared__ __align__(16) float red[8][C];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned char *mine = site_stages + (size_t)w * SLOTS * ROW;
    auto issue = [&](int pp) {   // position pp of this warp into its slot (an empty group past the last)
        const int t = blockIdx.x * POS_PER_BLOCK + pp * 8 + w;
        if (pp < PP && t < N) {
            float *sd = reinterpret_cast<float *>(mine + (pp % SLOTS) * ROW);
            bf16 *sh = reinterpret_cast<bf16 *>(mine + (pp % SLOTS) * ROW + C * sizeof(float));
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const int c0 = ch * 256 + lane * 8;
                cp_async16(sd + c0, dU + (size_t)t * C + c0);
                cp_async16(sd + c0 + 4, dU + (size_t)t * C + c0 + 4);
                cp_async16(sh + c0, hbuf + (size_t)t * C + c0);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int pp = 0; pp < SLOTS - 1; pp++) { issue(pp); }
    float gw[NCH][8], accg[NCH][8];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        ld_f8(g + ch * 256 + lane * 8, gw[ch]);
#pragma unroll
        for (int k = 0; k < 8; k++) { accg[ch][k] = 0.0f; }
    }
    for (int pp = 0; pp < PP; pp++) {
        issue(pp + SLOTS - 1);   // into the slot of position pp - 1, done
        cp_async_wait<SLOTS - 1>();   // position pp's group is complete
        const int t = blockIdx.x * POS_PER_BLOCK + pp * 8 + w;
        if (t >= N) { continue; }
        const unsigned char *st = mine + (pp % SLOTS) * ROW;
        float G[NCH][8], S[NCH];
        norm_bwd_regs<C, H>(G, S, accg, reinterpret_cast<const float *>(st),
                            reinterpret_cast<const bf16 *>(st + C * sizeof(float)), rstd[t], gw, lane, true);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            st_bf8(Gout + (size_t)t * C + ch * 256 + lane * 8, G[ch]);
            if (head_first<C, H>(ch, lane)) { Sout[(size_t)t * H + head_of<C, H>(ch, lane)] = S[ch]; }
        }
    }
    cp_async_wait<0>();
    block_sum_store<C>(accg, red, part_dg + (size_t)blockIdx.x * C);
}

// Gather for slot k (v3, issue 5 idea (b)): dslot_k (N, C) fp32 written ONCE,
//   dv = sum over the nr sites j reading k of  r ds_j qg_j - (r^3/C)(u_j.v) v + a_j G_j,
// with p = G_j.v, e = qg_j.v, a = exp(r e - lse_j), ds = a (p - S_j) all
// recomputed here from v_k, G_j (bf16), lse_j, S_j; qg_j = q_j * gamma_j. The
// k3 terms share one warp reduction: sum_j u_j.v is accumulated per lane first.
// Also writes dsr (N, nr, H) = ds r for the dq/dgamma pass. One warp per
// position; v_k and G_j stay packed bf16 in registers (unpacked on use, to
// keep registers for occupancy); the next site's G is loaded before the
// current one is used. Gall (J, N, C), Sall and lseall (J, N, H), qg (J, C).
template <int C, int H>
__global__ void __launch_bounds__(256, C <= 512 ? 3 : 1) route_gather_v3_kernel(float *dslot, float *dsr, const bf16 *__restrict__ v,
                                                               const float *__restrict__ rk, const bf16 *__restrict__ Gall,
                                                               const float *__restrict__ Sall, const float *__restrict__ lseall,
                                                               const int *__restrict__ readers, int nr,
                                                               const float *__restrict__ qg, int N) {
    constexpr int NCH = Geo<C, H>::NCH;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= N) { return; }
    uint4 vraw[NCH], nxt[NCH];
    float dv[NCH][8];
    const float r = rk[t];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        vraw[ch] = ld_raw(v + (size_t)t * C + ch * 256 + lane * 8);
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] = 0.0f; }
    }
    float T = 0.0f;   // this lane's share of sum_j u_j . v
    {
        size_t row = (size_t)__ldg(readers) * N + t;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_raw(Gall + row * C + ch * 256 + lane * 8); }
    }
    for (int jj = 0; jj < nr; jj++) {
        const int j = __ldg(readers + jj);
        const size_t row = (size_t)j * N + t;
        uint4 Graw[NCH];
        float p[NCH], e[NCH], ep[NCH];
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { Graw[ch] = nxt[ch]; }
        if (jj + 1 < nr) {
            size_t rown = (size_t)__ldg(readers + jj + 1) * N + t;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_raw(Gall + rown * C + ch * 256 + lane * 8); }
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float G[8], vv[8], qv[8], pd = 0.0f, ed = 0.0f;
            unpack8(Graw[ch], G);
            unpack8(vraw[ch], vv);
            ld_f8(qg + (size_t)j * C + ch * 256 + lane * 8, qv);
#pragma unroll
            for (int k = 0; k < 8; k++) { pd += G[k] * vv[k]; ed += qv[k] * vv[k]; }
            p[ch] = pd; e[ch] = ed; ep[ch] = ed;
        }
        head_sum<C, H>(p);
        head_sum<C, H>(e);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int hd = head_of<C, H>(ch, lane);
            const float av = expf(r * e[ch] - __ldg(lseall + row * H + hd));
            const float ds = av * (p[ch] - __ldg(Sall + row * H + hd));
            float G[8], qv[8];
            unpack8(Graw[ch], G);
            ld_f8(qg + (size_t)j * C + ch * 256 + lane * 8, qv);   // L1 hit: every warp reads the same qg_j
            T += ds * ep[ch];
#pragma unroll
            for (int k = 0; k < 8; k++) { dv[ch][k] += r * ds * qv[k] + av * G[k]; }
            if (head_first<C, H>(ch, lane)) { dsr[((size_t)t * nr + jj) * H + hd] = ds * r; }
        }
    }
    const float k3 = r * r * r / C * warp_sum(T);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float vv[8];
        unpack8(vraw[ch], vv);
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] -= k3 * vv[k]; }
        st_f8(dslot + (size_t)t * C + ch * 256 + lane * 8, dv[ch]);
    }
}

// qg (n) = q * gamma, elementwise (v3: once per backward for all sites)
__global__ void mul_kernel(float *qg, const float *q, const float *gm, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { qg[i] = q[i] * gm[i]; }
}

// dq/dgamma pass of the gather for slot k: part (P, nr, C) = partition p's
// sum over its PART_ROWS positions of dsr[t, jj, h(c)] * v_k[t][c], for each
// reading site jj. Block (32 channels) x (8 position lanes); the partition's
// rows of v_k are re-read per site from L1.
__global__ void route_gather_param_kernel(float *part, const float *dsr, const bf16 *v, int nr, int N, int C, int H) {
    __shared__ float acc[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, p = blockIdx.y, HC = C / H;
    int t0 = p * PART_ROWS, t1 = min(t0 + PART_ROWS, N);
    for (int jj = 0; jj < nr; jj++) {
        float s = 0.0f;
        if (c < C) {
            for (int t = t0 + threadIdx.y; t < t1; t += 8) {
                s += dsr[((size_t)t * nr + jj) * H + c / HC] * __bfloat162float(v[(size_t)t * C + c]);
            }
        }
        acc[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && c < C) {
            float sum = 0.0f;
            for (int y = 0; y < 8; y++) { sum += acc[y][threadIdx.x]; }
            part[((size_t)p * nr + jj) * C + c] = sum;
        }
        __syncthreads();
    }
}

// qvacc[(k, readers[jj])] (C) = sum over partitions of part (P, nr, C), in order.
__global__ void route_gather_reduce_kernel(float *qvacc, const float *part, const int *readers, int nr, int P, int k,
                                           int J, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, jj = blockIdx.y;
    if (c >= C) { return; }
    float s = 0.0f;
    for (int p = 0; p < P; p++) { s += part[((size_t)p * nr + jj) * C + c]; }
    qvacc[((size_t)k * J + readers[jj]) * C + c] = s;
}

// dq_j = gamma_j * sum over site j's sources k (in order) of qvacc[(k, j)]; dgamma_j the same with q_j.
__global__ void route_dq_final_kernel(float *dq, float *dgamma, const float *qvacc, const int *src, const int *nsrc,
                                      const float *q, const float *gm, int J, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y;
    if (c >= C) { return; }
    float s = 0.0f;
    for (int i = 0; i < nsrc[j]; i++) { s += qvacc[((size_t)src[j * J + i] * J + j) * C + c]; }
    dq[(size_t)j * C + c] = gm[(size_t)j * C + c] * s;
    dgamma[(size_t)j * C + c] = q[(size_t)j * C + c] * s;
}

// ----------------------------------------------------------------------------
// v4 and v5: the trainer's slot gather and q/gamma pass (train_mhar.cu), bf16 only.
// v4 = the trainer at commit 3346376: v3's gather (the u.v sum at each head's
//      first lane), the q/gamma pass with readers in groups of 8 held in
//      registers (partitions of 128 positions, 8 position lanes reduced through
//      shared memory), and the 32-lane fixed-order reduction of the partials.
// v5 = branch rbwd2: the gather also prefetches the next reader's lse and S with
//      its G (they waited a full memory latency per reader), writes a bf16
//      copy of dslot (the input of the next sublayer's
//      matmul backwards: the trainer drops its cast); the q/gamma pass stages
//      tiles of v and dsr in shared memory with coalesced loads and keeps all
//      readers of a thread's two channels in registers (no in-block reduction).

#define PART_ROWS45 128   // positions per partition of the v4/v5 q/gamma pass

// Prefetch into L1 the n floats at a (a row of lse or of S): lane l takes the
// l-th 128-byte line the row touches (no register held, unlike a load)
__device__ __forceinline__ void prefetch_row_l1(const float *a, int n, int lane) {
    const uintptr_t first = (uintptr_t)a & ~(uintptr_t)127, last = (uintptr_t)(a + n - 1) & ~(uintptr_t)127;
    if ((uintptr_t)lane <= ((last - first) >> 7)) {
        const uintptr_t p = lane == 0 ? (uintptr_t)a : first + ((uintptr_t)lane << 7);
        asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
    }
}

// v11's dsr layout (N, H, nrp), nrp = nr rounded up to 4: the index of reader
// jj's ds r for head hd at position t. A position's H nrp entries are contiguous,
// so the q/gamma pass stages a tile of positions as one range of 16-byte chunks.
__host__ __device__ __forceinline__ size_t dsr_th_at(size_t t, int hd, int jj, int H, int nrp) {
    return (t * H + hd) * nrp + jj;
}

// The gather's ring (v8): reader jj's G row (site readers[jj], position t) into
// stage jj % ROUTE_RING, its lse and S rows into L1; one commit group, empty when jj >= nr
template <int C>
__device__ __forceinline__ void gather_ring_issue(int jj, int nr, const int *readers, const bf16 *Gall,
                                                  const float *Sall, const float *lseall, int N, int H, int t, int lane) {
    if (jj < nr) {
        const size_t row = (size_t)__ldg(readers + jj) * N + t;
        ring_fill<C>(jj & (ROUTE_RING - 1), Gall + row * C, lane);
        prefetch_row_l1(lseall + row * H, H, lane);
        prefetch_row_l1(Sall + row * H, H, lane);
    }
    cp_async_commit();
}

// v4-v6's gather, no ring: reader row `row`'s G into registers (nxt), and its lse
// and S into registers (PF = 2) or into L1 (PF = 1)
template <int C, int H, int PF>
__device__ __forceinline__ void gather_load_ahead(uint4 (&nxt)[C / 256], float (&nlse)[C / 256], float (&nS)[C / 256],
                                                  size_t row, const bf16 *Gall, const float *Sall,
                                                  const float *lseall, int lane) {
#pragma unroll
    for (int ch = 0; ch < C / 256; ch++) {
        nxt[ch] = ld_raw(Gall + row * C + ch * 256 + lane * 8);
        if (PF == 2) {
            nlse[ch] = __ldg(lseall + row * H + head_of<C, H>(ch, lane));
            nS[ch] = __ldg(Sall + row * H + head_of<C, H>(ch, lane));
        }
    }
    if (PF == 1) { prefetch_row_l1(lseall + row * H, H, lane); prefetch_row_l1(Sall + row * H, H, lane); }
}

// Gather for slot k. PF = 0: v4 (v3's, with u.v summed at the head's first
// lane). PF = 1: v5 (the trainer's on rbwd2): the next reader's lse and S rows
// prefetched into L1 with its G; dslotX = bf16 copy of dslot. PF = 2: v6, as
// v5 but lse and S prefetched into registers (more registers, spills).
// RING (v8, with PF = 1): the G rows ROUTE_RING - 1 readers ahead through the
// row ring, each reader's lse and S rows prefetched into L1 when its G row is
// issued; dynamic shared memory ring_smem<C>().
// DSR_TH (v11, with RING): dsr written as (N, H, nrp) (dsr_th_at) for v11's
// q/gamma pass instead of (N, nr, H); the padding readers [nr, nrp) are not written.
template <int C, int H, int PF, bool RING = false, bool DSR_TH = false>
__global__ void __launch_bounds__(256, C <= 512 ? 3 : 1) route_gather_v45_kernel(float *dslot, bf16 *dslotX, float *dsr,
                                                                const bf16 *__restrict__ v, const float *__restrict__ rk,
                                                                const bf16 *__restrict__ Gall, const float *__restrict__ Sall,
                                                                const float *__restrict__ lseall,
                                                                const int *__restrict__ readers, int nr,
                                                                const float *__restrict__ qg, int N) {
    static_assert(!RING || PF == 1, "the ring is v5's gather (PF = 1) with the G rows through shared memory");
    static_assert(!DSR_TH || RING, "v11's dsr layout goes with v8's ring gather");
    constexpr int NCH = Geo<C, H>::NCH;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= N) { return; }
    uint4 vraw[NCH], nxt[NCH];
    float dv[NCH][8], nlse[NCH], nS[NCH];
    const float r = rk[t];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) { nlse[ch] = 0.0f; nS[ch] = 0.0f; }
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        vraw[ch] = ld_raw(v + (size_t)t * C + ch * 256 + lane * 8);
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] = 0.0f; }
    }
    float T = 0.0f;   // this lane's share of sum_j u_j . v
    if constexpr (RING) {   // readers 0 .. ROUTE_RING - 2 in flight
        for (int jj = 0; jj < ROUTE_RING - 1; jj++) { gather_ring_issue<C>(jj, nr, readers, Gall, Sall, lseall, N, H, t, lane); }
    } else {
        gather_load_ahead<C, H, PF>(nxt, nlse, nS, (size_t)__ldg(readers) * N + t, Gall, Sall, lseall, lane);
    }
    for (int jj = 0; jj < nr; jj++) {
        const int j = __ldg(readers + jj);
        const size_t row = (size_t)j * N + t;
        uint4 Graw[NCH];
        float p[NCH], e[NCH], lse[NCH], S[NCH];
        if constexpr (RING) {
            cp_async_wait<ROUTE_RING - 2>();   // reader jj's G row is in (this lane's part of it)
            const uint4 *ring = ring_packs<C>();
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { Graw[ch] = ring[((jj & (ROUTE_RING - 1)) * NCH + ch) * 32 + lane]; }
            // into the stage of reader jj-1
            gather_ring_issue<C>(jj + ROUTE_RING - 1, nr, readers, Gall, Sall, lseall, N, H, t, lane);
        } else {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { Graw[ch] = nxt[ch]; lse[ch] = nlse[ch]; S[ch] = nS[ch]; }
            if (jj + 1 < nr) {
                gather_load_ahead<C, H, PF>(nxt, nlse, nS, (size_t)__ldg(readers + jj + 1) * N + t, Gall, Sall, lseall,
                                            lane);
            }
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float G[8], vv[8], qv[8], pd = 0.0f, ed = 0.0f;
            unpack8(Graw[ch], G);
            unpack8(vraw[ch], vv);
            ld_f8(qg + (size_t)j * C + ch * 256 + lane * 8, qv);
#pragma unroll
            for (int k = 0; k < 8; k++) { pd += G[k] * vv[k]; ed += qv[k] * vv[k]; }
            p[ch] = pd; e[ch] = ed;
        }
        head_sum<C, H>(p);
        head_sum<C, H>(e);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int hd = head_of<C, H>(ch, lane);
            if (PF != 2) { lse[ch] = __ldg(lseall + row * H + hd); S[ch] = __ldg(Sall + row * H + hd); }
            const float av = expf(r * e[ch] - lse[ch]);
            const float ds = av * (p[ch] - S[ch]);
            float G[8], qv[8];
            unpack8(Graw[ch], G);
            ld_f8(qg + (size_t)j * C + ch * 256 + lane * 8, qv);   // L1 hit: every warp reads the same qg_j
#pragma unroll
            for (int k = 0; k < 8; k++) { dv[ch][k] += r * ds * qv[k] + av * G[k]; }
            if (head_first<C, H>(ch, lane)) {
                T += ds * e[ch];
                if constexpr (DSR_TH) { dsr[dsr_th_at(t, hd, jj, H, (nr + 3) & ~3)] = ds * r; }
                else { dsr[((size_t)t * nr + jj) * H + hd] = ds * r; }
            }
        }
    }
    const float k3 = r * r * r / C * warp_sum(T);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float vv[8];
        unpack8(vraw[ch], vv);
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] -= k3 * vv[k]; }
        st_f8(dslot + (size_t)t * C + ch * 256 + lane * 8, dv[ch]);
        if (PF >= 1) { st_bf8(dslotX + (size_t)t * C + ch * 256 + lane * 8, dv[ch]); }
    }
}

// Gather v12: v11's gather (route_gather_v45_kernel<C, H, 1, true, true>: the
// ring, dsr as (N, H, nrp)) with fewer integer and control instructions per
// reader, since the trainer's ring gather is bound by instruction issue (its
// SASS: 329 instructions a reader and warp, 68 of them FFMA; NOTES_route.md,
// "v12"). The math and its order are v11's, statement for statement.
//  - Addresses: 32-bit element indices. The per-lane parts (position t, the
//    lane's channels, its lse/S entry, dsr's row of t) are computed once before
//    the loop; per reader and array only j * (elements of one slot) is added
//    (one IMAD; NC = N C and NH = N H are kernel parameters), and the pointer
//    is the kernel parameter plus the unsigned index (one IMAD.WIDE.U32 with
//    the base from the constant bank: no 64-bit base held in registers). The
//    host checks that every index fits: J N C, J N H and N H nrp < 2^31.
//  - Readers: lane l holds readers[l] (nr <= 32, checked on the host), and a
//    reader's j comes by one shuffle (no dependent global load, no address).
//  - lse and S: copied with the G row into the ring by cp.async (4 bytes each:
//    lane l copies lse[j][t][l % H] and S[j][t][l % H] into its own two slots of
//    the stage; lanes from H copy duplicates, never read) and read back from
//    shared memory after a __syncwarp (other lanes copied them), instead of
//    v11's L1 prefetch and two global loads per chunk.
//  - No branch in the loop but the back-branch: readers past nr are issued
//    anyway, as zero-byte copies (cp.async src-size 0) from a valid address
//    (reader readers[i % 32]'s or slot 0's row), into the stage of the row just
//    consumed, never read; so every iteration commits one group as before, and
//    the kernel waits for all groups after the loop (no copy lands after exit).
// Dynamic shared memory: ring_smem<C>(), then lse/S [8][ROUTE_RING][2][32] floats.
template <int C> __host__ __device__ constexpr size_t ring_smem12() { return ring_smem<C>() + (size_t)8 * ROUTE_RING * 64 * sizeof(float); }
// this warp's lse/S stages (ROUTE_RING, 2, 32), after the ring's packs and floats (ring_smem<C>() bytes)
template <int C> __device__ __forceinline__ float *ring12_ls() {
    return reinterpret_cast<float *>(ring_smem_raw + (size_t)8 * ROUTE_RING * ((size_t)(C / 256) * 32 * sizeof(uint4) + sizeof(float))) +
           (threadIdx.x >> 5) * ROUTE_RING * 64;
}
// cp.async of 16 or 4 bytes, of which src_size are read and the rest zero-filled (src_size 0: none read)
__device__ __forceinline__ void cp_async16z(uint32_t s, const void *gmem, uint32_t src_size) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size) : "memory");
}
__device__ __forceinline__ void cp_async4z(uint32_t s, const void *gmem, uint32_t src_size) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size) : "memory");
}
// v12's index math, shared with --cpu-selftest (which compares it with v11's).
// Per lane, before the loop: its first G / v / dslot channel in position t's row
// of slot 0 (chunk ch: + 256 ch), its lse/S entry in slot 0, its qg channel of
// site 0, and dsr's first entry of position t. Per reader j: + j NC, + j NH, + j C.
__host__ __device__ __forceinline__ unsigned g12_row(unsigned t, int lane, int C) { return t * (unsigned)C + (unsigned)lane * 8; }
__host__ __device__ __forceinline__ unsigned g12_ls(unsigned t, int lane, int H) { return t * (unsigned)H + (unsigned)(lane & (H - 1)); }
__host__ __device__ __forceinline__ unsigned g12_dsr(unsigned t, int H, int nrp) { return t * (unsigned)H * (unsigned)nrp; }
__host__ __device__ __forceinline__ unsigned g12_add(unsigned base, unsigned j, unsigned stride) { return j * stride + base; }
// the ring stage and the readers lane of reader i (i >= nr: a zero-byte copy from lane i % 32's reader)
__host__ __device__ __forceinline__ int g12_stage(int i) { return i & (ROUTE_RING - 1); }
__host__ __device__ __forceinline__ int g12_src_lane(int i) { return i & 31; }
// bf16 -> fp32 by one integer instruction each (exact, as __bfloat1622float2)
__device__ __forceinline__ void unpack8_bits(uint4 raw, float (&x)[8]) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; k++) { x[2 * k] = __uint_as_float(w[k] << 16); x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u); }
}
// an empty asm that "modifies" x: whatever is computed from x after it stays after it (in the loop)
__device__ __forceinline__ void opaque4(uint4 &x) { asm volatile("" : "+r"(x.x), "+r"(x.y), "+r"(x.z), "+r"(x.w)); }
__device__ __forceinline__ void opaque1(unsigned &x) { asm volatile("" : "+r"(x)); }
// reader i's G row (this lane's packs) and lse/S entries into stage i % ROUTE_RING; one commit group
template <int C>
__device__ __forceinline__ void gather12_issue(int i, int nr, int jl, const bf16 *Gall, const float *Sall,
                                               const float *lseall, unsigned gi, unsigned li, unsigned NC, unsigned NH,
                                               uint32_t sg, uint32_t sls) {
    constexpr int NCH = C / 256;
    const unsigned j = (unsigned)__shfl_sync(0xffffffffu, jl, g12_src_lane(i));
    const uint32_t gsz = i < nr ? 16u : 0u, lsz = i < nr ? 4u : 0u;
    const uint32_t st = (uint32_t)g12_stage(i);
    const unsigned g = g12_add(gi, j, NC), l = g12_add(li, j, NH);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        cp_async16z(sg + (st * NCH + ch) * 32 * (uint32_t)sizeof(uint4), Gall + (g + ch * 256), gsz);
    }
    cp_async4z(sls + st * 64 * (uint32_t)sizeof(float), lseall + l, lsz);
    cp_async4z(sls + (st * 64 + 32) * (uint32_t)sizeof(float), Sall + l, lsz);
    cp_async_commit();
}
// v20: reader 0 is the site fused into the gather: only its lse entry is copied (its G packs and
// S entries are written into stage 0 by site20_norm); one commit group, as gather12_issue's
__device__ __forceinline__ void gather20_issue_own(int jl, const float *lseall, unsigned li, unsigned NH, uint32_t sls) {
    const unsigned j = (unsigned)__shfl_sync(0xffffffffu, jl, 0);
    cp_async4z(sls, lseall + g12_add(li, j, NH), 4u);
    cp_async_commit();
}

// v20's site inputs and outputs (SPEC section 4, the norm before sublayer j): u_j = rmsnorm(h_j; g_j)
// with rstd_j, dU = dL/du_j (N, C) fp32; G_j (N, C) bf16 and S_j (N, H) out; part (N/8, C): per
// block of 8 positions, the sum of dU xhat (the norm weight's gradient)
struct SiteIn20 {
    const float *dU; const bf16 *h; const float *rstd; const float *g;
    bf16 *Gout; float *Sout; float *part;
};
// v20: v3's norm backward (norm_bwd_regs' arithmetic, so the same G and S bits) for position t,
// in two passes over dU, h and g (the second from L1) so that nothing is held into the reader
// loop: G packed into this lane's packs of ring stage 0 (gs0) and into Gout, S into stage 0's S
// entries (ls0) and Sout, and dU xhat into this warp's row of red (C floats).
template <int C, int H>
__device__ __forceinline__ void site20_norm(uint4 *gs0, float *ls0, float *redw, const SiteIn20 &s, unsigned t, int lane) {
    constexpr int NCH = C / 256;
    const float rs = s.rstd[t];
    const float *dU = s.dU + (size_t)t * C;
    const bf16 *h = s.h + (size_t)t * C;
    auto load = [&](int c0, float (&du)[8], float (&hv)[8], float (&gw)[8]) {   // each pass's loads
        ld_f8(dU + c0, du);
        unpack8(ld_raw(h + c0), hv);
        ld_f8(s.g + c0, gw);
    };
    float md = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 256 + lane * 8;
        float du[8], hv[8], gw[8], dx[8];
        load(c0, du, hv, gw);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float xh = hv[k] * rs;
            md += gw[k] * du[k] * xh;
            dx[k] = du[k] * xh;
        }
        *reinterpret_cast<float4 *>(redw + c0) = make_float4(dx[0], dx[1], dx[2], dx[3]);
        *reinterpret_cast<float4 *>(redw + c0 + 4) = make_float4(dx[4], dx[5], dx[6], dx[7]);
    }
    md = warp_sum(md) / C;
    float S[NCH];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 256 + lane * 8;
        float du[8], hv[8], gw[8], G[8], d = 0.0f;
        load(c0, du, hv, gw);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float xh = hv[k] * rs;
            G[k] = rs * (gw[k] * du[k] - xh * md);
            d += G[k] * xh;
        }
        S[ch] = d / rs;   // G . h = G . xhat / rstd
        uint4 raw;
        __nv_bfloat162 *b = reinterpret_cast<__nv_bfloat162 *>(&raw);
#pragma unroll
        for (int k = 0; k < 4; k++) { b[k] = __floats2bfloat162_rn(G[2 * k], G[2 * k + 1]); }   // st_bf8's rounding
        *reinterpret_cast<uint4 *>(s.Gout + (size_t)t * C + c0) = raw;
        gs0[ch * 32] = raw;
    }
    head_sum<C, H>(S);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        if (head_first<C, H>(ch, lane)) {
            s.Sout[(size_t)t * H + head_of<C, H>(ch, lane)] = S[ch];
            ls0[32 + head_of<C, H>(ch, lane)] = S[ch];
        }
    }
}

// v23: qgp (J, C) = qg (J, C) with each row in pair order: lane l's channels 8l .. 8l+4 of each
// chunk of 256 at 4l, 8l+4 .. 8l+8 at 128 + 4l, so that a warp's two 16-byte loads of its lanes'
// 8 channels each read 512 contiguous bytes (row order: 16 bytes of every 32, twice the wavefronts)
__host__ __device__ __forceinline__ int pair_index(int c) { return c / 256 * 256 + c % 8 / 4 * 128 + c % 256 / 8 * 4 + c % 4; }
__global__ void qg_pair_kernel(float *qgp, const float *qg, size_t n, int C) {
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    qgp[i / C * C + (size_t)pair_index((int)(i % C))] = qg[i];
}
__device__ __forceinline__ void ld_f8_pairs(const float *p, float (&x)[8]) {   // p: the lane's first (4 l)
    float4 a = *reinterpret_cast<const float4 *>(p), b = *reinterpret_cast<const float4 *>(p + 128);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}

// v12's gather of one position t (v20: FUSE, with site k's norm backward first, reader 0 = site k;
// v23: QP, qg in pair order)
template <int C, int H, bool FUSE, bool QP = false>
__device__ __forceinline__ void gather12_position(int t, float *dslot, bf16 *dslotX, float *dsr,
                                                  const bf16 *__restrict__ v, const float *__restrict__ rk,
                                                  const bf16 *__restrict__ Gall, const float *__restrict__ Sall,
                                                  const float *__restrict__ lseall, const int *__restrict__ readers,
                                                  int nr, const float *__restrict__ qg, unsigned NC, unsigned NH,
                                                  const SiteIn20 &site, float *redw) {
    constexpr int NCH = Geo<C, H>::NCH;
    const int lane = threadIdx.x & 31;
    uint4 vraw[NCH];
    float dv[NCH][8];
    const float r = rk[t];
    const unsigned gi = g12_row((unsigned)t, lane, C);   // also v's and dslot's (slot k's rows are passed)
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        vraw[ch] = ld_raw(v + (gi + ch * 256));
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] = 0.0f; }
    }
    // per lane: the readers (lane l: readers[l]; past nr, slot 0), its lse/S entry, the ring's shared
    // addresses, its qg channels and dsr's entries of position t
    const int jl = lane < nr ? __ldg(readers + lane) : 0;
    const unsigned li = g12_ls((unsigned)t, lane, H), qi = (unsigned)lane * (QP ? 4 : 8);
    const uint32_t sg = (uint32_t)__cvta_generic_to_shared(ring_packs<C>() + lane);
    const uint32_t sls = (uint32_t)__cvta_generic_to_shared(ring12_ls<C>() + lane);
    // this warp's ring, at this lane's packs; its lse/S stages at the entry of the lane's head in chunk 0
    // (chunk ch's head: head_of<C, H>(0, lane) + 256 ch / HC, C / H being a multiple or a divisor of 256)
    constexpr int HC = Geo<C, H>::HC;
    const uint4 *ringl = ring_packs<C>() + lane;
    const float *lsh = ring12_ls<C>() + head_of<C, H>(0, lane);
    const int nrp = (nr + 3) & ~3;
    unsigned dh = g12_dsr((unsigned)t, H, nrp) + (unsigned)(head_of<C, H>(0, lane) * nrp);
    float T = 0.0f;   // this lane's share of sum_j u_j . v
    for (int i = 0; i < ROUTE_RING - 1; i++) {
        if (FUSE && i == 0) { gather20_issue_own(jl, lseall, li, NH, sls); }
        else { gather12_issue<C>(i, nr, jl, Gall, Sall, lseall, gi, li, NC, NH, sg, sls); }
    }
    // v20: site k's G and S into stage 0 (readers 1 and 2 are in flight meanwhile); the loop's first
    // __syncwarp makes the S entries, written by the heads' first lanes, visible to the whole warp
    if constexpr (FUSE) { site20_norm<C, H>(ring_packs<C>() + lane, ring12_ls<C>(), redw, site, (unsigned)t, lane); }
    for (int jj = 0; jj < nr; jj++) {
        uint4 Graw[NCH];
        float p[NCH], e[NCH];
        cp_async_wait<ROUTE_RING - 2>();   // reader jj's G row and this lane's lse/S entries are in
        __syncwarp();                      // and every lane's (this lane reads its heads' entries)
        opaque1(dh);
        const float *ls = lsh + g12_stage(jj) * 64;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            Graw[ch] = ringl[(g12_stage(jj) * NCH + ch) * 32];
            opaque4(vraw[ch]);   // v's unpack stays in the loop: v is held packed (8 registers, not 16)
        }
        // into the stage of reader jj-1
        gather12_issue<C>(jj + ROUTE_RING - 1, nr, jl, Gall, Sall, lseall, gi, li, NC, NH, sg, sls);
        const float *qj = qg + g12_add(qi, (unsigned)__shfl_sync(0xffffffffu, jl, jj), (unsigned)C);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float G[8], vv[8], qv[8], pd = 0.0f, ed = 0.0f;
            unpack8_bits(Graw[ch], G);
            unpack8_bits(vraw[ch], vv);
            if constexpr (QP) { ld_f8_pairs(qj + ch * 256, qv); } else { ld_f8(qj + ch * 256, qv); }
#pragma unroll
            for (int k = 0; k < 8; k++) { pd += G[k] * vv[k]; ed += qv[k] * vv[k]; }
            p[ch] = pd; e[ch] = ed;
        }
        head_sum<C, H>(p);
        head_sum<C, H>(e);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int hoff = ch * 256 / HC;   // chunk ch's head - chunk 0's (this lane)
            const float lse = ls[hoff], S = ls[32 + hoff];
            const float av = expf(r * e[ch] - lse);
            const float ds = av * (p[ch] - S);
            float G[8], qv[8];
            unpack8_bits(Graw[ch], G);
            if constexpr (QP) { ld_f8_pairs(qj + ch * 256, qv); }   // L1 hit: every warp reads the same qg_j
            else { ld_f8(qj + ch * 256, qv); }
#pragma unroll
            for (int k = 0; k < 8; k++) { dv[ch][k] += r * ds * qv[k] + av * G[k]; }
            if (head_first<C, H>(ch, lane)) {
                T += ds * e[ch];
                dsr[dh + (unsigned)(hoff * nrp + jj)] = ds * r;   // dsr_th_at(t, head_of(ch, lane), jj, H, nrp)
            }
        }
    }
    cp_async_wait<0>();   // the zero-byte copies of readers nr .. nr + ROUTE_RING - 2
    const float k3 = r * r * r / C * warp_sum(T);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float vv[8];
        unpack8(vraw[ch], vv);
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] -= k3 * vv[k]; }
        st_f8(dslot + (gi + ch * 256), dv[ch]);
        st_bf8(dslotX + (gi + ch * 256), dv[ch]);
    }
}
template <int C, int H, bool QP = false>
__global__ void __launch_bounds__(256, C <= 512 ? 3 : 1) route_gather_v12_kernel(float *dslot, bf16 *dslotX, float *dsr,
                                                                const bf16 *__restrict__ v, const float *__restrict__ rk,
                                                                const bf16 *__restrict__ Gall, const float *__restrict__ Sall,
                                                                const float *__restrict__ lseall,
                                                                const int *__restrict__ readers, int nr,
                                                                const float *__restrict__ qg, int N, unsigned NC, unsigned NH) {
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= N) { return; }
    gather12_position<C, H, false, QP>(t, dslot, dslotX, dsr, v, rk, Gall, Sall, lseall, readers, nr, qg, NC, NH,
                                       SiteIn20{}, nullptr);
}
// v22: v12's gather in the head-lane layout (Hl): a lane's 8 NCH channels lie in one head, so
// the per-head sums of p = G . v and e = qg . v are log2(HL) shuffles of one value each (v12:
// log2(SEG) shuffles of NCH values each, 12 at C = 512, H = 8, against 4 here), and the weight,
// ds and the dsr store come once a lane and reader instead of once a chunk. G (from the site
// kernel with HL) and qgh (qg_hl_kernel) are in hl order, so their rows still load as v12's;
// v and dslot keep the row order (read and written once a position, 16-byte packs at 8 NCH l + 8 ch).
// lse/S staged through the ring as v12's (lane l copies head l & (H - 1); lane l reads its head's).
template <int C, int H>
__global__ void __launch_bounds__(256, C <= 512 ? 3 : 1) route_gather_v22_kernel(float *dslot, bf16 *dslotX, float *dsr,
                                                                const bf16 *__restrict__ v, const float *__restrict__ rk,
                                                                const bf16 *__restrict__ Gall, const float *__restrict__ Sall,
                                                                const float *__restrict__ lseall,
                                                                const int *__restrict__ readers, int nr,
                                                                const float *__restrict__ qgh, int N, unsigned NC, unsigned NH) {
    constexpr int NCH = Hl<C, H>::NCH, HL = Hl<C, H>::HL;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= N) { return; }
    const int hd = lane / HL;   // this lane's head; its first lane stores the head's ds r
    uint4 vraw[NCH];
    float dv[NCH][8];
    const float r = rk[t];
    const unsigned gi = g12_row((unsigned)t, lane, C);               // G's packs (hl order): + 256 ch
    const unsigned vi = (unsigned)t * C + (unsigned)(lane * 8 * NCH);   // v's and dslot's (row order): + 8 ch
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        vraw[ch] = ld_raw(v + (vi + ch * 8));
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] = 0.0f; }
    }
    const int jl = lane < nr ? __ldg(readers + lane) : 0;
    const unsigned li = g12_ls((unsigned)t, lane, H), qi = (unsigned)lane * 8;
    const uint32_t sg = (uint32_t)__cvta_generic_to_shared(ring_packs<C>() + lane);
    const uint32_t sls = (uint32_t)__cvta_generic_to_shared(ring12_ls<C>() + lane);
    const uint4 *ringl = ring_packs<C>() + lane;
    const float *lsh = ring12_ls<C>() + hd;
    const int nrp = (nr + 3) & ~3;
    unsigned dh = g12_dsr((unsigned)t, H, nrp) + (unsigned)(hd * nrp);
    float T = 0.0f;   // this lane's share of sum_j u_j . v
    for (int i = 0; i < ROUTE_RING - 1; i++) { gather12_issue<C>(i, nr, jl, Gall, Sall, lseall, gi, li, NC, NH, sg, sls); }
    for (int jj = 0; jj < nr; jj++) {
        uint4 Graw[NCH];
        cp_async_wait<ROUTE_RING - 2>();   // reader jj's G row and this lane's lse/S entries are in
        __syncwarp();                      // and every lane's (this lane reads its head's entries)
        opaque1(dh);
        const float *ls = lsh + g12_stage(jj) * 64;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            Graw[ch] = ringl[(g12_stage(jj) * NCH + ch) * 32];
            opaque4(vraw[ch]);   // v's unpack stays in the loop: v is held packed
        }
        gather12_issue<C>(jj + ROUTE_RING - 1, nr, jl, Gall, Sall, lseall, gi, li, NC, NH, sg, sls);
        const float *qj = qgh + g12_add(qi, (unsigned)__shfl_sync(0xffffffffu, jl, jj), (unsigned)C);
        float p = 0.0f, e = 0.0f;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float G[8], vv[8], qv[8];
            unpack8_bits(Graw[ch], G);
            unpack8_bits(vraw[ch], vv);
            ld_f8(qj + ch * 256, qv);
#pragma unroll
            for (int k = 0; k < 8; k++) { p += G[k] * vv[k]; e += qv[k] * vv[k]; }
        }
#pragma unroll
        for (int o = 1; o < HL; o <<= 1) {
            p += __shfl_xor_sync(0xffffffffu, p, o);
            e += __shfl_xor_sync(0xffffffffu, e, o);
        }
        const float av = expf(r * e - ls[0]);
        const float ds = av * (p - ls[32]);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float G[8], qv[8];
            unpack8_bits(Graw[ch], G);
            ld_f8(qj + ch * 256, qv);   // L1 hit: every warp reads the same qg_j
#pragma unroll
            for (int k = 0; k < 8; k++) { dv[ch][k] += r * ds * qv[k] + av * G[k]; }
        }
        if (lane % HL == 0) {
            T += ds * e;
            dsr[dh + (unsigned)jj] = ds * r;
        }
    }
    cp_async_wait<0>();   // the zero-byte copies of readers nr .. nr + ROUTE_RING - 2
    const float k3 = r * r * r / C * warp_sum(T);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float vv[8];
        unpack8(vraw[ch], vv);
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] -= k3 * vv[k]; }
        st_f8(dslot + (vi + ch * 8), dv[ch]);
        st_bf8(dslotX + (vi + ch * 8), dv[ch]);
    }
}
// v22: qgh (J, C) = qg (J, C) with each row in hl order (Hl, hl_pack)
__global__ void qg_hl_kernel(float *qgh, const float *qg, size_t n, int C) {
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const size_t row = i / C;
    const int c = (int)(i % C);
    qgh[row * C + (size_t)hl_pack(c / 8, C / 256) * 8 + c % 8] = qg[i];
}

// v20: site k's norm backward fused into slot k's gather (slot k's first reader is site k): the
// site's G and S go straight into ring stage 0 instead of through DRAM, and the separate site pass,
// bound by DRAM, runs inside a kernel bound by instruction issue. Block = 8 positions; site.part
// gets the block's sum of dU xhat (warps in order). Shared memory: v12's, then red (8, C).
template <int C> constexpr size_t ring_smem20() { return ring_smem12<C>() + (size_t)8 * C * sizeof(float); }
template <int C, int H>
__global__ void __launch_bounds__(256, C <= 512 ? 3 : 1) route_gather_v20_kernel(float *dslot, bf16 *dslotX, float *dsr,
                                                                const bf16 *__restrict__ v, const float *__restrict__ rk,
                                                                const bf16 *__restrict__ Gall, const float *__restrict__ Sall,
                                                                const float *__restrict__ lseall,
                                                                const int *__restrict__ readers, int nr,
                                                                const float *__restrict__ qg, int N, unsigned NC, unsigned NH,
                                                                SiteIn20 site) {
    constexpr size_t red_at = ring_smem12<C>();   // red (8, C) after v12's stages
    float *red = reinterpret_cast<float *>(ring_smem_raw + red_at);
    const int w = threadIdx.x >> 5, t = blockIdx.x * 8 + w;
    if (t < N) {
        gather12_position<C, H, true>(t, dslot, dslotX, dsr, v, rk, Gall, Sall, lseall, readers, nr, qg, NC, NH, site,
                                      red + (size_t)w * C);
    } else {
        for (int c = (threadIdx.x & 31) * 8; c < C; c += 256) {
            *reinterpret_cast<float4 *>(red + (size_t)w * C + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *reinterpret_cast<float4 *>(red + (size_t)w * C + c + 4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += 256) {
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) { acc += red[k * C + c]; }
        site.part[(size_t)blockIdx.x * C + c] = acc;
    }
}

// v12's gather indexes with 32-bit unsigned element indices and takes a slot's readers
// from one register per lane: slot k fits when it has at most 32 readers and every index
// does (J N C into G, J N H into lse and S, N H nrp into dsr: each < 2^31)
static bool v12_fits(const Prob &P, int k) {
    const size_t lim = (size_t)1 << 31, J = P.J, N = P.N, C = P.C, H = P.H;
    return P.nr[k] <= 32 && J * N * C < lim && J * N * H < lim && N * H * (size_t)((P.nmax + 3) & ~3) < lim;
}

// v12's index math (the g12_* functions the kernel calls) against v11's formulas, on every
// shape the lab runs (--check's 8 configs; --bench's 100M shapes, full mode and block S = 4, at
// C = 512 and 1024 and every H built): for each slot, reader, lane and chunk, the G pack and qg
// channels read, the lse and S entries (the entry a lane reads from the stage is the one the
// lane at that slot copied), the dsr entry written; that reader i's copy goes to the stage read
// at iteration i and not to a stage still pending or in use; that lane l holds reader l; and
// v12_fits. Positions: all of them at --check's N, 0..63 and the last 64 at 100M.
// v13's plans (route_fwd_plan, kernels/route_forward.cuh; the trainer uses the same function) on
// every L <= 13 and S, kmax 1..4, both rules: groups are runs of consecutive
// sites, at most kmax long; every member's list starts with its leader's,
// strictly shorter one, of slots written before the leader (<= it); by cost,
// never more bytes than no groups. Then the grouped forward in float64 (the
// leader's partials hbar = acc / l and lse_p = m + log l, a member's online
// softmax started from them) against ref_forward's h and lse, every group the
// slots allow.
static bool selftest_v13(uint64_t seed) {
    bool ok = true;
    int plans = 0, bad = 0;
    for (int L = 1; L <= 13; L++) {
        for (int S = 1; S <= 2 * L + 1; S++) {
            for (int kmax = 1; kmax <= 4; kmax++) {
                for (int all = 0; all <= 1; all++) {
                    for (int wide = 0; wide <= 1; wide++) {
                        Prob P = make_prob(L, S, wide ? 512 : 32, wide ? 8 : 1, 1);
                        build_v13_plan(P, kmax, all != 0);
                        const int J = P.J;
                        double bytes = 0, bytes1 = 0;
                        const double row = 2.0 * P.C + 4, part = 8.0 * (P.C + P.H);
                        bool good = true;
                        int starts = 0;
                        for (int j = 0; j < J; j++) {
                            const int ld = P.lead13[j];
                            bytes1 += P.n[j] * row;
                            good = good && ld <= j && j - ld < kmax && (ld == j || P.lead13[j - 1] == ld);
                            if (ld == j) { bytes += P.n[j] * row; continue; }
                            starts++;
                            good = good && P.n[j] > P.n[ld];
                            for (int i = 0; i < P.n[ld]; i++) {
                                good = good && P.src[(size_t)j * J + i] == P.src[(size_t)ld * J + i] &&
                                       P.src[(size_t)ld * J + i] <= ld;
                            }
                            bytes += (P.n[j] - P.n[ld]) * row + part;
                        }
                        good = good && starts == P.v13_starts && (kmax > 1 || starts == 0) &&
                               (all || bytes <= bytes1);
                        plans++;
                        if (!good && bad++ < 5) { printf("  v13 plan L=%d S=%d kmax=%d all=%d C=%d: FAIL\n", L, S, kmax, all, P.C); }
                        ok = ok && good;
                    }
                }
            }
        }
    }
    printf("v13 plans: %d plans checked, %s\n", plans, ok ? "ok" : "FAIL");
    struct { int L, S, C, H, N; } cfgs[] = {{12, 1, 32, 4, 3}, {6, 2, 16, 2, 3}, {5, 3, 16, 1, 2}, {4, 1, 64, 8, 2}};
    int k = 0;
    for (auto &c : cfgs) {
        Prob P = make_prob(c.L, c.S, c.C, c.H, c.N);
        build_v13_plan(P, 4, true);
        HostIn in = make_inputs(P, seed + 100 * (k++));
        std::vector<double> slots = bf_to_d(in.slots), q = to_d(in.q), gm = to_d(in.gm), g = to_d(in.g);
        Ref R;
        ref_forward(P, slots.data(), q.data(), gm.data(), g.data(), EMU_EXACT, R);
        const int J = P.J, C = c.C, H = c.H, HC = C / H;
        const size_t N = c.N;
        // the online softmax of one (site, position, head): max m, sum l, unnormalised mix acc (HC)
        struct St { double m, l; std::vector<double> acc; };
        auto step = [&](St &st, int j, size_t t, int hh, int slot) {
            const double *v = &slots[((size_t)slot * N + t) * C + hh * HC];
            double e = 0;
            for (int cc = 0; cc < HC; cc++) { e += q[j * C + hh * HC + cc] * gm[j * C + hh * HC + cc] * v[cc]; }
            const double sc = R.r[(size_t)slot * N + t] * e, mn = std::max(st.m, sc);
            const double f = exp(st.m - mn), p = exp(sc - mn);
            st.l = st.l * f + p;
            for (int cc = 0; cc < HC; cc++) { st.acc[cc] = st.acc[cc] * f + p * v[cc]; }
            st.m = mn;
        };
        std::vector<double> hbar((size_t)J * N * C), lsep((size_t)J * N * H);   // the partial of site j (a member)
        double eh = 0, el = 0;
        for (int j = 0; j < J; j++) {
            const int ld = P.lead13[j], n0 = ld == j ? 0 : P.n[ld];
            for (size_t t = 0; t < N; t++) {
                for (int hh = 0; hh < H; hh++) {
                    St st{-INFINITY, 0, std::vector<double>(HC, 0.0)};
                    if (ld != j) {   // from the partial
                        st.m = lsep[((size_t)j * N + t) * H + hh]; st.l = 1;
                        for (int cc = 0; cc < HC; cc++) { st.acc[cc] = hbar[((size_t)j * N + t) * C + hh * HC + cc]; }
                    }
                    for (int i = n0; i < P.n[j]; i++) { step(st, j, t, hh, P.src[(size_t)j * J + i]); }
                    for (int x = j + 1; ld == j && x < J && P.lead13[x] == j; x++) {   // the leader's partials
                        St sx{-INFINITY, 0, std::vector<double>(HC, 0.0)};
                        for (int i = 0; i < P.n[j]; i++) { step(sx, x, t, hh, P.src[(size_t)j * J + i]); }
                        for (int cc = 0; cc < HC; cc++) { hbar[((size_t)x * N + t) * C + hh * HC + cc] = sx.acc[cc] / sx.l; }
                        lsep[((size_t)x * N + t) * H + hh] = sx.m + log(sx.l);
                    }
                    for (int cc = 0; cc < HC; cc++) {
                        const double ref = R.h[((size_t)j * N + t) * C + hh * HC + cc];
                        eh = std::max(eh, fabs(st.acc[cc] / st.l - ref) / std::max(fabs(ref), 1e-3));
                    }
                    el = std::max(el, fabs(st.m + log(st.l) - R.lse[((size_t)j * N + t) * H + hh]));
                }
            }
        }
        const bool good = eh < 1e-12 && el < 1e-12;
        ok = ok && good;
        printf("v13 grouped forward, float64, L=%d S=%d C=%d H=%d N=%d: %d of %d sites from a partial, "
               "h max rel err %.1e, lse max abs err %.1e: %s\n", c.L, c.S, c.C, c.H, c.N, P.v13_starts, J, eh, el,
               good ? "ok" : "FAIL");
    }
    return ok;
}

// v14 on the host: (1) fwd14_reduce's transposing butterfly and fwd14_bcast's
// indexed shuffles, emulated lane by lane for every (C, H, KX) built: each lane's
// slot m must hold its segment's sum of value value_of(m, lane), each broadcast
// value K the segment's sum of K, and each (segment, value < V) have exactly one
// lse writer; (2) the lazy-rescale online softmax in base 2 (fp32, exp2f for
// ex2_ftz), from scratch or from a partial, against float64 on score sequences
// with jumps above and below FWD14_TAU.
template <class G> static bool selftest_v14_geo(uint64_t *rng, int C, int H, int KX) {
    constexpr int P = G::P, SEG = G::SEG;
    float y[32][P];
    double want[32][P];
    for (int ln = 0; ln < 32; ln++) {
        for (int k = 0; k < P; k++) { y[ln][k] = k < G::V ? (float)rng_normal(rng) : 0.0f; }
    }
    for (int ln = 0; ln < 32; ln++) {
        for (int k = 0; k < P; k++) {
            want[ln][k] = 0.0;
            for (int o = 0; o < SEG; o++) { want[ln][k] += y[(ln & ~(SEG - 1)) + o][k]; }
        }
    }
    for (int r = 0; r < G::T; r++) {   // as fwd14_reduce: __shfl_xor_sync(send, o) reads lane ^ o's send
        const int half = P >> (r + 1), o = SEG >> (r + 1);
        float ny[32][P];
        for (int ln = 0; ln < 32; ln++) {
            for (int m = 0; m < half; m++) {
                const int pt = ln ^ o;
                const bool hi = (ln & o) != 0, phi = (pt & o) != 0;
                const float keep = hi ? y[ln][m + half] : y[ln][m], send = phi ? y[pt][m] : y[pt][m + half];
                ny[ln][m] = keep + send;
            }
        }
        for (int ln = 0; ln < 32; ln++) { for (int m = 0; m < half; m++) { y[ln][m] = ny[ln][m]; } }
    }
    for (int o = SEG >> (G::T + 1); o > 0; o >>= 1) {
        float ny[32][P];
        for (int ln = 0; ln < 32; ln++) { for (int m = 0; m < G::SL; m++) { ny[ln][m] = y[ln][m] + y[ln ^ o][m]; } }
        for (int ln = 0; ln < 32; ln++) { for (int m = 0; m < G::SL; m++) { y[ln][m] = ny[ln][m]; } }
    }
    bool ok = true;
    double err = 0.0;
    int writers[32][P] = {};
    for (int ln = 0; ln < 32; ln++) {
        for (int m = 0; m < G::SL; m++) {
            const int k = G::value_of(m, ln);
            ok = ok && k >= 0 && k < P;
            if (!ok) { break; }
            err = std::max(err, fabs(y[ln][m] - want[ln][k]));
            if (k < G::V && (ln & ((1 << (G::R - G::T)) - 1)) == 0) { writers[ln & ~(SEG - 1)][k]++; }
        }
        for (int K = 0; K < G::V && ok; K++) {   // as fwd14_bcast: width SEG, source lane relative to the segment
            const int srcl = G::T == 0 ? ln : (ln & ~(SEG - 1)) + ((K >> (G::LP - G::T)) << (G::R - G::T));
            err = std::max(err, fabs(y[srcl][K & (G::SL - 1)] - want[ln][K]));
        }
    }
    for (int s = 0; s < 32 && ok; s += SEG) {
        for (int k = 0; k < G::V; k++) { ok = ok && writers[s][k] == 1; }
    }
    ok = ok && err <= 1e-4;
    if (!ok) { printf("  v14 reduce C=%d H=%d KX=%d: FAIL (max err %.1e)\n", C, H, KX, err); }
    return ok;
}
template <int C, int H> static bool selftest_v14_geos(uint64_t *rng) {
    return selftest_v14_geo<Fwd14<C, H, 0>>(rng, C, H, 0) & selftest_v14_geo<Fwd14<C, H, 1>>(rng, C, H, 1) &
           selftest_v14_geo<Fwd14<C, H, 2>>(rng, C, H, 2) & selftest_v14_geo<Fwd14<C, H, 3>>(rng, C, H, 3);
}
static bool selftest_v14(uint64_t seed) {
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 11;
    bool ok = selftest_v14_geos<512, 1>(&rng) & selftest_v14_geos<512, 2>(&rng) & selftest_v14_geos<512, 4>(&rng) &
              selftest_v14_geos<512, 8>(&rng) & selftest_v14_geos<512, 16>(&rng) & selftest_v14_geos<1024, 1>(&rng) &
              selftest_v14_geos<1024, 2>(&rng) & selftest_v14_geos<1024, 4>(&rng) & selftest_v14_geos<1024, 8>(&rng) &
              selftest_v14_geos<1024, 16>(&rng);
    printf("v14 transposing head sums, every (C, H, KX) built: %s\n", ok ? "ok" : "FAIL");
    double el = 0.0, eh = 0.0;
    int rescales = 0, rows = 0;
    for (int it = 0; it < 400; it++) {
        const int n = 1 + it % 25, from = it % 3 == 0;   // from a partial: lse_p, hbar
        std::vector<double> s(n), v(n);
        double walk = 30.0 * rng_normal(&rng);
        for (int i = 0; i < n; i++) {   // natural-log scores: small steps, and jumps of up to +-60
            walk += (rng_f32(&rng) < 0.2 ? 60.0 : 3.0) * (2.0 * rng_f32(&rng) - 1.0);
            s[i] = walk; v[i] = rng_normal(&rng);
        }
        const double lp = from ? walk + 10.0 * rng_normal(&rng) : 0.0, hb = from ? rng_normal(&rng) : 0.0;
        double mx = from ? lp : -1e300;
        for (int i = 0; i < n; i++) { mx = std::max(mx, s[i]); }
        double sum = from ? exp(lp - mx) : 0.0, mix = from ? exp(lp - mx) * hb : 0.0;
        for (int i = 0; i < n; i++) { sum += exp(s[i] - mx); mix += exp(s[i] - mx) * v[i]; }
        const double lse_ref = mx + log(sum), h_ref = mix / sum;
        // the kernel's update, in fp32
        float m2 = from ? (float)lp * FWD14_LOG2E : -INFINITY, l = from ? 1.0f : 0.0f, acc = from ? (float)hb : 0.0f;
        for (int i = 0; i < n; i++) {
            const float s2 = (float)s[i] * FWD14_LOG2E;
            rows++;
            if (s2 > m2 + FWD14_TAU) {
                const float mn = std::max(m2, s2), sc = exp2f(m2 - mn);
                l *= sc; acc *= sc; m2 = mn;
                rescales++;
            }
            const float p = exp2f(s2 - m2);
            l += p; acc = fmaf(p, (float)v[i], acc);
        }
        const double lse = (m2 + log2f(l)) * FWD14_LN2, h = acc / l;
        el = std::max(el, fabs(lse - lse_ref) / (1.0 + fabs(lse_ref)));
        eh = std::max(eh, fabs(h - h_ref) / (1.0 + fabs(h_ref)));
    }
    const bool ok2 = el <= 1e-6 && eh <= 1e-5;
    printf("v14 lazy-rescale softmax, fp32 vs float64, 400 sequences: lse max err %.1e, mix max err %.1e, "
           "%d rescales in %d rows: %s\n", el, eh, rescales, rows, ok2 ? "ok" : "FAIL");
    return ok && ok2;
}

static bool selftest_v12_index(void) {
    struct Shape { int L, S, C, H, N; };
    std::vector<Shape> shapes = {{2, 1, 512, 8, 77},  {3, 1, 512, 1, 200}, {3, 2, 512, 4, 130}, {4, 3, 512, 16, 97},
                                 {12, 1, 512, 8, 96}, {12, 4, 512, 2, 50}, {2, 1, 1024, 8, 40}, {2, 1, 1024, 1, 33}};
    for (int C : {512, 1024}) {
        for (int H : {1, 2, 4, 8, 16}) {
            shapes.push_back({12, 1, C, H, 16 * 2048});
            shapes.push_back({12, 4, C, H, 16 * 2048});
        }
    }
    long long checked = 0, bad = 0;
    for (const Shape &sh : shapes) {
        Prob P = make_prob(sh.L, sh.S, sh.C, sh.H, sh.N);
        const int C = sh.C, H = sh.H, N = sh.N, NCH = C / 256, HC = C / H;
        const unsigned NC = (unsigned)((size_t)N * C), NH = (unsigned)((size_t)N * H);
        std::vector<int> ts;
        for (int t = 0; t < N; t++) { if (N <= 256 || t < 64 || t >= N - 64) { ts.push_back(t); } }
        auto fail = [&](const char *what, int k, int jj, int t, int lane) {
            if (bad++ < 5) { printf("  v12 index: %s (L=%d S=%d C=%d H=%d N=%d slot %d reader %d t %d lane %d)\n", what, sh.L, sh.S, C, H, N, k, jj, t, lane); }
        };
        for (int k = 0; k < P.J; k++) {
            if (!v12_fits(P, k)) { fail("v12_fits refuses a lab shape", k, -1, -1, -1); continue; }
            const int nr = P.nr[k], nrp = (nr + 3) & ~3;
            const int *rd = &P.rd[(size_t)k * P.J];
            for (int jj = 0; jj < nr + ROUTE_RING - 1; jj++) {   // the issue schedule: reader i at iteration i - 3
                const int later[ROUTE_RING - 1] = {jj, jj + 1, jj + 2};   // stages read at jj, or pending, when jj + 3 is issued
                for (int x : later) { if (g12_stage(jj + ROUTE_RING - 1) == g12_stage(x)) { fail("stage overwritten while in use", k, jj, -1, -1); } }
                if (jj < nr && g12_src_lane(jj) != jj) { fail("reader's lane", k, jj, -1, -1); }
            }
            for (int jj = 0; jj < nr; jj++) {
                const unsigned j = (unsigned)rd[jj];
                for (int t : ts) {
                    const size_t row = (size_t)j * N + t;
                    for (int lane = 0; lane < 32; lane++) {
                        checked++;
                        const unsigned gi = g12_row((unsigned)t, lane, C);
                        const int hd0 = (lane * 8) / HC;
                        for (int ch = 0; ch < NCH; ch++) {
                            const int hd = (ch * 256 + lane * 8) / HC, hoff = ch * 256 / HC;
                            if ((size_t)(g12_add(gi, j, NC) + ch * 256) != row * C + ch * 256 + lane * 8) { fail("G pack", k, jj, t, lane); }
                            if ((size_t)(gi + ch * 256) != (size_t)t * C + ch * 256 + lane * 8) { fail("v / dslot", k, jj, t, lane); }
                            if ((size_t)(g12_add((unsigned)lane * 8, j, (unsigned)C) + ch * 256) != (size_t)j * C + ch * 256 + lane * 8) { fail("qg", k, jj, t, lane); }
                            if (hd != hd0 + hoff) { fail("chunk's head", k, jj, t, lane); }
                            const int src = hd0 + hoff;   // the stage slot read: copied by lane src
                            if (src < 0 || src >= 32 || (size_t)g12_add(g12_ls((unsigned)t, src, H), j, NH) != row * H + hd) { fail("lse / S entry", k, jj, t, lane); }
                            const unsigned dsr_new = g12_dsr((unsigned)t, H, nrp) + (unsigned)(hd0 * nrp) + (unsigned)(hoff * nrp + jj);
                            if ((size_t)dsr_new != dsr_th_at(t, hd, jj, H, nrp)) { fail("dsr entry", k, jj, t, lane); }
                        }
                    }
                }
            }
        }
    }
    printf("  v12 gather index math vs v11's (%zu shapes, %lld (slot, reader, position, lane) cases): %s\n", shapes.size(),
           checked, bad == 0 ? "PASS" : "FAIL");
    return bad == 0;
}

// Gather v9 (v10: the same at 3 blocks/SM): v8's ring gather with fewer
// instructions per reader, since the trainer's ring gather is bound by
// instruction issue (ncu: 0.72 issued warps per scheduler at 40% of DRAM):
// v_k unpacked to fp32 once (not per reader), each reader's G row and qg_j
// unpacked / loaded once (not twice), the weight through exp2f of a log2-scaled
// argument (MUFU.EX2 and a multiply instead of expf's range reduction), and dv
// as two FMAs. The extra live registers (v, G and qg in fp32) need more than
// v8's 80: MINB = 2 blocks/SM (v9) allows 128; MINB = 3 (v10) keeps 24 warps
// an SM at 80, with whatever that spills.
template <int C, int H, int MINB>
__global__ void __launch_bounds__(256, MINB) route_gather_v9_kernel(float *dslot, bf16 *dslotX, float *dsr,
                                                                  const bf16 *__restrict__ v, const float *__restrict__ rk,
                                                                  const bf16 *__restrict__ Gall,
                                                                  const float *__restrict__ Sall,
                                                                  const float *__restrict__ lseall,
                                                                  const int *__restrict__ readers, int nr,
                                                                  const float *__restrict__ qg, int N) {
    constexpr int NCH = Geo<C, H>::NCH;
    constexpr float LOG2E_F = 1.4426950408889634f;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= N) { return; }
    float vf[NCH][8], dv[NCH][8];
    const float r = rk[t], rl = r * LOG2E_F;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        unpack8(ld_raw(v + (size_t)t * C + ch * 256 + lane * 8), vf[ch]);
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] = 0.0f; }
    }
    float T = 0.0f;   // this lane's share of sum_j u_j . v
    for (int jj = 0; jj < ROUTE_RING - 1; jj++) { gather_ring_issue<C>(jj, nr, readers, Gall, Sall, lseall, N, H, t, lane); }
    for (int jj = 0; jj < nr; jj++) {
        const int j = __ldg(readers + jj);
        const size_t row = (size_t)j * N + t;
        float G[NCH][8], qv[NCH][8], p[NCH], e[NCH];
        cp_async_wait<ROUTE_RING - 2>();   // reader jj's G row is in (this lane's part of it)
        {
            const uint4 *ring = ring_packs<C>();
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { unpack8(ring[((jj & (ROUTE_RING - 1)) * NCH + ch) * 32 + lane], G[ch]); }
        }
        gather_ring_issue<C>(jj + ROUTE_RING - 1, nr, readers, Gall, Sall, lseall, N, H, t, lane);   // stage of jj-1
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            float pd = 0.0f, ed = 0.0f;
            ld_f8(qg + (size_t)j * C + ch * 256 + lane * 8, qv[ch]);
#pragma unroll
            for (int k = 0; k < 8; k++) { pd = fmaf(G[ch][k], vf[ch][k], pd); ed = fmaf(qv[ch][k], vf[ch][k], ed); }
            p[ch] = pd; e[ch] = ed;
        }
        head_sum<C, H>(p);
        head_sum<C, H>(e);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int hd = head_of<C, H>(ch, lane);
            const float lse = __ldg(lseall + row * H + hd), S = __ldg(Sall + row * H + hd);
            const float av = exp2f(fmaf(rl, e[ch], -lse * LOG2E_F));   // exp(r e - lse)
            const float ds = av * (p[ch] - S), rds = r * ds;
#pragma unroll
            for (int k = 0; k < 8; k++) { dv[ch][k] = fmaf(av, G[ch][k], fmaf(rds, qv[ch][k], dv[ch][k])); }
            if (head_first<C, H>(ch, lane)) {
                T += ds * e[ch];
                dsr[((size_t)t * nr + jj) * H + hd] = rds;
            }
        }
    }
    const float k3 = r * r * r / C * warp_sum(T);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] -= k3 * vf[ch][k]; }
        st_f8(dslot + (size_t)t * C + ch * 256 + lane * 8, dv[ch]);
        st_bf8(dslotX + (size_t)t * C + ch * 256 + lane * 8, dv[ch]);
    }
}


// q/gamma pass v4 (the trainer's before rbwd2): part (P, nr, C) = partition p's
// sum over its PART_ROWS45 positions of dsr[t, jj, h(c)] * v_k[t][c]. Block =
// 32 lanes of 8 channels x 8 position lanes; readers in groups of 8 held in
// registers (v read once per group); lane sums added in order through shared memory.
__global__ void __launch_bounds__(256, 2) route_param_v4_kernel(float *part, const float *__restrict__ dsr,
                                                               const bf16 *__restrict__ v, int nr, int N, int C, int H) {
    __shared__ __align__(16) float red[8][256];
    const int x = threadIdx.x % 32, y = threadIdx.x / 32, p = blockIdx.y;
    const int c0 = (blockIdx.x * 32 + x) * 8, hd = c0 < C ? c0 / (C / H) : 0;
    const int t0 = p * PART_ROWS45, t1 = min(t0 + PART_ROWS45, N);
    for (int j0 = 0; j0 < nr; j0 += 8) {
        float acc[8][8];
#pragma unroll
        for (int r = 0; r < 8; r++) {
#pragma unroll
            for (int k = 0; k < 8; k++) { acc[r][k] = 0.0f; }
        }
        if (c0 < C) {
            for (int t = t0 + y; t < t1; t += 8) {
                float vv[8];
                unpack8(ld_raw(v + (size_t)t * C + c0), vv);
                const float *d = dsr + ((size_t)t * nr + j0) * H + hd;
#pragma unroll
                for (int r = 0; r < 8; r++) {
                    if (j0 + r < nr) {
                        const float dr = d[r * H];
#pragma unroll
                        for (int k = 0; k < 8; k++) { acc[r][k] += dr * vv[k]; }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 8; r++) {
            if (j0 + r >= nr) { break; }
            st_f8(&red[y][x * 8], acc[r]);
            __syncthreads();
            for (int i = threadIdx.x; i < 256; i += blockDim.x) {
                const int c = blockIdx.x * 256 + i;
                if (c < C) {
                    float s = 0.0f;
                    for (int yy = 0; yy < 8; yy++) { s += red[yy][i]; }
                    part[((size_t)p * nr + j0 + r) * C + c] = s;
                }
            }
            __syncthreads();
        }
    }
}

// q = i / d, r = i % d for 0 <= i < 2^24 and d >= 1, through a float reciprocal
// inv = 1.0f / d (one correction step), cheaper than an integer division
__device__ __forceinline__ void fdivmod(int i, int d, float inv, int &q, int &r) {
    q = __float2int_rz((float)i * inv);
    r = i - q * d;
    if (r >= d) { q++; r -= d; }
    if (r < 0) { q--; r += d; }
}

// q/gamma pass v5 (the trainer's route_slot_param_kernel<2> on branch rbwd2):
// the same part (P, nr, C). Block = 256 threads of 2
// adjacent channels (512 channels); each thread sums its channels over the
// partition's positions in order, up to 32 readers in registers. Tiles of tp
// positions: v (tp, 512) bf16 and dsr (tp, nr, H) are copied into shared memory
// first (coalesced, all loads in flight), dsr as rows of nrp = nr rounded up to
// 4 (zero padded), then read four readers per 16-byte broadcast.
#define RG5 32
__global__ void __launch_bounds__(256, 2) route_param_v5_kernel(float *part, const float *__restrict__ dsr,
                                                               const bf16 *__restrict__ v, int nr, int N, int C, int H,
                                                               int tp) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int CB = 512;
    const int nrp = (nr + 3) & ~3, p = blockIdx.y, cb0 = blockIdx.x * CB, HC = C / H;
    const float invH = 1.0f / H, invnr = 1.0f / nr;
    bf16 *vs = reinterpret_cast<bf16 *>(smem_raw);                                 // (tp, CB)
    float *ds = reinterpret_cast<float *>(smem_raw + (size_t)tp * CB * sizeof(bf16));   // (tp, H, nrp)
    const int cl = threadIdx.x * 2, c = cb0 + cl, hd = c < C ? c / HC : 0;
    const int t0 = p * PART_ROWS45, t1 = min(t0 + PART_ROWS45, N), ncb = min(CB, C - cb0);
    for (int q = threadIdx.x; q < tp * H; q += blockDim.x) {
        for (int jj = nr; jj < nrp; jj++) { ds[(size_t)q * nrp + jj] = 0.0f; }
    }
    for (int j0 = 0; j0 < nr; j0 += RG5) {
        float acc[RG5][2];
#pragma unroll
        for (int r = 0; r < RG5; r++) { acc[r][0] = 0.0f; acc[r][1] = 0.0f; }
        for (int ta = t0; ta < t1; ta += tp) {
            const int tn = min(tp, t1 - ta);
            __syncthreads();
            const int nq = ncb / 8, nv = tn * nq;   // C is a multiple of 256 in the lab
            const float invnq = 1.0f / nq;
            for (int q0 = threadIdx.x; q0 < nv; q0 += 8 * blockDim.x) {   // 8 loads in flight, then the stores
                uint4 buf[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int q = q0 + u * blockDim.x;
                    int t, col;
                    fdivmod(q, nq, invnq, t, col);
                    if (q < nv) { buf[u] = ld_raw(v + (size_t)(ta + t) * C + cb0 + col * 8); }
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int q = q0 + u * blockDim.x;
                    int t, col;
                    fdivmod(q, nq, invnq, t, col);
                    if (q < nv) { *reinterpret_cast<uint4 *>(vs + (size_t)t * CB + col * 8) = buf[u]; }
                }
            }
            // dsr rows ta .. ta+tn (tn, nr, H), contiguous: element i = (t nr + jj) H + hd -> ds[t][hd][jj]
            {
                const float *src = dsr + (size_t)ta * nr * H;
                const int n = tn * nr * H;
                for (int i0 = threadIdx.x; i0 < n; i0 += 8 * blockDim.x) {
                    float buf[8];
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        const int i = i0 + u * blockDim.x;
                        if (i < n) { buf[u] = src[i]; }
                    }
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        const int i = i0 + u * blockDim.x;
                        int row, hd2, t, jj;
                        fdivmod(i, H, invH, row, hd2);
                        fdivmod(row, nr, invnr, t, jj);
                        if (i < n) { ds[((size_t)t * H + hd2) * nrp + jj] = buf[u]; }
                    }
                }
            }
            __syncthreads();
            if (c < C) {
                for (int t = 0; t < tn; t++) {
                    const float2 vv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(vs + (size_t)t * CB + cl));
                    const float *d = ds + ((size_t)t * H + hd) * nrp + j0;
#pragma unroll
                    for (int r4 = 0; r4 < RG5 / 4; r4++) {
                        if (j0 + 4 * r4 < nr) {
                            const float4 d4 = *reinterpret_cast<const float4 *>(d + 4 * r4);
                            acc[4 * r4 + 0][0] += d4.x * vv.x; acc[4 * r4 + 0][1] += d4.x * vv.y;
                            acc[4 * r4 + 1][0] += d4.y * vv.x; acc[4 * r4 + 1][1] += d4.y * vv.y;
                            acc[4 * r4 + 2][0] += d4.z * vv.x; acc[4 * r4 + 2][1] += d4.z * vv.y;
                            acc[4 * r4 + 3][0] += d4.w * vv.x; acc[4 * r4 + 3][1] += d4.w * vv.y;
                        }
                    }
                }
            }
        }
        if (c < C) {
#pragma unroll
            for (int r = 0; r < RG5; r++) {
                if (j0 + r < nr) {
                    part[((size_t)p * nr + j0 + r) * C + c] = acc[r][0];
                    part[((size_t)p * nr + j0 + r) * C + c + 1] = acc[r][1];
                }
            }
        }
    }
}
static size_t param_v5_smem(int nr, int H, int *tp) {
    const size_t row = 512 * sizeof(bf16) + (size_t)H * ((nr + 3) & ~3) * sizeof(float);
    *tp = 32;
    while (*tp > 1 && *tp * row > 96 * 1024) { *tp /= 2; }
    return *tp * row;
}

// qvacc[(k, readers[jj])] (C) = sum over P partitions of part (P, nr, C), reader
// jj = blockIdx.y, fixed order: lane y sums partitions y, y + 32, .. in order,
// then the 32 lane sums in lane order (the trainer's route_reduce_parts).
__global__ void __launch_bounds__(1024) route_reduce45_kernel(float *qvacc, const float *__restrict__ part,
                                                              const int *readers, int nr, int P, int k, int J, int C) {
    __shared__ float acc[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x, jj = blockIdx.y;
    float s = 0.0f;
    if (c < C) {
        for (int p = threadIdx.y; p < P; p += 32) { s += part[((size_t)p * nr + jj) * C + c]; }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int y = 0; y < 32; y++) { t += acc[y][threadIdx.x]; }
        qvacc[((size_t)k * J + readers[jj]) * C + c] = t;
    }
}

// ----------------------------------------------------------------------------
// v7: two slots per pass over G (NOTES_route.md, idea 2 of "Next steps").
// Schedule: the gather of slot k runs right after site k stored G_k, when every
// G_j, j >= k, exists; slot k's gradient is needed before sublayer k-1's
// backward, and G_{k-1} only exists after it. So the pass of slot hi also adds,
// for a lower partner slot lo (Prob::v7_lo, chosen by build_v7_plan), the terms
// of lo's readers j >= hi into an fp32 partial (N, C) and their u.v sum Tpart
// (N); the pass of lo later adds only its readers j < hi, the partial, and
// finishes. A G_j row (with lse_j, S_j) read by the pass of hi then serves both
// slots. Each reader's ds r goes into dsrA (slot A's, (N, nrA, H)) or dsrB (lo's,
// (N, nrB, H)) at the reader's index in that slot's reader list, so the q/gamma
// pass (v5's) runs unchanged on either. Summation order: per slot, its readers
// in increasing j as before, but lo's readers j >= hi are summed first (in the
// partial) and then j < hi: v7 differs from v5 by fp32 rounding only.
//
// One kernel for the three kinds of pass: TWO = false: a plain pass (v5's
// gather, pin = NULL) or the finish of a lo slot (pin, Tin = its partial); TWO =
// true: the pass of a hi slot (A = hi) that also accumulates lo (B). Entries
// ul (nu, 3) = (j, ia, ib): ia, ib the reader's index for A, B, or -1.

// The terms of reader j (G packed, row = j N + t) for one slot (v packed, r):
// dv += r ds qg_j + a G, T += ds e at each head's first lane, dsr = ds r.
template <int C, int H>
__device__ __forceinline__ void gather7_term(float (&dv)[C / 256][8], float &T, float *dsr, const uint4 (&Gp)[C / 256],
                                             const uint4 (&vp)[C / 256], float r, const float *__restrict__ qgj,
                                             const float *__restrict__ lse_row, const float *__restrict__ S_row,
                                             int lane) {
    constexpr int NCH = Geo<C, H>::NCH;
    float p[NCH], e[NCH];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float G[8], vv[8], qv[8], pd = 0.0f, ed = 0.0f;
        unpack8(Gp[ch], G);
        unpack8(vp[ch], vv);
        ld_f8(qgj + ch * 256 + lane * 8, qv);
#pragma unroll
        for (int k = 0; k < 8; k++) { pd += G[k] * vv[k]; ed += qv[k] * vv[k]; }
        p[ch] = pd; e[ch] = ed;
    }
    head_sum<C, H>(p);
    head_sum<C, H>(e);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int hd = head_of<C, H>(ch, lane);
        const float av = expf(r * e[ch] - __ldg(lse_row + hd));
        const float ds = av * (p[ch] - __ldg(S_row + hd));
        float G[8], qv[8];
        unpack8(Gp[ch], G);
        ld_f8(qgj + ch * 256 + lane * 8, qv);   // L1 hit
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] += r * ds * qv[k] + av * G[k]; }
        if (head_first<C, H>(ch, lane)) {
            T += ds * e[ch];
            dsr[hd] = ds * r;
        }
    }
}

template <int C, int H, bool TWO>
__global__ void __launch_bounds__(256, C <= 512 ? (TWO ? 2 : 3) : 1)
route_gather_v7_kernel(float *dslot, bf16 *dslotX, float *dsrA, const bf16 *__restrict__ vA, const float *__restrict__ rA,
                       const float *__restrict__ pin, const float *__restrict__ Tin, float *pout, float *Tout,
                       float *dsrB, const bf16 *__restrict__ vB, const float *__restrict__ rB,
                       const bf16 *__restrict__ Gall, const float *__restrict__ Sall, const float *__restrict__ lseall,
                       const int *__restrict__ ul, int nu, int nrA, int nrB, const float *__restrict__ qg, int N) {
    constexpr int NCH = Geo<C, H>::NCH, NB = TWO ? NCH : 1;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= N) { return; }
    uint4 va[NCH], vb[NB], nxt[NCH];
    float dva[NCH][8], dvb[NB][8];
    const float ra = rA[t], rb = TWO ? rB[t] : 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        va[ch] = ld_raw(vA + (size_t)t * C + ch * 256 + lane * 8);
        if (pin != nullptr) { ld_f8(pin + (size_t)t * C + ch * 256 + lane * 8, dva[ch]); }
        else {
#pragma unroll
            for (int k = 0; k < 8; k++) { dva[ch][k] = 0.0f; }
        }
    }
    if constexpr (TWO) {
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            vb[ch] = ld_raw(vB + (size_t)t * C + ch * 256 + lane * 8);
#pragma unroll
            for (int k = 0; k < 8; k++) { dvb[ch][k] = 0.0f; }
        }
    }
    float Ta = 0.0f, Tb = 0.0f;   // this lane's share of sum_j u_j . v for A, B
    if (nu > 0) {
        size_t row = (size_t)__ldg(ul) * N + t;
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_raw(Gall + row * C + ch * 256 + lane * 8); }
        prefetch_row_l1(lseall + row * H, H, lane);
        prefetch_row_l1(Sall + row * H, H, lane);
    }
    for (int u = 0; u < nu; u++) {
        const int j = __ldg(ul + 3 * u), ia = __ldg(ul + 3 * u + 1), ib = __ldg(ul + 3 * u + 2);
        const size_t row = (size_t)j * N + t;
        uint4 Gp[NCH];
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { Gp[ch] = nxt[ch]; }
        if (u + 1 < nu) {   // the next entry's G into registers, its lse and S into L1
            size_t rown = (size_t)__ldg(ul + 3 * u + 3) * N + t;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { nxt[ch] = ld_raw(Gall + rown * C + ch * 256 + lane * 8); }
            prefetch_row_l1(lseall + rown * H, H, lane);
            prefetch_row_l1(Sall + rown * H, H, lane);
        }
        if (ia >= 0) {
            gather7_term<C, H>(dva, Ta, dsrA + ((size_t)t * nrA + ia) * H, Gp, va, ra, qg + (size_t)j * C,
                               lseall + row * H, Sall + row * H, lane);
        }
        if constexpr (TWO) {
            if (ib >= 0) {
                gather7_term<C, H>(dvb, Tb, dsrB + ((size_t)t * nrB + ib) * H, Gp, vb, rb, qg + (size_t)j * C,
                                   lseall + row * H, Sall + row * H, lane);
            }
        }
    }
    // slot A: dv -= (r^3 / C) (sum_j u_j . v) v, the sum including the partial's
    const float Tsum = warp_sum(Ta) + (Tin != nullptr ? Tin[t] : 0.0f);
    const float k3 = ra * ra * ra / C * Tsum;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        float vv[8];
        unpack8(va[ch], vv);
#pragma unroll
        for (int k = 0; k < 8; k++) { dva[ch][k] -= k3 * vv[k]; }
        st_f8(dslot + (size_t)t * C + ch * 256 + lane * 8, dva[ch]);
        st_bf8(dslotX + (size_t)t * C + ch * 256 + lane * 8, dva[ch]);
    }
    if constexpr (TWO) {   // slot B's partial: its k3 term waits for the finish
        const float Tbs = warp_sum(Tb);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) { st_f8(pout + (size_t)t * C + ch * 256 + lane * 8, dvb[ch]); }
        if (lane == 0) { Tout[t] = Tbs; }
    }
}

// ----------------------------------------------------------------------------
// v11: v8 (forward, ring gather, site kernel, reductions) with a double-buffered
// q/gamma pass. v5's pass (ncu, the trainer's copy, one slot of 21 readers:
// 78 us, 16% of DRAM, 0.64 issued warps per scheduler) stages a tile, waits for
// it and then computes, with nothing in flight in between, and transposes dsr
// element by element with two divisions each. Here the gather writes dsr as
// (N, H, nrp) already (route_gather_v45_kernel<.., DSR_TH>), so a tile's dsr is
// one contiguous range, and the copies go through cp.async into two stages.

// bf16 (CPT adjacent) -> fp32
template <int CPT> __device__ __forceinline__ void ld_bf_cpt(const bf16 *p, float (&x)[CPT]) {
    if constexpr (CPT == 2) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
        x[0] = f.x; x[1] = f.y;
    } else {
#pragma unroll
        for (int k = 0; k < CPT; k++) { x[k] = __bfloat162float(p[k]); }
    }
}

// Copies one tile of route_param_v11_kernel into a stage (vs (tp, 256 CPT) bf16,
// then ds (tp, H, nrp) fp32): v rows ta .. ta+tn, channels cb0 .. cb0+ncb, and
// dsr rows ta .. ta+tn; the caller commits. vasync: v through 16-byte cp.async
// (one division per chunk, a shift when the block is full); otherwise plain
// loads and stores (C or ncb not a multiple of 8: rows not in 16-byte chunks).
// dsr always goes through cp.async: a position is H nrp floats, a multiple of 16 bytes.
template <int CPT>
__device__ __forceinline__ void param_v11_issue(bf16 *vs, float *ds, const float *dsr, const bf16 *v, int ta, int tn,
                                                int cb0, int ncb, int C, int H, int nrp, bool vasync) {
    constexpr int CB = 256 * CPT, VE = 16 / sizeof(bf16);
    if (vasync) {
        const int nq = ncb / VE, nv = tn * nq;
        for (int q = threadIdx.x; q < nv; q += blockDim.x) {
            const int t = ncb == CB ? q / (CB / VE) : q / nq, col = q - t * nq;
            cp_async16(vs + (size_t)t * CB + col * VE, v + (size_t)(ta + t) * C + cb0 + col * VE);
        }
    } else {
        for (int q = threadIdx.x; q < tn * ncb; q += blockDim.x) {
            const int t = q / ncb, col = q - t * ncb;
            vs[(size_t)t * CB + col] = v[(size_t)(ta + t) * C + cb0 + col];
        }
    }
    const float4 *src = reinterpret_cast<const float4 *>(dsr + dsr_th_at(ta, 0, 0, H, nrp));
    float4 *dst = reinterpret_cast<float4 *>(ds);
    const int n4 = tn * H * nrp / 4;
    for (int i = threadIdx.x; i < n4; i += blockDim.x) { cp_async16(dst + i, src + i); }
}

// q/gamma pass v11: part (P, nr, C) = partition p's sum over its PART_ROWS45
// positions t of dsr[t, h(c), jj] * v_k[t][c], for every reader jj; dsr (N, H,
// nrp) as the v11 gather writes it. Block = 256 threads of CPT adjacent channels
// of one head (256 CPT channels); grid (ceil(C / (256 CPT)), P). The sums are
// v5's: each thread adds its channels over the partition's positions in order,
// RG5 readers at a time in registers, dsr read as float4 broadcasts of 4 readers.
// The positions go in tiles of tp through two shared-memory stages of
// param_v11_smem's size: tile i+1 is issued into one stage (cp.async, its own
// commit group; an empty group after the last tile) while tile i is summed from
// the other, so a tile's copy latency hides behind the previous tile's sums.
// The tiles of all reader groups form one sequence, so the next group's first
// tile is in flight during the last tile of the current group.
// Padding readers jj in [nr, nrp): the gather never writes their dsr entries
// (whatever the buffer holds: NaN where --check poisons it). They are copied
// and summed like the others into acc[r] with j0 + r >= nr, which are never
// stored, and an accumulator takes only its own reader's entries: they cannot
// reach part. force_sync: the plain v copy even where cp.async would do (--check).
template <int CPT>
__global__ void __launch_bounds__(256, 2) route_param_v11_kernel(float *part, const float *__restrict__ dsr,
                                                                const bf16 *__restrict__ v, int nr, int N, int C, int H,
                                                                int tp, int force_sync) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int CB = 256 * CPT, VE = 16 / sizeof(bf16);
    if (nr <= 0) { return; }
    const int nrp = (nr + 3) & ~3, p = blockIdx.y, cb0 = blockIdx.x * CB, HC = C / H;
    const int cl = threadIdx.x * CPT, c = cb0 + cl, hd = c < C ? c / HC : 0;
    const int t0 = p * PART_ROWS45, t1 = min(t0 + PART_ROWS45, N), ncb = min(CB, C - cb0);
    const bool vasync = ncb % VE == 0 && C % VE == 0 && !force_sync;
    // stage s: vs (tp, CB) bf16 at s * stage, then ds (tp, H, nrp); both sizes are multiples of 16 bytes
    const size_t vbytes = (size_t)tp * CB * sizeof(bf16), stage = vbytes + (size_t)tp * H * nrp * sizeof(float);
    param_v11_issue<CPT>(reinterpret_cast<bf16 *>(smem_raw), reinterpret_cast<float *>(smem_raw + vbytes), dsr, v, t0,
                         min(tp, t1 - t0), cb0, ncb, C, H, nrp, vasync);   // tile 0 into stage 0
    cp_async_commit();
    int it = 0;   // tile number over all reader groups: tile it is in stage it & 1
    for (int j0 = 0; j0 < nr; j0 += RG5) {
        float acc[RG5][CPT];
#pragma unroll
        for (int r = 0; r < RG5; r++) {
#pragma unroll
            for (int k = 0; k < CPT; k++) { acc[r][k] = 0.0f; }
        }
        for (int ta = t0; ta < t1; ta += tp, it++) {
            const int tn = min(tp, t1 - ta);
            // the next tile (of this group, or the first of the next) into the other stage, which
            // the last __syncthreads of the previous tile freed
            int tb = ta + tp;
            const bool last_group = j0 + RG5 >= nr;
            if (tb >= t1) { tb = t0; }
            if (!(last_group && ta + tp >= t1)) {
                unsigned char *st = smem_raw + ((it + 1) & 1) * stage;
                param_v11_issue<CPT>(reinterpret_cast<bf16 *>(st), reinterpret_cast<float *>(st + vbytes), dsr, v, tb,
                                     min(tp, t1 - tb), cb0, ncb, C, H, nrp, vasync);
            }
            cp_async_commit();     // empty when there is no next tile
            cp_async_wait<1>();    // this thread's copies of tile it are in
            __syncthreads();       // and every thread's
            if (c < C) {
                const unsigned char *st = smem_raw + (it & 1) * stage;
                const bf16 *vs = reinterpret_cast<const bf16 *>(st);
                const float *ds = reinterpret_cast<const float *>(st + vbytes);
                for (int t = 0; t < tn; t++) {
                    float vv[CPT];
                    ld_bf_cpt<CPT>(vs + (size_t)t * CB + cl, vv);
                    const float *d = ds + dsr_th_at(t, hd, j0, H, nrp);
#pragma unroll
                    for (int r4 = 0; r4 < RG5 / 4; r4++) {
                        if (j0 + 4 * r4 < nr) {   // block-uniform; past nr only padding of the last 4
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
            __syncthreads();       // stage it & 1 is read: tile it + 2 may go there
        }
        if (c < C) {
#pragma unroll
            for (int r = 0; r < RG5; r++) {
                if (j0 + r < nr) {   // the padding readers' accumulators stay here
#pragma unroll
                    for (int k = 0; k < CPT; k++) { part[((size_t)p * nr + j0 + r) * C + c + k] = acc[r][k]; }
                }
            }
        }
    }
}
// Positions per tile of route_param_v11_kernel<CPT> (tp) and its shared memory
// (two stages): the largest power of two up to 32 whose two stages fit in 96 KB,
// so that two blocks share an SM
static size_t param_v11_smem(int CPT, int nr, int H, int *tp) {
    const size_t row = 256 * (size_t)CPT * sizeof(bf16) + (size_t)H * ((nr + 3) & ~3) * sizeof(float);
    *tp = 32;
    while (*tp > 1 && 2 * *tp * row > 96 * 1024) { *tp /= 2; }
    return 2 * *tp * row;
}

// v11's q/gamma pass emulated on the host (--cpu-selftest): route_param_v11_kernel's
// schedule and indexing, statement by statement, the 256 threads of a block in
// turn. A copy lands in its stage at once, but the tile counts as arrived only
// when a cp.async.wait_group 1 covers its commit group; a tile must have arrived
// (and be the expected one) when it is read, and must have been read before its
// stage takes the next one. Stages are filled with NaN before each issue (an
// entry the copies miss reads NaN); dsr holds the gather's (N, H, nrp) layout
// with NaN padding; every partial must be written once, finite and equal to a
// float64 sum (relative 1e-5). tp_force > 0 overrides the tile size.
static bool selftest_v11_param(int C, int H, int nr, int N, int tp_force, bool force_sync, uint64_t seed) {
    const int CPT = (C / H) % 2 == 0 ? 2 : 1, CB = 256 * CPT, VE = 8, NT = 256, HC = C / H;
    const int nrp = (nr + 3) & ~3, NP = (N + PART_ROWS45 - 1) / PART_ROWS45;
    int tp;
    param_v11_smem(CPT, nr, H, &tp);
    if (tp_force > 0) { tp = tp_force; }
    uint64_t rs = seed * 2654435761ull + 1;
    auto rnd = [&]() {   // uniform in [-0.5, 0.5)
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        return (double)(rs >> 11) / 9007199254740992.0 - 0.5;
    };
    std::vector<uint16_t> v((size_t)N * C);
    std::vector<float> dsr((size_t)N * H * nrp, NAN);   // padding readers stay NaN, as the gather leaves them
    for (auto &x : v) { x = f2bf_bits((float)rnd()); }
    for (int t = 0; t < N; t++) {
        for (int jj = 0; jj < nr; jj++) {
            for (int hd = 0; hd < H; hd++) { dsr[dsr_th_at(t, hd, jj, H, nrp)] = (float)rnd(); }
        }
    }
    std::vector<float> part((size_t)NP * nr * C, NAN);
    std::vector<int> wrote((size_t)NP * nr * C, 0);
    const size_t vbytes = (size_t)tp * CB * 2, stage = vbytes + (size_t)tp * H * nrp * 4;
    std::vector<unsigned char> smem(2 * stage);
    const char *why = nullptr;
    for (int p = 0; p < NP && !why; p++) {
        for (int bx = 0; bx * CB < C && !why; bx++) {
            const int cb0 = bx * CB, t0 = p * PART_ROWS45, t1 = std::min(t0 + PART_ROWS45, N), ncb = std::min(CB, C - cb0);
            const bool vasync = ncb % VE == 0 && C % VE == 0 && !force_sync;
            int held[2] = {-1, -1};            // the tile (ta) a stage holds
            bool arrived[2] = {false, false}, read[2] = {true, true};
            std::vector<int> groups;           // committed groups not yet waited for: stage, or -1 (empty)
            auto issue = [&](int s, int ta, int tn) {   // param_v11_issue, every thread
                if (!read[s]) { why = "a stage is overwritten before it was read"; }
                memset(&smem[s * stage], 0xFF, stage);
                held[s] = ta; arrived[s] = false; read[s] = false;
                for (int tid = 0; tid < NT; tid++) {
                    if (vasync) {
                        const int nq = ncb / VE, nv = tn * nq;
                        for (int q = tid; q < nv; q += NT) {
                            const int t = ncb == CB ? q / (CB / VE) : q / nq, col = q - t * nq;
                            memcpy(&smem[s * stage + ((size_t)t * CB + col * VE) * 2],
                                   &v[(size_t)(ta + t) * C + cb0 + col * VE], 16);
                        }
                    } else {
                        for (int q = tid; q < tn * ncb; q += NT) {
                            const int t = q / ncb, col = q - t * ncb;
                            memcpy(&smem[s * stage + ((size_t)t * CB + col) * 2], &v[(size_t)(ta + t) * C + cb0 + col], 2);
                        }
                    }
                    const int n4 = tn * H * nrp / 4;
                    for (int i = tid; i < n4; i += NT) {
                        memcpy(&smem[s * stage + vbytes + (size_t)i * 16], &dsr[dsr_th_at(ta, 0, 0, H, nrp) + (size_t)i * 4],
                               16);
                    }
                }
            };
            auto commit = [&](int s) { groups.push_back(s); };
            issue(0, t0, std::min(tp, t1 - t0));
            commit(0);
            int it = 0;
            for (int j0 = 0; j0 < nr && !why; j0 += RG5) {
                std::vector<float> acc((size_t)NT * RG5 * CPT, 0.0f);
                for (int ta = t0; ta < t1 && !why; ta += tp, it++) {
                    const int tn = std::min(tp, t1 - ta);
                    int tb = ta + tp;
                    const bool last_group = j0 + RG5 >= nr;
                    if (tb >= t1) { tb = t0; }
                    int next = -1;
                    if (!(last_group && ta + tp >= t1)) {
                        next = (it + 1) & 1;
                        issue(next, tb, std::min(tp, t1 - tb));
                    }
                    commit(next);
                    while (groups.size() > 1) {   // cp.async.wait_group 1
                        if (groups.front() >= 0) { arrived[groups.front()] = true; }
                        groups.erase(groups.begin());
                    }
                    const int s = it & 1;
                    if (!arrived[s] || held[s] != ta) { why = "a tile is read before it arrived, or the wrong tile"; break; }
                    for (int tid = 0; tid < NT; tid++) {
                        const int c = cb0 + tid * CPT, hd = c < C ? c / HC : 0;
                        if (c >= C) { continue; }
                        for (int t = 0; t < tn; t++) {
                            float vv[2];
                            for (int k = 0; k < CPT; k++) {
                                uint16_t b;
                                memcpy(&b, &smem[s * stage + ((size_t)t * CB + tid * CPT + k) * 2], 2);
                                vv[k] = bf_bits2f(b);
                            }
                            const float *d = reinterpret_cast<const float *>(&smem[s * stage + vbytes]) +
                                             dsr_th_at(t, hd, j0, H, nrp);
                            float *a = &acc[(size_t)tid * RG5 * CPT];
                            for (int r4 = 0; r4 < RG5 / 4; r4++) {
                                if (j0 + 4 * r4 < nr) {
                                    for (int r = 0; r < 4; r++) {
                                        for (int k = 0; k < CPT; k++) { a[(4 * r4 + r) * CPT + k] += d[4 * r4 + r] * vv[k]; }
                                    }
                                }
                            }
                        }
                    }
                    read[s] = true;   // the trailing __syncthreads
                }
                for (int tid = 0; tid < NT && !why; tid++) {
                    const int c = cb0 + tid * CPT;
                    if (c >= C) { continue; }
                    for (int r = 0; r < RG5; r++) {
                        if (j0 + r < nr) {
                            for (int k = 0; k < CPT; k++) {
                                const size_t o = ((size_t)p * nr + j0 + r) * C + c + k;
                                part[o] = acc[((size_t)tid * RG5 + r) * CPT + k];
                                wrote[o]++;
                            }
                        }
                    }
                }
            }
        }
    }
    double err = 0.0;
    for (int p = 0; p < NP && !why; p++) {
        for (int jj = 0; jj < nr && !why; jj++) {
            for (int c = 0; c < C; c++) {
                const size_t o = ((size_t)p * nr + jj) * C + c;
                double ref = 0.0, mag = 0.0;
                for (int t = p * PART_ROWS45; t < std::min((p + 1) * PART_ROWS45, N); t++) {
                    const double x = (double)dsr[dsr_th_at(t, c / HC, jj, H, nrp)] * bf_bits2f(v[(size_t)t * C + c]);
                    ref += x; mag += fabs(x);
                }
                if (wrote[o] != 1) { why = "a partial is written twice or never"; break; }
                if (!std::isfinite(part[o])) { why = "a partial is not finite"; break; }
                err = std::max(err, fabs(part[o] - ref) / (mag + 1e-30));
            }
        }
    }
    const bool ok = !why && err <= 1e-5;
    printf("  v11 q/gamma pass, host emulation C=%-4d H=%-2d nr=%-2d N=%-3d CPT=%d tp=%-2d%s: max rel err %.1e  %s", C, H, nr, N,
           CPT, tp, force_sync || C % 8 ? " (plain v copy)" : "", err, ok ? "ok" : "FAIL");
    if (why) { printf(" (%s)", why); }
    printf("\n");
    return ok;
}

// ----------------------------------------------------------------------------
// v15: the gather with its position-independent products on tensor cores

// Two of the gather's four products per (reader j, channel) involve qg_j, which does
// not depend on the position, so over a tile of 8 positions they are small matrix
// products, per head (block-diagonal in the heads):
//   E^T (readers x positions) = QG (readers x C) V^T (C x positions),   e = qg_j . v
//   U^T (C x positions)       = QG^T (C x readers) DS^T (readers x positions),
//                               U = sum_j ds_j qg_j  (dv += r U, and u . v = U . v)
// They run on mma.sync m16n8k16 (bf16 in, fp32 accumulation). qg and ds are fp32: each
// goes in as two bf16 parts, hi = bf16(x) and lo = bf16(x - hi) (16 bits of mantissa);
// v is bf16 already. E takes hi and lo of qg (2 products), U hi x hi, hi x lo, lo x hi (3).
// What stays per position on the CUDA cores: p = G_j . v (G varies with t), the
// weight a = exp(r e - lse) and ds = a (p - S), and dv += a G_j.
//
// Fragment layouts of m16n8k16 (g = lane / 4, q = lane % 4; the low half of a
// register holds the element of the lower column, or row for B):
//   A 16x16: a0 = A[g][2q..2q+1], a1 = A[g+8][2q..], a2 = A[g][2q+8..], a3 = A[g+8][2q+8..]
//   B 16x8 : b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g]
//   D 16x8 : d0, d1 = D[g][2q..2q+1], d2, d3 = D[g+8][2q..2q+1]
// A's element (row, col) of register reg, half hf, in lane's fragment:
__host__ __device__ inline void frag_a_rc(int lane, int reg, int hf, int &row, int &col) {
    row = (lane >> 2) + (reg & 1) * 8;
    col = 2 * (lane & 3) + hf + (reg >> 1) * 8;
}

// The A fragments of a slot, laid out as the lanes load them (one uint4 a lane per
// product), built once per backward from qg and the slot's readers
// (route_qfrag15_kernel), 16 C uint4 a slot (32 KB at C = 512):
//   E's, at qf15_e(hl, mt, kg, lane): A[row jj][col c] = part hl of qg_{readers[jj]}[c],
//        readers jj = 16 mt .. (two m-tiles), channels c = 16 kg ..;
//   U's, at qf15_u(hl, mg, ks, lane): A[row c][col jj], channels c = 16 mg .., readers jj = 16 ks ..;
// part 0 = hi, 1 = lo; 0 for readers jj >= nr.
#define V15_NRMAX 32   // readers a slot: two m-tiles
__host__ __device__ inline int qf15_e(int hl, int mt, int kg, int lane, int C) { return ((hl * 2 + mt) * (C / 16) + kg) * 32 + lane; }
__host__ __device__ inline int qf15_u(int hl, int mg, int ks, int lane, int C) { return 8 * C + ((hl * (C / 16) + mg) * 2 + ks) * 32 + lane; }
// uint4 i of a slot's fragments: which matrix (u), part, row and column of each of its 8 elements
__host__ __device__ inline void qf15_elem(int i, int C, int e8, bool &u, int &hl, int &jj, int &c) {
    const int lane = i & 31, nk = C / 16;
    int row, col;
    frag_a_rc(lane, e8 >> 1, e8 & 1, row, col);
    u = i >= 8 * C;
    int f = (u ? i - 8 * C : i) >> 5;
    if (!u) {   // ((hl * 2 + mt) * nk + kg)
        const int kg = f % nk; f /= nk;
        const int mt = f & 1;
        hl = f >> 1; jj = 16 * mt + row; c = 16 * kg + col;
    } else {    // ((hl * nk + mg) * 2 + ks)
        const int ks = f & 1; f >>= 1;
        const int mg = f % nk;
        hl = f / nk; c = 16 * mg + row; jj = 16 * ks + col;
    }
}
__host__ __device__ inline void bf16_split(float x, float &hi, float &lo) {   // x ~ hi + lo, each a bf16 value
#ifdef __CUDA_ARCH__
    hi = __bfloat162float(__float2bfloat16_rn(x));
    lo = __bfloat162float(__float2bfloat16_rn(x - hi));
#else
    hi = bf_bits2f(f2bf_bits(x));
    lo = bf_bits2f(f2bf_bits(x - hi));
#endif
}

// qf (J, 16 C) uint4: every slot's fragments (above). Grid (16 C / 256, J).
__global__ void route_qfrag15_kernel(uint4 *qf, const float *__restrict__ qg, const int *__restrict__ rd,
                                     const int *__restrict__ nrs, int J, int C) {
    const int k = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 16 * C) { return; }
    const int nr = nrs[k];
    uint32_t w[4];
#pragma unroll
    for (int reg = 0; reg < 4; reg++) {
        uint16_t hv[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            bool u;
            int hl, jj, c;
            qf15_elem(i, C, 2 * reg + hf, u, hl, jj, c);
            const float x = jj < nr ? qg[(size_t)rd[(size_t)k * J + jj] * C + c] : 0.0f;
            float hi, lo;
            bf16_split(x, hi, lo);
            const bf16 b = __float2bfloat16_rn(hl ? lo : hi);
            hv[hf] = *reinterpret_cast<const uint16_t *>(&b);
        }
        w[reg] = (uint32_t)hv[0] | ((uint32_t)hv[1] << 16);
    }
    qf[(size_t)k * 16 * C + i] = make_uint4(w[0], w[1], w[2], w[3]);
}

// d (16x8 fp32) += a (16x16 bf16) b (16x8 bf16)
__device__ __forceinline__ void mma15(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}
// x0, x1 (fp32) -> bf16x2 hi and lo parts (x0 in the low halves)
__device__ __forceinline__ void split2_bf16(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&l);
}

// The block's shapes and shared memory. A block is 8 warps and 8 positions t0 .. t0+7:
// warp w runs position t0 + w's reader loop (as v12, one warp per position), and, in
// the two matrix phases, channels CG w .. CG (w+1) (CG = C / 8) of all 8 positions.
// Shared memory, in bytes from the start: the G ring (v8's, ring_smem<C>(); after the
// loop it holds U), then
//   epart [H][WPH][NRMAX][8] fp32: E^T per head, one partial per warp of the head (WPH of them)
//   xs    [8][NRMAX][H] float2:    x = (r e - lse) log2 e and S per (position, reader, head)
//   dss   [8][DPOS] fp32:          ds per position, [head][reader] at h DSTR + jj (zero past nr)
//   us    [8][UST] fp32 (in the ring): U per position
template <int C, int H> struct V15 {
    static constexpr int NCH = C / 256, HC = C / H, CG = C / 8, KS = CG / 16;
    static constexpr int HPG = HC >= CG ? 1 : CG / HC;   // heads inside a warp's channels
    static constexpr int WPH = HC >= CG ? HC / CG : 1;   // warps over one head
    static constexpr int NRMAX = V15_NRMAX, DSTR = NRMAX + 2, DPOS = H * DSTR + 8, UST = C + 4;
    static constexpr size_t RING = ring_smem<C>(), EPART = (size_t)H * WPH * NRMAX * 8 * 4;
    static constexpr size_t XS = (size_t)8 * NRMAX * H * 8, DS = (size_t)8 * DPOS * 4;
    static constexpr size_t SMEM = RING + EPART + XS + DS;
    static_assert(C % 256 == 0 && HC % 16 == 0 && (HC % CG == 0 || CG % HC == 0), "v15's shapes");
    static_assert((size_t)8 * UST * 4 <= RING, "U fits in the ring");
};
template <int C, int H> constexpr size_t v15_smem() { return V15<C, H>::SMEM; }

// Gradient of slot k from its nr readers (nr <= 32), as v12's (same outputs, dsr as
// (N, H, nrp)), with E and U on tensor cores (above). qf: the slot's fragments.
// Phases (barriers between): 1. E^T on tensor cores into epart; 2. x and S into xs
// (lse and S read here, coalesced); 3. each warp's reader loop over its position (G rows
// through the ring; p, a, ds, dv += a G; ds into dss); 4. U^T on tensor cores into us;
// 5. each warp finishes its position: dv += r U - (r^3 / C) (U . v) v, the stores, ds r.
template <int C, int H>
__global__ void __launch_bounds__(256, C <= 512 ? 3 : 2)
route_gather_v15_kernel(float *dslot, bf16 *dslotX, float *dsr, const bf16 *__restrict__ v,
                        const float *__restrict__ rk, const bf16 *__restrict__ Gall, const float *__restrict__ Sall,
                        const float *__restrict__ lseall, const int *__restrict__ readers, int nr,
                        const uint4 *__restrict__ qf, int N, unsigned NC) {
    using T = V15<C, H>;
    constexpr int NCH = T::NCH, HC = T::HC, CG = T::CG, KS = T::KS, HPG = T::HPG, WPH = T::WPH;
    constexpr int NRMAX = T::NRMAX, DSTR = T::DSTR, DPOS = T::DPOS, UST = T::UST;
    constexpr float LOG2E_F = 1.4426950408889634f;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int t0 = blockIdx.x * 8, t = t0 + w, cw = w * CG;
    const bool live = t < N;   // warp-uniform; a warp past N still takes part in the matrix phases
    float *epart = reinterpret_cast<float *>(ring_smem_raw + T::RING);
    float2 *xs = reinterpret_cast<float2 *>(ring_smem_raw + T::RING + T::EPART);
    float *dss = reinterpret_cast<float *>(ring_smem_raw + T::RING + T::EPART + T::XS);
    float *us = reinterpret_cast<float *>(ring_smem_raw);
    const int mtn = (nr + 15) >> 4;   // m-tiles of readers: 1 or 2

    // this warp's position: v in fp32, r, its ds rows zeroed; the ring's first rows in flight
    float vf[NCH][8], dv[NCH][8];
    const unsigned gi = g12_row((unsigned)(live ? t : 0), lane, C);
    const float r = live ? rk[t] : 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        if (live) { unpack8(ld_raw(v + (gi + ch * 256)), vf[ch]); }
        else {
#pragma unroll
            for (int k = 0; k < 8; k++) { vf[ch][k] = 0.0f; }
        }
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] = 0.0f; }
    }
    for (int i = lane; i < DPOS; i += 32) { dss[w * DPOS + i] = 0.0f; }
    const int jl = lane < nr ? __ldg(readers + lane) : 0;   // lane l holds readers[l]
    const uint32_t sg = (uint32_t)__cvta_generic_to_shared(ring_packs<C>() + lane);
    const uint4 *ringl = ring_packs<C>() + lane;
    auto issue = [&](int i) {   // reader i's G row (this lane's packs) into stage i % ROUTE_RING; zero bytes past nr
        const unsigned j = (unsigned)__shfl_sync(0xffffffffu, jl, g12_src_lane(i));
        const uint32_t sz = i < nr ? 16u : 0u, st = (uint32_t)g12_stage(i);
        const unsigned gg = g12_add(gi, j, NC);
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            cp_async16z(sg + (st * NCH + ch) * 32 * (uint32_t)sizeof(uint4), Gall + (gg + ch * 256), sz);
        }
        cp_async_commit();
    };
    if (live) {
        for (int i = 0; i < ROUTE_RING - 1; i++) { issue(i); }
    }

    // 1. E^T = QG V^T over this warp's channels: per m-tile of 16 readers, the head(s) of
    // its channels; B = v of positions t0 + g (zeros past N)
    {
        uint32_t bv[KS][2];
        const int tb = t0 + g;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const bf16 *vp = v + (size_t)(tb < N ? tb : 0) * C + cw + ks * 16 + 2 * q;
            bv[ks][0] = tb < N ? __ldg(reinterpret_cast<const unsigned *>(vp)) : 0u;
            bv[ks][1] = tb < N ? __ldg(reinterpret_cast<const unsigned *>(vp + 8)) : 0u;
        }
        for (int mt = 0; mt < mtn; mt++) {
            float acc[HPG][4];
#pragma unroll
            for (int hh = 0; hh < HPG; hh++) { acc[hh][0] = acc[hh][1] = acc[hh][2] = acc[hh][3] = 0.0f; }
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                const int hh = HPG > 1 ? ks * 16 / HC : 0;
                const int kg = cw / 16 + ks;
                const uint4 ah = __ldg(qf + qf15_e(0, mt, kg, lane, C)), al = __ldg(qf + qf15_e(1, mt, kg, lane, C));
                mma15(acc[hh], ah, bv[ks][0], bv[ks][1]);
                mma15(acc[hh], al, bv[ks][0], bv[ks][1]);
            }
#pragma unroll
            for (int hh = 0; hh < HPG; hh++) {
                const int h = cw / HC + hh, wp = HPG > 1 ? 0 : (cw % HC) / CG;
                float *ep = epart + ((size_t)(h * WPH + wp) * NRMAX + mt * 16) * 8;
                *reinterpret_cast<float2 *>(ep + g * 8 + 2 * q) = make_float2(acc[hh][0], acc[hh][1]);
                *reinterpret_cast<float2 *>(ep + (g + 8) * 8 + 2 * q) = make_float2(acc[hh][2], acc[hh][3]);
            }
        }
    }
    __syncthreads();
    // 2. x = (r e - lse) log2 e and S per (position, reader, head), e summed over the head's warps
    for (int i = threadIdx.x; i < 8 * H * nr; i += 256) {
        const int h = i % H, tp = (i / H) % 8, jj = i / (8 * H), tt = t0 + tp;
        if (tt >= N) { continue; }
        float e = 0.0f;
#pragma unroll
        for (int wp = 0; wp < WPH; wp++) { e += epart[((h * WPH + wp) * NRMAX + jj) * 8 + tp]; }
        const size_t row = ((size_t)__ldg(readers + jj) * N + tt) * H + h;
        const float rt = __ldg(rk + tt);
        xs[(tp * NRMAX + jj) * H + h] = make_float2(fmaf(rt * LOG2E_F, e, -__ldg(lseall + row) * LOG2E_F), __ldg(Sall + row));
    }
    __syncthreads();
    // 3. the reader loop of this warp's position
    if (live) {
        const float2 *xw = xs + w * NRMAX * H;
        float *dw = dss + w * DPOS;
        for (int jj = 0; jj < nr; jj++) {
            uint4 Graw[NCH];
            float G[NCH][8], p[NCH];
            cp_async_wait<ROUTE_RING - 2>();   // reader jj's row is in (this lane's packs)
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) { Graw[ch] = ringl[(g12_stage(jj) * NCH + ch) * 32]; }
            issue(jj + ROUTE_RING - 1);        // into the stage of reader jj - 1, which this lane has read
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                unpack8_bits(Graw[ch], G[ch]);
                float pd = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) { pd = fmaf(G[ch][k], vf[ch][k], pd); }
                p[ch] = pd;
            }
            head_sum<C, H>(p);
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const int h = head_of<C, H>(ch, lane);
                const float2 x = xw[jj * H + h];
                const float av = exp2f(x.x), ds = av * (p[ch] - x.y);   // a = exp(r e - lse), ds = a (p - S)
#pragma unroll
                for (int k = 0; k < 8; k++) { dv[ch][k] = fmaf(av, G[ch][k], dv[ch][k]); }
                if (head_first<C, H>(ch, lane)) { dw[h * DSTR + jj] = ds; }
            }
        }
        cp_async_wait<0>();   // the zero-byte copies past nr (the ring holds U next)
    }
    __syncthreads();
    // 4. U^T = QG^T DS^T over this warp's channels, per 16 channels (one head)
#pragma unroll
    for (int mc = 0; mc < KS; mc++) {
        const int c0 = cw + mc * 16, h = c0 / HC;
        float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int ks = 0; ks < mtn; ks++) {
            const float *dp = dss + g * DPOS + h * DSTR + ks * 16 + 2 * q;   // B[reader][position g]
            const float2 d0 = *reinterpret_cast<const float2 *>(dp), d1 = *reinterpret_cast<const float2 *>(dp + 8);
            uint32_t bh0, bl0, bh1, bl1;
            split2_bf16(d0.x, d0.y, bh0, bl0);
            split2_bf16(d1.x, d1.y, bh1, bl1);
            const uint4 ah = __ldg(qf + qf15_u(0, c0 / 16, ks, lane, C)), al = __ldg(qf + qf15_u(1, c0 / 16, ks, lane, C));
            mma15(u, ah, bh0, bh1);
            mma15(u, ah, bl0, bl1);
            mma15(u, al, bh0, bh1);
        }
        us[(2 * q) * UST + c0 + g] = u[0];
        us[(2 * q + 1) * UST + c0 + g] = u[1];
        us[(2 * q) * UST + c0 + g + 8] = u[2];
        us[(2 * q + 1) * UST + c0 + g + 8] = u[3];
    }
    __syncthreads();
    // 5. this warp's position: k_i = gamma r_i v_i, so dv = sum_j a_j G_j + r U - (r^3 / C) (U . v) v
    if (!live) { return; }
    float U[NCH][8], uvl = 0.0f;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        ld_f8(us + w * UST + ch * 256 + lane * 8, U[ch]);
#pragma unroll
        for (int k = 0; k < 8; k++) { uvl = fmaf(U[ch][k], vf[ch][k], uvl); }
    }
    const float k3 = r * r * r / C * warp_sum(uvl);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
#pragma unroll
        for (int k = 0; k < 8; k++) { dv[ch][k] += r * U[ch][k] - k3 * vf[ch][k]; }
        st_f8(dslot + (gi + ch * 256), dv[ch]);
        st_bf8(dslotX + (gi + ch * 256), dv[ch]);
    }
    const int nrp = (nr + 3) & ~3;   // ds r for the q/gamma pass: (N, H, nrp), the padding not written
    if (lane < nr) {
        for (int h = 0; h < H; h++) { dsr[((size_t)t * H + h) * nrp + lane] = dss[w * DPOS + h * DSTR + lane] * r; }
    }
}

// --cpu-selftest of v15: the kernel's phases for one or two blocks, lane by lane where
// the tensor cores run (the A fragments as the prep builds them, each mma emulated from
// the fragment layouts above: every element of A and B taken from exactly one lane and
// register, D handed back the same way; epart, xs, dss and us indexed as in the kernel),
// position by position in the reader loop (v12's), against the gather's sums in float64.
static bool v15_emu_mma(float (&d)[32][4], const uint32_t (&a)[32][4], const uint32_t (&b)[32][2]) {
    double A[16][16], B[16][8];
    int na[16][16] = {}, nb[16][8] = {};
    for (int lane = 0; lane < 32; lane++) {
        for (int reg = 0; reg < 4; reg++) {
            for (int hf = 0; hf < 2; hf++) {
                int row, col;
                frag_a_rc(lane, reg, hf, row, col);
                A[row][col] = bf_bits2f((uint16_t)(a[lane][reg] >> (16 * hf)));
                na[row][col]++;
            }
        }
        for (int reg = 0; reg < 2; reg++) {
            for (int hf = 0; hf < 2; hf++) {
                const int k = 2 * (lane & 3) + hf + 8 * reg, n = lane >> 2;
                B[k][n] = bf_bits2f((uint16_t)(b[lane][reg] >> (16 * hf)));
                nb[k][n]++;
            }
        }
    }
    bool once = true;
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < 16; j++) { once = once && na[i][j] == 1; }
        for (int j = 0; j < 8; j++) { once = once && nb[i][j] == 1; }
    }
    for (int lane = 0; lane < 32; lane++) {
        for (int i = 0; i < 4; i++) {
            const int row = (lane >> 2) + 8 * (i >> 1), col = 2 * (lane & 3) + (i & 1);
            double s = 0;
            for (int k = 0; k < 16; k++) { s += A[row][k] * B[k][col]; }
            d[lane][i] += (float)s;
        }
    }
    return once;
}
static uint32_t v15_bits2(float x0, float x1) { return (uint32_t)f2bf_bits(x0) | ((uint32_t)f2bf_bits(x1) << 16); }

// One slot's gather for the lane emulations (v15, v17): nr readers, increasing, among J sites;
// v (N, C) and G (J, N, C) bf16 values, qg (J, C), S and lse (J, N, H), r of v's rows
struct GatherCase {
    int C, H, nr, N, J;
    std::vector<int> readers;
    std::vector<float> v, r, G, S, lse, qg;
};
static double lcg_uni(uint64_t *rng) {   // uniform in [-1, 1)
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((*rng >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1;
}
static GatherCase gather_case(int C, int H, int nr, int N, int J, uint64_t *rng) {
    GatherCase g{C, H, nr, N, J, std::vector<int>(nr), {}, {}, {}, {}, {}, {}};
    for (int i = 0, j = 0; i < nr; j++) { if (J - j <= nr - i || lcg_uni(rng) > 0) { g.readers[i++] = j; } }
    g.v.resize((size_t)N * C); g.r.resize(N); g.G.resize((size_t)J * N * C);
    g.S.resize((size_t)J * N * H); g.lse.resize((size_t)J * N * H); g.qg.resize((size_t)J * C);
    for (auto &x : g.v) { x = (float)bfr(lcg_uni(rng)); }
    for (auto &x : g.G) { x = (float)bfr(0.3 * lcg_uni(rng)); }
    for (auto &x : g.qg) { x = (float)(0.4 * lcg_uni(rng)); }
    for (int t = 0; t < N; t++) {
        double ss = 0;
        for (int c = 0; c < C; c++) { ss += (double)g.v[(size_t)t * C + c] * g.v[(size_t)t * C + c]; }
        g.r[t] = (float)(1.0 / sqrt(ss / C + 1e-6));
    }
    for (auto &x : g.S) { x = (float)(0.2 * lcg_uni(rng)); }
    for (auto &x : g.lse) { x = (float)(1.0 + lcg_uni(rng)); }
    return g;
}
// The gather's sums at position t in float64: dv (C) = sum_j [r ds_j qg_j + a_j G_j] - (r^3 / C) (sum_j u_j . v) v,
// and dsr (nr H, reader-major) = ds_j r per (reader, head)
static void gather_ref64(const GatherCase &g, int t, std::vector<double> &dv, std::vector<double> &dsr) {
    const int C = g.C, H = g.H, HC = C / H, N = g.N;
    const float *vt = g.v.data() + (size_t)t * C;
    const double r = g.r[t];
    dv.assign(C, 0.0);
    dsr.assign((size_t)g.nr * H, 0.0);
    double uv = 0;
    for (int jj = 0; jj < g.nr; jj++) {
        const int j = g.readers[jj];
        const float *Gr = g.G.data() + ((size_t)j * N + t) * C, *qj = g.qg.data() + (size_t)j * C;
        for (int h = 0; h < H; h++) {
            double e = 0, p = 0;
            for (int c = h * HC; c < (h + 1) * HC; c++) { e += (double)qj[c] * vt[c]; p += (double)Gr[c] * vt[c]; }
            const size_t row = ((size_t)j * N + t) * H + h;
            const double a = exp(r * e - g.lse[row]), ds = a * (p - g.S[row]);
            for (int c = h * HC; c < (h + 1) * HC; c++) { dv[c] += r * ds * qj[c] + a * Gr[c]; }
            uv += ds * e;
            dsr[(size_t)jj * H + h] = ds * r;
        }
    }
    for (int c = 0; c < C; c++) { dv[c] -= r * r * r / C * uv * vt[c]; }
}

template <int C, int H> static bool selftest_v15_shape(int nr, int N, uint64_t *rng) {
    using T = V15<C, H>;
    constexpr int NCH = T::NCH, HC = T::HC, CG = T::CG, KS = T::KS, HPG = T::HPG, WPH = T::WPH;
    constexpr int NRMAX = T::NRMAX, DSTR = T::DSTR, DPOS = T::DPOS, UST = T::UST;
    (void)NCH;
    const GatherCase gc = gather_case(C, H, nr, N, nr + 3, rng);
    const std::vector<int> &readers = gc.readers;
    const std::vector<float> &v = gc.v, &r = gc.r, &G = gc.G, &S = gc.S, &lse = gc.lse, &qg = gc.qg;
    // the slot's fragments, as route_qfrag15_kernel builds them
    std::vector<uint32_t> qf((size_t)16 * C * 4);
    for (int i = 0; i < 16 * C; i++) {
        for (int reg = 0; reg < 4; reg++) {
            uint32_t wv = 0;
            for (int hf = 0; hf < 2; hf++) {
                bool u;
                int hl, jj, c;
                qf15_elem(i, C, 2 * reg + hf, u, hl, jj, c);
                const float x = jj < nr ? qg[(size_t)readers[jj] * C + c] : 0.0f;
                float hi, lo;
                bf16_split(x, hi, lo);
                wv |= (uint32_t)f2bf_bits(hl ? lo : hi) << (16 * hf);
            }
            qf[(size_t)i * 4 + reg] = wv;
        }
    }
    auto frag = [&](int idx, uint32_t (&a)[32][4], int lane) { for (int k = 0; k < 4; k++) { a[lane][k] = qf[(size_t)idx * 4 + k]; } };
    const int mtn = (nr + 15) >> 4;
    bool once = true;
    double num = 0, den = 0, dnum = 0, dden = 0;
    for (int t0 = 0; t0 < N; t0 += 8) {
        std::vector<float> epart((size_t)H * WPH * NRMAX * 8, NAN), dss((size_t)8 * DPOS, 0.0f), us((size_t)8 * UST, NAN);
        std::vector<float> xsx((size_t)8 * NRMAX * H, NAN), xsS((size_t)8 * NRMAX * H, NAN);
        // 1. E^T
        for (int w = 0; w < 8; w++) {
            const int cw = w * CG;
            uint32_t bv[KS][32][2];
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, q = lane & 3, tb = t0 + g;
                for (int ks = 0; ks < KS; ks++) {
                    const size_t o = (size_t)tb * C + cw + ks * 16 + 2 * q;
                    bv[ks][lane][0] = tb < N ? v15_bits2(v[o], v[o + 1]) : 0u;
                    bv[ks][lane][1] = tb < N ? v15_bits2(v[o + 8], v[o + 9]) : 0u;
                }
            }
            for (int mt = 0; mt < mtn; mt++) {
                float acc[HPG][32][4] = {};
                for (int ks = 0; ks < KS; ks++) {
                    const int hh = HPG > 1 ? ks * 16 / HC : 0, kg = cw / 16 + ks;
                    uint32_t ah[32][4], al[32][4];
                    for (int lane = 0; lane < 32; lane++) { frag(qf15_e(0, mt, kg, lane, C), ah, lane); frag(qf15_e(1, mt, kg, lane, C), al, lane); }
                    once &= v15_emu_mma(acc[hh], ah, bv[ks]);
                    once &= v15_emu_mma(acc[hh], al, bv[ks]);
                }
                for (int hh = 0; hh < HPG; hh++) {
                    const int h = cw / HC + hh, wp = HPG > 1 ? 0 : (cw % HC) / CG;
                    float *ep = epart.data() + ((size_t)(h * WPH + wp) * NRMAX + mt * 16) * 8;
                    for (int lane = 0; lane < 32; lane++) {
                        const int g = lane >> 2, q = lane & 3;
                        ep[g * 8 + 2 * q] = acc[hh][lane][0]; ep[g * 8 + 2 * q + 1] = acc[hh][lane][1];
                        ep[(g + 8) * 8 + 2 * q] = acc[hh][lane][2]; ep[(g + 8) * 8 + 2 * q + 1] = acc[hh][lane][3];
                    }
                }
            }
        }
        // 2. x and S
        for (int i = 0; i < 8 * H * nr; i++) {
            const int h = i % H, tp = (i / H) % 8, jj = i / (8 * H), tt = t0 + tp;
            if (tt >= N) { continue; }
            float e = 0.0f;
            for (int wp = 0; wp < WPH; wp++) { e += epart[((h * WPH + wp) * NRMAX + jj) * 8 + tp]; }
            const size_t row = ((size_t)readers[jj] * N + tt) * H + h;
            xsx[(tp * NRMAX + jj) * H + h] = fmaf(r[tt] * 1.4426950408889634f, e, -lse[row] * 1.4426950408889634f);
            xsS[(tp * NRMAX + jj) * H + h] = S[row];
        }
        // 3. the reader loops
        std::vector<float> dvG((size_t)8 * C, 0.0f);
        for (int w = 0; w < 8 && t0 + w < N; w++) {
            const int t = t0 + w;
            for (int jj = 0; jj < nr; jj++) {
                const float *Gr = G.data() + ((size_t)readers[jj] * N + t) * C;
                for (int h = 0; h < H; h++) {
                    float p = 0.0f;
                    for (int c = h * HC; c < (h + 1) * HC; c++) { p += Gr[c] * v[(size_t)t * C + c]; }
                    const float av = exp2f(xsx[(w * NRMAX + jj) * H + h]), ds = av * (p - xsS[(w * NRMAX + jj) * H + h]);
                    for (int c = h * HC; c < (h + 1) * HC; c++) { dvG[(size_t)w * C + c] += av * Gr[c]; }
                    dss[w * DPOS + h * DSTR + jj] = ds;
                }
            }
        }
        // 4. U^T
        for (int w = 0; w < 8; w++) {
            const int cw = w * CG;
            for (int mc = 0; mc < KS; mc++) {
                const int c0 = cw + mc * 16, h = c0 / HC;
                float u[32][4] = {};
                for (int ks = 0; ks < mtn; ks++) {
                    uint32_t bh[32][2], bl[32][2], ah[32][4], al[32][4];
                    for (int lane = 0; lane < 32; lane++) {
                        const int g = lane >> 2, q = lane & 3;
                        const float *dp = dss.data() + g * DPOS + h * DSTR + ks * 16 + 2 * q;
                        for (int reg = 0; reg < 2; reg++) {
                            float h0, l0, h1, l1;
                            bf16_split(dp[8 * reg], h0, l0);
                            bf16_split(dp[8 * reg + 1], h1, l1);
                            bh[lane][reg] = v15_bits2(h0, h1);
                            bl[lane][reg] = v15_bits2(l0, l1);
                        }
                        frag(qf15_u(0, c0 / 16, ks, lane, C), ah, lane);
                        frag(qf15_u(1, c0 / 16, ks, lane, C), al, lane);
                    }
                    once &= v15_emu_mma(u, ah, bh);
                    once &= v15_emu_mma(u, ah, bl);
                    once &= v15_emu_mma(u, al, bh);
                }
                for (int lane = 0; lane < 32; lane++) {
                    const int g = lane >> 2, q = lane & 3;
                    us[(2 * q) * UST + c0 + g] = u[lane][0]; us[(2 * q + 1) * UST + c0 + g] = u[lane][1];
                    us[(2 * q) * UST + c0 + g + 8] = u[lane][2]; us[(2 * q + 1) * UST + c0 + g + 8] = u[lane][3];
                }
            }
        }
        // 5. finish, against the float64 sums
        for (int w = 0; w < 8 && t0 + w < N; w++) {
            const int t = t0 + w;
            const float *vt = v.data() + (size_t)t * C;
            double uv = 0;
            for (int c = 0; c < C; c++) { uv += (double)us[w * UST + c] * vt[c]; }
            const double k3 = (double)r[t] * r[t] * r[t] / C * uv;
            std::vector<double> ref, refdsr;
            gather_ref64(gc, t, ref, refdsr);
            for (int jj = 0; jj < nr; jj++) {
                for (int h = 0; h < H; h++) {
                    const double got = dss[w * DPOS + h * DSTR + jj] * r[t], x = refdsr[(size_t)jj * H + h];
                    dnum = std::max(dnum, fabs(got - x)); dden = std::max(dden, fabs(x));
                }
            }
            for (int c = 0; c < C; c++) {
                const double x = ref[c];
                const double got = dvG[(size_t)w * C + c] + (double)r[t] * us[w * UST + c] - k3 * vt[c];
                num = std::max(num, fabs(got - x)); den = std::max(den, fabs(x));
            }
        }
    }
    const double err = num / den, derr = dnum / dden;
    const bool ok = once && err < 1e-4 && derr < 1e-4;
    printf("  v15 gather, lane emulation C=%-4d H=%-2d nr=%-2d N=%-2d: dslot rel %.1e, ds r rel %.1e%s  %s\n", C, H, nr, N,
           err, derr, once ? "" : " (a fragment element taken twice or never)", ok ? "ok" : "FAIL");
    return ok;
}
static bool selftest_v15(uint64_t seed) {
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 5;
    bool ok = true;
    ok &= selftest_v15_shape<512, 8>(25, 13, &rng);
    ok &= selftest_v15_shape<512, 8>(16, 8, &rng);
    ok &= selftest_v15_shape<512, 8>(1, 9, &rng);
    ok &= selftest_v15_shape<512, 1>(17, 11, &rng);
    ok &= selftest_v15_shape<512, 16>(32, 16, &rng);
    ok &= selftest_v15_shape<512, 2>(5, 8, &rng);
    ok &= selftest_v15_shape<1024, 8>(20, 10, &rng);
    ok &= selftest_v15_shape<1024, 1>(9, 8, &rng);
    ok &= selftest_v15_shape<1024, 16>(31, 12, &rng);
    return ok;
}

// ----------------------------------------------------------------------------
// v16: v14 with the q/gamma pass on tensor cores

// Per head, the pass is a matrix product: QV^T (readers x channels) = DSR^T (readers x
// positions) V (positions x channels), summed over a partition of positions. v11's
// pass runs it on the CUDA cores (0.99 ms for the 25 slots at 100M, 3.7x its byte
// floor in session 9); here on mma.sync m16n8k16: M = readers (two m-tiles, nr <= 32),
// N = channels (warp w: channels 64 w .. of the block's 512), K = positions (16 a
// stage). ds r is fp32: it goes in as two bf16 parts, hi and lo (2 products, 16 bits);
// v is bf16 already and comes through ldmatrix.trans. Same partials as v11: part
// (P, nr, C), but over partitions of v16_rows positions (P = ceil(N / v16_rows)): 256 by
// default; V16_ROWS=128 (environment, at least 128: the partials' buffer) for the bench of another.
static int v16_rows = 256;
static int v17_np = 2;   // v17's positions a warp (1 or 2; env V17_NP)
static int v17_ran = 0, v17_fell = 0;   // slots v17's kernel took, and those left to v12's gather
#define V16_TP 16   // positions a stage (one k-step); two stages
// ds row stride in shared memory (floats): H nrp, padded to 4 mod 32 so that a
// fragment's 8 readers x 4 positions hit 32 distinct banks
__host__ __device__ inline int v16_ps(int H, int nrp) { const int hn = H * nrp; return hn + (((4 - hn) % 32) + 32) % 32; }
__host__ __device__ inline size_t v16_stage(int C, int H, int nr) {
    const int CB = C < 512 ? C : 512, nrp = (nr + 3) & ~3;
    return (size_t)V16_TP * (CB + 8) * 2 + (size_t)V16_TP * v16_ps(H, nrp) * 4;
}
static size_t v16_smem(int C, int H, int nr) { return 2 * v16_stage(C, H, nr); }
// which shapes it takes: 64-channel warps inside the heads' 8-channel n-tiles, two m-tiles of readers
static bool v16_fits(int C, int H, int nr) { return C % 64 == 0 && (C / H) % 8 == 0 && nr >= 1 && nr <= 32 && v16_smem(C, H, nr) <= 200 * 1024; }

__device__ __forceinline__ void ldsm_x4_t16(uint32_t (&r)[4], const bf16 *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ void mma16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// part (P, nr, C): partition p's sum over its positions t of dsr[t, h(c), jj] * v_k[t][c].
// Grid (ceil(C / 512), P), 256 threads (two blocks an SM); positions in stages of V16_TP through two stages of
// shared memory (cp.async; zeros past the partition). A (readers x positions) for head h,
// m-tile mt: a0 = (reader 16 mt + g, positions 2q, 2q+1), a1 = reader + 8, a2 = positions + 8,
// a3 = both (the fragment layout of v15); readers past nr are zeros (dsr's padding readers
// [nr, nrp) hold whatever the buffer held and are never read). B (positions x channels) =
// the stage's v rows by ldmatrix.trans, two n-tiles of 8 channels each.
__global__ void __launch_bounds__(256, 2) route_param_v16_kernel(float *part, const float *__restrict__ dsr,
                                                                const bf16 *__restrict__ v, int nr, int N, int C, int H,
                                                                int rows) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int nrp = (nr + 3) & ~3, HN = H * nrp, PS = v16_ps(H, nrp), HC = C / H;
    const int cb0 = blockIdx.x * 512, CB = min(512, C - cb0), LDV = CB + 8, p = blockIdx.y;
    const int t0 = p * rows, t1 = min(t0 + rows, N), mtn = (nr + 15) >> 4, cw = w * 64;
    const size_t vbytes = (size_t)V16_TP * LDV * 2, stage = v16_stage(C, H, nr);
    auto vs_of = [&](int s) { return reinterpret_cast<bf16 *>(smem_raw + s * stage); };
    auto ds_of = [&](int s) { return reinterpret_cast<float *>(smem_raw + s * stage + vbytes); };
    auto issue = [&](int s, int ta) {   // positions ta .. ta + V16_TP into stage s (zeros past t1); one commit group
        if (ta < t1) {
            bf16 *vs = vs_of(s);
            float *ds = ds_of(s);
            const int nq = CB / 8, nd = HN / 4;
            for (int i = threadIdx.x; i < V16_TP * nq; i += 256) {
                const int t = i / nq, col = i - t * nq;
                const bool ok = ta + t < t1;
                cp_async16z((uint32_t)__cvta_generic_to_shared(vs + t * LDV + col * 8),
                            v + (size_t)(ok ? ta + t : t0) * C + cb0 + col * 8, ok ? 16u : 0u);
            }
            for (int i = threadIdx.x; i < V16_TP * nd; i += 256) {
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
    for (int ta = t0, s = 0; ta < t1; ta += V16_TP, s ^= 1) {
        issue(s ^ 1, ta + V16_TP);   // the next stage, while this one is summed
        cp_async_wait<1>();
        __syncthreads();             // stage s is in, from every thread's copies
        if (wlive) {
            const bf16 *vs = vs_of(s);
            const float *ds = ds_of(s);
            uint32_t bb[4][4];       // B of n-tiles 2 nn (bb[nn][0..1]) and 2 nn + 1 (bb[nn][2..3])
#pragma unroll
            for (int nn = 0; nn < 4; nn++) {
                ldsm_x4_t16(bb[nn], vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * LDV + cw + nn * 16 + (lane >> 4) * 8);
            }
            int hprev = -1;
            uint32_t ah[2][4], al[2][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const int h = (cb0 + cw + nt * 8) / HC;
                if (h != hprev) {   // A of head h (warp-uniform): ds r of the stage's 16 positions, hi and lo
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
                        mma16(acc[mt][nt], ah[mt], bb[nt >> 1][(nt & 1) * 2], bb[nt >> 1][(nt & 1) * 2 + 1]);
                        mma16(acc[mt][nt], al[mt], bb[nt >> 1][(nt & 1) * 2], bb[nt >> 1][(nt & 1) * 2 + 1]);
                    }
                }
            }
        }
        __syncthreads();   // stage s is read: the next iteration refills it
    }
    cp_async_wait<0>();
    if (!wlive) { return; }
    // D (reader 16 mt + g + 8 half, channel cb0 + cw + 8 nt + 2q .. +1)
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

// --cpu-selftest of v16: one partition's block, warp by warp and stage by stage, the A
// fragments built by the kernel's index math from a stage laid out as the kernel lays it
// (rows of PS floats), B taken in the B fragment layout (what ldmatrix.trans gives the flash
// kernels), each mma through v15_emu_mma, the stores as the kernel's; against float64 sums.
static bool selftest_v16_shape(int C, int H, int nr, int N, uint64_t *rng) {
    auto uni = [&]() { *rng = *rng * 6364136223846793005ull + 1442695040888963407ull; return ((*rng >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; };
    const int nrp = (nr + 3) & ~3, HN = H * nrp, PS = v16_ps(H, nrp), HC = C / H, mtn = (nr + 15) >> 4;
    std::vector<float> dsr((size_t)N * HN), v((size_t)N * C);
    for (size_t i = 0; i < dsr.size(); i++) { dsr[i] = (i % nrp) < (size_t)nr ? (float)uni() : NAN; }   // padding: NaN
    for (auto &x : v) { x = (float)bfr(uni()); }
    const int P = (N + v16_rows - 1) / v16_rows;
    std::vector<float> part((size_t)P * nr * C, NAN);
    for (int p = 0; p < P; p++) {
        for (int cb0 = 0; cb0 < C; cb0 += 512) {
            const int CB = std::min(512, C - cb0), t0 = p * v16_rows, t1 = std::min(t0 + v16_rows, N);
            for (int w = 0; w < 8; w++) {
                const int cw = w * 64;
                if (cw >= CB) { continue; }
                float acc[2][8][32][4] = {};
                for (int ta = t0; ta < t1; ta += V16_TP) {
                    std::vector<float> ds((size_t)V16_TP * PS, 0.0f);   // the stage (zeros past t1)
                    for (int t = 0; t < V16_TP; t++) {
                        for (int i = 0; i < HN; i++) { ds[(size_t)t * PS + i] = ta + t < t1 ? dsr[(size_t)(ta + t) * HN + i] : 0.0f; }
                    }
                    int hprev = -1;
                    uint32_t ah[2][32][4], al[2][32][4], bb[32][2];
                    for (int nt = 0; nt < 8; nt++) {
                        const int h = (cb0 + cw + nt * 8) / HC;
                        if (h != hprev) {
                            hprev = h;
                            for (int mt = 0; mt < 2; mt++) {
                                for (int lane = 0; lane < 32; lane++) {
                                    const int g = lane >> 2, q = lane & 3;
                                    for (int reg = 0; reg < 4; reg++) {
                                        const int jj = 16 * mt + g + (reg & 1) * 8, t = 2 * q + (reg >> 1) * 8;
                                        const float x0 = jj < nr ? ds[(size_t)t * PS + h * nrp + jj] : 0.0f;
                                        const float x1 = jj < nr ? ds[(size_t)(t + 1) * PS + h * nrp + jj] : 0.0f;
                                        float h0, l0, h1, l1;
                                        bf16_split(x0, h0, l0);
                                        bf16_split(x1, h1, l1);
                                        ah[mt][lane][reg] = v15_bits2(h0, h1);
                                        al[mt][lane][reg] = v15_bits2(l0, l1);
                                    }
                                }
                            }
                        }
                        for (int lane = 0; lane < 32; lane++) {   // B[k = position][n = channel], the B layout
                            const int g = lane >> 2, q = lane & 3, c = cb0 + cw + nt * 8 + g;
                            for (int reg = 0; reg < 2; reg++) {
                                const int k0 = 2 * q + 8 * reg;
                                const float y0 = ta + k0 < t1 ? v[(size_t)(ta + k0) * C + c] : 0.0f;
                                const float y1 = ta + k0 + 1 < t1 ? v[(size_t)(ta + k0 + 1) * C + c] : 0.0f;
                                bb[lane][reg] = v15_bits2(y0, y1);
                            }
                        }
                        for (int mt = 0; mt < mtn; mt++) {
                            v15_emu_mma(acc[mt][nt], ah[mt], bb);
                            v15_emu_mma(acc[mt][nt], al[mt], bb);
                        }
                    }
                }
                for (int mt = 0; mt < mtn; mt++) {
                    for (int nt = 0; nt < 8; nt++) {
                        for (int lane = 0; lane < 32; lane++) {
                            const int g = lane >> 2, q = lane & 3;
                            for (int half = 0; half < 2; half++) {
                                const int jj = 16 * mt + g + 8 * half;
                                if (jj >= nr) { continue; }
                                float *o = &part[((size_t)p * nr + jj) * C + cb0 + cw + nt * 8 + 2 * q];
                                o[0] = acc[mt][nt][lane][2 * half];
                                o[1] = acc[mt][nt][lane][2 * half + 1];
                            }
                        }
                    }
                }
            }
        }
    }
    double num = 0, den = 0;
    bool finite = true;
    for (int p = 0; p < P; p++) {
        for (int jj = 0; jj < nr; jj++) {
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int t = p * v16_rows; t < std::min((p + 1) * v16_rows, N); t++) {
                    s += (double)dsr[(size_t)t * HN + (c / HC) * nrp + jj] * v[(size_t)t * C + c];
                }
                const double got = part[((size_t)p * nr + jj) * C + c];
                finite = finite && std::isfinite(got);
                num = std::max(num, fabs(got - s)); den = std::max(den, fabs(s));
            }
        }
    }
    const double err = num / den;
    const bool ok = finite && err < 1e-4;
    printf("  v16 q/gamma pass, lane emulation C=%-4d H=%-2d nr=%-2d N=%-3d: max rel err %.1e%s  %s\n", C, H, nr, N, err,
           finite ? "" : " (a partial not finite)", ok ? "ok" : "FAIL");
    return ok;
}
static bool selftest_v16(uint64_t seed) {
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 9;
    bool ok = true;
    ok &= selftest_v16_shape(512, 8, 25, 300, &rng);   // two partitions, the second partial; two m-tiles
    ok &= selftest_v16_shape(512, 1, 13, 40, &rng);
    ok &= selftest_v16_shape(512, 16, 32, 33, &rng);   // heads of 32 channels: two a warp
    ok &= selftest_v16_shape(256, 32, 5, 20, &rng);    // heads of 8 channels: one per n-tile; 4 of 8 warps
    ok &= selftest_v16_shape(1024, 8, 17, 17, &rng);   // two channel blocks
    ok &= selftest_v16_shape(768, 4, 1, 9, &rng);      // a half channel block; one reader
    return ok;
}

// ----------------------------------------------------------------------------
// v17 (session 10, no device lent: the design, emulated lane by lane here; not yet a kernel):
// the gather with all four of its products on tensor cores, a warp per NP positions (1 or
// 2), head by head. NOTES_route.md, "v17", has the cost model this design comes from.
//
// Per position t, slot k, head h (HC = C / H channels, SK = HC / 16 k-steps), and a tile
// of 16 readers j (nr <= 32: one or two tiles), with v = v_k[t] and r = r_k[t]:
//   P = G_t QG-free:  p_j = G_j[t][h] . v[h]      (16 x HC) (HC x 8): B = v in every column
//   E:                e_j = qg_j[h] . v[h]        A = qg hi, lo from shared memory (ldmatrix)
//   per (j, h): a = 2^(r e log2e - lse log2e), ds = a (p - S), u.v += ds e, dsr = ds r
//   Y = G_t^T W:      sum_j a_j G_j[t][h]         A = the P fragments transposed (movmatrix)
//   U = QG^T DS:      sum_j ds_j qg_j[h]          A = qg hi, lo (ldmatrix.trans), 3 products
//   dv[h] += Y + r U, and after the last head dv -= (r^3 / C) (u.v) v.
// P and Y are matrix-vector products per position: on mma.sync m16n8k16 they fill one
// column of eight (the others replicate it), which costs tensor-core time, not issue
// slots. With NP = 2 the warp's B columns 0-3 belong to position t0 and 4-7 to t0 + 1:
// E and U (whose A, qg, does not depend on the position) run once for both positions,
// which halves their MMAs and the shared-memory reads of qg. P and Y run per position
// (each position's G), into separate accumulators whose own columns are kept.
//
// The k-slots of a k-step are a permutation of channels (both operands of a product use
// it, so any permutation is exact): lane q = lane % 4 of a fragment holds k-slots 2q,
// 2q+1, 2q+8, 2q+9, mapped onto 4 consecutive channels of the HC / 4 that lane q owns in
// head h, so one contiguous HC / 2-byte load per (row, head) gives all SK k-steps' A
// registers of that row (G), and the same for v (B). A D row of Y and U is then channel
// ch17(h, s, kappa) of m-tile s.
__host__ __device__ inline int ch17(int h, int s, int kap, int HC) {
    return h * HC + (HC / 4) * ((kap & 7) >> 1) + 4 * s + 2 * (kap >> 3) + (kap & 1);
}
// Which position a lane's D columns (n = 2q, 2q + 1) and B column (n = lane / 4) serve
__host__ __device__ inline int v17_dpos(int lane, int NP) { return NP == 2 ? (lane & 3) >> 1 : 0; }
__host__ __device__ inline int v17_bpos(int lane, int NP) { return NP == 2 ? lane >> 4 : 0; }
// The lane that stores ds r and adds ds e to u.v for its (reader, position): one of the
// lanes that hold the replicated value
__host__ __device__ inline bool v17_lead(int lane, int NP) { return NP == 2 ? (lane & 1) == 0 : (lane & 3) == 0; }
// The output rows a lane keeps of m-tile s: it keeps m-tile s when s % 2 == q % 2; then
// both rows g and g + 8 (NP = 2: lanes q and q ^ 2 hold different positions), or (NP = 1:
// all four lanes hold the same position) row g for q < 2 and g + 8 for q >= 2.
__host__ __device__ inline bool v17_keeps(int lane, int s, int row_hi, int NP) {
    const int q = lane & 3;
    if ((s & 1) != (q & 1)) { return false; }
    return NP == 2 ? true : (row_hi == (q >> 1));
}
// qg in shared memory, per slot: part hl (0: hi, 1: lo) x 32 reader rows x C k-slot
// columns (column 16 (h SK + s) + kappa holds channel ch17(h, s, kappa)), rows padded by 8
// elements (a row is C + 8 bf16, 16 bytes off the next row's bank: ldmatrix conflict-free)
__host__ __device__ inline int v17_qs(int hl, int j, int col, int C) { return (hl * 32 + j) * (C + 8) + col; }
__host__ __device__ inline int v17_img_elems(int C) { return 2 * 32 * (C + 8); }
// the image's element (row j, column col) before the split: qg of reader j at the column's channel (0 past nr)
__host__ __device__ inline float v17_img_src(int j, int col, int nr, const int *readers, const float *qg, int C, int HC) {
    const int ks = col >> 4, SK = HC / 16;
    return j < nr ? qg[(size_t)readers[j] * C + ch17(ks / SK, ks % SK, col & 15, HC)] : 0.0f;
}
// ldmatrix row addresses (elements into the qg image) of lane l for the A fragment of
// E (rows readers 16 kt.., columns the k-slots of k-step ks) and of U (transposed: rows
// the k-slots, columns readers; ldmatrix.trans of the same rows). Matrix i = l / 8 is A
// register i: rows 8 (i & 1).., columns 8 (i >> 1)..
__host__ __device__ inline int v17_addr_e(int hl, int kt, int ks, int l, int C) {
    return v17_qs(hl, 16 * kt + (l & 7) + 8 * ((l >> 3) & 1), 16 * ks + 8 * (l >> 4), C);
}
__host__ __device__ inline int v17_addr_u(int hl, int kt, int ks, int l, int C) {
    return v17_qs(hl, 16 * kt + (l & 7) + 8 * (l >> 4), 16 * ks + 8 * ((l >> 3) & 1), C);
}

// Emulation of the warp-wide operations the kernel will use (PTX ISA fragment layouts):
// movmatrix.sync.aligned.m8n8.trans.b16: lane l holds row l / 4, columns 2 (l % 4), +1 of
// an 8x8 b16 matrix (low half first); y is the same fragment of its transpose
static void emu_movtrans(uint32_t (&y)[32], const uint32_t (&x)[32]) {
    uint16_t M[8][8];
    for (int l = 0; l < 32; l++) { M[l >> 2][2 * (l & 3)] = (uint16_t)(x[l] & 0xffff); M[l >> 2][2 * (l & 3) + 1] = (uint16_t)(x[l] >> 16); }
    for (int l = 0; l < 32; l++) { const int r = l >> 2, c = 2 * (l & 3); y[l] = (uint32_t)M[c][r] | ((uint32_t)M[c + 1][r] << 16); }
}
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane 8 i + r gives the address of row r
// of matrix i; register i of lane l gets row l / 4, columns 2 (l % 4), +1 of matrix i (of
// its transpose with .trans)
static void emu_ldmatrix4(uint32_t (&out)[32][4], const uint16_t *sm, const int (&addr)[32], bool trans) {
    for (int l = 0; l < 32; l++) {
        for (int i = 0; i < 4; i++) {
            const int r = l >> 2, c = 2 * (l & 3);
            const uint16_t e0 = trans ? sm[addr[8 * i + c] + r] : sm[addr[8 * i + r] + c];
            const uint16_t e1 = trans ? sm[addr[8 * i + c + 1] + r] : sm[addr[8 * i + r] + c + 1];
            out[l][i] = (uint32_t)e0 | ((uint32_t)e1 << 16);
        }
    }
}

// v17's kernel (written in session 10 without a GPU: compiled, and its algebra checked by
// selftest_v17 above, which follows it step by step; not yet run). Shapes: C = 512 with
// heads of 32 or 64 channels (H = 16 or 8), at most 32 readers: two reader tiles at most,
// and each lane holds per head at most 2 SK fragment rows of G. A persistent grid: each
// block first copies the slot's qg image (both parts, the reader tiles in use; built once
// per backward by route_qimg17_kernel) into shared memory, then its warps take groups of
// NP positions in turn.
template <int C, int H> struct V17 {
    static constexpr int HC = C / H, SK = HC / 16, WARPS = 4, MINB = 3;
    static constexpr size_t SMEM = (size_t)2 * 32 * (C + 8) * sizeof(bf16);
};
// v17 takes a slot from v17_min_nr readers up (env V17_MIN_NR, default 4): a tile costs about the
// same whatever its rows hold, ~800 instructions a position, against v12's ~237 a reader, so below
// about 4 readers v12's loop is cheaper (100M block S=4: 20 of its 25 slots have 1 reader)
static int v17_min_nr = 4;
template <int C, int H> static bool v17_fits(const Prob &P, int k) {
    return C == 512 && (C / H == 32 || C / H == 64) && P.nr[k] >= v17_min_nr && P.nr[k] <= 32;
}
__device__ __forceinline__ uint32_t movtrans(uint32_t x) {   // movmatrix .trans (emu_movtrans)
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}
__device__ __forceinline__ void ldsm17(uint32_t (&r)[4], uint32_t a) {   // ldmatrix x4 (emu_ldmatrix4, trans false)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm17t(uint32_t (&r)[4], uint32_t a) {   // ldmatrix x4 .trans
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ uint32_t bf2bits(float lo, float hi) {   // (lo, hi) -> bf16x2, lo in the low half
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&b);
}
// HC / 2 bytes at p (SK / 2 uint4) as 2 SK words; zeros when !ok
template <int SK> __device__ __forceinline__ void ld17(uint32_t (&w)[2 * SK], const bf16 *p, bool ok) {
#pragma unroll
    for (int i = 0; i < SK / 2; i++) {
        const uint4 x = ok ? __ldg(reinterpret_cast<const uint4 *>(p) + i) : make_uint4(0u, 0u, 0u, 0u);
        w[4 * i] = x.x; w[4 * i + 1] = x.y; w[4 * i + 2] = x.z; w[4 * i + 3] = x.w;
    }
}

// Every slot's qg image, once per backward (qg does not change during it): img (J, v17_img_elems(C)),
// slot k's part hl, row j, column col = bf16 hi / lo of v17_img_src (rows 0 .. 31; the rows' 8
// padding columns are never read). Grid (32 C / 256, J).
__global__ void route_qimg17_kernel(uint16_t *img, const float *__restrict__ qg, const int *__restrict__ rd,
                                    const int *__restrict__ nrd, int J, int C, int H) {
    const int k = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 32 * C) { return; }
    const int j = i / C, col = i % C;
    const float x = v17_img_src(j, col, nrd[k], rd + (size_t)k * J, qg, C, C / H);
    const __nv_bfloat16 hi = __float2bfloat16_rn(x), lo = __float2bfloat16_rn(x - __bfloat162float(hi));
    uint16_t *im = img + (size_t)k * v17_img_elems(C);
    im[v17_qs(0, j, col, C)] = *reinterpret_cast<const uint16_t *>(&hi);
    im[v17_qs(1, j, col, C)] = *reinterpret_cast<const uint16_t *>(&lo);
}

template <int C, int H, int NP>
__global__ void __launch_bounds__(V17<C, H>::WARPS * 32, V17<C, H>::MINB)
route_gather_v17_kernel(float *dslot, bf16 *dslotX, float *dsr, const bf16 *__restrict__ v, const float *__restrict__ rk,
                        const bf16 *__restrict__ Gall, const float *__restrict__ Sall, const float *__restrict__ lseall,
                        const int *__restrict__ readers, int nr, const uint16_t *__restrict__ qimg, int N) {
    using T = V17<C, H>;
    constexpr int HC = T::HC, SK = T::SK, KPH = NP == 2 ? SK : SK / 2;
    static_assert(HC == 32 || HC == 64, "v17: heads of 32 or 64 channels");
    constexpr float L2E = 1.4426950408889634f;
    constexpr uint32_t HLB = 2u * 32 * (C + 8), KTB = 2u * 16 * (C + 8);   // bytes from part 0 to 1, tile 0 to 1
    uint16_t *qs = reinterpret_cast<uint16_t *>(ring_smem_raw);
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, NT = (nr + 15) >> 4, nrp = (nr + 3) & ~3;
    // the slot's qg image (route_qimg17_kernel, once per backward): rows 0 .. 16 NT - 1 of both parts
    {
        constexpr int ROW16 = (C + 8) * 2 / 16;   // 16-byte pieces a row
        const int n = 16 * NT * ROW16;           // a part's rows in use
        const uint4 *src = reinterpret_cast<const uint4 *>(qimg);
        uint4 *dst = reinterpret_cast<uint4 *>(qs);
        for (int i = threadIdx.x; i < 2 * n; i += blockDim.x) {
            const int o = i < n ? i : i - n + 32 * ROW16;
            dst[o] = __ldg(src + o);
        }
    }
    __syncthreads();
    // per lane, for the whole slot: the sites of its fragment rows (reader 16 kt + g + 8 hf; -1 past nr),
    // its ldmatrix addresses (E, U: part 0, tile 0, k-step 0), its D and B columns' positions
    int rj[2][2];
#pragma unroll
    for (int kt = 0; kt < 2; kt++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int jj = 16 * kt + g + 8 * hf;
            rj[kt][hf] = jj < nr ? __ldg(readers + jj) : -1;
        }
    }
    const uint32_t qb = (uint32_t)__cvta_generic_to_shared(qs);
    const uint32_t ea = qb + 2u * v17_addr_e(0, 0, 0, lane, C), ua = qb + 2u * v17_addr_u(0, 0, 0, lane, C);
    const int Xd = v17_dpos(lane, NP), Xb = v17_bpos(lane, NP);
    const bool lead = v17_lead(lane, NP);
    const int ngroups = (N + NP - 1) / NP;
    for (int grp = blockIdx.x * T::WARPS + (int)(threadIdx.x >> 5); grp < ngroups; grp += gridDim.x * T::WARPS) {
        const int t0 = grp * NP, td = t0 + Xd, tb = t0 + Xb;   // the lane's D position and B position
        const bool lived = td < N, liveb = tb < N;
        const float rd = lived ? __ldg(rk + td) : 0.0f;
        float dvc[H * KPH], uv = 0.0f;
#pragma unroll
        for (int i = 0; i < H * KPH; i++) { dvc[i] = 0.0f; }
#pragma unroll
        for (int h = 0; h < H; h++) {
            // v's B fragments (P and E): channels h HC + (HC / 4) q .. of position tb; word 2s, 2s + 1: k-step s
            uint32_t bw[2 * SK];
            ld17<SK>(bw, v + (size_t)(liveb ? tb : 0) * C + h * HC + (HC / 4) * q, liveb);
#pragma unroll
            for (int kt = 0; kt < 2; kt++) {   // reader tiles (unrolled: rj stays in registers)
                if (kt >= NT) { break; }
                // G's A fragments of each position: rows g (hf 0) and g + 8 (hf 1) of the tile
                uint32_t ga[NP][SK][4];
#pragma unroll
                for (int X = 0; X < NP; X++) {
                    const int t = t0 + X;
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int j = rj[kt][hf];
                        const bool ok = j >= 0 && t < N;
                        uint32_t w[2 * SK];
                        ld17<SK>(w, Gall + ((size_t)(ok ? j : 0) * N + (ok ? t : 0)) * C + h * HC + (HC / 4) * q, ok);
#pragma unroll
                        for (int s = 0; s < SK; s++) { ga[X][s][hf] = w[2 * s]; ga[X][s][2 + hf] = w[2 * s + 1]; }
                    }
                }
                // P per position; E once for the NP positions (qg hi, lo from the image)
                float dP[NP][4], dE[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int X = 0; X < NP; X++) { dP[X][0] = dP[X][1] = dP[X][2] = dP[X][3] = 0.0f; }
#pragma unroll
                for (int s = 0; s < SK; s++) {
#pragma unroll
                    for (int X = 0; X < NP; X++) { mma16(dP[X], ga[X][s], bw[2 * s], bw[2 * s + 1]); }
#pragma unroll
                    for (int hl = 0; hl < 2; hl++) {
                        uint32_t a[4];
                        ldsm17(a, ea + hl * HLB + kt * KTB + (uint32_t)(h * SK + s) * 32u);
                        mma16(dE, a, bw[2 * s], bw[2 * s + 1]);
                    }
                }
                // the weight and ds of readers 16 kt + g (+ 8) at position td; ds r and u.v by the lead lanes
                float wa[2], wd[2];
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int j = rj[kt][hf];
                    float p = dP[0][2 * hf];
                    if constexpr (NP == 2) { p = Xd ? dP[NP - 1][2 * hf] : p; }
                    const float e = dE[2 * hf];
                    wa[hf] = wd[hf] = 0.0f;
                    if (j >= 0 && lived) {
                        const size_t row = ((size_t)j * N + td) * H + h;
                        // out = sum_i a v_i, a = softmax(s): ds = a (p - S); a = exp(r e - lse) as 2^((r e - lse) log2 e)
                        const float a = exp2f(fmaf(rd * L2E, e, -__ldg(lseall + row) * L2E)), ds = a * (p - __ldg(Sall + row));
                        wa[hf] = a; wd[hf] = ds;
                        if (lead) {
                            uv += ds * e;   // u_j . v = sum_h ds_h e_h
                            dsr[((size_t)td * H + h) * nrp + 16 * kt + g + 8 * hf] = ds * rd;
                        }
                    }
                }
                // the weights as B fragments: (w, w) is row g (+ 8) of an 8x8 matrix over (reader, column); transposed
                uint32_t Wb[4][2];   // a hi, a lo, ds hi, ds lo
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const float ah = __bfloat162float(__float2bfloat16_rn(wa[hf])), dh = __bfloat162float(__float2bfloat16_rn(wd[hf]));
                    const float al = wa[hf] - ah, dl = wd[hf] - dh;
                    Wb[0][hf] = movtrans(bf2bits(ah, ah)); Wb[1][hf] = movtrans(bf2bits(al, al));
                    Wb[2][hf] = movtrans(bf2bits(dh, dh)); Wb[3][hf] = movtrans(bf2bits(dl, dl));
                }
                // Y = G^T (a hi + a lo) per position, U = qg^T ds (hi hi, hi lo, lo hi) once; per pair of
                // m-tiles the lane keeps one (s % 2 == q % 2): dv += Y + r U
#pragma unroll
                for (int m = 0; m < SK / 2; m++) {
                    float val[2][2];
#pragma unroll
                    for (int sb = 0; sb < 2; sb++) {
                        const int s = 2 * m + sb;
                        float dY[NP][4], dU[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                        for (int X = 0; X < NP; X++) {
                            // G^T's A fragment: a0' = T(a0), a1' = T(a2), a2' = T(a1), a3' = T(a3)
                            const uint32_t at[4] = {movtrans(ga[X][s][0]), movtrans(ga[X][s][2]), movtrans(ga[X][s][1]),
                                                    movtrans(ga[X][s][3])};
                            dY[X][0] = dY[X][1] = dY[X][2] = dY[X][3] = 0.0f;
                            mma16(dY[X], at, Wb[0][0], Wb[0][1]);
                            mma16(dY[X], at, Wb[1][0], Wb[1][1]);
                        }
                        uint32_t qh[4], ql[4];
                        ldsm17t(qh, ua + kt * KTB + (uint32_t)(h * SK + s) * 32u);
                        ldsm17t(ql, ua + HLB + kt * KTB + (uint32_t)(h * SK + s) * 32u);
                        mma16(dU, qh, Wb[2][0], Wb[2][1]);
                        mma16(dU, qh, Wb[3][0], Wb[3][1]);
                        mma16(dU, ql, Wb[2][0], Wb[2][1]);
#pragma unroll
                        for (int hf = 0; hf < 2; hf++) {
                            float y = dY[0][2 * hf];
                            if constexpr (NP == 2) { y = Xd ? dY[NP - 1][2 * hf] : y; }
                            val[sb][hf] = fmaf(rd, dU[2 * hf], y);
                        }
                    }
                    if constexpr (NP == 2) {   // rows g and g + 8 of m-tile 2 m + q % 2
#pragma unroll
                        for (int hf = 0; hf < 2; hf++) { dvc[h * KPH + 2 * m + hf] += (q & 1) ? val[1][hf] : val[0][hf]; }
                    } else {                   // row g + 8 (q / 2) of m-tile 2 m + q % 2
                        const float x0 = (q >> 1) ? val[0][1] : val[0][0], x1 = (q >> 1) ? val[1][1] : val[1][0];
                        dvc[h * KPH + m] += (q & 1) ? x1 : x0;
                    }
                }
            }
        }
        // u.v of the lane's position: the lead lanes' sums over g (lanes q = 0 and 2 for NP = 2, q = 0 for NP = 1)
        float x = lead ? uv : 0.0f;
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        x += __shfl_xor_sync(0xffffffffu, x, 8);
        x += __shfl_xor_sync(0xffffffffu, x, 16);
        const float uvs = __shfl_sync(0xffffffffu, x, NP == 2 ? 2 * Xd : 0);
        // k_i = gamma r_i v_i, r_i = (|v_i|^2/C + eps)^(-1/2): dv -= (r^3 / C) (sum_j u_j . v) v
        const float k3 = rd * rd * rd / C * uvs;
        if (lived) {
#pragma unroll
            for (int h = 0; h < H; h++) {
#pragma unroll
                for (int i = 0; i < KPH; i++) {
                    const int s = 2 * (NP == 2 ? i >> 1 : i) + (q & 1), kap = g + 8 * (NP == 2 ? (i & 1) : (q >> 1));
                    const size_t o = (size_t)td * C + ch17(h, s, kap, HC);
                    const float val = dvc[h * KPH + i] - k3 * __bfloat162float(v[o]);
                    dslot[o] = val;
                    dslotX[o] = __float2bfloat16_rn(val);
                }
            }
        }
    }
}

// --cpu-selftest of v17: one slot's gather, warp by warp (NP positions each), every
// product through the emulated mma / ldmatrix / movmatrix from the fragment layouts,
// against the float64 sums; also that every (position, channel) of dslot and every
// (position, head, reader) of dsr is written by exactly one lane. mutate = 1 swaps two
// registers of the transposed G fragment (must fail), 2 drops the lo part of qg in E.
static bool selftest_v17_shape(int C, int H, int nr, int N, int NP, int chain, uint64_t *rng, int mutate = 0) {
    const int HC = C / H, SK = HC / 16, NT = (nr + 15) / 16, nrp = (nr + 3) & ~3;
    constexpr float L2E = 1.4426950408889634f;
    const GatherCase gc = gather_case(C, H, nr, N, nr + 2, rng);
    const std::vector<int> &readers = gc.readers;
    const std::vector<float> &v = gc.v, &r = gc.r, &G = gc.G, &S = gc.S, &lse = gc.lse, &qg = gc.qg;
    std::vector<float> old((size_t)N * C);   // dslot_{k+1}, added when chain
    for (auto &x : old) { x = (float)(0.1 * lcg_uni(rng)); }
    // the slot's qg image (route_qimg17_kernel writes it once per backward; the kernel's prologue copies it)
    std::vector<uint16_t> qs((size_t)2 * 32 * (C + 8), 0);
    for (int j = 0; j < 32; j++) {
        for (int h = 0; h < H; h++) {
            for (int s = 0; s < SK; s++) {
                for (int kap = 0; kap < 16; kap++) {
                    const float x = v17_img_src(j, 16 * (h * SK + s) + kap, nr, readers.data(), qg.data(), C, HC);
                    float hi, lo;
                    bf16_split(x, hi, lo);
                    qs[v17_qs(0, j, 16 * (h * SK + s) + kap, C)] = f2bf_bits(hi);
                    qs[v17_qs(1, j, 16 * (h * SK + s) + kap, C)] = f2bf_bits(lo);
                }
            }
        }
    }
    std::vector<float> dslot((size_t)N * C, NAN), dsr((size_t)N * H * nrp, NAN);
    std::vector<int> nslot((size_t)N * C, 0), ndsr((size_t)N * H * nrp, 0);
    bool once = true;
    for (int t0 = 0; t0 < N; t0 += NP) {
        int pos[2];
        bool live[2];
        for (int X = 0; X < 2; X++) { pos[X] = t0 + X; live[X] = X < NP && pos[X] < N; }
        const int KPH = NP == 2 ? SK : SK / 2;              // values a lane keeps per head
        std::vector<float> dvc((size_t)32 * H * KPH, 0.0f);  // the kernel's registers dvc[h KPH + i]
        std::vector<int> dvch((size_t)32 * H * KPH, -1);     // their channels (for the check)
        float uv[32] = {};
        for (int h = 0; h < H; h++) {
            // v's B fragments (P and E): lane l, column n = l / 4 of position v17_bpos
            std::vector<std::array<uint32_t, 2>> bvv((size_t)SK * 32);
            uint32_t bv[32][2];
            auto vat = [&](int X, int c) { return live[X] ? v[(size_t)pos[X] * C + c] : 0.0f; };
            for (int s = 0; s < SK; s++) {
                for (int l = 0; l < 32; l++) {
                    const int X = v17_bpos(l, NP), q = l & 3;
                    bvv[s * 32 + l][0] = v15_bits2(vat(X, ch17(h, s, 2 * q, HC)), vat(X, ch17(h, s, 2 * q + 1, HC)));
                    bvv[s * 32 + l][1] = v15_bits2(vat(X, ch17(h, s, 2 * q + 8, HC)), vat(X, ch17(h, s, 2 * q + 9, HC)));
                }
            }
            auto getbv = [&](int s) { for (int l = 0; l < 32; l++) { bv[l][0] = bvv[s * 32 + l][0]; bv[l][1] = bvv[s * 32 + l][1]; } };
            for (int kt = 0; kt < NT; kt++) {
                // G's A fragments, per position and k-step: rows readers 16 kt + g, + 8
                std::vector<std::array<uint32_t, 4>> ga((size_t)2 * SK * 32);
                auto Gat = [&](int X, int jj, int c) {
                    return live[X] && jj < nr ? G[((size_t)readers[jj] * N + pos[X]) * C + c] : 0.0f;
                };
                for (int X = 0; X < NP; X++) {
                    for (int s = 0; s < SK; s++) {
                        for (int l = 0; l < 32; l++) {
                            const int g = l >> 2, q = l & 3, j0 = 16 * kt + g, j1 = j0 + 8;
                            auto &a = ga[(X * SK + s) * 32 + l];
                            a[0] = v15_bits2(Gat(X, j0, ch17(h, s, 2 * q, HC)), Gat(X, j0, ch17(h, s, 2 * q + 1, HC)));
                            a[1] = v15_bits2(Gat(X, j1, ch17(h, s, 2 * q, HC)), Gat(X, j1, ch17(h, s, 2 * q + 1, HC)));
                            a[2] = v15_bits2(Gat(X, j0, ch17(h, s, 2 * q + 8, HC)), Gat(X, j0, ch17(h, s, 2 * q + 9, HC)));
                            a[3] = v15_bits2(Gat(X, j1, ch17(h, s, 2 * q + 8, HC)), Gat(X, j1, ch17(h, s, 2 * q + 9, HC)));
                        }
                    }
                }
                auto getga = [&](int X, int s, uint32_t (&a)[32][4]) {
                    for (int l = 0; l < 32; l++) { for (int i = 0; i < 4; i++) { a[l][i] = ga[(X * SK + s) * 32 + l][i]; } }
                };
                // P per position, E once (qg hi and lo from the image by ldmatrix)
                float dP[2][32][4] = {}, dE[32][4] = {};
                for (int s = 0; s < SK; s++) {
                    getbv(s);
                    for (int X = 0; X < NP; X++) {
                        uint32_t a[32][4];
                        getga(X, s, a);
                        once &= v15_emu_mma(dP[X], a, bv);
                    }
                    for (int hl = 0; hl < (mutate == 2 ? 1 : 2); hl++) {
                        int addr[32];
                        uint32_t a[32][4];
                        for (int l = 0; l < 32; l++) { addr[l] = v17_addr_e(hl, kt, h * SK + s, l, C); }
                        emu_ldmatrix4(a, qs.data(), addr, false);
                        once &= v15_emu_mma(dE, a, bv);
                    }
                }
                // per (reader, head, position): the weight and ds, in every lane that holds them
                float wa[32][2], wd[32][2];
                for (int l = 0; l < 32; l++) {
                    const int g = l >> 2, X = v17_dpos(l, NP);
                    for (int hf = 0; hf < 2; hf++) {
                        const int jj = 16 * kt + g + 8 * hf;
                        const float p = dP[X][l][2 * hf], e = dE[l][2 * hf];
                        wa[l][hf] = wd[l][hf] = 0.0f;
                        if (jj < nr && live[X]) {
                            const size_t row = ((size_t)readers[jj] * N + pos[X]) * H + h;
                            const float a = exp2f(fmaf(r[pos[X]] * L2E, e, -lse[row] * L2E)), ds = a * (p - S[row]);
                            wa[l][hf] = a; wd[l][hf] = ds;
                            if (v17_lead(l, NP)) {
                                uv[l] += ds * e;
                                const size_t o = ((size_t)pos[X] * H + h) * nrp + jj;
                                dsr[o] = ds * r[pos[X]];
                                ndsr[o]++;
                            }
                        }
                    }
                }
                // the weights' B fragments: each lane's (w, w) as row g (+8) of an 8x8 matrix, transposed
                uint32_t Wb[4][32][2];   // a hi, a lo, ds hi, ds lo
                for (int hf = 0; hf < 2; hf++) {
                    uint32_t x[4][32], y[32];
                    for (int l = 0; l < 32; l++) {
                        float ah, al, dh, dl;
                        bf16_split(wa[l][hf], ah, al);
                        bf16_split(wd[l][hf], dh, dl);
                        x[0][l] = v15_bits2(ah, ah); x[1][l] = v15_bits2(al, al);
                        x[2][l] = v15_bits2(dh, dh); x[3][l] = v15_bits2(dl, dl);
                    }
                    for (int o = 0; o < 4; o++) {
                        emu_movtrans(y, x[o]);
                        for (int l = 0; l < 32; l++) { Wb[o][l][hf] = y[l]; }
                    }
                }
                // Y per position (G^T from the P fragments: a0' = T(a0), a1' = T(a2), a2' = T(a1), a3' = T(a3)),
                // U once (qg^T hi and lo by ldmatrix.trans; hi hi, hi lo, lo hi); the kept rows into dvc
                for (int s = 0; s < SK; s++) {
                    float dY[2][32][4] = {}, dU[32][4] = {};
                    for (int X = 0; X < NP; X++) {
                        uint32_t a[32][4], at[32][4];
                        getga(X, s, a);
                        const int src[4] = {0, mutate == 1 ? 1 : 2, mutate == 1 ? 2 : 1, 3};
                        for (int i = 0; i < 4; i++) {
                            uint32_t x[32], y[32];
                            for (int l = 0; l < 32; l++) { x[l] = a[l][src[i]]; }
                            emu_movtrans(y, x);
                            for (int l = 0; l < 32; l++) { at[l][i] = y[l]; }
                        }
                        once &= v15_emu_mma(dY[X], at, Wb[0]);
                        once &= v15_emu_mma(dY[X], at, Wb[1]);
                    }
                    uint32_t qh[32][4], ql[32][4];
                    int addr[32];
                    for (int l = 0; l < 32; l++) { addr[l] = v17_addr_u(0, kt, h * SK + s, l, C); }
                    emu_ldmatrix4(qh, qs.data(), addr, true);
                    for (int l = 0; l < 32; l++) { addr[l] = v17_addr_u(1, kt, h * SK + s, l, C); }
                    emu_ldmatrix4(ql, qs.data(), addr, true);
                    once &= v15_emu_mma(dU, qh, Wb[2]);
                    once &= v15_emu_mma(dU, qh, Wb[3]);
                    once &= v15_emu_mma(dU, ql, Wb[2]);
                    for (int l = 0; l < 32; l++) {
                        const int g = l >> 2, X = v17_dpos(l, NP);
                        int i = 0;   // the lane's kept values of head h, in m-tile order
                        for (int s2 = 0; s2 < s; s2++) { i += v17_keeps(l, s2, 0, NP) + v17_keeps(l, s2, 1, NP); }
                        for (int hf = 0; hf < 2; hf++) {
                            if (!v17_keeps(l, s, hf, NP)) { continue; }
                            const size_t d = ((size_t)l * H + h) * KPH + i++;
                            dvc[d] += dY[X][l][2 * hf] + r[live[X] ? pos[X] : 0] * dU[l][2 * hf];
                            const int c = ch17(h, s, g + 8 * hf, HC);
                            once &= dvch[d] == -1 || dvch[d] == c;
                            dvch[d] = c;
                        }
                    }
                }
            }
        }
        // finish: u.v of each position summed over its lead lanes, dv -= (r^3 / C) (u.v) v, the chain, the store
        for (int X = 0; X < NP; X++) {
            if (!live[X]) { continue; }
            float uvs = 0.0f;
            for (int l = 0; l < 32; l++) { if (v17_dpos(l, NP) == X && v17_lead(l, NP)) { uvs += uv[l]; } }
            const float rt = r[pos[X]], k3 = rt * rt * rt / C * uvs;
            for (int l = 0; l < 32; l++) {
                if (v17_dpos(l, NP) != X) { continue; }
                for (int d = 0; d < H * KPH; d++) {
                    const int c = dvch[(size_t)l * H * KPH + d];
                    if (c < 0) { once = false; continue; }
                    const size_t o = (size_t)pos[X] * C + c;
                    dslot[o] = dvc[(size_t)l * H * KPH + d] - k3 * v[o] + (chain ? old[o] : 0.0f);
                    nslot[o]++;
                }
            }
        }
    }
    for (int x : nslot) { once &= x == 1; }
    for (int t = 0; t < N; t++) {
        for (int h = 0; h < H; h++) {
            for (int jj = 0; jj < nrp; jj++) { once &= ndsr[((size_t)t * H + h) * nrp + jj] == (jj < nr ? 1 : 0); }
        }
    }
    // against the gather's sums in float64
    double num = 0, den = 0, dnum = 0, dden = 0;
    for (int t = 0; t < N; t++) {
        std::vector<double> ref, refdsr;
        gather_ref64(gc, t, ref, refdsr);
        for (int jj = 0; jj < nr; jj++) {
            for (int h = 0; h < H; h++) {
                const double got = dsr[((size_t)t * H + h) * nrp + jj], x = refdsr[(size_t)jj * H + h];
                dnum = std::max(dnum, fabs(got - x)); dden = std::max(dden, fabs(x));
            }
        }
        for (int c = 0; c < C; c++) {
            const double x = ref[c] + (chain ? old[(size_t)t * C + c] : 0.0);
            const double got = dslot[(size_t)t * C + c];
            num = std::max(num, std::isfinite(got) ? fabs(got - x) : INFINITY); den = std::max(den, fabs(x));
        }
    }
    const double err = num / den, derr = dnum / dden;
    const bool ok = once && err < 1e-4 && derr < 1e-4;
    printf("  v17 gather, lane emulation C=%-4d H=%-2d nr=%-2d N=%-2d NP=%d%s: dslot rel %.1e, ds r rel %.1e%s  %s\n", C, H, nr,
           N, NP, chain ? " chain" : "      ", err, derr, once ? "" : " (an element taken or written twice or never)",
           ok ? "ok" : "FAIL");
    return ok;
}
static bool selftest_v17(uint64_t seed) {
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 11;
    bool ok = true;
    ok &= selftest_v17_shape(512, 8, 25, 7, 2, 0, &rng);    // the 100M slot 0 of full mode: two reader tiles; N odd
    ok &= selftest_v17_shape(512, 8, 16, 6, 1, 1, &rng);    // one full tile, one position a warp, the chain
    ok &= selftest_v17_shape(512, 8, 9, 5, 2, 1, &rng);
    ok &= selftest_v17_shape(512, 8, 1, 4, 2, 0, &rng);     // one reader
    ok &= selftest_v17_shape(512, 16, 32, 4, 2, 0, &rng);   // heads of 32 channels (SK 2); nr 32
    ok &= selftest_v17_shape(512, 4, 13, 3, 1, 0, &rng);    // heads of 128 (SK 8)
    ok &= selftest_v17_shape(1024, 8, 20, 4, 2, 0, &rng);   // heads of 128, two tiles
    ok &= selftest_v17_shape(256, 2, 5, 3, 2, 1, &rng);
    // the check can fail: two registers of the transposed G swapped, and E without qg's lo part
    uint64_t rm = rng;
    const bool m1 = selftest_v17_shape(512, 8, 12, 2, 2, 0, &rm, 1), m2 = selftest_v17_shape(512, 8, 12, 2, 2, 0, &rm, 2);
    printf("  v17 mutations (expected FAIL above): %s\n", !m1 && !m2 ? "both caught" : "NOT CAUGHT");
    return ok && !m1 && !m2;
}

// ----------------------------------------------------------------------------
// Host side: buffers, the whole-model passes per version

struct Dev {
    bf16 *slots; float *r, *q, *gm, *g, *dU;              // inputs
    bf16 *h, *u; float *rstd, *lse, *a;                   // forward outputs
    float *dslots, *dq, *dgamma, *dg;                     // backward outputs
    float *Gf, *ds, *part_qv, *part_dg, *dsr, *gpart, *qvacc, *qg; bf16 *Gb; float *Sb;   // scratch
                                                          // (dsr: N nmax H, or N H nrp(nmax) for v11: dsr_count)
    bf16 *dslotX;                                         // (N, C) v5: bf16 copy of the slot gradient
    float *gpart45;                                       // (N/128, nmax, C) v4, v5: q/gamma partials
    float *part7, *T7, *dsr7; int *ul7;                   // v7: lo's partial (N, C), its u.v sum (N), lo's dsr
                                                          // (N, nmax, H), the passes' entries (J, J, 3)
    int *src, *nsrc, *rd;                                 // (J, J), (J), (J, J)
    float *p13h, *p13l; float *p13own;                    // v13: partials (kmax-1, N, C), (kmax-1, N, H), in Gb
                                                          // when they fit (as the trainer's in route_G), else p13own
    uint4 *qf15; int *nrd;                                // v15: every slot's A fragments (J, 16 C); readers per slot (J)
    uint16_t *qimg17;                                     // v17: every slot's qg image (J, v17_img_elems(C))
    float *qgx;                                           // (J, C) qg in another order: v22 hl, v23 pair
};

struct KernelSet {   // the templated kernels of one (C, H)
    void (*fwd2)(const Prob &, const Dev &, int j, bool want_a, bool ring);
    void (*bwd2)(const Prob &, const Dev &, int j);
    void (*site3)(const Prob &, const Dev &, int j);
    void (*site18)(const Prob &, const Dev &, int j, int ver);
    void (*gather3)(const Prob &, const Dev &, int k);
    void (*gather45)(const Prob &, const Dev &, int k, int ver);
    void (*gather20)(const Prob &, const Dev &, int k);
    void (*gather7)(const Prob &, const Dev &, int k);
    void (*fwd13)(const Prob &, const Dev &, int j);
    void (*fwd14)(const Prob &, const Dev &, int j);
    void (*fwd21)(const Prob &, const Dev &, int j);
    void (*gather15)(const Prob &, const Dev &, int k);
    bool (*gather17)(const Prob &, const Dev &, int k);
    void (*site22)(const Prob &, const Dev &, int j);
    void (*gather22)(const Prob &, const Dev &, int k);
};

template <int C, int H> struct Impl {
    // ring: v8's forward (sources through the row ring)
    static void fwd2(const Prob &P, const Dev &d, int j, bool want_a, bool ring) {
        const size_t N = P.N;
        if (ring) {
            constexpr size_t smem = ring_smem<C>();
            static bool limit_set = false;
            ring_smem_limit(route_fwd_v2_kernel<C, H, true>, smem, limit_set);
            route_fwd_v2_kernel<C, H, true><<<cdiv(N, 8), 256, smem>>>(
                d.h + j * N * C, d.u + j * N * C, d.rstd + j * N, d.lse + j * N * H,
                want_a ? d.a + (size_t)P.pair_off[j] * N * H : nullptr, d.slots, d.r, d.src + j * P.J, P.n[j],
                d.q + j * C, d.gm + j * C, d.g + j * C, P.N);
        } else {
            route_fwd_v2_kernel<C, H><<<cdiv(N, 8), 256>>>(d.h + j * N * C, d.u + j * N * C, d.rstd + j * N, d.lse + j * N * H,
                                                           want_a ? d.a + (size_t)P.pair_off[j] * N * H : nullptr, d.slots, d.r,
                                                           d.src + j * P.J, P.n[j], d.q + j * C, d.gm + j * C, d.g + j * C, P.N);
        }
        LAUNCH_CHECK();
    }
    static void bwd2(const Prob &P, const Dev &d, int j) {
        const size_t N = P.N;
        route_bwd_v2_kernel<C, H><<<cdiv(N, POS_PER_BLOCK), 256>>>(d.dslots, d.part_qv, d.part_dg, d.dU + j * N * C,
                                                                   d.h + j * N * C, d.rstd + j * N, d.lse + j * N * H,
                                                                   d.slots, d.r, d.src + j * P.J, P.n[j], d.q + j * C,
                                                                   d.gm + j * C, d.g + j * C, P.N);
        LAUNCH_CHECK();
    }
    static void site3(const Prob &P, const Dev &d, int j) {
        const size_t N = P.N;
        route_site_v3_kernel<C, H><<<cdiv(N, POS_PER_BLOCK), 256>>>(d.Gb + j * N * C, d.Sb + j * N * H, d.part_dg,
                                                                    d.dU + j * N * C, d.h + j * N * C, d.rstd + j * N,
                                                                    d.g + j * C, P.N);
        LAUNCH_CHECK();
    }
    static void site22(const Prob &P, const Dev &d, int j) {   // v3's, G in hl order
        const size_t N = P.N;
        route_site_v3_kernel<C, H, true><<<cdiv(N, POS_PER_BLOCK), 256>>>(d.Gb + j * N * C, d.Sb + j * N * H, d.part_dg,
                                                                          d.dU + j * N * C, d.h + j * N * C,
                                                                          d.rstd + j * N, d.g + j * C, P.N);
        LAUNCH_CHECK();
    }
    static void gather22(const Prob &P, const Dev &d, int k) {
        const size_t N = P.N;
        constexpr size_t smem = ring_smem12<C>();
        static bool limit_set = false;
        if (!v12_fits(P, k)) {
            fprintf(stderr, "error: v22's gather needs v12's fit (slot %d has %d readers)\n", k, P.nr[k]);
            exit(1);
        }
        ring_smem_limit(route_gather_v22_kernel<C, H>, smem, limit_set);
        route_gather_v22_kernel<C, H><<<cdiv(N, 8), 256, smem>>>(d.dslots + k * N * C, d.dslotX, d.dsr,
                                                                 d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb, d.lse,
                                                                 d.rd + k * P.J, P.nr[k], d.qgx, P.N,
                                                                 (unsigned)(N * C), (unsigned)(N * H));
        LAUNCH_CHECK();
    }
    static void site18(const Prob &P, const Dev &d, int j, int ver) {   // v18: 2 slots a warp, v19: 4
        const size_t N = P.N;
        auto run = [&](auto slots) {
            constexpr int SL = decltype(slots)::value;
            constexpr size_t smem = 8 * SL * site_stage_bytes<C>();
            auto kernel = route_site_v18_kernel<C, H, SL>;
            CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            kernel<<<cdiv(N, POS_PER_BLOCK), 256, smem>>>(d.Gb + j * N * C, d.Sb + j * N * H, d.part_dg,
                                                          d.dU + j * N * C, d.h + j * N * C, d.rstd + j * N,
                                                          d.g + j * C, P.N);
        };
        if (ver == 19) { run(std::integral_constant<int, 4>()); } else { run(std::integral_constant<int, 2>()); }
        LAUNCH_CHECK();
    }
    static void gather3(const Prob &P, const Dev &d, int k) {
        const size_t N = P.N;
        route_gather_v3_kernel<C, H><<<cdiv(N, 8), 256>>>(d.dslots + k * N * C, d.dsr, d.slots + k * N * C, d.r + k * N,
                                                          d.Gb, d.Sb, d.lse, d.rd + k * P.J, P.nr[k], d.qg, P.N);
        LAUNCH_CHECK();
    }
    static void gather20(const Prob &P, const Dev &d, int k) {   // site k's norm backward + slot k's gather
        const size_t N = P.N;
        constexpr size_t smem = ring_smem20<C>();
        static bool limit_set = false;
        if (!v12_fits(P, k) || P.rd[(size_t)k * P.J] != k) {
            fprintf(stderr, "error: v20 needs v12's fit and slot %d's first reader to be site %d\n", k, k);
            exit(1);
        }
        ring_smem_limit(route_gather_v20_kernel<C, H>, smem, limit_set);
        const SiteIn20 site{d.dU + k * N * C, d.h + k * N * C, d.rstd + k * N, d.g + k * C, d.Gb + k * N * C,
                            d.Sb + k * N * P.H, d.part_dg};
        route_gather_v20_kernel<C, H><<<cdiv(N, 8), 256, smem>>>(d.dslots + k * N * C, d.dslotX, d.dsr,
                                                                 d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb, d.lse,
                                                                 d.rd + k * P.J, P.nr[k], d.qg, P.N,
                                                                 (unsigned)(N * C), (unsigned)(N * P.H), site);
        LAUNCH_CHECK();
    }
    static void gather45(const Prob &P, const Dev &d, int k, int ver) {
        const size_t N = P.N;
        if (ver == 9 || ver == 10) {
            constexpr size_t smem = ring_smem<C>();
            static bool limit9 = false, limit10 = false;
            if (ver == 9) {
                ring_smem_limit(route_gather_v9_kernel<C, H, 2>, smem, limit9);
                route_gather_v9_kernel<C, H, 2><<<cdiv(N, 8), 256, smem>>>(d.dslots + k * N * C, d.dslotX, d.dsr,
                                                                           d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb,
                                                                           d.lse, d.rd + k * P.J, P.nr[k], d.qg, P.N);
            } else {
                ring_smem_limit(route_gather_v9_kernel<C, H, C <= 512 ? 3 : 1>, smem, limit10);
                route_gather_v9_kernel<C, H, C <= 512 ? 3 : 1><<<cdiv(N, 8), 256, smem>>>(
                    d.dslots + k * N * C, d.dslotX, d.dsr, d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb, d.lse,
                    d.rd + k * P.J, P.nr[k], d.qg, P.N);
            }
        } else if (ver >= 12 && ver != 15) {   // v11's gather, leaner (route_gather_v12_kernel); v13's, v14's, v16's too (v17's fallback)
            constexpr size_t smem = ring_smem12<C>();
            static bool limit_set = false;
            if (!v12_fits(P, k)) {
                fprintf(stderr, "error: v12's gather needs nr <= 32 (slot %d has %d) and J N C, J N H, N H nrp < 2^31\n",
                        k, P.nr[k]);
                exit(1);
            }
            static bool limit_qp = false;
            if (ver == 23) {   // qg in pair order (d.qgx)
                ring_smem_limit(route_gather_v12_kernel<C, H, true>, smem, limit_qp);
                route_gather_v12_kernel<C, H, true><<<cdiv(N, 8), 256, smem>>>(d.dslots + k * N * C, d.dslotX, d.dsr,
                                                                               d.slots + k * N * C, d.r + k * N, d.Gb,
                                                                               d.Sb, d.lse, d.rd + k * P.J, P.nr[k],
                                                                               d.qgx, P.N, (unsigned)(N * C),
                                                                               (unsigned)(N * H));
            } else {
                ring_smem_limit(route_gather_v12_kernel<C, H>, smem, limit_set);
                route_gather_v12_kernel<C, H><<<cdiv(N, 8), 256, smem>>>(d.dslots + k * N * C, d.dslotX, d.dsr,
                                                                         d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb,
                                                                         d.lse, d.rd + k * P.J, P.nr[k], d.qg, P.N,
                                                                         (unsigned)(N * C), (unsigned)(N * H));
            }
        } else if (ver == 11) {   // v8's gather, dsr written as (N, H, nrp) for v11's q/gamma pass
            constexpr size_t smem = ring_smem<C>();
            static bool limit_set = false;
            ring_smem_limit(route_gather_v45_kernel<C, H, 1, true, true>, smem, limit_set);
            route_gather_v45_kernel<C, H, 1, true, true><<<cdiv(N, 8), 256, smem>>>(
                d.dslots + k * N * C, d.dslotX, d.dsr, d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb, d.lse,
                d.rd + k * P.J, P.nr[k], d.qg, P.N);
        } else if (ver == 8) {
            constexpr size_t smem = ring_smem<C>();
            static bool limit_set = false;
            ring_smem_limit(route_gather_v45_kernel<C, H, 1, true>, smem, limit_set);
            route_gather_v45_kernel<C, H, 1, true><<<cdiv(N, 8), 256, smem>>>(d.dslots + k * N * C, d.dslotX, d.dsr,
                                                                              d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb,
                                                                              d.lse, d.rd + k * P.J, P.nr[k], d.qg, P.N);
        } else if (ver == 6) {
            route_gather_v45_kernel<C, H, 2><<<cdiv(N, 8), 256>>>(d.dslots + k * N * C, d.dslotX, d.dsr,
                                                                  d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb, d.lse,
                                                                  d.rd + k * P.J, P.nr[k], d.qg, P.N);
        } else if (ver == 5) {
            route_gather_v45_kernel<C, H, 1><<<cdiv(N, 8), 256>>>(d.dslots + k * N * C, d.dslotX, d.dsr,
                                                                     d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb, d.lse,
                                                                     d.rd + k * P.J, P.nr[k], d.qg, P.N);
        } else {
            route_gather_v45_kernel<C, H, 0><<<cdiv(N, 8), 256>>>(d.dslots + k * N * C, nullptr, d.dsr,
                                                                      d.slots + k * N * C, d.r + k * N, d.Gb, d.Sb,
                                                                      d.lse, d.rd + k * P.J, P.nr[k], d.qg, P.N);
        }
        LAUNCH_CHECK();
    }
    // v7: the pass of slot k (a hi slot: TWO, also lo's partial; a lo slot: finishes from the partial)
    static void gather7(const Prob &P, const Dev &d, int k) {
        const size_t N = P.N;
        const int lo = P.v7_lo[k], hi = P.v7_hi[k];
        float *dsrA = hi >= 0 ? d.dsr7 : d.dsr;   // a lo slot's dsr lives in the second buffer
        const int *ul = d.ul7 + (size_t)k * P.J * 3;
        if (lo >= 0) {
            route_gather_v7_kernel<C, H, true><<<cdiv(N, 8), 256>>>(
                d.dslots + k * N * C, d.dslotX, dsrA, d.slots + k * N * C, d.r + k * N, nullptr, nullptr, d.part7, d.T7,
                d.dsr7, d.slots + lo * N * C, d.r + lo * N, d.Gb, d.Sb, d.lse, ul, P.v7_nu[k], P.nr[k], P.nr[lo], d.qg,
                P.N);
        } else {
            route_gather_v7_kernel<C, H, false><<<cdiv(N, 8), 256>>>(
                d.dslots + k * N * C, d.dslotX, dsrA, d.slots + k * N * C, d.r + k * N, hi >= 0 ? d.part7 : nullptr,
                hi >= 0 ? d.T7 : nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, d.Gb, d.Sb, d.lse, ul,
                P.v7_nu[k], P.nr[k], 0, d.qg, P.N);
        }
        LAUNCH_CHECK();
    }
    // v13: site j by its group in P.lead13: a leader with its extra sites, a site
    // that starts from its partial, or a site alone (KX = 0, no partial: v8's math)
    // (V = 14: v14's kernel, route_fwd_v14_kernel, same arguments and plan; V = 21: v14's with
    // FRESH, r of slot j computed by site j's kernel into d.r's row j)
    template <int KX, int V> static void fwd13_launch(const Prob &P, const Dev &d, int j) {
        const size_t N = P.N;
        constexpr size_t smem = fwd13_smem<C, KX>();
        static bool limit_set = false;
        if constexpr (V == 13) { ring_smem_limit(route_fwd_v13_kernel<C, H, KX>, smem, limit_set); }
        else { ring_smem_limit(route_fwd_v14_kernel<C, H, KX, V == 21>, smem, limit_set); }
        const int ld = P.lead13[j], n0 = ld == j ? 0 : P.n[ld];   // n0: sources in the partial
        const float *inh = ld == j ? nullptr : d.p13h + (size_t)(j - ld - 1) * N * C;
        const float *inl = ld == j ? nullptr : d.p13l + (size_t)(j - ld - 1) * N * H;
        const int *src = d.src + j * P.J + n0;
        const int n = P.n[j] - n0;
        bf16 *h = d.h + j * N * C, *u = d.u + j * N * C;
        float *rstd = d.rstd + j * N, *lse = d.lse + j * N * H;
        const float *q = d.q + j * C, *gm = d.gm + j * C, *g = d.g + j * C;
        if constexpr (V == 13) {
            route_fwd_v13_kernel<C, H, KX><<<cdiv(N, 8), 256, smem>>>(h, u, rstd, lse, d.slots, d.r, src, n, q, gm, g,
                                                                      d.p13h, d.p13l, inh, inl, P.N);
        } else {
            route_fwd_v14_kernel<C, H, KX, V == 21><<<cdiv(N, 8), 256, smem>>>(
                h, u, rstd, lse, d.slots, d.r, src, n, q, gm, g, d.p13h, d.p13l, inh, inl, P.N,
                V == 21 ? d.r + j * N : nullptr);
        }
        LAUNCH_CHECK();
    }
    template <int V> static void fwd13_any(const Prob &P, const Dev &d, int j) {
        constexpr int XM = v13_kx_max<C>();
        const int kx = v13_extra(P, j);
        if (V == 21 && P.src[(size_t)j * P.J + P.n[j] - 1] != j) {
            fprintf(stderr, "error: v21: site %d's last source is not slot %d\n", j, j);
            exit(1);
        }
        if (kx == 0) { fwd13_launch<0, V>(P, d, j); }
        else if (kx == 1 && XM >= 1) { fwd13_launch<1, V>(P, d, j); }
        else if (kx == 2 && XM >= 2) { fwd13_launch<XM >= 2 ? 2 : 0, V>(P, d, j); }
        else if (kx == 3 && XM >= 3) { fwd13_launch<XM >= 3 ? 3 : 0, V>(P, d, j); }
        else { fprintf(stderr, "error: v13/v14: %d extra sites at C=%d (at most %d built)\n", kx, C, XM); exit(1); }
    }
    static void fwd13(const Prob &P, const Dev &d, int j) { fwd13_any<13>(P, d, j); }
    static void fwd14(const Prob &P, const Dev &d, int j) { fwd13_any<14>(P, d, j); }
    static void fwd21(const Prob &P, const Dev &d, int j) { fwd13_any<21>(P, d, j); }
    // v15: the gather with E and U on tensor cores (route_gather_v15_kernel; nr <= 32)
    static void gather15(const Prob &P, const Dev &d, int k) {
        const size_t N = P.N;
        constexpr size_t smem = v15_smem<C, H>();
        static bool limit_set = false;
        if (P.nr[k] > V15_NRMAX || !v12_fits(P, k)) {
            fprintf(stderr, "error: v15's gather needs nr <= %d (slot %d has %d) and J N C < 2^31\n", V15_NRMAX, k, P.nr[k]);
            exit(1);
        }
        ring_smem_limit(route_gather_v15_kernel<C, H>, smem, limit_set);
        route_gather_v15_kernel<C, H><<<cdiv(N, 8), 256, smem>>>(d.dslots + k * N * C, d.dslotX, d.dsr, d.slots + k * N * C,
                                                                 d.r + k * N, d.Gb, d.Sb, d.lse, d.rd + k * P.J, P.nr[k],
                                                                 d.qf15 + (size_t)k * 16 * C, P.N, (unsigned)(N * C));
        LAUNCH_CHECK();
    }
    // v17: the gather with every product on tensor cores, on the slots it takes (v17_fits; false: not run).
    // A persistent grid: the blocks the device holds at once, at most one a group of positions per warp.
    static bool gather17(const Prob &P, const Dev &d, int k) {
        if constexpr (C == 512 && (C / H == 32 || C / H == 64)) {
            if (!v17_fits<C, H>(P, k)) { return false; }
            using T = V17<C, H>;
            static bool limit_set = false;
            static int nblk[3] = {0, 0, 0};
            auto launch = [&](auto kern, int NP) {
                ring_smem_limit(kern, T::SMEM, limit_set);
                if (nblk[NP] == 0) {
                    int per_sm = 0, dev = 0, sms = 0;
                    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, T::WARPS * 32, T::SMEM));
                    CK(cudaGetDevice(&dev));
                    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
                    nblk[NP] = std::max(1, per_sm * sms);
                }
                const int groups = (P.N + NP - 1) / NP;
                const int grid = std::min(nblk[NP], (int)cdiv(groups, T::WARPS));
                kern<<<grid, T::WARPS * 32, T::SMEM>>>(d.dslots + (size_t)k * P.N * C, d.dslotX, d.dsr,
                                                       d.slots + (size_t)k * P.N * C, d.r + (size_t)k * P.N, d.Gb, d.Sb,
                                                       d.lse, d.rd + k * P.J, P.nr[k],
                                                       d.qimg17 + (size_t)k * v17_img_elems(C), P.N);
                LAUNCH_CHECK();
            };
            if (v17_np == 2) { launch(route_gather_v17_kernel<C, H, 2>, 2); }
            else { launch(route_gather_v17_kernel<C, H, 1>, 1); }
            return true;
        } else {
            (void)P; (void)d; (void)k;
            return false;
        }
    }
    static KernelSet set() {
        return KernelSet{fwd2, bwd2, site3, site18, gather3, gather45, gather20, gather7, fwd13, fwd14, fwd21,
                         gather15, gather17, site22, gather22};
    }
};

static KernelSet kernel_set(int C, int H) {
#define RT_CASE(C_, H_) if (C == C_ && H == H_) { return Impl<C_, H_>::set(); }
#define RT_CASES(C_) RT_CASE(C_, 1) RT_CASE(C_, 2) RT_CASE(C_, 4) RT_CASE(C_, 8) RT_CASE(C_, 16)
    RT_CASES(512) RT_CASES(1024)
#undef RT_CASES
#undef RT_CASE
    fprintf(stderr, "error: no kernels built for C=%d H=%d (built: C in {512, 1024}, H in {1, 2, 4, 8, 16})\n", C, H);
    exit(1);
}

template <typename T> static T *dalloc(size_t count) {
    T *p = nullptr;
    CK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
    return p;
}

// floats in the dsr scratch: ds r per (position, reader, head) for the largest
// reader count, with v11's rows of H nrp (nrp = nmax rounded up to 4)
static size_t dsr_count(const Prob &P) { return (size_t)P.N * P.H * ((P.nmax + 3) & ~3); }

static Dev dev_alloc(const Prob &P) {
    const size_t N = P.N, C = P.C, H = P.H, J = P.J;
    const size_t nblk = cdiv(N, POS_PER_BLOCK), npart = cdiv(N, PART_ROWS);
    Dev d;
    d.slots = dalloc<bf16>(J * N * C); d.r = dalloc<float>(J * N);
    d.q = dalloc<float>(J * C); d.gm = dalloc<float>(J * C); d.g = dalloc<float>(J * C); d.dU = dalloc<float>(J * N * C);
    d.h = dalloc<bf16>(J * N * C); d.u = dalloc<bf16>(J * N * C); d.rstd = dalloc<float>(J * N);
    d.lse = dalloc<float>(J * N * H); d.a = dalloc<float>((size_t)P.P * N * H);
    d.dslots = dalloc<float>(J * N * C); d.dq = dalloc<float>(J * C); d.dgamma = dalloc<float>(J * C); d.dg = dalloc<float>(J * C);
    d.Gf = dalloc<float>(N * C); d.ds = dalloc<float>(N * H * P.nmax);
    d.part_qv = dalloc<float>(std::max(nblk, npart) * C); d.part_dg = dalloc<float>(std::max(nblk, (size_t)cdiv(N, 8)) * C);   // v20: blocks of 8
    d.dsr = dalloc<float>(dsr_count(P)); d.gpart = dalloc<float>(npart * P.nmax * C); d.qvacc = dalloc<float>(J * J * C);
    d.Gb = dalloc<bf16>(J * N * C); d.Sb = dalloc<float>(J * N * H); d.qg = dalloc<float>(J * C);
    d.src = dalloc<int>(J * J); d.nsrc = dalloc<int>(J); d.rd = dalloc<int>(J * J);
    d.dslotX = dalloc<bf16>(N * C);
    d.gpart45 = dalloc<float>(cdiv(N, PART_ROWS45) * P.nmax * C);
    d.part7 = dalloc<float>(N * C); d.T7 = dalloc<float>(N); d.dsr7 = dalloc<float>(N * P.nmax * H);
    d.ul7 = dalloc<int>(J * J * 3);
    // v13's partials, for groups of up to v13_kmax sites (any plan of this shape), in Gb when they fit:
    // the forward's scratch in a backward buffer, as the trainer does with route_G
    const size_t np13 = (size_t)(v13_kmax(P.C) - 1) * N * (C + H);
    d.p13own = np13 * 4 <= J * N * C * 2 ? nullptr : dalloc<float>(np13);
    d.p13h = d.p13own != nullptr ? d.p13own : reinterpret_cast<float *>(d.Gb);
    d.p13l = d.p13h + (size_t)(v13_kmax(P.C) - 1) * N * C;
    d.qf15 = dalloc<uint4>(J * 16 * C); d.nrd = dalloc<int>(J);
    d.qimg17 = dalloc<uint16_t>(J * v17_img_elems((int)C));
    d.qgx = dalloc<float>(J * C);
    CK(cudaMemcpy(d.nrd, P.nr.data(), J * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.ul7, P.v7_ul.data(), J * J * 3 * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.src, P.src.data(), J * J * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.nsrc, P.n.data(), J * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.rd, P.rd.data(), J * J * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}
static void dev_free(Dev &d) {
    void *ps[] = {d.slots, d.r, d.q, d.gm, d.g, d.dU, d.h, d.u, d.rstd, d.lse, d.a, d.dslots, d.dq, d.dgamma, d.dg,
                  d.Gf, d.ds, d.part_qv, d.part_dg, d.dsr, d.gpart, d.qvacc, d.qg, d.Gb, d.Sb, d.src, d.nsrc, d.rd,
                  d.dslotX, d.gpart45, d.part7, d.T7, d.dsr7, d.ul7, d.p13own, d.qf15, d.nrd, d.qimg17, d.qgx};
    for (void *p : ps) { CK(cudaFree(p)); }
}
static void dev_upload(const Dev &d, const HostIn &in) {
    CK(cudaMemcpy(d.slots, in.slots.data(), in.slots.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.q, in.q.data(), in.q.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.gm, in.gm.data(), in.gm.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.g, in.g.data(), in.g.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.dU, in.dU.data(), in.dU.size() * 4, cudaMemcpyHostToDevice));
}

// Forward of every site. want_a: v2/v3 also write a (for the check).
static void run_forward(int ver, const Prob &P, const Dev &d, const KernelSet &ks, bool want_a) {
    const size_t N = P.N, C = P.C, H = P.H, J = P.J;
    if (ver < 21) {   // v21, v22: r of slot j by site j's kernel
        source_stat_kernel<<<cdiv(J * N, 8), 256>>>(d.r, d.slots, J * N, P.C);
        LAUNCH_CHECK();
    }
    for (int j = 0; j < P.J; j++) {
        if (ver == 1) {
            route_fwd_v1_kernel<<<cdiv(N, 8), 256>>>(d.h + j * N * C, d.a + (size_t)P.pair_off[j] * N * H, d.lse + j * N * H,
                                                     d.slots, d.r, d.src + j * P.J, P.n[j], d.q + j * C, d.gm + j * C,
                                                     P.N, P.C, P.H);
            LAUNCH_CHECK();
            rmsnorm_fwd_v1_kernel<<<cdiv(N, 8), 256>>>(d.u + j * N * C, d.rstd + j * N, d.h + j * N * C, d.g + j * C, P.N, P.C);
            LAUNCH_CHECK();
        } else if (ver >= 13) {   // v15 .. v20: v14's forward
            if (ver == 13) { ks.fwd13(P, d, j); }
            else if (ver >= 21) { ks.fwd21(P, d, j); }   // (v22: v21's forward)
            else { ks.fwd14(P, d, j); }
            if (want_a) {   // a from the stored lse (the kernel does not write it)
                route_a_kernel<<<cdiv(N * H, 128), 128>>>(d.a + (size_t)P.pair_off[j] * N * H, d.lse + j * N * H,
                                                          d.slots, d.r, d.src + j * P.J, P.n[j], d.q + j * C,
                                                          d.gm + j * C, P.N, P.C, P.H);
                LAUNCH_CHECK();
            }
        } else {
            ks.fwd2(P, d, j, want_a, ver >= 8);
        }
    }
}

// v11's q/gamma pass of slot k (d.dsr as (N, H, nrp)) into d.gpart45, over np
// partitions, raising its shared-memory limit when a tile needs more.
// v11_force_sync: the plain copy of v instead of cp.async (--check's repeat).
static int v11_force_sync = 0;
template <int CPT> static void param_v11(const Prob &P, const Dev &d, int k, unsigned np) {
    const size_t N = P.N, C = P.C;
    int tp;
    const size_t smem = param_v11_smem(CPT, P.nr[k], P.H, &tp);
    static size_t smem_set = 0;
    if (smem > smem_set) {
        CK(cudaFuncSetAttribute(route_param_v11_kernel<CPT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = smem;
    }
    route_param_v11_kernel<CPT><<<dim3(cdiv(C, 256 * CPT), np), 256, smem>>>(d.gpart45, d.dsr, d.slots + k * N * C,
                                                                             P.nr[k], P.N, P.C, P.H, tp, v11_force_sync);
}

// The q/gamma pass of slot k (v4 and up) on dsr into d.gpart45: v4's, v5's (v5-v10), v11's
static void run_param_pass(int ver, const Prob &P, const Dev &d, int k, const float *dsr) {
    if (ver == 21) { ver = 16; }   // v21 changes only the forward
    const size_t N = P.N, C = P.C, H = P.H;
    const unsigned np = cdiv(N, PART_ROWS45);
    if (ver >= 16) {   // on tensor cores, partitions of v16_rows (v17: v16's pass)
        if (!v16_fits(P.C, P.H, P.nr[k])) {
            fprintf(stderr, "error: v16's q/gamma pass needs C %% 64 == 0, C/H %% 8 == 0, 1 <= nr <= 32 (slot %d: %d)\n", k, P.nr[k]);
            exit(1);
        }
        const size_t smem = v16_smem(P.C, P.H, P.nr[k]);
        static size_t smem_set = 0;
        if (smem > smem_set) {
            CK(cudaFuncSetAttribute(route_param_v16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            smem_set = smem;
        }
        route_param_v16_kernel<<<dim3(cdiv(C, 512), cdiv(N, v16_rows)), 256, smem>>>(d.gpart45, dsr, d.slots + k * N * C,
                                                                                    P.nr[k], P.N, P.C, P.H, v16_rows);
    } else if (ver >= 11) {   // v11, v12 .. v15
        if ((C / H) % 2 == 0) { param_v11<2>(P, d, k, np); }   // two channels a thread, of one head
        else { param_v11<1>(P, d, k, np); }
    } else if (ver >= 5) {
        int tp;
        size_t smem = param_v5_smem(P.nr[k], P.H, &tp);
        static size_t smem_set = 0;
        if (smem > smem_set) {
            CK(cudaFuncSetAttribute(route_param_v5_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            smem_set = smem;
        }
        route_param_v5_kernel<<<dim3(cdiv(C, 512), np), 256, smem>>>(d.gpart45, dsr, d.slots + k * N * C, P.nr[k], P.N,
                                                                     P.C, P.H, tp);
    } else {
        route_param_v4_kernel<<<dim3(cdiv(C, 256), np), 256>>>(d.gpart45, dsr, d.slots + k * N * C, P.nr[k], P.N, P.C,
                                                               P.H);
    }
    LAUNCH_CHECK();
}

// Backward of every site in reverse order (the forward's outputs must be there).
static void run_backward(int ver, const Prob &P, const Dev &d, const KernelSet &ks) {
    if (ver == 21) { ver = 16; }   // v21 changes only the forward
    const size_t N = P.N, C = P.C, H = P.H, J = P.J;
    const unsigned nblk = cdiv(N, POS_PER_BLOCK), npart = cdiv(N, PART_ROWS);
    if (ver <= 2) { CK(cudaMemsetAsync(d.dslots, 0, J * N * C * sizeof(float), 0)); }   // accumulated per pair
    if (ver >= 3) {
        mul_kernel<<<cdiv(J * C, 256), 256>>>(d.qg, d.q, d.gm, J * C);
        LAUNCH_CHECK();
    }
    if (ver == 15) {   // every slot's A fragments, once per backward
        route_qfrag15_kernel<<<dim3(cdiv(16 * C, 256), J), 256>>>(d.qf15, d.qg, d.rd, d.nrd, P.J, P.C);
        LAUNCH_CHECK();
    }
    if (ver == 22) {   // qg in hl order, once per backward
        qg_hl_kernel<<<cdiv(J * C, 256), 256>>>(d.qgx, d.qg, J * C, P.C);
        LAUNCH_CHECK();
    }
    if (ver == 23) {   // qg in pair order, once per backward
        qg_pair_kernel<<<cdiv(J * C, 256), 256>>>(d.qgx, d.qg, J * C, P.C);
        LAUNCH_CHECK();
    }
    if (ver == 17 && P.C == 512 && (P.C / P.H == 32 || P.C / P.H == 64)) {   // every slot's qg image, once per backward
        route_qimg17_kernel<<<dim3(cdiv(32 * C, 256), J), 256>>>(d.qimg17, d.qg, d.rd, d.nrd, P.J, P.C, P.H);
        LAUNCH_CHECK();
    }
    for (int j = P.J - 1; j >= 0; j--) {
        if (ver == 1) {
            rmsnorm_bwd_v1_kernel<<<nblk, 256, 8 * C * sizeof(float)>>>(d.Gf, d.part_dg, d.dU + j * N * C, d.h + j * N * C,
                                                                        d.rstd + j * N, d.g + j * C, P.N, P.C);
            LAUNCH_CHECK();
            reduce_part_kernel<<<cdiv(C, 256), 256>>>(d.dg + j * C, nullptr, nullptr, nullptr, d.part_dg, nblk, P.C);
            LAUNCH_CHECK();
            route_bwd_v1_kernel<<<cdiv(N, 8), 256>>>(d.dslots, d.ds, d.Gf, d.a + (size_t)P.pair_off[j] * N * H, d.slots, d.r,
                                                     d.src + j * P.J, P.n[j], d.q + j * C, d.gm + j * C, P.N, P.C, P.H);
            LAUNCH_CHECK();
            route_param_v1_kernel<<<dim3(cdiv(C, 32), npart), dim3(32, 8)>>>(d.part_qv, d.ds, d.slots, d.r, d.src + j * P.J,
                                                                              P.n[j], P.N, P.C, P.H);
            LAUNCH_CHECK();
            reduce_part_kernel<<<cdiv(C, 256), 256>>>(d.dq + j * C, d.gm + j * C, d.dgamma + j * C, d.q + j * C,
                                                      d.part_qv, npart, P.C);
            LAUNCH_CHECK();
        } else if (ver == 2) {
            ks.bwd2(P, d, j);
            reduce_part_kernel<<<cdiv(C, 256), 256>>>(d.dq + j * C, d.gm + j * C, d.dgamma + j * C, d.q + j * C,
                                                      d.part_qv, nblk, P.C);
            LAUNCH_CHECK();
            reduce_part_kernel<<<cdiv(C, 256), 256>>>(d.dg + j * C, nullptr, nullptr, nullptr, d.part_dg, nblk, P.C);
            LAUNCH_CHECK();
        } else if (ver >= 4) {   // v3's site kernel (v18, v19: staged); the trainer's gather and q/gamma pass
            const int k = j;
            if (ver == 20) {   // site j's norm backward inside slot j's gather; dg from its blocks of 8 positions
                ks.gather20(P, d, k);
                reduce_lanes_kernel<<<cdiv(C, 32), dim3(32, 32)>>>(d.dg + j * C, d.part_dg, (int)cdiv(N, 8), P.C);
                LAUNCH_CHECK();
            } else {
                if (ver == 22) { ks.site22(P, d, j); }
                else if (ver == 18 || ver == 19) { ks.site18(P, d, j, ver); }
                else { ks.site3(P, d, j); }
                reduce_part_kernel<<<cdiv(C, 256), 256>>>(d.dg + j * C, nullptr, nullptr, nullptr, d.part_dg, nblk, P.C);
                LAUNCH_CHECK();
            }
            const unsigned np = cdiv(N, PART_ROWS45);
            const float *dsr = d.dsr;
            if (ver == 7) {
                ks.gather7(P, d, k);
                if (P.v7_hi[k] >= 0) { dsr = d.dsr7; }   // a lo slot: its readers' ds r are in the second buffer
            } else if (ver == 15) {
                ks.gather15(P, d, k);
            } else if (ver == 17) {   // v17 where it fits, else v12's gather
                if (ks.gather17(P, d, k)) { v17_ran++; }
                else { v17_fell++; ks.gather45(P, d, k, ver); }
            } else if (ver == 22) {
                ks.gather22(P, d, k);
            } else if (ver != 20) {   // (v20 gathered above)
                ks.gather45(P, d, k, ver);
            }
            run_param_pass(ver, P, d, k, dsr);
            route_reduce45_kernel<<<dim3(cdiv(C, 32), P.nr[k]), dim3(32, 32)>>>(d.qvacc, d.gpart45, d.rd + k * P.J,
                                                                                 P.nr[k], ver >= 16 ? cdiv(N, v16_rows) : np,
                                                                                 k, P.J, P.C);
            LAUNCH_CHECK();
        } else {
            ks.site3(P, d, j);
            reduce_part_kernel<<<cdiv(C, 256), 256>>>(d.dg + j * C, nullptr, nullptr, nullptr, d.part_dg, nblk, P.C);
            LAUNCH_CHECK();
            // every site reading slot j is >= j, so all of them are done: gather slot j now
            const int k = j;
            ks.gather3(P, d, k);
            route_gather_param_kernel<<<dim3(cdiv(C, 32), npart), dim3(32, 8)>>>(d.gpart, d.dsr, d.slots + k * N * C,
                                                                                  P.nr[k], P.N, P.C, P.H);
            LAUNCH_CHECK();
            route_gather_reduce_kernel<<<dim3(cdiv(C, 256), P.nr[k]), 256>>>(d.qvacc, d.gpart, d.rd + k * P.J, P.nr[k],
                                                                              npart, k, P.J, P.C);
            LAUNCH_CHECK();
        }
    }
    if (ver >= 3) {
        route_dq_final_kernel<<<dim3(cdiv(C, 256), P.J), 256>>>(d.dq, d.dgamma, d.qvacc, d.src, d.nsrc, d.q, d.gm, P.J, P.C);
        LAUNCH_CHECK();
    }
}

// ----------------------------------------------------------------------------
// Check: one version against the float64 reference, on fresh random inputs

template <typename T> static std::vector<double> fetch(const T *dptr, size_t count) {
    std::vector<T> tmp(count);
    CK(cudaMemcpy(tmp.data(), dptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<double> o(count);
    for (size_t i = 0; i < count; i++) {
        if constexpr (sizeof(T) == 2) { uint16_t b; memcpy(&b, &tmp[i], 2); o[i] = bf_bits2f(b); }
        else { o[i] = (double)tmp[i]; }
    }
    return o;
}

// Tolerance per output: 2x the error bf16 storage alone causes (emulated on
// the CPU, same inputs) plus 1e-4 for fp32 arithmetic (exp of scores of a few
// units, sums over up to 2L+1 sources and C channels).
static bool check_config(int ver, int L, int S, int C, int H, int N, uint64_t seed) {
    Prob P = make_prob(L, S, C, H, N);
    // v7: pair every slot pair that shares a G row, not only those that save bytes (the byte rule
    // makes no pair at L=2): every config then runs both kinds of pass. The bench uses the byte rule.
    if (ver == 7) { build_v7_plan(P, -1e30); }
    // v13, v14: every group the slots allow (up to v13_kmax sites), not only those that save bytes
    if (ver >= 13) { build_v13_plan(P, v13_kmax(C), true); }
    KernelSet ks = kernel_set(C, H);
    HostIn in = make_inputs(P, seed);
    std::vector<double> slots = bf_to_d(in.slots), q = to_d(in.q), gm = to_d(in.gm), g = to_d(in.g), dU = to_d(in.dU);
    Ref R;
    ref_forward(P, slots.data(), q.data(), gm.data(), g.data(), EMU_EXACT, R);
    ref_backward(P, slots.data(), q.data(), gm.data(), g.data(), dU.data(), EMU_EXACT, R);
    double emu[NUM_OUT];
    emu_errors(P, in, R, ver, emu);

    Dev d = dev_alloc(P);
    dev_upload(d, in);
    const size_t J = P.J, NN = P.N;
    // poison every output (0xFF bytes: NaN in fp32 and in bf16); dslots too in v3, which writes it once
    CK(cudaMemset(d.h, 0xFF, J * NN * C * 2)); CK(cudaMemset(d.u, 0xFF, J * NN * C * 2));
    CK(cudaMemset(d.rstd, 0xFF, J * NN * 4)); CK(cudaMemset(d.lse, 0xFF, J * NN * H * 4));
    CK(cudaMemset(d.a, 0xFF, (size_t)P.P * NN * H * 4)); CK(cudaMemset(d.dslots, 0xFF, J * NN * C * 4));
    CK(cudaMemset(d.dq, 0xFF, J * C * 4)); CK(cudaMemset(d.dgamma, 0xFF, J * C * 4)); CK(cudaMemset(d.dg, 0xFF, J * C * 4));
    if (ver == 7) {   // and v7's scratch: a read of a partial or ds r never written gives NaN
        CK(cudaMemset(d.dsr, 0xFF, dsr_count(P) * 4)); CK(cudaMemset(d.dsr7, 0xFF, NN * P.nmax * H * 4));
        CK(cudaMemset(d.part7, 0xFF, NN * C * 4)); CK(cudaMemset(d.T7, 0xFF, NN * 4));
    }
    // and v11's: ds r and the q/gamma partials. The gather never writes dsr's padding readers
    // [nr, nrp), so they stay NaN through the run: v11's pass copies and sums them into
    // accumulators it never stores, and any that leaked would fail the check
    auto poison11 = [&]() {
        CK(cudaMemset(d.dsr, 0xFF, dsr_count(P) * 4));
        CK(cudaMemset(d.gpart45, 0xFF, (size_t)cdiv(NN, PART_ROWS45) * P.nmax * C * 4));
    };
    if (ver >= 11) { poison11(); }
    if (ver >= 21) { CK(cudaMemset(d.r, 0xFF, J * NN * 4)); }   // r: a read of one not yet computed gives NaN
    if (ver >= 13) {   // its partials: a read of one never written gives NaN
        CK(cudaMemset(d.p13h, 0xFF, (size_t)(v13_kmax(C) - 1) * NN * (C + H) * 4));
        printf("v%d plan: %d of %d sites start from a partial, %d of %d source rows read\n", ver, P.v13_starts, P.J,
               P.v13_rows, P.P);
    }
    run_forward(ver, P, d, ks, true);
    CK(cudaDeviceSynchronize());
    v17_ran = v17_fell = 0;
    run_backward(ver, P, d, ks);
    CK(cudaDeviceSynchronize());
    if (ver == 17) { printf("v17 (NP %d) took %d of %d slots (the others: v12's gather)\n", v17_np, v17_ran, v17_ran + v17_fell); }
    std::vector<double> got[NUM_OUT] = {fetch(d.h, J * NN * C), fetch(d.u, J * NN * C), fetch(d.rstd, J * NN),
                                        fetch(d.a, (size_t)P.P * NN * H), fetch(d.lse, J * NN * H),
                                        fetch(d.dslots, J * NN * C), fetch(d.dq, J * C), fetch(d.dgamma, J * C),
                                        fetch(d.dg, J * C)};
    // v18, v19: v16's backward from the same forward must give the same bits (they differ from it
    // only in how the site kernel loads its rows). v20: printed, not required: dg's per-block
    // sums cover 8 positions instead of 32, and the gradients differ in their last bits (the
    // likely cause: its norm backward reloads dU and g in its second pass where v3 keeps them
    // in registers, so the compiler can contract G's products into other FMAs). v22: printed too (its
    // head sums add the same products in another order)
    // v21: the r each site computed for its new slot must be source_stat_kernel's, bit for bit
    bool same_r = true;
    if (ver >= 21) {
        std::vector<double> r21 = fetch(d.r, J * NN);
        source_stat_kernel<<<cdiv(J * NN, 8), 256>>>(d.r, d.slots, J * NN, P.C);
        LAUNCH_CHECK();
        std::vector<double> rst = fetch(d.r, J * NN);
        same_r = memcmp(r21.data(), rst.data(), rst.size() * 8) == 0;
        printf("v%d r of every slot, by the site that reads it first, against source_stat_kernel: %s\n", ver,
               same_r ? "bit-identical" : "DIFFERENT (FAIL)");
    }
    bool same16 = true;
    if (ver >= 18) {
        poison11();
        CK(cudaMemset(d.dslots, 0xFF, J * NN * C * 4)); CK(cudaMemset(d.dq, 0xFF, J * C * 4));
        CK(cudaMemset(d.dgamma, 0xFF, J * C * 4)); CK(cudaMemset(d.dg, 0xFF, J * C * 4));
        run_backward(16, P, d, ks);
        CK(cudaDeviceSynchronize());
        std::vector<double> b16[4] = {fetch(d.dslots, J * NN * C), fetch(d.dq, J * C), fetch(d.dgamma, J * C),
                                      fetch(d.dg, J * C)};
        if (ver == 20 || ver == 22) {
            printf("v%d against v16's backward, rel diff:", ver);
            const char *nm[4] = {"dslots", "dq", "dgamma", "dg"};
            for (int o = 0; o < 4; o++) { printf(" %s %.1e", nm[o], rel_err(got[O_DSLOTS + o].data(), b16[o].data(), b16[o].size())); }
            printf("\n");
        } else {
            for (int o = 0; o < 4; o++) { same16 = same16 && memcmp(b16[o].data(), got[O_DSLOTS + o].data(), b16[o].size() * 8) == 0; }
            printf("v%d against v16's backward: %s\n", ver, same16 ? "bit-identical" : "DIFFERENT (FAIL)");
        }
    }
    // v7: the backward again, from the same forward: the gradients must repeat bit for bit.
    // v11: the same, with its q/gamma pass copying v by plain loads (the fallback for rows not in
    // 16-byte chunks, never taken at the lab's shapes): same sums, so bit for bit too
    bool same = true;
    if (ver == 7 || ver >= 11) {
        if (ver >= 11) {
            poison11();
            CK(cudaMemset(d.dslots, 0xFF, J * NN * C * 4)); CK(cudaMemset(d.dq, 0xFF, J * C * 4));
            CK(cudaMemset(d.dgamma, 0xFF, J * C * 4)); CK(cudaMemset(d.dg, 0xFF, J * C * 4));
            v11_force_sync = 1;
        }
        run_backward(ver, P, d, ks);
        CK(cudaDeviceSynchronize());
        v11_force_sync = 0;
        std::vector<double> again[4] = {fetch(d.dslots, J * NN * C), fetch(d.dq, J * C), fetch(d.dgamma, J * C),
                                        fetch(d.dg, J * C)};
        for (int o = 0; o < 4; o++) { same = same && memcmp(again[o].data(), got[O_DSLOTS + o].data(), again[o].size() * 8) == 0; }
        if (ver == 7) {
            printf("v%d backward repeated: %s (plan: %d pairs, %d of %d G rows)\n", ver,
                   same ? "bit-identical" : "DIFFERENT (FAIL)", P.v7_pairs, P.v7_rows, P.P);
        } else {
            printf("v%d backward repeated with the plain v copy: %s\n", ver, same ? "bit-identical" : "DIFFERENT (FAIL)");
        }
    }
    // v5 (v6, v8-v11 too): the bf16 copy of the last slot gathered (slot 0) must be dslot_0 rounded to bf16, bit for bit
    double xerr = 0.0;
    if (ver >= 5) {
        std::vector<double> x = fetch(d.dslotX, NN * C);
        for (size_t i = 0; i < NN * C; i++) {
            double e = fabs(x[i] - bfr(got[5][i]));
            if (!(e <= xerr)) { xerr = e; }   // NaN -> NaN
        }
    }
    dev_free(d);
    bool ok = (ver < 5 || xerr == 0.0) && same && same16 && same_r;
    if (ver >= 5) { printf("v%d dslot bf16 copy: max |copy - bf16(dslot_0)| = %g%s\n", ver, xerr, xerr == 0.0 ? "" : " (FAIL)"); }
    printf("v%d L=%-2d S=%d C=%-4d H=%-2d N=%-4d seed %-10llu", ver, L, S, C, H, N, (unsigned long long)seed);
    for (int o = 0; o < NUM_OUT; o++) {
        const std::vector<double> &ref = ref_out(R, o);
        double err = rel_err(got[o].data(), ref.data(), ref.size()), tol = 2 * emu[o] + 1e-4;
        bool pass = err <= tol;   // NaN/inf: err = inf, fails
        ok = ok && pass;
        printf(" %s %.1e%s", OUT_NAMES[o], err, pass ? "" : "(FAIL)");
    }
    // FNV-1a over the GPU outputs' bits: two runs with one seed must print the same hash (determinism)
    uint64_t hash = 1469598103934665603ull;
    for (int o = 0; o < NUM_OUT; o++) {
        for (double x : got[o]) {
            unsigned char b[8];
            memcpy(b, &x, 8);
            for (int k = 0; k < 8; k++) { hash = (hash ^ b[k]) * 1099511628211ull; }
        }
    }
    printf("  hash %016llx %s\n", (unsigned long long)hash, ok ? "ok" : "FAIL");
    return ok;
}

static bool check_version(int ver, uint64_t seed) {
    struct { int L, S, C, H, N; } cfgs[] = {
        {2, 1, 512, 8, 77}, {3, 1, 512, 1, 200}, {3, 2, 512, 4, 130}, {4, 3, 512, 16, 97},
        {12, 1, 512, 8, 96}, {12, 4, 512, 2, 50}, {2, 1, 1024, 8, 40}, {2, 1, 1024, 1, 33},
    };
    bool ok = true;
    int k = 0;
    for (auto &c : cfgs) { ok &= check_config(ver, c.L, c.S, c.C, c.H, c.N, seed + 1000 * (k++)); }
    printf("v%d check: %s (tolerance per output: 2 x emulated bf16 storage error + 1e-4)\n", ver, ok ? "PASS" : "FAIL");
    return ok;
}

// ----------------------------------------------------------------------------
// Bench: whole-model routing forward and backward at the given shapes

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static double measure_copy_gbs() {   // device-to-device copy, bytes read + written
    size_t bytes = (size_t)2 << 30;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int it = 0; it < 13; it++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 3) { ts.push_back(ms); }
    }
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    CK(cudaFree(a)); CK(cudaFree(b));
    return 2.0 * bytes / (median(ts) * 1e-3) / 1e9;
}

static void bench_version(int ver, int L, int S, int C, int H, int N, uint64_t seed, double copy_gbs) {
    Prob P = make_prob(L, S, C, H, N);
    KernelSet ks = kernel_set(C, H);
    // random, never zeros; kept for the next version of the same shape and seed (about 20 s of
    // draws at the 100M shape)
    static HostIn in;
    static long long key[6] = {-1, -1, -1, -1, -1, -1};
    const long long k2[6] = {L, S, C, H, N, (long long)seed};
    if (memcmp(key, k2, sizeof(key)) != 0) { in = make_inputs(P, seed); memcpy(key, k2, sizeof(key)); }
    Dev d = dev_alloc(P);
    dev_upload(d, in);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> tf, tb;
    for (int it = 0; it < 23; it++) {   // 3 warm-ups, 20 timed
        float ms;
        CK(cudaEventRecord(e0));
        run_forward(ver, P, d, ks, false);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 3) { tf.push_back(ms); }
        CK(cudaEventRecord(e0));
        run_backward(ver, P, d, ks);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 3) { tb.push_back(ms); }
    }
    // v4 and up: the q/gamma pass alone (the part v11 changes), slot by slot, the mean of 20 launches
    // each, on whatever ds r the last backward left (the time does not depend on it)
    double qg_ms = 0.0, qg_us4 = 0.0;
    if (ver >= 4) {
        for (int k = 0; k < P.J; k++) {
            float ms;
            CK(cudaEventRecord(e0));
            for (int it = 0; it < 20; it++) { run_param_pass(ver, P, d, k, d.dsr); }
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            qg_ms += ms / 20;
            if (k == 4) { qg_us4 = ms / 20 * 1e3; }
        }
    }
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    dev_free(d);
    Bytes b = count_bytes(P, ver);
    float mf = median(tf), mb = median(tb);
    double ff = b.fwd / (copy_gbs * 1e9) * 1e3, fb = b.bwd / (copy_gbs * 1e9) * 1e3;
    printf("v%d L=%d S=%d C=%d H=%d N=%d  fwd %7.3f ms (min %.3f, max %.3f) %6.2f GB -> %5.0f GB/s, floor %.3f ms (%.2fx)"
           "  bwd %7.3f ms (min %.3f, max %.3f) %6.2f GB -> %5.0f GB/s, floor %.3f ms (%.2fx)\n",
           ver, L, S, C, H, N, mf, *std::min_element(tf.begin(), tf.end()), *std::max_element(tf.begin(), tf.end()),
           b.fwd / 1e9, b.fwd / (mf * 1e-3) / 1e9, ff, mf / ff, mb, *std::min_element(tb.begin(), tb.end()),
           *std::max_element(tb.begin(), tb.end()), b.bwd / 1e9, b.bwd / (mb * 1e-3) / 1e9, fb, mb / fb);
    if (ver >= 4) {
        printf("v%d q/gamma pass alone: %.3f ms over the %d slots", ver, qg_ms, P.J);
        if (P.J > 4) { printf(" (slot 4, %d readers: %.1f us)", P.nr[4], qg_us4); }
        printf("\n");
    }
}

static void print_bytes(int L, int S, int C, int H, int N) {
    Prob P = make_prob(L, S, C, H, N);
    printf("bytes, L=%d S=%d C=%d H=%d N=%d: %d sites, %d (site, source) pairs; naive source reads %.0f B/token\n",
           L, S, C, H, N, P.J, P.P, (double)P.P * C * 2);
    for (int ver = 1; ver <= LAB_VMAX; ver++) {
        Bytes b = count_bytes(P, ver);
        printf("  v%d  fwd %8.0f B/token %6.2f GB/step (%.2f ms at 4.0, %.2f at 4.3, %.2f at 4.8 TB/s)"
               "   bwd %8.0f B/token %6.2f GB/step (%.2f / %.2f / %.2f ms)\n",
               ver, b.fwd / N, b.fwd / 1e9, b.fwd / 4.0e9, b.fwd / 4.3e9, b.fwd / 4.8e9, b.bwd / N, b.bwd / 1e9,
               b.bwd / 4.0e9, b.bwd / 4.3e9, b.bwd / 4.8e9);
    }
    // the slot gather alone (what the trainer's profile calls "slot gather"): v5 against v7
    const double Nd = N, V = 2.0 * C, F = 4.0 * C;
    const double per_slot = Nd * P.J * (V + 4 + F + V), row = Nd * (V + 8.0 * H), dsr = Nd * P.P * 4.0 * H;
    const double g5 = per_slot + P.P * row + dsr;
    const double g7 = per_slot + P.v7_rows * row + dsr + P.v7_pairs * Nd * (V + 4 + 2 * F + 8);
    printf("  slot gather: v5 %d G rows %.2f GB (%.2f ms at 4.2 TB/s); v7 %d pairs, %d G rows %.2f GB (%.2f ms)\n",
           P.P, g5 / 1e9, g5 / 4.2e9, P.v7_pairs, P.v7_rows, g7 / 1e9, g7 / 4.2e9);
    // v13's forward in source-row equivalents per token (a partial's mix, fp32, is 2 bf16 rows; written and
    // read again: 4), for its plan (by cost) and for groups wherever the slots allow (largest first)
    Prob A = P;
    build_v13_plan(A, v13_kmax(C), true);
    const double pr = 2.0 * (F + 4.0 * H) / V;   // a partial, out and in, in rows
    printf("  v13 forward, groups of up to %d sites: by cost %d rows + %d partials = %.1f row equivalents; "
           "wherever allowed %d rows + %d partials = %.1f (v12: %d rows)\n",
           v13_kmax(C), P.v13_rows, P.v13_starts, P.v13_rows + P.v13_starts * pr, A.v13_rows, A.v13_starts,
           A.v13_rows + A.v13_starts * pr, P.P);
    printf("  v13 groups by cost:");
    for (int j = 0; j < P.J; j++) {
        if (P.lead13[j] == j) { printf(" [%d", j); }
        else { printf(" %d", j); }
        if (j + 1 == P.J || P.lead13[j + 1] == j + 1) { printf("]"); }
    }
    printf("\n");
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv) {
    int ver = 0, vmax = 0, L = 12, S = 1, C = 512, H = 8, N = 16 * 2048;
    bool do_check = false, do_bench = false, do_all = false, do_self = false, do_bytes = false;
    uint64_t seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        auto val = [&](void) -> long long {
            if (i + 1 >= argc) { fprintf(stderr, "error: %s needs a value\n", a); exit(1); }
            return atoll(argv[++i]);
        };
        if (!strcmp(a, "--version")) { ver = (int)val(); }
        else if (!strcmp(a, "--vmax")) { vmax = (int)val(); }
        else if (!strcmp(a, "--check")) { do_check = true; }
        else if (!strcmp(a, "--bench")) { do_bench = true; }
        else if (!strcmp(a, "--all")) { do_all = true; }
        else if (!strcmp(a, "--cpu-selftest")) { do_self = true; }
        else if (!strcmp(a, "--bytes")) { do_bytes = true; }
        else if (!strcmp(a, "--seed")) { seed = (uint64_t)val(); }
        else if (!strcmp(a, "--L")) { L = (int)val(); }
        else if (!strcmp(a, "--S")) { S = (int)val(); }
        else if (!strcmp(a, "--C")) { C = (int)val(); }
        else if (!strcmp(a, "--H")) { H = (int)val(); }
        else if (!strcmp(a, "--N")) { N = (int)val(); }
        else { fprintf(stderr, "error: unknown flag %s (see the top of dev/cuda/route.cu)\n", a); return 1; }
    }
    if (L < 1 || S < 1 || C < 1 || H < 1 || C % H != 0 || N < 1) { fprintf(stderr, "error: bad shape\n"); return 1; }
    if (getenv("V16_ROWS") != NULL) {   // v16's partition of positions (a multiple of V16_TP)
        v16_rows = atoi(getenv("V16_ROWS"));
        if (v16_rows < 128 || v16_rows % V16_TP != 0) {
            fprintf(stderr, "error: V16_ROWS=%s: give a multiple of %d, at least 128 (default 256)\n", getenv("V16_ROWS"), V16_TP);
            return 1;
        }
    }
    if (getenv("V17_MIN_NR") != NULL) {   // the fewest readers a slot v17 takes
        v17_min_nr = atoi(getenv("V17_MIN_NR"));
        if (v17_min_nr < 1 || v17_min_nr > 32) { fprintf(stderr, "error: V17_MIN_NR=%s: give 1 to 32 (default 4)\n", getenv("V17_MIN_NR")); return 1; }
    }
    if (getenv("V17_NP") != NULL) {   // v17's positions a warp
        v17_np = atoi(getenv("V17_NP"));
        if (v17_np != 1 && v17_np != 2) { fprintf(stderr, "error: V17_NP=%s: give 1 or 2 (default 2)\n", getenv("V17_NP")); return 1; }
    }
    if (do_self) { return cpu_selftest(seed); }
    if (do_bytes) { print_bytes(L, S, C, H, N); return 0; }
    if (!do_all && !(ver >= 1 && ver <= LAB_VMAX && (do_check || do_bench))) {
        fprintf(stderr, "usage: route --version N (1..%d) --check | --bench;  route --all;  route --cpu-selftest;  route --bytes\n",
                LAB_VMAX);
        return 1;
    }
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB; seed %llu\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
           (unsigned long long)seed);
    int v0 = do_all ? 1 : ver, v1 = do_all ? LAB_VMAX : std::max(ver, std::min(vmax, LAB_VMAX));
    bool ok = true;
    if (do_all || do_check) {
        for (int v = v0; v <= v1; v++) { ok &= check_version(v, seed); }
    }
    if (do_all || do_bench) {
        double gbs = measure_copy_gbs();
        printf("device-to-device copy: %.0f GB/s (read + write); floors below use it\n", gbs);
        print_bytes(L, S, C, H, N);
        for (int v = v0; v <= v1; v++) { bench_version(v, L, S, C, H, N, seed, gbs); }
        if (do_all) {   // block mode too (Block MHAR, S = 4 as dev/runs/100m_block_mhar8_S4.sh: 6 blocks)
            for (int v = v0; v <= v1; v++) { bench_version(v, L, 4, C, H, N, seed, gbs); }
        }
    }
    return ok ? 0 : 1;
}
