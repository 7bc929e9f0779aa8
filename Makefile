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
CFLAGS += $(if $(OPENMP),$(OPENMP),-Wno-unknown-pragmas)
LDLIBS = -lm
HEADERS = $(wildcard common/*.h)

.PHONY: all test deps bench bench-gpu quickstart clean
all: train_mhar test_mhar

train_mhar: train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the test compiles the trainer in double precision for finite differences
# (with nvcc: plus the GPU checks, linking train_mhar.cu's objects; see the CUDA section below)
test_mhar: test_mhar.c train_mhar.c $(HEADERS)
	$(CC) $(CFLAGS) -DMHAR_REAL=double $(GPU_TEST_CFLAGS) -o $@ $< $(GPU_TEST_OBJS) $(LDLIBS) $(GPU_TEST_LIBS)

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
# gradients and of the optimiser steps, the plots and the routing probe, and test_mhar last (its final line is the summary).
test: deps train_mhar test_mhar dev/mhar_grads dev/route_probe dev/loss_sensitivity dev/delta_identity
	$(MAKE) --no-print-directory test-data-prep
	/usr/bin/python3 dev/torch_ref/check_grads.py --self-test
	/usr/bin/python3 dev/torch_ref/check_grads.py
	/usr/bin/python3 dev/torch_ref/check_train.py
	bash dev/test_plots.sh
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
	rm -f train_mhar test_mhar dev/mhar_grads dev/bench_matmul dev/route_probe dev/loss_sensitivity dev/delta_identity

# ---------------------------------------------------------------------------
# CUDA trainer (train_mhar.cu) and the GPU checks of test_mhar, built where nvcc
# is found; elsewhere every rule above works unchanged and test_mhar prints
# "SKIP GPU checks: built without nvcc".
#   make train_mhar_cu        bf16 mixed precision (the default for training)
#   make train_mhar_cu_fp32   fp32 throughout, for verification
#   make GPU_ARCH=sm_80 ...   another GPU (default sm_90a: H100/H200)
NVCC ?= nvcc
GPU_ARCH ?= sm_90a
HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo yes)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
# -diag-suppress 177: functions unused in one precision or in the -DTESTING objects
NVCCFLAGS ?= -O3 -std=c++17 -arch=$(GPU_ARCH) -diag-suppress 177 -Xcompiler -Wall,-Wno-unused-function
CUDA_LDLIBS = -lcublas -lcudart
GPU_BINS = train_mhar_cu train_mhar_cu_fp32
GPU_OBJS = train_mhar_gpu_fp32.o train_mhar_gpu_bf16.o

.PHONY: clean-cuda lab-selftest
ifeq ($(HAVE_NVCC),yes)
GPU_TEST_OBJS = $(GPU_OBJS)
GPU_TEST_CFLAGS = -DMHAR_GPU
GPU_TEST_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(CUDA_LDLIBS) -lstdc++
all: $(GPU_BINS)
test_mhar: $(GPU_TEST_OBJS)
test: $(GPU_BINS) lab-selftest
endif

train_mhar_cu: train_mhar.cu $(HEADERS)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(CUDA_LDLIBS)

train_mhar_cu_fp32: train_mhar.cu $(HEADERS)
	$(NVCC) $(NVCCFLAGS) -DPRECISION_FP32 -o $@ $< $(CUDA_LDLIBS)

# the CUDA trainer without main, exporting mhar_gpu_<precision>_* (common/gpu_api.h)
train_mhar_gpu_fp32.o: train_mhar.cu $(HEADERS)
	$(NVCC) $(NVCCFLAGS) -DTESTING -DPRECISION_FP32 -c -o $@ $<

train_mhar_gpu_bf16.o: train_mhar.cu $(HEADERS)
	$(NVCC) $(NVCCFLAGS) -DTESTING -c -o $@ $<

# the kernel lab (dev/cuda/): each file validates and times its own versions on a GPU
LAB_BINS = dev/cuda/attention dev/cuda/route dev/cuda/elementwise dev/cuda/residual dev/cuda/delta
dev/cuda/%: dev/cuda/%.cu dev/cuda/lab_util.cuh
	$(NVCC) -O3 -arch=$(GPU_ARCH) -o $@ $<
dev/cuda/delta: kernels/delta.cuh
.PHONY: lab
lab: $(LAB_BINS)

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
