/*
Tokenizer throughput benchmark (prints figures; not a test). Run through
`make bench-tokenizer`, which puts it beside npm tiktoken on the same text.

  data_prep/bench_tokenize [--vocab PATH] [--seconds S] TEXT

Two figures, in MB/s of input text:
  1 core:     the whole text encoded as one string, one thread;
  all cores:  the text cut into chunks just after every "\n\n", the chunks
              encoded on all threads (OpenMP, dynamic scheduling).
Each is repeated for at least S seconds (default 2) after one warm-up, with a
fresh encoder state (empty piece cache) for every repetition; the figure is
from the fastest repetition, which is the least disturbed by other work on the
machine. Prints one line:
  ours single_mbs=.. all_mbs=.. threads=.. bytes=.. tokens=.. chunk_tokens=..
*/
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bpe.h"

// monotonic clock in seconds
static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// encodes the whole text on one thread; returns the token count
static size_t run_single(const BPE *bpe, const unsigned char *text, size_t len) {
    BPEWorker w;
    bpe_worker_init(&w);
    TokenBuf out = {0};
    bpe_encode(bpe, &w, text, len, &out);
    size_t n = out.len;
    tokenbuf_free(&out);
    bpe_worker_free(&w);
    return n;
}

// encodes the chunks on all threads; returns the total token count
static size_t run_parallel(const BPE *bpe, const unsigned char *text, const size_t *starts, size_t n_chunks) {
    size_t total = 0;
    #pragma omp parallel reduction(+:total)
    {
        BPEWorker w;
        bpe_worker_init(&w);
        TokenBuf out = {0};
        #pragma omp for schedule(dynamic, 4)
        for (size_t c = 0; c < n_chunks; c++) {
            out.len = 0;
            bpe_encode(bpe, &w, text + starts[c], starts[c + 1] - starts[c], &out);
            total += out.len;
        }
        tokenbuf_free(&out);
        bpe_worker_free(&w);
    }
    return total;
}

// loads the text, times one-core and all-core encoding, prints one line of figures
int main(int argc, char **argv) {
    const char *vocab = "data/vocab/r50k_base.tiktoken", *path = NULL;
    double seconds = 2.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = argv[++i];
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (argv[i][0] != '-') path = argv[i];
        else { fprintf(stderr, "usage: data_prep/bench_tokenize [--vocab PATH] [--seconds S] TEXT\n"); return 1; }
    }
    if (!path) { fprintf(stderr, "usage: data_prep/bench_tokenize [--vocab PATH] [--seconds S] TEXT\n"); return 1; }
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "error: cannot open %s; fix: run `data_prep/fetch.sh tiny` or give another text\n", path); return 1; }
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *text = (unsigned char *)malloc(len + 1);
    if (fread(text, 1, len, f) != len) { fprintf(stderr, "error: cannot read %s\n", path); return 1; }
    fclose(f);

    BPE bpe;
    bpe_load(&bpe, vocab);

    // chunk starts: 0, then just after every "\n\n", then len
    size_t *starts = (size_t *)malloc((len / 2 + 2) * sizeof(size_t)), n_chunks = 0;
    starts[n_chunks++] = 0;
    for (size_t i = 0; i + 1 < len; i++)
        if (text[i] == '\n' && text[i + 1] == '\n') { starts[n_chunks++] = i + 2; i++; }
    if (starts[n_chunks - 1] != len) starts[n_chunks++] = len;
    n_chunks--; // chunk c is [starts[c], starts[c+1])

    size_t tokens = run_single(&bpe, text, len); // warm-up
    double start = now_seconds(), best = 1e30;
    do {
        double t0 = now_seconds();
        run_single(&bpe, text, len);
        double t = now_seconds() - t0;
        if (t < best) best = t;
    } while (now_seconds() - start < seconds);
    double single = (double)len / best / 1e6;

    size_t chunk_tokens = run_parallel(&bpe, text, starts, n_chunks); // warm-up
    start = now_seconds();
    best = 1e30;
    do {
        double t0 = now_seconds();
        run_parallel(&bpe, text, starts, n_chunks);
        double t = now_seconds() - t0;
        if (t < best) best = t;
    } while (now_seconds() - start < seconds);
    double all = (double)len / best / 1e6;

    printf("ours single_mbs=%.2f all_mbs=%.2f threads=%d bytes=%zu tokens=%zu chunk_tokens=%zu chunks=%zu\n",
           single, all, omp_get_max_threads(), len, tokens, chunk_tokens, n_chunks);
    free(starts);
    free(text);
    bpe_free(&bpe);
    return 0;
}
