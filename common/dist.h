// Data-parallel training, shared by both trainers: one process per GPU, all
// ranks walking the same stream of micro-batches. Host code; C99 and C++.
//
// Launch: N processes started by `mpirun -np N` (rank and world size from
// Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, or MPICH's PMI_RANK /
// PMI_SIZE / MPI_LOCALRANKID) or by a launcher that sets RANK / WORLD_SIZE /
// LOCAL_RANK (torchrun, or a shell loop); the first set found counts. No
// variable set: one process, as before. mpirun and torchrun stop every rank
// when one fails; ranks started by hand wait in their next collective for a
// rank that died, until killed. MHAR_DIST=1 takes the NCCL path even with one
// rank (to check that path against the plain one); MHAR_DIST=0 refuses a
// multi-rank environment. Ranks find each other through
// NCCL's unique id, which rank 0 writes to a file the others wait for:
// MHAR_DIST_ID_FILE, by default ${TMPDIR:-/tmp}/mhar_nccl_<parent pid>_<world>.id
// (the ranks of one launcher on one machine share their parent; across
// machines set MHAR_DIST_ID_FILE to a path on a shared filesystem).
// MHAR_DIST_TIMEOUT: seconds a rank waits for that file (default 120).
// MHAR_DIST_CHECK=K: every K steps assert that the ranks' parameters are bit
// for bit identical (they always are checked after start-up and at the end).
//
// Data slicing. A single-process run with gradient accumulation walks, per
// optimizer step, accum = d / (B*T) micro-batches k = 0 .. accum-1 of the
// loader's stream. With W ranks every rank walks that same stream; micro-batch
// k goes to rank k % W, which loads it; the others skip it (dataloader_skip:
// the same position arithmetic, no read). So each rank does accum / W
// micro-batches (d must be a multiple of B*T*W), the loader state (shard,
// pos) is the same on every rank after every step, and a checkpoint (written
// by rank 0) stores the global state: it resumes on any number of ranks.
// Validation splits its batches the same way (batch k to rank k % W).
//
// Gradients: every rank backpropagates its micro-batches with the global
// dloss = 1/(B*T*accum), into its fp32 parameter gradients; one all-reduce
// (sum, fp32) per optimizer step then gives every rank the gradient of the
// whole step. The loss is summed the same way (fp64). The gradient norm,
// clipping and AdamW run after the all-reduce, on bitwise identical inputs
// (an NCCL all-reduce leaves the same bits on every rank), so the parameters
// stay bitwise identical on all ranks: the invariant dist_check_same asserts.
// With one rank the all-reduce is the identity, so the NCCL path reproduces
// the plain run bit for bit. With W > 1 the per-step gradient equals the
// single-process one up to fp32 summation order ((g0 + g2) + (g1 + g3)
// instead of ((g0 + g1) + g2) + g3).
//
// Bytes per step: the all-reduce moves the fp32 gradients once per optimizer
// step (not per micro-batch): 4 bytes per parameter, of which a ring sends
// (and receives) 2 (W-1)/W per rank: with W = 2, 254 MB per rank per step at
// 100m (63.5M parameters), 1.41 GB at 350m, 4.04 GB at 1b. bf16 would halve
// that, at the cost of rounding each rank's gradient before the sum and of
// the one-rank identity; at these sizes the fp32 sum is a few ms per step.
//
// Ranks other than 0 print nothing on stdout (their errors still reach
// stderr), and write no log, checkpoint or sample.
#pragma once
#include <sys/stat.h>
#include <unistd.h>
#include "dataloader.h"

#ifdef MHAR_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

typedef struct {
    int rank, world;     // this process and the number of processes
    int local_rank;      // its GPU on this machine
    int nccl;            // 1: the NCCL path runs (world > 1, or MHAR_DIST=1)
    const char *source;  // where rank and world came from, for the start-up line
#ifdef MHAR_NCCL
    ncclComm_t comm;
    double *dbuf;        // device scratch for sums of host values (DIST_SUM_MAX doubles)
    unsigned long long *hbuf;  // device scratch for the parameter hashes (world values)
#endif
} Dist;

#define DIST_SUM_MAX 16
#define DIST_ID_MAGIC "MHARNCCL"

// One environment variable as a non-negative integer; -1 when unset. Dies on
// anything else, naming the variable.
static long dist_env_int(const char *name) {
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0') { return -1; }
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > 1000000) {
        die("environment %s='%s' is not a rank or size (a non-negative integer); fix or unset it", name, v);
    }
    return x;
}

// Fill d from the environment (nothing else: no NCCL, no files).
static void dist_env(Dist *d) {
    memset(d, 0, sizeof(*d));
    static const char *sets[3][4] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE (mpirun)"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_SIZE (MPICH mpirun)"},
        {"RANK", "WORLD_SIZE", "LOCAL_RANK", "WORLD_SIZE"},
    };
    d->world = 1;
    d->source = "one process";
    for (int s = 0; s < 3; s++) {
        long rank = dist_env_int(sets[s][0]), world = dist_env_int(sets[s][1]);
        if (rank < 0 && world < 0) { continue; }
        if (rank < 0 || world < 0) {
            die("environment %s is set but %s is not; set both or neither", rank < 0 ? sets[s][1] : sets[s][0],
                rank < 0 ? sets[s][0] : sets[s][1]);
        }
        if (world < 1 || rank >= world) {
            die("environment %s=%ld and %s=%ld do not describe a rank of a job (need 0 <= rank < size); "
                "fix the launch", sets[s][0], rank, sets[s][1], world);
        }
        long local = dist_env_int(sets[s][2]);
        d->rank = (int)rank; d->world = (int)world;
        d->local_rank = (int)(local >= 0 ? local : rank);   // one machine: the local rank is the rank
        d->source = sets[s][3];
        break;
    }
    const char *force = getenv("MHAR_DIST");
    if (force == NULL || force[0] == '\0') { d->nccl = d->world > 1; }
    else if (strcmp(force, "1") == 0) {
        d->nccl = 1;
        if (d->world == 1) { d->source = "MHAR_DIST=1"; }
    }
    else if (strcmp(force, "0") == 0) {
        if (d->world > 1) {
            die("MHAR_DIST=0 but environment %s gives %d ranks: unset MHAR_DIST to train data-parallel, or start one process",
                d->source, d->world);
        }
        d->nccl = 0;
    } else {
        die("environment MHAR_DIST='%s': use 1 (the NCCL path, also with one rank), 0 (never) or leave it unset", force);
    }
}

// Die unless a step's micro-batches split evenly over the ranks.
static void dist_check_batch(const Dist *d, long total_batch, int B, int T) {
    long bt = (long)B * T;
    if (total_batch % (bt * d->world) != 0) {
        die("-d %ld is not a multiple of b*T*ranks = %d*%d*%d = %ld: each rank needs the same number of "
            "micro-batches per step; pick -d = k*%ld", total_batch, B, T, d->world, bt * d->world, bt * d->world);
    }
}

// Does this rank take micro-batch (or val batch) k?
static int dist_owns(const Dist *d, int k) { return k % d->world == d->rank; }

// Micro-batch k of the stream: load it into dl->inputs / dl->targets when this
// rank owns it (returns 1), else advance past it unread (returns 0).
static int dist_next_micro(DataLoader *dl, const Dist *d, int k) {
    if (dist_owns(d, k)) { dataloader_next(dl); return 1; }
    dataloader_skip(dl);
    return 0;
}

// The file through which the ranks share NCCL's unique id (>= 4096 chars).
static void dist_id_path(const Dist *d, char *path, size_t n) {
    const char *p = getenv("MHAR_DIST_ID_FILE");
    if (p != NULL && p[0] != '\0') { snprintf(path, n, "%s", p); return; }
    const char *tmp = getenv("TMPDIR");
    snprintf(path, n, "%s/mhar_nccl_%ld_%d.id", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp", (long)getppid(), d->world);
}

// Share n bytes from rank 0 with every rank through the file path. Rank 0
// writes path.tmp (magic, world, the bytes) and renames it over path; the
// other ranks poll for a file with this world size, newer than started - 10 s
// (so that one left by an earlier crashed launch is ignored), until timeout_s.
// Rank 0 removes the file once every rank has it (dist_id_done).
static void dist_id_exchange(const char *path, int rank, int world, void *bytes, size_t n, double started,
                             double timeout_s) {
    char tmp[4200];
    size_t len = 8 + sizeof(int) + n;
    unsigned char *buf = (unsigned char *)malloc_check(len);
    if (rank == 0) {
        memcpy(buf, DIST_ID_MAGIC, 8);
        memcpy(buf + 8, &world, sizeof(int));
        memcpy(buf + 8 + sizeof(int), bytes, n);
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen_check(tmp, "wb");
        fwrite_check(buf, 1, len, f, tmp);
        if (fflush(f) != 0 || ferror(f)) { die("writing %s failed: %s (MHAR_DIST_ID_FILE)", tmp, strerror(errno)); }
        fclose(f);
        if (rename(tmp, path) != 0) { die("cannot rename %s to %s: %s (MHAR_DIST_ID_FILE)", tmp, path, strerror(errno)); }
        free(buf);
        return;
    }
    for (;;) {
        struct stat st;
        if (stat(path, &st) == 0 && (double)st.st_mtime >= started - 10.0) {
            FILE *f = fopen(path, "rb");
            size_t got = f != NULL ? fread(buf, 1, len, f) : 0;
            if (f != NULL) { fclose(f); }
            if (got == len && memcmp(buf, DIST_ID_MAGIC, 8) == 0) {
                int w;
                memcpy(&w, buf + 8, sizeof(int));
                if (w != world) {
                    die("rank %d: %s was written by a job of %d ranks, this one has %d: two launches share "
                        "the file; give each its own MHAR_DIST_ID_FILE", rank, path, w, world);
                }
                memcpy(bytes, buf + 8 + sizeof(int), n);
                free(buf);
                return;
            }
        }
        if (time(NULL) - started > timeout_s) {
            die("rank %d of %d: no NCCL id in %s after %.0f s; rank 0 writes it at start-up: is rank 0 running, "
                "and do all ranks see that path (set MHAR_DIST_ID_FILE to a shared file; MHAR_DIST_TIMEOUT)?",
                rank, world, path, timeout_s);
        }
        usleep(20000);
    }
}

// 64-bit hash of n bytes (8-byte words mixed multiplicatively, then the tail)
static uint64_t dist_hash(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) { h = (h ^ b[i]) * 0x100000001B3ull; }
    return h;
}

#ifdef MHAR_NCCL
#include "dist_nccl.h"
#else
// Without NCCL (the CPU trainer, or a CUDA build where nccl.h was not found)
// only one process trains: the sums over ranks are the identity.
static void dist_start(Dist *d, long total_batch, int B, int T) {
    dist_env(d);
    if (d->world > 1) {
        die("environment %s gives %d ranks but this build has no NCCL: build train_mhar_cu where nccl.h is "
            "found (Makefile NCCL_HOME), or start one process", d->source, d->world);
    }
    if (d->nccl) {
        die("MHAR_DIST=1 asks for the NCCL path but this build has no NCCL: build train_mhar_cu where nccl.h "
            "is found (Makefile NCCL_HOME), or unset MHAR_DIST");
    }
    dist_check_batch(d, total_batch, B, T);
}
static void dist_sum_floats(Dist *d, void *x, size_t n) { (void)d; (void)x; (void)n; }
static void dist_sum_host(Dist *d, double *x, int n) { (void)d; (void)x; (void)n; }
static void dist_check_same(Dist *d, const void *x, size_t bytes, const char *what) {
    (void)d; (void)x; (void)bytes; (void)what;
}
static void dist_describe(const Dist *d, char *desc, size_t n) { (void)d; if (n) { desc[0] = '\0'; } }
static void dist_finish(Dist *d) { (void)d; }
#endif

// MHAR_DIST_CHECK=K: K > 0 asserts identical parameters every K steps; 0 (unset) never
static int dist_check_every(void) {
    long k = dist_env_int("MHAR_DIST_CHECK");
    return k > 0 ? (int)k : 0;
}
