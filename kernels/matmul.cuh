// kernels/matmul.cuh: the matmuls by a weight W (OC, IC), through cuBLASLt (one handle,
// the default stream, no atomics): out (N, OC) = inp (N, IC) W^T and its two backward
// halves, dinp (N, IC) = dout W and dW (OC, IC) += dout^T inp. No custom kernel: cuBLASLt
// brings its own; fp32 compute, pedantic (no TF32) in the fp32 build. The lab
// dev/cuda/matmul.cu times these calls at the model's shapes (backend 5 is this file's
// choice), as one product per weight and fused over a sublayer's weights (what the trainer
// does for [Wq; Wk; Wv] and [Wg; Wu]: train_mhar.cu, "the GPU order").
//
// The algorithm of each product. The first time a product of a given shape runs (the
// transposes, sizes, leading dimensions, output type, beta and the operands' alignment),
// cuBLASLt's heuristic proposes up to MM_ALGOS algorithms. Each runs on trial operands of
// that shape (mm_choose); those whose output differs in any bit from the first proposal's
// are dropped (split-K variants sum in another order), and the fastest of the rest is kept
// (the median of MM_TUNE_REPS timed runs); cublasGemmEx's own algorithm is a candidate too,
// on the same terms. Which algorithm wins may differ from one run to the next,
// the bits cannot: every candidate kept computes exactly what the first proposal computes,
// and that depends on the shape alone (NOTES_matmul.md has the lab's figures). Where
// cuBLASLt proposes nothing, and in the fp32 build, the product runs through cublasGemmEx.
#pragma once

cublasHandle_t cublas;          // the fallback's handle, on the default stream
cublasLtHandle_t cublaslt;      // on the default stream
void *mm_workspace;             // cuBLASLt's workspace (32 MiB: cuBLAS's recommendation on Hopper)
const size_t MM_WORKSPACE = (size_t)32 << 20;
#define MM_ALGOS 8              // the heuristic's proposals tried per shape
#define MM_TUNE_REPS 3          // timed runs per proposal

// one product: C (m x n, column-major, ldc) = op(A) op(B) + beta C (cuBLAS's terms)
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc, c_f32, beta1, align;
} MatmulKey;
typedef struct {
    MatmulKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int gemmex;   // 1: cublasGemmEx runs it (cuBLASLt proposed nothing, or its own algorithm won)
} MatmulPlan;
MatmulPlan *mm_plans;   // every shape seen, in the order first seen
int mm_nplans, mm_cap;
cudaEvent_t mm_ev[2];

void matmul_setup(void) {
    if (cublaslt != NULL) { return; }
    cublasCheck(cublasCreate(&cublas));
    cublasCheck(cublasSetAtomicsMode(cublas, CUBLAS_ATOMICS_NOT_ALLOWED));   // deterministic
    cublasCheck(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));              // no TF32 unless asked
    cublasCheck(cublasLtCreate(&cublaslt));
    cudaCheck(cudaMalloc(&mm_workspace, MM_WORKSPACE));
    cudaCheck(cudaEventCreate(&mm_ev[0])); cudaCheck(cudaEventCreate(&mm_ev[1]));
}
void matmul_teardown(void) {
    if (cublaslt == NULL) { return; }
    for (int i = 0; i < mm_nplans; i++) {
        MatmulPlan *p = &mm_plans[i];
        cublasCheck(cublasLtMatrixLayoutDestroy(p->la)); cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->lc)); cublasCheck(cublasLtMatmulDescDestroy(p->desc));
    }
    free(mm_plans); mm_plans = NULL; mm_nplans = mm_cap = 0;
    cudaCheck(cudaEventDestroy(mm_ev[0])); cudaCheck(cudaEventDestroy(mm_ev[1]));
    cudaCheck(cudaFree(mm_workspace)); mm_workspace = NULL;
    cublasCheck(cublasLtDestroy(cublaslt)); cublaslt = NULL;
    cublasCheck(cublasDestroy(cublas)); cublas = NULL;
}

// *sum += a checksum of words [0, n) of p: each word mixed with its index, added as 64-bit
// integers (exact, so the order of the atomics does not matter)
__global__ void mm_checksum_kernel(const uint32_t *p, size_t n, unsigned long long *sum) {
    unsigned long long s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long x = ((unsigned long long)p[i] << 32 | (uint32_t)i) * 0x9e3779b97f4a7c15ull;
        s += x ^ (x >> 29);
    }
    if (s) { atomicAdd(sum, s); }
}
unsigned long long mm_checksum(const void *p, size_t bytes, unsigned long long *dsum) {
    unsigned long long s = 0;
    cudaCheck(cudaMemset(dsum, 0, sizeof(s)));
    mm_checksum_kernel<<<1024, 256>>>((const uint32_t *)p, bytes / 4, dsum);
    launchCheck();
    cudaCheck(cudaMemcpy(&s, dsum, sizeof(s), cudaMemcpyDeviceToHost));
    return s;
}

// runs the product of plan p with cuBLASLt's algorithm algo, or (algo NULL) cublasGemmEx
void mm_run(const MatmulPlan *p, const cublasLtMatmulAlgo_t *algo, const void *A, const void *B, void *C, float beta) {
    const float one = 1.0f;
    const MatmulKey *k = &p->key;
    if (algo != NULL) {
        cublasCheck(cublasLtMatmul(cublaslt, p->desc, &one, A, p->la, B, p->lb, &beta, C, p->lc, C, p->lc, algo,
                                   mm_workspace, MM_WORKSPACE, 0));
    } else {
        cublasCheck(cublasGemmEx(cublas, k->ta ? CUBLAS_OP_T : CUBLAS_OP_N, k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, k->m,
                                 k->n, k->k, &one, A, CUDA_FLOATX, k->lda, B, CUDA_FLOATX, k->ldb, &beta, C,
                                 k->c_f32 ? CUDA_R_32F : CUDA_FLOATX, k->ldc, CUBLAS_COMPUTE, CUBLAS_GEMM_DEFAULT));
    }
}

// x[i] uniform in [-1, 1) from a hash of i: the trial operands of mm_choose
template <typename T> __global__ void mm_fill_kernel(T *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long h = (i + 1) * 0x9e3779b97f4a7c15ull;
        h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ull;
        x[i] = fromF<T>((float)(h >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
}
// a scratch copy of an operand of elems elements (esz bytes each) filled by mm_fill_kernel,
// or NULL when it would take more than MM_TRIAL_MAX bytes
#define MM_TRIAL_MAX ((size_t)1 << 30)
void *mm_trial_operand(size_t elems, size_t esz) {
    if (elems * esz > MM_TRIAL_MAX) { return NULL; }
    void *p;
    cudaCheck(cudaMalloc(&p, elems * esz));
    if (esz == sizeof(float)) { mm_fill_kernel<float><<<1024, 256>>>((float *)p, elems); }
    else { mm_fill_kernel<floatX><<<1024, 256>>>((floatX *)p, elems); }
    launchCheck();
    return p;
}

// The algorithm of a shape seen for the first time, from trials on scratch operands of
// its shape filled with numbers (so that no all-zero operand can hide a different order of
// the sums): the proposals, their bits against the first one's, their times. A shape
// whose operands would not fit MM_TRIAL_MAX keeps the first proposal. Where the output is
// too large for a scratch copy and beta is 0, the trials write into C itself (the real
// product overwrites it).
void mm_choose(MatmulPlan *p, void *C) {
    const MatmulKey *k = &p->key;
    const float beta = k->beta1 ? 1.0f : 0.0f;
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &MM_WORKSPACE,
                                                     sizeof(MM_WORKSPACE)));
    const uint32_t al = (uint32_t)k->align;
    const cublasLtMatmulPreferenceAttributes_t at[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) { cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, at[i], &al, sizeof(al))); }
    cublasLtMatmulHeuristicResult_t res[MM_ALGOS];
    int got = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt, p->desc, p->la, p->lb, p->lc, p->lc, pref, MM_ALGOS,
                                                       res, &got);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    p->gemmex = st != CUBLAS_STATUS_SUCCESS || got == 0;
    if (p->gemmex) { return; }
    p->algo = res[0].algo;
    // column-major extents: A is (ta ? k x m : m x k), B (tb ? n x k : k x n), C m x n
    const size_t xe = sizeof(floatX), ce = k->c_f32 ? 4 : 2;
    const size_t ea = (size_t)k->lda * ((k->ta ? k->m : k->k) - 1) + (k->ta ? k->k : k->m);
    const size_t eb = (size_t)k->ldb * ((k->tb ? k->k : k->n) - 1) + (k->tb ? k->n : k->k);
    const size_t ec = (size_t)k->ldc * (k->n - 1) + k->m;
    void *A = mm_trial_operand(ea, xe), *B = mm_trial_operand(eb, xe), *Ct = mm_trial_operand(ec, ce);
    void *out = Ct != NULL ? Ct : (k->beta1 ? NULL : C);
    if (A != NULL && B != NULL && out != NULL) {
        unsigned long long *dsum, ref = 0;
        cudaCheck(cudaMalloc(&dsum, sizeof(*dsum)));
        float best_ms = 0;
        int best = 0;
        // a = got: cublasGemmEx's own algorithm, which it picks inside, maybe by the pointers'
        // alignment: a candidate only where the real operands are aligned as the trial ones
        for (int a = 0; a < got + (k->align == 256); a++) {
            const cublasLtMatmulAlgo_t *algo = a < got ? &res[a].algo : NULL;
            if (Ct != NULL) { cudaCheck(cudaMemset(Ct, 0, ec * ce)); }   // beta 1 adds to zeros, every trial
            mm_run(p, algo, A, B, out, beta);
            unsigned long long sum = mm_checksum(out, ec * ce, dsum);
            if (a == 0) { ref = sum; }
            else if (sum != ref) { continue; }   // other bits: not a candidate
            float ms[MM_TUNE_REPS];
            for (int r = 0; r < MM_TUNE_REPS; r++) {
                cudaCheck(cudaEventRecord(mm_ev[0]));
                mm_run(p, algo, A, B, out, beta);
                cudaCheck(cudaEventRecord(mm_ev[1]));
                cudaCheck(cudaEventSynchronize(mm_ev[1]));
                cudaCheck(cudaEventElapsedTime(&ms[r], mm_ev[0], mm_ev[1]));
            }
            for (int i = 1; i < MM_TUNE_REPS; i++) {   // sort: the median is ms[MM_TUNE_REPS / 2]
                for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) { float t = ms[j]; ms[j] = ms[j - 1]; ms[j - 1] = t; }
            }
            if (a == 0 || ms[MM_TUNE_REPS / 2] < best_ms) { best_ms = ms[MM_TUNE_REPS / 2]; best = a; }
        }
        cudaCheck(cudaFree(dsum));
        if (best < got) { p->algo = res[best].algo; }
        else { p->gemmex = 1; }
    }
    for (void *x : {A, B, Ct}) { if (x != NULL) { cudaCheck(cudaFree(x)); } }
}

// the largest power of two (at most 256) that divides every address
int mm_align(const void *A, const void *B, const void *C) {
    uintptr_t bits = (uintptr_t)A | (uintptr_t)B | (uintptr_t)C | 256;
    return (int)(bits & (~bits + 1));
}

// C = op(A) op(B) + beta C, A and B floatX, C fp32 (c_f32) or floatX, computed in fp32
void mm_product(int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B, int ldb, float beta,
                void *C, int ldc, int c_f32) {
    const MatmulKey key = {ta, tb, m, n, k, lda, ldb, ldc, c_f32, beta != 0.0f, mm_align(A, B, C)};
#ifdef PRECISION_FP32
    const MatmulPlan gemmex = {key};   // the fp32 build (true fp32, pedantic): cublasGemmEx for every product
    mm_run(&gemmex, NULL, A, B, C, beta);
#else
    MatmulPlan *p = NULL;
    for (int i = 0; i < mm_nplans && p == NULL; i++) {
        if (memcmp(&mm_plans[i].key, &key, sizeof(key)) == 0) { p = &mm_plans[i]; }
    }
    if (p == NULL) {   // a new shape
        if (mm_nplans == mm_cap) {
            mm_cap = mm_cap ? 2 * mm_cap : 32;
            mm_plans = (MatmulPlan *)realloc(mm_plans, mm_cap * sizeof(MatmulPlan));
            if (mm_plans == NULL) { fprintf(stderr, "error: out of host memory (matmul plans)\n"); exit(1); }
        }
        p = &mm_plans[mm_nplans++];
        memset(p, 0, sizeof(*p));
        p->key = key;
        const cudaDataType ct = c_f32 ? CUDA_R_32F : CUDA_FLOATX;
        const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE, CUDA_R_32F));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
        cublasCheck(cublasLtMatrixLayoutCreate(&p->la, CUDA_FLOATX, ta ? k : m, ta ? m : k, lda));
        cublasCheck(cublasLtMatrixLayoutCreate(&p->lb, CUDA_FLOATX, tb ? n : k, tb ? k : n, ldb));
        cublasCheck(cublasLtMatrixLayoutCreate(&p->lc, ct, m, n, ldc));
        mm_choose(p, C);
    }
    mm_run(p, p->gemmex ? NULL : &p->algo, A, B, C, beta);
#endif
}

// Every matmul multiplies by a weight W of shape (OC, IC), row-major like the
// CPU file. cuBLAS is column-major, where a row-major (R, K) matrix is its
// (K, R) transpose, so each product below is written for the transposes:
//   forward   out  (N, OC)  = inp (N, IC) . W^T     <=>  out^T  = W^T(op T) . inp^T
//   backward  dinp (N, IC)  = dout (N, OC) . W      <=>  dinp^T = W^T . dout^T
//             dW   (OC, IC) += dout^T . inp         <=>  dW^T  += inp^T . dout
// Inputs are floatX; dW accumulates (beta 1) in fp32. dinp, in fp32 or, where its
// consumer reads floatX, in floatX (attention's datty), is written (beta 0: its old
// contents, even NaN, are never read). A sublayer whose input feeds several weights
// multiplies by them side by side (train_mhar.cu's GPU order), so one product sums
// over all their outputs and no dinp is ever added to.

// out (N, OC) = inp (N, IC) . weight^T, weight (OC, IC)
void matmul_forward(floatX *out, const floatX *inp, const floatX *weight, size_t N, int IC, int OC) {
    mm_product(1, 0, OC, (int)N, IC, weight, IC, inp, IC, 0.0f, out, OC, 0);
}

// The two halves of matmul_forward's backward (out[n][o] = sum_i inp[n][i] * weight[o][i]).
// dinp (N, IC) = dout . weight (Tdinp: float or floatX)
template <typename Tdinp>
void matmul_backward_inp(Tdinp *dinp, const floatX *dout, const floatX *weight, size_t N, int IC, int OC) {
    mm_product(0, 0, IC, (int)N, OC, weight, IC, dout, OC, 0.0f, dinp, IC, sizeof(Tdinp) == sizeof(float));
}
// dweight (OC, IC) += dout^T . inp (fp32)
void matmul_backward_weight(float *dweight, const floatX *dout, const floatX *inp, size_t N, int IC, int OC) {
    mm_product(0, 1, IC, OC, (int)N, inp, IC, dout, OC, 1.0f, dweight, IC, 1);
}
// both: dinp, then dweight
template <typename Tdinp>
void matmul_backward(Tdinp *dinp, float *dweight, const floatX *dout, const floatX *inp, const floatX *weight,
                     size_t N, int IC, int OC) {
    matmul_backward_inp(dinp, dout, weight, N, IC, OC);
    matmul_backward_weight(dweight, dout, inp, N, IC, OC);
}
