// The NCCL side of common/dist.h (which includes this file when built with
// -DMHAR_NCCL, the Makefile's flag where nccl.h is found): communicator
// start-up through the id file, in-place sums of device arrays and of host
// values, the identical-parameters assertion. Host code for the CUDA trainer;
// every collective runs on the legacy default stream, the trainer's only one.
#pragma once

#define DIST_CUDA(call) dist_cuda_check((call), #call)
#define DIST_NCCL(call) dist_nccl_check((call), #call)

static void dist_cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) { die("%s failed: %s", what, cudaGetErrorString(e)); }
}

static void dist_nccl_check(ncclResult_t r, const char *what) {
    if (r != ncclSuccess) {
        die("%s failed: %s (%s); NCCL_DEBUG=INFO tells more", what, ncclGetErrorString(r), ncclGetLastError(NULL));
    }
}

// Read rank and world from the environment and check that a step of
// total_batch tokens splits over them (dist_check_batch); with the NCCL path,
// pick this rank's GPU and join the communicator. Call before any other CUDA work.
static void dist_start(Dist *d, long total_batch, int B, int T) {
    double started = (double)time(NULL);
    dist_env(d);
    dist_check_batch(d, total_batch, B, T);
    if (!d->nccl) { return; }
    // NVLink multicast (NVLS) stays off unless the caller chose otherwise
    if (getenv("NCCL_NVLS_ENABLE") == NULL) { setenv("NCCL_NVLS_ENABLE", "0", 1); }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        die("rank %d: no CUDA device (%s)", d->rank, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    // one visible device (a launcher that masks CUDA_VISIBLE_DEVICES per rank): use it
    int dev = ndev == 1 ? 0 : d->local_rank;
    if (dev >= ndev) {
        die("rank %d has local rank %d but this machine shows %d GPUs: start at most %d ranks per machine",
            d->rank, d->local_rank, ndev, ndev);
    }
    DIST_CUDA(cudaSetDevice(dev));
    char path[4096];
    dist_id_path(d, path, sizeof(path));
    long timeout = dist_env_int("MHAR_DIST_TIMEOUT");
    ncclUniqueId id;
    if (d->rank == 0) {
        unlink(path);   // a file of an earlier launch that crashed before removing it
        DIST_NCCL(ncclGetUniqueId(&id));
    }
    dist_id_exchange(path, d->rank, d->world, &id, sizeof(id), started, timeout > 0 ? (double)timeout : 120.0);
    DIST_NCCL(ncclCommInitRank(&d->comm, d->world, id, d->rank));
    // ncclCommInitRank returns once every rank has joined, so all have read the file
    if (d->rank == 0) { unlink(path); }
    DIST_CUDA(cudaMalloc(&d->dbuf, DIST_SUM_MAX * sizeof(double)));
    DIST_CUDA(cudaMalloc(&d->hbuf, (size_t)d->world * sizeof(unsigned long long)));
    if (d->rank != 0 && freopen("/dev/null", "w", stdout) == NULL) {
        die("rank %d: cannot silence stdout: %s", d->rank, strerror(errno));
    }
}

// x (n fp32 values in device memory) = its sum over the ranks, in place
static void dist_sum_floats(Dist *d, float *x, size_t n) {
    if (!d->nccl) { return; }
    DIST_NCCL(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, d->comm, 0));
}

// x (n <= DIST_SUM_MAX doubles in host memory) = its sum over the ranks
static void dist_sum_host(Dist *d, double *x, int n) {
    if (!d->nccl) { return; }
    if (n > DIST_SUM_MAX) { die("internal: dist_sum_host of %d values (at most %d)", n, DIST_SUM_MAX); }
    DIST_CUDA(cudaMemcpy(d->dbuf, x, (size_t)n * sizeof(double), cudaMemcpyHostToDevice));
    DIST_NCCL(ncclAllReduce(d->dbuf, d->dbuf, (size_t)n, ncclFloat64, ncclSum, d->comm, 0));
    DIST_CUDA(cudaMemcpy(x, d->dbuf, (size_t)n * sizeof(double), cudaMemcpyDeviceToHost));
}

// Die unless the device array x (bytes long) holds the same bits on every
// rank: each rank hashes its copy (through the host, in 64 MiB pieces) and
// the hashes are gathered. what names the array in the error.
static void dist_check_same(Dist *d, const void *x, size_t bytes, const char *what) {
    if (!d->nccl || d->world == 1) { return; }
    size_t piece = (size_t)64 << 20;
    unsigned char *host = (unsigned char *)malloc_check(piece);
    uint64_t h = 0x84222325CBF29CE4ull;
    for (size_t off = 0; off < bytes; off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        DIST_CUDA(cudaMemcpy(host, (const unsigned char *)x + off, n, cudaMemcpyDeviceToHost));
        h = dist_hash(h, host, n);
    }
    free(host);
    unsigned long long mine = (unsigned long long)h;
    unsigned long long *all = (unsigned long long *)malloc_check((size_t)d->world * sizeof(unsigned long long));
    DIST_CUDA(cudaMemcpy(d->hbuf + d->rank, &mine, sizeof(mine), cudaMemcpyHostToDevice));
    DIST_NCCL(ncclAllGather(d->hbuf + d->rank, d->hbuf, 1, ncclUint64, d->comm, 0));
    DIST_CUDA(cudaMemcpy(all, d->hbuf, (size_t)d->world * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    for (int r = 1; r < d->world; r++) {
        if (all[r] != all[0]) {
            die("rank %d: %s differ between rank 0 (hash %016llx) and rank %d (%016llx): the ranks no longer "
                "train one model; same flags and checkpoint on every rank?", d->rank, what, all[0], r, all[r]);
        }
    }
    free(all);
}

// The start-up line's data-parallel part ("" on the plain path)
static void dist_describe(const Dist *d, char *desc, size_t n) {
    if (!d->nccl) { desc[0] = '\0'; return; }
    int v = 0;
    ncclGetVersion(&v);
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    snprintf(desc, n, "data-parallel: %d rank%s from %s, NCCL %d.%d.%d, NCCL_NVLS_ENABLE=%s", d->world,
             d->world > 1 ? "s" : "", d->source, v / 10000, v / 100 % 100, v % 100, nvls != NULL ? nvls : "(unset)");
}

static void dist_finish(Dist *d) {
    if (!d->nccl) { return; }
    DIST_NCCL(ncclCommDestroy(d->comm));
    DIST_CUDA(cudaFree(d->dbuf));
    DIST_CUDA(cudaFree(d->hbuf));
}
