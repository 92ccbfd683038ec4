// The CPU side of the model operations (sapipe/nn.h): the matrix product is the blocked SIMD
// SGEMM over the thread pool (gemm.cpp); the row and element operations are plain loops, in the
// order the CUDA kernels' results are checked against (bias gradient summed row by row; softmax
// cross-entropy in double, like the plain-TypeScript reference).
#include <cmath>
#include <limits>

#include "gemm.h"
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
  for (size_t i = 0; i < count; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
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

const sapipe_nn_ops kCpuNnOps = {
    sizeof(sapipe_nn_ops), nn_gemm, nn_bias_add, nn_bias_grad, nn_relu, nn_relu_backward, nn_softmax_xent,
};

}  // namespace
}  // namespace sapipe::cpu

extern "C" const sapipe_nn_ops* sapipe_cpu_nn_ops(void) { return &sapipe::cpu::kCpuNnOps; }
