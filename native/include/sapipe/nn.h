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

#include <math.h>
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

/* A 2-D convolution's or pooling's shape, NCHW: input [batch, in_channels, height, width];
 * convolution weights [out_channels, in_channels, kernel_h, kernel_w]; output [batch,
 * out_channels, out_h, out_w] with out = (in + 2 pad - kernel) / stride + 1 (floor) per axis.
 * Strides and kernel sizes are at least 1 and in + 2 pad at least the kernel. Pooling reads
 * in_channels only (out_channels = in_channels). */
typedef struct sapipe_nn_conv2d_shape {
  size_t batch, in_channels, height, width;
  size_t out_channels, kernel_h, kernel_w;
  size_t stride_h, stride_w, pad_h, pad_w;
} sapipe_nn_conv2d_shape;

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
  /* GELU, tanh form (GPT-2; PyTorch's approximate='tanh'): y[i] = 0.5 x (1 + tanh(u)) with
   * u = sqrt(2/pi) (x + 0.044715 x^3), computed as x sigmoid(2u) (the same function) from
   * exp(-2|u|), so negative x keep their relative precision; y may be x. */
  sapipe_status (*gelu)(float* y, const float* x, size_t count, void* stream);
  /* dx[i] = dy[i] * (0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)),
   * computed as s + 2 x s (1 - s) du/dx with s = sigmoid(2u), x the forward input; dx may be dy
   * or x. */
  sapipe_status (*gelu_backward)(float* dx, const float* x, const float* dy, size_t count, void* stream);
  /* y[i] = a[i] + b[i] (a residual connection; its backward hands dy to both branches, or adds it
   * into a gradient with y = a); y may be a or b. */
  sapipe_status (*add)(float* y, const float* a, const float* b, size_t count, void* stream);
  /* Layer norm over each row of x [rows, cols]: mean[r] = sum_j x_rj / cols, var = sum_j
   * (x_rj - mean)^2 / cols (biased), rstd[r] = 1 / sqrt(var + eps), y_rj = (x_rj - mean) rstd
   * gamma_j + beta_j. mean and rstd ([rows] each) are saved for the backward; y may be x. */
  sapipe_status (*layer_norm)(float* y, float* mean, float* rstd, const float* x, const float* gamma, const float* beta,
                              size_t rows, size_t cols, float eps, void* stream);
  /* Its backward from the saved mean and rstd: with xhat = (x - mean) rstd and g = dy gamma,
   * dx_rj = rstd (g_rj - mean_j g_rj - xhat_rj mean_j(g_rj xhat_rj)); dgamma_j = sum_r dy_rj xhat_rj
   * and dbeta_j = sum_r dy_rj, summed in row order (added to dgamma, dbeta when accumulate).
   * dx may be dy. */
  sapipe_status (*layer_norm_backward)(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                                       const float* mean, const float* rstd, const float* gamma, size_t rows, size_t cols,
                                       int32_t accumulate, void* stream);
  /* Token and position embedding: y[b, s, :] = tokens_table[t, :] + positions_table[s, :] with
   * t = tokens[b * seq + s] (a token number held as a float) for b < batch, s < seq; the tables
   * are [vocab, dim] and [seq or more, dim]. A token that is not a number below vocab gives a NaN
   * row. */
  sapipe_status (*embedding)(float* y, const float* tokens, const float* token_table, const float* position_table,
                             size_t batch, size_t seq, size_t vocab, size_t dim, void* stream);
  /* Its backward, a scatter-add: dtoken[t, :] += dy[b, s, :] over every (b, s) in order (a
   * token that is no number below vocab adds nothing), dposition[s, :] += dy[b, s, :] over b in
   * order. Both are overwritten first (zeroed, dtoken over all vocab rows) unless accumulate;
   * dposition may be NULL. */
  sapipe_status (*embedding_backward)(float* dtoken_table, float* dposition_table, const float* dy, const float* tokens,
                                      size_t batch, size_t seq, size_t vocab, size_t dim, int32_t accumulate, void* stream);
  /* Inverted dropout with a counter-based mask: element i is kept when
   * sapipe_dropout_uniform(seed, offset + i) >= p (see below), y[i] = kept ? x[i] / (1 - p) : 0.
   * The same call on dy with the same (seed, offset, p) is the backward. 0 <= p < 1; y may be x. */
  sapipe_status (*dropout)(float* y, const float* x, size_t count, float p, uint64_t seed, uint64_t offset, void* stream);
  /* Causal multi-head self-attention. q, k, v and o are [batch, seq, heads * head_dim], head h
   * in columns [h head_dim, (h + 1) head_dim); lse is [batch, heads, seq]. For each batch, head and
   * query i, over the keys j <= i: s_ij = scale (q_i . k_j), o_i = sum_j exp(s_ij - lse_i) v_j and
   * lse_i = log sum_j exp(s_ij), saved for the backward. The [seq, seq] score matrix is never
   * stored: a device runs each row as an online softmax (a running max and sum, the partial output
   * rescaled when the max grows); the CPU takes 32 query rows at a time, their scores in a strip of
   * [32, seq] floats per thread. 1 <= head_dim <= SAPIPE_NN_MAX_HEAD_DIM; o and lse must not overlap q, k or v. */
  sapipe_status (*attention)(float* o, float* lse, const float* q, const float* k, const float* v, size_t batch, size_t seq,
                             size_t heads, size_t head_dim, float scale, void* stream);
  /* Its backward from the forward's o and lse, recomputing each p_ij = exp(s_ij - lse_i): with
   * D_i = dout_i . o_i and ds_ij = p_ij (dout_i . v_j - D_i), dq_i = scale sum_{j<=i} ds_ij k_j,
   * dk_j = scale sum_{i>=j} ds_ij q_i, dv_j = sum_{i>=j} p_ij dout_i (each overwritten). The
   * gradients must not overlap any input. */
  sapipe_status (*attention_backward)(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                                      const float* v, const float* o, const float* lse, size_t batch, size_t seq, size_t heads,
                                      size_t head_dim, float scale, void* stream);
  /* y[n, k, oy, ox] = bias[k] + sum over c, r, s of w[k, c, r, s] x[n, c, oy sh - ph + r,
   * ox sw - pw + s] (x outside the image is 0); bias may be NULL. y must not overlap x or w. */
  sapipe_status (*conv2d)(float* y, const float* x, const float* w, const float* bias, const sapipe_nn_conv2d_shape* shape,
                          void* stream);
  /* Its backward: dx = the transposed convolution of dy with w (overwritten; dx may be NULL),
   * dw[k, c, r, s] = sum over n, oy, ox of dy[n, k, oy, ox] x[n, c, ...] and db[k] = sum of
   * dy[n, k, ., .] (added to dw, db when accumulate; db may be NULL). No output overlaps an input. */
  sapipe_status (*conv2d_backward)(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                                   const sapipe_nn_conv2d_shape* shape, int32_t accumulate, void* stream);
  /* 2-D pooling, NCHW, over windows of kernel_h x kernel_w at the strides, padded by pad_h, pad_w
   * (at most half the kernel): y [batch, in_channels, out_h, out_w]. SAPIPE_NN_POOL_MAX takes the
   * window's first largest value inside the image (NaN never wins, a window of NaN only gives NaN;
   * the padding is not a value);
   * SAPIPE_NN_POOL_AVG the sum of the values inside divided by kernel_h kernel_w (the padding
   * counts as zeros, PyTorch's count_include_pad). out_channels is not read. y must not overlap x. */
  sapipe_status (*pool2d)(float* y, const float* x, const sapipe_nn_conv2d_shape* shape, int32_t mode, void* stream);
  /* Its backward (dx overwritten): max hands each dy to its window's first largest value (found
   * again from x), avg dy / (kernel_h kernel_w) to every value inside the window; a value in
   * several windows sums them in output order. dx must not overlap dy or x. */
  sapipe_status (*pool2d_backward)(float* dx, const float* dy, const float* x, const sapipe_nn_conv2d_shape* shape, int32_t mode,
                                   void* stream);
} sapipe_nn_ops;

enum { SAPIPE_NN_POOL_MAX = 0, SAPIPE_NN_POOL_AVG = 1 };

#ifdef __CUDACC__
#define SAPIPE_NN_INLINE static __host__ __device__ __forceinline__
#else
#define SAPIPE_NN_INLINE static inline
#endif

/* A convolution's or pooling's output length along one axis; 0 when the padded input is shorter
 * than the kernel or the stride or kernel is 0. */
SAPIPE_NN_INLINE size_t sapipe_nn_conv_out(size_t in, size_t kernel, size_t stride, size_t pad) {
  return stride == 0 || kernel == 0 || in + 2 * pad < kernel ? 0 : (in + 2 * pad - kernel) / stride + 1;
}

/* The first largest value's index in a pooling window of the plane [h, w] whose top-left corner
 * is (y0, x0) (negative inside the padding), or SIZE_MAX when every value inside is NaN (NaN
 * never wins). Shared by the CPU and the CUDA kernels. */
SAPIPE_NN_INLINE size_t sapipe_nn_max_pool_at(const float* plane, size_t h, size_t w, ptrdiff_t y0, ptrdiff_t x0, size_t kh, size_t kw) {
  size_t best_at = (size_t)-1;
  float best = -INFINITY;
  for (size_t r = 0; r < kh; ++r) {
    const ptrdiff_t y = y0 + (ptrdiff_t)r;
    if (y < 0 || y >= (ptrdiff_t)h) continue;
    for (size_t c = 0; c < kw; ++c) {
      const ptrdiff_t x = x0 + (ptrdiff_t)c;
      if (x < 0 || x >= (ptrdiff_t)w) continue;
      const float v = plane[(size_t)y * w + (size_t)x];
      /* Selects rather than branches: on data a branch on the comparison mispredicts about once a
       * window, which made the CPU's 2x2 max pooling cost 10 ns and more per output. */
      const int take = (v > best) | ((best_at == (size_t)-1) & (v == best));
      best = take ? v : best;
      best_at = take ? (size_t)y * w + (size_t)x : best_at;
    }
  }
  return best_at;
}

/* The largest head_dim the attention entries take (a device keeps a row in a warp's registers). */
#define SAPIPE_NN_MAX_HEAD_DIM 256

/* The dropout's uniform draw in [0, 1) for element `index` of stream `seed`: the SplitMix64
 * finaliser of seed * 0x9E3779B97F4A7C15 + index, its top 24 bits times 2^-24. Integer maths
 * only, so the CPU, CUDA and the TypeScript reference draw the same mask. */
SAPIPE_NN_INLINE float sapipe_dropout_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* The CPU backend's table (native/cpu/nn_ops.cpp). */
const sapipe_nn_ops* sapipe_cpu_nn_ops(void);

#ifdef __cplusplus
}
#endif

#endif
