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

Width disagreement (SPEC section 10, with -k KL.csv): the paper's probe of why
splitting the query helps. Each site's query q_j is cut into -slices contiguous
slices of C/slices channels; a_s = softmax_i(q_j[s] . k_i[s]) is the depth
distribution slice s alone would choose (keys k_i = gamma_j * r_i * v_i, SPEC
section 4, restricted to the slice), alpha = softmax_i(q_j . k_i) the full-width
one. The measure is KL(a_s || alpha) in nats, averaged over slices and positions,
per site; the summary averages it over the sites with two or more sources (a
one-source site has KL 0 by construction). The null is the same measure with a
random query of the same norm as q_j (the mean of -null draws, seeded by -seed),
with the trained gamma and the same keys. alpha is AttnRes's own distribution
(H = 1) and the probe checks that it equals the model's routing weights; on an
mhar checkpoint it is the hypothetical full-width read (with H = slices the a_s
are the model's heads, also checked). One CSV row per site:

  site,site_feeds,n_sources,q_norm,kl_nats,kl_null_nats

  ./dev/route_probe -c runs/x/ckpt_000300.bin -j data/tiny/data_val_000000.bin -k runs/x/width.csv
  python3 dev/plot_width.py runs/x/width.csv --out runs/x/width.png
  ./dev/route_probe --self-test       hand-computed cases of the KL measure

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

// Slice scores of one source at one position: ss[s] = r * sum_{c in slice s} qg[c] v[c]
// for the nslice contiguous slices of C channels (qg = q * gamma); their sum is the
// full-width score q . k. ss is strided by n (the sources), so ss[s * n] is slice s.
static void slice_scores(double *ss, int n, const double *qg, const real *v, double r, int C, int nslice) {
    int w = C / nslice;
    for (int s = 0; s < nslice; s++) {
        double e = 0;
        for (int c = s * w; c < (s + 1) * w; c++) { e += qg[c] * v[c]; }
        ss[(size_t)s * n] = r * e;
    }
}

// log-softmax of x (n) into out (n)
static void log_softmax(double *out, const double *x, int n) {
    double maxv = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) { if (x[i] > maxv) { maxv = x[i]; } }
    for (int i = 0; i < n; i++) { sum += exp(x[i] - maxv); }
    double lse = maxv + log(sum);
    for (int i = 0; i < n; i++) { out[i] = x[i] - lse; }
}

// Width disagreement at one position of one site: ss (nslice, n) are the slice scores
// q[s] . k_i[s]; alpha = softmax_i of their sum over s (q . k_i), a_s = softmax_i ss[s].
// Returns the mean over slices of KL(a_s || alpha) = sum_i a_s[i] (log a_s[i] - log alpha[i]),
// in nats. When la is not NULL it receives log alpha (n) and las log a_s (nslice, n).
// n <= 1024 (a site's sources).
static double width_kl(const double *ss, int n, int nslice, double *la, double *las) {
    double full[1024], lalpha[1024], ls[1024], kl = 0;
    for (int i = 0; i < n; i++) {
        full[i] = 0;
        for (int s = 0; s < nslice; s++) { full[i] += ss[(size_t)s * n + i]; }
    }
    log_softmax(lalpha, full, n);
    for (int s = 0; s < nslice; s++) {
        log_softmax(ls, ss + (size_t)s * n, n);
        double k = 0;
        for (int i = 0; i < n; i++) { k += exp(ls[i]) * (ls[i] - lalpha[i]); }
        kl += k > 0 ? k : 0;   // KL >= 0; rounding can leave a tiny negative
        if (las != NULL) { memcpy(las + (size_t)s * n, ls, n * sizeof(double)); }
    }
    if (la != NULL) { memcpy(la, lalpha, n * sizeof(double)); }
    return kl / nslice;
}

// --self-test: hand-computed cases of width_kl and slice_scores. Prints one line per
// check and "N passed, N failed"; returns the number failed.
static int width_self_test(void) {
    int pass = 0, fail = 0;
#define CHECK(name, cond) do { if (cond) { pass++; printf("PASS %s\n", name); } \
                               else { fail++; printf("FAIL %s\n", name); } } while (0)
    // 1. zero query: every a_s and alpha uniform, KL 0
    double z[4 * 3] = {0};
    CHECK("zero query: KL 0 (4 slices, 3 sources)", width_kl(z, 3, 4, NULL, NULL) == 0);
    // 2. 4 slices, 2 sources; only slice 0 scores source 1, at ln 3: alpha = (1/4, 3/4) = a_0;
    //    slices 1..3 are uniform, KL((1/2, 1/2) || (1/4, 3/4)) = ln(4/3) / 2 each:
    //    mean over slices 3/8 ln(4/3) = 0.107881...
    double a[4 * 2] = {0, log(3.0), 0, 0, 0, 0, 0, 0};
    double want = 0.375 * log(4.0 / 3.0), got = width_kl(a, 2, 4, NULL, NULL);
    printf("     hand case: KL %.12f, want 3/8 ln(4/3) = %.12f\n", got, want);
    CHECK("one slice carries the score: KL = 3/8 ln(4/3)", fabs(got - want) < 1e-12);
    // 3. the 2-site toy: that site and a zero-query site average to 3/16 ln(4/3)
    double toy = 0.5 * (width_kl(a, 2, 4, NULL, NULL) + width_kl(z, 2, 4, NULL, NULL));
    CHECK("2-site toy (that site + a zero-query site): mean 3/16 ln(4/3)", fabs(toy - 0.1875 * log(4.0 / 3.0)) < 1e-12);
    // 4. slices that agree exactly in score (each q[s] . k_i[s] = (q . k_i) / 4) still disagree:
    //    a_s = softmax(x / 4) is flatter than alpha = softmax(x). x = (0, ln 16): alpha = (1/17, 16/17),
    //    a_s = (1/3, 2/3): KL = 1/3 ln(17/3) + 2/3 ln(17/24)
    double x4[4 * 2];
    for (int s = 0; s < 4; s++) { x4[s * 2] = 0; x4[s * 2 + 1] = log(16.0) / 4; }
    want = log(17.0 / 3.0) / 3 + 2 * log(17.0 / 24.0) / 3;
    CHECK("equal slice scores: KL(softmax(x/4) || softmax(x)) by hand", fabs(width_kl(x4, 2, 4, NULL, NULL) - want) < 1e-12);
    // 5. one slice: a_0 = alpha, KL 0 whatever the scores
    double one[3] = {0.3, -2.0, 5.0};
    CHECK("one slice: KL 0", fabs(width_kl(one, 3, 1, NULL, NULL)) < 1e-15);
    // 6. slice_scores: C = 8, 4 slices of 2 channels, q * gamma = 1..8, v = 1, r = 0.5
    double qg[8] = {1, 2, 3, 4, 5, 6, 7, 8}, ss[4 * 3];
    real v[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    slice_scores(ss + 1, 3, qg, v, 0.5, 8, 4);   // source 1 of 3
    CHECK("slice_scores: r * sums over slices of 2 channels = 1.5 3.5 5.5 7.5",
          ss[1] == 1.5 && ss[4] == 3.5 && ss[7] == 5.5 && ss[10] == 7.5);
    // 7. KL is not symmetric: the measure is KL(a_s || alpha), not KL(alpha || a_s)
    double las[2 * 4], la[2];
    width_kl(a, 2, 4, la, las);
    double rev = 0;
    for (int s = 0; s < 4; s++) { for (int i = 0; i < 2; i++) { rev += exp(la[i]) * (la[i] - las[s * 2 + i]); } }
    CHECK("direction: KL(a_s || alpha) = 0.1079, not KL(alpha || a_s) = 0.0981",
          fabs(rev / 4 - 0.75 * (0.25 * log(0.5) + 0.75 * log(1.5))) < 1e-12 &&
          fabs(rev / 4 - 0.375 * log(4.0 / 3.0)) > 1e-3);
#undef CHECK
    printf("%d passed, %d failed\n", pass, fail);
    return fail;
}

static void usage(const char *prog) {
    fprintf(stderr,
        "usage: %s -c CKPT -j VAL_GLOB [-b B] [-n batches] [-t T] [-o OUT.csv] [-k KL.csv]\n"
        "  -c CKPT      an mhar or attnres checkpoint written by train_mhar\n"
        "  -j GLOB      val token shards; the first n batches are read (default data/tiny/*_val_*.bin)\n"
        "  -b B         sequences per batch (default 4)\n"
        "  -n N         batches (default 4)\n"
        "  -t T         sequence length (or -T), at most the checkpoint's T (default: the checkpoint's T)\n"
        "  -o OUT.csv   write the mean routing weights and per-site JS here (default: summary only)\n"
        "  -k KL.csv    write the width disagreement per site here (SPEC section 10; default: summary only)\n"
        "  -slices N    query slices of the width disagreement, must divide C (default 4)\n"
        "  -null N      random queries averaged for its null (default 4)\n"
        "  -seed N      seed of the null's random queries (default 1)\n"
        "  --self-test  check the KL measure on hand-computed cases and exit\n",
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
    const char *ckpt = NULL, *val_glob = "data/tiny/*_val_*.bin", *out = NULL, *kl_out = NULL;
    int B = 4, nbatches = 4, T = 0, nslice = 4, ndraws = 4, seed = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) { usage(argv[0]); return 0; }
        if (strcmp(argv[i], "--self-test") == 0) { return width_self_test() == 0 ? 0 : 1; }
        if (i + 1 >= argc) { die("flag %s has no value; run %s --help", argv[i], argv[0]); }
        const char *f = argv[i], *v = argv[++i];
        if (strcmp(f, "-c") == 0) { ckpt = v; }
        else if (strcmp(f, "-j") == 0) { val_glob = v; }
        else if (strcmp(f, "-o") == 0) { out = v; }
        else if (strcmp(f, "-b") == 0) { B = int_flag("-b", v); }
        else if (strcmp(f, "-n") == 0) { nbatches = int_flag("-n", v); }
        else if (strcmp(f, "-t") == 0 || strcmp(f, "-T") == 0) { T = int_flag("-t", v); }   // -T: the dataloader's errors say -T
        else if (strcmp(f, "-k") == 0) { kl_out = v; }
        else if (strcmp(f, "-slices") == 0) { nslice = int_flag("-slices", v); }
        else if (strcmp(f, "-null") == 0) { ndraws = int_flag("-null", v); }
        else if (strcmp(f, "-seed") == 0) { seed = int_flag("-seed", v); }
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
    if (cfg.C % nslice != 0) { die("-slices %d does not divide the checkpoint's C=%d; use a divisor such as 4", nslice, cfg.C); }

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
    // Width disagreement (SPEC section 10): per site, q*gamma of the trained query and of
    // ndraws random queries of the same norm (drawn once per site, seeded), and the sums
    // over positions of the KL. alpha_err: the largest gap between the probe's alpha (H = 1)
    // or a_s (H = nslice) and the model's own routing weights, a check of the keys.
    const int C = cfg.C, R = 1 + ndraws;   // query 0 is the trained one
    double *qgs = (double *)calloc_check((size_t)J * R * C, sizeof(double));
    double *klsum = (double *)calloc_check((size_t)J * R, sizeof(double));
    double *qnorm = (double *)calloc_check(J, sizeof(double));
    uint64_t rng = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 11;
    for (int j = 0; j < J; j++) {
        const real *q = m.params.rq + (size_t)j * C, *g = m.params.rg + (size_t)j * C;
        double nq = 0;
        for (int c = 0; c < C; c++) { nq += (double)q[c] * q[c]; }
        qnorm[j] = sqrt(nq);
        for (int c = 0; c < C; c++) { qgs[(size_t)j * R * C + c] = (double)q[c] * g[c]; }
        for (int d = 1; d < R; d++) {
            double *qd = qgs + ((size_t)j * R + d) * C, nr = 0;
            for (int c = 0; c < C; c++) { qd[c] = rng_normal(&rng); nr += qd[c] * qd[c]; }
            for (int c = 0; c < C; c++) { qd[c] *= qnorm[j] / sqrt(nr) * g[c]; }   // |random| = |q_j|, then * gamma
        }
    }
    const int check_heads = H == 1 || H == nslice;
    double alpha_err = 0;
    double loss = 0;
    for (int b = 0; b < nbatches; b++) {
        dataloader_next(&dl);
        model_forward(&m, dl.inputs, dl.targets, B, T, 0);
        loss += m.loss;
        for (int j = 0; j < J; j++) {
            int n = (int)(m.pair_off[j + 1] - m.pair_off[j]);
            const real *a = m.acts.route_a + m.pair_off[j] * N * H;   // (N, H, n)
            double *w = wsum + m.pair_off[j] * H;                     // (H, n)
            if (n >= 2) {
                int src[1024];
                site_sources(&cfg, j, src);
                double err = 0;
                for (int d = 0; d < R; d++) {
                    const double *qg = qgs + ((size_t)j * R + d) * C;
                    double kl = 0;
                    #pragma omp parallel for reduction(+ : kl) reduction(max : err)
                    for (size_t t = 0; t < N; t++) {
                        double ss[1024 * 4], la[1024], las[1024 * 4];
                        double *ssp = nslice * n <= 1024 * 4 ? ss : (double *)malloc_check((size_t)nslice * n * sizeof(double));
                        double *lasp = nslice * n <= 1024 * 4 ? las : (double *)malloc_check((size_t)nslice * n * sizeof(double));
                        for (int i = 0; i < n; i++) {
                            slice_scores(ssp + i, n, qg, m.acts.slots + ((size_t)src[i] * N + t) * C,
                                         m.acts.slot_r[(size_t)src[i] * N + t], C, nslice);
                        }
                        kl += width_kl(ssp, n, nslice, la, lasp);
                        if (d == 0 && check_heads) {   // the model's weights a (N, H, n) against ours
                            for (int h = 0; h < H; h++) {
                                for (int i = 0; i < n; i++) {
                                    double ours = exp(H == 1 ? la[i] : lasp[(size_t)h * n + i]);
                                    double e = fabs(ours - a[t * H * n + (size_t)h * n + i]);
                                    if (e > err) { err = e; }
                                }
                            }
                        }
                        if (ssp != ss) { free(ssp); free(lasp); }
                    }
                    klsum[(size_t)j * R + d] += kl;
                }
                if (err > alpha_err) { alpha_err = err; }
            }
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

    // Width disagreement per site and over the sites with two or more sources.
    FILE *ko = NULL;
    char ktmp[4096];
    if (kl_out != NULL) {
        snprintf(ktmp, sizeof(ktmp), "%s.tmp", kl_out);
        ko = fopen_check(ktmp, "w");
        fprintf(ko, "site,site_feeds,n_sources,q_norm,kl_nats,kl_null_nats\n");
    }
    double kl_all = 0, null_all = 0;
    int nsites = 0;
    printf("width disagreement (SPEC 10): KL(a_s || alpha) in nats, %d slices of %d channels; null: %d random queries of |q_j|\n",
           nslice, C / nslice, ndraws);
    printf("site  feeds   n   |q|     trained   null\n");
    for (int j = 0; j < J; j++) {
        int n = (int)(m.pair_off[j + 1] - m.pair_off[j]);
        char feeds[32];
        site_label(&cfg, j, feeds, sizeof(feeds));
        double kl = klsum[(size_t)j * R] / positions, nl = 0;
        for (int d = 1; d < R; d++) { nl += klsum[(size_t)j * R + d] / positions; }
        nl /= ndraws;
        printf("%4d  %-6s %2d %7.3f %9.4f %7.4f\n", j, feeds, n, qnorm[j], kl, nl);
        if (ko != NULL) { fprintf(ko, "%d,%s,%d,%.9g,%.9g,%.9g\n", j, feeds, n, qnorm[j], kl, nl); }
        if (n >= 2) { kl_all += kl; null_all += nl; nsites++; }
    }
    if (nsites > 0) {
        printf("width disagreement, mean over the %d sites with more than one source: trained %.4f nats, "
               "null %.4f, excess %.4f\n", nsites, kl_all / nsites, null_all / nsites, (kl_all - null_all) / nsites);
    }
    if (check_heads) {
        printf("check: the probe's %s against the model's routing weights: max |difference| %.3g\n",
               H == 1 ? "alpha" : "slice distributions a_s", alpha_err);
    }
    if (ko != NULL) {
        if (fflush(ko) != 0 || ferror(ko)) { die("writing %s failed: %s (disk full?)", ktmp, strerror(errno)); }
        fclose(ko);
        if (rename(ktmp, kl_out) != 0) { die("cannot rename %s to %s: %s", ktmp, kl_out, strerror(errno)); }
        printf("wrote %s\n", kl_out);
    }
    free(qgs); free(klsum); free(qnorm);

    free(wsum); free(jsum); free(js_avg); free(js_pos);
    dataloader_free(&dl);
    model_free(&m);
    return 0;
}
