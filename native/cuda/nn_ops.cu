#include <cuda_runtime.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "../core/device/cublas_loader.h"
#include "device_errors.h"
#include "launch.cuh"
#include "nn_element.cuh"
#include "nn_ops.cuh"

namespace sapipe::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

sapipe_status invalid(const std::string& what) { return fail(SAPIPE_ERR_INVALID_ARGUMENT, what); }

// ---- cuBLAS -------------------------------------------------------------------------------

sapipe_status open_cublas(const cublas::Api** api) {
  std::string reason;
  const sapipe_status s = cublas::load(std::getenv("SAPIPE_CUBLAS_PATH"), CUDART_VERSION / 1000, api, &reason);
  return s == SAPIPE_OK ? s : fail(s, reason);
}

// A cuBLAS handle per thread, device and stream, made on first use and kept for the life of the
// thread (a handle is bound to the device current when it was made and is not safe across
// threads). One per stream rather than one switched with cublasSetStream: a handle's workspace
// serves the stream it is set to, so two streams sharing one (a device pipeline's stages, each on
// its own) could run two products on one workspace at once; and cublasSetStream resets the
// workspace, a cost on every product when the stages alternate. Past kPerDevice streams on a
// thread and device the least recently used handle is destroyed (cublasDestroy waits for the
// device, so no product of it is still running) and its slot made anew.
sapipe_status cublas_handle(const cublas::Api* api, void* stream, cublas::Handle* out) {
  constexpr int kMaxDevices = 64;
  constexpr int kPerDevice = 16;
  struct Bound {
    cublas::Handle handle = nullptr;
    void* stream = nullptr;
    unsigned long long used = 0;
  };
  thread_local Bound bound[kMaxDevices][kPerDevice] = {};
  thread_local unsigned long long clock = 0;
  int device = 0;
  if (sapipe_status s = from_cuda(cudaGetDevice(&device), "cudaGetDevice"); s != SAPIPE_OK) return s;
  if (device < 0 || device >= kMaxDevices) return invalid("gemm: device number out of range for cuBLAS handles");
  Bound* slot = nullptr;
  Bound* oldest = &bound[device][0];
  for (Bound& b : bound[device]) {
    if (b.handle != nullptr && b.stream == stream) {
      slot = &b;
      break;
    }
    if (b.handle == nullptr ? oldest->handle != nullptr : (oldest->handle != nullptr && b.used < oldest->used)) oldest = &b;
  }
  if (slot == nullptr) {
    slot = oldest;
    if (slot->handle != nullptr) {
      api->Destroy(slot->handle);  // best effort: a failure leaks one handle
      slot->handle = nullptr;
    }
    const cublas::Status st = api->Create(&slot->handle);
    if (st != cublas::kSuccess) {
      slot->handle = nullptr;
      return fail(st == 1 ? SAPIPE_ERR_BACKEND_UNAVAILABLE : SAPIPE_ERR_INTERNAL,
                  "cublasCreate failed with status " + std::to_string(st) + " (cuBLAS at " + api->path + ")");
    }
    // A new handle works on the legacy default stream.
    if (stream != nullptr && api->SetStream(slot->handle, stream) != cublas::kSuccess) {
      api->Destroy(slot->handle);
      slot->handle = nullptr;
      return fail(SAPIPE_ERR_INTERNAL, "cublasSetStream failed");
    }
    slot->stream = stream;
  }
  slot->used = ++clock;
  *out = slot->handle;
  return SAPIPE_OK;
}

size_t extent(size_t rows, size_t cols, size_t ld) { return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols; }

bool overlaps(const float* a, size_t a_len, const float* b, size_t b_len) {
  return a_len != 0 && b_len != 0 && a < b + b_len && b < a + a_len;
}

__global__ void scale_rows_kernel(float* c, size_t rows, size_t cols, size_t ldc, float beta) {
  SAPIPE_GRID_STRIDE(i, 0, rows * cols) {
    float& v = c[(i / cols) * ldc + i % cols];
    v = beta == 0.0f ? 0.0f : beta * v;
  }
}

sapipe_status gemm(const sapipe_nn_gemm_args* g, void* stream) {
  if (g == nullptr) return invalid("gemm: null arguments");
  if (g->m == 0 || g->n == 0) return SAPIPE_OK;
  const size_t a_rows = g->trans_a ? g->k : g->m, a_cols = g->trans_a ? g->m : g->k;
  const size_t b_rows = g->trans_b ? g->n : g->k, b_cols = g->trans_b ? g->k : g->n;
  if (g->c == nullptr || g->ldc < g->n || (g->k > 0 && (g->a == nullptr || g->b == nullptr || g->lda < a_cols || g->ldb < b_cols)))
    return invalid("gemm: a null operand or a leading dimension shorter than its row");
  constexpr size_t kMaxInt = INT_MAX;
  if (g->m > kMaxInt || g->n > kMaxInt || g->k > kMaxInt || g->lda > kMaxInt || g->ldb > kMaxInt || g->ldc > kMaxInt)
    return invalid("gemm: cuBLAS takes dimensions and leading dimensions below 2^31");
  const size_t c_len = extent(g->m, g->n, g->ldc);
  if (g->k > 0 && (overlaps(g->c, c_len, g->a, extent(a_rows, a_cols, g->lda)) || overlaps(g->c, c_len, g->b, extent(b_rows, b_cols, g->ldb))))
    return fail(SAPIPE_ERR_ALIASING, "gemm: C overlaps A or B");
  if (g->k == 0) {
    // An empty product: C = beta C (beta = 0 writes zeros without reading C), as the CPU does.
    scale_rows_kernel<<<grid_for(g->m * g->n), kThreads, 0, as_stream(stream)>>>(g->c, g->m, g->n, g->ldc, g->beta);
    return check_launch("gemm (k = 0) kernel");
  }
  const cublas::Api* api = nullptr;
  if (sapipe_status s = open_cublas(&api); s != SAPIPE_OK) return s;
  cublas::Handle handle = nullptr;
  if (sapipe_status s = cublas_handle(api, stream, &handle); s != SAPIPE_OK) return s;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: a row-major matrix read as
  // column-major is its transpose, so B comes first and each keeps its own transpose flag.
  const cublas::Status st = api->Sgemm(handle, g->trans_b ? cublas::kOpT : cublas::kOpN, g->trans_a ? cublas::kOpT : cublas::kOpN,
                                       static_cast<int>(g->n), static_cast<int>(g->m), static_cast<int>(g->k), &g->alpha, g->b,
                                       static_cast<int>(g->ldb), g->a, static_cast<int>(g->lda), &g->beta, g->c,
                                       static_cast<int>(g->ldc));
  if (st != cublas::kSuccess) return fail(SAPIPE_ERR_INTERNAL, "cublasSgemm failed with status " + std::to_string(st));
  return check_launch("cublasSgemm");
}

// ---- element and row kernels ----------------------------------------------------------------

__global__ void bias_add_kernel(float* y, const float* bias, size_t rows, size_t cols) {
  SAPIPE_GRID_STRIDE(i, 0, rows * cols) y[i] += bias[i % cols];
}

// One thread per column, summing the rows in order: the CPU's order, so both agree to rounding.
__global__ void bias_grad_kernel(float* db, const float* dy, size_t rows, size_t cols, int accumulate) {
  SAPIPE_GRID_STRIDE(j, 0, cols) {
    float sum = accumulate ? db[j] : 0.0f;
    for (size_t r = 0; r < rows; ++r) sum += dy[r * cols + j];
    db[j] = sum;
  }
}

__global__ void relu_kernel(float* y, const float* x, size_t n) {
  SAPIPE_GRID_STRIDE(i, 0, n) y[i] = relu_element(x[i]);
}

__global__ void relu_backward_kernel(float* dx, const float* y, const float* dy, size_t n) {
  SAPIPE_GRID_STRIDE(i, 0, n) dx[i] = relu_backward_element(y[i], dy[i]);
}

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;

// One warp per row: the first largest logit (NaN never wins, as on the CPU), the sum of
// exp(z - max), then the loss, the gradient row and whether the row was classified right.
__global__ void softmax_xent_kernel(const float* logits, const float* labels, size_t rows, size_t classes, float scale,
                                   float* losses, float* dlogits, float* correct) {
  const int lane = threadIdx.x % kWarp;
  for (size_t r = static_cast<size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; r < rows;
       r += static_cast<size_t>(gridDim.x) * kRowsPerBlock) {
    const float* z = logits + r * classes;
    float best = -INFINITY;
    size_t best_at = classes;
    for (size_t j = lane; j < classes; j += kWarp)
      if (z[j] > best) best = z[j], best_at = j;
    for (int d = kWarp / 2; d > 0; d /= 2) {
      const float other = __shfl_down_sync(0xffffffffu, best, d);
      const size_t other_at = __shfl_down_sync(0xffffffffu, best_at, d);
      if (other > best || (other == best && other_at < best_at)) best = other, best_at = other_at;
    }
    const float max = __shfl_sync(0xffffffffu, best, 0);
    best_at = __shfl_sync(0xffffffffu, best_at, 0);
    if (best_at == classes) best_at = 0;  // no logit above -inf: the CPU keeps 0 too
    float sum = 0.0f;
    for (size_t j = lane; j < classes; j += kWarp) sum += expf(z[j] - max);
    sum = warp_sum(sum);
    sum = __shfl_sync(0xffffffffu, sum, 0);
    const float label_value = labels[r];
    const bool valid = label_is_class(label_value, classes);
    const size_t label = valid ? static_cast<size_t>(label_value) : 0;
    if (lane == 0) {
      losses[r] = valid ? xent_loss_element(z[label], max, sum) : NAN;
      if (correct != nullptr) correct[r] = valid && best_at == label ? 1.0f : 0.0f;
    }
    // Every lane has read the row's logits it needs (max, sum, z[label] above) before any writes
    // the gradient, which may be the logits themselves.
    __syncwarp();
    if (dlogits != nullptr)
      for (size_t j = lane; j < classes; j += kWarp)
        dlogits[r * classes + j] = valid ? xent_grad_element(z[j], max, sum, j == label, scale) : 0.0f;
  }
}

__global__ void gelu_kernel(float* y, const float* x, size_t n) {
  SAPIPE_GRID_STRIDE(i, 0, n) y[i] = gelu_element(x[i]);
}

__global__ void gelu_backward_kernel(float* dx, const float* x, const float* dy, size_t n) {
  SAPIPE_GRID_STRIDE(i, 0, n) dx[i] = gelu_backward_element(x[i], dy[i]);
}

__global__ void add_kernel(float* y, const float* a, const float* b, size_t n) {
  SAPIPE_GRID_STRIDE(i, 0, n) y[i] = a[i] + b[i];
}

// One warp per row: the mean, then the variance about it (two passes, like the CPU), then y.
__global__ void layer_norm_kernel(float* y, float* mean, float* rstd, const float* x, const float* gamma, const float* beta,
                                  size_t rows, size_t cols, float eps) {
  const int lane = threadIdx.x % kWarp;
  for (size_t r = static_cast<size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; r < rows;
       r += static_cast<size_t>(gridDim.x) * kRowsPerBlock) {
    const float* xr = x + r * cols;
    float sum = 0.0f;
    for (size_t j = lane; j < cols; j += kWarp) sum += xr[j];
    const float mu = __shfl_sync(0xffffffffu, warp_sum(sum), 0) / static_cast<float>(cols);
    float sq = 0.0f;
    for (size_t j = lane; j < cols; j += kWarp) sq += (xr[j] - mu) * (xr[j] - mu);
    const float var = __shfl_sync(0xffffffffu, warp_sum(sq), 0) / static_cast<float>(cols);
    const float rs = 1.0f / sqrtf(var + eps);
    if (lane == 0) mean[r] = mu, rstd[r] = rs;
    float* yr = y + r * cols;  // may be xr: each lane reads its x before writing its y, and the sums are done
    __syncwarp();
    for (size_t j = lane; j < cols; j += kWarp) yr[j] = layer_norm_element(xr[j], mu, rs, gamma[j], beta[j]);
  }
}

// One thread per column, rows summed in order (the CPU's order).
__global__ void layer_norm_param_grad_kernel(float* dgamma, float* dbeta, const float* dy, const float* x, const float* mean,
                                             const float* rstd, size_t rows, size_t cols, int accumulate) {
  SAPIPE_GRID_STRIDE(j, 0, cols) {
    float g = accumulate ? dgamma[j] : 0.0f, b = accumulate ? dbeta[j] : 0.0f;
    for (size_t r = 0; r < rows; ++r) {
      const float d = dy[r * cols + j];
      g += d * ((x[r * cols + j] - mean[r]) * rstd[r]);
      b += d;
    }
    dgamma[j] = g, dbeta[j] = b;
  }
}

// One warp per row: mean(g) and mean(g xhat), then dx.
__global__ void layer_norm_dx_kernel(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                                     const float* gamma, size_t rows, size_t cols) {
  const int lane = threadIdx.x % kWarp;
  for (size_t r = static_cast<size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; r < rows;
       r += static_cast<size_t>(gridDim.x) * kRowsPerBlock) {
    const float *dyr = dy + r * cols, *xr = x + r * cols;
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    for (size_t j = lane; j < cols; j += kWarp) {
      const float g = dyr[j] * gamma[j];
      sg += g;
      sgx += g * ((xr[j] - mu) * rs);
    }
    const float mg = __shfl_sync(0xffffffffu, warp_sum(sg), 0) / static_cast<float>(cols);
    const float mgx = __shfl_sync(0xffffffffu, warp_sum(sgx), 0) / static_cast<float>(cols);
    __syncwarp();
    float* dxr = dx + r * cols;  // may be dyr
    for (size_t j = lane; j < cols; j += kWarp) dxr[j] = layer_norm_dx_element(dyr[j], gamma[j], (xr[j] - mu) * rs, rs, mg, mgx);
  }
}

__global__ void embedding_kernel(float* y, const float* tokens, const float* token_table, const float* position_table, size_t seq,
                                 size_t vocab, size_t dim, size_t n) {
  SAPIPE_GRID_STRIDE(i, 0, n) {
    const size_t row = i / dim, j = i % dim;
    const float t = tokens[row];
    y[i] = token_is_valid(t, vocab) ? token_table[static_cast<size_t>(t) * dim + j] + position_table[(row % seq) * dim + j] : NAN;
  }
}

// The scatter-add without atomics, in the CPU's order: one thread per column of the token table
// walks every (b, s) in order; one thread per (s, column) of the position table sums over b.
__global__ void embedding_token_grad_kernel(float* dtoken, const float* dy, const float* tokens, size_t rows, size_t vocab, size_t dim,
                                            int accumulate) {
  SAPIPE_GRID_STRIDE(j, 0, dim) {
    if (!accumulate)
      for (size_t v = 0; v < vocab; ++v) dtoken[v * dim + j] = 0.0f;
    for (size_t row = 0; row < rows; ++row) {
      const float t = tokens[row];
      if (token_is_valid(t, vocab)) dtoken[static_cast<size_t>(t) * dim + j] += dy[row * dim + j];
    }
  }
}

__global__ void embedding_position_grad_kernel(float* dposition, const float* dy, size_t batch, size_t seq, size_t dim,
                                               int accumulate) {
  SAPIPE_GRID_STRIDE(i, 0, seq * dim) {
    float sum = accumulate ? dposition[i] : 0.0f;
    for (size_t b = 0; b < batch; ++b) sum += dy[b * seq * dim + i];
    dposition[i] = sum;
  }
}

__global__ void dropout_kernel(float* y, const float* x, size_t n, float p, float scale, uint64_t seed, uint64_t offset) {
  SAPIPE_GRID_STRIDE(i, 0, n) y[i] = dropout_element(x[i], p, scale, seed, offset + i);
}

// ---- causal self-attention: a warp per row ---------------------------------------------------
// A row's head_dim values are spread over the lanes (lane l holds d = l, l + 32, ...), kept in
// registers; dot products are butterfly sums every lane receives. The forward runs an online
// softmax over the keys j <= i; the backward recomputes p_ij from the saved lse, dq by query
// rows, dk and dv by key rows, so no score matrix is stored and nothing is written twice.

constexpr int kHeadSlots = SAPIPE_NN_MAX_HEAD_DIM / kWarp;

__device__ __forceinline__ float warp_allsum(float x) {
  for (int d = kWarp / 2; d > 0; d /= 2) x += __shfl_xor_sync(0xffffffffu, x, d);
  return x;
}

struct AttnShape {
  size_t batch, seq, heads, dim;
  __device__ size_t rows() const { return batch * heads * seq; }
  __device__ size_t at(size_t b, size_t h, size_t i) const { return (b * seq + i) * heads * dim + h * dim; }
};

// Loads a row's values held by this lane (0 past head_dim).
__device__ __forceinline__ void load_row(float (&r)[kHeadSlots], const float* p, size_t dim, int lane) {
#pragma unroll
  for (int c = 0; c < kHeadSlots; ++c) {
    const size_t d = lane + static_cast<size_t>(c) * kWarp;
    r[c] = d < dim ? p[d] : 0.0f;
  }
}

__device__ __forceinline__ float row_dot(const float (&r)[kHeadSlots], const float* p, size_t dim, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kHeadSlots; ++c) {
    const size_t d = lane + static_cast<size_t>(c) * kWarp;
    if (d < dim) s += r[c] * p[d];
  }
  return warp_allsum(s);
}

#define SAPIPE_WARP_ROWS(r, rows)                                                                                   \
  for (size_t r = static_cast<size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; r < (rows); \
       r += static_cast<size_t>(gridDim.x) * kRowsPerBlock)

__global__ void attention_kernel(float* o, float* lse, const float* q, const float* k, const float* v, AttnShape a, float scale) {
  const int lane = threadIdx.x % kWarp;
  SAPIPE_WARP_ROWS(r, a.rows()) {
    const size_t b = r / (a.heads * a.seq), h = (r / a.seq) % a.heads, i = r % a.seq;
    float qr[kHeadSlots], acc[kHeadSlots] = {};
    load_row(qr, q + a.at(b, h, i), a.dim, lane);
    float m = -INFINITY, l = 0.0f;
    for (size_t j = 0; j <= i; ++j) {
      const size_t kj = a.at(b, h, j);
      const float sc = scale * row_dot(qr, k + kj, a.dim, lane);
      float c, p;
      online_softmax_step(sc, &m, &l, &c, &p);
#pragma unroll
      for (int s = 0; s < kHeadSlots; ++s) {
        const size_t d = lane + static_cast<size_t>(s) * kWarp;
        if (d < a.dim) acc[s] = acc[s] * c + p * v[kj + d];
      }
    }
    float* oi = o + a.at(b, h, i);
#pragma unroll
    for (int s = 0; s < kHeadSlots; ++s) {
      const size_t d = lane + static_cast<size_t>(s) * kWarp;
      if (d < a.dim) oi[d] = acc[s] / l;
    }
    if (lane == 0) lse[r] = m + logf(l);
  }
}

__global__ void attention_dq_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v, const float* o,
                                    const float* lse, AttnShape a, float scale) {
  const int lane = threadIdx.x % kWarp;
  SAPIPE_WARP_ROWS(r, a.rows()) {
    const size_t b = r / (a.heads * a.seq), h = (r / a.seq) % a.heads, i = r % a.seq, qi = a.at(b, h, i);
    float qr[kHeadSlots], dor[kHeadSlots], acc[kHeadSlots] = {};
    load_row(qr, q + qi, a.dim, lane);
    load_row(dor, dout + qi, a.dim, lane);
    const float d_row = row_dot(dor, o + qi, a.dim, lane), li = lse[r];
    for (size_t j = 0; j <= i; ++j) {
      const size_t kj = a.at(b, h, j);
      const float p = expf(scale * row_dot(qr, k + kj, a.dim, lane) - li);
      const float ds = attention_ds_element(p, row_dot(dor, v + kj, a.dim, lane), d_row);
#pragma unroll
      for (int s = 0; s < kHeadSlots; ++s) {
        const size_t d = lane + static_cast<size_t>(s) * kWarp;
        if (d < a.dim) acc[s] += ds * k[kj + d];
      }
    }
#pragma unroll
    for (int s = 0; s < kHeadSlots; ++s) {
      const size_t d = lane + static_cast<size_t>(s) * kWarp;
      if (d < a.dim) dq[qi + d] = scale * acc[s];
    }
  }
}

__global__ void attention_dkdv_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                                      const float* o, const float* lse, AttnShape a, float scale) {
  const int lane = threadIdx.x % kWarp;
  SAPIPE_WARP_ROWS(r, a.rows()) {
    const size_t b = r / (a.heads * a.seq), h = (r / a.seq) % a.heads, j = r % a.seq, kj = a.at(b, h, j);
    float kr[kHeadSlots], vr[kHeadSlots], dka[kHeadSlots] = {}, dva[kHeadSlots] = {};
    load_row(kr, k + kj, a.dim, lane);
    load_row(vr, v + kj, a.dim, lane);
    for (size_t i = j; i < a.seq; ++i) {
      const size_t qi = a.at(b, h, i);
      const float p = expf(scale * row_dot(kr, q + qi, a.dim, lane) - lse[(b * a.heads + h) * a.seq + i]);
      float dor[kHeadSlots];
      load_row(dor, dout + qi, a.dim, lane);
      const float ds = attention_ds_element(p, row_dot(vr, dout + qi, a.dim, lane), row_dot(dor, o + qi, a.dim, lane));
#pragma unroll
      for (int s = 0; s < kHeadSlots; ++s) {
        const size_t d = lane + static_cast<size_t>(s) * kWarp;
        if (d < a.dim) dka[s] += ds * q[qi + d], dva[s] += p * dor[s];
      }
    }
#pragma unroll
    for (int s = 0; s < kHeadSlots; ++s) {
      const size_t d = lane + static_cast<size_t>(s) * kWarp;
      if (d < a.dim) dk[kj + d] = scale * dka[s], dv[kj + d] = dva[s];
    }
  }
}

// ---- 2-D convolution: direct, a thread per output value -------------------------------------------
// No im2col buffer and no cuBLAS: the forward sums a patch per output, the input gradient gathers
// the outputs each input feeds (a thread per input value, no atomics), the weight gradient sums
// over the batch and the output positions (a thread per weight), the bias gradient per channel.

struct ConvShape {
  size_t n, c, h, w, k, r, s, sh, sw, ph, pw, oh, ow;
};

__global__ void conv2d_kernel(float* y, const float* x, const float* wt, const float* bias, ConvShape d) {
  SAPIPE_GRID_STRIDE(i, 0, d.n * d.k * d.oh * d.ow) {
    const size_t ox = i % d.ow, oy = (i / d.ow) % d.oh, k = (i / (d.ow * d.oh)) % d.k, n = i / (d.ow * d.oh * d.k);
    float sum = bias != nullptr ? bias[k] : 0.0f;
    for (size_t c = 0; c < d.c; ++c)
      for (size_t r = 0; r < d.r; ++r) {
        const long long iy = static_cast<long long>(oy * d.sh + r) - static_cast<long long>(d.ph);
        if (iy < 0 || iy >= static_cast<long long>(d.h)) continue;
        for (size_t s = 0; s < d.s; ++s) {
          const long long ix = static_cast<long long>(ox * d.sw + s) - static_cast<long long>(d.pw);
          if (ix < 0 || ix >= static_cast<long long>(d.w)) continue;
          sum += wt[((k * d.c + c) * d.r + r) * d.s + s] * x[((n * d.c + c) * d.h + static_cast<size_t>(iy)) * d.w + static_cast<size_t>(ix)];
        }
      }
    y[i] = sum;
  }
}

// dx[n, c, iy, ix] = sum over k, r, s with oy sh = iy + ph - r and ox sw = ix + pw - s inside the output.
__global__ void conv2d_dx_kernel(float* dx, const float* dy, const float* wt, ConvShape d) {
  SAPIPE_GRID_STRIDE(i, 0, d.n * d.c * d.h * d.w) {
    const size_t ix = i % d.w, iy = (i / d.w) % d.h, c = (i / (d.w * d.h)) % d.c, n = i / (d.w * d.h * d.c);
    float sum = 0.0f;
    for (size_t k = 0; k < d.k; ++k)
      for (size_t r = 0; r < d.r; ++r) {
        const long long ty = static_cast<long long>(iy + d.ph) - static_cast<long long>(r);
        if (ty < 0 || ty % static_cast<long long>(d.sh) != 0) continue;
        const size_t oy = static_cast<size_t>(ty) / d.sh;
        if (oy >= d.oh) continue;
        for (size_t s = 0; s < d.s; ++s) {
          const long long tx = static_cast<long long>(ix + d.pw) - static_cast<long long>(s);
          if (tx < 0 || tx % static_cast<long long>(d.sw) != 0) continue;
          const size_t ox = static_cast<size_t>(tx) / d.sw;
          if (ox >= d.ow) continue;
          sum += wt[((k * d.c + c) * d.r + r) * d.s + s] * dy[((n * d.k + k) * d.oh + oy) * d.ow + ox];
        }
      }
    dx[i] = sum;
  }
}

__global__ void conv2d_dw_kernel(float* dw, const float* dy, const float* x, ConvShape d, int accumulate) {
  SAPIPE_GRID_STRIDE(i, 0, d.k * d.c * d.r * d.s) {
    const size_t s = i % d.s, r = (i / d.s) % d.r, c = (i / (d.s * d.r)) % d.c, k = i / (d.s * d.r * d.c);
    float sum = 0.0f;
    for (size_t n = 0; n < d.n; ++n)
      for (size_t oy = 0; oy < d.oh; ++oy) {
        const long long iy = static_cast<long long>(oy * d.sh + r) - static_cast<long long>(d.ph);
        if (iy < 0 || iy >= static_cast<long long>(d.h)) continue;
        for (size_t ox = 0; ox < d.ow; ++ox) {
          const long long ix = static_cast<long long>(ox * d.sw + s) - static_cast<long long>(d.pw);
          if (ix < 0 || ix >= static_cast<long long>(d.w)) continue;
          sum += dy[((n * d.k + k) * d.oh + oy) * d.ow + ox] * x[((n * d.c + c) * d.h + static_cast<size_t>(iy)) * d.w + static_cast<size_t>(ix)];
        }
      }
    dw[i] = accumulate ? dw[i] + sum : sum;
  }
}

__global__ void conv2d_db_kernel(float* db, const float* dy, ConvShape d, int accumulate) {
  SAPIPE_GRID_STRIDE(k, 0, d.k) {
    float sum = accumulate ? db[k] : 0.0f;
    for (size_t n = 0; n < d.n; ++n)
      for (size_t p = 0; p < d.oh * d.ow; ++p) sum += dy[(n * d.k + k) * d.oh * d.ow + p];
    db[k] = sum;
  }
}

bool conv_shape(const sapipe_nn_conv2d_shape* sh, ConvShape* d) {
  if (sh == nullptr) return false;
  *d = ConvShape{sh->batch, sh->in_channels, sh->height, sh->width, sh->out_channels, sh->kernel_h, sh->kernel_w,
                 sh->stride_h, sh->stride_w, sh->pad_h, sh->pad_w, 0, 0};
  d->oh = sapipe_nn_conv_out(d->h, d->r, d->sh, d->ph);
  d->ow = sapipe_nn_conv_out(d->w, d->s, d->sw, d->pw);
  return d->r > 0 && d->s > 0 && d->sh > 0 && d->sw > 0 && d->h + 2 * d->ph >= d->r && d->w + 2 * d->pw >= d->s;
}

// ---- 2-D pooling: a thread per output value, a thread per input value for the gradient ----------

__global__ void pool2d_kernel(float* y, const float* x, ConvShape d, int32_t mode) {
  SAPIPE_GRID_STRIDE(i, 0, d.n * d.c * d.oh * d.ow) {
    const size_t ox = i % d.ow, oy = (i / d.ow) % d.oh, p = i / (d.ow * d.oh);
    const float* plane = x + p * d.h * d.w;
    const ptrdiff_t y0 = static_cast<ptrdiff_t>(oy * d.sh) - static_cast<ptrdiff_t>(d.ph);
    const ptrdiff_t x0 = static_cast<ptrdiff_t>(ox * d.sw) - static_cast<ptrdiff_t>(d.pw);
    if (mode == SAPIPE_NN_POOL_MAX) {
      const size_t at = sapipe_nn_max_pool_at(plane, d.h, d.w, y0, x0, d.r, d.s);
      y[i] = at == static_cast<size_t>(-1) ? NAN : plane[at];
    } else {
      y[i] = avg_pool_element(plane, d.h, d.w, y0, x0, d.r, d.s);
    }
  }
}

__global__ void pool2d_backward_kernel(float* dx, const float* dy, const float* x, ConvShape d, int32_t mode) {
  SAPIPE_GRID_STRIDE(i, 0, d.n * d.c * d.h * d.w) {
    const size_t ix = i % d.w, iy = (i / d.w) % d.h, p = i / (d.w * d.h);
    dx[i] = pool_grad_element(x + p * d.h * d.w, dy + p * d.oh * d.ow, d.h, d.w, iy, ix, d.r, d.s, d.sh, d.sw, d.ph, d.pw, d.oh, d.ow,
                              mode == SAPIPE_NN_POOL_MAX);
  }
}

bool pool_shape(const sapipe_nn_conv2d_shape* sh, int32_t mode, ConvShape* d) {
  if (sh == nullptr || (mode != SAPIPE_NN_POOL_MAX && mode != SAPIPE_NN_POOL_AVG)) return false;
  sapipe_nn_conv2d_shape s = *sh;
  s.out_channels = s.in_channels;
  return conv_shape(&s, d) && 2 * d->ph <= d->r && 2 * d->pw <= d->s;
}

unsigned int row_grid(size_t rows) {
  const size_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const size_t cap = grid_for(rows * kWarp);
  return static_cast<unsigned int>(blocks < cap ? blocks : cap);
}

// ---- the table entries ------------------------------------------------------------------

sapipe_status c_gemm(const sapipe_nn_gemm_args* args, void* stream) {
  return guarded("gemm", [&] { return gemm(args, stream); });
}

sapipe_status c_bias_add(float* y, const float* bias, size_t rows, size_t cols, void* stream) {
  return guarded("biasAdd", [&] {
    if (rows == 0 || cols == 0) return SAPIPE_OK;
    if (y == nullptr || bias == nullptr) return invalid("biasAdd: null pointer");
    bias_add_kernel<<<grid_for(rows * cols), kThreads, 0, as_stream(stream)>>>(y, bias, rows, cols);
    return check_launch("biasAdd kernel");
  });
}

sapipe_status c_bias_grad(float* db, const float* dy, size_t rows, size_t cols, int32_t accumulate, void* stream) {
  return guarded("biasGrad", [&] {
    if (cols == 0) return SAPIPE_OK;
    if (db == nullptr || (rows > 0 && dy == nullptr)) return invalid("biasGrad: null pointer");
    bias_grad_kernel<<<grid_for(cols), kThreads, 0, as_stream(stream)>>>(db, dy, rows, cols, accumulate);
    return check_launch("biasGrad kernel");
  });
}

sapipe_status c_relu(float* y, const float* x, size_t count, void* stream) {
  return guarded("relu", [&] {
    if (count == 0) return SAPIPE_OK;
    if (y == nullptr || x == nullptr) return invalid("relu: null pointer");
    relu_kernel<<<grid_for(count), kThreads, 0, as_stream(stream)>>>(y, x, count);
    return check_launch("relu kernel");
  });
}

sapipe_status c_relu_backward(float* dx, const float* y, const float* dy, size_t count, void* stream) {
  return guarded("reluBackward", [&] {
    if (count == 0) return SAPIPE_OK;
    if (dx == nullptr || y == nullptr || dy == nullptr) return invalid("reluBackward: null pointer");
    relu_backward_kernel<<<grid_for(count), kThreads, 0, as_stream(stream)>>>(dx, y, dy, count);
    return check_launch("reluBackward kernel");
  });
}

sapipe_status c_softmax_xent(const float* logits, const float* labels, size_t rows, size_t classes, float grad_scale,
                             float* losses, float* dlogits, float* correct, void* stream) {
  return guarded("softmaxCrossEntropy", [&] {
    if (rows == 0) return SAPIPE_OK;
    if (logits == nullptr || labels == nullptr || losses == nullptr || classes == 0)
      return invalid("softmaxCrossEntropy: null pointer or no classes");
    const size_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    const unsigned int grid = static_cast<unsigned int>(blocks < grid_for(rows * kWarp) ? blocks : grid_for(rows * kWarp));
    softmax_xent_kernel<<<grid, kThreads, 0, as_stream(stream)>>>(logits, labels, rows, classes, grad_scale, losses, dlogits,
                                                                  correct);
    return check_launch("softmaxCrossEntropy kernel");
  });
}

sapipe_status c_gelu(float* y, const float* x, size_t count, void* stream) {
  return guarded("gelu", [&] {
    if (count == 0) return SAPIPE_OK;
    if (y == nullptr || x == nullptr) return invalid("gelu: null pointer");
    gelu_kernel<<<grid_for(count), kThreads, 0, as_stream(stream)>>>(y, x, count);
    return check_launch("gelu kernel");
  });
}

sapipe_status c_gelu_backward(float* dx, const float* x, const float* dy, size_t count, void* stream) {
  return guarded("geluBackward", [&] {
    if (count == 0) return SAPIPE_OK;
    if (dx == nullptr || x == nullptr || dy == nullptr) return invalid("geluBackward: null pointer");
    gelu_backward_kernel<<<grid_for(count), kThreads, 0, as_stream(stream)>>>(dx, x, dy, count);
    return check_launch("geluBackward kernel");
  });
}

sapipe_status c_add(float* y, const float* a, const float* b, size_t count, void* stream) {
  return guarded("add", [&] {
    if (count == 0) return SAPIPE_OK;
    if (y == nullptr || a == nullptr || b == nullptr) return invalid("add: null pointer");
    add_kernel<<<grid_for(count), kThreads, 0, as_stream(stream)>>>(y, a, b, count);
    return check_launch("add kernel");
  });
}

sapipe_status c_layer_norm(float* y, float* mean, float* rstd, const float* x, const float* gamma, const float* beta, size_t rows,
                           size_t cols, float eps, void* stream) {
  return guarded("layerNorm", [&] {
    if (rows == 0) return SAPIPE_OK;
    if (y == nullptr || mean == nullptr || rstd == nullptr || x == nullptr || gamma == nullptr || beta == nullptr || cols == 0)
      return invalid("layerNorm: null pointer or no columns");
    if (!(eps > 0.0f) || !isfinite(eps)) return invalid("layerNorm: eps must be positive and finite");
    layer_norm_kernel<<<row_grid(rows), kThreads, 0, as_stream(stream)>>>(y, mean, rstd, x, gamma, beta, rows, cols, eps);
    return check_launch("layerNorm kernel");
  });
}

sapipe_status c_layer_norm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x, const float* mean,
                                    const float* rstd, const float* gamma, size_t rows, size_t cols, int32_t accumulate, void* stream) {
  return guarded("layerNormBackward", [&] {
    if (cols == 0) return SAPIPE_OK;
    if (dgamma == nullptr || dbeta == nullptr || gamma == nullptr) return invalid("layerNormBackward: null pointer");
    if (rows > 0 && (dx == nullptr || dy == nullptr || x == nullptr || mean == nullptr || rstd == nullptr))
      return invalid("layerNormBackward: null pointer");
    // The parameter gradients read dy before dx (which may be dy) is written: same stream, in order.
    layer_norm_param_grad_kernel<<<grid_for(cols), kThreads, 0, as_stream(stream)>>>(dgamma, dbeta, dy, x, mean, rstd, rows, cols,
                                                                                     accumulate);
    if (sapipe_status s = check_launch("layerNormBackward parameter kernel"); s != SAPIPE_OK || rows == 0) return s;
    layer_norm_dx_kernel<<<row_grid(rows), kThreads, 0, as_stream(stream)>>>(dx, dy, x, mean, rstd, gamma, rows, cols);
    return check_launch("layerNormBackward kernel");
  });
}

sapipe_status c_embedding(float* y, const float* tokens, const float* token_table, const float* position_table, size_t batch,
                          size_t seq, size_t vocab, size_t dim, void* stream) {
  return guarded("embedding", [&] {
    const size_t n = batch * seq * dim;
    if (n == 0) return SAPIPE_OK;
    if (y == nullptr || tokens == nullptr || token_table == nullptr || position_table == nullptr)
      return invalid("embedding: null pointer");
    embedding_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(y, tokens, token_table, position_table, seq, vocab, dim, n);
    return check_launch("embedding kernel");
  });
}

sapipe_status c_embedding_backward(float* dtoken_table, float* dposition_table, const float* dy, const float* tokens, size_t batch,
                                   size_t seq, size_t vocab, size_t dim, int32_t accumulate, void* stream) {
  return guarded("embeddingBackward", [&] {
    if (dim == 0) return SAPIPE_OK;
    if (dtoken_table == nullptr && vocab > 0) return invalid("embeddingBackward: null token table gradient");
    if (batch > 0 && seq > 0 && (dy == nullptr || tokens == nullptr)) return invalid("embeddingBackward: null pointer");
    if (vocab > 0) {
      embedding_token_grad_kernel<<<grid_for(dim), kThreads, 0, as_stream(stream)>>>(dtoken_table, dy, tokens, batch * seq, vocab, dim,
                                                                                     accumulate);
      if (sapipe_status s = check_launch("embeddingBackward token kernel"); s != SAPIPE_OK) return s;
    }
    if (dposition_table == nullptr || seq == 0) return SAPIPE_OK;
    embedding_position_grad_kernel<<<grid_for(seq * dim), kThreads, 0, as_stream(stream)>>>(dposition_table, dy, batch, seq, dim,
                                                                                            accumulate);
    return check_launch("embeddingBackward position kernel");
  });
}

sapipe_status c_dropout(float* y, const float* x, size_t count, float p, uint64_t seed, uint64_t offset, void* stream) {
  return guarded("dropout", [&] {
    if (count == 0) return SAPIPE_OK;
    if (y == nullptr || x == nullptr) return invalid("dropout: null pointer");
    if (!(p >= 0.0f && p < 1.0f)) return invalid("dropout: p must be in [0, 1)");
    dropout_kernel<<<grid_for(count), kThreads, 0, as_stream(stream)>>>(y, x, count, p, 1.0f / (1.0f - p), seed, offset);
    return check_launch("dropout kernel");
  });
}

bool attention_args_ok(size_t head_dim, float scale) { return head_dim >= 1 && head_dim <= SAPIPE_NN_MAX_HEAD_DIM && isfinite(scale); }

sapipe_status c_attention(float* o, float* lse, const float* q, const float* k, const float* v, size_t batch, size_t seq, size_t heads,
                          size_t head_dim, float scale, void* stream) {
  return guarded("attention", [&] {
    const size_t rows = batch * heads * seq;
    if (rows == 0) return SAPIPE_OK;
    if (o == nullptr || lse == nullptr || q == nullptr || k == nullptr || v == nullptr) return invalid("attention: null pointer");
    if (!attention_args_ok(head_dim, scale))
      return invalid("attention: head_dim must be in [1, " + std::to_string(SAPIPE_NN_MAX_HEAD_DIM) + "] and scale finite");
    attention_kernel<<<row_grid(rows), kThreads, 0, as_stream(stream)>>>(o, lse, q, k, v, AttnShape{batch, seq, heads, head_dim}, scale);
    return check_launch("attention kernel");
  });
}

sapipe_status c_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                                   const float* o, const float* lse, size_t batch, size_t seq, size_t heads, size_t head_dim, float scale,
                                   void* stream) {
  return guarded("attentionBackward", [&] {
    const size_t rows = batch * heads * seq;
    if (rows == 0) return SAPIPE_OK;
    if (dq == nullptr || dk == nullptr || dv == nullptr || dout == nullptr || q == nullptr || k == nullptr || v == nullptr ||
        o == nullptr || lse == nullptr)
      return invalid("attentionBackward: null pointer");
    if (!attention_args_ok(head_dim, scale))
      return invalid("attentionBackward: head_dim must be in [1, " + std::to_string(SAPIPE_NN_MAX_HEAD_DIM) + "] and scale finite");
    const AttnShape a{batch, seq, heads, head_dim};
    attention_dq_kernel<<<row_grid(rows), kThreads, 0, as_stream(stream)>>>(dq, dout, q, k, v, o, lse, a, scale);
    if (sapipe_status s = check_launch("attentionBackward dq kernel"); s != SAPIPE_OK) return s;
    attention_dkdv_kernel<<<row_grid(rows), kThreads, 0, as_stream(stream)>>>(dk, dv, dout, q, k, v, o, lse, a, scale);
    return check_launch("attentionBackward dk dv kernel");
  });
}

sapipe_status c_conv2d(float* y, const float* x, const float* w, const float* bias, const sapipe_nn_conv2d_shape* shape, void* stream) {
  return guarded("conv2d", [&] {
    ConvShape d;
    if (!conv_shape(shape, &d)) return invalid("conv2d: kernel and stride must be at least 1 and the padded input at least the kernel");
    const size_t n = d.n * d.k * d.oh * d.ow;
    if (n == 0) return SAPIPE_OK;
    if (y == nullptr || w == nullptr || (d.c > 0 && x == nullptr)) return invalid("conv2d: null pointer");
    conv2d_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(y, x, w, bias, d);
    return check_launch("conv2d kernel");
  });
}

sapipe_status c_conv2d_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                                const sapipe_nn_conv2d_shape* shape, int32_t accumulate, void* stream) {
  return guarded("conv2dBackward", [&] {
    ConvShape d;
    if (!conv_shape(shape, &d))
      return invalid("conv2dBackward: kernel and stride must be at least 1 and the padded input at least the kernel");
    const size_t wlen = d.k * d.c * d.r * d.s, xlen = d.n * d.c * d.h * d.w;
    if ((wlen > 0 && dw == nullptr) || (d.n > 0 && d.k > 0 && d.oh * d.ow > 0 && dy == nullptr) ||
        (d.n > 0 && d.c > 0 && (x == nullptr || (dx != nullptr && w == nullptr))))
      return invalid("conv2dBackward: null pointer");
    if (wlen > 0) {
      conv2d_dw_kernel<<<grid_for(wlen), kThreads, 0, as_stream(stream)>>>(dw, dy, x, d, accumulate);
      if (sapipe_status s = check_launch("conv2dBackward weight kernel"); s != SAPIPE_OK) return s;
    }
    if (db != nullptr && d.k > 0) {
      conv2d_db_kernel<<<grid_for(d.k), kThreads, 0, as_stream(stream)>>>(db, dy, d, accumulate);
      if (sapipe_status s = check_launch("conv2dBackward bias kernel"); s != SAPIPE_OK) return s;
    }
    if (dx == nullptr || xlen == 0) return SAPIPE_OK;
    conv2d_dx_kernel<<<grid_for(xlen), kThreads, 0, as_stream(stream)>>>(dx, dy, w, d);
    return check_launch("conv2dBackward input kernel");
  });
}

sapipe_status c_pool2d(float* y, const float* x, const sapipe_nn_conv2d_shape* shape, int32_t mode, void* stream) {
  return guarded("pool2d", [&] {
    ConvShape d;
    if (!pool_shape(shape, mode, &d))
      return invalid("pool2d: a known mode, kernel and stride at least 1, padding at most half the kernel, the padded input at least the kernel");
    const size_t n = d.n * d.c * d.oh * d.ow;
    if (n == 0) return SAPIPE_OK;
    if (y == nullptr || x == nullptr) return invalid("pool2d: null pointer");
    pool2d_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(y, x, d, mode);
    return check_launch("pool2d kernel");
  });
}

sapipe_status c_pool2d_backward(float* dx, const float* dy, const float* x, const sapipe_nn_conv2d_shape* shape, int32_t mode,
                                void* stream) {
  return guarded("pool2dBackward", [&] {
    ConvShape d;
    if (!pool_shape(shape, mode, &d))
      return invalid("pool2dBackward: a known mode, kernel and stride at least 1, padding at most half the kernel, the padded input at least the kernel");
    const size_t n = d.n * d.c * d.h * d.w;
    if (n == 0) return SAPIPE_OK;
    if (dx == nullptr || dy == nullptr || x == nullptr) return invalid("pool2dBackward: null pointer");
    pool2d_backward_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(dx, dy, x, d, mode);
    return check_launch("pool2dBackward kernel");
  });
}

const sapipe_nn_ops kCudaNnOps = {
    sizeof(sapipe_nn_ops), c_gemm,          c_bias_add, c_bias_grad,         c_relu,        c_relu_backward,
    c_softmax_xent,        c_gelu,          c_gelu_backward, c_add,          c_layer_norm,  c_layer_norm_backward,
    c_embedding,           c_embedding_backward, c_dropout, c_attention, c_attention_backward,
    c_conv2d,              c_conv2d_backward, c_pool2d, c_pool2d_backward,
};

}  // namespace

const sapipe_nn_ops* cuda_nn_ops() { return &kCudaNnOps; }

sapipe_status cublas_probe(int32_t* version, const char** library_path) {
  return guarded("cublasProbe", [&] {
    const cublas::Api* api = nullptr;
    if (sapipe_status s = open_cublas(&api); s != SAPIPE_OK) return s;
    if (version != nullptr) *version = api->version;
    if (library_path != nullptr) *library_path = api->path.c_str();
    return SAPIPE_OK;
  });
}

}  // namespace sapipe::cuda
