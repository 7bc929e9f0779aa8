// Token-shard reader shared by both trainers (SPEC section 7).
// A shard is a header of 256 int32 (magic, version, token count) followed by
// the tokens: magic 20240520 / version 1 for uint16 tokens, magic 20240801 /
// version 7 for uint32 tokens. This is llm.c's layout, so its shards work too.
//
// The loader walks the shards of a glob in sorted order, reading B*T+1
// consecutive tokens per batch (inputs, and targets shifted by one) and
// advancing by B*T; a batch never straddles two shards. After the last shard it
// starts again at the first. Its whole state is (shard, pos), which checkpoints
// store, so a resumed run sees exactly the batches it would have seen.
#pragma once
#include <glob.h>
#include "util.h"

#define SHARD_MAGIC_U16 20240520
#define SHARD_MAGIC_U32 20240801
#define SHARD_HEADER_INTS 256

typedef struct {
    char **paths;        // shard files, sorted
    size_t *ntok;        // tokens in each shard
    int *elem;           // bytes per token in each shard: 2 or 4
    int nshards;
    int B, T, V;
    int shard;           // state: current shard
    long long pos;       // state: index of the next token to read in that shard
    unsigned char *buf;  // raw tokens of one batch
    int *inputs;         // (B, T)
    int *targets;        // (B, T)
} DataLoader;

// Read and check one shard header; returns the token count and sets *elem.
// The file is closed before any check can fail.
static size_t shard_open_check(const char *path, int *elem) {
    if (is_directory(path)) { die("%s is a directory, not a token shard; fix the -i/-j glob", path); }
    FILE *f = fopen_check(path, "rb");
    int header[SHARD_HEADER_INTS];
    size_t got = fread(header, sizeof(int), SHARD_HEADER_INTS, f);
    struct stat st;
    int stat_ok = fstat(fileno(f), &st) == 0;
    fclose(f);
    if (got != SHARD_HEADER_INTS) {
        die("%s is shorter than the 1024-byte shard header; it is not a token shard (re-run data_prep)", path);
    }
    if (!stat_ok) { die("cannot stat %s: %s", path, strerror(errno)); }
    if (header[0] == SHARD_MAGIC_U16 && header[1] == 1) { *elem = 2; }
    else if (header[0] == SHARD_MAGIC_U32 && header[1] == 7) { *elem = 4; }
    else {
        die("%s has magic %d version %d; a token shard has magic %d (version 1) or %d (version 7)",
            path, header[0], header[1], SHARD_MAGIC_U16, SHARD_MAGIC_U32);
    }
    if (header[2] < 0) { die("%s has a negative token count %d in its header", path, header[2]); }
    size_t ntok = (size_t)(unsigned)header[2];
    long long bytes = (long long)st.st_size;
    long long want = (long long)sizeof(int) * SHARD_HEADER_INTS + (long long)ntok * *elem;
    if (bytes != want) {
        die("%s is %lld bytes but its header promises %zu tokens (%lld bytes): the file is %s; re-create it",
            path, bytes, ntok, want, bytes < want ? "truncated" : "longer than its header says");
    }
    return ntok;
}

static void dataloader_init(DataLoader *dl, const char *pattern, int B, int T, int V) {
    memset(dl, 0, sizeof(*dl));
    dl->B = B; dl->T = T; dl->V = V;
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        die("no token shards match '%s'; make them with data_prep (see README.md) or fix the -i/-j glob", pattern);
    }
    dl->nshards = (int)g.gl_pathc;
    dl->paths = (char **)malloc_check(dl->nshards * sizeof(char *));
    dl->ntok = (size_t *)malloc_check(dl->nshards * sizeof(size_t));
    dl->elem = (int *)malloc_check(dl->nshards * sizeof(int));
    size_t need = (size_t)B * T + 1;
    for (int i = 0; i < dl->nshards; i++) {
        dl->paths[i] = strdup(g.gl_pathv[i]);   // glob sorts its matches
        dl->ntok[i] = shard_open_check(dl->paths[i], &dl->elem[i]);
        if (dl->ntok[i] < need) {
            die("%s holds %zu tokens, fewer than one batch needs (b*T+1 = %zu); use a smaller -b or -T",
                dl->paths[i], dl->ntok[i], need);
        }
    }
    globfree(&g);
    dl->buf = (unsigned char *)malloc_check(need * 4);
    dl->inputs = (int *)malloc_check((size_t)B * T * sizeof(int));
    dl->targets = (int *)malloc_check((size_t)B * T * sizeof(int));
}

static void dataloader_reset(DataLoader *dl) { dl->shard = 0; dl->pos = 0; }

// Restore a saved position (from a checkpoint), checking it fits these shards.
static void dataloader_seek(DataLoader *dl, int shard, long long pos, const char *why) {
    if (shard < 0 || shard >= dl->nshards || pos < 0 || (size_t)pos > dl->ntok[shard]) {
        die("%s: data position (shard %d, token %lld) is outside the %d train shards given by -i; "
            "resume with the same shards", why, shard, pos, dl->nshards);
    }
    dl->shard = shard; dl->pos = pos;
}

// Load the next batch into inputs/targets and advance.
static void dataloader_next(DataLoader *dl) {
    size_t n = (size_t)dl->B * dl->T;
    if ((size_t)dl->pos + n + 1 > dl->ntok[dl->shard]) {   // not enough left: next shard
        dl->shard = (dl->shard + 1) % dl->nshards;
        dl->pos = 0;
    }
    const char *path = dl->paths[dl->shard];
    int elem = dl->elem[dl->shard];
    FILE *f = fopen_check(path, "rb");
    int ok = fseek(f, (long)(sizeof(int) * SHARD_HEADER_INTS + (size_t)dl->pos * elem), SEEK_SET) == 0 &&
             fread(dl->buf, elem, n + 1, f) == n + 1;
    fclose(f);
    if (!ok) { die("%s is truncated or unreadable (it changed since the run began?); re-create it", path); }
    for (size_t i = 0; i <= n; i++) {
        uint32_t tok;
        if (elem == 2) { uint16_t t16; memcpy(&t16, dl->buf + 2 * i, 2); tok = t16; }
        else { memcpy(&tok, dl->buf + 4 * i, 4); }
        if (tok >= (uint32_t)dl->V) {
            die("%s holds token %u at position %lld, outside the vocabulary V=%d; set -V to the "
                "tokenizer's size or re-tokenise", path, tok, dl->pos + (long long)i, dl->V);
        }
        if (i < n) { dl->inputs[i] = (int)tok; }
        if (i > 0) { dl->targets[i - 1] = (int)tok; }
    }
    dl->pos += (long long)n;
}

static void dataloader_free(DataLoader *dl) {
    for (int i = 0; i < dl->nshards; i++) { free(dl->paths[i]); }
    free(dl->paths); free(dl->ntok); free(dl->elem);
    free(dl->buf); free(dl->inputs); free(dl->targets);
}
