// The training loop, shared by both trainers: learning-rate schedule,
// validation, sampling and main's loop. A trainer includes this header after
// its model code. Besides the model functions (model_build, model_load,
// model_forward (its last argument dloss is 0, or the dloss of the
// model_backward that follows), model_backward, model_zero_grad, grad_norm, adamw_update,
// model_save, model_free, and the Model struct with cfg, nparams and loss),
// it defines these hooks for what differs between the CPU and the GPU:
//   void device_init(char *desc, size_t n)   set up, describe the hardware ("2 threads")
//   void device_sync(void)                   wait for queued work (for timing)
//   void device_finish(char *desc, size_t n) tear down, describe memory use at the end
//   void model_logits_row(Model *m, int t, float *out)   row t of the last forward's
//                                                         logits (V floats) on the host
// Data-parallel runs (common/dist.h) also read the Model's grads_mem and
// params_mem (nparams values each; fp32 device arrays on the NCCL path).
// A trainer that defines TRAINER_HAS_OP_TIMES (train_mhar.cu) also has
//   void op_range(const char *name)          open the op range name (closing the one before)
//   void op_times_on(int on)                 time each op range of the steps that follow
//   void op_times_print(double step_ms)      print the per-op table (step_ms: mean wall-clock step)
// for -op_times 1 (the other trainer refuses the flag).
// Both trainers' Model has the fields lr_new and lr_route (learning-rate
// multiples, config.h's param_lr_scale, read by their adamw_update), set here
// from -lr_new and -lr_route.
#pragma once
#include <sys/resource.h>
#include "args.h"
#include "checkpoint.h"
#include "dataloader.h"
#include "dist.h"
#include "logger.h"
#include "tokenizer.h"

// Linear warmup to the peak, then cosine decay to lr_min_frac * peak at the last step.
static float lr_at(int step, int steps, int warmup, float peak, float lr_min_frac) {
    if (step < warmup) { return peak * (step + 1) / warmup; }
    float lo = peak * lr_min_frac;
    if (steps - 1 <= warmup) { return peak; }
    float progress = (float)(step - warmup) / (float)(steps - 1 - warmup);
    return lo + 0.5f * (1.0f + cosf(3.14159265358979f * progress)) * (peak - lo);
}

// Mean loss over the first n batches of a loader; batch k on rank k % world.
static float evaluate(Model *m, DataLoader *dl, int n, Dist *dist) {
    dataloader_reset(dl);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!dist_next_micro(dl, dist, i)) { continue; }
        model_forward(m, dl->inputs, dl->targets, dl->B, dl->T, 0);   // 0: no backward follows
        sum += m->loss;
    }
    dist_sum_host(dist, &sum, 1);
    return (float)(sum / n);
}

// Of the n bytes in buf, how many form whole UTF-8 characters from the start:
// the rest (at most 3 bytes) is the beginning of a character whose other bytes
// come with a later token. A byte that cannot start a character counts as whole
// (it is printed as it is), so nothing waits forever.
static size_t utf8_whole_prefix(const unsigned char *buf, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char b = buf[i];
        size_t len = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xC2 && b <= 0xDF ? 2 : 1;
        size_t k = 1;
        while (k < len && i + k < n && (buf[i + k] & 0xC0) == 0x80) { k++; }
        if (k < len && i + k == n) { break; }   // the character goes on in a later token
        i += k;                                 // whole, or broken (printed as it is)
    }
    return i;
}

// Print len tokens drawn from the model, starting from the EOT token; each
// step reruns the model on the prefix (simple, not fast). Decodes with tok,
// printing whole UTF-8 characters only (a token may end inside one), or prints
// ids when tok is NULL.
static void model_sample(Model *m, const Tokenizer *tok, int eot, int len, uint64_t *rng) {
    int V = m->cfg.V;
    if (eot < 0 || eot >= V) { die("sampling starts from token %d, outside the vocabulary V=%d", eot, V); }
    int *seq = (int *)malloc_check((size_t)(len + 1) * sizeof(int));
    float *logits = (float *)malloc_check((size_t)V * sizeof(float));
    unsigned char *pending = NULL;   // decoded bytes not yet printed: an unfinished UTF-8 character
    size_t npending = 0;
    seq[0] = eot;
    printf("--- sample ---\n");
    for (int t = 1; t <= len; t++) {
        model_forward(m, seq, NULL, 1, t, 0);
        model_logits_row(m, t - 1, logits);
        // draw from softmax(logits): inverse CDF with one uniform number
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++) { if (logits[i] > maxv) { maxv = logits[i]; } }
        double sum = 0;
        for (int i = 0; i < V; i++) { sum += exp((double)(logits[i] - maxv)); }
        double coin = rng_f32(rng) * sum, cdf = 0;
        int next = V - 1;
        for (int i = 0; i < V; i++) {
            cdf += exp((double)(logits[i] - maxv));
            if (coin < cdf) { next = i; break; }
        }
        seq[t] = next;
        if (tok != NULL) {
            size_t n = 0;
            const unsigned char *bytes = tokenizer_decode(tok, (uint32_t)next, &n);
            if (bytes == NULL) { printf("<%d>", next); n = 0; }   // an id the tokenizer does not have
            pending = (unsigned char *)realloc(pending, npending + n + 1);
            if (pending == NULL) { die("out of memory in sampling"); }
            memcpy(pending + npending, bytes ? bytes : (const unsigned char *)"", n);
            npending += n;
            size_t whole = utf8_whole_prefix(pending, npending);
            fwrite(pending, 1, whole, stdout);
            memmove(pending, pending + whole, npending - whole);
            npending -= whole;
        } else {
            printf("%d ", next);
        }
        fflush(stdout);
    }
    if (npending > 0) { fwrite(pending, 1, npending, stdout); }   // an unfinished character at the end
    printf("\n--------------\n");
    free(pending);
    free(seq);
    free(logits);
}

// The output directory -o: remove the temporary files that an interrupted save
// left (ckpt_*.bin.tmp, never a finished checkpoint), saying so in one line,
// and refuse to start a fresh run where a run already is (its log.txt or a
// checkpoint) unless -overwrite 1, which removes that run's log and checkpoints.
// With -resume the run goes on in place and its log is appended to.
static void out_dir_prepare(const TrainArgs *a) {
    const char *dir = a->out_dir;
    mkdir_p(dir);
    DIR *d = opendir(dir);
    if (d == NULL) { die("cannot read directory %s (-o): %s", dir, strerror(errno)); }
    int stale = 0, ckpts = 0, has_log = 0;
    char path[4096];
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        int is_ckpt_name = strncmp(n, "ckpt_", 5) == 0;
        if (is_ckpt_name && len > 8 && strcmp(n + len - 8, ".bin.tmp") == 0) {
            snprintf(path, sizeof(path), "%s/%s", dir, n);
            if (remove(path) != 0) { die("cannot remove the stale %s: %s", path, strerror(errno)); }
            stale++;
        } else if (is_ckpt_name && len > 4 && strcmp(n + len - 4, ".bin") == 0) {
            ckpts++;
        } else if (strcmp(n, "log.txt") == 0) {
            has_log = 1;
        }
    }
    closedir(d);
    if (stale > 0) {
        printf("removed %d stale temporary file%s (ckpt_*.bin.tmp) from %s, left by an interrupted save\n",
               stale, stale == 1 ? "" : "s", dir);
    }
    if (a->resume[0] != '\0' || (!has_log && ckpts == 0)) { return; }
    if (!a->overwrite) {
        die("-o %s already holds a run (%s%d checkpoint%s); continue it with -resume %s/ckpt_STEP.bin, replace it "
            "with -overwrite 1, or choose another -o", dir, has_log ? "log.txt, " : "", ckpts, ckpts == 1 ? "" : "s",
            dir);
    }
    d = opendir(dir);
    if (d == NULL) { die("cannot read directory %s (-o): %s", dir, strerror(errno)); }
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        if (strncmp(n, "ckpt_", 5) == 0 && len > 4 && strcmp(n + len - 4, ".bin") == 0) {
            snprintf(path, sizeof(path), "%s/%s", dir, n);
            if (remove(path) != 0) { die("cannot remove %s (-overwrite): %s", path, strerror(errno)); }
        }
    }
    closedir(d);
    printf("-overwrite: replacing the run in %s (removed its log.txt and %d checkpoints)\n", dir, ckpts);
}

// main of both trainers: parse flags, build or resume, train with gradient
// accumulation, AdamW and clipping; validate, sample and checkpoint on schedule.
static int train_main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);   // progress lines appear at once, also through a pipe (tee)
    TrainArgs args;
    args_parse(&args, argc, argv);
#ifndef TRAINER_HAS_OP_TIMES
    if (args.op_times) {
        die("-op_times 1: the per-op GPU time table is the CUDA trainer's (it times train_mhar_cu's op ranges); "
            "use train_mhar_cu, or time whole steps here with -op_times 0 (each step line gives its ms)");
    }
#endif
    Config *cfg = &args.cfg;
    int B = args.B, T = cfg->T;
    int accum = (int)(args.total_batch / ((long)B * T));
    Dist dist;
    dist_start(&dist, args.total_batch, B, T);   // before device_init: picks this rank's GPU
    int rank0 = dist.rank == 0;   // the only rank that logs, samples and saves
    char desc[256];
    device_init(desc, sizeof(desc));

#ifndef TRAINER_HAS_HC
    if (cfg->mode == RES_HC) {
        die("-r hc: this trainer has no hyper-connections mode; train hc models with train_mhar (the CPU trainer)");
    }
#endif
    Model model;
    model_build(&model, cfg, args.seed, args.init_std);
    model.lr_new = args.lr_new;
    model.lr_route = args.lr_route;
    CkptInfo state;
    memset(&state, 0, sizeof(state));
    state.rng = args.seed ^ 0xA5A5A5A5ull;
    if (args.init_from[0] != '\0') {
        // SPEC section 9's conversion: the std model's weights, the new parameters at their init
        // (alpha = 0: the model computes exactly what the std model did), AdamW from zero state at
        // step 0 (-warmup is the re-warmup). The data stream and the sampling rng continue where
        // the std run stopped. With -r std it is the control: the same restart (weights, zero
        // AdamW, schedule, batches) with no new parameters, so the two arms differ only by them.
        CkptInfo from;
        memset(&from, 0, sizeof(from));
        from.convert = 1;
        model_load(&model, args.init_from, &from);
        state.shard = from.shard; state.pos = from.pos;
        if (from.content == CKPT_TRAIN) { state.rng = from.rng; }
        printf("converted %s (std, step %d) into %s: %sAdamW from zero\n", args.init_from, from.step,
               config_mode_name(cfg), cfg->mode == RES_DELTA ? "new parameters at their init, " : "");
    }
    if (args.resume[0] != '\0') {
        model_load(&model, args.resume, &state);
        if (state.content != CKPT_TRAIN) {
            die("%s holds no optimizer state (content %d); resume needs a training checkpoint", args.resume, state.content);
        }
        if (state.step >= args.steps) {
            die("%s is at step %d, and -n %d leaves no step to train; give -n above %d", args.resume, state.step,
                args.steps, state.step);
        }
        printf("resumed from %s at step %d\n", args.resume, state.step);
    }
    config_print(cfg, stdout);
    printf("parameters: %zu (%.2fM)\n", model.nparams, model.nparams / 1e6);
    printf("batch: %d x %d tokens, %d micro-batches per step = %ld tokens; %d steps; %s\n",
           B, T, accum, args.total_batch, args.steps, desc);
    char dist_desc[256];
    dist_describe(&dist, dist_desc, sizeof(dist_desc));
    if (dist.nccl) { printf("%s; %d micro-batches per rank per step\n", dist_desc, accum / dist.world); }
    dist_check_same(&dist, model.params_mem, model.nparams * sizeof(*model.params_mem), "the start-up parameters");
    int check_every = dist_check_every();

    DataLoader train, val;
    dataloader_init(&train, args.train_glob, B, T, cfg->V);
    if (args.resume[0] != '\0') { dataloader_seek(&train, state.shard, state.pos, args.resume); }
    if (args.init_from[0] != '\0') { dataloader_seek(&train, state.shard, state.pos, args.init_from); }
    int have_val = args.val_glob[0] != '\0' && args.val_every > 0;
    if (have_val) { dataloader_init(&val, args.val_glob, B, T, cfg->V); }
    Tokenizer tokenizer;
    int have_tok = args.tokenizer[0] != '\0';
    int eot = cfg->V > 50256 ? 50256 : 0;   // GPT-2's end-of-text, when no tokenizer says otherwise
    if (have_tok) {
        tokenizer_init(&tokenizer, args.tokenizer);
        if (tokenizer_eot(&tokenizer) >= (uint32_t)cfg->V) {
            die("-tok %s: its end-of-text id %u is outside this model's vocabulary V=%d; give the tokenizer the shards "
                "were made with, and -V its vocabulary size (%u)", args.tokenizer, tokenizer_eot(&tokenizer), cfg->V,
                tokenizer_vocab_size(&tokenizer));
        }
        eot = (int)tokenizer_eot(&tokenizer);
    }
    if (!rank0) { args.out_dir = ""; }
    if (args.out_dir[0] != '\0') { out_dir_prepare(&args); }
    Logger logger;
    logger_init(&logger, args.out_dir, args.resume[0] != '\0');

    char last_ckpt[4096] = "";   // the newest checkpoint this run saved, for the divergence message
    double timed_ms = 0;   // -op_times: wall-clock ms of the timed steps (all after the run's first)
    int timed_steps = 0;
    for (int step = state.step; step < args.steps; step++) {
        int last = step == args.steps - 1;
        // -op_times 1 times every step but the run's first (cuBLAS's heuristics, first allocations)
        int timed = args.op_times && step > state.step;
#ifdef TRAINER_HAS_OP_TIMES
        op_times_on(timed);
#endif
        double t0 = wall_ms();
        model_zero_grad(&model);
        double loss = 0;
        for (int micro = 0; micro < accum; micro++) {
            if (!dist_next_micro(&train, &dist, micro)) { continue; }   // another rank's micro-batch
            double dloss = 1.0 / ((double)B * T * accum);   // d mean-loss / d each position's loss
            model_forward(&model, train.inputs, train.targets, B, T, dloss);   // the cross-entropy's backward
            model_backward(&model, dloss);                                      // runs in the forward
            loss += model.loss;
        }
#ifdef TRAINER_HAS_OP_TIMES
        if (dist.nccl) { op_range("gradient all-reduce"); }   // its own op, not the backward's last
#endif
        dist_sum_floats(&dist, model.grads_mem, model.nparams);   // the whole step's gradient on every rank
        dist_sum_host(&dist, &loss, 1);
        loss /= accum;
        double norm = grad_norm(&model);   // after the sum: the same on every rank, and so is the update
        if (!isfinite(loss) || !isfinite(norm)) {   // stop before the update: the weights stay finite
            die("step %d: the %s is %g (loss %g, gradient norm %g); stopping before the update. %s%s. Lower -lr, or "
                "check the data and the checkpoint", step + 1, !isfinite(loss) ? "loss" : "gradient norm",
                !isfinite(loss) ? loss : norm, loss, norm,
                last_ckpt[0] ? "The newest checkpoint of this run is " : "This run saved no checkpoint",
                last_ckpt);
        }
        float gscale = args.clip > 0 && norm > args.clip ? (float)(args.clip / norm) : 1.0f;
        float lr = lr_at(step, args.steps, args.warmup, args.lr, args.lr_min_frac);
        adamw_update(&model, lr, args.beta1, args.beta2, args.eps, args.wd, gscale, step + 1);
#ifdef TRAINER_HAS_OP_TIMES
        op_times_on(0);   // val loss and samples are not timed, and leave no event in the next step
#endif
        device_sync();
        double ms = wall_ms() - t0;
        if (timed) { timed_ms += ms; timed_steps++; }
        double tok_s = args.total_batch / (ms / 1e3);
        printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s\n",
               step + 1, args.steps, loss, lr, norm, ms, tok_s);
        logger_train(&logger, step + 1, (float)loss, lr, (float)norm, ms, tok_s);

        if (check_every > 0 && (step + 1) % check_every == 0) {
            dist_check_same(&dist, model.params_mem, model.nparams * sizeof(*model.params_mem), "the parameters");
        }
        if (have_val && ((step + 1) % args.val_every == 0 || last)) {
            float vl = evaluate(&model, &val, args.val_batches, &dist);
            printf("step %5d | val loss %.6f\n", step + 1, vl);
            logger_val(&logger, step + 1, vl);
        }
        // the checkpoint first: a failure in anything optional after it (sampling) cannot lose it
        if (args.out_dir[0] != '\0' && ((args.ckpt_every > 0 && (step + 1) % args.ckpt_every == 0) || last)) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/ckpt_%06d.bin", args.out_dir, step + 1);
            CkptInfo info;
            memset(&info, 0, sizeof(info));
            info.content = CKPT_TRAIN; info.step = step + 1; info.shard = train.shard; info.pos = train.pos;
            info.rng = state.rng; info.elem = 4;
            model_save(&model, path, info);
            printf("saved %s\n", path);
            snprintf(last_ckpt, sizeof(last_ckpt), "%s", path);
        }
        if (rank0 && args.sample_every > 0 && ((step + 1) % args.sample_every == 0 || last)) {
            // each sample's draws come from the run's sampling state and the step alone, so a resumed
            // run (which saved that state before sampling) draws the same samples as an unbroken one
            uint64_t rng = state.rng ^ ((uint64_t)(step + 1) * 0x9E3779B97F4A7C15ull);
            model_sample(&model, have_tok ? &tokenizer : NULL, eot, args.sample_len, &rng);
        }
    }
    dist_check_same(&dist, model.params_mem, model.nparams * sizeof(*model.params_mem), "the final parameters");
#ifdef TRAINER_HAS_OP_TIMES
    if (args.op_times && rank0) { op_times_print(timed_steps > 0 ? timed_ms / timed_steps : 0); }
#endif
    device_finish(desc, sizeof(desc));   // before freeing, so it sees the memory in use
    logger_free(&logger);
    dataloader_free(&train);
    if (have_val) { dataloader_free(&val); }
    if (have_tok) { tokenizer_free(&tokenizer); }
    model_free(&model);
    dist_finish(&dist);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("done: %speak RSS %.1f MiB\n", desc, ru.ru_maxrss / 1024.0);
    return 0;
}
