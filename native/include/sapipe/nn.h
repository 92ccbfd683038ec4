/* The model operations: one table of the layer maths that lib/nn's models are built from, with a
 * CPU implementation (native/cpu/nn_ops.cpp, always built) and a CUDA one (native/cuda/nn_ops.cu,
 * in the plugin, matrix products through cuBLAS opened at run time). This struct is the one list
 * of those operations: a new layer's maths is a new entry here, filled by both backends.
 *
 * Every matrix is dense and row-major. Pointers are host memory for the CPU table and device
 * memory of the current device for the CUDA table; `stream` is a cudaStream_t (NULL: the legacy
 * default stream) and ignored by the CPU table, which runs each operation to completion. The CUDA
 * table only enqueues: results are ready once the stream has reached them.
 * No exception crosses an entry; a failure returns a sapipe_status, with details in the owning
 * backend's last_error(). */
#ifndef SAPIPE_NN_H
#define SAPIPE_NN_H

#include <stddef.h>
#include <stdint.h>

#include "sapipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* C = alpha * op(A) * op(B) + beta * C; op(A) is m x k (A stored k x m when trans_a), op(B) is
 * k x n (B stored n x k when trans_b), C is m x n; leading dimensions are the stored row lengths.
 * beta = 0 writes C without reading it. C must not overlap A or B. */
typedef struct sapipe_nn_gemm_args {
  int32_t trans_a, trans_b;
  size_t m, n, k;
  float alpha, beta;
  const float* a;
  size_t lda;
  const float* b;
  size_t ldb;
  float* c;
  size_t ldc;
} sapipe_nn_gemm_args;

typedef struct sapipe_nn_ops {
  uint32_t table_size; /* sizeof(sapipe_nn_ops) as the backend was built: entries are appended */
  sapipe_status (*gemm)(const sapipe_nn_gemm_args* args, void* stream);
  /* y[r, j] += bias[j] for r < rows, j < cols (a Linear layer's bias). */
  sapipe_status (*bias_add)(float* y, const float* bias, size_t rows, size_t cols, void* stream);
  /* db[j] = sum over r of dy[r, j] (added to db when accumulate), summed in row order. */
  sapipe_status (*bias_grad)(float* db, const float* dy, size_t rows, size_t cols, int32_t accumulate, void* stream);
  /* y[i] = x[i] > 0 ? x[i] : 0 (NaN becomes 0); y may be x. */
  sapipe_status (*relu)(float* y, const float* x, size_t count, void* stream);
  /* dx[i] = y[i] > 0 ? dy[i] : 0, with y the forward output; dx may be dy. */
  sapipe_status (*relu_backward)(float* dx, const float* y, const float* dy, size_t count, void* stream);
  /* Softmax cross-entropy of each row of logits [rows, classes] against labels [rows] (class
   * numbers held as floats): losses[r] = logsumexp(z_r) - z_r[label_r], and, when dlogits is not
   * NULL, dlogits[r, j] = (softmax(z_r)_j - [j == label_r]) * grad_scale (1 / rows for a mean
   * loss); when correct is not NULL, correct[r] = 1 if the row's first largest logit is at the
   * label, else 0. A label that is not a class number gives a NaN loss and a zero gradient row.
   * dlogits may be logits. The max is subtracted before exponentiating. */
  sapipe_status (*softmax_xent)(const float* logits, const float* labels, size_t rows, size_t classes, float grad_scale,
                                float* losses, float* dlogits, float* correct, void* stream);
} sapipe_nn_ops;

/* The CPU backend's table (native/cpu/nn_ops.cpp). */
const sapipe_nn_ops* sapipe_cpu_nn_ops(void);

#ifdef __cplusplus
}
#endif

#endif
