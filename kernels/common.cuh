// kernels/common.cuh: what every kernel header of train_mhar.cu uses.
//   - checked CUDA and cuBLAS calls (one line naming the call site, then exit 1)
//   - op ranges named after the ops: NVTX ranges (nsys and ncu read them; no cost without
//     a tool) and, with -op_times 1, CUDA events for a per-op GPU time table
//   - conversions floatX <-> float, warp and block reductions, the cast kernel
//   - 16-byte packs of floatX (Pack, Packed<VEC>) and their loads and stores
//   - cp.async, ldmatrix and mma.sync m16n8k16 wrappers (flash attention, the routing
//     kernels' row ring, the q/gamma pass on tensor cores)
//   - the row ring of the routing kernels (cp.async of whole rows into shared memory)
// Included by train_mhar.cu inside its anonymous namespace, after floatX is defined
// (bf16, or float with -DPRECISION_FP32). Moved from the trainer; the helpers of the
// lab copies live in dev/cuda/lab_util.cuh.
#pragma once

// ----------------------------------------------------------------------------
// Checked CUDA and cuBLAS calls: one line naming the call site, then exit 1.

void cuda_check(cudaError_t e, const char *file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "error: CUDA: %s (%s:%d)\n", cudaGetErrorString(e), file, line);
        exit(1);
    }
}
void cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: cuBLAS: %s (%s:%d)\n", cublasGetStatusString(s), file, line);
        exit(1);
    }
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)
#define launchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)


inline unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
void zero(void *p, size_t bytes) { if (bytes) { cudaCheck(cudaMemsetAsync(p, 0, bytes, 0)); } }

// ----------------------------------------------------------------------------
// Per-op ranges: op_range("name") closes the range opened by the previous call and
// opens one named "name", so the host code between two calls (and the GPU work it
// launches) is booked to the op named first. op_range(NULL) closes the last range (end
// of an optimizer step). Each range is an NVTX range (nsys or ncu read them; without a
// tool attached an NVTX call is a test of one pointer) and, while -op_times 1 has the
// timer on, a CUDA event (op_times below).
//
// Per-op GPU time without a profiler (-op_times 1: common/train_loop.h turns the timer
// on for each training step after the run's first, off after the step's update, and
// prints op_times_print's table at the end). While on, each op_range call records an
// event on stream 0, and event i opens the op ev_name[i]. Every kernel, copy and
// collective of the trainer runs on that one stream, in launch order, so the GPU time
// between events i and i+1 is exactly that of the work launched between the two calls.
// Time the GPU sits idle between them (the host busy, or waiting on a readback: the
// loss after the forward, the gradient norm before AdamW) lands in the op before it.
// op_range(NULL) records the step's end event, waits for it, adds each interval to the
// total of its op and starts the next step's list. Ops are matched by name there, after
// the wait, off the launch path (strcmp: a name repeats per layer and may come from
// several call sites; names are string literals, kept as pointers) and listed in the
// order they first appear, the code's order (forward, then backward). Off (the
// default), op_range records no event: the same kernels, the same bits.
#define OP_TIMES_MAX_OPS 128
struct OpTimes {
    int on;                             // record events (op_times_on)
    cudaEvent_t *ev;                    // (cap) created as the pool grows; ev[0 .. nev-1]: this step's
    const char **ev_name;               // (cap) the op event i opens; NULL for the step's end
    size_t nev, cap;
    const char *name[OP_TIMES_MAX_OPS]; // (nops) the table's rows, in order of first appearance
    double ms[OP_TIMES_MAX_OPS];        // (nops) GPU ms over the timed steps
    size_t ranges[OP_TIMES_MAX_OPS];    // (nops) ranges over the timed steps
    size_t nops, steps;                 // rows; steps timed
};
OpTimes op_times = {};

void op_times_record(const char *name) {
    OpTimes *t = &op_times;
    if (t->nev == t->cap) {   // grow the pool; events are created once and reused every step
        size_t cap = t->cap ? 2 * t->cap : 1024;
        t->ev = (cudaEvent_t *)realloc(t->ev, cap * sizeof(cudaEvent_t));
        t->ev_name = (const char **)realloc(t->ev_name, cap * sizeof(const char *));
        if (t->ev == NULL || t->ev_name == NULL) { die("out of memory growing the -op_times event pool to %zu", cap); }
        for (size_t i = t->cap; i < cap; i++) { cudaCheck(cudaEventCreate(&t->ev[i])); }
        t->cap = cap;
    }
    cudaCheck(cudaEventRecord(t->ev[t->nev], 0));
    t->ev_name[t->nev++] = name;
}

// The step's end: wait for its last event, add each interval to its op's total.
void op_times_step_end(void) {
    OpTimes *t = &op_times;
    if (t->nev < 2) { t->nev = 0; return; }
    cudaCheck(cudaEventSynchronize(t->ev[t->nev - 1]));
    for (size_t i = 0; i + 1 < t->nev; i++) {
        size_t k = 0;
        while (k < t->nops && strcmp(t->name[k], t->ev_name[i]) != 0) { k++; }
        if (k == t->nops) {
            if (k == OP_TIMES_MAX_OPS) { die("internal: more than %d op names for -op_times", OP_TIMES_MAX_OPS); }
            t->name[k] = t->ev_name[i]; t->ms[k] = 0; t->ranges[k] = 0;
            t->nops++;
        }
        float ms = 0;
        cudaCheck(cudaEventElapsedTime(&ms, t->ev[i], t->ev[i + 1]));
        t->ms[k] += ms;
        t->ranges[k]++;
    }
    t->steps++;
    t->nev = 0;
}

int op_range_open = 0;
void op_range(const char *name) {
    if (op_range_open) { nvtxRangePop(); }
    op_range_open = name != NULL;
    if (name != NULL) { nvtxRangePushA(name); }
    if (op_times.on) {
        op_times_record(name);
        if (name == NULL) { op_times_step_end(); }
    }
}

// Timer on or off (a step's events not yet summed are dropped).
void op_times_on(int on) {
    op_times.on = on;
    op_times.nev = 0;
}

// The table of the timed steps, one row per op: ms per step, share of the rows' sum,
// ranges per step; then their total beside step_ms, the mean wall-clock time of the
// same steps (what the ranges leave out: host time before the step's first range and
// after its last).
void op_times_print(double step_ms) {
    const OpTimes *t = &op_times;
    if (t->steps == 0) {
        printf("per-op GPU time: no step was timed (-op_times times the steps after the first); give -n 2 or more\n");
        return;
    }
    double total = 0;
    size_t ranges = 0;
    for (size_t k = 0; k < t->nops; k++) { total += t->ms[k]; ranges += t->ranges[k]; }
    double n = (double)t->steps;
    printf("per-op GPU time, mean over %zu steps (every step after the first; CUDA events at each op range):\n",
           t->steps);
    printf("  %-30s %10s %7s %12s\n", "op", "ms/step", "share", "ranges/step");
    for (size_t k = 0; k < t->nops; k++) {
        printf("  %-30s %10.3f %6.1f%% %12.4g\n", t->name[k], t->ms[k] / n, 100 * t->ms[k] / total, t->ranges[k] / n);
    }
    printf("  %-30s %10.3f %6.1f%% %12.4g   (wall-clock step %.3f ms: the ranges cover %.1f%%)\n", "total", total / n,
           100.0, ranges / n, step_ms, 100 * total / n / step_ms);
}

// Release the event pool (device_finish).
void op_times_free(void) {
    OpTimes *t = &op_times;
    for (size_t i = 0; i < t->cap; i++) { cudaCheck(cudaEventDestroy(t->ev[i])); }
    free(t->ev); free(t->ev_name);
    memset(t, 0, sizeof(*t));
}

__device__ __host__ inline float toF(float x) { return x; }
__device__ __host__ inline float toF(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __host__ inline T fromF(float x);
template <> __device__ __host__ inline float fromF<float>(float x) { return x; }
template <> __device__ __host__ inline __nv_bfloat16 fromF<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// Butterfly reductions: every lane ends with the same value, in a fixed order.
__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, o); }
    return v;
}
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o)); }
    return v;
}
// Sum over a block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();   // part[] may still be read by a previous call
    if (lane == 0) { part[warp] = v; }
    __syncthreads();
    float x = lane < nwarps ? part[lane] : 0.0f;
    return warp_sum(x);
}
__device__ float block_max(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) { part[warp] = v; }
    __syncthreads();
    float x = lane < nwarps ? part[lane] : -INFINITY;
    return warp_max(x);
}

// out (n) = (T) in (n): float -> floatX copies (and a plain copy in fp32)
template <typename Tout, typename Tin>
__global__ void cast_kernel(Tout *out, const Tin *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = fromF<Tout>(toF(in[i])); }
}
template <typename Tout, typename Tin>
void cast(Tout *out, const Tin *in, size_t n) {
    if (n == 0) { return; }
    cast_kernel<<<ceil_div(n, 256), 256>>>(out, in, n);
    launchCheck();
}

// Deterministic per-channel sums over many rows: a kernel writes one partial
// per (partition of rows, channel); a second sums the partitions in order.
// Row partitions hold at least 64 rows and there are at most RED_PARTS_MAX.
#define RED_PARTS_MAX 512
int red_rows_per_part(size_t rows) {
    size_t r = (rows + RED_PARTS_MAX - 1) / RED_PARTS_MAX;
    return (int)(r < 64 ? 64 : r);
}

// ----------------------------------------------------------------------------
// 16-byte packs of floatX: 8 bf16 or 4 fp32 values, loaded and stored in one
// instruction (QK-norm + RoPE, SwiGLU and the classifier).
#define PACK (16 / (int)sizeof(floatX))
struct alignas(16) Pack { floatX v[PACK]; };

// x (PACK) = p[0 .. PACK-1] in fp32, as PACK/4 loads of 16 bytes (p 16-byte aligned)
__device__ __forceinline__ void ld_pack_f32(float (&x)[PACK], const float *p) {
    #pragma unroll
    for (int q = 0; q < PACK / 4; q++) {
        const float4 v = reinterpret_cast<const float4 *>(p)[q];
        x[4 * q] = v.x; x[4 * q + 1] = v.y; x[4 * q + 2] = v.z; x[4 * q + 3] = v.w;
    }
}

// cp.async of 16 or 4 bytes global -> shared (asynchronous, completed by
// commit + wait groups; used by the flash attention kernels and the routing
// kernels' row ring). cp_async16_zfill copies 16 bytes when valid, else
// writes 16 zero bytes (reading nothing).
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, bool valid) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// ----------------------------------------------------------------------------
// Tensor cores: ldmatrix of four transposed 8x8 bf16 matrices and the
// m16n8k16 product (bf16 in, fp32 accumulation). Fragment layouts (g = lane / 4,
// t = lane % 4):
//   A 16x16: reg0 = A[g][2t..2t+1], reg1 = A[g+8][2t..], reg2 = A[g][2t+8..], reg3 = A[g+8][2t+8..]
//   B 16x8 : reg0 = B[2t..2t+1][g], reg1 = B[2t+8..2t+9][g]
//   C 16x8 : c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
// c (16x8 fp32) += a (16x16 bf16) * b (16x8 bf16)
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   // .x (low half) = lo
    return *(uint32_t *)&v;
}

// Per-lane ldmatrix address into a row-major smem tile M with row stride ld:
// B fragments of two n-tiles, B[k][n] = M[k][n]: rows k0..k0+15, cols n0..n0+15
// (use .trans; r[0..1] = n-tile n0, r[2..3] = n-tile n0+8)
__device__ __forceinline__ const bf16 *bt_addr(const bf16 *M, int ld, int k0, int n0, int lane) {
    return M + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
}

// VEC floatX values, loaded and stored as one piece (16 bytes for 8 bf16,
// two 16-byte pieces for 8 floats); PackedF the same for fp32 buffers.
template <int VEC> struct alignas(VEC * sizeof(floatX) < 16 ? VEC * sizeof(floatX) : 16) Packed { floatX x[VEC]; };
template <int VEC> struct alignas(VEC * 4 < 16 ? VEC * 4 : 16) PackedF { float x[VEC]; };

// this lane's VEC values at channel c0 of a row (zeros when c0 >= C)
// (a 16-byte pack goes through an int4: zeroing it element by element cost ~30
// byte-permute instructions per load in the fused kernels' loops)
template <int VEC> __device__ __forceinline__ Packed<VEC> ld_lane(const floatX *row, int c0, int C) {
    Packed<VEC> z;
    if constexpr (sizeof(Packed<VEC>) == 16) {
        int4 w = make_int4(0, 0, 0, 0);
        if (c0 < C) { w = *reinterpret_cast<const int4 *>(row + c0); }
        memcpy(&z, &w, 16);
    } else if (c0 < C) {
        z = *reinterpret_cast<const Packed<VEC> *>(row + c0);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) { z.x[k] = fromF<floatX>(0.0f); }
    }
    return z;
}
// bf16 -> fp32 is exact: a bf16 is the top half of an fp32. Two per 32-bit word
// with one shift or mask each (the generic conversion used two instructions for
// the high half).
template <int VEC> __device__ __forceinline__ void unpack(const Packed<VEC> &p, float (&x)[VEC]) {
    if constexpr (sizeof(floatX) == 2 && VEC % 2 == 0) {
        uint32_t w[VEC / 2];
        memcpy(w, &p, sizeof(w));
#pragma unroll
        for (int k = 0; k < VEC / 2; k++) {
            x[2 * k] = __uint_as_float(w[k] << 16);
            x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) { x[k] = toF(p.x[k]); }
    }
}
template <int VEC> __device__ __forceinline__ void st_lane(floatX *p, const float (&x)[VEC]) {
    Packed<VEC> v;
#pragma unroll
    for (int k = 0; k < VEC; k++) { v.x[k] = fromF<floatX>(x[k]); }
    *reinterpret_cast<Packed<VEC> *>(p) = v;
}
// as ld_lane, but lanes past C read channel 0 of the row: finite values, not
// zeros. Only for values whose every use in a sum is multiplied by a zeroed
// operand; it lets the compiler reload the value instead of spilling it.
template <int VEC> __device__ __forceinline__ Packed<VEC> ld_lane_clamped(const floatX *row, int c0, int C) {
    return *reinterpret_cast<const Packed<VEC> *>(row + (c0 < C ? c0 : 0));
}
// this lane's VEC values at channel c0 of a parameter vector p (C), as float
// (zeros when c0 >= C): scalar loads, since the parameter tensors inside the
// one parameter allocation are not 16-byte aligned in general
template <int VEC> __device__ __forceinline__ void ld_param(float (&x)[VEC], const floatX *p, int c0, int C) {
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        if (c0 < C) { x[k] = toF(p[c0 + k]); }
        else { x[k] = 0.0f; }
    }
}
// fp32: x = p[0 .. VEC), for lanes known to be live; ld_f: x = p[c0 .. c0+VEC) (zeros when
// c0 >= C); and the store
template <int VEC> __device__ __forceinline__ void ld_f_live(float (&x)[VEC], const float *p) {
    const PackedF<VEC> v = *reinterpret_cast<const PackedF<VEC> *>(p);
#pragma unroll
    for (int k = 0; k < VEC; k++) { x[k] = v.x[k]; }
}
template <int VEC> __device__ __forceinline__ void ld_f(float (&x)[VEC], const float *p, int c0, int C) {
    if (c0 < C) {
        ld_f_live(x, p + c0);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) { x[k] = 0.0f; }
    }
}
template <int VEC> __device__ __forceinline__ void st_f(float *p, const float (&x)[VEC]) {
    PackedF<VEC> v;
#pragma unroll
    for (int k = 0; k < VEC; k++) { v.x[k] = x[k]; }
    *reinterpret_cast<PackedF<VEC> *>(p) = v;
}

// The row ring. The fused kernels stream rows (a site's sources in forward, the
// G rows of a slot's readers in the gather), one warp per position. Loaded one
// row ahead into registers, a warp has only one row in flight while it computes.
// With a bf16 lane pack of 16 bytes (VEC = 8) they instead copy rows
// ROUTE_RING - 1 ahead into shared memory with cp.async (no registers held).
// Each lane reads back only the bytes it copied itself, so a lane's own wait
// suffices for the rows; values copied by one lane for all (the forward's r of
// a source) need a __syncwarp after the wait. Shared memory per block of 8
// warps: packs [8][ROUTE_RING][NCH][32], then floats [8][ROUTE_RING].
// An empty asm that "modifies" its words: what is computed from them after it
// stays after it, so the compiler neither hoists the unpack of a packed value
// out of a loop (and holds or spills the floats) nor reuses an earlier unpack.
template <typename T> __device__ __forceinline__ void opaque_words(T &x) {
    static_assert(sizeof(T) % 4 == 0, "whole 32-bit words");
    uint32_t w[sizeof(T) / 4];
    memcpy(w, &x, sizeof(T));
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) / 4); k++) { asm volatile("" : "+r"(w[k])); }
    memcpy(&x, w, sizeof(T));
}
#define ROUTE_RING 4   // a power of two
#define ROUTE_LOG2E 1.4426950408889634f   // log2(e): the gather's exp(x) = exp2f(x log2 e)
template <int VEC> __host__ __device__ constexpr bool route_ring() { return sizeof(Packed<VEC>) == 16; }
template <int VEC, int NCH> __host__ __device__ constexpr size_t route_ring_smem() {
    return route_ring<VEC>() ? 8 * ROUTE_RING * ((size_t)NCH * 32 * 16 + sizeof(float)) : 0;
}
// this warp's stages of packs and its floats
template <int VEC, int NCH> __device__ __forceinline__ Packed<VEC> *ring_packs(unsigned char *smem) {
    return reinterpret_cast<Packed<VEC> *>(smem) + (size_t)(threadIdx.x / 32) * ROUTE_RING * NCH * 32;
}
template <int VEC, int NCH> __device__ __forceinline__ float *ring_floats(unsigned char *smem) {
    return reinterpret_cast<float *>(smem + (size_t)8 * ROUTE_RING * NCH * 32 * sizeof(Packed<VEC>)) +
           (threadIdx.x / 32) * ROUTE_RING;
}
// cp.async of this lane's packs of a row into ring stage st (zeros past C);
// the caller commits the group
template <int VEC, int NCH>
__device__ __forceinline__ void ring_fill(Packed<VEC> *ring, int st, const floatX *row, int lane, int C) {
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const int c0 = ch * 32 * VEC + lane * VEC;
        cp_async16_zfill(ring + (st * NCH + ch) * 32 + lane, row + (c0 < C ? c0 : 0), c0 < C);
    }
}
// The routing forward's issue of source i of n (slots src[i], position t) into ring
// stage i % ROUTE_RING, its r copied by lane 0 into ring_r when i < nr (nr = n - 1:
// the kernel computes the last source's r itself); one commit group per source (an
// empty one past n, so that the waits count the same)
template <int VEC, int NCH>
__device__ __forceinline__ void ring_issue_source(Packed<VEC> *ring, float *ring_r, const floatX *slots, const float *r,
                                                  const int *src, int i, int n, int nr, size_t N, int t, int lane,
                                                  int C) {
    if (i < n) {
        const size_t row = (size_t)src[i] * N + t;
        ring_fill<VEC, NCH>(ring, i & (ROUTE_RING - 1), slots + row * C, lane, C);
        if (lane == 0 && i < nr) { cp_async4(ring_r + (i & (ROUTE_RING - 1)), r + row); }
    }
    cp_async_commit();
}
// cp.async of 16 bytes from gmem to the shared address s, of which src_size
// are read (0: none; the rest is zero-filled); the caller commits the group
__device__ __forceinline__ void cp_async16z(uint32_t s, const void *gmem, uint32_t src_size) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size) : "memory");
}

// Prefetch into L1 the 128-byte line holding p (a hint: no register is held,
// unlike a load)
__device__ __forceinline__ void prefetch_l1(const void *p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// Sum each warp's acc (its positions) into out (C), warps in order, one chunk
// at a time through shared red (8, 32*VEC). Every thread of the block calls it.
template <int VEC, int NCH>
__device__ void block_sum_store(float (&acc)[NCH][VEC], float (*red)[32 * VEC], float *out, int C) {
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        st_f(&red[w][lane * VEC], acc[ch]);
        __syncthreads();
        for (int i = threadIdx.x; i < 32 * VEC; i += blockDim.x) {
            int c = ch * 32 * VEC + i;
            if (c < C) {
                float s = 0.0f;
                for (int k = 0; k < 8; k++) { s += red[k][i]; }
                out[c] = s;
            }
        }
        __syncthreads();
    }
}

// out (C) (= or +=) the sum over P partials of part (P, nm, C), matrix m =
// blockIdx.y, in a fixed order: lane y of the ROUTE_RED_LANES partial lanes sums
// partials y, y + ROUTE_RED_LANES, ... in order, then the lane sums are added in
// lane order. out row: out_row[m] when out_row (device), else m. Block (32
// channels) x (ROUTE_RED_LANES); grid (C/32, nm). A single serial sum over
// P = 1024 partials on C/256 blocks was latency-bound.
#define ROUTE_RED_LANES 32
__global__ void __launch_bounds__(32 * ROUTE_RED_LANES)
route_reduce_parts_kernel(float *out, const float *__restrict__ part, const int *__restrict__ out_row, int P, int nm,
                          int C, int add) {
    __shared__ float acc[ROUTE_RED_LANES][33];
    const int c = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y;
    float s = 0.0f;
    if (c < C) {
        for (int p = threadIdx.y; p < P; p += ROUTE_RED_LANES) { s += part[((size_t)p * nm + m) * C + c]; }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int y = 0; y < ROUTE_RED_LANES; y++) { t += acc[y][threadIdx.x]; }
        float *o = out + (size_t)(out_row ? out_row[m] : m) * C + c;
        *o = add ? *o + t : t;
    }
}

// The launch of route_reduce_parts_kernel: out rows (= or +=) sums of part (P, nm, C)
void route_reduce_parts(float *out, const float *part, const int *out_row, int P, int nm, int C, int add) {
    route_reduce_parts_kernel<<<dim3(ceil_div(C, 32), nm), dim3(32, ROUTE_RED_LANES)>>>(out, part, out_row, P, nm, C,
                                                                                       add);
    launchCheck();
}
