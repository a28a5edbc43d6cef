// Matrix products on one thread (callers split the work over the pool): OpenBLAS' SGEMM when it linked at build time
// (EFFECT_RL_OPENBLAS), else a blocked SGEMM of our own; a register-blocked product for few rows (decode steps);
// the fused epilogue (bias + activation) of _FusedMatMul.
#pragma once

#include <cstdint>

#ifdef EFFECT_RL_OPENBLAS
extern "C" {
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };
void cblas_sgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int M, int N, int K, float alpha,
                 const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
void openblas_set_num_threads(int);
}
#endif

namespace effect_rl {

// 8 floats in a vector register: `v8f` for aligned memory and values, `v8fu` to load or store at any float address.
typedef float v8f __attribute__((vector_size(32)));
typedef float v8fu __attribute__((vector_size(32), aligned(4)));

// At most this many rows of C: smallGemmNN / smallGemmNT, which stream B once, beat a BLAS call (which packs all of B).
constexpr int kSmallM = 16;

// Rows [rowBegin, rowEnd) of C[M,N] = op(A)[M,K] · op(B)[K,N] (row-major, A and B stored untransposed as [M,K]/[K,N]
// or transposed as [K,M]/[N,K]), on the calling thread.
void gemmRows(bool ta, bool tb, int M, int N, int K, const float* A, const float* B, float* C, int rowBegin,
              int rowEnd);

// Columns [n0, n1) of C[M,N] = A[M,K] · B (B stored [K,N] for NN, [N,K] for NT), M ≤ kSmallM.
void smallGemmNN(int M, int N, int K, const float* A, const float* B, float* C, int n0, int n1);
void smallGemmNT(int M, int N, int K, const float* A, const float* B, float* C, int n0, int n1);

// C = alpha · op(A) · op(B) + beta · C on the calling thread, any leading dimensions.
void gemmS(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc);

// The `activation` argument of matmul.
enum Activation { kLinear = 0, kRelu = 1, kRelu6 = 2, kElu = 3, kLeakyRelu = 4, kSigmoid = 5 };

// rows × N of C: += bias (a [N] row, when not null), then the activation.
void epilogue(float* C, int64_t rows, int N, const float* bias, int act, float alpha);

}  // namespace effect_rl
