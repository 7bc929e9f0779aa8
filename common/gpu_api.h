// The small C API that test_mhar.c uses to drive the CUDA trainer.
//
// train_mhar.cu compiled with -DTESTING (no main) exports these functions and
// keeps every other symbol internal, so the fp32 object (-DPRECISION_FP32) and
// the bf16 object (the default) link into one test binary side by side:
//   mhar_gpu_fp32_create(...)   mhar_gpu_bf16_create(...)
//
//   device_check   number of CUDA devices; 0 with the reason in why when none
//                  can be used (this one never exits)
//   create         a model of config cfg whose parameters are the float32 host
//                  array params (checkpoint layout, param_count(cfg) floats),
//                  with activations for batches up to maxB x maxT; its routing
//                  forward groups sites wherever the slots allow (route_fwd_plan's
//                  all: small test models seldom group where it only pays off),
//                  so that the grouped kernels run in the checks
//   forward_backward  zero the gradients, forward on inputs/targets (B, T),
//                  backward with dloss = 1/(B*T), as a training step does
//                  (the cross-entropy's backward fused into the forward);
//                  returns the mean loss and copies back the logits (B*T, V),
//                  from a forward without targets just before, and the
//                  gradients (checkpoint layout) as float; either may be NULL
//   train_step     one optimizer step of the trainer's loop on one
//                  micro-batch: forward, backward, global-norm clipping at
//                  clip (0 = off), AdamW with learning rate lr at step t
//                  (counted from 1); returns the loss, and the gradient norm
//                  in *norm when norm is not NULL
//   get_params     copy the float32 master parameters back
//   free           release the model
#pragma once
#include "config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MHAR_GPU_DECLARE(P)                                                                          \
    int mhar_gpu_##P##_device_check(char *why, size_t why_len);                                      \
    void *mhar_gpu_##P##_create(const Config *cfg, const float *params, int maxB, int maxT);         \
    double mhar_gpu_##P##_forward_backward(void *model, const int *inputs, const int *targets,       \
                                           int B, int T, float *logits, float *grads);              \
    double mhar_gpu_##P##_train_step(void *model, const int *inputs, const int *targets, int B,      \
                                     int T, float lr, float beta1, float beta2, float eps, float wd, \
                                     float clip, int t, double *norm);                              \
    void mhar_gpu_##P##_get_params(void *model, float *params);                                      \
    void mhar_gpu_##P##_free(void *model);

MHAR_GPU_DECLARE(fp32)
MHAR_GPU_DECLARE(bf16)

#ifdef __cplusplus
}
#endif
