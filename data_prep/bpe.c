// GPT-2 byte-level BPE encoder: see bpe.h for what it does and how.
#include "bpe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// small helpers

// malloc that exits with a message when memory runs out
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "error: out of memory allocating %zu bytes\n", n); exit(1); }
    return p;
}

// calloc that exits with a message when memory runs out
static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) { fprintf(stderr, "error: out of memory allocating %zu bytes\n", n * size); exit(1); }
    return p;
}

// realloc that exits with a message when memory runs out
static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) { fprintf(stderr, "error: out of memory allocating %zu bytes\n", n); exit(1); }
    return p;
}

// appends one id, growing the buffer geometrically
void tokenbuf_push(TokenBuf *b, uint32_t id) {
    if (b->len == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 1024;
        b->data = (uint32_t *)xrealloc(b->data, b->cap * sizeof(uint32_t));
    }
    b->data[b->len++] = id;
}

// releases the buffer and empties it
void tokenbuf_free(TokenBuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

// hash of a byte string (only used inside this process, so the word order of
// the machine does not matter)
static inline uint64_t hash_bytes(const unsigned char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return h;
}

// hash of a (left, right) id pair key
static inline uint64_t hash_key(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ull;
    return k ^ (k >> 31);
}

// smallest power of two >= n
static size_t pow2_at_least(size_t n) {
    size_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

// ----------------------------------------------------------------------------
// lookups

// id of a byte string, or UINT32_MAX if it is not a token (EOT is never found)
uint32_t bpe_lookup(const BPE *bpe, const unsigned char *s, size_t n) {
    size_t i = hash_bytes(s, n) & bpe->str_mask;
    for (;;) {
        uint32_t id = bpe->str_slots[i];
        if (id == UINT32_MAX) return UINT32_MAX;
        size_t len = bpe->offset[id + 1] - bpe->offset[id];
        if (len == n && memcmp(bpe->bytes + bpe->offset[id], s, n) == 0) return id;
        i = (i + 1) & bpe->str_mask;
    }
}

// id of the token whose bytes are those of left followed by right, or UINT32_MAX
static inline uint32_t pair_lookup(const BPE *bpe, uint32_t left, uint32_t right) {
    uint64_t key = (((uint64_t)left << 32) | right) + 1;
    size_t i = hash_key(key) & bpe->pair_mask;
    for (;;) {
        uint64_t k = bpe->pair_keys[i];
        if (k == key) return bpe->pair_vals[i];
        if (k == 0) return UINT32_MAX;
        i = (i + 1) & bpe->pair_mask;
    }
}

// bytes of token id, or NULL if id is out of range
const unsigned char *bpe_token_bytes(const BPE *bpe, uint32_t id, size_t *len) {
    if (id >= bpe->vocab_size) { *len = 0; return NULL; }
    *len = bpe->offset[id + 1] - bpe->offset[id];
    return bpe->bytes + bpe->offset[id];
}

// ----------------------------------------------------------------------------
// loading the rank file

// value of one base64 character, or -1
static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// decodes standard base64 (with '=' padding) into out; returns the byte count or -1 if malformed
static long b64_decode(const char *s, size_t n, unsigned char *out) {
    if (n == 0 || n % 4 != 0) return -1;
    long len = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) { v[k] = 0; pad++; continue; }
            if (pad) return -1; // data after padding
            v[k] = b64_value((unsigned char)s[i + k]);
            if (v[k] < 0) return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[len++] = (unsigned char)(w >> 16);
        if (pad < 2) out[len++] = (unsigned char)(w >> 8);
        if (pad < 1) out[len++] = (unsigned char)w;
    }
    return len;
}

// prints one error line about the rank file and exits
static void rank_error(const char *path, size_t line, const char *what) {
    if (line) fprintf(stderr, "error: rank file %s, line %zu: %s; fix: fetch a good copy with `data_prep/fetch.sh vocab` (sha256 306cd27f...dd930)\n", path, line, what);
    else fprintf(stderr, "error: rank file %s: %s; fix: fetch a good copy with `data_prep/fetch.sh vocab` (sha256 306cd27f...dd930)\n", path, what);
    exit(1);
}

// inserts id into the string table (the table must have room)
static void str_insert(BPE *bpe, uint32_t id) {
    const unsigned char *s = bpe->bytes + bpe->offset[id];
    size_t n = bpe->offset[id + 1] - bpe->offset[id];
    size_t i = hash_bytes(s, n) & bpe->str_mask;
    while (bpe->str_slots[i] != UINT32_MAX) i = (i + 1) & bpe->str_mask;
    bpe->str_slots[i] = id;
}

// inserts (left, right) -> id into the pair table; keeps the first value given
static void pair_insert(BPE *bpe, uint32_t left, uint32_t right, uint32_t id) {
    uint64_t key = (((uint64_t)left << 32) | right) + 1;
    size_t i = hash_key(key) & bpe->pair_mask;
    while (bpe->pair_keys[i] != 0) {
        if (bpe->pair_keys[i] == key) return;
        i = (i + 1) & bpe->pair_mask;
    }
    bpe->pair_keys[i] = key;
    bpe->pair_vals[i] = id;
}

// reads the rank file, lays the tokens out by id, builds the string and pair
// tables and compiles the regex; exits with one line on any problem
void bpe_load(BPE *bpe, const char *rank_path) {
    memset(bpe, 0, sizeof(*bpe));
    FILE *f = fopen(rank_path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open rank file %s: %s; fix: run `data_prep/fetch.sh vocab` (writes data/vocab/r50k_base.tiktoken) or pass --vocab PATH\n",
                rank_path, strerror(errno));
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long fsize = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (fsize <= 0) rank_error(rank_path, 0, "file is empty");
    char *text = (char *)xmalloc((size_t)fsize + 1);
    if (fread(text, 1, (size_t)fsize, f) != (size_t)fsize) rank_error(rank_path, 0, "read failed");
    fclose(f);
    text[fsize] = '\0';

    // pass 1: decode every line into (rank, bytes); ranks must be 0..n-1, each once
    uint32_t n = GPT2_N_RANKS;
    size_t *tok_off = (size_t *)xmalloc((n + 1) * sizeof(size_t));
    uint32_t *tok_len = (uint32_t *)xcalloc(n, sizeof(uint32_t));
    char *seen = (char *)xcalloc(n, 1);
    unsigned char *raw = (unsigned char *)xmalloc((size_t)fsize); // decoded bytes, in file order
    size_t raw_len = 0, line_no = 0, count = 0;
    char *p = text, *end = text + fsize;
    while (p < end) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        line_no++;
        char *q = eol;
        if (q > p && q[-1] == '\r') q--;
        if (q == p) { p = eol + 1; continue; } // tolerate empty lines (e.g. trailing)
        char *sp = memchr(p, ' ', (size_t)(q - p));
        if (!sp) rank_error(rank_path, line_no, "expected \"<base64> <rank>\"");
        char *r = sp + 1;
        if (r == q) rank_error(rank_path, line_no, "missing rank");
        unsigned long rank = 0;
        for (char *c = r; c < q; c++) {
            if (*c < '0' || *c > '9') rank_error(rank_path, line_no, "rank is not a number");
            rank = rank * 10 + (unsigned long)(*c - '0');
            if (rank >= n) break;
        }
        if (rank >= n) {
            char msg[160];
            snprintf(msg, sizeof msg, "rank %.*s is out of range (GPT-2 has ranks 0..%u)", (int)(q - r > 20 ? 20 : q - r), r, n - 1);
            rank_error(rank_path, line_no, msg);
        }
        if (seen[rank]) rank_error(rank_path, line_no, "rank appears twice");
        long len = b64_decode(p, (size_t)(sp - p), raw + raw_len);
        if (len <= 0) rank_error(rank_path, line_no, "token is not valid base64");
        seen[rank] = 1;
        tok_off[rank] = raw_len;
        tok_len[rank] = (uint32_t)len;
        raw_len += (size_t)len;
        count++;
        p = eol + 1;
    }
    free(text);
    if (count != n) {
        char msg[160];
        snprintf(msg, sizeof msg, "has %zu ranks, GPT-2's r50k_base has %u (truncated or wrong file)", count, n);
        rank_error(rank_path, 0, msg);
    }

    // lay the tokens out by id, then append <|endoftext|>
    bpe->n_ranks = n;
    bpe->eot = n;
    bpe->vocab_size = n + 1;
    size_t eot_len = strlen(GPT2_EOT_TEXT);
    bpe->bytes = (unsigned char *)xmalloc(raw_len + eot_len);
    bpe->offset = (size_t *)xmalloc((bpe->vocab_size + 1) * sizeof(size_t));
    size_t off = 0;
    for (uint32_t id = 0; id < n; id++) {
        bpe->offset[id] = off;
        memcpy(bpe->bytes + off, raw + tok_off[id], tok_len[id]);
        off += tok_len[id];
    }
    bpe->offset[n] = off;
    memcpy(bpe->bytes + off, GPT2_EOT_TEXT, eot_len);
    bpe->offset[n + 1] = off + eot_len;
    free(raw);
    free(tok_off);
    free(tok_len);
    free(seen);

    // string table (EOT is left out: encode_ordinary never produces it)
    size_t str_slots = pow2_at_least(4 * (size_t)n);
    bpe->str_mask = str_slots - 1;
    bpe->str_slots = (uint32_t *)xmalloc(str_slots * sizeof(uint32_t));
    memset(bpe->str_slots, 0xff, str_slots * sizeof(uint32_t));
    for (uint32_t id = 0; id < n; id++) {
        if (bpe_lookup(bpe, bpe->bytes + bpe->offset[id], bpe->offset[id + 1] - bpe->offset[id]) != UINT32_MAX)
            rank_error(rank_path, 0, "the same token bytes appear under two ranks");
        str_insert(bpe, id);
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        bpe->byte_id[b] = bpe_lookup(bpe, &c, 1);
        if (bpe->byte_id[b] == UINT32_MAX) {
            char msg[80];
            snprintf(msg, sizeof msg, "byte 0x%02x has no token", b);
            rank_error(rank_path, 0, msg);
        }
    }

    // pair table: every token that splits into two tokens, at every split point.
    // During merging every part is a token, so looking up the concatenation of
    // two parts' bytes is the same as looking up their id pair here.
    size_t n_pairs = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            size_t slots = pow2_at_least(2 * n_pairs + 16);
            bpe->pair_mask = slots - 1;
            bpe->pair_keys = (uint64_t *)xcalloc(slots, sizeof(uint64_t));
            bpe->pair_vals = (uint32_t *)xmalloc(slots * sizeof(uint32_t));
        }
        for (uint32_t id = 0; id < n; id++) {
            const unsigned char *s = bpe->bytes + bpe->offset[id];
            size_t len = bpe->offset[id + 1] - bpe->offset[id];
            for (size_t k = 1; k < len; k++) {
                uint32_t l = bpe_lookup(bpe, s, k);
                if (l == UINT32_MAX) continue;
                uint32_t r = bpe_lookup(bpe, s + k, len - k);
                if (r == UINT32_MAX) continue;
                if (pass == 0) n_pairs++;
                else pair_insert(bpe, l, r, id);
            }
        }
    }

    // the regex
    int err;
    PCRE2_SIZE erroff;
    bpe->re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &erroff, NULL);
    if (!bpe->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        fprintf(stderr, "error: PCRE2 cannot compile GPT-2's pattern: %s; fix: install PCRE2 >= 10.34 with Unicode support (apt-get install libpcre2-dev)\n", (char *)msg);
        exit(1);
    }
    if (pcre2_jit_compile(bpe->re, PCRE2_JIT_COMPLETE) != 0)
        fprintf(stderr, "warning: PCRE2 JIT is not available; tokenizing will be slower\n");
}

// releases everything bpe_load allocated
void bpe_free(BPE *bpe) {
    free(bpe->bytes);
    free(bpe->offset);
    free(bpe->str_slots);
    free(bpe->pair_keys);
    free(bpe->pair_vals);
    pcre2_code_free(bpe->re);
    memset(bpe, 0, sizeof(*bpe));
}

// ----------------------------------------------------------------------------
// per-thread scratch

// per-thread scratch: match data and the piece cache; merge arrays grow on demand
void bpe_worker_init(BPEWorker *w) {
    memset(w, 0, sizeof(*w));
    w->md = pcre2_match_data_create(1, NULL);
    w->cache_keys = (unsigned char *)xmalloc((size_t)BPE_CACHE_SLOTS * BPE_CACHE_KEY);
    w->cache_klen = (uint8_t *)xcalloc(BPE_CACHE_SLOTS, 1);
    w->cache_nids = (uint8_t *)xcalloc(BPE_CACHE_SLOTS, 1);
    w->cache_ids = (uint32_t *)xmalloc((size_t)BPE_CACHE_SLOTS * BPE_CACHE_IDS * sizeof(uint32_t));
    w->use_cache = 1;
}

// releases a worker's scratch
void bpe_worker_free(BPEWorker *w) {
    pcre2_match_data_free(w->md);
    free(w->ids); free(w->ranks); free(w->next); free(w->prev); free(w->heap);
    free(w->cache_keys); free(w->cache_klen); free(w->cache_nids); free(w->cache_ids);
    memset(w, 0, sizeof(*w));
}

// makes the scratch arrays hold at least n parts
static void worker_reserve(BPEWorker *w, size_t n) {
    if (n <= w->cap) return;
    size_t cap = pow2_at_least(n);
    w->ids = (uint32_t *)xrealloc(w->ids, cap * sizeof(uint32_t));
    w->ranks = (uint32_t *)xrealloc(w->ranks, cap * sizeof(uint32_t));
    w->next = (uint32_t *)xrealloc(w->next, (cap + 1) * sizeof(uint32_t));
    w->prev = (uint32_t *)xrealloc(w->prev, (cap + 1) * sizeof(uint32_t));
    w->heap = (uint64_t *)xrealloc(w->heap, 3 * cap * sizeof(uint64_t));
    w->cap = cap;
}

// ----------------------------------------------------------------------------
// merging one piece

// short pieces: parts in an array, the pair ranks beside them; each step scans
// for the lowest rank and closes the gap. O(n^2) but n is small. Returns part count.
static size_t merge_short(const BPE *bpe, BPEWorker *w, const unsigned char *p, size_t n) {
    uint32_t *ids = w->ids, *ranks = w->ranks;
    for (size_t i = 0; i < n; i++) ids[i] = bpe->byte_id[p[i]];
    for (size_t i = 0; i + 1 < n; i++) ranks[i] = pair_lookup(bpe, ids[i], ids[i + 1]);
    while (n > 1) {
        size_t best = 0;
        uint32_t best_rank = UINT32_MAX;
        for (size_t i = 0; i + 1 < n; i++)
            if (ranks[i] < best_rank) { best_rank = ranks[i]; best = i; }
        if (best_rank == UINT32_MAX) break;
        ids[best] = best_rank;
        // drop part best + 1 and the rank of the pair it started
        memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof(uint32_t));
        if (best + 3 <= n) memmove(ranks + best + 1, ranks + best + 2, (n - best - 3) * sizeof(uint32_t));
        n--;
        if (best > 0) ranks[best - 1] = pair_lookup(bpe, ids[best - 1], ids[best]);
        if (best + 1 < n) ranks[best] = pair_lookup(bpe, ids[best], ids[best + 1]);
    }
    return n;
}

// pushes a key onto the binary min-heap of h[0..*len)
static void heap_push(uint64_t *h, size_t *len, uint64_t key) {
    size_t i = (*len)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h[parent] <= key) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = key;
}

// removes and returns the smallest key of the heap
static uint64_t heap_pop(uint64_t *h, size_t *len) {
    uint64_t top = h[0], last = h[--(*len)];
    size_t i = 0, n = *len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (last <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = last;
    return top;
}

// long pieces: parts in a linked list indexed by their first byte, candidate
// merges in a min-heap keyed (rank, position) so ties go leftmost; stale heap
// entries are skipped when popped. O(n log n). Writes the parts to ids in
// order and returns their count.
static size_t merge_long(const BPE *bpe, BPEWorker *w, const unsigned char *p, size_t n) {
    uint32_t *ids = w->ids, *next = w->next, *prev = w->prev;
    uint64_t *heap = w->heap;
    size_t hlen = 0;
    // a heap entry rank << 32 | i stands for the pair (part i, the part after
    // it). Entries are never removed early: one that went stale (part i was
    // swallowed, or a neighbour changed) is recognised when popped, because the
    // pair now at i no longer concatenates to that rank.
    for (size_t i = 0; i < n; i++) {
        ids[i] = bpe->byte_id[p[i]];
        next[i] = (uint32_t)(i + 1);
        prev[i] = (uint32_t)(i - 1); // wraps for i == 0; never read for the first part
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = pair_lookup(bpe, ids[i], ids[i + 1]);
        if (r != UINT32_MAX) heap_push(heap, &hlen, (uint64_t)r << 32 | i);
    }
    while (hlen > 0) {
        uint64_t top = heap_pop(heap, &hlen);
        uint32_t i = (uint32_t)top, rank = (uint32_t)(top >> 32);
        // stale if part i was swallowed, is now the last part, or its pair changed
        if (ids[i] == UINT32_MAX || next[i] >= n) continue;
        uint32_t j = next[i];
        if (pair_lookup(bpe, ids[i], ids[j]) != rank) continue;
        uint32_t end = next[j];
        // merge j into i
        ids[i] = rank;
        ids[j] = UINT32_MAX;
        next[i] = end;
        if (end < n) prev[end] = i;
        // new pairs with the neighbours
        if (i > 0) {
            uint32_t h = prev[i];
            uint32_t r = pair_lookup(bpe, ids[h], ids[i]);
            if (r != UINT32_MAX) heap_push(heap, &hlen, (uint64_t)r << 32 | h);
        }
        if (end < n) {
            uint32_t r = pair_lookup(bpe, ids[i], ids[end]);
            if (r != UINT32_MAX) heap_push(heap, &hlen, (uint64_t)r << 32 | i);
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i = next[i]) ids[k++] = ids[i];
    return k;
}

// ids of one piece: a whole-token lookup first, then the cache, then merging
void bpe_encode_piece(const BPE *bpe, BPEWorker *w, const unsigned char *p, size_t n, TokenBuf *out, int force) {
    if (n == 0) return;
    if (n >= UINT32_MAX) { // the merge arrays index parts with uint32
        fprintf(stderr, "error: a single pre-token of %zu bytes (4 GiB or more); fix: split the input into smaller documents\n", n);
        exit(1);
    }
    if (force == 0) {
        // most pieces are whole tokens
        uint32_t id = n == 1 ? bpe->byte_id[p[0]] : bpe_lookup(bpe, p, n);
        if (id != UINT32_MAX) { tokenbuf_push(out, id); return; }
    }
    // a cache of recent short pieces that needed merging
    size_t slot = 0;
    int cacheable = force == 0 && w->use_cache && n <= BPE_CACHE_KEY;
    if (cacheable) {
        slot = hash_bytes(p, n) & (BPE_CACHE_SLOTS - 1);
        if (w->cache_klen[slot] == n && memcmp(w->cache_keys + slot * BPE_CACHE_KEY, p, n) == 0) {
            const uint32_t *c = w->cache_ids + slot * BPE_CACHE_IDS;
            for (size_t i = 0; i < w->cache_nids[slot]; i++) tokenbuf_push(out, c[i]);
            return;
        }
    }
    worker_reserve(w, n);
    int use_heap = force == 2 || (force == 0 && n >= BPE_HEAP_MIN);
    size_t k = use_heap ? merge_long(bpe, w, p, n) : merge_short(bpe, w, p, n);
    for (size_t i = 0; i < k; i++) tokenbuf_push(out, w->ids[i]);
    if (cacheable && k <= BPE_CACHE_IDS) {
        memcpy(w->cache_keys + slot * BPE_CACHE_KEY, p, n);
        w->cache_klen[slot] = (uint8_t)n;
        w->cache_nids[slot] = (uint8_t)k;
        memcpy(w->cache_ids + slot * BPE_CACHE_IDS, w->ids, k * sizeof(uint32_t));
    }
}

// ----------------------------------------------------------------------------
// encoding a text

// pre-tokenises text with the regex and encodes each piece, plus each run of
// invalid UTF-8 the regex steps over, in order
void bpe_encode(const BPE *bpe, BPEWorker *w, const unsigned char *text, size_t len, TokenBuf *out) {
    size_t pos = 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
    while (pos < len) {
        int rc = pcre2_jit_match(bpe->re, (PCRE2_SPTR)text, len, pos, 0, w->md, NULL);
        if (rc == PCRE2_ERROR_JIT_BADOPTION) // no JIT on this machine: the interpreter
            rc = pcre2_match(bpe->re, (PCRE2_SPTR)text, len, pos, 0, w->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) { // only invalid UTF-8 is left
            bpe_encode_piece(bpe, w, text + pos, len - pos, out, 0);
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            fprintf(stderr, "error: PCRE2 match failed at byte %zu: %s\n", pos, (char *)msg);
            exit(1);
        }
        size_t start = ov[0], end = ov[1];
        if (start > pos) bpe_encode_piece(bpe, w, text + pos, start - pos, out, 0); // invalid UTF-8 run
        bpe_encode_piece(bpe, w, text + start, end - start, out, 0);
        pos = end;
    }
}
