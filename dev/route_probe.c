/*
dev/route_probe.c: the mechanism probe of MHAR. Where does each routing head read from?

It loads an mhar/attnres checkpoint, runs the forward pass on the first n
batches of a val shard glob, and averages the routing weights a[h, i]
(SPEC section 4) of every site over all B*T positions of all batches. It writes
one CSV row per (site, head, source):

  site,head,source_index,source_slot,source_label,weight,site_feeds,js_avg_bits,js_pos_bits

  site          routing site j = 0 .. 2L (site j feeds sublayer j; site 2L the final norm)
  head          routing head h = 0 .. H-1 (channels [h*C/H, (h+1)*C/H))
  source_index  i = 0 .. n_j-1, the position of the source in site j's softmax
  source_slot   the slot it reads (common/config.h): full mode: slot k = v_k, so index = slot
  source_label  emb, attn0, mlp0, attn1, ... (full mode);  emb, b1, b2, ..., partial (block mode)
  weight        mean of a[h, i] over positions: each (site, head) group sums to 1
  site_feeds    what the site's output feeds: attn0, mlp0, ..., final
  js_avg_bits   mean over head pairs of JS(P_h, P_h'), P_h = head h's position-averaged weights
  js_pos_bits   mean over positions and head pairs of JS(a_t[h], a_t[h']), the per-position weights

Jensen-Shannon divergences are in bits (log base 2), so they lie in [0, 1]:
0 when the heads read depth identically, 1 when they read disjoint sources.
The two JS columns repeat on every row of a site. Because JS is jointly
convex, js_pos_bits >= js_avg_bits always: averaging over positions can hide
disagreement (two heads that alternate between sources per token look alike on
average), and the gap between the two columns measures how much. With H = 1
there are no head pairs and both columns are nan.

  make dev/route_probe        (or: gcc -O3 -march=native -fopenmp -I. -o dev/route_probe dev/route_probe.c -lm)
  ./dev/route_probe -c runs/x/ckpt_000300.bin -j data/tiny/data_val_000000.bin -b 8 -n 4 -o runs/x/route.csv
  python3 dev/plot_routing.py runs/x/route.csv --out runs/x/route.png

See dev/PROBE.md for how to read the output.
*/
#define TESTING
#include "train_mhar.c"

// Label of slot k (common/config.h): what the source stored there is.
static void slot_label(const Config *c, int k, char *buf, size_t len) {
    if (k == 0) { snprintf(buf, len, "emb"); }
    else if (c->S == 1) {   // full mode: slot k = v_k, the output of sublayer k-1
        snprintf(buf, len, "%s%d", (k - 1) % 2 == 0 ? "attn" : "mlp", (k - 1) / 2);
    } else if (k % c->S == 0) { snprintf(buf, len, "b%d", k / c->S); }   // completed block b_m
    else { snprintf(buf, len, "partial"); }   // partial sum of the current block
}

// What routing site j feeds: sublayer j, or the final norm for j = 2L.
static void site_label(const Config *c, int j, char *buf, size_t len) {
    if (j == 2 * c->L) { snprintf(buf, len, "final"); }
    else { snprintf(buf, len, "%s%d", j % 2 == 0 ? "attn" : "mlp", j / 2); }
}

// Jensen-Shannon divergence in bits between two distributions of n entries:
// JS = (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2; 0 log 0 = 0.
static double js_bits(const double *p, const double *q, int n) {
    double js = 0;
    for (int i = 0; i < n; i++) {
        double m = 0.5 * (p[i] + q[i]);
        if (p[i] > 0) { js += 0.5 * p[i] * log2(p[i] / m); }
        if (q[i] > 0) { js += 0.5 * q[i] * log2(q[i] / m); }
    }
    return js > 0 ? js : 0;   // rounding can leave a tiny negative
}

static void usage(const char *prog) {
    fprintf(stderr,
        "usage: %s -c CKPT -j VAL_GLOB [-b B] [-n batches] [-t T] [-o OUT.csv]\n"
        "  -c CKPT      an mhar or attnres checkpoint written by train_mhar\n"
        "  -j GLOB      val token shards; the first n batches are read (default data/tiny/*_val_*.bin)\n"
        "  -b B         sequences per batch (default 4)\n"
        "  -n N         batches (default 4)\n"
        "  -t T         sequence length (or -T), at most the checkpoint's T (default: the checkpoint's T)\n"
        "  -o OUT.csv   write the mean routing weights and per-site JS here (default: summary only)\n",
        prog);
}

// integer flag value, or a one-line error naming the flag
static int int_flag(const char *flag, const char *v) {
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < 1 || x > 1000000000L) {
        die("%s needs a positive integer, got '%s'", flag, v);
    }
    return (int)x;
}

int main(int argc, char **argv) {
    const char *ckpt = NULL, *val_glob = "data/tiny/*_val_*.bin", *out = NULL;
    int B = 4, nbatches = 4, T = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) { usage(argv[0]); return 0; }
        if (i + 1 >= argc) { die("flag %s has no value; run %s --help", argv[i], argv[0]); }
        const char *f = argv[i], *v = argv[++i];
        if (strcmp(f, "-c") == 0) { ckpt = v; }
        else if (strcmp(f, "-j") == 0) { val_glob = v; }
        else if (strcmp(f, "-o") == 0) { out = v; }
        else if (strcmp(f, "-b") == 0) { B = int_flag("-b", v); }
        else if (strcmp(f, "-n") == 0) { nbatches = int_flag("-n", v); }
        else if (strcmp(f, "-t") == 0 || strcmp(f, "-T") == 0) { T = int_flag("-t", v); }   // -T: the dataloader's errors say -T
        else { die("unknown flag %s; run %s --help", f, argv[0]); }
    }
    if (ckpt == NULL) { usage(argv[0]); die("no checkpoint: give -c CKPT (a file written by train_mhar -o DIR)"); }

    // The config comes from the checkpoint header (ckpt_open_read checks magic,
    // version, shape and file size, and dies with a one-line error otherwise).
    Config cfg;
    CkptInfo info;
    FILE *f = ckpt_open_read(ckpt, &cfg, &info);
    if (cfg.mode == RES_STD) {
        die("%s has no routing: std mode; the probe needs a checkpoint trained with -r mhar or -r attnres", ckpt);
    }
    if (cfg.mode != RES_MHAR) {   // delta's sources (a null, block sums beside the stream) have no probe labels yet
        die("%s is a %s checkpoint; the probe reads the routing of checkpoints trained with -r mhar or -r attnres",
            ckpt, config_mode_name(&cfg));
    }
    if (info.content == CKPT_GRADS) { die("%s is a gradient dump, not a checkpoint; pass a ckpt_STEP.bin", ckpt); }
    if (T == 0) { T = cfg.T; }
    if (T > cfg.T) { die("-t %d is longer than the checkpoint's T=%d (RoPE tables); use -t %d or less", T, cfg.T, cfg.T); }

    // Build the model and read only the parameters (not the AdamW state that
    // follows them in a training checkpoint: the probe has no use for it).
    // The file's config is the model's, so model_load's config check is moot.
    Model m;
    model_build(&m, &cfg, 0, 0.02f);
    read_reals(f, m.params_mem, m.nparams, info.elem, ckpt);
    fclose(f);
    config_print(&cfg, stdout);
    printf("checkpoint: %s (step %d); probing %d batches of %d x %d tokens from %s\n",
           ckpt, info.step, nbatches, B, T, val_glob);

    DataLoader dl;
    dataloader_init(&dl, val_glob, B, T, cfg.V);
    size_t val_tokens = 0;
    for (int s = 0; s < dl.nshards; s++) { val_tokens += dl.ntok[s]; }
    if ((size_t)nbatches * B * T + 1 > val_tokens) {
        printf("note: %d batches need %zu tokens but the val shards hold %zu: batches repeat\n",
               nbatches, (size_t)nbatches * B * T + 1, val_tokens);
    }

    // Accumulators, in double. wsum has the layout of route_a without the
    // positions: site j at pair_off[j]*H, (H, n_j). jsum[j] sums, over
    // positions, the mean pairwise JS between the heads' per-position weights.
    const int J = 2 * cfg.L + 1, H = cfg.H;
    size_t N = (size_t)B * T, npairs = m.pair_off[J];
    double *wsum = (double *)calloc_check(npairs * H, sizeof(double));
    double *jsum = (double *)calloc_check(J, sizeof(double));
    double loss = 0;
    for (int b = 0; b < nbatches; b++) {
        dataloader_next(&dl);
        model_forward(&m, dl.inputs, dl.targets, B, T, 0);
        loss += m.loss;
        for (int j = 0; j < J; j++) {
            int n = (int)(m.pair_off[j + 1] - m.pair_off[j]);
            const real *a = m.acts.route_a + m.pair_off[j] * N * H;   // (N, H, n)
            double *w = wsum + m.pair_off[j] * H;                     // (H, n)
            // sum over positions, serial in t: the same bits for any thread count
            for (size_t t = 0; t < N; t++) {
                for (int k = 0; k < H * n; k++) { w[k] += a[t * H * n + k]; }
            }
            if (H < 2) { continue; }
            double js_site = 0;
            #pragma omp parallel for reduction(+ : js_site)
            for (size_t t = 0; t < N; t++) {
                double p[1024], q[1024], js = 0;
                const real *at = a + t * H * n;
                for (int h1 = 0; h1 < H; h1++) {
                    for (int i = 0; i < n; i++) { p[i] = at[h1 * n + i]; }
                    for (int h2 = h1 + 1; h2 < H; h2++) {
                        for (int i = 0; i < n; i++) { q[i] = at[h2 * n + i]; }
                        js += js_bits(p, q, n);
                    }
                }
                js_site += js / (H * (H - 1) / 2);
            }
            jsum[j] += js_site;
        }
    }
    double positions = (double)nbatches * N;
    for (size_t k = 0; k < npairs * H; k++) { wsum[k] /= positions; }
    printf("val loss over the probed batches: %.6f\n", loss / nbatches);

    // Per site: JS of the averaged distributions, and the per-position mean.
    double *js_avg = (double *)calloc_check(J, sizeof(double));
    double *js_pos = (double *)calloc_check(J, sizeof(double));
    for (int j = 0; j < J; j++) {
        int n = (int)(m.pair_off[j + 1] - m.pair_off[j]);
        const double *w = wsum + m.pair_off[j] * H;
        double s = 0;
        for (int h1 = 0; h1 < H; h1++) {
            for (int h2 = h1 + 1; h2 < H; h2++) { s += js_bits(w + h1 * n, w + h2 * n, n); }
        }
        js_avg[j] = H < 2 ? NAN : s / (H * (H - 1) / 2);
        js_pos[j] = H < 2 ? NAN : jsum[j] / positions;
    }

    if (out != NULL) {
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", out);
        FILE *o = fopen_check(tmp, "w");
        fprintf(o, "site,head,source_index,source_slot,source_label,weight,site_feeds,js_avg_bits,js_pos_bits\n");
        for (int j = 0; j < J; j++) {
            int src[1024], n = site_sources(&cfg, j, src);
            char feeds[32], lab[32];
            site_label(&cfg, j, feeds, sizeof(feeds));
            for (int h = 0; h < H; h++) {
                for (int i = 0; i < n; i++) {
                    slot_label(&cfg, src[i], lab, sizeof(lab));
                    fprintf(o, "%d,%d,%d,%d,%s,%.9f,%s,%.9f,%.9f\n", j, h, i, src[i], lab,
                            wsum[m.pair_off[j] * H + (size_t)h * n + i], feeds, js_avg[j], js_pos[j]);
                }
            }
        }
        if (fflush(o) != 0 || ferror(o)) { die("writing %s failed: %s (disk full?)", tmp, strerror(errno)); }
        fclose(o);
        if (rename(tmp, out) != 0) { die("cannot rename %s to %s: %s", tmp, out, strerror(errno)); }
    }

    // Readable summary: each head's favourite source and its weight, per site.
    printf("site  feeds   n | argmax source (mean weight) per head | JS bits: averaged, per-position\n");
    double mean_avg = 0, mean_pos = 0;
    int counted = 0;
    for (int j = 0; j < J; j++) {
        int src[1024], n = site_sources(&cfg, j, src);
        char feeds[32], lab[32];
        site_label(&cfg, j, feeds, sizeof(feeds));
        printf("%4d  %-6s %2d |", j, feeds, n);
        for (int h = 0; h < H; h++) {
            const double *w = wsum + m.pair_off[j] * H + (size_t)h * n;
            int best = 0;
            for (int i = 1; i < n; i++) { if (w[i] > w[best]) { best = i; } }
            slot_label(&cfg, src[best], lab, sizeof(lab));
            printf(" h%d %s (%.2f)", h, lab, w[best]);
        }
        if (H < 2) { printf(" | n/a (H=1)\n"); continue; }
        printf(" | %.4f %.4f\n", js_avg[j], js_pos[j]);
        if (n > 1) { mean_avg += js_avg[j]; mean_pos += js_pos[j]; counted++; }
    }
    if (counted > 0) {
        printf("mean over the %d sites with more than one source: JS averaged %.4f bits, per-position %.4f bits\n",
               counted, mean_avg / counted, mean_pos / counted);
    }
    if (out != NULL) { printf("wrote %s\n", out); }

    free(wsum); free(jsum); free(js_avg); free(js_pos);
    dataloader_free(&dl);
    model_free(&m);
    return 0;
}
