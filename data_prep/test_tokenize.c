/*
Tests of data_prep: the BPE encoder against golden GPT-2 ids (made by npm
tiktoken, see dev/tokenizer/make_golden.js), round trips on arbitrary bytes,
the tokenize program's shards and tokenizer file, common/tokenizer.h, and the
errors on bad input. Run from the repository root:

  ./data_prep/test_tokenize

Needs data/vocab/r50k_base.tiktoken and data/raw/moby_dick/moby_dick.txt
(`data_prep/fetch.sh vocab tiny`); a missing file is a failure, not a skip.
Ends with the line "N passed, N failed" and exits 1 if anything failed.
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bpe.h"
#include "../common/tokenizer.h"

#define RANK_PATH "data/vocab/r50k_base.tiktoken"
#define MOBY_PATH "data/raw/moby_dick/moby_dick.txt"
#define TOKENIZE_BIN "./data_prep/tokenize"

static int n_pass, n_fail;
static char tmpdir[256];
static BPE bpe;
static BPEWorker worker;

// records one check; prints the failures (and a line per passing group via ok())
static int check(int cond, const char *fmt, ...) {
    if (cond) { n_pass++; return 1; }
    n_fail++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "FAIL: ");
    vfprintf(stdout, fmt, ap);
    fprintf(stdout, "\n");
    va_end(ap);
    return 0;
}

// reads a whole file; NULL if it cannot be opened
static unsigned char *slurp(const char *path, size_t *len) {
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = (unsigned char *)malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    b[*len] = 0;
    return b;
}

// writes bytes to a file (test fixtures)
static void put_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    fwrite(data, 1, len, f);
    fclose(f);
}

// encodes text into a fresh buffer
static TokenBuf encode(const unsigned char *text, size_t len) {
    TokenBuf out = {0};
    bpe_encode(&bpe, &worker, text, len, &out);
    return out;
}

// concatenates the bytes of ids
static unsigned char *decode_ids(const uint32_t *ids, size_t n, size_t *len) {
    size_t cap = 64, m = 0;
    unsigned char *out = (unsigned char *)malloc(cap);
    for (size_t i = 0; i < n; i++) {
        size_t k;
        const unsigned char *b = bpe_token_bytes(&bpe, ids[i], &k);
        if (!b) { free(out); return NULL; }
        while (m + k + 1 > cap) { cap *= 2; out = (unsigned char *)realloc(out, cap); }
        memcpy(out + m, b, k);
        m += k;
    }
    *len = m;
    return out;
}

// runs a shell command, stderr captured into a string; returns the exit status
static int run(const char *cmd, char **err_text) {
    char full[8192], errpath[512];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", tmpdir);
    snprintf(full, sizeof full, "%s 2> %s > /dev/null", cmd, errpath);
    int st = system(full);
    size_t len;
    *err_text = (char *)slurp(errpath, &len);
    if (!*err_text) *err_text = strdup("");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// number of lines in s
static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

// ----------------------------------------------------------------------------
// golden ids

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

// each line of data_prep/golden/tricky.tsv: name, hex of the input, ids
static void test_golden_tricky(void) {
    size_t len;
    char *text = (char *)slurp("data_prep/golden/tricky.tsv", &len);
    if (!check(text != NULL, "data_prep/golden/tricky.tsv missing (it is committed; regenerate with dev/tokenizer/make_golden.js)")) return;
    int cases = 0, passed = 0, saw_moby = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char *name = line, *hex = strchr(line, '\t');
        if (!check(hex != NULL, "golden line without tabs: %.40s", line)) continue;
        *hex++ = 0;
        char *ids_s = strchr(hex, '\t');
        if (!check(ids_s != NULL, "golden case %s has no ids", name)) continue;
        *ids_s++ = 0;
        size_t n = strlen(hex) / 2;
        unsigned char *in = (unsigned char *)malloc(n + 1);
        for (size_t i = 0; i < n; i++) in[i] = (unsigned char)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
        TokenBuf want = {0};
        for (char *p = ids_s; *p;) {
            tokenbuf_push(&want, (uint32_t)strtoul(p, &p, 10));
            if (*p == ',') p++;
        }
        TokenBuf got = encode(in, n);
        int same = got.len == want.len && memcmp(got.data, want.data, got.len * sizeof(uint32_t)) == 0;
        if (!same) {
            size_t k = 0;
            while (k < got.len && k < want.len && got.data[k] == want.data[k]) k++;
            check(0, "golden %s: %zu ids, expected %zu; first difference at %zu: got %u, expected %u", name, got.len, want.len, k,
                  k < got.len ? got.data[k] : 0, k < want.len ? want.data[k] : 0);
        } else {
            check(1, "");
            passed++;
        }
        cases++;
        saw_moby |= strcmp(name, "moby_dick_opening") == 0;
        tokenbuf_free(&got);
        tokenbuf_free(&want);
        free(in);
    }
    check(cases >= 39, "golden file has %d cases, expected at least 39", cases);
    check(saw_moby, "golden file lacks the moby_dick_opening case");
    printf("golden tricky strings: %d/%d cases match tiktoken\n", passed, cases);
    free(text);
}

// FNV-1a 64 over ids as uint32 little-endian (as make_golden.js computes it)
static uint64_t fnv1a64(const uint32_t *ids, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            h ^= (ids[i] >> (8 * k)) & 0xff;
            h *= 0x100000001b3ull;
        }
    return h;
}

// the whole of Moby Dick, as one text, against tiktoken's count and hash
static void test_golden_moby(void) {
    size_t glen, len;
    char *g = (char *)slurp("data_prep/golden/moby_dick.txt", &glen);
    if (!check(g != NULL, "data_prep/golden/moby_dick.txt missing (it is committed)")) return;
    unsigned long long bytes = 0, tokens = 0, hash = 0;
    char *p;
    if ((p = strstr(g, "\nbytes "))) bytes = strtoull(p + 7, NULL, 10);
    if ((p = strstr(g, "\ntokens "))) tokens = strtoull(p + 8, NULL, 10);
    if ((p = strstr(g, "\nfnv1a64 "))) hash = strtoull(p + 9, NULL, 16);
    free(g);
    check(bytes && tokens && hash, "data_prep/golden/moby_dick.txt is malformed");
    unsigned char *text = slurp(MOBY_PATH, &len);
    if (!check(text != NULL, "%s missing; fix: run `data_prep/fetch.sh tiny`", MOBY_PATH)) return;
    check(len == bytes, "%s has %zu bytes, the golden was made from %llu (run data_prep/fetch.sh tiny)", MOBY_PATH, len, bytes);
    TokenBuf ids = encode(text, len);
    check(ids.len == tokens, "Moby Dick: %zu tokens, tiktoken gives %llu", ids.len, tokens);
    uint64_t h = fnv1a64(ids.data, ids.len);
    check(h == hash, "Moby Dick: ids hash %016llx, tiktoken's is %016llx", (unsigned long long)h, hash);
    printf("golden Moby Dick: %zu tokens, hash %016llx (tiktoken: %llu, %016llx)\n", ids.len, (unsigned long long)h, tokens, hash);
    tokenbuf_free(&ids);
    free(text);
}

// ----------------------------------------------------------------------------
// merge algorithms and round trips

static uint64_t rng_state = 0x853c49e6748fea9bull;
// xorshift random numbers, fixed seed so failures reproduce
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

// fills buf with random text of one of several kinds; returns its length
static size_t random_text(unsigned char *buf, size_t max) {
    static const char *frags[] = {"the", " the", "ing", "'s", " ", "  ", "\t", "\n", "\r\n", "e", "a", "=", "-", "0", "12",
                                  "\xc3\xa9", "\xe4\xbd\xa0", "\xf0\x9f\x98\x80", "\xd7\xa9", "\xff", "\xc3", "\x80", "\xed\xa0\x80", "\x00"};
    size_t n = 1 + rnd() % max, m = 0;
    int kind = (int)(rnd() % 3);
    while (m < n) {
        if (kind == 0) buf[m++] = (unsigned char)rnd(); // any bytes
        else if (kind == 1) buf[m++] = (unsigned char)("ab =-e "[rnd() % 7]); // merge-heavy runs
        else {
            const char *f = frags[rnd() % (sizeof frags / sizeof *frags)];
            size_t k = f[0] ? strlen(f) : 1; // "\x00" is one NUL byte
            for (size_t i = 0; i < k && m < n; i++) buf[m++] = (unsigned char)f[i];
        }
    }
    return n;
}

// the array merge and the heap merge must give the same ids on any piece
static void test_merge_algorithms(void) {
    unsigned char buf[600];
    int bad = 0;
    for (int t = 0; t < 3000; t++) {
        size_t n = random_text(buf, t < 2000 ? 40 : 600);
        TokenBuf a = {0}, b = {0}, c = {0};
        bpe_encode_piece(&bpe, &worker, buf, n, &a, 1);
        bpe_encode_piece(&bpe, &worker, buf, n, &b, 2);
        bpe_encode_piece(&bpe, &worker, buf, n, &c, 0);
        if (a.len != b.len || memcmp(a.data, b.data, a.len * 4) || a.len != c.len || memcmp(a.data, c.data, a.len * 4)) bad++;
        tokenbuf_free(&a); tokenbuf_free(&b); tokenbuf_free(&c);
    }
    check(bad == 0, "array and heap merges disagree on %d of 3000 random pieces", bad);
    printf("merge algorithms agree on 3000 random pieces\n");
}

// decode(encode(x)) == x on random bytes, invalid UTF-8 included
static void test_round_trip(void) {
    static unsigned char buf[20000];
    int bad = 0, bad_range = 0;
    for (int t = 0; t < 2000; t++) {
        size_t n = random_text(buf, t < 1900 ? 300 : 20000);
        TokenBuf ids = encode(buf, n);
        for (size_t i = 0; i < ids.len; i++) bad_range += ids.data[i] >= bpe.n_ranks;
        size_t m;
        unsigned char *back = decode_ids(ids.data, ids.len, &m);
        if (!back || m != n || memcmp(back, buf, n)) bad++;
        free(back);
        tokenbuf_free(&ids);
    }
    check(bad == 0, "decode(encode(x)) != x for %d of 2000 random byte strings", bad);
    check(bad_range == 0, "%d ids outside 0..50255 (encode_ordinary never gives EOT)", bad_range);
    // every single byte value alone, and all 256 in a row
    for (int b = 0; b < 256; b++) buf[b] = (unsigned char)b;
    TokenBuf ids = encode(buf, 256);
    size_t m;
    unsigned char *back = decode_ids(ids.data, ids.len, &m);
    check(back && m == 256 && memcmp(back, buf, 256) == 0, "bytes 0..255 do not round trip");
    free(back);
    tokenbuf_free(&ids);
    printf("round trip: 2001 random byte strings\n");
}

// invalid UTF-8: each run of invalid bytes is a piece of its own, and the valid text around it encodes as it would alone
static void test_invalid_utf8(void) {
    const unsigned char s[] = "hello\xff\xfeworld caf\xe9 ok";
    size_t n = sizeof s - 1;
    TokenBuf all = encode(s, n);
    TokenBuf parts = {0};
    bpe_encode(&bpe, &worker, (const unsigned char *)"hello", 5, &parts);
    bpe_encode(&bpe, &worker, (const unsigned char *)"\xff\xfe", 2, &parts);
    bpe_encode(&bpe, &worker, (const unsigned char *)"world caf", 9, &parts);
    bpe_encode(&bpe, &worker, (const unsigned char *)"\xe9", 1, &parts);
    bpe_encode(&bpe, &worker, (const unsigned char *)" ok", 3, &parts);
    check(all.len == parts.len && memcmp(all.data, parts.data, all.len * 4) == 0, "invalid UTF-8 is not split off as documented");
    tokenbuf_free(&all);
    tokenbuf_free(&parts);
}

// ----------------------------------------------------------------------------
// the tokenize program

// a shard's header and tokens; returns the token count or -1 (with a failed check) if malformed
static long read_shard(const char *path, TokenBuf *out) {
    size_t len;
    unsigned char *b = slurp(path, &len);
    if (!check(b != NULL, "shard %s missing", path)) return -1;
    int32_t h[256];
    if (!check(len >= 1024, "shard %s shorter than its header", path)) { free(b); return -1; }
    memcpy(h, b, sizeof h);
    check(h[0] == 20240520, "shard %s magic %d, expected 20240520", path, h[0]);
    check(h[1] == 1, "shard %s version %d, expected 1", path, h[1]);
    int zeros = 1;
    for (int i = 3; i < 256; i++) zeros &= h[i] == 0;
    check(zeros, "shard %s header words 3..255 are not 0", path);
    check(len == 1024 + 2 * (size_t)h[2], "shard %s: header says %d tokens, file has %zu bytes", path, h[2], len);
    for (size_t i = 0; i < (len - 1024) / 2; i++) {
        uint16_t t;
        memcpy(&t, b + 1024 + 2 * i, 2);
        tokenbuf_push(out, t);
    }
    free(b);
    return h[2];
}

// reads all shards of a split in order, checking each is full but the last; returns the shard count
static int read_split(const char *dir, const char *split, size_t shard_tokens, TokenBuf *out) {
    int n = 0;
    long last = -1;
    for (;; n++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/data_%s_%06d.bin", dir, split, n);
        if (access(path, F_OK) != 0) break;
        if (last >= 0) check((size_t)last == shard_tokens, "%s shard %d has %ld tokens but is not the last (shard size %zu)", split, n - 1, last, shard_tokens);
        last = read_shard(path, out);
        check(last > 0 && (size_t)last <= shard_tokens, "%s shard %d has %ld tokens, more than %zu or none", split, n, last, shard_tokens);
    }
    return n;
}

// the expected streams: EOT + tokens of each document, routed by the val rule
static void expected_streams(const char **docs, size_t n, double f, TokenBuf *train, TokenBuf *val) {
    for (size_t i = 0; i < n; i++) {
        int is_val = floor((double)(i + 1) * f) > floor((double)i * f);
        TokenBuf *t = is_val ? val : train;
        tokenbuf_push(t, GPT2_EOT);
        bpe_encode(&bpe, &worker, (const unsigned char *)docs[i], strlen(docs[i]), t);
    }
}

// true if two id buffers are equal
static int same_tokens(const TokenBuf *a, const TokenBuf *b) {
    return a->len == b->len && memcmp(a->data, b->data, a->len * sizeof(uint32_t)) == 0;
}

// true if two files have the same bytes
static int same_file(const char *a, const char *b) {
    size_t la, lb;
    unsigned char *x = slurp(a, &la), *y = slurp(b, &lb);
    int same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

// a directory of documents -> shards; checks layout, order, split, threads
static void test_shards(void) {
    char corpus[512], out1[512], out2[512], cmd[4096], path[1024];
    snprintf(corpus, sizeof corpus, "%s/corpus", tmpdir);
    snprintf(out1, sizeof out1, "%s/out1", tmpdir);
    snprintf(out2, sizeof out2, "%s/out2", tmpdir);
    mkdir(corpus, 0755);
    snprintf(path, sizeof path, "%s/sub", corpus);
    mkdir(path, 0755);
    // 23 documents: 20 at the top, 3 in sub/ (sorted after "doc_*" since 's' > 'd'); one ignored .md
    const char *docs[23];
    char texts[23][200];
    for (int i = 0; i < 23; i++) {
        snprintf(texts[i], sizeof texts[i], "Document %d: Call me Ishmael. It's %d o'clock,  \tcaf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd!\n", i, 1000 + 37 * i);
        docs[i] = texts[i];
        if (i < 20) snprintf(path, sizeof path, "%s/doc_%02d.txt", corpus, i);
        else snprintf(path, sizeof path, "%s/sub/s%d.txt", corpus, i);
        put_file(path, texts[i], strlen(texts[i]));
    }
    snprintf(path, sizeof path, "%s/notes.md", corpus);
    put_file(path, "ignored", 7);

    size_t shard_tokens = 50;
    snprintf(cmd, sizeof cmd, "%s -q -o %s --pattern '*.txt' --shard-tokens %zu --val-fraction 0.2 --threads 2 %s", TOKENIZE_BIN, out1, shard_tokens, corpus);
    char *err;
    int rc = run(cmd, &err);
    check(rc == 0, "tokenize on a directory failed (%d): %s", rc, err);
    free(err);
    TokenBuf train = {0}, val = {0}, want_train = {0}, want_val = {0};
    int n_train = read_split(out1, "train", shard_tokens, &train);
    int n_val = read_split(out1, "val", shard_tokens, &val);
    expected_streams(docs, 23, 0.2, &want_train, &want_val);
    check(n_train == (int)((want_train.len + shard_tokens - 1) / shard_tokens), "train has %d shards for %zu tokens", n_train, want_train.len);
    check(n_val >= 1, "no val shard");
    check(same_tokens(&train, &want_train), "train stream (%zu tokens) differs from EOT+document tokens in file order (%zu)", train.len, want_train.len);
    check(same_tokens(&val, &want_val), "val stream (%zu tokens) differs from the expected documents (%zu)", val.len, want_val.len);
    check(train.len > 0 && train.data[0] == GPT2_EOT && val.len > 0 && val.data[0] == GPT2_EOT, "streams do not start with EOT");
    size_t eots = 0;
    for (size_t i = 0; i < train.len; i++) eots += train.data[i] == GPT2_EOT;
    for (size_t i = 0; i < val.len; i++) eots += val.data[i] == GPT2_EOT;
    check(eots == 23, "%zu EOT tokens for 23 documents (the .md file must be ignored)", eots);

    // one thread gives the same bytes
    snprintf(cmd, sizeof cmd, "%s -q -o %s --pattern '*.txt' --shard-tokens %zu --val-fraction 0.2 --threads 1 %s", TOKENIZE_BIN, out2, shard_tokens, corpus);
    rc = run(cmd, &err);
    check(rc == 0, "tokenize --threads 1 failed: %s", err);
    free(err);
    int same = 1;
    for (int i = 0; i < n_train; i++) {
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/data_train_%06d.bin", out1, i);
        snprintf(b, sizeof b, "%s/data_train_%06d.bin", out2, i);
        same &= same_file(a, b);
    }
    check(same, "--threads 1 and --threads 2 give different shards");

    // --max-docs 3: exactly the first three documents (all train at F = 0.2)
    snprintf(cmd, sizeof cmd, "%s -q -o %s --pattern '*.txt' --max-docs 3 --val-fraction 0.2 %s", TOKENIZE_BIN, out2, corpus);
    rc = run(cmd, &err);
    check(rc == 0, "tokenize --max-docs failed: %s", err);
    free(err);
    TokenBuf capped = {0}, want_capped = {0}, want_capped_val = {0};
    read_split(out2, "train", 100000000, &capped);
    expected_streams(docs, 3, 0.2, &want_capped, &want_capped_val);
    check(same_tokens(&capped, &want_capped), "--max-docs 3 did not give the first three documents");
    snprintf(path, sizeof path, "%s/data_train_000001.bin", out2);
    check(access(path, F_OK) != 0, "stale shard %s from the earlier run was not removed", path);

    // --shuffle SEED: the same documents in another order, the same order for the same seed
    char out3[512], out4[512];
    snprintf(out3, sizeof out3, "%s/out3", tmpdir);
    snprintf(out4, sizeof out4, "%s/out4", tmpdir);
    const char *outs[2] = {out3, out4};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%s -q -o %s --pattern '*.txt' --shuffle 7 --val-fraction 0.2 --threads %d %s",
                 TOKENIZE_BIN, outs[k], k + 1, corpus);
        rc = run(cmd, &err);
        check(rc == 0, "tokenize --shuffle failed: %s", err);
        free(err);
    }
    TokenBuf sh_train = {0}, sh_val = {0};
    read_split(out3, "train", 100000000, &sh_train);
    read_split(out3, "val", 100000000, &sh_val);
    size_t sh_eots = 0;
    for (size_t i = 0; i < sh_train.len; i++) sh_eots += sh_train.data[i] == GPT2_EOT;
    for (size_t i = 0; i < sh_val.len; i++) sh_eots += sh_val.data[i] == GPT2_EOT;
    char a3[1024], a4[1024];
    snprintf(a3, sizeof a3, "%s/data_train_000000.bin", out3);
    snprintf(a4, sizeof a4, "%s/data_train_000000.bin", out4);
    check(sh_eots == 23 && sh_train.len + sh_val.len == want_train.len + want_val.len,
          "--shuffle lost or added documents (%zu EOTs, %zu tokens)", sh_eots, sh_train.len + sh_val.len);
    check(!same_tokens(&sh_train, &want_train), "--shuffle 7 left the documents in path order");
    check(same_file(a3, a4), "--shuffle 7 gave different shards on two runs");
    tokenbuf_free(&sh_train); tokenbuf_free(&sh_val);

    tokenbuf_free(&train); tokenbuf_free(&val); tokenbuf_free(&want_train); tokenbuf_free(&want_val);
    tokenbuf_free(&capped); tokenbuf_free(&want_capped); tokenbuf_free(&want_capped_val);
    printf("shards: %d train + %d val shards of %zu tokens, order, split, EOTs, threads, --max-docs, --shuffle\n", n_train, n_val, shard_tokens);
}

// --sections: blank-line separated documents, with --section-blank-lines
static void test_sections(void) {
    char file[512], out[512], cmd[4096];
    snprintf(file, sizeof file, "%s/sections.txt", tmpdir);
    snprintf(out, sizeof out, "%s/out_sections", tmpdir);
    const char *text = "\n\nFirst para line one.\nline two.\n\nSecond para.\n \t\r\n\n\nThird, after three blanks.\nend";
    put_file(file, text, strlen(text));
    const char *one[] = {"First para line one.\nline two.\n", "Second para.\n", "Third, after three blanks.\nend"};
    const char *three[] = {"First para line one.\nline two.\n\nSecond para.\n", "Third, after three blanks.\nend"};
    for (int mode = 0; mode < 2; mode++) {
        snprintf(cmd, sizeof cmd, "%s -q -o %s --sections --section-blank-lines %d --val-fraction 0 %s", TOKENIZE_BIN, out, mode ? 3 : 1, file);
        char *err;
        int rc = run(cmd, &err);
        check(rc == 0, "tokenize --sections failed: %s", err);
        free(err);
        TokenBuf got = {0}, want = {0}, none = {0};
        read_split(out, "train", 100000000, &got);
        expected_streams(mode ? three : one, mode ? 2 : 3, 0.0, &want, &none);
        check(same_tokens(&got, &want), "--sections --section-blank-lines %d split the file wrongly", mode ? 3 : 1);
        char vpath[1024];
        snprintf(vpath, sizeof vpath, "%s/data_val_000000.bin", out);
        check(access(vpath, F_OK) != 0, "--val-fraction 0 still wrote a val shard");
        tokenbuf_free(&got); tokenbuf_free(&want); tokenbuf_free(&none);
    }
    printf("sections: blank-line documents, 1 and 3 blank lines\n");
}

// the tokenizer file, read back through common/tokenizer.h
static void test_tokenizer_file(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/out1/tokenizer.bin", tmpdir);
    size_t len;
    unsigned char *raw = slurp(path, &len);
    if (!check(raw != NULL, "tokenizer file %s was not written", path)) return;
    check(len >= 4 && memcmp(raw, "MHTK", 4) == 0, "tokenizer file does not start with the bytes MHTK");
    free(raw);
    Tokenizer tok;
    tokenizer_init(&tok, path);
    check(tokenizer_vocab_size(&tok) == 50257, "vocab size %u, expected 50257", tokenizer_vocab_size(&tok));
    check(tokenizer_eot(&tok) == 50256, "EOT %u, expected 50256", tokenizer_eot(&tok));
    size_t n;
    const unsigned char *b = tokenizer_decode(&tok, 50256, &n);
    check(b && n == 13 && memcmp(b, "<|endoftext|>", 13) == 0, "EOT does not decode to <|endoftext|>");
    check(tokenizer_decode(&tok, 50257, &n) == NULL && n == 0, "id 50257 should decode to NULL");
    int bad = 0;
    for (uint32_t id = 0; id < 50257; id++) {
        size_t k;
        const unsigned char *want = bpe_token_bytes(&bpe, id, &k);
        const unsigned char *got = tokenizer_decode(&tok, id, &n);
        bad += !got || n != k || memcmp(got, want, k) != 0;
    }
    check(bad == 0, "%d ids decode differently from the rank file", bad);
    // Moby Dick's opening round-trips through the trainers' decoder
    const char *s = "Call me Ishmael. Some years ago\xe2\x80\x94never mind how long precisely";
    TokenBuf ids = encode((const unsigned char *)s, strlen(s));
    char back[256];
    size_t m = 0;
    for (size_t i = 0; i < ids.len; i++) {
        b = tokenizer_decode(&tok, ids.data[i], &n);
        memcpy(back + m, b, n);
        m += n;
    }
    check(m == strlen(s) && memcmp(back, s, m) == 0, "tokenizer.h decode of encoded text differs");
    tokenbuf_free(&ids);
    tokenizer_free(&tok);
    printf("tokenizer file: header, 50257 entries, decode through common/tokenizer.h\n");
}

// tokenizer_init on a bad file must exit 1 with one line naming the file
static void expect_tokenizer_init_error(const char *path, const char *what) {
    char errpath[512];
    snprintf(errpath, sizeof errpath, "%s/tok_err.txt", tmpdir);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(errpath, "w", stderr)) _exit(99);
        Tokenizer tok;
        tokenizer_init(&tok, path);
        _exit(0); // loaded: the test fails
    }
    int st;
    waitpid(pid, &st, 0);
    size_t len;
    char *err = (char *)slurp(errpath, &len);
    if (!err) err = strdup("");
    check(WIFEXITED(st) && WEXITSTATUS(st) == 1, "tokenizer_init on %s: expected exit 1", what);
    check(count_lines(err) == 1 && strstr(err, path) && strstr(err, "fix:"), "tokenizer_init on %s: expected one line naming the file and a fix, got: %s", what, err);
    free(err);
}

// bad tokenizer files: missing, bad magic, wrong version, truncated body and header
static void test_tokenizer_file_errors(void) {
    char good[1024], bad[1024];
    snprintf(good, sizeof good, "%s/out1/tokenizer.bin", tmpdir);
    snprintf(bad, sizeof bad, "%s/bad_tokenizer.bin", tmpdir);
    size_t len;
    unsigned char *raw = slurp(good, &len);
    if (!check(raw != NULL, "no tokenizer file to corrupt")) return;
    expect_tokenizer_init_error("/nonexistent/tokenizer.bin", "a missing file");
    unsigned char *copy = (unsigned char *)malloc(len);
    memcpy(copy, raw, len); copy[0] = 'X';
    put_file(bad, copy, len);
    expect_tokenizer_init_error(bad, "a bad magic");
    memcpy(copy, raw, len); copy[4] = 2;
    put_file(bad, copy, len);
    expect_tokenizer_init_error(bad, "a wrong version");
    put_file(bad, raw, len - 100);
    expect_tokenizer_init_error(bad, "a truncated file");
    put_file(bad, raw, 500);
    expect_tokenizer_init_error(bad, "a truncated header");
    free(copy);
    free(raw);
    printf("tokenizer file errors: missing, magic, version, truncated\n");
}

// ----------------------------------------------------------------------------
// bad input to the program

// runs cmd; it must fail with one stderr line that contains needle (the file)
static void expect_error(const char *cmd, const char *needle, const char *what) {
    char *err;
    int rc = run(cmd, &err);
    check(rc != 0, "%s: expected a non-zero exit, got 0", what);
    check(count_lines(err) == 1 && strstr(err, "error:") && strstr(err, needle), "%s: expected one error line naming %s, got: %s", what, needle, err);
    free(err);
}

// writes a corrupted copy of the rank file; kind picks the corruption
static void corrupt_rank_file(const char *path, int kind) {
    size_t len;
    unsigned char *raw = slurp(RANK_PATH, &len);
    if (kind == 0) { // bad base64 on line 1000
        char *p = (char *)raw;
        for (int l = 0; l < 999; l++) p = strchr(p, '\n') + 1;
        p[0] = '*';
        put_file(path, raw, len);
    } else if (kind == 1) { // truncated: the first 1000 lines
        char *p = (char *)raw;
        for (int l = 0; l < 1000; l++) p = strchr(p, '\n') + 1;
        put_file(path, raw, (size_t)(p - (char *)raw));
    } else if (kind == 2) { // line 2 repeats the rank of line 1
        char *p = strchr((char *)raw, '\n') + 1;
        char *sp = strchr(p, ' ');
        sp[1] = '0';
        put_file(path, raw, len);
    } else { // random bytes
        for (size_t i = 0; i < 4096; i++) raw[i] = (unsigned char)rnd();
        put_file(path, raw, 4096);
    }
    free(raw);
}

// bad input to data_prep/tokenize: each gives one error line naming the file and exit != 0
static void test_bad_input(void) {
    char cmd[4096], input[512], out[512], bad_rank[512], file_as_dir[512];
    snprintf(input, sizeof input, "%s/corpus/doc_00.txt", tmpdir);
    snprintf(out, sizeof out, "%s/out_err", tmpdir);
    snprintf(bad_rank, sizeof bad_rank, "%s/bad.tiktoken", tmpdir);

    snprintf(cmd, sizeof cmd, "%s -o %s %s/no_such_file.txt", TOKENIZE_BIN, out, tmpdir);
    expect_error(cmd, "no_such_file.txt", "missing input file");
    snprintf(cmd, sizeof cmd, "%s -o %s --pattern '*.zzz' %s/corpus", TOKENIZE_BIN, out, tmpdir);
    expect_error(cmd, "corpus", "directory without matching files");
    snprintf(cmd, sizeof cmd, "%s -o %s --vocab %s/missing.tiktoken %s", TOKENIZE_BIN, out, tmpdir, input);
    expect_error(cmd, "missing.tiktoken", "missing rank file");
    const char *kinds[] = {"rank file with bad base64", "truncated rank file", "rank file with a repeated rank", "rank file of random bytes"};
    for (int k = 0; k < 4; k++) {
        corrupt_rank_file(bad_rank, k);
        snprintf(cmd, sizeof cmd, "%s -o %s --vocab %s %s", TOKENIZE_BIN, out, bad_rank, input);
        expect_error(cmd, "bad.tiktoken", kinds[k]);
    }
    // unwritable outputs (a path below a regular file fails even for root)
    snprintf(file_as_dir, sizeof file_as_dir, "%s/corpus/doc_01.txt/out", tmpdir);
    snprintf(cmd, sizeof cmd, "%s -o %s %s", TOKENIZE_BIN, file_as_dir, input);
    expect_error(cmd, "doc_01.txt/out", "output directory below a file");
    snprintf(cmd, sizeof cmd, "%s -o %s --tokenizer-out %s/no_dir/tok.bin %s", TOKENIZE_BIN, out, tmpdir, input);
    expect_error(cmd, "no_dir/tok.bin", "tokenizer file in a missing directory");
    snprintf(cmd, sizeof cmd, "%s -o %s --shard-tokens many %s", TOKENIZE_BIN, out, input);
    expect_error(cmd, "many", "bad flag value");
    snprintf(cmd, sizeof cmd, "%s -o %s --frobnicate %s", TOKENIZE_BIN, out, input);
    expect_error(cmd, "--frobnicate", "unknown flag");

    // a run that fails halfway leaves earlier outputs as they were and no temporaries:
    // /proc/self/mem is a regular file whose read fails, after the outputs are opened
    mkdir(out, 0755);
    char old[1024];
    snprintf(old, sizeof old, "%s/data_train_000000.bin", out);
    put_file(old, "OLD", 3);
    snprintf(old, sizeof old, "%s/tokenizer.bin", out);
    put_file(old, "OLD", 3);
    snprintf(cmd, sizeof cmd, "%s -q -o %s %s /proc/self/mem", TOKENIZE_BIN, out, input);
    expect_error(cmd, "/proc/self/mem", "input that cannot be read");
    size_t len;
    unsigned char *b = slurp(old, &len);
    check(b && len == 3 && memcmp(b, "OLD", 3) == 0, "a failed run overwrote %s", old);
    free(b);
    snprintf(old, sizeof old, "%s/data_train_000000.bin", out);
    b = slurp(old, &len);
    check(b && len == 3 && memcmp(b, "OLD", 3) == 0, "a failed run overwrote %s", old);
    free(b);
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp", out);
    char *err;
    FILE *p = popen(cmd, "r");
    int n_tmp = -1;
    if (p) { if (fscanf(p, "%d", &n_tmp) != 1) n_tmp = -1; pclose(p); }
    check(n_tmp == 0, "a failed run left %d temporary files in %s", n_tmp, out);
    (void)err;
    printf("bad input: missing input/rank file, corrupt rank files, unwritable outputs, bad flags, failed run keeps old outputs\n");
}

// ----------------------------------------------------------------------------

// runs every test; exit status 1 if any check failed
int main(void) {
    // the fetched files every test needs: missing is a failure with the fix
    if (access(RANK_PATH, R_OK) != 0 || access(TOKENIZE_BIN, X_OK) != 0) {
        if (access(RANK_PATH, R_OK) != 0) printf("FAIL: %s missing; fix: run `data_prep/fetch.sh vocab` from the repository root\n", RANK_PATH);
        if (access(TOKENIZE_BIN, X_OK) != 0) printf("FAIL: %s missing; fix: run `make data_prep/tokenize` from the repository root\n", TOKENIZE_BIN);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mhar_test_tokenize_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    bpe_load(&bpe, RANK_PATH);
    bpe_worker_init(&worker);

    test_golden_tricky();
    test_golden_moby();
    test_merge_algorithms();
    test_round_trip();
    test_invalid_utf8();
    test_shards();
    test_sections();
    test_tokenizer_file();
    test_tokenizer_file_errors();
    test_bad_input();

    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    bpe_worker_free(&worker);
    bpe_free(&bpe);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
