# MHAR: CPU reference trainer, tests, and (later) the CUDA trainer.
#   make            build train_mhar and test_mhar
#   make test       build and run every test (installs missing Debian packages as root)
#   make bench      CPU benchmark: std vs mhar H=8 on the 100M model (dev/bench_cpu.sh)
#   make quickstart the README's main job: fetch Moby Dick, tokenise, train, sample

CC ?= gcc
# -march=native and OpenMP when the compiler accepts them
NATIVE := $(shell $(CC) -march=native -x c -E /dev/null >/dev/null 2>&1 && echo -march=native)
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null >/dev/null 2>&1 && echo -fopenmp)
CFLAGS ?= -O3 $(NATIVE) -Wall -Wextra -Wno-unused-function
CFLAGS += $(OPENMP)
LDLIBS = -lm
HEADERS = $(wildcard common/*.h)

.PHONY: all test deps bench quickstart clean
all: train_mhar test_mhar

train_mhar: train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the test compiles the trainer in double precision for finite differences
test_mhar: test_mhar.c train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -DMHAR_REAL=double -o $@ $< $(LDLIBS)

dev/mhar_grads: dev/mhar_grads.c train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -DMHAR_REAL=double -I. -o $@ $< $(LDLIBS)

dev/bench_matmul: dev/bench_matmul.c train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

-include data_prep/data_prep.mk

# Every test: data_prep's tokenizer tests (they fetch the GPT-2 rank file and
# Moby Dick once), the PyTorch float64 reference check of the hand-written
# gradients, and test_mhar last (its final line is the summary).
test: deps train_mhar test_mhar dev/mhar_grads
	$(MAKE) --no-print-directory test-data-prep
	/usr/bin/python3 dev/torch_ref/check_grads.py --self-test
	/usr/bin/python3 dev/torch_ref/check_grads.py
	./test_mhar

deps:
	@bash dev/install_deps.sh

bench: train_mhar dev/bench_matmul
	./dev/bench_matmul
	bash dev/bench_cpu.sh

quickstart: train_mhar
	bash dev/quickstart.sh

clean:
	rm -f train_mhar test_mhar dev/mhar_grads dev/bench_matmul
