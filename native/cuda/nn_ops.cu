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

// A cuBLAS handle per thread and device, made on first use and kept for the life of the thread
// (a handle is bound to the device current when it was made and is not safe across threads), set
// to `stream`. cublasSetStream is called only when the stream changes: it also resets the
// handle's workspace, a cost on every product when called each time.
sapipe_status cublas_handle(const cublas::Api* api, void* stream, cublas::Handle* out) {
  constexpr int kMaxDevices = 64;
  struct Bound {
    cublas::Handle handle = nullptr;
    void* stream = nullptr;
  };
  thread_local Bound bound[kMaxDevices] = {};
  int device = 0;
  if (sapipe_status s = from_cuda(cudaGetDevice(&device), "cudaGetDevice"); s != SAPIPE_OK) return s;
  if (device < 0 || device >= kMaxDevices) return invalid("gemm: device number out of range for cuBLAS handles");
  Bound& b = bound[device];
  if (b.handle == nullptr) {
    const cublas::Status st = api->Create(&b.handle);
    if (st != cublas::kSuccess) {
      b.handle = nullptr;
      return fail(st == 1 ? SAPIPE_ERR_BACKEND_UNAVAILABLE : SAPIPE_ERR_INTERNAL,
                  "cublasCreate failed with status " + std::to_string(st) + " (cuBLAS at " + api->path + ")");
    }
    b.stream = nullptr;  // a new handle works on the legacy default stream
  }
  if (b.stream != stream) {
    if (api->SetStream(b.handle, stream) != cublas::kSuccess) return fail(SAPIPE_ERR_INTERNAL, "cublasSetStream failed");
    b.stream = stream;
  }
  *out = b.handle;
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

const sapipe_nn_ops kCudaNnOps = {
    sizeof(sapipe_nn_ops), c_gemm, c_bias_add, c_bias_grad, c_relu, c_relu_backward, c_softmax_xent,
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
