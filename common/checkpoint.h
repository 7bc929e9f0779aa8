// Checkpoint files, shared by both trainers (SPEC section 7). Little-endian:
// a header of 256 int32, then tensors in the order of config.h's param enum.
//
//   [0] magic 0x5241484D (the bytes "MHAR")   [1] version: 2 (1: the same without [30])
//   [2] V  [3] Vp  [4] T  [5] L  [6] C  [7] NH  [8] NKV  [9] F
//   [10] residual mode (0 std, 1 mhar, 2 hc, 3 delta)  [11] H  [12] S  [13] HD
//   [14] content: 0 parameters, 1 parameters + AdamW m and v, 2 gradient dump
//   [15] optimizer steps done
//   [16] train shard  [18..19] token position in it (int64)  [20..21] sampling rng (uint64)
//   [24] bytes per tensor element: 4 (float32) or 8 (float64, gradient dumps of the test build)
//   [25] B  [26] T of the batch of a gradient dump  [27..28] its loss (float64)
//   [29] n, the hc streams (0 in other modes, and in files written before hc)
//   [30] CRC-32C (util.h) of the whole file, computed with this field read as 0
//
// After the header: the parameters; with content 1, then AdamW m, then v.
// Writers go through a temporary file (fsync'd) and rename it, so an
// interrupted save never destroys the previous checkpoint. Readers accept
// versions 1 and 2; they check every header field, the file size, the
// checksum (version 2), and that every stored value is finite; writers refuse
// to save a non-finite value.
#pragma once
#include "config.h"

#define CKPT_MAGIC 0x5241484D
#define CKPT_VERSION 2
#define CKPT_CRC_INT 30   // header int holding the checksum (version 2)
#define CKPT_HEADER_INTS 256
enum { CKPT_PARAMS = 0, CKPT_TRAIN = 1, CKPT_GRADS = 2 };

typedef struct {
    int content;        // CKPT_PARAMS, CKPT_TRAIN or CKPT_GRADS
    int step;           // optimizer steps done
    int shard;          // train loader position: shard index ...
    long long pos;      // ... and token index in it
    uint64_t rng;       // sampling rng state
    int elem;           // bytes per element: 4 or 8
    int B, T;           // batch of a gradient dump
    double loss;        // loss of a gradient dump
    int convert;        // in, for ckpt_load: 1 converts a std checkpoint into the delta model
                        // being loaded (-init_from, SPEC section 9); not stored in files
} CkptInfo;

static void ckpt_header_make(int h[CKPT_HEADER_INTS], const Config *c, const CkptInfo *in) {
    memset(h, 0, CKPT_HEADER_INTS * sizeof(int));
    h[0] = CKPT_MAGIC; h[1] = CKPT_VERSION;
    h[2] = c->V; h[3] = c->Vp; h[4] = c->T; h[5] = c->L; h[6] = c->C; h[7] = c->NH;
    h[8] = c->NKV; h[9] = c->F; h[10] = c->mode; h[11] = c->H; h[12] = c->S; h[13] = c->HD;
    h[14] = in->content; h[15] = in->step; h[16] = in->shard;
    memcpy(&h[18], &in->pos, 8);
    memcpy(&h[20], &in->rng, 8);
    h[24] = in->elem; h[25] = in->B; h[26] = in->T;
    memcpy(&h[27], &in->loss, 8);
    h[29] = c->n;
}

// Read the header ints of path and its size in bytes; dies unless it has a whole header.
static void ckpt_read_header(const char *path, int h[CKPT_HEADER_INTS], long long *bytes) {
    if (is_directory(path)) { die("%s is a directory, not a checkpoint file; give the path of a ckpt_*.bin", path); }
    FILE *f = fopen_check(path, "rb");
    size_t got = fread(h, sizeof(int), CKPT_HEADER_INTS, f);
    struct stat st;
    int ok = fstat(fileno(f), &st) == 0;
    fclose(f);
    if (got != CKPT_HEADER_INTS) {
        die("%s is shorter than a checkpoint header (1024 bytes); it is not an MHAR checkpoint", path);
    }
    if (!ok) { die("cannot stat %s: %s", path, strerror(errno)); }
    *bytes = (long long)st.st_size;
}

// The tensor and copy that the k-th stored value belongs to, for error messages.
static void ckpt_locate(const Config *c, int content, size_t k, const char **copy, const char **tensor, size_t *index) {
    size_t sizes[NUM_PARAM_TENSORS], n = param_count(c);
    param_sizes(c, sizes);
    const char *copies[3] = {"parameter", "AdamW m", "AdamW v"};
    *copy = content == CKPT_GRADS ? "gradient" : copies[k / n];
    k %= n;
    int i = 0;
    while (i < NUM_PARAM_TENSORS - 1 && k >= sizes[i]) { k -= sizes[i]; i++; }
    *tensor = param_names[i];
    *index = k;
}

// One pass over a checkpoint file: its CRC-32C (with header int [30] read as
// 0) and the first non-finite value of its tensors (elem-byte floats after the
// header). Returns the CRC; *bad is the index of the first non-finite value, or
// SIZE_MAX. Dies naming path when the file cannot be read.
static uint32_t ckpt_scan(FILE *f, const char *path, int elem, size_t *bad) {
    struct stat st;
    size_t chunk = 1 << 20;   // a multiple of 8, so no value straddles two chunks
    if (fstat(fileno(f), &st) == 0 && (size_t)st.st_size < chunk) { chunk = ((size_t)st.st_size + 8) / 8 * 8; }
    unsigned char *buf = (unsigned char *)malloc(chunk);
    if (buf == NULL) { fclose(f); die("out of memory reading %s", path); }
    uint32_t crc = 0;
    size_t off = 0, got;
    *bad = SIZE_MAX;
    rewind(f);
    while ((got = fread(buf, 1, chunk, f)) > 0) {
        if (off == 0) {
            if (got < CKPT_HEADER_INTS * sizeof(int)) { break; }
            memset(buf + CKPT_CRC_INT * sizeof(int), 0, sizeof(int));
        }
        crc = crc32c_update(crc, buf, got);
        size_t from = off == 0 ? CKPT_HEADER_INTS * sizeof(int) : 0;
        for (size_t b = from; *bad == SIZE_MAX && b + elem <= got; b += elem) {
            double x;
            if (elem == 4) { float v; memcpy(&v, buf + b, 4); x = v; } else { memcpy(&x, buf + b, 8); }
            if (!isfinite(x)) { *bad = (off + b - CKPT_HEADER_INTS * sizeof(int)) / elem; }
        }
        off += got;
    }
    int err = ferror(f);
    free(buf);
    if (err) { fclose(f); die("cannot read %s: %s", path, strerror(errno)); }
    return crc;
}

// Open a checkpoint for reading: checks magic, version, every header field,
// the file size, the checksum and that every value is finite, and returns the
// config and info it records. The stream is left at the tensors. No file is
// open while it checks, so a failed check leaks nothing (the fuzz build).
static FILE *ckpt_open_read(const char *path, Config *c, CkptInfo *in) {
    int h[CKPT_HEADER_INTS];
    long long bytes;
    ckpt_read_header(path, h, &bytes);
    if (h[0] != CKPT_MAGIC) {
        die("%s has magic 0x%08x, not 0x%08x: it is not an MHAR checkpoint", path, (unsigned)h[0], CKPT_MAGIC);
    }
    if (h[1] != 1 && h[1] != CKPT_VERSION) {
        die("%s is checkpoint version %d; this build reads versions 1 and %d", path, h[1], CKPT_VERSION);
    }
    memset(c, 0, sizeof(*c));
    c->V = h[2]; c->T = h[4]; c->L = h[5]; c->C = h[6]; c->NH = h[7]; c->NKV = h[8]; c->F = h[9];
    c->mode = h[10]; c->H = h[11]; c->S = h[12]; c->n = h[29];
    config_finalize(c, path);
    if (c->Vp != h[3] || c->HD != h[13]) { die("%s: header fields Vp/HD disagree with its shape; the file is corrupt", path); }
    memset(in, 0, sizeof(*in));
    in->content = h[14]; in->step = h[15]; in->shard = h[16];
    memcpy(&in->pos, &h[18], 8);
    memcpy(&in->rng, &h[20], 8);
    in->elem = h[24]; in->B = h[25]; in->T = h[26];
    memcpy(&in->loss, &h[27], 8);
    if (in->content < 0 || in->content > 2 || (in->elem != 4 && in->elem != 8)) {
        die("%s: content %d / element size %d in the header are invalid; the file is corrupt", path, in->content, in->elem);
    }
    if (in->step < 0 || in->step == INT_MAX || in->shard < 0 || in->pos < 0) {
        die("%s: header step %d / data position (shard %d, token %lld) are invalid (must be >= 0); the file is corrupt",
            path, in->step, in->shard, in->pos);
    }
    if (in->content == CKPT_GRADS &&
        (in->B < 1 || in->T < 1 || in->T > c->T || (long long)in->B * in->T > INT_MAX / 2 || !isfinite(in->loss))) {
        die("%s: gradient dump with batch B=%d T=%d (T at most %d) and loss %g is invalid; the file is corrupt",
            path, in->B, in->T, c->T, in->loss);
    }
    size_t copies = in->content == CKPT_TRAIN ? 3 : 1;
    long long want = (long long)sizeof(int) * CKPT_HEADER_INTS + (long long)(param_count(c) * copies * in->elem);
    if (bytes != want) {
        die("%s is %lld bytes but its config needs %lld: the file is truncated or corrupt", path, bytes, want);
    }
    FILE *f = fopen_check(path, "rb");
    size_t bad;
    uint32_t crc = ckpt_scan(f, path, in->elem, &bad);
    if (h[1] >= 2 && crc != (uint32_t)h[CKPT_CRC_INT]) {
        fclose(f);
        die("%s: checksum mismatch (header 0x%08x, contents 0x%08x): the file is corrupt; use an earlier checkpoint",
            path, (unsigned)h[CKPT_CRC_INT], crc);
    }
    if (bad != SIZE_MAX) {
        const char *copy, *tensor;
        size_t index;
        ckpt_locate(c, in->content, bad, &copy, &tensor, &index);
        fclose(f);
        die("%s: %s tensor %s holds a non-finite value at element %zu; the run that saved it diverged or the file "
            "is corrupt; use an earlier checkpoint", path, copy, tensor, index);
    }
    if (fseek(f, (long)sizeof(int) * CKPT_HEADER_INTS, SEEK_SET) != 0) {
        fclose(f);
        die("cannot seek in %s: %s", path, strerror(errno));
    }
    return f;
}

// Die unless the checkpoint's config equals the run's, naming the first field that differs.
static void ckpt_check_config(const char *path, const Config *file, const Config *run) {
    const char *names[] = {"V", "T", "L", "C", "NH", "NKV", "F", "residual mode", "H", "S", "hc_n"};
    int a[] = {file->V, file->T, file->L, file->C, file->NH, file->NKV, file->F, file->mode, file->H, file->S, file->n};
    int b[] = {run->V, run->T, run->L, run->C, run->NH, run->NKV, run->F, run->mode, run->H, run->S, run->n};
    for (int i = 0; i < 11; i++) {
        if (a[i] != b[i]) {
            die("%s was saved with %s=%d but this run has %s=%d; give the same model flags as the "
                "run that saved it, or start without -resume", path, names[i], a[i], names[i], b[i]);
        }
    }
}

// Die unless a checkpoint can be converted into the run's model (delta, or std
// for the control's restart): it must be std, with the same shape as the run's flags.
static void ckpt_check_convert(const char *path, const Config *file, const Config *run) {
    if (file->mode != RES_STD) {
        die("%s is a %s checkpoint (residual mode %d); -init_from converts a std checkpoint "
            "(one trained with -r std)", path, config_mode_name(file), file->mode);
    }
    if (run->mode != RES_DELTA && run->mode != RES_STD) {
        die("internal: converting %s into a %s model", path, config_mode_name(run));
    }
    const char *names[] = {"V", "T", "L", "C", "NH", "NKV", "F"};
    int a[] = {file->V, file->T, file->L, file->C, file->NH, file->NKV, file->F};
    int b[] = {run->V, run->T, run->L, run->C, run->NH, run->NKV, run->F};
    for (int i = 0; i < 7; i++) {
        if (a[i] != b[i]) {
            die("%s was saved with %s=%d but this run has %s=%d; give -init_from the std run's shape "
                "flags (-preset -L -C -NH -NKV -F -T -V)", path, names[i], a[i], names[i], b[i]);
        }
    }
}

// Start writing path: returns a stream on path.tmp (name in tmp, >= 4096 chars),
// open for reading too (ckpt_end_write reads it back for the checksum).
static FILE *ckpt_begin_write(const char *path, char *tmp) {
    snprintf(tmp, 4096, "%s.tmp", path);
    return fopen_check(tmp, "w+b");
}

// Finish writing: read the file back for its checksum and to check that every
// value is finite (else remove it and die: a diverged run keeps its last good
// checkpoint), store the checksum in the header, fsync, and atomically move
// path.tmp over path (and fsync the directory, so the rename survives a crash).
static void ckpt_end_write(FILE *f, const char *tmp, const char *path, const Config *cfg, const CkptInfo *info) {
    if (fflush(f) != 0 || ferror(f)) {
        fclose(f); remove(tmp);
        die("writing %s failed: %s (disk full?)", tmp, strerror(errno));
    }
    size_t bad;
    uint32_t crc = ckpt_scan(f, tmp, info->elem, &bad);
    if (bad != SIZE_MAX) {
        const char *copy, *tensor;
        size_t index;
        ckpt_locate(cfg, info->content, bad, &copy, &tensor, &index);
        fclose(f); remove(tmp);
        die("not saving %s at step %d: %s tensor %s holds a non-finite value at element %zu (the run diverged); "
            "the newest checkpoint before it is intact", path, info->step, copy, tensor, index);
    }
    int32_t v = (int32_t)crc;
    if (fseek(f, CKPT_CRC_INT * (long)sizeof(int), SEEK_SET) != 0 || fwrite(&v, sizeof(v), 1, f) != 1) {
        fclose(f); remove(tmp);
        die("cannot write the checksum of %s: %s", tmp, strerror(errno));
    }
    fsync_check(f, tmp);
    fclose(f);
    if (rename(tmp, path) != 0) { die("cannot rename %s to %s: %s", tmp, path, strerror(errno)); }
    fsync_parent_dir(path);
}

// How a trainer moves n of its tensor values to or from a file as elem-byte
// floats (4 or 8): from host reals in train_mhar.c, from device floats in
// train_mhar.cu. x is the trainer's array, path the file named in errors.
typedef void (*CkptWriteFn)(FILE *f, const void *x, size_t n, int elem, const char *path);
typedef void (*CkptReadFn)(FILE *f, void *x, size_t n, int elem, const char *path);

// Save a model of config cfg with n parameters to path, via path.tmp and a
// rename: its parameters (content CKPT_PARAMS), its parameters then AdamW m
// then v (CKPT_TRAIN), or its gradients (CKPT_GRADS: pass them as params).
// info.elem 0 means 4. The arrays are the trainer's; wr moves them.
static void ckpt_save(const char *path, const Config *cfg, CkptInfo info, size_t n, const void *params,
                      const void *adam_m, const void *adam_v, CkptWriteFn wr) {
    char tmp[4096];
    FILE *f = ckpt_begin_write(path, tmp);
    int header[CKPT_HEADER_INTS];
    if (info.elem == 0) { info.elem = 4; }
    ckpt_header_make(header, cfg, &info);
    fwrite_check(header, sizeof(int), CKPT_HEADER_INTS, f, tmp);
    wr(f, params, n, info.elem, tmp);
    if (info.content == CKPT_TRAIN) {
        if (adam_m == NULL) { die("internal: saving optimizer state before the first step"); }
        wr(f, adam_m, n, info.elem, tmp);
        wr(f, adam_v, n, info.elem, tmp);
    }
    ckpt_end_write(f, tmp, path, cfg, &info);
}

// Load path into a model of config cfg with n parameters (dies on any
// mismatch, and on a gradient dump): the parameters, and AdamW m and v when
// the file has them, into *adam_m and *adam_v, which alloc (n zeroed values
// in the trainer's memory) makes first where they are NULL.
// With info->convert set (-init_from), path is a std checkpoint and cfg a delta
// (or, for the control's restart, std) model of its shape: the std tensors come first in delta's layout, in the same
// order (config.h; std stores no routing tensors), so the file's parameters
// fill the front of params and delta's new tensors keep the values the model
// was built with (their init); AdamW state is not read (it starts from zero).
static void ckpt_load(const char *path, const Config *cfg, CkptInfo *info, size_t n, void *params,
                      void **adam_m, void **adam_v, CkptReadFn rd, void *(*alloc)(size_t n)) {
    Config fc;
    int convert = info->convert;
    FILE *f = ckpt_open_read(path, &fc, info);
    info->convert = convert;
    if (info->content == CKPT_GRADS) { die("%s is a gradient dump, not a checkpoint", path); }
    if (convert) {
        ckpt_check_convert(path, &fc, cfg);
        size_t sizes[NUM_PARAM_TENSORS], front = 0;
        param_sizes(cfg, sizes);
        for (int i = 0; i < NUM_PARAM_TENSORS && !param_is_new(cfg, i); i++) { front += sizes[i]; }
        if (front != param_count(&fc) || front > n) {
            die("internal: %s holds %zu std parameters, the delta model's std tensors %zu", path, param_count(&fc), front);
        }
        rd(f, params, front, info->elem, path);
        fclose(f);
        return;
    }
    ckpt_check_config(path, &fc, cfg);
    rd(f, params, n, info->elem, path);
    if (info->content == CKPT_TRAIN) {
        if (*adam_m == NULL) { *adam_m = alloc(n); }
        if (*adam_v == NULL) { *adam_v = alloc(n); }
        rd(f, *adam_m, n, info->elem, path);
        rd(f, *adam_v, n, info->elem, path);
    }
    fclose(f);
}
