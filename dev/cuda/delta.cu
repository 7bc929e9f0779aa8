/*
dev/cuda/delta.cu: kernel lab for delta mode (SPEC section 9) in the CUDA trainer: the
backward of a routing site's null source (kernels/delta.cuh, delta_null_backward).

Build (from the repository root; or `make lab`):
    nvcc -O3 -arch=sm_90a -o dev/cuda/delta dev/cuda/delta.cu
Run:
    ./delta --cpu-selftest       the fp64 closed form against SPEC section 4's per-position dv summed
                                 over positions, and against central differences; no GPU needed
    ./delta --check              the kernel against the fp64 reference, twice (bit-identical runs)
    ./delta --bench              timed at the trainer's shapes
  Neither: both. Options: --seed S (default 1234), --reps R (default 20).

The op, per site j (kernels/delta.cuh has the formulas): inputs G (N, C) bf16 = dL/dmix_j,
S (N, H) fp32 = G[h] . mix_j[h], lse (N, H) fp32 (the forward's), the site's null n (C) bf16,
qg (C) fp32 and r (1) fp32; outputs dnull (C) fp32 (+=) and qv (C) fp32 (the (site, null)
pair's sum over positions of ds r v). 100m: N = 32768, C = 512, H = 8, 25 calls a step.
Minimum bytes a call: G (2 N C) + S and lse (8 N H) = 35.7 MB at 100m.

Versions: v1 (the only one): a warp per position, fixed partitions of rows per block, the
block's warps summed in order, then one thread per channel sums the partitions in order.

Tolerances: the reference computes in fp64 from the same bf16 / fp32 inputs; the GPU sums
N = 32768 terms in fp32 over two levels (rows of a partition, then partitions), so its
relative error is of order sqrt(N) * 2^-24 ~ 1e-5 of the largest term. rtol 1e-4 and
atol 1e-4 of max|ref|: a wrong term (a missing a G, a wrong head, a missing r^3 term) is
off by O(1) of max|ref|.
*/
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

// The trainer's bf16 build.
typedef __nv_bfloat16 floatX;

static void die(const char *msg, int C) { fprintf(stderr, "error: "); fprintf(stderr, msg, C); fprintf(stderr, "\n"); exit(1); }

#include "lab_util.cuh"
#include "../../kernels/delta.cuh"

// ----------------------------------------------------------------------------
// A routing site on the host, fp64: sources [n, v_1 .. v_m] at N positions, n the null
// (the same at every position). The null's key uses qgn, the other sources' keys qgv (the
// same values in the trainer; two arguments so that a difference in qgn isolates the
// null pair's share of dq, gamma: qv). Writes mix (N, C) and lse (N, H).

struct Site {
    int N, C, H, m;                  // positions, width, heads, sources besides the null
    std::vector<double> n, qg, v;    // null (C), q gamma (C), the other sources (m, N, C)
};

static double rms_r(const double *x, int C) {
    double ss = 0;
    for (int c = 0; c < C; c++) { ss += x[c] * x[c]; }
    return 1 / sqrt(ss / C + 1e-6);
}

static void site_forward(const Site &s, const double *n, const double *qgn, std::vector<double> &mix,
                         std::vector<double> &lse) {
    int N = s.N, C = s.C, H = s.H, HC = C / H, K = s.m + 1;
    mix.assign((size_t)N * C, 0);
    lse.assign((size_t)N * H, 0);
    std::vector<double> sc(K);
    for (int t = 0; t < N; t++) {
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < K; i++) {
                const double *x = i == 0 ? n : &s.v[((size_t)(i - 1) * N + t) * C];
                const double *qg = i == 0 ? qgn : s.qg.data();
                double e = 0;
                for (int c = h * HC; c < (h + 1) * HC; c++) { e += qg[c] * x[c]; }
                sc[i] = rms_r(x, C) * e;
            }
            double mx = *std::max_element(sc.begin(), sc.end()), z = 0;
            for (int i = 0; i < K; i++) { z += exp(sc[i] - mx); }
            lse[(size_t)t * H + h] = mx + log(z);
            for (int i = 0; i < K; i++) {
                const double *x = i == 0 ? n : &s.v[((size_t)(i - 1) * N + t) * C];
                double a = exp(sc[i] - mx) / z;
                for (int c = h * HC; c < (h + 1) * HC; c++) { mix[(size_t)t * C + c] += a * x[c]; }
            }
        }
    }
}

// The reference: SPEC section 4's dv of the null source at every position, summed, and
// the pair's sum of ds r v. G (N, C), S (N, H), lse (N, H).
static void null_grad_ref(std::vector<double> &dnull, std::vector<double> &qv, const std::vector<double> &G,
                          const std::vector<double> &S, const std::vector<double> &lse, const double *n,
                          const double *qg, double r, int N, int C, int H) {
    int HC = C / H;
    dnull.assign(C, 0);
    qv.assign(C, 0);
    std::vector<double> u(C), ds(H), a(H);
    for (int t = 0; t < N; t++) {
        double uv = 0;
        for (int h = 0; h < H; h++) {
            double e = 0, p = 0;
            for (int c = h * HC; c < (h + 1) * HC; c++) { e += qg[c] * n[c]; p += G[(size_t)t * C + c] * n[c]; }
            a[h] = exp(r * e - lse[(size_t)t * H + h]);
            ds[h] = a[h] * (p - S[(size_t)t * H + h]);
            for (int c = h * HC; c < (h + 1) * HC; c++) { u[c] = ds[h] * qg[c]; uv += u[c] * n[c]; }
        }
        for (int c = 0; c < C; c++) {
            int h = c / HC;
            dnull[c] += r * u[c] - r * r * r / C * uv * n[c] + a[h] * G[(size_t)t * C + c];
            qv[c] += ds[h] * r * n[c];
        }
    }
}

// The kernel's closed form (kernels/delta.cuh) in fp64
static void null_grad_closed(std::vector<double> &dnull, std::vector<double> &qv, const std::vector<double> &G,
                             const std::vector<double> &S, const std::vector<double> &lse, const double *n,
                             const double *qg, double r, int N, int C, int H) {
    int HC = C / H;
    std::vector<double> e(H, 0), A(H, 0), Gs(C, 0);
    double B = 0;
    for (int c = 0; c < C; c++) { e[c / HC] += qg[c] * n[c]; }
    for (int t = 0; t < N; t++) {
        for (int h = 0; h < H; h++) {
            double p = 0;
            for (int c = h * HC; c < (h + 1) * HC; c++) { p += G[(size_t)t * C + c] * n[c]; }
            double a = exp(r * e[h] - lse[(size_t)t * H + h]), ds = a * (p - S[(size_t)t * H + h]);
            A[h] += ds;
            B += ds * e[h];
            for (int c = h * HC; c < (h + 1) * HC; c++) { Gs[c] += a * G[(size_t)t * C + c]; }
        }
    }
    dnull.assign(C, 0);
    qv.assign(C, 0);
    for (int c = 0; c < C; c++) {
        dnull[c] = r * qg[c] * A[c / HC] - r * r * r / C * n[c] * B + Gs[c];
        qv[c] = r * n[c] * A[c / HC];
    }
}

// A site with random inputs; G random, S = G . mix per head, lse from the forward. With
// round_inputs, G and n are rounded to bf16 and S, lse, qg to fp32 first (the GPU's inputs).
static void make_case(Site &s, std::vector<double> &G, std::vector<double> &S, std::vector<double> &lse,
                      double &r, int N, int C, int H, int m, bool round_inputs) {
    s.N = N; s.C = C; s.H = H; s.m = m;
    auto bf = [&](double x) { return round_inputs ? (double)__bfloat162float(__float2bfloat16((float)x)) : x; };
    auto f32 = [&](double x) { return round_inputs ? (double)(float)x : x; };
    s.n.resize(C); s.qg.resize(C); s.v.resize((size_t)m * N * C);
    for (int c = 0; c < C; c++) { s.n[c] = bf(0.5 * host_normal()); s.qg[c] = f32(2.0 * host_normal() / sqrt((double)C / H)); }
    for (size_t i = 0; i < s.v.size(); i++) { s.v[i] = host_normal() * (1 + (i / C) % 3); }
    std::vector<double> mix;
    site_forward(s, s.n.data(), s.qg.data(), mix, lse);
    G.resize((size_t)N * C);
    for (size_t i = 0; i < G.size(); i++) { G[i] = bf(host_normal()); }
    S.assign((size_t)N * H, 0);
    int HC = C / H;
    for (int t = 0; t < N; t++) {
        for (int c = 0; c < C; c++) { S[(size_t)t * H + c / HC] += G[(size_t)t * C + c] * mix[(size_t)t * C + c]; }
    }
    for (double &x : S) { x = f32(x); }
    for (double &x : lse) { x = f32(x); }
    r = f32(rms_r(s.n.data(), C));
}

static double max_rel(const std::vector<double> &a, const std::vector<double> &b) {
    double m = 0, e = 0;
    for (size_t i = 0; i < b.size(); i++) { m = std::max(m, fabs(b[i])); e = std::max(e, fabs(a[i] - b[i])); }
    return m > 0 ? e / m : e;
}

// loss L = sum_t G_t . mix_t of the site (its gradient wrt n and the null's qg is what the op computes)
static double site_loss(const Site &s, const std::vector<double> &G, const double *n, const double *qgn) {
    std::vector<double> mix, lse;
    site_forward(s, n, qgn, mix, lse);
    double L = 0;
    for (size_t i = 0; i < mix.size(); i++) { L += G[i] * mix[i]; }
    return L;
}

static int cpu_selftest(void) {
    int fails = 0;
    const int shapes[][4] = {{5, 16, 1, 1}, {7, 16, 4, 3}, {6, 32, 8, 2}, {4, 64, 2, 5}};
    for (auto &sh : shapes) {
        int N = sh[0], C = sh[1], H = sh[2], m = sh[3];
        Site s;
        std::vector<double> G, S, lse, d_ref, q_ref, d_cl, q_cl;
        double r;
        make_case(s, G, S, lse, r, N, C, H, m, false);
        null_grad_ref(d_ref, q_ref, G, S, lse, s.n.data(), s.qg.data(), r, N, C, H);
        null_grad_closed(d_cl, q_cl, G, S, lse, s.n.data(), s.qg.data(), r, N, C, H);
        // central differences of L wrt n (through r, the key and the value) and wrt the null's qg
        std::vector<double> d_fd(C), q_fd(C), x = s.n, qx = s.qg;
        const double eps = 1e-6;
        for (int c = 0; c < C; c++) {
            x[c] = s.n[c] + eps; double lp = site_loss(s, G, x.data(), s.qg.data());
            x[c] = s.n[c] - eps; double lm = site_loss(s, G, x.data(), s.qg.data());
            x[c] = s.n[c];
            d_fd[c] = (lp - lm) / (2 * eps);
            qx[c] = s.qg[c] + eps; lp = site_loss(s, G, s.n.data(), qx.data());
            qx[c] = s.qg[c] - eps; lm = site_loss(s, G, s.n.data(), qx.data());
            qx[c] = s.qg[c];
            q_fd[c] = (lp - lm) / (2 * eps);
        }
        double e1 = std::max(max_rel(d_cl, d_ref), max_rel(q_cl, q_ref));
        double e2 = max_rel(d_ref, d_fd), e3 = max_rel(q_ref, q_fd);
        // closed form vs per-position sums: the same fp64 terms regrouped (~1e-15); central
        // differences with eps 1e-6: truncation ~1e-12, rounding ~1e-10 of |L| ~ 10
        bool ok = e1 < 1e-12 && e2 < 1e-7 && e3 < 1e-7;
        printf("%s N=%d C=%d H=%d sources 1+%d: closed form vs SPEC dv summed %.1e, dnull vs central "
               "differences %.1e, qv vs central differences %.1e\n", ok ? "PASS" : "FAIL", N, C, H, m, e1, e2, e3);
        fails += !ok;
    }
    // the comparison can fail: the closed form against the reference given G = 0 (no a G term, no p)
    {
        Site s;
        std::vector<double> G, S, lse, d_ref, q_ref, d_cl, q_cl;
        double r;
        make_case(s, G, S, lse, r, 6, 32, 4, 2, false);
        null_grad_ref(d_ref, q_ref, G, S, lse, s.n.data(), s.qg.data(), r, 6, 32, 4);
        std::vector<double> G0(G.size(), 0);
        null_grad_ref(d_cl, q_cl, G0, S, lse, s.n.data(), s.qg.data(), r, 6, 32, 4);
        double e = max_rel(d_cl, d_ref);
        bool ok = e > 1e-2;
        printf("%s a wrong gradient (the reference with G = 0) is told apart: rel %.1e\n", ok ? "PASS" : "FAIL", e);
        fails += !ok;
    }
    printf("cpu-selftest: %s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}

// ----------------------------------------------------------------------------
// The GPU: inputs uploaded, the op run, compared with the fp64 reference

struct Dev {
    floatX *G, *null;
    float *S, *lse, *qg, *r, *dnull, *qv, *part;
};

static Dev upload(const Site &s, const std::vector<double> &G, const std::vector<double> &S,
                  const std::vector<double> &lse, double r) {
    Dev d;
    size_t N = s.N, C = s.C, H = s.H;
    std::vector<floatX> g(G.size()), n(C);
    for (size_t i = 0; i < G.size(); i++) { g[i] = __float2bfloat16((float)G[i]); }
    for (size_t c = 0; c < C; c++) { n[c] = __float2bfloat16((float)s.n[c]); }
    std::vector<float> sf(S.begin(), S.end()), lf(lse.begin(), lse.end()), qf(s.qg.begin(), s.qg.end());
    float rf = (float)r;
    cudaCheck(cudaMalloc(&d.G, N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.null, C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.S, N * H * 4)); cudaCheck(cudaMalloc(&d.lse, N * H * 4));
    cudaCheck(cudaMalloc(&d.qg, C * 4)); cudaCheck(cudaMalloc(&d.r, 4));
    cudaCheck(cudaMalloc(&d.dnull, C * 4)); cudaCheck(cudaMalloc(&d.qv, C * 4));
    cudaCheck(cudaMalloc(&d.part, (size_t)RED_PARTS_MAX * (C + H + 1) * 4));
    cudaCheck(cudaMemcpy(d.G, g.data(), N * C * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.null, n.data(), C * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.S, sf.data(), N * H * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.lse, lf.data(), N * H * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.qg, qf.data(), C * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.r, &rf, 4, cudaMemcpyHostToDevice));
    return d;
}

static void free_dev(Dev &d) {
    cudaCheck(cudaFree(d.G)); cudaCheck(cudaFree(d.null)); cudaCheck(cudaFree(d.S)); cudaCheck(cudaFree(d.lse));
    cudaCheck(cudaFree(d.qg)); cudaCheck(cudaFree(d.r)); cudaCheck(cudaFree(d.dnull)); cudaCheck(cudaFree(d.qv));
    cudaCheck(cudaFree(d.part));
}

static void run_op(Dev &d, const Site &s) {
    zero(d.dnull, s.C * 4);
    delta_null_backward(d.dnull, d.qv, d.part, d.G, d.S, d.lse, d.null, d.qg, d.r, s.N, s.C, s.H);
}

static const int shapes_check[][4] = {{64, 32, 1, 1}, {1000, 64, 4, 2}, {4096, 256, 8, 3}, {32768, 512, 8, 3},
                                      {32768, 512, 16, 3}, {8192, 1024, 32, 2}};

static int check_all(void) {
    int fails = 0;
    for (auto &sh : shapes_check) {
        Site s;
        std::vector<double> G, S, lse, d_ref, q_ref;
        double r;
        make_case(s, G, S, lse, r, sh[0], sh[1], sh[2], sh[3], true);
        null_grad_ref(d_ref, q_ref, G, S, lse, s.n.data(), s.qg.data(), r, s.N, s.C, s.H);
        Dev d = upload(s, G, S, lse, r);
        run_op(d, s);
        std::vector<unsigned char> b1 = fetch_bytes(d.dnull, s.C * 4), c1 = fetch_bytes(d.qv, s.C * 4);
        run_op(d, s);
        std::vector<unsigned char> b2 = fetch_bytes(d.dnull, s.C * 4), c2 = fetch_bytes(d.qv, s.C * 4);
        printf("check N=%d C=%d H=%d:", s.N, s.C, s.H);
        bool ok = compare("dnull", bytes_f32(b1), d_ref, 1e-4, 1e-4);
        ok = compare("qv", bytes_f32(c1), q_ref, 1e-4, 1e-4) && ok;
        bool same = b1 == b2 && c1 == c2;
        printf(" reruns %s: %s\n", same ? "bit-identical" : "DIFFER", ok && same ? "PASS" : "FAIL");
        fails += !(ok && same);
        free_dev(d);
    }
    return fails;
}

static void bench_all(int reps) {
    bench_intro(reps);
    for (int k = 3; k <= 4; k++) {
        auto &sh = shapes_check[k];
        Site s;
        std::vector<double> G, S, lse;
        double r;
        make_case(s, G, S, lse, r, sh[0], sh[1], sh[2], 1, true);
        Dev d = upload(s, G, S, lse, r);
        float mn, ms = time_median(reps, [&]() { run_op(d, s); }, &mn);
        double gb = (2.0 * s.N * s.C + 8.0 * s.N * s.H) / 1e9;
        printf("bench N=%d C=%d H=%d: %.4f ms (min %.4f), %.1f MB, %.0f GB/s; x25 sites = %.3f ms a step\n", s.N, s.C,
               s.H, ms, mn, gb * 1e3, gb / (ms * 1e-3), 25 * ms);
        free_dev(d);
    }
}

int main(int argc, char **argv) {
    bool selftest = false, check = false, bench = false;
    uint64_t seed = 1234;
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cpu-selftest")) { selftest = true; }
        else if (!strcmp(argv[i], "--check")) { check = true; }
        else if (!strcmp(argv[i], "--bench")) { bench = true; }
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) { seed = strtoull(argv[++i], NULL, 10); }
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) { reps = atoi(argv[++i]); }
        else { fprintf(stderr, "usage: %s [--cpu-selftest] [--check] [--bench] [--seed S] [--reps R]\n", argv[0]); return 1; }
    }
    host_rng = seed;
    if (selftest) { return cpu_selftest(); }
    if (!check && !bench) { check = bench = true; }
    print_device(seed);
    int fails = check ? check_all() : 0;
    if (bench) { bench_all(reps); }
    if (check) { printf("%s\n", fails ? "FAIL" : "PASS"); }
    return fails ? 1 : 0;
}
