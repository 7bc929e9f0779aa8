// Benchmark of the CPU matmul: the cache-blocked gemm of train_mhar.c against a
// naive triple loop, on the shapes of the 100M model (N = B*T = 1024 rows).
// Prints GFLOP/s of each and the ratio. Build and run: make dev/bench_matmul && ./dev/bench_matmul
#define TESTING
#include "train_mhar.c"

// out (N, OC) = inp (N, IC) . W^T, the textbook way
static void matmul_naive(real *out, const real *inp, const real *w, int N, int IC, int OC) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            real s = 0;
            for (int i = 0; i < IC; i++) { s += inp[(size_t)n * IC + i] * w[(size_t)o * IC + i]; }
            out[(size_t)n * OC + o] = s;
        }
    }
}

static double time_it(void (*fn)(void *), void *arg, int reps) {
    fn(arg);   // warm-up
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = wall_ms();
        fn(arg);
        double t = wall_ms() - t0;
        if (t < best) { best = t; }
    }
    return best;
}

typedef struct { real *out, *inp, *w, *dinp, *dw; int N, IC, OC; } Job;
static void run_naive(void *p) { Job *j = (Job *)p; matmul_naive(j->out, j->inp, j->w, j->N, j->IC, j->OC); }
static void run_fwd(void *p) { Job *j = (Job *)p; matmul_forward(j->out, j->inp, j->w, j->N, j->IC, j->OC); }
static void run_bwd(void *p) { Job *j = (Job *)p; matmul_backward(j->dinp, j->dw, j->out, j->inp, j->w, j->N, j->IC, j->OC); }

int main(void) {
    int shapes[][3] = {{1024, 512, 512}, {1024, 512, 1536}, {1024, 1536, 512}, {1024, 512, 8192}};
    printf("%-18s %10s %10s %10s %8s\n", "N x IC -> OC", "naive", "gemm fwd", "gemm bwd", "fwd/naive");
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        Job j;
        j.N = shapes[s][0]; j.IC = shapes[s][1]; j.OC = shapes[s][2];
        size_t ni = (size_t)j.N * j.IC, nw = (size_t)j.OC * j.IC, no = (size_t)j.N * j.OC;
        j.inp = (real *)malloc_check(ni * sizeof(real)); j.dinp = (real *)calloc_check(ni, sizeof(real));
        j.w = (real *)malloc_check(nw * sizeof(real)); j.dw = (real *)calloc_check(nw, sizeof(real));
        j.out = (real *)malloc_check(no * sizeof(real));
        uint64_t rng = 1;
        for (size_t i = 0; i < ni; i++) { j.inp[i] = rng_f32(&rng) - 0.5f; }
        for (size_t i = 0; i < nw; i++) { j.w[i] = rng_f32(&rng) - 0.5f; }
        // correctness first: gemm against the naive loop
        real *ref = (real *)malloc_check(no * sizeof(real));
        matmul_naive(ref, j.inp, j.w, j.N, j.IC, j.OC);
        matmul_forward(j.out, j.inp, j.w, j.N, j.IC, j.OC);
        double err = 0;
        for (size_t i = 0; i < no; i++) { err = fmax(err, fabs(j.out[i] - ref[i])); }
        if (err > 1e-3) { die("gemm disagrees with the naive matmul by %.3e at shape %d", err, (int)s); }
        double flop = 2.0 * j.N * j.IC * j.OC;
        double tn = time_it(run_naive, &j, 2), tf = time_it(run_fwd, &j, 5), tb = time_it(run_bwd, &j, 5);
        char name[64];
        snprintf(name, sizeof(name), "%d x %d -> %d", j.N, j.IC, j.OC);
        printf("%-18s %8.1f G %8.1f G %8.1f G %7.1fx\n", name, flop / tn / 1e6, flop / tf / 1e6,
               2 * flop / tb / 1e6, tn / tf);
        free(j.inp); free(j.dinp); free(j.w); free(j.dw); free(j.out); free(ref);
    }
    printf("(GFLOP/s; best of 5; backward counts both products; threads: %d)\n",
#ifdef _OPENMP
           omp_get_max_threads()
#else
           1
#endif
    );
    return 0;
}
