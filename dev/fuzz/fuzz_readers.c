/*
fuzz_readers.c: libFuzzer harness for the three readers of untrusted files,
the token shard (common/dataloader.h), the checkpoint (common/checkpoint.h)
and the tokenizer file (common/tokenizer.h). Built three times, one reader
each (-DFUZZ_SHARD, -DFUZZ_CKPT, -DFUZZ_TOK), with clang's
-fsanitize=fuzzer,address,undefined and -DMHAR_FUZZ:

  make fuzz               each target for FUZZ_SECONDS (default 300) from its seed corpus
  make fuzz FUZZ_SECONDS=20   the bounded run of CI (.ci/run)

How a bad input ends: the readers die() on it, as in the trainers. In the fuzz
build die() (and the tokenizer's error path) does not exit: it longjmps back
here (MHAR_EXIT in common/util.h), so the next input runs in the same process
and keeps libFuzzer's coverage. The readers close every file before they die,
and this harness frees what the reader had allocated, so no descriptor or
memory leaks across inputs (LeakSanitizer stays on). A crash is then only a
real one: a sanitizer report, a signal, or a hang past -timeout.

Each input is written to a file (the readers take paths) under $TMPDIR, else
/dev/shm (memory: five times the executions per second of a disk), else /tmp.
The seed corpora are dev/fuzz/corpus/{shard,ckpt,tok}/ (small valid files and
near misses), made by dev/fuzz/make_corpus.py.
*/
#include "common/util.h"
#include "common/config.h"
#include "common/dataloader.h"
#include "common/checkpoint.h"
#include "common/tokenizer.h"

static char input_path[4096];

// write the input to this process's scratch file
static void put_input(const uint8_t *data, size_t size) {
    if (input_path[0] == '\0') {
        const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
        snprintf(input_path, sizeof(input_path), "%s/mhar_fuzz_%d.bin", dir, (int)getpid());
    }
    FILE *f = fopen(input_path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) { abort(); }
}

#ifdef FUZZ_SHARD
// the shard header check, then the whole loader: every batch of the shard with
// a small vocabulary, so the token range check runs too
static DataLoader dl;
static int dl_live = 0;
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    put_input(data, size);
    if (setjmp(mhar_fuzz_jmp) != 0) {   // a reader died: release its loader
        if (dl_live) { dataloader_free(&dl); dl_live = 0; }
        return 0;
    }
    int elem;
    size_t ntok = shard_open_check(input_path, &elem);
    int B = 2, T = 8, V = 1 + (size > 1024 ? data[1024] : 0) * 256;   // some inputs with tokens out of range
    if (ntok < (size_t)B * T + 1) { return 0; }
    dataloader_init(&dl, input_path, B, T, V);
    dl_live = 1;
    for (size_t k = 0; k < ntok / ((size_t)B * T) + 1 && k < 256; k++) { dataloader_next(&dl); }
    dataloader_free(&dl);
    dl_live = 0;
    return 0;
}
#endif

#ifdef FUZZ_CKPT
// the checkpoint header, size, checksum and finiteness checks, then one read
// of the parameters as the trainers do
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    put_input(data, size);
    static float *params = NULL;
    static FILE *open_file = NULL;
    if (setjmp(mhar_fuzz_jmp) != 0) {
        if (open_file) { fclose(open_file); open_file = NULL; }
        free(params); params = NULL;
        return 0;
    }
    Config c;
    CkptInfo in;
    open_file = ckpt_open_read(input_path, &c, &in);
    size_t n = param_count(&c);
    if (n * in.elem <= (size_t)1 << 26) {   // the file size check already bounds it; keep memory small
        params = (float *)malloc_check(n * in.elem);
        fread_check(params, in.elem, n, open_file, input_path);
        free(params); params = NULL;
    }
    fclose(open_file);
    open_file = NULL;
    return 0;
}
#endif

#ifdef FUZZ_TOK
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    put_input(data, size);
    static Tokenizer tok;
    if (setjmp(mhar_fuzz_jmp) != 0) { return 0; }   // tokenizer_init frees its memory before failing
    tokenizer_init(&tok, input_path);
    size_t len, total = 0;
    for (uint32_t id = 0; id <= tokenizer_vocab_size(&tok); id++) {   // one id past the end: NULL
        const unsigned char *b = tokenizer_decode(&tok, id, &len);
        if (b != NULL) { total += len ? b[len - 1] : 0; }
    }
    if (tokenizer_eot(&tok) >= tokenizer_vocab_size(&tok)) { abort(); }   // the reader's promise
    tokenizer_free(&tok);
    return (int)(total & 0);
}
#endif
