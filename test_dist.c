/*
test_dist.c: CPU checks of data-parallel training's host side (common/dist.h),
built without NCCL (no GPU needed):
  1. data slicing: with W ranks, each rank's micro-batches (k % W) are exactly
     the single-process stream's, token for token, across shard boundaries and
     the wrap to the first shard; every micro-batch goes to one rank; every
     rank's loader state after each step equals the single stream's; a resume
     from that state on another number of ranks continues the same stream;
  2. the rank / world environment (Open MPI's, MPICH's and torchrun's
     variables, MHAR_DIST) and its one-line errors, and -d against b*T*ranks;
  3. the unique-id exchange through a file between forked processes: every
     rank gets rank 0's bytes; a stale file is ignored, a missing one times
     out, one of another world size is refused, each with a one-line error;
  4. without NCCL, a multi-rank environment or MHAR_DIST=1 stops with an error.
It ends with "N passed, N failed" and exits non-zero on any failure.
*/
#include "common/dist.h"
#include <sys/wait.h>
#include <utime.h>

static int passed = 0, failed = 0;

static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) { passed++; } else { failed++; }
    fflush(stdout);
}

// Run fn(arg) in a child; returns its exit status and its stderr in err.
static int run_child(void (*fn)(void *), void *arg, char *err, size_t n) {
    int fd[2];
    if (pipe(fd) != 0) { die("pipe: %s", strerror(errno)); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { die("fork: %s", strerror(errno)); }
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        fn(arg);
        exit(0);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fd[0], err + got, n - 1 - got)) > 0) { got += (size_t)r; }
    err[got] = '\0';
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) { n += *s == '\n'; }
    return n;
}

// A child's failure: exit 1 and one line holding expect
static void check_dies(void (*fn)(void *), void *arg, const char *expect, const char *what) {
    char err[2048];
    int rc = run_child(fn, arg, err, sizeof(err));
    char *nl = strchr(err, '\n');
    check(rc == 1 && strstr(err, expect) != NULL && count_lines(err) == 1, "%s: exit %d, \"%.*s\"", what, rc,
          nl ? (int)(nl - err) : (int)strlen(err), err);
}

// ----------------------------------------------------------------------------
// 1. Data slicing against the single stream

#define NSHARDS 4
static const int shard_tokens[NSHARDS] = {1000, 777, 1500, 530};   // none a multiple of B*T
enum { TB = 3, TT = 16, STEPS = 45, V = 65535 };              // 45 steps of accum 4 wrap the data twice

// Token i of shard s encodes (s, i), so a batch identifies its place in the stream.
static uint16_t token_at(int s, int i) { return (uint16_t)((s * 7919 + i * 13) % V); }

static void write_shards(const char *dir) {
    for (int s = 0; s < NSHARDS; s++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/d_train_%03d.bin", dir, s);
        FILE *f = fopen_check(path, "wb");
        int header[SHARD_HEADER_INTS] = {0};
        header[0] = SHARD_MAGIC_U16; header[1] = 1; header[2] = shard_tokens[s];
        fwrite_check(header, sizeof(int), SHARD_HEADER_INTS, f, path);
        for (int i = 0; i < shard_tokens[s]; i++) {
            uint16_t t = token_at(s, i);
            fwrite_check(&t, 2, 1, f, path);
        }
        fclose(f);
    }
}

// The single-process run: every micro-batch's inputs and targets, and the state after each step.
typedef struct {
    int accum;
    int *in, *tg;          // (STEPS, accum, B*T)
    int *shard;            // (STEPS) state after the step
    long long *pos;
} Stream;

static void stream_make(Stream *st, const char *glob, int accum) {
    size_t n = (size_t)TB * TT;
    st->accum = accum;
    st->in = (int *)malloc_check((size_t)STEPS * accum * n * sizeof(int));
    st->tg = (int *)malloc_check((size_t)STEPS * accum * n * sizeof(int));
    st->shard = (int *)malloc_check(STEPS * sizeof(int));
    st->pos = (long long *)malloc_check(STEPS * sizeof(long long));
    DataLoader dl;
    dataloader_init(&dl, glob, TB, TT, V);
    for (int s = 0; s < STEPS; s++) {
        for (int k = 0; k < accum; k++) {
            dataloader_next(&dl);
            memcpy(st->in + ((size_t)s * accum + k) * n, dl.inputs, n * sizeof(int));
            memcpy(st->tg + ((size_t)s * accum + k) * n, dl.targets, n * sizeof(int));
        }
        st->shard[s] = dl.shard;
        st->pos[s] = dl.pos;
    }
    dataloader_free(&dl);
}

static void stream_free(Stream *st) { free(st->in); free(st->tg); free(st->shard); free(st->pos); }

// Walk steps [from, to) with world ranks (each its own loader, started at the
// state after step from-1, or at the beginning); compare with the stream.
// Counts into taken[(step, k)] the ranks that loaded each micro-batch.
// Returns the number of mismatches and describes the first in why.
static int walk_ranks(const Stream *st, const char *glob, int world, int from, int to, int *taken, char *why,
                      size_t why_n) {
    size_t n = (size_t)TB * TT;
    int bad = 0;
    for (int r = 0; r < world; r++) {
        Dist d;
        memset(&d, 0, sizeof(d));
        d.rank = r; d.world = world;
        DataLoader dl;
        dataloader_init(&dl, glob, TB, TT, V);
        if (from > 0) { dataloader_seek(&dl, st->shard[from - 1], st->pos[from - 1], "test"); }
        for (int s = from; s < to; s++) {
            int mine = 0;
            for (int k = 0; k < st->accum; k++) {
                if (!dist_next_micro(&dl, &d, k)) { continue; }
                mine++;
                taken[s * st->accum + k]++;
                const int *ein = st->in + ((size_t)s * st->accum + k) * n, *etg = st->tg + ((size_t)s * st->accum + k) * n;
                if ((memcmp(dl.inputs, ein, n * sizeof(int)) != 0 || memcmp(dl.targets, etg, n * sizeof(int)) != 0) &&
                    bad++ == 0) {
                    snprintf(why, why_n, "rank %d of %d, step %d, micro-batch %d differs from the stream", r, world, s, k);
                }
            }
            if (mine != st->accum / world && bad++ == 0) {
                snprintf(why, why_n, "rank %d of %d took %d micro-batches at step %d, not %d", r, world, mine, s,
                         st->accum / world);
            }
            if ((dl.shard != st->shard[s] || dl.pos != st->pos[s]) && bad++ == 0) {
                snprintf(why, why_n, "rank %d of %d: state after step %d is (%d, %lld), the stream's (%d, %lld)", r,
                         world, s, dl.shard, dl.pos, st->shard[s], st->pos[s]);
            }
        }
        dataloader_free(&dl);
    }
    return bad;
}

static void check_slicing(const char *dir) {
    char glob[512];
    snprintf(glob, sizeof(glob), "%s/d_train_*.bin", dir);
    // the stream itself crosses every shard boundary and wraps: check that it does
    {
        Stream st;
        stream_make(&st, glob, 4);
        int changes = 0, wraps = 0;
        for (int s = 1; s < STEPS; s++) {
            changes += st.shard[s] != st.shard[s - 1];
            wraps += st.shard[s] < st.shard[s - 1];
        }
        // the first token of step 0's first micro-batch is shard 0's token 0; a batch never straddles
        int ok = st.in[0] == token_at(0, 0) && st.tg[0] == token_at(0, 1);
        check(ok && changes >= 2 * NSHARDS - 1 && wraps >= 1,
              "the single stream of %d steps x 4 micro-batches of %dx%d tokens crosses %d shard boundaries and wraps %d times",
              STEPS, TB, TT, changes, wraps);
        stream_free(&st);
    }
    // skip advances exactly as next does
    {
        DataLoader a, b;
        dataloader_init(&a, glob, TB, TT, V);
        dataloader_init(&b, glob, TB, TT, V);
        int same = 1;
        for (int i = 0; i < 200 && same; i++) {
            dataloader_next(&a);
            dataloader_skip(&b);
            same = a.shard == b.shard && a.pos == b.pos;
        }
        check(same, "dataloader_skip leaves the same (shard, pos) as dataloader_next over 200 batches");
        dataloader_free(&a);
        dataloader_free(&b);
    }
    struct { int accum, world, resume_world; } cases[] = {
        {4, 1, 2}, {4, 2, 4}, {4, 4, 1}, {6, 3, 2}, {6, 2, 3}, {8, 8, 2},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int accum = cases[c].accum, world = cases[c].world, rw = cases[c].resume_world;
        Stream st;
        stream_make(&st, glob, accum);
        int *taken = (int *)calloc_check((size_t)STEPS * accum, sizeof(int));
        char why[256] = "";
        int bad = walk_ranks(&st, glob, world, 0, STEPS, taken, why, sizeof(why));
        int once = 1;
        for (int i = 0; i < STEPS * accum; i++) { once &= taken[i] == 1; }
        check(bad == 0 && once, "%d ranks x %d micro-batches per step = accumulation over %d: each rank's batches "
              "are the stream's k %% %d, each batch on one rank, states equal, %d steps %s", world, accum / world, accum,
              world, STEPS, bad ? why : "");
        // resume at step 17 (the state a checkpoint stores) on rw ranks, and on world again
        memset(taken, 0, (size_t)STEPS * accum * sizeof(int));
        int from = 17;
        bad = walk_ranks(&st, glob, world, 0, from, taken, why, sizeof(why));
        bad += walk_ranks(&st, glob, rw, from, STEPS, taken, why, sizeof(why));
        once = 1;
        for (int i = 0; i < STEPS * accum; i++) { once &= taken[i] == 1; }
        check(bad == 0 && once, "%d ranks for %d steps, then resumed on %d ranks from the saved state: the same stream %s",
              world, from, rw, bad ? why : "");
        free(taken);
        stream_free(&st);
    }
}

// ----------------------------------------------------------------------------
// 2. The environment

static const char *dist_vars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
                                  "RANK", "WORLD_SIZE", "LOCAL_RANK", "MHAR_DIST", "MHAR_DIST_ID_FILE"};

static void env_clear(void) {
    for (size_t i = 0; i < sizeof(dist_vars) / sizeof(dist_vars[0]); i++) { unsetenv(dist_vars[i]); }
}

// "NAME=value NAME=value ..." into the environment, after clearing the others
static void env_set(const char *spec) {
    env_clear();
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *tok = strtok(buf, " "); tok != NULL; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        *eq = '\0';
        setenv(tok, eq + 1, 1);
    }
}

static void child_dist_env(void *spec) {
    env_set((const char *)spec);
    Dist d;
    dist_env(&d);
}

static void child_dist_start(void *spec) {
    env_set((const char *)spec);
    Dist d;
    dist_start(&d, 4L * TB * TT, TB, TT);
}

static void child_check_batch(void *world) {
    Dist d;
    memset(&d, 0, sizeof(d));
    d.world = *(int *)world;
    dist_check_batch(&d, 4L * TB * TT, TB, TT);   // accum 4
}

static void check_env(void) {
    struct { const char *spec; int rank, world, local, nccl; } ok[] = {
        {"", 0, 1, 0, 0},
        {"OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1", 1, 2, 1, 1},
        {"OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_LOCAL_RANK=1", 5, 8, 1, 1},
        {"PMI_RANK=1 PMI_SIZE=2 MPI_LOCALRANKID=1", 1, 2, 1, 1},
        {"OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 RANK=0 WORLD_SIZE=4", 1, 2, 1, 1},   // mpirun's set first
        {"RANK=3 WORLD_SIZE=4 LOCAL_RANK=3", 3, 4, 3, 1},
        {"RANK=2 WORLD_SIZE=4", 2, 4, 2, 1},   // no local rank: one machine
        {"MHAR_DIST=1", 0, 1, 0, 1},
        {"RANK=0 WORLD_SIZE=1", 0, 1, 0, 0},
        {"RANK=0 WORLD_SIZE=1 MHAR_DIST=1", 0, 1, 0, 1},
        {"MHAR_DIST=0", 0, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        env_set(ok[i].spec);
        Dist d;
        dist_env(&d);
        check(d.rank == ok[i].rank && d.world == ok[i].world && d.local_rank == ok[i].local && d.nccl == ok[i].nccl,
              "environment \"%s\": rank %d of %d, local %d, NCCL path %d (%s)", ok[i].spec, d.rank, d.world,
              d.local_rank, d.nccl, d.source);
    }
    env_clear();
    struct { const char *spec, *expect; } bad[] = {
        {"RANK=2 WORLD_SIZE=2", "RANK=2 and WORLD_SIZE=2 do not describe a rank"},
        {"RANK=1", "environment RANK is set but WORLD_SIZE is not"},
        {"OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=0", "OMPI_COMM_WORLD_SIZE=0 do not describe"},
        {"OMPI_COMM_WORLD_RANK=x OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK='x' is not a rank"},
        {"RANK=0 WORLD_SIZE=2 MHAR_DIST=0", "MHAR_DIST=0 but environment WORLD_SIZE gives 2 ranks"},
        {"MHAR_DIST=yes", "MHAR_DIST='yes'"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char what[256];
        snprintf(what, sizeof(what), "environment \"%s\" is refused", bad[i].spec);
        check_dies(child_dist_env, (void *)bad[i].spec, bad[i].expect, what);
    }
    // the build without NCCL (the CPU trainer) runs one process only
    check_dies(child_dist_start, (void *)"OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2",
               "gives 2 ranks but this build has no NCCL", "no NCCL: 2 ranks from mpirun are refused");
    check_dies(child_dist_start, (void *)"MHAR_DIST=1", "MHAR_DIST=1 asks for the NCCL path but this build has no NCCL",
               "no NCCL: MHAR_DIST=1 is refused");
    {
        char err[256];
        int rc = run_child(child_dist_start, (void *)"RANK=0 WORLD_SIZE=1", err, sizeof(err));
        check(rc == 0 && err[0] == '\0', "no NCCL: one rank from the environment runs (exit %d)", rc);
    }
    int w2 = 2, w3 = 3;
    char err[256];
    int rc = run_child(child_check_batch, &w2, err, sizeof(err));
    check(rc == 0, "-d = 4 micro-batches on 2 ranks is accepted (exit %d)", rc);
    check_dies(child_check_batch, &w3, "-d 192 is not a multiple of b*T*ranks = 3*16*3 = 144",
               "-d = 4 micro-batches on 3 ranks is refused");
}

// ----------------------------------------------------------------------------
// 3. The id exchange through a file

typedef struct {
    const char *path;
    int rank, world;
    double delay_s;     // before the exchange
    double timeout_s;
    unsigned char id[128];
} Exchange;

// A rank: exchange, then exit 0 when it holds the expected bytes (rank r + i for byte i), 2 when not.
static void child_exchange(void *arg) {
    Exchange *x = (Exchange *)arg;
    double started = (double)time(NULL);
    usleep((useconds_t)(x->delay_s * 1e6));
    unsigned char id[128];
    if (x->rank == 0) { memcpy(id, x->id, sizeof(id)); } else { memset(id, 0, sizeof(id)); }
    dist_id_exchange(x->path, x->rank, x->world, id, sizeof(id), started, x->timeout_s);
    exit(memcmp(id, x->id, sizeof(id)) == 0 ? 0 : 2);
}

static void write_id_file(const char *path, int world, unsigned char fill, time_t mtime) {
    FILE *f = fopen_check(path, "wb");
    unsigned char id[128];
    memset(id, fill, sizeof(id));
    fwrite_check(DIST_ID_MAGIC, 1, 8, f, path);
    fwrite_check(&world, sizeof(int), 1, f, path);
    fwrite_check(id, 1, sizeof(id), f, path);
    fclose(f);
    struct utimbuf t = {mtime, mtime};
    utime(path, &t);
}

static void check_exchange(const char *dir) {
    char path[512];
    snprintf(path, sizeof(path), "%s/nccl.id", dir);
    unsigned char id[128];
    for (int i = 0; i < 128; i++) { id[i] = (unsigned char)(i * 37 + 11); }
    // 4 ranks; rank 0 comes last, after a stale file of an earlier launch (same world) was left there
    write_id_file(path, 4, 0xEE, time(NULL) - 3600);
    pid_t pids[4];
    for (int r = 0; r < 4; r++) {
        Exchange x;
        x.path = path; x.rank = r; x.world = 4; x.delay_s = r == 0 ? 0.5 : 0.0; x.timeout_s = 20;
        memcpy(x.id, id, sizeof(id));
        fflush(stdout);
        pids[r] = fork();
        if (pids[r] == 0) { child_exchange(&x); }
    }
    int good = 0;
    for (int r = 0; r < 4; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        good += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    check(good == 4, "id exchange: 4 ranks (rank 0 starting 0.5 s late, a stale file in place) all hold rank 0's "
          "128 bytes (%d of 4)", good);
    // a reader alone: the stale file is not taken, and it times out with a one-line error
    write_id_file(path, 2, 0xEE, time(NULL) - 3600);
    Exchange x;
    x.path = path; x.rank = 1; x.world = 2; x.delay_s = 0; x.timeout_s = 1;
    memcpy(x.id, id, sizeof(id));
    check_dies(child_exchange, &x, "rank 1 of 2: no NCCL id in", "id exchange: a stale file is ignored and the wait times out");
    // a fresh file of another world size is refused
    write_id_file(path, 3, 0xEE, time(NULL));
    check_dies(child_exchange, &x, "was written by a job of 3 ranks, this one has 2",
               "id exchange: a file of a 3-rank launch is refused by a 2-rank one");
    unlink(path);
    // the default path: per world size and launching parent; MHAR_DIST_ID_FILE overrides it
    env_clear();
    Dist d;
    memset(&d, 0, sizeof(d));
    d.world = 2;
    char p1[4096], p2[4096], want[64];
    dist_id_path(&d, p1, sizeof(p1));
    setenv("MHAR_DIST_ID_FILE", "/shared/job.id", 1);
    dist_id_path(&d, p2, sizeof(p2));
    env_clear();
    snprintf(want, sizeof(want), "mhar_nccl_%ld_2.id", (long)getppid());
    check(strstr(p1, want) != NULL && strcmp(p2, "/shared/job.id") == 0, "id file: default %s, MHAR_DIST_ID_FILE %s",
          p1, p2);
    // the parameter hash sees a one-bit change
    float a[1000];
    for (int i = 0; i < 1000; i++) { a[i] = (float)i * 0.25f; }
    uint64_t h0 = dist_hash(1, a, sizeof(a));
    a[777] = nextafterf(a[777], 1e9f);
    uint64_t h1 = dist_hash(1, a, sizeof(a));
    check(h0 != h1 && dist_hash(1, a, sizeof(a)) == h1, "parameter hash: stable, and a one-ulp change alters it");
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    char dir[] = "/tmp/test_dist_XXXXXX";
    if (mkdtemp(dir) == NULL) { die("cannot create a temporary directory: %s", strerror(errno)); }
    write_shards(dir);
    check_slicing(dir);
    check_env();
    check_exchange(dir);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) { printf("note: could not remove %s\n", dir); }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
