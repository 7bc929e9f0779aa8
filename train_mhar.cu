/*
train_mhar.cu: the CUDA trainer of Multi-Head Attention Residuals.

The same model, flags, data loader, checkpoints, schedule, sampling and log as
the CPU reference train_mhar.c, which this file mirrors section by section (same
layer names, same order): read the two side by side. doc/SPEC.md is the contract;
section numbers refer to it. This file holds the model: precision types, the
Model structs and their allocation, the sublayers, the routing sites, the forward
and backward passes, the optimiser, checkpoints, the training loop's hooks and the
test API. Every kernel and its host launcher lives in kernels/<op>.cuh (one header
per op, each saying which lab version of dev/cuda/ it is); matmuls go through cuBLAS.

Precision, chosen at build time:
  (default)        bf16 mixed precision: weights copies and activations in
                   bf16 (floatX); fp32 master weights, AdamW state, parameter
                   gradients, routing source gradients (dslots), softmax and
                   norm statistics; every reduction sums in fp32; cuBLAS with
                   fp32 compute. `make train_mhar_cu`.
  -DPRECISION_FP32 everything fp32, cuBLAS with pedantic fp32 compute (no
                   TF32), to verify against the CPU. `make train_mhar_cu_fp32`.
                   It runs each op's generic kernel where bf16 has a faster one.
  -DTESTING        no main; exports the C API of common/gpu_api.h under
                   mhar_gpu_fp32_* or mhar_gpu_bf16_*, for test_mhar.c.
  -DMHAR_NCCL      data-parallel training over NCCL, one process per GPU
                   (common/dist.h; the Makefile adds it where it finds NCCL):
                   the training loop sums the fp32 gradients over the ranks
                   once per optimizer step, before the norm and AdamW.
There are no run-time switches: each op picks its kernel by one predicate on the
shape and precision (each kernels/<op>.cuh says which). Per-op timing: every op is a
range (op_range, kernels/common.cuh): an NVTX range, and with -op_times 1 a CUDA event,
from which the trainer prints each op's GPU time per step at the end (dev/bench_gpu.sh).

Determinism: no floating-point atomics anywhere. Per-channel reductions over
positions (norm weights, routing q and gamma) write per-block partials that a
second kernel sums in a fixed order; attention's dk and dv are owned by one
block per key tile and kv head, dq by one block per query tile; the embedding
gradient walks each token's positions in order; cuBLAS runs with atomics off on
one stream. Two runs with the same seed give the same bits.

Routing (SPEC section 4): every source lives in one buffer slots
[2L+1, B, T, C] that each sublayer writes once (config.h's slot design, shared
with std and block mode); r_i is computed once per source. The forward pass is
one fused kernel per site (or per group of sites) over its sources with an online
softmax and the site's RMSNorm; it keeps per site the log-sum-exp of the weights
(not a itself) and, like the CPU file, the routed input h_j. The backward pass
stores each site's dL/dh_j, then gathers each slot's gradient from all the sites
that read it, in fp32, visiting the slots in reverse order: one (B, T, C) fp32
slot gradient at a time, written once.

Hyper-connections (SPEC section 8, -r hc -hc_n n): slot j+1 keeps o_j, and the
n streams after each sublayer but the last are kept (Acts.hcx); kernels/hc.cuh fuses the
update of sublayer j with the read of site j+1 and its pre-norm in the forward
(writing u_{j+1} and its rstd, as std keeps them; the read h_{j+1} is not stored),
and the norm's and the read's backward of site j with the update's backward of
sublayer j-1 (recomputing X_j from X_{j-1} and o_{j-1}, then h_j), keeping one fp32 stream gradient
(N, n, C) updated in place.
*/
#include <sys/resource.h>
#include <type_traits>
#include <sys/stat.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>   // CUtensorMap, PFN_cuTensorMapEncodeTiled (kernels/attention.cuh)
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <nvtx3/nvToolsExt.h>
#include "common/util.h"
#include "common/config.h"
#include "common/args.h"
#include "common/dataloader.h"
#include "common/checkpoint.h"
#include "common/logger.h"
#include "common/tokenizer.h"
#include "common/gpu_api.h"
#include "common/dist.h"   // here, outside the namespace: it includes system headers (and nccl.h)

#define TRAINER_HAS_HC   // common/train_loop.h: this trainer runs -r hc
#define TRAINER_HAS_OP_TIMES   // common/train_loop.h: -op_times 1 (op_times_on, op_times_print: kernels/common.cuh)

#ifdef PRECISION_FP32
typedef float floatX;
#define MHAR_PREC fp32
#define PRECISION_NAME "fp32"
#define CUDA_FLOATX CUDA_R_32F
#define CUBLAS_COMPUTE CUBLAS_COMPUTE_32F_PEDANTIC   // true fp32: no TF32 tensor cores
#else
typedef __nv_bfloat16 floatX;
#define MHAR_PREC bf16
#define PRECISION_NAME "bf16"
#define CUDA_FLOATX CUDA_R_16BF
#define CUBLAS_COMPUTE CUBLAS_COMPUTE_32F            // bf16 inputs, fp32 accumulation
#endif

// API names mhar_gpu_<precision>_<name> (common/gpu_api.h)
#define MHAR_API3(p, n) mhar_gpu_##p##_##n
#define MHAR_API2(p, n) MHAR_API3(p, n)
#define MHAR_API(n) MHAR_API2(MHAR_PREC, n)

namespace {   // everything but the API and main is internal to this object

// the ops, in train_mhar.c's order
#include "kernels/common.cuh"
#include "kernels/matmul.cuh"
#include "kernels/encoder.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/qknorm_rope.cuh"
#include "kernels/attention.cuh"
#include "kernels/swiglu.cuh"
#include "kernels/route_forward.cuh"
#include "kernels/route_backward.cuh"
#include "kernels/hc.cuh"
#include "kernels/delta.cuh"
#include "kernels/crossentropy.cuh"
#include "kernels/adamw.cuh"

// ----------------------------------------------------------------------------
// The model

// Named views into one allocation, in checkpoint order (config.h's enum):
// ParamTensors<floatX> for the weights the kernels read, ParamTensors<float>
// for the fp32 master weights and gradients.
//
// The GPU order. The flat arrays on the device (master, floatX copy, gradients, AdamW
// state) hold the checkpoint's tensors in the checkpoint's order but for two runs of
// them, wq wk wv and wg wu (each (L, rows, C)). There the device keeps each layer's
// matrices together, layer after layer:
//   wqkv_l = [wq_l; wk_l; wv_l]  (QD + 2 KVD, C)      wgu_l = [wg_l; wu_l]  (2F, C)
// so that a sublayer's input projections are one matmul each way. Above all, their
// input gradient then sums over all QD + 2 KVD (or 2F) outputs in one product, where
// one product per matrix would write dln once and read and add to it once per further
// matrix (fp32, N x C each time). The pointers wq and wg point at layer 0's wqkv and
// wgu (w_qkv, w_gu below); wk, wv and wu are NULL. Every copy between host and device
// goes through params_reorder.
template <typename T> struct ParamTensors {
    T *wte, *ln1w, *wq, *wk, *wv, *qnw, *knw, *wo, *ln2w, *wg, *wu, *wd, *lnfw, *rq, *rg;
    T *hcalpha, *hca, *hcbeta, *dnull, *dalpha;
};

template <typename T> void point_params(ParamTensors<T> *p, T *mem, const size_t sizes[NUM_PARAM_TENSORS]) {
    T **ptrs[NUM_PARAM_TENSORS] = {&p->wte, &p->ln1w, &p->wq, &p->wk, &p->wv, &p->qnw, &p->knw,
                                   &p->wo, &p->ln2w, &p->wg, &p->wu, &p->wd, &p->lnfw, &p->rq, &p->rg,
                                   &p->hcalpha, &p->hca, &p->hcbeta, &p->dnull, &p->dalpha};
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { *ptrs[i] = mem; mem += sizes[i]; }
    p->wk = p->wv = p->wu = NULL;   // inside wqkv and wgu (the GPU order)
}
// layer l's [Wq; Wk; Wv] (QD + 2 KVD, C) and [Wg; Wu] (2F, C), in the GPU order
template <typename T> T *w_qkv(const ParamTensors<T> *p, const Config *c, int l) {
    return p->wq + (size_t)l * (c->NH + 2 * c->NKV) * c->HD * c->C;
}
template <typename T> T *w_gu(const ParamTensors<T> *p, const Config *c, int l) {
    return p->wg + (size_t)l * 2 * c->F * c->C;
}
// the GPU order's runs: the first tensor and how many follow it
static const int GPU_RUNS[2][2] = {{P_WQ, 3}, {P_WG, 2}};

// Permutes host, the first n floats of a flat parameter array (the whole array, or a
// leading part that holds both runs), from the checkpoint's order to the GPU's
// (to_gpu = 1) or back (0).
static void params_reorder(const Config *c, float *host, size_t n, int to_gpu) {
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(c, sizes);
    for (int r = 0; r < 2; r++) {
        const int first = GPU_RUNS[r][0], count = GPU_RUNS[r][1];
        size_t off = 0;
        for (int t = 0; t < first; t++) { off += sizes[t]; }
        size_t run = 0, layer = 0;   // floats in the run, in one layer of it
        for (int t = first; t < first + count; t++) { run += sizes[t]; layer += sizes[t] / c->L; }
        if (off + run > n) { die("internal: params_reorder over %zu floats, the run ends at %zu", n, off + run); }
        float *src = (float *)malloc_check(run * sizeof(float)), *dst = host + off;
        memcpy(src, dst, run * sizeof(float));
        size_t file_at = 0, in_layer = 0;   // tensor t's start in the checkpoint's run, and in a GPU layer
        for (int t = first; t < first + count; t++) {
            const size_t rows = sizes[t] / c->L;   // floats of tensor t in one layer
            for (int l = 0; l < c->L; l++) {
                size_t f = file_at + l * rows, g = l * layer + in_layer;   // its layer l, in either order
                if (to_gpu) { memcpy(dst + g, src + f, rows * sizeof(float)); }
                else { memcpy(dst + f, src + g, rows * sizeof(float)); }
            }
            file_at += sizes[t];
            in_layer += rows;
        }
        free(src);
    }
}

// Forward activations kept for backward, in one device allocation. N = B*T
// positions, J = 2L+1 slots / routing sites, QD = NH*HD, KVD = NKV*HD.
// floatX unless marked fp32.
#define NUM_ACT_TENSORS 29
typedef struct {
    floatX *slots;  // (NS, N, C) sources v_i / block sums (mhar), residual stream x_j (std, delta), then
                    //            delta's null source and block sums b_k (NS = num_slots, config.h)
    float *slot_r;  // (NS, N)    fp32: r_i of each slot that is a routing source (mhar, delta)
    float *route_lse; // (J, N, H)  fp32 log-sum-exp of each site's routing scores per head (mhar):
                      //            the weights a = exp(s - lse) are recomputed in backward
    float *route_qg;  // (J, C)     fp32 q * gamma of every site, refreshed by each forward (mhar)
    float *route_qgp; // (J, C)     the same in pair order (route_qg_forward), for the slot gather's
                      //            fast instance (C a multiple of 256; unused otherwise)
    floatX *h;      // (J, N, C)  routed inputs h_j, h_final at j = 2L (mhar; std reads slots; hc
                    //            recomputes its reads from the streams); delta: the routed mixes mix_j
    float *null_r;  // (J)        fp32: delta: r of each site's null source
    floatX *gate;   // (N, C)     delta: the site input h_j = x_j + alpha_j mix_j, of the site being
                    //            processed (the backward recomputes it, bit for bit)
    floatX *hcx;    // (2L-1, N, n, C)  hc streams X_j after sublayer j-1, j = 1..2L-1 (X_0 is n copies
                    //            of slot 0, and X_2L is recomputed by the backward: neither stored) (hc)
    float *hc_w;    // (J, n)     fp32 hc read weights softmax(alpha_j); [2L] = 1/n (hc; hc_prepare)
    float *hc_A32;  // (2L, n, n) fp32 copy of hc's A (hc; hc_prepare)
    float *hc_beta32; // (2L, n)  fp32 copy of hc's beta (hc; hc_prepare)
    floatX *ln;     // (J, N, C)  normalised sublayer inputs u_j; [2L] = final norm. mhar: one (N, C)
                    //            buffer, u of the last site written; the backward recomputes u_j
                    //            into it from h_j and rstd_j (route_site_backward, fused)
    float *ln_rstd; // (J, N)     fp32
    floatX *qr;     // (L, N, QD)  Wq u, before QK-norm
    floatX *kr;     // (L, N, KVD)
    floatX *q;      // (L, N, QD)  after QK-norm and RoPE
    floatX *k;      // (L, N, KVD)
    floatX *v;      // (L, N, KVD)
    float *q_rstd;  // (L, N, NH)  fp32
    float *k_rstd;  // (L, N, NKV) fp32
    float *att_lse; // (L, B, NH, T)  fp32 log-sum-exp of each attention row (the CPU keeps att)
    floatX *atty;   // (L, N, QD)  attention output before Wo
    floatX *mgu;    // (L, N, 2F)  [mg | mu] a row: the gate pre-activation Wg u, then the up
                    //             projection Wu u (one matmul by [Wg; Wu]; train_mhar.c's mg, mu)
    floatX *mh;     // (L, N, F)  silu(mg) * mu
    floatX *out;    // (N, C)  output of the current sublayer when its slot chains (scratch; else the
                    //         sublayer writes its slot directly, and full mhar has none)
    floatX *logits; // (N, V)  (dlogits in backward)
    float *losses;  // (N)  fp32 (the CPU keeps probs and losses outside Acts)
    float *ce_lse;  // (N)  fp32 log-sum-exp of the logits
} Acts;

// Backward scratch and gradients of activations, in one device allocation.
// fp32 unless marked floatX (those are inputs of matmul backwards).
#define NUM_GRAD_ACT_TENSORS 24
typedef struct {
    float *dslots;  // (N, C)  gradient of one slot at a time, from slot 2L down to slot 0. std: the
                    // running gradient of the residual stream, dL/dx_j after site j's norm backward
                    // added into it; mhar: route_slot_backward turns dslot j+1 into dslot j in place;
                    // hc: only dslot 0, the embedding's gradient (site 0's read backward)
    float *dln;     // (N, C)  gradient of the normalised input u_j
    floatX *dout;   // (N, C)  floatX copy of the gradient of the current sublayer's output
    floatX *datty;  // (N, QD)  gradient of the attention output (floatX: attention_sublayer_backward says why)
    float *dq;      // (N, QD)  grad of q (after QK-norm and RoPE)
    float *dk;      // (N, KVD)
    floatX *dqkv;   // (N, QD + 2 KVD)  [dqr | dkr | dv] a row: the grads of the raw Wq u, Wk u and of
                    //                  v, the output of one matmul by [Wq; Wk; Wv] (w_qkv)
    floatX *dmh;    // (N, F)
    floatX *dmgu;   // (N, 2F)  [dmg | dmu] a row (as Acts.mgu)
    floatX *route_G;   // (J, N, C)  G_j = dL/dh_j of every site, kept for the slot gathers (mhar)
    float *route_S;    // (J, N, H)  G_j[h] . h_j[h] (mhar)
    float *route_dsr;  // (N, H, J rounded up to 4)  ds r of the slot being gathered, per reading site (mhar)
    float *route_part; // (N/32, C)  per-block partials of the site passes' norm-weight sums (mhar)
    float *route_qpart; // (N/128 * J, C)  per-partition partials of the q/gamma passes (mhar)
    float *route_qv;   // (pairs, C)  sum over positions of ds r v per (site, source) pair (mhar)
    float *route_fwdp; // (K-1, N, C), then (K-1, N, H): the grouped routing forward's partials (mhar,
                       // K = Model.fwd_kmax > 1); forward scratch, inside route_G when they fit
    HcGrad hc_dX;   // (N, n, C)  hc: A_j^T dX_{j+1}, the streams' gradient from the updates above
                    //            site j, updated in place from site 2L down to site 1 (hc; bf16
                    //            build: 24 bits a value, kernels/hc.cuh)
    float *hc_partial; // (J, hc_partial_floats(N, n, C))  per site: per-part sums of dw, dA, dbeta and the norm
                       //            weight's gradient (hc)
    float *att_D;   // (B, NH, T)  dout . out per attention row
    float *partial; // (RED_PARTS_MAX, C)  per-partition sums of the deterministic reductions
    float *site_part;  // (J, RED_PARTS_MAX, C)  std: each site's norm-weight partials, kept until the one
                       // reduction of all the sites after site 0 (J MiB at C = 512: 25 MiB at 100m)
    float *delta_dh;   // (N, C)  delta: dL/dh_j of the site being processed
    float *delta_db;   // (N, C)  delta: the gradient of the block sum b_k that the current sublayers write
    float *delta_part; // (RED_PARTS_MAX, C + H + 1)  delta: partials of the null's and the gate's sums
} GradActs;

typedef struct {
    Config cfg;
    size_t sizes[NUM_PARAM_TENSORS];
    size_t nparams;
    ParamTensors<floatX> params;    // the weights the kernels read (the master itself in fp32)
    ParamTensors<float> master, grads;
    float *params_mem, *grads_mem;  // fp32 master weights and gradients (device)
    floatX *paramsX_mem;            // floatX copy of the master (== params_mem in fp32)
    float *adam_m, *adam_v;         // AdamW state, allocated at the first update
    int maxB, maxT;                 // activation buffers fit batches up to maxB x maxT
    Acts acts;
    GradActs gacts;
    void *acts_mem, *gacts_mem;
    float *rope_cos, *rope_sin;     // (T, HD/2) device
    size_t *pair_off;               // (J+1) routing pairs before site j (host)
    int *site_src;                  // (J, NS) device: the slots read by site j, row j (delta reads up to J+1)
    int *site_n;                    // (J) host: the number of sources of site j
    int *slot_rd;                   // (NS, J) device: the sites reading slot k (increasing), row k
    int *slot_rd_pair;              // (NS, J) device: their (site, source) pair indices, row k
    int *slot_nr;                   // (NS) host: the number of sites reading slot k
    int *d_pair_off;                // (J+1) device: pair_off as int
    RouteGeo route_geo;             // lane layout of the fused routing kernels (mhar)
    int *fwd_lead;                  // (J) host: the first site of site j's routing forward group (route_fwd_plan)
    int fwd_kmax, fwd_starts;       // the largest group; the sites that start from a partial
    int *d_inputs, *d_targets;      // the current batch (B, T) on the device
    int *enc_scratch;               // (3N+1) device: the positions of each token (encoder_backward)
    int *enc_plan;                  // (3N+1) pinned host: the same, sorted on the host (encoder_backward_plan)
    int enc_nseg;                   // its number of distinct tokens
    cudaEvent_t enc_plan_sent;      // recorded after enc_plan's upload: the host may write it again
    double *norm_part;              // (NORM_BLOCKS) device: grad_norm's per-block partials
    int *inputs, *targets;          // host copies of the current batch
    float *losses_host;             // (N)
    int B, T;                       // shape of the last forward
    float loss;                     // mean loss of the last forward with targets
    float ce_dloss;                 // the dloss with which the last forward already wrote dlogits over the
                                    // logits (crossentropy_fused); 0: model_backward runs crossentropy_backward
    float lr_new;                   // delta: learning-rate multiple of the new parameters (-lr_new)
    float lr_route;                 // mhar: the routing queries' learning-rate multiple (-lr_route)
} Model;

// Copy float32 host parameters (checkpoint layout) into the master and floatX copies.
void model_set_params(Model *m, const float *host) {
    float *tmp = (float *)malloc_check(m->nparams * sizeof(float));
    memcpy(tmp, host, m->nparams * sizeof(float));
    params_reorder(&m->cfg, tmp, m->nparams, 1);
    cudaCheck(cudaMemcpy(m->params_mem, tmp, m->nparams * sizeof(float), cudaMemcpyHostToDevice));
    free(tmp);
    if ((void *)m->paramsX_mem != (void *)m->params_mem) { cast(m->paramsX_mem, m->params_mem, m->nparams); }
}

// The routing forward's groups (route_fwd_plan, kernels/route_forward.cuh): at most
// 4 sites (and what the layout's kernels hold), taken where they save time, or with
// all wherever the slots allow (the GPU checks: small models seldom group otherwise).
// src (J, J) host: the sites' sources. Before the activations are allocated.
void model_plan_forward(Model *m, const int *src, int all) {
    const Config *cfg = &m->cfg;
    const int J = 2 * cfg->L + 1;
    m->fwd_kmax = 1;
    m->fwd_starts = 0;
    for (int j = 0; j < J; j++) { m->fwd_lead[j] = j; }
    if (cfg->mode != RES_MHAR) { return; }
    const int kmax = route_fwd_kmax(m->route_geo) < 4 ? route_fwd_kmax(m->route_geo) : 4;
    m->fwd_starts = route_fwd_plan(J, m->site_n, src, J, cfg->C, cfg->H, (int)sizeof(floatX), kmax, all, m->fwd_lead);
    for (int j = 0; j < J; j++) {   // the largest group made (sizes the partials)
        if (j - m->fwd_lead[j] + 1 > m->fwd_kmax) { m->fwd_kmax = j - m->fwd_lead[j] + 1; }
    }
}

// Allocate parameters and gradients and set them to SPEC section 6's
// initialisation (params_init: the same float32 bits as the CPU trainer).
// Activations come later, sized for the largest batch.
void model_build(Model *m, const Config *cfg, uint64_t seed, float init_std) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->lr_new = 1.0f;
    m->lr_route = 1.0f;
    param_sizes(cfg, m->sizes);
    m->nparams = param_count(cfg);
    matmul_setup();
    if (cfg->mode == RES_HC && cfg->n != 1 && cfg->n != 2 && cfg->n != 4 && cfg->n != 8) {
        die("-hc_n %d: the CUDA trainer's hc kernels take 1, 2, 4 or 8 streams; use one of those, or the CPU "
            "trainer train_mhar for other n", cfg->n);
    }
    if (cfg->mode == RES_HC && (cfg->C % 8 != 0 || cfg->C > 2048)) {
        die("-C %d: the CUDA trainer's hc kernels need C a multiple of 8 and at most 2048; use such a width, or "
            "the CPU trainer train_mhar", cfg->C);
    }
    attention_setup(cfg->HD);
    crossentropy_setup(cfg->Vp);
    cudaCheck(cudaMalloc(&m->params_mem, m->nparams * sizeof(float)));
    cudaCheck(cudaMalloc(&m->grads_mem, m->nparams * sizeof(float)));
    zero(m->grads_mem, m->nparams * sizeof(float));
#ifdef PRECISION_FP32
    m->paramsX_mem = m->params_mem;
#else
    cudaCheck(cudaMalloc(&m->paramsX_mem, m->nparams * sizeof(floatX)));
#endif
    point_params(&m->params, m->paramsX_mem, m->sizes);
    point_params(&m->master, m->params_mem, m->sizes);
    point_params(&m->grads, m->grads_mem, m->sizes);
    for (int r = 0; r < 2; r++) {   // adamw_update treats the tensors of a GPU-order run alike
        for (int t = GPU_RUNS[r][0]; t < GPU_RUNS[r][0] + GPU_RUNS[r][1]; t++) {
            if (param_is_decayed(t) != param_is_decayed(GPU_RUNS[r][0]) || param_lr_scale(cfg, t, 2, 3) != 1) {
                die("internal: tensor %d of a GPU-order run has its own weight decay or learning rate", t);
            }
        }
    }
    float *init = (float *)malloc_check(m->nparams * sizeof(float));
    params_init(init, cfg, seed, init_std);
    model_set_params(m, init);
    free(init);
    int half = cfg->HD / 2;
    float *cs = (float *)malloc_check((size_t)cfg->T * half * 2 * sizeof(float));
    for (int t = 0; t < cfg->T; t++) {
        for (int i = 0; i < half; i++) {
            double angle = t * pow(10000.0, -2.0 * i / cfg->HD);
            cs[t * half + i] = (float)cos(angle);
            cs[(size_t)cfg->T * half + t * half + i] = (float)sin(angle);
        }
    }
    cudaCheck(cudaMalloc(&m->rope_cos, (size_t)cfg->T * half * 2 * sizeof(float)));
    m->rope_sin = m->rope_cos + (size_t)cfg->T * half;
    cudaCheck(cudaMemcpy(m->rope_cos, cs, (size_t)cfg->T * half * 2 * sizeof(float), cudaMemcpyHostToDevice));
    free(cs);
    // NS = J slots but in delta (its null and block sums after them); a site reads at most J+1
    // slots (delta: the null, b_0 and up to 2L block sums) and a slot is read by at most J sites
    int J = 2 * cfg->L + 1, NS = num_slots(cfg);
    int *src = (int *)calloc_check((size_t)J * NS, sizeof(int));
    m->pair_off = (size_t *)malloc_check((J + 1) * sizeof(size_t));
    m->site_n = (int *)malloc_check(J * sizeof(int));
    m->pair_off[0] = 0;
    for (int j = 0; j < J; j++) {
        m->site_n[j] = site_sources(cfg, j, src + (size_t)j * NS);
        m->pair_off[j + 1] = m->pair_off[j] + m->site_n[j];
        // mhar: site j's last source is slot j, new to it (site_forward's fresh = j)
        if (cfg->mode == RES_MHAR && src[(size_t)j * NS + m->site_n[j] - 1] != j) {
            die("internal: routing site %d's last source is not slot %d", j, j);
        }
    }
    cudaCheck(cudaMalloc(&m->site_src, (size_t)J * NS * sizeof(int)));
    cudaCheck(cudaMemcpy(m->site_src, src, (size_t)J * NS * sizeof(int), cudaMemcpyHostToDevice));
    // the other way round, for the slot gathers: the sites reading slot k and the pair of each
    int *rd = (int *)calloc_check((size_t)2 * NS * J, sizeof(int)), *rd_pair = rd + (size_t)NS * J;
    int *off = (int *)malloc_check((J + 1) * sizeof(int));
    m->slot_nr = (int *)calloc_check(NS, sizeof(int));
    for (int j = 0; j < J; j++) {
        off[j] = (int)m->pair_off[j];
        for (int i = 0; i < m->site_n[j]; i++) {
            int k = src[(size_t)j * NS + i], x = m->slot_nr[k]++;
            rd[(size_t)k * J + x] = j;
            rd_pair[(size_t)k * J + x] = (int)m->pair_off[j] + i;
        }
    }
    off[J] = (int)m->pair_off[J];
    cudaCheck(cudaMalloc(&m->slot_rd, (size_t)2 * NS * J * sizeof(int)));
    m->slot_rd_pair = m->slot_rd + (size_t)NS * J;
    cudaCheck(cudaMemcpy(m->slot_rd, rd, (size_t)2 * NS * J * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&m->d_pair_off, (J + 1) * sizeof(int)));
    cudaCheck(cudaMemcpy(m->d_pair_off, off, (J + 1) * sizeof(int), cudaMemcpyHostToDevice));
    if (cfg->mode == RES_MHAR || cfg->mode == RES_DELTA) { m->route_geo = route_geometry(cfg->C, cfg->H); }
    int cw = cfg->C / 32;   // delta_null_backward's shapes (kernels/delta.cuh)
    if (cfg->mode == RES_DELTA && (cfg->C % 32 != 0 || (cw & (cw - 1)) != 0 || cw > 32 || cfg->H > 32)) {
        die("-r delta: C=%d H=%d; the GPU trainer's delta mode takes C = 32, 64, .., 1024 (32 times a power of two) "
            "and H <= 32", cfg->C, cfg->H);
    }
    m->fwd_lead = (int *)malloc_check(J * sizeof(int));
    model_plan_forward(m, src, 0);
    free(src); free(rd); free(off);
}

// Lay out tensors of mixed element sizes in one device allocation (each 256-byte aligned, zeroed).
typedef struct { void **ptr; size_t count, elem; } TensorSpec;
void *alloc_tensors(TensorSpec *spec, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) { total += (spec[i].count * spec[i].elem + 255) / 256 * 256; }
    char *mem;
    cudaCheck(cudaMalloc((void **)&mem, total > 0 ? total : 256));
    zero(mem, total);
    char *p = mem;
    for (int i = 0; i < n; i++) { *spec[i].ptr = p; p += (spec[i].count * spec[i].elem + 255) / 256 * 256; }
    return mem;
}

// Allocate activations for batches of up to B x T (once).
void model_alloc_acts(Model *m, int B, int T) {
    const Config *c = &m->cfg;
    size_t N = (size_t)B * T, C = c->C, L = c->L, J = 2 * L + 1, F = c->F, NS = num_slots(c);
    size_t QD = (size_t)c->NH * c->HD, KVD = (size_t)c->NKV * c->HD;
    int mhar = c->mode == RES_MHAR, hc = c->mode == RES_HC, delta = c->mode == RES_DELTA, routed = mhar || delta;
    size_t hn = hc ? (size_t)c->n : 0;   // hc streams (0: no hc buffers)
    size_t pairs = routed ? m->pair_off[J] : 0;
    int any_chain = 0;   // does some slot chain (std, block mode)? Then a->out is needed
    for (size_t j = 0; j + 1 < J; j++) { any_chain |= slot_chains(c, (int)j); }
    Acts *a = &m->acts;
    const size_t X = sizeof(floatX), S = sizeof(float);
    TensorSpec as[NUM_ACT_TENSORS] = {
        {(void **)&a->slots, NS * N * C, X}, {(void **)&a->slot_r, routed ? NS * N : 0, S},
        {(void **)&a->route_lse, routed ? J * N * c->H : 0, S}, {(void **)&a->route_qg, routed ? J * C : 0, S},
        {(void **)&a->route_qgp, routed ? J * C : 0, S},
        {(void **)&a->h, routed ? J * N * C : 0, X}, {(void **)&a->null_r, delta ? J : 0, S},
        {(void **)&a->gate, delta ? N * C : 0, X},
        {(void **)&a->hcx, (J - 2) * N * hn * C, X}, {(void **)&a->hc_w, J * hn, S},
        {(void **)&a->hc_A32, (J - 1) * hn * hn, S}, {(void **)&a->hc_beta32, (J - 1) * hn, S},
        {(void **)&a->ln, mhar ? N * C : J * N * C, X}, {(void **)&a->ln_rstd, J * N, S},
        {(void **)&a->qr, L * N * QD, X}, {(void **)&a->kr, L * N * KVD, X},
        {(void **)&a->q, L * N * QD, X}, {(void **)&a->k, L * N * KVD, X}, {(void **)&a->v, L * N * KVD, X},
        {(void **)&a->q_rstd, L * N * c->NH, S}, {(void **)&a->k_rstd, L * N * c->NKV, S},
        {(void **)&a->att_lse, L * N * c->NH, S}, {(void **)&a->atty, L * N * QD, X},
        {(void **)&a->mgu, L * N * 2 * F, X}, {(void **)&a->mh, L * N * F, X},
        {(void **)&a->out, any_chain ? N * C : 0, X}, {(void **)&a->logits, N * c->Vp, X},
        {(void **)&a->losses, N, S}, {(void **)&a->ce_lse, N, S}};
    m->acts_mem = alloc_tensors(as, NUM_ACT_TENSORS);

    GradActs *g = &m->gacts;
    // routing scratch: site partials (N/32 blocks) and slot partials (N/128 partitions x up to J readers)
    size_t route_parts = mhar ? ceil_div(N, ROUTE_POS_PER_BLOCK) : 0;
    size_t route_qparts = routed ? ceil_div(N, ROUTE_PART_ROWS) * J : 0;
    // the grouped forward's partials go into route_G (written and read only in backward) when they
    // fit (bf16 with groups of 4: whenever L >= 3), else into a buffer of their own
    size_t fwdp = mhar ? (size_t)(m->fwd_kmax - 1) * N * (C + c->H) : 0;
    int fwdp_in_G = fwdp * sizeof(float) <= J * N * C * sizeof(floatX);
    void *hc_dX = NULL;
    TensorSpec gs[NUM_GRAD_ACT_TENSORS] = {
        {(void **)&g->dslots, N * C, S}, {(void **)&g->dln, N * C, S},
        {(void **)&g->dout, N * C, X}, {(void **)&g->datty, N * QD, X},
        {(void **)&g->dq, N * QD, S}, {(void **)&g->dk, N * KVD, S},
        {(void **)&g->dqkv, N * (QD + 2 * KVD), X}, {(void **)&g->dmh, N * F, X}, {(void **)&g->dmgu, N * 2 * F, X},
        {(void **)&g->route_G, routed ? J * N * C : 0, X}, {(void **)&g->route_S, routed ? J * N * c->H : 0, S},
        {(void **)&g->route_dsr, routed ? N * c->H * route_nrp((int)J) : 0, S}, {(void **)&g->route_part, route_parts * C, S},
        {(void **)&g->route_qpart, route_qparts * C, S},
        {(void **)&g->route_qv, pairs * C, S}, {(void **)&g->route_fwdp, fwdp_in_G ? 0 : fwdp, S},
        {&hc_dX, N * hn * C, HcGrad::bytes},
        {(void **)&g->hc_partial, hc ? J * hc_partial_floats(N, c->n, c->C) : 0, S},
        {(void **)&g->att_D, N * c->NH, S}, {(void **)&g->partial, (size_t)RED_PARTS_MAX * C, S},
        {(void **)&g->site_part, c->mode == RES_STD ? J * RED_PARTS_MAX * C : 0, S},
        {(void **)&g->delta_dh, delta ? N * C : 0, S}, {(void **)&g->delta_db, delta ? N * C : 0, S},
        {(void **)&g->delta_part, delta ? (size_t)RED_PARTS_MAX * (C + c->H + 1) : 0, S}};
    m->gacts_mem = alloc_tensors(gs, NUM_GRAD_ACT_TENSORS);
    g->hc_dX = HcGrad::of(hc_dX, N * hn * C);
    if (fwdp_in_G) { g->route_fwdp = (float *)g->route_G; }   // (256-byte aligned, as every tensor here)

    cudaCheck(cudaMalloc(&m->d_inputs, N * sizeof(int)));
    cudaCheck(cudaMalloc(&m->d_targets, N * sizeof(int)));
    cudaCheck(cudaMalloc(&m->enc_scratch, (3 * N + 1) * sizeof(int)));
    cudaCheck(cudaMallocHost(&m->enc_plan, (3 * N + 1) * sizeof(int)));
    cudaCheck(cudaEventCreateWithFlags(&m->enc_plan_sent, cudaEventDisableTiming));
    cudaCheck(cudaMalloc(&m->norm_part, NORM_BLOCKS * sizeof(double)));
    m->inputs = (int *)calloc_check(N, sizeof(int));
    m->targets = (int *)calloc_check(N, sizeof(int));
    m->losses_host = (float *)calloc_check(N, sizeof(float));
    m->maxB = B; m->maxT = T;
#ifndef TESTING
    if (mhar) {
        printf("routing forward: %s kernel; groups of up to %d sites, %d of %zu sites start from a partial%s\n",
               route_fwd_kmax(m->route_geo) > 1 ? "fast" : "fallback", m->fwd_kmax, m->fwd_starts, J,
               m->fwd_kmax > 1 ? (fwdp_in_G ? " (partials in route_G)" : " (partials in their own buffer)") : "");
    }
#endif
    if (routed) {   // the lean gather's index math for this shape, on the CPU (dies on a mismatch; delta:
                    // slots 0 .. J-1, b_0 with its J readers the widest)
        int *rd = (int *)malloc_check(J * J * sizeof(int));
        cudaCheck(cudaMemcpy(rd, m->slot_rd, J * J * sizeof(int), cudaMemcpyDeviceToHost));
        int lean = route_gather_index_check(m->route_geo, rd, m->slot_nr, J, N);
        free(rd);
#ifndef TESTING
        int qtc = 0;   // the slots whose q/gamma pass runs on tensor cores
        for (size_t k = 0; k < J; k++) { qtc += route_qg_tc_fits(c->C, c->H, m->slot_nr[k]); }
        printf("routing gather: lean path for %d of %zu slots, index check at N = %zu passed; q/gamma pass on "
               "tensor cores for %d\n", lean, J, N, qtc);
#else
        (void)lean;
#endif
    }
}

// Attention sublayer of block l: out (N, C) = Wo attn(rope(qknorm(Wq u)), ...)
void attention_sublayer_forward(Model *m, int l, const floatX *u, floatX *out, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    ParamTensors<floatX> *p = &m->params;
    size_t N = (size_t)B * T, C = c->C, HD = c->HD, QD = c->NH * HD, KVD = c->NKV * HD;
    floatX *qr = a->qr + l * N * QD, *kr = a->kr + l * N * KVD;
    floatX *q = a->q + l * N * QD, *k = a->k + l * N * KVD, *v = a->v + l * N * KVD;
    float *q_rstd = a->q_rstd + l * N * c->NH, *k_rstd = a->k_rstd + l * N * c->NKV;
    float *lse = a->att_lse + l * N * c->NH;
    floatX *atty = a->atty + l * N * QD;
    const floatX *wqkv = w_qkv(p, c, l);   // [Wq; Wk; Wv]
    op_range("fwd matmul qkv");
    matmul_forward(qr, u, wqkv, N, C, QD);
    matmul_forward(kr, u, wqkv + QD * C, N, C, KVD);
    matmul_forward(v, u, wqkv + (QD + KVD) * C, N, C, KVD);
    op_range("fwd qk-norm + rope");
    qknorm_rope_forward(q, q_rstd, qr, p->qnw + l * HD, m->rope_cos, m->rope_sin, B, T, c->NH, HD);
    qknorm_rope_forward(k, k_rstd, kr, p->knw + l * HD, m->rope_cos, m->rope_sin, B, T, c->NKV, HD);
    op_range("fwd attention");
    attention_forward(atty, lse, q, k, v, B, T, c->NH, c->NKV, HD);
    op_range("fwd matmul o");
    matmul_forward(out, atty, p->wo + l * C * QD, N, QD, C);
}

// dln (N, C) = gradient of the input u (set by one matmul), given dout (floatX);
// weight grads += but for Wq, Wk, Wv, which read u:
// attention_sublayer_weight_backward adds those once the site's backward has
// recomputed u (mhar keeps one u buffer)
void attention_sublayer_backward(Model *m, int l, const floatX *dout, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    ParamTensors<floatX> *p = &m->params;
    ParamTensors<float> *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, HD = c->HD, QD = c->NH * HD, KVD = c->NKV * HD, QKVD = QD + 2 * KVD;
    floatX *qr = a->qr + l * N * QD, *kr = a->kr + l * N * KVD;
    floatX *q = a->q + l * N * QD, *k = a->k + l * N * KVD, *v = a->v + l * N * KVD;
    float *q_rstd = a->q_rstd + l * N * c->NH, *k_rstd = a->k_rstd + l * N * c->NKV;
    float *lse = a->att_lse + l * N * c->NH;
    floatX *atty = a->atty + l * N * QD;
    floatX *dqr = g->dqkv, *dkr = g->dqkv + QD, *dv = g->dqkv + QD + KVD;   // column blocks of dqkv's rows
    // out = atty . Wo^T. datty is floatX: the matmul sums in fp32 and rounds
    // once; in the bf16 build the flash kernels take it as a bf16 wgmma operand
    // (TMA tiles) anyway, and their D = rowsum(datty * atty) then comes from the
    // very values that make dP, as dS = P (dP - D) needs (D = sum_j P dP).
    op_range("bwd matmul o");
    matmul_backward(g->datty, dp->wo + l * C * QD, dout, atty, p->wo + l * C * QD, N, QD, C);
    // atty = attention(q, k, v): writes dq, dk (fp32, from fp32 accumulators:
    // no rounding before RoPE and the QK-norm backward, whose projection
    // -s^3/D (g.x) x can cancel) and dv (floatX: only the Wv matmul reads it).
    // bf16 at HD 64/128 on sm_90a: the wgmma dk/dv pass (a block owns 64 keys of
    // a kv head) and dq pass (64 query rows); each element written once
    op_range("bwd attention");
    attention_backward(g->dq, g->dk, dv, QKVD, g->att_D, g->datty, atty, lse, q, k, v, B, T, c->NH, c->NKV, HD);
    // q = rope(qn), k = rope(kn)
    op_range("bwd qk-norm + rope");
    // q = rope(rmsnorm(qr; qnw)), k = rope(rmsnorm(kr; knw)): writes dqr, dkr
    qknorm_rope_backward(dqr, dp->qnw + l * HD, g->dq, qr, q_rstd, p->qnw + l * HD, m->rope_cos, m->rope_sin,
                         B, T, c->NH, HD, QKVD, g->partial);
    qknorm_rope_backward(dkr, dp->knw + l * HD, g->dk, kr, k_rstd, p->knw + l * HD, m->rope_cos, m->rope_sin,
                         B, T, c->NKV, HD, QKVD, g->partial);
    op_range("bwd matmul qkv");
    // qr = u Wq^T, kr = u Wk^T, v = u Wv^T, i.e. [qr | kr | v] = u [Wq; Wk; Wv]^T: dln, in one product
    matmul_backward_inp(g->dln, g->dqkv, w_qkv(p, c, l), N, C, QKVD);
}
// the rest of its backward: dWq, dWk, dWv += from the dqr, dkr, dv it left and the input u
void attention_sublayer_weight_backward(Model *m, int l, const floatX *u, int B, int T) {
    const Config *c = &m->cfg;
    GradActs *g = &m->gacts;
    ParamTensors<float> *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, QKVD = (c->NH + 2 * c->NKV) * c->HD;
    op_range("bwd matmul qkv");
    // [qr | kr | v] = u [Wq; Wk; Wv]^T: the weights, in one product
    matmul_backward_weight(w_qkv(dp, c, l), g->dqkv, u, N, C, QKVD);
}

// MLP sublayer of block l: out (N, C) = Wd (silu(Wg u) * (Wu u))
void mlp_sublayer_forward(Model *m, int l, const floatX *u, floatX *out, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    ParamTensors<floatX> *p = &m->params;
    size_t N = (size_t)B * T, C = c->C, F = c->F;
    floatX *mgu = a->mgu + l * N * 2 * F, *mh = a->mh + l * N * F;
    op_range("fwd matmul gate/up");
    // mg = u Wg^T, mu = u Wu^T, as [mg | mu] = u [Wg; Wu]^T
    matmul_forward(mgu, u, w_gu(p, c, l), N, C, 2 * F);
    op_range("fwd swiglu");
    swiglu_forward(mh, mgu, N, F);
    op_range("fwd matmul down");
    matmul_forward(out, mh, p->wd + l * C * F, N, F, C);
}

// dln (N, C) = gradient of the input u (set by one matmul), given dout; weight
// grads += but for Wg, Wu (mlp_sublayer_weight_backward, as for attention)
void mlp_sublayer_backward(Model *m, int l, const floatX *dout, int B, int T) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    ParamTensors<floatX> *p = &m->params;
    ParamTensors<float> *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, F = c->F;
    floatX *mgu = a->mgu + l * N * 2 * F, *mh = a->mh + l * N * F;
    // out = mh Wd^T
    op_range("bwd matmul down");
    matmul_backward(g->dmh, dp->wd + l * C * F, dout, mh, p->wd + l * C * F, N, F, C);
    // mh = silu(mg) * mu   (writes dmgu = [dmg | dmu])
    op_range("bwd swiglu");
    swiglu_backward(g->dmgu, g->dmh, mgu, N, F);
    // [mg | mu] = u [Wg; Wu]^T: dln, in one product
    op_range("bwd matmul gate/up");
    matmul_backward_inp(g->dln, g->dmgu, w_gu(p, c, l), N, C, 2 * F);
}
// the rest of its backward: dWg, dWu += from the dmg, dmu it left and the input u
void mlp_sublayer_weight_backward(Model *m, int l, const floatX *u, int B, int T) {
    const Config *c = &m->cfg;
    GradActs *g = &m->gacts;
    ParamTensors<float> *dp = &m->grads;
    size_t N = (size_t)B * T, C = c->C, F = c->F;
    op_range("bwd matmul gate/up");
    // [mg | mu] = u [Wg; Wu]^T: the weights, in one product
    matmul_backward_weight(w_gu(dp, c, l), g->dmgu, u, N, C, 2 * F);
}

#define SLOT(j) (a->slots + (size_t)(j) * N * C)
// u_j: std, hc and delta keep every site's; mhar one buffer (Acts.ln)
#define ULN(j) (a->ln + (m->cfg.mode != RES_MHAR ? (size_t)(j) * N * C : 0))
// hc: the streams X_j (N, n, C) after sublayer j-1, j >= 1 (X_0: slot 0, standing for its n copies)
#define HCX(j) (a->hcx + (size_t)((j) - 1) * N * m->cfg.n * C)
#define SITE_SRC(j) (m->site_src + (size_t)(j) * num_slots(&m->cfg))
#define SLOT_RD(k) (m->slot_rd + (size_t)(k) * (2 * m->cfg.L + 1))
#define SLOT_RD_PAIR(k) (m->slot_rd_pair + (size_t)(k) * (2 * m->cfg.L + 1))

// The norm weight of site j (C) and its gradient: ln1w of block j/2 before an
// attention sublayer (j even), ln2w before an MLP (j odd), lnfw at j = 2L.
const floatX *site_norm_w(Model *m, int j) {
    const ParamTensors<floatX> *p = &m->params;
    size_t C = m->cfg.C, l = j / 2;
    return j == 2 * m->cfg.L ? p->lnfw : (j % 2 == 0 ? p->ln1w : p->ln2w) + l * C;
}
float *site_norm_dw(Model *m, int j) {
    ParamTensors<float> *dp = &m->grads;
    size_t C = m->cfg.C, l = j / 2;
    return j == 2 * m->cfg.L ? dp->lnfw : (j % 2 == 0 ? dp->ln1w : dp->ln2w) + l * C;
}


// A delta site (SPEC section 9): u_j = rmsnorm(h_j; w) into ULN(j) with its rstd, where
// h_j = x_j + alpha_j * mix_j and mix_j = route_j([n_j, b_0, b_1 .. b_m]) (config.h's
// slots: x_j = slot j, n_j in slot J, rewritten per site, b_k in slot J+k, b_0 = slot 0).
// route_forward keeps mix_j (a->h) and lse_j; its norm epilogue's u and rstd are
// overwritten by the gated norm, residual_norm_forward's kernel with the gate, so that
// alpha_j = 0 gives std's bits for u_j and rstd_j (site 0: std normalises the embedding
// with rmsnorm_forward, so here too, over h_0 from the gated kernel).
void delta_site_forward(Model *m, int j, size_t N, const floatX *w) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    size_t C = c->C, H = c->H, J = 2 * (size_t)c->L + 1;
    floatX *u = ULN(j), *mix = a->h + (size_t)j * N * C;
    float *rstd = a->ln_rstd + (size_t)j * N;
    const float *alpha = m->master.dalpha + j;
    op_range("fwd delta: null + route");
    // slot J = n_j at every position, and its r
    delta_null_fill(SLOT(J), m->params.dnull + (size_t)j * C, N, c->C);
    source_stat_forward(a->slot_r + J * N, SLOT(J), N, c->C);
    RoutePartials none = {NULL, NULL};
    route_forward(u, rstd, mix, a->route_lse + (size_t)j * N * H, a->slots, a->slot_r, SITE_SRC(j), m->site_n[j],
                  a->route_qg + (size_t)j * C, w, N, m->route_geo, 0, none, none, -1);
    op_range("fwd delta: gate + norm");
    if (j == 0) {
        residual_norm_gated_forward(a->gate, NULL, rstd, SLOT(0), mix, NULL, alpha, N, c->C);
        rmsnorm_forward(u, rstd, a->gate, w, N, c->C);
    } else {
        residual_norm_gated_forward(NULL, u, rstd, SLOT(j), mix, w, alpha, N, c->C);
    }
}

// The normalised input u_j = rmsnorm(h_j; w) of sublayer j (j = 2L: of the LM
// head), written into ULN(j) with its rstd; returns u_j. std: h_j is the
// residual stream x_j = slot j; site 0 normalises the embedding here, and each
// later site's norm was computed with its slot by residual_norm_forward. mhar:
// h_j = route_j over the slots of site j's sources, and route_forward applies
// the norm in the same kernel (keeping h_j and lse_j for backward). Site j's last
// source is slot j, which no earlier site reads (site_sources): where no chained
// add wrote it with its r (model_forward), route_forward computes its r (fresh = j). hc: h_j
// = hc_read of the streams X_j with w_j = softmax(alpha_j) (hc_prepare made the
// weights of every site, as the CPU's hc_weights_forward), and its norm in the same
// kernel (h_j not kept): site 0 reads X_0 = hc_expand(slot 0) here, straight from
// slot 0; each later site's read and norm were fused with the update before it
// (hc_update_read_norm_forward in model_forward).
// Grouped (m->fwd_lead): a group's first site also writes the partials of
// the group's other sites into route_fwdp, and each of those starts from its
// own and reads only the sources after its leader's.
floatX *site_forward(Model *m, int j, size_t N, const floatX *w) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    size_t C = c->C, H = c->H, J = 2 * (size_t)c->L + 1;
    floatX *u = ULN(j);
    float *rstd = a->ln_rstd + (size_t)j * N;
    if (c->mode == RES_STD) {
        if (j == 0) { rmsnorm_forward(u, rstd, SLOT(0), w, N, c->C); }
        return u;
    }
    if (c->mode == RES_HC) {
        // hc_expand_forward + hc_read_forward of site 0, h_0 = sum_r w_0[r] slot 0 (the CPU's sum), and its norm
        if (j == 0) {
            hc_update_read_norm_forward(NULL, u, rstd, SLOT(0), NULL, NULL, NULL, a->hc_w, w, N, c->C, c->n, 1);
        }
        return u;
    }
    if (c->mode == RES_DELTA) { delta_site_forward(m, j, N, w); return u; }
    // partial x (site lead + 1 + x): hbar (N, C) at ph + x N C, lse_p (N, H) at pl + x N H
    const int lead = m->fwd_lead[j];
    float *ph = m->gacts.route_fwdp, *pl = ph + (size_t)(m->fwd_kmax - 1) * N * C;
    int kx = 0;
    while (lead == j && (size_t)(j + kx + 1) < J && m->fwd_lead[j + kx + 1] == j) { kx++; }
    RoutePartials out = {kx > 0 ? ph : NULL, kx > 0 ? pl : NULL}, in = {NULL, NULL};
    int n0 = 0;   // sources already in the partial
    if (lead != j) {
        in.ph = ph + (size_t)(j - lead - 1) * N * C;
        in.pl = pl + (size_t)(j - lead - 1) * N * H;
        n0 = m->site_n[lead];
    }
    route_forward(u, rstd, a->h + (size_t)j * N * C, a->route_lse + (size_t)j * N * H, a->slots, a->slot_r,
                  SITE_SRC(j) + n0, m->site_n[j] - n0, a->route_qg + (size_t)j * C, w, N, m->route_geo, kx, out, in,
                  j == 0 || !slot_chains(c, j - 1) ? j : -1);
    return u;
}

// hc (SPEC section 8): site j's backward, given g->dln = dL/du_j. One fused pass
// (hc_norm_read_update_backward) over the streams for the CPU's rmsnorm_backward and
// hc_read_backward of site j (X_j and h_j recomputed from X_{j-1} and o_{j-1}) and hc_update_backward
// of sublayer j-1: g->hc_dX goes from A_j^T dX_{j+1} (none at j = 2L) to A_{j-1}^T dX_j in
// place, g->dout = do_{j-1} (the dout of sublayer j-1), and the partials of the site's
// parameter sums go into its slice of g->hc_partial (model_backward sums every site's at the
// end, into hc_site_sums(j)). Site 0: the norm's backward, hc_read_backward and
// hc_expand_backward into g->dslots (dslot 0, which encoder_backward reads).
void hc_site_backward(Model *m, int j, size_t N, const floatX *w) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    size_t C = c->C, n = (size_t)c->n, J2 = 2 * (size_t)c->L;
    int last = (size_t)j == J2;
    const float *wj = a->hc_w + (size_t)j * n, *rstd = a->ln_rstd + (size_t)j * N;
    float *part = g->hc_partial + (size_t)j * hc_partial_floats(N, c->n, c->C);   // site j's slice
    op_range("bwd hc: norm + read + update");
    if (j == 0) {   // u_0 = rmsnorm(h_0; w), h_0 = hc_read(X_0), X_0 = hc_expand(slot 0): dslot 0 = sum_r dX_0,r
        zero(g->dslots, N * C * sizeof(float));
        hc_norm_read_update_backward(HcGrad{}, NULL, g->dslots, part, g->hc_dX, g->dln, rstd, w, SLOT(0), wj, NULL,
                                     NULL, NULL, NULL, N, c->C, c->n, 1, 0);
        return;
    }
    // u_j = rmsnorm(h_j; w), h_j = sum_r w_j[r] X_j,r (w_j = softmax(alpha_j));
    // X_j,r = sum_s A_{j-1}[r,s] X_{j-1},s + beta_{j-1}[r] o_{j-1} (o_{j-1} = slot j)
    size_t jp = (size_t)j - 1;
    hc_norm_read_update_backward(g->hc_dX, g->dout, NULL, part, last ? HcGrad{} : g->hc_dX, g->dln, rstd, w, NULL, wj,
                                 j == 1 ? SLOT(0) : HCX(j - 1), SLOT(j), a->hc_A32 + jp * n * n,
                                 a->hc_beta32 + jp * n, N, c->C, c->n, 0, j == 1);
}

// Where site j's parameter sums go (hc_reduce_sites): the norm weight's gradient, dA_{j-1} and
// dbeta_{j-1} of the update before it (none at site 0), and dalpha_j += the softmax's backward of
// dw_j (the CPU's hc_weights_backward; none at site 0, whose streams are equal copies so that
// dalpha_0 = 0, nor at the final read, whose w = 1/n is fixed). dw_j itself is not kept.
HcSums hc_site_sums(Model *m, int j) {
    ParamTensors<float> *dp = &m->grads;
    size_t n = (size_t)m->cfg.n, jp = (size_t)j - 1;
    HcSums t = {NULL, NULL, NULL, NULL, site_norm_dw(m, j), m->acts.hc_w + (size_t)j * n};
    if (j > 0) { t.dA = dp->hca + jp * n * n; t.dbeta = dp->hcbeta + jp * n; }
    if (j > 0 && j < 2 * m->cfg.L) { t.dalpha = dp->hcalpha + (size_t)j * n; }
    return t;
}

// Backward of a delta site (SPEC section 9, the steps in delta_site_forward's
// reverse), given g->dln = dL/du_j; g->dslots holds dL/dx_{j+1} through the stream
// (nothing at the last site), as in std:
//   h_j = x_j + alpha_j mix_j, u_j = rmsnorm(h_j; w): h_j recomputed into a->gate, the
//     norm's dh_j, then dslots becomes dL/dx_j (+= dh_j), G_j = alpha_j dh_j, S_j, dalpha_j
//   mix_j = route_j([n_j, b_0, b_1 .. b_m]): the null's gradient and its pair's q/gamma
//     sum (delta_null_backward: no gather); at j = kS, the smallest site reading b_k, the
//     gather of slot J+k into delta_db (every site reading it has stored G and S now)
//   then g->dout = dL/dout_{j-1} = dslots + db_k (k: the block of sublayer j-1, when complete)
//   and after site 0, the gather of b_0 = x_0 into dslots (chained: added to it).
// The sites' q/gamma sums meet in route_param_backward at the end of model_backward.
void delta_site_backward(Model *m, int j, size_t N, const floatX *w, float *dw) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    size_t C = c->C, H = c->H, J = 2 * (size_t)c->L + 1, S = c->S, nb = delta_blocks(c);
    floatX *mix = a->h + (size_t)j * N * C, *G = g->route_G + (size_t)j * N * C;
    float *Sj = g->route_S + (size_t)j * N * H, *lse = a->route_lse + (size_t)j * N * H;
    op_range("bwd delta: gate + norm");
    // h_j = x_j + alpha_j mix_j (recomputed; its rstd into slot J's spent r row)
    residual_norm_gated_forward(a->gate, NULL, a->slot_r + J * N, SLOT(j), mix, NULL, m->master.dalpha + j, N, c->C);
    // u_j = rmsnorm(h_j; w): dh_j
    rmsnorm_backward_residual(g->delta_dh, NULL, dw, g->dln, a->gate, a->ln_rstd + (size_t)j * N, w, N, c->C, 0,
                              g->partial);
    // h_j = x_j + alpha_j mix_j: dx_j += dh_j, dmix_j = G_j = alpha_j dh_j, dalpha_j
    delta_gate_backward(g->dslots, G, Sj, m->grads.dalpha + j, g->delta_part, g->delta_dh, mix, m->master.dalpha + j,
                        N, c->C, c->H, (size_t)j + 1 < J);
    // slot J = n_j at every position (source 0 of site j)
    op_range("bwd delta: null");
    delta_null_backward(m->grads.dnull + (size_t)j * C, g->route_qv + m->pair_off[j] * C, g->delta_part, G, Sj, lse,
                        m->params.dnull + (size_t)j * C, a->route_qg + (size_t)j * C, a->null_r + j, N, c->C, c->H);
    if (j % S == 0 && j / S >= 1 && j / S <= nb) {   // the gather of b_k, k = j / S
        size_t k = J + j / S;
        op_range("bwd route: slot gather");
        route_slot_backward(g->delta_db, NULL, g->route_dsr, SLOT(k), a->slot_r + k * N, g->route_G, g->route_S,
                            a->route_lse, SLOT_RD(k), m->slot_nr[k], a->route_qg, a->route_qgp, 0, 1, N, J,
                            m->route_geo);
        op_range("bwd route: q/gamma pass");
        route_slot_qgamma(g->route_qv, g->route_qpart, g->route_dsr, SLOT(k), SLOT_RD_PAIR(k), m->slot_nr[k], N,
                          m->route_geo);
    }
    if (j > 0) {   // out_{j-1} is in x_j and, when its block k is complete, in b_k
        delta_dout(g->dout, g->dslots, ((size_t)j - 1) / S + 1 <= nb ? g->delta_db : NULL, N * C);
        return;
    }
    // b_0 = x_0 = slot 0, read by every site: its routing gradient joins the stream's
    op_range("bwd route: slot gather");
    route_slot_backward(g->dslots, NULL, g->route_dsr, SLOT(0), a->slot_r, g->route_G, g->route_S, a->route_lse,
                        SLOT_RD(0), m->slot_nr[0], a->route_qg, a->route_qgp, 1, 1, N, J, m->route_geo);
    op_range("bwd route: q/gamma pass");
    route_slot_qgamma(g->route_qv, g->route_qpart, g->route_dsr, SLOT(0), SLOT_RD_PAIR(0), m->slot_nr[0], N,
                      m->route_geo);
}

// Backward of site j's u_j = rmsnorm(h_j; w), given g->dln = dL/du_j; adds the
// norm weight's gradient into dw. std: h_j = slot j = x_j, and x_{j+1} = x_j +
// out_j, so dslots, which holds dL/dx_{j+1} (nothing at the last site), gets
// the norm's dL/dx_j added and becomes dL/dx_j; the same kernel writes its
// floatX copy g->dout, the dout of sublayer j-1, and leaves the norm weight's
// partials in g->site_part (slice j): model_backward adds every site's into its
// dw in one reduction after site 0. mhar: route_site_backward
// stores G_j = dL/dh_j and S_j, and recomputes u_j into u when u is not NULL
// (std keeps every u_j). Every site that reads slot j is >= j, so all of
// them have stored theirs by now: route_slot_backward gathers slot j's gradient
// into dslots, over the dslot j+1 it holds (added in when slot j+1 = out_j + slot j),
// and route_slot_qgamma sums its readers' shares of the q and gamma gradients.
// hc: hc_site_backward (above).
void site_backward(Model *m, int j, size_t N, const floatX *w, float *dw, floatX *u) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    size_t C = c->C, H = c->H, J = 2 * (size_t)c->L + 1;
    if (c->mode == RES_STD) {   // dw: from the partials in site_part, after site 0 (model_backward)
        rmsnorm_backward_residual(g->dslots, j > 0 ? g->dout : NULL, NULL, g->dln, SLOT(j), a->ln_rstd + j * N, w, N,
                                  c->C, (size_t)j + 1 < J, g->site_part + j * RED_PARTS_MAX * C);
        return;
    }
    if (c->mode == RES_HC) { hc_site_backward(m, (int)j, N, w); return; }
    if (c->mode == RES_DELTA) { delta_site_backward(m, j, N, w, dw); return; }
    op_range("bwd route: site G, S");
    route_site_backward(g->route_G + j * N * C, g->route_S + j * N * H, dw, g->route_part, u, g->dln,
                        a->h + j * N * C, a->ln_rstd + j * N, w, N, m->route_geo);
    int chain = (size_t)j + 1 < J && slot_chains(c, j);
    // the fp32 dslot j is read by the gather of slot j-1 when slot j chains onto it, and by the encoder
    int keep32 = j == 0 || slot_chains(c, j - 1);
    op_range("bwd route: slot gather");
    // dslot j (j > 0) is the output gradient of sublayer j-1: its floatX copy goes straight into g->dout
    route_slot_backward(g->dslots, j > 0 ? g->dout : NULL, g->route_dsr, SLOT(j), a->slot_r + j * N, g->route_G,
                        g->route_S, a->route_lse, SLOT_RD(j), m->slot_nr[j], a->route_qg, a->route_qgp, chain, keep32,
                        N, J, m->route_geo);
    op_range("bwd route: q/gamma pass");
    route_slot_qgamma(g->route_qv, g->route_qpart, g->route_dsr, SLOT(j), SLOT_RD_PAIR(j), m->slot_nr[j], N,
                      m->route_geo);
}

// Forward pass on host inputs (B, T). With targets, also the per-position
// losses and their mean in m->loss; without, it stops at the logits (sampling).
// dloss: 0 when no backward follows (evaluation, sampling) or when the caller
// wants the logits; else the dloss of the model_backward that comes next. Then
// the cross-entropy's backward runs here too, fused with its forward
// (crossentropy_fused: one pass over the logits instead of two), and the logits
// buffer holds dlogits afterwards; model_backward skips that step.
void model_forward(Model *m, const int *inputs, const int *targets, int B, int T, float dloss) {
    const Config *c = &m->cfg;
    if (m->acts_mem == NULL) { model_alloc_acts(m, B, T); }
    if ((size_t)B * T > (size_t)m->maxB * m->maxT || T > m->maxT || T > c->T) {
        die("batch %dx%d exceeds the %dx%d the activations were sized for", B, T, m->maxB, m->maxT);
    }
    m->B = B; m->T = T;
    m->ce_dloss = 0;
    Acts *a = &m->acts;
    ParamTensors<floatX> *p = &m->params;
    size_t N = (size_t)B * T, C = c->C, L = c->L, J = 2 * L + 1, S = c->S;
    int mhar = c->mode == RES_MHAR, hc = c->mode == RES_HC, delta = c->mode == RES_DELTA;
    memcpy(m->inputs, inputs, N * sizeof(int));
    op_range("fwd encoder");
    // the batch's uploads come first, while the queue is empty: a synchronous copy in the middle
    // of the forward would wait for the GPU to drain the queue up to it
    cudaCheck(cudaMemcpy(m->d_inputs, inputs, N * sizeof(int), cudaMemcpyHostToDevice));
    if (targets != NULL) { cudaCheck(cudaMemcpy(m->d_targets, targets, N * sizeof(int), cudaMemcpyHostToDevice)); }
    encoder_forward(SLOT(0), m->d_inputs, p->wte, N, c->C);
    if (mhar || delta) { route_qg_forward(a->route_qg, a->route_qgp, p->rq, p->rg, 2 * L + 1, c->C); }
    if (delta) { source_stat_forward(a->slot_r, SLOT(0), N, c->C); }   // b_0 = x_0 (mhar: site 0 computes r_0)
    if (hc) {   // hc_weights_forward of every site (and 1/n for the final read), A and beta in fp32,
                // from the fp32 master (in bf16 too: tiny tensors, exact weights)
        op_range("fwd hc weights");
        hc_prepare(a->hc_w, a->hc_A32, a->hc_beta32, m->master.hcalpha, m->master.hca, m->master.hcbeta,
                   (int)(2 * L), c->n);
    }
    if (delta) { source_stat_forward(a->null_r, p->dnull, J, c->C); }   // r of each site's null (J rows)
    for (size_t j = 0; j < 2 * L; j++) {
        size_t l = j / 2;
        op_range("fwd route + norm");
        floatX *u = site_forward(m, (int)j, N, site_norm_w(m, (int)j));
        // slot j+1 = output of sublayer j, plus slot j when they chain (config.h): the
        // sublayer writes its output into slot j+1 itself when it does not chain
        int chain = slot_chains(c, (int)j);
        floatX *out = chain ? a->out : SLOT(j + 1);
        if (j % 2 == 0) { attention_sublayer_forward(m, (int)l, u, out, B, T); }
        else { mlp_sublayer_forward(m, (int)l, u, out, B, T); }
        op_range(hc ? "fwd hc update + read + norm" : "fwd residual + r");
        if (hc) {   // hc_update_forward of sublayer j (o_j = slot j+1), hc_read_forward of site j+1 and its
                    // norm, fused: X_{j+1} = A_j X_j + beta_j o_j, h_{j+1} = sum_r w_{j+1}[r] X_{j+1},r,
                    // u_{j+1} = rmsnorm(h_{j+1}; w) with its rstd
            const size_t n = (size_t)c->n;
            floatX *Xn = j + 1 < 2 * L ? HCX(j + 1) : NULL;   // X_2L is not stored: the backward recomputes it
            hc_update_read_norm_forward(Xn, ULN(j + 1), a->ln_rstd + (j + 1) * N, j == 0 ? SLOT(0) : HCX(j),
                                        SLOT(j + 1), a->hc_A32 + j * n * n, a->hc_beta32 + j * n,
                                        a->hc_w + (j + 1) * n, site_norm_w(m, (int)j + 1), N, c->C, c->n, j == 0);
        } else if (delta) {   // x_{j+1} = x_j + out_j (its statistic into slot j+1's unused r row)
            residual_norm_forward(SLOT(j + 1), NULL, a->slot_r + (j + 1) * N, SLOT(j), out, NULL, N, c->C);
        } else if (!mhar) {   // x_{j+1} = x_j + out_j, and site j+1's u_{j+1} = rmsnorm(x_{j+1}) with it
            residual_norm_forward(SLOT(j + 1), ULN(j + 1), a->ln_rstd + (j + 1) * N, SLOT(j), out,
                                  site_norm_w(m, (int)j + 1), N, c->C);
        } else if (chain) {   // block sum: slot j+1 = out_j + slot j, and its r
            residual_norm_forward(SLOT(j + 1), NULL, a->slot_r + (j + 1) * N, SLOT(j), out, NULL, N, c->C);
        }   // (else slot j+1 = out_j, which the sublayer wrote; its r: site j+1's route_forward)
        // delta: x_{j+1} = x_j + out_j (above, its u left to site j+1's gated norm), and b_k (k = the
        // block of sublayer j, when complete) as the running sum of its outputs (SPEC section 9's
        // choice), with its r once whole (the last chained add writes it)
        size_t k = J + j / S + 1;
        if (delta && j / S + 1 <= (size_t)delta_blocks(c)) {
            if (j % S == 0) {
                cudaCheck(cudaMemcpyAsync(SLOT(k), out, N * C * sizeof(floatX), cudaMemcpyDeviceToDevice, 0));
                if (S == 1) { source_stat_forward(a->slot_r + k * N, SLOT(k), N, c->C); }
            } else {
                residual_norm_forward(SLOT(k), NULL, a->slot_r + k * N, SLOT(k), out, NULL, N, c->C);
            }
        }
    }
    op_range("fwd route + norm");
    floatX *uf = site_forward(m, (int)(2 * L), N, p->lnfw);
    // tied head over all Vp rows of wte: the padding rows are 0, and a row length of Vp (a
    // multiple of 128) keeps cuBLAS on its aligned tensor-core path (V = 50257 is odd)
    op_range("fwd matmul head");
    matmul_forward(a->logits, uf, p->wte, N, c->C, c->Vp);
    if (targets == NULL) { return; }
    memcpy(m->targets, targets, N * sizeof(int));
    int fused = dloss != 0 && crossentropy_use_fused(c->Vp);
    op_range(fused ? "fwd+bwd crossentropy" : "fwd crossentropy");
    if (fused) {   // losses, and dlogits over the logits (model_backward's first step)
        crossentropy_fused(a->logits, a->losses, a->ce_lse, a->logits, m->d_targets, dloss, N, c->V, c->Vp);
        m->ce_dloss = dloss;
    } else {
        crossentropy_forward(a->losses, a->ce_lse, a->logits, m->d_targets, N, c->V, c->Vp);
    }
    cudaCheck(cudaMemcpy(m->losses_host, a->losses, N * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (size_t n = 0; n < N; n++) { sum += m->losses_host[n]; }
    m->loss = (float)(sum / N);
}

// Called once per optimizer step, first: also where the step's timing starts.
void model_zero_grad(Model *m) {
    op_range("zero grads");
    zero(m->grads_mem, m->nparams * sizeof(float));
}

// Backward pass of the last forward; adds into m->grads. dloss scales each
// position's loss: 1/(B*T) for the mean, divided again by the number of
// accumulated micro-batches. The logits buffer is reused for dlogits (already
// written by the forward when it was given this dloss: m->ce_dloss).
// Order: the final site, then for j = 2L-1 .. 0 sublayer j and site j (std: then
// the norm weights' gradients of all the sites, from their partials). In mhar
// mode site j ends with the gather of slot j (site_backward), and the routing
// q and gamma gradients are summed once at the end (route_param_backward). In
// hc mode site j ends with its read's and sublayer j-1's update's backward
// (hc_site_backward), which writes the dout of sublayer j-1.
void model_backward(Model *m, float dloss) {
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    GradActs *g = &m->gacts;
    ParamTensors<floatX> *p = &m->params;
    ParamTensors<float> *dp = &m->grads;
    int B = m->B, T = m->T;
    size_t N = (size_t)B * T, C = c->C, L = c->L;
    // losses = crossentropy(softmax(logits)); logits = uf . wte[:V]^T
    floatX *dlogits = a->logits;   // the logits are spent: overwrite them in place
    if (m->ce_dloss == 0) {
        op_range("bwd crossentropy");
        crossentropy_backward(dlogits, a->logits, a->ce_lse, m->d_targets, dloss, N, c->V, c->Vp);
    } else if (m->ce_dloss != dloss) {
        die("internal: model_backward with dloss %g after a forward given dloss %g", dloss, m->ce_dloss);
    }
    m->ce_dloss = 0;
    floatX *uf = ULN(2 * L);   // (mhar: the one u buffer still holds the final site's)
    op_range("bwd matmul head");
    matmul_backward(g->dln, dp->wte, dlogits, uf, p->wte, N, c->C, c->Vp);
    // the encoder's token grouping: sorted on the host while the GPU runs the head's backward,
    // then uploaded in stream order from pinned memory, so the queue never drains for it
    cudaCheck(cudaEventSynchronize(m->enc_plan_sent));   // the previous upload has read enc_plan
    m->enc_nseg = encoder_backward_plan(m->enc_plan, m->inputs, N);
    cudaCheck(cudaMemcpyAsync(m->enc_scratch, m->enc_plan, (3 * N + 1) * sizeof(int), cudaMemcpyHostToDevice, 0));
    cudaCheck(cudaEventRecord(m->enc_plan_sent, 0));
    // uf = rmsnorm(h_final; lnfw)
    op_range("bwd route + norm");
    site_backward(m, (int)(2 * L), N, p->lnfw, dp->lnfw, NULL);
    for (long jj = 2 * (long)L - 1; jj >= 0; jj--) {
        size_t j = (size_t)jj, l = j / 2;
        // slot j+1 = out_j (+ slot j): every site reading slot j+1 is done, so dslot j+1 is
        // complete; it is dL/dout_j. std: site j+1's norm backward wrote its floatX copy g->dout,
        // and dslots goes on to become dslot j in site j's (a chained slot passes its gradient on)
        // (mhar: route_slot_backward adds the chained slot's gradient, and its gather of slot
        // j+1 wrote the floatX copy into g->dout)
        if (j % 2 == 0) { attention_sublayer_backward(m, (int)l, g->dout, B, T); }
        else { mlp_sublayer_backward(m, (int)l, g->dout, B, T); }
        // u = rmsnorm(h_j; g_j). mhar keeps one u buffer: the site's backward recomputes u_j
        // into it, bit for bit, and the sublayer's weight gradients that read u come after
        floatX *u = ULN(j);
        op_range("bwd route + norm");
        site_backward(m, (int)j, N, site_norm_w(m, (int)j), site_norm_dw(m, (int)j),
                      c->mode == RES_MHAR ? u : NULL);
        if (j % 2 == 0) { attention_sublayer_weight_backward(m, (int)l, u, B, T); }
        else { mlp_sublayer_weight_backward(m, (int)l, u, B, T); }
    }
    if (c->mode == RES_STD) {   // the norm weights' gradients of all the sites, from their partials
        op_range("bwd route + norm");
        rmsnorm_dw_reduce_sites([&](int j) { return site_norm_dw(m, j); }, g->site_part, RED_PARTS_MAX * C,
                                (int)(2 * L + 1), N, c->C);
    }
    if (c->mode == RES_HC) {   // every site's alpha, A, beta and norm weight gradients, from their partials
        op_range("bwd hc: parameter sums");
        hc_reduce_sites([&](int j) { return hc_site_sums(m, j); }, g->hc_partial, hc_partial_floats(N, c->n, c->C),
                        (int)(2 * L + 1), N, c->n, c->C);
    }
    // slot 0 = wte[inputs]
    op_range("bwd encoder");
    encoder_backward(dp->wte, g->dslots, m->enc_scratch, m->enc_nseg, N, c->C);
    // s[h,i] = r_i (q_j gamma_j) . v_i at every site j: dq, dgamma from the gathers' per-pair sums
    op_range("bwd route params");
    if (c->mode == RES_MHAR || c->mode == RES_DELTA) {
        route_param_backward(dp->rq, dp->rg, g->route_qv, m->d_pair_off, p->rq, p->rg, (int)(2 * L + 1), c->C);
    }
}

#undef SLOT
#undef HCX
#undef ULN
#undef SITE_SRC
#undef SLOT_RD
#undef SLOT_RD_PAIR

// ----------------------------------------------------------------------------
// Optimisation: global gradient norm, AdamW, learning-rate schedule

// L2 norm of all gradients (kernels/adamw.cuh: deterministic)
double grad_norm(const Model *m) {
    op_range("grad norm");
    return grad_norm_l2(m->grads_mem, m->nparams, m->norm_part);
}

// One AdamW step (decoupled weight decay on the matrices only, config.h) with
// the gradients multiplied by gscale (gradient clipping). t counts steps from 1.
// Updates the fp32 master and refreshes its floatX copy.
void adamw_update(Model *m, float lr, float beta1, float beta2, float eps, float wd, float gscale, int t) {
    if (m->adam_m == NULL) {
        cudaCheck(cudaMalloc(&m->adam_m, m->nparams * sizeof(float)));
        cudaCheck(cudaMalloc(&m->adam_v, m->nparams * sizeof(float)));
        zero(m->adam_m, m->nparams * sizeof(float));
        zero(m->adam_v, m->nparams * sizeof(float));
    }
    op_range("adamw");
    float bc1 = 1 - powf(beta1, (float)t), bc2 = 1 - powf(beta2, (float)t);
    size_t off = 0;
    for (int ti = 0; ti < NUM_PARAM_TENSORS; ti++) {
        float decay = param_is_decayed(ti) ? wd : 0;
        float lrt = lr * param_lr_scale(&m->cfg, ti, m->lr_new, m->lr_route);   // -lr_new, -lr_route
        size_t n = m->sizes[ti];
        if (n > 0) {
            adamw_step(m->params_mem + off, m->paramsX_mem + off, m->grads_mem + off, m->adam_m + off,
                       m->adam_v + off, n, lrt, beta1, beta2, eps, decay, gscale, bc1, bc2);
        }
        off += n;
    }
    op_range(NULL);   // the step's last range ends (-op_times: its times are summed here)
}

// ----------------------------------------------------------------------------
// Checkpoints (format in common/checkpoint.h): float32 master weights and
// AdamW state, the same files as train_mhar.c writes, so either trainer loads
// the other's. Tensors travel through a host buffer, where params_reorder turns
// the GPU order into the checkpoint's and back (ckpt_cfg: the model being saved
// or loaded; every array starts at the first parameter).

static const Config *ckpt_cfg;

static void write_floats(FILE *f, const void *dev, size_t n, int elem, const char *path) {
    float *host = (float *)malloc_check(n * sizeof(float));
    cudaCheck(cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    params_reorder(ckpt_cfg, host, n, 0);
    if (elem == 4) { fwrite_check(host, sizeof(float), n, f, path); }
    else {
        for (size_t i = 0; i < n; i++) { double d = host[i]; fwrite_check(&d, sizeof(double), 1, f, path); }
    }
    free(host);
}

static void read_floats(FILE *f, void *dev, size_t n, int elem, const char *path) {
    float *host = (float *)malloc_check(n * sizeof(float));
    if (elem == 4) { fread_check(host, sizeof(float), n, f, path); }
    else {
        for (size_t i = 0; i < n; i++) { double d; fread_check(&d, sizeof(double), 1, f, path); host[i] = (float)d; }
    }
    params_reorder(ckpt_cfg, host, n, 1);
    cudaCheck(cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice));
    free(host);
}

static void *alloc_floats(size_t n) {
    void *p;
    cudaCheck(cudaMalloc(&p, n * sizeof(float)));
    zero(p, n * sizeof(float));
    return p;
}

// Save parameters (content CKPT_PARAMS), parameters + AdamW state (CKPT_TRAIN),
// or the gradients (CKPT_GRADS), via path.tmp and a rename.
void model_save(const Model *m, const char *path, CkptInfo info) {
    ckpt_cfg = &m->cfg;
    ckpt_save(path, &m->cfg, info, m->nparams, info.content == CKPT_GRADS ? m->grads_mem : m->params_mem,
              m->adam_m, m->adam_v, write_floats);
}

// Load a checkpoint into a model built with the same config (dies on any
// mismatch). Loads AdamW state too when the file has it.
void model_load(Model *m, const char *path, CkptInfo *info) {
    ckpt_cfg = &m->cfg;
    ckpt_load(path, &m->cfg, info, m->nparams, m->params_mem, (void **)&m->adam_m, (void **)&m->adam_v,
              read_floats, alloc_floats);
    if ((void *)m->paramsX_mem != (void *)m->params_mem) { cast(m->paramsX_mem, m->params_mem, m->nparams); }
}

void model_free(Model *m) {
    cudaCheck(cudaFree(m->params_mem)); cudaCheck(cudaFree(m->grads_mem));
    if ((void *)m->paramsX_mem != (void *)m->params_mem) { cudaCheck(cudaFree(m->paramsX_mem)); }
    cudaCheck(cudaFree(m->adam_m)); cudaCheck(cudaFree(m->adam_v));
    cudaCheck(cudaFree(m->acts_mem)); cudaCheck(cudaFree(m->gacts_mem));
    cudaCheck(cudaFree(m->rope_cos)); cudaCheck(cudaFree(m->site_src));
    cudaCheck(cudaFree(m->slot_rd)); cudaCheck(cudaFree(m->d_pair_off));
    cudaCheck(cudaFree(m->d_inputs)); cudaCheck(cudaFree(m->d_targets)); cudaCheck(cudaFree(m->enc_scratch));
    if (m->enc_plan) { cudaCheck(cudaFreeHost(m->enc_plan)); }   // (NULL, and no event, before the first forward)
    if (m->enc_plan_sent) { cudaCheck(cudaEventDestroy(m->enc_plan_sent)); }
    cudaCheck(cudaFree(m->norm_part));
    free(m->pair_off); free(m->site_n); free(m->slot_nr); free(m->fwd_lead);
    free(m->inputs); free(m->targets); free(m->losses_host);
}


// ----------------------------------------------------------------------------
// Training loop: common/train_loop.h (shared with train_mhar.c), with the GPU's hooks

static void device_init(char *desc, size_t n) {
    int ndev = 0;
    cudaError_t derr = cudaGetDeviceCount(&ndev);
    if (derr != cudaSuccess || ndev == 0) {
        die("no CUDA device (%s); run the CPU trainer train_mhar instead",
            derr != cudaSuccess ? cudaGetErrorString(derr) : "0 devices");
    }
    int dev = 0;   // this rank's GPU on the data-parallel path (dist_start), else device 0
    cudaCheck(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    snprintf(desc, n, "%s on %.200s", PRECISION_NAME, prop.name);
}

static void device_sync(void) { cudaCheck(cudaDeviceSynchronize()); }

// GPU memory in use at the end of training, then release cuBLAS and the -op_times events
static void device_finish(char *desc, size_t n) {
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    snprintf(desc, n, "GPU memory in use %.1f MiB of %.1f MiB; ", (total_b - free_b) / 1048576.0, total_b / 1048576.0);
    matmul_teardown();
    op_times_free();
}

// row t of the last forward's logits, copied to the host as float
static void model_logits_row(Model *m, int t, float *out) {
    int V = m->cfg.V;
    floatX *row = (floatX *)malloc_check((size_t)V * sizeof(floatX));
    cudaCheck(cudaMemcpy(row, m->acts.logits + (size_t)t * m->cfg.Vp, (size_t)V * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (int i = 0; i < V; i++) { out[i] = toF(row[i]); }
    free(row);
}

#include "common/train_loop.h"

}  // namespace

// ----------------------------------------------------------------------------
// The test API (common/gpu_api.h): built with -DTESTING instead of main.
#ifdef TESTING
extern "C" {

int MHAR_API(device_check)(char *why, size_t why_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) { snprintf(why, why_len, "%s", cudaGetErrorString(e)); cudaGetLastError(); return 0; }
    if (n == 0) { snprintf(why, why_len, "cudaGetDeviceCount reports 0 devices"); return 0; }
    return n;
}

void *MHAR_API(create)(const Config *cfg, const float *params, int maxB, int maxT) {
    Model *m = (Model *)malloc_check(sizeof(Model));
    model_build(m, cfg, 0, 0.02f);
    model_set_params(m, params);
    if (cfg->mode == RES_MHAR) {   // group the routing forward wherever the slots allow (gpu_api.h)
        const int J = 2 * cfg->L + 1;
        int *src = (int *)calloc_check((size_t)J * J, sizeof(int));
        for (int j = 0; j < J; j++) { site_sources(cfg, j, src + (size_t)j * J); }
        model_plan_forward(m, src, 1);
        free(src);
    }
    model_alloc_acts(m, maxB, maxT);
    return m;
}

double MHAR_API(forward_backward)(void *model, const int *inputs, const int *targets, int B, int T, float *logits,
                                  float *grads) {
    Model *m = (Model *)model;
    size_t N = (size_t)B * T;
    model_zero_grad(m);
    float dloss = (float)(1.0 / N);
    if (logits != NULL) {   // from a forward without targets: the training forward below writes dlogits over them
        model_forward(m, inputs, NULL, B, T, 0);
        size_t n = N * m->cfg.V, V = m->cfg.V, Vp = m->cfg.Vp;
        floatX *tmp = (floatX *)malloc_check(n * sizeof(floatX));   // the V real columns of each row
        cudaCheck(cudaMemcpy2D(tmp, V * sizeof(floatX), m->acts.logits, Vp * sizeof(floatX), V * sizeof(floatX), N,
                               cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) { logits[i] = toF(tmp[i]); }
        free(tmp);
    }
    model_forward(m, inputs, targets, B, T, dloss);   // as a training step: the fused cross-entropy
    model_backward(m, dloss);
    if (grads != NULL) {
        cudaCheck(cudaMemcpy(grads, m->grads_mem, m->nparams * sizeof(float), cudaMemcpyDeviceToHost));
        params_reorder(&m->cfg, grads, m->nparams, 0);
    }
    return m->loss;
}

double MHAR_API(train_step)(void *model, const int *inputs, const int *targets, int B, int T, float lr, float beta1,
                            float beta2, float eps, float wd, float clip, int t, double *norm_out) {
    Model *m = (Model *)model;
    model_zero_grad(m);
    float dloss = (float)(1.0 / ((double)B * T));
    model_forward(m, inputs, targets, B, T, dloss);
    model_backward(m, dloss);
    double norm = grad_norm(m);
    float gscale = clip > 0 && norm > clip ? (float)(clip / norm) : 1.0f;
    adamw_update(m, lr, beta1, beta2, eps, wd, gscale, t);
    cudaCheck(cudaDeviceSynchronize());
    if (norm_out != NULL) { *norm_out = norm; }
    return m->loss;
}

void MHAR_API(get_params)(void *model, float *params) {
    Model *m = (Model *)model;
    cudaCheck(cudaMemcpy(params, m->params_mem, m->nparams * sizeof(float), cudaMemcpyDeviceToHost));
    params_reorder(&m->cfg, params, m->nparams, 0);
}

void MHAR_API(free)(void *model) {
    model_free((Model *)model);
    free(model);
}

}  // extern "C"
#endif

// ----------------------------------------------------------------------------
// Training loop
#ifndef TESTING
int main(int argc, char **argv) { return train_main(argc, argv); }
#endif
