/*
GPT-2 byte-level BPE encoder, used by data_prep/tokenize, its tests and its
benchmark.

The vocabulary comes from a tiktoken-format rank file (r50k_base.tiktoken):
one line per token, "<base64 of the token's bytes> <rank>". The rank is the
token id and also the merge priority (lower merges first). GPT-2's
<|endoftext|> is not in the file; it gets the id right after the last rank
(50256).

Encoding a text is two steps, exactly as GPT-2 / tiktoken's `gpt2` encoding:
1) pre-tokenisation: the text is cut into pieces by GPT-2's regex, run with
   PCRE2 (UTF + UCP, so \p{L}, \p{N} and \s are Unicode-aware; JIT compiled);
2) byte pair merging inside each piece: start from one token per byte, then
   repeatedly merge the adjacent pair whose concatenation has the lowest
   rank (leftmost on ties) until no adjacent pair concatenates to a token.

Invalid UTF-8: the regex is compiled with PCRE2_MATCH_INVALID_UTF, under
which bytes that are not part of a valid UTF-8 character never match. Every
maximal run of such bytes lying between two matches becomes a piece of its
own and is merged like any other piece. So any byte string encodes, and
decode(encode(x)) == x for all x; on valid UTF-8 the result is exactly
tiktoken's (which only accepts valid text, so there is no reference for the
invalid case).
*/
#ifndef DATA_PREP_BPE_H
#define DATA_PREP_BPE_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

// number of ranks in r50k_base.tiktoken; GPT-2's EOT id is this number
#define GPT2_N_RANKS 50256
#define GPT2_EOT 50256
#define GPT2_EOT_TEXT "<|endoftext|>"

// GPT-2's pre-tokenisation pattern (a fact of the format, written as a C string)
#define GPT2_PATTERN \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

// the loaded vocabulary, merge table and compiled regex; read-only once loaded,
// so one BPE is shared by all threads
typedef struct {
    uint32_t n_ranks;       // ranks in the file (50256)
    uint32_t vocab_size;    // n_ranks + 1 (EOT)
    uint32_t eot;           // id of <|endoftext|>
    unsigned char *bytes;   // all token bytes, concatenated, ids 0..vocab_size-1
    size_t *offset;         // token id's bytes are bytes[offset[id] .. offset[id+1])
    uint32_t byte_id[256];  // id of each single byte
    // byte string -> id, open addressing, holds ids (UINT32_MAX = empty)
    uint32_t *str_slots;
    size_t str_mask;
    // (left id, right id) -> id of their concatenation, open addressing
    uint64_t *pair_keys;    // (left << 32 | right) + 1; 0 = empty
    uint32_t *pair_vals;
    size_t pair_mask;
    pcre2_code *re;         // GPT-2 pattern, JIT compiled
} BPE;

// a growable array of token ids
typedef struct {
    uint32_t *data;
    size_t len, cap;
} TokenBuf;

// per-thread scratch space for encoding (regex match data, merge arrays, cache)
typedef struct {
    pcre2_match_data *md;
    size_t cap;             // capacity of the arrays below, in parts
    uint32_t *ids;          // part ids
    uint32_t *ranks;        // rank of each adjacent pair (short pieces)
    uint32_t *next, *prev;  // linked list of parts (long pieces)
    uint64_t *heap;         // min-heap of (rank << 32 | start) (long pieces)
    // direct-mapped cache of short pieces that needed merging: piece -> ids
    unsigned char *cache_keys; // BPE_CACHE_SLOTS * BPE_CACHE_KEY bytes
    uint8_t *cache_klen;       // key length, 0 = empty slot
    uint8_t *cache_nids;
    uint32_t *cache_ids;       // BPE_CACHE_SLOTS * BPE_CACHE_IDS
    int use_cache;
} BPEWorker;

#define BPE_CACHE_SLOTS 8192
#define BPE_CACHE_KEY 24    // longest piece cached, bytes
#define BPE_CACHE_IDS 12    // most ids of a cached piece
#define BPE_HEAP_MIN 48     // pieces at least this long use the heap merge

// reads a tiktoken rank file, builds the tables, compiles the regex.
// on any problem prints one line naming the file, the problem and the fix, and exits 1.
void bpe_load(BPE *bpe, const char *rank_path);
void bpe_free(BPE *bpe);

void bpe_worker_init(BPEWorker *w);
void bpe_worker_free(BPEWorker *w);

// appends the ids of text[0..len) to out (no EOT is added)
void bpe_encode(const BPE *bpe, BPEWorker *w, const unsigned char *text, size_t len, TokenBuf *out);

// appends the ids of one pre-tokenised piece; force: 0 = automatic,
// 1 = always the short (array) merge, 2 = always the heap merge (tests use 1 and 2)
void bpe_encode_piece(const BPE *bpe, BPEWorker *w, const unsigned char *p, size_t n, TokenBuf *out, int force);

// bytes of token id (the text "<|endoftext|>" for EOT); NULL if id is out of range
const unsigned char *bpe_token_bytes(const BPE *bpe, uint32_t id, size_t *len);

// id of a byte string, or UINT32_MAX if it is not a token
uint32_t bpe_lookup(const BPE *bpe, const unsigned char *s, size_t n);

void tokenbuf_push(TokenBuf *b, uint32_t id);
void tokenbuf_free(TokenBuf *b);

#endif
