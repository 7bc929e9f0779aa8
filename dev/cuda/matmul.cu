// dev/cuda/matmul.cu: the model's matmuls by a weight W (OC, IC) through cuBLAS, as the trainer
// calls them and fused, with a CPU reference, a check and a benchmark.
//
// Each op multiplies N rows by the weights of one or more tensors that read the same input
// (kernels/matmul.cuh's three products):
//   fwd   out_i (N, OC_i)  = inp (N, IC) . W_i^T
//   inp   dinp  (N, IC)    = sum_i dout_i (N, OC_i) . W_i        (fp32 or bf16, as the trainer)
//   w     dW_i  (OC_i, IC) += dout_i^T . inp                       (fp32)
// The ops of one layer at 100m: qkv (W_q, W_k, W_v: OC 512, 256, 256 from IC 512), o, gate/up
// (W_g, W_u: 1536, 1536), down; and the head (OC Vp = 50304) once a step.
//
// Layouts:
//   sep    the trainer today: one GEMM per tensor, each out_i / dout_i its own (N, OC_i) buffer;
//          the input gradient of a multi-tensor op is one GEMM per tensor into the same dinp
//          (the first sets it, the later ones read and add: fp32 traffic of 2 x (pieces - 1) + 1
//          passes over N x IC)
//   split  one GEMM per tensor, but out / dout is one (N, sum OC_i) buffer (row stride sum OC_i)
//   fused  one GEMM over the concatenated weight (sum OC_i, IC): out / dout (N, sum OC_i) and,
//          for the input gradient, K = sum OC_i (dinp written once)
// Backends:
//   1 cublasGemmEx, the default workspace (the trainer today)
//   2 cublasGemmEx, a 32 MiB workspace (cublasSetWorkspace; cuBLAS's recommendation on Hopper)
//   3 cublasLt, heuristic 0, 32 MiB workspace
//   4 cublasLt, the fastest of the first 16 heuristics, timed here (--check runs every one)
//   5 cublasLt, the fastest of those heuristics whose output is bit-identical to heuristic 0's
//     (the same sums in the same order: a choice by timing that cannot change a run's bits)
//
// Usage:
//   matmul --cpu-selftest      the layouts' GEMM descriptors, emulated in float64 as cuBLAS
//                              defines them (column-major), against the row-major formulas
//   matmul --check [--seed S]  every layout x backend (and every heuristic of 4) on the GPU
//                              against the float64 formulas at a small shape; run-to-run bits
//   matmul --bench [--preset 100m|350m] [--B B] [--reps R]
//                              ms per step of each op x layout x backend at the trainer's shape
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cublasLt.h>
typedef __nv_bfloat16 floatX;
#include "lab_util.cuh"

static void cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cuBLAS error at %s:%d: %s\n", file, line, cublasGetStatusString(s));
        exit(1);
    }
}
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)

// ---- the ops and their GEMM descriptors (host only: also used by the CPU self-test) ----

enum Kind { FWD = 0, INP = 1, WGT = 2 };
enum Layout { SEP = 0, SPLIT = 1, FUSED = 2 };
static const char *kind_name[] = {"fwd", "inp", "w"};
static const char *layout_name[] = {"sep", "split", "fused"};

struct OpDef {
    const char *name;
    int IC;
    std::vector<int> OC;   // one per tensor
    bool dinp_f32;         // the trainer's dinp type: fp32 (dln) or bf16 (datty, dmh)
    int per_step;          // calls a step (L per layer, 1 for the head)
    int OCt() const { int s = 0; for (int o : OC) { s += o; } return s; }
    int off(int i) const { int s = 0; for (int t = 0; t < i; t++) { s += OC[t]; } return s; }
};

// one cuBLAS call: C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C; A, B bf16
struct Gemm {
    bool ta, tb;   // transpose A, B
    int m, n, k;
    const void *A; int lda;
    const void *B; int ldb;
    float beta;
    void *C; int ldc;
    bool c_f32;
};

// The buffers of one op (device or host pointers; bf16 as uint16_t on the host):
//   inp (N, IC), W (OCt, IC) with W_i its rows off(i)..; out/dout fused (N, OCt);
//   outs[i]/douts[i] (N, OC_i) for sep; dinp (N, IC) fp32 or bf16; dW (OCt, IC) fp32
struct Bufs {
    void *inp, *W, *out, *dout, *dinp, *dW;
    std::vector<void *> outs, douts;
};

// the GEMMs of op o, kind k, layout l: the trainer's column-major reading of row-major
// matrices (kernels/matmul.cuh): out^T = W op(T) . inp^T, dinp^T = W^T . dout^T,
// dW^T += inp^T . dout
static std::vector<Gemm> gemms_of(const OpDef &o, Kind k, Layout l, const Bufs &b, int N) {
    std::vector<Gemm> g;
    const int P = (int)o.OC.size(), OCt = o.OCt(), IC = o.IC;
    auto W_i = [&](int i) { return (const void *)((const char *)b.W + (size_t)o.off(i) * IC * 2); };
    auto dW_i = [&](int i) { return (void *)((char *)b.dW + (size_t)o.off(i) * IC * 4); };
    auto dout_i = [&](int i, int *ld) -> const void * {
        if (l == SEP) { *ld = o.OC[i]; return b.douts[i]; }
        *ld = OCt; return (const char *)b.dout + (size_t)o.off(i) * 2;
    };
    if (k == FWD) {
        if (l == FUSED) { g.push_back({true, false, OCt, N, IC, b.W, IC, b.inp, IC, 0.f, b.out, OCt, false}); }
        for (int i = 0; l != FUSED && i < P; i++) {
            void *out = l == SEP ? b.outs[i] : (void *)((char *)b.out + (size_t)o.off(i) * 2);
            g.push_back({true, false, o.OC[i], N, IC, W_i(i), IC, b.inp, IC, 0.f, out, l == SEP ? o.OC[i] : OCt, false});
        }
    } else if (k == INP) {
        if (l == FUSED) { g.push_back({false, false, IC, N, OCt, b.W, IC, b.dout, OCt, 0.f, b.dinp, IC, o.dinp_f32}); }
        for (int i = 0; l != FUSED && i < P; i++) {
            int ld; const void *d = dout_i(i, &ld);
            g.push_back({false, false, IC, N, o.OC[i], W_i(i), IC, d, ld, i ? 1.f : 0.f, b.dinp, IC, o.dinp_f32});
        }
    } else {
        if (l == FUSED) { g.push_back({false, true, IC, OCt, N, b.inp, IC, b.dout, OCt, 1.f, b.dW, IC, true}); }
        for (int i = 0; l != FUSED && i < P; i++) {
            int ld; const void *d = dout_i(i, &ld);
            g.push_back({false, true, IC, o.OC[i], N, b.inp, IC, d, ld, 1.f, dW_i(i), IC, true});
        }
    }
    return g;
}

// ---- float64 emulation of a cuBLAS GEMM on host bf16 / fp32 matrices (the CPU self-test) ----

static double host_bf(const void *p, size_t i) { uint16_t v; memcpy(&v, (const char *)p + 2 * i, 2); return bf2f(v); }
// op(X)(r, c) of a column-major X with leading dimension ld
static double opel(const void *X, int ld, bool t, int r, int c) {
    return t ? host_bf(X, (size_t)r * ld + c) : host_bf(X, (size_t)c * ld + r);
}
// C = op(A) op(B) + beta C in float64, then stored as C's type (bf16 rounding by __float2bfloat16)
static void emulate(const Gemm &g) {
    for (int j = 0; j < g.n; j++) {
        for (int i = 0; i < g.m; i++) {
            double s = 0;
            for (int p = 0; p < g.k; p++) { s += opel(g.A, g.lda, g.ta, i, p) * opel(g.B, g.ldb, g.tb, p, j); }
            size_t at = (size_t)j * g.ldc + i;
            if (g.c_f32) {
                float *c = (float *)g.C;
                c[at] = (float)(s + (g.beta != 0 ? g.beta * c[at] : 0));
            } else {
                floatX v = __float2bfloat16((float)s);
                memcpy((char *)g.C + 2 * at, &v, 2);
            }
        }
    }
}

// ---- the logical results, row-major, from either layout (host copies) ----

// out (N, OCt) of a fwd: from the sep buffers or the one (N, OCt) buffer
static std::vector<double> logical_out(const OpDef &o, Layout l, const std::vector<std::vector<uint16_t>> &outs,
                                       const std::vector<uint16_t> &out, int N) {
    const int OCt = o.OCt();
    std::vector<double> r((size_t)N * OCt);
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < (int)o.OC.size(); i++) {
            for (int c = 0; c < o.OC[i]; c++) {
                r[(size_t)n * OCt + o.off(i) + c] = l == SEP ? host_bf(outs[i].data(), (size_t)n * o.OC[i] + c)
                                                             : host_bf(out.data(), (size_t)n * OCt + o.off(i) + c);
            }
        }
    }
    return r;
}
// the row-major formulas in float64: out = inp W^T, dinp = dout W, dW = dW0 + dout^T inp
static void reference(const OpDef &o, int N, const std::vector<uint16_t> &inp, const std::vector<uint16_t> &W,
                      const std::vector<uint16_t> &dout, const std::vector<float> &dW0, std::vector<double> &out,
                      std::vector<double> &dinp, std::vector<double> &dW) {
    const int OCt = o.OCt(), IC = o.IC;
    out.assign((size_t)N * OCt, 0); dinp.assign((size_t)N * IC, 0); dW.assign((size_t)OCt * IC, 0);
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < OCt; c++) {
            double s = 0;
            for (int i = 0; i < IC; i++) { s += host_bf(inp.data(), (size_t)n * IC + i) * host_bf(W.data(), (size_t)c * IC + i); }
            out[(size_t)n * OCt + c] = s;
        }
        for (int i = 0; i < IC; i++) {
            double s = 0;
            for (int c = 0; c < OCt; c++) { s += host_bf(dout.data(), (size_t)n * OCt + c) * host_bf(W.data(), (size_t)c * IC + i); }
            dinp[(size_t)n * IC + i] = s;
        }
    }
    for (int c = 0; c < OCt; c++) {
        for (int i = 0; i < IC; i++) {
            double s = dW0[(size_t)c * IC + i];
            for (int n = 0; n < N; n++) { s += host_bf(dout.data(), (size_t)n * OCt + c) * host_bf(inp.data(), (size_t)n * IC + i); }
            dW[(size_t)c * IC + i] = s;
        }
    }
}

// the ops of a model shape
static std::vector<OpDef> model_ops(int C, int NH, int NKV, int HD, int F, int V, int L) {
    int QD = NH * HD, KVD = NKV * HD;
    return {{"qkv", C, {QD, KVD, KVD}, true, L},
            {"o", QD, {C}, false, L},
            {"gate/up", C, {F, F}, true, L},
            {"down", F, {C}, false, L},
            {"head", C, {V}, true, 1}};
}
// a small shape for the checks: every op of the model's structure, small dimensions
static std::vector<OpDef> small_ops(void) { return model_ops(64, 4, 2, 16, 96, 200, 1); }

static std::vector<uint16_t> host_bf16_random(size_t n, double sd) {
    std::vector<uint16_t> v(n);
    for (size_t i = 0; i < n; i++) { floatX x = __float2bfloat16((float)(sd * host_normal())); memcpy(&v[i], &x, 2); }
    return v;
}

// ---- the CPU self-test: every descriptor of every layout, emulated, against the formulas ----

static int cpu_selftest(uint64_t seed) {
    host_rng = seed;
    const int N = 24;
    int fails = 0, checks = 0;
    for (const OpDef &o : small_ops()) {
        const int OCt = o.OCt(), IC = o.IC, P = (int)o.OC.size();
        std::vector<uint16_t> inp = host_bf16_random((size_t)N * IC, 1), W = host_bf16_random((size_t)OCt * IC, 0.1),
                              dout = host_bf16_random((size_t)N * OCt, 1);
        std::vector<float> dW0((size_t)OCt * IC);
        for (float &x : dW0) { x = (float)host_normal(); }
        std::vector<double> rout, rdinp, rdW;
        reference(o, N, inp, W, dout, dW0, rout, rdinp, rdW);
        std::vector<std::vector<uint16_t>> douts(P);
        for (int i = 0; i < P; i++) {
            douts[i].resize((size_t)N * o.OC[i]);
            for (int n = 0; n < N; n++) {
                memcpy(&douts[i][(size_t)n * o.OC[i]], &dout[(size_t)n * OCt + o.off(i)], 2 * o.OC[i]);
            }
        }
        for (int l = 0; l < 3; l++) {
            std::vector<std::vector<uint16_t>> outs(P);
            std::vector<uint16_t> out((size_t)N * OCt), dinp16((size_t)N * IC);
            std::vector<float> dinp32((size_t)N * IC), dW = dW0;
            Bufs b;
            b.inp = inp.data(); b.W = W.data(); b.out = out.data(); b.dout = dout.data(); b.dW = dW.data();
            b.dinp = o.dinp_f32 ? (void *)dinp32.data() : (void *)dinp16.data();
            for (int i = 0; i < P; i++) { outs[i].resize((size_t)N * o.OC[i]); b.outs.push_back(outs[i].data()); b.douts.push_back(douts[i].data()); }
            for (int k = 0; k < 3; k++) {
                for (const Gemm &g : gemms_of(o, (Kind)k, (Layout)l, b, N)) { emulate(g); }
            }
            std::vector<float> got_out, got_dinp, got_dW(dW.begin(), dW.end());
            for (double x : logical_out(o, (Layout)l, outs, out, N)) { got_out.push_back((float)x); }
            for (size_t i = 0; i < dinp32.size(); i++) { got_dinp.push_back(o.dinp_f32 ? dinp32[i] : (float)host_bf(dinp16.data(), i)); }
            // bf16 outputs: one rounding (2^-8 relative); fp32 sums of float64 terms: 1e-6
            printf("%-8s %-5s", o.name, layout_name[l]);
            bool ok = compare("fwd", got_out, rout, 4e-3, 1e-6);
            ok &= compare("inp", got_dinp, rdinp, o.dinp_f32 ? 1e-6 : 4e-3, 1e-6);
            ok &= compare("w", got_dW, rdW, 1e-6, 1e-6);
            printf("%s\n", ok ? "" : "  FAIL");
            fails += !ok; checks++;
        }
    }
    printf("cpu-selftest: %d of %d op x layout checks passed%s\n", checks - fails, checks, fails ? " (FAIL)" : "");
    return fails ? 1 : 0;
}

// ---- the GPU backends ----

static cublasHandle_t h_default, h_ws;   // 1: the default workspace; 2: 32 MiB
static cublasLtHandle_t lt;
static void *ws;
static const size_t WS_BYTES = (size_t)32 << 20;

static void run_gemmex(cublasHandle_t h, const Gemm &g) {
    const float one = 1.0f;
    cublasCheck(cublasGemmEx(h, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k,
                             &one, g.A, CUDA_R_16BF, g.lda, g.B, CUDA_R_16BF, g.ldb, &g.beta, g.C,
                             g.c_f32 ? CUDA_R_32F : CUDA_R_16BF, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// a cublasLt plan: the descriptors and the heuristics' algorithms for one Gemm
struct LtPlan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    std::vector<cublasLtMatmulHeuristicResult_t> algos;
    int pick = 0;
};
static LtPlan lt_plan(const Gemm &g, int max_algos) {
    LtPlan p;
    cublasCheck(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.c, g.c_f32 ? CUDA_R_32F : CUDA_R_16BF, g.m, g.n, g.ldc));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS_BYTES, sizeof(WS_BYTES)));
    p.algos.resize(max_algos);
    int got = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, max_algos, p.algos.data(), &got));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    p.algos.resize(got);
    if (got == 0) { fprintf(stderr, "error: cublasLt found no algorithm for a %dx%dx%d GEMM\n", g.m, g.n, g.k); exit(1); }
    return p;
}
static void lt_free(LtPlan &p) {
    cublasLtMatrixLayoutDestroy(p.a); cublasLtMatrixLayoutDestroy(p.b); cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
}
static void run_lt(const LtPlan &p, int algo, const Gemm &g) {
    const float one = 1.0f;
    cublasCheck(cublasLtMatmul(lt, p.desc, &one, g.A, p.a, g.B, p.b, &g.beta, g.C, p.c, g.C, p.c,
                               &p.algos[algo].algo, ws, WS_BYTES, 0));
}

// ---- device buffers of one op ----

struct DevOp {
    Bufs b;
    size_t N;
};
static DevOp dev_alloc(const OpDef &o, size_t N, uint64_t seed) {
    DevOp d; d.N = N;
    const size_t OCt = o.OCt(), IC = o.IC;
    d.b.inp = dalloc<floatX>(N * IC); d.b.W = dalloc<floatX>(OCt * IC);
    d.b.out = dalloc<floatX>(N * OCt); d.b.dout = dalloc<floatX>(N * OCt);
    d.b.dinp = dalloc<float>(N * IC); d.b.dW = dalloc<float>(OCt * IC);
    fill_normal((floatX *)d.b.inp, N * IC, seed + 1, 0, 1);
    fill_normal((floatX *)d.b.W, OCt * IC, seed + 2, 0, 0.05f);
    fill_normal((floatX *)d.b.dout, N * OCt, seed + 3, 0, 1);
    for (size_t i = 0; i < o.OC.size(); i++) {
        d.b.outs.push_back(dalloc<floatX>(N * o.OC[i]));
        floatX *di = dalloc<floatX>(N * o.OC[i]);
        cudaCheck(cudaMemcpy2D(di, 2 * o.OC[i], (char *)d.b.dout + 2 * o.off(i), 2 * OCt, 2 * o.OC[i], N,
                               cudaMemcpyDeviceToDevice));
        d.b.douts.push_back(di);
    }
    return d;
}
static void dev_free(DevOp &d) {
    for (void *p : {d.b.inp, d.b.W, d.b.out, d.b.dout, d.b.dinp, d.b.dW}) { cudaCheck(cudaFree(p)); }
    for (void *p : d.b.outs) { cudaCheck(cudaFree(p)); }
    for (void *p : d.b.douts) { cudaCheck(cudaFree(p)); }
}
template <typename T> static std::vector<T> fetch(const void *d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// runs the GEMMs of one kind with backend be (algo: cublasLt's heuristic index, backends 3-4)
static void run_gemms(const std::vector<Gemm> &gs, int be, const std::vector<LtPlan> &plans, const std::vector<int> &algo) {
    for (size_t i = 0; i < gs.size(); i++) {
        if (be == 1) { run_gemmex(h_default, gs[i]); }
        else if (be == 2) { run_gemmex(h_ws, gs[i]); }
        else { run_lt(plans[i], algo[i], gs[i]); }
    }
}

// ---- --check: every layout x backend at the small shape against the formulas ----

static int check(uint64_t seed) {
    const int N = 200;   // rows: not a multiple of the tiles
    int fails = 0, checks = 0;
    host_rng = seed;
    for (const OpDef &o : small_ops()) {
        DevOp d = dev_alloc(o, N, seed);
        const int OCt = o.OCt(), IC = o.IC, P = (int)o.OC.size();
        std::vector<uint16_t> inp = fetch<uint16_t>(d.b.inp, (size_t)N * IC), W = fetch<uint16_t>(d.b.W, (size_t)OCt * IC),
                              dout = fetch<uint16_t>(d.b.dout, (size_t)N * OCt);
        std::vector<float> dW0((size_t)OCt * IC);
        for (float &x : dW0) { x = (float)host_normal(); }
        std::vector<double> rout, rdinp, rdW;
        reference(o, N, inp, W, dout, dW0, rout, rdinp, rdW);
        if (!o.dinp_f32) {   // bf16 dinp buffers
            cudaCheck(cudaFree(d.b.dinp)); d.b.dinp = dalloc<floatX>((size_t)N * IC);
        }
        for (int l = 0; l < 3; l++) {
            for (int be = 1; be <= 4; be++) {
                std::vector<std::vector<Gemm>> gs(3);
                std::vector<std::vector<LtPlan>> plans(3);
                size_t nalg = 1;
                for (int k = 0; k < 3; k++) {
                    gs[k] = gemms_of(o, (Kind)k, (Layout)l, d.b, N);
                    for (const Gemm &g : gs[k]) { plans[k].push_back(lt_plan(g, be == 4 ? 16 : 1)); }
                    for (const LtPlan &p : plans[k]) { if (be >= 3) { nalg = std::max(nalg, p.algos.size()); } }
                }
                for (size_t a = 0; a < nalg; a++) {   // backend 4: every heuristic (clamped per GEMM)
                    std::vector<unsigned char> first[3], again[3];
                    bool ok = true;
                    for (int rep = 0; rep < 2; rep++) {
                        cudaCheck(cudaMemcpy(d.b.dW, dW0.data(), dW0.size() * 4, cudaMemcpyHostToDevice));
                        for (int k = 0; k < 3; k++) {
                            std::vector<int> algo;
                            for (const LtPlan &p : plans[k]) { algo.push_back(std::min(a, p.algos.size() - 1)); }
                            run_gemms(gs[k], be, plans[k], algo);
                        }
                        cudaCheck(cudaDeviceSynchronize());
                        std::vector<unsigned char> *dst = rep ? again : first;
                        if (l == SEP) {
                            for (int i = 0; i < P; i++) {
                                std::vector<unsigned char> t = fetch_bytes(d.b.outs[i], (size_t)N * o.OC[i] * 2);
                                dst[0].insert(dst[0].end(), t.begin(), t.end());
                            }
                        } else {
                            dst[0] = fetch_bytes(d.b.out, (size_t)N * OCt * 2);
                        }
                        dst[1] = fetch_bytes(d.b.dinp, (size_t)N * IC * (o.dinp_f32 ? 4 : 2));
                        dst[2] = fetch_bytes(d.b.dW, (size_t)OCt * IC * 4);
                    }
                    bool same = true;
                    for (int k = 0; k < 3; k++) { same &= first[k] == again[k]; }
                    // the logical results
                    std::vector<std::vector<uint16_t>> outs(P);
                    std::vector<uint16_t> out;
                    if (l == SEP) {
                        size_t at = 0;
                        for (int i = 0; i < P; i++) {
                            outs[i].resize((size_t)N * o.OC[i]);
                            memcpy(outs[i].data(), &first[0][at], outs[i].size() * 2); at += outs[i].size() * 2;
                        }
                    } else {
                        out.resize((size_t)N * OCt); memcpy(out.data(), first[0].data(), out.size() * 2);
                    }
                    std::vector<float> got_out, got_dinp, got_dW = bytes_f32(first[2]);
                    for (double x : logical_out(o, (Layout)l, outs, out, N)) { got_out.push_back((float)x); }
                    got_dinp = o.dinp_f32 ? bytes_f32(first[1]) : bytes_bf16_to_f(first[1]);
                    printf("%-8s %-5s be %d algo %2zu", o.name, layout_name[l], be, a);
                    // bf16 outputs: one rounding; fp32 outputs: fp32 sums of up to 200 terms
                    ok &= compare("fwd", got_out, rout, 8e-3, 1e-5);
                    ok &= compare("inp", got_dinp, rdinp, o.dinp_f32 ? 1e-5 : 8e-3, 1e-5);
                    ok &= compare("w", got_dW, rdW, 1e-5, 1e-5);
                    printf("  repeat %s%s\n", same ? "bit-identical" : "DIFFERENT", ok && same ? "" : "  FAIL");
                    fails += !(ok && same); checks++;
                }
                for (auto &pk : plans) { for (LtPlan &p : pk) { lt_free(p); } }
            }
        }
        dev_free(d);
    }
    printf("check: %d of %d passed%s\n", checks - fails, checks, fails ? " (FAIL)" : "");
    return fails ? 1 : 0;
}

// ---- --bench: ms per step of each op x kind x layout x backend ----

// *count += the 32-bit words where a and b differ
__global__ void count_diff_kernel(const uint32_t *a, const uint32_t *b, size_t n, unsigned long long *count) {
    unsigned long long c = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        c += a[i] != b[i];
    }
    if (c) { atomicAdd(count, c); }
}
// for each heuristic of plan p: 1 if its output of g equals heuristic 0's bit for bit (C restored
// from its contents before each run, so that beta = 1 products start from the same values)
static std::vector<int> same_bits_as_0(const Gemm &g, const LtPlan &p) {
    const size_t bytes = ((size_t)g.ldc * (g.n - 1) + g.m) * (g.c_f32 ? 4 : 2);   // C may start inside a wider row
    void *save = dalloc<char>(bytes), *ref = dalloc<char>(bytes);
    unsigned long long *cnt = dalloc<unsigned long long>(1);
    cudaCheck(cudaMemcpy(save, g.C, bytes, cudaMemcpyDeviceToDevice));
    std::vector<int> same(p.algos.size(), 0);
    for (size_t a = 0; a < p.algos.size(); a++) {
        cudaCheck(cudaMemcpy(g.C, save, bytes, cudaMemcpyDeviceToDevice));
        run_lt(p, (int)a, g);
        if (a == 0) { cudaCheck(cudaMemcpy(ref, g.C, bytes, cudaMemcpyDeviceToDevice)); same[0] = 1; continue; }
        cudaCheck(cudaMemset(cnt, 0, sizeof(*cnt)));
        count_diff_kernel<<<1024, 256>>>((const uint32_t *)g.C, (const uint32_t *)ref, bytes / 4, cnt);
        launchCheck();
        unsigned long long c = 0;
        cudaCheck(cudaMemcpy(&c, cnt, sizeof(c), cudaMemcpyDeviceToHost));
        same[a] = c == 0;
    }
    cudaCheck(cudaMemcpy(g.C, save, bytes, cudaMemcpyDeviceToDevice));
    cudaCheck(cudaFree(save)); cudaCheck(cudaFree(ref)); cudaCheck(cudaFree(cnt));
    return same;
}

static int bench(const char *preset, int B, int reps) {
    int L, C, NH, NKV, HD, F, T, V = 50304;
    if (!strcmp(preset, "100m")) { L = 12; C = 512; NH = 8; NKV = 4; HD = 64; F = 1536; T = 2048; }
    else if (!strcmp(preset, "350m")) { L = 24; C = 1024; NH = 16; NKV = 8; HD = 64; F = 3072; T = 1024; }
    else { fprintf(stderr, "error: --preset %s: use 100m or 350m\n", preset); return 1; }
    const size_t N = (size_t)B * T;
    printf("bench: preset %s, N = B x T = %d x %d; ms a step = ms a call x calls a step; "
           "median of %d (2 warm-ups)\n", preset, B, T, reps);
    printf("%-8s %-4s %-5s %6s | %9s %9s %9s %9s %9s | %7s  %s\n", "op", "kind", "lay", "calls", "be1 ms", "be2 ms",
           "be3 ms", "be4 ms", "be5 ms", "TFLOP/s", "(per GEMM: be4's pick / be5's pick / algos bit-identical to 0 / algos)");
    double tot[3][6] = {{0}};   // [layout][backend] ms a step, every op and kind
    for (const OpDef &o : model_ops(C, NH, NKV, HD, F, V, L)) {
        DevOp d = dev_alloc(o, N, 7);
        if (!o.dinp_f32) { cudaCheck(cudaFree(d.b.dinp)); d.b.dinp = dalloc<floatX>(N * o.IC); }
        for (int k = 0; k < 3; k++) {
            double flops = 2.0 * N * o.IC * o.OCt() * o.per_step;
            double ms[3][6] = {{0}};   // [layout][backend], ms a call
            for (int l = 0; l < 3; l++) {
                // one tensor: the three layouts are the same GEMM; the input gradient: split = sep
                if ((o.OC.size() == 1 && l != SEP) || (k == INP && l == SPLIT)) {
                    for (int be = 1; be <= 5; be++) { ms[l][be] = ms[SEP][be]; }
                    continue;
                }
                std::vector<Gemm> gs = gemms_of(o, (Kind)k, (Layout)l, d.b, (int)N);
                std::vector<LtPlan> plans;
                for (const Gemm &g : gs) { plans.push_back(lt_plan(g, 16)); }
                std::vector<int> best(gs.size(), 0), best5(gs.size(), 0), a0(gs.size(), 0), nsame(gs.size(), 0);
                float mn;
                for (int be = 1; be <= 3; be++) {
                    ms[l][be] = time_median(reps, [&]() { run_gemms(gs, be, plans, a0); }, &mn);
                }
                // backends 4 and 5: each GEMM's fastest heuristic (5: of those with heuristic 0's
                // bits), then the list timed as a whole
                for (size_t i = 0; i < gs.size(); i++) {
                    float bt = 1e30f, bt5 = 1e30f;
                    std::vector<Gemm> one = {gs[i]};
                    std::vector<LtPlan> p1 = {plans[i]};
                    std::vector<int> same = same_bits_as_0(gs[i], plans[i]);
                    for (size_t a = 0; a < plans[i].algos.size(); a++) {
                        std::vector<int> a1 = {(int)a};
                        float t = time_median(std::max(3, reps / 4), [&]() { run_gemms(one, 3, p1, a1); }, &mn);
                        if (t < bt) { bt = t; best[i] = (int)a; }
                        if (same[a] && t < bt5) { bt5 = t; best5[i] = (int)a; }
                        nsame[i] += same[a];
                    }
                }
                ms[l][4] = time_median(reps, [&]() { run_gemms(gs, 4, plans, best); }, &mn);
                ms[l][5] = time_median(reps, [&]() { run_gemms(gs, 4, plans, best5); }, &mn);
                printf("%-8s %-4s %-5s %6d |", o.name, kind_name[k], layout_name[l], o.per_step);
                for (int be = 1; be <= 5; be++) { printf(" %9.3f", ms[l][be] * o.per_step); }
                printf(" | %7.0f  (", flops / (ms[l][5] * o.per_step * 1e-3) / 1e12);
                for (size_t i = 0; i < gs.size(); i++) {
                    printf("%s%d/%d/%d/%zu", i ? " " : "", best[i], best5[i], nsame[i], plans[i].algos.size());
                }
                printf(")\n");
                for (LtPlan &p : plans) { lt_free(p); }
            }
            for (int l = 0; l < 3; l++) {
                for (int be = 1; be <= 5; be++) { tot[l][be] += ms[l][be] * o.per_step; }
            }
        }
        dev_free(d);
    }
    printf("all the step's matmuls, ms (be1 sep = the trainer today):\n");
    for (int l = 0; l < 3; l++) {
        printf("  %-5s", layout_name[l]);
        for (int be = 1; be <= 5; be++) { printf("  be%d %7.3f", be, tot[l][be]); }
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv) {
    bool do_self = false, do_check = false, do_bench = false;
    uint64_t seed = 1;
    int B = 16, reps = 20;
    const char *preset = "100m";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        auto val = [&](void) -> const char * {
            if (i + 1 >= argc) { fprintf(stderr, "error: %s needs a value\n", a); exit(1); }
            return argv[++i];
        };
        if (!strcmp(a, "--cpu-selftest")) { do_self = true; }
        else if (!strcmp(a, "--check")) { do_check = true; }
        else if (!strcmp(a, "--bench")) { do_bench = true; }
        else if (!strcmp(a, "--seed")) { seed = strtoull(val(), NULL, 10); }
        else if (!strcmp(a, "--B")) { B = atoi(val()); }
        else if (!strcmp(a, "--reps")) { reps = atoi(val()); }
        else if (!strcmp(a, "--preset")) { preset = val(); }
        else { fprintf(stderr, "error: unknown flag %s (see the top of dev/cuda/matmul.cu)\n", a); return 1; }
    }
    if (do_self) { return cpu_selftest(seed); }
    if (!do_check && !do_bench) { do_check = do_bench = true; }
    if (B < 1 || reps < 1) { fprintf(stderr, "error: --B and --reps must be at least 1\n"); return 1; }
    print_device(seed);
    cublasCheck(cublasCreate(&h_default));
    cublasCheck(cublasCreate(&h_ws));
    cublasCheck(cublasLtCreate(&lt));
    cudaCheck(cudaMalloc(&ws, WS_BYTES));
    for (cublasHandle_t h : {h_default, h_ws}) { cublasCheck(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED)); }
    cublasCheck(cublasSetWorkspace(h_ws, ws, WS_BYTES));
    int rc = 0;
    if (do_check) { rc |= check(seed); }
    if (do_bench) { rc |= bench(preset, B, reps); }
    return rc;
}
