// Command-line flags of the trainers. train_mhar.c and train_mhar.cu take the
// same flags, parsed here; README.md lists them all.
#pragma once
#include "config.h"

typedef struct {
    Config cfg;              // model shape and residual mode
    const char *train_glob;  // -i  train shards
    const char *val_glob;    // -j  val shards ("" = no validation)
    const char *tokenizer;   // -tok tokenizer file for decoding samples ("" = print ids)
    const char *out_dir;     // -o  directory for log.txt and checkpoints ("" = none)
    const char *resume;      // -resume checkpoint to continue from ("" = fresh start)
    const char *init_from;   // -init_from std checkpoint to convert into a delta model ("" = none)
    int overwrite;           // -overwrite 1: a fresh run may replace the run already in -o
    int B;                   // -b  micro-batch size (sequences)
    long total_batch;        // -d  tokens per optimizer step (gradient accumulation)
    int steps;               // -n  optimizer steps
    float lr;                // -lr peak learning rate
    float lr_new;            // -lr_new learning rate of delta's new parameters, as a multiple of lr
    float lr_route;          // -lr_route learning rate of mhar's routing queries, as a multiple of lr
    int warmup;              // -warmup linear warmup steps
    float lr_min_frac;       // -lr_min cosine floor as a fraction of the peak
    float wd;                // -wd AdamW weight decay
    float beta1, beta2, eps; // -beta1 -beta2 -eps AdamW
    float clip;              // -clip global gradient-norm clip (0 = off)
    int val_every;           // -val_every steps between val losses (0 = never)
    int val_batches;         // -val_batches micro-batches per val loss
    int sample_every;        // -sample_every steps between samples (0 = never)
    int sample_len;          // -sample_len tokens per sample
    int ckpt_every;          // -ckpt_every steps between checkpoints (0 = only at the end)
    unsigned long long seed; // -seed parameter init and sampling seed
    float init_std;          // -init_std std of matrix init
    int op_times;            // -op_times 1: per-op GPU time table at the end (train_mhar_cu)
} TrainArgs;

static void args_defaults(TrainArgs *a) {
    memset(a, 0, sizeof(*a));
    Config *c = &a->cfg;
    c->V = 50257;
    config_apply_preset(c, "tiny");
    c->mode = RES_MHAR; c->H = 4; c->S = 1; c->n = 4;   // n counts only in hc mode
    a->train_glob = "data/tiny/*_train_*.bin";
    a->val_glob = "data/tiny/*_val_*.bin";
    a->tokenizer = "";
    a->out_dir = "";
    a->resume = "";
    a->init_from = "";
    a->B = 8;
    a->total_batch = 0;   // 0 means B*T: no accumulation
    a->steps = 200;
    a->lr = 1e-3f;
    a->lr_new = 1.0f;
    a->lr_route = 1.0f;
    a->warmup = 20;
    a->lr_min_frac = 0.1f;
    a->wd = 0.1f;
    a->beta1 = 0.9f; a->beta2 = 0.95f; a->eps = 1e-8f;
    a->clip = 1.0f;
    a->val_every = 50;
    a->val_batches = 8;
    a->sample_every = 100;
    a->sample_len = 64;
    a->ckpt_every = 0;
    a->seed = 1337;
    a->init_std = 0.02f;
}

static void args_usage(const char *prog) {
    fprintf(stderr,
        "usage: %s [flags]   (every flag takes one value)\n"
        "model:\n"
        "  -preset NAME   shape preset: test, tiny (default), 100m, 350m, 1b; later flags override it\n"
        "  -L -C -NH -NKV -F -T -V   blocks, width, query heads, kv heads, MLP width, seq len, vocab\n"
        "  -r MODE        residual mode: std, mhar (default), attnres (= mhar with H=1), hc,\n"
        "                 delta (std plus a gated routed mix, SPEC section 9)\n"
        "  -H N           routing heads of mhar and delta, must divide C (default 4; train_mhar_cu: 1, 2, 4 or 8)\n"
        "  -S N           sublayers per block, 1 = full mhar (default 1; delta: 8)\n"
        "  -hc_n N        streams of hyper-connections, -r hc (default 4; train_mhar_cu: 1, 2, 4 or 8)\n"
        "data and output:\n"
        "  -i GLOB        train shards (default data/tiny/*_train_*.bin)\n"
        "  -j GLOB        val shards, \"\" for none (default data/tiny/*_val_*.bin)\n"
        "  -tok FILE      tokenizer file to decode samples (default: print token ids)\n"
        "  -o DIR         write DIR/log.txt and DIR/ckpt_STEP.bin (default: none)\n"
        "  -resume FILE   continue from a checkpoint: weights, AdamW state, step, data position\n"
        "  -init_from FILE  convert a std checkpoint into this -r delta model: its weights, the\n"
        "                 new parameters at their init, AdamW from zero at step 0, its data position;\n"
        "                 with -r std the same restart without new parameters (the control)\n"
        "  -overwrite 1   a fresh run replaces the run in -o (its log and checkpoints); default 0 refuses\n"
        "optimisation (SPEC section 6):\n"
        "  -b N           micro-batch size in sequences (default 8)\n"
        "  -d N           tokens per optimizer step; a multiple of b*T (default b*T)\n"
        "  -n N           optimizer steps (default 200)\n"
        "  -lr X          peak learning rate (default 1e-3)\n"
        "  -warmup N      linear warmup steps (default 20; after -init_from: the re-warmup)\n"
        "  -lr_new X      delta: learning rate of q, gamma, null, alpha as a multiple of -lr (default 1)\n"
        "  -lr_route X    mhar/attnres: learning rate of the routing queries q as a multiple of -lr\n"
        "                 (default 1, the paper's; an extension, see README \"Reproducing the paper\")\n"
        "  -lr_min X      cosine floor as a fraction of the peak (default 0.1)\n"
        "  -wd X          AdamW weight decay on matrices (default 0.1)\n"
        "  -beta1 X -beta2 X -eps X   AdamW (default 0.9 0.95 1e-8)\n"
        "  -clip X        clip the global gradient norm to X, 0 = off (default 1.0)\n"
        "  -seed N        seed of init and sampling (default 1337)\n"
        "  -init_std X    std of matrix init (default 0.02)\n"
        "evaluation:\n"
        "  -val_every N   val loss every N steps and at the end, 0 = never (default 50)\n"
        "  -val_batches N micro-batches per val loss (default 8)\n"
        "  -sample_every N  print a sample every N steps and at the end, 0 = never (default 100)\n"
        "  -sample_len N  tokens per sample, at most T (default 64)\n"
        "  -ckpt_every N  checkpoint every N steps and at the end, 0 = end only (default 0)\n"
        "  -op_times 1    per-op GPU time table at the end, the mean over every step after the first\n"
        "                 (train_mhar_cu; its op ranges) (default 0)\n",
        prog);
}

// Parse "-flag value" pairs into a. Dies with a one-line error on any bad flag:
// integers parse strictly (no fraction, exponent or overflow), reals must be
// finite, and each value must lie in its range (named in the message).
static void args_parse(TrainArgs *a, int argc, char **argv) {
    args_defaults(a);
    Config *c = &a->cfg;
    int d_given = 0;
    int s_given = 0;   // delta's default S is 8 unless -S says otherwise
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            args_usage(argv[0]);
            exit(0);
        }
        if (argv[i][0] != '-' || i + 1 >= argc) {
            die("flag '%s' %s; run %s --help", argv[i],
                argv[i][0] != '-' ? "is not a -flag" : "has no value", argv[0]);
        }
        const char *f = argv[i] + 1, *v = argv[++i];
        // integer flags: name, destination, range; sizes are bounded so that size arithmetic cannot overflow
#define INT_FLAG(name, dst, lo, hi) else if (strcmp(f, name) == 0) { dst = parse_int_flag(name, v, lo, hi); }
#define REAL_FLAG(name, dst, lo, lo_open, hi, hi_open) \
        else if (strcmp(f, name) == 0) { dst = (float)parse_real_flag(name, v, lo, lo_open, hi, hi_open); }
        if (strcmp(f, "preset") == 0) { config_apply_preset(c, v); }
        else if (strcmp(f, "r") == 0) {
            if (strcmp(v, "std") == 0) { c->mode = RES_STD; }
            else if (strcmp(v, "mhar") == 0) { c->mode = RES_MHAR; }
            else if (strcmp(v, "attnres") == 0) { c->mode = RES_MHAR; c->H = 1; }
            else if (strcmp(v, "hc") == 0) { c->mode = RES_HC; }
            else if (strcmp(v, "delta") == 0) { c->mode = RES_DELTA; }
            else { die("-r '%s' is not a residual mode; use std, mhar, attnres, hc or delta", v); }
        }
        INT_FLAG("L", c->L, 1, CONFIG_MAX_L) INT_FLAG("C", c->C, 2, CONFIG_MAX_C)
        INT_FLAG("NH", c->NH, 1, CONFIG_MAX_C) INT_FLAG("NKV", c->NKV, 1, CONFIG_MAX_C)
        INT_FLAG("F", c->F, 1, CONFIG_MAX_F) INT_FLAG("T", c->T, 1, CONFIG_MAX_T)
        INT_FLAG("V", c->V, 2, CONFIG_MAX_V) INT_FLAG("H", c->H, 1, CONFIG_MAX_C)
        else if (strcmp(f, "S") == 0) { c->S = parse_int_flag("S", v, 1, 2 * CONFIG_MAX_L); s_given = 1; }
        INT_FLAG("hc_n", c->n, 1, 64)
        else if (strcmp(f, "i") == 0) { a->train_glob = v; }
        else if (strcmp(f, "j") == 0) { a->val_glob = v; }
        else if (strcmp(f, "tok") == 0) { a->tokenizer = v; }
        else if (strcmp(f, "o") == 0) { a->out_dir = v; }
        else if (strcmp(f, "resume") == 0) { a->resume = v; }
        else if (strcmp(f, "init_from") == 0) { a->init_from = v; }
        INT_FLAG("overwrite", a->overwrite, 0, 1)
        INT_FLAG("b", a->B, 1, 1 << 20)
        else if (strcmp(f, "d") == 0) { a->total_batch = (long)parse_int_flag("d", v, 1, 1ll << 40); d_given = 1; }
        INT_FLAG("n", a->steps, 1, INT_MAX - 1)
        REAL_FLAG("lr", a->lr, 0, 0, 1e30, 0) REAL_FLAG("lr_new", a->lr_new, 0, 0, 1e30, 0)
        REAL_FLAG("lr_route", a->lr_route, 0, 0, 1e30, 0)
        INT_FLAG("warmup", a->warmup, 0, INT_MAX - 1)
        REAL_FLAG("lr_min", a->lr_min_frac, 0, 0, 1, 0)
        REAL_FLAG("wd", a->wd, 0, 0, 1e30, 0) REAL_FLAG("beta1", a->beta1, 0, 0, 1, 1)
        REAL_FLAG("beta2", a->beta2, 0, 0, 1, 1)
        REAL_FLAG("eps", a->eps, 0, 1, 1, 0) REAL_FLAG("clip", a->clip, 0, 0, 1e30, 0)
        INT_FLAG("val_every", a->val_every, 0, INT_MAX) INT_FLAG("val_batches", a->val_batches, 1, 1 << 20)
        INT_FLAG("sample_every", a->sample_every, 0, INT_MAX) INT_FLAG("sample_len", a->sample_len, 1, CONFIG_MAX_T)
        INT_FLAG("ckpt_every", a->ckpt_every, 0, INT_MAX)
        else if (strcmp(f, "seed") == 0) { a->seed = parse_u64_flag("seed", v); }
        REAL_FLAG("init_std", a->init_std, 0, 1, 10, 0)
        INT_FLAG("op_times", a->op_times, 0, 1)
        else { die("unknown flag -%s; run %s --help for the list", f, argv[0]); }
#undef INT_FLAG
#undef REAL_FLAG
    }
    if (c->mode == RES_DELTA && !s_given) { c->S = 8; }
    config_finalize(c, "flags");
    if (a->init_from[0] != '\0' && c->mode != RES_DELTA && c->mode != RES_STD) {
        die("-init_from %s converts a std checkpoint into a delta model; add -r delta (or -r std for the "
            "control: the same weights, restarted like the conversion); to continue a run, use -resume", a->init_from);
    }
    if (a->init_from[0] != '\0' && a->resume[0] != '\0') {
        die("-init_from %s and -resume %s both given; convert once with -init_from, then continue "
            "the delta run with -resume alone", a->init_from, a->resume);
    }
    long long bt = (long long)a->B * c->T;
    if (bt > INT_MAX / 2) {
        die("-b %d x T %d = %lld tokens per micro-batch is over the supported %d; use a smaller -b", a->B, c->T, bt,
            INT_MAX / 2);
    }
    if (!d_given) { a->total_batch = (long)bt; }
    if (a->total_batch % bt != 0 || a->total_batch / bt > INT_MAX) {
        die("-d %ld is not a multiple of b*T = %lld (at most %d micro-batches); pick -d = k*%lld", a->total_batch,
            bt, INT_MAX, bt);
    }
    if (a->sample_len > c->T) { a->sample_len = c->T; }
}
