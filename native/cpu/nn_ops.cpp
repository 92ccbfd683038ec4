// The CPU side of the model operations (sapipe/nn.h): the matrix product is the blocked SIMD
// SGEMM over the thread pool (gemm.cpp); the row and element operations are plain loops, in the
// order the CUDA kernels' results are checked against (bias gradient summed row by row; softmax
// cross-entropy in double, like the plain-TypeScript reference). The element operations (GELU,
// add, dropout) and the per-row ones (layer norm) split their elements or rows over the thread
// pool: each output is written by one thread, so the result does not depend on the split; the
// parameter gradients (layer norm's dgamma and dbeta, the embedding tables') are summed in row
// order on one thread, the order the CUDA kernels sum in. GELU's element loop is vectorised per
// instruction set (nn_elementwise.h); the attention is tiles of SGEMMs (nn_attention.cpp).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <new>
#include <vector>

#include "../core/thread_pool.h"
#include "gemm.h"
#include "nn_attention.h"
#include "nn_elementwise.h"
#include "nn_jobs.h"
#include "sapipe/nn.h"

namespace sapipe::cpu {
namespace {

sapipe_status nn_gemm(const sapipe_nn_gemm_args* a, void*) {
  if (a == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  GemmArgs g;
  g.trans_a = a->trans_a != 0;
  g.trans_b = a->trans_b != 0;
  g.m = a->m, g.n = a->n, g.k = a->k;
  g.alpha = a->alpha, g.beta = a->beta;
  g.a = a->a, g.lda = a->lda;
  g.b = a->b, g.ldb = a->ldb;
  g.c = a->c, g.ldc = a->ldc;
  return sgemm(g);
}

sapipe_status nn_bias_add(float* y, const float* bias, size_t rows, size_t cols, void*) {
  if (rows == 0 || cols == 0) return SAPIPE_OK;
  if (y == nullptr || bias == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  for (size_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    for (size_t j = 0; j < cols; ++j) row[j] += bias[j];
  }
  return SAPIPE_OK;
}

sapipe_status nn_bias_grad(float* db, const float* dy, size_t rows, size_t cols, int32_t accumulate, void*) {
  if (cols == 0) return SAPIPE_OK;
  if (db == nullptr || (rows > 0 && dy == nullptr)) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (accumulate == 0)
    for (size_t j = 0; j < cols; ++j) db[j] = 0.0f;
  for (size_t r = 0; r < rows; ++r) {
    const float* row = dy + r * cols;
    for (size_t j = 0; j < cols; ++j) db[j] += row[j];
  }
  return SAPIPE_OK;
}

sapipe_status nn_relu(float* y, const float* x, size_t count, void*) {
  if (count == 0) return SAPIPE_OK;
  if (y == nullptr || x == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < count; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return SAPIPE_OK;
}

sapipe_status nn_relu_backward(float* dx, const float* y, const float* dy, size_t count, void*) {
  if (count == 0) return SAPIPE_OK;
  if (dx == nullptr || y == nullptr || dy == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  // dy[i] is read whether or not y[i] > 0: a load only on one side of the condition compiles to a
  // branch per element, which mispredicts on half of them (ReLU's outputs are about half zeros)
  // and made this pass 40 times slower than the forward's; read on both sides, it is a select.
  for (size_t i = 0; i < count; ++i) {
    const float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
  return SAPIPE_OK;
}

sapipe_status nn_softmax_xent(const float* logits, const float* labels, size_t rows, size_t classes, float grad_scale,
                              float* losses, float* dlogits, float* correct, void*) {
  if (rows == 0) return SAPIPE_OK;
  if (logits == nullptr || labels == nullptr || losses == nullptr || classes == 0) return SAPIPE_ERR_INVALID_ARGUMENT;
  for (size_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    const float label_value = labels[r];
    const bool valid = label_value >= 0.0f && label_value < static_cast<float>(classes) && label_value == std::floor(label_value);
    const size_t label = valid ? static_cast<size_t>(label_value) : 0;
    double max = -std::numeric_limits<double>::infinity();
    size_t best = 0;
    for (size_t j = 0; j < classes; ++j)
      if (z[j] > max) max = z[j], best = j;
    double sum = 0.0;
    for (size_t j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(z[j]) - max);
    losses[r] = valid ? static_cast<float>(std::log(sum) + max - static_cast<double>(z[label]))
                      : std::numeric_limits<float>::quiet_NaN();
    if (correct != nullptr) correct[r] = valid && best == label ? 1.0f : 0.0f;
    if (dlogits != nullptr) {
      float* d = dlogits + r * classes;
      // Read z[j] before writing d[j]: dlogits may be logits.
      for (size_t j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(z[j]) - max) / sum;
        d[j] = valid ? static_cast<float>((p - (j == label ? 1.0 : 0.0)) * grad_scale) : 0.0f;
      }
    }
  }
  return SAPIPE_OK;
}

// Runs body(begin, end) over [0, n) on the thread pool, ranges aligned to `align` elements.
template <class Body>
void split(size_t n, size_t align, Body&& body) {
  ThreadPool::current().parallel_for(n, align, [&](int, size_t lo, size_t hi) { body(lo, hi); });
}

sapipe_status nn_gelu(float* y, const float* x, size_t count, void*) {
  if (count == 0) return SAPIPE_OK;
  if (y == nullptr || x == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  const NnElementKernels& ek = active_nn_element_kernels();
  split(count, 16, [&](size_t lo, size_t hi) { ek.gelu(y + lo, x + lo, hi - lo); });
  return SAPIPE_OK;
}

sapipe_status nn_gelu_backward(float* dx, const float* x, const float* dy, size_t count, void*) {
  if (count == 0) return SAPIPE_OK;
  if (dx == nullptr || x == nullptr || dy == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  const NnElementKernels& ek = active_nn_element_kernels();
  split(count, 16, [&](size_t lo, size_t hi) { ek.gelu_backward(dx + lo, x + lo, dy + lo, hi - lo); });
  return SAPIPE_OK;
}

sapipe_status nn_add(float* y, const float* a, const float* b, size_t count, void*) {
  if (count == 0) return SAPIPE_OK;
  if (y == nullptr || a == nullptr || b == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  split(count, 16, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) y[i] = a[i] + b[i];
  });
  return SAPIPE_OK;
}

// Each row's mean and variance in double (two passes), like the reference.
sapipe_status nn_layer_norm(float* y, float* mean, float* rstd, const float* x, const float* gamma, const float* beta, size_t rows,
                            size_t cols, float eps, void*) {
  if (rows == 0) return SAPIPE_OK;
  if (y == nullptr || mean == nullptr || rstd == nullptr || x == nullptr || gamma == nullptr || beta == nullptr || cols == 0 ||
      !(eps > 0.0f) || !std::isfinite(eps))
    return SAPIPE_ERR_INVALID_ARGUMENT;
  split(rows * cols, cols, [&](size_t lo, size_t hi) {
    for (size_t r = lo / cols; r < hi / cols; ++r) {
      const float* xr = x + r * cols;
      double sum = 0.0;
      for (size_t j = 0; j < cols; ++j) sum += xr[j];
      const double mu = sum / static_cast<double>(cols);
      double sq = 0.0;
      for (size_t j = 0; j < cols; ++j) sq += (xr[j] - mu) * (xr[j] - mu);
      const float m = static_cast<float>(mu);
      const float rs = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(cols) + static_cast<double>(eps)));
      mean[r] = m, rstd[r] = rs;
      float* yr = y + r * cols;  // may be xr: each x is read before its y is written
      for (size_t j = 0; j < cols; ++j) yr[j] = (xr[j] - m) * rs * gamma[j] + beta[j];
    }
  });
  return SAPIPE_OK;
}

sapipe_status nn_layer_norm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x, const float* mean,
                                     const float* rstd, const float* gamma, size_t rows, size_t cols, int32_t accumulate, void*) {
  if (cols == 0) return SAPIPE_OK;
  if (dgamma == nullptr || dbeta == nullptr || gamma == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (rows > 0 && (dx == nullptr || dy == nullptr || x == nullptr || mean == nullptr || rstd == nullptr))
    return SAPIPE_ERR_INVALID_ARGUMENT;
  // The parameter gradients first: dx may be dy.
  if (accumulate == 0)
    for (size_t j = 0; j < cols; ++j) dgamma[j] = 0.0f, dbeta[j] = 0.0f;
  for (size_t r = 0; r < rows; ++r) {
    const float *dyr = dy + r * cols, *xr = x + r * cols;
    for (size_t j = 0; j < cols; ++j) {
      dgamma[j] += dyr[j] * ((xr[j] - mean[r]) * rstd[r]);
      dbeta[j] += dyr[j];
    }
  }
  split(rows * cols, cols, [&](size_t lo, size_t hi) {
    for (size_t r = lo / cols; r < hi / cols; ++r) {
      const float *dyr = dy + r * cols, *xr = x + r * cols;
      double sg = 0.0, sgx = 0.0;
      for (size_t j = 0; j < cols; ++j) {
        const double g = static_cast<double>(dyr[j]) * gamma[j];
        sg += g;
        sgx += g * ((xr[j] - mean[r]) * rstd[r]);
      }
      const float mg = static_cast<float>(sg / static_cast<double>(cols)), mgx = static_cast<float>(sgx / static_cast<double>(cols));
      float* dxr = dx + r * cols;
      for (size_t j = 0; j < cols; ++j) dxr[j] = rstd[r] * (dyr[j] * gamma[j] - mg - ((xr[j] - mean[r]) * rstd[r]) * mgx);
    }
  });
  return SAPIPE_OK;
}

bool token_valid(float t, size_t vocab) { return t >= 0.0f && t < static_cast<float>(vocab) && t == std::floor(t); }

sapipe_status nn_embedding(float* y, const float* tokens, const float* token_table, const float* position_table, size_t batch,
                           size_t seq, size_t vocab, size_t dim, void*) {
  if (batch == 0 || seq == 0 || dim == 0) return SAPIPE_OK;
  if (y == nullptr || tokens == nullptr || token_table == nullptr || position_table == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  split(batch * seq * dim, dim, [&](size_t lo, size_t hi) {
    for (size_t row = lo / dim; row < hi / dim; ++row) {
      const float t = tokens[row];
      const float* pos = position_table + (row % seq) * dim;
      float* yr = y + row * dim;
      if (!token_valid(t, vocab)) {
        for (size_t j = 0; j < dim; ++j) yr[j] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float* tok = token_table + static_cast<size_t>(t) * dim;
      for (size_t j = 0; j < dim; ++j) yr[j] = tok[j] + pos[j];
    }
  });
  return SAPIPE_OK;
}

sapipe_status nn_embedding_backward(float* dtoken_table, float* dposition_table, const float* dy, const float* tokens, size_t batch,
                                    size_t seq, size_t vocab, size_t dim, int32_t accumulate, void*) {
  if (dim == 0) return SAPIPE_OK;
  if (dtoken_table == nullptr && vocab > 0) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (batch > 0 && seq > 0 && (dy == nullptr || tokens == nullptr)) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (accumulate == 0) {
    for (size_t i = 0; i < vocab * dim; ++i) dtoken_table[i] = 0.0f;
    if (dposition_table != nullptr)
      for (size_t i = 0; i < seq * dim; ++i) dposition_table[i] = 0.0f;
  }
  for (size_t row = 0; row < batch * seq; ++row) {
    const float* g = dy + row * dim;
    const float t = tokens[row];
    if (token_valid(t, vocab)) {
      float* d = dtoken_table + static_cast<size_t>(t) * dim;
      for (size_t j = 0; j < dim; ++j) d[j] += g[j];
    }
    if (dposition_table != nullptr) {
      float* d = dposition_table + (row % seq) * dim;
      for (size_t j = 0; j < dim; ++j) d[j] += g[j];
    }
  }
  return SAPIPE_OK;
}

sapipe_status nn_dropout(float* y, const float* x, size_t count, float p, uint64_t seed, uint64_t offset, void*) {
  if (count == 0) return SAPIPE_OK;
  if (y == nullptr || x == nullptr || !(p >= 0.0f && p < 1.0f)) return SAPIPE_ERR_INVALID_ARGUMENT;
  const float scale = 1.0f / (1.0f - p);
  split(count, 16, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) y[i] = sapipe_dropout_uniform(seed, offset + i) >= p ? x[i] * scale : 0.0f;
  });
  return SAPIPE_OK;
}

sapipe_status nn_attention(float* o, float* lse, const float* q, const float* k, const float* v, size_t batch, size_t seq, size_t heads,
                           size_t head_dim, float scale, void*) {
  return attention_forward(o, lse, q, k, v, batch, seq, heads, head_dim, scale);
}

sapipe_status nn_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                                    const float* o, const float* lse, size_t batch, size_t seq, size_t heads, size_t head_dim,
                                    float scale, void*) {
  return attention_backward(dq, dk, dv, dout, q, k, v, o, lse, batch, seq, heads, head_dim, scale);
}

// ---- 2-D convolution: im2col and the SGEMM ------------------------------------------------------
// Per image: col [C R S, Ho Wo] holds the input patch of every output position, y_n = W col
// (W as [K, C R S]); backward dW (+)= dy_n col^T, dcol = W^T dy_n scattered back (col2im) into
// dx_n. Forward: the images split over the thread pool. Backward: the images cut into fixed parts
// (kConvParts) on the thread pool, each part summing its dW and db, the parts added in order.
// Products inside a pool job run on its thread (sgemm_serial); each thread has its own col.

struct ConvDims {
  size_t n, c, h, w, k, r, s, sh, sw, ph, pw, oh, ow;
  size_t patch() const { return c * r * s; }
  size_t out_area() const { return oh * ow; }
};

bool conv_dims(const sapipe_nn_conv2d_shape* sh, ConvDims* d) {
  if (sh == nullptr) return false;
  *d = ConvDims{sh->batch, sh->in_channels, sh->height, sh->width, sh->out_channels, sh->kernel_h, sh->kernel_w, sh->stride_h,
                sh->stride_w, sh->pad_h, sh->pad_w, 0, 0};
  d->oh = sapipe_nn_conv_out(d->h, d->r, d->sh, d->ph);
  d->ow = sapipe_nn_conv_out(d->w, d->s, d->sw, d->pw);
  return d->r > 0 && d->s > 0 && d->sh > 0 && d->sw > 0 && d->h + 2 * d->ph >= d->r && d->w + 2 * d->pw >= d->s;
}

// The output columns ox whose input column ox sw - pw + s lies inside [0, w): [lo, hi).
struct ColumnRange {
  size_t lo, hi;
};
ColumnRange inside_columns(const ConvDims& d, size_t s) {
  const ptrdiff_t off = static_cast<ptrdiff_t>(s) - static_cast<ptrdiff_t>(d.pw);
  const ptrdiff_t sw = static_cast<ptrdiff_t>(d.sw), w = static_cast<ptrdiff_t>(d.w);
  // lo: the first ox with ox sw + off >= 0; hi: the first ox with ox sw + off >= w.
  const size_t lo = off >= 0 ? 0 : static_cast<size_t>((-off + sw - 1) / sw);
  const size_t hi = w - off <= 0 ? 0 : static_cast<size_t>((w - off + sw - 1) / sw);
  const size_t h = std::min(hi, d.ow);
  return {std::min(lo, h), h};
}

// col[(c R + r) S + s, oy Wo + ox] = x_n[c, oy sh - ph + r, ox sw - pw + s], 0 outside. The
// columns inside the image are found once per (s) rather than tested per value.
void im2col(const ConvDims& d, const float* x, float* col) {
  for (size_t c = 0; c < d.c; ++c)
    for (size_t r = 0; r < d.r; ++r)
      for (size_t s = 0; s < d.s; ++s) {
        float* row = col + ((c * d.r + r) * d.s + s) * d.out_area();
        const ColumnRange cols = inside_columns(d, s);
        const ptrdiff_t off = static_cast<ptrdiff_t>(s) - static_cast<ptrdiff_t>(d.pw);
        for (size_t oy = 0; oy < d.oh; ++oy) {
          float* out = row + oy * d.ow;
          const ptrdiff_t iy = static_cast<ptrdiff_t>(oy * d.sh + r) - static_cast<ptrdiff_t>(d.ph);
          if (iy < 0 || iy >= static_cast<ptrdiff_t>(d.h)) {
            for (size_t ox = 0; ox < d.ow; ++ox) out[ox] = 0.0f;
            continue;
          }
          const float* src = x + (c * d.h + static_cast<size_t>(iy)) * d.w;
          for (size_t ox = 0; ox < cols.lo; ++ox) out[ox] = 0.0f;
          for (size_t ox = cols.lo; ox < cols.hi; ++ox) out[ox] = src[static_cast<ptrdiff_t>(ox * d.sw) + off];
          for (size_t ox = cols.hi; ox < d.ow; ++ox) out[ox] = 0.0f;
        }
      }
}

// dx_n[c, iy, ix] += col[...] over every patch entry, in col's order.
void col2im(const ConvDims& d, const float* col, float* dx) {
  for (size_t c = 0; c < d.c; ++c)
    for (size_t r = 0; r < d.r; ++r)
      for (size_t s = 0; s < d.s; ++s) {
        const float* row = col + ((c * d.r + r) * d.s + s) * d.out_area();
        const ColumnRange cols = inside_columns(d, s);
        const ptrdiff_t off = static_cast<ptrdiff_t>(s) - static_cast<ptrdiff_t>(d.pw);
        for (size_t oy = 0; oy < d.oh; ++oy) {
          const ptrdiff_t iy = static_cast<ptrdiff_t>(oy * d.sh + r) - static_cast<ptrdiff_t>(d.ph);
          if (iy < 0 || iy >= static_cast<ptrdiff_t>(d.h)) continue;
          float* dst = dx + (c * d.h + static_cast<size_t>(iy)) * d.w;
          const float* in = row + oy * d.ow;
          for (size_t ox = cols.lo; ox < cols.hi; ++ox) dst[static_cast<ptrdiff_t>(ox * d.sw) + off] += in[ox];
        }
      }
}

// A product of tightly packed matrices on the calling thread: the convolutions call this from jobs
// of the thread pool.
sapipe_status gemm_rows(bool ta, bool tb, size_t m, size_t n, size_t k, float beta, const float* a, const float* b, float* c) {
  return serial_product(ta, tb, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

// The images are split over the thread pool, each thread with its own patch buffer; each image's
// output is written by one thread in the order of the serial loop, so the result does not depend
// on the split.
sapipe_status nn_conv2d(float* y, const float* x, const float* w, const float* bias, const sapipe_nn_conv2d_shape* shape, void*) {
  ConvDims d;
  if (!conv_dims(shape, &d)) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (d.n == 0 || d.k == 0 || d.out_area() == 0) return SAPIPE_OK;
  if (y == nullptr || w == nullptr || (d.c > 0 && x == nullptr)) return SAPIPE_ERR_INVALID_ARGUMENT;
  try {
    const size_t per = d.patch() * d.out_area();
    std::vector<float> cols(static_cast<size_t>(ThreadPool::current().size()) * per);
    FirstError error;
    split_units(d.n, [&](int t, size_t lo, size_t hi) {
      float* col = cols.data() + static_cast<size_t>(t) * per;
      for (size_t n = lo; n < hi; ++n) {
        float* yn = y + n * d.k * d.out_area();
        im2col(d, x + n * d.c * d.h * d.w, col);
        if (sapipe_status st = gemm_rows(false, false, d.k, d.out_area(), d.patch(), 0.0f, w, col, yn); st != SAPIPE_OK) {
          error.set(st);
          return;
        }
        if (bias != nullptr)
          for (size_t k = 0; k < d.k; ++k)
            for (size_t p = 0; p < d.out_area(); ++p) yn[k * d.out_area() + p] += bias[k];
      }
    });
    return error.get();
  } catch (const std::bad_alloc&) {
    return SAPIPE_ERR_OUT_OF_MEMORY;
  }
}

// The backward's images are cut into this many fixed parts (fewer when there are fewer images),
// whatever the thread count: each part sums its images' dW and db in image order into a buffer of
// its own, and the parts are added in order at the end, so the result depends on the batch alone,
// not on how many threads ran the parts.
constexpr size_t kConvParts = 8;

// Per part, on the thread pool: for each image in order, its patches (im2col), dW_part (+)= dy_n
// col_n^T, db_part (+)= row sums of dy_n, and the input gradient dcol = W^T dy_n scattered back
// (col2im) into dx_n; then dW (+)= the parts' sums in part order, and db alike.
sapipe_status nn_conv2d_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                                 const sapipe_nn_conv2d_shape* shape, int32_t accumulate, void*) {
  ConvDims d;
  if (!conv_dims(shape, &d)) return SAPIPE_ERR_INVALID_ARGUMENT;
  const size_t wlen = d.k * d.patch();
  if ((wlen > 0 && dw == nullptr) || (d.n > 0 && d.k > 0 && d.out_area() > 0 && dy == nullptr) ||
      (d.n > 0 && d.c > 0 && (x == nullptr || (dx != nullptr && w == nullptr))))
    return SAPIPE_ERR_INVALID_ARGUMENT;
  if (accumulate == 0) {
    for (size_t i = 0; i < wlen; ++i) dw[i] = 0.0f;
    if (db != nullptr)
      for (size_t k = 0; k < d.k; ++k) db[k] = 0.0f;
  }
  if (dx != nullptr)
    for (size_t i = 0; i < d.n * d.c * d.h * d.w; ++i) dx[i] = 0.0f;
  if (d.n == 0 || d.k == 0 || d.out_area() == 0) return SAPIPE_OK;
  const size_t area = d.out_area();
  const size_t per = d.patch() * area;
  const size_t parts = std::min(kConvParts, d.n);
  const size_t sums = wlen + d.k;  // a part's dW, then its db
  try {
    std::vector<float> partial(parts * sums, 0.0f);
    const size_t threads = static_cast<size_t>(ThreadPool::current().size());
    std::vector<float> cols(threads * per);
    std::vector<float> dcols(dx != nullptr ? threads * per : 0);
    FirstError error;
    split_units(parts, [&](int t, size_t first_part, size_t end_part) {
      float* col = cols.data() + static_cast<size_t>(t) * per;
      float* dcol = dx != nullptr ? dcols.data() + static_cast<size_t>(t) * per : nullptr;
      for (size_t part = first_part; part < end_part; ++part) {
        float* pdw = partial.data() + part * sums;
        float* pdb = pdw + wlen;
        for (size_t n = part * d.n / parts; n < (part + 1) * d.n / parts; ++n) {
          const float* dyn = dy + n * d.k * area;
          for (size_t k = 0; k < d.k; ++k)
            for (size_t p = 0; p < area; ++p) pdb[k] += dyn[k * area + p];
          if (per == 0) continue;
          im2col(d, x + n * d.c * d.h * d.w, col);
          // dW_part [K, CRS] += dy_n [K, HoWo] col^T
          if (sapipe_status st = gemm_rows(false, true, d.k, d.patch(), area, 1.0f, dyn, col, pdw); st != SAPIPE_OK) {
            error.set(st);
            return;
          }
          if (dcol == nullptr) continue;
          // dcol [CRS, HoWo] = W^T dy_n
          if (sapipe_status st = gemm_rows(true, false, d.patch(), area, d.k, 0.0f, w, dyn, dcol); st != SAPIPE_OK) {
            error.set(st);
            return;
          }
          col2im(d, dcol, dx + n * d.c * d.h * d.w);
        }
      }
    });
    if (error.get() != SAPIPE_OK) return error.get();
    for (size_t part = 0; part < parts; ++part) {
      const float* pdw = partial.data() + part * sums;
      for (size_t i = 0; i < wlen; ++i) dw[i] += pdw[i];
      if (db != nullptr)
        for (size_t k = 0; k < d.k; ++k) db[k] += pdw[wlen + k];
    }
  } catch (const std::bad_alloc&) {
    return SAPIPE_ERR_OUT_OF_MEMORY;
  }
  return SAPIPE_OK;
}

// ---- 2-D pooling ---------------------------------------------------------------------------------
// A plane (image, channel) at a time over the thread pool; the backward scatters each output's
// gradient in output order, per plane, so a value in several windows sums them in that order.

bool pool_dims(const sapipe_nn_conv2d_shape* sh, int32_t mode, ConvDims* d) {
  if (sh == nullptr || (mode != SAPIPE_NN_POOL_MAX && mode != SAPIPE_NN_POOL_AVG)) return false;
  sapipe_nn_conv2d_shape s = *sh;
  s.out_channels = s.in_channels;
  return conv_dims(&s, d) && 2 * d->ph <= d->r && 2 * d->pw <= d->s;
}

// Max pooling without padding, where every window lies inside the plane: the same results as
// sapipe_nn_max_pool_at (the first largest value; NaN never wins; NaN when every value is NaN)
// without its bounds checks, and with selects instead of branches on the data, which mispredict
// about once a window (the general loop cost 5 to 15 ns per output of a 2x2 pooling).
void max_pool_plane(const ConvDims& d, const float* plane, float* out) {
  const size_t h_step = d.sh * d.w, kr = d.r, ks = d.s, w = d.w;
  for (size_t oy = 0; oy < d.oh; ++oy) {
    const float* row = plane + oy * h_step;
    for (size_t ox = 0; ox < d.ow; ++ox) {
      const float* win = row + ox * d.sw;
      float best = -std::numeric_limits<float>::infinity();
      int seen = 0;  // a value that is not NaN
      for (size_t r = 0; r < kr; ++r)
        for (size_t c = 0; c < ks; ++c) {
          const float v = win[r * w + c];
          best = v > best ? v : best;
          seen |= static_cast<int>(v == v);
        }
      out[oy * d.ow + ox] = seen ? best : std::numeric_limits<float>::quiet_NaN();
    }
  }
}

// Its backward on one plane: dx zeroed, then each output's gradient added at its window's first
// largest value, outputs in order (as the general loop).
void max_pool_plane_backward(const ConvDims& d, const float* plane, const float* dy, float* dx) {
  const size_t h_step = d.sh * d.w, kr = d.r, ks = d.s, w = d.w;
  constexpr size_t kNone = static_cast<size_t>(-1);
  for (size_t i = 0; i < d.h * d.w; ++i) dx[i] = 0.0f;
  for (size_t oy = 0; oy < d.oh; ++oy)
    for (size_t ox = 0; ox < d.ow; ++ox) {
      const size_t corner = oy * h_step + ox * d.sw;
      float best = -std::numeric_limits<float>::infinity();
      size_t at = kNone;
      for (size_t r = 0; r < kr; ++r)
        for (size_t c = 0; c < ks; ++c) {
          const size_t i = corner + r * w + c;
          const float v = plane[i];
          // v > best, or the first value that is not NaN (it may equal -inf).
          const size_t take = static_cast<size_t>(v > best) | (static_cast<size_t>(at == kNone) & static_cast<size_t>(v == v));
          const size_t mask = size_t{0} - take;
          at = (i & mask) | (at & ~mask);
          best = v > best ? v : best;
        }
      if (at != kNone) dx[at] += dy[oy * d.ow + ox];
    }
}

sapipe_status nn_pool2d(float* y, const float* x, const sapipe_nn_conv2d_shape* shape, int32_t mode, void*) {
  ConvDims d;
  if (!pool_dims(shape, mode, &d)) return SAPIPE_ERR_INVALID_ARGUMENT;
  const size_t planes = d.n * d.c, in_area = d.h * d.w, out_area = d.out_area();
  if (planes == 0 || out_area == 0) return SAPIPE_OK;
  if (y == nullptr || x == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  const float area = static_cast<float>(d.r * d.s);
  if (mode == SAPIPE_NN_POOL_MAX && d.ph == 0 && d.pw == 0) {
    split(planes * out_area, out_area, [&](size_t lo, size_t hi) {
      for (size_t p = lo / out_area; p < hi / out_area; ++p) max_pool_plane(d, x + p * in_area, y + p * out_area);
    });
    return SAPIPE_OK;
  }
  split(planes * out_area, out_area, [&](size_t lo, size_t hi) {
    for (size_t p = lo / out_area; p < hi / out_area; ++p) {
      const float* plane = x + p * in_area;
      for (size_t oy = 0; oy < d.oh; ++oy)
        for (size_t ox = 0; ox < d.ow; ++ox) {
          const ptrdiff_t y0 = static_cast<ptrdiff_t>(oy * d.sh) - static_cast<ptrdiff_t>(d.ph);
          const ptrdiff_t x0 = static_cast<ptrdiff_t>(ox * d.sw) - static_cast<ptrdiff_t>(d.pw);
          float out = 0.0f;
          if (mode == SAPIPE_NN_POOL_MAX) {
            const size_t at = sapipe_nn_max_pool_at(plane, d.h, d.w, y0, x0, d.r, d.s);
            out = at == static_cast<size_t>(-1) ? std::numeric_limits<float>::quiet_NaN() : plane[at];
          } else {
            float sum = 0.0f;
            for (size_t r = 0; r < d.r; ++r)
              for (size_t c = 0; c < d.s; ++c) {
                const ptrdiff_t iy = y0 + static_cast<ptrdiff_t>(r), ix = x0 + static_cast<ptrdiff_t>(c);
                if (iy >= 0 && iy < static_cast<ptrdiff_t>(d.h) && ix >= 0 && ix < static_cast<ptrdiff_t>(d.w))
                  sum += plane[static_cast<size_t>(iy) * d.w + static_cast<size_t>(ix)];
              }
            out = sum / area;
          }
          y[p * out_area + oy * d.ow + ox] = out;
        }
    }
  });
  return SAPIPE_OK;
}

sapipe_status nn_pool2d_backward(float* dx, const float* dy, const float* x, const sapipe_nn_conv2d_shape* shape, int32_t mode, void*) {
  ConvDims d;
  if (!pool_dims(shape, mode, &d)) return SAPIPE_ERR_INVALID_ARGUMENT;
  const size_t planes = d.n * d.c, in_area = d.h * d.w, out_area = d.out_area();
  if (planes == 0 || in_area == 0) return SAPIPE_OK;
  if (dx == nullptr || dy == nullptr || x == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  const float area = static_cast<float>(d.r * d.s);
  if (mode == SAPIPE_NN_POOL_MAX && d.ph == 0 && d.pw == 0) {
    split(planes * in_area, in_area, [&](size_t lo, size_t hi) {
      for (size_t p = lo / in_area; p < hi / in_area; ++p) max_pool_plane_backward(d, x + p * in_area, dy + p * out_area, dx + p * in_area);
    });
    return SAPIPE_OK;
  }
  split(planes * in_area, in_area, [&](size_t lo, size_t hi) {
    for (size_t p = lo / in_area; p < hi / in_area; ++p) {
      const float* plane = x + p * in_area;
      float* dplane = dx + p * in_area;
      for (size_t i = 0; i < in_area; ++i) dplane[i] = 0.0f;
      for (size_t oy = 0; oy < d.oh; ++oy)
        for (size_t ox = 0; ox < d.ow; ++ox) {
          const float g = dy[p * out_area + oy * d.ow + ox];
          const ptrdiff_t y0 = static_cast<ptrdiff_t>(oy * d.sh) - static_cast<ptrdiff_t>(d.ph);
          const ptrdiff_t x0 = static_cast<ptrdiff_t>(ox * d.sw) - static_cast<ptrdiff_t>(d.pw);
          if (mode == SAPIPE_NN_POOL_MAX) {
            const size_t at = sapipe_nn_max_pool_at(plane, d.h, d.w, y0, x0, d.r, d.s);
            if (at != static_cast<size_t>(-1)) dplane[at] += g;
            continue;
          }
          for (size_t r = 0; r < d.r; ++r)
            for (size_t c = 0; c < d.s; ++c) {
              const ptrdiff_t iy = y0 + static_cast<ptrdiff_t>(r), ix = x0 + static_cast<ptrdiff_t>(c);
              if (iy >= 0 && iy < static_cast<ptrdiff_t>(d.h) && ix >= 0 && ix < static_cast<ptrdiff_t>(d.w))
                dplane[static_cast<size_t>(iy) * d.w + static_cast<size_t>(ix)] += g / area;
            }
        }
    }
  });
  return SAPIPE_OK;
}

const sapipe_nn_ops kCpuNnOps = {
    sizeof(sapipe_nn_ops), nn_gemm,      nn_bias_add,           nn_bias_grad, nn_relu,
    nn_relu_backward,      nn_softmax_xent, nn_gelu,            nn_gelu_backward, nn_add,
    nn_layer_norm,         nn_layer_norm_backward, nn_embedding, nn_embedding_backward, nn_dropout,
    nn_attention,          nn_attention_backward, nn_conv2d, nn_conv2d_backward,
    nn_pool2d,             nn_pool2d_backward,
};

}  // namespace
}  // namespace sapipe::cpu

extern "C" const sapipe_nn_ops* sapipe_cpu_nn_ops(void) { return &sapipe::cpu::kCpuNnOps; }
