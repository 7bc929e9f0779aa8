/*
dev/cuda/hc.cu: kernel lab for hyper-connections (SPEC section 8, hc mode): the n residual
streams' update and read, forward and backward, at the boundary between two sublayers.

Build (from the repository root; or `make lab`):
    nvcc -O3 -arch=sm_90a -o dev/cuda/hc dev/cuda/hc.cu
Run:
    ./hc --cpu-selftest            the fp64 reference backward vs central differences; no GPU needed
    ./hc --bytes                   bytes per position per sublayer and a step's floors (100m); no GPU needed
    ./hc --op OP --version N --check   version N of OP against the fp64 reference, twice
                                       (the two runs must be bit-identical)
    ./hc --op OP --version N --bench   version N of OP timed at the 100m shape
    ./hc --all                     --check and --bench of every op and version
  OP: fwd, bwd; without --op: both. Without --version: every version.
  options: --seed S (inputs; default 1234), --reps R (timed repeats, default 20)

The ops (kernels/hc.cuh gives the formulas): streams X (N, n, C) bf16, a position's n streams adjacent.
  fwd   X_j, o_j (N, C) bf16, A_j (n, n), beta_j (n), w_{j+1} (n):
        X_{j+1} = A X + beta o (bf16), h_{j+1} = sum_r w[r] X_{j+1,r} (bf16).
  bwd   dXp (N, n, C) fp32 = A_j^T dX_{j+1}, dh_j (N, C) fp32, X_j, w_j, X_{j-1}, o_{j-1}, A_{j-1}, beta_{j-1}:
        dXp <- A_{j-1}^T dX_j with dX_j = dXp + w_j dh_j; dout_{j-1} = beta_{j-1} . dX_j (bf16);
        dw_j, dA_{j-1}, dbeta_{j-1} += sums over positions (deterministic).
  100m: N = 16 * 2048 = 32768, C = 512, n = 4; 24 sublayer boundaries a step each way.

Storage, decided here: the streams are bf16 (floatX), like the std trainer's slots (the residual
stream x_j is a floatX slot of (N, C)); their gradient dXp is fp32, like std's running dres, since
it accumulates across all later sublayers. fp32 streams would double the streams' memory (8 KiB
per position per sublayer instead of 4 at n = 4) and the forward's bytes.

Versions:
  v1  one thread per (position, channel), unfused: fwd = an update kernel, then a read kernel
      (reading X_{j+1} back); bwd = an elementwise kernel writing dX_j (fp32, a temporary) and
      the new dXp and dout, then a parameter kernel (one block per part of positions, reading
      dh, X_j, dX_j, X_{j-1}, o_{j-1} again) and the reduction.
  v2  kernels/hc.cuh: one warp per position, 16-byte packs, the n x n mix in registers; the
      update and the next read in one pass (fwd); the read's backward, the update's backward
      and the parameter sums in one pass (bwd), then the reduction. --check of v2 also runs
      the trainer's edge paths (check_edges: X_0 as the embedding alone, the final site, the
      first sublayer). ptxas (sm_90a): n = 4 fwd 72 and bwd 128 registers, no spills; the bwd
      at n = 8 uses 255 registers and spills 712 bytes (correct, slower; 100m runs n = 4).

Bytes per position per sublayer (n = 4, C = 512), the floor of each op:
  fwd v2: reads X (2nC) and o (2C), writes X' (2nC) and h (2C): (4n + 4) C = 10 KiB
  bwd v2: reads dXp (4nC), dh (4C), X_j (2nC), X_{j-1} (2nC), o (2C), writes dXp (4nC), dout (2C):
          (12n + 8) C = 28 KiB
  std's residual path at the same places (dev/cuda/residual.cu v2): fwd 4 KiB (x, out, y, u; the
  norm included), bwd 8 KiB. hc adds (fwd 10 + bwd 28) - (std's add 3 + 6, the norm stays) ~ 29 KiB
  a position a sublayer: 24 x 32768 x 29 KiB = 23 GB a micro-step, ~5.8 ms at 4.0 TB/s.

Against the goals (memory at most 1.3x std, speed at least 0.90x std tokens/s at 100m), from
the repository's std measurement (695K tokens/s, 12.0 GiB: a micro-step of 32768 positions in
~47 ms). Predictions, not yet measured:
  v2 as the trainer calls it (train_mhar.cu, -r hc: h_j stored, the pre-norm a separate pass
     each way, rmsnorm_forward and rmsnorm_backward_residual as std's site 0; to measure with
     dev/bench_gpu.sh's hc4 line): memory
     +24 x 4 KiB streams + 25 x 1 KiB h rows + 8 KiB fp32 dXp = ~129 KiB a position, ~4.2 GB,
     ~1.35x; time ~(38 + 12 for the separate norms - 12 std's fused path) KiB x 24 x 32768
     = ~30 GB, 7.5 ms at the floor: ~0.84x.
  v3 (next): the pre-norm fused into both kernels (fwd writes u and rstd instead of h; bwd takes
     du, recomputes h = w . X_j from the streams it reads anyway, and sums the norm weight's
     gradient in its partials): no h rows stored, ~1.28x; +26 KiB a position a sublayer,
     ~5.1 ms at the floor: ~0.89x. With bf16 stream gradients dXp (if their accuracy holds,
     to measure) bwd falls to 20 KiB: ~0.93x.
  Storing no streams at all is possible: A, beta, alpha do not depend on the input, so X_j is a
  fixed linear mix of the embedding and o_0 .. o_{j-1} (the slots the trainer keeps anyway), with
  n x (j+1) coefficients per sublayer; the read h_j is then a static AttnRes-like mix of all
  earlier slots (memory of std, bytes like full mhar's routing).

Tolerances (rel = max|gpu - ref| / max|ref|; PASS needs every |gpu - ref| <= rtol |ref| + atol max|ref|).
The reference computes in fp64 from the bf16 inputs:
  - X' (bf16): rtol 2^-7, atol 1e-6: A X + beta o in fp32 (n + 1 terms), rounded once; the
    reference rounds its fp64 sum too, and where the two sums straddle a rounding boundary they
    land one bf16 ulp apart, up to 2^-7 of the value (the H200 run of 2026-12-02 failed a 2^-8
    bound this way at C=512 n=4, v1 and v2 alike, with normwise errors of 1.2e-3 to 1.9e-3).
  - h (bf16): rtol 2^-7 + atol 2^-8: h is summed from the rounded X' (each off by 2^-8) and rounded.
    The reference rounds X' to bf16 too (as the kernel does), so this is h's own rounding plus fp32.
  - dXp, dX (fp32): rtol 1e-5, atol 1e-6: fp32 sums of n + 1 terms.
  - dout (bf16): rtol 2^-8, atol 1e-6.
  - dw, dA, dbeta (fp32 sums over N positions x C channels of both signs): rtol 1e-4, atol 1e-5.
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
#include "../../kernels/hc.cuh"   // v2

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
static const Shape check_shapes[] = {{37, 8, 1}, {129, 64, 2}, {300, 512, 4}, {1000, 512, 4}, {77, 256, 8}};
static const Shape bench_shape = {16 * 2048, 512, 4};

// host inputs (bf16 values kept as floats so both sides see the same numbers)
struct Inputs {
    std::vector<float> X, Xprev, o, dXp, dh, A, beta, w, Aprev, bprev;
};
static Inputs make_inputs(const Shape &s, uint64_t seed) {
    host_rng = seed;
    Inputs in;
    size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
    auto bf = [](double v) { return bf2f(f2bf((float)v)); };
    in.X.resize(NS); in.Xprev.resize(NS); in.o.resize(NC); in.dXp.resize(NS); in.dh.resize(NC);
    for (auto &v : in.X) { v = bf(host_normal()); }
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

// device buffers of one shape
struct Dev {
    floatX *X, *Xprev, *o, *Xn, *h, *dout;
    float *dXp, *dXtmp, *dh, *A, *beta, *w, *Aprev, *bprev, *dw, *dA, *dbeta, *partial;
    int P, rows;
};
static Dev dev_make(const Shape &s, const Inputs &in) {
    Dev d;
    size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
    d.X = upload<floatX>(in.X); d.Xprev = upload<floatX>(in.Xprev); d.o = upload<floatX>(in.o);
    d.Xn = dalloc<floatX>(NS); d.h = dalloc<floatX>(NC); d.dout = dalloc<floatX>(NC);
    d.dXp = upload<float>(in.dXp); d.dXtmp = dalloc<float>(NS); d.dh = upload<float>(in.dh);
    d.A = upload<float>(in.A); d.beta = upload<float>(in.beta); d.w = upload<float>(in.w);
    d.Aprev = upload<float>(in.Aprev); d.bprev = upload<float>(in.bprev);
    int n = s.n;
    d.dw = dalloc<float>(n); d.dA = dalloc<float>(n * n); d.dbeta = dalloc<float>(n);
    d.rows = hc_rows_per_part(s.N);
    d.P = (int)ceil_div(s.N, d.rows);
    d.partial = dalloc<float>(hc_partial_floats(s.N, n));
    return d;
}
static void dev_free(Dev &d) {
    void *ps[] = {d.X, d.Xprev, d.o, d.Xn, d.h, d.dout, d.dXp, d.dXtmp, d.dh, d.A, d.beta, d.w, d.Aprev, d.bprev,
                  d.dw, d.dA, d.dbeta, d.partial};
    for (void *p : ps) { cudaCheck(cudaFree(p)); }
}

static void run_fwd(int ver, const Shape &s, Dev &d) {
    if (ver == 1) {
        hc_update_v1_kernel<<<ceil_div(s.N * s.n * s.C, 256), 256>>>(d.Xn, d.X, d.o, d.A, d.beta, s.N, s.C, s.n);
        launchCheck();
        hc_read_v1_kernel<<<ceil_div(s.N * s.C, 256), 256>>>(d.h, d.Xn, d.w, s.N, s.C, s.n);
        launchCheck();
    } else {
        hc_update_read_forward(d.Xn, d.h, d.X, d.o, d.A, d.beta, d.w, s.N, s.C, s.n);
    }
}
// bwd of the read of j (w, X) and the update of j-1 (Aprev, bprev, Xprev, o); dXp in place
static void run_bwd(int ver, const Shape &s, Dev &d) {
    if (ver == 1) {
        hc_backward_v1_kernel<<<ceil_div(s.N * s.C, 256), 256>>>(d.dXtmp, d.dXp, d.dout, d.dh, d.w, d.Aprev, d.bprev,
                                                                 s.N, s.C, s.n);
        launchCheck();
        const int NP = 2 * s.n + s.n * s.n;
        hc_params_v1_kernel<<<d.P, 64, 64 * NP * sizeof(float)>>>(d.partial, d.dXtmp, d.dh, d.X, d.Xprev, d.o, s.N,
                                                                  s.C, s.n, d.rows);
        launchCheck();
        hc_reduce_kernel<<<1, 128>>>(d.dw, d.dA, d.dbeta, d.partial, d.P, s.n);
        launchCheck();
    } else {
        hc_read_update_backward(d.dXp, d.dout, NULL, d.dw, d.dA, d.dbeta, d.partial, d.dXp, d.dh, d.X, d.w, d.Xprev,
                                d.o, d.Aprev, d.bprev, s.N, s.C, s.n);
    }
}

static bool check_op(bool fwd, int ver, uint64_t seed) {
    bool ok = true;
    int ns = quick ? 2 : (int)(sizeof(check_shapes) / sizeof(check_shapes[0]));
    for (int si = 0; si < ns; si++) {
        const Shape &s = check_shapes[si];
        Inputs in = make_inputs(s, seed + si);
        size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
        printf("%s v%d N=%zu C=%d n=%d:", fwd ? "fwd" : "bwd", ver, s.N, s.C, s.n);
        std::vector<unsigned char> first[5];
        for (int rep = 0; rep < 2; rep++) {
            Dev d = dev_make(s, in);
            zero(d.dw, s.n * 4); zero(d.dA, s.n * s.n * 4); zero(d.dbeta, s.n * 4);
            if (fwd) { run_fwd(ver, s, d); } else { run_bwd(ver, s, d); }
            cudaCheck(cudaDeviceSynchronize());
            std::vector<unsigned char> out[5];
            if (fwd) {
                out[0] = fetch_bytes(d.Xn, NS * 2); out[1] = fetch_bytes(d.h, NC * 2);
            } else {
                out[0] = fetch_bytes(d.dXp, NS * 4); out[1] = fetch_bytes(d.dout, NC * 2);
                out[2] = fetch_bytes(d.dw, s.n * 4); out[3] = fetch_bytes(d.dA, s.n * s.n * 4);
                out[4] = fetch_bytes(d.dbeta, s.n * 4);
            }
            if (rep == 0) {
                if (fwd) {
                    std::vector<double> Xn(NS), h(NC);
                    ref_forward(D(in.X).data(), D(in.o).data(), D(in.A).data(), D(in.beta).data(), D(in.w).data(),
                                s.N, s.C, s.n, true, Xn.data(), h.data());
                    ok &= compare("Xn", bytes_bf16_to_f(out[0]), Xn, 1.0 / 128, 1e-6);
                    ok &= compare("h", bytes_bf16_to_f(out[1]), h, 1.0 / 128, 1.0 / 256);
                } else {
                    std::vector<double> dXn(NS), dout(NC), dw(s.n, 0.0), dA(s.n * s.n, 0.0), db(s.n, 0.0);
                    ref_backward(D(in.dXp).data(), D(in.dh).data(), D(in.X).data(), D(in.w).data(),
                                 D(in.Xprev).data(), D(in.o).data(), D(in.Aprev).data(), D(in.bprev).data(), s.N, s.C,
                                 s.n, dXn.data(), dout.data(), dw.data(), dA.data(), db.data());
                    ok &= compare("dXp", bytes_f32(out[0]), dXn, 1e-5, 1e-6);
                    ok &= compare("dout", bytes_bf16_to_f(out[1]), dout, 1.0 / 256, 1e-6);
                    ok &= compare("dw", bytes_f32(out[2]), dw, 1e-4, 1e-5);
                    ok &= compare("dA", bytes_f32(out[3]), dA, 1e-4, 1e-5);
                    ok &= compare("dbeta", bytes_f32(out[4]), db, 1e-4, 1e-5);
                }
            }
            dev_free(d);
            if (repeat_done(rep, out, first, ok)) { break; }
        }
    }
    return ok;
}

// v2's trainer paths beside the op above (kernels/hc.cuh): the forward of sublayer 0's update
// from the embedding alone (xb: the n equal streams X_0 never stored), the final site's backward
// (dXp_in = NULL), the update of sublayer 0 in the backward (xpb: Xprev = the embedding), and
// sublayer 0's read backward (Xprev = X = NULL: dx0 += sum_r dX_0, the embedding's fp32 gradient).
static bool check_edges(uint64_t seed) {
    bool ok = true;
    const Shape s = {300, 512, 4};
    Inputs in = make_inputs(s, seed + 99);
    size_t NS = s.N * s.n * s.C, NC = s.N * s.C;
    int n = s.n;
    // X_0: stream 0 of X copied into every stream (host), and as one (N, C) row (device)
    std::vector<float> x0(NC), X0(NS);
    for (size_t p = 0; p < s.N; p++) {
        for (int c = 0; c < s.C; c++) {
            x0[p * s.C + c] = in.X[(p * n) * s.C + c];
            for (int r = 0; r < n; r++) { X0[(p * n + r) * s.C + c] = x0[p * s.C + c]; }
        }
    }
    Dev d = dev_make(s, in);
    floatX *dx0 = upload<floatX>(x0);
    std::vector<double> Xn(NS), h(NC), dXn(NS), dout(NC), dw(n), dA(n * n), db(n);
    auto zero_grads = [&]() { zero(d.dw, n * 4); zero(d.dA, n * n * 4); zero(d.dbeta, n * 4); };
    auto clear = [&]() { std::fill(dw.begin(), dw.end(), 0.0); std::fill(dA.begin(), dA.end(), 0.0);
                         std::fill(db.begin(), db.end(), 0.0); };
    printf("edges v2 N=%zu C=%d n=%d:", s.N, s.C, n);
    // 1. forward from the embedding (xb = 1)
    hc_update_read_forward(d.Xn, d.h, dx0, d.o, d.A, d.beta, d.w, s.N, s.C, n, 1);
    ref_forward(D(X0).data(), D(in.o).data(), D(in.A).data(), D(in.beta).data(), D(in.w).data(), s.N, s.C, n, true,
                Xn.data(), h.data());
    ok &= compare("xb:Xn", bytes_bf16_to_f(fetch_bytes(d.Xn, NS * 2)), Xn, 1.0 / 128, 1e-6);
    ok &= compare("xb:h", bytes_bf16_to_f(fetch_bytes(d.h, NC * 2)), h, 1.0 / 128, 1.0 / 256);
    // 2. the final site: dXp_in = NULL (zero)
    std::vector<double> zeros(NS, 0.0);
    zero_grads(); clear();
    hc_read_update_backward(d.dXtmp, d.dout, NULL, d.dw, d.dA, d.dbeta, d.partial, NULL, d.dh, d.X, d.w, d.Xprev,
                            d.o, d.Aprev, d.bprev, s.N, s.C, n);
    ref_backward(zeros.data(), D(in.dh).data(), D(in.X).data(), D(in.w).data(), D(in.Xprev).data(), D(in.o).data(),
                 D(in.Aprev).data(), D(in.bprev).data(), s.N, s.C, n, dXn.data(), dout.data(), dw.data(), dA.data(),
                 db.data());
    ok &= compare("final:dXp", bytes_f32(fetch_bytes(d.dXtmp, NS * 4)), dXn, 1e-5, 1e-6);
    ok &= compare("final:dA", bytes_f32(fetch_bytes(d.dA, n * n * 4)), dA, 1e-4, 1e-5);
    // 3. the update of sublayer 0 (xpb = 1: Xprev = the embedding)
    zero_grads(); clear();
    hc_read_update_backward(d.dXtmp, d.dout, NULL, d.dw, d.dA, d.dbeta, d.partial, d.dXp, d.dh, d.X, d.w, dx0,
                            d.o, d.Aprev, d.bprev, s.N, s.C, n, 1);
    ref_backward(D(in.dXp).data(), D(in.dh).data(), D(in.X).data(), D(in.w).data(), D(X0).data(), D(in.o).data(),
                 D(in.Aprev).data(), D(in.bprev).data(), s.N, s.C, n, dXn.data(), dout.data(), dw.data(), dA.data(),
                 db.data());
    ok &= compare("xpb:dXp", bytes_f32(fetch_bytes(d.dXtmp, NS * 4)), dXn, 1e-5, 1e-6);
    ok &= compare("xpb:dA", bytes_f32(fetch_bytes(d.dA, n * n * 4)), dA, 1e-4, 1e-5);
    // 4. sublayer 0's read: dx0 += sum_r (dXp_r + w[r] dh), onto dx0 = dh (any start value)
    cudaCheck(cudaMemcpy(d.dXtmp, d.dh, NC * 4, cudaMemcpyDeviceToDevice));
    hc_read_update_backward(NULL, NULL, d.dXtmp, NULL, NULL, NULL, d.partial, d.dXp, d.dh, NULL, d.w, NULL, NULL, NULL,
                            NULL, s.N, s.C, n);
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

static double fwd_bytes(const Shape &s) { return (4.0 * s.n + 4) * s.C * s.N; }
static double bwd_bytes(const Shape &s) { return (12.0 * s.n + 8) * s.C * s.N; }

static void bench_op(bool fwd, int ver, int reps, uint64_t seed, double gbs) {
    const Shape &s = bench_shape;
    Inputs in = make_inputs(s, seed);
    Dev d = dev_make(s, in);
    float mn;
    float ms = time_median(reps, [&]() { if (fwd) { run_fwd(ver, s, d); } else { run_bwd(ver, s, d); } }, &mn);
    double bytes = fwd ? fwd_bytes(s) : bwd_bytes(s);
    printf("%s v%d N=%zu C=%d n=%d: %.3f ms (min %.3f), %.0f GB/s; floor %.3f ms at 4.0 TB/s, %.3f at %.0f GB/s;"
           " x24 a step: %.2f ms\n", fwd ? "fwd" : "bwd", ver, s.N, s.C, s.n, ms, mn, bytes / (ms * 1e-3) / 1e9,
           bytes / 4.0e12 * 1e3, bytes / (gbs * 1e9) * 1e3, gbs, 24 * ms);
    dev_free(d);
}

static void print_bytes(void) {
    const Shape &s = bench_shape;
    printf("100m (N=%zu C=%d n=%d), bytes per position per sublayer: fwd %.1f KiB, bwd %.1f KiB\n", s.N, s.C, s.n,
           fwd_bytes(s) / s.N / 1024, bwd_bytes(s) / s.N / 1024);
    printf("a micro-step (24 boundaries each way): %.2f GB, floor %.2f ms at 4.0 TB/s\n",
           24 * (fwd_bytes(s) + bwd_bytes(s)) / 1e9, 24 * (fwd_bytes(s) + bwd_bytes(s)) / 4.0e12 * 1e3);
    printf("streams kept for the backward: %d B per position per sublayer (bf16), %.2f GB for 25 boundaries\n",
           2 * s.n * s.C, 25.0 * s.N * s.n * s.C * 2 / 1e9);
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
    // loss = R . X + P . h, so dL/dX = R + w P: dXp (= A_j^T dX_{j+1}) = R, dh = P
    std::vector<double> X(N * n * C), h(N * C);
    auto loss = [&]() {
        ref_forward(Xprev.data(), o.data(), A.data(), beta.data(), w.data(), N, C, n, false, X.data(), h.data());
        double l = 0;
        for (size_t i = 0; i < N * n * C; i++) { l += R[i] * X[i]; }
        for (size_t i = 0; i < N * C; i++) { l += P[i] * h[i]; }
        return l;
    };
    loss();
    std::vector<double> dXprev(N * n * C), dout(N * C), dw(n, 0.0), dA(n * n, 0.0), db(n, 0.0);
    ref_backward(R.data(), P.data(), X.data(), w.data(), Xprev.data(), o.data(), A.data(), beta.data(), N, C, n,
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
    bool ok = worst < 1e-7;
    printf("cpu-selftest: fp64 reference backward vs central differences, N=%zu C=%d n=%d: worst rel %.2e %s\n", N, C,
           n, worst, ok ? "PASS" : "FAIL");
    // v2's launch arithmetic: partial counts at the check and bench shapes
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
    bool do_check = false, do_bench = false, do_all = false, do_self = false, do_bytes = false;
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
        else if (!strcmp(a, "--seed")) { seed = strtoull(val(), NULL, 10); }
        else if (!strcmp(a, "--reps")) { reps = atoi(val()); }
        else if (!strcmp(a, "--quick")) { quick = true; }
        else { fprintf(stderr, "error: unknown flag %s (see the top of dev/cuda/hc.cu)\n", a); return 1; }
    }
    if (do_self) { return cpu_selftest(seed); }
    if (do_bytes) { print_bytes(); return 0; }
    if (ver < 0 || ver > 2 || reps < 1) {
        fprintf(stderr, "usage: hc [--op fwd|bwd] [--version 1..2] [--check] [--bench] [--seed S] [--reps R];"
                        "  hc --all;  hc --cpu-selftest;  hc --bytes\n");
        return 1;
    }
    if (do_all || (!op_fwd && !op_bwd)) { op_fwd = op_bwd = true; }
    if (do_all || (!do_check && !do_bench)) { do_check = do_bench = true; }
    if (do_all) { ver = 0; }
    const int v0 = ver ? ver : 1, v1 = ver ? ver : 2;
    print_device(seed);
    bool ok = true;
    if (do_check) {
        for (int v = v0; v <= v1; v++) {
            if (op_fwd) { ok &= check_op(true, v, seed); }
            if (op_bwd) { ok &= check_op(false, v, seed); }
        }
        if (v1 == 2) { ok &= check_edges(seed); }
    }
    if (do_bench) {
        double gbs = bench_intro(reps);
        for (int v = v0; v <= v1; v++) {
            if (op_fwd) { bench_op(true, v, reps, seed, gbs); }
            if (op_bwd) { bench_op(false, v, reps, seed, gbs); }
        }
    }
    if (do_check) { printf("all checks: %s\n", ok ? "PASS" : "FAIL"); }
    return ok ? 0 : 1;
}
