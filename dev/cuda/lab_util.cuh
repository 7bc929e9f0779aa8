// Helpers shared by the kernel labs elementwise.cu, residual.cu, hc.cu and delta.cu: checked CUDA calls, the
// trainer's small ones, inputs, checks, timing. Include after <stdio.h>, <vector>, <algorithm> and the floatX typedef.
#pragma once

// ---- checked CUDA calls: a failure prints the file and line and exits ----

static void cuda_check(cudaError_t e, const char *file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error at %s:%d: %s\n", file, line, cudaGetErrorString(e));
        exit(1);
    }
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
#define launchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)


// ---- the trainer's small helpers (train_mhar.cu), so its kernels compile unchanged ----

// ceil(a / b), as a grid size
static inline unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
// zeroes bytes at p on the default stream (nothing when bytes is 0)
static void zero(void *p, size_t bytes) { if (bytes) { cudaCheck(cudaMemsetAsync(p, 0, bytes, 0)); } }
// float or bf16 -> float
__device__ __host__ inline float toF(float x) { return x; }
__device__ __host__ inline float toF(__nv_bfloat16 x) { return __bfloat162float(x); }
// float -> float or bf16 (round to nearest even)
template <typename T> __device__ __host__ inline T fromF(float x);
template <> __device__ __host__ inline float fromF<float>(float x) { return x; }
template <> __device__ __host__ inline __nv_bfloat16 fromF<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
// butterfly warp sum: every lane ends with the same value, in a fixed order
__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, o); }
    return v;
}
// deterministic per-channel sums: rows per partition (at least 64, at most RED_PARTS_MAX partitions)
#define RED_PARTS_MAX 512
static int red_rows_per_part(size_t rows) {
    size_t r = (rows + RED_PARTS_MAX - 1) / RED_PARTS_MAX;
    return (int)(r < 64 ? 64 : r);
}

// ---- the trainer's first RMSNorm kernels (train_mhar.cu at 3dc0648, bodies unchanged): v1 of
// elementwise.cu's QK-norm and of residual.cu ----

__global__ void rmsnorm_forward_v1_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *w, size_t N,
                                          int D) {
    size_t n = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (n >= N) { return; }
    const floatX *x = inp + n * D;
    float ss = 0.0f;
    for (int i = lane; i < D; i += 32) { float xi = toF(x[i]); ss += xi * xi; }
    ss = warp_sum(ss);
    float s = 1.0f / sqrtf(ss / D + 1e-6f);
    for (int i = lane; i < D; i += 32) { out[n * D + i] = fromF<floatX>(toF(x[i]) * s * toF(w[i])); }
    if (lane == 0) { rstd[n] = s; }
}

template <typename Tout>
__global__ void rmsnorm_backward_v1_kernel(Tout *dinp, const float *dout, const floatX *inp, const float *rstd,
                                           const floatX *w, size_t N, int D) {
    size_t n = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (n >= N) { return; }
    const floatX *x = inp + n * D;
    const float *g = dout + n * D;
    float s = rstd[n], gwx = 0.0f;
    for (int i = lane; i < D; i += 32) { gwx += g[i] * toF(w[i]) * toF(x[i]); }
    gwx = warp_sum(gwx);
    for (int i = lane; i < D; i += 32) {
        float d = s * g[i] * toF(w[i]) - s * s * s / D * gwx * toF(x[i]);
        dinp[n * D + i] = fromF<Tout>(toF(dinp[n * D + i]) + d);
    }
}

// partial (P, D): partition p's sum over its rows n of dout[n][i] * x[n][i] * rstd[n].
// Block (32 channels) x (8 row lanes); the 8 lanes are summed in order.
__global__ void rmsnorm_dw_partial_v1_kernel(float *partial, const float *dout, const floatX *inp, const float *rstd,
                                             size_t N, int D, int rows_per_part) {
    __shared__ float acc[8][33];
    int i = blockIdx.x * 32 + threadIdx.x, p = blockIdx.y;
    size_t n0 = (size_t)p * rows_per_part, n1 = n0 + rows_per_part < N ? n0 + rows_per_part : N;
    float s = 0.0f;
    if (i < D) {
        for (size_t n = n0 + threadIdx.y; n < n1; n += 8) { s += dout[n * D + i] * toF(inp[n * D + i]) * rstd[n]; }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < D) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) { t += acc[y][threadIdx.x]; }
        partial[(size_t)p * D + i] = t;
    }
}

// ---- inputs: made on the device from a counter-based hash ----

// splitmix64's finaliser: a 64-bit hash, on host and device
__host__ __device__ inline uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
// uniform in [0, 1) for element i of stream seed
__device__ inline float urand(uint64_t seed, uint64_t i) {
    return (float)(mix64(seed ^ mix64(i)) >> 40) * (1.0f / 16777216.0f);
}
// mean 0, variance 1, within +-3.46 (sum of 4 uniforms)
__device__ inline float nrand(uint64_t seed, uint64_t i) {
    float s = 0.0f;
    for (int k = 0; k < 4; k++) { s += urand(seed + 0x632be59bd9b4e019ull * (k + 1), i); }
    return (s - 2.0f) * 1.7320508f;
}
// p[i] = mean + sd * nrand(seed, i), grid-stride
template <typename T>
__global__ void fill_normal_kernel(T *p, size_t n, uint64_t seed, float mean, float sd) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        p[i] = fromF<T>(mean + sd * nrand(seed, i));
    }
}
// launches fill_normal_kernel on the default stream
template <typename T> static void fill_normal(T *p, size_t n, uint64_t seed, float mean, float sd) {
    fill_normal_kernel<T><<<4096, 256>>>(p, n, seed, mean, sd);
    launchCheck();
}

// ---- host: bf16 bits, the CPU self-test's random numbers ----

// bf16 bit pattern -> float
static float bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
// the CPU self-test's counter (host_uniform, host_normal advance it)
static uint64_t host_rng = 1;
// uniform in (0, 1), from mix64 of the counter
static double host_uniform() { return ((mix64(host_rng++) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
// standard normal (Box-Muller)
static double host_normal() { return sqrt(-2 * log(host_uniform())) * cos(6.283185307179586 * host_uniform()); }

// ---- checks: device results against the fp64 reference ----

// prints " name maxerr/maxref"; ok when every |got - ref| <= rtol |ref| + atol max|ref| (and sizes match)
static bool compare(const char *name, const std::vector<float> &got, const std::vector<double> &ref, double rtol,
                    double atol) {
    double mref = 0, merr = 0;
    for (double r : ref) { mref = std::max(mref, fabs(r)); }
    bool ok = got.size() == ref.size();
    for (size_t i = 0; i < ref.size() && i < got.size(); i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (!std::isfinite((double)got[i])) { e = INFINITY; }
        merr = std::max(merr, e);
        if (!(e <= rtol * fabs(ref[i]) + atol * mref)) { ok = false; }
    }
    double rel = mref > 0 ? merr / mref : merr;
    printf(" %s %.1e%s", name, rel, ok ? "" : "(FAIL)");
    return ok;
}
// copies bytes from the device into a host vector
static std::vector<unsigned char> fetch_bytes(const void *d, size_t bytes) {
    std::vector<unsigned char> h(bytes);
    if (bytes) { cudaCheck(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost)); }
    return h;
}
// raw bf16 bytes -> floats
static std::vector<float> bytes_bf16_to_f(const std::vector<unsigned char> &b) {
    std::vector<float> f(b.size() / 2);
    for (size_t i = 0; i < f.size(); i++) { uint16_t v; memcpy(&v, &b[2 * i], 2); f[i] = bf2f(v); }
    return f;
}
// raw fp32 bytes -> floats
static std::vector<float> bytes_f32(const std::vector<unsigned char> &b) {
    std::vector<float> f(b.size() / 4);
    if (!f.empty()) { memcpy(f.data(), b.data(), b.size()); }
    return f;
}
// n bf16 values from the device, as doubles
static std::vector<double> fetch_bf16_d(const floatX *d, size_t n) {
    std::vector<float> f = bytes_bf16_to_f(fetch_bytes(d, n * 2));
    return std::vector<double>(f.begin(), f.end());
}
// n fp32 values from the device, as doubles
static std::vector<double> fetch_f32_d(const float *d, size_t n) {
    std::vector<float> f = bytes_f32(fetch_bytes(d, n * 4));
    return std::vector<double>(f.begin(), f.end());
}
// FNV-1a 64 of the bytes, chained through hash (the run-to-run determinism check)
static uint64_t fnv(const std::vector<unsigned char> &b, uint64_t hash = 1469598103934665603ull) {
    for (unsigned char c : b) { hash = (hash ^ c) * 1099511628211ull; }
    return hash;
}
// A check runs twice and its second run must match the first bit for bit. rep 0: keeps the K
// outputs in first and returns false. rep 1: compares, prints "repeat bit-identical" (or
// "DIFFERENT (FAIL)", clearing ok) with a hash of all K outputs, and returns true: the check is done.
template <int K>
static bool repeat_done(int rep, const std::vector<unsigned char> (&out)[K], std::vector<unsigned char> (&first)[K],
                        bool &ok) {
    if (rep == 0) {
        for (int k = 0; k < K; k++) { first[k] = out[k]; }
        return false;
    }
    bool same = true;
    uint64_t hash = 1469598103934665603ull;
    for (int k = 0; k < K; k++) { same &= out[k] == first[k]; hash = fnv(out[k], hash); }
    ok &= same;
    printf("  repeat %s  hash %016llx\n", same ? "bit-identical" : "DIFFERENT (FAIL)", (unsigned long long)hash);
    return true;
}
// cudaMalloc of n T plus 16 bytes of slack (256-byte aligned)
template <typename T> static T *dalloc(size_t n) {
    void *p = nullptr;
    cudaCheck(cudaMalloc(&p, n * sizeof(T) + 16));   // cudaMalloc: 256-byte aligned
    return (T *)p;
}

// ---- timing: CUDA events ----

// the median (upper middle) of v
static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
// median ms of reps timed run()s after 2 warm-ups, *mn the fastest; pre() runs before each, outside the timing
template <typename Run, typename Pre>
static float time_median(int reps, Run run, Pre pre, float *mn) {
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int it = 0; it < reps + 2; it++) {
        pre();
        cudaCheck(cudaEventRecord(e0));
        run();
        cudaCheck(cudaEventRecord(e1));
        cudaCheck(cudaEventSynchronize(e1));
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 2) { ts.push_back(ms); }
    }
    cudaCheck(cudaEventDestroy(e0)); cudaCheck(cudaEventDestroy(e1));
    *mn = *std::min_element(ts.begin(), ts.end());
    return median(ts);
}
// a pre() that does nothing
static void no_pre(void) {}
// time_median without a pre()
template <typename Run> static float time_median(int reps, Run run, float *mn) {
    return time_median(reps, run, no_pre, mn);
}
// device-to-device copy rate in GB/s (bytes read + written), median of 11 copies of 2 GiB
static double measure_copy_gbs(void) {
    size_t bytes = (size_t)2 << 30;
    void *a = nullptr, *b = nullptr;
    cudaCheck(cudaMalloc(&a, bytes)); cudaCheck(cudaMalloc(&b, bytes));
    cudaCheck(cudaMemset(a, 1, bytes));
    float mn;
    float ms = time_median(11, [&]() { cudaCheck(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, &mn);
    cudaCheck(cudaFree(a)); cudaCheck(cudaFree(b));
    return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

// ---- main(): the lines every lab prints ----

// prints "device: name, SMs, L2, memory; seed"
static void print_device(uint64_t seed) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB, %.0f GB; seed %llu\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, prop.totalGlobalMem / 1e9, (unsigned long long)seed);
}
// measures the copy rate, prints the bench's two header lines, returns the rate (GB/s)
static double bench_intro(int reps) {
    double gbs = measure_copy_gbs();
    printf("device-to-device copy: %.0f GB/s (read + write); floors at 4.0 TB/s and at this copy rate\n", gbs);
    printf("bench: CUDA events, median of %d repeats (2 warm-ups); GB = the op's minimum bytes (top of file)\n",
           reps);
    return gbs;
}
