/*
data_prep/tokenize: text files -> GPT-2 token shards (SPEC section 7) and the
project's tokenizer file.

  data_prep/tokenize -o data/tiny --sections --section-blank-lines 3 data/raw/moby_dick/moby_dick.txt

Inputs are files, or directories walked recursively for files whose name
matches --pattern. Each file is a document, or with --sections each run of
non-blank lines between blank lines is. Every document is written as EOT
followed by its tokens (so EOT also starts each shard stream). Documents go to
the train or the val split by their index (see val_document), and each split
is cut into shards of --shard-tokens tokens (the last one shorter):

  DIR/NAME_val_000000.bin, DIR/NAME_train_000000.bin, DIR/NAME_train_000001.bin, ...

Shard layout (llm.c's): 256 int32 header {20240520, 1, token count, 0...},
then the tokens as uint16, little-endian. All outputs are written to temporary
files and renamed into place only when the whole run succeeded.

Work is split by document over all cores (OpenMP); the output does not depend
on the number of threads. Run with --help for every flag.
*/
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bpe.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define TOKENIZER_MAGIC 0x4B54484D // "MHTK" in the file
#define TOKENIZER_VERSION 1
#define HEADER_INTS 256
#define BATCH_BYTES ((size_t)16 << 20) // text tokenized between two writes
#define SHARD_BUF ((size_t)1 << 16)       // tokens converted to uint16 at a time

// ----------------------------------------------------------------------------
// options

typedef struct {
    const char *out_dir;
    const char *name;
    const char *vocab;
    const char *tokenizer_out; // NULL: DIR/tokenizer.bin; "none": skip
    const char **patterns;
    size_t n_patterns;
    int sections;
    size_t section_blank_lines;
    double val_fraction;
    size_t shard_tokens;
    int threads;
    size_t max_docs, max_bytes; // 0 = no limit
    long long shuffle_seed;     // -1 = keep the sorted input order
    int quiet;
    const char **inputs;
    size_t n_inputs;
} Options;

// prints the usage text (every flag) to f
static void usage(FILE *f) {
    fprintf(f,
        "usage: data_prep/tokenize -o DIR [options] INPUT...\n"
        "Turns text into GPT-2 token shards (llm.c layout) and writes the tokenizer file.\n"
        "INPUT is a file, or a directory walked recursively for files matching --pattern\n"
        "(sorted by path; symbolic links met while walking are skipped).\n"
        "\n"
        "  -o, --out-dir DIR           directory for the shards (created if missing; required)\n"
        "  --name NAME                 shard name prefix (default: data): DIR/NAME_{train,val}_NNNNNN.bin\n"
        "  --vocab PATH                tiktoken rank file (default: data/vocab/r50k_base.tiktoken,\n"
        "                              fetched by `data_prep/fetch.sh vocab`)\n"
        "  --tokenizer-out PATH        where to write the tokenizer file (default: DIR/tokenizer.bin;\n"
        "                              'none' to skip)\n"
        "  --pattern GLOB              file name pattern for directory inputs, matched against the\n"
        "                              base name (repeatable, default: '*'), e.g. --pattern '*.c'\n"
        "  --sections                  documents are runs of non-blank lines separated by blank lines\n"
        "                              (default: each file is one document)\n"
        "  --section-blank-lines N     how many consecutive blank lines separate two documents with\n"
        "                              --sections (default: 1); shorter runs stay inside a document\n"
        "  --val-fraction F            fraction of documents in the val split, 0 <= F <= 1 (default: 0.1):\n"
        "                              document i (0-based, input order) is val when\n"
        "                              floor((i+1)*F) > floor(i*F)\n"
        "  --shard-tokens N            tokens per shard, the last shard of a split is shorter\n"
        "                              (default: 100000000)\n"
        "  --threads N                 threads (default: all cores)\n"
        "  --max-docs N                stop after N documents (default: all)\n"
        "  --max-bytes N               stop after the document that reaches N bytes of text (default: all)\n"
        "  --shuffle SEED              put the input files in a random order fixed by SEED (default: sorted\n"
        "                              path order); trainers read shards front to back, so a source tree\n"
        "                              in path order would reach them one directory at a time\n"
        "  -q, --quiet                 no progress lines on stderr\n"
        "  -h, --help                  this text\n");
}

// one-line error about a bad flag value, then exit
static void flag_error(const char *flag, const char *value, const char *fix) {
    fprintf(stderr, "error: bad value '%s' for %s; %s (see data_prep/tokenize --help)\n", value, flag, fix);
    exit(1);
}

// parses a non-negative integer flag value (digits only)
static size_t parse_size(const char *flag, const char *v) {
    if (!v || !*v) flag_error(flag, v ? v : "", "give a whole number");
    size_t x = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9') flag_error(flag, v, "give a whole number");
        if (x > (SIZE_MAX - 9) / 10) flag_error(flag, v, "the number is too large");
        x = x * 10 + (size_t)(*c - '0');
    }
    return x;
}

// reads argv into opt; exits with a one-line error on anything wrong
static void parse_args(int argc, char **argv, Options *opt) {
    memset(opt, 0, sizeof(*opt));
    opt->name = "data";
    opt->vocab = "data/vocab/r50k_base.tiktoken";
    opt->section_blank_lines = 1;
    opt->val_fraction = 0.1;
    opt->shard_tokens = 100000000;
    opt->threads = omp_get_num_procs();
    opt->shuffle_seed = -1;
    opt->patterns = (const char **)calloc((size_t)argc, sizeof(char *));
    opt->inputs = (const char **)calloc((size_t)argc, sizeof(char *));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        // flags that take a value
        const char *v = (i + 1 < argc) ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "-o") || !strcmp(a, "--out-dir")) opt->out_dir = v;
        else if (!strcmp(a, "--name")) opt->name = v;
        else if (!strcmp(a, "--vocab")) opt->vocab = v;
        else if (!strcmp(a, "--shuffle")) {
            char *e = NULL;
            opt->shuffle_seed = v ? strtoll(v, &e, 10) : -1;
            if (!v || e == v || *e || opt->shuffle_seed < 0) flag_error("--shuffle", v ? v : "(none)", "give a seed >= 0");
        }
        else if (!strcmp(a, "--tokenizer-out")) opt->tokenizer_out = v;
        else if (!strcmp(a, "--pattern")) { if (v) opt->patterns[opt->n_patterns++] = v; }
        else if (!strcmp(a, "--section-blank-lines")) opt->section_blank_lines = parse_size(a, v);
        else if (!strcmp(a, "--val-fraction")) {
            char *e = NULL;
            opt->val_fraction = v ? strtod(v, &e) : -1;
            if (!v || e == v || *e || !(opt->val_fraction >= 0 && opt->val_fraction <= 1))
                flag_error(a, v ? v : "", "give a number from 0 to 1");
        }
        else if (!strcmp(a, "--shard-tokens")) opt->shard_tokens = parse_size(a, v);
        else if (!strcmp(a, "--threads")) opt->threads = (int)parse_size(a, v);
        else if (!strcmp(a, "--max-docs")) opt->max_docs = parse_size(a, v);
        else if (!strcmp(a, "--max-bytes")) opt->max_bytes = parse_size(a, v);
        else {
            takes = 0;
            if (!strcmp(a, "--sections")) opt->sections = 1;
            else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) opt->quiet = 1;
            else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
            else if (a[0] == '-' && a[1] != '\0') {
                fprintf(stderr, "error: unknown flag %s; see data_prep/tokenize --help\n", a);
                exit(1);
            } else opt->inputs[opt->n_inputs++] = a;
        }
        if (takes) {
            if (!v) { fprintf(stderr, "error: flag %s needs a value; see data_prep/tokenize --help\n", a); exit(1); }
            i++;
        }
    }
    if (!opt->out_dir) { fprintf(stderr, "error: no output directory; fix: pass -o DIR (see --help)\n"); exit(1); }
    if (opt->n_inputs == 0) { fprintf(stderr, "error: no input files; fix: name files or directories after the flags (see --help)\n"); exit(1); }
    if (opt->shard_tokens == 0 || opt->shard_tokens > INT32_MAX) flag_error("--shard-tokens", "0 or > 2147483647", "give 1 to 2147483647 (the header stores an int32)");
    if (opt->section_blank_lines == 0) flag_error("--section-blank-lines", "0", "give 1 or more");
    if (opt->threads < 1) flag_error("--threads", "0", "give 1 or more");
    if (!*opt->name || strchr(opt->name, '/')) flag_error("--name", opt->name, "give a plain file name prefix without '/'");
    if (opt->n_patterns == 0) opt->patterns[opt->n_patterns++] = "*";
}

// ----------------------------------------------------------------------------
// input files

typedef struct {
    char **paths;
    size_t *sizes;
    size_t n, cap;
    size_t total_bytes;
} FileList;

// appends a file to the list
static void filelist_add(FileList *fl, const char *path, size_t size) {
    if (fl->n == fl->cap) {
        fl->cap = fl->cap ? 2 * fl->cap : 256;
        fl->paths = (char **)realloc(fl->paths, fl->cap * sizeof(char *));
        fl->sizes = (size_t *)realloc(fl->sizes, fl->cap * sizeof(size_t));
        if (!fl->paths || !fl->sizes) { fprintf(stderr, "error: out of memory listing files\n"); exit(1); }
    }
    fl->paths[fl->n] = strdup(path);
    fl->sizes[fl->n] = size;
    fl->n++;
    fl->total_bytes += size;
}

// qsort comparison of C strings by bytes (no locale, so the order is the same everywhere)
static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// true if the base name of path matches one of the patterns
static int name_matches(const Options *opt, const char *base) {
    for (size_t i = 0; i < opt->n_patterns; i++)
        if (fnmatch(opt->patterns[i], base, 0) == 0) return 1;
    return 0;
}

// adds the matching regular files under dir, recursively, in sorted (byte) order
static void walk_dir(const Options *opt, const char *dir, FileList *fl) {
    DIR *d = opendir(dir);
    if (!d) { fprintf(stderr, "error: cannot read directory %s: %s; fix: check the path and its permissions\n", dir, strerror(errno)); exit(1); }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n == cap) { cap = cap ? 2 * cap : 64; names = (char **)realloc(names, cap * sizeof(char *)); }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof(char *), cmp_str);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        char *path = (char *)malloc(len);
        snprintf(path, len, "%s/%s", dir, names[i]);
        struct stat st; // lstat: symbolic links met while walking are skipped (no loops, no duplicates)
        if (lstat(path, &st) == 0) {
            if (S_ISDIR(st.st_mode)) walk_dir(opt, path, fl);
            else if (S_ISREG(st.st_mode) && name_matches(opt, names[i])) filelist_add(fl, path, (size_t)st.st_size);
        }
        free(path);
        free(names[i]);
    }
    free(names);
}

// turns the INPUT arguments into the ordered list of files; exits on a missing input
static void collect_inputs(const Options *opt, FileList *fl) {
    memset(fl, 0, sizeof(*fl));
    for (size_t i = 0; i < opt->n_inputs; i++) {
        const char *in = opt->inputs[i];
        struct stat st;
        if (stat(in, &st) != 0) {
            fprintf(stderr, "error: input %s: %s; fix: check the path (for the corpora: data_prep/fetch.sh tiny|medium|large)\n", in, strerror(errno));
            exit(1);
        }
        if (S_ISDIR(st.st_mode)) {
            size_t before = fl->n;
            walk_dir(opt, in, fl);
            if (fl->n == before) {
                fprintf(stderr, "error: input directory %s has no files matching --pattern %s%s; fix: check the directory or the patterns\n",
                        in, opt->patterns[0], opt->n_patterns > 1 ? " (and others)" : "");
                exit(1);
            }
        } else if (S_ISREG(st.st_mode)) {
            filelist_add(fl, in, (size_t)st.st_size);
        } else {
            fprintf(stderr, "error: input %s is not a regular file or directory; fix: pass text files or directories\n", in);
            exit(1);
        }
    }
}

// Puts the files in a random order fixed by the seed (Fisher-Yates with xorshift).
// A trainer reads shards front to back, so documents in path order would feed it
// one part of a source tree at a time; shuffled, every stretch of a shard is a
// sample of the whole corpus, and the val split is a random sample too.
static void shuffle_files(FileList *fl, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (size_t i = fl->n; i > 1; i--) {
        x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
        size_t j = (size_t)((x * 0x2545F4914F6CDD1Dull) % i);
        char *p = fl->paths[i - 1]; fl->paths[i - 1] = fl->paths[j]; fl->paths[j] = p;
        size_t s = fl->sizes[i - 1]; fl->sizes[i - 1] = fl->sizes[j]; fl->sizes[j] = s;
    }
}

// reads a whole file into memory; exits with a clear line on failure
static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "error: cannot open input %s: %s; fix: check the file and its permissions\n", path, strerror(errno)); exit(1); }
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = (unsigned char *)malloc(cap);
    for (;;) {
        if (n == cap) { cap *= 2; buf = (unsigned char *)realloc(buf, cap); }
        if (!buf) { fprintf(stderr, "error: out of memory reading %s\n", path); exit(1); }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) { fprintf(stderr, "error: reading input %s failed; fix: check the file and the disk\n", path); exit(1); }
    fclose(f);
    *len = n;
    return buf;
}

// ----------------------------------------------------------------------------
// documents

typedef struct {
    const unsigned char *text;
    size_t len;
    TokenBuf tokens; // EOT then the document's tokens, filled by a worker
} Doc;

typedef struct {
    Doc *docs;
    size_t n, cap;
} DocList;

// appends a document (a view into a file's buffer)
static void doclist_add(DocList *dl, const unsigned char *text, size_t len) {
    if (dl->n == dl->cap) {
        dl->cap = dl->cap ? 2 * dl->cap : 1024;
        dl->docs = (Doc *)realloc(dl->docs, dl->cap * sizeof(Doc));
        if (!dl->docs) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    }
    Doc *d = &dl->docs[dl->n++];
    memset(d, 0, sizeof(*d));
    d->text = text;
    d->len = len;
}

// true if line [s, e) (without its '\n') holds only spaces, tabs and '\r'
static int blank_line(const unsigned char *s, const unsigned char *e) {
    for (; s < e; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r') return 0;
    return 1;
}

// splits text into sections: runs of lines separated by at least min_blank
// blank lines. A section keeps its lines verbatim, including the '\n' of its
// last line, and shorter runs of blank lines inside it; leading and trailing
// blank lines of a section are dropped.
static void split_sections(const unsigned char *text, size_t len, size_t min_blank, DocList *dl) {
    const unsigned char *p = text, *end = text + len;
    const unsigned char *start = NULL, *last_end = NULL; // current section, end of its last non-blank line
    size_t blanks = 0;
    while (p < end) {
        const unsigned char *nl = memchr(p, '\n', (size_t)(end - p));
        const unsigned char *eol = nl ? nl : end;        // end of the line's text
        const unsigned char *next = nl ? nl + 1 : end;   // start of the next line
        if (blank_line(p, eol)) {
            blanks++;
        } else {
            if (start && blanks >= min_blank) { doclist_add(dl, start, (size_t)(last_end - start)); start = NULL; }
            if (!start) start = p;
            last_end = next;
            blanks = 0;
        }
        p = next;
    }
    if (start) doclist_add(dl, start, (size_t)(last_end - start));
}

// the train/val rule: document i goes to val when floor((i+1)*F) > floor(i*F),
// which puts exactly floor(n*F) of the first n documents in val, evenly spread
static int val_document(size_t i, double f) {
    return floor((double)(i + 1) * f) > floor((double)i * f);
}

// ----------------------------------------------------------------------------
// outputs: temporary files renamed into place at the end

#define MAX_OUTPUTS 100000
static char *g_tmp_paths[MAX_OUTPUTS];
static char *g_final_paths[MAX_OUTPUTS];
static size_t g_n_outputs;

// removes the temporary files of an unfinished run (registered with atexit)
static void remove_temporaries(void) {
    for (size_t i = 0; i < g_n_outputs; i++)
        if (g_tmp_paths[i]) unlink(g_tmp_paths[i]);
}

// on Ctrl-C or kill: removes the temporary files, then dies of the same signal
static void on_signal(int sig) {
    remove_temporaries(); // unlink is safe in a signal handler
    signal(sig, SIG_DFL);
    raise(sig);
}

// removes NAME.tmp.PID files in dir whose process is gone (a run killed with
// SIGKILL, which no handler sees), saying so in one line
static void remove_stale_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    int n = 0;
    char path[4096 + 256 + 2];   // dir, '/', a name of at most 255 bytes
    for (struct dirent *e = readdir(d); e; e = readdir(d)) {
        const char *t = strstr(e->d_name, ".tmp.");
        if (!t) continue;
        char *end;
        long pid = strtol(t + 5, &end, 10);
        if (*end != '\0' || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;   // that run is still going (or may be)
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0) n++;
    }
    closedir(d);
    if (n) printf("removed %d stale temporary file%s (*.tmp.PID) from %s, left by a killed run\n", n, n == 1 ? "" : "s", dir);
}

// opens a temporary file that becomes final_path on commit_outputs()
static FILE *open_output(const char *final_path) {
    if (g_n_outputs == 0) {   // the first output: clear what a killed run left in this directory
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", final_path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0'; else snprintf(dir, sizeof dir, ".");
        remove_stale_temporaries(dir);
    }
    if (g_n_outputs == MAX_OUTPUTS) { fprintf(stderr, "error: more than %d output files; fix: raise --shard-tokens\n", MAX_OUTPUTS); exit(1); }
    size_t len = strlen(final_path) + 32;
    char *tmp = (char *)malloc(len);
    snprintf(tmp, len, "%s.tmp.%ld", final_path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "error: cannot write %s: %s; fix: make the output directory writable or choose another with -o\n", tmp, strerror(errno));
        free(tmp);
        exit(1);
    }
    g_tmp_paths[g_n_outputs] = tmp;
    g_final_paths[g_n_outputs] = strdup(final_path);
    g_n_outputs++;
    return f;
}

// writes n bytes or exits naming the file
static void write_or_die(FILE *f, const void *p, size_t n, const char *what) {
    if (n && fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "error: writing %s failed: %s; fix: free disk space or choose another output directory\n", what, strerror(errno));
        exit(1);
    }
}

// closes an output, checking for write errors
static void close_or_die(FILE *f, const char *what) {
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0 || fclose(f) != 0) {   // on the disk before the rename
        fprintf(stderr, "error: writing %s failed: %s; fix: free disk space or choose another output directory\n", what, strerror(errno));
        exit(1);
    }
}

// renames every temporary output into place
static void commit_outputs(void) {
    for (size_t i = 0; i < g_n_outputs; i++) {
        if (rename(g_tmp_paths[i], g_final_paths[i]) != 0) {
            fprintf(stderr, "error: cannot rename %s to %s: %s; fix: check the output directory\n", g_tmp_paths[i], g_final_paths[i], strerror(errno));
            exit(1);
        }
        free(g_tmp_paths[i]);
        g_tmp_paths[i] = NULL;
    }
}

// one split's stream of shards
typedef struct {
    const char *dir, *name, *split;
    size_t shard_tokens;
    FILE *f;            // current shard, NULL when none is open
    size_t index;       // index of the current (or next) shard
    size_t count;       // tokens in the current shard
    size_t total;       // tokens in all shards of this split
    size_t docs;        // documents in this split
    uint16_t *buf;      // conversion buffer of SHARD_BUF tokens
    char path[4096];
} ShardWriter;

// path of shard index of a split
static void shard_path(char *out, size_t cap, const char *dir, const char *name, const char *split, size_t index) {
    snprintf(out, cap, "%s/%s_%s_%06zu.bin", dir, name, split, index);
}

// writes the header of the current shard (token count filled in) at offset 0
static void shard_write_header(ShardWriter *w) {
    int32_t header[HEADER_INTS] = {0};
    header[0] = SHARD_MAGIC;
    header[1] = SHARD_VERSION;
    header[2] = (int32_t)w->count;
    if (fseek(w->f, 0, SEEK_SET) != 0) { fprintf(stderr, "error: seek in %s failed\n", w->path); exit(1); }
    write_or_die(w->f, header, sizeof header, w->path);
}

// finishes the current shard: final header, close
static void shard_close(ShardWriter *w) {
    if (!w->f) return;
    shard_write_header(w);
    close_or_die(w->f, w->path);
    w->f = NULL;
    w->index++;
    w->count = 0;
}

// appends tokens to the split, opening and closing shards as they fill
static void shard_append(ShardWriter *w, const uint32_t *ids, size_t n) {
    while (n > 0) {
        if (!w->f) {
            shard_path(w->path, sizeof w->path, w->dir, w->name, w->split, w->index);
            w->f = open_output(w->path);
            shard_write_header(w); // placeholder, rewritten on close
        }
        size_t take = w->shard_tokens - w->count;
        if (take > n) take = n;
        if (take > SHARD_BUF) take = SHARD_BUF;
        for (size_t i = 0; i < take; i++) w->buf[i] = (uint16_t)ids[i];
        write_or_die(w->f, w->buf, take * sizeof(uint16_t), w->path);
        w->count += take;
        w->total += take;
        ids += take;
        n -= take;
        if (w->count == w->shard_tokens) shard_close(w);
    }
}

// after a successful run: removes shards of this split left over from an
// earlier run that had more of them (so the directory holds exactly this run)
static void remove_stale_shards(const ShardWriter *w) {
    char path[4096];
    for (size_t i = w->index;; i++) {
        shard_path(path, sizeof path, w->dir, w->name, w->split, i);
        if (unlink(path) != 0) break;
        fprintf(stderr, "tokenize: removed %s left from an earlier run\n", path);
    }
}

// writes the project's tokenizer file (format in common/tokenizer.h)
static void write_tokenizer_file(const BPE *bpe, const char *path) {
    FILE *f = open_output(path);
    int32_t header[HEADER_INTS] = {0};
    header[0] = TOKENIZER_MAGIC;
    header[1] = TOKENIZER_VERSION;
    header[2] = (int32_t)bpe->vocab_size;
    header[3] = (int32_t)bpe->eot;
    write_or_die(f, header, sizeof header, path);
    for (uint32_t id = 0; id < bpe->vocab_size; id++) {
        size_t len;
        const unsigned char *b = bpe_token_bytes(bpe, id, &len);
        uint32_t len32 = (uint32_t)len;
        write_or_die(f, &len32, sizeof len32, path);
        write_or_die(f, b, len, path);
    }
    close_or_die(f, path);
}

// ----------------------------------------------------------------------------
// progress

// monotonic clock in seconds
static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// one progress line on stderr: bytes done, MB/s, tokens, ETA
static void progress(const Options *opt, double t0, size_t bytes, size_t total_bytes, size_t tokens, size_t docs, int final) {
    static double last = 0;
    double t = now_seconds();
    if (opt->quiet || (!final && t - last < 1.0)) return;
    last = t;
    double el = t - t0 > 1e-9 ? t - t0 : 1e-9;
    double rate = (double)bytes / el;
    if (total_bytes < bytes) total_bytes = bytes; // the last document may pass --max-bytes
    double eta = rate > 0 && total_bytes > bytes ? (double)(total_bytes - bytes) / rate : 0;
    int tty = isatty(2);
    fprintf(stderr, "%stokenize: %.1f/%.1f MB (%.1f%%), %.1f MB/s, %.2fM tokens, %zu docs, %s %d:%02d%s",
            tty ? "\r" : "", bytes / 1e6, total_bytes / 1e6, total_bytes ? 100.0 * bytes / total_bytes : 100.0,
            rate / 1e6, tokens / 1e6, docs, final ? "took" : "ETA",
            (int)((final ? el : eta) / 60), (int)(final ? el : eta) % 60, tty && !final ? "   " : "\n");
}

// ----------------------------------------------------------------------------

// creates dir and its missing parents (like mkdir -p); exits if it cannot
static void make_dirs(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "error: cannot create output directory %s: %s; fix: choose a writable place with -o\n", path, strerror(errno));
                exit(1);
            }
            *p = c;
            if (c == '\0') break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "error: output %s is not a directory; fix: choose a directory with -o\n", dir);
        exit(1);
    }
}

// the state of one run over the inputs
typedef struct {
    const Options *opt;
    const FileList *files;
    size_t next_file;    // next file to read
    size_t doc_index;    // documents written so far
    size_t bytes_done;   // document bytes so far (what --max-bytes caps)
    size_t file_bytes;   // file bytes read so far (what progress shows without a cap)
    size_t tokens_done;
    int stop;            // a cap was reached
} Run;

// reads files until the batch holds about BATCH_BYTES of documents, applying
// --max-docs and --max-bytes document by document. texts[] gets each file's buffer.
static void read_batch(Run *r, DocList *batch, unsigned char **texts) {
    size_t batch_bytes = 0;
    while (r->next_file < r->files->n && batch_bytes < BATCH_BYTES && !r->stop) {
        size_t len;
        unsigned char *text = read_file(r->files->paths[r->next_file], &len);
        texts[r->next_file++] = text;
        r->file_bytes += len;
        size_t before = batch->n;
        if (r->opt->sections) split_sections(text, len, r->opt->section_blank_lines, batch);
        else if (len > 0) doclist_add(batch, text, len); // an empty file is no document
        for (size_t i = before; i < batch->n; i++) {
            if ((r->opt->max_docs && r->doc_index + i >= r->opt->max_docs) ||
                (r->opt->max_bytes && r->bytes_done + batch_bytes >= r->opt->max_bytes)) {
                batch->n = i;
                r->stop = 1;
                break;
            }
            batch_bytes += batch->docs[i].len;
        }
    }
    r->bytes_done += batch_bytes;
}

// tokenizes the batch's documents on all threads: EOT, then the document's tokens
static void tokenize_batch(const BPE *bpe, BPEWorker *workers, DocList *batch) {
    #pragma omp parallel
    {
        BPEWorker *w = &workers[omp_get_thread_num()];
        #pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < batch->n; i++) {
            Doc *d = &batch->docs[i];
            tokenbuf_push(&d->tokens, bpe->eot);
            bpe_encode(bpe, w, d->text, d->len, &d->tokens);
        }
    }
}

// writes the batch's documents in order, each to its split
static void write_batch(Run *r, DocList *batch, ShardWriter *train, ShardWriter *val) {
    for (size_t i = 0; i < batch->n; i++) {
        Doc *d = &batch->docs[i];
        ShardWriter *sw = val_document(r->doc_index, r->opt->val_fraction) ? val : train;
        shard_append(sw, d->tokens.data, d->tokens.len);
        sw->docs++;
        r->tokens_done += d->tokens.len;
        r->doc_index++;
        tokenbuf_free(&d->tokens);
    }
}

// sets up one split's writer
static void shard_writer_init(ShardWriter *w, const Options *opt, const char *split) {
    memset(w, 0, sizeof(*w));
    w->dir = opt->out_dir;
    w->name = opt->name;
    w->split = split;
    w->shard_tokens = opt->shard_tokens;
    w->buf = (uint16_t *)malloc(SHARD_BUF * sizeof(uint16_t));
}

// check inputs, write the tokenizer file, then batches: read, tokenize, write; commit at the end
int main(int argc, char **argv) {
    Options opt;
    parse_args(argc, argv, &opt);
    atexit(remove_temporaries);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);

    // check everything that can be checked before the long work
    BPE bpe;
    bpe_load(&bpe, opt.vocab);
    FileList files;
    collect_inputs(&opt, &files);
    if (opt.shuffle_seed >= 0) shuffle_files(&files, (uint64_t)opt.shuffle_seed);
    size_t total_bytes = opt.max_bytes && opt.max_bytes < files.total_bytes ? opt.max_bytes : files.total_bytes;
    make_dirs(opt.out_dir);
    char tok_path[4096];
    if (opt.tokenizer_out) snprintf(tok_path, sizeof tok_path, "%s", opt.tokenizer_out);
    else snprintf(tok_path, sizeof tok_path, "%s/tokenizer.bin", opt.out_dir);
    if (strcmp(tok_path, "none") != 0) write_tokenizer_file(&bpe, tok_path);

    ShardWriter train, val;
    shard_writer_init(&train, &opt, "train");
    shard_writer_init(&val, &opt, "val");
    omp_set_num_threads(opt.threads);
    BPEWorker *workers = (BPEWorker *)calloc((size_t)opt.threads, sizeof(BPEWorker));
    for (int t = 0; t < opt.threads; t++) bpe_worker_init(&workers[t]);
    unsigned char **texts = (unsigned char **)malloc(files.n * sizeof(unsigned char *) + 1);

    // batches: read, tokenize on all threads, write in order
    Run run = {0};
    run.opt = &opt;
    run.files = &files;
    double t0 = now_seconds();
    while (!run.stop && run.next_file < files.n) {
        DocList batch = {0};
        size_t first_file = run.next_file;
        read_batch(&run, &batch, texts);
        tokenize_batch(&bpe, workers, &batch);
        write_batch(&run, &batch, &train, &val);
        for (size_t f = first_file; f < run.next_file; f++) free(texts[f]);
        free(batch.docs);
        if (!run.stop && run.next_file < files.n) // the last batch gets the final line instead
            progress(&opt, t0, opt.max_bytes ? run.bytes_done : run.file_bytes, total_bytes, run.tokens_done, run.doc_index, 0);
    }
    shard_close(&train);
    shard_close(&val);
    if (run.doc_index == 0) {
        fprintf(stderr, "error: the inputs hold no documents (empty files, or --max-docs/--max-bytes too small); fix: check the inputs\n");
        exit(1);
    }

    // success: everything into place at once
    commit_outputs();
    remove_stale_shards(&train);
    remove_stale_shards(&val);
    size_t done = opt.max_bytes ? run.bytes_done : run.file_bytes;
    progress(&opt, t0, done, done, run.tokens_done, run.doc_index, 1);
    if (train.docs == 0)
        fprintf(stderr, "warning: the train split got no documents (%zu documents in all); fix: lower --val-fraction\n", run.doc_index);
    if (opt.val_fraction > 0 && val.docs == 0)
        fprintf(stderr, "warning: the val split got no documents (%zu documents in all); fix: raise --val-fraction or use --sections\n", run.doc_index);
    if (!opt.quiet)
        fprintf(stderr, "tokenize: train %zu docs, %zu tokens, %zu shards; val %zu docs, %zu tokens, %zu shards; in %s/%s_{train,val}_*.bin; tokenizer %s\n",
                train.docs, train.total, train.index, val.docs, val.total, val.index, opt.out_dir, opt.name, tok_path);

    for (int t = 0; t < opt.threads; t++) bpe_worker_free(&workers[t]);
    free(workers);
    free(texts);
    for (size_t f = 0; f < files.n; f++) free(files.paths[f]);
    free(files.paths);
    free(files.sizes);
    free(opt.patterns);
    free(opt.inputs);
    free(train.buf);
    free(val.buf);
    bpe_free(&bpe);
    return 0;
}
