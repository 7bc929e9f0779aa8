// kernels/encoder.cuh: the embedding. Forward out (N, C) = wte[inp[n]] (one thread
// per element); backward dwte[tok] += dout rows of that token's positions, summed in
// position order (the host groups the positions by token, encoder_backward_plan, while the
// GPU runs earlier work; one block row per token): deterministic, no atomics. The trainer's own
// simple kernels (no lab version).
#pragma once

// ----------------------------------------------------------------------------
// Embedding

__global__ void encoder_forward_kernel(floatX *out, const int *inp, const floatX *wte, size_t N, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * C) { return; }
    size_t n = i / C, c = i % C;
    out[i] = wte[(size_t)inp[n] * C + c];
}

// out (N, C) = wte[inp[n]]: the first source v_0 (SPEC section 4). inp on the device.
void encoder_forward(floatX *out, const int *inp, const floatX *wte, size_t N, int C) {
    encoder_forward_kernel<<<ceil_div(N * C, 256), 256>>>(out, inp, wte, N, C);
    launchCheck();
}

// One block row per distinct token s: dwte[tok[s]] += dout[n] over that token's
// positions n in increasing order (the CPU's serial order, without atomics).
__global__ void encoder_backward_kernel(float *dwte, const float *dout, const int *order, const int *seg_start,
                                        const int *seg_tok, int C) {
    int s = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float *d = dwte + (size_t)seg_tok[s] * C + c;
    float acc = *d;
    for (int k = seg_start[s]; k < seg_start[s + 1]; k++) { acc += dout[(size_t)order[k] * C + c]; }
    *d = acc;
}

// The host's half of encoder_backward: the positions of inp (N, the host copy of the batch)
// grouped by token, sorted by (token, position), into plan (3N+1 ints: order (N) | seg_start
// (N+1) | seg_tok (N)). Returns the number of distinct tokens. A counting sort by token (O(N + V)
// for tokens below V; placing each token's positions in increasing order keeps them sorted):
// the trainer runs it on the host after queueing the head's backward, and the GPU waits for
// it wherever the host takes longer than that matmul (the loss's readback at the end of the
// forward has drained the queue). It then uploads plan in stream order.
int encoder_backward_plan(int *plan, const int *inp, size_t N) {
    int *order = plan, *seg_start = plan + N, *seg_tok = plan + 2 * N + 1, nseg = 0, vmax = 0;
    for (size_t n = 0; n < N; n++) { vmax = inp[n] > vmax ? inp[n] : vmax; }
    int *at = (int *)calloc((size_t)vmax + 2, sizeof(int));   // at[t]: where token t's positions start
    if (at == NULL) { fprintf(stderr, "error: out of host memory (encoder plan)\n"); exit(1); }
    for (size_t n = 0; n < N; n++) { at[inp[n] + 1]++; }
    for (int t = 0; t <= vmax; t++) {
        if (at[t + 1] > 0) { seg_start[nseg] = at[t]; seg_tok[nseg++] = t; }
        at[t + 1] += at[t];
    }
    seg_start[nseg] = (int)N;
    for (size_t n = 0; n < N; n++) { order[at[inp[n]]++] = (int)n; }
    free(at);
    return nseg;
}

// dwte[inp[n]] += dout[n], from encoder_backward_plan's plan of the batch, on the device
// (3N+1 ints), and its nseg: one kernel row per token sums that token's rows in order.
void encoder_backward(float *dwte, const float *dout, const int *plan, int nseg, size_t N, int C) {
    dim3 grid(nseg, ceil_div(C, 128));
    encoder_backward_kernel<<<grid, 128>>>(dwte, dout, plan, plan + N, plan + 2 * N + 1, C);
    launchCheck();
}
