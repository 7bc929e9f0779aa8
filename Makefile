# MHAR: CPU reference trainer, tests, and (later) the CUDA trainer.
#   make            build train_mhar and test_mhar
#   make test       build and run every test (installs missing Debian packages as root); without a
#                   GPU it builds no CUDA (`make cuda-build lab-selftest` does, as .ci/run)
#   make fuzz       fuzz the shard, checkpoint and tokenizer readers (FUZZ_SECONDS each, default 300)
#   make bench      CPU benchmark: std vs mhar H=8 on the 100M model (dev/bench_cpu.sh)
#   make quickstart the README's main job: fetch Moby Dick, tokenise, train, sample

CC ?= gcc
# -march=native and OpenMP when the compiler accepts them
NATIVE := $(shell $(CC) -march=native -x c -E /dev/null >/dev/null 2>&1 && echo -march=native)
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null >/dev/null 2>&1 && echo -fopenmp)
CFLAGS ?= -O3 $(NATIVE) -Wall -Wextra -Wno-unused-function
CFLAGS += $(if $(OPENMP),$(OPENMP),-Wno-unknown-pragmas)
LDLIBS = -lm
HEADERS = $(wildcard common/*.h)
KERNELS = $(wildcard kernels/*.cuh)

.PHONY: all test deps bench bench-gpu quickstart clean
all: train_mhar test_mhar test_dist

train_mhar: train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the test compiles the trainer in double precision for finite differences
# (with nvcc: plus the GPU checks, linking train_mhar.cu's objects; see the CUDA section below)
test_mhar: test_mhar.c train_mhar.c $(HEADERS) kernels/route_forward.cuh
	$(CC) $(CFLAGS) -DMHAR_REAL=double $(GPU_TEST_CFLAGS) -o $@ $< $(GPU_TEST_OBJS) $(LDLIBS) $(GPU_TEST_LIBS)

# data-parallel training's host side (common/dist.h) on the CPU: data slicing, environment, id exchange
test_dist: test_dist.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the CPU trainer under AddressSanitizer and UndefinedBehaviorSanitizer: make test runs the
# bad-input, divergence and checkpoint tests (dev/test_reliability.sh) through it
SANITIZE = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
train_mhar_asan: train_mhar.c $(HEADERS)
	$(CC) -O1 -g $(SANITIZE) $(OPENMP) -Wall -Wextra -Wno-unused-function -o $@ $< $(LDLIBS)

dev/mhar_grads: dev/mhar_grads.c train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -DMHAR_REAL=double -I. -o $@ $< $(LDLIBS)

# test_mhar's delta conversion check in float32, the trainer's precision
dev/delta_identity: dev/delta_identity.c test_mhar.c train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

dev/route_probe: dev/route_probe.c train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

dev/loss_sensitivity: dev/loss_sensitivity.c test_mhar.c train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -DMHAR_REAL=double -I. -o $@ $< $(LDLIBS)

dev/bench_matmul: dev/bench_matmul.c train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

-include data_prep/data_prep.mk

# Every test: data_prep's tokenizer tests (they fetch the GPT-2 rank file and
# Moby Dick once), the PyTorch float64 reference checks of the hand-written
# gradients and of the optimiser steps, the speed baseline (fast_model.py) and its plain control
# (plain_model.py) against the reference model.py with a CPU smoke run of bench_torch.py, the
# plots and the routing probe, the study's scripts
# (dev/test_study.sh: the collector on its fixture, study.sh end to end on the CPU), the
# bad-input, divergence and checkpoint tests through the sanitizer build, the fuzz corpus, the
# layout check (dev/check_layout.sh: no kernel or getenv in train_mhar.cu, no paths of the dev
# machine), data-parallel training's host side (test_dist), delta's conversion identity in
# float32 (dev/delta_identity), and test_mhar last (its final line is the summary).
# what make test builds, compiled in parallel on every core before the tests run one by one
NPROC := $(shell nproc 2>/dev/null || echo 2)
TEST_BINS = train_mhar test_mhar test_dist train_mhar_asan dev/mhar_grads dev/route_probe dev/loss_sensitivity \
            dev/delta_identity $(FUZZ_BINS) \
            $(DATA_PREP_TEST_DEPS)
test: deps
	@$(MAKE) --no-print-directory -j$(NPROC) $(TEST_BINS)
	@$(if $(WITH_GPU),:,echo "make test: $(NO_GPU_WHY); the CUDA trainer, its GPU checks and the lab self-tests are not built here (make cuda-build lab-selftest builds and runs what needs only nvcc; .ci/run does)")
	$(MAKE) --no-print-directory test-data-prep
	/usr/bin/python3 dev/torch_ref/check_grads.py --self-test
	/usr/bin/python3 dev/torch_ref/check_grads.py
	/usr/bin/python3 dev/torch_ref/check_train.py
	/usr/bin/python3 dev/torch_ref/check_fast_model.py
	bash dev/test_plots.sh
	bash dev/test_study.sh
	bash dev/test_reliability.sh ./train_mhar_asan
	$(MAKE) --no-print-directory fuzz-corpus
	bash dev/check_layout.sh
	./test_dist
	./dev/delta_identity
	./test_mhar

deps:
	@bash dev/install_deps.sh

bench: train_mhar dev/bench_matmul
	./dev/bench_matmul
	bash dev/bench_cpu.sh

# issue 5's side-by-side GPU benchmark: our CUDA trainer against the PyTorch model
bench-gpu:
	bash dev/bench_gpu.sh

quickstart: train_mhar
	bash dev/quickstart.sh

clean:
	rm -f train_mhar test_mhar test_dist train_mhar_asan dev/mhar_grads dev/bench_matmul dev/route_probe dev/loss_sensitivity dev/delta_identity $(FUZZ_BINS)

# ---------------------------------------------------------------------------
# Fuzzing the readers of untrusted files with libFuzzer (clang; Debian's
# libclang-rt-dev has the runtime). dev/fuzz/fuzz_readers.c says how a bad
# input ends (die() longjmps back to the harness in this build).
#   make fuzz-corpus        run each target once over its seed corpus (make test)
#   make fuzz               fuzz each target FUZZ_SECONDS (default 300); CI: FUZZ_SECONDS=20
# New inputs go to $(FUZZ_WORK)/NAME, crashes to $(FUZZ_WORK)/crash-*; the committed seeds in
# dev/fuzz/corpus/ stay as they are.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 300
FUZZ_WORK ?= /tmp/mhar_fuzz
FUZZ_NAMES = shard ckpt tok
FUZZ_BINS = $(FUZZ_NAMES:%=dev/fuzz/fuzz_%)
FUZZ_FLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DMHAR_FUZZ -I. -Wall -Wextra -Wno-unused-function
.PHONY: fuzz fuzz-build fuzz-corpus
fuzz-build: $(FUZZ_BINS)
$(FUZZ_BINS): dev/fuzz/fuzz_%: dev/fuzz/fuzz_readers.c $(HEADERS)
	$(FUZZ_CC) $(FUZZ_FLAGS) -DFUZZ_$$(echo $* | tr a-z A-Z) -o $@ $< -lm

fuzz-corpus: $(FUZZ_BINS)
	@for n in $(FUZZ_NAMES); do \
	    ./dev/fuzz/fuzz_$$n -runs=0 dev/fuzz/corpus/$$n >$(FUZZ_WORK).$$n.log 2>&1 \
	      || { cat $(FUZZ_WORK).$$n.log; echo "FAIL fuzz_$$n on its seed corpus"; exit 1; }; \
	    echo "PASS fuzz_$$n: the $$(ls dev/fuzz/corpus/$$n | wc -l) seeds of dev/fuzz/corpus/$$n run clean (ASan, UBSan)"; \
	done

fuzz: $(FUZZ_BINS)
	@for n in $(FUZZ_NAMES); do \
	    mkdir -p $(FUZZ_WORK)/$$n; \
	    ./dev/fuzz/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1 \
	        -artifact_prefix=$(FUZZ_WORK)/ $(FUZZ_WORK)/$$n dev/fuzz/corpus/$$n >$(FUZZ_WORK)/$$n.log 2>&1; rc=$$?; \
	    execs=$$(sed -n 's/^stat::number_of_executed_units: *//p' $(FUZZ_WORK)/$$n.log); \
	    if [ $$rc -ne 0 ]; then tail -40 $(FUZZ_WORK)/$$n.log; echo "FAIL fuzz_$$n: exit $$rc after $$execs runs (inputs in $(FUZZ_WORK)/)"; exit 1; fi; \
	    echo "PASS fuzz_$$n: $$execs runs in $(FUZZ_SECONDS) s, no crash, leak or hang"; \
	done

# ---------------------------------------------------------------------------
# CUDA trainer (train_mhar.cu) and the GPU checks of test_mhar, built by make
# test where nvcc is found and a GPU is present (/dev/nvidia0 ...); elsewhere
# make test builds no CUDA and test_mhar prints why it skips the GPU checks.
# `make cuda-build` compiles the trainers and labs wherever nvcc is (CI does).
#   make train_mhar_cu        bf16 mixed precision (the default for training)
#   make train_mhar_cu_fp32   fp32 throughout, for verification
#   make GPU_ARCH=sm_80 ...   another GPU (default sm_90a: H100/H200)
NVCC ?= nvcc
GPU_ARCH ?= sm_90a
HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo yes)
HAVE_GPU := $(shell ls /dev/nvidia[0-9]* >/dev/null 2>&1 && echo yes)
# WITH_GPU=yes forces the GPU build of the tests (WITH_GPU= turns it off)
WITH_GPU ?= $(if $(HAVE_NVCC),$(HAVE_GPU))
NO_GPU_WHY = $(if $(HAVE_NVCC),no GPU here (no /dev/nvidia0 device),no nvcc on PATH (CUDA toolkit not installed))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
# -diag-suppress 177: functions unused in one precision or in the -DTESTING objects
NVCCFLAGS ?= -O3 -std=c++17 -arch=$(GPU_ARCH) -diag-suppress 177 -Xcompiler -Wall,-Wno-unused-function
CUDA_LDLIBS = -lcublasLt -lcublas -lcudart
GPU_BINS = train_mhar_cu train_mhar_cu_fp32
GPU_OBJS = train_mhar_gpu_fp32.o train_mhar_gpu_bf16.o

.PHONY: clean-cuda lab-selftest cuda-build
ifeq ($(HAVE_NVCC),yes)
all: $(GPU_BINS)
endif
ifeq ($(WITH_GPU),yes)
GPU_TEST_OBJS = $(GPU_OBJS)
GPU_TEST_CFLAGS = -DMHAR_GPU
GPU_TEST_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(CUDA_LDLIBS) -lstdc++
test_mhar: $(GPU_TEST_OBJS)
test: $(GPU_BINS) lab-selftest
else
GPU_TEST_CFLAGS = -DMHAR_NO_GPU_WHY='"$(NO_GPU_WHY)"'
endif

# NCCL for data-parallel training (common/dist.h, common/dist_nccl.h): the first
# of the CUDA toolkit and PyTorch's wheel (which has libnccl.so.2 only, linked by
# its full path, with an rpath) holding both nccl.h and the library. Without it
# the trainers build as before and run one process. make NCCL_HOME= builds without.
NCCL_CANDIDATES = $(CUDA_HOME) $(wildcard /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl)
nccl_lib = $(firstword $(wildcard $(1)/lib64/libnccl.so $(1)/lib/libnccl.so $(1)/lib64/libnccl.so.2 $(1)/lib/libnccl.so.2))
NCCL_HOME ?= $(firstword $(foreach d,$(NCCL_CANDIDATES),$(if $(and $(wildcard $(d)/include/nccl.h),$(call nccl_lib,$(d))),$(d))))
NCCL_LIB = $(if $(NCCL_HOME),$(call nccl_lib,$(NCCL_HOME)))
NCCL_FLAGS = $(if $(NCCL_LIB),-DMHAR_NCCL -I$(NCCL_HOME)/include)
NCCL_LDLIBS = $(if $(NCCL_LIB),-Xlinker $(NCCL_LIB) -Xlinker -rpath -Xlinker $(patsubst %/,%,$(dir $(NCCL_LIB))))

train_mhar_cu: train_mhar.cu $(HEADERS) $(KERNELS)
	$(NVCC) $(NVCCFLAGS) $(NCCL_FLAGS) -o $@ $< $(CUDA_LDLIBS) $(NCCL_LDLIBS)

train_mhar_cu_fp32: train_mhar.cu $(HEADERS) $(KERNELS)
	$(NVCC) $(NVCCFLAGS) -DPRECISION_FP32 $(NCCL_FLAGS) -o $@ $< $(CUDA_LDLIBS) $(NCCL_LDLIBS)

# the CUDA trainer without main, exporting mhar_gpu_<precision>_* (common/gpu_api.h)
train_mhar_gpu_fp32.o: train_mhar.cu $(HEADERS) $(KERNELS)
	$(NVCC) $(NVCCFLAGS) -DTESTING -DPRECISION_FP32 -c -o $@ $<

train_mhar_gpu_bf16.o: train_mhar.cu $(HEADERS) $(KERNELS)
	$(NVCC) $(NVCCFLAGS) -DTESTING -c -o $@ $<

# the kernel lab (dev/cuda/): each file validates and times its own versions on a GPU
LAB_BINS = dev/cuda/attention dev/cuda/route dev/cuda/elementwise dev/cuda/residual dev/cuda/hc dev/cuda/delta \
           dev/cuda/matmul
dev/cuda/%: dev/cuda/%.cu dev/cuda/lab_util.cuh $(HEADERS) $(KERNELS)
	$(NVCC) -O3 -arch=$(GPU_ARCH) -o $@ $<
dev/cuda/hc: kernels/hc.cuh
dev/cuda/delta: kernels/delta.cuh
dev/cuda/matmul: dev/cuda/matmul.cu dev/cuda/lab_util.cuh
	$(NVCC) -O3 -arch=$(GPU_ARCH) -o $@ $< -lcublas -lcublasLt
.PHONY: lab
lab: $(LAB_BINS)

# every CUDA source compiled, to catch compile errors where no GPU runs them (.ci/run)
cuda-build: $(GPU_BINS) $(GPU_OBJS) $(LAB_BINS)

# the labs' CPU self-tests (part of make test where nvcc is found; no GPU needed): float64
# references against central differences, and the lane-by-lane emulations of the tensor-core
# kernels (route: v14 .. v17; fixed seed). One line each; the whole output on a failure.
lab-selftest: $(LAB_BINS)
	@for b in $(LAB_BINS); do \
	    out=$$(./$$b --cpu-selftest --seed 1 2>&1); rc=$$?; \
	    if [ $$rc -ne 0 ]; then echo "$$out"; echo "FAIL $$b --cpu-selftest (exit $$rc)"; exit 1; fi; \
	    echo "PASS $$b --cpu-selftest: $$(echo "$$out" | tail -1)"; \
	done

clean: clean-cuda
clean-cuda:
	rm -f $(GPU_BINS) $(GPU_OBJS) $(LAB_BINS)
