// The training log, shared by both trainers: one line per event in DIR/log.txt,
//   step 12 train_loss 5.123456789 lr 3.0000e-04 grad_norm 1.2345 ms 812.3 tok_s 1260
//   step 50 val_loss 4.987654321
// Losses print with 9 significant digits, which round-trips a float32, so two
// logs agree line for line exactly when the runs agree bit for bit.
// dev/plot_loss.py draws these files.
#pragma once
#include "util.h"

typedef struct { FILE *f; } Logger;

// Open DIR/log.txt (no-op when dir is ""). A resumed run appends; a fresh run
// truncates.
static void logger_init(Logger *lg, const char *dir, int resuming) {
    lg->f = NULL;
    if (dir[0] == '\0') { return; }
    char path[4096];
    snprintf(path, sizeof(path), "%s/log.txt", dir);
    lg->f = fopen_check(path, resuming ? "a" : "w");
}

static void logger_train(Logger *lg, int step, float loss, float lr, float norm, double ms, double tok_s) {
    if (lg->f == NULL) { return; }
    fprintf(lg->f, "step %d train_loss %.9g lr %.4e grad_norm %.4f ms %.1f tok_s %.0f\n",
            step, loss, lr, norm, ms, tok_s);
    fflush(lg->f);
}

static void logger_val(Logger *lg, int step, float loss) {
    if (lg->f == NULL) { return; }
    fprintf(lg->f, "step %d val_loss %.9g\n", step, loss);
    fflush(lg->f);
}

static void logger_free(Logger *lg) { if (lg->f) { fclose(lg->f); } }
