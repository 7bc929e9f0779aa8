// Small helpers shared by train_mhar.c and train_mhar.cu: fatal errors,
// checked file and memory calls, wall-clock time. Header-only; C99 and C++.
#pragma once
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

// How a fatal error ends the process. The fuzz build (-DMHAR_FUZZ, dev/fuzz/)
// jumps back to its harness instead, so that one bad input does not end the
// fuzzing; the readers close their files before dying, so nothing but a few
// small allocations is left behind on that path.
#ifdef MHAR_FUZZ
#include <setjmp.h>
static jmp_buf mhar_fuzz_jmp;
#define MHAR_EXIT(code) longjmp(mhar_fuzz_jmp, 1)
#else
#define MHAR_EXIT(code) exit(code)
#endif

// Print one line "error: ..." to stderr and exit with status 1.
// Every message should name the file or flag, the bad value and the fix.
static void die(const char *fmt, ...) {
#ifndef MHAR_FUZZ
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
#else
    (void)fmt;
#endif
    MHAR_EXIT(1);
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

// ---------------------------------------------------------------------------
// Strict number parsing for flags: the whole string must be the number, with
// no fraction, exponent or overflow for integers, and a finite value for reals.
// Every error names the flag, the value and the allowed range.

static long long parse_int_flag(const char *flag, const char *v, long long lo, long long hi) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != '\0') {
        die("-%s '%s' is not a whole number; give an integer from %lld to %lld", flag, v, lo, hi);
    }
    if (errno == ERANGE || x < lo || x > hi) {
        die("-%s %s is out of range; give an integer from %lld to %lld", flag, v, lo, hi);
    }
    return x;
}

static unsigned long long parse_u64_flag(const char *flag, const char *v) {
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end != '\0' || v[0] == '-' || errno == ERANGE) {
        die("-%s '%s' is not an integer from 0 to 18446744073709551615", flag, v);
    }
    return x;
}

// A finite real in [lo, hi]; lo_open / hi_open make that end exclusive; hi >= 1e30 means no upper bound.
static double parse_real_flag(const char *flag, const char *v, double lo, int lo_open, double hi, int hi_open) {
    char range[96];
    if (hi >= 1e30) { snprintf(range, sizeof(range), "%s%g, inf)", lo_open ? "(" : "[", lo); }
    else { snprintf(range, sizeof(range), "%s%g, %g%s", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]"); }
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || !isfinite(x)) {
        die("-%s '%s' is not a finite number; give a value in %s", flag, v, range);
    }
    if (x < lo || (lo_open && x == lo) || x > hi || (hi_open && x == hi)) {
        die("-%s %s is out of range; give a value in %s", flag, v, range);
    }
    return x;
}

// ---------------------------------------------------------------------------
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, the checksum of iSCSI
// and ext4), used by the checkpoint format. crc32c_update(0, data, n) is the
// CRC of data; pass the previous result to continue over more bytes.
// Table-driven, 8 bytes at a time; the SSE4.2 instruction where the compiler
// targets it. crc32c_update(0, "123456789", 9) == 0xE3069283.

static uint32_t crc32c_table[8][256];
static int crc32c_ready = 0;

static void crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) { c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1; }
        crc32c_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++) {
        for (int i = 0; i < 256; i++) {
            uint32_t c = crc32c_table[t - 1][i];
            crc32c_table[t][i] = (c >> 8) ^ crc32c_table[0][c & 0xff];
        }
    }
    crc32c_ready = 1;
}

#if defined(__SSE4_2__) && defined(__x86_64__)
#include <nmmintrin.h>
#endif

// the portable path: 8 bytes a step through the 8 tables
static uint32_t crc32c_update_table(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    uint32_t c = ~crc;
    if (!crc32c_ready) { crc32c_init(); }
    for (; n >= 8; n -= 8, p += 8) {   // the word is read little-endian, as the tables expect
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc32c_table[7][lo & 0xff] ^ crc32c_table[6][(lo >> 8) & 0xff] ^ crc32c_table[5][(lo >> 16) & 0xff] ^
            crc32c_table[4][lo >> 24] ^ crc32c_table[3][p[4]] ^ crc32c_table[2][p[5]] ^ crc32c_table[1][p[6]] ^
            crc32c_table[0][p[7]];
    }
    for (; n > 0; n--, p++) { c = (c >> 8) ^ crc32c_table[0][(c ^ *p) & 0xff]; }
    return ~c;
}

static uint32_t crc32c_update(uint32_t crc, const void *data, size_t n) {
#if defined(__SSE4_2__) && defined(__x86_64__)
    const unsigned char *p = (const unsigned char *)data;
    uint64_t c = ~crc & 0xffffffffu;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
    }
    for (; n > 0; n--, p++) { c = _mm_crc32_u8((uint32_t)c, *p); }
    return ~(uint32_t)c;
#else
    return crc32c_update_table(crc, data, n);
#endif
}

// ---------------------------------------------------------------------------
// Durable files: flush a stream to the disk, and make a rename in dir durable.

static void fsync_check(FILE *f, const char *path) {
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0) {
        die("writing %s failed: %s (disk full?)", path, strerror(errno));
    }
}

// fsync the directory that holds path, so that a rename into it survives a crash
static void fsync_parent_dir(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) { snprintf(dir, sizeof(dir), "."); }
    else if (slash == dir) { dir[1] = '\0'; }
    else { *slash = '\0'; }
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) { (void)fsync(fd); close(fd); }   // best effort: some file systems refuse it
}

// 1 when path is a directory
static int is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
