// Small helpers shared by train_mhar.c and train_mhar.cu: fatal errors,
// checked file and memory calls, wall-clock time. Header-only; C99 and C++.
#pragma once
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// Print one line "error: ..." to stderr and exit with status 1.
// Every message should name the file or flag, the bad value and the fix.
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static FILE *fopen_check(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (f == NULL) {
        die("cannot open %s for %s: %s", path, mode[0] == 'r' ? "reading" : "writing",
            strerror(errno));
    }
    return f;
}

// fread that dies with the file name when the file is shorter than expected
static void fread_check(void *dst, size_t size, size_t count, FILE *f, const char *path) {
    if (fread(dst, size, count, f) != count) {
        die("%s is truncated or unreadable (expected %zu more bytes); re-create the file",
            path, size * count);
    }
}

static void fwrite_check(const void *src, size_t size, size_t count, FILE *f, const char *path) {
    if (fwrite(src, size, count, f) != count) {
        die("cannot write %zu bytes to %s: %s (disk full?)", size * count, path, strerror(errno));
    }
}

static void *malloc_check(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) { die("out of memory allocating %zu bytes", bytes); }
    return p;
}

static void *calloc_check(size_t count, size_t size) {
    void *p = calloc(count > 0 ? count : 1, size > 0 ? size : 1);
    if (p == NULL) { die("out of memory allocating %zu bytes", count * size); }
    return p;
}

// monotonic wall clock in milliseconds
static double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// xorshift* random numbers: the same sequence on every platform, so runs are reproducible
static uint32_t rng_u32(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}
// uniform in [0, 1)
static float rng_f32(uint64_t *state) { return (rng_u32(state) >> 8) / 16777216.0f; }
// standard normal (Box-Muller), computed in double for accuracy
static double rng_normal(uint64_t *state) {
    double u1 = (rng_u32(state) + 1.0) / 4294967297.0;
    double u2 = rng_u32(state) / 4294967296.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// mkdir -p: create dir and any missing parents; dies naming the path on failure
#include <sys/stat.h>
static void mkdir_p(const char *dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s", dir);
    for (char *p = path + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char keep = *p;
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                die("cannot create directory %s: %s (-o)", path, strerror(errno));
            }
            *p = keep;
            if (keep == '\0') { break; }
        }
    }
}
