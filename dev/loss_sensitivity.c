// How much can the training-loss check of test_mhar's GPU section move by
// rounding alone? This runs that check's CPU side (float64, the same configs,
// batches, learning rates and steps) twice per config: from the initial
// parameters, and from the same parameters each multiplied by (1 + d r), r
// uniform in [-1, 1], d = 2^-8 (bf16's unit roundoff: one bf16 rounding of
// every parameter). It prints the worst relative difference of the per-step
// losses, the statistic test_mhar bounds with its bf16 tol_train, for four
// perturbation seeds. The bf16 trainer rounds far more than the parameters
// once, so its distance from the float64 run is of this order, or larger.
// Then the same perturbation in the forward/backward check of the GPU layout configs.
//   make dev/loss_sensitivity && ./dev/loss_sensitivity      (CPU, ~2 min on 2 cores)
#define TEST_MHAR_NO_MAIN
#include "test_mhar.c"

// worst step rel of the run with perturbation seed pseed against base[] (d = 0 fills base)
static double train_steps(Config cfg, int steps, double d, uint64_t pseed, double *base) {
    const int B = 2, T = cfg.T;
    const size_t N = (size_t)B * T;
    Model m;
    model_build(&m, &cfg, 42, 0.02f);
    for (size_t i = 0; i < m.nparams; i++) {   // float32 bits, as test_mhar gives both sides
        float f = (float)m.params_mem[i];
        m.params_mem[i] = d == 0 ? f : (float)(f * (1.0 + d * (rng_f32(&pseed) * 2.0 - 1.0)));
    }
    int *in = (int *)malloc_check(N * sizeof(int)), *tg = (int *)malloc_check(N * sizeof(int));
    uint64_t rng = 2024;   // test_mhar's batches: two draws for its gradient check, then one per step
    random_tokens(in, N, cfg.V, &rng);
    random_tokens(tg, N, cfg.V, &rng);
    double worst = 0;
    for (int step = 0; step < steps; step++) {   // test_mhar's check_gpu_model loop, CPU side
        train_batch(in, tg, N, cfg.V, &rng);
        cpu_train_step(&m, in, tg, B, T, lr_at(step, steps, 3, 1e-2f, 0.1f), step);
        if (d == 0) { base[step] = m.loss; }
        else { worst = fmax(worst, fabs(m.loss - base[step]) / fabs(base[step])); }
    }
    model_free(&m);
    free(in); free(tg);
    return worst;
}

// The forward/backward comparison of test_mhar's GPU layout configs (check_gpu_model's first
// check: gpu_test_params' moderate random parameters, one batch): how far its three statistics
// (loss rel, logits max-rel, worst gradient max-rel) move when every parameter is multiplied by
// (1 + d r) as above (d = 2^-8: one bf16 rounding; 2^-24: one fp32 rounding). Deep configs
// amplify a perturbation through depth.
static void fb_sensitivity(const char *name, Config cfg, double d) {
    const int B = 2, T = cfg.T;
    const size_t N = (size_t)B * T;
    uint64_t rng = 2024;
    int *in, *tg;
    float *pf;
    Model m;
    gpu_test_inputs(&cfg, &rng, &in, &tg, &m, &pf);
    size_t nl = N * cfg.V, np = m.nparams;
    real *logits0 = (real *)malloc_check(nl * sizeof(real)), *grads0 = (real *)malloc_check(np * sizeof(real));
    model_zero_grad(&m);
    model_forward(&m, in, tg, B, T, 0);
    double loss0 = m.loss;
    memcpy(logits0, m.acts.logits, nl * sizeof(real));
    model_backward(&m, (real)(1.0 / N));
    memcpy(grads0, m.grads_mem, np * sizeof(real));
    printf("%-13s fwd/bwd (loss, logits, worst gradient):", name);
    for (uint64_t s = 0; s < 4; s++) {
        uint64_t pseed = 1000 + s;
        // in float64: a 2^-24 perturbation must survive (the CPU reference's real is double here)
        for (size_t i = 0; i < np; i++) { m.params_mem[i] = (real)(pf[i] * (1.0 + (rng_f32(&pseed) * 2.0 - 1.0) * d)); }
        model_zero_grad(&m);
        model_forward(&m, in, tg, B, T, 0);
        double lrel = fabs(m.loss - loss0) / fabs(loss0), num = 0, den = 0, gw = 0;
        for (size_t i = 0; i < nl; i++) { num = fmax(num, fabs(m.acts.logits[i] - logits0[i])); den = fmax(den, fabs(logits0[i])); }
        model_backward(&m, (real)(1.0 / N));
        size_t off = 0;
        for (int ti = 0; ti < NUM_PARAM_TENSORS; ti++) {
            double gn = 0, gd = 0;
            for (size_t i = off; i < off + m.sizes[ti]; i++) { gn = fmax(gn, fabs(m.grads_mem[i] - grads0[i])); gd = fmax(gd, fabs(grads0[i])); }
            if (m.sizes[ti] > 0) { gw = fmax(gw, gn / fmax(gd, 1e-30)); }
            off += m.sizes[ti];
        }
        printf("  %.1e %.1e %.1e", lrel, num / fmax(den, 1e-30), gw);
    }
    printf("\n");
    model_free(&m);
    free(logits0); free(grads0); free(pf); free(in); free(tg);
}

int main(void) {
    struct { const char *name; Config cfg; int steps; } runs[] = {
        {"std", gpu_test_config(RES_STD, 1, 1), 10},
        {"attnres", gpu_test_config(RES_MHAR, 1, 1), 10},
        {"mhar H=8", gpu_test_config(RES_MHAR, 8, 1), 10},
        {"block S=4", gpu_test_config(RES_MHAR, 4, 4), 10},
        {"HD=64 T=256", gpu_flash_config(64, 4, 2, 256), 5},
        {"HD=128 T=256", gpu_flash_config(128, 2, 1, 256), 5},
        {"HD=64 T=150", gpu_flash_config(64, 4, 2, 150), 5},
        {"HD=128 T=150", gpu_flash_config(128, 2, 1, 150), 5},
    };
    double overall = 0, base[16];
    printf("worst step rel of the training losses after a 2^-8 relative perturbation of every parameter (4 seeds)\n");
    for (size_t k = 0; k < sizeof(runs) / sizeof(runs[0]); k++) {
        train_steps(runs[k].cfg, runs[k].steps, 0, 0, base);
        printf("%-13s %2d steps:", runs[k].name, runs[k].steps);
        for (uint64_t s = 0; s < 4; s++) {
            double w = train_steps(runs[k].cfg, runs[k].steps, 1.0 / 256, 1000 + s, base);
            overall = fmax(overall, w);
            printf(" %.1e", w);
        }
        printf("\n");
    }
    printf("worst: %.1e\n", overall);
    printf("\nthe same perturbation in test_mhar's forward/backward check of the GPU layout configs (4 seeds):\n");
    fb_sensitivity("C=512 H=8", gpu_layout_config(512, 8), 1.0 / 256);
    fb_sensitivity("C=1024 H=1", gpu_layout_config(1024, 1), 1.0 / 256);
    fb_sensitivity("C=2048 H=8", gpu_layout_config(2048, 8), 1.0 / 256);
    fb_sensitivity("C=256 L=17", gpu_layout_config_L(256, 1, 17), 1.0 / 256);
    printf("\nthe same at 2^-24 (one fp32 rounding of every parameter: the fp32 build's tolerances):\n");
    fb_sensitivity("C=512 H=8", gpu_layout_config(512, 8), 0x1p-24);
    fb_sensitivity("C=256 L=17", gpu_layout_config_L(256, 1, 17), 0x1p-24);
    return 0;
}
