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

// The widest float vector of the CPU this build targets (-march=native at install; EFFECT_RL_MARCH names another, see
// detect-blas.sh) and how many such registers it has. Register tiles are sized from these: a tile of more vectors
// than there are registers spills to the stack at every step of its loop.
#if defined(__AVX512F__)
constexpr int kLanes = 16, kVectorRegisters = 32;
#elif defined(__AVX__)
constexpr int kLanes = 8, kVectorRegisters = 16;
#elif defined(__aarch64__)
constexpr int kLanes = 4, kVectorRegisters = 32;
#else
constexpr int kLanes = 4, kVectorRegisters = 16;
#endif
// One register of kLanes floats: `vfloat` for values (accumulators: never give them a smaller alignment, or GCC keeps
// them in memory), `vfloatu` only to load or store one at any float address.
typedef float vfloat __attribute__((vector_size(4 * kLanes)));
typedef float vfloatu __attribute__((vector_size(4 * kLanes), aligned(4)));

// The register tiles of the few-row products (gemm.cc smallRows): up to kTileRows rows of C at once, each across
// tileVectors(rows) vectors of columns. The rows × vectors accumulators, the vectors of B read per step and one
// broadcast of A must all fit in the registers, or each step spills and reloads them. Measured with
// bench/kernels.ts: on AVX-512 8 rows × 2 vectors (19 of 32 registers; 8 × 3 was no faster); with 16 registers
// 4 rows × 3 vectors (16 of 16: 8 × 1 took 1.5x as long, 4 × 2 1.1x), an 8-row batch in two passes.
constexpr int kTileRows = kVectorRegisters >= 32 ? 8 : 4;
constexpr int tileVectors(int rows) { return rows >= 8 ? 2 : rows >= 4 ? (kVectorRegisters >= 32 ? 4 : 3) : 4; }

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
