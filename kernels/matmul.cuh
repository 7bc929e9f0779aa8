// kernels/matmul.cuh: the matmuls by a weight W (OC, IC), through cuBLAS (one handle,
// the default stream, atomics off: deterministic): out (N, OC) = inp (N, IC) W^T and
// its two backward halves, dinp (N, IC) = or += dout W and dW (OC, IC) += dout^T inp.
// No custom kernel (cuBLAS picks its own); fp32 compute, pedantic (no TF32) in the fp32
// build. The lab dev/cuda/matmul.cu times these calls at the model's shapes, as one
// product per weight and fused over a sublayer's weights (what the trainer does for
// [Wq; Wk; Wv] and [Wg; Wu]: train_mhar.cu, "the GPU order").
#pragma once

cublasHandle_t cublas;   // one handle, on the default stream

// Every matmul multiplies by a weight W of shape (OC, IC), row-major like the
// CPU file. cuBLAS is column-major, where a row-major (R, K) matrix is its
// (K, R) transpose, so each product below is written for the transposes:
//   forward   out  (N, OC)  = inp (N, IC) . W^T     <=>  out^T  = W^T(op T) . inp^T
//   backward  dinp (N, IC) += dout (N, OC) . W      <=>  dinp^T += W^T . dout^T
//             dW   (OC, IC) += dout^T . inp         <=>  dW^T   += inp^T . dout
// Inputs are floatX; dW accumulates (beta 1) in fp32. dinp, in fp32 or, where
// its consumer reads floatX, in floatX (attention's datty), accumulates with
// DINP_ADD (+=) or is overwritten with DINP_SET (=, beta 0: its old contents,
// even NaN, are never read), which saves zeroing it first: the first matmul
// into a gradient buffer sets it, the later ones add.

// out (N, OC) = inp (N, IC) . weight^T, weight (OC, IC)
void matmul_forward(floatX *out, const floatX *inp, const floatX *weight, size_t N, int IC, int OC) {
    const float one = 1.0f, zero_f = 0.0f;
    cublasCheck(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, (int)N, IC, &one, weight, CUDA_FLOATX, IC,
                             inp, CUDA_FLOATX, IC, &zero_f, out, CUDA_FLOATX, OC, CUBLAS_COMPUTE, CUBLAS_GEMM_DEFAULT));
}

enum { DINP_SET = 0, DINP_ADD = 1 };
// The two halves of matmul_forward's backward (out[n][o] = sum_i inp[n][i] * weight[o][i]).
// dinp (N, IC) = or += dout . weight (dinp_mode DINP_SET or DINP_ADD; Tdinp: float or floatX)
template <typename Tdinp>
void matmul_backward_inp(Tdinp *dinp, const floatX *dout, const floatX *weight, size_t N, int IC, int OC,
                         int dinp_mode) {
    const float one = 1.0f, beta_dinp = dinp_mode == DINP_ADD ? 1.0f : 0.0f;
    const cudaDataType dinp_type = sizeof(Tdinp) == sizeof(float) ? CUDA_R_32F : CUDA_FLOATX;
    cublasCheck(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, IC, (int)N, OC, &one, weight, CUDA_FLOATX, IC,
                             dout, CUDA_FLOATX, OC, &beta_dinp, dinp, dinp_type, IC, CUBLAS_COMPUTE, CUBLAS_GEMM_DEFAULT));
}
// dweight (OC, IC) += dout^T . inp (fp32)
void matmul_backward_weight(float *dweight, const floatX *dout, const floatX *inp, size_t N, int IC, int OC) {
    const float one = 1.0f;
    cublasCheck(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, (int)N, &one, inp, CUDA_FLOATX, IC,
                             dout, CUDA_FLOATX, OC, &one, dweight, CUDA_R_32F, IC, CUBLAS_COMPUTE, CUBLAS_GEMM_DEFAULT));
}
// both: dinp, then dweight
template <typename Tdinp>
void matmul_backward(Tdinp *dinp, float *dweight, const floatX *dout, const floatX *inp, const floatX *weight,
                     size_t N, int IC, int OC, int dinp_mode) {
    matmul_backward_inp(dinp, dout, weight, N, IC, OC, dinp_mode);
    matmul_backward_weight(dweight, dout, inp, N, IC, OC);
}
