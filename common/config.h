// The model's shape, shared by both trainers and the checkpoint format:
// the config struct and its checks, the parameter tensors in checkpoint
// order, and the routing geometry (which sources each routing site reads).
// Names follow SPEC.md section 2.
#pragma once
#include "util.h"

// residual mode: SPEC section 4 (std, mhar), section 8 (hc), section 9 (delta: std plus a gated routed mix)
enum { RES_STD = 0, RES_MHAR = 1, RES_HC = 2, RES_DELTA = 3 };

// Upper bounds of the sizes, from flags or a checkpoint header. They keep every
// size product (Vp*C, L*F*C, B*T*C, ...) far inside size_t and every int
// field inside int, and are far above any model this project trains.
#define CONFIG_MAX_V (1 << 24)   // the tokenizer file's limit too
#define CONFIG_MAX_T (1 << 20)
#define CONFIG_MAX_L 511
#define CONFIG_MAX_C (1 << 16)
#define CONFIG_MAX_F (1 << 20)

typedef struct {
    int V;    // vocabulary size
    int Vp;   // vocabulary padded up to a multiple of 128 (rows of wte)
    int T;    // sequence length
    int L;    // transformer blocks; sublayers j = 0 .. 2L-1
    int C;    // model width
    int NH;   // query heads
    int NKV;  // key/value heads (GQA)
    int HD;   // head dim = C / NH
    int F;    // SwiGLU hidden width
    int mode; // RES_STD, RES_MHAR (attnres is RES_MHAR with H = 1), RES_HC or RES_DELTA
    int H;    // routing heads (mhar, delta); 1 in std and hc mode
    int S;    // sublayers per block (mhar: 1 = full mode, a source per sublayer; delta: default 8); 1 in std and hc
    int n;    // hyper-connection streams (hc, SPEC section 8); 0 in every other mode
} Config;

// Named shapes. "100m" is the paper's 100M model (SPEC section 2).
typedef struct { const char *name; int L, C, NH, NKV, F, T; } Preset;
static const Preset presets[] = {
    {"test", 2, 32, 4, 2, 48, 16},          // unit tests
    {"tiny", 4, 128, 4, 2, 384, 128},       // README quick start on a laptop CPU
    {"100m", 12, 512, 8, 4, 1536, 2048},    // the paper's 100M model
    // Larger scales. SPEC gives only T=1024 for them; these Qwen3-like shapes
    // are our choice (HD = 64 and 128), sized to 350M and 1.0B parameters
    // with GPT-2's vocabulary.
    {"350m", 24, 1024, 16, 8, 3072, 1024},
    {"1b", 18, 2048, 16, 8, 6144, 1024},
};

static void config_apply_preset(Config *c, const char *name) {
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(presets[i].name, name) == 0) {
            c->L = presets[i].L; c->C = presets[i].C; c->NH = presets[i].NH;
            c->NKV = presets[i].NKV; c->F = presets[i].F; c->T = presets[i].T;
            return;
        }
    }
    die("unknown preset '%s' (-preset); use one of: test, tiny, 100m, 350m, 1b", name);
}

static const char *config_mode_name(const Config *c) {
    if (c->mode == RES_STD) { return "std"; }
    if (c->mode == RES_HC) { return "hc"; }
    if (c->mode == RES_DELTA) { return "delta"; }
    if (c->H == 1 && c->S == 1) { return "attnres"; }
    return c->S == 1 ? "mhar" : "block-mhar";
}

// Fill the derived fields (HD, Vp) and die with a clear message on any
// inconsistent value. `where` names the source of the config (flags or a file).
static void config_finalize(Config *c, const char *where) {
    if (c->V < 2 || c->V > CONFIG_MAX_V || c->T < 1 || c->T > CONFIG_MAX_T || c->L < 1 || c->L > CONFIG_MAX_L ||
        c->C < 1 || c->C > CONFIG_MAX_C || c->NH < 1 || c->NKV < 1 || c->F < 1 || c->F > CONFIG_MAX_F) {
        die("%s: sizes out of range (V=%d T=%d L=%d C=%d NH=%d NKV=%d F=%d); allowed: V 2..%d, T 1..%d, L 1..%d, "
            "C 1..%d, NH and NKV >= 1, F 1..%d", where, c->V, c->T, c->L, c->C, c->NH, c->NKV, c->F,
            CONFIG_MAX_V, CONFIG_MAX_T, CONFIG_MAX_L, CONFIG_MAX_C, CONFIG_MAX_F);
    }
    if (c->mode != RES_STD && c->mode != RES_MHAR && c->mode != RES_HC && c->mode != RES_DELTA) {
        die("%s: residual mode %d is unknown; use std, mhar, attnres, hc or delta", where, c->mode);
    }
    if (c->C % c->NH != 0) {
        die("%s: NH=%d does not divide C=%d; pick NH so that C/NH is a whole head dim", where, c->NH, c->C);
    }
    if (c->NH % c->NKV != 0) {
        die("%s: NKV=%d does not divide NH=%d; GQA needs NH a multiple of NKV", where, c->NKV, c->NH);
    }
    c->HD = c->C / c->NH;
    if (c->HD % 2 != 0) {
        die("%s: head dim C/NH=%d is odd; RoPE rotates pairs, so choose C/NH even", where, c->HD);
    }
    if (c->mode == RES_STD || c->mode == RES_HC) { c->H = 1; c->S = 1; }
    if (c->mode != RES_HC) { c->n = 0; }
    if (c->mode == RES_HC && (c->n < 1 || c->n > 64)) {
        die("%s: hc_n=%d streams; hyper-connections need 1 to 64 streams (the paper uses 4)", where, c->n);
    }
    if (c->H < 1 || c->C % c->H != 0) {
        die("%s: H=%d does not divide C=%d; routing heads must split the width evenly (try H=1,2,4,8)",
            where, c->H, c->C);
    }
    // delta may have S > 2L (its default S = 8 on a small model): no block completes, and every
    // site reads the null source and b_0 (SPEC section 9); mhar's blocks must fit the model.
    if (c->S < 1 || c->S > (c->mode == RES_DELTA ? 2 * CONFIG_MAX_L : 2 * c->L)) {
        die("%s: S=%d sublayers per block is out of range; use 1 (full mhar) to 2L=%d", where, c->S,
            c->mode == RES_DELTA ? 2 * CONFIG_MAX_L : 2 * c->L);
    }
    c->Vp = (c->V + 127) / 128 * 128;   // no overflow: V <= CONFIG_MAX_V
}

static void config_print(const Config *c, FILE *f) {
    fprintf(f, "model: %s  L=%d C=%d NH=%d NKV=%d HD=%d F=%d T=%d V=%d (Vp=%d)",
            config_mode_name(c), c->L, c->C, c->NH, c->NKV, c->HD, c->F, c->T, c->V, c->Vp);
    if (c->mode == RES_MHAR || c->mode == RES_DELTA) { fprintf(f, " H=%d S=%d", c->H, c->S); }
    if (c->mode == RES_HC) { fprintf(f, " n=%d", c->n); }
    fprintf(f, "\n");
}

// ---------------------------------------------------------------------------
// Parameter tensors, in checkpoint order. Matrices are (out, in): y = x W^T.

enum {
    P_WTE,   // (Vp, C)      token embedding, tied with the LM head
    P_LN1W,  // (L, C)       pre-norm weight g_j of attention sublayers j = 2l
    P_WQ,    // (L, NH*HD, C)
    P_WK,    // (L, NKV*HD, C)
    P_WV,    // (L, NKV*HD, C)
    P_QNW,   // (L, HD)      QK-norm weight of queries
    P_KNW,   // (L, HD)      QK-norm weight of keys
    P_WO,    // (L, C, NH*HD)
    P_LN2W,  // (L, C)       pre-norm weight g_j of MLP sublayers j = 2l+1
    P_WG,    // (L, F, C)    SwiGLU gate
    P_WU,    // (L, F, C)    SwiGLU up
    P_WD,    // (L, C, F)    SwiGLU down
    P_LNFW,  // (C)          final norm g_f
    P_RQ,    // (2L+1, C)    routing pseudo-queries q_j (mhar, delta)
    P_RG,    // (2L+1, C)    routing key-norm weights gamma_j (mhar, delta)
    P_HCALPHA, // (2L, n)    hc read logits alpha_j: sublayer j reads softmax(alpha_j) of the streams (hc only)
    P_HCA,   // (2L, n, n)   hc stream mix A_j[r,s] (hc only)
    P_HCBETA,  // (2L, n)    hc write weights beta_j: stream r gets beta_j[r] * o_j (hc only)
    P_DNULL, // (2L+1, C)    delta: null sources n_j, one vector per site (SPEC section 9)
    P_DALPHA,// (2L+1)       delta: gates alpha_j of the routed mix, one scalar per site
    NUM_PARAM_TENSORS
};

static const char *const param_names[NUM_PARAM_TENSORS] = {
    "wte", "ln1w", "wq", "wk", "wv", "qnw", "knw", "wo", "ln2w", "wg", "wu", "wd", "lnfw", "rq", "rg",
    "hcalpha", "hca", "hcbeta", "dnull", "dalpha"};

static void param_sizes(const Config *c, size_t sizes[NUM_PARAM_TENSORS]) {
    size_t L = c->L, C = c->C, HD = c->HD, F = c->F;
    size_t QD = (size_t)c->NH * HD, KVD = (size_t)c->NKV * HD;
    size_t sites = (c->mode == RES_MHAR || c->mode == RES_DELTA) ? 2 * L + 1 : 0, dsites = c->mode == RES_DELTA ? 2 * L + 1 : 0;
    sizes[P_WTE] = (size_t)c->Vp * C;
    sizes[P_LN1W] = L * C;
    sizes[P_WQ] = L * QD * C;
    sizes[P_WK] = L * KVD * C;
    sizes[P_WV] = L * KVD * C;
    sizes[P_QNW] = L * HD;
    sizes[P_KNW] = L * HD;
    sizes[P_WO] = L * C * QD;
    sizes[P_LN2W] = L * C;
    sizes[P_WG] = L * F * C;
    sizes[P_WU] = L * F * C;
    sizes[P_WD] = L * C * F;
    sizes[P_LNFW] = C;
    sizes[P_RQ] = sites * C;
    sizes[P_RG] = sites * C;
    size_t hcn = c->mode == RES_HC ? (size_t)c->n : 0;   // 0 in other modes: their checkpoints are unchanged
    sizes[P_HCALPHA] = 2 * L * hcn;
    sizes[P_HCA] = 2 * L * hcn * hcn;
    sizes[P_HCBETA] = 2 * L * hcn;
    sizes[P_DNULL] = dsites * C;
    sizes[P_DALPHA] = dsites;
}

static size_t param_count(const Config *c) {
    size_t sizes[NUM_PARAM_TENSORS], n = 0;
    param_sizes(c, sizes);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { n += sizes[i]; }
    return n;
}

// AdamW weight decay applies to the matrices only, not to norm weights,
// routing queries or gammas (the usual choice; SPEC section 6 is silent), nor
// to hc's alpha, A, beta (SPEC section 8), nor to delta's null sources and gates (SPEC section 9).
static int param_is_decayed(int i) {
    return i == P_WTE || i == P_WQ || i == P_WK || i == P_WV || i == P_WO ||
           i == P_WG || i == P_WU || i == P_WD;
}

// Delta mode's parameters that a std model lacks (q, gamma, null, alpha of
// every site): -init_from puts them at their init, -lr_new scales their
// learning rate. Empty outside delta mode.
static int param_is_new(const Config *c, int i) {
    return c->mode == RES_DELTA && (i == P_RQ || i == P_RG || i == P_DNULL || i == P_DALPHA);
}

// Tensor i's learning rate as a multiple of the step's: -lr_new for delta's new
// parameters; -lr_route for mhar's (and attnres's) routing queries q_j, an
// extension beyond the paper (default 1): a head's logit sums only C/H channels
// of q . k, so under AdamW it grows about H times more slowly than AttnRes's.
static float param_lr_scale(const Config *c, int i, float lr_new, float lr_route) {
    if (param_is_new(c, i)) { return lr_new; }
    if (c->mode == RES_MHAR && i == P_RQ) { return lr_route; }
    return 1.0f;
}

// ---------------------------------------------------------------------------
// Routing geometry (SPEC sections 4 and 5).
//
// Both trainers keep 2L+1 "slots" of width C per position:
//   slot 0   = wte[token]
//   slot j+1 = the output of sublayer j, plus slot j when slot_chains(j).
// std mode chains every slot, so slot j is the residual stream x_j.
// mhar mode chains inside a block of S sublayers, so slot j+1 is the sum of
// the outputs of its block so far: slot mS is the completed block sum b_m, and
// slot j (j not a multiple of S) is the partial sum of the current block.
// With S = 1 nothing chains and slot j+1 is the raw output v_{j+1}: full mode.
//
// delta mode (SPEC section 9) keeps std's stream in slots 0 .. 2L (slot j = x_j)
// and its routing sources after them, J = 2L+1:
//   slot J       the null source n_j of the site being routed, broadcast to
//                every position (rewritten for each site)
//   slot J+k     b_k (k = 1 .. delta_blocks), the sum of block k's S outputs
// and b_0 = x_0 is slot 0 itself. Site j reads [n_j, b_0, b_1 .. b_m] with
// m = floor(j/S) completed blocks; the final site too (m = floor(2L/S)): a
// trailing partial block is never a source (it is in x_2L already).

static int slot_chains(const Config *c, int j) {
    return c->mode == RES_STD || c->mode == RES_DELTA || j % c->S != 0;
}

// delta: the blocks any site reads, floor(2L/S) (the final site's m)
static int delta_blocks(const Config *c) { return c->mode == RES_DELTA ? 2 * c->L / c->S : 0; }

// Slots of width C per position: 2L+1, plus delta's null and block sums.
static int num_slots(const Config *c) {
    return 2 * c->L + 1 + (c->mode == RES_DELTA ? 1 + delta_blocks(c) : 0);
}

// The slots read by routing site j (0 <= j <= 2L), written into src; returns
// their count. mhar: b_0, the completed blocks b_1..b_m, then the partial sum
// of the current block when it has p >= 1 outputs; at most 2L+1 sources.
// delta: the null slot, b_0, the completed blocks (above); at most 2L+2.
static int site_sources(const Config *c, int j, int *src) {
    int m = j / c->S, p = j - m * c->S, n = 0;
    if (c->mode == RES_DELTA) {
        int J = 2 * c->L + 1;
        src[n++] = J;
        src[n++] = 0;
        for (int b = 1; b <= m; b++) { src[n++] = J + b; }
        return n;
    }
    for (int b = 0; b <= m; b++) { src[n++] = b * c->S; }
    if (p >= 1) { src[n++] = j; }
    return n;
}

// ---------------------------------------------------------------------------
// Initialisation (SPEC section 6): every matrix N(0, std^2), norm weights and
// routing gammas 1, routing queries 0, delta's null sources and gates 0
// (SPEC section 9; so a delta model's std tensors get the same draws as a std
// model's of the same seed); the padding rows V..Vp-1 of wte are 0
// (they never reach the softmax). hc (SPEC section 8): alpha 0.02 N(0,1),
// A = I + 0.02 N(0,1), beta = e_0 + 0.02 N(0,1), with SPEC's fixed 0.02 (not
// -init_std, which scales the matrices only). Draws come from one xorshift
// stream in tensor order, so both trainers start from the same float32 bits.
static void params_init(float *p, const Config *c, uint64_t seed, float std) {
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(c, sizes);
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        for (size_t k = 0; k < sizes[i]; k++) {
            float x;
            if (i == P_RQ || i == P_DNULL || i == P_DALPHA) { x = 0.0f; }
            else if (i == P_LN1W || i == P_LN2W || i == P_QNW || i == P_KNW || i == P_LNFW || i == P_RG) { x = 1.0f; }
            else if (i == P_WTE && k >= (size_t)c->V * c->C) { x = 0.0f; }
            else if (i == P_HCALPHA) { x = (float)(0.02 * rng_normal(&rng)); }
            else if (i == P_HCA) {   // (2L, n, n): the identity plus noise
                size_t r = k / c->n % c->n, s = k % c->n;
                x = (float)((r == s ? 1.0 : 0.0) + 0.02 * rng_normal(&rng));
            } else if (i == P_HCBETA) { x = (float)((k % c->n == 0 ? 1.0 : 0.0) + 0.02 * rng_normal(&rng)); }
            else { x = (float)(std * rng_normal(&rng)); }
            p[k] = x;
        }
        p += sizes[i];
    }
}
