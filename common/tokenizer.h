/*
Tokenizer: the decode side (token id -> bytes) that the trainers include.
Header-only; C99, and valid C++ for nvcc.

The tokenizer file is the project's own format, written by data_prep/tokenize
(e.g. data/tiny/tokenizer.bin). Everything is little-endian:

  header: 256 int32
    [0] magic 0x4B54484D (the bytes "MHTK" at the start of the file)
    [1] version 1
    [2] vocab size V (50257 for GPT-2)
    [3] EOT id (50256 for GPT-2)
    [4..255] 0
  then for each id 0..V-1: a uint32 byte length n, followed by the n bytes of
  that token (raw bytes, not necessarily valid UTF-8 on their own). The EOT
  entry holds the text "<|endoftext|>".

Usage:
  Tokenizer tok;
  tokenizer_init(&tok, "data/tiny/tokenizer.bin");
  size_t n; const unsigned char *b = tokenizer_decode(&tok, id, &n);
  fwrite(b, 1, n, stdout);
  tokenizer_free(&tok);
*/
#ifndef MHAR_COMMON_TOKENIZER_H
#define MHAR_COMMON_TOKENIZER_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// how a fatal error ends the process (common/util.h redefines it for the fuzz build)
#ifndef MHAR_EXIT
#define MHAR_EXIT(code) exit(code)
#endif

#define TOKENIZER_FILE_MAGIC 0x4B54484D
#define TOKENIZER_FILE_VERSION 1
#define TOKENIZER_HEADER_INTS 256

typedef struct {
    uint32_t vocab_size;
    uint32_t eot;
    unsigned char *bytes;   // all token bytes, concatenated in id order
    size_t *offset;         // id's bytes are bytes[offset[id] .. offset[id + 1])
} Tokenizer;

// decodes a little-endian uint32 whatever the machine's byte order
static inline uint32_t tokenizer_le32_(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// prints the one-line error about the tokenizer file and exits
static inline void tokenizer_fail_(const char *path, const char *problem) {
#ifndef MHAR_FUZZ
    fprintf(stderr, "error: tokenizer file %s: %s; fix: regenerate it with data_prep/tokenize (e.g. `make data/tiny`)\n", path, problem);
#else
    (void)path; (void)problem;
#endif
    MHAR_EXIT(1);
}

// releases the memory of tokenizer_init
static inline void tokenizer_free(Tokenizer *tok) {
    free(tok->bytes);
    free(tok->offset);
    memset(tok, 0, sizeof(*tok));
}

// loads the tokenizer file at path; on any problem prints one line naming the
// file, the problem and the fix, then exits with status 1
static inline void tokenizer_init(Tokenizer *tok, const char *path) {
    memset(tok, 0, sizeof(*tok));
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open tokenizer file %s: %s; fix: create it with data_prep/tokenize (e.g. `make data/tiny`) or pass the right path\n", path, strerror(errno));
        MHAR_EXIT(1);
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        tokenizer_fail_(path, "not a regular file (a directory?)");
    }
    unsigned char header[TOKENIZER_HEADER_INTS * 4];
    if (fread(header, 1, sizeof header, f) != sizeof header) { fclose(f); tokenizer_fail_(path, "shorter than its 1024-byte header"); }
    uint32_t magic = tokenizer_le32_(header), version = tokenizer_le32_(header + 4);
    uint32_t vocab = tokenizer_le32_(header + 8), eot = tokenizer_le32_(header + 12);
    char msg[200];
    if (magic != TOKENIZER_FILE_MAGIC) {
        fclose(f);
        snprintf(msg, sizeof msg, "bad magic 0x%08X, expected 0x%08X (\"MHTK\"): not a tokenizer file of this project", magic, TOKENIZER_FILE_MAGIC);
        tokenizer_fail_(path, msg);
    }
    if (version != TOKENIZER_FILE_VERSION) {
        fclose(f);
        snprintf(msg, sizeof msg, "version %u, this build reads version %d", version, TOKENIZER_FILE_VERSION);
        tokenizer_fail_(path, msg);
    }
    if (vocab == 0 || vocab > (1u << 24) || eot >= vocab) {
        fclose(f);
        snprintf(msg, sizeof msg, "vocab size %u / EOT id %u are not valid", vocab, eot);
        tokenizer_fail_(path, msg);
    }
    // the rest of the file: V (length, bytes) entries, nothing after them
    long start = ftell(f);
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    fseek(f, start, SEEK_SET);
    if (start < 0 || end < start) { fclose(f); tokenizer_fail_(path, "cannot tell its size"); }
    size_t rest = (size_t)(end - start);
    if (rest / 4 < vocab) {   // every token has at least its 4-byte length: refuse before allocating for vocab ids
        fclose(f);
        snprintf(msg, sizeof msg, "truncated: %u tokens need at least %llu bytes after the header, it has %zu", vocab,
                 4ull * vocab, rest);
        tokenizer_fail_(path, msg);
    }
    unsigned char *body = (unsigned char *)malloc(rest ? rest : 1);
    tok->offset = (size_t *)malloc(((size_t)vocab + 1) * sizeof(size_t));
    if (!body || !tok->offset) { fclose(f); free(body); tokenizer_free(tok); tokenizer_fail_(path, "out of memory"); }
    if (fread(body, 1, rest, f) != rest) { fclose(f); free(body); tokenizer_free(tok); tokenizer_fail_(path, "read failed"); }
    fclose(f);
    // compact the entries in place: drop the length fields, keep the bytes
    size_t in = 0, out = 0;
    for (uint32_t id = 0; id < vocab; id++) {
        if (rest - in < 4) {
            snprintf(msg, sizeof msg, "truncated at token %u of %u", id, vocab);
            free(body);
            tokenizer_free(tok);
            tokenizer_fail_(path, msg);
        }
        uint32_t n = tokenizer_le32_(body + in);
        in += 4;
        if (n > rest - in) {
            snprintf(msg, sizeof msg, "token %u claims %u bytes, past the end of the file", id, n);
            free(body);
            tokenizer_free(tok);
            tokenizer_fail_(path, msg);
        }
        tok->offset[id] = out;
        memmove(body + out, body + in, n);
        in += n;
        out += n;
    }
    if (in != rest) {
        snprintf(msg, sizeof msg, "%zu unexpected bytes after the last token", rest - in);
        free(body);
        tokenizer_free(tok);
        tokenizer_fail_(path, msg);
    }
    tok->offset[vocab] = out;
    tok->bytes = body;
    tok->vocab_size = vocab;
    tok->eot = eot;
}

// the bytes of token id, their count in *len; NULL (and *len = 0) if id is out of range
static inline const unsigned char *tokenizer_decode(const Tokenizer *tok, uint32_t id, size_t *len) {
    if (id >= tok->vocab_size) { if (len) *len = 0; return NULL; }
    if (len) *len = tok->offset[id + 1] - tok->offset[id];
    return tok->bytes + tok->offset[id];
}

// id of the end-of-text token that separates documents
static inline uint32_t tokenizer_eot(const Tokenizer *tok) { return tok->eot; }

// number of token ids (valid ids are 0 .. vocab_size-1)
static inline uint32_t tokenizer_vocab_size(const Tokenizer *tok) { return tok->vocab_size; }

#endif
