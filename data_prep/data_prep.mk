# data_prep: GPT-2 BPE tokenizer and token shards. Included by the top-level
# Makefile; also works alone from the repository root:
#   make -f data_prep/data_prep.mk data_prep/tokenize | test-data-prep | data/tiny | bench-tokenizer
#
# Targets
#   data_prep/tokenize        the shard writer (see data_prep/README.md)
#   data_prep/test_tokenize   its tests; DATA_PREP_TEST_CMD runs them
#   data_prep/bench_tokenize  the throughput benchmark (C side)
#   test-data-prep            fetches the rank file and Moby Dick if missing, runs the tests
#   clean-data-prep           removes the three binaries
#   data/tiny                 Moby Dick -> data/tiny/{data_train,data_val}_000000.bin + tokenizer.bin
#   data/medium               18 Gutenberg books -> data/medium/
#   data/large                linux-source-6.1 .c/.h/.rst -> data/large/ (about 1.2 GB of text)
#   bench-tokenizer           MB/s of ours (1 core, all cores) beside npm tiktoken, same text

CC ?= gcc
# -march=native only where the compiler takes it
DATA_PREP_MARCH := $(shell $(CC) -march=native -E -x c /dev/null >/dev/null 2>&1 && echo -march=native)
CFLAGS ?= -O3 $(DATA_PREP_MARCH)
DATA_PREP_CFLAGS = $(CFLAGS) -Wall -Wextra -fopenmp
DATA_PREP_LIBS = -lpcre2-8 -lm
# what `make test` builds and runs for data_prep; the tests also need
# `data_prep/fetch.sh vocab tiny` done (they fail, naming that command, if not)
DATA_PREP_TEST_DEPS = data_prep/tokenize data_prep/test_tokenize
DATA_PREP_TEST_CMD = ./data_prep/test_tokenize
# without pcre2.h: `fetch.sh deps` installs libpcre2-dev (as root with apt) or
# stops, printing the exact apt-get command to run
DATA_PREP_PCRE2_CHECK = printf '\#define PCRE2_CODE_UNIT_WIDTH 8\n\#include <pcre2.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 \
	|| { echo "data_prep: PCRE2 headers (pcre2.h) not found; running data_prep/fetch.sh deps" >&2; data_prep/fetch.sh deps; }

DATA_PREP_CORE = data_prep/bpe.c data_prep/bpe.h

data_prep/tokenize: data_prep/tokenize.c $(DATA_PREP_CORE)
	@$(DATA_PREP_PCRE2_CHECK)
	$(CC) $(DATA_PREP_CFLAGS) -o $@ data_prep/tokenize.c data_prep/bpe.c $(DATA_PREP_LIBS)

data_prep/test_tokenize: data_prep/test_tokenize.c $(DATA_PREP_CORE) common/tokenizer.h
	@$(DATA_PREP_PCRE2_CHECK)
	$(CC) $(DATA_PREP_CFLAGS) -o $@ data_prep/test_tokenize.c data_prep/bpe.c $(DATA_PREP_LIBS)

data_prep/bench_tokenize: data_prep/bench_tokenize.c $(DATA_PREP_CORE)
	@$(DATA_PREP_PCRE2_CHECK)
	$(CC) $(DATA_PREP_CFLAGS) -o $@ data_prep/bench_tokenize.c data_prep/bpe.c $(DATA_PREP_LIBS)

# fetched inputs (pinned versions, sha256-checked by fetch.sh)
data/vocab/r50k_base.tiktoken:
	data_prep/fetch.sh vocab
data/raw/moby_dick/moby_dick.txt:
	data_prep/fetch.sh tiny
data/raw/gutenberg/.done:
	data_prep/fetch.sh medium
data/raw/linux/.done:
	data_prep/fetch.sh large

.PHONY: test-data-prep bench-tokenizer clean-data-prep data/tiny data/medium data/large
clean-data-prep:
	rm -f data_prep/tokenize data_prep/test_tokenize data_prep/bench_tokenize

test-data-prep: data_prep/tokenize data_prep/test_tokenize data/vocab/r50k_base.tiktoken data/raw/moby_dick/moby_dick.txt
	$(DATA_PREP_TEST_CMD)

# Moby Dick's 135 chapters are separated by 3 or more blank lines: one chapter, one document
data/tiny: data_prep/tokenize data/vocab/r50k_base.tiktoken data/raw/moby_dick/moby_dick.txt
	./data_prep/tokenize -o data/tiny --sections --section-blank-lines 3 --val-fraction 0.1 data/raw/moby_dick/moby_dick.txt

# one book, one document, in a random order fixed by the seed
data/medium: data_prep/tokenize data/vocab/r50k_base.tiktoken data/raw/gutenberg/.done
	./data_prep/tokenize -o data/medium --pattern '*.txt' --shuffle 1337 --val-fraction 0.1 data/raw/gutenberg

# one source file, one document, in a random order fixed by the seed (not path order); LARGE_FLAGS can cap it, e.g. LARGE_FLAGS='--max-bytes 100000000'
data/large: data_prep/tokenize data/vocab/r50k_base.tiktoken data/raw/linux/.done
	./data_prep/tokenize -o data/large --pattern '*.c' --pattern '*.h' --pattern '*.rst' --shuffle 1337 --val-fraction 0.01 $(LARGE_FLAGS) data/raw/linux

# BENCH_TEXT: the text to time (default: Moby Dick)
BENCH_TEXT ?= data/raw/moby_dick/moby_dick.txt
bench-tokenizer: data_prep/bench_tokenize data/vocab/r50k_base.tiktoken data/raw/moby_dick/moby_dick.txt
	@test -d dev/tokenizer/node_modules/tiktoken || (cd dev/tokenizer && npm ci --no-audit --no-fund)
	dev/tokenizer/bench.sh $(BENCH_TEXT)
